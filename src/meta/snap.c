/*
 * snap: snapshot files — streaming writer (temp file, fsync, rename,
 * directory fsync), streaming reader with CRC checks, retention, and the
 * start-up choice of the snapshot to restore. See snap.h for the format
 * and the rules.
 *
 * File names are <index>-<term>.snap (16 hex digits each), so a directory
 * listing sorts them; temp files are <name>.<pid>.<n>.tmp, corrupt
 * snapshots set aside are <name>.broken, old ones purged and not yet
 * deleted <name>.del. The header and conf state are
 * checked when a reader opens; the data CRC when it reaches the end.
 */
#include "meta/snap.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/crc32c.h"
#include "common/endian.h"
#include "common/io.h"
#include "common/log.h"
#include "common/util.h"

#define LOG_SUBSYS LOGS_WAL

#define SNAP_MAGIC "MCSNAP\0\1"
#define SNAP_VERSION 1u
#define SNAP_HDR_BYTES 64u
#define SNAP_NAME_LEN 38 /* 16 + 1 + 16 + 5 */
#define SNAP_WBUF_BYTES (256u << 10)
/* A snapshot's data goes to disk in steps of this many bytes while it is
 * written, not all at the final fsync: on a file system shared with WAL
 * segments, an fsync that has to flush hundreds of megabytes holds every
 * fdatasync of the WAL (the journal commit waits for the data) — the
 * member stops committing while its snapshot lands. Small steps keep
 * what a WAL fdatasync may find queued before it on the device small. */
#define SNAP_SYNC_STEP_BYTES (1u << 20)
#define SNAP_VERIFY_CHUNK (1u << 20)
/* An old snapshot is renamed <name>.del and deleted later, a step of this
 * many bytes at a time, this long apart (mc_unlink_in_steps): at most
 * 80 MB/s of blocks freed. */
#define SNAP_PURGED_SUFFIX ".del"
#define SNAP_REMOVE_STEP_BYTES (4ull << 20)
#define SNAP_REMOVE_PAUSE_MS 50u

static _Atomic unsigned snap_tmp_counter;

/* ------------------------------------------------------------ helpers */

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

/* "<index>-<term>.snap" followed by suffix ("" or ".…tmp"). */
static bool parse_snap_name(const char *name, uint64_t *index, uint64_t *term)
{
	return strlen(name) >= SNAP_NAME_LEN && name[16] == '-' &&
	       strncmp(name + 33, ".snap", 5) == 0 && parse_hex16(name, index) &&
	       parse_hex16(name + 17, term);
}

static bool ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), m = strlen(suffix);
	return n >= m && strcmp(s + n - m, suffix) == 0;
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

void snap_info_close(struct snap_info *info)
{
	if (!info)
		return;
	free(info->conf);
	free(info->path);
	memset(info, 0, sizeof(*info));
}

/* ------------------------------------------------------------ listing */

struct snap_file {
	uint64_t index;
	uint64_t term;
	char name[SNAP_NAME_LEN + 1];
};

/* Newest first. */
static int snap_file_cmp(const void *a, const void *b)
{
	const struct snap_file *x = a, *y = b;
	if (x->index != y->index)
		return x->index > y->index ? -1 : 1;
	if (x->term != y->term)
		return x->term > y->term ? -1 : 1;
	return 0;
}

/* List the committed snapshots of dir, newest first; with clean_tmp,
 * remove temp files on the way. A missing dir is an empty list. */
