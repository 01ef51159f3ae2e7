/*
 * op_put: the put. [BatchRemove when upserting] -> for an item whose one
 * replica is this agent's segment, space from the put lease (space.c)
 * when there is room, or for the one item of a put onto another agent's
 * segment space from a remote lease; else BatchPutStart (this agent's
 * segment preferred) -> copy the value to every replica on a copy thread
 * (local memcpy, or the transfer engine; small local ones inline, small
 * remote ones started from the loop), with the value's CRC-32C computed
 * in the same pass (or while the engine copies) -> BatchCommit for the
 * leased items written (one master call per put in all), BatchPutEnd
 * with the checksums for the others written, BatchPutRevoke for the
 * others (and for all of them when the client went away); unused leased
 * space goes back to the lease's giving-back list. The last put into a
 * lease an earlier mount dropped tells the master link, which holds that
 * mount until then (agent__mlink_lease_drained).
 *
 * A put naming the SSD tier (one replica, this agent's tier): each value
 * is copied into an aligned buffer on a copy thread (its checksum
 * computed in the same pass) — or, when the client's memory is aligned
 * and the value whole blocks, written from there at once, its checksum
 * computed by the tier's I/O thread while the write is in flight — into
 * the tier, and told to the master (TierCommit PUT, through demote.c):
 * visible once the master has it, lasting a crash from the tier's write
 * on.
 *
 * Master requests are built in one malloc'd block (r->mstate, r->mstate2
 * for the commit) that lives until the request ends, since a redirected
 * call is sent again.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "agent/agent_int.h"
#include "agent/demote.h"
#include "agent/tier.h"
#include "agent/xfer.h"
#include "agent/req.h"
#include "agent/batch.h"
#include "agent/mcall.h"
#include "agent/mlink.h"
#include "agent/op.h"
#include "agent/server.h"
#include "agent/space.h"
#include "common/crc32c.h"
#include "common/log.h"
#include "common/util.h"

#define LOG_SUBSYS LOGS_AGENT

/* One allocation: the header, then n pointers, n items, n indexes. */
struct put_block {
	Mooncake__Master__BatchPutStartRequest req;
	Mooncake__Master__PutStartRequest **ptrs;
	Mooncake__Master__PutStartRequest *items;
	size_t *idx;
	size_t n;
};

static void put_start(struct agent_req *r);
static void put_run(struct agent_job *j);
static void put_done(struct agent_job *j);

static void put_reply(struct agent_req *r)
{
	int32_t *errs = mc_zalloc(r->n, sizeof(*errs));
	if (!errs) {
		agent__op_fail(r, -ENOMEM, NULL);
		return;
	}
	int first = 0;
	for (size_t i = 0; i < r->n; i++) {
		errs[i] = r->items[i].err;
		if (errs[i] && !first)
			first = errs[i];
		if (errs[i] == 0) {
			agent__count(&r->a->stats, AGENT_C_PUTS, 1);
			agent__count(&r->a->stats, AGENT_C_BYTES_WRITTEN, r->items[i].len);
		} else
			agent__count(&r->a->stats, AGENT_C_PUT_FAILS, 1);
	}
	Mooncake__Client__PutReply pr = MOONCAKE__CLIENT__PUT_REPLY__INIT;
	pr.errors = errs;
	pr.n_errors = r->n;
	Mooncake__Client__Response resp = MOONCAKE__CLIENT__RESPONSE__INIT;
	resp.body_case = MOONCAKE__CLIENT__RESPONSE__BODY_PUT;
	resp.put = &pr;
	agent__reply(r, &resp, NULL, NULL, 0);
	free(errs);
	agent__op_finish(r, first);
}

static void on_revoked(void *ud, int err, const char *message, const ProtobufCMessage *resp)
{
	(void)resp;
	if (err && err != MC_ECANCELLED)
		log_warn("PutRevoke failed: %s (the master's put timeout will "
			 "revoke it)",
			 message ? message : mc_strerror(err));
	free(ud);
}

