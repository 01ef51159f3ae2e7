/*
 * test_master_alloc: the master's per-segment offset allocator — size
 * classes, coalescing with both neighbours, reserve, double-free and
 * range checks, fragmentation, and long random alloc/free/reserve runs
 * checked against a bitmap model after every step.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "master/core.h"

#define G MASTER_ALLOC_GRANULE

static void must(int rc)
{
	cr_assert_eq(rc, 0, "rc %d (%s)", rc, mc_strerror(rc));
}

struct ranges {
	uint64_t off[4096], len[4096];
	size_t n;
};

static void collect(void *ud, uint64_t off, uint64_t len)
{
	struct ranges *r = ud;
	cr_assert_lt(r->n, 4096);
	r->off[r->n] = off;
	r->len[r->n] = len;
	r->n++;
}

Test(master_alloc, classes_are_monotone_and_bounded)
{
	unsigned prev = 0;
	for (uint64_t g = 1; g < (1u << 20); g += 1 + g / 64) {
		unsigned c = master__alloc_class(g * G);
		cr_assert_geq(c, prev, "class of %llu", (unsigned long long)g);
		cr_assert_lt(c, MASTER_ALLOC_NBINS);
		prev = c;
	}
	cr_assert_lt(master__alloc_class(UINT64_MAX & ~(uint64_t)(G - 1)), MASTER_ALLOC_NBINS);
	cr_assert_eq(master__alloc_class(G), 1);
	cr_assert_eq(master__alloc_class(15 * G), 15);
	cr_assert_eq(master__alloc_class(16 * G), 16);
	cr_assert_eq(master__alloc_class(20 * G), 17);
	cr_assert_eq(master__alloc_len(0), 0);
	cr_assert_eq(master__alloc_len(1), G);
	cr_assert_eq(master__alloc_len(G), G);
	cr_assert_eq(master__alloc_len(G + 1), 2 * G);
}

Test(master_alloc, alloc_free_coalesce)
{
	struct master_alloc *a;
	must(master__alloc_new(100 * G, 1, &a));
	uint64_t o[5];
	for (int i = 0; i < 5; i++) {
		must(master__alloc_get(a, 10 * G, &o[i]));
		cr_assert_eq(o[i], (uint64_t)i * 10 * G, "first fit from the front");
	}
	struct master_alloc_stats st;
	master__alloc_stats(a, &st);
	cr_assert_eq(st.used, 50 * G);
	cr_assert_eq(st.free_ranges, 1);
	/* Free 1 and 3: three free ranges, fragmented. */
	must(master__alloc_put(a, o[1], 10 * G));
	must(master__alloc_put(a, o[3], 10 * G));
	master__alloc_stats(a, &st);
	cr_assert_eq(st.free_ranges, 3);
	cr_assert_eq(st.largest_free, 50 * G);
	cr_assert_float_eq(st.fragmentation, 1.0 - 50.0 / 70.0, 1e-9);
	/* Freeing 2 joins both neighbours. */
	must(master__alloc_put(a, o[2], 10 * G));
	master__alloc_stats(a, &st);
	cr_assert_eq(st.free_ranges, 2);
	struct ranges r = {.n = 0};
	master__alloc_foreach_free(a, collect, &r);
	cr_assert_eq(r.n, 2);
	cr_assert_eq(r.off[0], 10 * G);
	cr_assert_eq(r.len[0], 30 * G);
	cr_assert_eq(r.off[1], 50 * G);
	/* Freeing 4 joins the tail range from below; 0 joins from above. */
	must(master__alloc_put(a, o[4], 10 * G));
	must(master__alloc_put(a, o[0], 10 * G));
	master__alloc_stats(a, &st);
	cr_assert_eq(st.free_ranges, 1);
	cr_assert_eq(st.free, 100 * G);
	cr_assert_float_eq(st.fragmentation, 0.0, 1e-12);
	master__alloc_free(a);
}

Test(master_alloc, errors)
{
	struct master_alloc *a;
	cr_assert_eq(master__alloc_new(G - 1, 1, &a), -EINVAL);
	must(master__alloc_new(10 * G + 5, 1, &a)); /* rounded down */
	uint64_t off;
	cr_assert_eq(master__alloc_get(a, 0, &off), -EINVAL);
	cr_assert_eq(master__alloc_get(a, G + 1, &off), -EINVAL);
	cr_assert_eq(master__alloc_get(a, 11 * G, &off), MC_ENO_SPACE);
	must(master__alloc_get(a, 4 * G, &off));
	cr_assert_eq(master__alloc_put(a, off + 4 * G, G), -EINVAL, "double free");
	cr_assert_eq(master__alloc_put(a, 20 * G, G), -EINVAL, "out of range");
	cr_assert_eq(master__alloc_put(a, 1, G), -EINVAL, "unaligned");
	cr_assert_eq(master__alloc_put(a, 3 * G, 2 * G), -EINVAL, "overlaps free");
	cr_assert_eq(master__alloc_reserve(a, 2 * G, G), -EBUSY, "allocated");
	cr_assert_eq(master__alloc_reserve(a, 8 * G, 4 * G), -EINVAL, "past the end");
	must(master__alloc_reserve(a, 6 * G, 2 * G));
	struct ranges r = {.n = 0};
	master__alloc_foreach_free(a, collect, &r);
	cr_assert_eq(r.n, 2);
	cr_assert_eq(r.off[0], 4 * G);
	cr_assert_eq(r.len[0], 2 * G);
	cr_assert_eq(r.off[1], 8 * G);
	cr_assert_eq(r.len[1], 2 * G);
	/* No single range of 3 granules although 4 are free. */
	cr_assert_eq(master__alloc_get(a, 3 * G, &off), MC_ENO_SPACE);
	master__alloc_free(a);
}

