/*
 * conv: the meta node's translations — etcd protobuf requests to the MVCC
 * store's request structs and results back to etcd responses, Raft
 * messages to and from mooncake.raft.Message, error codes to etcd's gRPC
 * status and message, and the bump arena responses are built in.
 *
 * Requests borrow the protobuf message's bytes; responses borrow the MVCC
 * result's bytes; both live as long as the message or result they came
 * from, and the arena holds the arrays between.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "meta/meta_int.h"

/* ------------------------------------------------------------- errors */

void meta__status_of(int code, int *status, const char **message)
{
	switch (code) {
#define META__ERR_CASE(name, value, st, text) \
	case name: \
		*status = st; \
		*message = text; \
		return;
		META_ERRORS(META__ERR_CASE)
#undef META__ERR_CASE
	case MVCC_ECOMPACTED:
		*status = RPC_OUT_OF_RANGE;
		*message = "etcdserver: mvcc: required revision has been compacted";
		return;
	case MVCC_EFUTURE_REV:
		*status = RPC_OUT_OF_RANGE;
		*message = "etcdserver: mvcc: required revision is a future revision";
		return;
	case MVCC_ELEASE_NOT_FOUND:
		*status = RPC_NOT_FOUND;
		*message = mvcc_strerror(code);
		return;
	case MVCC_EKEY_NOT_FOUND:
	case MVCC_EDUPLICATE_KEY:
	case MVCC_EEMPTY_KEY:
	case MVCC_EVALUE_PROVIDED:
	case MVCC_ELEASE_PROVIDED:
	case MVCC_ETOO_MANY_OPS:
		*status = RPC_INVALID_ARGUMENT;
		*message = mvcc_strerror(code);
		return;
	case MVCC_ELEASE_EXISTS:
		*status = RPC_FAILED_PRECONDITION;
		*message = mvcc_strerror(code);
		return;
	case MVCC_ELEASE_TTL_TOO_LARGE:
		*status = RPC_OUT_OF_RANGE;
		*message = mvcc_strerror(code);
		return;
	case MVCC_EEMPTY_WATCH_RANGE:
	case MVCC_EWATCH_EXISTS:
	case MVCC_EWATCH_NOT_FOUND:
		*status = RPC_INVALID_ARGUMENT;
		*message = mvcc_strerror(code);
		return;
	case -EINVAL:
		*status = RPC_INVALID_ARGUMENT;
		*message = "etcdserver: invalid request";
		return;
	case -ENOMEM:
		*status = RPC_RESOURCE_EXHAUSTED;
		*message = "etcdserver: out of memory";
		return;
	case MC_ETOO_LARGE:
		*status = RPC_RESOURCE_EXHAUSTED;
		*message = "etcdserver: response larger than the maximum message size";
		return;
	default:
		*status = RPC_INTERNAL;
		*message = mc_strerror(code);
		return;
	}
}

const char *meta__strerror(int code)
{
	int st;
	const char *msg;

	if (code <= -900 && code > -950)
		return mvcc_strerror(code);
	if (code <= -950 && code > -1000) {
		meta__status_of(code, &st, &msg);
		return msg;
	}
	return mc_strerror(code);
}

/* ------------------------------------------------------------- arena */

#define ARENA_BLOCK_BYTES 4096

struct meta__ablk {
	struct meta__ablk *next;
	size_t used, cap;
	_Alignas(16) unsigned char data[];
};

void *meta__alloc(struct meta__arena *a, size_t n)
{
	struct meta__ablk *b = a->head;

	n = (n + 15) & ~(size_t)15;
	if (!n)
		n = 16;
	if (!b || b->cap - b->used < n) {
		size_t cap = n > ARENA_BLOCK_BYTES ? n : ARENA_BLOCK_BYTES;
		b = malloc(sizeof(*b) + cap);
		if (!b)
			return NULL;
		b->cap = cap;
		b->used = 0;
		b->next = a->head;
		a->head = b;
	}
	void *p = b->data + b->used;
	b->used += n;
	memset(p, 0, n);
	return p;
}

