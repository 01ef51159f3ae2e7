/*
 * svc: the etcd v3 services of the meta node on --listen-client —
 * etcdserverpb.KV (Range, Put, DeleteRange, Txn, Compact), Lease
 * (LeaseGrant, LeaseRevoke, LeaseKeepAlive, LeaseTimeToLive, LeaseLeases),
 * Cluster (MemberAdd, MemberRemove, MemberUpdate, MemberList,
 * MemberPromote) and Maintenance (Status, Alarm, MoveLeader here; Hash,
 * HashKV, Snapshot and Defragment in svc_maint.c).
 *
 * Each call becomes a request (struct meta__op) for the node; its answer
 * is sent and the call finished from the op's done callback. A client
 * that cancels only detaches: the op runs to its end and its answer is
 * dropped. LeaseKeepAlive is a bidirectional stream: every request
 * message is one op, answered on the stream in request order, and a
 * half-closed stream ends only once every answer due is out.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "meta/meta_int.h"

/* ------------------------------------------------------------- unary calls */

static void finish_send_error(struct rpc_call *call, int rc)
{
	if (rc == MC_ETOO_LARGE)
		rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED,
				"etcdserver: response larger than the maximum message size");
	else
		rpc_call_finish(call, rc == -ECANCELED ? RPC_CANCELLED : RPC_INTERNAL,
				mc_strerror(rc));
}

static void unary_done(struct meta__op *op, int status, const char *message,
		       const ProtobufCMessage *resp)
{
	struct rpc_call *call = op->ud;
	if (!call)
		return; /* the client went away */
	rpc_call_set_data(call, NULL);
	if (status != RPC_OK) {
		rpc_call_finish(call, status, message);
		return;
	}
	int rc = rpc_call_send(call, resp);
	if (rc)
		finish_send_error(call, rc);
	else
		rpc_call_finish(call, RPC_OK, NULL);
}

static void unary(struct rpc_call *call, const ProtobufCMessage *msg, enum meta__method m)
{
	struct meta_node *n = rpc_call_service_data(call);
	struct meta__op *op = meta__op_new(n, m, msg, rpc_call_deadline_ms(call), unary_done,
					   call);
	if (!op) {
		rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, "etcdserver: out of memory");
		return;
	}
	rpc_call_set_data(call, op);
	meta__submit(n, op);
}

static void unary_cancel(struct rpc_call *call)
{
	struct meta__op *op = rpc_call_data(call);
	if (op)
		op->ud = NULL;
	rpc_call_set_data(call, NULL);
	rpc_call_finish(call, RPC_CANCELLED, NULL);
}

#define UNARY_HANDLER(fn, method) \
	static void fn(struct rpc_call *call, const ProtobufCMessage *msg) \
	{ \
		unary(call, msg, method); \
	}

UNARY_HANDLER(on_range, META_M_RANGE)
UNARY_HANDLER(on_put, META_M_PUT)
UNARY_HANDLER(on_delete_range, META_M_DELETE_RANGE)
UNARY_HANDLER(on_txn, META_M_TXN)
UNARY_HANDLER(on_compact, META_M_COMPACT)
UNARY_HANDLER(on_lease_grant, META_M_LEASE_GRANT)
UNARY_HANDLER(on_lease_revoke, META_M_LEASE_REVOKE)
UNARY_HANDLER(on_lease_ttl, META_M_LEASE_TTL)
UNARY_HANDLER(on_lease_leases, META_M_LEASE_LEASES)
UNARY_HANDLER(on_member_add, META_M_MEMBER_ADD)
UNARY_HANDLER(on_member_remove, META_M_MEMBER_REMOVE)
UNARY_HANDLER(on_member_update, META_M_MEMBER_UPDATE)
UNARY_HANDLER(on_member_list, META_M_MEMBER_LIST)
UNARY_HANDLER(on_member_promote, META_M_MEMBER_PROMOTE)
UNARY_HANDLER(on_status, META_M_STATUS)
UNARY_HANDLER(on_alarm, META_M_ALARM)
UNARY_HANDLER(on_move_leader, META_M_MOVE_LEADER)

#define UNARY_METHOD(nm, fn, m) \
	{ \
		.name = nm, .kind = RPC_UNARY, .request = meta__methods[m].req, \
		.response = meta__methods[m].resp, .on_message = fn, \
		.on_cancel = unary_cancel \
	}
