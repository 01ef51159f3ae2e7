/*
 * test_mvcc_model: random requests against the store and against a plain
 * reference model (arrays, linear scans, full history, written straight
 * from etcd's rules) — every answer, error and revision must agree, and so
 * must the revision log read back as watch events.
 */
#include "test_mvcc_helpers.h"

/* ------------------------------------------------------------- model */

#define MK 8 /* max key/value bytes */

struct mver {
	int64_t main, sub, create, version, lease;
	bool tomb;
	char val[MK];
	size_t vlen;
};

struct mkey {
	char key[MK];
	size_t klen;
	struct mver h[4096];
	size_t n;
};

struct model {
	struct mkey keys[64];
	size_t nkeys;
	int64_t rev, compact;
	int64_t leases[256];
	size_t nleases;
};

static struct model M;

static int bcmp_(const char *a, size_t an, const char *b, size_t bn)
{
	size_t n = an < bn ? an : bn;
	for (size_t i = 0; i < n; i++)
		if (a[i] != b[i])
			return (unsigned char)a[i] < (unsigned char)b[i] ? -1 : 1;
	return an < bn ? -1 : an > bn;
}

static struct mkey *m_key(const char *k, size_t kl, bool create)
{
	for (size_t i = 0; i < M.nkeys; i++)
		if (!bcmp_(M.keys[i].key, M.keys[i].klen, k, kl))
			return &M.keys[i];
	if (!create)
		return NULL;
	cr_assert_lt(M.nkeys, 64);
	struct mkey *mk = &M.keys[M.nkeys++];
	memset(mk, 0, sizeof(*mk));
	memcpy(mk->key, k, kl);
	mk->klen = kl;
	return mk;
}

static const struct mver *m_at(const struct mkey *mk, int64_t rev)
{
	const struct mver *v = NULL;
	for (size_t i = 0; i < mk->n; i++)
		if (mk->h[i].main <= rev)
			v = &mk->h[i];
	return v && !v->tomb ? v : NULL;
}

static bool m_in(const struct mkey *mk, const char *k, size_t kl, const char *e, size_t el)
{
	if (el == 0)
		return !bcmp_(mk->key, mk->klen, k, kl);
	if (bcmp_(mk->key, mk->klen, k, kl) < 0)
		return false;
	if (el == 1 && e[0] == 0)
		return true;
	return bcmp_(mk->key, mk->klen, e, el) < 0;
}

static bool m_lease_exists(int64_t id)
{
	for (size_t i = 0; i < M.nleases; i++)
		if (M.leases[i] == id)
			return true;
	return false;
}

/* Keys in sorted order (indexes into M.keys). */
static size_t m_sorted(size_t *idx)
{
	size_t n = M.nkeys;
	for (size_t i = 0; i < n; i++)
		idx[i] = i;
	for (size_t i = 1; i < n; i++)
		for (size_t j = i;
		     j > 0 && bcmp_(M.keys[idx[j - 1]].key, M.keys[idx[j - 1]].klen,
				    M.keys[idx[j]].key, M.keys[idx[j]].klen) > 0;
		     j--) {
			size_t t = idx[j];
			idx[j] = idx[j - 1];
			idx[j - 1] = t;
		}
	return n;
}

struct mkv {
	const struct mkey *k;
	const struct mver *v;
};

static int64_t tgt(const struct mkv *x, int target)
{
	switch (target) {
	case MVCC_SORT_VERSION:
		return x->v->version;
	case MVCC_SORT_CREATE:
		return x->v->create;
	default:
		return x->v->main;
	}
}

static int mkv_cmp(const struct mkv *a, const struct mkv *b, int target)
{
	if (target == MVCC_SORT_KEY)
		return bcmp_(a->k->key, a->k->klen, b->k->key, b->k->klen);
	if (target == MVCC_SORT_VALUE)
		return bcmp_(a->v->val, a->v->vlen, b->v->val, b->v->vlen);
	int64_t x = tgt(a, target), y = tgt(b, target);
	return x < y ? -1 : x > y;
}

