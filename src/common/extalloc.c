/*
 * extalloc: an offset allocator over [0, size) in multiples of a granule.
 * See extalloc.h for the API.
 *
 * Free ranges are nodes in two structures at once:
 *   - a treap ordered by offset (priorities from a xorshift generator
 *     seeded at creation), to find the neighbours of a freed range in
 *     O(log n) and coalesce with them, and to find the range containing
 *     an offset for reserve;
 *   - one doubly-linked list per size class, with a bitmap of non-empty
 *     classes, for allocation: a few nodes of the request's own class
 *     are tried first fit, then the first node of the next non-empty
 *     class, which always fits (classes are ordered by size).
 * Allocation takes the front of a free range; the rest keeps its node and
 * its place in the treap (its offset grows but stays between the same
 * neighbours), so an allocation never touches the tree unless it uses a
 * range up exactly.
 */
#include "common/extalloc.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define SAME_CLASS_PROBES 16
#define BITMAP_WORDS MC__EXTALLOC_WORDS

struct mc_extalloc_range {
	uint64_t off, len;
	struct mc_extalloc_range *l, *r;         /* treap by offset */
	struct mc_extalloc_range *bprev, *bnext; /* size-class list */
	uint32_t prio;
	uint16_t bin;
};

uint64_t mc_extalloc_len(const struct mc_extalloc *a, uint64_t size)
{
	uint64_t m = a->granule - 1;
	if (size == 0)
		return 0;
	if (size > UINT64_MAX - m)
		return UINT64_MAX - m; /* never fits */
	return (size + m) & ~m;
}

unsigned mc_extalloc_class(const struct mc_extalloc *a, uint64_t len)
{
	uint64_t g = len >> a->granule_shift;
	if (g < 16)
		return (unsigned)g;
	unsigned fl = 63u - (unsigned)__builtin_clzll(g);
	unsigned sl = (unsigned)(g >> (fl - 2)) & 3u;
	return 16u + (fl - 4u) * 4u + sl;
}

static uint32_t next_prio(struct mc_extalloc *a)
{
	uint64_t x = a->rng;
	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	a->rng = x;
	return (uint32_t)(x >> 32);
}

/* ------------------------------------------------------------ bins */

static void bin_add(struct mc_extalloc *a, struct mc_extalloc_range *n)
{
	unsigned b = mc_extalloc_class(a, n->len);
	n->bin = (uint16_t)b;
	n->bprev = NULL;
	n->bnext = a->bins[b];
	if (n->bnext)
		n->bnext->bprev = n;
	a->bins[b] = n;
	a->bitmap[b / 64] |= 1ull << (b % 64);
}

static void bin_del(struct mc_extalloc *a, struct mc_extalloc_range *n)
{
	unsigned b = n->bin;
	if (n->bprev)
		n->bprev->bnext = n->bnext;
	else
		a->bins[b] = n->bnext;
	if (n->bnext)
		n->bnext->bprev = n->bprev;
	if (!a->bins[b])
		a->bitmap[b / 64] &= ~(1ull << (b % 64));
}

/* First non-empty class >= from, or -1. */
static int bin_find(const struct mc_extalloc *a, unsigned from)
{
	if (from >= MC_EXTALLOC_NBINS)
		return -1;
	unsigned w = from / 64;
	uint64_t bits = a->bitmap[w] & (~0ull << (from % 64));
	for (;;) {
		if (bits)
			return (int)(w * 64 + (unsigned)__builtin_ctzll(bits));
		if (++w == BITMAP_WORDS)
			return -1;
		bits = a->bitmap[w];
	}
}

/* ------------------------------------------------------------ treap */

/* Split t into offsets < key (*lo) and >= key (*hi). */
static void split(struct mc_extalloc_range *t, uint64_t key, struct mc_extalloc_range **lo,
		  struct mc_extalloc_range **hi)
{
	if (!t) {
		*lo = *hi = NULL;
	} else if (t->off < key) {
		split(t->r, key, &t->r, hi);
		*lo = t;
	} else {
		split(t->l, key, lo, &t->l);
		*hi = t;
	}
}

