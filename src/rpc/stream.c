/*
 * stream: one gRPC call made by a client (struct rpc_stream), whatever
 * carries it (client_int.h: an HTTP/2 stream, client_h2.c, or a server on
 * the same loop, inproc.c).
 *
 * References: the user holds one until the final callback or
 * rpc_stream_cancel; nghttp2 holds one from nghttp2_submit_request until
 * on_stream_close or on_frame_not_send; a server on the same loop holds
 * one until it answers or the call is cancelled. The final callback runs
 * exactly once: from the deadline timer, the frame callbacks, the
 * connection's close, or — for failures decided while the caller is still
 * inside rpc_client_unary/stream — from the loop's next turn
 * (rpc__stream_finish_later).
 *
 * The response: HEADERS with :status 200 and a gRPC content-type, then
 * messages (a unary call's one is kept until the end, a stream's go to
 * on_message), then trailers with grpc-status and grpc-message. A
 * trailers-only response is HEADERS that end the stream. Anything else
 * ends the call with the status gRPC's clients give it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/metrics.h"
#include "common/util.h"
#include "rpc/client_int.h"

#define LOG_SUBSYS LOGS_RPC

static const struct rpc__outq_ops stream_outq_ops;
static void on_dl_timer(uv_timer_t *t);

/* ---------------------------------------------------------------- lists */

void rpc__slist_push(struct rpc__slist *l, struct rpc_stream *st)
{
	st->rt.next = NULL;
	st->rt.prev = l->tail;
	if (l->tail)
		l->tail->rt.next = st;
	else
		l->head = st;
	l->tail = st;
}

void rpc__slist_del(struct rpc__slist *l, struct rpc_stream *st)
{
	if (st->rt.prev)
		st->rt.prev->rt.next = st->rt.next;
	else
		l->head = st->rt.next;
	if (st->rt.next)
		st->rt.next->rt.prev = st->rt.prev;
	else
		l->tail = st->rt.prev;
	st->rt.prev = st->rt.next = NULL;
}

/* ---------------------------------------------------------------- the streams of a client */

void rpc__streams_init(struct rpc__streams *ss, uv_loop_t *loop, size_t max_msg,
		       struct metrics_registry *reg)
{
	ss->max_msg = max_msg;
	ss->reg = reg;
	uv_timer_init(loop, &ss->dl_timer);
}

void rpc__streams_close(struct rpc__streams *ss, void *data, uv_close_cb cb)
{
	ss->dl_timer.data = data;
	uv_close((uv_handle_t *)&ss->dl_timer, cb);
}

void rpc__streams_free(struct rpc__streams *ss)
{
	for (size_t i = 0; i < RPC__CSTATS_BUCKETS; i++) {
		while (ss->stats[i]) {
			struct rpc__cstats *s = ss->stats[i];
			ss->stats[i] = s->next;
			free(s->path);
			free(s);
		}
	}
	rpc__dlheap_free(&ss->dl);
	rpc__bufcache_free(&ss->bufs);
}

/* ---------------------------------------------------------------- metrics */

static struct rpc__cstats *stats_get(struct rpc__streams *ss, const char *path)
{
	uint64_t h = mc_hash64(path, strlen(path));
	struct rpc__cstats **b = &ss->stats[h % RPC__CSTATS_BUCKETS];
	for (struct rpc__cstats *s = *b; s; s = s->next)
		if (s->hash == h && strcmp(s->path, path) == 0)
			return s;
	struct rpc__cstats *s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	s->path = strdup(path);
	if (!s->path) {
		free(s);
		return NULL;
	}
	s->hash = h;
	s->duration = metrics_histogram(
		ss->reg, "mooncake_rpc_client_call_duration_seconds",
		"Client-side time from starting a call to its final status.", "method",
		(const char *[]){s->path}, metrics_latency_buckets, metrics_latency_nbuckets);
	s->next = *b;
	*b = s;
	return s;
}

