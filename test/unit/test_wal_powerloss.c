/*
 * test_wal_powerloss: power loss drops what was not synced, and no
 * acknowledged (synced) entry or hard state is lost.
 *
 * Each seed runs a random Raft-like workload on a WAL: appends, log
 * overwrites from a later term, hard states, some saves synced and most
 * not, a small write buffer so that unsynced records do reach the file.
 * (The segment is large enough never to roll: a roll syncs everything
 * before it and is a sync point of its own, tested in test_wal_crash.) At a random point the directory is copied as a power
 * loss would leave it — everything written since the last fdatasync
 * dropped, or cut at a random byte, or (when it went out in one write)
 * with random pages of it zeroed, the way a page cache flushes out of
 * order; segment files created since the sync may vanish — and the copy
 * is recovered. Recovery must succeed and give back exactly the synced
 * state followed by a prefix of the records saved after it: every entry
 * that was synced is there unless a later record legitimately replaced
 * it, and the hard state is at least the synced one.
 */
#include "common/util.h"
#include "unit/test_wal_util.h"

#define SEEDS 80
#define MAX_LOG 4096
#define MAX_RECS 2048

struct model {
	uint64_t terms[MAX_LOG + 1]; /* terms[i] of entry i, 1..last */
	uint64_t last;
	struct wal_hard_state hs;
};

/* One record the WAL writes: an entry, or a hard state. */
struct rec {
	bool is_hs;
	uint64_t index, term;
	struct wal_hard_state hs;
};

static void apply_rec(struct model *m, const struct rec *r)
{
	if (r->is_hs) {
		m->hs = r->hs;
		return;
	}
	cr_assert(r->index >= 1 && r->index <= m->last + 1);
	m->terms[r->index] = r->term;
	m->last = r->index;
}

static bool same(const struct wal_recovery *rv, const struct model *m)
{
	uint8_t buf[256];
	if (rv->hs.term != m->hs.term || rv->hs.vote != m->hs.vote ||
	    rv->hs.commit != m->hs.commit || rv->n_ents != m->last)
		return false;
	for (size_t k = 0; k < rv->n_ents; k++) {
		const struct wal_entry *e = &rv->ents[k];
		uint64_t idx = k + 1;
		if (e->index != idx || e->term != m->terms[idx] ||
		    e->type != (uint32_t)(idx % 3))
			return false;
		size_t len = tu_data_len(idx, e->term);
		tu_fill(buf, idx, e->term, len);
		if (e->len != len || (len && memcmp(e->data, buf, len) != 0))
			return false;
	}
	return true;
}

struct seg_size {
	char name[64];
	uint64_t size;
};

/* The segments and their sizes now (the synced image after a sync). */
static size_t sizes_now(const char *dir, struct seg_size *out, size_t cap)
{
	size_t n;
	char **v = tu_segments(dir, &n);
	cr_assert(n <= cap);
	for (size_t i = 0; i < n; i++) {
		char path[PATH_MAX];
		snprintf(out[i].name, sizeof(out[i].name), "%s", v[i]);
		cr_assert(snprintf(path, sizeof(path), "%s/%s", dir, v[i]) <
			  (int)sizeof(path));
		out[i].size = tu_file_size(path);
	}
	tu_free_names(v, n);
	return n;
}

static void zero_at(const char *path, uint64_t off, size_t len)
{
	static const uint8_t zeros[4096];
	int fd = open(path, O_WRONLY);
	cr_assert(fd >= 0);
	while (len) {
		size_t k = len < sizeof(zeros) ? len : sizeof(zeros);
		cr_assert_eq(pwrite(fd, zeros, k, (off_t)off), (ssize_t)k);
		off += k;
		len -= k;
	}
	close(fd);
}

static unsigned lose(const char *crash, const struct seg_size *synced, size_t nsynced,
		     bool one_write, unsigned mode, uint64_t *rng)
{
	size_t n;
	char **v = tu_segments(crash, &n);
	for (size_t i = 0; i < n; i++) {
		char path[PATH_MAX];
		cr_assert(snprintf(path, sizeof(path), "%s/%s", crash, v[i]) <
			  (int)sizeof(path));
		uint64_t size = tu_file_size(path), base = 0;
		bool known = false;
		for (size_t j = 0; j < nsynced; j++)
			if (strcmp(synced[j].name, v[i]) == 0) {
				base = synced[j].size;
				known = true;
			}
		if (!known && mode == 0) {
			unlink(path); /* a segment created since the sync is gone */
			continue;
		}
		if (!known)
			base = 0;
		if (size <= base)
			continue;
		*rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
		uint64_t r = *rng >> 17;
		if (mode == 0) {
			cr_assert_eq(truncate(path, (off_t)base), 0);
		} else if (mode == 1) {
			cr_assert_eq(truncate(path, (off_t)(base + r % (size - base + 1))), 0);
		} else if (mode == 2 && one_write) {
			/* pages of the single unsynced write lost in any order */
			for (uint64_t off = base & ~4095ull; off < size; off += 4096) {
				*rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
				if ((*rng >> 33) % 3 == 0) {
					uint64_t from = off < base ? base : off;
					uint64_t to = off + 4096 < size ? off + 4096 : size;
					zero_at(path, from, (size_t)(to - from));
				}
			}
		}
		/* mode 3 (or 2 after several writes): every page made it */
	}
	tu_free_names(v, n);
	return mode;
}

