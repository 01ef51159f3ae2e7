/*
 * test_snap: snapshot files — write/commit/load, the chunked writer and
 * reader on a multi-MiB snapshot, CRC checks (header, conf, data, size),
 * retention, temp files left by a crash, and the start-up choice when the
 * newest snapshot is corrupt, alone and together with a real WAL.
 */
#include "common/util.h"
#include "meta/snap.h"
#include "unit/test_wal_util.h"

static void write_snap(const char *dir, uint64_t index, uint64_t term, const char *conf,
		       size_t data_len, unsigned keep)
{
	struct snap_meta m = {index, term, (const uint8_t *)conf, conf ? strlen(conf) : 0};
	struct snap_writer *wr;
	cr_assert_eq(snap_writer_open(dir, &m, &wr), 0);
	uint8_t buf[4096];
	for (size_t off = 0; off < data_len;) {
		size_t n = MC_MIN(sizeof(buf), data_len - off);
		for (size_t i = 0; i < n; i++)
			buf[i] = (uint8_t)((off + i) * 7 + index);
		cr_assert_eq(snap_writer_write(wr, buf, n), 0);
		off += n;
	}
	cr_assert_eq(snap_writer_bytes(wr), data_len);
	cr_assert_eq(snap_writer_commit(wr, keep), 0);
}

static void snap_path(char *buf, size_t len, const char *dir, uint64_t index, uint64_t term)
{
	snprintf(buf, len, "%s/%016" PRIx64 "-%016" PRIx64 ".snap", dir, index, term);
}

static void flip(const char *path, long off)
{
	FILE *f = fopen(path, "r+b");
	cr_assert_not_null(f);
	if (off < 0) {
		fseek(f, 0, SEEK_END);
		off += ftell(f);
	}
	fseek(f, off, SEEK_SET);
	int c = fgetc(f);
	fseek(f, off, SEEK_SET);
	fputc(c ^ 0x40, f);
	fclose(f);
}

static int accept_all(void *ctx, uint64_t index, uint64_t term)
{
	(void)ctx;
	(void)index;
	(void)term;
	return 0;
}

/* Accept snapshots at or above *(uint64_t *)ctx. */
static int accept_from(void *ctx, uint64_t index, uint64_t term)
{
	(void)term;
	return index >= *(uint64_t *)ctx ? 0 : -ENOENT;
}

Test(snap, write_commit_load)
{
	char *dir = tu_tmpdir();
	write_snap(dir, 100, 3, "voters=1,2,3", 10000, 3);
	char path[PATH_MAX];
	snap_path(path, sizeof(path), dir, 100, 3);
	cr_assert_eq(access(path, F_OK), 0);
	struct snap_info info;
	cr_assert_eq(snap_load_newest(dir, accept_all, NULL, &info), 0);
	cr_assert_eq(info.index, 100);
	cr_assert_eq(info.term, 3);
	cr_assert_eq(info.data_bytes, 10000);
	cr_assert_eq(info.conf_len, strlen("voters=1,2,3"));
	cr_assert_eq(memcmp(info.conf, "voters=1,2,3", info.conf_len), 0);
	cr_assert_str_eq(info.path, path);
	snap_info_close(&info);
	/* No temp file left behind. */
	DIR *d = opendir(dir);
	struct dirent *de;
	int files = 0;
	while ((de = readdir(d)))
		if (de->d_name[0] != '.')
			files++;
	closedir(d);
	cr_assert_eq(files, 1);
	tu_cleanup(dir);
}

Test(snap, empty_dir_and_missing_dir)
{
	char *dir = tu_tmpdir();
	struct snap_info info;
	cr_assert_eq(snap_load_newest(dir, accept_all, NULL, &info), 0);
	cr_assert_eq(info.index, 0);
	cr_assert_null(info.path);
	uint64_t zero = 1;
	cr_assert_eq(snap_load_newest(dir, accept_from, &zero, &info), -ENOENT);
	char sub[PATH_MAX];
	snprintf(sub, sizeof(sub), "%s/nope", dir);
	cr_assert_eq(snap_load_newest(sub, accept_all, NULL, &info), 0);
	uint64_t oldest = 7;
	cr_assert_eq(snap_oldest_index(sub, &oldest), 0);
	cr_assert_eq(oldest, 0);
	tu_cleanup(dir);
}

