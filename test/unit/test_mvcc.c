/*
 * test_mvcc: etcd semantics of the MVCC store — revisions, versions,
 * range options, compaction, put/delete options and txn — against
 * results derived by hand from etcd's rules (first write is revision 2).
 */
#include "test_mvcc_helpers.h"

#include "meta/bolt.h"

static struct mvcc_store *s;

static void setup(void)
{
	s = h_store();
}

static void teardown(void)
{
	mvcc_free(s);
}

TestSuite(mvcc, .init = setup, .fini = teardown);

static int64_t txn_ok(struct mvcc_op *op, bool *succeeded)
{
	struct mvcc_result res;
	int64_t rev = h_apply(s, op, &res);
	if (succeeded)
		*succeeded = res.resp.u.txn.succeeded;
	mvcc_result_free(&res);
	return rev;
}

static int apply_rc(struct mvcc_op *op)
{
	struct mvcc_result res;
	int rc = mvcc_apply(s, op, &res);
	if (!rc)
		mvcc_result_free(&res);
	return rc;
}

Test(mvcc, revisions_versions)
{
	cr_assert_eq(mvcc_rev(s), 1);
	cr_assert_eq(mvcc_compact_rev(s), -1);
	cr_assert_eq(h_put(s, "a", "1"), 2);
	struct mvcc_kv kv = h_kv(s, "a");
	cr_assert_eq(kv.create_revision, 2);
	cr_assert_eq(kv.mod_revision, 2);
	cr_assert_eq(kv.version, 1);

	cr_assert_eq(h_put(s, "a", "2"), 3);
	kv = h_kv(s, "a");
	cr_assert_eq(kv.create_revision, 2);
	cr_assert_eq(kv.mod_revision, 3);
	cr_assert_eq(kv.version, 2);

	cr_assert_eq(h_put(s, "b", "x"), 4);
	cr_assert_eq(h_del(s, "a", NULL), 1);
	cr_assert_eq(mvcc_rev(s), 5);
	cr_assert_null(h_get(s, "a"));
	/* Deleting nothing changes nothing, not even the revision. */
	cr_assert_eq(h_del(s, "a", NULL), 0);
	cr_assert_eq(h_del(s, "zz", ""), 0);
	cr_assert_eq(mvcc_rev(s), 5);

	cr_assert_eq(h_put(s, "a", "3"), 6);
	kv = h_kv(s, "a");
	cr_assert_eq(kv.create_revision, 6);
	cr_assert_eq(kv.mod_revision, 6);
	cr_assert_eq(kv.version, 1);

	/* Reads in the past. */
	struct mvcc_result res;
	struct mvcc_op o = op_range(S("a"), S("c"));
	o.u.range.revision = 3;
	h_apply(s, &o, &res);
	cr_assert_str_eq(h_keys(&res.resp.u.range), "a");
	cr_assert_eq(res.resp.u.range.kvs[0].mod_revision, 3);
	cr_assert_eq(res.resp.u.range.kvs[0].version, 2);
	cr_assert_eq(res.revision, 6, "the header is the current revision");
	mvcc_result_free(&res);
	o.u.range.revision = 5;
	h_apply(s, &o, &res);
	cr_assert_str_eq(h_keys(&res.resp.u.range), "b");
	mvcc_result_free(&res);
	o.u.range.revision = 1;
	h_apply(s, &o, &res);
	cr_assert_eq(res.resp.u.range.nkvs, 0);
	mvcc_result_free(&res);
	o.u.range.revision = 7;
	cr_assert_eq(mvcc_apply(s, &o, &res), MVCC_EFUTURE_REV);
}

Test(mvcc, txn_is_one_revision_with_sub_revisions)
{
	h_put(s, "b", "1");
	struct mvcc_op ops[] = {op_put("c", "1"), op_put("d", "1"), op_del("b", NULL)};
	struct mvcc_op t = op_txn(NULL, 0, ops, 3, NULL, 0);
	bool ok;
	cr_assert_eq(txn_ok(&t, &ok), 3);
	cr_assert(ok);
	cr_assert_eq(h_kv(s, "c").mod_revision, 3);
	cr_assert_eq(h_kv(s, "d").mod_revision, 3);
	cr_assert_null(h_get(s, "b"));
	uint64_t pos;
	cr_assert_eq(mvcc_hist_seek(s, 3, &pos), 0);
	struct mvcc_event ev;
	const char *want[] = {"c", "d", "b"};
	for (int i = 0; i < 3; i++) {
		cr_assert_eq(mvcc_hist_event(s, pos + i, &ev), 0);
		cr_assert_eq(ev.kv.mod_revision, 3);
		cr_assert_eq(ev.kv.key_len, 1);
		cr_assert_eq(ev.kv.key[0], want[i][0]);
		cr_assert_eq(ev.type, i < 2 ? MVCC_EVENT_PUT : MVCC_EVENT_DELETE);
	}
	cr_assert_eq(mvcc_hist_event(s, pos + 3, &ev), -ENOENT);
	cr_assert(ev.type == MVCC_EVENT_DELETE && ev.has_prev_kv);

	/* A read-only txn does not bump the revision. */
	struct mvcc_op r[] = {op_get("c")};
	t = op_txn(NULL, 0, r, 1, NULL, 0);
	cr_assert_eq(txn_ok(&t, NULL), 3);
	/* Nor a txn whose writes change nothing. */
	struct mvcc_op d[] = {op_del("nothing", NULL)};
	t = op_txn(NULL, 0, d, 1, NULL, 0);
	cr_assert_eq(txn_ok(&t, NULL), 3);
}

/* The range fixture: puts at revisions 2..8, then b again at 9. */
static void range_fixture(void)
{
	h_put(s, "a", "m");     /* 2 */
	h_put(s, "b", "c");     /* 3 */
	h_put(s, "c", "b");     /* 4 */
	h_put(s, "foo", "z");   /* 5 */
	h_put(s, "foo/1", "y"); /* 6 */
	h_put(s, "foo/2", "x"); /* 7 */
	h_put(s, "fop", "a");   /* 8 */
	h_put(s, "b", "a2");    /* 9: version 2 */
}

static const char *range_keys(struct mvcc_op *o, bool *more, int64_t *count)
{
	struct mvcc_result res;
	h_apply(s, o, &res);
	static char buf[8192];
	strcpy(buf, h_keys(&res.resp.u.range));
	if (more)
		*more = res.resp.u.range.more;
	if (count)
		*count = res.resp.u.range.count;
	mvcc_result_free(&res);
	return buf;
}

