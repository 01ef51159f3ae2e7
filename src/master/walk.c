/*
 * walk: calls that walk the whole index — RemoveAll, RemoveRegex, List —
 * and the core's reaper, in slices of the master's loop.
 *
 * A walk over millions of objects takes seconds (0.3 us an object that
 * does not match, some 2.7 us one removed), and on the loop every other
 * call would wait for it: puts, gets, heartbeats. So a walk runs in
 * slices of about SLICE_NS, one per loop turn, through a uv_idle handle
 * that is active while any walk is (the loop then polls without waiting,
 * so calls that came meanwhile are served between slices). The first
 * slice runs in the call itself: a small index answers at once.
 *
 * The core keeps the index from adding buckets while a walk is open
 * (master__walk_begin): each object there at the start is looked at
 * exactly once, and the counts are exact. Objects put meanwhile may be
 * removed (listed) or not. At most MAX_WALKS run at once; a call past
 * them is refused RESOURCE_EXHAUSTED. A removal whose client goes away
 * (its deadline passed) runs on to its end, as it did on the loop
 * before, and says in the log what it removed; a List whose client goes
 * away stops. A master that stops leading answers every walk NOT_LEADER
 * (the index goes with the leadership).
 *
 * The same slices walk the index for the core's reaper: the replicas of
 * segments gone (an agent's expiry, unmount or restart), which read as
 * gone from the moment the segment goes, are dropped here, and objects
 * left with none removed (core.h). master__reap_kick starts it after a
 * call or tick that made a segment go, with a first slice at once.
 */
#include <errno.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "master.pb-c.h"
#include "master/master_int.h"
#include "rpc/rpc.h"

#define LOG_SUBSYS LOGS_MASTER

#define MAX_WALKS 8
#define SLICE_NS 5000000ull /* of the loop, per turn, for all walks */
#define STEP_OBJECTS 256u   /* between looks at the clock */
#define MAX_PATTERN_SHOWN 200
#define MAX_PATTERN_BYTES 4096 /* (said in pattern_refused's answers) */
#define MAX_PATTERN_REPEATS 65536
#define LIST_DEFAULT_LIMIT 1000u
#define LIST_MAX_LIMIT 100000u
/* A List page's keys at most (its answer must pass --rpc-max-message-size,
 * 64M by default): a page of long keys ends sooner, with more set. */
#define LIST_PAGE_KEY_BYTES (16u << 20)

struct master_walkcall;

/* What a kind of walk does: step walks on (true at its end), answer
 * ends it (call: its call, taken from it; NULL once its client went
 * away), release frees what it holds. */
struct walk_kind {
	const char *name;
	bool (*step)(struct master *m, struct master_walkcall *wc, uint64_t now_ms);
	void (*answer)(struct master *m, struct master_walkcall *wc, struct rpc_call *call);
	void (*release)(struct master_walkcall *wc);
	bool runs_on; /* when its client goes away (removals) */
};

struct master_walkcall {
	struct master_walkcall *prev, *next;
	struct master *m;
	const struct walk_kind *kind;
	struct rpc_call *call; /* NULL once its client went away */
	struct master_walk w;
	uint64_t start_ns;
};

static void on_idle(uv_idle_t *h);

/* The idle handle runs while a walk or the reaper has work. */
static void idle_update(struct master *m)
{
	if (m->walks || master__reap_pending(m->core))
		uv_idle_start(&m->walk_idle, on_idle);
	else
		uv_idle_stop(&m->walk_idle);
}

static void unlink_walk(struct master *m, struct master_walkcall *wc)
{
	if (wc->prev)
		wc->prev->next = wc->next;
	else
		m->walks = wc->next;
	if (wc->next)
		wc->next->prev = wc->prev;
	wc->prev = wc->next = NULL;
	m->nwalks--;
	idle_update(m);
}

/* Walk wc on until its end or until the clock passes until_ns; true at
 * its end. */
static bool walk_on(struct master *m, struct master_walkcall *wc, uint64_t until_ns)
{
	uint64_t now = uv_now(m->loop);
	while (!wc->kind->step(m, wc, now))
		if (uv_hrtime() >= until_ns)
			return false;
	return true;
}

