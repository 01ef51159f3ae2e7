/*
 * snap: snapshot files of the meta role's state machine — opaque data
 * bytes plus Raft metadata (index, term, opaque conf state bytes), each
 * checksummed with CRC-32C.
 *
 * Writing (a local snapshot, or one arriving by InstallSnapshot) streams
 * into a temp file in the snapshot directory: snap_writer_open, any number
 * of snap_writer_write, then snap_writer_commit, which writes the header,
 * fsyncs, renames to <index>-<term>.snap, fsyncs the directory and deletes
 * all but the newest `keep` snapshots. A crash before the rename leaves
 * only a temp file, which snap_load_newest removes. After committing, the
 * driver saves the marker in the WAL (wal_save_snapshot) and may release
 * WAL segments up to the oldest snapshot it keeps.
 *
 * Reading streams a snapshot in chunks (to restore the state machine, or
 * to send InstallSnapshot): snap_reader_open checks the header and conf
 * state; snap_reader_read returns data and checks the data CRC when the
 * end is reached.
 *
 * At start-up snap_load_newest picks the newest valid snapshot that the
 * caller's accept() (normally wal_recovery_check_start) says the WAL can
 * continue from. A corrupt newer snapshot is skipped — logged and renamed
 * to *.broken — only when such an older one (or, with none, the WAL from
 * index 1) exists; otherwise it is an error.
 *
 * File format (little-endian): a 64-byte header
 *   0 magic "MCSNAP\0\1" | 8 u32 version 1 | 12 u32 header bytes 64 |
 *   16 u64 index | 24 u64 term | 32 u64 data bytes | 40 u32 conf bytes |
 *   44 u32 crc32c(conf) | 48 u32 crc32c(data) | 52..59 zero |
 *   60 u32 crc32c of bytes 0..59
 * then the conf state bytes, then the data; the file is exactly that long.
 *
 * Threads: writer and reader objects are thread-compatible (one caller at
 * a time each); distinct objects may be used from distinct threads, and
 * several readers may read one file. Everything blocks on disk I/O: call
 * it from a worker thread, never the event loop.
 */
#ifndef MC_META_SNAP_H
#define MC_META_SNAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

/* Conf state larger than this is refused (and is corruption on disk). */
#define SNAP_CONF_MAX_BYTES (16u << 20)

/* Metadata to write; borrowed by snap_writer_open (copied). */
struct snap_meta {
	uint64_t index;
	uint64_t term;
	const uint8_t *conf;
	size_t conf_len;
};

/* Metadata of a snapshot on disk. Caller storage; snap_info_close frees
 * conf and path. index 0 (path NULL) means "no snapshot". */
struct snap_info {
	uint64_t index;
	uint64_t term;
	uint64_t data_bytes;
	uint8_t *conf;
	size_t conf_len;
	char *path;
};

void snap_info_close(struct snap_info *info);

struct snap_writer;
struct snap_reader;

/*
 * Start a snapshot (index, term, conf) in dir (created if missing).
 * Errors: -EINVAL index 0 or conf too large; -ENOMEM; negative errno from
 * the file system.
 */
int snap_writer_open(const char *dir, const struct snap_meta *meta,
		     struct snap_writer **out) MC_MUST_CHECK;
/* Append data. Errors: negative errno of write (the writer then only
 * accepts abort); -ENOMEM. */
int snap_writer_write(struct snap_writer *wr, const void *data, size_t len) MC_MUST_CHECK;
/* Data bytes written so far (the offset the next chunk must have). */
uint64_t snap_writer_bytes(const struct snap_writer *wr);
/*
 * Pace the writer: after each step it pushes to disk it sleeps as long as
 * the step took, so the file keeps the disk at most about half busy and
 * the WAL's fdatasyncs (of this member, and of others sharing the disk)
 * do not queue behind it. For the member's own snapshots, which nothing
 * waits for; a snapshot installed from the leader is written at full
 * speed.
 */
void snap_writer_pace(struct snap_writer *wr);
/*
 * Make the snapshot durable and visible, then delete all but the newest
 * keep (at least 1) snapshots. Frees wr whatever the outcome; on error the
 * temp file is removed. Errors: negative errno of write/fsync/rename, or a
 * previous write error. A failure to delete old snapshots is only logged.
 */
int snap_writer_commit(struct snap_writer *wr, unsigned keep) MC_MUST_CHECK;
/* Drop an unfinished snapshot: remove the temp file, free wr. */
void snap_writer_abort(struct snap_writer *wr);

/*
 * Open a snapshot file for streaming; fills *info (may be NULL).
 * Errors: -EBADMSG bad header, conf CRC or file size (logged with the
 * path); -ENOMEM; negative errno from the file system.
 */
int snap_reader_open(const char *path, struct snap_reader **out,
		     struct snap_info *info) MC_MUST_CHECK;
/*
 * Read up to cap data bytes into buf; *n = bytes read, 0 at the end.
 * The data CRC is checked when the last byte has been read: a mismatch
 * returns -EBADMSG (logged) instead of the final 0. Errors: -EBADMSG;
 * -EIO the file shrank; negative errno of read.
 */
int snap_reader_read(struct snap_reader *r, void *buf, size_t cap, size_t *n) MC_MUST_CHECK;
void snap_reader_close(struct snap_reader *r);

/* Read a whole snapshot, checking every CRC; fills *info (may be NULL).
 * Errors: as snap_reader_open and snap_reader_read. */
int snap_verify(const char *path, struct snap_info *info) MC_MUST_CHECK;

/* Whether the WAL can start from a snapshot at (index, term): 0 = yes. */
typedef int (*snap_accept_fn)(void *ctx, uint64_t index, uint64_t term);

/*
 * Remove temp files, then choose the snapshot to start from (see the
 * opening comment) and fill *out (index 0 when starting without one).
 * Errors: -EBADMSG the newest snapshot is corrupt and nothing older
 * qualifies; -ENOENT the WAL cannot continue from the newest valid
 * snapshot (or, with none, from index 1); -ENOMEM; negative errno.
 */
int snap_load_newest(const char *dir, snap_accept_fn accept, void *ctx,
		     struct snap_info *out) MC_MUST_CHECK;

/* Index of the oldest snapshot file in dir (0 when none): the index the
 * WAL may be released to while keeping every snapshot usable. */
int snap_oldest_index(const char *dir, uint64_t *index) MC_MUST_CHECK;

/* Set aside all but the newest keep (at least 1) snapshot files: renamed
 * <name>.del, for snap_remove_purged to delete. Errors: negative errno of
 * opendir/rename. */
int snap_purge(const char *dir, unsigned keep) MC_MUST_CHECK;

/* Delete the snapshot files snap_purge set aside, a few megabytes at a
 * time with pauses between (mc_unlink_in_steps: deleting hundreds of
 * megabytes at once stalls every fsync on the disk meanwhile), then fsync
 * dir; *removed (if not NULL) counts them. Blocks for seconds: a worker's
 * job; safe beside any other call on dir. Errors (logged): those of
 * mc_unlink_suffixed but -ENOENT. */
int snap_remove_purged(const char *dir, unsigned *removed) MC_MUST_CHECK;

#endif
