/*
 * core: the master's state and policy, pure (time is an argument). See
 * master_int.h.
 *
 * Index: a chained hash table of objects (power-of-two buckets, doubled
 * when the load passes 1). Each object is one allocation: header,
 * replicas, key. COMPLETE objects sit on one of two LRU lists (plain and
 * soft-pinned), least recently read at the head; a GetReplicas moves the
 * object to the tail. PENDING objects sit on the pending list in PutStart
 * order, which with one --put-timeout is also deadline order.
 *
 * Eviction walks the plain list from the head, skipping leased objects,
 * then the pinned list, until the round's target is freed: a round frees
 * eviction_ratio of the DRAM capacity when usage passes the watermark, or
 * just enough for a placement that found no room.
 *
 * Memory per object is measured with malloc_usable_size (plus the
 * allocator's per-chunk header) and the bucket array.
 *
 * Mirror logs: every change of a COMPLETE replica is appended to its
 * segment's log (mlog.c) with a sequence number from one core-wide
 * counter — ADD when PutEnd seals it, DEL when its object leaves the
 * index (remove, eviction, TTL, an agent's expiry elsewhere). PENDING
 * objects are never logged, and an inventory report is not news to the
 * owner that made it.
 */
#include <errno.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "master/core.h"

#define MIN_BUCKETS 1024u
#define SWEEP_BUCKETS_PER_TICK 65536u
#define LIST_BUCKETS_PER_PAGE 65536u
#define MALLOC_HEADER_BYTES sizeof(size_t)
#define DEFAULT_MIRROR_LOG_BYTES (16u << 20)

struct lru {
	struct master_obj *head, *tail;
	uint64_t n;
};

struct master_core {
	struct master_core_opts o;
	struct master_obj **buckets;
	size_t nbuckets;
	uint64_t nobjs, npending, key_bytes, obj_bytes;
	struct lru plain, pinned, pending;
	struct master_seg **segs;
	uint32_t nsegs_cap;
	uint32_t nsegs;
	struct master_agent *agents;
	uint64_t nagents;
	size_t sweep_pos;
	uint64_t nttl;      /* objects with a TTL (PENDING ones too): the sweep's work */
	uint64_t seed;
	uint64_t ev_seq;   /* last mirror-log sequence number handed out */
	uint64_t lease_seq; /* last lease epoch handed out (floored alike) */
	/* Space of objects removed by force while leased: allocated until
	 * their lease ends, so nothing new is written where a reader may
	 * still read (obj_destroy_until, master__tick). */
	struct quarantine {
		uint32_t seg;
		uint64_t log_id; /* the segment's incarnation */
		uint64_t off, len, until_ms;
	} *quar;
	size_t nquar, quar_cap;
	/* Remote leases: space of a segment leased to an agent that does not
	 * own it, usable until until_ms (then what is left goes back). */
	struct rlease {
		char agent[MASTER_AGENT_ID_MAX];
		uint32_t seg;
		uint64_t epoch, off, len, until_ms;
		uint64_t committed; /* bytes of it committed */
	} *rl;
	size_t nrl, rl_cap;
	struct master_counters n;
};

/* ------------------------------------------------------------ helpers */

static uint32_t key_hash(const uint8_t *key, size_t klen)
{
	uint64_t h = mc_hash64(key, klen);
	return (uint32_t)(h ^ (h >> 32));
}

static bool key_ok(size_t klen)
{
	return klen >= 1 && klen <= MASTER_MAX_KEY_BYTES;
}

static size_t obj_alloc_bytes(const struct master_obj *o)
{
	return malloc_usable_size((void *)o) + MALLOC_HEADER_BYTES;
}

static void lru_push(struct lru *l, struct master_obj *o)
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

static void lru_del(struct lru *l, struct master_obj *o)
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

static struct lru *obj_list(struct master_core *c, const struct master_obj *o)
{
	if (o->flags & MASTER_OBJ_PENDING)
		return &c->pending;
	return (o->flags & MASTER_OBJ_LRU_PIN) ? &c->pinned : &c->plain;
}

static struct master_obj **bucket_of(const struct master_core *c, uint32_t h)
{
	return &c->buckets[h & (c->nbuckets - 1)];
}

static struct master_obj **find_slot(const struct master_core *c,
				     const uint8_t *key, size_t klen, uint32_t h)
{
	struct master_obj **pp = bucket_of(c, h);
	for (; *pp; pp = &(*pp)->hnext) {
		const struct master_obj *o = *pp;
		if (o->hash == h && o->klen == klen &&
		    memcmp(master__obj_key(o), key, klen) == 0)
			return pp;
	}
	return pp;
}

static void grow(struct master_core *c)
{
	size_t n = c->nbuckets * 2;
	struct master_obj **b = calloc(n, sizeof(*b));
	if (!b)
		return; /* keep the longer chains */
	for (size_t i = 0; i < c->nbuckets; i++) {
		struct master_obj *o = c->buckets[i];
		while (o) {
			struct master_obj *next = o->hnext;
			struct master_obj **pp = &b[o->hash & (n - 1)];
			o->hnext = *pp;
			*pp = o;
			o = next;
		}
	}
	free(c->buckets);
	c->buckets = b;
	c->nbuckets = n;
	c->sweep_pos = 0;
}