Test(mvcc, range_spans)
{
	range_fixture();
	struct mvcc_op o = op_range(S("a"), S("c"));
	int64_t count;
	cr_assert_str_eq(range_keys(&o, NULL, &count), "a,b");
	cr_assert_eq(count, 2);
	o = op_range(S("b"), "\0", 1);
	cr_assert_str_eq(range_keys(&o, NULL, NULL), "b,c,foo,foo/1,foo/2,fop");
	o = op_range("\0", 1, "\0", 1);
	cr_assert_str_eq(range_keys(&o, NULL, &count), "a,b,c,foo,foo/1,foo/2,fop");
	cr_assert_eq(count, 7);
	o = op_range(S("foo"), S("fop")); /* prefix "foo" */
	cr_assert_str_eq(range_keys(&o, NULL, NULL), "foo,foo/1,foo/2");
	o = op_range(S("foo/"), S("foo0")); /* prefix "foo/" */
	cr_assert_str_eq(range_keys(&o, NULL, NULL), "foo/1,foo/2");
	o = op_range(S("c"), S("b")); /* end before key: nothing */
	cr_assert_str_eq(range_keys(&o, NULL, &count), "");
	cr_assert_eq(count, 0);
	o = op_range(S("foo"), NULL, 0); /* single key, not a prefix */
	cr_assert_str_eq(range_keys(&o, NULL, NULL), "foo");
	o = op_range(S("fo"), NULL, 0);
	cr_assert_str_eq(range_keys(&o, NULL, &count), "");
	cr_assert_eq(count, 0);
}

Test(mvcc, range_limit_more_count)
{
	range_fixture();
	struct mvcc_op o = op_range("\0", 1, "\0", 1);
	bool more;
	int64_t count;
	o.u.range.limit = 2;
	cr_assert_str_eq(range_keys(&o, &more, &count), "a,b");
	cr_assert(more);
	cr_assert_eq(count, 7);
	o.u.range.limit = 7;
	range_keys(&o, &more, &count);
	cr_assert_not(more);
	o.u.range.limit = 8;
	range_keys(&o, &more, &count);
	cr_assert_not(more);
	o.u.range.limit = -1; /* negative: no limit */
	cr_assert_str_eq(range_keys(&o, &more, NULL), "a,b,c,foo,foo/1,foo/2,fop");
	cr_assert_not(more);
}

Test(mvcc, range_sort)
{
	range_fixture();
	struct mvcc_op o = op_range("\0", 1, "\0", 1);
	bool more;
	int64_t count;
	o.u.range.sort_target = MVCC_SORT_KEY;
	o.u.range.sort_order = MVCC_SORT_DESCEND;
	o.u.range.limit = 3;
	cr_assert_str_eq(range_keys(&o, &more, &count), "fop,foo/2,foo/1");
	cr_assert(more);
	cr_assert_eq(count, 7);
	o.u.range.limit = 0;
	o.u.range.sort_target = MVCC_SORT_MOD;
	o.u.range.sort_order = MVCC_SORT_ASCEND;
	cr_assert_str_eq(range_keys(&o, NULL, NULL), "a,c,foo,foo/1,foo/2,fop,b");
	o.u.range.sort_order = MVCC_SORT_DESCEND;
	o.u.range.limit = 2;
	cr_assert_str_eq(range_keys(&o, &more, NULL), "b,fop");
	cr_assert(more);
	o.u.range.limit = 0;
	o.u.range.sort_target = MVCC_SORT_CREATE;
	o.u.range.sort_order = MVCC_SORT_ASCEND;
	cr_assert_str_eq(range_keys(&o, NULL, NULL), "a,b,c,foo,foo/1,foo/2,fop");
	o.u.range.sort_order = MVCC_SORT_DESCEND;
	cr_assert_str_eq(range_keys(&o, NULL, NULL), "fop,foo/2,foo/1,foo,c,b,a");
	o.u.range.sort_target = MVCC_SORT_VERSION; /* ties stay in key order */
	cr_assert_str_eq(range_keys(&o, NULL, NULL), "b,a,c,foo,foo/1,foo/2,fop");
	o.u.range.sort_target = MVCC_SORT_VALUE;
	o.u.range.sort_order = MVCC_SORT_ASCEND;
	cr_assert_str_eq(range_keys(&o, NULL, NULL), "fop,b,c,a,foo/2,foo/1,foo");
	o.u.range.sort_order = MVCC_SORT_DESCEND;
	cr_assert_str_eq(range_keys(&o, NULL, NULL), "foo,foo/1,foo/2,a,c,b,fop");
	o.u.range.sort_target = MVCC_SORT_KEY;
	o.u.range.sort_order = MVCC_SORT_ASCEND;
	cr_assert_str_eq(range_keys(&o, NULL, NULL), "a,b,c,foo,foo/1,foo/2,fop");

	/* etcd quirk: a non-key target with order NONE sorts ascending, but
	 * the limit was applied first (limit+1 fetched in key order). */
	o.u.range.sort_target = MVCC_SORT_VERSION;
	o.u.range.sort_order = MVCC_SORT_NONE;
	o.u.range.limit = 2;
	cr_assert_str_eq(range_keys(&o, &more, NULL), "a,c");
	cr_assert(more);

	/* An order etcd does not know: no sort, everything fetched, then
	 * cut at the limit (what etcd 3.4.23 answers). */
	o.u.range.sort_order = 7;
	cr_assert_str_eq(range_keys(&o, &more, NULL), "a,b");
	cr_assert(more);
	/* A target it does not know: refused where it would sort (etcd
	 * crashes there), fine where no sort happens. */
	o.u.range.sort_target = 9;
	cr_assert_str_eq(range_keys(&o, &more, NULL), "a,b");
	o.u.range.sort_order = MVCC_SORT_NONE;
	struct mvcc_result res;
	cr_assert_eq(mvcc_apply(s, &o, &res), -EINVAL);
	o.u.range.sort_order = MVCC_SORT_DESCEND;
	cr_assert_eq(mvcc_apply(s, &o, &res), -EINVAL);
}

