/*
 * test_master_mlog: a segment's mirror log (mlog.c) — order, reads after
 * a position, acknowledgement, the byte budget and what "behind" means —
 * and the core's use of it: which changes of COMPLETE replicas are
 * logged to which segment (PutEnd, removal, eviction, TTL, an agent's
 * expiry elsewhere; never PENDING puts or inventory reports), where a
 * mount tells the owner to start, checksums kept with objects, and paged
 * listings of a segment. A model of the owner's mirror, fed only by the
 * log, must equal the index after every step.
 */
#include <stdlib.h>

#include "test_master_util.h"

/* ------------------------------------------------------------ the log */

struct seen {
	uint64_t seq[64];
	char key[64][16];
	uint8_t op[64];
	size_t n;
};

static void record(void *ud, const struct master_ev *e)
{
	struct seen *s = ud;
	cr_assert_lt(s->n, 64);
	s->seq[s->n] = e->seq;
	s->op[s->n] = e->op;
	snprintf(s->key[s->n], sizeof(s->key[0]), "%.*s", (int)e->klen, (const char *)e->key);
	s->n++;
}

static void append(struct master_mlog *l, uint64_t seq, const char *key, uint8_t op)
{
	struct master_ev e = {.seq = seq,
			      .offset = seq * 64,
			      .size = 10,
			      .klen = (uint16_t)strlen(key),
			      .op = op,
			      .key = (const uint8_t *)key};
	must(master__mlog_append(l, &e));
}

Test(master_mlog, reads_in_order_after_a_position_and_acks_free)
{
	struct master_mlog *l;
	must(master__mlog_new(1 << 20, 100, &l));
	cr_assert_not(master__mlog_has_after(l, 100), "empty log, owner at its start");
	for (uint64_t s = 101; s <= 110; s++) {
		char k[8];
		snprintf(k, sizeof(k), "k%llu", (unsigned long long)s);
		append(l, s, k, s % 2 ? MASTER_EV_ADD : MASTER_EV_DEL);
	}
	struct seen v = {0};
	size_t n;
	must(master__mlog_read(l, 100, 1000, 1 << 20, record, &v, &n));
	cr_assert_eq(n, 10);
	for (size_t i = 0; i < n; i++) {
		cr_assert_eq(v.seq[i], 101 + i);
		char k[8];
		snprintf(k, sizeof(k), "k%llu", (unsigned long long)(101 + i));
		cr_assert_str_eq(v.key[i], k);
	}
	memset(&v, 0, sizeof(v));
	must(master__mlog_read(l, 104, 3, 1 << 20, record, &v, &n));
	cr_assert_eq(n, 3, "at most max_events");
	cr_assert_eq(v.seq[0], 105);
	master__mlog_ack(l, 106);
	struct master_mlog_stats st;
	master__mlog_stats(l, &st);
	cr_assert_eq(st.records, 4, "acknowledged changes are freed");
	cr_assert_eq(st.acked, 106);
	cr_assert_eq(master__mlog_read(l, 103, 10, 1 << 20, record, &v, &n), MC_ECOMPACTED,
		     "before the acknowledgement: behind");
	cr_assert_eq(master__mlog_read(l, 111, 10, 1 << 20, record, &v, &n), MC_ECOMPACTED,
		     "a position from another log");
	cr_assert(master__mlog_has_after(l, 107));
	cr_assert_not(master__mlog_has_after(l, 110));
	master__mlog_ack(l, 500); /* not from this log: ignored */
	master__mlog_stats(l, &st);
	cr_assert_eq(st.records, 4);
	master__mlog_free(l);
}

Test(master_mlog, over_budget_the_oldest_go_and_owners_before_them_are_behind)
{
	struct master_mlog *l;
	must(master__mlog_new(4096, 0, &l));
	char key[200];
	memset(key, 'k', sizeof(key));
	for (uint64_t s = 1; s <= 100; s++) {
		struct master_ev e = {
			.seq = s, .klen = sizeof(key), .key = (const uint8_t *)key};
		must(master__mlog_append(l, &e));
	}
	struct master_mlog_stats st;
	master__mlog_stats(l, &st);
	cr_assert_leq(st.bytes, 4096);
	cr_assert_gt(st.records, 0);
	cr_assert_eq(st.last, 100);
	struct seen v = {0};
	size_t n;
	cr_assert_eq(master__mlog_read(l, 0, 10, 1 << 20, record, &v, &n), MC_ECOMPACTED);
	cr_assert(master__mlog_has_after(l, 0), "behind is something to answer");
	must(master__mlog_read(l, st.base, 100, 1 << 20, record, &v, &n));
	cr_assert_eq(n, st.records, "complete after the base");
	cr_assert_eq(v.seq[0], st.base + 1);
	/* A record larger than the whole budget still stays (the newest). */
	char big[8192];
	memset(big, 'b', sizeof(big));
	struct master_ev e = {.seq = 101, .klen = 4096, .key = (const uint8_t *)big};
	must(master__mlog_append(l, &e));
	master__mlog_stats(l, &st);
	cr_assert_eq(st.records, 1);
	cr_assert_eq(st.base, 100);
	master__mlog_reset(l, 200);
	master__mlog_stats(l, &st);
	cr_assert_eq(st.records, 0);
	cr_assert_eq(st.base, 200);
	cr_assert_eq(st.acked, 200);
	master__mlog_free(l);
}

