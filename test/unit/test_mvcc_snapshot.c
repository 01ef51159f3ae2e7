/*
 * test_mvcc_snapshot: snapshot round trips of randomized states (the
 * re-encoded bytes and every readable revision compare equal), streaming
 * in bounded chunks, rejection of truncated and corrupted snapshots, a
 * 100k-key round trip, and the fuzz entry point run on mutated snapshots.
 */
#include <time.h>

#include "../fuzz/fuzz_mvcc_snapshot.c"
#include "test_mvcc_helpers.h"

static uint64_t rnd_state;

static uint32_t rnd(void)
{
	rnd_state = rnd_state * 6364136223846793005ULL + 1442695040888963407ULL;
	return (uint32_t)(rnd_state >> 33);
}

static void rnd_key(char *k, size_t *len)
{
	/* Short binary keys from a small alphabet, so they collide. */
	*len = 1 + rnd() % 3;
	for (size_t i = 0; i < *len; i++)
		k[i] = "\0ab\xff"[rnd() % 4];
}

/* Apply nops random requests (puts, deletes, txns, leases and, with
 * compact, compactions). */
static void random_ops(struct mvcc_store *s, uint64_t seed, int nops, bool compact)
{
	rnd_state = seed;
	struct lease_table *t = mvcc_leases(s);
	for (int i = 0; i < nops; i++) {
		char k[4], k2[4], v[24];
		size_t kl, k2l, vl = rnd() % 20;
		rnd_key(k, &kl);
		rnd_key(k2, &k2l);
		for (size_t j = 0; j < vl; j++)
			v[j] = (char)rnd();
		struct mvcc_op o = {.type = MVCC_OP_PUT};
		struct mvcc_result res;
		unsigned what = rnd() % 20;
		if (what < 10) {
			o.u.put.key = k;
			o.u.put.key_len = kl;
			o.u.put.value = v;
			o.u.put.value_len = vl;
			if (what == 9 && lease_count(t)) {
				int64_t *ids;
				size_t n;
				cr_assert_eq(lease_list(t, &ids, &n), 0);
				o.u.put.lease = ids[rnd() % n];
				free(ids);
			}
		} else if (what < 13) {
			o.type = MVCC_OP_DELETE_RANGE;
			o.u.del.key = k;
			o.u.del.key_len = kl;
			if (what == 12) {
				o.u.del.range_end = k2;
				o.u.del.range_end_len = k2l;
			}
		} else if (what < 16) {
			struct mvcc_op ops[2] = {{.type = MVCC_OP_PUT}, {.type = MVCC_OP_PUT}};
			ops[0].u.put.key = k;
			ops[0].u.put.key_len = kl;
			ops[0].u.put.value = v;
			ops[0].u.put.value_len = vl;
			ops[1].u.put.key = k2;
			ops[1].u.put.key_len = k2l;
			struct mvcc_compare c = {.target = MVCC_TARGET_VERSION,
						 .result = MVCC_CMP_GREATER,
						 .key = k2,
						 .key_len = k2l};
			o = op_txn(&c, 1, ops, kl == k2l && !memcmp(k, k2, kl) ? 1 : 2,
				   ops + 1, 1);
			cr_assert_eq(mvcc_apply(s, &o, &res), 0);
			mvcc_result_free(&res);
			continue;
		} else if (what < 17) {
			cr_assert_eq(lease_grant(t, 0, 1 + rnd() % 100, 0, NULL, NULL), 0);
			if (rnd() % 2)
				lease_checkpoint(t, lease__next_id(t) - 1, rnd() % 50);
			continue;
		} else if (what < 18) {
			int64_t *ids;
			size_t n;
			cr_assert_eq(lease_list(t, &ids, &n), 0);
			if (n)
				cr_assert_eq(mvcc_lease_revoke(s, ids[rnd() % n], NULL), 0);
			free(ids);
			continue;
		} else if (what < 19 && compact) {
			int64_t lo = mvcc_compact_rev(s) + 1, hi = mvcc_rev(s);
			if (lo <= hi)
				cr_assert_eq(
					mvcc_compact(s,
						     lo + (int64_t)(rnd() %
								    (uint32_t)(hi - lo + 1))),
					0);
			continue;
		} else {
			continue;
		}
		cr_assert_eq(mvcc_apply(s, &o, &res), 0);
		mvcc_result_free(&res);
	}
}

static void random_state(struct mvcc_store *s, uint64_t seed, int nops)
{
	random_ops(s, seed, nops, true);
}

