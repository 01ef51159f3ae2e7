/*
 * tier: the master core's SSD tier (core_int.h), pure.
 *
 * An SSD segment is space in an agent's SSD store. Its owner chooses
 * where objects go there (the store allocates); the segment's allocator
 * here records what is taken, in whole blocks of the owner's size, so
 * that its use and its watermark are known and demotions go where there
 * is room.
 *
 * Demotion. A watermark round (core.c) hands its victims here. A victim
 * with an SSD replica already just loses its DRAM ones. Otherwise it
 * gets a demotion to an SSD segment with room — its DRAM replica's
 * agent's own first, then the one with the most room left — within a
 * bound of demotions and bytes on their way to each segment (past it the
 * round stops and the next one goes on): the segment's owner is promised
 * the space and ordered (a FETCH record in the segment's log) to copy the
 * object, which it reads from a DRAM replica (master__demote_source names
 * one in the order). The object is flagged DEMOTING: no round takes it,
 * and if it leaves the index meanwhile its DRAM space is held until the
 * demotion's deadline, since the owner may be reading it. The owner
 * answers DEMOTED — the SSD replica joins the object, its DRAM replicas
 * leave (their space freed, or held while a read lease lasts) and it
 * moves to the SSD list — or ABANDONED. A demotion not answered within
 * --put-timeout, or whose segment went away, is given up; given up, the
 * object is marked as read, so the next round passes it over once.
 *
 * SSD eviction. An SSD segment whose use plus what is promised there
 * passes its high watermark loses replicas from the SSD list's head
 * (least recently read first: a read object gets a second chance, as in
 * DRAM), leased objects skipped, until
 * eviction_ratio of it is freed; an object whose last replica goes
 * leaves the index. (Objects with a DRAM replica too, which only an
 * inventory re-sync makes, are not on that list and keep theirs.)
 *
 * The owner's other news: PUT (a new object it stored, a put naming the
 * SSD tier) and LOST (a replica whose bytes failed their checksum).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "master/core_int.h"

/* Demotions on their way to one SSD segment, and their bytes as a part
 * of it: enough to keep its owner's disk busy, few enough that a round
 * does not promise more than it can write before --put-timeout. */
#define DEMOTE_MAX_PER_SEG 64u
#define DEMOTE_MAX_BYTES_DIV 8u
#define DEMOTE_MIN_BYTES (64ull << 20)

void master__tiers_clear(struct master_tiers *t)
{
	for (size_t i = 0; i < t->n; i++)
		free(t->v[i].key);
	t->n = 0;
	t->dram_bytes = 0;
}

void master__tiers_free(struct master_tiers *t)
{
	master__tiers_clear(t);
	free(t->v);
	t->v = NULL;
	t->cap = 0;
}

void master__tiers_seg_reset(struct master_seg *s)
{
	s->promised = 0;
	s->demotions = 0;
}

uint64_t master__demoting_bytes(const struct master_core *c)
{
	return c->tiers.dram_bytes;
}

void master__tiers_stats(const struct master_core *c, struct master_core_stats *st)
{
	st->demoting = c->tiers.n;
	st->demoting_bytes = c->tiers.dram_bytes;
}

/* The demotion of key, or NULL. */
static struct master_demotion *find(const struct master_tiers *t, const uint8_t *key,
				    size_t klen)
{
	for (size_t i = 0; i < t->n; i++)
		if (t->v[i].klen == klen && memcmp(t->v[i].key, key, klen) == 0)
			return &t->v[i];
	return NULL;
}

/* The segment d was promised on, if it is still the same incarnation. */
static struct master_seg *promised_seg(struct master_core *c, const struct master_demotion *d)
{
	struct master_seg *s = master__segs_at(&c->segs, d->seg);
	return s && s->log_id == d->log_id ? s : NULL;
}

/* Forget demotion d: its promise back to its segment (if that is still
 * the one it was made on), its bytes out of the total. */
static void drop(struct master_core *c, struct master_demotion *d)
{
	struct master_tiers *t = &c->tiers;
	struct master_seg *s = promised_seg(c, d);
	if (s) {
		s->promised -= MC_MIN(s->promised, d->len);
		s->demotions -= s->demotions > 0;
	}
	t->dram_bytes -= MC_MIN(t->dram_bytes, d->dram_bytes);
	free(d->key);
	*d = t->v[--t->n];
}

/* Give demotion d up: o is no longer on its way, and is marked as read
 * (the next round gives it a second chance: others are tried first). */
static void give_up(struct master_core *c, struct master_demotion *d)
{
	/* (not pruned: that could destroy o, and d with it) */
	struct master_obj *o = master__index_find(&c->ix, d->key, d->klen);
	drop(c, d);
	c->n.demotion_failures++;
	if (o) {
		o->flags &= (uint8_t)~MASTER_OBJ_DEMOTING;
		master__index_touch(o);
	}
}

