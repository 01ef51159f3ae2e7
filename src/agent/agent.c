/*
 * agent: lifecycle and the DRAM segment. See agent.h.
 *
 * Start: segment (memfd; huge pages and NUMA binding as configured;
 * pre-faulted on a copy thread so the first puts do not pay for page
 * faults), copy threads, the client socket, then on the loop's next turn
 * (once the RPC server listens and the segment's name can be known) the
 * master link. Stop: socket and sessions close, the segment is unmounted,
 * requests in flight end (their master calls fail with MC_ESHUTDOWN),
 * copy threads are joined, handles closed, then on_stopped.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent/agent_int.h"
#include "agent/demote.h"
#include "agent/mirror.h"
#include "agent/mlink.h"
#include "agent/op.h"
#include "agent/server.h"
#include "agent/tier.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/sysmem.h"
#include "common/util.h"
#include "rpc/rpc.h"
#include "transfer/transfer.h"

#define LOG_SUBSYS LOGS_AGENT

static void pool_idle(void *ud);
static void maybe_stopped(struct agent *a);

/* ------------------------------------------------------------ segment */

struct prefault_job {
	struct agent_job job;
	struct agent *a;
	uint64_t start_ns;
	int err;
};

static void prefault_run(struct agent_job *j)
{
	struct prefault_job *p = MC_CONTAINER_OF(j, struct prefault_job, job);
	struct agent_map *m = p->a->seg;
	/* (Puts may already be writing there: it changes no byte.) */
	p->err = -mc_prefault_write(m->addr, m->len);
}

static void prefault_done(struct agent_job *j)
{
	struct prefault_job *p = MC_CONTAINER_OF(j, struct prefault_job, job);
	struct agent *a = p->a;
	log_info("segment %s: %zu bytes of memory committed in %.0f ms%s", a->name,
		 a->seg->len, (double)(mc_now_ns() - p->start_ns) / 1e6,
		 p->err ? " (by touching pages only)" : "");
	free(p);
	maybe_stopped(a);
}

static int make_segment(struct agent *a, const struct agent_opts *o)
{
	uint64_t bytes = o->segment_bytes ? o->segment_bytes : agent__default_segment_bytes();
	/* Refuse what the node cannot hold now rather than be killed by the
	 * OOM killer while the segment is prefaulted, or fail to pin it. */
	struct mc_fit_in fit = {
		.segment_bytes = bytes,
		.buffer_bytes = o->staging_bytes,
		.pins = a->te && te_protocol_in_use(a->te) == TE_PROTO_RDMA,
		.hugepages = o->hugepages == AGENT_HUGEPAGES_ON    ? MC_FIT_HUGE_ON
			     : o->hugepages == AGENT_HUGEPAGES_OFF ? MC_FIT_HUGE_OFF
								   : MC_FIT_HUGE_AUTO,
	};
	struct rlimit rl;
	char st[4096], why[512];
	fit.memlock_bytes = getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY
				    ? (uint64_t)rl.rlim_cur
				    : MC_UNLIMITED;
	if (mc_read_small_file("/proc/self/status", st, sizeof(st)) < 0 ||
	    mc_status_ipc_lock_parse(st, &fit.cap_ipc_lock) != 0)
		fit.cap_ipc_lock = false;
	if (mc_meminfo_read(NULL, &fit.mem) == 0 &&
	    mc_segment_fit(&fit, why, sizeof(why)) != MC_FIT_OK) {
		if (!o->force_segment_size) {
			log_error("refusing to start: %s", why);
			return MC_ECONFIG;
		}
		log_warn("%s; starting anyway (--force-segment-size)", why);
	}
	struct agent_memfd_opts mo = {
		.name = "mooncake-segment",
		.len = bytes,
		.hugepages = o->hugepages,
		.numa_node = o->numa_node,
		.published = true,
	};
	int rc = agent__memfd_new(a, &mo, &a->seg);
	if (rc)
		return rc;
	if (!a->seg->hugepages && o->hugepages == AGENT_HUGEPAGES_AUTO)
		log_info("segment: huge pages are not available (none reserved in "
			 "/proc/sys/vm/nr_hugepages, or too few): using 4 KiB pages");
	/* A read-only descriptor of the same memfd for zero-copy views:
	 * clients can map it, not write it. */
	char path[64];
	snprintf(path, sizeof(path), "/proc/self/fd/%d", a->seg->fd);
	a->seg_ro_fd = open(path, O_RDONLY | O_CLOEXEC);
	if (a->seg_ro_fd < 0) {
		rc = -errno;
		log_error("cannot open a read-only descriptor of the segment: %s",
			  strerror(-rc));
		return rc;
	}
	/* A memfd is made with mode 0777: a client could open the read-only
	 * descriptor again through /proc/self/fd with write access and map
	 * it writable. Read-only for its owner and nobody else, the segment
	 * can be reopened for writing by no other user (peers that write
	 * it over shared memory get this read-write descriptor itself). */
	if (fchmod(a->seg->fd, 0400) != 0) {
		rc = -errno;
		log_error("cannot make the segment's memfd read-only for other users: %s",
			  strerror(-rc));
		return rc;
	}
	if (o->lease_table_slots) {
		rc = mc_ltab_create(&a->ltab, o->lease_table_slots, a->seg->len);
		if (rc) {
			log_error("cannot create the shared lease table "
				  "(--client-lease-table=%u): %s",
				  o->lease_table_slots, strerror(-rc));
			return rc;
		}
		agent__lcache_share(&a->lc, &a->ltab);
	}
	return 0;
}

