/*
 * raft: the consensus state machine. Inputs come through raft_step,
 * raft_tick and the local requests; outputs pile up in r->msgs, r->rss and
 * the log until the driver takes them with raft_ready. See raft.h for the
 * contract; the behaviour follows etcd/raft (PreVote, CheckQuorum with a
 * leader lease, probe/replicate/snapshot flow control, fast backtracking,
 * ReadIndex, leader transfer) with Raft-thesis single-server membership
 * changes that take effect when appended.
 *
 * Internal functions return 0 or a negative code; a failure while state
 * is half-changed is made sticky by fail().
 *
 * Why this file is longer than the house's ~1,200 lines: it is one job,
 * the step function of one state machine. The roles' handlers (leader,
 * follower, candidate) call each other through become_*, the replication
 * and read paths, and share some forty static helpers over struct raft;
 * cutting it by role would turn those into raft__ functions and spread
 * every transition over several files (etcd keeps raft.go whole for the
 * same reason). What is separable already lives beside it: the log
 * (log.c), progress tracking (progress.c), configurations (conf.c) and
 * entry and message data (data.c).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "meta/raft/raft_int.h"

#define MAX_CTX_LEN 4096

/* ----------------------------------------------------------- utilities */

static void trace(struct raft *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void trace(struct raft *r, const char *fmt, ...)
{
	char buf[512];
	va_list ap;
	int n;

	if (!r->cfg.trace)
		return;
	n = snprintf(buf, sizeof(buf), "[term %" PRIu64 " %s] ", r->term,
		     raft_role_name(r->role));
	if (n < 0 || (size_t)n >= sizeof(buf))
		n = 0;
	va_start(ap, fmt);
	vsnprintf(buf + n, sizeof(buf) - (size_t)n, fmt, ap);
	va_end(ap);
	r->cfg.trace(r->cfg.trace_arg, r->id, buf);
}

/* splitmix64: a small, good, seedable generator. */
static uint64_t rng_next(struct raft *r)
{
	uint64_t z = (r->rng += 0x9E3779B97F4A7C15ull);

	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

static void reset_timeout(struct raft *r)
{
	unsigned et = r->cfg.election_ticks;

	r->rand_timeout = et + (unsigned)(rng_next(r) % et);
}

static uint64_t last_index(const struct raft *r)
{
	return raft__log_last_index(&r->log);
}

static uint64_t last_term(const struct raft *r)
{
	return raft__log_last_term(&r->log);
}

static uint64_t term_or_zero(const struct raft *r, uint64_t index)
{
	uint64_t t;

	return raft__log_term(&r->log, index, &t) == 0 ? t : 0;
}

static bool is_voter(const struct raft *r, uint64_t id)
{
	return raft__conf_is_voter(&r->conf, id);
}

static bool is_member(const struct raft *r, uint64_t id)
{
	return is_voter(r, id) || raft__conf_is_learner(&r->conf, id);
}

static size_t quorum(const struct raft *r)
{
	return r->conf.n_voters / 2 + 1;
}

static struct raft__progress *find_pr(struct raft *r, uint64_t id)
{
	for (size_t k = 0; k < r->n_prs; k++)
		if (r->prs[k].id == id)
			return &r->prs[k];
	return NULL;
}

static bool committed_in_term(const struct raft *r)
{
	return term_or_zero(r, r->commit) == r->term;
}

static bool is_fatal(int rv)
{
	return rv == -ENOMEM || rv == MC_EINTERNAL;
}

/* Make a fatal error sticky; pass any code through. */
static int fail(struct raft *r, int rv)
{
	if (rv < 0 && is_fatal(rv) && !r->fatal) {
		r->fatal = rv;
		trace(r, "fatal error %d (%s): node unusable", rv, mc_strerror(rv));
	}
	return rv;
}

/* Common preamble of every call that changes the node. */
static int guard(const struct raft *r)
{
	if (r->fatal)
		return r->fatal;
	if (r->ready_out)
		return -EINPROGRESS;
	return 0;
}

static int dup_bytes(const void *src, size_t len, void **out)
{
	*out = NULL;
	if (len == 0)
		return 0;
	*out = malloc(len);
	if (!*out)
		return -ENOMEM;
	memcpy(*out, src, len);
	return 0;
}

static void snap_sync_view(struct raft *r)
{
	r->snap_view.index = r->snap_index;
	r->snap_view.term = r->snap_term;
	r->snap_view.conf = raft__conf_view(&r->snap_conf);
}

/* ------------------------------------------------------------ messages */

static void msg_release(struct raft_msg *m)
{
	for (size_t k = 0; k < m->n_entries; k++)
		raft__data_unref(m->entries[k].data);
	free((void *)m->entries);
	free((void *)m->ctx);
	free((void *)m->snapshot.conf.voters);
	free((void *)m->snapshot.conf.learners);
	memset(m, 0, sizeof(*m));
}

static void msg_init(const struct raft *r, struct raft_msg *m, enum raft_msg_type type,
		     uint64_t to)
{
	memset(m, 0, sizeof(*m));
	m->type = type;
	m->from = r->id;
	m->to = to;
	m->term = r->term;
}

/* Queue m; takes ownership of its buffers whatever happens. */
static int queue_msg(struct raft *r, struct raft_msg *m)
{
	if (r->n_msgs == r->cap_msgs) {
		size_t cap = r->cap_msgs ? 2 * r->cap_msgs : 16;
		struct raft_msg *a = realloc(r->msgs, cap * sizeof(*a));

		if (!a) {
			msg_release(m);
			return -ENOMEM;
		}
		r->msgs = a;
		r->cap_msgs = cap;
	}
	r->msgs[r->n_msgs++] = *m;
	return 0;
}

/* Attach a copy of ctx to m (before send). */
static int msg_set_ctx(struct raft_msg *m, const void *ctx, size_t len)
{
	void *c;

	if (dup_bytes(ctx, len, &c))
		return -ENOMEM;
	m->ctx = c;
	m->ctx_len = len;
	return 0;
}

static void free_msgs(struct raft *r)
{
	for (size_t k = 0; k < r->n_msgs; k++)
		msg_release(&r->msgs[k]);
	r->n_msgs = 0;
}

static int push_read_state(struct raft *r, uint64_t index, const void *ctx, size_t len)
{
	void *c;

	if (r->n_rss == r->cap_rss) {
		size_t cap = r->cap_rss ? 2 * r->cap_rss : 8;
		struct raft_read_state *a = realloc(r->rss, cap * sizeof(*a));

		if (!a)
			return -ENOMEM;
		r->rss = a;
		r->cap_rss = cap;
	}
	if (dup_bytes(ctx, len, &c))
		return -ENOMEM;
	r->rss[r->n_rss].index = index;
	r->rss[r->n_rss].ctx = c;
	r->rss[r->n_rss].ctx_len = len;
	r->n_rss++;
	return 0;
}

static void free_rss(struct raft *r)
{
	for (size_t k = 0; k < r->n_rss; k++)
		free((void *)r->rss[k].ctx);
	r->n_rss = 0;
}

/* ---------------------------------------------------------- read queue */

static void read_req_free(struct raft__read_req *q)
{
	free(q->ctx);
	free(q->acks);
}

static void clear_reads(struct raft *r)
{
	for (size_t k = 0; k < r->n_reads; k++)
		read_req_free(&r->reads[k]);
	r->n_reads = 0;
	for (size_t k = 0; k < r->n_early_reads; k++)
		read_req_free(&r->early_reads[k]);
	r->n_early_reads = 0;
}

/* Append a request (ctx copied) to a queue. */
static int read_queue_add(struct raft__read_req **q, size_t *n, size_t *cap, uint64_t index,
			  uint64_t from, const void *ctx, size_t len)
{
	struct raft__read_req *req;

	if (*n == *cap) {
		size_t c = *cap ? 2 * *cap : 8;
		struct raft__read_req *a = realloc(*q, c * sizeof(*a));

		if (!a)
			return -ENOMEM;
		*q = a;
		*cap = c;
	}
	req = &(*q)[*n];
	memset(req, 0, sizeof(*req));
	if (dup_bytes(ctx, len, &req->ctx))
		return -ENOMEM;
	req->ctx_len = len;
	req->index = index;
	req->from = from;
	(*n)++;
	return 0;
}

static int read_req_ack(struct raft__read_req *q, uint64_t id)
{
	for (size_t k = 0; k < q->n_acks; k++)
		if (q->acks[k] == id)
			return 0;
	if (q->n_acks == q->cap_acks) {
		size_t c = q->cap_acks ? 2 * q->cap_acks : 8;
		uint64_t *a = realloc(q->acks, c * sizeof(*a));

		if (!a)
			return -ENOMEM;
		q->acks = a;
		q->cap_acks = c;
	}
	q->acks[q->n_acks++] = id;
	return 0;
}

/* ----------------------------------------------------------- progress */

static void clear_prs(struct raft *r)
{
	for (size_t k = 0; k < r->n_prs; k++)
		raft__progress_free(&r->prs[k]);
	free(r->prs);
	r->prs = NULL;
	r->n_prs = 0;
}

static int add_pr(struct raft *r, uint64_t id, bool learner, bool active)
{
	struct raft__progress *a, *p;
	int rv;

	a = realloc(r->prs, (r->n_prs + 1) * sizeof(*a));
	if (!a)
		return -ENOMEM;
	r->prs = a;
	p = &r->prs[r->n_prs];
	rv = raft__progress_init(p, id, learner, last_index(r) + 1, r->cfg.max_inflight_msgs);
	if (rv)
		return rv;
	p->recent_active = active;
	if (id == r->id) {
		p->match = last_index(r);
		raft__progress_become_replicate(p);
		p->recent_active = true;
	}
	r->n_prs++;
	return 0;
}

static void abort_transfer(struct raft *r, const char *why)
{
	if (r->lead_transferee == RAFT_NONE)
		return;
	trace(r, "leader transfer to %" PRIu64 " aborted: %s", r->lead_transferee, why);
	r->lead_transferee = RAFT_NONE;
}

/* Leader: make prs follow r->conf (new members probe from the end). */
static int sync_prs(struct raft *r)
{
	size_t k = 0;
	int rv;

	while (k < r->n_prs) {
		struct raft__progress *p = &r->prs[k];

		if (!is_member(r, p->id)) {
			raft__progress_free(p);
			r->prs[k] = r->prs[--r->n_prs];
			continue;
		}
		p->learner = !is_voter(r, p->id);
		k++;
	}
	for (size_t v = 0; v < r->conf.n_voters; v++)
		if (!find_pr(r, r->conf.voters[v]) &&
		    (rv = add_pr(r, r->conf.voters[v], false, true)))
			return rv;
	for (size_t l = 0; l < r->conf.n_learners; l++)
		if (!find_pr(r, r->conf.learners[l]) &&
		    (rv = add_pr(r, r->conf.learners[l], true, true)))
			return rv;
	if (r->lead_transferee != RAFT_NONE && !is_voter(r, r->lead_transferee))
		abort_transfer(r, "target is no longer a voter");
	return 0;
}

/* -------------------------------------------------------- configuration */

static const char *cc_name(enum raft_conf_change_type t)
{
	switch (t) {
	case RAFT_CC_ADD_VOTER:
		return "add voter";
	case RAFT_CC_ADD_LEARNER:
		return "add learner";
	case RAFT_CC_PROMOTE:
		return "promote";
	case RAFT_CC_REMOVE:
		return "remove";
	}
	return "?";
}

/* A conf change entry entered the log: it is in force from now on. */
static int apply_conf_entry(struct raft *r, const struct raft_entry *e, bool quiet)
{
	struct raft_conf_change cc;
	int rv;

	if (raft_conf_change_decode(e->data, e->len, &cc) != 0) {
		trace(r, "malformed conf change at %" PRIu64 " ignored", e->index);
		return 0;
	}
	rv = raft__conf_apply(&r->conf, &cc);
	if (rv)
		return rv;
	r->conf_index = e->index;
	if (!quiet)
		trace(r,
		      "conf change at %" PRIu64 ": %s %" PRIu64 " (%zu voters, %zu learners)",
		      e->index, cc_name(cc.type), cc.node_id, r->conf.n_voters,
		      r->conf.n_learners);
	if (r->role == RAFT_LEADER)
		return sync_prs(r);
	return 0;
}

/*
 * Configuration at index upto (the snapshot's plus the logged changes after
 * it) into out, and the index of the last change (0: the snapshot's).
 */
static int conf_at(const struct raft *r, struct raft__conf *out, uint64_t upto,
		   uint64_t *index_out)
{
	uint64_t idx = 0;
	int rv;

	raft__conf_init(out);
	rv = raft__conf_copy(out, &r->snap_conf);
	for (uint64_t i = r->snap_index + 1; rv == 0 && i <= upto; i++) {
		const struct raft_entry *e = raft__log_get(&r->log, i);
		struct raft_conf_change cc;

		if (!e || e->type != RAFT_ENTRY_CONF_CHANGE ||
		    raft_conf_change_decode(e->data, e->len, &cc) != 0)
			continue;
		rv = raft__conf_apply(out, &cc);
		idx = i;
	}
	if (rv) {
		raft__conf_free(out);
		return rv;
	}
	if (index_out)
		*index_out = idx;
	return 0;
}

/* After a truncation or at start: recompute the configuration in force. */
static int recompute_conf(struct raft *r, bool quiet)
{
	struct raft__conf c;
	uint64_t idx;
	int rv;

	if ((rv = conf_at(r, &c, last_index(r), &idx)))
		return rv;
	raft__conf_free(&r->conf);
	r->conf = c;
	r->conf_index = idx;
	if (!quiet)
		trace(r,
		      "configuration rolled back to index %" PRIu64
		      " (%zu voters, %zu learners)",
		      idx, r->conf.n_voters, r->conf.n_learners);
	if (r->role == RAFT_LEADER)
		return sync_prs(r);
	return 0;
}

/* ---------------------------------------------------------------- roles */

static void reset(struct raft *r, uint64_t term)
{
	if (r->term != term) {
		r->term = term;
		r->vote = RAFT_NONE;
	}
	r->leader = RAFT_NONE;
	r->election_elapsed = 0;
	r->heartbeat_elapsed = 0;
	reset_timeout(r);
	abort_transfer(r, "term or role changed");
	r->n_votes = 0;
	clear_reads(r);
	clear_prs(r);
}

static void become_follower(struct raft *r, uint64_t term, uint64_t leader)
{
	uint64_t old = r->term;
	enum raft_role old_role = r->role;

	reset(r, term);
	r->leader = leader;
	r->role = RAFT_FOLLOWER;
	if (old != term || old_role != RAFT_FOLLOWER)
		trace(r, "became follower (leader %" PRIu64 ")", leader);
}

static void become_pre_candidate(struct raft *r)
{
	r->role = RAFT_PRE_CANDIDATE;
	r->leader = RAFT_NONE;
	r->n_votes = 0;
	r->election_elapsed = 0;
	reset_timeout(r);
	clear_reads(r);
	clear_prs(r);
	trace(r, "became pre-candidate");
}

static void become_candidate(struct raft *r)
{
	reset(r, r->term + 1);
	r->vote = r->id;
	r->role = RAFT_CANDIDATE;
	trace(r, "became candidate");
}

static int append_local(struct raft *r, enum raft_entry_type type, const void *data,
			size_t len, uint64_t *index_out);
static int commit_or_bcast(struct raft *r);

static int become_leader(struct raft *r)
{
	int rv;

	reset(r, r->term);
	r->leader = r->id;
	r->role = RAFT_LEADER;
	for (size_t v = 0; v < r->conf.n_voters; v++)
		if ((rv = add_pr(r, r->conf.voters[v], false, false)))
			return rv;
	for (size_t l = 0; l < r->conf.n_learners; l++)
		if ((rv = add_pr(r, r->conf.learners[l], true, false)))
			return rv;
	trace(r, "became leader at last index %" PRIu64, last_index(r));
	/* An entry of its own term lets the leader learn the commit index
	 * (and serve reads); it must be appended before anything else. */
	rv = append_local(r, RAFT_ENTRY_NORMAL, NULL, 0, NULL);
	if (rv)
		return rv;
	return commit_or_bcast(r);
}

/* ----------------------------------------------------------- replication */

static int send_snapshot(struct raft *r, struct raft__progress *pr)
{
	struct raft_msg m;
	void *v = NULL, *l = NULL;

	if (!pr->recent_active) {
		trace(r, "not sending snapshot to %" PRIu64 ": not recently active", pr->id);
		return 0;
	}
	if (r->snap_index == 0)
		return MC_EINTERNAL; /* entries below the log but no snapshot */
	msg_init(r, &m, RAFT_MSG_SNAP, pr->id);
	if (dup_bytes(r->snap_conf.voters, r->snap_conf.n_voters * sizeof(uint64_t), &v) ||
	    dup_bytes(r->snap_conf.learners, r->snap_conf.n_learners * sizeof(uint64_t), &l)) {
		free(v);
		return -ENOMEM;
	}
	m.snapshot.index = r->snap_index;
	m.snapshot.term = r->snap_term;
	m.snapshot.conf.voters = v;
	m.snapshot.conf.n_voters = r->snap_conf.n_voters;
	m.snapshot.conf.learners = l;
	m.snapshot.conf.n_learners = r->snap_conf.n_learners;
	raft__progress_become_snapshot(pr, r->snap_index);
	trace(r, "sending snapshot at %" PRIu64 " to %" PRIu64, r->snap_index, pr->id);
	return queue_msg(r, &m);
}

/*
 * Send pr the next APP (or a SNAP if its next entry was compacted). Returns
 * 1 if a message went out, 0 if not (paused, nothing to send), or an error.
 */
static int send_append(struct raft *r, struct raft__progress *pr, bool send_if_empty)
{
	struct raft_msg m;
	struct raft_entry *ents = NULL;
	uint64_t prev, prev_term, from, last = last_index(r);
	size_t count = 0, bytes = 0;
	int rv;

	if (pr->id == r->id || raft__progress_is_paused(pr))
		return 0;
	prev = pr->next - 1;
	if (prev < r->log.prev_index || raft__log_term(&r->log, prev, &prev_term) != 0) {
		rv = send_snapshot(r, pr);
		return rv < 0 ? rv : (pr->state == RAFT_PROGRESS_SNAPSHOT);
	}
	from = pr->next;
	while (from + count <= last && count < r->cfg.max_msg_entries) {
		const struct raft_entry *e = raft__log_get(&r->log, from + count);

		if (count > 0 && bytes + e->len > r->cfg.max_msg_bytes)
			break;
		bytes += e->len;
		count++;
	}
	if (count == 0 && !send_if_empty)
		return 0;
	if (count) {
		ents = malloc(count * sizeof(*ents));
		if (!ents)
			return -ENOMEM;
		for (size_t k = 0; k < count; k++) {
			ents[k] = *raft__log_get(&r->log, from + k);
			raft__data_ref(ents[k].data);
		}
	}
	msg_init(r, &m, RAFT_MSG_APP, pr->id);
	m.index = prev;
	m.log_term = prev_term;
	m.commit = r->commit;
	m.entries = ents;
	m.n_entries = count;
	if (count) {
		uint64_t sent = from + count - 1;

		if (pr->state == RAFT_PROGRESS_REPLICATE) {
			pr->next = sent + 1;
			raft__inflights_add(&pr->inflights, sent);
		} else {
			pr->probe_sent = true;
		}
	}
	rv = queue_msg(r, &m);
	return rv < 0 ? rv : 1;
}

static int bcast_append(struct raft *r)
{
	for (size_t k = 0; k < r->n_prs; k++) {
		int rv = send_append(r, &r->prs[k], true);

		if (rv < 0)
			return rv;
	}
	return 0;
}

static int bcast_heartbeat(struct raft *r)
{
	const void *ctx = NULL;
	size_t len = 0;

	if (r->n_reads) {
		ctx = r->reads[r->n_reads - 1].ctx;
		len = r->reads[r->n_reads - 1].ctx_len;
	}
	for (size_t k = 0; k < r->n_prs; k++) {
		struct raft__progress *pr = &r->prs[k];
		struct raft_msg m;
		int rv;

		if (pr->id == r->id)
			continue;
		msg_init(r, &m, RAFT_MSG_HEARTBEAT, pr->id);
		m.commit = MC_MIN(pr->match, r->commit);
		if ((rv = msg_set_ctx(&m, ctx, len)) || (rv = queue_msg(r, &m)))
			return rv;
	}
	return 0;
}

static int send_timeout_now(struct raft *r, uint64_t to)
{
	struct raft_msg m;

	trace(r, "sending timeout-now to %" PRIu64, to);
	msg_init(r, &m, RAFT_MSG_TIMEOUT_NOW, to);
	return queue_msg(r, &m);
}

/* Leader: append one entry of its term (takes the data reference). */
static int append_local(struct raft *r, enum raft_entry_type type, const void *data,
			size_t len, uint64_t *index_out)
{
	struct raft_entry e;
	struct raft__progress *self;
	int rv;

	if (raft__log_reserve(&r->log, 1)) {
		raft__data_unref(data);
		return -ENOMEM;
	}
	e.term = r->term;
	e.index = last_index(r) + 1;
	e.type = type;
	e.data = data;
	e.len = len;
	raft__log_push(&r->log, &e);
	if (index_out)
		*index_out = e.index;
	if (type == RAFT_ENTRY_CONF_CHANGE && (rv = apply_conf_entry(r, &e, false)))
		return rv;
	self = find_pr(r, r->id);
	if (self) {
		self->match = e.index;
		self->next = e.index + 1;
	}
	return 0;
}

/* Leader: the highest index a quorum of voters holds. */
static bool maybe_commit(struct raft *r)
{
	uint64_t best = 0;
	size_t q = quorum(r);

	if (r->conf.n_voters == 0)
		return false;
	for (size_t a = 0; a < r->conf.n_voters; a++) {
		struct raft__progress *pa = find_pr(r, r->conf.voters[a]);
		uint64_t x = pa ? pa->match : 0;
		size_t n = 0;

		if (x <= best)
			continue;
		for (size_t b = 0; b < r->conf.n_voters; b++) {
			struct raft__progress *pb = find_pr(r, r->conf.voters[b]);

			if (pb && pb->match >= x)
				n++;
		}
		if (n >= q)
			best = x;
	}
	/* Only entries of the current term commit by counting (Figure 8). */
	if (best > r->commit && term_or_zero(r, best) == r->term) {
		r->commit = best;
		return true;
	}
	return false;
}

static int leader_read_index(struct raft *r, uint64_t from, const void *ctx, size_t len);

static int after_commit(struct raft *r)
{
	int rv = bcast_append(r);

	if (rv)
		return rv;
	if (r->n_early_reads && committed_in_term(r)) {
		struct raft__read_req *q = r->early_reads;
		size_t n = r->n_early_reads;

		r->early_reads = NULL;
		r->n_early_reads = 0;
		r->cap_early_reads = 0;
		for (size_t k = 0; k < n; k++) {
			if (rv == 0)
				rv = leader_read_index(r, q[k].from, q[k].ctx, q[k].ctx_len);
			read_req_free(&q[k]);
		}
		free(q);
		if (rv)
			return rv;
	}
	/* A leader that removed itself leaves once the removal is committed. */
	if (!is_voter(r, r->id) && r->commit >= r->conf_index) {
		trace(r, "stepping down: removed from the configuration at %" PRIu64,
		      r->conf_index);
		become_follower(r, r->term, RAFT_NONE);
	}
	return 0;
}

static int commit_or_bcast(struct raft *r)
{
	if (maybe_commit(r))
		return after_commit(r);
	return bcast_append(r);
}

/* Largest index <= index whose term is <= term (or unknown). */
static uint64_t find_conflict_by_term(const struct raft *r, uint64_t index, uint64_t term,
				      uint64_t *term_out)
{
	for (;;) {
		uint64_t t;

		if (raft__log_term(&r->log, index, &t) != 0) {
			*term_out = 0;
			return index;
		}
		if (t <= term) {
			*term_out = t;
			return index;
		}
		index--;
	}
}

/* --------------------------------------------------------------- reads */

static int respond_read(struct raft *r, uint64_t from, uint64_t index, const void *ctx,
			size_t len)
{
	struct raft_msg m;
	int rv;

	if (from == r->id)
		return push_read_state(r, index, ctx, len);
	msg_init(r, &m, RAFT_MSG_READ_INDEX_RESP, from);
	m.index = index;
	if ((rv = msg_set_ctx(&m, ctx, len)))
		return rv;
	return queue_msg(r, &m);
}

static int leader_read_index(struct raft *r, uint64_t from, const void *ctx, size_t len)
{
	struct raft__read_req *q;
	int rv;

	if (r->conf.n_voters == 1 && r->conf.voters[0] == r->id)
		return respond_read(r, from, r->commit, ctx, len);
	if (!committed_in_term(r))
		return read_queue_add(&r->early_reads, &r->n_early_reads, &r->cap_early_reads,
				      0, from, ctx, len);
	for (size_t k = 0; k < r->n_reads; k++)
		if (r->reads[k].ctx_len == len && memcmp(r->reads[k].ctx, ctx, len) == 0)
			return 0; /* already waiting */
	rv = read_queue_add(&r->reads, &r->n_reads, &r->cap_reads, r->commit, from, ctx, len);
	if (rv)
		return rv;
	q = &r->reads[r->n_reads - 1];
	if (is_voter(r, r->id) && (rv = read_req_ack(q, r->id)))
		return rv;
	return bcast_heartbeat(r);
}

static int read_ack(struct raft *r, uint64_t from, const void *ctx, size_t len)
{
	size_t k, votes = 0;
	int rv;

	for (k = 0; k < r->n_reads; k++)
		if (r->reads[k].ctx_len == len && memcmp(r->reads[k].ctx, ctx, len) == 0)
			break;
	if (k == r->n_reads)
		return 0;
	if ((rv = read_req_ack(&r->reads[k], from)))
		return rv;
	for (size_t a = 0; a < r->reads[k].n_acks; a++)
		if (is_voter(r, r->reads[k].acks[a]))
			votes++;
	if (votes < quorum(r))
		return 0;
	/* Leadership confirmed after every request up to k was registered. */
	for (size_t j = 0; j <= k; j++) {
		struct raft__read_req *q = &r->reads[j];

		if (rv == 0)
			rv = respond_read(r, q->from, q->index, q->ctx, q->ctx_len);
		read_req_free(q);
	}
	memmove(r->reads, r->reads + k + 1, (r->n_reads - k - 1) * sizeof(*r->reads));
	r->n_reads -= k + 1;
	return rv;
}

/* ------------------------------------------------------- leader inputs */

static int handle_append_resp(struct raft *r, const struct raft_msg *m,
			      struct raft__progress *pr)
{
	uint64_t id = pr->id;
	bool old_paused;
	int rv;

	pr->recent_active = true;
	if (m->reject) {
		uint64_t hint = m->reject_hint, t;

		if (m->log_term > 0)
			hint = find_conflict_by_term(r, m->reject_hint, m->log_term, &t);
		if (raft__progress_maybe_decr_to(pr, m->index, hint)) {
			if (pr->state == RAFT_PROGRESS_REPLICATE)
				raft__progress_become_probe(pr);
			rv = send_append(r, pr, true);
			return rv < 0 ? rv : 0;
		}
		return 0;
	}
	old_paused = raft__progress_is_paused(pr);
	if (!raft__progress_maybe_update(pr, m->index))
		return 0;
	switch (pr->state) {
	case RAFT_PROGRESS_PROBE:
		raft__progress_become_replicate(pr);
		break;
	case RAFT_PROGRESS_SNAPSHOT:
		if (pr->match + 1 >= r->log.prev_index + 1) {
			raft__progress_become_probe(pr);
			raft__progress_become_replicate(pr);
		}
		break;
	case RAFT_PROGRESS_REPLICATE:
		raft__inflights_free_le(&pr->inflights, m->index);
		break;
	}
	if (maybe_commit(r)) {
		if ((rv = after_commit(r)))
			return rv;
		if (r->role != RAFT_LEADER)
			return 0;
		pr = find_pr(r, id);
		if (!pr)
			return 0;
	} else if (old_paused) {
		if ((rv = send_append(r, pr, true)) < 0)
			return rv;
	}
	while ((rv = send_append(r, pr, false)) == 1)
		;
	if (rv < 0)
		return rv;
	if (id == r->lead_transferee && pr->match == last_index(r))
		return send_timeout_now(r, id);
	return 0;
}

static int handle_heartbeat_resp(struct raft *r, const struct raft_msg *m,
				 struct raft__progress *pr)
{
	int rv;

	pr->recent_active = true;
	pr->probe_sent = false;
	if (pr->state == RAFT_PROGRESS_REPLICATE && raft__inflights_full(&pr->inflights))
		raft__inflights_free_first(&pr->inflights);
	if (pr->match < last_index(r) && (rv = send_append(r, pr, true)) < 0)
		return rv;
	if (m->ctx_len == 0)
		return 0;
	return read_ack(r, m->from, m->ctx, m->ctx_len);
}

static int step_leader(struct raft *r, const struct raft_msg *m)
{
	struct raft__progress *pr = find_pr(r, m->from);

	if (!pr)
		return 0; /* not a member (any more) */
	switch (m->type) {
	case RAFT_MSG_APP_RESP:
		return handle_append_resp(r, m, pr);
	case RAFT_MSG_HEARTBEAT_RESP:
		return handle_heartbeat_resp(r, m, pr);
	case RAFT_MSG_READ_INDEX:
		return leader_read_index(r, m->from, m->ctx, m->ctx_len);
	default:
		return 0;
	}
}

/* ----------------------------------------------------- follower inputs */

static int send_append_resp(struct raft *r, uint64_t to, uint64_t index)
{
	struct raft_msg m;

	msg_init(r, &m, RAFT_MSG_APP_RESP, to);
	m.index = index;
	return queue_msg(r, &m);
}

static void commit_to(struct raft *r, uint64_t c)
{
	if (c <= r->commit)
		return;
	if (c > last_index(r)) {
		trace(r, "commit %" PRIu64 " beyond last index %" PRIu64, c, last_index(r));
		c = last_index(r);
		if (c <= r->commit)
			return;
	}
	r->commit = c;
}

static int handle_append(struct raft *r, const struct raft_msg *m)
{
	uint64_t lastnewi = m->index + m->n_entries;
	size_t k;
	int rv;

	if (m->index < r->commit)
		return send_append_resp(r, m->from, r->commit);
	if (!raft__log_match(&r->log, m->index, m->log_term)) {
		struct raft_msg resp;
		uint64_t t, hint = MC_MIN(m->index, last_index(r));

		hint = find_conflict_by_term(r, hint, m->log_term, &t);
		msg_init(r, &resp, RAFT_MSG_APP_RESP, m->from);
		resp.index = m->index;
		resp.reject = true;
		resp.reject_hint = hint;
		resp.log_term = t;
		return queue_msg(r, &resp);
	}
	for (k = 0; k < m->n_entries; k++)
		if (!raft__log_match(&r->log, m->entries[k].index, m->entries[k].term))
			break;
	if (k < m->n_entries) {
		uint64_t ci = m->entries[k].index;

		if (ci <= r->commit) {
			trace(r, "entry %" PRIu64 " conflicts with committed %" PRIu64, ci,
			      r->commit);
			return MC_EINTERNAL;
		}
		if (ci <= last_index(r)) {
			bool conf_gone = r->conf_index >= ci;

			trace(r, "truncating log from %" PRIu64 " (last %" PRIu64 ")", ci,
			      last_index(r));
			raft__log_truncate(&r->log, ci);
			r->stable = MC_MIN(r->stable, ci - 1);
			if (conf_gone && (rv = recompute_conf(r, false)))
				return rv;
		}
		if (raft__log_reserve(&r->log, m->n_entries - k))
			return -ENOMEM;
		for (; k < m->n_entries; k++) {
			struct raft_entry e = m->entries[k];

			if (raft__data_new(m->entries[k].data, m->entries[k].len, &e.data))
				return -ENOMEM;
			if (e.type != RAFT_ENTRY_CONF_CHANGE)
				e.type = RAFT_ENTRY_NORMAL;
			raft__log_push(&r->log, &e);
			if (e.type == RAFT_ENTRY_CONF_CHANGE &&
			    (rv = apply_conf_entry(r, &e, false)))
				return rv;
		}
	}
	commit_to(r, MC_MIN(m->commit, lastnewi));
	return send_append_resp(r, m->from, lastnewi);
}

static int handle_heartbeat(struct raft *r, const struct raft_msg *m)
{
	struct raft_msg resp;
	int rv;

	commit_to(r, m->commit);
	msg_init(r, &resp, RAFT_MSG_HEARTBEAT_RESP, m->from);
	if ((rv = msg_set_ctx(&resp, m->ctx, m->ctx_len)))
		return rv;
	return queue_msg(r, &resp);
}

static int handle_snapshot(struct raft *r, const struct raft_msg *m)
{
	const struct raft_snapshot_meta *s = &m->snapshot;
	struct raft__conf c;
	int rv;

	if (s->index <= r->commit) {
		trace(r, "ignoring snapshot at %" PRIu64 " (commit %" PRIu64 ")", s->index,
		      r->commit);
		return send_append_resp(r, m->from, r->commit);
	}
	if (raft__log_match(&r->log, s->index, s->term)) {
		trace(r, "fast-forwarding commit to snapshot %" PRIu64, s->index);
		commit_to(r, s->index);
		return send_append_resp(r, m->from, r->commit);
	}
	raft__conf_init(&c);
	if ((rv = raft__conf_from_state(&c, &s->conf)))
		return rv;
	raft__conf_free(&r->snap_conf);
	r->snap_conf = c;
	r->snap_index = s->index;
	r->snap_term = s->term;
	snap_sync_view(r);
	raft__log_reset(&r->log, s->index, s->term);
	r->commit = s->index;
	r->stable = s->index;
	r->snap_pending = true;
	raft__conf_free(&r->conf);
	if ((rv = raft__conf_copy(&r->conf, &r->snap_conf)))
		return rv;
	r->conf_index = 0;
	trace(r,
	      "restored snapshot at %" PRIu64 " term %" PRIu64 " (%zu voters, %zu learners)",
	      s->index, s->term, r->conf.n_voters, r->conf.n_learners);
	return send_append_resp(r, m->from, last_index(r));
}

static int hup(struct raft *r, bool transfer);

static int step_follower(struct raft *r, const struct raft_msg *m)
{
	switch (m->type) {
	case RAFT_MSG_APP:
		r->election_elapsed = 0;
		r->leader = m->from;
		return handle_append(r, m);
	case RAFT_MSG_HEARTBEAT:
		r->election_elapsed = 0;
		r->leader = m->from;
		return handle_heartbeat(r, m);
	case RAFT_MSG_SNAP:
		r->election_elapsed = 0;
		r->leader = m->from;
		return handle_snapshot(r, m);
	case RAFT_MSG_TIMEOUT_NOW:
		if (!is_voter(r, r->id)) {
			trace(r, "ignoring timeout-now: not a voter");
			return 0;
		}
		trace(r, "timeout-now from %" PRIu64 ": campaigning", m->from);
		return hup(r, true);
	case RAFT_MSG_READ_INDEX_RESP:
		return push_read_state(r, m->index, m->ctx, m->ctx_len);
	default:
		return 0;
	}
}

/* ------------------------------------------------------------ elections */

enum { POLL_PENDING, POLL_WON, POLL_LOST };

static int poll_votes(struct raft *r, uint64_t id, bool granted, int *result)
{
	size_t yes = 0, no = 0, k;

	for (k = 0; k < r->n_votes; k++)
		if (r->votes[k].id == id)
			break;
	if (k == r->n_votes) {
		if (r->n_votes == r->cap_votes) {
			size_t cap = r->cap_votes ? 2 * r->cap_votes : 8;
			struct raft__vote *a = realloc(r->votes, cap * sizeof(*a));

			if (!a)
				return -ENOMEM;
			r->votes = a;
			r->cap_votes = cap;
		}
		r->votes[r->n_votes].id = id;
		r->votes[r->n_votes].granted = granted;
		r->n_votes++;
	}
	for (k = 0; k < r->n_votes; k++) {
		if (!is_voter(r, r->votes[k].id))
			continue;
		if (r->votes[k].granted)
			yes++;
		else
			no++;
	}
	if (yes >= quorum(r))
		*result = POLL_WON;
	else if (no > r->conf.n_voters - quorum(r))
		*result = POLL_LOST;
	else
		*result = POLL_PENDING;
	return 0;
}

static int campaign(struct raft *r, bool pre, bool transfer)
{
	enum raft_msg_type type = pre ? RAFT_MSG_PREVOTE : RAFT_MSG_VOTE;
	uint64_t vterm;
	int rv, res;

	if (pre) {
		become_pre_candidate(r);
		vterm = r->term + 1;
	} else {
		become_candidate(r);
		vterm = r->term;
	}
	if ((rv = poll_votes(r, r->id, true, &res)))
		return rv;
	if (res == POLL_WON)
		return pre ? campaign(r, false, transfer) : become_leader(r);
	for (size_t v = 0; v < r->conf.n_voters; v++) {
		struct raft_msg m;

		if (r->conf.voters[v] == r->id)
			continue;
		msg_init(r, &m, type, r->conf.voters[v]);
		m.term = vterm;
		m.index = last_index(r);
		m.log_term = last_term(r);
		m.transfer = transfer;
		if ((rv = queue_msg(r, &m)))
			return rv;
	}
	return 0;
}

static int hup(struct raft *r, bool transfer)
{
	if (r->role == RAFT_LEADER)
		return 0;
	if (!is_voter(r, r->id))
		return 0;
	trace(r, "starting %s election",
	      transfer          ? "a transfer"
	      : r->cfg.pre_vote ? "a pre-vote"
				: "an");
	return campaign(r, r->cfg.pre_vote && !transfer, transfer);
}

static int step_candidate(struct raft *r, const struct raft_msg *m)
{
	enum raft_msg_type mine = r->role == RAFT_PRE_CANDIDATE ? RAFT_MSG_PREVOTE_RESP
								: RAFT_MSG_VOTE_RESP;
	int rv, res;

	switch (m->type) {
	case RAFT_MSG_APP:
	case RAFT_MSG_HEARTBEAT:
	case RAFT_MSG_SNAP:
		become_follower(r, m->term, m->from);
		return step_follower(r, m);
	default:
		break;
	}
	if (m->type != mine)
		return 0;
	/* A pre-vote grant is for our next term exactly; others are stale. */
	if (mine == RAFT_MSG_PREVOTE_RESP && !m->reject && m->term != r->term + 1)
		return 0;
	if ((rv = poll_votes(r, m->from, !m->reject, &res)))
		return rv;
	if (res == POLL_WON) {
		if (r->role == RAFT_PRE_CANDIDATE)
			return campaign(r, false, false);
		return become_leader(r);
	}
	if (res == POLL_LOST)
		become_follower(r, r->term, RAFT_NONE);
	return 0;
}

static bool up_to_date(const struct raft *r, uint64_t lterm, uint64_t lindex)
{
	return lterm > last_term(r) || (lterm == last_term(r) && lindex >= last_index(r));
}

static int handle_vote(struct raft *r, const struct raft_msg *m)
{
	bool pre = m->type == RAFT_MSG_PREVOTE;
	bool can = r->vote == m->from || (r->vote == RAFT_NONE && r->leader == RAFT_NONE) ||
		   (pre && m->term > r->term);
	struct raft_msg resp;

	msg_init(r, &resp, pre ? RAFT_MSG_PREVOTE_RESP : RAFT_MSG_VOTE_RESP, m->from);
	if (can && up_to_date(r, m->log_term, m->index)) {
		resp.term = m->term;
		if (!pre) {
			r->election_elapsed = 0;
			r->vote = m->from;
		}
		trace(r, "granted %s to %" PRIu64 " for term %" PRIu64,
		      pre ? "pre-vote" : "vote", m->from, m->term);
	} else {
		resp.reject = true;
		trace(r, "rejected %s from %" PRIu64 " for term %" PRIu64,
		      pre ? "pre-vote" : "vote", m->from, m->term);
	}
	return queue_msg(r, &resp);
}

static int step(struct raft *r, const struct raft_msg *m)
{
	if (m->term > r->term) {
		if (m->type == RAFT_MSG_VOTE || m->type == RAFT_MSG_PREVOTE) {
			bool lease = r->cfg.check_quorum && r->leader != RAFT_NONE &&
				     r->election_elapsed < r->cfg.election_ticks;

			if (lease && !m->transfer) {
				trace(r,
				      "ignoring %s from %" PRIu64 " for term %" PRIu64
				      ": leader %" PRIu64 " is live",
				      raft_msg_type_name(m->type), m->from, m->term,
				      r->leader);
				return 0;
			}
		}
		if (m->type == RAFT_MSG_PREVOTE ||
		    (m->type == RAFT_MSG_PREVOTE_RESP && !m->reject)) {
			/* A pre-vote never moves terms. */
		} else if (m->type == RAFT_MSG_READ_INDEX) {
			return 0;
		} else {
			bool from_leader = m->type == RAFT_MSG_APP ||
					   m->type == RAFT_MSG_HEARTBEAT ||
					   m->type == RAFT_MSG_SNAP;

			trace(r, "%s from %" PRIu64 " has higher term %" PRIu64,
			      raft_msg_type_name(m->type), m->from, m->term);
			become_follower(r, m->term, from_leader ? m->from : RAFT_NONE);
		}
	} else if (m->term < r->term) {
		if ((r->cfg.check_quorum || r->cfg.pre_vote) &&
		    (m->type == RAFT_MSG_APP || m->type == RAFT_MSG_HEARTBEAT)) {
			/* Tell a stale leader about our term so it steps down (with
			 * check quorum our votes cannot do it). */
			return send_append_resp(r, m->from, 0);
		}
		if (m->type == RAFT_MSG_PREVOTE) {
			struct raft_msg resp;

			msg_init(r, &resp, RAFT_MSG_PREVOTE_RESP, m->from);
			resp.reject = true;
			return queue_msg(r, &resp);
		}
		return 0;
	}

	if (m->type == RAFT_MSG_VOTE || m->type == RAFT_MSG_PREVOTE)
		return handle_vote(r, m);
	switch (r->role) {
	case RAFT_LEADER:
		return step_leader(r, m);
	case RAFT_CANDIDATE:
	case RAFT_PRE_CANDIDATE:
		return step_candidate(r, m);
	case RAFT_FOLLOWER:
		return step_follower(r, m);
	}
	return 0;
}

/* ------------------------------------------------------------- public */

void raft_config_init(struct raft_config *c, uint64_t id)
{
	memset(c, 0, sizeof(*c));
	c->id = id;
	c->election_ticks = 10;
	c->heartbeat_ticks = 1;
	c->seed = id;
	c->pre_vote = true;
	c->check_quorum = true;
	c->max_msg_entries = 64;
	c->max_msg_bytes = 1 << 20;
	c->max_inflight_msgs = 256;
	c->trailing_entries = 1024;
}

static int check_config(const struct raft_config *c)
{
	if (c->id == RAFT_NONE || c->election_ticks < 2 || c->heartbeat_ticks < 1 ||
	    c->heartbeat_ticks >= c->election_ticks || c->max_msg_entries < 1 ||
	    c->max_inflight_msgs < 1)
		return -EINVAL;
	return 0;
}

static int check_restore(const struct raft_restore *rs, size_t *skip)
{
	const struct raft_snapshot_meta *s = &rs->snapshot;
	uint64_t prev = s->index, prev_term = s->term, last;
	size_t k = 0;

	if (s->index == 0 && s->term != 0)
		return -EINVAL;
	for (; k < rs->n_entries && rs->entries[k].index <= s->index; k++)
		if (rs->entries[k].index == s->index && rs->entries[k].term != s->term)
			return -EINVAL;
	*skip = k;
	for (; k < rs->n_entries; k++) {
		const struct raft_entry *e = &rs->entries[k];

		if (e->index != prev + 1 || e->term == 0 || e->term < prev_term ||
		    (e->len && !e->data))
			return -EINVAL;
		prev = e->index;
		prev_term = e->term;
	}
	last = prev;
	if (rs->hard_state.commit > last ||
	    (rs->applied && (rs->applied < s->index ||
			     rs->applied > MC_MAX(rs->hard_state.commit, s->index))))
		return -EINVAL;
	return 0;
}

int raft_new(const struct raft_config *c, const struct raft_restore *rs, struct raft **out)
{
	struct raft *r;
	size_t skip = 0;
	int rv;

	*out = NULL;
	if (check_config(c))
		return -EINVAL;
	if (rs && (rv = check_restore(rs, &skip)))
		return rv;
	r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->cfg = *c;
	r->id = c->id;
	r->rng = c->seed ^ (c->id * 0xD6E8FEB86659FD93ull);
	raft__log_init(&r->log);
	raft__conf_init(&r->conf);
	raft__conf_init(&r->snap_conf);
	r->role = RAFT_FOLLOWER;
	if (rs) {
		const struct raft_snapshot_meta *s = &rs->snapshot;

		r->term = rs->hard_state.term;
		r->vote = rs->hard_state.vote;
		r->snap_index = s->index;
		r->snap_term = s->term;
		if ((rv = raft__conf_from_state(&r->snap_conf, &s->conf)))
			goto err_free;
		raft__log_reset(&r->log, s->index, s->term);
		if ((rv = raft__log_reserve(&r->log, rs->n_entries - skip)))
			goto err_free;
		for (size_t k = skip; k < rs->n_entries; k++) {
			struct raft_entry e = rs->entries[k];

			if ((rv = raft__data_new(rs->entries[k].data, rs->entries[k].len,
						 &e.data)))
				goto err_free;
			if (e.type != RAFT_ENTRY_CONF_CHANGE)
				e.type = RAFT_ENTRY_NORMAL;
			raft__log_push(&r->log, &e);
		}
		/* A torn WAL tail may keep entries (or a snapshot) written with
		 * a newer term than the hard state that followed them: that vote
		 * was never sent, so adopt the term with no vote. */
		if (last_term(r) > r->term) {
			r->term = last_term(r);
			r->vote = RAFT_NONE;
		}
		r->commit = MC_MAX(rs->hard_state.commit, s->index);
		r->applied = rs->applied ? rs->applied : s->index;
		r->stable = last_index(r);
		r->prev_hs = rs->hard_state;
		if ((rv = recompute_conf(r, true)))
			goto err_free;
	}
	snap_sync_view(r);
	reset_timeout(r);
	trace(r, "started: last index %" PRIu64 ", commit %" PRIu64 ", %zu voters",
	      last_index(r), r->commit, r->conf.n_voters);
	*out = r;
	return 0;

err_free:
	raft_free(r);
	return rv;
}

void raft_free(struct raft *r)
{
	if (!r)
		return;
	free_msgs(r);
	free(r->msgs);
	free_rss(r);
	free(r->rss);
	clear_reads(r);
	free(r->reads);
	free(r->early_reads);
	clear_prs(r);
	free(r->votes);
	raft__conf_free(&r->conf);
	raft__conf_free(&r->snap_conf);
	raft__log_free(&r->log);
	free(r);
}

int raft_bootstrap(struct raft *r, const uint64_t *voters, size_t n)
{
	struct raft_conf_change ccs[64];
	int rv;

	if ((rv = guard(r)))
		return rv;
	if (n == 0 || n > MC_ARRAY_LEN(ccs) || !voters)
		return -EINVAL;
	for (size_t a = 0; a < n; a++)
		ccs[a] = (struct raft_conf_change){.type = RAFT_CC_ADD_VOTER,
						   .node_id = voters[a]};
	return raft_bootstrap_members(r, ccs, n);
}

int raft_bootstrap_members(struct raft *r, const struct raft_conf_change *ccs, size_t n)
{
	int rv;

	if ((rv = guard(r)))
		return rv;
	if (n == 0 || !ccs)
		return -EINVAL;
	for (size_t a = 0; a < n; a++) {
		if (ccs[a].type != RAFT_CC_ADD_VOTER || ccs[a].node_id == RAFT_NONE ||
		    (ccs[a].context_len && !ccs[a].context))
			return -EINVAL;
		for (size_t b = 0; b < a; b++)
			if (ccs[a].node_id == ccs[b].node_id)
				return -EINVAL;
	}
	if (last_index(r) != 0 || r->term != 0 || r->conf.n_voters || r->conf.n_learners)
		return -EEXIST;
	if (raft__log_reserve(&r->log, n))
		return fail(r, -ENOMEM);
	r->term = 1;
	for (size_t a = 0; a < n; a++) {
		struct raft_entry e = {
			.term = 1, .index = a + 1, .type = RAFT_ENTRY_CONF_CHANGE};
		size_t len = raft_conf_change_size(&ccs[a]);
		unsigned char small[64];
		unsigned char *buf = len <= sizeof(small) ? small : malloc(len);

		if (!buf)
			return fail(r, -ENOMEM);
		e.len = raft_conf_change_encode(&ccs[a], buf);
		rv = raft__data_new(buf, e.len, &e.data);
		if (buf != small)
			free(buf);
		if (rv)
			return fail(r, -ENOMEM);
		raft__log_push(&r->log, &e);
		if ((rv = apply_conf_entry(r, &e, true)))
			return fail(r, rv);
	}
	r->commit = n;
	trace(r, "bootstrapped with %zu voters", n);
	return 0;
}

static void tick_election(struct raft *r)
{
	r->election_elapsed++;
}

static int tick_leader(struct raft *r)
{
	int rv;

	r->heartbeat_elapsed++;
	r->election_elapsed++;
	if (r->election_elapsed >= r->cfg.election_ticks) {
		r->election_elapsed = 0;
		if (r->cfg.check_quorum) {
			size_t active = 0;

			for (size_t k = 0; k < r->n_prs; k++) {
				struct raft__progress *p = &r->prs[k];

				if (p->id == r->id)
					p->recent_active = true;
				if (!p->learner && p->recent_active)
					active++;
			}
			if (active < quorum(r)) {
				trace(r, "stepping down: only %zu of %zu voters active",
				      active, r->conf.n_voters);
				become_follower(r, r->term, RAFT_NONE);
				return 0;
			}
			for (size_t k = 0; k < r->n_prs; k++)
				if (r->prs[k].id != r->id)
					r->prs[k].recent_active = false;
		}
		abort_transfer(r, "timed out");
	}
	if (r->heartbeat_elapsed >= r->cfg.heartbeat_ticks) {
		r->heartbeat_elapsed = 0;
		if ((rv = bcast_heartbeat(r)))
			return rv;
	}
	return 0;
}

int raft_tick(struct raft *r)
{
	int rv;

	if ((rv = guard(r)))
		return rv;
	if (r->role == RAFT_LEADER)
		return fail(r, tick_leader(r));
	tick_election(r);
	if (is_voter(r, r->id) && r->election_elapsed >= r->rand_timeout) {
		r->election_elapsed = 0;
		return fail(r, hup(r, false));
	}
	return 0;
}

int raft_step(struct raft *r, const struct raft_msg *m)
{
	int rv;

	if ((rv = guard(r)))
		return rv;
	if (m->to != r->id || m->from == RAFT_NONE || m->from == r->id ||
	    m->type < RAFT_MSG_APP || m->type > RAFT_MSG_READ_INDEX_RESP ||
	    (m->n_entries && !m->entries) || (m->ctx_len && !m->ctx) ||
	    m->ctx_len > MAX_CTX_LEN)
		return -EINVAL;
	if (m->type == RAFT_MSG_APP) {
		for (size_t k = 0; k < m->n_entries; k++)
			if (m->entries[k].index != m->index + 1 + k ||
			    (m->entries[k].len && !m->entries[k].data))
				return -EINVAL;
	} else if (m->n_entries) {
		return -EINVAL;
	}
	if (m->type == RAFT_MSG_SNAP &&
	    (m->snapshot.index == 0 ||
	     (m->snapshot.conf.n_voters && !m->snapshot.conf.voters) ||
	     (m->snapshot.conf.n_learners && !m->snapshot.conf.learners)))
		return -EINVAL;
	return fail(r, step(r, m));
}

int raft_propose(struct raft *r, const void *data, size_t len, uint64_t *index_out)
{
	const void *d;
	int rv;

	if ((rv = guard(r)))
		return rv;
	if (r->role != RAFT_LEADER || !find_pr(r, r->id))
		return MC_ENOT_LEADER;
	if (r->lead_transferee != RAFT_NONE)
		return -EBUSY;
	if (len && !data)
		return -EINVAL;
	if (raft__data_new(data, len, &d))
		return -ENOMEM;
	if ((rv = append_local(r, RAFT_ENTRY_NORMAL, d, len, index_out)))
		return fail(r, rv);
	return fail(r, commit_or_bcast(r));
}

int raft_propose_conf_change(struct raft *r, const struct raft_conf_change *cc,
			     uint64_t *index_out)
{
	unsigned char *buf;
	const void *d;
	size_t len;
	int rv;

	if ((rv = guard(r)))
		return rv;
	if (r->role != RAFT_LEADER || !find_pr(r, r->id))
		return MC_ENOT_LEADER;
	if (r->lead_transferee != RAFT_NONE)
		return -EBUSY;
	if (cc->type < RAFT_CC_ADD_VOTER || cc->type > RAFT_CC_REMOVE ||
	    (cc->context_len && !cc->context))
		return -EINVAL;
	if (r->conf_index > r->commit || !committed_in_term(r))
		return -EAGAIN;
	if ((rv = raft__conf_check(&r->conf, cc)))
		return rv;
	len = raft_conf_change_size(cc);
	buf = malloc(len);
	if (!buf)
		return -ENOMEM;
	raft_conf_change_encode(cc, buf);
	rv = raft__data_new(buf, len, &d);
	free(buf);
	if (rv)
		return rv;
	if ((rv = append_local(r, RAFT_ENTRY_CONF_CHANGE, d, len, index_out)))
		return fail(r, rv);
	return fail(r, commit_or_bcast(r));
}

int raft_read_index(struct raft *r, const void *ctx, size_t len)
{
	struct raft_msg m;
	int rv;

	if ((rv = guard(r)))
		return rv;
	if (len == 0 || len > MAX_CTX_LEN || !ctx)
		return -EINVAL;
	if (r->role == RAFT_LEADER)
		return fail(r, leader_read_index(r, r->id, ctx, len));
	if (r->leader == RAFT_NONE)
		return MC_ENOT_LEADER;
	msg_init(r, &m, RAFT_MSG_READ_INDEX, r->leader);
	if ((rv = msg_set_ctx(&m, ctx, len)))
		return fail(r, rv);
	return fail(r, queue_msg(r, &m));
}

int raft_transfer_leader(struct raft *r, uint64_t to)
{
	struct raft__progress *pr;
	int rv;

	if ((rv = guard(r)))
		return rv;
	if (r->role != RAFT_LEADER)
		return MC_ENOT_LEADER;
	if (to == r->id || !is_voter(r, to))
		return -EINVAL;
	if (r->lead_transferee == to)
		return 0;
	abort_transfer(r, "replaced by a new transfer");
	pr = find_pr(r, to);
	if (!pr)
		return fail(r, MC_EINTERNAL);
	r->election_elapsed = 0;
	r->lead_transferee = to;
	trace(r, "transferring leadership to %" PRIu64, to);
	if (pr->match == last_index(r))
		return fail(r, send_timeout_now(r, to));
	rv = send_append(r, pr, true);
	return fail(r, rv < 0 ? rv : 0);
}

int raft_campaign(struct raft *r)
{
	int rv;

	if ((rv = guard(r)))
		return rv;
	if (r->role == RAFT_LEADER)
		return 0;
	if (!is_voter(r, r->id))
		return -EPERM;
	return fail(r, hup(r, false));
}

int raft_report_snapshot(struct raft *r, uint64_t to, bool ok)
{
	struct raft__progress *pr;
	int rv;

	if ((rv = guard(r)))
		return rv;
	if (r->role != RAFT_LEADER || !(pr = find_pr(r, to)) ||
	    pr->state != RAFT_PROGRESS_SNAPSHOT)
		return 0;
	trace(r, "snapshot to %" PRIu64 " %s", to, ok ? "delivered" : "failed");
	if (!ok)
		pr->pending_snapshot = 0;
	raft__progress_become_probe(pr);
	/* Wait for the follower's answer (or the next heartbeat) first. */
	pr->probe_sent = true;
	return 0;
}

int raft_report_unreachable(struct raft *r, uint64_t to)
{
	struct raft__progress *pr;
	int rv;

	if ((rv = guard(r)))
		return rv;
	if (r->role != RAFT_LEADER || !(pr = find_pr(r, to)))
		return 0;
	if (pr->state == RAFT_PROGRESS_REPLICATE)
		raft__progress_become_probe(pr);
	return 0;
}

int raft_compact(struct raft *r, uint64_t index)
{
	struct raft__conf c;
	uint64_t t, drop;
	int rv;

	if ((rv = guard(r)))
		return rv;
	if (index <= r->snap_index)
		return 0;
	if (index > r->applied)
		return -EINVAL;
	if (raft__log_term(&r->log, index, &t) != 0)
		return fail(r, MC_EINTERNAL);
	if ((rv = conf_at(r, &c, index, NULL)))
		return fail(r, rv);
	raft__conf_free(&r->snap_conf);
	r->snap_conf = c;
	r->snap_index = index;
	r->snap_term = t;
	snap_sync_view(r);
	drop = index > r->cfg.trailing_entries ? index - r->cfg.trailing_entries : 0;
	if (drop > r->log.prev_index)
		raft__log_compact(&r->log, drop);
	trace(r, "snapshot at %" PRIu64 ", log now starts after %" PRIu64, index,
	      r->log.prev_index);
	return 0;
}

/* ---------------------------------------------------------------- ready */

static uint64_t first_unapplied(const struct raft *r)
{
	uint64_t a = r->applied;

	if (r->snap_pending)
		a = MC_MAX(a, r->snap_index);
	return MC_MAX(a, r->log.prev_index) + 1;
}

bool raft_has_ready(const struct raft *r)
{
	if (r->fatal || r->ready_out)
		return false;
	return r->leader != r->prev_leader || r->role != r->prev_role ||
	       r->term != r->prev_hs.term || r->vote != r->prev_hs.vote ||
	       r->commit != r->prev_hs.commit || r->snap_pending ||
	       r->stable < last_index(r) || r->n_msgs || r->n_rss ||
	       first_unapplied(r) <= r->commit;
}

int raft_ready(struct raft *r, struct raft_ready *rd)
{
	uint64_t lo;
	int rv;

	if ((rv = guard(r)))
		return rv;
	memset(rd, 0, sizeof(*rd));
	rd->leader = r->leader;
	rd->role = r->role;
	rd->soft_state_changed = r->leader != r->prev_leader || r->role != r->prev_role;
	rd->hard_state.term = r->term;
	rd->hard_state.vote = r->vote;
	rd->hard_state.commit = r->commit;
	rd->hard_state_changed = r->term != r->prev_hs.term || r->vote != r->prev_hs.vote ||
				 r->commit != r->prev_hs.commit;
	if (r->snap_pending)
		rd->snapshot = &r->snap_view;
	if (r->stable < last_index(r)) {
		rd->entries = raft__log_get(&r->log, r->stable + 1);
		rd->n_entries = (size_t)(last_index(r) - r->stable);
	}
	rd->must_sync = rd->snapshot || rd->n_entries || r->term != r->prev_hs.term ||
			r->vote != r->prev_hs.vote;
	rd->msgs = r->msgs;
	rd->n_msgs = r->n_msgs;
	lo = first_unapplied(r);
	if (lo <= r->commit) {
		rd->committed = raft__log_get(&r->log, lo);
		rd->n_committed = (size_t)(r->commit - lo + 1);
	}
	rd->read_states = r->rss;
	rd->n_read_states = r->n_rss;

	r->ready_out = true;
	r->rd_hs = rd->hard_state;
	r->rd_leader = rd->leader;
	r->rd_role = rd->role;
	r->rd_stable = last_index(r);
	r->rd_applied = rd->n_committed ? r->commit : r->applied;
	r->rd_snap = rd->snapshot != NULL;
	if (r->rd_snap)
		r->rd_applied = MC_MAX(r->rd_applied, r->snap_index);
	return 0;
}

int raft_advance(struct raft *r, const struct raft_ready *rd)
{
	if (r->fatal)
		return r->fatal;
	if (!r->ready_out || rd->msgs != r->msgs || rd->n_msgs != r->n_msgs)
		return -EINVAL;
	r->stable = r->rd_stable;
	r->applied = MC_MAX(r->applied, r->rd_applied);
	if (r->rd_snap)
		r->snap_pending = false;
	r->prev_hs = r->rd_hs;
	r->prev_leader = r->rd_leader;
	r->prev_role = r->rd_role;
	free_msgs(r);
	free_rss(r);
	r->ready_out = false;
	return 0;
}

/* --------------------------------------------------------------- queries */

size_t raft_status(const struct raft *r, struct raft_status *st,
		   struct raft_peer_status *peers, size_t cap)
{
	memset(st, 0, sizeof(*st));
	st->id = r->id;
	st->term = r->term;
	st->vote = r->vote;
	st->leader = r->leader;
	st->role = r->role;
	st->commit = r->commit;
	st->applied = r->applied;
	st->first_index = r->log.prev_index + 1;
	st->last_index = last_index(r);
	st->snapshot_index = r->snap_index;
	st->lead_transferee = r->lead_transferee;
	st->n_voters = r->conf.n_voters;
	st->n_learners = r->conf.n_learners;
	if (r->role != RAFT_LEADER)
		return 0;
	for (size_t k = 0; k < r->n_prs && k < cap; k++) {
		const struct raft__progress *p = &r->prs[k];

		peers[k].id = p->id;
		peers[k].learner = p->learner;
		peers[k].match = p->match;
		peers[k].next = p->next;
		peers[k].state = p->state;
		peers[k].pending_snapshot = p->pending_snapshot;
		peers[k].recent_active = p->recent_active;
		peers[k].paused = raft__progress_is_paused(p);
		peers[k].inflight = p->inflights.count;
	}
	return r->n_prs;
}

int raft_term_at(const struct raft *r, uint64_t index, uint64_t *term)
{
	if (raft__log_term(&r->log, index, term) == 0)
		return 0;
	if (index == r->snap_index) {
		*term = r->snap_term;
		return 0;
	}
	return -ENOENT;
}

const struct raft_entry *raft_entry_at(const struct raft *r, uint64_t index)
{
	return raft__log_get(&r->log, index);
}

const struct raft_snapshot_meta *raft_last_snapshot(const struct raft *r)
{
	return &r->snap_view;
}

struct raft_conf_state raft_conf(const struct raft *r)
{
	return raft__conf_view(&r->conf);
}

const char *raft_role_name(enum raft_role role)
{
	switch (role) {
	case RAFT_FOLLOWER:
		return "follower";
	case RAFT_PRE_CANDIDATE:
		return "pre-candidate";
	case RAFT_CANDIDATE:
		return "candidate";
	case RAFT_LEADER:
		return "leader";
	}
	return "?";
}

const char *raft_msg_type_name(enum raft_msg_type type)
{
	switch (type) {
	case RAFT_MSG_APP:
		return "APP";
	case RAFT_MSG_APP_RESP:
		return "APP_RESP";
	case RAFT_MSG_VOTE:
		return "VOTE";
	case RAFT_MSG_VOTE_RESP:
		return "VOTE_RESP";
	case RAFT_MSG_PREVOTE:
		return "PREVOTE";
	case RAFT_MSG_PREVOTE_RESP:
		return "PREVOTE_RESP";
	case RAFT_MSG_HEARTBEAT:
		return "HEARTBEAT";
	case RAFT_MSG_HEARTBEAT_RESP:
		return "HEARTBEAT_RESP";
	case RAFT_MSG_SNAP:
		return "SNAP";
	case RAFT_MSG_TIMEOUT_NOW:
		return "TIMEOUT_NOW";
	case RAFT_MSG_READ_INDEX:
		return "READ_INDEX";
	case RAFT_MSG_READ_INDEX_RESP:
		return "READ_INDEX_RESP";
	}
	return "?";
}
