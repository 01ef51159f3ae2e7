/*
 * core: the master's state and policy, pure (time is an argument). See
 * core.h; the core's other files are named in core_int.h.
 *
 * This file holds the core object and the life of an object in it: a put
 * places replicas on distinct DRAM segments (the preferred one first,
 * then the emptiest), PutEnd seals them, a get leases the object to its
 * reader and marks it read, a remove or a TTL ends it.
 *
 * Eviction walks the plain LRU list from the head, skipping leased
 * objects and sending objects read since it last passed them to the tail
 * (index.c's second chance), then the pinned list, until the round's
 * target is freed: a
 * round frees eviction_ratio of the DRAM capacity when usage passes the
 * watermark, or just enough for a placement that found no room. With SSD
 * segments mounted a watermark round demotes its victims instead (tier.c)
 * and counts what their demotions will free; a placement that finds no
 * room still evicts (it cannot wait for a demotion), skipping objects on
 * their way to SSD, and an object with an SSD replica too only loses its
 * DRAM ones.
 *
 * Mirror logs: every change of a COMPLETE replica is appended to its
 * segment's log (mlog.c) with a sequence number from one core-wide
 * counter — ADD when PutEnd or a commit seals it, DEL when its object
 * leaves the index (remove, eviction, TTL, an agent's expiry elsewhere).
 * PENDING objects are never logged, and an inventory report is not news
 * to the owner that made it.
 *
 * Quarantine: the space of an object removed by force while leased stays
 * allocated until the lease ends, so nothing new is written where a
 * reader may still read it.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "master/core_int.h"

#define SWEEP_BUCKETS_PER_TICK 65536u

/* ------------------------------------------------------------ lifecycle */

int master__core_new(const struct master_core_opts *o, struct master_core **out)
{
	if (!(o->high_watermark > 0 && o->high_watermark <= 1) ||
	    !(o->eviction_ratio > 0 && o->eviction_ratio <= 1))
		return -EINVAL;
	struct master_core *c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->o = *o;
	master__segs_init(&c->segs, o->seed);
	if (master__index_init(&c->ix)) {
		free(c);
		return -ENOMEM;
	}
	*out = c;
	return 0;
}

void master__core_reset(struct master_core *c)
{
	c->round_left = 0;
	master__walk_abort(c, &c->reap); /* (its segments go below) */
	/* The objects go in the reaper's steps (a grave), or at once
	 * without memory for one. */
	struct master_grave *g = c->ix.nobjs ? calloc(1, sizeof(*g)) : NULL;
	if (g) {
		master__index_detach(&c->ix, &g->tab);
		g->next = c->graves;
		c->graves = g;
	} else {
		master__index_clear(&c->ix);
	}
	master__segs_clear(&c->segs);
	c->nquar = 0; /* (their segments are gone) */
	master__leases_clear(&c->ls);
	master__tiers_clear(&c->tiers);
}

void master__core_free(struct master_core *c)
{
	if (!c)
		return;
	master__index_free(&c->ix);
	while (c->graves) {
		struct master_grave *g = c->graves;
		c->graves = g->next;
		while (!master__index_free_step(&g->tab, &g->pos, SIZE_MAX))
			;
		free(g);
	}
	master__segs_free(&c->segs);
	master__leases_free(&c->ls);
	master__tiers_free(&c->tiers);
	free(c->quar);
	free(c);
}

/* ------------------------------------------------------------ objects */

void master__mirror_seg(struct master_core *c, uint32_t seg, const struct master_obj *o,
			uint64_t offset, enum master_ev_op op)
{
	struct master_seg *s = master__segs_at(&c->segs, seg);
	struct master_ev e = {
		.seq = ++c->ev_seq,
		.offset = offset,
		.size = o->size,
		.crc = o->crc,
		.klen = o->klen,
		.op = (uint8_t)op,
		.flags = (uint8_t)(((o->flags & MASTER_OBJ_CRC) ? MASTER_EV_F_CRC : 0) |
				   ((o->flags & MASTER_OBJ_SOFT_PIN) ? MASTER_EV_F_SOFT_PIN
								     : 0)),
		.key = master__obj_key(o),
	};
	struct master_mlog_stats before;
	master__mlog_stats(s->log, &before);
	if (master__mlog_append(s->log, &e) != 0) {
		c->n.mirror_lost++; /* the owner lists the segment instead */
		return;
	}
	c->n.mirror_events++;
	struct master_mlog_stats after;
	master__mlog_stats(s->log, &after);
	if (after.base > before.base && after.base > before.acked)
		c->n.mirror_lost++;
}

