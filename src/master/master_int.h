/*
 * master_int: what the master service's files share (master.c, ha.c,
 * service.c, sync.c, remove.c): struct master, on a libuv loop, and the functions
 * between those files. The pure cores they drive are in master/core.h.
 */
#ifndef MC_MASTER_MASTER_INT_H
#define MC_MASTER_MASTER_INT_H

#include <stdbool.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>
#include <uv.h>

#include "common/err.h"
#include "master.pb-c.h"
#include "master/core.h"

/* ------------------------------------------------------------ service */

struct rpc_server;
struct rpc_health;
struct rpc_call;
struct metrics_registry;
struct metric;
struct etcd_client;
struct etcd_lease;
struct etcd_watch;

/* Per-segment gauges, kept while the segment is mounted. */
struct master_seg_metrics {
	char *name;
	struct metric *capacity, *used, *fragmentation, *replicas;
	bool seen;
};

struct master {
	uv_loop_t *loop;
	struct rpc_server *rpc;
	struct rpc_health *health;
	struct metrics_registry *metrics;
	struct master_core *core;
	struct master_core_opts core_opts;
	char *advertise, *listen, *cluster_id, *meta_endpoints;
	uint64_t leader_lease_ttl_ms;
	uv_timer_t tick;
	unsigned ticks;
	uint64_t last_tick_ms; /* loop time of the last tick (or of the start) */
	bool leader, stopping;
	uint64_t view;
	uint64_t leader_since_ms; /* loop time this leadership began */
	char leader_addr[128];    /* the known leader ("" while unknown) */
	char self_addr[128];      /* what this master advertises */
	/* HA (ha.c) */
	struct etcd_client *etcd;
	struct etcd_lease *lease;
	int64_t lease_id;
	struct etcd_watch *watch;
	bool campaign_busy; /* a grant/range/txn is in flight */
	uv_timer_t retry;
	uint64_t retry_ms;
	char *leader_key, *view_key;
	void (*on_stopped)(void *ud);
	void *stop_ud;
	unsigned closing; /* handles whose close callback is owed */
	/* metrics (master.c) */
	struct master_counters last;
	struct metric *m_puts, *m_put_starts, *m_revokes, *m_timeouts, *m_gets, *m_hits,
		*m_misses, *m_evictions, *m_evicted_bytes, *m_lease_waits, *m_quarantined,
		*m_removes, *m_ttl, *m_agents_expired, *m_agents_restarted;
	struct metric *m_objects, *m_pending, *m_segments, *m_agents, *m_index_bytes,
		*m_key_bytes, *m_bytes_per_object, *m_leader, *m_view, *m_cap_dram,
		*m_used_dram, *m_cap_ssd, *m_used_ssd, *m_leader_changes;
	struct master_seg_metrics *segm;
	size_t nsegm;
	struct metric *m_mirror_events, *m_mirror_lost, *m_sync_waiters;
	struct metric *m_demotion_starts, *m_demotions, *m_demotion_failures, *m_promotions;
	struct metric *m_ssd_evictions, *m_ssd_evicted_bytes, *m_ssd_puts, *m_ssd_lost;
	struct metric *m_demoting, *m_ssd_objects;
	struct metric *m_commits, *m_commit_refusals, *m_lease_granted, *m_lease_released,
		*m_leased;
	/* parked SyncSegment calls (sync.c) */
	struct master_syncw *syncw;
	size_t nsyncw;
	uv_check_t sync_check;
	uv_timer_t sync_timer;
	uint64_t sync_seen; /* ev_seq when parked calls were last checked */
	/* RemoveAll/RemoveRegex/List walks in progress (walk.c) */
	struct master_walkcall *walks;
	unsigned nwalks;
	uv_idle_t walk_idle;
};

/* Items (keys, inventory entries) one call may carry (service.c). */
#define MASTER_MAX_BATCH_ITEMS 65536u

