/*
 * test_master_core: the master's pure core under a fake clock — mounts,
 * placement on distinct segments (preferred first), the put protocol,
 * leases, removal rules, PENDING timeouts, agent expiry, TTL, eviction
 * order with leases and soft pins, NO_SPACE only when eviction cannot
 * help, inventory re-sync, memory per object, removal by a key predicate
 * (RemoveRegex) and the clear of one segment's replica.
 */
#include "master/core_int.h"
#include "test_master_util.h"

TestSuite(master_core, .init = setup, .fini = teardown);

static const struct master_obj *put(const char *key, uint64_t size, unsigned nrep,
				    uint64_t now, int want)
{
	const struct master_obj *o = NULL;
	struct master_put p = {.key = (const uint8_t *)key,
			       .klen = strlen(key),
			       .size = size,
			       .replica_num = nrep};
	int rc = master__put_start(c, &p, now, &o);
	cr_assert_eq(rc, want, "put_start %s: %d (%s)", key, rc, mc_strerror(rc));
	if (rc == 0) {
		const struct master_obj *copy = o;
		must(master__put_end(c, K(key), NULL, now));
		return copy;
	}
	return NULL;
}

static int inv(const char *agent, const char *key, const char *seg, uint64_t off,
	       uint64_t size, uint64_t now)
{
	struct master_inv_item it = {.key = (const uint8_t *)key,
				     .klen = strlen(key),
				     .segment = seg,
				     .offset = off,
				     .size = size};
	return master__inventory_add(c, agent, &it, now);
}

static void mount(const char *name, const char *agent, uint64_t size, uint64_t now)
{
	must(master__mount(c, name, agent, MASTER_TIER_DRAM, 0x10000000, size, false, now,
			   NULL));
}

Test(master_core, put_get_remove_leases)
{
	mount("segA", "a", 64 * MiB, 0);
	mount("segB", "b", 64 * MiB, 0);
	const struct master_obj *o = NULL;
	struct master_put p = {
		.key = (const uint8_t *)"k1", .klen = 2, .size = 1000, .replica_num = 2};
	must(master__put_start(c, &p, 0, &o));
	cr_assert_eq(o->nrep, 2);
	cr_assert_neq(o->rep[0].seg, o->rep[1].seg, "distinct segments");
	cr_assert_eq(o->rep[0].state, MASTER_REP_PENDING);
	cr_assert_eq(master__exist(c, K("k1"), 0), 0, "PENDING does not exist yet");
	cr_assert_eq(master__get(c, K("k1"), 0, &o), MC_EOBJECT_NOT_FOUND);
	cr_assert_eq(master__put_start(c, &p, 0, &o), MC_EOBJECT_ALREADY_EXISTS,
		     "dup while pending");
	must(master__put_end(c, K("k1"), NULL, 1));
	cr_assert_eq(master__put_end(c, K("k1"), NULL, 1), MC_EINVALID_REPLICA);
	cr_assert_eq(master__put_start(c, &p, 1, &o), MC_EOBJECT_ALREADY_EXISTS,
		     "dup when complete");
	cr_assert_eq(master__exist(c, K("k1"), 1), 1);
	must(master__get(c, K("k1"), 100, &o));
	cr_assert_eq(o->size, 1000);
	cr_assert_eq(o->rep[0].state, MASTER_REP_COMPLETE);
	cr_assert_eq(master__remove(c, K("k1"), false, 5099), MC_EOBJECT_HAS_LEASE);
	must(master__remove(c, K("k1"), true, 5099));
	cr_assert_eq(master__exist(c, K("k1"), 5100), 0);
	/* Lease expiry allows a plain remove. */
	put("k2", 10, 1, 0, 0);
	must(master__get(c, K("k2"), 0, &o));
	cr_assert_eq(master__remove(c, K("k2"), false, 4999), MC_EOBJECT_HAS_LEASE);
	must(master__remove(c, K("k2"), false, 5000));
	cr_assert_eq(master__remove(c, K("k2"), false, 5000), MC_EOBJECT_NOT_FOUND);
	/* Keys: 1 and 4096 bytes fine, 0 and 4097 refused. */
	uint8_t big[MASTER_MAX_KEY_BYTES + 1];
	memset(big, 0xff, sizeof(big));
	struct master_put q = {.key = big, .klen = MASTER_MAX_KEY_BYTES, .size = 0};
	must(master__put_start(c, &q, 0, &o));
	q.klen++;
	cr_assert_eq(master__put_start(c, &q, 0, &o), -EINVAL);
	q.klen = 0;
	cr_assert_eq(master__put_start(c, &q, 0, &o), -EINVAL);
	q.klen = 1;
	q.replica_num = MASTER_MAX_REPLICAS + 1;
	cr_assert_eq(master__put_start(c, &q, 0, &o), -EINVAL);
	q.replica_num = 3;
	cr_assert_eq(master__put_start(c, &q, 0, &o), MC_ENO_SPACE, "only two segments");
	cr_assert_eq(master__put_revoke(c, big, MASTER_MAX_KEY_BYTES), 0);
	cr_assert_eq(master__put_revoke(c, big, MASTER_MAX_KEY_BYTES), MC_EOBJECT_NOT_FOUND);
}

Test(master_core, preferred_segment_first)
{
	mount("a0", "a", 64 * MiB, 0);
	mount("b0", "b", 128 * MiB, 0);
	mount("c0", "c", 64 * MiB, 0);
	uint32_t a0 = master__seg_find(c, "a0"), b0 = master__seg_find(c, "b0");
	char key[32];
	for (int i = 0; i < 20; i++) {
		const struct master_obj *o;
		snprintf(key, sizeof(key), "p%d", i);
		struct master_put p = {.key = (const uint8_t *)key,
				       .klen = strlen(key),
				       .size = MiB,
				       .replica_num = 2,
				       .preferred = "a0"};
		must(master__put_start(c, &p, 0, &o));
		cr_assert_eq(o->rep[0].seg, a0, "preferred first");
		cr_assert_eq(o->rep[1].seg, b0, "then the emptiest");
	}
}

/* Placement tries the emptiest segment first, then the next: past the
 * first few picks (segments whose free space is in holes too small) the
 * rest are taken in the same order. */
