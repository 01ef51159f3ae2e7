/*
 * ctl_bench: `mooncakectl bench rpc` — what the RPC layer costs on this
 * machine, measured beside the machine's own limit in the same run.
 *
 * Three client patterns, each run for --duration against two servers:
 *   - unary Echo of a 32-byte payload, 1 call in flight;
 *   - the same with 64 calls in flight on the one connection;
 *   - Echo of a --size payload (16 MiB), 1 in flight: the message goes
 *     to the server and comes back, and GB/s counts both directions'
 *     payload bytes.
 * The servers: mooncake.diag.Diag over our gRPC stack (in process on its
 * own thread and loop, or a daemon started with --diag-service given by
 * --target), and a plain libuv TCP echo server with 4-byte length
 * framing (always in process, own thread and loop) that, like the gRPC
 * server, receives each message whole before sending it back. The client
 * runs on the calling thread with its own loop and one connection per
 * server, and drives both with the same pattern; each figure is printed
 * beside the TCP one and their ratio. Nothing here is an assertion.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "common/cfg.h"
#include "common/endian.h"
#include "common/metrics.h"
#include "common/util.h"
#include "ctl/ctl_int.h"
#include "diag.pb-c.h"
#include "rpc/rpc.h"

#define SMALL_PAYLOAD_BYTES 32
#define MANY_STREAMS 64
#define READ_BUF_BYTES (256u << 10)
#define CALL_TIMEOUT_MS 60000

struct result {
	double calls_per_s, p50_us, p99_us, gbps;
	double cpu_us; /* client and server thread CPU per call; < 0: unknown */
	uint64_t calls;
	bool ok;
	char err[256];
};

/* ---------------------------------------------------------------- server threads */

struct tconn {
	uv_tcp_t tcp;
	struct tconn *next, **pprev;
	uint8_t hdr[4];
	size_t hdr_len;
	uint8_t *frame; /* 4-byte header + body, handed to the write */
	size_t flen, fgot;
	size_t fcap;
	uint8_t *spare; /* a written frame's buffer, kept for the next one */
	size_t spare_cap;
	uint8_t rbuf[READ_BUF_BYTES];
};

struct srv_thread {
	pthread_t tid;
	uv_loop_t loop;
	uv_async_t stop;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool ready;
	int port;
	char err[128];
	bool tcp; /* TCP echo instead of gRPC */
	size_t max_msg;
	struct metrics_registry *reg;
	struct rpc_server *rpc;
	uv_tcp_t listener;
	struct tconn *conns;
};

static void srv_ready(struct srv_thread *t, int port, const char *err)
{
	pthread_mutex_lock(&t->mu);
	t->port = port;
	if (err)
		snprintf(t->err, sizeof(t->err), "%s", err);
	t->ready = true;
	pthread_cond_signal(&t->cv);
	pthread_mutex_unlock(&t->mu);
}

struct twrite {
	uv_write_t req;
	struct tconn *c;
	uint8_t *frame;
	size_t cap;
};

/* Written (or cancelled before the close callback): the buffer is kept
 * for the next frame, as the gRPC side recycles its large buffers. */
static void on_echo_written(uv_write_t *req, int status)
{
	struct twrite *w = MC_CONTAINER_OF(req, struct twrite, req);
	struct tconn *c = w->c;
	if (!c->spare) {
		c->spare = w->frame;
		c->spare_cap = w->cap;
	} else {
		free(w->frame);
	}
	free(w);
}

static void tconn_closed(uv_handle_t *h)
{
	struct tconn *c = MC_CONTAINER_OF((uv_tcp_t *)h, struct tconn, tcp);
	free(c->frame);
	free(c->spare);
	free(c);
}

static void tconn_close(struct tconn *c)
{
	if (uv_is_closing((uv_handle_t *)&c->tcp))
		return;
	*c->pprev = c->next;
	if (c->next)
		c->next->pprev = c->pprev;
	uv_close((uv_handle_t *)&c->tcp, tconn_closed);
}

static void tconn_alloc(uv_handle_t *h, size_t sz, uv_buf_t *b)
{
	struct tconn *c = MC_CONTAINER_OF((uv_tcp_t *)h, struct tconn, tcp);
	*b = uv_buf_init((char *)c->rbuf, sizeof(c->rbuf));
}

