/*
 * lease: the master core's put leases (core_int.h; proto/master.proto,
 * "Put leases"), pure.
 *
 * A lease delegates space of a segment to an agent, which writes objects
 * there and seals them with one BatchCommit instead of a PutStart and a
 * PutEnd each. Leased space is allocated in the segment's allocator (it
 * counts as used) and is free space of the segment's lease allocator
 * until committed or released: a commit reserves its range there, so the
 * same space is never sealed twice.
 *
 * The owner of a segment leases its own space in the segment's current
 * epoch (a new one at every mount), an eighth of the segment at most.
 * Another agent leases space for --put-timeout (a remote lease), a 32nd
 * of the segment at most and all of them an eighth; what it has not
 * committed when the time is over goes back. No lease is granted past the
 * eviction watermark: a lease never makes room by evicting.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "master/core_int.h"

void master__leases_clear(struct master_leases *ls)
{
	ls->nrl = 0;
}

void master__leases_free(struct master_leases *ls)
{
	free(ls->rl);
	ls->rl = NULL;
	ls->nrl = ls->rl_cap = 0;
}

void master__leases_floor(struct master_leases *ls, uint64_t floor)
{
	if (floor > ls->epoch_seq)
		ls->epoch_seq = floor;
}

struct ranges {
	uint64_t (*v)[2];
	size_t n, cap;
	bool nomem;
};

static void collect_range(void *ud, uint64_t off, uint64_t len)
{
	struct ranges *r = ud;
	if (r->n == r->cap) {
		size_t cap = r->cap ? r->cap * 2 : 16;
		uint64_t(*v)[2] = realloc(r->v, cap * sizeof(*v));
		if (!v) {
			r->nomem = true;
			return;
		}
		r->v = v;
		r->cap = cap;
	}
	r->v[r->n][0] = off;
	r->v[r->n][1] = len;
	r->n++;
}

void master__lease_reset(struct master_core *c, struct master_seg *s)
{
	struct ranges r = {0};
	master__alloc_foreach_free(s->lease, collect_range, &r);
	for (size_t i = 0; i < r.n; i++)
		if (master__alloc_reserve(s->lease, r.v[i][0], r.v[i][1]) == 0 &&
		    master__alloc_put(s->alloc, r.v[i][0], r.v[i][1]) == 0)
			s->leased -= MC_MIN(s->leased, r.v[i][1]);
	/* Out of memory listing them: the ranges stay allocated (lost until
	 * the segment is mounted empty), never handed out twice. */
	free(r.v);
	s->lease_epoch = ++c->ls.epoch_seq;
}

int master__lease_space_new(uint64_t size, uint64_t seed, struct master_alloc **out)
{
	int rc = master__alloc_new(size, seed, out);
	if (rc)
		return rc;
	rc = master__alloc_reserve(*out, 0, size & ~(uint64_t)(MASTER_ALLOC_GRANULE - 1));
	if (rc) {
		master__alloc_free(*out);
		*out = NULL;
	}
	return rc;
}

static struct master_seg *owned_seg(struct master_core *c, const char *agent,
				    const char *segment, uint32_t *id, int *err)
{
	*id = master__seg_find(c, segment ? segment : "");
	if (*id == MASTER_NO_SEGMENT) {
		*err = MC_ESEGMENT_NOT_FOUND;
		return NULL;
	}
	struct master_seg *s = master__segs_at(&c->segs, *id);
	if (!agent || strcmp(s->agent->id, agent) != 0) {
		*err = -EACCES;
		return NULL;
	}
	return s;
}

/* Lease up to want bytes of s (MASTER_ALLOC_GRANULE multiples, at least
 * MASTER_LEASE_MIN_BYTES, halving until the allocator has a range), only
 * below the eviction watermark: a lease never makes room by evicting
 * (puts that need it take PutStart, which does). *len 0: none. */
