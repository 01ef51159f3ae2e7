/*
 * index: the master core's object index (core_int.h), pure.
 *
 * A chained hash table of objects (common/lhash.h: a bucket or two added,
 * by splitting, whenever the load passes 3/4, so no insert rehashes the
 * whole index). Each object is one allocation: header, replicas, key.
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
 * allocator's per-chunk header) and the bucket array.
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

#define MIN_BUCKETS 1024u
#define LIST_BUCKETS_PER_PAGE 65536u
#define MALLOC_HEADER_BYTES sizeof(size_t)

static uint32_t key_hash(const uint8_t *key, size_t klen)
{
	uint64_t h = mc_hash64(key, klen);
	return (uint32_t)(h ^ (h >> 32));
}

static uint32_t obj_hash(const struct master_obj *o)
{
	return key_hash(master__obj_key(o), o->klen);
}

static size_t obj_alloc_bytes(const struct master_obj *o)
{
	return malloc_usable_size((void *)o) + MALLOC_HEADER_BYTES;
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

static struct master_obj **bucket_of(const struct master_index *ix, uint32_t h)
{
	return (struct master_obj **)mc_lhash_bucket(&ix->tab, h);
}

/* Where o's bucket chain points at it. */
static struct master_obj **link_of(const struct master_index *ix, const struct master_obj *o)
{
	struct master_obj **pp = bucket_of(ix, obj_hash(o));
	while (*pp != o)
		pp = &(*pp)->hnext;
	return pp;
}

static void **obj_link(void *o)
{
	return (void **)&((struct master_obj *)o)->hnext;
}

static uint64_t obj_hash_of(const void *o)
{
	return obj_hash(o);
}

static const struct mc_lhash_ops obj_ops = {obj_link, obj_hash_of};

int master__index_init(struct master_index *ix)
{
	memset(ix, 0, sizeof(*ix));
	return mc_lhash_init(&ix->tab, MIN_BUCKETS);
}

void master__index_clear(struct master_index *ix)
{
	for (size_t i = 0; i < mc_lhash_n(&ix->tab); i++) {
		struct master_obj *o = ix->tab.b[i];
		while (o) {
			struct master_obj *next = o->hnext;
			free(o);
			o = next;
		}
		ix->tab.b[i] = NULL;
	}
	memset(ix->lists, 0, sizeof(ix->lists));
	ix->nobjs = ix->npending = ix->key_bytes = ix->obj_bytes = ix->nttl = 0;
}

void master__index_detach(struct master_index *ix, struct mc_lhash *out)
{
	struct mc_lhash fresh;
	if (mc_lhash_init(&fresh, MIN_BUCKETS) != 0) {
		master__index_clear(ix); /* (out of memory: freed at once) */
		memset(out, 0, sizeof(*out));
		return;
	}
	*out = ix->tab;
	ix->tab = fresh;
	memset(ix->lists, 0, sizeof(ix->lists));
	ix->nobjs = ix->npending = ix->key_bytes = ix->obj_bytes = ix->nttl = 0;
	ix->sweep_pos = 0;
}

bool master__index_free_step(struct mc_lhash *t, size_t *pos, size_t budget)
{
	size_t nb = t->b ? mc_lhash_n(t) : 0, seen = 0;
	for (; *pos < nb && seen < budget; ++*pos)
		for (struct master_obj *o = t->b[*pos], *next; o; o = next, seen++) {
			next = o->hnext;
			free(o);
		}
	if (*pos < nb)
		return false;
	if (t->b)
		mc_lhash_free(t);
	return true;
}

void master__index_catch_up(struct master_index *ix, size_t splits)
{
	for (size_t i = 0;
	     i < splits && !ix->walks && ix->nobjs * 4 > mc_lhash_n(&ix->tab) * 3; i++)
		if (mc_lhash_grow(&ix->tab, &obj_ops) != 0)
			return;
}

void master__index_free(struct master_index *ix)
{
	master__index_clear(ix);
	mc_lhash_free(&ix->tab);
}

struct master_obj *master__obj_new(const uint8_t *key, size_t klen, unsigned nrep)
{
	struct master_obj *o = malloc(sizeof(*o) + nrep * sizeof(struct master_rep) + klen);
	if (!o)
		return NULL;
	memset(o, 0, sizeof(*o));
	o->klen = (uint16_t)klen;
	o->nrep = (uint8_t)nrep;
	memcpy((uint8_t *)&o->rep[nrep], key, klen);
	return o;
}

void master__index_link(struct master_index *ix, struct master_obj *o)
{
	struct master_obj **pp = bucket_of(ix, obj_hash(o));
	o->hnext = *pp;
	*pp = o;
	ix->nobjs++;
	ix->key_bytes += o->klen;
	ix->obj_bytes += obj_alloc_bytes(o);
	ix->nttl += o->ttl_ms != 0;
	lru_push(obj_list(ix, o), o);
	if (o->flags & MASTER_OBJ_PENDING)
		ix->npending++;
	if (!ix->walks)
		mc_lhash_added(&ix->tab, ix->nobjs, &obj_ops);
}

