/*
 * etcd: v3 API client with endpoint failover, kept-alive leases and
 * resuming watches. See etcd.h.
 *
 * Every outstanding unary call, lease and watch is on a list of the client
 * so that etcd_client_free can cancel them. A unary call keeps its request
 * serialized, so when its endpoint turns out to be unavailable it can be
 * sent again to the next endpoint (once per endpoint). Leases and watches
 * own a uv timer each and are freed from that timer's close callback.
 */
#include "etcd/etcd.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "rpc/rpc.h"

#define LOG_SUBSYS LOGS_META

#define KV_PATH "/etcdserverpb.KV/"
#define LEASE_PATH "/etcdserverpb.Lease/"
#define WATCH_PATH "/etcdserverpb.Watch/Watch"
#define WATCH_BACKOFF_MIN_MS 100
#define WATCH_BACKOFF_MAX_MS 5000

struct list {
	struct list *prev, *next;
};

static void list_init(struct list *l)
{
	l->prev = l->next = l;
}

static void list_add(struct list *head, struct list *n)
{
	n->next = head;
	n->prev = head->prev;
	head->prev->next = n;
	head->prev = n;
}

static void list_del(struct list *n)
{
	n->prev->next = n->next;
	n->next->prev = n->prev;
	list_init(n);
}

struct etcd_client {
	uv_loop_t *loop;
	struct rpc_client **eps;
	char **ep_names;
	size_t neps;
	size_t cur;
	uint64_t timeout_ms;
	struct list calls, leases, watches;
	uint64_t refused_ms; /* last "refuses this process" warning */
};

/* ------------------------------------------------------------ errors */

int etcd_status_to_err(int status, const char *message)
{
	const char *m = message ? message : "";
	switch (status) {
	case RPC_OK:
		return 0;
	case RPC_DEADLINE_EXCEEDED:
		return MC_ETIMEDOUT;
	case RPC_UNAVAILABLE:
		return MC_EUNAVAILABLE;
	case RPC_CANCELLED:
		return MC_ECANCELLED;
	case RPC_NOT_FOUND:
		return -ENOENT;
	case RPC_OUT_OF_RANGE:
		return strstr(m, "compacted") ? MC_ECOMPACTED : -ERANGE;
	case RPC_RESOURCE_EXHAUSTED:
		return strstr(m, "space") ? -ENOSPC : MC_ETOO_LARGE;
	case RPC_INVALID_ARGUMENT:
	case RPC_FAILED_PRECONDITION:
		return -EINVAL;
	case RPC_PERMISSION_DENIED:
	case RPC_UNAUTHENTICATED:
		return -EACCES;
	default:
		return MC_EPROTOCOL;
	}
}

/* A member refused a call for want of the cluster secret: say so (every
 * 10 s at most), since the callers only see -EACCES. */
static void note_refused(struct etcd_client *c, size_t ep, int status, const char *message)
{
	if (status == RPC_UNAUTHENTICATED && mc_once_per(&c->refused_ms, 10000))
		log_warn("meta %s refuses this process: %s", c->ep_names[ep],
			 message ? message : "unauthenticated");
}

/* ------------------------------------------------------------ client */

static int parse_endpoint(const char *s, size_t len, char **out)
{
	if (len > 7 && strncmp(s, "http://", 7) == 0) {
		s += 7;
		len -= 7;
	}
	while (len > 0 && s[len - 1] == '/')
		len--;
	char *name = strndup(s, len);
	if (!name)
		return -ENOMEM;
	struct sockaddr_storage ss;
	if (mc_parse_hostport(name, &ss) != 0) {
		free(name);
		return -EINVAL;
	}
	*out = name;
	return 0;
}

