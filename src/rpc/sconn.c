/*
 * sconn: the server's HTTP/2 connections and the calls on their streams
 * (server_int.h).
 *
 * A connection accepted from a listener must send its HTTP/2 preface
 * within handshake_timeout_ms; one without a call for idle_timeout_ms
 * gets a GOAWAY and closes. A request stream becomes a call when its
 * HEADERS begin; each header is checked against HTTP/2's rules here
 * (RFC 9113 8.3: an unknown, repeated or late pseudo-header, an invalid
 * name or value resets the stream) and handed to the call, which reads
 * what gRPC means by it. The header block's end dispatches the call, DATA
 * feeds it, END_STREAM half-closes it, the stream's close detaches it.
 *
 * Responses: a call's first message submits the response HEADERS with a
 * data provider over the call's outq; the final status marks the queue's
 * end, and the data provider submits the trailers (grpc-status,
 * grpc-message) when the last byte is out. A final status with nothing
 * sent is a trailers-only response.
 *
 * Draining follows the gRPC graceful pattern: a GOAWAY "shutdown notice"
 * (last stream id 2^31-1) and a PING on every connection; on the PING's
 * ACK the real GOAWAY with the last stream id processed, so a request in
 * flight during the notice is not lost (a connection with no call in
 * flight gets the final GOAWAY at once). Connections close when their
 * last call ends, or when the server's drain time is over.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/metrics.h"
#include "common/util.h"
#include "rpc/server_int.h"

#define LOG_SUBSYS LOGS_RPC

struct sconn {
	struct rpc__conn base;
	struct rpc__sconns *cs;
	struct sconn *prev, *next;
	struct rpc_call *calls; /* linked by h2.prev/next */
	unsigned ncalls;
	bool handshake_done;
	bool told_big_headers; /* logged once a connection */
	bool costed;           /* SCONN_COST counts in the server's bound */
	bool proven;           /* a call proved the cluster secret (auth.c) */
	size_t held;           /* what its calls hold of the server's bound (call.c) */
	int drain_stage;       /* 0: serving, 1: notice + PING sent, 2: GOAWAY sent */
	/* The last stream looked up and its call (NULL: none): nghttp2's
	 * callbacks ask for a stream's call once per header and frame, a
	 * dozen times a call, each a lookup in nghttp2's stream map. */
	int32_t memo_id;
	struct rpc_call *memo_call;
};

/* What a connection costs in the bound on what calls hold, besides its
 * calls: its struct and nghttp2's session (HPACK tables, buffers). */
#define SCONN_COST (sizeof(struct sconn) + (64u << 10))

static const struct rpc__conn_ops sconn_ops;
static const struct rpc__call_tp h2_tp;
static void on_conn_timer(uv_timer_t *t);

static const char *sc_name(const struct sconn *sc)
{
	return rpc__server_name(sc->cs->s);
}

/* ---------------------------------------------------------------- responses */

static bool h2_can_send(const struct rpc_call *call)
{
	const struct sconn *sc = call->h2.sc;
	return sc && !sc->base.closing && sc->base.ng;
}

/* The grpc-status value for call's status, and its message. The standard
 * codes come from a table, as this runs once per call; any other value a
 * handler set is formatted into buf. */
static const char *status_value(const struct rpc_call *call, const char **message,
				char buf[12], size_t *len)
{
	static const char *const codes[RPC__NCODES] = {
		"0", "1",  "2",  "3",  "4",  "5",  "6",  "7",  "8",
		"9", "10", "11", "12", "13", "14", "15", "16",
	};
	int status = rpc__call_status(call, message);
	if (status >= 0 && status < RPC__NCODES) {
		*len = status < 10 ? 1 : 2;
		return codes[status];
	}
	int n = snprintf(buf, 12, "%d", status);
	*len = (size_t)n;
	return buf;
}