static int list_snaps(const char *dir, bool clean_tmp, struct snap_file **out, size_t *n_out)
{
	*out = NULL;
	*n_out = 0;
	DIR *d = opendir(dir);
	if (!d) {
		if (errno == ENOENT)
			return 0;
		int rc = -errno;
		log_error("%s: cannot open snapshot directory: %s", dir, mc_strerror(rc));
		return rc;
	}
	struct snap_file *v = NULL;
	size_t n = 0, cap = 0;
	unsigned removed = 0;
	int rc = 0;
	struct dirent *de;
	while ((de = readdir(d))) {
		uint64_t index, term;
		if (!parse_snap_name(de->d_name, &index, &term))
			continue;
		if (ends_with(de->d_name, ".tmp")) {
			char path[PATH_MAX];
			if (clean_tmp &&
			    snprintf(path, sizeof(path), "%s/%s", dir, de->d_name) <
				    (int)sizeof(path) &&
			    unlink(path) == 0)
				removed++;
			continue;
		}
		if (strlen(de->d_name) != SNAP_NAME_LEN)
			continue; /* .broken and the like */
		if (n == cap) {
			size_t ncap = cap ? cap * 2 : 16;
			struct snap_file *nv = realloc(v, ncap * sizeof(*nv));
			if (!nv) {
				rc = -ENOMEM;
				break;
			}
			v = nv;
			cap = ncap;
		}
		v[n].index = index;
		v[n].term = term;
		memcpy(v[n].name, de->d_name, SNAP_NAME_LEN + 1);
		n++;
	}
	closedir(d);
	if (removed)
		log_info("%s: removed %u temp files of interrupted snapshot "
			 "writes",
			 dir, removed);
	if (rc) {
		free(v);
		return rc;
	}
	if (n > 1)
		qsort(v, n, sizeof(*v), snap_file_cmp);
	*out = v;
	*n_out = n;
	return 0;
}

int snap_purge(const char *dir, unsigned keep)
{
	struct snap_file *v;
	size_t n;
	int rc = list_snaps(dir, false, &v, &n);
	if (rc)
		return rc;
	if (keep == 0)
		keep = 1;
	for (size_t i = keep; i < n; i++) {
		char path[PATH_MAX], del[PATH_MAX];
		snprintf(path, sizeof(path), "%s/%s", dir, v[i].name);
		snprintf(del, sizeof(del), "%s/%s" SNAP_PURGED_SUFFIX, dir, v[i].name);
		if (rename(path, del) != 0 && errno != ENOENT) {
			rc = -errno;
			log_warn("%s: cannot set aside old snapshot: %s", path,
				 mc_strerror(rc));
		} else {
			log_debug("%s: old snapshot set aside", path);
		}
	}
	free(v);
	return rc;
}

int snap_remove_purged(const char *dir, unsigned *removed)
{
	int rc = mc_unlink_suffixed(dir, SNAP_PURGED_SUFFIX, SNAP_REMOVE_STEP_BYTES,
				    SNAP_REMOVE_PAUSE_MS, removed);
	if (rc && rc != -ENOENT)
		log_warn("%s: cannot remove old snapshots: %s", dir, mc_strerror(rc));
	return rc == -ENOENT ? 0 : rc;
}

int snap_oldest_index(const char *dir, uint64_t *index)
{
	struct snap_file *v;
	size_t n;
	int rc = list_snaps(dir, false, &v, &n);
	if (rc)
		return rc;
	*index = n ? v[n - 1].index : 0;
	free(v);
	return 0;
}

/* ------------------------------------------------------------ writer */

struct snap_writer {
	char *dir;
	char *tmp;
	char *path;
	int fd;
	int err; /* sticky write error */
	uint64_t index;
	uint64_t term;
	uint32_t conf_len;
	uint32_t conf_crc;
	uint32_t data_crc;
	uint64_t data_bytes;
	size_t wlen;
	uint8_t *wbuf;
	uint64_t file_off;   /* bytes written to the file so far */
	uint64_t synced_off; /* of which on disk (sync_file_range) */
	bool pace;           /* snap_writer_pace */
	uint64_t busy_ns;    /* in write and sync_file_range since the last pause */
};

static void writer_free(struct snap_writer *wr)
{
	if (wr->fd >= 0)
		close(wr->fd);
	free(wr->wbuf);
	free(wr->path);
	free(wr->tmp);
	free(wr->dir);
	free(wr);
}

