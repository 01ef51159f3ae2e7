/*
 * mlink: the agent's link to the master leader.
 *
 * Finding it: a fixed --master-address, or the leader key
 * /mooncake/<cluster-id>/master in meta ("HOST:PORT VIEW"), read once and
 * then watched. A standby's answer "-807 not the leader: leader=H:P
 * view=N" moves the link to that leader too.
 *
 * Mounting: once a leader is known the agent mounts its segment. The
 * first mount of the process says resync = false (the segment is empty:
 * the master drops whatever an earlier incarnation left there); every
 * later one — a new leader, or a master that forgot the agent — says
 * resync = true and reports the inventory (the segment mirror, inv.c and
 * mirror.c) in Heartbeats of up to AGENT_INVENTORY_BATCH items, each
 * batch's bytes checked against their checksums on a copy thread first,
 * the last one with inventory_complete. After every mount the mirror
 * follows the segment's log from the position the mount answered. Then
 * a Heartbeat every agent_ttl / 3; a reply with another view or resync =
 * true starts the re-sync over.
 *
 * With an SSD tier the SSD segment is mounted right after the DRAM one
 * (resync false the first time, as the DRAM segment), its log followed
 * by the tier's moves (demote.c), and what the tier's store holds is
 * reported after every mount, the first one included (a restarted agent
 * brings its SSD objects back): those items follow the DRAM segment's,
 * unchecked (every read of the tier checks an object's bytes), and an
 * item the master refuses is deleted from the tier. At a stop the SSD
 * segment is unmounted after the DRAM one.
 *
 * The link chooses the master that calls (mcall.c) go to, and ticks
 * the calls parked while none is known. Each mount starts the mirror
 * (mirror.c) and a new put lease generation (space.c); a mount waits
 * while puts still copy into the lease the last one dropped, until the
 * last of them tells the link (agent__mlink_lease_drained).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/agent_int.h"
#include "agent/demote.h"
#include "agent/mcall.h"
#include "agent/mirror.h"
#include "agent/mlink.h"
#include "agent/space.h"
#include "agent/tier.h"
#include "common/log.h"
#include "common/util.h"
#include "etcd/etcd.h"

#define LOG_SUBSYS LOGS_AGENT

#define RETRY_MIN_MS 100
#define RETRY_MAX_MS 2000
#define WAIT_TICK_MS 50
#define STOP_TIMEOUT_MS 2000

static void set_master(struct agent *a, const char *addr, uint64_t view);
static void mount(struct agent *a);

static void set_mounted(struct agent *a, bool mounted)
{
	a->mlink.mounted = mounted;
	agent__gauge(&a->stats, AGENT_G_MOUNTED, mounted);
}

/* ------------------------------------------------------------ mount */

static void hb_arm(struct agent *a);
static void on_hb_timer(uv_timer_t *t);
static void mount_ssd(struct agent *a);
static void mounted_all(struct agent *a);
static void retry_mount_later(struct agent *a);

/*
 * One inventory Heartbeat: up to AGENT_INVENTORY_BATCH entries, taken
 * from the re-sync snapshot (the block owns them), checked against their
 * checksums on a copy thread, the good ones reported.
 */
struct inv_block {
	Mooncake__Master__HeartbeatRequest req;
	struct agent_job job;
	struct agent *a;
	unsigned gen; /* a->mlink.resync_gen when made */
	size_t n, ngood;
	bool last;
	bool ssd;                      /* items of the SSD segment */
	struct agent_inv_entry **ents; /* owned */
	uint8_t *verdict;
	struct agent_inv_entry **good; /* borrowed from ents, reported order */
	Mooncake__Master__InventoryItem **ptrs;
	Mooncake__Master__InventoryItem *items;
};

static void inv_block_free(struct inv_block *b)
{
	for (size_t i = 0; i < b->n; i++)
		free(b->ents[i]);
	free(b);
}

static void resync_free(struct agent *a)
{
	a->mlink.resync_gen++;
	if (!a->mlink.resync_items)
		return;
	for (size_t i = a->mlink.resync_pos; i < a->mlink.resync_n; i++)
		free(a->mlink.resync_items[i]);
	free(a->mlink.resync_items);
	a->mlink.resync_items = NULL;
	a->mlink.resync_n = a->mlink.resync_pos = 0;
}

static void send_inventory(struct agent *a);