void meta__arena_free(struct meta__arena *a)
{
	while (a->head) {
		struct meta__ablk *b = a->head;
		a->head = b->next;
		free(b);
	}
}

/* ------------------------------------------------------------- methods */

const struct meta__method_def meta__methods[META_M__COUNT] = {
	[META_M_RANGE] = {"Range", &etcdserverpb__range_request__descriptor,
			  &etcdserverpb__range_response__descriptor},
	[META_M_PUT] = {"Put", &etcdserverpb__put_request__descriptor,
			&etcdserverpb__put_response__descriptor},
	[META_M_DELETE_RANGE] = {"DeleteRange",
				 &etcdserverpb__delete_range_request__descriptor,
				 &etcdserverpb__delete_range_response__descriptor},
	[META_M_TXN] = {"Txn", &etcdserverpb__txn_request__descriptor,
			&etcdserverpb__txn_response__descriptor},
	[META_M_COMPACT] = {"Compact", &etcdserverpb__compaction_request__descriptor,
			    &etcdserverpb__compaction_response__descriptor},
	[META_M_LEASE_GRANT] = {"LeaseGrant", &etcdserverpb__lease_grant_request__descriptor,
				&etcdserverpb__lease_grant_response__descriptor},
	[META_M_LEASE_REVOKE] = {"LeaseRevoke",
				 &etcdserverpb__lease_revoke_request__descriptor,
				 &etcdserverpb__lease_revoke_response__descriptor},
	[META_M_LEASE_KEEPALIVE] = {"LeaseKeepAlive",
				    &etcdserverpb__lease_keep_alive_request__descriptor,
				    &etcdserverpb__lease_keep_alive_response__descriptor},
	[META_M_LEASE_TTL] = {"LeaseTimeToLive",
			      &etcdserverpb__lease_time_to_live_request__descriptor,
			      &etcdserverpb__lease_time_to_live_response__descriptor},
	[META_M_LEASE_LEASES] = {"LeaseLeases",
				 &etcdserverpb__lease_leases_request__descriptor,
				 &etcdserverpb__lease_leases_response__descriptor},
	[META_M_MEMBER_ADD] = {"MemberAdd", &etcdserverpb__member_add_request__descriptor,
			       &etcdserverpb__member_add_response__descriptor},
	[META_M_MEMBER_REMOVE] = {"MemberRemove",
				  &etcdserverpb__member_remove_request__descriptor,
				  &etcdserverpb__member_remove_response__descriptor},
	[META_M_MEMBER_UPDATE] = {"MemberUpdate",
				  &etcdserverpb__member_update_request__descriptor,
				  &etcdserverpb__member_update_response__descriptor},
	[META_M_MEMBER_LIST] = {"MemberList", &etcdserverpb__member_list_request__descriptor,
				&etcdserverpb__member_list_response__descriptor},
	[META_M_MEMBER_PROMOTE] = {"MemberPromote",
				   &etcdserverpb__member_promote_request__descriptor,
				   &etcdserverpb__member_promote_response__descriptor},
	[META_M_ALARM] = {"Alarm", &etcdserverpb__alarm_request__descriptor,
			  &etcdserverpb__alarm_response__descriptor},
	[META_M_STATUS] = {"Status", &etcdserverpb__status_request__descriptor,
			   &etcdserverpb__status_response__descriptor},
	[META_M_MOVE_LEADER] = {"MoveLeader", &etcdserverpb__move_leader_request__descriptor,
				&etcdserverpb__move_leader_response__descriptor},
	[META_M_PUBLISH] = {"Publish", &mooncake__meta__member_attributes__descriptor,
			    &etcdserverpb__member_update_response__descriptor},
};

int meta__method_by_name(const char *name)
{
	for (int m = 0; m < META_M__COUNT; m++)
		if (name && strcmp(meta__methods[m].name, name) == 0)
			return m;
	return -1;
}

/* ------------------------------------------------------------- log entries */

