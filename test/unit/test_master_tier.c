/*
 * test_master_tier: the SSD tier in the master's pure core under a fake
 * clock — past the DRAM watermark the coldest objects are demoted (a
 * FETCH order in an SSD segment's log, the object's own agent's segment
 * first) and leave DRAM only once their owner stored them; demotions not
 * answered in time, abandoned or whose object went away are given up and
 * their DRAM space is held while the owner may still read it; an SSD
 * segment past its watermark evicts its coldest replicas (leased ones
 * skipped); soft-pinned objects stay in DRAM while others can go; puts straight to SSD, lost replicas, promotions back to DRAM
 * and inventory re-sync of an SSD segment.
 */
#include <stdlib.h>

#include "test_master_util.h"

TestSuite(master_tier, .init = setup, .fini = teardown);

#define KiB 1024ull
#define BLOCK 4096ull

static void mount_dram(const char *name, const char *agent, uint64_t size)
{
	must(master__mount(c, name, agent, MASTER_TIER_DRAM, 0x10000000, size, false, 0,
			   NULL));
}

static void mount_ssd(const char *name, const char *agent, uint64_t size, double hw, double er)
{
	struct master_mount mt = {
		.name = name,
		.agent = agent,
		.tier = MASTER_TIER_SSD,
		.size = size,
		.block_bytes = BLOCK,
		.high_watermark = hw,
		.eviction_ratio = er,
	};
	must(master__mount_seg(c, &mt, 0, NULL));
}

static const struct master_seg *seg(const char *name)
{
	uint32_t id = master__seg_find(c, name);
	cr_assert_neq(id, MASTER_NO_SEGMENT, "%s mounted", name);
	return master__seg(c, id);
}

static uint64_t seg_used(const char *name)
{
	struct master_alloc_stats as;
	master__alloc_stats(seg(name)->alloc, &as);
	return as.used;
}

static uint32_t crc_of(const char *key)
{
	return (uint32_t)strlen(key) * 0x9e3779b1u + (uint8_t)key[strlen(key) - 1];
}

static void put_pinned(const char *key, uint64_t size, bool soft_pin, uint64_t now)
{
	const struct master_obj *o;
	struct master_put p = {.key = (const uint8_t *)key,
			       .klen = strlen(key),
			       .size = size,
			       .soft_pin = soft_pin};
	must(master__put_start(c, &p, now, &o));
	uint32_t crc = crc_of(key);
	must(master__put_end(c, K(key), &crc, now));
}

static void put(const char *key, uint64_t size, uint64_t now)
{
	put_pinned(key, size, false, now);
}

/* The events of segment name's log after *pos, by op; *pos moves on. */
struct evs {
	size_t n, fetch, add, del;
	char keys[256][32];
	uint8_t ops[256];
};

static void collect(void *ud, const struct master_ev *e)
{
	struct evs *x = ud;
	if (x->n < 256) {
		snprintf(x->keys[x->n], sizeof(x->keys[0]), "%.*s", (int)e->klen, e->key);
		x->ops[x->n] = e->op;
	}
	x->n++;
	x->fetch += e->op == MASTER_EV_FETCH;
	x->add += e->op == MASTER_EV_ADD;
	x->del += e->op == MASTER_EV_DEL;
}

/* Where segment name's log ends now. */
static uint64_t log_end(const char *name)
{
	struct master_mlog_stats ls;
	master__mlog_stats(seg(name)->log, &ls);
	return ls.last;
}

static struct evs read_log(const char *name, uint64_t *pos)
{
	struct evs x;
	memset(&x, 0, sizeof(x));
	size_t n;
	must(master__mlog_read(seg(name)->log, *pos, 100000, 1 << 30, collect, &x, &n));
	*pos = log_end(name);
	return x;
}

static int tier(const char *agent, const char *segment, enum master_tier_op op,
		const char *key, uint64_t offset, uint64_t size, uint64_t now)
{
	struct master_tier_item it = {
		.key = (const uint8_t *)key,
		.klen = strlen(key),
		.offset = offset,
		.size = size,
		.has_crc = true,
		.crc = crc_of(key),
	};
	return master__tier_update(c, agent, segment, op, &it, now);
}