static void tconn_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
	struct tconn *c = MC_CONTAINER_OF((uv_tcp_t *)s, struct tconn, tcp);
	const uint8_t *p = (const uint8_t *)b->base;
	size_t len = n > 0 ? (size_t)n : 0;

	if (n < 0) {
		tconn_close(c);
		return;
	}
	while (len) {
		if (c->hdr_len < 4) {
			size_t k = MC_MIN(4 - c->hdr_len, len);
			memcpy(c->hdr + c->hdr_len, p, k);
			c->hdr_len += k;
			p += k;
			len -= k;
			if (c->hdr_len < 4)
				break;
			c->flen = mc_get_be32(c->hdr);
			if (c->spare && c->spare_cap >= 4 + c->flen) {
				c->frame = c->spare;
				c->fcap = c->spare_cap;
				c->spare = NULL;
			} else {
				c->frame = malloc(4 + c->flen);
				c->fcap = 4 + c->flen;
			}
			if (!c->frame) {
				tconn_close(c);
				return;
			}
			memcpy(c->frame, c->hdr, 4);
			c->fgot = 0;
		}
		size_t k = MC_MIN(c->flen - c->fgot, len);
		memcpy(c->frame + 4 + c->fgot, p, k);
		c->fgot += k;
		p += k;
		len -= k;
		if (c->fgot < c->flen)
			break;
		struct twrite *w = malloc(sizeof(*w));
		if (!w) {
			tconn_close(c);
			return;
		}
		w->c = c;
		w->frame = c->frame;
		w->cap = c->fcap;
		c->frame = NULL;
		c->hdr_len = 0;
		uv_buf_t wb = uv_buf_init((char *)w->frame, (unsigned)(4 + c->flen));
		if (uv_write(&w->req, s, &wb, 1, on_echo_written)) {
			free(w->frame);
			free(w);
			tconn_close(c);
			return;
		}
	}
}

static void on_tcp_conn(uv_stream_t *ls, int status)
{
	struct srv_thread *t = MC_CONTAINER_OF((uv_tcp_t *)ls, struct srv_thread, listener);
	if (status < 0)
		return;
	struct tconn *c = calloc(1, sizeof(*c));
	if (!c)
		return;
	uv_tcp_init(&t->loop, &c->tcp);
	c->next = t->conns;
	if (t->conns)
		t->conns->pprev = &c->next;
	c->pprev = &t->conns;
	t->conns = c;
	if (uv_accept(ls, (uv_stream_t *)&c->tcp) == 0) {
		uv_tcp_nodelay(&c->tcp, 1);
		uv_read_start((uv_stream_t *)&c->tcp, tconn_alloc, tconn_read);
	} else {
		tconn_close(c);
	}
}

static void on_rpc_done(struct rpc_server *s, void *ud)
{
	rpc_server_free(s);
}

static void on_stop(uv_async_t *a)
{
	struct srv_thread *t = MC_CONTAINER_OF(a, struct srv_thread, stop);
	if (t->tcp) {
		while (t->conns)
			tconn_close(t->conns);
		uv_close((uv_handle_t *)&t->listener, NULL);
	} else if (t->rpc) {
		rpc_server_shutdown(t->rpc, 1000, on_rpc_done, NULL);
	}
	uv_close((uv_handle_t *)a, NULL);
}

static void *srv_main(void *arg)
{
	struct srv_thread *t = arg;
	struct sockaddr_storage ss;
	int len = sizeof(ss), rc;

	if (t->tcp) {
		uv_tcp_init(&t->loop, &t->listener);
		rc = mc_parse_hostport("127.0.0.1:0", &ss) ? UV_EINVAL : 0;
		if (rc == 0)
			rc = uv_tcp_bind(&t->listener, (struct sockaddr *)&ss, 0);
		if (rc == 0)
			rc = uv_listen((uv_stream_t *)&t->listener, 64, on_tcp_conn);
		if (rc == 0)
			rc = uv_tcp_getsockname(&t->listener, (struct sockaddr *)&ss, &len);
		if (rc) {
			srv_ready(t, 0, uv_strerror(rc));
			uv_close((uv_handle_t *)&t->listener, NULL);
			uv_close((uv_handle_t *)&t->stop, NULL);
			uv_run(&t->loop, UV_RUN_DEFAULT);
			return NULL;
		}
		srv_ready(t, ntohs(((struct sockaddr_in *)&ss)->sin_port), NULL);
	} else {
		struct rpc_server_opts o = {
			.name = "bench", .max_message_bytes = t->max_msg, .metrics = t->reg};
		rc = rpc_server_new(&t->loop, &o, &t->rpc);
		if (rc == 0)
			rc = rpc_diag_add(t->rpc);
		if (rc == 0)
			rc = rpc_server_listen(t->rpc, "127.0.0.1:0");
		if (rc) {
			srv_ready(t, 0, mc_strerror(rc));
			if (t->rpc)
				rpc_server_shutdown(t->rpc, 0, on_rpc_done, NULL);
			uv_close((uv_handle_t *)&t->stop, NULL);
			uv_run(&t->loop, UV_RUN_DEFAULT);
			return NULL;
		}
		srv_ready(t, rpc_server_port(t->rpc, 0), NULL);
	}
	uv_run(&t->loop, UV_RUN_DEFAULT);
	return NULL;
}

