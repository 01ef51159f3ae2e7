/*
 * mvcc: the multi-version key-value store (see mvcc.h for the model).
 *
 * Layout of this file: errors; byte helpers; the store (key nodes with their
 * version arrays, the revision log); reads; the write transaction (checks,
 * compare path, execution with an undo log, commit); compaction; the
 * history cursor; snapshot encode/decode.
 *
 * Write transactions never leave a half-applied state: every allocation a
 * step needs is made before the step mutates anything, each appended
 * version is recorded in an undo log, and lease attachment changes are
 * queued (with their records allocated) and applied only at commit, which
 * cannot fail. A failing request — an etcd error found mid-txn, or
 * -ENOMEM — rolls back to exactly the state before it.
 */
#include "meta/mvcc.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/crc32c.h"
#include "common/util.h"
#include "meta/avl.h"
#include "meta/lease.h"

/* ------------------------------------------------------------- errors */

const char *mvcc_strerror(int code)
{
	switch (code) {
#define MVCC__ERR_TEXT(name, value, text)                                      \
	case name:                                                             \
		return text;
		MVCC_ERRORS(MVCC__ERR_TEXT)
#undef MVCC__ERR_TEXT
	default:
		return mc_strerror(code);
	}
}

const char *mvcc_errname(int code)
{
	switch (code) {
#define MVCC__ERR_NAME(name, value, text)                                      \
	case name:                                                             \
		return #name;
		MVCC_ERRORS(MVCC__ERR_NAME)
#undef MVCC__ERR_NAME
	default:
		return mc_errname(code);
	}
}

/* ------------------------------------------------------------- bytes */

int mvcc__bytes_cmp(const void *a, size_t alen, const void *b, size_t blen)
{
	size_t n = alen < blen ? alen : blen;
	int c = n ? memcmp(a, b, n) : 0;
	if (c)
		return c < 0 ? -1 : 1;
	return alen < blen ? -1 : alen > blen;
}

/* ------------------------------------------------------------- store */

/* One version of a key. A tombstone has create == 0 (and no value). */
struct mvcc__ver {
	int64_t main;
	int64_t create;
	int64_t version;
	int64_t lease;
	char *value; /* owned; NULL when vlen == 0 */
	uint32_t vlen;
	uint32_t sub;
};

/* A key with any stored history, in the store's tree. */
struct mvcc__key {
	struct avl_node node;
	struct mvcc__ver *hist; /* (main, sub) ascending */
	uint32_t nhist;
	uint32_t caphist;
	uint32_t klen;
	char key[];
};

/* Revision log entry. */
struct mvcc__rent {
	int64_t main;
	struct mvcc__key *key;
	uint32_t sub;
};

struct mvcc_store {
	struct avl_tree keys;
	/* Revision log: live entries rl[rl_head, rl_len); rl[rl_head] has
	 * the absolute position rl_base. */
	struct mvcc__rent *rl;
	size_t rl_head, rl_len, rl_cap;
	uint64_t rl_base;
	int64_t rev;
	int64_t compact_rev;
	uint64_t db_size;
	uint64_t nversions;
	uint64_t nlive;
	uint64_t key_bytes;     /* sum of klen over key nodes */
	uint64_t value_bytes;   /* sum of vlen over versions */
	uint64_t hist_slots;    /* sum of caphist */
	size_t max_txn_ops;
	int64_t min_lease_ttl_s;
	struct lease_table *leases;
};

struct mvcc__bytes {
	const char *p;
	size_t n;
};

static const char mvcc__empty[1] = "";

static int key_cmp(const void *key, const struct avl_node *n)
{
	const struct mvcc__bytes *b = key;
	const struct mvcc__key *k = MC_CONTAINER_OF(n, struct mvcc__key, node);
	return mvcc__bytes_cmp(b->p, b->n, k->key, k->klen);
}

static struct mvcc__key *key_of(struct avl_node *n)
{
	return n ? MC_CONTAINER_OF(n, struct mvcc__key, node) : NULL;
}

static struct mvcc__key *find_key(const struct mvcc_store *s, const char *key,
				  size_t len)
{
	struct mvcc__bytes b = {key, len};
	return key_of(avl_find(&s->keys, &b));
}

static uint64_t ver_size(const struct mvcc__key *k, const struct mvcc__ver *v)
{
	return (uint64_t)k->klen + v->vlen + MVCC_VERSION_OVERHEAD_BYTES;
}

static bool ver_live(const struct mvcc__ver *v)
{
	return v && v->create != 0;
}

/* The latest version with main <= rev, or NULL. */
static const struct mvcc__ver *ver_at(const struct mvcc__key *k, int64_t rev)
{
	uint32_t n = k->nhist;
	if (n == 0)
		return NULL;
	if (k->hist[n - 1].main <= rev)
		return &k->hist[n - 1];
	uint32_t lo = 0, hi = n - 1;
	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;
		if (k->hist[mid].main <= rev)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo ? &k->hist[lo - 1] : NULL;
}

static const struct mvcc__ver *live_at(const struct mvcc__key *k, int64_t rev)
{
	const struct mvcc__ver *v = ver_at(k, rev);
	return ver_live(v) ? v : NULL;
}

static const struct mvcc__ver *live_latest(const struct mvcc__key *k)
{
	return k && k->nhist && ver_live(&k->hist[k->nhist - 1])
		       ? &k->hist[k->nhist - 1]
		       : NULL;
}

static void key_free(struct mvcc_store *s, struct mvcc__key *k)
{
	for (uint32_t i = 0; i < k->nhist; i++)
		free(k->hist[i].value);
	s->hist_slots -= k->caphist;
	s->key_bytes -= k->klen;
	free(k->hist);
	free(k);
}

static void free_tree_keys(struct mvcc_store *s, struct avl_node *n)
{
	while (n) {
		free_tree_keys(s, n->child[0]);
		struct avl_node *r = n->child[1];
		key_free(s, key_of(n));
		n = r;
	}
}

int mvcc_new(const struct mvcc_options *opts, struct mvcc_store **out)
{
	struct mvcc_store *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	avl_init(&s->keys, key_cmp, NULL);
	s->rev = 1;
	s->compact_rev = -1;
	s->max_txn_ops = opts && opts->max_txn_ops ? opts->max_txn_ops : 128;
	s->min_lease_ttl_s = opts ? opts->min_lease_ttl_s : 0;
	int rc = lease_table_new(s->min_lease_ttl_s, &s->leases);
	if (rc) {
		free(s);
		return rc;
	}
	*out = s;
	return 0;
}

void mvcc_free(struct mvcc_store *s)
{
	if (!s)
		return;
	free_tree_keys(s, s->keys.root);
	free(s->rl);
	lease_table_free(s->leases);
	free(s);
}

int64_t mvcc_rev(const struct mvcc_store *s)
{
	return s->rev;
}

int64_t mvcc_compact_rev(const struct mvcc_store *s)
{
	return s->compact_rev;
}

uint64_t mvcc_db_size_bytes(const struct mvcc_store *s)
{
	return s->db_size;
}

struct lease_table *mvcc_leases(struct mvcc_store *s)
{
	return s->leases;
}

void mvcc_stats(const struct mvcc_store *s, struct mvcc_stats *out)
{
	memset(out, 0, sizeof(*out));
	out->keys = s->nlive;
	out->key_nodes = s->keys.count;
	out->versions = s->nversions;
	out->revlog = s->rl_len - s->rl_head;
	out->db_size_bytes = s->db_size;
	out->memory_bytes = sizeof(*s) +
			    s->keys.count * sizeof(struct mvcc__key) +
			    s->key_bytes + s->value_bytes +
			    s->hist_slots * sizeof(struct mvcc__ver) +
			    s->rl_cap * sizeof(struct mvcc__rent);
}

/* ------------------------------------------------------------- spans */

/* A key span as etcd reads key/range_end. */
struct span {
	const char *key;
	size_t klen;
	const char *end;
	size_t elen;
	bool single;
	bool unbounded;
};

