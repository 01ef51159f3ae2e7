/*
 * node: the meta node's life — its options checked and copied, its parts
 * started in order (state machine, identity and first state in boot.c,
 * services, disk thread, timers), its metrics and health, and its stop:
 * a leader hands leadership over first, then every waiting request fails,
 * streams end, and the handles close once the disk work in flight is done.
 *
 * The node's other rooms: ready.c (the driver: the turn around the Raft
 * core), req.c and read.c (client requests), member.c (membership),
 * snapshot.c (taking snapshots), peer.c (the peer transport), sm.c (the
 * state machine), svc*.c (the etcd services).
 */
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/metrics.h"
#include "common/util.h"
#include "meta/meta_int.h"

#define LOG_SUBSYS LOGS_META

uint64_t meta__now(const struct meta_node *n)
{
	return uv_now(n->loop);
}

bool meta__is_leader(const struct meta_node *n)
{
	return n->running && n->role == RAFT_LEADER;
}

struct meta__sm_in meta__sm_in(const struct meta_node *n)
{
	return (struct meta__sm_in){.now_ms = meta__now(n), .term = n->term};
}

Etcdserverpb__ResponseHeader *meta__header(struct meta_node *n, struct meta__arena *a)
{
	return meta__sm_header(&n->sm, n->term, a);
}

void meta__fatal(struct meta_node *n, int code, const char *what)
{
	if (n->fatal)
		return;
	n->fatal = true;
	log_error("meta: %s: %s; this member stops", what, meta__strerror(code));
	if (n->o.on_fatal)
		n->o.on_fatal(n->o.ud);
}

char *meta__printf(const char *fmt, ...)
{
	va_list ap;
	char *s;
	va_start(ap, fmt);
	int len = vasprintf(&s, fmt, ap);
	va_end(ap);
	return len < 0 ? NULL : s;
}

#define M_(field) offsetof(struct meta_node, field)

static const struct {
	size_t off; /* of the struct metric * in the node */
	bool counter;
	const char *name, *help;
} metric_defs[] = {
	{M_(m_term), false, "mooncake_meta_raft_term", "Current Raft term."},
	{M_(m_leader), false, "mooncake_meta_leader_id",
	 "Member ID of the leader (0: none known)."},
	{M_(m_has_leader), false, "mooncake_meta_has_leader", "1 when a leader is known."},
	{M_(m_is_leader), false, "mooncake_meta_is_leader",
	 "1 when this member is the leader."},
	{M_(m_commit), false, "mooncake_meta_commit_index", "Raft commit index known here."},
	{M_(m_applied), false, "mooncake_meta_applied_index",
	 "Last Raft index applied to the state machine."},
	{M_(m_committed), true, "mooncake_meta_proposals_committed_total",
	 "Log entries committed and applied."},
	{M_(m_failed), true, "mooncake_meta_proposals_failed_total",
	 "Proposals that failed (lost to a leader change, refused or timed out)."},
	{M_(m_pending), false, "mooncake_meta_proposals_pending",
	 "Proposals waiting to be applied."},
	{M_(m_leader_changes), true, "mooncake_meta_leader_changes_total",
	 "Leader changes seen."},
	{M_(m_snapshots), true, "mooncake_meta_snapshots_total",
	 "Snapshots taken by this member."},
	{M_(m_snap_writing), false, "mooncake_meta_snapshot_in_progress",
	 "1 while a forked copy of this member writes its snapshot."},
	{M_(m_snap_sent), true, "mooncake_meta_snapshots_sent_total",
	 "Snapshots streamed to lagging members."},
	{M_(m_snap_recv), true, "mooncake_meta_snapshots_received_total",
	 "Snapshots installed from the leader."},
	{M_(m_db_size), false, "mooncake_meta_db_size_bytes",
	 "Size of the key-value store (keys, values, history, 64 bytes a lease), as compared with "
	 "--quota-backend-bytes."},
	{M_(m_watchers), false, "mooncake_meta_watchers", "Active watchers."},
	{M_(m_leases), false, "mooncake_meta_leases", "Leases held."},
	{M_(m_keys), false, "mooncake_meta_keys", "Live keys."},
	{M_(m_forwarded), true, "mooncake_meta_forwarded_total",
	 "Requests forwarded to the leader."},
};

#undef M_

static void register_metrics(struct meta_node *n)
{
	struct metrics_registry *r = n->o.metrics ? n->o.metrics : metrics_global();
	for (size_t i = 0; i < MC_ARRAY_LEN(metric_defs); i++) {
		struct metric **slot = (struct metric **)((char *)n + metric_defs[i].off);
		*slot = metric_defs[i].counter
				? metrics_counter(r, metric_defs[i].name, metric_defs[i].help,
						  NULL, NULL)
				: metrics_gauge(r, metric_defs[i].name, metric_defs[i].help,
						NULL, NULL);
	}
}

