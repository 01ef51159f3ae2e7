/*
 * ready: the meta node's driver — the io layer around the pure Raft core.
 *
 * Inputs (peer messages, ticks, proposals, transport reports) reach the
 * core when it is free; while a ready batch is out (between raft_ready and
 * raft_advance) they are queued and fed in at the next turn, so everything
 * proposed meanwhile lands in one batch and one fdatasync (group commit).
 * A turn runs from an idle callback (meta__kick):
 *
 *   feed queued inputs -> raft_ready -> persist on the disk thread
 *   (snapshot file, WAL entries and hard state, fdatasync when the ready
 *   says so) -> back on the loop: install a received snapshot, send the
 *   messages, apply committed entries and answer their proposers, serve
 *   ReadIndex reads, raft_advance -> route watch events, snapshot every
 *   --snapshot-count entries, take the next turn.
 *
 * Lease expiry belongs to the leader: it promotes the lease table when it
 * wins (every lease gets its full TTL plus an election timeout from now),
 * checks it every tick and proposes the revokes of the expired leases.
 *
 * Also here: the heartbeat tick, the inputs the transport hands in, and
 * what the driver does about an applied entry's effects (sm.h).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/metrics.h"
#include "common/util.h"
#include "meta/meta_int.h"

#define LOG_SUBSYS LOGS_META

/* Lease revokes the leader proposes per tick at most. */
#define LEASE_REVOKES_PER_TICK 256
/* As etcd's "apply request took too long" (its expected duration). */
#define APPLY_WARN_MS 100u

static void run(struct meta_node *n);
static void process_ready(struct meta_node *n);
static void persist_done(struct meta_node *n);
static void apply_committed(struct meta_node *n, const struct raft_entry *e, size_t k);
static void after_apply(struct meta_node *n);

static void on_kick(uv_idle_t *h)
{
	struct meta_node *n = MC_CONTAINER_OF(h, struct meta_node, kick);
	uv_idle_stop(h);
	run(n);
}

void meta__kick(struct meta_node *n)
{
	if (n->handles_open && !uv_is_active((uv_handle_t *)&n->kick))
		uv_idle_start(&n->kick, on_kick);
}

static void feed(struct meta_node *n)
{
	int rc = 0;

	while (n->qhead && !n->fatal) {
		struct meta__qmsg *q = n->qhead;
		n->qhead = q->next;
		if (!n->qhead)
			n->qtail = NULL;
		rc = raft_step(n->raft, &q->m);
		free(q);
		if (rc == -ENOMEM || rc == MC_EINTERNAL)
			goto fatal;
	}
	while (n->pending_ticks && !n->fatal) {
		n->pending_ticks--;
		if ((rc = raft_tick(n->raft)))
			goto fatal;
	}
	for (size_t i = 0; i < n->n_unreachable; i++)
		if ((rc = raft_report_unreachable(n->raft, n->unreachable[i])))
			goto fatal;
	n->n_unreachable = 0;
	for (size_t i = 0; i < n->n_snap_reports; i++)
		if ((rc = raft_report_snapshot(n->raft, n->snap_reports[i].id,
					       n->snap_reports[i].ok)))
			goto fatal;
	n->n_snap_reports = 0;
	if (n->pending_compact) {
		uint64_t i = n->pending_compact;
		n->pending_compact = 0;
		rc = raft_compact(n->raft, i);
		if (rc == -ENOMEM || rc == MC_EINTERNAL)
			goto fatal;
	}
	if (n->transfer_to) {
		uint64_t to = n->transfer_to;
		n->transfer_to = 0;
		rc = raft_transfer_leader(n->raft, to);
		if (rc == -ENOMEM || rc == MC_EINTERNAL)
			goto fatal;
	}
	if (n->campaign) {
		n->campaign = false;
		rc = raft_campaign(n->raft);
		if (rc == -ENOMEM || rc == MC_EINTERNAL)
			goto fatal;
	}
	if (n->propq.head) {
		struct meta__oplist tmp = n->propq;
		for (struct meta__op *op = tmp.head; op; op = op->next)
			op->list = &tmp;
		memset(&n->propq, 0, sizeof(n->propq));
		while (tmp.head) {
			struct meta__op *op = tmp.head;
			meta__oplist_remove(op);
			meta__propose(n, op);
		}
	}
	if (n->round_needed)
		meta__read_round(n);
	return;
fatal:
	meta__fatal(n, rc, "the Raft core failed");
}

