/*
 * mvcc_int: the MVCC store's insides, shared by its three files and
 * nothing else —
 *
 *   mvcc.c       the store: key nodes with their version arrays, the
 *                revision log, result arenas, compaction, the history
 *                cursor and the version walk
 *   mvcc_txn.c   requests: etcd's checks, compares, and the write
 *                transaction with its undo log
 *   mvcc_snap.c  the snapshot codec
 *
 * All three are pure (no I/O, no clock): the Makefile checks them.
 */
#ifndef MC_META_MVCC_INT_H
#define MC_META_MVCC_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/util.h"
#include "meta/avl.h"
#include "meta/mvcc.h"

/* One version of a key. A tombstone has create == 0 (and no value). */
struct mvcc__ver {
	int64_t main;
	int64_t create;
	int64_t version;
	int64_t lease;
	char *value; /* owned; NULL when vlen == 0 */
	uint32_t vlen;
	uint32_t sub;
};

/* A key with any stored history, in the store's tree. */
struct mvcc__key {
	struct avl_node node;
	struct mvcc__ver *hist; /* (main, sub) ascending */
	uint32_t nhist;
	uint32_t caphist;
	uint32_t klen;
	char key[];
};

/* Revision log entry. */
struct mvcc__rent {
	int64_t main;
	struct mvcc__key *key;
	uint32_t sub;
};

struct mvcc_store {
	struct avl_tree keys;
	/* Revision log: live entries rl[rl_head, rl_len); rl[rl_head] has
	 * the absolute position rl_base. */
	struct mvcc__rent *rl;
	size_t rl_head, rl_len, rl_cap;
	uint64_t rl_base;
	int64_t rev;
	int64_t compact_rev;
	/* What compaction dropped is freed in steps (mvcc_compact_work):
	 * done_rev is the compaction revision it has all been freed for
	 * (compact_rev: nothing pending); the versions at exactly done_rev
	 * are being checked from rl[eq_pos] on (when eq_rev is compact_rev). */
	int64_t done_rev, eq_rev;
	size_t eq_pos;
	uint64_t db_size;
	uint64_t nversions;
	uint64_t nlive;
	uint64_t key_bytes;   /* sum of klen over key nodes */
	uint64_t value_bytes; /* sum of vlen over versions */
	uint64_t hist_slots;  /* sum of caphist */
	size_t max_txn_ops;
	int64_t min_lease_ttl_s;
	struct lease_table *leases;
	uint64_t generation; /* frees by compaction: snapshot cursors go stale */
};

struct mvcc__bytes {
	const char *p;
	size_t n;
};

/* A key span as etcd reads key/range_end. */
struct mvcc__span {
	const char *key;
	size_t klen;
	const char *end;
	size_t elen;
	bool single;
	bool unbounded;
};

struct mvcc__scan {
	struct avl_iter it;
	struct mvcc__span sp;
	bool done;
};

/* A result's arena: blocks of bump-allocated memory freed together. */
struct mvcc__blk {
	struct mvcc__blk *next;
	size_t used, cap;
	max_align_t data[];
};

/* "": the value of a version that has none. */
extern const char mvcc__empty[1];

static inline struct mvcc__key *mvcc__key_of(struct avl_node *n)
{
	return n ? MC_CONTAINER_OF(n, struct mvcc__key, node) : NULL;
}

static inline uint64_t mvcc__ver_size(const struct mvcc__key *k, const struct mvcc__ver *v)
{
	return (uint64_t)k->klen + v->vlen + MVCC_VERSION_OVERHEAD_BYTES;
}

static inline bool mvcc__ver_live(const struct mvcc__ver *v)
{
	return v && v->create != 0;
}

static inline const struct mvcc__ver *mvcc__live_latest(const struct mvcc__key *k)
{
	return k && k->nhist && mvcc__ver_live(&k->hist[k->nhist - 1]) ? &k->hist[k->nhist - 1]
								       : NULL;
}

/* The key node of key, or NULL. */
struct mvcc__key *mvcc__find_key(const struct mvcc_store *s, const char *key, size_t len);
/* The live version of k at revision rev, or NULL. */
const struct mvcc__ver *mvcc__live_at(const struct mvcc__key *k, int64_t rev);
/* A key node with no history (NULL when out of memory); the caller links it. */
struct mvcc__key *mvcc__key_alloc(struct mvcc_store *s, const char *key, size_t klen);
/* Free an unlinked key node and its versions' values. */
void mvcc__key_free(struct mvcc_store *s, struct mvcc__key *k);

/* Iterate over the key nodes of a span, in key order. */
void mvcc__span_init(struct mvcc__span *sp, const char *key, size_t klen, const char *end,
		     size_t elen);
struct mvcc__key *mvcc__scan_first(struct mvcc__scan *sc, const struct mvcc_store *s,
				   const struct mvcc__span *sp);
struct mvcc__key *mvcc__scan_next(struct mvcc__scan *sc);

/* n bytes from arena *a (16-byte aligned), NULL when out of memory. */
void *mvcc__arena_alloc(struct mvcc__blk **a, size_t n);
/* The version as a result kv pointing into the store (valid until it changes). */
void mvcc__kv_borrow(struct mvcc_kv *out, const struct mvcc__key *k,
		     const struct mvcc__ver *v);
/* The same with key (and value if with_value) copied into arena *a.
 * Errors: -ENOMEM. */
int mvcc__kv_copy(struct mvcc__blk **a, struct mvcc_kv *out, const struct mvcc__key *k,
		  const struct mvcc__ver *v, bool with_value) MC_MUST_CHECK;

/* Room for need elements of elem bytes in *arr (capacity *cap), doubling.
 * Errors: -ENOMEM. */
int mvcc__grow(void **arr, size_t *cap, size_t need, size_t elem) MC_MUST_CHECK;
/* Room for extra more revision log entries. Errors: -ENOMEM. */
int mvcc__rl_reserve(struct mvcc_store *s, size_t extra) MC_MUST_CHECK;
/* Room for extra more versions of k. Errors: -ENOMEM. */
int mvcc__hist_reserve(struct mvcc_store *s, struct mvcc__key *k, size_t extra) MC_MUST_CHECK;

#endif