void master__mirror(struct master_core *c, const struct master_obj *o, unsigned i,
		    enum master_ev_op op)
{
	master__mirror_seg(c, o->rep[i].seg, o, o->rep[i].offset, op);
}

enum master_tier master__rep_tier(const struct master_core *c, const struct master_obj *o,
				  unsigned i)
{
	return master__segs_at(&c->segs, o->rep[i].seg)->tier;
}

void master__obj_retier(struct master_core *c, struct master_obj *o)
{
	if (o->flags & MASTER_OBJ_PENDING)
		return;
	bool dram = false;
	for (unsigned i = 0; i < o->nrep && !dram; i++)
		dram = master__rep_tier(c, o, i) == MASTER_TIER_DRAM;
	uint8_t flags = dram ? (uint8_t)(o->flags & ~MASTER_OBJ_SSD)
			     : (uint8_t)(o->flags | MASTER_OBJ_SSD);
	if (flags != o->flags)
		master__index_set_flags(&c->ix, o, flags);
}

uint64_t master__ev_next(struct master_core *c)
{
	return ++c->ev_seq;
}

/* Room for n more quarantined ranges. Errors: -ENOMEM. */
static int quar_reserve(struct master_core *c, size_t n)
{
	if (c->nquar + n <= c->quar_cap)
		return 0;
	size_t cap = MC_MAX(c->quar_cap * 2, c->nquar + n + 16);
	struct master_quarantine *q = realloc(c->quar, cap * sizeof(*q));
	if (!q)
		return -ENOMEM;
	c->quar = q;
	c->quar_cap = cap;
	return 0;
}

/* Hold [off, off+len) of segment seg until until_ms (room reserved). */
static void quar_add(struct master_core *c, uint32_t seg, uint64_t off, uint64_t len,
		     uint64_t until_ms)
{
	c->quar[c->nquar++] = (struct master_quarantine){
		.seg = seg,
		.log_id = master__segs_at(&c->segs, seg)->log_id,
		.off = off,
		.len = len,
		.until_ms = until_ms,
	};
}

void master__rep_drop(struct master_core *c, struct master_obj *o, unsigned i,
		      uint64_t until_ms)
{
	struct master_seg *s = master__segs_at(&c->segs, o->rep[i].seg);
	uint64_t len = master__rep_len(s, o->size);
	if (until_ms && (s->tier != MASTER_TIER_DRAM || quar_reserve(c, 1) != 0))
		until_ms = 0; /* (SSD, or out of memory: freed at once) */
	if (!(o->flags & MASTER_OBJ_PENDING))
		master__mirror(c, o, i, MASTER_EV_DEL);
	if (until_ms && len) {
		quar_add(c, o->rep[i].seg, o->rep[i].offset, len, until_ms);
		c->n.quarantined++;
	} else if (len && master__alloc_put(s->alloc, o->rep[i].offset, len) != 0) {
		/* Cannot happen unless the index is corrupt; the space stays
		 * allocated rather than be handed out twice. */
	}
	s->replicas--;
	master__rep_unlink(o, i);
}

/*
 * Unlink and free the object. Its space on every segment is freed — or,
 * with until_ms, held until then: a forced removal of a leased object,
 * whose readers may go on reading its bytes until their lease ends (a
 * zero-copy view, a get in flight, an agent's lease cache), never
 * another object's. An object being demoted holds its DRAM space until
 * the demotion's deadline (its new owner may be reading it); SSD space
 * is never held (the owner's store lets the reads that began finish).
 */
