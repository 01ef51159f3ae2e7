/*
 * sm: the meta state machine and the etcd vocabulary it speaks — what a
 * committed log entry does to the replicated state, on every member
 * alike, and the reads served from that state.
 *
 * The state: the MVCC store with its lease table, the member table, the
 * IDs of removed members, the alarms and the cluster ID. Applying is
 * deterministic in fact: its only inputs are the state, the entry and
 * struct meta__sm_in, and it touches nothing else — no clock (the time is
 * an input), no transport, no node. What the driver must do about an
 * entry (reach a new peer, notice that this member was removed, log a
 * membership change) comes back as struct meta__sm_effects. sm.c includes
 * no libuv and calls no clock; the Makefile's purity check holds it to
 * that.
 *
 * The time an entry is applied at matters to one thing only: on the
 * leader (the primary lessor), a lease granted by the entry expires TTL
 * after it. That expiry is the leader's own, on its own monotonic clock,
 * and not replicated (followers keep every lease unexpired, and a new
 * leader restarts every TTL on its clock), so the time is passed in by
 * the member applying the entry rather than stamped into the entry by the
 * one proposing it: a stamp would be another process's clock, which
 * means nothing to the next leader. Everything replicated — keys,
 * revisions, lease IDs and TTLs, members, alarms, the snapshot — is the
 * same on every member whatever the time (test_meta_sm shows it).
 */
#ifndef MC_META_SM_H
#define MC_META_SM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "etcd_rpc.pb-c.h"
#include "meta.pb-c.h"
#include "raft.pb-c.h"
#include "common/err.h"
#include "meta/bolt.h"
#include "meta/lease.h"
#include "meta/mvcc.h"
#include "meta/raft/raft.h"

/* ------------------------------------------------------------- errors */
/*
 * The etcd server errors the node answers with besides the state
 * machine's (MVCC_E*): code, gRPC status, etcd's message. The range
 * -950.. is used by no errno, MC_E* or MVCC_E*.
 */
#define META_ERRORS(X) \
	X(META_ENO_LEADER, -950, RPC_UNAVAILABLE, "etcdserver: no leader") \
	X(META_ENOT_LEADER, -951, RPC_FAILED_PRECONDITION, "etcdserver: not leader") \
	X(META_ELEADER_CHANGED, -952, RPC_UNAVAILABLE, "etcdserver: leader changed") \
	X(META_ETIMEOUT, -953, RPC_UNAVAILABLE, "etcdserver: request timed out") \
	X(META_ESTOPPED, -954, RPC_UNAVAILABLE, "etcdserver: server stopped") \
	X(META_ETOO_LARGE, -955, RPC_INVALID_ARGUMENT, "etcdserver: request is too large") \
	X(META_ENOSPACE, -956, RPC_RESOURCE_EXHAUSTED, \
	  "etcdserver: mvcc: database space exceeded") \
	X(META_EMEMBER_NOT_FOUND, -957, RPC_NOT_FOUND, "etcdserver: member not found") \
	X(META_EMEMBER_EXISTS, -958, RPC_FAILED_PRECONDITION, \
	  "etcdserver: member ID already exist") \
	X(META_EPEER_URL_EXISTS, -959, RPC_FAILED_PRECONDITION, \
	  "etcdserver: Peer URLs already exists") \
	X(META_ENOT_LEARNER, -960, RPC_FAILED_PRECONDITION, \
	  "etcdserver: can only promote a learner member") \
	X(META_ELEARNER_NOT_READY, -961, RPC_FAILED_PRECONDITION, \
	  "etcdserver: can only promote a learner member which is in sync " \
	  "with leader") \
	X(META_ENOT_ENOUGH_STARTED, -962, RPC_FAILED_PRECONDITION, \
	  "etcdserver: re-configuration failed due to not enough started " \
	  "members") \
	X(META_EBAD_URLS, -963, RPC_INVALID_ARGUMENT, \
	  "etcdserver: given member URLs are invalid") \
	X(META_ENOT_CAPABLE, -964, RPC_UNAVAILABLE, "etcdserver: not capable") \
	X(META_ETIMEOUT_LEADER_FAIL, -965, RPC_UNAVAILABLE, \
	  "etcdserver: request timed out, possibly due to previous leader " \
	  "failure") \
	X(META_ETIMEOUT_CONN_LOST, -966, RPC_UNAVAILABLE, \
	  "etcdserver: request timed out, possibly due to connection lost") \
	X(META_EBAD_LEADER_TRANSFEREE, -967, RPC_FAILED_PRECONDITION, \
	  "etcdserver: bad leader transferee") \
	X(META_ETOO_MANY_LEARNERS, -968, RPC_FAILED_PRECONDITION, \
	  "etcdserver: too many learner members in cluster") \
	X(META_ETIMEOUT_LEADER_TRANSFER, -969, RPC_UNKNOWN, \
	  "etcdserver: request timed out, leader transfer took too long")