static const struct master_obj *find(const char *key)
{
	return master__find(c, K(key));
}

static bool on_tier(const char *key, enum master_tier t)
{
	const struct master_obj *o = find(key);
	for (unsigned i = 0; o && i < o->nrep; i++)
		if (master__seg(c, o->rep[i].seg)->tier == t)
			return true;
	return false;
}

static struct master_core_stats stats(void)
{
	struct master_core_stats st;
	master__core_stats(c, &st);
	return st;
}

/* Fill DRAM segment "d" (1 MiB) with 64 KiB objects k0..k<n-1>. */
static void fill(int n, uint64_t now)
{
	char key[32];
	for (int i = 0; i < n; i++) {
		snprintf(key, sizeof(key), "k%d", i);
		put(key, 64 * KiB, now);
	}
}

Test(master_tier, past_the_watermark_the_coldest_are_demoted_not_evicted)
{
	mount_dram("d", "a", 1 * MiB);
	mount_ssd("a/ssd", "a", 16 * MiB, 0, 0);
	cr_assert_eq(seg("a/ssd")->block, BLOCK);
	uint64_t pos = log_end("a/ssd");
	/* 15 of 16 slots: past 0.9, a round of 0.1 (two objects' worth). */
	fill(15, 0);
	struct evs x = read_log("a/ssd", &pos);
	cr_assert_eq(x.fetch, 2, "two FETCH orders, got %zu", x.fetch);
	cr_assert_str_eq(x.keys[0], "k0", "the coldest first");
	cr_assert_str_eq(x.keys[1], "k1");
	const struct master_obj *o = find("k0");
	cr_assert(o->flags & MASTER_OBJ_DEMOTING);
	uint32_t src;
	uint64_t off;
	cr_assert(master__demote_source(c, K("k0"), &src, &off));
	cr_assert_eq(src, master__seg_find(c, "d"));
	cr_assert_eq(off, o->rep[0].offset);
	cr_assert_not(master__demote_source(c, K("k5"), &src, &off), "not on its way");
	struct master_core_stats st = stats();
	cr_assert_eq(st.demoting, 2);
	cr_assert_eq(st.demoting_bytes, 128 * KiB);
	cr_assert_eq(st.dram_used, 15 * 64 * KiB, "nothing leaves DRAM before it is stored");
	cr_assert_eq(seg("a/ssd")->promised, 128 * KiB);
	/* Another round does not demote again what is on its way. */
	master__tick(c, 100);
	cr_assert_eq(read_log("a/ssd", &pos).fetch, 0);
	/* Stored: the SSD replica joins, the DRAM one leaves. */
	uint64_t dpos = log_end("d");
	must(tier("a", "a/ssd", MASTER_TIER_DEMOTED, "k0", 0, 64 * KiB, 200));
	must(tier("a", "a/ssd", MASTER_TIER_DEMOTED, "k1", 64 * KiB, 64 * KiB, 200));
	o = find("k0");
	cr_assert_eq(o->nrep, 1);
	cr_assert(o->flags & MASTER_OBJ_SSD);
	cr_assert_not(o->flags & MASTER_OBJ_DEMOTING);
	cr_assert_eq(o->crc, crc_of("k0"), "its checksum kept");
	cr_assert(on_tier("k0", MASTER_TIER_SSD) && !on_tier("k0", MASTER_TIER_DRAM));
	st = stats();
	cr_assert_eq(st.dram_used, 13 * 64 * KiB);
	cr_assert_eq(st.ssd_used, 128 * KiB);
	cr_assert_eq(st.ssd_objects, 2);
	cr_assert_eq(st.demoting, 0);
	cr_assert_eq(seg("a/ssd")->promised, 0);
	cr_assert_eq(master__core_counters(c)->demotions, 2);
	cr_assert_eq(master__core_counters(c)->evictions, 0, "nothing evicted");
	x = read_log("d", &dpos);
	cr_assert_eq(x.del, 2, "the DRAM mirror hears of it");
	x = read_log("a/ssd", &pos);
	cr_assert_eq(x.add, 2, "and the SSD one");
	/* A get finds it on SSD, and leases it. */
	must(master__get(c, K("k0"), 300, &o));
	cr_assert_eq(master__seg(c, o->rep[0].seg)->tier, MASTER_TIER_SSD);
	cr_assert_eq(o->rep[0].offset, 0);
	/* A second answer for the same key is refused: nothing on its way. */
	cr_assert_eq(tier("a", "a/ssd", MASTER_TIER_DEMOTED, "k0", 128 * KiB, 64 * KiB, 300),
		     MC_EINVALID_REPLICA);
	cr_assert_eq(stats().ssd_used, 128 * KiB);
}

