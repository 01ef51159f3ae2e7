/*
 * ssd: the agent's SSD tier storage engine — objects (key, value) kept in
 * one data file under a directory, with an extent allocator and an
 * append-only, checksummed index, so that a restart (or a kill -9, or a
 * power loss) recovers every object whose put had completed, and never
 * serves bytes that are not the object's.
 *
 * It is a subsystem of its own (below the agent, above common) because
 * it has its own interface, files, threads and tests, and the agent,
 * mooncakectl's benchmark and the unit tests use it alike; it knows
 * nothing of masters, segments or sessions.
 *
 * Files under dir (formats in rec.c and store.c):
 *   LOCK        flock: one store per directory (a second open fails with
 *               MC_ELOCKED);
 *   ssd.data    a 4 KiB header block, then size_bytes of extents,
 *               preallocated (fallocate) at creation; read and written with
 *               direct I/O (O_DIRECT) in SSD_ALIGN-aligned blocks;
 *   ssd.index   a header, then one record per put and per removal: key,
 *               size, CRC-32C of the value, extent, sequence, each record
 *               with its own CRC-32C. Rewritten (compacted) through
 *               ssd.index.new + rename when dead records outweigh live ones.
 *
 * Durability. A put completes (its callback runs with 0) once its bytes
 * are written (direct I/O: in the device, not the page cache) and its
 * index record is appended (group append: every put that finished writing
 * meanwhile goes in one write, one append at a time): from then on a crash
 * of the process (kill -9) loses nothing. Syncs (fdatasync of the data
 * file, then of the index) run on a thread of their own while appends are
 * not yet synced, at most one per sync_interval_ms (a device cache flush
 * stalls the device's other I/O); ssd_sync() tells when everything before
 * it is on stable storage (a power loss then loses nothing either). A
 * power loss can lose the puts of the last sync interval; an index record that
 * reached the disk before its object's bytes did is caught by the
 * checksum (below). A removal is appended like a put; its extent is reused
 * once it is appended and every read of it has ended, not after its sync
 * (waiting for syncs held puts to the device's synced rate). A kill -9
 * keeps the appended removal; a power loss that loses it leaves its
 * object's record beside the newer object that reused the extent: recovery
 * drops the older of two overlapping objects, and where the newer one's
 * record was lost too, the read's checksum catches the other object's
 * bytes. After a crash, recovery finds every completed put (a power loss:
 * every synced one) and removals appended before it (a power loss may undo
 * the removals of the last sync interval: the object comes back with its
 * own bytes, or fails its checksum and is dropped).
 *
 * Checks. Every read checks the value's CRC-32C before its callback sees
 * success; a mismatch fails it with MC_ECHECKSUM, drops the object (a log
 * line, and a removal record) and it is never served. Recovery reads the
 * index: a torn tail (a record cut by a crash) is cut off, a corrupt record
 * is skipped (both with a log line and counted), records whose extent lies
 * outside the data area or overlaps a newer object's are dropped; with
 * verify_on_open every object's bytes are also read and checked, and those
 * that fail are dropped (log line, counted). The index is then rewritten
 * when anything was dropped.
 *
 * Threads. Every function here is called from one thread, the owner's (the
 * agent's event loop): none of them blocks on the disk except ssd_open and
 * ssd_close. Data reads and writes run on an io_uring (liburing) with up to
 * queue_depth I/Os in flight, reaped by a thread of the store that also
 * checks the checksums of reads; where io_uring is unavailable (a kernel or
 * container that refuses it) a pool of queue_depth threads does the same
 * with pread/pwrite. Index appends and compaction run on one helper thread,
 * syncs on another. Finished operations wait in a queue until the owner calls
 * ssd_poll(), which runs their callbacks on the owner's thread; ssd_fd()
 * becomes readable whenever that queue is not empty (an event loop watches
 * it; uv_poll_t in the agent).
 *
 * Buffers given to ssd_put and ssd_get are aligned to SSD_ALIGN and at
 * least ssd_io_len(size) long (direct I/O moves whole blocks): ssd_buf_alloc
 * makes such buffers. They are borrowed until the callback.
 */
