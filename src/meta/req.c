/*
 * req: client requests in flight (struct meta__op) — their life, their
 * lists, and how each is served.
 *
 * Requests are served by kind: local reads at once; linearizable reads in
 * rounds (read.c) — every read that arrives while a round is in flight
 * joins the next one, and a round is one raft_read_index — and answered
 * once the applied index reaches the round's read index; writes proposed
 * on the leader as one log entry each and answered when that entry (same
 * index, same term) is applied; on a follower they go to the leader over
 * the peer service. Every request has a deadline; a sweep on each tick
 * fails the late ones.
 *
 * Also here: the proposals the node makes itself (alarms, lease revokes,
 * member attributes), the lease IDs the proposer chooses, MoveLeader and
 * Status.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/metrics.h"
#include "common/util.h"
#include "meta/meta_int.h"

#define LOG_SUBSYS LOGS_META

void meta__oplist_push(struct meta__oplist *l, struct meta__op *op)
{
	op->list = l;
	op->next = NULL;
	op->prev = l->tail;
	if (l->tail)
		l->tail->next = op;
	else
		l->head = op;
	l->tail = op;
	l->n++;
}

void meta__oplist_remove(struct meta__op *op)
{
	struct meta__oplist *l = op->list;
	if (!l)
		return;
	if (op->prev)
		op->prev->next = op->next;
	else
		l->head = op->next;
	if (op->next)
		op->next->prev = op->prev;
	else
		l->tail = op->prev;
	l->n--;
	op->list = NULL;
	op->prev = op->next = NULL;
}

/* Insert a proposal waiter keeping the list sorted by index. */
void meta__waiters_insert(struct meta__oplist *l, struct meta__op *op)
{
	struct meta__op *at = l->tail;
	while (at && at->index > op->index)
		at = at->prev;
	op->list = l;
	op->prev = at;
	op->next = at ? at->next : l->head;
	if (op->next)
		op->next->prev = op;
	else
		l->tail = op;
	if (at)
		at->next = op;
	else
		l->head = op;
	l->n++;
}

static void classify(struct meta__op *op, const ProtobufCMessage *req)
{
	op->kind = META_K_WRITE;
	op->puts = false;
	switch (op->method) {
	case META_M_RANGE:
		op->kind = ((const Etcdserverpb__RangeRequest *)req)->serializable
				   ? META_K_READ_LOCAL
				   : META_K_READ;
		break;
	case META_M_PUT:
	case META_M_LEASE_GRANT:
		op->puts = true;
		break;
	case META_M_TXN: {
		const Etcdserverpb__TxnRequest *t = (const void *)req;
		if (meta__txn_writes(t, false))
			op->puts = meta__txn_writes(t, true);
		else
			op->kind = meta__txn_serializable(t) ? META_K_READ_LOCAL : META_K_READ;
		break;
	}
	case META_M_LEASE_KEEPALIVE:
	case META_M_LEASE_TTL:
	case META_M_MOVE_LEADER:
		op->kind = META_K_LEADER;
		break;
	case META_M_LEASE_LEASES:
		op->kind = META_K_READ;
		break;
	case META_M_MEMBER_ADD:
	case META_M_MEMBER_REMOVE:
	case META_M_MEMBER_PROMOTE:
		op->kind = META_K_CONF;
		break;
	case META_M_MEMBER_LIST:
	case META_M_STATUS:
		op->kind = META_K_READ_LOCAL;
		break;
	case META_M_ALARM:
		if (((const Etcdserverpb__AlarmRequest *)req)->action ==
		    ETCDSERVERPB__ALARM_REQUEST__ALARM_ACTION__GET)
			op->kind = META_K_READ_LOCAL;
		break;
	default:
		break;
	}
}

static struct meta__op *op_alloc(struct meta_node *n, enum meta__method m,
				 uint64_t deadline_ms, meta__done_fn done, void *ud)
{
	struct meta__op *op = calloc(1, sizeof(*op));
	if (!op)
		return NULL;
	uint64_t dflt = meta__now(n) + n->request_timeout_ms;
	op->node = n;
	op->method = m;
	op->deadline_ms = deadline_ms && deadline_ms < dflt ? deadline_ms : dflt;
	op->done = done;
	op->ud = ud;
	return op;
}