int etcd_client_new(uv_loop_t *loop, const struct etcd_opts *opts, struct etcd_client **out)
{
	const char *eps = opts && opts->endpoints ? opts->endpoints : "";
	struct etcd_client *c = calloc(1, sizeof(*c));
	int rc = -ENOMEM;
	if (!c)
		return -ENOMEM;
	c->loop = loop;
	c->timeout_ms = opts && opts->timeout_ms ? opts->timeout_ms : 5000;
	list_init(&c->calls);
	list_init(&c->leases);
	list_init(&c->watches);

	size_t n = 1;
	for (const char *p = eps; *p; p++)
		n += *p == ',';
	c->eps = calloc(n, sizeof(*c->eps));
	c->ep_names = calloc(n, sizeof(*c->ep_names));
	if (!c->eps || !c->ep_names)
		goto fail;
	const char *p = eps;
	for (;;) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		rc = parse_endpoint(p, len, &c->ep_names[c->neps]);
		if (rc)
			goto fail;
		struct rpc_client_opts ro = {.auth_key = opts ? opts->auth_key : NULL,
					     .auth_key_len = opts ? opts->auth_key_len : 0};
		rc = rpc_client_new(loop, c->ep_names[c->neps], &ro, &c->eps[c->neps]);
		if (rc) {
			free(c->ep_names[c->neps]);
			goto fail;
		}
		c->neps++;
		if (!end)
			break;
		p = end + 1;
	}
	*out = c;
	return 0;
fail:
	for (size_t i = 0; i < c->neps; i++) {
		rpc_client_free(c->eps[i]);
		free(c->ep_names[i]);
	}
	free(c->eps);
	free(c->ep_names);
	free(c);
	return rc;
}

const char *etcd_client_endpoint(const struct etcd_client *c)
{
	return c->ep_names[c->cur];
}

/* An endpoint failed with UNAVAILABLE: the next call goes to the next. */
static void rotate_from(struct etcd_client *c, size_t ep)
{
	if (c->neps > 1 && c->cur == ep) {
		c->cur = (c->cur + 1) % c->neps;
		log_info("meta endpoint %s unavailable, trying %s", c->ep_names[ep],
			 c->ep_names[c->cur]);
	}
}

/* ------------------------------------------------------------ unary */

typedef void (*call_cb)(void *ud, int err, const ProtobufCMessage *resp);

/* The caller's callback, typed by operation. */
enum call_kind { CALL_INTERNAL, CALL_RANGE, CALL_PUT, CALL_DELETE, CALL_TXN };
union call_fn {
	call_cb internal;
	etcd_range_cb range;
	etcd_put_cb put;
	etcd_delete_cb del;
	etcd_txn_cb txn;
};

static void call_fn_invoke(enum call_kind kind, union call_fn fn, void *ud, int err,
			   const ProtobufCMessage *resp)
{
	switch (kind) {
	case CALL_INTERNAL:
		fn.internal(ud, err, resp);
		break;
	case CALL_RANGE:
		fn.range(ud, err, (const Etcdserverpb__RangeResponse *)resp);
		break;
	case CALL_PUT:
		fn.put(ud, err, (const Etcdserverpb__PutResponse *)resp);
		break;
	case CALL_DELETE:
		fn.del(ud, err, (const Etcdserverpb__DeleteRangeResponse *)resp);
		break;
	case CALL_TXN:
		fn.txn(ud, err, (const Etcdserverpb__TxnResponse *)resp);
		break;
	}
}

struct etcd_call {
	struct list link;
	struct etcd_client *c;
	char path[64];
	const ProtobufCMessageDescriptor *req_desc, *resp_desc;
	uint8_t *req;
	size_t req_len;
	size_t ep;
	size_t tries;
	struct rpc_stream *st;
	enum call_kind kind;
	union call_fn fn;
	void *ud;
};

static void call_free(struct etcd_call *k)
{
	list_del(&k->link);
	free(k->req);
	free(k);
}

static int call_send(struct etcd_call *k, const ProtobufCMessage *msg);

static void on_call_done(void *ud, int status, const char *message,
			 const ProtobufCMessage *resp)
{
	struct etcd_call *k = ud;
	struct etcd_client *c = k->c;
	k->st = NULL;
	if (status == RPC_UNAVAILABLE && k->tries < c->neps) {
		rotate_from(c, k->ep);
		ProtobufCMessage *copy = protobuf_c_message_unpack(k->req_desc, NULL,
								   k->req_len, k->req);
		int rc = copy ? call_send(k, copy) : -ENOMEM;
		if (copy)
			protobuf_c_message_free_unpacked(copy, NULL);
		if (rc == 0)
			return;
	}
	int err = etcd_status_to_err(status, message);
	note_refused(c, k->ep, status, message);
	if (err)
		log_debug("%s on %s: %s (%s)", k->path, c->ep_names[k->ep],
			  rpc_status_name(status), message ? message : "");
	enum call_kind kind = k->kind;
	union call_fn fn = k->fn;
	void *cb_ud = k->ud;
	call_free(k);
	call_fn_invoke(kind, fn, cb_ud, err, err ? NULL : resp);
}

