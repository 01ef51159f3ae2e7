/*
 * op_get: the get, and the read leases it keeps.
 *
 * A get: the items whose replica the lease cache (lcache.c) holds take
 * it — a local one at once, one on another agent's segment only after
 * its bytes, read from the loop, match its checksum (get_probe) — and
 * the rest ask BatchGetReplicas (which grants the read lease) -> per
 * item the nearest replica (this agent's segment first): a zero-copy
 * view of the segment when asked and local, else a copy into the item's
 * destination, the staging spill area, or one new memfd attached to the
 * reply; with verify, the bytes are checked against the object's
 * checksum -> reply. Small copies run on the loop, a big local one too
 * when its session is alone (solo_get), the rest on a copy thread.
 *
 * A replica in an SSD tier (when no DRAM one is there) is read by its
 * owner: this agent's tier reads it into its place, or into an aligned
 * buffer and on into its place in the pass that checks its checksum;
 * another agent's reads it into its bounce region (peer.c), and this
 * agent reads that through the transfer engine like a remote replica,
 * always checking the bytes (by the sum the engine makes of what lands:
 * te_request.want_crc), then lets the owner reuse the room. A
 * replica gone meanwhile (promoted, evicted) makes the item ask the
 * master again, once. A zero-copy view of an SSD object is such a copy
 * into the spill area (no segment holds it). After a hit in this agent's
 * own tier, with --ssd-promote-on-hit, the value is copied back into its
 * DRAM segment too, into put-lease space, with the get's copies, and
 * committed as a promotion once the get is answered — when the lease has
 * room (it never has past the eviction watermark).
 *
 * Read leases: a cached replica answers gets for half the lease the
 * master granted; a hit in the second half renews it in the background.
 * The zero-copy views sessions hold (server.c) have their leases renewed
 * every third of the lease's TTL, which the master's replies tell.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent/agent_int.h"
#include "agent/batch.h"
#include "agent/mcall.h"
#include "agent/mlink.h"
#include "agent/op.h"
#include "agent/peer.h"
#include "agent/req.h"
#include "agent/server.h"
#include "agent/space.h"
#include "agent/tier.h"
#include "agent/xfer.h"
#include "common/crc32c.h"
#include "common/log.h"
#include "common/util.h"

#define LOG_SUBSYS LOGS_AGENT

#define VIEW_RENEW_MIN_MS 100

/* ------------------------------------------------------------ read leases */

static void renew_views(struct agent *a);

static void on_view_timer(uv_timer_t *t)
{
	renew_views(t->data);
}

static uint64_t renew_period(const struct agent *a)
{
	return MC_MAX(a->gets.lease_ttl_ms / 3, (uint64_t)VIEW_RENEW_MIN_MS);
}

/* The master's read lease TTL, learned from its replies. */
static void set_lease_ttl(struct agent *a, uint64_t ms)
{
	if (ms == a->gets.lease_ttl_ms)
		return;
	a->gets.lease_ttl_ms = ms;
	/* Views must be renewed well within the lease: restart the timer
	 * at once with the new period. */
	if (!a->stopping)
		uv_timer_start(&a->gets.view_timer, on_view_timer, renew_period(a),
			       renew_period(a));
}

uint64_t agent__lease_ttl_ms(const struct agent *a)
{
	return a->gets.lease_ttl_ms;
}

void agent__gets_init(struct agent *a, uint64_t remote_cache_bytes, bool promote_on_hit)
{
	a->gets.remote_cache_bytes = remote_cache_bytes;
	a->gets.promote_on_hit = promote_on_hit;
	a->gets.lease_ttl_ms = 5000; /* until the master's replies say */
}

void agent__gets_start(struct agent *a)
{
	uv_timer_init(a->loop, &a->gets.view_timer);
	a->gets.view_timer.data = a;
	uv_timer_start(&a->gets.view_timer, on_view_timer, renew_period(a), renew_period(a));
}

void agent__gets_stop(struct agent *a)
{
	uv_timer_stop(&a->gets.view_timer);
}

unsigned agent__gets_close(struct agent *a, uv_close_cb on_closed)
{
	uv_close((uv_handle_t *)&a->gets.view_timer, on_closed);
	return 1;
}

/* ------------------------------------------------------------ get */

/* With verify: the bytes delivered are the object's, or MC_ECHECKSUM. */
static void check(struct agent_item *it, uint32_t crc)
{
	if (!it->err && it->has_crc && crc != it->crc)
		it->err = MC_ECHECKSUM;
}

/* The remote items' reads, added to x (created when one is needed, as
 * put_add_remote does in op_put.c). */
static void get_add_remote(struct agent_req *r, struct agent_xfer **x, bool loop)
{
	for (size_t i = 0; i < r->n; i++) {
		struct agent_item *it = &r->items[i];
		if (it->err || it->nrep == 0 || !it->ptr || it->reps[0].local || it->scratch ||
		    it->ssd_own || !it->size ||
		    it->where == MOONCAKE__CLIENT__GET_RESULT__WHERE__MAPPED)
			continue;
		if (!*x && !(*x = loop ? agent__xfer_new_loop() : agent__xfer_new())) {
			it->err = -ENOMEM;
			continue;
		}
		if (it->has_crc && (r->msg->get->verify || it->ssd_hold))
			agent__xfer_add_summed(r->a, *x, it->reps[0].segment, it->ptr,
					       it->reps[0].address, it->size, &it->err,
					       &it->got_crc);
		else
			agent__xfer_add(r->a, *x, it->reps[0].segment, false, it->ptr,
					it->reps[0].address, it->size, &it->err);
	}
}

