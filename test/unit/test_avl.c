/*
 * test_avl: the intrusive AVL tree shared by the MVCC store, the lease
 * table and the watch registry — random inserts and removals checked
 * against a plain array after every step (order, count, balance, heights,
 * the augmented subtree value), seek and in-order iteration.
 */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "common/util.h"
#include "meta/avl.h"

struct item {
	struct avl_node node;
	int key;
	int sub_max; /* augmented: the largest key in the subtree */
};

static int item_cmp(const void *key, const struct avl_node *n)
{
	int k = *(const int *)key, m = MC_CONTAINER_OF(n, struct item, node)->key;
	return k < m ? -1 : k > m;
}

static void item_aug(struct avl_node *n)
{
	struct item *it = MC_CONTAINER_OF(n, struct item, node);
	it->sub_max = it->key;
	for (int i = 0; i < 2; i++) {
		if (!n->child[i])
			continue;
		int c = MC_CONTAINER_OF(n->child[i], struct item, node)->sub_max;
		if (c > it->sub_max)
			it->sub_max = c;
	}
}

/* Checks the subtree under n; returns its height and counts its nodes. */
static int check(const struct avl_node *n, const int *lo, const int *hi, size_t *count)
{
	if (!n)
		return 0;
	const struct item *it = MC_CONTAINER_OF(n, struct item, node);
	cr_assert(!lo || it->key > *lo, "order broken at %d", it->key);
	cr_assert(!hi || it->key < *hi, "order broken at %d", it->key);
	int l = check(n->child[0], lo, &it->key, count);
	int r = check(n->child[1], &it->key, hi, count);
	cr_assert(l - r <= 1 && r - l <= 1, "unbalanced at %d: %d/%d", it->key, l, r);
	int h = 1 + (l > r ? l : r);
	cr_assert_eq(n->height, h, "height of %d", it->key);
	int mx = it->key;
	for (int i = 0; i < 2; i++)
		if (n->child[i] &&
		    MC_CONTAINER_OF(n->child[i], struct item, node)->sub_max > mx)
			mx = MC_CONTAINER_OF(n->child[i], struct item, node)->sub_max;
	cr_assert_eq(it->sub_max, mx, "augmented value of %d", it->key);
	(*count)++;
	return h;
}

Test(avl, random_inserts_and_removals_keep_order_and_balance)
{
	enum { N = 600 };
	static struct item items[N];
	static bool in[N];
	struct avl_tree t;
	size_t live = 0;
	unsigned seed = 12345;

	avl_init(&t, item_cmp, item_aug);
	for (int i = 0; i < N; i++)
		items[i].key = i;
	for (int step = 0; step < 6000; step++) {
		seed = seed * 1103515245u + 12345u;
		int k = (int)((seed >> 8) % N);
		if (!in[k]) {
			cr_assert_null(avl_insert(&t, &k, &items[k].node));
			in[k] = true;
			live++;
			/* a second node with the same key is refused */
			struct item dup = {.key = k};
			cr_assert_eq(avl_insert(&t, &k, &dup.node), &items[k].node);
		} else {
			cr_assert_eq(avl_remove(&t, &k), &items[k].node);
			in[k] = false;
			live--;
			cr_assert_null(avl_remove(&t, &k));
		}
		cr_assert_eq(avl_find(&t, &k), in[k] ? &items[k].node : NULL);
		size_t count = 0;
		check(t.root, NULL, NULL, &count);
		cr_assert_eq(count, live);
		cr_assert_eq(t.count, live);
	}
	/* iteration from every key visits exactly the live keys above it */
	for (int from = 0; from < N; from += 37) {
		struct avl_iter it;
		int expect = from;
		for (struct avl_node *n = avl_seek(&it, &t, &from); n; n = avl_next(&it)) {
			while (!in[expect])
				expect++;
			cr_assert_eq(MC_CONTAINER_OF(n, struct item, node)->key, expect);
			expect++;
		}
		while (expect < N)
			cr_assert(!in[expect++], "iteration stopped early");
	}
}

Test(avl, seek_without_key_starts_at_the_first_node)
{
	struct item items[5];
	struct avl_tree t;
	struct avl_iter it;
	int keys[] = {30, 10, 50, 20, 40};

	avl_init(&t, item_cmp, NULL);
	cr_assert_null(avl_seek(&it, &t, NULL));
	for (int i = 0; i < 5; i++) {
		items[i].key = keys[i];
		cr_assert_null(avl_insert(&t, &keys[i], &items[i].node));
	}
	int got[5], k = 0;
	for (struct avl_node *n = avl_seek(&it, &t, NULL); n; n = avl_next(&it))
		got[k++] = MC_CONTAINER_OF(n, struct item, node)->key;
	cr_assert_eq(k, 5);
	for (int i = 0; i < 5; i++)
		cr_assert_eq(got[i], 10 * (i + 1));
	int past = 51;
	cr_assert_null(avl_seek(&it, &t, &past));
}