/* Every offset in a is below every offset in b. */
static struct mc_extalloc_range *merge(struct mc_extalloc_range *a,
				       struct mc_extalloc_range *b)
{
	if (!a)
		return b;
	if (!b)
		return a;
	if (a->prio > b->prio) {
		a->r = merge(a->r, b);
		return a;
	}
	b->l = merge(a, b->l);
	return b;
}

static void tree_insert(struct mc_extalloc *a, struct mc_extalloc_range *n)
{
	struct mc_extalloc_range *lo, *hi;
	n->l = n->r = NULL;
	split(a->root, n->off, &lo, &hi);
	a->root = merge(merge(lo, n), hi);
}

static void tree_remove(struct mc_extalloc *a, struct mc_extalloc_range *n)
{
	struct mc_extalloc_range *lo, *mid, *hi;
	split(a->root, n->off, &lo, &mid);
	split(mid, n->off + 1, &mid, &hi);
	a->root = merge(lo, hi);
}

/* The free range with the greatest offset <= off, or NULL. */
static struct mc_extalloc_range *tree_floor(const struct mc_extalloc *a, uint64_t off)
{
	struct mc_extalloc_range *t = a->root, *best = NULL;
	while (t) {
		if (t->off <= off) {
			best = t;
			t = t->r;
		} else {
			t = t->l;
		}
	}
	return best;
}

/* The free range with the smallest offset > off, or NULL. */
static struct mc_extalloc_range *tree_above(const struct mc_extalloc *a, uint64_t off)
{
	struct mc_extalloc_range *t = a->root, *best = NULL;
	while (t) {
		if (t->off > off) {
			best = t;
			t = t->l;
		} else {
			t = t->r;
		}
	}
	return best;
}

static struct mc_extalloc_range *range_new(struct mc_extalloc *a, uint64_t off, uint64_t len)
{
	struct mc_extalloc_range *n = calloc(1, sizeof(*n));
	if (!n)
		return NULL;
	n->off = off;
	n->len = len;
	n->prio = next_prio(a);
	tree_insert(a, n);
	bin_add(a, n);
	a->nranges++;
	return n;
}

static void range_del(struct mc_extalloc *a, struct mc_extalloc_range *n)
{
	bin_del(a, n);
	tree_remove(a, n);
	a->nranges--;
	free(n);
}

/* ------------------------------------------------------------ API */

int mc_extalloc_init(struct mc_extalloc *a, uint64_t size, uint64_t granule, uint64_t seed)
{
	memset(a, 0, sizeof(*a));
	if (granule == 0 || (granule & (granule - 1)) != 0)
		return -EINVAL;
	size &= ~(granule - 1);
	if (size == 0)
		return -EINVAL;
	a->size = size;
	a->granule = granule;
	a->granule_shift = (unsigned)__builtin_ctzll(granule);
	a->rng = seed ? seed : 0x9e3779b97f4a7c15ull;
	if (!range_new(a, 0, size))
		return -ENOMEM;
	a->free = size;
	return 0;
}

static void free_tree(struct mc_extalloc_range *t)
{
	while (t) {
		free_tree(t->l);
		struct mc_extalloc_range *r = t->r;
		free(t);
		t = r;
	}
}

void mc_extalloc_close(struct mc_extalloc *a)
{
	free_tree(a->root);
	a->root = NULL;
	memset(a->bins, 0, sizeof(a->bins));
	memset(a->bitmap, 0, sizeof(a->bitmap));
	a->nranges = 0;
	a->free = 0;
}

static bool aligned(const struct mc_extalloc *a, uint64_t v)
{
	return (v & (a->granule - 1)) == 0;
}

/* Take len bytes from the front of n. */
static void take_front(struct mc_extalloc *a, struct mc_extalloc_range *n, uint64_t len)
{
	if (n->len == len) {
		range_del(a, n);
	} else {
		bin_del(a, n);
		n->off += len;
		n->len -= len;
		bin_add(a, n);
	}
	a->free -= len;
}

