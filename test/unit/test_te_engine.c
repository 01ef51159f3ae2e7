/*
 * test_te_engine: whole engines in one process (P2P mode, loopback), their
 * loop on a thread: the open-once cache and the async open from the loop,
 * a TCP connection shut down under a stream (its slices go to the other
 * connections and every byte arrives), te_wait_published in P2P mode, and
 * the control channel a transport such as rdma uses for its handshake
 * (a fake transport's on_ctrl answering through te__ctrl_call).
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "rpc/rpc.h"
#include "transfer/te_int.h"

struct host {
	uv_loop_t loop;
	pthread_t tid;
	uv_async_t call;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	void (*fn)(struct host *h);
	bool called, stopping;
	int stopped;
	struct rpc_server *rpc[2];
	struct te_engine *e[2];
};

static void on_rpc_done(struct rpc_server *s, void *ud)
{
	(void)s;
	(void)ud;
}

static void on_te_stopped(struct te_engine *e, void *ud)
{
	struct host *h = ud;
	(void)e;
	if (++h->stopped == 2) {
		rpc_server_shutdown(h->rpc[0], 0, on_rpc_done, NULL);
		rpc_server_shutdown(h->rpc[1], 0, on_rpc_done, NULL);
		uv_close((uv_handle_t *)&h->call, NULL);
	}
}

static void on_call(uv_async_t *a)
{
	struct host *h = a->data;
	if (h->stopping) {
		te_stop(h->e[0], on_te_stopped, h);
		te_stop(h->e[1], on_te_stopped, h);
		return;
	}
	h->fn(h);
}

/* Run fn on the loop thread; it calls call_done when finished. */
static void run_on_loop(struct host *h, void (*fn)(struct host *h))
{
	pthread_mutex_lock(&h->mu);
	h->fn = fn;
	h->called = false;
	pthread_mutex_unlock(&h->mu);
	uv_async_send(&h->call);
	pthread_mutex_lock(&h->mu);
	while (!h->called)
		pthread_cond_wait(&h->cv, &h->mu);
	pthread_mutex_unlock(&h->mu);
}

static void call_done(struct host *h)
{
	pthread_mutex_lock(&h->mu);
	h->called = true;
	pthread_cond_signal(&h->cv);
	pthread_mutex_unlock(&h->mu);
}

static void *loop_main(void *arg)
{
	uv_run(&((struct host *)arg)->loop, UV_RUN_DEFAULT);
	return NULL;
}

static struct host H;

static void host_start(enum te_protocol pa)
{
	struct host *h = &H;
	memset(h, 0, sizeof(*h));
	cr_assert_eq(uv_loop_init(&h->loop), 0);
	pthread_mutex_init(&h->mu, NULL);
	pthread_cond_init(&h->cv, NULL);
	for (int i = 0; i < 2; i++) {
		struct rpc_server_opts ro = {.name = "t"};
		cr_assert_eq(rpc_server_new(&h->loop, &ro, &h->rpc[i]), 0);
		cr_assert_eq(rpc_server_listen(h->rpc[i], "127.0.0.1:0"), 0);
		struct te_opts o = {
			.loop = &h->loop,
			.rpc = h->rpc[i],
			.rpc_port = (uint16_t)rpc_server_port(h->rpc[i], 0),
			.data_listen = "127.0.0.1:0",
			.protocol = i == 0 ? pa : TE_PROTO_AUTO,
			.threads = 2,
			.tcp_conns = 4,
			.slice_bytes = 64 << 10,
			.metrics = NULL,
		};
		cr_assert_eq(te_new(&o, &h->e[i]), 0);
	}
	uv_async_init(&h->loop, &h->call, on_call);
	h->call.data = h;
	cr_assert_eq(pthread_create(&h->tid, NULL, loop_main, h), 0);
}

static void host_stop(void)
{
	struct host *h = &H;
	h->stopping = true;
	uv_async_send(&h->call);
	pthread_join(h->tid, NULL);
	te_free(h->e[0]);
	te_free(h->e[1]);
	rpc_server_free(h->rpc[0]);
	rpc_server_free(h->rpc[1]);
	cr_assert_eq(uv_loop_close(&h->loop), 0, "every handle closed");
}

struct mem {
	uint8_t *p;
	size_t len;
	int fd;
	struct te_region *r;
};

