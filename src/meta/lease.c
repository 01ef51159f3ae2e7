/*
 * lease: the lease table (see lease.h for the model).
 *
 * Each lease sits in by_id (keyed by ID) and, while the table is primary,
 * in by_check (keyed by (check_ms, ID)): check_ms is the expiry, pushed
 * back by retry_ms each time lease_expired() hands the lease out. expiry_ms
 * stays the real expiry, so a renew after expiry is refused until the
 * revoke lands. On a follower every expiry is LEASE__FOREVER and by_check
 * is empty.
 */
#include "meta/lease.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "meta/avl.h"

#define LEASE__FOREVER UINT64_MAX

struct lease__key {
	struct avl_node node;
	size_t len;
	char key[];
};

struct lease__lease {
	struct avl_node by_id;
	struct avl_node by_check;
	int64_t id;
	int64_t ttl_s;
	int64_t remaining_ttl_s;
	uint64_t expiry_ms;
	uint64_t check_ms;
	struct avl_tree keys;
};

struct lease_table {
	struct avl_tree by_id;
	struct avl_tree by_check;
	int64_t min_ttl_s;
	int64_t next_id;
	bool primary;
};

struct lease__check_key {
	uint64_t check_ms;
	int64_t id;
};

struct lease__bytes {
	const char *p;
	size_t n;
};

static int cmp_i64(int64_t a, int64_t b)
{
	return a < b ? -1 : a > b;
}

static int by_id_cmp(const void *key, const struct avl_node *n)
{
	const struct lease__lease *l = MC_CONTAINER_OF(n, struct lease__lease, by_id);
	return cmp_i64(*(const int64_t *)key, l->id);
}

static int by_check_cmp(const void *key, const struct avl_node *n)
{
	const struct lease__check_key *k = key;
	const struct lease__lease *l = MC_CONTAINER_OF(n, struct lease__lease, by_check);
	if (k->check_ms != l->check_ms)
		return k->check_ms < l->check_ms ? -1 : 1;
	return cmp_i64(k->id, l->id);
}

static int key_cmp(const void *key, const struct avl_node *n)
{
	const struct lease__bytes *b = key;
	const struct lease__key *k = MC_CONTAINER_OF(n, struct lease__key, node);
	return mc_bytes_cmp(b->p, b->n, k->key, k->len);
}

static struct lease__lease *find(const struct lease_table *t, int64_t id)
{
	struct avl_node *n = avl_find(&t->by_id, &id);
	return n ? MC_CONTAINER_OF(n, struct lease__lease, by_id) : NULL;
}

int lease_table_new(int64_t min_ttl_s, struct lease_table **out)
{
	struct lease_table *t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	avl_init(&t->by_id, by_id_cmp, NULL);
	avl_init(&t->by_check, by_check_cmp, NULL);
	t->min_ttl_s = min_ttl_s > 0 ? min_ttl_s : 0;
	t->next_id = 1;
	*out = t;
	return 0;
}

static void free_keys(struct avl_node *n)
{
	while (n) {
		/* Free the left spine recursively, then loop on the right. */
		free_keys(n->child[0]);
		struct avl_node *r = n->child[1];
		free(MC_CONTAINER_OF(n, struct lease__key, node));
		n = r;
	}
}

static void free_leases(struct avl_node *n)
{
	while (n) {
		free_leases(n->child[0]);
		struct avl_node *r = n->child[1];
		struct lease__lease *l = MC_CONTAINER_OF(n, struct lease__lease, by_id);
		free_keys(l->keys.root);
		free(l);
		n = r;
	}
}

void lease_table_free(struct lease_table *t)
{
	if (!t)
		return;
	free_leases(t->by_id.root);
	free(t);
}

static void check_unlink(struct lease_table *t, struct lease__lease *l)
{
	if (l->check_ms == LEASE__FOREVER)
		return;
	struct lease__check_key k = {l->check_ms, l->id};
	avl_remove(&t->by_check, &k);
}