/* etcd's limit on learners (membership.maxLearners). */
#define META_MAX_LEARNERS 1
/* What etcd's gRPC server takes beyond --max-request-bytes
 * (v3rpc.grpcOverheadBytes). */
#define META_GRPC_OVERHEAD_BYTES (512u * 1024u)

enum meta__err {
#define META__ERR_ENUM(name, value, status, text) name = value,
	META_ERRORS(META__ERR_ENUM)
#undef META__ERR_ENUM
};

/* The gRPC status and message a client gets for an error code (META_E*,
 * MVCC_E*, MC_E*, negative errno). */
void meta__status_of(int code, int *status, const char **message);
/* Text of any code above (for logs). */
const char *meta__strerror(int code);

/* ------------------------------------------------------------- arena */

/* A bump allocator for building response messages; freed at once. */
struct meta__arena {
	struct meta__ablk *head;
};
/* n zeroed bytes; NULL when out of memory. */
void *meta__alloc(struct meta__arena *a, size_t n);
void meta__arena_free(struct meta__arena *a);

/* ------------------------------------------------------------- methods */

enum meta__method {
	META_M_RANGE,
	META_M_PUT,
	META_M_DELETE_RANGE,
	META_M_TXN,
	META_M_COMPACT,
	META_M_LEASE_GRANT,
	META_M_LEASE_REVOKE,
	META_M_LEASE_KEEPALIVE,
	META_M_LEASE_TTL,
	META_M_LEASE_LEASES,
	META_M_MEMBER_ADD,
	META_M_MEMBER_REMOVE,
	META_M_MEMBER_UPDATE,
	META_M_MEMBER_LIST,
	META_M_MEMBER_PROMOTE,
	META_M_ALARM,
	META_M_STATUS,
	META_M_MOVE_LEADER,
	META_M_PUBLISH, /* a member's name and client URL (internal) */
	META_M__COUNT
};

struct meta__method_def {
	const char *name; /* etcd's method name ("Range") */
	const ProtobufCMessageDescriptor *req, *resp;
};
extern const struct meta__method_def meta__methods[META_M__COUNT];
/* The method with that name, or -1. */
int meta__method_by_name(const char *name);

/* ------------------------------------------------------------- members */

struct meta__member {
	uint64_t id;
	char *name;       /* "" until published */
	char *peer_url;   /* "http://host:port" */
	char *client_url; /* "" until published */
	bool learner;
};

/* ------------------------------------------------------------- the state machine */

/* The replicated state. Fields are the state machine's: others read them
 * and change them only through the functions below. */
struct meta__sm {
	struct mvcc_store *store;
	struct mvcc_options mo;       /* every store of this sm is built with */
	struct meta__member *members; /* sorted by ID */
	size_t n_members;
	uint64_t *removed; /* IDs of removed members */
	size_t n_removed;
	Etcdserverpb__AlarmMember *alarms; /* member_id, alarm */
	size_t n_alarms;
	uint64_t cluster_id;
	uint64_t member_id; /* this member, named in response headers (set by the driver) */
};

/* What the state machine is told besides the entry or request. */
struct meta__sm_in {
	uint64_t now_ms; /* this member's monotonic time: lease expiry on the leader */
	uint64_t term;   /* the Raft term response headers name */
};