/* The field of mooncake.meta.Request that carries method m's request. */
static unsigned request_field(enum meta__method m)
{
	switch (m) {
	case META_M_PUT:
		return MOONCAKE__META__REQUEST__REQ_PUT;
	case META_M_DELETE_RANGE:
		return MOONCAKE__META__REQUEST__REQ_DELETE_RANGE;
	case META_M_TXN:
		return MOONCAKE__META__REQUEST__REQ_TXN;
	case META_M_COMPACT:
		return MOONCAKE__META__REQUEST__REQ_COMPACTION;
	case META_M_LEASE_GRANT:
		return MOONCAKE__META__REQUEST__REQ_LEASE_GRANT;
	case META_M_LEASE_REVOKE:
		return MOONCAKE__META__REQUEST__REQ_LEASE_REVOKE;
	case META_M_ALARM:
		return MOONCAKE__META__REQUEST__REQ_ALARM;
	case META_M_PUBLISH:
		return MOONCAKE__META__REQUEST__REQ_MEMBER_ATTRIBUTES;
	case META_M_MEMBER_UPDATE:
		return MOONCAKE__META__REQUEST__REQ_MEMBER_UPDATE;
	default:
		return 0;
	}
}

int meta__wrap_request(enum meta__method m, const uint8_t *req, size_t len, uint8_t **out,
		       size_t *out_len)
{
	uint8_t hdr[24];
	size_t h = 0;
	unsigned field = request_field(m);
	uint64_t v;

	if (!field)
		return -EINVAL;
	for (v = ((uint64_t)field << 3) | 2; v >= 0x80; v >>= 7)
		hdr[h++] = (uint8_t)(v | 0x80);
	hdr[h++] = (uint8_t)v;
	for (v = len; v >= 0x80; v >>= 7)
		hdr[h++] = (uint8_t)(v | 0x80);
	hdr[h++] = (uint8_t)v;
	uint8_t *e = malloc(h + len);
	if (!e)
		return -ENOMEM;
	memcpy(e, hdr, h);
	if (len)
		memcpy(e + h, req, len);
	*out = e;
	*out_len = h + len;
	return 0;
}

/* ------------------------------------------------------------- requests */

int meta__op_from_range(const Etcdserverpb__RangeRequest *r, struct mvcc_op *op)
{
	memset(op, 0, sizeof(*op));
	op->type = MVCC_OP_RANGE;
	struct mvcc_range_req *q = &op->u.range;
	q->key = (const char *)r->key.data;
	q->key_len = r->key.len;
	q->range_end = (const char *)r->range_end.data;
	q->range_end_len = r->range_end.len;
	q->limit = r->limit;
	q->revision = r->revision;
	q->sort_order = (int)r->sort_order;
	q->sort_target = (int)r->sort_target;
	q->keys_only = r->keys_only;
	q->count_only = r->count_only;
	q->min_mod_revision = r->min_mod_revision;
	q->max_mod_revision = r->max_mod_revision;
	q->min_create_revision = r->min_create_revision;
	q->max_create_revision = r->max_create_revision;
	return 0;
}

int meta__op_from_put(const Etcdserverpb__PutRequest *r, struct mvcc_op *op)
{
	memset(op, 0, sizeof(*op));
	op->type = MVCC_OP_PUT;
	struct mvcc_put_req *q = &op->u.put;
	q->key = (const char *)r->key.data;
	q->key_len = r->key.len;
	q->value = (const char *)r->value.data;
	q->value_len = r->value.len;
	q->lease = r->lease;
	q->prev_kv = r->prev_kv;
	q->ignore_value = r->ignore_value;
	q->ignore_lease = r->ignore_lease;
	return 0;
}

int meta__op_from_delete(const Etcdserverpb__DeleteRangeRequest *r, struct mvcc_op *op)
{
	memset(op, 0, sizeof(*op));
	op->type = MVCC_OP_DELETE_RANGE;
	struct mvcc_delete_req *q = &op->u.del;
	q->key = (const char *)r->key.data;
	q->key_len = r->key.len;
	q->range_end = (const char *)r->range_end.data;
	q->range_end_len = r->range_end.len;
	q->prev_kv = r->prev_kv;
	return 0;
}

