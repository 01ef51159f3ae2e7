/*
 * mvcc: the meta role's state machine — a multi-version key-value store
 * with etcd v3 semantics, driven by the Raft log.
 *
 * Every write request (Put, DeleteRange, a Txn with writes, a lease revoke
 * that deletes keys) that changes something becomes one main revision; the
 * changes inside it are numbered by a sub revision. Each key keeps its
 * history as a list of versions ordered by (main, sub): create_revision,
 * mod_revision, version (1 on create, +1 per put, a delete writes a
 * tombstone and the next put starts at 1 again) and lease. Reads see the
 * latest version at or below the requested revision. Compaction at C drops
 * the history nobody can read any more (see mvcc_compact()).
 *
 * Like etcd, the store starts at revision 1 with no compaction (-1), so the
 * first write is revision 2; a request that changes nothing (a DeleteRange
 * that matches no key, a read-only Txn) does not bump the revision.
 *
 * The core is pure and deterministic: no I/O, no clock, no randomness, no
 * iteration in pointer or hash order — the same sequence of calls gives
 * the same state (and the same snapshot bytes) on every member. Time only
 * enters through the lease table (lease.h), as an argument.
 *
 * Data structures: an AVL tree of key nodes in byte order (each holding its
 * version array), and a revision log — an array of (main, sub, key) in
 * revision order — that serves watch catch-up (mvcc_hist_*) and makes
 * compaction cost proportional to the history it discards. Point operations
 * are O(log n); a range is O(log n + keys scanned).
 *
 * Not thread-safe: one thread (the apply loop) owns a store.
 */
#ifndef MC_META_MVCC_H
#define MC_META_MVCC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

/*
 * Errors of the meta state machine (mvcc, lease and watch), each with the
 * etcd error the service must answer with. The text is etcd's own message
 * where etcd has one. -ENOMEM and -EINVAL (a sort target out of range) are
 * returned as they are. The range -900.. is used by no errno and no MC_E*.
 *
 *   MVCC_ECOMPACTED        ErrCompacted          (OutOfRange)
 *   MVCC_EFUTURE_REV       ErrFutureRev          (OutOfRange)
 *   MVCC_EKEY_NOT_FOUND    ErrGRPCKeyNotFound    (InvalidArgument)
 *   MVCC_ELEASE_NOT_FOUND  ErrGRPCLeaseNotFound  (NotFound)
 *   MVCC_EDUPLICATE_KEY    ErrGRPCDuplicateKey   (InvalidArgument)
 *   MVCC_EEMPTY_KEY        ErrGRPCEmptyKey       (InvalidArgument)
 *   MVCC_EVALUE_PROVIDED   ErrGRPCValueProvided  (InvalidArgument)
 *   MVCC_ELEASE_PROVIDED   ErrGRPCLeaseProvided  (InvalidArgument)
 *   MVCC_ETOO_MANY_OPS     ErrGRPCTooManyOps     (InvalidArgument)
 *   MVCC_ELEASE_EXISTS     ErrGRPCLeaseExist     (FailedPrecondition)
 *   MVCC_ELEASE_TTL_TOO_LARGE ErrGRPCLeaseTTLTooLarge (OutOfRange)
 *   MVCC_ELEASE_EXPIRED    keep-alive of an expired lease whose revoke is
 *                          pending: wait for the revoke, then answer
 *                          ErrGRPCLeaseNotFound (etcd's lessor does that)
 *   MVCC_EEMPTY_WATCH_RANGE / MVCC_EWATCH_EXISTS / MVCC_EWATCH_NOT_FOUND:
 *                          the watch create/cancel errors (etcd answers a
 *                          create failure with a canceled WatchResponse)
 *   MVCC_ESNAPSHOT_CORRUPT / MVCC_ESNAPSHOT_VERSION: a snapshot that
 *                          cannot be restored (never sent to clients)
 *   MVCC_ECOMPACT_PENDING: a snapshot asked for before mvcc_compact_work
 *                          finished (never sent to clients)
 */
