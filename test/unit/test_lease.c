/*
 * test_lease: the lease table alone (grant, IDs, TTL rules, expiry on the
 * leader's clock, promotion, renew, checkpoints) and with the store
 * (attachments on put/overwrite/delete, revoke deleting keys in one
 * revision).
 */
#include "meta/lease.h"
#include "test_mvcc_helpers.h"

static struct mvcc_store *s;
static struct lease_table *t;

static void setup(void)
{
	s = h_store();
	t = mvcc_leases(s);
}

static void teardown(void)
{
	mvcc_free(s);
}

TestSuite(lease, .init = setup, .fini = teardown);

static int64_t grant(int64_t id, int64_t ttl, uint64_t now)
{
	int64_t got;
	int rc = lease_grant(t, id, ttl, now, &got, NULL);
	cr_assert_eq(rc, 0, "grant: %s", mvcc_strerror(rc));
	return got;
}

static void put_lease(const char *k, int64_t lease)
{
	struct mvcc_result res;
	struct mvcc_op o = op_put_lease(k, "v", lease);
	h_apply(s, &o, &res);
	mvcc_result_free(&res);
}

static size_t nkeys(int64_t id)
{
	struct lease_ttl ttl;
	cr_assert_eq(lease_time_to_live(t, id, 0, false, &ttl), 0);
	cr_assert_null(ttl.keys);
	cr_assert_eq(ttl.nkeys, 0);
	return ttl.key_count;
}

Test(lease, grant_rules)
{
	cr_assert_eq(grant(0, 10, 0), 1);
	cr_assert_eq(grant(0, 10, 0), 2);
	cr_assert_eq(grant(5, 10, 0), 5);
	cr_assert_eq(grant(3, 10, 0), 3);
	cr_assert_eq(grant(0, 10, 0), 4, "auto IDs skip taken ones");
	cr_assert_eq(grant(0, 10, 0), 6);
	int64_t ttl;
	cr_assert_eq(lease_grant(t, 5, 10, 0, NULL, NULL), MVCC_ELEASE_EXISTS);
	cr_assert_eq(lease_grant(t, 9, LEASE_MAX_TTL_S + 1, 0, NULL, NULL),
		     MVCC_ELEASE_TTL_TOO_LARGE);
	cr_assert_eq(lease_grant(t, 9, LEASE_MAX_TTL_S, 0, NULL, &ttl), 0);
	cr_assert_eq(ttl, LEASE_MAX_TTL_S);
	cr_assert_eq(lease_count(t), 7);
	int64_t *ids;
	size_t n;
	cr_assert_eq(lease_list(t, &ids, &n), 0);
	cr_assert_eq(n, 7);
	int64_t want[] = {1, 2, 3, 4, 5, 6, 9};
	for (size_t i = 0; i < n; i++)
		cr_assert_eq(ids[i], want[i]);
	free(ids);

	/* The minimum TTL raises short grants. */
	mvcc_free(s);
	struct mvcc_options o = {.min_lease_ttl_s = 5};
	cr_assert_eq(mvcc_new(&o, &s), 0);
	t = mvcc_leases(s);
	cr_assert_eq(lease_grant(t, 0, 1, 0, NULL, &ttl), 0);
	cr_assert_eq(ttl, 5);
	cr_assert_eq(lease_grant(t, 0, 60, 0, NULL, &ttl), 0);
	cr_assert_eq(ttl, 60);
}

Test(lease, revoke_deletes_keys_in_one_revision)
{
	int64_t id = grant(0, 30, 0);
	put_lease("k1", id);    /* 2 */
	put_lease("k3", id);    /* 3 */
	put_lease("k2", id);    /* 4 */
	h_put(s, "other", "x"); /* 5 */
	cr_assert_eq(nkeys(id), 3);
	int64_t rev;
	cr_assert_eq(mvcc_lease_revoke(s, id, &rev), 0);
	cr_assert_eq(rev, 6);
	cr_assert_eq(mvcc_rev(s), 6);
	cr_assert_null(h_get(s, "k1"));
	cr_assert_null(h_get(s, "k2"));
	cr_assert_null(h_get(s, "k3"));
	cr_assert_str_eq(h_get(s, "other"), "x");
	cr_assert_not(lease_exists(t, id));
	/* The deletes are sub revisions of 6, in key order. */
	uint64_t pos;
	struct mvcc_event ev;
	cr_assert_eq(mvcc_hist_seek(s, 6, &pos), 0);
	for (int i = 0; i < 3; i++) {
		cr_assert_eq(mvcc_hist_event(s, pos + i, &ev), 0);
		cr_assert_eq(ev.type, MVCC_EVENT_DELETE);
		cr_assert_eq(ev.kv.mod_revision, 6);
		cr_assert_eq(ev.kv.key[1], '1' + i);
		cr_assert(ev.has_prev_kv);
		cr_assert_eq(ev.prev_kv.lease, id);
	}
	cr_assert_eq(mvcc_lease_revoke(s, id, &rev), MVCC_ELEASE_NOT_FOUND);
	/* A lease with no keys: revoked without a new revision. */
	id = grant(0, 30, 0);
	cr_assert_eq(mvcc_lease_revoke(s, id, &rev), 0);
	cr_assert_eq(rev, 6);
}