void master__index_del(struct master_index *ix, struct master_obj *o)
{
	struct master_obj **pp = link_of(ix, o);
	*pp = o->hnext;
	lru_del(obj_list(ix, o), o);
	if (o->flags & MASTER_OBJ_PENDING)
		ix->npending--;
	ix->nobjs--;
	ix->nttl -= o->ttl_ms != 0;
	ix->key_bytes -= o->klen;
	ix->obj_bytes -= obj_alloc_bytes(o);
	free(o);
}

struct master_obj *master__index_find(const struct master_index *ix, const uint8_t *key,
				      size_t klen)
{
	uint32_t h = key_hash(key, klen);
	for (struct master_obj *o = *bucket_of(ix, h); o; o = o->hnext)
		if (o->klen == klen && memcmp(master__obj_key(o), key, klen) == 0)
			return o;
	return NULL;
}

void master__index_prefetch(const struct master_index *ix, const uint8_t *key, size_t klen,
			    enum master_prefetch stage)
{
	struct master_obj *const *b = bucket_of(ix, key_hash(key, klen));
	switch (stage) {
	case MASTER_PREFETCH_BUCKET:
		__builtin_prefetch(b);
		break;
	case MASTER_PREFETCH_OBJECT:
		if (*b) {
			/* The header, and the replicas and key after it. */
			__builtin_prefetch(*b);
			__builtin_prefetch((const uint8_t *)*b + 64);
		}
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
	struct master_obj **pp = link_of(ix, o);
	size_t old_bytes = obj_alloc_bytes(o);
	size_t klen = o->klen;
	struct master_obj *n = realloc(
		o, sizeof(*o) + (o->nrep + 1u) * sizeof(struct master_rep) + klen);
	if (!n)
		return NULL;
	uint8_t *key = (uint8_t *)&n->rep[n->nrep];
	memmove(key + sizeof(struct master_rep), key, klen);
	n->rep[n->nrep].offset = offset;
	n->rep[n->nrep].seg = seg;
	n->rep[n->nrep].state = MASTER_REP_COMPLETE;
	n->nrep++;
	*pp = n;
	if (n->prev)
		n->prev->next = n;
	else
		l->head = n;
	if (n->next)
		n->next->prev = n;
	else
		l->tail = n;
	ix->obj_bytes += obj_alloc_bytes(n) - old_bytes;
	return n;
}

struct master_obj *master__index_oldest(const struct master_index *ix, enum master_list l)
{
	return ix->lists[l].head;
}

size_t master__index_slots(const struct master_index *ix)
{
	return mc_lhash_n(&ix->tab);
}

struct master_obj *master__index_slot(const struct master_index *ix, size_t b)
{
	return ix->tab.b[b];
}

void master__index_sweep(struct master_index *ix, size_t slots,
			 void (*fn)(void *ud, struct master_obj *o), void *ud)
{
	size_t nb = mc_lhash_n(&ix->tab);
	size_t end = ix->nttl ? MC_MIN(ix->sweep_pos + slots, nb) : ix->sweep_pos;
	for (size_t b = ix->sweep_pos; b < end; b++) {
		struct master_obj *o = ix->tab.b[b];
		while (o) {
			struct master_obj *next = o->hnext;
			fn(ud, o);
			o = next;
		}
	}
	ix->sweep_pos = end >= nb ? 0 : end;
}

void master__index_stats(const struct master_index *ix, struct master_core_stats *st)
{
	st->objects = ix->nobjs;
	st->pending = ix->npending;
	st->key_bytes = ix->key_bytes;
	st->index_bytes = ix->obj_bytes + mc_lhash_bytes(&ix->tab);
}

/* ------------------------------------------------------------ core.h */

const struct master_obj *master__find(struct master_core *c, const uint8_t *key, size_t klen)
{
	if (!master__key_ok(klen))
		return NULL;
	return master__obj_find(c, key, klen);
}

bool master__list_segment(const struct master_core *c, uint32_t id, uint64_t *cursor,
			  size_t limit,
			  bool (*fn)(void *ud, const struct master_obj *o, unsigned i),
			  void *ud)
{
	const struct master_index *ix = &c->ix;
	size_t nb = mc_lhash_n(&ix->tab);
	size_t b = *cursor < nb ? (size_t)*cursor : nb;
	size_t end = MC_MIN(b + LIST_BUCKETS_PER_PAGE, nb);
	size_t n = 0;
	bool more = true;
	/* Whole buckets only, so the cursor stays a bucket position. */
	for (; b < end && n < limit && more; b++)
		for (const struct master_obj *o = ix->tab.b[b]; o; o = o->hnext) {
			if (o->flags & MASTER_OBJ_PENDING)
				continue;
			for (unsigned i = 0; i < o->nrep; i++)
				if (o->rep[i].seg == id) {
					more &= fn(ud, o, i);
					n++;
				}
		}
	*cursor = b;
	return b >= nb;
}
