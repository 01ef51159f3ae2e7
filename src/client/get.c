/*
 * Gets and views. Each value lands in its destination (in place when
 * the agent maps it, else through a staging block), or, without one, in a
 * spill buffer, a part of the staging memfd, or a memfd the agent makes
 * for the reply; a view of a local object maps the agent's segment
 * read-only. A get of a local object the agent holds a read lease on is
 * answered here, from the shared lease table, without a request
 * (table_get).
 */
#include "client/client_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/crc32c.h"
#include "common/ltab.h"
#include "common/util.h"

/* ------------------------------------------------------------ get */

struct get_item {
	const void *key;
	size_t klen;
	void *buf; /* destination, or NULL: allocate */
	size_t cap;
	const struct mc_part *parts; /* or scatter over these (nparts > 1) */
	size_t nparts;
	bool zero_copy;
	/* out */
	int err;
	size_t size;
	void *alloc;   /* allocated copy */
	uint64_t view; /* mapped view id */
	const void *mapped;
	int spill;        /* zero_copy: the spill buffer mapped holds, or -1 */
	int64_t view_blk; /* ... or the staging block it holds, or -1 */
	int64_t blk;      /* staging block used as the item's dest */
};

/* The largest spill buffer not in use, now busy; -1 if none. */
static int spill_take(mc_client *c)
{
	int best = -1;
	pthread_mutex_lock(&c->mu);
	for (int i = 0; i < SPILL_SLOTS; i++)
		if (c->spills[i].buf && !c->spills[i].busy &&
		    (best < 0 || c->spills[i].cap > c->spills[best].cap))
			best = i;
	if (best >= 0)
		c->spills[best].busy = true;
	pthread_mutex_unlock(&c->mu);
	return best;
}

static void spill_give(mc_client *c, int i)
{
	if (i < 0)
		return;
	pthread_mutex_lock(&c->mu);
	c->spills[i].busy = false;
	pthread_mutex_unlock(&c->mu);
}

/* A get needed a fresh memfd of len bytes: keep a buffer that size for
 * the next ones — in an empty slot, or instead of the smallest free one
 * when that is smaller — within SPILL_MAX_BYTES. Best effort. */
static void spill_grow(mc_client *c, size_t len)
{
	size_t cap = (len + SPILL_ALIGN - 1) & ~(SPILL_ALIGN - 1);
	int slot = -1;
	size_t total = 0;
	pthread_mutex_lock(&c->mu);
	for (int i = 0; i < SPILL_SLOTS; i++) {
		total += c->spills[i].cap;
		if (!c->spills[i].buf && slot < 0)
			slot = i;
	}
	for (int i = 0; i < SPILL_SLOTS && slot < 0; i++)
		if (!c->spills[i].busy && c->spills[i].cap < cap &&
		    (slot < 0 || c->spills[i].cap < c->spills[slot].cap))
			slot = i;
	uint8_t *old = NULL;
	if (slot >= 0 && cap <= SPILL_MAX_BYTES &&
	    total - c->spills[slot].cap + cap <= SPILL_MAX_BYTES) {
		old = c->spills[slot].buf;
		c->spills[slot].buf = NULL;
		c->spills[slot].cap = 0;
		c->spills[slot].busy = true; /* being replaced */
	} else {
		slot = -1;
	}
	pthread_mutex_unlock(&c->mu);
	if (slot < 0)
		return;
	if (old)
		(void)mc_buffer_free(c, old);
	void *buf = NULL;
	int rc = mc_buffer_alloc(c, cap, &buf);
	pthread_mutex_lock(&c->mu);
	c->spills[slot].buf = rc ? NULL : buf;
	c->spills[slot].cap = rc ? 0 : cap;
	c->spills[slot].busy = false;
	pthread_mutex_unlock(&c->mu);
}

int mc__map_segment(mc_client *c, int fd)
{
	struct stat st;
	if (fstat(fd, &st) != 0)
		return -errno;
	void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return -errno;
	pthread_mutex_lock(&c->mu);
	if (c->seg) {
		munmap(p, (size_t)st.st_size);
	} else {
		c->seg = p;
		c->seg_len = (size_t)st.st_size;
	}
	pthread_mutex_unlock(&c->mu);
	return 0;
}