/* The local items' copies, and the checks of those the client reads
 * through its mapping of the segment. */
static void get_copy_local(struct agent_req *r)
{
	struct agent *a = r->a;
	bool verify = r->msg->get->verify;
	for (size_t i = 0; i < r->n; i++) {
		struct agent_item *it = &r->items[i];
		if (it->err || it->nrep == 0)
			continue;
		const struct agent_rep *rep = &it->reps[0];
		if (it->where == MOONCAKE__CLIENT__GET_RESULT__WHERE__MAPPED) {
			/* The client reads the segment itself: check the
			 * bytes it will see. */
			if (verify && it->has_crc)
				check(it, crc32c(0, a->seg->addr + rep->offset, it->size));
			continue;
		}
		if (it->promo)
			memcpy(a->seg->addr + it->promo_off,
			       it->scratch ? it->scratch : it->ptr,
			       it->size); /* (checked already) */
		if (it->ptr && it->scratch) {
			memcpy(it->ptr, it->scratch, it->size); /* checked already */
			continue;
		}
		if (!it->ptr || !rep->local)
			continue;
		uint32_t crc;
		it->err = agent__op_local_io(a, rep, it->ptr, it->size, false,
					     verify ? &crc : NULL, r->solo ? &a->pool : NULL);
		if (verify)
			check(it, crc);
	}
}

/* After the remote reads: check their bytes when asked to, and always
 * those an SSD tier's owner staged (its room is reused after a while),
 * by the sum the engine made of what landed (get_add_remote). */
static void get_check_remote(struct agent_req *r)
{
	for (size_t i = 0; i < r->n; i++) {
		struct agent_item *it = &r->items[i];
		if (!it->err && it->nrep && it->ptr && !it->reps[0].local && !it->scratch &&
		    !it->ssd_own && it->where != MOONCAKE__CLIENT__GET_RESULT__WHERE__MAPPED &&
		    (r->msg->get->verify || it->ssd_hold))
			check(it, it->got_crc);
	}
}

/* On a copy thread: the remote reads go out first as one batch, the
 * local copies run meanwhile. */
static void get_run(struct agent_job *j)
{
	struct agent_req *r = MC_CONTAINER_OF(j, struct agent_req, job);
	struct agent_xfer *x = NULL;
	get_add_remote(r, &x, false);
	if (x)
		agent__xfer_start(r->a, x);
	get_copy_local(r);
	if (x) {
		agent__xfer_finish(r->a, x);
		get_check_remote(r);
	}
}

static void get_done(struct agent_job *j);

static void get_loop_done(struct agent_job *j)
{
	get_check_remote(agent__op_end_from_loop(j));
	get_done(j);
}

/* Without a copy thread when the local copies are small
 * (start_from_loop); the loop copies up to inline_bytes of the remote
 * reads from same-host agents itself. */
static bool get_from_loop(struct agent_req *r, uint64_t inline_bytes)
{
	struct agent_xfer *x = NULL;
	get_add_remote(r, &x, true);
	if (!x)
		return false;
	agent__xfer_inline(x, inline_bytes);
	return agent__op_start_from_loop(r, x, get_copy_local, get_loop_done);
}

/* ------------------------------------------------------------ promotion */

/* A promotion's commit (one allocation with its key). */
struct promotion {
	struct agent *a;
	Mooncake__Master__BatchCommitRequest req;
	Mooncake__Master__CommitItem item, *pitem;
	size_t klen;
	uint8_t key[];
};

static void on_promoted(void *ud, int err, const char *message, const ProtobufCMessage *m)
{
	struct promotion *p = ud;
	const Mooncake__Master__BatchErrorsResponse *resp = (const void *)m;
	(void)message;
	if (!err && resp->n_errors == 1)
		err = resp->errors[0];
	if (!err)
		agent__count(&p->a->stats, AGENT_C_SSD_PROMOTIONS, 1);
	free(p);
}

/* Take put-lease space for a value read from this agent's SSD tier, to
 * copy it back to DRAM with the get's copies (none: no room). */
static void promote_take(struct agent *a, struct agent_item *it)
{
	it->promo = a->gets.promote_on_hit && it->size &&
		    agent__lease_take(a, it->size, &it->promo_off, &it->promo_gen);
}

/* The value is in the segment at promo_off (or the get failed): commit it
 * as a promotion, or give the space back. */
static void promote_end(struct agent *a, struct agent_item *it)
{
	if (!it->promo)
		return;
	it->promo = false;
	bool go = !it->err && it->promo_gen == agent__lease_gen(a) && !a->stopping;
	struct promotion *p = go ? calloc(1, sizeof(*p) + it->klen) : NULL;
	if (agent__lease_put_done(a, it->promo_off, it->size, it->promo_gen, p != NULL))
		agent__mlink_lease_drained(a);
	if (!p)
		return;
	p->a = a;
	p->klen = it->klen;
	memcpy(p->key, it->key, it->klen);
	mooncake__master__batch_commit_request__init(&p->req);
	mooncake__master__commit_item__init(&p->item);
	p->item.key.data = p->key;
	p->item.key.len = p->klen;
	p->item.offset = it->promo_off;
	p->item.size = it->size;
	p->item.crc32c = it->crc;
	p->item.checksummed = it->has_crc;
	p->item.promote = true;
	p->pitem = &p->item;
	p->req.agent_id = a->name;
	p->req.segment = a->name;
	p->req.lease_epoch = agent__lease_epoch(a);
	p->req.items = &p->pitem;
	p->req.n_items = 1;
	agent__mcall(a, "BatchCommit", &p->req.base,
		     &mooncake__master__batch_errors_response__descriptor, on_promoted, p);
}