static int call_send(struct etcd_call *k, const ProtobufCMessage *msg)
{
	struct etcd_client *c = k->c;
	k->ep = c->cur;
	k->tries++;
	int rc = rpc_client_unary(c->eps[k->ep], k->path, msg, k->resp_desc, c->timeout_ms,
				  on_call_done, k, &k->st);
	return rc;
}

static int call_start(struct etcd_client *c, const char *path, const ProtobufCMessage *req,
		      const ProtobufCMessageDescriptor *resp_desc, enum call_kind kind,
		      union call_fn fn, void *ud)
{
	struct etcd_call *k = calloc(1, sizeof(*k));
	if (!k)
		return -ENOMEM;
	k->c = c;
	snprintf(k->path, sizeof(k->path), "%s", path);
	k->req_desc = req->descriptor;
	k->resp_desc = resp_desc;
	k->kind = kind;
	k->fn = fn;
	k->ud = ud;
	k->req_len = protobuf_c_message_get_packed_size(req);
	k->req = malloc(k->req_len ? k->req_len : 1);
	if (!k->req) {
		free(k);
		return -ENOMEM;
	}
	protobuf_c_message_pack(req, k->req);
	list_init(&k->link);
	list_add(&c->calls, &k->link);
	int rc = call_send(k, req);
	if (rc)
		call_free(k);
	return rc;
}

int etcd_range(struct etcd_client *c, const Etcdserverpb__RangeRequest *req, etcd_range_cb cb,
	       void *ud)
{
	return call_start(c, KV_PATH "Range", &req->base,
			  &etcdserverpb__range_response__descriptor, CALL_RANGE,
			  (union call_fn){.range = cb}, ud);
}

int etcd_put(struct etcd_client *c, const Etcdserverpb__PutRequest *req, etcd_put_cb cb,
	     void *ud)
{
	return call_start(c, KV_PATH "Put", &req->base,
			  &etcdserverpb__put_response__descriptor, CALL_PUT,
			  (union call_fn){.put = cb}, ud);
}

int etcd_delete(struct etcd_client *c, const Etcdserverpb__DeleteRangeRequest *req,
		etcd_delete_cb cb, void *ud)
{
	return call_start(c, KV_PATH "DeleteRange", &req->base,
			  &etcdserverpb__delete_range_response__descriptor, CALL_DELETE,
			  (union call_fn){.del = cb}, ud);
}

int etcd_txn(struct etcd_client *c, const Etcdserverpb__TxnRequest *req, etcd_txn_cb cb,
	     void *ud)
{
	return call_start(c, KV_PATH "Txn", &req->base,
			  &etcdserverpb__txn_response__descriptor, CALL_TXN,
			  (union call_fn){.txn = cb}, ud);
}

size_t etcd_prefix_end(const void *key, size_t klen, uint8_t *end)
{
	const uint8_t *k = key;
	memcpy(end, k, klen);
	for (size_t i = klen; i > 0; i--) {
		if (end[i - 1] < 0xff) {
			end[i - 1]++;
			return i;
		}
	}
	end[0] = 0;
	return 1;
}

/* ------------------------------------------------------------ leases */

#define LEASE_KA_INFLIGHT 8

struct etcd_lease {
	struct list link;
	struct etcd_client *c;
	const struct etcd_lease_cbs *cbs;
	void *ud;
	int64_t id;
	int64_t ttl_s;
	uv_timer_t timer;
	struct rpc_stream *ka;
	size_t ka_ep;
	/* Send times of the keep-alives not answered yet, oldest first. The
	 * server's lease runs at least ttl from when it processed a request,
	 * which is after we sent it: so "sent + ttl" (our clock, a duration
	 * measured locally) is a time before which the lease surely holds. */
	uint64_t ka_sent_ms[LEASE_KA_INFLIGHT];
	unsigned ka_head, ka_n;
	uint64_t valid_until_ms; /* the lease surely holds until then */
	uint64_t tick_ms;
	bool granted;
	bool closing;
};