Test(master_core, placement_goes_down_the_segments_by_free_space)
{
	char name[16], agent[16], key[32];
	/* s0..s5: 64 MiB with 32 MiB free in 4 MiB holes; s6..s9: 16 MiB
	 * with 8..11 MiB free in one piece. */
	for (int i = 0; i < 10; i++) {
		snprintf(name, sizeof(name), "s%d", i);
		snprintf(agent, sizeof(agent), "a%d", i);
		must(master__mount(c, name, agent, MASTER_TIER_DRAM, 0x10000000ull * (i + 1),
				   i < 6 ? 64 * MiB : 16 * MiB, false, 0, NULL));
	}
	for (int i = 0; i < 10; i++) {
		snprintf(name, sizeof(name), "s%d", i);
		int n = i < 6 ? 16 : 1;
		uint64_t size = i < 6 ? 4 * MiB : (uint64_t)(8 - (i - 6)) * MiB;
		for (int j = 0; j < n; j++) {
			const struct master_obj *o;
			snprintf(key, sizeof(key), "f%d/%d", i, j);
			struct master_put p = {.key = (const uint8_t *)key,
					       .klen = strlen(key),
					       .size = size,
					       .preferred = name};
			must(master__put_start(c, &p, 0, &o));
			cr_assert_eq(o->rep[0].seg, master__seg_find(c, name));
			must(master__put_end(c, K(key), NULL, 0));
		}
		for (int j = 0; i < 6 && j < n; j += 2) {
			snprintf(key, sizeof(key), "f%d/%d", i, j);
			must(master__remove(c, K(key), false, 0));
		}
	}
	/* 5 MiB fits none of the holes: s9 (11 MiB free), then s8, s7. */
	for (int k = 0; k < 3; k++) {
		const struct master_obj *o;
		snprintf(key, sizeof(key), "big%d", k);
		struct master_put p = {
			.key = (const uint8_t *)key, .klen = strlen(key), .size = 5 * MiB};
		must(master__put_start(c, &p, 0, &o));
		snprintf(name, sizeof(name), "s%d", 9 - k);
		cr_assert_eq(o->rep[0].seg, master__seg_find(c, name), "big%d on %s", k, name);
	}
	/* 4 MiB fits a hole: the emptiest of those, the lowest slot of equals. */
	const struct master_obj *o;
	struct master_put p = {.key = K("hole"), .size = 4 * MiB};
	must(master__put_start(c, &p, 0, &o));
	cr_assert_eq(o->rep[0].seg, master__seg_find(c, "s0"));
}

Test(master_core, pending_puts_time_out)
{
	mount("s", "a", 16 * MiB, 0);
	const struct master_obj *o;
	struct master_put p = {.key = (const uint8_t *)"slow", .klen = 4, .size = 8 * MiB};
	must(master__put_start(c, &p, 1000, &o));
	struct master_core_stats st;
	master__core_stats(c, &st);
	cr_assert_eq(st.pending, 1);
	cr_assert_eq(st.dram_used, 8 * MiB);
	master__heartbeat(c, "a", 30000);
	master__tick(c, 30999);
	master__core_stats(c, &st);
	cr_assert_eq(st.pending, 1, "not yet");
	master__tick(c, 31000);
	master__core_stats(c, &st);
	cr_assert_eq(st.pending, 0);
	cr_assert_eq(st.objects, 0);
	cr_assert_eq(st.dram_used, 0, "space back");
	cr_assert_eq(master__core_counters(c)->put_timeouts, 1);
	cr_assert_eq(master__put_end(c, K("slow"), NULL, 31001), MC_EOBJECT_NOT_FOUND);
}

Test(master_core, silent_agent_expires)
{
	mount("sa", "a", 64 * MiB, 0);
	mount("sb", "b", 64 * MiB, 0);
	put("both", 100, 2, 0, 0);
	const struct master_obj *only_a = NULL;
	char key[16];
	for (int i = 0; i < 10; i++) {
		snprintf(key, sizeof(key), "one%d", i);
		const struct master_obj *o = put(key, 100, 1, 0, 0);
		if (o->rep[0].seg == master__seg_find(c, "sa"))
			only_a = o;
	}
	cr_assert_not_null(only_a);
	const struct master_seg *sb = master__seg(c, master__seg_find(c, "sb"));
	uint64_t free_b = master__alloc_free_bytes(sb->alloc), replicas_b = sb->replicas;
	/* b keeps heartbeating, a goes silent. */
	for (uint64_t t = 1000; t <= 10000; t += 1000) {
		cr_assert(master__heartbeat(c, "b", t));
		master__tick(c, t);
	}
	cr_assert_eq(master__seg_find(c, "sa"), MASTER_NO_SEGMENT, "a's segment unmounted");
	cr_assert_neq(master__seg_find(c, "sb"), MASTER_NO_SEGMENT);
	cr_assert_not(master__heartbeat(c, "a", 10001), "a must re-sync");
	const struct master_obj *o;
	must(master__get(c, K("both"), 10001, &o));
	cr_assert_eq(o->nrep, 1, "the replica on b survives");
	cr_assert_eq(o->rep[0].seg, master__seg_find(c, "sb"));
	unsigned left = 0;
	for (int i = 0; i < 10; i++) {
		snprintf(key, sizeof(key), "one%d", i);
		left += master__exist(c, K(key), 10001) == 1;
	}
	reap_all();
	struct master_core_stats st;
	master__core_stats(c, &st);
	cr_assert_eq(st.agents, 1);
	cr_assert_eq(st.objects, 1 + left, "objects only on a are gone");
	cr_assert_lt(left, 10);
	cr_assert_eq(master__core_counters(c)->agents_expired, 1);
	/* a's segment went whole (its space was not freed replica by
	 * replica); b's replicas and space are as they were. */
	cr_assert_eq(master__alloc_free_bytes(sb->alloc), free_b);
	cr_assert_eq(sb->replicas, replicas_b);
	mount("sa", "a", 64 * MiB, 10002);
	cr_assert_eq(
		master__alloc_free_bytes(master__seg(c, master__seg_find(c, "sa"))->alloc),
		64 * MiB, "mounted again: all of it free");
	put("after", 64 * MiB - 4096, 1, 10002, 0);
}

/* A segment that goes leaves its replicas to the reaper: they read as
 * gone at once (a lookup drops them), the walk in steps drops the rest,
 * and the slot is kept from mounts until a walk that began after the
 * segment went has ended. */