/* Model range into out[]; returns error or 0. */
static int m_range(const struct mvcc_range_req *r, int64_t cur_rev, struct mkv *out,
		   size_t *nout, int64_t *count, bool *more)
{
	if (r->revision > M.rev)
		return MVCC_EFUTURE_REV;
	if (r->revision > 0 && r->revision < M.compact)
		return MVCC_ECOMPACTED;
	int64_t at = r->revision > 0 ? r->revision : cur_rev;
	size_t idx[64], n = m_sorted(idx), m = 0;
	struct mkv all[64];
	for (size_t i = 0; i < n; i++) {
		const struct mkey *mk = &M.keys[idx[i]];
		const struct mver *v;
		if (m_in(mk, r->key, r->key_len, r->range_end, r->range_end_len) &&
		    (v = m_at(mk, at)))
			all[m++] = (struct mkv){mk, v};
	}
	*count = (int64_t)m;
	*more = false;
	*nout = 0;
	if (r->count_only)
		return 0;
	bool filt = r->min_mod_revision || r->max_mod_revision || r->min_create_revision ||
		    r->max_create_revision;
	int64_t fetch = r->limit;
	if (r->sort_order != MVCC_SORT_NONE || filt)
		fetch = 0;
	if (fetch > 0)
		fetch++;
	size_t k = 0;
	for (size_t i = 0; i < m && (fetch <= 0 || (int64_t)k < fetch); i++) {
		const struct mver *v = all[i].v;
		out[k++] = all[i];
		if ((r->max_mod_revision && v->main > r->max_mod_revision) ||
		    (r->min_mod_revision && v->main < r->min_mod_revision) ||
		    (r->max_create_revision && v->create > r->max_create_revision) ||
		    (r->min_create_revision && v->create < r->min_create_revision))
			k--;
	}
	int order = r->sort_order;
	if (r->sort_target != MVCC_SORT_KEY && order == MVCC_SORT_NONE)
		order = MVCC_SORT_ASCEND;
	if (order != MVCC_SORT_NONE) {
		int dir = order == MVCC_SORT_DESCEND ? -1 : 1;
		for (size_t i = 1; i < k; i++) /* stable insertion sort */
			for (size_t j = i;
			     j > 0 && mkv_cmp(&out[j - 1], &out[j], r->sort_target) * dir > 0;
			     j--) {
				struct mkv t = out[j];
				out[j] = out[j - 1];
				out[j - 1] = t;
			}
	}
	if (r->limit > 0 && (int64_t)k > r->limit) {
		k = (size_t)r->limit;
		*more = true;
	}
	*nout = k;
	return 0;
}

static bool m_compare(const struct mvcc_compare *c)
{
	bool any = false;
	for (size_t i = 0; i < M.nkeys; i++) {
		const struct mkey *mk = &M.keys[i];
		const struct mver *v;
		if (!m_in(mk, c->key, c->key_len, c->range_end, c->range_end_len) ||
		    !(v = m_at(mk, INT64_MAX)))
			continue;
		any = true;
		int r;
		if (c->target == MVCC_TARGET_VALUE) {
			r = bcmp_(v->val, v->vlen, c->value, c->value_len);
		} else {
			int64_t x = c->target == MVCC_TARGET_VERSION  ? v->version
				    : c->target == MVCC_TARGET_CREATE ? v->create
				    : c->target == MVCC_TARGET_MOD    ? v->main
								      : v->lease;
			r = x < c->number ? -1 : x > c->number;
		}
		bool ok = c->result == MVCC_CMP_EQUAL     ? r == 0
			  : c->result == MVCC_CMP_GREATER ? r > 0
			  : c->result == MVCC_CMP_LESS    ? r < 0
							  : r != 0;
		if (!ok)
			return false;
	}
	if (any)
		return true;
	if (c->target == MVCC_TARGET_VALUE)
		return false;
	int r = 0 < c->number ? -1 : 0 > c->number;
	return c->result == MVCC_CMP_EQUAL     ? r == 0
	       : c->result == MVCC_CMP_GREATER ? r > 0
	       : c->result == MVCC_CMP_LESS    ? r < 0
					       : r != 0;
}