/* ------------------------------------------------------------ get */

static void get_done(struct agent_job *j)
{
	struct agent_req *r = MC_CONTAINER_OF(j, struct agent_req, job);
	struct agent *a = r->a;
	struct agent_conn *c = r->c;
	Mooncake__Client__GetResult *res = calloc(r->n, sizeof(*res));
	Mooncake__Client__GetResult **ptrs = calloc(r->n, sizeof(*ptrs));
	if (!res || !ptrs) {
		free(res);
		free(ptrs);
		agent__op_fail(r, -ENOMEM, NULL);
		return;
	}
	int first = 0;
	for (size_t i = 0; i < r->n; i++) {
		struct agent_item *it = &r->items[i];
		mooncake__client__get_result__init(&res[i]);
		ptrs[i] = &res[i];
		res[i].error = it->err;
		res[i].size = it->size;
		if (it->err && it->nrep)
			agent__lcache_del(&a->lc, it->key, it->klen); /* a read failed */
		if (it->err && it->where == MOONCAKE__CLIENT__GET_RESULT__WHERE__MAPPED)
			agent__session_view_drop(c, it->view);
		if (it->err == MC_ECHECKSUM) {
			agent__count(&a->stats, AGENT_C_GET_BAD, 1);
			log_warn("get of a %llu-byte object from segment %s at offset %llu: "
				 "its bytes do not match its checksum",
				 (unsigned long long)it->size,
				 it->reps[0].local ? a->name : it->reps[0].segment,
				 (unsigned long long)it->reps[0].offset);
		}
		if (it->err) {
			if (!first && it->err != MC_EOBJECT_NOT_FOUND)
				first = it->err;
			continue;
		}
		res[i].where = it->where;
		res[i].offset = it->offset;
		res[i].view = it->view;
		agent__count(&a->stats, AGENT_C_BYTES_READ, it->size);
		agent__count(&a->stats,
			     it->ssd_own         ? AGENT_C_SSD_HITS
			     : it->ssd_hold      ? AGENT_C_SSD_REMOTE_HITS
			     : it->reps[0].local ? AGENT_C_LOCAL_HITS
						 : AGENT_C_REMOTE_HITS,
			     1);
	}
	Mooncake__Client__GetReply gr = MOONCAKE__CLIENT__GET_REPLY__INIT;
	gr.results = ptrs;
	gr.n_results = r->n;
	Mooncake__Client__Response resp = MOONCAKE__CLIENT__RESPONSE__INIT;
	resp.body_case = MOONCAKE__CLIENT__RESPONSE__BODY_GET;
	resp.get = &gr;
	int fds[2];
	bool own[2] = {true, true};
	unsigned nfds = 0;
	if (r->spill) {
		fds[nfds] = dup(r->spill->fd);
		if (fds[nfds] >= 0)
			nfds++;
	}
	if (r->send_segment_fd && !agent__session_closed(c)) {
		fds[nfds] = dup(a->seg_ro_fd);
		if (fds[nfds] >= 0) {
			nfds++;
			gr.segment_fd = true;
			agent__session_segment_fd_sent(c);
		}
	}
	agent__reply(r, &resp, fds, own, nfds);
	free(res);
	free(ptrs);
	for (size_t i = 0; i < r->n; i++) {
		struct agent_item *it = &r->items[i];
		if (it->ssd_hold)
			agent__peer_release(a, it->reps[0].segment, it->ssd_hold);
		promote_end(a, it);
	}
	agent__op_finish(r, first);
}

/* A big local get copied on the loop thread: when it is the only request
 * in flight and one session alone has sent requests for a while, no one
 * waits for the loop, and the copy threads' two hand-offs are saved. (A
 * put's copy also computes the checksum: puts never do this.) */
static bool solo_get(const struct agent_req *r, uint64_t bytes)
{
	const struct agent *a = r->a;
	return bytes <= AGENT_INLINE_SOLO_COPY_BYTES && agent__server_reqs(a) == 1 &&
	       agent__pool_busy(&a->pool) == 0 &&
	       r->start_ns - agent__server_solo_since_ns(a) >= AGENT_SOLO_NS;
}

/*
 * Every item has its replica (from the master or the lease cache) or an
 * error: decide where each value goes (get_place), give it memory
 * (get_fill), read what is in SSD tiers (get_ssd), then copy (get_copy).
 * Values without a destination go to the request's spill region when
 * they fit there, else to one memfd made for the reply, whose memory
 * counts against the session's reply budget from now until the reply is
 * written: a get that needs more than the session has left waits for its
 * client to read earlier replies.
 */

static void get_fill(struct agent_req *r);
static void get_ssd(struct agent_req *r);

static void on_spill_room(struct agent_wait *w, int err)
{
	struct agent_req *r = MC_CONTAINER_OF(w, struct agent_req, wait);
	if (err) {
		agent__op_fail(r, err, NULL); /* the session closed */
		return;
	}
	get_fill(r);
}

/* Where each item's value goes (items placed before keep their place):
 * a zero-copy view of the segment when asked and local, else its
 * destination, the staging spill area, or one new memfd attached to the
 * reply. A value read from this agent's SSD tier gets a spill slot the
 * tier can read into (aligned, whole blocks). */