/* Deliver size bytes at src to the item: its buffer, or a new one. */
static void deliver(struct get_item *it, const void *src)
{
	if (it->parts) {
		if (it->size > it->cap) {
			it->err = -ENOBUFS;
			return;
		}
		const uint8_t *p = src;
		size_t left = it->size;
		for (size_t k = 0; k < it->nparts && left; k++) {
			size_t n = it->parts[k].len < left ? it->parts[k].len : left;
			memcpy(it->parts[k].buf, p, n);
			p += n;
			left -= n;
		}
		return;
	}
	if (it->buf) {
		if (it->size > it->cap) {
			it->err = -ENOBUFS;
			return;
		}
		if (it->size && it->buf != src)
			memcpy(it->buf, src, it->size);
		return;
	}
	it->alloc = malloc(it->size ? it->size : 1);
	if (!it->alloc) {
		it->err = -ENOMEM;
		return;
	}
	if (it->size)
		memcpy(it->alloc, src, it->size);
}

/* The CRC-32C of the size bytes an item was given (after deliver). */
static uint32_t delivered_crc(const struct get_item *it)
{
	if (!it->parts)
		return crc32c(0, it->buf ? it->buf : it->alloc, it->size);
	uint32_t crc = 0;
	size_t left = it->size;
	for (size_t k = 0; k < it->nparts && left; k++) {
		size_t n = it->parts[k].len < left ? it->parts[k].len : left;
		crc = crc32c(crc, it->parts[k].buf, n);
		left -= n;
	}
	return crc;
}

/* The table is read while the connection stands: once the agent is gone
 * (or the session broke) nobody keeps its entries up to date. */
static bool table_usable(mc_client *c)
{
	return c->ltab && !__atomic_load_n(&c->broken, __ATOMIC_RELAXED);
}

/*
 * A get the agent's shared lease table answers (common/ltab.h): the key's
 * value copied straight out of the segment, with no request. True when
 * the item got its value so; false leaves it to the agent — not in the
 * table, a view, a value larger than the item's buffer, a checksum asked
 * for that the table does not have or that does not match (the agent
 * then checks and counts it), or a slot that changed during the copy.
 */
static bool table_get(mc_client *c, struct get_item *it, bool verify)
{
	struct mc_ltab_hit h;
	if (!table_usable(c) || it->zero_copy ||
	    !mc_ltab_find(c->ltab, it->key, it->klen, mc_now_ms(), &h))
		return false;
	if ((verify && !h.has_crc) || ((it->buf || it->parts) && h.size > it->cap))
		return false;
	it->size = h.size;
	it->err = 0;
	deliver(it, c->seg + h.offset);
	bool ok = it->err == 0 && mc_ltab_still(&h, mc_now_ms()) &&
		  (!verify || delivered_crc(it) == h.crc);
	if (!ok) {
		free(it->alloc);
		it->alloc = NULL;
		it->err = 0;
		return false;
	}
	__atomic_fetch_add(&c->table_counts[0], 1, __ATOMIC_RELAXED);
	__atomic_fetch_add(&c->table_counts[1], h.size, __ATOMIC_RELAXED);
	return true;
}

bool mc__table_has(mc_client *c, const void *key, size_t klen)
{
	struct mc_ltab_hit h;
	return table_usable(c) && mc_ltab_find(c->ltab, key, klen, mc_now_ms(), &h) &&
	       mc_ltab_still(&h, mc_now_ms());
}

/* verify: check the bytes against the objects' checksums (so does every
 * get of a session opened with verify_gets). */