#define MVCC_ERRORS(X) \
	X(MVCC_ECOMPACTED, -900, "mvcc: required revision has been compacted") \
	X(MVCC_EFUTURE_REV, -901, "mvcc: required revision is a future revision") \
	X(MVCC_EKEY_NOT_FOUND, -902, "etcdserver: key not found") \
	X(MVCC_ELEASE_NOT_FOUND, -903, "etcdserver: requested lease not found") \
	X(MVCC_EDUPLICATE_KEY, -904, "etcdserver: duplicate key given in txn request") \
	X(MVCC_EEMPTY_KEY, -905, "etcdserver: key is not provided") \
	X(MVCC_EVALUE_PROVIDED, -906, "etcdserver: value is provided") \
	X(MVCC_ELEASE_PROVIDED, -907, "etcdserver: lease is provided") \
	X(MVCC_ETOO_MANY_OPS, -908, "etcdserver: too many operations in txn request") \
	X(MVCC_ELEASE_EXISTS, -909, "etcdserver: lease already exists") \
	X(MVCC_ELEASE_TTL_TOO_LARGE, -910, "etcdserver: too large lease TTL") \
	X(MVCC_ELEASE_EXPIRED, -911, "lease expired, revoke pending") \
	X(MVCC_EEMPTY_WATCH_RANGE, -912, "mvcc: watcher range is empty") \
	X(MVCC_EWATCH_EXISTS, -913, "mvcc: duplicate watch ID provided on the WatchStream") \
	X(MVCC_EWATCH_NOT_FOUND, -914, "mvcc: watcher does not exist") \
	X(MVCC_ESNAPSHOT_CORRUPT, -915, "mvcc: snapshot is corrupt") \
	X(MVCC_ESNAPSHOT_VERSION, -916, "mvcc: unsupported snapshot version") \
	X(MVCC_ESNAPSHOT_STALE, -917, "mvcc: the store was compacted during the snapshot") \
	X(MVCC_ECOMPACT_PENDING, -918, "mvcc: a compaction's versions are still being freed")

enum mvcc_err {
#define MVCC__ERR_ENUM(name, value, text) name = value,
	MVCC_ERRORS(MVCC__ERR_ENUM)
#undef MVCC__ERR_ENUM
};

/* Text / name of an MVCC_E* code; other codes go to mc_strerror()/mc_errname(). */
const char *mvcc_strerror(int code);
const char *mvcc_errname(int code);

/* ------------------------------------------------------------- data */

/* A key-value pair as etcd's mvccpb.KeyValue. Bytes are owned by whatever
 * returned the kv (a result, a delivery, or the store for hist events). */
struct mvcc_kv {
	const char *key;
	size_t key_len;
	const char *value;
	size_t value_len;
	int64_t create_revision;
	int64_t mod_revision;
	int64_t version;
	int64_t lease;
};

enum mvcc_event_type { MVCC_EVENT_PUT = 0, MVCC_EVENT_DELETE = 1 };

/* mvccpb.Event. For DELETE, kv holds the key and mod_revision (the
 * deletion's revision), the rest is zero, like etcd. */
struct mvcc_event {
	int type; /* enum mvcc_event_type */
	struct mvcc_kv kv;
	bool has_prev_kv;
	struct mvcc_kv prev_kv;
};

/* ------------------------------------------------------------- requests */
/*
 * Requests mirror etcdserverpb and borrow every byte they point to. Key
 * ranges follow etcd: range_end_len == 0 is the single key; range_end "\0"
 * (length 1) is every key >= key; otherwise [key, range_end). key "\0"
 * with range_end "\0" is every key. Enum values are the protobuf numbers.
 */
enum mvcc_sort_order {
	MVCC_SORT_NONE = 0,
	MVCC_SORT_ASCEND = 1,
	MVCC_SORT_DESCEND = 2,
};
enum mvcc_sort_target {
	MVCC_SORT_KEY = 0,
	MVCC_SORT_VERSION = 1,
	MVCC_SORT_CREATE = 2,
	MVCC_SORT_MOD = 3,
	MVCC_SORT_VALUE = 4,
};