static void run(struct meta_node *n)
{
	if (!n->running || n->in_ready || n->fatal)
		return;
	feed(n);
	if (n->fatal || !raft_has_ready(n->raft))
		return;
	int rc = raft_ready(n->raft, &n->rd);
	if (rc) {
		meta__fatal(n, rc, "the Raft core failed");
		return;
	}
	n->in_ready = true;
	process_ready(n);
}

static void on_soft_state(struct meta_node *n, uint64_t leader, enum raft_role role)
{
	uint64_t old_leader = n->leader;
	enum raft_role old_role = n->role;

	n->leader = leader;
	n->role = role;
	if (leader != old_leader) {
		metric_inc(n->m_leader_changes);
		if (leader == RAFT_NONE)
			log_info("lost the leader %016" PRIx64, old_leader);
		else
			log_info("leader is %016" PRIx64 "%s", leader,
				 leader == n->id ? " (this member)" : "");
	}
	if (role == RAFT_LEADER && old_role != RAFT_LEADER) {
		lease_promote(mvcc_leases(n->sm.store), meta__now(n), n->o.election_ms);
		log_info("became the leader at term %" PRIu64 "; leases extended by %" PRIu64
			 " ms",
			 n->term, n->o.election_ms);
	} else if (old_role == RAFT_LEADER && role != RAFT_LEADER) {
		lease_demote(mvcc_leases(n->sm.store));
		log_info("no longer the leader");
	}
	if (leader != old_leader) {
		meta__read_retry(n);
		/* MoveLeader calls: done once someone else leads. */
		if (role != RAFT_LEADER && leader != RAFT_NONE) {
			while (n->moving.head) {
				struct meta__op *op = n->moving.head;
				Etcdserverpb__MoveLeaderResponse resp =
					ETCDSERVERPB__MOVE_LEADER_RESPONSE__INIT;
				struct meta__arena a = {0};
				resp.header = meta__header(n, &a);
				if (resp.header)
					meta__op_done(op, RPC_OK, NULL, &resp.base);
				else
					meta__op_fail(op, -ENOMEM);
				meta__arena_free(&a);
			}
		}
		if (leader != RAFT_NONE)
			meta__rerun(n, &n->wait_leader);
	}
	if (n->stopping && old_role == RAFT_LEADER && role != RAFT_LEADER)
		meta__finish_stop(n);
}

struct persist_job {
	struct meta__job job;
	struct meta_node *n;
	struct wal_hard_state hs;
	bool has_hs;
	const struct wal_entry *ents;
	size_t n_ents;
	bool sync;
	/* a received snapshot to make the node's */
	struct snap_meta smeta;
	uint8_t *conf;
	const uint8_t *snap_data;
	size_t snap_len;
	bool install;
	/* the received state, decoded off the loop */
	struct meta__sm *sm;
};

static void persist_work(struct meta__job *j)
{
	struct persist_job *p = MC_CONTAINER_OF(j, struct persist_job, job);
	struct meta_node *n = p->n;
	int rc = 0;

	if (p->install) {
		struct snap_writer *wr;
		rc = snap_writer_open(n->snap_dir, &p->smeta, &wr);
		if (rc == 0) {
			rc = snap_writer_write(wr, p->snap_data, p->snap_len);
			if (rc == 0)
				rc = snap_writer_commit(wr, META_SNAPSHOTS_KEPT);
			else
				snap_writer_abort(wr);
		}
		/* Decoding a large state takes long: here, not on the loop,
		 * which only swaps it in (persist_done). */
		if (rc == 0)
			rc = meta__sm_restore(p->sm, p->snap_data, p->snap_len);
		if (rc == 0)
			rc = wal_save_snapshot(
				n->wal, (struct wal_snap_ref){p->smeta.index, p->smeta.term},
				false);
	}
	if (rc == 0)
		rc = wal_save(n->wal, p->has_hs ? &p->hs : NULL, p->ents, p->n_ents, p->sync);
	j->rc = rc;
}

