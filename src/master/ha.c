/*
 * ha: leader election of masters through meta (etcd v3 API).
 *
 *   grant a lease (--leader-lease-ttl), kept alive by the etcd client
 *   -> read /mooncake/<id>/master-view (the last view number V, at mod
 *      revision R; absent: V = 0, R = 0)
 *   -> Txn  if create_revision(master) == 0 and mod_revision(view) == R
 *           then put master = "ADDR V+1" under the lease, view = V+1
 *           else get master
 *   success: leader of view V+1 (empty index; agents re-sync)
 *   failure: standby; the current leader is remembered for redirects
 * One watch on the leader key (from the Txn's revision on) follows the
 * leader: a PUT updates the standby's redirect, a DELETE (the leader's
 * lease expired or it resigned) starts a campaign. A leader that sees its
 * key deleted, or whose lease is lost, stops serving at once and
 * campaigns again. Transient failures retry with a capped backoff.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "etcd/etcd.h"
#include "master/master_int.h"
#include "rpc/rpc.h"

#define LOG_SUBSYS LOGS_MASTER

#define RETRY_MIN_MS 200
#define RETRY_MAX_MS 2000

static void campaign(struct master *m);

static void on_retry(uv_timer_t *t)
{
	struct master *m = t->data;
	if (!m->stopping)
		campaign(m);
}

static void retry_later(struct master *m)
{
	if (m->stopping)
		return;
	m->retry_ms = m->retry_ms ? MC_MIN(m->retry_ms * 2, RETRY_MAX_MS) : RETRY_MIN_MS;
	uv_timer_start(&m->retry, on_retry, m->retry_ms, 0);
}

/* "HOST:PORT VIEW" -> addr, view. */
static bool parse_value(const uint8_t *v, size_t len, char *addr, size_t alen, uint64_t *view)
{
	char buf[128];
	if (len == 0 || len >= sizeof(buf) || alen < sizeof(buf))
		return false;
	memcpy(buf, v, len);
	buf[len] = '\0';
	char *sp = strchr(buf, ' ');
	if (!sp)
		return false;
	*sp = '\0';
	char *end;
	unsigned long long n = strtoull(sp + 1, &end, 10);
	if (*end != '\0' || end == sp + 1)
		return false;
	snprintf(addr, alen, "%s", buf);
	*view = n;
	return true;
}

static void step_down(struct master *m, const char *why)
{
	if (!m->leader)
		return;
	log_error("leader of view %llu: %s; stopped serving at once",
		  (unsigned long long)m->view, why);
	master__set_leader(m, false, 0, "");
}

/* ------------------------------------------------------------ watch */

static void on_watch_events(struct etcd_watch *w, void *ud, Mvccpb__Event *const *ev, size_t n,
			    int64_t rev)
{
	struct master *m = ud;
	(void)w;
	(void)rev;
	for (size_t i = 0; i < n; i++) {
		const Mvccpb__KeyValue *kv = ev[i]->kv;
		if (ev[i]->type == MVCCPB__EVENT__EVENT_TYPE__DELETE) {
			if (m->leader)
				step_down(m, "the leader key was deleted");
			m->leader_addr[0] = '\0';
			if (m->stopping)
				continue;
			log_info("leader key deleted: campaigning");
			if (!m->campaign_busy) {
				m->retry_ms = 0;
				campaign(m);
			}
			continue;
		}
		char addr[128];
		uint64_t view;
		if (!kv ||
		    !parse_value(kv->value.data, kv->value.len, addr, sizeof(addr), &view)) {
			log_warn("leader key holds an unreadable value; ignored");
			continue;
		}
		if (m->leader && (view != m->view || strcmp(addr, m->self_addr) != 0)) {
			step_down(m, "another master wrote the leader key");
		}
		if (!m->leader) {
			snprintf(m->leader_addr, sizeof(m->leader_addr), "%s", addr);
			if (view > m->view)
				m->view = view;
			log_info("leader is %s (view %llu)", addr, (unsigned long long)view);
		}
	}
}

static void on_watch_error(struct etcd_watch *w, void *ud, int err)
{
	struct master *m = ud;
	(void)w;
	m->watch = NULL;
	if (m->stopping)
		return;
	log_warn("watch on the leader key ended: %s; re-campaigning", mc_strerror(err));
	retry_later(m);
}

static const struct etcd_watch_cbs watch_cbs = {
	.on_events = on_watch_events,
	.on_error = on_watch_error,
};

static void ensure_watch(struct master *m, int64_t from_rev)
{
	if (m->watch || m->stopping)
		return;
	int rc = etcd_watch(m->etcd, m->leader_key, strlen(m->leader_key), NULL, 0, from_rev,
			    0, &watch_cbs, m, &m->watch);
	if (rc) {
		m->watch = NULL;
		log_warn("cannot watch %s: %s", m->leader_key, mc_strerror(rc));
	}
}