static int srv_start(struct srv_thread *t, bool tcp, size_t max_msg)
{
	memset(t, 0, sizeof(*t));
	t->tcp = tcp;
	t->max_msg = max_msg;
	t->reg = metrics_registry_new();
	pthread_mutex_init(&t->mu, NULL);
	pthread_cond_init(&t->cv, NULL);
	if (!t->reg || uv_loop_init(&t->loop))
		return -ENOMEM;
	uv_async_init(&t->loop, &t->stop, on_stop);
	if (pthread_create(&t->tid, NULL, srv_main, t)) {
		uv_close((uv_handle_t *)&t->stop, NULL);
		uv_run(&t->loop, UV_RUN_DEFAULT);
		uv_loop_close(&t->loop);
		return -EAGAIN;
	}
	pthread_mutex_lock(&t->mu);
	while (!t->ready)
		pthread_cond_wait(&t->cv, &t->mu);
	pthread_mutex_unlock(&t->mu);
	return t->port ? 0 : -EADDRNOTAVAIL;
}

static void srv_stop(struct srv_thread *t)
{
	if (t->port)
		uv_async_send(&t->stop);
	pthread_join(t->tid, NULL);
	uv_loop_close(&t->loop);
	metrics_registry_free(t->reg);
	pthread_mutex_destroy(&t->mu);
	pthread_cond_destroy(&t->cv);
}

/* ---------------------------------------------------------------- CPU per call */

/* CPU time of the client thread (this one) and of the server's thread
 * (srv NULL: a server in another process, not counted), so that a
 * figure can be compared on a loaded machine, where calls/s swing with
 * what else runs but the CPU a call costs does not. */
struct cpu_mark {
	uint64_t client_ns, server_ns;
	bool server;
};

static void cpu_mark(struct cpu_mark *m, const struct srv_thread *srv)
{
	m->client_ns = ctl_thread_cpu_ns(pthread_self());
	m->server_ns = srv ? ctl_thread_cpu_ns(srv->tid) : 0;
	m->server = m->server_ns != 0;
}

static void cpu_per_call(struct result *r, const struct cpu_mark *a,
			 const struct srv_thread *srv)
{
	struct cpu_mark b;
	cpu_mark(&b, srv);
	if (!r->calls || !a->server || !b.server) {
		r->cpu_us = -1;
		return;
	}
	r->cpu_us = (double)(b.client_ns - a->client_ns + b.server_ns - a->server_ns) / 1e3 /
		    (double)r->calls;
}

/* ---------------------------------------------------------------- gRPC client pattern */

struct gbench;

struct gslot {
	struct gbench *b;
	uint64_t t0;
};

struct gbench {
	struct rpc_client *c;
	uint64_t end_ns;
	Mooncake__Diag__EchoRequest req;
	struct ctl_lat lat;
	unsigned inflight;
	uint64_t calls, bytes, last_ns;
	bool stop;
	bool lend;     /* lend the payload to the calls instead of copying it */
	unsigned lent; /* calls that have not released the payload yet */
	int err_status;
	char err[256];
};

static void g_issue(struct gslot *s);

static void g_on_released(void *ctx, void *buf, size_t len)
{
	struct gbench *b = ctx;
	b->lent--;
}

static void g_on_done(void *ud, int status, const char *message, const ProtobufCMessage *resp)
{
	struct gslot *s = ud;
	struct gbench *b = s->b;
	uint64_t now = uv_hrtime();

	if (status != RPC_OK) {
		if (!b->err_status) {
			b->err_status = status;
			snprintf(b->err, sizeof(b->err), "%s: %s", rpc_status_name(status),
				 message);
		}
		b->stop = true;
		b->inflight--;
		return;
	}
	const Mooncake__Diag__EchoResponse *r = (const void *)resp;
	ctl_lat_add(&b->lat, now - s->t0);
	b->calls++;
	b->bytes += b->req.payload.len + r->payload.len;
	b->last_ns = now;
	if (!b->stop && now < b->end_ns)
		g_issue(s);
	else
		b->inflight--;
}

static void g_issue(struct gslot *s)
{
	struct gbench *b = s->b;
	int rc;
	s->t0 = uv_hrtime();
	if (b->lend) {
		struct rpc_lend l = {
			.buf = b->req.payload.data,
			.len = b->req.payload.len,
			.release = g_on_released,
			.ctx = b,
		};
		rc = rpc_client_unary_lend(b->c, "/mooncake.diag.Diag/Echo", &b->req.base, &l,
					   &mooncake__diag__echo_response__descriptor,
					   CALL_TIMEOUT_MS, g_on_done, s, NULL);
		b->lent += rc == 0;
	} else {
		rc = rpc_client_unary(b->c, "/mooncake.diag.Diag/Echo", &b->req.base,
				      &mooncake__diag__echo_response__descriptor,
				      CALL_TIMEOUT_MS, g_on_done, s, NULL);
	}
	if (rc) {
		if (!b->err_status) {
			b->err_status = RPC_INTERNAL;
			snprintf(b->err, sizeof(b->err), "%s", mc_strerror(rc));
		}
		b->stop = true;
		b->inflight--;
	}
}

