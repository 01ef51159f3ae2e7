/*
 * client: a gRPC channel to one server over one reused HTTP/2 connection.
 *
 * Channel states: IDLE (no connection; the next call connects),
 * CONNECTING (calls wait in a queue), READY (calls go straight to the
 * connection), BACKOFF (the last attempt failed; calls fail at once with
 * UNAVAILABLE until the backoff timer, after which the channel is IDLE
 * again). The backoff doubles-ish (x1.6) from backoff_initial_ms to
 * backoff_max_ms with +-20% jitter from a generator seeded at creation,
 * and resets after a successful connect. A connection that drops after
 * being READY puts the channel back to IDLE with no wait: a restarted
 * server is reached on the next call.
 *
 * GOAWAY: the connection stops being the channel's current one; calls on
 * it keep running, new calls open a new connection. A request nghttp2
 * could not start because of the GOAWAY (its HEADERS never left), or one
 * the server refused (REFUSED_STREAM: above the GOAWAY's last stream id,
 * or over its stream limit) — a unary call at any point, since its
 * request message is kept until the call ends, a streaming call only if
 * none of its body left — is started again transparently (at most
 * MAX_RETRIES times): the server never processed it.
 *
 * Streams: one struct rpc_stream per call, referenced by the user (until
 * its final callback or rpc_stream_cancel) and by nghttp2 (from
 * nghttp2_submit_request until on_stream_close or on_frame_not_send). The
 * final callback runs exactly once: from the deadline timer, the frame
 * callbacks, the connection's close, or — for failures decided while the
 * caller is still inside rpc_client_unary/stream — from a uv_idle_t on
 * the next loop iteration.
 *
 * With local_calls, a unary call whose target is a listener of a server
 * on this loop is handed to that server (rpc__server_inproc_start) and
 * kept on the inproc list; the server holds a stream reference until it
 * answers (rpc__client_inproc_done, delivered from the idle handle like a
 * local failure) or the call is cancelled.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/metrics.h"
#include "common/util.h"
#include "rpc/rpc_int.h"

#define LOG_SUBSYS LOGS_RPC

#define NCODES 17
#define STATS_BUCKETS 64
#define MAX_RETRIES 5

struct cstats {
	struct cstats *next;
	uint64_t hash;
	char *path;
	struct metric *calls[NCODES];
	struct metric *duration;
};

struct slist {
	struct rpc_stream *head, *tail;
};

struct cconn {
	struct rpc__conn base;
	struct rpc_client *c;
	struct cconn *prev, *next;
	uv_connect_t creq;
	struct slist streams;
	unsigned nstreams;
	bool connected;
	bool got_settings; /* the server spoke HTTP/2 */
	bool goaway;
};

enum cstate { CL_IDLE, CL_CONNECTING, CL_READY, CL_BACKOFF };

struct rpc_client {
	uv_loop_t *loop;
	struct sockaddr_storage addr;
	char authority[80];
	char label[96];
	size_t max_msg;
	uint64_t connect_ms, backoff_initial_ms, backoff_max_ms, backoff_ms;
	struct metrics_registry *reg;
	nghttp2_session_callbacks *cbs;
	uint8_t *rbuf;
	enum cstate state;
	int last_error;
	struct cconn *cur;
	struct cconn *conns;
	unsigned nconns;
	struct slist pending;
	struct slist done_q;
	struct slist inproc;  /* calls handed to a server of this loop */
	bool local;           /* opts->local_calls */
	unsigned inproc_calls;
	uv_timer_t backoff_timer, dl_timer;
	uv_idle_t idle;
	unsigned handles_open;
	struct rpc__dlheap dl;
	struct rpc__bufcache bufs;
	struct cstats *stats[STATS_BUCKETS];
	uint64_t rng;
	bool freeing;
	unsigned goaways, connects;
};

enum where { W_NONE, W_PENDING, W_CONN, W_DONEQ, W_INPROC };

struct rpc_stream {
	struct rpc_client *c;
	struct cconn *cc;
	struct rpc_call *icall; /* in-process: the server's call */
	struct rpc_stream *prev, *next;
	enum where where;
	int32_t stream_id;
	unsigned refs;
	bool user;        /* final callback not yet delivered */
	bool ng;          /* nghttp2 holds the stream */
	bool opened;      /* its HEADERS went out */
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
	unsigned retries;
	unsigned nresp;
	struct rpc_deframer df;
	struct rpc__outq outq;
	struct cstats *stats;
	uint64_t start_ns;
	uint64_t timeout_ms;
	struct rpc__dl dl;
	int fin_status;     /* deferred completion */
	char *fin_message;
};

static const struct rpc__conn_ops cconn_ops;
static const struct rpc__outq_ops stream_outq_ops;
static void client_route(struct rpc_client *c, struct rpc_stream *st);
static void on_dl_timer(uv_timer_t *t);
static void on_backoff_timer(uv_timer_t *t);
static void on_settings_timeout(uv_timer_t *t);
static void client_check_freed(struct rpc_client *c);

