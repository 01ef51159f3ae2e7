/*
 * test_watch: routing in revision order with prev_kv and filters, range
 * and prefix watchers, catch-up from history, compaction notices, slow
 * consumers (bounded buffers, no event lost or reordered), progress, and
 * a randomized comparison of many watchers against brute force.
 */
#include "meta/watch.h"
#include "test_mvcc_helpers.h"

static struct mvcc_store *s;
static struct watch_registry *r;

static void setup(void)
{
	s = h_store();
	cr_assert_eq(watch_registry_new(s, 0, &r), 0);
}

static void teardown(void)
{
	watch_registry_free(r);
	mvcc_free(s);
}

TestSuite(watch, .init = setup, .fini = teardown);

static int64_t watch(const char *k, const char *end, int64_t start)
{
	struct watch_options o = {
		.key = k, .key_len = strlen(k), .start_revision = start, .prev_kv = true};
	if (end) {
		o.range_end = end[0] ? end : "\0";
		o.range_end_len = end[0] ? strlen(end) : 1;
	}
	int64_t id;
	int rc = watch_create(r, s, &o, &id);
	cr_assert_eq(rc, 0, "watch_create: %s", mvcc_strerror(rc));
	return id;
}

static void put_notify(const char *k, const char *v)
{
	h_put(s, k, v);
	watch_notify(r, s);
}

/* Events received, as "P key=value@rev" / "D key@rev" lines. */
static char got[65536];

static void append_events(const struct watch_delivery *d, bool with_prev)
{
	size_t o = strlen(got);
	for (size_t i = 0; i < d->nevents; i++) {
		const struct mvcc_event *e = d->events[i];
		if (e->type == MVCC_EVENT_PUT)
			o += (size_t)snprintf(got + o, sizeof(got) - o, "P %.*s=%.*s@%lld",
					      (int)e->kv.key_len, e->kv.key,
					      (int)e->kv.value_len, e->kv.value,
					      (long long)e->kv.mod_revision);
		else
			o += (size_t)snprintf(got + o, sizeof(got) - o, "D %.*s@%lld",
					      (int)e->kv.key_len, e->kv.key,
					      (long long)e->kv.mod_revision);
		if (with_prev && e->has_prev_kv)
			o += (size_t)snprintf(got + o, sizeof(got) - o, " (%.*s)",
					      (int)e->prev_kv.value_len, e->prev_kv.value);
		o += (size_t)snprintf(got + o, sizeof(got) - o, ";");
	}
}

/* Take what watcher id has; returns its delivery's header revision. */
static int64_t take(int64_t id, bool with_prev)
{
	struct watch_delivery d;
	got[0] = '\0';
	cr_assert_eq(watch_take(r, id, &d), 0);
	append_events(&d, with_prev);
	int64_t rev = d.revision;
	watch_delivery_free(&d);
	return rev;
}

Test(watch, order_prev_kv_and_filters)
{
	int64_t w = watch("a", NULL, 0);
	struct watch_options o = {.key = "a", .key_len = 1}; /* no prev_kv */
	int64_t plain, noput, nodel;
	cr_assert_eq(watch_create(r, s, &o, &plain), 0);
	o.filter_noput = true;
	cr_assert_eq(watch_create(r, s, &o, &noput), 0);
	o.filter_noput = false;
	o.filter_nodelete = true;
	cr_assert_eq(watch_create(r, s, &o, &nodel), 0);
	int64_t other = watch("b", NULL, 0);

	put_notify("a", "1");
	put_notify("a", "2");
	put_notify("c", "x");
	h_del(s, "a", NULL);
	watch_notify(r, s);
	cr_assert_eq(take(w, true), 5);
	cr_assert_str_eq(got, "P a=1@2;P a=2@3 (1);D a@5 (2);");
	take(plain, true);
	cr_assert_str_eq(got, "P a=1@2;P a=2@3;D a@5;");
	take(noput, true);
	cr_assert_str_eq(got, "D a@5;");
	take(nodel, true);
	cr_assert_str_eq(got, "P a=1@2;P a=2@3;");
	int64_t id;
	cr_assert_not(watch_next_ready(r, &id));
	take(other, true);
	cr_assert_str_eq(got, "");
	cr_assert_eq(watch_cancel(r, other), 0);
	cr_assert_eq(watch_cancel(r, other), MVCC_EWATCH_NOT_FOUND);
}