static void obj_destroy_until(struct master_core *c, struct master_obj *o, uint64_t until_ms)
{
	if (o->flags & MASTER_OBJ_DEMOTING) {
		uint64_t until = master__demote_forget(c, o);
		until_ms = MC_MAX(until_ms, until);
	}
	if (until_ms && quar_reserve(c, o->nrep) != 0)
		until_ms = 0; /* (out of memory: freed at once, as before) */
	bool held = false;
	for (unsigned i = 0; i < o->nrep; i++) {
		struct master_seg *s = master__segs_at(&c->segs, o->rep[i].seg);
		if (!s)
			continue; /* a segment gone (the reaper's) */
		if (!(o->flags & MASTER_OBJ_PENDING))
			master__mirror(c, o, i, MASTER_EV_DEL);
		uint64_t len = master__rep_len(s, o->size);
		if (until_ms && len && s->tier == MASTER_TIER_DRAM) {
			quar_add(c, o->rep[i].seg, o->rep[i].offset, len, until_ms);
			held = true;
		} else if (len && master__alloc_put(s->alloc, o->rep[i].offset, len) != 0) {
			/* Cannot happen unless the index is corrupt; the
			 * space stays allocated rather than be handed out
			 * twice. */
		}
		s->replicas--;
	}
	c->n.quarantined += held;
	master__index_del(&c->ix, o);
}

void master__obj_destroy(struct master_core *c, struct master_obj *o)
{
	obj_destroy_until(c, o, 0);
}

/* Free the quarantined ranges whose lease ended; a range of a segment
 * unmounted since is gone with it. */
static void quar_release(struct master_core *c, uint64_t now_ms)
{
	for (size_t i = 0; i < c->nquar;) {
		struct master_quarantine *q = &c->quar[i];
		if (q->until_ms > now_ms) {
			i++;
			continue;
		}
		struct master_seg *s = master__segs_at(&c->segs, q->seg);
		if (s && s->log_id == q->log_id &&
		    master__alloc_put(s->alloc, q->off, q->len)) {
			/* corrupt index: keep the space */
		}
		*q = c->quar[--c->nquar];
	}
}

/* A removal's obj_destroy_until: until the lease ends, if any (never for
 * a PENDING object). */
static void obj_remove(struct master_core *c, struct master_obj *o, uint64_t now_ms)
{
	obj_destroy_until(c, o, master__leased(o, now_ms) ? o->lease_or_start_ms : 0);
}

static bool expired(const struct master_obj *o, uint64_t now_ms)
{
	return !(o->flags & MASTER_OBJ_PENDING) && o->ttl_ms && o->ttl_ms <= now_ms &&
	       !master__leased(o, now_ms);
}

struct master_obj *master__obj_find(struct master_core *c, const uint8_t *key, size_t klen)
{
	struct master_obj *o = master__index_find(&c->ix, key, klen);
	return o && !master__obj_prune(c, o) ? o : NULL;
}

struct master_obj *master__lookup(struct master_core *c, const uint8_t *key, size_t klen,
				  uint64_t now_ms)
{
	struct master_obj *o = master__obj_find(c, key, klen);
	if (o && expired(o, now_ms)) {
		c->n.ttl_expired++;
		master__obj_destroy(c, o);
		return NULL;
	}
	return o;
}

/* ------------------------------------------------------------ eviction */

/* Objects a watermark round evicts or demotes, at most, in a call after
 * a put or commit (each pays for a few dozen, some 50 us at about 1 us
 * an eviction) and in a tick (some 8 ms of its 100). */
#define EVICT_OP_OBJECTS 64u
#define EVICT_TICK_OBJECTS 8192u
/* Buckets a tick adds while the index is behind (about a millisecond). */
#define CATCH_UP_TICK_SPLITS 4096u

/* Evict o from DRAM: gone, or (with an SSD replica too) only its DRAM
 * replicas. Returns the DRAM bytes freed. */
static uint64_t dram_evict(struct master_core *c, struct master_obj *o)
{
	uint64_t freed = 0;
	bool ssd = false;
	for (unsigned i = 0; i < o->nrep; i++) {
		const struct master_seg *s = master__segs_at(&c->segs, o->rep[i].seg);
		if (s->tier == MASTER_TIER_DRAM)
			freed += master__rep_len(s, o->size);
		else
			ssd = true;
	}
	c->n.evictions++;
	c->n.evicted_bytes += o->size;
	if (!ssd) {
		master__obj_destroy(c, o);
		return freed;
	}
	for (unsigned i = o->nrep; i-- > 0;)
		if (master__rep_tier(c, o, i) == MASTER_TIER_DRAM)
			master__rep_drop(c, o, i, 0);
	master__obj_retier(c, o);
	return freed;
}

/* Evict the least recently used evictable object: plain list first, the
 * soft-pinned one only when the plain list has nothing evictable. Objects
 * on their way to SSD are left alone. Returns the bytes freed, 0 when
 * nothing can go. */