struct free_sm_job {
	struct meta__job job;
	struct meta_node *n;
	struct meta__sm *sm;
};

static void free_sm_work(struct meta__job *j)
{
	struct free_sm_job *f = MC_CONTAINER_OF(j, struct free_sm_job, job);
	meta__sm_free(f->sm);
	free(f->sm);
	j->rc = 0;
}

static void free_sm_done(struct meta__job *j)
{
	struct free_sm_job *f = MC_CONTAINER_OF(j, struct free_sm_job, job);
	struct meta_node *n = f->n;
	n->disk_jobs--;
	free(f);
	meta__check_stopped(n);
}

/* A replaced state can hold hundreds of megabytes in millions of pieces:
 * the disk thread frees it, not the loop (here if that cannot be arranged). */
static void free_sm_later(struct meta_node *n, struct meta__sm *sm)
{
	struct free_sm_job *f = calloc(1, sizeof(*f));
	if (!f) {
		meta__sm_free(sm);
		free(sm);
		return;
	}
	f->job.work = free_sm_work;
	f->job.done = free_sm_done;
	f->n = n;
	f->sm = sm;
	n->disk_jobs++;
	meta__worker_submit(n->disk, &f->job);
}

static void persist_job_done(struct meta__job *j)
{
	struct persist_job *p = MC_CONTAINER_OF(j, struct persist_job, job);
	struct meta_node *n = p->n;
	int rc = j->rc;
	bool install = p->install;

	n->disk_jobs--;
	n->persist_job = NULL;
	if (!rc && p->install) {
		n->durable_index = p->smeta.index;
		n->installed_sm = p->sm;
		p->sm = NULL;
	}
	if (!rc && p->n_ents)
		n->durable_index = p->ents[p->n_ents - 1].index;
	if (p->sm) {
		meta__sm_free(p->sm);
		free(p->sm);
	}
	free(p->conf);
	free(p);
	if (rc) {
		meta__fatal(n, rc,
			    install ? "cannot install the snapshot received from the leader"
				    : "cannot write the WAL");
		meta__check_stopped(n);
		return;
	}
	persist_done(n);
	meta__check_stopped(n);
}

/*
 * Committed entries already durable here before this ready (every one of
 * them on a member that is not alone, since the leader commits what a
 * quorum has made durable) are applied and answered at once, before the
 * ready's own fdatasync: a commit then costs no extra local sync. ReadIndex
 * answers need no durability either. The rest waits for the persist.
 */
static void apply_early(struct meta_node *n)
{
	struct raft_ready *rd = &n->rd;
	size_t k = 0;

	n->early_applied = 0;
	n->early_ran = false;
	if (rd->snapshot)
		return;
	n->early_ran = true;
	while (k < rd->n_committed && rd->committed[k].index <= n->durable_index)
		k++;
	if (k) {
		apply_committed(n, rd->committed, k);
		n->early_applied = k;
	}
	for (size_t i = 0; i < rd->n_read_states && !n->fatal; i++)
		meta__read_state(n, &rd->read_states[i]);
	if (!n->fatal && (k || rd->n_read_states))
		after_apply(n);
}

/*
 * Messages that may leave before the ready is durable. raft.h's rule is
 * that every message waits for the persist; two kinds need not:
 *  - everything a leader sends while its term and vote stand (appends,
 *    heartbeats, snapshots, answers): the leader then writes its entries
 *    while the followers write theirs (Raft thesis 10.2.1, etcd's
 *    leader). Its own entries count toward a commit only through the
 *    followers' acknowledgements, which the driver queues while the ready
 *    is out and feeds after the persist, so nothing commits that the
 *    leader has not made durable, and no follower learns such a commit.
 *  - a follower's heartbeat response, which claims nothing about the log
 *    (while its term stands).
 * Waiting for them would let a slow disk (the WAL's fdatasync behind a
 * snapshot's writes, on a disk the members share) stop heartbeats and
 * their answers, and the leader step down for want of a quorum.
 */