int snap_writer_open(const char *dir, const struct snap_meta *meta, struct snap_writer **out)
{
	if (meta->index == 0 || meta->conf_len > SNAP_CONF_MAX_BYTES ||
	    (meta->conf_len > 0 && !meta->conf)) {
		log_error("%s: snapshot %" PRIu64 " refused: index 0 or conf "
			  "state of %zu bytes",
			  dir, meta->index, meta->conf_len);
		return -EINVAL;
	}
	bool existed = access(dir, F_OK) == 0;
	int rc = mc_mkdir_p(dir, 0700);
	if (!rc && !existed)
		rc = fsync_parent(dir); /* make the new directory durable */
	if (rc) {
		log_error("%s: cannot create snapshot directory: %s", dir, mc_strerror(rc));
		return rc;
	}
	struct snap_writer *wr = calloc(1, sizeof(*wr));
	if (!wr)
		return -ENOMEM;
	wr->fd = -1;
	wr->index = meta->index;
	wr->term = meta->term;
	wr->conf_len = (uint32_t)meta->conf_len;
	wr->conf_crc = crc32c(0, meta->conf, meta->conf_len);
	char name[SNAP_NAME_LEN + 1];
	snprintf(name, sizeof(name), "%016" PRIx64 "-%016" PRIx64 ".snap", meta->index,
		 meta->term);
	unsigned seq = atomic_fetch_add(&snap_tmp_counter, 1);
	rc = -ENOMEM;
	if (!(wr->dir = strdup(dir)) || !(wr->wbuf = malloc(SNAP_WBUF_BYTES)))
		goto out_free;
	if (asprintf(&wr->path, "%s/%s", dir, name) < 0) {
		wr->path = NULL;
		goto out_free;
	}
	if (asprintf(&wr->tmp, "%s/%s.%d.%u.tmp", dir, name, (int)getpid(), seq) < 0) {
		wr->tmp = NULL;
		goto out_free;
	}
	wr->fd = open(wr->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (wr->fd < 0) {
		rc = -errno;
		log_error("%s: cannot create: %s", wr->tmp, mc_strerror(rc));
		goto out_free;
	}
	/* Header placeholder (written for real at commit), then conf. */
	uint8_t hdr[SNAP_HDR_BYTES] = {0};
	if ((rc = mc_write_all(wr->fd, hdr, sizeof(hdr))) ||
	    (meta->conf_len && (rc = mc_write_all(wr->fd, meta->conf, meta->conf_len)))) {
		log_error("%s: write failed: %s", wr->tmp, mc_strerror(rc));
		goto out_unlink;
	}
	wr->file_off = wr->synced_off = SNAP_HDR_BYTES + meta->conf_len;
	*out = wr;
	return 0;

out_unlink:
	unlink(wr->tmp);
out_free:
	writer_free(wr);
	return rc;
}

void snap_writer_pace(struct snap_writer *wr)
{
	wr->pace = true;
}

/* Write to the file, counting the time for pacing. */
static int writer_put(struct snap_writer *wr, const void *data, size_t len)
{
	uint64_t t0 = mc_now_ns();
	int rc = mc_write_all(wr->fd, data, len);
	wr->busy_ns += mc_now_ns() - t0;
	return rc;
}

/* Written len more bytes: push the data to disk when a step is full. */
static int writer_wrote(struct snap_writer *wr, size_t len)
{
	wr->file_off += len;
	if (wr->file_off - wr->synced_off < SNAP_SYNC_STEP_BYTES)
		return 0;
	uint64_t t0 = mc_now_ns();
	if (sync_file_range(wr->fd, (off64_t)wr->synced_off,
			    (off64_t)(wr->file_off - wr->synced_off),
			    SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
				    SYNC_FILE_RANGE_WAIT_AFTER)) {
		int rc = -errno;
		log_error("%s: writing to disk failed: %s", wr->tmp, mc_strerror(rc));
		wr->err = rc;
		return rc;
	}
	/* On disk: the pages need not stay in memory (the file is read
	 * again only to send it or at a restart). Advice: nothing to check. */
	(void)posix_fadvise(wr->fd, (off_t)wr->synced_off,
			    (off_t)(wr->file_off - wr->synced_off), POSIX_FADV_DONTNEED);
	wr->synced_off = wr->file_off;
	wr->busy_ns += mc_now_ns() - t0;
	if (wr->pace) {
		struct timespec ts = {(time_t)(wr->busy_ns / 1000000000u),
				      (long)(wr->busy_ns % 1000000000u)};
		while (nanosleep(&ts, &ts) && errno == EINTR)
			;
	}
	wr->busy_ns = 0;
	return 0;
}

static int writer_flush(struct snap_writer *wr)
{
	if (wr->wlen == 0)
		return 0;
	int rc = writer_put(wr, wr->wbuf, wr->wlen);
	if (rc) {
		log_error("%s: write failed: %s", wr->tmp, mc_strerror(rc));
		wr->err = rc;
		return rc;
	}
	rc = writer_wrote(wr, wr->wlen);
	wr->wlen = 0;
	return rc;
}

int snap_writer_write(struct snap_writer *wr, const void *data, size_t len)
{
	if (wr->err)
		return wr->err;
	wr->data_crc = crc32c(wr->data_crc, data, len);
	wr->data_bytes += len;
	const uint8_t *p = data;
	if (wr->wlen + len <= SNAP_WBUF_BYTES) {
		memcpy(wr->wbuf + wr->wlen, p, len);
		wr->wlen += len;
		return 0;
	}
	int rc = writer_flush(wr);
	if (rc)
		return rc;
	if (len >= SNAP_WBUF_BYTES) {
		/* Straight from the caller's buffer, a step at a time. */
		while (len) {
			size_t n = len < SNAP_SYNC_STEP_BYTES ? len : SNAP_SYNC_STEP_BYTES;
			if ((rc = writer_put(wr, p, n))) {
				log_error("%s: write failed: %s", wr->tmp, mc_strerror(rc));
				wr->err = rc;
				return rc;
			}
			if ((rc = writer_wrote(wr, n)))
				return rc;
			p += n;
			len -= n;
		}
		return 0;
	}
	memcpy(wr->wbuf, p, len);
	wr->wlen = len;
	return 0;
}

uint64_t snap_writer_bytes(const struct snap_writer *wr)
{
	return wr->data_bytes;
}

static void encode_header(uint8_t *h, const struct snap_writer *wr)
{
	memset(h, 0, SNAP_HDR_BYTES);
	memcpy(h, SNAP_MAGIC, 8);
	mc_put_le32(h + 8, SNAP_VERSION);
	mc_put_le32(h + 12, SNAP_HDR_BYTES);
	mc_put_le64(h + 16, wr->index);
	mc_put_le64(h + 24, wr->term);
	mc_put_le64(h + 32, wr->data_bytes);
	mc_put_le32(h + 40, wr->conf_len);
	mc_put_le32(h + 44, wr->conf_crc);
	mc_put_le32(h + 48, wr->data_crc);
	mc_put_le32(h + 60, crc32c(0, h, 60));
}

int snap_writer_commit(struct snap_writer *wr, unsigned keep)
{
	int rc = wr->err;
	if (rc || (rc = writer_flush(wr)))
		goto out_unlink;
	uint8_t hdr[SNAP_HDR_BYTES];
	encode_header(hdr, wr);
	if ((rc = mc_pwrite_all(wr->fd, hdr, sizeof(hdr), 0))) {
		log_error("%s: write failed: %s", wr->tmp, mc_strerror(rc));
		goto out_unlink;
	}
	if (fsync(wr->fd) != 0) {
		rc = -errno;
		log_error("%s: fsync failed: %s", wr->tmp, mc_strerror(rc));
		goto out_unlink;
	}
	if (close(wr->fd) != 0) {
		wr->fd = -1;
		rc = -errno;
		log_error("%s: close failed: %s", wr->tmp, mc_strerror(rc));
		goto out_unlink;
	}
	wr->fd = -1;
	if (rename(wr->tmp, wr->path) != 0) {
		rc = -errno;
		log_error("%s: rename to %s failed: %s", wr->tmp, wr->path, mc_strerror(rc));
		goto out_unlink;
	}
	if ((rc = mc_fsync_dir(wr->dir))) {
		log_error("%s: fsync failed: %s", wr->dir, mc_strerror(rc));
		goto out_free;
	}
	log_info("%s: snapshot at index %" PRIu64 " term %" PRIu64 " saved (%" PRIu64
		 " bytes)",
		 wr->path, wr->index, wr->term, wr->data_bytes);
	(void)!snap_purge(wr->dir, keep); /* failures logged there */
	goto out_free;

out_unlink:
	unlink(wr->tmp);
out_free:
	writer_free(wr);
	return rc;
}

void snap_writer_abort(struct snap_writer *wr)
{
	if (!wr)
		return;
	unlink(wr->tmp);
	writer_free(wr);
}

/* ------------------------------------------------------------ reader */

struct snap_reader {
	char *path;
	int fd;
	uint64_t data_bytes;
	uint64_t done;
	uint32_t want_crc;
	uint32_t crc;
};

void snap_reader_close(struct snap_reader *r)
{
	if (!r)
		return;
	if (r->fd >= 0)
		close(r->fd);
	free(r->path);
	free(r);
}

int snap_reader_open(const char *path, struct snap_reader **out, struct snap_info *info)
{
	struct snap_reader *r = calloc(1, sizeof(*r));
	uint8_t *conf = NULL;
	const char *why = NULL;
	int rc = -ENOMEM;
	if (!r)
		return rc;
	if (!(r->path = strdup(path)))
		goto out_free;
	r->fd = open(path, O_RDONLY | O_CLOEXEC);
	if (r->fd < 0) {
		rc = -errno;
		log_error("%s: cannot open: %s", path, mc_strerror(rc));
		goto out_free;
	}
	struct stat st;
	if (fstat(r->fd, &st) != 0) {
		rc = -errno;
		log_error("%s: stat failed: %s", path, mc_strerror(rc));
		goto out_free;
	}
	uint8_t h[SNAP_HDR_BYTES];
	rc = -EBADMSG;
	why = "file shorter than a snapshot header";
	if ((uint64_t)st.st_size < SNAP_HDR_BYTES || mc_read_full(r->fd, h, sizeof(h)) != 0)
		goto out_corrupt;
	why = "not a snapshot (bad magic)";
	if (memcmp(h, SNAP_MAGIC, 8) != 0)
		goto out_corrupt;
	why = "header CRC mismatch";
	if (mc_get_le32(h + 60) != crc32c(0, h, 60))
		goto out_corrupt;
	why = "unsupported snapshot version";
	if (mc_get_le32(h + 8) != SNAP_VERSION || mc_get_le32(h + 12) != SNAP_HDR_BYTES)
		goto out_corrupt;
	uint64_t index = mc_get_le64(h + 16), term = mc_get_le64(h + 24);
	uint64_t data_bytes = mc_get_le64(h + 32);
	uint32_t conf_len = mc_get_le32(h + 40);
	why = "conf state length out of range";
	if (conf_len > SNAP_CONF_MAX_BYTES)
		goto out_corrupt;
	why = "file size does not match the header";
	if (data_bytes > (uint64_t)st.st_size ||
	    (uint64_t)st.st_size != SNAP_HDR_BYTES + conf_len + data_bytes)
		goto out_corrupt;
	if (conf_len > 0) {
		rc = -ENOMEM;
		if (!(conf = malloc(conf_len)))
			goto out_free;
		rc = -EBADMSG;
		why = "conf state unreadable";
		if (mc_read_full(r->fd, conf, conf_len) != 0)
			goto out_corrupt;
	}
	why = "conf state CRC mismatch";
	if (crc32c(0, conf, conf_len) != mc_get_le32(h + 44))
		goto out_corrupt;
	r->data_bytes = data_bytes;
	r->want_crc = mc_get_le32(h + 48);
	if (info) {
		memset(info, 0, sizeof(*info));
		info->path = strdup(path);
		if (!info->path) {
			rc = -ENOMEM;
			goto out_free;
		}
		info->index = index;
		info->term = term;
		info->data_bytes = data_bytes;
		info->conf = conf;
		info->conf_len = conf_len;
		conf = NULL;
	}
	free(conf);
	*out = r;
	return 0;

out_corrupt:
	log_error("%s: corrupt snapshot: %s", path, why);
out_free:
	free(conf);
	snap_reader_close(r);
	return rc;
}

int snap_reader_read(struct snap_reader *r, void *buf, size_t cap, size_t *n)
{
	*n = 0;
	uint64_t left = r->data_bytes - r->done;
	if (left == 0) {
		if (r->crc != r->want_crc) {
			log_error("%s: corrupt snapshot: data CRC mismatch", r->path);
			return -EBADMSG;
		}
		return 0;
	}
	size_t want = cap < left ? cap : (size_t)left;
	ssize_t got;
	do
		got = read(r->fd, buf, want);
	while (got < 0 && errno == EINTR);
	if (got < 0) {
		int rc = -errno;
		log_error("%s: read failed: %s", r->path, mc_strerror(rc));
		return rc;
	}
	if (got == 0 && want > 0) {
		log_error("%s: corrupt snapshot: file shrank while reading", r->path);
		return -EIO;
	}
	r->crc = crc32c(r->crc, buf, (size_t)got);
	r->done += (uint64_t)got;
	*n = (size_t)got;
	return 0;
}

int snap_verify(const char *path, struct snap_info *info)
{
	struct snap_reader *r;
	int rc = snap_reader_open(path, &r, info);
	if (rc)
		return rc;
	uint8_t *buf = malloc(SNAP_VERIFY_CHUNK);
	if (!buf) {
		rc = -ENOMEM;
		goto out;
	}
	size_t n;
	do
		rc = snap_reader_read(r, buf, SNAP_VERIFY_CHUNK, &n);
	while (rc == 0 && n > 0);
	free(buf);
out:
	snap_reader_close(r);
	if (rc && info)
		snap_info_close(info);
	return rc;
}

/* ------------------------------------------------------------ start-up */

static void set_aside(const char *dir, const char *name)
{
	char from[PATH_MAX], to[PATH_MAX];
	snprintf(from, sizeof(from), "%s/%s", dir, name);
	snprintf(to, sizeof(to), "%s/%s.broken", dir, name);
	if (rename(from, to) != 0)
		log_warn("%s: cannot rename corrupt snapshot aside: %s", from,
			 mc_strerror(-errno));
}

int snap_load_newest(const char *dir, snap_accept_fn accept, void *ctx, struct snap_info *out)
{
	struct snap_file *v;
	size_t n;
	memset(out, 0, sizeof(*out));
	int rc = list_snaps(dir, true, &v, &n);
	if (rc)
		return rc;
	size_t bad = 0; /* corrupt snapshots newer than the candidate */
	size_t i = 0;
	struct snap_info info = {0};
	for (; i < n; i++) {
		char path[PATH_MAX];
		snprintf(path, sizeof(path), "%s/%s", dir, v[i].name);
		rc = snap_verify(path, &info);
		if (rc == -ENOMEM)
			goto out;
		if (rc == 0 && (info.index != v[i].index || info.term != v[i].term)) {
			log_error("%s: corrupt snapshot: header says index "
				  "%" PRIu64 " term %" PRIu64,
				  path, info.index, info.term);
			snap_info_close(&info);
			rc = -EBADMSG;
		}
		if (rc == 0)
			break;
		bad++; /* logged by the reader */
	}
	uint64_t index = i < n ? info.index : 0, term = i < n ? info.term : 0;
	int arc = accept ? accept(ctx, index, term) : 0;
	if (arc) {
		if (bad)
			log_error("%s: newest snapshot %s is corrupt and the "
				  "WAL cannot continue from %s%s",
				  dir, v[0].name, i < n ? "the older " : "",
				  i < n ? v[i].name
					: "index 1 (no valid "
					  "snapshot)");
		else if (i < n)
			log_error("%s: the WAL cannot continue from snapshot "
				  "%s (entries after it released)",
				  dir, v[i].name);
		else
			log_error("%s: no snapshot, and the WAL does not start "
				  "at index 1",
				  dir);
		snap_info_close(&info);
		rc = bad ? -EBADMSG : -ENOENT;
		goto out;
	}
	for (size_t k = 0; k < bad; k++) {
		log_warn("%s/%s: skipping corrupt snapshot (renamed to "
			 "*.broken); starting from %s, the WAL covers the gap",
			 dir, v[k].name, i < n ? v[i].name : "index 1");
		set_aside(dir, v[k].name);
	}
	*out = info;
	rc = 0;
out:
	free(v);
	return rc;
}