static uint64_t evict_one(struct master_core *c, uint64_t now_ms, bool pinned)
{
	static const enum master_list lists[2] = {MASTER_LIST_PLAIN, MASTER_LIST_PINNED};
	for (int k = 0; k < (pinned ? 2 : 1); k++) {
		struct master_obj *next;
		for (struct master_obj *o = master__index_oldest(&c->ix, lists[k]); o;
		     o = next) {
			next = o->next;
			if (master__index_second_chance(&c->ix, o, &next) ||
			    master__obj_prune(c, o))
				continue;
			if (master__leased(o, now_ms)) {
				c->n.lease_waits++;
				continue;
			}
			if (o->flags & MASTER_OBJ_DEMOTING)
				continue;
			uint64_t freed = dram_evict(c, o);
			/* Zero-byte objects free nothing but still go. */
			return freed ? freed : 1;
		}
	}
	return 0;
}

/*
 * Up to target bytes from list l of a watermark round, demoting where an
 * SSD segment can take the object (tier.c), else evicting. Returns the
 * bytes freed or being freed; *busy when the SSD segments that could
 * take more are busy with demotions already (the round stops: the next
 * one goes on).
 */
static uint64_t round_list(struct master_core *c, enum master_list l, uint64_t target,
			   uint64_t now_ms, bool *busy, size_t *budget)
{
	uint64_t freed = 0;
	struct master_obj *next;
	for (struct master_obj *o = master__index_oldest(&c->ix, l); o && freed < target;
	     o = next) {
		if (*budget == 0)
			return freed;
		next = o->next;
		if (master__index_second_chance(&c->ix, o, &next))
			continue;
		if (master__obj_prune(c, o)) {
			--*budget; /* (a segment's gone: it may be most of the list) */
			continue;
		}
		if (master__leased(o, now_ms)) {
			c->n.lease_waits++;
			continue;
		}
		if (o->flags & MASTER_OBJ_DEMOTING)
			continue;
		uint64_t f = 0;
		switch (master__demote(c, o, now_ms, &f)) {
		case MASTER_DEMOTE_STARTED:
		case MASTER_DEMOTE_DONE:
			break;
		case MASTER_DEMOTE_BUSY:
			*busy = true;
			return freed;
		case MASTER_DEMOTE_NONE:
			f = dram_evict(c, o);
			f = f ? f : 1; /* zero-byte objects free nothing but go */
			break;
		}
		freed += f;
		--*budget; /* (what a skip costs, a look, is not counted) */
	}
	return freed;
}

void master__core_hold_eviction(struct master_core *c, bool hold)
{
	c->evict_hold = hold;
}

static uint64_t evict_round(struct master_core *c, uint64_t now_ms, size_t budget)
{
	if (c->evict_hold)
		return 0;
	uint64_t used, cap = master__dram_capacity(c, &used);
	/* What demotions on their way will free is as good as free. */
	uint64_t demoting = master__demoting_bytes(c);
	used -= MC_MIN(used, demoting);
	if (cap == 0 || (!c->round_left && (double)used <= c->o.high_watermark * (double)cap))
		return 0;
	/* Unpinned objects up to the round's target; soft-pinned ones only
	 * as far as needed to get under the watermark. A call takes budget
	 * objects at most, so a round of millions (10% of a large
	 * pool: 0.85 s of the loop a million) goes on over the next calls,
	 * puts' and ticks', instead of holding the loop in one. */
	uint64_t target = (uint64_t)(c->o.eviction_ratio * (double)cap);
	uint64_t limit = (uint64_t)(c->o.high_watermark * (double)cap);
	if (!c->round_left) {
		c->round_left = target ? target : 1;
		c->n.eviction_rounds++;
	}
	bool busy = false;
	uint64_t freed = round_list(c, MASTER_LIST_PLAIN, c->round_left, now_ms, &busy,
				    &budget);
	c->round_left -= MC_MIN(freed, c->round_left);
	if (budget == 0)
		return freed; /* (the round goes on at the next call) */
	c->round_left = 0;    /* done, busy, or nothing more to evict */
	if (!busy && used - MC_MIN(used, freed) > limit)
		freed += round_list(c, MASTER_LIST_PINNED, used - MC_MIN(used, freed) - limit,
				    now_ms, &busy, &budget);
	return freed;
}

uint64_t master__evict_if_needed(struct master_core *c, uint64_t now_ms)
{
	return evict_round(c, now_ms, EVICT_OP_OBJECTS);
}