static int do_get(mc_client *c, struct get_item *its, size_t n, bool verify)
{
	Mooncake__Client__GetItem *items = calloc(n, sizeof(*items));
	Mooncake__Client__GetItem **ptrs = calloc(n, sizeof(*ptrs));
	Region *regs = calloc(n, sizeof(*regs));
	size_t *map = malloc(n * sizeof(*map));
	int rc = 0;
	size_t nreq = 0;
	int64_t spill_blk = -1;
	int spill_buf = -1; /* or the spill buffer offered */
	uint8_t *spill_map = NULL;
	size_t spill_len = 0;
	struct waiter w = {0};
	bool have_w = false;
	for (size_t i = 0; i < n; i++) {
		its[i].spill = -1;
		its[i].view_blk = -1;
	}
	if (!items || !ptrs || !regs || !map) {
		rc = -ENOMEM;
		goto out;
	}
	bool need_spill = false;
	for (size_t i = 0; i < n; i++) {
		struct get_item *it = &its[i];
		it->blk = -1;
		it->err = 0;
		if (!mc__key_ok(it->klen)) {
			it->err = -EINVAL;
			continue;
		}
		/* The bytes land through this process's memory: registered
		 * device memory (mc_register_dmabuf) is for peers' RDMA only. */
		if (it->parts ? mc__parts_on_device(c, it->parts, it->nparts)
			      : mc__device_touch(c, it->buf, it->cap)) {
			it->err = -EOPNOTSUPP;
			continue;
		}
		if (table_get(c, it, verify || c->verify_gets))
			continue;
		mooncake__client__get_item__init(&items[i]);
		items[i].key.data = (uint8_t *)it->key;
		items[i].key.len = it->klen;
		items[i].zero_copy = it->zero_copy;
		Region *g = &regs[i];
		mooncake__client__region__init(g);
		if (it->buf && mc__agent_region(c, it->buf, it->cap, g)) {
			items[i].dest = g;
		} else if (it->buf && it->cap && (it->blk = mc__stg_alloc(c, it->cap)) >= 0) {
			g->offset = (uint64_t)it->blk;
			g->length = it->cap;
			items[i].dest = g;
		} else {
			need_spill = true;
		}
		ptrs[nreq] = &items[i];
		map[nreq] = i;
		nreq++;
	}
	if (nreq == 0)
		goto out;
	Region spill = MOONCAKE__CLIENT__REGION__INIT;
	Mooncake__Client__GetRequest g = MOONCAKE__CLIENT__GET_REQUEST__INIT;
	g.items = ptrs;
	g.n_items = nreq;
	g.verify = verify || c->verify_gets;
	/* Items without a destination land in a spill buffer when one is
	 * free, else in a part of the staging memfd, else (too big) in a
	 * memfd the agent makes for this reply. */
	if (need_spill && (spill_buf = spill_take(c)) >= 0) {
		if (mc__agent_region(c, c->spills[spill_buf].buf, c->spills[spill_buf].cap,
				     &spill)) {
			g.spill = &spill;
		} else {
			spill_give(c, spill_buf);
			spill_buf = -1;
		}
	}
	if (need_spill && spill_buf < 0) {
		size_t want = c->stg_len / 4 > 65536 ? c->stg_len / 4 : 65536;
		size_t got;
		spill_blk = mc__stg_alloc_upto(c, want, &got);
		if (spill_blk >= 0) {
			spill.offset = (uint64_t)spill_blk;
			spill.length = got;
			g.spill = &spill;
		}
	}
	Request req = MOONCAKE__CLIENT__REQUEST__INIT;
	req.op_case = MOONCAKE__CLIENT__REQUEST__OP_GET;
	req.get = &g;
	rc = mc__call(c, &req, NULL, 0, &w);
	if (rc)
		goto out;
	have_w = true;
	const Response *r = w.resp;
	if (r->error) {
		rc = r->error;
		goto out;
	}
	if (r->body_case != MOONCAKE__CLIENT__RESPONSE__BODY_GET ||
	    r->get->n_results != nreq) {
		rc = MC_EPROTOCOL;
		goto out;
	}
	unsigned fdi = 0;
	int spill_fd = -1;
	bool any_spill = false;
	for (size_t k = 0; k < nreq; k++)
		any_spill |= r->get->results[k]->where ==
			     MOONCAKE__CLIENT__GET_RESULT__WHERE__SPILL;
	if (any_spill) {
		if (fdi >= w.nfds) {
			rc = MC_EPROTOCOL;
			goto out;
		}
		spill_fd = w.fds[fdi++];
		struct stat st;
		if (fstat(spill_fd, &st) != 0) {
			rc = -errno;
			goto out;
		}
		spill_len = (size_t)st.st_size;
		void *p = mmap(NULL, spill_len, PROT_READ, MAP_SHARED, spill_fd, 0);
		if (p == MAP_FAILED) {
			rc = -errno;
			goto out;
		}
		spill_map = p;
	}
	if (r->get->segment_fd) {
		if (fdi >= w.nfds) {
			rc = MC_EPROTOCOL;
			goto out;
		}
		rc = mc__map_segment(c, w.fds[fdi++]);
		if (rc)
			goto out;
	}
	for (size_t k = 0; k < nreq; k++) {
		const Mooncake__Client__GetResult *res = r->get->results[k];
		struct get_item *it = &its[map[k]];
		it->size = res->size;
		if (res->error) {
			it->err = res->error;
			continue;
		}
		const uint8_t *src = NULL;
		switch (res->where) {
		case MOONCAKE__CLIENT__GET_RESULT__WHERE__DEST:
			if (it->blk >= 0)
				src = c->stg + it->blk;
			else
				src = it->buf; /* written in place */
			break;
		case MOONCAKE__CLIENT__GET_RESULT__WHERE__STAGING: {
			/* (The spill region offered: a spill buffer or staging.) */
			const uint8_t *base = spill_buf >= 0 ? c->spills[spill_buf].buf
							     : c->stg;
			size_t blen = spill_buf >= 0 ? c->spills[spill_buf].cap : c->stg_len;
			if (res->offset > blen || it->size > blen - res->offset) {
				it->err = MC_EPROTOCOL;
			} else if (it->zero_copy && !it->buf && nreq == 1 &&
				   (spill_buf >= 0 || spill_blk >= 0)) {
				/* A view of a replica elsewhere: its bytes stay in
				 * the spill buffer or staging block until the view
				 * is released. */
				it->mapped = base + res->offset;
				it->spill = spill_buf;
				it->view_blk = spill_buf >= 0 ? -1 : spill_blk;
				spill_buf = -1;
				if (it->view_blk >= 0)
					spill_blk = -1;
				continue;
			} else {
				src = base + res->offset;
			}
			break;
		}
		case MOONCAKE__CLIENT__GET_RESULT__WHERE__SPILL:
			if (!spill_map || res->offset > spill_len ||
			    it->size > spill_len - res->offset)
				it->err = MC_EPROTOCOL;
			else
				src = spill_map + res->offset;
			break;
		case MOONCAKE__CLIENT__GET_RESULT__WHERE__MAPPED:
			if (!c->seg || res->offset > c->seg_len ||
			    it->size > c->seg_len - res->offset) {
				it->err = MC_EPROTOCOL;
			} else {
				it->mapped = c->seg + res->offset;
				it->view = res->view;
			}
			continue;
		default:
			it->err = MC_EPROTOCOL;
			break;
		}
		if (!it->err)
			deliver(it, src);
	}
out:
	if (spill_map)
		munmap(spill_map, spill_len);
	if (have_w)
		mc__waiter_clear(&w);
	mc__stg_free(c, spill_blk);
	spill_give(c, spill_buf);
	if (spill_map && rc == 0)
		spill_grow(c, spill_len); /* (spill_map only says one was made) */
	for (size_t i = 0; i < n; i++)
		mc__stg_free(c, its[i].blk);
	free(items);
	free(ptrs);
	free(regs);
	free(map);
	return rc;
}

