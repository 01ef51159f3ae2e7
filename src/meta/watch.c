/*
 * watch: the watcher registry (see watch.h for the model).
 *
 * A watcher is in exactly one state:
 *   SYNCED   — in the match index (a bucket of the key tree for a single
 *              key, the interval tree for a range); watch_notify() routes
 *              events to it.
 *   UNSYNCED — on the unsynced FIFO with next_rev, the first revision it
 *              still has to see; watch_sync() catches it up.
 *   DEAD     — its history was compacted; only its notice is left.
 * Every watcher is in by_id; one with something to hand out is on the
 * ready FIFO.
 *
 * The interval tree is the shared AVL tree keyed by (start, id), each node
 * augmented with the largest end in its subtree, so a stabbing query skips
 * every subtree that ends at or before the key.
 *
 * During routing a watcher that overflows is marked UNSYNCED at once (so
 * it takes nothing more of that revision) but leaves the index only after
 * the event is routed, through the `moving` list: the index is never
 * changed while it is being walked.
 */
#include "meta/watch.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "meta/avl.h"

enum { W_SYNCED, W_UNSYNCED, W_DEAD };

/* A shared event: refs holders, two views (with and without prev_kv). */
struct watch__ev {
	int refs;
	struct mvcc_event ev;
	struct mvcc_event ev_noprev;
	char data[];
};

struct watch__link {
	struct watch__link *prev, *next;
};
struct watch__list {
	struct watch__link *head, *tail;
	size_t n;
};

struct watch__bucket;

struct watch__w {
	struct avl_node by_id;
	struct avl_node by_range;
	struct watch__link blink; /* bucket list (synced single key) */
	struct watch__link ulink; /* unsynced list */
	struct watch__link rlink; /* ready list */
	struct watch__w *mnext;   /* moving list during routing */
	struct watch__bucket *bucket;
	bool in_ready;
	bool paused; /* kept off the ready FIFO */
	int state;
	int64_t id;
	uint64_t tag;
	char *key, *end;
	size_t klen, elen;
	bool single, unbounded;
	bool prev_kv, progress_notify, noput, nodelete;
	int64_t min_rev;  /* events below it are not for this watcher */
	int64_t next_rev; /* UNSYNCED: the next revision to catch up from */
	int64_t compact_rev;
	struct watch__ev **buf;
	size_t len, cap;
	size_t stage_start; /* where the events of stage_rev begin */
	int64_t stage_rev;
	bool sent_since_progress;
	/* interval tree augmentation: the largest end in the subtree */
	const char *aug_end;
	size_t aug_elen;
	bool aug_inf;
};

struct watch__bucket {
	struct avl_node node;
	struct watch__list ws;
	size_t klen;
	char key[];
};

struct watch_registry {
	struct avl_tree by_id;
	struct avl_tree keys;   /* buckets of synced single-key watchers */
	struct avl_tree ranges; /* synced range watchers */
	struct watch__list unsynced;
	struct watch__list ready;
	struct watch__w *moving;
	size_t max_pending;
	size_t pending;
	size_t synced;
	int64_t rev; /* last revision routed */
	int64_t next_id;
};

struct wbytes {
	const char *p;
	size_t n;
};

struct range_key {
	const char *p;
	size_t n;
	int64_t id;
};

#define W_OF(link, member) MC_CONTAINER_OF(link, struct watch__w, member)

/* ------------------------------------------------------------- lists */

static void list_append(struct watch__list *l, struct watch__link *x)
{
	x->next = NULL;
	x->prev = l->tail;
	if (l->tail)
		l->tail->next = x;
	else
		l->head = x;
	l->tail = x;
	l->n++;
}

static void list_remove(struct watch__list *l, struct watch__link *x)
{
	if (x->prev)
		x->prev->next = x->next;
	else
		l->head = x->next;
	if (x->next)
		x->next->prev = x->prev;
	else
		l->tail = x->prev;
	x->prev = x->next = NULL;
	l->n--;
}

/* ------------------------------------------------------------- trees */

static int cmp_i64(int64_t a, int64_t b)
{
	return a < b ? -1 : a > b;
}

static int by_id_cmp(const void *key, const struct avl_node *n)
{
	return cmp_i64(*(const int64_t *)key, W_OF(n, by_id)->id);
}

