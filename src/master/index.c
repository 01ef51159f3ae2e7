/*
 * index: the master core's object index (core_int.h), pure.
 *
 * A hash table of objects made of cache-line groups (core_int.h): a
 * power-of-two number of slots, each one group of 7 entries (an object's
 * pointer with 16 bits of its key's hash, its tag, above it) and, past 7,
 * overflow groups chained from it; doubled when the objects pass 6 a
 * slot. A lookup reads the slot's line and only the objects whose tag
 * matches (one in 65536 of the others), so that a batch can prefetch,
 * key by key a few keys ahead, the line, then the object: two cache
 * misses a lookup, overlapped across keys, where a chain of objects was
 * one dependent miss after another. A delete only empties its entry
 * (nothing moves under a walk); inserts fill the first empty one, and
 * overflow groups emptied stay until the table doubles or is cleared.
 * Pointers above 48 bits are refused (master__obj_new). Each object is
 * one allocation: header, replicas, key.
 * COMPLETE objects sit on one of three LRU lists (plain and soft-pinned
 * ones with a DRAM replica, and those on SSD segments only), in the
 * order they were sealed or last given a second chance. A read
 * only marks its object (MASTER_OBJ_READ): moving it to the tail would
 * write to its two neighbours, which in an index of millions are two
 * more cache misses per get. Eviction, walking from the head, moves a
 * marked object to the tail unmarked instead of evicting it (the CLOCK
 * or second-chance approximation of LRU), so objects read since the
 * walk last passed them go after every object that was not.
 * PENDING objects sit on the pending list in PutStart order, which with
 * one --put-timeout is also deadline order.
 *
 * Memory per object is measured with malloc_usable_size (plus the
 * allocator's per-chunk header), the slots and the overflow groups.
 *
 * The index knows nothing of segments, leases or time: what an object
 * means is the rest of the core's business.
 */
#include <errno.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "master/core_int.h"

#define MIN_GROUPS 256u
/* Objects a group on average past which the table doubles: 6 of 7 keeps
 * the table, just after it doubled, at 64 / 3 bytes an object, and puts
 * about 4% of the objects in overflow groups at 10M (4.8 a group). */
#define GROW_LOAD 6u
#define GROW_PREFETCH_AHEAD 4u
#define LIST_GROUPS_PER_PAGE 65536u
#define MALLOC_HEADER_BYTES sizeof(size_t)
#define PTR_MASK ((UINT64_C(1) << MASTER_TAG_SHIFT) - 1)

_Static_assert(sizeof(struct master_group) == 64, "a group is one cache line");

static uint64_t key_hash(const uint8_t *key, size_t klen)
{
	return mc_hash64(key, klen);
}

static uint64_t obj_hash(const struct master_obj *o)
{
	return key_hash(master__obj_key(o), o->klen);
}

/* The slot takes the hash's low bits, the tag its top 16: independent
 * until 2^48 slots. */
static uint64_t tag_of(uint64_t h)
{
	return h & ~PTR_MASK;
}

static struct master_obj *ent_obj(uint64_t e)
{
	return (struct master_obj *)(uintptr_t)(e & PTR_MASK);
}

static bool fits(const void *p)
{
	return ((uintptr_t)p & ~PTR_MASK) == 0;
}

static struct master_group *group_of(const struct master_index *ix, uint64_t h)
{
	return &ix->groups[h & (ix->ngroups - 1)];
}

static size_t alloc_bytes(const void *p)
{
	return malloc_usable_size((void *)p) + MALLOC_HEADER_BYTES;
}

static void lru_push(struct master_lru *l, struct master_obj *o)
{
	o->next = NULL;
	o->prev = l->tail;
	if (l->tail)
		l->tail->next = o;
	else
		l->head = o;
	l->tail = o;
	l->n++;
}

static void lru_del(struct master_lru *l, struct master_obj *o)
{
	if (o->prev)
		o->prev->next = o->next;
	else
		l->head = o->next;
	if (o->next)
		o->next->prev = o->prev;
	else
		l->tail = o->prev;
	o->prev = o->next = NULL;
	l->n--;
}

static struct master_lru *obj_list(struct master_index *ix, const struct master_obj *o)
{
	if (o->flags & MASTER_OBJ_PENDING)
		return &ix->lists[MASTER_LIST_PENDING];
	if (o->flags & MASTER_OBJ_SSD)
		return &ix->lists[MASTER_LIST_SSD];
	return &ix->lists[(o->flags & MASTER_OBJ_LRU_PIN) ? MASTER_LIST_PINNED
							  : MASTER_LIST_PLAIN];
}

