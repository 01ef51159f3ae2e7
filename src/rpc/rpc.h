/*
 * rpc: the gRPC wire protocol over cleartext HTTP/2 (prior knowledge),
 * built on nghttp2's session API and driven by libuv TCP streams. One
 * event loop, no thread per connection. Server and client; unary,
 * server-streaming, client-streaming and bidirectional calls; protobuf-c
 * messages with the gRPC 5-byte length prefix; grpc-timeout deadlines;
 * status and grpc-message in trailers; max message size; graceful
 * shutdown that drains in-flight calls; and the standard
 * grpc.health.v1.Health service.
 *
 * Threading: every function here must be called on the thread running the
 * loop the object was created with. Other threads reach it through
 * uv_async_t.
 *
 * Server call lifetime. A method's handler receives a struct rpc_call.
 * From the first callback of a call (on_message for unary and server-
 * streaming methods, on_start for client-streaming and bidi methods) the
 * handler holds a reference it must give back with exactly one
 * rpc_call_finish(), now or later (asynchronous handlers are fine). If the
 * call dies first (client cancel/RST, deadline, lost connection, shutdown
 * timeout), on_cancel runs; rpc_call_send() then returns -ECANCELED and the
 * eventual rpc_call_finish() only releases the reference.
 *
 * Messages passed to callbacks are borrowed: valid until the callback
 * returns. Messages passed to send functions are serialized before the
 * call returns; the caller keeps ownership (rpc_client_unary_lend lends
 * a large payload instead, until its release callback).
 */
#ifndef MC_RPC_RPC_H
#define MC_RPC_RPC_H

#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "common/err.h"
#include "rpc/frame.h" /* status codes and the pure message framing */

struct metrics_registry;

enum rpc_kind {
	RPC_UNARY,
	RPC_SERVER_STREAMING,
	RPC_CLIENT_STREAMING,
	RPC_BIDI_STREAMING,
};

/* ------------------------------------------------------------------ server */

struct rpc_server;
struct rpc_call;

struct rpc_method {
	const char *name; /* "Check": the path is /<service>/<name> */
	enum rpc_kind kind;
	const ProtobufCMessageDescriptor *request;
	const ProtobufCMessageDescriptor *response;
	/* Client-streaming and bidi: the call began (headers received).
	 * Required for those kinds, unused for the others. */
	void (*on_start)(struct rpc_call *call);
	/* A request message arrived. Unary and server-streaming: exactly
	 * once, after the client half-closed. Required. */
	void (*on_message)(struct rpc_call *call, const ProtobufCMessage *msg);
	/* Client-streaming and bidi: the client finished sending. Optional. */
	void (*on_half_close)(struct rpc_call *call);
	/* The call died before rpc_call_finish. Optional. */
	void (*on_cancel)(struct rpc_call *call);
	/* Optional, for handlers that stream a lot: the bytes queued on the
	 * call (rpc_call_pending_bytes) fell below RPC_DRAIN_BYTES after a
	 * send had brought them to it or above. Send more from here. */
	void (*on_drain)(struct rpc_call *call);
	/* Optional: the status and message of a request message nested
	 * deeper than the server unpacks (a few hundred levels; protobuf-c
	 * recurses per level). Unset: INTERNAL "failed to parse request
	 * message", as for any message that does not parse. */
	int too_deep_status;
	const char *too_deep_message;
	/* A long poll (the handler holds the call until something happens):
	 * its duration goes to mooncake_rpc_server_long_poll_duration_seconds
	 * instead of the call latency histogram operators alert on. */
	bool long_poll;
	/* Served without the cluster secret on a server that requires it
	 * (rpc_server_require_auth): a login, such as etcd's Authenticate.
	 * The call proves nothing for its connection. */
	bool no_auth;
};

/* Back-pressure threshold of on_drain (server) and on_drain (client). */
#define RPC_DRAIN_BYTES ((size_t)1 << 20)

struct rpc_server_opts {
	const char *name;         /* label in logs and metrics ("meta-client") */
	size_t max_message_bytes; /* 0: 4 MiB */
	/* The most the calls may hold at once: the bytes of requests being
	 * received, what they decode to, and answers the clients have not
	 * taken yet; past it a call fails with RESOURCE_EXHAUSTED. 0: 1 GiB
	 * (and never below twice the largest request accepted, plus 1 MiB:
	 * see rpc_server_set_max_recv_bytes). */
	size_t max_call_memory;
	uint32_t max_concurrent_streams;  /* 0: 1024 */
	uint64_t handshake_timeout_ms;    /* preface must arrive in this; 0: 10s */
	uint64_t idle_timeout_ms;         /* close idle connections; 0: never */
	struct metrics_registry *metrics; /* NULL: metrics_global() */
};