struct mvcc_range_req {
	const char *key;
	size_t key_len;
	const char *range_end;
	size_t range_end_len;
	int64_t limit;    /* <= 0: no limit */
	int64_t revision; /* <= 0: current */
	int sort_order;   /* enum mvcc_sort_order */
	int sort_target;  /* enum mvcc_sort_target */
	bool keys_only;
	bool count_only;
	int64_t min_mod_revision; /* 0: no filter (the four below likewise) */
	int64_t max_mod_revision;
	int64_t min_create_revision;
	int64_t max_create_revision;
};

struct mvcc_put_req {
	const char *key;
	size_t key_len;
	const char *value;
	size_t value_len;
	int64_t lease; /* 0: none */
	bool prev_kv;
	bool ignore_value;
	bool ignore_lease;
};

struct mvcc_delete_req {
	const char *key;
	size_t key_len;
	const char *range_end;
	size_t range_end_len;
	bool prev_kv;
};

enum mvcc_compare_result {
	MVCC_CMP_EQUAL = 0,
	MVCC_CMP_GREATER = 1,
	MVCC_CMP_LESS = 2,
	MVCC_CMP_NOT_EQUAL = 3,
};
enum mvcc_compare_target {
	MVCC_TARGET_VERSION = 0,
	MVCC_TARGET_CREATE = 1,
	MVCC_TARGET_MOD = 2,
	MVCC_TARGET_VALUE = 3,
	MVCC_TARGET_LEASE = 4,
};

/* etcdserverpb.Compare. number is the version / create_revision /
 * mod_revision / lease to compare with; value is used for VALUE. A compare
 * over a range holds when it holds for every key in it; over no key, it
 * compares a zero KeyValue (version 0, create 0, ...) except VALUE, which
 * is then always false — etcd's rules. */
struct mvcc_compare {
	int result; /* enum mvcc_compare_result */
	int target; /* enum mvcc_compare_target */
	const char *key;
	size_t key_len;
	const char *range_end;
	size_t range_end_len;
	int64_t number;
	const char *value;
	size_t value_len;
};

enum mvcc_op_type {
	MVCC_OP_NONE = 0, /* an empty RequestOp: etcd answers "key not found" */
	MVCC_OP_RANGE = 1,
	MVCC_OP_PUT = 2,
	MVCC_OP_DELETE_RANGE = 3,
	MVCC_OP_TXN = 4,
};

struct mvcc_op;

struct mvcc_txn_req {
	const struct mvcc_compare *compare;
	size_t ncompare;
	const struct mvcc_op *success;
	size_t nsuccess;
	const struct mvcc_op *failure;
	size_t nfailure;
};

/* One request: a top-level Range/Put/DeleteRange/Txn or a txn's RequestOp. */
struct mvcc_op {
	int type; /* enum mvcc_op_type */
	union {
		struct mvcc_range_req range;
		struct mvcc_put_req put;
		struct mvcc_delete_req del;
		struct mvcc_txn_req txn;
	} u;
};

/* ------------------------------------------------------------- responses */

struct mvcc_range_resp {
	struct mvcc_kv *kvs; /* in key order, or as sorted */
	size_t nkvs;
	bool more;     /* limit cut the result */
	int64_t count; /* keys in the range at that revision (before limit and
	                  the min/max filters, like etcd) */
};

struct mvcc_put_resp {
	bool has_prev_kv;
	struct mvcc_kv prev_kv;
};

struct mvcc_delete_resp {
	int64_t deleted;
	struct mvcc_kv *prev_kvs; /* when prev_kv was asked, in key order */
	size_t nprev_kvs;
};

struct mvcc_op_resp;

struct mvcc_txn_resp {
	bool succeeded;
	struct mvcc_op_resp *responses;
	size_t nresponses;
};

