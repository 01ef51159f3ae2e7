/*
 * client: a gRPC channel to one server over one reused HTTP/2 connection
 * (rpc.h). Its calls are stream.c's, the HTTP/2 they travel by is
 * client_h2.c's (client_int.h).
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
 * it keep running, new calls open a new connection. A call the server
 * refused unprocessed is routed again (rpc__client_retry) at most
 * MAX_RETRIES times.
 *
 * With local_calls, a unary call whose target is a listener of a server
 * on this loop is handed to that server (rpc__server_inproc_start) and
 * kept on the inproc list; the server holds a stream reference until it
 * answers (rpc__client_inproc_done, delivered from the idle handle like a
 * local failure) or the call is cancelled.
 *
 * Every stream is on at most one of the channel's lists: pending (waiting
 * for the connection), a connection's, the done queue (final status
 * decided, delivered on the loop's next turn) or the in-process calls.
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

#define MAX_RETRIES 5

static const struct rpc__conn_ops cconn_ops;
static void on_backoff_timer(uv_timer_t *t);
static void on_settings_timeout(uv_timer_t *t);

/* ---------------------------------------------------------------- where streams are */

void rpc__client_unlink(struct rpc_stream *st)
{
	struct rpc_client *c = st->c;
	struct cconn *cc = st->rt.cc;
	switch (st->rt.where) {
	case RPC__W_PENDING:
		rpc__slist_del(&c->pending, st);
		break;
	case RPC__W_DONEQ:
		rpc__slist_del(&c->done_q, st);
		break;
	case RPC__W_INPROC:
		rpc__slist_del(&c->inproc, st);
		break;
	case RPC__W_CONN:
		rpc__slist_del(&cc->streams, st);
		cc->nstreams--;
		if (cc->nstreams == 0 && cc->connected && !cc->base.closing)
			uv_unref((uv_handle_t *)&cc->base.tcp);
		rpc__conn_forget_outq(&cc->base, &st->outq);
		st->rt.cc = NULL;
		break;
	case RPC__W_NONE:
		break;
	}
	st->rt.where = RPC__W_NONE;
}

static void push(struct rpc__slist *l, struct rpc_stream *st, enum rpc__where where)
{
	rpc__slist_push(l, st);
	st->rt.where = where;
}

void rpc__client_attach(struct rpc_stream *st, struct cconn *cc)
{
	push(&cc->streams, st, RPC__W_CONN);
	st->rt.cc = cc;
	if (cc->nstreams++ == 0)
		uv_ref((uv_handle_t *)&cc->base.tcp);
}

struct rpc_stream *rpc__client_conn_first(const struct cconn *cc)
{
	return cc->streams.head;
}

struct rpc_stream *rpc__client_conn_next(const struct rpc_stream *st)
{
	return st->rt.next;
}

/* The caller gives up an in-process call still with the server. The
 * caller holds a reference of its own. */
static void inproc_drop(struct rpc_stream *st)
{
	struct rpc_call *call = st->rt.icall;
	if (!call)
		return;
	st->rt.icall = NULL;
	rpc__server_inproc_cancel(call);
	st->refs--; /* the server's */
}

void rpc__client_detach(struct rpc_stream *st)
{
	if (st->rt.where != RPC__W_CONN)
		rpc__client_unlink(st);
	inproc_drop(st);
}

static void on_idle(uv_idle_t *h)
{
	struct rpc_client *c = MC_CONTAINER_OF(h, struct rpc_client, idle);
	uv_idle_stop(h);
	while (c->done_q.head) {
		struct rpc_stream *st = c->done_q.head;
		rpc__client_unlink(st);
		rpc__stream_finish_parked(st);
	}
}

void rpc__client_park(struct rpc_stream *st)
{
	struct rpc_client *c = st->c;
	push(&c->done_q, st, RPC__W_DONEQ);
	uv_idle_start(&c->idle, on_idle);
}

bool rpc__client_freeing(const struct rpc_client *c)
{
	return c->freeing;
}

const char *rpc__client_authority(const struct rpc_client *c)
{
	return c->authority;
}

/* ---------------------------------------------------------------- connections */

static void fail_pending(struct rpc_client *c, int status, const char *msg)
{
	while (c->pending.head)
		rpc__stream_finish(c->pending.head, status, msg, false);
}

