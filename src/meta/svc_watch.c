/*
 * svc_watch: etcdserverpb.Watch, the bidirectional watch stream, served by
 * every member from its own applied state.
 *
 * A stream holds watchers with stream-local IDs (etcd's: the first
 * automatic ID is 0; a client may choose one), each backed by a watcher of
 * the node's registry (watch.h) tagged with the stream. After every batch
 * of applied entries the node calls meta__watch_pump: new revisions are
 * routed, lagging watchers caught up from history a bounded amount at a
 * time (the rest from a short timer), and what is ready is sent, one
 * WatchResponse per watcher and delivery, events in revision order.
 *
 * A client that does not read: once the call has RPC_DRAIN_BYTES queued
 * its watchers are paused (kept off the registry's ready list); each keeps
 * collecting events up to the registry's bound and then falls back to
 * catching up from history, so the server never buffers without bound and
 * never blocks. If the history it needs is compacted meanwhile, the
 * watcher is cancelled with the compaction revision and a reason, as etcd
 * does. on_drain resumes the stream.
 *
 * Progress: created with progress_notify, an idle synced watcher gets an
 * empty response with the current revision every
 * --watch-progress-notify-interval; a WatchProgressRequest gets one with
 * watch_id -1 once every watcher of the stream is synced.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "meta/meta_int.h"

#define LOG_SUBSYS LOGS_META

#define SYNC_BUDGET_ENTRIES 4096
#define SYNC_AGAIN_MS 10

struct wwatch {
	int64_t sid; /* the client's ID */
	int64_t rid; /* the registry's */
	char *key, *end;
	size_t klen, elen;
	bool prev_kv, progress, noput, nodelete;
	int64_t last_rev; /* every event up to it was handed out */
	size_t cost;      /* held in the call's bound (rpc_call_hold) */
};

struct meta__wstream {
	struct meta__wstream *next, **pprev;
	struct meta_node *n;
	struct rpc_call *call;
	struct wwatch *ws;
	size_t nws, cap;
	int64_t next_sid;
	bool blocked;
	bool progress_pending;
};

static uint64_t tag_of(struct meta__wstream *s)
{
	return (uint64_t)(uintptr_t)s;
}

static struct wwatch *by_sid(struct meta__wstream *s, int64_t sid)
{
	for (size_t i = 0; i < s->nws; i++)
		if (s->ws[i].sid == sid)
			return &s->ws[i];
	return NULL;
}

static struct wwatch *by_rid(struct meta__wstream *s, int64_t rid)
{
	for (size_t i = 0; i < s->nws; i++)
		if (s->ws[i].rid == rid)
			return &s->ws[i];
	return NULL;
}

static void ww_remove(struct meta__wstream *s, struct wwatch *w)
{
	rpc_call_unhold(s->call, w->cost);
	free(w->key);
	size_t i = (size_t)(w - s->ws);
	memmove(&s->ws[i], &s->ws[i + 1], (s->nws - i - 1) * sizeof(*w));
	s->nws--;
}

/* ------------------------------------------------------------- sending */

static void stream_end(struct meta__wstream *s, int status, const char *message);

/* Send one response; false when the stream is gone. */
static bool send_resp(struct meta__wstream *s, Etcdserverpb__WatchResponse *r)
{
	int rc = rpc_call_send(s->call, &r->base);
	if (rc == MC_ETOO_LARGE)
		return true; /* the caller cancels the watcher */
	if (rc) {
		stream_end(s, rc == -ECANCELED ? RPC_CANCELLED : RPC_INTERNAL,
			   mc_strerror(rc));
		return false;
	}
	if (!s->blocked && rpc_call_pending_bytes(s->call) >= RPC_DRAIN_BYTES) {
		s->blocked = true;
		for (size_t i = 0; i < s->nws; i++)
			if (watch_pause(s->n->watch, s->ws[i].rid, true))
				log_debug("watch %" PRId64 ": cannot pause", s->ws[i].sid);
	}
	return true;
}