/* Everything readable: every revision from the compaction on, the
 * revision log with prev_kvs, and the lease table. */
static struct h_sink dump(struct mvcc_store *s)
{
	struct h_sink k = {0};
	char line[256];
	int64_t from = mvcc_compact_rev(s) > 1 ? mvcc_compact_rev(s) : 1;
	for (int64_t rev = from; rev <= mvcc_rev(s); rev++) {
		struct mvcc_op o = op_range("\0", 1, "\0", 1);
		o.u.range.revision = rev;
		struct mvcc_result res;
		cr_assert_eq(mvcc_apply(s, &o, &res), 0);
		for (size_t i = 0; i < res.resp.u.range.nkvs; i++) {
			const struct mvcc_kv *kv = &res.resp.u.range.kvs[i];
			int n = snprintf(line, sizeof(line),
					 "@%lld %lld %lld %lld %lld %zu %zu|", (long long)rev,
					 (long long)kv->create_revision,
					 (long long)kv->mod_revision, (long long)kv->version,
					 (long long)kv->lease, kv->key_len, kv->value_len);
			h_sink_write(&k, line, (size_t)n);
			h_sink_write(&k, kv->key, kv->key_len);
			h_sink_write(&k, kv->value, kv->value_len);
		}
		mvcc_result_free(&res);
	}
	uint64_t pos;
	struct mvcc_event ev;
	cr_assert_eq(mvcc_hist_seek(s, from, &pos), 0);
	for (; mvcc_hist_event(s, pos, &ev) == 0; pos++) {
		int n = snprintf(line, sizeof(line), "ev %d %lld %d %lld|", ev.type,
				 (long long)ev.kv.mod_revision, ev.has_prev_kv,
				 (long long)ev.prev_kv.mod_revision);
		h_sink_write(&k, line, (size_t)n);
		h_sink_write(&k, ev.kv.key, ev.kv.key_len);
	}
	int64_t *ids;
	size_t n;
	cr_assert_eq(lease_list(mvcc_leases(s), &ids, &n), 0);
	for (size_t i = 0; i < n; i++) {
		struct lease_ttl ttl;
		cr_assert_eq(lease_time_to_live(mvcc_leases(s), ids[i], 0, true, &ttl), 0);
		int m = snprintf(line, sizeof(line), "lease %lld %lld %lld %zu|",
				 (long long)ids[i], (long long)ttl.granted_ttl_s,
				 (long long)ttl.remaining_checkpoint_s, ttl.nkeys);
		h_sink_write(&k, line, (size_t)m);
		lease_ttl_free(&ttl);
	}
	free(ids);
	struct mvcc_stats st;
	mvcc_stats(s, &st);
	int m = snprintf(line, sizeof(line), "stats %llu %llu %llu %llu %llu",
			 (unsigned long long)st.keys, (unsigned long long)st.key_nodes,
			 (unsigned long long)st.versions, (unsigned long long)st.revlog,
			 (unsigned long long)st.db_size_bytes);
	h_sink_write(&k, line, (size_t)m);
	return k;
}

static void assert_same(struct mvcc_store *a, struct mvcc_store *b)
{
	struct h_sink da = dump(a), db = dump(b);
	cr_assert_eq(da.len, db.len);
	cr_assert(!memcmp(da.data, db.data, da.len), "dumps differ");
	free(da.data);
	free(db.data);
	struct h_sink sa = h_snapshot(a), sb = h_snapshot(b);
	cr_assert_eq(sa.len, sb.len);
	cr_assert(!memcmp(sa.data, sb.data, sa.len), "snapshots differ");
	free(sa.data);
	free(sb.data);
}

static struct mvcc_store *round_trip(struct mvcc_store *s)
{
	struct h_sink snap = h_snapshot(s);
	struct mvcc_store *r;
	int rc = mvcc_restore(NULL, snap.data, snap.len, &r);
	cr_assert_eq(rc, 0, "restore: %s", mvcc_strerror(rc));
	free(snap.data);
	return r;
}

Test(snapshot, empty_store)
{
	struct mvcc_store *s = h_store();
	struct mvcc_store *r = round_trip(s);
	assert_same(s, r);
	cr_assert_eq(mvcc_rev(r), 1);
	cr_assert_eq(mvcc_compact_rev(r), -1);
	mvcc_free(r);
	mvcc_free(s);
}