Test(watch, ranges_and_prefixes)
{
	int64_t pre = watch("foo", "fop", 0);
	int64_t from_b = watch("b", "", 0);
	int64_t all = watch("\0", "", 0);
	int64_t ab = watch("a", "b", 0);
	put_notify("a", "1");
	put_notify("foo", "1");
	put_notify("foo/x", "1");
	put_notify("fop", "1");
	put_notify("b", "1");
	put_notify("ab", "1");
	take(pre, false);
	cr_assert_str_eq(got, "P foo=1@3;P foo/x=1@4;");
	take(from_b, false);
	cr_assert_str_eq(got, "P foo=1@3;P foo/x=1@4;P fop=1@5;P b=1@6;");
	take(all, false);
	cr_assert_str_eq(got, "P a=1@2;P foo=1@3;P foo/x=1@4;P fop=1@5;P b=1@6;P ab=1@7;");
	take(ab, false);
	cr_assert_str_eq(got, "P a=1@2;P ab=1@7;");

	struct watch_options o = {
		.key = "b", .key_len = 1, .range_end = "a", .range_end_len = 1};
	int64_t id;
	cr_assert_eq(watch_create(r, s, &o, &id), MVCC_EEMPTY_WATCH_RANGE);
	o.range_end_len = 0;
	o.id = pre;
	cr_assert_eq(watch_create(r, s, &o, &id), MVCC_EWATCH_EXISTS);
	o.id = 77;
	cr_assert_eq(watch_create(r, s, &o, &id), 0);
	cr_assert_eq(id, 77);
}

Test(watch, catch_up_from_history)
{
	for (int i = 0; i < 9; i++) { /* revisions 2..10 */
		char k[8];
		snprintf(k, sizeof(k), "k%d", i % 3);
		h_put(s, k, i % 2 ? "odd" : "even");
	}
	watch_notify(r, s);
	int64_t w = watch("k", "l", 4);
	int64_t fut = watch("k1", NULL, 12); /* a future start revision */
	struct watch_stats st;
	watch_stats(r, &st);
	cr_assert_eq(st.unsynced, 1);
	cr_assert_eq(watch_sync(r, s, 1000), 0);
	int64_t id;
	cr_assert(watch_next_ready(r, &id));
	cr_assert_eq(id, w);
	cr_assert_eq(take(w, true), 10);
	cr_assert_str_eq(got, "P k2=even@4;P k0=odd@5 (even);P k1=even@6 (odd);"
			      "P k2=odd@7 (even);P k0=even@8 (odd);P k1=odd@9 (even);"
			      "P k2=even@10 (odd);");
	put_notify("k1", "x"); /* 11: now synced */
	put_notify("k1", "y"); /* 12 */
	take(w, false);
	cr_assert_str_eq(got, "P k1=x@11;P k1=y@12;");
	take(fut, false);
	cr_assert_str_eq(got, "P k1=y@12;");

	/* A small budget catches up a bit at a time, whole revisions. */
	int64_t w2 = watch("k", "l", 2);
	size_t rounds = 0;
	while (watch_sync(r, s, 2) > 0)
		rounds++;
	cr_assert_geq(rounds, 4);
	take(w2, false);
	cr_assert_eq(strncmp(got, "P k0=even@2;P k1=odd@3;", 23), 0);
	cr_assert(strstr(got, "P k1=y@12;"));
}

/* With no synced watcher, notify skips the walk of the revisions it
 * routes; a watcher that starts before them still gets every event. */
