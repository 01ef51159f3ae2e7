/*
 * test_meta_sm: the meta state machine and translations, without Raft,
 * sockets or a node — log entries built the way the node builds them
 * (meta__wrap_request) applied with meta__sm_apply, reads served with
 * meta__sm_read and meta__sm_leader, and the answers checked as the etcd
 * messages a client gets: KV writes and txn, compaction, leases,
 * membership changes carried by conf change entries and the effects they
 * report (which the driver turns into peer connections), the NOSPACE
 * alarm, member attributes, the snapshot of the whole state and its
 * refusal when corrupt, determinism (two members applying the same
 * entries at different local times end in the same state), error mapping,
 * and Raft messages through their protobuf form.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "meta/meta_int.h"

static uv_loop_t loop;
/* The applying member's clock: tests move it; nothing replicated may
 * depend on it. */
static uint64_t now_ms = 1000;
static struct meta__sm_effects last_fx;

static struct meta__sm *node_new(uint64_t id)
{
	struct meta__sm *sm = malloc(sizeof(*sm));
	struct mvcc_options mo = {.min_lease_ttl_s = 2};
	cr_assert_not_null(sm);
	cr_assert_eq(meta__sm_init(sm, &mo), 0);
	sm->member_id = id;
	sm->cluster_id = 77;
	return sm;
}

static void node_free(struct meta__sm *sm)
{
	meta__sm_free(sm);
	free(sm);
}

static struct meta__sm_in in_now(void)
{
	return (struct meta__sm_in){.now_ms = now_ms, .term = 3};
}

static void setup(void)
{
	cr_assert_eq(uv_loop_init(&loop), 0);
}

static void teardown(void)
{
	cr_assert_eq(uv_loop_close(&loop), 0);
}

TestSuite(meta_sm, .init = setup, .fini = teardown);

static uint64_t next_index = 1;

/* Apply method m's request as the node would log it; r may be NULL. */
static int apply(struct meta__sm *n, enum meta__method m, const ProtobufCMessage *req,
		 struct meta__reply *r)
{
	struct meta__sm_in in = in_now();
	size_t len = protobuf_c_message_get_packed_size(req);
	uint8_t *buf = malloc(len + 1), *ent;
	size_t elen;
	protobuf_c_message_pack(req, buf);
	cr_assert_eq(meta__wrap_request(m, buf, len, &ent, &elen), 0);
	struct raft_entry e = {.term = 3,
			       .index = next_index++,
			       .type = RAFT_ENTRY_NORMAL,
			       .data = ent,
			       .len = elen};
	int rc = meta__sm_apply(n, &e, &in, r, &last_fx);
	free(ent);
	free(buf);
	return rc;
}

static void put(struct meta__sm *n, const char *k, const char *v, struct meta__reply *r)
{
	Etcdserverpb__PutRequest q = ETCDSERVERPB__PUT_REQUEST__INIT;
	q.key = (ProtobufCBinaryData){strlen(k), (uint8_t *)k};
	q.value = (ProtobufCBinaryData){strlen(v), (uint8_t *)v};
	q.prev_kv = true;
	cr_assert_eq(apply(n, META_M_PUT, &q.base, r), 0);
}

/* A Range served from the local state; returns the values joined by ','. */
static char *range(struct meta__sm *n, const char *k, const char *end, int64_t rev)
{
	static char out[4096];
	Etcdserverpb__RangeRequest q = ETCDSERVERPB__RANGE_REQUEST__INIT;
	q.key = (ProtobufCBinaryData){strlen(k), (uint8_t *)k};
	if (end)
		q.range_end = (ProtobufCBinaryData){strlen(end), (uint8_t *)end};
	q.revision = rev;
	uint8_t buf[512];
	size_t len = etcdserverpb__range_request__pack(&q, buf);
	struct meta__reply r = {0};
	struct meta__sm_in in = in_now();
	meta__sm_read(n, &in, META_M_RANGE, buf, len, &r);
	out[0] = '\0';
	if (r.code) {
		snprintf(out, sizeof(out), "error %d", r.code);
	} else {
		const Etcdserverpb__RangeResponse *p = (const void *)r.resp;
		size_t o = 0;
		for (size_t i = 0; i < p->n_kvs; i++)
			o += (size_t)snprintf(out + o, sizeof(out) - o, "%s%.*s", i ? "," : "",
					      (int)p->kvs[i]->value.len,
					      p->kvs[i]->value.data);
	}
	meta__reply_free(&r);
	return out;
}

