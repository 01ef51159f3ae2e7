/*
 * inv: the agent's inventory — its mirror of the master's index for its
 * own segment: every COMPLETE object there (key, offset, size, checksum,
 * soft pin), whoever wrote it, so that after a master failover it can
 * report them to the new leader (Heartbeat inventory) and complete
 * objects survive. mirror.c keeps it equal to the master's log of the
 * segment's changes; the agent's own puts and removes update it at once
 * too. When a snapshot for a re-sync finds two entries over the same
 * space, only the newer is kept (the space was reused, so the older
 * one's bytes are gone). A chained hash table keyed by the object key
 * (common/lhash.h: it grows a bucket or two a put, so no put rehashes it);
 * sequence numbers order changes by age, epochs mark what a listing of
 * the segment saw. Pure.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "agent/inv.h"
#include "agent/req.h"
#include "common/util.h"

#define INITIAL_BUCKETS 1024u

int agent__inv_init(struct agent_inv *v)
{
	memset(v, 0, sizeof(*v));
	return mc_lhash_init(&v->tab, INITIAL_BUCKETS);
}

size_t agent__inv_count(const struct agent_inv *v)
{
	return v->n;
}

void agent__inv_clear(struct agent_inv *v)
{
	for (size_t i = 0; i < mc_lhash_n(&v->tab); i++) {
		struct agent_inv_entry *e = v->tab.b[i];
		while (e) {
			struct agent_inv_entry *next = e->next;
			free(e);
			e = next;
		}
		v->tab.b[i] = NULL;
	}
	v->n = 0;
}

void agent__inv_free(struct agent_inv *v)
{
	if (!v->tab.b)
		return;
	agent__inv_clear(v);
	mc_lhash_free(&v->tab);
}

static struct agent_inv_entry **find(struct agent_inv *v, const uint8_t *key, size_t klen)
{
	struct agent_inv_entry **pp = (struct agent_inv_entry **)mc_lhash_bucket(
		&v->tab, mc_hash64(key, klen));
	while (*pp && ((*pp)->klen != klen || memcmp((*pp)->key, key, klen) != 0))
		pp = &(*pp)->next;
	return pp;
}

static void **entry_link(void *e)
{
	return (void **)&((struct agent_inv_entry *)e)->next;
}

static uint64_t entry_hash(const void *e)
{
	const struct agent_inv_entry *x = e;
	return mc_hash64(x->key, x->klen);
}

static const struct mc_lhash_ops entry_ops = {entry_link, entry_hash};

int agent__inv_add(struct agent_inv *v, const uint8_t *key, size_t klen,
		   const struct agent_inv_rec *rec)
{
	if (klen == 0 || klen > AGENT_MAX_KEY_BYTES)
		return -EINVAL;
	struct agent_inv_entry **pp = find(v, key, klen);
	struct agent_inv_entry *e = *pp;
	if (!e) {
		e = malloc(sizeof(*e) + klen);
		if (!e)
			return -ENOMEM;
		e->klen = (uint16_t)klen;
		memcpy(e->key, key, klen);
		e->next = NULL;
		*pp = e;
		v->n++;
	}
	e->rec = *rec;
	e->seq = ++v->seq;
	e->epoch = v->epoch;
	mc_lhash_added(&v->tab, v->n, &entry_ops);
	return 0;
}

void agent__inv_del(struct agent_inv *v, const uint8_t *key, size_t klen)
{
	if (!v->tab.b || klen == 0)
		return;
	struct agent_inv_entry **pp = find(v, key, klen);
	struct agent_inv_entry *e = *pp;
	if (!e)
		return;
	*pp = e->next;
	free(e);
	v->n--;
}

bool agent__inv_del_at(struct agent_inv *v, const uint8_t *key, size_t klen, uint64_t offset)
{
	if (!v->tab.b || klen == 0)
		return false;
	struct agent_inv_entry **pp = find(v, key, klen);
	struct agent_inv_entry *e = *pp;
	if (!e || e->rec.offset != offset)
		return false;
	*pp = e->next;
	free(e);
	v->n--;
	return true;
}

void agent__inv_listing_start(struct agent_inv *v)
{
	v->epoch++;
}

size_t agent__inv_listing_end(struct agent_inv *v)
{
	size_t gone = 0;
	for (size_t i = 0; i < mc_lhash_n(&v->tab); i++) {
		struct agent_inv_entry **pp = (struct agent_inv_entry **)&v->tab.b[i];
		while (*pp) {
			struct agent_inv_entry *e = *pp;
			if (e->epoch == v->epoch) {
				pp = &e->next;
				continue;
			}
			*pp = e->next;
			free(e);
			v->n--;
			gone++;
		}
	}
	return gone;
}

static int by_offset(const void *x, const void *y)
{
	const struct agent_inv_entry *a = *(struct agent_inv_entry *const *)x;
	const struct agent_inv_entry *b = *(struct agent_inv_entry *const *)y;
	if (a->rec.offset != b->rec.offset)
		return a->rec.offset < b->rec.offset ? -1 : 1;
	return a->seq < b->seq ? -1 : a->seq > b->seq;
}

/* Does [a.offset, a.offset+a.size) meet [b.offset, ...)? Empty objects
 * take no space and never overlap. */