void meta__update_metrics(struct meta_node *n)
{
	struct mvcc_stats ms;
	struct watch_stats ws;

	metric_set(n->m_term, (int64_t)n->term);
	metric_set(n->m_leader, (int64_t)n->leader);
	metric_set(n->m_has_leader, n->leader != RAFT_NONE);
	metric_set(n->m_is_leader, n->role == RAFT_LEADER);
	metric_set(n->m_commit, (int64_t)n->commit);
	metric_set(n->m_applied, (int64_t)n->applied);
	metric_set(n->m_pending, (int64_t)n->waiters.n);
	mvcc_stats(n->sm.store, &ms);
	metric_set(n->m_db_size, (int64_t)meta__quota_size(&n->sm));
	metric_set(n->m_keys, (int64_t)ms.keys);
	metric_set(n->m_leases, (int64_t)lease_count(mvcc_leases(n->sm.store)));
	if (n->watch) {
		watch_stats(n->watch, &ws);
		metric_set(n->m_watchers, (int64_t)ws.watchers);
	}
}

int meta__set_health(struct meta_node *n, enum rpc_health_status st)
{
	static const char *const client_svcs[] = {
		"etcdserverpb.KV",      "etcdserverpb.Lease",       "etcdserverpb.Watch",
		"etcdserverpb.Cluster", "etcdserverpb.Maintenance", "etcdserverpb.Auth"};
	int rc = 0;
	for (size_t i = 0; n->o.client_health && i < MC_ARRAY_LEN(client_svcs) && !rc; i++)
		rc = rpc_health_set(n->o.client_health, client_svcs[i], st);
	if (!rc && n->o.peer_health)
		rc = rpc_health_set(n->o.peer_health, "mooncake.raft.Raft", st);
	return rc;
}

void meta__start_running(struct meta_node *n)
{
	struct raft_conf_state cs = raft_conf(n->raft);
	n->running = true;
	n->last_heard_ms = meta__now(n);
	/* Alone in the cluster: no one to wait for, lead at once. */
	if (cs.n_voters == 1 && cs.voters[0] == n->id)
		n->campaign = true;
	if (meta__set_health(n, RPC_HEALTH_SERVING))
		log_warn("cannot set the services' health");
	meta__update_metrics(n);
	meta__kick(n);
}

/* *out: a copy of the len bytes at key, or NULL when len is 0 (wiped by
 * wipe_key when the node is freed). */
static int copy_key(const uint8_t *key, size_t len, uint8_t **out)
{
	*out = len ? malloc(len) : NULL;
	if (len && !*out)
		return -ENOMEM;
	if (len)
		memcpy(*out, key, len);
	return 0;
}

static void wipe_key(uint8_t *key, size_t len)
{
	if (key)
		memset(key, 0, len);
	free(key);
}

