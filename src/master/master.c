/*
 * master: the service object — the core, its timer (PENDING timeouts,
 * agent expiry, TTL sweep, eviction, metrics), leadership state and the
 * metrics families. The RPC handlers are in service.c, the election in
 * ha.c. See master.h.
 */
#include "master/master.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/metrics.h"
#include "common/util.h"
#include "master/master_int.h"
#include "rpc/rpc.h"

#define LOG_SUBSYS LOGS_MASTER

#define TICK_MS 100
/* A tick later than this after the one before: the loop was held. */
#define TICK_LATE_MS 1000
#define METRICS_EVERY_TICKS 10

/* ------------------------------------------------------------ metrics */

static struct metric *counter(struct master *m, const char *name, const char *help)
{
	return metrics_counter(m->metrics, name, help, NULL, NULL);
}

static struct metric *gauge(struct master *m, const char *name, const char *help)
{
	return metrics_gauge(m->metrics, name, help, NULL, NULL);
}

static void register_metrics(struct master *m)
{
	m->m_puts = counter(m, "mooncake_master_puts_total", "Puts completed (PutEnd).");
	m->m_put_starts = counter(m, "mooncake_master_put_starts_total",
				  "Puts started (PutStart placements made).");
	m->m_revokes = counter(m, "mooncake_master_put_revokes_total",
			       "Puts revoked by their writer (PutRevoke).");
	m->m_timeouts = counter(m, "mooncake_master_put_timeouts_total",
				"PENDING puts revoked after --put-timeout.");
	m->m_gets = counter(m, "mooncake_master_gets_total", "GetReplicas lookups (per key).");
	m->m_hits = counter(m, "mooncake_master_hits_total",
			    "GetReplicas lookups that found a complete object.");
	m->m_misses = counter(m, "mooncake_master_misses_total",
			      "GetReplicas lookups that found nothing.");
	m->m_evictions = counter(m, "mooncake_master_evictions_total", "Objects evicted.");
	m->m_evicted_bytes = counter(m, "mooncake_master_evicted_bytes_total",
				     "Object bytes evicted.");
	m->m_lease_waits = counter(
		m, "mooncake_master_lease_waits_total",
		"Removals refused and eviction candidates skipped because of a read lease.");
	m->m_removes = counter(m, "mooncake_master_removes_total",
			       "Objects removed by Remove/RemoveAll.");
	m->m_quarantined = counter(m, "mooncake_master_forced_removes_held_total",
				   "Objects removed by force while leased: their space "
				   "stayed allocated until the lease ended.");
	m->m_ttl = counter(m, "mooncake_master_ttl_expired_total",
			   "Objects removed when their TTL passed.");
	m->m_agents_expired = counter(
		m, "mooncake_master_agents_expired_total",
		"Agents declared dead after --agent-ttl without a heartbeat.");
	m->m_agents_restarted = counter(
		m, "mooncake_master_agents_restarted_total",
		"Agents whose old process was dropped at once for the mount of "
		"the next process on its data dir.");
	m->m_leader_changes = counter(
		m, "mooncake_master_leadership_changes_total",
		"Times this master became leader or stopped being leader.");
	m->m_objects = gauge(m, "mooncake_master_objects",
			     "Objects in the index (complete and pending).");
	m->m_pending = gauge(m, "mooncake_master_pending_objects", "PENDING puts.");
	m->m_segments = gauge(m, "mooncake_master_segments", "Mounted segments.");
	m->m_agents = gauge(m, "mooncake_master_agents", "Agents with mounted segments.");
	m->m_index_bytes = gauge(
		m, "mooncake_master_index_bytes",
		"Memory of the object index (objects, keys, buckets), measured.");
	m->m_key_bytes = gauge(m, "mooncake_master_key_bytes", "Sum of the key lengths.");
	m->m_bytes_per_object = gauge(
		m, "mooncake_master_bytes_per_object",
		"Index memory per object, keys excluded (0 when empty).");
	m->m_leader = gauge(m, "mooncake_master_is_leader",
			    "1 while this master is the leader.");
	m->m_view = gauge(m, "mooncake_master_view", "View number led or last seen.");
	const char *dram[] = {"dram"}, *ssd[] = {"ssd"};
	m->m_cap_dram = metrics_gauge(m->metrics, "mooncake_master_capacity_bytes",
				      "Mounted segment bytes per tier.", "tier", dram);
	m->m_cap_ssd = metrics_gauge(m->metrics, "mooncake_master_capacity_bytes",
				     "Mounted segment bytes per tier.", "tier", ssd);
	m->m_used_dram = metrics_gauge(m->metrics, "mooncake_master_used_bytes",
				       "Allocated segment bytes per tier.", "tier", dram);
	m->m_used_ssd = metrics_gauge(m->metrics, "mooncake_master_used_bytes",
				      "Allocated segment bytes per tier.", "tier", ssd);
	m->m_mirror_events = counter(m, "mooncake_master_mirror_events_total",
				     "Changes of COMPLETE replicas logged for the owners' "
				     "segment mirrors.");
	m->m_mirror_lost = counter(m, "mooncake_master_mirror_lost_total",
				   "Logged changes dropped before their owner acknowledged "
				   "them (--mirror-log-size): the owner lists its segment.");
	m->m_sync_waiters = gauge(m, "mooncake_master_sync_waiters",
				  "SyncSegment calls parked until their segment changes.");
	m->m_commits = counter(m, "mooncake_master_commits_total",
			       "Puts sealed with one call into leased space (BatchCommit).");
	m->m_commit_refusals = counter(
		m, "mooncake_master_commit_refusals_total",
		"BatchCommit items refused (key exists, space not leased, ...).");
	m->m_lease_granted = counter(
		m, "mooncake_master_lease_granted_bytes_total",
		"Bytes of segment space leased to their owners (LeaseSpace).");
	m->m_lease_released = counter(m, "mooncake_master_lease_released_bytes_total",
				      "Leased bytes given back unused.");
	m->m_leased = gauge(m, "mooncake_master_leased_bytes",
			    "Bytes leased to segment owners and not committed yet.");
	m->m_demotion_starts = counter(
		m, "mooncake_master_demotion_starts_total",
		"Objects given to an SSD segment's owner to copy (FETCH).");
	m->m_demotions = counter(m, "mooncake_master_demotions_total",
				 "Objects moved from DRAM to an SSD segment.");
	m->m_demotion_failures = counter(
		m, "mooncake_master_demotion_failures_total",
		"Demotions given up (by the owner, or past --put-timeout).");
	m->m_promotions = counter(m, "mooncake_master_promotions_total",
				  "Objects moved from SSD back to DRAM.");
	m->m_ssd_evictions = counter(
		m, "mooncake_master_ssd_evictions_total",
		"Replicas evicted from SSD segments past their watermark.");
	m->m_ssd_evicted_bytes = counter(m, "mooncake_master_ssd_evicted_bytes_total",
					 "Object bytes evicted from SSD segments.");
	m->m_ssd_puts = counter(m, "mooncake_master_ssd_puts_total",
				"Puts stored straight on an SSD segment.");
	m->m_ssd_lost = counter(
		m, "mooncake_master_ssd_lost_total",
		"SSD replicas their owner lost (bytes that failed their checksum).");
	m->m_demoting = gauge(m, "mooncake_master_demoting_objects",
			      "Demotions on their way to an SSD segment.");
	m->m_ssd_objects = gauge(m, "mooncake_master_ssd_objects",
				 "Objects with no DRAM replica (on SSD segments only).");
}

