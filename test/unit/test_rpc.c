/*
 * test_rpc: the RPC layer end to end, in process — a server and a client
 * on one libuv loop on 127.0.0.1:0. Every call kind, 16 MiB messages,
 * deadlines on each side, size limits each way, UNIMPLEMENTED, hundreds of
 * concurrent streams, reconnect, graceful shutdown with GOAWAY, health,
 * and raw-socket abuse (the server must keep answering).
 *
 * Tests drive the loop until the condition they wait for holds; a 20 ms
 * tick only keeps uv_run from blocking forever so that a missing event
 * fails the test instead of hanging it. Each fixture ends by closing the
 * loop, which fails on a leaked handle.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <nghttp2/nghttp2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <unistd.h>
#include <uv.h>

#include "common/buf.h"
#include "common/metrics.h"
#include "common/util.h"
#include "diag.pb-c.h"
#include "health.pb-c.h"
#include "rpc/rpc.h"
#include "rpc/rpc_int.h"
#include "test_rand.h"

#define MiB (1u << 20)
#define WAIT_MS 15000

/* ---------------------------------------------------------------- the Hold test service */

/* test.Hold/Hold: a unary method whose calls stay open until the test
 * releases them, so tests can count, drain and cancel in-flight calls. */
struct hold {
	struct rpc_call *calls[1024];
	unsigned n, live, max_live, cancels, started;
	char trace[64]; /* x-trace-id of the last call */
	char peer[64];
	uint64_t deadline_ms;
};

static void hold_on_message(struct rpc_call *call, const ProtobufCMessage *msg)
{
	struct hold *h = rpc_call_service_data(call);
	cr_assert(h->n < 1024);
	rpc_call_set_data(call, (void *)(uintptr_t)h->n);
	h->calls[h->n++] = call;
	h->started++;
	const char *t = rpc_call_header(call, "X-Trace-Id");
	snprintf(h->trace, sizeof(h->trace), "%s", t ? t : "");
	snprintf(h->peer, sizeof(h->peer), "%s", rpc_call_peer(call));
	h->deadline_ms = rpc_call_deadline_ms(call);
	cr_assert_eq(rpc_call_loop(call) != NULL, true);
	cr_assert_not(rpc_call_cancelled(call));
	if (++h->live > h->max_live)
		h->max_live = h->live;
}

static void hold_on_cancel(struct rpc_call *call)
{
	struct hold *h = rpc_call_service_data(call);
	h->calls[(uintptr_t)rpc_call_data(call)] = NULL;
	h->cancels++;
	h->live--;
	rpc_call_finish(call, RPC_CANCELLED, NULL);
}

static void hold_release(struct hold *h, int status)
{
	for (unsigned i = 0; i < h->n; i++) {
		struct rpc_call *call = h->calls[i];
		if (!call)
			continue;
		h->calls[i] = NULL;
		h->live--;
		if (status == RPC_OK) {
			Mooncake__Diag__EchoResponse r = MOONCAKE__DIAG__ECHO_RESPONSE__INIT;
			r.payload.data = (uint8_t *)"held";
			r.payload.len = 4;
			cr_assert_eq(rpc_call_send(call, &r.base), 0);
		}
		rpc_call_finish(call, status, status ? "released" : NULL);
	}
}

static const struct rpc_method hold_methods[] = {
	{
		.name = "Hold",
		.kind = RPC_UNARY,
		.request = &mooncake__diag__echo_request__descriptor,
		.response = &mooncake__diag__echo_response__descriptor,
		.on_message = hold_on_message,
		.on_cancel = hold_on_cancel,
	},
};

/* ---------------------------------------------------------------- fixture */

struct fx {
	uv_loop_t loop;
	uv_timer_t tick;
	struct metrics_registry *reg;
	struct rpc_server *srv;
	struct rpc_health *health;
	struct hold hold;
	struct rpc_client *cli;
	int port;
	char target[64];
};

static void on_tick(uv_timer_t *t)
{
}

/* Run the loop until expr holds (fail after WAIT_MS). */
#define RUN_UNTIL(f, expr) \
	do { \
		uint64_t end_ = mc_now_ms() + WAIT_MS; \
		uv_timer_start(&(f)->tick, on_tick, 20, 20); \
		while (!(expr)) { \
			cr_assert(mc_now_ms() < end_, "timed out waiting for: %s", #expr); \
			uv_run(&(f)->loop, UV_RUN_ONCE); \
		} \
		uv_timer_stop(&(f)->tick); \
	} while (0)

static struct rpc_server *mk_server(struct fx *f, const struct rpc_server_opts *o, int port,
				    bool with_diag, struct rpc_health **health)
{
	struct rpc_server_opts def = {.name = "test", .max_message_bytes = 64 * MiB};
	struct rpc_server *s;
	char addr[64];
	if (!o)
		o = &def;
	struct rpc_server_opts opts = *o;
	opts.metrics = f->reg;
	cr_assert_eq(rpc_server_new(&f->loop, &opts, &s), 0);
	struct rpc_health *h;
	cr_assert_eq(rpc_health_add(s, &h), 0);
	if (health)
		*health = h;
	if (with_diag)
		cr_assert_eq(rpc_diag_add(s), 0);
	cr_assert_eq(rpc_server_add_service(s, "test.Hold", hold_methods, 1, &f->hold), 0);
	snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
	cr_assert_eq(rpc_server_listen(s, addr), 0);
	return s;
}

static struct rpc_client *mk_client(struct fx *f, const struct rpc_client_opts *o)
{
	struct rpc_client_opts opts = {.max_message_bytes = 64 * MiB};
	struct rpc_client *c;
	if (o)
		opts = *o;
	opts.metrics = f->reg;
	cr_assert_eq(rpc_client_new(&f->loop, f->target, &opts, &c), 0);
	return c;
}

static void fx_init(struct fx *f, const struct rpc_server_opts *so,
		    const struct rpc_client_opts *co)
{
	memset(f, 0, sizeof(*f));
	cr_assert_eq(uv_loop_init(&f->loop), 0);
	uv_timer_init(&f->loop, &f->tick);
	f->reg = metrics_registry_new();
	f->srv = mk_server(f, so, 0, true, &f->health);
	f->port = rpc_server_port(f->srv, 0);
	cr_assert(f->port > 0);
	snprintf(f->target, sizeof(f->target), "127.0.0.1:%d", f->port);
	f->cli = mk_client(f, co);
}

static void on_srv_done(struct rpc_server *s, void *ud)
{
	*(bool *)ud = true;
}

static void stop_server(struct fx *f, struct rpc_server *s, uint64_t drain_ms)
{
	bool done = false;
	rpc_server_shutdown(s, drain_ms, on_srv_done, &done);
	RUN_UNTIL(f, done);
	rpc_server_free(s);
}

static void on_walk(uv_handle_t *h, void *arg)
{
	fprintf(stderr, "leaked handle: %s\n", uv_handle_type_name(h->type));
}

static void fx_fini(struct fx *f)
{
	if (f->cli)
		rpc_client_free(f->cli);
	f->cli = NULL;
	hold_release(&f->hold, RPC_CANCELLED);
	if (f->srv)
		stop_server(f, f->srv, 1000);
	f->srv = NULL;
	uv_close((uv_handle_t *)&f->tick, NULL);
	uv_run(&f->loop, UV_RUN_DEFAULT);
	int rc = uv_loop_close(&f->loop);
	if (rc)
		uv_walk(&f->loop, on_walk, NULL);
	cr_assert_eq(rc, 0, "handles left open");
	metrics_registry_free(f->reg);
}

/* ---------------------------------------------------------------- unary helpers */

struct ures {
	bool done;
	int status;
	char msg[512];
	uint8_t *payload;
	size_t len;
	int ncb;
};

static void on_unary(void *ud, int status, const char *message, const ProtobufCMessage *resp)
{
	struct ures *r = ud;
	r->ncb++;
	r->done = true;
	r->status = status;
	snprintf(r->msg, sizeof(r->msg), "%s", message);
	cr_assert_eq(resp != NULL, status == RPC_OK);
	if (resp) {
		const Mooncake__Diag__EchoResponse *e = (const void *)resp;
		free(r->payload);
		r->payload = malloc(e->payload.len + 1);
		if (e->payload.len)
			memcpy(r->payload, e->payload.data, e->payload.len);
		r->len = e->payload.len;
	}
}

static void ures_free(struct ures *r)
{
	free(r->payload);
	r->payload = NULL;
}

static void echo_start(struct fx *f, struct rpc_client *c, const char *path,
		       const Mooncake__Diag__EchoRequest *req, uint64_t timeout_ms,
		       struct ures *r)
{
	memset(r, 0, sizeof(*r));
	cr_assert_eq(rpc_client_unary(c, path, &req->base,
				      &mooncake__diag__echo_response__descriptor, timeout_ms,
				      on_unary, r, NULL),
		     0);
	cr_assert_not(r->done, "callback ran inside rpc_client_unary");
}

static int echo(struct fx *f, const void *payload, size_t len, struct ures *r)
{
	Mooncake__Diag__EchoRequest req = MOONCAKE__DIAG__ECHO_REQUEST__INIT;
	req.payload.data = (uint8_t *)payload;
	req.payload.len = len;
	echo_start(f, f->cli, "/mooncake.diag.Diag/Echo", &req, 0, r);
	RUN_UNTIL(f, r->done);
	return r->status;
}

struct hres {
	bool done;
	int status;
	int serving;
};

static void on_health(void *ud, int status, const char *m, const ProtobufCMessage *resp)
{
	struct hres *x = ud;
	x->done = true;
	x->status = status;
	if (resp)
		x->serving = ((const Grpc__Health__V1__HealthCheckResponse *)resp)->status;
}

/* Check(service): the serving status, or minus the gRPC status. */
static int health_check(struct fx *f, struct rpc_client *c, const char *service)
{
	Grpc__Health__V1__HealthCheckRequest req =
		GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
	struct hres x = {0};
	req.service = (char *)service;
	cr_assert_eq(rpc_client_unary(c, "/grpc.health.v1.Health/Check", &req.base,
				      &grpc__health__v1__health_check_response__descriptor,
				      5000, on_health, &x, NULL),
		     0);
	RUN_UNTIL(f, x.done);
	return x.status == RPC_OK ? x.serving : -x.status;
}

static double metric_of(struct fx *f, const char *needle)
{
	struct mc_buf b = MC_BUF_INIT;
	cr_assert_eq(metrics_format(f->reg, &b), 0);
	const char *p = b.data ? strstr(b.data, needle) : NULL;
	double v = p ? strtod(p + strlen(needle), NULL) : -1;
	mc_buf_free(&b);
	return v;
}

/* ---------------------------------------------------------------- call kinds */

Test(rpc, unary_echo_and_metrics)
{
	struct fx f;
	struct ures r;
	fx_init(&f, NULL, NULL);
	cr_assert_eq(echo(&f, "hello", 5, &r), RPC_OK, "%s", r.msg);
	cr_assert_eq(r.len, 5);
	cr_assert(memcmp(r.payload, "hello", 5) == 0);
	ures_free(&r);
	cr_assert_eq(echo(&f, "", 0, &r), RPC_OK); /* empty message */
	cr_assert_eq(r.len, 0);
	ures_free(&r);
	cr_assert_eq(r.ncb, 1);
	cr_assert_eq(rpc__client_connects(f.cli), 1);
	cr_assert_eq(metric_of(&f, "mooncake_rpc_server_calls_total{server=\"test\","
				   "method=\"/mooncake.diag.Diag/Echo\",code=\"OK\"} "),
		     2);
	cr_assert_eq(metric_of(&f, "mooncake_rpc_client_calls_total{method="
				   "\"/mooncake.diag.Diag/Echo\",code=\"OK\"} "),
		     2);
	cr_assert_eq(metric_of(&f, "mooncake_rpc_server_call_duration_seconds_count{server="
				   "\"test\",method=\"/mooncake.diag.Diag/Echo\"} "),
		     2);
	cr_assert_eq(metric_of(&f, "mooncake_rpc_server_connections{server=\"test\"} "), 1);
	fx_fini(&f);
}

Test(rpc, status_and_message_in_trailers)
{
	struct fx f;
	struct ures r;
	fx_init(&f, NULL, NULL);
	Mooncake__Diag__EchoRequest req = MOONCAKE__DIAG__ECHO_REQUEST__INIT;
	req.status = RPC_FAILED_PRECONDITION;
	req.message = "not ready: 100% \"busy\"\n\tcaf\xc3\xa9";
	echo_start(&f, f.cli, "/mooncake.diag.Diag/Echo", &req, 0, &r);
	RUN_UNTIL(&f, r.done);
	cr_assert_eq(r.status, RPC_FAILED_PRECONDITION);
	cr_assert_str_eq(r.msg, req.message);
	cr_assert_eq(metric_of(&f, "code=\"FAILED_PRECONDITION\"} "), 1);
	fx_fini(&f);
}

struct sres {
	bool closed;
	int status;
	char msg[256];
	unsigned nmsg;
	uint64_t bytes;
	bool pattern_ok;
	uint64_t fnv;
	int drains;
	struct rpc_stream *st;
};

static void dl_on_message(struct rpc_stream *st, void *ud, const ProtobufCMessage *msg)
{
	struct sres *r = ud;
	const Mooncake__Diag__Chunk *c = (const void *)msg;
	for (size_t i = 0; i < c->data.len; i++)
		if (c->data.data[i] != (uint8_t)((r->bytes + i) % 251))
			r->pattern_ok = false;
	r->bytes += c->data.len;
	r->nmsg++;
}

static void s_on_close(struct rpc_stream *st, void *ud, int status, const char *message)
{
	struct sres *r = ud;
	cr_assert_not(r->closed, "on_close twice");
	r->closed = true;
	r->status = status;
	snprintf(r->msg, sizeof(r->msg), "%s", message);
}

static const struct rpc_stream_cbs dl_cbs = {.on_message = dl_on_message,
					     .on_close = s_on_close};

static void download(struct fx *f, uint64_t total, uint32_t chunk, struct sres *r)
{
	Mooncake__Diag__DownloadRequest req = MOONCAKE__DIAG__DOWNLOAD_REQUEST__INIT;
	memset(r, 0, sizeof(*r));
	r->pattern_ok = true;
	req.total_bytes = total;
	req.chunk_bytes = chunk;
	cr_assert_eq(rpc_client_stream(f->cli, "/mooncake.diag.Diag/Download",
				       &mooncake__diag__chunk__descriptor, 0, &dl_cbs, r,
				       &r->st),
		     0);
	cr_assert_eq(rpc_stream_send(r->st, &req.base), 0);
	cr_assert_eq(rpc_stream_close_send(r->st), 0);
	cr_assert_eq(rpc_stream_send(r->st, &req.base), -EPIPE);
	RUN_UNTIL(f, r->closed);
}

Test(rpc, server_streaming_download)
{
	struct fx f;
	struct sres r;
	fx_init(&f, NULL, NULL);
	download(&f, 1000000, 10000, &r);
	cr_assert_eq(r.status, RPC_OK, "%s", r.msg);
	cr_assert_eq(r.bytes, 1000000);
	cr_assert_eq(r.nmsg, 100);
	cr_assert(r.pattern_ok);
	/* Larger than the drain threshold many times over: paced by on_drain. */
	download(&f, 40 * MiB + 7, 256 * 1024, &r);
	cr_assert_eq(r.status, RPC_OK, "%s", r.msg);
	cr_assert_eq(r.bytes, 40 * MiB + 7);
	cr_assert(r.pattern_ok);
	download(&f, 0, 0, &r); /* no messages at all */
	cr_assert_eq(r.status, RPC_OK);
	cr_assert_eq(r.nmsg, 0);
	fx_fini(&f);
}

static void up_on_message(struct rpc_stream *st, void *ud, const ProtobufCMessage *msg)
{
	struct sres *r = ud;
	const Mooncake__Diag__UploadSummary *s = (const void *)msg;
	r->nmsg++;
	r->bytes = s->total_bytes;
	r->fnv = s->checksum;
	r->drains = (int)s->messages;
}

static const struct rpc_stream_cbs up_cbs = {.on_message = up_on_message,
					     .on_close = s_on_close};

static uint64_t fnv(uint64_t h, const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		h ^= p[i];
		h *= 0x100000001b3ull;
	}
	return h;
}