static int bucket_cmp(const void *key, const struct avl_node *n)
{
	const struct wbytes *b = key;
	const struct watch__bucket *bk = MC_CONTAINER_OF(n, struct watch__bucket, node);
	return mc_bytes_cmp(b->p, b->n, bk->key, bk->klen);
}

static int range_cmp(const void *key, const struct avl_node *n)
{
	const struct range_key *k = key;
	const struct watch__w *w = W_OF(n, by_range);
	int c = mc_bytes_cmp(k->p, k->n, w->key, w->klen);
	return c ? c : cmp_i64(k->id, w->id);
}

/* end a vs b, an unbounded end being the largest */
static int end_cmp(bool ainf, const char *a, size_t an, bool binf, const char *b, size_t bn)
{
	if (ainf || binf)
		return ainf - binf;
	return mc_bytes_cmp(a, an, b, bn);
}

static void range_aug(struct avl_node *n)
{
	struct watch__w *w = W_OF(n, by_range);
	w->aug_inf = w->unbounded;
	w->aug_end = w->end;
	w->aug_elen = w->elen;
	for (int i = 0; i < 2; i++) {
		if (!n->child[i])
			continue;
		const struct watch__w *c = W_OF(n->child[i], by_range);
		if (end_cmp(c->aug_inf, c->aug_end, c->aug_elen, w->aug_inf, w->aug_end,
			    w->aug_elen) > 0) {
			w->aug_inf = c->aug_inf;
			w->aug_end = c->aug_end;
			w->aug_elen = c->aug_elen;
		}
	}
}

/* ------------------------------------------------------------- events */

static struct watch__ev *ev_new(const struct mvcc_event *src)
{
	const struct mvcc_kv *kv = &src->kv, *pk = &src->prev_kv;
	size_t size = kv->key_len + kv->value_len;
	if (src->has_prev_kv)
		size += pk->key_len + pk->value_len;
	struct watch__ev *e = malloc(sizeof(*e) + size + 1);
	if (!e)
		return NULL;
	e->refs = 1;
	char *p = e->data;
	e->ev = *src;
	memcpy(p, kv->key, kv->key_len);
	e->ev.kv.key = p;
	p += kv->key_len;
	if (kv->value_len)
		memcpy(p, kv->value, kv->value_len);
	e->ev.kv.value = p;
	p += kv->value_len;
	if (src->has_prev_kv) {
		memcpy(p, pk->key, pk->key_len);
		e->ev.prev_kv.key = p;
		p += pk->key_len;
		if (pk->value_len)
			memcpy(p, pk->value, pk->value_len);
		e->ev.prev_kv.value = p;
		p += pk->value_len;
	}
	*p = '\0';
	e->ev_noprev = e->ev;
	e->ev_noprev.has_prev_kv = false;
	memset(&e->ev_noprev.prev_kv, 0, sizeof(e->ev_noprev.prev_kv));
	return e;
}

static void ev_unref(struct watch__ev *e)
{
	if (e && --e->refs == 0)
		free(e);
}

/* ------------------------------------------------------------- watchers */

static struct watch__w *find(const struct watch_registry *r, int64_t id)
{
	struct avl_node *n = avl_find(&r->by_id, &id);
	return n ? W_OF(n, by_id) : NULL;
}

static void ready_add(struct watch_registry *r, struct watch__w *w)
{
	if (!w->in_ready && !w->paused) {
		list_append(&r->ready, &w->rlink);
		w->in_ready = true;
	}
}

static void ready_remove(struct watch_registry *r, struct watch__w *w)
{
	if (w->in_ready) {
		list_remove(&r->ready, &w->rlink);
		w->in_ready = false;
	}
}

/* Drop the buffered events from index `from` on. */
static void buf_truncate(struct watch_registry *r, struct watch__w *w, size_t from)
{
	while (w->len > from) {
		ev_unref(w->buf[--w->len]);
		r->pending--;
	}
	if (!w->len && w->state != W_DEAD)
		ready_remove(r, w);
}

/* Add e (revision rev) to w's buffer; false when it does not fit. */
static bool buf_push(struct watch_registry *r, struct watch__w *w, struct watch__ev *e,
		     int64_t rev)
{
	if (w->stage_rev != rev) {
		w->stage_rev = rev;
		w->stage_start = w->len;
	}
	if (w->len >= r->max_pending && w->stage_start > 0)
		return false;
	if (w->len == w->cap) {
		size_t nc = w->cap ? w->cap * 2 : 4;
		void *p = realloc(w->buf, nc * sizeof(*w->buf));
		if (!p)
			return false;
		w->buf = p;
		w->cap = nc;
	}
	w->buf[w->len++] = e;
	e->refs++;
	r->pending++;
	w->sent_since_progress = true;
	ready_add(r, w);
	return true;
}