static bool early_ok(const struct meta_node *n, const struct raft_ready *rd, uint64_t old_term,
		     const struct raft_msg *m)
{
	if (rd->snapshot || (rd->hard_state_changed && rd->hard_state.term != old_term))
		return false;
	return n->role == RAFT_LEADER || m->type == RAFT_MSG_HEARTBEAT_RESP;
}

/* Send the messages of rd that may go now; keep the others in n->late
 * for persist_done. */
static int send_early(struct meta_node *n, const struct raft_ready *rd, uint64_t old_term)
{
	size_t k = 0, m = 0;
	if (rd->n_msgs > n->late_cap) {
		struct raft_msg *v = realloc(n->late, 2 * rd->n_msgs * sizeof(*v));
		if (!v)
			return -ENOMEM;
		n->late = v;
		n->late_cap = 2 * rd->n_msgs;
	}
	/* Early ones first, in order, then the rest: two lists in one. */
	for (size_t i = 0; i < rd->n_msgs; i++)
		if (early_ok(n, rd, old_term, &rd->msgs[i]))
			n->late[k++] = rd->msgs[i];
	if (k)
		meta__peer_send(n, n->late, k);
	for (size_t i = 0; i < rd->n_msgs; i++)
		if (!early_ok(n, rd, old_term, &rd->msgs[i]))
			n->late[m++] = rd->msgs[i];
	n->n_late = m;
	n->split_msgs = true;
	return 0;
}

static void process_ready(struct meta_node *n)
{
	struct raft_ready *rd = &n->rd;
	uint64_t old_term = n->term;

	n->split_msgs = false;
	if (rd->hard_state_changed) {
		n->term = rd->hard_state.term;
		n->commit = rd->hard_state.commit;
	}
	if (rd->soft_state_changed)
		on_soft_state(n, rd->leader, rd->role);
	meta__learn_peers(n, rd->entries, rd->n_entries);
	/* Entries this ready replaces are not durable any more. */
	if (rd->n_entries && rd->entries[0].index <= n->durable_index)
		n->durable_index = rd->entries[0].index - 1;
	if (!rd->snapshot && !rd->n_entries && !rd->hard_state_changed) {
		n->early_applied = 0;
		n->early_ran = false;
		persist_done(n);
		return;
	}
	apply_early(n);
	if (n->fatal)
		return;
	if (rd->n_msgs && send_early(n, rd, old_term)) {
		meta__fatal(n, -ENOMEM, "cannot send a ready's messages");
		return;
	}
	struct persist_job *p = calloc(1, sizeof(*p));
	if (!p || (rd->n_entries > n->went_cap &&
		   !(n->went = realloc(n->went, rd->n_entries * sizeof(*n->went))))) {
		free(p);
		meta__fatal(n, -ENOMEM, "cannot persist a ready batch");
		return;
	}
	if (rd->n_entries > n->went_cap)
		n->went_cap = rd->n_entries;
	for (size_t i = 0; i < rd->n_entries; i++) {
		n->went[i].index = rd->entries[i].index;
		n->went[i].term = rd->entries[i].term;
		n->went[i].type = (uint32_t)rd->entries[i].type;
		n->went[i].data = rd->entries[i].data;
		n->went[i].len = rd->entries[i].len;
	}
	p->job.work = persist_work;
	p->job.done = persist_job_done;
	p->n = n;
	p->ents = n->went;
	p->n_ents = rd->n_entries;
	p->sync = rd->must_sync;
	if (rd->hard_state_changed) {
		p->has_hs = true;
		p->hs.term = rd->hard_state.term;
		p->hs.vote = rd->hard_state.vote;
		p->hs.commit = rd->hard_state.commit;
	}
	if (rd->snapshot) {
		struct meta__recv_snap *rs = n->recv_snap;
		if (!rs || rs->index != rd->snapshot->index ||
		    rs->term != rd->snapshot->term) {
			free(p);
			meta__fatal(
				n, MC_EINTERNAL,
				"the Raft core installs a snapshot the transport did not receive");
			return;
		}
		Mooncake__Raft__ConfState cs = MOONCAKE__RAFT__CONF_STATE__INIT;
		cs.voters = (uint64_t *)rd->snapshot->conf.voters;
		cs.n_voters = rd->snapshot->conf.n_voters;
		cs.learners = (uint64_t *)rd->snapshot->conf.learners;
		cs.n_learners = rd->snapshot->conf.n_learners;
		size_t cl = mooncake__raft__conf_state__get_packed_size(&cs);
		if (!(p->conf = malloc(cl ? cl : 1))) {
			free(p);
			meta__fatal(n, -ENOMEM, "cannot persist a snapshot");
			return;
		}
		mooncake__raft__conf_state__pack(&cs, p->conf);
		p->smeta = (struct snap_meta){rs->index, rs->term, p->conf, cl};
		p->snap_data = rs->data;
		p->snap_len = rs->len;
		p->install = true;
		p->sync = true;
		if (!(p->sm = malloc(sizeof(*p->sm))) || meta__sm_init(p->sm, &n->sm.mo)) {
			free(p->sm);
			free(p->conf);
			free(p);
			meta__fatal(n, -ENOMEM, "cannot persist a snapshot");
			return;
		}
		p->sm->member_id = n->sm.member_id;
		p->sm->cluster_id = n->sm.cluster_id;
	}
	n->persist_job = &p->job;
	n->disk_jobs++;
	meta__worker_submit(n->disk, &p->job);
}

