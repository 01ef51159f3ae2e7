/*
 * test_master_index: the master core's object index (src/master/index.c)
 * on its own: lookups across doublings, keys crowding one slot into
 * overflow groups, two keys with the same slot and tag, deletes (entries
 * emptied and filled again), walks that delete as they go, a replica
 * added to an object in an overflow group, the prefetch stages, clear.
 * Keys with a chosen slot or tag are found by trying names in order.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "common/util.h"
#include "master/core_int.h"

#define MIN_GROUPS 256u /* index.c's */
#define TAG(h) ((h) >> MASTER_TAG_SHIFT)

static struct master_index ix;

static void setup(void)
{
	cr_assert_eq(master__index_init(&ix), 0);
}

static void teardown(void)
{
	master__index_free(&ix);
}

TestSuite(master_index, .init = setup, .fini = teardown);

static uint64_t hash_of(const char *k)
{
	return mc_hash64(k, strlen(k));
}

static struct master_obj *add(const char *k)
{
	struct master_obj *o = master__obj_new((const uint8_t *)k, strlen(k), 1);
	cr_assert_not_null(o);
	o->size = strlen(k);
	cr_assert_eq(master__index_link(&ix, o), 0);
	return o;
}

static struct master_obj *find(const char *k)
{
	return master__index_find(&ix, (const uint8_t *)k, strlen(k));
}

/* "<prefix><8 hex digits of i>" (snprintf is too slow for the millions of
 * names a slot and a tag take to find). */
static void name(char *out, const char *prefix, unsigned i)
{
	size_t n = strlen(prefix);
	memcpy(out, prefix, n);
	for (int d = 7; d >= 0; d--, i >>= 4)
		out[n + (size_t)d] = "0123456789abcdef"[i & 15];
	out[n + 8] = 0;
}

/* The first name from *next on whose hash has (h & mask) == want. */
static void key_with(char *out, const char *prefix, uint64_t mask, uint64_t want,
		     unsigned *next)
{
	for (;; (*next)++) {
		name(out, prefix, *next);
		if ((hash_of(out) & mask) == want) {
			(*next)++;
			return;
		}
	}
}

/* Objects of every slot, each once; with del, each is deleted as the walk
 * meets it. */
static uint64_t walk(bool del)
{
	uint64_t n = 0;
	for (size_t b = 0; b < master__index_slots(&ix); b++) {
		struct master_index_pos pos = {0};
		struct master_obj *o;
		while ((o = master__index_slot_next(&ix, b, &pos))) {
			cr_assert_eq(mc_hash64(master__obj_key(o), o->klen) &
					     (master__index_slots(&ix) - 1),
				     b, "an object in its own slot");
			n++;
			if (del)
				master__index_del(&ix, o);
		}
		cr_assert_null(master__index_slot_next(&ix, b, &pos),
			       "past the end stays there");
	}
	return n;
}

Test(master_index, lookups_across_doublings)
{
	char k[32];
	const unsigned n = 20000; /* 256 slots double to 4096 */
	for (unsigned i = 0; i < n; i++) {
		snprintf(k, sizeof(k), "obj/%u", i);
		add(k);
	}
	cr_assert_geq(master__index_slots(&ix), (size_t)n / 6);
	cr_assert_eq(ix.nobjs, n);
	for (unsigned i = 0; i < n; i++) {
		snprintf(k, sizeof(k), "obj/%u", i);
		struct master_obj *o = find(k);
		cr_assert_not_null(o, "%s", k);
		cr_assert_eq(o->size, strlen(k));
	}
	cr_assert_null(find("obj/x"));
	cr_assert_null(find("obj/20000"));
	/* Every other one goes; the rest stay found. */
	for (unsigned i = 0; i < n; i += 2) {
		snprintf(k, sizeof(k), "obj/%u", i);
		master__index_del(&ix, find(k));
	}
	for (unsigned i = 0; i < n; i++) {
		snprintf(k, sizeof(k), "obj/%u", i);
		cr_assert_eq(find(k) != NULL, i % 2 == 1, "%s", k);
	}
	cr_assert_eq(walk(false), n / 2);
	struct master_core_stats st;
	master__index_stats(&ix, &st);
	cr_assert_eq(st.objects, n / 2);
	cr_assert_geq(st.index_bytes,
		      ix.obj_bytes + master__index_slots(&ix) * sizeof(struct master_group));
}

