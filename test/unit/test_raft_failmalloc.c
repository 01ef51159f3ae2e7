/*
 * test_raft_failmalloc: every allocation the Raft core makes is failed in
 * turn (the i-th allocation inside a raft_* call returns NULL) while a
 * scripted cluster scenario runs: bootstrap, election, proposals, reads,
 * membership changes, snapshot + install, leader transfer, ticks. Each run
 * must not crash, a fatal error must stay sticky, and after raft_free every
 * block the core allocated must be gone.
 *
 * The allocator is interposed in this executable (malloc, calloc, realloc,
 * free over glibc's __libc_* functions), so the test runs only in the
 * normal build; under ASan (which owns the allocator) it is skipped.
 */
#include <criterion/criterion.h>
#include <errno.h>

#include "common/util.h"
#include "test_raft_util.h"

#if !defined(__SANITIZE_ADDRESS__)

void *__libc_malloc(size_t n);
void *__libc_calloc(size_t a, size_t b);
void *__libc_realloc(void *p, size_t n);
void __libc_free(void *p);

#define LIVE_CAP (1u << 16)

static bool in_core;
static long n_allocs;
static long fail_at = -1;
static long n_failed;
static void *live[LIVE_CAP];
static size_t n_live;

static size_t slot_of(void *p)
{
	return (size_t)(((uintptr_t)p >> 4) * 0x9E3779B97F4A7C15ull >> 48) & (LIVE_CAP - 1);
}

static void live_add(void *p)
{
	size_t i = slot_of(p);

	if (n_live + 1 >= LIVE_CAP / 2)
		abort();
	while (live[i])
		i = (i + 1) & (LIVE_CAP - 1);
	live[i] = p;
	n_live++;
}

static bool live_del(void *p)
{
	size_t i = slot_of(p);

	while (live[i] && live[i] != p)
		i = (i + 1) & (LIVE_CAP - 1);
	if (!live[i])
		return false;
	/* backward-shift deletion keeps probe chains intact */
	live[i] = NULL;
	n_live--;
	for (size_t j = (i + 1) & (LIVE_CAP - 1); live[j]; j = (j + 1) & (LIVE_CAP - 1)) {
		void *q = live[j];

		live[j] = NULL;
		n_live--;
		live_add(q);
	}
	return true;
}

static bool should_fail(void)
{
	if (!in_core)
		return false;
	if (++n_allocs == fail_at) {
		n_failed++;
		return true;
	}
	return false;
}

void *malloc(size_t n)
{
	void *p;

	if (should_fail())
		return NULL;
	p = __libc_malloc(n);
	if (p && in_core)
		live_add(p);
	return p;
}

void *calloc(size_t a, size_t b)
{
	void *p;

	if (should_fail())
		return NULL;
	p = __libc_calloc(a, b);
	if (p && in_core)
		live_add(p);
	return p;
}

void *realloc(void *p, size_t n)
{
	bool tracked;
	void *q;

	if (should_fail())
		return NULL;
	tracked = p && in_core && live_del(p);
	q = __libc_realloc(p, n);
	if (!q && tracked)
		live_add(p); /* the old block is still there */
	else if (q && (tracked || (in_core && !p)))
		live_add(q);
	return q;
}

void free(void *p)
{
	if (p && in_core)
		live_del(p);
	__libc_free(p);
}

/* --------------------------------------------------------- the scenario */

#define N 5
#define QCAP 4096

struct fnode {
	struct raft *r;
	int fatal; /* sticky error seen */
};

static struct fnode nodes[N + 1];
static bool saw_snapshot[N + 1];
static size_t n_read_states;
static struct raft_msg queue[QCAP];
static size_t qn;
static bool cut3;

static int note(uint64_t id, int rv);
static int call_rv;

/* Run one core call with failures armed, then look at its result. */
#define CALL(id, expr) (in_core = true, call_rv = (expr), in_core = false, note(id, call_rv))