static const char *alarm_name(int alarm)
{
	return alarm == ETCDSERVERPB__ALARM_TYPE__NOSPACE ? "NOSPACE" : "CORRUPT";
}

void meta__sm_effects_done(struct meta_node *n, const struct meta__sm_effects *fx)
{
	const struct meta__member *m = meta__member_find(&n->sm, fx->member_id);

	switch (fx->member_change) {
	case META_MEMBER_NONE:
		break;
	case META_MEMBER_ADDED:
		log_info("member %016" PRIx64 " (%s) added as a %s", fx->member_id,
			 m && *m->peer_url ? m->peer_url : "no peer URL",
			 m && m->learner ? "learner" : "voter");
		break;
	case META_MEMBER_PROMOTED:
		log_info("member %016" PRIx64 " promoted to voter", fx->member_id);
		break;
	case META_MEMBER_REMOVED:
		log_info("member %016" PRIx64 " removed", fx->member_id);
		if (fx->member_id == n->id) {
			log_error("this member (%016" PRIx64 ") was removed from the cluster",
				  n->id);
			meta__fatal(n, META_ESTOPPED, "removed from the cluster");
			return;
		}
		break;
	case META_MEMBER_PUBLISHED:
		log_info("member %016" PRIx64 " published name %s, client URL %s",
			 fx->member_id, m ? m->name : "?",
			 m && *m->client_url ? m->client_url : "(none)");
		break;
	case META_MEMBER_MOVED:
		log_info("member %016" PRIx64 " moved to peer URL %s", fx->member_id,
			 m ? m->peer_url : "?");
		break;
	}
	if (fx->member_change != META_MEMBER_NONE)
		meta__sync_members(n);
	if (fx->alarm_raised)
		log_warn("alarm %s raised for member %016" PRIx64,
			 alarm_name(fx->alarm_raised), fx->alarm_member);
	if (fx->alarms_cleared)
		log_info("%zu alarm%s cleared", fx->alarms_cleared,
			 fx->alarms_cleared == 1 ? "" : "s");
	if (fx->compacted_rev)
		log_info("compacted the store at revision %" PRId64, fx->compacted_rev);
}