/* Items that were started (PutStart) but will not be ended. */
static bool item_revoke(const struct agent_item *it)
{
	return it->nrep > 0 && it->err != 0 && !it->leased && !it->rleased;
}

static bool item_end(const struct agent_item *it)
{
	return it->nrep > 0 && it->err == 0 && !it->leased && !it->rleased;
}

/* Both the PutEnd and the Commit call are answered: reply. */
static void put_call_done(struct agent_req *r)
{
	if (--r->mcalls == 0)
		put_reply(r);
}

static void revoke_items(struct agent_req *r)
{
	struct agent_keys_block *b = agent__op_keys_block(r, item_revoke);
	if (!b)
		return; /* the master's put timeout revokes them */
	if (b->req.n_keys == 0) {
		free(b);
		return;
	}
	agent__mcall(r->a, "BatchPutRevoke", &b->req.base,
		     &mooncake__master__batch_errors_response__descriptor, on_revoked, b);
}

static void on_put_ended(void *ud, int err, const char *message, const ProtobufCMessage *m)
{
	struct agent_req *r = ud;
	struct agent_keys_block *b = r->mstate;
	const Mooncake__Master__BatchErrorsResponse *resp =
		(const Mooncake__Master__BatchErrorsResponse *)m;
	for (size_t k = 0; k < b->req.n_keys; k++) {
		struct agent_item *it = &r->items[b->idx[k]];
		int e = err ? err : (k < resp->n_errors ? resp->errors[k] : MC_EPROTOCOL);
		if (e) {
			it->err = e;
			if (err)
				log_warn("PutEnd failed: %s",
					 message ? message : mc_strerror(err));
			continue;
		}
		/* Into the mirror at once (its log entry follows). */
		struct agent_inv_rec rec = {.size = it->len,
					    .crc = it->crc,
					    .has_crc = it->has_crc,
					    .soft_pin = r->msg->put->soft_pin};
		for (unsigned p = 0; p < it->nrep; p++) {
			rec.offset = it->reps[p].offset;
			if (it->reps[p].local &&
			    agent__inv_add(&r->a->inv, it->key, it->klen, &rec) != 0)
				log_warn("inventory: out of memory; an object will not be "
					 "re-reported after a master failover");
		}
	}
	put_call_done(r);
}

/* BatchCommit of the leased items written, each item encoded by hand
 * (agent__encode_commit_item): one allocation, the header, then n item
 * views, n indexes and the items' bytes. */
struct commit_block {
	Mooncake__Master__BatchCommitRequestRaw req;
	ProtobufCBinaryData *items;
	size_t *idx;
	size_t n;
};

static void on_committed(void *ud, int err, const char *message, const ProtobufCMessage *m)
{
	struct agent_req *r = ud;
	struct commit_block *b = r->mstate2;
	const Mooncake__Master__BatchErrorsResponse *resp = (const void *)m;
	if (err)
		log_warn("BatchCommit failed: %s", message ? message : mc_strerror(err));
	for (size_t k = 0; k < b->n; k++) {
		struct agent_item *it = &r->items[b->idx[k]];
		int e = err ? err : (k < resp->n_errors ? resp->errors[k] : MC_EPROTOCOL);
		if (e) {
			/* Refused: the master freed the space or never leased
			 * it. No answer: see space.c on commits that got none. */
			it->err = e;
			if (it->rleased && e != MC_EOBJECT_ALREADY_EXISTS && e != -EINVAL)
				agent__rlease_drop(r->a, it->reps[0].segment);
			continue;
		}
		agent__count(&r->a->stats, AGENT_C_PUT_COMMITS, 1);
		if (it->rleased)
			continue; /* its owner's inventory, not this agent's */
		struct agent_inv_rec rec = {.offset = it->reps[0].offset,
					    .size = it->len,
					    .crc = it->crc,
					    .has_crc = it->has_crc,
					    .soft_pin = r->msg->put->soft_pin};
		if (agent__inv_add(&r->a->inv, it->key, it->klen, &rec) != 0)
			log_warn("inventory: out of memory; an object will not be "
				 "re-reported after a master failover");
	}
	put_call_done(r);
}