Test(snapshot, randomized_round_trips)
{
	for (uint64_t seed = 1; seed <= 30; seed++) {
		struct mvcc_store *s = h_store();
		random_state(s, seed, 400);
		struct mvcc_store *r = round_trip(s);
		assert_same(s, r);
		/* The restored store goes on exactly like the original. */
		random_state(s, seed * 1000, 200);
		random_state(r, seed * 1000, 200);
		assert_same(s, r);
		mvcc_free(r);
		mvcc_free(s);
	}
}

static int fail_after(void *ctx, const void *data, size_t len)
{
	(void)data;
	(void)len;
	int *left = ctx;
	return --*left < 0 ? -EPIPE : 0;
}

Test(snapshot, stepped_snapshot_is_the_state_at_its_start_despite_writes)
{
	for (uint64_t seed = 1; seed <= 40; seed++) {
		struct mvcc_store *s = h_store();
		random_state(s, seed, 300);
		struct h_sink want = h_snapshot(s), got = {0};
		struct mvcc_snap_cursor *c;
		cr_assert_eq(mvcc_snap_begin(s, h_sink_write, &got, &c), 0);
		int rc, steps = 0;
		/* Small steps, writes of every kind but compaction between them:
		 * the result is the state when the cursor began. */
		while ((rc = mvcc_snap_step(c, 1 + seed * 7)) == 0) {
			random_ops(s, seed * 1000 + (uint64_t)steps, 5, false);
			steps++;
		}
		cr_assert_eq(rc, 1, "seed %llu", (unsigned long long)seed);
		cr_assert_gt(steps, 1);
		cr_assert_eq(got.len, want.len, "seed %llu", (unsigned long long)seed);
		cr_assert_eq(memcmp(got.data, want.data, want.len), 0, "seed %llu",
			     (unsigned long long)seed);
		mvcc_snap_free(c);
		free(got.data);
		free(want.data);
		mvcc_free(s);
	}
}

Test(snapshot, stepped_snapshot_goes_stale_on_compaction)
{
	struct mvcc_store *s = h_store();
	for (int i = 0; i < 50; i++) {
		char k[16];
		snprintf(k, sizeof(k), "k%02d", i);
		h_put(s, k, "v");
		h_put(s, k, "w");
	}
	struct h_sink got = {0};
	struct mvcc_snap_cursor *c;
	cr_assert_eq(mvcc_snap_begin(s, h_sink_write, &got, &c), 0);
	cr_assert_eq(mvcc_snap_step(c, 100), 0);
	cr_assert_eq(mvcc_compact(s, mvcc_rev(s) - 1), 0);
	cr_assert_eq(mvcc_snap_step(c, 100), MVCC_ESNAPSHOT_STALE);
	mvcc_snap_free(c);
	free(got.data);
	mvcc_free(s);
}

Test(snapshot, corrupt_and_truncated)
{
	struct mvcc_store *s = h_store();
	random_state(s, 7, 120);
	struct h_sink snap = h_snapshot(s);
	struct mvcc_store *r;
	for (size_t n = 0; n < snap.len; n++)
		cr_assert_eq(mvcc_restore(NULL, snap.data, n, &r), MVCC_ESNAPSHOT_CORRUPT,
			     "prefix of %zu bytes", n);
	for (size_t i = 0; i < snap.len; i++) {
		for (int bit = 0; bit < 8; bit += 3) {
			snap.data[i] ^= (char)(1 << bit);
			int rc = mvcc_restore(NULL, snap.data, snap.len, &r);
			cr_assert(rc == MVCC_ESNAPSHOT_CORRUPT ||
					  (i >= 8 && i < 12 && rc == MVCC_ESNAPSHOT_VERSION),
				  "flip at %zu: %d", i, rc);
			snap.data[i] ^= (char)(1 << bit);
		}
	}
	cr_assert_eq(mvcc_restore(NULL, snap.data, snap.len, &r), 0);
	mvcc_free(r);
	snap.data[8] = 2; /* a future format */
	cr_assert_eq(mvcc_restore(NULL, snap.data, snap.len, &r), MVCC_ESNAPSHOT_VERSION);
	/* The writer's error stops the snapshot. */
	int left = 0;
	cr_assert_eq(mvcc_snapshot(s, fail_after, &left), -EPIPE);
	free(snap.data);
	mvcc_free(s);
}

/* Mutations behind a valid CRC: the fuzz entry point must not crash and
 * anything accepted must re-encode identically (it aborts otherwise). */
