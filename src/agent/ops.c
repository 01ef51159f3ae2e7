/*
 * ops: what the agent does for each client request.
 *
 *   get       BatchGetReplicas (grants the read lease) -> per item the
 *             nearest replica (this agent's segment first): a zero-copy
 *             view of the segment when asked and local, else a copy into
 *             the item's destination, the staging spill area, or one new
 *             memfd attached to the reply; with verify, the bytes are
 *             checked against the object's checksum -> reply.
 *   exist, remove, remove_all: the master's batch calls.
 *   buffers   register (checked client memfd), unregister, alloc (agent
 *             memfd); transfer moves bytes between client memory and a
 *             segment address; stats; release of views.
 *
 * Request state lives in struct agent_req; master requests are built in
 * one malloc'd block (r->mstate) that lives until the request ends, since
 * a redirected call is sent again.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent/agent_int.h"
#include "agent/xfer.h"
#include "agent/req.h"
#include "agent/batch.h"
#include "agent/mcall.h"
#include "agent/mirror.h"
#include "agent/mlink.h"
#include "agent/op.h"
#include "agent/server.h"
#include "agent/space.h"
#include "common/crc32c.h"
#include "common/log.h"
#include "common/util.h"
#include "transfer/transfer.h"

#define LOG_SUBSYS LOGS_AGENT

/* ------------------------------------------------------------ hello */

static void op_hello(struct agent_req *r)
{
	struct agent *a = r->a;
	struct agent_conn *c = r->c;
	const Mooncake__Client__Hello *h = r->msg->hello;
	if (h->version != AGENT_PROTOCOL_VERSION) {
		char why[96];
		snprintf(why, sizeof(why), "protocol version %u is not supported (this "
			 "agent speaks %u)", h->version, AGENT_PROTOCOL_VERSION);
		log_warn("client %s: %s", agent__session_name(c), why);
		agent__reply_error(r, MC_EPROTOCOL, why);
		agent__op_finish(r, MC_EPROTOCOL);
		return;
	}
	uint64_t want = h->staging_size ? h->staging_size : a->staging_bytes;
	if (want > a->staging_bytes)
		want = a->staging_bytes;
	if (want < 4096)
		want = 4096;
	struct agent_memfd_opts mo = {
		.name = "mooncake-staging",
		.len = want,
		.hugepages = AGENT_HUGEPAGES_OFF,
		.numa_node = a->numa_node,
	};
	struct agent_map *m;
	int rc = agent__memfd_new(a, &mo, &m);
	if (rc) {
		agent__op_fail(r, rc, "cannot create the staging buffer");
		return;
	}
	int fd = dup(m->fd);
	if (fd < 0) {
		agent__map_unref(m);
		agent__op_fail(r, -errno, "cannot pass the staging buffer");
		return;
	}
	agent__session_hello(c, h->client_name, m);
	Mooncake__Client__HelloReply hr = MOONCAKE__CLIENT__HELLO_REPLY__INIT;
	hr.version = AGENT_PROTOCOL_VERSION;
	hr.staging_size = m->len;
	hr.agent_id = a->name;
	hr.segment = a->name;
	hr.segment_size = a->seg->len;
	hr.max_frame = MC_UFRAME_MAX_BYTES;
	hr.lease_ttl_ms = a->lease_ttl_ms;
	hr.rpc_address = a->name;
	Mooncake__Client__Response resp = MOONCAKE__CLIENT__RESPONSE__INIT;
	resp.body_case = MOONCAKE__CLIENT__RESPONSE__BODY_HELLO;
	resp.hello = &hr;
	bool own = true;
	log_debug("client %s: session started, staging %llu bytes", agent__session_name(c),
		  (unsigned long long)m->len);
	agent__reply(r, &resp, &fd, &own, 1);
	agent__op_finish(r, 0);
}

/* ------------------------------------------------------------ get */

/* With verify: the bytes delivered are the object's, or MC_ECHECKSUM. */
static void check(struct agent_item *it, uint32_t crc)
{
	if (!it->err && it->has_crc && crc != it->crc)
		it->err = MC_ECHECKSUM;
}

/* The remote items' reads, added to x (created when one is needed, as
 * put_add_remote does). */
