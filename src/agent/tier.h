/*
 * tier.h: the agent's SSD tier (tier.c) — its store (src/ssd) under
 * --ssd-path, opened when the agent starts and closed when it is freed,
 * polled from the loop; the SSD segment it is mounted as; reads, writes
 * and removals of its objects for the other parts. A service below the
 * operations, the master link, the moves between tiers and the other
 * agents' reads; it calls only the statistics. Bytes read or written with
 * it are in buffers aligned to SSD_ALIGN (agent__tier_buf).
 */
#ifndef MC_AGENT_TIER_H
#define MC_AGENT_TIER_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "common/err.h"
#include "common/extalloc.h"

struct agent;
struct ssd_stats;
struct ssd_store;
struct tier_op;

/* Puts of values up to this size are written from the client's memory
 * even on 4 KiB pages: a copy into the staging memory made the write
 * faster but cost as much as it saved (1 MiB, 4 clients, alternated:
 * 4.05-4.39 GB/s with it, 4.21-4.51 without, p99 2.1-2.6 ms against
 * 1.5-1.6); larger ones go through it (16 MiB: 4.29-4.60 GB/s against
 * 2.62-3.69). */
#define AGENT_STAGE_PUT_MIN (1ull << 20)
/* A put of one value this long or longer that goes through staging is
 * copied and written in parts of AGENT_STREAM_PART (a tier stream): the
 * write of each part starts once it is copied, while the next is, so the
 * copy no longer precedes the whole write. */
#define AGENT_STREAM_PUT_MIN (4ull << 20)
#define AGENT_STREAM_PART (2ull << 20)

/* A write that finds the tier full waits this long for room at most. */
#define AGENT_TIER_ROOM_WAIT_MS 2000u
#define AGENT_TIER_ROOM_POLL_MS 10u

struct agent_tier_opts {
	const char *path; /* NULL or "": no SSD tier */
	uint64_t bytes;
	double high_watermark, eviction_ratio; /* told to the master at mount */
	unsigned sync_interval_ms;
	bool verify_on_start;
	const char *io;         /* "auto" (or NULL), "io_uring" or "threads" */
	uint64_t staging_bytes; /* 0: values' memory is read and written directly */
};

/*
 * The tier's staging memory (--ssd-staging-size): anonymous memory on
 * transparent 2 MiB pages that reads go through when the value's own
 * memory is on 4 KiB pages, and demotions and puts (above
 * AGENT_STAGE_PUT_MIN, or that need a copy anyway). A virtual disk
 * (virtio-blk) is
 * handed one segment per physically contiguous run of a transfer's
 * memory, at most max_segments (254 on the test VM) a request: 1 MiB of
 * 4 KiB pages goes as two requests of 128 segments each, 1 MiB of a huge
 * page as one of one, and the host's cost is per segment. Measured with
 * fio on the test VM (1 MiB random reads, 4 in flight, alternated): 2.8-
 * 3.7 GB/s from 4 KiB pages against 6.8-8.2 from huge pages; writes 3.5-
 * 4.4 against 5.1-5.6. A copy of 1 MiB costs about 100 us of a core. The
 * allocator's lock is taken from the loop and the copy threads.
 */
struct agent_tier_stage {
	pthread_mutex_t mu;
	uint8_t *base; /* NULL: none (size 0, or no transparent huge pages) */
	uint64_t len;
	struct mc_extalloc alloc; /* granule SSD_ALIGN */
	uint32_t *lens;           /* per granule: blocks allocated there */
};