static int ops_from(Etcdserverpb__RequestOp *const *in, size_t n, const struct mvcc_op **out,
		    struct meta__arena *a);

int meta__op_from_txn(const Etcdserverpb__TxnRequest *r, struct mvcc_op *op,
		      struct meta__arena *a)
{
	int rc;

	memset(op, 0, sizeof(*op));
	op->type = MVCC_OP_TXN;
	struct mvcc_txn_req *t = &op->u.txn;
	if (r->n_compare) {
		struct mvcc_compare *c = meta__alloc(a, r->n_compare * sizeof(*c));
		if (!c)
			return -ENOMEM;
		for (size_t i = 0; i < r->n_compare; i++) {
			const Etcdserverpb__Compare *pc = r->compare[i];
			c[i].result = (int)pc->result;
			c[i].target = (int)pc->target;
			c[i].key = (const char *)pc->key.data;
			c[i].key_len = pc->key.len;
			c[i].range_end = (const char *)pc->range_end.data;
			c[i].range_end_len = pc->range_end.len;
			/* As etcd's compareKV: the operand is the union member
			 * that matches the target, 0 or "" when another one is
			 * set. */
			int uc = (int)pc->target_union_case;
			switch (pc->target) {
			case ETCDSERVERPB__COMPARE__COMPARE_TARGET__VERSION:
				if (uc == ETCDSERVERPB__COMPARE__TARGET_UNION_VERSION)
					c[i].number = pc->version;
				break;
			case ETCDSERVERPB__COMPARE__COMPARE_TARGET__CREATE:
				if (uc == ETCDSERVERPB__COMPARE__TARGET_UNION_CREATE_REVISION)
					c[i].number = pc->create_revision;
				break;
			case ETCDSERVERPB__COMPARE__COMPARE_TARGET__MOD:
				if (uc == ETCDSERVERPB__COMPARE__TARGET_UNION_MOD_REVISION)
					c[i].number = pc->mod_revision;
				break;
			case ETCDSERVERPB__COMPARE__COMPARE_TARGET__LEASE:
				if (uc == ETCDSERVERPB__COMPARE__TARGET_UNION_LEASE)
					c[i].number = pc->lease;
				break;
			case ETCDSERVERPB__COMPARE__COMPARE_TARGET__VALUE:
				if (uc == ETCDSERVERPB__COMPARE__TARGET_UNION_VALUE) {
					c[i].value = (const char *)pc->value.data;
					c[i].value_len = pc->value.len;
				}
				break;
			default:
				break;
			}
		}
		t->compare = c;
		t->ncompare = r->n_compare;
	}
	if ((rc = ops_from(r->success, r->n_success, &t->success, a)))
		return rc;
	t->nsuccess = r->n_success;
	if ((rc = ops_from(r->failure, r->n_failure, &t->failure, a)))
		return rc;
	t->nfailure = r->n_failure;
	return 0;
}

static int ops_from(Etcdserverpb__RequestOp *const *in, size_t n, const struct mvcc_op **out,
		    struct meta__arena *a)
{
	*out = NULL;
	if (!n)
		return 0;
	struct mvcc_op *ops = meta__alloc(a, n * sizeof(*ops));
	if (!ops)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		const Etcdserverpb__RequestOp *o = in[i];
		int rc = 0;
		switch (o->request_case) {
		case ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_RANGE:
			rc = meta__op_from_range(o->request_range, &ops[i]);
			break;
		case ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_PUT:
			rc = meta__op_from_put(o->request_put, &ops[i]);
			break;
		case ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_DELETE_RANGE:
			rc = meta__op_from_delete(o->request_delete_range, &ops[i]);
			break;
		case ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_TXN:
			rc = meta__op_from_txn(o->request_txn, &ops[i], a);
			break;
		default:
			ops[i].type = MVCC_OP_NONE;
			break;
		}
		if (rc)
			return rc;
	}
	*out = ops;
	return 0;
}