/* ------------------------------------------------------------ puts */

struct cand {
	uint32_t id;
	uint64_t free;
};

static int cmp_cand(const void *a, const void *b)
{
	const struct cand *x = a, *y = b;
	if (x->free != y->free)
		return x->free > y->free ? -1 : 1;
	return x->id < y->id ? -1 : x->id > y->id;
}

/* Candidates tried one by one before the rest are sorted at once. */
#define CAND_PICKS 4

/*
 * Put the candidate to try at position i of v (cands[0, i) tried): the
 * one cmp_cand orders first. A put takes one or two and the first try
 * mostly succeeds, so the first CAND_PICKS are picked by a scan each
 * (64 segments: qsort of all of them was 13% of a put's CPU), and past
 * them, when allocations keep failing, the rest are sorted once.
 */
static void cand_next(struct cand *v, uint32_t i, uint32_t nc)
{
	if (i > CAND_PICKS)
		return;
	if (i == CAND_PICKS) {
		qsort(v + i, nc - i, sizeof(*v), cmp_cand);
		return;
	}
	uint32_t best = i;
	for (uint32_t j = i + 1; j < nc; j++)
		if (cmp_cand(&v[j], &v[best]) < 0)
			best = j;
	struct cand t = v[i];
	v[i] = v[best];
	v[best] = t;
}

/* Try to allocate n replicas of len bytes on distinct usable segments.
 * Fills reps on success. Errors: MC_ENO_SPACE (nothing changed). */
static int place(struct master_core *c, uint64_t len, unsigned n, uint32_t preferred,
		 struct master_rep *reps)
{
	const struct master_segs *sg = &c->segs;
	struct cand stack[64], *cands = stack;
	uint32_t nc = 0, nsegs = master__segs_count(sg);
	if (nsegs > MC_ARRAY_LEN(stack)) {
		cands = malloc(nsegs * sizeof(*cands));
		if (!cands)
			return -ENOMEM;
	}
	for (uint32_t i = 0; i < master__seg_slots(c); i++) {
		const struct master_seg *s = master__segs_at(sg, i);
		if (!s || s->tier != MASTER_TIER_DRAM || s->syncing)
			continue;
		cands[nc].id = i;
		/* The preferred segment sorts first. */
		cands[nc].free = i == preferred ? UINT64_MAX
						: master__alloc_free_bytes(s->alloc);
		nc++;
	}
	int rc = MC_ENO_SPACE;
	unsigned got = 0;
	if (nc >= n) {
		for (uint32_t i = 0; i < nc && got < n; i++) {
			cand_next(cands, i, nc);
			uint64_t off = 0;
			if (len && master__alloc_get(master__segs_at(sg, cands[i].id)->alloc,
						     len, &off))
				continue;
			reps[got].seg = cands[i].id;
			reps[got].offset = off;
			reps[got].state = MASTER_REP_PENDING;
			got++;
		}
		if (got == n) {
			rc = 0;
		} else {
			for (unsigned i = 0; i < got && len; i++)
				if (master__alloc_put(master__segs_at(sg, reps[i].seg)->alloc,
						      reps[i].offset, len)) {
					/* just allocated: cannot fail */
				}
		}
	}
	if (cands != stack)
		free(cands);
	return rc;
}

/* Segments that could hold len bytes if they were empty. */
static unsigned usable_segments(const struct master_core *c, uint64_t len)
{
	unsigned n = 0;
	for (uint32_t i = 0; i < master__seg_slots(c); i++) {
		const struct master_seg *s = master__segs_at(&c->segs, i);
		n += s && s->tier == MASTER_TIER_DRAM && !s->syncing &&
		     (s->size & ~(uint64_t)(MASTER_ALLOC_GRANULE - 1)) >= len;
	}
	return n;
}