static int lease_carve(struct master_core *c, struct master_seg *s, uint64_t want,
		       uint64_t *off, uint64_t *len)
{
	*off = *len = 0;
	if (s->syncing || s->tier != MASTER_TIER_DRAM)
		return 0;
	uint64_t used, cap = master__dram_capacity(c, &used);
	uint64_t below = (uint64_t)(c->o.high_watermark * (double)cap);
	below = below > used ? below - used : 0;
	uint64_t g = MASTER_ALLOC_GRANULE;
	for (uint64_t n = MC_MIN(want, below) & ~(g - 1); n >= MASTER_LEASE_MIN_BYTES;
	     n = (n / 2) & ~(g - 1)) {
		if (master__alloc_get(s->alloc, n, off) != 0)
			continue;
		if (master__alloc_put(s->lease, *off, n) != 0) {
			if (master__alloc_put(s->alloc, *off, n)) {
				/* just allocated: cannot fail */
			}
			*off = 0;
			return -ENOMEM;
		}
		*len = n;
		s->leased += n;
		c->n.lease_grants++;
		c->n.lease_granted_bytes += n;
		return 0;
	}
	*off = 0;
	return 0;
}

int master__lease_grant(struct master_core *c, const char *agent, const char *segment,
			uint64_t epoch, uint64_t want, uint64_t *off, uint64_t *len)
{
	uint32_t id;
	int err = 0;
	struct master_seg *s = owned_seg(c, agent, segment, &id, &err);
	*off = *len = 0;
	if (!s)
		return err;
	if (epoch != s->lease_epoch)
		return MC_EINVALID_REPLICA;
	/* At most an eighth of the segment leased to its owner and
	 * uncommitted at once (remote leases apart). */
	uint64_t most = s->size / 8, own = s->leased - MC_MIN(s->leased, s->rleased);
	if (own >= most)
		return 0;
	return lease_carve(c, s, MC_MIN(want, most - own), off, len);
}

uint64_t master__lease_release(struct master_core *c, const char *agent, const char *segment,
			       uint64_t epoch, uint64_t off, uint64_t len)
{
	uint32_t id;
	int err;
	struct master_seg *s = owned_seg(c, agent, segment, &id, &err);
	if (!s || epoch != s->lease_epoch || len == 0 || off > s->size || len > s->size - off)
		return 0;
	if (master__alloc_reserve(s->lease, off, len) != 0)
		return 0; /* not (all) leased: a stale or bad range */
	if (master__alloc_put(s->alloc, off, len) != 0)
		return 0; /* cannot happen unless the index is corrupt */
	s->leased -= MC_MIN(s->leased, len);
	c->n.lease_released_bytes += len;
	return len;
}

/* ------------------------------------------------------------ remote leases */

/* Take back what is still leased of [off, off+len) of s (its lease
 * allocator's free ranges there); returns the bytes. */
static uint64_t lease_take_back(struct master_seg *s, uint64_t off, uint64_t len)
{
	struct ranges r = {0};
	uint64_t n = 0;
	master__alloc_foreach_free(s->lease, collect_range, &r);
	for (size_t i = 0; i < r.n; i++) {
		uint64_t a = MC_MAX(r.v[i][0], off),
			 b = MC_MIN(r.v[i][0] + r.v[i][1], off + len);
		if (a >= b)
			continue;
		if (master__alloc_reserve(s->lease, a, b - a) == 0 &&
		    master__alloc_put(s->alloc, a, b - a) == 0)
			n += b - a;
	}
	/* Out of memory listing them: those ranges stay leased (lost until
	 * the segment is mounted again), never handed out twice. */
	free(r.v);
	s->leased -= MC_MIN(s->leased, n);
	s->rleased -= MC_MIN(s->rleased, n);
	return n;
}

/* The live remote lease of agent on segment id in epoch that holds
 * [off, off+len), or NULL. */
static struct master_rlease *rlease_find(struct master_leases *ls, const char *agent,
					 uint32_t id, uint64_t epoch, uint64_t off,
					 uint64_t len, uint64_t now_ms)
{
	for (size_t i = ls->nrl; i-- > 0;) { /* newest first: they are in use */
		struct master_rlease *l = &ls->rl[i];
		if (l->seg == id && l->epoch == epoch && l->until_ms > now_ms &&
		    off >= l->off && len <= l->len && off - l->off <= l->len - len &&
		    strcmp(l->agent, agent) == 0)
			return l;
	}
	return NULL;
}