/* lend: the calls borrow payload (rpc_client_unary_lend) instead of
 * serializing a copy of it, as a sender of large values does. */
static void run_grpc(uv_loop_t *loop, struct rpc_client *c, const struct srv_thread *srv,
		     unsigned conc, uint8_t *payload, size_t len, bool lend,
		     uint64_t duration_ms, struct result *out)
{
	struct gbench b = {.c = c, .lend = lend};
	struct gslot *slots = calloc(conc, sizeof(*slots));
	memset(out, 0, sizeof(*out));
	if (!slots) {
		snprintf(out->err, sizeof(out->err), "out of memory");
		return;
	}
	mooncake__diag__echo_request__init(&b.req);
	b.req.payload.data = payload;
	b.req.payload.len = len;
	for (unsigned i = 0; i < conc; i++)
		slots[i].b = &b;
	/* Warm-up, untimed: one call per slot, so that the buffers a call
	 * of this size needs exist before the clock starts. */
	b.end_ns = 0;
	b.inflight = conc;
	for (unsigned i = 0; i < conc; i++)
		g_issue(&slots[i]);
	while (b.inflight)
		uv_run(loop, UV_RUN_ONCE);
	ctl_lat_free(&b.lat);
	memset(&b.lat, 0, sizeof(b.lat));
	b.calls = b.bytes = b.last_ns = 0;

	struct cpu_mark m;
	cpu_mark(&m, srv);
	uint64_t t0 = uv_hrtime();
	b.end_ns = t0 + duration_ms * 1000000ull;
	b.inflight = b.stop ? 0 : conc;
	for (unsigned i = 0; i < b.inflight; i++)
		g_issue(&slots[i]);
	while (b.inflight)
		uv_run(loop, UV_RUN_ONCE);
	double secs = (double)((b.last_ns > t0 ? b.last_ns : uv_hrtime()) - t0) / 1e9;
	out->ok = b.err_status == 0 && b.calls > 0;
	snprintf(out->err, sizeof(out->err), "%s", b.err);
	out->calls = b.calls;
	cpu_per_call(out, &m, srv);
	out->calls_per_s = secs > 0 ? (double)b.calls / secs : 0;
	out->gbps = secs > 0 ? (double)b.bytes / secs / 1e9 : 0;
	out->p50_us = ctl_lat_pct_us(&b.lat, 0.50);
	out->p99_us = ctl_lat_pct_us(&b.lat, 0.99);
	ctl_lat_free(&b.lat);
	free(slots);
	/* The payload is the caller's again once every call released it. */
	while (b.lent && uv_run(loop, UV_RUN_ONCE))
		;
	if (b.lent) {
		out->ok = false;
		snprintf(out->err, sizeof(out->err), "%u calls never released the payload",
			 b.lent);
	}
}

/* ---------------------------------------------------------------- TCP client pattern */

struct twreq {
	uv_write_t req;
	struct twreq *next;
};

struct tbench {
	uv_loop_t *loop;
	uv_tcp_t tcp;
	uv_connect_t creq;
	int connect_status;
	bool connected, closed, failed;
	uint64_t end_ns;
	const uint8_t *payload;
	size_t len;
	uint8_t hdr[4];
	uint64_t *t0s; /* send times of the requests in flight, FIFO */
	size_t ring, head, count;
	struct twreq *wfree;
	uint8_t rh[4];
	size_t rh_len, rlen, rgot;
	uint8_t *rbody;
	size_t rcap;
	struct ctl_lat lat;
	unsigned inflight;
	uint64_t calls, bytes, last_ns;
	bool stop;
	uint8_t rbuf[READ_BUF_BYTES];
};

static void t_on_written(uv_write_t *req, int status)
{
	struct tbench *b = req->data;
	struct twreq *w = MC_CONTAINER_OF(req, struct twreq, req);
	w->next = b->wfree;
	b->wfree = w;
	if (status < 0)
		b->failed = b->stop = true;
}

static void t_send(struct tbench *b)
{
	struct twreq *w = b->wfree;
	if (!w) {
		b->failed = b->stop = true;
		b->inflight--;
		return;
	}
	b->wfree = w->next;
	uv_buf_t bufs[2] = {uv_buf_init((char *)b->hdr, 4),
			    uv_buf_init((char *)b->payload, (unsigned)b->len)};
	w->req.data = b;
	b->t0s[(b->head + b->count++) % b->ring] = uv_hrtime();
	if (uv_write(&w->req, (uv_stream_t *)&b->tcp, bufs, b->len ? 2 : 1, t_on_written)) {
		w->next = b->wfree;
		b->wfree = w;
		b->count--;
		b->failed = b->stop = true;
		b->inflight--;
	}
}