/* 20 keys of one slot: 7 in its group, the rest in two overflow groups.
 * Deletes empty entries anywhere in the chain; inserts fill them again
 * before a group is added. */
Test(master_index, one_slot_overflows)
{
	char keys[20][32];
	unsigned next = 0;
	for (int i = 0; i < 20; i++) {
		key_with(keys[i], "c/", MIN_GROUPS - 1, 5, &next);
		add(keys[i]);
	}
	cr_assert_eq(master__index_slots(&ix), MIN_GROUPS, "no doubling yet");
	cr_assert_eq(ix.nmore, 2);
	cr_assert_gt(ix.more_bytes, 0);
	for (int i = 0; i < 20; i++)
		cr_assert_not_null(find(keys[i]), "%s", keys[i]);
	/* Out of the main group (2), the first overflow group (9) and the
	 * last entry (19). */
	int gone[] = {2, 9, 19};
	for (size_t j = 0; j < MC_ARRAY_LEN(gone); j++)
		master__index_del(&ix, find(keys[gone[j]]));
	for (int i = 0; i < 20; i++)
		cr_assert_eq(find(keys[i]) != NULL, i != 2 && i != 9 && i != 19, "%s",
			     keys[i]);
	cr_assert_eq(ix.nmore, 2, "emptied entries keep their groups");
	/* Four more fill the three holes and the last free entry (7 + 7 + 7
	 * entries): no group added. */
	char more[5][32];
	for (int i = 0; i < 4; i++) {
		key_with(more[i], "c/", MIN_GROUPS - 1, 5, &next);
		add(more[i]);
	}
	cr_assert_eq(ix.nmore, 2);
	/* A fifth needs a third overflow group. */
	key_with(more[4], "c/", MIN_GROUPS - 1, 5, &next);
	add(more[4]);
	cr_assert_eq(ix.nmore, 3);
	for (int i = 0; i < 5; i++)
		cr_assert_not_null(find(more[i]));
	cr_assert_eq(walk(false), 22);
	/* A walk may delete what it met. */
	cr_assert_eq(walk(true), 22);
	cr_assert_eq(ix.nobjs, 0);
	for (int i = 0; i < 20; i++)
		cr_assert_null(find(keys[i]));
}

/* Two keys with the same slot and the same tag: the key itself decides. */
Test(master_index, same_slot_same_tag)
{
	char a[32], b[32];
	unsigned next = 0;
	/* The slot's bits and the tag: 8 + 16 bits to match. */
	uint64_t mask = (uint64_t)(MIN_GROUPS - 1) | ~((UINT64_C(1) << MASTER_TAG_SHIFT) - 1);
	name(a, "t/", next++);
	uint64_t want = hash_of(a) & mask;
	key_with(b, "t/", mask, want, &next);
	cr_assert_eq(TAG(hash_of(a)), TAG(hash_of(b)));
	cr_assert_eq(strlen(a), strlen(b), "the same length: the bytes compare");
	struct master_obj *oa = add(a), *ob = add(b);
	cr_assert_eq(find(a), oa);
	cr_assert_eq(find(b), ob);
	master__index_del(&ix, oa);
	cr_assert_null(find(a), "b's tag matches, its key does not");
	cr_assert_eq(find(b), ob);
	/* The prefetch stages meet both (a no-op, but it must not trip). */
	oa = add(a);
	for (int s = MASTER_PREFETCH_GROUP; s <= MASTER_PREFETCH_OBJECT; s++) {
		master__index_prefetch(&ix, (const uint8_t *)a, strlen(a), s);
		master__index_prefetch(&ix, (const uint8_t *)"absent", 6, s);
	}
	cr_assert_eq(find(a), oa);
}

