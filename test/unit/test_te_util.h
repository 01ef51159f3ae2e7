/*
 * test_te_util: two transfer engines in one process (P2P mode, loopback)
 * with their loop on a thread, for test_te_engine.c and
 * test_rdma_engine.c: start and stop (the engines are created on the
 * loop's thread, as te_new wants), running a function on the loop,
 * memfd-backed registered memory, opening engine 1's segment from engine
 * 0, and reading a metric of one engine's own registry. Stopping checks
 * that te_free freed every transport peer object (mooncake_te_peers 0).
 */
#ifndef MC_TEST_TE_UTIL_H
#define MC_TEST_TE_UTIL_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/metrics.h"
#include "common/util.h"
#include "rpc/rpc.h"
#include "transfer/te_int.h"

struct host {
	uv_loop_t loop;
	pthread_t tid;
	uv_async_t call;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	void (*fn)(struct host *h); /* calls call_done when finished */
	bool called, stopping;
	int stopped;
	struct rpc_server *rpc[2];
	struct te_engine *e[2];
	struct metrics_registry *m[2];
	struct te_opts opts[2];
	int start_rc[2];
};

static struct host H;

static inline void on_rpc_done(struct rpc_server *s, void *ud)
{
	(void)s;
	(void)ud;
}

static inline void on_te_stopped(struct te_engine *e, void *ud)
{
	struct host *h = ud;
	(void)e;
	if (++h->stopped == 2) {
		rpc_server_shutdown(h->rpc[0], 0, on_rpc_done, NULL);
		rpc_server_shutdown(h->rpc[1], 0, on_rpc_done, NULL);
		uv_close((uv_handle_t *)&h->call, NULL);
	}
}

static inline void on_call(uv_async_t *a)
{
	struct host *h = a->data;
	if (h->stopping) {
		te_stop(h->e[0], on_te_stopped, h);
		te_stop(h->e[1], on_te_stopped, h);
		return;
	}
	h->fn(h);
}

static inline void call_done(struct host *h)
{
	pthread_mutex_lock(&h->mu);
	h->called = true;
	pthread_cond_signal(&h->cv);
	pthread_mutex_unlock(&h->mu);
}

/* Run fn on the loop thread; it calls call_done when finished. */
static inline void run_on_loop(struct host *h, void (*fn)(struct host *h))
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

static void *loop_main(void *arg)
{
	uv_run(&((struct host *)arg)->loop, UV_RUN_DEFAULT);
	return NULL;
}

static inline void start_engines(struct host *h)
{
	for (int i = 0; i < 2; i++)
		h->start_rc[i] = te_new(&h->opts[i], &h->e[i]);
	call_done(h);
}

/* Engines with t[i]'s protocol, threads, connections, slice size and
 * rdma fields (loop, rpc, listeners and metrics are the host's). */
static inline void host_start_with(const struct te_opts t[2])
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
		h->m[i] = metrics_registry_new();
		h->opts[i] = t[i];
		h->opts[i].loop = &h->loop;
		h->opts[i].rpc = h->rpc[i];
		h->opts[i].rpc_port = (uint16_t)rpc_server_port(h->rpc[i], 0);
		h->opts[i].data_listen = "127.0.0.1:0";
		h->opts[i].metrics = h->m[i];
		if (!t[i].cluster_secret && !t[i].insecure) {
			/* Both engines prove one secret unless the test says. */
			h->opts[i].cluster_secret = (const uint8_t *)"unit-test-secret";
			h->opts[i].cluster_secret_len = 16;
		}
	}
	uv_async_init(&h->loop, &h->call, on_call);
	h->call.data = h;
	cr_assert_eq(pthread_create(&h->tid, NULL, loop_main, h), 0);
	run_on_loop(h, start_engines);
	cr_assert_eq(h->start_rc[0], 0);
	cr_assert_eq(h->start_rc[1], 0);
}

/* The value of the sample "name{labels} " (the text up to the value) in
 * engine i's registry, or -1. */
static inline double metric(int i, const char *sample)
{
	struct mc_buf b = {0};
	char want[192];
	cr_assert_eq(metrics_format(H.m[i], &b), 0);
	cr_assert_eq(mc_buf_append(&b, "", 1), 0);
	snprintf(want, sizeof(want), "\n%s", sample); /* not the # HELP line */
	const char *p = strstr(b.data, want);
	double v = p ? strtod(p + strlen(want), NULL) : -1;
	mc_buf_free(&b);
	return v;
}

static inline void host_stop(void)
{
	struct host *h = &H;
	h->stopping = true;
	uv_async_send(&h->call);
	pthread_join(h->tid, NULL);
	te_free(h->e[0]);
	te_free(h->e[1]);
	/* The registries outlive the engines: a peer whose last reference
	 * was never dropped still counts. */
	static const char *const protos[] = {"tcp", "rdma", "shm"};
	for (int i = 0; i < 2; i++) {
		for (size_t k = 0; k < 3; k++) {
			char sample[64];
			snprintf(sample, sizeof(sample),
				 "mooncake_te_peers{transport=\"%s\"} ", protos[k]);
			cr_assert_eq(metric(i, sample), 0,
				     "engine %d: %s peer objects left "
				     "after te_free: %g",
				     i, protos[k], metric(i, sample));
		}
	}
	rpc_server_free(h->rpc[0]);
	rpc_server_free(h->rpc[1]);
	metrics_registry_free(h->m[0]);
	metrics_registry_free(h->m[1]);
	cr_assert_eq(uv_loop_close(&h->loop), 0, "every handle closed");
}

struct mem {
	uint8_t *p;
	size_t len;
	int fd;
	struct te_region *r;
};

/* memfd-backed memory, not registered yet. */
static inline void mem_map(size_t len, struct mem *m)
{
	m->fd = memfd_create("t", MFD_CLOEXEC);
	cr_assert(m->fd >= 0);
	cr_assert_eq(ftruncate(m->fd, (off_t)len), 0);
	m->p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, m->fd, 0);
	cr_assert(m->p != MAP_FAILED);
	m->len = len;
	m->r = NULL;
}

/* ... registered with e at its own address. */
static inline void mem_new(struct te_engine *e, size_t len, struct mem *m)
{
	mem_map(len, m);
	cr_assert_eq(te_register(e, (uint64_t)(uintptr_t)m->p, m->p, len, m->fd, 0, &m->r), 0);
}

static inline void mem_free(struct mem *m)
{
	if (m->r)
		te_unregister(m->r);
	munmap(m->p, m->len);
	close(m->fd);
}

static inline struct te_segment *open_b(void)
{
	struct te_segment *s;
	cr_assert_eq(te_open_segment(H.e[0], te_name(H.e[1]), &s), 0);
	return s;
}

/* Wait (up to 20 s) until metric(i, sample) >= min. */
static inline void wait_metric(int i, const char *sample, double min)
{
	uint64_t deadline = mc_now_ms() + 20000;
	while (metric(i, sample) < min) {
		cr_assert(mc_now_ms() < deadline, "%s stayed below %g", sample, min);
		usleep(1000);
	}
}

#endif