static void t_response(struct tbench *b)
{
	uint64_t now = uv_hrtime();
	uint64_t t0 = b->t0s[b->head];
	b->head = (b->head + 1) % b->ring;
	b->count--;
	ctl_lat_add(&b->lat, now - t0);
	b->calls++;
	b->bytes += b->len + b->rlen;
	b->last_ns = now;
	if (!b->stop && now < b->end_ns)
		t_send(b);
	else
		b->inflight--;
}

static void t_alloc(uv_handle_t *h, size_t sz, uv_buf_t *buf)
{
	struct tbench *b = MC_CONTAINER_OF((uv_tcp_t *)h, struct tbench, tcp);
	*buf = uv_buf_init((char *)b->rbuf, sizeof(b->rbuf));
}

static void t_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
	struct tbench *b = MC_CONTAINER_OF((uv_tcp_t *)s, struct tbench, tcp);
	const uint8_t *p = (const uint8_t *)buf->base;
	size_t len = n > 0 ? (size_t)n : 0;
	if (n < 0) {
		b->failed = b->stop = true;
		b->inflight = 0;
		uv_read_stop(s);
		return;
	}
	while (len) {
		if (b->rh_len < 4) {
			size_t k = MC_MIN(4 - b->rh_len, len);
			memcpy(b->rh + b->rh_len, p, k);
			b->rh_len += k;
			p += k;
			len -= k;
			if (b->rh_len < 4)
				break;
			b->rlen = mc_get_be32(b->rh);
			b->rgot = 0;
			if (b->rlen > b->rcap) {
				b->failed = b->stop = true;
				b->inflight = 0;
				uv_read_stop(s);
				return;
			}
		}
		/* Received whole into a buffer, as a real message would be. */
		size_t k = MC_MIN(b->rlen - b->rgot, len);
		memcpy(b->rbody + b->rgot, p, k);
		b->rgot += k;
		p += k;
		len -= k;
		if (b->rgot < b->rlen)
			break;
		b->rh_len = 0;
		t_response(b);
	}
}

static void t_connected(uv_connect_t *req, int status)
{
	struct tbench *b = MC_CONTAINER_OF(req, struct tbench, creq);
	b->connect_status = status;
	b->connected = true;
	if (status == 0) {
		uv_tcp_nodelay(&b->tcp, 1);
		uv_read_start((uv_stream_t *)&b->tcp, t_alloc, t_read);
	}
}

static void t_closed(uv_handle_t *h)
{
	struct tbench *b = MC_CONTAINER_OF((uv_tcp_t *)h, struct tbench, tcp);
	b->closed = true;
}

static void run_tcp(uv_loop_t *loop, const struct srv_thread *srv, unsigned conc,
		    const uint8_t *payload, size_t len, uint64_t duration_ms,
		    struct result *out)
{
	struct tbench *b = calloc(1, sizeof(*b));
	struct twreq *wr = calloc(conc, sizeof(*wr));
	struct sockaddr_in a;
	memset(out, 0, sizeof(*out));
	if (!b || !wr) {
		free(b);
		free(wr);
		snprintf(out->err, sizeof(out->err), "out of memory");
		return;
	}
	b->loop = loop;
	b->payload = payload;
	b->len = len;
	b->ring = conc;
	b->t0s = calloc(conc, sizeof(*b->t0s));
	b->rcap = len;
	b->rbody = malloc(len ? len : 1);
	for (unsigned i = 0; i < conc; i++) {
		wr[i].next = b->wfree;
		b->wfree = &wr[i];
	}
	mc_put_be32(b->hdr, (uint32_t)len);
	uv_ip4_addr("127.0.0.1", srv->port, &a);
	uv_tcp_init(loop, &b->tcp);
	if (!b->t0s || !b->rbody ||
	    uv_tcp_connect(&b->creq, &b->tcp, (struct sockaddr *)&a, t_connected)) {
		snprintf(out->err, sizeof(out->err), "cannot connect");
		goto out_close;
	}
	while (!b->connected)
		uv_run(loop, UV_RUN_ONCE);
	if (b->connect_status) {
		snprintf(out->err, sizeof(out->err), "connect: %s",
			 uv_strerror(b->connect_status));
		goto out_close;
	}
	/* Warm-up, untimed, on the same connection: one call per slot. */
	b->end_ns = 0;
	b->inflight = conc;
	for (unsigned i = 0; i < conc; i++)
		t_send(b);
	while (b->inflight)
		uv_run(loop, UV_RUN_ONCE);
	ctl_lat_free(&b->lat);
	memset(&b->lat, 0, sizeof(b->lat));
	b->calls = b->bytes = b->last_ns = 0;