Test(master_mlog, a_byte_budget_per_answer)
{
	struct master_mlog *l;
	must(master__mlog_new(1 << 20, 0, &l));
	char key[1000];
	memset(key, 'q', sizeof(key));
	for (uint64_t s = 1; s <= 20; s++) {
		struct master_ev e = {
			.seq = s, .klen = sizeof(key), .key = (const uint8_t *)key};
		must(master__mlog_append(l, &e));
	}
	size_t n;
	struct seen v = {0};
	must(master__mlog_read(l, 0, 1000, 5000, record, &v, &n));
	cr_assert_leq(n, 6);
	cr_assert_geq(n, 4);
	memset(&v, 0, sizeof(v));
	must(master__mlog_read(l, 0, 1000, 10, record, &v, &n));
	cr_assert_eq(n, 1, "the first change always goes");
	master__mlog_free(l);
}

/* ------------------------------------------------------------ the core */

TestSuite(mirror, .init = setup, .fini = teardown);

/* An owner's mirror, fed only from its segment's log. */
#define MODEL_MAX 512
struct model {
	const char *seg;
	uint64_t pos;
	size_t n;
	struct {
		char key[32];
		uint64_t offset, size;
		uint32_t crc;
		bool has_crc;
	} e[MODEL_MAX];
};

static int model_find(struct model *m, const uint8_t *key, size_t klen)
{
	for (size_t i = 0; i < m->n; i++)
		if (strlen(m->e[i].key) == klen && memcmp(m->e[i].key, key, klen) == 0)
			return (int)i;
	return -1;
}

static void model_apply(void *ud, const struct master_ev *e)
{
	struct model *m = ud;
	int i = model_find(m, e->key, e->klen);
	if (e->op == MASTER_EV_DEL) {
		if (i >= 0 && m->e[i].offset == e->offset)
			m->e[i] = m->e[--m->n];
	} else {
		if (i < 0) {
			cr_assert_lt(m->n, MODEL_MAX);
			i = (int)m->n++;
			snprintf(m->e[i].key, sizeof(m->e[i].key), "%.*s", (int)e->klen,
				 (const char *)e->key);
		}
		m->e[i].offset = e->offset;
		m->e[i].size = e->size;
		m->e[i].crc = e->crc;
		m->e[i].has_crc = (e->flags & MASTER_EV_F_CRC) != 0;
	}
	m->pos = e->seq;
}

struct lctx {
	struct model *m;
	size_t n;
};

static bool list_check(void *ud, const struct master_obj *o, unsigned r)
{
	struct lctx *x = ud;
	int i = model_find(x->m, master__obj_key(o), o->klen);
	cr_assert_geq(i, 0, "a listed object is in the mirror");
	cr_assert_eq(x->m->e[i].offset, o->rep[r].offset);
	x->n++;
	return true;
}

/* Follow the log (as SyncSegment does), then compare with the index,
 * both ways: every mirror entry is a replica there, and a listing of the
 * segment finds exactly the mirror's entries. */
static void model_sync(struct model *m)
{
	uint32_t id = master__seg_find(c, m->seg);
	cr_assert_neq(id, MASTER_NO_SEGMENT);
	const struct master_seg *s = master__seg(c, id);
	master__mlog_ack(s->log, m->pos);
	size_t n;
	must(master__mlog_read(s->log, m->pos, 100000, 1 << 30, model_apply, m, &n));
	for (size_t i = 0; i < m->n; i++) {
		const struct master_obj *o = master__find(c, K(m->e[i].key));
		cr_assert_not_null(o, "%s in the mirror of %s, not in the index", m->e[i].key,
				   m->seg);
		bool found = false;
		for (unsigned r = 0; r < o->nrep; r++)
			found |= o->rep[r].seg == id && o->rep[r].offset == m->e[i].offset;
		cr_assert(found, "%s at the mirror's offset", m->e[i].key);
		cr_assert_eq(o->size, m->e[i].size);
		cr_assert_eq(m->e[i].has_crc, (o->flags & MASTER_OBJ_CRC) != 0);
		cr_assert_eq(m->e[i].crc, o->crc);
	}
	struct lctx lx = {m, 0};
	uint64_t cursor = 0;
	while (!master__list_segment(c, id, &cursor, 7, list_check, &lx))
		;
	cr_assert_eq(lx.n, m->n, "%s: the index has %zu replicas there, the mirror %zu",
		     m->seg, lx.n, m->n);
}

