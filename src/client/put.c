/*
 * Puts: each value in place (agent-mapped memory), in a staging block,
 * or, when it does not fit, in one temporary memfd attached to the
 * request for all such values of a batch.
 */
#include "client/client_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Copy value i's parts one after another to dst. */
static void gather(const struct mc_part *parts, size_t np, uint8_t *dst)
{
	for (size_t k = 0; k < np; k++) {
		if (parts[k].len)
			memcpy(dst, parts[k].buf, parts[k].len);
		dst += parts[k].len;
	}
}

/* Write value i's parts one after another into fd at off. */
static int gather_fd(int fd, const struct mc_part *parts, size_t np, uint64_t off)
{
	for (size_t k = 0; k < np; k++) {
		int rc = mc_pwrite_all(fd, parts[k].buf, parts[k].len, off);
		if (rc)
			return rc;
		off += parts[k].len;
	}
	return 0;
}

/* The batch put behind every put call: value i is parts[i][0..np[i]). */
static int put_items(mc_client *c, size_t n, const void *const *keys, const size_t *klens,
		     const struct mc_part *const *parts, const size_t *np,
		     const struct mc_put_opts *opts, int *results)
{
	if (n == 0)
		return 0;
	Mooncake__Client__PutItem *items = calloc(n, sizeof(*items));
	Mooncake__Client__PutItem **ptrs = calloc(n, sizeof(*ptrs));
	Region *regs = calloc(n, sizeof(*regs));
	int64_t *blk = malloc(n * sizeof(*blk));
	size_t *map = malloc(n * sizeof(*map)); /* request position -> item */
	int rc = 0, tfd = -1;
	size_t nreq = 0;
	if (!items || !ptrs || !regs || !blk || !map) {
		rc = -ENOMEM;
		goto out;
	}
	/* Where each value comes from: in place (one piece in memory the
	 * agent maps), staging, or one memfd for all that do not fit. */
	uint64_t spill = 0;
	for (size_t i = 0; i < n; i++) {
		blk[i] = -1;
		results[i] = 0;
		size_t len = 0;
		bool overflow = false;
		for (size_t k = 0; k < np[i]; k++) {
			overflow |= parts[i][k].len > SIZE_MAX - len;
			len += parts[i][k].len;
		}
		if (!mc__key_ok(klens[i]) || np[i] == 0 || overflow) {
			results[i] = -EINVAL;
			continue;
		}
		if (mc__parts_on_device(c, parts[i], np[i])) {
			results[i] = -EOPNOTSUPP;
			continue;
		}
		Region *g = &regs[i];
		mooncake__client__region__init(g);
		if (len == 0 || (np[i] == 1 && mc__agent_region(c, parts[i][0].buf, len, g))) {
			g->length = len;
		} else if ((blk[i] = mc__stg_alloc(c, len)) >= 0) {
			gather(parts[i], np[i], c->stg + blk[i]);
			g->offset = (uint64_t)blk[i];
			g->length = len;
		} else {
			g->where = MOONCAKE__CLIENT__REGION__WHERE__ATTACHED;
			g->fd_index = 0;
			g->offset = spill;
			g->length = len;
			spill += len;
		}
		mooncake__client__put_item__init(&items[i]);
		items[i].key.data = (uint8_t *)keys[i];
		items[i].key.len = klens[i];
		items[i].source = g;
		ptrs[nreq] = &items[i];
		map[nreq] = i;
		nreq++;
	}
	if (nreq == 0)
		goto out;
	if (spill) {
		tfd = mc__tmp_memfd(spill);
		if (tfd < 0) {
			rc = tfd;
			goto out;
		}
		for (size_t i = 0; i < n; i++)
			if (!results[i] &&
			    regs[i].where == MOONCAKE__CLIENT__REGION__WHERE__ATTACHED &&
			    (rc = gather_fd(tfd, parts[i], np[i], regs[i].offset)) != 0)
				goto out;
	}
	Mooncake__Client__PutRequest p = MOONCAKE__CLIENT__PUT_REQUEST__INIT;
	p.items = ptrs;
	p.n_items = nreq;
	if (opts) {
		p.replica_num = opts->replica_num;
		p.soft_pin = opts->soft_pin != 0;
		p.ttl_ms = opts->ttl_ms;
		p.preferred_segment =
			(char *)(opts->preferred_segment ? opts->preferred_segment : "");
		p.upsert = opts->upsert != 0;
		p.tier = opts->tier == MC_TIER_SSD ? 1 : 0;
	}
	Request req = MOONCAKE__CLIENT__REQUEST__INIT;
	req.op_case = MOONCAKE__CLIENT__REQUEST__OP_PUT;
	req.put = &p;
	struct waiter w;
	rc = mc__call(c, &req, tfd >= 0 ? &tfd : NULL, tfd >= 0 ? 1 : 0, &w);
	if (rc == 0) {
		const Response *r = w.resp;
		if (r->error)
			rc = r->error;
		else if (r->body_case != MOONCAKE__CLIENT__RESPONSE__BODY_PUT ||
			 r->put->n_errors != nreq)
			rc = MC_EPROTOCOL;
		else
			for (size_t k = 0; k < nreq; k++)
				results[map[k]] = r->put->errors[k];
		mc__waiter_clear(&w);
	}
out:
	if (blk)
		for (size_t i = 0; i < n; i++)
			mc__stg_free(c, blk[i]);
	if (tfd >= 0)
		close(tfd);
	free(items);
	free(ptrs);
	free(regs);
	free(blk);
	free(map);
	return rc;
}

MC__PUBLIC int mc_batch_put_parts(mc_client *c, size_t n, const void *const *keys,
				  const size_t *klens, const struct mc_part *const *parts,
				  const size_t *nparts, const struct mc_put_opts *opts,
				  int *results)
{
	return put_items(c, n, keys, klens, parts, nparts, opts, results);
}

MC__PUBLIC int mc_batch_put(mc_client *c, size_t n, const void *const *keys,
			    const size_t *klens, const void *const *values, const size_t *lens,
			    const struct mc_put_opts *opts, int *results)
{
	if (n == 0)
		return 0;
	struct mc_part *one = malloc(n * sizeof(*one));
	const struct mc_part **parts = malloc(n * sizeof(*parts));
	size_t *np = malloc(n * sizeof(*np));
	int rc = -ENOMEM;
	if (one && parts && np) {
		for (size_t i = 0; i < n; i++) {
			one[i] = (struct mc_part){(void *)values[i], lens[i]};
			parts[i] = &one[i];
			np[i] = 1;
		}
		rc = put_items(c, n, keys, klens, parts, np, opts, results);
	}
	free(one);
	free(parts);
	free(np);
	return rc;
}

MC__PUBLIC int mc_put(mc_client *c, const void *key, size_t klen, const void *value,
		      size_t len, const struct mc_put_opts *opts)
{
	struct mc_part one = {(void *)value, len};
	const struct mc_part *parts = &one;
	size_t np = 1;
	int res = 0;
	int rc = put_items(c, 1, &key, &klen, &parts, &np, opts, &res);
	return rc ? rc : res;
}

MC__PUBLIC int mc_put_from(mc_client *c, const void *key, size_t klen, const void *buf,
			   size_t len, const struct mc_put_opts *opts)
{
	return mc_put(c, key, klen, buf, len, opts);
}