/* ------------------------------------------------------------ campaign */

struct txn_ctx {
	struct master *m;
	uint64_t view;
};

static void on_txn(void *ud, int err, const Etcdserverpb__TxnResponse *resp)
{
	struct txn_ctx *x = ud;
	struct master *m = x->m;
	uint64_t view = x->view;
	free(x);
	if (err == MC_ECANCELLED)
		return;
	m->campaign_busy = false;
	if (m->stopping)
		return;
	if (err) {
		log_warn("campaign for %s: %s; retrying", m->leader_key, mc_strerror(err));
		retry_later(m);
		return;
	}
	int64_t rev = resp->header ? resp->header->revision : 0;
	m->retry_ms = 0;
	if (resp->succeeded) {
		log_info("elected leader of view %llu as %s (%s)", (unsigned long long)view,
			 m->self_addr, m->leader_key);
		master__set_leader(m, true, view, m->self_addr);
		ensure_watch(m, rev + 1);
		return;
	}
	/* Lost: learn the leader from the failure branch's range. */
	const Etcdserverpb__RangeResponse *r = resp->n_responses
						       ? resp->responses[0]->response_range
						       : NULL;
	char addr[128];
	uint64_t v;
	if (r && r->n_kvs &&
	    parse_value(r->kvs[0]->value.data, r->kvs[0]->value.len, addr, sizeof(addr), &v)) {
		snprintf(m->leader_addr, sizeof(m->leader_addr), "%s", addr);
		if (v > m->view)
			m->view = v;
		log_info("standby: leader is %s (view %llu)", addr, (unsigned long long)v);
		ensure_watch(m, rev + 1);
	} else {
		/* The view moved under us with no leader: try again. */
		ensure_watch(m, rev + 1);
		retry_later(m);
	}
}

static void on_view(void *ud, int err, const Etcdserverpb__RangeResponse *resp)
{
	struct master *m = ud;
	if (err == MC_ECANCELLED)
		return;
	if (m->stopping) {
		m->campaign_busy = false;
		return;
	}
	if (err) {
		m->campaign_busy = false;
		log_warn("reading %s: %s; retrying", m->view_key, mc_strerror(err));
		retry_later(m);
		return;
	}
	uint64_t view = 0;
	int64_t mod = 0;
	if (resp->n_kvs) {
		char buf[32];
		size_t len = MC_MIN(resp->kvs[0]->value.len, sizeof(buf) - 1);
		if (len)
			memcpy(buf, resp->kvs[0]->value.data, len);
		buf[len] = '\0';
		view = strtoull(buf, NULL, 10);
		mod = resp->kvs[0]->mod_revision;
	}
	char value[192], vnum[32];
	snprintf(value, sizeof(value), "%s %llu", m->self_addr,
		 (unsigned long long)(view + 1));
	snprintf(vnum, sizeof(vnum), "%llu", (unsigned long long)(view + 1));

	Etcdserverpb__Compare cmp[2];
	Etcdserverpb__Compare *cmps[2] = {&cmp[0], &cmp[1]};
	etcdserverpb__compare__init(&cmp[0]);
	cmp[0].result = ETCDSERVERPB__COMPARE__COMPARE_RESULT__EQUAL;
	cmp[0].target = ETCDSERVERPB__COMPARE__COMPARE_TARGET__CREATE;
	cmp[0].key.data = (uint8_t *)m->leader_key;
	cmp[0].key.len = strlen(m->leader_key);
	cmp[0].target_union_case = ETCDSERVERPB__COMPARE__TARGET_UNION_CREATE_REVISION;
	cmp[0].create_revision = 0;
	etcdserverpb__compare__init(&cmp[1]);
	cmp[1].result = ETCDSERVERPB__COMPARE__COMPARE_RESULT__EQUAL;
	cmp[1].target = ETCDSERVERPB__COMPARE__COMPARE_TARGET__MOD;
	cmp[1].key.data = (uint8_t *)m->view_key;
	cmp[1].key.len = strlen(m->view_key);
	cmp[1].target_union_case = ETCDSERVERPB__COMPARE__TARGET_UNION_MOD_REVISION;
	cmp[1].mod_revision = mod;

	Etcdserverpb__PutRequest put_leader = ETCDSERVERPB__PUT_REQUEST__INIT;
	put_leader.key.data = (uint8_t *)m->leader_key;
	put_leader.key.len = strlen(m->leader_key);
	put_leader.value.data = (uint8_t *)value;
	put_leader.value.len = strlen(value);
	put_leader.lease = m->lease_id;
	Etcdserverpb__PutRequest put_view = ETCDSERVERPB__PUT_REQUEST__INIT;
	put_view.key.data = (uint8_t *)m->view_key;
	put_view.key.len = strlen(m->view_key);
	put_view.value.data = (uint8_t *)vnum;
	put_view.value.len = strlen(vnum);
	Etcdserverpb__RequestOp ops[2], *opp[2] = {&ops[0], &ops[1]};
	etcdserverpb__request_op__init(&ops[0]);
	ops[0].request_case = ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_PUT;
	ops[0].request_put = &put_leader;
	etcdserverpb__request_op__init(&ops[1]);
	ops[1].request_case = ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_PUT;
	ops[1].request_put = &put_view;

	Etcdserverpb__RangeRequest get_leader = ETCDSERVERPB__RANGE_REQUEST__INIT;
	get_leader.key.data = (uint8_t *)m->leader_key;
	get_leader.key.len = strlen(m->leader_key);
	Etcdserverpb__RequestOp fop, *fopp[1] = {&fop};
	etcdserverpb__request_op__init(&fop);
	fop.request_case = ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_RANGE;
	fop.request_range = &get_leader;

	Etcdserverpb__TxnRequest txn = ETCDSERVERPB__TXN_REQUEST__INIT;
	txn.n_compare = 2;
	txn.compare = cmps;
	txn.n_success = 2;
	txn.success = opp;
	txn.n_failure = 1;
	txn.failure = fopp;

	struct txn_ctx *x = malloc(sizeof(*x));
	int rc = x ? 0 : -ENOMEM;
	if (x) {
		x->m = m;
		x->view = view + 1;
		rc = etcd_txn(m->etcd, &txn, on_txn, x);
		if (rc)
			free(x);
	}
	if (rc) {
		m->campaign_busy = false;
		log_warn("campaign: %s; retrying", mc_strerror(rc));
		retry_later(m);
	}
}