Test(master_core, a_segment_gone_is_reaped_in_steps)
{
	mount("sa", "a", 64 * MiB, 0);
	mount("sb", "b", 64 * MiB, 0);
	char key[16];
	for (int i = 0; i < 2000; i++) {
		snprintf(key, sizeof(key), "k%d", i);
		put(key, 100, i % 2 ? 2 : 1, 0, 0);
	}
	uint32_t sa = master__seg_find(c, "sa"), sb = master__seg_find(c, "sb");
	uint64_t on_a = master__seg(c, sa)->replicas, on_b = master__seg(c, sb)->replicas;
	cr_assert_eq(on_a + on_b, 3000);
	/* Objects whose one replica is on a: they go with it. */
	uint64_t only_a = 0;
	for (int i = 0; i < 2000; i += 2) {
		snprintf(key, sizeof(key), "k%d", i);
		only_a += master__find(c, K(key))->rep[0].seg == sa;
	}
	uint64_t dropped;
	uint32_t slot;
	must(master__unmount(c, "sa", "a", &slot, &dropped));
	cr_assert_eq(slot, sa);
	cr_assert_eq(dropped, on_a);
	cr_assert(master__reap_pending(c));
	/* A lookup sees none of a's replicas. */
	const struct master_obj *o;
	must(master__get(c, K("k1"), 0, &o));
	cr_assert_eq(o->nrep, 1);
	cr_assert_eq(o->rep[0].seg, sb);
	/* The slot is nobody's until the walk has been through. */
	mount("sc", "c", 64 * MiB, 0);
	uint32_t sc = master__seg_find(c, "sc");
	cr_assert_neq(sc, sa, "the reaper's slot is not handed out");
	/* Steps of a few objects; a segment going meanwhile waits for the
	 * next walk. */
	uint64_t removed = 0;
	unsigned steps = 0;
	while (!master__reap_step(c, 100, reaped_count, &removed)) {
		if (++steps == 3) {
			put("on-c", 100, 1, 0, 0);
			must(master__unmount(c, "sc", "c", NULL, NULL));
		}
		cr_assert_lt(steps, 10000);
	}
	cr_assert_gt(steps, 10, "%u steps", steps);
	cr_assert_eq(removed, only_a + 1, "a's %llu objects and c's one",
		     (unsigned long long)only_a);
	cr_assert_not(master__reap_pending(c));
	cr_assert_eq(master__seg(c, sb)->replicas, on_b, "b's replicas stay");
	struct master_core_stats st;
	master__core_stats(c, &st);
	cr_assert_eq(st.objects, 2000 - only_a);
	/* Both slots are free again. */
	mount("sd", "d", 64 * MiB, 0);
	mount("se", "e", 64 * MiB, 0);
	cr_assert_lt(master__seg_find(c, "sd"), 3);
	cr_assert_lt(master__seg_find(c, "se"), 3);
	/* A step-down with a walk open drops the lot. */
	mount("sa", "a", 64 * MiB, 0);
	put("again", 100, 1, 0, 0);
	must(master__unmount(c, "sd", "d", NULL, NULL));
	cr_assert_not(master__reap_step(c, 1, NULL, NULL));
	master__core_reset(c);
	cr_assert_eq(reap_all(), 0, "the old index is freed, no segment reaped");
	cr_assert_not(master__reap_pending(c));
	mount("sa", "a", 64 * MiB, 0);
	cr_assert_eq(master__seg_find(c, "sa"), 0);
}

/* A leader stepping down drops its index at once and frees the objects
 * in the reaper's steps; a second step-down meanwhile queues its own. */
Test(master_core, a_step_down_frees_the_old_index_in_steps)
{
	char key[16];
	for (int round = 0; round < 2; round++) {
		mount("s", "a", 64 * MiB, 0);
		for (int i = 0; i < 3000; i++) {
			snprintf(key, sizeof(key), "k%d", i);
			put(key, 100, 1, 0, 0);
		}
		master__core_reset(c);
		struct master_core_stats st;
		master__core_stats(c, &st);
		cr_assert_eq(st.objects, 0, "the index is empty at once");
		cr_assert_null(master__find(c, K("k7")));
		cr_assert(master__reap_pending(c));
	}
	unsigned steps = 0;
	while (!master__reap_step(c, 100, NULL, NULL))
		cr_assert_lt(++steps, 1000);
	cr_assert_geq(steps, 50, "two indexes of 3,000 in steps of 100: %u", steps);
	cr_assert_not(master__reap_pending(c));
	/* The new leadership's index works, and an empty one leaves no
	 * grave. */
	mount("s", "a", 64 * MiB, 0);
	put("after", 100, 1, 0, 0);
	cr_assert_not_null(master__find(c, K("after")));
	master__core_reset(c);
	master__core_reset(c);
	cr_assert(master__reap_pending(c), "one object");
	reap_all();
	master__core_reset(c);
	cr_assert_not(master__reap_pending(c), "nothing to free");
	/* core_free frees what is left (SAN and valgrind say if not). */
	mount("s", "a", 64 * MiB, 0);
	put("left", 100, 1, 0, 0);
	master__core_reset(c);
}

/* Every replica in the index is on a live segment, and each live
 * segment's count and free space agree with the replicas on it. */
static void check_index(void)
{
	uint32_t nslots = master__seg_slots(c);
	uint64_t *reps = calloc(nslots, sizeof(*reps)),
		 *bytes = calloc(nslots, sizeof(*bytes));
	cr_assert(reps && bytes);
	for (size_t b = 0; b < master__index_slots(&c->ix); b++)
		for (const struct master_obj *o = master__index_slot(&c->ix, b); o;
		     o = o->hnext)
			for (unsigned i = 0; i < o->nrep; i++) {
				const struct master_seg *s = master__seg(c, o->rep[i].seg);
				cr_assert_not_null(s, "a replica on slot %u, which is gone",
						   (unsigned)o->rep[i].seg);
				reps[o->rep[i].seg]++;
				bytes[o->rep[i].seg] += master__rep_len(s, o->size);
			}
	/* (space of objects removed while leased stays taken until then) */
	for (size_t i = 0; i < c->nquar; i++) {
		const struct master_seg *s = master__seg(c, c->quar[i].seg);
		if (s && s->log_id == c->quar[i].log_id)
			bytes[c->quar[i].seg] += c->quar[i].len;
	}
	for (uint32_t id = 0; id < nslots; id++) {
		const struct master_seg *s = master__seg(c, id);
		if (!s)
			continue;
		cr_assert_eq(s->replicas, reps[id],
			     "segment %s: %llu replicas counted, %llu there", s->name,
			     (unsigned long long)s->replicas, (unsigned long long)reps[id]);
		cr_assert_eq(master__alloc_free_bytes(s->alloc), s->size - bytes[id],
			     "segment %s: free space", s->name);
	}
	free(reps);
	free(bytes);
}

/* Segments come and go (unmount, an agent's expiry, a restart's remount)
 * among puts, gets and removes, with the reaper in small steps between:
 * what a lookup returns is never on a segment gone, and once the reaper
 * is done the index and the segments agree. */