/* A new object, not yet linked anywhere. */
static struct master_obj *obj_new(const uint8_t *key, size_t klen,
				  unsigned nrep)
{
	struct master_obj *o =
		malloc(sizeof(*o) + nrep * sizeof(struct master_rep) + klen);
	if (!o)
		return NULL;
	memset(o, 0, sizeof(*o));
	o->klen = (uint16_t)klen;
	o->nrep = (uint8_t)nrep;
	memcpy((uint8_t *)&o->rep[nrep], key, klen);
	o->hash = key_hash(key, klen);
	return o;
}

static void obj_link(struct master_core *c, struct master_obj *o)
{
	struct master_obj **pp = bucket_of(c, o->hash);
	o->hnext = *pp;
	*pp = o;
	c->nobjs++;
	c->key_bytes += o->klen;
	c->obj_bytes += obj_alloc_bytes(o);
	c->nttl += o->ttl_ms != 0;
	lru_push(obj_list(c, o), o);
	if (o->flags & MASTER_OBJ_PENDING)
		c->npending++;
	if (c->nobjs > c->nbuckets)
		grow(c);
}

/* Append a change of o's replica i to its segment's log. */
static void mirror(struct master_core *c, const struct master_obj *o, unsigned i,
		   enum master_ev_op op)
{
	struct master_seg *s = c->segs[o->rep[i].seg];
	struct master_ev e = {
		.seq = ++c->ev_seq,
		.offset = o->rep[i].offset,
		.size = o->size,
		.crc = o->crc,
		.klen = o->klen,
		.op = (uint8_t)op,
		.flags = (uint8_t)(((o->flags & MASTER_OBJ_CRC) ? MASTER_EV_F_CRC : 0) |
				   ((o->flags & MASTER_OBJ_SOFT_PIN) ? MASTER_EV_F_SOFT_PIN : 0)),
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

/* Room for n more quarantined ranges. Errors: -ENOMEM. */
static int quar_reserve(struct master_core *c, size_t n)
{
	if (c->nquar + n <= c->quar_cap)
		return 0;
	size_t cap = MC_MAX(c->quar_cap * 2, c->nquar + n + 16);
	struct quarantine *q = realloc(c->quar, cap * sizeof(*q));
	if (!q)
		return -ENOMEM;
	c->quar = q;
	c->quar_cap = cap;
	return 0;
}

/*
 * Unlink and free the object. Its space on every segment is freed — or,
 * with until_ms, held until then: a forced removal of a leased object,
 * whose readers may go on reading its bytes until their lease ends (a
 * zero-copy view, a get in flight, an agent's lease cache), never
 * another object's.
 */
static void obj_destroy_until(struct master_core *c, struct master_obj *o, uint64_t until_ms)
{
	if (until_ms && quar_reserve(c, o->nrep) != 0)
		until_ms = 0; /* (out of memory: freed at once, as before) */
	if (!(o->flags & MASTER_OBJ_PENDING))
		for (unsigned i = 0; i < o->nrep; i++)
			mirror(c, o, i, MASTER_EV_DEL);
	struct master_obj **pp = bucket_of(c, o->hash);
	while (*pp != o)
		pp = &(*pp)->hnext;
	*pp = o->hnext;
	lru_del(obj_list(c, o), o);
	if (o->flags & MASTER_OBJ_PENDING)
		c->npending--;
	uint64_t len = master__alloc_len(o->size);
	if (until_ms && len)
		c->n.quarantined++;
	for (unsigned i = 0; i < o->nrep; i++) {
		struct master_seg *s = c->segs[o->rep[i].seg];
		if (until_ms && len) {
			c->quar[c->nquar++] = (struct quarantine){
				.seg = o->rep[i].seg,
				.log_id = s->log_id,
				.off = o->rep[i].offset,
				.len = len,
				.until_ms = until_ms,
			};
		} else if (len && master__alloc_put(s->alloc, o->rep[i].offset, len) != 0) {
			/* Cannot happen unless the index is corrupt; the
			 * space stays allocated rather than be handed out
			 * twice. */
		}
		s->replicas--;
	}
	c->nobjs--;
	c->nttl -= o->ttl_ms != 0;
	c->key_bytes -= o->klen;
	c->obj_bytes -= obj_alloc_bytes(o);
	free(o);
}

static void obj_destroy(struct master_core *c, struct master_obj *o)
{
	obj_destroy_until(c, o, 0);
}

/* Free the quarantined ranges whose lease ended; a range of a segment
 * unmounted since is gone with it. */
static void quar_release(struct master_core *c, uint64_t now_ms)
{
	for (size_t i = 0; i < c->nquar;) {
		struct quarantine *q = &c->quar[i];
		if (q->until_ms > now_ms) {
			i++;
			continue;
		}
		struct master_seg *s = q->seg < c->nsegs_cap ? c->segs[q->seg] : NULL;
		if (s && s->log_id == q->log_id && master__alloc_put(s->alloc, q->off, q->len)) {
			/* corrupt index: keep the space */
		}
		*q = c->quar[--c->nquar];
	}
}

static bool leased(const struct master_obj *o, uint64_t now_ms)
{
	return !(o->flags & MASTER_OBJ_PENDING) && o->lease_or_start_ms > now_ms;
}

/* A removal's obj_destroy_until: until the lease ends, if any (never for
 * a PENDING object). */
static void obj_remove(struct master_core *c, struct master_obj *o, uint64_t now_ms)
{
	obj_destroy_until(c, o, leased(o, now_ms) ? o->lease_or_start_ms : 0);
}

static bool expired(const struct master_obj *o, uint64_t now_ms)
{
	return !(o->flags & MASTER_OBJ_PENDING) && o->ttl_ms && o->ttl_ms <= now_ms &&
	       !leased(o, now_ms);
}

/* The object under key, or NULL; a COMPLETE one whose TTL passed (and is
 * not leased) is removed on the way. */
static struct master_obj *lookup(struct master_core *c, const uint8_t *key,
				 size_t klen, uint64_t now_ms)
{
	struct master_obj *o = *find_slot(c, key, klen, key_hash(key, klen));
	if (o && expired(o, now_ms)) {
		c->n.ttl_expired++;
		obj_destroy(c, o);
		return NULL;
	}
	return o;
}

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
	c->seed = o->seed ? o->seed : 1;
	c->nbuckets = MIN_BUCKETS;
	c->buckets = calloc(c->nbuckets, sizeof(*c->buckets));
	if (!c->buckets) {
		free(c);
		return -ENOMEM;
	}
	*out = c;
	return 0;
}

static void seg_free(struct master_seg *s)
{
	master__alloc_free(s->lease);
	master__mlog_free(s->log);
	master__alloc_free(s->alloc);
	free(s->name);
	free(s);
}

void master__core_reset(struct master_core *c)
{
	for (size_t i = 0; i < c->nbuckets; i++) {
		struct master_obj *o = c->buckets[i];
		while (o) {
			struct master_obj *next = o->hnext;
			free(o);
			o = next;
		}
		c->buckets[i] = NULL;
	}
	memset(&c->plain, 0, sizeof(c->plain));
	memset(&c->pinned, 0, sizeof(c->pinned));
	memset(&c->pending, 0, sizeof(c->pending));
	c->nobjs = c->npending = c->key_bytes = c->obj_bytes = 0;
	for (uint32_t i = 0; i < c->nsegs_cap; i++) {
		if (c->segs[i])
			seg_free(c->segs[i]);
		c->segs[i] = NULL;
	}
	c->nsegs = 0;
	c->nquar = 0; /* (their segments are gone) */
	c->nrl = 0;
	while (c->agents) {
		struct master_agent *a = c->agents;
		c->agents = a->next;
		free(a->id);
		free(a);
	}
	c->nagents = 0;
}

void master__core_free(struct master_core *c)
{
	if (!c)
		return;
	master__core_reset(c);
	free(c->quar);
	free(c->rl);
	free(c->segs);
	free(c->buckets);
	free(c);
}

/* ------------------------------------------------------------ segments */

const struct master_seg *master__seg(const struct master_core *c, uint32_t id)
{
	return id < c->nsegs_cap ? c->segs[id] : NULL;
}

uint32_t master__seg_slots(const struct master_core *c)
{
	return c->nsegs_cap;
}

uint32_t master__seg_find(const struct master_core *c, const char *name)
{
	for (uint32_t i = 0; i < c->nsegs_cap; i++)
		if (c->segs[i] && strcmp(c->segs[i]->name, name) == 0)
			return i;
	return MASTER_NO_SEGMENT;
}

static struct master_agent *agent_find(const struct master_core *c,
				       const char *id)
{
	for (struct master_agent *a = c->agents; a; a = a->next)
		if (strcmp(a->id, id) == 0)
			return a;
	return NULL;
}

static void agent_del(struct master_core *c, struct master_agent *a)
{
	struct master_agent **pp = &c->agents;
	while (*pp != a)
		pp = &(*pp)->next;
	*pp = a->next;
	free(a->id);
	free(a);
	c->nagents--;
}

/* ------------------------------------------------------------ leases */

static uint64_t dram_capacity(const struct master_core *c, uint64_t *used);

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

/* Take back every leased range of s and begin a new epoch. */
static void lease_reset(struct master_core *c, struct master_seg *s)
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
	s->lease_epoch = ++c->lease_seq;
}

