/*
 * test_mvcc_failmalloc: fail the i-th allocation in turn during a big
 * txn, a lease revoke, a restore, a snapshot, a lease grant and watch
 * routing. A failed write must leave the store byte-for-byte as it was
 * (snapshot equal) and leak nothing (malloc's byte count equal); watch
 * routing must lose no event. malloc is interposed, which ASan does not
 * allow, so the SAN build skips this file.
 */
#include "test_mvcc_helpers.h"

#if defined(__SANITIZE_ADDRESS__)

Test(failmalloc, skipped_under_asan)
{
	cr_skip_test("malloc cannot be interposed under ASan");
}

#else

#include <malloc.h>

#include "meta/watch.h"

extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t m);
extern void *__libc_realloc(void *p, size_t n);
extern void __libc_free(void *p);

static long fm_countdown = -1; /* fail when it reaches 0 */
static long fm_failed;
static long long fm_live; /* bytes handed out and not freed (usable sizes) */

static bool fm_fail(void)
{
	if (fm_countdown < 0)
		return false;
	if (fm_countdown-- == 0) {
		fm_failed++;
		return true;
	}
	return false;
}

void *malloc(size_t n)
{
	void *p = fm_fail() ? NULL : __libc_malloc(n);
	if (p)
		fm_live += (long long)malloc_usable_size(p);
	return p;
}

void *calloc(size_t n, size_t m)
{
	void *p = fm_fail() ? NULL : __libc_calloc(n, m);
	if (p)
		fm_live += (long long)malloc_usable_size(p);
	return p;
}

void *realloc(void *p, size_t n)
{
	if (fm_fail())
		return NULL;
	long long old = p ? (long long)malloc_usable_size(p) : 0;
	void *q = __libc_realloc(p, n);
	if (q)
		fm_live += (long long)malloc_usable_size(q) - old;
	else if (!n)
		fm_live -= old;
	return q;
}

void free(void *p)
{
	if (p)
		fm_live -= (long long)malloc_usable_size(p);
	__libc_free(p);
}

static void arm(long i)
{
	fm_failed = 0;
	fm_countdown = i;
}

static bool disarm(void)
{
	fm_countdown = -1;
	return fm_failed > 0;
}

static size_t heap_used(void)
{
	return (size_t)fm_live;
}

static int64_t lease_a, lease_b;

static struct mvcc_store *base(void)
{
	struct mvcc_store *s = h_store();
	struct lease_table *t = mvcc_leases(s);
	cr_assert_eq(lease_grant(t, 0, 30, 0, &lease_a, NULL), 0);
	cr_assert_eq(lease_grant(t, 0, 30, 0, &lease_b, NULL), 0);
	char k[16];
	for (int i = 0; i < 40; i++) {
		snprintf(k, sizeof(k), "k%02d", i);
		struct mvcc_op o = op_put_lease(k, "value", i % 3 == 0 ? lease_a : 0);
		struct mvcc_result res;
		h_apply(s, &o, &res);
		mvcc_result_free(&res);
	}
	h_put(s, "k05", "again");
	return s;
}

static struct mvcc_store *clone(const struct mvcc_store *s)
{
	struct h_sink snap = h_snapshot(s);
	struct mvcc_store *c;
	cr_assert_eq(mvcc_restore(NULL, snap.data, snap.len, &c), 0);
	free(snap.data);
	/* Keep the revision log's history too: restore rebuilds it. */
	return c;
}

static void assert_snap_eq(const struct mvcc_store *a, const struct mvcc_store *b)
{
	struct h_sink x = h_snapshot(a), y = h_snapshot(b);
	cr_assert_eq(x.len, y.len);
	cr_assert(!memcmp(x.data, y.data, x.len));
	free(x.data);
	free(y.data);
}

static size_t lease_keys(struct mvcc_store *s, int64_t id)
{
	struct lease_ttl ttl;
	cr_assert_eq(lease_time_to_live(mvcc_leases(s), id, 0, false, &ttl), 0);
	return ttl.key_count;
}

Test(failmalloc, txn_rolls_back_exactly)
{
	struct mvcc_store *s = base();
	struct mvcc_compare c = cmp_num("k01", MVCC_TARGET_VERSION, MVCC_CMP_EQUAL, 1);
	struct mvcc_op nested_ops[] = {op_put("n1", "x")};
	struct mvcc_op del = op_del("k10", "k20");
	del.u.del.prev_kv = true;
	struct mvcc_op all = op_range("\0", 1, "\0", 1);
	all.u.range.sort_order = MVCC_SORT_DESCEND;
	all.u.range.sort_target = MVCC_SORT_VALUE;
	struct mvcc_op pv = op_put_lease("k03", "moved", lease_b);
	pv.u.put.prev_kv = true;
	struct mvcc_op ops[] = {
		op_put_lease("new", "v", lease_b),       pv, del, all,
		op_txn(NULL, 0, nested_ops, 1, NULL, 0),
	};
	struct mvcc_op t = op_txn(&c, 1, ops, 5, NULL, 0);
	struct mvcc_store *want = clone(s);
	struct mvcc_result res;
	h_apply(want, &t, &res);
	mvcc_result_free(&res);

	long failures = 0;
	for (long i = 0;; i++) {
		size_t heap0 = heap_used();
		struct mvcc_store *x = clone(s);
		size_t na = lease_keys(x, lease_a), nb = lease_keys(x, lease_b);
		arm(i);
		int rc = mvcc_apply(x, &t, &res);
		bool failed = disarm();
		if (!failed) {
			cr_assert_eq(rc, 0);
			mvcc_result_free(&res);
			assert_snap_eq(x, want);
			cr_assert_eq(lease_keys(x, lease_b), lease_keys(want, lease_b));
			mvcc_free(x);
			break;
		}
		cr_assert_eq(rc, -ENOMEM, "allocation %ld: %d", i, rc);
		assert_snap_eq(x, s);
		cr_assert_eq(lease_keys(x, lease_a), na);
		cr_assert_eq(lease_keys(x, lease_b), nb);
		mvcc_free(x); /* capacity reserved by the failed txn goes here */
		cr_assert_eq(heap_used(), heap0, "allocation %ld leaked", i);
		failures++;
	}
	cr_assert_gt(failures, 10);
	cr_log_info("txn: %ld allocation points", failures);
	mvcc_free(want);
	mvcc_free(s);
}

