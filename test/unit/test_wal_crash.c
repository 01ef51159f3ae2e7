/*
 * test_wal_crash: crash simulation and corruption on disk.
 *
 *  - a torn last record: the file cut at every byte offset of it, or the
 *    rest zero-filled (preallocated or not), or garbage after it: recovery
 *    cuts the tail, logs file and offset once, and the WAL keeps working;
 *  - a byte flipped anywhere in a record that later synced data follows,
 *    in the last or an earlier segment, a segment header, a crazy length,
 *    an index gap, a missing, misplaced or foreign segment: -EBADMSG and a
 *    log line naming file and offset;
 *  - pages of the final unsynced write group lost out of order: cut, not
 *    an error; the same hole in a group followed by a later one: error.
 */
#include "common/util.h"
#include "meta/wal_int.h"
#include "unit/test_wal_util.h"

#define SEG1 "0000000000000001-0000000000000001.wal"

/* Where each record of a single-segment WAL built by build() starts. */
struct layout {
	char seg[PATH_MAX];
	uint64_t off[80]; /* off[k] = start of entry k+1; off[n] = end */
	size_t n;
};

static struct wal_options opts(bool prealloc)
{
	return (struct wal_options){
		.segment_bytes = 1 << 20, .no_prealloc = !prealloc, .create = true};
}

static struct wal *open_ok(const char *dir, bool prealloc, struct wal_recovery *rec)
{
	struct wal_options o = opts(prealloc);
	struct wal *w = NULL;
	int rc = wal_open(dir, &o, &w, rec);
	cr_assert_eq(rc, 0, "%s: wal_open: %s", dir, mc_strerror(rc));
	return w;
}

static int open_rc(const char *dir, bool prealloc)
{
	struct wal_options o = opts(prealloc);
	struct wal *w = NULL;
	struct wal_recovery rec;
	int rc = wal_open(dir, &o, &w, &rec);
	if (rc == 0) {
		wal_close(w);
		wal_recovery_close(&rec);
	}
	return rc;
}

/* n entries (1..n, term 1), each its own synced write group, or (with
 * one_group) all in a single group. */
static void build(const char *dir, size_t n, bool prealloc, bool one_group, struct layout *L)
{
	struct wal_recovery rec;
	struct wal *w = open_ok(dir, prealloc, &rec);
	wal_recovery_close(&rec);
	L->n = n;
	L->off[0] = WAL__SEG_HDR_BYTES;
	for (size_t k = 0; k < n; k++) {
		cr_assert_eq(tu_save(w, k + 1, 1, 1, NULL, !one_group), 0);
		L->off[k + 1] = L->off[k] +
				wal__frame_bytes(WAL__ENTRY_HDR_BYTES + tu_data_len(k + 1, 1));
	}
	wal_close(w);
	snprintf(L->seg, sizeof(L->seg), "%s/" SEG1, dir);
}

static unsigned subdir_n;

/* A fresh copy of src under parent (same log file). */
static void copy_of(const char *parent, const char *src, char *out, size_t len)
{
	snprintf(out, len, "%s/c%u", parent, subdir_n++);
	cr_assert_eq(mkdir(out, 0700), 0);
	tu_copy_dir(src, out);
}

static void patch(const char *path, uint64_t off, const void *data, size_t n)
{
	int fd = open(path, O_WRONLY);
	cr_assert_geq(fd, 0);
	cr_assert_eq(pwrite(fd, data, n, (off_t)off), (ssize_t)n);
	close(fd);
}

static void zero_range(const char *path, uint64_t off, size_t n)
{
	uint8_t *z = calloc(1, n ? n : 1);
	patch(path, off, z, n);
	free(z);
}

static void check_first_n(const struct wal_recovery *rec, size_t n)
{
	struct tu_model m;
	tu_model_init(&m);
	if (n)
		tu_model_append(&m, 1, n, 1);
	tu_check(rec, &m);
	free(m.terms);
}