static void span_init(struct span *sp, const char *key, size_t klen,
		      const char *end, size_t elen)
{
	sp->key = key;
	sp->klen = klen;
	sp->end = end;
	sp->elen = elen;
	sp->single = elen == 0;
	sp->unbounded = elen == 1 && end[0] == '\0';
}

struct scan {
	struct avl_iter it;
	struct span sp;
	bool done;
};

static struct mvcc__key *scan_check(struct scan *sc, struct mvcc__key *k)
{
	if (!k)
		return NULL;
	if (!sc->sp.unbounded &&
	    mvcc__bytes_cmp(k->key, k->klen, sc->sp.end, sc->sp.elen) >= 0)
		return NULL;
	return k;
}

static struct mvcc__key *scan_first(struct scan *sc, const struct mvcc_store *s,
				    const struct span *sp)
{
	sc->sp = *sp;
	sc->done = false;
	if (sp->single) {
		sc->done = true;
		return find_key(s, sp->key, sp->klen);
	}
	struct mvcc__bytes b = {sp->key, sp->klen};
	return scan_check(sc, key_of(avl_seek(&sc->it, &s->keys, &b)));
}

static struct mvcc__key *scan_next(struct scan *sc)
{
	if (sc->done)
		return NULL;
	return scan_check(sc, key_of(avl_next(&sc->it)));
}

/* ------------------------------------------------------------- arena */

struct mvcc__blk {
	struct mvcc__blk *next;
	size_t used, cap;
	max_align_t data[];
};

static void *arena_alloc(struct mvcc__blk **a, size_t n)
{
	n = (n + 15) & ~(size_t)15;
	if (n == 0)
		n = 16;
	struct mvcc__blk *b = *a;
	if (b && b->cap - b->used >= n) {
		void *p = (char *)b->data + b->used;
		b->used += n;
		return p;
	}
	size_t cap = b ? b->cap * 2 : 1024;
	if (cap > (size_t)1 << 20)
		cap = (size_t)1 << 20;
	bool own = cap < n;
	if (own)
		cap = n;
	struct mvcc__blk *nb = malloc(sizeof(*nb) + cap);
	if (!nb)
		return NULL;
	nb->cap = cap;
	nb->used = n;
	if (own && b) {
		/* A big piece gets its own block behind the head. */
		nb->next = b->next;
		b->next = nb;
	} else {
		nb->next = b;
		*a = nb;
	}
	return nb->data;
}

static void arena_free(struct mvcc__blk *a)
{
	while (a) {
		struct mvcc__blk *n = a->next;
		free(a);
		a = n;
	}
}

void mvcc_result_free(struct mvcc_result *r)
{
	if (!r)
		return;
	arena_free(r->arena);
	memset(r, 0, sizeof(*r));
}

static void kv_borrow(struct mvcc_kv *out, const struct mvcc__key *k,
		      const struct mvcc__ver *v)
{
	out->key = k->key;
	out->key_len = k->klen;
	out->value = v->vlen ? v->value : mvcc__empty;
	out->value_len = v->vlen;
	out->create_revision = v->create;
	out->mod_revision = v->main;
	out->version = v->version;
	out->lease = v->lease;
}

static int kv_copy(struct mvcc__blk **a, struct mvcc_kv *out,
		   const struct mvcc__key *k, const struct mvcc__ver *v,
		   bool with_value)
{
	size_t vlen = with_value ? v->vlen : 0;
	char *p = arena_alloc(a, (size_t)k->klen + vlen);
	if (!p)
		return -ENOMEM;
	kv_borrow(out, k, v);
	memcpy(p, k->key, k->klen);
	out->key = p;
	if (vlen) {
		memcpy(p + k->klen, v->value, vlen);
		out->value = p + k->klen;
	} else {
		out->value = mvcc__empty;
	}
	out->value_len = vlen;
	return 0;
}

/* Growable array helper: make room for need elements. */
static int grow(void **arr, size_t *cap, size_t need, size_t elem)
{
	if (need <= *cap)
		return 0;
	size_t nc = *cap ? *cap : 8;
	while (nc < need) {
		if (nc > SIZE_MAX / 2 / elem)
			return -ENOMEM;
		nc *= 2;
	}
	void *p = realloc(*arr, nc * elem);
	if (!p)
		return -ENOMEM;
	*arr = p;
	*cap = nc;
	return 0;
}

static int rl_reserve(struct mvcc_store *s, size_t extra)
{
	if (s->rl_len + extra <= s->rl_cap)
		return 0;
	if (s->rl_head > 0) {
		size_t live = s->rl_len - s->rl_head;
		memmove(s->rl, s->rl + s->rl_head, live * sizeof(*s->rl));
		s->rl_len = live;
		s->rl_head = 0;
		if (s->rl_len + extra <= s->rl_cap)
			return 0;
	}
	return grow((void **)&s->rl, &s->rl_cap, s->rl_len + extra, sizeof(*s->rl));
}

static int hist_reserve(struct mvcc_store *s, struct mvcc__key *k, size_t extra)
{
	size_t need = (size_t)k->nhist + extra;
	if (need <= k->caphist)
		return 0;
	size_t nc = k->caphist ? (size_t)k->caphist * 2 : 1;
	if (nc < need)
		nc = need;
	if (nc > UINT32_MAX)
		return -ENOMEM;
	void *p = realloc(k->hist, nc * sizeof(*k->hist));
	if (!p)
		return -ENOMEM;
	k->hist = p;
	s->hist_slots += nc - k->caphist;
	k->caphist = (uint32_t)nc;
	return 0;
}

static struct mvcc__key *key_alloc(struct mvcc_store *s, const char *key, size_t klen)
{
	struct mvcc__key *k = malloc(sizeof(*k) + klen);
	if (!k)
		return NULL;
	memset(k, 0, sizeof(*k));
	memcpy(k->key, key, klen);
	k->klen = (uint32_t)klen;
	s->key_bytes += klen;
	return k;
}

/* ------------------------------------------------------------- checks */
/* The checks etcd's gRPC layer makes before a request reaches Raft. */

static int check_txn(const struct mvcc_txn_req *t, size_t max_ops);

/* The sort a range does, as etcd's applier decides it: a target other
 * than the key with no order sorts ascending; an order other than
 * ascending or descending does not sort. */
static int sort_order_of(const struct mvcc_range_req *r)
{
	int order = r->sort_order;
	if (r->sort_target != MVCC_SORT_KEY && order == MVCC_SORT_NONE)
		order = MVCC_SORT_ASCEND;
	if (order != MVCC_SORT_ASCEND && order != MVCC_SORT_DESCEND)
		order = MVCC_SORT_NONE;
	return order;
}

static int check_op(const struct mvcc_op *op, size_t max_ops)
{
	switch (op->type) {
	case MVCC_OP_RANGE: {
		const struct mvcc_range_req *r = &op->u.range;
		if (!r->key_len)
			return MVCC_EEMPTY_KEY;
		/* An unknown target is refused only where it would sort (etcd
		 * 3.4 dereferences a nil sorter there and crashes); an unknown
		 * order does not sort, as in etcd. */
		int order = sort_order_of(r);
		if (order != MVCC_SORT_NONE &&
		    (r->sort_target < MVCC_SORT_KEY || r->sort_target > MVCC_SORT_VALUE))
			return -EINVAL;
		return 0;
	}
	case MVCC_OP_PUT: {
		const struct mvcc_put_req *p = &op->u.put;
		if (!p->key_len)
			return MVCC_EEMPTY_KEY;
		if (p->ignore_value && p->value_len)
			return MVCC_EVALUE_PROVIDED;
		if (p->ignore_lease && p->lease)
			return MVCC_ELEASE_PROVIDED;
		if (p->key_len > UINT32_MAX || p->value_len > UINT32_MAX)
			return MC_ETOO_LARGE;
		return 0;
	}
	case MVCC_OP_DELETE_RANGE:
		return op->u.del.key_len ? 0 : MVCC_EEMPTY_KEY;
	case MVCC_OP_TXN:
		return check_txn(&op->u.txn, max_ops);
	default:
		return MVCC_EKEY_NOT_FOUND; /* an empty RequestOp */
	}
}

