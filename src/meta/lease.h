/*
 * lease: the lease table of the meta state machine — etcd's lessor without
 * its goroutines and clock.
 *
 * A lease has an ID, a granted TTL (seconds), optionally a checkpointed
 * remaining TTL, and the set of keys attached to it. Grant, revoke (through
 * mvcc_lease_revoke, which deletes the keys in the same revision) and
 * checkpoint are applied from the Raft log on every member, so they are
 * deterministic. The member that proposes a grant without an ID chooses
 * one (etcd's generator, see req.c) and logs it with the grant; an ID of
 * 0 reaches the table only from entries logged before that, and picks the
 * lowest unused ID at or after a counter that is part of the snapshot.
 * Any other ID is taken as it is, negative ones included, as etcd's
 * lessor does.
 *
 * Expiry is the leader's business and uses the leader's clock, passed in
 * as now_ms (monotonic milliseconds) — the table never reads a clock:
 *  - a follower's leases never expire (expiry "forever");
 *  - lease_promote() on becoming leader gives every lease its full TTL (or
 *    its checkpointed remaining TTL) plus extend_ms (the election time)
 *    from now — nothing expires at once because the old leader vanished;
 *  - keep-alives (lease_renew) are leader-local and not logged;
 *  - lease_expired() lists the leases past their expiry, earliest first;
 *    the leader proposes their revokes through Raft and asks again after
 *    retry_ms if a revoke did not make it.
 * lease_demote() returns to follower mode. Checkpoints (etcd's
 * LeaseCheckpoint) are optional: the leader may log lease_checkpoint()
 * with remaining TTLs so that a new leader does not grant a full TTL again.
 *
 * Structures: AVL trees by ID and, on the leader, by (next check, ID); per
 * lease an AVL tree of its keys. All operations are O(log n), list and
 * promote O(n log n).
 */
#ifndef MC_META_LEASE_H
#define MC_META_LEASE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "meta/mvcc.h"

/* etcd's MaxLeaseTTL. */
#define LEASE_MAX_TTL_S 9000000000LL
/* TTL reported by lease_time_to_live() where no expiry is set (follower):
 * etcd's int64(time.Duration(math.MaxInt64).Seconds()). */
#define LEASE_TTL_FOREVER_S 9223372036LL

struct lease_table;

/* min_ttl_s: granted TTLs below it are raised to it (etcd's minLeaseTTL).
 * The table starts as a follower's. Errors: -ENOMEM. */
int lease_table_new(int64_t min_ttl_s, struct lease_table **out) MC_MUST_CHECK;
/* Frees every lease (the keys stay in the store: use this only with it). */
void lease_table_free(struct lease_table *t);

/*
 * LeaseGrant as applied from the log. id 0 picks one (old entries); a TTL below the
 * minimum is raised. On the leader the lease expires at now_ms + TTL.
 * *id_out and *ttl_out (either may be NULL) get the ID and TTL granted.
 * Errors: MVCC_ELEASE_TTL_TOO_LARGE (ttl_s > LEASE_MAX_TTL_S),
 * MVCC_ELEASE_EXISTS, -ENOMEM.
 */
int lease_grant(struct lease_table *t, int64_t id, int64_t ttl_s, uint64_t now_ms,
		int64_t *id_out, int64_t *ttl_out) MC_MUST_CHECK;

bool lease_exists(const struct lease_table *t, int64_t id);
size_t lease_count(const struct lease_table *t);

/*
 * LeaseKeepAlive on the leader: the lease now expires at now_ms + TTL.
 * *ttl_out gets the TTL; *clear_checkpoint (may be NULL) is set when the
 * lease has a checkpointed remaining TTL, which the leader should clear by
 * logging lease_checkpoint(id, 0), as etcd does.
 * Errors: MC_ENOT_LEADER (not promoted: forward to the leader),
 * MVCC_ELEASE_NOT_FOUND, MVCC_ELEASE_EXPIRED (expired, revoke pending).
 */
int lease_renew(struct lease_table *t, int64_t id, uint64_t now_ms, int64_t *ttl_out,
		bool *clear_checkpoint) MC_MUST_CHECK;

/* LeaseCheckpoint as applied from the log: remember the remaining TTL
 * (0 clears it). Unknown IDs are ignored, like etcd. */