#ifndef MC_SSD_SSD_H
#define MC_SSD_SSD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

/* Alignment of buffers, lengths and extents for direct I/O. */
#define SSD_ALIGN 4096u
/* Longest key. */
#define SSD_MAX_KEY_BYTES 4096u
/* Largest value. */
#define SSD_MAX_VALUE_BYTES (1ull << 40)
/* The agent's default sync interval (ssd_opts.sync_interval_ms). */
#define SSD_SYNC_INTERVAL_DEFAULT_MS 5000u

struct ssd_store;
struct metrics_registry;

enum ssd_io_kind {
	SSD_IO_AUTO = 0, /* io_uring, else threads */
	SSD_IO_URING,    /* io_uring or fail (MC_ECONFIG) */
	SSD_IO_THREADS,  /* a thread pool with pread/pwrite */
};

struct ssd_opts {
	const char *dir;      /* created (mode 0750) when missing */
	uint64_t size_bytes;  /* data capacity, rounded down to SSD_ALIGN */
	unsigned queue_depth; /* data I/Os in flight, 1..1024 (0: 32) */
	enum ssd_io_kind io;
	bool verify_on_open; /* read and check every object at open */
	/* Refuse to grow the data file past the file system's free space
	 * (fallocate would fail anyway on most file systems; this names the
	 * figures). */
	bool check_free_space;
	/* Compact the index once it passes this many bytes and twice its
	 * live records (0: 4 MiB). */
	uint64_t compact_min_bytes;
	/* Least time between the starts of two syncs (0: back to back). What
	 * a power loss can lose; a kill -9 loses nothing either way. Puts
	 * and removed space's reuse never wait for a sync. */
	unsigned sync_interval_ms;
	/* Where to register the tier's metrics (mooncake_agent_ssd_*: size,
	 * use, objects, index bytes, data I/Os with their bytes and latency
	 * histogram, checksum failures, syncs, compactions, and what the last
	 * open recovered, dropped and took); NULL: none. Borrowed: it must
	 * outlive the store. */
	struct metrics_registry *metrics;
};

/* What ssd_open found and did. */
struct ssd_open_report {
	bool created;             /* a new store */
	bool direct_io;           /* O_DIRECT in use (else buffered, logged) */
	const char *io;           /* "io_uring" or "threads" */
	uint64_t objects, bytes;  /* recovered */
	uint64_t dropped_records; /* torn or corrupt index records */
	uint64_t torn_bytes;      /* cut from the index's end */
	uint64_t dropped_objects; /* failed checksum, out of range, overlap */
	uint64_t elapsed_ms;
};

/*
 * Open (or create) the store in o->dir, recover its index and start its
 * threads. Blocks: run it before the owner's loop starts or on a worker.
 * An existing store whose data area differs from size_bytes is grown or
 * shrunk to it (objects past a new end are dropped, logged). Nothing is
 * overwritten when it fails. Errors: MC_ELOCKED (another process has the
 * directory), MC_ECONFIG (size below 1 MiB, a file system without room
 * for the data file with check_free_space, io_uring asked for and
 * unavailable, files of another format or another store — each logged
 * with the figures), negative errno of the failing file operation (-EACCES
 * for an unwritable directory, -ENOSPC), -ENOMEM.
 */
int ssd_open(const struct ssd_opts *o, struct ssd_store **out,
	     struct ssd_open_report *rep) MC_MUST_CHECK;

/*
 * Wait for every operation in flight, run their callbacks, sync the index
 * and stop the threads; then free the store. Blocks. NULL is a no-op.
 */
void ssd_close(struct ssd_store *s);

/* Readable when finished operations wait for ssd_poll(). */
int ssd_fd(const struct ssd_store *s);
/* Run the callbacks of finished operations (also the store's own steps:
 * group commits, compaction). Returns how many operations finished. */