static void stats_record(struct rpc__streams *ss, struct rpc__cstats *s, int code,
			 uint64_t start_ns)
{
	rpc__count_status(s->calls, ss->reg, "mooncake_rpc_client_calls_total",
			  "gRPC calls made, by final status.", NULL, s->path, code);
	metric_observe(s->duration, (double)(uv_hrtime() - start_ns) / 1e9);
}

/* ---------------------------------------------------------------- stream objects */

void rpc__stream_ref(struct rpc_stream *st)
{
	st->refs++;
}

void rpc__stream_unref(struct rpc_stream *st)
{
	if (--st->refs)
		return;
	struct rpc_client *c = st->c;
	rpc_deframer_free(&st->df);
	rpc__outq_clear(&st->outq);
	rpc__unpacked_free(st->uresp, &st->resp_arena);
	rpc__omsg_unref(st->req_msg);
	rpc__rbody_unref(st->lent);
	free(st->grpc_message);
	free(st->fin_message);
	free(st);
	rpc__client_check_freed(c);
}

uint64_t rpc__stream_deadline_ms(const struct rpc_stream *st)
{
	return st->timeout_ms ? st->dl.at_ms : 0;
}

void rpc__stream_finish(struct rpc_stream *st, int status, const char *message,
			bool remote_done)
{
	if (!st->user)
		return;
	struct rpc__streams *ss = &st->c->ss;
	st->user = false;
	rpc__dlheap_del(&ss->dl, &st->dl);
	if (st->stats)
		stats_record(ss, st->stats, status, st->start_ns);
	st->refs++;
	rpc__client_detach(st);
	/* Tell the server we are done if it may still be sending or waiting
	 * for us; a request still queued in nghttp2 is withdrawn. */
	rpc__h2_end(st, remote_done);
	if (st->unary) {
		if (status == RPC_OK && st->sync_out) {
			*st->sync_out = st->uresp;
			st->uresp = NULL;
		}
		if (st->ucb)
			st->ucb(st->ud, status, message ? message : "",
				status == RPC_OK ? st->uresp : NULL);
	} else if (st->cbs->on_close) {
		st->cbs->on_close(st, st->ud, status, message ? message : "");
	}
	rpc__stream_unref(st); /* the guard */
	rpc__stream_unref(st); /* the user's */
}

void rpc__stream_finish_later(struct rpc_stream *st, int status, const char *message)
{
	rpc__client_unlink(st);
	st->fin_status = status;
	free(st->fin_message);
	st->fin_message = message ? strdup(message) : NULL;
	rpc__client_park(st);
}

void rpc__stream_finish_parked(struct rpc_stream *st)
{
	rpc__stream_finish(st, st->fin_status, st->fin_message, false);
}

/* ---------------------------------------------------------------- the response */

#define NAME_IS(lit) (nlen == sizeof(lit) - 1 && memcmp(name, lit, nlen) == 0)

void rpc__stream_header(struct rpc_stream *st, const uint8_t *name, size_t nlen,
			const uint8_t *value, size_t vlen)
{
	if (NAME_IS(":status")) {
		int v = 0;
		for (size_t i = 0; i < vlen && i < 3; i++)
			v = v * 10 + (value[i] - '0');
		st->http_status = v;
	} else if (NAME_IS("grpc-status")) {
		int v = 0;
		bool ok = vlen > 0 && vlen <= 3;
		for (size_t i = 0; ok && i < vlen; i++) {
			if (value[i] < '0' || value[i] > '9')
				ok = false;
			else
				v = v * 10 + (value[i] - '0');
		}
		st->has_grpc_status = true;
		st->grpc_status = ok ? v : RPC_UNKNOWN;
	} else if (NAME_IS("grpc-message")) {
		char *raw = malloc(vlen + 1);
		char *dec = malloc(vlen + 1);
		if (raw && dec) {
			memcpy(raw, value, vlen);
			raw[vlen] = '\0';
			rpc_percent_decode(raw, dec, vlen + 1);
			free(st->grpc_message);
			st->grpc_message = dec;
			dec = NULL;
		}
		free(raw);
		free(dec);
	} else if (NAME_IS("content-type")) {
		st->ct_ok = rpc__content_type_ok(value, vlen);
	}
}

