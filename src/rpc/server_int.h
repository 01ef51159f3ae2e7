/*
 * server_int: what the gRPC server's files share and nobody else may use
 * (the RPC layer's shared parts are in rpc_int.h).
 *
 *   server.c  the server object: services and their methods, listeners,
 *             the graceful shutdown and its drain, freeing
 *   call.c    a call: its life and references, the request's gRPC
 *             headers, dispatch to the handler, request messages,
 *             deadlines, the final status, the handler API (rpc_call_*)
 *   sconn.c   calls over HTTP/2 connections: accepting them, handshake
 *             and idle timers, HTTP/2's header rules, nghttp2's
 *             callbacks, the response's frames, GOAWAY when draining
 *   inproc.c  calls handed over by a client on the same loop, without a
 *             connection (rpc__server_inproc_start)
 *
 * A call does not know how its answer travels: its transport (sconn.c or
 * inproc.c) gives it a struct rpc__call_tp when it creates it, and the
 * call tells the transport through it when a message is queued and when
 * the final status is decided. The transports tell the call what arrived
 * through the rpc__call_* functions.
 *
 * Each part's state is a struct of its own (struct rpc__calls, struct
 * rpc__sconns, struct rpc__inproc, and in each call struct rpc__h2call
 * and struct rpc__icall), embedded in its owner and touched only by its
 * own file.
 */
#ifndef MC_RPC_SERVER_INT_H
#define MC_RPC_SERVER_INT_H

#include "rpc/rpc_int.h"

struct sconn;
struct listener;
struct svc;
struct rpc__auth;

/* ---------------------------------------------------------------- call.c */

/* The metrics of one method's calls (or of calls to no known method). */
struct rpc__mstats {
	char *path; /* "/svc/Method" (owned) */
	struct metric *calls[RPC__NCODES];
	struct metric *duration;
};

/* The calls of one server. */
struct rpc__calls {
	struct metrics_registry *reg;
	size_t max_msg;  /* responses */
	size_t max_recv; /* requests */
	size_t call_mem; /* what calls may hold (bufs.mem_max: at least one) */
	size_t conn_max; /* what the calls of one connection may hold */
	unsigned live;
	struct rpc_call *free; /* recycled */
	unsigned nfree;
	struct rpc__mstats unknown;
	struct rpc__dlheap dl;
	uv_timer_t dl_timer;
	struct rpc__bufcache bufs;
};

/* How a call's answer travels (sconn.c, inproc.c). */
struct rpc__call_tp {
	/* The hooks of the call's outgoing queue, or NULL. */
	const struct rpc__outq_ops *outq_ops;
	/* Whether the answer can still go out. */
	bool (*can_send)(const struct rpc_call *call);
	/* The handler queued a message on the call's outq. Errors: -ENOMEM:
	 * it cannot go out (the call drops what is queued). */
	int (*on_send)(struct rpc_call *call);
	/* The final status is decided (rpc__call_status); aborted: by the
	 * server, so messages queued and not yet promised to the peer go. */
	void (*on_done)(struct rpc_call *call, bool aborted);
	/* The call was refused at dispatch, before any handler saw it:
	 * answer at once with this HTTP status. NULL: never dispatched so. */
	void (*on_reject)(struct rpc_call *call, const char *http_status);
	/* Where the call's connection records that it proved the cluster
	 * secret (auth.c); NULL: it has none left. A transport without it
	 * (in process) needs no proof. */
	bool *(*proven)(struct rpc_call *call);
};

/* ... the HTTP/2 transport's part of a call (sconn.c). */
struct rpc__h2call {
	struct sconn *sc; /* NULL once the stream is gone */
	struct rpc_call *prev, *next;
	int32_t stream_id;
	/* Request header checks made here rather than by nghttp2 (whose
	 * HTTP messaging checks refuse grpc-go's URL :authority): */
	uint8_t pseudo;      /* pseudo-headers seen */
	bool regular_seen;   /* a regular header came: no pseudo after it */
	bool bad_headers;    /* the stream was reset for its headers */
	uint32_t hdr_bytes;  /* header list size so far (RFC 9113 6.5.2) */
	bool resp_submitted; /* response HEADERS submitted */
};

/* ... the in-process transport's part of a call (inproc.c). */
struct rpc__icall {
	struct rpc_stream *st;   /* the client's stream; NULL once detached */
	struct rpc__omsg *req;   /* its serialized request, until dispatch */
	uint64_t timeout_ms;     /* its deadline, from dispatch (0: none) */
	struct rpc_call *q_next; /* dispatch queue */
	struct rpc_call *prev, *next;
};

