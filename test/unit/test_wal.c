/*
 * test_wal: the WAL's save and recovery paths — round trips over many
 * batches and restarts against a reference model, log overwrite, segment
 * rollover, release after a snapshot (segments set aside, removed later,
 * and what a crash in between leaves), snapshot markers and start points,
 * group commit (one fsync for many saves), the save-time log rules, the
 * directory lock, and the fatal state after a failed write.
 * Crash and corruption cases are in test_wal_crash.c.
 */
#include <signal.h>
#include <sys/resource.h>

#include "common/metrics.h"
#include "meta/wal_int.h"
#include "unit/test_wal_util.h"

static struct wal_options opts_small(void)
{
	return (struct wal_options){.segment_bytes = 64 << 10, .create = true};
}

static struct wal *open_ok(const char *dir, const struct wal_options *o,
			   struct wal_recovery *rec)
{
	struct wal *w = NULL;
	int rc = wal_open(dir, o, &w, rec);
	cr_assert_eq(rc, 0, "wal_open: %s", mc_strerror(rc));
	return w;
}

Test(wal, open_missing_and_create)
{
	char *dir = tu_tmpdir();
	char sub[PATH_MAX];
	snprintf(sub, sizeof(sub), "%s/wal", dir);
	struct wal *w;
	struct wal_recovery rec;
	struct wal_options o = {0};
	cr_assert_eq(wal_open(sub, &o, &w, &rec), -ENOENT);
	cr_assert_not(wal_exists(sub));
	o.create = true;
	w = open_ok(sub, &o, &rec);
	cr_assert_eq(rec.n_ents, 0);
	cr_assert_eq(rec.hs.term, 0);
	cr_assert_eq(wal_last_index(w), 0);
	wal_close(w);
	wal_recovery_close(&rec);
	cr_assert(wal_exists(sub));
	o.create = false; /* an existing WAL opens without create */
	w = open_ok(sub, &o, &rec);
	wal_close(w);
	wal_recovery_close(&rec);
	tu_cleanup(dir);
}

Test(wal, round_trip_hard_state_and_entries)
{
	char *dir = tu_tmpdir();
	struct wal_options o = opts_small();
	struct wal_recovery rec;
	struct wal *w = open_ok(dir, &o, &rec);
	wal_recovery_close(&rec);
	struct wal_hard_state hs = {.term = 3, .vote = 2, .commit = 7};
	cr_assert_eq(tu_save(w, 1, 10, 3, &hs, true), 0);
	wal_close(w);

	w = open_ok(dir, &o, &rec);
	cr_assert_eq(rec.hs.term, 3);
	cr_assert_eq(rec.hs.vote, 2);
	cr_assert_eq(rec.hs.commit, 7);
	cr_assert_not(rec.tail_truncated);
	struct tu_model m;
	tu_model_init(&m);
	tu_model_append(&m, 1, 10, 3);
	tu_check(&rec, &m);
	cr_assert_eq(wal_last_index(w), 10);
	wal_close(w);
	wal_recovery_close(&rec);
	free(m.terms);
	tu_cleanup(dir);
}

Test(wal, overwrite_at_index_n)
{
	char *dir = tu_tmpdir();
	struct wal_options o = opts_small();
	struct wal_recovery rec;
	struct wal *w = open_ok(dir, &o, &rec);
	struct tu_model m;
	tu_model_init(&m);
	cr_assert_eq(tu_save(w, 1, 10, 1, NULL, true), 0);
	tu_model_append(&m, 1, 10, 1);
	/* A new leader overwrites 5.. with a shorter suffix. */
	cr_assert_eq(tu_save(w, 5, 3, 2, NULL, true), 0);
	tu_model_append(&m, 5, 3, 2);
	cr_assert_eq(wal_last_index(w), 7);
	/* Entry 9 would now be a gap. */
	cr_assert_eq(tu_save(w, 9, 1, 2, NULL, true), -EINVAL);
	wal_close(w);
	wal_recovery_close(&rec);

	w = open_ok(dir, &o, &rec);
	tu_check(&rec, &m);
	/* And once more from the recovered state, then at the very start. */
	cr_assert_eq(tu_save(w, 7, 4, 3, NULL, false), 0);
	tu_model_append(&m, 7, 4, 3);
	cr_assert_eq(tu_save(w, 1, 2, 4, NULL, true), 0);
	tu_model_append(&m, 1, 2, 4);
	wal_close(w);
	wal_recovery_close(&rec);
	w = open_ok(dir, &o, &rec);
	tu_check(&rec, &m);
	cr_assert_eq(m.last, 2);
	wal_close(w);
	wal_recovery_close(&rec);
	free(m.terms);
	tu_cleanup(dir);
}

