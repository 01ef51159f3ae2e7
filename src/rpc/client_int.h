/*
 * client_int: what the gRPC client's files share and nobody else may use
 * (the RPC layer's shared parts are in rpc_int.h).
 *
 *   client.c     the channel: its state (idle, connecting, ready, backing
 *                off), its connections, where each stream waits or runs
 *                (routing), freeing
 *   stream.c     a call (struct rpc_stream): its life and references, the
 *                response's meaning (headers, messages, trailers), the
 *                final status delivered once, deadlines, metrics, the
 *                public call API (rpc_client_unary, rpc_stream_*)
 *   client_h2.c  calls over HTTP/2: requests submitted on a connection,
 *                nghttp2's callbacks, the transparent retry of a request
 *                the server did not process
 *
 * Each file's state is its own: struct rpc__streams (stream.c) is
 * embedded in struct rpc_client, whose other fields are client.c's; in a
 * stream, struct rpc__sh2 is client_h2.c's and struct rpc__sroute
 * client.c's, the other fields stream.c's (what is fixed when a stream is
 * made, any file may read). The files reach each other's state only
 * through the functions below.
 */
#ifndef MC_RPC_CLIENT_INT_H
#define MC_RPC_CLIENT_INT_H

#include "common/auth.h"
#include "rpc/rpc_int.h"

#define RPC__CSTATS_BUCKETS 64

struct cconn;

/* ---------------------------------------------------------------- stream.c */

/* Calls made to one method, for the metrics. */
struct rpc__cstats {
	struct rpc__cstats *next;
	uint64_t hash;
	char *path;
	struct metric *calls[RPC__NCODES];
	struct metric *duration;
};

struct rpc__slist {
	struct rpc_stream *head, *tail;
};

/* The streams of one client. */
struct rpc__streams {
	size_t max_msg;
	struct metrics_registry *reg;
	struct rpc__dlheap dl;
	uv_timer_t dl_timer;
	struct rpc__bufcache bufs;
	struct rpc__cstats *stats[RPC__CSTATS_BUCKETS];
};

/* Which of client.c's lists a stream is on. */
enum rpc__where { RPC__W_NONE, RPC__W_PENDING, RPC__W_CONN, RPC__W_DONEQ, RPC__W_INPROC };

/* A stream's place on its channel (client.c's). */
struct rpc__sroute {
	struct rpc_stream *prev, *next;
	enum rpc__where where;
	struct cconn *cc;       /* with RPC__W_CONN: the connection's list */
	struct rpc_call *icall; /* in-process: the server's call */
	unsigned retries;       /* transparent retries so far */
};

/* A stream's HTTP/2 state (client_h2.c's). */
struct rpc__sh2 {
	struct cconn *cc;
	int32_t stream_id;
	bool ng;     /* nghttp2 holds the stream (and a reference) */
	bool opened; /* its HEADERS went out */
};

/*
 * A call. What is set when it is made (c, unary, req_msg, lent,
 * timeout_ms, stats) any file may read; outq is the request's queue, which its
 * transport sends. The rest is stream.c's.
 */
struct rpc_stream {
	struct rpc_client *c;
	unsigned refs;
	bool user; /* final callback not yet delivered */
	bool unary;
	bool send_closed;
	bool headers_recv;
	bool has_grpc_status;
	bool ct_ok;
	int http_status;
	int grpc_status;
	char *grpc_message;
	rpc_unary_cb ucb;
	const struct rpc_stream_cbs *cbs;
	void *ud;
	ProtobufCMessage **sync_out; /* unary_sync: takes the response */
	const ProtobufCMessageDescriptor *resp_desc;
	ProtobufCMessage *uresp;
	struct rpc__arena resp_arena;
	struct rpc__omsg *req_msg; /* unary: kept for a transparent retry */
	struct rpc__rbody *lent;   /* rpc_client_unary_lend's buffer, or NULL */
	unsigned nresp;
	struct rpc_deframer df;
	struct rpc__outq outq;
	struct rpc__cstats *stats;
	uint64_t start_ns;
	uint64_t timeout_ms;
	struct rpc__dl dl;
	int fin_status; /* deferred completion */
	char *fin_message;
	struct rpc__sroute rt; /* client.c's */
	struct rpc__sh2 h2;    /* client_h2.c's */
};

