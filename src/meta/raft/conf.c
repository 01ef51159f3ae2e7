/*
 * conf: membership sets (sorted id arrays) and the conf change entry
 * encoding: byte 0 version (1), byte 1 type, bytes 2..9 node id little
 * endian, then the context bytes.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "meta/raft/raft_int.h"

#define CC_VERSION 1
#define CC_HEADER 10

void raft__conf_init(struct raft__conf *c)
{
	memset(c, 0, sizeof(*c));
}

void raft__conf_free(struct raft__conf *c)
{
	free(c->voters);
	free(c->learners);
	memset(c, 0, sizeof(*c));
}

static int dup_ids(const uint64_t *src, size_t n, uint64_t **out)
{
	*out = NULL;
	if (n == 0)
		return 0;
	*out = malloc(n * sizeof(uint64_t));
	if (!*out)
		return -ENOMEM;
	memcpy(*out, src, n * sizeof(uint64_t));
	return 0;
}

static int cmp_id(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

int raft__conf_from_state(struct raft__conf *dst, const struct raft_conf_state *s)
{
	uint64_t *v, *l;

	if (dup_ids(s->voters, s->n_voters, &v))
		return -ENOMEM;
	if (dup_ids(s->learners, s->n_learners, &l)) {
		free(v);
		return -ENOMEM;
	}
	if (v)
		qsort(v, s->n_voters, sizeof(*v), cmp_id);
	if (l)
		qsort(l, s->n_learners, sizeof(*l), cmp_id);
	raft__conf_free(dst);
	dst->voters = v;
	dst->n_voters = s->n_voters;
	dst->learners = l;
	dst->n_learners = s->n_learners;
	return 0;
}

int raft__conf_copy(struct raft__conf *dst, const struct raft__conf *src)
{
	struct raft_conf_state s = raft__conf_view(src);

	return raft__conf_from_state(dst, &s);
}

struct raft_conf_state raft__conf_view(const struct raft__conf *c)
{
	struct raft_conf_state s = {
		.voters = c->voters,
		.n_voters = c->n_voters,
		.learners = c->learners,
		.n_learners = c->n_learners,
	};
	return s;
}

static bool has(const uint64_t *ids, size_t n, uint64_t id)
{
	for (size_t k = 0; k < n; k++)
		if (ids[k] == id)
			return true;
	return false;
}

bool raft__conf_is_voter(const struct raft__conf *c, uint64_t id)
{
	return has(c->voters, c->n_voters, id);
}

bool raft__conf_is_learner(const struct raft__conf *c, uint64_t id)
{
	return has(c->learners, c->n_learners, id);
}

int raft__conf_check(const struct raft__conf *c, const struct raft_conf_change *cc)
{
	bool voter = raft__conf_is_voter(c, cc->node_id);
	bool learner = raft__conf_is_learner(c, cc->node_id);

	if (cc->node_id == RAFT_NONE)
		return -EINVAL;
	switch (cc->type) {
	case RAFT_CC_ADD_VOTER:
	case RAFT_CC_ADD_LEARNER:
		return voter || learner ? -EEXIST : 0;
	case RAFT_CC_PROMOTE:
		return learner ? 0 : -ENOENT;
	case RAFT_CC_REMOVE:
		if (!voter && !learner)
			return -ENOENT;
		if (voter && c->n_voters == 1)
			return -EINVAL;
		return 0;
	}
	return -EINVAL;
}

/* Insert id into a sorted array of n (realloc'ed). */
static int insert(uint64_t **ids, size_t *n, uint64_t id)
{
	uint64_t *a = realloc(*ids, (*n + 1) * sizeof(uint64_t));
	size_t k;

	if (!a)
		return -ENOMEM;
	for (k = *n; k > 0 && a[k - 1] > id; k--)
		a[k] = a[k - 1];
	a[k] = id;
	*ids = a;
	(*n)++;
	return 0;
}

static void erase(uint64_t *ids, size_t *n, uint64_t id)
{
	size_t k = 0;

	while (k < *n && ids[k] != id)
		k++;
	if (k == *n)
		return;
	memmove(ids + k, ids + k + 1, (*n - k - 1) * sizeof(uint64_t));
	(*n)--;
}

int raft__conf_apply(struct raft__conf *c, const struct raft_conf_change *cc)
{
	if (raft__conf_check(c, cc) != 0)
		return 0;
	switch (cc->type) {
	case RAFT_CC_ADD_VOTER:
		return insert(&c->voters, &c->n_voters, cc->node_id);
	case RAFT_CC_ADD_LEARNER:
		return insert(&c->learners, &c->n_learners, cc->node_id);
	case RAFT_CC_PROMOTE:
		if (insert(&c->voters, &c->n_voters, cc->node_id))
			return -ENOMEM;
		erase(c->learners, &c->n_learners, cc->node_id);
		return 0;
	case RAFT_CC_REMOVE:
		erase(c->voters, &c->n_voters, cc->node_id);
		erase(c->learners, &c->n_learners, cc->node_id);
		return 0;
	}
	return 0;
}

size_t raft_conf_change_size(const struct raft_conf_change *cc)
{
	return CC_HEADER + cc->context_len;
}

size_t raft_conf_change_encode(const struct raft_conf_change *cc, void *buf)
{
	unsigned char *p = buf;

	p[0] = CC_VERSION;
	p[1] = (unsigned char)cc->type;
	for (int k = 0; k < 8; k++)
		p[2 + k] = (unsigned char)(cc->node_id >> (8 * k));
	if (cc->context_len)
		memcpy(p + CC_HEADER, cc->context, cc->context_len);
	return CC_HEADER + cc->context_len;
}

int raft_conf_change_decode(const void *data, size_t len, struct raft_conf_change *out)
{
	const unsigned char *p = data;

	if (len < CC_HEADER || p[0] != CC_VERSION || p[1] < RAFT_CC_ADD_VOTER ||
	    p[1] > RAFT_CC_REMOVE)
		return -EINVAL;
	out->type = (enum raft_conf_change_type)p[1];
	out->node_id = 0;
	for (int k = 0; k < 8; k++)
		out->node_id |= (uint64_t)p[2 + k] << (8 * k);
	out->context = len > CC_HEADER ? p + CC_HEADER : NULL;
	out->context_len = len - CC_HEADER;
	return 0;
}
