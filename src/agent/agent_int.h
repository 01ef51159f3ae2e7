/*
 * agent_int: what the agent's files share.
 *
 *   agent.c    lifecycle, options, metrics, the segment
 *   mem.c      memfds (huge pages, NUMA, seals), mappings, client memfd
 *              checks
 *   pool.c     copy threads: jobs run off the loop, completions back on it
 *   server.c   the Unix socket: sessions, frames, descriptors, replies
 *   req.c      request validation (pure: also the fuzz target's entry)
 *   ops.c      the operations: put, get, exist, remove, buffers, transfer
 *   mlink.c    the master: discovery (fixed or meta leader key), mount,
 *              heartbeats, re-sync with inventory, calls with redirects
 *   mirror.c   the segment mirror: following the master's log of the
 *              segment's changes (SyncSegment), listing it when behind,
 *              and checking bytes against checksums before a re-sync
 *   space.c    the put lease: space of the segment the master delegated,
 *              for puts sealed with one call (BatchCommit)
 *   inv.c      the mirror's table: every COMPLETE object in this agent's
 *              segment, whoever wrote it (pure)
 *
 * Everything runs on the loop thread except job bodies in pool.c, which
 * touch only the memory their job owns (mappings hold references taken
 * on the loop before the job is queued and dropped after it completes).
 */
#ifndef MC_AGENT_AGENT_INT_H
#define MC_AGENT_AGENT_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "agent/agent.h"
#include "agent/batch.h"
#include "agent/inv.h"
#include "agent/lcache.h"
#include "agent/mcall.h"
#include "agent/mem.h"
#include "agent/mirror.h"
#include "agent/mlink.h"
#include "agent/op.h"
#include "agent/pool.h"
#include "agent/server.h"
#include "agent/space.h"
#include "agent/stats.h"

/* ------------------------------------------------------------ agent */

struct agent {
	uv_loop_t *loop;
	struct metrics_registry *metrics;
	struct te_engine *te;
	struct rpc_server *rpc;
	char *rpc_listen;
	char name[128];               /* segment name = agent id */
	bool named;
	uint64_t staging_bytes;
	int numa_node;
	enum agent_hugepages hugepages;
	struct agent_map *seg;        /* the DRAM segment */
	struct te_region *seg_region; /* it, registered with the engine */
	int seg_ro_fd;                /* read-only descriptor of it */
	struct agent_pool pool;
	struct agent_inv inv;
	struct agent_lcache lc;
	struct agent_batch batch;
	bool stopping, stopped;
	atomic_bool stop_flag;        /* stopping, for the copy threads */
	bool mlink_stopped, handles_closed;
	void (*on_stopped)(void *ud);
	void *stop_ud;
	unsigned closing;             /* handles whose close callback is owed */
	uv_timer_t start_timer;
	struct agent_stats stats;
	struct agent_mcalls mcalls;
	struct agent_space space;
	struct agent_mirror mirror;
	struct agent_mlink mlink;
	struct agent_server server;
	struct agent_gets gets;
};

#endif