static void apply_committed(struct meta_node *n, const struct raft_entry *e, size_t k)
{
	for (size_t i = 0; i < k && !n->fatal; i++) {
		struct meta__op *op = NULL;
		/* Proposals for this index: the one of the entry's term is
		 * answered by it; others (their entry was replaced) failed. */
		while (n->waiters.head && n->waiters.head->index <= e[i].index) {
			struct meta__op *w = n->waiters.head;
			if (w->index == e[i].index && w->term == e[i].term && !op) {
				meta__oplist_remove(w);
				op = w;
				continue;
			}
			metric_inc(n->m_failed);
			meta__op_fail(w, META_ELEADER_CHANGED);
		}
		struct meta__reply r = {0};
		struct meta__sm_effects fx;
		struct meta__sm_in in = meta__sm_in(n);
		uint64_t t0 = mc_now_ns();
		int rc = meta__sm_apply(&n->sm, &e[i], &in, op ? &r : NULL, &fx);
		uint64_t took_ms = (mc_now_ns() - t0) / 1000000u;
		if (took_ms >= APPLY_WARN_MS)
			log_warn("applying entry %" PRIu64 " (%zu bytes) took %" PRIu64
				 " ms (expected under %u ms): the member answered "
				 "nothing meanwhile, heartbeats included",
				 e[i].index, e[i].len, took_ms, APPLY_WARN_MS);
		if (rc) {
			meta__reply_free(&r);
			if (op)
				meta__op_fail(op, rc);
			meta__fatal(n, rc, "cannot apply a committed entry");
			return;
		}
		n->applied = e[i].index;
		n->applied_term = e[i].term;
		if (op && !meta__retry_lease_grant(n, op, r.code))
			meta__op_reply(op, &r);
		meta__reply_free(&r);
		meta__sm_effects_done(n, &fx);
	}
	metric_add(n->m_committed, k);
}

/* After entries were applied: watchers, parked requests, reads. */
static void after_apply(struct meta_node *n)
{
	meta__watch_pump(n);
	meta__rerun(n, &n->retry);
	meta__read_serve(n);
}

static void persist_done(struct meta_node *n)
{
	struct raft_ready *rd = &n->rd;
	int rc;

	if (n->fatal)
		return; /* the ready stays out: the node is frozen for good */
	if (rd->snapshot) {
		struct meta__recv_snap *rs = n->recv_snap;
		meta__snapshot_abandon(n); /* it encodes the state being replaced */
		struct meta__sm *old = n->installed_sm;
		struct meta__sm tmp = n->sm;
		n->sm = *old;
		*old = tmp;
		n->installed_sm = NULL;
		meta__sync_members(n);
		n->applied = rs->index;
		n->applied_term = rs->term;
		n->snap_index = rs->index;
		log_info("installed the leader's snapshot at index %" PRIu64 " (%zu bytes)",
			 rs->index, rs->len);
		free(rs->data);
		free(rs);
		n->recv_snap = NULL;
		metric_inc(n->m_snap_recv);
		rc = meta__watch_rebind(n);
		free_sm_later(n, old); /* nothing points into it any more */
		meta__tidy(n);         /* the snapshots it replaced */
		if (rc) {
			meta__fatal(n, rc, "cannot move the watchers to the new store");
			return;
		}
	}
	if (n->split_msgs)
		meta__peer_send(n, n->late, n->n_late);
	else
		meta__peer_send(n, rd->msgs, rd->n_msgs);
	n->split_msgs = false;
	size_t early = n->early_applied;
	apply_committed(n, rd->committed + early, rd->n_committed - early);
	if (n->fatal)
		return;
	if (!n->early_ran)
		for (size_t i = 0; i < rd->n_read_states; i++)
			meta__read_state(n, &rd->read_states[i]);
	rc = raft_advance(n->raft, rd);
	n->in_ready = false;
	n->early_applied = 0;
	n->early_ran = false;
	if (rc) {
		meta__fatal(n, rc, "the Raft core failed");
		return;
	}
	if (rd->n_committed > early || rd->snapshot)
		after_apply(n);
	else
		meta__read_serve(n);
	meta__compact_resume(n);
	meta__maybe_snapshot(n);
	meta__maybe_publish(n);
	meta__update_metrics(n);
	meta__kick(n);
	meta__check_stopped(n);
}

static void expire_leases(struct meta_node *n)
{
	int64_t ids[LEASE_REVOKES_PER_TICK];
	size_t k = lease_expired(mvcc_leases(n->sm.store), meta__now(n), 2 * n->o.election_ms,
				 ids, MC_ARRAY_LEN(ids));
	for (size_t i = 0; i < k; i++) {
		Etcdserverpb__LeaseRevokeRequest q = ETCDSERVERPB__LEASE_REVOKE_REQUEST__INIT;
		q.id = ids[i];
		log_debug("lease %016" PRIx64 " expired: revoking", (uint64_t)ids[i]);
		meta__propose_internal(n, META_M_LEASE_REVOKE, &q.base);
	}
}