/* Many random batches with overwrites, random sync flags and restarts;
 * after every restart recovery must equal the model. */
Test(wal, round_trip_many_batches_restarts, .timeout = 120)
{
	char *dir = tu_tmpdir();
	struct wal_options o = opts_small();
	o.buffer_bytes = 4096;
	struct wal_recovery rec;
	struct wal *w = open_ok(dir, &o, &rec);
	wal_recovery_close(&rec);
	struct tu_model m;
	tu_model_init(&m);
	struct wal_hard_state hs = {0};
	uint64_t term = 1;
	srand(42);
	for (int round = 0; round < 12; round++) {
		for (int b = 0; b < 60; b++) {
			uint64_t first = m.last + 1;
			if (m.last >= m.first && rand() % 6 == 0) {
				/* overwrite from a random held index */
				uint64_t span = m.last - m.first + 1;
				first = m.first + (uint64_t)rand() % span;
				term++;
			}
			size_t n = 1 + (size_t)(rand() % 20);
			hs.term = term;
			hs.vote = (uint64_t)(rand() % 3);
			hs.commit = first > 1 ? first - 1 : 0;
			bool sync = rand() % 3 == 0;
			cr_assert_eq(tu_save(w, first, n, term, &hs, sync), 0);
			tu_model_append(&m, first, n, term);
		}
		cr_assert_eq(wal_last_index(w), m.last);
		wal_close(w); /* close syncs what is pending */
		w = open_ok(dir, &o, &rec);
		cr_assert_not(rec.tail_truncated);
		cr_assert_eq(rec.hs.term, hs.term);
		cr_assert_eq(rec.hs.vote, hs.vote);
		cr_assert_eq(rec.hs.commit, hs.commit);
		tu_check(&rec, &m);
		wal_recovery_close(&rec);
	}
	struct wal_stats st;
	wal_get_stats(w, &st);
	cr_assert_gt(st.segments, 3, "expected rollovers, have %" PRIu64, st.segments);
	wal_close(w);
	free(m.terms);
	tu_cleanup(dir);
}

Test(wal, segment_rollover)
{
	char *dir = tu_tmpdir();
	struct wal_options o = opts_small();
	struct wal_recovery rec;
	struct wal *w = open_ok(dir, &o, &rec);
	struct tu_model m;
	tu_model_init(&m);
	struct wal_hard_state hs = {.term = 5, .vote = 1, .commit = 0};
	for (uint64_t i = 1; i <= 3000; i += 100) {
		hs.commit = i - 1;
		cr_assert_eq(tu_save(w, i, 100, 5, &hs, true), 0);
		tu_model_append(&m, i, 100, 5);
	}
	struct wal_stats st;
	wal_get_stats(w, &st);
	wal_close(w);
	wal_recovery_close(&rec);

	size_t n;
	char **names = tu_segments(dir, &n);
	cr_assert_eq(n, st.segments);
	cr_assert_geq(n, 4, "only %zu segments", n);
	uint64_t prev_first = 0;
	for (size_t i = 0; i < n; i++) {
		uint64_t seq, first;
		cr_assert_eq(sscanf(names[i], "%16" SCNx64 "-%16" SCNx64 ".wal", &seq, &first),
			     2);
		cr_assert_eq(seq, i + 1);
		cr_assert_gt(first, prev_first);
		prev_first = first;
		char path[PATH_MAX];
		snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
		/* preallocated (the last record may pass the size) */
		cr_assert_geq(tu_file_size(path), 64 << 10);
	}
	tu_free_names(names, n);

	w = open_ok(dir, &o, &rec);
	tu_check(&rec, &m);
	cr_assert_eq(rec.hs.commit, hs.commit);
	wal_close(w);
	wal_recovery_close(&rec);
	free(m.terms);
	tu_cleanup(dir);
}

