/*
 * call: one gRPC call on the server side, whatever carries it (see
 * server_int.h: an HTTP/2 stream, sconn.c, or a client on the same loop,
 * inproc.c).
 *
 * A call is created by its transport when its request begins. When the
 * request headers are complete it is dispatched: method POST,
 * content-type application/grpc[+proto|;...], a known /service/method, a
 * well-formed grpc-timeout and no compression; otherwise it is refused at
 * once (UNIMPLEMENTED, INTERNAL, ...). Request bytes feed the call's
 * deframer; messages are unpacked with the method's descriptor and handed
 * to the handler (unary and server-streaming methods get theirs when the
 * client half-closes).
 *
 * Responses: rpc_call_send queues a message on the call's outq and tells
 * the transport; rpc_call_finish decides the final status, and the
 * transport sends it after what is queued. A call that dies first — the
 * client cancels or resets it, its deadline passes, a protocol error, a
 * lost connection, the end of a shutdown's drain — tells the handler
 * through on_cancel.
 *
 * References: the transport holds one (an HTTP/2 stream until it closes,
 * an in-process client until it has its answer or cancels), the handler
 * holds one from its first callback to rpc_call_finish. The call is freed
 * (or kept for reuse) when both are gone.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/log.h"
#include "common/metrics.h"
#include "common/util.h"
#include "rpc/server_int.h"

#define LOG_SUBSYS LOGS_RPC

#define CALL_FREELIST_MAX 64

static void on_dl_timer(uv_timer_t *t);

/* ---------------------------------------------------------------- metrics */

/* A long poll's duration in seconds: up to a minute; a stream's: up to
 * a day. */
static const double long_poll_buckets[] = {0.001, 0.01, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60};
static const double stream_buckets[] = {0.01, 0.1, 1, 10, 60, 300, 1800, 3600, 21600, 86400};

/*
 * The call latency histogram operators alert on holds unary calls only:
 * long polls (rpc_method.long_poll) and streams (held as long as their
 * client wants) have histograms of their own.
 */
int rpc__mstats_init(struct rpc__mstats *st, struct metrics_registry *reg, const char *server,
		     const char *svc, const char *method, bool long_poll, bool stream)
{
	size_t len = strlen(svc) + strlen(method) + 3;
	st->path = malloc(len);
	if (!st->path)
		return -ENOMEM;
	if (method[0])
		snprintf(st->path, len, "/%s/%s", svc, method);
	else
		snprintf(st->path, len, "%s", svc);
	if (stream)
		st->duration = metrics_histogram(
			reg, "mooncake_rpc_server_stream_duration_seconds",
			"How long streaming calls lasted, from request headers to the "
			"final status; kept out of "
			"mooncake_rpc_server_call_duration_seconds.",
			"server,method", (const char *[]){server, st->path}, stream_buckets,
			MC_ARRAY_LEN(stream_buckets));
	else if (long_poll)
		st->duration = metrics_histogram(
			reg, "mooncake_rpc_server_long_poll_duration_seconds",
			"Time long polls (calls held until something happens) were "
			"held, from request headers to the final status; kept out of "
			"mooncake_rpc_server_call_duration_seconds.",
			"server,method", (const char *[]){server, st->path}, long_poll_buckets,
			MC_ARRAY_LEN(long_poll_buckets));
	else
		st->duration = metrics_histogram(
			reg, "mooncake_rpc_server_call_duration_seconds",
			"Time from request headers to the final status.", "server,method",
			(const char *[]){server, st->path}, metrics_latency_buckets,
			metrics_latency_nbuckets);
	return 0;
}

static void call_record(struct rpc_call *call, int code)
{
	struct rpc_server *s = call->s;
	if (call->counted)
		return;
	call->counted = true;
	struct rpc__mstats *st = call->stats ? call->stats : &s->calls.unknown;
	rpc__count_status(st->calls, s->calls.reg, "mooncake_rpc_server_calls_total",
			  "gRPC calls handled, by final status.", rpc__server_name(s),
			  st->path, code);
	metric_observe(st->duration, (double)(uv_hrtime() - call->start_ns) / 1e9);
}