static bool matches_key(const struct watch__w *w, const char *key, size_t len)
{
	if (w->single)
		return !mc_bytes_cmp(w->key, w->klen, key, len);
	return mc_bytes_cmp(w->key, w->klen, key, len) <= 0 &&
	       (w->unbounded || mc_bytes_cmp(key, len, w->end, w->elen) < 0);
}

static bool wants(const struct watch__w *w, const struct mvcc_event *ev)
{
	if (ev->kv.mod_revision < w->min_rev)
		return false;
	if (ev->type == MVCC_EVENT_PUT ? w->noput : w->nodelete)
		return false;
	return true;
}

static int index_add(struct watch_registry *r, struct watch__w *w)
{
	if (!w->single) {
		struct range_key k = {w->key, w->klen, w->id};
		avl_insert(&r->ranges, &k, &w->by_range);
	} else {
		struct wbytes b = {w->key, w->klen};
		struct avl_node *n = avl_find(&r->keys, &b);
		struct watch__bucket *bk;
		if (n) {
			bk = MC_CONTAINER_OF(n, struct watch__bucket, node);
		} else {
			bk = calloc(1, sizeof(*bk) + w->klen);
			if (!bk)
				return -ENOMEM;
			memcpy(bk->key, w->key, w->klen);
			bk->klen = w->klen;
			b.p = bk->key;
			avl_insert(&r->keys, &b, &bk->node);
		}
		list_append(&bk->ws, &w->blink);
		w->bucket = bk;
	}
	w->state = W_SYNCED;
	r->synced++;
	return 0;
}

static void index_remove(struct watch_registry *r, struct watch__w *w)
{
	if (!w->single) {
		struct range_key k = {w->key, w->klen, w->id};
		avl_remove(&r->ranges, &k);
	} else {
		struct watch__bucket *bk = w->bucket;
		list_remove(&bk->ws, &w->blink);
		w->bucket = NULL;
		if (!bk->ws.n) {
			struct wbytes b = {bk->key, bk->klen};
			avl_remove(&r->keys, &b);
			free(bk);
		}
	}
	r->synced--;
}

static void mark_compacted(struct watch_registry *r, struct watch__w *w, int64_t crev)
{
	if (w->state == W_UNSYNCED)
		list_remove(&r->unsynced, &w->ulink);
	w->state = W_DEAD;
	w->compact_rev = crev;
	ready_add(r, w);
}

static void watcher_free(struct watch_registry *r, struct watch__w *w)
{
	buf_truncate(r, w, 0);
	free(w->buf);
	free(w->key);
	free(w);
}

static void watcher_remove(struct watch_registry *r, struct watch__w *w)
{
	if (w->state == W_SYNCED)
		index_remove(r, w);
	else if (w->state == W_UNSYNCED)
		list_remove(&r->unsynced, &w->ulink);
	w->state = W_DEAD;
	ready_remove(r, w);
	avl_remove(&r->by_id, &w->id);
	watcher_free(r, w);
}

size_t watch_cost(const struct watch_registry *r, size_t klen, size_t elen)
{
	return sizeof(struct watch__w) + klen + elen + 2 +
	       r->max_pending * sizeof(struct watch__ev *);
}

int watch_registry_new(const struct mvcc_store *s, size_t max_pending_events,
		       struct watch_registry **out)
{
	struct watch_registry *r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	avl_init(&r->by_id, by_id_cmp, NULL);
	avl_init(&r->keys, bucket_cmp, NULL);
	avl_init(&r->ranges, range_cmp, range_aug);
	r->max_pending = max_pending_events ? max_pending_events : 1024;
	r->rev = mvcc_rev(s);
	r->next_id = 1;
	*out = r;
	return 0;
}

void watch_registry_free(struct watch_registry *r)
{
	if (!r)
		return;
	struct avl_iter it;
	struct avl_node *n;
	while ((n = avl_seek(&it, &r->by_id, NULL)))
		watcher_remove(r, W_OF(n, by_id));
	free(r);
}

