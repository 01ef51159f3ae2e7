/*
 * inv: the agent's inventory — the objects it wrote into its own segment
 * (key, offset, size, soft pin), so that after a master failover it can
 * report them to the new leader (Heartbeat inventory) and complete
 * objects survive. Entries leave when the agent removes the object, when
 * a get through this agent finds it gone, and when a newer entry
 * overlaps their space (the space was reused, so their bytes are gone).
 * A chained hash table keyed by the object key; sequence numbers order
 * entries by age.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "agent/agent_int.h"
#include "common/util.h"

#define INITIAL_BUCKETS 1024u

int agent__inv_init(struct agent_inv *v)
{
	memset(v, 0, sizeof(*v));
	v->tab = calloc(INITIAL_BUCKETS, sizeof(*v->tab));
	if (!v->tab)
		return -ENOMEM;
	v->nbuckets = INITIAL_BUCKETS;
	return 0;
}

void agent__inv_clear(struct agent_inv *v)
{
	for (size_t i = 0; i < v->nbuckets; i++) {
		struct agent_inv_entry *e = v->tab[i];
		while (e) {
			struct agent_inv_entry *next = e->next;
			free(e);
			e = next;
		}
		v->tab[i] = NULL;
	}
	v->n = 0;
}

void agent__inv_free(struct agent_inv *v)
{
	if (!v->tab)
		return;
	agent__inv_clear(v);
	free(v->tab);
	v->tab = NULL;
}

static struct agent_inv_entry **find(struct agent_inv *v, const uint8_t *key,
				     size_t klen)
{
	size_t b = mc_hash64(key, klen) & (v->nbuckets - 1);
	struct agent_inv_entry **pp = &v->tab[b];
	while (*pp && ((*pp)->klen != klen || memcmp((*pp)->key, key, klen) != 0))
		pp = &(*pp)->next;
	return pp;
}

static void grow(struct agent_inv *v)
{
	size_t nb = v->nbuckets * 2;
	struct agent_inv_entry **t = calloc(nb, sizeof(*t));
	if (!t)
		return; /* longer chains; still correct */
	for (size_t i = 0; i < v->nbuckets; i++) {
		struct agent_inv_entry *e = v->tab[i];
		while (e) {
			struct agent_inv_entry *next = e->next;
			size_t b = mc_hash64(e->key, e->klen) & (nb - 1);
			e->next = t[b];
			t[b] = e;
			e = next;
		}
	}
	free(v->tab);
	v->tab = t;
	v->nbuckets = nb;
}

int agent__inv_add(struct agent_inv *v, const uint8_t *key, size_t klen,
		   uint64_t offset, uint64_t size, bool soft_pin)
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
	e->offset = offset;
	e->size = size;
	e->soft_pin = soft_pin;
	e->seq = ++v->seq;
	if (v->n > v->nbuckets)
		grow(v);
	return 0;
}

void agent__inv_del(struct agent_inv *v, const uint8_t *key, size_t klen)
{
	if (!v->tab || klen == 0)
		return;
	struct agent_inv_entry **pp = find(v, key, klen);
	struct agent_inv_entry *e = *pp;
	if (!e)
		return;
	*pp = e->next;
	free(e);
	v->n--;
}

static int by_offset(const void *x, const void *y)
{
	const struct agent_inv_entry *a = *(struct agent_inv_entry *const *)x;
	const struct agent_inv_entry *b = *(struct agent_inv_entry *const *)y;
	if (a->offset != b->offset)
		return a->offset < b->offset ? -1 : 1;
	return a->seq < b->seq ? -1 : a->seq > b->seq;
}

/* Does [a.offset, a.offset+a.size) meet [b.offset, ...)? Empty objects
 * take no space and never overlap. */
static bool overlap(const struct agent_inv_entry *a, const struct agent_inv_entry *b)
{
	if (a->size == 0 || b->size == 0)
		return false;
	return a->offset < b->offset + b->size && b->offset < a->offset + a->size;
}

int agent__inv_snapshot(struct agent_inv *v, struct agent_inv_entry ***out,
			size_t *n)
{
	struct agent_inv_entry **arr = malloc((v->n ? v->n : 1) * sizeof(*arr));
	if (!arr)
		return -ENOMEM;
	size_t k = 0;
	for (size_t i = 0; i < v->nbuckets; i++)
		for (struct agent_inv_entry *e = v->tab[i]; e; e = e->next)
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
			if (o->size == 0)
				continue;
			if (o->offset + o->size <= e->offset)
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
	*out = arr;
	*n = kept;
	return 0;
}