Test(master_core, segments_churn_and_the_index_stays_whole)
{
	enum { SEGS = 6, KEYS = 400 };
	bool up[SEGS] = {false};
	uint64_t seed = 12345, now = 0;
	char key[16], name[8], agent[8];
	for (int op = 0; op < 20000; op++) {
		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		unsigned r = (unsigned)(seed >> 33), k = r % KEYS, sg = (r / KEYS) % SEGS;
		snprintf(key, sizeof(key), "k%u", k);
		snprintf(name, sizeof(name), "s%u", sg);
		snprintf(agent, sizeof(agent), "a%u", sg);
		switch ((r >> 20) % 11) {
		case 0: /* mount, or a restarted agent's remount */
			must(master__mount(c, name, agent, MASTER_TIER_DRAM,
					   0x10000000ull * (sg + 1), 16 * MiB, false, now,
					   NULL));
			up[sg] = true;
			break;
		case 1:
			if (up[sg])
				must(master__unmount(c, name, agent, NULL, NULL));
			up[sg] = false;
			break;
		case 2: /* every agent but sg's heartbeats; sg's expires */
			now += opts.agent_ttl_ms / 2 + 1;
			for (unsigned i = 0; i < SEGS; i++) {
				snprintf(agent, sizeof(agent), "a%u", i);
				if (i != sg && up[i])
					master__heartbeat(c, agent, now);
			}
			master__tick(c, now);
			master__tick(c, now += opts.agent_ttl_ms / 2 + 1);
			for (unsigned i = 0; i < SEGS; i++) {
				snprintf(name, sizeof(name), "s%u", i);
				up[i] = master__seg_find(c, name) != MASTER_NO_SEGMENT;
			}
			for (unsigned i = 0; i < SEGS; i++) {
				snprintf(agent, sizeof(agent), "a%u", i);
				if (up[i])
					master__heartbeat(c, agent, now);
			}
			break;
		case 3:
		case 4: {
			const struct master_obj *o;
			struct master_put p = {.key = (const uint8_t *)key,
					       .klen = strlen(key),
					       .size = 4096 * (1 + r % 4),
					       .replica_num = 1 + r % 2};
			if (master__put_start(c, &p, now, &o) == 0 && r % 3)
				must(master__put_end(c, K(key), NULL, now));
			break;
		}
		case 5:
		case 6: {
			const struct master_obj *o;
			if (master__get(c, K(key), now, &o) == 0)
				for (unsigned i = 0; i < o->nrep; i++)
					cr_assert_not_null(
						master__seg(c, o->rep[i].seg),
						"a get returned a replica on a gone segment");
			break;
		}
		case 7:
		case 8: { /* (after a get: a leased object's space is held) */
			const struct master_obj *o;
			if (r % 2)
				(void)!master__get(c, K(key), now, &o);
			int rc = master__remove(c, K(key), true, now);
			cr_assert(rc == 0 || rc == MC_EOBJECT_NOT_FOUND, "remove: %d", rc);
			break;
		}
		default:
			master__reap_step(c, 1 + r % 50, NULL, NULL);
			break;
		}
		if (op % 1000 == 999) {
			reap_all();
			check_index();
		}
	}
	reap_all();
	check_index();
	cr_assert_gt(master__core_counters(c)->agents_expired, 100);
	cr_assert_gt(master__core_counters(c)->quarantined, 0);
}

Test(master_core, unmount_and_remount)
{
	mount("s", "a", 64 * MiB, 0);
	put("x", 100, 1, 0, 0);
	cr_assert_eq(master__mount(c, "s", "other", MASTER_TIER_DRAM, 0x10000000, 64 * MiB,
				   false, 0, NULL),
		     -EEXIST);
	cr_assert_eq(master__mount(c, "s", "a", MASTER_TIER_DRAM, 0x10000000, 32 * MiB, false,
				   0, NULL),
		     -EEXIST);
	/* Same geometry, resync: kept. Not resync: a restarted agent. */
	must(master__mount(c, "s", "a", MASTER_TIER_DRAM, 0x10000000, 64 * MiB, true, 0,
			   NULL));
	cr_assert_eq(master__exist(c, K("x"), 0), 1);
	must(master__mount(c, "s", "a", MASTER_TIER_DRAM, 0x10000000, 64 * MiB, false, 0,
			   NULL));
	cr_assert_eq(master__exist(c, K("x"), 0), 0);
	put("y", 100, 1, 0, 0);
	uint64_t dropped;
	uint32_t slot;
	cr_assert_eq(master__unmount(c, "s", "b", &slot, &dropped), -EACCES);
	cr_assert_eq(master__unmount(c, "nope", "a", &slot, &dropped), MC_ESEGMENT_NOT_FOUND);
	must(master__unmount(c, "s", "a", &slot, &dropped));
	cr_assert_eq(dropped, 1);
	cr_assert_eq(reap_all(), 1 + 1, "y, and x of the restarted agent's segment");
	cr_assert_eq(master__exist(c, K("y"), 0), 0);
}

/* A mount naming the instance token the master holds for its agent as
 * the previous one: the agent restarted (its data dir's token), and what
 * the old process mounted goes at once; any other token changes nothing. */