/* Build the commit of the leased items written (NULL: out of memory). */
static struct commit_block *commit_block(struct agent_req *r)
{
	size_t n = 0, bytes = 0;
	for (size_t i = 0; i < r->n; i++) {
		const struct agent_item *it = &r->items[i];
		if ((it->leased || it->rleased) && !it->err) {
			n++;
			bytes += AGENT_COMMIT_ITEM_MAX(it->klen);
		}
	}
	struct commit_block *b = malloc(sizeof(*b) +
					n * (sizeof(*b->items) + sizeof(*b->idx)) + bytes);
	if (!b)
		return NULL;
	b->items = (ProtobufCBinaryData *)(b + 1);
	b->idx = (size_t *)(b->items + n);
	uint8_t *wire = (uint8_t *)(b->idx + n);
	b->n = 0;
	const Mooncake__Client__PutRequest *p = r->msg->put;
	for (size_t i = 0; i < r->n; i++) {
		struct agent_item *it = &r->items[i];
		if ((!it->leased && !it->rleased) || it->err)
			continue;
		Mooncake__Master__CommitItem c = MOONCAKE__MASTER__COMMIT_ITEM__INIT;
		c.key.data = (uint8_t *)it->key;
		c.key.len = it->klen;
		c.offset = it->reps[0].offset;
		c.size = it->len;
		c.crc32c = it->crc;
		c.checksummed = it->has_crc;
		c.soft_pin = p->soft_pin;
		c.ttl_ms = p->ttl_ms;
		b->items[b->n].data = wire;
		b->items[b->n].len = agent__encode_commit_item(wire, &c);
		wire += b->items[b->n].len;
		b->idx[b->n] = i;
		b->n++;
	}
	mooncake__master__batch_commit_request_raw__init(&b->req);
	b->req.agent_id = r->a->name;
	b->req.segment = r->a->name;
	b->req.lease_epoch = agent__lease_epoch(r->a);
	if (b->n && r->items[b->idx[0]].rleased) {
		/* (a request with a remote-leased item has no other: put_start) */
		b->req.segment = r->items[b->idx[0]].reps[0].segment;
		b->req.lease_epoch = r->items[b->idx[0]].rlease_epoch;
	}
	b->req.items = b->items;
	b->req.n_items = b->n;
	return b;
}

static void put_done(struct agent_job *j)
{
	struct agent_req *r = MC_CONTAINER_OF(j, struct agent_req, job);
	struct agent *a = r->a;
	if (agent__session_closed(r->c)) {
		/* The client went away: nobody will learn the outcome. */
		for (size_t i = 0; i < r->n; i++)
			if (r->items[i].nrep && !r->items[i].err)
				r->items[i].err = MC_ECANCELLED;
	}
	/* Space of an earlier lease epoch (the segment was mounted again
	 * meanwhile) cannot be committed any more. */
	for (size_t i = 0; i < r->n; i++)
		if (r->items[i].leased && !r->items[i].err &&
		    r->items[i].lease_gen != agent__lease_gen(a))
			r->items[i].err = MC_EUNAVAILABLE;
	struct agent_keys_block *b = agent__op_keys_block(r, item_end);
	struct commit_block *cb = commit_block(r);
	if (!b || !cb) {
		free(b);
		free(cb);
		b = NULL;
		for (size_t i = 0; i < r->n; i++)
			if (r->items[i].nrep && !r->items[i].err)
				r->items[i].err = -ENOMEM;
	}
	for (size_t i = 0; i < r->n; i++) {
		struct agent_item *it = &r->items[i];
		if (it->leased && agent__lease_put_done(a, it->reps[0].offset, it->len,
							it->lease_gen, !it->err))
			agent__mlink_lease_drained(a);
	}
	revoke_items(r);
	if (!b) {
		put_reply(r);
		return;
	}
	agent__op_set_mstate(r, b);
	free(r->mstate2);
	r->mstate2 = cb;
	r->mcalls = (b->req.n_keys > 0) + (cb->n > 0);
	if (r->mcalls == 0) {
		put_reply(r);
		return;
	}
	if (b->req.n_keys) {
		/* Every item written has its checksum (put_run). */
		b->req.crc32c = b->crcs;
		b->req.n_crc32c = b->req.n_keys;
		agent__bcall(a, AGENT_B_PUT_END, &b->req.base, on_put_ended, r);
	}
	if (cb->n)
		agent__bcall(a, AGENT_B_COMMIT, &cb->req.base, on_committed, r);
}

