/*
 * wal: segmented write-ahead log for the Raft log. See wal.h for the API
 * and the log rules; this file holds the segment files, recovery from them
 * and group commit. The record and segment formats, the log rules and the
 * scan that tells a torn tail from corruption are in wal_format.c, which
 * does no I/O.
 *
 * Files. dir/LOCK (flock) and segments named <seq>-<first index>.wal, both
 * 16 lower-case hex digits: seq counts from 1 without gaps; first index is
 * last index + 1 when the segment was started (with overwrites a segment
 * may also hold lower indexes). A segment is created as <name>.tmp,
 * fsynced, renamed and the directory fsynced, so a segment that exists has
 * a complete header. It is preallocated (fallocate) to segment_bytes unless
 * no_prealloc, so fdatasync seldom has metadata to write; unwritten space
 * reads as zeros. A release renames the segments it drops <name>.del;
 * wal_remove_released deletes those later, off the thread that saves.
 *
 * Recovery lists the segments, reads each one whole and has
 * wal__scan_segment judge it (wal_format.c): a torn tail of the last
 * segment is cut off the file and logged once with file and offset;
 * corruption stops the open with the file and offset.
 */
#include "meta/wal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/endian.h"
#include "common/io.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/util.h"
#include "meta/wal_int.h"

#define LOG_SUBSYS LOGS_WAL

#define WAL_SEGMENT_MIN_BYTES (64u << 10)
#define WAL_SEGMENT_MAX_BYTES (1ull << 30)
/* A segment file larger than this is not read (corruption). */
#define WAL_SEGMENT_READ_MAX (WAL_SEGMENT_MAX_BYTES + 2ull * WAL_RECORD_MAX_BYTES)
#define WAL_NAME_LEN 37 /* 16 + 1 + 16 + 4 */
/* A released segment is renamed <name>.del and deleted later, a step of
 * this many bytes at a time, this long apart (mc_unlink_in_steps): at
 * most 80 MB/s of blocks freed. */
#define WAL_RELEASED_SUFFIX ".del"
#define WAL_REMOVE_STEP_BYTES (4ull << 20)
#define WAL_REMOVE_PAUSE_MS 50u

/* ------------------------------------------------------------ the WAL */

struct wal_seg {
	uint64_t seq;
	uint64_t first_index;
};

struct wal {
	char *dir;
	int lock_fd;
	uint64_t segment_bytes;
	size_t buffer_bytes;
	bool prealloc;
	uint64_t wal_id;

	struct wal_seg *segs; /* every segment held, oldest first */
	size_t nsegs;
	size_t segcap;

	/* The open (last) segment. */
	int fd;
	uint32_t seed;
	uint64_t seg_off;   /* bytes of it written to the file */
	size_t seg_body;    /* records appended to it (not head copies) */
	uint64_t group_off; /* where the current write group starts */
	uint32_t last_crc;  /* CRC of the last record encoded */
	bool dirty;         /* written since the last fdatasync */
	struct mc_buf pend; /* encoded, not yet written */

	struct wal__view view; /* save path: latest view, terms only */
	int fatal;

	struct wal_stats stats;
	struct metric *m_fsync_seconds;
	struct metric *m_fsyncs;
	struct metric *m_bytes;
};

static void seg_name(char *buf, size_t len, uint64_t seq, uint64_t first)
{
	snprintf(buf, len, "%016" PRIx64 "-%016" PRIx64 ".wal", seq, first);
}