Test(master_core, a_restarted_agent_replaces_its_old_process)
{
	const uint8_t t1[16] = {1}, t2[16] = {2}, t3[16] = {3}, bad[16] = {9};
	struct master_mount mt = {.name = "s",
				  .agent = "a",
				  .tier = MASTER_TIER_DRAM,
				  .base = 0x10000000,
				  .size = 64 * MiB,
				  .instance = t1,
				  .instance_len = 16};
	must(master__mount_seg(c, &mt, 0, NULL));
	struct master_mount ssd = {.name = "s/ssd",
				   .agent = "a",
				   .tier = MASTER_TIER_SSD,
				   .size = 64 * MiB,
				   .instance = t1,
				   .instance_len = 16};
	must(master__mount_seg(c, &ssd, 0, NULL));
	put("x", 100, 1, 0, 0);
	/* Another process at another base, naming a wrong previous token or
	 * none: refused until the old one expires, as before. */
	mt.base = 0x20000000;
	mt.instance = t2;
	mt.previous = bad;
	mt.previous_len = 16;
	cr_assert_eq(master__mount_seg(c, &mt, 1, NULL), -EEXIST);
	mt.previous_len = 0;
	cr_assert_eq(master__mount_seg(c, &mt, 1, NULL), -EEXIST);
	cr_assert_eq(master__exist(c, K("x"), 1), 1);
	cr_assert_eq(master__core_counters(c)->agents_restarted, 0);
	/* The successor: both old segments and their objects go. */
	mt.previous = t1;
	mt.previous_len = 16;
	must(master__mount_seg(c, &mt, 2, NULL));
	cr_assert_eq(master__core_counters(c)->agents_restarted, 1);
	cr_assert_eq(master__exist(c, K("x"), 2), 0);
	cr_assert_eq(master__seg_find(c, "s/ssd"), MASTER_NO_SEGMENT);
	cr_assert_neq(master__seg_find(c, "s"), MASTER_NO_SEGMENT);
	/* Its next mounts (the SSD one, a re-mount) name t1 still: nothing
	 * more is dropped. */
	ssd.instance = t2;
	ssd.previous = t1;
	ssd.previous_len = 16;
	ssd.resync = true;
	must(master__mount_seg(c, &ssd, 3, NULL));
	put("y", 100, 1, 3, 0);
	mt.resync = true;
	must(master__mount_seg(c, &mt, 4, NULL));
	cr_assert_eq(master__exist(c, K("y"), 4), 1);
	cr_assert_eq(master__core_counters(c)->agents_restarted, 1);
	/* A third process, its previous t2. */
	mt.base = 0x30000000;
	mt.instance = t3;
	mt.previous = t2;
	mt.resync = false;
	must(master__mount_seg(c, &mt, 5, NULL));
	cr_assert_eq(master__core_counters(c)->agents_restarted, 2);
	cr_assert_eq(master__exist(c, K("y"), 5), 0);
	/* A fourth whose predecessor died before it mounted: its token and
	 * t3 both named, the known one found among them. */
	const uint8_t t4[16] = {4};
	uint8_t chain[3 * 16] = {0};
	memcpy(chain, t1, 16); /* (older, unknown now) */
	memcpy(chain + 16, t3, 16);
	memset(chain + 32, 7, 16); /* (the one that died) */
	put("z", 100, 1, 5, 0);
	mt.base = 0x40000000;
	mt.instance = t4;
	mt.previous = chain;
	mt.previous_len = sizeof(chain);
	must(master__mount_seg(c, &mt, 6, NULL));
	cr_assert_eq(master__core_counters(c)->agents_restarted, 3);
	cr_assert_eq(master__exist(c, K("z"), 6), 0);
	/* Refused: tokens longer than the master keeps, previous tokens not
	 * as long as the instance, more of them than it reads, or without an
	 * instance. */
	uint8_t longer[MASTER_INSTANCE_MAX + 1] = {0},
					     many[(MASTER_PREVIOUS_MAX + 1) * 16] = {0};
	mt.instance = longer;
	mt.instance_len = sizeof(longer);
	mt.previous_len = 0;
	cr_assert_eq(master__mount_seg(c, &mt, 7, NULL), -EINVAL);
	mt.instance = t4;
	mt.instance_len = 16;
	mt.previous_len = 17;
	cr_assert_eq(master__mount_seg(c, &mt, 7, NULL), -EINVAL);
	mt.previous = many;
	mt.previous_len = sizeof(many);
	cr_assert_eq(master__mount_seg(c, &mt, 7, NULL), -EINVAL);
	mt.instance_len = 0;
	mt.previous_len = 16;
	cr_assert_eq(master__mount_seg(c, &mt, 7, NULL), -EINVAL);
	cr_assert_eq(master__core_counters(c)->agents_restarted, 3);
}

Test(master_core, ttl_expiry)
{
	mount("s", "a", 64 * MiB, 0);
	const struct master_obj *o;
	struct master_put p = {
		.key = (const uint8_t *)"t", .klen = 1, .size = 10, .ttl_ms = 2000};
	must(master__put_start(c, &p, 0, &o));
	must(master__put_end(c, K("t"), NULL, 1000));
	cr_assert_eq(master__exist(c, K("t"), 2999), 1);
	cr_assert_eq(master__exist(c, K("t"), 3000), 0, "expired 2s after PutEnd");
	/* The sweep removes untouched ones. */
	p.key = (const uint8_t *)"u";
	must(master__put_start(c, &p, 0, &o));
	must(master__put_end(c, K("u"), NULL, 0));
	master__heartbeat(c, "a", 2000);
	master__tick(c, 2000);
	struct master_core_stats st;
	master__core_stats(c, &st);
	cr_assert_eq(st.objects, 0);
	cr_assert_eq(master__core_counters(c)->ttl_expired, 2);
}

/* A watermark round of thousands of objects is not done in one call: a
 * put pays for a few dozen evictions, a tick for some thousands, and the
 * round goes on, below the watermark too, until it has freed its share
 * (10% of 64 MiB in 4 KiB objects: 1,639). */
Test(master_core, a_large_eviction_round_goes_on_over_calls)
{
	mount("s", "a", 64 * MiB, 0);
	char key[32];
	int i = 0;
	for (; i < 14745; i++) { /* 90% of 16,384, rounded down */
		snprintf(key, sizeof(key), "k%d", i);
		put(key, 4096, 1, 0, 0);
	}
	const struct master_counters *n = master__core_counters(c);
	cr_assert_eq(n->evictions, 0, "at the watermark, not past it");
	snprintf(key, sizeof(key), "k%d", i++);
	put(key, 4096, 1, 0, 0);
	cr_assert_eq(n->eviction_rounds, 1);
	cr_assert_gt(n->evictions, 0);
	cr_assert_leq(n->evictions, 64, "a put pays for a few dozen");
	uint64_t after_put = n->evictions;
	snprintf(key, sizeof(key), "k%d", i++);
	put(key, 4096, 1, 0, 0); /* below the watermark now: the round goes on */
	cr_assert_gt(n->evictions, after_put);
	master__tick(c, 1);
	cr_assert_eq(n->evictions, 1639, "the round's share, in the tick");
	cr_assert_eq(n->eviction_rounds, 1);
	master__tick(c, 2);
	cr_assert_eq(n->evictions, 1639, "and no more");
}

/* A read earns one second chance: the eviction that reaches a read object
 * sends it to the back of the list unmarked, and the next one that
 * reaches it, with no read between, evicts it. */
Test(master_core, eviction_second_chance)
{
	mount("s", "a", 20 * MiB, 0);
	const struct master_obj *o;
	char key[32];
	/* 18 MiB = the watermark; each round frees 2 MiB. */
	for (int i = 0; i < 18; i++) {
		snprintf(key, sizeof(key), "k%d", i);
		put(key, MiB, 1, 0, 0);
	}
	must(master__get(c, K("k0"), 0, &o));
	must(master__get(c, K("k2"), 0, &o));
	/* Leases over at 5000: the round takes k1 and k3, the read ones stay
	 * and go to the back, after k17. */
	put("a", MiB, 1, 10000, 0);
	cr_assert_eq(master__exist(c, K("k0"), 10000), 1);
	cr_assert_eq(master__exist(c, K("k1"), 10000), 0);
	cr_assert_eq(master__exist(c, K("k2"), 10000), 1);
	cr_assert_eq(master__exist(c, K("k3"), 10000), 0);
	/* Every second put passes the watermark: seven more rounds take
	 * k4..k17, oldest first; k0 and k2, not read again, go in the eighth,
	 * before "a" and every later put. */
	for (int r = 0; r < 16; r++) {
		snprintf(key, sizeof(key), "n%d", r);
		put(key, MiB, 1, 10000, 0);
	}
	for (int i = 0; i < 18; i++) {
		snprintf(key, sizeof(key), "k%d", i);
		cr_assert_eq(master__exist(c, K(key), 10000), 0, "%s evicted", key);
	}
	cr_assert_eq(master__exist(c, K("a"), 10000), 1);
	cr_assert_eq(master__core_counters(c)->evictions, 18);
}