Test(mvcc, range_options)
{
	range_fixture();
	struct mvcc_op o = op_range("\0", 1, "\0", 1);
	struct mvcc_result res;
	o.u.range.keys_only = true;
	h_apply(s, &o, &res);
	cr_assert_eq(res.resp.u.range.nkvs, 7);
	for (size_t i = 0; i < 7; i++) {
		cr_assert_eq(res.resp.u.range.kvs[i].value_len, 0);
		cr_assert_gt(res.resp.u.range.kvs[i].mod_revision, 0);
	}
	mvcc_result_free(&res);
	o.u.range.keys_only = false;
	o.u.range.count_only = true;
	o.u.range.limit = 1;
	h_apply(s, &o, &res);
	cr_assert_eq(res.resp.u.range.nkvs, 0);
	cr_assert_eq(res.resp.u.range.count, 7);
	cr_assert_not(res.resp.u.range.more);
	mvcc_result_free(&res);

	o = op_range("\0", 1, "\0", 1);
	int64_t count;
	bool more;
	o.u.range.min_mod_revision = 6;
	cr_assert_str_eq(range_keys(&o, NULL, &count), "b,foo/1,foo/2,fop");
	cr_assert_eq(count, 7, "count is before the filters, like etcd");
	o.u.range.limit = 2;
	cr_assert_str_eq(range_keys(&o, &more, NULL), "b,foo/1");
	cr_assert(more);
	o = op_range("\0", 1, "\0", 1);
	o.u.range.max_mod_revision = 4;
	cr_assert_str_eq(range_keys(&o, NULL, NULL), "a,c");
	o = op_range("\0", 1, "\0", 1);
	o.u.range.min_create_revision = 3;
	o.u.range.max_create_revision = 5;
	cr_assert_str_eq(range_keys(&o, NULL, NULL), "b,c,foo");

	/* At revision 8 b still had its first value. */
	o = op_get("b");
	o.u.range.revision = 8;
	h_apply(s, &o, &res);
	cr_assert_eq(res.resp.u.range.nkvs, 1);
	cr_assert_eq(res.resp.u.range.kvs[0].mod_revision, 3);
	cr_assert_eq(res.resp.u.range.kvs[0].value_len, 1);
	cr_assert_eq(res.resp.u.range.kvs[0].value[0], 'c');
	mvcc_result_free(&res);
}

/* Steps toward a compaction walk a bounded share of the revision log,
 * never split a revision, and always move. */
Test(mvcc, compaction_steps)
{
	char k[16];
	for (int i = 0; i < 10; i++) { /* revisions 2..11 */
		snprintf(k, sizeof(k), "k%d", i);
		h_put(s, k, "v");
	}
	cr_assert_eq(h_del(s, "k", "k5"), 5); /* 12: five entries */
	h_put(s, "z", "1");                   /* 13 */
	h_put(s, "z", "2");                   /* 14 */
	cr_assert_eq(mvcc_compact_step(s, 14, 100), 14, "within the bound");
	cr_assert_eq(mvcc_compact_step(s, 14, 3), 5, "revisions 2-4 below it");
	cr_assert_eq(mvcc_compact(s, 5), 0);
	cr_assert_eq(mvcc_compact_step(s, 14, 7), 12, "7 entries below 12");
	cr_assert_eq(mvcc_compact(s, 12), 0);
	cr_assert_eq(mvcc_compact_step(s, 14, 2), 13, "the delete's five entries at once");
	cr_assert_eq(mvcc_compact(s, 13), 0);
	cr_assert_eq(mvcc_compact_step(s, 13, 2), 13, "not past the last compaction");
	cr_assert_eq(mvcc_compact_step(s, 14, 0), 14, "the next revision with entries");
	cr_assert_eq(mvcc_compact(s, 14), 0);
	cr_assert_str_eq(h_get(s, "z"), "2");
	cr_assert_str_eq(h_get(s, "k7"), "v");
	cr_assert_null(h_get(s, "k1"));
}

Test(mvcc, compaction)
{
	h_put(s, "a", "1");  /* 2 */
	h_put(s, "a", "2");  /* 3 */
	h_put(s, "b", "1");  /* 4 */
	h_del(s, "a", NULL); /* 5 */
	h_put(s, "c", "1");  /* 6 */
	h_put(s, "a", "3");  /* 7 */
	uint64_t size0 = mvcc_db_size_bytes(s);
	cr_assert_eq(mvcc_compact(s, 8), MVCC_EFUTURE_REV);
	cr_assert_eq(mvcc_compact(s, 4), 0);
	cr_assert_eq(mvcc_compact_rev(s), 4);
	cr_assert_eq(mvcc_compact(s, 4), MVCC_ECOMPACTED);
	cr_assert_eq(mvcc_compact(s, 3), MVCC_ECOMPACTED);
	cr_assert_lt(mvcc_db_size_bytes(s), size0);

	struct mvcc_result res;
	struct mvcc_op o = op_range("\0", 1, "\0", 1);
	o.u.range.revision = 3;
	cr_assert_eq(mvcc_apply(s, &o, &res), MVCC_ECOMPACTED);
	o.u.range.revision = 4; /* the compaction revision itself is readable */
	cr_assert_str_eq(range_keys(&o, NULL, NULL), "a,b");
	h_apply(s, &o, &res);
	cr_assert_eq(res.resp.u.range.kvs[0].mod_revision, 3);
	cr_assert_eq(res.resp.u.range.kvs[0].version, 2);
	mvcc_result_free(&res);
	o.u.range.revision = 5;
	cr_assert_str_eq(range_keys(&o, NULL, NULL), "b");
	o.u.range.revision = 0;
	cr_assert_str_eq(range_keys(&o, NULL, NULL), "a,b,c");

	/* Compact at the delete: the tombstone at 5 stays for watchers. */
	cr_assert_eq(mvcc_compact(s, 5), 0);
	o.u.range.revision = 5;
	cr_assert_str_eq(range_keys(&o, NULL, NULL), "b");
	uint64_t pos;
	struct mvcc_event ev;
	cr_assert_eq(mvcc_hist_seek(s, 4, &pos), MVCC_ECOMPACTED);
	cr_assert_eq(mvcc_hist_seek(s, 5, &pos), 0);
	cr_assert_eq(mvcc_hist_event(s, pos, &ev), 0);
	cr_assert_eq(ev.type, MVCC_EVENT_DELETE);
	cr_assert_eq(ev.kv.mod_revision, 5);
	cr_assert_eq(mvcc_hist_event(s, pos - 1, &ev), MVCC_ECOMPACTED);

	cr_assert_eq(mvcc_compact(s, 7), 0);
	struct mvcc_stats st;
	mvcc_stats(s, &st);
	cr_assert_eq(st.versions, 3); /* a@7, b@4, c@6 */
	cr_assert_eq(st.keys, 3);
	cr_assert_eq(st.key_nodes, 3);
	cr_assert_eq(st.revlog, 1); /* a@7 */
	cr_assert_eq(st.db_size_bytes,
		     3 * (2 + MVCC_VERSION_OVERHEAD_BYTES)); /* 1-byte keys and values */
	o.u.range.revision = 7;
	cr_assert_str_eq(range_keys(&o, NULL, NULL), "a,b,c");
	cr_assert_eq(h_kv(s, "a").create_revision, 7);
	cr_assert_eq(h_kv(s, "b").mod_revision, 4);

	/* A key deleted below the compaction disappears entirely. */
	h_del(s, "c", NULL); /* 8 */
	h_put(s, "d", "1");  /* 9 */
	cr_assert_eq(mvcc_compact(s, 9), 0);
	mvcc_stats(s, &st);
	cr_assert_eq(st.key_nodes, 3);
	cr_assert_eq(st.versions, 3);

	/* b@4 was kept by every compaction so far; a delete, then a
	 * compaction at exactly the delete: the tombstone supersedes b@4,
	 * which goes although its log entry went long ago. */
	h_del(s, "b", NULL); /* 10 */
	cr_assert_eq(mvcc_compact(s, 10), 0);
	mvcc_stats(s, &st);
	cr_assert_eq(st.versions, 3, "a@7, b's tombstone@10, d@9");
	cr_assert_eq(st.db_size_bytes, 2 * (2 + MVCC_VERSION_OVERHEAD_BYTES) +
					       (1 + MVCC_VERSION_OVERHEAD_BYTES));
	o.u.range.revision = 10;
	cr_assert_str_eq(range_keys(&o, NULL, NULL), "a,d");
}