static int copy_opts(struct meta_node *n, const struct meta_options *o)
{
	n->o = *o;
	n->name = strdup(o->name ? o->name : "default");
	n->initial_cluster = strdup(o->initial_cluster ? o->initial_cluster : "");
	n->listen_peer = strdup(o->listen_peer ? o->listen_peer : "127.0.0.1:2380");
	n->listen_client = strdup(o->listen_client ? o->listen_client : "127.0.0.1:2379");
	n->dir = meta__printf("%s/meta", o->data_dir ? o->data_dir : ".");
	if (!n->name || !n->initial_cluster || !n->listen_peer || !n->listen_client || !n->dir)
		return -ENOMEM;
	n->wal_dir = meta__printf("%s/wal", n->dir);
	n->snap_dir = meta__printf("%s/snap", n->dir);
	n->member_path = meta__printf("%s/member", n->dir);
	if (!n->wal_dir || !n->snap_dir || !n->member_path)
		return -ENOMEM;
	const char *ap = o->advertise_peer && *o->advertise_peer ? o->advertise_peer
								 : n->listen_peer;
	const char *ac = o->advertise_client && *o->advertise_client ? o->advertise_client
								     : n->listen_client;
	n->self_peer_url = meta__normalize_url(ap);
	n->self_client_url = meta__normalize_url(ac);
	if (!n->self_peer_url || !n->self_client_url) {
		log_error("--advertise-peer/--listen-peer %s or --advertise-client/"
			  "--listen-client %s is not a numeric host:port",
			  ap, ac);
		return MC_ECONFIG;
	}
	n->o.name = n->name;
	n->o.initial_cluster = n->initial_cluster;
	n->o.listen_peer = n->listen_peer;
	n->o.listen_client = n->listen_client;
	n->o.advertise_peer = NULL;
	n->o.advertise_client = NULL;
	n->o.data_dir = NULL;
	if (copy_key(o->peer_key, o->peer_key_len, &n->peer_key) ||
	    copy_key(o->client_key, o->client_key_len, &n->client_key))
		return -ENOMEM;
	n->o.peer_key = n->peer_key;
	n->o.client_key = n->client_key;
	if (!*n->name) {
		log_error("--name must not be empty");
		return MC_ECONFIG;
	}
	if (o->heartbeat_ms == 0 || o->election_ms < 2 * o->heartbeat_ms) {
		log_error("--election-timeout (%" PRIu64 " ms) must be at least twice "
			  "--heartbeat-interval (%" PRIu64 " ms)",
			  o->election_ms, o->heartbeat_ms);
		return MC_ECONFIG;
	}
	if (!o->snapshot_count || !o->max_request_bytes || !o->quota_backend_bytes) {
		log_error(
			"--snapshot-count, --max-request-bytes and --quota-backend-bytes must be "
			"positive");
		return MC_ECONFIG;
	}
	int rc;
	if ((rc = meta__compactor_init(&n->compactor, o->auto_compaction_mode,
				       o->auto_compaction_retention)))
		return rc;
	n->o.auto_compaction_mode = NULL; /* not copied: read here only */
	n->o.auto_compaction_retention = NULL;
	if (!n->o.progress_notify_ms)
		n->o.progress_notify_ms = 600000;
	/* etcd's request timeout: 5 s plus two election timeouts. */
	n->request_timeout_ms = 5000 + 2 * o->election_ms;
	return 0;
}

static void node_free_state(struct meta_node *n)
{
	while (n->qhead) {
		struct meta__qmsg *q = n->qhead;
		n->qhead = q->next;
		free(q);
	}
	if (n->recv_snap) {
		free(n->recv_snap->data);
		free(n->recv_snap);
	}
	meta__peer_free_all(n);
	if (n->watch)
		watch_registry_free(n->watch);
	meta__compactor_free(&n->compactor);
	meta__sm_free(&n->sm);
	if (n->installed_sm) {
		meta__sm_free(n->installed_sm);
		free(n->installed_sm);
	}
	raft_free(n->raft);
	wal_close(n->wal);
	free(n->went);
	free(n->late);
	free(n->unreachable);
	free(n->snap_reports);
	wipe_key(n->peer_key, n->o.peer_key_len);
	wipe_key(n->client_key, n->o.client_key_len);
	free(n->name);
	free(n->initial_cluster);
	free(n->listen_peer);
	free(n->listen_client);
	free(n->dir);
	free(n->wal_dir);
	free(n->snap_dir);
	free(n->member_path);
	free(n->self_peer_url);
	free(n->self_client_url);
	free(n);
}

int meta_node_new(uv_loop_t *loop, const struct meta_options *o, struct meta_node **out)
{
	struct meta_node *n = calloc(1, sizeof(*n));
	int rc;

	if (!n)
		return -ENOMEM;
	n->loop = loop;
	if ((rc = copy_opts(n, o)))
		goto fail;
	if ((rc = mc_mkdir_p(n->dir, 0750))) {
		log_error("cannot create %s: %s", n->dir, mc_strerror(rc));
		goto fail;
	}
	register_metrics(n);
	/* etcd's minimum lease TTL: 1.5 election timeouts, in whole seconds. */
	struct mvcc_options mo = {
		.min_lease_ttl_s = (int64_t)((n->o.election_ms * 3 / 2 + 999) / 1000)};
	if ((rc = meta__sm_init(&n->sm, &mo)))
		goto fail;
	bool join = false;
	if ((rc = meta__boot(n, &join)))
		goto fail;
	if ((rc = watch_registry_new(n->sm.store, 0, &n->watch)))
		goto fail;
	if ((rc = meta__svc_add(n)) || (rc = meta__watch_service_add(n)) ||
	    (rc = meta__auth_service_add(n)) || (rc = meta__peer_service_add(n))) {
		log_error("cannot register the meta services: %s", mc_strerror(rc));
		goto fail;
	}
	/* Nothing below fails but the worker; handles come last. */
	if ((rc = meta__worker_new(loop, &n->disk))) {
		log_error("cannot start the disk thread: %s", mc_strerror(rc));
		goto fail;
	}
	uv_timer_init(loop, &n->tick_timer);
	uv_idle_init(loop, &n->kick);
	uv_idle_init(loop, &n->snap_idle);
	uv_idle_init(loop, &n->compact_idle);
	uv_timer_init(loop, &n->progress_timer);
	uv_timer_init(loop, &n->sync_timer);
	uv_timer_init(loop, &n->join_timer);
	uv_timer_init(loop, &n->stop_timer);
	n->handles_open = true;
	uv_timer_start(&n->tick_timer, meta__on_tick, n->o.heartbeat_ms, n->o.heartbeat_ms);
	meta__watch_start_timers(n);
	meta__tidy(n); /* what a crash left set aside */
	if (join) {
		meta__peer_join(n);
	} else {
		meta__start_running(n);
	}
	*out = n;
	return 0;
fail:
	node_free_state(n);
	return rc;
}