static void on_inventory(void *ud, int err, const char *message, const ProtobufCMessage *m)
{
	struct inv_block *b = ud;
	struct agent *a = b->a;
	const Mooncake__Master__HeartbeatResponse *resp =
		(const Mooncake__Master__HeartbeatResponse *)m;
	bool last = b->last;
	if (b->gen != a->mlink.resync_gen || a->stopping) {
		inv_block_free(b);
		return;
	}
	a->mlink.hb_busy = false;
	if (err) {
		inv_block_free(b);
		log_warn("inventory report to %s failed: %s; mounting again",
			 agent__mcall_master(a), message ? message : mc_strerror(err));
		resync_free(a);
		set_mounted(a, false);
		mount(a);
		return;
	}
	/* What the master refused is not in its index: not in the mirror,
	 * not in the SSD tier. */
	for (size_t k = 0; k < resp->n_skipped_items; k++) {
		uint32_t i = resp->skipped_items[k];
		if (i >= b->ngood)
			continue;
		const struct agent_inv_entry *e = b->good[i];
		if (b->ssd)
			agent__tier_remove(a, e->key, e->klen, e->rec.offset);
		else
			agent__inv_del_at(&a->inv, e->key, e->klen, e->rec.offset);
	}
	agent__count(&a->stats, AGENT_C_RESYNC_CONFLICTS, resp->items_skipped);
	a->mlink.resync_reported += resp->items_accepted;
	if (resp->items_skipped)
		log_warn("re-sync: the master skipped %" PRIu64 " inventory items "
			 "that conflict with its index",
			 resp->items_skipped);
	inv_block_free(b);
	if (!last) {
		send_inventory(a);
		return;
	}
	log_info("re-sync with master %s (view %" PRIu64 ") done: %" PRIu64 " objects "
		 "reported (%zu of the SSD tier), %" PRIu64 " left out (bytes not "
		 "matching their checksum, or none to check)",
		 agent__mcall_master(a), a->mlink.view, a->mlink.resync_reported,
		 a->mlink.resync_n - a->mlink.resync_ndram, a->mlink.resync_bad);
	resync_free(a);
	agent__gauge(&a->stats, AGENT_G_INVENTORY, (int64_t)agent__inv_count(&a->inv));
	agent__lease_start(a, a->mlink.mount_epoch); /* the segment takes placements */
	hb_arm(a);
}

static void verify_run(struct agent_job *j)
{
	struct inv_block *b = MC_CONTAINER_OF(j, struct inv_block, job);
	if (b->ssd)
		memset(b->verdict, AGENT_VERIFY_OK, b->n); /* (checked when read) */
	else
		agent__mirror_verify(b->a, b->ents, b->n, b->verdict);
}

static void verify_done(struct agent_job *j)
{
	struct inv_block *b = MC_CONTAINER_OF(j, struct inv_block, job);
	struct agent *a = b->a;
	if (b->gen != a->mlink.resync_gen || a->stopping) {
		inv_block_free(b); /* (the copy threads' idle tells a stop) */
		return;
	}
	for (size_t i = 0; i < b->n; i++) {
		const struct agent_inv_entry *e = b->ents[i];
		if (b->verdict[i] != AGENT_VERIFY_OK) {
			/* Its space holds other bytes (or cannot be vouched
			 * for): never report it, and forget it. */
			agent__inv_del_at(&a->inv, e->key, e->klen, e->rec.offset);
			agent__count(&a->stats,
				     b->verdict[i] == AGENT_VERIFY_BAD
					     ? AGENT_C_RESYNC_BAD
					     : AGENT_C_RESYNC_UNCHECKED,
				     1);
			a->mlink.resync_bad++;
			continue;
		}
		Mooncake__Master__InventoryItem *it = &b->items[b->ngood];
		mooncake__master__inventory_item__init(it);
		it->key.data = (uint8_t *)e->key;
		it->key.len = e->klen;
		it->segment = b->ssd ? (char *)agent__tier_name(a) : a->name;
		it->offset = e->rec.offset;
		it->size = e->rec.size;
		it->soft_pin = e->rec.soft_pin;
		it->crc32c = e->rec.crc;
		it->checksummed = e->rec.has_crc;
		b->ptrs[b->ngood] = it;
		b->good[b->ngood] = b->ents[i];
		b->ngood++;
	}
	mooncake__master__heartbeat_request__init(&b->req);
	b->req.agent_id = a->name;
	b->req.view = a->mlink.view;
	b->req.inventory = b->ptrs;
	b->req.n_inventory = b->ngood;
	b->req.inventory_complete = b->last;
	agent__mcall(a, "Heartbeat", &b->req.base,
		     &mooncake__master__heartbeat_response__descriptor, on_inventory, b);
}