/* Cut (or zero from) every offset inside the last record. */
static void torn_every_offset(bool prealloc, bool zero_fill)
{
	char *dir = tu_tmpdir();
	char base[PATH_MAX];
	snprintf(base, sizeof(base), "%s/base", dir);
	struct layout L;
	build(base, 6, prealloc, false, &L);
	uint64_t start = L.off[5], end = L.off[6];
	size_t orig_len;
	char *orig = tu_read_file(L.seg, &orig_len);
	char needle[PATH_MAX + 64];
	for (uint64_t cut = start; cut < end; cut++) {
		char d[1024], seg[PATH_MAX];
		copy_of(dir, base, d, sizeof(d));
		snprintf(seg, sizeof(seg), "%s/" SEG1, d);
		if (zero_fill)
			zero_range(seg, cut, (size_t)(end - cut));
		else
			cr_assert_eq(truncate(seg, (off_t)cut), 0);
		/* Zeroing trailing zero bytes (padding) changes nothing. */
		bool intact = zero_fill;
		for (uint64_t i = cut; intact && i < end; i++)
			intact = orig[i] == 0;
		tu_log_reset(dir);
		struct wal_recovery rec;
		struct wal *w = open_ok(d, prealloc, &rec);
		check_first_n(&rec, intact ? 6 : 5);
		/* A record whose kept bytes [start, cut) are all zero (none
		 * at cut == start; or its first bytes are zero, as a CRC
		 * that varies with the WAL's random id can be) reads as a
		 * clean end, not a torn one. */
		bool kept_zero = true;
		for (uint64_t i = start; kept_zero && i < cut; i++)
			kept_zero = orig[i] == 0;
		bool torn = !intact && !kept_zero;
		cr_assert_eq(rec.tail_truncated, torn, "cut %" PRIu64, cut);
		snprintf(needle, sizeof(needle), "%s: torn tail at offset %" PRIu64 " ", seg,
			 start);
		cr_assert_eq(tu_log_count(dir, needle), torn ? 1 : 0,
			     "cut %" PRIu64 ": log line for %s", cut, needle);
		cr_assert_eq(tu_log_count(dir, "torn tail"), torn ? 1 : 0);
		wal_recovery_close(&rec);
		/* The repaired WAL takes new records and reads them back. */
		if (!intact)
			cr_assert_eq(tu_save(w, 6, 2, 2, NULL, true), 0);
		wal_close(w);
		w = open_ok(d, prealloc, &rec);
		cr_assert_not(rec.tail_truncated);
		cr_assert_eq(rec.n_ents, intact ? 6 : 7);
		if (!intact)
			cr_assert_eq(rec.ents[6].term, 2);
		wal_close(w);
		wal_recovery_close(&rec);
		tu_rm_rf(d);
	}
	free(orig);
	tu_cleanup(dir);
}

Test(wal_crash, truncate_at_every_offset_of_last_record, .timeout = 120)
{
	torn_every_offset(false, false);
}

Test(wal_crash, zero_fill_from_every_offset_of_last_record, .timeout = 120)
{
	torn_every_offset(false, true);
}

Test(wal_crash, preallocated_zero_fill_from_every_offset, .timeout = 120)
{
	torn_every_offset(true, true);
}

Test(wal_crash, preallocated_truncated_mid_record, .timeout = 120)
{
	torn_every_offset(true, false);
}

/* Non-zero garbage in the preallocated space after the last record (a
 * partial write whose header never reached the disk): cut and cleared. */
Test(wal_crash, garbage_after_last_record)
{
	char *dir = tu_tmpdir();
	struct layout L;
	build(dir, 5, true, false, &L);
	uint8_t junk[300];
	for (size_t i = 0; i < sizeof(junk); i++)
		junk[i] = (uint8_t)(i * 37 + 11);
	patch(L.seg, L.off[5] + 16, junk, sizeof(junk));
	struct wal_recovery rec;
	struct wal *w = open_ok(dir, true, &rec);
	cr_assert(rec.tail_truncated);
	check_first_n(&rec, 5);
	cr_assert_eq(tu_log_count(dir, "torn tail at offset"), 1);
	wal_close(w);
	wal_recovery_close(&rec);
	/* The garbage is gone from the file. */
	size_t n;
	char *data = tu_read_file(L.seg, &n);
	cr_assert_eq(n, 1 << 20);
	for (size_t i = L.off[5]; i < n; i++)
		cr_assert_eq(data[i], 0, "byte %zu not cleared", i);
	free(data);
	w = open_ok(dir, true, &rec);
	cr_assert_not(rec.tail_truncated);
	wal_close(w);
	wal_recovery_close(&rec);
	tu_cleanup(dir);
}

