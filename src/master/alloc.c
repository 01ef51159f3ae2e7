/*
 * alloc: the master's per-segment offset allocator (core.h), which is
 * common/extalloc with a granule of MASTER_ALLOC_GRANULE bytes.
 */
#include <errno.h>
#include <stdlib.h>

#include "common/extalloc.h"
#include "master/core.h"

struct master_alloc {
	struct mc_extalloc x;
};

/* Class and length depend only on the granule, not on an allocator's
 * size: a one-granule allocator answers them for every length. */
static const struct mc_extalloc granule_only = {
	.size = MASTER_ALLOC_GRANULE,
	.granule = MASTER_ALLOC_GRANULE,
	.granule_shift = __builtin_ctz(MASTER_ALLOC_GRANULE),
};

int master__alloc_new(uint64_t size, uint64_t seed, struct master_alloc **out)
{
	struct master_alloc *a = malloc(sizeof(*a));
	if (!a)
		return -ENOMEM;
	int rc = mc_extalloc_init(&a->x, size, MASTER_ALLOC_GRANULE, seed);
	if (rc < 0) {
		free(a);
		return rc;
	}
	*out = a;
	return 0;
}

void master__alloc_free(struct master_alloc *a)
{
	if (!a)
		return;
	mc_extalloc_close(&a->x);
	free(a);
}

uint64_t master__alloc_len(uint64_t size)
{
	return mc_extalloc_len(&granule_only, size);
}

unsigned master__alloc_class(uint64_t len)
{
	return mc_extalloc_class(&granule_only, len);
}

int master__alloc_get(struct master_alloc *a, uint64_t len, uint64_t *off)
{
	return mc_extalloc_get(&a->x, len, off);
}

int master__alloc_reserve(struct master_alloc *a, uint64_t off, uint64_t len)
{
	return mc_extalloc_reserve(&a->x, off, len);
}

int master__alloc_put(struct master_alloc *a, uint64_t off, uint64_t len)
{
	return mc_extalloc_put(&a->x, off, len);
}

uint64_t master__alloc_free_bytes(const struct master_alloc *a)
{
	return mc_extalloc_free_bytes(&a->x);
}

void master__alloc_stats(const struct master_alloc *a, struct master_alloc_stats *st)
{
	struct mc_extalloc_stats x;
	mc_extalloc_stats(&a->x, &x);
	st->size = x.size;
	st->used = x.used;
	st->free = x.free;
	st->largest_free = x.largest_free;
	st->free_ranges = x.free_ranges;
	st->fragmentation = x.fragmentation;
}

void master__alloc_foreach_free(const struct master_alloc *a,
				void (*fn)(void *ud, uint64_t off, uint64_t len), void *ud)
{
	mc_extalloc_foreach_free(&a->x, fn, ud);
}
