/*
 * test_raft: unit tests of the Raft core, one group per feature, in the
 * style of etcd's raft_test.go, plus golden traces (messages fed by hand,
 * exact outputs checked).
 *
 * The harness `tnet` is a synchronous network of cores: a FIFO of deep
 * copied messages, links that can be cut (per direction), message types
 * that can be dropped, an in-memory disk per node. net_stabilize() delivers
 * until nothing is left, handling every ready in the contract's order.
 */
#include <criterion/criterion.h>
#include <errno.h>

#include "common/util.h"
#include "test_raft_util.h"

#define MAXN 8
#define ET 10

struct tapplied {
	uint64_t index;
	uint64_t term;
	enum raft_entry_type type;
	char *data;
	size_t len;
};

struct tnode {
	struct raft *r;
	struct tu_disk disk;
	struct tapplied *app;
	size_t n_app, cap_app;
	struct raft_read_state *rs;
	size_t n_rs, cap_rs;
	int n_snap_installs;
	uint64_t snap_installed;
};

struct tnet {
	struct tnode nodes[MAXN + 1];
	struct raft_msg *q;
	size_t head, nq, capq;
	bool cut[MAXN + 1][MAXN + 1];
	unsigned drop_types; /* bit per enum raft_msg_type */
	void (*tweak)(struct raft_config *);
	/* delivered messages in text form when recording */
	bool record;
	char lines[512][160];
	size_t n_lines;
	size_t sent[16]; /* messages enqueued, by type */
	size_t rejects;  /* rejected APP_RESP delivered */
	/* snapshot failures to report once the sender's ready is advanced */
	uint64_t snap_fail_from[64], snap_fail_to[64];
	size_t n_snap_fail;
};

static struct tnet *net_alloc(void (*tweak)(struct raft_config *))
{
	struct tnet *net = calloc(1, sizeof(*net));

	cr_assert(net);
	net->tweak = tweak;
	return net;
}

static struct raft_config node_config(struct tnet *net, uint64_t id)
{
	struct raft_config c;

	raft_config_init(&c, id);
	c.election_ticks = ET;
	c.heartbeat_ticks = 1;
	if (net->tweak)
		net->tweak(&c);
	return c;
}

/* Start (or restart from its disk) node id. */
static void node_start(struct tnet *net, uint64_t id, const struct raft_restore *rs)
{
	struct raft_config c = node_config(net, id);
	int rv = raft_new(&c, rs, &net->nodes[id].r);

	cr_assert_eq(rv, 0, "raft_new(%" PRIu64 ") = %d", id, rv);
}

static void node_restart(struct tnet *net, uint64_t id)
{
	struct raft_restore rs = tu_disk_restore(&net->nodes[id].disk);

	raft_free(net->nodes[id].r);
	net->nodes[id].r = NULL;
	node_start(net, id, &rs);
}

/* A cluster whose members are given by a conf at index 0 (empty logs). */
static struct tnet *net_new_conf(const uint64_t *voters, size_t nv, const uint64_t *learners,
				 size_t nl, void (*tweak)(struct raft_config *))
{
	struct tnet *net = net_alloc(tweak);
	struct raft_restore rs;

	memset(&rs, 0, sizeof(rs));
	rs.snapshot.conf.voters = voters;
	rs.snapshot.conf.n_voters = nv;
	rs.snapshot.conf.learners = learners;
	rs.snapshot.conf.n_learners = nl;
	for (size_t k = 0; k < nv; k++) {
		node_start(net, voters[k], &rs);
		tu_conf_dup(&net->nodes[voters[k]].disk.snap.conf, &rs.snapshot.conf);
	}
	for (size_t k = 0; k < nl; k++) {
		node_start(net, learners[k], &rs);
		tu_conf_dup(&net->nodes[learners[k]].disk.snap.conf, &rs.snapshot.conf);
	}
	return net;
}

static const uint64_t ids5[] = {1, 2, 3, 4, 5, 6, 7, 8};

static struct tnet *net_new(size_t n, void (*tweak)(struct raft_config *))
{
	return net_new_conf(ids5, n, NULL, 0, tweak);
}

/* A node with a given log (term per index 1..n), hard state term, commit. */
static void node_with_log(struct tnet *net, uint64_t id, const uint64_t *terms, size_t n,
			  uint64_t term, uint64_t commit, const uint64_t *voters, size_t nv)
{
	struct raft_entry ents[64];
	struct raft_restore rs;

	cr_assert(n <= 64);
	memset(&rs, 0, sizeof(rs));
	for (size_t k = 0; k < n; k++) {
		ents[k].index = k + 1;
		ents[k].term = terms[k];
		ents[k].type = RAFT_ENTRY_NORMAL;
		ents[k].data = NULL;
		ents[k].len = 0;
	}
	rs.hard_state.term = term;
	rs.hard_state.commit = commit;
	rs.snapshot.conf.voters = voters;
	rs.snapshot.conf.n_voters = nv;
	rs.entries = ents;
	rs.n_entries = n;
	node_start(net, id, &rs);
	net->nodes[id].disk.hs = rs.hard_state;
	tu_conf_dup(&net->nodes[id].disk.snap.conf, &rs.snapshot.conf);
	tu_disk_append(&net->nodes[id].disk, ents, n);
}

static void net_free(struct tnet *net)
{
	for (size_t id = 0; id <= MAXN; id++) {
		struct tnode *n = &net->nodes[id];

		raft_free(n->r);
		tu_disk_free(&n->disk);
		for (size_t k = 0; k < n->n_app; k++)
			free(n->app[k].data);
		free(n->app);
		for (size_t k = 0; k < n->n_rs; k++)
			free((void *)n->rs[k].ctx);
		free(n->rs);
	}
	for (size_t k = net->head; k < net->nq; k++)
		tu_msg_free(&net->q[k]);
	free(net->q);
	free(net);
}

static void net_enqueue(struct tnet *net, const struct raft_msg *m)
{
	net->sent[m->type]++;
	if (net->cut[m->from][m->to] || (net->drop_types & (1u << m->type))) {
		if (m->type == RAFT_MSG_SNAP && net->n_snap_fail < 64) {
			net->snap_fail_from[net->n_snap_fail] = m->from;
			net->snap_fail_to[net->n_snap_fail++] = m->to;
		}
		return;
	}
	if (net->nq == net->capq) {
		net->capq = net->capq ? 2 * net->capq : 64;
		net->q = realloc(net->q, net->capq * sizeof(*net->q));
		cr_assert(net->q);
	}
	tu_msg_dup(&net->q[net->nq++], m);
}

/* Handle every ready of node id (contract order: persist, send, apply). */
static void net_drain(struct tnet *net, uint64_t id)
{
	struct tnode *n = &net->nodes[id];

	while (n->r && raft_has_ready(n->r)) {
		struct raft_ready rd;

		cr_assert_eq(raft_ready(n->r, &rd), 0);
		tu_disk_write(&n->disk, &rd);
		if (rd.snapshot) {
			n->n_snap_installs++;
			n->snap_installed = rd.snapshot->index;
		}
		for (size_t k = 0; k < rd.n_msgs; k++)
			net_enqueue(net, &rd.msgs[k]);
		for (size_t k = 0; k < rd.n_committed; k++) {
			const struct raft_entry *e = &rd.committed[k];

			if (n->n_app == n->cap_app) {
				n->cap_app = n->cap_app ? 2 * n->cap_app : 32;
				n->app = realloc(n->app, n->cap_app * sizeof(*n->app));
			}
			n->app[n->n_app].index = e->index;
			n->app[n->n_app].term = e->term;
			n->app[n->n_app].type = e->type;
			n->app[n->n_app].data = tu_dup(e->data, e->len);
			n->app[n->n_app].len = e->len;
			n->n_app++;
		}
		for (size_t k = 0; k < rd.n_read_states; k++) {
			if (n->n_rs == n->cap_rs) {
				n->cap_rs = n->cap_rs ? 2 * n->cap_rs : 8;
				n->rs = realloc(n->rs, n->cap_rs * sizeof(*n->rs));
			}
			n->rs[n->n_rs] = rd.read_states[k];
			n->rs[n->n_rs].ctx = tu_dup(rd.read_states[k].ctx,
						    rd.read_states[k].ctx_len);
			n->n_rs++;
		}
		cr_assert_eq(raft_advance(n->r, &rd), 0);
		/* The transport reports failed snapshots after the ready. */
		for (size_t k = 0; k < net->n_snap_fail; k++)
			if (net->snap_fail_from[k] == id)
				cr_assert_eq(raft_report_snapshot(n->r, net->snap_fail_to[k],
								  false),
					     0);
		net->n_snap_fail = 0;
	}
}

static void net_drain_all(struct tnet *net)
{
	for (uint64_t id = 1; id <= MAXN; id++)
		net_drain(net, id);
}

static void net_deliver(struct tnet *net, struct raft_msg *m)
{
	struct tnode *to = &net->nodes[m->to];
	int rv;

	if (!to->r || net->cut[m->from][m->to])
		return;
	if (net->record && net->n_lines < 512)
		tu_fmt_msg(net->lines[net->n_lines++], 160, m);
	if (m->type == RAFT_MSG_APP_RESP && m->reject)
		net->rejects++;
	rv = raft_step(to->r, m);
	cr_assert_eq(rv, 0, "step %s into %" PRIu64 ": %d", raft_msg_type_name(m->type), m->to,
		     rv);
	if (m->type == RAFT_MSG_SNAP && net->nodes[m->from].r) {
		net_drain(net, m->from);
		cr_assert_eq(raft_report_snapshot(net->nodes[m->from].r, m->to, true), 0);
	}
}