static uint64_t mount(const char *name, const char *agent, uint64_t size, bool resync,
		      uint64_t now)
{
	uint64_t seq = 0;
	must(master__mount(c, name, agent, MASTER_TIER_DRAM, 0x10000000, size, resync, now,
			   &seq));
	return seq;
}

static int put(const char *key, uint64_t size, unsigned nrep, const char *pref, uint32_t crc,
	       uint64_t now)
{
	const struct master_obj *o;
	struct master_put p = {.key = (const uint8_t *)key,
			       .klen = strlen(key),
			       .size = size,
			       .replica_num = nrep,
			       .preferred = pref};
	int rc = master__put_start(c, &p, now, &o);
	if (rc)
		return rc;
	return master__put_end(c, K(key), &crc, now);
}

Test(mirror, every_change_of_a_complete_replica_reaches_its_segment_log)
{
	struct model a = {.seg = "sa"}, b = {.seg = "sb"}, d = {.seg = "sd"};
	a.pos = mount("sa", "A", 64 * MiB, false, 0);
	b.pos = mount("sb", "B", 64 * MiB, false, 0);
	d.pos = mount("sd", "D", 64 * MiB, false, 0);
	char key[32];
	for (int i = 0; i < 60; i++) {
		snprintf(key, sizeof(key), "k%d", i);
		must(put(key, 1000 + (uint64_t)i, 1 + (unsigned)i % 3, i % 2 ? "sb" : "sa",
			 0xabc00000u + (uint32_t)i, 0));
	}
	/* A PENDING put is not logged; a revoked one never was. */
	const struct master_obj *o;
	struct master_put p = {.key = K("pending"), .size = 10, .replica_num = 3};
	must(master__put_start(c, &p, 0, &o));
	must(master__put_start(c, &(struct master_put){.key = K("revoked"), .size = 10}, 0,
			       &o));
	must(master__put_revoke(c, K("revoked")));
	model_sync(&a);
	model_sync(&b);
	model_sync(&d);
	cr_assert_eq(a.n + b.n + d.n, 60 + 40 + 20, "one entry per replica");
	/* Removal, forced removal of a leased object, TTL, eviction. */
	must(master__remove(c, K("k1"), false, 1));
	must(master__get(c, K("k2"), 1, &o));
	cr_assert_eq(master__remove(c, K("k2"), false, 1), MC_EOBJECT_HAS_LEASE);
	must(master__remove(c, K("k2"), true, 1));
	must(master__put_start(
		c, &(struct master_put){.key = K("ttl"), .size = 100, .ttl_ms = 10}, 1, &o));
	must(master__put_end(c, K("ttl"), NULL, 1));
	model_sync(&a);
	model_sync(&b);
	model_sync(&d);
	cr_assert_eq(master__exist(c, K("ttl"), 100), 0, "TTL passed");
	model_sync(&a);
	model_sync(&b);
	model_sync(&d);
	/* An agent that goes silent loses its segment: its objects' other
	 * replicas stay, objects only there go — the others hear of that. */
	cr_assert(master__heartbeat(c, "A", 20000));
	cr_assert(master__heartbeat(c, "B", 20000));
	master__tick(c, 20001);
	cr_assert_eq(master__seg_find(c, "sd"), MASTER_NO_SEGMENT, "D expired");
	model_sync(&a);
	model_sync(&b);
	/* Remove everything: every replica's removal is logged. */
	uint64_t removed, skipped;
	master__remove_all(c, true, 20001, &removed, &skipped);
	cr_assert_eq(skipped, 0, "(the PENDING put had a replica on D: it went with it)");
	model_sync(&a);
	model_sync(&b);
	cr_assert_eq(a.n + b.n, 0);
	const struct master_counters *n = master__core_counters(c);
	cr_assert_gt(n->mirror_events, 0);
	cr_assert_eq(n->mirror_lost, 0);
}

Test(mirror, eviction_is_logged)
{
	struct model a = {.seg = "s"};
	a.pos = mount("s", "A", 4 * MiB, false, 0);
	char key[32];
	for (int i = 0; i < 200; i++) {
		snprintf(key, sizeof(key), "e%d", i);
		must(put(key, 64 * 1024, 1, NULL, (uint32_t)i, (uint64_t)i));
		if (i % 10 == 0)
			model_sync(&a);
	}
	cr_assert_gt(master__core_counters(c)->evictions, 0);
	model_sync(&a);
	cr_assert_lt(a.n, 64u);
}