/* A flipped byte anywhere in a record followed by later synced groups. */
Test(wal_crash, flipped_byte_in_middle_record, .timeout = 120)
{
	char *dir = tu_tmpdir();
	char base[PATH_MAX];
	snprintf(base, sizeof(base), "%s/base", dir);
	struct layout L;
	build(base, 6, false, false, &L);
	uint64_t start = L.off[2], end = L.off[3];
	for (uint64_t pos = start; pos < end; pos++) {
		char d[1024], seg[PATH_MAX], needle[PATH_MAX + 64];
		copy_of(dir, base, d, sizeof(d));
		snprintf(seg, sizeof(seg), "%s/" SEG1, d);
		size_t n;
		char *data = tu_read_file(seg, &n);
		uint8_t b = (uint8_t)(data[pos] ^ 0x5A);
		free(data);
		patch(seg, pos, &b, 1);
		tu_log_reset(dir);
		cr_assert_eq(open_rc(d, false), -EBADMSG, "flip at %" PRIu64, pos);
		snprintf(needle, sizeof(needle), "%s: corrupt at offset %" PRIu64 ": ", seg,
			 start);
		cr_assert_eq(tu_log_count(dir, needle), 1, "flip at %" PRIu64 ": no line '%s'",
			     pos, needle);
		cr_assert_eq(tu_log_count(dir, "torn tail"), 0);
		/* Nothing was modified: the error repeats. */
		cr_assert_eq(open_rc(d, false), -EBADMSG);
		tu_rm_rf(d);
	}
	tu_cleanup(dir);
}

Test(wal_crash, flipped_byte_in_segment_header)
{
	char *dir = tu_tmpdir();
	struct layout L;
	build(dir, 3, false, false, &L);
	uint8_t b = 0xEE;
	patch(L.seg, 30, &b, 1);
	cr_assert_eq(open_rc(dir, false), -EBADMSG);
	cr_assert_eq(tu_log_count(dir, SEG1 ": corrupt at offset 0: segment "
					    "header CRC mismatch"),
		     1);
	tu_cleanup(dir);
}

/* Pages of the last group written out of order: a hole inside the final
 * unsynced group is a torn tail; the same hole followed by a later
 * (synced-boundary) group is corruption. */
Test(wal_crash, hole_in_final_group_is_torn)
{
	char *dir = tu_tmpdir();
	struct layout L;
	build(dir, 10, true, true, &L); /* one group of 10 records */
	zero_range(L.seg, L.off[4], (size_t)(L.off[5] - L.off[4]));
	struct wal_recovery rec;
	struct wal *w = open_ok(dir, true, &rec);
	cr_assert(rec.tail_truncated);
	check_first_n(&rec, 4);
	char needle[64];
	snprintf(needle, sizeof(needle), "torn tail at offset %" PRIu64, L.off[4]);
	cr_assert_eq(tu_log_count(dir, needle), 1);
	wal_close(w);
	wal_recovery_close(&rec);
	tu_cleanup(dir);
}

Test(wal_crash, hole_before_later_group_is_corruption)
{
	char *dir = tu_tmpdir();
	struct layout L;
	build(dir, 10, true, false, &L); /* ten synced groups */
	zero_range(L.seg, L.off[4], (size_t)(L.off[5] - L.off[4]));
	cr_assert_eq(open_rc(dir, true), -EBADMSG);
	char needle[64];
	snprintf(needle, sizeof(needle), "corrupt at offset %" PRIu64, L.off[4]);
	cr_assert_eq(tu_log_count(dir, needle), 1);
	tu_cleanup(dir);
}

/* Append a crafted, CRC-valid record as a new write group. */
static void append_raw(const struct layout *L, uint64_t at, unsigned type, const void *p1,
		       size_t n1, const void *p2, size_t n2)
{
	size_t n;
	char *data = tu_read_file(L->seg, &n);
	struct wal__seg_hdr h;
	const char *why;
	cr_assert_eq(wal__seg_hdr_decode((uint8_t *)data, n, &h, &why), 0);
	free(data);
	size_t frame = wal__frame_bytes(n1 + n2);
	uint8_t *buf = malloc(frame);
	wal__encode_frame(buf, wal__seed(h.wal_id, h.seq), type, p1, n1, p2, n2, at);
	patch(L->seg, at, buf, frame);
	free(buf);
}

