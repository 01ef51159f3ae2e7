/*
 * wal_format: the WAL's formats and rules without files — encoding and
 * checking segment headers and records, the log rules a batch or a
 * recovered record must follow (wal_int.h's view), and the scan of one
 * segment image that tells a clean end, a torn tail and corruption apart.
 * Pure: no I/O and no clock (the Makefile checks it), so the unit tests
 * and the fuzz target (test/fuzz/fuzz_wal.c) run it on buffers.
 *
 * Segment header (64 bytes, little-endian):
 *   0 magic "MCWALSEG" | 8 u32 version 1 | 12 u32 header bytes 64 |
 *   16 u64 wal id (random, per WAL) | 24 u64 seq | 32 u64 first index |
 *   40 u32 CRC of the previous segment's last record (the chain) |
 *   44..59 zero | 60 u32 crc32c of bytes 0..59
 * A new segment starts with copies of the current hard state and newest
 * marker, so deleting older segments loses neither.
 *
 * Record (8-byte aligned, 24-byte header, little-endian):
 *   0 u32 crc32c, seeded with crc32c(wal id, seq), over bytes 4.. of the
 *     header, the payload and the padding |
 *   4 u32 payload length | 8 u32 ~length | 12 u8 type | 13 u8 0xA7 |
 *   14 u16 zero | 16 u64 group offset | payload | zero padding to 8
 *   types: 1 entry {u64 index, u64 term, u32 type, data}
 *          2 hard state {u64 term, u64 vote, u64 commit}
 *          3 snapshot marker {u64 index, u64 term}
 * The seed ties a record to its WAL and segment (a record copied from
 * elsewhere fails its CRC). The group offset is where the write group the
 * record belongs to starts: a group is everything written between two
 * fdatasyncs, so a record whose group offset is past some point proves
 * that everything before it had been synced.
 *
 * Recovery reads the segments in seq order: headers must match their file
 * names, the WAL id and the chain; records are replayed through the log
 * rules (wal_int.h). Scanning a segment stops at the first record that is
 * incomplete, has a bad header or a bad CRC, at offset X. Then:
 *   - bytes from X to the end all zero: clean end;
 *   - else any valid record after X (found by scanning every 8-byte
 *     boundary) whose group started after X: corruption — X was synced;
 *   - else, in a non-last segment: corruption (it was synced before the
 *     next one was made);
 *   - else: torn tail of the final, possibly unsynced, write group: cut at
 *     X, logged once with file and offset.
 * So a crash mid-write (a partial record, zeroed preallocated space, or
 * pages written out of order within the last group) is repaired, while a
 * bad record followed by data of a later group stops the node. A record
 * that passes its CRC but breaks the format or the log rules is
 * corruption, as are a missing or misplaced segment. Damage confined to
 * the final write group cannot be told from a torn write and is cut.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/crc32c.h"
#include "common/endian.h"
#include "common/util.h"
#include "meta/wal_int.h"

#define WAL_SEG_MAGIC "MCWALSEG"
#define WAL_VERSION 1u
#define WAL_ARENA_BLOCK (1u << 20)
/* Indexes above this are refused (keeps index + 1 and counts exact). */
#define WAL_INDEX_MAX (UINT64_MAX >> 2)

/* ------------------------------------------------------------ helpers */

static bool all_zero(const uint8_t *p, size_t n)
{
	while (n > 0 && ((uintptr_t)p & 7) != 0) {
		if (*p++)
			return false;
		n--;
	}
	while (n >= 8) {
		uint64_t v;
		memcpy(&v, p, 8);
		if (v)
			return false;
		p += 8;
		n -= 8;
	}
	while (n > 0) {
		if (*p++)
			return false;
		n--;
	}
	return true;
}

/* ------------------------------------------------------------ formats */

void wal__seg_hdr_encode(uint8_t out[WAL__SEG_HDR_BYTES], const struct wal__seg_hdr *h)
{
	memset(out, 0, WAL__SEG_HDR_BYTES);
	memcpy(out, WAL_SEG_MAGIC, 8);
	mc_put_le32(out + 8, WAL_VERSION);
	mc_put_le32(out + 12, WAL__SEG_HDR_BYTES);
	mc_put_le64(out + 16, h->wal_id);
	mc_put_le64(out + 24, h->seq);
	mc_put_le64(out + 32, h->first_index);
	mc_put_le32(out + 40, h->prev_crc);
	mc_put_le32(out + 60, crc32c(0, out, 60));
}

