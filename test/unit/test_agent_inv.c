/*
 * test_agent_inv: the agent's segment mirror table (inv.c) — entries put
 * and replaced, removed only at their own offset, listings that forget
 * what neither they nor a change touched, and re-sync snapshots that keep
 * the newer of two entries over the same space (as copies).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/inv.h"

static struct agent_inv v;

static void setup(void)
{
	cr_assert_eq(agent__inv_init(&v), 0);
}

static void teardown(void)
{
	agent__inv_free(&v);
}

TestSuite(agent_inv, .init = setup, .fini = teardown);

#define K(s) (const uint8_t *)(s), strlen(s)

static void add(const char *key, uint64_t off, uint64_t size, uint32_t crc)
{
	struct agent_inv_rec r = {.offset = off, .size = size, .crc = crc, .has_crc = true};
	cr_assert_eq(agent__inv_add(&v, K(key), &r), 0);
}

static const struct agent_inv_entry *find(const char *key)
{
	struct agent_inv_entry **snap;
	size_t n;
	static struct agent_inv_entry copy;
	const struct agent_inv_entry *hit = NULL;
	/* Look through a snapshot of entries that do not overlap. */
	cr_assert_eq(agent__inv_snapshot(&v, &snap, &n), 0);
	for (size_t i = 0; i < n; i++) {
		if (snap[i]->klen == strlen(key) &&
		    memcmp(snap[i]->key, key, snap[i]->klen) == 0) {
			copy = *snap[i];
			hit = &copy;
		}
		free(snap[i]);
	}
	free(snap);
	return hit;
}

Test(agent_inv, put_replace_and_remove_at_an_offset)
{
	add("a", 0, 100, 1);
	add("b", 128, 100, 2);
	cr_assert_eq(v.n, 2);
	add("a", 256, 50, 3); /* the key placed again elsewhere */
	cr_assert_eq(v.n, 2);
	const struct agent_inv_entry *e = find("a");
	cr_assert_not_null(e);
	cr_assert_eq(e->rec.offset, 256);
	cr_assert_eq(e->rec.crc, 3);
	cr_assert_not(agent__inv_del_at(&v, K("a"), 0), "a change for the old place");
	cr_assert_eq(v.n, 2);
	cr_assert(agent__inv_del_at(&v, K("a"), 256));
	cr_assert_eq(v.n, 1);
	agent__inv_del(&v, K("b"));
	cr_assert_eq(v.n, 0);
	struct agent_inv_rec bad = {0};
	cr_assert_eq(agent__inv_add(&v, (const uint8_t *)"", 0, &bad), -EINVAL);
}

Test(agent_inv, a_listing_forgets_what_nothing_touched)
{
	add("stale", 0, 64, 1);
	add("kept", 64, 64, 2);
	agent__inv_listing_start(&v);
	add("kept", 64, 64, 2);     /* listed */
	add("changed", 128, 64, 3); /* a change during the listing */
	add("gone", 192, 64, 4);
	cr_assert(agent__inv_del_at(&v, K("gone"), 192)); /* and removed again */
	cr_assert_eq(agent__inv_listing_end(&v), 1, "only the stale entry goes");
	cr_assert_null(find("stale"));
	cr_assert_not_null(find("kept"));
	cr_assert_not_null(find("changed"));
	cr_assert_eq(v.n, 2);
	/* A new listing that sees nothing forgets everything. */
	agent__inv_listing_start(&v);
	cr_assert_eq(agent__inv_listing_end(&v), 2);
	cr_assert_eq(v.n, 0);
}

Test(agent_inv, snapshots_keep_the_newer_of_overlapping_entries)
{
	add("old", 0, 1000, 1);
	add("other", 4096, 10, 2);
	add("empty", 10, 0, 3);  /* takes no space */
	add("new", 512, 100, 4); /* over old's space: old's bytes are gone */
	struct agent_inv_entry **snap;
	size_t n;
	cr_assert_eq(agent__inv_snapshot(&v, &snap, &n), 0);
	cr_assert_eq(n, 3);
	cr_assert_eq(v.n, 3, "the older one is forgotten");
	for (size_t i = 0; i + 1 < n; i++)
		cr_assert_leq(snap[i]->rec.offset, snap[i + 1]->rec.offset, "offset order");
	for (size_t i = 0; i < n; i++) {
		cr_assert_neq(memcmp(snap[i]->key, "old", 3), 0);
		free(snap[i]);
	}
	free(snap);
	/* Copies: changing the table does not touch a snapshot. */
	cr_assert_eq(agent__inv_snapshot(&v, &snap, &n), 0);
	agent__inv_clear(&v);
	cr_assert_eq(snap[0]->klen, 5); /* "empty" at offset 10 comes first */
	for (size_t i = 0; i < n; i++)
		free(snap[i]);
	free(snap);
}