int watch_create(struct watch_registry *r, const struct mvcc_store *s,
		 const struct watch_options *o, int64_t *id_out)
{
	bool unbounded = o->range_end_len == 1 && o->range_end[0] == '\0';
	bool single = o->range_end_len == 0;
	if (!single && !unbounded &&
	    mc_bytes_cmp(o->key, o->key_len, o->range_end, o->range_end_len) >= 0)
		return MVCC_EEMPTY_WATCH_RANGE;
	if (o->id < 0)
		return -EINVAL;
	int64_t id = o->id;
	if (id) {
		if (find(r, id))
			return MVCC_EWATCH_EXISTS;
	} else {
		id = r->next_id;
		while (find(r, id))
			id++;
		r->next_id = id + 1;
	}
	struct watch__w *w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	size_t elen = single || unbounded ? 0 : o->range_end_len;
	w->key = malloc(o->key_len + elen + 1);
	if (!w->key) {
		free(w);
		return -ENOMEM;
	}
	if (o->key_len)
		memcpy(w->key, o->key, o->key_len);
	w->klen = o->key_len;
	w->end = w->key + o->key_len;
	if (elen)
		memcpy(w->end, o->range_end, elen);
	w->elen = elen;
	w->single = single;
	w->unbounded = unbounded;
	w->id = id;
	w->tag = o->tag;
	w->prev_kv = o->prev_kv;
	w->progress_notify = o->progress_notify;
	w->noput = o->filter_noput;
	w->nodelete = o->filter_nodelete;

	int64_t start = o->start_revision;
	int rc = 0;
	if (start > 0 && start < mvcc_compact_rev(s)) {
		w->state = W_DEAD;
		w->compact_rev = mvcc_compact_rev(s);
		ready_add(r, w);
	} else if (start <= 0 || start > r->rev) {
		w->min_rev = start > 0 ? start : mvcc_rev(s) + 1;
		rc = index_add(r, w);
	} else {
		w->min_rev = start;
		w->next_rev = start;
		w->state = W_UNSYNCED;
		list_append(&r->unsynced, &w->ulink);
	}
	if (rc) {
		free(w->key);
		free(w);
		return rc;
	}
	avl_insert(&r->by_id, &w->id, &w->by_id);
	*id_out = id;
	return 0;
}

int watch_cancel(struct watch_registry *r, int64_t id)
{
	struct watch__w *w = find(r, id);
	if (!w)
		return MVCC_EWATCH_NOT_FOUND;
	watcher_remove(r, w);
	return 0;
}

/* ------------------------------------------------------------- routing */

struct route {
	struct watch_registry *r;
	const struct mvcc_event *src;
	struct watch__ev *shared; /* created on the first match */
	bool failed;
};

static void overflow(struct watch_registry *r, struct watch__w *w, int64_t rev)
{
	buf_truncate(r, w, w->stage_start);
	w->stage_rev = 0;
	w->state = W_UNSYNCED;
	w->next_rev = rev > w->min_rev ? rev : w->min_rev;
	w->mnext = r->moving;
	r->moving = w;
}

static void route_one(struct route *rt, struct watch__w *w)
{
	if (w->state != W_SYNCED || !wants(w, rt->src))
		return;
	int64_t rev = rt->src->kv.mod_revision;
	if (!rt->shared && !rt->failed) {
		rt->shared = ev_new(rt->src);
		rt->failed = rt->shared == NULL;
	}
	if (!rt->shared || !buf_push(rt->r, w, rt->shared, rev))
		overflow(rt->r, w, rev);
}

static void stab(struct route *rt, struct avl_node *n, const char *key, size_t len)
{
	while (n) {
		struct watch__w *w = W_OF(n, by_range);
		if (!w->aug_inf && mc_bytes_cmp(w->aug_end, w->aug_elen, key, len) <= 0)
			return; /* everything below ends at or before key */
		stab(rt, n->child[0], key, len);
		if (mc_bytes_cmp(w->key, w->klen, key, len) > 0)
			return; /* this start and all on the right are after key */
		if (w->unbounded || mc_bytes_cmp(key, len, w->end, w->elen) < 0)
			route_one(rt, w);
		n = n->child[1];
	}
}

static void finish_moving(struct watch_registry *r)
{
	while (r->moving) {
		struct watch__w *w = r->moving;
		r->moving = w->mnext;
		w->mnext = NULL;
		index_remove(r, w);
		list_append(&r->unsynced, &w->ulink);
	}
}

