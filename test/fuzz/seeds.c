/*
 * seeds: writes the seed corpora of fuzz_wal and fuzz_mvcc_snapshot with
 * the project's own writers, so that their replay in `make test` starts
 * from valid inputs and reaches past the first checks. `make fuzz-seeds`
 * runs it into test/fuzz/corpus/; the files are committed. The data is
 * fixed; only the WAL's id (random per WAL, the seed of its CRCs) differs
 * from run to run.
 *
 *   fuzz_wal: real segment files written by wal_save/wal_save_snapshot
 *   (mode byte 0x80: a whole last segment), the same segments' record
 *   areas behind mode 1, and a record program for mode 2;
 *   fuzz_mvcc_snapshot: mvcc_snapshot of stores built with puts,
 *   overwrites, deletes, a txn, leases and a compaction, each as it is
 *   (mode byte 0) and with the CRC recomputed (mode byte 1).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "meta/lease.h"
#include "meta/mvcc.h"
#include "meta/wal.h"
#include "meta/wal_int.h"

#define MIN_REC(n) ((n) > 4096 ? 4096 : (n))

static int fail(const char *what, int rc)
{
	fprintf(stderr, "fuzz-seeds: %s: %s\n", what, strerror(rc < 0 ? -rc : rc));
	return 1;
}

/* out/<name>: one mode byte, then len bytes of data. */
static int put_file(const char *dir, const char *name, uint8_t mode, const void *data,
		    size_t len)
{
	char path[4096];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	FILE *f = fopen(path, "wb");
	if (!f)
		return fail(path, errno);
	bool ok = fwrite(&mode, 1, 1, f) == 1 && fwrite(data, 1, len, f) == len;
	if (fclose(f) != 0 || !ok)
		return fail(path, EIO);
	return 0;
}

static uint8_t *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
	if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
		free(buf);
		buf = NULL;
	}
	fclose(f);
	*len = (size_t)n;
	return buf;
}

/* ------------------------------------------------------------ WAL */

/* A log of entries, hard states and a snapshot marker, overwritten at
 * the tail once (a new leader's entries), in segments of 64 KiB. */
static int write_wal(const char *dir)
{
	struct wal_options o = {.segment_bytes = 64 << 10, .no_prealloc = true, .create = true};
	struct wal *w;
	struct wal_recovery rec = {0};
	int rc = wal_open(dir, &o, &w, &rec);
	if (rc)
		return fail("wal_open", rc);
	wal_recovery_close(&rec);
	uint8_t data[3000];
	for (uint64_t i = 1; i <= 80 && rc == 0; i++) {
		size_t n = (size_t)(i * 73 % sizeof(data));
		for (size_t k = 0; k < n; k++)
			data[k] = (uint8_t)(i * 31 + k);
		struct wal_entry e = {.index = i, .term = 1 + i / 16, .type = (uint32_t)(i % 3),
				      .data = data, .len = n};
		struct wal_hard_state hs = {.term = e.term, .vote = 1, .commit = i - 1};
		rc = wal_save(w, &hs, &e, 1, i % 8 == 0);
		if (rc == 0 && i == 40)
			rc = wal_save_snapshot(w, (struct wal_snap_ref){.index = 38, .term = 3},
					       false);
	}
	if (rc == 0) { /* a new leader replaces the last five entries */
		struct wal_entry e[5];
		for (int k = 0; k < 5; k++)
			e[k] = (struct wal_entry){.index = 76 + (uint64_t)k, .term = 7,
						  .type = 0, .data = data, .len = 100};
		struct wal_hard_state hs = {.term = 7, .vote = 2, .commit = 75};
		rc = wal_save(w, &hs, e, 5, true);
	}
	if (rc == 0)
		rc = wal_sync(w);
	wal_close(w);
	return rc ? fail("wal_save", rc) : 0;
}