Test(wal, entry_larger_than_segment)
{
	char *dir = tu_tmpdir();
	struct wal_options o = opts_small();
	struct wal_recovery rec;
	struct wal *w = open_ok(dir, &o, &rec);
	size_t big = 200 << 10;
	uint8_t *data = malloc(big);
	for (size_t i = 0; i < big; i++)
		data[i] = (uint8_t)(i * 13);
	cr_assert_eq(tu_save(w, 1, 5, 1, NULL, true), 0);
	for (uint64_t i = 6; i <= 8; i++) {
		struct wal_entry e = {i, 1, 0, data, big};
		cr_assert_eq(wal_save(w, NULL, &e, 1, true), 0);
	}
	cr_assert_eq(tu_save(w, 9, 5, 1, NULL, true), 0);
	struct wal_entry huge = {14, 1, 0, data, (size_t)WAL_RECORD_MAX_BYTES};
	cr_assert_eq(wal_save(w, NULL, &huge, 1, true), MC_ETOO_LARGE);
	wal_close(w);
	wal_recovery_close(&rec);
	w = open_ok(dir, &o, &rec);
	cr_assert_eq(rec.n_ents, 13);
	for (int k = 5; k < 8; k++) {
		cr_assert_eq(rec.ents[k].len, big);
		cr_assert_eq(memcmp(rec.ents[k].data, data, big), 0);
	}
	wal_close(w);
	wal_recovery_close(&rec);
	free(data);
	tu_cleanup(dir);
}

Test(wal, release_after_snapshot)
{
	char *dir = tu_tmpdir();
	struct wal_options o = opts_small();
	struct wal_recovery rec;
	struct wal *w = open_ok(dir, &o, &rec);
	struct wal_hard_state hs = {.term = 2, .vote = 1};
	for (uint64_t i = 1; i <= 4000; i += 100) {
		hs.commit = i + 99;
		cr_assert_eq(tu_save(w, i, 100, 2, &hs, i % 500 == 1), 0);
	}
	struct wal_stats st;
	wal_get_stats(w, &st);
	uint64_t before = st.segments;
	cr_assert_gt(before, 5);

	/* Releasing past the newest marker is refused. */
	cr_assert_eq(wal_release_to(w, 10), -EINVAL);
	struct wal_snap_ref snap = {3000, 2};
	cr_assert_eq(wal_save_snapshot(w, snap, false), 0);
	cr_assert_eq(wal_release_to(w, 3000), 0);
	wal_get_stats(w, &st);
	cr_assert_lt(st.segments, before);
	/* What remains starts at or below 3001. */
	size_t n;
	char **names = tu_segments(dir, &n);
	cr_assert_eq(n, st.segments);
	uint64_t seq, first;
	cr_assert_eq(sscanf(names[0], "%16" SCNx64 "-%16" SCNx64, &seq, &first), 2);
	cr_assert_leq(first, 3001);
	cr_assert_gt(seq, 1);
	tu_free_names(names, n);
	/* Keep writing after the release. */
	for (uint64_t i = 4001; i <= 4500; i += 100)
		cr_assert_eq(tu_save(w, i, 100, 3, NULL, false), 0);
	hs.term = 3;
	hs.commit = 4500;
	cr_assert_eq(wal_save(w, &hs, NULL, 0, true), 0);
	wal_close(w);

	w = open_ok(dir, &o, &rec);
	cr_assert_eq(rec.snap.index, 3000);
	cr_assert_eq(rec.snap.term, 2);
	cr_assert_eq(rec.hs.term, 3);
	cr_assert_eq(rec.hs.commit, 4500);
	/* Released entries are gone: no start without a snapshot. */
	cr_assert_eq(wal_recovery_check_start(&rec, 0, 0), -ENOENT);
	cr_assert_eq(wal_recovery_check_start(&rec, 3000, 7), -EBADMSG);
	cr_assert_eq(wal_recovery_check_start(&rec, 3000, 2), 0);
	cr_assert_eq(wal_start_at(w, &rec, 3000, 2), 0);
	struct tu_model m;
	tu_model_init(&m);
	m.first = 3001;
	m.last = 3000;
	tu_model_append(&m, 3001, 1000, 2);
	tu_model_append(&m, 4001, 500, 3);
	tu_check(&rec, &m);
	wal_recovery_close(&rec);

	/* Release everything but the open segment, reopen: still whole. */
	cr_assert_eq(wal_save_snapshot(w, (struct wal_snap_ref){4500, 3}, true), 0);
	cr_assert_eq(wal_release_to(w, 4500), 0);
	wal_get_stats(w, &st);
	cr_assert_eq(st.segments, 1);
	wal_close(w);
	w = open_ok(dir, &o, &rec);
	cr_assert_eq(rec.snap.index, 4500);
	cr_assert_eq(rec.hs.commit, 4500);
	cr_assert_eq(wal_recovery_check_start(&rec, 4500, 3), 0);
	cr_assert_eq(wal_recovery_check_start(&rec, 3000, 2), -ENOENT);
	cr_assert_eq(wal_start_at(w, &rec, 4500, 3), 0);
	cr_assert_eq(rec.n_ents, 0);
	cr_assert_eq(tu_save(w, 4501, 3, 3, NULL, true), 0);
	cr_assert_eq(wal_last_index(w), 4503);
	wal_close(w);
	wal_recovery_close(&rec);
	free(m.terms);
	tu_cleanup(dir);
}