static void add_delta(struct metric *mt, uint64_t now, uint64_t *last)
{
	if (now > *last)
		metric_add(mt, now - *last);
	*last = now;
}

static struct master_seg_metrics *seg_metrics(struct master *m, const char *name)
{
	for (size_t i = 0; i < m->nsegm; i++)
		if (strcmp(m->segm[i].name, name) == 0)
			return &m->segm[i];
	struct master_seg_metrics *v = realloc(m->segm, (m->nsegm + 1) * sizeof(*v));
	if (!v)
		return NULL;
	m->segm = v;
	struct master_seg_metrics *sm = &v[m->nsegm];
	memset(sm, 0, sizeof(*sm));
	sm->name = strdup(name);
	if (!sm->name)
		return NULL;
	const char *lv[] = {name};
	sm->capacity = metrics_gauge(m->metrics, "mooncake_master_segment_capacity_bytes",
				     "Bytes of a mounted segment.", "segment", lv);
	sm->used = metrics_gauge(m->metrics, "mooncake_master_segment_used_bytes",
				 "Allocated bytes of a mounted segment.", "segment", lv);
	sm->fragmentation = metrics_gauge(
		m->metrics, "mooncake_master_segment_fragmentation_ppm",
		"1 - largest free range / free bytes, in parts per million.", "segment", lv);
	sm->replicas = metrics_gauge(m->metrics, "mooncake_master_segment_replicas",
				     "Replicas placed on a mounted segment.", "segment", lv);
	m->nsegm++;
	return sm;
}