static Etcdserverpb__ResponseHeader *hdr(struct meta__wstream *s, struct meta__arena *a,
					 int64_t rev)
{
	Etcdserverpb__ResponseHeader *h = meta__header(s->n, a);
	if (h && rev)
		h->revision = rev;
	return h;
}

/* A create that failed, or a watcher cancelled by the server. */
static bool send_cancel(struct meta__wstream *s, int64_t sid, bool created,
			int64_t compact_rev, const char *reason)
{
	struct meta__arena a = {0};
	Etcdserverpb__WatchResponse r = ETCDSERVERPB__WATCH_RESPONSE__INIT;
	bool ok = true;
	r.header = hdr(s, &a, 0);
	if (r.header) {
		r.watch_id = sid;
		r.created = created;
		r.canceled = true;
		r.compact_revision = compact_rev;
		r.cancel_reason = (char *)(reason ? reason : "");
		ok = send_resp(s, &r);
	}
	meta__arena_free(&a);
	return ok;
}

static bool send_progress(struct meta__wstream *s, int64_t sid, int64_t rev)
{
	struct meta__arena a = {0};
	Etcdserverpb__WatchResponse r = ETCDSERVERPB__WATCH_RESPONSE__INIT;
	bool ok = true;
	r.header = hdr(s, &a, rev);
	if (r.header) {
		r.watch_id = sid;
		ok = send_resp(s, &r);
	}
	meta__arena_free(&a);
	return ok;
}

/* Deliver what registry watcher rid has to say. */
static void deliver(struct meta_node *n, int64_t rid)
{
	struct watch_delivery d;
	struct meta__arena a = {0};
	Etcdserverpb__WatchResponse r = ETCDSERVERPB__WATCH_RESPONSE__INIT;

	if (watch_take(n->watch, rid, &d))
		return;
	struct meta__wstream *s = (struct meta__wstream *)(uintptr_t)d.tag;
	struct wwatch *w = s ? by_rid(s, rid) : NULL;
	if (!w)
		goto out;
	if (d.compact_revision) {
		int64_t sid = w->sid;
		ww_remove(s, w); /* the registry dropped it already */
		send_cancel(s, sid, false, d.compact_revision,
			    "etcdserver: mvcc: required revision has been compacted");
		goto out;
	}
	if (!d.nevents)
		goto out;
	r.header = hdr(s, &a, d.revision);
	r.events = meta__alloc(&a, d.nevents * sizeof(*r.events));
	if (!r.header || !r.events)
		goto oom;
	for (size_t i = 0; i < d.nevents; i++)
		if (!(r.events[i] = meta__event_pb(d.events[i], &a)))
			goto oom;
	r.n_events = d.nevents;
	r.watch_id = w->sid;
	w->last_rev = d.revision;
	int64_t sid = w->sid;
	int rc = rpc_call_send(s->call, &r.base);
	if (rc == MC_ETOO_LARGE) {
		/* A revision larger than a message: etcd would fragment; we
		 * cancel with the reason. */
		if (watch_cancel(n->watch, rid) == 0)
			ww_remove(s, w);
		send_cancel(s, sid, false, 0,
			    "mooncaked: watch response larger than --rpc-max-message-size");
	} else if (rc) {
		stream_end(s, rc == -ECANCELED ? RPC_CANCELLED : RPC_INTERNAL,
			   mc_strerror(rc));
	} else if (!s->blocked && rpc_call_pending_bytes(s->call) >= RPC_DRAIN_BYTES) {
		s->blocked = true;
		for (size_t i = 0; i < s->nws; i++)
			if (watch_pause(n->watch, s->ws[i].rid, true))
				log_debug("watch %" PRId64 ": cannot pause", s->ws[i].sid);
	}
	goto out;
oom:
	log_warn("out of memory delivering watch events; the stream ends");
	stream_end(s, RPC_RESOURCE_EXHAUSTED, "etcdserver: out of memory");
out:
	watch_delivery_free(&d);
	meta__arena_free(&a);
}

static void try_progress(struct meta__wstream *s);
static void on_sync_timer(uv_timer_t *t);