/* Every key at rev, with its value and revisions, as one string (rev
 * below the compaction: "compacted"). */
static const char *dump_at(struct mvcc_store *st, int64_t rev, char *buf, size_t cap)
{
	struct mvcc_result res;
	struct mvcc_op o = op_range("\0", 1, "\0", 1);
	o.u.range.revision = rev;
	int rc = mvcc_apply(st, &o, &res);
	if (rc) {
		snprintf(buf, cap, "error %d", rc);
		return buf;
	}
	size_t n = 0;
	buf[0] = '\0';
	for (size_t i = 0; i < res.resp.u.range.nkvs && n < cap - 128; i++) {
		const struct mvcc_kv *kv = &res.resp.u.range.kvs[i];
		n += (size_t)snprintf(buf + n, cap - n, "%.*s=%.*s@%lld/%lld/%lld ",
				      (int)kv->key_len, kv->key, (int)kv->value_len, kv->value,
				      (long long)kv->mod_revision,
				      (long long)kv->create_revision, (long long)kv->version);
	}
	mvcc_result_free(&res);
	return buf;
}

/* The events from rev on, with their previous versions, as one string. */
static const char *dump_events(struct mvcc_store *st, int64_t rev, char *buf, size_t cap)
{
	uint64_t pos;
	struct mvcc_event ev;
	size_t n = 0;
	int rc = mvcc_hist_seek(st, rev, &pos);
	snprintf(buf, cap, "seek %d ", rc);
	n = strlen(buf);
	for (; !rc && (rc = mvcc_hist_event(st, pos, &ev)) == 0 && n < cap - 128; pos++)
		n += (size_t)snprintf(
			buf + n, cap - n, "%d:%.*s@%lld<%lld ", ev.type, (int)ev.kv.key_len,
			ev.kv.key, (long long)ev.kv.mod_revision,
			ev.has_prev_kv ? (long long)ev.prev_kv.mod_revision : 0ll);
	snprintf(buf + n, cap - n, "end %d", rc);
	return buf;
}

/* lz (compacted lazily, partly freed) answers as z (compacted at once). */
static void same_answers(struct mvcc_store *lz, struct mvcc_store *z)
{
	static char a[65536], b[65536];
	int64_t c = mvcc_compact_rev(z), rev = mvcc_rev(z);
	cr_assert_eq(mvcc_compact_rev(lz), c);
	int64_t at[] = {0, c - 1, c, c + (rev - c) / 2, rev};
	for (size_t i = 0; i < sizeof(at) / sizeof(at[0]); i++)
		cr_assert_str_eq(
			dump_at(lz, at[i], a, sizeof(a)), dump_at(z, at[i], b, sizeof(b)),
			"range at %lld (compacted at %lld)", (long long)at[i], (long long)c);
	cr_assert_str_eq(dump_events(lz, c, a, sizeof(a)), dump_events(z, c, b, sizeof(b)));
	uint64_t p1, p2;
	struct mvcc_event ev;
	cr_assert_eq(mvcc_hist_seek(lz, c, &p1), 0);
	cr_assert_eq(mvcc_hist_seek(z, c, &p2), 0);
	cr_assert_eq(p1, p2, "positions are absolute");
	if (p1 > 0) /* the entry before: compacted, whether freed or not */
		cr_assert_eq(mvcc_hist_event(lz, p1 - 1, &ev), MVCC_ECOMPACTED);
	uint32_t h1, h2;
	int64_t cur, comp;
	cr_assert_eq(bolt_hash_kv(lz, 0, &h1, &cur, &comp), 0);
	cr_assert_eq(bolt_hash_kv(z, 0, &h2, &cur, &comp), 0);
	cr_assert_eq(h1, h2, "HashKV");
	if (c > 1 && c < rev) {
		cr_assert_eq(bolt_hash_kv(lz, c + 1, &h1, &cur, &comp), 0);
		cr_assert_eq(bolt_hash_kv(z, c + 1, &h2, &cur, &comp), 0);
		cr_assert_eq(h1, h2, "HashKV at a revision");
	}
}

static void same_state(struct mvcc_store *lz, struct mvcc_store *z)
{
	cr_assert(!mvcc_compact_pending(lz));
	struct h_sink x = h_snapshot(lz), y = h_snapshot(z);
	cr_assert_eq(x.len, y.len);
	cr_assert(!memcmp(x.data, y.data, x.len), "the same snapshot");
	free(x.data);
	free(y.data);
	struct mvcc_stats p, q;
	mvcc_stats(lz, &p);
	mvcc_stats(z, &q);
	p.memory_bytes = q.memory_bytes = 0; /* array capacities differ */
	cr_assert(!memcmp(&p, &q, sizeof(p)), "the same stats");
}

Test(mvcc, lazy_compaction_answers_as_compact)
{
	struct mvcc_store *z = h_store();
	unsigned seed = 7;
	char k[16], v[16];
	int64_t c = 0;
	for (int step = 0; step < 4000; step++) {
		unsigned what = (unsigned)rand_r(&seed) % 100;
		snprintf(k, sizeof(k), "k%02u", (unsigned)rand_r(&seed) % 40);
		if (what < 50) {
			snprintf(v, sizeof(v), "v%d", step);
			h_put(s, k, v);
			h_put(z, k, v);
		} else if (what < 62) {
			h_del(s, k, NULL);
			h_del(z, k, NULL);
		} else if (what < 65) { /* many keys in one revision */
			h_del(s, "k1", "k3");
			h_del(z, "k1", "k3");
		} else if (what < 70 && c < mvcc_rev(s)) {
			/* at exactly the last revision, or anywhere above c */
			int64_t at = what < 67 ? mvcc_rev(s)
					       : c + 1 + rand_r(&seed) % (mvcc_rev(s) - c);
			cr_assert_eq(mvcc_compact_lazy(s, at), 0);
			cr_assert_eq(mvcc_compact_lazy(s, at), MVCC_ECOMPACTED);
			cr_assert_eq(mvcc_compact(z, at), 0);
			c = at;
		} else if (what < 90) {
			(void)mvcc_compact_work(s, (size_t)rand_r(&seed) % 4);
		}
		if (step % 5 == 0)
			same_answers(s, z);
		if (mvcc_compact_pending(s)) {
			struct mvcc_snap_cursor *cur;
			struct h_sink x = {0};
			cr_assert_eq(mvcc_snap_begin(s, h_sink_write, &x, &cur),
				     MVCC_ECOMPACT_PENDING);
		}
	}
	while (!mvcc_compact_work(s, 3))
		same_answers(s, z);
	same_answers(s, z);
	same_state(s, z);
	mvcc_free(z);
}