static void get_place(struct agent_req *r)
{
	struct agent *a = r->a;
	struct agent_conn *c = r->c;
	const Mooncake__Client__GetRequest *g = r->msg->get;
	uint64_t spill_total = 0;
	for (size_t i = 0; i < r->n; i++) {
		struct agent_item *it = &r->items[i];
		if (it->err || it->nrep == 0 || it->placed)
			continue;
		const struct agent_rep *rep = &it->reps[0];
		if (it->zero_copy && rep->local && !agent__session_closed(c)) {
			if (rep->offset > a->seg->len ||
			    it->size > a->seg->len - rep->offset) {
				it->err = MC_EINVALID_REPLICA;
				continue;
			}
			it->err = agent__session_view_add(c, it->key, it->klen, rep->offset,
							  it->size, &it->view);
			if (it->err)
				continue;
			it->placed = true;
			it->where = MOONCAKE__CLIENT__GET_RESULT__WHERE__MAPPED;
			it->offset = rep->offset;
			if (!agent__session_has_segment_fd(c))
				r->send_segment_fd = true;
			continue;
		}
		if (it->has_dest) {
			if (it->size <= it->len) {
				it->where = MOONCAKE__CLIENT__GET_RESULT__WHERE__DEST;
				it->offset = 0;
			} else if (!g->spill_if_too_small) {
				it->err = -ENOBUFS;
				continue;
			} else {
				it->has_dest = false;
			}
		}
		if (!it->has_dest) {
			uint64_t align = AGENT_SPILL_ALIGN, len = it->size;
			if (rep->ssd && strcmp(rep->segment, a->name) == 0) {
				align = agent__tier_block(a);
				len = agent__tier_io_len(it->size);
			}
			spill_total = (spill_total + align - 1) & ~(align - 1);
			it->where = MOONCAKE__CLIENT__GET_RESULT__WHERE__SPILL;
			it->offset = spill_total;
			it->len = len;
			spill_total += (len + AGENT_SPILL_ALIGN - 1) &
				       ~(uint64_t)(AGENT_SPILL_ALIGN - 1);
		}
	}
	r->spill_len = spill_total;
	uint8_t *base;
	if (spill_total == 0 || (g->spill && spill_total <= g->spill->length &&
				 agent__op_region(r, g->spill, &base) == 0))
		r->spill_len = 0; /* no memfd to make */
	if (r->spill_len &&
	    agent__session_reserve(r, r->spill_len, &r->wait, on_spill_room) == 1)
		return; /* on_spill_room goes on */
	get_fill(r);
}

/* The items placed now get their memory; then the reads of SSD tiers,
 * then the copies. */
static void get_fill(struct agent_req *r)
{
	struct agent *a = r->a;
	const Mooncake__Client__GetRequest *g = r->msg->get;
	/* Place the items without a destination. */
	uint8_t *spill_base = NULL;
	int where = MOONCAKE__CLIENT__GET_RESULT__WHERE__SPILL;
	uint64_t spill_off = 0;
	if (r->spill_len == 0) {
		bool any = false;
		for (size_t i = 0; i < r->n && !any; i++)
			any = !r->items[i].err && r->items[i].nrep && !r->items[i].placed &&
			      r->items[i].where == MOONCAKE__CLIENT__GET_RESULT__WHERE__SPILL;
		if (any && agent__op_region(r, g->spill, &spill_base) == 0) {
			where = MOONCAKE__CLIENT__GET_RESULT__WHERE__STAGING;
			spill_off = g->spill->offset;
		}
	} else {
		struct agent_memfd_opts mo = {
			.name = "mooncake-get",
			.len = r->spill_len,
			.hugepages = AGENT_HUGEPAGES_OFF,
			.numa_node = -1,
		};
		int rc = agent__memfd_new(a, &mo, &r->spill);
		if (rc) {
			for (size_t i = 0; i < r->n; i++)
				if (!r->items[i].err && r->items[i].nrep &&
				    !r->items[i].placed && r->items[i].where == where)
					r->items[i].err = rc;
		} else {
			spill_base = r->spill->addr;
		}
	}
	for (size_t i = 0; i < r->n; i++) {
		struct agent_item *it = &r->items[i];
		if (it->err || it->nrep == 0 || it->placed)
			continue;
		it->placed = true;
		if (it->where == MOONCAKE__CLIENT__GET_RESULT__WHERE__SPILL) {
			if (!spill_base) {
				it->err = -ENOMEM;
				continue;
			}
			it->ptr = spill_base + it->offset;
			it->offset += spill_off;
			it->where = where;
		}
	}
	get_ssd(r);
}

/*
 * Every item has its place and its bytes where they can be copied from
 * (a local replica, a read of this agent's SSD tier, a remote replica or
 * another agent's bounce region): copy. Small copies run on the loop, a
 * big local one too when its session is alone (solo_get), the rest on a
 * copy thread; remote reads start from the loop when the local work is
 * small.
 */