Test(master_tier, the_own_agents_ssd_first_then_the_emptiest)
{
	mount_dram("da", "a", 1 * MiB);
	mount_dram("db", "b", 1 * MiB);
	mount_ssd("a/ssd", "a", 16 * MiB, 0, 0);
	mount_ssd("b/ssd", "b", 8 * MiB, 0, 0);
	mount_ssd("c/ssd", "c", 64 * MiB, 0, 0);
	uint64_t pa = log_end("a/ssd"), pb = log_end("b/ssd"), pc = log_end("c/ssd");
	const struct master_obj *o;
	char key[32];
	/* 30 objects of 64 KiB over the two DRAM segments (2 MiB). */
	for (int i = 0; i < 30; i++) {
		snprintf(key, sizeof(key), "k%d", i);
		struct master_put p = {.key = (const uint8_t *)key,
				       .klen = strlen(key),
				       .size = 64 * KiB,
				       .preferred = i % 2 ? "db" : "da"};
		must(master__put_start(c, &p, 0, &o));
		must(master__put_end(c, K(key), NULL, 0));
	}
	struct evs xa = read_log("a/ssd", &pa), xb = read_log("b/ssd", &pb),
		   xc = read_log("c/ssd", &pc);
	cr_assert_gt(xa.fetch + xb.fetch, 0);
	cr_assert_eq(xc.fetch, 0, "never another agent's while the own one has room");
	for (size_t i = 0; i < xa.n; i++) {
		const struct master_obj *v = find(xa.keys[i]);
		cr_assert_str_eq(master__seg(c, v->rep[0].seg)->name, "da", "%s", xa.keys[i]);
	}
	for (size_t i = 0; i < xb.n; i++) {
		const struct master_obj *v = find(xb.keys[i]);
		cr_assert_str_eq(master__seg(c, v->rep[0].seg)->name, "db", "%s", xb.keys[i]);
	}
	/* b's own SSD segment full: its objects go to the one with room. */
	must(master__unmount(c, "a/ssd", "a", NULL, NULL));
	must(master__unmount(c, "b/ssd", "b", NULL, NULL));
	master__tick(c, 1); /* (their demotions are given up, a round goes on) */
	cr_assert_eq(master__core_counters(c)->demotion_failures, 4);
	xc = read_log("c/ssd", &pc);
	cr_assert_gt(xc.fetch, 0, "another agent's segment with room");
}

Test(master_tier, soft_pinned_objects_stay_in_dram_while_others_can_go)
{
	mount_dram("d", "a", 1 * MiB);
	mount_ssd("a/ssd", "a", 16 * MiB, 0, 0);
	uint64_t pos = log_end("a/ssd");
	char key[32];
	/* The five coldest soft-pinned, then ten others: 15 of 16 slots. */
	for (int i = 0; i < 15; i++) {
		snprintf(key, sizeof(key), "%c%d", i < 5 ? 'p' : 'k', i);
		put_pinned(key, 64 * KiB, i < 5, 0);
	}
	struct evs x = read_log("a/ssd", &pos);
	cr_assert_eq(x.fetch, 2, "got %zu", x.fetch);
	cr_assert_str_eq(x.keys[0], "k5", "the coldest unpinned, not the pinned ones");
	cr_assert_str_eq(x.keys[1], "k6");
	for (int i = 0; i < 5; i++) {
		snprintf(key, sizeof(key), "p%d", i);
		cr_assert_not(find(key)->flags & MASTER_OBJ_DEMOTING, "%s stays", key);
	}
}