Test(snapshot, fuzz_entry_on_mutations)
{
	struct mvcc_store *s = h_store();
	random_state(s, 11, 150);
	struct h_sink snap = h_snapshot(s);
	mvcc_free(s);
	unsigned char *in = malloc(snap.len + 1);
	rnd_state = 99;
	size_t accepted = 0;
	for (int iter = 0; iter < 20000; iter++) {
		size_t n = snap.len;
		in[0] = 1; /* fix the CRC up */
		memcpy(in + 1, snap.data, n);
		int muts = 1 + (int)(rnd() % 4);
		for (int m = 0; m < muts; m++) {
			size_t at = rnd() % n;
			switch (rnd() % 4) {
			case 0:
				in[1 + at] ^= (unsigned char)(1u << (rnd() % 8));
				break;
			case 1:
				in[1 + at] = (unsigned char)rnd();
				break;
			case 2: /* a length field blown up */
				in[1 + at] = 0xff;
				break;
			default: /* cut */
				n = at + 4 < n ? at + 4 : n;
				break;
			}
		}
		LLVMFuzzerTestOneInput(in, n + 1);
		struct mvcc_store *r;
		if (mvcc_restore(NULL, in + 1, n, &r) == 0) {
			accepted++;
			mvcc_free(r);
		}
	}
	/* Unfixed CRCs: always refused. */
	in[0] = 0;
	memcpy(in + 1, snap.data, snap.len);
	in[1 + snap.len / 2] ^= 0x10;
	LLVMFuzzerTestOneInput(in, snap.len + 1);
	cr_log_info("fuzz replay: %zu of 20000 mutations restored", accepted);
	free(in);
	free(snap.data);
}

Test(snapshot, big_store_streams_in_chunks, .timeout = 120)
{
	struct mvcc_store *s = h_store();
	enum { N = 100000 };
	char key[32], val[64];
	struct timespec t0, t1, t2;
	for (int i = 0; i < N; i++) {
		snprintf(key, sizeof(key), "/registry/segment/%08d", i * 7919 % N);
		snprintf(val, sizeof(val), "value-%d-%d", i, i * 31);
		h_put(s, key, val);
	}
	int64_t lease;
	cr_assert_eq(lease_grant(mvcc_leases(s), 0, 30, 0, &lease, NULL), 0);
	struct mvcc_result res;
	struct mvcc_op o = op_put_lease("/leader", "me", lease);
	h_apply(s, &o, &res);
	mvcc_result_free(&res);
	cr_assert_eq(mvcc_compact(s, N / 2), 0);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	struct h_sink snap = h_snapshot(s);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	cr_assert_leq(snap.max_chunk, 65536);
	cr_assert_gt(snap.chunks, 10);
	struct mvcc_store *r;
	cr_assert_eq(mvcc_restore(NULL, snap.data, snap.len, &r), 0);
	clock_gettime(CLOCK_MONOTONIC, &t2);
	struct h_sink again = h_snapshot(r);
	cr_assert_eq(again.len, snap.len);
	cr_assert(!memcmp(again.data, snap.data, snap.len));
	struct mvcc_stats a, b;
	mvcc_stats(s, &a);
	mvcc_stats(r, &b);
	cr_assert_eq(a.keys, N + 1);
	cr_assert_eq(b.keys, a.keys);
	cr_assert_eq(b.versions, a.versions);
	cr_assert_eq(b.revlog, a.revlog);
	cr_assert_eq(b.db_size_bytes, a.db_size_bytes);
	struct lease_ttl ttl;
	cr_assert_eq(lease_time_to_live(mvcc_leases(r), lease, 0, true, &ttl), 0);
	cr_assert_eq(ttl.nkeys, 1);
	lease_ttl_free(&ttl);
	o = op_range(S("/registry/segment/00012345"), NULL, 0);
	h_apply(r, &o, &res);
	cr_assert_eq(res.resp.u.range.nkvs, 1);
	mvcc_result_free(&res);
	fprintf(stderr,
		"snapshot of %d keys: %zu bytes in %zu chunks, encode %.0f ms, "
		"restore %.0f ms\n",
		N, snap.len, snap.chunks,
		(double)(t1.tv_sec - t0.tv_sec) * 1e3 +
			(double)(t1.tv_nsec - t0.tv_nsec) / 1e6,
		(double)(t2.tv_sec - t1.tv_sec) * 1e3 +
			(double)(t2.tv_nsec - t1.tv_nsec) / 1e6);
	free(again.data);
	free(snap.data);
	mvcc_free(r);
	mvcc_free(s);
}