/* A release must keep entries an older snapshot needs when told so. */
Test(wal, release_keeps_older_snapshot_usable)
{
	char *dir = tu_tmpdir();
	struct wal_options o = opts_small();
	struct wal_recovery rec;
	struct wal *w = open_ok(dir, &o, &rec);
	for (uint64_t i = 1; i <= 4000; i += 100)
		cr_assert_eq(tu_save(w, i, 100, 1, NULL, true), 0);
	cr_assert_eq(wal_save_snapshot(w, (struct wal_snap_ref){2000, 1}, true), 0);
	cr_assert_eq(wal_save_snapshot(w, (struct wal_snap_ref){3500, 1}, true), 0);
	cr_assert_eq(wal_release_to(w, 2000), 0); /* oldest kept snapshot */
	wal_close(w);
	w = open_ok(dir, &o, &rec);
	cr_assert_eq(rec.snap.index, 3500);
	/* Falling back to snapshot 2000 works: entries 2001.. are held. */
	cr_assert_eq(wal_recovery_check_start(&rec, 2000, 1), 0);
	cr_assert_eq(wal_recovery_check_start(&rec, 1000, 1), -ENOENT);
	cr_assert_eq(wal_start_at(w, &rec, 2000, 1), 0);
	cr_assert_eq(rec.n_ents, 2000);
	cr_assert_eq(rec.ents[0].index, 2001);
	cr_assert_eq(rec.snap.index, 3500);
	wal_close(w);
	wal_recovery_close(&rec);
	tu_cleanup(dir);
}

/* The names in dir ending in suffix, sorted. */
static char **names_ending(const char *dir, const char *suffix, size_t *n)
{
	DIR *d = opendir(dir);
	cr_assert_not_null(d);
	char **v = NULL;
	size_t k = 0, sl = strlen(suffix);
	struct dirent *de;
	while ((de = readdir(d))) {
		size_t l = strlen(de->d_name);
		if (l <= sl || strcmp(de->d_name + l - sl, suffix) != 0)
			continue;
		v = realloc(v, (k + 1) * sizeof(*v));
		v[k++] = strdup(de->d_name);
	}
	closedir(d);
	if (k > 1)
		qsort(v, k, sizeof(*v), tu_name_cmp);
	*n = k;
	return v;
}

/* 4000 entries over many segments, a marker at 3000, released to it:
 * returns the WAL still open. */
static struct wal *released_wal(const char *dir, size_t *kept, size_t *aside)
{
	struct wal_options o = opts_small();
	struct wal_recovery rec;
	struct wal *w = open_ok(dir, &o, &rec);
	struct wal_hard_state hs = {.term = 2, .vote = 1};
	for (uint64_t i = 1; i <= 4000; i += 100) {
		hs.commit = i + 99;
		cr_assert_eq(tu_save(w, i, 100, 2, &hs, true), 0);
	}
	cr_assert_eq(wal_save_snapshot(w, (struct wal_snap_ref){3000, 2}, false), 0);
	cr_assert_eq(wal_release_to(w, 3000), 0);
	struct wal_stats st;
	wal_get_stats(w, &st);
	char **v = tu_segments(dir, kept);
	tu_free_names(v, *kept);
	cr_assert_eq(*kept, st.segments);
	v = names_ending(dir, ".del", aside);
	tu_free_names(v, *aside);
	cr_assert_gt(*aside, 2, "the released segments are set aside, not deleted");
	return w;
}

/* Opens and checks what recovery starting from the snapshot at 3000
 * gives (entries up to last), then saves ten more. */
static void check_starts_at_3000(const char *dir, uint64_t last)
{
	struct wal_options o = opts_small();
	struct wal_recovery rec;
	struct wal *w = open_ok(dir, &o, &rec);
	cr_assert_eq(rec.snap.index, 3000);
	cr_assert_eq(rec.hs.commit, 4000);
	cr_assert_eq(wal_start_at(w, &rec, 3000, 2), 0);
	struct tu_model m;
	tu_model_init(&m);
	m.first = 3001;
	m.last = 3000;
	tu_model_append(&m, 3001, last - 3000, 2);
	tu_check(&rec, &m);
	free(m.terms);
	wal_recovery_close(&rec);
	cr_assert_eq(tu_save(w, last + 1, 10, 2, NULL, true), 0);
	wal_close(w);
}