uint64_t master__demote_forget(struct master_core *c, const struct master_obj *o)
{
	struct master_demotion *d = find(&c->tiers, master__obj_key(o), o->klen);
	if (!d)
		return 0;
	uint64_t until = d->until_ms;
	drop(c, d);
	return until;
}

void master__tiers_tick(struct master_core *c, uint64_t now_ms)
{
	struct master_tiers *t = &c->tiers;
	for (size_t i = 0; i < t->n;) {
		struct master_demotion *d = &t->v[i];
		if (promised_seg(c, d) && d->until_ms > now_ms) {
			i++;
			continue;
		}
		give_up(c, d); /* (d now holds the last one: look at it again) */
	}
}

bool master__demote_source(struct master_core *c, const uint8_t *key, size_t klen,
			   uint32_t *seg, uint64_t *offset)
{
	if (!master__key_ok(klen))
		return false;
	const struct master_obj *o = master__obj_find(c, key, klen);
	if (!o || !(o->flags & MASTER_OBJ_DEMOTING))
		return false;
	for (unsigned i = 0; i < o->nrep; i++)
		if (master__rep_tier(c, o, i) == MASTER_TIER_DRAM) {
			*seg = o->rep[i].seg;
			*offset = o->rep[i].offset;
			return true;
		}
	return false;
}

/* ------------------------------------------------------------ demotion */

/* Free bytes of SSD segment s not promised to demotions on their way. */
static uint64_t room(const struct master_seg *s)
{
	uint64_t free = master__alloc_free_bytes(s->alloc);
	return free - MC_MIN(free, s->promised);
}

/* Whether s may take another demotion of len bytes now. */
static bool takes_more(const struct master_seg *s, uint64_t len)
{
	uint64_t most = MC_MAX(s->size / DEMOTE_MAX_BYTES_DIV, DEMOTE_MIN_BYTES);
	return s->demotions < DEMOTE_MAX_PER_SEG &&
	       (s->demotions == 0 || s->promised + len <= most);
}

/* The SSD segment o goes to: one with room, its DRAM replica's agent's
 * own first, then the one with the most room. MASTER_NO_SEGMENT, with
 * *busy when a segment with room has too many demotions on their way. */
static uint32_t pick(struct master_core *c, const struct master_obj *o, bool *busy)
{
	const struct master_agent *own = NULL;
	for (unsigned i = 0; i < o->nrep && !own; i++) {
		const struct master_seg *s = master__segs_at(&c->segs, o->rep[i].seg);
		if (s->tier == MASTER_TIER_DRAM)
			own = s->agent;
	}
	uint32_t best = MASTER_NO_SEGMENT;
	uint64_t best_room = 0;
	bool best_own = false;
	*busy = false;
	for (uint32_t id = 0; id < master__seg_slots(c); id++) {
		const struct master_seg *s = master__segs_at(&c->segs, id);
		if (!s || s->tier != MASTER_TIER_SSD || s->syncing)
			continue;
		uint64_t len = master__rep_len(s, o->size), r = room(s);
		if (r < len)
			continue;
		if (!takes_more(s, len)) {
			*busy = true;
			continue;
		}
		bool mine = s->agent == own;
		if (best == MASTER_NO_SEGMENT || (mine && !best_own) ||
		    (mine == best_own && r > best_room)) {
			best = id;
			best_room = r;
			best_own = mine;
		}
	}
	return best;
}

static uint64_t dram_bytes(const struct master_core *c, const struct master_obj *o)
{
	uint64_t n = 0;
	for (unsigned i = 0; i < o->nrep; i++) {
		const struct master_seg *s = master__segs_at(&c->segs, o->rep[i].seg);
		if (s->tier == MASTER_TIER_DRAM)
			n += master__rep_len(s, o->size);
	}
	return n;
}

/* The DRAM replicas of o leave (held while its read lease lasts). */
static void drop_dram(struct master_core *c, struct master_obj *o, uint64_t now_ms)
{
	uint64_t until = master__leased(o, now_ms) ? o->lease_or_start_ms : 0;
	for (unsigned i = o->nrep; i-- > 0;)
		if (master__rep_tier(c, o, i) == MASTER_TIER_DRAM)
			master__rep_drop(c, o, i, until);
	master__obj_retier(c, o);
}