/* Errors: -ENOMEM. */
int rpc_server_new(uv_loop_t *loop, const struct rpc_server_opts *opts,
		   struct rpc_server **out) MC_MUST_CHECK;

/*
 * Register a service: methods[] must outlive the server (static tables).
 * data is returned by rpc_call_service_data(). Errors: -EEXIST (service
 * already registered), -EINVAL (a method lacks a required callback),
 * -ENOMEM.
 */
int rpc_server_add_service(struct rpc_server *s, const char *service,
			   const struct rpc_method *methods, size_t nmethods,
			   void *data) MC_MUST_CHECK;

/* Listen on a numeric host:port (port 0: ephemeral). May be called more
 * than once. Errors: -EINVAL (address), negative errno of bind/listen
 * (-EADDRINUSE, ...). */
int rpc_server_listen(struct rpc_server *s, const char *hostport) MC_MUST_CHECK;

/* Refuse request messages larger than bytes with RESOURCE_EXHAUSTED
 * "grpc: received message larger than max (N vs. M)", as grpc-go's
 * MaxRecvMsgSize, while responses keep max_message_bytes (0: back to
 * it). Calls that start afterwards see the new limit. */
void rpc_server_set_max_recv_bytes(struct rpc_server *s, size_t bytes);

/*
 * Make remote calls prove the cluster secret: a connection's first call
 * that is not a grpc.health.v1.Health check must carry a fresh token of
 * key (mc_rpc_token, common/auth.h) in its "mooncake-auth" header, or it
 * and every later one fails UNAUTHENTICATED until one does; refusals are
 * counted in mooncake_rpc_server_unauthenticated_total{server}. Calls in
 * process need no proof. key is copied. Errors: -EINVAL (empty or too
 * long), -ENOMEM.
 */
int rpc_server_require_auth(struct rpc_server *s, const uint8_t *key,
			    size_t len) MC_MUST_CHECK;
/* After rpc_server_require_auth: a call may instead prove its connection
 * with a bearer token of the key (mc_bearer_check, common/auth.h) in this
 * header; an invalid or expired one fails UNAUTHENTICATED "etcdserver:
 * invalid auth token", which etcd's clients answer by authenticating
 * again. Errors: -EINVAL (no require_auth yet, or a header name longer
 * than 31 bytes). */
int rpc_server_accept_bearer(struct rpc_server *s, const char *header) MC_MUST_CHECK;

/* Port of the i-th listener (after rpc_server_listen), 0 if none. */
int rpc_server_port(const struct rpc_server *s, unsigned i);

/*
 * Graceful shutdown: stop accepting, send GOAWAY, let in-flight calls
 * finish for up to drain_timeout_ms, then cancel the rest, close every
 * connection and call on_done (from the loop). Calling it twice is a
 * no-op.
 */
void rpc_server_shutdown(struct rpc_server *s, uint64_t drain_timeout_ms,
			 void (*on_done)(struct rpc_server *s, void *ud), void *ud);

/* Free a server whose shutdown completed (or that never listened). */
void rpc_server_free(struct rpc_server *s);

/* ---- inside a handler */

/* Queue a response message; msg is the caller's again on return. A large
 * bytes field that lies in the request of a unary or server-streaming
 * call (while that request is alive) is written from the received request
 * instead of copied. Errors: -ECANCELED (call dead or finished),
 * MC_ETOO_LARGE (above max_message_bytes; nothing queued), -ENOBUFS (the
 * server's calls hold max_call_memory: nothing queued, and the call ends
 * RESOURCE_EXHAUSTED whatever status rpc_call_finish is given), -EINVAL
 * (a second message on a unary or client-streaming call), -ENOMEM. */
int rpc_call_send(struct rpc_call *call, const ProtobufCMessage *msg) MC_MUST_CHECK;

/* End the call: trailers with status and message (may be NULL) go out
 * after every queued message; releases the handler's reference. */
void rpc_call_finish(struct rpc_call *call, int status, const char *message);

/* Count bytes a handler keeps for the call (state its requests made, a
 * watch stream's watchers say) in the server's bound on what calls hold
 * (max_call_memory) and its connection's share, as the call's own
 * buffers are. Returns 0, or -ENOBUFS when they do not fit with 64 KiB
 * to spare, so that the call's next requests can still come in (nothing
 * counted: the handler refuses what it was asked). What is still held
 * when the call ends is let go then. */
