/*
 * lhash: linear hashing's bucket array (lhash.h).
 */
#include "common/lhash.h"

#include <errno.h>
#include <stdlib.h>

int mc_lhash_init(struct mc_lhash *t, size_t buckets)
{
	if (buckets == 0 || (buckets & (buckets - 1)) != 0)
		return -EINVAL;
	t->b = calloc(buckets, sizeof(*t->b));
	if (!t->b)
		return -ENOMEM;
	t->cap = t->base = buckets;
	t->split = 0;
	return 0;
}

void mc_lhash_free(struct mc_lhash *t)
{
	free(t->b);
	t->b = NULL;
	t->cap = t->base = t->split = 0;
}

int mc_lhash_grow(struct mc_lhash *t, const struct mc_lhash_ops *ops)
{
	if (mc_lhash_n(t) == t->cap) {
		/* Large arrays come from mmap, whose realloc moves no bytes. */
		void **b = realloc(t->b, 2 * t->cap * sizeof(*b));
		if (!b)
			return -ENOMEM;
		t->b = b;
		t->cap *= 2;
	}
	size_t from = t->split, to = t->split + t->base;
	void *stay = NULL, *move = NULL;
	void **stay_end = &stay, **move_end = &move;
	for (void *n = t->b[from]; n;) {
		void **link = ops->link(n);
		void *next = *link;
		if (ops->hash(n) & t->base) {
			*move_end = n;
			move_end = link;
		} else {
			*stay_end = n;
			stay_end = link;
		}
		n = next;
	}
	*stay_end = NULL;
	*move_end = NULL;
	t->b[from] = stay;
	t->b[to] = move;
	if (++t->split == t->base) {
		t->base *= 2;
		t->split = 0;
	}
	return 0;
}