Test(lease, attach_detach)
{
	int64_t l1 = grant(0, 30, 0), l2 = grant(0, 30, 0);
	put_lease("a", l1);
	put_lease("b", l1);
	cr_assert_eq(nkeys(l1), 2);
	h_put(s, "a", "no lease"); /* overwrite without lease: detached */
	cr_assert_eq(nkeys(l1), 1);
	put_lease("b", l2); /* moved to l2 */
	cr_assert_eq(nkeys(l1), 0);
	cr_assert_eq(nkeys(l2), 1);
	put_lease("b", l2); /* same lease again */
	cr_assert_eq(nkeys(l2), 1);

	struct mvcc_result res;
	struct mvcc_op o = op_put("b", "kept");
	o.u.put.ignore_lease = true;
	h_apply(s, &o, &res);
	mvcc_result_free(&res);
	cr_assert_eq(nkeys(l2), 1);
	cr_assert_eq(h_kv(s, "b").lease, l2);

	put_lease("c", l2);
	h_del(s, "c", NULL); /* delete detaches */
	cr_assert_eq(nkeys(l2), 1);

	int64_t rev0 = mvcc_rev(s), rev;
	cr_assert_eq(mvcc_lease_revoke(s, l1, &rev), 0);
	cr_assert_eq(rev, rev0, "l1 has no keys left");
	cr_assert_str_eq(h_get(s, "a"), "no lease");
	cr_assert_eq(mvcc_lease_revoke(s, l2, &rev), 0);
	cr_assert_eq(rev, rev0 + 1);
	cr_assert_null(h_get(s, "b"));

	/* Keys listed by TimeToLive, in key order. */
	int64_t l3 = grant(0, 30, 0);
	put_lease("z", l3);
	put_lease("m", l3);
	struct lease_ttl ttl;
	cr_assert_eq(lease_time_to_live(t, l3, 0, true, &ttl), 0);
	cr_assert_eq(ttl.nkeys, 2);
	cr_assert_eq(ttl.key_count, 2);
	cr_assert_eq(ttl.keys[0].key[0], 'm');
	cr_assert_eq(ttl.keys[1].key[0], 'z');
	cr_assert_eq(ttl.granted_ttl_s, 30);
	cr_assert_eq(ttl.ttl_s, LEASE_TTL_FOREVER_S, "a follower has no expiry");
	lease_ttl_free(&ttl);
	/* Without keys (etcdctl lease timetolive ID): the count, no list. */
	cr_assert_eq(lease_time_to_live(t, l3, 0, false, &ttl), 0);
	cr_assert_eq(ttl.key_count, 2);
	cr_assert_eq(ttl.nkeys, 0);
	cr_assert_null(ttl.keys);
	lease_ttl_free(&ttl);
	cr_assert_eq(lease_time_to_live(t, 999, 0, true, &ttl), MVCC_ELEASE_NOT_FOUND);

	/* A txn that moves a key between leases and then fails leaves the
	 * attachments alone. */
	struct mvcc_op ops[] = {op_put_lease("m", "v", l1 + 100), op_put("q", "1")};
	struct mvcc_op tx = op_txn(NULL, 0, ops, 2, NULL, 0);
	cr_assert_eq(mvcc_apply(s, &tx, &res), MVCC_ELEASE_NOT_FOUND);
	cr_assert_eq(nkeys(l3), 2);
}