Test(wal, released_segments_removed_off_the_save_path)
{
	char *dir = tu_tmpdir();
	size_t kept, aside, n;
	struct wal *w = released_wal(dir, &kept, &aside);
	/* Removal may run beside saves: it touches only what was set aside. */
	cr_assert_eq(tu_save(w, 4001, 100, 2, NULL, false), 0);
	unsigned removed;
	cr_assert_eq(wal_remove_released(dir, &removed), 0);
	cr_assert_eq(removed, aside);
	cr_assert_eq(tu_save(w, 4101, 100, 2, NULL, true), 0);
	char **v = names_ending(dir, ".del", &n);
	tu_free_names(v, n);
	cr_assert_eq(n, 0);
	v = tu_segments(dir, &n);
	tu_free_names(v, n);
	cr_assert_geq(n, kept);
	cr_assert_eq(wal_remove_released(dir, &removed), 0, "nothing to remove is no error");
	cr_assert_eq(removed, 0);
	wal_close(w);
	struct wal_options o = opts_small();
	struct wal_recovery rec;
	w = open_ok(dir, &o, &rec);
	cr_assert_eq(rec.snap.index, 3000);
	cr_assert_eq(wal_last_index(w), 4200);
	wal_close(w);
	wal_recovery_close(&rec);
	tu_cleanup(dir);
}

/* A crash before the set-aside segments are deleted, or before the
 * renames reached the disk (no directory fsync), leaves any mix of
 * them: recovery gives the same log in every case. */
static void crash_case(int mix)
{
	char *dir = tu_tmpdir();
	size_t kept, aside;
	struct wal *w = released_wal(dir, &kept, &aside);
	wal_close(w);
	char **del = names_ending(dir, ".del", &aside);
	for (size_t i = 0; i < aside; i++) {
		char a[PATH_MAX], b[PATH_MAX];
		snprintf(a, sizeof(a), "%s/%s", dir, del[i]);
		snprintf(b, sizeof(b), "%s/%.*s", dir, (int)(strlen(del[i]) - 4), del[i]);
		if (mix == 0 || (mix == 1 && i % 2 == 0)) {
			cr_assert_eq(rename(a, b), 0); /* the rename did not persist */
		} else if (mix == 2 && i == 0) {
			cr_assert_eq(truncate(a, 5000), 0); /* a removal half done */
		} else if (mix == 2 && i == 1) {
			cr_assert_eq(unlink(a), 0);
		}
	}
	tu_free_names(del, aside);
	check_starts_at_3000(dir, 4000);
	size_t n;
	char **v = tu_segments(dir, &n);
	tu_free_names(v, n);
	if (mix == 0) {
		cr_assert_eq(n, kept + aside, "all back, no gap: read as they are");
	} else if (mix == 1) {
		cr_assert_eq(n, kept, "below the gap: set aside again");
		cr_assert_eq(tu_log_count(dir, "came back after a crash: set aside"), 1);
	} else {
		cr_assert_eq(n, kept);
	}
	cr_assert_eq(wal_remove_released(dir, NULL), 0);
	check_starts_at_3000(dir, 4010);
	tu_cleanup(dir);
}

Test(wal, crash_before_released_segments_went)
{
	crash_case(0);
}

Test(wal, crash_with_every_other_release_rename_lost)
{
	crash_case(1);
}

Test(wal, crash_in_the_middle_of_removing_released)
{
	crash_case(2);
}

