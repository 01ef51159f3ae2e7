/*
 * mlink.h: the agent's link to the master leader (mlink.c) — finding
 * it, mounting the segment (and the SSD tier's), heartbeats and the
 * re-sync of the inventory.
 * A part above the mirror and the put lease, which it starts and resets
 * at every mount; it calls the master calls (mcall.c), the mirror, the
 * put lease, the inventory, the lease cache, the copy threads and the
 * statistics. Only the agent's lifecycle (agent.c), the put (a lease
 * drained) and the Stats reply (the view) call it.
 */
#ifndef MC_AGENT_MLINK_H
#define MC_AGENT_MLINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "agent/agent.h"
#include "common/err.h"
#include "master.pb-c.h"

#define AGENT_INVENTORY_BATCH 1000u /* items per inventory heartbeat */

struct agent;
struct agent_inv_entry;
struct etcd_client;
struct etcd_watch;

/* The link's state, embedded in struct agent (touched only by mlink.c). */
struct agent_mlink {
	char *master_fixed; /* --master-address, or NULL */
	char *meta_endpoints, *cluster_id, *leader_key;
	uint64_t timeout_ms; /* per master call (mcall.c) */
	struct etcd_client *etcd;
	struct etcd_watch *watch;
	bool leader_range_busy;
	uint64_t leader_retry_ms, leader_retry_at;
	uint64_t view; /* the leader's view we mounted in */
	bool ever_mounted;
	bool mounted;
	bool mount_busy, hb_busy;
	bool mount_held;      /* until no put copies into a dropped lease */
	uint64_t mount_epoch; /* the lease epoch the mount answered */
	struct agent_inv_entry **resync_items;
	size_t resync_n, resync_pos;
	size_t resync_ndram;   /* the items before it are the DRAM segment's */
	bool resync_dram;      /* the DRAM segment's mount was a re-sync */
	bool ssd_ever_mounted; /* the SSD segment's first mount was made */
	/* agent_opts' instance tokens, sent with every mount. */
	uint8_t instance[AGENT_INSTANCE_MAX];
	uint8_t previous[AGENT_INSTANCE_MAX * AGENT_PREVIOUS_MAX];
	size_t instance_len, previous_len;
	Mooncake__Master__UnmountSegmentRequest *unmount_ssd_req;
	uint64_t resync_reported, resync_bad;
	unsigned resync_gen; /* bumped when a re-sync is dropped */
	uint64_t hb_interval_ms;
	uv_timer_t hb_timer;
	uv_timer_t retry_timer; /* ticks the parked master calls */
	uint64_t retry_ms;
	Mooncake__Master__HeartbeatRequest *hb_req;
	Mooncake__Master__UnmountSegmentRequest *unmount_req;
	void (*done)(struct agent *a); /* agent__mlink_stop's */
};

/* Keep the options of the link: those that find the master (a fixed
 * address, NULL or "": use meta; meta's endpoints; the cluster id, NULL
 * or "": "mooncake"; the per-call timeout, 0: 5 s) and the instance
 * tokens its mounts carry. Errors: -ENOMEM, -EINVAL (a token too long). */
int agent__mlink_config(struct agent *a, const struct agent_opts *o) MC_MUST_CHECK;
void agent__mlink_init(struct agent *a);
/* Find the master (fixed, or the leader key in meta) and mount with it.
 * Errors: -EINVAL (no way to find it), -ENOMEM, the meta client's. */
int agent__mlink_start(struct agent *a) MC_MUST_CHECK;
/* The last put into a lease an earlier mount dropped is done: a mount
 * held for it goes now. */
void agent__mlink_lease_drained(struct agent *a);
/* The view of the leader the segment is mounted with. */
uint64_t agent__mlink_view(const struct agent *a);
/* Unmount (best effort, bounded) then done(a). */
void agent__mlink_stop(struct agent *a, void (*done)(struct agent *a));
/* Close the link's handles (after agent__mlink_stop finished); on_closed
 * gets each with data pointing at the agent. Returns how many. */
unsigned agent__mlink_close(struct agent *a, uv_close_cb on_closed);
void agent__mlink_free(struct agent *a);

#endif