static int seg_path(const struct wal *w, char *buf, size_t len, uint64_t seq, uint64_t first,
		    const char *suffix)
{
	char name[64];
	seg_name(name, sizeof(name), seq, first);
	int n = snprintf(buf, len, "%s/%s%s", w->dir, name, suffix);
	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

static bool parse_hex16(const char *s, uint64_t *out)
{
	uint64_t v = 0;
	for (int i = 0; i < 16; i++) {
		char c = s[i];
		unsigned d;
		if (c >= '0' && c <= '9')
			d = (unsigned)(c - '0');
		else if (c >= 'a' && c <= 'f')
			d = (unsigned)(c - 'a' + 10);
		else
			return false;
		v = v << 4 | d;
	}
	*out = v;
	return true;
}

static bool parse_seg_name(const char *name, uint64_t *seq, uint64_t *first)
{
	return strlen(name) == WAL_NAME_LEN && name[16] == '-' &&
	       strcmp(name + 33, ".wal") == 0 && parse_hex16(name, seq) &&
	       parse_hex16(name + 17, first);
}

static int seg_cmp(const void *a, const void *b)
{
	const struct wal_seg *x = a, *y = b;
	return x->seq < y->seq ? -1 : x->seq > y->seq;
}

static int segs_reserve(struct wal *w)
{
	if (w->nsegs < w->segcap)
		return 0;
	size_t cap = w->segcap ? w->segcap * 2 : 16;
	struct wal_seg *s = realloc(w->segs, cap * sizeof(*s));
	if (!s)
		return -ENOMEM;
	w->segs = s;
	w->segcap = cap;
	return 0;
}

static int segs_push(struct wal *w, uint64_t seq, uint64_t first)
{
	int rc = segs_reserve(w);
	if (rc)
		return rc;
	w->segs[w->nsegs++] = (struct wal_seg){seq, first};
	return 0;
}

/* Rename a released segment to <name>.del for wal_remove_released
 * to delete (logged on failure). */
static int set_aside_seg(const struct wal *w, uint64_t seq, uint64_t first)
{
	char path[PATH_MAX], del[PATH_MAX];
	int rc;
	if ((rc = seg_path(w, path, sizeof(path), seq, first, "")) ||
	    (rc = seg_path(w, del, sizeof(del), seq, first, WAL_RELEASED_SUFFIX)))
		return rc;
	if (rename(path, del) != 0) {
		rc = -errno;
		log_error("%s: cannot set aside released segment: %s", path, mc_strerror(rc));
	}
	return rc;
}

/* Open the WAL directory for a walk (logged on failure). */
static int wal_opendir(const struct wal *w, DIR **out)
{
	*out = opendir(w->dir);
	if (*out)
		return 0;
	int rc = -errno;
	log_error("%s: cannot open WAL directory: %s", w->dir, mc_strerror(rc));
	return rc;
}

/* List the segments (sorted) and remove temp files of interrupted rolls. */
static int list_segments(struct wal *w)
{
	DIR *d;
	int rc = wal_opendir(w, &d);
	if (rc)
		return rc;
	struct dirent *de;
	while ((de = readdir(d))) {
		uint64_t seq, first;
		size_t n = strlen(de->d_name);
		if (n == WAL_NAME_LEN + 4 && strcmp(de->d_name + WAL_NAME_LEN, ".tmp") == 0) {
			char path[PATH_MAX];
			snprintf(path, sizeof(path), "%s/%s", w->dir, de->d_name);
			if (unlink(path) == 0)
				log_info("%s: removed a segment left by an "
					 "interrupted roll",
					 path);
			continue;
		}
		if (!parse_seg_name(de->d_name, &seq, &first))
			continue;
		if ((rc = segs_push(w, seq, first)))
			break;
	}
	closedir(d);
	if (rc)
		return rc;
	if (w->nsegs > 1)
		qsort(w->segs, w->nsegs, sizeof(*w->segs), seg_cmp);
	return 0;
}

bool wal_exists(const char *dir)
{
	DIR *d = opendir(dir);
	if (!d)
		return false;
	bool found = false;
	struct dirent *de;
	uint64_t seq, first;
	while (!found && (de = readdir(d)))
		found = parse_seg_name(de->d_name, &seq, &first);
	closedir(d);
	return found;
}

static void prealloc_file(struct wal *w, int fd, const char *path)
{
	if (!w->prealloc)
		return;
	if (fallocate(fd, 0, 0, (off_t)w->segment_bytes) != 0) {
		/* Not fatal: the segment grows by append instead. */
		log_debug("%s: fallocate failed (%s); not preallocating", path,
			  mc_strerror(-errno));
		if (errno == EOPNOTSUPP || errno == ENOSYS)
			w->prealloc = false;
	}
}

static int do_fdatasync(struct wal *w, int fd)
{
	uint64_t t0 = mc_now_ns();
	int rc = fdatasync(fd) == 0 ? 0 : -errno;
	metric_observe(w->m_fsync_seconds, (double)(mc_now_ns() - t0) / 1e9);
	metric_inc(w->m_fsyncs);
	w->stats.fsyncs++;
	return rc;
}

/* Latch a fatal error (logged once, here). */
static int wal_fail(struct wal *w, int rc, const char *what)
{
	if (!w->fatal) {
		char path[PATH_MAX];
		if (seg_path(w, path, sizeof(path), w->segs[w->nsegs - 1].seq,
			     w->segs[w->nsegs - 1].first_index, "") != 0)
			snprintf(path, sizeof(path), "%s", w->dir);
		log_error("%s: %s failed: %s; the WAL is closed to writes, "
			  "restart to recover",
			  path, what, mc_strerror(rc));
		w->fatal = rc;
	}
	return rc;
}

/* Write what is pending (no fsync). */
static int flush_pending(struct wal *w)
{
	if (w->pend.len == 0)
		return 0;
	int rc = mc_pwrite_all(w->fd, w->pend.data, w->pend.len, w->seg_off);
	if (rc)
		return wal_fail(w, rc, "write");
	w->seg_off += w->pend.len;
	w->stats.writes++;
	w->stats.bytes_written += w->pend.len;
	metric_add(w->m_bytes, w->pend.len);
	w->pend.len = 0;
	w->dirty = true;
	return 0;
}

static int sync_pending(struct wal *w)
{
	int rc = flush_pending(w);
	if (rc)
		return rc;
	if (!w->dirty)
		return 0;
	if ((rc = do_fdatasync(w, w->fd)))
		return wal_fail(w, rc, "fdatasync");
	w->dirty = false;
	w->group_off = w->seg_off; /* the next write starts a new group */
	return 0;
}

/* Encode a record into buf at segment offset off; returns its CRC. */
static int encode_into(struct mc_buf *b, uint32_t seed, unsigned type, const void *p1,
		       size_t n1, const void *p2, size_t n2, uint64_t group_off, uint32_t *crc)
{
	size_t frame = wal__frame_bytes(n1 + n2);
	int rc = mc_buf_reserve(b, frame);
	if (rc)
		return rc;
	*crc = wal__encode_frame((uint8_t *)b->data + b->len, seed, type, p1, n1, p2, n2,
				 group_off);
	b->len += frame;
	return 0;
}

static void hs_payload(uint8_t p[24], const struct wal_hard_state *hs)
{
	mc_put_le64(p, hs->term);
	mc_put_le64(p + 8, hs->vote);
	mc_put_le64(p + 16, hs->commit);
}

static void snap_payload(uint8_t p[16], struct wal_snap_ref s)
{
	mc_put_le64(p, s.index);
	mc_put_le64(p + 8, s.term);
}

/*
 * Create segment seq (first index first) holding a header chained to
 * prev_crc and copies of the current hard state and marker: write it as a
 * temp file, fsync, rename, fsync the directory. On success *fd_out is the
 * open segment and *len_out / *crc_out its length and last CRC.
 */
static int create_segment(struct wal *w, uint64_t seq, uint64_t first, uint32_t prev_crc,
			  int *fd_out, uint64_t *len_out, uint32_t *crc_out, size_t *nrec_out)
{
	char tmp[PATH_MAX], path[PATH_MAX];
	struct mc_buf b = MC_BUF_INIT;
	int fd = -1;
	int rc = seg_path(w, tmp, sizeof(tmp), seq, first, ".tmp");
	if (rc || (rc = seg_path(w, path, sizeof(path), seq, first, "")))
		return rc;

	uint32_t seed = wal__seed(w->wal_id, seq);
	uint32_t crc = prev_crc;
	size_t nrec = 0;
	struct wal__seg_hdr h = {w->wal_id, seq, first, prev_crc};
	if ((rc = mc_buf_reserve(&b, WAL__SEG_HDR_BYTES)))
		goto out_buf;
	wal__seg_hdr_encode((uint8_t *)b.data, &h);
	b.len = WAL__SEG_HDR_BYTES;
	const struct wal_hard_state zero_hs = {0};
	if (memcmp(&w->view.hs, &zero_hs, sizeof(zero_hs)) != 0) {
		uint8_t p[24];
		hs_payload(p, &w->view.hs);
		if ((rc = encode_into(&b, seed, WAL__REC_HARD_STATE, p, 24, NULL, 0,
				      WAL__SEG_HDR_BYTES, &crc)))
			goto out_buf;
		nrec++;
	}
	if (w->view.snap.index > 0) {
		uint8_t p[16];
		snap_payload(p, w->view.snap);
		if ((rc = encode_into(&b, seed, WAL__REC_SNAPSHOT, p, 16, NULL, 0,
				      WAL__SEG_HDR_BYTES, &crc)))
			goto out_buf;
		nrec++;
	}

	unlink(tmp);
	fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0) {
		rc = -errno;
		log_error("%s: cannot create segment: %s", tmp, mc_strerror(rc));
		goto out_buf;
	}
	if ((rc = mc_pwrite_all(fd, b.data, b.len, 0))) {
		log_error("%s: write failed: %s", tmp, mc_strerror(rc));
		goto out_unlink;
	}
	w->stats.writes++;
	w->stats.bytes_written += b.len;
	metric_add(w->m_bytes, b.len);
	prealloc_file(w, fd, tmp);
	uint64_t t0 = mc_now_ns();
	rc = fsync(fd) == 0 ? 0 : -errno;
	metric_observe(w->m_fsync_seconds, (double)(mc_now_ns() - t0) / 1e9);
	metric_inc(w->m_fsyncs);
	w->stats.fsyncs++;
	if (rc) {
		log_error("%s: fsync failed: %s", tmp, mc_strerror(rc));
		goto out_unlink;
	}
	if (rename(tmp, path) != 0) {
		rc = -errno;
		log_error("%s: rename to %s failed: %s", tmp, path, mc_strerror(rc));
		goto out_unlink;
	}
	if ((rc = mc_fsync_dir(w->dir))) {
		/* The segment exists but may not survive a crash; it is
		 * complete either way, so only the fsync is reported. */
		log_error("%s: fsync failed: %s", w->dir, mc_strerror(rc));
		goto out_close;
	}
	*fd_out = fd;
	*len_out = b.len;
	*crc_out = crc;
	*nrec_out = nrec;
	mc_buf_free(&b);
	log_debug("%s: new segment", path);
	return 0;

out_unlink:
	unlink(tmp);
out_close:
	close(fd);
out_buf:
	mc_buf_free(&b);
	return rc;
}