static int by_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static int wal_seeds(const char *tmp, const char *out)
{
	char dir[4096];
	snprintf(dir, sizeof(dir), "%s/wal", tmp);
	if (mkdir(dir, 0700) != 0)
		return fail(dir, errno);
	if (write_wal(dir))
		return 1;
	DIR *d = opendir(dir);
	if (!d)
		return fail(dir, errno);
	char *names[64];
	size_t n = 0;
	for (struct dirent *de; (de = readdir(d)) && n < 64;)
		if (strstr(de->d_name, ".wal"))
			names[n++] = strdup(de->d_name);
	closedir(d);
	qsort(names, n, sizeof(names[0]), by_name);
	int rc = n == 0 ? fail("no WAL segment written", ENOENT) : 0;
	for (size_t i = 0; i < n && rc == 0; i++) {
		char path[8192], name[300];
		size_t len;
		snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
		uint8_t *buf = slurp(path, &len);
		if (!buf || len < WAL__SEG_HDR_BYTES) {
			rc = fail(path, EIO);
			break;
		}
		/* The last segment may end torn; the others may not. */
		uint8_t last = i + 1 == n ? 0x80 : 0x00;
		snprintf(name, sizeof(name), "segment-%zu", i);
		rc = put_file(out, name, last, buf, len);
		/* Mode 1: the record area behind a header fuzz_wal makes. The
		 * records keep this segment's CRC seed, so past the first
		 * record they read as corruption: the error paths. */
		snprintf(name, sizeof(name), "records-%zu", i);
		if (rc == 0)
			rc = put_file(out, name, 0x81, buf + WAL__SEG_HDR_BYTES,
				      MIN_REC(len - WAL__SEG_HDR_BYTES));
		free(buf);
	}
	/* Mode 2: a record program — entries, a term bump, a hard state, a
	 * marker, an overwrite, a new write group, one damaged byte. */
	static const uint8_t prog[] = {
		0x00, 8, 0x00, 16, 0x40, 4, 0x10, 1, 30, 0x01, 1, 0, 0, 0, 0, 0, 0, 0,
		1,    0, 0,    0,  0,    0, 0,    0, 2,  0,    0, 0, 0, 0, 0, 0, 0x02,
		1,    1, 1,    0x20, 2,  12, 0x40, 40, 0x03, 0x44, 0x00};
	if (rc == 0)
		rc = put_file(out, "program", 0x82, prog, sizeof(prog));
	if (rc == 0)
		rc = put_file(out, "program-clean", 0x82, prog, sizeof(prog) - 4);
	for (size_t i = 0; i < n; i++) {
		char path[8192];
		snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
		unlink(path);
		free(names[i]);
	}
	char lock[4200];
	snprintf(lock, sizeof(lock), "%s/LOCK", dir);
	unlink(lock);
	rmdir(dir);
	return rc;
}

/* ------------------------------------------------------------ MVCC */

struct sink {
	uint8_t *p;
	size_t len, cap;
};

static int sink_write(void *ctx, const void *data, size_t len)
{
	struct sink *k = ctx;
	if (k->len + len > k->cap) {
		size_t cap = k->cap ? k->cap * 2 : 4096;
		while (cap < k->len + len)
			cap *= 2;
		uint8_t *p = realloc(k->p, cap);
		if (!p)
			return -ENOMEM;
		k->p = p;
		k->cap = cap;
	}
	memcpy(k->p + k->len, data, len);
	k->len += len;
	return 0;
}

static int put(struct mvcc_store *s, const char *key, const char *value, int64_t lease)
{
	struct mvcc_op o = {.type = MVCC_OP_PUT};
	o.u.put = (struct mvcc_put_req){.key = key, .key_len = strlen(key), .value = value,
					.value_len = strlen(value), .lease = lease};
	struct mvcc_result r;
	int rc = mvcc_apply(s, &o, &r);
	if (rc == 0)
		mvcc_result_free(&r);
	return rc;
}

static int del(struct mvcc_store *s, const char *key, const char *end)
{
	struct mvcc_op o = {.type = MVCC_OP_DELETE_RANGE};
	o.u.del = (struct mvcc_delete_req){.key = key, .key_len = strlen(key), .range_end = end,
					   .range_end_len = end ? strlen(end) : 0};
	struct mvcc_result r;
	int rc = mvcc_apply(s, &o, &r);
	if (rc == 0)
		mvcc_result_free(&r);
	return rc;
}