/* master.c */
void master__set_leader(struct master *m, bool leader, uint64_t view, const char *leader_addr);
void master__update_metrics(struct master *m);
/* service.c */
int master__service_add(struct master *m) MC_MUST_CHECK;
/* The gRPC status for a core error code. */
int master__rpc_status(int err);
/* The master serving the call, or NULL after answering UNAVAILABLE. */
struct master *master__leader_of(struct rpc_call *call);
/* End call UNAVAILABLE with NOT_LEADER and the known leader. */
void master__finish_not_leader(struct master *m, struct rpc_call *call);
/* Send msg and end the call OK (or with the send's error). */
void master__reply(struct rpc_call *call, const ProtobufCMessage *msg);
/* The encoding of e as protobuf-c packs it, at out (room for
 * MASTER_EVENT_MAX_BYTES plus its key and source segment); returns its
 * length. */
#define MASTER_EVENT_MAX_BYTES 128u
size_t master__encode_event(uint8_t *out, const Mooncake__Master__MirrorEvent *e);
/* service.c: the CommitItem encoded in p[0, len) into *c, as protobuf-c
 * would unpack it (c->key points into p). 1: not decoded here (a field
 * with another wire type than its own, or a field number no field can
 * have): unpack it with protobuf-c, which also says whether it is valid.
 * -EBADMSG: not a valid encoding. */
int master__decode_commit_item(const uint8_t *p, size_t len, struct master_commit *c);
/* sync.c: SyncSegment (a long poll) and ListSegment. */
void master__on_sync(struct rpc_call *call, const ProtobufCMessage *msg);
void master__on_sync_cancel(struct rpc_call *call);
void master__on_list_segment(struct rpc_call *call, const ProtobufCMessage *msg);
void master__sync_init(struct master *m);
/* End parked calls whose wait is over. */
void master__sync_tick(struct master *m, uint64_t now_ms);
/* Answer every parked call NOT_LEADER (leadership lost, or stopping). */
void master__sync_drop_all(struct master *m);
/* Drop the parked calls and close the two handles (cb twice). */
void master__sync_close(struct master *m, uv_close_cb cb);
/* Forget parked calls without answering them (their server is gone: the
 * loop ended without a stop). */
void master__sync_free(struct master *m);
/* walk.c: RemoveAll, RemoveRegex and List, walks over the index in
 * slices, and the core's reaper. */
void master__on_remove_all(struct rpc_call *call, const ProtobufCMessage *msg);
void master__on_remove_regex(struct rpc_call *call, const ProtobufCMessage *msg);
void master__on_list(struct rpc_call *call, const ProtobufCMessage *msg);
void master__on_walk_cancel(struct rpc_call *call);
void master__walks_init(struct master *m);
/* After a call or tick that made a segment go: the core's reaper walks a
 * first slice now, the rest in the loop's turns. Returns the objects
 * removed so far with the segment that left slot (all of them when the
 * slice saw its end; MASTER_NO_SEGMENT: 0). */
uint64_t master__reap_kick(struct master *m, uint32_t slot);
/* Answer every walk NOT_LEADER (leadership lost, or stopping). */
void master__walks_drop_all(struct master *m);
/* Drop the walks and close the handle (cb once). */
void master__walks_close(struct master *m, uv_close_cb cb);
/* Forget the walks without answering them (the loop ended without a
 * stop). */
void master__walks_free(struct master *m);
/* ha.c: start campaigning (or lead at once without meta), stop. key: the
 * cluster secret meta's etcd API may want (copied; NULL: none). */
int master__ha_start(struct master *m, const uint8_t *key, size_t klen) MC_MUST_CHECK;
void master__ha_stop(struct master *m, void (*done)(struct master *m));
void master__ha_free(struct master *m);

/* Whether the leader is still taking its agents' segments back after a
 * failover, or a segment is still reporting (service.c: why puts are
 * answered "try again" then, and watermark eviction waits). *mounted and
 * *syncing count the DRAM segments. */
bool master__settling(const struct master *m, unsigned *mounted, unsigned *syncing);

#endif