/* Every synced watcher to unsynced from revision `from` (a gap in routing). */
static void desync_all(struct watch_registry *r, int64_t from)
{
	struct avl_iter it;
	for (struct avl_node *n = avl_seek(&it, &r->by_id, NULL); n; n = avl_next(&it)) {
		struct watch__w *w = W_OF(n, by_id);
		if (w->state != W_SYNCED)
			continue;
		w->stage_rev = 0;
		w->state = W_UNSYNCED;
		w->next_rev = from > w->min_rev ? from : w->min_rev;
		w->mnext = r->moving;
		r->moving = w;
	}
	finish_moving(r);
}

void watch_notify(struct watch_registry *r, const struct mvcc_store *s)
{
	int64_t srev = mvcc_rev(s);
	if (srev <= r->rev)
		return;
	if (!r->synced) {
		/* Nobody to route to (watchers catching up read the history
		 * themselves): a DeleteRange of many keys is not walked again. */
		r->rev = srev;
		return;
	}
	uint64_t pos, end = mvcc_hist_end(s);
	if (mvcc_hist_seek(s, r->rev + 1, &pos)) {
		/* History we never routed is gone: catch-up will report it. */
		desync_all(r, r->rev + 1);
		r->rev = srev;
		return;
	}
	for (; pos < end; pos++) {
		struct mvcc_event ev;
		if (mvcc_hist_event(s, pos, &ev))
			break;
		struct route rt = {r, &ev, NULL, false};
		struct wbytes b = {ev.kv.key, ev.kv.key_len};
		struct avl_node *n = avl_find(&r->keys, &b);
		if (n) {
			struct watch__bucket *bk = MC_CONTAINER_OF(n, struct watch__bucket,
								   node);
			for (struct watch__link *l = bk->ws.head; l; l = l->next)
				route_one(&rt, W_OF(l, blink));
		}
		stab(&rt, r->ranges.root, ev.kv.key, ev.kv.key_len);
		ev_unref(rt.shared);
		finish_moving(r);
	}
	r->rev = srev;
}

/* ------------------------------------------------------------- catch-up */

/* Returns false when w stays unsynced; consumes *budget. */
static bool catch_up(struct watch_registry *r, const struct mvcc_store *s, struct watch__w *w,
		     size_t *budget)
{
	uint64_t pos, end = mvcc_hist_end(s);
	if (w->next_rev < mvcc_compact_rev(s) || mvcc_hist_seek(s, w->next_rev, &pos)) {
		mark_compacted(r, w, mvcc_compact_rev(s));
		return false;
	}
	struct mvcc_event ev;
	while (pos < end) {
		if (mvcc_hist_event(s, pos, &ev) || ev.kv.mod_revision > r->rev)
			break;
		if (!*budget)
			return false;
		int64_t rev = ev.kv.mod_revision;
		w->stage_rev = rev;
		w->stage_start = w->len;
		bool full = false;
		for (; pos < end; pos++) {
			if (mvcc_hist_event(s, pos, &ev) || ev.kv.mod_revision != rev)
				break;
			if (*budget)
				(*budget)--;
			if (!matches_key(w, ev.kv.key, ev.kv.key_len) || !wants(w, &ev))
				continue;
			struct watch__ev *e = ev_new(&ev);
			bool ok = e && buf_push(r, w, e, rev);
			ev_unref(e);
			if (!ok) {
				full = true;
				break;
			}
		}
		if (full) {
			buf_truncate(r, w, w->stage_start);
			w->stage_rev = 0;
			w->next_rev = rev;
			return false;
		}
		w->next_rev = rev + 1;
	}
	/* Caught up with everything routed: join the synced watchers. */
	if (w->next_rev <= r->rev)
		w->next_rev = r->rev + 1;
	list_remove(&r->unsynced, &w->ulink);
	if (index_add(r, w)) {
		w->state = W_UNSYNCED;
		list_append(&r->unsynced, &w->ulink);
		return false;
	}
	return true;
}

size_t watch_sync(struct watch_registry *r, const struct mvcc_store *s, size_t max_entries)
{
	size_t budget = max_entries;
	size_t n = r->unsynced.n;
	for (size_t i = 0; i < n && r->unsynced.head; i++) {
		struct watch__w *w = W_OF(r->unsynced.head, ulink);
		/* A watcher with a full buffer waits for its consumer. */
		if (w->len < r->max_pending && budget) {
			if (catch_up(r, s, w, &budget) || w->state != W_UNSYNCED)
				continue;
		}
		/* Round robin: to the back of the line. */
		list_remove(&r->unsynced, &w->ulink);
		list_append(&r->unsynced, &w->ulink);
	}
	return r->unsynced.n;
}