static void send_inventory(struct agent *a)
{
	size_t left = a->mlink.resync_n - a->mlink.resync_pos;
	size_t n = MC_MIN(left, (size_t)AGENT_INVENTORY_BATCH);
	/* A block holds one segment's items. */
	bool ssd = a->mlink.resync_pos >= a->mlink.resync_ndram;
	if (!ssd)
		n = MC_MIN(n, a->mlink.resync_ndram - a->mlink.resync_pos);
	struct inv_block *b = calloc(
		1, sizeof(*b) + n * (2 * sizeof(struct agent_inv_entry *) +
				     sizeof(Mooncake__Master__InventoryItem *) +
				     sizeof(Mooncake__Master__InventoryItem) + 1));
	if (!b) {
		log_error("out of memory for the inventory report; retrying");
		set_mounted(a, false);
		uv_timer_start(&a->mlink.hb_timer, on_hb_timer, RETRY_MAX_MS, 0);
		return;
	}
	b->a = a;
	b->gen = a->mlink.resync_gen;
	b->n = n;
	b->ssd = ssd;
	b->items = (Mooncake__Master__InventoryItem *)(b + 1);
	b->ptrs = (Mooncake__Master__InventoryItem **)(b->items + n);
	b->ents = (struct agent_inv_entry **)(b->ptrs + n);
	b->good = b->ents + n;
	b->verdict = (uint8_t *)(b->good + n);
	/* The block takes the entries. */
	memcpy(b->ents, a->mlink.resync_items + a->mlink.resync_pos, n * sizeof(*b->ents));
	a->mlink.resync_pos += n;
	b->last = a->mlink.resync_pos == a->mlink.resync_n;
	a->mlink.hb_busy = true;
	b->job.run = verify_run;
	b->job.done = verify_done;
	agent__pool_submit(&a->pool, &b->job);
}

struct ssd_items {
	struct agent_inv_entry **v;
	size_t n, cap;
	bool nomem;
};

static void collect_ssd(void *ud, const uint8_t *key, size_t klen,
			const struct agent_tier_obj *o)
{
	struct ssd_items *x = ud;
	if (x->nomem)
		return;
	if (x->n == x->cap) {
		size_t cap = x->cap ? x->cap * 2 : 256;
		struct agent_inv_entry **v = realloc(x->v, cap * sizeof(*v));
		if (!v) {
			x->nomem = true;
			return;
		}
		x->v = v;
		x->cap = cap;
	}
	struct agent_inv_entry *e = calloc(1, sizeof(*e) + klen);
	if (!e) {
		x->nomem = true;
		return;
	}
	e->klen = (uint16_t)klen;
	memcpy(e->key, key, klen);
	e->rec.offset = o->offset;
	e->rec.size = o->size;
	e->rec.crc = o->crc;
	e->rec.has_crc = true;
	x->v[x->n++] = e;
}

/* Snapshot the mirror (copies: it changes while the report goes out) when
 * the DRAM segment re-syncs, then the SSD tier's objects. */
static int start_resync(struct agent *a, bool dram)
{
	resync_free(a);
	struct agent_inv_entry **snap = NULL;
	size_t n = 0;
	int rc = dram ? agent__inv_snapshot(&a->inv, &snap, &n) : 0;
	if (rc)
		return rc;
	struct ssd_items x = {0};
	agent__tier_foreach(a, collect_ssd, &x);
	struct agent_inv_entry **all =
		x.nomem ? NULL : realloc(snap, (n + x.n ? n + x.n : 1) * sizeof(*all));
	if (!all) {
		for (size_t i = 0; i < n; i++)
			free(snap[i]);
		free(snap);
		for (size_t i = 0; i < x.n; i++)
			free(x.v[i]);
		free(x.v);
		return -ENOMEM;
	}
	if (x.n)
		memcpy(all + n, x.v, x.n * sizeof(*all));
	free(x.v);
	a->mlink.resync_items = all;
	a->mlink.resync_n = n + x.n;
	a->mlink.resync_ndram = n;
	a->mlink.resync_pos = 0;
	a->mlink.resync_reported = a->mlink.resync_bad = 0;
	return 0;
}

static void retry_mount_later(struct agent *a)
{
	if (a->stopping)
		return;
	a->mlink.retry_ms = a->mlink.retry_ms ? MC_MIN(a->mlink.retry_ms * 2, RETRY_MAX_MS)
					      : RETRY_MIN_MS;
	uv_timer_start(&a->mlink.hb_timer, on_hb_timer, a->mlink.retry_ms, 0);
}

/* The process's instance tokens on a mount (the master takes a mount
 * naming the previous process's as that process's restart). */
static void set_instance(struct agent *a, Mooncake__Master__MountSegmentRequest *req)
{
	req->instance = (ProtobufCBinaryData){a->mlink.instance_len, a->mlink.instance};
	req->previous_instance = (ProtobufCBinaryData){a->mlink.previous_len,
						       a->mlink.previous};
}