void master__update_metrics(struct master *m)
{
	const struct master_counters *n = master__core_counters(m->core);
	struct master_counters *l = &m->last;
	add_delta(m->m_puts, n->puts, &l->puts);
	add_delta(m->m_put_starts, n->put_starts, &l->put_starts);
	add_delta(m->m_revokes, n->put_revokes, &l->put_revokes);
	add_delta(m->m_timeouts, n->put_timeouts, &l->put_timeouts);
	add_delta(m->m_gets, n->gets, &l->gets);
	add_delta(m->m_hits, n->hits, &l->hits);
	add_delta(m->m_misses, n->misses, &l->misses);
	add_delta(m->m_evictions, n->evictions, &l->evictions);
	add_delta(m->m_evicted_bytes, n->evicted_bytes, &l->evicted_bytes);
	add_delta(m->m_lease_waits, n->lease_waits, &l->lease_waits);
	add_delta(m->m_removes, n->removes, &l->removes);
	add_delta(m->m_quarantined, n->quarantined, &l->quarantined);
	add_delta(m->m_ttl, n->ttl_expired, &l->ttl_expired);
	add_delta(m->m_agents_expired, n->agents_expired, &l->agents_expired);
	add_delta(m->m_agents_restarted, n->agents_restarted, &l->agents_restarted);
	add_delta(m->m_mirror_events, n->mirror_events, &l->mirror_events);
	add_delta(m->m_mirror_lost, n->mirror_lost, &l->mirror_lost);
	add_delta(m->m_commits, n->commits, &l->commits);
	add_delta(m->m_commit_refusals, n->commit_refusals, &l->commit_refusals);
	add_delta(m->m_lease_granted, n->lease_granted_bytes, &l->lease_granted_bytes);
	add_delta(m->m_lease_released, n->lease_released_bytes, &l->lease_released_bytes);
	add_delta(m->m_demotion_starts, n->demotion_starts, &l->demotion_starts);
	add_delta(m->m_demotions, n->demotions, &l->demotions);
	add_delta(m->m_demotion_failures, n->demotion_failures, &l->demotion_failures);
	add_delta(m->m_promotions, n->promotions, &l->promotions);
	add_delta(m->m_ssd_evictions, n->ssd_evictions, &l->ssd_evictions);
	add_delta(m->m_ssd_evicted_bytes, n->ssd_evicted_bytes, &l->ssd_evicted_bytes);
	add_delta(m->m_ssd_puts, n->ssd_puts, &l->ssd_puts);
	add_delta(m->m_ssd_lost, n->ssd_lost, &l->ssd_lost);
	metric_set(m->m_sync_waiters, (int64_t)m->nsyncw);

	struct master_core_stats st;
	master__core_stats(m->core, &st);
	metric_set(m->m_objects, (int64_t)st.objects);
	metric_set(m->m_pending, (int64_t)st.pending);
	metric_set(m->m_segments, (int64_t)st.segments);
	metric_set(m->m_agents, (int64_t)st.agents);
	metric_set(m->m_index_bytes, (int64_t)st.index_bytes);
	metric_set(m->m_key_bytes, (int64_t)st.key_bytes);
	metric_set(m->m_bytes_per_object,
		   st.objects ? (int64_t)((st.index_bytes - st.key_bytes) / st.objects) : 0);
	metric_set(m->m_cap_dram, (int64_t)st.dram_capacity);
	metric_set(m->m_used_dram, (int64_t)st.dram_used);
	metric_set(m->m_cap_ssd, (int64_t)st.ssd_capacity);
	metric_set(m->m_used_ssd, (int64_t)st.ssd_used);
	metric_set(m->m_demoting, (int64_t)st.demoting);
	metric_set(m->m_ssd_objects, (int64_t)st.ssd_objects);
	metric_set(m->m_leader, m->leader);
	metric_set(m->m_view, (int64_t)m->view);

	for (size_t i = 0; i < m->nsegm; i++)
		m->segm[i].seen = false;
	uint64_t leased = 0;
	for (uint32_t i = 0; i < master__seg_slots(m->core); i++) {
		const struct master_seg *s = master__seg(m->core, i);
		if (!s)
			continue;
		leased += s->leased;
		struct master_seg_metrics *sm = seg_metrics(m, s->name);
		if (!sm)
			continue;
		struct master_alloc_stats as;
		master__alloc_stats(s->alloc, &as);
		metric_set(sm->capacity, (int64_t)as.size);
		metric_set(sm->used, (int64_t)as.used);
		metric_set(sm->fragmentation, (int64_t)(as.fragmentation * 1e6));
		metric_set(sm->replicas, (int64_t)s->replicas);
		sm->seen = true;
	}
	metric_set(m->m_leased, (int64_t)leased);
	/* Unmounted segments: their gauges read 0 (families cannot shrink). */
	for (size_t i = 0; i < m->nsegm;) {
		struct master_seg_metrics *sm = &m->segm[i];
		if (sm->seen) {
			i++;
			continue;
		}
		metric_set(sm->capacity, 0);
		metric_set(sm->used, 0);
		metric_set(sm->fragmentation, 0);
		metric_set(sm->replicas, 0);
		free(sm->name);
		m->segm[i] = m->segm[--m->nsegm];
	}
}

