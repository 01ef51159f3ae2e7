/*
 * test_lhash: linear hashing's bucket array (common/lhash.c). Nodes filed
 * by their hash stay findable in their bucket through every split, every
 * bucket holds only nodes whose hash maps to it, a walk by bucket
 * position that the table outgrows meanwhile still sees every node, and
 * a grow moves one chain; the tables keep at most 3 nodes for 4 buckets.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>

#include "common/lhash.h"
#include "test_rand.h"

struct node {
	uint64_t h;
	struct node *next;
	unsigned id;
};

static void **link_of(void *n)
{
	return (void **)&((struct node *)n)->next;
}

static uint64_t hash_of(const void *n)
{
	return ((const struct node *)n)->h;
}

static const struct mc_lhash_ops ops = {link_of, hash_of};

static uint64_t rng = TEST_RAND_SEED;

static uint64_t next_hash(void)
{
	return test_rand(&rng);
}

/* File n, then grow as the tables do (mc_lhash_added). */
static void insert(struct mc_lhash *t, struct node *n, size_t *count)
{
	void **b = mc_lhash_bucket(t, n->h);
	n->next = *b;
	*b = n;
	mc_lhash_added(t, ++*count, &ops);
	cr_assert_leq(*count * 4, mc_lhash_n(t) * 3, "%zu nodes in %zu buckets", *count,
		      mc_lhash_n(t));
}

/* File n, then add one bucket when there are more nodes than buckets. */
static void insert_one_split(struct mc_lhash *t, struct node *n, size_t *count)
{
	void **b = mc_lhash_bucket(t, n->h);
	n->next = *b;
	*b = n;
	if (++*count > mc_lhash_n(t))
		cr_assert_eq(mc_lhash_grow(t, &ops), 0);
}

static bool find(const struct mc_lhash *t, const struct node *want)
{
	for (struct node *n = *mc_lhash_bucket(t, want->h); n; n = n->next)
		if (n == want)
			return true;
	return false;
}

Test(lhash, every_node_stays_in_its_bucket_through_the_splits)
{
	enum { N = 100000 };
	struct mc_lhash t;
	cr_assert_eq(mc_lhash_init(&t, 3), -EINVAL);
	cr_assert_eq(mc_lhash_init(&t, 4), 0);
	struct node *nodes = calloc(N, sizeof(*nodes));
	size_t count = 0;
	for (unsigned i = 0; i < N; i++) {
		/* Some hashes repeat: equal hashes share every bucket. */
		nodes[i].h = i % 10 == 9 ? nodes[i - 1].h : next_hash();
		nodes[i].id = i;
		insert(&t, &nodes[i], &count);
		if (i % 997 == 0)
			for (unsigned j = 0; j <= i; j += 13)
				cr_assert(find(&t, &nodes[j]), "node %u lost after %u inserts",
					  j, i);
	}
	cr_assert_geq(mc_lhash_n(&t), N + N / 3);
	cr_assert_leq(mc_lhash_n(&t), t.cap);
	size_t seen = 0;
	for (size_t b = 0; b < mc_lhash_n(&t); b++)
		for (struct node *n = t.b[b]; n; n = n->next) {
			cr_assert_eq(mc_lhash_bucket(&t, n->h), &t.b[b],
				     "node %u in bucket %zu", n->id, b);
			seen++;
		}
	cr_assert_eq(seen, N);
	for (unsigned i = 0; i < N; i++)
		cr_assert(find(&t, &nodes[i]));
	cr_assert_eq(mc_lhash_bytes(&t), t.cap * sizeof(void *));
	mc_lhash_free(&t);
	free(nodes);
}

Test(lhash, a_walk_the_table_outgrows_misses_no_node)
{
	enum { OLD = 5000, NEW = 60000 };
	struct mc_lhash t;
	cr_assert_eq(mc_lhash_init(&t, 1), 0);
	struct node *nodes = calloc(OLD + NEW, sizeof(*nodes));
	char *seen = calloc(OLD, 1);
	size_t count = 0, added = OLD;
	for (unsigned i = 0; i < OLD; i++) {
		nodes[i] = (struct node){.h = next_hash(), .id = i};
		insert(&t, &nodes[i], &count);
	}
	/* Seven buckets a step, with inserts (and so splits) in between. */
	for (size_t b = 0; b < mc_lhash_n(&t); b++) {
		for (struct node *n = t.b[b]; n; n = n->next)
			if (n->id < OLD)
				seen[n->id] = 1;
		for (int k = 0; b % 7 == 6 && k < 40 && added < OLD + NEW; k++, added++) {
			nodes[added] = (struct node){.h = next_hash(), .id = (unsigned)added};
			insert(&t, &nodes[added], &count);
		}
	}
	cr_assert_gt(added, OLD + 1000);
	for (unsigned i = 0; i < OLD; i++)
		cr_assert(seen[i], "node %u missed by the walk", i);
	mc_lhash_free(&t);
	free(seen);
	free(nodes);
}

Test(lhash, a_grow_moves_one_chain)
{
	struct mc_lhash t;
	cr_assert_eq(mc_lhash_init(&t, 2), 0);
	struct node a = {.h = 0}, b = {.h = 2}, c = {.h = 4}, d = {.h = 6};
	size_t count = 0;
	insert_one_split(&t, &a, &count);
	insert_one_split(&t, &b, &count); /* count 2 = buckets: no split yet */
	cr_assert_eq(mc_lhash_n(&t), 2);
	insert_one_split(&t, &c, &count); /* splits bucket 0: 0 and 4 stay, 2 moves to 2 */
	cr_assert_eq(mc_lhash_n(&t), 3);
	cr_assert_eq(t.split, 1);
	cr_assert(find(&t, &a) && find(&t, &b) && find(&t, &c));
	cr_assert_eq(mc_lhash_bucket(&t, b.h), &t.b[2]);
	insert_one_split(&t, &d, &count); /* splits bucket 1 (empty); the round ends */
	cr_assert_eq(mc_lhash_n(&t), 4);
	cr_assert_eq(t.base, 4);
	cr_assert_eq(t.split, 0);
	cr_assert(find(&t, &a) && find(&t, &b) && find(&t, &c) && find(&t, &d));
	cr_assert_eq(mc_lhash_bucket(&t, d.h), &t.b[2]);
	mc_lhash_free(&t);
}