Test(meta_sm, kv_writes_answer_like_etcd)
{
	struct meta__sm *n = node_new(5);
	struct meta__reply r = {0};

	put(n, "a", "1", &r);
	cr_assert_eq(r.code, 0);
	const Etcdserverpb__PutResponse *p = (const void *)r.resp;
	cr_assert_eq(p->header->revision, 2);
	cr_assert_eq(p->header->cluster_id, 77);
	cr_assert_eq(p->header->member_id, 5);
	cr_assert_eq(p->header->raft_term, 3);
	cr_assert_null(p->prev_kv);
	meta__reply_free(&r);
	put(n, "a", "2", &r);
	p = (const void *)r.resp;
	cr_assert_not_null(p->prev_kv);
	cr_assert_eq(p->prev_kv->value.len, 1);
	cr_assert_eq(p->prev_kv->value.data[0], '1');
	meta__reply_free(&r);
	put(n, "b", "x", NULL); /* a follower applies without an answer */
	cr_assert_str_eq(range(n, "a", "c", 0), "2,x");
	cr_assert_str_eq(range(n, "a", NULL, 2), "1");

	/* Txn: compare the value, swap it, read it back inside */
	Etcdserverpb__Compare cmp = ETCDSERVERPB__COMPARE__INIT;
	Etcdserverpb__Compare *cmps[] = {&cmp};
	cmp.key = (ProtobufCBinaryData){1, (uint8_t *)"a"};
	cmp.target = ETCDSERVERPB__COMPARE__COMPARE_TARGET__VALUE;
	cmp.target_union_case = ETCDSERVERPB__COMPARE__TARGET_UNION_VALUE;
	cmp.value = (ProtobufCBinaryData){1, (uint8_t *)"2"};
	Etcdserverpb__PutRequest sp = ETCDSERVERPB__PUT_REQUEST__INIT;
	sp.key = (ProtobufCBinaryData){1, (uint8_t *)"a"};
	sp.value = (ProtobufCBinaryData){1, (uint8_t *)"3"};
	Etcdserverpb__RangeRequest rr = ETCDSERVERPB__RANGE_REQUEST__INIT;
	rr.key = sp.key;
	Etcdserverpb__RequestOp o1 = ETCDSERVERPB__REQUEST_OP__INIT, o2 = o1;
	o1.request_case = ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_PUT;
	o1.request_put = &sp;
	o2.request_case = ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_RANGE;
	o2.request_range = &rr;
	Etcdserverpb__RequestOp *ops[] = {&o1, &o2};
	Etcdserverpb__TxnRequest t = ETCDSERVERPB__TXN_REQUEST__INIT;
	t.compare = cmps;
	t.n_compare = 1;
	t.success = ops;
	t.n_success = 2;
	cr_assert(meta__txn_writes(&t, true));
	cr_assert(!meta__txn_serializable(&t));
	cr_assert_eq(apply(n, META_M_TXN, &t.base, &r), 0);
	const Etcdserverpb__TxnResponse *tr = (const void *)r.resp;
	cr_assert(tr->succeeded);
	cr_assert_eq(tr->n_responses, 2);
	cr_assert_eq(tr->responses[1]->response_range->kvs[0]->value.data[0], '3');
	cr_assert_not_null(tr->responses[0]->response_put->header,
			   "nested headers, like etcd");
	meta__reply_free(&r);
	cr_assert_eq(apply(n, META_M_TXN, &t.base, &r), 0);
	cr_assert(!((const Etcdserverpb__TxnResponse *)r.resp)->succeeded, "value is 3 now");
	meta__reply_free(&r);

	/* DeleteRange with prev_kv; compaction; reads below it fail */
	Etcdserverpb__DeleteRangeRequest d = ETCDSERVERPB__DELETE_RANGE_REQUEST__INIT;
	d.key = (ProtobufCBinaryData){1, (uint8_t *)"a"};
	d.range_end = (ProtobufCBinaryData){1, (uint8_t *)"z"};
	d.prev_kv = true;
	cr_assert_eq(apply(n, META_M_DELETE_RANGE, &d.base, &r), 0);
	cr_assert_eq(((const Etcdserverpb__DeleteRangeResponse *)r.resp)->deleted, 2);
	cr_assert_eq(((const Etcdserverpb__DeleteRangeResponse *)r.resp)->n_prev_kvs, 2);
	meta__reply_free(&r);
	Etcdserverpb__CompactionRequest c = ETCDSERVERPB__COMPACTION_REQUEST__INIT;
	c.revision = mvcc_rev(n->store);
	cr_assert_eq(apply(n, META_M_COMPACT, &c.base, &r), 0);
	cr_assert_eq(r.code, 0);
	cr_assert_not_null(((const Etcdserverpb__CompactionResponse *)r.resp)->header);
	meta__reply_free(&r);
	cr_assert_str_eq(range(n, "a", NULL, 2), "error -900");
	cr_assert_eq(apply(n, META_M_COMPACT, &c.base, &r), 0);
	cr_assert_eq(r.code, MVCC_ECOMPACTED, "compacting twice is the request's error");
	meta__reply_free(&r);

	/* a request error leaves the store alone and is the answer */
	Etcdserverpb__PutRequest empty = ETCDSERVERPB__PUT_REQUEST__INIT;
	int64_t rev = mvcc_rev(n->store);
	cr_assert_eq(apply(n, META_M_PUT, &empty.base, &r), 0);
	cr_assert_eq(r.code, MVCC_EEMPTY_KEY);
	cr_assert_eq(mvcc_rev(n->store), rev);
	meta__reply_free(&r);
	node_free(n);
}

Test(meta_sm, wrapped_entry_is_a_request_message)
{
	Etcdserverpb__PutRequest q = ETCDSERVERPB__PUT_REQUEST__INIT;
	char big[300];
	memset(big, 'v', sizeof(big));
	q.key = (ProtobufCBinaryData){3, (uint8_t *)"key"};
	q.value = (ProtobufCBinaryData){sizeof(big), (uint8_t *)big};
	q.lease = 42;
	size_t len = etcdserverpb__put_request__get_packed_size(&q);
	uint8_t buf[512], *ent;
	size_t elen;
	etcdserverpb__put_request__pack(&q, buf);
	cr_assert_eq(meta__wrap_request(META_M_PUT, buf, len, &ent, &elen), 0);
	Mooncake__Meta__Request *r = mooncake__meta__request__unpack(NULL, elen, ent);
	cr_assert_not_null(r);
	cr_assert_eq(r->req_case, MOONCAKE__META__REQUEST__REQ_PUT);
	cr_assert_eq(r->put->lease, 42);
	cr_assert_eq(r->put->value.len, sizeof(big));
	/* the same bytes protobuf-c makes */
	Mooncake__Meta__Request w = MOONCAKE__META__REQUEST__INIT;
	w.req_case = MOONCAKE__META__REQUEST__REQ_PUT;
	w.put = &q;
	uint8_t buf2[512];
	cr_assert_eq(mooncake__meta__request__get_packed_size(&w), elen);
	mooncake__meta__request__pack(&w, buf2);
	cr_assert_eq(memcmp(buf2, ent, elen), 0);
	mooncake__meta__request__free_unpacked(r, NULL);
	free(ent);
	cr_assert_eq(meta__wrap_request(META_M_RANGE, buf, len, &ent, &elen), -EINVAL,
		     "reads are not logged");
}