Test(master_tier, soft_pinned_objects_go_when_nothing_else_is_left)
{
	mount_dram("d", "a", 1 * MiB);
	mount_ssd("a/ssd", "a", 16 * MiB, 0, 0);
	uint64_t pos = log_end("a/ssd");
	char key[32];
	for (int i = 0; i < 15; i++) {
		snprintf(key, sizeof(key), "p%d", i);
		put_pinned(key, 64 * KiB, true, 0);
	}
	/* Only as many as bring DRAM under its watermark: one. */
	struct evs x = read_log("a/ssd", &pos);
	cr_assert_eq(x.fetch, 1, "got %zu", x.fetch);
	cr_assert_str_eq(x.keys[0], "p0", "the coldest");
	must(tier("a", "a/ssd", MASTER_TIER_DEMOTED, "p0", 0, 64 * KiB, 10));
	cr_assert(on_tier("p0", MASTER_TIER_SSD) && !on_tier("p0", MASTER_TIER_DRAM));
	cr_assert_eq(master__core_counters(c)->evictions, 0, "demoted, not evicted");
}

Test(master_tier, demotions_not_answered_or_abandoned_are_given_up)
{
	mount_dram("d", "a", 1 * MiB);
	mount_ssd("a/ssd", "a", 16 * MiB, 0, 0);
	uint64_t pos = log_end("a/ssd");
	fill(15, 0);
	cr_assert_eq(read_log("a/ssd", &pos).fetch, 2);
	must(tier("a", "a/ssd", MASTER_TIER_ABANDONED, "k0", 0, 0, 10));
	cr_assert_not(find("k0")->flags & MASTER_OBJ_DEMOTING);
	cr_assert_eq(tier("a", "a/ssd", MASTER_TIER_ABANDONED, "k0", 0, 0, 10),
		     MC_EINVALID_REPLICA, "once");
	/* k1 is never answered: given up after --put-timeout. */
	master__heartbeat(c, "a", opts.put_timeout_ms - 1);
	master__tick(c, opts.put_timeout_ms - 1);
	cr_assert(find("k1")->flags & MASTER_OBJ_DEMOTING);
	master__tick(c, opts.put_timeout_ms);
	cr_assert_eq(master__core_counters(c)->demotion_failures, 2);
	/* The round goes on with others (given up ones went to the tail). */
	struct evs x = read_log("a/ssd", &pos);
	cr_assert_eq(x.fetch, 2);
	cr_assert_str_eq(x.keys[0], "k2");
	cr_assert_str_eq(x.keys[1], "k3");
	cr_assert_eq(tier("a", "a/ssd", MASTER_TIER_DEMOTED, "k1", 0, 64 * KiB,
			  opts.put_timeout_ms + 1),
		     MC_EINVALID_REPLICA, "too late");
	cr_assert_eq(stats().ssd_used, 0);
	/* Another size or checksum than the object's is refused. */
	cr_assert_eq(tier("a", "a/ssd", MASTER_TIER_DEMOTED, "k2", 0, 64 * KiB - 1,
			  opts.put_timeout_ms + 1),
		     MC_EINVALID_REPLICA);
	cr_assert_not(find("k2")->flags & MASTER_OBJ_DEMOTING, "and given up");
	/* Another agent cannot answer for the segment. */
	cr_assert_eq(tier("b", "a/ssd", MASTER_TIER_DEMOTED, "k3", 0, 64 * KiB,
			  opts.put_timeout_ms + 1),
		     -EACCES);
	cr_assert_eq(tier("a", "d", MASTER_TIER_DEMOTED, "k3", 0, 64 * KiB,
			  opts.put_timeout_ms + 1),
		     -EINVAL, "not an SSD segment");
}

/* The DRAM segment of objects on their way to an SSD goes (its agent
 * expired or unmounted): the owner's answer for one finds it gone, and
 * the reaper takes the other's demotion with its object. */