/* Set expiry and check time; link into by_check unless forever. */
static void set_expiry(struct lease_table *t, struct lease__lease *l, uint64_t expiry_ms)
{
	check_unlink(t, l);
	l->expiry_ms = expiry_ms;
	l->check_ms = expiry_ms;
	if (expiry_ms != LEASE__FOREVER) {
		struct lease__check_key k = {l->check_ms, l->id};
		avl_insert(&t->by_check, &k, &l->by_check);
	}
}

static uint64_t add_sat(uint64_t a, uint64_t b)
{
	return a > UINT64_MAX - 1 - b ? UINT64_MAX - 1 : a + b;
}

static uint64_t ttl_ms(int64_t ttl_s)
{
	return (uint64_t)ttl_s * 1000u; /* ttl_s <= LEASE_MAX_TTL_S: no overflow */
}

int lease_grant(struct lease_table *t, int64_t id, int64_t ttl_s, uint64_t now_ms,
		int64_t *id_out, int64_t *ttl_out)
{
	if (ttl_s > LEASE_MAX_TTL_S)
		return MVCC_ELEASE_TTL_TOO_LARGE;
	if (id == 0) {
		id = t->next_id;
		while (id == 0 || find(t, id))
			id = id == INT64_MAX ? 1 : id + 1;
		t->next_id = id == INT64_MAX ? 1 : id + 1;
	} else if (find(t, id)) {
		return MVCC_ELEASE_EXISTS;
	}
	struct lease__lease *l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	l->id = id;
	l->ttl_s = ttl_s < t->min_ttl_s ? t->min_ttl_s : ttl_s;
	if (l->ttl_s < 0)
		l->ttl_s = 0;
	l->check_ms = LEASE__FOREVER;
	l->expiry_ms = LEASE__FOREVER;
	avl_init(&l->keys, key_cmp, NULL);
	avl_insert(&t->by_id, &l->id, &l->by_id);
	if (t->primary)
		set_expiry(t, l, add_sat(now_ms, ttl_ms(l->ttl_s)));
	if (id_out)
		*id_out = id;
	if (ttl_out)
		*ttl_out = l->ttl_s;
	return 0;
}

bool lease_exists(const struct lease_table *t, int64_t id)
{
	return find(t, id) != NULL;
}

size_t lease_count(const struct lease_table *t)
{
	return t->by_id.count;
}

int lease_renew(struct lease_table *t, int64_t id, uint64_t now_ms, int64_t *ttl_out,
		bool *clear_checkpoint)
{
	if (!t->primary)
		return MC_ENOT_LEADER;
	struct lease__lease *l = find(t, id);
	if (!l)
		return MVCC_ELEASE_NOT_FOUND;
	if (l->expiry_ms <= now_ms)
		return MVCC_ELEASE_EXPIRED;
	if (clear_checkpoint)
		*clear_checkpoint = l->remaining_ttl_s > 0;
	set_expiry(t, l, add_sat(now_ms, ttl_ms(l->ttl_s)));
	if (ttl_out)
		*ttl_out = l->ttl_s;
	return 0;
}

void lease_checkpoint(struct lease_table *t, int64_t id, int64_t remaining_ttl_s)
{
	struct lease__lease *l = find(t, id);
	if (l)
		l->remaining_ttl_s = remaining_ttl_s > 0 ? remaining_ttl_s : 0;
}