Test(meta_sm, undecodable_entry_is_fatal)
{
	struct meta__sm *n = node_new(5);
	uint8_t junk[] = {0xff, 0xff, 0xff, 0x01};
	struct raft_entry e = {.term = 1,
			       .index = 1,
			       .type = RAFT_ENTRY_NORMAL,
			       .data = junk,
			       .len = sizeof(junk)};
	struct meta__sm_in in = in_now();
	cr_assert_eq(meta__sm_apply(n, &e, &in, NULL, &last_fx), -EBADMSG);
	e.type = RAFT_ENTRY_CONF_CHANGE;
	cr_assert_eq(meta__sm_apply(n, &e, &in, NULL, &last_fx), -EBADMSG);
	e.type = RAFT_ENTRY_NORMAL;
	e.len = 0;
	cr_assert_eq(meta__sm_apply(n, &e, &in, NULL, &last_fx), 0, "a leader's empty entry");
	node_free(n);
}

static int conf(struct meta__sm *n, enum raft_conf_change_type type, uint64_t id,
		const char *peer, struct meta__reply *r)
{
	Mooncake__Meta__ConfContext ctx = MOONCAKE__META__CONF_CONTEXT__INIT;
	Mooncake__Meta__Member pm = MOONCAKE__META__MEMBER__INIT;
	uint8_t cbuf[256], ebuf[300];
	struct raft_conf_change cc = {.type = type, .node_id = id};
	char *urls[] = {(char *)peer};
	if (peer) {
		pm.id = id;
		pm.name = "";
		pm.peer_urls = urls;
		pm.n_peer_urls = 1;
		pm.learner = type == RAFT_CC_ADD_LEARNER;
		ctx.member = &pm;
		cc.context_len = mooncake__meta__conf_context__pack(&ctx, cbuf);
		cc.context = cbuf;
	}
	struct raft_entry e = {.term = 2,
			       .index = next_index++,
			       .type = RAFT_ENTRY_CONF_CHANGE,
			       .data = ebuf,
			       .len = raft_conf_change_encode(&cc, ebuf)};
	struct meta__sm_in in = in_now();
	return meta__sm_apply(n, &e, &in, r, &last_fx);
}

Test(meta_sm, membership_from_conf_change_entries)
{
	struct meta__sm *n = node_new(1);
	struct meta__reply r = {0};
	cr_assert_eq(conf(n, RAFT_CC_ADD_VOTER, 1, "http://10.0.0.1:2380", NULL), 0);
	cr_assert_eq(conf(n, RAFT_CC_ADD_VOTER, 2, "http://10.0.0.2:2380", &r), 0);
	const Etcdserverpb__MemberAddResponse *a = (const void *)r.resp;
	cr_assert_eq(a->n_members, 2);
	cr_assert_eq(a->member->id, 2);
	cr_assert_str_eq(a->member->peerurls[0], "http://10.0.0.2:2380");
	cr_assert_str_eq(a->member->name, "", "unstarted until it publishes");
	meta__reply_free(&r);
	cr_assert_eq(conf(n, RAFT_CC_ADD_LEARNER, 3, "http://10.0.0.3:2380", NULL), 0);
	cr_assert(meta__member_find(n, 3)->learner);
	cr_assert_eq(last_fx.member_change, META_MEMBER_ADDED, "the driver learns of it");
	cr_assert_eq(last_fx.member_id, 3);

	/* the conf state of the applied table */
	uint8_t *cb;
	size_t cl;
	struct raft_conf_state cs;
	cr_assert_eq(meta__conf_bytes(n, &cb, &cl), 0);
	cr_assert_eq(meta__conf_parse(cb, cl, &cs), 0);
	cr_assert_eq(cs.n_voters, 2);
	cr_assert_eq(cs.n_learners, 1);
	cr_assert_eq(cs.learners[0], 3);
	meta__conf_state_free(&cs);
	free(cb);

	cr_assert_eq(conf(n, RAFT_CC_PROMOTE, 3, NULL, &r), 0);
	cr_assert(!meta__member_find(n, 3)->learner);
	cr_assert_eq(last_fx.member_change, META_MEMBER_PROMOTED);
	cr_assert_eq(((const Etcdserverpb__MemberPromoteResponse *)r.resp)->n_members, 3);
	meta__reply_free(&r);
	cr_assert_eq(conf(n, RAFT_CC_REMOVE, 2, NULL, &r), 0);
	cr_assert_null(meta__member_find(n, 2));
	cr_assert_eq(last_fx.member_change, META_MEMBER_REMOVED);
	cr_assert_eq(last_fx.member_id, 2);
	cr_assert(meta__is_removed(n, 2));
	cr_assert_eq(((const Etcdserverpb__MemberRemoveResponse *)r.resp)->n_members, 2);
	meta__reply_free(&r);

	/* a started member publishes its name and client URL */
	Mooncake__Meta__MemberAttributes at = MOONCAKE__META__MEMBER_ATTRIBUTES__INIT;
	char *curls[] = {"http://127.0.0.1:2379"};
	at.id = 1;
	at.name = "m1";
	at.client_urls = curls;
	at.n_client_urls = 1;
	cr_assert_eq(apply(n, META_M_PUBLISH, &at.base, NULL), 0);
	cr_assert_eq(last_fx.member_change, META_MEMBER_PUBLISHED);
	cr_assert_str_eq(meta__member_find(n, 1)->name, "m1");
	cr_assert_str_eq(meta__member_find(n, 1)->client_url, "http://127.0.0.1:2379");

	/* MemberUpdate moves a peer; an unknown member is etcd's error */
	Etcdserverpb__MemberUpdateRequest u = ETCDSERVERPB__MEMBER_UPDATE_REQUEST__INIT;
	char *purls[] = {"http://10.0.0.33:2380"};
	u.id = 3;
	u.peerurls = purls;
	u.n_peerurls = 1;
	cr_assert_eq(apply(n, META_M_MEMBER_UPDATE, &u.base, &r), 0);
	cr_assert_str_eq(meta__member_find(n, 3)->peer_url, "http://10.0.0.33:2380");
	cr_assert_eq(last_fx.member_change, META_MEMBER_MOVED);
	meta__reply_free(&r);
	u.id = 99;
	cr_assert_eq(apply(n, META_M_MEMBER_UPDATE, &u.base, &r), 0);
	cr_assert_eq(r.code, META_EMEMBER_NOT_FOUND);
	meta__reply_free(&r);
	node_free(n);
}