Test(watch, unrouted_revisions_are_caught_up)
{
	char k[16];
	for (int i = 0; i < 100; i++) { /* revisions 2..101 */
		snprintf(k, sizeof(k), "k%02d", i);
		h_put(s, k, "v");
	}
	watch_notify(r, s);
	cr_assert_eq(h_del(s, "k", "l"), 100); /* revision 102 */
	watch_notify(r, s);
	int64_t w = watch("k", "l", 101);
	cr_assert_eq(watch_sync(r, s, 1000), 0);
	cr_assert_eq(take(w, false), 102);
	const char *head = "P k99=v@101;D k00@102;D k01@102;";
	cr_assert_eq(strncmp(got, head, strlen(head)), 0, "%s", got);
	size_t dels = 0;
	for (const char *p = got; (p = strstr(p, "@102;")); p++)
		dels++;
	cr_assert_eq(dels, 100);
	put_notify("k00", "again"); /* 103: now synced, routed live */
	take(w, false);
	cr_assert_str_eq(got, "P k00=again@103;");
}

Test(watch, compacted_start)
{
	for (int i = 0; i < 6; i++)
		h_put(s, "k", "v"); /* 2..7 */
	watch_notify(r, s);
	cr_assert_eq(mvcc_compact(s, 6), 0);
	int64_t w = watch("k", NULL, 3);
	struct watch_delivery d;
	cr_assert_eq(watch_take(r, w, &d), 0);
	cr_assert(d.canceled);
	cr_assert_eq(d.compact_revision, 6);
	cr_assert_eq(d.nevents, 0);
	watch_delivery_free(&d);
	cr_assert_eq(watch_take(r, w, &d), MVCC_EWATCH_NOT_FOUND);
	/* From the compaction revision itself nothing is lost. */
	w = watch("k", NULL, 6);
	watch_sync(r, s, 100);
	take(w, false);
	cr_assert_str_eq(got, "P k=v@6;P k=v@7;");
}

/* Drain everything: take whatever is ready, catch up, repeat. */
static void drain(char *out, size_t cap)
{
	size_t o = 0;
	for (int guard = 0; guard < 100000; guard++) {
		int64_t id;
		if (watch_next_ready(r, &id)) {
			take(id, false);
			o += (size_t)snprintf(out + o, cap - o, "%s", got);
			continue;
		}
		if (watch_sync(r, s, 16) == 0 && !watch_next_ready(r, &id))
			return;
	}
	cr_assert_fail("drain did not settle");
}

Test(watch, slow_consumer_loses_nothing)
{
	watch_registry_free(r);
	cr_assert_eq(watch_registry_new(s, 4, &r), 0);
	int64_t w = watch("k", "l", 0);
	char want[65536] = "";
	size_t o = 0;
	for (int i = 0; i < 100; i++) {
		char k[16];
		snprintf(k, sizeof(k), "k%02d", i % 13);
		put_notify(k, "v");
		o += (size_t)snprintf(want + o, sizeof(want) - o, "P %s=v@%lld;", k,
				      (long long)mvcc_rev(s));
		if (i == 50) {
			/* A revision bigger than the whole buffer. */
			struct mvcc_op ops[10];
			char keys[10][16];
			for (int j = 0; j < 10; j++) {
				snprintf(keys[j], sizeof(keys[j]), "kk%d", j);
				ops[j] = op_put(keys[j], "t");
				o += (size_t)snprintf(want + o, sizeof(want) - o,
						      "P %s=t@%lld;", keys[j],
						      (long long)mvcc_rev(s) + 1);
			}
			struct mvcc_op t = op_txn(NULL, 0, ops, 10, NULL, 0);
			struct mvcc_result res;
			h_apply(s, &t, &res);
			mvcc_result_free(&res);
			watch_notify(r, s);
		}
	}
	struct watch_stats st;
	watch_stats(r, &st);
	cr_assert_eq(st.unsynced, 1, "the slow watcher fell behind");
	cr_assert_leq(st.pending_events, 4);
	static char all[65536];
	drain(all, sizeof(all));
	cr_assert_str_eq(all, want);
	watch_stats(r, &st);
	cr_assert_eq(st.synced, 1);
	cr_assert_eq(st.pending_events, 0);
	(void)w;
}

/* A paused watcher is never named ready, keeps collecting up to its
 * bound, falls behind like any slow one, and loses nothing once resumed;
 * other watchers are served meanwhile. */
