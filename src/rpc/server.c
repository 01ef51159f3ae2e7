/*
 * server: gRPC services on HTTP/2 connections accepted from libuv
 * listeners.
 *
 * A request stream becomes a struct rpc_call when its HEADERS begin. When
 * the header block is complete the call is dispatched: method POST,
 * content-type application/grpc[+proto|;...], a known /service/method, a
 * well-formed grpc-timeout and no compression; otherwise the stream gets
 * a trailers-only answer (UNIMPLEMENTED, INTERNAL, ...) and is otherwise
 * ignored. DATA feeds the call's deframer; messages are unpacked with the
 * method's descriptor and handed to the handler (unary and server-
 * streaming methods get theirs when the client half-closes).
 *
 * Responses: the first rpc_call_send submits the response HEADERS with a
 * data provider over the call's outq; rpc_call_finish marks the queue's
 * end, and the data provider submits the trailers (grpc-status,
 * grpc-message) when the last byte is out. A finish with nothing sent is a
 * trailers-only response.
 *
 * References: nghttp2's stream holds one (released in on_stream_close or
 * when the connection goes), the handler holds one from its first
 * callback to rpc_call_finish. The call is freed (or recycled) when both
 * are gone. A call that dies first — RST_STREAM from the client, its
 * deadline, a protocol error, a lost connection, the end of a shutdown's
 * drain — tells the handler through on_cancel.
 *
 * In-process calls: a client made with local_calls whose target is one of
 * this server's listeners, on the same loop, hands a unary call over
 * directly (rpc__server_inproc_start): the serialized request is unpacked
 * and dispatched from the server's idle handle, the handler sees a call
 * like any other (peer "in-process", no headers), and rpc_call_finish
 * gives the status and the serialized response to the client
 * (rpc__client_inproc_done). The client's side holds the reference
 * nghttp2's stream holds for a network call; it is dropped when the
 * answer is delivered or the client cancels (rpc__server_inproc_cancel).
 * Same deadlines, metrics, size limits and drain as a network call; no
 * socket, no HTTP/2 framing, no wakeup of another thread.
 *
 * Shutdown follows the gRPC graceful pattern: close the listeners, send
 * a GOAWAY "shutdown notice" (last stream id 2^31-1) and a PING on every
 * connection; on the PING's ACK send the real GOAWAY with the last stream
 * id processed, so a request in flight during the notice is not lost
 * (a connection with no call in flight gets the final GOAWAY at once).
 * Connections close when their last call ends; at drain_timeout_ms the
 * rest are closed, which cancels their calls.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/log.h"
#include "common/metrics.h"
#include "common/util.h"
#include "rpc/rpc_int.h"

#define LOG_SUBSYS LOGS_RPC

#define NCODES 17
#define CALL_FREELIST_MAX 64

struct mstats {
	char *path; /* "/svc/Method" (owned) */
	struct metric *calls[NCODES];
	struct metric *duration;
};

struct svc {
	struct svc *next;
	char *name;
	size_t name_len;
	const struct rpc_method *methods;
	size_t n;
	void *data;
	struct mstats *stats;
};

struct listener {
	uv_tcp_t tcp;
	struct rpc_server *s;
	int port;
	struct sockaddr_storage addr; /* bound */
};

struct sconn {
	struct rpc__conn base;
	struct rpc_server *s;
	struct sconn *prev, *next;
	struct rpc_call *calls;
	unsigned ncalls;
	bool handshake_done;
	int drain_stage; /* 0: serving, 1: notice + PING sent, 2: GOAWAY sent */
};

struct rpc_server {
	uv_loop_t *loop;
	char *name;
	size_t max_msg;  /* responses */
	size_t max_recv; /* requests */
	uint32_t max_streams;
	uint64_t handshake_ms, idle_ms;
	struct metrics_registry *reg;
	struct metric *m_conns, *m_proto;
	struct mstats unknown;
	struct svc *svcs;
	struct listener **listeners;
	unsigned nlisteners, listeners_open;
	struct sconn *conns;
	unsigned nconns;
	unsigned live_calls;
	struct rpc_call *free_calls;
	unsigned nfree;
	nghttp2_session_callbacks *cbs;
	nghttp2_option *ngopt;
	uint8_t *rbuf;
	struct rpc__dlheap dl;
	struct rpc__bufcache bufs;
	uv_timer_t dl_timer, drain_timer;
	bool timers_ready;
	unsigned timers_open;
	bool shutting_down, drain_expired, finalizing, done;
	void (*on_done)(struct rpc_server *s, void *ud);
	void *done_ud;
	struct rpc_health *health;
	/* In-process calls: live ones (linked by prev/next), those waiting
	 * for dispatch, and this server's place in the process's list. */
	struct rpc_call *icalls;
	struct rpc_call *iq_head, *iq_tail;
	uv_idle_t idle;
	struct rpc_server *local_next;
	bool local_listed;
};

struct rpc_call {
	struct rpc_server *s;
	struct sconn *sc; /* NULL once the stream is gone */
	struct rpc_call *prev, *next;
	int32_t stream_id;
	unsigned refs;
	const struct rpc_method *m;
	const struct svc *svc;
	struct mstats *stats;
	struct mc_buf hdrs; /* request headers: "name\0value\0"... */
	uint64_t timeout_ms;
	uint64_t start_ns;
	bool has_timeout, bad_timeout, bad_encoding, post, ct_ok;
	/* Request header checks made here rather than by nghttp2 (whose
	 * HTTP messaging checks refuse grpc-go's URL :authority): */
	uint8_t pseudo;      /* PSEUDO_* seen */
	bool regular_seen;   /* a regular header came: no pseudo after it */
	bool bad_headers;    /* the stream was reset for its headers */
	bool dispatched;     /* a method was found and its handler may run */
	bool handler_ref;    /* the handler holds a reference */
	bool remote_closed;  /* the client half-closed */
	bool done;           /* final status decided */
	bool cancelled;      /* ... and not by the handler */
	bool counted;        /* metrics recorded */
	bool resp_submitted; /* response HEADERS submitted */
	int status;
	char *message; /* percent-encoded grpc-message, or NULL */
	unsigned nreq, nsent;
	ProtobufCMessage *req;
	struct rpc__arena req_arena;
	struct rpc_deframer df;
	struct rpc__outq outq;
	struct rpc__dl dl;
	void *data;
	bool inproc;               /* handed over by an in-process client */
	struct rpc_stream *ist;    /* that client's stream; NULL once detached */
	struct rpc__omsg *ireq;    /* its serialized request, until dispatch */
	struct rpc_call *iq_next;  /* dispatch queue */
	char peer[64];
};

static const struct rpc__conn_ops sconn_ops;
static const struct rpc__outq_ops call_outq_ops;
static void server_check_done(struct rpc_server *s);
static void call_unref(struct rpc_call *call);
static void on_dl_timer(uv_timer_t *t);
static void on_conn_timer(uv_timer_t *t);
static void inproc_deliver(struct rpc_call *call);