Test(master_alloc, best_class_reuses_small_holes)
{
	struct master_alloc *a;
	must(master__alloc_new(1000 * G, 7, &a));
	uint64_t small, big, sep;
	must(master__alloc_get(a, 2 * G, &small));
	must(master__alloc_get(a, G, &sep));
	must(master__alloc_get(a, 100 * G, &big));
	must(master__alloc_put(a, small, 2 * G));
	uint64_t off;
	must(master__alloc_get(a, 2 * G, &off));
	cr_assert_eq(off, small, "a hole of the exact class is used before the big tail");
	master__alloc_free(a);
}

/* Random alloc/free/reserve against a bitmap of granules. */
Test(master_alloc, random_against_model)
{
	const uint64_t ngran = 4096;
	struct master_alloc *a;
	must(master__alloc_new(ngran * G, 42, &a));
	uint8_t *model = calloc(ngran, 1);
	struct {
		uint64_t off, len;
	} live[2048];
	size_t nlive = 0;
	uint64_t rng = 12345, used = 0;
	for (int step = 0; step < 200000; step++) {
		rng = rng * 6364136223846793005ull + 1442695040888963407ull;
		unsigned r = (unsigned)(rng >> 33);
		bool do_free = nlive && (r % 100 < 45 || nlive == 2048);
		if (do_free) {
			size_t i = (r / 100) % nlive;
			must(master__alloc_put(a, live[i].off, live[i].len));
			for (uint64_t g = 0; g < live[i].len / G; g++)
				model[live[i].off / G + g] = 0;
			used -= live[i].len;
			live[i] = live[--nlive];
		} else if (r % 100 < 50) {
			/* reserve a random range: succeeds iff free in the model */
			uint64_t lg = 1 + (r / 100) % 8, og = (r / 1000) % (ngran - lg);
			bool free_in_model = true;
			for (uint64_t g = 0; g < lg; g++)
				free_in_model &= model[og + g] == 0;
			int rc = master__alloc_reserve(a, og * G, lg * G);
			cr_assert_eq(rc, free_in_model ? 0 : -EBUSY, "reserve step %d", step);
			if (rc == 0) {
				for (uint64_t g = 0; g < lg; g++)
					model[og + g] = 1;
				live[nlive].off = og * G;
				live[nlive].len = lg * G;
				nlive++;
				used += lg * G;
			}
		} else {
			uint64_t lg = 1 + ((r / 100) % 64) * ((r / 10000) % 4 ? 1 : 8);
			uint64_t off;
			int rc = master__alloc_get(a, lg * G, &off);
			if (rc == 0) {
				cr_assert_eq(off % G, 0);
				cr_assert_leq(off + lg * G, ngran * G);
				for (uint64_t g = 0; g < lg; g++) {
					cr_assert_eq(model[off / G + g], 0,
						     "step %d: handed out twice", step);
					model[off / G + g] = 1;
				}
				live[nlive].off = off;
				live[nlive].len = lg * G;
				nlive++;
				used += lg * G;
			} else {
				cr_assert_eq(rc, MC_ENO_SPACE);
				/* Only when no run of lg free granules exists. */
				uint64_t run = 0, best = 0;
				for (uint64_t g = 0; g < ngran; g++) {
					run = model[g] ? 0 : run + 1;
					best = run > best ? run : best;
				}
				cr_assert_lt(best, lg,
					     "step %d: NO_SPACE with a free run of %llu", step,
					     (unsigned long long)best);
			}
		}
		if (step % 97 == 0) {
			/* Free ranges are exactly the model's maximal free runs. */
			struct ranges rs = {.n = 0};
			master__alloc_foreach_free(a, collect, &rs);
			size_t k = 0;
			for (uint64_t g = 0; g < ngran;) {
				if (model[g]) {
					g++;
					continue;
				}
				uint64_t s = g;
				while (g < ngran && !model[g])
					g++;
				cr_assert_lt(k, rs.n);
				cr_assert_eq(rs.off[k], s * G, "step %d", step);
				cr_assert_eq(rs.len[k], (g - s) * G, "step %d", step);
				k++;
			}
			cr_assert_eq(k, rs.n, "step %d: uncoalesced ranges", step);
			struct master_alloc_stats st;
			master__alloc_stats(a, &st);
			cr_assert_eq(st.used, used);
			cr_assert_eq(st.free_ranges, rs.n);
		}
	}
	free(model);
	master__alloc_free(a);
}