enum master_demote master__demote(struct master_core *c, struct master_obj *o, uint64_t now_ms,
				  uint64_t *freed)
{
	struct master_tiers *t = &c->tiers;
	*freed = dram_bytes(c, o);
	for (unsigned i = 0; i < o->nrep; i++)
		if (master__rep_tier(c, o, i) == MASTER_TIER_SSD) {
			drop_dram(c, o, now_ms);
			c->n.demotions++;
			return MASTER_DEMOTE_DONE;
		}
	if (o->size == 0)
		return MASTER_DEMOTE_NONE; /* (an SSD store holds no empty values) */
	bool busy;
	uint32_t id = pick(c, o, &busy);
	if (id == MASTER_NO_SEGMENT)
		return busy ? MASTER_DEMOTE_BUSY : MASTER_DEMOTE_NONE;
	if (t->n == t->cap) {
		size_t cap = t->cap ? t->cap * 2 : 64;
		struct master_demotion *v = realloc(t->v, cap * sizeof(*v));
		if (!v)
			return MASTER_DEMOTE_NONE;
		t->v = v;
		t->cap = cap;
	}
	uint8_t *key = malloc(o->klen);
	if (!key)
		return MASTER_DEMOTE_NONE;
	memcpy(key, master__obj_key(o), o->klen);
	struct master_seg *s = master__segs_at(&c->segs, id);
	uint64_t len = master__rep_len(s, o->size);
	t->v[t->n++] = (struct master_demotion){
		.key = key,
		.klen = o->klen,
		.seg = id,
		.log_id = s->log_id,
		.len = len,
		.dram_bytes = *freed,
		.until_ms = now_ms + c->o.put_timeout_ms,
	};
	s->promised += len;
	s->demotions++;
	t->dram_bytes += *freed;
	o->flags |= MASTER_OBJ_DEMOTING;
	master__mirror_seg(c, id, o, 0, MASTER_EV_FETCH);
	c->n.demotion_starts++;
	return MASTER_DEMOTE_STARTED;
}

/* ------------------------------------------------------------ SSD eviction */

/* Evict from SSD segment id (over its watermark) until target bytes are
 * freed or nothing unleased is left there. */
static void ssd_evict(struct master_core *c, uint32_t id, uint64_t target, uint64_t now_ms)
{
	struct master_seg *s = master__segs_at(&c->segs, id);
	uint64_t freed = 0;
	struct master_obj *next;
	for (struct master_obj *o = master__index_oldest(&c->ix, MASTER_LIST_SSD);
	     o && freed < target; o = next) {
		next = o->next;
		if (master__index_second_chance(&c->ix, o, &next) || master__obj_prune(c, o))
			continue;
		for (unsigned i = 0; i < o->nrep; i++) {
			if (o->rep[i].seg != id)
				continue;
			if (master__leased(o, now_ms)) {
				c->n.lease_waits++;
				break;
			}
			freed += master__rep_len(s, o->size);
			c->n.ssd_evictions++;
			c->n.ssd_evicted_bytes += o->size;
			if (o->nrep == 1)
				master__obj_destroy(c, o);
			else
				master__rep_drop(c, o, i, 0);
			break;
		}
	}
}

void master__ssd_evict_if_needed(struct master_core *c, uint64_t now_ms)
{
	for (uint32_t id = 0; id < master__seg_slots(c); id++) {
		const struct master_seg *s = master__segs_at(&c->segs, id);
		if (!s || s->tier != MASTER_TIER_SSD || s->replicas == 0)
			continue;
		uint64_t used = s->size - MC_MIN(s->size, master__alloc_free_bytes(s->alloc));
		if ((double)(used + s->promised) <= s->high_watermark * (double)s->size)
			continue;
		ssd_evict(c, id, (uint64_t)(s->eviction_ratio * (double)s->size), now_ms);
	}
}

/* ------------------------------------------------------------ the owner's news */

/* The caller's SSD segment, or an error. */
static struct master_seg *owner_seg(struct master_core *c, const char *agent,
				    const char *segment, uint32_t *id, int *err)
{
	*id = master__seg_find(c, segment ? segment : "");
	struct master_seg *s = master__segs_at(&c->segs, *id);
	if (!s)
		*err = MC_ESEGMENT_NOT_FOUND;
	else if (!agent || strcmp(s->agent->id, agent) != 0)
		*err = -EACCES;
	else if (s->tier != MASTER_TIER_SSD)
		*err = -EINVAL;
	else
		return s;
	return NULL;
}

/* Reserve a new replica's space: whole blocks at a block boundary. */
static int reserve(struct master_seg *s, const struct master_tier_item *it)
{
	uint64_t len = master__rep_len(s, it->size);
	if (!len || it->offset % s->block || it->offset > s->size ||
	    len > s->size - it->offset)
		return -EINVAL;
	return master__alloc_reserve(s->alloc, it->offset, len) == 0 ? 0 : -EBUSY;
}

static void unreserve(struct master_seg *s, const struct master_tier_item *it)
{
	if (master__alloc_put(s->alloc, it->offset, master__rep_len(s, it->size))) {
		/* just reserved: cannot fail */
	}
}