Test(meta_sm, nospace_alarm_caps_writes_until_disarmed)
{
	struct meta__sm *n = node_new(1);
	struct meta__reply r = {0};
	put(n, "k", "small", NULL);
	cr_assert(!meta__over_quota(n, 4096, 100));
	cr_assert(meta__over_quota(n, 4096, 5000));
	Etcdserverpb__AlarmRequest a = ETCDSERVERPB__ALARM_REQUEST__INIT;
	a.action = ETCDSERVERPB__ALARM_REQUEST__ALARM_ACTION__ACTIVATE;
	a.memberid = 1;
	a.alarm = ETCDSERVERPB__ALARM_TYPE__NOSPACE;
	cr_assert_eq(apply(n, META_M_ALARM, &a.base, &r), 0);
	cr_assert_eq(((const Etcdserverpb__AlarmResponse *)r.resp)->n_alarms, 1);
	meta__reply_free(&r);
	cr_assert(meta__alarm_active(n, ETCDSERVERPB__ALARM_TYPE__NOSPACE));
	cr_assert_eq(last_fx.alarm_raised, ETCDSERVERPB__ALARM_TYPE__NOSPACE);
	cr_assert(meta__over_quota(n, 4096, 1), "the alarm refuses even small writes");
	/* applied on every member: puts and grants refused, deletes pass */
	put(n, "k2", "v", &r);
	cr_assert_eq(r.code, META_ENOSPACE);
	meta__reply_free(&r);
	Etcdserverpb__LeaseGrantRequest g = ETCDSERVERPB__LEASE_GRANT_REQUEST__INIT;
	g.ttl = 10;
	cr_assert_eq(apply(n, META_M_LEASE_GRANT, &g.base, &r), 0);
	cr_assert_eq(r.code, META_ENOSPACE);
	meta__reply_free(&r);
	Etcdserverpb__DeleteRangeRequest d = ETCDSERVERPB__DELETE_RANGE_REQUEST__INIT;
	d.key = (ProtobufCBinaryData){1, (uint8_t *)"k"};
	cr_assert_eq(apply(n, META_M_DELETE_RANGE, &d.base, &r), 0);
	cr_assert_eq(r.code, 0);
	meta__reply_free(&r);
	int st;
	const char *msg;
	meta__status_of(META_ENOSPACE, &st, &msg);
	cr_assert_eq(st, RPC_RESOURCE_EXHAUSTED);
	cr_assert_str_eq(msg, "etcdserver: mvcc: database space exceeded");
	a.action = ETCDSERVERPB__ALARM_REQUEST__ALARM_ACTION__DEACTIVATE;
	cr_assert_eq(apply(n, META_M_ALARM, &a.base, NULL), 0);
	cr_assert_eq(last_fx.alarms_cleared, 1);
	cr_assert(!meta__alarm_active(n, ETCDSERVERPB__ALARM_TYPE__NOSPACE));
	put(n, "k2", "v", &r);
	cr_assert_eq(r.code, 0);
	meta__reply_free(&r);
	node_free(n);
}

static void lease_op(struct meta__sm *n, enum meta__method m, const ProtobufCMessage *q,
		     struct meta__reply *r, int want_rc)
{
	uint8_t buf[256];
	size_t len = protobuf_c_message_pack(q, buf);
	struct meta__sm_in in = in_now();
	cr_assert_eq(meta__sm_leader(n, &in, m, buf, len, r), want_rc);
}