/* ---------------------------------------------------------------- the calls of a server */

/* The bound on requests' memory: as asked, and room for one request of
 * the largest size and what it decodes to at least (its bytes, a copy
 * and some structs). */
static void calls_bound(struct rpc__calls *cs)
{
	size_t least = 2 * cs->max_recv + (1u << 20);
	cs->bufs.mem_max = cs->call_mem > least ? cs->call_mem : least;
	/* One connection: a quarter, and one message either way. */
	size_t one = (cs->max_recv > cs->max_msg ? cs->max_recv : cs->max_msg) + (1u << 20);
	cs->conn_max = cs->bufs.mem_max / 4 > one ? cs->bufs.mem_max / 4 : one;
	if (cs->conn_max > cs->bufs.mem_max)
		cs->conn_max = cs->bufs.mem_max;
}

int rpc__calls_init(struct rpc__calls *cs, struct metrics_registry *reg, const char *server,
		    size_t max_msg, size_t call_mem)
{
	cs->reg = reg;
	cs->max_msg = cs->max_recv = max_msg;
	cs->call_mem = call_mem ? call_mem : RPC__DEFAULT_CALL_MEMORY;
	calls_bound(cs);
	cs->bufs.mem_gauge = metrics_gauge(
		reg, "mooncake_rpc_server_call_memory_bytes",
		"Bytes held by calls: requests being received or decoded, answers "
		"the clients have not taken (at most --rpc-max-call-memory).",
		"server", (const char *const[]){server});
	return rpc__mstats_init(&cs->unknown, reg, server, "unknown", "", false, false);
}

void rpc__calls_init_timer(struct rpc__calls *cs, uv_loop_t *loop)
{
	uv_timer_init(loop, &cs->dl_timer);
}

void rpc__calls_close(struct rpc__calls *cs, void *data, uv_close_cb cb)
{
	cs->dl_timer.data = data;
	uv_close((uv_handle_t *)&cs->dl_timer, cb);
}

void rpc__calls_free(struct rpc__calls *cs)
{
	while (cs->free) {
		struct rpc_call *call = cs->free;
		cs->free = call->next_free;
		mc_buf_free(&call->hdrs);
		free(call);
	}
	rpc__dlheap_free(&cs->dl);
	rpc__bufcache_free(&cs->bufs);
	free(cs->unknown.path);
	cs->unknown.path = NULL;
}

unsigned rpc__calls_live(const struct rpc__calls *cs)
{
	return cs->live;
}

void rpc__calls_set_max_recv(struct rpc__calls *cs, size_t bytes)
{
	cs->max_recv = bytes ? bytes : cs->max_msg;
	calls_bound(cs);
}

enum call_room { ROOM_OK, ROOM_SERVER_FULL, ROOM_CONN_FULL };

/* Do n more bytes fit the bound on what calls hold
 * (--rpc-max-call-memory), and the share of it one connection (*conn:
 * what its calls hold; NULL: none) may take? */
static enum call_room room_for(const struct rpc__calls *cs, const size_t *conn, size_t n)
{
	if (n > rpc__mem_left(&cs->bufs))
		return ROOM_SERVER_FULL;
	return !conn || (*conn <= cs->conn_max && n <= cs->conn_max - *conn) ? ROOM_OK
									     : ROOM_CONN_FULL;
}

static enum call_room call_room(const struct rpc_call *call, size_t n)
{
	return room_for(&call->s->calls, call->conn_held, n);
}

/* The most bytes the call may take now; *why: the bound that says so. */
static size_t call_room_left(const struct rpc_call *call, enum call_room *why)
{
	const struct rpc__calls *cs = &call->s->calls;
	size_t left = rpc__mem_left(&cs->bufs);
	*why = ROOM_SERVER_FULL;
	const size_t *conn = call->conn_held;
	size_t conn_left = !conn ? SIZE_MAX : *conn < cs->conn_max ? cs->conn_max - *conn : 0;
	if (conn_left < left) {
		left = conn_left;
		*why = ROOM_CONN_FULL;
	}
	return left;
}