void rpc__stream_response_headers(struct rpc_stream *st, bool end_stream)
{
	st->headers_recv = true;
	if (end_stream)
		return; /* trailers-only: rpc__stream_trailers says */
	if (st->http_status != 200) {
		char msg[64];
		snprintf(msg, sizeof(msg), "HTTP status %d from server", st->http_status);
		rpc__stream_finish(st, rpc__status_from_http(st->http_status), msg, false);
	} else if (!st->ct_ok) {
		rpc__stream_finish(st, RPC_UNKNOWN,
				   "response content-type is not application/grpc", false);
	}
}

void rpc__stream_trailers(struct rpc_stream *st)
{
	char msg[256];
	int status;

	if (!st->user)
		return;
	if (!st->has_grpc_status) {
		if (st->http_status != 200) {
			snprintf(msg, sizeof(msg), "HTTP status %d from server",
				 st->http_status);
			status = rpc__status_from_http(st->http_status);
		} else {
			snprintf(msg, sizeof(msg), "server sent no grpc-status");
			status = RPC_INTERNAL;
		}
		rpc__stream_finish(st, status, msg, true);
		return;
	}
	status = st->grpc_status;
	if (status == RPC_OK && !rpc_deframer_idle(&st->df)) {
		rpc__stream_finish(st, RPC_INTERNAL, "response stream ended inside a message",
				   true);
		return;
	}
	if (status == RPC_OK && st->unary && st->nresp != 1) {
		rpc__stream_finish(st, RPC_INTERNAL, "no response message for a unary call",
				   true);
		return;
	}
	rpc__stream_finish(st, status, st->grpc_message, true);
}

int rpc__stream_status_on_close(const struct rpc_stream *st, uint32_t error_code, char *msg,
				size_t len)
{
	if (st->has_grpc_status) {
		snprintf(msg, len, "%s", st->grpc_message ? st->grpc_message : "");
		return st->grpc_status;
	}
	if (st->http_status && st->http_status != 200) {
		snprintf(msg, len, "HTTP status %d from server", st->http_status);
		return rpc__status_from_http(st->http_status);
	}
	if (error_code != NGHTTP2_NO_ERROR) {
		snprintf(msg, len, "stream reset by server: %s",
			 nghttp2_http2_strerror(error_code));
		return rpc__status_from_h2(error_code);
	}
	snprintf(msg, len, "stream closed without a gRPC status");
	return RPC_INTERNAL;
}

static int stream_on_msg(void *ud, const uint8_t *body, size_t len)
{
	struct rpc_stream *st = ud;
	if (st->unary && st->nresp) {
		rpc__stream_finish(st, RPC_INTERNAL,
				   "more than one response message for a unary call", false);
		return -EPROTO;
	}
	struct rpc__arena ar;
	struct rpc__arena *a = st->unary ? &st->resp_arena : &ar;
	/* A response handed to the caller of unary_sync must be plain
	 * malloc memory: it frees it with protobuf_c_message_free_unpacked. */
	ProtobufCMessage *msg = rpc__unpack(st->resp_desc, body, len,
					    st->sync_out ? NULL : &st->c->ss.bufs, &st->df, a);
	if (!msg) {
		rpc__stream_finish(st, RPC_INTERNAL, "failed to parse response message",
				   false);
		return -EBADMSG;
	}
	st->nresp++;
	if (st->unary) {
		st->uresp = msg;
		return 0;
	}
	if (st->cbs->on_message)
		st->cbs->on_message(st, st->ud, msg);
	rpc__unpacked_free(msg, a);
	return st->user ? 0 : -ECANCELED;
}