Test(watch, paused_watcher_is_skipped_then_catches_up)
{
	watch_registry_free(r);
	cr_assert_eq(watch_registry_new(s, 4, &r), 0);
	int64_t slow = watch("a", NULL, 0);
	int64_t fast = watch("b", NULL, 0);
	int64_t id;
	cr_assert_eq(watch_pause(r, slow, true), 0);
	cr_assert_eq(watch_pause(r, slow, true), 0, "pausing twice is fine");
	char want[4096] = "";
	size_t o = 0;
	for (int i = 0; i < 20; i++) {
		put_notify("a", i % 2 ? "x" : "y");
		o += (size_t)snprintf(want + o, sizeof(want) - o, "P a=%s@%lld;",
				      i % 2 ? "x" : "y", (long long)mvcc_rev(s));
		put_notify("b", "z");
		/* only the unpaused watcher is ever ready */
		cr_assert(watch_next_ready(r, &id));
		cr_assert_eq(id, fast);
		take(fast, false);
		cr_assert(!watch_next_ready(r, &id));
	}
	struct watch_stats st;
	watch_stats(r, &st);
	cr_assert_eq(st.unsynced, 1, "the paused watcher fell behind its bound");
	cr_assert_leq(st.pending_events, 4);
	cr_assert_eq(watch_pause(r, slow, false), 0);
	static char all[65536];
	drain(all, sizeof(all));
	cr_assert_str_eq(all, want);
	cr_assert_eq(watch_pause(r, 12345, true), MVCC_EWATCH_NOT_FOUND);
}

/* A revision that overflows half-way is dropped whole and caught up. */
Test(watch, overflow_mid_revision)
{
	watch_registry_free(r);
	cr_assert_eq(watch_registry_new(s, 4, &r), 0);
	int64_t w = watch("k", "l", 0);
	put_notify("k0", "a"); /* 2 */
	struct mvcc_op ops[] = {op_put("k1", "t"), op_put("k2", "t"), op_put("k3", "t"),
				op_put("k4", "t"), op_put("k5", "t")};
	struct mvcc_op t = op_txn(NULL, 0, ops, 5, NULL, 0);
	struct mvcc_result res;
	h_apply(s, &t, &res); /* 3 */
	mvcc_result_free(&res);
	watch_notify(r, s);
	put_notify("k6", "a"); /* 4 */
	cr_assert_eq(take(w, false), 2, "complete up to revision 2 only");
	cr_assert_str_eq(got, "P k0=a@2;");
	watch_sync(r, s, 100);
	take(w, false);
	cr_assert_str_eq(got, "P k1=t@3;P k2=t@3;P k3=t@3;P k4=t@3;P k5=t@3;");
	/* Revision 3 alone did not fit either; 4 comes next. */
	watch_sync(r, s, 100);
	cr_assert_eq(take(w, false), 4);
	cr_assert_str_eq(got, "P k6=a@4;");
	put_notify("k7", "a");
	take(w, false);
	cr_assert_str_eq(got, "P k7=a@5;");
}

Test(watch, slow_consumer_overtaken_by_compaction)
{
	watch_registry_free(r);
	cr_assert_eq(watch_registry_new(s, 2, &r), 0);
	int64_t w = watch("k", NULL, 0);
	for (int i = 0; i < 10; i++)
		put_notify("k", "v"); /* 2..11: buffers 2, 3; unsynced from 4 */
	cr_assert_eq(mvcc_compact(s, 8), 0);
	take(w, false);
	cr_assert_str_eq(got, "P k=v@2;P k=v@3;");
	watch_sync(r, s, 100);
	struct watch_delivery d;
	cr_assert_eq(watch_take(r, w, &d), 0);
	cr_assert(d.canceled);
	cr_assert_eq(d.compact_revision, 8);
	watch_delivery_free(&d);
}