/* Deliver until quiet; returns the number of messages delivered. */
static size_t net_stabilize(struct tnet *net)
{
	size_t delivered = 0;

	for (;;) {
		struct raft_msg m;

		net_drain_all(net);
		if (net->head == net->nq) {
			net->head = net->nq = 0;
			return delivered;
		}
		m = net->q[net->head++];
		net_deliver(net, &m);
		tu_msg_free(&m);
		cr_assert(++delivered < 1000000, "network does not settle");
	}
}

static void net_tick(struct tnet *net, uint64_t id, int times)
{
	for (int k = 0; k < times; k++) {
		cr_assert_eq(raft_tick(net->nodes[id].r), 0);
		net_drain(net, id);
	}
}

/* Tick every node once, then settle the network; `rounds` times. */
static void net_tick_all(struct tnet *net, int rounds)
{
	for (int k = 0; k < rounds; k++) {
		for (uint64_t id = 1; id <= MAXN; id++)
			if (net->nodes[id].r)
				net_tick(net, id, 1);
		net_stabilize(net);
	}
}

static void net_isolate(struct tnet *net, uint64_t id)
{
	for (uint64_t o = 0; o <= MAXN; o++)
		if (o != id)
			net->cut[id][o] = net->cut[o][id] = true;
}

static void net_heal(struct tnet *net)
{
	memset(net->cut, 0, sizeof(net->cut));
	net->drop_types = 0;
}

static struct raft_status st_of(struct tnet *net, uint64_t id)
{
	struct raft_status st;

	raft_status(net->nodes[id].r, &st, NULL, 0);
	return st;
}

static void campaign(struct tnet *net, uint64_t id)
{
	cr_assert_eq(raft_campaign(net->nodes[id].r), 0);
	net_drain(net, id);
	net_stabilize(net);
}

static uint64_t propose(struct tnet *net, uint64_t id, const char *s)
{
	uint64_t idx = 0;
	int rv = raft_propose(net->nodes[id].r, s, strlen(s), &idx);

	cr_assert_eq(rv, 0, "propose on %" PRIu64 ": %d", id, rv);
	net_drain(net, id);
	return idx;
}

static int conf_change(struct tnet *net, uint64_t leader, enum raft_conf_change_type t,
		       uint64_t node)
{
	struct raft_conf_change cc = {.type = t, .node_id = node};
	int rv = raft_propose_conf_change(net->nodes[leader].r, &cc, NULL);

	net_drain(net, leader);
	return rv;
}

static bool applied_has(struct tnet *net, uint64_t id, const char *s)
{
	struct tnode *n = &net->nodes[id];

	for (size_t k = 0; k < n->n_app; k++)
		if (n->app[k].len == strlen(s) &&
		    memcmp(n->app[k].data, s, n->app[k].len) == 0)
			return true;
	return false;
}

static void assert_logs_equal(struct tnet *net, uint64_t a, uint64_t b)
{
	struct raft_status sa = st_of(net, a), sb = st_of(net, b);

	cr_assert_eq(sa.last_index, sb.last_index, "last index %" PRIu64 " vs %" PRIu64,
		     sa.last_index, sb.last_index);
	for (uint64_t i = 1; i <= sa.last_index; i++) {
		uint64_t ta, tb;

		if (raft_term_at(net->nodes[a].r, i, &ta) ||
		    raft_term_at(net->nodes[b].r, i, &tb))
			continue;
		cr_assert_eq(ta, tb, "term at %" PRIu64 ": %" PRIu64 " vs %" PRIu64, i, ta,
			     tb);
	}
}

static void no_pre_vote(struct raft_config *c)
{
	c->pre_vote = false;
}

static void no_pre_vote_no_cq(struct raft_config *c)
{
	c->pre_vote = false;
	c->check_quorum = false;
}

/* ============================================================ election */

RTEST(raft_election, three_nodes_elect_one_leader)
{
	struct tnet *net = net_new(3, NULL);

	campaign(net, 1);
	for (uint64_t id = 1; id <= 3; id++) {
		struct raft_status st = st_of(net, id);

		cr_assert_eq(st.term, 1);
		cr_assert_eq(st.leader, 1);
		cr_assert_eq(st.commit, 1, "the leader's empty entry commits");
		cr_assert_eq(st.role, id == 1 ? RAFT_LEADER : RAFT_FOLLOWER);
	}
	cr_assert_eq(st_of(net, 2).vote, 1);
	net_free(net);
}

RTEST(raft_election, timeout_is_randomized_in_et_2et)
{
	bool seen[2 * ET] = {false};
	size_t distinct = 0;

	for (uint64_t seed = 1; seed <= 200; seed++) {
		struct raft_config c;
		struct raft *r;
		uint64_t voters[] = {1, 2, 3};
		struct raft_restore rs = {.snapshot.conf = {.voters = voters, .n_voters = 3}};
		int ticks = 0;
		struct raft_status st;

		raft_config_init(&c, 1);
		c.election_ticks = ET;
		c.seed = seed;
		cr_assert_eq(raft_new(&c, &rs, &r), 0);
		do {
			cr_assert_eq(raft_tick(r), 0);
			ticks++;
			raft_status(r, &st, NULL, 0);
		} while (st.role == RAFT_FOLLOWER && ticks < 100);
		cr_assert_eq(st.role, RAFT_PRE_CANDIDATE);
		cr_assert(ticks >= ET && ticks < 2 * ET, "timeout %d", ticks);
		if (!seen[ticks]) {
			seen[ticks] = true;
			distinct++;
		}
		raft_free(r);
	}
	cr_assert(distinct >= ET / 2, "only %zu distinct timeouts", distinct);
}

RTEST(raft_election, single_node_elects_itself)
{
	struct tnet *net = net_new(1, NULL);

	net_tick_all(net, 2 * ET);
	cr_assert_eq(st_of(net, 1).role, RAFT_LEADER);
	cr_assert_eq(st_of(net, 1).commit, 1);
	propose(net, 1, "x");
	cr_assert(applied_has(net, 1, "x"));
	net_free(net);
}

RTEST(raft_election, needs_a_quorum)
{
	struct tnet *net = net_new(3, no_pre_vote);

	net_isolate(net, 1);
	campaign(net, 1);
	cr_assert_eq(st_of(net, 1).role, RAFT_CANDIDATE);
	cr_assert_eq(st_of(net, 1).term, 1);
	/* One other node is enough. */
	net_heal(net);
	net_isolate(net, 3);
	campaign(net, 1);
	cr_assert_eq(st_of(net, 1).role, RAFT_LEADER);
	cr_assert_eq(st_of(net, 1).term, 2);
	net_free(net);
}

RTEST(raft_election, restriction_up_to_date_log_wins)
{
	struct tnet *net = net_alloc(no_pre_vote);
	uint64_t v[] = {1, 2, 3};
	uint64_t shorter[] = {1}, longer[] = {1, 1};

	node_with_log(net, 1, shorter, 1, 1, 1, v, 3);
	node_with_log(net, 2, longer, 2, 1, 1, v, 3);
	node_with_log(net, 3, longer, 2, 1, 1, v, 3);
	campaign(net, 1);
	cr_assert_neq(st_of(net, 1).role, RAFT_LEADER, "a stale log cannot win");
	campaign(net, 2);
	cr_assert_eq(st_of(net, 2).role, RAFT_LEADER);
	net_stabilize(net);
	assert_logs_equal(net, 1, 2);
	net_free(net);
}

RTEST(raft_election, vote_is_persisted_before_response)
{
	struct tnet *net = net_new(3, no_pre_vote);

	campaign(net, 1);
	/* Every follower's disk holds its vote. */
	cr_assert_eq(net->nodes[2].disk.hs.vote, 1);
	cr_assert_eq(net->nodes[3].disk.hs.vote, 1);
	cr_assert_eq(net->nodes[2].disk.hs.term, 1);
	net_free(net);
}

RTEST(raft_election, one_vote_per_term)
{
	struct raft_config c;
	struct raft *r;
	uint64_t v[] = {1, 2, 3};
	struct raft_restore rs = {.snapshot.conf = {.voters = v, .n_voters = 3}};
	struct raft_msg m = {.type = RAFT_MSG_VOTE, .from = 2, .to = 1, .term = 1};
	struct raft_ready rd;

	raft_config_init(&c, 1);
	cr_assert_eq(raft_new(&c, &rs, &r), 0);
	cr_assert_eq(raft_step(r, &m), 0);
	m.from = 3;
	cr_assert_eq(raft_step(r, &m), 0);
	cr_assert_eq(raft_ready(r, &rd), 0);
	cr_assert_eq(rd.n_msgs, 2);
	cr_assert_eq(rd.msgs[0].reject, false);
	cr_assert_eq(rd.msgs[1].reject, true, "second candidate in the same term is refused");
	cr_assert_eq(rd.hard_state.vote, 2);
	cr_assert_eq(raft_advance(r, &rd), 0);
	raft_free(r);
}

/* ============================================================= prevote */