void meta__on_tick(uv_timer_t *t)
{
	struct meta_node *n = MC_CONTAINER_OF(t, struct meta_node, tick_timer);
	uint64_t now = meta__now(n);

	if (!n->running || n->fatal)
		return;
	/*
	 * While a ready is out (its WAL write and fdatasync), the core's clock
	 * stops after one tick, as etcd's does (its raft loop reads a ticker
	 * that holds one tick only between saves). Ticks saved up through a
	 * stall of the disk would all be fed at once after it, with no message
	 * between them: a leader would count its followers silent and a
	 * follower its leader gone for time in which this member could hear
	 * neither, and on a disk the members share, all of them stall at once.
	 */
	if (!n->in_ready || n->pending_ticks == 0)
		n->pending_ticks++;
	meta__req_sweep(n);
	meta__read_tick(n);
	if (meta__is_leader(n) && !n->stopping)
		expire_leases(n);
	meta__compactor_tick(n);
	meta__maint_tick(n);
	/* Silence from every peer: are we still a member? */
	if (!meta__is_leader(n) && n->n_peers &&
	    now - n->last_heard_ms > 4 * n->o.election_ms &&
	    now - n->last_probe_ms > 4 * n->o.election_ms) {
		n->last_probe_ms = now;
		meta__peer_probe(n);
	}
	if (n->leader != RAFT_NONE && n->wait_leader.head && !n->stopping)
		meta__rerun(n, &n->wait_leader);
	meta__maybe_publish(n);
	meta__kick(n);
}

void meta__step(struct meta_node *n, const struct raft_msg *m)
{
	if (!n->running || n->fatal || n->finishing)
		return;
	if (!n->in_ready) {
		int rc = raft_step(n->raft, m);
		if (rc == -ENOMEM || rc == MC_EINTERNAL)
			meta__fatal(n, rc, "the Raft core failed");
		else if (rc)
			log_debug("dropped a %s from %016" PRIx64 ": %s",
				  raft_msg_type_name(m->type), m->from, mc_strerror(rc));
		meta__kick(n);
		return;
	}
	struct meta__qmsg *q = meta__msg_copy(m);
	if (!q)
		return; /* dropped: Raft tolerates lost messages */
	if (n->qtail)
		n->qtail->next = q;
	else
		n->qhead = q;
	n->qtail = q;
}

void meta__step_owned(struct meta_node *n, struct meta__qmsg *q)
{
	if (!n->running || n->fatal || n->finishing || !n->in_ready) {
		meta__step(n, &q->m);
		free(q);
		return;
	}
	q->next = NULL;
	if (n->qtail)
		n->qtail->next = q;
	else
		n->qhead = q;
	n->qtail = q;
}

static int grow(void **v, size_t *cap, size_t need, size_t size)
{
	if (need <= *cap)
		return 0;
	size_t c = *cap ? *cap * 2 : 8;
	void *p = realloc(*v, c * size);
	if (!p)
		return -ENOMEM;
	*v = p;
	*cap = c;
	return 0;
}

void meta__report_unreachable(struct meta_node *n, uint64_t id)
{
	if (!n->running || n->fatal)
		return;
	for (size_t i = 0; i < n->n_unreachable; i++)
		if (n->unreachable[i] == id)
			return;
	if (grow((void **)&n->unreachable, &n->cap_unreachable, n->n_unreachable + 1,
		 sizeof(uint64_t)))
		return;
	n->unreachable[n->n_unreachable++] = id;
	meta__kick(n);
}

void meta__report_snapshot(struct meta_node *n, uint64_t id, bool ok)
{
	if (!n->running || n->fatal)
		return;
	if (grow((void **)&n->snap_reports, &n->cap_snap_reports, n->n_snap_reports + 1,
		 sizeof(*n->snap_reports)))
		return;
	n->snap_reports[n->n_snap_reports].id = id;
	n->snap_reports[n->n_snap_reports].ok = ok;
	n->n_snap_reports++;
	meta__kick(n);
}