int master__put_start(struct master_core *c, const struct master_put *p, uint64_t now_ms,
		      const struct master_obj **out)
{
	unsigned n = p->replica_num ? p->replica_num : 1;
	if (!master__key_ok(p->klen) || n > MASTER_MAX_REPLICAS)
		return -EINVAL;
	if (master__lookup(c, p->key, p->klen, now_ms))
		return MC_EOBJECT_ALREADY_EXISTS;
	uint64_t len = master__alloc_len(p->size);
	if (usable_segments(c, len) < n)
		return MC_ENO_SPACE; /* eviction cannot help */
	uint32_t pref = p->preferred && *p->preferred ? master__seg_find(c, p->preferred)
						      : MASTER_NO_SEGMENT;
	struct master_rep reps[MASTER_MAX_REPLICAS];
	int rc;
	while ((rc = place(c, len, n, pref, reps)) == MC_ENO_SPACE) {
		if (!evict_one(c, now_ms, true))
			return MC_ENO_SPACE;
	}
	if (rc)
		return rc;
	struct master_obj *o = master__obj_new(p->key, p->klen, n);
	if (!o) {
		for (unsigned i = 0; i < n && len; i++)
			if (master__alloc_put(master__segs_at(&c->segs, reps[i].seg)->alloc,
					      reps[i].offset, len)) {
				/* just allocated: cannot fail */
			}
		return -ENOMEM;
	}
	memcpy(o->rep, reps, n * sizeof(*reps));
	for (unsigned i = 0; i < n; i++)
		master__segs_at(&c->segs, reps[i].seg)->replicas++;
	o->size = p->size;
	o->flags = MASTER_OBJ_PENDING | (p->soft_pin ? MASTER_OBJ_SOFT_PIN : 0);
	o->lease_or_start_ms = now_ms;
	o->ttl_ms = p->ttl_ms;
	master__index_link(&c->ix, o);
	c->n.put_starts++;
	master__evict_if_needed(c, now_ms);
	*out = o;
	return 0;
}

static struct master_obj *pending_obj(struct master_core *c, const uint8_t *key, size_t klen,
				      uint64_t now_ms, int *err)
{
	if (!master__key_ok(klen)) {
		*err = -EINVAL;
		return NULL;
	}
	struct master_obj *o = master__lookup(c, key, klen, now_ms);
	if (!o) {
		*err = MC_EOBJECT_NOT_FOUND;
		return NULL;
	}
	if (!(o->flags & MASTER_OBJ_PENDING)) {
		*err = MC_EINVALID_REPLICA;
		return NULL;
	}
	return o;
}

int master__put_end(struct master_core *c, const uint8_t *key, size_t klen,
		    const uint32_t *crc, uint64_t now_ms)
{
	int err = 0;
	struct master_obj *o = pending_obj(c, key, klen, now_ms, &err);
	if (!o)
		return err;
	for (unsigned i = 0; i < o->nrep; i++)
		o->rep[i].state = MASTER_REP_COMPLETE;
	o->lease_or_start_ms = 0;
	o->ttl_ms = o->ttl_ms ? now_ms + o->ttl_ms : 0;
	if (crc) {
		o->crc = *crc;
		o->flags |= MASTER_OBJ_CRC;
	}
	master__index_seal(&c->ix, o);
	for (unsigned i = 0; i < o->nrep; i++)
		master__mirror(c, o, i, MASTER_EV_ADD);
	c->n.puts++;
	return 0;
}

int master__put_revoke(struct master_core *c, const uint8_t *key, size_t klen)
{
	int err = 0;
	/* A PENDING object never expires: time does not matter here. */
	struct master_obj *o = pending_obj(c, key, klen, 0, &err);
	if (!o)
		return err;
	master__obj_destroy(c, o);
	c->n.put_revokes++;
	return 0;
}

/* ------------------------------------------------------------ gets */

int master__get(struct master_core *c, const uint8_t *key, size_t klen, uint64_t now_ms,
		const struct master_obj **out)
{
	if (!master__key_ok(klen))
		return -EINVAL;
	c->n.gets++;
	struct master_obj *o = master__lookup(c, key, klen, now_ms);
	if (!o || (o->flags & MASTER_OBJ_PENDING)) {
		c->n.misses++;
		return MC_EOBJECT_NOT_FOUND;
	}
	c->n.hits++;
	uint64_t until = now_ms + c->o.lease_ttl_ms;
	if (until > o->lease_or_start_ms)
		o->lease_or_start_ms = until;
	master__index_touch(o);
	*out = o;
	return 0;
}

/* How many items ahead of a batch's lookups each prefetch stage runs:
 * the bucket's line must arrive before the object stage reads it. */
#define PREFETCH_BUCKET_AHEAD 12
#define PREFETCH_OBJECT_AHEAD 8