void meta__watch_pump(struct meta_node *n)
{
	int64_t rid;

	if (!n->watch || !n->sm.store)
		return;
	watch_notify(n->watch, n->sm.store);
	size_t unsynced = watch_sync(n->watch, n->sm.store, SYNC_BUDGET_ENTRIES);
	while (watch_next_ready(n->watch, &rid))
		deliver(n, rid);
	for (struct meta__wstream *s = n->wstreams, *next; s; s = next) {
		next = s->next;
		if (s->progress_pending)
			try_progress(s);
	}
	if (unsynced && n->handles_open && !uv_is_active((uv_handle_t *)&n->sync_timer))
		uv_timer_start(&n->sync_timer, on_sync_timer, SYNC_AGAIN_MS, 0);
}

/* ------------------------------------------------------------- requests */

static void on_create(struct meta__wstream *s, const Etcdserverpb__WatchCreateRequest *c)
{
	struct meta_node *n = s->n;
	struct watch_options o = {0};
	struct wwatch w = {0};
	int64_t rid = 0, sid;
	int rc;

	if (c->watch_id > 0) {
		if (by_sid(s, c->watch_id)) {
			send_cancel(s, -1, true, 0, mvcc_strerror(MVCC_EWATCH_EXISTS));
			return;
		}
		sid = c->watch_id;
	} else {
		while (by_sid(s, s->next_sid))
			s->next_sid++;
		sid = s->next_sid++;
	}
	o.key = (const char *)c->key.data;
	o.key_len = c->key.len;
	o.range_end = (const char *)c->range_end.data;
	o.range_end_len = c->range_end.len;
	o.start_revision = c->start_revision;
	o.tag = tag_of(s);
	o.prev_kv = c->prev_kv;
	o.progress_notify = c->progress_notify;
	for (size_t i = 0; i < c->n_filters; i++) {
		if (c->filters[i] == ETCDSERVERPB__WATCH_CREATE_REQUEST__FILTER_TYPE__NOPUT)
			o.filter_noput = true;
		else if (c->filters[i] ==
			 ETCDSERVERPB__WATCH_CREATE_REQUEST__FILTER_TYPE__NODELETE)
			o.filter_nodelete = true;
	}
	/* What the watcher may take counts in the bound on what calls hold,
	 * so watchers without number cannot take the member's memory (200,000
	 * on 1 KB keys took 665 MB). Refused as etcd refuses a create. */
	w.cost = 2 * sizeof(w) /* its slot in s->ws, which doubles */ + c->key.len +
		 c->range_end.len + 1 + watch_cost(n->watch, c->key.len, c->range_end.len);
	if (rpc_call_hold(s->call, w.cost) != 0) {
		send_cancel(s, -1, true, 0,
			    "etcdserver: too many watchers: the member's calls hold as much "
			    "memory as --rpc-max-call-memory allows");
		return;
	}
	if (s->nws == s->cap) {
		size_t cap = s->cap ? s->cap * 2 : 4;
		struct wwatch *v = realloc(s->ws, cap * sizeof(*v));
		if (!v)
			goto oom;
		s->ws = v;
		s->cap = cap;
	}
	w.key = malloc(c->key.len + c->range_end.len + 1);
	if (!w.key)
		goto oom;
	if (c->key.len)
		memcpy(w.key, c->key.data, c->key.len);
	w.klen = c->key.len;
	w.end = w.key + c->key.len;
	if (c->range_end.len)
		memcpy(w.end, c->range_end.data, c->range_end.len);
	w.elen = c->range_end.len;
	rc = watch_create(n->watch, n->sm.store, &o, &rid);
	if (rc) {
		free(w.key);
		if (rc == -ENOMEM)
			goto oom;
		rpc_call_unhold(s->call, w.cost);
		send_cancel(s, -1, true, 0, mvcc_strerror(rc));
		return;
	}
	w.sid = sid;
	w.rid = rid;
	w.prev_kv = o.prev_kv;
	w.progress = o.progress_notify;
	w.noput = o.filter_noput;
	w.nodelete = o.filter_nodelete;
	w.last_rev = c->start_revision > 0 ? c->start_revision - 1 : mvcc_rev(n->sm.store);
	s->ws[s->nws++] = w;
	if (s->blocked && watch_pause(n->watch, rid, true))
		log_debug("watch %" PRId64 ": cannot pause", sid);

	struct meta__arena a = {0};
	Etcdserverpb__WatchResponse r = ETCDSERVERPB__WATCH_RESPONSE__INIT;
	r.header = hdr(s, &a, 0);
	if (!r.header) {
		meta__arena_free(&a);
		goto oom;
	}
	r.watch_id = sid;
	r.created = true;
	bool alive = send_resp(s, &r);
	meta__arena_free(&a);
	if (alive)
		meta__watch_pump(n); /* history to catch up from */
	return;
oom:
	stream_end(s, RPC_RESOURCE_EXHAUSTED, "etcdserver: out of memory");
}

