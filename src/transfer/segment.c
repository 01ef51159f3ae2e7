/*
 * segment: opened peer segments — the open-once cache, resolving a name to
 * a descriptor (meta Range, or GetDescriptor from "host:port" in P2P mode)
 * on the loop, connecting the transports on the setup thread, and keeping
 * a segment usable as its descriptor changes:
 *
 *   RESOLVING --descriptor, connect--> OPEN --watch event / dead paths-->
 *   REFRESHING --reconnect (or not)--> OPEN            (first failure: FAILED)
 *
 * Requests submitted while a segment resolves or refreshes are parked on
 * it and dispatched (or failed) when that ends, so nothing hangs and the
 * hot path never waits for meta. A watch event with a new incarnation
 * (the peer restarted) or new endpoints makes the segment reconnect; one
 * that only changes regions just replaces the descriptor. When every path
 * of a segment died, the next request re-resolves it (at most once a
 * second); in between, requests fail at once with MC_EUNAVAILABLE.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/metrics.h"
#include "common/util.h"
#include "etcd/etcd.h"
#include "rpc/rpc.h"
#include "transfer.pb-c.h"
#include "transfer/te_int.h"

#define LOG_SUBSYS LOGS_TE
#define REFRESH_BACKOFF_MS 1000
#define P2P_TIMEOUT_MS 5000

/* ------------------------------------------------------------ peers */

void te__peer_ref(struct te_peer *p)
{
	atomic_fetch_add(&p->refs, 1);
}

void te__peer_unref(struct te_peer *p)
{
	if (atomic_fetch_sub(&p->refs, 1) == 1)
		p->ops->peer_free(p);
}

void te__peer_path_down(struct te_peer *p, unsigned path)
{
	uint32_t left = atomic_fetch_and(&p->alive, ~(1u << path)) & ~(1u << path);
	if (left == 0 && !atomic_exchange(&p->closed, true))
		log_warn("segment %s: every %s path is down", p->name, p->ops->name);
}

static bool usable(const struct te_peer *p)
{
	return p && !atomic_load(&p->closed);
}

static void peer_drop(struct te_peer *p)
{
	if (!p)
		return;
	p->ops->disconnect(p);
	te__peer_unref(p);
}

/* ------------------------------------------------------------ segment objects */

static void seg_ref(struct te_segment *s)
{
	atomic_fetch_add(&s->refs, 1);
}

static void seg_free(struct te_segment *s)
{
	peer_drop(s->shm);
	peer_drop(s->remote);
	te__desc_free(s->desc);
	te__desc_free(s->next_desc);
	while (s->waiters) {
		struct te_open_waiter *w = s->waiters;
		s->waiters = w->next;
		free(w);
	}
	pthread_mutex_destroy(&s->mu);
	pthread_cond_destroy(&s->cv);
	free(s);
}

static void seg_unref(struct te_segment *s)
{
	if (atomic_fetch_sub(&s->refs, 1) == 1)
		seg_free(s);
}

static void on_resolve(struct te_job *j);
static void on_connect(struct te_job *j);
static void on_notify(struct te_job *j);

static struct te_segment *seg_new(struct te_engine *e, const char *name)
{
	struct te_segment *s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	s->e = e;
	snprintf(s->name, sizeof(s->name), "%s", name);
	atomic_init(&s->refs, 1); /* the cache's */
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv, NULL);
	s->state = TE_SEG_RESOLVING;
	s->parked_tail = &s->parked;
	s->resolve_job.fn = on_resolve;
	s->connect_job.fn = on_connect;
	s->notify_job.fn = on_notify;
	return s;
}

/* Posting a job takes a reference the job drops. */
static void post_loop(struct te_segment *s, struct te_job *j)
{
	seg_ref(s);
	if (!te__loop_post(s->e, j))
		seg_unref(s); /* already queued; it runs once */
}

static void post_setup(struct te_segment *s, struct te_job *j)
{
	seg_ref(s);
	if (!te__setup_post(s->e, j))
		seg_unref(s);
}

/* e->mu held. */
static struct te_segment *find_locked(struct te_engine *e, const char *name)
{
	for (struct te_segment *s = e->segs; s; s = s->next)
		if (strcmp(s->name, name) == 0)
			return s;
	return NULL;
}