static struct master_group *groups_new(size_t n)
{
	struct master_group *g = aligned_alloc(sizeof(*g), n * sizeof(*g));
	if (g)
		memset(g, 0, n * sizeof(*g));
	return g;
}

/* Free the overflow groups of n slots. */
static void more_free(struct master_group *t, size_t n)
{
	for (size_t b = 0; b < n; b++)
		for (struct master_group *g = t[b].more, *next; g; g = next) {
			next = g->more;
			free(g);
		}
}

static void groups_free(struct master_group *t, size_t n)
{
	more_free(t, n);
	free(t);
}

/* Entry e into the first empty entry of slot g's groups, with one more
 * group when they are full (counted in *nmore, *more_bytes). Errors:
 * -ENOMEM. */
static int slot_add(struct master_group *g, uint64_t e, uint64_t *nmore, uint64_t *more_bytes)
{
	for (;; g = g->more) {
		for (unsigned i = 0; i < MASTER_GROUP_SLOTS; i++)
			if (!g->e[i]) {
				g->e[i] = e;
				return 0;
			}
		if (!g->more)
			break;
	}
	struct master_group *n = groups_new(1);
	if (!n)
		return -ENOMEM;
	n->e[0] = e;
	g->more = n;
	(*nmore)++;
	*more_bytes += alloc_bytes(n);
	return 0;
}

/* o's entry in the table. */
static uint64_t *entry_of(const struct master_index *ix, const struct master_obj *o)
{
	for (struct master_group *g = group_of(ix, obj_hash(o)); g; g = g->more)
		for (unsigned i = 0; i < MASTER_GROUP_SLOTS; i++)
			if ((g->e[i] & PTR_MASK) == (uintptr_t)o)
				return &g->e[i];
	abort(); /* o is not in the index: it is corrupt */
}

/* Twice the slots. The entries keep their tags; the keys are read again
 * for the slot's new bit, a few slots ahead. Overflow groups left empty
 * by deletes go. */
static void grow(struct master_index *ix)
{
	size_t n = ix->ngroups * 2;
	struct master_group *t = groups_new(n);
	uint64_t nmore = 0, more_bytes = 0;
	if (!t)
		return; /* keep the fuller groups */
	for (size_t b = 0; b < ix->ngroups; b++) {
		if (b + GROW_PREFETCH_AHEAD < ix->ngroups) {
			const struct master_group *a = &ix->groups[b + GROW_PREFETCH_AHEAD];
			for (unsigned i = 0; i < MASTER_GROUP_SLOTS; i++)
				if (a->e[i])
					__builtin_prefetch((const uint8_t *)ent_obj(a->e[i]) +
							   sizeof(struct master_obj) +
							   sizeof(struct master_rep));
		}
		for (const struct master_group *g = &ix->groups[b]; g; g = g->more)
			for (unsigned i = 0; i < MASTER_GROUP_SLOTS; i++) {
				uint64_t e = g->e[i];
				if (!e)
					continue;
				uint64_t h = obj_hash(ent_obj(e));
				if (slot_add(&t[h & (n - 1)], e, &nmore, &more_bytes)) {
					groups_free(t, n);
					return;
				}
			}
	}
	groups_free(ix->groups, ix->ngroups);
	ix->groups = t;
	ix->ngroups = n;
	ix->nmore = nmore;
	ix->more_bytes = more_bytes;
	ix->sweep_pos = 0;
}

int master__index_init(struct master_index *ix)
{
	memset(ix, 0, sizeof(*ix));
	ix->ngroups = MIN_GROUPS;
	ix->groups = groups_new(ix->ngroups);
	return ix->groups ? 0 : -ENOMEM;
}

void master__index_clear(struct master_index *ix)
{
	for (size_t b = 0; b < ix->ngroups; b++)
		for (const struct master_group *g = &ix->groups[b]; g; g = g->more)
			for (unsigned i = 0; i < MASTER_GROUP_SLOTS; i++)
				free(ent_obj(g->e[i]));
	more_free(ix->groups, ix->ngroups);
	memset(ix->groups, 0, ix->ngroups * sizeof(*ix->groups));
	memset(ix->lists, 0, sizeof(ix->lists));
	ix->nobjs = ix->npending = ix->key_bytes = ix->obj_bytes = ix->nttl = 0;
	ix->nmore = ix->more_bytes = 0;
	ix->sweep_pos = 0;
}

void master__index_free(struct master_index *ix)
{
	master__index_clear(ix);
	free(ix->groups);
	ix->groups = NULL;
}

struct master_obj *master__obj_new(const uint8_t *key, size_t klen, unsigned nrep)
{
	struct master_obj *o = malloc(sizeof(*o) + nrep * sizeof(struct master_rep) + klen);
	if (!o || !fits(o)) {
		free(o);
		return NULL;
	}
	memset(o, 0, sizeof(*o));
	o->klen = (uint16_t)klen;
	o->nrep = (uint8_t)nrep;
	memcpy((uint8_t *)&o->rep[nrep], key, klen);
	return o;
}