struct rpc_call {
	struct rpc_server *s;
	const struct rpc__call_tp *tp;
	unsigned refs;
	const struct rpc_method *m;
	void *svc_data;
	struct rpc__mstats *stats;
	struct mc_buf hdrs; /* request headers: "name\0value\0"... */
	size_t path_off;    /* where :path's value lies in hdrs; 0: none yet */
	uint64_t timeout_ms;
	uint64_t start_ns;
	bool has_timeout, bad_timeout, bad_encoding, post, ct_ok;
	bool dispatched;    /* a method was found and its handler may run */
	bool handler_ref;   /* the handler holds a reference */
	bool remote_closed; /* the client half-closed */
	bool done;          /* final status decided */
	bool cancelled;     /* ... and not by the handler */
	bool counted;       /* metrics recorded */
	int status;
	char *message; /* percent-encoded grpc-message, or NULL */
	unsigned nreq, nsent;
	ProtobufCMessage *req;
	struct rpc__arena req_arena;
	struct rpc_deframer df;
	size_t df_held; /* counted in calls.bufs.mem_held (call_count_partial) */
	size_t held;    /* the handler's, counted the same (rpc_call_hold) */
	/* Its connection's share of the bound, or NULL. A call counts
	 * df_held, held, outq.bytes and hdrs.len in both, and once joined its
	 * CALL_COST (call.c). */
	size_t *conn_held;
	bool joined;
	uint8_t mem_refused; /* an answer did not fit (enum call_room): it ends
				RESOURCE_EXHAUSTED */
	struct rpc__outq outq;
	struct rpc__dl dl;
	void *data;
	struct rpc_call *next_free; /* in struct rpc__calls' list */
	struct rpc__h2call h2;      /* sconn.c's */
	struct rpc__icall ic;       /* inproc.c's */
	char peer[64];              /* last: call_alloc clears what comes before */
};

/* Errors: -ENOMEM. */
int rpc__calls_init(struct rpc__calls *cs, struct metrics_registry *reg, const char *server,
		    size_t max_msg, size_t call_mem) MC_MUST_CHECK;
void rpc__calls_init_timer(struct rpc__calls *cs, uv_loop_t *loop);
/* Close the deadline timer (cb gets it with data set). */
void rpc__calls_close(struct rpc__calls *cs, void *data, uv_close_cb cb);
/* Free what is kept (every call must be gone). */
void rpc__calls_free(struct rpc__calls *cs);
/* Calls not yet freed. */
unsigned rpc__calls_live(const struct rpc__calls *cs);
/* The largest request message (0: as large as responses). */
void rpc__calls_set_max_recv(struct rpc__calls *cs, size_t bytes);
/* A method's metrics, registered under server (borrowed for the
 * registry's life). Errors: -ENOMEM. */
int rpc__mstats_init(struct rpc__mstats *st, struct metrics_registry *reg, const char *server,
		     const char *svc, const char *method, bool long_poll,
		     bool stream) MC_MUST_CHECK;

/* A new call from peer with one reference (the transport's), or NULL. */
struct rpc_call *rpc__call_new(struct rpc_server *s, const struct rpc__call_tp *tp,
			       const char *peer);
/* A call of a connection whose calls hold *conn (sconn.c): its cost and
 * what it holds count there too. False (nothing held) when it does not
 * fit the server's bound or the connection's share of it: it is counted
 * as a call of method "unknown" ended RESOURCE_EXHAUSTED. */
bool rpc__call_join(struct rpc_call *call, size_t *conn);
/* Its stream is gone: the call no longer counts in its connection's. */
void rpc__call_leave(struct rpc_call *call);
void rpc__call_ref(struct rpc_call *call);
void rpc__call_unref(struct rpc_call *call);
/* A request header, for rpc_call_header and dispatch. Errors: -ENOMEM. */
int rpc__call_header(struct rpc_call *call, const uint8_t *name, size_t nlen,
		     const uint8_t *value, size_t vlen) MC_MUST_CHECK;
/* The request headers are complete: check them, find the method and
 * start the handler of a streaming request, or refuse the call. */
void rpc__call_dispatch(struct rpc_call *call);
/* Request bytes. */
void rpc__call_data(struct rpc_call *call, const uint8_t *data, size_t len);
/* The client half-closed: a unary request goes to its handler. */
void rpc__call_half_close(struct rpc_call *call);
/* Set the method of an in-process call from its path. Errors: -ENOENT
 * (answered UNIMPLEMENTED by rpc__call_unary), -ENOMEM, -EOPNOTSUPP (a
 * streaming method). */
int rpc__call_route(struct rpc_call *call, const char *path) MC_MUST_CHECK;
/* Dispatch a routed unary call with its whole request body. */
void rpc__call_unary(struct rpc_call *call, uint64_t timeout_ms, const uint8_t *body,
		     size_t len);
/* The server ends the call: status and message go out after what was
 * sent, the handler hears on_cancel. */
void rpc__call_abort(struct rpc_call *call, int status, const char *message);
/* The transport is gone (stream reset or closed, connection lost, client
 * cancelled): the handler hears on_cancel if the call was not over. */