static bool ops_write(Etcdserverpb__RequestOp *const *ops, size_t n, bool put_only)
{
	for (size_t i = 0; i < n; i++) {
		switch (ops[i]->request_case) {
		case ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_PUT:
			return true;
		case ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_DELETE_RANGE:
			if (!put_only)
				return true;
			break;
		case ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_TXN:
			if (meta__txn_writes(ops[i]->request_txn, put_only))
				return true;
			break;
		default:
			break;
		}
	}
	return false;
}

bool meta__txn_writes(const Etcdserverpb__TxnRequest *r, bool put_only)
{
	return ops_write(r->success, r->n_success, put_only) ||
	       ops_write(r->failure, r->n_failure, put_only);
}

static bool ops_serializable(Etcdserverpb__RequestOp *const *ops, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (ops[i]->request_case == ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_RANGE &&
		    !ops[i]->request_range->serializable)
			return false;
		if (ops[i]->request_case == ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_TXN &&
		    !meta__txn_serializable(ops[i]->request_txn))
			return false;
	}
	return true;
}

/* etcd's isTxnSerializable: every range in it asks for serializable. */
bool meta__txn_serializable(const Etcdserverpb__TxnRequest *r)
{
	return ops_serializable(r->success, r->n_success) &&
	       ops_serializable(r->failure, r->n_failure);
}

/* ------------------------------------------------------------- responses */

static void kv_fill(Mvccpb__KeyValue *p, const struct mvcc_kv *kv)
{
	mvccpb__key_value__init(p);
	p->key.data = (uint8_t *)kv->key;
	p->key.len = kv->key_len;
	p->value.data = (uint8_t *)kv->value;
	p->value.len = kv->value_len;
	p->create_revision = kv->create_revision;
	p->mod_revision = kv->mod_revision;
	p->version = kv->version;
	p->lease = kv->lease;
}

Mvccpb__KeyValue *meta__kv_pb(const struct mvcc_kv *kv, struct meta__arena *a)
{
	Mvccpb__KeyValue *p = meta__alloc(a, sizeof(*p));
	if (p)
		kv_fill(p, kv);
	return p;
}

static Mvccpb__KeyValue **kvs_pb(const struct mvcc_kv *kvs, size_t n, struct meta__arena *a)
{
	Mvccpb__KeyValue **v = meta__alloc(a, (n ? n : 1) * sizeof(*v));
	Mvccpb__KeyValue *blk = meta__alloc(a, (n ? n : 1) * sizeof(*blk));
	if (!v || !blk)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		kv_fill(&blk[i], &kvs[i]);
		v[i] = &blk[i];
	}
	return v;
}