int rpc_call_hold(struct rpc_call *call, size_t bytes) MC_MUST_CHECK;
void rpc_call_unhold(struct rpc_call *call, size_t bytes);

/* Bytes queued to the client but not yet written to the socket: lets a
 * streaming handler bound what a slow reader costs. */
size_t rpc_call_pending_bytes(const struct rpc_call *call);
bool rpc_call_cancelled(const struct rpc_call *call);
/* Absolute deadline on the uv_now() clock in ms, or 0 for none. */
uint64_t rpc_call_deadline_ms(const struct rpc_call *call);
/* The client's address "ip:port". */
const char *rpc_call_peer(const struct rpc_call *call);
/* Value of a request header (custom metadata), or NULL. */
const char *rpc_call_header(const struct rpc_call *call, const char *name);
/* The data given to rpc_server_add_service. */
void *rpc_call_service_data(const struct rpc_call *call);
/* Per-call handler data. */
void rpc_call_set_data(struct rpc_call *call, void *data);
void *rpc_call_data(const struct rpc_call *call);
uv_loop_t *rpc_call_loop(const struct rpc_call *call);

/* ------------------------------------------------------------------ health */

enum rpc_health_status {
	RPC_HEALTH_UNKNOWN = 0,
	RPC_HEALTH_SERVING = 1,
	RPC_HEALTH_NOT_SERVING = 2,
	RPC_HEALTH_SERVICE_UNKNOWN = 3,
};

struct rpc_health;

/* Serve grpc.health.v1.Health (Check, Watch) on s. The overall service ""
 * starts SERVING and turns NOT_SERVING when shutdown begins. The health
 * object is owned by the server. Errors: -ENOMEM, -EEXIST. */
int rpc_health_add(struct rpc_server *s, struct rpc_health **out) MC_MUST_CHECK;
/* Set the status of a service name; Watch streams see the change. */
int rpc_health_set(struct rpc_health *h, const char *service,
		   enum rpc_health_status status) MC_MUST_CHECK;
/* Call fn for every service name set with rpc_health_set (and ""), in
 * the order they were first set. */
void rpc_health_foreach(const struct rpc_health *h,
			void (*fn)(void *ud, const char *service,
				   enum rpc_health_status status),
			void *ud);

/* ------------------------------------------------------------------ diag */

/* Serve mooncake.diag.Diag (proto/diag.proto) on s: Echo, EchoStream,
 * Download, Upload — diagnostics and the load of mooncakectl bench rpc.
 * Errors: -EEXIST, -ENOMEM. */
int rpc_diag_add(struct rpc_server *s) MC_MUST_CHECK;

/* ------------------------------------------------------------------ client */

struct rpc_client;
struct rpc_stream;

struct rpc_client_opts {
	size_t max_message_bytes;         /* 0: 4 MiB */
	uint64_t connect_timeout_ms;      /* 0: 5s */
	uint64_t backoff_initial_ms;      /* reconnect backoff; 0: 100ms */
	uint64_t backoff_max_ms;          /* 0: 10s */
	struct metrics_registry *metrics; /* NULL: metrics_global() */
	/* The cluster secret, for a server that requires it
	 * (rpc_server_require_auth): each connection sends a fresh token
	 * made with it. NULL: none. Copied. */
	const uint8_t *auth_key;
	size_t auth_key_len;
	/* Unary calls to a server of this process listening at the target
	 * on the same loop go to it directly, without a connection (same
	 * status, deadlines, limits and metrics; the handler sees peer
	 * "in-process" and no headers). Streaming calls always connect. */
	bool local_calls;
};

/*
 * A channel to one server, target "host:port" or "http://host:port"
 * (numeric host). Connects lazily on the first call, reuses one HTTP/2
 * connection for all calls, reconnects with exponential backoff after a
 * failure (calls made while the channel is in backoff fail at once with
 * UNAVAILABLE), and moves to a new connection after the server's GOAWAY
 * while old calls finish on the old one. Errors: -EINVAL (target), -ENOMEM.
 */
int rpc_client_new(uv_loop_t *loop, const char *target, const struct rpc_client_opts *opts,
		   struct rpc_client **out) MC_MUST_CHECK;

/* Cancel every outstanding call (their callbacks run with CANCELLED,
 * before this returns), close the connections, and free the client once
 * they are closed (the loop must run on). Safe from inside the client's
 * own callbacks. */
void rpc_client_free(struct rpc_client *c);

/* Unary completion: status and message from the trailers (or the local
 * failure), resp (borrowed) non-NULL only when status is RPC_OK. */
