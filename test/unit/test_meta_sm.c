/*
 * test_meta_sm: the meta node's state machine and translations, without
 * Raft or sockets — log entries built the way the node builds them
 * (meta__wrap_request) applied with meta__apply_entry, reads served with
 * meta__serve_read and meta__serve_leader, and the answers checked as the
 * etcd messages a client gets: KV writes and txn, compaction, leases,
 * membership changes carried by conf change entries, the NOSPACE alarm,
 * member attributes, the snapshot of the whole state and its refusal when
 * corrupt, error mapping, and Raft messages through their protobuf form.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "meta/meta_int.h"

static uv_loop_t loop;

static struct meta_node *node_new(uint64_t id)
{
	struct meta_node *n = calloc(1, sizeof(*n));
	cr_assert_not_null(n);
	n->loop = &loop;
	n->id = id;
	n->cluster_id = 77;
	n->term = 3;
	n->o.quota_bytes = 1 << 20;
	n->o.election_ms = 1000;
	n->request_timeout_ms = 5000;
	n->name = strdup("m1");
	n->self_client_url = strdup("http://127.0.0.1:2379");
	n->finishing = true; /* the transport opens no connection */
	cr_assert_eq(meta__sm_new_store(n), 0);
	return n;
}

static void node_free(struct meta_node *n)
{
	meta__sm_free(n);
	meta__peer_free_all(n);
	free(n->name);
	free(n->self_client_url);
	free(n);
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
static int apply(struct meta_node *n, enum meta__method m, const ProtobufCMessage *req,
		 struct meta__reply *r)
{
	size_t len = protobuf_c_message_get_packed_size(req);
	uint8_t *buf = malloc(len + 1), *ent;
	size_t elen;
	protobuf_c_message_pack(req, buf);
	cr_assert_eq(meta__wrap_request(m, buf, len, &ent, &elen), 0);
	struct raft_entry e = {.term = n->term, .index = next_index++,
			       .type = RAFT_ENTRY_NORMAL, .data = ent, .len = elen};
	int rc = meta__apply_entry(n, &e, r);
	free(ent);
	free(buf);
	return rc;
}

static void put(struct meta_node *n, const char *k, const char *v, struct meta__reply *r)
{
	Etcdserverpb__PutRequest q = ETCDSERVERPB__PUT_REQUEST__INIT;
	q.key = (ProtobufCBinaryData){strlen(k), (uint8_t *)k};
	q.value = (ProtobufCBinaryData){strlen(v), (uint8_t *)v};
	q.prev_kv = true;
	cr_assert_eq(apply(n, META_M_PUT, &q.base, r), 0);
}

/* A Range served from the local state; returns the values joined by ','. */
static char *range(struct meta_node *n, const char *k, const char *end, int64_t rev)
{
	static char out[4096];
	Etcdserverpb__RangeRequest q = ETCDSERVERPB__RANGE_REQUEST__INIT;
	q.key = (ProtobufCBinaryData){strlen(k), (uint8_t *)k};
	if (end)
		q.range_end = (ProtobufCBinaryData){strlen(end), (uint8_t *)end};
	q.revision = rev;
	struct meta__op *op = meta__op_new(n, META_M_RANGE, &q.base, 0, NULL, NULL);
	struct meta__reply r = {0};
	cr_assert_not_null(op);
	cr_assert_eq(meta__serve_read(n, op, &r), 0);
	out[0] = '\0';
	if (r.code) {
		snprintf(out, sizeof(out), "error %d", r.code);
	} else {
		const Etcdserverpb__RangeResponse *p = (const void *)r.resp;
		size_t o = 0;
		for (size_t i = 0; i < p->n_kvs; i++)
			o += (size_t)snprintf(out + o, sizeof(out) - o, "%s%.*s", i ? "," : "",
					      (int)p->kvs[i]->value.len, p->kvs[i]->value.data);
	}
	meta__reply_free(&r);
	free(op->req);
	free(op);
	return out;
}

Test(meta_sm, kv_writes_answer_like_etcd)
{
	struct meta_node *n = node_new(5);
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
	cr_assert_not_null(tr->responses[0]->response_put->header, "nested headers, like etcd");
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
	struct meta_node *n = node_new(5);
	uint8_t junk[] = {0xff, 0xff, 0xff, 0x01};
	struct raft_entry e = {.term = 1, .index = 1, .type = RAFT_ENTRY_NORMAL,
			       .data = junk, .len = sizeof(junk)};
	cr_assert_eq(meta__apply_entry(n, &e, NULL), -EBADMSG);
	e.type = RAFT_ENTRY_CONF_CHANGE;
	cr_assert_eq(meta__apply_entry(n, &e, NULL), -EBADMSG);
	e.type = RAFT_ENTRY_NORMAL;
	e.len = 0;
	cr_assert_eq(meta__apply_entry(n, &e, NULL), 0, "a leader's empty entry");
	node_free(n);
}

static int conf(struct meta_node *n, enum raft_conf_change_type type, uint64_t id,
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
	struct raft_entry e = {.term = 2, .index = next_index++, .type = RAFT_ENTRY_CONF_CHANGE,
			       .data = ebuf, .len = raft_conf_change_encode(&cc, ebuf)};
	return meta__apply_entry(n, &e, r);
}

Test(meta_sm, membership_from_conf_change_entries)
{
	struct meta_node *n = node_new(1);
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
	cr_assert_not_null(meta__peer_find(n, 3), "the transport knows the new member");

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
	cr_assert_eq(((const Etcdserverpb__MemberPromoteResponse *)r.resp)->n_members, 3);
	meta__reply_free(&r);
	cr_assert_eq(conf(n, RAFT_CC_REMOVE, 2, NULL, &r), 0);
	cr_assert_null(meta__member_find(n, 2));
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
	cr_assert(!n->published);
	cr_assert_eq(apply(n, META_M_PUBLISH, &at.base, NULL), 0);
	cr_assert(n->published);
	cr_assert_str_eq(meta__member_find(n, 1)->client_url, "http://127.0.0.1:2379");

	/* MemberUpdate moves a peer; an unknown member is etcd's error */
	Etcdserverpb__MemberUpdateRequest u = ETCDSERVERPB__MEMBER_UPDATE_REQUEST__INIT;
	char *purls[] = {"http://10.0.0.33:2380"};
	u.id = 3;
	u.peerurls = purls;
	u.n_peerurls = 1;
	cr_assert_eq(apply(n, META_M_MEMBER_UPDATE, &u.base, &r), 0);
	cr_assert_str_eq(meta__member_find(n, 3)->peer_url, "http://10.0.0.33:2380");
	cr_assert_str_eq(meta__peer_find(n, 3)->addr, "10.0.0.33:2380");
	meta__reply_free(&r);
	u.id = 99;
	cr_assert_eq(apply(n, META_M_MEMBER_UPDATE, &u.base, &r), 0);
	cr_assert_eq(r.code, META_EMEMBER_NOT_FOUND);
	meta__reply_free(&r);
	node_free(n);
}

Test(meta_sm, nospace_alarm_caps_writes_until_disarmed)
{
	struct meta_node *n = node_new(1);
	struct meta__reply r = {0};
	n->o.quota_bytes = 4096;
	put(n, "k", "small", NULL);
	cr_assert(!meta__over_quota(n, META_M_PUT, 100));
	cr_assert(meta__over_quota(n, META_M_PUT, 5000));
	Etcdserverpb__AlarmRequest a = ETCDSERVERPB__ALARM_REQUEST__INIT;
	a.action = ETCDSERVERPB__ALARM_REQUEST__ALARM_ACTION__ACTIVATE;
	a.memberid = 1;
	a.alarm = ETCDSERVERPB__ALARM_TYPE__NOSPACE;
	cr_assert_eq(apply(n, META_M_ALARM, &a.base, &r), 0);
	cr_assert_eq(((const Etcdserverpb__AlarmResponse *)r.resp)->n_alarms, 1);
	meta__reply_free(&r);
	cr_assert(meta__alarm_active(n, ETCDSERVERPB__ALARM_TYPE__NOSPACE));
	cr_assert(meta__over_quota(n, META_M_PUT, 1), "the alarm refuses even small writes");
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
	cr_assert(!meta__alarm_active(n, ETCDSERVERPB__ALARM_TYPE__NOSPACE));
	put(n, "k2", "v", &r);
	cr_assert_eq(r.code, 0);
	meta__reply_free(&r);
	node_free(n);
}

static void lease_op(struct meta_node *n, enum meta__method m, const ProtobufCMessage *q,
		     struct meta__reply *r, int want_rc)
{
	struct meta__op *op = meta__op_new(n, m, q, 0, NULL, NULL);
	cr_assert_not_null(op);
	cr_assert_eq(meta__serve_leader(n, op, r), want_rc);
	free(op->req);
	free(op);
}

Test(meta_sm, leases_grant_keepalive_ttl_revoke)
{
	struct meta_node *n = node_new(1);
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
	lease_promote(mvcc_leases(n->store), meta__now(n), 1000);
	lease_op(n, META_M_LEASE_KEEPALIVE, &ka.base, &r, 0);
	cr_assert_eq(((const Etcdserverpb__LeaseKeepAliveResponse *)r.resp)->ttl, 30);
	meta__reply_free(&r);
	Etcdserverpb__LeaseTimeToLiveRequest tq = ETCDSERVERPB__LEASE_TIME_TO_LIVE_REQUEST__INIT;
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
	struct meta_node *a = node_new(1);
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
	struct meta_node *b = node_new(4);
	b->cluster_id = 0;
	cr_assert_eq(meta__sm_restore(b, data, len), 0);
	cr_assert_eq(b->cluster_id, 77);
	cr_assert_str_eq(range(b, "k", "l", 0), range(a, "k", "l", 0));
	cr_assert_eq(mvcc_rev(b->store), mvcc_rev(a->store));
	cr_assert_eq(b->n_members, 2);
	cr_assert(meta__member_find(b, 4)->learner);
	cr_assert(meta__is_removed(b, 9));
	cr_assert(meta__alarm_active(b, ETCDSERVERPB__ALARM_TYPE__NOSPACE));
	cr_assert_not_null(meta__peer_find(b, 1), "peers come back from the snapshot");

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
		{MVCC_ELEASE_NOT_FOUND, RPC_NOT_FOUND, "etcdserver: requested lease not found"},
		{MVCC_EEMPTY_KEY, RPC_INVALID_ARGUMENT, "etcdserver: key is not provided"},
		{MVCC_ELEASE_EXISTS, RPC_FAILED_PRECONDITION, "etcdserver: lease already exists"},
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
		{.term = 4, .index = 11, .type = RAFT_ENTRY_CONF_CHANGE, .data = "xy", .len = 2},
		{.term = 5, .index = 12, .type = RAFT_ENTRY_NORMAL, .data = NULL, .len = 0},
	};
	struct raft_msg m = {.type = RAFT_MSG_SNAP, .from = 1, .to = 2, .term = 5,
			     .log_term = 4, .index = 9, .commit = 11, .reject = true,
			     .reject_hint = 7, .transfer = true, .entries = ents, .n_entries = 3,
			     .snapshot = {.index = 8, .term = 3,
					  .conf = {voters, 3, learners, 1}},
			     .ctx = "ctx!", .ctx_len = 4};
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
