/*
 * mvcc: the multi-version key-value store (see mvcc.h for the model) —
 * this file holds the store itself: errors, key nodes with their version
 * arrays, the revision log, result arenas, compaction, the history cursor
 * that watchers read and the version walk that the etcd backend export
 * and HashKV use. Requests are applied in mvcc_txn.c, snapshots encoded
 * and decoded in mvcc_snap.c; the three share mvcc_int.h.
 */
#include "meta/mvcc.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "meta/avl.h"
#include "meta/lease.h"
#include "meta/mvcc_int.h"

/* ------------------------------------------------------------- errors */

const char *mvcc_strerror(int code)
{
	switch (code) {
#define MVCC__ERR_TEXT(name, value, text) \
	case name: \
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
#define MVCC__ERR_NAME(name, value, text) \
	case name: \
		return #name;
		MVCC_ERRORS(MVCC__ERR_NAME)
#undef MVCC__ERR_NAME
	default:
		return mc_errname(code);
	}
}

/* ------------------------------------------------------------- bytes */

/* ------------------------------------------------------------- store */

const char mvcc__empty[1] = "";

static int key_cmp(const void *key, const struct avl_node *n)
{
	const struct mvcc__bytes *b = key;
	const struct mvcc__key *k = MC_CONTAINER_OF(n, struct mvcc__key, node);
	return mc_bytes_cmp(b->p, b->n, k->key, k->klen);
}

struct mvcc__key *mvcc__find_key(const struct mvcc_store *s, const char *key, size_t len)
{
	struct mvcc__bytes b = {key, len};
	return mvcc__key_of(avl_find(&s->keys, &b));
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

const struct mvcc__ver *mvcc__live_at(const struct mvcc__key *k, int64_t rev)
{
	const struct mvcc__ver *v = ver_at(k, rev);
	return mvcc__ver_live(v) ? v : NULL;
}

void mvcc__key_free(struct mvcc_store *s, struct mvcc__key *k)
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
		mvcc__key_free(s, mvcc__key_of(n));
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
	s->done_rev = -1;
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
	out->memory_bytes = sizeof(*s) + s->keys.count * sizeof(struct mvcc__key) +
			    s->key_bytes + s->value_bytes +
			    s->hist_slots * sizeof(struct mvcc__ver) +
			    s->rl_cap * sizeof(struct mvcc__rent);
}

/* ------------------------------------------------------------- spans */

void mvcc__span_init(struct mvcc__span *sp, const char *key, size_t klen, const char *end,
		     size_t elen)
{
	sp->key = key;
	sp->klen = klen;
	sp->end = end;
	sp->elen = elen;
	sp->single = elen == 0;
	sp->unbounded = elen == 1 && end[0] == '\0';
}

static struct mvcc__key *scan_check(struct mvcc__scan *sc, struct mvcc__key *k)
{
	if (!k)
		return NULL;
	if (!sc->sp.unbounded && mc_bytes_cmp(k->key, k->klen, sc->sp.end, sc->sp.elen) >= 0)
		return NULL;
	return k;
}

struct mvcc__key *mvcc__scan_first(struct mvcc__scan *sc, const struct mvcc_store *s,
				   const struct mvcc__span *sp)
{
	sc->sp = *sp;
	sc->done = false;
	if (sp->single) {
		sc->done = true;
		return mvcc__find_key(s, sp->key, sp->klen);
	}
	struct mvcc__bytes b = {sp->key, sp->klen};
	return scan_check(sc, mvcc__key_of(avl_seek(&sc->it, &s->keys, &b)));
}

struct mvcc__key *mvcc__scan_next(struct mvcc__scan *sc)
{
	if (sc->done)
		return NULL;
	return scan_check(sc, mvcc__key_of(avl_next(&sc->it)));
}

/* ------------------------------------------------------------- arena */

void *mvcc__arena_alloc(struct mvcc__blk **a, size_t n)
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

void mvcc__kv_borrow(struct mvcc_kv *out, const struct mvcc__key *k, const struct mvcc__ver *v)
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

