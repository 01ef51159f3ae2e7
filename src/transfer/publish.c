/*
 * publish: this engine's descriptor in meta, on the loop thread.
 *
 * A lease (te-lease-ttl) is granted and kept alive by the etcd client; the
 * descriptor is written under it to /mooncake/<cluster>/segments/<name>,
 * so it disappears when the process dies. The write is a transaction that
 * only succeeds when the key is absent or already ours: a name held under
 * another live lease (another engine, or this one's previous run whose
 * lease has not expired yet) is retried every second and reported by
 * te_wait_published as -EEXIST. Every change (region registered or
 * removed) bumps the generation and is written again; writes never
 * overlap, a change during one is written right after it. A lost lease is
 * granted again and everything re-published. Stopping deletes the key and
 * revokes the lease.
 *
 * The same file follows the other segments: one watch on the segments
 * prefix feeds descriptor changes of opened segments to segment.c.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "etcd/etcd.h"
#include "transfer/te_int.h"

#define LOG_SUBSYS LOGS_TE
#define RETRY_MS 1000

static void set_published(struct te_engine *e, bool ok, int err)
{
	pthread_mutex_lock(&e->pub_mu);
	e->pub_ok = ok;
	e->pub_err = err;
	pthread_cond_broadcast(&e->pub_cv);
	pthread_mutex_unlock(&e->pub_mu);
}

static void grant(struct te_engine *e);
static void put_desc(struct te_engine *e);
static int start_watch(struct te_engine *e);

static void on_retry(uv_timer_t *t)
{
	struct te_engine *e = t->data;
	if (e->pub.stopping)
		return;
	if (!e->pub.lease)
		grant(e);
	else
		put_desc(e);
}

static void retry_later(struct te_engine *e, int err)
{
	e->pub.last_err = err;
	set_published(e, false, err);
	if (!e->pub.stopping)
		uv_timer_start(e->pub.retry, on_retry, RETRY_MS, 0);
}

/* ------------------------------------------------------------ lease */

static void on_granted(struct etcd_lease *l, void *ud, int err, int64_t id)
{
	struct te_engine *e = ud;
	(void)l;
	if (err) {
		e->pub.lease = NULL; /* freed after this returns */
		if (e->pub.last_err != err)
			log_warn("segment %s: cannot get a lease from meta: %s; "
				 "retrying",
				 e->name, mc_strerror(err));
		retry_later(e, err);
		return;
	}
	e->pub.granted = true;
	e->pub.lease_id = id;
	put_desc(e);
}

static void on_lost(struct etcd_lease *l, void *ud, int err)
{
	struct te_engine *e = ud;
	(void)l;
	e->pub.lease = NULL;
	e->pub.granted = false;
	e->pub.owns_key = false;
	e->pub.published = false;
	if (e->pub.stopping)
		return;
	log_warn("segment %s: meta lease lost (%s); publishing again", e->name,
		 mc_strerror(err));
	set_published(e, false, err);
	grant(e);
}

static const struct etcd_lease_cbs lease_cbs = {.on_granted = on_granted, .on_lost = on_lost};

static void grant(struct te_engine *e)
{
	int rc = etcd_lease_grant(e->meta, (int64_t)e->lease_ttl_s, &lease_cbs, e,
				  &e->pub.lease);
	if (rc) {
		e->pub.lease = NULL;
		retry_later(e, rc);
	}
}

/* ------------------------------------------------------------ writing */

static void published(struct te_engine *e)
{
	if (!e->pub.published || e->pub.last_err)
		log_info("segment %s published in meta (lease %llx)", e->name,
			 (unsigned long long)e->pub.lease_id);
	e->pub.published = true;
	e->pub.last_err = 0;
	e->pub.name_held_logged = false;
	set_published(e, true, 0);
	/* meta answers: a watch that could not even start starts now */
	if (!e->watch && start_watch(e) != 0)
		e->watch = NULL;
	if (e->pub.dirty)
		put_desc(e);
}

static void on_put(void *ud, int err, const Etcdserverpb__PutResponse *resp)
{
	struct te_engine *e = ud;
	(void)resp;
	e->pub.put_inflight = false;
	if (e->pub.stopping || err == MC_ECANCELLED)
		return;
	if (err) {
		log_warn("segment %s: cannot write the descriptor: %s", e->name,
			 mc_strerror(err));
		retry_later(e, err);
		return;
	}
	published(e);
}

/* Write the descriptor under our lease without a condition (the key is
 * known to be ours). */
static void put_plain(struct te_engine *e, uint8_t *val, size_t vlen, const char *key,
		      size_t klen)
{
	Etcdserverpb__PutRequest put = ETCDSERVERPB__PUT_REQUEST__INIT;
	put.key.data = (uint8_t *)key;
	put.key.len = klen;
	put.value.data = val;
	put.value.len = vlen;
	put.lease = e->pub.lease_id;
	int rc = etcd_put(e->meta, &put, on_put, e);
	if (rc)
		retry_later(e, rc);
	else
		e->pub.put_inflight = true;
}