unsigned ssd_poll(struct ssd_store *s);
/* Block until ssd_fd() is readable or timeout_ms passes (-1: forever);
 * then the caller calls ssd_poll. For tools and tests, not loops. */
void ssd_wait(struct ssd_store *s, int timeout_ms);

/* ssd_io_len: size rounded up to SSD_ALIGN. */
static inline uint64_t ssd_io_len(uint64_t size)
{
	return (size + SSD_ALIGN - 1) & ~(uint64_t)(SSD_ALIGN - 1);
}

/* A zeroed buffer of len bytes aligned to SSD_ALIGN (mmap), or NULL. */
void *ssd_buf_alloc(size_t len);
void ssd_buf_free(void *p, size_t len);

struct ssd_req;
typedef void (*ssd_cb)(struct ssd_req *r);

/* An operation, in the caller's storage, untouched by the caller from the
 * call until its callback. */
struct ssd_req {
	/* public */
	void *data;         /* the caller's */
	int status;         /* set before the callback */
	uint64_t size, seq; /* the object's size and sequence */
	uint32_t crc;       /* the object's CRC-32C */
	/* private */
	struct ssd_req *next;
	struct ssd_store *s;
	struct ssd__ent *ent;
	ssd_cb cb;
	void *buf;
	void *stream; /* ssd_put_stream's */
	uint64_t t0_ns;
	int kind;
};

/*
 * Store size bytes of buf under key. buf (aligned, ssd_io_len(size) long,
 * the bytes past size written too, whatever they are) is borrowed until
 * cb; crc is the CRC-32C of its first size bytes, kept in the index and
 * checked by every read. The key is visible to lookups and gets once cb
 * has run with status 0 (written and appended: see Durability). Errors (no callback then): -EINVAL
 * (key of 0 or more than SSD_MAX_KEY_BYTES bytes, size 0 or above
 * SSD_MAX_VALUE_BYTES, unaligned buf), MC_EOBJECT_ALREADY_EXISTS (the key
 * is stored or being stored), MC_ENO_SPACE (no free extent that large),
 * -EIO (the store failed an index append or sync before: it serves reads
 * only), -ENOMEM. Callback status: 0, MC_ECANCELLED (removed meanwhile),
 * or the negative errno of the write or append that failed (the object is
 * then not stored).
 */
int ssd_put(struct ssd_store *s, struct ssd_req *r, const void *key, size_t klen,
	    const void *buf, uint64_t size, uint32_t crc, ssd_cb cb) MC_MUST_CHECK;

/*
 * As ssd_put, but the store computes the CRC-32C of buf's first size
 * bytes itself, on its I/O thread while the write is in flight (no pass
 * over the value before the write starts): r->crc holds it when cb runs
 * with 0. Errors as ssd_put.
 */
int ssd_put_sum(struct ssd_store *s, struct ssd_req *r, const void *key, size_t klen,
		const void *buf, uint64_t size, ssd_cb cb) MC_MUST_CHECK;

/* Most ssd_put_feed calls of one streamed put. */
#define SSD_STREAM_MAX_FEEDS 64u

/*
 * A put whose bytes arrive while it is written: as ssd_put, but nothing
 * is written until ssd_put_feed says that a first part of buf holds its
 * bytes, and each part fed is written at once, several in flight (a
 * caller copying a value into buf overlaps its copy with the writes). The
 * key is visible once cb has run with 0, as for ssd_put; a crash before
 * leaves nothing of it. Errors as ssd_put.
 */
int ssd_put_stream(struct ssd_store *s, struct ssd_req *r, const void *key, size_t klen,
		   void *buf, uint64_t size, ssd_cb cb) MC_MUST_CHECK;
/*
 * The first bytes of a streamed put's buf hold its value's (a multiple of
 * SSD_ALIGN, more than fed before; size or more: all of it, and crc is
 * the CRC-32C of its size bytes). On the owner's thread; the callback
 * never runs inside this call. Errors: -EINVAL (not a streamed put, bytes
 * not past what was fed or not aligned, more than SSD_STREAM_MAX_FEEDS
 * calls) — the put then still waits for the rest of its bytes.
 */