static void on_cancel_req(struct meta__wstream *s, int64_t sid)
{
	struct wwatch *w = by_sid(s, sid);
	if (!w)
		return; /* etcd says nothing about an unknown ID */
	if (watch_cancel(s->n->watch, w->rid))
		log_debug("watch %" PRId64 ": not in the registry", sid);
	ww_remove(s, w);
	struct meta__arena a = {0};
	Etcdserverpb__WatchResponse r = ETCDSERVERPB__WATCH_RESPONSE__INIT;
	r.header = hdr(s, &a, 0);
	if (r.header) {
		r.watch_id = sid;
		r.canceled = true;
		send_resp(s, &r);
	}
	meta__arena_free(&a);
}

/* A WatchProgressRequest: answered (watch_id -1) once every watcher of
 * the stream is synced with nothing pending. */
static void try_progress(struct meta__wstream *s)
{
	int64_t rev = 0;
	for (size_t i = 0; i < s->nws; i++) {
		int rc = watch_progress_request(s->n->watch, s->ws[i].rid, &rev);
		if (rc == -EAGAIN) {
			s->progress_pending = true;
			return;
		}
	}
	s->progress_pending = false;
	if (!s->nws)
		rev = mvcc_rev(s->n->sm.store);
	send_progress(s, -1, rev);
}

/* ------------------------------------------------------------- the stream */

static void stream_end(struct meta__wstream *s, int status, const char *message)
{
	struct meta_node *n = s->n;
	for (size_t i = 0; i < s->nws; i++) {
		if (watch_cancel(n->watch, s->ws[i].rid))
			log_debug("watch %" PRId64 ": not in the registry", s->ws[i].sid);
		free(s->ws[i].key);
	}
	free(s->ws);
	*s->pprev = s->next;
	if (s->next)
		s->next->pprev = s->pprev;
	rpc_call_set_data(s->call, NULL);
	rpc_call_finish(s->call, status, message);
	free(s);
}

static void w_start(struct rpc_call *call)
{
	struct meta_node *n = rpc_call_service_data(call);
	struct meta__wstream *s;

	if (!n->running || n->stopping) {
		rpc_call_finish(call, RPC_UNAVAILABLE,
				n->stopping ? "etcdserver: server stopped"
					    : "etcdserver: not capable");
		return;
	}
	s = calloc(1, sizeof(*s));
	if (!s) {
		rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, "etcdserver: out of memory");
		return;
	}
	s->n = n;
	s->call = call;
	s->next = n->wstreams;
	s->pprev = &n->wstreams;
	if (n->wstreams)
		n->wstreams->pprev = &s->next;
	n->wstreams = s;
	rpc_call_set_data(call, s);
}

static void w_message(struct rpc_call *call, const ProtobufCMessage *msg)
{
	struct meta__wstream *s = rpc_call_data(call);
	const Etcdserverpb__WatchRequest *q = (const void *)msg;

	if (!s)
		return;
	switch (q->request_union_case) {
	case ETCDSERVERPB__WATCH_REQUEST__REQUEST_UNION_CREATE_REQUEST:
		on_create(s, q->create_request);
		break;
	case ETCDSERVERPB__WATCH_REQUEST__REQUEST_UNION_CANCEL_REQUEST:
		on_cancel_req(s, q->cancel_request->watch_id);
		break;
	case ETCDSERVERPB__WATCH_REQUEST__REQUEST_UNION_PROGRESS_REQUEST:
		try_progress(s);
		break;
	default:
		break;
	}
}