Test(snap, chunked_writer_and_reader_multi_mib, .timeout = 60)
{
	char *dir = tu_tmpdir();
	size_t total = 9 * 1024 * 1024 + 12345;
	uint8_t *data = malloc(total);
	srand(7);
	for (size_t i = 0; i < total; i++)
		data[i] = (uint8_t)rand();
	/* The receiving side: chunks of random sizes, in order. */
	uint8_t conf[1000];
	for (size_t i = 0; i < sizeof(conf); i++)
		conf[i] = (uint8_t)(i ^ 0x3c);
	struct snap_meta m = {5000, 9, conf, sizeof(conf)};
	struct snap_writer *wr;
	cr_assert_eq(snap_writer_open(dir, &m, &wr), 0);
	snap_writer_pace(wr); /* as a member's own snapshots are written */
	/* Chunks small enough to be buffered, and larger than a step to
	 * disk (written straight through, a step at a time). */
	for (size_t off = 0; off < total;) {
		size_t n = 1 + (size_t)rand() % (3 << 20);
		if (n > total - off)
			n = total - off;
		cr_assert_eq(snap_writer_bytes(wr), off);
		cr_assert_eq(snap_writer_write(wr, data + off, n), 0);
		off += n;
	}
	cr_assert_eq(snap_writer_commit(wr, 2), 0);

	/* The sending side: stream it back in chunks of other sizes. */
	char path[PATH_MAX];
	snap_path(path, sizeof(path), dir, 5000, 9);
	struct snap_reader *r;
	struct snap_info info;
	cr_assert_eq(snap_reader_open(path, &r, &info), 0);
	cr_assert_eq(info.data_bytes, total);
	cr_assert_eq(info.conf_len, sizeof(conf));
	cr_assert_eq(memcmp(info.conf, conf, sizeof(conf)), 0);
	uint8_t *back = malloc(total);
	size_t got = 0, n;
	uint8_t chunk[300000];
	do {
		size_t want = 1 + (size_t)rand() % sizeof(chunk);
		cr_assert_eq(snap_reader_read(r, chunk, want, &n), 0);
		cr_assert_leq(got + n, total);
		memcpy(back + got, chunk, n);
		got += n;
	} while (n > 0);
	cr_assert_eq(got, total);
	cr_assert_eq(memcmp(back, data, total), 0);
	snap_reader_close(r);
	snap_info_close(&info);
	cr_assert_eq(snap_verify(path, NULL), 0);
	free(back);
	free(data);
	tu_cleanup(dir);
}

Test(snap, reader_detects_corruption)
{
	char *dir = tu_tmpdir();
	write_snap(dir, 10, 1, "conf", 50000, 5);
	char path[PATH_MAX], copy[PATH_MAX];
	snap_path(path, sizeof(path), dir, 10, 1);
	snprintf(copy, sizeof(copy), "%s/copy", dir);
	size_t len;
	char *orig = tu_read_file(path, &len);
	struct snap_reader *r;
	/* data byte: only seen at the end of the stream */
	tu_write_file(copy, orig, len);
	flip(copy, -100);
	cr_assert_eq(snap_reader_open(copy, &r, NULL), 0);
	uint8_t buf[8192];
	size_t n;
	int rc;
	do
		rc = snap_reader_read(r, buf, sizeof(buf), &n);
	while (rc == 0 && n > 0);
	cr_assert_eq(rc, -EBADMSG);
	snap_reader_close(r);
	cr_assert_eq(tu_log_count(dir, "copy: corrupt snapshot: data CRC "
				       "mismatch"),
		     1);
	/* header, conf, size */
	long offs[] = {20, 64 + 1};
	const char *whys[] = {"header CRC mismatch", "conf state CRC mismatch"};
	for (int i = 0; i < 2; i++) {
		tu_write_file(copy, orig, len);
		flip(copy, offs[i]);
		cr_assert_eq(snap_reader_open(copy, &r, NULL), -EBADMSG);
		cr_assert_eq(tu_log_count(dir, whys[i]), 1);
	}
	tu_write_file(copy, orig, len - 1);
	cr_assert_eq(snap_reader_open(copy, &r, NULL), -EBADMSG);
	cr_assert_eq(tu_log_count(dir, "file size does not match"), 1);
	tu_write_file(copy, orig, 30);
	cr_assert_eq(snap_verify(copy, NULL), -EBADMSG);
	tu_write_file(copy,
		      "not a snapshot at all, but long enough to hold a "
		      "header of sixty-four bytes.....",
		      80);
	cr_assert_eq(snap_verify(copy, NULL), -EBADMSG);
	cr_assert_eq(tu_log_count(dir, "bad magic"), 1);
	free(orig);
	tu_cleanup(dir);
}