Test(watch, compaction_before_notify)
{
	int64_t w = watch("k", NULL, 0);
	for (int i = 0; i < 5; i++)
		h_put(s, "k", "v"); /* 2..6, never routed */
	cr_assert_eq(mvcc_compact(s, 5), 0);
	watch_notify(r, s);
	watch_sync(r, s, 100);
	struct watch_delivery d;
	cr_assert_eq(watch_take(r, w, &d), 0);
	cr_assert(d.canceled, "a gap is reported, never skipped");
	cr_assert_eq(d.compact_revision, 5);
	watch_delivery_free(&d);
}

Test(watch, progress)
{
	struct watch_options o = {.key = "a", .key_len = 1, .progress_notify = true};
	int64_t w, quiet, *ids;
	size_t n;
	int64_t rev;
	cr_assert_eq(watch_create(r, s, &o, &w), 0);
	o.progress_notify = false;
	cr_assert_eq(watch_create(r, s, &o, &quiet), 0);
	cr_assert_eq(watch_progress(r, &ids, &n, &rev), 0);
	cr_assert_eq(n, 1);
	cr_assert_eq(ids[0], w);
	cr_assert_eq(rev, 1);
	free(ids);
	put_notify("a", "1");
	put_notify("b", "1");
	cr_assert_eq(watch_progress(r, &ids, &n, &rev), 0);
	cr_assert_eq(n, 0, "events pending");
	free(ids);
	take(w, false);
	cr_assert_eq(watch_progress(r, &ids, &n, &rev), 0);
	cr_assert_eq(n, 1, "idle for a whole interval");
	cr_assert_eq(rev, 3);
	free(ids);
	put_notify("a", "2");
	take(w, false);
	cr_assert_eq(watch_progress(r, &ids, &n, &rev), 0);
	cr_assert_eq(n, 0, "events were sent during the last interval");
	free(ids);
	cr_assert_eq(watch_progress(r, &ids, &n, &rev), 0);
	cr_assert_eq(n, 1);
	cr_assert_eq(rev, 4);
	free(ids);
	cr_assert_eq(watch_progress_request(r, quiet, &rev), -EAGAIN);
	take(quiet, false);
	cr_assert_eq(watch_progress_request(r, quiet, &rev), 0);
	cr_assert_eq(rev, 4);
	int64_t past = watch("a", NULL, 2);
	cr_assert_eq(watch_progress_request(r, past, &rev), -EAGAIN);
}

Test(watch, follows_a_restored_store)
{
	int64_t w = watch("k", "l", 0);
	put_notify("k1", "a");
	struct h_sink snap = h_snapshot(s);
	h_put(s, "k2", "b"); /* 3 */
	struct mvcc_store *s2;
	cr_assert_eq(mvcc_restore(NULL, snap.data, snap.len, &s2), 0);
	free(snap.data);
	h_put(s2, "k2", "b"); /* the same log applied on the restored store */
	h_put(s2, "k3", "c");
	watch_notify(r, s2);
	take(w, false);
	cr_assert_str_eq(got, "P k1=a@2;P k2=b@3;P k3=c@4;");
	mvcc_free(s2);
}

/* Take watcher id's events and append them to log as "P k@rev;". */
static void log_take(int64_t id, char *log, size_t *len)
{
	struct watch_delivery d;
	cr_assert_eq(watch_take(r, id, &d), 0);
	for (size_t e = 0; e < d.nevents; e++) {
		const struct mvcc_event *ev = d.events[e];
		*len += (size_t)snprintf(log + *len, 64, "%c %.*s@%lld;",
					 ev->type == MVCC_EVENT_PUT ? 'P' : 'D',
					 (int)ev->kv.key_len, ev->kv.key,
					 (long long)ev->kv.mod_revision);
	}
	watch_delivery_free(&d);
}