/* ------------------------------------------------------------- delivery */

int watch_pause(struct watch_registry *r, int64_t id, bool paused)
{
	struct watch__w *w = find(r, id);
	if (!w)
		return MVCC_EWATCH_NOT_FOUND;
	if (w->paused == paused)
		return 0;
	w->paused = paused;
	if (paused)
		ready_remove(r, w);
	else if (w->len || w->state == W_DEAD)
		ready_add(r, w);
	return 0;
}

bool watch_next_ready(const struct watch_registry *r, int64_t *id_out)
{
	if (!r->ready.head)
		return false;
	*id_out = W_OF(r->ready.head, rlink)->id;
	return true;
}

int watch_take(struct watch_registry *r, int64_t id, struct watch_delivery *out)
{
	memset(out, 0, sizeof(*out));
	struct watch__w *w = find(r, id);
	if (!w)
		return MVCC_EWATCH_NOT_FOUND;
	out->watch_id = id;
	out->tag = w->tag;
	if (w->len) {
		const struct mvcc_event **evs = malloc(w->len * sizeof(*evs));
		if (!evs)
			return -ENOMEM;
		for (size_t i = 0; i < w->len; i++)
			evs[i] = w->prev_kv ? &w->buf[i]->ev : &w->buf[i]->ev_noprev;
		out->events = evs;
		out->nevents = w->len;
		out->refs = w->buf;
		int64_t last = w->buf[w->len - 1]->ev.kv.mod_revision;
		r->pending -= w->len;
		w->buf = NULL;
		w->len = w->cap = 0;
		w->stage_rev = 0;
		w->stage_start = 0;
		if (w->state == W_SYNCED)
			out->revision = r->rev;
		else if (w->state == W_UNSYNCED)
			out->revision = w->next_rev - 1 > last ? w->next_rev - 1 : last;
		else
			out->revision = last;
		if (w->state != W_DEAD)
			ready_remove(r, w);
		return 0;
	}
	out->revision = r->rev;
	if (w->state == W_DEAD) {
		out->canceled = true;
		out->compact_revision = w->compact_rev;
		ready_remove(r, w);
		avl_remove(&r->by_id, &id);
		watcher_free(r, w);
		return 0;
	}
	ready_remove(r, w);
	return 0;
}

void watch_delivery_free(struct watch_delivery *d)
{
	if (!d)
		return;
	for (size_t i = 0; i < d->nevents; i++)
		ev_unref(d->refs[i]);
	free(d->refs);
	free(d->events);
	memset(d, 0, sizeof(*d));
}

/* ------------------------------------------------------------- progress */

int watch_progress(struct watch_registry *r, int64_t **ids_out, size_t *n_out, int64_t *rev)
{
	size_t n = 0, cap = 0;
	int64_t *ids = NULL;
	struct avl_iter it;
	for (struct avl_node *x = avl_seek(&it, &r->by_id, NULL); x; x = avl_next(&it)) {
		struct watch__w *w = W_OF(x, by_id);
		if (!w->progress_notify)
			continue;
		bool due = w->state == W_SYNCED && !w->len && !w->sent_since_progress;
		w->sent_since_progress = false;
		if (!due)
			continue;
		if (n == cap) {
			size_t nc = cap ? cap * 2 : 16;
			void *p = realloc(ids, nc * sizeof(*ids));
			if (!p) {
				free(ids);
				return -ENOMEM;
			}
			ids = p;
			cap = nc;
		}
		ids[n++] = w->id;
	}
	*ids_out = ids;
	*n_out = n;
	*rev = r->rev;
	return 0;
}

int watch_progress_request(const struct watch_registry *r, int64_t id, int64_t *rev)
{
	const struct watch__w *w = find(r, id);
	if (!w)
		return MVCC_EWATCH_NOT_FOUND;
	if (w->state != W_SYNCED || w->len)
		return -EAGAIN;
	*rev = r->rev;
	return 0;
}

void watch_stats(const struct watch_registry *r, struct watch_stats *out)
{
	out->watchers = r->by_id.count;
	out->synced = r->synced;
	out->unsynced = r->unsynced.n;
	out->pending_events = r->pending;
	out->revision = r->rev;
}