struct mvcc_op_resp {
	int type; /* enum mvcc_op_type of the request */
	/* The revision etcd puts in this response's header: for a Range
	 * the revision it read (the txn's own once the txn has written
	 * something before it), for a Put the txn's new revision, for a
	 * DeleteRange the new one when it or an earlier op of the txn
	 * changed something (else the revision before), for a Txn the same
	 * after its ops. At the top level it equals mvcc_result.revision. */
	int64_t revision;
	union {
		struct mvcc_range_resp range;
		struct mvcc_put_resp put;
		struct mvcc_delete_resp del;
		struct mvcc_txn_resp txn;
	} u;
};

/*
 * The answer to mvcc_apply(). Caller storage; everything it points to is
 * owned by it (copied out of the store) until mvcc_result_free().
 */
struct mvcc_result {
	/* public */
	int64_t revision; /* the header revision: the store's revision after
	                     the request */
	struct mvcc_op_resp resp;
	/* private */
	struct mvcc__blk *arena;
};

/* ------------------------------------------------------------- store */

struct mvcc_store;
struct lease_table;

struct mvcc_options {
	size_t max_txn_ops;      /* etcd --max-txn-ops; 0: 128 */
	int64_t min_lease_ttl_s; /* leases granted shorter get this TTL */
};

/* Create an empty store (revision 1, nothing compacted) with its lease
 * table. opts may be NULL (defaults). Errors: -ENOMEM. */
int mvcc_new(const struct mvcc_options *opts, struct mvcc_store **out) MC_MUST_CHECK;
void mvcc_free(struct mvcc_store *s);

int64_t mvcc_rev(const struct mvcc_store *s);
/* The last compaction revision, -1 before the first. */
int64_t mvcc_compact_rev(const struct mvcc_store *s);
/*
 * Logical size of everything stored, live and historical: for each version
 * key + value + MVCC_VERSION_OVERHEAD_BYTES. Grows with every write,
 * shrinks when compaction drops history. The service compares it with
 * --quota-backend-bytes (etcd's dbSizeInUse plays this role).
 */
#define MVCC_VERSION_OVERHEAD_BYTES 32
uint64_t mvcc_db_size_bytes(const struct mvcc_store *s);

struct mvcc_stats {
	uint64_t keys;          /* live keys */
	uint64_t key_nodes;     /* keys with any history (live or tombstoned) */
	uint64_t versions;      /* stored versions incl. tombstones */
	uint64_t revlog;        /* revision log entries (history >= compaction) */
	uint64_t memory_bytes;  /* estimate of the heap held by keys, versions
	                           and the revision log (malloc overhead and
	                           leases not included) */
	uint64_t db_size_bytes; /* as mvcc_db_size_bytes() */
};
void mvcc_stats(const struct mvcc_store *s, struct mvcc_stats *out);

/* The store's lease table (borrowed; lives as long as the store). Grants,
 * keep-alives, checkpoints and expiry go straight to lease.h; revokes go
 * through mvcc_lease_revoke() because they delete keys. */
struct lease_table *mvcc_leases(struct mvcc_store *s);

/*
 * Execute one request exactly as etcd applies it: a Range (read-only), a
 * Put, a DeleteRange or a Txn (compares and the chosen branch's ops, nested
 * txns included, evaluated against the state before the txn; every write
 * of the request shares one new main revision). On success fills *out
 * (caller storage, free with mvcc_result_free). On error the store is
 * unchanged and *out holds nothing.
 *
 * The request is first checked the way etcd's gRPC layer checks it (empty
 * keys, ignore_value with a value, ignore_lease with a lease, more than
 * max_txn_ops ops in a txn level, put/delete overlaps inside a txn).
 *
 * Errors: MVCC_EEMPTY_KEY, MVCC_EVALUE_PROVIDED, MVCC_ELEASE_PROVIDED,
 * MVCC_ETOO_MANY_OPS, MVCC_EDUPLICATE_KEY, MVCC_EKEY_NOT_FOUND (ignore_value
 * or ignore_lease on a missing key; an empty op in a txn),
 * MVCC_ELEASE_NOT_FOUND, MVCC_ECOMPACTED / MVCC_EFUTURE_REV (a range at a
 * revision below the compaction or above the current one), -EINVAL (a
 * sort target out of range where the range sorts), -ENOMEM.
 */