int mvcc__kv_copy(struct mvcc__blk **a, struct mvcc_kv *out, const struct mvcc__key *k,
		  const struct mvcc__ver *v, bool with_value)
{
	size_t vlen = with_value ? v->vlen : 0;
	char *p = mvcc__arena_alloc(a, (size_t)k->klen + vlen);
	if (!p)
		return -ENOMEM;
	mvcc__kv_borrow(out, k, v);
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
int mvcc__grow(void **arr, size_t *cap, size_t need, size_t elem)
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

int mvcc__rl_reserve(struct mvcc_store *s, size_t extra)
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
	return mvcc__grow((void **)&s->rl, &s->rl_cap, s->rl_len + extra, sizeof(*s->rl));
}

int mvcc__hist_reserve(struct mvcc_store *s, struct mvcc__key *k, size_t extra)
{
	size_t need = (size_t)k->nhist + extra;
	if (need <= k->caphist)
		return 0;
	/* Two slots at first: the next write of a key (an update or its
	 * delete) then needs no reallocation. A DeleteRange of many keys
	 * would otherwise reallocate every one of them in a single apply. */
	size_t nc = k->caphist ? (size_t)k->caphist * 2 : 2;
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

struct mvcc__key *mvcc__key_alloc(struct mvcc_store *s, const char *key, size_t klen)
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
		s->db_size -= mvcc__ver_size(k, &k->hist[d]);
		s->value_bytes -= k->hist[d].vlen;
		free(k->hist[d].value);
	}
	s->nversions -= n;
	k->nhist -= n;
	memmove(k->hist, k->hist + n, k->nhist * sizeof(*k->hist));
}