static void enter_backoff(struct rpc_client *c)
{
	/* xorshift64 from the seed taken at creation. */
	c->rng ^= c->rng << 13;
	c->rng ^= c->rng >> 7;
	c->rng ^= c->rng << 17;
	double jitter = 0.8 + 0.4 * (double)(c->rng >> 11) / (double)(1ull << 53);
	uint64_t delay = (uint64_t)((double)c->backoff_ms * jitter);
	c->state = RPC__CL_BACKOFF;
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
	snprintf(msg, sizeof(msg), "connect to %s failed: %s", c->authority, uv_strerror(err));
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
	c->state = RPC__CL_READY;
	/* Not a gRPC server until it says so. */
	uv_timer_start(&cc->base.timer, on_settings_timeout, c->connect_ms, 0);
	log_debug("%s: connected", c->label);
	while (c->pending.head) {
		struct rpc_stream *st = c->pending.head;
		rpc__client_unlink(st);
		rpc__h2_submit(st, cc);
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

void rpc__client_on_settings(struct cconn *cc)
{
	if (cc->got_settings)
		return;
	cc->got_settings = true;
	uv_timer_stop(&cc->base.timer);
	cc->c->backoff_ms = cc->c->backoff_initial_ms;
}

void rpc__client_on_goaway(struct cconn *cc, const nghttp2_goaway *g)
{
	struct rpc_client *c = cc->c;
	c->goaways++;
	cc->goaway = true;
	log_debug("%s: GOAWAY (last stream %d, %s)", c->label, g->last_stream_id,
		  nghttp2_http2_strerror(g->error_code));
	if (c->cur == cc) {
		c->cur = NULL;
		c->state = RPC__CL_IDLE;
	}
}

static void on_cconn_closed(struct rpc__conn *base)
{
	struct cconn *cc = MC_CONTAINER_OF(base, struct cconn, base);
	struct rpc_client *c = cc->c;

	if (c->cur == cc) {
		c->cur = NULL;
		if (c->state == RPC__CL_READY && !cc->got_settings && !c->freeing) {
			/* Accepted and dropped before any HTTP/2: as bad as a
			 * refused connect, so back off. */
			c->last_error = UV_ECONNRESET;
			enter_backoff(c);
		} else if (c->state == RPC__CL_READY || c->state == RPC__CL_CONNECTING) {
			c->state = RPC__CL_IDLE;
		}
	}
	while (cc->streams.head) {
		struct rpc_stream *st = cc->streams.head;
		rpc__stream_ref(st);
		rpc__client_unlink(st);
		rpc__stream_finish(st, RPC_UNAVAILABLE, "connection to server lost", false);
		rpc__h2_release(st);
		rpc__stream_unref(st);
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
	rpc__client_check_freed(c);
}

static const struct rpc__conn_ops cconn_ops = {
	.on_closed = on_cconn_closed,
	.on_proto_error = NULL,
	.deframer = rpc__h2_deframer,
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
	/* Each connection proves the secret with a token of its own. */
	if (c->auth_key_len &&
	    (rc = mc_rpc_token(c->auth_key, c->auth_key_len, mc_wall_ms(), cc->token)) != 0) {
		log_error("%s: cannot make a token of the cluster secret: %s", c->label,
			  mc_strerror(rc));
		free(cc);
		c->last_error = rc;
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
	c->state = RPC__CL_CONNECTING;
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

static void on_backoff_timer(uv_timer_t *t)
{
	struct rpc_client *c = MC_CONTAINER_OF(t, struct rpc_client, backoff_timer);
	if (c->state == RPC__CL_BACKOFF)
		c->state = RPC__CL_IDLE;
}

/* ---------------------------------------------------------------- routing */

/* A unary call to a server of this loop: hand it over. */
static bool route_local(struct rpc_client *c, struct rpc_stream *st)
{
	struct rpc_server *s = rpc__server_local(c->loop, (const struct sockaddr *)&c->addr);
	if (!s || rpc__server_inproc_start(s, rpc__stream_path(st), st->req_msg,
					   st->timeout_ms, st, &st->rt.icall) != 0)
		return false;
	rpc__stream_ref(st); /* the server's */
	push(&c->inproc, st, RPC__W_INPROC);
	if (c->inproc_calls++ == 0)
		log_debug("%s: calls go to the server on this loop in-process", c->label);
	return true;
}

void rpc__client_inproc_done(struct rpc_stream *st, int status, const char *message,
			     const uint8_t *body, size_t len)
{
	st->rt.icall = NULL;
	rpc__stream_inproc_answer(st, status, message, body, len);
	rpc__stream_unref(st); /* the server's */
}

void rpc__client_route(struct rpc_client *c, struct rpc_stream *st)
{
	char msg[160];

	if (st->unary && c->local && route_local(c, st))
		return;
	if (c->state == RPC__CL_IDLE)
		client_connect(c);
	switch (c->state) {
	case RPC__CL_READY:
		rpc__h2_submit(st, c->cur);
		break;
	case RPC__CL_CONNECTING:
		push(&c->pending, st, RPC__W_PENDING);
		break;
	case RPC__CL_BACKOFF:
	case RPC__CL_IDLE:
		snprintf(msg, sizeof(msg), "connect to %s failed: %s (waiting to retry)",
			 c->authority, uv_strerror(c->last_error));
		rpc__stream_finish_later(st, RPC_UNAVAILABLE, msg);
		break;
	}
}

bool rpc__client_retry(struct rpc_stream *st)
{
	if (st->rt.retries >= MAX_RETRIES || st->c->freeing)
		return false;
	rpc__client_unlink(st);
	st->rt.retries++;
	rpc__stream_rewind(st);
	rpc__client_route(st->c, st);
	return true;
}

/* ---------------------------------------------------------------- the client */

int rpc_client_new(uv_loop_t *loop, const char *target, const struct rpc_client_opts *opts,
		   struct rpc_client **out)
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
	c->connect_ms = opts && opts->connect_timeout_ms ? opts->connect_timeout_ms : 5000;
	c->backoff_initial_ms = opts && opts->backoff_initial_ms ? opts->backoff_initial_ms
								 : 100;
	c->backoff_max_ms = opts && opts->backoff_max_ms ? opts->backoff_max_ms : 10000;
	if (c->backoff_max_ms < c->backoff_initial_ms)
		c->backoff_max_ms = c->backoff_initial_ms;
	c->backoff_ms = c->backoff_initial_ms;
	c->local = opts && opts->local_calls;
	if (opts && opts->auth_key_len) {
		c->auth_key = malloc(opts->auth_key_len);
		if (!c->auth_key) {
			free(c);
			return -ENOMEM;
		}
		memcpy(c->auth_key, opts->auth_key, opts->auth_key_len);
		c->auth_key_len = opts->auth_key_len;
	}
	c->rng = uv_hrtime() ^ (uint64_t)(uintptr_t)c;
	if (!c->rng)
		c->rng = 0x9e3779b97f4a7c15ull;
	c->rbuf = malloc(RPC__READ_BUF_BYTES);
	if (!c->rbuf || nghttp2_session_callbacks_new(&c->cbs)) {
		free(c->rbuf);
		free(c->auth_key);
		free(c);
		return -ENOMEM;
	}
	rpc__h2_callbacks(c->cbs);
	uv_timer_init(loop, &c->backoff_timer);
	uv_unref((uv_handle_t *)&c->backoff_timer);
	rpc__streams_init(&c->ss, loop,
			  opts && opts->max_message_bytes ? opts->max_message_bytes
							  : RPC__DEFAULT_MAX_MESSAGE_BYTES,
			  opts && opts->metrics ? opts->metrics : metrics_global());
	uv_idle_init(loop, &c->idle);
	c->handles_open = 3;
	*out = c;
	return 0;
}

static void on_client_handle_closed(uv_handle_t *h)
{
	struct rpc_client *c = h->data;
	c->handles_open--;
	rpc__client_check_freed(c);
}

void rpc__client_check_freed(struct rpc_client *c)
{
	if (!c->freeing || c->handles_open || c->nconns)
		return;
	/* Streams still referenced only by nothing: all were finished and
	 * every connection is gone, so none are left. */
	rpc__streams_free(&c->ss);
	nghttp2_session_callbacks_del(c->cbs);
	free(c->rbuf);
	if (c->auth_key)
		memset(c->auth_key, 0, c->auth_key_len);
	free(c->auth_key);
	free(c);
}

void rpc_client_free(struct rpc_client *c)
{
	if (!c || c->freeing)
		return;
	c->freeing = true;
	fail_pending(c, RPC_CANCELLED, "client closed");
	while (c->inproc.head)
		rpc__stream_finish(c->inproc.head, RPC_CANCELLED, "client closed", false);
	while (c->done_q.head)
		rpc__stream_finish(c->done_q.head, RPC_CANCELLED, "client closed", false);
	for (struct cconn *cc = c->conns; cc; cc = cc->next) {
		for (struct rpc_stream *st = cc->streams.head; st;) {
			struct rpc_stream *next = st->rt.next;
			rpc__stream_finish(st, RPC_CANCELLED, "client closed", false);
			st = next;
		}
	}
	for (struct cconn *cc = c->conns; cc; cc = cc->next)
		rpc__conn_close(&cc->base);
	c->backoff_timer.data = c;
	c->idle.data = c;
	uv_close((uv_handle_t *)&c->backoff_timer, on_client_handle_closed);
	rpc__streams_close(&c->ss, c, on_client_handle_closed);
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
