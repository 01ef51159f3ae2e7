/*
 * lhash: the bucket array of a chained hash table that grows one bucket
 * at a time (linear hashing, W. Litwin, 1980), so that no insert pays for
 * rehashing the whole table. Doubling a table at once walks every node,
 * each a cache miss: 2.4 s of the master's loop at 8.4M objects, and as
 * long again at every doubling after. Here an insert that takes the load
 * past 3 nodes for 4 buckets splits one or two buckets: a chain is divided
 * between its bucket and a new one by the next bit of the nodes' hashes.
 *
 * Buckets [0, split) and [base, base + split) are split this round;
 * [split, base) not yet: a hash's bucket is h mod base, or h mod 2 base
 * when that one is split. When every bucket of the round is split, base
 * doubles. A node only ever moves from bucket i to i + base, so a walk by
 * bucket position that a split interrupts may see a node twice but never
 * misses one. The array is reallocated (doubled) when full; its new
 * slots are written when their buckets are made.
 *
 * The table knows nothing of its nodes: mc_lhash_ops says where a node's
 * chain link is and what its hash is. Pure; not thread-safe.
 */
#ifndef MC_COMMON_LHASH_H
#define MC_COMMON_LHASH_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

struct mc_lhash {
	void **b;     /* chain heads: b[0 .. mc_lhash_n) */
	size_t cap;   /* slots allocated (a power of two) */
	size_t base;  /* buckets at the start of this round (a power of two) */
	size_t split; /* buckets split this round */
};

struct mc_lhash_ops {
	void **(*link)(void *node);         /* where node's next pointer is */
	uint64_t (*hash)(const void *node); /* the hash node is filed by */
};

/* An empty table of `buckets` buckets (a power of two, at least 1).
 * Errors: -EINVAL, -ENOMEM. */
int mc_lhash_init(struct mc_lhash *t, size_t buckets) MC_MUST_CHECK;
/* Free the array (not the nodes). */
void mc_lhash_free(struct mc_lhash *t);

/* How many buckets are in use. */
static inline size_t mc_lhash_n(const struct mc_lhash *t)
{
	return t->base + t->split;
}

/* The chain head of hash h's bucket. */
static inline void **mc_lhash_bucket(const struct mc_lhash *t, uint64_t h)
{
	size_t i = (size_t)h & (t->base - 1);
	if (i < t->split)
		i = (size_t)h & (2 * t->base - 1);
	return &t->b[i];
}

/* Add a bucket, splitting the next one's chain. Errors: -ENOMEM (the
 * table is as it was: longer chains, still correct, so a caller may go
 * on without it). */
int mc_lhash_grow(struct mc_lhash *t, const struct mc_lhash_ops *ops);

/* After an insert that made the table hold `count` nodes: add buckets
 * while there are more than 3 nodes for 4 buckets, the load at which
 * doubling kept chains on average; at most two an insert, which is all
 * one insert needs, so a table that fell behind (its owner held its
 * growth for a while) catches up over the next inserts, not in one. */
static inline void mc_lhash_added(struct mc_lhash *t, size_t count,
				  const struct mc_lhash_ops *ops)
{
	for (int i = 0; i < 2 && count * 4 > mc_lhash_n(t) * 3; i++)
		if (mc_lhash_grow(t, ops) != 0)
			break;
}

/* Bytes of the array. */
static inline size_t mc_lhash_bytes(const struct mc_lhash *t)
{
	return t->cap * sizeof(*t->b);
}

#endif