/* The tier, embedded in struct agent (touched only by tier.c). */
struct agent_tier {
	struct agent_tier_stage stage;
	struct ssd_store *store; /* NULL: no SSD tier */
	char name[160];          /* its segment's name: "<agent>/ssd" */
	uint64_t capacity;
	double high_watermark, eviction_ratio;
	uv_poll_t poll;
	bool polling;
	unsigned inflight; /* reads and writes not called back yet */
	/* Writes waiting for room (the master evicts past the tier's
	 * watermark; deleted space is reused once synced), in order. */
	struct tier_op *wait_head, *wait_tail;
	uv_timer_t wait_timer;
	bool timer_on;
	/* A read found an object's bytes bad: the store dropped it (the
	 * moves' part tells the master). */
	void (*on_lost)(struct agent *a, const uint8_t *key, size_t klen, uint64_t offset);
};

/*
 * Open the store (blocks: recovery reads its index, and with
 * verify_on_start every object) before the agent's loop serves anything.
 * Without a path the agent has no SSD tier and this does nothing.
 * Errors (logged with the figures by the store): MC_ELOCKED (another
 * process has the directory), MC_ECONFIG (size, not enough free space,
 * files of another kind), negative errno (-EACCES: the directory cannot
 * be written), -ENOMEM.
 */
int agent__tier_open(struct agent *a, const struct agent_tier_opts *o) MC_MUST_CHECK;
/* Watch the store's completions from the loop; name the segment (after
 * the agent's own name is known). */
void agent__tier_start(struct agent *a);
/* Stop watching (no operation may be in flight); returns how many handles
 * it closes (on_closed gets each with data pointing at the agent). */
unsigned agent__tier_close(struct agent *a, uv_close_cb on_closed);
/* Close the store (blocks until its last sync). */
void agent__tier_free(struct agent *a);
/* Free the staging memory: last, once no buffer of agent__tier_buf is
 * held (the operations, demotions and peers' reads are freed). */
void agent__tier_bufs_free(struct agent *a);

bool agent__tier_on(const struct agent *a);
const char *agent__tier_name(const struct agent *a);
uint64_t agent__tier_capacity(const struct agent *a);
uint64_t agent__tier_block(const struct agent *a);
void agent__tier_watermarks(const struct agent *a, double *high, double *ratio);
/* Reads and writes whose callback has not run. */
unsigned agent__tier_inflight(const struct agent *a);
void agent__tier_on_lost(struct agent *a, void (*fn)(struct agent *a, const uint8_t *key,
						     size_t klen, uint64_t offset));

/* A buffer aligned for the store of len bytes rounded up to its block,
 * from the staging memory when it has room, else from the heap; NULL on
 * failure. huge_only: staging memory or NULL, and NULL for a single block
 * (one piece of memory anywhere). Freed with agent__tier_buf_free. On the
 * loop (it counts). */
void *agent__tier_buf(struct agent *a, uint64_t len, bool huge_only);
/* Free a buffer of agent__tier_buf (or of malloc: a scratch buffer may
 * be either); NULL does nothing. Any thread. */
void agent__tier_buf_free(struct agent *a, void *p);
/* Bytes of staging memory (0: none). */
uint64_t agent__tier_staging_bytes(const struct agent *a);
/* len rounded up to the store's block: the room a read of len bytes
 * needs. */
uint64_t agent__tier_io_len(uint64_t len);

/* An object of the tier. */
struct agent_tier_obj {
	uint64_t offset, size, seq;
	uint32_t crc;
};
/* Errors: MC_EOBJECT_NOT_FOUND (also while it is being written), -EINVAL
 * (no tier, key). */
int agent__tier_lookup(const struct agent *a, const uint8_t *key, size_t klen,
		       struct agent_tier_obj *out) MC_MUST_CHECK;

typedef void (*agent_tier_cb)(void *ud, int err, const struct agent_tier_obj *o);

/*
 * Read the object key into buf (aligned, buf_len at least
 * agent__tier_io_len of its size): cb(ud, 0, object) once its bytes are
 * there and checked against its checksum, or cb(ud, err, NULL) —
 * MC_ECHECKSUM (the bytes on disk are not the object's: it is dropped,
 * logged, and on_lost told), the read's negative errno. Errors of the
 * call (no callback): MC_EOBJECT_NOT_FOUND, -ERANGE (buf_len too
 * small), -EINVAL (no tier, key, alignment), -ENOMEM.
 */