#define NV(n, v)                                                               \
	{(uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, sizeof(v) - 1,          \
	 NGHTTP2_NV_FLAG_NO_COPY_NAME | NGHTTP2_NV_FLAG_NO_COPY_VALUE}
#define NVS(n, v, vlen)                                                        \
	{(uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, (vlen),                 \
	 NGHTTP2_NV_FLAG_NO_COPY_NAME}

/* ---------------------------------------------------------------- metrics */

static void call_record(struct rpc_call *call, int code)
{
	struct rpc_server *s = call->s;
	if (call->counted)
		return;
	call->counted = true;
	struct mstats *st = call->stats ? call->stats : &s->unknown;
	if (code < 0 || code >= NCODES)
		code = RPC_UNKNOWN;
	if (!st->calls[code])
		st->calls[code] = metrics_counter(
			s->reg, "mooncake_rpc_server_calls_total",
			"gRPC calls handled, by final status.", "server,method,code",
			(const char *[]){s->name, st->path, rpc_status_name(code)});
	metric_inc(st->calls[code]);
	metric_observe(st->duration, (double)(uv_hrtime() - call->start_ns) / 1e9);
}

/* A long poll's duration in seconds: up to a minute; a stream's: up to
 * a day. */
static const double long_poll_buckets[] = {0.001, 0.01, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60};
static const double stream_buckets[] = {0.01, 0.1, 1, 10, 60, 300, 1800, 3600, 21600, 86400};

/*
 * The call latency histogram operators alert on holds unary calls only:
 * long polls (rpc_method.long_poll) and streams (held as long as their
 * client wants) have histograms of their own.
 */
static int mstats_init(struct rpc_server *s, struct mstats *st, const char *svc,
		       const char *method, bool long_poll, bool stream)
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
			s->reg, "mooncake_rpc_server_stream_duration_seconds",
			"How long streaming calls lasted, from request headers to the "
			"final status; kept out of "
			"mooncake_rpc_server_call_duration_seconds.",
			"server,method", (const char *[]){s->name, st->path}, stream_buckets,
			MC_ARRAY_LEN(stream_buckets));
	else if (long_poll)
		st->duration = metrics_histogram(
			s->reg, "mooncake_rpc_server_long_poll_duration_seconds",
			"Time long polls (calls held until something happens) were "
			"held, from request headers to the final status; kept out of "
			"mooncake_rpc_server_call_duration_seconds.",
			"server,method", (const char *[]){s->name, st->path},
			long_poll_buckets, MC_ARRAY_LEN(long_poll_buckets));
	else
		st->duration = metrics_histogram(
			s->reg, "mooncake_rpc_server_call_duration_seconds",
			"Time from request headers to the final status.", "server,method",
			(const char *[]){s->name, st->path}, metrics_latency_buckets,
			metrics_latency_nbuckets);
	return 0;
}

/* ---------------------------------------------------------------- headers */