	struct cpu_mark m;
	cpu_mark(&m, srv);
	uint64_t t0 = uv_hrtime();
	b->end_ns = t0 + duration_ms * 1000000ull;
	b->inflight = b->stop ? 0 : conc;
	for (unsigned i = 0; i < b->inflight; i++)
		t_send(b);
	while (b->inflight)
		uv_run(loop, UV_RUN_ONCE);
	double secs = (double)((b->last_ns > t0 ? b->last_ns : uv_hrtime()) - t0) / 1e9;
	out->ok = !b->failed && b->calls > 0;
	if (b->failed)
		snprintf(out->err, sizeof(out->err), "connection failed");
	out->calls = b->calls;
	cpu_per_call(out, &m, srv);
	out->calls_per_s = secs > 0 ? (double)b->calls / secs : 0;
	out->gbps = secs > 0 ? (double)b->bytes / secs / 1e9 : 0;
	out->p50_us = ctl_lat_pct_us(&b->lat, 0.50);
	out->p99_us = ctl_lat_pct_us(&b->lat, 0.99);
out_close:
	uv_close((uv_handle_t *)&b->tcp, t_closed);
	while (!b->closed)
		uv_run(loop, UV_RUN_ONCE);
	ctl_lat_free(&b->lat);
	free(b->t0s);
	free(b->rbody);
	free(b);
	free(wr);
}

/* ---------------------------------------------------------------- report */

static void fmt_fig(char *buf, size_t len, const struct result *r, double v)
{
	if (!r->ok)
		snprintf(buf, len, "%12s", "failed");
	else if (v >= 1000)
		snprintf(buf, len, "%12.0f", v);
	else
		snprintf(buf, len, "%12.2f", v);
}

static void row(const char *pattern, const char *unit, const struct result *g,
		const struct result *t, double gv, double tv)
{
	char a[32], b[32], ratio[32];
	fmt_fig(a, sizeof(a), g, gv);
	fmt_fig(b, sizeof(b), t, tv);
	if (g->ok && t->ok && tv > 0)
		snprintf(ratio, sizeof(ratio), "%10.2f", gv / tv);
	else
		snprintf(ratio, sizeof(ratio), "%10s", "-");
	printf("%-20s %-10s %s %s %s\n", pattern, unit, a, b, ratio);
}

static void report(const char *name, const struct result *g, const struct result *t,
		   bool throughput)
{
	if (throughput) {
		row(name, "GB/s", g, t, g->gbps, t->gbps);
	} else {
		row(name, "calls/s", g, t, g->calls_per_s, t->calls_per_s);
		row("", "p50 us", g, t, g->p50_us, t->p50_us);
		row("", "p99 us", g, t, g->p99_us, t->p99_us);
	}
	if (g->cpu_us >= 0 && t->cpu_us >= 0)
		row("", "CPU us/call", g, t, g->cpu_us, t->cpu_us);
	if (!g->ok)
		fprintf(stderr, "mooncakectl bench rpc: %s over gRPC failed: %s\n", name,
			g->err);
	if (!t->ok)
		fprintf(stderr, "mooncakectl bench rpc: %s over TCP failed: %s\n", name,
			t->err);
	fflush(stdout);
}

/* "unary,streams,large" (any of them, in any order) as bits 0, 1, 2.
 * Errors: -EINVAL (an unknown or empty name). */
static int parse_patterns(const char *s, unsigned *out)
{
	static const char *const known[] = {"unary", "streams", "large"};
	unsigned bits = 0;
	while (*s) {
		size_t n = strcspn(s, ",");
		int k = -1;
		for (int i = 0; i < 3; i++)
			if (strlen(known[i]) == n && strncmp(s, known[i], n) == 0)
				k = i;
		if (k < 0)
			return -EINVAL;
		bits |= 1u << k;
		s += n;
		if (*s == ',' && !*++s)
			return -EINVAL;
	}
	if (!bits)
		return -EINVAL;
	*out = bits;
	return 0;
}