MC__PUBLIC int mc_get_ex(mc_client *c, const void *key, size_t klen, void **value, size_t *len,
			 const struct mc_get_opts *opts)
{
	struct get_item it = {.key = key, .klen = klen};
	int rc = do_get(c, &it, 1, opts && opts->verify);
	if (rc == 0)
		rc = it.err;
	if (rc) {
		free(it.alloc);
		return rc;
	}
	*value = it.alloc;
	*len = it.size;
	return 0;
}

MC__PUBLIC int mc_get(mc_client *c, const void *key, size_t klen, void **value, size_t *len)
{
	return mc_get_ex(c, key, klen, value, len, NULL);
}

MC__PUBLIC int64_t mc_get_into_ex(mc_client *c, const void *key, size_t klen, void *buf,
				  size_t cap, const struct mc_get_opts *opts)
{
	struct get_item it = {.key = key, .klen = klen, .buf = buf, .cap = cap};
	int rc = do_get(c, &it, 1, opts && opts->verify);
	if (rc == 0)
		rc = it.err;
	return rc ? rc : (int64_t)it.size;
}

MC__PUBLIC int64_t mc_get_into(mc_client *c, const void *key, size_t klen, void *buf,
			       size_t cap)
{
	return mc_get_into_ex(c, key, klen, buf, cap, NULL);
}