int wal__seg_hdr_decode(const uint8_t *buf, size_t len, struct wal__seg_hdr *h,
			const char **why)
{
	if (len < WAL__SEG_HDR_BYTES) {
		*why = "file shorter than a segment header";
		return -EBADMSG;
	}
	if (memcmp(buf, WAL_SEG_MAGIC, 8) != 0) {
		*why = "not a WAL segment (bad magic)";
		return -EBADMSG;
	}
	if (mc_get_le32(buf + 60) != crc32c(0, buf, 60)) {
		*why = "segment header CRC mismatch";
		return -EBADMSG;
	}
	if (mc_get_le32(buf + 8) != WAL_VERSION ||
	    mc_get_le32(buf + 12) != WAL__SEG_HDR_BYTES) {
		*why = "unsupported segment version";
		return -EBADMSG;
	}
	h->wal_id = mc_get_le64(buf + 16);
	h->seq = mc_get_le64(buf + 24);
	h->first_index = mc_get_le64(buf + 32);
	h->prev_crc = mc_get_le32(buf + 40);
	if (h->seq == 0 || h->first_index == 0 || h->first_index > WAL_INDEX_MAX) {
		*why = "segment header with seq or first index out of range";
		return -EBADMSG;
	}
	return 0;
}

uint32_t wal__seed(uint64_t wal_id, uint64_t seq)
{
	uint8_t b[16];
	mc_put_le64(b, wal_id);
	mc_put_le64(b + 8, seq);
	return crc32c(0, b, sizeof(b));
}

size_t wal__frame_bytes(size_t payload_len)
{
	return WAL__REC_HDR_BYTES + ((payload_len + 7) & ~(size_t)7);
}

uint32_t wal__encode_frame(uint8_t *out, uint32_t seed, unsigned type, const void *p1,
			   size_t n1, const void *p2, size_t n2, uint64_t group_off)
{
	size_t len = n1 + n2;
	size_t frame = wal__frame_bytes(len);
	mc_put_le32(out + 4, (uint32_t)len);
	mc_put_le32(out + 8, ~(uint32_t)len);
	out[12] = (uint8_t)type;
	out[13] = WAL__REC_MAGIC;
	out[14] = 0;
	out[15] = 0;
	mc_put_le64(out + 16, group_off);
	if (n1)
		memcpy(out + WAL__REC_HDR_BYTES, p1, n1);
	if (n2)
		memcpy(out + WAL__REC_HDR_BYTES + n1, p2, n2);
	memset(out + WAL__REC_HDR_BYTES + len, 0, frame - WAL__REC_HDR_BYTES - len);
	uint32_t crc = crc32c(seed, out + 4, frame - 4);
	mc_put_le32(out, crc);
	return crc;
}

/* A plausible record header at p with room for its frame in n bytes. */
static bool frame_header_ok(const uint8_t *p, size_t n, size_t *frame)
{
	if (n < WAL__REC_HDR_BYTES)
		return false;
	uint32_t len = mc_get_le32(p + 4);
	if ((len ^ mc_get_le32(p + 8)) != 0xFFFFFFFFu || p[13] != WAL__REC_MAGIC ||
	    p[14] != 0 || p[15] != 0 || p[12] < WAL__REC_ENTRY || p[12] > WAL__REC_SNAPSHOT ||
	    len > WAL_RECORD_MAX_BYTES)
		return false;
	*frame = wal__frame_bytes(len);
	return *frame <= n;
}

static bool frame_crc_ok(const uint8_t *p, size_t frame, uint32_t seed)
{
	return mc_get_le32(p) == crc32c(seed, p + 4, frame - 4);
}

/* ------------------------------------------------------------ arena */

struct wal__arena {
	struct wal__arena *next;
	size_t used;
	size_t cap;
	uint8_t data[];
};

void wal__arena_free(struct wal__arena *a)
{
	while (a) {
		struct wal__arena *next = a->next;
		free(a);
		a = next;
	}
}

static uint8_t *arena_copy(struct wal__arena **head, const uint8_t *src, size_t len)
{
	struct wal__arena *a = *head;
	if (!a || a->cap - a->used < len) {
		size_t cap = len > WAL_ARENA_BLOCK ? len : WAL_ARENA_BLOCK;
		a = malloc(sizeof(*a) + cap);
		if (!a)
			return NULL;
		a->next = *head;
		a->used = 0;
		a->cap = cap;
		*head = a;
	}
	uint8_t *p = a->data + a->used;
	memcpy(p, src, len);
	a->used += len;
	return p;
}

/* ------------------------------------------------------------ log rules */

void wal__view_init(struct wal__view *v, uint64_t first_index, bool keep_data)
{
	memset(v, 0, sizeof(*v));
	v->first = first_index ? first_index : 1;
	v->last = v->first - 1;
	v->keep_data = keep_data;
}