typedef void (*rpc_unary_cb)(void *ud, int status, const char *message,
			     const ProtobufCMessage *resp);

/*
 * Start a unary call on path "/pkg.Service/Method". timeout_ms 0 = none
 * (sent as grpc-timeout, also enforced locally). cb runs exactly once,
 * never from inside this function. If out is non-NULL it receives a handle
 * for rpc_stream_cancel. Errors: -EINVAL (bad path, or the client is
 * being freed), MC_ETOO_LARGE (req above max_message_bytes), -ENOMEM.
 */
int rpc_client_unary(struct rpc_client *c, const char *path, const ProtobufCMessage *req,
		     const ProtobufCMessageDescriptor *resp_desc, uint64_t timeout_ms,
		     rpc_unary_cb cb, void *ud, struct rpc_stream **out) MC_MUST_CHECK;

/* A buffer lent to a call instead of copied (rpc_client_unary_lend). */
struct rpc_lend {
	void *buf;
	size_t len;
	/* The call no longer needs buf: runs once, from the loop, after the
	 * call's callback (or rpc_stream_cancel) and after every write that
	 * points into buf completed; never from inside
	 * rpc_client_unary_lend. */
	void (*release)(void *ctx, void *buf, size_t len);
	void *ctx;
};

/*
 * rpc_client_unary without copying a large payload: a top-level bytes
 * field of req (not repeated, not in a oneof) of at least 64 KiB that lies
 * in lend->buf is written to the socket from there, with the same bytes
 * on the wire as a copy would give. Everything else of req is serialized
 * before this returns, as with rpc_client_unary. On success the call
 * borrows lend->buf: the caller keeps it alive and unchanged until
 * lend->release runs (which it does even when the field was copied). On
 * error release never runs and the buffer stays the caller's. A call to
 * a server of this process (local_calls) copies the field once. Errors:
 * those of rpc_client_unary; -EINVAL (lend, its buf or its release NULL).
 */
int rpc_client_unary_lend(struct rpc_client *c, const char *path, const ProtobufCMessage *req,
			  const struct rpc_lend *lend,
			  const ProtobufCMessageDescriptor *resp_desc, uint64_t timeout_ms,
			  rpc_unary_cb cb, void *ud, struct rpc_stream **out) MC_MUST_CHECK;

struct rpc_stream_cbs {
	/* A response message (borrowed). */
	void (*on_message)(struct rpc_stream *st, void *ud, const ProtobufCMessage *msg);
	/* The call ended; the stream is freed after this returns. */
	void (*on_close)(struct rpc_stream *st, void *ud, int status, const char *message);
	/* Optional: rpc_stream_pending_bytes fell below RPC_DRAIN_BYTES
	 * after a send had brought it to it or above. */
	void (*on_drain)(struct rpc_stream *st, void *ud);
};

/*
 * Open a streaming call (any kind). Send with rpc_stream_send, half-close
 * with rpc_stream_close_send. cbs must outlive the stream. Errors: -EINVAL,
 * -ENOMEM.
 */
int rpc_client_stream(struct rpc_client *c, const char *path,
		      const ProtobufCMessageDescriptor *resp_desc, uint64_t timeout_ms,
		      const struct rpc_stream_cbs *cbs, void *ud,
		      struct rpc_stream **out) MC_MUST_CHECK;
/* Errors: -ECANCELED (closed), -EPIPE (already half-closed),
 * MC_ETOO_LARGE, -ENOMEM. */
int rpc_stream_send(struct rpc_stream *st, const ProtobufCMessage *msg) MC_MUST_CHECK;
int rpc_stream_close_send(struct rpc_stream *st) MC_MUST_CHECK;
/* Cancel (RST_STREAM CANCEL). No callback of this stream runs afterwards
 * and the handle is invalid when this returns. */
void rpc_stream_cancel(struct rpc_stream *st);
size_t rpc_stream_pending_bytes(const struct rpc_stream *st);

/*
 * Blocking unary call for tools that own their loop (mooncakectl): runs
 * the loop until the call completes. Must not be called from inside the
 * loop. On RPC_OK *resp is set (free with protobuf_c_message_free_unpacked).
 * Returns the gRPC status; errmsg gets the status message.
 */
int rpc_client_unary_sync(struct rpc_client *c, const char *path, const ProtobufCMessage *req,
			  const ProtobufCMessageDescriptor *resp_desc, uint64_t timeout_ms,
			  ProtobufCMessage **resp, char *errmsg, size_t errlen);

#endif