static int check_txn(const struct mvcc_txn_req *t, size_t max_ops)
{
	size_t opc = t->ncompare;
	if (opc < t->nsuccess)
		opc = t->nsuccess;
	if (opc < t->nfailure)
		opc = t->nfailure;
	if (opc > max_ops)
		return MVCC_ETOO_MANY_OPS;
	for (size_t i = 0; i < t->ncompare; i++) {
		/* Unknown targets and results are not refused: etcd compares
		 * them as equal and holding (compare_kv does the same). */
		if (!t->compare[i].key_len)
			return MVCC_EEMPTY_KEY;
	}
	for (size_t i = 0; i < t->nsuccess; i++) {
		int rc = check_op(&t->success[i], max_ops - opc);
		if (rc)
			return rc;
	}
	for (size_t i = 0; i < t->nfailure; i++) {
		int rc = check_op(&t->failure[i], max_ops - opc);
		if (rc)
			return rc;
	}
	return 0;
}

/*
 * etcd's checkIntervals: within one branch a key may be put once, and not
 * where a delete of the same level (or of an earlier nested txn) covers it;
 * the two branches of a nested txn may put the same key. Intervals follow
 * etcd's adt "affine" strings, so a delete with range_end "\0" covers
 * nothing here — the same quirk as etcd. Sizes are bounded by max_txn_ops,
 * so plain arrays do.
 */
struct ivl {
	const char *b, *e;
	size_t bn, en;
	bool point;
};
struct ivset {
	struct ivl *a;
	size_t n, cap;
};
struct kset {
	struct mvcc__bytes *a;
	size_t n, cap;
};

static bool kset_has(const struct kset *s, const char *p, size_t n)
{
	for (size_t i = 0; i < s->n; i++)
		if (!mvcc__bytes_cmp(s->a[i].p, s->a[i].n, p, n))
			return true;
	return false;
}

static int kset_add(struct kset *s, const char *p, size_t n)
{
	if (kset_has(s, p, n))
		return 0;
	int rc = grow((void **)&s->a, &s->cap, s->n + 1, sizeof(*s->a));
	if (rc)
		return rc;
	s->a[s->n++] = (struct mvcc__bytes){p, n};
	return 0;
}

static bool ivset_hit(const struct ivset *d, const char *p, size_t n)
{
	for (size_t i = 0; i < d->n; i++) {
		const struct ivl *v = &d->a[i];
		if (v->point) {
			if (!mvcc__bytes_cmp(v->b, v->bn, p, n))
				return true;
		} else if (mvcc__bytes_cmp(v->b, v->bn, p, n) <= 0 &&
			   (v->en == 0 || mvcc__bytes_cmp(p, n, v->e, v->en) < 0)) {
			return true;
		}
	}
	return false;
}

static int ivset_add(struct ivset *d, const struct ivl *v)
{
	int rc = grow((void **)&d->a, &d->cap, d->n + 1, sizeof(*d->a));
	if (rc)
		return rc;
	d->a[d->n++] = *v;
	return 0;
}

static int check_intervals(const struct mvcc_op *ops, size_t n, struct kset *puts,
			   struct ivset *dels)
{
	int rc = 0;
	for (size_t i = 0; i < n; i++) {
		if (ops[i].type != MVCC_OP_DELETE_RANGE)
			continue;
		const struct mvcc_delete_req *d = &ops[i].u.del;
		struct ivl v = {d->key, d->range_end, d->key_len, d->range_end_len,
				d->range_end_len == 0};
		if ((rc = ivset_add(dels, &v)))
			return rc;
	}
	for (size_t i = 0; i < n; i++) {
		if (ops[i].type != MVCC_OP_TXN)
			continue;
		const struct mvcc_txn_req *t = &ops[i].u.txn;
		struct kset pt = {0}, pe = {0};
		struct ivset dt = {0}, de = {0};
		if ((rc = check_intervals(t->success, t->nsuccess, &pt, &dt)))
			goto child_out;
		if ((rc = check_intervals(t->failure, t->nfailure, &pe, &de)))
			goto child_out;
		for (size_t j = 0; j < pt.n; j++) {
			if (kset_has(puts, pt.a[j].p, pt.a[j].n) ||
			    ivset_hit(dels, pt.a[j].p, pt.a[j].n)) {
				rc = MVCC_EDUPLICATE_KEY;
				goto child_out;
			}
			if ((rc = kset_add(puts, pt.a[j].p, pt.a[j].n)))
				goto child_out;
		}
		for (size_t j = 0; j < pe.n; j++) {
			if ((kset_has(puts, pe.a[j].p, pe.a[j].n) &&
			     !kset_has(&pt, pe.a[j].p, pe.a[j].n)) ||
			    ivset_hit(dels, pe.a[j].p, pe.a[j].n)) {
				rc = MVCC_EDUPLICATE_KEY;
				goto child_out;
			}
			if ((rc = kset_add(puts, pe.a[j].p, pe.a[j].n)))
				goto child_out;
		}
		for (size_t j = 0; j < dt.n && !rc; j++)
			rc = ivset_add(dels, &dt.a[j]);
		for (size_t j = 0; j < de.n && !rc; j++)
			rc = ivset_add(dels, &de.a[j]);
	child_out:
		free(pt.a);
		free(pe.a);
		free(dt.a);
		free(de.a);
		if (rc)
			return rc;
	}
	for (size_t i = 0; i < n; i++) {
		if (ops[i].type != MVCC_OP_PUT)
			continue;
		const struct mvcc_put_req *p = &ops[i].u.put;
		if (kset_has(puts, p->key, p->key_len) || ivset_hit(dels, p->key, p->key_len))
			return MVCC_EDUPLICATE_KEY;
		if ((rc = kset_add(puts, p->key, p->key_len)))
			return rc;
	}
	return 0;
}

static int check_branch_intervals(const struct mvcc_op *ops, size_t n)
{
	struct kset puts = {0};
	struct ivset dels = {0};
	int rc = check_intervals(ops, n, &puts, &dels);
	free(puts.a);
	free(dels.a);
	return rc;
}

/* ------------------------------------------------------------- compares */

static int cmp_i64(int64_t a, int64_t b)
{
	return a < b ? -1 : a > b;
}

/* etcd's compareKV; v NULL is the zero KeyValue. */
static bool compare_kv(const struct mvcc_compare *c, const struct mvcc__ver *v)
{
	int r = 0;
	switch (c->target) {
	case MVCC_TARGET_VALUE:
		r = mvcc__bytes_cmp(v ? v->value : NULL, v ? v->vlen : 0, c->value,
				    c->value_len);
		break;
	case MVCC_TARGET_CREATE:
		r = cmp_i64(v ? v->create : 0, c->number);
		break;
	case MVCC_TARGET_MOD:
		r = cmp_i64(v ? v->main : 0, c->number);
		break;
	case MVCC_TARGET_VERSION:
		r = cmp_i64(v ? v->version : 0, c->number);
		break;
	case MVCC_TARGET_LEASE:
		r = cmp_i64(v ? v->lease : 0, c->number);
		break;
	}
	switch (c->result) {
	case MVCC_CMP_EQUAL:
		return r == 0;
	case MVCC_CMP_NOT_EQUAL:
		return r != 0;
	case MVCC_CMP_GREATER:
		return r > 0;
	case MVCC_CMP_LESS:
		return r < 0;
	}
	return true;
}

/* etcd's applyCompare, against the latest state. */
static bool compare_eval(const struct mvcc_store *s, const struct mvcc_compare *c)
{
	struct span sp;
	struct scan sc;
	bool any = false;
	span_init(&sp, c->key, c->key_len, c->range_end, c->range_end_len);
	for (struct mvcc__key *k = scan_first(&sc, s, &sp); k; k = scan_next(&sc)) {
		const struct mvcc__ver *v = live_latest(k);
		if (!v)
			continue;
		any = true;
		if (!compare_kv(c, v))
			return false;
	}
	if (!any)
		return c->target != MVCC_TARGET_VALUE && compare_kv(c, NULL);
	return true;
}

/*
 * etcd's compareToPath: the outcome of every txn on the chosen path, in
 * pre-order, all evaluated against the state before the request.
 */
