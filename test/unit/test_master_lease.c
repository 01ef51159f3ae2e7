/*
 * test_master_lease: put leases in the master's pure core under a fake
 * clock — space leased to a segment's owner is counted as used and never
 * placed twice, commits seal objects only into space leased in the
 * current epoch, refused commits and releases give the space back, a
 * mount (re-sync, restart) or the owner's expiry takes the lease back
 * without harming what was committed, and committed objects are removed
 * and evicted like any other. Remote leases: another agent's space on a
 * segment, committed only by it, only in time, capped, taken back when
 * their time is over.
 */
#include "test_master_util.h"

TestSuite(master_lease, .init = setup, .fini = teardown);

static void mount(const char *name, const char *agent, uint64_t size, bool resync)
{
	must(master__mount(c, name, agent, MASTER_TIER_DRAM, 0x10000000, size, resync, 0,
			   NULL));
}

static const struct master_seg *seg(const char *name)
{
	uint32_t id = master__seg_find(c, name);
	cr_assert_neq(id, MASTER_NO_SEGMENT, "%s mounted", name);
	return master__seg(c, id);
}

static uint64_t epoch(const char *name)
{
	return seg(name)->lease_epoch;
}

static uint64_t used(void)
{
	struct master_core_stats st;
	master__core_stats(c, &st);
	return st.dram_used;
}

/* Lease want bytes of name (owned by agent) in its current epoch. */
static void grant(const char *name, const char *agent, uint64_t want, uint64_t *off,
		  uint64_t *len)
{
	must(master__lease_grant(c, agent, name, epoch(name), want, off, len));
}

static int commit(const char *name, const char *agent, uint64_t ep, const char *key,
		  uint64_t off, uint64_t size, uint64_t now)
{
	struct master_commit it = {.key = (const uint8_t *)key,
				   .klen = strlen(key),
				   .offset = off,
				   .size = size,
				   .has_crc = true,
				   .crc = 0x1234};
	return master__commit(c, agent, name, ep, &it, now);
}

Test(master_lease, grant_counts_as_used_and_is_never_placed)
{
	mount("s", "a", 64 * MiB, false);
	uint64_t off, len;
	cr_assert_eq(master__lease_grant(c, "b", "s", epoch("s"), MiB, &off, &len), -EACCES,
		     "another agent's segment");
	cr_assert_eq(master__lease_grant(c, "a", "nope", 1, MiB, &off, &len),
		     MC_ESEGMENT_NOT_FOUND);
	cr_assert_eq(master__lease_grant(c, "a", "s", epoch("s") + 1, MiB, &off, &len),
		     MC_EINVALID_REPLICA, "not the segment's epoch");
	cr_assert_eq(used(), 0);
	grant("s", "a", 64 * MiB, &off, &len);
	cr_assert_eq(len, 8 * MiB, "at most an eighth of the segment");
	cr_assert_eq(seg("s")->leased, len);
	cr_assert_eq(used(), len, "leased space is used space");
	uint64_t off2, len2;
	grant("s", "a", MiB, &off2, &len2);
	cr_assert_eq(len2, 0, "the eighth is leased already");
	cr_assert_eq(master__core_counters(c)->lease_granted_bytes, len);
	/* Fill the rest with PutStart placements: none inside the lease. */
	const struct master_obj *o;
	int rc = 0;
	unsigned n = 0;
	for (; rc == 0; n++) {
		char key[16];
		snprintf(key, sizeof(key), "p%u", n);
		struct master_put p = {
			.key = (const uint8_t *)key, .klen = strlen(key), .size = MiB};
		rc = master__put_start(c, &p, 0, &o);
		if (rc == 0) {
			uint64_t at = o->rep[0].offset;
			cr_assert(at + MiB <= off || at >= off + len,
				  "%s placed in leased space", key);
			must(master__get(c, K(key), 0, &o) == MC_EOBJECT_NOT_FOUND ? 0 : -1);
		}
	}
	cr_assert_eq(rc, MC_ENO_SPACE, "pending puts cannot be evicted");
	cr_assert_eq(n - 1, 56, "all but the leased 8 MiB placed");
}