/* ------------------------------------------------------------ start */

/* "HOST:PORT" of the agent's RPC listener, with the bound port. */
static bool resolve_name(struct agent *a)
{
	if (a->named)
		return true;
	int port = a->rpc ? rpc_server_port(a->rpc, 0) : 0;
	if (port <= 0 || !a->rpc_listen)
		return false;
	char host[96];
	const char *colon = strrchr(a->rpc_listen, ':');
	size_t hl = colon ? (size_t)(colon - a->rpc_listen) : 0;
	if (hl == 0 || hl >= sizeof(host))
		snprintf(host, sizeof(host), "127.0.0.1");
	else {
		memcpy(host, a->rpc_listen, hl);
		host[hl] = '\0';
	}
	if (strcmp(host, "0.0.0.0") == 0 || strcmp(host, "[::]") == 0)
		snprintf(host, sizeof(host), "127.0.0.1");
	snprintf(a->name, sizeof(a->name), "%s:%d", host, port);
	a->named = true;
	return true;
}

/*
 * With a transfer engine the segment is registered with it (an RDMA MR
 * for a large segment takes a while: on a copy thread) and its
 * descriptor published before the segment is mounted, so that no agent
 * is told to write into a segment it cannot open yet.
 */
struct te_ready_job {
	struct agent_job job;
	struct agent *a;
	int err;
};

static void start_mlink(struct agent *a)
{
	log_info("agent %s: segment %zu bytes (%s pages%s), client staging buffers "
		 "up to %" PRIu64 " bytes, socket %s%s",
		 a->name, a->seg->len, a->seg->hugepages ? "2 MiB" : "4 KiB",
		 a->numa_node >= 0 ? ", NUMA-bound" : "", a->staging_bytes,
		 agent__server_path(a),
		 a->te ? "" : "; no transfer engine: only this segment is reachable");
	int rc = agent__mlink_start(a);
	if (rc)
		log_error("agent %s cannot reach a master: %s", a->name, mc_strerror(rc));
}

static void te_ready_run(struct agent_job *j)
{
	struct te_ready_job *t = MC_CONTAINER_OF(j, struct te_ready_job, job);
	struct agent *a = t->a;
	struct agent_map *m = a->seg;
	t->err = te_register(a->te, (uint64_t)(uintptr_t)m->addr, m->addr, m->len, m->fd, 0,
			     &a->seg_region);
	if (t->err) {
		a->seg_region = NULL;
		return;
	}
	/* Another live engine may hold the name for a while (a restart
	 * before the old lease expired): keep waiting until stopped. */
	bool told = false;
	while (!atomic_load(&a->stop_flag)) {
		t->err = te_wait_published(a->te, 1000);
		if (t->err == 0 || t->err == MC_ESHUTDOWN)
			return;
		if (!told && t->err != MC_ETIMEDOUT)
			log_warn("segment %s: cannot publish its descriptor yet (%s); waiting",
				 a->name, mc_strerror(t->err));
		told = true;
	}
}