static bool overlap(const struct agent_inv_entry *a, const struct agent_inv_entry *b)
{
	const struct agent_inv_rec *x = &a->rec, *y = &b->rec;
	if (x->size == 0 || y->size == 0)
		return false;
	return x->offset < y->offset + y->size && y->offset < x->offset + x->size;
}

int agent__inv_snapshot(struct agent_inv *v, struct agent_inv_entry ***out, size_t *n)
{
	struct agent_inv_entry **arr = malloc((v->n ? v->n : 1) * sizeof(*arr));
	if (!arr)
		return -ENOMEM;
	size_t k = 0;
	for (size_t i = 0; i < mc_lhash_n(&v->tab); i++)
		for (struct agent_inv_entry *e = v->tab.b[i]; e; e = e->next)
			arr[k++] = e;
	qsort(arr, k, sizeof(*arr), by_offset);
	/* Sweep in offset order. Kept entries are disjoint and sorted, so
	 * their ends increase: only the last few can overlap the next one. */
	size_t kept = 0;
	struct agent_inv_entry **drop = malloc((k ? k : 1) * sizeof(*drop));
	if (!drop) {
		free(arr);
		return -ENOMEM;
	}
	size_t ndrop = 0;
	for (size_t i = 0; i < k; i++) {
		struct agent_inv_entry *e = arr[i];
		bool dead = false;
		for (size_t j = kept; j-- > 0;) {
			struct agent_inv_entry *o = arr[j];
			if (o->rec.size == 0)
				continue;
			if (o->rec.offset + o->rec.size <= e->rec.offset)
				break;
			if (!overlap(o, e))
				continue;
			if (o->seq > e->seq) {
				dead = true;
				break;
			}
			/* The kept one is older: it goes. */
			drop[ndrop++] = o;
			memmove(&arr[j], &arr[j + 1], (kept - j - 1) * sizeof(*arr));
			kept--;
		}
		if (dead)
			drop[ndrop++] = e;
		else
			arr[kept++] = e;
	}
	for (size_t i = 0; i < ndrop; i++)
		agent__inv_del(v, drop[i]->key, drop[i]->klen);
	free(drop);
	/* Copies: the table changes while the report goes out. */
	for (size_t i = 0; i < kept; i++) {
		size_t sz = sizeof(*arr[i]) + arr[i]->klen;
		struct agent_inv_entry *c = malloc(sz);
		if (!c) {
			while (i-- > 0)
				free(arr[i]);
			free(arr);
			return -ENOMEM;
		}
		memcpy(c, arr[i], sz);
		c->next = NULL;
		arr[i] = c;
	}
	*out = arr;
	*n = kept;
	return 0;
}