/* A txn: if /seg/a's version is 2, put /txn/yes and delete /seg/b. */
static int txn(struct mvcc_store *s)
{
	struct mvcc_compare c = {.result = MVCC_CMP_EQUAL, .target = MVCC_TARGET_VERSION,
				 .key = "/seg/a", .key_len = 6, .number = 2};
	struct mvcc_op ops[2] = {{.type = MVCC_OP_PUT}, {.type = MVCC_OP_DELETE_RANGE}};
	ops[0].u.put = (struct mvcc_put_req){.key = "/txn/yes", .key_len = 8, .value = "1",
					     .value_len = 1};
	ops[1].u.del = (struct mvcc_delete_req){.key = "/seg/b", .key_len = 6};
	struct mvcc_op o = {.type = MVCC_OP_TXN};
	o.u.txn = (struct mvcc_txn_req){.compare = &c, .ncompare = 1, .success = ops,
					.nsuccess = 2};
	struct mvcc_result r;
	int rc = mvcc_apply(s, &o, &r);
	if (rc == 0)
		mvcc_result_free(&r);
	return rc;
}

static int snapshot_to(const struct mvcc_store *s, const char *out, const char *name)
{
	struct sink k = {0};
	int rc = mvcc_snapshot(s, sink_write, &k);
	if (rc)
		return fail("mvcc_snapshot", rc);
	struct mvcc_store *back; /* a seed the decoder refuses tests little */
	if ((rc = mvcc_restore(NULL, k.p, k.len, &back)) != 0) {
		free(k.p);
		return fail("mvcc_restore of a fresh snapshot", rc);
	}
	mvcc_free(back);
	char crc_name[256];
	snprintf(crc_name, sizeof(crc_name), "%s-crc", name);
	rc = put_file(out, name, 0, k.p, k.len);
	if (rc == 0)
		rc = put_file(out, crc_name, 1, k.p, k.len);
	free(k.p);
	return rc;
}

static int mvcc_seeds(const char *out)
{
	struct mvcc_store *s;
	int rc = mvcc_new(NULL, &s);
	if (rc)
		return fail("mvcc_new", rc);
	if ((rc = snapshot_to(s, out, "empty")))
		goto out;
	int64_t l1, l2;
	rc = lease_grant(mvcc_leases(s), 7, 30, 0, &l1, NULL);
	if (rc == 0)
		rc = lease_grant(mvcc_leases(s), 8, 600, 0, &l2, NULL);
	char key[32], val[64];
	for (int i = 0; rc == 0 && i < 12; i++) {
		snprintf(key, sizeof(key), "/seg/%c", 'a' + i % 6);
		snprintf(val, sizeof(val), "value %d of %s", i, key);
		rc = put(s, key, val, i % 4 == 1 ? l1 : i % 4 == 2 ? l2 : 0);
	}
	if (rc == 0)
		rc = put(s, "/master", "127.0.0.1:50051 3", l2);
	if (rc == 0 && (rc = snapshot_to(s, out, "keys-leases")))
		goto out;
	if (rc == 0)
		rc = del(s, "/seg/e", NULL);
	if (rc == 0)
		rc = txn(s);
	if (rc == 0 && (rc = snapshot_to(s, out, "history")))
		goto out;
	if (rc == 0)
		rc = mvcc_compact(s, mvcc_rev(s) - 2);
	if (rc == 0)
		rc = mvcc_lease_revoke(s, l1, NULL);
	if (rc == 0)
		rc = del(s, "/seg/", "/seg0");
	if (rc == 0)
		rc = snapshot_to(s, out, "compacted");
	else
		rc = fail("building the store", rc);
out:
	mvcc_free(s);
	return rc;
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s CORPUS-DIR   (writes fuzz_wal/ and "
				"fuzz_mvcc_snapshot/ under it)\n",
			argv[0]);
		return 2;
	}
	char tmp[] = "/tmp/fuzz-seeds-XXXXXX", wal[4096], snap[4096];
	if (!mkdtemp(tmp))
		return fail("mkdtemp", errno);
	snprintf(wal, sizeof(wal), "%s/fuzz_wal", argv[1]);
	snprintf(snap, sizeof(snap), "%s/fuzz_mvcc_snapshot", argv[1]);
	mkdir(wal, 0755);
	mkdir(snap, 0755);
	int rc = wal_seeds(tmp, wal);
	if (rc == 0)
		rc = mvcc_seeds(snap);
	rmdir(tmp);
	return rc;
}