/* The call wc still has, taken from it (NULL if none). */
static struct rpc_call *take_call(struct master_walkcall *wc)
{
	struct rpc_call *call = wc->call;
	wc->call = NULL;
	if (call)
		rpc_call_set_data(call, NULL);
	return call;
}

static void finish(struct master *m, struct master_walkcall *wc)
{
	wc->kind->answer(m, wc, take_call(wc));
	wc->kind->release(wc);
}

/* ------------------------------------------------------------ the reaper */

/* What a reaper's slice is asked for: segment slot's count (MASTER_NO_SEGMENT: none). */
struct reap_ask {
	uint32_t slot;
	bool done;
	uint64_t removed;
};

static void reaped(void *ud, const struct master_reaped *r)
{
	struct reap_ask *ask = ud;
	log_info("segment %s gone: its %llu replicas dropped, %llu objects removed with it",
		 r->name, (unsigned long long)r->dropped, (unsigned long long)r->removed);
	if (r->slot == ask->slot) {
		ask->done = true;
		ask->removed = r->removed;
	}
}

/* The reaper on until its end or until the clock passes until_ns; true
 * at its end. */
static bool reap_on(struct master *m, uint64_t until_ns, struct reap_ask *ask)
{
	while (!master__reap_step(m->core, STEP_OBJECTS, reaped, ask))
		if (uv_hrtime() >= until_ns)
			return false;
	return true;
}

uint64_t master__reap_kick(struct master *m, uint32_t slot)
{
	struct reap_ask ask = {.slot = slot};
	if (!master__reap_pending(m->core))
		return 0;
	reap_on(m, uv_hrtime() + SLICE_NS, &ask);
	idle_update(m);
	return ask.done ? ask.removed : master__reap_removed(m->core, slot);
}

/* ------------------------------------------------------------ the slices */

/* One turn: each walk, and the reaper, gets its share of the slice. */
static void on_idle(uv_idle_t *h)
{
	struct master *m = h->data;
	bool reap = master__reap_pending(m->core);
	unsigned n = m->nwalks + reap;
	uint64_t share = SLICE_NS / (n ? n : 1);
	struct reap_ask ask = {.slot = MASTER_NO_SEGMENT};
	if (reap)
		reap_on(m, uv_hrtime() + share, &ask);
	for (struct master_walkcall *wc = m->walks, *next; wc; wc = next) {
		next = wc->next;
		if (!walk_on(m, wc, uv_hrtime() + share))
			continue;
		unlink_walk(m, wc);
		finish(m, wc);
	}
	idle_update(m);
}

/* Start wc (its kind and walk set): answered at once when one slice
 * covers the index, else parked. */
static void start(struct master *m, struct rpc_call *call, struct master_walkcall *wc)
{
	wc->m = m;
	wc->call = call;
	wc->start_ns = uv_hrtime();
	master__walk_begin(m->core, &wc->w);
	if (walk_on(m, wc, wc->start_ns + SLICE_NS)) {
		finish(m, wc);
		return;
	}
	rpc_call_set_data(call, wc);
	wc->next = m->walks;
	if (m->walks)
		m->walks->prev = wc;
	m->walks = wc;
	m->nwalks++;
	idle_update(m);
}

/* Whether call is refused for the walks in progress (answered). */
static bool too_many(struct master *m, struct rpc_call *call)
{
	if (m->nwalks < MAX_WALKS)
		return false;
	char msg[160];
	snprintf(msg, sizeof(msg),
		 "%u RemoveAll/RemoveRegex/List calls are in progress, the most at once; "
		 "retry once one is answered",
		 (unsigned)m->nwalks);
	rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, msg);
	return true;
}

void master__on_walk_cancel(struct rpc_call *call)
{
	struct master_walkcall *wc = rpc_call_data(call);
	if (!wc)
		return;
	rpc_call_finish(take_call(wc), RPC_CANCELLED, NULL);
	if (wc->kind->runs_on)
		log_info("%s: its client went away after %llu removed; walking on to the end",
			 wc->kind->name, (unsigned long long)wc->w.removed);
	else
		master__walk_abort(wc->m->core, &wc->w); /* (freed at the next turn) */
}