Test(meta_sm, leases_grant_keepalive_ttl_revoke)
{
	struct meta__sm *n = node_new(1);
	struct meta__reply r = {0};
	Etcdserverpb__LeaseGrantRequest g = ETCDSERVERPB__LEASE_GRANT_REQUEST__INIT;
	g.ttl = 30;
	g.id = 7;
	cr_assert_eq(apply(n, META_M_LEASE_GRANT, &g.base, &r), 0);
	const Etcdserverpb__LeaseGrantResponse *gr = (const void *)r.resp;
	cr_assert_eq(gr->id, 7);
	cr_assert_eq(gr->ttl, 30);
	meta__reply_free(&r);
	cr_assert_eq(apply(n, META_M_LEASE_GRANT, &g.base, &r), 0);
	cr_assert_eq(r.code, MVCC_ELEASE_EXISTS);
	meta__reply_free(&r);
	Etcdserverpb__PutRequest q = ETCDSERVERPB__PUT_REQUEST__INIT;
	q.key = (ProtobufCBinaryData){1, (uint8_t *)"l"};
	q.lease = 7;
	cr_assert_eq(apply(n, META_M_PUT, &q.base, NULL), 0);

	/* only the leader (the primary lessor) renews */
	Etcdserverpb__LeaseKeepAliveRequest ka = ETCDSERVERPB__LEASE_KEEP_ALIVE_REQUEST__INIT;
	ka.id = 7;
	lease_op(n, META_M_LEASE_KEEPALIVE, &ka.base, &r, MC_ENOT_LEADER);
	meta__reply_free(&r);
	lease_promote(mvcc_leases(n->store), now_ms, 1000);
	lease_op(n, META_M_LEASE_KEEPALIVE, &ka.base, &r, 0);
	cr_assert_eq(((const Etcdserverpb__LeaseKeepAliveResponse *)r.resp)->ttl, 30);
	meta__reply_free(&r);
	Etcdserverpb__LeaseTimeToLiveRequest tq =
		ETCDSERVERPB__LEASE_TIME_TO_LIVE_REQUEST__INIT;
	tq.id = 7;
	tq.keys = true;
	lease_op(n, META_M_LEASE_TTL, &tq.base, &r, 0);
	const Etcdserverpb__LeaseTimeToLiveResponse *tr = (const void *)r.resp;
	cr_assert_eq(tr->grantedttl, 30);
	cr_assert_eq(tr->n_keys, 1);
	cr_assert_eq(tr->keys[0].data[0], 'l');
	meta__reply_free(&r);

	Etcdserverpb__LeaseRevokeRequest rv = ETCDSERVERPB__LEASE_REVOKE_REQUEST__INIT;
	rv.id = 7;
	cr_assert_eq(apply(n, META_M_LEASE_REVOKE, &rv.base, &r), 0);
	cr_assert_eq(r.code, 0);
	meta__reply_free(&r);
	cr_assert_str_eq(range(n, "l", NULL, 0), "", "the key went with the lease");
	/* etcd's answers for a lease that is gone */
	lease_op(n, META_M_LEASE_KEEPALIVE, &ka.base, &r, 0);
	cr_assert_eq(((const Etcdserverpb__LeaseKeepAliveResponse *)r.resp)->ttl, 0);
	meta__reply_free(&r);
	lease_op(n, META_M_LEASE_TTL, &tq.base, &r, 0);
	cr_assert_eq(((const Etcdserverpb__LeaseTimeToLiveResponse *)r.resp)->ttl, -1);
	meta__reply_free(&r);
	cr_assert_eq(apply(n, META_M_LEASE_REVOKE, &rv.base, &r), 0);
	cr_assert_eq(r.code, MVCC_ELEASE_NOT_FOUND);
	meta__reply_free(&r);
	node_free(n);
}

Test(meta_sm, snapshot_round_trip_and_corruption)
{
	struct meta__sm *a = node_new(1);
	for (int i = 0; i < 50; i++) {
		char k[16], v[16];
		snprintf(k, sizeof(k), "k%02d", i);
		snprintf(v, sizeof(v), "v%d", i);
		put(a, k, v, NULL);
	}
	cr_assert_eq(conf(a, RAFT_CC_ADD_VOTER, 1, "http://10.0.0.1:2380", NULL), 0);
	cr_assert_eq(conf(a, RAFT_CC_ADD_LEARNER, 4, "http://10.0.0.4:2380", NULL), 0);
	cr_assert_eq(conf(a, RAFT_CC_ADD_VOTER, 9, "http://10.0.0.9:2380", NULL), 0);
	cr_assert_eq(conf(a, RAFT_CC_REMOVE, 9, NULL, NULL), 0);
	Etcdserverpb__AlarmRequest al = ETCDSERVERPB__ALARM_REQUEST__INIT;
	al.action = ETCDSERVERPB__ALARM_REQUEST__ALARM_ACTION__ACTIVATE;
	al.memberid = 4;
	al.alarm = ETCDSERVERPB__ALARM_TYPE__NOSPACE;
	cr_assert_eq(apply(a, META_M_ALARM, &al.base, NULL), 0);

	uint8_t *data;
	size_t len;
	cr_assert_eq(meta__sm_snapshot(a, &data, &len), 0);
	struct meta__sm *b = node_new(4);
	b->cluster_id = 0;
	cr_assert_eq(meta__sm_restore(b, data, len), 0);
	cr_assert_eq(b->cluster_id, 77);
	cr_assert_str_eq(range(b, "k", "l", 0), range(a, "k", "l", 0));
	cr_assert_eq(mvcc_rev(b->store), mvcc_rev(a->store));
	cr_assert_eq(b->n_members, 2);
	cr_assert(meta__member_find(b, 4)->learner);
	cr_assert(meta__is_removed(b, 9));
	cr_assert(meta__alarm_active(b, ETCDSERVERPB__ALARM_TYPE__NOSPACE));

	/* a corrupt snapshot changes nothing */
	int64_t rev = mvcc_rev(b->store);
	data[len - 10] ^= 0x40;
	cr_assert_eq(meta__sm_restore(b, data, len), -EBADMSG);
	cr_assert_eq(meta__sm_restore(b, data, 3), -EBADMSG);
	data[0] = 0xff; /* a header length past the end */
	cr_assert_eq(meta__sm_restore(b, data, len), -EBADMSG);
	cr_assert_eq(mvcc_rev(b->store), rev);
	cr_assert_eq(b->n_members, 2);
	free(data);
	node_free(a);
	node_free(b);
}