static void submit_trailers_only(struct rpc_call *call, const char *http_status)
{
	struct rpc__conn *c = &call->h2.sc->base;
	const char *message;
	char buf[12];
	size_t n;
	const char *code = status_value(call, &message, buf, &n);
	nghttp2_nv nva[] = {
		RPC__NVS(":status", http_status, strlen(http_status)),
		RPC__NV("content-type", "application/grpc"),
		RPC__NVS("grpc-status", code, n),
		RPC__NVS("grpc-message", message, message ? strlen(message) : 0),
	};
	size_t nnv = message ? 4 : 3;
	call->h2.resp_submitted = true;
	if (nghttp2_submit_response(c->ng, call->h2.stream_id, nva, nnv, NULL))
		nghttp2_submit_rst_stream(c->ng, NGHTTP2_FLAG_NONE, call->h2.stream_id,
					  NGHTTP2_INTERNAL_ERROR);
	rpc__conn_want_flush(c);
}

static int submit_response(struct rpc_call *call)
{
	struct rpc__conn *c = &call->h2.sc->base;
	nghttp2_nv nva[] = {
		RPC__NV(":status", "200"),
		RPC__NV("content-type", "application/grpc"),
		RPC__NV("grpc-accept-encoding", "identity"),
	};
	nghttp2_data_provider prd = {.source.ptr = &call->outq,
				     .read_callback = rpc__outq_read_cb};
	if (nghttp2_submit_response(c->ng, call->h2.stream_id, nva, 3, &prd))
		return -ENOMEM;
	call->h2.resp_submitted = true;
	rpc__conn_want_flush(c);
	return 0;
}

static int h2_on_send(struct rpc_call *call)
{
	if (!call->h2.resp_submitted)
		return submit_response(call);
	rpc__conn_resume(&call->h2.sc->base, call->h2.stream_id, &call->outq);
	return 0;
}

/* The final status goes after whatever is queued (aborted: after what
 * nghttp2 was promised; the rest is dropped). */
static void h2_on_done(struct rpc_call *call, bool aborted)
{
	struct rpc__h2call *h = &call->h2;
	if (!h2_can_send(call))
		return;
	if (aborted) {
		if (!h->resp_submitted) {
			rpc__outq_clear(&call->outq);
			submit_trailers_only(call, "200");
		} else {
			rpc__outq_drop_unsent(&call->outq);
			call->outq.eof = true;
			rpc__conn_resume(&h->sc->base, h->stream_id, &call->outq);
		}
		return;
	}
	if (!h->resp_submitted && call->outq.bytes == 0) {
		submit_trailers_only(call, "200");
		return;
	}
	call->outq.eof = true;
	if (!h->resp_submitted) {
		if (submit_response(call))
			nghttp2_submit_rst_stream(h->sc->base.ng, NGHTTP2_FLAG_NONE,
						  h->stream_id, NGHTTP2_INTERNAL_ERROR);
		return;
	}
	rpc__conn_resume(&h->sc->base, h->stream_id, &call->outq);
}

static void on_outq_eof(struct rpc__outq *q, nghttp2_session *ng, int32_t stream_id,
			uint32_t *data_flags)
{
	struct rpc_call *call = MC_CONTAINER_OF(q, struct rpc_call, outq);
	const char *message;
	char buf[12];
	size_t n;
	const char *code = status_value(call, &message, buf, &n);
	nghttp2_nv nva[] = {
		RPC__NVS("grpc-status", code, n),
		RPC__NVS("grpc-message", message, message ? strlen(message) : 0),
	};
	*data_flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
	if (nghttp2_submit_trailer(ng, stream_id, nva, message ? 2 : 1))
		*data_flags &= ~(uint32_t)NGHTTP2_DATA_FLAG_NO_END_STREAM;
}

static void on_outq_drain(struct rpc__outq *q)
{
	rpc__call_drained(MC_CONTAINER_OF(q, struct rpc_call, outq));
}