Test(master_lease, commit_seals_only_leased_space)
{
	mount("s", "a", 64 * MiB, false);
	uint64_t off, len;
	grant("s", "a", MiB, &off, &len);
	cr_assert_eq(len, MiB);
	uint64_t ep = epoch("s");
	cr_assert_eq(commit("s", "b", ep, "x", off, 100, 0), MC_EINVALID_REPLICA,
		     "another agent, without a remote lease there");
	cr_assert_eq(commit("s", "a", ep + 1, "x", off, 100, 0), MC_EINVALID_REPLICA);
	cr_assert_eq(commit("s", "a", ep, "x", off + len, 100, 0), MC_EINVALID_REPLICA,
		     "beyond the lease");
	cr_assert_eq(commit("s", "a", ep, "x", off + len - 64, 128, 0), MC_EINVALID_REPLICA,
		     "across the lease's end");
	cr_assert_eq(commit("s", "a", ep, "x", 64 * MiB - 64, 4096, 0), MC_EINVALID_REPLICA,
		     "beyond the segment");
	cr_assert_eq(master__exist(c, K("x"), 0), 0, "nothing sealed by refusals");
	cr_assert_eq(seg("s")->leased, MiB, "refusals with -703 change nothing");

	must(commit("s", "a", ep, "x", off, 100, 0));
	const struct master_obj *o;
	must(master__get(c, K("x"), 0, &o));
	cr_assert_eq(o->nrep, 1);
	cr_assert_eq(o->size, 100);
	cr_assert_eq(o->rep[0].offset, off);
	cr_assert_eq(o->rep[0].state, MASTER_REP_COMPLETE);
	cr_assert_eq(o->crc, 0x1234);
	cr_assert_eq(seg("s")->leased, MiB - 128, "100 bytes take two granules");
	cr_assert_eq(used(), MiB, "committed + leased");
	cr_assert_eq(seg("s")->replicas, 1);
	cr_assert_eq(commit("s", "a", ep, "y", off, 100, 0), MC_EINVALID_REPLICA,
		     "the same bytes twice");

	/* An existing key: refused, and its space goes back to free space. */
	cr_assert_eq(commit("s", "a", ep, "x", off + 128, 100, 0), MC_EOBJECT_ALREADY_EXISTS);
	cr_assert_eq(seg("s")->leased, MiB - 256);
	cr_assert_eq(used(), MiB - 128);
	cr_assert_eq(commit("s", "a", ep, "z", off + 128, 100, 0), MC_EINVALID_REPLICA,
		     "freed, not leased any more");
	/* A bad key: refused and freed too. */
	char big[MASTER_MAX_KEY_BYTES + 2];
	memset(big, 'k', sizeof(big) - 1);
	big[sizeof(big) - 1] = 0;
	cr_assert_eq(commit("s", "a", ep, big, off + 256, 10, 0), -EINVAL);
	cr_assert_eq(seg("s")->leased, MiB - 320);
	/* An empty value takes no space. */
	must(commit("s", "a", ep, "empty", 0, 0, 0));
	cr_assert_eq(master__exist(c, K("empty"), 0), 1);
	cr_assert_eq(seg("s")->leased, MiB - 320);
	/* A pending PutStart key is an existing key. */
	struct master_put p = {.key = (const uint8_t *)"pend", .klen = 4, .size = 10};
	must(master__put_start(c, &p, 0, &o));
	cr_assert_eq(commit("s", "a", ep, "pend", off + 320, 64, 0),
		     MC_EOBJECT_ALREADY_EXISTS);
	cr_assert_eq(master__core_counters(c)->commits, 2);
	cr_assert_geq(master__core_counters(c)->commit_refusals, 9);

	/* Removal frees committed space like any other (once no reader's
	 * lease holds it: x was read above). */
	uint64_t before = used();
	must(master__remove(c, K("x"), true, 0));
	cr_assert_eq(used(), before, "held while leased");
	master__tick(c, 6000); /* (the lease of a get at 0 ended at 5000) */
	cr_assert_eq(used(), before - 128);
}