/* Ten 10 MiB segments' worth of 1 MiB objects: eviction keeps usage at or
 * under the watermark, evicts least recently read first, never a leased
 * object, and soft-pinned ones only when nothing else is left. */
Test(master_core, eviction_order_leases_pins)
{
	mount("s", "a", 100 * MiB, 0);
	char key[32];
	const struct master_obj *o;
	/* 10 pinned, then 80 plain: 90 MiB = the watermark, not above. */
	for (int i = 0; i < 10; i++) {
		snprintf(key, sizeof(key), "pin%d", i);
		struct master_put p = {.key = (const uint8_t *)key,
				       .klen = strlen(key),
				       .size = MiB,
				       .soft_pin = true};
		must(master__put_start(c, &p, 0, &o));
		must(master__put_end(c, K(key), NULL, 0));
	}
	for (int i = 0; i < 80; i++) {
		snprintf(key, sizeof(key), "k%d", i);
		put(key, MiB, 1, i, 0);
	}
	cr_assert_eq(master__core_counters(c)->evictions, 0);
	/* Read k0..k9 (now most recent; k0..k4 leased until 5100). */
	for (int i = 0; i < 10; i++) {
		snprintf(key, sizeof(key), "k%d", i);
		must(master__get(c, K(key), i < 5 ? 100 : 0, &o));
	}
	/* The 91st MiB passes the watermark: 10 MiB go, LRU first: k10..k19. */
	put("new", MiB, 1, 200, 0);
	cr_assert_eq(master__core_counters(c)->evictions, 10);
	for (int i = 0; i < 80; i++) {
		snprintf(key, sizeof(key), "k%d", i);
		cr_assert_eq(master__exist(c, K(key), 200), !(i >= 10 && i < 20), "%s", key);
	}
	struct master_core_stats st;
	master__core_stats(c, &st);
	cr_assert_leq(st.dram_used, 90 * MiB * 1.0);
	/* Lease everything plain and fill up: the unleased go, then pinned. */
	for (int i = 0; i < 80; i++) {
		snprintf(key, sizeof(key), "k%d", i);
		if (master__exist(c, K(key), 300) == 1)
			must(master__get(c, K(key), 300, &o));
	}
	must(master__get(c, K("new"), 300, &o));
	for (int i = 0; i < 10; i++) {
		snprintf(key, sizeof(key), "fill%d", i);
		put(key, MiB, 1, 300, 0);
	}
	/* fill* are unleased and newest; pinned are older but pinned: the
	 * fill objects go before any pinned one. */
	unsigned pinned_left = 0;
	for (int i = 0; i < 10; i++) {
		snprintf(key, sizeof(key), "pin%d", i);
		pinned_left += master__exist(c, K(key), 300) == 1;
	}
	cr_assert_eq(pinned_left, 10, "pinned survive while plain unleased objects exist");
	/* Now only leased plain objects and pinned ones: a put needs room,
	 * pinned go (oldest first), leased never. */
	for (int i = 0; i < 25; i++) {
		snprintf(key, sizeof(key), "more%d", i);
		put(key, MiB, 1, 301 + i, 0);
		must(master__get(c, K(key), 301 + i, &o)); /* leased at once */
	}
	for (int i = 0; i < 80; i++) {
		snprintf(key, sizeof(key), "k%d", i);
		if (i >= 10 && i < 20)
			continue;
		cr_assert_eq(master__exist(c, K(key), 400), 1, "leased %s survives", key);
	}
	pinned_left = 0;
	for (int i = 0; i < 10; i++) {
		snprintf(key, sizeof(key), "pin%d", i);
		pinned_left += master__exist(c, K(key), 400) == 1;
	}
	cr_assert_lt(pinned_left, 10, "pinned evicted last");
	master__core_stats(c, &st);
	cr_assert_leq(st.dram_used, 100 * MiB);
	/* Everything leased: no room, and NO_SPACE is the answer. */
	for (int i = 0; i < 10; i++) {
		snprintf(key, sizeof(key), "pin%d", i);
		if (master__exist(c, K(key), 400) == 1)
			must(master__get(c, K(key), 400, &o));
	}
	int rc = 0;
	for (int i = 0; i < 200 && rc == 0; i++) {
		snprintf(key, sizeof(key), "last%d", i);
		struct master_put p = {
			.key = (const uint8_t *)key, .klen = strlen(key), .size = MiB};
		rc = master__put_start(c, &p, 400, &o);
		if (rc == 0)
			must(master__get(c, K(key), 400, &o) == MC_EOBJECT_NOT_FOUND ? 0 : -1);
	}
	cr_assert_eq(rc, MC_ENO_SPACE);
	/* After the leases expire the space can be reclaimed. */
	put("after", MiB, 1, 10000, 0);
	cr_assert_gt(master__core_counters(c)->lease_waits, 0);
}

Test(master_core, object_larger_than_any_segment)
{
	mount("s", "a", 16 * MiB, 0);
	put("small", MiB, 1, 0, 0);
	put("huge", 17 * MiB, 1, 0, MC_ENO_SPACE);
	cr_assert_eq(master__exist(c, K("small"), 0), 1, "nothing evicted for a hopeless put");
}

