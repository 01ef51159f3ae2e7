/*
 * rpc_int: what the RPC layer's files share and nobody else may use.
 *
 *  - rpc__conn: one HTTP/2 connection — a uv_tcp_t, an nghttp2 session
 *    and the write path. It knows nothing about calls: the server and the
 *    client embed it, install their own nghttp2 frame callbacks and get
 *    their object back with MC_CONTAINER_OF. Bytes go out through
 *    nghttp2_session_send(): small frames are copied into a per-write
 *    arena, DATA payloads are referenced straight from the serialized
 *    message buffers (NGHTTP2_DATA_FLAG_NO_COPY), so a 16 MiB message is
 *    copied at most once, when protobuf-c packs it (not at all when its
 *    large field is sent from a received body or a lent buffer,
 *    rpc__omsg_pack). Writes are batched and bounded: no more is taken
 *    from nghttp2 while the socket's libuv write queue holds
 *    RPC__WRITE_HIGH_BYTES or more.
 *  - rpc__omsg / rpc__outq: a serialized, length-prefixed message and
 *    the per-stream queue of them that feeds nghttp2's data provider.
 *    Messages are reference-counted because a uv_write may still point
 *    into one after its stream has gone.
 *  - rpc__dlheap: a binary min-heap of deadlines; the server and the
 *    client each run one uv_timer for all their calls.
 *  - hooks between the server and health.c, and the in-process calls
 *    between client.c and the server (server_int.h is the server's own).
 */
#ifndef MC_RPC_RPC_INT_H
#define MC_RPC_RPC_INT_H

#include <nghttp2/nghttp2.h>

#include "common/buf.h"
#include "common/pb.h"
#include "rpc/rpc.h"

struct metric;

/* Flow control: what we let a peer send before it hears from us. Large
 * so a 16 MiB message is not throttled by round trips on a LAN. */
#define RPC__STREAM_WINDOW_BYTES (16u << 20)
#define RPC__CONN_WINDOW_BYTES (64u << 20)
/* SETTINGS_MAX_FRAME_SIZE we advertise and the largest DATA payload we
 * send when the peer allows it. */
#define RPC__MAX_FRAME_BYTES (256u << 10)
#define RPC__MAX_HEADER_LIST_BYTES (64u << 10)
/* Read buffer shared by the connections of one server or client. */
#define RPC__READ_BUF_BYTES (256u << 10)
/* One uv_write carries at most this much (one frame may exceed it). */
#define RPC__BATCH_BYTES (256u << 10)
/* Stop pulling frames from nghttp2 while this much waits in the socket's
 * write queue. */
#define RPC__WRITE_HIGH_BYTES (1u << 20)
#define RPC__DEFAULT_MAX_MESSAGE_BYTES (4u << 20)
#define RPC__DEFAULT_CALL_MEMORY ((size_t)1 << 30)
#define RPC__USER_AGENT "mooncake-rpc/" MC_VERSION
/* gRPC status codes: RPC_OK to RPC_UNAUTHENTICATED. */
#define RPC__NCODES 17

/* An nghttp2 header of two literals, and of a literal name and a value
 * of vlen bytes that nghttp2 copies. */