/* Sync the open segment and continue in a new one. */
static int roll_segment(struct wal *w)
{
	int rc = sync_pending(w);
	if (rc)
		return rc;
	struct wal_seg *cur = &w->segs[w->nsegs - 1];
	uint64_t seq = cur->seq + 1, first = w->view.last + 1;
	int fd;
	uint64_t len;
	uint32_t crc;
	size_t nrec;
	if ((rc = segs_reserve(w)) ||
	    (rc = create_segment(w, seq, first, w->last_crc, &fd, &len, &crc, &nrec)))
		return wal_fail(w, rc, "segment roll");
	w->segs[w->nsegs++] = (struct wal_seg){seq, first};
	close(w->fd);
	w->fd = fd;
	w->seed = wal__seed(w->wal_id, seq);
	w->seg_off = len;
	w->group_off = len;
	w->last_crc = crc;
	w->seg_body = 0;
	w->dirty = false;
	return 0;
}

/* Append one record to the pending buffer, rolling or flushing first when
 * needed. Any error is fatal. */
static int append_record(struct wal *w, unsigned type, const void *p1, size_t n1,
			 const void *p2, size_t n2)
{
	size_t frame = wal__frame_bytes(n1 + n2);
	int rc;
	if (w->seg_body > 0 && w->seg_off + w->pend.len + frame > w->segment_bytes &&
	    (rc = roll_segment(w)))
		return rc;
	if (w->pend.len > 0 && w->pend.len + frame > w->buffer_bytes &&
	    (rc = flush_pending(w)))
		return rc;
	if ((rc = encode_into(&w->pend, w->seed, type, p1, n1, p2, n2, w->group_off,
			      &w->last_crc)))
		return wal_fail(w, rc, "buffering a record");
	w->seg_body++;
	return 0;
}

