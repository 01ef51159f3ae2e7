/*
 * segment: the master core's segments and agents (core_int.h), pure.
 *
 * A segment is a range of an agent's memory the master allocates in: it
 * has a slot (stable while mounted), an offset allocator, a mirror log of
 * changes for its owner and a lease allocator (lease.c). An agent exists
 * while it has a segment mounted and is heard from within --agent-ttl.
 *
 * A segment mounted again by its agent with the same geometry is either
 * a restarted agent (resync false: every replica there is dropped and its
 * log begins anew) or an agent re-reporting after a master failover
 * (resync true: its replicas stay, and the segment takes no placement
 * until the agent's inventory is done). Either way space leased before is
 * taken back and a new lease epoch begins.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/auth.h"
#include "common/util.h"
#include "master/core_int.h"

#define DEFAULT_MIRROR_LOG_BYTES (16u << 20)

void master__segs_init(struct master_segs *sg, uint64_t seed)
{
	memset(sg, 0, sizeof(*sg));
	sg->seed = seed ? seed : 1;
}

static void seg_free(struct master_seg *s)
{
	master__alloc_free(s->lease);
	master__mlog_free(s->log);
	master__alloc_free(s->alloc);
	free(s->name);
	free(s);
}

void master__segs_clear(struct master_segs *sg)
{
	for (uint32_t i = 0; i < sg->cap; i++) {
		if (sg->v[i])
			seg_free(sg->v[i]);
		sg->v[i] = NULL;
	}
	sg->n = 0;
	for (uint32_t i = 0; i < sg->ndead; i++)
		free(sg->dead[i].name);
	sg->ndead = 0;
	while (sg->agents) {
		struct master_agent *a = sg->agents;
		sg->agents = a->next;
		free(a->id);
		free(a);
	}
	sg->nagents = 0;
}

void master__segs_free(struct master_segs *sg)
{
	master__segs_clear(sg);
	free(sg->v);
	sg->v = NULL;
	free(sg->dead);
	sg->dead = NULL;
	sg->dead_cap = 0;
}

const struct master_seg *master__seg(const struct master_core *c, uint32_t id)
{
	return master__segs_at(&c->segs, id);
}

uint32_t master__seg_slots(const struct master_core *c)
{
	return c->segs.cap;
}

uint32_t master__seg_find(const struct master_core *c, const char *name)
{
	/* Every commit item and inventory entry names its segment: with 64
	 * agents a strcmp of each of their 128 names was about a microsecond
	 * an item, so names are told apart by their hash first. */
	const struct master_segs *sg = &c->segs;
	uint64_t h = mc_hash64(name, strlen(name));
	for (uint32_t i = 0; i < sg->cap; i++)
		if (sg->v[i] && sg->v[i]->name_hash == h && strcmp(sg->v[i]->name, name) == 0)
			return i;
	return MASTER_NO_SEGMENT;
}

const struct master_agent *master__agents(const struct master_core *c)
{
	return c->segs.agents;
}

static struct master_agent *agent_find(const struct master_segs *sg, const char *id)
{
	for (struct master_agent *a = sg->agents; a; a = a->next)
		if (strcmp(a->id, id) == 0)
			return a;
	return NULL;
}

static void agent_del(struct master_segs *sg, struct master_agent *a)
{
	struct master_agent **pp = &sg->agents;
	while (*pp != a)
		pp = &(*pp)->next;
	*pp = a->next;
	free(a->id);
	free(a);
	sg->nagents--;
}

static void seg_retire(struct master_core *c, uint32_t id);

/* Drop the agent and every segment it mounted (their replicas too). */
static void agent_remove(struct master_core *c, struct master_agent *a)
{
	struct master_segs *sg = &c->segs;
	for (uint32_t i = 0; i < sg->cap; i++)
		if (sg->v[i] && sg->v[i]->agent == a)
			seg_retire(c, i);
	agent_del(sg, a);
}

/* ------------------------------------------------------------ the reaper */

static struct master_dead *dead_find(const struct master_segs *sg, uint32_t id)
{
	for (uint32_t i = 0; i < sg->ndead; i++)
		if (sg->dead[i].id == id)
			return &sg->dead[i];
	return NULL;
}

/*
 * Segment id goes (core.h, the reaper): its slot empties at once and is
 * kept from mounts until the reaper's next walk has ended. Its space,
 * log and leases go with it: its replicas need neither their space
 * given back nor DEL events. (The record's room was made at its mount:
 * dead_reserve.)
 */