void master__prefetch_ahead(const struct master_core *c, const void *batch, size_t n, size_t i,
			    master_key_at_fn key_at)
{
	static const struct {
		size_t ahead;
		enum master_prefetch stage;
	} st[] = {{PREFETCH_BUCKET_AHEAD, MASTER_PREFETCH_BUCKET},
		  {PREFETCH_OBJECT_AHEAD, MASTER_PREFETCH_OBJECT}};
	for (size_t s = 0; s < MC_ARRAY_LEN(st); s++) {
		/* The first lookup also starts the stages of every item before
		 * its distance. */
		size_t from = i == 0 ? 0 : i + st[s].ahead;
		for (size_t j = from; j <= i + st[s].ahead && j < n; j++) {
			size_t klen;
			const uint8_t *key = key_at(batch, j, &klen);
			if (master__key_ok(klen))
				master__index_prefetch(&c->ix, key, klen, st[s].stage);
		}
	}
}

int master__exist(struct master_core *c, const uint8_t *key, size_t klen, uint64_t now_ms)
{
	if (!master__key_ok(klen))
		return -EINVAL;
	struct master_obj *o = master__lookup(c, key, klen, now_ms);
	return o && !(o->flags & MASTER_OBJ_PENDING);
}

/* ------------------------------------------------------------ removes */

int master__remove(struct master_core *c, const uint8_t *key, size_t klen, bool force,
		   uint64_t now_ms)
{
	if (!master__key_ok(klen))
		return -EINVAL;
	struct master_obj *o = master__lookup(c, key, klen, now_ms);
	if (!o || (o->flags & MASTER_OBJ_PENDING))
		return MC_EOBJECT_NOT_FOUND;
	if (!force && master__leased(o, now_ms)) {
		c->n.lease_waits++;
		return MC_EOBJECT_HAS_LEASE;
	}
	obj_remove(c, o, now_ms);
	c->n.removes++;
	return 0;
}

void master__walk_begin(struct master_core *c, struct master_walk *w)
{
	w->bucket = 0;
	w->removed = w->skipped = 0;
	w->open = true;
	c->ix.walks++;
}

void master__walk_abort(struct master_core *c, struct master_walk *w)
{
	if (!w->open)
		return;
	w->open = false;
	c->ix.walks--;
}

/* The walk's next buckets, until `budget` objects or more were looked
 * at: fn(ud, o) for each object left after its replicas on segments gone
 * are dropped (fn NULL: only that); fn returns false to end the walk.
 * True once the walk is over (closed). */
static bool walk_buckets(struct master_core *c, struct master_walk *w, size_t budget,
			 bool (*fn)(void *ud, struct master_obj *o), void *ud)
{
	if (!w->open)
		return true;
	size_t nb = master__index_slots(&c->ix), seen = 0;
	for (; w->bucket < nb && seen < budget; w->bucket++)
		for (struct master_obj *o = master__index_slot(&c->ix, w->bucket), *next; o;
		     o = next, seen++) {
			next = o->hnext;
			if (!master__obj_prune(c, o) && fn && !fn(ud, o)) {
				master__walk_abort(c, w);
				return true;
			}
		}
	if (w->bucket < nb)
		return false;
	master__walk_abort(c, w);
	return true;
}

struct removal {
	struct master_core *c;
	struct master_walk *w;
	uint64_t now_ms;
};

static bool remove_one(void *ud, struct master_obj *o)
{
	struct removal *r = ud;
	struct master_walk *w = r->w;
	if (o->flags & MASTER_OBJ_PENDING) {
		w->skipped += w->pending;
	} else if (w->match && !w->match(w->ud, master__obj_key(o), o->klen)) {
		/* not asked for */
	} else if (!w->force && master__leased(o, r->now_ms)) {
		w->skipped++;
	} else {
		obj_remove(r->c, o, r->now_ms);
		w->removed++;
		r->c->n.removes++;
	}
	return true;
}

bool master__walk_step(struct master_core *c, struct master_walk *w, size_t budget,
		       uint64_t now_ms)
{
	struct removal r = {c, w, now_ms};
	return walk_buckets(c, w, budget, remove_one, &r);
}

/* master__scan_step's fn, for walk_buckets. */
struct scan {
	bool (*fn)(void *ud, const struct master_obj *o);
	void *ud;
};

static bool scan_one(void *ud, struct master_obj *o)
{
	struct scan *sc = ud;
	return sc->fn(sc->ud, o);
}