static const struct rpc__outq_ops call_outq_ops = {
	.on_eof = on_outq_eof,
	.on_drain = on_outq_drain,
};

static bool *h2_proven(struct rpc_call *call)
{
	return call->h2.sc ? &call->h2.sc->proven : NULL;
}

static const struct rpc__call_tp h2_tp = {
	.outq_ops = &call_outq_ops,
	.can_send = h2_can_send,
	.on_send = h2_on_send,
	.on_done = h2_on_done,
	.on_reject = submit_trailers_only,
	.proven = h2_proven,
};

/* ---------------------------------------------------------------- streams */

/* The call of stream_id (nghttp2's stream user data), or NULL. */
static struct rpc_call *call_of(struct sconn *sc, int32_t stream_id)
{
	if (stream_id != sc->memo_id) {
		sc->memo_id = stream_id;
		sc->memo_call = nghttp2_session_get_stream_user_data(sc->base.ng, stream_id);
	}
	return sc->memo_call;
}

/* Attach call to stream_id in nghttp2 (NULL: detach). */
static void set_call(struct sconn *sc, int32_t stream_id, struct rpc_call *call)
{
	nghttp2_session_set_stream_user_data(sc->base.ng, stream_id, call);
	sc->memo_id = stream_id;
	sc->memo_call = call;
}

/* NULL when out of memory, or (*full) past the bound on what calls hold. */
static struct rpc_call *stream_new(struct sconn *sc, int32_t stream_id, bool *full)
{
	struct rpc_call *call = rpc__call_new(sc->cs->s, &h2_tp, sc->base.peer);
	if (!call)
		return NULL;
	if (!rpc__call_join(call, &sc->held)) {
		rpc__call_unref(call);
		*full = true;
		return NULL;
	}
	struct rpc__h2call *h = &call->h2;
	h->sc = sc;
	h->stream_id = stream_id;
	h->next = sc->calls;
	if (sc->calls)
		sc->calls->h2.prev = call;
	sc->calls = call;
	sc->ncalls++;
	return call;
}

/* The nghttp2 stream is gone (closed, reset, or the connection went). */
static void stream_detach(struct rpc_call *call)
{
	struct rpc__h2call *h = &call->h2;
	struct sconn *sc = h->sc;
	if (!sc)
		return;
	rpc__call_leave(call);
	rpc__conn_forget_outq(&sc->base, &call->outq);
	if (sc->memo_call == call) {
		sc->memo_id = 0;
		sc->memo_call = NULL;
	}
	if (h->prev)
		h->prev->h2.next = h->next;
	else
		sc->calls = h->next;
	if (h->next)
		h->next->h2.prev = h->prev;
	h->prev = h->next = NULL;
	sc->ncalls--;
	h->sc = NULL;
	if (sc->ncalls == 0 && sc->cs->idle_ms && sc->handshake_done && !sc->base.closing)
		uv_timer_start(&sc->base.timer, on_conn_timer, sc->cs->idle_ms, 0);
	rpc__call_gone(call);
	rpc__call_unref(call);
}

/* ---------------------------------------------------------------- request headers */

#define NAME_IS(lit) (nlen == sizeof(lit) - 1 && memcmp(name, lit, nlen) == 0)

enum { PSEUDO_METHOD = 1, PSEUDO_SCHEME = 2, PSEUDO_AUTHORITY = 4, PSEUDO_PATH = 8 };

/* Reset a stream whose request headers break HTTP/2's rules (RFC 9113
 * 8.3): an unknown, repeated or late pseudo-header, an invalid name or
 * value. The :authority value is only checked as a field value. */
static int reject_headers(nghttp2_session *ng, struct rpc_call *call)
{
	call->h2.bad_headers = true;
	nghttp2_submit_rst_stream(ng, NGHTTP2_FLAG_NONE, call->h2.stream_id,
				  NGHTTP2_PROTOCOL_ERROR);
	return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
}