static void uncache(struct te_segment *s)
{
	struct te_engine *e = s->e;
	bool drop = false;
	pthread_mutex_lock(&e->mu);
	if (s->in_cache) {
		for (struct te_segment **pp = &e->segs; *pp; pp = &(*pp)->next) {
			if (*pp == s) {
				*pp = s->next;
				break;
			}
		}
		s->in_cache = false;
		drop = true;
		metric_sub(e->m_segments, 1);
	}
	pthread_mutex_unlock(&e->mu);
	if (drop)
		seg_unref(s);
}

/* ------------------------------------------------------------ finishing */

/*
 * The end of a resolve/connect round, from any thread: install the new
 * peers and descriptor (or record the failure), wake blocking openers,
 * schedule async ones, then dispatch or fail the parked requests. Takes
 * ownership of d, shm and remote.
 */
static void seg_finish(struct te_segment *s, int err, struct te_desc *d, struct te_peer *shm,
		       struct te_peer *remote, bool replace)
{
	struct te_peer *old_shm = NULL, *old_remote = NULL;
	bool failed_first = false;

	pthread_mutex_lock(&s->mu);
	if (err && s->state == TE_SEG_RESOLVING) {
		s->state = TE_SEG_FAILED;
		s->err = err;
		failed_first = true;
	} else {
		if (replace) {
			old_shm = s->shm;
			old_remote = s->remote;
			s->shm = shm;
			s->remote = remote;
			shm = remote = NULL;
		}
		if (d) {
			te__desc_free(s->desc);
			s->desc = d;
			d = NULL;
			s->deleted = false;
		}
		s->state = TE_SEG_OPEN;
		s->err = 0;
	}
	struct te_req_state *parked = s->parked;
	s->parked = NULL;
	s->parked_tail = &s->parked;
	bool notify = s->waiters != NULL;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);

	te__desc_free(d);
	peer_drop(shm);
	peer_drop(remote);
	peer_drop(old_shm);
	peer_drop(old_remote);
	if (failed_first)
		uncache(s);
	if (notify)
		post_loop(s, &s->notify_job);
	while (parked) {
		struct te_req_state *rs = parked;
		parked = rs->park_next;
		if (err)
			te__req_fail(rs->batch, rs, err);
		else
			te__req_dispatch(rs->batch, rs);
	}
}

/* ------------------------------------------------------------ resolve (loop) */

static void got_desc(struct te_segment *s, int err, struct te_desc *d)
{
	if (err) {
		log_warn("segment %s: cannot resolve: %s", s->name, mc_strerror(err));
		seg_finish(s, err, NULL, NULL, NULL, false);
		return;
	}
	if (strcmp(d->name, s->name) != 0 && s->e->meta) {
		log_warn("segment %s: meta holds a descriptor named %s", s->name, d->name);
		te__desc_free(d);
		seg_finish(s, MC_EPROTOCOL, NULL, NULL, NULL, false);
		return;
	}
	pthread_mutex_lock(&s->mu);
	te__desc_free(s->next_desc);
	s->next_desc = d;
	pthread_mutex_unlock(&s->mu);
	post_setup(s, &s->connect_job);
}

static void on_range(void *ud, int err, const Etcdserverpb__RangeResponse *resp)
{
	struct te_segment *s = ud;
	struct te_desc *d = NULL;
	if (err == 0 && resp->n_kvs == 0)
		err = MC_ESEGMENT_NOT_FOUND;
	if (err == 0)
		err = te__desc_decode(resp->kvs[0]->value.data, resp->kvs[0]->value.len, &d);
	got_desc(s, err, d);
	seg_unref(s);
}

static int status_err(int status)
{
	switch (status) {
	case RPC_OK:
		return 0;
	case RPC_NOT_FOUND:
	case RPC_UNIMPLEMENTED:
		return MC_ESEGMENT_NOT_FOUND;
	case RPC_DEADLINE_EXCEEDED:
		return MC_ETIMEDOUT;
	case RPC_UNAVAILABLE:
	case RPC_RESOURCE_EXHAUSTED:
		return MC_EUNAVAILABLE;
	case RPC_UNAUTHENTICATED:
	case RPC_PERMISSION_DENIED:
		return -EACCES;
	default:
		return MC_EPROTOCOL;
	}
}

/* The P2P fetch: with a cluster secret, Challenge and then GetDescriptor
 * with the proof (svc.c); without, GetDescriptor alone. */