/* ------------------------------------------------------------ removals */

struct rmwalk {
	struct master_walkcall wc;
	regex_t re;
	bool has_re;
	char pattern[MAX_PATTERN_SHOWN + 4]; /* for the log ("..." past it) */
};

static bool rm_step(struct master *m, struct master_walkcall *wc, uint64_t now_ms)
{
	return master__walk_step(m->core, &wc->w, STEP_OBJECTS, now_ms);
}

static void rm_answer(struct master *m, struct master_walkcall *wc, struct rpc_call *call)
{
	(void)m;
	struct rmwalk *rw = (struct rmwalk *)wc;
	Mooncake__Master__RemoveAllResponse resp = MOONCAKE__MASTER__REMOVE_ALL_RESPONSE__INIT;
	resp.removed = wc->w.removed;
	resp.skipped = wc->w.skipped;
	double s = (double)(uv_hrtime() - wc->start_ns) / 1e9;
	const char *gone = call ? "" : "; its client had gone";
	if (rw->has_re)
		log_info("RemoveRegex '%s'%s: %llu removed, %llu leased left (%.2f s%s)",
			 rw->pattern, wc->w.force ? " (forced)" : "",
			 (unsigned long long)resp.removed, (unsigned long long)resp.skipped, s,
			 gone);
	else
		log_info("RemoveAll%s: %llu removed, %llu left (%.2f s%s)",
			 wc->w.force ? " (forced)" : "", (unsigned long long)resp.removed,
			 (unsigned long long)resp.skipped, s, gone);
	if (call)
		master__reply(call, &resp.base);
}

static void rm_release(struct master_walkcall *wc)
{
	struct rmwalk *rw = (struct rmwalk *)wc;
	if (rw->has_re)
		regfree(&rw->re);
	free(rw);
}

static const struct walk_kind remove_all_kind = {
	"RemoveAll", rm_step, rm_answer, rm_release, true,
};
static const struct walk_kind remove_regex_kind = {
	"RemoveRegex", rm_step, rm_answer, rm_release, true,
};

/* A removal walk for call, or NULL after answering it. */
static struct rmwalk *rmwalk_new(struct rpc_call *call, const struct walk_kind *kind)
{
	struct rmwalk *rw = calloc(1, sizeof(*rw));
	if (!rw) {
		rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, "out of memory");
		return NULL;
	}
	rw->wc.kind = kind;
	return rw;
}

void master__on_remove_all(struct rpc_call *call, const ProtobufCMessage *msg)
{
	struct master *m = master__leader_of(call);
	const Mooncake__Master__RemoveAllRequest *req = (const void *)msg;
	struct rmwalk *rw;
	if (!m || too_many(m, call) || !(rw = rmwalk_new(call, &remove_all_kind)))
		return;
	rw->wc.w.force = req->force;
	rw->wc.w.pending = true;
	start(m, call, &rw->wc);
}

/* A key matches when regexec finds the pattern in it; a key holding a
 * NUL byte never does (POSIX patterns see C strings). */
static bool regex_match(void *ud, const uint8_t *key, size_t klen)
{
	char buf[MASTER_MAX_KEY_BYTES + 1];
	if (klen > MASTER_MAX_KEY_BYTES || memchr(key, 0, klen))
		return false;
	memcpy(buf, key, klen);
	buf[klen] = '\0';
	return regexec(ud, buf, 0, NULL, 0) == 0;
}

/*
 * Why pattern p is refused before regcomp sees it, or NULL. glibc's
 * regexec is a DFA walk, linear in the key, except with back-references,
 * whose matching time grows steeply with the key (a 160-byte key took
 * 0.5 s for "(a|aa)*\1\1b"); and regcomp writes out bounded repetitions,
 * so "(a{1000}){1000}" takes 200 MB and 0.2 s, and each factor more a
 * thousand times that. Keys are at most MASTER_MAX_KEY_BYTES long: no
 * pattern needs either.
 */