static void get_copy(struct agent_req *r)
{
	struct agent *a = r->a;
	const Mooncake__Client__GetRequest *g = r->msg->get;
	uint64_t bytes = 0;
	bool remote = false;
	uint64_t remote_bytes = 0;
	for (size_t i = 0; i < r->n; i++) {
		struct agent_item *it = &r->items[i];
		if (it->err || it->nrep == 0)
			continue;
		const struct agent_rep *rep = &it->reps[0];
		if (it->where == MOONCAKE__CLIENT__GET_RESULT__WHERE__MAPPED) {
			if (g->verify)
				bytes += it->size; /* checked on a copy thread */
			continue;
		}
		if (it->size > it->len) {
			it->err = -ENOBUFS; /* (asked again: another object now) */
			continue;
		}
		if (it->ssd_own) {
			bytes += it->scratch ? it->size : 0; /* (read in place otherwise) */
			promote_take(a, it);
			bytes += it->promo ? it->size : 0;
			continue;
		}
		if (rep->local || it->scratch)
			bytes += it->size;
		else
			remote_bytes += it->size;
		remote |= !rep->local && !it->scratch;
	}
	r->job.run = get_run;
	r->job.done = get_done;
	if (!remote && (bytes <= AGENT_INLINE_COPY_BYTES || (r->solo = solo_get(r, bytes)))) {
		get_run(&r->job);
		get_done(&r->job);
		return;
	}
	/* Remote reads move on the engine's threads, which also sum what
	 * they read (get_add_remote): start them from here unless local
	 * copies or checks are big work for the loop. */
	if (remote && bytes <= AGENT_INLINE_COPY_BYTES &&
	    get_from_loop(r, solo_get(r, remote_bytes) ? remote_bytes : 0))
		return;
	agent__pool_submit(&a->pool, &r->job);
}

/* The end of the window in which a read lease granted with lease_ttl_ms
 * answers gets from the cache (lcache.c): half the lease, counted from
 * when the call was sent (the grant came later); 0 without a lease. */
static uint64_t lease_window_end(struct agent *a, uint64_t sent_ms, uint64_t lease_ttl_ms)
{
	if (!lease_ttl_ms)
		return 0;
	set_lease_ttl(a, lease_ttl_ms);
	return sent_ms + lease_ttl_ms / 2;
}

/* ------------------------------------------------------------ SSD tiers */

static void get_lookup(struct agent_req *r);

/* An item's replicas and bytes read so far go: the master is asked
 * again. */
static void forget_replicas(struct agent *a, struct agent_item *it)
{
	for (unsigned k = 0; k < it->nrep; k++)
		free(it->reps[k].segment);
	free(it->reps);
	it->reps = NULL;
	it->nrep = 0;
	agent__tier_buf_free(a, it->scratch);
	it->scratch = NULL;
	it->err = 0;
}

/* One read of an SSD tier for item i of r. */
struct ssd_read {
	struct agent_req *r;
	size_t i;
};

/* The last SSD read ended: ask the master again for the items whose
 * replica was gone, else copy. */
static void ssd_read_end(struct agent_req *r)
{
	if (--r->ssd_pending)
		return;
	for (size_t i = 0; i < r->n; i++)
		if (!r->items[i].err && r->items[i].nrep == 0) {
			get_lookup(r);
			return;
		}
	get_copy(r);
}

/* An SSD replica was gone: the item asks the master again (once). */
static void ssd_again(struct agent *a, struct agent_item *it)
{
	if (it->ssd_again) {
		it->err = MC_EOBJECT_NOT_FOUND;
		return;
	}
	it->ssd_again = true;
	forget_replicas(a, it);
	it->ssd_own = false;
}

static void on_ssd_read(void *ud, int err, const struct agent_tier_obj *o)
{
	struct ssd_read *x = ud;
	struct agent_req *r = x->r;
	struct agent_item *it = &r->items[x->i];
	free(x);
	/* Gone, or another object's bytes under the key. */
	bool gone = err == MC_EOBJECT_NOT_FOUND ||
		    (!err && (o->size != it->size || (it->has_crc && o->crc != it->crc)));
	if (gone && it->ssd_cached) {
		/* The cached replica is stale: the master is asked, and a
		 * replica it names may still be gone once. */
		agent__lcache_del(&r->a->lc, it->key, it->klen);
		it->ssd_cached = false;
		forget_replicas(r->a, it);
		it->ssd_own = false;
	} else if (gone) {
		ssd_again(r->a, it);
	} else if (err) {
		it->err = err;
	}
	ssd_read_end(r);
}

/* Read through a buffer and copied into the item's place: the buffer
 * goes back before anything else runs (copies and promotions take the
 * bytes from the place). */
static void on_ssd_read_copied(void *ud, int err, const struct agent_tier_obj *o)
{
	struct ssd_read *x = ud;
	struct agent_item *it = &x->r->items[x->i];
	agent__tier_buf_free(x->r->a, it->scratch);
	it->scratch = NULL;
	on_ssd_read(ud, err, o);
}

static void on_peer_staged(void *ud, int err, uint64_t address, uint64_t hold)
{
	struct ssd_read *x = ud;
	struct agent_req *r = x->r;
	struct agent_item *it = &r->items[x->i];
	free(x);
	if (err == MC_EOBJECT_NOT_FOUND) {
		ssd_again(r->a, it);
	} else if (err) {
		it->err = err;
	} else {
		/* A remote replica now: the owner's bounce region. */
		it->reps[0].ssd = false;
		it->reps[0].address = address;
		it->ssd_hold = hold;
	}
	ssd_read_end(r);
}

/* Start the reads of the items whose nearest replica is in an SSD tier;
 * the copies follow when they are over (at once when there are none). */
