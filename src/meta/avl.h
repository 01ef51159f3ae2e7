/*
 * avl: an intrusive AVL tree, the ordered index under the MVCC store's
 * keys, the lease table (by ID, by expiry, each lease's keys) and the
 * watch registry (by ID, by key, and an interval tree of ranges).
 *
 * The owner embeds a struct avl_node in its objects and supplies
 * cmp(key, node) (<0, 0, >0) and optionally aug(node), called whenever a
 * node's children change so that augmented subtree data (the watch
 * interval tree's maximum end) stays right. The tree allocates nothing:
 * insertion links the caller's node, removal hands it back. Pure: no I/O,
 * no clock, no allocation. Find, insert and remove are O(log n); the
 * height stays below AVL_MAX_DEPTH for any count a 64-bit address space
 * holds.
 */
#ifndef MC_META_AVL_H
#define MC_META_AVL_H

#include <stddef.h>

struct avl_node {
	struct avl_node *child[2];
	int height;
};
typedef int (*avl_cmp_fn)(const void *key, const struct avl_node *n);
typedef void (*avl_aug_fn)(struct avl_node *n);
struct avl_tree {
	struct avl_node *root;
	size_t count;
	avl_cmp_fn cmp;
	avl_aug_fn aug;
};
#define AVL_MAX_DEPTH 96
struct avl_iter {
	struct avl_node *stk[AVL_MAX_DEPTH];
	int depth;
};

/* An empty tree ordered by cmp; aug may be NULL. */
void avl_init(struct avl_tree *t, avl_cmp_fn cmp, avl_aug_fn aug);
/* The node with key, or NULL. */
struct avl_node *avl_find(const struct avl_tree *t, const void *key);
/* Link n under key; returns the node already there (n not linked) or NULL. */
struct avl_node *avl_insert(struct avl_tree *t, const void *key, struct avl_node *n);
/* Unlink and return the node with key, or NULL. */
struct avl_node *avl_remove(struct avl_tree *t, const void *key);
/* In-order iteration; the tree must not change meanwhile. seek: first node
 * with key >= key (key NULL: the first node). */
struct avl_node *avl_seek(struct avl_iter *it, const struct avl_tree *t, const void *key);
struct avl_node *avl_next(struct avl_iter *it);

#endif