void wal__view_free(struct wal__view *v)
{
	free(v->terms);
	free(v->ents);
	wal__arena_free(v->arena);
	memset(v, 0, sizeof(*v));
}

static bool view_holds(const struct wal__view *v, uint64_t index)
{
	return index >= v->first && index <= v->last;
}

static uint64_t view_term(const struct wal__view *v, uint64_t index)
{
	return v->terms[index - v->first];
}

size_t wal__view_count(const struct wal__view *v)
{
	return (size_t)(v->last + 1 - v->first);
}

int wal__view_reserve(struct wal__view *v, size_t need)
{
	if (need <= v->cap)
		return 0;
	size_t cap = v->cap ? v->cap : 64;
	while (cap < need)
		cap *= 2;
	uint64_t *t = realloc(v->terms, cap * sizeof(*t));
	if (!t)
		return -ENOMEM;
	v->terms = t;
	if (v->keep_data) {
		struct wal_entry *e = realloc(v->ents, cap * sizeof(*e));
		if (!e)
			return -ENOMEM;
		v->ents = e;
	}
	v->cap = cap;
	return 0;
}

const char *wal__view_check_entries(const struct wal__view *v, const struct wal_entry *ents,
				    size_t n)
{
	if (n == 0)
		return NULL;
	uint64_t x = ents[0].index;
	if (x == 0 || x > WAL_INDEX_MAX || n > WAL_INDEX_MAX - x)
		return "entry index out of range";
	if (x <= v->snap.index)
		return "entry at or below the newest snapshot marker";
	if (x > v->last + 1)
		return "gap in entry indexes";
	uint64_t prev_term = 0;
	if (view_holds(v, x - 1))
		prev_term = view_term(v, x - 1);
	else if (x - 1 == v->snap.index)
		prev_term = v->snap.term;
	for (size_t k = 0; k < n; k++) {
		if (ents[k].index != x + k)
			return "entries of a batch not contiguous";
		if (ents[k].term < prev_term)
			return "entry term lower than its predecessor's";
		prev_term = ents[k].term;
	}
	return NULL;
}

const char *wal__view_check_snap(const struct wal__view *v, struct wal_snap_ref s)
{
	if (s.index == 0 || s.index > WAL_INDEX_MAX)
		return "snapshot marker index out of range";
	if (s.index < v->snap.index)
		return "snapshot marker older than the newest one";
	if (s.index == v->snap.index && s.term != v->snap.term)
		return "snapshot marker repeats an index with another term";
	return NULL;
}

const char *wal__view_check_hs(const struct wal__view *v, const struct wal_hard_state *hs)
{
	if (hs->term < v->hs.term)
		return "hard state term decreased";
	return NULL;
}

int wal__view_apply_entry(struct wal__view *v, const struct wal_entry *e)
{
	size_t slot = e->index < v->first ? 0 : (size_t)(e->index - v->first);
	int rc = wal__view_reserve(v, slot + 1);
	if (rc)
		return rc;
	const uint8_t *data = NULL;
	if (v->keep_data && e->len > 0) {
		data = arena_copy(&v->arena, e->data, e->len);
		if (!data)
			return -ENOMEM;
	}
	if (e->index < v->first)
		v->first = e->index;
	v->terms[slot] = e->term;
	if (v->keep_data)
		v->ents[slot] = (struct wal_entry){e->index, e->term, e->type, data, e->len};
	v->last = e->index;
	return 0;
}

/* Save path: drop terms below the marker (never needed again). */
void wal__view_compact(struct wal__view *v)
{
	if (!v->compact || v->snap.index <= v->first || v->snap.index > v->last)
		return;
	size_t drop = (size_t)(v->snap.index - v->first);
	memmove(v->terms, v->terms + drop, (wal__view_count(v) - drop) * sizeof(*v->terms));
	v->first = v->snap.index;
}

void wal__view_apply_snap(struct wal__view *v, struct wal_snap_ref s)
{
	bool replace = s.index > v->last ||
		       (view_holds(v, s.index) && view_term(v, s.index) != s.term);
	if (replace) {
		/* The snapshot replaces the log: nothing before it holds. */
		v->first = s.index + 1;
		v->last = s.index;
	}
	v->snap = s;
	wal__view_compact(v);
}

/* ------------------------------------------------------------ scanning */

/* Decode and replay one CRC-valid record. Returns 0, -EBADMSG (why set)
 * or -ENOMEM. */