bool master__scan_step(struct master_core *c, struct master_walk *w, size_t budget,
		       bool (*fn)(void *ud, const struct master_obj *o), void *ud)
{
	struct scan sc = {fn, ud};
	return walk_buckets(c, w, budget, fn ? scan_one : NULL, &sc);
}

static void remove_walk(struct master_core *c, struct master_walk *w, uint64_t now_ms,
			uint64_t *removed, uint64_t *skipped)
{
	master__walk_begin(c, w);
	while (!master__walk_step(c, w, SIZE_MAX, now_ms))
		;
	*removed = w->removed;
	*skipped = w->skipped;
}

void master__remove_all(struct master_core *c, bool force, uint64_t now_ms, uint64_t *removed,
			uint64_t *skipped)
{
	struct master_walk w = {.force = force, .pending = true};
	remove_walk(c, &w, now_ms, removed, skipped);
}

void master__remove_match(struct master_core *c,
			  bool (*match)(void *ud, const uint8_t *key, size_t klen), void *ud,
			  bool force, uint64_t now_ms, uint64_t *removed, uint64_t *skipped)
{
	struct master_walk w = {.match = match, .ud = ud, .force = force};
	remove_walk(c, &w, now_ms, removed, skipped);
}

int master__replica_clear(struct master_core *c, const uint8_t *key, size_t klen, uint32_t seg,
			  uint64_t now_ms)
{
	if (!master__key_ok(klen))
		return -EINVAL;
	struct master_obj *o = master__lookup(c, key, klen, now_ms);
	if (!o || (o->flags & MASTER_OBJ_PENDING))
		return MC_EOBJECT_NOT_FOUND;
	unsigned i = 0;
	while (i < o->nrep && o->rep[i].seg != seg)
		i++;
	if (i == o->nrep)
		return MC_EOBJECT_NOT_FOUND;
	if (master__leased(o, now_ms))
		return MC_EOBJECT_HAS_LEASE;
	c->n.removes++;
	if (o->nrep == 1) {
		master__obj_destroy(c, o);
		return 0;
	}
	master__rep_drop(c, o, i, 0);
	master__obj_retier(c, o);
	return 0;
}

/* ------------------------------------------------------------ timers */

struct sweep {
	struct master_core *c;
	uint64_t now_ms;
};

static void sweep_one(void *ud, struct master_obj *o)
{
	struct sweep *sw = ud;
	if (expired(o, sw->now_ms)) {
		sw->c->n.ttl_expired++;
		master__obj_destroy(sw->c, o);
	}
}

void master__tick(struct master_core *c, uint64_t now_ms)
{
	quar_release(c, now_ms);
	master__leases_expire(c, now_ms);
	/* PENDING puts, oldest first. */
	struct master_obj *o;
	while ((o = master__index_oldest(&c->ix, MASTER_LIST_PENDING)) &&
	       o->lease_or_start_ms + c->o.put_timeout_ms <= now_ms) {
		c->n.put_timeouts++;
		master__obj_destroy(c, o);
	}
	master__agents_expire(c, now_ms);
	master__tiers_tick(c, now_ms);
	/* A slice of the index for TTL expiry (none without TTLs: the walk
	 * was 2-3% of an agent's loop under 4K puts, with the master in its
	 * process). */
	struct sweep sw = {c, now_ms};
	master__index_sweep(&c->ix, SWEEP_BUCKETS_PER_TICK, sweep_one, &sw);
	evict_round(c, now_ms, EVICT_TICK_OBJECTS);
	master__ssd_evict_if_needed(c, now_ms);
	/* Buckets a walk held back, when puts do not come to add them. */
	master__index_catch_up(&c->ix, CATCH_UP_TICK_SPLITS);
}

/* ------------------------------------------------------------ stats */

void master__core_stats(const struct master_core *c, struct master_core_stats *st)
{
	memset(st, 0, sizeof(*st));
	master__index_stats(&c->ix, st);
	master__segs_stats(c, st);
	st->ssd_objects = master__index_count(&c->ix, MASTER_LIST_SSD);
	master__tiers_stats(c, st);
}

const struct master_counters *master__core_counters(const struct master_core *c)
{
	return &c->n;
}

uint64_t master__ev_seq(const struct master_core *c)
{
	return c->ev_seq;
}

void master__ev_seq_floor(struct master_core *c, uint64_t floor)
{
	if (floor > c->ev_seq)
		c->ev_seq = floor;
	master__leases_floor(&c->ls, floor);
}