static void mem_new(struct te_engine *e, size_t len, struct mem *m)
{
	m->fd = memfd_create("t", MFD_CLOEXEC);
	cr_assert(m->fd >= 0);
	cr_assert_eq(ftruncate(m->fd, (off_t)len), 0);
	m->p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, m->fd, 0);
	cr_assert(m->p != MAP_FAILED);
	m->len = len;
	cr_assert_eq(te_register(e, (uint64_t)(uintptr_t)m->p, m->p, len, m->fd, 0, &m->r),
		     0);
}

static void mem_free(struct mem *m)
{
	te_unregister(m->r);
	munmap(m->p, m->len);
	close(m->fd);
}

static struct te_segment *open_b(void)
{
	struct te_segment *s;
	cr_assert_eq(te_open_segment(H.e[0], te_name(H.e[1]), &s), 0);
	return s;
}

Test(te_engine, open_once_and_published)
{
	host_start(TE_PROTO_TCP);
	cr_assert_eq(te_wait_published(H.e[0], 1000), 0, "P2P: nothing to publish");
	struct te_segment *s1 = open_b(), *s2 = open_b();
	cr_assert_eq(s1, s2, "one handle per name");
	struct te_segment_info info;
	cr_assert_eq(te_segment_info(s1, &info, NULL, 0), 0);
	cr_assert_eq(info.transport, TE_PROTO_TCP);
	struct te_segment *bad;
	cr_assert_neq(te_open_segment(H.e[0], "127.0.0.1:1", &bad), 0);
	cr_assert_eq(te_open_segment(H.e[0], "", &bad), -EINVAL);
	te_close_segment(s1);
	te_close_segment(s2);
	host_stop();
}

static int async_err[2];
static struct te_segment *async_seg;

static void on_open(void *ud, int err, struct te_segment *s)
{
	int i = (int)(intptr_t)ud;
	async_err[i] = err ? err : 1;
	if (!err)
		async_seg = s;
	if (async_err[0] && async_err[1])
		call_done(&H);
}

static void open_async(struct host *h)
{
	char bad[] = "127.0.0.1:1";
	cr_assert_eq(te_open_segment_async(h->e[0], te_name(h->e[1]), on_open, (void *)0), 0);
	cr_assert_eq(te_open_segment_async(h->e[0], bad, on_open, (void *)1), 0);
	cr_assert_eq(async_err[0] + async_err[1], 0, "callbacks never run inside the call");
}

Test(te_engine, async_open_on_the_loop)
{
	host_start(TE_PROTO_AUTO);
	run_on_loop(&H, open_async);
	cr_assert_eq(async_err[0], 1);
	cr_assert(async_err[1] < 0);
	struct te_segment_info info;
	te_segment_info(async_seg, &info, NULL, 0);
	cr_assert_eq(info.transport, TE_PROTO_SHM, "same host: shm");
	te_close_segment(async_seg);
	host_stop();
}

/* The port of the peer of a connected TCP socket, or 0. */
static int peer_port(int fd)
{
	struct sockaddr_in sa;
	socklen_t sl = sizeof(sa);
	if (getpeername(fd, (struct sockaddr *)&sa, &sl) != 0 || sa.sin_family != AF_INET)
		return 0;
	return ntohs(sa.sin_port);
}