struct meta__op *meta__op_new(struct meta_node *n, enum meta__method m,
			      const ProtobufCMessage *req, uint64_t deadline_ms,
			      meta__done_fn done, void *ud)
{
	struct meta__op *op = op_alloc(n, m, deadline_ms, done, ud);
	if (!op)
		return NULL;
	op->req_len = protobuf_c_message_get_packed_size(req);
	op->req = malloc(op->req_len ? op->req_len : 1);
	if (!op->req) {
		free(op);
		return NULL;
	}
	protobuf_c_message_pack(req, op->req);
	classify(op, req);
	return op;
}

struct meta__op *meta__op_new_raw(struct meta_node *n, enum meta__method m, const uint8_t *req,
				  size_t len, uint64_t deadline_ms, meta__done_fn done,
				  void *ud)
{
	ProtobufCMessage *msg = protobuf_c_message_unpack(meta__methods[m].req, NULL, len,
							  req);
	struct meta__op *op;

	if (!msg)
		return NULL;
	op = op_alloc(n, m, deadline_ms, done, ud);
	if (op && !(op->req = malloc(len ? len : 1))) {
		free(op);
		op = NULL;
	}
	if (op) {
		if (len)
			memcpy(op->req, req, len);
		op->req_len = len;
		classify(op, msg);
	}
	protobuf_c_message_free_unpacked(msg, NULL);
	return op;
}

static void op_free(struct meta__op *op)
{
	free(op->req);
	free(op->ent);
	free(op);
}

void meta__op_done(struct meta__op *op, int status, const char *message,
		   const ProtobufCMessage *resp)
{
	meta__oplist_remove(op);
	if (op->done)
		op->done(op, status, message, resp);
	op_free(op);
}

void meta__op_fail(struct meta__op *op, int code)
{
	int st;
	const char *msg;
	meta__status_of(code, &st, &msg);
	meta__op_done(op, st, msg, NULL);
}

void meta__fail_list(struct meta__oplist *l, int code)
{
	while (l->head)
		meta__op_fail(l->head, code);
}

/* Answer op from a reply of the state machine. */
void meta__op_reply(struct meta__op *op, struct meta__reply *r)
{
	if (r->code || !r->resp)
		meta__op_fail(op, r->code ? r->code : -ENOMEM);
	else
		meta__op_done(op, RPC_OK, NULL, r->resp);
}

static void noop_done(struct meta__op *op, int status, const char *message,
		      const ProtobufCMessage *resp)
{
	(void)op;
	(void)resp;
	if (status != RPC_OK)
		log_debug("internal request failed: %s", message ? message : "");
}

/* Propose an internal request (alarm, lease revoke, member attributes)
 * with no one waiting for its answer. */
void meta__propose_internal(struct meta_node *n, enum meta__method m,
			    const ProtobufCMessage *req)
{
	struct meta__op *op = meta__op_new(n, m, req, 0, noop_done, NULL);
	if (!op) {
		log_warn("out of memory for an internal %s request", meta__methods[m].name);
		return;
	}
	meta__submit(n, op);
}

static void raise_nospace(struct meta_node *n)
{
	Etcdserverpb__AlarmRequest a = ETCDSERVERPB__ALARM_REQUEST__INIT;
	if (meta__alarm_active(&n->sm, ETCDSERVERPB__ALARM_TYPE__NOSPACE))
		return;
	a.action = ETCDSERVERPB__ALARM_REQUEST__ALARM_ACTION__ACTIVATE;
	a.memberid = n->id;
	a.alarm = ETCDSERVERPB__ALARM_TYPE__NOSPACE;
	log_warn("database space exceeded (%" PRIu64 " of %" PRIu64
		 " bytes, --quota-backend-bytes): raising the NOSPACE alarm",
		 meta__quota_size(&n->sm), n->o.quota_backend_bytes);
	meta__propose_internal(n, META_M_ALARM, &a.base);
}

/* The next lease ID, as etcd's leader picks one for a grant that names
 * none: reqIDGen.Next() & (2^63 - 1), skipping 0 and the IDs in use. */
static int64_t next_lease_id(struct meta_node *n)
{
	const uint64_t suffix_mask = (UINT64_C(1) << 48) - 1;
	const struct lease_table *lt = mvcc_leases(n->sm.store);

	if (!n->lease_id_suffix) {
		n->lease_id_prefix = (n->id & 0xffff) << 48;
		n->lease_id_suffix = (mc_wall_ms() & ((UINT64_C(1) << 40) - 1)) << 8;
	}
	for (;;) {
		n->lease_id_suffix++;
		int64_t id = (int64_t)((n->lease_id_prefix |
					(n->lease_id_suffix & suffix_mask)) &
				       (uint64_t)INT64_MAX);
		if (id && !lease_exists(lt, id))
			return id;
	}
}