static void run_seed(uint64_t seed)
{
	char *dir = tu_tmpdir();
	uint64_t rng = seed * 0x9E3779B97F4A7C15ull + 1;
#define RND(n) \
	((rng = rng * 6364136223846793005ull + 1442695040888963407ull), \
	 (uint64_t)((rng >> 33) % (uint64_t)(n)))
	struct wal_options o = {.segment_bytes = 16 << 20,
				.buffer_bytes = 256 + RND(4096),
				.no_prealloc = true,
				.create = true};
	struct wal *w;
	struct wal_recovery rv;
	cr_assert_eq(wal_open(dir, &o, &w, &rv), 0);
	wal_recovery_close(&rv);

	static struct model cur, synced, cand;
	static struct rec recs[MAX_RECS];
	size_t nrecs = 0;
	struct seg_size ssz[256];
	size_t nssz = sizes_now(dir, ssz, 256);
	memset(&cur, 0, sizeof(cur));
	synced = cur;
	uint64_t term = 1, writes_at_sync = 0;
	struct wal_stats st;
	size_t steps = 20 + RND(120);

	for (size_t s = 0; s < steps; s++) {
		uint64_t first, n;
		if (cur.last > cur.hs.commit + 1 && RND(6) == 0) {
			/* a new leader overwrites the uncommitted tail */
			term++;
			first = cur.hs.commit + 1 + RND(cur.last - cur.hs.commit);
		} else {
			first = cur.last + 1;
		}
		n = 1 + RND(12);
		if (first + n > MAX_LOG)
			break;
		struct wal_hard_state hs = {term, 1 + RND(3), 0};
		uint64_t new_last = first + n - 1;
		hs.commit = cur.hs.commit + RND(new_last - cur.hs.commit + 1);
		if (hs.commit < cur.hs.commit)
			hs.commit = cur.hs.commit;
		bool sync = RND(4) == 0;
		cr_assert_eq(tu_save(w, first, n, term, &hs, sync), 0);
		for (uint64_t k = 0; k < n && nrecs < MAX_RECS; k++)
			recs[nrecs++] = (struct rec){false, first + k, term, {0}};
		if (nrecs < MAX_RECS)
			recs[nrecs++] = (struct rec){true, 0, 0, hs};
		for (size_t k = nrecs - n - 1; k < nrecs; k++)
			apply_rec(&cur, &recs[k]);
		wal_get_stats(w, &st);
		if (sync) {
			synced = cur;
			nrecs = 0;
			nssz = sizes_now(dir, ssz, 256);
			writes_at_sync = st.writes;
		}
		cr_assert(nrecs < MAX_RECS - 32, "too many unsynced records");
	}

	/* Power loss now: copy what the files hold, then lose unsynced data. */
	wal_get_stats(w, &st);
	bool one_write = st.writes - writes_at_sync <= 1;
	cr_assert_eq(st.segments, 1, "the segment rolled: make it larger");
	char walsub[256];
	cr_assert(snprintf(walsub, sizeof(walsub), "%s.crash", dir) < (int)sizeof(walsub));
	cr_assert_eq(mc_mkdir_p(walsub, 0700), 0);
	tu_copy_dir(dir, walsub);
	unsigned mode = (unsigned)RND(4);
	lose(walsub, ssz, nssz, one_write, mode, &rng);
	wal_close(w);

	struct wal_options ro = {.segment_bytes = 16 << 20, .no_prealloc = true};
	int rc = wal_open(walsub, &ro, &w, &rv);
	cr_assert_eq(rc, 0, "seed %" PRIu64 " mode %u: recovery failed: %s", seed, mode,
		     mc_strerror(rc));
	/* The synced state, then each prefix of the records after it. */
	cand = synced;
	bool found = same(&rv, &cand);
	for (size_t k = 0; !found && k < nrecs; k++) {
		apply_rec(&cand, &recs[k]);
		found = same(&rv, &cand);
	}
	cr_assert(found,
		  "seed %" PRIu64 " mode %u: recovered %zu entries, hs term %" PRIu64
		  " commit %" PRIu64 ": not the synced state (%" PRIu64
		  " entries, commit %" PRIu64 ") or a prefix of the %zu records after it",
		  seed, mode, rv.n_ents, rv.hs.term, rv.hs.commit, synced.last,
		  synced.hs.commit, nrecs);
	if (mode == 0)
		cr_assert(same(&rv, &synced),
			  "seed %" PRIu64 ": all unsynced data dropped, "
			  "yet recovery differs from the synced state",
			  seed);
	wal_close(w);
	wal_recovery_close(&rv);
	tu_rm_rf(walsub);
	tu_cleanup(dir);
#undef RND
}

Test(wal_powerloss, unsynced_data_lost_synced_state_survives, .timeout = 300)
{
	for (uint64_t seed = 1; seed <= SEEDS; seed++)
		run_seed(seed);
}