/* One that a member whose etcd API wants the cluster secret serves to
 * anyone, as etcd with auth enabled serves MemberList and Status: the
 * members' addresses and state, what a client needs to find the others
 * (etcdctl --cluster asks for the member list without credentials). */
#define OPEN_UNARY_METHOD(nm, fn, m) \
	{ \
		.name = nm, .kind = RPC_UNARY, .request = meta__methods[m].req, \
		.response = meta__methods[m].resp, .on_message = fn, \
		.on_cancel = unary_cancel, .no_auth = true \
	}

/* ------------------------------------------------------------- LeaseKeepAlive */

/*
 * Every request message becomes an op with a slot in the stream's queue;
 * answers go out in request order (etcd serves a stream's requests one
 * after the other), each as soon as it and every one before it is known.
 * A client that half-closes (python-etcd3's refresh_lease sends one
 * request and closes its side at once) still gets every answer due: the
 * call finishes OK once the queue is empty, not when the half-close
 * arrives — on a follower the answer comes back from the leader later.
 * An error answer ends the stream with that status, as etcd's does.
 */
#define KA_MAX_PENDING 4096

struct ka_slot {
	struct ka_slot *next;
	struct meta__kstream *ks;
	bool done;
	int status; /* RPC_OK: the fields below hold the answer */
	char message[160];
	Etcdserverpb__ResponseHeader header;
	int64_t id, ttl;
};

struct meta__kstream {
	struct meta__kstream *next, **pprev;
	struct meta_node *n;
	struct rpc_call *call;
	struct ka_slot *head, *tail; /* in request order */
	unsigned pending;            /* slots whose op is still running */
	unsigned queued;             /* slots in the queue */
	bool half_closed;            /* the client sends nothing more */
	bool ended;                  /* call finished: answers are dropped */
};

static void ks_maybe_free(struct meta__kstream *ks)
{
	if (ks->ended && !ks->pending)
		free(ks);
}

/* Drop the queue (the call ended); slots whose op still runs are freed
 * when it answers. */
static void ks_drop_queue(struct meta__kstream *ks)
{
	while (ks->head) {
		struct ka_slot *sl = ks->head;
		ks->head = sl->next;
		if (sl->done)
			free(sl);
		else
			sl->next = NULL; /* orphaned: freed in ka_done */
	}
	ks->tail = NULL;
	ks->queued = 0;
}

static void ks_end(struct meta__kstream *ks, int status, const char *message)
{
	if (ks->ended)
		return;
	ks->ended = true;
	*ks->pprev = ks->next;
	if (ks->next)
		ks->next->pprev = ks->pprev;
	ks_drop_queue(ks);
	rpc_call_set_data(ks->call, NULL);
	rpc_call_finish(ks->call, status, message);
	ks_maybe_free(ks);
}

/* Send the answers at the head of the queue that are known; finish the
 * call when the client is done sending and nothing is left to answer. */
static void ks_flush(struct meta__kstream *ks)
{
	while (!ks->ended && ks->head && ks->head->done) {
		struct ka_slot *sl = ks->head;
		ks->head = sl->next;
		if (!ks->head)
			ks->tail = NULL;
		ks->queued--;
		if (sl->status != RPC_OK) {
			char msg[sizeof(sl->message)];
			memcpy(msg, sl->message, sizeof(msg));
			int st = sl->status;
			free(sl);
			ks_end(ks, st, msg[0] ? msg : NULL);
			return;
		}
		Etcdserverpb__LeaseKeepAliveResponse resp =
			ETCDSERVERPB__LEASE_KEEP_ALIVE_RESPONSE__INIT;
		resp.header = &sl->header;
		resp.id = sl->id;
		resp.ttl = sl->ttl;
		int rc = rpc_call_send(ks->call, &resp.base);
		free(sl);
		if (rc) {
			ks_end(ks, rc == -ECANCELED ? RPC_CANCELLED : RPC_INTERNAL,
			       mc_strerror(rc));
			return;
		}
	}
	if (!ks->ended && ks->half_closed && !ks->head)
		ks_end(ks, RPC_OK, NULL);
}