static int replay_record(unsigned type, const uint8_t *p, size_t len, struct wal__view *v,
			 const char **why)
{
	const char *bad;
	switch (type) {
	case WAL__REC_ENTRY: {
		if (len < WAL__ENTRY_HDR_BYTES) {
			*why = "entry record too short";
			return -EBADMSG;
		}
		struct wal_entry e = {
			.index = mc_get_le64(p),
			.term = mc_get_le64(p + 8),
			.type = mc_get_le32(p + 16),
			.data = p + WAL__ENTRY_HDR_BYTES,
			.len = len - WAL__ENTRY_HDR_BYTES,
		};
		if ((bad = wal__view_check_entries(v, &e, 1))) {
			*why = bad;
			return -EBADMSG;
		}
		return wal__view_apply_entry(v, &e);
	}
	case WAL__REC_HARD_STATE: {
		if (len != 24) {
			*why = "hard state record of the wrong size";
			return -EBADMSG;
		}
		struct wal_hard_state hs = {mc_get_le64(p), mc_get_le64(p + 8),
					    mc_get_le64(p + 16)};
		if ((bad = wal__view_check_hs(v, &hs))) {
			*why = bad;
			return -EBADMSG;
		}
		v->hs = hs;
		return 0;
	}
	case WAL__REC_SNAPSHOT: {
		if (len != 16) {
			*why = "snapshot marker record of the wrong size";
			return -EBADMSG;
		}
		struct wal_snap_ref s = {mc_get_le64(p), mc_get_le64(p + 8)};
		if ((bad = wal__view_check_snap(v, s))) {
			*why = bad;
			return -EBADMSG;
		}
		wal__view_apply_snap(v, s);
		return 0;
	}
	}
	*why = "unknown record type";
	return -EBADMSG;
}

/*
 * Scanning stopped at x (reason stop_why). Decide: clean end, torn tail,
 * or corruption. See the opening comment.
 */
static int scan_decide(const uint8_t *buf, size_t len, size_t x, uint64_t group_off,
		       const char *stop_why, struct wal__scan *s)
{
	s->end = x;
	if (all_zero(buf + x, len - x))
		return 0;
	for (size_t p = x + 8; p + WAL__REC_HDR_BYTES <= len; p += 8) {
		size_t frame;
		if (!frame_header_ok(buf + p, len - p, &frame) ||
		    !frame_crc_ok(buf + p, frame, s->seed))
			continue;
		uint64_t g = mc_get_le64(buf + p + 16);
		if (g > x || g < group_off) {
			s->bad_off = x;
			s->why = stop_why;
			return -EBADMSG;
		}
		p += frame - 8;
	}
	if (!s->last) {
		s->bad_off = x;
		s->why = stop_why;
		return -EBADMSG;
	}
	s->torn = true;
	s->why = stop_why;
	return 0;
}

int wal__scan_segment(const uint8_t *buf, size_t len, struct wal__scan *s, struct wal__view *v)
{
	size_t off = WAL__SEG_HDR_BYTES;
	uint64_t group_off = WAL__SEG_HDR_BYTES;
	s->end = off;
	s->nrec = 0;
	s->torn = false;
	s->bad_off = 0;
	s->why = NULL;
	if (len < off) {
		s->why = "file shorter than a segment header";
		return -EBADMSG;
	}
	while (off < len) {
		size_t frame;
		const uint8_t *p = buf + off;
		if (len - off < WAL__REC_HDR_BYTES)
			return scan_decide(buf, len, off, group_off, "partial record header",
					   s);
		if (!frame_header_ok(p, len - off, &frame)) {
			uint32_t n = mc_get_le32(p + 4);
			const char *why = (n ^ mc_get_le32(p + 8)) == 0xFFFFFFFFu &&
							  n <= WAL_RECORD_MAX_BYTES &&
							  p[13] == WAL__REC_MAGIC
						  ? "record runs past the end of the file"
						  : "invalid record header";
			return scan_decide(buf, len, off, group_off, why, s);
		}
		if (!frame_crc_ok(p, frame, s->seed))
			return scan_decide(buf, len, off, group_off, "record CRC mismatch", s);
		/* A valid record: from here on, damage is corruption. */
		uint64_t g = mc_get_le64(p + 16);
		if (g > off || g < group_off || g < WAL__SEG_HDR_BYTES) {
			s->bad_off = off;
			s->why = "record with an impossible write-group offset";
			return -EBADMSG;
		}
		group_off = g;
		int rc = replay_record(p[12], p + WAL__REC_HDR_BYTES, mc_get_le32(p + 4), v,
				       &s->why);
		if (rc) {
			s->bad_off = off;
			return rc;
		}
		s->last_crc = mc_get_le32(p);
		s->nrec++;
		off += frame;
		s->end = off;
	}
	return 0;
}