void master__obj_free(struct master_obj *o)
{
	free(o);
}

int master__index_link(struct master_index *ix, struct master_obj *o)
{
	uint64_t h = obj_hash(o);
	int rc = slot_add(group_of(ix, h), tag_of(h) | (uintptr_t)o, &ix->nmore,
			  &ix->more_bytes);
	if (rc)
		return rc;
	ix->nobjs++;
	ix->key_bytes += o->klen;
	ix->obj_bytes += alloc_bytes(o);
	ix->nttl += o->ttl_ms != 0;
	lru_push(obj_list(ix, o), o);
	if (o->flags & MASTER_OBJ_PENDING)
		ix->npending++;
	if (ix->nobjs > GROW_LOAD * ix->ngroups)
		grow(ix);
	return 0;
}

void master__index_del(struct master_index *ix, struct master_obj *o)
{
	/* Only the entry empties: a walk's position stays valid. */
	*entry_of(ix, o) = 0;
	lru_del(obj_list(ix, o), o);
	if (o->flags & MASTER_OBJ_PENDING)
		ix->npending--;
	ix->nobjs--;
	ix->nttl -= o->ttl_ms != 0;
	ix->key_bytes -= o->klen;
	ix->obj_bytes -= alloc_bytes(o);
	free(o);
}

struct master_obj *master__index_find(const struct master_index *ix, const uint8_t *key,
				      size_t klen)
{
	uint64_t h = key_hash(key, klen), tag = tag_of(h);
	for (const struct master_group *g = group_of(ix, h); g; g = g->more)
		for (unsigned i = 0; i < MASTER_GROUP_SLOTS; i++) {
			uint64_t e = g->e[i];
			if (tag_of(e) != tag || !e)
				continue;
			struct master_obj *o = ent_obj(e);
			if (o->klen == klen && memcmp(master__obj_key(o), key, klen) == 0)
				return o;
		}
	return NULL;
}

void master__index_prefetch(const struct master_index *ix, const uint8_t *key, size_t klen,
			    enum master_prefetch stage)
{
	uint64_t h = key_hash(key, klen), tag = tag_of(h);
	const struct master_group *g = group_of(ix, h);
	bool found = false;
	switch (stage) {
	case MASTER_PREFETCH_GROUP:
		__builtin_prefetch(g);
		break;
	case MASTER_PREFETCH_OBJECT:
		for (unsigned i = 0; i < MASTER_GROUP_SLOTS; i++) {
			uint64_t e = g->e[i];
			if (tag_of(e) != tag || !e)
				continue;
			/* The header, the replicas and the key (the end of a
			 * one-replica object's key): two or three lines. */
			const uint8_t *o = (const uint8_t *)ent_obj(e);
			__builtin_prefetch(o);
			__builtin_prefetch(o + 64);
			__builtin_prefetch(o + sizeof(struct master_obj) +
					   sizeof(struct master_rep) + klen - 1);
			found = true;
		}
		if (!found && g->more)
			__builtin_prefetch(g->more);
		break;
	}
}

void master__index_touch(struct master_obj *o)
{
	o->flags |= MASTER_OBJ_READ;
}

bool master__index_second_chance(struct master_index *ix, struct master_obj *o,
				 struct master_obj **next)
{
	if (!(o->flags & MASTER_OBJ_READ))
		return false;
	o->flags &= (uint8_t)~MASTER_OBJ_READ;
	struct master_lru *l = obj_list(ix, o);
	lru_del(l, o);
	lru_push(l, o);
	if (!*next)
		*next = o;
	return true;
}

void master__index_seal(struct master_index *ix, struct master_obj *o)
{
	lru_del(&ix->lists[MASTER_LIST_PENDING], o);
	ix->npending--;
	o->flags &= (uint8_t)~MASTER_OBJ_PENDING;
	if (o->flags & MASTER_OBJ_SOFT_PIN)
		o->flags |= MASTER_OBJ_LRU_PIN;
	lru_push(obj_list(ix, o), o);
}

void master__index_set_flags(struct master_index *ix, struct master_obj *o, uint8_t flags)
{
	struct master_lru *from = obj_list(ix, o);
	o->flags = flags;
	struct master_lru *to = obj_list(ix, o);
	if (from != to) {
		lru_del(from, o);
		lru_push(to, o);
	}
}

uint64_t master__index_count(const struct master_index *ix, enum master_list l)
{
	return ix->lists[l].n;
}