static void read_view(struct master *m)
{
	Etcdserverpb__RangeRequest req = ETCDSERVERPB__RANGE_REQUEST__INIT;
	req.key.data = (uint8_t *)m->view_key;
	req.key.len = strlen(m->view_key);
	int rc = etcd_range(m->etcd, &req, on_view, m);
	if (rc) {
		m->campaign_busy = false;
		retry_later(m);
	}
}

static void on_lease_granted(struct etcd_lease *l, void *ud, int err, int64_t id)
{
	struct master *m = ud;
	if (err) {
		m->lease = NULL;
		if (err == MC_ECANCELLED)
			return;
		m->campaign_busy = false;
		log_warn("cannot get a lease from meta (%s): %s; retrying",
			 etcd_client_endpoint(m->etcd), mc_strerror(err));
		retry_later(m);
		return;
	}
	(void)l;
	m->lease_id = id;
	if (m->stopping) {
		m->campaign_busy = false;
		return;
	}
	read_view(m);
}

static void on_lease_lost(struct etcd_lease *l, void *ud, int err)
{
	struct master *m = ud;
	(void)l;
	m->lease = NULL;
	m->lease_id = 0;
	if (err == MC_ECANCELLED || m->stopping)
		return;
	step_down(m, "its meta lease was lost");
	if (!m->campaign_busy) {
		m->retry_ms = 0;
		retry_later(m);
	}
}

static const struct etcd_lease_cbs lease_cbs = {
	.on_granted = on_lease_granted,
	.on_lost = on_lease_lost,
};

static void self_address(struct master *m)
{
	if (*m->advertise) {
		snprintf(m->self_addr, sizeof(m->self_addr), "%s", m->advertise);
		return;
	}
	const char *colon = strrchr(m->listen, ':');
	if (colon && strcmp(colon, ":0") == 0 && rpc_server_port(m->rpc, 0) > 0) {
		snprintf(m->self_addr, sizeof(m->self_addr), "%.*s:%d",
			 (int)(colon - m->listen), m->listen, rpc_server_port(m->rpc, 0));
		return;
	}
	snprintf(m->self_addr, sizeof(m->self_addr), "%s", m->listen);
}

static void campaign(struct master *m)
{
	if (m->stopping || m->leader || m->campaign_busy)
		return;
	if (!*m->self_addr)
		self_address(m);
	if (!m->etcd) {
		log_info(
			"no --meta-endpoints: leading view 1 alone (no standby can take over)");
		master__set_leader(m, true, 1, m->self_addr);
		return;
	}
	m->campaign_busy = true;
	if (m->lease && m->lease_id) {
		read_view(m);
		return;
	}
	if (m->lease)
		return; /* grant in flight */
	int64_t ttl_s = (int64_t)((m->leader_lease_ttl_ms + 999) / 1000);
	int rc = etcd_lease_grant(m->etcd, ttl_s, &lease_cbs, m, &m->lease);
	if (rc) {
		m->lease = NULL;
		m->campaign_busy = false;
		log_warn("cannot ask meta for a lease: %s; retrying", mc_strerror(rc));
		retry_later(m);
	}
}