struct mount_block {
	Mooncake__Master__MountSegmentRequest req;
	Mooncake__Master__Segment seg;
	struct agent *a;
	char *addr; /* the master it was sent to */
};

/* The start of a mount's answer: the block goes; false when the answer
 * is void (stopping, or the leader changed meanwhile: mounted again). */
static bool mount_answered(struct mount_block *b, struct agent **ap, bool *resync)
{
	struct agent *a = *ap = b->a;
	*resync = b->req.resync;
	bool same = strcmp(b->addr, agent__mcall_master(a)) == 0;
	free(b->addr);
	free(b);
	a->mlink.mount_busy = false;
	if (a->stopping)
		return false;
	if (!same) {
		mount(a);
		return false;
	}
	return true;
}

static void on_mounted(void *ud, int err, const char *message, const ProtobufCMessage *m)
{
	struct agent *a;
	bool resync;
	if (!mount_answered(ud, &a, &resync))
		return;
	if (err) {
		log_warn("cannot mount segment %s with master %s: %s; retrying", a->name,
			 agent__mcall_master(a), message ? message : mc_strerror(err));
		retry_mount_later(a);
		return;
	}
	const Mooncake__Master__MountSegmentResponse *resp =
		(const Mooncake__Master__MountSegmentResponse *)m;
	a->mlink.retry_ms = 0;
	a->mlink.view = resp->view;
	set_mounted(a, true);
	/* Leases of an earlier mount mean nothing now. */
	agent__lcache_clear(&a->lc);
	a->mlink.ever_mounted = true;
	agent__gauge(&a->stats, AGENT_G_MASTER_VIEW, (int64_t)a->mlink.view);
	agent__gauge(&a->stats, AGENT_G_INVENTORY, (int64_t)agent__inv_count(&a->inv));
	log_info("segment %s (%zu bytes) mounted with master %s, view %" PRIu64 "%s", a->name,
		 a->seg->len, agent__mcall_master(a), a->mlink.view,
		 resync ? "; re-syncing the inventory" : "");
	/* The mirror follows the segment's log from where the master says. */
	agent__mirror_start(a, resp->mirror_seq);
	a->mlink.mount_epoch = resp->lease_epoch;
	a->mlink.resync_dram = resync;
	if (!resync) {
		agent__inv_clear(&a->inv); /* the master emptied the segment */
		agent__gauge(&a->stats, AGENT_G_INVENTORY, (int64_t)agent__inv_count(&a->inv));
	}
	if (agent__tier_on(a)) {
		mount_ssd(a);
		return;
	}
	mounted_all(a);
}

/* Every segment is mounted: report the inventory, or take placements. */
static void mounted_all(struct agent *a)
{
	if (!a->mlink.resync_dram && !agent__tier_on(a)) {
		agent__lease_start(a, a->mlink.mount_epoch);
		hb_arm(a);
		return;
	}
	int rc = start_resync(a, a->mlink.resync_dram);
	if (rc) {
		log_error("cannot prepare the inventory: %s; retrying", mc_strerror(rc));
		set_mounted(a, false);
		retry_mount_later(a);
		return;
	}
	send_inventory(a);
}

static void on_ssd_mounted(void *ud, int err, const char *message, const ProtobufCMessage *m)
{
	struct agent *a;
	bool resync;
	if (!mount_answered(ud, &a, &resync))
		return;
	if (err) {
		log_warn("cannot mount the SSD tier's segment %s with master %s: %s; retrying",
			 agent__tier_name(a), agent__mcall_master(a),
			 message ? message : mc_strerror(err));
		set_mounted(a, false);
		retry_mount_later(a);
		return;
	}
	const Mooncake__Master__MountSegmentResponse *resp = (const void *)m;
	a->mlink.ssd_ever_mounted = true;
	log_info("SSD tier segment %s (%" PRIu64 " bytes) mounted with master %s%s",
		 agent__tier_name(a), agent__tier_capacity(a), agent__mcall_master(a),
		 resync ? " (re-sync)" : "");
	agent__demote_start(a, resp->mirror_seq);
	mounted_all(a);
}