#define RPC__NV(n, v) \
	{ \
		(uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, sizeof(v) - 1, \
			NGHTTP2_NV_FLAG_NO_COPY_NAME | NGHTTP2_NV_FLAG_NO_COPY_VALUE \
	}
#define RPC__NVS(n, v, vlen) \
	{ \
		(uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, (vlen), \
			NGHTTP2_NV_FLAG_NO_COPY_NAME \
	}

/* ---------------------------------------------------------------- deadlines */

struct rpc__dl {
	uint64_t at_ms; /* uv_now() clock */
	size_t idx;     /* position in the heap; SIZE_MAX when not queued */
};

struct rpc__dlheap {
	struct rpc__dl **v;
	size_t n, cap;
	uint64_t armed_ms; /* when the timer rpc__dlheap_arm started fires */
};

void rpc__dl_init(struct rpc__dl *d);
/* Errors: -ENOMEM. */
int rpc__dlheap_add(struct rpc__dlheap *h, struct rpc__dl *d) MC_MUST_CHECK;
void rpc__dlheap_del(struct rpc__dlheap *h, struct rpc__dl *d);
struct rpc__dl *rpc__dlheap_top(const struct rpc__dlheap *h);
void rpc__dlheap_free(struct rpc__dlheap *h);
/* Arm timer for the earliest deadline, or stop it when there is none. A
 * timer already running that fires no later than that deadline is left
 * alone: it may fire early, and cb then arms it again (it must call
 * rpc__dlheap_arm). That saves a timer restart per call while each new
 * deadline lies after the earliest one. */
void rpc__dlheap_arm(struct rpc__dlheap *h, uv_timer_t *timer, uv_timer_cb cb);

/* ---------------------------------------------------------------- buffers */

/* Large buffers (serialized messages, reassembled bodies, unpack arenas)
 * kept for reuse by one server or client: a fresh multi-MiB malloc is an
 * mmap whose every page faults on first touch, which costs more than the
 * copy itself. Single-threaded, like its owner. */
#define RPC__BUF_CACHE_MIN_BYTES (256u << 10)
#define RPC__BUF_CACHE_MAX_BYTES (64u << 20)
#define RPC__BUF_CACHE_SLOTS 8

struct rpc__bufcache {
	struct {
		void *p;
		size_t cap;
	} slot[RPC__BUF_CACHE_SLOTS];
	unsigned n;
	size_t bytes;
	/* A server's requests (the bytes received of messages not yet
	 * whole, and the messages unpacked, with bodies they keep): the
	 * bytes they hold now, and the most they may hold (0: no bound; a
	 * client's). A body's buffer is allocated whole when its length
	 * arrives, but only the pages written take memory. */
	size_t mem_held, mem_max;
	struct metric *mem_gauge; /* mem_held, or NULL */
};

/* A buffer of at least len bytes; *cap gets its real size. NULL cache:
 * plain malloc. */
void *rpc__buf_get(struct rpc__bufcache *bc, size_t len, size_t *cap);
/* Give a buffer back (cap as returned by rpc__buf_get). */
void rpc__buf_put(struct rpc__bufcache *bc, void *p, size_t cap);
void rpc__bufcache_free(struct rpc__bufcache *bc);
/* Make d take its body buffers from bc. */
void rpc__deframer_setup(struct rpc_deframer *d, size_t max_bytes, struct rpc__bufcache *bc);
/* What is left of bc's bound on what calls hold (SIZE_MAX: no bound). */
size_t rpc__mem_left(const struct rpc__bufcache *bc);
/* Count n bytes more (add) or fewer held by bc's calls. */
void rpc__mem_count(struct rpc__bufcache *bc, size_t n, bool add);

/* protobuf-c unpacking into an arena (common/pb.h): a large
 * message's starts in one recycled buffer, a small one's in a chunk of
 * its own. A large top-level bytes field is not copied at all when the
 * received body can be taken from the deframer: the field then points
 * into that body, which the arena owns. */
struct rpc__arena {
	struct mc_pbarena pb;     /* first: its allocator's data is the arena */
	struct rpc__bufcache *bc; /* non-NULL: a message is in the arena */
	struct rpc__rbody *body;  /* one reference, or NULL */
	size_t held;              /* what it counts in bc->mem_held */
	bool too_deep;            /* rpc__unpack refused it for its nesting */
	bool too_big;             /* ... or for bc->mem_max */
};

/* A received body taken from its deframer, shared by the message
 * unpacked from it and by messages sent with bytes that lie in it
 * (rpc__omsg_pack); or a client's lent buffer (rpc_client_unary_lend),
 * whose release is the caller's. Released with its last reference. */
struct rpc__rbody {
	unsigned refs;
	uint8_t *p;
	size_t len;
	void (*release)(void *ctx, void *p, size_t len); /* NULL: free */
	void *ctx;
};

void rpc__rbody_unref(struct rpc__rbody *b);

/* Top-level bytes fields at least this large are left in the received
 * body instead of being copied out of it, at most RPC__ALIAS_MAX of them
 * per message. */
#define RPC__ALIAS_MIN_BYTES (64u << 10)
#define RPC__ALIAS_MAX 4

/* Messages nested deeper than this are refused before protobuf-c, whose
 * unpacking recurses once per level: a request of a few hundred KiB of
 * nothing but nesting (a TxnRequest in a RequestOp in a TxnRequest ...)
 * would otherwise overflow the loop thread's stack. protobuf-go refuses
 * past 10000; no message of ours legitimately goes past a few hundred. */
#define RPC__MAX_NESTING 1000

/* Whether data, a message of type desc, nests at most max levels deep.
 * Only the nesting is checked: a malformed message passes (protobuf-c
 * refuses it). Types whose schema cannot nest without bound pass at once. */
bool rpc__nesting_ok(const ProtobufCMessageDescriptor *desc, const uint8_t *data, size_t len,
		     unsigned max);

/* Unpack data (NULL on a parse error or past RPC__MAX_NESTING). bc NULL:
 * plain malloc, and the result may be freed with
 * protobuf_c_message_free_unpacked(m, NULL). df: the deframer whose
 * on_msg handed data, or NULL; with bc, large bytes fields then point
 * into data, which the arena takes from df (rpc_deframer_take). */
ProtobufCMessage *rpc__unpack(const ProtobufCMessageDescriptor *desc, const uint8_t *data,
			      size_t len, struct rpc__bufcache *bc, struct rpc_deframer *df,
			      struct rpc__arena *ar);
void rpc__unpacked_free(ProtobufCMessage *m, struct rpc__arena *ar);

/* ---------------------------------------------------------------- messages */

struct rpc__omsg {
	struct rpc__omsg *next;
	unsigned refs;
	size_t len;               /* bytes of the message: 5-byte prefix + body */
	struct rpc__bufcache *bc; /* where the buffer goes back */
	size_t cap;               /* bytes allocated, header included */
	/* A large bytes field sent from the received body it lies in
	 * (ext_body, one reference): the message is data[0, ext_at), then
	 * ext[0, ext_len), then the rest of data. NULL: all in data. */
	struct rpc__rbody *ext_body;
	const uint8_t *ext;
	size_t ext_at, ext_len;
	uint8_t data[];
};

/* Serialize msg with its prefix into a new buffer (refs = 1), from bc
 * (may be NULL). The cache must outlive the message. A proto3 bytes
 * field of msg of at least RPC__ALIAS_MIN_BYTES that lies in from (may be
 * NULL) is not copied: the message takes a reference on from and is sent
 * from there. Errors: MC_ETOO_LARGE (body above max_bytes), -ENOBUFS
 * (the message, prefix included, is longer than room: nothing was
 * allocated or copied), -ENOMEM. */
int rpc__omsg_pack(const ProtobufCMessage *msg, size_t max_bytes, size_t room,
		   struct rpc__bufcache *bc, struct rpc__rbody *from,
		   struct rpc__omsg **out) MC_MUST_CHECK;
/* The message's bytes from offset off on, as far as they are contiguous
 * (*len, at least 1 while off < m->len). */
const uint8_t *rpc__omsg_at(const struct rpc__omsg *m, size_t off, size_t *len);
/* m in one piece, as a reader of data[5, len) needs it: m itself with
 * one more reference when it is, else a plain malloc'd copy (refs = 1).
 * Errors: -ENOMEM. */
int rpc__omsg_flat(struct rpc__omsg *m, struct rpc__omsg **out) MC_MUST_CHECK;
void rpc__omsg_unref(struct rpc__omsg *m);

struct rpc__outq;

struct rpc__outq_ops {
	/* The data provider reached the end: a server submits trailers here
	 * and adds NGHTTP2_DATA_FLAG_NO_END_STREAM. May be NULL. */
	void (*on_eof)(struct rpc__outq *q, nghttp2_session *ng, int32_t stream_id,
		       uint32_t *data_flags);
	/* Queued bytes fell below RPC_DRAIN_BYTES after having reached it.
	 * Runs from rpc__conn_flush, outside nghttp2. May be NULL. */
	void (*on_drain)(struct rpc__outq *q);
};

struct rpc__outq {
	const struct rpc__outq_ops *ops;
	struct rpc__omsg *head, *tail;
	size_t head_off; /* bytes of head already handed to a write */
	size_t bytes;    /* bytes queued and not yet handed to a write */
	/* A server call's: bytes is counted in its calls' memory (set after
	 * rpc__outq_init; NULL: not counted). */
	struct rpc__bufcache *acct;
	size_t *conn_acct; /* and in its connection's share, or NULL */
	size_t reserved;   /* promised to nghttp2 by the read callback */
	uint64_t taken;    /* bytes ever handed to a write */
	bool eof;          /* no more messages will be queued */
	bool deferred;     /* the read callback returned NGHTTP2_ERR_DEFERRED */
	bool want_drain;
	bool in_drain;
	struct rpc__outq *drain_next;
};

void rpc__outq_init(struct rpc__outq *q, const struct rpc__outq_ops *ops);
/* Drop every queued message. */
void rpc__outq_clear(struct rpc__outq *q);
/* Append m (takes ownership). */
void rpc__outq_push(struct rpc__outq *q, struct rpc__omsg *m);
/* q->bytes becomes n (the count in q->acct follows). */
void rpc__outq_set_bytes(struct rpc__outq *q, size_t n);
/* Drop what nghttp2 has not been promised yet (keeps a frame in flight
 * whole). */
void rpc__outq_drop_unsent(struct rpc__outq *q);
/* The nghttp2 data source read callback; source->ptr is the outq. */
ssize_t rpc__outq_read_cb(nghttp2_session *ng, int32_t stream_id, uint8_t *buf, size_t length,
			  uint32_t *data_flags, nghttp2_data_source *source, void *user_data);

/* ---------------------------------------------------------------- connection */

struct rpc__conn;
struct rpc__wreq;

struct rpc__conn_ops {
	/* Every handle is closed: the owner drops its streams (the nghttp2
	 * session still exists, no callback will run), then calls
	 * rpc__conn_release() and frees its object. */
	void (*on_closed)(struct rpc__conn *c);
	/* nghttp2 reported a protocol error (already logged). */
	void (*on_proto_error)(struct rpc__conn *c);
	/* The deframer that DATA on stream_id would be fed to right now, or
	 * NULL (no such stream, or its data is dropped). Lets the read path
	 * receive a large message's DATA payload straight into its body. */
	struct rpc_deframer *(*deframer)(struct rpc__conn *c, int32_t stream_id);
};

/* Where the incoming byte stream stands, frame by frame, so that a read
 * can be aimed at the body a DATA frame's payload is bound for. */
struct rpc__rtrack {
	uint32_t skip; /* connection preface bytes still to come */
	uint8_t hd[9]; /* frame header being collected */
	unsigned hd_len;
	uint32_t left;   /* payload bytes of the current frame still to come */
	int32_t sid;     /* its stream */
	bool data;       /* it is an unpadded DATA frame */
	bool was_direct; /* the last read went straight into a body */
};

struct rpc__conn {
	uv_tcp_t tcp;
	uv_timer_t timer;  /* owner's: handshake/idle or connect timeout */
	uv_prepare_t prep; /* deferred flush */
	nghttp2_session *ng;
	const struct rpc__conn_ops *ops;
	const char *label; /* server name or "client" (borrowed) */
	char peer[64];
	uint8_t *rbuf;    /* shared read buffer (borrowed) */
	unsigned handles; /* open handles */
	unsigned in_ng;   /* depth of nghttp2 calls on the stack */
	bool closing;
	bool in_flush;
	bool flush_again;
	bool blocked; /* a send callback said WOULDBLOCK */
	bool close_after_flush;
	bool reading;
	struct rpc__wreq *cur;   /* batch being built */
	struct rpc__wreq *wfree; /* recycled batches */
	unsigned nwfree;
	unsigned nwrites; /* uv_writes in flight */
	struct rpc__outq *drain_head;
	struct rpc__rtrack rt;
};

/* Initialise the handles (tcp, timer, prepare) on loop. Errors: negative
 * errno from uv_*_init. On error nothing needs closing. */
int rpc__conn_init(struct rpc__conn *c, uv_loop_t *loop, const struct rpc__conn_ops *ops,
		   const char *label, uint8_t *rbuf) MC_MUST_CHECK;
/* Connected: create the nghttp2 session (callbacks must include those of
 * rpc__callbacks_init), send SETTINGS and the connection window, and
 * start reading. Errors: -ENOMEM, negative errno from uv_read_start. */
int rpc__conn_start(struct rpc__conn *c, bool server, const nghttp2_session_callbacks *cbs,
		    const nghttp2_option *opt, const nghttp2_settings_entry *iv,
		    size_t niv) MC_MUST_CHECK;
/* Install the shared send and error callbacks. */
void rpc__callbacks_init(nghttp2_session_callbacks *cbs);
/* Write what nghttp2 has to send (now, or after the current nghttp2
 * call returns). */
void rpc__conn_flush(struct rpc__conn *c);
/* Flush before the loop next blocks. */
void rpc__conn_want_flush(struct rpc__conn *c);
/* Resume a deferred data provider after rpc__outq_push. */
void rpc__conn_resume(struct rpc__conn *c, int32_t stream_id, struct rpc__outq *q);
/* Close now: pending writes are cancelled; ops->on_closed runs from the
 * loop once every handle is closed. Idempotent. */
void rpc__conn_close(struct rpc__conn *c);
/* Close once everything queued (e.g. a GOAWAY) is written. */
void rpc__conn_close_after_flush(struct rpc__conn *c);
/* Free the session and write buffers (from ops->on_closed). */
void rpc__conn_release(struct rpc__conn *c);
/* Stop reporting drains for q (its owner is going away). */
void rpc__conn_forget_outq(struct rpc__conn *c, struct rpc__outq *q);

/* ---------------------------------------------------------------- server <-> health */

struct rpc_server;
struct rpc_health;

/* Attach h to s: freed with the server, told when shutdown starts.
 * Errors: -EEXIST. */
int rpc__server_set_health(struct rpc_server *s, struct rpc_health *h) MC_MUST_CHECK;
void rpc__health_shutdown(struct rpc_health *h);
void rpc__health_free(struct rpc_health *h);

/* ---------------------------------------------------------------- in-process calls
 * A client made with local_calls sends a unary call to a server listening
 * at its target on the same loop without a connection (inproc.c's head
 * comment). Everything runs on that loop's thread.
 */

/* The server on loop listening at to (not shutting down), or NULL. */
struct rpc_server *rpc__server_local(uv_loop_t *loop, const struct sockaddr *to);
/* Hand over a unary call to path with the serialized request req (a
 * reference, or a copy in one piece when a field of req is sent from
 * elsewhere, is kept until dispatch or cancel). The server answers, once,
 * through rpc__client_inproc_done(st, ...), never from inside this call.
 * *out is the handle for rpc__server_inproc_cancel. Errors: -ENOMEM,
 * -ECANCELED (the server is shutting down), -EOPNOTSUPP (a streaming
 * method: the caller connects instead). */
int rpc__server_inproc_start(struct rpc_server *s, const char *path, struct rpc__omsg *req,
			     uint64_t timeout_ms, struct rpc_stream *st,
			     struct rpc_call **out) MC_MUST_CHECK;
/* The client gives up on the call (cancel, deadline, freed): the handler
 * hears on_cancel, nothing is delivered. */
void rpc__server_inproc_cancel(struct rpc_call *call);
/* The server's answer: status, message (decoded, may be empty) and the
 * serialized response body (NULL unless status is RPC_OK and one was
 * sent; borrowed for the duration of the call). */
void rpc__client_inproc_done(struct rpc_stream *st, int status, const char *message,
			     const uint8_t *body, size_t len);

/* ---------------------------------------------------------------- client test hooks */

/* Number of GOAWAY frames the client's connections received. */
unsigned rpc__client_goaways(const struct rpc_client *c);
/* Connections the client opened successfully so far. */
unsigned rpc__client_connects(const struct rpc_client *c);
/* Calls the client handed to a server in-process so far. */
unsigned rpc__client_inproc_calls(const struct rpc_client *c);

/* HTTP status -> gRPC status (PROTOCOL-HTTP2.md "HTTP to gRPC Status Code
 * Mapping"); HTTP/2 RST_STREAM error -> gRPC status. */
int rpc__status_from_http(int http_status);
int rpc__status_from_h2(uint32_t error_code);
/* Count a call that ended with code (out of range: UNKNOWN) in calls[code],
 * registered on first use as the counter name (help) labelled
 * "server,method,code", or "method,code" when server is NULL. */
void rpc__count_status(struct metric *calls[RPC__NCODES], struct metrics_registry *reg,
		       const char *name, const char *help, const char *server,
		       const char *method, int code);
/* Whether a content-type header value is gRPC's: application/grpc, alone
 * or followed by '+' or ';'. */
bool rpc__content_type_ok(const uint8_t *value, size_t vlen);

#endif