static void seg_retire(struct master_core *c, uint32_t id)
{
	struct master_segs *sg = &c->segs;
	struct master_seg *s = sg->v[id];
	sg->dead[sg->ndead++] = (struct master_dead){
		.id = id,
		/* (a walk already open may have passed some of its replicas) */
		.pass = c->reap_passes + 1,
		.name = s->name,
		.dropped = s->replicas,
	};
	s->agent->nsegs--;
	sg->v[id] = NULL;
	sg->n--;
	s->name = NULL; /* (the record's now) */
	seg_free(s);
}

/* Room for the record of every segment mounted and one more, so that a
 * segment's going needs no memory. Errors: -ENOMEM. */
static int dead_reserve(struct master_segs *sg)
{
	uint32_t want = sg->n + sg->ndead + 1;
	if (want <= sg->dead_cap)
		return 0;
	uint32_t cap = MC_MAX(want, sg->dead_cap * 2);
	struct master_dead *v = realloc(sg->dead, cap * sizeof(*v));
	if (!v)
		return -ENOMEM;
	sg->dead = v;
	sg->dead_cap = cap;
	return 0;
}

bool master__obj_prune(struct master_core *c, struct master_obj *o)
{
	struct master_segs *sg = &c->segs;
	if (!sg->ndead)
		return false;
	bool dropped = false;
	for (unsigned i = 0; i < o->nrep;) {
		if (sg->v[o->rep[i].seg]) {
			i++;
			continue;
		}
		if (o->nrep == 1 || (o->flags & MASTER_OBJ_PENDING)) {
			/* Its last one, or a put in flight: the whole object. */
			struct master_dead *d = dead_find(sg, o->rep[i].seg);
			d->removed += d != NULL;
			master__obj_destroy(c, o);
			return true;
		}
		master__rep_unlink(o, i);
		dropped = true;
	}
	if (dropped)
		master__obj_retier(c, o);
	return false;
}

bool master__reap_pending(const struct master_core *c)
{
	return c->segs.ndead > 0 || c->graves;
}

uint64_t master__reap_removed(const struct master_core *c, uint32_t slot)
{
	const struct master_dead *d = dead_find(&c->segs, slot);
	return d ? d->removed : 0;
}

bool master__reap_step(struct master_core *c, size_t budget,
		       void (*done)(void *ud, const struct master_reaped *r), void *ud)
{
	struct master_segs *sg = &c->segs;
	struct master_walk *w = &c->reap;
	if (c->graves) {
		/* A stepped-down leader's index first: no walk of the live
		 * one is open meanwhile. */
		struct master_grave *g = c->graves;
		if (master__index_free_step(&g->tab, &g->pos, budget)) {
			c->graves = g->next;
			free(g);
		}
		return !master__reap_pending(c);
	}
	if (!sg->ndead)
		return true;
	if (!w->open) {
		master__walk_begin(c, w);
		c->reap_passes++;
	}
	if (!master__scan_step(c, w, budget, NULL, NULL))
		return false;
	/* The slots that went before this walk began are free now. */
	for (uint32_t i = 0; i < sg->ndead;) {
		struct master_dead *d = &sg->dead[i];
		if (d->pass > c->reap_passes) {
			i++;
			continue;
		}
		struct master_reaped r = {d->id, d->name, d->dropped, d->removed};
		if (done)
			done(ud, &r);
		free(d->name);
		*d = sg->dead[--sg->ndead];
	}
	return sg->ndead == 0;
}

int master__mount(struct master_core *c, const char *name, const char *agent,
		  enum master_tier tier, uint64_t base, uint64_t size, bool resync,
		  uint64_t now_ms, uint64_t *mirror_seq)
{
	struct master_mount mt = {
		.name = name,
		.agent = agent,
		.tier = tier,
		.base = base,
		.size = size,
		.resync = resync,
	};
	return master__mount_seg(c, &mt, now_ms, mirror_seq);
}

/* One of the tokens mt names as its process's predecessors is a's. */
static bool was_instance(const struct master_agent *a, const struct master_mount *mt)
{
	if (!a->instance_len || a->instance_len != mt->instance_len)
		return false;
	bool found = false;
	for (size_t off = 0; off < mt->previous_len; off += mt->instance_len)
		found |= mc_ct_equal(mt->previous + off, a->instance, a->instance_len);
	return found;
}

/* The agent's process is the one mt names (once given, kept). */
static void set_instance(struct master_agent *a, const struct master_mount *mt)
{
	if (!mt->instance_len)
		return;
	memcpy(a->instance, mt->instance, mt->instance_len);
	a->instance_len = (uint8_t)mt->instance_len;
}

static bool ratio_ok(double r)
{
	return r == 0 || (r > 0 && r <= 1);
}