static void w_half_close(struct rpc_call *call)
{
	/* Like etcd: the client stopped sending, the watches go on. */
	(void)call;
}

static void w_cancel(struct rpc_call *call)
{
	struct meta__wstream *s = rpc_call_data(call);
	if (s)
		stream_end(s, RPC_CANCELLED, NULL);
	else
		rpc_call_finish(call, RPC_CANCELLED, NULL);
}

static void w_drain(struct rpc_call *call)
{
	struct meta__wstream *s = rpc_call_data(call);
	if (!s || !s->blocked)
		return;
	s->blocked = false;
	for (size_t i = 0; i < s->nws; i++)
		if (watch_pause(s->n->watch, s->ws[i].rid, false))
			log_debug("watch %" PRId64 ": cannot resume", s->ws[i].sid);
	meta__watch_pump(s->n);
}

static const struct rpc_method watch_methods[] = {
	{.name = "Watch",
	 .kind = RPC_BIDI_STREAMING,
	 .request = &etcdserverpb__watch_request__descriptor,
	 .response = &etcdserverpb__watch_response__descriptor,
	 .on_start = w_start,
	 .on_message = w_message,
	 .on_half_close = w_half_close,
	 .on_cancel = w_cancel,
	 .on_drain = w_drain},
};

int meta__watch_service_add(struct meta_node *n)
{
	if (!n->o.client_srv)
		return 0;
	return rpc_server_add_service(n->o.client_srv, "etcdserverpb.Watch", watch_methods,
				      MC_ARRAY_LEN(watch_methods), n);
}

/* ------------------------------------------------------------- timers */

static void on_sync_timer(uv_timer_t *t)
{
	struct meta_node *n = MC_CONTAINER_OF(t, struct meta_node, sync_timer);
	meta__watch_pump(n);
}

static void on_progress_timer(uv_timer_t *t)
{
	struct meta_node *n = MC_CONTAINER_OF(t, struct meta_node, progress_timer);
	int64_t *ids = NULL, rev = 0;
	size_t k = 0;

	if (!n->watch || watch_progress(n->watch, &ids, &k, &rev))
		return;
	for (size_t i = 0; i < k; i++) {
		for (struct meta__wstream *s = n->wstreams; s; s = s->next) {
			struct wwatch *w = by_rid(s, ids[i]);
			if (w) {
				send_progress(s, w->sid, rev);
				break;
			}
		}
	}
	free(ids);
}

void meta__watch_start_timers(struct meta_node *n)
{
	uv_timer_start(&n->progress_timer, on_progress_timer, n->o.progress_notify_ms,
		       n->o.progress_notify_ms);
}

/* ------------------------------------------------------------- rebind */

int meta__watch_rebind(struct meta_node *n)
{
	struct watch_registry *reg;
	int rc = watch_registry_new(n->sm.store, 0, &reg);
	if (rc)
		return rc;
	for (struct meta__wstream *s = n->wstreams; s; s = s->next) {
		for (size_t i = 0; i < s->nws; i++) {
			struct wwatch *w = &s->ws[i];
			struct watch_options o = {
				.key = w->key,
				.key_len = w->klen,
				.range_end = w->end,
				.range_end_len = w->elen,
				.start_revision = w->last_rev + 1,
				.id = w->rid,
				.tag = tag_of(s),
				.prev_kv = w->prev_kv,
				.progress_notify = w->progress,
				.filter_noput = w->noput,
				.filter_nodelete = w->nodelete,
			};
			int64_t rid;
			rc = watch_create(reg, n->sm.store, &o, &rid);
			if (rc == 0 && s->blocked)
				rc = watch_pause(reg, rid, true);
			if (rc) {
				watch_registry_free(reg);
				return rc;
			}
		}
	}
	if (n->watch)
		watch_registry_free(n->watch);
	n->watch = reg;
	return 0;
}

void meta__watch_close_streams(struct meta_node *n)
{
	while (n->wstreams)
		stream_end(n->wstreams, RPC_UNAVAILABLE, "etcdserver: server stopped");
}