/* Pack a reply with the member named in its header cleared: what two
 * members answer must be the same but for who answers. */
static size_t reply_bytes(struct meta__reply *r, uint8_t *out, size_t cap)
{
	if (r->code || !r->resp)
		return (size_t)snprintf((char *)out, cap, "error %d", r->code);
	const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field_by_name(
		r->resp->descriptor, "header");
	if (f) {
		Etcdserverpb__ResponseHeader *h = *(
			Etcdserverpb__ResponseHeader **)((char *)r->resp + f->offset);
		if (h)
			h->member_id = 0;
	}
	size_t len = protobuf_c_message_get_packed_size(r->resp);
	cr_assert_leq(len, cap);
	return protobuf_c_message_pack(r->resp, out);
}

Test(meta_sm, same_entries_at_different_times_give_the_same_state)
{
	/* Two members apply one log: a with its clock near 1 s, b near
	 * 50 days, each advancing by its own steps, both the primary lessor
	 * (the case where the time is used at all). */
	struct meta__sm *a = node_new(1), *b = node_new(2);
	uint64_t t0[2] = {1000, 4321000000ull};
	struct meta__sm *sms[2] = {a, b};
	unsigned seed = 7;
	static uint8_t ra[65536], rb[65536];

	for (int k = 0; k < 2; k++)
		lease_promote(mvcc_leases(sms[k]->store), t0[k], 1000);
	for (int step = 0; step < 400; step++) {
		seed = seed * 1103515245u + 12345u;
		unsigned what = (seed >> 16) % 10, x = (seed >> 8) % 23;
		char key[16], val[16];
		snprintf(key, sizeof(key), "k%02u", x);
		snprintf(val, sizeof(val), "v%d", step);
		Etcdserverpb__PutRequest p = ETCDSERVERPB__PUT_REQUEST__INIT;
		Etcdserverpb__DeleteRangeRequest d = ETCDSERVERPB__DELETE_RANGE_REQUEST__INIT;
		Etcdserverpb__LeaseGrantRequest g = ETCDSERVERPB__LEASE_GRANT_REQUEST__INIT;
		Etcdserverpb__LeaseRevokeRequest rv = ETCDSERVERPB__LEASE_REVOKE_REQUEST__INIT;
		Etcdserverpb__CompactionRequest c = ETCDSERVERPB__COMPACTION_REQUEST__INIT;
		Etcdserverpb__AlarmRequest al = ETCDSERVERPB__ALARM_REQUEST__INIT;
		const ProtobufCMessage *req;
		enum meta__method m;
		switch (what) {
		case 0:
		case 1:
		case 2:
			p.key = (ProtobufCBinaryData){strlen(key), (uint8_t *)key};
			p.value = (ProtobufCBinaryData){strlen(val), (uint8_t *)val};
			p.lease = x % 3 == 0 ? 100 + x % 5 : 0;
			p.prev_kv = true;
			req = &p.base, m = META_M_PUT;
			break;
		case 3:
			d.key = (ProtobufCBinaryData){strlen(key), (uint8_t *)key};
			d.range_end = (ProtobufCBinaryData){3, (uint8_t *)"k2"};
			req = &d.base, m = META_M_DELETE_RANGE;
			break;
		case 4:
		case 5:
			g.id = 100 + x % 5;
			g.ttl = 1 + x;
			req = &g.base, m = META_M_LEASE_GRANT;
			break;
		case 6:
			rv.id = 100 + x % 5;
			req = &rv.base, m = META_M_LEASE_REVOKE;
			break;
		case 7:
			c.revision = mvcc_rev(a->store) - (int64_t)(x % 4);
			req = &c.base, m = META_M_COMPACT;
			break;
		case 8:
			al.action =
				x % 2 ? ETCDSERVERPB__ALARM_REQUEST__ALARM_ACTION__ACTIVATE
				      : ETCDSERVERPB__ALARM_REQUEST__ALARM_ACTION__DEACTIVATE;
			al.memberid = 1;
			al.alarm = ETCDSERVERPB__ALARM_TYPE__NOSPACE;
			req = &al.base, m = META_M_ALARM;
			break;
		default:
			cr_assert_eq(conf(a, x % 2 ? RAFT_CC_ADD_LEARNER : RAFT_CC_REMOVE,
					  50 + x % 3, "http://10.0.0.5:2380", NULL),
				     0);
			next_index--;
			cr_assert_eq(conf(b, x % 2 ? RAFT_CC_ADD_LEARNER : RAFT_CC_REMOVE,
					  50 + x % 3, "http://10.0.0.5:2380", NULL),
				     0);
			continue;
		}
		struct meta__reply r1 = {0}, r2 = {0};
		now_ms = t0[0] + (uint64_t)step * 10 + x;
		cr_assert_eq(apply(a, m, req, &r1), 0);
		next_index--;
		now_ms = t0[1] + (uint64_t)step * 37 + 5 * x;
		cr_assert_eq(apply(b, m, req, &r2), 0);
		size_t l1 = reply_bytes(&r1, ra, sizeof(ra)),
		       l2 = reply_bytes(&r2, rb, sizeof(rb));
		cr_assert(l1 == l2 && memcmp(ra, rb, l1) == 0, "step %d: the answers differ",
			  step);
		meta__reply_free(&r1);
		meta__reply_free(&r2);
	}
	/* The replicated state, byte for byte: keys, revisions, lease IDs
	 * and TTLs, members, removed IDs, alarms. */
	uint8_t *sa, *sb;
	size_t la, lb;
	cr_assert_eq(meta__sm_snapshot(a, &sa, &la), 0);
	cr_assert_eq(meta__sm_snapshot(b, &sb, &lb), 0);
	cr_assert_eq(la, lb);
	cr_assert_eq(memcmp(sa, sb, la), 0, "the snapshots differ");
	free(sa);
	free(sb);
	/* The clock only placed each leader's expiries on its own time line:
	 * a lease granted at the same point of the log has the same time left
	 * at the same point of each member's clock. */
	int64_t *ids;
	size_t nids;
	cr_assert_eq(lease_list(mvcc_leases(a->store), &ids, &nids), 0);
	cr_assert_gt(nids, 0);
	for (size_t i = 0; i < nids; i++) {
		struct lease_ttl ta, tb;
		cr_assert_eq(
			lease_time_to_live(mvcc_leases(a->store), ids[i], t0[0], false, &ta),
			0);
		cr_assert_eq(
			lease_time_to_live(mvcc_leases(b->store), ids[i], t0[1], false, &tb),
			0);
		cr_assert_eq(ta.granted_ttl_s, tb.granted_ttl_s);
		cr_assert_geq(ta.ttl_s, ta.granted_ttl_s, "expiry is after the grant");
		cr_assert_geq(tb.ttl_s, tb.granted_ttl_s, "expiry is after the grant");
		lease_ttl_free(&ta);
		lease_ttl_free(&tb);
	}
	free(ids);
	now_ms = 1000;
	node_free(a);
	node_free(b);
}