struct p2p_call {
	struct te_segment *s;
	struct rpc_client *c;
};

static void p2p_done(struct p2p_call *pc, int err, struct te_desc *d)
{
	got_desc(pc->s, err, d);
	rpc_client_free(pc->c);
	seg_unref(pc->s);
	free(pc);
}

static void on_p2p(void *ud, int status, const char *message, const ProtobufCMessage *resp)
{
	struct p2p_call *pc = ud;
	struct te_desc *d = NULL;
	int err = status_err(status);
	if (err == -EACCES)
		log_warn("segment %s refused our descriptor fetch: %s", pc->s->name,
			 message ? message : rpc_status_name(status));
	else if (err)
		log_debug("GetDescriptor from %s: %s %s", pc->s->name, rpc_status_name(status),
			  message ? message : "");
	else
		err = te__desc_from_pb((const Mooncake__Transfer__SegmentDesc *)resp, &d);
	p2p_done(pc, err, d);
}

/* GetDescriptor, with the proof over nonce when there is one. */
static int p2p_get(struct p2p_call *pc, const uint8_t *nonce, size_t nlen)
{
	struct te_engine *e = pc->s->e;
	uint8_t mac[MC_SHA256_BYTES];
	Mooncake__Transfer__GetDescriptorRequest req =
		MOONCAKE__TRANSFER__GET_DESCRIPTOR_REQUEST__INIT;
	if (nonce) {
		/* The proof names what the fetch asks for: "" (any). */
		te__desc_mac(e->secret, e->secret_len, nonce, nlen, "", mac);
		req.challenge.data = (uint8_t *)nonce;
		req.challenge.len = nlen;
		req.mac.data = mac;
		req.mac.len = sizeof(mac);
	}
	return rpc_client_unary(pc->c, "/mooncake.transfer.Transfer/GetDescriptor", &req.base,
				&mooncake__transfer__segment_desc__descriptor, P2P_TIMEOUT_MS,
				on_p2p, pc, NULL);
}

static void on_challenge(void *ud, int status, const char *message,
			 const ProtobufCMessage *resp)
{
	struct p2p_call *pc = ud;
	int err = status_err(status);
	if (err) {
		log_debug("Challenge from %s: %s %s", pc->s->name, rpc_status_name(status),
			  message ? message : "");
		p2p_done(pc, err, NULL);
		return;
	}
	const Mooncake__Transfer__ChallengeReply *ch =
		(const Mooncake__Transfer__ChallengeReply *)resp;
	err = p2p_get(pc, ch->nonce.data, ch->nonce.len);
	if (err)
		p2p_done(pc, err, NULL);
}

static int resolve_p2p(struct te_segment *s)
{
	struct p2p_call *pc = calloc(1, sizeof(*pc));
	struct rpc_client_opts o = {.connect_timeout_ms = TE_CONNECT_TIMEOUT_MS};
	int rc;
	if (!pc)
		return -ENOMEM;
	pc->s = s;
	rc = rpc_client_new(s->e->loop, s->name, &o, &pc->c);
	if (rc) {
		free(pc);
		return rc;
	}
	if (s->e->secret_len) {
		Mooncake__Transfer__ChallengeRequest req =
			MOONCAKE__TRANSFER__CHALLENGE_REQUEST__INIT;
		rc = rpc_client_unary(pc->c, "/mooncake.transfer.Transfer/Challenge",
				      &req.base,
				      &mooncake__transfer__challenge_reply__descriptor,
				      P2P_TIMEOUT_MS, on_challenge, pc, NULL);
	} else {
		rc = p2p_get(pc, NULL, 0);
	}
	if (rc) {
		rpc_client_free(pc->c);
		free(pc);
	}
	return rc;
}

static void on_resolve(struct te_job *j)
{
	struct te_segment *s = MC_CONTAINER_OF(j, struct te_segment, resolve_job);
	struct te_engine *e = s->e;
	int rc;
	if (e->stopped) {
		seg_finish(s, MC_ESHUTDOWN, NULL, NULL, NULL, false);
		seg_unref(s);
		return;
	}
	if (e->meta) {
		char key[512];
		int klen = te__seg_key(e, s->name, key, sizeof(key));
		Etcdserverpb__RangeRequest req = ETCDSERVERPB__RANGE_REQUEST__INIT;
		req.key.data = (uint8_t *)key;
		req.key.len = (size_t)klen;
		rc = etcd_range(e->meta, &req, on_range, s);
		if (rc == 0)
			return; /* on_range drops the job's reference */
	} else {
		rc = resolve_p2p(s);
		if (rc == 0)
			return;
	}
	got_desc(s, rc, NULL);
	seg_unref(s);
}