static void full_message(const struct rpc_call *call, enum call_room why, char *msg, size_t n)
{
	const struct rpc__calls *cs = &call->s->calls;
	if (why == ROOM_CONN_FULL)
		snprintf(msg, n,
			 "grpc: the calls of this connection hold %zu of the %zu bytes "
			 "one connection may; this one does not fit (take the answers, "
			 "or ask for less)",
			 *call->conn_held, cs->conn_max);
	else
		snprintf(msg, n,
			 "grpc: the server's calls hold %zu of their %zu bytes; "
			 "this one does not fit (retry later or ask for less)",
			 cs->bufs.mem_held, cs->bufs.mem_max);
}

/* ---------------------------------------------------------------- call objects */

/* What a call of a connection costs besides the bytes it holds: its
 * struct and nghttp2's stream (1,024 streams a connection, connections
 * without number). */
#define CALL_COST (sizeof(struct rpc_call) + 512)

bool rpc__call_join(struct rpc_call *call, size_t *conn)
{
	if (room_for(&call->s->calls, conn, CALL_COST) != ROOM_OK) {
		/* Its client sees RESOURCE_EXHAUSTED (the transport resets the
		 * stream with ENHANCE_YOUR_CALM); its method is not known yet. */
		call_record(call, RPC_RESOURCE_EXHAUSTED);
		return false;
	}
	rpc__mem_count(&call->s->calls.bufs, CALL_COST, true);
	*conn += CALL_COST;
	call->conn_held = call->outq.conn_acct = conn;
	call->joined = true;
	return true;
}

void rpc__call_leave(struct rpc_call *call)
{
	if (!call->conn_held)
		return;
	*call->conn_held -= CALL_COST + call->df_held + call->held + call->outq.bytes +
			    call->hdrs.len;
	call->conn_held = call->outq.conn_acct = NULL;
}

struct rpc_call *rpc__call_new(struct rpc_server *s, const struct rpc__call_tp *tp,
			       const char *peer)
{
	struct rpc__calls *cs = &s->calls;
	struct rpc_call *call = cs->free;
	struct mc_buf hdrs = MC_BUF_INIT;

	if (call) {
		cs->free = call->next_free;
		cs->nfree--;
		hdrs = call->hdrs;
		mc_buf_reset(&hdrs);
	} else {
		call = malloc(sizeof(*call));
		if (!call)
			return NULL;
	}
	memset(call, 0, offsetof(struct rpc_call, peer));
	call->hdrs = hdrs;
	call->s = s;
	call->tp = tp;
	call->refs = 1; /* the transport's */
	call->start_ns = uv_hrtime();
	rpc__deframer_setup(&call->df, cs->max_recv, &cs->bufs);
	rpc__outq_init(&call->outq, tp->outq_ops);
	call->outq.acct = &cs->bufs;
	rpc__dl_init(&call->dl);
	size_t n = strnlen(peer, sizeof(call->peer) - 1);
	memcpy(call->peer, peer, n);
	call->peer[n] = '\0';
	cs->live++;
	return call;
}

static void call_free(struct rpc_call *call)
{
	struct rpc_server *s = call->s;
	struct rpc__calls *cs = &s->calls;
	rpc__call_leave(call);
	rpc__mem_count(&cs->bufs,
		       call->df_held + call->held + call->hdrs.len +
			       (call->joined ? CALL_COST : 0),
		       false);
	rpc_deframer_free(&call->df);
	rpc__unpacked_free(call->req, &call->req_arena);
	call->req = NULL;
	rpc__outq_clear(&call->outq);
	free(call->message);
	cs->live--;
	if (cs->nfree < CALL_FREELIST_MAX && !rpc__server_shutting_down(s)) {
		call->next_free = cs->free;
		cs->free = call;
		cs->nfree++;
	} else {
		mc_buf_free(&call->hdrs);
		free(call);
	}
	rpc__server_check_done(s);
}