Test(rpc, client_streaming_upload)
{
	struct fx f;
	struct sres r = {0};
	fx_init(&f, NULL, NULL);
	cr_assert_eq(rpc_client_stream(f.cli, "/mooncake.diag.Diag/Upload",
				       &mooncake__diag__upload_summary__descriptor, 0, &up_cbs,
				       &r, &r.st),
		     0);
	uint8_t buf[3000];
	uint64_t h = 0xcbf29ce484222325ull, total = 0;
	for (int i = 0; i < 50; i++) {
		Mooncake__Diag__Chunk c = MOONCAKE__DIAG__CHUNK__INIT;
		size_t n = (size_t)(i * 61 % 3000);
		for (size_t j = 0; j < n; j++)
			buf[j] = (uint8_t)(i ^ j);
		c.data.data = buf;
		c.data.len = n;
		cr_assert_eq(rpc_stream_send(r.st, &c.base), 0);
		h = fnv(h, buf, n);
		total += n;
		if (i % 10 == 0)
			uv_run(&f.loop, UV_RUN_NOWAIT); /* interleave with the loop */
	}
	cr_assert_eq(rpc_stream_close_send(r.st), 0);
	cr_assert_eq(rpc_stream_close_send(r.st), -EPIPE);
	RUN_UNTIL(&f, r.closed);
	cr_assert_eq(r.status, RPC_OK, "%s", r.msg);
	cr_assert_eq(r.nmsg, 1);
	cr_assert_eq(r.bytes, total);
	cr_assert_eq(r.drains, 50);
	cr_assert_eq(r.fnv, h);
	fx_fini(&f);
}

struct bidi {
	struct sres r;
	unsigned next_expected;
	bool order_ok;
};

static void bidi_on_message(struct rpc_stream *st, void *ud, const ProtobufCMessage *msg)
{
	struct bidi *b = ud;
	const Mooncake__Diag__EchoResponse *e = (const void *)msg;
	unsigned v;
	if (e->payload.len != sizeof(v)) {
		b->order_ok = false;
		return;
	}
	memcpy(&v, e->payload.data, sizeof(v));
	if (v != b->next_expected++)
		b->order_ok = false;
	b->r.nmsg++;
}

static void bidi_on_close(struct rpc_stream *st, void *ud, int status, const char *m)
{
	s_on_close(st, &((struct bidi *)ud)->r, status, m);
}

static const struct rpc_stream_cbs bidi_cbs = {.on_message = bidi_on_message,
					       .on_close = bidi_on_close};

Test(rpc, bidi_echo_stream)
{
	struct fx f;
	struct bidi b = {.order_ok = true};
	fx_init(&f, NULL, NULL);
	cr_assert_eq(rpc_client_stream(f.cli, "/mooncake.diag.Diag/EchoStream",
				       &mooncake__diag__echo_response__descriptor, 0,
				       &bidi_cbs, &b, &b.r.st),
		     0);
	/* Ping-pong: each reply arrives before the next request is sent. */
	for (unsigned i = 0; i < 20; i++) {
		Mooncake__Diag__EchoRequest req = MOONCAKE__DIAG__ECHO_REQUEST__INIT;
		req.payload.data = (uint8_t *)&i;
		req.payload.len = sizeof(i);
		cr_assert_eq(rpc_stream_send(b.r.st, &req.base), 0);
		RUN_UNTIL(&f, b.r.nmsg == i + 1);
	}
	/* Then a burst. */
	for (unsigned i = 20; i < 300; i++) {
		Mooncake__Diag__EchoRequest req = MOONCAKE__DIAG__ECHO_REQUEST__INIT;
		req.payload.data = (uint8_t *)&i;
		req.payload.len = sizeof(i);
		cr_assert_eq(rpc_stream_send(b.r.st, &req.base), 0);
	}
	cr_assert_eq(rpc_stream_close_send(b.r.st), 0);
	RUN_UNTIL(&f, b.r.closed);
	cr_assert_eq(b.r.status, RPC_OK, "%s", b.r.msg);
	cr_assert_eq(b.r.nmsg, 300);
	cr_assert(b.order_ok);
	fx_fini(&f);
}

/* ---------------------------------------------------------------- large messages */

Test(rpc, sixteen_mib_both_directions)
{
	struct fx f;
	struct ures r;
	fx_init(&f, NULL, NULL);
	size_t n = 16 * MiB;
	uint8_t *big = malloc(n);
	uint64_t x = TEST_RAND_SEED;
	for (size_t i = 0; i < n; i += 8) {
		test_rand(&x);
		memcpy(big + i, &x, 8);
	}
	uint64_t sum = mc_hash64(big, n);
	for (int round = 0; round < 3; round++) {
		cr_assert_eq(echo(&f, big, n, &r), RPC_OK, "%s", r.msg);
		cr_assert_eq(r.len, n);
		cr_assert_eq(mc_hash64(r.payload, r.len), sum);
		ures_free(&r);
	}
	/* One way each: a 16 MiB upload in one message, a 16 MiB reply to a
	 * tiny request. */
	struct sres u = {0};
	cr_assert_eq(rpc_client_stream(f.cli, "/mooncake.diag.Diag/Upload",
				       &mooncake__diag__upload_summary__descriptor, 0, &up_cbs,
				       &u, &u.st),
		     0);
	Mooncake__Diag__Chunk c = MOONCAKE__DIAG__CHUNK__INIT;
	c.data.data = big;
	c.data.len = n;
	cr_assert_eq(rpc_stream_send(u.st, &c.base), 0);
	cr_assert_eq(rpc_stream_close_send(u.st), 0);
	RUN_UNTIL(&f, u.closed);
	cr_assert_eq(u.status, RPC_OK, "%s", u.msg);
	cr_assert_eq(u.bytes, n);
	cr_assert_eq(u.fnv, fnv(0xcbf29ce484222325ull, big, n));

	Mooncake__Diag__EchoRequest req = MOONCAKE__DIAG__ECHO_REQUEST__INIT;
	req.response_bytes = n;
	echo_start(&f, f.cli, "/mooncake.diag.Diag/Echo", &req, 0, &r);
	RUN_UNTIL(&f, r.done);
	cr_assert_eq(r.status, RPC_OK, "%s", r.msg);
	cr_assert_eq(r.len, n);
	for (size_t i = 0; i < n; i++)
		if (r.payload[i] != (uint8_t)(i % 251))
			cr_assert_fail("byte %zu differs", i);
	ures_free(&r);
	free(big);
	fx_fini(&f);
}

Test(rpc, resource_exhausted_both_directions)
{
	struct fx f;
	struct ures r;
	struct rpc_server_opts so = {.name = "test", .max_message_bytes = 1 * MiB};
	struct rpc_client_opts co = {.max_message_bytes = 2 * MiB};
	fx_init(&f, &so, &co);
	uint8_t *buf = calloc(1, 3 * MiB);

	/* Client -> server: above the server's limit, within the client's. */
	cr_assert_eq(echo(&f, buf, 1 * MiB + 100, &r), RPC_RESOURCE_EXHAUSTED, "%s", r.msg);
	cr_assert(strstr(r.msg, "larger than max"), "%s", r.msg);
	/* Within both: fine. */
	cr_assert_eq(echo(&f, buf, 1 * MiB - 100, &r), RPC_OK, "%s", r.msg);
	ures_free(&r);
	/* Above the client's own limit: refused before sending. */
	Mooncake__Diag__EchoRequest req = MOONCAKE__DIAG__ECHO_REQUEST__INIT;
	req.payload.data = buf;
	req.payload.len = 2 * MiB + 1;
	cr_assert_eq(rpc_client_unary(f.cli, "/mooncake.diag.Diag/Echo", &req.base,
				      &mooncake__diag__echo_response__descriptor, 0, on_unary,
				      &r, NULL),
		     MC_ETOO_LARGE);
	/* Server -> client: the server refuses to send above its limit. */
	Mooncake__Diag__EchoRequest big = MOONCAKE__DIAG__ECHO_REQUEST__INIT;
	big.response_bytes = 1 * MiB + 1;
	echo_start(&f, f.cli, "/mooncake.diag.Diag/Echo", &big, 0, &r);
	RUN_UNTIL(&f, r.done);
	cr_assert_eq(r.status, RPC_RESOURCE_EXHAUSTED, "%s", r.msg);
	rpc_client_free(f.cli);

	/* Server -> client: the client refuses to receive above its limit. */
	struct rpc_server_opts so2 = {.name = "test2", .max_message_bytes = 64 * MiB};
	struct rpc_server *s2 = mk_server(&f, &so2, 0, true, NULL);
	snprintf(f.target, sizeof(f.target), "127.0.0.1:%d", rpc_server_port(s2, 0));
	co.max_message_bytes = 1 * MiB;
	f.cli = mk_client(&f, &co);
	big.response_bytes = 1 * MiB + 1;
	echo_start(&f, f.cli, "/mooncake.diag.Diag/Echo", &big, 0, &r);
	RUN_UNTIL(&f, r.done);
	cr_assert_eq(r.status, RPC_RESOURCE_EXHAUSTED, "%s", r.msg);
	/* The connection is still good afterwards. */
	cr_assert_eq(echo(&f, "x", 1, &r), RPC_OK, "%s", r.msg);
	ures_free(&r);
	cr_assert_eq(rpc__client_connects(f.cli), 1);
	rpc_client_free(f.cli);
	f.cli = NULL;
	stop_server(&f, s2, 1000);
	free(buf);
	fx_fini(&f);
}

/* A receive limit below the send limit (etcd's max-request-bytes plus
 * grpc overhead): requests above it are refused with grpc-go's status and
 * text, responses may still be as large as max_message_bytes. */
Test(rpc, receive_limit_apart_from_send_limit)
{
	struct fx f;
	struct ures r;
	struct rpc_server_opts so = {.name = "test", .max_message_bytes = 4 * MiB};
	struct rpc_client_opts co = {.max_message_bytes = 8 * MiB};
	fx_init(&f, &so, &co);
	rpc_server_set_max_recv_bytes(f.srv, 1 * MiB);
	uint8_t *buf = calloc(1, 2 * MiB);

	cr_assert_eq(echo(&f, buf, 1 * MiB + 100, &r), RPC_RESOURCE_EXHAUSTED, "%s", r.msg);
	static const char want[] = "grpc: received message larger than max (";
	cr_assert(strncmp(r.msg, want, sizeof(want) - 1) == 0, "%s", r.msg);
	cr_assert_eq(echo(&f, buf, 1 * MiB - 100, &r), RPC_OK, "%s", r.msg);
	ures_free(&r);
	Mooncake__Diag__EchoRequest big = MOONCAKE__DIAG__ECHO_REQUEST__INIT;
	big.response_bytes = 3 * MiB;
	echo_start(&f, f.cli, "/mooncake.diag.Diag/Echo", &big, 0, &r);
	RUN_UNTIL(&f, r.done);
	cr_assert_eq(r.status, RPC_OK, "%s", r.msg);
	cr_assert_eq(r.len, 3 * MiB);
	ures_free(&r);
	free(buf);
	fx_fini(&f);
}