static int tier_put(struct master_core *c, struct master_seg *s, uint32_t id,
		    const struct master_tier_item *it, uint64_t now_ms)
{
	if (master__lookup(c, it->key, it->klen, now_ms))
		return MC_EOBJECT_ALREADY_EXISTS;
	int rc = reserve(s, it);
	if (rc)
		return rc;
	struct master_obj *o = master__obj_new(it->key, it->klen, 1);
	if (!o) {
		unreserve(s, it);
		return -ENOMEM;
	}
	o->size = it->size;
	o->rep[0].offset = it->offset;
	o->rep[0].seg = id;
	o->rep[0].state = MASTER_REP_COMPLETE;
	o->flags = MASTER_OBJ_SSD |
		   (it->soft_pin ? MASTER_OBJ_SOFT_PIN | MASTER_OBJ_LRU_PIN : 0);
	if (it->has_crc) {
		o->crc = it->crc;
		o->flags |= MASTER_OBJ_CRC;
	}
	o->ttl_ms = it->ttl_ms ? now_ms + it->ttl_ms : 0;
	master__index_link(&c->ix, o);
	s->replicas++;
	master__mirror(c, o, 0, MASTER_EV_ADD);
	c->n.ssd_puts++;
	c->n.puts++;
	return 0;
}

static int tier_demoted(struct master_core *c, struct master_seg *s, uint32_t id,
			const struct master_tier_item *it, uint64_t now_ms)
{
	/* (Looked up first: an object gone with its segment takes its
	 * demotion with it.) */
	struct master_obj *o = master__obj_find(c, it->key, it->klen);
	struct master_demotion *d = find(&c->tiers, it->key, it->klen);
	if (!d || d->seg != id || !promised_seg(c, d))
		return MC_EINVALID_REPLICA;
	/* (A demotion exists only while its object does, flagged.) */
	if (!o || o->size != it->size || o->nrep >= MASTER_MAX_REPLICAS ||
	    ((o->flags & MASTER_OBJ_CRC) && it->has_crc && o->crc != it->crc)) {
		give_up(c, d);
		return MC_EINVALID_REPLICA;
	}
	int rc = reserve(s, it);
	if (rc) {
		give_up(c, d);
		return rc;
	}
	drop(c, d);
	o->flags &= (uint8_t)~MASTER_OBJ_DEMOTING;
	struct master_obj *n = master__index_add_replica(&c->ix, o, id, it->offset);
	if (!n) {
		unreserve(s, it);
		c->n.demotion_failures++;
		master__index_touch(o);
		return -ENOMEM;
	}
	o = n;
	s->replicas++;
	if (it->has_crc && !(o->flags & MASTER_OBJ_CRC)) {
		o->crc = it->crc;
		o->flags |= MASTER_OBJ_CRC;
	}
	master__mirror(c, o, (unsigned)o->nrep - 1, MASTER_EV_ADD);
	drop_dram(c, o, now_ms);
	c->n.demotions++;
	return 0;
}

static int tier_lost(struct master_core *c, uint32_t id, const struct master_tier_item *it)
{
	struct master_obj *o = master__obj_find(c, it->key, it->klen);
	for (unsigned i = 0; o && i < o->nrep; i++) {
		if (o->rep[i].seg != id || o->rep[i].offset != it->offset)
			continue;
		c->n.ssd_lost++;
		if (o->nrep == 1) {
			master__obj_destroy(c, o);
		} else {
			master__rep_drop(c, o, i, 0);
			master__obj_retier(c, o);
		}
		return 0;
	}
	return MC_EOBJECT_NOT_FOUND;
}

int master__tier_update(struct master_core *c, const char *agent, const char *segment,
			enum master_tier_op op, const struct master_tier_item *it,
			uint64_t now_ms)
{
	uint32_t id;
	int err = 0;
	struct master_seg *s = owner_seg(c, agent, segment, &id, &err);
	if (!s)
		return err;
	if (!master__key_ok(it->klen))
		return -EINVAL;
	int rc;
	switch (op) {
	case MASTER_TIER_PUT:
		rc = tier_put(c, s, id, it, now_ms);
		break;
	case MASTER_TIER_DEMOTED:
		rc = tier_demoted(c, s, id, it, now_ms);
		break;
	case MASTER_TIER_ABANDONED: {
		struct master_demotion *d = find(&c->tiers, it->key, it->klen);
		if (!d || d->seg != id || !promised_seg(c, d))
			return MC_EINVALID_REPLICA;
		give_up(c, d);
		return 0;
	}
	case MASTER_TIER_LOST:
		return tier_lost(c, id, it);
	default:
		return -EINVAL;
	}
	if (rc == 0)
		master__ssd_evict_if_needed(c, now_ms);
	return rc;
}