static void lease_on_timer_closed(uv_handle_t *h)
{
	free(h->data);
}

/* Stop everything and free the lease (from the timer's close callback). */
static void lease_close(struct etcd_lease *l)
{
	if (l->closing)
		return;
	l->closing = true;
	list_del(&l->link);
	if (l->ka) {
		rpc_stream_cancel(l->ka);
		l->ka = NULL;
	}
	uv_close((uv_handle_t *)&l->timer, lease_on_timer_closed);
}

static void lease_lost(struct etcd_lease *l, int err)
{
	log_warn("meta lease %llx lost: %s", (unsigned long long)l->id, mc_strerror(err));
	const struct etcd_lease_cbs *cbs = l->cbs;
	void *ud = l->ud;
	lease_close(l);
	if (cbs->on_lost)
		cbs->on_lost(l, ud, err);
}

static void ka_on_message(struct rpc_stream *st, void *ud, const ProtobufCMessage *msg)
{
	struct etcd_lease *l = ud;
	const Etcdserverpb__LeaseKeepAliveResponse *r =
		(const Etcdserverpb__LeaseKeepAliveResponse *)msg;
	(void)st;
	if (r->ttl <= 0) {
		lease_lost(l, -ENOENT);
		return;
	}
	if (l->ka_n == 0)
		return; /* not ours to count (cannot happen with one stream) */
	uint64_t sent = l->ka_sent_ms[l->ka_head];
	l->ka_head = (l->ka_head + 1) % LEASE_KA_INFLIGHT;
	l->ka_n--;
	uint64_t until = sent + (uint64_t)r->ttl * 1000;
	if (until > l->valid_until_ms)
		l->valid_until_ms = until;
}

static void ka_on_close(struct rpc_stream *st, void *ud, int status, const char *message)
{
	struct etcd_lease *l = ud;
	(void)st;
	l->ka = NULL;
	l->ka_n = 0; /* their answers are lost with the stream */
	if (status == RPC_UNAVAILABLE)
		rotate_from(l->c, l->ka_ep);
	note_refused(l->c, l->ka_ep, status, message);
	log_debug("lease keep-alive stream closed: %s %s", rpc_status_name(status),
		  message ? message : "");
}

static const struct rpc_stream_cbs ka_cbs = {.on_message = ka_on_message,
					     .on_close = ka_on_close};

static void lease_on_tick(uv_timer_t *t)
{
	struct etcd_lease *l = t->data;
	struct etcd_client *c = l->c;
	uv_update_time(c->loop);
	uint64_t now = uv_now(c->loop);
	/* Lost once the lease might expire before the next tick could
	 * notice: the holder stops relying on it while it surely holds. */
	if (now + l->tick_ms >= l->valid_until_ms) {
		lease_lost(l, MC_ETIMEDOUT);
		return;
	}
	if (!l->ka) {
		l->ka_ep = c->cur;
		l->ka_n = 0;
		if (rpc_client_stream(c->eps[l->ka_ep], LEASE_PATH "LeaseKeepAlive",
				      &etcdserverpb__lease_keep_alive_response__descriptor, 0,
				      &ka_cbs, l, &l->ka) != 0) {
			l->ka = NULL;
			return;
		}
	}
	if (l->ka_n == LEASE_KA_INFLIGHT)
		return; /* the server answers nothing: wait, do not pile up */
	Etcdserverpb__LeaseKeepAliveRequest req = ETCDSERVERPB__LEASE_KEEP_ALIVE_REQUEST__INIT;
	req.id = l->id;
	if (rpc_stream_send(l->ka, &req.base) != 0) {
		rpc_stream_cancel(l->ka);
		l->ka = NULL;
		return;
	}
	l->ka_sent_ms[(l->ka_head + l->ka_n) % LEASE_KA_INFLIGHT] = now;
	l->ka_n++;
}