/*
 * A LeaseGrant with ID 0 gets its ID here, from the member that proposes
 * it, and the ID travels in the log entry: every member applies the same
 * grant. Returns 0 or -ENOMEM / -EINVAL (the request does not decode).
 */
static int stamp_lease_id(struct meta_node *n, struct meta__op *op)
{
	Etcdserverpb__LeaseGrantRequest *q = etcdserverpb__lease_grant_request__unpack(
		NULL, op->req_len, op->req);
	if (!q)
		return -EINVAL;
	if (q->id == 0) {
		q->id = next_lease_id(n);
		size_t len = etcdserverpb__lease_grant_request__get_packed_size(q);
		uint8_t *buf = malloc(len ? len : 1);
		if (!buf) {
			etcdserverpb__lease_grant_request__free_unpacked(q, NULL);
			return -ENOMEM;
		}
		etcdserverpb__lease_grant_request__pack(q, buf);
		free(op->req);
		op->req = buf;
		op->req_len = len;
		op->lease_id_chosen = true;
	}
	etcdserverpb__lease_grant_request__free_unpacked(q, NULL);
	return 0;
}

/* A grant whose chosen ID another grant took meanwhile: choose again. */
bool meta__retry_lease_grant(struct meta_node *n, struct meta__op *op, int code)
{
	if (op->method != META_M_LEASE_GRANT || !op->lease_id_chosen ||
	    code != MVCC_ELEASE_EXISTS || op->lease_id_tries >= 8)
		return false;
	Etcdserverpb__LeaseGrantRequest *q = etcdserverpb__lease_grant_request__unpack(
		NULL, op->req_len, op->req);
	if (!q)
		return false;
	log_debug("lease %016" PRIx64 " was taken meanwhile: granting with another ID",
		  (uint64_t)q->id);
	q->id = 0;
	size_t len = etcdserverpb__lease_grant_request__get_packed_size(q);
	uint8_t *buf = malloc(len ? len : 1);
	if (buf)
		etcdserverpb__lease_grant_request__pack(q, buf);
	etcdserverpb__lease_grant_request__free_unpacked(q, NULL);
	if (!buf)
		return false;
	free(op->req);
	op->req = buf;
	op->req_len = len;
	op->lease_id_chosen = false;
	op->lease_id_tries++;
	meta__submit(n, op);
	return true;
}

static void propose_write(struct meta_node *n, struct meta__op *op)
{
	if (op->puts && meta__over_quota(&n->sm, n->o.quota_backend_bytes, op->req_len)) {
		raise_nospace(n);
		meta__op_fail(op, META_ENOSPACE);
		return;
	}
	free(op->ent);
	op->ent = NULL;
	int rc = op->method == META_M_LEASE_GRANT ? stamp_lease_id(n, op) : 0;
	if (rc) {
		meta__op_fail(op, rc);
		return;
	}
	rc = meta__wrap_request(op->method, op->req, op->req_len, &op->ent, &op->ent_len);
	if (rc) {
		meta__op_fail(op, rc);
		return;
	}
	/* etcd checks the size of what it proposes, so only requests that
	 * go through the log can be too large (a read of any size the gRPC
	 * limit lets in is served). */
	if (op->ent_len > n->o.max_request_bytes) {
		meta__op_fail(op, META_ETOO_LARGE);
		return;
	}
	meta__propose(n, op);
}