int lease_time_to_live(const struct lease_table *t, int64_t id, uint64_t now_ms,
		       bool with_keys, struct lease_ttl *out)
{
	memset(out, 0, sizeof(*out));
	const struct lease__lease *l = find(t, id);
	if (!l)
		return MVCC_ELEASE_NOT_FOUND;
	out->id = id;
	out->granted_ttl_s = l->ttl_s;
	out->remaining_checkpoint_s = l->remaining_ttl_s;
	if (l->expiry_ms == LEASE__FOREVER)
		out->ttl_s = LEASE_TTL_FOREVER_S;
	else if (l->expiry_ms >= now_ms)
		out->ttl_s = (int64_t)((l->expiry_ms - now_ms) / 1000);
	else /* Go's Duration.Seconds() truncates toward zero */
		out->ttl_s = -(int64_t)((now_ms - l->expiry_ms) / 1000);
	out->key_count = l->keys.count;
	if (with_keys) {
		int rc = lease__keys(t, id, &out->keys, &out->nkeys);
		if (rc) {
			memset(out, 0, sizeof(*out));
			return rc;
		}
	}
	return 0;
}

void lease_ttl_free(struct lease_ttl *ttl)
{
	if (!ttl)
		return;
	free(ttl->keys);
	ttl->keys = NULL;
	ttl->nkeys = 0;
}

int lease_list(const struct lease_table *t, int64_t **ids_out, size_t *n_out)
{
	size_t n = t->by_id.count;
	int64_t *ids = malloc((n ? n : 1) * sizeof(*ids));
	if (!ids)
		return -ENOMEM;
	struct avl_iter it;
	size_t i = 0;
	for (struct avl_node *x = avl_seek(&it, &t->by_id, NULL); x; x = avl_next(&it))
		ids[i++] = MC_CONTAINER_OF(x, struct lease__lease, by_id)->id;
	*ids_out = ids;
	*n_out = n;
	return 0;
}

size_t lease_expired(struct lease_table *t, uint64_t now_ms, uint64_t retry_ms, int64_t *ids,
		     size_t max)
{
	size_t n = 0;
	struct avl_iter it;
	/* Collect first: re-keying while iterating would disturb the walk. */
	for (struct avl_node *x = avl_seek(&it, &t->by_check, NULL); x && n < max;
	     x = avl_next(&it)) {
		struct lease__lease *l = MC_CONTAINER_OF(x, struct lease__lease, by_check);
		if (l->check_ms > now_ms)
			break;
		ids[n++] = l->id;
	}
	uint64_t next = add_sat(now_ms, retry_ms);
	for (size_t i = 0; i < n; i++) {
		struct lease__lease *l = find(t, ids[i]);
		check_unlink(t, l);
		l->check_ms = next;
		struct lease__check_key k = {l->check_ms, l->id};
		avl_insert(&t->by_check, &k, &l->by_check);
	}
	return n;
}

uint64_t lease_next_check_ms(const struct lease_table *t)
{
	struct avl_iter it;
	struct avl_node *x = avl_seek(&it, &t->by_check, NULL);
	return x ? MC_CONTAINER_OF(x, struct lease__lease, by_check)->check_ms : UINT64_MAX;
}

void lease_promote(struct lease_table *t, uint64_t now_ms, uint64_t extend_ms)
{
	t->primary = true;
	avl_init(&t->by_check, by_check_cmp, NULL);
	struct avl_iter it;
	for (struct avl_node *x = avl_seek(&it, &t->by_id, NULL); x; x = avl_next(&it)) {
		struct lease__lease *l = MC_CONTAINER_OF(x, struct lease__lease, by_id);
		int64_t ttl = l->remaining_ttl_s > 0 ? l->remaining_ttl_s : l->ttl_s;
		l->check_ms = LEASE__FOREVER; /* by_check was reset above */
		set_expiry(t, l, add_sat(add_sat(now_ms, extend_ms), ttl_ms(ttl)));
	}
}

void lease_demote(struct lease_table *t)
{
	t->primary = false;
	avl_init(&t->by_check, by_check_cmp, NULL);
	struct avl_iter it;
	for (struct avl_node *x = avl_seek(&it, &t->by_id, NULL); x; x = avl_next(&it)) {
		struct lease__lease *l = MC_CONTAINER_OF(x, struct lease__lease, by_id);
		l->check_ms = LEASE__FOREVER;
		l->expiry_ms = LEASE__FOREVER;
	}
}