uint64_t etcd_lease_valid_until_ms(const struct etcd_lease *l)
{
	return l->granted ? l->valid_until_ms : 0;
}

static void lease_on_granted(void *ud, int err, const ProtobufCMessage *msg)
{
	struct etcd_lease *l = ud;
	const Etcdserverpb__LeaseGrantResponse *r =
		(const Etcdserverpb__LeaseGrantResponse *)msg;
	if (err == 0 && r->error && *r->error)
		err = MC_EPROTOCOL;
	if (err) {
		const struct etcd_lease_cbs *cbs = l->cbs;
		void *cb_ud = l->ud;
		lease_close(l);
		cbs->on_granted(l, cb_ud, err, 0);
		return;
	}
	l->id = r->id;
	l->ttl_s = r->ttl > 0 ? r->ttl : l->ttl_s;
	l->granted = true;
	l->valid_until_ms += (uint64_t)l->ttl_s * 1000; /* sent + ttl */
	/* A keep-alive every ttl/4: the lease is given up after about two
	 * unanswered ones, still a quarter TTL before it could expire. */
	l->tick_ms = (uint64_t)l->ttl_s * 1000 / 4;
	if (l->tick_ms < 100)
		l->tick_ms = 100;
	uv_timer_start(&l->timer, lease_on_tick, l->tick_ms, l->tick_ms);
	l->cbs->on_granted(l, l->ud, 0, l->id);
}

int etcd_lease_grant(struct etcd_client *c, int64_t ttl_s, const struct etcd_lease_cbs *cbs,
		     void *ud, struct etcd_lease **out)
{
	if (ttl_s <= 0 || !cbs || !cbs->on_granted)
		return -EINVAL;
	struct etcd_lease *l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	l->c = c;
	l->cbs = cbs;
	l->ud = ud;
	l->ttl_s = ttl_s;
	uv_update_time(c->loop);
	l->valid_until_ms = uv_now(c->loop); /* the grant's send time for now */
	uv_timer_init(c->loop, &l->timer);
	l->timer.data = l;
	list_init(&l->link);
	list_add(&c->leases, &l->link);
	Etcdserverpb__LeaseGrantRequest req = ETCDSERVERPB__LEASE_GRANT_REQUEST__INIT;
	req.ttl = ttl_s;
	int rc = call_start(c, LEASE_PATH "LeaseGrant", &req.base,
			    &etcdserverpb__lease_grant_response__descriptor, CALL_INTERNAL,
			    (union call_fn){.internal = lease_on_granted}, l);
	if (rc) {
		lease_close(l);
		return rc;
	}
	*out = l;
	return 0;
}

int64_t etcd_lease_id(const struct etcd_lease *l)
{
	return l->id;
}

static void on_revoked(void *ud, int err, const ProtobufCMessage *msg)
{
	(void)msg;
	if (err && err != MC_ECANCELLED)
		log_debug("lease %llx revoke: %s", *(unsigned long long *)ud,
			  mc_strerror(err));
	free(ud);
}

/* The grant call of a lease still being granted refers to it: drop it. */
static void cancel_calls_for(struct etcd_client *c, void *ud)
{
	for (struct list *n = c->calls.next; n != &c->calls;) {
		struct etcd_call *k = MC_CONTAINER_OF(n, struct etcd_call, link);
		n = n->next;
		if (k->ud == ud) {
			if (k->st)
				rpc_stream_cancel(k->st);
			call_free(k);
		}
	}
}

void etcd_lease_revoke(struct etcd_lease *l)
{
	struct etcd_client *c = l->c;
	if (l->granted) {
		unsigned long long *id = malloc(sizeof(*id));
		if (id) {
			*id = (unsigned long long)l->id;
			Etcdserverpb__LeaseRevokeRequest req =
				ETCDSERVERPB__LEASE_REVOKE_REQUEST__INIT;
			req.id = l->id;
			if (call_start(c, LEASE_PATH "LeaseRevoke", &req.base,
				       &etcdserverpb__lease_revoke_response__descriptor,
				       CALL_INTERNAL, (union call_fn){.internal = on_revoked},
				       id) != 0)
				free(id);
		}
	} else {
		cancel_calls_for(c, l);
	}
	lease_close(l);
}

