/*
 * wal: the meta role's durable Raft log — a segmented write-ahead log of
 * entries, hard states and snapshot markers, with a CRC-32C per record and
 * group commit.
 *
 * The WAL knows nothing of the Raft core's types: an entry is {index, term,
 * type, opaque bytes}, the hard state is {term, vote, commit}, a snapshot
 * marker is {index, term}. It applies the Raft log rules to what it is
 * given, both when saving and when reading back, so that what recovery
 * returns is exactly the latest view the saves described:
 *
 *   - entries saved starting at index N replace every held entry >= N
 *     (log overwrite); a batch is contiguous, terms never decrease, and the
 *     first index is at most last+1 (no gaps) and above the newest marker;
 *   - a snapshot marker (i, t) records that a snapshot at i exists. If the
 *     log holds i with term t, or i is older than the entries held, entries
 *     are kept (they may still be needed to fall back to an older
 *     snapshot); if the log lacks i or holds it with another term, the
 *     snapshot replaces the whole log and the next entry must be i+1;
 *   - the hard state's term never decreases.
 * A save that would break them fails with -EINVAL before anything is
 * buffered; recovery treats a record that breaks them as corruption.
 *
 * Group commit: wal_save() encodes into a buffer (written to the segment,
 * without fsync, whenever it passes buffer_bytes); wal_sync() or a save
 * with sync=true does one write and one fdatasync for everything pending.
 * The Raft driver must not send messages that depend on a Ready (votes,
 * append acknowledgements) until the save of that Ready has been synced.
 *
 * Threads: a struct wal is thread-compatible — one caller at a time, from
 * any thread. It blocks on disk I/O and does no libuv, so the driver runs it
 * on a worker thread: the event loop never calls wal_save(sync=true),
 * wal_sync() or wal_release_to(). Metrics updates are atomic.
 *
 * Errors are tiered: -EINVAL / MC_ETOO_LARGE from a save leave the WAL
 * unchanged; any other error from a save, sync or release (write, fsync,
 * segment roll, out of memory mid-batch) makes the WAL fatal: it returns
 * that error from every later call and can only be closed. After a failed
 * fsync the page cache state is unknown, so the process must restart and
 * recover from disk.
 *
 * Start-up sequence for the driver:
 *
 *   struct wal *w; struct wal_recovery rec;
 *   rc = wal_open(dir, &opts, &w, &rec);            // reads everything
 *   rc = snap_load_newest(snapdir, accept, &rec, &info); // accept calls
 *                                 // wal_recovery_check_start(&rec, i, t)
 *   rc = wal_start_at(w, &rec, info.index, info.term);  // trims rec
 *   ... restore the state machine from the snapshot, hand rec.hs and
 *   rec.ents to the Raft core, wal_recovery_close(&rec) ...
 *
 * Files: see wal.c; record formats and the recovery scan: wal_format.c.
 */
#ifndef MC_META_WAL_H
#define MC_META_WAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

struct metrics_registry;

/* Largest record payload the WAL writes or reads back; a longer length on
 * disk is corruption. An entry's data may use up to this minus 20 bytes. */
#define WAL_RECORD_MAX_BYTES (64u << 20)
#define WAL_SEGMENT_DEFAULT_BYTES (64u << 20)
#define WAL_BUFFER_DEFAULT_BYTES (1u << 20)

struct wal_hard_state {
	uint64_t term;
	uint64_t vote;
	uint64_t commit;
};

/* A snapshot marker: a snapshot at index was taken (or installed). */
struct wal_snap_ref {
	uint64_t index;
	uint64_t term;
};

struct wal_entry {
	uint64_t index;
	uint64_t term;
	uint32_t type;       /* opaque to the WAL (the Raft entry type) */
	const uint8_t *data; /* len bytes; borrowed by wal_save, owned by the
				wal_recovery it came from */
	size_t len;
};

struct wal_options {
	/* Segment size: a segment is rolled once the next record would pass
	 * it (a record larger than a whole segment gets a segment of its
	 * own). 0 = WAL_SEGMENT_DEFAULT_BYTES; at least 64 KiB. */
	uint64_t segment_bytes;
	/* Pending bytes that trigger a write (not an fsync) while saving
	 * without sync. 0 = WAL_BUFFER_DEFAULT_BYTES. */
	size_t buffer_bytes;
	/* Don't fallocate segments to segment_bytes (they grow by append). */
	bool no_prealloc;
	/* Create the WAL when dir holds no segment; otherwise wal_open
	 * fails with -ENOENT (a Raft member must not silently restart with
	 * an empty log: it could vote twice in a term). */
	bool create;
	/* Registry for the mooncake_wal_* metrics; NULL = metrics_global(). */
	struct metrics_registry *metrics;
};

/* What recovery read back. Caller storage; wal_recovery_close() frees it.
 * It stays valid after wal_close(). */
struct wal_recovery {
	/* public */
	struct wal_hard_state hs; /* latest hard state (zero if none) */
	struct wal_snap_ref snap; /* newest snapshot marker (zero if none) */
	struct wal_entry *ents;   /* held entries in index order; after
				     wal_start_at() exactly those after the
				     chosen snapshot */
	size_t n_ents;
	bool tail_truncated; /* a torn tail was cut (and logged) */
	/* private */
	uint64_t first_index; /* index ents[0] has (or would have) */
	struct wal__arena *arena;
};