/* The writes of the remote replicas, added to x (created when one is
 * needed; NULL stays NULL when none is). */
static void put_add_remote(struct agent_req *r, struct agent_xfer **x, bool loop)
{
	for (size_t i = 0; i < r->n; i++) {
		struct agent_item *it = &r->items[i];
		for (unsigned p = 0; p < it->nrep && !it->err; p++) {
			if (it->reps[p].local || it->len == 0)
				continue;
			if (!*x && !(*x = loop ? agent__xfer_new_loop() : agent__xfer_new())) {
				it->err = -ENOMEM;
				break;
			}
			agent__xfer_add(r->a, *x, it->reps[p].segment, true, it->ptr,
					it->reps[p].address, it->len, &it->err);
		}
	}
}

/* The local replicas' copies and every value's checksum: in the pass
 * that copies it to its local replica, else while the engine moves it. */
static void put_copy_local(struct agent_req *r)
{
	for (size_t i = 0; i < r->n; i++) {
		struct agent_item *it = &r->items[i];
		for (unsigned p = 0; p < it->nrep && !it->err; p++)
			if (it->reps[p].local) {
				it->err = agent__op_local_io(r->a, &it->reps[p], it->ptr,
							     it->len, true, &it->crc, NULL);
				it->has_crc = !it->err;
			}
		if (!it->err && it->nrep && !it->has_crc) {
			it->crc = crc32c(0, it->ptr, it->len);
			it->has_crc = true;
		}
	}
}

/* Remote replicas go out first as one transfer batch; the local ones
 * are copied while it runs. */
static void put_run(struct agent_job *j)
{
	struct agent_req *r = MC_CONTAINER_OF(j, struct agent_req, job);
	struct agent_xfer *x = NULL;
	put_add_remote(r, &x, false);
	if (x)
		agent__xfer_start(r->a, x);
	put_copy_local(r);
	if (x)
		agent__xfer_finish(r->a, x);
}

static void put_loop_done(struct agent_job *j)
{
	agent__op_end_from_loop(j);
	put_done(j);
}

/* Small values without a copy thread (start_from_loop). */
static bool put_from_loop(struct agent_req *r)
{
	struct agent_xfer *x = NULL;
	put_add_remote(r, &x, true);
	return x && agent__op_start_from_loop(r, x, put_copy_local, put_loop_done);
}

/* Every item has its replicas (leased space or PutStart placements) or an
 * error: copy, inline when small and local, else on a copy thread. */
static void put_copy(struct agent_req *r)
{
	uint64_t bytes = 0;
	bool any = false, remote = false;
	for (size_t i = 0; i < r->n; i++) {
		const struct agent_item *it = &r->items[i];
		any |= it->nrep > 0; /* (failed ones are given back or revoked) */
		if (it->err)
			continue;
		bytes += it->len * it->nrep;
		for (unsigned p = 0; p < it->nrep; p++)
			remote |= !it->reps[p].local;
	}
	if (!any) {
		put_reply(r);
		return;
	}
	r->job.run = put_run;
	r->job.done = put_done;
	if (bytes <= AGENT_INLINE_COPY_BYTES && !remote) {
		put_run(&r->job);
		put_done(&r->job);
		return;
	}
	if (bytes <= AGENT_INLINE_COPY_BYTES && put_from_loop(r))
		return;
	agent__pool_submit(&r->a->pool, &r->job);
}

