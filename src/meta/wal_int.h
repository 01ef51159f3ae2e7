/*
 * wal_int: the WAL's in-memory decoder and log-rule checker (wal_format.c),
 * used by wal.c and exposed for the unit tests and the fuzz target
 * (test/fuzz/fuzz_wal.c). Nothing here does I/O: a segment is scanned
 * from a buffer, records are encoded into one. Not for use outside
 * src/meta/wal*.c and their tests.
 */
#ifndef MC_META_WAL_INT_H
#define MC_META_WAL_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "meta/wal.h"

#define WAL__SEG_HDR_BYTES 64u
#define WAL__REC_HDR_BYTES 24u
#define WAL__REC_MAGIC 0xA7u
#define WAL__ENTRY_HDR_BYTES 20u /* index, term, type */

enum wal__rec_type {
	WAL__REC_ENTRY = 1,
	WAL__REC_HARD_STATE = 2,
	WAL__REC_SNAPSHOT = 3,
};

struct wal__seg_hdr {
	uint64_t wal_id;
	uint64_t seq;
	uint64_t first_index;
	uint32_t prev_crc;
};

void wal__seg_hdr_encode(uint8_t out[WAL__SEG_HDR_BYTES], const struct wal__seg_hdr *h);
/* Errors: -EBADMSG with *why set. */
int wal__seg_hdr_decode(const uint8_t *buf, size_t len, struct wal__seg_hdr *h,
			const char **why) MC_MUST_CHECK;

/* The CRC seed of every record in segment seq of WAL wal_id. */
uint32_t wal__seed(uint64_t wal_id, uint64_t seq);
/* Bytes a record with this payload length occupies (header + padding). */
size_t wal__frame_bytes(size_t payload_len);
/*
 * Encode one record whose payload is p1[n1] followed by p2[n2] into out,
 * which has wal__frame_bytes(n1 + n2) bytes. group_off is the segment
 * offset of the first record of the write group this record belongs to.
 * Returns the record's CRC.
 */
uint32_t wal__encode_frame(uint8_t *out, uint32_t seed, unsigned type, const void *p1,
			   size_t n1, const void *p2, size_t n2, uint64_t group_off);

/* Owner of recovered entry data: a list of blocks freed together. */
struct wal__arena;
void wal__arena_free(struct wal__arena *a);

/*
 * The log rules (see wal.h) over the latest view: hard state, newest
 * marker, and the terms (and in recovery mode the entries) of the held
 * indexes [first, last]. Shared by the save path, which checks a batch
 * before buffering it, and recovery, which replays records through it.
 */
struct wal__view {
	struct wal_hard_state hs;
	struct wal_snap_ref snap;
	uint64_t first; /* index of slot 0 */
	uint64_t last;  /* last index; first - 1 when nothing is held */
	uint64_t *terms;
	struct wal_entry *ents; /* recovery mode only */
	size_t cap;
	bool keep_data; /* recovery: keep entries (data in arena) */
	bool compact;   /* save path: drop terms below the marker */
	struct wal__arena *arena;
};

/* first_index: the index the first entry may have (a segment's first
 * index: earlier ones were released). */
void wal__view_init(struct wal__view *v, uint64_t first_index, bool keep_data);
void wal__view_free(struct wal__view *v);
/* Check (no change) an entry batch / a marker / a hard state: NULL when it
 * follows the rules, else why not. */
const char *wal__view_check_entries(const struct wal__view *v, const struct wal_entry *ents,
				    size_t n);
const char *wal__view_check_snap(const struct wal__view *v, struct wal_snap_ref s);
const char *wal__view_check_hs(const struct wal__view *v, const struct wal_hard_state *hs);
/* Apply a checked entry / marker. Errors: -ENOMEM (view unchanged). */
int wal__view_apply_entry(struct wal__view *v, const struct wal_entry *e) MC_MUST_CHECK;
void wal__view_apply_snap(struct wal__view *v, struct wal_snap_ref s);
/* Indexes held (last + 1 - first). */
size_t wal__view_count(const struct wal__view *v);
/* Room for need indexes from first. Errors: -ENOMEM (view unchanged). */
int wal__view_reserve(struct wal__view *v, size_t need) MC_MUST_CHECK;
/* Save path: drop the terms below the marker. */
void wal__view_compact(struct wal__view *v);

/*
 * Scan one segment image. The caller has checked the header and sets
 * seed, last and last_crc (the previous segment's last CRC, carried through
 * a segment with no records). Records are replayed into v.
 *
 * Returns 0 with end = offset where valid data ends and torn = whether
 * non-zero bytes past end (a torn tail, only in the last segment) must be
 * cut; -EBADMSG with bad_off and why; -ENOMEM.
 */
struct wal__scan {
	/* in */
	uint32_t seed;
	bool last;
	/* in/out */
	uint32_t last_crc;
	/* out */
	size_t end;
	size_t nrec;
	bool torn;
	size_t bad_off;
	const char *why;
};
int wal__scan_segment(const uint8_t *buf, size_t len, struct wal__scan *s,
		      struct wal__view *v) MC_MUST_CHECK;

#endif