/* ------------------------------------------------------------ connect (setup thread) */

static bool same_endpoints(const struct te_desc *a, const struct te_desc *b)
{
	return a->incarnation == b->incarnation && a->data_port == b->data_port &&
	       a->transports == b->transports && strcmp(a->host, b->host) == 0 &&
	       strcmp(a->shm_socket, b->shm_socket) == 0;
}

static void on_connect(struct te_job *j)
{
	struct te_segment *s = MC_CONTAINER_OF(j, struct te_segment, connect_job);
	struct te_engine *e = s->e;
	struct te_peer *shm = NULL, *remote = NULL;
	int err = 0;

	pthread_mutex_lock(&s->mu);
	struct te_desc *d = s->next_desc;
	s->next_desc = NULL;
	if (e->stopped) {
		pthread_mutex_unlock(&s->mu);
		te__desc_free(d);
		seg_finish(s, MC_ESHUTDOWN, NULL, NULL, NULL, false);
		seg_unref(s);
		return;
	}
	bool reconnect = !d || !s->desc || !same_endpoints(d, s->desc) ||
			 s->state != TE_SEG_OPEN || (!usable(s->shm) && !usable(s->remote));
	pthread_mutex_unlock(&s->mu);
	if (!d) { /* a later job took it */
		seg_unref(s);
		return;
	}
	if (!reconnect) {
		log_debug("segment %s: descriptor generation %llu (%zu regions)", s->name,
			  (unsigned long long)d->generation, d->nregions);
		seg_finish(s, 0, d, NULL, NULL, false);
		seg_unref(s);
		return;
	}

	bool same_host = (d->transports & TE_XP_SHM) && strcmp(d->host_id, e->host_id) == 0 &&
			 e->xp[TE_PROTO_SHM];
	if (e->proto == TE_PROTO_SHM && !same_host) {
		log_warn("segment %s: --protocol=shm but it is not on this host "
			 "(or offers no shm)",
			 s->name);
		err = MC_EUNAVAILABLE;
	}
	if (!err && same_host && (e->proto == TE_PROTO_AUTO || e->proto == TE_PROTO_SHM)) {
		int rc = e->xops[TE_PROTO_SHM]->connect(e->xp[TE_PROTO_SHM], s, d, &shm);
		if (rc == -EACCES || rc == MC_ESEGMENT_NOT_FOUND || e->proto == TE_PROTO_SHM) {
			err = rc;
		} else if (rc) {
			log_warn("segment %s: shm unavailable (%s); using %s", s->name,
				 mc_strerror(rc), te_protocol_name(e->remote_proto));
		}
	}
	if (!err && e->proto != TE_PROTO_SHM) {
		int p = e->remote_proto;
		if (p == TE_PROTO_RDMA && !(d->transports & TE_XP_RDMA) &&
		    e->proto == TE_PROTO_AUTO) {
			log_info("segment %s offers no rdma; using tcp", s->name);
			p = TE_PROTO_TCP;
		}
		if (!(d->transports & (1u << p)) || !e->xp[p]) {
			if (!shm) {
				log_warn("segment %s offers no %s transport", s->name,
					 te_protocol_name((enum te_protocol)p));
				err = MC_EUNAVAILABLE;
			}
		} else {
			int rc = e->xops[p]->connect(e->xp[p], s, d, &remote);
			if (rc && (!shm || rc == -EACCES))
				err = rc;
			else if (rc)
				log_warn("segment %s: %s connect failed (%s); shm only",
					 s->name, te_protocol_name((enum te_protocol)p),
					 mc_strerror(rc));
		}
	}
	if (err) {
		log_warn("segment %s: cannot connect to %s:%u: %s", s->name, d->host,
			 d->data_port, mc_strerror(err));
		peer_drop(shm);
		peer_drop(remote);
		te__desc_free(d);
		seg_finish(s, err, NULL, NULL, NULL, false);
	} else {
		log_info("segment %s: connected (%s%s%s), %zu regions, incarnation "
			 "%016llx",
			 s->name, shm ? "shm" : "", shm && remote ? "+" : "",
			 remote ? remote->ops->name : "", d->nregions,
			 (unsigned long long)d->incarnation);
		seg_finish(s, 0, d, shm, remote, true);
	}
	seg_unref(s);
}

