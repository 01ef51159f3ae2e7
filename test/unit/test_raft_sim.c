/*
 * test_raft_sim: deterministic simulation of Raft clusters.
 *
 * A seed fully determines a run: the schedule (which message is delivered
 * next, which node ticks, crashes, restarts, gets partitioned, which client
 * request or membership change or leader transfer or snapshot happens) is
 * drawn from one splitmix64 stream, and the cores draw their election
 * timeouts from seeds derived from it.
 *
 * The simulated world:
 *   network  every message is deep-copied on send, gets a delivery time,
 *            and is delivered in random order among the deliverable ones;
 *            it may be lost, duplicated, delayed long, or cut by a
 *            partition (symmetric, isolated node, or one direction only).
 *            SNAP messages carry the sender's snapshot data (the state
 *            machine digest), like the out-of-band stream, and the sender
 *            gets raft_report_snapshot(ok/fail).
 *   disk     per node: what was fsynced (a tu_disk plus the snapshot
 *            digest) and a list of written-but-unsynced operations. A crash
 *            keeps a random prefix of the unsynced operations (a torn
 *            tail) and loses the rest. The driver fsyncs before sending a
 *            ready's messages (when the ready says must_sync) and applies
 *            committed entries after that; crashes also hit between those
 *            steps. Slow disks leave readies pending for a while.
 *   state    a chain digest over applied entries (h = H(h, entry)).
 *   clients  writes (unique payloads) on the leader, ReadIndex reads on any
 *            node, conf changes (add voter / add learner / promote /
 *            remove, including the leader), leader transfers, snapshots +
 *            compaction on any node.
 *
 * Checked after every step: Election Safety, Log Matching (each (index,
 * term) names one entry and one predecessor term, plus periodic pairwise
 * prefix comparison), Leader Completeness, State Machine Safety (same entry
 * and digest at each index everywhere, applied index only moves forward,
 * only committed entries are applied, snapshots match), vote safety on
 * disk, and ReadIndex linearizability (a read's index >= the index of every
 * write acknowledged before the read was issued). After the faults stop and
 * the network heals: a leader is elected and a new write commits within a
 * bounded number of ticks.
 *
 * Environment: RAFT_SIM_SEEDS=n seeds per test (default below),
 * RAFT_SIM_STEPS=n steps per seed, RAFT_SIM_SEED=s to run one seed (with
 * RAFT_SIM_N=3|5), RAFT_SIM_TRACE=1 to print the cores' traces and the
 * driver's actions for that seed.
 */
#include <criterion/criterion.h>
#include <errno.h>

#include "common/util.h"
#include "test_raft_util.h"

#define MAXID 12
#define SIM_ET 10
#define MAX_RCV_SNAPS 8
#define LIVENESS_TICKS (30 * SIM_ET)
#define DEFAULT_SEEDS 500 /* 4 tests: 2,000 seeds in make test */
#define DEFAULT_STEPS 5000

/* ------------------------------------------------------------ plumbing */

enum { NODE_NONE, NODE_UP, NODE_DOWN, NODE_GONE };
enum { OP_SNAP, OP_ENTRIES, OP_HS };

struct sim_op {
	int kind;
	struct raft_snapshot_meta snap; /* owned conf */
	uint64_t snap_hash;
	struct raft_entry *ents; /* owned */
	size_t n;
	struct raft_hard_state hs;
};

struct rcv_snap {
	uint64_t index, term, hash;
};

struct sim_node {
	int state;
	struct raft *r;
	uint64_t incarnation;
	/* durable */
	struct tu_disk disk;
	uint64_t disk_snap_hash;
	uint64_t synced_term, synced_vote;
	/* written, not synced */
	struct sim_op *ops;
	size_t n_ops, cap_ops;
	/* volatile */
	uint64_t sm_applied, sm_hash;
	uint64_t last_commit;
	struct rcv_snap rcv[MAX_RCV_SNAPS];
	size_t n_rcv;
	bool slow;
	bool removed; /* its removal was applied somewhere */
};

struct sim_msg {
	struct raft_msg m;
	uint64_t at;
	uint64_t from_inc;
	uint64_t snap_hash;
};

struct reg_slot {
	uint64_t index, term, hash, prev;
	bool used;
};

struct g_commit {
	uint64_t term, obs_term;
	bool set;
};

struct g_apply {
	uint64_t term, hash, chain;
	bool set;
};

struct sim_read {
	uint64_t node;
	uint64_t required;
	bool done;
};

struct sim {
	uint64_t seed, rng;
	int n;
	long step, steps;
	uint64_t now;
	bool trace;
	bool liveness;
	bool storm;
	long phase_end;
	/* parameters drawn from the seed */
	double p_loss, p_dup, p_long_delay, w_crash, w_part, w_conf, p_crash_mid;
	unsigned max_delay;
	uint64_t trailing;

	struct sim_node nodes[MAXID + 1];
	uint64_t next_id;
	struct sim_msg *net;
	size_t n_net, cap_net;
	bool cut[MAXID + 1][MAXID + 1];

	/* checker state */
	uint64_t *leader_of_term;
	size_t cap_lot;
	struct reg_slot *reg;
	size_t reg_cap, reg_n;
	struct g_commit *committed;
	struct g_apply *applied;
	size_t cap_idx;
	uint64_t max_committed;
	uint64_t write_seq, max_acked;
	bool *acked;
	size_t cap_acked;
	struct sim_read *reads;
	size_t n_reads, cap_reads;

	/* statistics */
	size_t n_leaders, n_crashes, n_snaps_installed, n_confs, n_transfers_done, n_reads_ok;
	size_t n_writes_acked, n_compactions, n_transfers, n_delivered, max_backlog;
	uint64_t liveness_ticks_max;
};