Test(master_lease, release_gives_back_only_leased_space)
{
	mount("s", "a", 64 * MiB, false);
	uint64_t off, len;
	grant("s", "a", MiB, &off, &len);
	uint64_t ep = epoch("s");
	must(commit("s", "a", ep, "x", off, 4096, 0));
	cr_assert_eq(master__lease_release(c, "a", "s", ep, off, 4096), 0, "committed");
	cr_assert_eq(master__lease_release(c, "b", "s", ep, off + 4096, 4096), 0, "not b's");
	cr_assert_eq(master__lease_release(c, "a", "s", ep + 1, off + 4096, 4096), 0,
		     "another epoch");
	cr_assert_eq(master__lease_release(c, "a", "s", ep, off + len - 64, 128), 0,
		     "beyond the lease");
	cr_assert_eq(master__lease_release(c, "a", "s", ep, UINT64_MAX - 64, 128), 0,
		     "overflow");
	cr_assert_eq(master__lease_release(c, "a", "s", ep, off + 4096, 4096), 4096);
	cr_assert_eq(master__lease_release(c, "a", "s", ep, off + 4096, 4096), 0, "twice");
	cr_assert_eq(seg("s")->leased, MiB - 8192);
	cr_assert_eq(used(), MiB - 4096);
	cr_assert_eq(commit("s", "a", ep, "y", off + 4096, 10, 0), MC_EINVALID_REPLICA,
		     "released space cannot be committed");
	cr_assert_eq(master__lease_release(c, "a", "s", ep, off + 8192, len - 8192),
		     len - 8192);
	cr_assert_eq(seg("s")->leased, 0);
	cr_assert_eq(used(), 4096);
	cr_assert_eq(master__core_counters(c)->lease_released_bytes, len - 4096);
}

Test(master_lease, a_mount_takes_the_lease_back)
{
	mount("s", "a", 64 * MiB, false);
	uint64_t off, len;
	grant("s", "a", 4 * MiB, &off, &len);
	uint64_t ep1 = epoch("s");
	must(commit("s", "a", ep1, "kept", off, MiB, 0));
	/* A re-sync mount (a new master view, say): the lease is gone, the
	 * committed object stays, and no lease while re-syncing. */
	mount("s", "a", 64 * MiB, true);
	uint64_t ep2 = epoch("s");
	cr_assert_neq(ep2, ep1);
	cr_assert_eq(seg("s")->leased, 0);
	cr_assert_eq(used(), MiB);
	cr_assert_eq(master__exist(c, K("kept"), 0), 1);
	cr_assert_eq(commit("s", "a", ep1, "late", off + MiB, 100, 0), MC_EINVALID_REPLICA,
		     "a commit of the old epoch");
	cr_assert_eq(master__lease_release(c, "a", "s", ep1, off + MiB, MiB), 0);
	cr_assert_eq(master__lease_grant(c, "a", "s", ep1, MiB, &off, &len),
		     MC_EINVALID_REPLICA);
	grant("s", "a", MiB, &off, &len);
	cr_assert_eq(len, 0, "nothing while re-syncing");
	master__inventory_done(c, "a");
	grant("s", "a", MiB, &off, &len);
	cr_assert_eq(len, MiB);
	const struct master_obj *o;
	must(master__get(c, K("kept"), 0, &o));
	cr_assert(off >= o->rep[0].offset + MiB || off + len <= o->rep[0].offset,
		  "the new lease avoids the committed object");
	/* A restarted agent (not re-sync): everything goes, the lease too. */
	mount("s", "a", 64 * MiB, false);
	cr_assert_neq(epoch("s"), ep2);
	cr_assert_eq(seg("s")->leased, 0);
	cr_assert_eq(used(), 0);
	cr_assert_eq(master__exist(c, K("kept"), 0), 0);
	/* A stepped-down leader forgets everything; lease allocators too.
	 * A new leader's epochs are above any earlier leader's (a commit
	 * resent to it never matches). */
	grant("s", "a", MiB, &off, &len);
	uint64_t ep3 = epoch("s");
	master__core_reset(c);
	master__ev_seq_floor(c, 1ull << 40);
	mount("s", "a", 64 * MiB, true);
	cr_assert_gt(epoch("s"), 1ull << 40);
	cr_assert_eq(used(), 0);
	master__inventory_done(c, "a");
	cr_assert_eq(commit("s", "a", ep3, "late", off, 100, 0), MC_EINVALID_REPLICA);
}