static void mount_ssd(struct agent *a)
{
	struct mount_block *b = calloc(1, sizeof(*b));
	char *addr = strdup(agent__mcall_master(a));
	if (!b || !addr) {
		free(b);
		free(addr);
		set_mounted(a, false);
		retry_mount_later(a);
		return;
	}
	b->a = a;
	b->addr = addr;
	mooncake__master__mount_segment_request__init(&b->req);
	mooncake__master__segment__init(&b->seg);
	b->seg.name = (char *)agent__tier_name(a);
	b->seg.agent_id = a->name;
	b->seg.tier = MOONCAKE__MASTER__TIER__TIER_SSD;
	b->seg.size = agent__tier_capacity(a);
	b->seg.block_bytes = agent__tier_block(a);
	agent__tier_watermarks(a, &b->seg.high_watermark, &b->seg.eviction_ratio);
	b->req.segment = &b->seg;
	b->req.resync = a->mlink.ssd_ever_mounted;
	set_instance(a, &b->req);
	a->mlink.mount_busy = true;
	agent__mcall(a, "MountSegment", &b->req.base,
		     &mooncake__master__mount_segment_response__descriptor, on_ssd_mounted, b);
}

void agent__mlink_lease_drained(struct agent *a)
{
	if (!a->mlink.mount_held)
		return;
	a->mlink.mount_held = false;
	mount(a);
}

static void mount(struct agent *a)
{
	if (a->mlink.mount_busy || a->stopping || !agent__mcall_connected(a) || !a->named)
		return;
	uv_timer_stop(&a->mlink.hb_timer);
	agent__mirror_stop(a);
	agent__demote_stop(a);
	agent__lease_reset(a);
	a->mlink.mount_epoch = 0; /* learned again from the next mount */
	set_mounted(a, false);
	if (agent__lease_draining(a)) {
		/* Puts still copy into the dropped lease's bytes, which the
		 * mount gives back to the segment: mount once they are done
		 * (space.c). */
		a->mlink.mount_held = true;
		return;
	}
	struct mount_block *b = calloc(1, sizeof(*b));
	char *addr = strdup(agent__mcall_master(a));
	if (!b || !addr) {
		free(b);
		free(addr);
		retry_mount_later(a);
		return;
	}
	b->a = a;
	b->addr = addr;
	mooncake__master__mount_segment_request__init(&b->req);
	mooncake__master__segment__init(&b->seg);
	b->seg.name = a->name;
	b->seg.agent_id = a->name;
	b->seg.tier = MOONCAKE__MASTER__TIER__TIER_DRAM;
	b->seg.base_address = (uint64_t)(uintptr_t)a->seg->addr;
	b->seg.size = a->seg->len;
	b->req.segment = &b->seg;
	b->req.resync = a->mlink.ever_mounted;
	set_instance(a, &b->req);
	set_mounted(a, false);
	a->mlink.mount_busy = true;
	agent__mcall(a, "MountSegment", &b->req.base,
		     &mooncake__master__mount_segment_response__descriptor, on_mounted, b);
}

/* ------------------------------------------------------------ heartbeats */

static void on_heartbeat(void *ud, int err, const char *message, const ProtobufCMessage *m)
{
	struct agent *a = ud;
	a->mlink.hb_busy = false;
	free(a->mlink.hb_req);
	a->mlink.hb_req = NULL;
	if (a->stopping)
		return;
	if (err) {
		log_warn("heartbeat to master %s failed: %s", agent__mcall_master(a),
			 message ? message : mc_strerror(err));
		hb_arm(a);
		return;
	}
	const Mooncake__Master__HeartbeatResponse *resp =
		(const Mooncake__Master__HeartbeatResponse *)m;
	if (resp->agent_ttl_ms)
		a->mlink.hb_interval_ms = MC_MAX(resp->agent_ttl_ms / 3, (uint64_t)50);
	if (resp->resync || resp->view != a->mlink.view) {
		log_info("master %s %s (view %" PRIu64 ", ours %" PRIu64 "): mounting "
			 "again and re-reporting the inventory",
			 agent__mcall_master(a),
			 resp->resync ? "does not know this agent" : "has a new view",
			 resp->view, a->mlink.view);
		set_mounted(a, false);
		mount(a);
		return;
	}
	hb_arm(a);
}

static void heartbeat(struct agent *a)
{
	if (a->mlink.hb_busy || a->stopping)
		return;
	Mooncake__Master__HeartbeatRequest *q = malloc(sizeof(*q));
	if (!q) {
		hb_arm(a);
		return;
	}
	mooncake__master__heartbeat_request__init(q);
	q->agent_id = a->name;
	q->view = a->mlink.view;
	a->mlink.hb_req = q;
	a->mlink.hb_busy = true;
	agent__mcall(a, "Heartbeat", &q->base,
		     &mooncake__master__heartbeat_response__descriptor, on_heartbeat, a);
}

static void on_hb_timer(uv_timer_t *t)
{
	struct agent *a = t->data;
	if (a->stopping)
		return;
	if (!a->mlink.mounted) {
		mount(a);
	} else {
		agent__lease_tick(a);
		heartbeat(a);
	}
}