static bool alive(uint64_t id)
{
	return nodes[id].r && !nodes[id].fatal;
}

static int note(uint64_t id, int rv)
{
	if (nodes[id].r && (rv == -ENOMEM || rv == MC_EINTERNAL)) {
		int again;

		/* Either nothing changed (propose-like) or the error is sticky. */
		in_core = true;
		again = raft_tick(nodes[id].r);
		in_core = false;
		if (again != 0) {
			cr_assert(again == -ENOMEM || again == MC_EINTERNAL, "odd error %d",
				  again);
			cr_assert(!raft_has_ready(nodes[id].r));
			nodes[id].fatal = again;
		}
	}
	return rv;
}

static void drain(uint64_t id)
{
	while (alive(id) && raft_has_ready(nodes[id].r)) {
		struct raft_ready rd;

		if (CALL(id, raft_ready(nodes[id].r, &rd)) != 0)
			return;
		if (rd.snapshot)
			saw_snapshot[id] = true;
		n_read_states += rd.n_read_states;
		for (size_t k = 0; k < rd.n_msgs; k++) {
			const struct raft_msg *m = &rd.msgs[k];

			if (qn == QCAP || m->to > N || (cut3 && (m->to == 3 || m->from == 3)))
				continue;
			tu_msg_dup(&queue[qn++], m);
		}
		if (CALL(id, raft_advance(nodes[id].r, &rd)) != 0)
			return;
	}
}

static void settle(void)
{
	for (int round = 0; round < 200; round++) {
		struct raft_msg batch[QCAP];
		size_t n;

		for (uint64_t id = 1; id <= N; id++)
			drain(id);
		if (qn == 0)
			return;
		n = qn;
		memcpy(batch, queue, n * sizeof(*batch));
		qn = 0;
		for (size_t k = 0; k < n; k++) {
			struct raft_msg *m = &batch[k];

			if (alive(m->to)) {
				CALL(m->to, raft_step(nodes[m->to].r, m));
				if (m->type == RAFT_MSG_SNAP && alive(m->from))
					CALL(m->from, raft_report_snapshot(nodes[m->from].r,
									   m->to, true));
			}
			tu_msg_free(m);
		}
	}
}

static uint64_t leader(void)
{
	for (uint64_t id = 1; id <= N; id++) {
		struct raft_status st;

		if (!alive(id))
			continue;
		raft_status(nodes[id].r, &st, NULL, 0);
		if (st.role == RAFT_LEADER)
			return id;
	}
	return 0;
}

static void tick_all(int rounds)
{
	for (int k = 0; k < rounds; k++) {
		for (uint64_t id = 1; id <= N; id++)
			if (alive(id))
				CALL(id, raft_tick(nodes[id].r));
		settle();
	}
}