static void entry_hdr(uint8_t *h, uint64_t index, uint64_t term)
{
	memset(h, 0, WAL__ENTRY_HDR_BYTES);
	for (int i = 0; i < 8; i++) {
		h[i] = (uint8_t)(index >> (8 * i));
		h[8 + i] = (uint8_t)(term >> (8 * i));
	}
}

Test(wal_crash, index_gap_on_disk)
{
	char *dir = tu_tmpdir();
	struct layout L;
	build(dir, 5, false, false, &L);
	uint8_t h[WAL__ENTRY_HDR_BYTES];
	entry_hdr(h, 8, 1); /* after 5 */
	append_raw(&L, L.off[5], WAL__REC_ENTRY, h, sizeof(h), "x", 1);
	cr_assert_eq(open_rc(dir, false), -EBADMSG);
	char needle[128];
	snprintf(needle, sizeof(needle), "corrupt at offset %" PRIu64 ": gap in entry indexes",
		 L.off[5]);
	cr_assert_eq(tu_log_count(dir, needle), 1);
	tu_cleanup(dir);
}

Test(wal_crash, valid_crc_bad_format_is_corruption)
{
	char *dir = tu_tmpdir();
	struct layout L;
	build(dir, 3, false, false, &L);
	uint8_t p[23] = {1};
	append_raw(&L, L.off[3], WAL__REC_HARD_STATE, p, sizeof(p), NULL, 0);
	cr_assert_eq(open_rc(dir, false), -EBADMSG);
	cr_assert_eq(tu_log_count(dir, "hard state record of the wrong size"), 1);
	tu_cleanup(dir);
}

Test(wal_crash, term_going_backwards_on_disk)
{
	char *dir = tu_tmpdir();
	struct layout L;
	build(dir, 3, false, false, &L);
	uint8_t hs[24] = {0};
	hs[0] = 9;
	append_raw(&L, L.off[3], WAL__REC_HARD_STATE, hs, 24, NULL, 0);
	uint64_t next = L.off[3] + wal__frame_bytes(24);
	hs[0] = 8;
	append_raw(&L, next, WAL__REC_HARD_STATE, hs, 24, NULL, 0);
	cr_assert_eq(open_rc(dir, false), -EBADMSG);
	cr_assert_eq(tu_log_count(dir, "hard state term decreased"), 1);
	tu_cleanup(dir);
}

static void set_len(const struct layout *L, uint64_t rec_off, uint32_t len)
{
	uint8_t b[8];
	uint32_t inv = ~len;
	for (int i = 0; i < 4; i++) {
		b[i] = (uint8_t)(len >> (8 * i));
		b[4 + i] = (uint8_t)(inv >> (8 * i));
	}
	patch(L->seg, rec_off + 4, b, 8);
}

/* Lengths from disk are checked before use: a crazy one in the middle is
 * corruption (no 4 GiB allocation, no read past the buffer), at the very
 * end a torn tail. */
Test(wal_crash, crazy_record_lengths)
{
	uint32_t lens[] = {0x7FFFFFF0u, 0xFFFFFFFFu, 60u << 20, 4000};
	for (size_t i = 0; i < MC_ARRAY_LEN(lens); i++) {
		char *dir = tu_tmpdir();
		struct layout L;
		build(dir, 5, false, false, &L);
		set_len(&L, L.off[2], lens[i]);
		cr_assert_eq(open_rc(dir, false), -EBADMSG, "len %u", lens[i]);
		char needle[64];
		snprintf(needle, sizeof(needle), "corrupt at offset %" PRIu64, L.off[2]);
		cr_assert_eq(tu_log_count(dir, needle), 1);
		/* The same in the last record is a torn tail. */
		set_len(&L, L.off[2], (uint32_t)(L.off[3] - L.off[2] - WAL__REC_HDR_BYTES));
		tu_cleanup(dir);
		dir = tu_tmpdir();
		build(dir, 5, false, false, &L);
		set_len(&L, L.off[4], lens[i]);
		struct wal_recovery rec;
		struct wal *w = open_ok(dir, false, &rec);
		cr_assert(rec.tail_truncated);
		check_first_n(&rec, 4);
		wal_close(w);
		wal_recovery_close(&rec);
		tu_cleanup(dir);
	}
}

