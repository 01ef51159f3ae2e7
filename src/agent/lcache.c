/*
 * lcache: the agent's cache of read leases. GetReplicas grants the caller
 * a read lease (--default-kv-lease-ttl): until it ends the master neither
 * evicts the object, nor removes it unless forced, nor lets it be
 * replaced (upsert removes first, which the lease refuses). So for half
 * the lease, counted from when the call was sent (the grant came later),
 * the agent answers further gets of the same key from the replica it was
 * given without asking the master again: a hot key costs one master call
 * per half lease instead of one per get.
 *
 * A hit in the second half of a window renews the lease in the
 * background (one GetReplicas of the key, coalesced with the loop's other
 * gets): a key read all the time stays cached and its gets never wait on
 * the master; one read rarely expires as before.
 *
 * Entries leave when their window ends, when this agent removes or
 * upserts the key, when a read through them fails, and when a get finds
 * the key gone. The master's LRU position of a hot key is refreshed by
 * the next GetReplicas after the window (approximate LRU at that
 * granularity).
 *
 * Replicas on other agents' segments are cached too, for values of up to
 * --remote-lease-cache-size with a checksum: this agent does not hear of
 * a forced removal there, so a get of such an entry reads the bytes into
 * a scratch buffer first and uses them only if they match the checksum
 * (else it asks the master, and the entry goes). A value removed by force
 * may be served until the window ends, as any lease holder may read it
 * (the master holds its space until the lease ends: proto/master.proto,
 * RemoveRequest.force).
 *
 * Entries of replicas in this agent's own DRAM segment are also published
 * in the shared lease table (common/ltab.h, when the agent has one) for
 * the first half of their window, until a hit would renew them: the
 * node's clients answer those gets themselves. Whatever takes an entry
 * out takes it out of the shared table first.
 *
 * A chained hash table with a fixed capacity; when full, expired entries
 * are swept, then the table is emptied.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "agent/lcache.h"
#include "common/ltab.h"
#include "common/util.h"

#define BUCKETS 16384u

int agent__lcache_init(struct agent_lcache *lc, size_t capacity)
{
	memset(lc, 0, sizeof(*lc));
	lc->tab = calloc(BUCKETS, sizeof(*lc->tab));
	if (!lc->tab)
		return -ENOMEM;
	lc->nbuckets = BUCKETS;
	lc->capacity = capacity;
	return 0;
}

static void entry_free(struct agent_lcache *lc, struct agent_lentry *e)
{
	if (lc->shared && e->rep.local)
		mc_ltab_unpublish(lc->shared, e->key, e->klen);
	free(e->rep.segment);
	free(e);
}

void agent__lcache_clear(struct agent_lcache *lc)
{
	struct mc_ltab *shared = lc->shared;
	lc->shared = NULL; /* emptied at once below */
	for (size_t i = 0; i < lc->nbuckets; i++) {
		struct agent_lentry *e = lc->tab[i];
		while (e) {
			struct agent_lentry *next = e->next;
			entry_free(lc, e);
			e = next;
		}
		lc->tab[i] = NULL;
	}
	lc->n = 0;
	lc->shared = shared;
	if (shared)
		mc_ltab_clear(shared);
}

void agent__lcache_free(struct agent_lcache *lc)
{
	if (lc->tab)
		agent__lcache_clear(lc);
	free(lc->tab);
	lc->tab = NULL;
	lc->shared = NULL;
}

void agent__lcache_share(struct agent_lcache *lc, struct mc_ltab *t)
{
	lc->shared = t;
}

static struct agent_lentry **slot(struct agent_lcache *lc, const uint8_t *key, size_t klen)
{
	struct agent_lentry **pp = &lc->tab[mc_hash64(key, klen) & (lc->nbuckets - 1)];
	while (*pp && ((*pp)->klen != klen || memcmp((*pp)->key, key, klen) != 0))
		pp = &(*pp)->next;
	return pp;
}