void rpc__slist_push(struct rpc__slist *l, struct rpc_stream *st);
void rpc__slist_del(struct rpc__slist *l, struct rpc_stream *st);

void rpc__streams_init(struct rpc__streams *ss, uv_loop_t *loop, size_t max_msg,
		       struct metrics_registry *reg);
/* Close the deadline timer (cb gets it with data set). */
void rpc__streams_close(struct rpc__streams *ss, void *data, uv_close_cb cb);
void rpc__streams_free(struct rpc__streams *ss);
/* The request's path (":path"). */
static inline const char *rpc__stream_path(const struct rpc_stream *st)
{
	return st->stats->path;
}
/* Whether the caller still waits for the final status. */
static inline bool rpc__stream_live(const struct rpc_stream *st)
{
	return st->user;
}
/* When the call's deadline passes (uv_now clock), or 0 for none. */
uint64_t rpc__stream_deadline_ms(const struct rpc_stream *st);
void rpc__stream_ref(struct rpc_stream *st);
void rpc__stream_unref(struct rpc_stream *st);
/* Deliver the final status (once) and drop the user's reference.
 * remote_done: the server ended the stream itself. */
void rpc__stream_finish(struct rpc_stream *st, int status, const char *message,
			bool remote_done);
/* The same from the loop's next turn, not from the caller's stack
 * (rpc__client_park, then rpc__stream_finish_parked). */
void rpc__stream_finish_later(struct rpc_stream *st, int status, const char *message);
void rpc__stream_finish_parked(struct rpc_stream *st);
/* A server on this loop answered st (rpc__client_inproc_done). */
void rpc__stream_inproc_answer(struct rpc_stream *st, int status, const char *message,
			       const uint8_t *body, size_t len);
/* A response header. */
void rpc__stream_header(struct rpc_stream *st, const uint8_t *name, size_t nlen,
			const uint8_t *value, size_t vlen);
/* The response headers came. Unless they end the stream (trailers-only),
 * a non-200 HTTP status or a content-type other than gRPC's ends the
 * call. */
void rpc__stream_response_headers(struct rpc_stream *st, bool end_stream);
/* The server's final word arrived (trailers, or trailers-only). */
void rpc__stream_trailers(struct rpc_stream *st);
/* Response bytes. */
void rpc__stream_data(struct rpc_stream *st, const uint8_t *data, size_t len);
/* The stream closed before its trailers: the status that says why. */
int rpc__stream_status_on_close(const struct rpc_stream *st, uint32_t error_code, char *msg,
				size_t len);
/* Whether a request the server refused unprocessed may be sent again:
 * no response yet, and nothing of it sent or a unary one (its request is
 * kept). */
bool rpc__stream_may_retry(const struct rpc_stream *st);
/* Ready the stream to be sent again from its start. */
void rpc__stream_rewind(struct rpc_stream *st);

/* ---------------------------------------------------------------- client_h2.c */

/* Install the client's nghttp2 callbacks. */
void rpc__h2_callbacks(nghttp2_session_callbacks *cbs);
/* rpc__conn_ops.deframer of a client connection. */
struct rpc_deframer *rpc__h2_deframer(struct rpc__conn *c, int32_t stream_id);
/* Submit st's request on cc. */
void rpc__h2_submit(struct rpc_stream *st, struct cconn *cc);
/* nghttp2 let go of the stream, which is off its connection's list
 * already (the connection closed). */
void rpc__h2_release(struct rpc_stream *st);
/* Tell the server the caller is done with st: unless remote_done and
 * both sides ended, a RST_STREAM (a request still queued is withdrawn). */