struct path {
	bool *a;
	size_t n, cap, pos;
};

static int compare_to_path(const struct mvcc_store *s, const struct mvcc_txn_req *t,
			   struct path *p)
{
	bool ok = true;
	for (size_t i = 0; i < t->ncompare && ok; i++)
		ok = compare_eval(s, &t->compare[i]);
	int rc = grow((void **)&p->a, &p->cap, p->n + 1, sizeof(*p->a));
	if (rc)
		return rc;
	p->a[p->n++] = ok;
	const struct mvcc_op *ops = ok ? t->success : t->failure;
	size_t n = ok ? t->nsuccess : t->nfailure;
	for (size_t i = 0; i < n; i++) {
		if (ops[i].type != MVCC_OP_TXN)
			continue;
		if ((rc = compare_to_path(s, &ops[i].u.txn, p)))
			return rc;
	}
	return 0;
}

static int check_range_rev(const struct mvcc_store *s, int64_t rev)
{
	if (rev > s->rev)
		return MVCC_EFUTURE_REV;
	if (rev > 0 && rev < s->compact_rev)
		return MVCC_ECOMPACTED;
	return 0;
}

static int check_put_state(const struct mvcc_store *s, const struct mvcc_put_req *p)
{
	if ((p->ignore_value || p->ignore_lease) &&
	    !live_latest(find_key(s, p->key, p->key_len)))
		return MVCC_EKEY_NOT_FOUND;
	if (p->lease && !lease_exists(s->leases, p->lease))
		return MVCC_ELEASE_NOT_FOUND;
	return 0;
}

/* etcd's checkTxn: the ops on the chosen path against the state before. */
static int precheck_txn(const struct mvcc_store *s, const struct mvcc_txn_req *t,
			struct path *p)
{
	bool ok = p->a[p->pos++];
	const struct mvcc_op *ops = ok ? t->success : t->failure;
	size_t n = ok ? t->nsuccess : t->nfailure;
	for (size_t i = 0; i < n; i++) {
		int rc = 0;
		switch (ops[i].type) {
		case MVCC_OP_RANGE:
			rc = check_range_rev(s, ops[i].u.range.revision);
			break;
		case MVCC_OP_PUT:
			rc = check_put_state(s, &ops[i].u.put);
			break;
		case MVCC_OP_TXN:
			rc = precheck_txn(s, &ops[i].u.txn, p);
			break;
		}
		if (rc)
			return rc;
	}
	return 0;
}

/* ------------------------------------------------------------- write txn */

struct mvcc__undo {
	struct mvcc__key *k;
	bool created;
};

/* A lease attachment change, applied at commit. node NULL: detach. */
struct mvcc__lop {
	int64_t lease;
	struct mvcc__key *k;
	struct lease__key *node;
};

struct tx {
	struct mvcc_store *s;
	struct mvcc__blk **arena;
	struct path *path;
	int64_t rev; /* the main revision the writes get */
	uint32_t sub;
	struct mvcc__undo *undo;
	size_t nundo, capundo;
	struct mvcc__lop *lops;
	size_t nlops, caplops;
	/* counters to restore on rollback */
	size_t rl_count0;
	uint64_t db_size0, nversions0, nlive0, value_bytes0;
};

static void tx_begin(struct tx *x, struct mvcc_store *s, struct mvcc__blk **arena,
		     struct path *p)
{
	memset(x, 0, sizeof(*x));
	x->s = s;
	x->arena = arena;
	x->path = p;
	x->rev = s->rev + 1;
	x->rl_count0 = s->rl_len - s->rl_head;
	x->db_size0 = s->db_size;
	x->nversions0 = s->nversions;
	x->nlive0 = s->nlive;
	x->value_bytes0 = s->value_bytes;
}

/* Room for n more versions (undo entries, revision log, lease changes). */
static int tx_reserve(struct tx *x, size_t n, size_t nlops)
{
	int rc = grow((void **)&x->undo, &x->capundo, x->nundo + n, sizeof(*x->undo));
	if (!rc)
		rc = grow((void **)&x->lops, &x->caplops, x->nlops + nlops,
			  sizeof(*x->lops));
	if (!rc)
		rc = rl_reserve(x->s, n);
	return rc;
}

/* Append a version; everything it needs was reserved. */
static void tx_push(struct tx *x, struct mvcc__key *k, const struct mvcc__ver *v,
		    bool created)
{
	struct mvcc_store *s = x->s;
	k->hist[k->nhist++] = *v;
	s->rl[s->rl_len++] = (struct mvcc__rent){v->main, k, v->sub};
	x->undo[x->nundo++] = (struct mvcc__undo){k, created};
	s->db_size += ver_size(k, v);
	s->nversions++;
	s->value_bytes += v->vlen;
}

static void tx_lop(struct tx *x, int64_t lease, struct mvcc__key *k,
		   struct lease__key *node)
{
	x->lops[x->nlops++] = (struct mvcc__lop){lease, k, node};
}

static void tx_end(struct tx *x)
{
	free(x->undo);
	free(x->lops);
	x->undo = NULL;
	x->lops = NULL;
}

static void tx_rollback(struct tx *x)
{
	struct mvcc_store *s = x->s;
	for (size_t i = x->nundo; i-- > 0;) {
		struct mvcc__key *k = x->undo[i].k;
		free(k->hist[--k->nhist].value);
		if (x->undo[i].created) {
			struct mvcc__bytes b = {k->key, k->klen};
			avl_remove(&s->keys, &b);
			key_free(s, k);
		}
	}
	s->rl_len = s->rl_head + x->rl_count0;
	s->db_size = x->db_size0;
	s->nversions = x->nversions0;
	s->nlive = x->nlive0;
	s->value_bytes = x->value_bytes0;
	for (size_t i = 0; i < x->nlops; i++)
		lease__key_free(x->lops[i].node);
	tx_end(x);
}

/* Cannot fail: the attachment records were allocated by the steps. */
static void tx_commit(struct tx *x)
{
	struct mvcc_store *s = x->s;
	for (size_t i = 0; i < x->nlops; i++) {
		struct mvcc__lop *l = &x->lops[i];
		if (l->node) {
			if (lease__attach(s->leases, l->lease, l->node) != 0)
				lease__key_free(l->node);
		} else {
			lease__detach(s->leases, l->lease, l->k->key, l->k->klen);
		}
	}
	if (x->nundo)
		s->rev = x->rev;
	tx_end(x);
}

struct ref {
	const struct mvcc__key *k;
	const struct mvcc__ver *v;
};

static int ref_cmp(const struct ref *a, const struct ref *b, int target)
{
	switch (target) {
	case MVCC_SORT_VERSION:
		return cmp_i64(a->v->version, b->v->version);
	case MVCC_SORT_CREATE:
		return cmp_i64(a->v->create, b->v->create);
	case MVCC_SORT_MOD:
		return cmp_i64(a->v->main, b->v->main);
	case MVCC_SORT_VALUE:
		return mvcc__bytes_cmp(a->v->value, a->v->vlen, b->v->value, b->v->vlen);
	default:
		return mvcc__bytes_cmp(a->k->key, a->k->klen, b->k->key, b->k->klen);
	}
}

/* Stable merge sort; dir -1 sorts descending (ties keep key order). */
static void ref_sort(struct ref *a, struct ref *tmp, size_t n, int target, int dir)
{
	if (n < 2)
		return;
	size_t h = n / 2;
	ref_sort(a, tmp, h, target, dir);
	ref_sort(a + h, tmp, n - h, target, dir);
	size_t i = 0, j = h, o = 0;
	while (i < h && j < n) {
		if (ref_cmp(&a[i], &a[j], target) * dir <= 0)
			tmp[o++] = a[i++];
		else
			tmp[o++] = a[j++];
	}
	while (i < h)
		tmp[o++] = a[i++];
	while (j < n)
		tmp[o++] = a[j++];
	memcpy(a, tmp, n * sizeof(*a));
}