static void ka_done(struct meta__op *op, int status, const char *message,
		    const ProtobufCMessage *resp)
{
	struct ka_slot *sl = op->ud;
	struct meta__kstream *ks = sl->ks;

	ks->pending--;
	if (ks->ended) {
		free(sl); /* dropped from the queue when the call ended */
		ks_maybe_free(ks);
		return;
	}
	sl->done = true;
	sl->status = status;
	if (status != RPC_OK) {
		snprintf(sl->message, sizeof(sl->message), "%s", message ? message : "");
	} else {
		const Etcdserverpb__LeaseKeepAliveResponse *r = (const void *)resp;
		etcdserverpb__response_header__init(&sl->header);
		if (r->header) {
			sl->header.cluster_id = r->header->cluster_id;
			sl->header.member_id = r->header->member_id;
			sl->header.revision = r->header->revision;
			sl->header.raft_term = r->header->raft_term;
		}
		sl->id = r->id;
		sl->ttl = r->ttl;
	}
	ks_flush(ks);
}

static void ka_start(struct rpc_call *call)
{
	struct meta_node *n = rpc_call_service_data(call);
	struct meta__kstream *ks = calloc(1, sizeof(*ks));
	if (!ks) {
		rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, "etcdserver: out of memory");
		return;
	}
	ks->n = n;
	ks->call = call;
	ks->next = n->kstreams;
	ks->pprev = &n->kstreams;
	if (n->kstreams)
		n->kstreams->pprev = &ks->next;
	n->kstreams = ks;
	rpc_call_set_data(call, ks);
}

static void ka_message(struct rpc_call *call, const ProtobufCMessage *msg)
{
	struct meta__kstream *ks = rpc_call_data(call);
	if (!ks || ks->ended)
		return;
	if (ks->queued >= KA_MAX_PENDING) {
		ks_end(ks, RPC_RESOURCE_EXHAUSTED, "etcdserver: too many requests");
		return;
	}
	struct ka_slot *sl = calloc(1, sizeof(*sl));
	struct meta__op *op =
		sl ? meta__op_new(ks->n, META_M_LEASE_KEEPALIVE, msg, 0, ka_done, sl) : NULL;
	if (!op) {
		free(sl);
		ks_end(ks, RPC_RESOURCE_EXHAUSTED, "etcdserver: out of memory");
		return;
	}
	sl->ks = ks;
	if (ks->tail)
		ks->tail->next = sl;
	else
		ks->head = sl;
	ks->tail = sl;
	ks->queued++;
	ks->pending++;
	meta__submit(ks->n, op); /* may answer at once */
}

static void ka_half_close(struct rpc_call *call)
{
	struct meta__kstream *ks = rpc_call_data(call);
	if (!ks)
		return;
	ks->half_closed = true;
	ks_flush(ks);
}

static void ka_cancel(struct rpc_call *call)
{
	struct meta__kstream *ks = rpc_call_data(call);
	if (ks)
		ks_end(ks, RPC_CANCELLED, NULL);
	else
		rpc_call_finish(call, RPC_CANCELLED, NULL);
}

void meta__svc_close_streams(struct meta_node *n)
{
	while (n->kstreams)
		ks_end(n->kstreams, RPC_UNAVAILABLE, "etcdserver: server stopped");
	meta__maint_close_calls(n);
}

/* ------------------------------------------------------------- tables */

static struct rpc_method kv_methods[5];
static struct rpc_method lease_methods[5];
static struct rpc_method cluster_methods[5];
static struct rpc_method maint_methods[7];