RTEST(raft_prevote, partitioned_node_does_not_disrupt_on_rejoin)
{
	struct tnet *net = net_new(3, NULL);

	campaign(net, 1);
	net_isolate(net, 3);
	for (int k = 0; k < 10 * ET; k++) {
		net_tick(net, 3, 1);
		net_tick(net, 1, 1);
		net_tick(net, 2, 1);
		net_stabilize(net);
	}
	cr_assert_eq(st_of(net, 3).term, 1, "pre-vote keeps the term");
	cr_assert_eq(st_of(net, 3).role, RAFT_PRE_CANDIDATE);
	propose(net, 1, "while-partitioned");
	net_stabilize(net);
	net_heal(net);
	net_tick_all(net, 3 * ET);
	cr_assert_eq(st_of(net, 1).role, RAFT_LEADER);
	cr_assert_eq(st_of(net, 1).term, 1, "leader not disturbed");
	cr_assert_eq(st_of(net, 3).leader, 1);
	cr_assert(applied_has(net, 3, "while-partitioned"));
	net_free(net);
}

RTEST(raft_prevote, without_prevote_rejoin_bumps_the_term)
{
	struct tnet *net = net_new(3, no_pre_vote_no_cq);

	campaign(net, 1);
	net_isolate(net, 3);
	net_tick(net, 3, 5 * ET);
	cr_assert(st_of(net, 3).term > 1);
	net_heal(net);
	net_tick_all(net, 3 * ET);
	cr_assert(st_of(net, 1).term > 1, "the cluster had to move to a new term");
	net_free(net);
}

RTEST(raft_prevote, grant_changes_neither_term_nor_vote)
{
	struct raft_config c;
	struct raft *r;
	uint64_t v[] = {1, 2, 3};
	struct raft_restore rs = {.hard_state = {.term = 2, .vote = 3},
				  .snapshot.conf = {.voters = v, .n_voters = 3}};
	struct raft_msg m = {.type = RAFT_MSG_PREVOTE, .from = 2, .to = 1, .term = 3};
	struct raft_ready rd;
	struct raft_status st;

	raft_config_init(&c, 1);
	cr_assert_eq(raft_new(&c, &rs, &r), 0);
	cr_assert_eq(raft_step(r, &m), 0);
	raft_status(r, &st, NULL, 0);
	cr_assert_eq(st.term, 2);
	cr_assert_eq(st.vote, 3);
	cr_assert_eq(raft_ready(r, &rd), 0);
	cr_assert_eq(rd.n_msgs, 1);
	cr_assert_eq(rd.msgs[0].type, RAFT_MSG_PREVOTE_RESP);
	cr_assert_eq(rd.msgs[0].term, 3);
	cr_assert_eq(rd.msgs[0].reject, false);
	cr_assert_eq(rd.hard_state_changed, false);
	cr_assert_eq(raft_advance(r, &rd), 0);
	raft_free(r);
}

/* ======================================================== check quorum */

RTEST(raft_check_quorum, isolated_leader_steps_down)
{
	struct tnet *net = net_new(3, NULL);

	campaign(net, 1);
	net_isolate(net, 1);
	net_tick(net, 1, ET - 1);
	cr_assert_eq(st_of(net, 1).role, RAFT_LEADER);
	net_tick(net, 1, ET + 1);
	cr_assert_eq(st_of(net, 1).role, RAFT_FOLLOWER);
	cr_assert_eq(st_of(net, 1).term, 1);
	cr_assert_eq(raft_propose(net->nodes[1].r, "x", 1, NULL), MC_ENOT_LEADER);
	net_free(net);
}

RTEST(raft_check_quorum, leader_with_quorum_stays)
{
	struct tnet *net = net_new(3, NULL);

	campaign(net, 1);
	net_isolate(net, 3);
	for (int k = 0; k < 5 * ET; k++) {
		net_tick(net, 1, 1);
		net_tick(net, 2, 1);
		net_stabilize(net);
	}
	cr_assert_eq(st_of(net, 1).role, RAFT_LEADER);
	net_free(net);
}

RTEST(raft_check_quorum, followers_with_live_leader_ignore_votes)
{
	struct tnet *net = net_new(3, no_pre_vote);

	campaign(net, 1);
	cr_assert_eq(raft_campaign(net->nodes[3].r), 0);
	net_drain(net, 3);
	net->record = true;
	net_stabilize(net);
	cr_assert_eq(st_of(net, 3).role, RAFT_CANDIDATE);
	cr_assert_eq(st_of(net, 3).term, 2);
	cr_assert_eq(st_of(net, 2).term, 1, "vote inside the lease ignored");
	cr_assert_eq(st_of(net, 1).role, RAFT_LEADER);
	for (size_t k = 0; k < net->n_lines; k++)
		cr_assert(strstr(net->lines[k], "VOTE_RESP") == NULL, "%s", net->lines[k]);
	net_free(net);
}

RTEST(raft_check_quorum, stale_leader_learns_higher_term)
{
	struct tnet *net = net_new(3, NULL);

	campaign(net, 1);
	net_isolate(net, 1);
	/* 2 and 3 elect a new leader after their leases run out. */
	for (int k = 0; k < 4 * ET; k++) {
		net_tick(net, 2, 1);
		net_tick(net, 3, 1);
		net_stabilize(net);
	}
	cr_assert(st_of(net, 2).role == RAFT_LEADER || st_of(net, 3).role == RAFT_LEADER);
	cr_assert_eq(st_of(net, 1).role, RAFT_LEADER, "not ticked: still believes it leads");
	net_heal(net);
	net_tick(net, 1, 1); /* heartbeats at term 1 get a term-2 answer */
	net_stabilize(net);
	cr_assert_eq(st_of(net, 1).role, RAFT_FOLLOWER);
	cr_assert(st_of(net, 1).term >= 2);
	net_free(net);
}

/* ========================================================= replication */

RTEST(raft_replication, proposals_commit_and_apply_everywhere)
{
	struct tnet *net = net_new(3, NULL);
	char buf[16];

	campaign(net, 1);
	for (int k = 0; k < 10; k++) {
		snprintf(buf, sizeof(buf), "v%d", k);
		propose(net, 1, buf);
	}
	net_stabilize(net);
	for (uint64_t id = 1; id <= 3; id++) {
		struct tnode *n = &net->nodes[id];

		cr_assert_eq(n->n_app, 11);
		for (size_t k = 0; k < n->n_app; k++) {
			cr_assert_eq(n->app[k].index, k + 1);
			cr_assert_eq(n->app[k].len, net->nodes[1].app[k].len);
		}
		cr_assert(applied_has(net, id, "v9"));
		cr_assert_eq(n->disk.n, 11, "entries persisted");
	}
	net_free(net);
}

RTEST(raft_replication, follower_cannot_propose)
{
	struct tnet *net = net_new(3, NULL);

	campaign(net, 1);
	cr_assert_eq(raft_propose(net->nodes[2].r, "x", 1, NULL), MC_ENOT_LEADER);
	net_free(net);
}

static void small_batches(struct raft_config *c)
{
	c->max_msg_entries = 3;
	c->max_inflight_msgs = 2;
}

RTEST(raft_replication, batching_and_inflight_window)
{
	struct tnet *net = net_new(3, small_batches);
	struct raft_peer_status ps[4];
	struct raft_status st;
	size_t n;

	campaign(net, 1);
	net->cut[1][2] = true; /* 2 stops receiving, 1 keeps sending */
	for (int k = 0; k < 20; k++)
		propose(net, 1, "e");
	net_stabilize(net);
	n = raft_status(net->nodes[1].r, &st, ps, 4);
	cr_assert_eq(n, 3);
	for (size_t k = 0; k < n; k++) {
		if (ps[k].id != 2)
			continue;
		cr_assert_eq(ps[k].state, RAFT_PROGRESS_REPLICATE);
		cr_assert_eq(ps[k].inflight, 2, "window of 2 APPs");
		cr_assert(ps[k].paused);
	}
	cr_assert_eq(st.commit, 21, "1 and 3 are a quorum");
	/* Heal: 2 catches up in batches of at most 3 entries. */
	net_heal(net);
	net->record = true;
	net_tick_all(net, 3);
	for (size_t k = 0; k < net->n_lines; k++) {
		const char *l = net->lines[k];
		const char *b = strstr(l, "[");

		if (strncmp(l, "1->2 APP ", 9) == 0 && b) {
			size_t commas = 0;

			for (; *b; b++)
				commas += *b == ',';
			cr_assert(commas <= 2, "batch too big: %s", l);
		}
	}
	assert_logs_equal(net, 1, 2);
	cr_assert_eq(st_of(net, 2).commit, 21);
	net_free(net);
}

/* Leader log of etcd's TestLeaderSyncFollowerLog; the followers diverge. */
static const uint64_t lead_log[] = {1, 1, 1, 4, 4, 5, 5, 6, 6, 6};

static void sync_case(const uint64_t *flog, size_t fn)
{
	struct tnet *net = net_alloc(no_pre_vote);
	uint64_t v[] = {1, 2, 3};

	node_with_log(net, 1, lead_log, 10, 7, 0, v, 3);
	node_with_log(net, 2, flog, fn, 7, 0, v, 3);
	node_with_log(net, 3, lead_log, 10, 7, 0, v, 3);
	campaign(net, 1); /* 3 votes for 1; 2 may not */
	cr_assert_eq(st_of(net, 1).role, RAFT_LEADER);
	net_heal(net);
	net_tick_all(net, 2);
	assert_logs_equal(net, 1, 2);
	cr_assert_eq(st_of(net, 2).commit, 11);
	cr_assert(net->rejects <= 3, "fast backtracking took %zu rejections", net->rejects);
	net_free(net);
}