/* ------------------------------------------------------------ leadership */

/* A leader holds watermark eviction while it settles (see
 * master__core_hold_eviction). */
static void hold_eviction_while_settling(struct master *m)
{
	unsigned mounted, syncing;
	master__core_hold_eviction(m->core,
				   m->leader && master__settling(m, &mounted, &syncing));
}

void master__set_leader(struct master *m, bool leader, uint64_t view, const char *leader_addr)
{
	bool was = m->leader;
	if (leader_addr != m->leader_addr)
		snprintf(m->leader_addr, sizeof(m->leader_addr), "%s",
			 leader_addr ? leader_addr : "");
	if (view)
		m->view = view;
	if (was == leader)
		return;
	metric_inc(m->m_leader_changes);
	/* Parked mirror calls name segments of the index about to go, and
	 * removal walks walk it. */
	master__sync_drop_all(m);
	master__walks_drop_all(m);
	/* Either way the index starts empty: a new leader rebuilds it from
	 * the agents, and a stepped-down one must not serve stale state if
	 * it leads again. */
	master__core_reset(m->core);
	master__reap_kick(m, MASTER_NO_SEGMENT); /* (the old index's objects) */
	/* Mirror-log numbers of this leadership: above any an earlier
	 * leader (this process or another, on any host with a sane clock)
	 * handed out, at up to 2^20 changes per millisecond. */
	if (leader)
		master__ev_seq_floor(m->core, mc_wall_ms() << 20);
	m->leader = leader;
	m->leader_since_ms = uv_now(m->loop);
	hold_eviction_while_settling(m); /* (each tick says it again) */
	if (m->health &&
	    rpc_health_set(m->health, MASTER_SERVICE,
			   leader ? RPC_HEALTH_SERVING : RPC_HEALTH_NOT_SERVING) != 0)
		log_warn("cannot update the health status of %s", MASTER_SERVICE);
	master__update_metrics(m);
}

/* ------------------------------------------------------------ timer */

static void on_tick(uv_timer_t *t)
{
	struct master *m = t->data;
	uint64_t now = uv_now(m->loop), gap = now - m->last_tick_ms;
	m->last_tick_ms = now;
	if (m->leader) {
		hold_eviction_while_settling(m);
		/* A tick this late means the loop was held (a call that ran
		 * long; the process stopped or the VM paused):
		 * the agents' heartbeats are still unread, and this tick runs
		 * before they are. Without this, every agent would expire. */
		if (gap > TICK_LATE_MS && master__loop_held(m->core, gap - TICK_MS))
			log_warn("the loop was held for %" PRIu64 " ms: agents' --agent-ttl "
				 "moves on by that much (their heartbeats wait unread)",
				 gap - TICK_MS);
		master__tick(m->core, now);
		master__reap_kick(m, MASTER_NO_SEGMENT); /* (agents expired) */
	}
	master__sync_tick(m, now);
	if (++m->ticks % METRICS_EVERY_TICKS == 0)
		master__update_metrics(m);
}

/* ------------------------------------------------------------ lifecycle */

static void free_strings(struct master *m)
{
	free(m->advertise);
	free(m->listen);
	free(m->cluster_id);
	free(m->meta_endpoints);
	free(m->leader_key);
	free(m->view_key);
}

