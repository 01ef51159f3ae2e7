/*
 * op_common: the steps every operation shares — the end of a request
 * (release what it held, count it, free it), the client memory a region
 * names (staging, a buffer, an attached descriptor), items and the
 * replicas the master placed them on, copies between client memory and
 * this agent's segment, the master key blocks, and remote pieces started
 * from the loop thread. Below every op_*.c file; it calls the server
 * (replies, a session's memory), the memory maps, the copy threads, the
 * transfers and the statistics.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent/agent_int.h"
#include "agent/xfer.h"
#include "agent/req.h"
#include "agent/op.h"
#include "agent/server.h"
#include "common/crc32c.h"
#include "common/util.h"

void agent__op_finish(struct agent_req *r, int err)
{
	agent__op_done(&r->a->stats, r->op, err, r->start_ns);
	for (unsigned i = 0; i < r->nmaps; i++)
		agent__map_unref(r->maps[i]);
	free(r->maps);
	if (r->items) {
		for (size_t i = 0; i < r->n; i++) {
			for (unsigned k = 0; k < r->items[i].nrep; k++)
				free(r->items[i].reps[k].segment);
			free(r->items[i].reps);
			agent__tier_buf_free(r->a, r->items[i].scratch);
		}
		free(r->items);
	}
	agent__map_unref(r->spill);
	agent__inst_unref(r->inst);
	free(r->mstate);
	free(r->mstate2);
	agent__req_end(r);
}

void agent__op_fail(struct agent_req *r, int err, const char *why)
{
	agent__reply_error(r, err, why);
	agent__op_finish(r, err);
}

int agent__op_hold(struct agent_req *r, struct agent_map *m)
{
	for (unsigned i = 0; i < r->nmaps; i++)
		if (r->maps[i] == m)
			return 0;
	if (r->nmaps == r->maps_cap) {
		unsigned cap = r->maps_cap ? r->maps_cap * 2 : 4;
		struct agent_map **p = realloc(r->maps, cap * sizeof(*p));
		if (!p)
			return -ENOMEM;
		r->maps = p;
		r->maps_cap = cap;
	}
	agent__map_ref(m);
	r->maps[r->nmaps++] = m;
	return 0;
}

/* Whether p lies in m (NULL: none) and m is on huge pages. */
static bool huge_at(const struct agent_map *m, const uint8_t *p)
{
	return m && m->hugepages && p >= m->addr && p < m->addr + m->len;
}

bool agent__req_huge(const struct agent_req *r, const uint8_t *p)
{
	for (unsigned i = 0; i < r->nmaps; i++)
		if (huge_at(r->maps[i], p))
			return true;
	return huge_at(r->spill, p);
}

/* Map the i-th attached descriptor (once per request). */
static int attached(struct agent_req *r, unsigned i)
{
	if (r->att[i])
		return 0;
	if (i >= r->nfds || r->fds[i] < 0)
		return -EBADF;
	off_t size = lseek(r->fds[i], 0, SEEK_END);
	if (size <= 0)
		return size == 0 ? -EINVAL : -EBADF;
	struct agent_map *m;
	uint8_t *base;
	int rc = agent__map_client_fd(r->a, r->fds[i], agent__session_uid(r->c), 0,
				      (uint64_t)size, &m, &base);
	if (rc)
		return rc;
	r->fds[i] = -1; /* the map owns it */
	r->att[i] = m;
	r->att_base[i] = base;
	r->att_len[i] = (uint64_t)size;
	rc = agent__op_hold(r, m);
	agent__map_unref(m); /* the request's hold keeps it */
	return rc;
}

int agent__op_region(struct agent_req *r, const Mooncake__Client__Region *g, uint8_t **ptr)
{
	struct agent_conn *c = r->c;
	uint8_t *base;
	uint64_t blen;
	struct agent_map *m;
	switch (g->where) {
	case MOONCAKE__CLIENT__REGION__WHERE__STAGING:
		m = agent__session_staging(c, &base, &blen);
		break;
	case MOONCAKE__CLIENT__REGION__WHERE__BUFFER: {
		const struct agent_buf *b = agent__session_buf(c, g->buffer);
		if (!b)
			return -ENOENT;
		if (!b->base)
			return -EINVAL; /* process memory: peers' to reach, not ours */
		m = b->map;
		base = b->base;
		blen = b->len;
		break;
	}
	case MOONCAKE__CLIENT__REGION__WHERE__ATTACHED: {
		int rc = attached(r, g->fd_index);
		if (rc)
			return rc;
		m = r->att[g->fd_index];
		base = r->att_base[g->fd_index];
		blen = r->att_len[g->fd_index];
		break;
	}
	default:
		return -EINVAL;
	}
	if (!m)
		return -ENOENT;
	if (g->offset > blen || g->length > blen - g->offset)
		return -ERANGE;
	int rc = agent__op_hold(r, m);
	if (rc)
		return rc;
	*ptr = base + g->offset;
	return 0;
}