Test(master_tier, demotions_whose_source_goes_are_dropped_with_it)
{
	mount_dram("d", "b", 1 * MiB);
	mount_ssd("a/ssd", "a", 16 * MiB, 0, 0);
	uint64_t pos = log_end("a/ssd");
	fill(15, 0);
	cr_assert_eq(read_log("a/ssd", &pos).fetch, 2);
	cr_assert_eq(stats().demoting, 2);
	must(master__unmount(c, "d", "b", NULL, NULL));
	cr_assert_eq(tier("a", "a/ssd", MASTER_TIER_DEMOTED, "k0", 0, 64 * KiB, 10),
		     MC_EINVALID_REPLICA, "its object went with its segment");
	cr_assert_null(find("k0"));
	cr_assert_eq(reap_all(), 15);
	struct master_core_stats st = stats();
	cr_assert_eq(st.objects, 0);
	cr_assert_eq(st.demoting, 0);
	cr_assert_eq(seg("a/ssd")->promised, 0);
	cr_assert_eq(st.ssd_used, 0);
	master__heartbeat(c, "a", opts.put_timeout_ms + 1);
	master__tick(c, opts.put_timeout_ms + 1);
	cr_assert_eq(master__core_counters(c)->demotion_failures, 0,
		     "nothing left to give up");
}

Test(master_tier, an_object_removed_on_its_way_keeps_its_dram_space_until_the_deadline)
{
	mount_dram("d", "a", 1 * MiB);
	mount_ssd("a/ssd", "a", 16 * MiB, 0, 0);
	uint64_t pos = log_end("a/ssd");
	fill(15, 0);
	cr_assert_eq(read_log("a/ssd", &pos).fetch, 2);
	cr_assert_eq(stats().dram_used, 15 * 64 * KiB);
	must(master__remove(c, K("k0"), false, 100));
	cr_assert_null(find("k0"));
	struct master_core_stats st = stats();
	cr_assert_eq(st.demoting, 1);
	cr_assert_eq(st.dram_used, 15 * 64 * KiB, "held: the owner may be reading it");
	cr_assert_eq(tier("a", "a/ssd", MASTER_TIER_DEMOTED, "k0", 0, 64 * KiB, 200),
		     MC_EINVALID_REPLICA, "the copy is deleted, not a new object");
	cr_assert_null(find("k0"));
	master__heartbeat(c, "a", opts.put_timeout_ms);
	master__tick(c, opts.put_timeout_ms);
	cr_assert_leq(stats().dram_used, 14 * 64 * KiB, "free once the deadline passed");
	/* A put that needs room evicts for real, never one on its way. */
	put("new", 64 * KiB, opts.put_timeout_ms + 1);
	cr_assert_null(master__find(c, K("k0")));
}

Test(master_tier, a_leased_object_keeps_its_dram_bytes_while_the_lease_lasts)
{
	mount_dram("d", "a", 1 * MiB);
	mount_ssd("a/ssd", "a", 16 * MiB, 0, 0);
	uint64_t pos = log_end("a/ssd");
	fill(15, 0);
	cr_assert_eq(read_log("a/ssd", &pos).fetch, 2);
	const struct master_obj *o;
	must(master__get(c, K("k0"), 10, &o)); /* leased until 5010 */
	must(tier("a", "a/ssd", MASTER_TIER_DEMOTED, "k0", 0, 64 * KiB, 20));
	cr_assert(on_tier("k0", MASTER_TIER_SSD) && !on_tier("k0", MASTER_TIER_DRAM));
	cr_assert_eq(stats().dram_used, 15 * 64 * KiB, "a zero-copy view may read it");
	master__tick(c, 5010);
	cr_assert_leq(stats().dram_used, 14 * 64 * KiB);
}

Test(master_tier, no_ssd_segment_with_room_means_eviction)
{
	mount_dram("d", "a", 1 * MiB);
	mount_ssd("a/ssd", "a", 64 * KiB, 0, 0); /* one object's room */
	uint64_t pos = log_end("a/ssd");
	fill(15, 0);
	struct evs x = read_log("a/ssd", &pos);
	cr_assert_eq(x.fetch, 1);
	cr_assert_eq(master__core_counters(c)->evictions, 1, "the other one is evicted");
	cr_assert_null(find("k1"));
}

