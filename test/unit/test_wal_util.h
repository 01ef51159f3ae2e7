/*
 * test_wal_util: helpers shared by the WAL and snapshot tests — temp
 * directories, file surgery, log capture, deterministic entry data and a
 * reference model of the Raft log. Header-only (each test file is its own
 * binary).
 */
#ifndef TEST_WAL_TEST_UTIL_H
#define TEST_WAL_TEST_UTIL_H

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "meta/wal.h"

static int tu_rm_cb(const char *p, const struct stat *st, int flag, struct FTW *f)
{
	(void)st;
	(void)flag;
	(void)f;
	return remove(p);
}

static inline void tu_rm_rf(const char *path)
{
	nftw(path, tu_rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

/* A fresh directory under $TMPDIR (or /tmp); the log goes to <dir>.log. */
static inline char *tu_tmpdir(void)
{
	const char *base = getenv("TMPDIR");
	char *p;
	cr_assert(asprintf(&p, "%s/mcwal.XXXXXX", base ? base : "/tmp") > 0);
	cr_assert_not_null(mkdtemp(p));
	char log[PATH_MAX];
	snprintf(log, sizeof(log), "%s.log", p);
	cr_assert_eq(log_open_file(log), 0);
	return p;
}

static inline void tu_cleanup(char *dir)
{
	char log[PATH_MAX];
	snprintf(log, sizeof(log), "%s.log", dir);
	cr_assert_eq(log_open_file(NULL), 0);
	unlink(log);
	tu_rm_rf(dir);
	free(dir);
}

static inline char *tu_read_file(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *buf = malloc((size_t)n + 1);
	cr_assert_not_null(buf);
	cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
	buf[n] = 0;
	fclose(f);
	if (len)
		*len = (size_t)n;
	return buf;
}

static inline void tu_write_file(const char *path, const void *data, size_t len)
{
	FILE *f = fopen(path, "wb");
	cr_assert_not_null(f, "%s: %s", path, strerror(errno));
	cr_assert_eq(fwrite(data, 1, len, f), len);
	cr_assert_eq(fclose(f), 0);
}

/* Count of occurrences of needle in the test's log so far. */
static inline int tu_log_count(const char *dir, const char *needle)
{
	char log[PATH_MAX];
	snprintf(log, sizeof(log), "%s.log", dir);
	char *s = tu_read_file(log, NULL);
	if (!s)
		return 0;
	int n = 0;
	for (char *p = s; (p = strstr(p, needle)); p++)
		n++;
	free(s);
	return n;
}

/* Truncate the test's log (to look at one step's lines). */
static inline void tu_log_reset(const char *dir)
{
	char log[PATH_MAX];
	snprintf(log, sizeof(log), "%s.log", dir);
	cr_assert_eq(truncate(log, 0), 0);
}

/* Copy every regular file of dir `from` into the empty dir `to`. */
static inline void tu_copy_dir(const char *from, const char *to)
{
	DIR *d = opendir(from);
	cr_assert_not_null(d);
	struct dirent *de;
	while ((de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		char a[PATH_MAX], b[PATH_MAX];
		snprintf(a, sizeof(a), "%s/%s", from, de->d_name);
		snprintf(b, sizeof(b), "%s/%s", to, de->d_name);
		size_t n;
		char *data = tu_read_file(a, &n);
		cr_assert_not_null(data);
		tu_write_file(b, data, n);
		free(data);
	}
	closedir(d);
}

/* Sorted list of segment file names in dir (caller frees each and the
 * array). */
static int tu_name_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static inline char **tu_segments(const char *dir, size_t *n)
{
	DIR *d = opendir(dir);
	cr_assert_not_null(d);
	char **v = NULL;
	size_t k = 0;
	struct dirent *de;
	while ((de = readdir(d))) {
		size_t l = strlen(de->d_name);
		if (l < 4 || strcmp(de->d_name + l - 4, ".wal") != 0)
			continue;
		v = realloc(v, (k + 1) * sizeof(*v));
		v[k++] = strdup(de->d_name);
	}
	closedir(d);
	if (k)
		qsort(v, k, sizeof(*v), tu_name_cmp);
	*n = k;
	return v;
}

static inline void tu_free_names(char **v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(v[i]);
	free(v);
}

static inline uint64_t tu_file_size(const char *path)
{
	struct stat st;
	cr_assert_eq(stat(path, &st), 0, "%s", path);
	return (uint64_t)st.st_size;
}

/* ------------------------------------------------------------ entries */

/* Deterministic data for (index, term): 0..199 bytes, mostly non-zero. */
static inline size_t tu_data_len(uint64_t index, uint64_t term)
{
	return (size_t)((index * 7 + term * 13) % 200);
}

static inline void tu_fill(uint8_t *buf, uint64_t index, uint64_t term, size_t len)
{
	for (size_t i = 0; i < len; i++)
		buf[i] = (uint8_t)(1 + (index * 31 + term * 17 + i * 7) % 251);
}

/* An entry batch with generated data (one buffer per batch). */
struct tu_batch {
	struct wal_entry ents[256];
	uint8_t *bufs[256];
	size_t n;
};

static inline void tu_batch_make(struct tu_batch *b, uint64_t first, size_t n, uint64_t term)
{
	cr_assert(n <= 256);
	b->n = n;
	for (size_t k = 0; k < n; k++) {
		uint64_t idx = first + k;
		size_t len = tu_data_len(idx, term);
		b->bufs[k] = malloc(len ? len : 1);
		tu_fill(b->bufs[k], idx, term, len);
		b->ents[k] = (struct wal_entry){idx, term, (uint32_t)(idx % 3), b->bufs[k],
						len};
	}
}

static inline void tu_batch_free(struct tu_batch *b)
{
	for (size_t k = 0; k < b->n; k++)
		free(b->bufs[k]);
	b->n = 0;
}

/* Save entries [first, first+n) with term, then the hard state. */
static inline int tu_save(struct wal *w, uint64_t first, size_t n, uint64_t term,
			  const struct wal_hard_state *hs, bool sync)
{
	struct tu_batch b;
	tu_batch_make(&b, first, n, term);
	int rc = wal_save(w, hs, b.ents, n, sync);
	tu_batch_free(&b);
	return rc;
}

/* ------------------------------------------------------------ model */

#define TU_MODEL_MAX 100000

/* The expected log: terms of [first, last]. */
struct tu_model {
	uint64_t first;
	uint64_t last;
	uint64_t *terms;
};

static inline void tu_model_init(struct tu_model *m)
{
	m->first = 1;
	m->last = 0;
	m->terms = calloc(TU_MODEL_MAX, sizeof(uint64_t));
}

static inline void tu_model_append(struct tu_model *m, uint64_t first, size_t n, uint64_t term)
{
	cr_assert(first >= m->first && first <= m->last + 1);
	for (size_t k = 0; k < n; k++)
		m->terms[first + k - m->first] = term;
	m->last = first + n - 1;
}

/* Check that rec holds exactly the model's entries (with their data). */
static inline void tu_check(const struct wal_recovery *rec, const struct tu_model *m)
{
	cr_assert_eq(rec->n_ents, m->last + 1 - m->first,
		     "recovered %zu entries, expected %" PRIu64, rec->n_ents,
		     m->last + 1 - m->first);
	uint8_t buf[256];
	for (size_t k = 0; k < rec->n_ents; k++) {
		const struct wal_entry *e = &rec->ents[k];
		uint64_t idx = m->first + k;
		uint64_t term = m->terms[k];
		cr_assert_eq(e->index, idx, "entry %zu has index %" PRIu64, k, e->index);
		cr_assert_eq(e->term, term, "entry %" PRIu64 " term %" PRIu64 " want %" PRIu64,
			     idx, e->term, term);
		cr_assert_eq(e->type, (uint32_t)(idx % 3));
		size_t len = tu_data_len(idx, term);
		cr_assert_eq(e->len, len, "entry %" PRIu64 " len", idx);
		tu_fill(buf, idx, term, len);
		cr_assert(len == 0 || memcmp(e->data, buf, len) == 0,
			  "entry %" PRIu64 " data differs", idx);
	}
}

#endif