Test(wal, snapshot_marker_rules)
{
	char *dir = tu_tmpdir();
	struct wal_options o = opts_small();
	struct wal_recovery rec;
	struct wal *w = open_ok(dir, &o, &rec);
	cr_assert_eq(tu_save(w, 1, 20, 1, NULL, true), 0);
	/* Marker matching the log: entries stay. */
	cr_assert_eq(wal_save_snapshot(w, (struct wal_snap_ref){10, 1}, true), 0);
	cr_assert_eq(wal_last_index(w), 20);
	/* Older marker, or same index with another term: refused. */
	cr_assert_eq(wal_save_snapshot(w, (struct wal_snap_ref){9, 1}, true), -EINVAL);
	cr_assert_eq(wal_save_snapshot(w, (struct wal_snap_ref){10, 2}, true), -EINVAL);
	/* Entries at or below the marker: refused. */
	cr_assert_eq(tu_save(w, 10, 1, 1, NULL, true), -EINVAL);
	cr_assert_eq(tu_save(w, 11, 2, 1, NULL, true), 0);
	/* A marker with another term at a held index replaces the log. */
	cr_assert_eq(wal_save_snapshot(w, (struct wal_snap_ref){15, 4}, true), 0);
	cr_assert_eq(wal_last_index(w), 15);
	cr_assert_eq(tu_save(w, 17, 1, 4, NULL, true), -EINVAL); /* gap */
	cr_assert_eq(tu_save(w, 16, 3, 4, NULL, true), 0);
	wal_close(w);
	wal_recovery_close(&rec);

	w = open_ok(dir, &o, &rec);
	cr_assert_eq(rec.snap.index, 15);
	cr_assert_eq(rec.snap.term, 4);
	cr_assert_eq(rec.n_ents, 3);
	cr_assert_eq(rec.ents[0].index, 16);
	cr_assert_eq(wal_recovery_check_start(&rec, 10, 1), -ENOENT);
	cr_assert_eq(wal_start_at(w, &rec, 15, 4), 0);
	cr_assert_eq(rec.n_ents, 3);

	/* A marker beyond the log replaces it too. */
	cr_assert_eq(wal_save_snapshot(w, (struct wal_snap_ref){100, 5}, true), 0);
	cr_assert_eq(wal_last_index(w), 100);
	wal_close(w);
	wal_recovery_close(&rec);
	w = open_ok(dir, &o, &rec);
	cr_assert_eq(rec.n_ents, 0);
	cr_assert_eq(rec.first_index, 101);
	cr_assert_eq(wal_recovery_check_start(&rec, 100, 5), 0);
	wal_close(w);
	wal_recovery_close(&rec);
	tu_cleanup(dir);
}

/* A snapshot file committed but its marker never saved (crash between
 * the two): starting from it saves the marker, so later saves and
 * recoveries agree. */
Test(wal, start_at_newer_snapshot_saves_marker)
{
	char *dir = tu_tmpdir();
	struct wal_options o = opts_small();
	struct wal_recovery rec;
	struct wal *w = open_ok(dir, &o, &rec);
	cr_assert_eq(tu_save(w, 1, 50, 1, NULL, true), 0);
	wal_close(w);
	wal_recovery_close(&rec);

	/* Snapshot (30, 1): matches the log, entries after it stay. */
	w = open_ok(dir, &o, &rec);
	cr_assert_eq(wal_start_at(w, &rec, 30, 1), 0);
	cr_assert_eq(rec.n_ents, 20);
	cr_assert_eq(rec.ents[0].index, 31);
	cr_assert_eq(wal_snapshot(w).index, 30);
	wal_close(w);
	wal_recovery_close(&rec);

	/* Snapshot (200, 3) installed from a leader: replaces the log. */
	w = open_ok(dir, &o, &rec);
	cr_assert_eq(rec.snap.index, 30);
	cr_assert_eq(wal_start_at(w, &rec, 200, 3), 0);
	cr_assert_eq(rec.n_ents, 0);
	cr_assert_eq(tu_save(w, 201, 5, 3, NULL, true), 0);
	wal_close(w);
	wal_recovery_close(&rec);
	w = open_ok(dir, &o, &rec);
	cr_assert_eq(rec.snap.index, 200);
	cr_assert_eq(rec.n_ents, 5);
	cr_assert_eq(rec.ents[0].index, 201);
	cr_assert_eq(wal_start_at(w, &rec, 200, 3), 0);
	cr_assert_eq(rec.n_ents, 5);
	wal_close(w);
	wal_recovery_close(&rec);
	tu_cleanup(dir);
}

Test(wal, save_rules_refused_without_effect)
{
	char *dir = tu_tmpdir();
	struct wal_options o = opts_small();
	struct wal_recovery rec;
	struct wal *w = open_ok(dir, &o, &rec);
	struct wal_hard_state hs = {.term = 5};
	cr_assert_eq(tu_save(w, 1, 10, 5, &hs, true), 0);
	cr_assert_eq(tu_save(w, 12, 1, 5, NULL, true), -EINVAL); /* gap */
	cr_assert_eq(tu_save(w, 0, 1, 5, NULL, true), -EINVAL);  /* index 0 */
	cr_assert_eq(tu_save(w, 11, 1, 4, NULL, true), -EINVAL); /* term down */
	struct tu_batch b;
	tu_batch_make(&b, 11, 3, 5);
	b.ents[2].index = 20; /* not contiguous */
	cr_assert_eq(wal_save(w, NULL, b.ents, 3, true), -EINVAL);
	b.ents[2].index = 13;
	b.ents[1].term = 4; /* term decreases inside the batch */
	cr_assert_eq(wal_save(w, NULL, b.ents, 3, true), -EINVAL);
	tu_batch_free(&b);
	struct wal_hard_state old = {.term = 4};
	cr_assert_eq(wal_save(w, &old, NULL, 0, true), -EINVAL);
	struct wal_entry nodata = {11, 5, 0, NULL, 5};
	cr_assert_eq(wal_save(w, NULL, &nodata, 1, true), -EINVAL);
	/* Still usable, and nothing of the refused saves got in. */
	cr_assert_eq(tu_save(w, 11, 2, 6, NULL, true), 0);
	wal_close(w);
	wal_recovery_close(&rec);
	w = open_ok(dir, &o, &rec);
	struct tu_model m;
	tu_model_init(&m);
	tu_model_append(&m, 1, 10, 5);
	tu_model_append(&m, 11, 2, 6);
	tu_check(&rec, &m);
	cr_assert_eq(rec.hs.term, 5);
	wal_close(w);
	wal_recovery_close(&rec);
	free(m.terms);
	tu_cleanup(dir);
}