void rpc__call_gone(struct rpc_call *call);
/* The outq fell below RPC_DRAIN_BYTES: tell the handler. */
void rpc__call_drained(struct rpc_call *call);
/* The final status and its percent-encoded message (NULL: none). */
int rpc__call_status(const struct rpc_call *call, const char **message);

/* ---------------------------------------------------------------- sconn.c */

/* The HTTP/2 connections of one server. */
struct rpc__sconns {
	struct rpc_server *s;
	struct sconn *head;
	unsigned n;
	uint32_t max_streams;
	uint64_t handshake_ms, idle_ms;
	nghttp2_session_callbacks *cbs;
	nghttp2_option *ngopt;
	uint8_t *rbuf;
	struct metric *m_conns, *m_proto;
	uint64_t told_full_ms; /* when a full bound closed a connection, logged */
};

/* Errors: -ENOMEM. */
int rpc__sconns_init(struct rpc__sconns *cs, struct rpc_server *s,
		     const struct rpc_server_opts *opts, struct metrics_registry *reg,
		     const char *name) MC_MUST_CHECK;
/* Free what is kept (every connection must be gone). */
void rpc__sconns_free(struct rpc__sconns *cs);
/* A listener has a connection waiting. */
void rpc__sconns_accept(struct rpc__sconns *cs, uv_stream_t *listener);
/* Shutdown: GOAWAY on every connection, each closing once its calls end. */
void rpc__sconns_drain(struct rpc__sconns *cs);
/* The drain's time is over: close every connection (cancels its calls). */
void rpc__sconns_close_all(struct rpc__sconns *cs);
unsigned rpc__sconns_count(const struct rpc__sconns *cs);

/* ---------------------------------------------------------------- inproc.c */

/* A server's in-process calls. */
struct rpc__inproc {
	struct rpc_call *calls;           /* live ones, linked by ic.prev/next */
	struct rpc_call *q_head, *q_tail; /* waiting for dispatch */
	uv_idle_t idle;
	bool ready;              /* idle initialised */
	struct rpc_server *next; /* in the process's list of servers */
	bool listed;
};

void rpc__inproc_init_handle(struct rpc__inproc *ip, uv_loop_t *loop);
/* Put the server in (on) or out of the list clients look in. */
void rpc__inproc_list(struct rpc_server *s, bool on);
/* The drain's time is over: end every in-process call UNAVAILABLE. */
void rpc__inproc_abort_all(struct rpc__inproc *ip);
/* Close the idle handle (cb gets it with data set). */
void rpc__inproc_close(struct rpc__inproc *ip, void *data, uv_close_cb cb);

/* ---------------------------------------------------------------- server.c */

struct rpc_server {
	uv_loop_t *loop;
	char *name;
	struct metrics_registry *reg;
	struct svc *svcs;
	struct listener **listeners;
	unsigned nlisteners, listeners_open;
	uv_timer_t drain_timer;
	bool timers_ready;
	unsigned timers_open;
	bool shutting_down, drain_expired, finalizing, done;
	void (*on_done)(struct rpc_server *s, void *ud);
	void *done_ud;
	struct rpc_health *health;
	struct rpc__calls calls;  /* call.c's */
	struct rpc__sconns conns; /* sconn.c's */
	struct rpc__inproc ip;    /* inproc.c's */
	struct rpc__auth *auth;   /* auth.c's; NULL: calls need no proof */
};

const char *rpc__server_name(const struct rpc_server *s);
uv_loop_t *rpc__server_loop(const struct rpc_server *s);
/* Shutdown began: no new connection, calls drain. */
bool rpc__server_shutting_down(const struct rpc_server *s);
/* The drain's time is over: new calls are refused UNAVAILABLE. */
bool rpc__server_drain_expired(const struct rpc_server *s);
/* A call, connection or listener went: the end of a shutdown? */
void rpc__server_check_done(struct rpc_server *s);
/* The method at path "/svc/Method": *m, its service's data and its
 * metrics; or why not in why. Errors: -ENOENT. */
int rpc__server_find_method(const struct rpc_server *s, const char *path,
			    const struct rpc_method **m, void **svc_data,
			    struct rpc__mstats **stats, char *why, size_t wlen) MC_MUST_CHECK;
/* ---------------------------------------------------------------- auth.c */

/* 0: call may go on (no proof needed, or its connection's is made now or
 * was before); else the status to refuse it with, and why. */
int rpc__auth_admit(struct rpc_call *call, const char *path, char *why, size_t wlen);
void rpc__auth_free(struct rpc_server *s);

/* Whether a listener of s accepts connections made to `to`: the exact
 * address and port, or a wildcard listener and a loopback target. */
bool rpc__server_listens_at(const struct rpc_server *s, const struct sockaddr *to);

#endif