Test(master_core, inventory_resync)
{
	must(master__mount(c, "s1", "a", MASTER_TIER_DRAM, 0, 64 * MiB, true, 0, NULL));
	must(master__mount(c, "s2", "b", MASTER_TIER_DRAM, 0, 64 * MiB, true, 0, NULL));
	cr_assert(master__heartbeat(c, "a", 0));
	/* Syncing segments take no placements. */
	put("x", 10, 1, 0, MC_ENO_SPACE);
	must(inv("a", "obj", "s1", 4096, 1000, 0));
	must(inv("b", "obj", "s2", 0, 1000, 0));
	cr_assert_eq(inv("b", "obj", "s2", 8192, 1000, 0), MC_EOBJECT_ALREADY_EXISTS,
		     "second replica on the same segment");
	cr_assert_eq(inv("a", "other", "s1", 4096 + 512, 10, 0), -EBUSY,
		     "overlaps obj's space");
	cr_assert_eq(inv("a", "diff", "s1", 0, 10, 0), 0);
	cr_assert_eq(inv("b", "diff", "s2", 8192, 11, 0), MC_EOBJECT_ALREADY_EXISTS,
		     "another size");
	cr_assert_eq(inv("a", "z", "s2", 0, 10, 0), MC_ESEGMENT_NOT_FOUND, "not a's segment");
	master__inventory_done(c, "a");
	master__inventory_done(c, "b");
	const struct master_obj *o;
	must(master__get(c, K("obj"), 0, &o));
	cr_assert_eq(o->nrep, 2);
	cr_assert_eq(o->size, 1000);
	cr_assert_eq(memcmp(master__obj_key(o), "obj", 3), 0, "key moved with the replicas");
	/* New placements avoid the reported space. */
	for (int i = 0; i < 50; i++) {
		char key[16];
		snprintf(key, sizeof(key), "n%d", i);
		const struct master_obj *n = put(key, 1000, 1, 0, 0);
		for (unsigned r = 0; r < n->nrep; r++) {
			if (n->rep[r].seg == master__seg_find(c, "s1")) {
				uint64_t off = n->rep[r].offset;
				cr_assert_not(off < 4096 + 1024 && off + 1024 > 4096,
					      "over obj");
				cr_assert_geq(off, 64, "over diff");
			}
		}
	}
}

Test(master_core, memory_per_object)
{
	mount("s", "a", 1ull << 40, 0);
	char key[64];
	const int n = 200000;
	for (int i = 0; i < n; i++) {
		int klen = snprintf(key, sizeof(key), "model/layer-%04d/block-%08d", i % 80,
				    i);
		const struct master_obj *o;
		struct master_put p = {
			.key = (const uint8_t *)key, .klen = (size_t)klen, .size = 4096};
		must(master__put_start(c, &p, 0, &o));
		must(master__put_end(c, (const uint8_t *)key, (size_t)klen, NULL, 0));
	}
	struct master_core_stats st;
	master__core_stats(c, &st);
	cr_assert_eq(st.objects, (uint64_t)n);
	double per = (double)(st.index_bytes - st.key_bytes) / n;
	cr_assert_lt(per, 200.0, "%.1f bytes per object plus the key", per);
	cr_assert_gt(per, 64.0, "the header alone is 64 bytes: accounting is real");
}

/* A forced removal of a leased object leaves the index at once, but its
 * space is not handed out again before the lease ends: a reader still
 * holding it reads the removed object's bytes, never another's. */
Test(master_core, forced_removal_of_a_leased_object_holds_its_space)
{
	mount("segA", "a", 1 * MiB, 0);
	const struct master_obj *o = NULL;
	put("old", 1 * MiB, 1, 0, 0);
	must(master__get(c, K("old"), 100, &o)); /* leased until 5100 */
	uint64_t off = o->rep[0].offset;
	must(master__remove(c, K("old"), true, 200));
	cr_assert_eq(master__exist(c, K("old"), 200), 0, "gone from the index at once");
	cr_assert_eq(master__core_counters(c)->quarantined, 1);
	put("new", 1 * MiB, 1, 300, MC_ENO_SPACE);
	master__tick(c, 5099);
	put("new", 1 * MiB, 1, 5099, MC_ENO_SPACE);
	master__tick(c, 5100);
	o = put("new", 1 * MiB, 1, 5100, 0);
	cr_assert_eq(o->rep[0].offset, off, "the space, free once the lease ended");
	/* Unleased: freed at once. */
	must(master__remove(c, K("new"), true, 5200));
	put("again", 1 * MiB, 1, 5200, 0);
	cr_assert_eq(master__core_counters(c)->quarantined, 1);
	/* A segment unmounted meanwhile takes its held space with it. */
	must(master__get(c, K("again"), 5300, &o));
	must(master__remove(c, K("again"), true, 5300));
	must(master__unmount(c, "segA", "a", NULL, NULL));
	mount("segA", "a", 1 * MiB, 5500);
	put("third", 1 * MiB, 1, 5500, 0);
	master__tick(c, 20000); /* (the old range is not freed into the new segment) */
	put("fourth", 1, 1, 20000, MC_ENO_SPACE);
}

static bool prefix_a(void *ud, const uint8_t *key, size_t klen)
{
	(void)ud;
	return klen >= 2 && memcmp(key, "a/", 2) == 0;
}

static bool match_none(void *ud, const uint8_t *key, size_t klen)
{
	(void)ud, (void)key, (void)klen;
	return false;
}

Test(master_core, remove_by_match)
{
	mount("segA", "a", 64 * MiB, 0);
	put("a/1", 10, 1, 0, 0);
	put("a/2", 10, 1, 0, 0);
	put("b/1", 10, 1, 0, 0);
	const struct master_obj *o = NULL;
	struct master_put p = {.key = (const uint8_t *)"a/pending", .klen = 9, .size = 10};
	must(master__put_start(c, &p, 0, &o));
	must(master__get(c, K("a/2"), 0, &o)); /* leased until 5000 */
	uint64_t removed, skipped;
	master__remove_match(c, prefix_a, NULL, false, 10, &removed, &skipped);
	cr_assert_eq(removed, 1);
	cr_assert_eq(skipped, 1, "the leased match");
	cr_assert_eq(master__exist(c, K("a/1"), 10), 0);
	cr_assert_eq(master__exist(c, K("a/2"), 10), 1);
	cr_assert_eq(master__exist(c, K("b/1"), 10), 1, "no match");
	must(master__put_end(c, K("a/pending"), NULL, 10)); /* never asked about */
	master__remove_match(c, prefix_a, NULL, true, 20, &removed, &skipped);
	cr_assert_eq(removed, 2, "forced, and the put sealed since");
	cr_assert_eq(skipped, 0);
}

/* A removal walk in steps, with puts and removals between them (the
 * master serves calls between its slices): the index adds no bucket
 * while it is open, so every object there at the start is looked at
 * once and the counts are exact; objects put meanwhile are still
 * there when they do not match; the index catches up after. */