static void hb_arm(struct agent *a)
{
	if (!a->stopping)
		uv_timer_start(&a->mlink.hb_timer, on_hb_timer, a->mlink.hb_interval_ms, 0);
}

/* ------------------------------------------------------------ leader */

/* Use the leader at addr ("": none known) from now on. */
static void set_master(struct agent *a, const char *addr, uint64_t view)
{
	if (!agent__mcall_set_master(a, addr))
		return;
	set_mounted(a, false);
	agent__mirror_stop(a);
	agent__demote_stop(a);
	agent__lease_reset(a);
	a->mlink.mount_epoch = 0; /* learned again from the next mount */
	if (!addr[0]) {
		log_warn("no master leader at the moment; calls wait for one");
		return;
	}
	if (!agent__mcall_connected(a))
		return;
	log_info("using master %s (view %" PRIu64 ")", addr, view);
	agent__mcall_poll(a);
	a->mlink.retry_ms = 0;
	mount(a);
}

/* "HOST:PORT VIEW" */
static bool parse_leader(const uint8_t *v, size_t len, char *addr, size_t alen, uint64_t *view)
{
	char buf[160];
	if (len == 0 || len >= sizeof(buf))
		return false;
	memcpy(buf, v, len);
	buf[len] = '\0';
	char *sp = strchr(buf, ' ');
	if (!sp || (size_t)(sp - buf) >= alen)
		return false;
	*sp = '\0';
	*view = strtoull(sp + 1, NULL, 10);
	memcpy(addr, buf, (size_t)(sp - buf) + 1);
	return true;
}

static void on_leader_events(struct etcd_watch *w, void *ud, Mvccpb__Event *const *ev,
			     size_t n, int64_t rev)
{
	struct agent *a = ud;
	(void)w;
	(void)rev;
	for (size_t i = 0; i < n; i++) {
		if (ev[i]->type == MVCCPB__EVENT__EVENT_TYPE__DELETE) {
			set_master(a, "", 0);
			continue;
		}
		char addr[128];
		uint64_t view;
		const Mvccpb__KeyValue *kv = ev[i]->kv;
		if (kv &&
		    parse_leader(kv->value.data, kv->value.len, addr, sizeof(addr), &view))
			set_master(a, addr, view);
		else
			log_warn("%s holds an unreadable value; ignored", a->mlink.leader_key);
	}
}

static void watch_leader(struct agent *a, int64_t from);

static void on_leader_watch_error(struct etcd_watch *w, void *ud, int err)
{
	struct agent *a = ud;
	(void)w;
	a->mlink.watch = NULL;
	if (a->stopping || err == MC_ECANCELLED)
		return;
	log_warn("watch on %s ended: %s; watching again", a->mlink.leader_key,
		 mc_strerror(err));
	watch_leader(a, 0);
}

static const struct etcd_watch_cbs leader_watch_cbs = {
	.on_events = on_leader_events,
	.on_error = on_leader_watch_error,
};

static void read_leader(struct agent *a);

static void on_leader_range(void *ud, int err, const Etcdserverpb__RangeResponse *resp)
{
	struct agent *a = ud;
	if (err == MC_ECANCELLED)
		return;
	a->mlink.leader_range_busy = false;
	if (a->stopping)
		return;
	if (err) {
		log_warn("reading %s from meta: %s; retrying", a->mlink.leader_key,
			 mc_strerror(err));
		a->mlink.leader_retry_ms = a->mlink.leader_retry_ms
						   ? MC_MIN(a->mlink.leader_retry_ms * 2,
							    RETRY_MAX_MS)
						   : RETRY_MIN_MS;
		a->mlink.leader_retry_at = mc_now_ms() + a->mlink.leader_retry_ms;
		return;
	}
	char addr[128];
	uint64_t view;
	if (resp->n_kvs && parse_leader(resp->kvs[0]->value.data, resp->kvs[0]->value.len,
					addr, sizeof(addr), &view))
		set_master(a, addr, view);
	else
		log_info("no master leader in meta yet (%s); waiting for one",
			 a->mlink.leader_key);
	a->mlink.leader_retry_ms = 0;
	watch_leader(a, resp->header ? resp->header->revision + 1 : 0);
}

static void read_leader(struct agent *a)
{
	if (a->mlink.leader_range_busy || a->stopping)
		return;
	Etcdserverpb__RangeRequest q = ETCDSERVERPB__RANGE_REQUEST__INIT;
	q.key.data = (uint8_t *)a->mlink.leader_key;
	q.key.len = strlen(a->mlink.leader_key);
	a->mlink.leader_range_busy = true;
	if (etcd_range(a->mlink.etcd, &q, on_leader_range, a) != 0)
		a->mlink.leader_range_busy = false;
}