static void on_put_started(void *ud, int err, const char *message, const ProtobufCMessage *m)
{
	struct agent_req *r = ud;
	struct put_block *b = r->mstate;
	const Mooncake__Master__BatchPutStartResponse *resp =
		(const Mooncake__Master__BatchPutStartResponse *)m;
	(void)message;
	for (size_t k = 0; k < b->n; k++) {
		struct agent_item *it = &r->items[b->idx[k]];
		if (err) {
			it->err = err;
			continue;
		}
		if (k >= resp->n_results) {
			it->err = MC_EPROTOCOL;
			continue;
		}
		const Mooncake__Master__PutStartResult *res = resp->results[k];
		if (res->error) {
			it->err = res->error;
			continue;
		}
		if (res->n_replicas == 0) {
			it->err = MC_EPROTOCOL;
			continue;
		}
		if (agent__op_replicas(r->a, it, res->replicas, res->n_replicas) != 0) {
			it->err = -ENOMEM; /* revoked if any replica was taken, else
					      by the master's put timeout */
			continue;
		}
	}
	put_copy(r);
}

/* Space from the put lease for an item whose one replica is this
 * agent's segment. */
static bool take_leased(struct agent_req *r, struct agent_item *it)
{
	struct agent *a = r->a;
	uint64_t off;
	unsigned gen;
	if (!agent__lease_take(a, it->len, &off, &gen))
		return false;
	it->reps = mc_zalloc(1, sizeof(*it->reps));
	if (!it->reps) {
		agent__lease_put_done(a, off, it->len, gen, false); /* (this generation) */
		it->err = -ENOMEM;
		return true;
	}
	it->reps[0].local = true;
	it->reps[0].offset = off;
	it->reps[0].address = (uint64_t)(uintptr_t)a->seg->addr + off;
	it->nrep = 1;
	it->leased = true;
	it->lease_gen = gen;
	return true;
}

/* Space from a remote lease on segment seg for the one item of a put
 * whose one replica is to be there. */
static bool take_rleased(struct agent_req *r, struct agent_item *it, const char *seg)
{
	struct agent_rtake t;
	if (!agent__rlease_take(r->a, seg, it->len, &t))
		return false;
	it->reps = mc_zalloc(1, sizeof(*it->reps));
	char *name = strdup(seg);
	if (!it->reps || !name) {
		free(name);
		it->err = -ENOMEM; /* (the space returns at the lease's end) */
		return true;
	}
	it->reps[0].segment = name;
	it->reps[0].offset = t.off;
	it->reps[0].address = t.base + t.off;
	it->nrep = 1;
	it->rleased = true;
	it->rlease_epoch = t.epoch;
	return true;
}

/* ------------------------------------------------------------ SSD tier */

struct ssd_put {
	struct agent_req *r;
	size_t i;
};

static void on_ssd_committed(void *ud, int err)
{
	struct ssd_put *x = ud;
	struct agent_req *r = x->r;
	size_t i = x->i;
	free(x);
	if (err)
		r->items[i].err = err;
	else
		agent__count(&r->a->stats, AGENT_C_SSD_PUTS, 1);
	put_call_done(r);
}