/* ---------------------------------------------------------------- unimplemented */

Test(rpc, unimplemented_service_and_method)
{
	struct fx f;
	struct ures r;
	fx_init(&f, NULL, NULL);
	Mooncake__Diag__EchoRequest req = MOONCAKE__DIAG__ECHO_REQUEST__INIT;
	echo_start(&f, f.cli, "/no.Such/Echo", &req, 0, &r);
	RUN_UNTIL(&f, r.done);
	cr_assert_eq(r.status, RPC_UNIMPLEMENTED);
	cr_assert(strstr(r.msg, "no.Such"), "%s", r.msg);
	echo_start(&f, f.cli, "/mooncake.diag.Diag/Nope", &req, 0, &r);
	RUN_UNTIL(&f, r.done);
	cr_assert_eq(r.status, RPC_UNIMPLEMENTED);
	cr_assert(strstr(r.msg, "Nope"), "%s", r.msg);
	echo_start(&f, f.cli, "/nomethod", &req, 0, &r);
	RUN_UNTIL(&f, r.done);
	cr_assert_eq(r.status, RPC_UNIMPLEMENTED);
	cr_assert_eq(rpc_client_unary(f.cli, "no-slash", &req.base,
				      &mooncake__diag__echo_response__descriptor, 0, on_unary,
				      &r, NULL),
		     -EINVAL);
	cr_assert_eq(metric_of(&f, "method=\"unknown\",code=\"UNIMPLEMENTED\"} "), 3);
	fx_fini(&f);
}

/* ---------------------------------------------------------------- deadlines */

Test(rpc, client_deadline)
{
	struct fx f;
	struct ures r;
	fx_init(&f, NULL, NULL);
	Mooncake__Diag__EchoRequest req = MOONCAKE__DIAG__ECHO_REQUEST__INIT;
	req.delay_ms = 10000;
	uint64_t t0 = mc_now_ms();
	echo_start(&f, f.cli, "/test.Hold/Hold", &req, 1000, &r);
	RUN_UNTIL(&f, f.hold.started == 1);
	RUN_UNTIL(&f, r.done);
	cr_assert_eq(r.status, RPC_DEADLINE_EXCEEDED, "%s", r.msg);
	cr_assert_geq(mc_now_ms() - t0, 990);
	cr_assert_lt(mc_now_ms() - t0, 5000);
	/* The server heard about it: the call was cancelled (RST_STREAM) or
	 * expired on its own deadline, whichever came first. */
	RUN_UNTIL(&f, f.hold.live == 0);
	cr_assert_eq(f.hold.cancels, 1);
	/* A deadline that is met. */
	req.delay_ms = 0;
	echo_start(&f, f.cli, "/mooncake.diag.Diag/Echo", &req, 5000, &r);
	RUN_UNTIL(&f, r.done);
	cr_assert_eq(r.status, RPC_OK, "%s", r.msg);
	ures_free(&r);
	/* A deadline on a call still waiting for its connection. */
	rpc_client_free(f.cli);
	struct rpc_client_opts co = {.max_message_bytes = MiB};
	f.cli = mk_client(&f, &co);
	echo_start(&f, f.cli, "/test.Hold/Hold", &req, 1, &r);
	RUN_UNTIL(&f, r.done);
	cr_assert_eq(r.status, RPC_DEADLINE_EXCEEDED, "%s", r.msg);
	RUN_UNTIL(&f, f.hold.live == 0);
	fx_fini(&f);
}

/* One timer serves every deadline of a client (rpc__dlheap_arm): a call
 * whose deadline comes before the armed one must re-arm it, and calls
 * with later deadlines must still expire after the timer fired early. */
Test(rpc, client_deadlines_in_any_order)
{
	struct fx f;
	struct ures a, b, c;
	fx_init(&f, NULL, NULL);
	Mooncake__Diag__EchoRequest req = MOONCAKE__DIAG__ECHO_REQUEST__INIT;
	req.delay_ms = 10000;
	uint64_t t0 = mc_now_ms();
	echo_start(&f, f.cli, "/test.Hold/Hold", &req, 3000, &a);
	echo_start(&f, f.cli, "/test.Hold/Hold", &req, 100, &b);
	echo_start(&f, f.cli, "/test.Hold/Hold", &req, 600, &c);
	RUN_UNTIL(&f, b.done);
	uint64_t tb = mc_now_ms() - t0;
	RUN_UNTIL(&f, c.done);
	uint64_t tc = mc_now_ms() - t0;
	RUN_UNTIL(&f, a.done);
	uint64_t ta = mc_now_ms() - t0;
	cr_assert_eq(b.status, RPC_DEADLINE_EXCEEDED, "%s", b.msg);
	cr_assert_eq(c.status, RPC_DEADLINE_EXCEEDED, "%s", c.msg);
	cr_assert_eq(a.status, RPC_DEADLINE_EXCEEDED, "%s", a.msg);
	/* Not held up until the first call's deadline. */
	cr_assert(tb >= 90 && tb < 2500, "%llu ms", (unsigned long long)tb);
	cr_assert(tc >= 590 && tc < 2500, "%llu ms", (unsigned long long)tc);
	cr_assert(ta >= 2990 && ta < 8000, "%llu ms", (unsigned long long)ta);
	RUN_UNTIL(&f, f.hold.live == 0);
	fx_fini(&f);
}

/* ---------------------------------------------------------------- raw HTTP/2 peer */

/* A hand-driven HTTP/2 client (nghttp2 without HTTP messaging checks) or
 * a raw byte pipe, for what the real client would never send. */
struct raw {
	struct fx *f;
	uv_tcp_t tcp;
	uv_connect_t creq;
	bool connected, eof, closed, failed;
	struct mc_buf in;
	nghttp2_session *ng;
	int http_status, grpc_status;
	char grpc_message[256];
	bool stream_closed;
	unsigned nclosed; /* streams closed */
	uint32_t stream_error;
	bool goaway;
	size_t data_bytes;
	uint8_t data[256];
};

struct raw_w {
	uv_write_t req;
	char bytes[];
};

static void raw_on_write(uv_write_t *w, int status)
{
	free(w);
}

static void raw_write(struct raw *r, const void *data, size_t len)
{
	struct raw_w *w = malloc(sizeof(*w) + len);
	memcpy(w->bytes, data, len);
	uv_buf_t b = uv_buf_init(w->bytes, (unsigned)len);
	if (uv_write(&w->req, (uv_stream_t *)&r->tcp, &b, 1, raw_on_write))
		free(w);
}

static void raw_flush(struct raw *r)
{
	const uint8_t *p;
	ssize_t n;
	while ((n = nghttp2_session_mem_send(r->ng, &p)) > 0)
		raw_write(r, p, (size_t)n);
}

static void raw_alloc(uv_handle_t *h, size_t sz, uv_buf_t *b)
{
	static char buf[65536];
	*b = uv_buf_init(buf, sizeof(buf));
}

static void raw_on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
	struct raw *r = MC_CONTAINER_OF((uv_tcp_t *)s, struct raw, tcp);
	if (n < 0) {
		r->eof = true;
		uv_read_stop(s);
		return;
	}
	cr_assert_eq(mc_buf_append(&r->in, b->base, (size_t)n), 0);
	if (r->ng) {
		nghttp2_session_mem_recv(r->ng, (const uint8_t *)b->base, (size_t)n);
		raw_flush(r);
	}
}

static void raw_on_connect(uv_connect_t *c, int status)
{
	struct raw *r = MC_CONTAINER_OF(c, struct raw, creq);
	cr_assert_eq(status, 0);
	r->connected = true;
	uv_read_start((uv_stream_t *)&r->tcp, raw_alloc, raw_on_read);
}

static void raw_connect(struct fx *f, struct raw *r)
{
	struct sockaddr_in a;
	memset(r, 0, sizeof(*r));
	r->f = f;
	r->grpc_status = -1;
	uv_ip4_addr("127.0.0.1", f->port, &a);
	uv_tcp_init(&f->loop, &r->tcp);
	cr_assert_eq(uv_tcp_connect(&r->creq, &r->tcp, (struct sockaddr *)&a, raw_on_connect),
		     0);
	RUN_UNTIL(f, r->connected);
}

static void raw_on_closed(uv_handle_t *h)
{
	struct raw *r = MC_CONTAINER_OF((uv_tcp_t *)h, struct raw, tcp);
	r->closed = true;
}

static void raw_close(struct raw *r)
{
	uv_close((uv_handle_t *)&r->tcp, raw_on_closed);
	RUN_UNTIL(r->f, r->closed);
	nghttp2_session_del(r->ng);
	mc_buf_free(&r->in);
}

/* Does the byte stream from the server contain a frame of this type? */
static bool raw_saw_frame(const struct raw *r, uint8_t type)
{
	size_t off = 0;
	while (off + 9 <= r->in.len) {
		const uint8_t *h = (const uint8_t *)r->in.data + off;
		size_t len = (size_t)h[0] << 16 | (size_t)h[1] << 8 | h[2];
		if (h[3] == type)
			return true;
		off += 9 + len;
	}
	return false;
}

static int raw_on_header(nghttp2_session *ng, const nghttp2_frame *fr, const uint8_t *name,
			 size_t nlen, const uint8_t *value, size_t vlen, uint8_t flags,
			 void *ud)
{
	struct raw *r = ud;
	if (nlen == 7 && memcmp(name, ":status", 7) == 0)
		r->http_status = atoi((const char *)value);
	else if (nlen == 11 && memcmp(name, "grpc-status", 11) == 0)
		r->grpc_status = atoi((const char *)value);
	else if (nlen == 12 && memcmp(name, "grpc-message", 12) == 0)
		snprintf(r->grpc_message, sizeof(r->grpc_message), "%.*s", (int)vlen, value);
	return 0;
}

static int raw_on_close(nghttp2_session *ng, int32_t id, uint32_t err, void *ud)
{
	struct raw *r = ud;
	r->stream_closed = true;
	r->nclosed++;
	r->stream_error = err;
	return 0;
}

static int raw_on_frame(nghttp2_session *ng, const nghttp2_frame *fr, void *ud)
{
	struct raw *r = ud;
	if (fr->hd.type == NGHTTP2_GOAWAY)
		r->goaway = true;
	return 0;
}

static int raw_on_data(nghttp2_session *ng, uint8_t flags, int32_t id, const uint8_t *d,
		       size_t len, void *ud)
{
	struct raw *r = ud;
	for (size_t i = 0; i < len && r->data_bytes < sizeof(r->data); i++)
		r->data[r->data_bytes + i] = d[i];
	r->data_bytes += len;
	return 0;
}

struct body {
	const uint8_t *p;
	size_t len;
	bool hold_open; /* at its end, keep the stream open (no END_STREAM) */
};

static ssize_t raw_body_read(nghttp2_session *ng, int32_t id, uint8_t *buf, size_t len,
			     uint32_t *flags, nghttp2_data_source *src, void *ud)
{
	struct body *b = src->ptr;
	if (b->len == 0 && b->hold_open)
		return NGHTTP2_ERR_DEFERRED;
	size_t n = b->len < len ? b->len : len;
	memcpy(buf, b->p, n);
	b->p += n;
	b->len -= n;
	if (b->len == 0 && !b->hold_open)
		*flags |= NGHTTP2_DATA_FLAG_EOF;
	return (ssize_t)n;
}

/* Open an HTTP/2 session and send one request with these headers and
 * body (NULL: END_STREAM on HEADERS). */
static void raw_request(struct fx *f, struct raw *r, const nghttp2_nv *nva, size_t n,
			struct body *body)
{
	nghttp2_session_callbacks *cbs;
	nghttp2_option *opt;
	raw_connect(f, r);
	nghttp2_session_callbacks_new(&cbs);
	nghttp2_session_callbacks_set_on_header_callback(cbs, raw_on_header);
	nghttp2_session_callbacks_set_on_stream_close_callback(cbs, raw_on_close);
	nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, raw_on_frame);
	nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, raw_on_data);
	nghttp2_option_new(&opt);
	nghttp2_option_set_no_http_messaging(opt, 1);
	cr_assert_eq(nghttp2_session_client_new2(&r->ng, cbs, r, opt), 0);
	nghttp2_option_del(opt);
	nghttp2_session_callbacks_del(cbs);
	nghttp2_submit_settings(r->ng, NGHTTP2_FLAG_NONE, NULL, 0);
	nghttp2_data_provider prd = {.source.ptr = body, .read_callback = raw_body_read};
	cr_assert_gt(nghttp2_submit_request(r->ng, NULL, nva, n, body ? &prd : NULL, NULL), 0);
	raw_flush(r);
}

#define RNV(a, b) \
	{ \
		(uint8_t *)(a), (uint8_t *)(b), sizeof(a) - 1, sizeof(b) - 1, \
			NGHTTP2_NV_FLAG_NONE \
	}
/* The headers of a well-formed test.Hold/Hold request. */
#define RNV_HOLD_REQUEST \
	RNV(":method", "POST"), RNV(":scheme", "http"), RNV(":path", "/test.Hold/Hold"), \
		RNV(":authority", "x"), RNV("content-type", "application/grpc"), \
		RNV("te", "trailers")

static void assert_still_serving(struct fx *f)
{
	cr_assert_eq(health_check(f, f->cli, ""), RPC_HEALTH_SERVING);
}