int master__ha_start(struct master *m, const uint8_t *key, size_t klen)
{
	if (*m->meta_endpoints) {
		struct etcd_opts eo = {
			.endpoints = m->meta_endpoints, .auth_key = key, .auth_key_len = klen};
		int rc = etcd_client_new(m->loop, &eo, &m->etcd);
		if (rc) {
			log_error("--meta-endpoints '%s': %s", m->meta_endpoints,
				  mc_strerror(rc));
			return rc;
		}
	}
	uv_timer_init(m->loop, &m->retry);
	m->retry.data = m;
	/* On the loop's next turn: the server listens by then. */
	uv_timer_start(&m->retry, on_retry, 0, 0);
	return 0;
}

/* ------------------------------------------------------------ stop */

struct stop_ctx {
	struct master *m;
	void (*done)(struct master *m);
};

static void on_retry_closed(uv_handle_t *h)
{
	struct stop_ctx *x = h->data;
	struct master *m = x->m;
	void (*done)(struct master * m) = x->done;
	free(x);
	m->retry.data = m;
	done(m);
}

static void finish_stop(struct stop_ctx *x)
{
	struct master *m = x->m;
	if (m->watch) {
		etcd_watch_cancel(m->watch);
		m->watch = NULL;
	}
	if (m->lease) {
		/* Best effort: the client is freed next, which cancels the
		 * revoke if it has not gone out; the lease then expires. */
		etcd_lease_revoke(m->lease);
		m->lease = NULL;
	}
	if (m->etcd) {
		etcd_client_free(m->etcd);
		m->etcd = NULL;
	}
	m->retry.data = x;
	uv_close((uv_handle_t *)&m->retry, on_retry_closed);
}

static void on_resigned(void *ud, int err, const Etcdserverpb__TxnResponse *resp)
{
	struct stop_ctx *x = ud;
	(void)resp;
	if (err == MC_ECANCELLED) {
		free(x);
		return;
	}
	if (err)
		log_warn("could not delete the leader key: %s (it goes with the lease)",
			 mc_strerror(err));
	else
		log_info("resigned: leader key deleted");
	finish_stop(x);
}

void master__ha_stop(struct master *m, void (*done)(struct master *m))
{
	struct stop_ctx *x = malloc(sizeof(*x));
	uv_timer_stop(&m->retry);
	if (!x) {
		/* Cannot even remember what to call: close without resigning. */
		m->retry.data = m;
		uv_close((uv_handle_t *)&m->retry, NULL);
		done(m);
		return;
	}
	x->m = m;
	x->done = done;
	bool held = m->etcd && m->lease && m->lease_id && m->leader_addr[0] &&
		    strcmp(m->leader_addr, m->self_addr) == 0;
	if (held) {
		/* Delete the key only while it is still ours (our lease). */
		Etcdserverpb__Compare cmp, *cmps[1] = {&cmp};
		etcdserverpb__compare__init(&cmp);
		cmp.result = ETCDSERVERPB__COMPARE__COMPARE_RESULT__EQUAL;
		cmp.target = ETCDSERVERPB__COMPARE__COMPARE_TARGET__LEASE;
		cmp.key.data = (uint8_t *)m->leader_key;
		cmp.key.len = strlen(m->leader_key);
		cmp.target_union_case = ETCDSERVERPB__COMPARE__TARGET_UNION_LEASE;
		cmp.lease = m->lease_id;
		Etcdserverpb__DeleteRangeRequest del =
			ETCDSERVERPB__DELETE_RANGE_REQUEST__INIT;
		del.key.data = (uint8_t *)m->leader_key;
		del.key.len = strlen(m->leader_key);
		Etcdserverpb__RequestOp op, *ops[1] = {&op};
		etcdserverpb__request_op__init(&op);
		op.request_case = ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_DELETE_RANGE;
		op.request_delete_range = &del;
		Etcdserverpb__TxnRequest txn = ETCDSERVERPB__TXN_REQUEST__INIT;
		txn.n_compare = 1;
		txn.compare = cmps;
		txn.n_success = 1;
		txn.success = ops;
		if (etcd_txn(m->etcd, &txn, on_resigned, x) == 0)
			return;
	}
	finish_stop(x);
}

void master__ha_free(struct master *m)
{
	if (m->etcd)
		etcd_client_free(m->etcd);
	m->etcd = NULL;
}