/* A record from another WAL (other CRC seed) fails its CRC. */
Test(wal_crash, record_from_another_wal_rejected)
{
	char *dir = tu_tmpdir();
	struct layout L;
	build(dir, 3, false, false, &L);
	uint8_t h[WAL__ENTRY_HDR_BYTES];
	entry_hdr(h, 4, 1);
	size_t frame = wal__frame_bytes(sizeof(h));
	uint8_t *buf = malloc(frame);
	wal__encode_frame(buf, wal__seed(12345, 1), WAL__REC_ENTRY, h, sizeof(h), NULL, 0,
			  L.off[3]);
	patch(L.seg, L.off[3], buf, frame);
	free(buf);
	struct wal_recovery rec;
	struct wal *w = open_ok(dir, false, &rec);
	cr_assert(rec.tail_truncated); /* last record: torn */
	check_first_n(&rec, 3);
	wal_close(w);
	wal_recovery_close(&rec);
	tu_cleanup(dir);
}

/* ------------------------------------------------------------ segments */

/* A WAL of several segments; returns the sorted names. */
static char **build_segments(const char *dir, size_t *n)
{
	struct wal_options o = {.segment_bytes = 64 << 10, .create = true};
	struct wal *w;
	struct wal_recovery rec;
	cr_assert_eq(wal_open(dir, &o, &w, &rec), 0);
	struct wal_hard_state hs = {.term = 1};
	for (uint64_t i = 1; i <= 2000; i += 50) {
		hs.commit = i;
		cr_assert_eq(tu_save(w, i, 50, 1, &hs, true), 0);
	}
	wal_close(w);
	wal_recovery_close(&rec);
	char **names = tu_segments(dir, n);
	cr_assert_geq(*n, 4);
	return names;
}

static int open_seg_rc(const char *dir)
{
	struct wal_options o = {.segment_bytes = 64 << 10};
	struct wal *w;
	struct wal_recovery rec;
	int rc = wal_open(dir, &o, &w, &rec);
	if (rc == 0) {
		wal_close(w);
		wal_recovery_close(&rec);
	}
	return rc;
}

Test(wal_crash, flipped_byte_in_non_last_segment)
{
	char *dir = tu_tmpdir();
	size_t n;
	char **names = build_segments(dir, &n);
	char path[PATH_MAX];
	snprintf(path, sizeof(path), "%s/%s", dir, names[1]);
	size_t len;
	char *data = tu_read_file(path, &len);
	/* The last record of the segment: no later group in this file. */
	size_t end = len;
	while (end > 0 && data[end - 1] == 0)
		end--;
	uint8_t b = (uint8_t)(data[end - 3] ^ 1);
	free(data);
	patch(path, end - 3, &b, 1);
	cr_assert_eq(open_seg_rc(dir), -EBADMSG);
	char needle[PATH_MAX + 32];
	snprintf(needle, sizeof(needle), "%s: corrupt at offset", path);
	cr_assert_eq(tu_log_count(dir, needle), 1);
	cr_assert_eq(tu_log_count(dir, "torn tail"), 0);
	tu_free_names(names, n);
	tu_cleanup(dir);
}

Test(wal_crash, non_last_segment_lost_its_tail)
{
	char *dir = tu_tmpdir();
	size_t n;
	char **names = build_segments(dir, &n);
	char path[PATH_MAX];
	snprintf(path, sizeof(path), "%s/%s", dir, names[1]);
	size_t len;
	char *data = tu_read_file(path, &len);
	size_t end = len;
	while (end > 0 && data[end - 1] == 0)
		end--;
	free(data);
	/* Cut inside the last record: the segment itself looks torn, and is
	 * not the last one. */
	cr_assert_eq(truncate(path, (off_t)(end - 5)), 0);
	cr_assert_eq(open_seg_rc(dir), -EBADMSG);
	tu_free_names(names, n);
	tu_cleanup(dir);
}