RTEST(raft_replication, backtracking_missing_entries)
{
	static const uint64_t f[] = {1, 1, 1, 4, 4, 5, 5, 6, 6};
	static const uint64_t g[] = {1, 1, 1, 4};

	sync_case(f, 9);
	sync_case(g, 4);
}

RTEST(raft_replication, backtracking_extra_and_divergent_entries)
{
	static const uint64_t extra[] = {1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 6};
	static const uint64_t extra7[] = {1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 7, 7};
	static const uint64_t div4[] = {1, 1, 1, 4, 4, 4, 4};
	static const uint64_t div2[] = {1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3};

	sync_case(extra, 11);
	sync_case(extra7, 12);
	sync_case(div4, 7);
	sync_case(div2, 11);
}

RTEST(raft_replication, restart_from_disk_keeps_state)
{
	struct tnet *net = net_new(3, NULL);

	campaign(net, 1);
	propose(net, 1, "a");
	propose(net, 1, "b");
	net_stabilize(net);
	node_restart(net, 2);
	cr_assert_eq(st_of(net, 2).term, 1);
	cr_assert_eq(st_of(net, 2).last_index, 3);
	cr_assert_eq(st_of(net, 2).commit, 3);
	/* The restarted node re-applies from its (empty) state machine. */
	net_drain(net, 2);
	cr_assert_eq(net->nodes[2].n_app, 3 + 3);
	propose(net, 1, "c");
	net_stabilize(net);
	cr_assert(applied_has(net, 2, "c"));
	net_free(net);
}

/* ========================================================= commit rule */

RTEST(raft_commit, old_term_entries_do_not_commit_by_counting)
{
	/*
	 * Figure 8: 1 leads at term 4 with an entry of term 2 at index 2 that
	 * only 1 and 2 hold. Replicating index 2 to 3 makes it a majority copy,
	 * yet it must stay uncommitted until an entry of term 4 commits.
	 */
	struct tnet *net = net_alloc(no_pre_vote);
	uint64_t v[] = {1, 2, 3, 4, 5};
	uint64_t l12[] = {1, 2}, l3[] = {1}, l45[] = {1, 3};
	struct raft_msg resp = {.type = RAFT_MSG_APP_RESP, .to = 1, .term = 4};
	struct raft_status st;

	node_with_log(net, 1, l12, 2, 3, 1, v, 5);
	node_with_log(net, 2, l12, 2, 3, 1, v, 5);
	node_with_log(net, 3, l3, 1, 3, 1, v, 5);
	node_with_log(net, 4, l45, 2, 3, 1, v, 5);
	node_with_log(net, 5, l45, 2, 3, 1, v, 5);
	net->cut[1][4] = net->cut[1][5] = true;
	net->drop_types = 1u << RAFT_MSG_APP; /* hand-feed the replication */
	campaign(net, 1);
	raft_status(net->nodes[1].r, &st, NULL, 0);
	cr_assert_eq(st.role, RAFT_LEADER);
	cr_assert_eq(st.term, 4);
	cr_assert_eq(st.last_index, 3); /* 3@4, the leader's own entry */
	/* 2 and 3 acknowledge index 2 (term 2): 3 copies of 5, not committed. */
	resp.from = 2;
	resp.index = 2;
	cr_assert_eq(raft_step(net->nodes[1].r, &resp), 0);
	resp.from = 3;
	cr_assert_eq(raft_step(net->nodes[1].r, &resp), 0);
	cr_assert_eq(st_of(net, 1).commit, 1, "term-2 entry must not commit by counting");
	/* Once the term-4 entry is on a majority, both commit. */
	resp.index = 3;
	resp.from = 2;
	cr_assert_eq(raft_step(net->nodes[1].r, &resp), 0);
	cr_assert_eq(st_of(net, 1).commit, 1);
	resp.from = 3;
	cr_assert_eq(raft_step(net->nodes[1].r, &resp), 0);
	cr_assert_eq(st_of(net, 1).commit, 3);
	net_free(net);
}

RTEST(raft_commit, figure8_overwrite_of_uncommitted_old_entry)
{
	/*
	 * Continuation: the term-2 entry replicated to a majority by a leader
	 * of term 4 that crashes before committing anything of term 4 can still
	 * be overwritten by node 5 (log 1@1, 2@3), and nobody applied it.
	 */
	struct tnet *net = net_alloc(no_pre_vote);
	uint64_t v[] = {1, 2, 3, 4, 5};
	uint64_t l123[] = {1, 2}, l45[] = {1, 3};

	for (uint64_t id = 1; id <= 3; id++)
		node_with_log(net, id, l123, 2, 4, 1, v, 5);
	node_with_log(net, 4, l45, 2, 4, 1, v, 5);
	node_with_log(net, 5, l45, 2, 4, 1, v, 5);
	net_isolate(net, 1);
	campaign(net, 5);
	cr_assert_eq(st_of(net, 5).role, RAFT_LEADER, "(2@3) beats (2@2)");
	net_tick_all(net, 2);
	for (uint64_t id = 2; id <= 5; id++) {
		uint64_t t;

		cr_assert_eq(raft_term_at(net->nodes[id].r, 2, &t), 0);
		cr_assert_eq(t, 3);
		for (size_t k = 0; k < net->nodes[id].n_app; k++)
			if (net->nodes[id].app[k].index == 2)
				cr_assert_eq(net->nodes[id].app[k].term, 3);
	}
	net_free(net);
}

/* ========================================================== read index */

static bool has_read(struct tnet *net, uint64_t id, const char *ctx, uint64_t *index)
{
	struct tnode *n = &net->nodes[id];

	for (size_t k = 0; k < n->n_rs; k++)
		if (n->rs[k].ctx_len == strlen(ctx) &&
		    memcmp(n->rs[k].ctx, ctx, n->rs[k].ctx_len) == 0) {
			if (index)
				*index = n->rs[k].index;
			return true;
		}
	return false;
}

RTEST(raft_read_index, on_leader)
{
	struct tnet *net = net_new(3, NULL);
	uint64_t idx;

	campaign(net, 1);
	propose(net, 1, "w");
	net_stabilize(net);
	cr_assert_eq(raft_read_index(net->nodes[1].r, "r1", 2), 0);
	net_drain(net, 1);
	cr_assert(!has_read(net, 1, "r1", NULL), "needs a heartbeat round first");
	net_stabilize(net);
	cr_assert(has_read(net, 1, "r1", &idx));
	cr_assert_eq(idx, 2);
	net_free(net);
}

RTEST(raft_read_index, on_follower_forwarded)
{
	struct tnet *net = net_new(3, NULL);
	uint64_t idx;

	campaign(net, 1);
	propose(net, 1, "w");
	net_stabilize(net);
	cr_assert_eq(raft_read_index(net->nodes[3].r, "f1", 2), 0);
	net_drain(net, 3);
	net_stabilize(net);
	cr_assert(has_read(net, 3, "f1", &idx));
	cr_assert_eq(idx, 2);
	cr_assert(!has_read(net, 1, "f1", NULL));
	net_free(net);
}

RTEST(raft_read_index, no_leader_refused)
{
	struct tnet *net = net_new(3, NULL);

	cr_assert_eq(raft_read_index(net->nodes[2].r, "x", 1), MC_ENOT_LEADER);
	cr_assert_eq(raft_read_index(net->nodes[2].r, "", 0), -EINVAL);
	net_free(net);
}

RTEST(raft_read_index, new_leader_waits_for_its_first_commit)
{
	struct tnet *net = net_new(3, NULL);
	uint64_t idx;

	net->drop_types = 1u << RAFT_MSG_APP;
	campaign(net, 1);
	cr_assert_eq(st_of(net, 1).role, RAFT_LEADER);
	cr_assert_eq(st_of(net, 1).commit, 0);
	cr_assert_eq(raft_read_index(net->nodes[1].r, "early", 5), 0);
	net_stabilize(net);
	cr_assert(!has_read(net, 1, "early", NULL), "must not answer before committing");
	net_heal(net);
	net_tick_all(net, 1);
	cr_assert_eq(st_of(net, 1).commit, 1);
	cr_assert(has_read(net, 1, "early", &idx));
	cr_assert_eq(idx, 1);
	net_free(net);
}

RTEST(raft_read_index, partitioned_leader_cannot_answer)
{
	struct tnet *net = net_new(3, NULL);

	campaign(net, 1);
	net_isolate(net, 1);
	cr_assert_eq(raft_read_index(net->nodes[1].r, "stale", 5), 0);
	net_drain(net, 1);
	net_stabilize(net);
	net_tick(net, 1, 3);
	net_stabilize(net);
	cr_assert(!has_read(net, 1, "stale", NULL));
	net_free(net);
}

RTEST(raft_read_index, single_voter_answers_at_once)
{
	struct tnet *net = net_new(1, NULL);
	uint64_t idx;

	campaign(net, 1);
	cr_assert_eq(raft_read_index(net->nodes[1].r, "s", 1), 0);
	net_drain(net, 1);
	cr_assert(has_read(net, 1, "s", &idx));
	cr_assert_eq(idx, 1);
	net_free(net);
}

