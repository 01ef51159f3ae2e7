/*
 * Transfers between this process's memory and memory another engine
 * registered (mc_transfer): local memory in place, or copied through
 * staging / a temporary memfd; a segment's description (mc_segment_info)
 * and the session's own engine (mc_engine_open).
 */
#include "client/client_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------ transfer */

/* An item's staging block offset when its local memory is partly device
 * memory (which nothing copies). */
#define BLK_DEVICE (-2)

/*
 * One round of a transfer: items from the first on, in memory the agent
 * maps (in place), staged (while the staging buffer has room), or — the
 * first item alone, when it does not fit — in a temporary memfd. A batch
 * larger than the staging buffer so goes in rounds that reuse it rather
 * than through a fresh memfd whose every page faults on both sides.
 * Returns how many items it took (>= 1), or an error for all of them.
 */
static int transfer_round(mc_client *c, const struct mc_transfer_req *reqs, size_t n,
			  int *results, Mooncake__Client__TransferItem *items,
			  Mooncake__Client__TransferItem **ptrs, Region *regs, int64_t *blk,
			  size_t *taken)
{
	int rc = 0, tfd = -1;
	size_t m = 0;
	bool spill = false;
	for (; m < n && !spill; m++) {
		const struct mc_transfer_req *t = &reqs[m];
		bool write = t->op == MC_TRANSFER_WRITE;
		Region *g = &regs[m];
		mooncake__client__region__init(g);
		blk[m] = -1;
		results[m] = 0;
		int dev = t->len ? mc__device_region(c, t->local, t->len, g) : 0;
		if (dev < 0) {
			/* Nothing can copy device memory: the item goes as an
			 * empty one and fails (BLK_DEVICE). */
			blk[m] = BLK_DEVICE;
			g->length = 0;
		} else if (dev || t->len == 0 || mc__agent_region(c, t->local, t->len, g)) {
			g->length = t->len;
		} else if ((blk[m] = mc__stg_alloc(c, t->len)) >= 0) {
			if (write)
				memcpy(c->stg + blk[m], t->local, t->len);
			g->offset = (uint64_t)blk[m];
			g->length = t->len;
		} else if (m > 0) {
			break; /* the next round, once this one's blocks are free */
		} else {
			g->where = MOONCAKE__CLIENT__REGION__WHERE__ATTACHED;
			g->length = t->len;
			spill = true;
		}
		mooncake__client__transfer_item__init(&items[m]);
		items[m].op = write ? MOONCAKE__CLIENT__TRANSFER_ITEM__OP__WRITE
				    : MOONCAKE__CLIENT__TRANSFER_ITEM__OP__READ;
		items[m].local = g;
		items[m].target = (char *)(t->target ? t->target : "");
		items[m].remote_address = t->remote_addr;
		ptrs[m] = &items[m];
	}
	if (spill) {
		tfd = mc__tmp_memfd(reqs[0].len);
		if (tfd < 0) {
			rc = tfd;
			goto out;
		}
		if (reqs[0].op == MC_TRANSFER_WRITE &&
		    (rc = mc_pwrite_all(tfd, reqs[0].local, reqs[0].len, 0)) != 0)
			goto out;
	}
	Mooncake__Client__TransferRequest q = MOONCAKE__CLIENT__TRANSFER_REQUEST__INIT;
	q.items = ptrs;
	q.n_items = m;
	Request req = MOONCAKE__CLIENT__REQUEST__INIT;
	req.op_case = MOONCAKE__CLIENT__REQUEST__OP_TRANSFER;
	req.transfer = &q;
	struct waiter w;
	rc = mc__call(c, &req, tfd >= 0 ? &tfd : NULL, tfd >= 0 ? 1 : 0, &w);
	if (rc)
		goto out;
	if (w.resp->error)
		rc = w.resp->error;
	else if (w.resp->body_case != MOONCAKE__CLIENT__RESPONSE__BODY_TRANSFER ||
		 w.resp->transfer->n_errors != m)
		rc = MC_EPROTOCOL;
	else
		for (size_t i = 0; i < m; i++)
			results[i] = blk[i] == BLK_DEVICE ? -EOPNOTSUPP
							  : w.resp->transfer->errors[i];
	mc__waiter_clear(&w);
	for (size_t i = 0; rc == 0 && i < m; i++) {
		if (results[i] || reqs[i].op != MC_TRANSFER_READ || reqs[i].len == 0)
			continue;
		if (blk[i] >= 0)
			memcpy(reqs[i].local, c->stg + blk[i], reqs[i].len);
		else if (regs[i].where == MOONCAKE__CLIENT__REGION__WHERE__ATTACHED)
			results[i] = mc_pread_all(tfd, reqs[i].local, reqs[i].len, 0);
	}
out:
	for (size_t i = 0; i < m; i++)
		mc__stg_free(c, blk[i]);
	if (tfd >= 0)
		close(tfd);
	*taken = m;
	return rc;
}