/* The first revision-log index at or after rev (rl_len: none). */
static size_t rl_seek(const struct mvcc_store *s, int64_t rev)
{
	size_t lo = s->rl_head, hi = s->rl_len;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (s->rl[mid].main < rev)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* What compaction at rev drops of the key of e, a log entry below rev. */
static void compact_entry(struct mvcc_store *s, const struct mvcc__rent *e, int64_t rev)
{
	struct mvcc__key *k = e->key;
	uint32_t j = hist_index(k, e->main, e->sub);
	if (j + 1 < k->nhist && k->hist[j + 1].main < rev)
		return; /* not the key's newest version below rev */
	/* Drop everything before j; j too when it is a tombstone or a
	 * version at exactly rev supersedes it. */
	uint32_t drop = j;
	if (!mvcc__ver_live(&k->hist[j]) || (j + 1 < k->nhist && k->hist[j + 1].main == rev))
		drop = j + 1;
	drop_oldest(s, k, drop);
	if (k->nhist == 0) {
		struct mvcc__bytes b = {k->key, k->klen};
		avl_remove(&s->keys, &b);
		mvcc__key_free(s, k);
	} else if (k->caphist > 2 * k->nhist) {
		void *p = realloc(k->hist, k->nhist * sizeof(*k->hist));
		if (p) {
			k->hist = p;
			s->hist_slots -= k->caphist - k->nhist;
			k->caphist = k->nhist;
		}
	}
}

int mvcc_compact_lazy(struct mvcc_store *s, int64_t rev)
{
	if (rev <= s->compact_rev)
		return MVCC_ECOMPACTED;
	if (rev > s->rev)
		return MVCC_EFUTURE_REV;
	s->compact_rev = rev;
	return 0;
}

bool mvcc_compact_pending(const struct mvcc_store *s)
{
	return s->done_rev != s->compact_rev;
}

int mvcc_compact_work(struct mvcc_store *s, size_t max_entries)
{
	int64_t rev = s->compact_rev;
	size_t n = 0, i = s->rl_head;

	if (s->done_rev == rev)
		return 1;
	for (; n < max_entries && i < s->rl_len && s->rl[i].main < rev; i++, n++)
		compact_entry(s, &s->rl[i], rev);
	s->rl_base += i - s->rl_head;
	s->rl_head = i;
	if (n)
		s->generation++; /* versions were freed */
	if (i < s->rl_len && s->rl[i].main < rev)
		return 0;
	/* A version at exactly rev supersedes every older one of its key,
	 * also those an earlier compaction kept (their log entries are
	 * gone, so the walk above did not see them). The entries stay. */
	if (s->eq_rev != rev || s->eq_pos < s->rl_head) {
		s->eq_rev = rev;
		s->eq_pos = s->rl_head;
	}
	for (; n < max_entries && s->eq_pos < s->rl_len && s->rl[s->eq_pos].main == rev;
	     s->eq_pos++, n++) {
		struct mvcc__key *k = s->rl[s->eq_pos].key;
		uint32_t below = hist_index(k, rev, 0);
		if (below) {
			drop_oldest(s, k, below);
			s->generation++;
		}
	}
	if (s->eq_pos < s->rl_len && s->rl[s->eq_pos].main == rev)
		return 0;
	s->done_rev = rev;
	size_t live = s->rl_len - s->rl_head;
	if (s->rl_head > live) {
		memmove(s->rl, s->rl + s->rl_head, live * sizeof(*s->rl));
		s->rl_len = live;
		s->rl_head = 0;
		s->eq_pos = 0;
	}
	return 1;
}

int mvcc_compact(struct mvcc_store *s, int64_t rev)
{
	int rc = mvcc_compact_lazy(s, rev);
	if (rc == 0)
		(void)mvcc_compact_work(s, SIZE_MAX);
	return rc;
}

int64_t mvcc_compact_step(const struct mvcc_store *s, int64_t to, size_t max_entries)
{
	/* The walk starts at the first entry not compacted yet. */
	size_t head = rl_seek(s, s->compact_rev);
	if (to <= s->compact_rev || s->rl_len - head <= max_entries)
		return to;
	/* Every entry below rl[head + max_entries]'s revision lies before it. */
	int64_t r = s->rl[head + max_entries].main;
	if (r <= s->rl[head].main)
		r = s->rl[head].main + 1; /* the first revision alone is bigger */
	if (r <= s->compact_rev)
		r = s->compact_rev + 1;
	return r < to ? r : to;
}

/* ------------------------------------------------------------- history */

int mvcc_hist_seek(const struct mvcc_store *s, int64_t rev, uint64_t *pos)
{
	if (rev < s->compact_rev)
		return MVCC_ECOMPACTED;
	*pos = s->rl_base + (rl_seek(s, rev) - s->rl_head);
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
	if (e->main < s->compact_rev)
		return MVCC_ECOMPACTED; /* compacted, not freed yet */
	const struct mvcc__key *k = e->key;
	uint32_t j = hist_index(k, e->main, e->sub);
	if (j >= k->nhist || k->hist[j].main != e->main || k->hist[j].sub != e->sub)
		return MC_EINTERNAL; /* the log and the history disagree: a bug */
	const struct mvcc__ver *v = &k->hist[j];
	memset(ev, 0, sizeof(*ev));
	if (mvcc__ver_live(v)) {
		ev->type = MVCC_EVENT_PUT;
		mvcc__kv_borrow(&ev->kv, k, v);
	} else {
		ev->type = MVCC_EVENT_DELETE;
		ev->kv.key = k->key;
		ev->kv.key_len = k->klen;
		ev->kv.value = mvcc__empty;
		ev->kv.mod_revision = v->main;
	}
	/* The previous version, unless a compaction dropped it (not freed
	 * yet: a version at exactly the compaction replaced it). */
	if (j > 0 && mvcc__ver_live(&k->hist[j - 1]) &&
	    (k->hist[j - 1].main >= s->compact_rev || v->main != s->compact_rev)) {
		ev->has_prev_kv = true;
		mvcc__kv_borrow(&ev->prev_kv, k, &k->hist[j - 1]);
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
	const struct mvcc__ver *x =
		&((const struct vref *)a)->k->hist[((const struct vref *)a)->i];
	const struct mvcc__ver *y =
		&((const struct vref *)b)->k->hist[((const struct vref *)b)->i];
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

	for (struct avl_node *x = avl_seek(&it, &s->keys, NULL); x; x = avl_next(&it)) {
		const struct mvcc__key *k = mvcc__key_of(x);
		if ((rc = mvcc__grow((void **)&refs, &cap, n + k->nhist, sizeof(*refs))))
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
			.tombstone = !mvcc__ver_live(v),
			.next_main = i + 1 < k->nhist ? k->hist[i + 1].main : INT64_MAX,
		};
		if (out.tombstone) {
			out.kv.key = k->key;
			out.kv.key_len = k->klen;
			out.kv.value = mvcc__empty;
			out.kv.mod_revision = v->main;
		} else {
			mvcc__kv_borrow(&out.kv, k, v);
		}
		rc = fn(ctx, &out);
	}
out:
	free(refs);
	return rc;
}