static void metrics_setup(struct wal *w, struct metrics_registry *reg)
{
	if (!reg)
		reg = metrics_global();
	w->m_fsync_seconds = metrics_histogram(
		reg, "mooncake_wal_fsync_duration_seconds",
		"Duration of WAL segment fdatasync/fsync calls.", NULL, NULL,
		metrics_latency_buckets, metrics_latency_nbuckets);
	w->m_fsyncs = metrics_counter(reg, "mooncake_wal_fsyncs_total",
				      "WAL segment fdatasync/fsync calls.", NULL, NULL);
	w->m_bytes = metrics_counter(reg, "mooncake_wal_bytes_written_total",
				     "Bytes written to WAL segments.", NULL, NULL);
}

/* Read a whole segment file into *buf (grown as needed). */
static int read_segment(const char *path, int fd, uint8_t **buf, size_t *cap, size_t *len)
{
	struct stat st;
	if (fstat(fd, &st) != 0) {
		int rc = -errno;
		log_error("%s: stat failed: %s", path, mc_strerror(rc));
		return rc;
	}
	if ((uint64_t)st.st_size > WAL_SEGMENT_READ_MAX) {
		log_error("%s: segment of %" PRIu64 " bytes is larger than any "
			  "the WAL writes",
			  path, (uint64_t)st.st_size);
		return -EBADMSG;
	}
	size_t n = (size_t)st.st_size;
	if (n > *cap) {
		uint8_t *b = realloc(*buf, n);
		if (!b)
			return -ENOMEM;
		*buf = b;
		*cap = n;
	}
	int rc = mc_pread_all(fd, *buf, n, 0);
	if (rc) {
		log_error("%s: read failed: %s", path, mc_strerror(rc));
		return rc;
	}
	*len = n;
	return 0;
}

/* Cut the torn tail of the open segment at end and make it durable. */
static int repair_tail(struct wal *w, int fd, const char *path, const uint8_t *buf, size_t len,
		       size_t end, const char *why)
{
	size_t nz = len;
	while (nz > end && buf[nz - 1] == 0)
		nz--;
	log_warn("%s: torn tail at offset %zu (%s): truncated, %zu bytes of "
		 "an unsynced write dropped",
		 path, end, why, nz - end);
	if (ftruncate(fd, (off_t)end) != 0) {
		int rc = -errno;
		log_error("%s: truncate failed: %s", path, mc_strerror(rc));
		return rc;
	}
	prealloc_file(w, fd, path);
	return 0;
}

/* Check segment k's header against its name, the WAL id and the chain.
 * Returns NULL or why not. */