Test(master_lease, an_expired_owner_loses_its_lease)
{
	mount("sa", "a", 64 * MiB, false);
	mount("sb", "b", 64 * MiB, false);
	uint64_t off, len;
	grant("sa", "a", MiB, &off, &len);
	grant("sb", "b", MiB, &off, &len);
	must(commit("sb", "b", epoch("sb"), "onb", off, 1000, 0));
	cr_assert_eq(used(), 2 * MiB);
	for (uint64_t t = 1000; t <= 10000; t += 1000) {
		cr_assert(master__heartbeat(c, "b", t));
		master__tick(c, t);
	}
	cr_assert_eq(master__seg_find(c, "sa"), MASTER_NO_SEGMENT);
	cr_assert_eq(used(), MiB, "a's leased space is gone with its segment");
	cr_assert_eq(master__exist(c, K("onb"), 10000), 1);
	/* a comes back: a new segment, a new epoch. */
	mount("sa", "a", 64 * MiB, true);
	cr_assert_eq(seg("sa")->leased, 0);
}

Test(master_lease, leases_stop_at_the_watermark_and_commits_are_evicted)
{
	mount("s", "a", 64 * MiB, false);
	char key[32];
	unsigned n = 0;
	/* Commit 1 MiB objects through leases: grants stop at the watermark
	 * (57.6 MiB of 64), a lease never evicts. */
	uint64_t off, len;
	for (;;) {
		grant("s", "a", 4 * MiB, &off, &len);
		if (len == 0)
			break;
		cr_assert_leq(used(), (uint64_t)(0.9 * 64 * MiB),
			      "a grant stays under the watermark");
		for (uint64_t at = off; at + MiB <= off + len; at += MiB) {
			snprintf(key, sizeof(key), "c%u", n++);
			must(commit("s", "a", epoch("s"), key, at, MiB, n));
		}
		uint64_t left = seg("s")->leased; /* the tail of a short grant */
		if (left)
			cr_assert_eq(master__lease_release(c, "a", "s", epoch("s"),
							   off + len - left, left),
				     left);
		if (len < MiB)
			break;
	}
	cr_assert_geq(n, 50, "committed up to the watermark");
	cr_assert_eq(master__core_counters(c)->evictions, 0, "no lease evicted anything");
	/* A PutStart past the watermark evicts committed objects, oldest first. */
	for (int i = 0; i < 10; i++) {
		snprintf(key, sizeof(key), "p%d", i);
		struct master_put p = {
			.key = (const uint8_t *)key, .klen = strlen(key), .size = MiB};
		const struct master_obj *o;
		must(master__put_start(c, &p, 1000 + i, &o));
		must(master__put_end(c, K(key), NULL, 1000 + i));
	}
	cr_assert_gt(master__core_counters(c)->evictions, 0);
	cr_assert_eq(master__exist(c, K("c0"), 2000), 0, "the oldest commit went");
	snprintf(key, sizeof(key), "c%u", n - 1);
	cr_assert_eq(master__exist(c, K(key), 2000), 1, "the newest stays");
	cr_assert_leq(used(), (uint64_t)(0.9 * 64 * MiB));
	/* Eviction made room below the watermark: leases again. */
	grant("s", "a", MiB, &off, &len);
	cr_assert_eq(len, MiB);
}