Test(mirror, mounts_tell_the_owner_where_to_follow_from)
{
	uint64_t s0 = mount("s", "A", 64 * MiB, false, 0);
	must(put("x", 100, 1, NULL, 7, 0));
	uint32_t id = master__seg_find(c, "s");
	const struct master_seg *s = master__seg(c, id);
	struct master_mlog_stats st;
	master__mlog_stats(s->log, &st);
	cr_assert_eq(st.last, s0 + 2, "x's ADD (after the segment's own number)");
	master__mlog_ack(s->log, st.last);
	must(put("y", 100, 1, NULL, 8, 0));
	/* Mounting again with resync (a report sent again): the log goes
	 * on from the owner's last acknowledgement. */
	uint64_t s1 = mount("s", "A", 64 * MiB, true, 0);
	cr_assert_eq(s1, st.last);
	master__inventory_done(c, "A");
	/* Mounting again empty: the log starts over, nothing before it (the
	 * segment in another slot: the old one waits for the reaper). */
	uint64_t s2 = mount("s", "A", 64 * MiB, false, 0);
	cr_assert_neq(master__seg_find(c, "s"), id);
	master__mlog_stats(master__seg(c, master__seg_find(c, "s"))->log, &st);
	cr_assert_eq(st.records, 0);
	cr_assert_eq(s2, st.base);
	cr_assert_eq(master__exist(c, K("x"), 0), 0, "dropped with the segment's contents");
	/* A new leader numbers above any earlier leader. */
	master__ev_seq_floor(c, 1ull << 50);
	master__ev_seq_floor(c, 5);
	cr_assert_eq(master__ev_seq(c), 1ull << 50);
}

Test(mirror, inventory_reports_carry_checksums_and_are_idempotent)
{
	mount("s", "A", 64 * MiB, true, 0);
	struct master_inv_item it = {.key = K("obj"),
				     .segment = "s",
				     .offset = 4096,
				     .size = 1000,
				     .has_crc = true,
				     .crc = 0x1234};
	must(master__inventory_add(c, "A", &it, 0));
	must(master__inventory_add(c, "A", &it, 0));
	it.offset = 8192;
	cr_assert_eq(master__inventory_add(c, "A", &it, 0), MC_EOBJECT_ALREADY_EXISTS,
		     "another place on the same segment");
	mount("t", "B", 64 * MiB, true, 0);
	it.segment = "t";
	it.crc = 0x9999;
	cr_assert_eq(master__inventory_add(c, "B", &it, 0), MC_EOBJECT_ALREADY_EXISTS,
		     "another checksum: another object");
	it.crc = 0x1234;
	must(master__inventory_add(c, "B", &it, 0));
	const struct master_obj *o;
	must(master__get(c, K("obj"), 0, &o));
	cr_assert_eq(o->nrep, 2);
	cr_assert(o->flags & MASTER_OBJ_CRC);
	cr_assert_eq(o->crc, 0x1234);
	/* Reports are not news to their owner: nothing logged. */
	struct master_mlog_stats st;
	master__mlog_stats(master__seg(c, master__seg_find(c, "s"))->log, &st);
	cr_assert_eq(st.records, 0);
}

static bool list_mark(void *ud, const struct master_obj *o, unsigned r)
{
	struct {
		char *seen;
		size_t *found;
	} *x = ud;
	(void)r;
	int i;
	char k[32];
	snprintf(k, sizeof(k), "%.*s", (int)o->klen, (const char *)master__obj_key(o));
	if (strncmp(k, "old", 3) == 0 && sscanf(k + 3, "%d", &i) == 1 && i >= 0 && i < 500) {
		x->seen[i] = 1;
		(*x->found)++;
	}
	return true;
}

Test(mirror, listings_see_objects_present_throughout_while_the_index_grows)
{
	mount("s", "A", 1ull << 30, false, 0);
	mount("t", "B", 1ull << 30, false, 0);
	char key[32];
	for (int i = 0; i < 500; i++) {
		snprintf(key, sizeof(key), "old%d", i);
		must(put(key, 64, 1, "s", 0, 0));
	}
	uint32_t id = master__seg_find(c, "s");
	uint64_t cursor = 0;
	size_t pages = 0, found = 0;
	char *seen = calloc(500, 1);
	for (bool done = false; !done; pages++) {
		struct {
			char *seen;
			size_t *found;
		} x = {seen, &found};
		done = master__list_segment(c, id, &cursor, 16, list_mark, &x);
		/* The index grows (doubling its buckets) between pages. */
		for (int i = 0; i < 300; i++) {
			snprintf(key, sizeof(key), "new%zu-%d", pages, i);
			must(put(key, 64, 1, "t", 0, 0));
		}
	}
	for (int i = 0; i < 500; i++)
		cr_assert(seen[i], "old%d missed by the listing", i);
	cr_assert_gt(pages, 3);
	free(seen);
}