void lease_checkpoint(struct lease_table *t, int64_t id, int64_t remaining_ttl_s);

struct lease_key_ref {
	const char *key;
	size_t len;
};

/* LeaseTimeToLive. Owned by the caller, free with lease_ttl_free(). */
struct lease_ttl {
	int64_t id;
	int64_t ttl_s; /* remaining, truncated like etcd; on a
	                          follower LEASE_TTL_FOREVER_S */
	int64_t granted_ttl_s;
	int64_t remaining_checkpoint_s; /* 0: none */
	size_t key_count;               /* keys attached, asked for or not */
	/* The keys themselves, in key order, only when asked for: with
	 * with_keys false, keys is NULL and nkeys 0, so the list and its
	 * length never disagree. */
	struct lease_key_ref *keys;
	size_t nkeys;
};
/* Errors: MVCC_ELEASE_NOT_FOUND, -ENOMEM. */
int lease_time_to_live(const struct lease_table *t, int64_t id, uint64_t now_ms,
		       bool with_keys, struct lease_ttl *out) MC_MUST_CHECK;
void lease_ttl_free(struct lease_ttl *ttl);

/* LeaseLeases: every ID in ascending order into a new array (free()).
 * Errors: -ENOMEM. */
int lease_list(const struct lease_table *t, int64_t **ids_out, size_t *n_out) MC_MUST_CHECK;

/*
 * Leader: up to max IDs of leases whose expiry is <= now_ms, earliest
 * expiry first (ties by ID). Each one returned is not returned again
 * before now_ms + retry_ms (its revoke is in flight). Returns the count;
 * 0 on a follower.
 */
size_t lease_expired(struct lease_table *t, uint64_t now_ms, uint64_t retry_ms, int64_t *ids,
		     size_t max);
/* When lease_expired() next has something to say (UINT64_MAX: never), for
 * the driver's timer. */
uint64_t lease_next_check_ms(const struct lease_table *t);

/* Become the lease primary: each lease expires at
 * now_ms + extend_ms + (checkpointed remaining TTL or full TTL). */
void lease_promote(struct lease_table *t, uint64_t now_ms, uint64_t extend_ms);
/* Back to follower: no lease expires. */
void lease_demote(struct lease_table *t);
bool lease_is_primary(const struct lease_table *t);

/* ------------------------------------------------------------- private */
/* For the MVCC store (attachments, revoke, snapshot). A lease__key is one key's
 * attachment record, allocated ahead so that linking it cannot fail. */
struct lease__key;
int lease__key_new(const char *key, size_t len, struct lease__key **out) MC_MUST_CHECK;
void lease__key_free(struct lease__key *k);
/* Link k to lease id (takes ownership on 0). Returns 0; 1 if the key was
 * already attached (k not taken); MVCC_ELEASE_NOT_FOUND (k not taken). */
int lease__attach(struct lease_table *t, int64_t id, struct lease__key *k);
/* Unlink and free the key's attachment to lease id, if any. */
void lease__detach(struct lease_table *t, int64_t id, const char *key, size_t len);
/* The keys attached to id, in key order: a new array (free()) of refs
 * borrowed from the table. Errors: MVCC_ELEASE_NOT_FOUND, -ENOMEM. */
int lease__keys(const struct lease_table *t, int64_t id, struct lease_key_ref **keys,
		size_t *n) MC_MUST_CHECK;
/* Drop lease id and its attachments. Errors: MVCC_ELEASE_NOT_FOUND. */
int lease__remove(struct lease_table *t, int64_t id);
/* Visit leases in ID order; a non-zero return from fn stops and is returned. */
int lease__foreach(const struct lease_table *t,
		   int (*fn)(void *ctx, int64_t id, int64_t ttl_s, int64_t remaining_ttl_s),
		   void *ctx);
int64_t lease__next_id(const struct lease_table *t);
void lease__set_next_id(struct lease_table *t, int64_t next_id);
/* Restore a lease as a follower has it (no range checks beyond the
 * table's). Errors: MVCC_ELEASE_EXISTS, -ENOMEM. */
int lease__restore(struct lease_table *t, int64_t id, int64_t ttl_s,
		   int64_t remaining_ttl_s) MC_MUST_CHECK;

#endif