static const char *check_seg_header(struct wal *w, size_t k, const uint8_t *buf, size_t len,
				    uint32_t chain, struct wal__seg_hdr *h)
{
	const char *why = NULL;
	if (wal__seg_hdr_decode(buf, len, h, &why) != 0)
		return why;
	if (h->seq != w->segs[k].seq || h->first_index != w->segs[k].first_index)
		return "segment header does not match the file name";
	if (k == 0)
		w->wal_id = h->wal_id;
	else if (h->wal_id != w->wal_id)
		return "segment belongs to another WAL (id mismatch)";
	if (k > 0 && h->prev_crc != chain)
		return "segment does not follow the previous one (CRC chain "
		       "broken: misplaced segment, or the previous one lost "
		       "its last records)";
	return NULL;
}

/*
 * Recovery found segments up to below, then a gap, then the ones it
 * read (w->segs). A release renames the segments it drops oldest first
 * after making its marker durable, and without a directory fsync a crash
 * can keep any of those renames: when the newest marker covers every
 * entry before the first segment read, the ones below the gap were
 * released and are set aside again; otherwise a segment is lost.
 * Errors: -EBADMSG a segment is missing; negative errno of a rename.
 */
static int set_aside_below_gap(struct wal *w, struct wal_seg below)
{
	if (w->view.snap.index + 1 < w->segs[0].first_index) {
		log_error("%s: segment %016" PRIx64 " is missing (have %016" PRIx64
			  " and %016" PRIx64 ", and no snapshot marker past index %" PRIu64
			  ")",
			  w->dir, below.seq + 1, below.seq, w->segs[0].seq,
			  w->segs[0].first_index - 1);
		return -EBADMSG;
	}
	/* The names below the gap, found again (only the newest was kept). */
	DIR *d;
	int rc = wal_opendir(w, &d);
	if (rc)
		return rc;
	size_t done = 0;
	struct dirent *de;
	while ((de = readdir(d))) {
		uint64_t seq, first;
		if (!parse_seg_name(de->d_name, &seq, &first) || seq > below.seq)
			continue;
		if ((rc = set_aside_seg(w, seq, first)))
			break;
		done++;
	}
	closedir(d);
	if (!rc)
		log_info("%s: %zu segments before %016" PRIx64 " were released (snapshot "
			 "marker %" PRIu64 ") but came back after a crash: set aside",
			 w->dir, done, w->segs[0].seq, w->view.snap.index);
	return rc;
}

static int recover(struct wal *w, struct wal_recovery *rec)
{
	char path[PATH_MAX];
	uint8_t *buf = NULL;
	size_t cap = 0, len = 0;
	uint32_t chain = 0;
	int rc = 0;
	int fd = -1;

	/* Segments below a gap were released, or one in the gap is lost:
	 * read from the last gap on, and tell which once the newest marker
	 * is known. */
	size_t gap = 0;
	for (size_t k = 1; k < w->nsegs; k++)
		if (w->segs[k].seq != w->segs[k - 1].seq + 1)
			gap = k;
	struct wal_seg below = gap ? w->segs[gap - 1] : (struct wal_seg){0, 0};
	if (gap) {
		memmove(w->segs, w->segs + gap, (w->nsegs - gap) * sizeof(*w->segs));
		w->nsegs -= gap;
	}
	struct wal__view *v = &w->view;
	wal__view_init(v, w->segs[0].first_index, true);

	for (size_t k = 0; k < w->nsegs; k++) {
		bool last = k + 1 == w->nsegs;
		const struct wal_seg *sg = &w->segs[k];
		if ((rc = seg_path(w, path, sizeof(path), sg->seq, sg->first_index, "")))
			goto out;
		fd = open(path, (last ? O_RDWR : O_RDONLY) | O_CLOEXEC);
		if (fd < 0) {
			rc = -errno;
			log_error("%s: cannot open: %s", path, mc_strerror(rc));
			goto out;
		}
		if ((rc = read_segment(path, fd, &buf, &cap, &len)))
			goto out;
		struct wal__seg_hdr h;
		const char *why = check_seg_header(w, k, buf, len, chain, &h);
		if (why) {
			log_error("%s: corrupt at offset 0: %s", path, why);
			rc = -EBADMSG;
			goto out;
		}

		struct wal__scan s = {.seed = wal__seed(h.wal_id, h.seq),
				      .last = last,
				      .last_crc = h.prev_crc};
		rc = wal__scan_segment(buf, len, &s, v);
		if (rc == -EBADMSG) {
			log_error("%s: corrupt at offset %zu: %s", path, s.bad_off, s.why);
			goto out;
		}
		if (rc)
			goto out;
		chain = s.last_crc;
		if (!last) {
			close(fd);
			fd = -1;
			continue;
		}
		if (s.torn) {
			rc = repair_tail(w, fd, path, buf, len, s.end, s.why);
			if (rc)
				goto out;
			rec->tail_truncated = true;
		}
		/* Make the previous run's writes durable before appending
		 * after them (they may still be only in the page cache). */
		if ((rc = do_fdatasync(w, fd))) {
			log_error("%s: fdatasync failed: %s", path, mc_strerror(rc));
			goto out;
		}
		w->fd = fd;
		fd = -1;
		w->seed = s.seed;
		w->seg_off = s.end;
		w->group_off = s.end;
		w->last_crc = s.last_crc;
		w->seg_body = s.nrec;
	}

	if (gap && (rc = set_aside_below_gap(w, below)))
		goto out;

	/* Hand the entries to rec; the WAL keeps the terms (compacted). */
	rec->hs = v->hs;
	rec->snap = v->snap;
	rec->first_index = v->first;
	rec->n_ents = wal__view_count(v);
	rec->ents = v->ents;
	rec->arena = v->arena;
	v->ents = NULL;
	v->arena = NULL;
	v->keep_data = false;
	v->compact = true;
	wal__view_compact(v);
	if (rec->n_ents == 0) {
		free(rec->ents);
		rec->ents = NULL;
	}
	log_info("%s: recovered %zu segments, entries %" PRIu64 "..%" PRIu64
		 ", snapshot marker %" PRIu64 ", term %" PRIu64 ", commit %" PRIu64,
		 w->dir, w->nsegs, rec->first_index, rec->first_index + rec->n_ents - 1,
		 rec->snap.index, rec->hs.term, rec->hs.commit);
out:
	if (fd >= 0)
		close(fd);
	free(buf);
	return rc;
}