int mvcc_apply(struct mvcc_store *s, const struct mvcc_op *op,
	       struct mvcc_result *out) MC_MUST_CHECK;
void mvcc_result_free(struct mvcc_result *r);

/*
 * Compact: discard the history below rev. Afterwards reads at revisions
 * >= rev give the same answers as before, and every change at revisions
 * >= rev is still in the revision log (watchers from rev lose nothing);
 * reads below rev fail with MVCC_ECOMPACTED. Of each key's versions below
 * rev only the newest is kept, and only when it is live and no version at
 * exactly rev replaces it. Cost: O(history discarded).
 * Errors: MVCC_ECOMPACTED (rev <= the last compaction),
 * MVCC_EFUTURE_REV (rev > current).
 */
int mvcc_compact(struct mvcc_store *s, int64_t rev) MC_MUST_CHECK;

/*
 * The same compaction, of which only the answers change at once (O(1)):
 * reads, watches and history below rev fail from now on, and the store
 * answers every request, HashKV included, as mvcc_compact leaves it. The
 * versions it drops are freed later by mvcc_compact_work, in steps, as
 * etcd frees a compaction's keys from its backend in batches. Until that
 * is done (mvcc_compact_pending) a snapshot cannot begin, and
 * mvcc_db_size_bytes and mvcc_stats still count the dropped versions.
 * Errors: as mvcc_compact.
 */
int mvcc_compact_lazy(struct mvcc_store *s, int64_t rev) MC_MUST_CHECK;
/* Whether versions a compaction dropped are still to be freed. */
bool mvcc_compact_pending(const struct mvcc_store *s);
/* Free what compactions dropped, walking at most max_entries revision-log
 * entries (a key's versions at a time): 1 when nothing is left, else 0.
 * A snapshot cursor open meanwhile goes stale (MVCC_ESNAPSHOT_STALE). */
int mvcc_compact_work(struct mvcc_store *s, size_t max_entries);

/*
 * A step toward compacting at to whose walk is bounded: the highest
 * revision in (the last compaction, to] below which the revision log
 * holds at most max_entries entries — at least the next revision that
 * has any, whose entries a compaction cannot split (a DeleteRange of many
 * keys is one revision). to itself when it is within the bound or not
 * past the last compaction.
 */
int64_t mvcc_compact_step(const struct mvcc_store *s, int64_t to, size_t max_entries);

/*
 * LeaseRevoke, as applied from the log: delete every key attached to the
 * lease (in key order, one new revision; none if no key is attached) and
 * drop the lease. *revision_out (may be NULL) gets the header revision.
 * Errors: MVCC_ELEASE_NOT_FOUND, -ENOMEM (nothing changed).
 */
int mvcc_lease_revoke(struct mvcc_store *s, int64_t id, int64_t *revision_out) MC_MUST_CHECK;

/* ------------------------------------------------------------- history */
/*
 * The revision log, for watch catch-up: positions are absolute and stay
 * valid across compaction (a compacted position fails with
 * MVCC_ECOMPACTED). Entries are in (main, sub) order.
 */

/* Position of the first change with main revision >= rev (the end when
 * there is none). Errors: MVCC_ECOMPACTED (rev < the compaction rev). */
int mvcc_hist_seek(const struct mvcc_store *s, int64_t rev, uint64_t *pos) MC_MUST_CHECK;
/* One past the last change. */
uint64_t mvcc_hist_end(const struct mvcc_store *s);
/*
 * The change at pos as a watch event, prev_kv filled from the key's
 * previous version when that is still stored and live. The bytes are
 * borrowed from the store: valid until the next mvcc_apply,
 * mvcc_lease_revoke, mvcc_compact or mvcc_free.
 * Errors: MVCC_ECOMPACTED (pos was compacted), -ENOENT (pos >= end),
 * MC_EINTERNAL (the log and a key's history disagree: a bug).
 */
int mvcc_hist_event(const struct mvcc_store *s, uint64_t pos,
		    struct mvcc_event *ev) MC_MUST_CHECK;

/* ------------------------------------------------------------- versions */

