/*
 * ctl_bench_msrv: a master for the benchmarks, in this process on a
 * thread and loop of its own, serving mooncake.master.Master and
 * mooncake.diag.Diag on 127.0.0.1 (no meta: it leads at once, view 1,
 * with an empty index). `bench master` measures one; `bench resync`
 * stops one and starts another as a failover does.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "common/metrics.h"
#include "common/util.h"
#include "ctl/ctl_int.h"
#include "master/master.h"
#include "rpc/rpc.h"

struct ctl_msrv {
	pthread_t tid;
	uv_loop_t loop;
	uv_async_t stop;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool ready;
	int port;
	uint64_t agent_ttl_ms;
	struct metrics_registry *reg;
	struct rpc_server *rpc;
	struct master *m;
};

static void srv_rpc_done(struct rpc_server *s, void *ud)
{
	struct ctl_msrv *t = ud;
	master_free(t->m);
	t->m = NULL;
	rpc_server_free(s);
}

static void srv_master_stopped(void *ud)
{
	struct ctl_msrv *t = ud;
	rpc_server_shutdown(t->rpc, 1000, srv_rpc_done, t);
}

static void srv_on_stop(uv_async_t *a)
{
	struct ctl_msrv *t = MC_CONTAINER_OF(a, struct ctl_msrv, stop);
	uv_close((uv_handle_t *)a, NULL);
	if (t->m)
		master_stop(t->m, srv_master_stopped, t);
	else if (t->rpc)
		rpc_server_shutdown(t->rpc, 0, srv_rpc_done, t);
}

static void *srv_main(void *arg)
{
	struct ctl_msrv *t = arg;
	struct rpc_server_opts so = {
		.name = "bench-master", .max_message_bytes = 256u << 20, .metrics = t->reg};
	int rc = rpc_server_new(&t->loop, &so, &t->rpc);
	if (rc == 0)
		rc = rpc_diag_add(t->rpc);
	struct master_opts mo = {
		.loop = &t->loop,
		.rpc = t->rpc,
		.metrics = t->reg,
		.listen = "127.0.0.1:0",
		.cluster_id = "bench",
		.meta_endpoints = "",
		.agent_ttl_ms = t->agent_ttl_ms,
		.put_timeout_ms = 3600000,
		.lease_ttl_ms = 5000,
		.leader_lease_ttl_ms = 5000,
		.high_watermark = 0.9,
		.eviction_ratio = 0.1,
	};
	if (rc == 0)
		rc = master_new(&mo, &t->m);
	if (rc == 0)
		rc = rpc_server_listen(t->rpc, "127.0.0.1:0");
	pthread_mutex_lock(&t->mu);
	t->port = rc == 0 ? rpc_server_port(t->rpc, 0) : 0;
	t->ready = true;
	pthread_cond_signal(&t->cv);
	pthread_mutex_unlock(&t->mu);
	uv_run(&t->loop, UV_RUN_DEFAULT);
	return NULL;
}

static void srv_free(struct ctl_msrv *t)
{
	(void)uv_loop_close(&t->loop);
	metrics_registry_free(t->reg);
	pthread_mutex_destroy(&t->mu);
	pthread_cond_destroy(&t->cv);
	free(t);
}

int ctl_msrv_start(uint64_t agent_ttl_ms, struct ctl_msrv **out)
{
	struct ctl_msrv *t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	pthread_mutex_init(&t->mu, NULL);
	pthread_cond_init(&t->cv, NULL);
	t->agent_ttl_ms = agent_ttl_ms;
	t->reg = metrics_registry_new();
	if (!t->reg || uv_loop_init(&t->loop)) {
		metrics_registry_free(t->reg);
		pthread_mutex_destroy(&t->mu);
		pthread_cond_destroy(&t->cv);
		free(t);
		return -ENOMEM;
	}
	uv_async_init(&t->loop, &t->stop, srv_on_stop);
	if (pthread_create(&t->tid, NULL, srv_main, t)) {
		uv_close((uv_handle_t *)&t->stop, NULL);
		uv_run(&t->loop, UV_RUN_DEFAULT);
		srv_free(t);
		return -EAGAIN;
	}
	pthread_mutex_lock(&t->mu);
	while (!t->ready)
		pthread_cond_wait(&t->cv, &t->mu);
	pthread_mutex_unlock(&t->mu);
	if (!t->port) {
		ctl_msrv_stop(t);
		return -EADDRNOTAVAIL;
	}
	*out = t;
	return 0;
}

int ctl_msrv_port(const struct ctl_msrv *t)
{
	return t->port;
}

pthread_t ctl_msrv_thread(const struct ctl_msrv *t)
{
	return t->tid;
}

void ctl_msrv_stop(struct ctl_msrv *t)
{
	if (!t)
		return;
	uv_async_send(&t->stop);
	pthread_join(t->tid, NULL);
	srv_free(t);
}