/* A segment's empty lease allocator: all of [0, size) allocated. */
static int lease_new(struct master_core *c, uint64_t size, struct master_alloc **out)
{
	int rc = master__alloc_new(size, c->seed++, out);
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
	struct master_seg *s = c->segs[*id];
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
	uint64_t used, cap = dram_capacity(c, &used);
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

uint64_t master__lease_release(struct master_core *c, const char *agent,
			       const char *segment, uint64_t epoch, uint64_t off,
			       uint64_t len)
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
		uint64_t a = MC_MAX(r.v[i][0], off), b = MC_MIN(r.v[i][0] + r.v[i][1], off + len);
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
static struct rlease *rlease_find(struct master_core *c, const char *agent, uint32_t id,
				  uint64_t epoch, uint64_t off, uint64_t len, uint64_t now_ms)
{
	for (size_t i = c->nrl; i-- > 0;) { /* newest first: they are in use */
		struct rlease *l = &c->rl[i];
		if (l->seg == id && l->epoch == epoch && l->until_ms > now_ms &&
		    off >= l->off && len <= l->len && off - l->off <= l->len - len &&
		    strcmp(l->agent, agent) == 0)
			return l;
	}
	return NULL;
}

/* Remote leases whose time is over (or whose segment was mounted again
 * or is gone: its space was taken back then) leave; what is left of them
 * goes back to the free space. */
static void rlease_expire(struct master_core *c, uint64_t now_ms)
{
	for (size_t i = 0; i < c->nrl;) {
		struct rlease *l = &c->rl[i];
		struct master_seg *s = l->seg < c->nsegs_cap ? c->segs[l->seg] : NULL;
		bool stale = !s || s->lease_epoch != l->epoch;
		if (!stale && l->until_ms > now_ms) {
			i++;
			continue;
		}
		if (!stale)
			c->n.lease_released_bytes += lease_take_back(s, l->off, l->len);
		*l = c->rl[--c->nrl];
	}
}

int master__rlease_grant(struct master_core *c, const char *agent, const char *segment,
			 uint64_t epoch, uint64_t want, uint64_t now_ms,
			 struct master_rlease_grant *g)
{
	memset(g, 0, sizeof(*g));
	uint32_t id = master__seg_find(c, segment ? segment : "");
	if (id == MASTER_NO_SEGMENT)
		return MC_ESEGMENT_NOT_FOUND;
	struct master_seg *s = c->segs[id];
	if (!agent || !agent[0] || strlen(agent) >= MASTER_AGENT_ID_MAX ||
	    strcmp(s->agent->id, agent) == 0)
		return -EINVAL;
	if (epoch && epoch != s->lease_epoch)
		return MC_EINVALID_REPLICA;
	g->epoch = s->lease_epoch;
	g->base = s->base;
	g->ttl_ms = c->o.put_timeout_ms;
	rlease_expire(c, now_ms);
	/* One holder at most a 32nd of the segment, all of them an eighth;
	 * never past the eviction watermark (a lease does not evict). */
	uint64_t held = 0;
	for (size_t i = 0; i < c->nrl; i++)
		if (c->rl[i].seg == id && strcmp(c->rl[i].agent, agent) == 0)
			held += c->rl[i].len - c->rl[i].committed;
	uint64_t mine = s->size / 32, all = s->size / 8;
	if (held >= mine || s->rleased >= all)
		return 0;
	if (c->nrl == c->rl_cap) {
		size_t cap = c->rl_cap ? c->rl_cap * 2 : 16;
		struct rlease *v = realloc(c->rl, cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		c->rl = v;
		c->rl_cap = cap;
	}
	int rc = lease_carve(c, s, MC_MIN(MC_MIN(want, mine - held), all - s->rleased),
			     &g->offset, &g->length);
	if (rc || !g->length)
		return rc;
	struct rlease *l = &c->rl[c->nrl++];
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

/* Drop every replica on segment id; objects left without one are
 * removed. Replicas elsewhere of the same objects stay. */
static void drop_segment_replicas(struct master_core *c, uint32_t id,
				  uint64_t *dropped, uint64_t *removed)
{
	uint64_t nd = 0, nr = 0;
	struct master_seg *s = c->segs[id];
	uint64_t len;
	for (size_t b = 0; b < c->nbuckets && s->replicas; b++) {
		struct master_obj *o = c->buckets[b];
		while (o) {
			struct master_obj *next = o->hnext;
			for (unsigned i = 0; i < o->nrep; i++) {
				if (o->rep[i].seg != id)
					continue;
				nd++;
				if (o->nrep == 1 || (o->flags & MASTER_OBJ_PENDING)) {
					/* A put in flight loses the whole put. */
					nr++;
					obj_destroy(c, o);
					break;
				}
				len = master__alloc_len(o->size);
				if (len && master__alloc_put(s->alloc, o->rep[i].offset, len)) {
					/* corrupt index: keep the space */
				}
				s->replicas--;
				/* Shift the later replicas and the key down. */
				uint8_t *p = (uint8_t *)&o->rep[i];
				size_t tail = (size_t)(o->nrep - i - 1) * sizeof(struct master_rep) +
					      o->klen;
				memmove(p, p + sizeof(struct master_rep), tail);
				o->nrep--;
				break;
			}
			o = next;
		}
	}
	if (dropped)
		*dropped = nd;
	if (removed)
		*removed = nr;
}

static void seg_remove(struct master_core *c, uint32_t id, uint64_t *dropped,
		       uint64_t *removed)
{
	struct master_seg *s = c->segs[id];
	drop_segment_replicas(c, id, dropped, removed);
	s->agent->nsegs--;
	c->segs[id] = NULL;
	c->nsegs--;
	seg_free(s);
}

int master__mount(struct master_core *c, const char *name, const char *agent,
		  enum master_tier tier, uint64_t base, uint64_t size,
		  bool resync, uint64_t now_ms, uint64_t *mirror_seq)
{
	if (!name || !*name || !agent || !*agent || size < MASTER_ALLOC_GRANULE ||
	    base > UINT64_MAX - size || (tier != MASTER_TIER_DRAM && tier != MASTER_TIER_SSD))
		return -EINVAL;
	uint32_t id = master__seg_find(c, name);
	struct master_agent *a = agent_find(c, agent);
	if (id != MASTER_NO_SEGMENT) {
		struct master_seg *s = c->segs[id];
		if (s->agent != a || s->tier != tier || s->base != base || s->size != size)
			return -EEXIST;
		a->last_heartbeat_ms = now_ms;
		if (!resync) {
			drop_segment_replicas(c, id, NULL, NULL);
			master__mlog_reset(s->log, c->ev_seq);
			s->log_id = ++c->ev_seq;
			s->syncing = false;
		} else {
			s->syncing = true;
		}
		lease_reset(c, s);
		if (mirror_seq) {
			struct master_mlog_stats ls;
			master__mlog_stats(s->log, &ls);
			*mirror_seq = ls.acked;
		}
		return 0;
	}
	bool new_agent = !a;
	if (new_agent) {
		a = calloc(1, sizeof(*a));
		if (!a || !(a->id = strdup(agent))) {
			free(a);
			return -ENOMEM;
		}
	}
	struct master_seg *s = calloc(1, sizeof(*s));
	int rc = -ENOMEM;
	if (!s || !(s->name = strdup(name)))
		goto err_seg;
	rc = master__alloc_new(size, c->seed++, &s->alloc);
	if (rc)
		goto err_seg;
	rc = master__mlog_new(c->o.mirror_log_bytes ? c->o.mirror_log_bytes
						    : DEFAULT_MIRROR_LOG_BYTES,
			      c->ev_seq, &s->log);
	if (rc)
		goto err_alloc;
	rc = lease_new(c, size, &s->lease);
	if (rc)
		goto err_log;
	if (c->nsegs == c->nsegs_cap) {
		uint32_t cap = c->nsegs_cap ? c->nsegs_cap * 2 : 8;
		struct master_seg **v = realloc(c->segs, cap * sizeof(*v));
		rc = -ENOMEM;
		if (!v)
			goto err_lease;
		memset(v + c->nsegs_cap, 0, (cap - c->nsegs_cap) * sizeof(*v));
		c->segs = v;
		c->nsegs_cap = cap;
	}
	for (id = 0; c->segs[id]; id++)
		;
	s->agent = a;
	s->tier = tier;
	s->base = base;
	s->size = size;
	s->syncing = resync;
	c->segs[id] = s;
	c->nsegs++;
	if (new_agent) {
		a->next = c->agents;
		c->agents = a;
		c->nagents++;
	}
	a->nsegs++;
	a->last_heartbeat_ms = now_ms;
	if (mirror_seq)
		*mirror_seq = c->ev_seq;
	s->log_id = ++c->ev_seq;
	s->lease_epoch = ++c->lease_seq;
	return 0;

err_lease:
	master__alloc_free(s->lease);
err_log:
	master__mlog_free(s->log);
err_alloc:
	master__alloc_free(s->alloc);
err_seg:
	if (s)
		free(s->name);
	free(s);
	if (new_agent && a) {
		free(a->id);
		free(a);
	}
	return rc;
}

int master__unmount(struct master_core *c, const char *name, const char *agent,
		    uint64_t *replicas_dropped, uint64_t *objects_removed)
{
	uint32_t id = master__seg_find(c, name ? name : "");
	if (id == MASTER_NO_SEGMENT)
		return MC_ESEGMENT_NOT_FOUND;
	struct master_agent *a = c->segs[id]->agent;
	if (!agent || strcmp(a->id, agent) != 0)
		return -EACCES;
	seg_remove(c, id, replicas_dropped, objects_removed);
	if (a->nsegs == 0)
		agent_del(c, a);
	return 0;
}

bool master__heartbeat(struct master_core *c, const char *agent, uint64_t now_ms)
{
	struct master_agent *a = agent_find(c, agent ? agent : "");
	if (!a)
		return false;
	a->last_heartbeat_ms = now_ms;
	return true;
}

void master__inventory_done(struct master_core *c, const char *agent)
{
	struct master_agent *a = agent_find(c, agent ? agent : "");
	for (uint32_t i = 0; a && i < c->nsegs_cap; i++)
		if (c->segs[i] && c->segs[i]->agent == a)
			c->segs[i]->syncing = false;
}

/* Give o one more replica (it is reallocated: fix every link to it). */
static struct master_obj *obj_add_replica(struct master_core *c,
					  struct master_obj *o, uint32_t seg,
					  uint64_t offset)
{
	struct lru *l = obj_list(c, o);
	struct master_obj **pp = bucket_of(c, o->hash);
	while (*pp != o)
		pp = &(*pp)->hnext;
	size_t old_bytes = obj_alloc_bytes(o);
	size_t klen = o->klen;
	struct master_obj *n = realloc(o, sizeof(*o) +
					       (o->nrep + 1u) * sizeof(struct master_rep) + klen);
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
	c->obj_bytes += obj_alloc_bytes(n) - old_bytes;
	return n;
}

int master__inventory_add(struct master_core *c, const char *agent,
			  const struct master_inv_item *it, uint64_t now_ms)
{
	const uint8_t *key = it->key;
	size_t klen = it->klen;
	uint64_t offset = it->offset, size = it->size;
	if (!key_ok(klen))
		return -EINVAL;
	uint32_t id = master__seg_find(c, it->segment ? it->segment : "");
	if (id == MASTER_NO_SEGMENT || !agent || strcmp(c->segs[id]->agent->id, agent))
		return MC_ESEGMENT_NOT_FOUND;
	struct master_seg *s = c->segs[id];
	uint64_t len = master__alloc_len(size);
	if (len && (offset > s->size || len > s->size - offset))
		return -EBUSY;
	struct master_obj *o = lookup(c, key, klen, now_ms);
	if (o) {
		bool crc_ok = !(o->flags & MASTER_OBJ_CRC) || !it->has_crc || o->crc == it->crc;
		if ((o->flags & MASTER_OBJ_PENDING) || o->size != size || !crc_ok)
			return MC_EOBJECT_ALREADY_EXISTS;
		for (unsigned i = 0; i < o->nrep; i++)
			if (o->rep[i].seg == id)
				/* The same replica again (a report sent twice)
				 * is accepted; another is a conflict. */
				return o->rep[i].offset == (len ? offset : 0)
					       ? 0
					       : MC_EOBJECT_ALREADY_EXISTS;
		if (o->nrep >= MASTER_MAX_REPLICAS)
			return MC_EOBJECT_ALREADY_EXISTS;
	}
	int rc = len ? master__alloc_reserve(s->alloc, offset, len) : 0;
	if (rc)
		return rc;
	if (o) {
		if (!(o = obj_add_replica(c, o, id, len ? offset : 0)))
			goto err_nomem;
		if (it->has_crc && !(o->flags & MASTER_OBJ_CRC)) {
			o->crc = it->crc;
			o->flags |= MASTER_OBJ_CRC;
		}
		s->replicas++;
		return 0;
	}
	o = obj_new(key, klen, 1);
	if (!o)
		goto err_nomem;
	o->size = size;
	o->rep[0].offset = len ? offset : 0;
	o->rep[0].seg = id;
	o->rep[0].state = MASTER_REP_COMPLETE;
	if (it->soft_pin)
		o->flags |= MASTER_OBJ_SOFT_PIN | MASTER_OBJ_LRU_PIN;
	if (it->has_crc) {
		o->crc = it->crc;
		o->flags |= MASTER_OBJ_CRC;
	}
	obj_link(c, o);
	s->replicas++;
	return 0;

err_nomem:
	if (len && master__alloc_put(s->alloc, offset, len)) {
		/* just reserved: cannot fail */
	}
	return -ENOMEM;
}

/* ------------------------------------------------------------ eviction */

static uint64_t dram_capacity(const struct master_core *c, uint64_t *used)
{
	uint64_t cap = 0, u = 0;
	for (uint32_t i = 0; i < c->nsegs_cap; i++) {
		const struct master_seg *s = c->segs[i];
		if (!s || s->tier != MASTER_TIER_DRAM)
			continue;
		uint64_t size = s->size & ~(uint64_t)(MASTER_ALLOC_GRANULE - 1);
		cap += size;
		u += size - master__alloc_free_bytes(s->alloc);
	}
	if (used)
		*used = u;
	return cap;
}

/* Evict the least recently used evictable object: plain list first, the
 * soft-pinned one only when the plain list has nothing evictable. Returns
 * the bytes freed, 0 when nothing can go. */
static uint64_t evict_one(struct master_core *c, uint64_t now_ms, bool pinned)
{
	struct lru *lists[2] = {&c->plain, &c->pinned};
	for (int k = 0; k < (pinned ? 2 : 1); k++) {
		for (struct master_obj *o = lists[k]->head; o; o = o->next) {
			if (leased(o, now_ms)) {
				c->n.lease_waits++;
				continue;
			}
			uint64_t freed = master__alloc_len(o->size) * o->nrep;
			c->n.evictions++;
			c->n.evicted_bytes += o->size;
			obj_destroy(c, o);
			/* Zero-byte objects free nothing but still go. */
			return freed ? freed : 1;
		}
	}
	return 0;
}

uint64_t master__evict_if_needed(struct master_core *c, uint64_t now_ms)
{
	uint64_t used, cap = dram_capacity(c, &used);
	if (cap == 0 || (double)used <= c->o.high_watermark * (double)cap)
		return 0;
	/* Unpinned objects up to the round's target; soft-pinned ones only
	 * as far as needed to get under the watermark. */
	uint64_t target = (uint64_t)(c->o.eviction_ratio * (double)cap);
	uint64_t limit = (uint64_t)(c->o.high_watermark * (double)cap);
	uint64_t freed = 0, f;
	c->n.eviction_rounds++;
	while (freed < target && (f = evict_one(c, now_ms, false)) != 0)
		freed += f;
	while (used - MC_MIN(used, freed) > limit && (f = evict_one(c, now_ms, true)) != 0)
		freed += f;
	return freed;
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

/* Try to allocate n replicas of len bytes on distinct usable segments.
 * Fills reps on success. Errors: MC_ENO_SPACE (nothing changed). */
static int place(struct master_core *c, uint64_t len, unsigned n,
		 uint32_t preferred, struct master_rep *reps)
{
	struct cand stack[64], *cands = stack;
	uint32_t nc = 0;
	if (c->nsegs > MC_ARRAY_LEN(stack)) {
		cands = malloc(c->nsegs * sizeof(*cands));
		if (!cands)
			return -ENOMEM;
	}
	for (uint32_t i = 0; i < c->nsegs_cap; i++) {
		const struct master_seg *s = c->segs[i];
		if (!s || s->tier != MASTER_TIER_DRAM || s->syncing)
			continue;
		cands[nc].id = i;
		/* The preferred segment sorts first. */
		cands[nc].free = i == preferred ? UINT64_MAX : master__alloc_free_bytes(s->alloc);
		nc++;
	}
	int rc = MC_ENO_SPACE;
	unsigned got = 0;
	if (nc >= n) {
		qsort(cands, nc, sizeof(*cands), cmp_cand);
		for (uint32_t i = 0; i < nc && got < n; i++) {
			uint64_t off = 0;
			if (len && master__alloc_get(c->segs[cands[i].id]->alloc, len, &off))
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
				if (master__alloc_put(c->segs[reps[i].seg]->alloc,
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
	for (uint32_t i = 0; i < c->nsegs_cap; i++) {
		const struct master_seg *s = c->segs[i];
		n += s && s->tier == MASTER_TIER_DRAM && !s->syncing &&
		     (s->size & ~(uint64_t)(MASTER_ALLOC_GRANULE - 1)) >= len;
	}
	return n;
}

int master__put_start(struct master_core *c, const struct master_put *p,
		      uint64_t now_ms, const struct master_obj **out)
{
	unsigned n = p->replica_num ? p->replica_num : 1;
	if (!key_ok(p->klen) || n > MASTER_MAX_REPLICAS)
		return -EINVAL;
	if (lookup(c, p->key, p->klen, now_ms))
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
	struct master_obj *o = obj_new(p->key, p->klen, n);
	if (!o) {
		for (unsigned i = 0; i < n && len; i++)
			if (master__alloc_put(c->segs[reps[i].seg]->alloc, reps[i].offset, len)) {
				/* just allocated: cannot fail */
			}
		return -ENOMEM;
	}
	memcpy(o->rep, reps, n * sizeof(*reps));
	for (unsigned i = 0; i < n; i++)
		c->segs[reps[i].seg]->replicas++;
	o->size = p->size;
	o->flags = MASTER_OBJ_PENDING | (p->soft_pin ? MASTER_OBJ_SOFT_PIN : 0);
	o->lease_or_start_ms = now_ms;
	o->ttl_ms = p->ttl_ms;
	obj_link(c, o);
	c->n.put_starts++;
	master__evict_if_needed(c, now_ms);
	*out = o;
	return 0;
}

int master__commit(struct master_core *c, const char *agent, const char *segment,
		   uint64_t epoch, const struct master_commit *it, uint64_t now_ms)
{
	uint32_t id;
	int err = 0;
	uint64_t len = master__alloc_len(it->size);
	uint64_t off = len ? it->offset : 0;
	struct master_seg *s = owned_seg(c, agent, segment, &id, &err);
	/* Another agent's segment: into space of a live remote lease of
	 * the caller's. */
	bool remote = !s && err == -EACCES;
	struct rlease *rl = NULL;
	if (remote) {
		s = c->segs[id];
		if (!len || !(rl = rlease_find(c, agent, id, epoch, off, len, now_ms))) {
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
			*rl = c->rl[--c->nrl]; /* used up: nothing left to take back */
	}
	struct master_obj *o = NULL;
	int rc = 0;
	if (!key_ok(it->klen))
		rc = -EINVAL;
	else if (lookup(c, it->key, it->klen, now_ms))
		rc = MC_EOBJECT_ALREADY_EXISTS;
	else if (!(o = obj_new(it->key, it->klen, 1)))
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
	obj_link(c, o);
	s->replicas++;
	mirror(c, o, 0, MASTER_EV_ADD);
	c->n.commits++;
	c->n.puts++;
	/* Leased space was counted as used already; committed, it is
	 * evictable again (when read leases allow). */
	master__evict_if_needed(c, now_ms);
	return 0;
}

static struct master_obj *pending_obj(struct master_core *c, const uint8_t *key,
				      size_t klen, uint64_t now_ms, int *err)
{
	if (!key_ok(klen)) {
		*err = -EINVAL;
		return NULL;
	}
	struct master_obj *o = lookup(c, key, klen, now_ms);
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
	lru_del(&c->pending, o);
	c->npending--;
	o->flags &= (uint8_t)~MASTER_OBJ_PENDING;
	if (o->flags & MASTER_OBJ_SOFT_PIN)
		o->flags |= MASTER_OBJ_LRU_PIN;
	for (unsigned i = 0; i < o->nrep; i++)
		o->rep[i].state = MASTER_REP_COMPLETE;
	o->lease_or_start_ms = 0;
	o->ttl_ms = o->ttl_ms ? now_ms + o->ttl_ms : 0;
	if (crc) {
		o->crc = *crc;
		o->flags |= MASTER_OBJ_CRC;
	}
	lru_push(obj_list(c, o), o);
	for (unsigned i = 0; i < o->nrep; i++)
		mirror(c, o, i, MASTER_EV_ADD);
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
	obj_destroy(c, o);
	c->n.put_revokes++;
	return 0;
}

/* ------------------------------------------------------------ gets */

int master__get(struct master_core *c, const uint8_t *key, size_t klen,
		uint64_t now_ms, const struct master_obj **out)
{
	if (!key_ok(klen))
		return -EINVAL;
	c->n.gets++;
	struct master_obj *o = lookup(c, key, klen, now_ms);
	if (!o || (o->flags & MASTER_OBJ_PENDING)) {
		c->n.misses++;
		return MC_EOBJECT_NOT_FOUND;
	}
	c->n.hits++;
	uint64_t until = now_ms + c->o.lease_ttl_ms;
	if (until > o->lease_or_start_ms)
		o->lease_or_start_ms = until;
	struct lru *l = obj_list(c, o);
	if (l->tail != o) {
		lru_del(l, o);
		lru_push(l, o);
	}
	*out = o;
	return 0;
}

int master__exist(struct master_core *c, const uint8_t *key, size_t klen,
		  uint64_t now_ms)
{
	if (!key_ok(klen))
		return -EINVAL;
	struct master_obj *o = lookup(c, key, klen, now_ms);
	return o && !(o->flags & MASTER_OBJ_PENDING);
}

const struct master_obj *master__find(const struct master_core *c,
				      const uint8_t *key, size_t klen)
{
	if (!key_ok(klen))
		return NULL;
	return *find_slot(c, key, klen, key_hash(key, klen));
}

int master__remove(struct master_core *c, const uint8_t *key, size_t klen,
		   bool force, uint64_t now_ms)
{
	if (!key_ok(klen))
		return -EINVAL;
	struct master_obj *o = lookup(c, key, klen, now_ms);
	if (!o || (o->flags & MASTER_OBJ_PENDING))
		return MC_EOBJECT_NOT_FOUND;
	if (!force && leased(o, now_ms)) {
		c->n.lease_waits++;
		return MC_EOBJECT_HAS_LEASE;
	}
	obj_remove(c, o, now_ms);
	c->n.removes++;
	return 0;
}

void master__remove_all(struct master_core *c, bool force, uint64_t now_ms,
			uint64_t *removed, uint64_t *skipped)
{
	uint64_t r = 0, s = 0;
	for (size_t b = 0; b < c->nbuckets; b++) {
		struct master_obj *o = c->buckets[b];
		while (o) {
			struct master_obj *next = o->hnext;
			if ((o->flags & MASTER_OBJ_PENDING) || (!force && leased(o, now_ms))) {
				s++;
			} else {
				obj_remove(c, o, now_ms);
				r++;
			}
			o = next;
		}
	}
	c->n.removes += r;
	*removed = r;
	*skipped = s;
}

/* ------------------------------------------------------------ timers */

void master__tick(struct master_core *c, uint64_t now_ms)
{
	quar_release(c, now_ms);
	rlease_expire(c, now_ms);
	/* PENDING puts, oldest first. */
	while (c->pending.head &&
	       c->pending.head->lease_or_start_ms + c->o.put_timeout_ms <= now_ms) {
		c->n.put_timeouts++;
		obj_destroy(c, c->pending.head);
	}
	/* Silent agents. */
	for (struct master_agent *a = c->agents, *next; a; a = next) {
		next = a->next;
		if (a->last_heartbeat_ms + c->o.agent_ttl_ms > now_ms)
			continue;
		for (uint32_t i = 0; i < c->nsegs_cap; i++)
			if (c->segs[i] && c->segs[i]->agent == a)
				seg_remove(c, i, NULL, NULL);
		agent_del(c, a);
		c->n.agents_expired++;
	}
	/* A slice of the index for TTL expiry (none without TTLs: the walk
	 * was 2-3% of an agent's loop under 4K puts, with the master in its
	 * process). */
	size_t end = c->nttl ? MC_MIN(c->sweep_pos + SWEEP_BUCKETS_PER_TICK, c->nbuckets)
			     : c->sweep_pos;
	for (size_t b = c->sweep_pos; b < end; b++) {
		struct master_obj *o = c->buckets[b];
		while (o) {
			struct master_obj *next = o->hnext;
			if (expired(o, now_ms)) {
				c->n.ttl_expired++;
				obj_destroy(c, o);
			}
			o = next;
		}
	}
	c->sweep_pos = end == c->nbuckets ? 0 : end;
	master__evict_if_needed(c, now_ms);
}

/* ------------------------------------------------------------ stats */

void master__core_stats(const struct master_core *c, struct master_core_stats *st)
{
	memset(st, 0, sizeof(*st));
	st->objects = c->nobjs;
	st->pending = c->npending;
	st->key_bytes = c->key_bytes;
	st->index_bytes = c->obj_bytes + c->nbuckets * sizeof(*c->buckets);
	st->segments = c->nsegs;
	st->agents = c->nagents;
	struct master_alloc_stats as;
	for (uint32_t i = 0; i < c->nsegs_cap; i++) {
		const struct master_seg *s = c->segs[i];
		if (!s)
			continue;
		master__alloc_stats(s->alloc, &as);
		if (s->tier == MASTER_TIER_DRAM) {
			st->dram_capacity += as.size;
			st->dram_used += as.used;
		} else {
			st->ssd_capacity += as.size;
			st->ssd_used += as.used;
		}
	}
}

const struct master_counters *master__core_counters(const struct master_core *c)
{
	return &c->n;
}

const struct master_agent *master__agents(const struct master_core *c)
{
	return c->agents;
}

void master__foreach(const struct master_core *c,
		     bool (*fn)(void *ud, const struct master_obj *o), void *ud)
{
	for (size_t b = 0; b < c->nbuckets; b++)
		for (const struct master_obj *o = c->buckets[b]; o; o = o->hnext)
			if (!fn(ud, o))
				return;
}

uint64_t master__ev_seq(const struct master_core *c)
{
	return c->ev_seq;
}

void master__ev_seq_floor(struct master_core *c, uint64_t floor)
{
	if (floor > c->ev_seq)
		c->ev_seq = floor;
	if (floor > c->lease_seq)
		c->lease_seq = floor;
}

bool master__list_segment(const struct master_core *c, uint32_t id, uint64_t *cursor,
			  size_t limit,
			  bool (*fn)(void *ud, const struct master_obj *o, unsigned i),
			  void *ud)
{
	size_t b = *cursor < c->nbuckets ? (size_t)*cursor : c->nbuckets;
	size_t end = MC_MIN(b + LIST_BUCKETS_PER_PAGE, c->nbuckets);
	size_t n = 0;
	bool more = true;
	/* Whole buckets only, so the cursor stays a bucket position. */
	for (; b < end && n < limit && more; b++)
		for (const struct master_obj *o = c->buckets[b]; o; o = o->hnext) {
			if (o->flags & MASTER_OBJ_PENDING)
				continue;
			for (unsigned i = 0; i < o->nrep; i++)
				if (o->rep[i].seg == id) {
					more &= fn(ud, o, i);
					n++;
				}
		}
	*cursor = b;
	return b >= c->nbuckets;
}
