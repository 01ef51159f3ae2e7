/*
 * mvcc_snap: the MVCC store's snapshot codec (format in mvcc.h). Encoding
 * streams the store in chunks through a callback, all at once or in steps
 * while the store goes on taking writes: a cursor encodes the store as it
 * was at its start — the versions at or below that revision, which later
 * writes never change (they append above it) — and resumes after the last
 * key it encoded; a compaction (the one change that drops versions and
 * keys) makes it stale. Decoding checks every length, count, order and
 * revision and rebuilds the revision log, so a bad snapshot never yields
 * a store.
 */
#include "meta/mvcc.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/crc32c.h"
#include "common/endian.h"
#include "common/util.h"
#include "meta/avl.h"
#include "meta/lease.h"
#include "meta/mvcc_int.h"

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
	uint8_t b[4];
	mc_put_le32(b, v);
	enc_bytes(e, b, 4);
}

static void enc_u64(struct enc *e, uint64_t v)
{
	uint8_t b[8];
	mc_put_le64(b, v);
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

struct mvcc_snap_cursor {
	const struct mvcc_store *s;
	uint64_t generation; /* s->generation at the start */
	int64_t rev;         /* the revision encoded: versions above it are not */
	struct enc e;
	char *last; /* the last key encoded (NULL: none yet) */
	size_t last_len, last_cap;
	uint64_t keys_left;
	bool done;
};

int mvcc_snap_begin(const struct mvcc_store *s, mvcc_write_fn fn, void *ctx,
		    struct mvcc_snap_cursor **out)
{
	if (mvcc_compact_pending(s))
		return MVCC_ECOMPACT_PENDING; /* it would hold what was dropped */
	struct mvcc_snap_cursor *c = calloc(1, sizeof(*c));
	if (!c || !(c->e.buf = malloc(SNAP_CHUNK))) {
		free(c);
		return -ENOMEM;
	}
	c->s = s;
	c->generation = s->generation;
	c->rev = s->rev;
	c->keys_left = s->keys.count;
	c->e.fn = fn;
	c->e.ctx = ctx;
	struct enc *e = &c->e;
	enc_bytes(e, SNAP_MAGIC, 8);
	enc_u32(e, SNAP_VERSION);
	enc_u32(e, 0);
	enc_i64(e, s->rev);
	enc_i64(e, s->compact_rev);
	enc_i64(e, lease__next_id(s->leases));
	enc_u64(e, lease_count(s->leases));
	enc_u64(e, s->keys.count);
	(void)lease__foreach(s->leases, enc_lease, e);
	if (e->err) {
		int rc = e->err;
		mvcc_snap_free(c);
		return rc;
	}
	*out = c;
	return 0;
}

/* Versions of k at revision rev (those after it were appended later). */
static uint32_t versions_at(const struct mvcc__key *k, int64_t rev)
{
	uint32_t n = k->nhist;
	while (n && k->hist[n - 1].main > rev)
		n--;
	return n;
}

int mvcc_snap_step(struct mvcc_snap_cursor *c, size_t budget)
{
	const struct mvcc_store *s = c->s;
	struct enc *e = &c->e;
	size_t out = 0;

	if (c->done)
		return 1;
	if (s->generation != c->generation)
		return MVCC_ESNAPSHOT_STALE;
	struct avl_iter it;
	struct mvcc__bytes from = {c->last, c->last_len};
	struct mvcc__key *k = mvcc__key_of(avl_seek(&it, &s->keys, c->last ? &from : NULL));
	if (k && c->last && mc_bytes_cmp(k->key, k->klen, c->last, c->last_len) == 0)
		k = mvcc__key_of(avl_next(&it));
	for (; k && !e->err && out < budget; k = mvcc__key_of(avl_next(&it))) {
		uint32_t nv = versions_at(k, c->rev);
		if (!nv)
			continue; /* created after the snapshot's revision */
		if (!c->keys_left)
			return MC_EINTERNAL; /* more keys than at the start: a bug */
		c->keys_left--;
		enc_u32(e, k->klen);
		enc_bytes(e, k->key, k->klen);
		enc_u32(e, nv);
		out += 8 + k->klen;
		for (uint32_t i = 0; i < nv; i++) {
			const struct mvcc__ver *v = &k->hist[i];
			enc_i64(e, v->main);
			enc_u32(e, v->sub);
			enc_u8(e, !mvcc__ver_live(v));
			enc_i64(e, v->create);
			enc_i64(e, v->version);
			enc_i64(e, v->lease);
			enc_u32(e, v->vlen);
			enc_bytes(e, v->value, v->vlen);
			out += SNAP_VER_MIN_LEN + v->vlen;
		}
		if (k->klen > c->last_cap) {
			char *p = realloc(c->last, k->klen);
			if (!p)
				return -ENOMEM;
			c->last = p;
			c->last_cap = k->klen;
		}
		memcpy(c->last, k->key, k->klen);
		c->last_len = k->klen;
	}
	if (e->err)
		return e->err;
	if (k)
		return 0;
	if (c->keys_left)
		return MC_EINTERNAL; /* fewer keys than at the start: a bug */
	uint8_t trailer[4];
	mc_put_le32(trailer, e->crc);
	enc_raw(e, trailer, 4);
	enc_flush(e);
	if (e->err)
		return e->err;
	c->done = true;
	return 1;
}

void mvcc_snap_free(struct mvcc_snap_cursor *c)
{
	if (!c)
		return;
	free(c->e.buf);
	free(c->last);
	free(c);
}

int mvcc_snapshot(const struct mvcc_store *s, mvcc_write_fn on_chunk, void *ctx)
{
	struct mvcc_snap_cursor *c;
	int rc = mvcc_snap_begin(s, on_chunk, ctx, &c);
	if (rc)
		return rc;
	rc = mvcc_snap_step(c, SIZE_MAX);
	mvcc_snap_free(c);
	return rc == 1 ? 0 : rc;
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
	*v = mc_get_le32(b);
	return true;
}

static bool dec_u64(struct dec *d, uint64_t *v)
{
	const unsigned char *b;
	if (!dec_take(d, 8, &b))
		return false;
	*v = mc_get_le64(b);
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
static int restore_key(struct mvcc_store *s, struct dec *d, const struct mvcc__key **prev)
{
	uint32_t klen, nver;
	const unsigned char *kb;
	if (!dec_u32(d, &klen) || klen == 0 || !dec_take(d, klen, &kb))
		return MVCC_ESNAPSHOT_CORRUPT;
	if (*prev && mc_bytes_cmp((*prev)->key, (*prev)->klen, kb, klen) >= 0)
		return MVCC_ESNAPSHOT_CORRUPT;
	if (!dec_u32(d, &nver) || nver == 0 || nver > d->left / SNAP_VER_MIN_LEN)
		return MVCC_ESNAPSHOT_CORRUPT;
	struct mvcc__key *k = mvcc__key_alloc(s, (const char *)kb, klen);
	if (!k)
		return -ENOMEM;
	int rc = mvcc__hist_reserve(s, k, nver);
	if (rc)
		goto fail;
	rc = MVCC_ESNAPSHOT_CORRUPT;
	for (uint32_t i = 0; i < nver; i++) {
		struct mvcc__ver v = {0};
		uint32_t sub, vlen;
		const unsigned char *tb, *vb;
		int64_t create, version, lease;
		if (!dec_i64(d, &v.main) || !dec_u32(d, &sub) || !dec_take(d, 1, &tb) ||
		    !dec_i64(d, &create) || !dec_i64(d, &version) || !dec_i64(d, &lease) ||
		    !dec_u32(d, &vlen) || !dec_take(d, vlen, &vb))
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
		s->db_size += mvcc__ver_size(k, &v);
		s->value_bytes += vlen;
		s->nversions++;
	}
	const struct mvcc__ver *last = mvcc__live_latest(k);
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
		s->db_size -= mvcc__ver_size(k, &k->hist[i]);
		s->value_bytes -= k->hist[i].vlen;
	}
	s->nversions -= k->nhist;
	mvcc__key_free(s, k);
	return rc;
}

static int restore_revlog(struct mvcc_store *s)
{
	size_t n = 0;
	struct avl_iter it;
	for (struct mvcc__key *k = mvcc__key_of(avl_seek(&it, &s->keys, NULL)); k;
	     k = mvcc__key_of(avl_next(&it)))
		for (uint32_t i = 0; i < k->nhist; i++)
			n += k->hist[i].main >= s->compact_rev;
	int rc = mvcc__rl_reserve(s, n);
	if (rc)
		return rc;
	for (struct mvcc__key *k = mvcc__key_of(avl_seek(&it, &s->keys, NULL)); k;
	     k = mvcc__key_of(avl_next(&it)))
		for (uint32_t i = 0; i < k->nhist; i++)
			if (k->hist[i].main >= s->compact_rev)
				s->rl[s->rl_len++] = (struct mvcc__rent){k->hist[i].main, k,
									 k->hist[i].sub};
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
	crc = mc_get_le32(p + len - 4);
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
	s->done_rev = compact_rev;
	lease__set_next_id(s->leases, next_id);
	rc = MVCC_ESNAPSHOT_CORRUPT;
	int64_t prev_id = 0;
	for (uint64_t i = 0; i < nleases; i++) {
		int64_t id, ttl, rem;
		if (!dec_i64(&d, &id) || !dec_i64(&d, &ttl) || !dec_i64(&d, &rem))
			goto fail;
		if (id == 0 || (i > 0 && id <= prev_id) || ttl < 0 || ttl > LEASE_MAX_TTL_S ||
		    rem < 0 || rem > LEASE_MAX_TTL_S)
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