Test(snap, keep_last_k)
{
	char *dir = tu_tmpdir();
	for (uint64_t i = 1; i <= 6; i++)
		write_snap(dir, i * 100, 1, NULL, 100, 3);
	for (uint64_t i = 1; i <= 6; i++) {
		char path[PATH_MAX];
		snap_path(path, sizeof(path), dir, i * 100, 1);
		cr_assert_eq(access(path, F_OK) == 0, i >= 4, "snapshot %" PRIu64, i * 100);
	}
	uint64_t oldest;
	cr_assert_eq(snap_oldest_index(dir, &oldest), 0);
	cr_assert_eq(oldest, 400);
	cr_assert_eq(snap_purge(dir, 1), 0);
	cr_assert_eq(snap_oldest_index(dir, &oldest), 0);
	cr_assert_eq(oldest, 600);
	/* Purged ones are set aside until removed. */
	char del[PATH_MAX + 8];
	snap_path(del, sizeof(del) - 8, dir, 100, 1);
	strcat(del, ".del");
	cr_assert_eq(access(del, F_OK), 0);
	unsigned removed;
	cr_assert_eq(snap_remove_purged(dir, &removed), 0);
	cr_assert_eq(removed, 5);
	cr_assert_neq(access(del, F_OK), 0);
	for (uint64_t i = 1; i <= 6; i++) {
		char path[PATH_MAX];
		snap_path(path, sizeof(path), dir, i * 100, 1);
		cr_assert_eq(access(path, F_OK) == 0, i == 6, "snapshot %" PRIu64, i * 100);
	}
	cr_assert_eq(snap_remove_purged(dir, &removed), 0);
	cr_assert_eq(removed, 0);
	tu_cleanup(dir);
}

Test(snap, temp_files_ignored_and_cleaned)
{
	char *dir = tu_tmpdir();
	write_snap(dir, 100, 1, NULL, 1000, 3);
	/* A crash mid-write leaves a temp file of a newer snapshot. */
	struct snap_meta m = {200, 1, NULL, 0};
	struct snap_writer *wr;
	cr_assert_eq(snap_writer_open(dir, &m, &wr), 0);
	cr_assert_eq(snap_writer_write(wr, "partial", 7), 0);
	char tmp[PATH_MAX];
	snprintf(tmp, sizeof(tmp), "%s/00000000000000c8-0000000000000001.snap.999.0.tmp", dir);
	tu_write_file(tmp, "junk", 4);
	struct snap_info info;
	cr_assert_eq(snap_load_newest(dir, accept_all, NULL, &info), 0);
	cr_assert_eq(info.index, 100);
	snap_info_close(&info);
	cr_assert_eq(access(tmp, F_OK), -1);
	cr_assert_eq(tu_log_count(dir, "removed 2 temp files"), 1);
	snap_writer_abort(wr); /* its temp file is already gone: harmless */
	tu_cleanup(dir);
}

Test(snap, abort_removes_temp)
{
	char *dir = tu_tmpdir();
	struct snap_meta m = {5, 1, NULL, 0};
	struct snap_writer *wr;
	cr_assert_eq(snap_writer_open(dir, &m, &wr), 0);
	cr_assert_eq(snap_writer_write(wr, "abc", 3), 0);
	snap_writer_abort(wr);
	DIR *d = opendir(dir);
	struct dirent *de;
	while ((de = readdir(d)))
		cr_assert(de->d_name[0] == '.', "left %s", de->d_name);
	closedir(d);
	struct snap_meta bad = {0, 1, NULL, 0};
	cr_assert_eq(snap_writer_open(dir, &bad, &wr), -EINVAL);
	tu_cleanup(dir);
}

Test(snap, corrupt_newest_falls_back_when_covered)
{
	char *dir = tu_tmpdir();
	write_snap(dir, 100, 1, "a", 5000, 3);
	write_snap(dir, 200, 2, "b", 5000, 3);
	char newest[PATH_MAX];
	snap_path(newest, sizeof(newest), dir, 200, 2);
	flip(newest, -10);
	struct snap_info info;
	uint64_t from = 100; /* the WAL still holds entries after 100 */
	cr_assert_eq(snap_load_newest(dir, accept_from, &from, &info), 0);
	cr_assert_eq(info.index, 100);
	cr_assert_eq(info.conf[0], 'a');
	snap_info_close(&info);
	cr_assert_eq(tu_log_count(dir, "skipping corrupt snapshot"), 1);
	char broken[PATH_MAX + 16];
	snprintf(broken, sizeof(broken), "%s.broken", newest);
	cr_assert_eq(access(broken, F_OK), 0);
	cr_assert_eq(access(newest, F_OK), -1);
	/* Next start: the set-aside file is not looked at again. */
	cr_assert_eq(snap_load_newest(dir, accept_from, &from, &info), 0);
	cr_assert_eq(info.index, 100);
	snap_info_close(&info);
	tu_cleanup(dir);
}