Test(rpc, server_deadline)
{
	struct fx f;
	struct raw r;
	fx_init(&f, NULL, NULL);
	/* A peer that sends grpc-timeout but never enforces it itself. */
	uint8_t msg[5];
	rpc_frame_prefix(msg, 0);
	struct body b = {.p = msg, .len = 5};
	nghttp2_nv nva[] = {
		RNV_HOLD_REQUEST,
		RNV("grpc-timeout", "150m"),
		RNV("x-trace-id", "abc-123"),
	};
	uint64_t t0 = mc_now_ms();
	raw_request(&f, &r, nva, MC_ARRAY_LEN(nva), &b);
	RUN_UNTIL(&f, r.stream_closed);
	cr_assert_eq(r.grpc_status, RPC_DEADLINE_EXCEEDED);
	cr_assert_geq(mc_now_ms() - t0, 140);
	cr_assert_str_eq(f.hold.trace, "abc-123"); /* custom metadata, any case */
	cr_assert(strncmp(f.hold.peer, "127.0.0.1:", 10) == 0, "%s", f.hold.peer);
	cr_assert_gt(f.hold.deadline_ms, 0);
	cr_assert_eq(f.hold.cancels, 1); /* the handler got on_cancel */
	cr_assert_eq(f.hold.live, 0);
	cr_assert_eq(metric_of(&f, "method=\"/test.Hold/Hold\",code=\"DEADLINE_EXCEEDED\"} "),
		     1);
	raw_close(&r);
	fx_fini(&f);
}

Test(rpc, bad_requests_get_errors)
{
	struct fx f;
	struct raw r;
	fx_init(&f, NULL, NULL);
	uint8_t msg[5];
	rpc_frame_prefix(msg, 0);

	/* Wrong content-type: HTTP 415. */
	nghttp2_nv ct[] = {
		RNV(":method", "POST"),
		RNV(":scheme", "http"),
		RNV(":path", "/mooncake.diag.Diag/Echo"),
		RNV(":authority", "x"),
		RNV("content-type", "application/json"),
	};
	struct body b = {.p = msg, .len = 5};
	raw_request(&f, &r, ct, MC_ARRAY_LEN(ct), &b);
	RUN_UNTIL(&f, r.stream_closed);
	cr_assert_eq(r.http_status, 415);
	cr_assert_eq(r.grpc_status, RPC_INTERNAL);
	raw_close(&r);

	/* Bad grpc-timeout. */
	nghttp2_nv to[] = {
		RNV(":method", "POST"),
		RNV(":scheme", "http"),
		RNV(":path", "/mooncake.diag.Diag/Echo"),
		RNV(":authority", "x"),
		RNV("content-type", "application/grpc"),
		RNV("grpc-timeout", "5 seconds"),
	};
	b = (struct body){.p = msg, .len = 5};
	raw_request(&f, &r, to, MC_ARRAY_LEN(to), &b);
	RUN_UNTIL(&f, r.stream_closed);
	cr_assert_eq(r.http_status, 200);
	cr_assert_eq(r.grpc_status, RPC_INTERNAL);
	cr_assert(strstr(r.grpc_message, "grpc-timeout"), "%s", r.grpc_message);
	raw_close(&r);

	/* Compressed flag without grpc-encoding. */
	uint8_t comp[6] = {1, 0, 0, 0, 1, 'x'};
	nghttp2_nv ok[] = {
		RNV(":method", "POST"),
		RNV(":scheme", "http"),
		RNV(":path", "/mooncake.diag.Diag/Echo"),
		RNV(":authority", "x"),
		RNV("content-type", "application/grpc+proto"),
	};
	b = (struct body){.p = comp, .len = 6};
	raw_request(&f, &r, ok, MC_ARRAY_LEN(ok), &b);
	RUN_UNTIL(&f, r.stream_closed);
	cr_assert_eq(r.grpc_status, RPC_INTERNAL);
	raw_close(&r);

	/* Unsupported grpc-encoding. */
	nghttp2_nv enc[] = {
		RNV(":method", "POST"),
		RNV(":scheme", "http"),
		RNV(":path", "/mooncake.diag.Diag/Echo"),
		RNV(":authority", "x"),
		RNV("content-type", "application/grpc"),
		RNV("grpc-encoding", "gzip"),
	};
	b = (struct body){.p = msg, .len = 5};
	raw_request(&f, &r, enc, MC_ARRAY_LEN(enc), &b);
	RUN_UNTIL(&f, r.stream_closed);
	cr_assert_eq(r.grpc_status, RPC_UNIMPLEMENTED);
	raw_close(&r);

	/* A body that is not the method's message. */
	uint8_t junk[8] = {0, 0, 0, 0, 3, 0xff, 0xff, 0xff};
	b = (struct body){.p = junk, .len = 8};
	raw_request(&f, &r, ok, MC_ARRAY_LEN(ok), &b);
	RUN_UNTIL(&f, r.stream_closed);
	cr_assert_eq(r.grpc_status, RPC_INTERNAL);
	raw_close(&r);

	/* A unary request with two messages, and one cut inside a message. */
	uint8_t two[10] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
	b = (struct body){.p = two, .len = 10};
	raw_request(&f, &r, ok, MC_ARRAY_LEN(ok), &b);
	RUN_UNTIL(&f, r.stream_closed);
	cr_assert_eq(r.grpc_status, RPC_INTERNAL);
	raw_close(&r);
	uint8_t cut[7] = {0, 0, 0, 0, 9, 1, 2};
	b = (struct body){.p = cut, .len = 7};
	raw_request(&f, &r, ok, MC_ARRAY_LEN(ok), &b);
	RUN_UNTIL(&f, r.stream_closed);
	cr_assert_eq(r.grpc_status, RPC_INTERNAL);
	raw_close(&r);

	/* No body at all: END_STREAM on HEADERS. */
	raw_request(&f, &r, ok, MC_ARRAY_LEN(ok), NULL);
	RUN_UNTIL(&f, r.stream_closed);
	cr_assert_eq(r.grpc_status, RPC_INTERNAL);
	raw_close(&r);

	/* A correct one through the same path, to be sure the checks above
	 * are not rejecting everything. */
	b = (struct body){.p = msg, .len = 5};
	raw_request(&f, &r, ok, MC_ARRAY_LEN(ok), &b);
	RUN_UNTIL(&f, r.stream_closed);
	cr_assert_eq(r.grpc_status, RPC_OK);
	cr_assert_eq(r.data_bytes, 5);
	raw_close(&r);
	assert_still_serving(&f);
	fx_fini(&f);
}

/* Append an HTTP/2 frame to buf at *n. */
static void raw_frame(uint8_t *buf, size_t *n, uint8_t type, uint8_t flags, uint32_t sid,
		      const void *payload, size_t len)
{
	uint8_t hd[9] = {(uint8_t)(len >> 16),
			 (uint8_t)(len >> 8),
			 (uint8_t)len,
			 type,
			 flags,
			 (uint8_t)(sid >> 24),
			 (uint8_t)(sid >> 16),
			 (uint8_t)(sid >> 8),
			 (uint8_t)sid};
	memcpy(buf + *n, hd, 9);
	if (len)
		memcpy(buf + *n + 9, payload, len);
	*n += 9 + len;
}

/* The client preface and SETTINGS (settings: len bytes of 6-byte
 * entries) at buf's start; returns the length. */
static size_t raw_preface(uint8_t *buf, const uint8_t *settings, size_t len)
{
	size_t n = 24;
	memcpy(buf, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 24);
	raw_frame(buf, &n, NGHTTP2_SETTINGS, 0, 0, settings, len);
	return n;
}

/* An HPACK header block of a gRPC request to path (shorter than 127
 * bytes), without indexing; returns its length. */
static size_t raw_head(uint8_t *out, const char *path)
{
	static const uint8_t rest[] = "\x01\x01x" /* :authority */
				      "\x0f\x10\x10"
				      "application/grpc" /* content-type */
				      "\x00\x02te\x08trailers";
	size_t plen = strlen(path), n = 0;
	out[n++] = 0x83; /* :method POST */
	out[n++] = 0x86; /* :scheme http */
	out[n++] = 0x04; /* :path, a literal */
	out[n++] = (uint8_t)plen;
	memcpy(out + n, path, plen);
	n += plen;
	memcpy(out + n, rest, sizeof(rest) - 1);
	return n + sizeof(rest) - 1;
}

static const char call_gauge[] = "mooncake_rpc_server_call_memory_bytes{server=\"test\"} ";

static void small_echo_passes(struct fx *f)
{
	struct ures r;
	cr_assert_eq(echo(f, "small", 5, &r), RPC_OK, "%s", r.msg);
	ures_free(&r);
}

/* A server of 1 MiB messages whose calls may hold 4 MiB (2 MiB a
 * connection). Returns what its calls hold with only f's client
 * connected (each connection and call counts a fixed cost). */
static double fx_init_bounded(struct fx *f)
{
	struct rpc_server_opts so = {
		.name = "test", .max_message_bytes = MiB, .max_call_memory = 4 * MiB};
	fx_init(f, &so, NULL);
	small_echo_passes(f);
	return metric_of(f, call_gauge);
}

/* The end of a bounded test: what the calls hold goes back to base, and
 * the server still serves. */
static void fx_fini_bounded(struct fx *f, double base)
{
	RUN_UNTIL(f, metric_of(f, call_gauge) <= base);
	assert_still_serving(f);
	fx_fini(f);
}

/* What the requests a server is receiving or decoding hold at once is
 * bounded (max_call_memory), over all connections, by the buffers of
 * their bodies, which grow with the bytes that came (64 KiB, then 4
 * times as much, up to the length): streams that only declare large
 * messages take nothing but their connection's and call's fixed costs,
 * and one byte of each takes 64 KiB, not the 1 MiB declared; four 0.9
 * MiB messages, each 0.8 MiB sent on a connection of its own, fill 4 MiB
 * with those costs, and the fifth is refused with RESOURCE_EXHAUSTED
 * while small calls still pass; once the four go the room is back. */
Test(rpc, call_memory_bounds_requests)
{
	struct fx f;
	double base = fx_init_bounded(&f);
	static uint8_t part[5 + 8 * MiB / 10];
	rpc_frame_prefix(part, MiB);
	nghttp2_nv nva[] = {
		RNV_HOLD_REQUEST,
	};
	struct raw r[8];
	struct body b[8];

	/* Declared, not sent: nothing held; one byte sent: its first buffer. */
	for (size_t sent = 0; sent < 2; sent++) {
		for (int i = 0; i < 8; i++) {
			b[i] = (struct body){.p = part, .len = 5 + sent, .hold_open = true};
			raw_request(&f, &r[i], nva, MC_ARRAY_LEN(nva), &b[i]);
		}
		small_echo_passes(&f);
		if (sent)
			RUN_UNTIL(&f, metric_of(&f, call_gauge) - base >=
					      8.0 * RPC_DEFRAMER_FIRST_CAP);
		cr_assert_lt(metric_of(&f, call_gauge) - base,
			     8 * (80 * 1024.0 + sent * RPC_DEFRAMER_FIRST_CAP));
		for (int i = 0; i < 8; i++)
			raw_close(&r[i]);
		RUN_UNTIL(&f, metric_of(&f, call_gauge) <= base);
	}
	rpc_frame_prefix(part, 9 * MiB / 10);

	for (int round = 0; round < 2; round++) {
		for (int i = 0; i < 5; i++) {
			b[i] = (struct body){
				.p = part, .len = sizeof(part), .hold_open = true};
			raw_request(&f, &r[i], nva, MC_ARRAY_LEN(nva), &b[i]);
			if (i < 4)
				RUN_UNTIL(&f, metric_of(&f, call_gauge) >=
						      base + (i + 1) * 0.75 * MiB);
		}
		RUN_UNTIL(&f, r[4].stream_closed);
		cr_assert_eq(r[4].grpc_status, RPC_RESOURCE_EXHAUSTED, "%s",
			     r[4].grpc_message);
		cr_assert(strstr(r[4].grpc_message, "calls%20hold") ||
				  strstr(r[4].grpc_message, "calls hold"),
			  "%s", r[4].grpc_message);
		for (int i = 0; i < 4; i++)
			cr_assert_not(r[i].stream_closed, "stream %d", i);
		small_echo_passes(&f);
		for (int i = 0; i < 5; i++)
			raw_close(&r[i]);
		RUN_UNTIL(&f, metric_of(&f, call_gauge) <= base);
	}
	cr_assert_eq(f.hold.started, 0);
	fx_fini_bounded(&f, base);
}

/* Answers a client does not take (it opens no flow-control window) stay
 * in the server's memory: they count in the same bound, and one
 * connection may take only its share of it (here 2 MiB of 4). Three such
 * clients ask for four 0.9 MiB echoes each: the first two keep two
 * answers each (their share), the third none (the bound); the other
 * eight end RESOURCE_EXHAUSTED, and a client that reads still gets
 * small answers. */
Test(rpc, call_memory_bounds_answers)
{
	struct fx f;
	double base = fx_init_bounded(&f);
	static const char refused[] =
		"method=\"/mooncake.diag.Diag/Echo\",code=\"RESOURCE_EXHAUSTED\"} ";
	static uint8_t buf[4096];
	/* SETTINGS_INITIAL_WINDOW_SIZE 0: no answer's DATA may come. */
	static const uint8_t window0[6] = {0, 4, 0, 0, 0, 0};
	size_t n = raw_preface(buf, window0, 6);
	uint8_t head[128];
	size_t hlen = raw_head(head, "/mooncake.diag.Diag/Echo");
	Mooncake__Diag__EchoRequest req = MOONCAKE__DIAG__ECHO_REQUEST__INIT;
	req.response_bytes = 9 * MiB / 10;
	uint8_t msg[32];
	size_t mlen = mooncake__diag__echo_request__pack(&req, msg + 5);
	rpc_frame_prefix(msg, (uint32_t)mlen);
	for (uint32_t sid = 1; sid < 9; sid += 2) {
		raw_frame(buf, &n, NGHTTP2_HEADERS, NGHTTP2_FLAG_END_HEADERS, sid, head, hlen);
		raw_frame(buf, &n, NGHTTP2_DATA, NGHTTP2_FLAG_END_STREAM, sid, msg, 5 + mlen);
	}
	struct raw r[3];
	for (int c = 0; c < 3; c++) {
		raw_connect(&f, &r[c]);
		raw_write(&r[c], buf, n);
		RUN_UNTIL(&f, metric_of(&f, refused) >= 2 + 2 * c);
	}
	RUN_UNTIL(&f, metric_of(&f, refused) >= 8);
	double held = metric_of(&f, call_gauge);
	cr_assert_geq(held, 4 * 0.9 * MiB);
	cr_assert_leq(held, 4 * MiB);
	small_echo_passes(&f);
	for (int c = 0; c < 3; c++)
		raw_close(&r[c]);
	cr_assert_eq(metric_of(&f, refused), 8);
	fx_fini_bounded(&f, base);
}