static void bench_usage(FILE *f)
{
	fprintf(f,
		"usage: mooncakectl bench rpc [--target=HOST:PORT] [--duration=3s] [--size=16M]\n"
		"                             [--patterns=unary,streams,large]\n\n"
		"  --target=HOST:PORT  a mooncaked started with --diag-service (default: an\n"
		"                      in-process server on 127.0.0.1:0 on its own thread);\n"
		"                      one with a cluster secret is sent its token when\n"
		"                      $MOONCAKE_CLUSTER_SECRET_FILE names the secret\n"
		"  --duration=DURATION how long each figure is measured\n"
		"  --size=SIZE         payload of the large-message echo\n"
		"  --patterns=LIST     which to run (default all): unary (1 call in flight),\n"
		"                      streams (%d in flight), large (the --size echo)\n\n"
		"Unary calls/s and p50/p99 latency with 1 and %d calls in flight on one\n"
		"connection, and large-message echo throughput, each beside the same pattern\n"
		"against a plain libuv TCP echo server (4-byte length framing) in this process,\n"
		"and the ratio gRPC/TCP, and the CPU time a call costs the client's and the\n"
		"in-process server's threads (steadier than calls/s on a loaded machine).\n"
		"Figures are measurements, never pass/fail.\n",
		MANY_STREAMS, MANY_STREAMS);
}