struct master_obj *master__index_add_replica(struct master_index *ix, struct master_obj *o,
					     uint32_t seg, uint64_t offset)
{
	struct master_lru *l = obj_list(ix, o);
	uint64_t *e = entry_of(ix, o);
	size_t old_bytes = alloc_bytes(o);
	size_t klen = o->klen, reps = o->nrep * sizeof(struct master_rep);
	/* Not realloc: a new address the entry cannot hold must leave o as
	 * it was. */
	struct master_obj *n = malloc(sizeof(*o) + reps + sizeof(struct master_rep) + klen);
	if (!n || !fits(n)) {
		free(n);
		return NULL;
	}
	memcpy(n, o, sizeof(*o) + reps);
	memcpy((uint8_t *)&n->rep[n->nrep + 1], master__obj_key(o), klen);
	free(o);
	n->rep[n->nrep].offset = offset;
	n->rep[n->nrep].seg = seg;
	n->rep[n->nrep].state = MASTER_REP_COMPLETE;
	n->nrep++;
	*e = tag_of(*e) | (uintptr_t)n;
	if (n->prev)
		n->prev->next = n;
	else
		l->head = n;
	if (n->next)
		n->next->prev = n;
	else
		l->tail = n;
	ix->obj_bytes += alloc_bytes(n) - old_bytes;
	return n;
}

struct master_obj *master__index_oldest(const struct master_index *ix, enum master_list l)
{
	return ix->lists[l].head;
}

size_t master__index_slots(const struct master_index *ix)
{
	return ix->ngroups;
}

struct master_obj *master__index_slot_next(const struct master_index *ix, size_t b,
					   struct master_index_pos *pos)
{
	if (!pos->g) {
		if (pos->i)
			return NULL; /* past the last */
		pos->g = &ix->groups[b];
	}
	for (; pos->g; pos->g = pos->g->more, pos->i = 0)
		while (pos->i < MASTER_GROUP_SLOTS) {
			uint64_t e = pos->g->e[pos->i++];
			if (e)
				return ent_obj(e);
		}
	pos->i = 1;
	return NULL;
}

void master__index_sweep(struct master_index *ix, size_t slots,
			 void (*fn)(void *ud, struct master_obj *o), void *ud)
{
	size_t end = ix->nttl ? MC_MIN(ix->sweep_pos + slots, ix->ngroups) : ix->sweep_pos;
	for (size_t b = ix->sweep_pos; b < end; b++) {
		struct master_index_pos pos = {0};
		struct master_obj *o;
		while ((o = master__index_slot_next(ix, b, &pos)))
			fn(ud, o);
	}
	ix->sweep_pos = end == ix->ngroups ? 0 : end;
}

void master__index_stats(const struct master_index *ix, struct master_core_stats *st)
{
	st->objects = ix->nobjs;
	st->pending = ix->npending;
	st->key_bytes = ix->key_bytes;
	st->index_bytes = ix->obj_bytes + ix->ngroups * sizeof(*ix->groups) + ix->more_bytes;
}

/* ------------------------------------------------------------ core.h */

const struct master_obj *master__find(const struct master_core *c, const uint8_t *key,
				      size_t klen)
{
	if (!master__key_ok(klen))
		return NULL;
	return master__index_find(&c->ix, key, klen);
}

void master__foreach(const struct master_core *c,
		     bool (*fn)(void *ud, const struct master_obj *o), void *ud)
{
	for (size_t b = 0; b < c->ix.ngroups; b++) {
		struct master_index_pos pos = {0};
		const struct master_obj *o;
		while ((o = master__index_slot_next(&c->ix, b, &pos)))
			if (!fn(ud, o))
				return;
	}
}

bool master__list_segment(const struct master_core *c, uint32_t id, uint64_t *cursor,
			  size_t limit,
			  bool (*fn)(void *ud, const struct master_obj *o, unsigned i),
			  void *ud)
{
	const struct master_index *ix = &c->ix;
	size_t b = *cursor < ix->ngroups ? (size_t)*cursor : ix->ngroups;
	size_t end = MC_MIN(b + LIST_GROUPS_PER_PAGE, ix->ngroups);
	size_t n = 0;
	bool more = true;
	/* Whole slots only, so the cursor stays a slot position. */
	for (; b < end && n < limit && more; b++) {
		struct master_index_pos pos = {0};
		const struct master_obj *o;
		while ((o = master__index_slot_next(ix, b, &pos))) {
			if (o->flags & MASTER_OBJ_PENDING)
				continue;
			for (unsigned i = 0; i < o->nrep; i++)
				if (o->rep[i].seg == id) {
					more &= fn(ud, o, i);
					n++;
				}
		}
	}
	*cursor = b;
	return b >= ix->ngroups;
}