void rpc__stream_data(struct rpc_stream *st, const uint8_t *data, size_t len)
{
	st->refs++;
	int rc = rpc_deframer_feed(&st->df, data, len, stream_on_msg, st);
	if (rc == MC_ETOO_LARGE) {
		char msg[128];
		snprintf(msg, sizeof(msg), "received message larger than max (%zu vs. %zu)",
			 st->df.msg_len, st->df.max_message_bytes);
		rpc__stream_finish(st, RPC_RESOURCE_EXHAUSTED, msg, false);
	} else if (rc == -EPROTO && st->user) {
		rpc__stream_finish(st, RPC_INTERNAL,
				   "compressed response but no compression was negotiated",
				   false);
	} else if (rc == -ENOMEM) {
		rpc__stream_finish(st, RPC_RESOURCE_EXHAUSTED, "out of memory", false);
	}
	rpc__stream_unref(st);
}

void rpc__stream_inproc_answer(struct rpc_stream *st, int status, const char *message,
			       const uint8_t *body, size_t len)
{
	if (!st->user)
		return;
	if (status == RPC_OK && !body) {
		status = RPC_INTERNAL;
		message = "no response message for a unary call";
	} else if (status == RPC_OK && len > st->c->ss.max_msg) {
		status = RPC_RESOURCE_EXHAUSTED;
		message = "received message larger than max";
	} else if (status == RPC_OK) {
		st->uresp = rpc__unpack(st->resp_desc, body, len,
					st->sync_out ? NULL : &st->c->ss.bufs, NULL,
					&st->resp_arena);
		st->nresp = 1;
		if (!st->uresp) {
			status = RPC_INTERNAL;
			message = "failed to parse response message";
		}
	}
	rpc__stream_finish_later(st, status, message);
}

/* ---------------------------------------------------------------- retries */

bool rpc__stream_may_retry(const struct rpc_stream *st)
{
	return !st->headers_recv && (st->outq.taken == 0 || st->unary);
}

void rpc__stream_rewind(struct rpc_stream *st)
{
	struct rpc__streams *ss = &st->c->ss;
	if (st->unary && st->outq.taken) {
		/* Its body already left: queue the kept request again. */
		rpc__outq_clear(&st->outq);
		st->req_msg->refs++;
		rpc__outq_push(&st->outq, st->req_msg);
		st->outq.taken = 0;
	}
	rpc_deframer_free(&st->df);
	rpc__deframer_setup(&st->df, ss->max_msg, &ss->bufs);
}

/* ---------------------------------------------------------------- outq hooks */

static void on_outq_drain(struct rpc__outq *q)
{
	struct rpc_stream *st = MC_CONTAINER_OF(q, struct rpc_stream, outq);
	if (st->user && !st->unary && st->cbs->on_drain) {
		st->refs++;
		st->cbs->on_drain(st, st->ud);
		rpc__stream_unref(st);
	}
}

static const struct rpc__outq_ops stream_outq_ops = {
	.on_eof = NULL,
	.on_drain = on_outq_drain,
};

/* ---------------------------------------------------------------- deadlines */

static void on_dl_timer(uv_timer_t *t)
{
	struct rpc__streams *ss = MC_CONTAINER_OF(t, struct rpc__streams, dl_timer);
	uint64_t now = uv_now(t->loop);
	struct rpc__dl *d;

	while ((d = rpc__dlheap_top(&ss->dl)) && d->at_ms <= now) {
		struct rpc_stream *st = MC_CONTAINER_OF(d, struct rpc_stream, dl);
		rpc__dlheap_del(&ss->dl, d);
		rpc__stream_finish(st, RPC_DEADLINE_EXCEEDED, "deadline exceeded", false);
	}
	rpc__dlheap_arm(&ss->dl, &ss->dl_timer, on_dl_timer);
}

/* ---------------------------------------------------------------- the call API */