/* What an entry changed that the driver acts on or reports. */
enum meta__member_change {
	META_MEMBER_NONE,
	META_MEMBER_ADDED,     /* a voter or learner; its peer URL is in the table */
	META_MEMBER_PROMOTED,  /* learner to voter */
	META_MEMBER_REMOVED,   /* gone from the table, its ID in the removed list */
	META_MEMBER_PUBLISHED, /* its name and client URL */
	META_MEMBER_MOVED,     /* a new peer URL (MemberUpdate) */
};
struct meta__sm_effects {
	enum meta__member_change member_change;
	uint64_t member_id;
	int alarm_raised; /* an alarm newly raised (0: none), for alarm_member */
	uint64_t alarm_member;
	size_t alarms_cleared;
	int64_t compacted_rev; /* the store was compacted at this revision (0: not) */
};

/* An empty state whose stores are built with mo. Errors: -ENOMEM. */
int meta__sm_init(struct meta__sm *sm, const struct mvcc_options *mo) MC_MUST_CHECK;
/* Free the state (store, members, alarms); sm may be zeroed or freed. */
void meta__sm_free(struct meta__sm *sm);

/* What applying an entry answers the op that proposed it. */
struct meta__reply {
	int code; /* 0 or an error code (meta__status_of) */
	ProtobufCMessage *resp;
	struct meta__arena arena;
	struct mvcc_result mres;
	bool has_mres;
};
void meta__reply_free(struct meta__reply *r);

/*
 * Apply a committed entry. r (may be NULL) gets the answer for the op
 * that proposed it; *fx (zeroed here) what it changed that the driver
 * must know. Errors (fatal: the member would diverge): -ENOMEM, -EBADMSG
 * (an entry that does not decode).
 */
int meta__sm_apply(struct meta__sm *sm, const struct raft_entry *e,
		   const struct meta__sm_in *in, struct meta__reply *r,
		   struct meta__sm_effects *fx) MC_MUST_CHECK;

/* Serve a read-only request of method m (Range, read-only Txn,
 * LeaseLeases, MemberList, Alarm GET), serialized in req, from the state
 * into r: r->code is 0 with r->resp set, or the request's error (-ENOMEM;
 * -EINVAL for another method or a request that does not decode). */
void meta__sm_read(struct meta__sm *sm, const struct meta__sm_in *in, enum meta__method m,
		   const uint8_t *req, size_t len, struct meta__reply *r);
/* Leader-local requests (LeaseKeepAlive, LeaseTimeToLive) on the lease
 * table's clock in->now_ms. Returns 0 (r->code may hold the request's
 * error), MC_ENOT_LEADER (this member is not the primary lessor) or
 * -EAGAIN when the answer must wait for the next apply (an expired
 * lease's revoke is in flight). */
int meta__sm_leader(struct meta__sm *sm, const struct meta__sm_in *in, enum meta__method m,
		    const uint8_t *req, size_t len, struct meta__reply *r) MC_MUST_CHECK;

/* A ResponseHeader naming the state's cluster, the member, the store's
 * revision and term, in arena a; NULL when out of memory. */
Etcdserverpb__ResponseHeader *meta__sm_header(const struct meta__sm *sm, uint64_t term,
					      struct meta__arena *a);

/* The whole state (members, alarms, KV store) as snapshot data:
 *   u32 header length (little-endian) | mooncake.meta.SnapshotHeader |
 *   the MVCC store's snapshot (mvcc.h)
 * First frees whatever compactions dropped (mvcc_compact_work), which the
 * snapshot must not hold. Errors: -ENOMEM. */
int meta__sm_snapshot(struct meta__sm *sm, uint8_t **data, size_t *len) MC_MUST_CHECK;
/* The same, handed to fn in pieces as it is encoded (the state is not
 * copied whole). Errors: -ENOMEM, what fn returned. */
int meta__sm_snapshot_write(struct meta__sm *sm, mvcc_write_fn fn, void *ctx) MC_MUST_CHECK;
/* The same in steps while the state takes entries (mvcc.h's cursor): the
 * members, alarms and leases go to fn now, then mvcc_snap_step() encodes
 * the keys as they were now. Errors: MVCC_ECOMPACT_PENDING (free the
 * compacted versions first), -ENOMEM, what fn returned. */
int meta__sm_snap_begin(const struct meta__sm *sm, mvcc_write_fn fn, void *ctx,
			struct mvcc_snap_cursor **cur) MC_MUST_CHECK;
/* Replace the state with snapshot data (the member table changes
 * wholesale: the driver reconciles its peers). The state is unchanged on
 * error. Errors: -EBADMSG, -ENOMEM. */