/* The driver's side of the effects: a fake node whose transport opens no
 * connection. */
static struct meta_node *driver_new(uint64_t id)
{
	struct meta_node *n = calloc(1, sizeof(*n));
	struct mvcc_options mo = {.min_lease_ttl_s = 2};
	cr_assert_not_null(n);
	n->loop = &loop;
	n->id = id;
	n->name = strdup("m1");
	n->self_client_url = strdup("http://127.0.0.1:2379");
	n->finishing = true;
	cr_assert_eq(meta__sm_init(&n->sm, &mo), 0);
	n->sm.member_id = id;
	n->sm.cluster_id = 77;
	return n;
}

static void driver_free(struct meta_node *n)
{
	meta__sm_free(&n->sm);
	meta__peer_free_all(n);
	free(n->name);
	free(n->self_client_url);
	free(n);
}

Test(meta_sm, effects_reach_the_transport)
{
	struct meta_node *n = driver_new(1);
	cr_assert_eq(conf(&n->sm, RAFT_CC_ADD_VOTER, 1, "http://10.0.0.1:2380", NULL), 0);
	meta__sm_effects_done(n, &last_fx);
	cr_assert_null(meta__peer_find(n, 1), "no peer for this member itself");
	cr_assert_eq(conf(&n->sm, RAFT_CC_ADD_LEARNER, 3, "http://10.0.0.3:2380", NULL), 0);
	meta__sm_effects_done(n, &last_fx);
	cr_assert_not_null(meta__peer_find(n, 3), "the transport knows the new member");
	cr_assert_str_eq(meta__peer_find(n, 3)->addr, "10.0.0.3:2380");

	Etcdserverpb__MemberUpdateRequest u = ETCDSERVERPB__MEMBER_UPDATE_REQUEST__INIT;
	char *purls[] = {"http://10.0.0.33:2380"};
	u.id = 3;
	u.peerurls = purls;
	u.n_peerurls = 1;
	cr_assert_eq(apply(&n->sm, META_M_MEMBER_UPDATE, &u.base, NULL), 0);
	meta__sm_effects_done(n, &last_fx);
	cr_assert_str_eq(meta__peer_find(n, 3)->addr, "10.0.0.33:2380");

	Mooncake__Meta__MemberAttributes at = MOONCAKE__META__MEMBER_ATTRIBUTES__INIT;
	char *curls[] = {"http://127.0.0.1:2379"};
	at.id = 1;
	at.name = "m1";
	at.client_urls = curls;
	at.n_client_urls = 1;
	cr_assert(!n->published);
	cr_assert_eq(apply(&n->sm, META_M_PUBLISH, &at.base, NULL), 0);
	meta__sm_effects_done(n, &last_fx);
	cr_assert(n->published);

	/* peers come back from a snapshot */
	uint8_t *data;
	size_t len;
	cr_assert_eq(meta__sm_snapshot(&n->sm, &data, &len), 0);
	struct meta_node *m = driver_new(4);
	cr_assert_eq(meta__sm_restore(&m->sm, data, len), 0);
	meta__sync_members(m);
	cr_assert_not_null(meta__peer_find(m, 1));
	cr_assert_not_null(meta__peer_find(m, 3));
	free(data);

	/* this member removed: the driver stops */
	cr_assert_eq(conf(&n->sm, RAFT_CC_REMOVE, 1, NULL, NULL), 0);
	meta__sm_effects_done(n, &last_fx);
	cr_assert(n->fatal);
	driver_free(m);
	driver_free(n);
}