static void on_txn(void *ud, int err, const Etcdserverpb__TxnResponse *resp)
{
	struct te_engine *e = ud;
	e->pub.put_inflight = false;
	if (e->pub.stopping || err == MC_ECANCELLED)
		return;
	if (err) {
		if (e->pub.last_err != err)
			log_warn("segment %s: cannot write the descriptor: %s; "
				 "retrying",
				 e->name, mc_strerror(err));
		retry_later(e, err);
		return;
	}
	if (resp->succeeded) {
		e->pub.owns_key = true;
		published(e);
		return;
	}
	/* The key exists: ours (an update) or another engine's. */
	const Mvccpb__KeyValue *kv = NULL;
	if (resp->n_responses == 1 &&
	    resp->responses[0]->response_case ==
		    ETCDSERVERPB__RESPONSE_OP__RESPONSE_RESPONSE_RANGE &&
	    resp->responses[0]->response_range->n_kvs == 1)
		kv = resp->responses[0]->response_range->kvs[0];
	if (kv && kv->lease == e->pub.lease_id) {
		e->pub.owns_key = true;
		e->pub.dirty = true;
		put_desc(e);
		return;
	}
	if (!e->pub.name_held_logged)
		log_warn("segment %s: the name is held in meta under lease %llx "
			 "(another engine, or this one's previous run until its "
			 "lease expires); retrying every second",
			 e->name, kv ? (unsigned long long)kv->lease : 0ull);
	e->pub.name_held_logged = true;
	retry_later(e, -EEXIST);
}

static void put_desc(struct te_engine *e)
{
	if (!e->pub.granted || e->pub.put_inflight || e->pub.stopping) {
		e->pub.dirty = true;
		return;
	}
	bool ours = e->pub.owns_key;
	e->pub.dirty = false;
	struct te_desc *d = NULL;
	uint8_t *val = NULL;
	size_t vlen = 0;
	int rc = te__desc_build(e, &d);
	if (rc == 0)
		rc = te__desc_encode(d, &val, &vlen);
	te__desc_free(d);
	if (rc) {
		retry_later(e, rc);
		return;
	}
	char key[512];
	size_t klen = (size_t)te__seg_key(e, e->name, key, sizeof(key));
	if (ours) {
		put_plain(e, val, vlen, key, klen);
		free(val);
		return;
	}
	/* Put if absent, else read who holds it. */
	Etcdserverpb__Compare cmp = ETCDSERVERPB__COMPARE__INIT;
	cmp.result = ETCDSERVERPB__COMPARE__COMPARE_RESULT__EQUAL;
	cmp.target = ETCDSERVERPB__COMPARE__COMPARE_TARGET__CREATE;
	cmp.key.data = (uint8_t *)key;
	cmp.key.len = klen;
	cmp.target_union_case = ETCDSERVERPB__COMPARE__TARGET_UNION_CREATE_REVISION;
	cmp.create_revision = 0;
	Etcdserverpb__PutRequest put = ETCDSERVERPB__PUT_REQUEST__INIT;
	put.key = cmp.key;
	put.value.data = val;
	put.value.len = vlen;
	put.lease = e->pub.lease_id;
	Etcdserverpb__RangeRequest get = ETCDSERVERPB__RANGE_REQUEST__INIT;
	get.key = cmp.key;
	Etcdserverpb__RequestOp ok = ETCDSERVERPB__REQUEST_OP__INIT;
	ok.request_case = ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_PUT;
	ok.request_put = &put;
	Etcdserverpb__RequestOp ko = ETCDSERVERPB__REQUEST_OP__INIT;
	ko.request_case = ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_RANGE;
	ko.request_range = &get;
	Etcdserverpb__Compare *cmps[1] = {&cmp};
	Etcdserverpb__RequestOp *oks[1] = {&ok}, *kos[1] = {&ko};
	Etcdserverpb__TxnRequest txn = ETCDSERVERPB__TXN_REQUEST__INIT;
	txn.n_compare = 1;
	txn.compare = cmps;
	txn.n_success = 1;
	txn.success = oks;
	txn.n_failure = 1;
	txn.failure = kos;
	rc = etcd_txn(e->meta, &txn, on_txn, e);
	free(val);
	if (rc)
		retry_later(e, rc);
	else
		e->pub.put_inflight = true;
}

void te__pub_kick(struct te_engine *e)
{
	if (!e->meta)
		return;
	e->pub.dirty = true;
	put_desc(e);
}

/* ------------------------------------------------------------ watch */