Test(wal_crash, missing_middle_segment)
{
	char *dir = tu_tmpdir();
	size_t n;
	char **names = build_segments(dir, &n);
	char path[PATH_MAX];
	snprintf(path, sizeof(path), "%s/%s", dir, names[2]);
	cr_assert_eq(unlink(path), 0);
	cr_assert_eq(open_seg_rc(dir), -EBADMSG);
	cr_assert_eq(tu_log_count(dir, "segment 0000000000000003 is missing"), 1);
	tu_free_names(names, n);
	tu_cleanup(dir);
}

Test(wal_crash, misplaced_segment_renamed)
{
	char *dir = tu_tmpdir();
	size_t n;
	char **names = build_segments(dir, &n);
	/* Swap the contents of segments 2 and 3 (names stay). */
	char a[PATH_MAX], b[PATH_MAX], t[PATH_MAX];
	snprintf(a, sizeof(a), "%s/%s", dir, names[1]);
	snprintf(b, sizeof(b), "%s/%s", dir, names[2]);
	snprintf(t, sizeof(t), "%s/swap", dir);
	cr_assert_eq(rename(a, t), 0);
	cr_assert_eq(rename(b, a), 0);
	cr_assert_eq(rename(t, b), 0);
	cr_assert_eq(open_seg_rc(dir), -EBADMSG);
	cr_assert_eq(tu_log_count(dir, "does not match the file name"), 1);
	tu_free_names(names, n);
	tu_cleanup(dir);
}

Test(wal_crash, segment_from_another_wal)
{
	char *dir = tu_tmpdir();
	char other[1024];
	snprintf(other, sizeof(other), "%s/other", dir);
	char mine[1024];
	snprintf(mine, sizeof(mine), "%s/mine", dir);
	size_t n, n2;
	char **names = build_segments(mine, &n);
	char **names2 = build_segments(other, &n2);
	cr_assert_str_eq(names[1], names2[1]); /* same history, other WAL */
	char a[PATH_MAX], b[PATH_MAX];
	snprintf(a, sizeof(a), "%s/%s", other, names[1]);
	snprintf(b, sizeof(b), "%s/%s", mine, names[1]);
	cr_assert_eq(rename(a, b), 0);
	cr_assert_eq(open_seg_rc(mine), -EBADMSG);
	cr_assert_eq(tu_log_count(dir, "belongs to another WAL"), 1);
	tu_free_names(names, n);
	tu_free_names(names2, n2);
	tu_cleanup(dir);
}

/* An older copy of a middle segment (restored from a backup, missing its
 * last records) breaks the CRC chain. */
Test(wal_crash, stale_copy_of_middle_segment)
{
	char *dir = tu_tmpdir();
	struct wal_options o = {.segment_bytes = 64 << 10, .create = true};
	struct wal *w;
	struct wal_recovery rec;
	cr_assert_eq(wal_open(dir, &o, &w, &rec), 0);
	for (uint64_t i = 1; i <= 300; i += 50)
		cr_assert_eq(tu_save(w, i, 50, 1, NULL, true), 0);
	size_t n;
	char **names = tu_segments(dir, &n);
	char path[PATH_MAX];
	snprintf(path, sizeof(path), "%s/%s", dir, names[n - 1]);
	size_t len;
	char *snapshot_of_seg = tu_read_file(path, &len);
	char stale_name[PATH_MAX];
	snprintf(stale_name, sizeof(stale_name), "%s", path);
	tu_free_names(names, n);
	for (uint64_t i = 301; i <= 2000; i += 50)
		cr_assert_eq(tu_save(w, i, 50, 1, NULL, true), 0);
	wal_close(w);
	wal_recovery_close(&rec);
	names = tu_segments(dir, &n);
	cr_assert_gt(n, 2);
	/* Put the stale copy back (it is now a middle segment). */
	tu_write_file(stale_name, snapshot_of_seg, len);
	free(snapshot_of_seg);
	cr_assert_eq(open_seg_rc(dir), -EBADMSG);
	cr_assert_eq(tu_log_count(dir, "CRC chain broken"), 1);
	tu_free_names(names, n);
	tu_cleanup(dir);
}