/* What a hold leaves free besides itself: room for the requests that
 * follow (a cancel, or the next create to refuse) to be received. */
#define HOLD_HEADROOM (64u << 10)

int rpc_call_hold(struct rpc_call *call, size_t bytes)
{
	if (call_room(call, bytes + HOLD_HEADROOM) != ROOM_OK)
		return -ENOBUFS;
	rpc__mem_count(&call->s->calls.bufs, bytes, true);
	if (call->conn_held)
		*call->conn_held += bytes;
	call->held += bytes;
	return 0;
}

void rpc_call_unhold(struct rpc_call *call, size_t bytes)
{
	bytes = MC_MIN(bytes, call->held);
	rpc__mem_count(&call->s->calls.bufs, bytes, false);
	if (call->conn_held)
		*call->conn_held -= bytes;
	call->held -= bytes;
}

void rpc__call_ref(struct rpc_call *call)
{
	call->refs++;
}

void rpc__call_unref(struct rpc_call *call)
{
	if (--call->refs == 0)
		call_free(call);
}

int rpc__call_status(const struct rpc_call *call, const char **message)
{
	*message = call->message;
	return call->status;
}

/* The final status is known: no more deadline, metrics recorded. */
static void call_set_done(struct rpc_call *call, int status, const char *message,
			  bool cancelled)
{
	call->done = true;
	call->cancelled = cancelled;
	call->status = status;
	free(call->message);
	call->message = NULL;
	if (message && *message) {
		size_t cap = strlen(message) * 3 + 1;
		call->message = malloc(cap);
		if (call->message)
			rpc_percent_encode(message, call->message, cap);
	}
	rpc__dlheap_del(&call->s->calls.dl, &call->dl);
	call_record(call, status);
}

void rpc__call_drained(struct rpc_call *call)
{
	if (!call->done && call->handler_ref && call->m->on_drain) {
		call->refs++;
		call->m->on_drain(call);
		rpc__call_unref(call);
	}
}

void rpc__call_abort(struct rpc_call *call, int status, const char *message)
{
	if (call->done)
		return;
	log_debug("%s: call %s from %s ended: %s: %s", rpc__server_name(call->s),
		  call->stats ? call->stats->path : "?", call->peer, rpc_status_name(status),
		  message);
	call_set_done(call, status, message, true);
	call->tp->on_done(call, true);
	if (call->handler_ref && call->m->on_cancel) {
		call->refs++;
		call->m->on_cancel(call);
		rpc__call_unref(call);
	}
}