const struct agent_lentry *agent__lcache_get(struct agent_lcache *lc, const uint8_t *key,
					     size_t klen, uint64_t now_ms, bool *renew)
{
	*renew = false;
	if (!lc->tab || lc->capacity == 0)
		return NULL;
	struct agent_lentry **pp = slot(lc, key, klen);
	struct agent_lentry *e = *pp;
	if (!e)
		return NULL;
	if (now_ms >= e->until_ms) {
		*pp = e->next;
		entry_free(lc, e);
		lc->n--;
		return NULL;
	}
	lc->hits++;
	if (now_ms >= e->refresh_ms && !e->refreshing) {
		e->refreshing = true;
		*renew = true;
	}
	return e;
}

/* The entry answers until until_ms; hits from the window's second half on
 * renew it. */
static void set_window(struct agent_lcache *lc, struct agent_lentry *e, uint64_t until_ms,
		       uint64_t now_ms)
{
	e->until_ms = until_ms;
	e->refresh_ms = now_ms + (until_ms - now_ms) / 2;
	e->refreshing = false;
	if (lc->shared && e->rep.local)
		mc_ltab_publish(lc->shared, e->key, e->klen, e->rep.offset, e->size,
				e->has_crc ? &e->crc : NULL, e->refresh_ms, now_ms);
}

const struct agent_lentry *agent__lcache_peek(struct agent_lcache *lc, const uint8_t *key,
					      size_t klen)
{
	return lc->tab && lc->n ? *slot(lc, key, klen) : NULL;
}

void agent__lcache_extend(struct agent_lcache *lc, const uint8_t *key, size_t klen,
			  uint64_t offset, uint64_t size, uint64_t until_ms, uint64_t now_ms)
{
	if (!lc->tab || lc->n == 0)
		return;
	struct agent_lentry *e = *slot(lc, key, klen);
	if (!e)
		return;
	if (e->rep.offset != offset || e->size != size || until_ms <= now_ms) {
		agent__lcache_del(lc, key, klen);
		return;
	}
	if (until_ms > e->until_ms)
		set_window(lc, e, until_ms, now_ms);
	else
		e->refreshing = false;
}

void agent__lcache_del(struct agent_lcache *lc, const uint8_t *key, size_t klen)
{
	if (!lc->tab || lc->n == 0)
		return;
	struct agent_lentry **pp = slot(lc, key, klen);
	struct agent_lentry *e = *pp;
	if (!e)
		return;
	*pp = e->next;
	entry_free(lc, e);
	lc->n--;
}

static void sweep(struct agent_lcache *lc, uint64_t now_ms)
{
	for (size_t i = 0; i < lc->nbuckets; i++) {
		struct agent_lentry **pp = &lc->tab[i];
		while (*pp) {
			struct agent_lentry *e = *pp;
			if (now_ms >= e->until_ms) {
				*pp = e->next;
				entry_free(lc, e);
				lc->n--;
			} else {
				pp = &e->next;
			}
		}
	}
}

void agent__lcache_put(struct agent_lcache *lc, const uint8_t *key, size_t klen, uint64_t size,
		       const uint32_t *crc, const struct agent_rep *rep, uint64_t until_ms,
		       uint64_t now_ms)
{
	if (!lc->tab || lc->capacity == 0 || until_ms <= now_ms)
		return;
	struct agent_lentry **pp = slot(lc, key, klen);
	struct agent_lentry *e = *pp;
	if (!e) {
		if (lc->n >= lc->capacity) {
			sweep(lc, now_ms);
			if (lc->n >= lc->capacity)
				agent__lcache_clear(lc);
			pp = slot(lc, key, klen);
		}
		e = calloc(1, sizeof(*e) + klen);
		if (!e)
			return;
		e->klen = (uint16_t)klen;
		memcpy(e->key, key, klen);
		*pp = e;
		lc->n++;
	}
	char *seg = rep->segment ? strdup(rep->segment) : NULL;
	if (rep->segment && !seg) {
		agent__lcache_del(lc, key, klen);
		return;
	}
	if (lc->shared && e->rep.local && !rep->local)
		mc_ltab_unpublish(lc->shared, key, klen);
	free(e->rep.segment);
	e->rep = *rep;
	e->rep.segment = seg;
	e->size = size;
	e->has_crc = crc != NULL;
	e->crc = crc ? *crc : 0;
	set_window(lc, e, until_ms, now_ms);
}