static void get_ssd(struct agent_req *r)
{
	struct agent *a = r->a;
	r->ssd_pending = 1; /* (held until every read is started) */
	for (size_t i = 0; i < r->n; i++) {
		struct agent_item *it = &r->items[i];
		if (it->err || it->nrep == 0 || !it->reps[0].ssd || it->ssd_own)
			continue; /* (read already, when another item asked again) */
		if (it->size > it->len) {
			it->err = -ENOBUFS; /* (asked again: another object now) */
			continue;
		}
		struct ssd_read *x = malloc(sizeof(*x));
		if (!x) {
			it->err = -ENOMEM;
			continue;
		}
		x->r = r;
		x->i = i;
		if (strcmp(it->reps[0].segment, a->name) != 0) {
			r->ssd_pending++;
			agent__peer_read(a, it->reps[0].segment, it->key, it->klen, it->size,
					 on_peer_staged, x);
			continue;
		}
		it->ssd_own = true;
		/* Into its place when the tier can read there (aligned, whole
		 * blocks of room) and it is on huge pages or the tier has no
		 * staging memory, else into a buffer copied from after. */
		uint64_t io_len = agent__tier_io_len(it->size);
		bool in_place = it->ptr && (uintptr_t)it->ptr % agent__tier_block(a) == 0 &&
				it->len >= io_len;
		uint8_t *buf = NULL;
		if (!in_place || !agent__req_huge(r, it->ptr))
			buf = it->scratch = agent__tier_buf(a, it->size, in_place);
		if (!buf && in_place)
			buf = it->ptr; /* (staging full) */
		/* Through a buffer into a place: copied there as it is
		 * checked, the buffer given back at once. */
		bool copy = buf && buf == it->scratch && it->ptr;
		int rc = !buf   ? -ENOMEM
			 : copy ? agent__tier_read_copy(a, it->key, it->klen, buf, io_len,
							it->ptr, it->len, on_ssd_read_copied,
							x)
				: agent__tier_read(a, it->key, it->klen, buf, io_len,
						   on_ssd_read, x);
		if (rc == 0) {
			r->ssd_pending++;
			continue;
		}
		free(x);
		if (rc == MC_EOBJECT_NOT_FOUND)
			ssd_again(r->a, it);
		else
			it->err = rc;
	}
	ssd_read_end(r);
}

/* The nearest replica first: this agent's DRAM segment, another DRAM
 * segment, this agent's SSD tier, another's. */
static unsigned rank(const struct agent *a, const struct agent_rep *p)
{
	return p->local ? 0 : !p->ssd ? 1 : strcmp(p->segment, a->name) == 0 ? 2 : 3;
}

static void on_get_replicas(void *ud, int err, const char *message, const ProtobufCMessage *m)
{
	struct agent_req *r = ud;
	struct agent *a = r->a;
	struct agent_keys_block *b = r->mstate;
	const Mooncake__Master__BatchGetReplicasResponse *resp =
		(const Mooncake__Master__BatchGetReplicasResponse *)m;
	(void)message;
	uint64_t now = mc_now_ms();
	uint64_t until = err ? 0 : lease_window_end(a, r->sent_ms, resp->lease_ttl_ms);
	for (size_t k = 0; k < b->req.n_keys; k++) {
		struct agent_item *it = &r->items[b->idx[k]];
		if (err) {
			it->err = err;
			continue;
		}
		if (k >= resp->n_results) {
			it->err = MC_EPROTOCOL;
			continue;
		}
		const Mooncake__Master__GetReplicasResult *res = resp->results[k];
		if (res->error) {
			it->err = res->error;
			if (res->error == MC_EOBJECT_NOT_FOUND)
				agent__count(&a->stats, AGENT_C_MISSES, 1);
			continue;
		}
		if (res->n_replicas == 0) {
			it->err = MC_EOBJECT_NOT_FOUND;
			continue;
		}
		it->size = res->size;
		it->crc = res->crc32c;
		it->has_crc = res->checksummed;
		if (agent__op_replicas(a, it, res->replicas, res->n_replicas) != 0) {
			it->err = -ENOMEM;
			continue;
		}
		/* Nearest replica first. */
		for (unsigned p = 1; p < it->nrep; p++)
			if (rank(a, &it->reps[p]) < rank(a, &it->reps[0])) {
				struct agent_rep t = it->reps[0];
				it->reps[0] = it->reps[p];
				it->reps[p] = t;
			}
		/* An object in this agent's own SSD tier is cached (its read
		 * checks its size and checksum; one gone meanwhile asks the
		 * master again) unless a hit moves it to DRAM; another agent's
		 * is read by its owner and not cached. */
		bool own_ssd = it->reps[0].ssd && !a->gets.promote_on_hit &&
			       strcmp(it->reps[0].segment, a->name) == 0;
		if (it->reps[0].ssd && !own_ssd)
			continue;
		/* Local replicas are cached (nobody but the master's
		 * placements writes this segment, and the cache is emptied
		 * whenever the segment is mounted again), and small ones
		 * elsewhere whose bytes can be checked (get_probe). */
		if (own_ssd || it->reps[0].local ||
		    (it->has_crc && it->size > 0 && it->size <= a->gets.remote_cache_bytes))
			agent__lcache_put(&a->lc, it->key, it->klen, it->size,
					  it->has_crc ? &it->crc : NULL, &it->reps[0], until,
					  now);
	}
	get_place(r);
}

/* A background renewal of one cached lease (lcache.c): the call, and the
 * key it names (one allocation, freed by the callback). */
struct lease_renewal {
	struct agent *a;
	unsigned gen; /* agent__lease_gen when sent: a mount empties the cache */
	uint64_t sent_ms;
	Mooncake__Master__BatchKeysRequest req;
	ProtobufCBinaryData key;
	uint8_t kbuf[];
};