void master__leases_expire(struct master_core *c, uint64_t now_ms)
{
	struct master_leases *ls = &c->ls;
	for (size_t i = 0; i < ls->nrl;) {
		struct master_rlease *l = &ls->rl[i];
		struct master_seg *s = master__segs_at(&c->segs, l->seg);
		bool stale = !s || s->lease_epoch != l->epoch;
		if (!stale && l->until_ms > now_ms) {
			i++;
			continue;
		}
		if (!stale)
			c->n.lease_released_bytes += lease_take_back(s, l->off, l->len);
		*l = ls->rl[--ls->nrl];
	}
}

int master__rlease_grant(struct master_core *c, const char *agent, const char *segment,
			 uint64_t epoch, uint64_t want, uint64_t now_ms,
			 struct master_rlease_grant *g)
{
	struct master_leases *ls = &c->ls;
	memset(g, 0, sizeof(*g));
	uint32_t id = master__seg_find(c, segment ? segment : "");
	if (id == MASTER_NO_SEGMENT)
		return MC_ESEGMENT_NOT_FOUND;
	struct master_seg *s = master__segs_at(&c->segs, id);
	if (!agent || !agent[0] || strlen(agent) >= MASTER_AGENT_ID_MAX ||
	    strcmp(s->agent->id, agent) == 0)
		return -EINVAL;
	if (epoch && epoch != s->lease_epoch)
		return MC_EINVALID_REPLICA;
	g->epoch = s->lease_epoch;
	g->base = s->base;
	g->ttl_ms = c->o.put_timeout_ms;
	master__leases_expire(c, now_ms);
	/* One holder at most a 32nd of the segment, all of them an eighth;
	 * never past the eviction watermark (a lease does not evict). */
	uint64_t held = 0;
	for (size_t i = 0; i < ls->nrl; i++)
		if (ls->rl[i].seg == id && strcmp(ls->rl[i].agent, agent) == 0)
			held += ls->rl[i].len - ls->rl[i].committed;
	uint64_t mine = s->size / 32, all = s->size / 8;
	if (held >= mine || s->rleased >= all)
		return 0;
	if (ls->nrl == ls->rl_cap) {
		size_t cap = ls->rl_cap ? ls->rl_cap * 2 : 16;
		struct master_rlease *v = realloc(ls->rl, cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		ls->rl = v;
		ls->rl_cap = cap;
	}
	int rc = lease_carve(c, s, MC_MIN(MC_MIN(want, mine - held), all - s->rleased),
			     &g->offset, &g->length);
	if (rc || !g->length)
		return rc;
	struct master_rlease *l = &ls->rl[ls->nrl++];
	snprintf(l->agent, sizeof(l->agent), "%s", agent);
	l->seg = id;
	l->epoch = s->lease_epoch;
	l->off = g->offset;
	l->len = g->length;
	l->until_ms = now_ms + c->o.put_timeout_ms;
	l->committed = 0;
	s->rleased += g->length;
	return 0;
}

/* ------------------------------------------------------------ commits */

/*
 * A promotion: the object under it->key, on SSD segments only, gets the
 * DRAM replica at (segment id, off) — space committed from the lease —
 * and loses its SSD replicas, whose owners delete them (their readers
 * that had not begun find them gone and ask again). Refused, the space
 * goes back to the free space.
 */
static int commit_promotion(struct master_core *c, struct master_seg *s, uint32_t id,
			    const struct master_commit *it, uint64_t off, uint64_t len,
			    uint64_t now_ms)
{
	struct master_obj *o = NULL;
	int rc = 0;
	if (!master__key_ok(it->klen))
		rc = -EINVAL;
	else if (!(o = master__lookup(c, it->key, it->klen, now_ms)) ||
		 (o->flags & MASTER_OBJ_PENDING))
		rc = MC_EOBJECT_NOT_FOUND;
	else if (!(o->flags & MASTER_OBJ_SSD) || (o->flags & MASTER_OBJ_DEMOTING) ||
		 o->size != it->size || !len || o->nrep >= MASTER_MAX_REPLICAS ||
		 ((o->flags & MASTER_OBJ_CRC) && (!it->has_crc || it->crc != o->crc)))
		rc = MC_EINVALID_REPLICA;
	else if (!(o = master__index_add_replica(&c->ix, o, id, off)))
		rc = -ENOMEM;
	if (rc) {
		if (len && master__alloc_put(s->alloc, off, len)) {
			/* leased until now: cannot fail */
		}
		c->n.commit_refusals++;
		return rc;
	}
	s->replicas++;
	if (it->has_crc && !(o->flags & MASTER_OBJ_CRC)) {
		o->crc = it->crc;
		o->flags |= MASTER_OBJ_CRC;
	}
	master__mirror(c, o, (unsigned)o->nrep - 1, MASTER_EV_ADD);
	for (unsigned i = o->nrep; i-- > 0;)
		if (master__rep_tier(c, o, i) == MASTER_TIER_SSD)
			master__rep_drop(c, o, i, 0);
	master__obj_retier(c, o);
	c->n.promotions++;
	c->n.commits++;
	master__evict_if_needed(c, now_ms);
	return 0;
}

int master__commit(struct master_core *c, const char *agent, const char *segment,
		   uint64_t epoch, const struct master_commit *it, uint64_t now_ms)
{
	struct master_leases *ls = &c->ls;
	uint32_t id;
	int err = 0;
	uint64_t len = master__alloc_len(it->size);
	uint64_t off = len ? it->offset : 0;
	struct master_seg *s = owned_seg(c, agent, segment, &id, &err);
	/* Another agent's segment: into space of a live remote lease of
	 * the caller's. */
	bool remote = !s && err == -EACCES;
	struct master_rlease *rl = NULL;
	if (remote) {
		s = master__segs_at(&c->segs, id);
		if (!len || !(rl = rlease_find(ls, agent, id, epoch, off, len, now_ms))) {
			c->n.commit_refusals++;
			return MC_EINVALID_REPLICA;
		}
	}
	if (!s) {
		c->n.commit_refusals++;
		return err;
	}
	if (epoch != s->lease_epoch || (len && (off > s->size || len > s->size - off)) ||
	    (len && master__alloc_reserve(s->lease, off, len) != 0)) {
		c->n.commit_refusals++;
		return MC_EINVALID_REPLICA;
	}
	/* The space is this commit's now: the object's, or free again. */
	s->leased -= MC_MIN(s->leased, len);
	if (rl) {
		s->rleased -= MC_MIN(s->rleased, len);
		rl->committed += len;
		if (rl->committed >= rl->len)
			*rl = ls->rl[--ls->nrl]; /* used up: nothing left to take back */
	}
	if (it->promote)
		return commit_promotion(c, s, id, it, off, len, now_ms);
	struct master_obj *o = NULL;
	int rc = 0;
	if (!master__key_ok(it->klen))
		rc = -EINVAL;
	else if (master__lookup(c, it->key, it->klen, now_ms))
		rc = MC_EOBJECT_ALREADY_EXISTS;
	else if (!(o = master__obj_new(it->key, it->klen, 1)))
		rc = -ENOMEM;
	if (rc) {
		if (len && master__alloc_put(s->alloc, off, len)) {
			/* leased until now: cannot fail */
		}
		c->n.commit_refusals++;
		return rc;
	}
	o->size = it->size;
	o->rep[0].offset = off;
	o->rep[0].seg = id;
	o->rep[0].state = MASTER_REP_COMPLETE;
	o->flags = it->soft_pin ? MASTER_OBJ_SOFT_PIN | MASTER_OBJ_LRU_PIN : 0;
	if (it->has_crc) {
		o->crc = it->crc;
		o->flags |= MASTER_OBJ_CRC;
	}
	o->ttl_ms = it->ttl_ms ? now_ms + it->ttl_ms : 0;
	master__index_link(&c->ix, o);
	s->replicas++;
	master__mirror(c, o, 0, MASTER_EV_ADD);
	c->n.commits++;
	c->n.puts++;
	/* Leased space was counted as used already; committed, it is
	 * evictable again (when read leases allow). */
	master__evict_if_needed(c, now_ms);
	return 0;
}