static void watch_leader(struct agent *a, int64_t from)
{
	if (a->mlink.watch || a->stopping)
		return;
	if (from == 0) {
		read_leader(a); /* re-read, then watch from there */
		return;
	}
	int rc = etcd_watch(a->mlink.etcd, a->mlink.leader_key, strlen(a->mlink.leader_key),
			    NULL, 0, from, 0, &leader_watch_cbs, a, &a->mlink.watch);
	if (rc) {
		a->mlink.watch = NULL;
		log_warn("cannot watch %s: %s", a->mlink.leader_key, mc_strerror(rc));
	}
}

/* ------------------------------------------------------------ lifecycle */

static void on_retry_timer(uv_timer_t *t)
{
	struct agent *a = t->data;
	agent__mcall_poll(a);
	if (a->mlink.etcd && !a->mlink.watch && !a->mlink.leader_range_busy && !a->stopping &&
	    mc_now_ms() >= a->mlink.leader_retry_at)
		read_leader(a);
}

static char *dup_opt(const char *s)
{
	return s && *s ? strdup(s) : NULL;
}

int agent__mlink_config(struct agent *a, const struct agent_opts *o)
{
	struct agent_mlink *l = &a->mlink;
	if (o->instance_len > sizeof(l->instance) ||
	    o->previous_instance_len > sizeof(l->previous))
		return -EINVAL;
	if (o->instance_len)
		memcpy(l->instance, o->instance, o->instance_len);
	if (o->previous_instance_len)
		memcpy(l->previous, o->previous_instance, o->previous_instance_len);
	l->instance_len = o->instance_len;
	l->previous_len = o->previous_instance_len;
	l->timeout_ms = o->master_timeout_ms ? o->master_timeout_ms : 5000;
	l->master_fixed = dup_opt(o->master_address);
	l->meta_endpoints = dup_opt(o->meta_endpoints);
	l->cluster_id = strdup(o->cluster_id && *o->cluster_id ? o->cluster_id : "mooncake");
	if (!l->cluster_id || (o->master_address && *o->master_address && !l->master_fixed) ||
	    (o->meta_endpoints && *o->meta_endpoints && !l->meta_endpoints))
		return -ENOMEM;
	return 0;
}

void agent__mlink_init(struct agent *a)
{
	uv_timer_init(a->loop, &a->mlink.hb_timer);
	uv_timer_init(a->loop, &a->mlink.retry_timer);
	a->mlink.hb_timer.data = a->mlink.retry_timer.data = a;
	agent__mcalls_init(a, a->mlink.timeout_ms, set_master);
	/* Until the first heartbeat reply tells the agent TTL. */
	a->mlink.hb_interval_ms = 250;
}

int agent__mlink_start(struct agent *a)
{
	uv_timer_start(&a->mlink.retry_timer, on_retry_timer, WAIT_TICK_MS, WAIT_TICK_MS);
	if (a->mlink.master_fixed) {
		set_master(a, a->mlink.master_fixed, 0);
		return 0;
	}
	if (!a->mlink.meta_endpoints) {
		log_error("no way to find the master: set --master-address or "
			  "--meta-endpoints");
		return -EINVAL;
	}
	size_t klen = strlen(a->mlink.cluster_id) + 32;
	a->mlink.leader_key = malloc(klen);
	if (!a->mlink.leader_key)
		return -ENOMEM;
	snprintf(a->mlink.leader_key, klen, "/mooncake/%s/master", a->mlink.cluster_id);
	struct etcd_opts eo = {.endpoints = a->mlink.meta_endpoints,
			       .auth_key = a->secret_len ? a->secret : NULL,
			       .auth_key_len = a->secret_len};
	int rc = etcd_client_new(a->loop, &eo, &a->mlink.etcd);
	if (rc) {
		log_error("--meta-endpoints %s: %s", a->mlink.meta_endpoints, mc_strerror(rc));
		return rc;
	}
	read_leader(a);
	return 0;
}

static void mlink_finish(struct agent *a)
{
	/* The retry timer runs on until the agent's handles close: requests
	 * still in flight may call the master, and their parked calls must
	 * be ended (MC_ESHUTDOWN) by its ticks. */
	uv_timer_stop(&a->mlink.hb_timer);
	if (a->mlink.watch) {
		etcd_watch_cancel(a->mlink.watch);
		a->mlink.watch = NULL;
	}
	agent__mcall_poll(a); /* fail parked calls: stopping */
	agent__mcall_disconnect(a);
	if (a->mlink.etcd) {
		etcd_client_free(a->mlink.etcd);
		a->mlink.etcd = NULL;
	}
	resync_free(a);
	agent__mirror_stop(a);
	agent__demote_stop(a);
	void (*done)(struct agent *) = a->mlink.done;
	a->mlink.done = NULL;
	if (done)
		done(a);
}