static uint64_t rnd(struct sim *s)
{
	uint64_t z = (s->rng += 0x9E3779B97F4A7C15ull);

	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

static uint64_t below(struct sim *s, uint64_t n)
{
	return n ? rnd(s) % n : 0;
}

static bool chance(struct sim *s, double p)
{
	return (double)(rnd(s) >> 11) * (1.0 / 9007199254740992.0) < p;
}

#define SIM_FAIL(s, ...) \
	cr_assert_fail("raft sim violation: seed %" PRIu64 " n %d step %ld tick %" PRIu64 \
		       " (reproduce: RAFT_SIM_SEED=%" PRIu64 \
		       " RAFT_SIM_N=%d RAFT_SIM_STEPS=%ld" \
		       " RAFT_SIM_TRACE=1): %s", \
		       (s)->seed, (s)->n, (s)->step, (s)->now, (s)->seed, (s)->n, (s)->steps, \
		       sim_fmt(__VA_ARGS__))

#define SIM_CHECK(s, cond, ...) \
	do { \
		if (!(cond)) \
			SIM_FAIL(s, __VA_ARGS__); \
	} while (0)

static char sim_fmt_buf[1024];

static const char *sim_fmt(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static const char *sim_fmt(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(sim_fmt_buf, sizeof(sim_fmt_buf), fmt, ap);
	va_end(ap);
	return sim_fmt_buf;
}

static void say(struct sim *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void say(struct sim *s, const char *fmt, ...)
{
	va_list ap;

	if (!s->trace)
		return;
	printf("[step %ld tick %" PRIu64 "] ", s->step, s->now);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
}

static void core_trace(void *arg, uint64_t id, const char *text)
{
	struct sim *s = arg;

	printf("[step %ld tick %" PRIu64 "]   node %" PRIu64 " %s\n", s->step, s->now, id,
	       text);
}

static uint64_t entry_hash(const struct raft_entry *e)
{
	uint64_t h = mc_hash64(e->data ? e->data : "", e->len);

	return h ^ ((uint64_t)e->type * 0x9E3779B97F4A7C15ull);
}

static uint64_t chain(uint64_t h, const struct raft_entry *e)
{
	uint64_t v[3] = {h, e->term, entry_hash(e)};

	return mc_hash64(v, sizeof(v));
}

static void grow_idx(struct sim *s, uint64_t index)
{
	if (index < s->cap_idx)
		return;
	size_t cap = s->cap_idx ? s->cap_idx : 1024;

	while (cap <= index)
		cap *= 2;
	s->committed = realloc(s->committed, cap * sizeof(*s->committed));
	s->applied = realloc(s->applied, cap * sizeof(*s->applied));
	cr_assert(s->committed && s->applied);
	memset(s->committed + s->cap_idx, 0, (cap - s->cap_idx) * sizeof(*s->committed));
	memset(s->applied + s->cap_idx, 0, (cap - s->cap_idx) * sizeof(*s->applied));
	s->cap_idx = cap;
}

/* ------------------------------------------------- Log Matching registry */

static struct reg_slot *reg_find(struct sim *s, uint64_t index, uint64_t term)
{
	uint64_t k[2] = {index, term};
	size_t i = mc_hash64(k, sizeof(k)) & (s->reg_cap - 1);

	while (s->reg[i].used && (s->reg[i].index != index || s->reg[i].term != term))
		i = (i + 1) & (s->reg_cap - 1);
	return &s->reg[i];
}

static void reg_grow(struct sim *s)
{
	struct reg_slot *old = s->reg;
	size_t old_cap = s->reg_cap;

	s->reg_cap = old_cap ? old_cap * 2 : 4096;
	s->reg = calloc(s->reg_cap, sizeof(*s->reg));
	cr_assert(s->reg);
	for (size_t k = 0; k < old_cap; k++)
		if (old[k].used)
			*reg_find(s, old[k].index, old[k].term) = old[k];
	free(old);
}

#define PREV_UNKNOWN UINT64_MAX

/* Entry (index, term) with data hash h follows an entry of term prev. */
static void reg_check(struct sim *s, uint64_t node, uint64_t index, uint64_t term, uint64_t h,
		      uint64_t prev)
{
	struct reg_slot *sl;

	if ((s->reg_n + 1) * 2 > s->reg_cap)
		reg_grow(s);
	sl = reg_find(s, index, term);
	if (!sl->used) {
		sl->used = true;
		sl->index = index;
		sl->term = term;
		sl->hash = h;
		sl->prev = prev;
		s->reg_n++;
		return;
	}
	SIM_CHECK(s, sl->hash == h,
		  "log matching: node %" PRIu64 " has another entry at %" PRIu64 "@%" PRIu64,
		  node, index, term);
	if (prev != PREV_UNKNOWN && sl->prev != PREV_UNKNOWN)
		SIM_CHECK(s, sl->prev == prev,
			  "log matching: node %" PRIu64 " has %" PRIu64 "@%" PRIu64
			  " after term %" PRIu64 ", elsewhere after term %" PRIu64,
			  node, index, term, prev, sl->prev);
	if (sl->prev == PREV_UNKNOWN)
		sl->prev = prev;
}

/* ------------------------------------------------------------ messages */

static void net_add(struct sim *s, const struct raft_msg *m, uint64_t from_inc,
		    uint64_t snap_hash)
{
	struct sim_msg *sm;
	uint64_t delay = below(s, (uint64_t)s->max_delay + 1);

	if (s->storm && chance(s, s->p_long_delay))
		delay += 1 + below(s, 3 * SIM_ET);
	if (s->n_net == s->cap_net) {
		s->cap_net = s->cap_net ? 2 * s->cap_net : 256;
		s->net = realloc(s->net, s->cap_net * sizeof(*s->net));
		cr_assert(s->net);
	}
	sm = &s->net[s->n_net++];
	tu_msg_dup(&sm->m, m);
	sm->at = s->now + delay;
	sm->from_inc = from_inc;
	sm->snap_hash = snap_hash;
}

static void net_remove(struct sim *s, size_t k, struct sim_msg *out)
{
	*out = s->net[k];
	s->net[k] = s->net[--s->n_net];
}

/* ---------------------------------------------------------------- disk */

static void op_free(struct sim_op *op)
{
	tu_conf_free(&op->snap.conf);
	tu_entries_free(op->ents, op->n);
	memset(op, 0, sizeof(*op));
}

static struct sim_op *op_new(struct sim_node *n, int kind)
{
	struct sim_op *op;

	if (n->n_ops == n->cap_ops) {
		n->cap_ops = n->cap_ops ? 2 * n->cap_ops : 8;
		n->ops = realloc(n->ops, n->cap_ops * sizeof(*n->ops));
		cr_assert(n->ops);
	}
	op = &n->ops[n->n_ops++];
	memset(op, 0, sizeof(*op));
	op->kind = kind;
	return op;
}

/* Make op durable (with at most keep entries of an OP_ENTRIES). */
static void op_persist(struct sim *s, uint64_t id, struct sim_op *op, size_t keep)
{
	struct sim_node *n = &s->nodes[id];

	switch (op->kind) {
	case OP_SNAP:
		tu_disk_set_snapshot(&n->disk, &op->snap);
		n->disk_snap_hash = op->snap_hash;
		break;
	case OP_ENTRIES:
		tu_disk_append(&n->disk, op->ents, MC_MIN(keep, op->n));
		break;
	case OP_HS:
		/* Vote safety: one vote per term, terms never go back. */
		SIM_CHECK(s, op->hs.term >= n->synced_term,
			  "node %" PRIu64 " term went back on disk %" PRIu64 " -> %" PRIu64,
			  id, n->synced_term, op->hs.term);
		if (op->hs.term == n->synced_term && n->synced_vote != RAFT_NONE)
			SIM_CHECK(s, op->hs.vote == n->synced_vote,
				  "node %" PRIu64 " voted twice in term %" PRIu64, id,
				  op->hs.term);
		n->synced_term = op->hs.term;
		n->synced_vote = op->hs.vote;
		n->disk.hs = op->hs;
		break;
	}
}

static void disk_sync(struct sim *s, uint64_t id)
{
	struct sim_node *n = &s->nodes[id];

	for (size_t k = 0; k < n->n_ops; k++) {
		op_persist(s, id, &n->ops[k], SIZE_MAX);
		op_free(&n->ops[k]);
	}
	n->n_ops = 0;
}

/* --------------------------------------------------------------- nodes */

static void observe(struct sim *s, uint64_t id);
static void record_commit(struct sim *s, uint64_t id, uint64_t c);

static struct raft_config sim_config(struct sim *s, uint64_t id)
{
	struct raft_config c;

	raft_config_init(&c, id);
	c.election_ticks = SIM_ET;
	c.heartbeat_ticks = 1 + (unsigned)(s->seed % 2);
	c.seed = rnd(s);
	c.max_msg_entries = 1 + (size_t)(s->seed % 7);
	c.max_msg_bytes = 64;
	c.max_inflight_msgs = 1 + (size_t)(s->seed % 4);
	c.trailing_entries = s->trailing;
	if (s->trace) {
		c.trace = core_trace;
		c.trace_arg = s;
	}
	return c;
}

/* Start node id from its disk (empty disk = a brand-new node). */
static void node_start(struct sim *s, uint64_t id)
{
	struct sim_node *n = &s->nodes[id];
	struct raft_config c = sim_config(s, id);
	struct raft_restore rs = tu_disk_restore(&n->disk);
	int rv = raft_new(&c, &rs, &n->r);

	if (rv != 0) {
		char buf[512];
		size_t off = 0;

		for (size_t k = 0; k < n->disk.n && off < sizeof(buf) - 32; k++)
			off += (size_t)snprintf(buf + off, sizeof(buf) - off,
						" %" PRIu64 "@%" PRIu64, n->disk.ents[k].index,
						n->disk.ents[k].term);
		buf[MC_MIN(off, sizeof(buf) - 1)] = 0;
		SIM_FAIL(s,
			 "restart of node %" PRIu64 " failed (%d) from disk: hs term %" PRIu64
			 " vote %" PRIu64 " commit %" PRIu64 ", snapshot %" PRIu64 "@%" PRIu64
			 ", entries%s",
			 id, rv, n->disk.hs.term, n->disk.hs.vote, n->disk.hs.commit,
			 n->disk.snap.index, n->disk.snap.term, off ? buf : " none");
	}
	n->state = NODE_UP;
	n->incarnation++;
	n->sm_applied = n->disk.snap.index;
	n->sm_hash = n->disk_snap_hash;
	n->last_commit = n->disk.snap.index;
	n->n_rcv = 0;
	n->slow = false;
	{
		struct raft_status st;

		raft_status(n->r, &st, NULL, 0);
		record_commit(s, id, st.commit); /* durable commit index */
	}
	say(s,
	    "node %" PRIu64 " started (incarnation %" PRIu64 ", disk: snap %" PRIu64
	    ", %zu entries, term %" PRIu64 ")",
	    id, n->incarnation, n->disk.snap.index, n->disk.n, n->disk.hs.term);
}

static void node_crash(struct sim *s, uint64_t id, const char *where)
{
	struct sim_node *n = &s->nodes[id];
	size_t keep = (size_t)below(s, n->n_ops + 1);

	/* A torn tail: a prefix of the unsynced writes survives. */
	for (size_t k = 0; k < n->n_ops; k++) {
		struct sim_op *op = &n->ops[k];

		if (k < keep)
			op_persist(s, id, op, SIZE_MAX);
		else if (k == keep && op->kind == OP_ENTRIES)
			op_persist(s, id, op, (size_t)below(s, op->n + 1));
		op_free(op);
	}
	n->n_ops = 0;
	raft_free(n->r);
	n->r = NULL;
	n->state = NODE_DOWN;
	s->n_crashes++;
	say(s, "node %" PRIu64 " crashed %s", id, where);
}

static struct rcv_snap *find_rcv(struct sim_node *n, uint64_t index, uint64_t term)
{
	for (size_t k = 0; k < n->n_rcv; k++)
		if (n->rcv[k].index == index && n->rcv[k].term == term)
			return &n->rcv[k];
	return NULL;
}

/* --------------------------------------------------------- the checker */

static void record_commit(struct sim *s, uint64_t id, uint64_t c)
{
	struct sim_node *n = &s->nodes[id];
	struct raft_status st;

	raft_status(n->r, &st, NULL, 0);
	SIM_CHECK(s, c >= n->last_commit, "node %" PRIu64 " commit went back", id);
	grow_idx(s, c);
	for (uint64_t i = n->last_commit + 1; i <= c; i++) {
		uint64_t t;

		if (raft_term_at(n->r, i, &t) != 0)
			continue; /* came with a snapshot */
		if (s->committed[i].set) {
			SIM_CHECK(s, s->committed[i].term == t,
				  "committed entry %" PRIu64 " has term %" PRIu64
				  " on node %" PRIu64 " but %" PRIu64 " elsewhere",
				  i, t, id, s->committed[i].term);
			s->committed[i].obs_term = MC_MIN(s->committed[i].obs_term, st.term);
		} else {
			s->committed[i].set = true;
			s->committed[i].term = t;
			s->committed[i].obs_term = st.term;
		}
	}
	n->last_commit = c;
	s->max_committed = MC_MAX(s->max_committed, c);
}

/* Leader Completeness for a leader newly seen at term `term`. */
static void check_completeness(struct sim *s, uint64_t id, uint64_t term)
{
	struct raft_status st;

	raft_status(s->nodes[id].r, &st, NULL, 0);
	for (uint64_t i = 1; i <= s->max_committed && i < s->cap_idx; i++) {
		uint64_t t;

		if (!s->committed[i].set || s->committed[i].obs_term >= term)
			continue;
		SIM_CHECK(s, i <= st.last_index,
			  "leader completeness: leader %" PRIu64 " of term %" PRIu64
			  " lacks committed %" PRIu64,
			  id, term, i);
		if (raft_term_at(s->nodes[id].r, i, &t) != 0)
			continue; /* inside its snapshot */
		SIM_CHECK(s, t == s->committed[i].term,
			  "leader completeness: leader %" PRIu64 " of term %" PRIu64
			  " has %" PRIu64 "@%" PRIu64 ", committed was @%" PRIu64,
			  id, term, i, t, s->committed[i].term);
	}
}

static void observe(struct sim *s, uint64_t id)
{
	struct raft_status st;

	if (s->nodes[id].state != NODE_UP)
		return;
	raft_status(s->nodes[id].r, &st, NULL, 0);
	if (st.role != RAFT_LEADER)
		return;
	if (st.term >= s->cap_lot) {
		size_t cap = s->cap_lot ? s->cap_lot : 64;

		while (cap <= st.term)
			cap *= 2;
		s->leader_of_term = realloc(s->leader_of_term, cap * sizeof(uint64_t));
		cr_assert(s->leader_of_term);
		memset(s->leader_of_term + s->cap_lot, 0,
		       (cap - s->cap_lot) * sizeof(uint64_t));
		s->cap_lot = cap;
	}
	if (s->leader_of_term[st.term] == id)
		return;
	SIM_CHECK(s, s->leader_of_term[st.term] == 0,
		  "election safety: %" PRIu64 " and %" PRIu64 " both lead term %" PRIu64,
		  s->leader_of_term[st.term], id, st.term);
	s->leader_of_term[st.term] = id;
	s->n_leaders++;
	say(s, "node %" PRIu64 " leads term %" PRIu64, id, st.term);
	check_completeness(s, id, st.term);
}

static uint64_t parse_num(const void *data, size_t len, char tag)
{
	const char *p = data;
	uint64_t v = 0;

	if (len < 2 || p[0] != tag)
		return UINT64_MAX;
	for (size_t k = 1; k < len; k++) {
		if (p[k] < '0' || p[k] > '9')
			return UINT64_MAX;
		v = v * 10 + (uint64_t)(p[k] - '0');
	}
	return v;
}

static void apply_entry(struct sim *s, uint64_t id, const struct raft_entry *e)
{
	struct sim_node *n = &s->nodes[id];
	struct g_apply *g;
	uint64_t seq;

	SIM_CHECK(s, e->index == n->sm_applied + 1,
		  "node %" PRIu64 " applies %" PRIu64 " after %" PRIu64, id, e->index,
		  n->sm_applied);
	SIM_CHECK(s, e->index <= n->last_commit,
		  "node %" PRIu64 " applies uncommitted %" PRIu64 " (commit %" PRIu64 ")", id,
		  e->index, n->last_commit);
	grow_idx(s, e->index);
	SIM_CHECK(s, !s->committed[e->index].set || s->committed[e->index].term == e->term,
		  "node %" PRIu64 " applies %" PRIu64 "@%" PRIu64 ", committed was @%" PRIu64,
		  id, e->index, e->term, s->committed[e->index].term);
	n->sm_hash = chain(n->sm_hash, e);
	n->sm_applied = e->index;
	g = &s->applied[e->index];
	if (g->set) {
		SIM_CHECK(s,
			  g->term == e->term && g->hash == entry_hash(e) &&
				  g->chain == n->sm_hash,
			  "state machine safety: node %" PRIu64
			  " applied a different entry or "
			  "state at %" PRIu64,
			  id, e->index);
	} else {
		g->set = true;
		g->term = e->term;
		g->hash = entry_hash(e);
		g->chain = n->sm_hash;
	}
	if (e->type == RAFT_ENTRY_CONF_CHANGE) {
		struct raft_conf_change cc;

		SIM_CHECK(s, raft_conf_change_decode(e->data, e->len, &cc) == 0,
			  "bad conf change at %" PRIu64, e->index);
		if (cc.type == RAFT_CC_REMOVE && cc.node_id <= MAXID &&
		    !s->nodes[cc.node_id].removed) {
			s->nodes[cc.node_id].removed = true;
			say(s, "removal of %" PRIu64 " applied at %" PRIu64, cc.node_id,
			    e->index);
		}
		return;
	}
	seq = parse_num(e->data, e->len, 'w');
	if (seq != UINT64_MAX && seq < s->cap_acked && !s->acked[seq]) {
		s->acked[seq] = true; /* the client hears back */
		s->max_acked = MC_MAX(s->max_acked, e->index);
		s->n_writes_acked++;
	}
}

static void check_read(struct sim *s, uint64_t id, const struct raft_read_state *rs)
{
	uint64_t k = parse_num(rs->ctx, rs->ctx_len, 'r');

	SIM_CHECK(s, k < s->n_reads, "node %" PRIu64 " got an unknown read state", id);
	SIM_CHECK(s, s->reads[k].node == id,
		  "read %" PRIu64 " issued on %" PRIu64 " answered on %" PRIu64, k,
		  s->reads[k].node, id);
	SIM_CHECK(s, rs->index >= s->reads[k].required,
		  "linearizability: read %" PRIu64 " on node %" PRIu64 " got index %" PRIu64
		  " but a write at %" PRIu64 " was acknowledged before it was issued",
		  k, id, rs->index, s->reads[k].required);
	if (!s->reads[k].done)
		s->n_reads_ok++;
	s->reads[k].done = true;
}

/* Compare every pair of live logs on their common range. */
static void check_logs_pairwise(struct sim *s)
{
	for (uint64_t a = 1; a <= MAXID; a++) {
		for (uint64_t b = a + 1; b <= MAXID; b++) {
			struct raft_status sa, sb;
			uint64_t lo, hi, top = 0;

			if (s->nodes[a].state != NODE_UP || s->nodes[b].state != NODE_UP)
				continue;
			raft_status(s->nodes[a].r, &sa, NULL, 0);
			raft_status(s->nodes[b].r, &sb, NULL, 0);
			lo = MC_MAX(sa.first_index, sb.first_index);
			hi = MC_MIN(sa.last_index, sb.last_index);
			for (uint64_t i = hi; i >= lo && i > 0; i--) {
				uint64_t ta, tb;

				if (raft_term_at(s->nodes[a].r, i, &ta) == 0 &&
				    raft_term_at(s->nodes[b].r, i, &tb) == 0 && ta == tb) {
					top = i;
					break;
				}
			}
			for (uint64_t i = lo; i <= top; i++) {
				const struct raft_entry *ea = raft_entry_at(s->nodes[a].r, i);
				const struct raft_entry *eb = raft_entry_at(s->nodes[b].r, i);

				SIM_CHECK(s,
					  ea && eb && ea->term == eb->term &&
						  entry_hash(ea) == entry_hash(eb),
					  "log matching: nodes %" PRIu64 " and %" PRIu64
					  " agree at %" PRIu64 " but differ at %" PRIu64,
					  a, b, top, i);
			}
		}
	}
}

/* ---------------------------------------------------------- the driver */

static void send_msg(struct sim *s, uint64_t id, const struct raft_msg *m)
{
	struct sim_node *n = &s->nodes[id];
	uint64_t h = 0;

	if (m->type == RAFT_MSG_SNAP) {
		SIM_CHECK(s,
			  m->snapshot.index == n->disk.snap.index &&
				  m->snapshot.term == n->disk.snap.term,
			  "node %" PRIu64 " sends snapshot %" PRIu64 " but has %" PRIu64
			  " on disk",
			  id, m->snapshot.index, n->disk.snap.index);
		h = n->disk_snap_hash;
	}
	if (m->to > MAXID)
		return;
	net_add(s, m, n->incarnation, h);
}

/* Process node id's readies in the contract's order, with crash points. */
static void drain(struct sim *s, uint64_t id)
{
	struct sim_node *n = &s->nodes[id];

	while (n->state == NODE_UP && raft_has_ready(n->r)) {
		struct raft_ready rd;
		int rv = raft_ready(n->r, &rd);

		SIM_CHECK(s, rv == 0, "raft_ready on %" PRIu64 ": %d", id, rv);
		/* 1. snapshot: persist it and load it into the state machine */
		if (rd.snapshot) {
			const struct raft_snapshot_meta *sn = rd.snapshot;
			struct rcv_snap *d = find_rcv(n, sn->index, sn->term);
			struct sim_op *op;

			SIM_CHECK(s, d,
				  "node %" PRIu64 " installs snapshot %" PRIu64
				  " it never received",
				  id, sn->index);
			SIM_CHECK(s, sn->index > n->sm_applied,
				  "node %" PRIu64 " installs snapshot %" PRIu64
				  " behind applied %" PRIu64,
				  id, sn->index, n->sm_applied);
			grow_idx(s, sn->index);
			SIM_CHECK(s,
				  !s->applied[sn->index].set ||
					  s->applied[sn->index].chain == d->hash,
				  "snapshot %" PRIu64 " on node %" PRIu64 " has another state",
				  sn->index, id);
			SIM_CHECK(s,
				  !s->committed[sn->index].set ||
					  s->committed[sn->index].term == sn->term,
				  "snapshot %" PRIu64 "@%" PRIu64
				  " contradicts committed term",
				  sn->index, sn->term);
			op = op_new(n, OP_SNAP);
			op->snap = *sn;
			tu_conf_dup(&op->snap.conf, &sn->conf);
			op->snap_hash = d->hash;
			n->sm_applied = sn->index;
			n->sm_hash = d->hash;
			n->last_commit = MC_MAX(n->last_commit, sn->index);
			s->n_snaps_installed++;
			say(s, "node %" PRIu64 " installs snapshot %" PRIu64, id, sn->index);
		}
		/* 2. entries and hard state */
		for (size_t k = 0; k < rd.n_entries; k++) {
			const struct raft_entry *e = &rd.entries[k];
			uint64_t prev = PREV_UNKNOWN;

			if (k > 0)
				prev = rd.entries[k - 1].term;
			else if (raft_term_at(n->r, e->index - 1, &prev) != 0)
				prev = PREV_UNKNOWN;
			reg_check(s, id, e->index, e->term, entry_hash(e), prev);
		}
		if (rd.n_entries) {
			struct sim_op *op = op_new(n, OP_ENTRIES);

			op->ents = tu_entries_dup(rd.entries, rd.n_entries);
			op->n = rd.n_entries;
		}
		if (rd.hard_state_changed)
			op_new(n, OP_HS)->hs = rd.hard_state;
		if (s->storm && chance(s, s->p_crash_mid)) {
			node_crash(s, id, "before fsync");
			return;
		}
		if (rd.must_sync)
			disk_sync(s, id);
		if (rd.hard_state_changed)
			record_commit(s, id, rd.hard_state.commit);
		if (s->storm && chance(s, s->p_crash_mid)) {
			node_crash(s, id, "after fsync, before sending");
			return;
		}
		/* 3. messages */
		for (size_t k = 0; k < rd.n_msgs; k++)
			send_msg(s, id, &rd.msgs[k]);
		if (s->storm && chance(s, s->p_crash_mid)) {
			node_crash(s, id, "after sending, before applying");
			return;
		}
		/* 4. apply; 5. reads */
		for (size_t k = 0; k < rd.n_committed; k++)
			apply_entry(s, id, &rd.committed[k]);
		for (size_t k = 0; k < rd.n_read_states; k++)
			check_read(s, id, &rd.read_states[k]);
		rv = raft_advance(n->r, &rd);
		SIM_CHECK(s, rv == 0, "raft_advance on %" PRIu64 ": %d", id, rv);
		observe(s, id);
	}
}

static void maybe_drain(struct sim *s, uint64_t id)
{
	observe(s, id);
	if (!s->nodes[id].slow || s->liveness)
		drain(s, id);
}

static void report_snapshot(struct sim *s, const struct sim_msg *sm, bool ok)
{
	struct sim_node *from = &s->nodes[sm->m.from];
	int rv;

	if (from->state != NODE_UP || from->incarnation != sm->from_inc)
		return;
	rv = raft_report_snapshot(from->r, sm->m.to, ok);
	SIM_CHECK(s, rv == 0, "report_snapshot: %d", rv);
	maybe_drain(s, sm->m.from);
}

static void deliver(struct sim *s, size_t k)
{
	struct sim_msg sm;
	struct sim_node *to;
	int rv;

	net_remove(s, k, &sm);
	to = &s->nodes[sm.m.to];
	if (to->state != NODE_UP || s->cut[sm.m.from][sm.m.to] ||
	    (s->storm && chance(s, s->p_loss))) {
		if (sm.m.type == RAFT_MSG_SNAP)
			report_snapshot(s, &sm, false);
		else if (s->cut[sm.m.from][sm.m.to] && chance(s, 0.1) &&
			 s->nodes[sm.m.from].state == NODE_UP &&
			 s->nodes[sm.m.from].incarnation == sm.from_inc) {
			rv = raft_report_unreachable(s->nodes[sm.m.from].r, sm.m.to);
			SIM_CHECK(s, rv == 0, "report_unreachable: %d", rv);
		}
		tu_msg_free(&sm.m);
		return;
	}
	if (s->storm && chance(s, s->p_dup))
		net_add(s, &sm.m, sm.from_inc, sm.snap_hash);
	if (sm.m.type == RAFT_MSG_SNAP) {
		struct rcv_snap *d = find_rcv(to, sm.m.snapshot.index, sm.m.snapshot.term);

		if (!d) {
			if (to->n_rcv == MAX_RCV_SNAPS) {
				memmove(to->rcv, to->rcv + 1,
					(MAX_RCV_SNAPS - 1) * sizeof(*to->rcv));
				to->n_rcv--;
			}
			d = &to->rcv[to->n_rcv++];
		}
		d->index = sm.m.snapshot.index;
		d->term = sm.m.snapshot.term;
		d->hash = sm.snap_hash;
	}
	rv = raft_step(to->r, &sm.m);
	SIM_CHECK(s, rv == 0, "step %s %" PRIu64 "->%" PRIu64 ": %d",
		  raft_msg_type_name(sm.m.type), sm.m.from, sm.m.to, rv);
	maybe_drain(s, sm.m.to);
	if (sm.m.type == RAFT_MSG_SNAP)
		report_snapshot(s, &sm, true);
	tu_msg_free(&sm.m);
}

/* A random deliverable message, or SIZE_MAX. */
static size_t pick_msg(struct sim *s)
{
	size_t start, k;

	if (s->n_net == 0)
		return SIZE_MAX;
	start = (size_t)below(s, s->n_net);
	for (k = 0; k < s->n_net; k++) {
		size_t i = (start + k) % s->n_net;

		if (s->net[i].at <= s->now)
			return i;
	}
	return SIZE_MAX;
}

static void tick_all(struct sim *s)
{
	s->now++;
	for (uint64_t id = 1; id <= MAXID; id++) {
		struct sim_node *n = &s->nodes[id];

		if (n->state != NODE_UP || (!s->liveness && chance(s, 0.03)))
			continue; /* a little clock drift */
		SIM_CHECK(s, raft_tick(n->r) == 0, "tick on %" PRIu64, id);
		maybe_drain(s, id);
	}
}

static uint64_t find_leader(struct sim *s)
{
	uint64_t best = 0, best_term = 0;

	for (uint64_t id = 1; id <= MAXID; id++) {
		struct raft_status st;

		if (s->nodes[id].state != NODE_UP)
			continue;
		raft_status(s->nodes[id].r, &st, NULL, 0);
		if (st.role == RAFT_LEADER && st.term >= best_term) {
			best = id;
			best_term = st.term;
		}
	}
	return best;
}

static uint64_t random_up(struct sim *s)
{
	uint64_t ids[MAXID];
	size_t n = 0;

	for (uint64_t id = 1; id <= MAXID; id++)
		if (s->nodes[id].state == NODE_UP)
			ids[n++] = id;
	return n ? ids[below(s, n)] : 0;
}

/* ------------------------------------------------------------- actions */

static void act_write(struct sim *s)
{
	uint64_t id = chance(s, 0.8) ? find_leader(s) : random_up(s);
	char buf[32];
	int len, rv;

	if (!id)
		return;
	len = snprintf(buf, sizeof(buf), "w%" PRIu64, s->write_seq);
	rv = raft_propose(s->nodes[id].r, buf, (size_t)len, NULL);
	SIM_CHECK(s, rv == 0 || rv == MC_ENOT_LEADER || rv == -EBUSY, "propose: %d", rv);
	if (rv == 0) {
		if (s->write_seq >= s->cap_acked) {
			size_t cap = s->cap_acked ? 2 * s->cap_acked : 1024;

			s->acked = realloc(s->acked, cap);
			cr_assert(s->acked);
			memset(s->acked + s->cap_acked, 0, cap - s->cap_acked);
			s->cap_acked = cap;
		}
		s->write_seq++;
	}
	maybe_drain(s, id);
}

static void act_read(struct sim *s)
{
	uint64_t id = random_up(s);
	char buf[32];
	int len, rv;

	if (!id)
		return;
	len = snprintf(buf, sizeof(buf), "r%zu", s->n_reads);
	rv = raft_read_index(s->nodes[id].r, buf, (size_t)len);
	SIM_CHECK(s, rv == 0 || rv == MC_ENOT_LEADER, "read_index: %d", rv);
	if (rv == 0) {
		if (s->n_reads == s->cap_reads) {
			s->cap_reads = s->cap_reads ? 2 * s->cap_reads : 256;
			s->reads = realloc(s->reads, s->cap_reads * sizeof(*s->reads));
			cr_assert(s->reads);
		}
		s->reads[s->n_reads].node = id;
		s->reads[s->n_reads].required = s->max_acked;
		s->reads[s->n_reads].done = false;
		s->n_reads++;
	}
	maybe_drain(s, id);
}

static size_t count_up_voters(struct sim *s, const struct raft_conf_state *cs)
{
	size_t n = 0;

	for (size_t k = 0; k < cs->n_voters; k++)
		if (cs->voters[k] <= MAXID && s->nodes[cs->voters[k]].state == NODE_UP)
			n++;
	return n;
}

static void act_conf(struct sim *s)
{
	uint64_t l = find_leader(s);
	struct raft_conf_change cc = {0};
	struct raft_conf_state cs;
	size_t min_voters = s->n == 3 ? 2 : 3;
	uint64_t pick = below(s, 100);
	int rv;

	if (!l)
		return;
	cs = raft_conf(s->nodes[l].r);
	(void)count_up_voters;
	if (pick < 30 && s->next_id <= MAXID) {
		cc.type = chance(s, 0.7) ? RAFT_CC_ADD_LEARNER : RAFT_CC_ADD_VOTER;
		cc.node_id = s->next_id;
		cc.context = "addr";
		cc.context_len = 4;
	} else if (pick < 55 && cs.n_learners) {
		cc.type = RAFT_CC_PROMOTE;
		cc.node_id = cs.learners[below(s, cs.n_learners)];
	} else if (pick < 70 && cs.n_learners) {
		cc.type = RAFT_CC_REMOVE;
		cc.node_id = cs.learners[below(s, cs.n_learners)];
	} else if (cs.n_voters > min_voters) {
		cc.type = RAFT_CC_REMOVE;
		cc.node_id = pick < 80 ? l : cs.voters[below(s, cs.n_voters)];
	} else {
		return;
	}
	rv = raft_propose_conf_change(s->nodes[l].r, &cc, NULL);
	SIM_CHECK(s,
		  rv == 0 || rv == -EAGAIN || rv == -EBUSY || rv == -EEXIST || rv == -ENOENT ||
			  rv == MC_ENOT_LEADER,
		  "conf change: %d", rv);
	if (rv == 0) {
		s->n_confs++;
		say(s, "leader %" PRIu64 " proposes conf change type %d node %" PRIu64, l,
		    cc.type, cc.node_id);
		if (cc.type == RAFT_CC_ADD_LEARNER || cc.type == RAFT_CC_ADD_VOTER) {
			s->next_id++;
			node_start(s,
				   cc.node_id); /* empty: learns everything from the leader */
		}
	}
	maybe_drain(s, l);
}

static void act_transfer(struct sim *s)
{
	uint64_t l = find_leader(s);
	struct raft_conf_state cs;
	uint64_t to;
	int rv;

	if (!l)
		return;
	cs = raft_conf(s->nodes[l].r);
	if (cs.n_voters < 2)
		return;
	to = cs.voters[below(s, cs.n_voters)];
	if (to == l)
		return;
	rv = raft_transfer_leader(s->nodes[l].r, to);
	SIM_CHECK(s, rv == 0, "transfer_leader: %d", rv);
	s->n_transfers++;
	say(s, "leader %" PRIu64 " transfers to %" PRIu64, l, to);
	maybe_drain(s, l);
}

static void act_compact(struct sim *s)
{
	uint64_t id = random_up(s);
	struct sim_node *n;
	struct raft_status st;
	const struct raft_snapshot_meta *meta;
	int rv;

	if (!id)
		return;
	n = &s->nodes[id];
	drain(s, id); /* the application snapshots between readies */
	if (n->state != NODE_UP)
		return;
	raft_status(n->r, &st, NULL, 0);
	if (st.applied <= st.snapshot_index + 2 || n->sm_applied != st.applied)
		return;
	/* The snapshot data is made durable first, then the core is told. */
	rv = raft_compact(n->r, st.applied);
	SIM_CHECK(s, rv == 0, "compact: %d", rv);
	meta = raft_last_snapshot(n->r);
	SIM_CHECK(s, meta->index == st.applied, "snapshot index");
	SIM_CHECK(s,
		  !s->committed[meta->index].set ||
			  s->committed[meta->index].term == meta->term,
		  "snapshot term");
	tu_disk_compact(&n->disk, meta);
	n->disk_snap_hash = n->sm_hash;
	s->n_compactions++;
	say(s, "node %" PRIu64 " snapshots at %" PRIu64, id, meta->index);
}

static void act_partition(struct sim *s)
{
	uint64_t kind = below(s, 3);

	memset(s->cut, 0, sizeof(s->cut));
	if (kind == 0) { /* isolate one node, often the leader */
		uint64_t v = chance(s, 0.5) ? find_leader(s) : 0;

		if (!v)
			v = 1 + below(s, s->next_id - 1);

		for (uint64_t o = 1; o <= MAXID; o++)
			s->cut[v][o] = s->cut[o][v] = o != v;
		say(s, "partition: %" PRIu64 " isolated", v);
	} else if (kind == 1) { /* two random groups */
		bool side[MAXID + 1];

		for (uint64_t id = 1; id <= MAXID; id++)
			side[id] = chance(s, 0.5);
		for (uint64_t a = 1; a <= MAXID; a++)
			for (uint64_t b = 1; b <= MAXID; b++)
				s->cut[a][b] = side[a] != side[b];
		say(s, "partition: split in two");
	} else { /* asymmetric: some directed links fail */
		for (int k = 0; k < 1 + (int)below(s, 4); k++) {
			uint64_t a = 1 + below(s, s->next_id - 1),
				 b = 1 + below(s, s->next_id - 1);

			if (a != b)
				s->cut[a][b] = true;
		}
		say(s, "partition: asymmetric links");
	}
}

static void act_crash(struct sim *s)
{
	/* Leader churn makes divergent logs (Figure 8 needs them). */
	uint64_t id = chance(s, 0.5) ? find_leader(s) : random_up(s);

	if (id)
		node_crash(s, id, "at random");
}

static void act_restart(struct sim *s)
{
	uint64_t ids[MAXID];
	size_t n = 0;

	for (uint64_t id = 1; id <= MAXID; id++)
		if (s->nodes[id].state == NODE_DOWN)
			ids[n++] = id;
	if (n) {
		uint64_t id = ids[below(s, n)];

		node_start(s, id);
		maybe_drain(s, id);
	}
}

static void act_decommission(struct sim *s)
{
	/* The operator shuts down a node whose removal is committed. */
	for (uint64_t id = 1; id <= MAXID; id++) {
		struct sim_node *n = &s->nodes[id];

		if (n->removed && n->state != NODE_GONE && n->state != NODE_NONE) {
			if (n->state == NODE_UP) {
				raft_free(n->r);
				n->r = NULL;
			}
			n->state = NODE_GONE;
			say(s, "node %" PRIu64 " decommissioned", id);
			return;
		}
	}
}

static void one_step(struct sim *s)
{
	size_t k = pick_msg(s);
	uint64_t a;

	/* Alternate calm and stormy phases so that the cluster both makes
	 * progress and gets hit while doing so. */
	if (s->step >= s->phase_end) {
		s->storm = !s->storm;
		s->phase_end = s->step + 100 + (long)below(s, 700);
		if (!s->storm)
			memset(s->cut, 0, sizeof(s->cut));
		say(s, "%s phase until step %ld", s->storm ? "storm" : "calm", s->phase_end);
	}
	s->max_backlog = MC_MAX(s->max_backlog, s->n_net);
	if (k != SIZE_MAX && chance(s, 0.9)) {
		deliver(s, k);
		s->n_delivered++;
		return;
	}
	a = below(s, 1000);
	if (a < 430) {
		tick_all(s);
	} else if (a < 630) {
		act_write(s);
	} else if (a < 730) {
		act_read(s);
	} else if (a < 760) {
		if (s->storm && chance(s, s->w_crash))
			act_crash(s);
	} else if (a < 790) {
		act_restart(s);
	} else if (a < 820) {
		if (s->storm && chance(s, s->w_part))
			act_partition(s);
	} else if (a < 835) {
		memset(s->cut, 0, sizeof(s->cut));
	} else if (a < 885) {
		if (chance(s, s->w_conf))
			act_conf(s);
	} else if (a < 910) {
		act_transfer(s);
	} else if (a < 950) {
		act_compact(s);
	} else if (a < 960) {
		act_decommission(s);
	} else if (a < 980) {
		uint64_t id = random_up(s);

		if (id) {
			s->nodes[id].slow = !s->nodes[id].slow;
			if (!s->nodes[id].slow)
				drain(s, id);
		}
	} else {
		tick_all(s);
	}
	/* Slow disks catch up now and then. */
	for (uint64_t id = 1; id <= MAXID; id++)
		if (s->nodes[id].state == NODE_UP && s->nodes[id].slow && chance(s, 0.2))
			drain(s, id);
}

/* Heal everything; a leader must appear and a write commit in time. */
static void check_liveness(struct sim *s)
{
	uint64_t start = s->now, first_seq = s->write_seq;
	bool done = false;

	s->liveness = true;
	s->storm = false;
	memset(s->cut, 0, sizeof(s->cut));
	for (uint64_t id = 1; id <= MAXID; id++) {
		if (s->nodes[id].state == NODE_DOWN)
			node_start(s, id);
		s->nodes[id].slow = false;
	}
	for (uint64_t id = 1; id <= MAXID; id++)
		drain(s, id);
	while (!done) {
		size_t k, guard = 0;
		uint64_t l;

		SIM_CHECK(
			s, s->now - start < LIVENESS_TICKS,
			"liveness: no leader committed a new write within %d ticks after healing",
			LIVENESS_TICKS);
		while ((k = pick_msg(s)) != SIZE_MAX) {
			deliver(s, k);
			SIM_CHECK(s, ++guard < 1000000, "liveness: message storm");
		}
		tick_all(s);
		s->step++;
		l = find_leader(s);
		if (l && (s->now - start) % 5 == 0)
			act_write(s); /* retried: a leader change may drop it */
		for (uint64_t q = first_seq; q < s->write_seq; q++)
			if (s->acked[q])
				done = true;
	}
	s->liveness_ticks_max = MC_MAX(s->liveness_ticks_max, s->now - start);
	s->liveness = false;
	s->phase_end = s->step; /* a new phase starts */
}

static void sim_free(struct sim *s)
{
	for (uint64_t id = 0; id <= MAXID; id++) {
		struct sim_node *n = &s->nodes[id];

		raft_free(n->r);
		tu_disk_free(&n->disk);
		for (size_t k = 0; k < n->n_ops; k++)
			op_free(&n->ops[k]);
		free(n->ops);
	}
	for (size_t k = 0; k < s->n_net; k++)
		tu_msg_free(&s->net[k].m);
	free(s->net);
	free(s->leader_of_term);
	free(s->reg);
	free(s->committed);
	free(s->applied);
	free(s->acked);
	free(s->reads);
	free(s);
}

static void run_seed(uint64_t seed, int n, long steps, bool trace, struct sim *totals)
{
	static const double losses[] = {0, 0.01, 0.05, 0.15};
	static const double dups[] = {0, 0.02, 0.1};
	static const uint64_t trailings[] = {0, 3, 50};
	struct sim *s = calloc(1, sizeof(*s));
	uint64_t voters[5];

	cr_assert(s);
	s->seed = seed;
	s->rng = seed * 0x2545F4914F6CDD1Dull + (uint64_t)n;
	s->n = n;
	s->steps = steps;
	s->trace = trace;
	s->p_loss = losses[below(s, 4)];
	s->p_dup = dups[below(s, 3)];
	s->p_long_delay = chance(s, 0.5) ? 0.02 : 0;
	s->max_delay = (unsigned)below(s, 3);
	s->w_crash = chance(s, 0.3) ? 0.3 : 1.0;
	s->w_part = chance(s, 0.3) ? 0.3 : 1.0;
	s->w_conf = chance(s, 0.3) ? 0.3 : 1.0;
	s->p_crash_mid = chance(s, 0.5) ? 0.003 : 0.0;
	s->trailing = trailings[below(s, 3)];
	s->next_id = (uint64_t)n + 1;
	grow_idx(s, 64);
	for (int k = 0; k < n; k++)
		voters[k] = (uint64_t)k + 1;
	say(s,
	    "seed %" PRIu64 ": n=%d loss=%.2f dup=%.2f delay=%u crash=%.1f part=%.1f "
	    "conf=%.1f torn=%.3f trailing=%" PRIu64,
	    seed, n, s->p_loss, s->p_dup, s->max_delay, s->w_crash, s->w_part, s->w_conf,
	    s->p_crash_mid, s->trailing);
	for (uint64_t id = 1; id <= (uint64_t)n; id++) {
		node_start(s, id);
		SIM_CHECK(s, raft_bootstrap(s->nodes[id].r, voters, (size_t)n) == 0,
			  "bootstrap");
		drain(s, id);
	}
	for (s->step = 0; s->step < steps; s->step++) {
		one_step(s);
		if (s->step % 200 == 199)
			check_logs_pairwise(s);
		if (s->step == steps / 2)
			check_liveness(s);
	}
	check_logs_pairwise(s);
	check_liveness(s);
	check_logs_pairwise(s);
	totals->n_leaders += s->n_leaders;
	totals->n_crashes += s->n_crashes;
	totals->n_snaps_installed += s->n_snaps_installed;
	totals->n_confs += s->n_confs;
	totals->n_reads_ok += s->n_reads_ok;
	totals->n_writes_acked += s->n_writes_acked;
	totals->n_compactions += s->n_compactions;
	totals->n_transfers += s->n_transfers;
	totals->n_delivered += s->n_delivered;
	totals->now += s->now;
	totals->max_backlog = MC_MAX(totals->max_backlog, s->max_backlog);
	totals->liveness_ticks_max = MC_MAX(totals->liveness_ticks_max, s->liveness_ticks_max);
	sim_free(s);
}

static long env_long(const char *name, long def)
{
	const char *v = getenv(name);

	return v && *v ? strtol(v, NULL, 10) : def;
}

/* Run seeds [first, first + count) of cluster size n (or the one seed
 * named in RAFT_SIM_SEED, if it is for this size). */
static void run_range(int n, uint64_t first, uint64_t count)
{
	long steps = env_long("RAFT_SIM_STEPS", DEFAULT_STEPS);
	long one = env_long("RAFT_SIM_SEED", -1);
	long seeds = env_long("RAFT_SIM_SEEDS", (long)count);
	struct sim totals;

	memset(&totals, 0, sizeof(totals));
	if (one >= 0) {
		if (env_long("RAFT_SIM_N", 3) != n || first != 1)
			return;
		run_seed((uint64_t)one, n, steps, env_long("RAFT_SIM_TRACE", 0) != 0, &totals);
		return;
	}
	/* With RAFT_SIM_SEEDS each test runs that many seeds of its own range. */
	first = 1 + (first - 1) / count * (uint64_t)seeds;
	for (uint64_t seed = first; seed < first + (uint64_t)seeds; seed++)
		run_seed(seed, n, steps, false, &totals);
	cr_log_info(
		"n=%d seeds %" PRIu64 "..%" PRIu64 " x %ld steps: %" PRIu64 " ticks, %zu "
		"messages, %zu leaders, %zu crashes, %zu conf changes, %zu transfers, %zu "
		"snapshots installed, %zu compactions, %zu writes acked, %zu reads checked, "
		"liveness <= %" PRIu64 " ticks, backlog <= %zu",
		n, first, first + (uint64_t)seeds - 1, steps, totals.now, totals.n_delivered,
		totals.n_leaders, totals.n_crashes, totals.n_confs, totals.n_transfers,
		totals.n_snaps_installed, totals.n_compactions, totals.n_writes_acked,
		totals.n_reads_ok, totals.liveness_ticks_max, totals.max_backlog);
	cr_assert(totals.n_leaders > 0);
}

RTEST(raft_sim, three_nodes_a, .timeout = 600)
{
	run_range(3, 1, DEFAULT_SEEDS);
}

RTEST(raft_sim, three_nodes_b, .timeout = 600)
{
	run_range(3, 1 + DEFAULT_SEEDS, DEFAULT_SEEDS);
}

RTEST(raft_sim, five_nodes_a, .timeout = 600)
{
	run_range(5, 1, DEFAULT_SEEDS);
}

RTEST(raft_sim, five_nodes_b, .timeout = 600)
{
	run_range(5, 1 + DEFAULT_SEEDS, DEFAULT_SEEDS);
}