ProtobufCMessage *meta__resp_pb(const struct mvcc_op_resp *r, Etcdserverpb__ResponseHeader *h,
				struct meta__arena *a)
{
	switch (r->type) {
	case MVCC_OP_RANGE: {
		Etcdserverpb__RangeResponse *p = meta__alloc(a, sizeof(*p));
		if (!p)
			return NULL;
		etcdserverpb__range_response__init(p);
		p->header = h;
		p->kvs = kvs_pb(r->u.range.kvs, r->u.range.nkvs, a);
		if (!p->kvs)
			return NULL;
		p->n_kvs = r->u.range.nkvs;
		p->more = r->u.range.more;
		p->count = r->u.range.count;
		return &p->base;
	}
	case MVCC_OP_PUT: {
		Etcdserverpb__PutResponse *p = meta__alloc(a, sizeof(*p));
		if (!p)
			return NULL;
		etcdserverpb__put_response__init(p);
		p->header = h;
		if (r->u.put.has_prev_kv && !(p->prev_kv = meta__kv_pb(&r->u.put.prev_kv, a)))
			return NULL;
		return &p->base;
	}
	case MVCC_OP_DELETE_RANGE: {
		Etcdserverpb__DeleteRangeResponse *p = meta__alloc(a, sizeof(*p));
		if (!p)
			return NULL;
		etcdserverpb__delete_range_response__init(p);
		p->header = h;
		p->deleted = r->u.del.deleted;
		p->prev_kvs = kvs_pb(r->u.del.prev_kvs, r->u.del.nprev_kvs, a);
		if (!p->prev_kvs)
			return NULL;
		p->n_prev_kvs = r->u.del.nprev_kvs;
		return &p->base;
	}
	case MVCC_OP_TXN: {
		Etcdserverpb__TxnResponse *p = meta__alloc(a, sizeof(*p));
		size_t n = r->u.txn.nresponses;
		if (!p)
			return NULL;
		etcdserverpb__txn_response__init(p);
		p->header = h;
		p->succeeded = r->u.txn.succeeded;
		p->responses = meta__alloc(a, (n ? n : 1) * sizeof(*p->responses));
		if (!p->responses)
			return NULL;
		p->n_responses = n;
		for (size_t i = 0; i < n; i++) {
			/* Each nested response has its own header: the member's
			 * IDs and term, and the revision etcd gives that op
			 * (etcd fills only the revision there, and leaves a
			 * nested TxnResponse's header empty). */
			const struct mvcc_op_resp *sr = &r->u.txn.responses[i];
			Etcdserverpb__ResponseOp *o = meta__alloc(a, sizeof(*o));
			Etcdserverpb__ResponseHeader *sh = meta__alloc(a, sizeof(*sh));
			if (!o || !sh)
				return NULL;
			*sh = *h;
			sh->revision = sr->revision;
			ProtobufCMessage *sub = meta__resp_pb(sr, sh, a);
			if (!sub)
				return NULL;
			etcdserverpb__response_op__init(o);
			switch (r->u.txn.responses[i].type) {
			case MVCC_OP_RANGE:
				o->response_case =
					ETCDSERVERPB__RESPONSE_OP__RESPONSE_RESPONSE_RANGE;
				o->response_range = (Etcdserverpb__RangeResponse *)sub;
				break;
			case MVCC_OP_PUT:
				o->response_case =
					ETCDSERVERPB__RESPONSE_OP__RESPONSE_RESPONSE_PUT;
				o->response_put = (Etcdserverpb__PutResponse *)sub;
				break;
			case MVCC_OP_DELETE_RANGE:
				o->response_case =
					ETCDSERVERPB__RESPONSE_OP__RESPONSE_RESPONSE_DELETE_RANGE;
				o->response_delete_range =
					(Etcdserverpb__DeleteRangeResponse *)sub;
				break;
			default:
				o->response_case =
					ETCDSERVERPB__RESPONSE_OP__RESPONSE_RESPONSE_TXN;
				o->response_txn = (Etcdserverpb__TxnResponse *)sub;
				break;
			}
			p->responses[i] = o;
		}
		return &p->base;
	}
	default:
		return NULL;
	}
}

void meta__stamp_headers(const struct meta_node *n, ProtobufCMessage *m)
{
	const ProtobufCMessageDescriptor *d = m->descriptor;

	if (d == &etcdserverpb__response_header__descriptor) {
		Etcdserverpb__ResponseHeader *h = (Etcdserverpb__ResponseHeader *)m;
		h->cluster_id = n->sm.cluster_id;
		h->member_id = n->id;
		h->raft_term = n->term;
		return;
	}
	for (unsigned i = 0; i < d->n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &d->fields[i];
		if (f->type != PROTOBUF_C_TYPE_MESSAGE)
			continue;
		char *at = (char *)m + f->offset;
		if (f->label == PROTOBUF_C_LABEL_REPEATED) {
			size_t k = *(size_t *)((char *)m + f->quantifier_offset);
			ProtobufCMessage **v = *(ProtobufCMessage ***)at;
			for (size_t j = 0; j < k; j++)
				if (v[j])
					meta__stamp_headers(n, v[j]);
			continue;
		}
		if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
		    *(uint32_t *)((char *)m + f->quantifier_offset) != f->id)
			continue;
		ProtobufCMessage *sub = *(ProtobufCMessage **)at;
		if (sub)
			meta__stamp_headers(n, sub);
	}
}