int agent__tier_read(struct agent *a, const uint8_t *key, size_t klen, void *buf,
		     uint64_t buf_len, agent_tier_cb cb, void *ud) MC_MUST_CHECK;
/* As agent__tier_read, and the value copied on to dst (dst_len bytes of
 * room) as its checksum is checked (ssd_get_copy): dst holds it when cb
 * has 0. For reads through staging memory into memory on 4 KiB pages.
 * Errors also -ERANGE (the value is longer than dst_len). */
int agent__tier_read_copy(struct agent *a, const uint8_t *key, size_t klen, void *buf,
			  uint64_t buf_len, void *dst, uint64_t dst_len, agent_tier_cb cb,
			  void *ud) MC_MUST_CHECK;
/*
 * Store size bytes of buf (aligned, agent__tier_io_len(size) long) under
 * key, crc their CRC-32C: cb(ud, 0, object — its offset) once written and
 * in the index (a crash loses nothing from then on), or cb(ud, err, NULL)
 * (MC_ECANCELLED: removed meanwhile; MC_ENO_SPACE: no room within
 * AGENT_TIER_ROOM_WAIT_MS — a full tier makes writes wait for the room
 * evictions free; MC_EOBJECT_ALREADY_EXISTS found when it was retried;
 * the write's errno). Errors of the call: MC_EOBJECT_ALREADY_EXISTS
 * (stored or being stored), -EINVAL, -EIO (the store failed before: it
 * serves reads only), -ENOMEM.
 */
int agent__tier_write(struct agent *a, const uint8_t *key, size_t klen, const void *buf,
		      uint64_t size, uint32_t crc, agent_tier_cb cb, void *ud) MC_MUST_CHECK;
/* As agent__tier_write, but the store computes the CRC-32C of the value
 * while it writes it (o->crc at the callback): the write starts without a
 * pass over the value first. */
int agent__tier_write_sum(struct agent *a, const uint8_t *key, size_t klen, const void *buf,
			  uint64_t size, agent_tier_cb cb, void *ud) MC_MUST_CHECK;
/*
 * A write whose bytes arrive while it runs (ssd_put_stream): as
 * agent__tier_write, but each part of buf fed with agent__tier_stream_feed
 * is written at once, so that a copy into buf overlaps its write. *out is
 * the stream until it is fed whole. A full tier is not waited for:
 * MC_ENO_SPACE (then agent__tier_write, which waits). The crc of the
 * value comes with the last feed.
 */
struct agent_tier_stream;
int agent__tier_write_stream(struct agent *a, const uint8_t *key, size_t klen, void *buf,
			     uint64_t size, agent_tier_cb cb, void *ud,
			     struct agent_tier_stream **out) MC_MUST_CHECK;
/* The first bytes of the stream's buf hold the value's (ssd_put_feed:
 * a multiple of 4 KiB, or size and more with the value's crc). Loop
 * thread. Errors: -EINVAL (a feed that breaks those rules). */
int agent__tier_stream_feed(struct agent *a, struct agent_tier_stream *st, uint64_t bytes,
			    uint32_t crc) MC_MUST_CHECK;
/* Delete the object key — only the one at offset unless offset is
 * UINT64_MAX. Returns true when one went. */
bool agent__tier_remove(struct agent *a, const uint8_t *key, size_t klen, uint64_t offset);
/* Call fn for every stored object, oldest first (fn must not change the
 * tier). */
void agent__tier_foreach(const struct agent *a,
			 void (*fn)(void *ud, const uint8_t *key, size_t klen,
				    const struct agent_tier_obj *o),
			 void *ud);
/* The tier's figures (ssd_stats; all 0 without a tier). */
void agent__tier_stats(const struct agent *a, struct ssd_stats *st);

#endif