/* One stored version, as etcd's backend keeps it in its "key" bucket
 * under the revision (main, sub). A tombstone has only kv.key set (and
 * kv.mod_revision = main). next_main is the main revision of the key's
 * next stored version, INT64_MAX for its latest. */
struct mvcc_version {
	int64_t main;
	uint32_t sub;
	bool tombstone;
	int64_t next_main;
	struct mvcc_kv kv; /* borrowed from the store */
};

/*
 * Visit every stored version (the history since the last compaction and
 * what compaction kept below it) in (main, sub) order; a non-zero return
 * from fn stops the walk and is returned. The store must not change
 * meanwhile. Cost: O(v log v) for v versions, O(v) memory.
 * Errors: -ENOMEM, or what fn returned.
 */
int mvcc_versions(const struct mvcc_store *s,
		  int (*fn)(void *ctx, const struct mvcc_version *v), void *ctx) MC_MUST_CHECK;

/* ------------------------------------------------------------- snapshot */
/*
 * Format (little-endian), version 1:
 *   "MCMVCCSN" u32 version=1 u32 flags=0
 *   i64 current_rev, i64 compact_rev, i64 lease_next_id,
 *   u64 nleases, u64 nkeys
 *   nleases x { i64 id, i64 ttl_s, i64 remaining_ttl_s }      (id order)
 *   nkeys   x { u32 klen, key, u32 nver,                       (key order)
 *               nver x { i64 main, u32 sub, u8 tombstone, i64 create,
 *                        i64 version, i64 lease, u32 vlen, value } }
 *   u32 crc32c of every byte before it
 * The encoding of a state is canonical: equal states give equal bytes.
 * Lease-key attachments and the revision log are rebuilt on restore.
 */

/* Called with consecutive pieces of the snapshot; a non-zero return stops
 * the snapshot and is returned by mvcc_snapshot(). */
typedef int (*mvcc_write_fn)(void *ctx, const void *data, size_t len);

/* Stream the whole state to on_chunk in pieces of at most 64 KiB.
 * Errors: MVCC_ECOMPACT_PENDING (see mvcc_compact_lazy), -ENOMEM, or what
 * on_chunk returned. */
int mvcc_snapshot(const struct mvcc_store *s, mvcc_write_fn on_chunk, void *ctx) MC_MUST_CHECK;

/*
 * The same in steps, while the store takes writes: begin notes the
 * revision, writes the header and the leases as they are now; each step
 * encodes the following keys as they were at that revision until about
 * budget bytes went out. Writes meanwhile are fine (they only add versions
 * above the revision), and so is mvcc_compact_lazy; freeing versions is
 * not (mvcc_compact, mvcc_compact_work): the next step fails stale and the
 * snapshot must start again. The cursor borrows the store, which must
 * outlive it. begin errors: MVCC_ECOMPACT_PENDING, -ENOMEM, what on_chunk
 * returned. step returns 1 once the whole snapshot went out, 0 while more
 * is left; errors: MVCC_ESNAPSHOT_STALE, -ENOMEM, what on_chunk returned.
 */
struct mvcc_snap_cursor;
int mvcc_snap_begin(const struct mvcc_store *s, mvcc_write_fn on_chunk, void *ctx,
		    struct mvcc_snap_cursor **out) MC_MUST_CHECK;
int mvcc_snap_step(struct mvcc_snap_cursor *c, size_t budget) MC_MUST_CHECK;
void mvcc_snap_free(struct mvcc_snap_cursor *c);

/*
 * Build a new store from a snapshot (borrowed). Every length, count, order
 * and revision is checked; a bad snapshot never yields a store. The lease
 * table comes back as a follower's (no expiry until lease_promote()).
 * Errors: MVCC_ESNAPSHOT_CORRUPT (bad magic, CRC, length, order or
 * invariant), MVCC_ESNAPSHOT_VERSION, -ENOMEM.
 */
int mvcc_restore(const struct mvcc_options *opts, const void *data, size_t len,
		 struct mvcc_store **out) MC_MUST_CHECK;

#endif