Test(te_engine, connection_shut_down_under_a_stream)
{
	host_start(TE_PROTO_TCP);
	struct mem b, src, dst;
	mem_new(H.e[1], 64 << 20, &b);
	mem_new(H.e[0], 64 << 20, &src);
	mem_new(H.e[0], 64 << 20, &dst);
	for (size_t i = 0; i < src.len; i++)
		src.p[i] = (uint8_t)(i * 2654435761u >> 24);
	struct te_segment *s = open_b();
	/* the engine's connections to B's data port */
	pthread_mutex_lock(&s->mu);
	uint16_t dport = s->desc->data_port;
	pthread_mutex_unlock(&s->mu);
	int fds[8], n = 0;
	DIR *d = opendir("/proc/self/fd");
	for (struct dirent *de; (de = readdir(d));) {
		int fd = atoi(de->d_name);
		if (de->d_name[0] != '.' && peer_port(fd) == dport && n < 8)
			fds[n++] = fd;
	}
	closedir(d);
	cr_assert_eq(n, 4, "four connections to the peer");

	struct te_request q[64];
	for (int i = 0; i < 64; i++)
		q[i] = (struct te_request){TE_WRITE, src.p + (size_t)i * (1 << 20), s,
					   (uint64_t)(uintptr_t)b.p + (size_t)i * (1 << 20),
					   1 << 20};
	struct te_batch *bt;
	cr_assert_eq(te_submit(H.e[0], q, 64, &bt), 0);
	shutdown(fds[1], SHUT_RDWR); /* one path dies under the stream */
	cr_assert_eq(te_wait(bt, 60000), 0);
	struct te_result res[64];
	te_poll(bt, res);
	for (int i = 0; i < 64; i++)
		cr_assert_eq(res[i].status, TE_DONE, "request %d: %d", i, res[i].err);
	te_batch_free(bt);
	cr_assert(memcmp(b.p, src.p, b.len) == 0, "every byte arrived");
	/* reads use the three connections left */
	for (int i = 0; i < 64; i++) {
		q[i].op = TE_READ;
		q[i].local = dst.p + (size_t)i * (1 << 20);
	}
	cr_assert_eq(te_submit(H.e[0], q, 64, &bt), 0);
	cr_assert_eq(te_wait(bt, 60000), 0);
	cr_assert_eq(te_poll(bt, res), 0);
	for (int i = 0; i < 64; i++)
		cr_assert_eq(res[i].status, TE_DONE);
	te_batch_free(bt);
	cr_assert(memcmp(dst.p, src.p, dst.len) == 0);
	cr_assert_eq(__builtin_popcount(atomic_load(&s->remote->alive)), 3);
	te_close_segment(s);
	mem_free(&b);
	mem_free(&src);
	mem_free(&dst);
	host_stop();
}

/* A transport that takes control messages, as rdma will. */
static int fake_ctrl(struct te_xport *x, const char *peer, void **conn, const uint8_t *in,
		     size_t inlen, uint8_t *out, size_t *outlen)
{
	(void)x;
	(void)conn;
	if (inlen == 4 && memcmp(in, "busy", 4) == 0)
		return -EBUSY;
	int n = snprintf((char *)out, *outlen, "pong %.*s from %s", (int)inlen, in, peer);
	*outlen = (size_t)n;
	return 0;
}

static void fake_fini(struct te_xport *x)
{
	(void)x;
}

static const struct te_xport_ops fake_ops = {
	.name = "fake-rdma", .proto = TE_PROTO_RDMA, .fini = fake_fini,
	.on_ctrl = fake_ctrl};

Test(te_engine, control_channel)
{
	host_start(TE_PROTO_TCP);
	static int dummy;
	H.e[1]->xops[TE_PROTO_RDMA] = &fake_ops;
	H.e[1]->xp[TE_PROTO_RDMA] = (struct te_xport *)&dummy;
	struct te_segment *s = open_b();
	struct te_desc *d;
	pthread_mutex_lock(&s->mu);
	cr_assert_eq(te__desc_copy(s->desc, &d), 0);
	pthread_mutex_unlock(&s->mu);
	uint8_t out[256];
	size_t outlen = sizeof(out);
	cr_assert_eq(te__ctrl_call(H.e[0], d, TE_PROTO_RDMA, (const uint8_t *)"ping", 4, out,
				   &outlen, 5000),
		     0);
	char want[300];
	snprintf(want, sizeof(want), "pong ping from %s", te_name(H.e[0]));
	cr_assert_eq(outlen, strlen(want));
	cr_assert(memcmp(out, want, outlen) == 0);
	outlen = sizeof(out);
	cr_assert_eq(te__ctrl_call(H.e[0], d, TE_PROTO_RDMA, (const uint8_t *)"busy", 4, out,
				   &outlen, 5000),
		     -EBUSY);
	outlen = sizeof(out);
	cr_assert_eq(te__ctrl_call(H.e[0], d, TE_PROTO_SHM, (const uint8_t *)"x", 1, out,
				   &outlen, 5000),
		     -EPROTONOSUPPORT);
	outlen = 3; /* the answer does not fit */
	cr_assert_eq(te__ctrl_call(H.e[0], d, TE_PROTO_RDMA, (const uint8_t *)"ping", 4, out,
				   &outlen, 5000),
		     -EOVERFLOW);
	te__desc_free(d);
	te_close_segment(s);
	host_stop(); /* te_free calls the fake fini */
}