Test(wal, group_commit_one_fsync)
{
	char *dir = tu_tmpdir();
	struct metrics_registry *reg = metrics_registry_new();
	struct wal_options o = opts_small();
	o.segment_bytes = 16 << 20;
	o.metrics = reg;
	struct wal_recovery rec;
	struct wal *w = open_ok(dir, &o, &rec);
	struct metric *fsyncs = metrics_counter(reg, "mooncake_wal_fsyncs_total", "x", NULL,
						NULL);
	struct metric *bytes = metrics_counter(reg, "mooncake_wal_bytes_written_total", "x",
					       NULL, NULL);
	struct metric *hist = metrics_histogram(reg, "mooncake_wal_fsync_duration_seconds",
						"x", NULL, NULL, metrics_latency_buckets,
						metrics_latency_nbuckets);
	cr_assert_not_null(fsyncs);
	cr_assert_not_null(hist);
	struct wal_stats s0, s1;
	wal_get_stats(w, &s0);
	double f0 = metric_value(fsyncs), h0 = metric_value(hist);
	double b0 = metric_value(bytes);

	struct wal_hard_state hs = {.term = 1};
	for (uint64_t i = 1; i <= 100; i++) {
		hs.commit = i - 1;
		cr_assert_eq(tu_save(w, i, 1, 1, &hs, false), 0);
	}
	wal_get_stats(w, &s1);
	cr_assert_eq(s1.fsyncs, s0.fsyncs, "no fsync before wal_sync");
	cr_assert_eq(s1.writes, s0.writes, "all buffered (under 1 MiB)");
	cr_assert_eq(wal_sync(w), 0);
	wal_get_stats(w, &s1);
	cr_assert_eq(s1.fsyncs - s0.fsyncs, 1, "%" PRIu64 " fsyncs", s1.fsyncs - s0.fsyncs);
	cr_assert_eq(s1.writes - s0.writes, 1);
	cr_assert_eq(metric_value(fsyncs) - f0, 1.0);
	cr_assert_eq(metric_value(hist) - h0, 1.0);
	cr_assert_eq(metric_value(bytes) - b0, (double)(s1.bytes_written - s0.bytes_written));
	cr_assert_gt(s1.bytes_written, s0.bytes_written);
	/* Nothing pending: sync is free. */
	cr_assert_eq(wal_sync(w), 0);
	wal_get_stats(w, &s0);
	cr_assert_eq(s0.fsyncs, s1.fsyncs);
	/* A save with sync=true is the same one write + one fsync. */
	cr_assert_eq(tu_save(w, 101, 50, 1, NULL, false), 0);
	cr_assert_eq(tu_save(w, 151, 50, 1, &hs, true), 0);
	wal_get_stats(w, &s1);
	cr_assert_eq(s1.fsyncs - s0.fsyncs, 1);
	cr_assert_eq(s1.writes - s0.writes, 1);

	/* The exposition carries the three families. */
	struct mc_buf out = MC_BUF_INIT;
	cr_assert_eq(metrics_format(reg, &out), 0);
	cr_assert_not_null(strstr(out.data, "mooncake_wal_fsync_duration_seconds_bucket"));
	cr_assert_not_null(strstr(out.data, "mooncake_wal_fsyncs_total"));
	cr_assert_not_null(strstr(out.data, "mooncake_wal_bytes_written_total"));
	mc_buf_free(&out);
	wal_close(w);
	wal_recovery_close(&rec);
	metrics_registry_free(reg);
	tu_cleanup(dir);
}