Test(failmalloc, revoke_rolls_back_exactly)
{
	struct mvcc_store *s = base();
	long failures = 0;
	for (long i = 0;; i++) {
		size_t heap0 = heap_used();
		struct mvcc_store *x = clone(s);
		int64_t rev;
		arm(i);
		int rc = mvcc_lease_revoke(x, lease_a, &rev);
		bool failed = disarm();
		if (!failed) {
			cr_assert_eq(rc, 0);
			cr_assert_eq(rev, mvcc_rev(s) + 1);
			cr_assert_not(lease_exists(mvcc_leases(x), lease_a));
			mvcc_free(x);
			break;
		}
		cr_assert_eq(rc, -ENOMEM);
		assert_snap_eq(x, s);
		cr_assert_eq(lease_keys(x, lease_a), 14);
		mvcc_free(x);
		cr_assert_eq(heap_used(), heap0, "allocation %ld leaked", i);
		failures++;
	}
	cr_assert_gt(failures, 1);
	mvcc_free(s);
}

Test(failmalloc, restore_snapshot_grant)
{
	struct mvcc_store *s = base();
	struct h_sink snap = h_snapshot(s);
	long failures = 0;
	for (long i = 0;; i++) {
		struct mvcc_store *x = NULL;
		size_t heap0 = heap_used();
		arm(i);
		int rc = mvcc_restore(NULL, snap.data, snap.len, &x);
		bool failed = disarm();
		if (!failed) {
			cr_assert_eq(rc, 0);
			assert_snap_eq(x, s);
			mvcc_free(x);
			break;
		}
		cr_assert_eq(rc, -ENOMEM, "allocation %ld: %d", i, rc);
		size_t h1 = heap_used();
		cr_assert_eq(h1, heap0, "allocation %ld leaked %ld", i, (long)(h1 - heap0));
		failures++;
	}
	cr_assert_gt(failures, 40);

	struct h_sink k = {0};
	arm(0);
	int rc = mvcc_snapshot(s, h_sink_write, &k);
	disarm();
	cr_assert_eq(rc, -ENOMEM);
	free(k.data);

	size_t n = lease_count(mvcc_leases(s));
	arm(0);
	rc = lease_grant(mvcc_leases(s), 0, 10, 0, NULL, NULL);
	disarm();
	cr_assert_eq(rc, -ENOMEM);
	cr_assert_eq(lease_count(mvcc_leases(s)), n);
	free(snap.data);
	mvcc_free(s);
}

/* Routing under memory failure degrades to catch-up: nothing is lost. */
Test(failmalloc, watch_loses_nothing)
{
	for (long i = 0; i < 200; i++) {
		struct mvcc_store *s = h_store();
		struct watch_registry *r;
		cr_assert_eq(watch_registry_new(s, 4, &r), 0);
		struct watch_options o = {
			.key = "k", .key_len = 1, .range_end = "l", .range_end_len = 1};
		int64_t w1, w2;
		cr_assert_eq(watch_create(r, s, &o, &w1), 0);
		o.key = "k5";
		o.key_len = 2;
		o.range_end_len = 0;
		cr_assert_eq(watch_create(r, s, &o, &w2), 0);
		char k[8];
		for (int j = 0; j < 12; j++) {
			snprintf(k, sizeof(k), "k%d", j % 7);
			h_put(s, k, "v");
			if (j == 6)
				arm(i);
			watch_notify(r, s);
			if (j == 6)
				disarm();
		}
		arm(i);
		watch_sync(r, s, 100);
		disarm();
		int64_t got1[32], got2[32];
		size_t n1 = 0, n2 = 0;
		for (int guard = 0; guard < 1000; guard++) {
			int64_t id;
			if (!watch_next_ready(r, &id)) {
				if (watch_sync(r, s, 100) == 0 && !watch_next_ready(r, &id))
					break;
				continue;
			}
			struct watch_delivery d;
			cr_assert_eq(watch_take(r, id, &d), 0);
			for (size_t e = 0; e < d.nevents; e++) {
				cr_assert_lt(n1, 32);
				cr_assert_lt(n2, 32);
				if (id == w1)
					got1[n1++] = d.events[e]->kv.mod_revision;
				else
					got2[n2++] = d.events[e]->kv.mod_revision;
			}
			watch_delivery_free(&d);
		}
		cr_assert_eq(n1, 12, "failure %ld", i);
		for (size_t e = 0; e < n1; e++)
			cr_assert_eq(got1[e], (int64_t)e + 2, "failure %ld", i);
		cr_assert_eq(n2, 1, "failure %ld", i);
		cr_assert_eq(got2[0], 7); /* k5 */
		watch_registry_free(r);
		mvcc_free(s);
	}
}

#endif