static void build_tables(void)
{
	static bool built;
	if (built)
		return;
	built = true;
	struct rpc_method kv[] = {
		UNARY_METHOD("Range", on_range, META_M_RANGE),
		UNARY_METHOD("Put", on_put, META_M_PUT),
		UNARY_METHOD("DeleteRange", on_delete_range, META_M_DELETE_RANGE),
		/* etcd refuses a txn nested deeper than --max-txn-ops levels
		 * (each level spends one op of the budget) with TooManyOps;
		 * one nested deeper than the RPC layer unpacks gets the same. */
		{.name = "Txn",
		 .kind = RPC_UNARY,
		 .request = &etcdserverpb__txn_request__descriptor,
		 .response = &etcdserverpb__txn_response__descriptor,
		 .on_message = on_txn,
		 .on_cancel = unary_cancel,
		 .too_deep_status = RPC_INVALID_ARGUMENT,
		 .too_deep_message = "etcdserver: too many operations in txn request"},
		UNARY_METHOD("Compact", on_compact, META_M_COMPACT),
	};
	struct rpc_method lease[] = {
		UNARY_METHOD("LeaseGrant", on_lease_grant, META_M_LEASE_GRANT),
		UNARY_METHOD("LeaseRevoke", on_lease_revoke, META_M_LEASE_REVOKE),
		{.name = "LeaseKeepAlive",
		 .kind = RPC_BIDI_STREAMING,
		 .request = &etcdserverpb__lease_keep_alive_request__descriptor,
		 .response = &etcdserverpb__lease_keep_alive_response__descriptor,
		 .on_start = ka_start,
		 .on_message = ka_message,
		 .on_half_close = ka_half_close,
		 .on_cancel = ka_cancel},
		UNARY_METHOD("LeaseTimeToLive", on_lease_ttl, META_M_LEASE_TTL),
		UNARY_METHOD("LeaseLeases", on_lease_leases, META_M_LEASE_LEASES),
	};
	struct rpc_method cluster[] = {
		UNARY_METHOD("MemberAdd", on_member_add, META_M_MEMBER_ADD),
		UNARY_METHOD("MemberRemove", on_member_remove, META_M_MEMBER_REMOVE),
		UNARY_METHOD("MemberUpdate", on_member_update, META_M_MEMBER_UPDATE),
		OPEN_UNARY_METHOD("MemberList", on_member_list, META_M_MEMBER_LIST),
		UNARY_METHOD("MemberPromote", on_member_promote, META_M_MEMBER_PROMOTE),
	};
	struct rpc_method maint[] = {
		OPEN_UNARY_METHOD("Status", on_status, META_M_STATUS),
		UNARY_METHOD("Alarm", on_alarm, META_M_ALARM),
		UNARY_METHOD("MoveLeader", on_move_leader, META_M_MOVE_LEADER),
		{.name = "Hash",
		 .kind = RPC_UNARY,
		 .request = &etcdserverpb__hash_request__descriptor,
		 .response = &etcdserverpb__hash_response__descriptor,
		 .on_message = meta__on_hash,
		 .on_cancel = meta__maint_cancel},
		{.name = "HashKV",
		 .kind = RPC_UNARY,
		 .request = &etcdserverpb__hash_kvrequest__descriptor,
		 .response = &etcdserverpb__hash_kvresponse__descriptor,
		 .on_message = meta__on_hash_kv,
		 .on_cancel = meta__maint_cancel},
		{.name = "Snapshot",
		 .kind = RPC_SERVER_STREAMING,
		 .request = &etcdserverpb__snapshot_request__descriptor,
		 .response = &etcdserverpb__snapshot_response__descriptor,
		 .on_message = meta__on_snapshot,
		 .on_cancel = meta__maint_cancel,
		 .on_drain = meta__maint_drain},
		{.name = "Defragment",
		 .kind = RPC_UNARY,
		 .request = &etcdserverpb__defragment_request__descriptor,
		 .response = &etcdserverpb__defragment_response__descriptor,
		 .on_message = meta__on_defragment},
	};
	memcpy(kv_methods, kv, sizeof(kv));
	memcpy(lease_methods, lease, sizeof(lease));
	memcpy(cluster_methods, cluster, sizeof(cluster));
	memcpy(maint_methods, maint, sizeof(maint));
}

int meta__svc_add(struct meta_node *n)
{
	struct rpc_server *s = n->o.client_srv;
	int rc;

	if (!s)
		return 0;
	/* etcd's gRPC server takes requests up to --max-request-bytes plus
	 * 512 KiB of overhead (grpcOverheadBytes) and refuses bigger ones
	 * with ResourceExhausted; a write between the two gets "request is
	 * too large" from the node. */
	rpc_server_set_max_recv_bytes(s, n->o.max_request_bytes + META_GRPC_OVERHEAD_BYTES);
	build_tables();
	if ((rc = rpc_server_add_service(s, "etcdserverpb.KV", kv_methods,
					 MC_ARRAY_LEN(kv_methods), n)) ||
	    (rc = rpc_server_add_service(s, "etcdserverpb.Lease", lease_methods,
					 MC_ARRAY_LEN(lease_methods), n)) ||
	    (rc = rpc_server_add_service(s, "etcdserverpb.Cluster", cluster_methods,
					 MC_ARRAY_LEN(cluster_methods), n)) ||
	    (rc = rpc_server_add_service(s, "etcdserverpb.Maintenance", maint_methods,
					 MC_ARRAY_LEN(maint_methods), n)))
		return rc;
	return 0;
}