Test(meta_sm, errors_map_to_etcd_status)
{
	static const struct {
		int code, status;
		const char *msg;
	} want[] = {
		{MVCC_ECOMPACTED, RPC_OUT_OF_RANGE,
		 "etcdserver: mvcc: required revision has been compacted"},
		{MVCC_EFUTURE_REV, RPC_OUT_OF_RANGE,
		 "etcdserver: mvcc: required revision is a future revision"},
		{MVCC_ELEASE_NOT_FOUND, RPC_NOT_FOUND,
		 "etcdserver: requested lease not found"},
		{MVCC_EEMPTY_KEY, RPC_INVALID_ARGUMENT, "etcdserver: key is not provided"},
		{MVCC_ELEASE_EXISTS, RPC_FAILED_PRECONDITION,
		 "etcdserver: lease already exists"},
		{META_ENO_LEADER, RPC_UNAVAILABLE, "etcdserver: no leader"},
		{META_ENOT_LEADER, RPC_FAILED_PRECONDITION, "etcdserver: not leader"},
		{META_ETOO_LARGE, RPC_INVALID_ARGUMENT, "etcdserver: request is too large"},
		{META_EMEMBER_NOT_FOUND, RPC_NOT_FOUND, "etcdserver: member not found"},
		{META_ETIMEOUT, RPC_UNAVAILABLE, "etcdserver: request timed out"},
	};
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		int st;
		const char *msg;
		meta__status_of(want[i].code, &st, &msg);
		cr_assert_eq(st, want[i].status, "code %d", want[i].code);
		cr_assert_str_eq(msg, want[i].msg);
	}
	cr_assert_str_eq(meta__strerror(META_ESTOPPED), "etcdserver: server stopped");
	cr_assert_eq(meta__method_by_name("LeaseKeepAlive"), META_M_LEASE_KEEPALIVE);
	cr_assert_eq(meta__method_by_name("Nope"), -1);
}

Test(meta_sm, raft_messages_survive_protobuf)
{
	uint64_t voters[] = {1, 2, 3}, learners[] = {9};
	struct raft_entry ents[] = {
		{.term = 4, .index = 10, .type = RAFT_ENTRY_NORMAL, .data = "abc", .len = 3},
		{.term = 4,
		 .index = 11,
		 .type = RAFT_ENTRY_CONF_CHANGE,
		 .data = "xy",
		 .len = 2},
		{.term = 5, .index = 12, .type = RAFT_ENTRY_NORMAL, .data = NULL, .len = 0},
	};
	struct raft_msg m = {
		.type = RAFT_MSG_SNAP,
		.from = 1,
		.to = 2,
		.term = 5,
		.log_term = 4,
		.index = 9,
		.commit = 11,
		.reject = true,
		.reject_hint = 7,
		.transfer = true,
		.entries = ents,
		.n_entries = 3,
		.snapshot = {.index = 8, .term = 3, .conf = {voters, 3, learners, 1}},
		.ctx = "ctx!",
		.ctx_len = 4};
	struct meta__arena a = {0};
	Mooncake__Raft__Message *pm = meta__msg_to_pb(&m, &a);
	cr_assert_not_null(pm);
	size_t len = mooncake__raft__message__get_packed_size(pm);
	uint8_t *buf = malloc(len);
	mooncake__raft__message__pack(pm, buf);
	meta__arena_free(&a);
	Mooncake__Raft__Message *back = mooncake__raft__message__unpack(NULL, len, buf);
	cr_assert_not_null(back);
	struct meta__qmsg *q = meta__msg_from_pb(back);
	mooncake__raft__message__free_unpacked(back, NULL);
	free(buf);
	cr_assert_not_null(q);
	const struct raft_msg *r = &q->m;
	cr_assert_eq(r->type, m.type);
	cr_assert_eq(r->from, 1);
	cr_assert_eq(r->to, 2);
	cr_assert_eq(r->term, 5);
	cr_assert_eq(r->log_term, 4);
	cr_assert_eq(r->index, 9);
	cr_assert_eq(r->commit, 11);
	cr_assert(r->reject && r->transfer);
	cr_assert_eq(r->reject_hint, 7);
	cr_assert_eq(r->n_entries, 3);
	cr_assert_eq(r->entries[1].type, RAFT_ENTRY_CONF_CHANGE);
	cr_assert_eq(r->entries[0].len, 3);
	cr_assert_eq(memcmp(r->entries[0].data, "abc", 3), 0);
	cr_assert_eq(r->entries[2].len, 0);
	cr_assert_eq(r->snapshot.index, 8);
	cr_assert_eq(r->snapshot.conf.n_voters, 3);
	cr_assert_eq(r->snapshot.conf.voters[2], 3);
	cr_assert_eq(r->snapshot.conf.learners[0], 9);
	cr_assert_eq(r->ctx_len, 4);
	cr_assert_eq(memcmp(r->ctx, "ctx!", 4), 0);
	/* the queued copy owns everything */
	struct meta__qmsg *c = meta__msg_copy(r);
	free(q);
	cr_assert_eq(memcmp(c->m.entries[1].data, "xy", 2), 0);
	cr_assert_eq(c->m.snapshot.conf.voters[0], 1);
	free(c);
}