static void te_ready_done(struct agent_job *j)
{
	struct te_ready_job *t = MC_CONTAINER_OF(j, struct te_ready_job, job);
	struct agent *a = t->a;
	int err = t->err;
	free(t);
	if (a->stopping) {
		maybe_stopped(a);
		return;
	}
	if (err) {
		log_error("segment %s: the transfer engine cannot serve it (%s); not "
			  "mounting it",
			  a->name, mc_strerror(err));
		return;
	}
	start_mlink(a);
}

static void on_start_timer(uv_timer_t *t)
{
	struct agent *a = t->data;
	if (a->stopping)
		return;
	if (!resolve_name(a)) {
		uv_timer_start(t, on_start_timer, 20, 0);
		return;
	}
	agent__tier_start(a);
	if (a->te) {
		struct te_ready_job *j = calloc(1, sizeof(*j));
		if (!j) {
			log_error("out of memory starting the agent");
			return;
		}
		j->a = a;
		j->job.run = te_ready_run;
		j->job.done = te_ready_done;
		agent__pool_submit(&a->pool, &j->job);
		return;
	}
	start_mlink(a);
}

static void on_abandoned(uv_handle_t *h)
{
	agent_free(h->data);
}

static char *dup_opt(const char *s)
{
	return s && *s ? strdup(s) : NULL;
}