Test(lease, expiry_on_the_leader)
{
	int64_t a = grant(0, 10, 0); /* follower: no expiry yet */
	int64_t ids[8];
	cr_assert_eq(lease_expired(t, UINT64_MAX - 10, 0, ids, 8), 0);
	cr_assert_eq(lease_next_check_ms(t), UINT64_MAX);

	lease_promote(t, 1000, 0);
	cr_assert(lease_is_primary(t));
	int64_t b = grant(0, 5, 1000), c = grant(0, 5, 1000), d = grant(0, 20, 1000);
	/* a: 11000, b: 6000, c: 6000, d: 21000 */
	cr_assert_eq(lease_next_check_ms(t), 6000);
	cr_assert_eq(lease_expired(t, 5999, 3000, ids, 8), 0);
	cr_assert_eq(lease_expired(t, 6000, 3000, ids, 8), 2);
	cr_assert_eq(ids[0], b);
	cr_assert_eq(ids[1], c);
	/* In flight: not again before the retry interval... */
	cr_assert_eq(lease_expired(t, 8999, 3000, ids, 8), 0);
	cr_assert_eq(lease_next_check_ms(t), 9000);
	/* ...then again, and a keep-alive cannot save an expired lease. */
	cr_assert_eq(lease_renew(t, b, 8999, NULL, NULL), MVCC_ELEASE_EXPIRED);
	cr_assert_eq(lease_expired(t, 12000, 3000, ids, 1), 1);
	cr_assert_eq(ids[0], b, "earliest first, bounded by max");
	cr_assert_eq(lease_expired(t, 12000, 3000, ids, 8), 2);
	cr_assert_eq(ids[0], c); /* check 9000 */
	cr_assert_eq(ids[1], a); /* check 11000 */

	/* Renew pushes the expiry to now + TTL. */
	int64_t ttl;
	cr_assert_eq(lease_renew(t, d, 20000, &ttl, NULL), 0);
	cr_assert_eq(ttl, 20);
	struct lease_ttl info;
	cr_assert_eq(lease_time_to_live(t, d, 25500, false, &info), 0);
	cr_assert_eq(info.ttl_s, 14);                           /* 14.5 s left, truncated */
	cr_assert_eq(lease_expired(t, 39999, 3000, ids, 8), 3); /* b, c, a retried */
	cr_assert_eq(lease_renew(t, 12345, 0, NULL, NULL), MVCC_ELEASE_NOT_FOUND);

	lease_demote(t);
	cr_assert_eq(lease_renew(t, d, 20000, &ttl, NULL), MC_ENOT_LEADER);
	cr_assert_eq(lease_expired(t, UINT64_MAX - 10, 0, ids, 8), 0);
}

Test(lease, promote_extends)
{
	int64_t a = grant(0, 10, 0), b = grant(0, 100, 0);
	lease_checkpoint(t, b, 40);  /* logged remaining TTL */
	lease_checkpoint(t, 999, 5); /* unknown: ignored */
	lease_promote(t, 50000, 2000);
	struct lease_ttl info;
	cr_assert_eq(lease_time_to_live(t, a, 50000, false, &info), 0);
	cr_assert_eq(info.ttl_s, 12); /* full TTL + election time */
	cr_assert_eq(lease_time_to_live(t, b, 50000, false, &info), 0);
	cr_assert_eq(info.ttl_s, 42); /* checkpointed remaining + election time */
	cr_assert_eq(info.remaining_checkpoint_s, 40);
	int64_t ids[4];
	cr_assert_eq(lease_expired(t, 61999, 0, ids, 4), 0);
	cr_assert_eq(lease_expired(t, 62000, 0, ids, 4), 1);
	cr_assert_eq(ids[0], a);
	bool clear;
	cr_assert_eq(lease_renew(t, b, 60000, NULL, &clear), 0);
	cr_assert(clear, "renew asks to clear the checkpoint");
	lease_checkpoint(t, b, 0);
	cr_assert_eq(lease_renew(t, b, 60000, NULL, &clear), 0);
	cr_assert_not(clear);
	cr_assert_eq(lease_time_to_live(t, b, 60000, false, &info), 0);
	cr_assert_eq(info.ttl_s, 100);
}

/* Two tables fed the same log agree on everything, whatever the clocks. */
Test(lease, determinism)
{
	struct mvcc_store *s2 = h_store();
	struct lease_table *t2 = mvcc_leases(s2);
	lease_promote(t2, 777, 5000); /* t2 is a leader, t a follower */
	for (int i = 0; i < 50; i++) {
		int64_t id1, id2;
		int64_t want = (i % 7 == 0) ? 100 + i : 0;
		cr_assert_eq(lease_grant(t, want, 10 + i, 0, &id1, NULL), 0);
		cr_assert_eq(lease_grant(t2, want, 10 + i, 123456, &id2, NULL), 0);
		cr_assert_eq(id1, id2);
	}
	struct h_sink a = h_snapshot(s), b = h_snapshot(s2);
	cr_assert_eq(a.len, b.len);
	cr_assert(!memcmp(a.data, b.data, a.len));
	free(a.data);
	free(b.data);
	mvcc_free(s2);
}