/* ============================================================ learners */

RTEST(raft_learner, receives_log_but_is_not_counted)
{
	uint64_t v[] = {1, 2}, l[] = {3};
	struct tnet *net = net_new_conf(v, 2, l, 1, NULL);

	campaign(net, 1);
	propose(net, 1, "a");
	net_stabilize(net);
	cr_assert(applied_has(net, 3, "a"));
	/* Without voter 2 nothing commits even though the learner acks. */
	net_isolate(net, 2);
	propose(net, 1, "b");
	net_stabilize(net);
	cr_assert_eq(st_of(net, 1).commit, 2);
	cr_assert_eq(st_of(net, 3).last_index, 3);
	net_free(net);
}

RTEST(raft_learner, never_campaigns)
{
	uint64_t v[] = {1, 2}, l[] = {3};
	struct tnet *net = net_new_conf(v, 2, l, 1, NULL);

	cr_assert_eq(raft_campaign(net->nodes[3].r), -EPERM);
	net_tick(net, 3, 10 * ET);
	cr_assert_eq(st_of(net, 3).role, RAFT_FOLLOWER);
	cr_assert_eq(st_of(net, 3).term, 0);
	net_free(net);
}

RTEST(raft_learner, promote_then_counted)
{
	uint64_t v[] = {1, 2}, l[] = {3};
	struct tnet *net = net_new_conf(v, 2, l, 1, NULL);
	struct raft_conf_state cs;

	campaign(net, 1);
	cr_assert_eq(conf_change(net, 1, RAFT_CC_PROMOTE, 2), -ENOENT, "2 is no learner");
	cr_assert_eq(conf_change(net, 1, RAFT_CC_PROMOTE, 3), 0);
	net_stabilize(net);
	cs = raft_conf(net->nodes[3].r);
	cr_assert_eq(cs.n_voters, 3);
	cr_assert_eq(cs.n_learners, 0);
	net_isolate(net, 2);
	propose(net, 1, "with-3");
	net_stabilize(net);
	cr_assert(applied_has(net, 1, "with-3"), "1 and 3 are a quorum of 3");
	net_free(net);
}

/* ========================================================== membership */

/* A cluster founded with raft_bootstrap (conf entries at 1..n). */
static struct tnet *net_new_bootstrap(size_t n, void (*tweak)(struct raft_config *))
{
	struct tnet *net = net_alloc(tweak);

	for (uint64_t id = 1; id <= n; id++) {
		node_start(net, id, NULL);
		cr_assert_eq(raft_bootstrap(net->nodes[id].r, ids5, n), 0);
	}
	net_drain_all(net);
	return net;
}

RTEST(raft_membership, add_voter_catches_up)
{
	struct tnet *net = net_new_bootstrap(3, NULL);
	struct raft_conf_state cs;

	campaign(net, 1);
	propose(net, 1, "before");
	net_stabilize(net);
	node_start(net, 4, NULL); /* empty, no configuration */
	cr_assert_eq(conf_change(net, 1, RAFT_CC_ADD_VOTER, 4), 0);
	net_stabilize(net);
	net_tick_all(net, 2);
	cs = raft_conf(net->nodes[4].r);
	cr_assert_eq(cs.n_voters, 4);
	cr_assert(applied_has(net, 4, "before"));
	assert_logs_equal(net, 1, 4);
	/* 4 now counts: with 2 and 3 down, no commit. */
	net_isolate(net, 2);
	net_isolate(net, 3);
	propose(net, 1, "needs-3-of-4");
	net_stabilize(net);
	cr_assert(!applied_has(net, 1, "needs-3-of-4"));
	net_heal(net);
	net_tick_all(net, 2);
	cr_assert(applied_has(net, 1, "needs-3-of-4"));
	net_free(net);
}

RTEST(raft_membership, remove_follower)
{
	struct tnet *net = net_new(3, NULL);

	campaign(net, 1);
	cr_assert_eq(conf_change(net, 1, RAFT_CC_REMOVE, 3), 0);
	net_stabilize(net);
	cr_assert_eq(raft_conf(net->nodes[1].r).n_voters, 2);
	net_isolate(net, 3);
	propose(net, 1, "two");
	net_stabilize(net);
	cr_assert(applied_has(net, 2, "two"));
	/*
	 * The change took effect when appended, so the leader stopped feeding
	 * 3 at once: 3 does not know it was removed (its application is told
	 * out of band). Its campaigns do not disturb the others.
	 */
	net_heal(net);
	cr_assert_eq(raft_campaign(net->nodes[3].r), 0);
	net_drain(net, 3);
	net_stabilize(net);
	net_tick_all(net, 3 * ET);
	cr_assert_eq(st_of(net, 1).role, RAFT_LEADER);
	cr_assert_eq(st_of(net, 1).term, 1);
	net_free(net);
}

RTEST(raft_membership, remove_leader_steps_down)
{
	struct tnet *net = net_new(3, NULL);

	campaign(net, 1);
	cr_assert_eq(conf_change(net, 1, RAFT_CC_REMOVE, 1), 0);
	cr_assert_eq(st_of(net, 1).role, RAFT_LEADER, "leads until the removal commits");
	net_stabilize(net);
	cr_assert_eq(st_of(net, 1).role, RAFT_FOLLOWER);
	cr_assert_eq(st_of(net, 2).commit, 2, "followers learned the commit");
	net_tick_all(net, 4 * ET);
	cr_assert(st_of(net, 2).role == RAFT_LEADER || st_of(net, 3).role == RAFT_LEADER);
	cr_assert_neq(st_of(net, 1).role, RAFT_LEADER);
	net_free(net);
}

RTEST(raft_membership, one_change_at_a_time)
{
	struct tnet *net = net_new(3, NULL);
	struct raft_conf_change bad = {.type = 99, .node_id = 4};

	net->drop_types = 1u << RAFT_MSG_APP;
	campaign(net, 1);
	cr_assert_eq(conf_change(net, 1, RAFT_CC_ADD_LEARNER, 4), -EAGAIN,
		     "nothing of the leader's term committed yet");
	net_heal(net);
	net_tick_all(net, 1);
	cr_assert_eq(conf_change(net, 1, RAFT_CC_ADD_VOTER, 2), -EEXIST);
	cr_assert_eq(conf_change(net, 1, RAFT_CC_REMOVE, 7), -ENOENT);
	cr_assert_eq(conf_change(net, 1, RAFT_CC_ADD_VOTER, 0), -EINVAL);
	cr_assert_eq(raft_propose_conf_change(net->nodes[1].r, &bad, NULL), -EINVAL);
	net->drop_types = 1u << RAFT_MSG_APP;
	cr_assert_eq(conf_change(net, 1, RAFT_CC_ADD_LEARNER, 4), 0);
	cr_assert_eq(conf_change(net, 1, RAFT_CC_ADD_LEARNER, 5), -EAGAIN);
	net_heal(net);
	net_tick_all(net, 1);
	cr_assert_eq(conf_change(net, 1, RAFT_CC_ADD_LEARNER, 5), 0);
	cr_assert_eq(conf_change(net, 2, RAFT_CC_ADD_LEARNER, 6), MC_ENOT_LEADER);
	net_free(net);
}

RTEST(raft_membership, truncated_change_rolls_back)
{
	struct tnet *net = net_new(5, NULL);
	struct raft_conf_state cs;

	campaign(net, 1);
	/* The change reaches only node 2. */
	for (uint64_t id = 3; id <= 5; id++)
		net->cut[1][id] = true;
	cr_assert_eq(conf_change(net, 1, RAFT_CC_ADD_LEARNER, 6), 0);
	net_stabilize(net);
	cs = raft_conf(net->nodes[2].r);
	cr_assert_eq(cs.n_learners, 1, "in force as soon as appended");
	net_isolate(net, 1);
	net_isolate(net, 2);
	for (uint64_t id = 3; id <= 5; id++)
		net->cut[id][1] = net->cut[id][2] = true;
	for (int k = 0; k < 4 * ET && st_of(net, 3).role != RAFT_LEADER; k++) {
		net_tick(net, 3, 1);
		net_tick(net, 4, 1);
		net_tick(net, 5, 1);
		net_stabilize(net);
	}
	campaign(net, 3);
	cr_assert_eq(st_of(net, 3).role, RAFT_LEADER);
	propose(net, 3, "new-era");
	net_stabilize(net);
	net_heal(net);
	net_isolate(net, 1);
	net_tick(net, 3, 1);
	net_stabilize(net);
	cs = raft_conf(net->nodes[2].r);
	cr_assert_eq(cs.n_learners, 0, "conf entry truncated: back to the old config");
	assert_logs_equal(net, 2, 3);
	net_free(net);
}

