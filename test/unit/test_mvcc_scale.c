/*
 * test_mvcc_scale: 1M keys (100k under the sanitizers; MVCC_SCALE_KEYS
 * overrides) put in scattered order, then a full scan in key order, point
 * reads, prefix pages, updates, compaction and a full delete — timed, with
 * the heap used per key printed (malloc's own count where it has one).
 */
#include <malloc.h>
#include <time.h>

#include "test_mvcc_helpers.h"

#if defined(__SANITIZE_ADDRESS__)
#define DEFAULT_KEYS 100000
#else
#define DEFAULT_KEYS 1000000
#endif

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static size_t heap_used(void)
{
	struct mallinfo2 mi = mallinfo2();
	return mi.uordblks + mi.hblkhd;
}

Test(scale, million_keys, .timeout = 300)
{
	const char *env = getenv("MVCC_SCALE_KEYS");
	size_t n = env ? strtoul(env, NULL, 10) : DEFAULT_KEYS;
	if (n < 1000)
		n = 1000;
	size_t heap0 = heap_used();
	struct mvcc_store *s = h_store();
	char key[48], val[48];
	double t0 = now_s();
	for (size_t i = 0; i < n; i++) {
		/* A permutation of 0..n-1: keys arrive out of order. */
		size_t k = (i * 2654435761u) % n;
		snprintf(key, sizeof(key), "/mooncake/segments/%010zu", k);
		snprintf(val, sizeof(val), "agent-%05zu:%016zx", k % 1000, k * 977);
		struct mvcc_op o = op_put(key, val);
		struct mvcc_result res;
		int rc = mvcc_apply(s, &o, &res);
		if (rc)
			cr_assert_fail("put %zu: %s", i, mvcc_strerror(rc));
		mvcc_result_free(&res);
	}
	double t_put = now_s() - t0;
	struct mvcc_stats st;
	mvcc_stats(s, &st);
	size_t heap1 = heap_used();

	/* Full scan in key order. */
	t0 = now_s();
	struct mvcc_op o = op_range(S("/mooncake/segments/"), S("/mooncake/segments0"));
	o.u.range.keys_only = true;
	struct mvcc_result res;
	h_apply(s, &o, &res);
	double t_scan = now_s() - t0;
	cr_assert_eq(res.resp.u.range.nkvs, n);
	cr_assert_eq(res.resp.u.range.count, (int64_t)n);
	for (size_t i = 1; i < n; i++)
		cr_assert_lt(memcmp(res.resp.u.range.kvs[i - 1].key,
				    res.resp.u.range.kvs[i].key,
				    res.resp.u.range.kvs[i].key_len),
			     0);
	mvcc_result_free(&res);

	/* Point reads and a page of a prefix. */
	t0 = now_s();
	for (size_t i = 0; i < 100000; i++) {
		snprintf(key, sizeof(key), "/mooncake/segments/%010zu", (i * 7919) % n);
		o = op_get(key);
		h_apply(s, &o, &res);
		cr_assert_eq(res.resp.u.range.nkvs, 1);
		mvcc_result_free(&res);
	}
	double t_get = now_s() - t0;
	o = op_range(S("/mooncake/segments/00000005"), S("/mooncake/segments/00000006"));
	o.u.range.limit = 10;
	h_apply(s, &o, &res);
	cr_assert_eq(res.resp.u.range.nkvs, n >= 60000 ? 10 : res.resp.u.range.nkvs);
	mvcc_result_free(&res);

	/* Updates, then compaction drops the old versions. */
	t0 = now_s();
	for (size_t i = 0; i < n / 10; i++) {
		snprintf(key, sizeof(key), "/mooncake/segments/%010zu", i);
		h_put(s, key, "updated");
	}
	double t_upd = now_s() - t0;
	t0 = now_s();
	cr_assert_eq(mvcc_compact(s, mvcc_rev(s)), 0);
	double t_compact = now_s() - t0;
	struct mvcc_stats st2;
	mvcc_stats(s, &st2);
	cr_assert_eq(st2.versions, n);
	cr_assert_eq(st2.keys, n);

	/* One delete of everything is one revision. */
	int64_t rev = mvcc_rev(s);
	t0 = now_s();
	cr_assert_eq(h_del(s, "/", "0"), (int64_t)n);
	double t_del = now_s() - t0;
	cr_assert_eq(mvcc_rev(s), rev + 1);
	mvcc_free(s);

	double per_key = (double)(heap1 - heap0) / (double)n;
	fprintf(stderr,
		"scale: %zu keys: put %.2f s (%.0f/s), scan %.0f ms, 100k gets %.0f ms, "
		"%zu updates %.0f ms, compact %.0f ms, delete-all %.0f ms\n"
		"scale: heap %.1f bytes/key (malloc's count, 0 where malloc cannot tell; "
		"store's own estimate "
		"%.1f, db size %.1f bytes/key for %zu-byte keys and %zu-byte values)\n",
		n, t_put, (double)n / t_put, t_scan * 1e3, t_get * 1e3, n / 10, t_upd * 1e3,
		t_compact * 1e3, t_del * 1e3, heap1 > heap0 ? per_key : 0.0,
		(double)st.memory_bytes / (double)n, (double)st.db_size_bytes / (double)n,
		strlen("/mooncake/segments/0000000000"),
		strlen("agent-00000:0000000000000000"));
}