Test(master_lease, remote_leases_are_the_holders_for_a_time)
{
	mount("s", "a", 64 * MiB, false);
	mount("t", "b", 64 * MiB, false);
	struct master_rlease_grant g;
	cr_assert_eq(master__rlease_grant(c, "a", "s", 0, MiB, 0, &g), -EINVAL,
		     "the owner's own");
	cr_assert_eq(master__rlease_grant(c, "b", "nope", 0, MiB, 0, &g),
		     MC_ESEGMENT_NOT_FOUND);
	cr_assert_eq(master__rlease_grant(c, "b", "s", epoch("s") + 1, MiB, 0, &g),
		     MC_EINVALID_REPLICA, "an earlier epoch");
	must(master__rlease_grant(c, "b", "s", 0, MiB, 0, &g));
	cr_assert_eq(g.length, MiB);
	cr_assert_eq(g.epoch, epoch("s"));
	cr_assert_eq(g.base, 0x10000000);
	cr_assert_eq(g.ttl_ms, 30000, "the put timeout");
	cr_assert_eq(seg("s")->leased, MiB);
	cr_assert_eq(used(), MiB, "counted as used");
	uint64_t ep = g.epoch, off = g.offset;
	cr_assert_eq(commit("s", "c", ep, "x", off, 100, 0), MC_EINVALID_REPLICA, "a third's");
	cr_assert_eq(commit("s", "b", ep, "x", off + MiB, 100, 0), MC_EINVALID_REPLICA,
		     "beyond it");
	cr_assert_eq(commit("s", "b", ep, "x", off, 0, 0), MC_EINVALID_REPLICA,
		     "an empty value has no space to be in");
	must(commit("s", "b", ep, "x", off, 100, 10));
	const struct master_obj *o;
	must(master__get(c, K("x"), 10, &o));
	cr_assert_eq(o->rep[0].seg, master__seg_find(c, "s"), "in s");
	cr_assert_eq(o->rep[0].offset, off);
	cr_assert_eq(seg("s")->leased, MiB - 128);
	cr_assert_eq(commit("s", "b", ep, "y", off, 100, 10), MC_EINVALID_REPLICA, "twice");
	/* The owner's own lease is not held back by the remote one. */
	uint64_t o2, l2;
	grant("s", "a", 8 * MiB, &o2, &l2);
	cr_assert_eq(l2, 8 * MiB);
	/* One holder at most a 32nd of the segment (2 MiB here). */
	must(master__rlease_grant(c, "b", "s", 0, 4 * MiB, 20, &g));
	cr_assert_eq(g.length, MiB + 128, "up to the cap: what is not committed counts");
	must(master__rlease_grant(c, "b", "s", 0, MiB, 20, &g));
	cr_assert_eq(g.length, 0, "none past the cap");
	/* Late: refused, and the space goes back at the grant's end. */
	cr_assert_eq(commit("s", "b", ep, "late", off + 128, 100, 30000), MC_EINVALID_REPLICA,
		     "after the lease's time");
	uint64_t before = used();
	master__heartbeat(c, "a", 29000);
	master__heartbeat(c, "b", 29000);
	master__tick(c, 30000);
	cr_assert_eq(used(), before - (MiB - 128),
		     "the first grant's rest went back: %lu -> %lu", (unsigned long)before,
		     (unsigned long)used());
	master__tick(c, 30020);
	cr_assert_eq(used(), before - (MiB - 128) - (MiB + 128), "the second's too");
	cr_assert_eq(seg("s")->leased, 8 * MiB, "the owner's lease is left");
	cr_assert_eq(master__exist(c, K("x"), 30020), 1, "committed objects stay");
	/* A mount takes remote leases back at once; commits are refused. */
	master__heartbeat(c, "a", 39000);
	master__heartbeat(c, "b", 39000);
	must(master__rlease_grant(c, "b", "s", 0, MiB, 40000, &g));
	mount("s", "a", 64 * MiB, false);
	master__heartbeat(c, "a", 40000);
	cr_assert_eq(commit("s", "b", g.epoch, "y", g.offset, 100, 40001),
		     MC_EINVALID_REPLICA);
	master__tick(c, 40001);
	cr_assert_eq(seg("s")->leased, 0);
}