/* Answer at dispatch, before any handler saw the call. */
static void call_reject(struct rpc_call *call, const char *http_status, int status,
			const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static void call_reject(struct rpc_call *call, const char *http_status, int status,
			const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	log_debug("%s: rejected call from %s: %s: %s", rpc__server_name(call->s), call->peer,
		  rpc_status_name(status), msg);
	call_set_done(call, status, msg, true);
	if (call->tp->on_reject && call->tp->can_send(call))
		call->tp->on_reject(call, http_status);
}

void rpc__call_gone(struct rpc_call *call)
{
	if (!call->done) {
		call_set_done(call, RPC_CANCELLED, "cancelled", true);
		if (call->handler_ref && call->m->on_cancel)
			call->m->on_cancel(call);
	}
}

/* ---------------------------------------------------------------- request headers */

/* Keep a header. Its bytes count in the bound on what calls hold (1,024
 * streams of a connection could each keep 64 KiB): -ENOBUFS past it. */
static int hdr_add(struct rpc_call *call, const uint8_t *name, size_t nlen,
		   const uint8_t *value, size_t vlen)
{
	if (call_room(call, nlen + vlen + 2) != ROOM_OK) {
		call_record(call, RPC_RESOURCE_EXHAUSTED); /* (as in rpc__call_join) */
		return -ENOBUFS;
	}
	if (mc_buf_reserve(&call->hdrs, nlen + vlen + 2))
		return -ENOMEM;
	rpc__mem_count(&call->s->calls.bufs, nlen + vlen + 2, true);
	if (call->conn_held)
		*call->conn_held += nlen + vlen + 2;
	memcpy(call->hdrs.data + call->hdrs.len, name, nlen);
	call->hdrs.len += nlen;
	call->hdrs.data[call->hdrs.len++] = '\0';
	memcpy(call->hdrs.data + call->hdrs.len, value, vlen);
	call->hdrs.len += vlen;
	call->hdrs.data[call->hdrs.len++] = '\0';
	return 0;
}

const char *rpc_call_header(const struct rpc_call *call, const char *name)
{
	const char *p = call->hdrs.data, *end = p + call->hdrs.len;
	while (p && p < end) {
		const char *v = p + strlen(p) + 1;
		if (strcasecmp(p, name) == 0)
			return v;
		p = v + strlen(v) + 1;
	}
	return NULL;
}

#define NAME_IS(lit) (nlen == sizeof(lit) - 1 && memcmp(name, lit, nlen) == 0)

int rpc__call_header(struct rpc_call *call, const uint8_t *name, size_t nlen,
		     const uint8_t *value, size_t vlen)
{
	if (name[0] == ':') {
		if (NAME_IS(":method")) {
			call->post = vlen == 4 && memcmp(value, "POST", 4) == 0;
		} else if (NAME_IS(":path")) {
			/* Kept by offset too: dispatch needs it for every call. */
			size_t off = call->hdrs.len + nlen + 1;
			int rc = hdr_add(call, name, nlen, value, vlen);
			if (rc == 0)
				call->path_off = off;
			return rc;
		}
		return 0;
	}
	if (NAME_IS("content-type")) {
		call->ct_ok = rpc__content_type_ok(value, vlen);
	} else if (NAME_IS("grpc-timeout")) {
		char tmp[16];
		if (vlen >= sizeof(tmp)) {
			call->bad_timeout = true;
		} else {
			memcpy(tmp, value, vlen);
			tmp[vlen] = '\0';
			if (rpc_timeout_parse(tmp, &call->timeout_ms))
				call->bad_timeout = true;
			else
				call->has_timeout = true;
		}
	} else if (NAME_IS("grpc-encoding")) {
		if (!(vlen == 8 && memcmp(value, "identity", 8) == 0))
			call->bad_encoding = true;
	}
	return hdr_add(call, name, nlen, value, vlen);
}

/* ---------------------------------------------------------------- dispatch */

/* Set the call's method from its path "/svc/Method", or say why not in
 * why. Errors: -ENOENT. */
static int find_method(struct rpc_call *call, const char *path, char *why, size_t wlen)
{
	return rpc__server_find_method(call->s, path, &call->m, &call->svc_data, &call->stats,
				       why, wlen);
}

/* Start the call's deadline, if it has one. */
static void call_arm_deadline(struct rpc_call *call)
{
	struct rpc__calls *cs = &call->s->calls;
	if (!call->has_timeout)
		return;
	call->dl.at_ms = uv_now(rpc__server_loop(call->s)) + call->timeout_ms;
	if (rpc__dlheap_add(&cs->dl, &call->dl) == 0 && rpc__dlheap_top(&cs->dl) == &call->dl)
		rpc__dlheap_arm(&cs->dl, &cs->dl_timer, on_dl_timer);
}

void rpc__call_dispatch(struct rpc_call *call)
{
	struct rpc_server *s = call->s;
	const char *path = call->path_off ? call->hdrs.data + call->path_off : NULL;

	if (!call->post) {
		call_reject(call, "405", RPC_UNIMPLEMENTED, "method must be POST");
		return;
	}
	if (!call->ct_ok) {
		const char *ct = rpc_call_header(call, "content-type");
		call_reject(call, "415", RPC_INTERNAL,
			    "invalid gRPC request content-type \"%s\"", ct ? ct : "");
		return;
	}
	char why[256];
	if (find_method(call, path, why, sizeof(why))) {
		call_reject(call, "200", RPC_UNIMPLEMENTED, "%s", why);
		return;
	}
	int refused = rpc__auth_admit(call, path, why, sizeof(why));
	if (refused) {
		call_reject(call, "200", refused, "%s", why);
		return;
	}
	if (call->bad_timeout) {
		call_reject(call, "200", RPC_INTERNAL, "malformed grpc-timeout \"%s\"",
			    rpc_call_header(call, "grpc-timeout"));
		return;
	}
	if (call->bad_encoding) {
		call_reject(call, "200", RPC_UNIMPLEMENTED,
			    "grpc-encoding \"%s\" is not supported (identity only)",
			    rpc_call_header(call, "grpc-encoding"));
		return;
	}
	if (rpc__server_drain_expired(s)) {
		call_reject(call, "200", RPC_UNAVAILABLE, "server shutting down");
		return;
	}
	call->dispatched = true;
	call_arm_deadline(call);
	if (call->m->kind == RPC_CLIENT_STREAMING || call->m->kind == RPC_BIDI_STREAMING) {
		call->handler_ref = true;
		call->refs++;
		call->m->on_start(call);
	}
}

static void call_abort_full(struct rpc_call *call, enum call_room why)
{
	char msg[192];
	full_message(call, why, msg, sizeof(msg));
	rpc__call_abort(call, RPC_RESOURCE_EXHAUSTED, msg);
}

/* A request that did not unpack: the method's answer for one nested too
 * deeply, if it has one, else the bound's, else grpc-go's for a message
 * it cannot parse. */
static void call_abort_unparsed(struct rpc_call *call, const struct rpc__arena *a)
{
	if (a->too_deep && call->m->too_deep_message)
		rpc__call_abort(call, call->m->too_deep_status, call->m->too_deep_message);
	else if (a->too_big)
		call_abort_full(call, ROOM_SERVER_FULL);
	else
		rpc__call_abort(call, RPC_INTERNAL, "failed to parse request message");
}

static int call_on_msg(void *ud, const uint8_t *body, size_t len)
{
	struct rpc_call *call = ud;
	bool single = call->m->kind == RPC_UNARY || call->m->kind == RPC_SERVER_STREAMING;
	if (single && call->nreq) {
		rpc__call_abort(call, RPC_INTERNAL,
				"more than one request message for a unary request");
		return -EPROTO;
	}
	struct rpc__arena ar;
	struct rpc__arena *a = single ? &call->req_arena : &ar;
	ProtobufCMessage *msg = rpc__unpack(call->m->request, body, len, &call->s->calls.bufs,
					    &call->df, a);
	if (!msg) {
		call_abort_unparsed(call, a);
		return -EBADMSG;
	}
	call->nreq++;
	if (single) {
		call->req = msg;
		return 0;
	}
	call->m->on_message(call, msg);
	rpc__unpacked_free(msg, a);
	return call->done ? -ECANCELED : 0;
}

/* Count what the call's message being received holds now (its buffer,
 * which grows with the bytes that came: frame.h) in the server's bound on
 * requests. Growth past the room left is counted too (the buffer is
 * there), and said: the caller ends the call, which frees it. */
static enum call_room call_count_partial(struct rpc_call *call)
{
	struct rpc__bufcache *bc = &call->s->calls.bufs;
	size_t now = call->df.msg ? call->df.msg_cap : 0;
	enum call_room why = ROOM_OK;
	if (now > call->df_held)
		why = call_room(call, now - call->df_held);
	if (now >= call->df_held)
		rpc__mem_count(bc, now - call->df_held, true);
	else
		rpc__mem_count(bc, call->df_held - now, false);
	if (call->conn_held)
		*call->conn_held = *call->conn_held - call->df_held + now;
	call->df_held = now;
	return why;
}

void rpc__call_data(struct rpc_call *call, const uint8_t *data, size_t len)
{
	if (!call->dispatched || call->done)
		return;
	struct rpc__bufcache *bc = &call->s->calls.bufs;
	call->refs++;
	enum call_room why = call_room(call, len);
	if (why != ROOM_OK) {
		call_abort_full(call, why);
		rpc__call_unref(call);
		return;
	}
	rpc__mem_count(bc, len, true); /* (the chunk, while it is fed) */
	int rc = rpc_deframer_feed(&call->df, data, len, call_on_msg, call);
	rpc__mem_count(bc, len, false);
	enum call_room grown = call_count_partial(call);
	if (rc == 0 && grown != ROOM_OK && !call->done) {
		call_abort_full(call, grown);
	} else if (rc == MC_ETOO_LARGE) {
		char msg[128];
		snprintf(msg, sizeof(msg),
			 "grpc: received message larger than max (%zu vs. %zu)",
			 call->df.msg_len, call->df.max_message_bytes);
		rpc__call_abort(call, RPC_RESOURCE_EXHAUSTED, msg);
	} else if (rc == -EPROTO && !call->done) {
		rpc__call_abort(call, RPC_INTERNAL,
				"compressed message but no grpc-encoding was negotiated");
	} else if (rc == -ENOMEM) {
		rpc__call_abort(call, RPC_RESOURCE_EXHAUSTED, "out of memory");
	}
	rpc__call_unref(call);
}

void rpc__call_half_close(struct rpc_call *call)
{
	if (call->remote_closed)
		return;
	call->remote_closed = true;
	if (!call->dispatched || call->done)
		return;
	if (!rpc_deframer_idle(&call->df)) {
		rpc__call_abort(call, RPC_INTERNAL, "request stream ended inside a message");
		return;
	}
	switch (call->m->kind) {
	case RPC_UNARY:
	case RPC_SERVER_STREAMING:
		if (call->nreq != 1) {
			rpc__call_abort(call, RPC_INTERNAL,
					"no request message for a unary request");
			return;
		}
		ProtobufCMessage *req = call->req;
		call->req = NULL;
		call->handler_ref = true;
		call->refs++;
		call->m->on_message(call, req);
		rpc__unpacked_free(req, &call->req_arena);
		break;
	case RPC_CLIENT_STREAMING:
	case RPC_BIDI_STREAMING:
		if (call->m->on_half_close)
			call->m->on_half_close(call);
		break;
	}
}

/* ---------------------------------------------------------------- whole unary requests */

int rpc__call_route(struct rpc_call *call, const char *path)
{
	char why[256];
	call->post = call->ct_ok = true;
	if (find_method(call, path, why, sizeof(why))) {
		/* Answered UNIMPLEMENTED on its turn, like a network call. */
		call->message = strdup(why);
		return call->message ? -ENOENT : -ENOMEM;
	}
	return call->m->kind == RPC_UNARY ? 0 : -EOPNOTSUPP;
}

/* As rpc__call_dispatch and rpc__call_half_close do for a network call. */
void rpc__call_unary(struct rpc_call *call, uint64_t timeout_ms, const uint8_t *body,
		     size_t len)
{
	struct rpc__calls *cs = &call->s->calls;
	if (call->done)
		return;
	if (!call->m) {
		char why[256];
		snprintf(why, sizeof(why), "%s", call->message ? call->message : "");
		rpc__call_abort(call, RPC_UNIMPLEMENTED, why);
		return;
	}
	if (rpc__server_drain_expired(call->s)) {
		rpc__call_abort(call, RPC_UNAVAILABLE, "server shutting down");
		return;
	}
	if (len > cs->max_recv) {
		char msg[128];
		snprintf(msg, sizeof(msg),
			 "grpc: received message larger than max (%zu vs. %zu)", len,
			 cs->max_recv);
		rpc__call_abort(call, RPC_RESOURCE_EXHAUSTED, msg);
		return;
	}
	ProtobufCMessage *m = rpc__unpack(call->m->request, body, len, &cs->bufs, NULL,
					  &call->req_arena);
	if (!m) {
		call_abort_unparsed(call, &call->req_arena);
		return;
	}
	call->dispatched = true;
	call->nreq = 1;
	call->remote_closed = true;
	call->has_timeout = timeout_ms > 0;
	call->timeout_ms = timeout_ms;
	call_arm_deadline(call);
	call->handler_ref = true;
	call->refs++;
	call->m->on_message(call, m);
	rpc__unpacked_free(m, &call->req_arena);
}

/* ---------------------------------------------------------------- deadlines */

static void on_dl_timer(uv_timer_t *t)
{
	struct rpc__calls *cs = MC_CONTAINER_OF(t, struct rpc__calls, dl_timer);
	uint64_t now = uv_now(t->loop);
	struct rpc__dl *d;

	while ((d = rpc__dlheap_top(&cs->dl)) && d->at_ms <= now) {
		struct rpc_call *call = MC_CONTAINER_OF(d, struct rpc_call, dl);
		rpc__dlheap_del(&cs->dl, d);
		call->refs++;
		rpc__call_abort(call, RPC_DEADLINE_EXCEEDED, "deadline exceeded");
		rpc__call_unref(call);
	}
	rpc__dlheap_arm(&cs->dl, &cs->dl_timer, on_dl_timer);
}

/* ---------------------------------------------------------------- handler API */

int rpc_call_send(struct rpc_call *call, const ProtobufCMessage *msg)
{
	if (call->done || !call->handler_ref)
		return -ECANCELED;
	if ((call->m->kind == RPC_UNARY || call->m->kind == RPC_CLIENT_STREAMING) &&
	    call->nsent)
		return -EINVAL;
	if (!call->tp->can_send(call))
		return -ECANCELED;
	/* An answer waits in memory until the client takes it (a client
	 * that opens no window never does): it too must fit the bound, and
	 * one that does not is refused before it is packed. The call then
	 * ends RESOURCE_EXHAUSTED, whatever its handler says. Bytes that lie
	 * in the request's received body are sent from there: an echo of a
	 * large field is not copied. */
	enum call_room why;
	size_t room = call_room_left(call, &why);
	struct rpc__omsg *m;
	int rc = rpc__omsg_pack(msg, call->s->calls.max_msg, room, &call->s->calls.bufs,
				call->req_arena.body, &m);
	if (rc == -ENOBUFS)
		call->mem_refused = (uint8_t)why;
	if (rc)
		return rc;
	rpc__outq_push(&call->outq, m);
	call->nsent++;
	rc = call->tp->on_send(call);
	if (rc) {
		rpc__outq_clear(&call->outq);
		call->nsent--;
	}
	return rc;
}

void rpc_call_finish(struct rpc_call *call, int status, const char *message)
{
	if (!call->handler_ref) {
		log_error("%s: rpc_call_finish on a call the handler does not hold",
			  rpc__server_name(call->s));
		return;
	}
	call->handler_ref = false;
	char full[192];
	if (call->mem_refused) {
		full_message(call, call->mem_refused, full, sizeof(full));
		status = RPC_RESOURCE_EXHAUSTED;
		message = full;
	}
	if (!call->done) {
		call_set_done(call, status, message, false);
		call->tp->on_done(call, false);
	}
	rpc__call_unref(call);
}

size_t rpc_call_pending_bytes(const struct rpc_call *call)
{
	return call->outq.bytes;
}

bool rpc_call_cancelled(const struct rpc_call *call)
{
	return call->cancelled;
}

uint64_t rpc_call_deadline_ms(const struct rpc_call *call)
{
	return call->has_timeout ? call->dl.at_ms : 0;
}

const char *rpc_call_peer(const struct rpc_call *call)
{
	return call->peer;
}

void *rpc_call_service_data(const struct rpc_call *call)
{
	return call->svc_data;
}

void rpc_call_set_data(struct rpc_call *call, void *data)
{
	call->data = data;
}

void *rpc_call_data(const struct rpc_call *call)
{
	return call->data;
}

uv_loop_t *rpc_call_loop(const struct rpc_call *call)
{
	return rpc__server_loop(call->s);
}