static void on_lease_renewed(void *ud, int err, const char *message, const ProtobufCMessage *m)
{
	struct lease_renewal *w = ud;
	struct agent *a = w->a;
	const Mooncake__Master__BatchGetReplicasResponse *resp = (const void *)m;
	(void)message;
	/* On an error the entry keeps its window and expires as before. */
	if (err || a->stopping || w->gen != agent__lease_gen(a) || resp->n_results != 1) {
		free(w);
		return;
	}
	const Mooncake__Master__GetReplicasResult *res = resp->results[0];
	uint64_t now = mc_now_ms();
	if (res->error || !resp->lease_ttl_ms) {
		agent__lcache_del(&a->lc, w->key.data, w->key.len);
		free(w);
		return;
	}
	uint64_t until = lease_window_end(a, w->sent_ms, resp->lease_ttl_ms);
	const struct agent_lentry *e = agent__lcache_peek(&a->lc, w->key.data, w->key.len);
	const char *seg = !e ? NULL : e->rep.local ? a->name : e->rep.segment;
	uint64_t offset = UINT64_MAX;
	for (size_t k = 0; seg && k < res->n_replicas; k++) {
		const Mooncake__Master__Replica *p = res->replicas[k];
		/* (An SSD replica is cached under its owner's name.) */
		bool ssd = p->tier == MOONCAKE__MASTER__TIER__TIER_SSD;
		const char *name = ssd ? p->agent_id : p->segment;
		if (ssd == e->rep.ssd && name && strcmp(name, seg) == 0)
			offset = p->offset;
	}
	agent__lcache_extend(&a->lc, w->key.data, w->key.len, offset, res->size, until, now);
	free(w);
}

/* Renew the read lease of a cached key in the background. */
static void renew_lease(struct agent *a, const uint8_t *key, size_t klen, uint64_t now)
{
	struct lease_renewal *w = malloc(sizeof(*w) + klen);
	if (!w)
		return; /* the entry expires as before */
	w->a = a;
	w->gen = agent__lease_gen(a);
	w->sent_ms = now;
	memcpy(w->kbuf, key, klen);
	w->key.data = w->kbuf;
	w->key.len = klen;
	mooncake__master__batch_keys_request__init(&w->req);
	w->req.keys = &w->key;
	w->req.n_keys = 1;
	agent__count(&a->stats, AGENT_C_LEASE_RENEWALS, 1);
	agent__bcall(a, AGENT_B_GET, &w->req.base, on_lease_renewed, w);
}

static bool item_uncached(const struct agent_item *it)
{
	return it->err == 0 && it->nrep == 0;
}

/* The items without a replica yet ask the master, then the get goes on;
 * at once when every item has one (or an error). */
static void get_lookup(struct agent_req *r)
{
	size_t uncached = 0;
	for (size_t i = 0; i < r->n; i++)
		uncached += item_uncached(&r->items[i]);
	if (uncached == 0) {
		get_place(r);
		return;
	}
	struct agent_keys_block *b = agent__op_keys_block(r, item_uncached);
	if (!b) {
		agent__op_fail(r, -ENOMEM, NULL);
		return;
	}
	agent__op_set_mstate(r, b);
	r->sent_ms = mc_now_ms();
	agent__bcall(r->a, AGENT_B_GET, &b->req.base, on_get_replicas, r);
}

/* Leave a probed item to the master. */
static void unprobe(struct agent *a, struct agent_item *it)
{
	forget_replicas(a, it);
	it->probing = false;
}

/* A probed item is not to be trusted after all: forget its entry, and let
 * the master say where the key is. */
static void probe_miss(struct agent_req *r, struct agent_item *it)
{
	agent__lcache_del(&r->a->lc, it->key, it->klen);
	agent__count(&r->a->stats, AGENT_C_LEASE_CACHE_STALE, 1);
	unprobe(r->a, it);
}

static void get_probe_done(struct agent_job *j)
{
	struct agent_req *r = agent__op_end_from_loop(j);
	for (size_t i = 0; i < r->n; i++) {
		struct agent_item *it = &r->items[i];
		if (!it->probing)
			continue;
		if (it->err || it->got_crc != it->crc) {
			probe_miss(r, it);
			continue;
		}
		it->probing = false;
		agent__count(&r->a->stats, AGENT_C_LEASE_CACHE_HITS, 1);
	}
	get_lookup(r);
}

/*
 * Items whose cached replica is on another agent's segment: read their
 * bytes into scratch buffers from the loop, check them against the
 * checksum, then go on (get_probe_done). False — the probes undone, the
 * items left to the master — when they are more bytes than the loop
 * should check (AGENT_PROBE_MAX_BYTES), a segment is not open in the
 * engine yet or memory is short.
 */
static bool get_probe(struct agent_req *r, uint64_t bytes)
{
	struct agent_xfer *x = bytes <= AGENT_PROBE_MAX_BYTES ? agent__xfer_new_loop() : NULL;
	bool ok = x != NULL;
	for (size_t i = 0; ok && i < r->n; i++) {
		struct agent_item *it = &r->items[i];
		if (!it->probing)
			continue;
		it->scratch = malloc(it->size);
		if (!it->scratch) {
			ok = false;
			break;
		}
		agent__xfer_add_summed(r->a, x, it->reps[0].segment, it->scratch,
				       it->reps[0].address, it->size, &it->err, &it->got_crc);
	}
	if (ok && !agent__xfer_missed(x)) {
		r->xfer = x;
		r->job.done = get_probe_done;
		if (agent__xfer_start_loop(r->a, x, &r->job))
			agent__pool_done_now(&r->a->pool, &r->job);
		return true;
	}
	if (x)
		agent__xfer_finish(r->a, x);
	for (size_t i = 0; i < r->n; i++)
		if (r->items[i].probing)
			unprobe(r->a, &r->items[i]);
	return false;
}

