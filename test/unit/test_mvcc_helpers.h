/*
 * Helpers shared by the mvcc / lease / watch unit tests: request builders
 * and short-hand apply calls. Header-only (static), each test binary has
 * its own copy.
 */
#ifndef TEST_MVCC_HELPERS_H
#define TEST_MVCC_HELPERS_H

#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meta/lease.h"
#include "meta/mvcc.h"

#define S(str) (str), strlen(str)

static inline struct mvcc_store *h_store(void)
{
	struct mvcc_store *s = NULL;
	cr_assert_eq(mvcc_new(NULL, &s), 0);
	return s;
}

static inline struct mvcc_op op_range(const char *k, size_t kl, const char *e, size_t el)
{
	struct mvcc_op o = {.type = MVCC_OP_RANGE};
	o.u.range.key = k;
	o.u.range.key_len = kl;
	o.u.range.range_end = e;
	o.u.range.range_end_len = el;
	return o;
}

static inline struct mvcc_op op_get(const char *k)
{
	return op_range(k, strlen(k), NULL, 0);
}

static inline struct mvcc_op op_put(const char *k, const char *v)
{
	struct mvcc_op o = {.type = MVCC_OP_PUT};
	o.u.put.key = k;
	o.u.put.key_len = strlen(k);
	o.u.put.value = v;
	o.u.put.value_len = strlen(v);
	return o;
}

static inline struct mvcc_op op_put_lease(const char *k, const char *v, int64_t lease)
{
	struct mvcc_op o = op_put(k, v);
	o.u.put.lease = lease;
	return o;
}

static inline struct mvcc_op op_del(const char *k, const char *e)
{
	struct mvcc_op o = {.type = MVCC_OP_DELETE_RANGE};
	o.u.del.key = k;
	o.u.del.key_len = strlen(k);
	o.u.del.range_end = e;
	o.u.del.range_end_len = e ? (e[0] ? strlen(e) : 1) : 0; /* "" means "\0" */
	return o;
}

static inline struct mvcc_op op_txn(const struct mvcc_compare *c, size_t nc,
				    const struct mvcc_op *succ, size_t ns,
				    const struct mvcc_op *fail, size_t nf)
{
	struct mvcc_op o = {.type = MVCC_OP_TXN};
	o.u.txn.compare = c;
	o.u.txn.ncompare = nc;
	o.u.txn.success = succ;
	o.u.txn.nsuccess = ns;
	o.u.txn.failure = fail;
	o.u.txn.nfailure = nf;
	return o;
}

static inline struct mvcc_compare cmp_num(const char *k, int target, int result, int64_t n)
{
	struct mvcc_compare c = {.target = target, .result = result, .number = n};
	c.key = k;
	c.key_len = strlen(k);
	return c;
}

static inline struct mvcc_compare cmp_val(const char *k, int result, const char *v)
{
	struct mvcc_compare c = {.target = MVCC_TARGET_VALUE, .result = result};
	c.key = k;
	c.key_len = strlen(k);
	c.value = v;
	c.value_len = strlen(v);
	return c;
}

/* Apply and expect success; returns the header revision. */
static inline int64_t h_apply(struct mvcc_store *s, const struct mvcc_op *op,
			      struct mvcc_result *res)
{
	int rc = mvcc_apply(s, op, res);
	cr_assert_eq(rc, 0, "mvcc_apply: %s", mvcc_strerror(rc));
	return res->revision;
}

static inline int64_t h_put(struct mvcc_store *s, const char *k, const char *v)
{
	struct mvcc_result res;
	struct mvcc_op o = op_put(k, v);
	int64_t rev = h_apply(s, &o, &res);
	mvcc_result_free(&res);
	return rev;
}

static inline int64_t h_del(struct mvcc_store *s, const char *k, const char *e)
{
	struct mvcc_result res;
	struct mvcc_op o = op_del(k, e);
	h_apply(s, &o, &res);
	int64_t n = res.resp.u.del.deleted;
	mvcc_result_free(&res);
	return n;
}

/* Value of k at the current revision, or NULL (static buffer). */
static inline const char *h_get(struct mvcc_store *s, const char *k)
{
	static char buf[4096];
	struct mvcc_result res;
	struct mvcc_op o = op_get(k);
	h_apply(s, &o, &res);
	const char *out = NULL;
	if (res.resp.u.range.nkvs) {
		const struct mvcc_kv *kv = &res.resp.u.range.kvs[0];
		snprintf(buf, sizeof(buf), "%.*s", (int)kv->value_len, kv->value);
		out = buf;
	}
	mvcc_result_free(&res);
	return out;
}

/* The full kv of k (must exist). */
static inline struct mvcc_kv h_kv(struct mvcc_store *s, const char *k)
{
	struct mvcc_result res;
	struct mvcc_op o = op_get(k);
	h_apply(s, &o, &res);
	cr_assert_eq(res.resp.u.range.nkvs, 1, "key %s missing", k);
	struct mvcc_kv kv = res.resp.u.range.kvs[0];
	kv.key = NULL;
	kv.value = NULL;
	mvcc_result_free(&res);
	return kv;
}

/* Keys of a range result joined with ',' (static buffer). */
static inline const char *h_keys(const struct mvcc_range_resp *r)
{
	static char buf[8192];
	size_t o = 0;
	buf[0] = '\0';
	for (size_t i = 0; i < r->nkvs && o < sizeof(buf) - 64; i++)
		o += (size_t)snprintf(buf + o, sizeof(buf) - o, "%s%.*s", i ? "," : "",
				      (int)r->kvs[i].key_len, r->kvs[i].key);
	return buf;
}

struct h_sink {
	char *data;
	size_t len, cap;
	size_t chunks, max_chunk;
};

static inline int h_sink_write(void *ctx, const void *data, size_t len)
{
	struct h_sink *k = ctx;
	if (k->len + len > k->cap) {
		size_t nc = k->cap ? k->cap : 4096;
		while (nc < k->len + len)
			nc *= 2;
		k->data = realloc(k->data, nc);
		cr_assert(k->data);
		k->cap = nc;
	}
	memcpy(k->data + k->len, data, len);
	k->len += len;
	k->chunks++;
	if (len > k->max_chunk)
		k->max_chunk = len;
	return 0;
}

static inline struct h_sink h_snapshot(const struct mvcc_store *s)
{
	struct h_sink k = {0};
	cr_assert_eq(mvcc_snapshot(s, h_sink_write, &k), 0);
	return k;
}

#endif