int master__mount_seg(struct master_core *c, const struct master_mount *mt, uint64_t now_ms,
		      uint64_t *mirror_seq)
{
	struct master_segs *sg = &c->segs;
	const char *name = mt->name, *agent = mt->agent;
	enum master_tier tier = mt->tier;
	uint64_t base = mt->base, size = mt->size;
	bool resync = mt->resync;
	uint64_t block = mt->block_bytes ? mt->block_bytes : MASTER_ALLOC_GRANULE;
	if (!name || !*name || !agent || !*agent || size < MASTER_ALLOC_GRANULE ||
	    base > UINT64_MAX - size ||
	    (tier != MASTER_TIER_DRAM && tier != MASTER_TIER_SSD) ||
	    block % MASTER_ALLOC_GRANULE || (block & (block - 1)) || size < block ||
	    (tier == MASTER_TIER_DRAM && block != MASTER_ALLOC_GRANULE) ||
	    !ratio_ok(mt->high_watermark) || !ratio_ok(mt->eviction_ratio) ||
	    mt->instance_len > MASTER_INSTANCE_MAX ||
	    (mt->previous_len && (!mt->instance_len || mt->previous_len % mt->instance_len ||
				  mt->previous_len / mt->instance_len > MASTER_PREVIOUS_MAX)))
		return -EINVAL;
	struct master_agent *a = agent_find(sg, agent);
	if (a && was_instance(a, mt)) {
		/* The process before this one on the agent's data dir, which
		 * only its holder reads: it has died (the dir's lock), and
		 * what it mounted goes now, as at its expiry. */
		agent_remove(c, a);
		c->n.agents_restarted++;
		a = NULL;
	}
	uint32_t id = master__seg_find(c, name);
	if (id != MASTER_NO_SEGMENT) {
		struct master_seg *s = sg->v[id];
		if (s->agent != a || s->tier != tier || s->base != base || s->size != size ||
		    s->block != block)
			return -EEXIST;
		a->last_heartbeat_ms = now_ms;
		s->high_watermark = mt->high_watermark ? mt->high_watermark
						       : c->o.high_watermark;
		s->eviction_ratio = mt->eviction_ratio ? mt->eviction_ratio
						       : c->o.eviction_ratio;
		if (resync) {
			s->syncing = true;
			master__lease_reset(c, s);
			if (mirror_seq) {
				struct master_mlog_stats ls;
				master__mlog_stats(s->log, &ls);
				*mirror_seq = ls.acked;
			}
			set_instance(a, mt);
			return 0;
		}
		/* A restarted agent: the segment goes with its replicas, and
		 * comes back empty in another slot. */
		seg_retire(c, id);
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
	s->name_hash = mc_hash64(name, strlen(name));
	rc = master__alloc_new(size, sg->seed++, &s->alloc);
	if (rc)
		goto err_seg;
	rc = master__mlog_new(c->o.mirror_log_bytes ? c->o.mirror_log_bytes
						    : DEFAULT_MIRROR_LOG_BYTES,
			      master__ev_seq(c), &s->log);
	if (rc)
		goto err_alloc;
	rc = master__lease_space_new(size, sg->seed++, &s->lease);
	if (rc)
		goto err_log;
	rc = dead_reserve(sg);
	if (rc)
		goto err_lease;
	if (sg->n + sg->ndead == sg->cap) {
		uint32_t cap = sg->cap ? sg->cap * 2 : 8;
		rc = MC_ENO_SPACE;
		if (cap > MASTER_SEG_SLOTS_MAX)
			goto err_lease;
		struct master_seg **v = realloc(sg->v, cap * sizeof(*v));
		rc = -ENOMEM;
		if (!v)
			goto err_lease;
		memset(v + sg->cap, 0, (cap - sg->cap) * sizeof(*v));
		sg->v = v;
		sg->cap = cap;
	}
	for (id = 0; sg->v[id] || dead_find(sg, id); id++)
		;
	s->agent = a;
	s->tier = tier;
	s->base = base;
	s->size = size;
	s->block = block;
	s->high_watermark = mt->high_watermark ? mt->high_watermark : c->o.high_watermark;
	s->eviction_ratio = mt->eviction_ratio ? mt->eviction_ratio : c->o.eviction_ratio;
	s->syncing = resync;
	sg->v[id] = s;
	sg->n++;
	if (new_agent) {
		a->next = sg->agents;
		sg->agents = a;
		sg->nagents++;
	}
	a->nsegs++;
	a->last_heartbeat_ms = now_ms;
	set_instance(a, mt);
	if (mirror_seq)
		*mirror_seq = master__ev_seq(c);
	s->log_id = master__ev_next(c);
	master__lease_reset(c, s);
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

int master__unmount(struct master_core *c, const char *name, const char *agent, uint32_t *slot,
		    uint64_t *replicas_dropped)
{
	uint32_t id = master__seg_find(c, name ? name : "");
	if (id == MASTER_NO_SEGMENT)
		return MC_ESEGMENT_NOT_FOUND;
	struct master_agent *a = c->segs.v[id]->agent;
	if (!agent || strcmp(a->id, agent) != 0)
		return -EACCES;
	if (slot)
		*slot = id;
	if (replicas_dropped)
		*replicas_dropped = c->segs.v[id]->replicas;
	seg_retire(c, id);
	if (a->nsegs == 0)
		agent_del(&c->segs, a);
	return 0;
}

bool master__heartbeat(struct master_core *c, const char *agent, uint64_t now_ms)
{
	struct master_agent *a = agent_find(&c->segs, agent ? agent : "");
	if (!a)
		return false;
	a->last_heartbeat_ms = now_ms;
	return true;
}

unsigned master__loop_held(struct master_core *c, uint64_t held_ms)
{
	unsigned n = 0;
	for (struct master_agent *a = c->segs.agents; a; a = a->next, n++)
		a->last_heartbeat_ms += held_ms;
	return n;
}

void master__agents_expire(struct master_core *c, uint64_t now_ms)
{
	struct master_segs *sg = &c->segs;
	for (struct master_agent *a = sg->agents, *next; a; a = next) {
		next = a->next;
		if (a->last_heartbeat_ms + c->o.agent_ttl_ms > now_ms)
			continue;
		agent_remove(c, a);
		c->n.agents_expired++;
	}
}

/* ------------------------------------------------------------ inventory */

void master__inventory_done(struct master_core *c, const char *agent)
{
	struct master_segs *sg = &c->segs;
	struct master_agent *a = agent_find(sg, agent ? agent : "");
	for (uint32_t i = 0; a && i < sg->cap; i++)
		if (sg->v[i] && sg->v[i]->agent == a)
			sg->v[i]->syncing = false;
}

int master__inventory_add(struct master_core *c, const char *agent,
			  const struct master_inv_item *it, uint64_t now_ms)
{
	const uint8_t *key = it->key;
	size_t klen = it->klen;
	uint64_t offset = it->offset, size = it->size;
	if (!master__key_ok(klen))
		return -EINVAL;
	uint32_t id = master__seg_find(c, it->segment ? it->segment : "");
	if (id == MASTER_NO_SEGMENT || !agent || strcmp(c->segs.v[id]->agent->id, agent))
		return MC_ESEGMENT_NOT_FOUND;
	struct master_seg *s = c->segs.v[id];
	uint64_t len = master__rep_len(s, size);
	if (len && (offset % s->block || offset > s->size || len > s->size - offset))
		return -EBUSY;
	struct master_obj *o = master__lookup(c, key, klen, now_ms);
	if (o) {
		bool crc_ok = !(o->flags & MASTER_OBJ_CRC) || !it->has_crc ||
			      o->crc == it->crc;
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
		if (!(o = master__index_add_replica(&c->ix, o, id, len ? offset : 0)))
			goto err_nomem;
		if (it->has_crc && !(o->flags & MASTER_OBJ_CRC)) {
			o->crc = it->crc;
			o->flags |= MASTER_OBJ_CRC;
		}
		s->replicas++;
		master__obj_retier(c, o);
		return 0;
	}
	o = master__obj_new(key, klen, 1);
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
	if (s->tier == MASTER_TIER_SSD)
		o->flags |= MASTER_OBJ_SSD;
	master__index_link(&c->ix, o);
	s->replicas++;
	return 0;

err_nomem:
	if (len && master__alloc_put(s->alloc, offset, len)) {
		/* just reserved: cannot fail */
	}
	return -ENOMEM;
}

/* ------------------------------------------------------------ capacity */

uint64_t master__dram_capacity(const struct master_core *c, uint64_t *used)
{
	const struct master_segs *sg = &c->segs;
	uint64_t cap = 0, u = 0;
	for (uint32_t i = 0; i < sg->cap; i++) {
		const struct master_seg *s = sg->v[i];
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

void master__segs_stats(const struct master_core *c, struct master_core_stats *st)
{
	const struct master_segs *sg = &c->segs;
	st->segments = sg->n;
	st->agents = sg->nagents;
	struct master_alloc_stats as;
	for (uint32_t i = 0; i < sg->cap; i++) {
		const struct master_seg *s = sg->v[i];
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