int ssd_put_feed(struct ssd_store *s, struct ssd_req *r, uint64_t bytes,
		 uint32_t crc) MC_MUST_CHECK;

/*
 * Read the object key into buf (aligned, buf_len >= ssd_io_len of its
 * size: ssd_lookup tells the size). r->size, r->crc and r->seq are set
 * at once. Errors: MC_EOBJECT_NOT_FOUND, -ERANGE (buf_len too small),
 * -EINVAL (key length, unaligned buf), -ENOMEM. Callback status: 0 (the
 * first size bytes of buf are the value, checked), MC_ECHECKSUM (the bytes
 * on disk are not the object's: it is dropped, logged), or the read's
 * negative errno.
 */
int ssd_get(struct ssd_store *s, struct ssd_req *r, const void *key, size_t klen, void *buf,
	    uint64_t buf_len, ssd_cb cb) MC_MUST_CHECK;
/*
 * As ssd_get, and the value (its first size bytes) copied on to dst, of
 * dst_len bytes, in the pass that checks it: read from memory once, on
 * the thread that checks (no hop to another for the copy). dst holds the
 * value when the callback's status is 0; any other status leaves its
 * first size bytes undefined. Errors as ssd_get, and -ERANGE when the
 * value is longer than dst_len.
 */
int ssd_get_copy(struct ssd_store *s, struct ssd_req *r, const void *key, size_t klen,
		 void *buf, uint64_t buf_len, void *dst, uint64_t dst_len,
		 ssd_cb cb) MC_MUST_CHECK;

/*
 * Remove key: it is gone for lookups and new gets at once; gets already
 * started finish with its bytes; a put of it still writing ends with
 * MC_ECANCELLED. Errors: MC_EOBJECT_NOT_FOUND, -EINVAL.
 */
int ssd_remove(struct ssd_store *s, const void *key, size_t klen) MC_MUST_CHECK;

/*
 * Call cb once every put completed and every removal made before this
 * call is on stable storage (both files synced). Errors: -EINVAL (no cb),
 * -EIO (the store failed before). Callback status: 0, or the sync's
 * negative errno.
 */
int ssd_sync(struct ssd_store *s, struct ssd_req *r, ssd_cb cb) MC_MUST_CHECK;

/* A stored object. */
struct ssd_obj {
	uint64_t offset; /* of its extent in the data area */
	uint64_t size, seq;
	uint32_t crc;
};

/* Errors: MC_EOBJECT_NOT_FOUND (also while its put is in flight). */
int ssd_lookup(const struct ssd_store *s, const void *key, size_t klen,
	       struct ssd_obj *out) MC_MUST_CHECK;
/* Call fn for every stored object, oldest first. fn must not change the
 * store. */
void ssd_foreach(const struct ssd_store *s,
		 void (*fn)(void *ud, const uint8_t *key, size_t klen,
			    const struct ssd_obj *o),
		 void *ud);

struct ssd_stats {
	uint64_t capacity_bytes; /* data area */
	uint64_t used_bytes;     /* extents allocated (also writing, or
				     freed and awaiting a sync) */
	uint64_t objects;        /* stored */
	uint64_t index_bytes;    /* the index file */
	uint64_t largest_free;   /* largest free extent */
	uint64_t reads, writes;  /* data I/Os finished */
	uint64_t read_bytes, write_bytes;
	uint64_t read_ns, write_ns; /* their time, submitted to finished (a
				     * read's with its checksum checked) */
	uint64_t checksum_failures;
	uint64_t commits; /* group appends to the index */
	uint64_t syncs;   /* fdatasync pairs */
	uint64_t compactions;
	unsigned inflight; /* data I/Os submitted, not finished */
};
void ssd_stats(const struct ssd_store *s, struct ssd_stats *st);

#endif