static int stream_new(struct rpc_client *c, const char *path,
		      const ProtobufCMessageDescriptor *resp_desc, uint64_t timeout_ms,
		      struct rpc_stream **out)
{
	struct rpc__streams *ss = &c->ss;
	if (rpc__client_freeing(c) || !path || path[0] != '/' || !resp_desc)
		return -EINVAL;
	struct rpc_stream *st = mc_zalloc(1, sizeof(*st));
	if (!st)
		return -ENOMEM;
	st->stats = stats_get(ss, path);
	if (!st->stats) {
		free(st);
		return -ENOMEM;
	}
	st->c = c;
	st->refs = 1;
	st->user = true;
	st->resp_desc = resp_desc;
	st->timeout_ms = timeout_ms;
	st->start_ns = uv_hrtime();
	rpc__deframer_setup(&st->df, ss->max_msg, &ss->bufs);
	rpc__outq_init(&st->outq, &stream_outq_ops);
	rpc__dl_init(&st->dl);
	*out = st;
	return 0;
}

static void stream_start(struct rpc_stream *st)
{
	struct rpc_client *c = st->c;
	struct rpc__streams *ss = &c->ss;
	if (st->timeout_ms) {
		/* The loop's clock may be stale when called from outside a
		 * callback; a deadline must not start in the past. */
		uv_loop_t *loop = ss->dl_timer.loop;
		uv_update_time(loop);
		st->dl.at_ms = uv_now(loop) + st->timeout_ms;
		if (rpc__dlheap_add(&ss->dl, &st->dl)) {
			rpc__stream_finish_later(st, RPC_RESOURCE_EXHAUSTED, "out of memory");
			return;
		}
		if (rpc__dlheap_top(&ss->dl) == &st->dl)
			rpc__dlheap_arm(&ss->dl, &ss->dl_timer, on_dl_timer);
	}
	rpc__client_route(c, st);
}

/* lend: NULL, or a buffer a large bytes field of req may be sent from
 * (rpc_client_unary_lend). The stream keeps a reference on it until it is
 * freed, so that its release never runs from inside the caller's call,
 * and every message sent from it holds one more. */
static int unary_start(struct rpc_client *c, const char *path, const ProtobufCMessage *req,
		       const struct rpc_lend *lend,
		       const ProtobufCMessageDescriptor *resp_desc, uint64_t timeout_ms,
		       rpc_unary_cb cb, void *ud, ProtobufCMessage **sync_out,
		       struct rpc_stream **out)
{
	struct rpc__rbody *lent = NULL;
	struct rpc__omsg *m;
	struct rpc_stream *st;
	int rc;

	if (!req)
		return -EINVAL;
	if (lend) {
		if (!lend->buf || !lend->release)
			return -EINVAL;
		lent = calloc(1, sizeof(*lent));
		if (!lent)
			return -ENOMEM;
		lent->refs = 1;
		lent->p = lend->buf;
		lent->len = lend->len;
		lent->release = lend->release;
		lent->ctx = lend->ctx;
	}
	rc = stream_new(c, path, resp_desc, timeout_ms, &st);
	if (rc)
		goto err_lent;
	rc = rpc__omsg_pack(req, c->ss.max_msg, SIZE_MAX, &c->ss.bufs, lent, &m);
	if (rc)
		goto err_stream;
	st->lent = lent;
	st->unary = true;
	st->ucb = cb;
	st->ud = ud;
	st->sync_out = sync_out;
	rpc__outq_push(&st->outq, m);
	m->refs++;
	st->req_msg = m;
	st->outq.eof = true;
	st->send_closed = true;
	if (out)
		*out = st;
	stream_start(st);
	return 0;

err_stream:
	rpc__stream_unref(st);
err_lent:
	free(lent); /* not referenced: a failed pack takes no reference */
	return rc;
}

int rpc_client_unary(struct rpc_client *c, const char *path, const ProtobufCMessage *req,
		     const ProtobufCMessageDescriptor *resp_desc, uint64_t timeout_ms,
		     rpc_unary_cb cb, void *ud, struct rpc_stream **out)
{
	return unary_start(c, path, req, NULL, resp_desc, timeout_ms, cb, ud, NULL, out);
}

int rpc_client_unary_lend(struct rpc_client *c, const char *path, const ProtobufCMessage *req,
			  const struct rpc_lend *lend,
			  const ProtobufCMessageDescriptor *resp_desc, uint64_t timeout_ms,
			  rpc_unary_cb cb, void *ud, struct rpc_stream **out)
{
	if (!lend)
		return -EINVAL;
	return unary_start(c, path, req, lend, resp_desc, timeout_ms, cb, ud, NULL, out);
}