static void on_events(struct etcd_watch *w, void *ud, Mvccpb__Event *const *ev, size_t n,
		      int64_t rev)
{
	struct te_engine *e = ud;
	char prefix[256];
	size_t plen = (size_t)te__seg_key(e, "", prefix, sizeof(prefix));
	(void)w;
	(void)rev;
	for (size_t i = 0; i < n; i++) {
		const Mvccpb__KeyValue *kv = ev[i]->kv;
		if (!kv || kv->key.len <= plen || kv->key.len - plen > TE_NAME_MAX ||
		    memcmp(kv->key.data, prefix, plen) != 0)
			continue;
		char name[TE_NAME_MAX + 1];
		memcpy(name, kv->key.data + plen, kv->key.len - plen);
		name[kv->key.len - plen] = '\0';
		te__segments_watch_event(e, name, kv->value.data, kv->value.len,
					 ev[i]->type == MVCCPB__EVENT__EVENT_TYPE__DELETE);
	}
}

static void on_watch_error(struct etcd_watch *w, void *ud, int err)
{
	struct te_engine *e = ud;
	(void)w;
	e->watch = NULL;
	if (e->pub.stopping || err == MC_ECANCELLED)
		return;
	log_warn("watch on segment descriptors ended (%s); watching again from "
		 "now",
		 mc_strerror(err));
	if (start_watch(e) != 0) {
		e->watch = NULL; /* tried again after the next publish */
		log_warn("cannot watch segment descriptors yet");
	}
}

static const struct etcd_watch_cbs watch_cbs = {.on_events = on_events,
						.on_error = on_watch_error};

/* Errors: as etcd_watch (the caller retries after the next publish). */
static int start_watch(struct te_engine *e)
{
	char key[256];
	uint8_t end[256];
	size_t klen = (size_t)te__seg_key(e, "", key, sizeof(key));
	size_t elen = etcd_prefix_end(key, klen, end);
	return etcd_watch(e->meta, key, klen, end, elen, 0, 0, &watch_cbs, e, &e->watch);
}

/* ------------------------------------------------------------ start / stop */

int te__pub_start(struct te_engine *e)
{
	if (!e->meta) {
		set_published(e, true, 0);
		return 0;
	}
	e->pub.retry = calloc(1, sizeof(*e->pub.retry));
	if (!e->pub.retry)
		return -ENOMEM;
	uv_timer_init(e->loop, e->pub.retry);
	e->pub.retry->data = e;
	int rc = start_watch(e);
	if (rc) {
		log_warn("cannot watch segment descriptors yet: %s", mc_strerror(rc));
		e->watch = NULL;
	}
	grant(e);
	return 0;
}

static void on_timer_closed(uv_handle_t *h)
{
	free(h);
}

static void pub_done(struct te_engine *e)
{
	if (e->pub.lease) {
		etcd_lease_revoke(e->pub.lease);
		e->pub.lease = NULL;
	}
	if (e->pub.retry) {
		uv_close((uv_handle_t *)e->pub.retry, on_timer_closed);
		e->pub.retry = NULL;
	}
	set_published(e, false, MC_ESHUTDOWN);
	e->pub.stop_done(e, e->pub.stop_done_ud);
}

static void on_deleted(void *ud, int err, const Etcdserverpb__DeleteRangeResponse *r)
{
	struct te_engine *e = ud;
	(void)r;
	if (err && err != MC_ECANCELLED)
		log_warn("segment %s: cannot delete the descriptor from meta: %s "
			 "(it expires with the lease)",
			 e->name, mc_strerror(err));
	pub_done(e);
}

void te__pub_drop(struct te_engine *e)
{
	e->pub.stopping = true;
	if (e->watch) {
		etcd_watch_cancel(e->watch);
		e->watch = NULL;
	}
	if (e->pub.lease) {
		etcd_lease_revoke(e->pub.lease);
		e->pub.lease = NULL;
	}
	if (e->pub.retry) {
		uv_close((uv_handle_t *)e->pub.retry, on_timer_closed);
		e->pub.retry = NULL;
	}
}

void te__pub_stop(struct te_engine *e, void (*done)(struct te_engine *e, void *ud), void *ud)
{
	e->pub.stopping = true;
	e->pub.stop_done = done;
	e->pub.stop_done_ud = ud;
	if (!e->meta) {
		done(e, ud);
		return;
	}
	if (e->watch) {
		etcd_watch_cancel(e->watch);
		e->watch = NULL;
	}
	uv_timer_stop(e->pub.retry);
	if (e->pub.granted) {
		char key[512];
		size_t klen = (size_t)te__seg_key(e, e->name, key, sizeof(key));
		Etcdserverpb__DeleteRangeRequest req =
			ETCDSERVERPB__DELETE_RANGE_REQUEST__INIT;
		req.key.data = (uint8_t *)key;
		req.key.len = klen;
		if (etcd_delete(e->meta, &req, on_deleted, e) == 0)
			return;
	}
	pub_done(e);
}