/* A snapshot being encoded sees a lazy compaction as nothing (it frees
 * nothing) and goes stale once versions are freed. */
Test(mvcc, lazy_compaction_and_snapshot_cursor)
{
	char k[16];
	for (int i = 0; i < 30; i++) {
		snprintf(k, sizeof(k), "k%02d", i);
		h_put(s, k, "v");
	}
	int64_t del_rev = mvcc_rev(s) + 1;
	cr_assert_eq(h_del(s, "k", "l"), 30);
	struct h_sink x = {0};
	struct mvcc_snap_cursor *cur;
	cr_assert_eq(mvcc_snap_begin(s, h_sink_write, &x, &cur), 0);
	cr_assert_eq(mvcc_compact_lazy(s, del_rev), 0);
	cr_assert(mvcc_compact_pending(s));
	cr_assert_eq(mvcc_snap_step(cur, 64), 0, "still good");
	/* The walk below the delete is 30 entries; the delete's own 30
	 * tombstones supersede the puts: 60 in all, 7 at a time. */
	int calls = 1;
	while (!mvcc_compact_work(s, 7))
		calls++;
	cr_assert_eq(calls, 9, "60 entries, 7 at a time: %d calls", calls);
	cr_assert_eq(mvcc_snap_step(cur, SIZE_MAX), MVCC_ESNAPSHOT_STALE);
	mvcc_snap_free(cur);
	free(x.data);
	struct mvcc_stats st;
	mvcc_stats(s, &st);
	cr_assert_eq(st.versions, 30, "the tombstones, kept for watchers");
	cr_assert_eq(st.key_nodes, 30);
	struct h_sink y = h_snapshot(s);
	cr_assert_gt(y.len, 0);
	free(y.data);
}

struct want_version {
	const char *key;
	int64_t main, next;
	uint32_t sub;
	bool tomb;
};

struct version_check {
	const struct want_version *w;
	size_t i, n;
};

static int check_version(void *ctx, const struct mvcc_version *v)
{
	struct version_check *c = ctx;
	cr_assert_lt(c->i, c->n);
	const struct want_version *w = &c->w[c->i++];
	cr_assert_eq(v->kv.key_len, strlen(w->key));
	cr_assert(memcmp(v->kv.key, w->key, v->kv.key_len) == 0);
	cr_assert_eq(v->main, w->main, "version %zu", c->i);
	cr_assert_eq(v->sub, w->sub);
	cr_assert_eq(v->next_main, w->next);
	cr_assert_eq(v->tombstone, w->tomb);
	if (!w->tomb)
		cr_assert_eq(v->kv.mod_revision, w->main);
	return 0;
}

/* Every stored version in revision order, with the key's next one. */
Test(mvcc, versions_in_revision_order)
{
	h_put(s, "b", "1");  /* 2 */
	h_put(s, "a", "1");  /* 3 */
	h_del(s, "b", NULL); /* 4 */
	struct mvcc_op ops[] = {op_put("c", "1"), op_put("a", "2")};
	struct mvcc_op t = op_txn(NULL, 0, ops, 2, NULL, 0);
	txn_ok(&t, NULL); /* 5 */
	static const struct want_version want[] = {
		{"b", 2, 4, 0, false},         {"a", 3, 5, 0, false},
		{"b", 4, INT64_MAX, 0, true},  {"c", 5, INT64_MAX, 0, false},
		{"a", 5, INT64_MAX, 1, false},
	};
	struct version_check c = {want, 0, 5};
	cr_assert_eq(mvcc_versions(s, check_version, &c), 0);
	cr_assert_eq(c.i, 5);
}

static bool cmp_holds(struct mvcc_compare c)
{
	struct mvcc_op t = op_txn(&c, 1, NULL, 0, NULL, 0);
	bool ok;
	int64_t rev = mvcc_rev(s);
	cr_assert_eq(txn_ok(&t, &ok), rev);
	return ok;
}

