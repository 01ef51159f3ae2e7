/*
 * extalloc: an offset allocator over [0, size) whose allocations are
 * multiples of a granule (a power of two) and aligned to it: the master's
 * per-segment allocator (granule 64 bytes) and the SSD tier's extent
 * allocator (granule one disk block). Size classes (TLSF-like: exact
 * classes for the first 16 granules, four per power of two above) serve
 * allocation; free ranges are also kept in an offset-ordered treap for
 * coalescing with both neighbours and for reserving a given range (an
 * inventory re-sync, a recovered index). Allocated ranges cost nothing:
 * the caller passes (offset, len) back to free them.
 *
 * Pure: no I/O, no clock, no global state (the treap's priorities come
 * from a generator seeded by the caller). Thread-compatible.
 */
#ifndef MC_COMMON_EXTALLOC_H
#define MC_COMMON_EXTALLOC_H

#include <stdint.h>

#include "common/err.h"

#define MC_EXTALLOC_NBINS 256
#define MC__EXTALLOC_WORDS (MC_EXTALLOC_NBINS / 64)

struct mc_extalloc_range;

/* Caller storage; every field is private. */
struct mc_extalloc {
	uint64_t size, free, granule;
	unsigned granule_shift;
	uint64_t nranges;
	uint64_t rng;
	struct mc_extalloc_range *root;
	struct mc_extalloc_range *bins[MC_EXTALLOC_NBINS];
	uint64_t bitmap[MC__EXTALLOC_WORDS];
};

/* An allocator for [0, size rounded down to the granule), all of it free.
 * seed drives the treap's priorities. Errors: -EINVAL (granule not a power
 * of two, or size below one granule), -ENOMEM. On an error *a needs no
 * close. */
int mc_extalloc_init(struct mc_extalloc *a, uint64_t size, uint64_t granule,
		     uint64_t seed) MC_MUST_CHECK;
/* Free what the allocator holds (not the struct, the caller's). */
void mc_extalloc_close(struct mc_extalloc *a);

/* The length allocated for size bytes: size rounded up to the granule (0
 * for 0). */
uint64_t mc_extalloc_len(const struct mc_extalloc *a, uint64_t size);

/* Allocate len bytes (a multiple of the granule, > 0). Errors:
 * MC_ENO_SPACE (no free range that large), -EINVAL, -ENOMEM. */
int mc_extalloc_get(struct mc_extalloc *a, uint64_t len, uint64_t *off) MC_MUST_CHECK;
/* Mark [off, off+len) allocated. Errors: -EBUSY (not entirely free),
 * -EINVAL (unaligned or out of range), -ENOMEM. */
int mc_extalloc_reserve(struct mc_extalloc *a, uint64_t off, uint64_t len) MC_MUST_CHECK;
/* Free [off, off+len), coalescing with free neighbours. Errors: -EINVAL
 * (unaligned, out of range, or overlapping free space: a double free),
 * -ENOMEM (a new free range could not be recorded; the space is lost). */
int mc_extalloc_put(struct mc_extalloc *a, uint64_t off, uint64_t len) MC_MUST_CHECK;

/* Free bytes (O(1), unlike mc_extalloc_stats). */
uint64_t mc_extalloc_free_bytes(const struct mc_extalloc *a);

struct mc_extalloc_stats {
	uint64_t size, used, free;
	uint64_t largest_free;
	uint64_t free_ranges;
	double fragmentation; /* 1 - largest_free / free; 0 when free is 0 */
};
void mc_extalloc_stats(const struct mc_extalloc *a, struct mc_extalloc_stats *st);
/* Walk the free ranges in offset order (tests: compare with a model). */
void mc_extalloc_foreach_free(const struct mc_extalloc *a,
			      void (*fn)(void *ud, uint64_t off, uint64_t len), void *ud);
/* Size class of a length (tests). */
unsigned mc_extalloc_class(const struct mc_extalloc *a, uint64_t len);

#endif