int mc_extalloc_get(struct mc_extalloc *a, uint64_t len, uint64_t *off)
{
	if (len == 0 || !aligned(a, len))
		return -EINVAL;
	if (len > a->free)
		return MC_ENO_SPACE;
	unsigned c = mc_extalloc_class(a, len);
	struct mc_extalloc_range *n = c < MC_EXTALLOC_NBINS ? a->bins[c] : NULL;
	for (int i = 0; n && i < SAME_CLASS_PROBES; i++, n = n->bnext)
		if (n->len >= len)
			break;
	if (!n || n->len < len) {
		int b = bin_find(a, c + 1);
		if (b < 0)
			return MC_ENO_SPACE;
		n = a->bins[b];
	}
	*off = n->off;
	take_front(a, n, len);
	return 0;
}

int mc_extalloc_reserve(struct mc_extalloc *a, uint64_t off, uint64_t len)
{
	if (len == 0 || !aligned(a, off) || !aligned(a, len) || off > a->size ||
	    len > a->size - off)
		return -EINVAL;
	struct mc_extalloc_range *n = tree_floor(a, off);
	if (!n || n->off + n->len < off + len)
		return -EBUSY;
	uint64_t tail_off = off + len, tail_len = n->off + n->len - tail_off;
	if (n->off == off) {
		take_front(a, n, len);
		return 0;
	}
	/* n keeps its head [n->off, off); the tail becomes a new range. */
	if (tail_len && !range_new(a, tail_off, tail_len))
		return -ENOMEM;
	bin_del(a, n);
	n->len = off - n->off;
	bin_add(a, n);
	a->free -= len;
	return 0;
}

int mc_extalloc_put(struct mc_extalloc *a, uint64_t off, uint64_t len)
{
	if (len == 0 || !aligned(a, off) || !aligned(a, len) || off > a->size ||
	    len > a->size - off)
		return -EINVAL;
	struct mc_extalloc_range *prev = tree_floor(a, off);
	struct mc_extalloc_range *next = tree_above(a, off);
	if (prev && prev->off + prev->len > off)
		return -EINVAL; /* overlaps free space */
	if (next && next->off < off + len)
		return -EINVAL;
	bool join_prev = prev && prev->off + prev->len == off;
	bool join_next = next && next->off == off + len;
	if (join_prev && join_next) {
		uint64_t extra = next->len;
		range_del(a, next);
		bin_del(a, prev);
		prev->len += len + extra;
		bin_add(a, prev);
	} else if (join_prev) {
		bin_del(a, prev);
		prev->len += len;
		bin_add(a, prev);
	} else if (join_next) {
		/* Moving next's offset down keeps it between the same
		 * neighbours: no tree change. */
		bin_del(a, next);
		next->off = off;
		next->len += len;
		bin_add(a, next);
	} else if (!range_new(a, off, len)) {
		return -ENOMEM;
	}
	a->free += len;
	return 0;
}

uint64_t mc_extalloc_free_bytes(const struct mc_extalloc *a)
{
	return a->free;
}

void mc_extalloc_stats(const struct mc_extalloc *a, struct mc_extalloc_stats *st)
{
	memset(st, 0, sizeof(*st));
	st->size = a->size;
	st->free = a->free;
	st->used = a->size - a->free;
	st->free_ranges = a->nranges;
	for (int w = BITMAP_WORDS - 1; w >= 0; w--) {
		if (!a->bitmap[w])
			continue;
		unsigned b = (unsigned)w * 64 + 63u - (unsigned)__builtin_clzll(a->bitmap[w]);
		for (const struct mc_extalloc_range *n = a->bins[b]; n; n = n->bnext)
			if (n->len > st->largest_free)
				st->largest_free = n->len;
		break;
	}
	st->fragmentation = a->free ? 1.0 - (double)st->largest_free / (double)a->free : 0;
}

static void walk(const struct mc_extalloc_range *t,
		 void (*fn)(void *ud, uint64_t off, uint64_t len), void *ud)
{
	while (t) {
		walk(t->l, fn, ud);
		fn(ud, t->off, t->len);
		t = t->r;
	}
}

void mc_extalloc_foreach_free(const struct mc_extalloc *a,
			      void (*fn)(void *ud, uint64_t off, uint64_t len), void *ud)
{
	walk(a->root, fn, ud);
}