Test(mvcc, txn_compares)
{
	int64_t lease;
	cr_assert_eq(lease_grant(mvcc_leases(s), 100, 60, 0, &lease, NULL), 0);
	h_put(s, "a", "1"); /* 2 */
	h_put(s, "a", "2"); /* 3: version 2, create 2, mod 3 */
	h_put(s, "b", "1"); /* 4 */
	struct mvcc_result res;
	struct mvcc_op pl = op_put_lease("l", "v", 100);
	h_apply(s, &pl, &res); /* 5 */
	mvcc_result_free(&res);

	cr_assert(cmp_holds(cmp_num("a", MVCC_TARGET_VERSION, MVCC_CMP_EQUAL, 2)));
	cr_assert(cmp_holds(cmp_num("a", MVCC_TARGET_VERSION, MVCC_CMP_GREATER, 1)));
	cr_assert_not(cmp_holds(cmp_num("a", MVCC_TARGET_VERSION, MVCC_CMP_LESS, 2)));
	cr_assert(cmp_holds(cmp_num("a", MVCC_TARGET_VERSION, MVCC_CMP_LESS, 3)));
	cr_assert_not(cmp_holds(cmp_num("a", MVCC_TARGET_VERSION, MVCC_CMP_NOT_EQUAL, 2)));
	cr_assert(cmp_holds(cmp_num("a", MVCC_TARGET_CREATE, MVCC_CMP_EQUAL, 2)));
	cr_assert(cmp_holds(cmp_num("a", MVCC_TARGET_CREATE, MVCC_CMP_NOT_EQUAL, 3)));
	cr_assert(cmp_holds(cmp_num("a", MVCC_TARGET_MOD, MVCC_CMP_EQUAL, 3)));
	cr_assert_not(cmp_holds(cmp_num("a", MVCC_TARGET_MOD, MVCC_CMP_GREATER, 3)));
	cr_assert(cmp_holds(cmp_num("a", MVCC_TARGET_MOD, MVCC_CMP_LESS, 4)));
	cr_assert(cmp_holds(cmp_val("a", MVCC_CMP_EQUAL, "2")));
	cr_assert(cmp_holds(cmp_val("a", MVCC_CMP_LESS, "3")));
	cr_assert(cmp_holds(cmp_val("a", MVCC_CMP_GREATER, "10"))); /* bytes */
	cr_assert(cmp_holds(cmp_val("a", MVCC_CMP_NOT_EQUAL, "")));
	cr_assert(cmp_holds(cmp_num("a", MVCC_TARGET_LEASE, MVCC_CMP_EQUAL, 0)));
	cr_assert(cmp_holds(cmp_num("l", MVCC_TARGET_LEASE, MVCC_CMP_EQUAL, 100)));
	cr_assert(cmp_holds(cmp_num("l", MVCC_TARGET_LEASE, MVCC_CMP_GREATER, 99)));

	/* A missing key compares as the zero KeyValue... */
	cr_assert(cmp_holds(cmp_num("zz", MVCC_TARGET_VERSION, MVCC_CMP_EQUAL, 0)));
	cr_assert(cmp_holds(cmp_num("zz", MVCC_TARGET_CREATE, MVCC_CMP_EQUAL, 0)));
	cr_assert(cmp_holds(cmp_num("zz", MVCC_TARGET_MOD, MVCC_CMP_LESS, 1)));
	cr_assert(cmp_holds(cmp_num("zz", MVCC_TARGET_LEASE, MVCC_CMP_EQUAL, 0)));
	cr_assert_not(cmp_holds(cmp_num("zz", MVCC_TARGET_VERSION, MVCC_CMP_GREATER, 0)));
	/* ...except that a value compare on it always fails. */
	cr_assert_not(cmp_holds(cmp_val("zz", MVCC_CMP_EQUAL, "")));
	cr_assert_not(cmp_holds(cmp_val("zz", MVCC_CMP_NOT_EQUAL, "x")));
	/* A deleted key is missing too. */
	h_del(s, "b", NULL);
	cr_assert(cmp_holds(cmp_num("b", MVCC_TARGET_VERSION, MVCC_CMP_EQUAL, 0)));
	h_put(s, "b", "1");

	/* Range compares hold when they hold for every key in the range. */
	struct mvcc_compare c = cmp_num("a", MVCC_TARGET_VERSION, MVCC_CMP_GREATER, 0);
	c.range_end = "c";
	c.range_end_len = 1;
	cr_assert(cmp_holds(c));
	c.result = MVCC_CMP_EQUAL;
	c.number = 2;
	cr_assert_not(cmp_holds(c)); /* b has version 1 */
	c = cmp_num("a", MVCC_TARGET_MOD, MVCC_CMP_LESS, 100);
	c.range_end = "\0";
	c.range_end_len = 1;
	cr_assert(cmp_holds(c));
	c = cmp_num("x", MVCC_TARGET_CREATE, MVCC_CMP_EQUAL, 0);
	c.range_end = "y";
	c.range_end_len = 1;
	cr_assert(cmp_holds(c)); /* empty range: zero KeyValue */

	/* Several compares are a conjunction; branches are taken. */
	struct mvcc_compare cs[] = {cmp_val("a", MVCC_CMP_EQUAL, "2"),
				    cmp_num("b", MVCC_TARGET_VERSION, MVCC_CMP_EQUAL, 9)};
	struct mvcc_op yes[] = {op_put("r", "yes")}, no[] = {op_put("r", "no")};
	struct mvcc_op t = op_txn(cs, 2, yes, 1, no, 1);
	bool ok;
	txn_ok(&t, &ok);
	cr_assert_not(ok);
	cr_assert_str_eq(h_get(s, "r"), "no");
	t = op_txn(cs, 1, yes, 1, no, 1);
	txn_ok(&t, &ok);
	cr_assert(ok);
	cr_assert_str_eq(h_get(s, "r"), "yes");

	/* Targets and results etcd does not know: compared as equal, and
	 * holding whatever the comparison, as etcd's compareKV does. */
	c = cmp_num("a", 9, MVCC_CMP_EQUAL, 12345);
	cr_assert(cmp_holds(c));
	c = cmp_num("a", 9, MVCC_CMP_NOT_EQUAL, 0);
	cr_assert_not(cmp_holds(c));
	c = cmp_num("a", MVCC_TARGET_VERSION, 9, 12345);
	cr_assert(cmp_holds(c));
}

Test(mvcc, nested_txn_sees_state_before)
{
	h_put(s, "a", "1"); /* 2 */
	struct mvcc_compare inner_c = cmp_num("x", MVCC_TARGET_VERSION, MVCC_CMP_EQUAL, 0);
	struct mvcc_op inner_ok[] = {op_put("y", "1")}, inner_no[] = {op_put("y", "2")};
	struct mvcc_op outer_ok[] = {
		op_put("x", "1"),
		op_txn(&inner_c, 1, inner_ok, 1, inner_no, 1),
		op_get("x"),
	};
	struct mvcc_compare outer_c = cmp_num("a", MVCC_TARGET_VERSION, MVCC_CMP_EQUAL, 1);
	struct mvcc_op t = op_txn(&outer_c, 1, outer_ok, 3, NULL, 0);
	struct mvcc_result res;
	cr_assert_eq(h_apply(s, &t, &res), 3);
	struct mvcc_txn_resp *tr = &res.resp.u.txn;
	cr_assert(tr->succeeded);
	cr_assert_eq(tr->nresponses, 3);
	cr_assert_eq(tr->responses[1].type, MVCC_OP_TXN);
	/* The inner compare ran before the outer put: x had version 0. */
	cr_assert(tr->responses[1].u.txn.succeeded);
	cr_assert_eq(tr->responses[1].u.txn.nresponses, 1);
	/* A range later in the txn sees the txn's own writes. */
	cr_assert_eq(tr->responses[2].type, MVCC_OP_RANGE);
	cr_assert_eq(tr->responses[2].u.range.nkvs, 1);
	cr_assert_eq(tr->responses[2].u.range.kvs[0].mod_revision, 3);
	mvcc_result_free(&res);
	cr_assert_str_eq(h_get(s, "y"), "1");
	cr_assert_eq(h_kv(s, "y").mod_revision, 3);
}

/* The revision of each nested response's header, as etcd's
 * storeTxnWrite gives it (a range before any write sees the revision
 * before the txn; every op after the first change answers the new one). */
Test(mvcc, txn_response_revisions)
{
	h_put(s, "k", "v"); /* 2 */
	struct mvcc_op inner[] = {op_get("k")};
	struct mvcc_op ops[] = {
		op_get("k"), op_del("nothing", NULL), op_put("k2", "x"),
		op_get("k"), op_del("nothing", NULL), op_txn(NULL, 0, inner, 1, NULL, 0),
	};
	struct mvcc_op t = op_txn(NULL, 0, ops, 6, NULL, 0);
	struct mvcc_result res;
	cr_assert_eq(h_apply(s, &t, &res), 3);
	const struct mvcc_txn_resp *tr = &res.resp.u.txn;
	int64_t want[] = {2, 2, 3, 3, 3, 3};
	cr_assert_eq(tr->nresponses, 6);
	for (int i = 0; i < 6; i++)
		cr_assert_eq(tr->responses[i].revision, want[i], "op %d", i);
	cr_assert_eq(tr->responses[5].u.txn.responses[0].revision, 3);
	cr_assert_eq(res.resp.revision, 3);
	mvcc_result_free(&res);

	/* A read-only txn: everything at the current revision. */
	struct mvcc_op ro[] = {op_get("k"), op_del("nothing", NULL)};
	t = op_txn(NULL, 0, ro, 2, NULL, 0);
	cr_assert_eq(h_apply(s, &t, &res), 3);
	cr_assert_eq(res.resp.u.txn.responses[0].revision, 3);
	cr_assert_eq(res.resp.u.txn.responses[1].revision, 3);
	mvcc_result_free(&res);
}