static const char *pattern_refused(const char *p)
{
	if (strlen(p) > MAX_PATTERN_BYTES)
		return "it is longer than 4096 bytes";
	uint64_t product = 1;
	while (*p) {
		if (*p == '\\') {
			if (p[1] >= '1' && p[1] <= '9')
				return "back-references (\\1 to \\9) are not supported: their "
				       "matching time grows without bound";
			p += p[1] ? 2 : 1;
		} else if (*p == '[') {
			/* A bracket expression: to its ']' (one right after '[' or
			 * "[^" is a member), past [:class:], [=x=] and [.x.]. */
			p++;
			if (*p == '^')
				p++;
			if (*p == ']')
				p++;
			while (*p && *p != ']') {
				if (*p == '[' && (p[1] == ':' || p[1] == '=' || p[1] == '.')) {
					const char *end = strchr(p + 2, p[1]);
					p = end && end[1] == ']' ? end + 2 : p + 1;
				} else {
					p++;
				}
			}
			if (*p)
				p++;
		} else if (*p == '{') {
			/* A bound {n}, {n,} or {n,m}: what regcomp writes out
			 * multiplies with every other one (counted as nested, which
			 * is the worst case). */
			char *end;
			unsigned long n = strtoul(p + 1, &end, 10);
			if (*end == ',' && end[1] != '}')
				n = strtoul(end + 1, &end, 10);
			product *= (uint64_t)MC_MIN(n, (unsigned long)UINT32_MAX) + 1;
			if (product > MAX_PATTERN_REPEATS)
				return "its repetition bounds multiply past 65536 (regcomp "
				       "writes each repetition out)";
			p++;
		} else {
			p++;
		}
	}
	return NULL;
}

void master__on_remove_regex(struct rpc_call *call, const ProtobufCMessage *msg)
{
	struct master *m = master__leader_of(call);
	const Mooncake__Master__RemoveRegexRequest *req = (const void *)msg;
	struct rmwalk *rw;
	if (!m || too_many(m, call) || !(rw = rmwalk_new(call, &remove_regex_kind)))
		return;
	const char *pat = req->pattern ? req->pattern : "";
	snprintf(rw->pattern, sizeof(rw->pattern), "%.*s%s", MAX_PATTERN_SHOWN, pat,
		 strlen(pat) > MAX_PATTERN_SHOWN ? "..." : "");
	const char *why = pattern_refused(pat);
	if (!why && regcomp(&rw->re, pat, REG_EXTENDED | REG_NOSUB) != 0)
		why = "it is not a POSIX extended regular expression";
	if (why) {
		char text[sizeof(rw->pattern) + 256];
		snprintf(text, sizeof(text), "%d %s: pattern '%s' refused: %s", -EINVAL,
			 mc_strerror(-EINVAL), rw->pattern, why);
		rpc_call_finish(call, master__rpc_status(-EINVAL), text);
		free(rw);
		return;
	}
	rw->has_re = true;
	rw->wc.w.match = regex_match;
	rw->wc.w.ud = &rw->re;
	rw->wc.w.force = req->force;
	start(m, call, &rw->wc);
}

/* ------------------------------------------------------------ List */

/* A key of the page, with what List says of its object as the walk saw
 * it (the object may go before the answer: a listing is not a
 * snapshot). */
struct list_ent {
	uint8_t *key; /* a copy */
	uint64_t size, lease_until_ms;
	uint16_t klen;
	uint8_t nrep;
	bool complete, soft_pin;
};

/*
 * A List keeps the page's smallest keys past start_after in a max-heap
 * (the largest on top, the first to go when a smaller one comes), as
 * copies, since the walk goes on over loop turns in which objects come
 * and go: its memory is the page's, at most `limit` entries and
 * LIST_PAGE_KEY_BYTES of keys, and only they are sorted at the end. The
 * page is always the first keys of the matches in order, so paging on
 * from its last key misses none.
 */
struct listwalk {
	struct master_walkcall wc;
	uint8_t *prefix, *after; /* copies of the request's */
	size_t plen, alen;
	struct list_ent *v; /* the heap */
	size_t n, cap, limit, key_bytes;
	uint64_t matched; /* past the page's count: more */
	bool nomem;
};