/* etcd's Range apply (kvstore rangeKeys + the server's filter/sort/limit). */
static int tx_range(struct tx *x, const struct mvcc_range_req *r,
		    struct mvcc_range_resp *out)
{
	struct mvcc_store *s = x->s;
	int rc = check_range_rev(s, r->revision);
	if (rc)
		return rc;
	int64_t at = r->revision > 0 ? r->revision : INT64_MAX;
	struct span sp;
	struct scan sc;
	span_init(&sp, r->key, r->key_len, r->range_end, r->range_end_len);

	if (r->count_only) {
		int64_t count = 0;
		for (struct mvcc__key *k = scan_first(&sc, s, &sp); k; k = scan_next(&sc))
			count += live_at(k, at) != NULL;
		out->count = count;
		return 0;
	}

	bool filters = r->min_mod_revision || r->max_mod_revision ||
		       r->min_create_revision || r->max_create_revision;
	int64_t lim = r->limit;
	if (r->sort_order != MVCC_SORT_NONE || filters)
		lim = 0; /* fetch everything; sort and truncate afterwards */
	if (lim > 0 && lim < INT64_MAX)
		lim++; /* one extra for 'more' */

	struct ref *refs = NULL, *tmp = NULL;
	size_t n = 0, cap = 0;
	int64_t count = 0;
	for (struct mvcc__key *k = scan_first(&sc, s, &sp); k; k = scan_next(&sc)) {
		const struct mvcc__ver *v = live_at(k, at);
		if (!v)
			continue;
		count++;
		if (lim > 0 && (int64_t)n >= lim)
			continue;
		if ((rc = grow((void **)&refs, &cap, n + 1, sizeof(*refs))))
			goto out;
		refs[n++] = (struct ref){k, v};
	}
	if (filters) {
		size_t m = 0;
		for (size_t i = 0; i < n; i++) {
			const struct mvcc__ver *v = refs[i].v;
			if (r->max_mod_revision && v->main > r->max_mod_revision)
				continue;
			if (r->min_mod_revision && v->main < r->min_mod_revision)
				continue;
			if (r->max_create_revision && v->create > r->max_create_revision)
				continue;
			if (r->min_create_revision && v->create < r->min_create_revision)
				continue;
			refs[m++] = refs[i];
		}
		n = m;
	}
	int order = sort_order_of(r);
	if (r->sort_target == MVCC_SORT_KEY && order == MVCC_SORT_ASCEND)
		order = MVCC_SORT_NONE; /* the index order is by key */
	if (order != MVCC_SORT_NONE && n > 1) {
		tmp = malloc(n * sizeof(*tmp));
		if (!tmp) {
			rc = -ENOMEM;
			goto out;
		}
		ref_sort(refs, tmp, n, r->sort_target, order == MVCC_SORT_DESCEND ? -1 : 1);
	}
	if (r->limit > 0 && (int64_t)n > r->limit) {
		n = (size_t)r->limit;
		out->more = true;
	}
	out->count = count;
	if (n) {
		out->kvs = arena_alloc(x->arena, n * sizeof(*out->kvs));
		if (!out->kvs) {
			rc = -ENOMEM;
			goto out;
		}
		for (size_t i = 0; i < n; i++)
			if ((rc = kv_copy(x->arena, &out->kvs[i], refs[i].k, refs[i].v,
					  !r->keys_only)))
				goto out;
		out->nkvs = n;
	}
out:
	free(tmp);
	free(refs);
	return rc;
}

static int tx_put(struct tx *x, const struct mvcc_put_req *p, struct mvcc_put_resp *out)
{
	struct mvcc_store *s = x->s;
	struct mvcc__key *k = find_key(s, p->key, p->key_len);
	const struct mvcc__ver *cur = live_latest(k);
	if ((p->ignore_value || p->ignore_lease) && !cur)
		return MVCC_EKEY_NOT_FOUND;
	int64_t lease = p->ignore_lease ? cur->lease : p->lease;
	if (!p->ignore_lease && lease && !lease_exists(s->leases, lease))
		return MVCC_ELEASE_NOT_FOUND;
	int rc;
	if (p->prev_kv && cur) {
		if ((rc = kv_copy(x->arena, &out->prev_kv, k, cur, true)))
			return rc;
		out->has_prev_kv = true;
	}
	/* Take what we need from cur: reserving may move the history. */
	bool existed = cur != NULL;
	int64_t old_lease = cur ? cur->lease : 0;
	const char *val = p->ignore_value ? cur->value : p->value;
	size_t vlen = p->ignore_value ? cur->vlen : p->value_len;
	struct mvcc__ver nv = {
		.main = x->rev,
		.create = cur ? cur->create : x->rev,
		.version = cur ? cur->version + 1 : 1,
		.lease = lease,
		.vlen = (uint32_t)vlen,
		.sub = x->sub,
	};
	bool created = k == NULL;
	struct lease__key *ln = NULL;
	if ((rc = tx_reserve(x, 1, 2)))
		return rc;
	if (vlen) {
		nv.value = malloc(vlen);
		if (!nv.value)
			return -ENOMEM;
		memcpy(nv.value, val, vlen);
	}
	if (lease && lease != old_lease &&
	    (rc = lease__key_new(p->key, p->key_len, &ln)))
		goto fail_value;
	if (created && !(k = key_alloc(s, p->key, p->key_len))) {
		rc = -ENOMEM;
		goto fail_lease;
	}
	if ((rc = hist_reserve(s, k, 1)))
		goto fail_key;

	if (created) {
		struct mvcc__bytes b = {k->key, k->klen};
		avl_insert(&s->keys, &b, &k->node);
	}
	x->sub++;
	tx_push(x, k, &nv, created);
	if (!existed)
		s->nlive++;
	if (lease != old_lease) {
		if (old_lease)
			tx_lop(x, old_lease, k, NULL);
		if (lease)
			tx_lop(x, lease, k, ln);
	}
	return 0;

fail_key:
	if (created)
		key_free(s, k);
fail_lease:
	lease__key_free(ln);
fail_value:
	free(nv.value);
	return rc;
}

static int tx_delete(struct tx *x, const struct mvcc_delete_req *d,
		     struct mvcc_delete_resp *out)
{
	struct mvcc_store *s = x->s;
	struct span sp;
	struct scan sc;
	struct mvcc__key **ks = NULL;
	size_t n = 0, cap = 0;
	int rc = 0;
	span_init(&sp, d->key, d->key_len, d->range_end, d->range_end_len);
	for (struct mvcc__key *k = scan_first(&sc, s, &sp); k; k = scan_next(&sc)) {
		if (!live_latest(k))
			continue;
		if ((rc = grow((void **)&ks, &cap, n + 1, sizeof(*ks))))
			goto out;
		ks[n++] = k;
	}
	out->deleted = (int64_t)n;
	if (!n)
		goto out;
	if ((rc = tx_reserve(x, n, n)))
		goto out;
	for (size_t i = 0; i < n; i++)
		if ((rc = hist_reserve(s, ks[i], 1)))
			goto out;
	if (d->prev_kv) {
		out->prev_kvs = arena_alloc(x->arena, n * sizeof(*out->prev_kvs));
		if (!out->prev_kvs) {
			rc = -ENOMEM;
			goto out;
		}
		for (size_t i = 0; i < n; i++)
			if ((rc = kv_copy(x->arena, &out->prev_kvs[i], ks[i],
					  live_latest(ks[i]), true)))
				goto out;
		out->nprev_kvs = n;
	}
	for (size_t i = 0; i < n; i++) {
		int64_t old_lease = live_latest(ks[i])->lease;
		struct mvcc__ver tomb = {.main = x->rev, .sub = x->sub++};
		tx_push(x, ks[i], &tomb, false);
		s->nlive--;
		if (old_lease)
			tx_lop(x, old_lease, ks[i], NULL);
	}
out:
	free(ks);
	return rc;
}

static int exec_txn(struct tx *x, const struct mvcc_txn_req *t,
		    struct mvcc_txn_resp *out);