MC__PUBLIC int mc_batch_get(mc_client *c, size_t n, const void *const *keys,
			    const size_t *klens, void **values, size_t *lens, int *results)
{
	struct get_item *its = calloc(n ? n : 1, sizeof(*its));
	if (!its)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		its[i].key = keys[i];
		its[i].klen = klens[i];
	}
	int rc = do_get(c, its, n, false);
	for (size_t i = 0; i < n; i++) {
		if (rc || its[i].err) {
			free(its[i].alloc);
			values[i] = NULL;
			lens[i] = 0;
			results[i] = rc ? rc : its[i].err;
		} else {
			values[i] = its[i].alloc;
			lens[i] = its[i].size;
			results[i] = 0;
		}
	}
	free(its);
	return rc;
}

MC__PUBLIC int mc_batch_get_into(mc_client *c, size_t n, const void *const *keys,
				 const size_t *klens, void *const *bufs, const size_t *caps,
				 int64_t *results)
{
	struct get_item *its = calloc(n ? n : 1, sizeof(*its));
	if (!its)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		its[i].key = keys[i];
		its[i].klen = klens[i];
		its[i].buf = bufs[i];
		its[i].cap = caps[i];
	}
	int rc = do_get(c, its, n, false);
	for (size_t i = 0; i < n; i++)
		results[i] = rc ? rc : its[i].err ? its[i].err : (int64_t)its[i].size;
	free(its);
	return rc;
}

static void send_release(mc_client *c, uint64_t id);

/* Turn the outcome of a zero-copy item into a view (0), or free what it
 * holds and return its error. */
static int make_view(mc_client *c, struct get_item *it, int rc, const void **data, size_t *len,
		     mc_view **view)
{
	mc_view *v = rc ? NULL : calloc(1, sizeof(*v));
	if (!rc && !v)
		rc = -ENOMEM;
	if (rc) {
		free(it->alloc);
		spill_give(c, it->spill);
		mc__stg_free(c, it->view_blk);
		if (it->view)
			send_release(c, it->view); /* mapped, but no handle for it */
		return rc;
	}
	v->spill = it->spill;
	v->blk = it->view_blk;
	if (it->spill >= 0 || it->view_blk >= 0) {
		*data = it->mapped;
	} else if (it->mapped) {
		v->id = it->view;
		*data = it->mapped;
	} else {
		v->copy = it->alloc;
		*data = it->alloc;
	}
	*len = it->size;
	*view = v;
	return 0;
}

MC__PUBLIC int mc_get_view(mc_client *c, const void *key, size_t klen, const void **data,
			   size_t *len, mc_view **view)
{
	struct get_item it = {.key = key, .klen = klen, .zero_copy = true};
	int rc = do_get(c, &it, 1, false);
	return make_view(c, &it, rc ? rc : it.err, data, len, view);
}

MC__PUBLIC int mc_batch_get_view(mc_client *c, size_t n, const void *const *keys,
				 const size_t *klens, const void **datas, size_t *lens,
				 mc_view **views, int *results)
{
	struct get_item *its = calloc(n ? n : 1, sizeof(*its));
	if (!its)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		its[i].key = keys[i];
		its[i].klen = klens[i];
		its[i].zero_copy = true;
	}
	int rc = do_get(c, its, n, false);
	for (size_t i = 0; i < n; i++) {
		views[i] = NULL;
		datas[i] = NULL;
		lens[i] = 0;
		results[i] = make_view(c, &its[i], rc ? rc : its[i].err, &datas[i], &lens[i],
				       &views[i]);
	}
	free(its);
	return rc;
}

