/*
 * test_meta_compact: etcd's automatic compaction as the leader runs it
 * (compact.c), on a fake clock — periodic retention (notes every tenth
 * of the period, compacts to what it noted a period ago, every period,
 * at most every hour; a bare number is hours), revision retention (every
 * 5 minutes, all but the newest N), followers that note but never
 * compact, a leader that takes over, failures tried again, and etcd's
 * syntax refused where it is wrong.
 */
#include <criterion/criterion.h>

#include "meta/meta_int.h"

#define MIN_MS 60000ull

/* The store gains one revision per second of the fake clock. */
static int64_t rev_at(uint64_t t_ms)
{
	return 1 + (int64_t)(t_ms / 1000);
}

/* Ticks every 100 ms from t0 to t1; returns the compactions proposed (and
 * acknowledged at once) and the last revision. */
static int run(struct meta__compactor *c, uint64_t t0, uint64_t t1, bool leader,
	       int64_t *compacted, int64_t *last)
{
	int k = 0;
	for (uint64_t t = t0; t <= t1; t += 100) {
		int64_t to;
		if (meta__compactor_step(c, t, rev_at(t), *compacted, leader, &to)) {
			k++;
			*last = to;
			*compacted = to;
			meta__compactor_done(c, t, to, true);
		}
	}
	return k;
}

Test(meta_compact, periodic_keeps_a_period_of_history)
{
	struct meta__compactor c;
	int64_t compacted = 0, last = 0;
	cr_assert_eq(meta__compactor_init(&c, "periodic", "5m"), 0);
	cr_assert(meta__compactor_on(&c));
	cr_assert_eq(run(&c, 0, 5 * MIN_MS - 100, true, &compacted, &last), 0,
		     "nothing before a whole period");
	cr_assert_eq(run(&c, 5 * MIN_MS, 5 * MIN_MS, true, &compacted, &last), 1);
	cr_assert_eq(last, rev_at(0), "to the revision noted a period ago");
	cr_assert_eq(run(&c, 5 * MIN_MS + 100, 10 * MIN_MS - 100, true, &compacted, &last), 0);
	cr_assert_eq(run(&c, 10 * MIN_MS, 10 * MIN_MS, true, &compacted, &last), 1);
	cr_assert_eq(last, rev_at(5 * MIN_MS));
	meta__compactor_free(&c);
}

Test(meta_compact, long_periods_compact_every_hour_and_bare_numbers_are_hours)
{
	struct meta__compactor c;
	int64_t compacted = 0, last = 0;
	cr_assert_eq(meta__compactor_init(&c, "periodic", "2"), 0);
	cr_assert_eq(c.period_ms, 120 * MIN_MS);
	cr_assert_eq(c.interval_ms, 60 * MIN_MS);
	cr_assert_eq(c.sample_ms, 6 * MIN_MS);
	cr_assert_eq(run(&c, 0, 120 * MIN_MS, true, &compacted, &last), 1);
	cr_assert_eq(last, rev_at(0));
	cr_assert_eq(run(&c, 120 * MIN_MS + 100, 180 * MIN_MS, true, &compacted, &last), 1,
		     "then every hour");
	cr_assert_eq(last, rev_at(60 * MIN_MS), "still keeping two hours");
	meta__compactor_free(&c);
}

Test(meta_compact, followers_note_and_a_new_leader_compacts_at_once)
{
	struct meta__compactor c;
	int64_t compacted = 0, last = 0;
	cr_assert_eq(meta__compactor_init(&c, "periodic", "5m"), 0);
	cr_assert_eq(run(&c, 0, 12 * MIN_MS, false, &compacted, &last), 0,
		     "a follower never compacts");
	cr_assert_eq(run(&c, 12 * MIN_MS + 100, 12 * MIN_MS + 100, true, &compacted, &last),
		     1);
	cr_assert_geq(last, rev_at(7 * MIN_MS - 30000));
	cr_assert_leq(last, rev_at(7 * MIN_MS + 100));
	meta__compactor_free(&c);
}

Test(meta_compact, failures_are_tried_again_after_a_note)
{
	struct meta__compactor c;
	int64_t to;
	cr_assert_eq(meta__compactor_init(&c, "periodic", "10m"), 0);
	for (uint64_t t = 0; t < 10 * MIN_MS; t += 100)
		cr_assert(!meta__compactor_step(&c, t, rev_at(t), 0, true, &to));
	cr_assert(meta__compactor_step(&c, 10 * MIN_MS, rev_at(10 * MIN_MS), 0, true, &to));
	cr_assert(!meta__compactor_step(&c, 10 * MIN_MS + 100, 0, 0, true, &to),
		  "one at a time");
	meta__compactor_done(&c, 10 * MIN_MS + 200, to, false);
	cr_assert(!meta__compactor_step(&c, 10 * MIN_MS + 300, rev_at(10 * MIN_MS), 0, true,
					&to),
		  "not at once");
	cr_assert(
		meta__compactor_step(&c, 11 * MIN_MS + 200, rev_at(11 * MIN_MS), 0, true, &to),
		"after a note interval");
	meta__compactor_free(&c);
}