bool lease_is_primary(const struct lease_table *t)
{
	return t->primary;
}

/* ------------------------------------------------------------- private */

int lease__key_new(const char *key, size_t len, struct lease__key **out)
{
	struct lease__key *k = malloc(sizeof(*k) + len);
	if (!k)
		return -ENOMEM;
	k->len = len;
	if (len)
		memcpy(k->key, key, len);
	*out = k;
	return 0;
}

void lease__key_free(struct lease__key *k)
{
	free(k);
}

int lease__attach(struct lease_table *t, int64_t id, struct lease__key *k)
{
	struct lease__lease *l = find(t, id);
	if (!l)
		return MVCC_ELEASE_NOT_FOUND;
	struct lease__bytes b = {k->key, k->len};
	return avl_insert(&l->keys, &b, &k->node) ? 1 : 0;
}

void lease__detach(struct lease_table *t, int64_t id, const char *key, size_t len)
{
	struct lease__lease *l = find(t, id);
	if (!l)
		return;
	struct lease__bytes b = {key, len};
	struct avl_node *n = avl_remove(&l->keys, &b);
	if (n)
		free(MC_CONTAINER_OF(n, struct lease__key, node));
}

int lease__keys(const struct lease_table *t, int64_t id, struct lease_key_ref **keys,
		size_t *n_out)
{
	const struct lease__lease *l = find(t, id);
	if (!l)
		return MVCC_ELEASE_NOT_FOUND;
	size_t n = l->keys.count;
	struct lease_key_ref *r = malloc((n ? n : 1) * sizeof(*r));
	if (!r)
		return -ENOMEM;
	struct avl_iter it;
	size_t i = 0;
	for (struct avl_node *x = avl_seek(&it, &l->keys, NULL); x; x = avl_next(&it)) {
		const struct lease__key *k = MC_CONTAINER_OF(x, struct lease__key, node);
		r[i].key = k->key;
		r[i].len = k->len;
		i++;
	}
	*keys = r;
	*n_out = n;
	return 0;
}

int lease__remove(struct lease_table *t, int64_t id)
{
	struct lease__lease *l = find(t, id);
	if (!l)
		return MVCC_ELEASE_NOT_FOUND;
	check_unlink(t, l);
	avl_remove(&t->by_id, &id);
	free_keys(l->keys.root);
	free(l);
	return 0;
}

int lease__foreach(const struct lease_table *t,
		   int (*fn)(void *ctx, int64_t id, int64_t ttl_s, int64_t remaining_ttl_s),
		   void *ctx)
{
	struct avl_iter it;
	for (struct avl_node *x = avl_seek(&it, &t->by_id, NULL); x; x = avl_next(&it)) {
		const struct lease__lease *l = MC_CONTAINER_OF(x, struct lease__lease, by_id);
		int rc = fn(ctx, l->id, l->ttl_s, l->remaining_ttl_s);
		if (rc)
			return rc;
	}
	return 0;
}

int64_t lease__next_id(const struct lease_table *t)
{
	return t->next_id;
}

void lease__set_next_id(struct lease_table *t, int64_t next_id)
{
	t->next_id = next_id;
}

int lease__restore(struct lease_table *t, int64_t id, int64_t ttl_s, int64_t remaining_ttl_s)
{
	if (find(t, id))
		return MVCC_ELEASE_EXISTS;
	struct lease__lease *l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	l->id = id;
	l->ttl_s = ttl_s;
	l->remaining_ttl_s = remaining_ttl_s;
	l->check_ms = LEASE__FOREVER;
	l->expiry_ms = LEASE__FOREVER;
	avl_init(&l->keys, key_cmp, NULL);
	avl_insert(&t->by_id, &l->id, &l->by_id);
	return 0;
}
