/*
 * mvcc_txn: requests against the MVCC store — the checks etcd's gRPC
 * layer makes before a request reaches Raft, compares, and the write
 * transaction (range, put, delete, nested txn) applied with an undo log;
 * lease revocation, which deletes a lease's keys in one revision.
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

#include "common/util.h"
#include "meta/avl.h"
#include "meta/lease.h"
#include "meta/mvcc_int.h"

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
		if (!mc_bytes_cmp(s->a[i].p, s->a[i].n, p, n))
			return true;
	return false;
}

static int kset_add(struct kset *s, const char *p, size_t n)
{
	if (kset_has(s, p, n))
		return 0;
	int rc = mvcc__grow((void **)&s->a, &s->cap, s->n + 1, sizeof(*s->a));
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
			if (!mc_bytes_cmp(v->b, v->bn, p, n))
				return true;
		} else if (mc_bytes_cmp(v->b, v->bn, p, n) <= 0 &&
			   (v->en == 0 || mc_bytes_cmp(p, n, v->e, v->en) < 0)) {
			return true;
		}
	}
	return false;
}

static int ivset_add(struct ivset *d, const struct ivl *v)
{
	int rc = mvcc__grow((void **)&d->a, &d->cap, d->n + 1, sizeof(*d->a));
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
		r = mc_bytes_cmp(v ? v->value : NULL, v ? v->vlen : 0, c->value, c->value_len);
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
	struct mvcc__span sp;
	struct mvcc__scan sc;
	bool any = false;
	mvcc__span_init(&sp, c->key, c->key_len, c->range_end, c->range_end_len);
	for (struct mvcc__key *k = mvcc__scan_first(&sc, s, &sp); k;
	     k = mvcc__scan_next(&sc)) {
		const struct mvcc__ver *v = mvcc__live_latest(k);
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
	int rc = mvcc__grow((void **)&p->a, &p->cap, p->n + 1, sizeof(*p->a));
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
	    !mvcc__live_latest(mvcc__find_key(s, p->key, p->key_len)))
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
	int rc = mvcc__grow((void **)&x->undo, &x->capundo, x->nundo + n, sizeof(*x->undo));
	if (!rc)
		rc = mvcc__grow((void **)&x->lops, &x->caplops, x->nlops + nlops,
				sizeof(*x->lops));
	if (!rc)
		rc = mvcc__rl_reserve(x->s, n);
	return rc;
}

/* Append a version; everything it needs was reserved. */
static void tx_push(struct tx *x, struct mvcc__key *k, const struct mvcc__ver *v, bool created)
{
	struct mvcc_store *s = x->s;
	k->hist[k->nhist++] = *v;
	s->rl[s->rl_len++] = (struct mvcc__rent){v->main, k, v->sub};
	x->undo[x->nundo++] = (struct mvcc__undo){k, created};
	s->db_size += mvcc__ver_size(k, v);
	s->nversions++;
	s->value_bytes += v->vlen;
}

