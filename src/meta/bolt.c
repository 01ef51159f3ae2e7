/*
 * bolt: the meta state as an etcd 3.4 backend database (see bolt.h).
 *
 * One walk produces the buckets in name order and each bucket's entries in
 * key order, as bbolt's cursors see them; the hashes feed it to CRC-32C,
 * the image to a page writer. The page writer packs a bucket's entries
 * into leaf pages as they come (a page is written once the next entry
 * would not fit; an entry larger than a page gets a page of its own that
 * overflows into the next ones), then builds the branch levels above them
 * from the first key and page ID of each page below, until one page is
 * the bucket's root. The layout of pages and elements is bbolt's
 * (page.go, db.go): little-endian, a 16-byte page header {id, flags,
 * count, overflow}, 16-byte elements whose pos is the offset from the
 * element to its key.
 */
#include "meta/bolt.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "common/crc32c.h"
#include "common/endian.h"
#include "meta/lease.h"

#define PAGE BOLT_PAGE_BYTES
#define PAGE_HEADER 16
#define ELEM_BYTES 16
#define MAGIC 0xED0CDAEDu
#define VERSION 2u
#define BRANCH_FLAG 0x01
#define LEAF_FLAG 0x02
#define META_FLAG 0x04
#define FREELIST_FLAG 0x10
#define BUCKET_LEAF_FLAG 0x01
#define FREELIST_PGID 2
#define FIRST_DATA_PGID 3
/* bbolt's maxAllocSize on 64-bit: no page may be larger. */
#define MAX_PAGE_SPAN ((size_t)0x7FFFFFFF)
#define CLUSTER_VERSION "3.4.0"

/* ------------------------------------------------------------- encoding */

/* etcd's revToBytes, plus the tombstone mark: 17 or 18 bytes. */
static size_t rev_bytes(uint8_t *p, int64_t main, int64_t sub, bool tombstone)
{
	mc_put_be64(p, (uint64_t)main);
	p[8] = '_';
	mc_put_be64(p + 9, (uint64_t)sub);
	if (!tombstone)
		return 17;
	p[17] = 't';
	return 18;
}