/* fsync the directory holding dir (after creating dir). */
static int fsync_parent(const char *dir)
{
	char parent[PATH_MAX];
	size_t n = strlen(dir);
	if (n >= sizeof(parent))
		return -ENAMETOOLONG;
	memcpy(parent, dir, n + 1);
	while (n > 1 && parent[n - 1] == '/')
		parent[--n] = '\0';
	char *slash = strrchr(parent, '/');
	if (!slash)
		return mc_fsync_dir(".");
	if (slash == parent)
		slash[1] = '\0';
	else
		*slash = '\0';
	return mc_fsync_dir(parent);
}

static uint64_t new_wal_id(void)
{
	uint64_t id = 0;
	if (getrandom(&id, sizeof(id), 0) != (ssize_t)sizeof(id))
		id = mc_now_ns() ^ ((uint64_t)getpid() << 32);
	return id ? id : 1;
}

int wal_open(const char *dir, const struct wal_options *opts, struct wal **out,
	     struct wal_recovery *rec)
{
	static const struct wal_options defaults = {0};
	int rc, holder = 0;
	if (!opts)
		opts = &defaults;
	memset(rec, 0, sizeof(*rec));
	uint64_t seg_bytes = opts->segment_bytes ? opts->segment_bytes
						 : WAL_SEGMENT_DEFAULT_BYTES;
	if (seg_bytes < WAL_SEGMENT_MIN_BYTES || seg_bytes > WAL_SEGMENT_MAX_BYTES) {
		log_error("%s: segment size %" PRIu64 " out of range", dir, seg_bytes);
		return -EINVAL;
	}

	struct wal *w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	w->fd = -1;
	w->lock_fd = -1;
	w->segment_bytes = seg_bytes;
	w->buffer_bytes = opts->buffer_bytes ? opts->buffer_bytes : WAL_BUFFER_DEFAULT_BYTES;
	w->prealloc = !opts->no_prealloc;
	metrics_setup(w, opts->metrics);
	if (!(w->dir = strdup(dir))) {
		rc = -ENOMEM;
		goto out_free;
	}
	if (opts->create && (rc = mc_mkdir_p(dir, 0700))) {
		log_error("%s: cannot create WAL directory: %s", dir, mc_strerror(rc));
		goto out_free;
	}
	if ((rc = mc_lock_dir(dir, &w->lock_fd, &holder))) {
		if (rc == MC_ELOCKED)
			log_error("%s: WAL is in use by process %d", dir, holder);
		else if (rc == -ENOENT && !opts->create)
			log_error("%s: no WAL here", dir);
		else
			log_error("%s: cannot lock WAL directory: %s", dir, mc_strerror(rc));
		goto out_free;
	}
	if ((rc = list_segments(w)))
		goto out_unlock;