/* ------------------------------------------------------------ async waiters (loop) */

static void on_notify(struct te_job *j)
{
	struct te_segment *s = MC_CONTAINER_OF(j, struct te_segment, notify_job);
	pthread_mutex_lock(&s->mu);
	struct te_open_waiter *w = NULL;
	int err = 0;
	if (s->state != TE_SEG_RESOLVING) {
		w = s->waiters;
		s->waiters = NULL;
		err = s->state == TE_SEG_FAILED ? s->err : 0;
	}
	pthread_mutex_unlock(&s->mu);
	while (w) {
		struct te_open_waiter *next = w->next;
		if (err) {
			w->cb(w->ud, err, NULL);
			seg_unref(s); /* the waiter's */
		} else {
			w->cb(w->ud, 0, s);
		}
		free(w);
		w = next;
	}
	seg_unref(s);
}

/* ------------------------------------------------------------ API */

/* Find or create the segment, with a reference for the caller. */
static int seg_get(struct te_engine *e, const char *name, struct te_segment **out)
{
	if (!name || !*name || strlen(name) > TE_NAME_MAX)
		return -EINVAL;
	bool start = false;
	pthread_mutex_lock(&e->mu);
	if (e->stopped) {
		pthread_mutex_unlock(&e->mu);
		return MC_ESHUTDOWN;
	}
	struct te_segment *s = find_locked(e, name);
	if (!s) {
		s = seg_new(e, name);
		if (!s) {
			pthread_mutex_unlock(&e->mu);
			return -ENOMEM;
		}
		s->next = e->segs;
		e->segs = s;
		s->in_cache = true;
		start = true;
		metric_add(e->m_segments, 1);
	}
	seg_ref(s);
	pthread_mutex_unlock(&e->mu);
	if (start)
		post_loop(s, &s->resolve_job);
	*out = s;
	return 0;
}

int te_open_segment(struct te_engine *e, const char *name, struct te_segment **out)
{
	struct te_segment *s;
	int rc = seg_get(e, name, &s);
	if (rc)
		return rc;
	pthread_mutex_lock(&s->mu);
	while (s->state == TE_SEG_RESOLVING)
		pthread_cond_wait(&s->cv, &s->mu);
	rc = s->state == TE_SEG_FAILED ? s->err : 0;
	pthread_mutex_unlock(&s->mu);
	if (rc) {
		seg_unref(s);
		return rc;
	}
	*out = s;
	return 0;
}

int te_open_segment_cached(struct te_engine *e, const char *name, struct te_segment **out)
{
	pthread_mutex_lock(&e->mu);
	if (e->stopped) {
		pthread_mutex_unlock(&e->mu);
		return MC_ESHUTDOWN;
	}
	struct te_segment *s = find_locked(e, name);
	if (s)
		seg_ref(s);
	pthread_mutex_unlock(&e->mu);
	if (!s)
		return -EAGAIN;
	pthread_mutex_lock(&s->mu);
	bool open = s->state == TE_SEG_OPEN || s->state == TE_SEG_REFRESHING;
	pthread_mutex_unlock(&s->mu);
	if (!open) {
		seg_unref(s);
		return -EAGAIN;
	}
	*out = s;
	return 0;
}

int te_open_segment_async(struct te_engine *e, const char *name,
			  void (*cb)(void *ud, int err, struct te_segment *s), void *ud)
{
	struct te_open_waiter *w = calloc(1, sizeof(*w));
	struct te_segment *s;
	if (!w)
		return -ENOMEM;
	int rc = seg_get(e, name, &s);
	if (rc) {
		free(w);
		return rc;
	}
	w->cb = cb;
	w->ud = ud;
	pthread_mutex_lock(&s->mu);
	w->next = s->waiters;
	s->waiters = w;
	bool ready = s->state != TE_SEG_RESOLVING;
	pthread_mutex_unlock(&s->mu);
	if (ready)
		post_loop(s, &s->notify_job);
	return 0;
}

void te_close_segment(struct te_segment *s)
{
	if (s)
		seg_unref(s);
}