struct wal_stats {
	uint64_t fsyncs;        /* fdatasync/fsync calls on segment files */
	uint64_t writes;        /* write calls on segment files */
	uint64_t bytes_written; /* record bytes written */
	uint64_t segments;      /* segment files currently held */
	uint64_t last_seq;      /* sequence number of the open segment */
};

struct wal;

/* True when dir holds at least one WAL segment. */
bool wal_exists(const char *dir);

/*
 * Open (or, with opts->create, create) the WAL in dir, taking an exclusive
 * lock on dir/LOCK, and read it back into *rec. A torn tail of the last
 * segment (partial record, CRC mismatch or zeros in the final unsynced
 * write group) is truncated and logged once, naming file and offset.
 * opts may be NULL (defaults, no create). On success *out and *rec are the
 * caller's.
 *
 * Errors: -EBADMSG corruption (a bad record before the tail or in a
 * non-last segment, a missing or misplaced segment, a record breaking the
 * log rules) — logged with file and offset; -ENOENT no WAL and !create;
 * MC_ELOCKED another process holds the lock; -EINVAL bad options;
 * -ENOMEM; negative errno from the file system.
 */
int wal_open(const char *dir, const struct wal_options *opts, struct wal **out,
	     struct wal_recovery *rec) MC_MUST_CHECK;

/*
 * Whether recovery can start from a snapshot at (index, term): the WAL
 * holds every entry after it (or the snapshot is at least as new as the
 * newest marker, so it supersedes what the log lacks). index 0 = no
 * snapshot. Pure. Errors: -ENOENT entries after index were released or
 * replaced; -EBADMSG the log holds index with another term (and a newer
 * snapshot marker exists).
 */
int wal_recovery_check_start(const struct wal_recovery *rec, uint64_t index,
			     uint64_t term) MC_MUST_CHECK;

/*
 * Start from the snapshot (index, term) the driver restored: drops the
 * entries of rec up to index (all of them if the snapshot replaces the
 * log) and, when the snapshot is newer than the newest marker (a crash
 * between committing the snapshot file and saving its marker), saves and
 * syncs its marker. Errors: those of wal_recovery_check_start (nothing
 * changed), else fatal ones as wal_save.
 */
int wal_start_at(struct wal *w, struct wal_recovery *rec, uint64_t index,
		 uint64_t term) MC_MUST_CHECK;

/* Free what rec holds (the entries' data too). Safe on a zeroed rec. */
void wal_recovery_close(struct wal_recovery *rec);

/*
 * Save n entries (borrowed; may be 0) and then the hard state (borrowed;
 * NULL or unchanged = not written). With sync, everything pending is
 * written and fdatasynced before returning. Errors: -EINVAL the batch
 * breaks the log rules; MC_ETOO_LARGE an entry exceeds
 * WAL_RECORD_MAX_BYTES (both: nothing saved); fatal: negative errno of
 * write/fdatasync/segment creation, -ENOMEM, or the WAL's earlier fatal
 * error.
 */
int wal_save(struct wal *w, const struct wal_hard_state *hs, const struct wal_entry *ents,
	     size_t n, bool sync) MC_MUST_CHECK;

/* Save a snapshot marker (after the snapshot file is committed). Errors:
 * -EINVAL index older than the newest marker; fatal ones as wal_save. */
int wal_save_snapshot(struct wal *w, struct wal_snap_ref snap, bool sync) MC_MUST_CHECK;

/* Write and fdatasync everything pending (no-op if nothing is). Errors:
 * fatal ones as wal_save. */
int wal_sync(struct wal *w) MC_MUST_CHECK;

/*
 * Release the segments no longer needed once a snapshot at index exists:
 * those whose every live entry is <= index (never the open segment).
 * Syncs pending records first when there is any to release, then renames
 * them <name>.del, oldest first, so what is left is always a contiguous
 * run of segments; the files themselves go with wal_remove_released, off
 * this thread (deleting hundreds of megabytes at once stalls every
 * fdatasync on the disk for as long). Without a directory fsync a crash
 * may bring some back: recovery sets aside segments below a gap when the
 * newest marker shows they were released. Release to the oldest snapshot
 * you keep, not the newest, if recovery should be able to fall back to it.
 * Errors: -EINVAL index is newer than the newest saved marker; fatal ones
 * as wal_save; negative errno of a rename (not fatal: the WAL stays usable
 * and a later release retries).
 */
int wal_release_to(struct wal *w, uint64_t index) MC_MUST_CHECK;

/*
 * Delete the segments of the WAL in dir that releases set aside, a few
 * megabytes at a time with pauses between (mc_unlink_in_steps), then fsync
 * dir; *removed (if not NULL) counts them. Touches nothing else, so it
 * may run on any thread while the WAL is in use (it takes seconds for a
 * large release). Errors (logged): those of mc_unlink_suffixed; the files
 * left are tried again by the next call.
 */
int wal_remove_released(const char *dir, unsigned *removed) MC_MUST_CHECK;

/* Latest saved state (pending or synced). */
uint64_t wal_last_index(const struct wal *w);
struct wal_hard_state wal_hard_state(const struct wal *w);
struct wal_snap_ref wal_snapshot(const struct wal *w);
void wal_get_stats(const struct wal *w, struct wal_stats *out);

/* Sync what is pending (a failure is logged: call wal_sync() first to
 * act on it), close the files, release the lock and free w. NULL is a
 * no-op. */
void wal_close(struct wal *w);

#endif