Test(mvcc, txn_duplicate_keys)
{
	h_put(s, "k", "0");
	struct mvcc_op pp[] = {op_put("a", "1"), op_put("a", "2")};
	struct mvcc_op t = op_txn(NULL, 0, pp, 2, NULL, 0);
	cr_assert_eq(apply_rc(&t), MVCC_EDUPLICATE_KEY);
	struct mvcc_op dp[] = {op_del("a", NULL), op_put("a", "1")};
	t = op_txn(NULL, 0, dp, 2, NULL, 0);
	cr_assert_eq(apply_rc(&t), MVCC_EDUPLICATE_KEY);
	struct mvcc_op pd[] = {op_put("a", "1"), op_del("a", "b")};
	t = op_txn(NULL, 0, pd, 2, NULL, 0);
	cr_assert_eq(apply_rc(&t), MVCC_EDUPLICATE_KEY);
	struct mvcc_op pn[] = {op_put("a", "1"), op_txn(NULL, 0, pp, 1, NULL, 0)};
	t = op_txn(NULL, 0, pn, 2, NULL, 0);
	cr_assert_eq(apply_rc(&t), MVCC_EDUPLICATE_KEY);
	struct mvcc_op nn[] = {op_txn(NULL, 0, pp, 2, NULL, 0)};
	t = op_txn(NULL, 0, nn, 1, NULL, 0);
	cr_assert_eq(apply_rc(&t), MVCC_EDUPLICATE_KEY);
	/* A nested delete covers a later nested put. */
	struct mvcc_op nd[] = {op_del("q", NULL)}, np[] = {op_put("q", "1")};
	struct mvcc_op dn[] = {op_txn(NULL, 0, nd, 1, NULL, 0),
			       op_txn(NULL, 0, np, 1, NULL, 0)};
	t = op_txn(NULL, 0, dn, 2, NULL, 0);
	cr_assert_eq(apply_rc(&t), MVCC_EDUPLICATE_KEY);
	cr_assert_eq(mvcc_rev(s), 2, "rejected txns change nothing");

	/* Allowed: the same key in success and failure, in both branches of
	 * a nested txn, and (etcd's order quirk) a nested put followed by a
	 * nested delete of it. */
	struct mvcc_op p1[] = {op_put("a", "1")}, p2[] = {op_put("a", "2")};
	t = op_txn(NULL, 0, p1, 1, p2, 1);
	cr_assert_eq(apply_rc(&t), 0);
	struct mvcc_op both[] = {op_txn(NULL, 0, p1, 1, p2, 1)};
	t = op_txn(NULL, 0, both, 1, NULL, 0);
	cr_assert_eq(apply_rc(&t), 0);
	struct mvcc_op pnd[] = {op_txn(NULL, 0, np, 1, NULL, 0),
				op_txn(NULL, 0, nd, 1, NULL, 0)};
	t = op_txn(NULL, 0, pnd, 2, NULL, 0);
	cr_assert_eq(apply_rc(&t), 0);
	int64_t r = mvcc_rev(s);
	cr_assert_null(h_get(s, "q"));
	uint64_t pos;
	struct mvcc_event ev;
	cr_assert_eq(mvcc_hist_seek(s, r, &pos), 0);
	cr_assert_eq(mvcc_hist_event(s, pos, &ev), 0);
	cr_assert_eq(ev.type, MVCC_EVENT_PUT);
	cr_assert_eq(mvcc_hist_event(s, pos + 1, &ev), 0);
	cr_assert_eq(ev.type, MVCC_EVENT_DELETE);
	cr_assert_eq(ev.kv.mod_revision, r);
	cr_assert(ev.has_prev_kv);
	/* And a delete with range_end "\0" conflicts with nothing (etcd). */
	struct mvcc_op dz[] = {op_del("k", ""), op_put("z", "1")};
	t = op_txn(NULL, 0, dz, 2, NULL, 0);
	cr_assert_eq(apply_rc(&t), 0);
}

Test(mvcc, txn_limits_and_empty_ops)
{
	mvcc_free(s);
	struct mvcc_options opts = {.max_txn_ops = 2};
	cr_assert_eq(mvcc_new(&opts, &s), 0);
	struct mvcc_op ops[] = {op_put("a", "1"), op_put("b", "1"), op_put("c", "1")};
	struct mvcc_op t = op_txn(NULL, 0, ops, 3, NULL, 0);
	cr_assert_eq(apply_rc(&t), MVCC_ETOO_MANY_OPS);
	t = op_txn(NULL, 0, ops, 2, NULL, 0);
	cr_assert_eq(apply_rc(&t), 0);
	struct mvcc_op empty[] = {{.type = MVCC_OP_NONE}};
	t = op_txn(NULL, 0, empty, 1, NULL, 0);
	cr_assert_eq(apply_rc(&t), MVCC_EKEY_NOT_FOUND);
	struct mvcc_compare c = cmp_num("", MVCC_TARGET_VERSION, MVCC_CMP_EQUAL, 0);
	t = op_txn(&c, 1, NULL, 0, NULL, 0);
	cr_assert_eq(apply_rc(&t), MVCC_EEMPTY_KEY);
	struct mvcc_op o = op_put("", "x");
	cr_assert_eq(apply_rc(&o), MVCC_EEMPTY_KEY);
	o = op_get("");
	cr_assert_eq(apply_rc(&o), MVCC_EEMPTY_KEY);
	o = op_del("", NULL);
	cr_assert_eq(apply_rc(&o), MVCC_EEMPTY_KEY);
}