/* The node may compact to less than asked: the rest follows in steps,
 * one META_COMPACT_STEP_GAP_MS after the other, before the next period. */
Test(meta_compact, a_compaction_goes_on_in_steps)
{
	struct meta__compactor c;
	int64_t to, compacted = 0;
	cr_assert_eq(meta__compactor_init(&c, "periodic", "5m"), 0);
	for (uint64_t t = 0; t < 5 * MIN_MS; t += 100) /* -1: a store never compacted */
		cr_assert(!meta__compactor_step(&c, t, 100000 + (int64_t)t, -1, true, &to));
	uint64_t t = 5 * MIN_MS;
	cr_assert(meta__compactor_step(&c, t, 500000, compacted, true, &to));
	cr_assert_eq(to, 100000, "the revision noted a period ago");
	int steps = 1;
	for (;;) {
		compacted += 30000; /* a step the node chose */
		if (compacted > to)
			compacted = to;
		meta__compactor_done(&c, t, compacted, true);
		if (compacted == 100000)
			break;
		cr_assert(!meta__compactor_step(&c, t + META_COMPACT_STEP_GAP_MS - 1, 500000,
						compacted, true, &to),
			  "the loop serves between steps");
		t += META_COMPACT_STEP_GAP_MS;
		cr_assert(meta__compactor_step(&c, t, 500000, compacted, true, &to));
		cr_assert_eq(to, 100000, "the same goal");
		steps++;
	}
	cr_assert_eq(steps, 4);
	cr_assert(!meta__compactor_step(&c, t + 1000, 500000, compacted, true, &to),
		  "then nothing until the next period");
	/* A step that fails ends the goal: tried again at the next note. */
	t = 11 * MIN_MS;
	cr_assert(meta__compactor_step(&c, t, 600000, compacted, true, &to));
	meta__compactor_done(&c, t, compacted + 1000, true);
	t += META_COMPACT_STEP_GAP_MS;
	cr_assert(meta__compactor_step(&c, t, 600000, compacted + 1000, true, &to));
	meta__compactor_done(&c, t, to, false);
	cr_assert(!meta__compactor_step(&c, t + META_COMPACT_STEP_GAP_MS, 600000,
					compacted + 1000, true, &to));
	meta__compactor_free(&c);
}

Test(meta_compact, revision_mode_keeps_the_newest_revisions)
{
	struct meta__compactor c;
	int64_t compacted = 0, last = 0;
	cr_assert_eq(meta__compactor_init(&c, "revision", "100"), 0);
	cr_assert_eq(run(&c, 0, 5 * MIN_MS - 100, true, &compacted, &last), 0);
	cr_assert_eq(run(&c, 5 * MIN_MS, 5 * MIN_MS, true, &compacted, &last), 1);
	cr_assert_eq(last, rev_at(5 * MIN_MS) - 100);
	cr_assert_eq(run(&c, 5 * MIN_MS + 100, 10 * MIN_MS, true, &compacted, &last), 1);
	cr_assert_eq(last, rev_at(10 * MIN_MS) - 100);
	/* A store that did not move: nothing to do. */
	int64_t to;
	cr_assert(!meta__compactor_step(&c, 15 * MIN_MS, rev_at(10 * MIN_MS), compacted, true,
					&to));
	meta__compactor_free(&c);
}

Test(meta_compact, off_and_bad_settings)
{
	struct meta__compactor c;
	int64_t to;
	cr_assert_eq(meta__compactor_init(&c, "periodic", "0"), 0);
	cr_assert(!meta__compactor_on(&c));
	cr_assert(!meta__compactor_step(&c, 100 * MIN_MS, 1000, 0, true, &to));
	meta__compactor_free(&c);
	cr_assert_eq(meta__compactor_init(&c, "revision", "0"), 0);
	cr_assert(!meta__compactor_on(&c));
	cr_assert_eq(meta__compactor_init(&c, "periodic", "5 minutes"), MC_ECONFIG);
	cr_assert_eq(meta__compactor_init(&c, "revision", "5m"), MC_ECONFIG);
	cr_assert_eq(meta__compactor_init(&c, "hourly", "1"), MC_ECONFIG);
	cr_assert_eq(meta__compactor_init(&c, "periodic", "90s"), 0);
	cr_assert_eq(c.sample_ms, 9000);
	meta__compactor_free(&c);
}