static void get_add_remote(struct agent_req *r, struct agent_xfer **x, bool loop)
{
	for (size_t i = 0; i < r->n; i++) {
		struct agent_item *it = &r->items[i];
		if (it->err || it->nrep == 0 || !it->ptr || it->reps[0].local || it->scratch ||
		    !it->size || it->where == MOONCAKE__CLIENT__GET_RESULT__WHERE__MAPPED)
			continue;
		if (!*x && !(*x = loop ? agent__xfer_new_loop() : agent__xfer_new())) {
			it->err = -ENOMEM;
			continue;
		}
		agent__xfer_add(r->a, *x, it->reps[0].segment, false, it->ptr, it->reps[0].address,
				it->size, &it->err);
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
		if (it->ptr && it->scratch) {
			memcpy(it->ptr, it->scratch, it->size); /* checked already */
			continue;
		}
		if (!it->ptr || !rep->local)
			continue;
		uint32_t crc;
		it->err = agent__op_local_io(a, rep, it->ptr, it->size, false, verify ? &crc : NULL,
				   r->solo ? &a->pool : NULL);
		if (verify)
			check(it, crc);
	}
}

/* After the remote reads: check their bytes when asked to. */
static void get_check_remote(struct agent_req *r)
{
	for (size_t i = 0; r->msg->get->verify && i < r->n; i++) {
		struct agent_item *it = &r->items[i];
		if (!it->err && it->nrep && it->ptr && !it->reps[0].local && !it->scratch &&
		    it->where != MOONCAKE__CLIENT__GET_RESULT__WHERE__MAPPED)
			check(it, crc32c(0, it->ptr, it->size));
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
		agent__count(&a->stats, it->reps[0].local ? AGENT_C_LOCAL_HITS : AGENT_C_REMOTE_HITS, 1);
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
	       agent__pool_pending(&a->pool) == 0 &&
	       r->start_ns - agent__server_solo_since_ns(a) >= AGENT_SOLO_NS;
}

/*
 * Every item has its replica (from the master or the lease cache) or an
 * error: decide where each value goes, then copy.
 */

static void get_place_and_copy(struct agent_req *r)
{
	struct agent *a = r->a;
	struct agent_conn *c = r->c;
	const Mooncake__Client__GetRequest *g = r->msg->get;
	uint64_t spill_total = 0;
	uint64_t bytes = 0;
	bool remote = false;
	uint64_t remote_bytes = 0;
	for (size_t i = 0; i < r->n; i++) {
		struct agent_item *it = &r->items[i];
		if (it->err || it->nrep == 0)
			continue;
		const struct agent_rep *rep = &it->reps[0];
		if (it->zero_copy && rep->local && !agent__session_closed(c)) {
			if (rep->offset > a->seg->len || it->size > a->seg->len - rep->offset) {
				it->err = MC_EINVALID_REPLICA;
				continue;
			}
			it->err = agent__session_view_add(c, it->key, it->klen, rep->offset,
							  it->size, &it->view);
			if (it->err)
				continue;
			it->where = MOONCAKE__CLIENT__GET_RESULT__WHERE__MAPPED;
			it->offset = rep->offset;
			if (!agent__session_has_segment_fd(c))
				r->send_segment_fd = true;
			if (g->verify)
				bytes += it->size; /* checked on a copy thread */
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
			it->where = MOONCAKE__CLIENT__GET_RESULT__WHERE__SPILL;
			it->offset = spill_total;
			spill_total += (it->size + AGENT_SPILL_ALIGN - 1) &
				       ~(uint64_t)(AGENT_SPILL_ALIGN - 1);
		}
		if (rep->local || it->scratch)
			bytes += it->size;
		else
			remote_bytes += it->size;
		remote |= !rep->local && !it->scratch;
	}
	/* Place the items without a destination. */
	uint8_t *spill_base = NULL;
	int where = MOONCAKE__CLIENT__GET_RESULT__WHERE__SPILL;
	uint64_t spill_off = 0;
	if (spill_total > 0 && g->spill && spill_total <= g->spill->length &&
	    agent__op_region(r, g->spill, &spill_base) == 0) {
		where = MOONCAKE__CLIENT__GET_RESULT__WHERE__STAGING;
		spill_off = g->spill->offset;
	} else if (spill_total > 0) {
		struct agent_memfd_opts mo = {
			.name = "mooncake-get",
			.len = spill_total,
			.hugepages = AGENT_HUGEPAGES_OFF,
			.numa_node = -1,
		};
		int rc = agent__memfd_new(a, &mo, &r->spill);
		if (rc) {
			for (size_t i = 0; i < r->n; i++)
				if (!r->items[i].err && !r->items[i].has_dest &&
				    r->items[i].where == where)
					r->items[i].err = rc;
		} else {
			spill_base = r->spill->addr;
		}
	}
	for (size_t i = 0; i < r->n; i++) {
		struct agent_item *it = &r->items[i];
		if (it->err || it->nrep == 0)
			continue;
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
	r->job.run = get_run;
	r->job.done = get_done;
	if (!remote && (bytes <= AGENT_INLINE_COPY_BYTES || (r->solo = solo_get(r, bytes)))) {
		get_run(&r->job);
		get_done(&r->job);
		return;
	}
	/* Remote reads move on the engine's threads: start them from here
	 * unless local copies or checks are big work for the loop. */
	if (remote && bytes <= AGENT_INLINE_COPY_BYTES &&
	    (!g->verify || remote_bytes <= AGENT_INLINE_COPY_BYTES) &&
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
	agent__set_lease_ttl(a, lease_ttl_ms);
	return sent_ms + lease_ttl_ms / 2;
}

static void on_get_replicas(void *ud, int err, const char *message,
			    const ProtobufCMessage *m)
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
		/* Nearest replica first: this agent's segment. */
		for (unsigned p = 1; p < it->nrep; p++)
			if (it->reps[p].local && !it->reps[0].local) {
				struct agent_rep t = it->reps[0];
				it->reps[0] = it->reps[p];
				it->reps[p] = t;
			}
		/* Local replicas are cached (nobody but the master's
		 * placements writes this segment, and the cache is emptied
		 * whenever the segment is mounted again), and small ones
		 * elsewhere whose bytes can be checked (get_probe). */
		if (it->reps[0].local ||
		    (it->has_crc && it->size > 0 && it->size <= a->remote_cache_bytes))
			agent__lcache_put(&a->lc, it->key, it->klen, it->size,
					  it->has_crc ? &it->crc : NULL, &it->reps[0], until, now);
	}
	get_place_and_copy(r);
}

/* A background renewal of one cached lease (lcache.c): the call, and the
 * key it names (one allocation, freed by the callback). */
struct lease_renewal {
	struct agent *a;
	unsigned gen;       /* agent__lease_gen when sent: a mount empties the cache */
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
	for (size_t k = 0; seg && k < res->n_replicas; k++)
		if (res->replicas[k]->segment && strcmp(res->replicas[k]->segment, seg) == 0)
			offset = res->replicas[k]->offset;
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
		get_place_and_copy(r);
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
static void unprobe(struct agent_item *it)
{
	free(it->reps[0].segment);
	free(it->reps);
	it->reps = NULL;
	it->nrep = 0;
	free(it->scratch);
	it->scratch = NULL;
	it->probing = false;
	it->err = 0;
}

/* A probed item is not to be trusted after all: forget its entry, and let
 * the master say where the key is. */
static void probe_miss(struct agent_req *r, struct agent_item *it)
{
	agent__lcache_del(&r->a->lc, it->key, it->klen);
	agent__count(&r->a->stats, AGENT_C_LEASE_CACHE_STALE, 1);
	unprobe(it);
}

static void get_probe_done(struct agent_job *j)
{
	struct agent_req *r = agent__op_end_from_loop(j);
	for (size_t i = 0; i < r->n; i++) {
		struct agent_item *it = &r->items[i];
		if (!it->probing)
			continue;
		if (it->err || crc32c(0, it->scratch, it->size) != it->crc) {
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
		agent__xfer_add(r->a, x, it->reps[0].segment, false, it->scratch,
				it->reps[0].address, it->size, &it->err);
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
			unprobe(&r->items[i]);
	return false;
}

static void op_get(struct agent_req *r)
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
		const struct agent_lentry *e =
			agent__lcache_get(&a->lc, it->key, it->klen, now, &renew);
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
			it->probing = !e->rep.local;
			probes += it->probing ? it->size : 0;
			if (!it->probing)
				agent__count(&a->stats, AGENT_C_LEASE_CACHE_HITS, 1);
		}
	}
	if (probes && get_probe(r, probes))
		return;
	get_lookup(r);
}

/* ------------------------------------------------------------ exist, remove */

static void keys_reply(struct agent_req *r, int first)
{
	int32_t *res = calloc(r->n, sizeof(*res));
	if (!res) {
		agent__op_fail(r, -ENOMEM, NULL);
		return;
	}
	for (size_t i = 0; i < r->n; i++)
		res[i] = r->items[i].err;
	Mooncake__Client__KeysReply kr = MOONCAKE__CLIENT__KEYS_REPLY__INIT;
	kr.results = res;
	kr.n_results = r->n;
	Mooncake__Client__Response resp = MOONCAKE__CLIENT__RESPONSE__INIT;
	resp.body_case = MOONCAKE__CLIENT__RESPONSE__BODY_KEYS;
	resp.keys = &kr;
	agent__reply(r, &resp, NULL, NULL, 0);
	free(res);
	agent__op_finish(r, first);
}

static void on_exist(void *ud, int err, const char *message,
		     const ProtobufCMessage *m)
{
	struct agent_req *r = ud;
	struct agent_keys_block *b = r->mstate;
	const Mooncake__Master__BatchExistResponse *resp =
		(const Mooncake__Master__BatchExistResponse *)m;
	(void)message;
	for (size_t k = 0; k < b->req.n_keys; k++) {
		struct agent_item *it = &r->items[b->idx[k]];
		if (err)
			it->err = err;
		else if (k < resp->n_errors && resp->errors[k])
			it->err = resp->errors[k];
		else
			it->err = k < resp->n_exists && resp->exists[k] ? 1 : 0;
	}
	keys_reply(r, err);
}

static void on_removed(void *ud, int err, const char *message,
		       const ProtobufCMessage *m)
{
	struct agent_req *r = ud;
	struct agent_keys_block *b = r->mstate;
	const Mooncake__Master__BatchErrorsResponse *resp =
		(const Mooncake__Master__BatchErrorsResponse *)m;
	(void)message;
	for (size_t k = 0; k < b->req.n_keys; k++) {
		struct agent_item *it = &r->items[b->idx[k]];
		it->err = err ? err : k < resp->n_errors ? resp->errors[k] : MC_EPROTOCOL;
		if (it->err == 0) {
			agent__inv_del(&r->a->inv, it->key, it->klen);
			agent__lcache_del(&r->a->lc, it->key, it->klen);
		}
	}
	keys_reply(r, err);
}

static void op_keys(struct agent_req *r, bool remove)
{
	const Mooncake__Client__KeysRequest *q = remove ? r->msg->remove : r->msg->exist;
	if (agent__op_items(r, q->n_keys)) {
		agent__op_fail(r, -ENOMEM, NULL);
		return;
	}
	for (size_t i = 0; i < q->n_keys; i++) {
		r->items[i].key = q->keys[i].data;
		r->items[i].klen = q->keys[i].len;
		if (!agent__key_ok(&q->keys[i]))
			r->items[i].err = -EINVAL;
	}
	struct agent_keys_block *b = agent__op_keys_block(r, agent__op_item_ok);
	if (!b) {
		agent__op_fail(r, -ENOMEM, NULL);
		return;
	}
	agent__op_set_mstate(r, b);
	if (b->req.n_keys == 0) {
		keys_reply(r, 0);
		return;
	}
	if (!remove) {
		agent__bcall(r->a, AGENT_B_EXIST, &b->req.base, on_exist, r);
		return;
	}
	b->rm.force = q->force;
	agent__mcall(r->a, "BatchRemove", &b->rm.base,
		     &mooncake__master__batch_errors_response__descriptor, on_removed, r);
}

static void on_removed_all(void *ud, int err, const char *message,
			   const ProtobufCMessage *m)
{
	struct agent_req *r = ud;
	const Mooncake__Master__RemoveAllResponse *resp =
		(const Mooncake__Master__RemoveAllResponse *)m;
	if (err) {
		agent__op_fail(r, err, message);
		return;
	}
	/* The mirror hears of each removal from the master's log (leased
	 * and PENDING objects stay). */
	agent__lcache_clear(&r->a->lc);
	Mooncake__Client__RemoveAllReply rr = MOONCAKE__CLIENT__REMOVE_ALL_REPLY__INIT;
	rr.removed = resp->removed;
	rr.skipped = resp->skipped;
	Mooncake__Client__Response out = MOONCAKE__CLIENT__RESPONSE__INIT;
	out.body_case = MOONCAKE__CLIENT__RESPONSE__BODY_REMOVE_ALL;
	out.remove_all = &rr;
	agent__reply(r, &out, NULL, NULL, 0);
	agent__op_finish(r, 0);
}

static void op_remove_all(struct agent_req *r)
{
	Mooncake__Master__RemoveAllRequest *q = malloc(sizeof(*q));
	if (!q) {
		agent__op_fail(r, -ENOMEM, NULL);
		return;
	}
	mooncake__master__remove_all_request__init(q);
	q->force = r->msg->remove_all->force;
	agent__op_set_mstate(r, q);
	agent__mcall(r->a, "RemoveAll", &q->base,
		     &mooncake__master__remove_all_response__descriptor, on_removed_all, r);
}

/* ------------------------------------------------------------ buffers */

static void buffer_reply(struct agent_req *r, uint64_t id, uint64_t len, int fd)
{
	Mooncake__Client__BufferReply br = MOONCAKE__CLIENT__BUFFER_REPLY__INIT;
	br.buffer = id;
	br.length = len;
	Mooncake__Client__Response resp = MOONCAKE__CLIENT__RESPONSE__INIT;
	resp.body_case = MOONCAKE__CLIENT__RESPONSE__BODY_BUFFER;
	resp.buffer = &br;
	bool own = true;
	agent__reply(r, &resp, fd >= 0 ? &fd : NULL, &own, fd >= 0 ? 1 : 0);
	agent__op_finish(r, 0);
}

static const char *register_why(int rc)
{
	switch (rc) {
	case -EBADF: return "the descriptor is not a memfd";
	case -EPERM: return "the memfd belongs to another user";
	case -EACCES: return "the memfd is not open for reading and writing";
	case -EINVAL: return "the memfd is not sealed against shrinking "
			     "(F_SEAL_SHRINK) or is smaller than the range";
	case -ENOSPC: return "too many buffers in this session";
	default: return NULL;
	}
}

/*
 * A buffer with an address is published to the transfer engine at that
 * address (peers may then read and write it) before it is added; the
 * registration (an RDMA MR for large buffers) runs on a copy thread.
 */
struct publish {
	struct agent_job job;
	struct agent_req *r;
	struct agent_map *m;
	uint8_t *base;
	uint64_t len, address, memfd_off;
	int fd;   /* to send with the reply (alloc), or -1 */
	int err;
};

static void publish_run(struct agent_job *j)
{
	struct publish *p = MC_CONTAINER_OF(j, struct publish, job);
	p->err = te_register(p->r->a->te, p->address, p->base, p->len, p->m->fd, p->memfd_off,
			     &p->m->region);
	if (p->err)
		p->m->region = NULL;
}

static void publish_done(struct agent_job *j)
{
	struct publish *p = MC_CONTAINER_OF(j, struct publish, job);
	struct agent_req *r = p->r;
	uint64_t id;
	int rc = p->err;
	if (rc == -EEXIST)
		log_warn("client %s: buffer at 0x%llx overlaps memory already published "
			 "(another session's buffer at the same address)", agent__session_name(r->c),
			 (unsigned long long)p->address);
	if (rc == 0)
		rc = agent__session_closed(r->c)
			     ? MC_ECANCELLED
			     : agent__session_buf_add(r->c, p->m, p->base, p->len, p->address, &id);
	if (rc) {
		agent__map_unref(p->m);
		if (p->fd >= 0)
			close(p->fd);
		agent__op_fail(r, rc, rc == -EEXIST ? "the address range is already published by "
					    "another session of this agent"
					  : NULL);
	} else {
		buffer_reply(r, id, p->len, p->fd);
	}
	free(p);
}

/* Add the buffer now, or publish it first. Takes the map reference. */
static void add_or_publish(struct agent_req *r, struct agent_map *m, uint8_t *base,
			   uint64_t len, uint64_t address, uint64_t memfd_off, int fd)
{
	if (address && r->a->te) {
		struct publish *p = calloc(1, sizeof(*p));
		if (p) {
			*p = (struct publish){.r = r, .m = m, .base = base, .len = len,
					      .address = address, .memfd_off = memfd_off, .fd = fd};
			p->job.run = publish_run;
			p->job.done = publish_done;
			agent__pool_submit(&r->a->pool, &p->job);
			return;
		}
		agent__map_unref(m);
		if (fd >= 0)
			close(fd);
		agent__op_fail(r, -ENOMEM, NULL);
		return;
	}
	uint64_t id;
	int rc = agent__session_buf_add(r->c, m, base, len, address, &id);
	if (rc) {
		agent__map_unref(m);
		if (fd >= 0)
			close(fd);
		agent__op_fail(r, rc, register_why(rc));
		return;
	}
	buffer_reply(r, id, len, fd);
}

static void op_register_buffer(struct agent_req *r)
{
	const Mooncake__Client__RegisterBufferRequest *q = r->msg->register_buffer;
	struct agent_conn *c = r->c;
	struct agent_map *m;
	uint8_t *base;
	int rc = agent__session_bufs_full(c)
			 ? -ENOSPC
			 : agent__map_client_fd(r->a, r->fds[0], agent__session_uid(c), q->offset,
						q->length, &m, &base);
	if (rc) {
		const char *why = register_why(rc);
		log_warn("client %s: register_buffer refused: %s", agent__session_name(c),
			 why ? why : mc_strerror(rc));
		agent__op_fail(r, rc, why);
		return;
	}
	r->fds[0] = -1;
	add_or_publish(r, m, base, q->length, q->address, q->offset, -1);
}

/* A published buffer leaves the engine before the reply: once the client
 * hears back, no peer can reach it any more. */
struct unpublish {
	struct agent_job job;
	struct agent_req *r;
	struct agent_map *m;
	uint64_t id;
};

static void unpublish_run(struct agent_job *j)
{
	struct unpublish *u = MC_CONTAINER_OF(j, struct unpublish, job);
	te_unregister(u->m->region);
	u->m->region = NULL;
}

static void unpublish_done(struct agent_job *j)
{
	struct unpublish *u = MC_CONTAINER_OF(j, struct unpublish, job);
	agent__map_unref(u->m);
	buffer_reply(u->r, u->id, 0, -1);
	free(u);
}

static void op_unregister_buffer(struct agent_req *r)
{
	uint64_t id = r->msg->unregister_buffer->buffer;
	struct agent_map *m = agent__session_buf_remove(r->c, id);
	if (!m) {
		agent__op_fail(r, -ENOENT, "no such buffer in this session");
		return;
	}
	struct unpublish *u = m->region ? calloc(1, sizeof(*u)) : NULL;
	if (u) {
		u->r = r;
		u->m = m;
		u->id = id;
		u->job.run = unpublish_run;
		u->job.done = unpublish_done;
		agent__pool_submit(&r->a->pool, &u->job);
		return;
	}
	agent__map_unref(m);
	buffer_reply(r, id, 0, -1);
}

static void op_alloc_buffer(struct agent_req *r)
{
	struct agent *a = r->a;
	struct agent_conn *c = r->c;
	const Mooncake__Client__AllocBufferRequest *q = r->msg->alloc_buffer;
	if (agent__session_bufs_full(c)) {
		agent__op_fail(r, -ENOSPC, register_why(-ENOSPC));
		return;
	}
	struct agent_memfd_opts mo = {
		.name = "mooncake-buffer",
		.len = q->length,
		.hugepages = a->hugepages == AGENT_HUGEPAGES_ON ? AGENT_HUGEPAGES_AUTO
								 : a->hugepages,
		.numa_node = a->numa_node,
	};
	struct agent_map *m;
	int rc = agent__memfd_new(a, &mo, &m);
	if (rc) {
		agent__op_fail(r, rc, "cannot create the buffer");
		return;
	}
	int fd = dup(m->fd);
	if (fd < 0) {
		rc = -errno;
		agent__map_unref(m);
		agent__op_fail(r, rc, NULL);
		return;
	}
	add_or_publish(r, m, m->addr, q->length, q->address, 0, fd);
}

/* ------------------------------------------------------------ transfer */

/* This agent's memory at a remote address: its segment, or a buffer one
 * of its clients published at that address. */
/* A reference on the memory is held for the request: another session may
 * unregister its buffer while the copy runs. */
static uint8_t *local_target(struct agent_req *r, uint64_t addr, uint64_t len)
{
	struct agent *a = r->a;
	uint64_t base = (uint64_t)(uintptr_t)a->seg->addr;
	if (addr >= base && addr - base <= a->seg->len && len <= a->seg->len - (addr - base))
		return a->seg->addr + (addr - base);
	const struct agent_buf *b = agent__server_published(a, addr, len);
	if (!b)
		return NULL;
	return agent__op_hold(r, b->map) == 0 ? b->base + (addr - b->address) : NULL;
}

static void transfer_run(struct agent_job *j)
{
	struct agent_req *r = MC_CONTAINER_OF(j, struct agent_req, job);
	struct agent *a = r->a;
	struct agent_xfer *x = NULL;
	for (size_t i = 0; i < r->n; i++) {
		struct agent_item *it = &r->items[i];
		if (it->err || it->len == 0 || (it->reps && it->reps[0].local))
			continue;
		if (!x && !(x = agent__xfer_new())) {
			it->err = -ENOMEM;
			continue;
		}
		agent__xfer_add(a, x, it->target, it->write, it->ptr, it->remote, it->len,
				&it->err);
	}
	if (x)
		agent__xfer_start(a, x);
	for (size_t i = 0; i < r->n; i++) {
		struct agent_item *it = &r->items[i];
		if (it->err || it->len == 0 || !it->reps || !it->reps[0].local)
			continue;
		uint8_t *t = (uint8_t *)(uintptr_t)it->reps[0].address;
		if (it->write)
			memmove(t, it->ptr, it->len);
		else
			memmove(it->ptr, t, it->len);
	}
	if (x)
		agent__xfer_finish(a, x);
}

static void transfer_done(struct agent_job *j)
{
	struct agent_req *r = MC_CONTAINER_OF(j, struct agent_req, job);
	int32_t *errs = calloc(r->n, sizeof(*errs));
	if (!errs) {
		agent__op_fail(r, -ENOMEM, NULL);
		return;
	}
	int first = 0;
	for (size_t i = 0; i < r->n; i++) {
		errs[i] = r->items[i].err;
		if (errs[i] && !first)
			first = errs[i];
		if (!errs[i])
			agent__count(&r->a->stats, r->items[i].write ? AGENT_C_BYTES_WRITTEN
							      : AGENT_C_BYTES_READ,
				     r->items[i].len);
	}
	Mooncake__Client__TransferReply tr = MOONCAKE__CLIENT__TRANSFER_REPLY__INIT;
	tr.errors = errs;
	tr.n_errors = r->n;
	Mooncake__Client__Response resp = MOONCAKE__CLIENT__RESPONSE__INIT;
	resp.body_case = MOONCAKE__CLIENT__RESPONSE__BODY_TRANSFER;
	resp.transfer = &tr;
	agent__reply(r, &resp, NULL, NULL, 0);
	free(errs);
	agent__op_finish(r, first);
}

static void op_transfer(struct agent_req *r)
{
	struct agent *a = r->a;
	const Mooncake__Client__TransferRequest *q = r->msg->transfer;
	if (agent__op_items(r, q->n_items)) {
		agent__op_fail(r, -ENOMEM, NULL);
		return;
	}
	for (size_t i = 0; i < q->n_items; i++) {
		struct agent_item *it = &r->items[i];
		const Mooncake__Client__TransferItem *ti = q->items[i];
		it->write = ti->op == MOONCAKE__CLIENT__TRANSFER_ITEM__OP__WRITE;
		it->len = ti->local->length;
		it->target = ti->target;
		it->remote = ti->remote_address;
		it->err = agent__op_region(r, ti->local, &it->ptr);
		if (it->err || it->len == 0)
			continue;
		if (strcmp(ti->target, a->name) == 0) {
			uint8_t *t = local_target(r, ti->remote_address, it->len);
			if (!t) {
				it->err = MC_EINVALID_REPLICA; /* not registered here */
				continue;
			}
			it->reps = calloc(1, sizeof(*it->reps));
			if (!it->reps) {
				it->err = -ENOMEM;
				continue;
			}
			it->nrep = 1;
			it->reps[0].local = true;
			it->reps[0].address = (uint64_t)(uintptr_t)t;
		}
	}
	r->job.run = transfer_run;
	r->job.done = transfer_done;
	agent__pool_submit(&a->pool, &r->job);
}

/* ------------------------------------------------------------ stats, release */

static void op_stats(struct agent_req *r)
{
	struct agent *a = r->a;
	Mooncake__Client__StatsReply s = MOONCAKE__CLIENT__STATS_REPLY__INIT;
	s.agent_id = a->name;
	s.segment = a->name;
	s.segment_size = a->seg->len;
	s.hugepages = a->seg->hugepages;
	s.numa_node = a->numa_node;
	s.staging_size = a->staging_bytes;
	agent__server_counts(a, &s.clients, &s.buffers, &s.views);
	s.puts = agent__counter(&a->stats, AGENT_C_PUTS);
	s.gets = agent__counter(&a->stats, AGENT_C_GETS);
	s.local_hits = agent__counter(&a->stats, AGENT_C_LOCAL_HITS);
	s.remote_hits = agent__counter(&a->stats, AGENT_C_REMOTE_HITS);
	s.misses = agent__counter(&a->stats, AGENT_C_MISSES);
	s.bytes_written = agent__counter(&a->stats, AGENT_C_BYTES_WRITTEN);
	s.bytes_read = agent__counter(&a->stats, AGENT_C_BYTES_READ);
	s.master = (char *)agent__mcall_master(a);
	s.view = agent__mlink_view(a);
	s.inventory = agent__inv_count(&a->inv);
	s.mirror_seq = agent__mirror_seq(a);
	s.resync_bad = agent__counter(&a->stats, AGENT_C_RESYNC_BAD) +
		       agent__counter(&a->stats, AGENT_C_RESYNC_UNCHECKED);
	s.get_bad = agent__counter(&a->stats, AGENT_C_GET_BAD);
	Mooncake__Client__Response resp = MOONCAKE__CLIENT__RESPONSE__INIT;
	resp.body_case = MOONCAKE__CLIENT__RESPONSE__BODY_STATS;
	resp.stats = &s;
	agent__reply(r, &resp, NULL, NULL, 0);
	agent__op_finish(r, 0);
}

static void op_release(struct agent_req *r)
{
	struct agent_conn *c = r->c;
	const Mooncake__Client__ReleaseRequest *q = r->msg->release;
	int err = 0;
	for (size_t k = 0; k < q->n_views; k++)
		if (!agent__session_view_drop(c, q->views[k]))
			err = -ENOENT;
	if (q->quiet) {
		if (err)
			log_warn("client %s released a view that is not its own",
				 agent__session_name(c));
		agent__op_finish(r, err);
		return;
	}
	if (err) {
		agent__op_fail(r, err, "no such view in this session");
		return;
	}
	Mooncake__Client__Response resp = MOONCAKE__CLIENT__RESPONSE__INIT;
	agent__reply(r, &resp, NULL, NULL, 0);
	agent__op_finish(r, 0);
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

static void on_renewed(void *ud, int err, const char *message,
		       const ProtobufCMessage *m)
{
	struct renew_block *b = ud;
	struct agent *a = b->a;
	const Mooncake__Master__BatchGetReplicasResponse *resp =
		(const Mooncake__Master__BatchGetReplicasResponse *)m;
	a->view_renew_busy = false;
	if (err) {
		if (err != MC_ECANCELLED)
			log_warn("cannot renew the read leases of %zu zero-copy views: %s",
				 b->n, message ? message : mc_strerror(err));
	} else {
		if (resp->lease_ttl_ms)
			agent__set_lease_ttl(a, resp->lease_ttl_ms);
		for (size_t i = 0; i < resp->n_results && i < b->n; i++)
			if (resp->results[i]->error == MC_EOBJECT_NOT_FOUND)
				log_warn("a zero-copy view's object is gone from the "
					 "index (removed with force, or its agent "
					 "left); its bytes may be reused");
	}
	renew_free(b);
}

void agent__renew_views(struct agent *a)
{
	uint64_t clients, buffers, views;
	agent__server_counts(a, &clients, &buffers, &views);
	if (a->view_renew_busy || views == 0)
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
	a->view_renew_busy = true;
	agent__mcall(a, "BatchGetReplicas", &b->req.base,
		     &mooncake__master__batch_get_replicas_response__descriptor,
		     on_renewed, b);
}

/* ------------------------------------------------------------ dispatch */

void agent__dispatch(struct agent_req *r)
{
	switch (r->op) {
	case MOONCAKE__CLIENT__REQUEST__OP_HELLO: op_hello(r); break;
	case MOONCAKE__CLIENT__REQUEST__OP_PUT: agent__op_put(r); break;
	case MOONCAKE__CLIENT__REQUEST__OP_GET: op_get(r); break;
	case MOONCAKE__CLIENT__REQUEST__OP_EXIST: op_keys(r, false); break;
	case MOONCAKE__CLIENT__REQUEST__OP_REMOVE: op_keys(r, true); break;
	case MOONCAKE__CLIENT__REQUEST__OP_REMOVE_ALL: op_remove_all(r); break;
	case MOONCAKE__CLIENT__REQUEST__OP_REGISTER_BUFFER: op_register_buffer(r); break;
	case MOONCAKE__CLIENT__REQUEST__OP_UNREGISTER_BUFFER: op_unregister_buffer(r); break;
	case MOONCAKE__CLIENT__REQUEST__OP_ALLOC_BUFFER: op_alloc_buffer(r); break;
	case MOONCAKE__CLIENT__REQUEST__OP_TRANSFER: op_transfer(r); break;
	case MOONCAKE__CLIENT__REQUEST__OP_STATS: op_stats(r); break;
	case MOONCAKE__CLIENT__REQUEST__OP_RELEASE: op_release(r); break;
	default: agent__op_fail(r, -EOPNOTSUPP, "unknown operation"); break;
	}
}