int master_new(const struct master_opts *o, struct master **out)
{
	if (!o->loop || !o->rpc || !o->cluster_id || !*o->cluster_id || !o->agent_ttl_ms ||
	    !o->put_timeout_ms || !o->leader_lease_ttl_ms)
		return -EINVAL;
	struct master *m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	int rc = -ENOMEM;
	m->loop = o->loop;
	m->rpc = o->rpc;
	m->health = o->health;
	m->metrics = o->metrics ? o->metrics : metrics_global();
	m->leader_lease_ttl_ms = o->leader_lease_ttl_ms;
	m->core_opts = (struct master_core_opts){
		.put_timeout_ms = o->put_timeout_ms,
		.lease_ttl_ms = o->lease_ttl_ms,
		.agent_ttl_ms = o->agent_ttl_ms,
		.high_watermark = o->high_watermark,
		.eviction_ratio = o->eviction_ratio,
		.seed = uv_hrtime() | 1,
		.mirror_log_bytes = o->mirror_log_bytes,
	};
	m->advertise = strdup(o->advertise ? o->advertise : "");
	m->listen = strdup(o->listen ? o->listen : "");
	m->cluster_id = strdup(o->cluster_id);
	m->meta_endpoints = strdup(o->meta_endpoints ? o->meta_endpoints : "");
	size_t klen = strlen(o->cluster_id) + 32;
	m->leader_key = malloc(klen);
	m->view_key = malloc(klen);
	if (!m->advertise || !m->listen || !m->cluster_id || !m->meta_endpoints ||
	    !m->leader_key || !m->view_key)
		goto err_strings;
	snprintf(m->leader_key, klen, "/mooncake/%s/master", o->cluster_id);
	snprintf(m->view_key, klen, "/mooncake/%s/master-view", o->cluster_id);
	rc = master__core_new(&m->core_opts, &m->core);
	if (rc)
		goto err_strings;
	register_metrics(m);
	rc = master__service_add(m);
	if (rc)
		goto err_core;
	if (m->health)
		rc = rpc_health_set(m->health, MASTER_SERVICE, RPC_HEALTH_NOT_SERVING);
	if (rc)
		goto err_core;
	rc = master__ha_start(m, o->meta_key, o->meta_key_len);
	if (rc)
		goto err_core;
	uv_timer_init(m->loop, &m->tick);
	m->tick.data = m;
	/* The first tick's gap counts from here: a loop held before it (a
	 * master stopped in its first 100 ms) gets the agents' credit too. */
	uv_update_time(m->loop);
	m->last_tick_ms = uv_now(m->loop);
	uv_timer_start(&m->tick, on_tick, TICK_MS, TICK_MS);
	master__sync_init(m);
	master__walks_init(m);
	*out = m;
	return 0;

err_core:
	/* The service stays registered on the server with m as its data:
	 * the server must not listen (the daemon fails start-up). */
	master__core_free(m->core);
err_strings:
	free_strings(m);
	free(m);
	return rc;
}

static void on_handle_closed(uv_handle_t *h)
{
	struct master *m = h->data;
	if (--m->closing == 0 && m->on_stopped)
		m->on_stopped(m->stop_ud);
}

static void on_ha_stopped(struct master *m)
{
	m->closing += 4;
	uv_close((uv_handle_t *)&m->tick, on_handle_closed);
	master__sync_close(m, on_handle_closed);
	master__walks_close(m, on_handle_closed);
}

void master_stop(struct master *m, void (*on_stopped)(void *ud), void *ud)
{
	if (m->stopping)
		return;
	m->stopping = true;
	m->on_stopped = on_stopped;
	m->stop_ud = ud;
	if (m->leader)
		log_info("stepping down as leader of view %llu", (unsigned long long)m->view);
	master__set_leader(m, false, 0, m->leader_addr);
	master__ha_stop(m, on_ha_stopped);
}

void master_free(struct master *m)
{
	if (!m)
		return;
	master__ha_free(m);
	master__sync_free(m);
	master__walks_free(m);
	master__core_free(m->core);
	for (size_t i = 0; i < m->nsegm; i++)
		free(m->segm[i].name);
	free(m->segm);
	free_strings(m);
	free(m);
}

bool master_is_leader(const struct master *m)
{
	return m->leader;
}

uint64_t master_view(const struct master *m)
{
	return m->view;
}