static void scenario(void)
{
	static const uint64_t voters[] = {1, 2, 3};
	uint64_t l;

	memset(nodes, 0, sizeof(nodes));
	memset(saw_snapshot, 0, sizeof(saw_snapshot));
	n_read_states = 0;
	qn = 0;
	cut3 = false;
	for (uint64_t id = 1; id <= 4; id++) {
		struct raft_config c;

		raft_config_init(&c, id);
		c.trailing_entries = 0;
		c.max_msg_entries = 2;
		c.max_inflight_msgs = 2;
		if (CALL(id, raft_new(&c, NULL, &nodes[id].r)) != 0) {
			cr_assert_null(nodes[id].r);
			continue;
		}
		if (id <= 3)
			CALL(id, raft_bootstrap(nodes[id].r, voters, 3));
	}
	settle();
	if (alive(1))
		CALL(1, raft_campaign(nodes[1].r));
	settle();
	tick_all(25);
	/* Enough entries, reads and messages to make every array grow. */
	for (int round = 0; round < 3; round++) {
		if ((l = leader())) {
			for (int k = 0; k < 12; k++)
				CALL(l, raft_propose(nodes[l].r, "abcdef", 6, NULL));
			for (int k = 0; k < 10; k++) {
				char ctx[8];

				snprintf(ctx, sizeof(ctx), "l%d-%d", round, k);
				CALL(l, raft_read_index(nodes[l].r, ctx, strlen(ctx)));
			}
		}
		for (int k = 0; k < 10 && alive(2); k++) {
			char ctx[8];

			snprintf(ctx, sizeof(ctx), "f%d-%d", round, k);
			CALL(2, raft_read_index(nodes[2].r, ctx, strlen(ctx)));
		}
		settle();
	}
	tick_all(2);
	if ((l = leader())) {
		struct raft_conf_change cc = {.type = RAFT_CC_ADD_LEARNER,
					      .node_id = 4,
					      .context = "ctx",
					      .context_len = 3};

		CALL(l, raft_propose_conf_change(nodes[l].r, &cc, NULL));
	}
	tick_all(3);
	if ((l = leader())) {
		struct raft_conf_change cc = {.type = RAFT_CC_PROMOTE, .node_id = 4};

		CALL(l, raft_propose_conf_change(nodes[l].r, &cc, NULL));
	}
	tick_all(3);
	/* 3 falls behind a snapshot, then catches up through it. */
	cut3 = true;
	if ((l = leader())) {
		struct raft_status st;

		for (int k = 0; k < 4; k++)
			CALL(l, raft_propose(nodes[l].r, "ghijkl", 6, NULL));
		settle();
		tick_all(2);
		if (alive(l)) {
			raft_status(nodes[l].r, &st, NULL, 0);
			CALL(l, raft_compact(nodes[l].r, st.applied));
		}
	}
	cut3 = false;
	tick_all(5);
	if ((l = leader()) && alive(l)) {
		uint64_t to = l == 2 ? 1 : 2;

		CALL(l, raft_transfer_leader(nodes[l].r, to));
	}
	tick_all(25);
	if (fail_at < 0) { /* the clean run must have done it all */
		struct raft_status st;

		l = leader();
		cr_assert(l, "no leader at the end");
		raft_status(nodes[l].r, &st, NULL, 0);
		cr_assert(st.term >= 2, "no transfer happened");
		cr_assert(st.commit >= 45, "commit only %" PRIu64, st.commit);
		cr_assert_eq(st.n_voters, 4, "learner not promoted");
		cr_assert(saw_snapshot[3], "3 never installed a snapshot");
		cr_assert(n_read_states >= 40, "%zu read states", n_read_states);
	}
	for (uint64_t id = 1; id <= N; id++) {
		in_core = true;
		raft_free(nodes[id].r);
		in_core = false;
		nodes[id].r = NULL;
	}
	for (size_t k = 0; k < qn; k++)
		tu_msg_free(&queue[k]);
	qn = 0;
}

RTEST(raft_failmalloc, every_allocation_fails_in_turn, .timeout = 300)
{
	long total, leaky = 0;

	fail_at = -1;
	n_allocs = 0;
	scenario();
	total = n_allocs;
	cr_assert_eq(n_live, 0, "clean run left %zu core blocks", n_live);
	cr_assert(total > 100, "only %ld allocations", total);
	for (long i = 1; i <= total; i++) {
		n_allocs = 0;
		n_failed = 0;
		fail_at = i;
		scenario();
		if (n_live != 0 && leaky++ < 5)
			cr_log_error("failing allocation %ld of %ld leaks %zu blocks", i,
				     total, n_live);
		memset(live, 0, sizeof(live));
		n_live = 0;
	}
	fail_at = -1;
	cr_assert_eq(leaky, 0, "%ld of %ld failure points leak", leaky, total);
	cr_log_info("failed each of %ld core allocations in turn", total);
}

#else

RTEST(raft_failmalloc, every_allocation_fails_in_turn)
{
	cr_skip_test("the allocator is interposed only without ASan");
}

#endif