size_t te_segment_info(struct te_segment *s, struct te_segment_info *info,
		       struct te_region_info *regions, size_t max)
{
	pthread_mutex_lock(&s->mu);
	const struct te_desc *d = s->desc;
	size_t n = d ? d->nregions : 0;
	if (info) {
		info->name = s->name;
		info->transport = usable(s->shm) ? TE_PROTO_SHM
				  : s->remote    ? s->remote->ops->proto
						 : TE_PROTO_AUTO;
		info->nregions = n;
		info->generation = d ? d->generation : 0;
		info->rpc_addr[0] = '\0';
		if (d && d->rpc_port && d->host[0])
			snprintf(info->rpc_addr, sizeof(info->rpc_addr),
				 strchr(d->host, ':') ? "[%s]:%u" : "%s:%u", d->host,
				 (unsigned)d->rpc_port);
	}
	for (size_t i = 0; regions && i < n && i < max; i++) {
		regions[i].addr = d->regions[i].addr;
		regions[i].len = d->regions[i].len;
		regions[i].shm = d->regions[i].shm;
	}
	pthread_mutex_unlock(&s->mu);
	return n;
}

bool te__seg_broken_locked(struct te_segment *s)
{
	uint64_t now = mc_now_ms();
	if (s->e->stopped || now < s->refresh_after_ms)
		return false;
	s->refresh_after_ms = now + REFRESH_BACKOFF_MS;
	s->state = TE_SEG_REFRESHING;
	log_info("segment %s: every path is down; resolving it again", s->name);
	post_loop(s, &s->resolve_job);
	return true;
}

/* ------------------------------------------------------------ watch (loop) */

void te__segments_watch_event(struct te_engine *e, const char *name, const uint8_t *val,
			      size_t len, bool deleted)
{
	pthread_mutex_lock(&e->mu);
	struct te_segment *s = find_locked(e, name);
	if (s)
		seg_ref(s);
	pthread_mutex_unlock(&e->mu);
	if (!s)
		return;
	if (deleted) {
		pthread_mutex_lock(&s->mu);
		s->deleted = true;
		pthread_mutex_unlock(&s->mu);
		log_info("segment %s: descriptor deleted from meta", name);
		seg_unref(s);
		return;
	}
	struct te_desc *d;
	int rc = te__desc_decode(val, len, &d);
	if (rc) {
		log_warn("segment %s: ignoring an undecodable descriptor (%zu "
			 "bytes): %s",
			 name, len, mc_strerror(rc));
		seg_unref(s);
		return;
	}
	pthread_mutex_lock(&s->mu);
	const struct te_desc *cur = s->next_desc ? s->next_desc : s->desc;
	bool restarted = cur && d->incarnation != cur->incarnation;
	bool newer = !cur || restarted || d->generation > cur->generation;
	bool post = false;
	if (newer && s->state != TE_SEG_RESOLVING && s->state != TE_SEG_FAILED) {
		/* (cur may be next_desc: not read after this) */
		te__desc_free(s->next_desc);
		s->next_desc = d;
		d = NULL;
		post = true;
		if (restarted && s->state == TE_SEG_OPEN) {
			/* A restarted peer: park new requests until reconnected. */
			s->state = TE_SEG_REFRESHING;
			log_info("segment %s: restarted (incarnation %016llx); "
				 "reconnecting",
				 name, (unsigned long long)s->next_desc->incarnation);
		}
	}
	pthread_mutex_unlock(&s->mu);
	te__desc_free(d);
	if (post)
		post_setup(s, &s->connect_job);
	seg_unref(s);
}

/* ------------------------------------------------------------ teardown */

void te__segments_free_all(struct te_engine *e)
{
	pthread_mutex_lock(&e->mu);
	struct te_segment *s = e->segs;
	e->segs = NULL;
	pthread_mutex_unlock(&e->mu);
	while (s) {
		struct te_segment *next = s->next;
		pthread_mutex_lock(&s->mu);
		struct te_req_state *parked = s->parked;
		s->parked = NULL;
		s->parked_tail = &s->parked;
		s->in_cache = false;
		pthread_mutex_unlock(&s->mu);
		while (parked) {
			struct te_req_state *rs = parked;
			parked = rs->park_next;
			te__req_fail(rs->batch, rs, MC_ESHUTDOWN);
		}
		seg_free(s); /* users must have closed theirs */
		s = next;
	}
}