void agent__op_get(struct agent_req *r)
{
	struct agent *a = r->a;
	const Mooncake__Client__GetRequest *g = r->msg->get;
	if (agent__op_items(r, g->n_items)) {
		agent__op_fail(r, -ENOMEM, NULL);
		return;
	}
	uint64_t now = mc_now_ms();
	uint64_t probes = 0; /* bytes */
	for (size_t i = 0; i < g->n_items; i++) {
		struct agent_item *it = &r->items[i];
		const Mooncake__Client__GetItem *gi = g->items[i];
		it->key = gi->key.data;
		it->klen = gi->key.len;
		it->zero_copy = gi->zero_copy;
		agent__count(&a->stats, AGENT_C_GETS, 1);
		if (!agent__key_ok(&gi->key)) {
			it->err = -EINVAL;
			continue;
		}
		if (gi->dest) {
			it->has_dest = true;
			it->len = gi->dest->length;
			it->err = agent__op_region(r, gi->dest, &it->ptr);
			if (it->err)
				continue;
		}
		bool renew;
		const struct agent_lentry *e = agent__lcache_get(&a->lc, it->key, it->klen,
								 now, &renew);
		if (renew)
			renew_lease(a, it->key, it->klen, now);
		if (e) {
			it->reps = calloc(1, sizeof(*it->reps));
			if (!it->reps) {
				it->err = -ENOMEM;
				continue;
			}
			it->reps[0] = e->rep;
			it->reps[0].segment = e->rep.local ? NULL : strdup(e->rep.segment);
			if (!e->rep.local && !it->reps[0].segment) {
				it->err = -ENOMEM;
				continue;
			}
			it->nrep = 1;
			it->size = e->size;
			it->crc = e->crc;
			it->has_crc = e->has_crc;
			it->probing = !e->rep.local && !e->rep.ssd;
			it->ssd_cached = e->rep.ssd;
			probes += it->probing ? it->size : 0;
			if (!it->probing)
				agent__count(&a->stats, AGENT_C_LEASE_CACHE_HITS, 1);
		}
	}
	if (probes && get_probe(r, probes))
		return;
	get_lookup(r);
}

/* ------------------------------------------------------------ views */

struct renew_block {
	Mooncake__Master__BatchKeysRequest req;
	struct agent *a;
	size_t n, cap;
	ProtobufCBinaryData *keys;
	uint8_t **owned;
};

static void collect_view(void *ud, const struct agent_view *v)
{
	struct renew_block *b = ud;
	if (b->n == b->cap) {
		size_t cap = b->cap ? b->cap * 2 : 64;
		ProtobufCBinaryData *k = realloc(b->keys, cap * sizeof(*k));
		if (!k)
			return;
		b->keys = k;
		uint8_t **o = realloc(b->owned, cap * sizeof(*o));
		if (!o)
			return;
		b->owned = o;
		b->cap = cap;
	}
	uint8_t *copy = malloc(v->klen);
	if (!copy)
		return;
	memcpy(copy, v->key, v->klen);
	b->owned[b->n] = copy;
	b->keys[b->n].data = copy;
	b->keys[b->n].len = v->klen;
	b->n++;
}

static void renew_free(struct renew_block *b)
{
	for (size_t i = 0; i < b->n; i++)
		free(b->owned[i]);
	free(b->owned);
	free(b->keys);
	free(b);
}

static void on_renewed(void *ud, int err, const char *message, const ProtobufCMessage *m)
{
	struct renew_block *b = ud;
	struct agent *a = b->a;
	const Mooncake__Master__BatchGetReplicasResponse *resp =
		(const Mooncake__Master__BatchGetReplicasResponse *)m;
	a->gets.view_renew_busy = false;
	if (err) {
		if (err != MC_ECANCELLED)
			log_warn("cannot renew the read leases of %zu zero-copy views: %s",
				 b->n, message ? message : mc_strerror(err));
	} else {
		if (resp->lease_ttl_ms)
			set_lease_ttl(a, resp->lease_ttl_ms);
		for (size_t i = 0; i < resp->n_results && i < b->n; i++)
			if (resp->results[i]->error == MC_EOBJECT_NOT_FOUND)
				log_warn("a zero-copy view's object is gone from the "
					 "index (removed with force, or its agent "
					 "left); its bytes may be reused");
	}
	renew_free(b);
}

static void renew_views(struct agent *a)
{
	uint64_t clients, buffers, views;
	agent__server_counts(a, &clients, &buffers, &views);
	if (a->gets.view_renew_busy || views == 0)
		return;
	struct renew_block *b = calloc(1, sizeof(*b));
	if (!b)
		return;
	b->a = a;
	agent__views_foreach(a, collect_view, b);
	if (b->n == 0) {
		renew_free(b);
		return;
	}
	mooncake__master__batch_keys_request__init(&b->req);
	b->req.keys = b->keys;
	b->req.n_keys = b->n;
	a->gets.view_renew_busy = true;
	agent__mcall(a, "BatchGetReplicas", &b->req.base,
		     &mooncake__master__batch_get_replicas_response__descriptor, on_renewed,
		     b);
}