RTEST(raft_membership, bootstrap_then_grow)
{
	struct tnet *net = net_alloc(NULL);
	uint64_t v[] = {1, 2, 3};

	for (uint64_t id = 1; id <= 3; id++) {
		node_start(net, id, NULL);
		cr_assert_eq(raft_bootstrap(net->nodes[id].r, v, 3), 0);
	}
	cr_assert_eq(raft_bootstrap(net->nodes[1].r, v, 3), -EEXIST);
	net_drain_all(net);
	cr_assert_eq(net->nodes[1].n_app, 3, "bootstrap entries are committed");
	cr_assert_eq(net->nodes[2].disk.n, 3);
	campaign(net, 2);
	cr_assert_eq(st_of(net, 2).role, RAFT_LEADER);
	node_start(net, 4, NULL);
	cr_assert_eq(conf_change(net, 2, RAFT_CC_ADD_LEARNER, 4), 0);
	net_stabilize(net);
	net_tick_all(net, 2);
	cr_assert_eq(raft_conf(net->nodes[4].r).n_voters, 3);
	cr_assert_eq(raft_conf(net->nodes[4].r).n_learners, 1);
	assert_logs_equal(net, 2, 4);
	net_free(net);
}

RTEST(raft_membership, bootstrap_members_carries_contexts)
{
	struct tnet *net = net_alloc(NULL);
	const char *names[] = {"alpha=10.0.0.1:2380", "beta=10.0.0.2:2380", "gamma"};
	struct raft_conf_change ccs[3];

	for (size_t k = 0; k < 3; k++)
		ccs[k] = (struct raft_conf_change){.type = RAFT_CC_ADD_VOTER,
						   .node_id = k + 1,
						   .context = names[k],
						   .context_len = strlen(names[k])};
	for (uint64_t id = 1; id <= 3; id++) {
		node_start(net, id, NULL);
		cr_assert_eq(raft_bootstrap_members(net->nodes[id].r, ccs, 3), 0);
	}
	cr_assert_eq(raft_bootstrap_members(net->nodes[1].r, ccs, 3), -EEXIST);
	net_drain_all(net);
	campaign(net, 1);
	node_start(net, 4, NULL);
	cr_assert_eq(conf_change(net, 1, RAFT_CC_ADD_LEARNER, 4), 0);
	net_stabilize(net);
	net_tick_all(net, 2);
	assert_logs_equal(net, 1, 4);
	/* The new member got the founders' contexts through the log. */
	struct tu_disk *d = &net->nodes[4].disk;
	cr_assert_geq(d->n, 3);
	for (size_t k = 0; k < 3; k++) {
		struct raft_conf_change cc;
		cr_assert_eq(d->ents[k].type, RAFT_ENTRY_CONF_CHANGE);
		cr_assert_eq(raft_conf_change_decode(d->ents[k].data, d->ents[k].len, &cc), 0);
		cr_assert_eq(cc.node_id, k + 1);
		cr_assert_eq(cc.context_len, strlen(names[k]));
		cr_assert_eq(memcmp(cc.context, names[k], cc.context_len), 0);
	}
	/* Only ADD_VOTER, no zero id, no duplicates. */
	struct raft *r;
	struct raft_config c;
	raft_config_init(&c, 9);
	cr_assert_eq(raft_new(&c, NULL, &r), 0);
	ccs[1].type = RAFT_CC_ADD_LEARNER;
	cr_assert_eq(raft_bootstrap_members(r, ccs, 3), -EINVAL);
	ccs[1].type = RAFT_CC_ADD_VOTER;
	ccs[1].node_id = 1;
	cr_assert_eq(raft_bootstrap_members(r, ccs, 3), -EINVAL);
	cr_assert_eq(raft_bootstrap_members(r, ccs, 0), -EINVAL);
	raft_free(r);
	net_free(net);
}

/* ===================================================== leader transfer */

RTEST(raft_transfer, to_up_to_date_follower)
{
	struct tnet *net = net_new(3, NULL);

	campaign(net, 1);
	cr_assert_eq(raft_transfer_leader(net->nodes[1].r, 2), 0);
	net_drain(net, 1);
	net_stabilize(net);
	cr_assert_eq(st_of(net, 2).role, RAFT_LEADER);
	cr_assert_eq(st_of(net, 2).term, 2);
	cr_assert_eq(st_of(net, 1).role, RAFT_FOLLOWER);
	cr_assert_eq(st_of(net, 1).leader, 2);
	net_free(net);
}

RTEST(raft_transfer, lagging_target_catches_up_first)
{
	struct tnet *net = net_new(3, NULL);

	campaign(net, 1);
	net_isolate(net, 3);
	for (int k = 0; k < 5; k++)
		propose(net, 1, "lag");
	net_stabilize(net);
	net_heal(net);
	cr_assert_eq(raft_transfer_leader(net->nodes[1].r, 3), 0);
	cr_assert_eq(raft_propose(net->nodes[1].r, "x", 1, NULL), -EBUSY);
	net_drain(net, 1);
	net_stabilize(net);
	cr_assert_eq(st_of(net, 3).role, RAFT_LEADER);
	assert_logs_equal(net, 1, 3);
	net_free(net);
}

RTEST(raft_transfer, aborts_after_election_timeout)
{
	struct tnet *net = net_new(3, NULL);

	campaign(net, 1);
	net_isolate(net, 3);
	cr_assert_eq(raft_transfer_leader(net->nodes[1].r, 3), 0);
	cr_assert_eq(st_of(net, 1).lead_transferee, 3);
	cr_assert_eq(raft_propose(net->nodes[1].r, "x", 1, NULL), -EBUSY);
	cr_assert_eq(raft_transfer_leader(net->nodes[1].r, 3), 0, "same target: no-op");
	for (int k = 0; k < ET; k++) {
		net_tick(net, 1, 1);
		net_tick(net, 2, 1);
		net_stabilize(net);
	}
	cr_assert_eq(st_of(net, 1).lead_transferee, 0);
	cr_assert_eq(st_of(net, 1).role, RAFT_LEADER);
	cr_assert_eq(st_of(net, 1).term, 1);
	propose(net, 1, "after-abort");
	net_stabilize(net);
	cr_assert(applied_has(net, 2, "after-abort"));
	net_free(net);
}

RTEST(raft_transfer, invalid_targets)
{
	uint64_t v[] = {1, 2}, l[] = {3};
	struct tnet *net = net_new_conf(v, 2, l, 1, NULL);

	campaign(net, 1);
	cr_assert_eq(raft_transfer_leader(net->nodes[1].r, 1), -EINVAL);
	cr_assert_eq(raft_transfer_leader(net->nodes[1].r, 3), -EINVAL, "learner");
	cr_assert_eq(raft_transfer_leader(net->nodes[1].r, 9), -EINVAL);
	cr_assert_eq(raft_transfer_leader(net->nodes[2].r, 1), MC_ENOT_LEADER);
	net_free(net);
}

/* =========================================================== snapshots */

static void no_trailing(struct raft_config *c)
{
	c->trailing_entries = 0;
}

/* The app snapshots node id at its applied index. */
static void app_snapshot(struct tnet *net, uint64_t id)
{
	struct raft_status st = st_of(net, id);

	cr_assert_eq(raft_compact(net->nodes[id].r, st.applied), 0);
	tu_disk_compact(&net->nodes[id].disk, raft_last_snapshot(net->nodes[id].r));
}

RTEST(raft_snapshot, lagging_follower_gets_snapshot)
{
	struct tnet *net = net_new(3, no_trailing);
	struct raft_status st;

	campaign(net, 1);
	net_isolate(net, 3);
	for (int k = 0; k < 20; k++)
		propose(net, 1, "s");
	net_stabilize(net);
	app_snapshot(net, 1);
	st = st_of(net, 1);
	cr_assert_eq(st.snapshot_index, 21);
	cr_assert_eq(st.first_index, 22);
	propose(net, 1, "after-snap");
	net_stabilize(net);
	net_heal(net);
	net->record = true;
	net_tick_all(net, 3);
	cr_assert_eq(net->nodes[3].n_snap_installs, 1);
	cr_assert_eq(net->nodes[3].snap_installed, 21);
	cr_assert_eq(net->nodes[3].disk.snap.index, 21);
	cr_assert_eq(net->nodes[3].disk.snap.conf.n_voters, 3);
	cr_assert_eq(st_of(net, 3).commit, 22);
	cr_assert(applied_has(net, 3, "after-snap"));
	cr_assert(!applied_has(net, 3, "s"), "entries before the snapshot come with it");
	/* The leader is back to replicating to 3. */
	{
		struct raft_peer_status ps[3];
		size_t n = raft_status(net->nodes[1].r, &st, ps, 3);

		for (size_t k = 0; k < n; k++)
			if (ps[k].id == 3)
				cr_assert_eq(ps[k].state, RAFT_PROGRESS_REPLICATE);
	}
	/* And a restart of 3 from its disk works. */
	node_restart(net, 3);
	cr_assert_eq(st_of(net, 3).first_index, 22);
	cr_assert_eq(st_of(net, 3).commit, 22);
	net_free(net);
}

RTEST(raft_snapshot, failed_snapshot_is_retried)
{
	struct tnet *net = net_new(3, no_trailing);
	struct raft_peer_status ps[3];
	struct raft_status st;
	size_t n;

	campaign(net, 1);
	net_isolate(net, 3);
	for (int k = 0; k < 5; k++)
		propose(net, 1, "s");
	net_stabilize(net);
	app_snapshot(net, 1);
	net_heal(net);
	net->drop_types = 1u << RAFT_MSG_SNAP; /* transport reports failure */
	net_tick_all(net, 2);
	n = raft_status(net->nodes[1].r, &st, ps, 3);
	for (size_t k = 0; k < n; k++)
		if (ps[k].id == 3)
			cr_assert_neq(ps[k].state, RAFT_PROGRESS_REPLICATE);
	cr_assert(net->sent[RAFT_MSG_SNAP] >= 2, "retried after failure");
	net->drop_types = 0;
	net_tick_all(net, 3);
	cr_assert_eq(net->nodes[3].snap_installed, 6);
	cr_assert_eq(st_of(net, 3).commit, 6);
	net_free(net);
}