static void on_ssd_stored(void *ud, int err, const struct agent_tier_obj *o)
{
	struct ssd_put *x = ud;
	struct agent_req *r = x->r;
	struct agent_item *it = &r->items[x->i];
	if (!err && it->err) /* (a stream's feed failed: stored, not whole) */
		(void)agent__tier_remove(r->a, it->key, it->klen, o->offset);
	if (err || it->err) {
		it->err = err ? err : it->err;
		free(x);
		put_call_done(r);
		return;
	}
	it->crc = o->crc; /* (computed by the tier when it wrote from the client) */
	it->has_crc = true;
	const Mooncake__Client__PutRequest *p = r->msg->put;
	agent__demote_put(r->a, it->key, it->klen, o->offset, it->len, it->crc, p->soft_pin,
			  p->ttl_ms, on_ssd_committed, x);
}

/* Start the tier's write of item i: from its scratch copy, checksummed,
 * or from the client's memory, checksummed by the tier as it writes. */
static void ssd_write(struct agent_req *r, size_t i)
{
	struct agent_item *it = &r->items[i];
	struct ssd_put *x = malloc(sizeof(*x));
	if (!x) {
		it->err = -ENOMEM;
		return;
	}
	x->r = r;
	x->i = i;
	int rc = it->scratch ? agent__tier_write(r->a, it->key, it->klen, it->scratch, it->len,
						 it->crc, on_ssd_stored, x)
			     : agent__tier_write_sum(r->a, it->key, it->klen, it->ptr, it->len,
						     on_ssd_stored, x);
	if (rc) {
		free(x);
		it->err = rc;
		return;
	}
	r->mcalls++;
}

/* On a copy thread: the values that need it into aligned buffers, with
 * checksums. */
static void ssd_copy_run(struct agent_job *j)
{
	struct agent_req *r = MC_CONTAINER_OF(j, struct agent_req, job);
	for (size_t i = 0; i < r->n; i++) {
		struct agent_item *it = &r->items[i];
		/* (Only the items with a scratch buffer are this thread's: the
		 * loop may be ending the others.) */
		if (!it->scratch || it->err)
			continue;
		it->crc = crc32c_copy(0, it->scratch, it->ptr, it->len);
		it->has_crc = true;
	}
}

static void ssd_copy_done(struct agent_job *j)
{
	struct agent_req *r = MC_CONTAINER_OF(j, struct agent_req, job);
	for (size_t i = 0; i < r->n; i++)
		if (!r->items[i].err && r->items[i].scratch)
			ssd_write(r, i);
	put_call_done(r); /* (the copies' hold) */
}

/* On a copy thread: the next part of a streamed value into staging. */
static void stream_copy_run(struct agent_job *j)
{
	struct agent_req *r = MC_CONTAINER_OF(j, struct agent_req, job);
	struct agent_item *it = &r->items[0];
	uint64_t n = MC_MIN(AGENT_STREAM_PART, it->len - r->streamed);
	it->crc = crc32c_copy(it->crc, it->scratch + r->streamed, it->ptr + r->streamed, n);
	r->streamed += n;
}

/* The part is copied: its write starts, and the next part's copy. */
static void stream_copy_done(struct agent_job *j)
{
	struct agent_req *r = MC_CONTAINER_OF(j, struct agent_req, job);
	struct agent_item *it = &r->items[0];
	bool last = r->streamed == it->len;
	int rc = agent__tier_stream_feed(r->a, r->stream, r->streamed, it->crc);
	if (rc) { /* (a part's bounds break the store's rules: a bug) */
		log_error("put '%.*s': SSD write of its first %" PRIu64 " bytes: %s",
			  (int)MC_MIN(it->klen, 64), (const char *)it->key, r->streamed,
			  mc_strerror(rc));
		it->err = MC_EINTERNAL;
	}
	if (!last) {
		agent__pool_submit(&r->a->pool, &r->job);
		return;
	}
	it->has_crc = true;
	r->stream = NULL;
	put_call_done(r); /* (the copies' hold) */
}

/* One value through staging, copied and written in parts; false when the
 * tier cannot start it now (full: the whole copy then waits for room). */