int agent_new(const struct agent_opts *o, struct agent **out)
{
	if (!o->loop || !o->socket_path || !*o->socket_path || !o->staging_bytes ||
	    !o->max_sessions || !o->max_sessions_per_uid || !o->reply_buffer_bytes ||
	    !o->max_fds || !o->max_buffers || !o->max_views)
		return -EINVAL;
	struct agent *a = calloc(1, sizeof(*a));
	if (!a)
		return -ENOMEM;
	int rc = -ENOMEM;
	a->loop = o->loop;
	a->metrics = o->metrics ? o->metrics : metrics_global();
	a->te = o->te;
	a->rpc = o->rpc;
	a->seg_ro_fd = -1;
	a->ltab.fd = -1;
	a->staging_bytes = o->staging_bytes;
	a->numa_node = o->numa_node;
	a->hugepages = o->hugepages;
	agent__gets_init(a, o->remote_cache_bytes, o->ssd_promote_on_hit);
	agent__space_init(a, o->put_lease_bytes);
	if (agent__insts_init(a, o->te ? o->engine_opts : NULL) != 0) {
		free(a);
		return -ENOMEM;
	}
	a->rpc_listen = dup_opt(o->rpc_listen);
	if (o->rpc_listen && *o->rpc_listen && !a->rpc_listen)
		goto out_strings;
	rc = agent__mlink_config(a, o);
	if (rc)
		goto out_strings;
	if (o->te && !(o->segment_name && *o->segment_name)) {
		snprintf(a->name, sizeof(a->name), "%s", te_name(o->te));
		a->named = true;
	} else if (o->segment_name && *o->segment_name) {
		snprintf(a->name, sizeof(a->name), "%s", o->segment_name);
		a->named = true;
	}
	rc = agent__inv_init(&a->inv);
	if (rc)
		goto out_strings;
	rc = agent__lcache_init(&a->lc, AGENT_LCACHE_ENTRIES);
	if (rc)
		goto out_inv;
	struct agent_tier_opts to = {
		.path = o->ssd_path,
		.bytes = o->ssd_bytes,
		.high_watermark = o->ssd_high_watermark,
		.eviction_ratio = o->ssd_eviction_ratio,
		.sync_interval_ms = o->ssd_sync_interval_ms,
		.verify_on_start = o->ssd_verify_on_start,
		.io = o->ssd_io,
		.staging_bytes = o->ssd_staging_bytes,
	};
	rc = agent__tier_open(a, &to);
	if (rc)
		goto out_lc;
	rc = make_segment(a, o);
	if (rc)
		goto out_tier;
	rc = agent__peer_start(a, o->ssd_bounce_bytes);
	if (rc)
		goto out_seg;
	long cores = sysconf(_SC_NPROCESSORS_ONLN);
	unsigned threads = o->copy_threads ? o->copy_threads
					   : (unsigned)MC_MIN(MC_MAX(cores, 1L), 8L);
	rc = agent__pool_start(&a->pool, a->loop, threads);
	if (rc)
		goto out_seg;
	/* (A job whose done ends no request, e.g. the segment's prefault,
	 * can be the last thing a stop waits for.) */
	agent__pool_on_idle(&a->pool, pool_idle, a);
	agent__stats_init(&a->stats, a->metrics, a->seg->len, a->seg->hugepages,
			  a->staging_bytes);
	agent__gauge(&a->stats, AGENT_G_SSD_STAGING, (int64_t)agent__tier_staging_bytes(a));
	uint64_t ram = agent__ram_bytes(); /* 0: unknown */
	struct agent_limits lim = {
		.sessions = o->max_sessions,
		.sessions_per_uid = o->max_sessions_per_uid,
		.reply_bytes = o->reply_buffer_bytes,
		.fds = o->max_fds,
		.buffers = o->max_buffers,
		.views = o->max_views,
		.alloc_bytes = o->alloc_bytes ? o->alloc_bytes
			       : ram          ? ram
					      : UINT64_MAX,
	};
	rc = agent__server_start(a, o->socket_path, o->busy_poll_us * 1000, &lim,
				 agent__dispatch, maybe_stopped);
	if (rc) {
		/* The copy threads' async handle must close before the agent
		 * is freed: finish in its close callback. */
		agent__pool_stop(&a->pool, on_abandoned, a);
		return rc;
	}
	struct prefault_job *pf = calloc(1, sizeof(*pf));
	if (pf) {
		pf->a = a;
		pf->start_ns = mc_now_ns();
		pf->job.run = prefault_run;
		pf->job.done = prefault_done;
		agent__pool_submit_background(&a->pool, &pf->job);
	}
	uv_timer_init(a->loop, &a->start_timer);
	uv_timer_init(a->loop, &a->drain_timer);
	agent__batch_init(a);
	a->start_timer.data = a;
	a->drain_timer.data = a;
	agent__mirror_init(a);
	agent__demote_init(a, o->ssd_flush_on_stop);
	if (o->cluster_secret && o->cluster_secret_len <= sizeof(a->secret)) {
		memcpy(a->secret, o->cluster_secret, o->cluster_secret_len);
		a->secret_len = o->cluster_secret_len;
	}
	agent__peer_init(a);
	agent__mlink_init(a);
	uv_timer_start(&a->start_timer, on_start_timer, 0, 0);
	agent__gets_start(a);
	*out = a;
	return 0;

out_seg:
	agent__peer_free(a);
	mc_ltab_destroy(&a->ltab); /* (the lease cache, still to go, sees it empty) */
	if (a->seg_ro_fd >= 0)
		close(a->seg_ro_fd);
	agent__map_unref(a->seg);
out_tier:
	agent__tier_free(a);
	agent__tier_bufs_free(a);
out_lc:
	agent__lcache_free(&a->lc);
out_inv:
	agent__inv_free(&a->inv);
out_strings:
	agent__mlink_free(a);
	agent__insts_free(a);
	free(a->rpc_listen);
	free(a);
	return rc;
}

/* ------------------------------------------------------------ stop */

static void on_closed(uv_handle_t *h)
{
	struct agent *a = h->data;
	a->closing--;
	maybe_stopped(a);
}

static void on_mlink_stopped(struct agent *a)
{
	a->mlink_stopped = true;
	maybe_stopped(a);
}