void meta__propose(struct meta_node *n, struct meta__op *op)
{
	uint64_t index = 0;
	int rc;

	if (n->in_ready) {
		meta__oplist_push(&n->propq, op);
		return;
	}
	if (op->kind == META_K_CONF) {
		struct raft_conf_change cc;
		rc = raft_conf_change_decode(op->ent, op->ent_len, &cc);
		if (rc == 0)
			rc = raft_propose_conf_change(n->raft, &cc, &index);
		if (rc == -EAGAIN) {
			meta__oplist_push(&n->retry, op);
			return;
		}
	} else {
		rc = raft_propose(n->raft, op->ent, op->ent_len, &index);
	}
	if (rc == MC_ENOT_LEADER) {
		/* The core stepped down since the last ready (a message with a
		 * higher term, a lost quorum) while the node still thinks it
		 * leads: submitting again would come straight back here. Wait
		 * for the ready that tells who leads; then the op is run again
		 * (forwarded, or proposed by the new leader we may be). */
		meta__oplist_push(&n->wait_leader, op);
		meta__kick(n);
		return;
	}
	if (rc == -EBUSY) {
		meta__oplist_push(&n->wait_leader, op); /* leader transfer */
		return;
	}
	if (rc == -ENOMEM || rc == MC_EINTERNAL) {
		meta__fatal(n, rc, "the Raft core failed");
		meta__op_fail(op, rc);
		return;
	}
	if (rc) {
		meta__op_fail(op, rc);
		metric_inc(n->m_failed);
		return;
	}
	struct raft_status st;
	raft_status(n->raft, &st, NULL, 0);
	op->index = index;
	op->term = st.term;
	meta__waiters_insert(&n->waiters, op);
	meta__kick(n);
}

/* Status: this member's view of the cluster and its state. */
static int serve_status(struct meta_node *n, struct meta__reply *r)
{
	static const char version[] = "3.4.0+mooncaked." MC_VERSION;
	Etcdserverpb__StatusResponse *p = meta__alloc(&r->arena, sizeof(*p));
	if (!p)
		return -ENOMEM;
	etcdserverpb__status_response__init(p);
	if (!(p->header = meta__header(n, &r->arena)))
		return -ENOMEM;
	p->version = (char *)version;
	p->dbsize = (int64_t)meta__quota_size(&n->sm);
	p->dbsizeinuse = p->dbsize;
	p->leader = n->leader;
	p->raftindex = n->commit;
	p->raftterm = n->term;
	p->raftappliedindex = n->applied;
	const struct meta__member *me = meta__member_find(&n->sm, n->id);
	p->islearner = me && me->learner;
	if (n->sm.n_alarms) {
		p->errors = meta__alloc(&r->arena, n->sm.n_alarms * sizeof(char *));
		if (!p->errors)
			return -ENOMEM;
		for (size_t i = 0; i < n->sm.n_alarms; i++) {
			char *s = meta__alloc(&r->arena, 64);
			if (!s)
				return -ENOMEM;
			snprintf(s, 64, "memberID:%llu alarm:%s ",
				 (unsigned long long)n->sm.alarms[i].memberid,
				 n->sm.alarms[i].alarm == ETCDSERVERPB__ALARM_TYPE__NOSPACE
					 ? "NOSPACE"
					 : "CORRUPT");
			p->errors[i] = s;
		}
		p->n_errors = n->sm.n_alarms;
	}
	r->resp = &p->base;
	return 0;
}

void meta__serve_local(struct meta_node *n, struct meta__op *op)
{
	struct meta__reply r = {0};
	if (op->method == META_M_STATUS) {
		int rc = serve_status(n, &r);
		if (rc)
			r.code = rc;
	} else {
		struct meta__sm_in in = meta__sm_in(n);
		meta__sm_read(&n->sm, &in, op->method, op->req, op->req_len, &r);
	}
	meta__op_reply(op, &r);
	meta__reply_free(&r);
}

static void wait_or_forward(struct meta_node *n, struct meta__op *op)
{
	if (op->forwarded) {
		/* The member that forwarded it retries with the right leader. */
		meta__op_fail(op, META_ENOT_LEADER);
		return;
	}
	if (n->leader == RAFT_NONE || n->leader == n->id) {
		meta__oplist_push(&n->wait_leader, op);
		return;
	}
	op->fwd_leader = n->leader;
	metric_inc(n->m_forwarded);
	meta__peer_forward(n, op);
}