static int pb_varint(struct mc_buf *b, uint64_t v)
{
	uint8_t tmp[10];
	size_t n = 0;
	do {
		tmp[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
		v >>= 7;
	} while (v);
	return mc_buf_append(b, tmp, n);
}

/* A varint field, left out when zero (proto3, as gogo marshals). */
static int pb_int(struct mc_buf *b, unsigned field, int64_t v)
{
	int rc = 0;
	if (v && !(rc = pb_varint(b, (uint64_t)field << 3)))
		rc = pb_varint(b, (uint64_t)v);
	return rc;
}

static int pb_bytes(struct mc_buf *b, unsigned field, const void *p, size_t n)
{
	int rc = 0;
	if (n && !(rc = pb_varint(b, (uint64_t)field << 3 | 2)) && !(rc = pb_varint(b, n)))
		rc = mc_buf_append(b, p, n);
	return rc;
}

/* mvccpb.KeyValue, fields in gogo's order. */
static int enc_kv(struct mc_buf *b, const struct mvcc_version *v)
{
	int rc = pb_bytes(b, 1, v->kv.key, v->kv.key_len);
	if (!rc && !v->tombstone) {
		if (!(rc = pb_int(b, 2, v->kv.create_revision)) &&
		    !(rc = pb_int(b, 3, v->kv.mod_revision)) &&
		    !(rc = pb_int(b, 4, v->kv.version)) &&
		    !(rc = pb_bytes(b, 5, v->kv.value, v->kv.value_len)))
			rc = pb_int(b, 6, v->kv.lease);
	}
	return rc;
}

/* A JSON string as Go's encoding/json writes it (HTML-safe escapes). */
static int json_str(struct mc_buf *b, const char *s)
{
	int rc = mc_buf_append(b, "\"", 1);
	for (const unsigned char *p = (const unsigned char *)s; !rc && *p; p++) {
		unsigned char c = *p;
		if (c == '"' || c == '\\')
			rc = mc_buf_printf(b, "\\%c", c);
		else if (c == '\n')
			rc = mc_buf_append(b, "\\n", 2);
		else if (c == '\r')
			rc = mc_buf_append(b, "\\r", 2);
		else if (c == '\t')
			rc = mc_buf_append(b, "\\t", 2);
		else if (c < 0x20 || c == '<' || c == '>' || c == '&')
			rc = mc_buf_printf(b, "\\u%04x", c);
		else if (c == 0xe2 && p[1] == 0x80 && (p[2] == 0xa8 || p[2] == 0xa9))
			rc = mc_buf_printf(b, "\\u%04x", p[2] == 0xa8 ? 0x2028 : 0x2029),
			p += 2;
		else
			rc = mc_buf_append(b, p, 1);
	}
	return rc ? rc : mc_buf_append(b, "\"", 1);
}

/* A list of URLs: [url] or, with none, null (Go's nil slice). */
static int json_urls(struct mc_buf *b, const char *url)
{
	if (!url || !*url)
		return mc_buf_append(b, "null", 4);
	int rc = mc_buf_append(b, "[", 1);
	if (!rc)
		rc = json_str(b, url);
	return rc ? rc : mc_buf_append(b, "]", 1);
}

/* etcd's membership.Member as json.Marshal writes it. */
static int enc_member(struct mc_buf *b, const struct bolt_member *m)
{
	int rc = mc_buf_printf(b, "{\"id\":%" PRIu64 ",\"peerURLs\":", m->id);
	if (!rc)
		rc = json_urls(b, m->peer_url);
	if (!rc && m->learner)
		rc = mc_buf_append(b, ",\"isLearner\":true", 17);
	if (!rc && m->name && *m->name) {
		if (!(rc = mc_buf_append(b, ",\"name\":", 8)))
			rc = json_str(b, m->name);
	}
	if (!rc && m->client_url && *m->client_url) {
		if (!(rc = mc_buf_append(b, ",\"clientURLs\":", 14)))
			rc = json_urls(b, m->client_url);
	}
	return rc ? rc : mc_buf_append(b, "}", 1);
}

/* ------------------------------------------------------------- the walk */

/* Where the walk goes: a bucket begins, an entry of it. */
struct sink {
	int (*bucket)(struct sink *sk, const char *name);
	int (*kv)(struct sink *sk, const void *k, size_t klen, const void *v, size_t vlen);
};

/* The entries of a small bucket, sorted by key before they are emitted. */
struct kvlist {
	struct mc_buf bytes;
	struct kvent {
		size_t koff, klen, voff, vlen;
		const uint8_t *k, *v; /* set by kvlist_emit */
	} * e;
	size_t n, cap;
};

static int kvlist_add(struct kvlist *l, const void *k, size_t klen, const void *v, size_t vlen)
{
	if (l->n == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 16;
		struct kvent *e = realloc(l->e, cap * sizeof(*e));
		if (!e)
			return -ENOMEM;
		l->e = e;
		l->cap = cap;
	}
	struct kvent *x = &l->e[l->n];
	x->koff = l->bytes.len;
	x->klen = klen;
	int rc = mc_buf_append(&l->bytes, k, klen);
	x->voff = l->bytes.len;
	x->vlen = vlen;
	if (!rc)
		rc = mc_buf_append(&l->bytes, v, vlen);
	if (!rc)
		l->n++;
	return rc;
}

static int kvent_cmp(const void *a, const void *b)
{
	const struct kvent *x = a, *y = b;
	size_t n = x->klen < y->klen ? x->klen : y->klen;
	int c = n ? memcmp(x->k, y->k, n) : 0;
	if (c)
		return c;
	return x->klen < y->klen ? -1 : x->klen > y->klen;
}

static int kvlist_emit(struct kvlist *l, struct sink *sk)
{
	const uint8_t *base = (const uint8_t *)l->bytes.data;
	for (size_t i = 0; i < l->n; i++) {
		l->e[i].k = base + l->e[i].koff;
		l->e[i].v = base + l->e[i].voff;
	}
	if (l->n > 1)
		qsort(l->e, l->n, sizeof(*l->e), kvent_cmp);
	for (size_t i = 0; i < l->n; i++) {
		int rc = sk->kv(sk, l->e[i].k, l->e[i].klen, l->e[i].v, l->e[i].vlen);
		if (rc)
			return rc;
	}
	return 0;
}

static void kvlist_reset(struct kvlist *l)
{
	mc_buf_reset(&l->bytes);
	l->n = 0;
}

static void kvlist_free(struct kvlist *l)
{
	mc_buf_free(&l->bytes);
	free(l->e);
	memset(l, 0, sizeof(*l));
}

/* etcd's kvindex.Keep(rev): the version each key shows at rev, if live. */
static bool kept_at(const struct mvcc_version *v, int64_t rev)
{
	return !v->tombstone && v->main <= rev && v->next_main > rev;
}

/* Whether etcd's key bucket still holds v: its compaction at C deletes
 * every revision at or below C but the ones kept at C — a tombstone at
 * exactly C too, which the store keeps (reads at C answer the same). */
static bool in_backend(const struct mvcc_version *v, int64_t compact_rev)
{
	return v->main > compact_rev || kept_at(v, compact_rev);
}

struct key_walk {
	struct sink *sk;
	struct mc_buf val;
	int64_t compact_rev;
};

static int key_entry(void *ctx, const struct mvcc_version *v)
{
	struct key_walk *w = ctx;
	uint8_t k[18];

	if (!in_backend(v, w->compact_rev))
		return 0;
	size_t kl = rev_bytes(k, v->main, v->sub, v->tombstone);
	mc_buf_reset(&w->val);
	int rc = enc_kv(&w->val, v);
	return rc ? rc : w->sk->kv(w->sk, k, kl, w->val.data ? w->val.data : "", w->val.len);
}

struct lease_walk {
	struct kvlist *l;
	struct mc_buf val;
};

static int lease_entry(void *ctx, int64_t id, int64_t ttl_s, int64_t remaining_ttl_s)
{
	struct lease_walk *w = ctx;
	uint8_t k[8];
	mc_put_be64(k, (uint64_t)id);
	mc_buf_reset(&w->val);
	int rc = pb_int(&w->val, 1, id);
	if (!rc && !(rc = pb_int(&w->val, 2, ttl_s)))
		rc = pb_int(&w->val, 3, remaining_ttl_s);
	return rc ? rc : kvlist_add(w->l, k, 8, w->val.data ? w->val.data : "", w->val.len);
}

static int walk(const struct bolt_state *st, struct sink *sk)
{
	struct kvlist l = {0};
	struct mc_buf tmp = MC_BUF_INIT;
	struct key_walk kw = {.sk = sk, .compact_rev = mvcc_compact_rev(st->store)};
	struct lease_walk lw = {.l = &l};
	char hex[24];
	int rc;

	/* alarm */
	if ((rc = sk->bucket(sk, "alarm")))
		goto out;
	for (size_t i = 0; i < st->n_alarms; i++) {
		mc_buf_reset(&tmp);
		if ((rc = pb_int(&tmp, 1, (int64_t)st->alarms[i].member_id)) ||
		    (rc = pb_int(&tmp, 2, st->alarms[i].alarm)) ||
		    (rc = kvlist_add(&l, tmp.data ? tmp.data : "", tmp.len, "", 0)))
			goto out;
	}
	if ((rc = kvlist_emit(&l, sk)))
		goto out;
	kvlist_reset(&l);

	/* cluster */
	if ((rc = sk->bucket(sk, "cluster")) ||
	    (rc = sk->kv(sk, "clusterVersion", 14, CLUSTER_VERSION, strlen(CLUSTER_VERSION))))
		goto out;

	/* key */
	if ((rc = sk->bucket(sk, "key")) || (rc = mvcc_versions(st->store, key_entry, &kw)))
		goto out;

	/* lease */
	if ((rc = sk->bucket(sk, "lease")) ||
	    (rc = lease__foreach(mvcc_leases(st->store), lease_entry, &lw)) ||
	    (rc = kvlist_emit(&l, sk)))
		goto out;
	kvlist_reset(&l);

	/* members */
	if ((rc = sk->bucket(sk, "members")))
		goto out;
	for (size_t i = 0; i < st->n_members; i++) {
		mc_buf_reset(&tmp);
		snprintf(hex, sizeof(hex), "%" PRIx64, st->members[i].id);
		if ((rc = enc_member(&tmp, &st->members[i])) ||
		    (rc = kvlist_add(&l, hex, strlen(hex), tmp.data, tmp.len)))
			goto out;
	}
	if ((rc = kvlist_emit(&l, sk)))
		goto out;
	kvlist_reset(&l);

	/* members_removed */
	if ((rc = sk->bucket(sk, "members_removed")))
		goto out;
	for (size_t i = 0; i < st->n_removed; i++) {
		snprintf(hex, sizeof(hex), "%" PRIx64, st->removed[i]);
		if ((rc = kvlist_add(&l, hex, strlen(hex), "removed", 7)))
			goto out;
	}
	if ((rc = kvlist_emit(&l, sk)))
		goto out;
	kvlist_reset(&l);

	/* meta, keys in byte order */
	uint8_t ci[8], cr[17];
	mc_put_be64(ci, st->consistent_index);
	if ((rc = sk->bucket(sk, "meta")) || (rc = sk->kv(sk, "consistent_index", 16, ci, 8)))
		goto out;
	if (kw.compact_rev > 0) {
		rev_bytes(cr, kw.compact_rev, 0, false);
		if ((rc = sk->kv(sk, "finishedCompactRev", 18, cr, 17)) ||
		    (rc = sk->kv(sk, "scheduledCompactRev", 19, cr, 17)))
			goto out;
	}
out:
	kvlist_free(&l);
	mc_buf_free(&tmp);
	mc_buf_free(&kw.val);
	mc_buf_free(&lw.val);
	return rc;
}

/* ------------------------------------------------------------- hashes */

struct hash_sink {
	struct sink sk;
	uint32_t crc;
	bool in_meta;
};

static int hash_bucket(struct sink *sk, const char *name)
{
	struct hash_sink *h = (struct hash_sink *)sk;
	h->crc = crc32c(h->crc, name, strlen(name));
	h->in_meta = strcmp(name, "meta") == 0;
	return 0;
}

static int hash_kv(struct sink *sk, const void *k, size_t klen, const void *v, size_t vlen)
{
	struct hash_sink *h = (struct hash_sink *)sk;
	if (h->in_meta && klen == 16 && memcmp(k, "consistent_index", 16) == 0)
		return 0; /* etcd's DefaultIgnores */
	h->crc = crc32c(h->crc, k, klen);
	h->crc = crc32c(h->crc, v, vlen);
	return 0;
}

int bolt_hash(const struct bolt_state *st, uint32_t *hash)
{
	struct hash_sink h = {.sk = {hash_bucket, hash_kv}};
	int rc = walk(st, &h.sk);
	if (!rc)
		*hash = h.crc;
	return rc;
}

struct kvhash {
	uint32_t crc;
	int64_t rev, compact_rev;
	bool keep_any;
	struct mc_buf val;
};

static int kvhash_probe(void *ctx, const struct mvcc_version *v)
{
	struct kvhash *h = ctx;
	if (kept_at(v, h->rev)) {
		h->keep_any = true;
		return 1; /* enough */
	}
	return 0;
}

static int kvhash_entry(void *ctx, const struct mvcc_version *v)
{
	struct kvhash *h = ctx;
	uint8_t k[18];

	if (v->main > h->rev)
		return 1; /* revision order: nothing later counts */
	if (!in_backend(v, h->compact_rev))
		return 0;
	if (v->main <= h->compact_rev && h->keep_any && !kept_at(v, h->rev))
		return 0; /* scheduled for deletion by the compaction */
	size_t kl = rev_bytes(k, v->main, v->sub, v->tombstone);
	mc_buf_reset(&h->val);
	int rc = enc_kv(&h->val, v);
	if (rc)
		return rc;
	h->crc = crc32c(h->crc, k, kl);
	h->crc = crc32c(h->crc, h->val.data ? h->val.data : "", h->val.len);
	return 0;
}

int bolt_hash_kv(const struct mvcc_store *s, int64_t rev, uint32_t *hash, int64_t *current,
		 int64_t *compact)
{
	struct kvhash h = {.compact_rev = mvcc_compact_rev(s)};
	int64_t cur = mvcc_rev(s);
	int rc;

	*current = cur;
	*compact = h.compact_rev;
	if (rev > 0 && rev <= h.compact_rev)
		return MVCC_ECOMPACTED;
	if (rev > cur)
		return MVCC_EFUTURE_REV;
	h.rev = rev > 0 ? rev : cur;
	rc = mvcc_versions(s, kvhash_probe, &h);
	if (rc == 1)
		rc = 0;
	h.crc = crc32c(0, "key", 3);
	if (!rc)
		rc = mvcc_versions(s, kvhash_entry, &h);
	if (rc == 1)
		rc = 0;
	mc_buf_free(&h.val);
	if (!rc)
		*hash = h.crc;
	return rc;
}

/* ------------------------------------------------------------- pages */

/* The elements of the page being filled at one level of a bucket. */
struct level {
	bool leaf;
	struct mc_buf data; /* keys and values, in element order */
	struct lelem {
		uint32_t flags;
		size_t off, ksize, vsize;
		uint64_t pgid; /* branch: the child */
	} * el;
	size_t n, cap;
	size_t bytes; /* header + elements + data */
};

/* A page written below, for the level above: its first key and ID. */
struct pref {
	size_t koff, klen;
	uint64_t pgid;
};

struct prefs {
	struct mc_buf keys;
	struct pref *v;
	size_t n, cap;
};

struct image {
	struct sink sk;
	struct mc_buf out; /* whole pages; the first three filled last */
	uint64_t next_pgid;
	struct level leaf;
	struct prefs below; /* pages of the current bucket's level below */
	/* the buckets written, for the root bucket's page */
	struct prefs buckets;
	char cur[32]; /* the bucket being written ("" before the first) */
};

static int prefs_add(struct prefs *p, const void *k, size_t klen, uint64_t pgid)
{
	if (p->n == p->cap) {
		size_t cap = p->cap ? 2 * p->cap : 16;
		struct pref *v = realloc(p->v, cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		p->v = v;
		p->cap = cap;
	}
	p->v[p->n] = (struct pref){p->keys.len, klen, pgid};
	int rc = mc_buf_append(&p->keys, k, klen);
	if (!rc)
		p->n++;
	return rc;
}

static void prefs_free(struct prefs *p)
{
	mc_buf_free(&p->keys);
	free(p->v);
	memset(p, 0, sizeof(*p));
}

static void level_reset(struct level *l, bool leaf)
{
	mc_buf_reset(&l->data);
	l->n = 0;
	l->leaf = leaf;
	l->bytes = PAGE_HEADER;
}

static int level_add(struct level *l, uint32_t flags, const void *k, size_t klen,
		     const void *v, size_t vlen, uint64_t pgid)
{
	if (l->n == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 64;
		struct lelem *e = realloc(l->el, cap * sizeof(*e));
		if (!e)
			return -ENOMEM;
		l->el = e;
		l->cap = cap;
	}
	struct lelem *e = &l->el[l->n];
	*e = (struct lelem){flags, l->data.len, klen, vlen, pgid};
	int rc = mc_buf_append(&l->data, k, klen);
	if (!rc && vlen)
		rc = mc_buf_append(&l->data, v, vlen);
	if (rc)
		return rc;
	l->n++;
	l->bytes += ELEM_BYTES + klen + vlen;
	return 0;
}

/* Write the level's page (with its overflow) and note it in up. */
static int level_flush(struct image *im, struct level *l, struct prefs *up)
{
	if (l->n > 0xFFFF || l->bytes > MAX_PAGE_SPAN)
		return -EOVERFLOW;
	size_t npages = (l->bytes + PAGE - 1) / PAGE;
	if (mc_buf_reserve(&im->out, npages * PAGE))
		return -ENOMEM;
	uint8_t *p = (uint8_t *)im->out.data + im->out.len;
	uint64_t id = im->next_pgid;
	memset(p, 0, npages * PAGE);
	mc_put_le64(p, id);
	mc_put_le16(p + 8, l->leaf ? LEAF_FLAG : BRANCH_FLAG);
	mc_put_le16(p + 10, (uint16_t)l->n);
	mc_put_le32(p + 12, (uint32_t)(npages - 1));
	size_t data_at = PAGE_HEADER + l->n * ELEM_BYTES;
	for (size_t i = 0; i < l->n; i++) {
		const struct lelem *e = &l->el[i];
		uint8_t *el = p + PAGE_HEADER + i * ELEM_BYTES;
		uint32_t pos = (uint32_t)(data_at + e->off - (PAGE_HEADER + i * ELEM_BYTES));
		if (l->leaf) {
			mc_put_le32(el, e->flags);
			mc_put_le32(el + 4, pos);
			mc_put_le32(el + 8, (uint32_t)e->ksize);
			mc_put_le32(el + 12, (uint32_t)e->vsize);
		} else {
			mc_put_le32(el, pos);
			mc_put_le32(el + 4, (uint32_t)e->ksize);
			mc_put_le64(el + 8, e->pgid);
		}
	}
	if (l->data.len)
		memcpy(p + data_at, l->data.data, l->data.len);
	im->out.len += npages * PAGE;
	im->next_pgid += npages;
	int rc = prefs_add(up, l->n ? l->data.data + l->el[0].off : "",
			   l->n ? l->el[0].ksize : 0, id);
	level_reset(l, l->leaf);
	return rc;
}

static bool level_fits(const struct level *l, size_t extra)
{
	return l->n == 0 || l->bytes + ELEM_BYTES + extra <= PAGE;
}

/* The current bucket is complete: its last leaf page, then branch levels
 * until one page remains, the bucket's root. */
static int bucket_end(struct image *im, const char *name)
{
	struct level br = {0};
	struct prefs up = {0};
	int rc = 0;

	if (im->leaf.n || !im->below.n)
		rc = level_flush(im, &im->leaf, &im->below);
	while (!rc && im->below.n > 1) {
		level_reset(&br, false);
		for (size_t i = 0; i < im->below.n && !rc; i++) {
			const struct pref *c = &im->below.v[i];
			if (!level_fits(&br, c->klen))
				rc = level_flush(im, &br, &up);
			if (!rc)
				rc = level_add(&br, 0, im->below.keys.data + c->koff, c->klen,
					       NULL, 0, c->pgid);
		}
		if (!rc)
			rc = level_flush(im, &br, &up);
		prefs_free(&im->below);
		im->below = up;
		memset(&up, 0, sizeof(up));
	}
	if (!rc)
		rc = prefs_add(&im->buckets, name, strlen(name), im->below.v[0].pgid);
	prefs_free(&im->below);
	prefs_free(&up);
	mc_buf_free(&br.data);
	free(br.el);
	return rc;
}

static int image_bucket(struct sink *sk, const char *name)
{
	struct image *im = (struct image *)sk;
	int rc = im->cur[0] ? bucket_end(im, im->cur) : 0;
	snprintf(im->cur, sizeof(im->cur), "%s", name);
	level_reset(&im->leaf, true);
	return rc;
}

static int image_kv(struct sink *sk, const void *k, size_t klen, const void *v, size_t vlen)
{
	struct image *im = (struct image *)sk;
	if (!level_fits(&im->leaf, klen + vlen)) {
		int rc = level_flush(im, &im->leaf, &im->below);
		if (rc)
			return rc;
	}
	return level_add(&im->leaf, 0, k, klen, v, vlen, 0);
}

/* FNV-1a, 64 bits: bbolt's meta checksum. */
static uint64_t fnv64a(const uint8_t *p, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ull;
	for (size_t i = 0; i < n; i++) {
		h ^= p[i];
		h *= 0x100000001b3ull;
	}
	return h;
}

static void write_meta(uint8_t *page, uint64_t pgid, uint64_t root, uint64_t hwm,
		       uint64_t txid)
{
	uint8_t *m = page + PAGE_HEADER;
	mc_put_le64(page, pgid);
	mc_put_le16(page + 8, META_FLAG);
	mc_put_le32(m, MAGIC);
	mc_put_le32(m + 4, VERSION);
	mc_put_le32(m + 8, PAGE);
	mc_put_le32(m + 12, 0);
	mc_put_le64(m + 16, root); /* root bucket: root page, sequence 0 */
	mc_put_le64(m + 24, 0);
	mc_put_le64(m + 32, FREELIST_PGID);
	mc_put_le64(m + 40, hwm);
	mc_put_le64(m + 48, txid);
	mc_put_le64(m + 56, fnv64a(m, 56));
}

int bolt_image(const struct bolt_state *st, uint8_t **out, size_t *len)
{
	struct image im = {.sk = {image_bucket, image_kv}};
	struct level root = {0};
	struct prefs rootref = {0};
	int rc = -ENOMEM;

	if (mc_buf_reserve(&im.out, FIRST_DATA_PGID * PAGE))
		goto out;
	memset(im.out.data, 0, FIRST_DATA_PGID * PAGE);
	im.out.len = FIRST_DATA_PGID * PAGE;
	im.next_pgid = FIRST_DATA_PGID;
	if ((rc = walk(st, &im.sk)) || (im.cur[0] && (rc = bucket_end(&im, im.cur))))
		goto out;
	/* The root bucket: one element per bucket, its value the bucket's
	 * header {root page, sequence}. */
	level_reset(&root, true);
	for (size_t i = 0; i < im.buckets.n; i++) {
		uint8_t hdr[16];
		mc_put_le64(hdr, im.buckets.v[i].pgid);
		mc_put_le64(hdr + 8, 0);
		if ((rc = level_add(&root, BUCKET_LEAF_FLAG,
				    im.buckets.keys.data + im.buckets.v[i].koff,
				    im.buckets.v[i].klen, hdr, sizeof(hdr), 0)))
			goto out;
	}
	if (root.bytes > PAGE) {
		rc = -EOVERFLOW;
		goto out;
	}
	if ((rc = level_flush(&im, &root, &rootref)))
		goto out;
	uint64_t root_pgid = rootref.v[0].pgid, hwm = im.next_pgid;
	uint8_t *p = (uint8_t *)im.out.data;
	write_meta(p, 0, root_pgid, hwm, 2);
	write_meta(p + PAGE, 1, root_pgid, hwm, 3);
	mc_put_le64(p + FREELIST_PGID * PAGE, FREELIST_PGID);
	mc_put_le16(p + FREELIST_PGID * PAGE + 8, FREELIST_FLAG);
	*out = (uint8_t *)im.out.data;
	*len = im.out.len;
	im.out.data = NULL;
	rc = 0;
out:
	mc_buf_free(&im.out);
	mc_buf_free(&im.leaf.data);
	free(im.leaf.el);
	prefs_free(&im.below);
	prefs_free(&im.buckets);
	mc_buf_free(&root.data);
	free(root.el);
	prefs_free(&rootref);
	return rc;
}