static bool stream_start(struct agent_req *r)
{
	struct agent_item *it = &r->items[0];
	struct ssd_put *x = malloc(sizeof(*x));
	if (!x)
		return false;
	x->r = r;
	x->i = 0;
	if (agent__tier_write_stream(r->a, it->key, it->klen, it->scratch, it->len,
				     on_ssd_stored, x, &r->stream) != 0) {
		free(x);
		return false;
	}
	r->mcalls++;
	it->crc = 0;
	r->streamed = 0;
	r->job.run = stream_copy_run;
	r->job.done = stream_copy_done;
	agent__pool_submit(&r->a->pool, &r->job);
	return true;
}

static void put_ssd(struct agent_req *r)
{
	bool copies = false;
	r->mcalls = 1; /* (held until every write is started) */
	for (size_t i = 0; i < r->n; i++) {
		struct agent_item *it = &r->items[i];
		if (it->err)
			continue;
		uint64_t block = agent__tier_block(r->a);
		bool in_place = (uintptr_t)it->ptr % block == 0 && it->len % block == 0;
		if (it->len == 0) {
			it->err = -EINVAL; /* (the SSD tier holds no empty values) */
			continue;
		}
		/* From the client's memory when the tier can write from there
		 * (aligned, whole blocks) and the value is on huge pages or up
		 * to AGENT_STAGE_PUT_MIN; else through a copy, into staging
		 * memory when it has room. */
		if (!in_place ||
		    (it->len > AGENT_STAGE_PUT_MIN && !agent__req_huge(r, it->ptr)))
			it->scratch = agent__tier_buf(r->a, it->len, in_place);
		if (it->scratch)
			copies = true;
		else if (in_place)
			ssd_write(r, i); /* from the client's memory, whole blocks */
		else
			it->err = -ENOMEM;
	}
	if (!copies) {
		put_call_done(r);
		return;
	}
	if (r->n == 1 && !r->items[0].err && r->items[0].len >= AGENT_STREAM_PUT_MIN &&
	    stream_start(r))
		return;
	r->job.run = ssd_copy_run;
	r->job.done = ssd_copy_done;
	agent__pool_submit(&r->a->pool, &r->job);
}

/* ------------------------------------------------------------ put */

static void put_start(struct agent_req *r)
{
	const Mooncake__Client__PutRequest *p = r->msg->put;
	struct agent *a = r->a;
	if (p->tier) {
		put_ssd(r);
		return;
	}
	bool local_only = p->replica_num <= 1 &&
			  (!p->preferred_segment || !p->preferred_segment[0] ||
			   strcmp(p->preferred_segment, a->name) == 0);
	/* One item for one replica on another agent's segment (batches of
	 * those keep PutStart: one commit names one segment). */
	bool remote_one = p->replica_num <= 1 && !local_only && r->n == 1;
	size_t n = 0;
	for (size_t i = 0; i < r->n; i++) {
		struct agent_item *it = &r->items[i];
		if (it->err || (local_only && take_leased(r, it)) ||
		    (remote_one && take_rleased(r, it, p->preferred_segment)))
			continue;
		n++;
	}
	if (n == 0) {
		put_copy(r); /* (or the reply, when nothing is left to do) */
		return;
	}
	struct put_block *b = malloc(
		sizeof(*b) + n * (sizeof(*b->ptrs) + sizeof(*b->items) + sizeof(*b->idx)));
	if (!b) {
		agent__op_fail(r, -ENOMEM, NULL);
		return;
	}
	b->items = (Mooncake__Master__PutStartRequest *)(b + 1);
	b->ptrs = (Mooncake__Master__PutStartRequest **)(b->items + n);
	b->idx = (size_t *)(b->ptrs + n);
	mooncake__master__batch_put_start_request__init(&b->req);
	const char *pref = p->preferred_segment && p->preferred_segment[0]
				   ? p->preferred_segment
				   : a->name;
	size_t k = 0;
	for (size_t i = 0; i < r->n; i++) {
		struct agent_item *it = &r->items[i];
		if (it->err || it->leased || it->rleased)
			continue;
		Mooncake__Master__PutStartRequest *q = &b->items[k];
		mooncake__master__put_start_request__init(q);
		q->key.data = (uint8_t *)it->key;
		q->key.len = it->klen;
		q->size = it->len;
		q->replica_num = p->replica_num ? p->replica_num : 1;
		q->preferred_segment = (char *)pref;
		q->soft_pin = p->soft_pin;
		q->ttl_ms = p->ttl_ms;
		b->ptrs[k] = q;
		b->idx[k] = i;
		k++;
	}
	b->n = n;
	b->req.items = b->ptrs;
	b->req.n_items = n;
	agent__op_set_mstate(r, b);
	agent__bcall(a, AGENT_B_PUT_START, &b->req.base, on_put_started, r);
}