static void move_leader(struct meta_node *n, struct meta__op *op)
{
	Etcdserverpb__MoveLeaderRequest *q = etcdserverpb__move_leader_request__unpack(
		NULL, op->req_len, op->req);
	int rc;

	if (!q) {
		meta__op_fail(op, -EINVAL);
		return;
	}
	const struct meta__member *m = meta__member_find(&n->sm, q->targetid);
	if (!m || m->learner) {
		etcdserverpb__move_leader_request__free_unpacked(q, NULL);
		meta__op_fail(op, META_EBAD_LEADER_TRANSFEREE);
		return;
	}
	if (q->targetid == n->id) {
		/* etcd: the transfer to itself is done at once. */
		etcdserverpb__move_leader_request__free_unpacked(q, NULL);
		Etcdserverpb__MoveLeaderResponse resp =
			ETCDSERVERPB__MOVE_LEADER_RESPONSE__INIT;
		struct meta__arena a = {0};
		if ((resp.header = meta__header(n, &a)))
			meta__op_done(op, RPC_OK, NULL, &resp.base);
		else
			meta__op_fail(op, -ENOMEM);
		meta__arena_free(&a);
		return;
	}
	if (n->in_ready) {
		n->transfer_to = q->targetid;
		rc = 0;
	} else {
		rc = raft_transfer_leader(n->raft, q->targetid);
	}
	etcdserverpb__move_leader_request__free_unpacked(q, NULL);
	if (rc) {
		meta__op_fail(op, rc == MC_ENOT_LEADER ? META_ENOT_LEADER
						       : META_EBAD_LEADER_TRANSFEREE);
		return;
	}
	op->index = 0;
	meta__oplist_push(&n->moving, op);
	meta__kick(n);
}

static void serve_leader(struct meta_node *n, struct meta__op *op)
{
	struct meta__reply r = {0};

	if (op->method == META_M_MOVE_LEADER) {
		move_leader(n, op);
		return;
	}
	struct meta__sm_in in = meta__sm_in(n);
	int rc = meta__sm_leader(&n->sm, &in, op->method, op->req, op->req_len, &r);
	if (rc == -EAGAIN) {
		meta__oplist_push(&n->retry, op);
	} else if (rc == MC_ENOT_LEADER) {
		wait_or_forward(n, op);
	} else {
		if (rc)
			r.code = rc;
		meta__op_reply(op, &r);
	}
	meta__reply_free(&r);
}

void meta__submit(struct meta_node *n, struct meta__op *op)
{
	if (n->stopping || n->fatal) {
		meta__op_fail(op, META_ESTOPPED);
		return;
	}
	if (!n->running) {
		meta__op_fail(op, META_ENOT_CAPABLE);
		return;
	}
	if (meta__now(n) >= op->deadline_ms) {
		meta__op_fail(op, META_ETIMEOUT);
		return;
	}
	if (op->kind == META_K_READ_LOCAL) {
		meta__serve_local(n, op);
		return;
	}
	if (op->kind == META_K_READ) {
		meta__oplist_push(&n->reads, op);
		meta__read_round(n);
		return;
	}
	/* The rest is the leader's business. */
	if (!meta__is_leader(n)) {
		/* etcd answers MoveLeader only on the leader. */
		if (op->method == META_M_MOVE_LEADER)
			meta__op_fail(op, META_ENOT_LEADER);
		else
			wait_or_forward(n, op);
		return;
	}
	if (op->kind == META_K_WRITE)
		propose_write(n, op);
	else if (op->kind == META_K_CONF)
		meta__propose_conf(n, op);
	else
		serve_leader(n, op);
}

/* Run every op of list l again (leader known, an entry applied). */
void meta__rerun(struct meta_node *n, struct meta__oplist *l)
{
	struct meta__oplist tmp = *l;
	if (!tmp.head)
		return;
	for (struct meta__op *op = tmp.head; op; op = op->next)
		op->list = &tmp;
	memset(l, 0, sizeof(*l));
	while (tmp.head) {
		struct meta__op *op = tmp.head;
		meta__oplist_remove(op);
		meta__submit(n, op);
	}
}

static void sweep(struct meta_node *n, struct meta__oplist *l, int code)
{
	uint64_t now = meta__now(n);
	struct meta__op *op = l->head;
	while (op) {
		struct meta__op *next = op->next;
		if (op->deadline_ms <= now) {
			metric_inc(n->m_failed);
			meta__op_fail(op, code);
		}
		op = next;
	}
}

void meta__req_sweep(struct meta_node *n)
{
	sweep(n, &n->wait_leader, META_ENO_LEADER);
	sweep(n, &n->retry, META_ETIMEOUT);
	sweep(n, &n->reads, META_ETIMEOUT);
	sweep(n, &n->round, META_ETIMEOUT);
	sweep(n, &n->read_wait, META_ETIMEOUT);
	sweep(n, &n->waiters, META_ETIMEOUT);
	sweep(n, &n->moving, META_ETIMEOUT_LEADER_TRANSFER);
}

void meta__wait_leader(struct meta_node *n, struct meta__op *op)
{
	if (n->stopping || n->fatal) {
		meta__op_fail(op, META_ESTOPPED);
		return;
	}
	meta__oplist_push(&n->wait_leader, op);
}