static int exec_op(struct tx *x, const struct mvcc_op *op, struct mvcc_op_resp *out)
{
	int rc;

	out->type = op->type;
	switch (op->type) {
	case MVCC_OP_RANGE:
		rc = tx_range(x, &op->u.range, &out->u.range);
		break;
	case MVCC_OP_PUT:
		rc = tx_put(x, &op->u.put, &out->u.put);
		break;
	case MVCC_OP_DELETE_RANGE:
		rc = tx_delete(x, &op->u.del, &out->u.del);
		break;
	case MVCC_OP_TXN:
		rc = exec_txn(x, &op->u.txn, &out->u.txn);
		break;
	default:
		return MVCC_EKEY_NOT_FOUND;
	}
	/* etcd's storeTxnWrite: reads see beginRev, or beginRev + 1 once
	 * the txn changed something; a write answers beginRev + 1. */
	out->revision = x->nundo ? x->rev : x->s->rev;
	return rc;
}

static int exec_txn(struct tx *x, const struct mvcc_txn_req *t,
		    struct mvcc_txn_resp *out)
{
	bool ok = x->path->a[x->path->pos++];
	const struct mvcc_op *ops = ok ? t->success : t->failure;
	size_t n = ok ? t->nsuccess : t->nfailure;
	out->succeeded = ok;
	if (!n)
		return 0;
	out->responses = arena_alloc(x->arena, n * sizeof(*out->responses));
	if (!out->responses)
		return -ENOMEM;
	memset(out->responses, 0, n * sizeof(*out->responses));
	out->nresponses = n;
	for (size_t i = 0; i < n; i++) {
		int rc = exec_op(x, &ops[i], &out->responses[i]);
		if (rc)
			return rc;
	}
	return 0;
}

int mvcc_apply(struct mvcc_store *s, const struct mvcc_op *op, struct mvcc_result *out)
{
	memset(out, 0, sizeof(*out));
	int rc = check_op(op, s->max_txn_ops);
	if (rc)
		return rc;
	struct path path = {0};
	struct tx x;
	if (op->type == MVCC_OP_TXN) {
		const struct mvcc_txn_req *t = &op->u.txn;
		if ((rc = check_branch_intervals(t->success, t->nsuccess)) ||
		    (rc = check_branch_intervals(t->failure, t->nfailure)))
			return rc;
		if ((rc = compare_to_path(s, t, &path)))
			goto fail_path;
		if ((rc = precheck_txn(s, t, &path)))
			goto fail_path;
		path.pos = 0;
	}
	tx_begin(&x, s, &out->arena, &path);
	if ((rc = exec_op(&x, op, &out->resp)))
		goto fail_tx;
	tx_commit(&x);
	free(path.a);
	out->revision = s->rev;
	return 0;

fail_tx:
	tx_rollback(&x);
fail_path:
	free(path.a);
	mvcc_result_free(out);
	return rc;
}

int mvcc_lease_revoke(struct mvcc_store *s, int64_t id, int64_t *revision_out)
{
	struct lease_key_ref *refs = NULL;
	struct mvcc__key **ks = NULL;
	size_t n = 0, nk = 0;
	struct tx x;
	int rc = lease__keys(s->leases, id, &refs, &n);
	if (rc)
		return rc;
	tx_begin(&x, s, NULL, NULL);
	ks = malloc((n ? n : 1) * sizeof(*ks));
	if (!ks) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		struct mvcc__key *k = find_key(s, refs[i].key, refs[i].len);
		const struct mvcc__ver *v = live_latest(k);
		if (v && v->lease == id)
			ks[nk++] = k;
	}
	if ((rc = tx_reserve(&x, nk, 0)))
		goto out;
	for (size_t i = 0; i < nk; i++)
		if ((rc = hist_reserve(s, ks[i], 1)))
			goto out;
	for (size_t i = 0; i < nk; i++) {
		struct mvcc__ver tomb = {.main = x.rev, .sub = x.sub++};
		tx_push(&x, ks[i], &tomb, false);
		s->nlive--;
	}
	free(refs); /* borrowed from the lease, which goes now */
	refs = NULL;
	lease__remove(s->leases, id);
	tx_commit(&x);
	if (revision_out)
		*revision_out = s->rev;
out:
	tx_end(&x);
	free(ks);
	free(refs);
	return rc;
}

/* ------------------------------------------------------------- compaction */

/* Index of version (main, sub) in k's history. */
static uint32_t hist_index(const struct mvcc__key *k, int64_t main, uint32_t sub)
{
	uint32_t lo = 0, hi = k->nhist;
	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;
		const struct mvcc__ver *v = &k->hist[mid];
		if (v->main < main || (v->main == main && v->sub < sub))
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* Drop the n oldest versions of k (the key node stays). */
static void drop_oldest(struct mvcc_store *s, struct mvcc__key *k, uint32_t n)
{
	for (uint32_t d = 0; d < n; d++) {
		s->db_size -= ver_size(k, &k->hist[d]);
		s->value_bytes -= k->hist[d].vlen;
		free(k->hist[d].value);
	}
	s->nversions -= n;
	k->nhist -= n;
	memmove(k->hist, k->hist + n, k->nhist * sizeof(*k->hist));
}

int mvcc_compact(struct mvcc_store *s, int64_t rev)
{
	if (rev <= s->compact_rev)
		return MVCC_ECOMPACTED;
	if (rev > s->rev)
		return MVCC_EFUTURE_REV;
	s->compact_rev = rev;
	size_t i = s->rl_head;
	for (; i < s->rl_len && s->rl[i].main < rev; i++) {
		struct mvcc__key *k = s->rl[i].key;
		uint32_t j = hist_index(k, s->rl[i].main, s->rl[i].sub);
		if (j + 1 < k->nhist && k->hist[j + 1].main < rev)
			continue; /* not the key's newest version below rev */
		/* Drop everything before j; j too when it is a tombstone or a
		 * version at exactly rev supersedes it. */
		uint32_t drop = j;
		if (!ver_live(&k->hist[j]) || (j + 1 < k->nhist && k->hist[j + 1].main == rev))
			drop = j + 1;
		drop_oldest(s, k, drop);
		if (k->nhist == 0) {
			struct mvcc__bytes b = {k->key, k->klen};
			avl_remove(&s->keys, &b);
			key_free(s, k);
		} else if (k->caphist > 2 * k->nhist) {
			void *p = realloc(k->hist, k->nhist * sizeof(*k->hist));
			if (p) {
				k->hist = p;
				s->hist_slots -= k->caphist - k->nhist;
				k->caphist = k->nhist;
			}
		}
	}
	/* A version at exactly rev supersedes every older one of its key,
	 * also those an earlier compaction kept (their log entries are
	 * gone, so the walk above did not see them). */
	for (size_t e = i; e < s->rl_len && s->rl[e].main == rev; e++) {
		struct mvcc__key *k = s->rl[e].key;
		drop_oldest(s, k, hist_index(k, rev, 0));
	}
	s->rl_base += i - s->rl_head;
	s->rl_head = i;
	size_t live = s->rl_len - s->rl_head;
	if (s->rl_head > live) {
		memmove(s->rl, s->rl + s->rl_head, live * sizeof(*s->rl));
		s->rl_len = live;
		s->rl_head = 0;
	}
	return 0;
}

/* ------------------------------------------------------------- history */

int mvcc_hist_seek(const struct mvcc_store *s, int64_t rev, uint64_t *pos)
{
	if (rev < s->compact_rev)
		return MVCC_ECOMPACTED;
	size_t lo = s->rl_head, hi = s->rl_len;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (s->rl[mid].main < rev)
			lo = mid + 1;
		else
			hi = mid;
	}
	*pos = s->rl_base + (lo - s->rl_head);
	return 0;
}

uint64_t mvcc_hist_end(const struct mvcc_store *s)
{
	return s->rl_base + (s->rl_len - s->rl_head);
}