RTEST(raft_snapshot, stale_snapshot_is_ignored)
{
	struct raft_config c;
	struct raft *r;
	uint64_t v[] = {1, 2};
	uint64_t terms[] = {1, 1, 1};
	struct raft_entry e[3] = {
		{.index = 1, .term = 1}, {.index = 2, .term = 1}, {.index = 3, .term = 1}};
	struct raft_restore rs = {.hard_state = {.term = 1, .commit = 3},
				  .snapshot.conf = {.voters = v, .n_voters = 2},
				  .entries = e,
				  .n_entries = 3};
	struct raft_msg m = {
		.type = RAFT_MSG_SNAP,
		.from = 2,
		.to = 1,
		.term = 1,
		.snapshot = {.index = 2, .term = 1, .conf = {.voters = v, .n_voters = 2}}};
	struct raft_ready rd;

	(void)terms;
	raft_config_init(&c, 1);
	cr_assert_eq(raft_new(&c, &rs, &r), 0);
	cr_assert_eq(raft_step(r, &m), 0);
	cr_assert_eq(raft_ready(r, &rd), 0);
	cr_assert_null(rd.snapshot);
	cr_assert_eq(rd.n_msgs, 1);
	cr_assert_eq(rd.msgs[0].type, RAFT_MSG_APP_RESP);
	cr_assert_eq(rd.msgs[0].index, 3);
	cr_assert_eq(raft_advance(r, &rd), 0);
	raft_free(r);
}

RTEST(raft_snapshot, compaction_and_trailing_window)
{
	struct raft_config c;
	struct raft *r;
	uint64_t v[] = {1};
	struct raft_restore rs = {.snapshot.conf = {.voters = v, .n_voters = 1}};
	struct raft_ready rd;
	struct raft_status st;
	uint64_t t;

	raft_config_init(&c, 1);
	c.trailing_entries = 3;
	cr_assert_eq(raft_new(&c, &rs, &r), 0);
	cr_assert_eq(raft_campaign(r), 0);
	for (int k = 0; k < 9; k++)
		cr_assert_eq(raft_propose(r, "p", 1, NULL), 0);
	cr_assert_eq(raft_compact(r, 5), -EINVAL, "nothing applied yet");
	cr_assert_eq(raft_ready(r, &rd), 0);
	cr_assert_eq(rd.n_entries, 10);
	cr_assert_eq(rd.n_committed, 10);
	cr_assert_eq(raft_compact(r, 5), -EINPROGRESS);
	cr_assert_eq(raft_advance(r, &rd), 0);
	cr_assert_eq(raft_compact(r, 11), -EINVAL);
	cr_assert_eq(raft_compact(r, 8), 0);
	raft_status(r, &st, NULL, 0);
	cr_assert_eq(st.snapshot_index, 8);
	cr_assert_eq(st.first_index, 6, "3 trailing entries kept");
	cr_assert_null(raft_entry_at(r, 5));
	cr_assert_not_null(raft_entry_at(r, 6));
	cr_assert_eq(raft_term_at(r, 5, &t), 0, "term of the entry before the log is kept");
	cr_assert_eq(raft_term_at(r, 4, &t), -ENOENT);
	cr_assert_eq(raft_last_snapshot(r)->index, 8);
	cr_assert_eq(raft_last_snapshot(r)->term, 1);
	cr_assert_eq(raft_last_snapshot(r)->conf.n_voters, 1);
	cr_assert_eq(raft_compact(r, 7), 0, "older: no-op");
	cr_assert_eq(raft_compact(r, 10), 0);
	raft_status(r, &st, NULL, 0);
	cr_assert_eq(st.first_index, 8);
	raft_free(r);
}

/* ================================================================= API */

RTEST(raft_api, frozen_between_ready_and_advance)
{
	struct tnet *net = net_new(3, NULL);
	struct raft_ready rd, rd2;
	struct raft_msg m = {.type = RAFT_MSG_HEARTBEAT, .from = 2, .to = 1, .term = 1};

	cr_assert_eq(raft_campaign(net->nodes[1].r), 0);
	cr_assert_eq(raft_ready(net->nodes[1].r, &rd), 0);
	cr_assert_eq(raft_tick(net->nodes[1].r), -EINPROGRESS);
	cr_assert_eq(raft_step(net->nodes[1].r, &m), -EINPROGRESS);
	cr_assert_eq(raft_ready(net->nodes[1].r, &rd2), -EINPROGRESS);
	cr_assert(!raft_has_ready(net->nodes[1].r));
	cr_assert_eq(raft_advance(net->nodes[1].r, &rd), 0);
	cr_assert_eq(raft_advance(net->nodes[1].r, &rd), -EINVAL);
	net_free(net);
}

RTEST(raft_api, bad_inputs)
{
	struct raft_config c;
	struct raft *r;
	struct raft_msg m = {.type = RAFT_MSG_HEARTBEAT, .from = 2, .to = 3, .term = 1};
	uint64_t v[] = {1, 2};
	struct raft_entry e[2] = {{.index = 1, .term = 1}, {.index = 3, .term = 1}};
	struct raft_restore rs = {.hard_state = {.term = 1},
				  .snapshot.conf = {.voters = v, .n_voters = 2},
				  .entries = e,
				  .n_entries = 2};

	raft_config_init(&c, 0);
	cr_assert_eq(raft_new(&c, NULL, &r), -EINVAL);
	raft_config_init(&c, 1);
	c.heartbeat_ticks = c.election_ticks;
	cr_assert_eq(raft_new(&c, NULL, &r), -EINVAL);
	raft_config_init(&c, 1);
	cr_assert_eq(raft_new(&c, &rs, &r), -EINVAL, "gap in the log");
	e[1].index = 2;
	rs.hard_state.commit = 5;
	cr_assert_eq(raft_new(&c, &rs, &r), -EINVAL, "commit beyond the log");
	rs.hard_state.commit = 2;
	cr_assert_eq(raft_new(&c, &rs, &r), 0);
	cr_assert_eq(raft_step(r, &m), -EINVAL, "not addressed to us");
	m.to = 1;
	m.type = 77;
	cr_assert_eq(raft_step(r, &m), -EINVAL);
	raft_free(r);
}

RTEST(raft_api, conf_change_encoding)
{
	struct raft_conf_change cc = {.type = RAFT_CC_ADD_LEARNER,
				      .node_id = 0x0102030405060708ull,
				      .context = "10.0.0.1:2380",
				      .context_len = 13};
	unsigned char buf[64];
	struct raft_conf_change out;
	size_t n = raft_conf_change_encode(&cc, buf);

	cr_assert_eq(n, raft_conf_change_size(&cc));
	cr_assert_eq(raft_conf_change_decode(buf, n, &out), 0);
	cr_assert_eq(out.type, cc.type);
	cr_assert_eq(out.node_id, cc.node_id);
	cr_assert_eq(out.context_len, 13);
	cr_assert_eq(memcmp(out.context, "10.0.0.1:2380", 13), 0);
	cr_assert_eq(raft_conf_change_decode(buf, 5, &out), -EINVAL);
	buf[1] = 9;
	cr_assert_eq(raft_conf_change_decode(buf, n, &out), -EINVAL);
}

static size_t trace_count;

static void count_trace(void *arg, uint64_t id, const char *text)
{
	(void)arg;
	(void)id;
	cr_assert(text && *text);
	trace_count++;
}

static void with_trace(struct raft_config *c)
{
	c->trace = count_trace;
}

RTEST(raft_api, trace_callback_gets_events)
{
	struct tnet *net = net_new(3, with_trace);

	trace_count = 0;
	campaign(net, 1);
	cr_assert(trace_count > 5);
	net_free(net);
}

/* ====================================================== golden traces */

static void assert_lines(struct tnet *net, const char *const *want, size_t n)
{
	for (size_t k = 0; k < n && k < net->n_lines; k++)
		cr_assert_str_eq(net->lines[k], want[k], "line %zu", k);
	cr_assert_eq(net->n_lines, n, "got %zu lines, want %zu", net->n_lines, n);
}

RTEST(raft_golden, prevote_election_of_three)
{
	static const char *const want[] = {
		"1->2 PREVOTE t=1 i=0 lt=0",       "1->3 PREVOTE t=1 i=0 lt=0",
		"2->1 PREVOTE_RESP t=1 grant",     "3->1 PREVOTE_RESP t=1 grant",
		"1->2 VOTE t=1 i=0 lt=0",          "1->3 VOTE t=1 i=0 lt=0",
		"2->1 VOTE_RESP t=1 grant",        "3->1 VOTE_RESP t=1 grant",
		"1->2 APP t=1 i=0 lt=0 c=0 [1@1]", "1->3 APP t=1 i=0 lt=0 c=0 [1@1]",
		"2->1 APP_RESP t=1 i=1",           "3->1 APP_RESP t=1 i=1",
		"1->2 APP t=1 i=1 lt=1 c=1 []",    "1->3 APP t=1 i=1 lt=1 c=1 []",
		"2->1 APP_RESP t=1 i=1",           "3->1 APP_RESP t=1 i=1",
	};
	struct tnet *net = net_new(3, NULL);

	net->record = true;
	campaign(net, 1);
	assert_lines(net, want, MC_ARRAY_LEN(want));
	net_free(net);
}

