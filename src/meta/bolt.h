/*
 * bolt: the meta state as etcd 3.4 keeps it in its backend — a bbolt
 * database file — for the Maintenance calls that hand the backend out or
 * checksum it: Snapshot (the file itself, which `etcdctl snapshot status`
 * opens with bbolt and `etcdctl snapshot restore` turns into a data
 * directory a real etcd starts from), Hash and HashKV.
 *
 * The buckets and their contents follow etcd's own:
 *   alarm            key: AlarmMember (protobuf), value: empty
 *   cluster          "clusterVersion" -> "3.4.0"
 *   key              revision (8 bytes main, '_', 8 bytes sub, big-endian;
 *                    a tombstone adds 't') -> mvccpb.KeyValue (protobuf,
 *                    a tombstone's holds the key only)
 *   lease            ID (8 bytes, big-endian) -> leasepb.Lease
 *   members          ID in hex -> the member as etcd's JSON
 *   members_removed  ID in hex -> "removed"
 *   meta             consistent_index (8 bytes, big-endian: the applied
 *                    Raft index), finishedCompactRev and
 *                    scheduledCompactRev (revision bytes) once compacted
 * etcd's auth buckets are left out: etcd creates them when it opens a
 * database without them. The key bucket holds exactly what etcd's would
 * after the same writes and compactions, so HashKV answers etcd's hash.
 *
 * The file: page size 4096; pages 0 and 1 the two meta pages, page 2 an
 * empty freelist, then each bucket's leaf pages (a value larger than a
 * page overflows into the pages after it) and branch pages, bottom-up,
 * and last the root bucket's leaf page listing the buckets. No inline
 * buckets, every page reachable, checksummed metas: bbolt's tx.Check()
 * finds nothing to say.
 *
 * Pure: no I/O, no clock; the same state gives the same bytes.
 */
#ifndef MC_META_BOLT_H
#define MC_META_BOLT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "meta/mvcc.h"

#define BOLT_PAGE_BYTES 4096

struct bolt_member {
	uint64_t id;
	const char *name;       /* "" until published */
	const char *peer_url;   /* "" if none */
	const char *client_url; /* "" until published */
	bool learner;
};

struct bolt_alarm {
	uint64_t member_id;
	int alarm; /* etcdserverpb.AlarmType */
};

/* What goes into the database (all borrowed). */
struct bolt_state {
	struct mvcc_store *store;
	const struct bolt_member *members;
	size_t n_members;
	const uint64_t *removed;
	size_t n_removed;
	const struct bolt_alarm *alarms;
	size_t n_alarms;
	uint64_t consistent_index;
};

/* The whole database file into a new buffer (*out, free()), *len bytes (a
 * multiple of BOLT_PAGE_BYTES). Errors: -ENOMEM, -EOVERFLOW (a page would
 * hold more than 65535 elements or be larger than bbolt accepts). */
int bolt_image(const struct bolt_state *st, uint8_t **out, size_t *len) MC_MUST_CHECK;

/* etcd's Maintenance.Hash: CRC-32C over every bucket name and every key and
 * value in it, meta's consistent_index left out (it differs between members
 * that hold the same data). Errors: -ENOMEM. */
int bolt_hash(const struct bolt_state *st, uint32_t *hash) MC_MUST_CHECK;

/*
 * etcd's Maintenance.HashKV (mvcc store.HashByRev): CRC-32C over "key" and
 * the key bucket's entries up to revision rev (0: the current one), those
 * at or below the compaction revision only if still visible at rev.
 * *current and *compact get the store's revision and compaction revision
 * (-1 when never compacted, as etcd's compactMainRev).
 * Errors: MVCC_ECOMPACTED (0 < rev <= compaction revision), MVCC_EFUTURE_REV
 * (rev above the current revision), -ENOMEM.
 */
int bolt_hash_kv(const struct mvcc_store *s, int64_t rev, uint32_t *hash, int64_t *current,
		 int64_t *compact) MC_MUST_CHECK;

#endif