Test(master_core, a_walk_in_steps_sees_each_object_once)
{
	mount("segA", "a", 1024 * MiB, 0);
	char key[32];
	for (int i = 0; i < 20000; i++) {
		snprintf(key, sizeof(key), "a/%d", i);
		put(key, 10, 1, 0, 0);
	}
	const struct master_obj *o = NULL;
	for (int i = 0; i < 100; i++) {
		snprintf(key, sizeof(key), "a/%d", i * 7);
		must(master__get(c, K(key), 0, &o)); /* leased until 5000 */
	}
	size_t slots = master__index_slots(&c->ix);
	struct master_walk w = {.match = prefix_a};
	master__walk_begin(c, &w);
	int steps = 0, added = 0, gone = 0;
	while (!master__walk_step(c, &w, 1000, 10)) {
		steps++;
		for (int i = 0; i < 500; i++, added++) {
			snprintf(key, sizeof(key), "b/%d", added);
			put(key, 10, 1, 10, 0);
		}
		snprintf(key, sizeof(key), "a/%d", 19999 - steps);
		gone += master__remove(c, K(key), false, 10) == 0; /* (or walked already) */
		cr_assert_eq(master__index_slots(&c->ix), slots, "no bucket added");
	}
	cr_assert_geq(steps, 19, "in steps of about 1,000");
	cr_assert_eq(w.skipped, 100, "each leased object counted once");
	cr_assert_eq(w.removed + gone, 20000 - 100, "each other one removed once");
	cr_assert_gt(gone, 0);
	for (int i = 0; i < added; i++) {
		snprintf(key, sizeof(key), "b/%d", i);
		cr_assert_eq(master__exist(c, K(key), 10), 1, "%s", key);
	}
	cr_assert(master__walk_step(c, &w, 1000, 10), "closed");

	/* A walk that removes nothing while 20,000 objects come: the index
	 * falls behind, and once it is closed catches up two buckets a put. */
	struct master_walk none = {.match = match_none};
	master__walk_begin(c, &none);
	for (int i = 0; i < 20000; i++) {
		snprintf(key, sizeof(key), "c/%d", i);
		put(key, 10, 1, 10, 0);
	}
	cr_assert_eq(master__index_slots(&c->ix), slots, "no bucket added");
	while (!master__walk_step(c, &none, 1000, 10))
		;
	cr_assert_eq(none.removed + none.skipped, 0);
	put("c/last", 10, 1, 10, 0);
	cr_assert_eq(master__index_slots(&c->ix), slots + 2);
	/* A walk given up holds nothing either. */
	master__walk_begin(c, &none);
	master__walk_abort(c, &none);
	put("c/after", 10, 1, 10, 0);
	cr_assert_eq(master__index_slots(&c->ix), slots + 4);
	/* Without puts, ticks catch up (not while a walk is open). */
	master__walk_begin(c, &none);
	master__tick(c, 20);
	cr_assert_eq(master__index_slots(&c->ix), slots + 4);
	master__walk_abort(c, &none);
	master__tick(c, 30);
	cr_assert_gt(master__index_slots(&c->ix), slots + 4);
	struct master_core_stats st;
	master__core_stats(c, &st);
	for (int t = 0; t < 20 && st.objects * 4 > master__index_slots(&c->ix) * 3; t++)
		master__tick(c, 40 + t);
	cr_assert_leq(st.objects * 4, master__index_slots(&c->ix) * 3,
		      "caught up: %zu buckets", master__index_slots(&c->ix));
}

Test(master_core, replica_clear_one_segment)
{
	mount("segA", "a", 64 * MiB, 0);
	mount("segB", "b", 64 * MiB, 0);
	put("k", 1 * MiB, 2, 0, 0);
	uint32_t a = master__seg_find(c, "segA"), b = master__seg_find(c, "segB");
	uint64_t free_b = master__alloc_free_bytes(master__seg(c, b)->alloc);
	cr_assert_eq(master__replica_clear(c, K("k"), b, 0), 0);
	cr_assert_eq(master__alloc_free_bytes(master__seg(c, b)->alloc), free_b + 1 * MiB,
		     "its space freed");
	cr_assert_eq(master__seg(c, b)->replicas, 0);
	const struct master_obj *o = NULL;
	must(master__get(c, K("k"), 0, &o));
	cr_assert_eq(o->nrep, 1, "one replica left");
	cr_assert_eq(o->rep[0].seg, a);
	cr_assert_eq(memcmp(master__obj_key(o), "k", 1), 0, "the key moved with it");
	cr_assert_eq(master__replica_clear(c, K("k"), b, 10), MC_EOBJECT_NOT_FOUND,
		     "none there");
	cr_assert_eq(master__replica_clear(c, K("k"), a, 10), MC_EOBJECT_HAS_LEASE);
	cr_assert_eq(master__replica_clear(c, K("k"), a, 5000), 0, "the last one");
	cr_assert_eq(master__exist(c, K("k"), 5000), 0, "the object went with it");
	cr_assert_eq(master__replica_clear(c, K("k"), a, 5000), MC_EOBJECT_NOT_FOUND);
	cr_assert_eq(master__replica_clear(c, K("k"), MASTER_NO_SEGMENT, 5000),
		     MC_EOBJECT_NOT_FOUND);
	cr_assert_eq(master__replica_clear(c, (const uint8_t *)"", 0, a, 5000), -EINVAL);
}

/* A new leader's first agent back with a full segment: while the master
 * holds eviction (it is settling), the capacity it knows is that one
 * segment's and no round may run; once it lets go, rounds work again. */
Test(master_core, eviction_waits_while_the_segments_come_back)
{
	master__core_hold_eviction(c, true);
	must(master__mount(c, "s1", "a", MASTER_TIER_DRAM, 0, 16 * MiB, true, 0, NULL));
	cr_assert(master__heartbeat(c, "a", 0));
	must(inv("a", "filler", "s1", 0, 16 * MiB, 0));
	master__inventory_done(c, "a");
	cr_assert(master__heartbeat(c, "a", 60000));
	master__tick(c, 60000);
	cr_assert_eq(master__exist(c, K("filler"), 60000), 1, "held: not evicted");
	cr_assert_eq(master__core_counters(c)->evictions, 0);
	master__core_hold_eviction(c, false);
	cr_assert(master__heartbeat(c, "a", 60000));
	master__tick(c, 60000);
	cr_assert_eq(master__exist(c, K("filler"), 60000), 0, "let go: the round runs");
	cr_assert_eq(master__core_counters(c)->evictions, 1);
}

/* A held loop (master__loop_held) moves the agents' --agent-ttl on by the
 * time it was held: an agent last heard at 0 lives past 10 s when the
 * loop was held for 8 of them, and expires once silent that long again. */
Test(master_core, a_held_loop_does_not_count_against_agents)
{
	mount("sa", "a", 64 * MiB, 0);
	put("k", 100, 1, 0, 0);
	cr_assert_eq(master__loop_held(c, 8000), 1, "one agent moved");
	master__tick(c, 17999);
	cr_assert_neq(master__seg_find(c, "sa"), MASTER_NO_SEGMENT, "a lives on");
	cr_assert_eq(master__exist(c, K("k"), 17999), 1);
	master__tick(c, 18000);
	cr_assert_eq(master__seg_find(c, "sa"), MASTER_NO_SEGMENT, "then expires");
	cr_assert_eq(master__core_counters(c)->agents_expired, 1);
}