static void on_ssd_unmounted(void *ud, int err, const char *message, const ProtobufCMessage *m)
{
	struct agent *a = ud;
	const Mooncake__Master__UnmountSegmentResponse *resp = (const void *)m;
	if (err && err != MC_ENOT_LEADER && err != MC_ESHUTDOWN)
		log_warn("cannot unmount the SSD tier's segment %s: %s (it expires after "
			 "the agent TTL)",
			 agent__tier_name(a), message ? message : mc_strerror(err));
	else if (!err)
		log_info("SSD tier segment %s unmounted: its %" PRIu64
			 " replicas left the pool "
			 "until the agent is back",
			 agent__tier_name(a), resp->replicas_dropped);
	free(a->mlink.unmount_ssd_req);
	a->mlink.unmount_ssd_req = NULL;
	mlink_finish(a);
}

static void on_unmounted(void *ud, int err, const char *message, const ProtobufCMessage *m)
{
	struct agent *a = ud;
	const Mooncake__Master__UnmountSegmentResponse *resp =
		(const Mooncake__Master__UnmountSegmentResponse *)m;
	if (err == MC_ENOT_LEADER || err == MC_ESHUTDOWN)
		log_info("segment %s: the master is stopping too; not unmounted", a->name);
	else if (err)
		log_warn("cannot unmount segment %s from master %s: %s (it expires "
			 "after the agent TTL)",
			 a->name, agent__mcall_master(a),
			 message ? message : mc_strerror(err));
	else
		log_info("segment %s unmounted: its %" PRIu64 " replicas left the pool",
			 a->name, resp->replicas_dropped);
	free(a->mlink.unmount_req);
	a->mlink.unmount_req = NULL;
	Mooncake__Master__UnmountSegmentRequest *q = NULL;
	if (!err && agent__tier_on(a) && a->mlink.ssd_ever_mounted &&
	    (q = malloc(sizeof(*q)))) {
		mooncake__master__unmount_segment_request__init(q);
		q->name = (char *)agent__tier_name(a);
		q->agent_id = a->name;
		a->mlink.unmount_ssd_req = q;
		agent__mcall(a, "UnmountSegment", &q->base,
			     &mooncake__master__unmount_segment_response__descriptor,
			     on_ssd_unmounted, a);
		return;
	}
	mlink_finish(a);
}

void agent__mlink_stop(struct agent *a, void (*done)(struct agent *a))
{
	a->mlink.done = done;
	uv_timer_stop(&a->mlink.hb_timer);
	if (!a->mlink.mounted || !agent__mcall_connected(a)) {
		mlink_finish(a);
		return;
	}
	Mooncake__Master__UnmountSegmentRequest *q = malloc(sizeof(*q));
	if (!q) {
		mlink_finish(a);
		return;
	}
	mooncake__master__unmount_segment_request__init(q);
	q->name = a->name;
	q->agent_id = a->name;
	a->mlink.unmount_req = q;
	agent__mcall_limit_timeout(a, STOP_TIMEOUT_MS);
	agent__mcall(a, "UnmountSegment", &q->base,
		     &mooncake__master__unmount_segment_response__descriptor, on_unmounted, a);
}

unsigned agent__mlink_close(struct agent *a, uv_close_cb on_closed)
{
	uv_close((uv_handle_t *)&a->mlink.hb_timer, on_closed);
	uv_close((uv_handle_t *)&a->mlink.retry_timer, on_closed);
	return 2;
}

uint64_t agent__mlink_view(const struct agent *a)
{
	return a->mlink.view;
}

void agent__mlink_free(struct agent *a)
{
	free(a->mlink.master_fixed);
	a->mlink.master_fixed = NULL;
	free(a->mlink.meta_endpoints);
	a->mlink.meta_endpoints = NULL;
	free(a->mlink.cluster_id);
	a->mlink.cluster_id = NULL;
	free(a->mlink.leader_key);
	a->mlink.leader_key = NULL;
	free(a->mlink.hb_req);
	a->mlink.hb_req = NULL;
	free(a->mlink.unmount_req);
	a->mlink.unmount_req = NULL;
	free(a->mlink.unmount_ssd_req);
	a->mlink.unmount_ssd_req = NULL;
}