int ctl_bench_main(int argc, char **argv)
{
	const char *target = NULL, *dur_s = "3s", *size_s = "16M", *patterns_s = NULL, *v;
	unsigned patterns = 7;
	uint64_t duration_ms, size;

	if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
		bench_usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? CTL_EXIT_USAGE : CTL_EXIT_OK;
	}
	if (strcmp(argv[1], "master") == 0)
		return ctl_bench_master_main(argc - 1, argv + 1);
	if (strcmp(argv[1], "resync") == 0)
		return ctl_bench_resync_main(argc - 1, argv + 1);
	if (strcmp(argv[1], "store") == 0)
		return ctl_bench_store_main(argc - 1, argv + 1);
	if (strcmp(argv[1], "ssd") == 0)
		return ctl_bench_ssd_main(argc - 1, argv + 1);
	if (strcmp(argv[1], "sessions") == 0)
		return ctl_bench_sessions_main(argc - 1, argv + 1);
	if (strcmp(argv[1], "meta") == 0)
		return ctl_bench_meta_main(argc - 1, argv + 1);
	if (strcmp(argv[1], "transfer") == 0)
		return ctl_bench_transfer_main(argc - 1, argv + 1);
	if (strcmp(argv[1], "rpc") != 0) {
		fprintf(stderr,
			"mooncakectl bench: unknown benchmark \"%s\" (try: rpc, master, resync, meta, transfer, store, sessions, ssd)\n",
			argv[1]);
		return CTL_EXIT_USAGE;
	}
	for (int i = 2; i < argc; i++) {
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			bench_usage(stdout);
			return CTL_EXIT_OK;
		} else if (ctl_flag_value(argc, argv, &i, "target", &v)) {
			target = v;
		} else if (ctl_flag_value(argc, argv, &i, "duration", &v)) {
			dur_s = v;
		} else if (ctl_flag_value(argc, argv, &i, "size", &v)) {
			size_s = v;
		} else if (ctl_flag_value(argc, argv, &i, "patterns", &v)) {
			patterns_s = v;
		} else {
			fprintf(stderr, "mooncakectl bench rpc: unknown argument \"%s\"\n",
				argv[i]);
			bench_usage(stderr);
			return CTL_EXIT_USAGE;
		}
	}
	if (!dur_s || cfg_parse_duration_ms(dur_s, &duration_ms) || duration_ms == 0) {
		fprintf(stderr,
			"mooncakectl bench rpc: bad --duration (want e.g. 500ms, 3s)\n");
		return CTL_EXIT_USAGE;
	}
	if (!size_s || cfg_parse_size(size_s, &size) || size == 0 || size > (1ull << 30)) {
		fprintf(stderr, "mooncakectl bench rpc: bad --size (want 1..1G, e.g. 16M)\n");
		return CTL_EXIT_USAGE;
	}
	if (target && !*target) {
		fprintf(stderr, "mooncakectl bench rpc: empty --target\n");
		return CTL_EXIT_USAGE;
	}
	if (patterns_s && parse_patterns(patterns_s, &patterns)) {
		fprintf(stderr,
			"mooncakectl bench rpc: bad --patterns \"%s\" (want a comma-separated "
			"list of unary, streams, large)\n",
			patterns_s);
		return CTL_EXIT_USAGE;
	}

	int rc = CTL_EXIT_FAIL;
	size_t max_msg = (size_t)size + (1u << 20);
	struct srv_thread rpc_srv, tcp_srv;
	bool rpc_started = false, tcp_started = false;
	char target_buf[64];
	uv_loop_t loop;
	struct rpc_client *cli = NULL;
	uint8_t *big = malloc(size);
	uint8_t small[SMALL_PAYLOAD_BYTES];
	struct result g[3], t[3];
	struct metrics_registry *reg = NULL;

	if (!big || uv_loop_init(&loop)) {
		fprintf(stderr, "mooncakectl bench rpc: out of memory\n");
		free(big);
		return CTL_EXIT_FAIL;
	}
	for (size_t i = 0; i < size; i++)
		big[i] = (uint8_t)(i * 131 + 7);
	memset(small, 'x', sizeof(small));

	if (srv_start(&tcp_srv, true, max_msg)) {
		fprintf(stderr, "mooncakectl bench rpc: TCP echo server: %s\n", tcp_srv.err);
		goto out;
	}
	tcp_started = true;
	if (!target) {
		if (srv_start(&rpc_srv, false, max_msg)) {
			fprintf(stderr, "mooncakectl bench rpc: gRPC server: %s\n",
				rpc_srv.err);
			rpc_started = true;
			goto out;
		}
		rpc_started = true;
		snprintf(target_buf, sizeof(target_buf), "127.0.0.1:%d", rpc_srv.port);
		target = target_buf;
	}
	reg = metrics_registry_new();
	struct rpc_client_opts co = {.max_message_bytes = max_msg, .metrics = reg};
	/* A daemon's server may want the cluster secret's token
	 * (ctl_rpc_client, which prints its errors). */
	int crc = target != target_buf ? ctl_rpc_client(&loop, target, &co, &cli)
				       : rpc_client_new(&loop, target, &co, &cli);
	if (crc) {
		if (target == target_buf)
			fprintf(stderr, "mooncakectl bench rpc: %s\n", mc_strerror(crc));
		rc = crc == -EINVAL ? CTL_EXIT_USAGE : CTL_EXIT_FAIL;
		goto out;
	}

	printf("mooncakectl bench rpc: gRPC (mooncake rpc, HTTP/2 cleartext) vs plain TCP echo\n"
	       "  (libuv, 4-byte length framing), loopback, client on this thread\n");
	printf("  gRPC server: %s%s\n", target,
	       rpc_started ? " (in process, own thread and loop)"
			   : " (mooncaked --diag-service)");
	printf("  TCP echo:    127.0.0.1:%d (in process, own thread and loop)\n",
	       tcp_srv.port);
	printf("  %.1f s per figure; unary payload %d B; large message %llu bytes; one connection\n"
	       "  per server; ratio = gRPC / TCP (above 1 is faster for calls/s and GB/s,\n"
	       "  slower for latency)\n\n",
	       (double)duration_ms / 1000, SMALL_PAYLOAD_BYTES, (unsigned long long)size);
	printf("%-20s %-10s %12s %12s %10s\n", "pattern", "figure", "gRPC", "TCP echo",
	       "ratio");

	const struct srv_thread *gs = rpc_started ? &rpc_srv : NULL;
	/* Warm-up: connections made, allocator and caches primed. */
	run_grpc(&loop, cli, gs, 1, small, sizeof(small), false, MC_MIN(duration_ms, 200),
		 &g[0]);
	if (!g[0].ok) {
		fprintf(stderr, "mooncakectl bench rpc: %s: %s\n", target, g[0].err);
		goto out_client;
	}
	run_tcp(&loop, &tcp_srv, 1, small, sizeof(small), MC_MIN(duration_ms, 200), &t[0]);

	static const char *const names[] = {"unary, 1 stream", "unary, 64 streams"};
	const unsigned conc[] = {1, MANY_STREAMS, 1};
	bool ok = true;
	for (int i = 0; i < 3; i++) {
		if (!(patterns & (1u << i)))
			continue;
		uint8_t *p = i < 2 ? small : big;
		size_t len = i < 2 ? sizeof(small) : size;
		run_grpc(&loop, cli, gs, conc[i], p, len, i == 2, duration_ms, &g[i]);
		run_tcp(&loop, &tcp_srv, conc[i], p, len, duration_ms, &t[i]);
		ok = ok && g[i].ok && t[i].ok;
		if (i < 2) {
			report(names[i], &g[i], &t[i], false);
			continue;
		}
		char name[32];
		if (size % (1u << 20) == 0)
			snprintf(name, sizeof(name), "%llu MiB echo",
				 (unsigned long long)(size >> 20));
		else
			snprintf(name, sizeof(name), "%llu B echo", (unsigned long long)size);
		report(name, &g[i], &t[i], true);
		printf("\n  %s: %.1f round trips/s, p50 %.2f ms; GB/s counts request and response\n"
		       "  payload bytes (1 GB = 1e9 bytes), one message in flight\n",
		       name, g[i].calls_per_s, g[i].p50_us / 1000);
	}
	printf("  CPU us/call: the client's and the in-process server's threads, per call\n");
	rc = ok ? CTL_EXIT_OK : CTL_EXIT_FAIL;
out_client:
	rpc_client_free(cli);
	uv_run(&loop, UV_RUN_DEFAULT);
out:
	metrics_registry_free(reg);
	if (rpc_started)
		srv_stop(&rpc_srv);
	if (tcp_started)
		srv_stop(&tcp_srv);
	uv_loop_close(&loop);
	free(big);
	return rc;
}