Mvccpb__Event *meta__event_pb(const struct mvcc_event *ev, struct meta__arena *a)
{
	Mvccpb__Event *p = meta__alloc(a, sizeof(*p));
	if (!p)
		return NULL;
	mvccpb__event__init(p);
	p->type = ev->type == MVCC_EVENT_DELETE ? MVCCPB__EVENT__EVENT_TYPE__DELETE
						: MVCCPB__EVENT__EVENT_TYPE__PUT;
	if (!(p->kv = meta__kv_pb(&ev->kv, a)))
		return NULL;
	if (ev->has_prev_kv && !(p->prev_kv = meta__kv_pb(&ev->prev_kv, a)))
		return NULL;
	return p;
}

/* ------------------------------------------------------------- raft messages */

static Mooncake__Raft__ConfState *conf_pb(const struct raft_conf_state *cs,
					  struct meta__arena *a)
{
	Mooncake__Raft__ConfState *p = meta__alloc(a, sizeof(*p));
	if (!p)
		return NULL;
	mooncake__raft__conf_state__init(p);
	p->voters = (uint64_t *)cs->voters;
	p->n_voters = cs->n_voters;
	p->learners = (uint64_t *)cs->learners;
	p->n_learners = cs->n_learners;
	return p;
}

Mooncake__Raft__Message *meta__msg_to_pb(const struct raft_msg *m, struct meta__arena *a)
{
	Mooncake__Raft__Message *p = meta__alloc(a, sizeof(*p));
	if (!p)
		return NULL;
	mooncake__raft__message__init(p);
	p->type = (uint32_t)m->type;
	p->from = m->from;
	p->to = m->to;
	p->term = m->term;
	p->log_term = m->log_term;
	p->index = m->index;
	p->commit = m->commit;
	p->reject = m->reject;
	p->reject_hint = m->reject_hint;
	p->transfer = m->transfer;
	if (m->n_entries) {
		Mooncake__Raft__Entry **v = meta__alloc(a, m->n_entries * sizeof(*v));
		Mooncake__Raft__Entry *blk = meta__alloc(a, m->n_entries * sizeof(*blk));
		if (!v || !blk)
			return NULL;
		for (size_t i = 0; i < m->n_entries; i++) {
			mooncake__raft__entry__init(&blk[i]);
			blk[i].term = m->entries[i].term;
			blk[i].index = m->entries[i].index;
			blk[i].type = (uint32_t)m->entries[i].type;
			blk[i].data.data = (uint8_t *)m->entries[i].data;
			blk[i].data.len = m->entries[i].len;
			v[i] = &blk[i];
		}
		p->entries = v;
		p->n_entries = m->n_entries;
	}
	if (m->type == RAFT_MSG_SNAP) {
		Mooncake__Raft__SnapshotMeta *s = meta__alloc(a, sizeof(*s));
		if (!s)
			return NULL;
		mooncake__raft__snapshot_meta__init(s);
		s->index = m->snapshot.index;
		s->term = m->snapshot.term;
		if (!(s->conf = conf_pb(&m->snapshot.conf, a)))
			return NULL;
		p->snapshot = s;
	}
	p->ctx.data = (uint8_t *)m->ctx;
	p->ctx.len = m->ctx_len;
	return p;
}

/* The arrays of a queued copy follow the struct, aligned. */
static size_t align8(size_t n)
{
	return (n + 7) & ~(size_t)7;
}