	if (w->nsegs == 0) {
		if (!opts->create) {
			log_error("%s: no WAL here", dir);
			rc = -ENOENT;
			goto out_unlock;
		}
		w->wal_id = new_wal_id();
		wal__view_init(&w->view, 1, false);
		w->view.compact = true;
		uint64_t len;
		uint32_t crc;
		size_t nrec;
		if ((rc = segs_push(w, 1, 1)) ||
		    (rc = create_segment(w, 1, 1, 0, &w->fd, &len, &crc, &nrec)))
			goto out_view;
		w->seed = wal__seed(w->wal_id, 1);
		w->seg_off = len;
		w->group_off = len;
		w->last_crc = crc;
		w->seg_body = 0;
		(void)nrec;
		/* The directory itself may be new: make its entry durable. */
		if ((rc = fsync_parent(dir))) {
			log_error("%s: fsync of the parent directory failed: "
				  "%s",
				  dir, mc_strerror(rc));
			goto out_view;
		}
		log_info("%s: created a new WAL", dir);
	} else if ((rc = recover(w, rec))) {
		goto out_view;
	}
	w->stats.segments = w->nsegs;
	*out = w;
	return 0;

out_view:
	wal_recovery_close(rec);
	memset(rec, 0, sizeof(*rec));
	wal__view_free(&w->view);
	if (w->fd >= 0)
		close(w->fd);
out_unlock:
	mc_unlock_dir(w->lock_fd);
out_free:
	free(w->segs);
	free(w->dir);
	free(w);
	return rc;
}

void wal_recovery_close(struct wal_recovery *rec)
{
	if (!rec)
		return;
	free(rec->ents);
	wal__arena_free(rec->arena);
	rec->ents = NULL;
	rec->arena = NULL;
	rec->n_ents = 0;
}

int wal_recovery_check_start(const struct wal_recovery *rec, uint64_t index, uint64_t term)
{
	uint64_t first = rec->first_index;
	uint64_t last = first + rec->n_ents - 1; /* first - 1 when none */
	if (index > 0 && index == rec->snap.index && term != rec->snap.term)
		return -EBADMSG; /* the marker names another snapshot */
	if (index > last)
		return 0; /* newer than the log (and than every marker) */
	if (index + 1 < first)
		return -ENOENT; /* entries after it were released */
	if (index < first)
		return 0;
	if (rec->ents[index - first].term == term || index > rec->snap.index)
		return 0; /* a newer snapshot replaces a conflicting log */
	return -EBADMSG;
}

int wal_start_at(struct wal *w, struct wal_recovery *rec, uint64_t index, uint64_t term)
{
	int rc = wal_recovery_check_start(rec, index, term);
	if (rc) {
		log_error("%s: cannot start from snapshot %" PRIu64 " (term %" PRIu64 "): %s",
			  w->dir, index, term,
			  rc == -ENOENT ? "the entries after it are not in the "
					  "WAL (released or replaced)"
					: "the WAL holds that index with "
					  "another term");
		return rc;
	}
	uint64_t first = rec->first_index;
	size_t drop;
	if (rec->n_ents > 0 && index >= first && index < first + rec->n_ents &&
	    rec->ents[index - first].term == term)
		drop = (size_t)(index - first + 1);
	else if (index + 1 == first)
		drop = 0;
	else
		drop = rec->n_ents; /* the snapshot replaces the log */
	if (drop == rec->n_ents && drop > 0) {
		rec->n_ents = 0;
	} else if (drop > 0) {
		memmove(rec->ents, rec->ents + drop,
			(rec->n_ents - drop) * sizeof(*rec->ents));
		rec->n_ents -= drop;
	}
	rec->first_index = index + 1;
	if (index > w->view.snap.index) {
		struct wal_snap_ref s = {index, term};
		if ((rc = wal_save_snapshot(w, s, true)))
			return rc;
		rec->snap = s;
	}
	return 0;
}

int wal_save(struct wal *w, const struct wal_hard_state *hs, const struct wal_entry *ents,
	     size_t n, bool sync)
{
	if (w->fatal)
		return w->fatal;
	const char *why = wal__view_check_entries(&w->view, ents, n);
	if (!why && hs)
		why = wal__view_check_hs(&w->view, hs);
	if (why) {
		log_error("%s: save refused: %s (entries %" PRIu64 "+%zu, last "
			  "%" PRIu64 ", marker %" PRIu64 ")",
			  w->dir, why, n ? ents[0].index : 0, n, w->view.last,
			  w->view.snap.index);
		return -EINVAL;
	}
	for (size_t k = 0; k < n; k++) {
		if (ents[k].len > 0 && !ents[k].data) {
			log_error("%s: entry %" PRIu64 " has length %zu and no "
				  "data",
				  w->dir, ents[k].index, ents[k].len);
			return -EINVAL;
		}
		if (ents[k].len > WAL_RECORD_MAX_BYTES - WAL__ENTRY_HDR_BYTES) {
			log_error("%s: entry %" PRIu64 " of %zu bytes refused "
				  "(at most %u)",
				  w->dir, ents[k].index, ents[k].len,
				  WAL_RECORD_MAX_BYTES - WAL__ENTRY_HDR_BYTES);
			return MC_ETOO_LARGE;
		}
	}
	int rc;
	if (n > 0) {
		/* Room for the terms first: applying cannot fail later. */
		uint64_t x = ents[0].index;
		size_t slot = x < w->view.first ? 0 : (size_t)(x - w->view.first);
		if ((rc = wal__view_reserve(&w->view, slot + n)))
			return rc;
	}
	for (size_t k = 0; k < n; k++) {
		uint8_t h[WAL__ENTRY_HDR_BYTES];
		mc_put_le64(h, ents[k].index);
		mc_put_le64(h + 8, ents[k].term);
		mc_put_le32(h + 16, ents[k].type);
		if ((rc = append_record(w, WAL__REC_ENTRY, h, sizeof(h), ents[k].data,
					ents[k].len)))
			return rc;
		struct wal_entry e = ents[k];
		e.len = 0; /* the save view keeps no data */
		if ((rc = wal__view_apply_entry(&w->view, &e)))
			return wal_fail(w, rc, "save");
	}
	if (hs && memcmp(hs, &w->view.hs, sizeof(*hs)) != 0) {
		uint8_t p[24];
		hs_payload(p, hs);
		rc = append_record(w, WAL__REC_HARD_STATE, p, 24, NULL, 0);
		if (rc)
			return rc;
		w->view.hs = *hs;
	}
	return sync ? sync_pending(w) : 0;
}