/* The headers a call keeps count in the bound too: a connection whose
 * streams each bring 60 KB of metadata and never end keeps its share
 * (2 MiB here) and has the rest of them reset, each counted as a call of
 * method "unknown" ended RESOURCE_EXHAUSTED (what its client sees). */
Test(rpc, call_memory_bounds_headers)
{
	struct fx f;
	double base = fx_init_bounded(&f);
	static char big[60000];
	memset(big, 'm', sizeof(big));
	nghttp2_nv nva[] = {
		RNV_HOLD_REQUEST,
		{(uint8_t *)"x-md", (uint8_t *)big, 4, sizeof(big), NGHTTP2_NV_FLAG_NO_INDEX},
	};
	struct raw r;
	struct body b[64];
	b[0] = (struct body){.p = NULL, .len = 0, .hold_open = true};
	raw_request(&f, &r, nva, MC_ARRAY_LEN(nva), &b[0]);
	for (int i = 1; i < 64; i++) {
		b[i] = (struct body){.p = NULL, .len = 0, .hold_open = true};
		nghttp2_data_provider prd = {.source.ptr = &b[i],
					     .read_callback = raw_body_read};
		cr_assert_gt(
			nghttp2_submit_request(r.ng, NULL, nva, MC_ARRAY_LEN(nva), &prd, NULL),
			0);
	}
	raw_flush(&r);
	/* 33 of about 61,600 bytes (with a call's cost) fit in 2 MiB. */
	RUN_UNTIL(&f, r.nclosed >= 30);
	double held = metric_of(&f, call_gauge) - base;
	cr_assert_geq(held, 30 * 60000.0);
	cr_assert_leq(held, 2.0 * MiB + 80 * 1024);
	cr_assert_eq(r.stream_error, NGHTTP2_ENHANCE_YOUR_CALM);
	static const char reset[] = "mooncake_rpc_server_calls_total{server=\"test\","
				    "method=\"unknown\",code=\"RESOURCE_EXHAUSTED\"} ";
	RUN_UNTIL(&f, metric_of(&f, reset) >= r.nclosed);
	cr_assert_eq(metric_of(&f, reset), r.nclosed);
	raw_close(&r);
	fx_fini_bounded(&f, base);
}

/* ---------------------------------------------------------------- abuse */

static void shut_cb(uv_shutdown_t *sh, int status)
{
	free(sh);
}

static void raw_bytes_until_closed(struct fx *f, const void *bytes, size_t len,
				   bool half_close)
{
	struct raw r;
	raw_connect(f, &r);
	if (len)
		raw_write(&r, bytes, len);
	if (half_close) {
		uv_shutdown_t *sh = malloc(sizeof(*sh));
		uv_shutdown(sh, (uv_stream_t *)&r.tcp, shut_cb);
	}
	RUN_UNTIL(f, r.eof);
	raw_close(&r);
}