static int hdr_add(struct rpc_call *call, const uint8_t *name, size_t nlen,
		   const uint8_t *value, size_t vlen)
{
	if (mc_buf_reserve(&call->hdrs, nlen + vlen + 2))
		return -ENOMEM;
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

enum { PSEUDO_METHOD = 1, PSEUDO_SCHEME = 2, PSEUDO_AUTHORITY = 4, PSEUDO_PATH = 8 };

/* Reset a stream whose request headers break HTTP/2's rules (RFC 9113
 * 8.3): an unknown, repeated or late pseudo-header, an invalid name or
 * value. The :authority value is only checked as a field value. */
static int reject_headers(nghttp2_session *ng, struct rpc_call *call)
{
	call->bad_headers = true;
	nghttp2_submit_rst_stream(ng, NGHTTP2_FLAG_NONE, call->stream_id, NGHTTP2_PROTOCOL_ERROR);
	return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
}

static int check_header(nghttp2_session *ng, struct rpc_call *call, const uint8_t *name,
			size_t nlen, const uint8_t *value, size_t vlen)
{
	if (!nghttp2_check_header_value(value, vlen))
		return reject_headers(ng, call);
	if (nlen && name[0] == ':') {
		uint8_t bit = NAME_IS(":method")	  ? PSEUDO_METHOD
			      : NAME_IS(":scheme")	  ? PSEUDO_SCHEME
			      : NAME_IS(":authority") ? PSEUDO_AUTHORITY
			      : NAME_IS(":path")	  ? PSEUDO_PATH
						  : 0;
		if (!bit || (call->pseudo & bit) || call->regular_seen || !vlen)
			return reject_headers(ng, call);
		call->pseudo |= bit;
		return 0;
	}
	if (!nghttp2_check_header_name(name, nlen) ||
	    (nlen == 10 && memcmp(name, "connection", 10) == 0))
		return reject_headers(ng, call);
	call->regular_seen = true;
	return 0;
}

static int on_header(nghttp2_session *ng, const nghttp2_frame *frame,
		     const uint8_t *name, size_t nlen, const uint8_t *value,
		     size_t vlen, uint8_t flags, void *user_data)
{
	struct rpc__conn *c = user_data;
	if (c->closing || frame->hd.type != NGHTTP2_HEADERS ||
	    frame->headers.cat != NGHTTP2_HCAT_REQUEST)
		return 0;
	struct rpc_call *call = nghttp2_session_get_stream_user_data(ng, frame->hd.stream_id);
	if (!call || call->bad_headers)
		return 0;
	int rv = check_header(ng, call, name, nlen, value, vlen);
	if (rv)
		return rv;
	if (name[0] == ':') {
		if (NAME_IS(":method"))
			call->post = vlen == 4 && memcmp(value, "POST", 4) == 0;
		else if (NAME_IS(":path") && hdr_add(call, name, nlen, value, vlen))
			return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
		return 0;
	}
	if (NAME_IS("content-type")) {
		call->ct_ok = vlen >= 16 && memcmp(value, "application/grpc", 16) == 0 &&
			      (vlen == 16 || value[16] == '+' || value[16] == ';');
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
	if (hdr_add(call, name, nlen, value, vlen))
		return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
	return 0;
}

/* ---------------------------------------------------------------- call objects */

static struct rpc_call *call_alloc(struct rpc_server *s)
{
	struct rpc_call *call = s->free_calls;
	struct mc_buf hdrs = MC_BUF_INIT;

	if (call) {
		s->free_calls = call->next;
		s->nfree--;
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
	call->refs = 1; /* the transport's: nghttp2's stream or the in-process client */
	call->start_ns = uv_hrtime();
	rpc__deframer_setup(&call->df, s->max_recv, &s->bufs);
	rpc__outq_init(&call->outq, &call_outq_ops);
	rpc__dl_init(&call->dl);
	s->live_calls++;
	return call;
}

static struct rpc_call *call_new(struct sconn *sc, int32_t stream_id)
{
	struct rpc_call *call = call_alloc(sc->s);
	if (!call)
		return NULL;
	call->sc = sc;
	call->stream_id = stream_id;
	memcpy(call->peer, sc->base.peer, sizeof(call->peer));
	call->next = sc->calls;
	if (sc->calls)
		sc->calls->prev = call;
	sc->calls = call;
	sc->ncalls++;
	return call;
}

static void call_free(struct rpc_call *call)
{
	struct rpc_server *s = call->s;
	rpc_deframer_free(&call->df);
	rpc__unpacked_free(call->req, &call->req_arena);
	call->req = NULL;
	rpc__outq_clear(&call->outq);
	rpc__omsg_unref(call->ireq);
	free(call->message);
	s->live_calls--;
	if (s->nfree < CALL_FREELIST_MAX && !s->shutting_down) {
		call->next = s->free_calls;
		s->free_calls = call;
		s->nfree++;
	} else {
		mc_buf_free(&call->hdrs);
		free(call);
	}
	server_check_done(s);
}

static void call_unref(struct rpc_call *call)
{
	if (--call->refs == 0)
		call_free(call);
}

static bool call_can_submit(const struct rpc_call *call)
{
	return call->sc && !call->sc->base.closing && call->sc->base.ng;
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
	rpc__dlheap_del(&call->s->dl, &call->dl);
	call_record(call, status);
}

static void submit_trailers_only(struct rpc_call *call, const char *http_status)
{
	char code[12];
	int n = snprintf(code, sizeof(code), "%d", call->status);
	nghttp2_nv nva[] = {
		NVS(":status", http_status, strlen(http_status)),
		NV("content-type", "application/grpc"),
		{(uint8_t *)"grpc-status", (uint8_t *)code, 11, (size_t)n,
		 NGHTTP2_NV_FLAG_NO_COPY_NAME},
		{(uint8_t *)"grpc-message", (uint8_t *)call->message, 12,
		 call->message ? strlen(call->message) : 0,
		 NGHTTP2_NV_FLAG_NO_COPY_NAME},
	};
	size_t nnv = call->message ? 4 : 3;
	call->resp_submitted = true;
	if (nghttp2_submit_response(call->sc->base.ng, call->stream_id, nva, nnv, NULL))
		nghttp2_submit_rst_stream(call->sc->base.ng, NGHTTP2_FLAG_NONE,
					  call->stream_id, NGHTTP2_INTERNAL_ERROR);
	rpc__conn_want_flush(&call->sc->base);
}

static int submit_response(struct rpc_call *call)
{
	nghttp2_nv nva[] = {
		NV(":status", "200"),
		NV("content-type", "application/grpc"),
		NV("grpc-accept-encoding", "identity"),
	};
	nghttp2_data_provider prd = {.source.ptr = &call->outq,
				     .read_callback = rpc__outq_read_cb};
	if (nghttp2_submit_response(call->sc->base.ng, call->stream_id, nva, 3, &prd))
		return -ENOMEM;
	call->resp_submitted = true;
	rpc__conn_want_flush(&call->sc->base);
	return 0;
}

/* Queue the final status after whatever is queued. */
static void call_queue_status(struct rpc_call *call)
{
	if (!call_can_submit(call))
		return;
	if (!call->resp_submitted && call->outq.bytes == 0) {
		submit_trailers_only(call, "200");
		return;
	}
	call->outq.eof = true;
	if (!call->resp_submitted) {
		if (submit_response(call))
			nghttp2_submit_rst_stream(call->sc->base.ng, NGHTTP2_FLAG_NONE,
						  call->stream_id, NGHTTP2_INTERNAL_ERROR);
		return;
	}
	rpc__conn_resume(&call->sc->base, call->stream_id, &call->outq);
}

static void on_outq_eof(struct rpc__outq *q, nghttp2_session *ng,
			int32_t stream_id, uint32_t *data_flags)
{
	struct rpc_call *call = MC_CONTAINER_OF(q, struct rpc_call, outq);
	char code[12];
	int n = snprintf(code, sizeof(code), "%d", call->status);
	nghttp2_nv nva[] = {
		{(uint8_t *)"grpc-status", (uint8_t *)code, 11, (size_t)n,
		 NGHTTP2_NV_FLAG_NO_COPY_NAME},
		{(uint8_t *)"grpc-message", (uint8_t *)call->message, 12,
		 call->message ? strlen(call->message) : 0,
		 NGHTTP2_NV_FLAG_NO_COPY_NAME},
	};
	*data_flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
	if (nghttp2_submit_trailer(ng, stream_id, nva, call->message ? 2 : 1))
		*data_flags &= ~(uint32_t)NGHTTP2_DATA_FLAG_NO_END_STREAM;
}

static void on_outq_drain(struct rpc__outq *q)
{
	struct rpc_call *call = MC_CONTAINER_OF(q, struct rpc_call, outq);
	if (!call->done && call->handler_ref && call->m->on_drain) {
		call->refs++;
		call->m->on_drain(call);
		call_unref(call);
	}
}

static const struct rpc__outq_ops call_outq_ops = {
	.on_eof = on_outq_eof,
	.on_drain = on_outq_drain,
};

/* The server ends the call with an error (bad input, deadline, too
 * large): trailers go out after anything already on the wire, unsent
 * messages are dropped, the handler hears on_cancel. */
static void call_abort(struct rpc_call *call, int status, const char *message)
{
	if (call->done)
		return;
	log_debug("%s: call %s from %s ended: %s: %s", call->s->name,
		  call->stats ? call->stats->path : "?", call->peer,
		  rpc_status_name(status), message);
	call_set_done(call, status, message, true);
	inproc_deliver(call);
	if (call_can_submit(call)) {
		if (!call->resp_submitted) {
			rpc__outq_clear(&call->outq);
			submit_trailers_only(call, "200");
		} else {
			rpc__outq_drop_unsent(&call->outq);
			call->outq.eof = true;
			rpc__conn_resume(&call->sc->base, call->stream_id, &call->outq);
		}
	}
	if (call->handler_ref && call->m->on_cancel) {
		call->refs++;
		call->m->on_cancel(call);
		call_unref(call);
	}
}

/* Answer at dispatch, before any handler saw the call. */
static void call_reject(struct rpc_call *call, const char *http_status,
			int status, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static void call_reject(struct rpc_call *call, const char *http_status,
			int status, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	log_debug("%s: rejected call from %s: %s: %s", call->s->name, call->peer,
		  rpc_status_name(status), msg);
	call_set_done(call, status, msg, true);
	if (call_can_submit(call))
		submit_trailers_only(call, http_status);
}

/* The nghttp2 stream is gone (closed, reset, or the connection went). */
static void call_detach(struct rpc_call *call)
{
	struct sconn *sc = call->sc;
	if (!sc)
		return;
	rpc__conn_forget_outq(&sc->base, &call->outq);
	if (call->prev)
		call->prev->next = call->next;
	else
		sc->calls = call->next;
	if (call->next)
		call->next->prev = call->prev;
	call->prev = call->next = NULL;
	sc->ncalls--;
	call->sc = NULL;
	if (sc->ncalls == 0 && sc->s->idle_ms && sc->handshake_done && !sc->base.closing)
		uv_timer_start(&sc->base.timer, on_conn_timer, sc->s->idle_ms, 0);
	if (!call->done) {
		call_set_done(call, RPC_CANCELLED, "cancelled", true);
		if (call->handler_ref && call->m->on_cancel)
			call->m->on_cancel(call);
	}
	call_unref(call);
}

/* ---------------------------------------------------------------- dispatch */

/* Set the call's service and method from its path "/svc/Method", or say
 * why not in why. Errors: -ENOENT. */
static int find_method(struct rpc_call *call, const char *path, char *why, size_t wlen)
{
	const char *slash = path && path[0] == '/' ? strrchr(path, '/') : NULL;
	if (!slash || slash == path) {
		snprintf(why, wlen, "malformed method name \"%s\"", path ? path : "");
		return -ENOENT;
	}
	size_t slen = (size_t)(slash - path - 1);
	const struct svc *svc = call->s->svcs;
	while (svc && !(svc->name_len == slen && memcmp(svc->name, path + 1, slen) == 0))
		svc = svc->next;
	if (!svc) {
		snprintf(why, wlen, "unknown service %.*s", (int)slen, path + 1);
		return -ENOENT;
	}
	size_t i;
	for (i = 0; i < svc->n && strcmp(svc->methods[i].name, slash + 1) != 0; i++)
		;
	if (i == svc->n) {
		snprintf(why, wlen, "unknown method %s for service %s", slash + 1, svc->name);
		return -ENOENT;
	}
	call->svc = svc;
	call->m = &svc->methods[i];
	call->stats = &svc->stats[i];
	return 0;
}

/* Start the call's deadline, if it has one. */
static void call_arm_deadline(struct rpc_call *call)
{
	struct rpc_server *s = call->s;
	if (!call->has_timeout)
		return;
	call->dl.at_ms = uv_now(s->loop) + call->timeout_ms;
	if (rpc__dlheap_add(&s->dl, &call->dl) == 0 && rpc__dlheap_top(&s->dl) == &call->dl)
		rpc__dlheap_arm(&s->dl, &s->dl_timer, on_dl_timer);
}

static void call_dispatch(struct rpc_call *call)
{
	struct rpc_server *s = call->s;
	const char *path = rpc_call_header(call, ":path");

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
	if (s->drain_expired) {
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

/* A request that did not unpack: the method's answer for one nested too
 * deeply, if it has one, else grpc-go's for a message it cannot parse. */
static void call_abort_unparsed(struct rpc_call *call, bool too_deep)
{
	if (too_deep && call->m->too_deep_message)
		call_abort(call, call->m->too_deep_status, call->m->too_deep_message);
	else
		call_abort(call, RPC_INTERNAL, "failed to parse request message");
}

static int call_on_msg(void *ud, const uint8_t *body, size_t len)
{
	struct rpc_call *call = ud;
	bool single = call->m->kind == RPC_UNARY || call->m->kind == RPC_SERVER_STREAMING;
	if (single && call->nreq) {
		call_abort(call, RPC_INTERNAL,
			   "more than one request message for a unary request");
		return -EPROTO;
	}
	struct rpc__arena ar;
	struct rpc__arena *a = single ? &call->req_arena : &ar;
	ProtobufCMessage *msg = rpc__unpack(call->m->request, body, len, &call->s->bufs, a);
	if (!msg) {
		call_abort_unparsed(call, a->too_deep);
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

static void call_half_close(struct rpc_call *call)
{
	if (call->remote_closed)
		return;
	call->remote_closed = true;
	if (!call->dispatched || call->done)
		return;
	if (!rpc_deframer_idle(&call->df)) {
		call_abort(call, RPC_INTERNAL, "request stream ended inside a message");
		return;
	}
	switch (call->m->kind) {
	case RPC_UNARY:
	case RPC_SERVER_STREAMING:
		if (call->nreq != 1) {
			call_abort(call, RPC_INTERNAL, "no request message for a unary request");
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

/* ---------------------------------------------------------------- in-process calls */

/* Servers that listen, for clients on the same loop to find (the list is
 * process-wide; each server is only ever used from its loop's thread). */
static pthread_mutex_t local_mu = PTHREAD_MUTEX_INITIALIZER;
static struct rpc_server *local_head;

static void local_list(struct rpc_server *s, bool on)
{
	pthread_mutex_lock(&local_mu);
	if (on && !s->local_listed) {
		s->local_next = local_head;
		local_head = s;
		s->local_listed = true;
	} else if (!on && s->local_listed) {
		struct rpc_server **pp = &local_head;
		while (*pp != s)
			pp = &(*pp)->local_next;
		*pp = s->local_next;
		s->local_listed = false;
	}
	pthread_mutex_unlock(&local_mu);
}

/* Does a listener bound to l accept connections made to to? Exact
 * address and port, or a wildcard listener and a loopback target. */
static bool addr_reaches(const struct sockaddr_storage *l, const struct sockaddr *to)
{
	if (l->ss_family != to->sa_family)
		return false;
	if (to->sa_family == AF_INET) {
		const struct sockaddr_in *a = (const struct sockaddr_in *)l;
		const struct sockaddr_in *b = (const struct sockaddr_in *)to;
		if (a->sin_port != b->sin_port)
			return false;
		return a->sin_addr.s_addr == b->sin_addr.s_addr ||
		       (a->sin_addr.s_addr == htonl(INADDR_ANY) &&
			(ntohl(b->sin_addr.s_addr) >> 24) == 127);
	}
	if (to->sa_family == AF_INET6) {
		const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)l;
		const struct sockaddr_in6 *b = (const struct sockaddr_in6 *)to;
		if (a->sin6_port != b->sin6_port)
			return false;
		return IN6_ARE_ADDR_EQUAL(&a->sin6_addr, &b->sin6_addr) ||
		       (IN6_IS_ADDR_UNSPECIFIED(&a->sin6_addr) &&
			IN6_IS_ADDR_LOOPBACK(&b->sin6_addr));
	}
	return false;
}

struct rpc_server *rpc__server_local(uv_loop_t *loop, const struct sockaddr *to)
{
	struct rpc_server *found = NULL;
	pthread_mutex_lock(&local_mu);
	for (struct rpc_server *s = local_head; s && !found; s = s->local_next) {
		if (s->loop != loop || s->shutting_down)
			continue;
		for (unsigned i = 0; i < s->nlisteners; i++)
			if (addr_reaches(&s->listeners[i]->addr, to)) {
				found = s;
				break;
			}
	}
	pthread_mutex_unlock(&local_mu);
	return found;
}

static void icall_unlink(struct rpc_call *call)
{
	struct rpc_server *s = call->s;
	if (call->prev)
		call->prev->next = call->next;
	else
		s->icalls = call->next;
	if (call->next)
		call->next->prev = call->prev;
	call->prev = call->next = NULL;
	call->ist = NULL;
}

/* The call's final status is decided: hand it and the response to the
 * client, and drop the client's reference. */
static void inproc_deliver(struct rpc_call *call)
{
	struct rpc_stream *st = call->ist;
	if (!st)
		return;
	icall_unlink(call);
	const uint8_t *body = NULL;
	size_t len = 0;
	if (call->status == RPC_OK && call->outq.head) {
		body = call->outq.head->data + 5;
		len = call->outq.head->len - 5;
	}
	char msg[512] = "";
	if (call->message)
		rpc_percent_decode(call->message, msg, sizeof(msg));
	call->refs++;
	rpc__client_inproc_done(st, call->status, msg, body, len);
	call_unref(call); /* the client's */
	call_unref(call);
}

/* Run the calls handed over since the last turn, as call_dispatch and
 * call_half_close do for a network call. */
static void on_inproc_idle(uv_idle_t *h)
{
	struct rpc_server *s = MC_CONTAINER_OF(h, struct rpc_server, idle);
	struct rpc_call *q = s->iq_head;
	s->iq_head = s->iq_tail = NULL;
	uv_idle_stop(h);
	while (q) {
		struct rpc_call *call = q;
		q = call->iq_next;
		call->iq_next = NULL;
		struct rpc__omsg *req = call->ireq;
		call->ireq = NULL;
		if (call->done || !call->ist) {
			/* cancelled before its turn */
		} else if (!call->m) {
			char why[256];
			snprintf(why, sizeof(why), "%s", call->message ? call->message : "");
			call_abort(call, RPC_UNIMPLEMENTED, why);
		} else if (s->drain_expired) {
			call_abort(call, RPC_UNAVAILABLE, "server shutting down");
		} else if (req->len - 5 > s->max_recv) {
			char msg[128];
			snprintf(msg, sizeof(msg),
				 "grpc: received message larger than max (%zu vs. %zu)",
				 req->len - 5, s->max_recv);
			call_abort(call, RPC_RESOURCE_EXHAUSTED, msg);
		} else {
			ProtobufCMessage *m = rpc__unpack(call->m->request, req->data + 5,
							  req->len - 5, &s->bufs, &call->req_arena);
			if (!m) {
				call_abort_unparsed(call, call->req_arena.too_deep);
			} else {
				call->dispatched = true;
				call->nreq = 1;
				call->remote_closed = true;
				call_arm_deadline(call);
				call->handler_ref = true;
				call->refs++;
				call->m->on_message(call, m);
				rpc__unpacked_free(m, &call->req_arena);
			}
		}
		rpc__omsg_unref(req);
		call_unref(call); /* the queue's */
	}
}

int rpc__server_inproc_start(struct rpc_server *s, const char *path, struct rpc__omsg *req,
			     uint64_t timeout_ms, struct rpc_stream *st,
			     struct rpc_call **out)
{
	if (s->shutting_down || !s->timers_ready)
		return -ECANCELED;
	struct rpc_call *call = call_alloc(s);
	if (!call)
		return -ENOMEM;
	call->inproc = true;
	call->ist = st;
	call->post = call->ct_ok = true;
	snprintf(call->peer, sizeof(call->peer), "in-process");
	char why[256];
	int rc = 0;
	if (find_method(call, path, why, sizeof(why))) {
		/* Answered UNIMPLEMENTED on its turn, like a network call. */
		call->message = strdup(why);
		if (!call->message)
			rc = -ENOMEM;
	} else if (call->m->kind != RPC_UNARY) {
		rc = -EOPNOTSUPP; /* streaming handlers: over a connection */
	}
	if (rc) {
		call->inproc = false;
		call->ist = NULL;
		call_unref(call);
		return rc;
	}
	call->has_timeout = timeout_ms > 0;
	call->timeout_ms = timeout_ms;
	req->refs++;
	call->ireq = req;
	call->next = s->icalls;
	if (s->icalls)
		s->icalls->prev = call;
	s->icalls = call;
	call->refs++; /* the dispatch queue's */
	if (s->iq_tail)
		s->iq_tail->iq_next = call;
	else
		s->iq_head = call;
	s->iq_tail = call;
	uv_idle_start(&s->idle, on_inproc_idle);
	*out = call;
	return 0;
}

void rpc__server_inproc_cancel(struct rpc_call *call)
{
	if (!call->ist)
		return;
	icall_unlink(call);
	rpc__omsg_unref(call->ireq); /* the client's buffer: not past its stream */
	call->ireq = NULL;
	call->refs++;
	if (!call->done) {
		call_set_done(call, RPC_CANCELLED, "cancelled", true);
		if (call->handler_ref && call->m->on_cancel)
			call->m->on_cancel(call);
	}
	call_unref(call); /* the client's */
	call_unref(call);
}

/* ---------------------------------------------------------------- nghttp2 callbacks */

static struct sconn *to_sconn(void *user_data)
{
	return MC_CONTAINER_OF((struct rpc__conn *)user_data, struct sconn, base);
}

static int on_begin_headers(nghttp2_session *ng, const nghttp2_frame *frame,
			    void *user_data)
{
	struct sconn *sc = to_sconn(user_data);
	if (sc->base.closing || frame->hd.type != NGHTTP2_HEADERS ||
	    frame->headers.cat != NGHTTP2_HCAT_REQUEST)
		return 0;
	struct rpc_call *call = call_new(sc, frame->hd.stream_id);
	if (!call)
		return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
	if (sc->ncalls == 1 && sc->s->idle_ms)
		uv_timer_stop(&sc->base.timer);
	nghttp2_session_set_stream_user_data(ng, frame->hd.stream_id, call);
	return 0;
}

static void conn_final_goaway(struct sconn *sc)
{
	sc->drain_stage = 2;
	nghttp2_submit_goaway(sc->base.ng, NGHTTP2_FLAG_NONE,
			      nghttp2_session_get_last_proc_stream_id(sc->base.ng),
			      NGHTTP2_NO_ERROR, NULL, 0);
	rpc__conn_want_flush(&sc->base);
}

static int on_frame_recv(nghttp2_session *ng, const nghttp2_frame *frame,
			 void *user_data)
{
	struct sconn *sc = to_sconn(user_data);
	struct rpc_call *call;

	if (sc->base.closing)
		return 0;
	switch (frame->hd.type) {
	case NGHTTP2_HEADERS:
		call = nghttp2_session_get_stream_user_data(ng, frame->hd.stream_id);
		if (!call)
			return 0;
		if (call->bad_headers)
			return 0;
		if (frame->headers.cat == NGHTTP2_HCAT_REQUEST &&
		    (call->pseudo & (PSEUDO_METHOD | PSEUDO_SCHEME | PSEUDO_PATH)) !=
			    (PSEUDO_METHOD | PSEUDO_SCHEME | PSEUDO_PATH)) {
			/* a request lacks :method, :scheme or :path */
			reject_headers(ng, call);
			return 0;
		}
		call->refs++;
		if (frame->headers.cat == NGHTTP2_HCAT_REQUEST)
			call_dispatch(call);
		if (frame->hd.flags & NGHTTP2_FLAG_END_STREAM)
			call_half_close(call);
		call_unref(call);
		break;
	case NGHTTP2_DATA:
		if (!(frame->hd.flags & NGHTTP2_FLAG_END_STREAM))
			break;
		call = nghttp2_session_get_stream_user_data(ng, frame->hd.stream_id);
		if (call) {
			call->refs++;
			call_half_close(call);
			call_unref(call);
		}
		break;
	case NGHTTP2_SETTINGS:
		if (!sc->handshake_done && !(frame->hd.flags & NGHTTP2_FLAG_ACK)) {
			sc->handshake_done = true;
			uv_timer_stop(&sc->base.timer);
			if (sc->s->idle_ms && sc->ncalls == 0)
				uv_timer_start(&sc->base.timer, on_conn_timer,
					       sc->s->idle_ms, 0);
		}
		break;
	case NGHTTP2_PING:
		if ((frame->hd.flags & NGHTTP2_FLAG_ACK) && sc->drain_stage == 1)
			conn_final_goaway(sc);
		break;
	default:
		break;
	}
	return 0;
}

static int on_data_chunk(nghttp2_session *ng, uint8_t flags, int32_t stream_id,
			 const uint8_t *data, size_t len, void *user_data)
{
	struct sconn *sc = to_sconn(user_data);
	if (sc->base.closing)
		return 0;
	struct rpc_call *call = nghttp2_session_get_stream_user_data(ng, stream_id);
	if (!call || !call->dispatched || call->done)
		return 0;
	call->refs++;
	int rc = rpc_deframer_feed(&call->df, data, len, call_on_msg, call);
	if (rc == MC_ETOO_LARGE) {
		char msg[128];
		snprintf(msg, sizeof(msg),
			 "grpc: received message larger than max (%zu vs. %zu)",
			 call->df.msg_len, call->df.max_message_bytes);
		call_abort(call, RPC_RESOURCE_EXHAUSTED, msg);
	} else if (rc == -EPROTO && !call->done) {
		call_abort(call, RPC_INTERNAL,
			   "compressed message but no grpc-encoding was negotiated");
	} else if (rc == -ENOMEM) {
		call_abort(call, RPC_RESOURCE_EXHAUSTED, "out of memory");
	}
	call_unref(call);
	return 0;
}

static int on_frame_send(nghttp2_session *ng, const nghttp2_frame *frame,
			 void *user_data)
{
	/* Our side ended while the client still sends (an early error): tell
	 * it to stop, as gRPC servers do. */
	if ((frame->hd.type == NGHTTP2_HEADERS || frame->hd.type == NGHTTP2_DATA) &&
	    (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) &&
	    nghttp2_session_get_stream_remote_close(ng, frame->hd.stream_id) == 0)
		nghttp2_submit_rst_stream(ng, NGHTTP2_FLAG_NONE, frame->hd.stream_id,
					  NGHTTP2_NO_ERROR);
	return 0;
}

static int on_stream_close(nghttp2_session *ng, int32_t stream_id,
			   uint32_t error_code, void *user_data)
{
	struct sconn *sc = to_sconn(user_data);
	if (sc->base.closing)
		return 0;
	struct rpc_call *call = nghttp2_session_get_stream_user_data(ng, stream_id);
	if (call) {
		nghttp2_session_set_stream_user_data(ng, stream_id, NULL);
		call_detach(call);
	}
	return 0;
}

/* ---------------------------------------------------------------- connections */

static void on_conn_closed(struct rpc__conn *c)
{
	struct sconn *sc = MC_CONTAINER_OF(c, struct sconn, base);
	struct rpc_server *s = sc->s;

	while (sc->calls)
		call_detach(sc->calls);
	rpc__conn_release(c);
	if (sc->prev)
		sc->prev->next = sc->next;
	else
		s->conns = sc->next;
	if (sc->next)
		sc->next->prev = sc->prev;
	s->nconns--;
	metric_sub(s->m_conns, 1);
	free(sc);
	server_check_done(s);
}

static void on_conn_proto_error(struct rpc__conn *c)
{
	struct sconn *sc = MC_CONTAINER_OF(c, struct sconn, base);
	metric_inc(sc->s->m_proto);
}

static const struct rpc__conn_ops sconn_ops = {
	.on_closed = on_conn_closed,
	.on_proto_error = on_conn_proto_error,
};

static void on_conn_timer(uv_timer_t *t)
{
	struct sconn *sc = MC_CONTAINER_OF(t, struct sconn, base.timer);
	if (!sc->handshake_done) {
		log_info("%s: %s sent no HTTP/2 preface within %llu ms, closing",
			 sc->s->name, sc->base.peer,
			 (unsigned long long)sc->s->handshake_ms);
		metric_inc(sc->s->m_proto);
		rpc__conn_close(&sc->base);
		return;
	}
	if (sc->ncalls == 0) {
		log_debug("%s: closing idle connection from %s", sc->s->name,
			  sc->base.peer);
		nghttp2_submit_goaway(sc->base.ng, NGHTTP2_FLAG_NONE,
				      nghttp2_session_get_last_proc_stream_id(sc->base.ng),
				      NGHTTP2_NO_ERROR, (const uint8_t *)"idle", 4);
		rpc__conn_close_after_flush(&sc->base);
	}
}

static void conn_begin_drain(struct sconn *sc)
{
	if (sc->base.closing || sc->drain_stage)
		return;
	if (!sc->handshake_done || !sc->base.ng) {
		rpc__conn_close(&sc->base);
		return;
	}
	if (sc->ncalls == 0) {
		/* Nothing in flight: the final GOAWAY at once, without
		 * waiting for a PING ACK that an idle client may not read
		 * for seconds. A request the client sends meanwhile has a
		 * higher stream id than the GOAWAY names, so the client
		 * knows it was not processed and may retry it elsewhere
		 * (RFC 9113 section 6.8). */
		conn_final_goaway(sc);
		rpc__conn_close_after_flush(&sc->base);
		return;
	}
	sc->drain_stage = 1;
	nghttp2_submit_shutdown_notice(sc->base.ng);
	nghttp2_submit_ping(sc->base.ng, NGHTTP2_FLAG_NONE, NULL);
	rpc__conn_want_flush(&sc->base);
}

static void on_connection(uv_stream_t *ls, int status)
{
	struct listener *l = MC_CONTAINER_OF((uv_tcp_t *)ls, struct listener, tcp);
	struct rpc_server *s = l->s;

	if (status < 0) {
		log_warn("%s: accept failed: %s", s->name, uv_strerror(status));
		return;
	}
	struct sconn *sc = calloc(1, sizeof(*sc));
	if (!sc) {
		log_warn("%s: out of memory accepting a connection", s->name);
		return;
	}
	if (rpc__conn_init(&sc->base, s->loop, &sconn_ops, s->name, s->rbuf)) {
		free(sc);
		return;
	}
	sc->s = s;
	sc->next = s->conns;
	if (s->conns)
		s->conns->prev = sc;
	s->conns = sc;
	s->nconns++;
	metric_add(s->m_conns, 1);
	int rc = uv_accept(ls, (uv_stream_t *)&sc->base.tcp);
	if (rc < 0) {
		log_warn("%s: accept failed: %s", s->name, uv_strerror(rc));
		rpc__conn_close(&sc->base);
		return;
	}
	nghttp2_settings_entry iv[] = {
		{NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, s->max_streams},
		{NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, RPC__STREAM_WINDOW_BYTES},
		{NGHTTP2_SETTINGS_MAX_FRAME_SIZE, RPC__MAX_FRAME_BYTES},
		{NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, RPC__MAX_HEADER_LIST_BYTES},
	};
	rc = rpc__conn_start(&sc->base, true, s->cbs, s->ngopt, iv, MC_ARRAY_LEN(iv));
	if (rc < 0) {
		log_warn("%s: cannot start connection from %s: %s", s->name,
			 sc->base.peer, mc_strerror(rc));
		rpc__conn_close(&sc->base);
		return;
	}
	log_debug("%s: connection from %s", s->name, sc->base.peer);
	uv_timer_start(&sc->base.timer, on_conn_timer, s->handshake_ms, 0);
}

/* ---------------------------------------------------------------- deadlines */

static void on_dl_timer(uv_timer_t *t)
{
	struct rpc_server *s = MC_CONTAINER_OF(t, struct rpc_server, dl_timer);
	uint64_t now = uv_now(s->loop);
	struct rpc__dl *d;

	while ((d = rpc__dlheap_top(&s->dl)) && d->at_ms <= now) {
		struct rpc_call *call = MC_CONTAINER_OF(d, struct rpc_call, dl);
		rpc__dlheap_del(&s->dl, d);
		call->refs++;
		call_abort(call, RPC_DEADLINE_EXCEEDED, "deadline exceeded");
		call_unref(call);
	}
	rpc__dlheap_arm(&s->dl, &s->dl_timer, on_dl_timer);
}

/* ---------------------------------------------------------------- public API */

static int server_init_timers(struct rpc_server *s)
{
	if (s->timers_ready)
		return 0;
	uv_timer_init(s->loop, &s->dl_timer);
	uv_timer_init(s->loop, &s->drain_timer);
	uv_idle_init(s->loop, &s->idle);
	s->timers_ready = true;
	s->timers_open = 3;
	return 0;
}

int rpc_server_new(uv_loop_t *loop, const struct rpc_server_opts *opts,
		   struct rpc_server **out)
{
	struct rpc_server *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->loop = loop;
	s->name = strdup(opts && opts->name ? opts->name : "rpc");
	s->max_msg = opts && opts->max_message_bytes ? opts->max_message_bytes
						      : RPC__DEFAULT_MAX_MESSAGE_BYTES;
	s->max_recv = s->max_msg;
	s->max_streams = opts && opts->max_concurrent_streams ? opts->max_concurrent_streams : 1024;
	s->handshake_ms = opts && opts->handshake_timeout_ms ? opts->handshake_timeout_ms : 10000;
	s->idle_ms = opts ? opts->idle_timeout_ms : 0;
	s->reg = opts && opts->metrics ? opts->metrics : metrics_global();
	s->rbuf = malloc(RPC__READ_BUF_BYTES);
	if (!s->name || !s->rbuf || nghttp2_session_callbacks_new(&s->cbs) ||
	    nghttp2_option_new(&s->ngopt))
		goto err_free;
	/* gRPC clients send what nghttp2's HTTP checks refuse: grpc-go (in
	 * etcdctl) puts a whole URL such as "http://127.0.0.1:2379" in
	 * :authority. Like grpc-go's server, accept it: the header rules are
	 * checked in check_header and on_frame_recv instead, and what a gRPC
	 * request needs (POST, content-type, :path) in call_dispatch. */
	nghttp2_option_set_no_http_messaging(s->ngopt, 1);
	rpc__callbacks_init(s->cbs);
	nghttp2_session_callbacks_set_on_begin_headers_callback(s->cbs, on_begin_headers);
	nghttp2_session_callbacks_set_on_header_callback(s->cbs, on_header);
	nghttp2_session_callbacks_set_on_frame_recv_callback(s->cbs, on_frame_recv);
	nghttp2_session_callbacks_set_on_data_chunk_recv_callback(s->cbs, on_data_chunk);
	nghttp2_session_callbacks_set_on_frame_send_callback(s->cbs, on_frame_send);
	nghttp2_session_callbacks_set_on_stream_close_callback(s->cbs, on_stream_close);
	if (mstats_init(s, &s->unknown, "unknown", "", false, false))
		goto err_free;
	s->m_conns = metrics_gauge(s->reg, "mooncake_rpc_server_connections",
				   "Open client connections.", "server",
				   (const char *[]){s->name});
	s->m_proto = metrics_counter(s->reg, "mooncake_rpc_server_protocol_errors_total",
				     "Connections or streams ended by a protocol "
				     "error (bad preface, bad frames, handshake timeout).",
				     "server", (const char *[]){s->name});
	*out = s;
	return 0;

err_free:
	free(s->unknown.path);
	if (s->cbs)
		nghttp2_session_callbacks_del(s->cbs);
	if (s->ngopt)
		nghttp2_option_del(s->ngopt);
	free(s->rbuf);
	free(s->name);
	free(s);
	return -ENOMEM;
}

int rpc_server_add_service(struct rpc_server *s, const char *service,
			   const struct rpc_method *methods, size_t nmethods,
			   void *data)
{
	for (struct svc *v = s->svcs; v; v = v->next)
		if (strcmp(v->name, service) == 0)
			return -EEXIST;
	for (size_t i = 0; i < nmethods; i++) {
		const struct rpc_method *m = &methods[i];
		if (!m->name || !m->request || !m->response || !m->on_message)
			return -EINVAL;
		if ((m->kind == RPC_CLIENT_STREAMING || m->kind == RPC_BIDI_STREAMING) &&
		    !m->on_start)
			return -EINVAL;
	}
	struct svc *v = calloc(1, sizeof(*v));
	if (!v)
		return -ENOMEM;
	v->name = strdup(service);
	v->name_len = strlen(service);
	v->methods = methods;
	v->n = nmethods;
	v->data = data;
	v->stats = calloc(nmethods ? nmethods : 1, sizeof(*v->stats));
	if (!v->name || !v->stats)
		goto err;
	for (size_t i = 0; i < nmethods; i++)
		if (mstats_init(s, &v->stats[i], service, methods[i].name,
				methods[i].long_poll, methods[i].kind != RPC_UNARY))
			goto err;
	v->next = s->svcs;
	s->svcs = v;
	return 0;
err:
	if (v->stats)
		for (size_t i = 0; i < nmethods; i++)
			free(v->stats[i].path);
	free(v->stats);
	free(v->name);
	free(v);
	return -ENOMEM;
}

static void on_listener_closed(uv_handle_t *h)
{
	struct listener *l = MC_CONTAINER_OF((uv_tcp_t *)h, struct listener, tcp);
	struct rpc_server *s = l->s;
	s->listeners_open--;
	server_check_done(s);
}

static void on_failed_listener_closed(uv_handle_t *h)
{
	free(MC_CONTAINER_OF((uv_tcp_t *)h, struct listener, tcp));
}

int rpc_server_listen(struct rpc_server *s, const char *hostport)
{
	struct sockaddr_storage ss;
	int rc;

	if (s->shutting_down)
		return -EINVAL;
	if (mc_parse_hostport(hostport, &ss))
		return -EINVAL;
	struct listener **ls = realloc(s->listeners, (s->nlisteners + 1) * sizeof(*ls));
	if (!ls)
		return -ENOMEM;
	s->listeners = ls;
	struct listener *l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	l->s = s;
	server_init_timers(s);
	rc = uv_tcp_init(s->loop, &l->tcp);
	if (rc < 0) {
		free(l);
		return rc;
	}
	rc = uv_tcp_bind(&l->tcp, (const struct sockaddr *)&ss, 0);
	if (rc == 0)
		rc = uv_listen((uv_stream_t *)&l->tcp, 511, on_connection);
	if (rc < 0) {
		log_error("%s: cannot listen on %s: %s", s->name, hostport, uv_strerror(rc));
		uv_close((uv_handle_t *)&l->tcp, on_failed_listener_closed);
		return rc;
	}
	int len = sizeof(ss);
	if (uv_tcp_getsockname(&l->tcp, (struct sockaddr *)&ss, &len) == 0)
		l->port = ntohs(ss.ss_family == AF_INET6
					? ((struct sockaddr_in6 *)&ss)->sin6_port
					: ((struct sockaddr_in *)&ss)->sin_port);
	l->addr = ss;
	s->listeners[s->nlisteners++] = l;
	s->listeners_open++;
	local_list(s, true);
	char addr[80];
	mc_format_addr((struct sockaddr *)&ss, addr, sizeof(addr));
	log_info("%s: listening on %s", s->name, addr);
	return 0;
}

void rpc_server_set_max_recv_bytes(struct rpc_server *s, size_t bytes)
{
	s->max_recv = bytes ? bytes : s->max_msg;
}

int rpc_server_port(const struct rpc_server *s, unsigned i)
{
	return i < s->nlisteners ? s->listeners[i]->port : 0;
}

static void on_timer_closed(uv_handle_t *h)
{
	struct rpc_server *s = h->data;
	if (--s->timers_open == 0) {
		s->done = true;
		log_info("%s: shutdown complete", s->name);
		if (s->on_done)
			s->on_done(s, s->done_ud);
	}
}

static void server_check_done(struct rpc_server *s)
{
	if (!s->shutting_down || s->finalizing)
		return;
	if (s->nconns || s->listeners_open || s->live_calls)
		return;
	s->finalizing = true;
	s->dl_timer.data = s;
	s->drain_timer.data = s;
	s->idle.data = s;
	uv_close((uv_handle_t *)&s->dl_timer, on_timer_closed);
	uv_close((uv_handle_t *)&s->drain_timer, on_timer_closed);
	uv_close((uv_handle_t *)&s->idle, on_timer_closed);
}

static void on_drain_timeout(uv_timer_t *t)
{
	struct rpc_server *s = MC_CONTAINER_OF(t, struct rpc_server, drain_timer);
	s->drain_expired = true;
	while (s->icalls) {
		struct rpc_call *call = s->icalls;
		call->refs++;
		call_abort(call, RPC_UNAVAILABLE, "server shutting down");
		call_unref(call);
	}
	if (s->nconns)
		log_info("%s: drain timeout: cancelling %u calls on %u connections",
			 s->name, s->live_calls, s->nconns);
	for (struct sconn *sc = s->conns; sc; sc = sc->next) {
		if (sc->base.closing)
			continue;
		if (sc->base.ng) {
			nghttp2_session_terminate_session(sc->base.ng, NGHTTP2_NO_ERROR);
			rpc__conn_flush(&sc->base);
		}
		rpc__conn_close(&sc->base);
	}
}

void rpc_server_shutdown(struct rpc_server *s, uint64_t drain_timeout_ms,
			 void (*on_done)(struct rpc_server *s, void *ud), void *ud)
{
	if (s->shutting_down)
		return;
	s->shutting_down = true;
	local_list(s, false);
	s->on_done = on_done;
	s->done_ud = ud;
	server_init_timers(s);
	log_info("%s: shutting down: %u calls on %u connections, drain up to %llu ms",
		 s->name, s->live_calls, s->nconns, (unsigned long long)drain_timeout_ms);
	if (s->health)
		rpc__health_shutdown(s->health);
	for (unsigned i = 0; i < s->nlisteners; i++)
		uv_close((uv_handle_t *)&s->listeners[i]->tcp, on_listener_closed);
	for (struct sconn *sc = s->conns; sc; sc = sc->next)
		conn_begin_drain(sc);
	uv_timer_start(&s->drain_timer, on_drain_timeout, drain_timeout_ms, 0);
	server_check_done(s);
}

void rpc_server_free(struct rpc_server *s)
{
	if (!s)
		return;
	if ((s->timers_ready && !s->done) || s->nconns || s->live_calls) {
		log_error("%s: rpc_server_free before shutdown completed; leaking it",
			  s->name);
		return;
	}
	local_list(s, false);
	if (s->health)
		rpc__health_free(s->health);
	while (s->svcs) {
		struct svc *v = s->svcs;
		s->svcs = v->next;
		for (size_t i = 0; i < v->n; i++)
			free(v->stats[i].path);
		free(v->stats);
		free(v->name);
		free(v);
	}
	for (unsigned i = 0; i < s->nlisteners; i++)
		free(s->listeners[i]);
	free(s->listeners);
	while (s->free_calls) {
		struct rpc_call *call = s->free_calls;
		s->free_calls = call->next;
		mc_buf_free(&call->hdrs);
		free(call);
	}
	rpc__dlheap_free(&s->dl);
	rpc__bufcache_free(&s->bufs);
	nghttp2_session_callbacks_del(s->cbs);
	nghttp2_option_del(s->ngopt);
	free(s->unknown.path);
	free(s->rbuf);
	free(s->name);
	free(s);
}

int rpc__server_set_health(struct rpc_server *s, struct rpc_health *h)
{
	if (s->health)
		return -EEXIST;
	s->health = h;
	return 0;
}

/* ---------------------------------------------------------------- handler API */

int rpc_call_send(struct rpc_call *call, const ProtobufCMessage *msg)
{
	if (call->done || !call->handler_ref)
		return -ECANCELED;
	if ((call->m->kind == RPC_UNARY || call->m->kind == RPC_CLIENT_STREAMING) &&
	    call->nsent)
		return -EINVAL;
	if (!call_can_submit(call) && !(call->inproc && call->ist))
		return -ECANCELED;
	struct rpc__omsg *m;
	int rc = rpc__omsg_pack(msg, call->s->max_msg, &call->s->bufs, &m);
	if (rc)
		return rc;
	rpc__outq_push(&call->outq, m);
	call->nsent++;
	if (call->inproc)
		return 0; /* handed over whole by rpc_call_finish */
	if (!call->resp_submitted) {
		rc = submit_response(call);
		if (rc) {
			rpc__outq_clear(&call->outq);
			call->nsent--;
			return rc;
		}
		return 0;
	}
	rpc__conn_resume(&call->sc->base, call->stream_id, &call->outq);
	return 0;
}

void rpc_call_finish(struct rpc_call *call, int status, const char *message)
{
	if (!call->handler_ref) {
		log_error("%s: rpc_call_finish on a call the handler does not hold",
			  call->s->name);
		return;
	}
	call->handler_ref = false;
	if (!call->done) {
		call_set_done(call, status, message, false);
		inproc_deliver(call);
		call_queue_status(call);
	}
	call_unref(call);
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
	return call->svc ? call->svc->data : NULL;
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
	return call->s->loop;
}