static void tx_lop(struct tx *x, int64_t lease, struct mvcc__key *k, struct lease__key *node)
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
			mvcc__key_free(s, k);
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
		return mc_bytes_cmp(a->v->value, a->v->vlen, b->v->value, b->v->vlen);
	default:
		return mc_bytes_cmp(a->k->key, a->k->klen, b->k->key, b->k->klen);
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
static int tx_range(struct tx *x, const struct mvcc_range_req *r, struct mvcc_range_resp *out)
{
	struct mvcc_store *s = x->s;
	int rc = check_range_rev(s, r->revision);
	if (rc)
		return rc;
	int64_t at = r->revision > 0 ? r->revision : INT64_MAX;
	struct mvcc__span sp;
	struct mvcc__scan sc;
	mvcc__span_init(&sp, r->key, r->key_len, r->range_end, r->range_end_len);

	if (r->count_only) {
		int64_t count = 0;
		for (struct mvcc__key *k = mvcc__scan_first(&sc, s, &sp); k;
		     k = mvcc__scan_next(&sc))
			count += mvcc__live_at(k, at) != NULL;
		out->count = count;
		return 0;
	}

	bool filters = r->min_mod_revision || r->max_mod_revision || r->min_create_revision ||
		       r->max_create_revision;
	int64_t lim = r->limit;
	if (r->sort_order != MVCC_SORT_NONE || filters)
		lim = 0; /* fetch everything; sort and truncate afterwards */
	if (lim > 0 && lim < INT64_MAX)
		lim++; /* one extra for 'more' */

	struct ref *refs = NULL, *tmp = NULL;
	size_t n = 0, cap = 0;
	int64_t count = 0;
	for (struct mvcc__key *k = mvcc__scan_first(&sc, s, &sp); k;
	     k = mvcc__scan_next(&sc)) {
		const struct mvcc__ver *v = mvcc__live_at(k, at);
		if (!v)
			continue;
		count++;
		if (lim > 0 && (int64_t)n >= lim)
			continue;
		if ((rc = mvcc__grow((void **)&refs, &cap, n + 1, sizeof(*refs))))
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
		out->kvs = mvcc__arena_alloc(x->arena, n * sizeof(*out->kvs));
		if (!out->kvs) {
			rc = -ENOMEM;
			goto out;
		}
		for (size_t i = 0; i < n; i++)
			if ((rc = mvcc__kv_copy(x->arena, &out->kvs[i], refs[i].k, refs[i].v,
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
	struct mvcc__key *k = mvcc__find_key(s, p->key, p->key_len);
	const struct mvcc__ver *cur = mvcc__live_latest(k);
	if ((p->ignore_value || p->ignore_lease) && !cur)
		return MVCC_EKEY_NOT_FOUND;
	int64_t lease = p->ignore_lease ? cur->lease : p->lease;
	if (!p->ignore_lease && lease && !lease_exists(s->leases, lease))
		return MVCC_ELEASE_NOT_FOUND;
	int rc;
	if (p->prev_kv && cur) {
		if ((rc = mvcc__kv_copy(x->arena, &out->prev_kv, k, cur, true)))
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
	if (lease && lease != old_lease && (rc = lease__key_new(p->key, p->key_len, &ln)))
		goto fail_value;
	if (created && !(k = mvcc__key_alloc(s, p->key, p->key_len))) {
		rc = -ENOMEM;
		goto fail_lease;
	}
	if ((rc = mvcc__hist_reserve(s, k, 1)))
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
		mvcc__key_free(s, k);
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
	struct mvcc__span sp;
	struct mvcc__scan sc;
	struct mvcc__key **ks = NULL;
	size_t n = 0, cap = 0;
	int rc = 0;
	mvcc__span_init(&sp, d->key, d->key_len, d->range_end, d->range_end_len);
	for (struct mvcc__key *k = mvcc__scan_first(&sc, s, &sp); k;
	     k = mvcc__scan_next(&sc)) {
		if (!mvcc__live_latest(k))
			continue;
		if ((rc = mvcc__grow((void **)&ks, &cap, n + 1, sizeof(*ks))))
			goto out;
		ks[n++] = k;
	}
	out->deleted = (int64_t)n;
	if (!n)
		goto out;
	if ((rc = tx_reserve(x, n, n)))
		goto out;
	for (size_t i = 0; i < n; i++)
		if ((rc = mvcc__hist_reserve(s, ks[i], 1)))
			goto out;
	if (d->prev_kv) {
		out->prev_kvs = mvcc__arena_alloc(x->arena, n * sizeof(*out->prev_kvs));
		if (!out->prev_kvs) {
			rc = -ENOMEM;
			goto out;
		}
		for (size_t i = 0; i < n; i++)
			if ((rc = mvcc__kv_copy(x->arena, &out->prev_kvs[i], ks[i],
						mvcc__live_latest(ks[i]), true)))
				goto out;
		out->nprev_kvs = n;
	}
	for (size_t i = 0; i < n; i++) {
		int64_t old_lease = mvcc__live_latest(ks[i])->lease;
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

static int exec_txn(struct tx *x, const struct mvcc_txn_req *t, struct mvcc_txn_resp *out);

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

static int exec_txn(struct tx *x, const struct mvcc_txn_req *t, struct mvcc_txn_resp *out)
{
	bool ok = x->path->a[x->path->pos++];
	const struct mvcc_op *ops = ok ? t->success : t->failure;
	size_t n = ok ? t->nsuccess : t->nfailure;
	out->succeeded = ok;
	if (!n)
		return 0;
	out->responses = mvcc__arena_alloc(x->arena, n * sizeof(*out->responses));
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
		struct mvcc__key *k = mvcc__find_key(s, refs[i].key, refs[i].len);
		const struct mvcc__ver *v = mvcc__live_latest(k);
		if (v && v->lease == id)
			ks[nk++] = k;
	}
	if ((rc = tx_reserve(&x, nk, 0)))
		goto out;
	for (size_t i = 0; i < nk; i++)
		if ((rc = mvcc__hist_reserve(s, ks[i], 1)))
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