int mvcc_hist_event(const struct mvcc_store *s, uint64_t pos, struct mvcc_event *ev)
{
	if (pos < s->rl_base)
		return MVCC_ECOMPACTED;
	if (pos >= mvcc_hist_end(s))
		return -ENOENT;
	const struct mvcc__rent *e = &s->rl[s->rl_head + (pos - s->rl_base)];
	const struct mvcc__key *k = e->key;
	uint32_t j = hist_index(k, e->main, e->sub);
	if (j >= k->nhist || k->hist[j].main != e->main || k->hist[j].sub != e->sub)
		return MC_EINTERNAL; /* the log and the history disagree: a bug */
	const struct mvcc__ver *v = &k->hist[j];
	memset(ev, 0, sizeof(*ev));
	if (ver_live(v)) {
		ev->type = MVCC_EVENT_PUT;
		kv_borrow(&ev->kv, k, v);
	} else {
		ev->type = MVCC_EVENT_DELETE;
		ev->kv.key = k->key;
		ev->kv.key_len = k->klen;
		ev->kv.value = mvcc__empty;
		ev->kv.mod_revision = v->main;
	}
	if (j > 0 && ver_live(&k->hist[j - 1])) {
		ev->has_prev_kv = true;
		kv_borrow(&ev->prev_kv, k, &k->hist[j - 1]);
	}
	return 0;
}

/* ------------------------------------------------------------- versions */

struct vref {
	const struct mvcc__key *k;
	uint32_t i; /* index in k->hist */
};

static int vref_cmp(const void *a, const void *b)
{
	const struct mvcc__ver *x = &((const struct vref *)a)->k->hist[((const struct vref *)a)->i];
	const struct mvcc__ver *y = &((const struct vref *)b)->k->hist[((const struct vref *)b)->i];
	if (x->main != y->main)
		return x->main < y->main ? -1 : 1;
	return x->sub < y->sub ? -1 : x->sub > y->sub;
}

int mvcc_versions(const struct mvcc_store *s,
		  int (*fn)(void *ctx, const struct mvcc_version *v), void *ctx)
{
	struct vref *refs = NULL;
	size_t n = 0, cap = 0;
	struct avl_iter it;
	int rc = 0;

	for (struct avl_node *x = avl_seek(&it, &s->keys, NULL); x;
	     x = avl_next(&it)) {
		const struct mvcc__key *k = key_of(x);
		if ((rc = grow((void **)&refs, &cap, n + k->nhist, sizeof(*refs))))
			goto out;
		for (uint32_t i = 0; i < k->nhist; i++)
			refs[n++] = (struct vref){k, i};
	}
	if (n > 1)
		qsort(refs, n, sizeof(*refs), vref_cmp);
	for (size_t j = 0; j < n && !rc; j++) {
		const struct mvcc__key *k = refs[j].k;
		uint32_t i = refs[j].i;
		const struct mvcc__ver *v = &k->hist[i];
		struct mvcc_version out = {
			.main = v->main,
			.sub = v->sub,
			.tombstone = !ver_live(v),
			.next_main = i + 1 < k->nhist ? k->hist[i + 1].main : INT64_MAX,
		};
		if (out.tombstone) {
			out.kv.key = k->key;
			out.kv.key_len = k->klen;
			out.kv.value = mvcc__empty;
			out.kv.mod_revision = v->main;
		} else {
			kv_borrow(&out.kv, k, v);
		}
		rc = fn(ctx, &out);
	}
out:
	free(refs);
	return rc;
}

/* ------------------------------------------------------------- snapshot */

#define SNAP_MAGIC "MCMVCCSN"
#define SNAP_VERSION 1u
#define SNAP_CHUNK 65536
#define SNAP_HEADER_LEN (8 + 4 + 4 + 8 * 5)
#define SNAP_LEASE_LEN 24
#define SNAP_VER_MIN_LEN 41 /* i64 u32 u8 i64 i64 i64 u32 */
#define SNAP_KEY_MIN_LEN (4 + 1 + 4 + SNAP_VER_MIN_LEN)

struct enc {
	unsigned char *buf;
	size_t len;
	uint32_t crc;
	mvcc_write_fn fn;
	void *ctx;
	int err;
};

static void enc_flush(struct enc *e)
{
	if (!e->err && e->len)
		e->err = e->fn(e->ctx, e->buf, e->len);
	e->len = 0;
}

static void enc_raw(struct enc *e, const void *data, size_t n)
{
	const unsigned char *p = data;
	while (n && !e->err) {
		size_t c = SNAP_CHUNK - e->len;
		if (c > n)
			c = n;
		memcpy(e->buf + e->len, p, c);
		e->len += c;
		p += c;
		n -= c;
		if (e->len == SNAP_CHUNK)
			enc_flush(e);
	}
}

static void enc_bytes(struct enc *e, const void *data, size_t n)
{
	if (!n)
		return;
	e->crc = crc32c(e->crc, data, n);
	enc_raw(e, data, n);
}

static void enc_u8(struct enc *e, uint8_t v)
{
	enc_bytes(e, &v, 1);
}

static void enc_u32(struct enc *e, uint32_t v)
{
	unsigned char b[4];
	for (int i = 0; i < 4; i++)
		b[i] = (unsigned char)(v >> (8 * i));
	enc_bytes(e, b, 4);
}

static void enc_u64(struct enc *e, uint64_t v)
{
	unsigned char b[8];
	for (int i = 0; i < 8; i++)
		b[i] = (unsigned char)(v >> (8 * i));
	enc_bytes(e, b, 8);
}

static void enc_i64(struct enc *e, int64_t v)
{
	enc_u64(e, (uint64_t)v);
}

static int enc_lease(void *ctx, int64_t id, int64_t ttl_s, int64_t remaining_ttl_s)
{
	struct enc *e = ctx;
	enc_i64(e, id);
	enc_i64(e, ttl_s);
	enc_i64(e, remaining_ttl_s);
	return e->err;
}

int mvcc_snapshot(const struct mvcc_store *s, mvcc_write_fn on_chunk, void *ctx)
{
	struct enc e = {.fn = on_chunk, .ctx = ctx};
	e.buf = malloc(SNAP_CHUNK);
	if (!e.buf)
		return -ENOMEM;
	enc_bytes(&e, SNAP_MAGIC, 8);
	enc_u32(&e, SNAP_VERSION);
	enc_u32(&e, 0);
	enc_i64(&e, s->rev);
	enc_i64(&e, s->compact_rev);
	enc_i64(&e, lease__next_id(s->leases));
	enc_u64(&e, lease_count(s->leases));
	enc_u64(&e, s->keys.count);
	(void)lease__foreach(s->leases, enc_lease, &e);
	struct avl_iter it;
	for (struct mvcc__key *k = key_of(avl_seek(&it, &s->keys, NULL));
	     k && !e.err; k = key_of(avl_next(&it))) {
		enc_u32(&e, k->klen);
		enc_bytes(&e, k->key, k->klen);
		enc_u32(&e, k->nhist);
		for (uint32_t i = 0; i < k->nhist; i++) {
			const struct mvcc__ver *v = &k->hist[i];
			enc_i64(&e, v->main);
			enc_u32(&e, v->sub);
			enc_u8(&e, !ver_live(v));
			enc_i64(&e, v->create);
			enc_i64(&e, v->version);
			enc_i64(&e, v->lease);
			enc_u32(&e, v->vlen);
			enc_bytes(&e, v->value, v->vlen);
		}
	}
	unsigned char trailer[4];
	for (int i = 0; i < 4; i++)
		trailer[i] = (unsigned char)(e.crc >> (8 * i));
	enc_raw(&e, trailer, 4);
	enc_flush(&e);
	free(e.buf);
	return e.err;
}

struct dec {
	const unsigned char *p;
	size_t left;
};

static bool dec_take(struct dec *d, size_t n, const unsigned char **out)
{
	if (d->left < n)
		return false;
	*out = d->p;
	d->p += n;
	d->left -= n;
	return true;
}

static bool dec_u32(struct dec *d, uint32_t *v)
{
	const unsigned char *b;
	if (!dec_take(d, 4, &b))
		return false;
	*v = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
	     (uint32_t)b[3] << 24;
	return true;
}

static bool dec_u64(struct dec *d, uint64_t *v)
{
	const unsigned char *b;
	if (!dec_take(d, 8, &b))
		return false;
	*v = 0;
	for (int i = 7; i >= 0; i--)
		*v = *v << 8 | b[i];
	return true;
}

static bool dec_i64(struct dec *d, int64_t *v)
{
	uint64_t u;
	if (!dec_u64(d, &u))
		return false;
	*v = (int64_t)u;
	return true;
}