Test(snap, corrupt_newest_is_error_when_not_covered)
{
	char *dir = tu_tmpdir();
	write_snap(dir, 100, 1, "a", 5000, 3);
	write_snap(dir, 200, 2, "b", 5000, 3);
	char newest[PATH_MAX];
	snap_path(newest, sizeof(newest), dir, 200, 2);
	flip(newest, 70);
	struct snap_info info;
	uint64_t from = 150; /* the WAL was released past 100 */
	cr_assert_eq(snap_load_newest(dir, accept_from, &from, &info), -EBADMSG);
	cr_assert_eq(info.index, 0);
	cr_assert_eq(tu_log_count(dir, "is corrupt and the WAL cannot "
				       "continue"),
		     1);
	cr_assert_eq(access(newest, F_OK), 0); /* left for the operator */
	tu_cleanup(dir);
}

Test(snap, only_snapshot_corrupt)
{
	char *dir = tu_tmpdir();
	write_snap(dir, 100, 1, "a", 5000, 3);
	char path[PATH_MAX];
	snap_path(path, sizeof(path), dir, 100, 1);
	flip(path, -1);
	struct snap_info info;
	uint64_t from = 1; /* WAL released: nothing to start from */
	cr_assert_eq(snap_load_newest(dir, accept_from, &from, &info), -EBADMSG);
	/* The WAL still holds everything from index 1: start from zero. */
	cr_assert_eq(snap_load_newest(dir, accept_all, NULL, &info), 0);
	cr_assert_eq(info.index, 0);
	tu_cleanup(dir);
}

Test(snap, name_and_header_must_agree)
{
	char *dir = tu_tmpdir();
	write_snap(dir, 100, 1, NULL, 10, 3);
	char a[PATH_MAX], b[PATH_MAX];
	snap_path(a, sizeof(a), dir, 100, 1);
	snap_path(b, sizeof(b), dir, 900, 1);
	cr_assert_eq(rename(a, b), 0);
	struct snap_info info;
	cr_assert_eq(snap_load_newest(dir, accept_all, NULL, &info), 0);
	cr_assert_eq(info.index, 0); /* the misnamed file is not used */
	cr_assert_eq(tu_log_count(dir, "header says index 100"), 1);
	tu_cleanup(dir);
}

/* The start-up sequence with a real WAL: snapshot 3500 corrupt, 2000
 * valid, the WAL released only up to 2000 → fall back; released past
 * 2000 → error. */
static int accept_wal(void *ctx, uint64_t index, uint64_t term)
{
	return wal_recovery_check_start(ctx, index, term);
}

static void startup_case(bool release_far)
{
	char *dir = tu_tmpdir();
	char wdir[1024], sdir[1024];
	snprintf(wdir, sizeof(wdir), "%s/wal", dir);
	snprintf(sdir, sizeof(sdir), "%s/snap", dir);
	struct wal_options o = {.segment_bytes = 64 << 10, .create = true};
	struct wal *w;
	struct wal_recovery rec;
	cr_assert_eq(wal_open(wdir, &o, &w, &rec), 0);
	struct wal_hard_state hs = {.term = 1};
	for (uint64_t i = 1; i <= 4000; i += 100) {
		hs.commit = i + 99;
		cr_assert_eq(tu_save(w, i, 100, 1, &hs, true), 0);
		if (i + 99 == 2000 || i + 99 == 3500) {
			write_snap(sdir, i + 99, 1, "c", 3000, 2);
			struct wal_snap_ref s = {i + 99, 1};
			cr_assert_eq(wal_save_snapshot(w, s, true), 0);
			uint64_t oldest;
			cr_assert_eq(snap_oldest_index(sdir, &oldest), 0);
			cr_assert_eq(wal_release_to(w, release_far ? i + 99 : oldest), 0);
		}
	}
	wal_close(w);
	wal_recovery_close(&rec);
	char newest[PATH_MAX];
	snap_path(newest, sizeof(newest), sdir, 3500, 1);
	flip(newest, -1);

	cr_assert_eq(wal_open(wdir, &o, &w, &rec), 0);
	struct snap_info info;
	int rc = snap_load_newest(sdir, accept_wal, &rec, &info);
	if (release_far) {
		cr_assert_eq(rc, -EBADMSG);
	} else {
		cr_assert_eq(rc, 0);
		cr_assert_eq(info.index, 2000);
		cr_assert_eq(wal_start_at(w, &rec, info.index, info.term), 0);
		cr_assert_eq(rec.n_ents, 2000);
		cr_assert_eq(rec.ents[0].index, 2001);
		cr_assert_eq(rec.hs.commit, 4000);
		snap_info_close(&info);
	}
	wal_close(w);
	wal_recovery_close(&rec);
	tu_cleanup(dir);
}

Test(snap, startup_with_wal_falls_back)
{
	startup_case(false);
}

Test(snap, startup_with_wal_released_too_far)
{
	startup_case(true);
}
