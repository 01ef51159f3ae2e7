/*
 * log: the entries the core holds in memory — everything after the last
 * compaction point (prev_index). Persisting them is the driver's job; the
 * core tracks which ones were handed out (struct raft.stable).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "meta/raft/raft_int.h"

void raft__log_init(struct raft__log *l)
{
	memset(l, 0, sizeof(*l));
}

void raft__log_free(struct raft__log *l)
{
	for (size_t k = 0; k < l->n; k++)
		raft__data_unref(l->ents[k].data);
	free(l->ents);
	memset(l, 0, sizeof(*l));
}

uint64_t raft__log_last_index(const struct raft__log *l)
{
	return l->prev_index + l->n;
}

uint64_t raft__log_last_term(const struct raft__log *l)
{
	return l->n ? l->ents[l->n - 1].term : l->prev_term;
}

int raft__log_term(const struct raft__log *l, uint64_t index, uint64_t *term)
{
	if (index == l->prev_index) {
		*term = l->prev_term;
		return 0;
	}
	if (index == 0) {
		*term = 0;
		return 0;
	}
	if (index < l->prev_index || index > raft__log_last_index(l))
		return -ENOENT;
	*term = l->ents[index - l->prev_index - 1].term;
	return 0;
}

bool raft__log_match(const struct raft__log *l, uint64_t index, uint64_t term)
{
	uint64_t t;

	return raft__log_term(l, index, &t) == 0 && t == term;
}

const struct raft_entry *raft__log_get(const struct raft__log *l, uint64_t index)
{
	if (index <= l->prev_index || index > raft__log_last_index(l))
		return NULL;
	return &l->ents[index - l->prev_index - 1];
}

int raft__log_reserve(struct raft__log *l, size_t extra)
{
	size_t cap;
	struct raft_entry *e;

	if (l->n + extra <= l->cap)
		return 0;
	cap = l->cap ? l->cap : 16;
	while (cap < l->n + extra)
		cap *= 2;
	e = realloc(l->ents, cap * sizeof(*e));
	if (!e)
		return -ENOMEM;
	l->ents = e;
	l->cap = cap;
	return 0;
}

void raft__log_push(struct raft__log *l, const struct raft_entry *e)
{
	l->ents[l->n++] = *e;
}

void raft__log_truncate(struct raft__log *l, uint64_t from)
{
	size_t keep = (size_t)(from - l->prev_index - 1);

	while (l->n > keep)
		raft__data_unref(l->ents[--l->n].data);
}

void raft__log_compact(struct raft__log *l, uint64_t upto)
{
	size_t drop = (size_t)(upto - l->prev_index);

	l->prev_term = l->ents[drop - 1].term;
	l->prev_index = upto;
	for (size_t k = 0; k < drop; k++)
		raft__data_unref(l->ents[k].data);
	memmove(l->ents, l->ents + drop, (l->n - drop) * sizeof(*l->ents));
	l->n -= drop;
}

void raft__log_reset(struct raft__log *l, uint64_t index, uint64_t term)
{
	raft__log_truncate(l, l->prev_index + 1);
	l->prev_index = index;
	l->prev_term = term;
}