void rpc__h2_end(struct rpc_stream *st, bool remote_done);
/* More of st's request is queued. */
void rpc__h2_resume(struct rpc_stream *st);

/* ---------------------------------------------------------------- client.c */

enum rpc__cstate { RPC__CL_IDLE, RPC__CL_CONNECTING, RPC__CL_READY, RPC__CL_BACKOFF };

/* A connection: base, the HTTP/2 connection, is client_h2.c's to use for
 * its streams; the rest is client.c's. */
struct cconn {
	struct rpc__conn base;
	struct rpc_client *c;
	struct cconn *prev, *next;
	uv_connect_t creq;
	struct rpc__slist streams;
	unsigned nstreams;
	bool connected;
	bool got_settings; /* the server spoke HTTP/2 */
	bool goaway;
	/* The last stream looked up and its call (NULL: none): nghttp2's
	 * callbacks ask for a stream's call once per header and frame
	 * (client_h2.c), each a lookup in nghttp2's stream map. */
	int32_t memo_id;
	struct rpc_stream *memo_st;
	char token[MC_RPC_TOKEN_MAX]; /* its proof of the secret; "": none */
};

struct rpc_client {
	uv_loop_t *loop;
	struct sockaddr_storage addr;
	char authority[80];
	char label[96];
	uint64_t connect_ms, backoff_initial_ms, backoff_max_ms, backoff_ms;
	nghttp2_session_callbacks *cbs;
	uint8_t *rbuf;
	enum rpc__cstate state;
	int last_error;
	struct cconn *cur;
	struct cconn *conns;
	unsigned nconns;
	struct rpc__slist pending;
	struct rpc__slist done_q; /* final status decided, delivered from idle */
	uv_idle_t idle;
	struct rpc__slist inproc; /* calls handed to a server of this loop */
	bool local;               /* opts->local_calls */
	unsigned inproc_calls;
	uv_timer_t backoff_timer;
	unsigned handles_open;
	uint64_t rng;
	bool freeing;
	uint8_t *auth_key; /* opts->auth_key's copy, or NULL */
	size_t auth_key_len;
	unsigned goaways, connects;
	struct rpc__streams ss; /* stream.c's */
};

/* Send st: in process, on the ready connection, or queued for the one
 * connecting; failed UNAVAILABLE (from the loop) while backing off. */
void rpc__client_route(struct rpc_client *c, struct rpc_stream *st);
/* Take st off the list it is on (pending, a connection's, the done
 * queue, the in-process calls). */
void rpc__client_unlink(struct rpc_stream *st);
/* st's final status is delivered: off any list but a connection's (it
 * stays there until nghttp2 lets it go), and off the server it was
 * handed to in process. */
void rpc__client_detach(struct rpc_stream *st);
/* Onto the done queue, to be finished from the loop's next turn. */
void rpc__client_park(struct rpc_stream *st);
/* st runs on cc now. */
void rpc__client_attach(struct rpc_stream *st, struct cconn *cc);
/* The streams on cc, in no order. */
struct rpc_stream *rpc__client_conn_first(const struct cconn *cc);
struct rpc_stream *rpc__client_conn_next(const struct rpc_stream *st);
/* Whether c is being freed. */
bool rpc__client_freeing(const struct rpc_client *c);
/* The server's host:port, the requests' :authority. */
const char *rpc__client_authority(const struct rpc_client *c);
/* Send st again, after the server refused it unprocessed: false when it
 * was retried too often already or the client is being freed. */
bool rpc__client_retry(struct rpc_stream *st);
/* The server on cc spoke HTTP/2 (its first SETTINGS). */
void rpc__client_on_settings(struct cconn *cc);
/* cc got a GOAWAY: new calls go to a new connection. */
void rpc__client_on_goaway(struct cconn *cc, const nghttp2_goaway *g);
/* A stream went: the last thing a freed client waited for? */
void rpc__client_check_freed(struct rpc_client *c);

#endif