/* The model's append. */
static void m_push(struct mkey *mk, int64_t main, int64_t sub, bool tomb, const char *v,
		   size_t vl, int64_t lease)
{
	const struct mver *cur = m_at(mk, INT64_MAX);
	cr_assert_lt(mk->n, 4096);
	struct mver *nv = &mk->h[mk->n];
	memset(nv, 0, sizeof(*nv));
	nv->main = main;
	nv->sub = sub;
	nv->tomb = tomb;
	if (!tomb) {
		nv->create = cur ? cur->create : main;
		nv->version = cur ? cur->version + 1 : 1;
		nv->lease = lease;
		memcpy(nv->val, v, vl);
		nv->vlen = vl;
	}
	mk->n++;
}

/* ------------------------------------------------------------- comparing */

static void same_kv(const struct mvcc_kv *kv, const struct mkv *m, bool keys_only)
{
	cr_assert_eq(kv->key_len, m->k->klen);
	cr_assert(!memcmp(kv->key, m->k->key, kv->key_len));
	cr_assert_eq(kv->mod_revision, m->v->main);
	cr_assert_eq(kv->create_revision, m->v->create);
	cr_assert_eq(kv->version, m->v->version);
	cr_assert_eq(kv->lease, m->v->lease);
	if (keys_only) {
		cr_assert_eq(kv->value_len, 0);
	} else {
		cr_assert_eq(kv->value_len, m->v->vlen);
		cr_assert(!memcmp(kv->value, m->v->val, kv->value_len));
	}
}

static uint64_t seed;

static uint32_t rnd(void)
{
	seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
	return (uint32_t)(seed >> 33);
}

static void rkey(char *k, size_t *kl)
{
	*kl = 1 + rnd() % 2;
	for (size_t i = 0; i < *kl; i++)
		k[i] = "\0abc"[rnd() % 4];
}

/* A random span: single key, [k, e), or from k on. */
static void rspan(char *k, size_t *kl, char *e, size_t *el)
{
	rkey(k, kl);
	switch (rnd() % 3) {
	case 0:
		*el = 0;
		break;
	case 1:
		rkey(e, el);
		break;
	default:
		e[0] = '\0';
		*el = 1;
		if (rnd() % 4 == 0) {
			k[0] = '\0';
			*kl = 1;
		}
	}
}

/* A random range request; strings live in the caller's buffers. */
static void rrange(struct mvcc_range_req *r, char *k, char *e)
{
	memset(r, 0, sizeof(*r));
	rspan(k, &r->key_len, e, &r->range_end_len);
	r->key = k;
	r->range_end = e;
	if (rnd() % 2)
		r->limit = rnd() % 4;
	if (rnd() % 3 == 0) {
		r->sort_order = (int)(rnd() % 3);
		r->sort_target = (int)(rnd() % 5);
	}
	if (rnd() % 3 == 0)
		r->revision = (int64_t)(rnd() % (uint32_t)(M.rev + 2));
	r->keys_only = rnd() % 5 == 0;
	r->count_only = rnd() % 7 == 0;
	if (rnd() % 5 == 0)
		r->min_mod_revision = (int64_t)(rnd() % (uint32_t)(M.rev + 1));
	if (rnd() % 5 == 0)
		r->max_create_revision = (int64_t)(rnd() % (uint32_t)(M.rev + 1));
}