int wal_save_snapshot(struct wal *w, struct wal_snap_ref snap, bool sync)
{
	if (w->fatal)
		return w->fatal;
	const char *why = wal__view_check_snap(&w->view, snap);
	if (why) {
		log_error("%s: snapshot marker %" PRIu64 " refused: %s", w->dir, snap.index,
			  why);
		return -EINVAL;
	}
	if (snap.index != w->view.snap.index) {
		uint8_t p[16];
		snap_payload(p, snap);
		int rc = append_record(w, WAL__REC_SNAPSHOT, p, 16, NULL, 0);
		if (rc)
			return rc;
		wal__view_apply_snap(&w->view, snap);
	}
	return sync ? sync_pending(w) : 0;
}

int wal_sync(struct wal *w)
{
	if (w->fatal)
		return w->fatal;
	return sync_pending(w);
}

int wal_release_to(struct wal *w, uint64_t index)
{
	if (w->fatal)
		return w->fatal;
	if (index > w->view.snap.index) {
		log_error("%s: release to %" PRIu64 " refused: newest snapshot "
			  "marker is %" PRIu64,
			  w->dir, index, w->view.snap.index);
		return -EINVAL;
	}
	/* Segments 0..k go when segment k+1 began at or below index + 1:
	 * every live entry they hold is below that segment's first index. */
	size_t ndel = 0;
	for (size_t k = 0; k + 1 < w->nsegs; k++)
		if (w->segs[k + 1].first_index <= index + 1)
			ndel = k + 1;
	if (ndel == 0)
		return 0;
	/* The marker that makes the release safe must be durable first. */
	int rc = sync_pending(w);
	if (rc)
		return rc;
	size_t done = 0;
	for (; done < ndel; done++)
		if ((rc = set_aside_seg(w, w->segs[done].seq, w->segs[done].first_index)))
			break;
	if (done > 0) {
		memmove(w->segs, w->segs + done, (w->nsegs - done) * sizeof(*w->segs));
		w->nsegs -= done;
		w->stats.segments = w->nsegs;
		log_debug("%s: released %zu segments up to index %" PRIu64, w->dir, done,
			  index);
	}
	return rc;
}

int wal_remove_released(const char *dir, unsigned *removed)
{
	int rc = mc_unlink_suffixed(dir, WAL_RELEASED_SUFFIX, WAL_REMOVE_STEP_BYTES,
				    WAL_REMOVE_PAUSE_MS, removed);
	if (rc)
		log_warn("%s: cannot remove released segments: %s", dir, mc_strerror(rc));
	return rc;
}

uint64_t wal_last_index(const struct wal *w)
{
	return w->view.last;
}

struct wal_hard_state wal_hard_state(const struct wal *w)
{
	return w->view.hs;
}

struct wal_snap_ref wal_snapshot(const struct wal *w)
{
	return w->view.snap;
}

void wal_get_stats(const struct wal *w, struct wal_stats *out)
{
	*out = w->stats;
	out->segments = w->nsegs;
	out->last_seq = w->nsegs ? w->segs[w->nsegs - 1].seq : 0;
}

void wal_close(struct wal *w)
{
	if (!w)
		return;
	if (!w->fatal)
		(void)sync_pending(w); /* a failure is logged by wal_fail */
	if (w->fd >= 0)
		close(w->fd);
	mc_buf_free(&w->pend);
	wal__view_free(&w->view);
	mc_unlock_dir(w->lock_fd);
	free(w->segs);
	free(w->dir);
	free(w);
}