static int check_header(nghttp2_session *ng, struct rpc_call *call, const uint8_t *name,
			size_t nlen, const uint8_t *value, size_t vlen)
{
	struct rpc__h2call *h = &call->h2;
	if (!nghttp2_check_header_value(value, vlen))
		return reject_headers(ng, call);
	if (nlen && name[0] == ':') {
		uint8_t bit = NAME_IS(":method")      ? PSEUDO_METHOD
			      : NAME_IS(":scheme")    ? PSEUDO_SCHEME
			      : NAME_IS(":authority") ? PSEUDO_AUTHORITY
			      : NAME_IS(":path")      ? PSEUDO_PATH
						      : 0;
		if (!bit || (h->pseudo & bit) || h->regular_seen || !vlen)
			return reject_headers(ng, call);
		h->pseudo |= bit;
		return 0;
	}
	if (!nghttp2_check_header_name(name, nlen) ||
	    (nlen == 10 && memcmp(name, "connection", 10) == 0))
		return reject_headers(ng, call);
	h->regular_seen = true;
	return 0;
}

/* ---------------------------------------------------------------- nghttp2 callbacks */

static struct sconn *to_sconn(void *user_data)
{
	return MC_CONTAINER_OF((struct rpc__conn *)user_data, struct sconn, base);
}

static int on_begin_headers(nghttp2_session *ng, const nghttp2_frame *frame, void *user_data)
{
	struct sconn *sc = to_sconn(user_data);
	if (sc->base.closing || frame->hd.type != NGHTTP2_HEADERS ||
	    frame->headers.cat != NGHTTP2_HCAT_REQUEST)
		return 0;
	bool full = false;
	struct rpc_call *call = stream_new(sc, frame->hd.stream_id, &full);
	if (!call) {
		if (full)
			nghttp2_submit_rst_stream(ng, NGHTTP2_FLAG_NONE, frame->hd.stream_id,
						  NGHTTP2_ENHANCE_YOUR_CALM);
		return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
	}
	if (sc->ncalls == 1 && sc->cs->idle_ms)
		uv_timer_stop(&sc->base.timer);
	set_call(sc, frame->hd.stream_id, call);
	return 0;
}

static int on_header(nghttp2_session *ng, const nghttp2_frame *frame, const uint8_t *name,
		     size_t nlen, const uint8_t *value, size_t vlen, uint8_t flags,
		     void *user_data)
{
	struct sconn *sc = to_sconn(user_data);
	if (sc->base.closing || frame->hd.type != NGHTTP2_HEADERS ||
	    frame->headers.cat != NGHTTP2_HCAT_REQUEST)
		return 0;
	struct rpc_call *call = call_of(sc, frame->hd.stream_id);
	if (!call || call->h2.bad_headers)
		return 0;
	/* nghttp2 does not hold a peer to the SETTINGS_MAX_HEADER_LIST_SIZE
	 * we advertised, and HPACK lets one byte repeat a 4 KiB field of
	 * its dynamic table: a 16 KiB HEADERS frame would decode to 64 MB.
	 * Past the size, the stream is reset and nothing more is kept. */
	call->h2.hdr_bytes += (uint32_t)(nlen + vlen + 32); /* (each < 64 KiB) */
	if (call->h2.hdr_bytes > RPC__MAX_HEADER_LIST_BYTES) {
		metric_inc(sc->cs->m_proto);
		if (!sc->told_big_headers)
			log_info("%s: %s sent headers of more than %u bytes (stream %d, "
				 "reset; the connection's next ones too, unlogged)",
				 sc_name(sc), sc->base.peer, RPC__MAX_HEADER_LIST_BYTES,
				 (int)frame->hd.stream_id);
		sc->told_big_headers = true;
		call->h2.bad_headers = true;
		nghttp2_submit_rst_stream(ng, NGHTTP2_FLAG_NONE, call->h2.stream_id,
					  NGHTTP2_ENHANCE_YOUR_CALM);
		return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
	}
	int rv = check_header(ng, call, name, nlen, value, vlen);
	if (rv)
		return rv;
	int hrc = rpc__call_header(call, name, nlen, value, vlen);
	if (hrc == -ENOBUFS) { /* (the bound on what calls hold) */
		call->h2.bad_headers = true;
		nghttp2_submit_rst_stream(ng, NGHTTP2_FLAG_NONE, call->h2.stream_id,
					  NGHTTP2_ENHANCE_YOUR_CALM);
	}
	return hrc ? NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE : 0;
}