#define NV(n, v)                                                               \
	{(uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, sizeof(v) - 1,          \
	 NGHTTP2_NV_FLAG_NO_COPY_NAME | NGHTTP2_NV_FLAG_NO_COPY_VALUE}
#define NVS(n, v)                                                              \
	{(uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, strlen(v),              \
	 NGHTTP2_NV_FLAG_NO_COPY_NAME}

/* ---------------------------------------------------------------- lists */

static void slist_push(struct slist *l, struct rpc_stream *st)
{
	st->next = NULL;
	st->prev = l->tail;
	if (l->tail)
		l->tail->next = st;
	else
		l->head = st;
	l->tail = st;
}

static void slist_del(struct slist *l, struct rpc_stream *st)
{
	if (st->prev)
		st->prev->next = st->next;
	else
		l->head = st->next;
	if (st->next)
		st->next->prev = st->prev;
	else
		l->tail = st->prev;
	st->prev = st->next = NULL;
}

static void stream_unlink(struct rpc_stream *st)
{
	switch (st->where) {
	case W_PENDING:
		slist_del(&st->c->pending, st);
		break;
	case W_DONEQ:
		slist_del(&st->c->done_q, st);
		break;
	case W_INPROC:
		slist_del(&st->c->inproc, st);
		break;
	case W_CONN:
		slist_del(&st->cc->streams, st);
		st->cc->nstreams--;
		if (st->cc->nstreams == 0 && st->cc->connected && !st->cc->base.closing)
			uv_unref((uv_handle_t *)&st->cc->base.tcp);
		rpc__conn_forget_outq(&st->cc->base, &st->outq);
		break;
	case W_NONE:
		break;
	}
	st->where = W_NONE;
}

/* ---------------------------------------------------------------- metrics */

static struct cstats *stats_get(struct rpc_client *c, const char *path)
{
	uint64_t h = mc_hash64(path, strlen(path));
	struct cstats **b = &c->stats[h % STATS_BUCKETS];
	for (struct cstats *s = *b; s; s = s->next)
		if (s->hash == h && strcmp(s->path, path) == 0)
			return s;
	struct cstats *s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	s->path = strdup(path);
	if (!s->path) {
		free(s);
		return NULL;
	}
	s->hash = h;
	s->duration = metrics_histogram(
		c->reg, "mooncake_rpc_client_call_duration_seconds",
		"Client-side time from starting a call to its final status.",
		"method", (const char *[]){s->path}, metrics_latency_buckets,
		metrics_latency_nbuckets);
	s->next = *b;
	*b = s;
	return s;
}

static void stats_record(struct rpc_client *c, struct cstats *s, int code,
			 uint64_t start_ns)
{
	if (code < 0 || code >= NCODES)
		code = RPC_UNKNOWN;
	if (!s->calls[code])
		s->calls[code] = metrics_counter(
			c->reg, "mooncake_rpc_client_calls_total",
			"gRPC calls made, by final status.", "method,code",
			(const char *[]){s->path, rpc_status_name(code)});
	metric_inc(s->calls[code]);
	metric_observe(s->duration, (double)(uv_hrtime() - start_ns) / 1e9);
}

/* ---------------------------------------------------------------- stream objects */

static void stream_unref(struct rpc_stream *st)
{
	if (--st->refs)
		return;
	struct rpc_client *c = st->c;
	rpc_deframer_free(&st->df);
	rpc__outq_clear(&st->outq);
	rpc__unpacked_free(st->uresp, &st->resp_arena);
	rpc__omsg_unref(st->req_msg);
	free(st->grpc_message);
	free(st->fin_message);
	free(st);
	client_check_freed(c);
}

/* The caller gives up an in-process call still with the server. The
 * caller holds a reference of its own. */
static void inproc_drop(struct rpc_stream *st)
{
	struct rpc_call *call = st->icall;
	if (!call)
		return;
	st->icall = NULL;
	rpc__server_inproc_cancel(call);
	st->refs--; /* the server's */
}

static bool stream_can_submit(const struct rpc_stream *st)
{
	return st->ng && st->cc && !st->cc->base.closing && st->cc->base.ng;
}

/* Deliver the final status (once) and drop the user's reference.
 * remote_done: the server ended the stream itself. */
static void stream_finish_x(struct rpc_stream *st, int status,
			    const char *message, bool remote_done)
{
	if (!st->user)
		return;
	struct rpc_client *c = st->c;
	st->user = false;
	rpc__dlheap_del(&c->dl, &st->dl);
	if (st->where != W_CONN)
		stream_unlink(st);
	if (st->stats)
		stats_record(c, st->stats, status, st->start_ns);
	/* Tell the server we are done if it may still be sending or waiting
	 * for us; a request still queued in nghttp2 is withdrawn. */
	if (stream_can_submit(st) &&
	    (!remote_done || !st->opened ||
	     nghttp2_session_get_stream_local_close(st->cc->base.ng, st->stream_id) == 0)) {
		nghttp2_submit_rst_stream(st->cc->base.ng, NGHTTP2_FLAG_NONE,
					  st->stream_id, NGHTTP2_CANCEL);
		rpc__conn_want_flush(&st->cc->base);
	}
	st->refs++;
	inproc_drop(st);
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
	stream_unref(st); /* the guard */
	stream_unref(st); /* the user's */
}

static void stream_finish(struct rpc_stream *st, int status, const char *message)
{
	stream_finish_x(st, status, message, false);
}

static void on_idle(uv_idle_t *h)
{
	struct rpc_client *c = MC_CONTAINER_OF(h, struct rpc_client, idle);
	uv_idle_stop(h);
	while (c->done_q.head) {
		struct rpc_stream *st = c->done_q.head;
		stream_unlink(st);
		stream_finish(st, st->fin_status, st->fin_message);
	}
}

/* Fail st from the loop, not from the caller's stack. */
static void stream_finish_later(struct rpc_stream *st, int status,
				const char *message)
{
	struct rpc_client *c = st->c;
	stream_unlink(st);
	st->fin_status = status;
	free(st->fin_message);
	st->fin_message = message ? strdup(message) : NULL;
	slist_push(&c->done_q, st);
	st->where = W_DONEQ;
	uv_idle_start(&c->idle, on_idle);
}

static int stream_status_on_close(struct rpc_stream *st, uint32_t error_code,
				  char *msg, size_t len)
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

/* The server's final word arrived (trailers, or trailers-only). */
static void stream_trailers(struct rpc_stream *st)
{
	char msg[256];
	int status;

	if (!st->user)
		return;
	if (!st->has_grpc_status) {
		if (st->http_status != 200) {
			snprintf(msg, sizeof(msg), "HTTP status %d from server", st->http_status);
			status = rpc__status_from_http(st->http_status);
		} else {
			snprintf(msg, sizeof(msg), "server sent no grpc-status");
			status = RPC_INTERNAL;
		}
		stream_finish_x(st, status, msg, true);
		return;
	}
	status = st->grpc_status;
	if (status == RPC_OK && !rpc_deframer_idle(&st->df)) {
		stream_finish_x(st, RPC_INTERNAL, "response stream ended inside a message", true);
		return;
	}
	if (status == RPC_OK && st->unary && st->nresp != 1) {
		stream_finish_x(st, RPC_INTERNAL, "no response message for a unary call", true);
		return;
	}
	stream_finish_x(st, status, st->grpc_message, true);
}

/* ---------------------------------------------------------------- submit */

static void stream_submit(struct rpc_stream *st, struct cconn *cc)
{
	struct rpc_client *c = st->c;
	char timeout[16];
	nghttp2_nv nva[9] = {
		NV(":method", "POST"),
		NV(":scheme", "http"),
		NVS(":path", st->stats->path),
		NVS(":authority", c->authority),
		NV("content-type", "application/grpc"),
		NV("te", "trailers"),
		NV("user-agent", RPC__USER_AGENT),
		NV("grpc-accept-encoding", "identity"),
	};
	size_t n = 8;
	if (st->timeout_ms) {
		uint64_t now = uv_now(c->loop);
		rpc_timeout_format(st->dl.at_ms > now ? st->dl.at_ms - now : 0, timeout,
				   sizeof(timeout));
		nva[n++] = (nghttp2_nv)NVS("grpc-timeout", timeout);
	}
	nghttp2_data_provider prd = {.source.ptr = &st->outq,
				     .read_callback = rpc__outq_read_cb};
	st->outq.deferred = false;
	int32_t id = nghttp2_submit_request(cc->base.ng, NULL, nva, n, &prd, st);
	if (id < 0) {
		stream_finish(st, RPC_INTERNAL, nghttp2_strerror(id));
		return;
	}
	st->stream_id = id;
	st->cc = cc;
	st->ng = true;
	st->refs++;
	slist_push(&cc->streams, st);
	st->where = W_CONN;
	if (cc->nstreams++ == 0)
		uv_ref((uv_handle_t *)&cc->base.tcp);
	rpc__conn_want_flush(&cc->base);
}

/* nghttp2 let go of the stream (closed, or HEADERS never sent). */
static void stream_ng_release(struct rpc_stream *st)
{
	if (!st->ng)
		return;
	st->ng = false;
	if (st->where == W_CONN)
		stream_unlink(st);
	st->cc = NULL;
	stream_unref(st);
}

/* Start st again on the channel's (new) connection: only for requests
 * the server cannot have acted on. */
static void stream_requeue(struct rpc_stream *st)
{
	stream_unlink(st);
	st->retries++;
	if (st->unary && st->outq.taken) {
		/* Its body already left: queue the kept request again. */
		rpc__outq_clear(&st->outq);
		st->req_msg->refs++;
		rpc__outq_push(&st->outq, st->req_msg);
		st->outq.taken = 0;
	}
	st->cc = NULL;
	st->stream_id = 0;
	st->opened = false;
	rpc_deframer_free(&st->df);
	rpc__deframer_setup(&st->df, st->c->max_msg, &st->c->bufs);
	client_route(st->c, st);
}

/* ---------------------------------------------------------------- nghttp2 callbacks */

static struct cconn *to_cconn(void *user_data)
{
	return MC_CONTAINER_OF((struct rpc__conn *)user_data, struct cconn, base);
}

#define NAME_IS(lit) (nlen == sizeof(lit) - 1 && memcmp(name, lit, nlen) == 0)

static int on_header(nghttp2_session *ng, const nghttp2_frame *frame,
		     const uint8_t *name, size_t nlen, const uint8_t *value,
		     size_t vlen, uint8_t flags, void *user_data)
{
	struct cconn *cc = to_cconn(user_data);
	if (cc->base.closing || frame->hd.type != NGHTTP2_HEADERS)
		return 0;
	struct rpc_stream *st = nghttp2_session_get_stream_user_data(ng, frame->hd.stream_id);
	if (!st || !st->user)
		return 0;
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
		st->ct_ok = vlen >= 16 && memcmp(value, "application/grpc", 16) == 0 &&
			    (vlen == 16 || value[16] == '+' || value[16] == ';');
	}
	return 0;
}

static int on_frame_recv(nghttp2_session *ng, const nghttp2_frame *frame,
			 void *user_data)
{
	struct cconn *cc = to_cconn(user_data);
	struct rpc_client *c = cc->c;
	struct rpc_stream *st;

	if (cc->base.closing)
		return 0;
	switch (frame->hd.type) {
	case NGHTTP2_HEADERS:
		st = nghttp2_session_get_stream_user_data(ng, frame->hd.stream_id);
		if (!st || !st->user)
			return 0;
		if (frame->headers.cat == NGHTTP2_HCAT_RESPONSE) {
			st->headers_recv = true;
			if (!(frame->hd.flags & NGHTTP2_FLAG_END_STREAM)) {
				if (st->http_status != 200) {
					char msg[64];
					snprintf(msg, sizeof(msg), "HTTP status %d from server",
						 st->http_status);
					stream_finish(st, rpc__status_from_http(st->http_status), msg);
				} else if (!st->ct_ok) {
					stream_finish(st, RPC_UNKNOWN,
						      "response content-type is not application/grpc");
				}
				return 0;
			}
		}
		if (frame->hd.flags & NGHTTP2_FLAG_END_STREAM)
			stream_trailers(st);
		break;
	case NGHTTP2_DATA:
		if (!(frame->hd.flags & NGHTTP2_FLAG_END_STREAM))
			break;
		st = nghttp2_session_get_stream_user_data(ng, frame->hd.stream_id);
		if (st && st->user)
			stream_finish_x(st, RPC_INTERNAL,
					"server ended the stream without trailers", true);
		break;
	case NGHTTP2_SETTINGS:
		if (!cc->got_settings && !(frame->hd.flags & NGHTTP2_FLAG_ACK)) {
			cc->got_settings = true;
			uv_timer_stop(&cc->base.timer);
			c->backoff_ms = c->backoff_initial_ms;
		}
		break;
	case NGHTTP2_GOAWAY:
		c->goaways++;
		cc->goaway = true;
		log_debug("%s: GOAWAY (last stream %d, %s)", c->label,
			  frame->goaway.last_stream_id,
			  nghttp2_http2_strerror(frame->goaway.error_code));
		if (c->cur == cc) {
			c->cur = NULL;
			c->state = CL_IDLE;
		}
		break;
	default:
		break;
	}
	return 0;
}

static int stream_on_msg(void *ud, const uint8_t *body, size_t len)
{
	struct rpc_stream *st = ud;
	if (st->unary && st->nresp) {
		stream_finish(st, RPC_INTERNAL, "more than one response message for a unary call");
		return -EPROTO;
	}
	struct rpc__arena ar;
	struct rpc__arena *a = st->unary ? &st->resp_arena : &ar;
	/* A response handed to the caller of unary_sync must be plain
	 * malloc memory: it frees it with protobuf_c_message_free_unpacked. */
	ProtobufCMessage *msg = rpc__unpack(st->resp_desc, body, len,
					    st->sync_out ? NULL : &st->c->bufs, a);
	if (!msg) {
		stream_finish(st, RPC_INTERNAL, "failed to parse response message");
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

static int on_data_chunk(nghttp2_session *ng, uint8_t flags, int32_t stream_id,
			 const uint8_t *data, size_t len, void *user_data)
{
	struct cconn *cc = to_cconn(user_data);
	if (cc->base.closing)
		return 0;
	struct rpc_stream *st = nghttp2_session_get_stream_user_data(ng, stream_id);
	if (!st || !st->user)
		return 0;
	st->refs++;
	int rc = rpc_deframer_feed(&st->df, data, len, stream_on_msg, st);
	if (rc == MC_ETOO_LARGE) {
		char msg[128];
		snprintf(msg, sizeof(msg), "received message larger than max (%zu vs. %zu)",
			 st->df.msg_len, st->df.max_message_bytes);
		stream_finish(st, RPC_RESOURCE_EXHAUSTED, msg);
	} else if (rc == -EPROTO && st->user) {
		stream_finish(st, RPC_INTERNAL, "compressed response but no compression was negotiated");
	} else if (rc == -ENOMEM) {
		stream_finish(st, RPC_RESOURCE_EXHAUSTED, "out of memory");
	}
	stream_unref(st);
	return 0;
}

static int on_stream_close(nghttp2_session *ng, int32_t stream_id,
			   uint32_t error_code, void *user_data)
{
	struct cconn *cc = to_cconn(user_data);
	if (cc->base.closing)
		return 0;
	struct rpc_stream *st = nghttp2_session_get_stream_user_data(ng, stream_id);
	if (!st)
		return 0;
	nghttp2_session_set_stream_user_data(ng, stream_id, NULL);
	/* nghttp2's reference becomes ours for the rest of this function. */
	st->ng = false;
	if (st->where == W_CONN)
		stream_unlink(st);
	if (st->user) {
		/* REFUSED_STREAM (a GOAWAY's last stream id, or the stream
		 * limit) means the server did not process it. */
		if (error_code == NGHTTP2_REFUSED_STREAM && !st->headers_recv &&
		    (st->outq.taken == 0 || st->unary) && st->retries < MAX_RETRIES &&
		    !cc->c->freeing) {
			stream_requeue(st);
		} else {
			char msg[256];
			int status = stream_status_on_close(st, error_code, msg, sizeof(msg));
			stream_finish(st, status, msg);
		}
	}
	stream_unref(st);
	return 0;
}

static int on_frame_not_send(nghttp2_session *ng, const nghttp2_frame *frame,
			     int lib_error_code, void *user_data)
{
	struct cconn *cc = to_cconn(user_data);
	if (cc->base.closing || frame->hd.type != NGHTTP2_HEADERS ||
	    frame->headers.cat != NGHTTP2_HCAT_REQUEST)
		return 0;
	struct rpc_stream *st = NULL;
	for (struct rpc_stream *p = cc->streams.head; p; p = p->next)
		if (p->stream_id == frame->hd.stream_id) {
			st = p;
			break;
		}
	if (!st)
		return 0;
	nghttp2_session_set_stream_user_data(ng, frame->hd.stream_id, NULL);
	st->ng = false; /* its reference is ours now */
	stream_unlink(st);
	if (st->user) {
		if (lib_error_code == NGHTTP2_ERR_START_STREAM_NOT_ALLOWED &&
		    st->retries < MAX_RETRIES && !cc->c->freeing)
			stream_requeue(st);
		else
			stream_finish(st, RPC_UNAVAILABLE, nghttp2_strerror(lib_error_code));
	}
	stream_unref(st);
	return 0;
}

static int on_frame_send(nghttp2_session *ng, const nghttp2_frame *frame,
			 void *user_data)
{
	if (frame->hd.type == NGHTTP2_HEADERS &&
	    frame->headers.cat == NGHTTP2_HCAT_REQUEST) {
		struct rpc_stream *st =
			nghttp2_session_get_stream_user_data(ng, frame->hd.stream_id);
		if (st)
			st->opened = true;
	}
	return 0;
}

/* ---------------------------------------------------------------- outq hooks */

static void on_outq_drain(struct rpc__outq *q)
{
	struct rpc_stream *st = MC_CONTAINER_OF(q, struct rpc_stream, outq);
	if (st->user && !st->unary && st->cbs->on_drain) {
		st->refs++;
		st->cbs->on_drain(st, st->ud);
		stream_unref(st);
	}
}

static const struct rpc__outq_ops stream_outq_ops = {
	.on_eof = NULL,
	.on_drain = on_outq_drain,
};

/* ---------------------------------------------------------------- connections */

static void fail_pending(struct rpc_client *c, int status, const char *msg)
{
	while (c->pending.head)
		stream_finish(c->pending.head, status, msg);
}

static void enter_backoff(struct rpc_client *c)
{
	/* xorshift64 from the seed taken at creation. */
	c->rng ^= c->rng << 13;
	c->rng ^= c->rng >> 7;
	c->rng ^= c->rng << 17;
	double jitter = 0.8 + 0.4 * (double)(c->rng >> 11) / (double)(1ull << 53);
	uint64_t delay = (uint64_t)((double)c->backoff_ms * jitter);
	c->state = CL_BACKOFF;
	log_info("%s: connect failed: %s; next attempt allowed in %llu ms", c->label,
		 uv_strerror(c->last_error), (unsigned long long)delay);
	uv_timer_start(&c->backoff_timer, on_backoff_timer, delay, 0);
	uint64_t next = (uint64_t)((double)c->backoff_ms * 1.6);
	c->backoff_ms = next > c->backoff_max_ms ? c->backoff_max_ms : next;
}

static void connect_failed(struct rpc_client *c, struct cconn *cc, int err)
{
	char msg[160];
	if (c->cur == cc)
		c->cur = NULL;
	rpc__conn_close(&cc->base);
	c->last_error = err;
	snprintf(msg, sizeof(msg), "connect to %s failed: %s", c->authority,
		 uv_strerror(err));
	enter_backoff(c);
	fail_pending(c, RPC_UNAVAILABLE, msg);
}

static void on_connect(uv_connect_t *req, int status)
{
	struct cconn *cc = MC_CONTAINER_OF(req, struct cconn, creq);
	struct rpc_client *c = cc->c;

	if (cc->base.closing)
		return;
	uv_timer_stop(&cc->base.timer);
	if (status < 0) {
		connect_failed(c, cc, status);
		return;
	}
	nghttp2_settings_entry iv[] = {
		{NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
		{NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, RPC__STREAM_WINDOW_BYTES},
		{NGHTTP2_SETTINGS_MAX_FRAME_SIZE, RPC__MAX_FRAME_BYTES},
		{NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, RPC__MAX_HEADER_LIST_BYTES},
	};
	int rc = rpc__conn_start(&cc->base, false, c->cbs, NULL, iv, MC_ARRAY_LEN(iv));
	if (rc < 0) {
		connect_failed(c, cc, rc == -ENOMEM ? UV_ENOMEM : rc);
		return;
	}
	cc->connected = true;
	c->connects++;
	c->state = CL_READY;
	/* Not a gRPC server until it says so. */
	uv_timer_start(&cc->base.timer, on_settings_timeout, c->connect_ms, 0);
	log_debug("%s: connected", c->label);
	while (c->pending.head) {
		struct rpc_stream *st = c->pending.head;
		stream_unlink(st);
		stream_submit(st, cc);
	}
	if (cc->nstreams == 0)
		uv_unref((uv_handle_t *)&cc->base.tcp);
}

static void on_settings_timeout(uv_timer_t *t)
{
	struct cconn *cc = MC_CONTAINER_OF(t, struct cconn, base.timer);
	struct rpc_client *c = cc->c;
	log_info("%s: connected, but no HTTP/2 SETTINGS from the server within %llu ms",
		 c->label, (unsigned long long)c->connect_ms);
	rpc__conn_close(&cc->base);
}

static void on_connect_timeout(uv_timer_t *t)
{
	struct cconn *cc = MC_CONTAINER_OF(t, struct cconn, base.timer);
	connect_failed(cc->c, cc, UV_ETIMEDOUT);
}

static void on_cconn_closed(struct rpc__conn *base)
{
	struct cconn *cc = MC_CONTAINER_OF(base, struct cconn, base);
	struct rpc_client *c = cc->c;

	if (c->cur == cc) {
		c->cur = NULL;
		if (c->state == CL_READY && !cc->got_settings && !c->freeing) {
			/* Accepted and dropped before any HTTP/2: as bad as a
			 * refused connect, so back off. */
			c->last_error = UV_ECONNRESET;
			enter_backoff(c);
		} else if (c->state == CL_READY || c->state == CL_CONNECTING) {
			c->state = CL_IDLE;
		}
	}
	while (cc->streams.head) {
		struct rpc_stream *st = cc->streams.head;
		st->refs++;
		stream_unlink(st);
		stream_finish(st, RPC_UNAVAILABLE, "connection to server lost");
		stream_ng_release(st);
		stream_unref(st);
	}
	rpc__conn_release(base);
	if (cc->prev)
		cc->prev->next = cc->next;
	else
		c->conns = cc->next;
	if (cc->next)
		cc->next->prev = cc->prev;
	c->nconns--;
	free(cc);
	client_check_freed(c);
}

static const struct rpc__conn_ops cconn_ops = {
	.on_closed = on_cconn_closed,
	.on_proto_error = NULL,
};

static void client_connect(struct rpc_client *c)
{
	struct cconn *cc = calloc(1, sizeof(*cc));
	int rc;

	if (!cc) {
		c->last_error = UV_ENOMEM;
		enter_backoff(c);
		return;
	}
	rc = rpc__conn_init(&cc->base, c->loop, &cconn_ops, c->label, c->rbuf);
	if (rc < 0) {
		free(cc);
		c->last_error = rc;
		enter_backoff(c);
		return;
	}
	cc->c = c;
	cc->next = c->conns;
	if (c->conns)
		c->conns->prev = cc;
	c->conns = cc;
	c->nconns++;
	c->cur = cc;
	c->state = CL_CONNECTING;
	rc = uv_tcp_connect(&cc->creq, &cc->base.tcp, (const struct sockaddr *)&c->addr,
			    on_connect);
	if (rc < 0) {
		c->cur = NULL;
		rpc__conn_close(&cc->base);
		c->last_error = rc;
		enter_backoff(c);
		return;
	}
	uv_timer_start(&cc->base.timer, on_connect_timeout, c->connect_ms, 0);
}

/* A unary call to a server of this loop: hand it over. */
static bool route_local(struct rpc_client *c, struct rpc_stream *st)
{
	struct rpc_server *s = rpc__server_local(c->loop, (const struct sockaddr *)&c->addr);
	if (!s || rpc__server_inproc_start(s, st->stats->path, st->req_msg, st->timeout_ms, st,
					   &st->icall) != 0)
		return false;
	st->refs++; /* the server's */
	slist_push(&c->inproc, st);
	st->where = W_INPROC;
	if (c->inproc_calls++ == 0)
		log_debug("%s: calls go to the server on this loop in-process", c->label);
	return true;
}

void rpc__client_inproc_done(struct rpc_stream *st, int status, const char *message,
			     const uint8_t *body, size_t len)
{
	struct rpc_client *c = st->c;
	st->icall = NULL;
	if (st->user) {
		if (status == RPC_OK && !body) {
			status = RPC_INTERNAL;
			message = "no response message for a unary call";
		} else if (status == RPC_OK && len > c->max_msg) {
			status = RPC_RESOURCE_EXHAUSTED;
			message = "received message larger than max";
		} else if (status == RPC_OK) {
			st->uresp = rpc__unpack(st->resp_desc, body, len,
						st->sync_out ? NULL : &c->bufs, &st->resp_arena);
			st->nresp = 1;
			if (!st->uresp) {
				status = RPC_INTERNAL;
				message = "failed to parse response message";
			}
		}
		stream_finish_later(st, status, message);
	}
	stream_unref(st); /* the server's */
}

static void client_route(struct rpc_client *c, struct rpc_stream *st)
{
	char msg[160];

	if (st->unary && c->local && route_local(c, st))
		return;
	if (c->state == CL_IDLE)
		client_connect(c);
	switch (c->state) {
	case CL_READY:
		stream_submit(st, c->cur);
		break;
	case CL_CONNECTING:
		slist_push(&c->pending, st);
		st->where = W_PENDING;
		break;
	case CL_BACKOFF:
	case CL_IDLE:
		snprintf(msg, sizeof(msg), "connect to %s failed: %s (waiting to retry)",
			 c->authority, uv_strerror(c->last_error));
		stream_finish_later(st, RPC_UNAVAILABLE, msg);
		break;
	}
}

static void on_backoff_timer(uv_timer_t *t)
{
	struct rpc_client *c = MC_CONTAINER_OF(t, struct rpc_client, backoff_timer);
	if (c->state == CL_BACKOFF)
		c->state = CL_IDLE;
}

/* ---------------------------------------------------------------- deadlines */

static void on_dl_timer(uv_timer_t *t)
{
	struct rpc_client *c = MC_CONTAINER_OF(t, struct rpc_client, dl_timer);
	uint64_t now = uv_now(c->loop);
	struct rpc__dl *d;

	while ((d = rpc__dlheap_top(&c->dl)) && d->at_ms <= now) {
		struct rpc_stream *st = MC_CONTAINER_OF(d, struct rpc_stream, dl);
		rpc__dlheap_del(&c->dl, d);
		stream_finish(st, RPC_DEADLINE_EXCEEDED, "deadline exceeded");
	}
	rpc__dlheap_arm(&c->dl, &c->dl_timer, on_dl_timer);
}

/* ---------------------------------------------------------------- public API */

int rpc_client_new(uv_loop_t *loop, const char *target,
		   const struct rpc_client_opts *opts, struct rpc_client **out)
{
	if (!target)
		return -EINVAL;
	if (strncmp(target, "http://", 7) == 0)
		target += 7;
	size_t tlen = strlen(target);
	if (tlen && target[tlen - 1] == '/')
		tlen--;
	char hostport[80];
	if (tlen == 0 || tlen >= sizeof(hostport))
		return -EINVAL;
	memcpy(hostport, target, tlen);
	hostport[tlen] = '\0';
	struct rpc_client *c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	if (mc_parse_hostport(hostport, &c->addr)) {
		free(c);
		return -EINVAL;
	}
	c->loop = loop;
	mc_format_addr((struct sockaddr *)&c->addr, c->authority, sizeof(c->authority));
	snprintf(c->label, sizeof(c->label), "client %s", c->authority);
	c->max_msg = opts && opts->max_message_bytes ? opts->max_message_bytes
						      : RPC__DEFAULT_MAX_MESSAGE_BYTES;
	c->connect_ms = opts && opts->connect_timeout_ms ? opts->connect_timeout_ms : 5000;
	c->backoff_initial_ms = opts && opts->backoff_initial_ms ? opts->backoff_initial_ms : 100;
	c->backoff_max_ms = opts && opts->backoff_max_ms ? opts->backoff_max_ms : 10000;
	if (c->backoff_max_ms < c->backoff_initial_ms)
		c->backoff_max_ms = c->backoff_initial_ms;
	c->backoff_ms = c->backoff_initial_ms;
	c->reg = opts && opts->metrics ? opts->metrics : metrics_global();
	c->local = opts && opts->local_calls;
	c->rng = uv_hrtime() ^ (uint64_t)(uintptr_t)c;
	if (!c->rng)
		c->rng = 0x9e3779b97f4a7c15ull;
	c->rbuf = malloc(RPC__READ_BUF_BYTES);
	if (!c->rbuf || nghttp2_session_callbacks_new(&c->cbs)) {
		free(c->rbuf);
		free(c);
		return -ENOMEM;
	}
	rpc__callbacks_init(c->cbs);
	nghttp2_session_callbacks_set_on_header_callback(c->cbs, on_header);
	nghttp2_session_callbacks_set_on_frame_recv_callback(c->cbs, on_frame_recv);
	nghttp2_session_callbacks_set_on_data_chunk_recv_callback(c->cbs, on_data_chunk);
	nghttp2_session_callbacks_set_on_stream_close_callback(c->cbs, on_stream_close);
	nghttp2_session_callbacks_set_on_frame_not_send_callback(c->cbs, on_frame_not_send);
	nghttp2_session_callbacks_set_on_frame_send_callback(c->cbs, on_frame_send);
	uv_timer_init(loop, &c->backoff_timer);
	uv_unref((uv_handle_t *)&c->backoff_timer);
	uv_timer_init(loop, &c->dl_timer);
	uv_idle_init(loop, &c->idle);
	c->handles_open = 3;
	*out = c;
	return 0;
}

static int stream_new(struct rpc_client *c, const char *path,
		      const ProtobufCMessageDescriptor *resp_desc,
		      uint64_t timeout_ms, struct rpc_stream **out)
{
	if (c->freeing || !path || path[0] != '/' || !resp_desc)
		return -EINVAL;
	struct rpc_stream *st = calloc(1, sizeof(*st));
	if (!st)
		return -ENOMEM;
	st->stats = stats_get(c, path);
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
	rpc__deframer_setup(&st->df, c->max_msg, &c->bufs);
	rpc__outq_init(&st->outq, &stream_outq_ops);
	rpc__dl_init(&st->dl);
	*out = st;
	return 0;
}

static void stream_start(struct rpc_stream *st)
{
	struct rpc_client *c = st->c;
	if (st->timeout_ms) {
		/* The loop's clock may be stale when called from outside a
		 * callback; a deadline must not start in the past. */
		uv_update_time(c->loop);
		st->dl.at_ms = uv_now(c->loop) + st->timeout_ms;
		if (rpc__dlheap_add(&c->dl, &st->dl)) {
			stream_finish_later(st, RPC_RESOURCE_EXHAUSTED, "out of memory");
			return;
		}
		if (rpc__dlheap_top(&c->dl) == &st->dl)
			rpc__dlheap_arm(&c->dl, &c->dl_timer, on_dl_timer);
	}
	client_route(c, st);
}

static int unary_start(struct rpc_client *c, const char *path,
		       const ProtobufCMessage *req,
		       const ProtobufCMessageDescriptor *resp_desc,
		       uint64_t timeout_ms, rpc_unary_cb cb, void *ud,
		       ProtobufCMessage **sync_out, struct rpc_stream **out)
{
	struct rpc__omsg *m;
	struct rpc_stream *st;
	int rc;

	if (!req)
		return -EINVAL;
	rc = stream_new(c, path, resp_desc, timeout_ms, &st);
	if (rc)
		return rc;
	rc = rpc__omsg_pack(req, c->max_msg, &c->bufs, &m);
	if (rc) {
		stream_unref(st);
		return rc;
	}
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
}

int rpc_client_unary(struct rpc_client *c, const char *path,
		     const ProtobufCMessage *req,
		     const ProtobufCMessageDescriptor *resp_desc,
		     uint64_t timeout_ms, rpc_unary_cb cb, void *ud,
		     struct rpc_stream **out)
{
	return unary_start(c, path, req, resp_desc, timeout_ms, cb, ud, NULL, out);
}

int rpc_client_stream(struct rpc_client *c, const char *path,
		      const ProtobufCMessageDescriptor *resp_desc,
		      uint64_t timeout_ms, const struct rpc_stream_cbs *cbs,
		      void *ud, struct rpc_stream **out)
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
	int rc = rpc__omsg_pack(msg, st->c->max_msg, &st->c->bufs, &m);
	if (rc)
		return rc;
	rpc__outq_push(&st->outq, m);
	if (stream_can_submit(st))
		rpc__conn_resume(&st->cc->base, st->stream_id, &st->outq);
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
	if (stream_can_submit(st))
		rpc__conn_resume(&st->cc->base, st->stream_id, &st->outq);
	return 0;
}

void rpc_stream_cancel(struct rpc_stream *st)
{
	if (!st || !st->user)
		return;
	struct rpc_client *c = st->c;
	st->user = false;
	rpc__dlheap_del(&c->dl, &st->dl);
	if (st->stats)
		stats_record(c, st->stats, RPC_CANCELLED, st->start_ns);
	if (st->where != W_CONN)
		stream_unlink(st);
	inproc_drop(st);
	if (stream_can_submit(st)) {
		nghttp2_submit_rst_stream(st->cc->base.ng, NGHTTP2_FLAG_NONE,
					  st->stream_id, NGHTTP2_CANCEL);
		rpc__conn_want_flush(&st->cc->base);
	}
	stream_unref(st);
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

int rpc_client_unary_sync(struct rpc_client *c, const char *path,
			  const ProtobufCMessage *req,
			  const ProtobufCMessageDescriptor *resp_desc,
			  uint64_t timeout_ms, ProtobufCMessage **resp,
			  char *errmsg, size_t errlen)
{
	struct sync_ctx x = {false, RPC_UNKNOWN, errmsg, errlen};
	ProtobufCMessage *got = NULL;

	if (errmsg && errlen)
		errmsg[0] = '\0';
	if (resp)
		*resp = NULL;
	int rc = unary_start(c, path, req, resp_desc, timeout_ms, on_sync_done, &x,
			     &got, NULL);
	if (rc) {
		if (errmsg && errlen)
			snprintf(errmsg, errlen, "%s", mc_strerror(rc));
		return rc == MC_ETOO_LARGE ? RPC_RESOURCE_EXHAUSTED : RPC_INVALID_ARGUMENT;
	}
	while (!x.done)
		if (uv_run(c->loop, UV_RUN_ONCE) == 0 && !x.done) {
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

static void on_client_handle_closed(uv_handle_t *h)
{
	struct rpc_client *c = h->data;
	c->handles_open--;
	client_check_freed(c);
}

static void client_check_freed(struct rpc_client *c)
{
	if (!c->freeing || c->handles_open || c->nconns)
		return;
	/* Streams still referenced only by nothing: all were finished and
	 * every connection is gone, so none are left. */
	for (size_t i = 0; i < STATS_BUCKETS; i++) {
		while (c->stats[i]) {
			struct cstats *s = c->stats[i];
			c->stats[i] = s->next;
			free(s->path);
			free(s);
		}
	}
	rpc__dlheap_free(&c->dl);
	rpc__bufcache_free(&c->bufs);
	nghttp2_session_callbacks_del(c->cbs);
	free(c->rbuf);
	free(c);
}

void rpc_client_free(struct rpc_client *c)
{
	if (!c || c->freeing)
		return;
	c->freeing = true;
	fail_pending(c, RPC_CANCELLED, "client closed");
	while (c->inproc.head)
		stream_finish(c->inproc.head, RPC_CANCELLED, "client closed");
	while (c->done_q.head)
		stream_finish(c->done_q.head, RPC_CANCELLED, "client closed");
	for (struct cconn *cc = c->conns; cc; cc = cc->next) {
		for (struct rpc_stream *st = cc->streams.head; st;) {
			struct rpc_stream *next = st->next;
			stream_finish(st, RPC_CANCELLED, "client closed");
			st = next;
		}
	}
	for (struct cconn *cc = c->conns; cc; cc = cc->next)
		rpc__conn_close(&cc->base);
	c->backoff_timer.data = c;
	c->dl_timer.data = c;
	c->idle.data = c;
	uv_close((uv_handle_t *)&c->backoff_timer, on_client_handle_closed);
	uv_close((uv_handle_t *)&c->dl_timer, on_client_handle_closed);
	uv_close((uv_handle_t *)&c->idle, on_client_handle_closed);
}

unsigned rpc__client_goaways(const struct rpc_client *c)
{
	return c->goaways;
}

unsigned rpc__client_connects(const struct rpc_client *c)
{
	return c->connects;
}

unsigned rpc__client_inproc_calls(const struct rpc_client *c)
{
	return c->inproc_calls;
}