MC__PUBLIC int mc_transfer(mc_client *c, const struct mc_transfer_req *reqs, size_t n,
			   int *results)
{
	if (n == 0)
		return 0;
	Mooncake__Client__TransferItem *items = calloc(n, sizeof(*items));
	Mooncake__Client__TransferItem **ptrs = calloc(n, sizeof(*ptrs));
	Region *regs = calloc(n, sizeof(*regs));
	int64_t *blk = malloc(n * sizeof(*blk));
	int rc = items && ptrs && regs && blk ? 0 : -ENOMEM;
	for (size_t i = 0, m; rc == 0 && i < n; i += m)
		rc = transfer_round(c, reqs + i, n - i, results + i, items, ptrs, regs, blk,
				    &m);
	free(items);
	free(ptrs);
	free(regs);
	free(blk);
	return rc;
}

MC__PUBLIC int mc_segment_info(mc_client *c, const char *name, struct mc_segment_info *out)
{
	memset(out, 0, sizeof(*out));
	if (!name || !*name)
		return -EINVAL;
	Mooncake__Client__SegmentRequest q = MOONCAKE__CLIENT__SEGMENT_REQUEST__INIT;
	q.name = (char *)name;
	Request req = MOONCAKE__CLIENT__REQUEST__INIT;
	req.op_case = MOONCAKE__CLIENT__REQUEST__OP_SEGMENT;
	req.segment = &q;
	struct waiter w;
	int rc = mc__call(c, &req, NULL, 0, &w);
	if (rc)
		return rc;
	const Response *r = w.resp;
	if (r->error) {
		rc = r->error;
	} else if (r->body_case != MOONCAKE__CLIENT__RESPONSE__BODY_SEGMENT) {
		rc = MC_EPROTOCOL;
	} else {
		out->regions = r->segment->n_regions;
		if (r->segment->n_regions) {
			out->first_address = r->segment->regions[0]->address;
			out->first_length = r->segment->regions[0]->length;
		}
	}
	mc__waiter_clear(&w);
	return rc;
}

MC__PUBLIC int mc_engine_open(mc_client *c, char *name, size_t cap)
{
	Mooncake__Client__EngineRequest q = MOONCAKE__CLIENT__ENGINE_REQUEST__INIT;
	Request req = MOONCAKE__CLIENT__REQUEST__INIT;
	req.op_case = MOONCAKE__CLIENT__REQUEST__OP_ENGINE;
	req.engine = &q;
	struct waiter w;
	int rc = mc__call(c, &req, NULL, 0, &w);
	if (rc)
		return rc;
	const Response *r = w.resp;
	if (r->error)
		rc = r->error;
	else if (r->body_case != MOONCAKE__CLIENT__RESPONSE__BODY_ENGINE || !r->engine->name ||
		 !r->engine->name[0])
		rc = MC_EPROTOCOL;
	else if (strlen(r->engine->name) >= cap)
		rc = -ENOSPC;
	else
		memcpy(name, r->engine->name, strlen(r->engine->name) + 1);
	mc__waiter_clear(&w);
	return rc;
}