Test(rpc, abuse_garbage_bytes)
{
	struct fx f;
	fx_init(&f, NULL, NULL);
	double before = metric_of(
		&f, "mooncake_rpc_server_protocol_errors_total{server=\"test\"} ");
	static const char junk[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n\x01\x02\x03 garbage";
	raw_bytes_until_closed(&f, junk, sizeof(junk), false);
	cr_assert_gt(
		metric_of(&f, "mooncake_rpc_server_protocol_errors_total{server=\"test\"} "),
		before);
	assert_still_serving(&f);
	uint8_t rnd[4096];
	for (size_t i = 0; i < sizeof(rnd); i++)
		rnd[i] = (uint8_t)(i * 7919 + 13);
	raw_bytes_until_closed(&f, rnd, sizeof(rnd), false);
	assert_still_serving(&f);
	fx_fini(&f);
}

Test(rpc, abuse_truncated_preface)
{
	struct rpc_server_opts so = {.name = "test", .handshake_timeout_ms = 200};
	struct fx f;
	fx_init(&f, &so, NULL);
	static const char pre[] = "PRI * HTTP/2.0\r\n\r\nSM";
	/* Truncated, then the peer closes its side. */
	raw_bytes_until_closed(&f, pre, sizeof(pre) - 1, true);
	assert_still_serving(&f);
	/* Truncated and left hanging: the handshake timeout closes it. */
	uint64_t t0 = mc_now_ms();
	raw_bytes_until_closed(&f, pre, sizeof(pre) - 1, false);
	cr_assert_geq(mc_now_ms() - t0, 150);
	assert_still_serving(&f);
	fx_fini(&f);
}

Test(rpc, abuse_silent_connection)
{
	struct rpc_server_opts so = {.name = "test", .handshake_timeout_ms = 200};
	struct fx f;
	fx_init(&f, &so, NULL);
	uint64_t t0 = mc_now_ms();
	raw_bytes_until_closed(&f, NULL, 0, false);
	cr_assert_geq(mc_now_ms() - t0, 150);
	assert_still_serving(&f);
	fx_fini(&f);
}

Test(rpc, abuse_oversized_frame)
{
	struct fx f;
	fx_init(&f, NULL, NULL);
	uint8_t buf[24 + 9 + 9];
	memcpy(buf, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 24);
	/* An empty SETTINGS, then a DATA frame header declaring 16 MiB - 1,
	 * far above the SETTINGS_MAX_FRAME_SIZE we advertised. */
	uint8_t settings[9] = {0, 0, 0, NGHTTP2_SETTINGS, 0, 0, 0, 0, 0};
	uint8_t data[9] = {0xff, 0xff, 0xff, NGHTTP2_DATA, 0, 0, 0, 0, 1};
	memcpy(buf + 24, settings, 9);
	memcpy(buf + 33, data, 9);
	struct raw r;
	raw_connect(&f, &r);
	raw_write(&r, buf, sizeof(buf));
	RUN_UNTIL(&f, r.eof);
	cr_assert(raw_saw_frame(&r, NGHTTP2_GOAWAY), "no GOAWAY before the close");
	raw_close(&r);
	assert_still_serving(&f);
	fx_fini(&f);
}

/* An HPACK bomb: one 4,000-byte field into the dynamic table, then
 * 1-byte references to it filling 16 KiB HEADERS frames, each of which
 * would decode to some 50 MB. The server resets each such stream with
 * ENHANCE_YOUR_CALM once its header list passes 64 KiB (what it
 * advertises), keeps nothing more of it, and serves on. */
Test(rpc, abuse_hpack_bomb)
{
	struct fx f;
	fx_init(&f, NULL, NULL);
	double before = metric_of(
		&f, "mooncake_rpc_server_protocol_errors_total{server=\"test\"} ");
	static uint8_t buf[24 + 9 + 8 * (9 + 16384)];
	size_t n = raw_preface(buf, NULL, 0);
	uint8_t block[16384];
	size_t hlen = raw_head(block, "/test.Hold/Hold");
	for (uint32_t sid = 1; sid < 17; sid += 2) {
		size_t p = hlen;
		if (sid == 1) { /* x-big: 4,000 bytes, incremental indexing */
			memcpy(block + p, "\x40\x05x-big\x7f\xa1\x1e", 10);
			p += 10;
			memset(block + p, 'a', 4000);
			p += 4000;
		}
		memset(block + p, 0xbe, sizeof(block) - p); /* index 62: x-big */
		raw_frame(buf, &n, NGHTTP2_HEADERS, NGHTTP2_FLAG_END_HEADERS, sid, block,
			  sizeof(block));
	}
	struct raw r;
	raw_connect(&f, &r);
	raw_write(&r, buf, n);
	RUN_UNTIL(&f, metric_of(&f, "mooncake_rpc_server_protocol_errors_total{"
				    "server=\"test\"} ") >= before + 8);
	RUN_UNTIL(&f, raw_saw_frame(&r, NGHTTP2_RST_STREAM));
	cr_assert_eq(f.hold.started, 0);
	raw_close(&r);
	assert_still_serving(&f);
	fx_fini(&f);
}

Test(rpc, abuse_bad_pseudo_headers)
{
	struct fx f;
	struct raw r;
	fx_init(&f, NULL, NULL);
	/* An unknown pseudo-header and no :path. */
	nghttp2_nv bad[] = {
		RNV(":method", "POST"),
		RNV(":scheme", "http"),
		RNV(":authority", "x"),
		RNV(":bogus", "1"),
		RNV("content-type", "application/grpc"),
	};
	raw_request(&f, &r, bad, MC_ARRAY_LEN(bad), NULL);
	RUN_UNTIL(&f, r.stream_closed);
	cr_assert_eq(r.stream_error, NGHTTP2_PROTOCOL_ERROR);
	cr_assert_eq(r.grpc_status, -1);
	raw_close(&r);
	/* Uppercase header name, pseudo-header after a regular one. */
	nghttp2_nv bad2[] = {
		RNV(":method", "POST"),
		RNV(":scheme", "http"),
		RNV("content-type", "application/grpc"),
		RNV(":path", "/mooncake.diag.Diag/Echo"),
		RNV("X-Upper", "1"),
	};
	raw_request(&f, &r, bad2, MC_ARRAY_LEN(bad2), NULL);
	RUN_UNTIL(&f, r.stream_closed);
	cr_assert_eq(r.stream_error, NGHTTP2_PROTOCOL_ERROR);
	raw_close(&r);
	assert_still_serving(&f);
	fx_fini(&f);
}

/* ---------------------------------------------------------------- concurrency */

Test(rpc, many_concurrent_streams_one_connection)
{
	struct fx f;
	enum { N = 250 };
	static struct ures rs[N];
	fx_init(&f, NULL, NULL);
	Mooncake__Diag__EchoRequest req = MOONCAKE__DIAG__ECHO_REQUEST__INIT;
	for (int i = 0; i < N; i++)
		echo_start(&f, f.cli, "/test.Hold/Hold", &req, 0, &rs[i]);
	RUN_UNTIL(&f, f.hold.live == N);
	cr_assert_eq(f.hold.max_live, N);
	hold_release(&f.hold, RPC_OK);
	for (int i = 0; i < N; i++) {
		RUN_UNTIL(&f, rs[i].done);
		cr_assert_eq(rs[i].status, RPC_OK, "%d: %s", i, rs[i].msg);
		cr_assert_eq(rs[i].len, 4);
		ures_free(&rs[i]);
	}
	cr_assert_eq(rpc__client_connects(f.cli), 1);
	cr_assert_eq(metric_of(&f, "mooncake_rpc_server_connections{server=\"test\"} "), 1);
	/* And a mixed burst of real work. */
	for (int i = 0; i < N; i++) {
		Mooncake__Diag__EchoRequest e = MOONCAKE__DIAG__ECHO_REQUEST__INIT;
		e.payload.data = (uint8_t *)&i;
		e.payload.len = sizeof(i);
		echo_start(&f, f.cli, "/mooncake.diag.Diag/Echo", &e, 10000, &rs[i]);
	}
	for (int i = 0; i < N; i++) {
		RUN_UNTIL(&f, rs[i].done);
		cr_assert_eq(rs[i].status, RPC_OK);
		cr_assert_eq(rs[i].len, sizeof(i));
		cr_assert(memcmp(rs[i].payload, &i, sizeof(i)) == 0);
		ures_free(&rs[i]);
	}
	cr_assert_eq(rpc__client_connects(f.cli), 1);
	fx_fini(&f);
}

Test(rpc, client_cancel_reaches_the_server)
{
	struct fx f;
	struct ures r;
	struct rpc_stream *st;
	fx_init(&f, NULL, NULL);
	Mooncake__Diag__EchoRequest req = MOONCAKE__DIAG__ECHO_REQUEST__INIT;
	memset(&r, 0, sizeof(r));
	cr_assert_eq(rpc_client_unary(f.cli, "/test.Hold/Hold", &req.base,
				      &mooncake__diag__echo_response__descriptor, 0, on_unary,
				      &r, &st),
		     0);
	RUN_UNTIL(&f, f.hold.live == 1);
	rpc_stream_cancel(st);
	RUN_UNTIL(&f, f.hold.cancels == 1);
	cr_assert_not(r.done, "a cancelled call's callback ran");
	/* Cancel before the request even left. */
	cr_assert_eq(rpc_client_unary(f.cli, "/test.Hold/Hold", &req.base,
				      &mooncake__diag__echo_response__descriptor, 0, on_unary,
				      &r, &st),
		     0);
	rpc_stream_cancel(st);
	cr_assert_eq(echo(&f, "a", 1, &r), RPC_OK);
	ures_free(&r);
	cr_assert_eq(f.hold.started, 1);
	fx_fini(&f);
}

/* ---------------------------------------------------------------- reconnect, shutdown */

Test(rpc, client_reconnects_after_server_restart)
{
	struct fx f;
	struct ures r;
	struct rpc_client_opts co = {
		.max_message_bytes = MiB, .backoff_initial_ms = 20, .backoff_max_ms = 100};
	fx_init(&f, NULL, &co);
	cr_assert_eq(echo(&f, "1", 1, &r), RPC_OK);
	ures_free(&r);
	stop_server(&f, f.srv, 1000);
	f.srv = NULL;
	/* The server is gone: calls fail fast with UNAVAILABLE. */
	cr_assert_eq(echo(&f, "2", 1, &r), RPC_UNAVAILABLE, "%s", r.msg);
	cr_assert_eq(echo(&f, "3", 1, &r), RPC_UNAVAILABLE, "%s", r.msg);
	f.srv = mk_server(&f, NULL, f.port, true, &f.health);
	/* Retry from each failure until the backoff lets a connect through. */
	int tries = 0;
	while (echo(&f, "4", 1, &r) != RPC_OK) {
		cr_assert_eq(r.status, RPC_UNAVAILABLE, "%s", r.msg);
		cr_assert_lt(++tries, 100000);
	}
	cr_assert_eq(r.len, 1);
	ures_free(&r);
	cr_assert_eq(rpc__client_connects(f.cli), 2);
	fx_fini(&f);
}

Test(rpc, graceful_shutdown_drains_and_goaway_moves_new_calls)
{
	struct fx f;
	struct ures held, fresh;
	bool done = false;
	fx_init(&f, NULL, NULL);
	Mooncake__Diag__EchoRequest req = MOONCAKE__DIAG__ECHO_REQUEST__INIT;
	echo_start(&f, f.cli, "/test.Hold/Hold", &req, 0, &held);
	RUN_UNTIL(&f, f.hold.live == 1);

	rpc_server_shutdown(f.srv, 10000, on_srv_done, &done);
	RUN_UNTIL(&f, rpc__client_goaways(f.cli) >= 1);

	/* A new server on the same port (the old one closed its listener):
	 * new calls reach it on a new connection while the old call is still
	 * draining on the old one. */
	struct rpc_server_opts bo = {.name = "B"};
	struct rpc_server *b = mk_server(&f, &bo, f.port, true, NULL);
	cr_assert_eq(health_check(&f, f.cli, ""), RPC_HEALTH_SERVING);
	cr_assert_eq(health_check(&f, f.cli, ""), RPC_HEALTH_SERVING);
	cr_assert_eq(rpc__client_connects(f.cli), 2);
	cr_assert_eq(metric_of(&f, "server_calls_total{server=\"B\",method="
				   "\"/grpc.health.v1.Health/Check\",code=\"OK\"} "),
		     2);
	cr_assert_not(held.done);
	cr_assert_not(done);

	/* The drained call completes normally, then the old server is done. */
	hold_release(&f.hold, RPC_OK);
	RUN_UNTIL(&f, held.done && done);
	cr_assert_eq(held.status, RPC_OK, "%s", held.msg);
	ures_free(&held);
	rpc_server_free(f.srv);
	f.srv = b;

	/* Drain timeout: the in-flight call is cancelled on the server and
	 * the client sees the connection go. */
	echo_start(&f, f.cli, "/test.Hold/Hold", &req, 0, &held);
	RUN_UNTIL(&f, f.hold.live == 1);
	done = false;
	uint64_t t0 = mc_now_ms();
	rpc_server_shutdown(f.srv, 200, on_srv_done, &done);
	RUN_UNTIL(&f, done && held.done);
	cr_assert_geq(mc_now_ms() - t0, 150);
	cr_assert_eq(f.hold.cancels, 1);
	cr_assert_eq(held.status, RPC_UNAVAILABLE, "%s", held.msg);
	rpc_server_free(f.srv);
	f.srv = NULL;
	(void)fresh;
	fx_fini(&f);
}

/* ---------------------------------------------------------------- health */

struct watch {
	struct sres r;
	int statuses[16];
	unsigned n;
};

static void w_on_message(struct rpc_stream *st, void *ud, const ProtobufCMessage *msg)
{
	struct watch *w = ud;
	cr_assert(w->n < 16);
	w->statuses[w->n++] = ((const Grpc__Health__V1__HealthCheckResponse *)msg)->status;
}

static void w_on_close(struct rpc_stream *st, void *ud, int status, const char *m)
{
	s_on_close(st, &((struct watch *)ud)->r, status, m);
}

static const struct rpc_stream_cbs w_cbs = {.on_message = w_on_message,
					    .on_close = w_on_close};

static void watch_start(struct fx *f, struct watch *w, const char *service)
{
	Grpc__Health__V1__HealthCheckRequest req =
		GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
	req.service = (char *)service;
	memset(w, 0, sizeof(*w));
	cr_assert_eq(rpc_client_stream(f->cli, "/grpc.health.v1.Health/Watch",
				       &grpc__health__v1__health_check_response__descriptor, 0,
				       &w_cbs, w, &w->r.st),
		     0);
	cr_assert_eq(rpc_stream_send(w->r.st, &req.base), 0);
	cr_assert_eq(rpc_stream_close_send(w->r.st), 0);
}

Test(rpc, health_check_and_watch)
{
	struct fx f;
	struct watch a, u, o;
	bool done = false;
	fx_init(&f, NULL, NULL);
	cr_assert_eq(health_check(&f, f.cli, ""), RPC_HEALTH_SERVING);
	cr_assert_eq(health_check(&f, f.cli, "mooncake.master.Master"), -RPC_NOT_FOUND);
	cr_assert_eq(
		rpc_health_set(f.health, "mooncake.master.Master", RPC_HEALTH_NOT_SERVING), 0);
	cr_assert_eq(health_check(&f, f.cli, "mooncake.master.Master"),
		     RPC_HEALTH_NOT_SERVING);
	cr_assert_eq(rpc_health_set(f.health, "x", 99), -EINVAL);

	watch_start(&f, &a, "mooncake.master.Master");
	watch_start(&f, &u, "later");
	watch_start(&f, &o, "");
	RUN_UNTIL(&f, a.n == 1 && u.n == 1 && o.n == 1);
	cr_assert_eq(a.statuses[0], RPC_HEALTH_NOT_SERVING);
	cr_assert_eq(u.statuses[0], RPC_HEALTH_SERVICE_UNKNOWN);
	cr_assert_eq(o.statuses[0], RPC_HEALTH_SERVING);
	cr_assert_eq(rpc_health_set(f.health, "mooncake.master.Master", RPC_HEALTH_SERVING),
		     0);
	RUN_UNTIL(&f, a.n == 2);
	cr_assert_eq(a.statuses[1], RPC_HEALTH_SERVING);
	/* Setting the same status again sends nothing. */
	cr_assert_eq(rpc_health_set(f.health, "mooncake.master.Master", RPC_HEALTH_SERVING),
		     0);
	cr_assert_eq(rpc_health_set(f.health, "later", RPC_HEALTH_SERVING), 0);
	RUN_UNTIL(&f, u.n == 2);
	cr_assert_eq(u.statuses[1], RPC_HEALTH_SERVING);
	cr_assert_eq(a.n, 2);
	cr_assert_not(u.r.closed); /* an unknown service's watch stays open */

	/* A cancelled watcher is forgotten by the server. */
	rpc_stream_cancel(o.r.st);
	cr_assert_eq(health_check(&f, f.cli, ""), RPC_HEALTH_SERVING);

	/* Shutdown: every watcher hears NOT_SERVING, then its stream ends. */
	rpc_server_shutdown(f.srv, 5000, on_srv_done, &done);
	RUN_UNTIL(&f, a.r.closed && u.r.closed);
	cr_assert_eq(a.statuses[a.n - 1], RPC_HEALTH_NOT_SERVING);
	cr_assert_eq(u.statuses[u.n - 1], RPC_HEALTH_NOT_SERVING);
	cr_assert_eq(a.r.status, RPC_UNAVAILABLE);
	RUN_UNTIL(&f, done);
	rpc_server_free(f.srv);
	f.srv = NULL;
	fx_fini(&f);
}

/* ---------------------------------------------------------------- misc API */

Test(rpc, api_errors)
{
	uv_loop_t loop;
	struct rpc_client *c;
	struct rpc_server *s;
	uv_loop_init(&loop);
	cr_assert_eq(rpc_client_new(&loop, "nonsense", NULL, &c), -EINVAL);
	cr_assert_eq(rpc_client_new(&loop, "http://localhost:1:2", NULL, &c), -EINVAL);
	cr_assert_eq(rpc_client_new(&loop, "http://127.0.0.1:5/", NULL, &c), 0);
	rpc_client_free(c);
	cr_assert_eq(rpc_server_new(&loop, NULL, &s), 0);
	static const struct rpc_method bad[] = {
		{.name = "X",
		 .kind = RPC_BIDI_STREAMING,
		 .request = &mooncake__diag__chunk__descriptor,
		 .response = &mooncake__diag__chunk__descriptor,
		 .on_message = (void *)1}};
	cr_assert_eq(rpc_server_add_service(s, "a.B", bad, 1, NULL), -EINVAL);
	cr_assert_eq(rpc_diag_add(s), 0);
	cr_assert_eq(rpc_diag_add(s), -EEXIST);
	cr_assert_eq(rpc_server_listen(s, "bogus"), -EINVAL);
	cr_assert_eq(rpc_server_port(s, 0), 0);
	rpc_server_free(s); /* never listened: freed at once */
	uv_run(&loop, UV_RUN_DEFAULT);
	cr_assert_eq(uv_loop_close(&loop), 0);
}

Test(rpc, unary_sync)
{
	struct fx f;
	fx_init(&f, NULL, NULL);
	Grpc__Health__V1__HealthCheckRequest req =
		GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
	ProtobufCMessage *resp;
	char err[128];
	int st = rpc_client_unary_sync(f.cli, "/grpc.health.v1.Health/Check", &req.base,
				       &grpc__health__v1__health_check_response__descriptor,
				       2000, &resp, err, sizeof(err));
	cr_assert_eq(st, RPC_OK, "%s", err);
	cr_assert_eq(((Grpc__Health__V1__HealthCheckResponse *)resp)->status,
		     RPC_HEALTH_SERVING);
	protobuf_c_message_free_unpacked(resp, NULL);
	req.service = "nope";
	st = rpc_client_unary_sync(f.cli, "/grpc.health.v1.Health/Check", &req.base,
				   &grpc__health__v1__health_check_response__descriptor, 2000,
				   &resp, err, sizeof(err));
	cr_assert_eq(st, RPC_NOT_FOUND);
	cr_assert_null(resp);
	cr_assert_str_eq(err, "unknown service");
	fx_fini(&f);
}

/* ---------------------------------------------------------------- a real gRPC client */

struct child {
	uv_process_t proc;
	bool exited, closed;
	int64_t status;
};

static void on_child_exit(uv_process_t *p, int64_t status, int sig)
{
	struct child *c = MC_CONTAINER_OF(p, struct child, proc);
	c->exited = true;
	c->status = sig ? 128 + sig : status;
}

static void on_child_closed(uv_handle_t *h)
{
	struct child *c = MC_CONTAINER_OF((uv_process_t *)h, struct child, proc);
	c->closed = true;
}

/* grpcio (Python) as the client of our server: every call kind, status
 * details, 16 MiB, deadline, limits, health, cancel. The loop serves
 * while the child runs. */
Test(rpc, interop_grpcio_client)
{
	struct fx f;
	struct child ch = {0};
	char port[16], pydir[512];
	const char *build = getenv("BUILD");
	if (access("/usr/bin/python3", X_OK) != 0)
		cr_skip_test("no /usr/bin/python3");
	snprintf(pydir, sizeof(pydir), "%s/py", build && *build ? build : "build");
	char probe[600];
	snprintf(probe, sizeof(probe), "%s/diag_pb2.py", pydir);
	cr_assert_eq(access(probe, R_OK), 0, "%s missing: run through make test", probe);
	fx_init(&f, NULL, NULL);
	snprintf(port, sizeof(port), "%d", f.port);
	char *args[] = {"/usr/bin/python3", "test/integration/rpc_grpcio_client.py", port,
			pydir, NULL};
	uv_stdio_container_t stdio[3] = {
		{.flags = UV_IGNORE},
		{.flags = UV_INHERIT_FD, .data.fd = 1},
		{.flags = UV_INHERIT_FD, .data.fd = 2},
	};
	uv_process_options_t po = {.exit_cb = on_child_exit,
				   .file = args[0],
				   .args = args,
				   .stdio_count = 3,
				   .stdio = stdio};
	cr_assert_eq(uv_spawn(&f.loop, &ch.proc, &po), 0);
	uint64_t end = mc_now_ms() + 120000;
	uv_timer_start(&f.tick, on_tick, 20, 20);
	while (!ch.exited && mc_now_ms() < end)
		uv_run(&f.loop, UV_RUN_ONCE);
	uv_timer_stop(&f.tick);
	if (!ch.exited)
		uv_process_kill(&ch.proc, SIGKILL);
	RUN_UNTIL(&f, ch.exited);
	uv_close((uv_handle_t *)&ch.proc, on_child_closed);
	RUN_UNTIL(&f, ch.closed);
	if (ch.status == 77)
		cr_skip_test("grpcio not installed for /usr/bin/python3");
	cr_assert_eq(ch.status, 0, "the grpcio client reported failures (see its output)");
	fx_fini(&f);
}

/* ---------------------------------------------------------------- limits and lifetimes */

Test(rpc, server_stream_limit_queues_on_the_client)
{
	struct rpc_server_opts so = {.name = "test", .max_concurrent_streams = 10};
	struct fx f;
	enum { N = 60 };
	static struct ures rs[N];
	fx_init(&f, &so, NULL);
	/* Let the client learn the server's SETTINGS first. */
	cr_assert_eq(health_check(&f, f.cli, ""), RPC_HEALTH_SERVING);
	Mooncake__Diag__EchoRequest req = MOONCAKE__DIAG__ECHO_REQUEST__INIT;
	for (int i = 0; i < N; i++)
		echo_start(&f, f.cli, "/test.Hold/Hold", &req, 0, &rs[i]);
	/* The server never holds more than its limit; the rest wait in the
	 * client until streams close. */
	while (f.hold.started < N || f.hold.live) {
		RUN_UNTIL(&f, f.hold.live == 10 || f.hold.started == N);
		hold_release(&f.hold, RPC_OK);
	}
	for (int i = 0; i < N; i++)
		RUN_UNTIL(&f, rs[i].done);
	for (int i = 0; i < N; i++) {
		cr_assert_eq(rs[i].status, RPC_OK, "%d: %s", i, rs[i].msg);
		ures_free(&rs[i]);
	}
	cr_assert_eq(f.hold.max_live, 10);
	cr_assert_eq(rpc__client_connects(f.cli), 1);
	fx_fini(&f);
}

Test(rpc, idle_connections_are_closed)
{
	struct rpc_server_opts so = {.name = "test", .idle_timeout_ms = 100};
	struct fx f;
	struct ures r;
	fx_init(&f, &so, NULL);
	cr_assert_eq(echo(&f, "a", 1, &r), RPC_OK);
	ures_free(&r);
	RUN_UNTIL(&f, rpc__client_goaways(f.cli) == 1);
	RUN_UNTIL(&f, metric_of(&f, "mooncake_rpc_server_connections{server=\"test\"} ") == 0);
	cr_assert_eq(echo(&f, "b", 1, &r), RPC_OK, "%s", r.msg);
	ures_free(&r);
	cr_assert_eq(rpc__client_connects(f.cli), 2);
	fx_fini(&f);
}

struct pacer {
	struct sres r;
	uint8_t *chunk;
	size_t chunk_len;
	uint64_t left, sent;
	size_t max_pending;
	int drains;
};

static void pace(struct pacer *p)
{
	Mooncake__Diag__Chunk c = MOONCAKE__DIAG__CHUNK__INIT;
	while (p->left && rpc_stream_pending_bytes(p->r.st) < RPC_DRAIN_BYTES) {
		size_t n = p->left < p->chunk_len ? (size_t)p->left : p->chunk_len;
		c.data.data = p->chunk;
		c.data.len = n;
		cr_assert_eq(rpc_stream_send(p->r.st, &c.base), 0);
		p->left -= n;
		p->sent += n;
		if (rpc_stream_pending_bytes(p->r.st) > p->max_pending)
			p->max_pending = rpc_stream_pending_bytes(p->r.st);
	}
	if (!p->left)
		cr_assert_eq(rpc_stream_close_send(p->r.st), 0);
}

static void pacer_on_drain(struct rpc_stream *st, void *ud)
{
	struct pacer *p = ud;
	p->drains++;
	if (p->left)
		pace(p);
}

static void pacer_on_message(struct rpc_stream *st, void *ud, const ProtobufCMessage *msg)
{
	up_on_message(st, &((struct pacer *)ud)->r, msg);
}

static void pacer_on_close(struct rpc_stream *st, void *ud, int status, const char *m)
{
	s_on_close(st, &((struct pacer *)ud)->r, status, m);
}

static const struct rpc_stream_cbs pacer_cbs = {.on_message = pacer_on_message,
						.on_close = pacer_on_close,
						.on_drain = pacer_on_drain};

Test(rpc, client_upload_paced_by_on_drain)
{
	struct fx f;
	struct pacer p = {0};
	fx_init(&f, NULL, NULL);
	p.chunk_len = 256 * 1024;
	p.chunk = calloc(1, p.chunk_len);
	p.left = 64ull * MiB;
	cr_assert_eq(rpc_client_stream(f.cli, "/mooncake.diag.Diag/Upload",
				       &mooncake__diag__upload_summary__descriptor, 0,
				       &pacer_cbs, &p, &p.r.st),
		     0);
	pace(&p);
	RUN_UNTIL(&f, p.r.closed);
	cr_assert_eq(p.r.status, RPC_OK, "%s", p.r.msg);
	cr_assert_eq(p.r.bytes, 64ull * MiB);
	cr_assert_gt(p.drains, 10);
	/* Never much more than the threshold queued. */
	cr_assert_leq(p.max_pending, RPC_DRAIN_BYTES + p.chunk_len + 64);
	free(p.chunk);
	fx_fini(&f);
}

struct freer {
	struct fx *f;
	int calls, cancelled;
};

static void on_free_cb(void *ud, int status, const char *message, const ProtobufCMessage *resp)
{
	struct freer *x = ud;
	x->calls++;
	if (status == RPC_CANCELLED)
		x->cancelled++;
	if (x->f->cli) {
		struct rpc_client *c = x->f->cli;
		x->f->cli = NULL;
		rpc_client_free(c); /* from inside the client's own callback */
	}
}

Test(rpc, client_free_from_a_callback)
{
	struct fx f;
	struct freer x = {.f = &f};
	fx_init(&f, NULL, NULL);
	Mooncake__Diag__EchoRequest req = MOONCAKE__DIAG__ECHO_REQUEST__INIT;
	cr_assert_eq(rpc_client_unary(f.cli, "/mooncake.diag.Diag/Echo", &req.base,
				      &mooncake__diag__echo_response__descriptor, 0,
				      on_free_cb, &x, NULL),
		     0);
	for (int i = 0; i < 5; i++)
		cr_assert_eq(rpc_client_unary(f.cli, "/test.Hold/Hold", &req.base,
					      &mooncake__diag__echo_response__descriptor, 0,
					      on_free_cb, &x, NULL),
			     0);
	RUN_UNTIL(&f, x.calls == 6);
	cr_assert_eq(x.cancelled, 5);
	RUN_UNTIL(&f, f.hold.live == 0); /* the server saw them go */
	fx_fini(&f);
}

Test(rpc, refused_streams_are_retried_transparently)
{
	/* The client opens two streams before it has the server's SETTINGS
	 * (limit 1): the server refuses the second (REFUSED_STREAM) and the
	 * client sends it again, request included, once the first is done. */
	struct rpc_server_opts so = {.name = "test", .max_concurrent_streams = 1};
	struct fx f;
	struct ures a, b;
	fx_init(&f, &so, NULL);
	Mooncake__Diag__EchoRequest req = MOONCAKE__DIAG__ECHO_REQUEST__INIT;
	req.payload.data = (uint8_t *)"payload";
	req.payload.len = 7;
	echo_start(&f, f.cli, "/test.Hold/Hold", &req, 0, &a);
	echo_start(&f, f.cli, "/test.Hold/Hold", &req, 0, &b);
	RUN_UNTIL(&f, f.hold.live == 1);
	hold_release(&f.hold, RPC_OK);
	RUN_UNTIL(&f, f.hold.started == 2 && f.hold.live == 1);
	hold_release(&f.hold, RPC_OK);
	RUN_UNTIL(&f, a.done && b.done);
	cr_assert_eq(a.status, RPC_OK, "%s", a.msg);
	cr_assert_eq(b.status, RPC_OK, "%s", b.msg);
	cr_assert_eq(f.hold.max_live, 1);
	cr_assert_eq(rpc__client_connects(f.cli), 1);
	ures_free(&a);
	ures_free(&b);
	fx_fini(&f);
}

/* ---------------------------------------------------------------- in-process calls */

/* A unary answer of mooncake.diag.Chunk: status and its length. */
static void on_chunk(void *ud, int status, const char *message, const ProtobufCMessage *resp)
{
	struct ures *r = ud;
	r->done = true;
	r->status = status;
	snprintf(r->msg, sizeof(r->msg), "%s", message);
	if (resp)
		r->len = ((const Mooncake__Diag__Chunk *)resp)->data.len;
}

static void fx_init_local(struct fx *f, const struct rpc_server_opts *so)
{
	struct rpc_client_opts co = {.max_message_bytes = 64 * MiB, .local_calls = true};
	fx_init(f, so, &co);
}

Test(rpc, inproc_unary_skips_the_network)
{
	struct fx f;
	struct ures r;
	fx_init_local(&f, NULL);
	cr_assert_eq(echo(&f, "hello", 5, &r), RPC_OK, "%s", r.msg);
	cr_assert_eq(r.len, 5);
	cr_assert(memcmp(r.payload, "hello", 5) == 0);
	ures_free(&r);
	cr_assert_eq(echo(&f, "", 0, &r), RPC_OK);
	cr_assert_eq(r.len, 0);
	ures_free(&r);
	/* 16 MiB each way, copied through the serialized form. */
	uint8_t *big = malloc(16 * MiB);
	for (size_t i = 0; i < 16 * MiB; i++)
		big[i] = (uint8_t)(i * 7);
	cr_assert_eq(echo(&f, big, 16 * MiB, &r), RPC_OK, "%s", r.msg);
	cr_assert_eq(r.len, 16 * MiB);
	cr_assert(memcmp(r.payload, big, 16 * MiB) == 0);
	ures_free(&r);
	free(big);
	cr_assert_eq(rpc__client_connects(f.cli), 0, "a connection was opened");
	cr_assert_eq(rpc__client_inproc_calls(f.cli), 3);
	cr_assert_eq(metric_of(&f, "mooncake_rpc_server_calls_total{server=\"test\","
				   "method=\"/mooncake.diag.Diag/Echo\",code=\"OK\"} "),
		     3);
	cr_assert_eq(metric_of(&f, "mooncake_rpc_client_calls_total{method="
				   "\"/mooncake.diag.Diag/Echo\",code=\"OK\"} "),
		     3);
	/* Status and message, as a network call would have them. */
	Mooncake__Diag__EchoRequest req = MOONCAKE__DIAG__ECHO_REQUEST__INIT;
	req.status = RPC_FAILED_PRECONDITION;
	req.message = "not ready: 100% \"busy\"\n\tcaf\xc3\xa9";
	echo_start(&f, f.cli, "/mooncake.diag.Diag/Echo", &req, 0, &r);
	RUN_UNTIL(&f, r.done);
	cr_assert_eq(r.status, RPC_FAILED_PRECONDITION);
	cr_assert_str_eq(r.msg, req.message);
	/* Unknown methods. */
	Mooncake__Diag__EchoRequest plain = MOONCAKE__DIAG__ECHO_REQUEST__INIT;
	echo_start(&f, f.cli, "/mooncake.diag.Diag/Nope", &plain, 0, &r);
	RUN_UNTIL(&f, r.done);
	cr_assert_eq(r.status, RPC_UNIMPLEMENTED);
	cr_assert(strstr(r.msg, "Nope"), "%s", r.msg);
	echo_start(&f, f.cli, "/no.Such/Echo", &plain, 0, &r);
	RUN_UNTIL(&f, r.done);
	cr_assert_eq(r.status, RPC_UNIMPLEMENTED);
	cr_assert(strstr(r.msg, "no.Such"), "%s", r.msg);
	/* The handler sees an in-process peer; a held call answers later. */
	echo_start(&f, f.cli, "/test.Hold/Hold", &plain, 0, &r);
	RUN_UNTIL(&f, f.hold.live == 1);
	cr_assert_str_eq(f.hold.peer, "in-process");
	cr_assert_not(r.done);
	hold_release(&f.hold, RPC_OK);
	RUN_UNTIL(&f, r.done);
	cr_assert_eq(r.status, RPC_OK, "%s", r.msg);
	cr_assert(r.len == 4 && memcmp(r.payload, "held", 4) == 0);
	ures_free(&r);
	/* Streams still connect. */
	struct sres s;
	download(&f, 100000, 0, &s);
	cr_assert_eq(s.status, RPC_OK, "%s", s.msg);
	cr_assert_eq(s.bytes, 100000);
	cr_assert_eq(rpc__client_connects(f.cli), 1);
	/* So does a unary call of a streaming method: it behaves as it would
	 * over a connection (one chunk: one response). */
	unsigned before = rpc__client_inproc_calls(f.cli);
	Mooncake__Diag__DownloadRequest dl = MOONCAKE__DIAG__DOWNLOAD_REQUEST__INIT;
	dl.total_bytes = 10;
	struct ures dr = {0};
	cr_assert_eq(rpc_client_unary(f.cli, "/mooncake.diag.Diag/Download", &dl.base,
				      &mooncake__diag__chunk__descriptor, 5000, on_chunk, &dr,
				      NULL),
		     0);
	RUN_UNTIL(&f, dr.done);
	cr_assert_eq(dr.status, RPC_OK, "%s", dr.msg);
	cr_assert_eq(dr.len, 10);
	cr_assert_eq(rpc__client_inproc_calls(f.cli), before);
	/* A client without local_calls connects as before. */
	struct rpc_client *net = mk_client(&f, NULL);
	echo_start(&f, net, "/mooncake.diag.Diag/Echo", &plain, 0, &r);
	RUN_UNTIL(&f, r.done);
	cr_assert_eq(r.status, RPC_OK);
	ures_free(&r);
	cr_assert_eq(rpc__client_connects(net), 1);
	cr_assert_eq(rpc__client_inproc_calls(net), 0);
	rpc_client_free(net);
	fx_fini(&f);
}

Test(rpc, inproc_deadlines_cancels_and_limits)
{
	struct fx f;
	struct ures r;
	struct rpc_stream *st;
	struct rpc_server_opts so = {.name = "test", .max_message_bytes = 1024};
	fx_init_local(&f, &so);
	Mooncake__Diag__EchoRequest req = MOONCAKE__DIAG__ECHO_REQUEST__INIT;
	/* A deadline the handler does not meet: the caller hears
	 * DEADLINE_EXCEEDED, the handler on_cancel. */
	uint64_t t0 = mc_now_ms();
	echo_start(&f, f.cli, "/test.Hold/Hold", &req, 200, &r);
	RUN_UNTIL(&f, r.done);
	cr_assert_eq(r.status, RPC_DEADLINE_EXCEEDED, "%s", r.msg);
	cr_assert_geq(mc_now_ms() - t0, 190);
	cr_assert_gt(f.hold.deadline_ms, 0);
	RUN_UNTIL(&f, f.hold.live == 0);
	cr_assert_eq(f.hold.cancels, 1);
	/* Cancelled by the caller while the handler holds it. */
	memset(&r, 0, sizeof(r));
	cr_assert_eq(rpc_client_unary(f.cli, "/test.Hold/Hold", &req.base,
				      &mooncake__diag__echo_response__descriptor, 0, on_unary,
				      &r, &st),
		     0);
	RUN_UNTIL(&f, f.hold.live == 1);
	rpc_stream_cancel(st);
	cr_assert_eq(f.hold.cancels, 2);
	/* Cancelled before its turn: the handler never sees it. */
	cr_assert_eq(rpc_client_unary(f.cli, "/test.Hold/Hold", &req.base,
				      &mooncake__diag__echo_response__descriptor, 0, on_unary,
				      &r, &st),
		     0);
	rpc_stream_cancel(st);
	cr_assert_eq(echo(&f, "a", 1, &r), RPC_OK);
	ures_free(&r);
	cr_assert_eq(f.hold.started, 2);
	/* Above the server's message limit. */
	char big[4096] = {0};
	cr_assert_eq(echo(&f, big, sizeof(big), &r), RPC_RESOURCE_EXHAUSTED, "%s", r.msg);
	/* The client freed with a call in flight: CANCELLED, handler told. */
	echo_start(&f, f.cli, "/test.Hold/Hold", &req, 0, &r);
	RUN_UNTIL(&f, f.hold.live == 1);
	rpc_client_free(f.cli);
	f.cli = NULL;
	cr_assert(r.done);
	cr_assert_eq(r.status, RPC_CANCELLED);
	cr_assert_eq(f.hold.cancels, 3);
	fx_fini(&f);
}

Test(rpc, inproc_calls_drain_at_shutdown)
{
	struct fx f;
	struct ures a, b, c;
	fx_init_local(&f, NULL);
	Mooncake__Diag__EchoRequest req = MOONCAKE__DIAG__ECHO_REQUEST__INIT;
	echo_start(&f, f.cli, "/test.Hold/Hold", &req, 0, &a);
	echo_start(&f, f.cli, "/test.Hold/Hold", &req, 0, &b);
	RUN_UNTIL(&f, f.hold.live == 2);
	bool done = false;
	rpc_server_shutdown(f.srv, 300, on_srv_done, &done);
	/* A call that ends during the drain is answered. */
	struct rpc_call *first = f.hold.calls[0];
	f.hold.calls[0] = NULL;
	f.hold.live--;
	Mooncake__Diag__EchoResponse resp = MOONCAKE__DIAG__ECHO_RESPONSE__INIT;
	cr_assert_eq(rpc_call_send(first, &resp.base), 0);
	rpc_call_finish(first, RPC_OK, NULL);
	RUN_UNTIL(&f, a.done);
	cr_assert_eq(a.status, RPC_OK, "%s", a.msg);
	/* New calls no longer go in-process: the listener is closed. */
	echo_start(&f, f.cli, "/mooncake.diag.Diag/Echo", &req, 0, &c);
	RUN_UNTIL(&f, c.done);
	cr_assert_eq(c.status, RPC_UNAVAILABLE, "%s", c.msg);
	/* The one still held ends with the drain. */
	RUN_UNTIL(&f, b.done);
	cr_assert_eq(b.status, RPC_UNAVAILABLE, "%s", b.msg);
	cr_assert(strstr(b.msg, "shutting down"), "%s", b.msg);
	cr_assert_eq(f.hold.cancels, 1);
	RUN_UNTIL(&f, done);
	rpc_server_free(f.srv);
	f.srv = NULL;
	ures_free(&a);
	fx_fini(&f);
}

/* ---------------------------------------------------------------- lent payloads */

/* What rpc_client_unary_lend's release saw: how often it ran, whether
 * the call's callback had run by then, and the buffer it was given. */
struct lendrec {
	struct ures *r;
	unsigned released;
	bool cb_before;
	void *buf;
	size_t len;
};

static void on_lend_released(void *ctx, void *buf, size_t len)
{
	struct lendrec *l = ctx;
	l->released++;
	l->cb_before = l->r->done;
	l->buf = buf;
	l->len = len;
}

static int lend_start(struct fx *f, const char *path, Mooncake__Diag__EchoRequest *req,
		      uint64_t timeout_ms, struct ures *r, struct lendrec *l,
		      struct rpc_stream **st)
{
	memset(r, 0, sizeof(*r));
	memset(l, 0, sizeof(*l));
	l->r = r;
	struct rpc_lend lend = {
		.buf = req->payload.data,
		.len = req->payload.len,
		.release = on_lend_released,
		.ctx = l,
	};
	int rc = rpc_client_unary_lend(f->cli, path, &req->base, &lend,
				       &mooncake__diag__echo_response__descriptor, timeout_ms,
				       on_unary, r, st);
	cr_assert_not(r->done, "callback ran inside rpc_client_unary_lend");
	cr_assert_eq(l->released, 0, "release ran inside rpc_client_unary_lend");
	return rc;
}

/* An Echo request of len bytes of data (borrowed) and msg (may be NULL). */
static Mooncake__Diag__EchoRequest echo_req(uint8_t *data, size_t len, const char *msg)
{
	Mooncake__Diag__EchoRequest req = MOONCAKE__DIAG__ECHO_REQUEST__INIT;
	req.payload.data = data;
	req.payload.len = len;
	if (msg)
		req.message = (char *)msg;
	return req;
}

static uint8_t *pattern_buf(size_t n, uint8_t mul)
{
	uint8_t *p = malloc(n);
	cr_assert(p);
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(i * mul + 1);
	return p;
}

/* The lent bytes go out from the caller's buffer: changed after the call
 * returned (which a real caller must not do), the change is what the
 * server echoes. A small field is copied as before. Either way release
 * runs once, after the callback, with the lent buffer. */
Test(rpc, unary_lend_sends_from_the_buffer_and_releases_after_the_callback)
{
	struct fx f;
	struct ures r;
	struct lendrec l;
	fx_init(&f, NULL, NULL);
	size_t n = 4 * MiB;
	uint8_t *big = pattern_buf(n, 7);
	Mooncake__Diag__EchoRequest req = echo_req(
		big, n, "fields after the lent one keep their place");
	cr_assert_eq(lend_start(&f, "/mooncake.diag.Diag/Echo", &req, 0, &r, &l, NULL), 0);
	big[0] ^= 0xff;
	big[n - 1] ^= 0xff;
	RUN_UNTIL(&f, l.released);
	cr_assert_eq(r.status, RPC_OK, "%s", r.msg);
	cr_assert_eq(r.len, n);
	cr_assert(memcmp(r.payload, big, n) == 0, "the echo is not the lent buffer's bytes");
	cr_assert(l.cb_before, "released before the callback");
	cr_assert_eq(l.buf, big);
	cr_assert_eq(l.len, n);
	ures_free(&r);

	/* A field below the size sent by reference is copied; the buffer is
	 * still held until the call is over. */
	uint8_t small[16];
	memcpy(small, "0123456789abcdef", sizeof(small));
	req.payload.data = small;
	req.payload.len = sizeof(small);
	req.message = NULL;
	cr_assert_eq(lend_start(&f, "/mooncake.diag.Diag/Echo", &req, 0, &r, &l, NULL), 0);
	small[0] = 'X';
	RUN_UNTIL(&f, l.released);
	cr_assert_eq(r.status, RPC_OK, "%s", r.msg);
	cr_assert_eq(r.len, sizeof(small));
	cr_assert(memcmp(r.payload, "0123456789abcdef", sizeof(small)) == 0);
	cr_assert(l.cb_before);
	ures_free(&r);

	/* A buffer that does not hold the field: the field is copied. */
	uint8_t other[8];
	Mooncake__Diag__EchoRequest req2 = echo_req(big, n, NULL);
	struct rpc_lend lend = {other, sizeof(other), on_lend_released, &l};
	memset(&r, 0, sizeof(r));
	memset(&l, 0, sizeof(l));
	l.r = &r;
	cr_assert_eq(rpc_client_unary_lend(f.cli, "/mooncake.diag.Diag/Echo", &req2.base,
					   &lend, &mooncake__diag__echo_response__descriptor,
					   0, on_unary, &r, NULL),
		     0);
	big[1] ^= 0xff;
	RUN_UNTIL(&f, l.released);
	cr_assert_eq(r.status, RPC_OK, "%s", r.msg);
	cr_assert_eq(r.payload[1], (uint8_t)(big[1] ^ 0xff),
		     "a field outside the buffer was not copied");
	cr_assert_eq(l.buf, other);
	ures_free(&r);
	free(big);
	fx_fini(&f);
}

/* Refused calls leave the buffer the caller's: release never runs. */
Test(rpc, unary_lend_errors_keep_the_buffer)
{
	struct fx f;
	struct ures r;
	struct lendrec l = {.r = &r};
	struct rpc_client_opts co = {.max_message_bytes = MiB};
	fx_init(&f, NULL, &co);
	uint8_t *big = pattern_buf(2 * MiB, 3);
	Mooncake__Diag__EchoRequest req = echo_req(big, 2 * MiB, NULL);
	cr_assert_eq(lend_start(&f, "/mooncake.diag.Diag/Echo", &req, 0, &r, &l, NULL),
		     MC_ETOO_LARGE);
	cr_assert_eq(lend_start(&f, "no-slash", &req, 0, &r, &l, NULL), -EINVAL);
	struct rpc_lend bad = {big, 2 * MiB, NULL, &l};
	cr_assert_eq(rpc_client_unary_lend(f.cli, "/mooncake.diag.Diag/Echo", &req.base, &bad,
					   &mooncake__diag__echo_response__descriptor, 0,
					   on_unary, &r, NULL),
		     -EINVAL);
	cr_assert_eq(rpc_client_unary_lend(f.cli, "/mooncake.diag.Diag/Echo", &req.base, NULL,
					   &mooncake__diag__echo_response__descriptor, 0,
					   on_unary, &r, NULL),
		     -EINVAL);
	/* Give the loop a turn: nothing may run late either. */
	cr_assert_eq(echo(&f, "a", 1, &r), RPC_OK);
	ures_free(&r);
	cr_assert_eq(l.released, 0);
	free(big);
	fx_fini(&f);
}

/* A call that dies first (deadline, cancel, lost server) still releases
 * the buffer exactly once, and only when no write points into it. */
Test(rpc, unary_lend_released_once_when_the_call_dies)
{
	struct fx f;
	struct ures r;
	struct lendrec l;
	struct rpc_stream *st;
	fx_init(&f, NULL, NULL);
	uint8_t *big = pattern_buf(8 * MiB, 5);
	Mooncake__Diag__EchoRequest req = echo_req(big, 8 * MiB, NULL);

	cr_assert_eq(lend_start(&f, "/test.Hold/Hold", &req, 200, &r, &l, NULL), 0);
	RUN_UNTIL(&f, l.released);
	cr_assert_eq(r.status, RPC_DEADLINE_EXCEEDED, "%s", r.msg);
	cr_assert(l.cb_before);

	/* Cancelled before its request left, and while it is held. */
	cr_assert_eq(lend_start(&f, "/test.Hold/Hold", &req, 0, &r, &l, &st), 0);
	rpc_stream_cancel(st);
	RUN_UNTIL(&f, l.released);
	cr_assert_not(r.done);
	cr_assert_eq(lend_start(&f, "/test.Hold/Hold", &req, 0, &r, &l, &st), 0);
	RUN_UNTIL(&f, f.hold.live == 1);
	rpc_stream_cancel(st);
	RUN_UNTIL(&f, l.released);

	/* The client freed with the call in flight. */
	cr_assert_eq(lend_start(&f, "/test.Hold/Hold", &req, 0, &r, &l, NULL), 0);
	rpc_client_free(f.cli);
	f.cli = NULL;
	cr_assert_eq(r.status, RPC_CANCELLED);
	RUN_UNTIL(&f, l.released);
	cr_assert(l.cb_before);
	RUN_UNTIL(&f, f.hold.live == 0);
	cr_assert_eq(l.released, 1);
	free(big);
	fx_fini(&f);
}

/* In process the lent field is copied once into the request the server
 * reads, and the buffer is released like over a connection. */
Test(rpc, unary_lend_in_process)
{
	struct fx f;
	struct ures r;
	struct lendrec l;
	fx_init_local(&f, NULL);
	size_t n = 2 * MiB;
	uint8_t *big = pattern_buf(n, 11);
	Mooncake__Diag__EchoRequest req = echo_req(big, n, "after");
	cr_assert_eq(lend_start(&f, "/mooncake.diag.Diag/Echo", &req, 0, &r, &l, NULL), 0);
	RUN_UNTIL(&f, l.released);
	cr_assert_eq(r.status, RPC_OK, "%s", r.msg);
	cr_assert_eq(r.len, n);
	cr_assert(memcmp(r.payload, big, n) == 0);
	cr_assert(l.cb_before);
	cr_assert_eq(rpc__client_connects(f.cli), 0, "a connection was opened");
	cr_assert_eq(rpc__client_inproc_calls(f.cli), 1);
	ures_free(&r);
	free(big);
	fx_fini(&f);
}