/* ------------------------------------------------------------ watches */

struct etcd_watch {
	struct list link;
	struct etcd_client *c;
	const struct etcd_watch_cbs *cbs;
	void *ud;
	uint8_t *key, *end;
	size_t klen, elen;
	int64_t next_rev;
	int prev_kv;
	struct rpc_stream *st;
	size_t st_ep;
	uv_timer_t retry;
	uint64_t backoff_ms;
	bool closing;
};

static void watch_on_timer_closed(uv_handle_t *h)
{
	struct etcd_watch *w = h->data;
	free(w->key);
	free(w->end);
	free(w);
}

static void watch_close(struct etcd_watch *w)
{
	if (w->closing)
		return;
	w->closing = true;
	list_del(&w->link);
	if (w->st) {
		rpc_stream_cancel(w->st);
		w->st = NULL;
	}
	uv_close((uv_handle_t *)&w->retry, watch_on_timer_closed);
}

static void watch_fail(struct etcd_watch *w, int err)
{
	const struct etcd_watch_cbs *cbs = w->cbs;
	void *ud = w->ud;
	watch_close(w);
	if (cbs->on_error)
		cbs->on_error(w, ud, err);
}

static void watch_on_retry(uv_timer_t *t);

static void watch_schedule_retry(struct etcd_watch *w)
{
	if (w->closing)
		return;
	w->backoff_ms = w->backoff_ms ? MC_MIN(w->backoff_ms * 2, WATCH_BACKOFF_MAX_MS)
				      : WATCH_BACKOFF_MIN_MS;
	uv_timer_start(&w->retry, watch_on_retry, w->backoff_ms, 0);
}

static void watch_on_message(struct rpc_stream *st, void *ud, const ProtobufCMessage *msg)
{
	struct etcd_watch *w = ud;
	const Etcdserverpb__WatchResponse *r = (const Etcdserverpb__WatchResponse *)msg;
	int64_t hrev = r->header ? r->header->revision : 0;
	(void)st;
	if (r->canceled) {
		if (r->compact_revision > 0) {
			log_warn("watch from revision %lld: compacted at %lld",
				 (long long)w->next_rev, (long long)r->compact_revision);
			watch_fail(w, MC_ECOMPACTED);
			return;
		}
		/* Cancelled by the server (e.g. too slow): resume. */
		log_info("watch cancelled by the server (%s); resuming at %lld",
			 r->cancel_reason ? r->cancel_reason : "", (long long)w->next_rev);
		if (w->st) {
			rpc_stream_cancel(w->st);
			w->st = NULL;
		}
		watch_schedule_retry(w);
		return;
	}
	w->backoff_ms = 0;
	if (r->created && w->next_rev == 0)
		w->next_rev = hrev + 1;
	if (r->n_events > 0) {
		const Mvccpb__Event *last = r->events[r->n_events - 1];
		if (last->kv)
			w->next_rev = last->kv->mod_revision + 1;
		w->cbs->on_events(w, w->ud, r->events, r->n_events, hrev);
	} else if (!r->created && hrev + 1 > w->next_rev) {
		w->next_rev = hrev + 1; /* progress notification */
	}
}

static void watch_on_close(struct rpc_stream *st, void *ud, int status, const char *message)
{
	struct etcd_watch *w = ud;
	(void)st;
	w->st = NULL;
	if (status == RPC_UNAVAILABLE)
		rotate_from(w->c, w->st_ep);
	note_refused(w->c, w->st_ep, status, message);
	log_debug("watch stream closed: %s %s; resuming at revision %lld",
		  rpc_status_name(status), message ? message : "", (long long)w->next_rev);
	watch_schedule_retry(w);
}

static const struct rpc_stream_cbs watch_cbs = {.on_message = watch_on_message,
						.on_close = watch_on_close};