/* Step m into r and return its outgoing messages as text. */
static size_t outbox(struct raft *r, char lines[][160], size_t cap)
{
	struct raft_ready rd;
	size_t n = 0;

	while (raft_has_ready(r)) {
		cr_assert_eq(raft_ready(r, &rd), 0);
		for (size_t k = 0; k < rd.n_msgs && n < cap; k++)
			tu_fmt_msg(lines[n++], 160, &rd.msgs[k]);
		cr_assert_eq(raft_advance(r, &rd), 0);
	}
	return n;
}

RTEST(raft_golden, follower_reject_hint_and_leader_jump)
{
	uint64_t v[] = {1, 2};
	struct raft_config c;
	struct raft *f, *l;
	char out[8][160];
	struct raft_entry fe[4] = {{.index = 1, .term = 1},
				   {.index = 2, .term = 1},
				   {.index = 3, .term = 2},
				   {.index = 4, .term = 2}};
	struct raft_entry le[4] = {{.index = 1, .term = 1},
				   {.index = 2, .term = 1},
				   {.index = 3, .term = 3},
				   {.index = 4, .term = 3}};
	struct raft_restore frs = {.hard_state = {.term = 2, .commit = 2},
				   .snapshot.conf = {.voters = v, .n_voters = 2},
				   .entries = fe,
				   .n_entries = 4};
	struct raft_restore lrs = {.hard_state = {.term = 3, .commit = 2},
				   .snapshot.conf = {.voters = v, .n_voters = 2},
				   .entries = le,
				   .n_entries = 4};
	struct raft_msg m;
	size_t n;

	/* The follower (node 2) rejects an APP after 4@3: it has 4@2. */
	raft_config_init(&c, 2);
	cr_assert_eq(raft_new(&c, &frs, &f), 0);
	m = (struct raft_msg){.type = RAFT_MSG_APP,
			      .from = 1,
			      .to = 2,
			      .term = 4,
			      .index = 4,
			      .log_term = 3,
			      .commit = 2};
	cr_assert_eq(raft_step(f, &m), 0);
	n = outbox(f, out, 8);
	cr_assert_eq(n, 1);
	cr_assert_str_eq(out[0], "2->1 APP_RESP t=4 i=4 reject hint=4 lt=2");

	/* The leader (node 1, term 4 after winning) jumps straight to index 2. */
	raft_config_init(&c, 1);
	cr_assert_eq(raft_new(&c, &lrs, &l), 0);
	cr_assert_eq(raft_campaign(l), 0);
	n = outbox(l, out, 8);
	cr_assert_eq(n, 1);
	cr_assert_str_eq(out[0], "1->2 PREVOTE t=4 i=4 lt=3");
	m = (struct raft_msg){.type = RAFT_MSG_PREVOTE_RESP, .from = 2, .to = 1, .term = 4};
	cr_assert_eq(raft_step(l, &m), 0);
	n = outbox(l, out, 8);
	cr_assert_eq(n, 1);
	cr_assert_str_eq(out[0], "1->2 VOTE t=4 i=4 lt=3");
	m.type = RAFT_MSG_VOTE_RESP;
	cr_assert_eq(raft_step(l, &m), 0);
	n = outbox(l, out, 8);
	cr_assert_eq(n, 1);
	cr_assert_str_eq(out[0], "1->2 APP t=4 i=4 lt=3 c=2 [5@4]");
	m = (struct raft_msg){.type = RAFT_MSG_APP_RESP,
			      .from = 2,
			      .to = 1,
			      .term = 4,
			      .index = 4,
			      .reject = true,
			      .reject_hint = 4,
			      .log_term = 2};
	cr_assert_eq(raft_step(l, &m), 0);
	n = outbox(l, out, 8);
	cr_assert_eq(n, 1);
	cr_assert_str_eq(out[0], "1->2 APP t=4 i=2 lt=1 c=2 [3@3,4@3,5@4]");
	/* Feed that APP to the follower: it truncates 3@2,4@2 and accepts. */
	{
		struct raft_entry ne[3] = {{.index = 3, .term = 3},
					   {.index = 4, .term = 3},
					   {.index = 5, .term = 4}};
		struct raft_ready rd;

		m = (struct raft_msg){.type = RAFT_MSG_APP,
				      .from = 1,
				      .to = 2,
				      .term = 4,
				      .index = 2,
				      .log_term = 1,
				      .commit = 2,
				      .entries = ne,
				      .n_entries = 3};
		cr_assert_eq(raft_step(f, &m), 0);
		cr_assert_eq(raft_ready(f, &rd), 0);
		cr_assert_eq(rd.n_entries, 3);
		cr_assert_eq(rd.entries[0].index, 3, "replaces the WAL from index 3");
		cr_assert_eq(rd.entries[0].term, 3);
		cr_assert_eq(rd.n_msgs, 1);
		tu_fmt_msg(out[0], 160, &rd.msgs[0]);
		cr_assert_str_eq(out[0], "2->1 APP_RESP t=4 i=5");
		cr_assert_eq(raft_advance(f, &rd), 0);
	}
	raft_free(f);
	raft_free(l);
}

RTEST(raft_golden, read_index_heartbeat_round)
{
	struct tnet *net = net_new(3, NULL);
	struct raft_msg m = {.type = RAFT_MSG_HEARTBEAT_RESP,
			     .from = 2,
			     .to = 1,
			     .term = 1,
			     .ctx = "r1",
			     .ctx_len = 2};
	char out[8][160];
	size_t n;

	campaign(net, 1);
	cr_assert_eq(raft_read_index(net->nodes[1].r, "r1", 2), 0);
	n = outbox(net->nodes[1].r, out, 8);
	cr_assert_eq(n, 2);
	cr_assert_str_eq(out[0], "1->2 HEARTBEAT t=1 c=1 ctx=r1");
	cr_assert_str_eq(out[1], "1->3 HEARTBEAT t=1 c=1 ctx=r1");
	cr_assert_eq(raft_step(net->nodes[1].r, &m), 0);
	net_drain(net, 1);
	cr_assert_eq(net->nodes[1].n_rs, 1);
	cr_assert_eq(net->nodes[1].rs[0].index, 1);
	cr_assert_eq(net->nodes[1].rs[0].ctx_len, 2);
	/* A second ack for a finished round changes nothing. */
	m.from = 3;
	cr_assert_eq(raft_step(net->nodes[1].r, &m), 0);
	net_drain(net, 1);
	cr_assert_eq(net->nodes[1].n_rs, 1);
	net_free(net);
}

RTEST(raft_golden, transfer_sends_timeout_now_and_forced_vote)
{
	static const char *const want[] = {
		"1->2 TIMEOUT_NOW t=1",
		"2->1 VOTE t=2 i=1 lt=1 transfer",
		"2->3 VOTE t=2 i=1 lt=1 transfer",
		"1->2 VOTE_RESP t=2 grant",
		"3->2 VOTE_RESP t=2 grant",
		"2->1 APP t=2 i=1 lt=1 c=1 [2@2]",
		"2->3 APP t=2 i=1 lt=1 c=1 [2@2]",
		"1->2 APP_RESP t=2 i=2",
		"3->2 APP_RESP t=2 i=2",
		"2->1 APP t=2 i=2 lt=2 c=2 []",
		"2->3 APP t=2 i=2 lt=2 c=2 []",
		"1->2 APP_RESP t=2 i=2",
		"3->2 APP_RESP t=2 i=2",
	};
	struct tnet *net = net_new(3, NULL);

	campaign(net, 1);
	cr_assert_eq(raft_transfer_leader(net->nodes[1].r, 2), 0);
	net_drain(net, 1);
	net->record = true;
	net_stabilize(net);
	assert_lines(net, want, MC_ARRAY_LEN(want));
	net_free(net);
}

RTEST(raft_golden, stale_term_append_gets_term_back)
{
	uint64_t v[] = {1, 2, 3};
	struct raft_config c;
	struct raft *r;
	char out[4][160];
	struct raft_restore rs = {.hard_state = {.term = 5},
				  .snapshot.conf = {.voters = v, .n_voters = 3}};
	struct raft_msg m = {.type = RAFT_MSG_HEARTBEAT, .from = 2, .to = 1, .term = 3};

	raft_config_init(&c, 1);
	cr_assert_eq(raft_new(&c, &rs, &r), 0);
	cr_assert_eq(raft_step(r, &m), 0);
	cr_assert_eq(outbox(r, out, 4), 1);
	cr_assert_str_eq(out[0], "1->2 APP_RESP t=5 i=0");
	m.type = RAFT_MSG_PREVOTE;
	cr_assert_eq(raft_step(r, &m), 0);
	cr_assert_eq(outbox(r, out, 4), 1);
	cr_assert_str_eq(out[0], "1->2 PREVOTE_RESP t=5 reject");
	m.type = RAFT_MSG_VOTE;
	cr_assert_eq(raft_step(r, &m), 0);
	cr_assert_eq(outbox(r, out, 4), 0, "old votes are dropped silently");
	raft_free(r);
}