Test(master_tier, an_ssd_segment_past_its_watermark_evicts_its_coldest)
{
	mount_dram("d", "a", 1 * MiB);
	mount_ssd("s", "a", 40 * BLOCK, 0.5, 0.25);
	cr_assert_eq(seg("s")->high_watermark, 0.5);
	uint64_t pos = log_end("s");
	char key[32];
	must(tier("a", "s", MASTER_TIER_PUT, "s0", 0, 100, 0));
	const struct master_obj *o;
	must(master__get(c, K("s0"), 1, &o)); /* leased until 5001 */
	for (int i = 1; i < 20; i++) {
		snprintf(key, sizeof(key), "s%d", i);
		must(tier("a", "s", MASTER_TIER_PUT, key, (uint64_t)i * BLOCK, 100, 2));
	}
	master__tick(c, 3);
	cr_assert_eq(stats().ssd_objects, 20, "at the watermark: all kept");
	must(tier("a", "s", MASTER_TIER_PUT, "s20", 20 * BLOCK, 100, 4));
	/* Past it: a quarter of the segment (10 blocks) goes, least recently
	 * read first, the leased one skipped. */
	struct master_core_stats st = stats();
	cr_assert_eq(st.ssd_objects, 11, "got %llu", (unsigned long long)st.ssd_objects);
	cr_assert_not_null(find("s0"));
	cr_assert_null(find("s1"));
	cr_assert_null(find("s10"));
	cr_assert_not_null(find("s11"));
	cr_assert_not_null(find("s20"));
	cr_assert_eq(master__core_counters(c)->ssd_evictions, 10);
	cr_assert_eq(read_log("s", &pos).del, 10, "the owner deletes them");
	cr_assert_eq(seg_used("s"), 11 * BLOCK);
}

Test(master_tier, puts_straight_to_ssd_and_lost_replicas)
{
	mount_dram("d", "a", 1 * MiB);
	mount_ssd("s", "a", 1 * MiB, 0, 0);
	must(tier("a", "s", MASTER_TIER_PUT, "p", 0, 5000, 0));
	const struct master_obj *o = find("p");
	cr_assert(o->flags & MASTER_OBJ_SSD);
	cr_assert_eq(seg_used("s"), 2 * BLOCK, "whole blocks");
	cr_assert_eq(tier("a", "s", MASTER_TIER_PUT, "p", 2 * BLOCK, 10, 0),
		     MC_EOBJECT_ALREADY_EXISTS);
	cr_assert_eq(tier("a", "s", MASTER_TIER_PUT, "q", BLOCK, 10, 0), -EBUSY, "taken");
	cr_assert_eq(tier("a", "s", MASTER_TIER_PUT, "q", 100, 10, 0), -EINVAL, "unaligned");
	cr_assert_eq(tier("a", "s", MASTER_TIER_PUT, "q", 1 * MiB, 10, 0), -EINVAL, "outside");
	cr_assert_eq(tier("a", "s", MASTER_TIER_PUT, "q", 2 * BLOCK, 0, 0), -EINVAL, "empty");
	cr_assert_eq(tier("a", "nope", MASTER_TIER_PUT, "q", 2 * BLOCK, 10, 0),
		     MC_ESEGMENT_NOT_FOUND);
	cr_assert_eq(master__core_counters(c)->ssd_puts, 1);
	cr_assert_eq(tier("a", "s", MASTER_TIER_LOST, "p", BLOCK, 0, 0), MC_EOBJECT_NOT_FOUND,
		     "not at that offset");
	must(tier("a", "s", MASTER_TIER_LOST, "p", 0, 0, 0));
	cr_assert_null(find("p"));
	cr_assert_eq(seg_used("s"), 0);
	cr_assert_eq(master__core_counters(c)->ssd_lost, 1);
}