int rpc_client_stream(struct rpc_client *c, const char *path,
		      const ProtobufCMessageDescriptor *resp_desc, uint64_t timeout_ms,
		      const struct rpc_stream_cbs *cbs, void *ud, struct rpc_stream **out)
{
	struct rpc_stream *st;
	if (!cbs)
		return -EINVAL;
	int rc = stream_new(c, path, resp_desc, timeout_ms, &st);
	if (rc)
		return rc;
	st->cbs = cbs;
	st->ud = ud;
	if (out)
		*out = st;
	stream_start(st);
	return 0;
}

int rpc_stream_send(struct rpc_stream *st, const ProtobufCMessage *msg)
{
	if (!st->user)
		return -ECANCELED;
	if (st->send_closed)
		return -EPIPE;
	struct rpc__omsg *m;
	int rc = rpc__omsg_pack(msg, st->c->ss.max_msg, SIZE_MAX, &st->c->ss.bufs, NULL, &m);
	if (rc)
		return rc;
	rpc__outq_push(&st->outq, m);
	rpc__h2_resume(st);
	return 0;
}

int rpc_stream_close_send(struct rpc_stream *st)
{
	if (!st->user)
		return -ECANCELED;
	if (st->send_closed)
		return -EPIPE;
	st->send_closed = true;
	st->outq.eof = true;
	rpc__h2_resume(st);
	return 0;
}

void rpc_stream_cancel(struct rpc_stream *st)
{
	if (!st || !st->user)
		return;
	struct rpc__streams *ss = &st->c->ss;
	st->user = false;
	rpc__dlheap_del(&ss->dl, &st->dl);
	if (st->stats)
		stats_record(ss, st->stats, RPC_CANCELLED, st->start_ns);
	rpc__client_detach(st);
	rpc__h2_end(st, false);
	rpc__stream_unref(st);
}

size_t rpc_stream_pending_bytes(const struct rpc_stream *st)
{
	return st->outq.bytes;
}

struct sync_ctx {
	bool done;
	int status;
	char *errmsg;
	size_t errlen;
};

static void on_sync_done(void *ud, int status, const char *message,
			 const ProtobufCMessage *resp)
{
	struct sync_ctx *x = ud;
	x->done = true;
	x->status = status;
	if (x->errmsg && x->errlen)
		snprintf(x->errmsg, x->errlen, "%s", message ? message : "");
}

int rpc_client_unary_sync(struct rpc_client *c, const char *path, const ProtobufCMessage *req,
			  const ProtobufCMessageDescriptor *resp_desc, uint64_t timeout_ms,
			  ProtobufCMessage **resp, char *errmsg, size_t errlen)
{
	struct sync_ctx x = {false, RPC_UNKNOWN, errmsg, errlen};
	ProtobufCMessage *got = NULL;

	if (errmsg && errlen)
		errmsg[0] = '\0';
	if (resp)
		*resp = NULL;
	int rc = unary_start(c, path, req, NULL, resp_desc, timeout_ms, on_sync_done, &x, &got,
			     NULL);
	if (rc) {
		if (errmsg && errlen)
			snprintf(errmsg, errlen, "%s", mc_strerror(rc));
		return rc == MC_ETOO_LARGE ? RPC_RESOURCE_EXHAUSTED : RPC_INVALID_ARGUMENT;
	}
	uv_loop_t *loop = c->ss.dl_timer.loop;
	while (!x.done)
		if (uv_run(loop, UV_RUN_ONCE) == 0 && !x.done) {
			/* Nothing left that could complete it: a bug. */
			if (errmsg && errlen)
				snprintf(errmsg, errlen, "event loop stopped");
			return RPC_INTERNAL;
		}
	if (resp)
		*resp = got;
	else if (got)
		protobuf_c_message_free_unpacked(got, NULL);
	return x.status;
}