static void conn_final_goaway(struct sconn *sc)
{
	sc->drain_stage = 2;
	nghttp2_submit_goaway(sc->base.ng, NGHTTP2_FLAG_NONE,
			      nghttp2_session_get_last_proc_stream_id(sc->base.ng),
			      NGHTTP2_NO_ERROR, NULL, 0);
	rpc__conn_want_flush(&sc->base);
}

static int on_frame_recv(nghttp2_session *ng, const nghttp2_frame *frame, void *user_data)
{
	struct sconn *sc = to_sconn(user_data);
	struct rpc_call *call;

	if (sc->base.closing)
		return 0;
	switch (frame->hd.type) {
	case NGHTTP2_HEADERS:
		call = call_of(sc, frame->hd.stream_id);
		if (!call)
			return 0;
		if (call->h2.bad_headers)
			return 0;
		if (frame->headers.cat == NGHTTP2_HCAT_REQUEST &&
		    (call->h2.pseudo & (PSEUDO_METHOD | PSEUDO_SCHEME | PSEUDO_PATH)) !=
			    (PSEUDO_METHOD | PSEUDO_SCHEME | PSEUDO_PATH)) {
			/* a request lacks :method, :scheme or :path */
			reject_headers(ng, call);
			return 0;
		}
		rpc__call_ref(call);
		if (frame->headers.cat == NGHTTP2_HCAT_REQUEST)
			rpc__call_dispatch(call);
		if (frame->hd.flags & NGHTTP2_FLAG_END_STREAM)
			rpc__call_half_close(call);
		rpc__call_unref(call);
		break;
	case NGHTTP2_DATA:
		if (!(frame->hd.flags & NGHTTP2_FLAG_END_STREAM))
			break;
		call = call_of(sc, frame->hd.stream_id);
		if (call) {
			rpc__call_ref(call);
			rpc__call_half_close(call);
			rpc__call_unref(call);
		}
		break;
	case NGHTTP2_SETTINGS:
		if (!sc->handshake_done && !(frame->hd.flags & NGHTTP2_FLAG_ACK)) {
			sc->handshake_done = true;
			uv_timer_stop(&sc->base.timer);
			if (sc->cs->idle_ms && sc->ncalls == 0)
				uv_timer_start(&sc->base.timer, on_conn_timer, sc->cs->idle_ms,
					       0);
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
	struct rpc_call *call = call_of(sc, stream_id);
	if (call)
		rpc__call_data(call, data, len);
	return 0;
}

static int on_frame_send(nghttp2_session *ng, const nghttp2_frame *frame, void *user_data)
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

static int on_stream_close(nghttp2_session *ng, int32_t stream_id, uint32_t error_code,
			   void *user_data)
{
	struct sconn *sc = to_sconn(user_data);
	if (sc->base.closing)
		return 0;
	struct rpc_call *call = call_of(sc, stream_id);
	if (call) {
		set_call(sc, stream_id, NULL);
		stream_detach(call);
	}
	return 0;
}

/* ---------------------------------------------------------------- connections */

static void on_conn_closed(struct rpc__conn *c)
{
	struct sconn *sc = MC_CONTAINER_OF(c, struct sconn, base);
	struct rpc__sconns *cs = sc->cs;

	while (sc->calls)
		stream_detach(sc->calls);
	rpc__conn_release(c);
	if (sc->prev)
		sc->prev->next = sc->next;
	else
		cs->head = sc->next;
	if (sc->next)
		sc->next->prev = sc->prev;
	cs->n--;
	metric_sub(cs->m_conns, 1);
	if (sc->costed)
		rpc__mem_count(&cs->s->calls.bufs, SCONN_COST, false);
	free(sc);
	rpc__server_check_done(cs->s);
}

static void on_conn_proto_error(struct rpc__conn *c)
{
	struct sconn *sc = MC_CONTAINER_OF(c, struct sconn, base);
	metric_inc(sc->cs->m_proto);
}

/* rpc__call_data's condition for feeding the call's deframer. */
static struct rpc_deframer *sconn_deframer(struct rpc__conn *c, int32_t stream_id)
{
	struct rpc_call *call = call_of(MC_CONTAINER_OF(c, struct sconn, base), stream_id);
	return call && call->dispatched && !call->done ? &call->df : NULL;
}

static const struct rpc__conn_ops sconn_ops = {
	.on_closed = on_conn_closed,
	.on_proto_error = on_conn_proto_error,
	.deframer = sconn_deframer,
};

static void on_conn_timer(uv_timer_t *t)
{
	struct sconn *sc = MC_CONTAINER_OF(t, struct sconn, base.timer);
	if (!sc->handshake_done) {
		log_info("%s: %s sent no HTTP/2 preface within %llu ms, closing", sc_name(sc),
			 sc->base.peer, (unsigned long long)sc->cs->handshake_ms);
		metric_inc(sc->cs->m_proto);
		rpc__conn_close(&sc->base);
		return;
	}
	if (sc->ncalls == 0) {
		log_debug("%s: closing idle connection from %s", sc_name(sc), sc->base.peer);
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

void rpc__sconns_accept(struct rpc__sconns *cs, uv_stream_t *ls)
{
	const char *name = rpc__server_name(cs->s);
	struct sconn *sc = calloc(1, sizeof(*sc));
	if (!sc) {
		log_warn("%s: out of memory accepting a connection", name);
		return;
	}
	if (rpc__conn_init(&sc->base, rpc__server_loop(cs->s), &sconn_ops, name, cs->rbuf)) {
		free(sc);
		return;
	}
	sc->cs = cs;
	sc->next = cs->head;
	if (cs->head)
		cs->head->prev = sc;
	cs->head = sc;
	cs->n++;
	metric_add(cs->m_conns, 1);
	int rc = uv_accept(ls, (uv_stream_t *)&sc->base.tcp);
	if (rc < 0) {
		log_warn("%s: accept failed: %s", name, uv_strerror(rc));
		rpc__conn_close(&sc->base);
		return;
	}
	struct rpc__bufcache *bc = &cs->s->calls.bufs;
	if (SCONN_COST > rpc__mem_left(bc)) {
		if (mc_once_per(&cs->told_full_ms, 10000))
			log_warn("%s: the calls hold %zu of their %zu bytes "
				 "(--rpc-max-call-memory): closing new connections",
				 name, bc->mem_held, bc->mem_max);
		rpc__conn_close(&sc->base);
		return;
	}
	rpc__mem_count(bc, SCONN_COST, true);
	sc->costed = true;
	nghttp2_settings_entry iv[] = {
		{NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, cs->max_streams},
		{NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, RPC__STREAM_WINDOW_BYTES},
		{NGHTTP2_SETTINGS_MAX_FRAME_SIZE, RPC__MAX_FRAME_BYTES},
		{NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, RPC__MAX_HEADER_LIST_BYTES},
	};
	rc = rpc__conn_start(&sc->base, true, cs->cbs, cs->ngopt, iv, MC_ARRAY_LEN(iv));
	if (rc < 0) {
		log_warn("%s: cannot start connection from %s: %s", name, sc->base.peer,
			 mc_strerror(rc));
		rpc__conn_close(&sc->base);
		return;
	}
	log_debug("%s: connection from %s", name, sc->base.peer);
	uv_timer_start(&sc->base.timer, on_conn_timer, cs->handshake_ms, 0);
}

/* ---------------------------------------------------------------- the connections of a server */

int rpc__sconns_init(struct rpc__sconns *cs, struct rpc_server *s,
		     const struct rpc_server_opts *opts, struct metrics_registry *reg,
		     const char *name)
{
	cs->s = s;
	cs->max_streams = opts && opts->max_concurrent_streams ? opts->max_concurrent_streams
							       : 1024;
	cs->handshake_ms = opts && opts->handshake_timeout_ms ? opts->handshake_timeout_ms
							      : 10000;
	cs->idle_ms = opts ? opts->idle_timeout_ms : 0;
	cs->rbuf = malloc(RPC__READ_BUF_BYTES);
	if (!cs->rbuf || nghttp2_session_callbacks_new(&cs->cbs) ||
	    nghttp2_option_new(&cs->ngopt)) {
		rpc__sconns_free(cs);
		return -ENOMEM;
	}
	/* gRPC clients send what nghttp2's HTTP checks refuse: grpc-go (in
	 * etcdctl) puts a whole URL such as "http://127.0.0.1:2379" in
	 * :authority. Like grpc-go's server, accept it: the header rules are
	 * checked in check_header and on_frame_recv instead, and what a gRPC
	 * request needs (POST, content-type, :path) in rpc__call_dispatch. */
	nghttp2_option_set_no_http_messaging(cs->ngopt, 1);
	rpc__callbacks_init(cs->cbs);
	nghttp2_session_callbacks_set_on_begin_headers_callback(cs->cbs, on_begin_headers);
	nghttp2_session_callbacks_set_on_header_callback(cs->cbs, on_header);
	nghttp2_session_callbacks_set_on_frame_recv_callback(cs->cbs, on_frame_recv);
	nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cs->cbs, on_data_chunk);
	nghttp2_session_callbacks_set_on_frame_send_callback(cs->cbs, on_frame_send);
	nghttp2_session_callbacks_set_on_stream_close_callback(cs->cbs, on_stream_close);
	cs->m_conns = metrics_gauge(reg, "mooncake_rpc_server_connections",
				    "Open client connections.", "server",
				    (const char *[]){name});
	cs->m_proto = metrics_counter(reg, "mooncake_rpc_server_protocol_errors_total",
				      "Connections or streams ended by a protocol "
				      "error (bad preface, bad frames, handshake timeout).",
				      "server", (const char *[]){name});
	return 0;
}

void rpc__sconns_free(struct rpc__sconns *cs)
{
	if (cs->cbs)
		nghttp2_session_callbacks_del(cs->cbs);
	if (cs->ngopt)
		nghttp2_option_del(cs->ngopt);
	free(cs->rbuf);
	cs->cbs = NULL;
	cs->ngopt = NULL;
	cs->rbuf = NULL;
}

void rpc__sconns_drain(struct rpc__sconns *cs)
{
	for (struct sconn *sc = cs->head; sc; sc = sc->next)
		conn_begin_drain(sc);
}

void rpc__sconns_close_all(struct rpc__sconns *cs)
{
	for (struct sconn *sc = cs->head; sc; sc = sc->next) {
		if (sc->base.closing)
			continue;
		if (sc->base.ng) {
			nghttp2_session_terminate_session(sc->base.ng, NGHTTP2_NO_ERROR);
			rpc__conn_flush(&sc->base);
		}
		rpc__conn_close(&sc->base);
	}
}

unsigned rpc__sconns_count(const struct rpc__sconns *cs)
{
	return cs->n;
}