static int rent_cmp(const void *a, const void *b)
{
	const struct mvcc__rent *x = a, *y = b;
	if (x->main != y->main)
		return x->main < y->main ? -1 : 1;
	return x->sub < y->sub ? -1 : x->sub > y->sub;
}

/* One key record; links the key into s on success and makes it *prev
 * (keys must come in strictly ascending order). */
static int restore_key(struct mvcc_store *s, struct dec *d,
		       const struct mvcc__key **prev)
{
	uint32_t klen, nver;
	const unsigned char *kb;
	if (!dec_u32(d, &klen) || klen == 0 || !dec_take(d, klen, &kb))
		return MVCC_ESNAPSHOT_CORRUPT;
	if (*prev && mvcc__bytes_cmp((*prev)->key, (*prev)->klen, kb, klen) >= 0)
		return MVCC_ESNAPSHOT_CORRUPT;
	if (!dec_u32(d, &nver) || nver == 0 || nver > d->left / SNAP_VER_MIN_LEN)
		return MVCC_ESNAPSHOT_CORRUPT;
	struct mvcc__key *k = key_alloc(s, (const char *)kb, klen);
	if (!k)
		return -ENOMEM;
	int rc = hist_reserve(s, k, nver);
	if (rc)
		goto fail;
	rc = MVCC_ESNAPSHOT_CORRUPT;
	for (uint32_t i = 0; i < nver; i++) {
		struct mvcc__ver v = {0};
		uint32_t sub, vlen;
		const unsigned char *tb, *vb;
		int64_t create, version, lease;
		if (!dec_i64(d, &v.main) || !dec_u32(d, &sub) || !dec_take(d, 1, &tb) ||
		    !dec_i64(d, &create) || !dec_i64(d, &version) ||
		    !dec_i64(d, &lease) || !dec_u32(d, &vlen) ||
		    !dec_take(d, vlen, &vb))
			goto fail;
		v.sub = sub;
		if (v.main < 1 || v.main > s->rev || tb[0] > 1)
			goto fail;
		if (i > 0) {
			const struct mvcc__ver *p = &k->hist[i - 1];
			if (p->main > v.main || (p->main == v.main && p->sub >= v.sub))
				goto fail;
		}
		if (tb[0]) { /* tombstone */
			if (create || version || lease || vlen)
				goto fail;
		} else if (create < 1 || create > v.main || version < 1) {
			goto fail;
		}
		if (v.main < s->compact_rev && (i > 0 || tb[0]))
			goto fail; /* compaction keeps one live version below */
		v.create = create;
		v.version = version;
		v.lease = lease;
		v.vlen = vlen;
		if (vlen) {
			v.value = malloc(vlen);
			if (!v.value) {
				rc = -ENOMEM;
				goto fail;
			}
			memcpy(v.value, vb, vlen);
		}
		k->hist[k->nhist++] = v;
		s->db_size += ver_size(k, &v);
		s->value_bytes += vlen;
		s->nversions++;
	}
	const struct mvcc__ver *last = live_latest(k);
	if (last && last->lease) {
		struct lease__key *lk;
		if (!lease_exists(s->leases, last->lease))
			goto fail; /* a live key on a lease that is gone */
		if ((rc = lease__key_new(k->key, k->klen, &lk)))
			goto fail;
		if (lease__attach(s->leases, last->lease, lk) != 0) {
			lease__key_free(lk);
			rc = MVCC_ESNAPSHOT_CORRUPT;
			goto fail;
		}
	}
	s->nlive += last != NULL;
	struct mvcc__bytes b = {k->key, k->klen};
	avl_insert(&s->keys, &b, &k->node);
	*prev = k;
	return 0;
fail:
	for (uint32_t i = 0; i < k->nhist; i++) {
		s->db_size -= ver_size(k, &k->hist[i]);
		s->value_bytes -= k->hist[i].vlen;
	}
	s->nversions -= k->nhist;
	key_free(s, k);
	return rc;
}

static int restore_revlog(struct mvcc_store *s)
{
	size_t n = 0;
	struct avl_iter it;
	for (struct mvcc__key *k = key_of(avl_seek(&it, &s->keys, NULL)); k;
	     k = key_of(avl_next(&it)))
		for (uint32_t i = 0; i < k->nhist; i++)
			n += k->hist[i].main >= s->compact_rev;
	int rc = rl_reserve(s, n);
	if (rc)
		return rc;
	for (struct mvcc__key *k = key_of(avl_seek(&it, &s->keys, NULL)); k;
	     k = key_of(avl_next(&it)))
		for (uint32_t i = 0; i < k->nhist; i++)
			if (k->hist[i].main >= s->compact_rev)
				s->rl[s->rl_len++] = (struct mvcc__rent){
					k->hist[i].main, k, k->hist[i].sub};
	/* (main, sub) pairs are unique, so the order is fully determined. */
	if (s->rl_len > 1)
		qsort(s->rl, s->rl_len, sizeof(*s->rl), rent_cmp);
	for (size_t i = 1; i < s->rl_len; i++)
		if (!rent_cmp(&s->rl[i - 1], &s->rl[i]))
			return MVCC_ESNAPSHOT_CORRUPT;
	return 0;
}

int mvcc_restore(const struct mvcc_options *opts, const void *data, size_t len,
		 struct mvcc_store **out)
{
	const unsigned char *p = data;
	if (len < SNAP_HEADER_LEN + 4 || memcmp(p, SNAP_MAGIC, 8))
		return MVCC_ESNAPSHOT_CORRUPT;
	struct dec d = {p + 8, len - 8 - 4};
	uint32_t version, flags, crc;
	(void)dec_u32(&d, &version);
	if (version != SNAP_VERSION)
		return MVCC_ESNAPSHOT_VERSION;
	crc = (uint32_t)p[len - 4] | (uint32_t)p[len - 3] << 8 |
	      (uint32_t)p[len - 2] << 16 | (uint32_t)p[len - 1] << 24;
	if (crc32c(0, p, len - 4) != crc)
		return MVCC_ESNAPSHOT_CORRUPT;
	int64_t rev, compact_rev, next_id;
	uint64_t nleases, nkeys;
	(void)dec_u32(&d, &flags);
	(void)dec_i64(&d, &rev);
	(void)dec_i64(&d, &compact_rev);
	(void)dec_i64(&d, &next_id);
	(void)dec_u64(&d, &nleases);
	(void)dec_u64(&d, &nkeys); /* the header length was checked above */
	if (flags || rev < 1 || compact_rev < -1 || compact_rev > rev ||
	    nleases > d.left / SNAP_LEASE_LEN || nkeys > d.left / SNAP_KEY_MIN_LEN)
		return MVCC_ESNAPSHOT_CORRUPT;

	struct mvcc_store *s;
	int rc = mvcc_new(opts, &s);
	if (rc)
		return rc;
	s->rev = rev;
	s->compact_rev = compact_rev;
	lease__set_next_id(s->leases, next_id);
	rc = MVCC_ESNAPSHOT_CORRUPT;
	int64_t prev_id = 0;
	for (uint64_t i = 0; i < nleases; i++) {
		int64_t id, ttl, rem;
		if (!dec_i64(&d, &id) || !dec_i64(&d, &ttl) || !dec_i64(&d, &rem))
			goto fail;
		if (id == 0 || (i > 0 && id <= prev_id) || ttl < 0 ||
		    ttl > LEASE_MAX_TTL_S || rem < 0 || rem > LEASE_MAX_TTL_S)
			goto fail;
		prev_id = id;
		if ((rc = lease__restore(s->leases, id, ttl, rem)))
			goto fail;
		rc = MVCC_ESNAPSHOT_CORRUPT;
	}
	const struct mvcc__key *prev = NULL;
	for (uint64_t i = 0; i < nkeys; i++) {
		if ((rc = restore_key(s, &d, &prev)))
			goto fail;
	}
	rc = MVCC_ESNAPSHOT_CORRUPT;
	if (d.left)
		goto fail;
	if ((rc = restore_revlog(s)))
		goto fail;
	*out = s;
	return 0;
fail:
	mvcc_free(s);
	return rc;
}