Test(master_tier, a_promotion_moves_an_ssd_object_back_to_dram)
{
	mount_dram("d", "a", 8 * MiB);
	mount_ssd("s", "a", 1 * MiB, 0, 0);
	must(tier("a", "s", MASTER_TIER_PUT, "p", 0, 5000, 0));
	uint64_t spos = log_end("s");
	uint64_t off, len, ep = seg("d")->lease_epoch;
	must(master__lease_grant(c, "a", "d", ep, 1 * MiB, &off, &len));
	cr_assert_geq(len, 4 * 8192);
	struct master_commit it = {.key = K("p"),
				   .offset = off,
				   .size = 5000,
				   .has_crc = true,
				   .crc = crc_of("p") + 1,
				   .promote = true};
	cr_assert_eq(master__commit(c, "a", "d", ep, &it, 1), MC_EINVALID_REPLICA,
		     "another checksum");
	it.crc = crc_of("p");
	it.offset = off + 8192;
	must(master__commit(c, "a", "d", ep, &it, 1));
	const struct master_obj *o = find("p");
	cr_assert_eq(o->nrep, 1);
	cr_assert_not(o->flags & MASTER_OBJ_SSD);
	cr_assert(on_tier("p", MASTER_TIER_DRAM) && !on_tier("p", MASTER_TIER_SSD));
	cr_assert_eq(o->rep[0].offset, off + 8192);
	cr_assert_eq(seg_used("s"), 0);
	cr_assert_eq(read_log("s", &spos).del, 1, "the SSD copy is deleted");
	cr_assert_eq(master__core_counters(c)->promotions, 1);
	/* Not again: it has a DRAM replica; a key that is not there. */
	it.offset = off + 16384;
	cr_assert_eq(master__commit(c, "a", "d", ep, &it, 2), MC_EINVALID_REPLICA);
	it.key = (const uint8_t *)"zz";
	it.klen = 2;
	it.offset = off + 24576;
	cr_assert_eq(master__commit(c, "a", "d", ep, &it, 2), MC_EOBJECT_NOT_FOUND);
}

Test(master_tier, an_ssd_segments_inventory_comes_back_after_a_restart)
{
	mount_dram("d", "a", 1 * MiB);
	mount_ssd("s", "a", 1 * MiB, 0, 0);
	must(tier("a", "s", MASTER_TIER_PUT, "p", 0, 5000, 0));
	/* The agent restarts: its segments are mounted empty, then its SSD
	 * store's objects reported. */
	mount_dram("d", "a", 1 * MiB);
	mount_ssd("s", "a", 1 * MiB, 0, 0);
	cr_assert_null(find("p"));
	struct master_inv_item it = {.key = K("p"),
				     .segment = "s",
				     .offset = 0,
				     .size = 5000,
				     .has_crc = true,
				     .crc = crc_of("p")};
	must(master__inventory_add(c, "a", &it, 1));
	cr_assert(find("p")->flags & MASTER_OBJ_SSD);
	cr_assert_eq(seg_used("s"), 2 * BLOCK);
	it.offset = 100;
	it.key = (const uint8_t *)"q";
	cr_assert_eq(master__inventory_add(c, "a", &it, 1), -EBUSY, "not at a block");
	/* Another geometry is refused; another block size too. */
	struct master_mount mt = {.name = "s",
				  .agent = "a",
				  .tier = MASTER_TIER_SSD,
				  .size = 1 * MiB,
				  .block_bytes = 8192};
	cr_assert_eq(master__mount_seg(c, &mt, 2, NULL), -EEXIST);
	mt.block_bytes = 100;
	mt.name = "t";
	cr_assert_eq(master__mount_seg(c, &mt, 2, NULL), -EINVAL);
	mt.block_bytes = 8192;
	mt.tier = MASTER_TIER_DRAM;
	cr_assert_eq(master__mount_seg(c, &mt, 2, NULL), -EINVAL, "DRAM takes 64-byte blocks");
}

Test(master_tier, without_ssd_segments_eviction_is_as_before)
{
	mount_dram("d", "a", 1 * MiB);
	fill(15, 0);
	cr_assert_eq(master__core_counters(c)->evictions, 2);
	cr_assert_eq(master__core_counters(c)->demotion_starts, 0);
	cr_assert_null(find("k0"));
	cr_assert_null(find("k1"));
}