/* Many watchers of every kind against brute force over the event log. */
Test(watch, randomized_against_brute_force)
{
	watch_registry_free(r);
	cr_assert_eq(watch_registry_new(s, 8, &r), 0);
	enum { NW = 300, NKEYS = 40, NOPS = 1500 };
	struct {
		int64_t id;
		char key[8], end[8];
		int kind; /* 0 single, 1 range, 2 from key */
		int64_t start;
		bool noput, nodel;
		char *log;
		size_t len;
	} ws[NW];
	uint64_t seed = 42;
#define RND() \
	(seed = seed * 6364136223846793005ULL + 1442695040888963407ULL, (unsigned)(seed >> 33))
	char evlog[NOPS][40];
	int evrev[NOPS];
	char evkey[NOPS][8];
	bool evput[NOPS];
	int nev = 0;
	int nw = 0;
	for (int op = 0; op < NOPS; op++) {
		if (nw < NW && RND() % 4 == 0) {
			int i = nw++;
			memset(&ws[i], 0, sizeof(ws[i]));
			snprintf(ws[i].key, 8, "k%02u", RND() % NKEYS);
			ws[i].kind = RND() % 3;
			snprintf(ws[i].end, 8, "k%02u", RND() % (NKEYS + 2));
			if (ws[i].kind == 1 && strcmp(ws[i].end, ws[i].key) <= 0)
				ws[i].kind = 0;
			ws[i].start = RND() % 2 ? 0 : 1 + RND() % (unsigned)mvcc_rev(s);
			if (ws[i].start == 0)
				ws[i].start = mvcc_rev(s) + 1;
			ws[i].noput = RND() % 5 == 0;
			ws[i].nodel = !ws[i].noput && RND() % 5 == 0;
			struct watch_options o = {.key = ws[i].key,
						  .key_len = 3,
						  .start_revision = ws[i].start,
						  .filter_noput = ws[i].noput,
						  .filter_nodelete = ws[i].nodel};
			if (ws[i].kind == 1) {
				o.range_end = ws[i].end;
				o.range_end_len = 3;
			} else if (ws[i].kind == 2) {
				o.range_end = "\0";
				o.range_end_len = 1;
			}
			cr_assert_eq(watch_create(r, s, &o, &ws[i].id), 0);
			ws[i].log = calloc(1, 1 << 16);
		}
		char k[8];
		snprintf(k, sizeof(k), "k%02u", RND() % NKEYS);
		bool put = RND() % 3 != 0;
		if (put) {
			h_put(s, k, "v");
		} else if (h_del(s, k, NULL) == 0) {
			continue;
		}
		snprintf(evlog[nev], 40, "%c %s@%lld;", put ? 'P' : 'D', k,
			 (long long)mvcc_rev(s));
		evrev[nev] = (int)mvcc_rev(s);
		memcpy(evkey[nev], k, 8);
		evput[nev] = put;
		nev++;
		watch_notify(r, s);
		/* Consumers are slow: take from one ready watcher sometimes. */
		int64_t id;
		if (RND() % 3 == 0 && watch_next_ready(r, &id)) {
			for (int i = 0; i < nw; i++)
				if (ws[i].id == id)
					log_take(id, ws[i].log, &ws[i].len);
		}
		if (RND() % 4 == 0)
			watch_sync(r, s, 50);
	}
	/* Drain. */
	for (;;) {
		int64_t id;
		if (!watch_next_ready(r, &id)) {
			if (watch_sync(r, s, 1000) == 0 && !watch_next_ready(r, &id))
				break;
			continue;
		}
		for (int i = 0; i < nw; i++)
			if (ws[i].id == id)
				log_take(id, ws[i].log, &ws[i].len);
	}
	for (int i = 0; i < nw; i++) {
		static char want[1 << 16];
		size_t o = 0;
		want[0] = '\0';
		for (int e = 0; e < nev; e++) {
			if (evrev[e] < ws[i].start)
				continue;
			int c = strcmp(evkey[e], ws[i].key);
			bool in = ws[i].kind == 0 ? c == 0
				  : ws[i].kind == 2
					  ? c >= 0
					  : c >= 0 && strcmp(evkey[e], ws[i].end) < 0;
			if (!in || (evput[e] && ws[i].noput) || (!evput[e] && ws[i].nodel))
				continue;
			o += (size_t)snprintf(want + o, sizeof(want) - o, "%s", evlog[e]);
		}
		cr_assert_str_eq(ws[i].log, want,
				 "watcher %d (kind %d key %s end %s start %lld)", i,
				 ws[i].kind, ws[i].key, ws[i].end, (long long)ws[i].start);
		free(ws[i].log);
	}
}
