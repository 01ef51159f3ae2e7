/*
 * agent_int: struct agent, and the map of the agent's rooms.
 *
 * Each file has one job and, when it keeps state, a struct of its own
 * in its header (named after the file), embedded in struct agent below
 * and touched only by that file; the others call its functions. What
 * struct agent holds directly is the frame every file may read (loop,
 * name, segment, options, stopping), written only by agent.c.
 *
 *   agent.c      lifecycle: start, stop, the DRAM segment; sets the hooks
 *   ops.c        which operation serves a request; hello, exist, remove,
 *                remove_all, stats, release (op.h, as the op_* files)
 *   op_put.c     put: leased space or PutStart, copies, commit or PutEnd
 *   op_get.c     get, and read leases (cached replicas, zero-copy views)
 *   op_buf.c     client buffers (register, unregister, alloc), transfers,
 *                sessions' own engines, segment probes
 *   op_common.c  the operations' shared steps
 *   server.c     the Unix socket: sessions, frames, descriptors, replies,
 *                busy poll
 *   mlink.c      the master link: discovery, mount, heartbeats, re-sync
 *   demote.c     the SSD tier's moves: the master's orders from the SSD
 *                segment's log (demotions, deletions), TierCommit, the
 *                flush at a stop
 *   peer.c       reads of SSD tiers between agents: the Tier service, the
 *                bounce region, the calls to other agents
 *   mirror.c     the segment mirror: following the master's log of this
 *                segment (the follower serves the SSD segment's too),
 *                listings, checking bytes before a re-sync
 *   space.c      put leases: own segment's and other agents' space
 *   batch.c      master calls of concurrent requests, coalesced
 *   mcall.c      calls to the master leader: redirects, parked calls
 *   stats.c      counters, gauges, request metrics
 *   xfer.c       reads and writes of other segments (transfer engine)
 *   mem.c        memfds, mappings, checks of client memfds and memory
 *   inst.c       transfer engines of sessions' own (TransferEngine
 *                instances)
 *   pool.c       copy threads: jobs off the loop, completions back on it
 *   tier.c       the SSD tier's store: open, recovery, reads, writes
 *   inv.c        the inventory: objects in this segment (pure)
 *   lcache.c     the lease cache: replicas under a read lease (pure)
 *   req.c        request validation (pure: also the fuzz target's entry)
 *
 * Calls between the files (a file -> the files it calls). Calls go down
 * this list only, so there is no circle; news goes up through hooks the
 * caller sets (the server's on_request and on_gone, mcall's on_leader,
 * the pool's on_idle, mlink's done, a log follower's hooks, the tier's
 * on_lost). test_agent_rooms.py checks this
 * list against the objects and the embedded structs against their use.
 *
 *   agent.c     -> batch demote inst inv lcache mem mirror mlink op_get ops
 *                  peer pool server space stats tier
 *   ops.c       -> batch inv lcache mcall mem mirror mlink op_buf
 *                  op_common op_get op_put req server stats tier
 *   op_put.c    -> batch demote inv lcache mcall mlink op_common pool req
 *                  server space stats tier xfer
 *   op_get.c    -> batch lcache mcall mem mlink op_common peer pool req
 *                  server space stats tier xfer
 *   op_buf.c    -> inst mem op_common pool server stats xfer
 *   op_common.c -> inst mem pool server stats tier xfer
 *   server.c    -> inst mem pool req stats
 *   mlink.c     -> demote inv lcache mcall mirror pool space stats tier
 *   demote.c    -> inv mcall mirror pool stats tier xfer
 *   peer.c      -> mcall mem stats tier
 *   mirror.c    -> inv mcall stats
 *   space.c     -> mcall stats
 *   batch.c     -> mcall
 *   xfer.c      -> pool
 *   mem.c       -> inst pool
 *   inst.c      -> pool
 *   tier.c      -> stats
 *   mcall.c, stats.c, pool.c, inv.c, lcache.c, req.c -> nothing
 *
 * Everything runs on the loop thread except job bodies in pool.c, which
 * touch only the memory their job owns (mappings hold references taken
 * on the loop before the job is queued and dropped after it completes),
 * and the SSD store's own threads (src/ssd), whose completions come back
 * to the loop through tier.c.
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
#include "agent/demote.h"
#include "agent/inst.h"
#include "agent/inv.h"
#include "agent/lcache.h"
#include "agent/mcall.h"
#include "agent/mem.h"
#include "agent/mirror.h"
#include "agent/mlink.h"
#include "agent/op.h"
#include "agent/peer.h"
#include "agent/pool.h"
#include "agent/server.h"
#include "agent/space.h"
#include "agent/stats.h"
#include "agent/tier.h"
#include "common/auth.h"
#include "common/ltab.h"

struct agent {
	/* The frame (agent.c's; every file may read it). */
	uv_loop_t *loop;
	struct metrics_registry *metrics;
	struct te_engine *te;
	struct rpc_server *rpc;
	char *rpc_listen;
	char name[128]; /* segment name = agent id */
	bool named;
	uint64_t staging_bytes;
	int numa_node;
	enum agent_hugepages hugepages;
	/* The cluster secret (len 0: none): what other agents' reads of the
	 * SSD tier prove (peer.c) and what calls to the master prove
	 * (mcall.c). */
	uint8_t secret[MC_SECRET_MAX_BYTES];
	size_t secret_len;
	struct agent_map *seg;        /* the DRAM segment */
	struct te_region *seg_region; /* it, registered with the engine */
	int seg_ro_fd;                /* read-only descriptor of it */
	bool stopping, stopped;
	atomic_bool stop_flag; /* stopping, for the copy threads */
	bool mlink_stopped, handles_closed;
	void (*on_stopped)(void *ud);
	void *stop_ud;
	unsigned closing; /* handles whose close callback is owed */
	uv_timer_t start_timer;
	uv_timer_t drain_timer; /* tells on_drained from the loop */
	void (*on_drained)(void *ud);
	void *drain_ud;
	/* The rooms: each touched only by the file named (the others pass
	 * a pool, inventory, lease cache or statistics to its functions). */
	struct agent_pool pool;     /* pool.c */
	struct agent_inv inv;       /* inv.c */
	struct agent_lcache lc;     /* lcache.c */
	struct mc_ltab ltab;        /* its shared table (hdr NULL: none) */
	struct agent_stats stats;   /* stats.c */
	struct agent_mcalls mcalls; /* mcall.c */
	struct agent_batch batch;   /* batch.c */
	struct agent_space space;   /* space.c */
	struct agent_mirror mirror; /* mirror.c */
	struct agent_mlink mlink;   /* mlink.c */
	struct agent_server server; /* server.c */
	struct agent_gets gets;     /* op_get.c */
	struct agent_tier tier;     /* tier.c */
	struct agent_demote demote; /* demote.c */
	struct agent_peer peer;     /* peer.c */
	struct agent_insts insts;   /* inst.c */
	struct agent_mem mem;       /* mem.c */
};

#endif