/* Past buffer_bytes, pending records are written (not synced). */
Test(wal, buffer_limit_writes_without_sync)
{
	char *dir = tu_tmpdir();
	struct wal_options o = opts_small();
	o.segment_bytes = 16 << 20;
	o.buffer_bytes = 8192;
	struct wal_recovery rec;
	struct wal *w = open_ok(dir, &o, &rec);
	struct wal_stats s0, s1;
	wal_get_stats(w, &s0);
	for (uint64_t i = 1; i <= 1000; i += 10)
		cr_assert_eq(tu_save(w, i, 10, 1, NULL, false), 0);
	wal_get_stats(w, &s1);
	cr_assert_gt(s1.writes - s0.writes, 5);
	cr_assert_eq(s1.fsyncs, s0.fsyncs);
	cr_assert_eq(wal_sync(w), 0);
	wal_get_stats(w, &s1);
	cr_assert_eq(s1.fsyncs - s0.fsyncs, 1);
	wal_close(w);
	wal_recovery_close(&rec);
	tu_cleanup(dir);
}

Test(wal, directory_lock)
{
	char *dir = tu_tmpdir();
	struct wal_options o = opts_small();
	struct wal_recovery rec, rec2;
	struct wal *w = open_ok(dir, &o, &rec), *w2 = NULL;
	cr_assert_eq(wal_open(dir, &o, &w2, &rec2), MC_ELOCKED);
	cr_assert_eq(rec2.n_ents, 0);
	wal_close(w);
	w2 = open_ok(dir, &o, &rec2);
	wal_close(w2);
	wal_recovery_close(&rec);
	wal_recovery_close(&rec2);
	tu_cleanup(dir);
}

Test(wal, bad_options)
{
	char *dir = tu_tmpdir();
	struct wal_options o = {.segment_bytes = 1000, .create = true};
	struct wal *w;
	struct wal_recovery rec;
	cr_assert_eq(wal_open(dir, &o, &w, &rec), -EINVAL);
	tu_cleanup(dir);
}

/* A failed write makes the WAL fatal: every later call returns the error;
 * a restart recovers what was synced. */
Test(wal, write_failure_is_fatal_and_sticky)
{
	char *dir = tu_tmpdir();
	struct wal_options o = opts_small();
	o.no_prealloc = true;
	o.segment_bytes = 16 << 20;
	struct wal_recovery rec;
	struct wal *w = open_ok(dir, &o, &rec);
	cr_assert_eq(tu_save(w, 1, 10, 1, NULL, true), 0);
	signal(SIGXFSZ, SIG_IGN);
	struct rlimit old, lim;
	cr_assert_eq(getrlimit(RLIMIT_FSIZE, &old), 0);
	lim = old;
	lim.rlim_cur = 8192;
	cr_assert_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
	int rc = tu_save(w, 11, 200, 1, NULL, true);
	cr_assert_eq(rc, -EFBIG, "got %s", mc_strerror(rc));
	cr_assert_eq(tu_save(w, 11, 1, 1, NULL, true), -EFBIG);
	cr_assert_eq(wal_sync(w), -EFBIG);
	cr_assert_eq(wal_save_snapshot(w, (struct wal_snap_ref){5, 1}, true), -EFBIG);
	cr_assert_eq(wal_release_to(w, 1), -EFBIG);
	cr_assert_eq(setrlimit(RLIMIT_FSIZE, &old), 0);
	wal_close(w);
	wal_recovery_close(&rec);
	w = open_ok(dir, &o, &rec);
	cr_assert_geq(rec.n_ents, 10);
	cr_assert_eq(rec.ents[9].index, 10);
	cr_assert_eq(tu_save(w, rec.n_ents + 1, 1, 1, NULL, true), 0);
	wal_close(w);
	wal_recovery_close(&rec);
	tu_cleanup(dir);
}

Test(wal, leftover_roll_temp_file_removed)
{
	char *dir = tu_tmpdir();
	struct wal_options o = opts_small();
	struct wal_recovery rec;
	struct wal *w = open_ok(dir, &o, &rec);
	cr_assert_eq(tu_save(w, 1, 3, 1, NULL, true), 0);
	wal_close(w);
	char tmp[PATH_MAX];
	snprintf(tmp, sizeof(tmp), "%s/0000000000000002-0000000000000004.wal.tmp", dir);
	tu_write_file(tmp, "partial", 7);
	w = open_ok(dir, &o, &rec);
	cr_assert_eq(rec.n_ents, 3);
	cr_assert_eq(access(tmp, F_OK), -1);
	cr_assert_eq(tu_log_count(dir, "interrupted roll"), 1);
	wal_close(w);
	wal_recovery_close(&rec);
	tu_cleanup(dir);
}