static int ent_cmp(const struct list_ent *x, const struct list_ent *y)
{
	return mc_bytes_cmp(x->key, x->klen, y->key, y->klen);
}

static int ent_qcmp(const void *a, const void *b)
{
	return ent_cmp(a, b);
}

static void ent_swap(struct list_ent *v, size_t i, size_t j)
{
	struct list_ent t = v[i];
	v[i] = v[j];
	v[j] = t;
}

/* The heap's largest entry goes (its key freed). */
static void heap_pop(struct listwalk *lw)
{
	struct list_ent *v = lw->v;
	lw->key_bytes -= v[0].klen;
	free(v[0].key);
	v[0] = v[--lw->n];
	for (size_t i = 0;;) {
		size_t l = 2 * i + 1, r = l + 1, top = i;
		if (l < lw->n && ent_cmp(&v[l], &v[top]) > 0)
			top = l;
		if (r < lw->n && ent_cmp(&v[r], &v[top]) > 0)
			top = r;
		if (top == i)
			return;
		ent_swap(v, i, top);
		i = top;
	}
}

static bool list_visit(void *ud, const struct master_obj *o)
{
	struct listwalk *lw = ud;
	const uint8_t *k = master__obj_key(o);
	if (o->klen < lw->plen || (lw->plen && memcmp(k, lw->prefix, lw->plen) != 0))
		return true;
	if (lw->alen && mc_bytes_cmp(k, o->klen, lw->after, lw->alen) <= 0)
		return true;
	lw->matched++;
	bool full = lw->n == lw->limit || lw->key_bytes + o->klen > LIST_PAGE_KEY_BYTES;
	if (full && mc_bytes_cmp(k, o->klen, lw->v[0].key, lw->v[0].klen) > 0)
		return true; /* past the page */
	if (lw->n == lw->cap) {
		size_t cap = MC_MIN(lw->cap ? lw->cap * 2 : 1024, lw->limit + 1);
		struct list_ent *v = realloc(lw->v, cap * sizeof(*v));
		if (!v) {
			lw->nomem = true;
			return false;
		}
		lw->v = v;
		lw->cap = cap;
	}
	bool pending = o->flags & MASTER_OBJ_PENDING;
	struct list_ent e = {
		.key = malloc(o->klen ? o->klen : 1),
		.size = o->size,
		.lease_until_ms = pending ? 0 : o->lease_or_start_ms,
		.klen = o->klen,
		.nrep = o->nrep,
		.complete = !pending,
		.soft_pin = (o->flags & MASTER_OBJ_SOFT_PIN) != 0,
	};
	if (!e.key) {
		lw->nomem = true;
		return false;
	}
	memcpy(e.key, k, o->klen);
	/* Up from the bottom, then the largest go while the page is past
	 * its count or bytes. */
	size_t i = lw->n++;
	lw->v[i] = e;
	lw->key_bytes += e.klen;
	for (; i && ent_cmp(&lw->v[i], &lw->v[(i - 1) / 2]) > 0; i = (i - 1) / 2)
		ent_swap(lw->v, i, (i - 1) / 2);
	while (lw->n > lw->limit || lw->key_bytes > LIST_PAGE_KEY_BYTES)
		heap_pop(lw);
	return true;
}

static bool list_step(struct master *m, struct master_walkcall *wc, uint64_t now_ms)
{
	(void)now_ms;
	return master__scan_step(m->core, &wc->w, STEP_OBJECTS, list_visit, wc);
}