Test(mvcc, put_options)
{
	int64_t id;
	cr_assert_eq(lease_grant(mvcc_leases(s), 7, 10, 0, &id, NULL), 0);
	struct mvcc_result res;
	struct mvcc_op o = op_put("a", "1");
	o.u.put.prev_kv = true;
	h_apply(s, &o, &res); /* 2 */
	cr_assert_not(res.resp.u.put.has_prev_kv);
	mvcc_result_free(&res);
	o = op_put_lease("a", "22", 7);
	o.u.put.prev_kv = true;
	h_apply(s, &o, &res); /* 3 */
	cr_assert(res.resp.u.put.has_prev_kv);
	cr_assert_eq(res.resp.u.put.prev_kv.version, 1);
	cr_assert_eq(res.resp.u.put.prev_kv.value_len, 1);
	cr_assert_eq(res.resp.u.put.prev_kv.value[0], '1');
	mvcc_result_free(&res);

	o = op_put("a", "");
	o.u.put.ignore_value = true;
	h_apply(s, &o, &res); /* 4: value kept, lease dropped */
	mvcc_result_free(&res);
	struct mvcc_kv kv = h_kv(s, "a");
	cr_assert_str_eq(h_get(s, "a"), "22");
	cr_assert_eq(kv.version, 3);
	cr_assert_eq(kv.lease, 0);

	o = op_put_lease("a", "33", 7);
	h_apply(s, &o, &res); /* 5 */
	mvcc_result_free(&res);
	o = op_put("a", "44");
	o.u.put.ignore_lease = true;
	h_apply(s, &o, &res); /* 6: lease kept */
	mvcc_result_free(&res);
	cr_assert_eq(h_kv(s, "a").lease, 7);
	cr_assert_str_eq(h_get(s, "a"), "44");

	o = op_put("missing", "");
	o.u.put.ignore_value = true;
	cr_assert_eq(apply_rc(&o), MVCC_EKEY_NOT_FOUND);
	o = op_put("missing", "v");
	o.u.put.ignore_lease = true;
	cr_assert_eq(apply_rc(&o), MVCC_EKEY_NOT_FOUND);
	o = op_put("a", "v");
	o.u.put.ignore_value = true;
	cr_assert_eq(apply_rc(&o), MVCC_EVALUE_PROVIDED);
	o = op_put_lease("a", "v", 7);
	o.u.put.ignore_lease = true;
	cr_assert_eq(apply_rc(&o), MVCC_ELEASE_PROVIDED);
	o = op_put_lease("a", "v", 8);
	cr_assert_eq(apply_rc(&o), MVCC_ELEASE_NOT_FOUND);
	cr_assert_eq(mvcc_rev(s), 6);
	/* In a txn the same checks fail the whole txn. */
	struct mvcc_op ops[] = {op_put("b", "1"), op_put_lease("c", "1", 8)};
	struct mvcc_op t = op_txn(NULL, 0, ops, 2, NULL, 0);
	cr_assert_eq(apply_rc(&t), MVCC_ELEASE_NOT_FOUND);
	cr_assert_null(h_get(s, "b"));
	cr_assert_eq(mvcc_rev(s), 6);
}

Test(mvcc, delete_options)
{
	h_put(s, "a", "1");
	h_put(s, "b", "2");
	h_put(s, "c", "3");
	struct mvcc_result res;
	struct mvcc_op o = op_del("a", "c");
	o.u.del.prev_kv = true;
	h_apply(s, &o, &res);
	cr_assert_eq(res.revision, 5);
	cr_assert_eq(res.resp.u.del.deleted, 2);
	cr_assert_eq(res.resp.u.del.nprev_kvs, 2);
	cr_assert_eq(res.resp.u.del.prev_kvs[0].key[0], 'a');
	cr_assert_eq(res.resp.u.del.prev_kvs[1].key[0], 'b');
	cr_assert_eq(res.resp.u.del.prev_kvs[1].value[0], '2');
	mvcc_result_free(&res);
	cr_assert_eq(h_del(s, "a", ""), 1); /* a.."\0" is c only now */
	cr_assert_eq(mvcc_rev(s), 6);
}

Test(mvcc, failed_txn_rolls_back)
{
	h_put(s, "a", "1");
	h_put(s, "b", "1");
	struct mvcc_stats before, after;
	mvcc_stats(s, &before);
	/* Passes the checks (delete to "\0" conflicts with nothing and b
	 * exists before the txn), then the put finds b deleted mid-txn. */
	struct mvcc_op o = op_put("b", "");
	o.u.put.ignore_value = true;
	struct mvcc_op ops[] = {op_put("new", "x"), op_del("a", ""), o};
	struct mvcc_op t = op_txn(NULL, 0, ops, 3, NULL, 0);
	cr_assert_eq(apply_rc(&t), MVCC_EKEY_NOT_FOUND);
	mvcc_stats(s, &after);
	cr_assert_eq(mvcc_rev(s), 3);
	cr_assert_eq(after.keys, before.keys);
	cr_assert_eq(after.key_nodes, before.key_nodes);
	cr_assert_eq(after.versions, before.versions);
	cr_assert_eq(after.revlog, before.revlog);
	cr_assert_eq(after.db_size_bytes, before.db_size_bytes);
	cr_assert_null(h_get(s, "new"));
	cr_assert_str_eq(h_get(s, "b"), "1");
	cr_assert_eq(h_put(s, "c", "1"), 4);
}

Test(mvcc, txn_range_revision_errors)
{
	h_put(s, "a", "1");
	h_put(s, "a", "2");
	struct mvcc_op r = op_get("a");
	r.u.range.revision = 10;
	struct mvcc_op ops[] = {op_put("b", "1"), r};
	struct mvcc_op t = op_txn(NULL, 0, ops, 2, NULL, 0);
	cr_assert_eq(apply_rc(&t), MVCC_EFUTURE_REV);
	cr_assert_eq(mvcc_compact(s, 3), 0);
	ops[1].u.range.revision = 2;
	cr_assert_eq(apply_rc(&t), MVCC_ECOMPACTED);
	cr_assert_null(h_get(s, "b"));
	ops[1].u.range.revision = 3;
	cr_assert_eq(apply_rc(&t), 0);
	cr_assert_str_eq(h_get(s, "b"), "1");
}

Test(mvcc, binary_keys_and_values)
{
	const char k1[] = {'\0'}, k2[] = {'\0', '\0'}, k3[] = {'\xff', '\0', 'x'};
	const char v[] = {'\0', '\1', '\0'};
	const char *keys[] = {k1, k2, k3};
	size_t lens[] = {1, 2, 3};
	for (int i = 0; i < 3; i++) {
		struct mvcc_op o = {.type = MVCC_OP_PUT};
		o.u.put.key = keys[i];
		o.u.put.key_len = lens[i];
		o.u.put.value = v;
		o.u.put.value_len = 3;
		struct mvcc_result res;
		h_apply(s, &o, &res);
		mvcc_result_free(&res);
	}
	struct mvcc_op o = op_range("\0", 1, "\0", 1);
	struct mvcc_result res;
	h_apply(s, &o, &res);
	cr_assert_eq(res.resp.u.range.nkvs, 3);
	for (int i = 0; i < 3; i++) {
		cr_assert_eq(res.resp.u.range.kvs[i].key_len, lens[i]);
		cr_assert(!memcmp(res.resp.u.range.kvs[i].key, keys[i], lens[i]));
		cr_assert(!memcmp(res.resp.u.range.kvs[i].value, v, 3));
	}
	mvcc_result_free(&res);
	cr_assert_str_eq(mvcc_strerror(MVCC_EDUPLICATE_KEY),
			 "etcdserver: duplicate key given in txn request");
	cr_assert_str_eq(mvcc_errname(MVCC_ECOMPACTED), "MVCC_ECOMPACTED");
}