static void on_handle_closed(uv_handle_t *h)
{
	struct meta_node *n = h->data;
	if (--n->closing_handles == 0 && n->on_stopped) {
		void (*cb)(void *) = n->on_stopped;
		n->on_stopped = NULL;
		cb(n->stopped_ud);
	}
}

static void close_handle(struct meta_node *n, uv_handle_t *h)
{
	h->data = n;
	n->closing_handles++;
	uv_close(h, on_handle_closed);
}

/* Everything ended but the disk work in flight: once that completes,
 * close the handles; on_stopped runs when they are closed. */
void meta__check_stopped(struct meta_node *n)
{
	if (!n->finishing || !n->handles_open)
		return;
	if (n->disk_jobs || n->uv_works || (n->in_ready && !n->fatal))
		return;
	n->handles_open = false;
	meta__worker_close(n->disk);
	close_handle(n, (uv_handle_t *)&n->tick_timer);
	close_handle(n, (uv_handle_t *)&n->kick);
	close_handle(n, (uv_handle_t *)&n->snap_idle);
	close_handle(n, (uv_handle_t *)&n->compact_idle);
	close_handle(n, (uv_handle_t *)&n->progress_timer);
	close_handle(n, (uv_handle_t *)&n->sync_timer);
	close_handle(n, (uv_handle_t *)&n->join_timer);
	close_handle(n, (uv_handle_t *)&n->stop_timer);
}

void meta__finish_stop(struct meta_node *n)
{
	if (n->finishing)
		return;
	uv_timer_stop(&n->stop_timer);
	n->finishing = true;
	meta__fail_list(&n->propq, META_ESTOPPED);
	meta__fail_list(&n->waiters, META_ESTOPPED);
	meta__fail_list(&n->wait_leader, META_ESTOPPED);
	meta__fail_list(&n->retry, META_ESTOPPED);
	meta__fail_list(&n->reads, META_ESTOPPED);
	meta__fail_list(&n->round, META_ESTOPPED);
	meta__fail_list(&n->read_wait, META_ESTOPPED);
	meta__fail_list(&n->moving, META_ESTOPPED);
	meta__watch_close_streams(n);
	meta__svc_close_streams(n);
	meta__peer_close_all(n);
	meta__snapshot_abandon(n);
	if (meta__set_health(n, RPC_HEALTH_NOT_SERVING))
		log_warn("cannot set the services' health");
	meta__check_stopped(n);
}

static void on_stop_timeout(uv_timer_t *t)
{
	struct meta_node *n = MC_CONTAINER_OF(t, struct meta_node, stop_timer);
	log_warn("leadership transfer did not finish within the election timeout; "
		 "stopping anyway");
	meta__finish_stop(n);
}

void meta_node_stop(struct meta_node *n, void (*on_done)(void *ud), void *ud)
{
	if (n->stopping)
		return;
	n->on_stopped = on_done;
	n->stopped_ud = ud;
	if (meta__is_leader(n) && !n->fatal) {
		struct raft_status st;
		struct raft_peer_status ps[64];
		size_t k = raft_status(n->raft, &st, ps, MC_ARRAY_LEN(ps));
		uint64_t best = 0, best_match = 0;
		for (size_t i = 0; i < k && i < MC_ARRAY_LEN(ps); i++)
			if (ps[i].id != n->id && !ps[i].learner && ps[i].recent_active &&
			    (!best || ps[i].match > best_match)) {
				best = ps[i].id;
				best_match = ps[i].match;
			}
		if (best) {
			log_info("stopping: handing leadership to %016" PRIx64, best);
			n->transfer_to = best;
			n->stopping = true;
			uv_timer_start(&n->stop_timer, on_stop_timeout, n->o.election_ms, 0);
			meta__kick(n);
			return;
		}
	}
	n->stopping = true;
	meta__finish_stop(n);
}

void meta_node_free(struct meta_node *n)
{
	if (!n)
		return;
	meta__worker_free(n->disk);
	node_free_state(n);
}