static void list_answer(struct master *m, struct master_walkcall *wc, struct rpc_call *call)
{
	struct listwalk *lw = (struct listwalk *)wc;
	if (!call)
		return;
	Mooncake__Master__ListItem *items = NULL;
	Mooncake__Master__ListItem **ptrs = NULL;
	size_t n = lw->n;
	if (lw->nomem || !(items = calloc(n ? n : 1, sizeof(*items))) ||
	    !(ptrs = calloc(n ? n : 1, sizeof(*ptrs)))) {
		free(items);
		rpc_call_finish(call, master__rpc_status(-ENOMEM), "-12 out of memory");
		return;
	}
	if (n)
		qsort(lw->v, n, sizeof(*lw->v), ent_qcmp);
	uint64_t now = uv_now(m->loop);
	for (size_t i = 0; i < n; i++) {
		const struct list_ent *e = &lw->v[i];
		mooncake__master__list_item__init(&items[i]);
		items[i].key.data = e->key;
		items[i].key.len = e->klen;
		items[i].size = e->size;
		items[i].replicas = e->nrep;
		items[i].complete = e->complete;
		items[i].soft_pin = e->soft_pin;
		items[i].lease_ms = e->lease_until_ms > now ? e->lease_until_ms - now : 0;
		ptrs[i] = &items[i];
	}
	Mooncake__Master__ListResponse resp = MOONCAKE__MASTER__LIST_RESPONSE__INIT;
	resp.n_items = n;
	resp.items = ptrs;
	resp.more = lw->matched > n;
	master__reply(call, &resp.base);
	free(items);
	free(ptrs);
}

static void list_release(struct master_walkcall *wc)
{
	struct listwalk *lw = (struct listwalk *)wc;
	for (size_t i = 0; i < lw->n; i++)
		free(lw->v[i].key);
	free(lw->v);
	free(lw->prefix);
	free(lw->after);
	free(lw);
}

static const struct walk_kind list_kind = {
	"List", list_step, list_answer, list_release, false,
};

/* A copy of b's bytes (never NULL unless out of memory: 1 byte for 0). */
static uint8_t *bytes_dup(const ProtobufCBinaryData *b)
{
	uint8_t *p = malloc(b->len ? b->len : 1);
	if (p && b->len)
		memcpy(p, b->data, b->len);
	return p;
}

void master__on_list(struct rpc_call *call, const ProtobufCMessage *msg)
{
	struct master *m = master__leader_of(call);
	const Mooncake__Master__ListRequest *req = (const void *)msg;
	if (!m)
		return;
	uint32_t limit = req->limit ? req->limit : LIST_DEFAULT_LIMIT;
	const char *why = limit > LIST_MAX_LIMIT ? "limit above 100000"
			  : req->prefix.len > MASTER_MAX_KEY_BYTES
				  ? "a prefix longer than a key can be (4096 bytes)"
			  : req->start_after.len > MASTER_MAX_KEY_BYTES
				  ? "a start_after longer than a key can be (4096 bytes)"
				  : NULL;
	if (why) {
		char text[128];
		snprintf(text, sizeof(text), "%d %s: %s", -EINVAL, mc_strerror(-EINVAL), why);
		rpc_call_finish(call, master__rpc_status(-EINVAL), text);
		return;
	}
	if (too_many(m, call))
		return;
	struct listwalk *lw = calloc(1, sizeof(*lw));
	if (!lw || !(lw->prefix = bytes_dup(&req->prefix)) ||
	    !(lw->after = bytes_dup(&req->start_after))) {
		if (lw)
			list_release(&lw->wc);
		rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, "out of memory");
		return;
	}
	lw->wc.kind = &list_kind;
	lw->plen = req->prefix.len;
	lw->alen = req->start_after.len;
	lw->limit = limit;
	start(m, call, &lw->wc);
}

/* ------------------------------------------------------------ lifecycle */

void master__walks_init(struct master *m)
{
	uv_idle_init(m->loop, &m->walk_idle);
	m->walk_idle.data = m;
}

void master__walks_drop_all(struct master *m)
{
	while (m->walks) {
		struct master_walkcall *wc = m->walks;
		master__walk_abort(m->core, &wc->w);
		unlink_walk(m, wc);
		struct rpc_call *call = take_call(wc);
		if (call)
			master__finish_not_leader(m, call);
		wc->kind->release(wc);
	}
}

void master__walks_close(struct master *m, uv_close_cb cb)
{
	master__walks_drop_all(m);
	m->walk_idle.data = m;
	uv_close((uv_handle_t *)&m->walk_idle, cb);
}

void master__walks_free(struct master *m)
{
	while (m->walks) {
		struct master_walkcall *wc = m->walks;
		m->walks = wc->next;
		wc->kind->release(wc);
	}
	m->nwalks = 0;
}