MC__PUBLIC int mc_batch_get_into_parts(mc_client *c, size_t n, const void *const *keys,
				       const size_t *klens, const struct mc_part *const *parts,
				       const size_t *nparts, int64_t *results)
{
	struct get_item *its = calloc(n ? n : 1, sizeof(*its));
	if (!its)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		its[i].key = keys[i];
		its[i].klen = klens[i];
		size_t cap = 0;
		for (size_t k = 0; k < nparts[i]; k++)
			cap = parts[i][k].len > SIZE_MAX - cap ? SIZE_MAX
							       : cap + parts[i][k].len;
		its[i].cap = cap;
		if (nparts[i] == 1) {
			its[i].buf = parts[i][0].buf;
		} else if (nparts[i] > 1) {
			its[i].parts = parts[i];
			its[i].nparts = nparts[i];
		} else {
			its[i].klen = 0; /* refused below: no destination */
		}
	}
	int rc = do_get(c, its, n, false);
	for (size_t i = 0; i < n; i++)
		results[i] = rc ? rc : its[i].err ? its[i].err : (int64_t)its[i].size;
	free(its);
	return rc;
}

/* Position of key (k, klen) among the first n of keys, or n. */
static size_t key_index(const void *const *keys, const size_t *klens, size_t n, const void *k,
			size_t klen)
{
	for (size_t i = 0; i < n; i++)
		if (klens[i] == klen && memcmp(keys[i], k, klen) == 0)
			return i;
	return n;
}

MC__PUBLIC int mc_get_ranges(mc_client *c, const struct mc_range_req *reqs, size_t n,
			     int64_t *results)
{
	if (n == 0)
		return 0;
	const void **keys = malloc(n * sizeof(*keys));
	size_t *klens = malloc(n * sizeof(*klens));
	size_t *which = malloc(n * sizeof(*which));
	const void **datas = malloc(n * sizeof(*datas));
	size_t *lens = malloc(n * sizeof(*lens));
	mc_view **views = malloc(n * sizeof(*views));
	int *res = malloc(n * sizeof(*res));
	int rc = 0;
	size_t nk = 0;
	if (!keys || !klens || !which || !datas || !lens || !views || !res) {
		rc = -ENOMEM;
		goto out;
	}
	/* Each object once, however many ranges name it. */
	for (size_t i = 0; i < n; i++) {
		size_t k = key_index(keys, klens, nk, reqs[i].key, reqs[i].klen);
		if (k == nk) {
			keys[nk] = reqs[i].key;
			klens[nk++] = reqs[i].klen;
		}
		which[i] = k;
	}
	rc = mc_batch_get_view(c, nk, keys, klens, datas, lens, views, res);
	if (rc)
		goto out;
	for (size_t i = 0; i < n; i++) {
		const struct mc_range_req *q = &reqs[i];
		size_t k = which[i];
		size_t room = 0;
		if (res[k]) {
			results[i] = res[k];
		} else if (q->src_offset > lens[k] || q->len > lens[k] - q->src_offset) {
			results[i] = -ERANGE;
		} else if (!mc__registered_room(c, q->dst, &room)) {
			results[i] = -EINVAL;
		} else if (q->len > room) {
			results[i] = -ENOBUFS;
		} else {
			if (q->len)
				memmove(q->dst, (const uint8_t *)datas[k] + q->src_offset,
					q->len);
			results[i] = (int64_t)q->len;
		}
	}
	for (size_t k = 0; k < nk; k++)
		mc_view_release(c, views[k]);
out:
	free(keys);
	free(klens);
	free(which);
	free(datas);
	free(lens);
	free(views);
	free(res);
	return rc;
}

MC__PUBLIC int mc_view_is_mapped(const mc_view *v)
{
	return v && v->id != 0;
}

/* Tell the agent a mapped view is released (no answer to wait for). */
static void send_release(mc_client *c, uint64_t id)
{
	Mooncake__Client__ReleaseRequest q = MOONCAKE__CLIENT__RELEASE_REQUEST__INIT;
	q.views = &id;
	q.n_views = 1;
	q.quiet = true;
	Request req = MOONCAKE__CLIENT__REQUEST__INIT;
	req.op_case = MOONCAKE__CLIENT__REQUEST__OP_RELEASE;
	req.release = &q;
	mc__send_only(c, &req);
}

MC__PUBLIC void mc_view_release(mc_client *c, mc_view *v)
{
	if (!v)
		return;
	if (v->id)
		send_release(c, v->id);
	spill_give(c, v->spill);
	mc__stg_free(c, v->blk);
	free(v->copy);
	free(v);
}