static int watch_open(struct etcd_watch *w)
{
	struct etcd_client *c = w->c;
	Etcdserverpb__WatchCreateRequest cr = ETCDSERVERPB__WATCH_CREATE_REQUEST__INIT;
	Etcdserverpb__WatchRequest req = ETCDSERVERPB__WATCH_REQUEST__INIT;
	cr.key.data = w->key;
	cr.key.len = w->klen;
	cr.range_end.data = w->end;
	cr.range_end.len = w->elen;
	cr.start_revision = w->next_rev;
	cr.prev_kv = w->prev_kv != 0;
	cr.progress_notify = 1;
	req.request_union_case = ETCDSERVERPB__WATCH_REQUEST__REQUEST_UNION_CREATE_REQUEST;
	req.create_request = &cr;
	w->st_ep = c->cur;
	int rc = rpc_client_stream(c->eps[w->st_ep], WATCH_PATH,
				   &etcdserverpb__watch_response__descriptor, 0, &watch_cbs, w,
				   &w->st);
	if (rc) {
		w->st = NULL;
		return rc;
	}
	rc = rpc_stream_send(w->st, &req.base);
	if (rc) {
		rpc_stream_cancel(w->st);
		w->st = NULL;
	}
	return rc;
}

static void watch_on_retry(uv_timer_t *t)
{
	struct etcd_watch *w = t->data;
	if (w->closing || w->st)
		return;
	if (watch_open(w) != 0)
		watch_schedule_retry(w);
}

int etcd_watch(struct etcd_client *c, const void *key, size_t klen, const void *range_end,
	       size_t elen, int64_t start_rev, int prev_kv, const struct etcd_watch_cbs *cbs,
	       void *ud, struct etcd_watch **out)
{
	if (!cbs || !cbs->on_events || start_rev < 0)
		return -EINVAL;
	struct etcd_watch *w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	w->key = malloc(klen ? klen : 1);
	w->end = malloc(elen ? elen : 1);
	if (!w->key || !w->end) {
		free(w->key);
		free(w->end);
		free(w);
		return -ENOMEM;
	}
	memcpy(w->key, key, klen);
	if (elen)
		memcpy(w->end, range_end, elen);
	w->klen = klen;
	w->elen = elen;
	w->c = c;
	w->cbs = cbs;
	w->ud = ud;
	w->next_rev = start_rev;
	w->prev_kv = prev_kv;
	uv_timer_init(c->loop, &w->retry);
	w->retry.data = w;
	list_init(&w->link);
	list_add(&c->watches, &w->link);
	int rc = watch_open(w);
	if (rc) {
		watch_close(w);
		return rc;
	}
	*out = w;
	return 0;
}

void etcd_watch_cancel(struct etcd_watch *w)
{
	watch_close(w);
}

/* ------------------------------------------------------------ free */

void etcd_client_free(struct etcd_client *c)
{
	while (c->leases.next != &c->leases) {
		struct etcd_lease *l = MC_CONTAINER_OF(c->leases.next, struct etcd_lease,
						       link);
		const struct etcd_lease_cbs *cbs = l->cbs;
		void *ud = l->ud;
		bool granted = l->granted;
		cancel_calls_for(c, l);
		lease_close(l);
		if (granted && cbs->on_lost)
			cbs->on_lost(l, ud, MC_ECANCELLED);
		else if (!granted)
			cbs->on_granted(l, ud, MC_ECANCELLED, 0);
	}
	while (c->watches.next != &c->watches) {
		struct etcd_watch *w = MC_CONTAINER_OF(c->watches.next, struct etcd_watch,
						       link);
		watch_fail(w, MC_ECANCELLED);
	}
	while (c->calls.next != &c->calls) {
		struct etcd_call *k = MC_CONTAINER_OF(c->calls.next, struct etcd_call, link);
		if (k->st)
			rpc_stream_cancel(k->st);
		enum call_kind kind = k->kind;
		union call_fn fn = k->fn;
		void *ud = k->ud;
		call_free(k);
		call_fn_invoke(kind, fn, ud, MC_ECANCELLED, NULL);
	}
	for (size_t i = 0; i < c->neps; i++) {
		rpc_client_free(c->eps[i]);
		free(c->ep_names[i]);
	}
	free(c->eps);
	free(c->ep_names);
	free(c);
}