int meta__sm_restore(struct meta__sm *sm, const uint8_t *data, size_t len) MC_MUST_CHECK;
/* Decode snapshot data (as meta__sm_snapshot makes it) into a private
 * store and member tables, call fn with them as the state of an etcd
 * backend whose consistent index is applied, then free them. Touches no
 * state machine, so it runs on any thread. Errors: -EBADMSG, -ENOMEM,
 * what fn returned. */
int meta__sm_export(const uint8_t *data, size_t len, const struct mvcc_options *mo,
		    uint64_t applied, int (*fn)(void *ctx, const struct bolt_state *st),
		    void *ctx) MC_MUST_CHECK;

/* The voters/learners of the member table, as a ConfState (serialized,
 * malloc'd). Errors: -ENOMEM. */
int meta__conf_bytes(const struct meta__sm *sm, uint8_t **out, size_t *len) MC_MUST_CHECK;
/* Decode a ConfState (arrays malloc'd, sorted). Errors: -EBADMSG, -ENOMEM. */
int meta__conf_parse(const uint8_t *data, size_t len,
		     struct raft_conf_state *cs) MC_MUST_CHECK;
void meta__conf_state_free(struct raft_conf_state *cs);

const struct meta__member *meta__member_find(const struct meta__sm *sm, uint64_t id);
bool meta__is_removed(const struct meta__sm *sm, uint64_t id);
/* The member list as etcd Members, in arena a (NULL on OOM). */
Etcdserverpb__Member **meta__members_pb(const struct meta__sm *sm, struct meta__arena *a,
					size_t *count);
bool meta__alarm_active(const struct meta__sm *sm, int alarm);
/* What --quota-backend-bytes holds the store to (and Status reports as
 * its size): the keys' versions, and META_LEASE_QUOTA_BYTES per lease
 * (etcd's leaseOverhead: its leases sit in its database), so grants
 * without end meet the quota too. */
#define META_LEASE_QUOTA_BYTES 64
uint64_t meta__quota_size(const struct meta__sm *sm);
/* Whether a write of req_len bytes must be refused for the quota: the
 * NOSPACE alarm is on or the write would take the store past quota_bytes. */
bool meta__over_quota(const struct meta__sm *sm, uint64_t quota_bytes, size_t req_len);

/* ------------------------------------------------------------- etcd <-> mvcc (conv.c) */

/*
 * The log entry of a write: a mooncake.meta.Request whose oneof field for
 * method m holds the serialized etcd request (req, len) — a tag, a
 * length, then the bytes as they are, so nothing is re-encoded. *out is
 * malloc'd. Errors: -EINVAL (m is not a logged write), -ENOMEM.
 */
int meta__wrap_request(enum meta__method m, const uint8_t *req, size_t len, uint8_t **out,
		       size_t *out_len) MC_MUST_CHECK;

/* etcd request -> mvcc op, borrowing the message's bytes; nested arrays
 * in arena a. Errors: -ENOMEM, -EINVAL. */
int meta__op_from_range(const Etcdserverpb__RangeRequest *r, struct mvcc_op *op);
int meta__op_from_put(const Etcdserverpb__PutRequest *r, struct mvcc_op *op);
int meta__op_from_delete(const Etcdserverpb__DeleteRangeRequest *r, struct mvcc_op *op);
int meta__op_from_txn(const Etcdserverpb__TxnRequest *r, struct mvcc_op *op,
		      struct meta__arena *a) MC_MUST_CHECK;
/* Does this txn write (a put or delete anywhere, nested included)?
 * with_put: only puts count. */
bool meta__txn_writes(const Etcdserverpb__TxnRequest *r, bool put_only);
bool meta__txn_serializable(const Etcdserverpb__TxnRequest *r);

/* mvcc response -> etcd message in arena a (bytes borrowed from the
 * result). h is the response's header; each nested response of a txn
 * gets a copy with the revision etcd gives that op. NULL when out of
 * memory. */
Mvccpb__KeyValue *meta__kv_pb(const struct mvcc_kv *kv, struct meta__arena *a);
ProtobufCMessage *meta__resp_pb(const struct mvcc_op_resp *r, Etcdserverpb__ResponseHeader *h,
				struct meta__arena *a);
Mvccpb__Event *meta__event_pb(const struct mvcc_event *ev, struct meta__arena *a);

#endif