static void on_upsert_removed(void *ud, int err, const char *message,
			      const ProtobufCMessage *m)
{
	struct agent_req *r = ud;
	struct agent_keys_block *b = r->mstate;
	const Mooncake__Master__BatchErrorsResponse *resp =
		(const Mooncake__Master__BatchErrorsResponse *)m;
	(void)message;
	for (size_t k = 0; k < b->req.n_keys && !err; k++) {
		int e = k < resp->n_errors ? resp->errors[k] : 0;
		struct agent_item *it = &r->items[b->idx[k]];
		if (e == 0) {
			agent__inv_del(&r->a->inv, it->key, it->klen);
			agent__lcache_del(&r->a->lc, it->key, it->klen);
		} else if (e != MC_EOBJECT_NOT_FOUND)
			it->err = e; /* leased: cannot replace it now */
	}
	if (err) {
		for (size_t i = 0; i < r->n; i++)
			if (!r->items[i].err)
				r->items[i].err = err;
	}
	agent__op_set_mstate(r, NULL);
	put_start(r);
}

void agent__op_put(struct agent_req *r)
{
	const Mooncake__Client__PutRequest *p = r->msg->put;
	if (p->tier > 1 ||
	    (p->tier == 1 &&
	     (p->replica_num > 1 || (p->preferred_segment && *p->preferred_segment &&
				     strcmp(p->preferred_segment, r->a->name) != 0)))) {
		agent__op_fail(r, -EINVAL,
			       p->tier > 1
				       ? "tier is 0 (DRAM) or 1 (SSD)"
				       : "a put to the SSD tier makes one replica, in this "
					 "agent's SSD tier");
		return;
	}
	if (p->tier == 1 && !agent__tier_on(r->a)) {
		agent__op_fail(r, MC_ESEGMENT_NOT_FOUND,
			       "this agent has no SSD tier (--ssd-path, --ssd-size)");
		return;
	}
	if (agent__op_items(r, p->n_items)) {
		agent__op_fail(r, -ENOMEM, NULL);
		return;
	}
	for (size_t i = 0; i < p->n_items; i++) {
		struct agent_item *it = &r->items[i];
		const Mooncake__Client__PutItem *pi = p->items[i];
		it->key = pi->key.data;
		it->klen = pi->key.len;
		if (!agent__key_ok(&pi->key)) {
			it->err = -EINVAL;
			continue;
		}
		it->len = pi->source->length;
		it->err = agent__op_region(r, pi->source, &it->ptr);
	}
	if (p->upsert) {
		struct agent_keys_block *b = agent__op_keys_block(r, agent__op_item_ok);
		if (!b) {
			agent__op_fail(r, -ENOMEM, NULL);
			return;
		}
		agent__op_set_mstate(r, b);
		if (b->req.n_keys == 0) {
			put_reply(r);
			return;
		}
		agent__mcall(r->a, "BatchRemove", &b->rm.base,
			     &mooncake__master__batch_errors_response__descriptor,
			     on_upsert_removed, r);
		return;
	}
	put_start(r);
}