/* A replica added to an object in an overflow group: a new allocation,
 * which its entry and its LRU neighbours follow. */
Test(master_index, add_replica_in_overflow_group)
{
	char keys[10][32];
	struct master_obj *o[10];
	unsigned next = 0;
	for (int i = 0; i < 10; i++) {
		key_with(keys[i], "r/", MIN_GROUPS - 1, 9, &next);
		o[i] = add(keys[i]);
	}
	cr_assert_eq(ix.nmore, 1);
	struct master_obj *n = master__index_add_replica(&ix, o[8], 3, 4096);
	cr_assert_not_null(n);
	cr_assert_eq(n->nrep, 2);
	cr_assert_eq(n->rep[1].seg, 3);
	cr_assert_eq(n->rep[1].offset, 4096);
	cr_assert_eq(n->klen, strlen(keys[8]));
	cr_assert_eq(memcmp(master__obj_key(n), keys[8], n->klen), 0, "the key moved along");
	cr_assert_eq(find(keys[8]), n);
	cr_assert_eq(o[7]->next, n);
	cr_assert_eq(n->prev, o[7]);
	cr_assert_eq(n->next, o[9]);
	cr_assert_eq(o[9]->prev, n);
	/* The last one of its list: the tail follows. */
	struct master_obj *t = master__index_add_replica(&ix, o[9], 4, 0);
	cr_assert_not_null(t);
	cr_assert_eq(master__index_oldest(&ix, MASTER_LIST_PLAIN), o[0]);
	cr_assert_eq(n->next, t);
	cr_assert_eq(find(keys[9]), t);
	master__index_del(&ix, n);
	cr_assert_null(find(keys[8]));
	cr_assert_eq(find(keys[9]), t);
}

/* A doubling moves each entry to its slot or the slot plus the old count,
 * overflow groups included; emptied overflow groups go. */
Test(master_index, doubling_with_overflow_groups)
{
	char keys[16][32], k[32];
	unsigned next = 0;
	for (int i = 0; i < 16; i++) {
		key_with(keys[i], "d/", MIN_GROUPS - 1, 200, &next);
		add(keys[i]);
	}
	cr_assert_eq(ix.nmore, 2);
	master__index_del(&ix, find(keys[15]));
	master__index_del(&ix, find(keys[14]));
	/* Fill up to the doubling. */
	unsigned i = 0;
	while (master__index_slots(&ix) == MIN_GROUPS) {
		snprintf(k, sizeof(k), "fill/%u", i++);
		add(k);
	}
	cr_assert_eq(master__index_slots(&ix), 2 * MIN_GROUPS);
	for (int j = 0; j < 14; j++)
		cr_assert_not_null(find(keys[j]), "%s", keys[j]);
	for (unsigned j = 0; j < i; j++) {
		snprintf(k, sizeof(k), "fill/%u", j);
		cr_assert_not_null(find(k), "%s", k);
	}
	/* 14 keys over two slots: an overflow group at most, no empty one. */
	cr_assert_leq(ix.nmore, 1 + (uint64_t)(ix.nobjs / MASTER_GROUP_SLOTS));
	cr_assert_eq(walk(false), 14 + i);
}

Test(master_index, clear_frees_and_stays_usable)
{
	char keys[12][32];
	unsigned next = 0;
	for (int i = 0; i < 12; i++) {
		key_with(keys[i], "z/", MIN_GROUPS - 1, 1, &next);
		add(keys[i]);
	}
	master__index_clear(&ix);
	cr_assert_eq(ix.nobjs, 0);
	cr_assert_eq(ix.nmore, 0);
	cr_assert_eq(walk(false), 0);
	cr_assert_null(find(keys[0]));
	add(keys[0]);
	cr_assert_not_null(find(keys[0]));
}