static void check_range(struct mvcc_store *s, const struct mvcc_range_req *r,
			const struct mvcc_range_resp *got, int64_t cur_rev)
{
	struct mkv want[64];
	size_t n;
	int64_t count;
	bool more;
	cr_assert_eq(m_range(r, cur_rev, want, &n, &count, &more), 0);
	cr_assert_eq(got->count, count);
	cr_assert_eq(got->more, more);
	cr_assert_eq(got->nkvs, n, "range kvs");
	for (size_t i = 0; i < n; i++)
		same_kv(&got->kvs[i], &want[i], r->keys_only);
	(void)s;
}

/* The model applies a put; returns an error or 0. */
static int m_put(const struct mvcc_put_req *p, int64_t main, int64_t *sub, struct mkv *prev)
{
	struct mkey *mk = m_key(p->key, p->key_len, false);
	const struct mver *cur = mk ? m_at(mk, INT64_MAX) : NULL;
	if ((p->ignore_value || p->ignore_lease) && !cur)
		return MVCC_EKEY_NOT_FOUND;
	int64_t lease = p->ignore_lease ? cur->lease : p->lease;
	if (!p->ignore_lease && lease && !m_lease_exists(lease))
		return MVCC_ELEASE_NOT_FOUND;
	prev->k = mk;
	prev->v = cur;
	static char vbuf[MK];
	size_t vl = p->ignore_value ? cur->vlen : p->value_len;
	memcpy(vbuf, p->ignore_value ? cur->val : p->value, vl);
	mk = m_key(p->key, p->key_len, true);
	m_push(mk, main, (*sub)++, false, vbuf, vl, lease);
	return 0;
}

