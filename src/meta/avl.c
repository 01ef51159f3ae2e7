/*
 * avl: the intrusive AVL tree (see avl.h). Insertion and removal walk
 * down recording the links they pass, then rebalance back up that path,
 * so no node needs a parent pointer; removal of a node with two children
 * moves its in-order successor into its place.
 */
#include "meta/avl.h"

void avl_init(struct avl_tree *t, avl_cmp_fn cmp, avl_aug_fn aug)
{
	t->root = NULL;
	t->count = 0;
	t->cmp = cmp;
	t->aug = aug;
}

static int th(const struct avl_node *n)
{
	return n ? n->height : 0;
}

static void tfix(const struct avl_tree *t, struct avl_node *n)
{
	int l = th(n->child[0]), r = th(n->child[1]);
	n->height = 1 + (l > r ? l : r);
	if (t->aug)
		t->aug(n);
}

/* dir 1: right rotation (the left child comes up); dir 0: left rotation. */
static struct avl_node *trot(const struct avl_tree *t, struct avl_node *n, int dir)
{
	struct avl_node *c = n->child[!dir];
	n->child[!dir] = c->child[dir];
	c->child[dir] = n;
	tfix(t, n);
	tfix(t, c);
	return c;
}

static struct avl_node *tbalance(const struct avl_tree *t, struct avl_node *n)
{
	tfix(t, n);
	int bf = th(n->child[0]) - th(n->child[1]);
	if (bf > 1) {
		struct avl_node *l = n->child[0];
		if (th(l->child[0]) < th(l->child[1]))
			n->child[0] = trot(t, l, 0);
		return trot(t, n, 1);
	}
	if (bf < -1) {
		struct avl_node *r = n->child[1];
		if (th(r->child[1]) < th(r->child[0]))
			n->child[1] = trot(t, r, 1);
		return trot(t, n, 0);
	}
	return n;
}

struct avl_node *avl_find(const struct avl_tree *t, const void *key)
{
	struct avl_node *n = t->root;
	while (n) {
		int c = t->cmp(key, n);
		if (c == 0)
			return n;
		n = n->child[c > 0];
	}
	return NULL;
}

struct avl_node *avl_insert(struct avl_tree *t, const void *key, struct avl_node *n)
{
	struct avl_node **path[AVL_MAX_DEPTH];
	int d = 0;
	struct avl_node **link = &t->root;
	while (*link) {
		int c = t->cmp(key, *link);
		if (c == 0)
			return *link;
		path[d++] = link;
		link = &(*link)->child[c > 0];
	}
	n->child[0] = n->child[1] = NULL;
	n->height = 1;
	if (t->aug)
		t->aug(n);
	*link = n;
	t->count++;
	while (d > 0) {
		link = path[--d];
		*link = tbalance(t, *link);
	}
	return NULL;
}

struct avl_node *avl_remove(struct avl_tree *t, const void *key)
{
	struct avl_node **path[AVL_MAX_DEPTH];
	int d = 0;
	struct avl_node **link = &t->root;
	while (*link) {
		int c = t->cmp(key, *link);
		if (c == 0)
			break;
		path[d++] = link;
		link = &(*link)->child[c > 0];
	}
	struct avl_node *n = *link;
	if (!n)
		return NULL;
	if (!n->child[0] || !n->child[1]) {
		*link = n->child[0] ? n->child[0] : n->child[1];
	} else {
		/* Replace n by its successor s, the leftmost node on the right. */
		int nd = d;
		path[d++] = link;
		struct avl_node **sl = &n->child[1];
		while ((*sl)->child[0]) {
			path[d++] = sl;
			sl = &(*sl)->child[0];
		}
		struct avl_node *s = *sl;
		*sl = s->child[1];
		s->child[0] = n->child[0];
		s->child[1] = n->child[1];
		s->height = n->height;
		*link = s;
		/* The link below n on the path lived in n; it now lives in s. */
		if (d > nd + 1)
			path[nd + 1] = &s->child[1];
	}
	t->count--;
	while (d > 0) {
		link = path[--d];
		*link = tbalance(t, *link);
	}
	n->child[0] = n->child[1] = NULL;
	return n;
}

struct avl_node *avl_seek(struct avl_iter *it, const struct avl_tree *t, const void *key)
{
	it->depth = 0;
	struct avl_node *n = t->root;
	while (n) {
		int c = key ? t->cmp(key, n) : -1;
		if (c <= 0) {
			it->stk[it->depth++] = n;
			if (c == 0)
				break;
			n = n->child[0];
		} else {
			n = n->child[1];
		}
	}
	return it->depth ? it->stk[it->depth - 1] : NULL;
}

struct avl_node *avl_next(struct avl_iter *it)
{
	if (!it->depth)
		return NULL;
	struct avl_node *n = it->stk[--it->depth]->child[1];
	while (n) {
		it->stk[it->depth++] = n;
		n = n->child[0];
	}
	return it->depth ? it->stk[it->depth - 1] : NULL;
}