Test(agent_inv, many_entries)
{
	char key[32];
	for (int i = 0; i < 20000; i++) {
		snprintf(key, sizeof(key), "k%d", i);
		add(key, (uint64_t)i * 64, 64, (uint32_t)i);
	}
	cr_assert_eq(v.n, 20000);
	for (int i = 0; i < 20000; i += 2) {
		snprintf(key, sizeof(key), "k%d", i);
		cr_assert(agent__inv_del_at(&v, K(key), (uint64_t)i * 64));
	}
	cr_assert_eq(v.n, 10000);
	struct agent_inv_entry **snap;
	size_t n;
	cr_assert_eq(agent__inv_snapshot(&v, &snap, &n), 0);
	cr_assert_eq(n, 10000);
	for (size_t i = 0; i < n; i++)
		free(snap[i]);
	free(snap);
}

/* ------------------------------------------------------------ tables of their own */

static void add2(struct agent_inv *tab, const char *k, uint64_t off, uint64_t size)
{
	struct agent_inv_rec r = {.offset = off, .size = size};
	cr_assert_eq(agent__inv_add(tab, (const uint8_t *)k, strlen(k), &r), 0);
}

static void free_snap(struct agent_inv_entry **e, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(e[i]);
	free(e);
}

static bool has(struct agent_inv_entry **e, size_t n, const char *k)
{
	for (size_t i = 0; i < n; i++)
		if (e[i]->klen == strlen(k) && memcmp(e[i]->key, k, e[i]->klen) == 0)
			return true;
	return false;
}

Test(agent_inv_table, add_replace_delete)
{
	struct agent_inv t;
	cr_assert_eq(agent__inv_init(&t), 0);
	add2(&t, "a", 0, 64);
	add2(&t, "b", 64, 64);
	cr_assert_eq(t.n, 2);
	add2(&t, "a", 128, 64); /* replaced */
	cr_assert_eq(t.n, 2);
	agent__inv_del(&t, (const uint8_t *)"a", 1);
	agent__inv_del(&t, (const uint8_t *)"zz", 2);
	cr_assert_eq(t.n, 1);
	struct agent_inv_rec r = {.size = 1};
	cr_assert_eq(agent__inv_add(&t, (const uint8_t *)"", 0, &r), -EINVAL);
	agent__inv_free(&t);
}

Test(agent_inv_table, grows_and_keeps_everything)
{
	struct agent_inv t;
	cr_assert_eq(agent__inv_init(&t), 0);
	char k[32];
	for (int i = 0; i < 5000; i++) {
		snprintf(k, sizeof(k), "key-%d", i);
		add2(&t, k, (uint64_t)i * 64, 64);
	}
	cr_assert_eq(t.n, 5000);
	struct agent_inv_entry **e;
	size_t n;
	cr_assert_eq(agent__inv_snapshot(&t, &e, &n), 0);
	cr_assert_eq(n, 5000);
	for (size_t i = 1; i < n; i++)
		cr_assert_lt(e[i - 1]->rec.offset, e[i]->rec.offset, "sorted");
	free_snap(e, n);
	agent__inv_free(&t);
}

Test(agent_inv_table, snapshot_drops_overwritten_space)
{
	struct agent_inv t;
	cr_assert_eq(agent__inv_init(&t), 0);
	add2(&t, "old-long", 0, 1000); /* its space was reused by: */
	add2(&t, "new-1", 100, 64);
	add2(&t, "new-2", 500, 64);
	add2(&t, "keep", 2000, 64);
	add2(&t, "empty", 100, 0); /* takes no space */
	add2(&t, "older", 3000, 64);
	add2(&t, "newer-same", 3000, 64);
	add2(&t, "x-old", 4000, 128);
	add2(&t, "x-new", 4064, 128); /* overlaps x-old's tail */
	struct agent_inv_entry **e;
	size_t n;
	cr_assert_eq(agent__inv_snapshot(&t, &e, &n), 0);
	cr_assert(!has(e, n, "old-long"));
	cr_assert(has(e, n, "new-1"));
	cr_assert(has(e, n, "new-2"));
	cr_assert(has(e, n, "keep"));
	cr_assert(has(e, n, "empty"));
	cr_assert(!has(e, n, "older"));
	cr_assert(has(e, n, "newer-same"));
	cr_assert(!has(e, n, "x-old"));
	cr_assert(has(e, n, "x-new"));
	cr_assert_eq(n, 6);
	cr_assert_eq(t.n, 6, "dropped entries left the inventory");
	free_snap(e, n);
	/* A newer long entry drops older short ones it covers. */
	add2(&t, "big", 0, 10000);
	cr_assert_eq(agent__inv_snapshot(&t, &e, &n), 0);
	cr_assert_eq(n, 2, "big and the empty object");
	cr_assert(has(e, n, "big"));
	free_snap(e, n);
	agent__inv_free(&t);
}