int agent__op_device(struct agent_req *r, const Mooncake__Client__Region *g, uint8_t **iova)
{
	const struct agent_buf *b = g->where == MOONCAKE__CLIENT__REGION__WHERE__BUFFER
					    ? agent__session_buf(r->c, g->buffer)
					    : NULL;
	if (!b || !b->map->device)
		return -ENOENT;
	if (g->offset > b->len || g->length > b->len - g->offset)
		return -ERANGE;
	int rc = agent__op_hold(r, b->map);
	if (rc)
		return rc;
	*iova = (uint8_t *)(uintptr_t)(b->address + g->offset);
	return 0;
}

struct te_engine *agent__op_te(struct agent_req *r)
{
	struct agent_inst *i = agent__session_inst(r->c);
	if (!i)
		return r->a->te;
	if (!r->inst) {
		agent__inst_ref(i);
		r->inst = i;
	}
	return agent__inst_te(r->inst);
}

int agent__op_items(struct agent_req *r, size_t n)
{
	r->items = mc_zalloc(n, sizeof(*r->items));
	if (!r->items)
		return -ENOMEM;
	r->n = n;
	return 0;
}

int agent__op_replicas(struct agent *a, struct agent_item *it,
		       Mooncake__Master__Replica *const *reps, size_t n)
{
	if (n > AGENT_MAX_REPLICAS)
		n = AGENT_MAX_REPLICAS;
	it->reps = mc_zalloc(n ? n : 1, sizeof(*it->reps));
	if (!it->reps)
		return -ENOMEM;
	for (size_t k = 0; k < n; k++) {
		struct agent_rep *p = &it->reps[k];
		p->ssd = reps[k]->tier == MOONCAKE__MASTER__TIER__TIER_SSD;
		const char *name = p->ssd ? reps[k]->agent_id : reps[k]->segment;
		p->segment = strdup(name ? name : "");
		if (!p->segment)
			return -ENOMEM;
		p->local = !p->ssd && strcmp(p->segment, a->name) == 0;
		p->offset = reps[k]->offset;
		p->address = reps[k]->address;
		it->nrep++;
	}
	return 0;
}

int agent__op_local_io(struct agent *a, const struct agent_rep *p, uint8_t *mem, uint64_t len,
		       bool write, uint32_t *crc, struct agent_pool *help)
{
	if (crc)
		*crc = 0;
	if (len == 0)
		return 0;
	if (p->offset > a->seg->len || len > a->seg->len - p->offset)
		return MC_EINVALID_REPLICA;
	uint8_t *s = a->seg->addr + p->offset;
	uint8_t *dst = write ? s : mem;
	const uint8_t *src = write ? mem : s;
	if (crc)
		*crc = crc32c_copy(0, dst, src, len);
	else if (help)
		agent__pool_copy(help, dst, src, len);
	else
		memcpy(dst, src, len);
	return 0;
}

struct agent_keys_block *agent__op_keys_block(struct agent_req *r,
					      bool (*want)(const struct agent_item *))
{
	size_t n = 0;
	for (size_t i = 0; i < r->n; i++)
		n += want(&r->items[i]);
	struct agent_keys_block *b = malloc(sizeof(*b) + n * sizeof(b->keys[0]) +
					    n * sizeof(size_t) + n * sizeof(uint32_t));
	if (!b)
		return NULL;
	mooncake__master__batch_keys_request__init(&b->req);
	b->idx = (size_t *)&b->keys[n];
	b->crcs = (uint32_t *)&b->idx[n];
	size_t k = 0;
	for (size_t i = 0; i < r->n; i++) {
		if (!want(&r->items[i]))
			continue;
		b->keys[k].data = (uint8_t *)r->items[i].key;
		b->keys[k].len = r->items[i].klen;
		b->crcs[k] = r->items[i].crc;
		b->idx[k] = i;
		k++;
	}
	b->req.keys = b->keys;
	b->req.n_keys = n;
	mooncake__master__batch_remove_request__init(&b->rm);
	b->rm.keys = b->keys;
	b->rm.n_keys = n;
	return b;
}

bool agent__op_item_ok(const struct agent_item *it)
{
	return it->err == 0;
}

void agent__op_set_mstate(struct agent_req *r, void *p)
{
	free(r->mstate);
	r->mstate = p;
}

bool agent__op_start_from_loop(struct agent_req *r, struct agent_xfer *x,
			       void (*copy_local)(struct agent_req *r),
			       void (*done)(struct agent_job *j))
{
	if (agent__xfer_missed(x)) {
		agent__xfer_finish(r->a, x);
		return false;
	}
	r->xfer = x;
	r->job.done = done;
	bool over = agent__xfer_start_loop(r->a, x, &r->job);
	copy_local(r);
	if (over)
		agent__pool_done_now(&r->a->pool, &r->job);
	return true;
}

struct agent_req *agent__op_end_from_loop(struct agent_job *j)
{
	struct agent_req *r = MC_CONTAINER_OF(j, struct agent_req, job);
	agent__xfer_finish(r->a, r->xfer); /* (complete: returns at once) */
	r->xfer = NULL;
	return r;
}