struct meta__qmsg *meta__msg_copy(const struct raft_msg *m)
{
	size_t bytes = align8(sizeof(struct meta__qmsg));
	bytes += align8(m->n_entries * sizeof(struct raft_entry));
	for (size_t i = 0; i < m->n_entries; i++)
		bytes += align8(m->entries[i].len);
	bytes += align8(m->snapshot.conf.n_voters * sizeof(uint64_t));
	bytes += align8(m->snapshot.conf.n_learners * sizeof(uint64_t));
	bytes += align8(m->ctx_len);

	struct meta__qmsg *q = malloc(bytes);
	if (!q)
		return NULL;
	unsigned char *p = (unsigned char *)q + align8(sizeof(*q));
	q->next = NULL;
	q->m = *m;
	if (m->n_entries) {
		struct raft_entry *e = (struct raft_entry *)p;
		p += align8(m->n_entries * sizeof(*e));
		for (size_t i = 0; i < m->n_entries; i++) {
			e[i] = m->entries[i];
			if (e[i].len) {
				memcpy(p, m->entries[i].data, e[i].len);
				e[i].data = p;
				p += align8(e[i].len);
			} else {
				e[i].data = NULL;
			}
		}
		q->m.entries = e;
	}
	if (m->snapshot.conf.n_voters) {
		memcpy(p, m->snapshot.conf.voters,
		       m->snapshot.conf.n_voters * sizeof(uint64_t));
		q->m.snapshot.conf.voters = (const uint64_t *)p;
		p += align8(m->snapshot.conf.n_voters * sizeof(uint64_t));
	}
	if (m->snapshot.conf.n_learners) {
		memcpy(p, m->snapshot.conf.learners,
		       m->snapshot.conf.n_learners * sizeof(uint64_t));
		q->m.snapshot.conf.learners = (const uint64_t *)p;
		p += align8(m->snapshot.conf.n_learners * sizeof(uint64_t));
	}
	if (m->ctx_len) {
		memcpy(p, m->ctx, m->ctx_len);
		q->m.ctx = p;
	} else {
		q->m.ctx = NULL;
	}
	return q;
}

struct meta__qmsg *meta__msg_from_pb(const Mooncake__Raft__Message *pm)
{
	struct raft_entry stack_ents[16];
	struct raft_entry *ents = stack_ents;
	struct raft_msg m;
	struct meta__qmsg *q;

	memset(&m, 0, sizeof(m));
	m.type = (enum raft_msg_type)pm->type;
	m.from = pm->from;
	m.to = pm->to;
	m.term = pm->term;
	m.log_term = pm->log_term;
	m.index = pm->index;
	m.commit = pm->commit;
	m.reject = pm->reject;
	m.reject_hint = pm->reject_hint;
	m.transfer = pm->transfer;
	if (pm->n_entries > MC_ARRAY_LEN(stack_ents)) {
		ents = malloc(pm->n_entries * sizeof(*ents));
		if (!ents)
			return NULL;
	}
	for (size_t i = 0; i < pm->n_entries; i++) {
		const Mooncake__Raft__Entry *e = pm->entries[i];
		ents[i].term = e->term;
		ents[i].index = e->index;
		ents[i].type = e->type == RAFT_ENTRY_CONF_CHANGE ? RAFT_ENTRY_CONF_CHANGE
								 : RAFT_ENTRY_NORMAL;
		ents[i].data = e->data.data;
		ents[i].len = e->data.len;
	}
	m.entries = ents;
	m.n_entries = pm->n_entries;
	if (pm->snapshot) {
		m.snapshot.index = pm->snapshot->index;
		m.snapshot.term = pm->snapshot->term;
		if (pm->snapshot->conf) {
			m.snapshot.conf.voters = pm->snapshot->conf->voters;
			m.snapshot.conf.n_voters = pm->snapshot->conf->n_voters;
			m.snapshot.conf.learners = pm->snapshot->conf->learners;
			m.snapshot.conf.n_learners = pm->snapshot->conf->n_learners;
		}
	}
	m.ctx = pm->ctx.data;
	m.ctx_len = pm->ctx.len;
	q = meta__msg_copy(&m);
	if (ents != stack_ents)
		free(ents);
	return q;
}