Test(model, random_requests_agree, .timeout = 120)
{
	for (uint64_t round = 1; round <= 12; round++) {
		seed = round;
		memset(&M, 0, sizeof(M));
		M.rev = 1;
		M.compact = -1;
		struct mvcc_store *s = h_store();
		struct lease_table *lt = mvcc_leases(s);
		for (int op = 0; op < 2500; op++) {
			char k[MK], e[MK], k2[MK], e2[MK], v[MK];
			size_t kl, el, vl = rnd() % 4;
			for (size_t i = 0; i < vl; i++)
				v[i] = "xyz\0"[rnd() % 4];
			struct mvcc_result res;
			unsigned what = rnd() % 100;
			if (what < 30) { /* put */
				struct mvcc_op o = {.type = MVCC_OP_PUT};
				rkey(k, &kl);
				o.u.put.key = k;
				o.u.put.key_len = kl;
				o.u.put.value = v;
				o.u.put.value_len = vl;
				o.u.put.prev_kv = rnd() % 2;
				if (rnd() % 6 == 0 && M.nleases)
					o.u.put.lease = M.leases[rnd() % M.nleases];
				if (rnd() % 12 == 0)
					o.u.put.lease = 99999; /* missing */
				if (rnd() % 8 == 0) {
					o.u.put.ignore_value = true;
					o.u.put.value_len = 0;
				}
				if (rnd() % 8 == 0) {
					o.u.put.ignore_lease = true;
					o.u.put.lease = 0;
				}
				int64_t sub = 0;
				struct mkv prev;
				int want = m_put(&o.u.put, M.rev + 1, &sub, &prev);
				int rc = mvcc_apply(s, &o, &res);
				cr_assert_eq(rc, want, "put: %s vs %s", mvcc_errname(rc),
					     mvcc_errname(want));
				if (rc)
					continue;
				M.rev++;
				cr_assert_eq(res.revision, M.rev);
				cr_assert_eq(res.resp.u.put.has_prev_kv,
					     o.u.put.prev_kv && prev.v);
				if (res.resp.u.put.has_prev_kv)
					same_kv(&res.resp.u.put.prev_kv, &prev, false);
				mvcc_result_free(&res);
			} else if (what < 42) { /* delete range */
				struct mvcc_op o = {.type = MVCC_OP_DELETE_RANGE};
				rspan(k, &kl, e, &el);
				o.u.del.key = k;
				o.u.del.key_len = kl;
				o.u.del.range_end = e;
				o.u.del.range_end_len = el;
				o.u.del.prev_kv = true;
				size_t idx[64], n = m_sorted(idx), nd = 0;
				struct mkv del[64];
				for (size_t i = 0; i < n; i++) {
					struct mkey *mk = &M.keys[idx[i]];
					const struct mver *cv = m_at(mk, INT64_MAX);
					if (cv && m_in(mk, k, kl, e, el))
						del[nd++] = (struct mkv){mk, cv};
				}
				h_apply(s, &o, &res);
				cr_assert_eq(res.resp.u.del.deleted, (int64_t)nd);
				cr_assert_eq(res.resp.u.del.nprev_kvs, nd);
				for (size_t i = 0; i < nd; i++)
					same_kv(&res.resp.u.del.prev_kvs[i], &del[i], false);
				if (nd)
					M.rev++;
				for (size_t i = 0; i < nd; i++)
					m_push((struct mkey *)del[i].k, M.rev, (int64_t)i,
					       true, NULL, 0, 0);
				cr_assert_eq(res.revision, M.rev);
				mvcc_result_free(&res);
			} else if (what < 72) { /* range */
				struct mvcc_op o = {.type = MVCC_OP_RANGE};
				rrange(&o.u.range, k, e);
				struct mkv want[64];
				size_t n;
				int64_t count;
				bool more;
				int werr = m_range(&o.u.range, INT64_MAX, want, &n, &count,
						   &more);
				int rc = mvcc_apply(s, &o, &res);
				cr_assert_eq(rc, werr, "range: %s vs %s", mvcc_errname(rc),
					     mvcc_errname(werr));
				if (rc)
					continue;
				check_range(s, &o.u.range, &res.resp.u.range, INT64_MAX);
				cr_assert_eq(res.revision, M.rev);
				mvcc_result_free(&res);
			} else if (what < 90) { /* txn: compare, then puts/deletes/range */
				struct mvcc_compare c = {.target = (int)(rnd() % 5),
							 .result = (int)(rnd() % 4)};
				rspan(k2, &c.key_len, e2, &c.range_end_len);
				c.key = k2;
				c.range_end = e2;
				c.number = (int64_t)(rnd() % 6);
				c.value = v;
				c.value_len = vl;
				struct mvcc_op ops[3];
				char pk[3][MK], rk[MK], re[MK];
				size_t nops = 1 + rnd() % 3;
				bool dup = false;
				for (size_t i = 0; i < nops; i++) {
					memset(&ops[i], 0, sizeof(ops[i]));
					if (i == 2) {
						ops[i].type = MVCC_OP_RANGE;
						rrange(&ops[i].u.range, rk, re);
						ops[i].u.range.revision = 0;
						continue;
					}
					ops[i].type = MVCC_OP_PUT;
					rkey(pk[i], &ops[i].u.put.key_len);
					ops[i].u.put.key = pk[i];
					ops[i].u.put.value = v;
					ops[i].u.put.value_len = vl;
					if (i == 1 && !bcmp_(pk[0], ops[0].u.put.key_len,
							     pk[1], ops[1].u.put.key_len))
						dup = true;
				}
				struct mvcc_op t = op_txn(&c, 1, ops, nops, ops,
							  nops > 1 ? 1 : 0);
				bool ok = m_compare(&c);
				int rc = mvcc_apply(s, &t, &res);
				if (dup) {
					cr_assert_eq(rc, MVCC_EDUPLICATE_KEY);
					continue;
				}
				cr_assert_eq(rc, 0, "txn: %s", mvcc_errname(rc));
				cr_assert_eq(res.resp.u.txn.succeeded, ok);
				size_t n = ok ? nops : (nops > 1 ? 1 : 0);
				cr_assert_eq(res.resp.u.txn.nresponses, n);
				int64_t sub = 0;
				for (size_t i = 0; i < n; i++) {
					if (ops[i].type == MVCC_OP_PUT) {
						struct mkv prev;
						cr_assert_eq(m_put(&ops[i].u.put, M.rev + 1,
								   &sub, &prev),
							     0);
					} else {
						check_range(
							s, &ops[i].u.range,
							&res.resp.u.txn.responses[i].u.range,
							INT64_MAX);
					}
				}
				if (sub)
					M.rev++;
				cr_assert_eq(res.revision, M.rev);
				mvcc_result_free(&res);
			} else if (what < 94) { /* lease grant / revoke */
				if (rnd() % 2 || !M.nleases) {
					int64_t id;
					cr_assert_eq(lease_grant(lt, 0, 10, 0, &id, NULL), 0);
					M.leases[M.nleases++] = id;
					continue;
				}
				size_t li = rnd() % M.nleases;
				int64_t id = M.leases[li];
				M.leases[li] = M.leases[--M.nleases];
				int64_t rev;
				cr_assert_eq(mvcc_lease_revoke(s, id, &rev), 0);
				size_t idx[64], n = m_sorted(idx);
				int64_t sub = 0;
				for (size_t i = 0; i < n; i++) {
					struct mkey *mk = &M.keys[idx[i]];
					const struct mver *cv = m_at(mk, INT64_MAX);
					if (cv && cv->lease == id)
						m_push(mk, M.rev + 1, sub++, true, NULL, 0, 0);
				}
				if (sub)
					M.rev++;
				cr_assert_eq(rev, M.rev);
			} else { /* compaction */
				int64_t at = (int64_t)(rnd() % (uint32_t)(M.rev + 2));
				int want = at <= M.compact ? MVCC_ECOMPACTED
					   : at > M.rev    ? MVCC_EFUTURE_REV
							   : 0;
				cr_assert_eq(mvcc_compact(s, at), want);
				if (!want)
					M.compact = at;
			}
			cr_assert_eq(mvcc_rev(s), M.rev);
		}
		/* The revision log from the compaction on equals the model's. */
		uint64_t pos;
		int64_t from = M.compact > 0 ? M.compact : 0;
		cr_assert_eq(mvcc_hist_seek(s, from, &pos), 0);
		size_t nev = 0;
		for (int64_t rev = from; rev <= M.rev; rev++) {
			for (int64_t sub = 0;; sub++) {
				const struct mkey *hit = NULL;
				const struct mver *hv = NULL, *hp = NULL;
				for (size_t i = 0; i < M.nkeys && !hit; i++)
					for (size_t j = 0; j < M.keys[i].n; j++)
						if (M.keys[i].h[j].main == rev &&
						    M.keys[i].h[j].sub == sub) {
							hit = &M.keys[i];
							hv = &hit->h[j];
							hp = j && !hit->h[j - 1].tomb &&
									     hit->h[j - 1].main >=
										     M.compact
								     ? &hit->h[j - 1]
								     : NULL;
						}
				if (!hit)
					break;
				struct mvcc_event ev;
				cr_assert_eq(mvcc_hist_event(s, pos++, &ev), 0);
				nev++;
				cr_assert_eq(ev.kv.mod_revision, rev);
				cr_assert_eq(ev.type,
					     hv->tomb ? MVCC_EVENT_DELETE : MVCC_EVENT_PUT);
				cr_assert(
					!bcmp_(ev.kv.key, ev.kv.key_len, hit->key, hit->klen));
				/* prev_kv: the previous version, if the store still has it
				 * (the model keeps everything). */
				if (ev.has_prev_kv) {
					cr_assert(hv > hit->h && !hv[-1].tomb);
					cr_assert_eq(ev.prev_kv.mod_revision, hv[-1].main);
				} else if (hp) {
					cr_assert_fail("prev_kv missing at %lld",
						       (long long)rev);
				}
			}
		}
		struct mvcc_event ev;
		cr_assert_eq(mvcc_hist_event(s, pos, &ev), -ENOENT, "%zu events", nev);
		mvcc_free(s);
	}
}