/* The DRAM segment is written down into the SSD tier: unmount. */
static void on_flushed(struct agent *a)
{
	agent__mlink_stop(a, on_mlink_stopped);
}

static void pool_idle(void *ud)
{
	agent__spin_touch(ud);
	maybe_stopped(ud);
}

static void maybe_stopped(struct agent *a)
{
	if (!a->stopping || a->stopped)
		return;
	/* Sessions' engines end with a job of the copy threads: the pool's
	 * idle hook calls again after it. */
	if (!a->mlink_stopped || !agent__server_idle(a) || agent__pool_pending(&a->pool) > 0 ||
	    agent__demote_busy(a) || agent__tier_inflight(a) > 0 || agent__peer_busy(a) ||
	    agent__insts_live(a) > 0)
		return;
	if (!a->handles_closed) {
		a->handles_closed = true;
		/* Each closed handle owes one call of on_closed (none runs
		 * before this returns). */
		uv_close((uv_handle_t *)&a->start_timer, on_closed);
		uv_close((uv_handle_t *)&a->drain_timer, on_closed);
		unsigned n = 2;
		n += agent__server_close(a, on_closed);
		n += agent__pool_stop(&a->pool, on_closed, a);
		n += agent__batch_close(a, on_closed);
		n += agent__gets_close(a, on_closed);
		n += agent__mirror_close(a, on_closed);
		n += agent__demote_close(a, on_closed);
		n += agent__tier_close(a, on_closed);
		n += agent__peer_close(a, on_closed);
		n += agent__mlink_close(a, on_closed);
		a->closing += n;
		return;
	}
	if (a->closing > 0)
		return;
	a->stopped = true;
	log_info("agent %s stopped", a->name);
	if (a->on_stopped)
		a->on_stopped(a->stop_ud);
}

static void on_drain_timer(uv_timer_t *t)
{
	struct agent *a = t->data;
	if (a->on_drained && !a->stopping)
		a->on_drained(a->drain_ud);
}

/* The server has nothing in flight or queued (perhaps inside one of its
 * calls): tell the caller from the loop. */
static void server_drained(struct agent *a)
{
	uv_timer_start(&a->drain_timer, on_drain_timer, 0, 0);
}

void agent_drain(struct agent *a, void (*on_drained)(void *ud), void *ud)
{
	if (a->stopping || a->on_drained)
		return;
	a->on_drained = on_drained;
	a->drain_ud = ud;
	agent__server_drain(a, server_drained);
}

void agent_stop(struct agent *a, void (*on_stopped)(void *ud), void *ud)
{
	if (a->stopping)
		return;
	a->stopping = true;
	atomic_store(&a->stop_flag, true);
	a->on_stopped = on_stopped;
	a->stop_ud = ud;
	uv_timer_stop(&a->start_timer);
	uv_timer_stop(&a->drain_timer);
	agent__gets_stop(a);
	a->closing += agent__server_stop(a, on_closed);
	agent__batch_flush(a);
	/* on_stopped always comes from a close callback: never from inside
	 * this call. */
	if (!agent__demote_flush(a, on_flushed))
		agent__mlink_stop(a, on_mlink_stopped);
	maybe_stopped(a);
}

void agent_free(struct agent *a)
{
	if (!a)
		return;
	agent__tier_free(a);
	agent__demote_free(a);
	agent__peer_free(a);
	memset(a->secret, 0, sizeof(a->secret));
	agent__mlink_free(a);
	agent__space_free(a);
	agent__inv_free(&a->inv);
	agent__lcache_free(&a->lc);
	mc_ltab_destroy(&a->ltab);
	if (a->seg_ro_fd >= 0)
		close(a->seg_ro_fd);
	agent__map_unref(a->seg);
	agent__server_free(a);
	agent__insts_free(a);
	agent__tier_bufs_free(a);
	free(a->rpc_listen);
	free(a);
}

const char *agent_socket_path(const struct agent *a)
{
	return agent__server_path(a);
}

void agent_fold_client_counts(struct agent *a)
{
	agent__server_fold(a);
}
