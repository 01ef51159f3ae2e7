/*
 * rdma_transport: the transfer engine's rdma transport, on the RDMA layer
 * of rdma.h (devices, MRs, RC queue pairs, completion thread).
 *
 * Regions. Every registered region gets an MR on every selected NIC,
 * covering exactly the region's memory and nothing else; its rkeys and
 * the address the MRs start at (rdma_addr) go into the segment
 * descriptor. The MRs are what keeps a peer inside the region: an access
 * outside it, or through an rkey that was deregistered, ends with a remote
 * access error on the peer's side and touches nothing. Pinning a large
 * region takes a while, so te_register on the loop's thread hands it to
 * the setup thread and returns: the region is reachable over tcp (and
 * shm) at once and over rdma once its rkeys are published; an MR that
 * cannot be made (ulimit -l, max_mr) is logged and leaves it tcp-only.
 * On any other thread the registration is synchronous and its errors are
 * te_register's. Unregistering removes the MRs from the lookup table,
 * waits until no slice of ours uses them as local buffers, deregisters.
 *
 * Peers. Opening a segment opens an authenticated control connection to
 * the peer's data port (te__ctrl_open) and keeps it: over it the QP
 * endpoints (QPN, PSN, GID/LID, MTU) are exchanged (CONNECT/ACCEPT,
 * te_int.h), and the serving side keeps the QPs it made for us until that
 * connection closes. A peer has max(local, remote NICs) RC QPs, QP k on
 * local NIC k % local and remote NIC k % remote: the paths its slices are
 * striped over. A tcp peer to the same segment is the fallback.
 *
 * Slices. bind finds the remote range in the descriptor (a snapshot of
 * its rkeys, shared by the requests bound while it is current); a range
 * the descriptor has no rkeys for goes over tcp, where the serving side
 * decides. A slice whose local buffer is inside a region registered here
 * is queued on its QP and posted as a one-sided RDMA READ or WRITE by the
 * QP's data worker (or by the completion thread when completions made
 * room), up to 64 WRs per post, signaled every K (rdma.h); any other
 * slice goes over tcp. Completions come back on the completion thread:
 * success and remote access errors (MC_EREMOTE_ACCESS) are final; any
 * other error (flush, retry exceeded, local protection) resubmits the
 * slice on another healthy QP, else over tcp, before its request fails.
 * A QP error retires the connection's QPs and sets up new ones on the
 * setup thread (slices meanwhile go over tcp); when that fails the peer
 * is closed, so the segment is resolved and reconnected.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/endian.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/util.h"
#include "transfer/te_int.h"

#define LOG_SUBSYS LOGS_RDMA

/* This transport's ops (at the end of the file), registered in engine.c. */
extern const struct te_xport_ops te__rdma_ops;

#define POST_MAX 64                  /* WRs per te_rdma_post */
#define MAX_TRIES (TE_MAX_PATHS + 8) /* resubmissions of one slice */
#define CTRL_TIMEOUT_MS TE_CONNECT_TIMEOUT_MS
/* Completion queue entries per device. Every QP reserves its send queue
 * depth + 1 of them (rdma.h), so this bounds the QPs per device, to peers
 * opened and peers served together: 65536 / 257 = 255 (4 MiB of CQEs on
 * a NIC). */
#define CQ_DEPTH 65536

/* ------------------------------------------------------------ control messages (pure) */

size_t te__rdma_msg_encode(const struct te_rdma_msg *m, uint8_t out[TE_RDMA_MSG_MAX])
{
	unsigned n = MC_MIN(m->n, (unsigned)TE_RDMA_MAX_NICS);
	memset(out, 0, TE_RDMA_MSG_HDR);
	mc_put_le32(out, TE_RDMA_MSG_MAGIC);
	out[4] = 1;
	out[5] = m->kind;
	out[6] = m->nics;
	out[7] = (uint8_t)n;
	mc_put_le64(out + 8, m->incarnation);
	for (unsigned k = 0; k < n; k++)
		te_rdma_ep_encode(&m->eps[k],
				  out + TE_RDMA_MSG_HDR + k * TE_RDMA_EP_WIRE_BYTES);
	return TE_RDMA_MSG_HDR + (size_t)n * TE_RDMA_EP_WIRE_BYTES;
}

int te__rdma_msg_decode(const uint8_t *in, size_t len, struct te_rdma_msg *m)
{
	if (len < TE_RDMA_MSG_HDR || mc_get_le32(in) != TE_RDMA_MSG_MAGIC || in[4] != 1 ||
	    (in[5] != TE_RDMA_CONNECT && in[5] != TE_RDMA_ACCEPT))
		return MC_EPROTOCOL;
	unsigned nics = in[6], n = in[7];
	if (nics < 1 || nics > TE_RDMA_MAX_NICS || n < nics || n > TE_RDMA_MAX_NICS ||
	    len != TE_RDMA_MSG_HDR + (size_t)n * TE_RDMA_EP_WIRE_BYTES)
		return MC_EPROTOCOL;
	memset(m, 0, sizeof(*m));
	m->kind = in[5];
	m->nics = (uint8_t)nics;
	m->n = (uint8_t)n;
	m->incarnation = mc_get_le64(in + 8);
	for (unsigned k = 0; k < n; k++) {
		struct te_rdma_ep *ep = &m->eps[k];
		if (te_rdma_ep_decode(in + TE_RDMA_MSG_HDR + k * TE_RDMA_EP_WIRE_BYTES,
				      TE_RDMA_EP_WIRE_BYTES, ep) != 0 ||
		    ep->nic != k % nics)
			return MC_EPROTOCOL;
	}
	return 0;
}

/* ------------------------------------------------------------ types */

struct rdma_xport;

/* A local region's MRs. */
struct lmr {
	struct rdma_xport *x;
	struct te_region *r;
	uint8_t *base;
	size_t len;
	struct te_rdma_mr *mr; /* NULL until registered (written under mr_lk) */
	bool device;           /* a dma-buf: base is its address in the
				     * process that owns it, never ours */
	atomic_uint inflight;  /* slices using its lkeys */
	bool pending;          /* registration queued (under x->mu) */
	bool dying;            /* being unregistered (under x->mu) */
	struct te_job job;
};

/* Serving side: the QPs one initiator's control connection set up. */
struct rsrv {
	struct rdma_xport *x;
	struct te_rdma_conn *c;
	struct rsrv *next, **pprev;
	char peer[TE_NAME_MAX + 1];
};

struct rdma_xport {
	struct te_engine *e;
	struct te_rdma *r;
	unsigned nnics;
	pthread_rwlock_t mr_lk; /* the MR table */
	struct lmr **mrs;       /* sorted by base (local ranges may overlap) */
	size_t nmrs, capmrs, maxlen;
	pthread_mutex_t mu; /* pending, dying, the served list */
	pthread_cond_t cv;
	struct rsrv *srv;
	atomic_uint rr; /* QPs' data workers, round robin */
	struct metric *m_nic[TE_RDMA_MAX_NICS][2];
	struct metric *m_qp_errors, *m_reconnects, *m_fallback;
};

/* A descriptor's regions that have rkeys, as bind sees them; requests
 * bound while it was current hold a reference. */
struct rsnap;
struct rsreg {
	uint64_t addr, len; /* the address peers use */
	uint64_t base;      /* rdma_addr: what WRs target */
	uint32_t rkeys[TE_RDMA_MAX_NICS];
	struct rsnap *snap;
};

struct rsnap {
	atomic_int refs;
	uint64_t incarnation, generation;
	size_t n;
	struct rsreg v[];
};

struct rconn;

/* One QP of a connection and the slices waiting for its send queue. */
struct rq {
	struct rconn *c;
	unsigned k;
	struct te_worker *w; /* posts what is queued */
	pthread_mutex_t mu;
	struct te_slice *head, **tail;
	bool dead;          /* failed or retired: takes nothing */
	atomic_bool kicked; /* a post task is queued */
	struct te_task kick;
};

/* The QPs to a peer (replaced as a whole on reconnect). */
struct rconn {
	struct rpeer *p;
	struct te_rdma_conn *c;
	atomic_int refs; /* the peer's + one per queued post task */
	unsigned n;
	atomic_uint healthy; /* bit per QP */
	struct rq q[TE_RDMA_MAX_NICS];
};

struct rpeer {
	struct te_peer base;
	struct rdma_xport *x;
	struct te_peer *tcp; /* fallback to the same segment, or NULL */
	unsigned peer_nics;
	pthread_mutex_t setup_mu; /* ctrl_fd; connecting and retiring */
	int ctrl_fd;
	struct te_desc *d; /* the descriptor it was connected with */
	pthread_rwlock_t lk;
	struct rconn *cur;  /* under lk; NULL while reconnecting */
	struct rsnap *snap; /* under the segment's mu (bind) */
	struct te_job reconnect_job;
	atomic_bool reconnect_queued;
};

static void rdma_submit(struct te_peer *bp, struct te_slice *s);

/* ------------------------------------------------------------ local MRs */

/* Index of the first MR whose base is above a. Under mr_lk. */
static size_t mr_upper(const struct rdma_xport *x, uintptr_t a)
{
	size_t lo = 0, hi = x->nmrs;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if ((uintptr_t)x->mrs[mid]->base <= a)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static int mr_insert(struct rdma_xport *x, struct lmr *m)
{
	int rc = 0;
	pthread_rwlock_wrlock(&x->mr_lk);
	if (x->nmrs == x->capmrs) {
		size_t cap = x->capmrs ? x->capmrs * 2 : 16;
		struct lmr **v = realloc(x->mrs, cap * sizeof(*v));
		if (!v) {
			rc = -ENOMEM;
			goto out;
		}
		x->mrs = v;
		x->capmrs = cap;
	}
	size_t i = mr_upper(x, (uintptr_t)m->base);
	memmove(&x->mrs[i + 1], &x->mrs[i], (x->nmrs - i) * sizeof(*x->mrs));
	x->mrs[i] = m;
	x->nmrs++;
	x->maxlen = MC_MAX(x->maxlen, m->len);
out:
	pthread_rwlock_unlock(&x->mr_lk);
	return rc;
}

static void mr_remove(struct rdma_xport *x, struct lmr *m)
{
	pthread_rwlock_wrlock(&x->mr_lk);
	for (size_t i = 0; i < x->nmrs; i++) {
		if (x->mrs[i] == m) {
			memmove(&x->mrs[i], &x->mrs[i + 1],
				(x->nmrs - i - 1) * sizeof(*x->mrs));
			x->nmrs--;
			break;
		}
	}
	pthread_rwlock_unlock(&x->mr_lk);
}

/* The registered MR holding [p, p + len) — of a dma-buf when device
 * (p an address in its owner's process), else of this process's memory
 * — counted in use; NULL if none. */
static struct lmr *lmr_get(struct rdma_xport *x, const uint8_t *p, size_t len, bool device)
{
	struct lmr *found = NULL;
	uintptr_t a = (uintptr_t)p;
	pthread_rwlock_rdlock(&x->mr_lk);
	for (size_t i = mr_upper(x, a); i-- > 0;) {
		struct lmr *m = x->mrs[i];
		uintptr_t off = a - (uintptr_t)m->base;
		if (off >= x->maxlen)
			break; /* every earlier one starts further below */
		if (m->mr && m->device == device && off < m->len && len <= m->len - off) {
			atomic_fetch_add(&m->inflight, 1);
			found = m;
			break;
		}
	}
	pthread_rwlock_unlock(&x->mr_lk);
	return found;
}

static void lmr_put(struct rdma_xport *x, struct lmr *m)
{
	if (m && atomic_fetch_sub(&m->inflight, 1) == 1) {
		pthread_mutex_lock(&x->mu);
		if (m->dying)
			pthread_cond_broadcast(&x->cv);
		pthread_mutex_unlock(&x->mu);
	}
}

/* Pin the region on every NIC and put its rkeys where the descriptor is
 * built from. Errors: te_rdma_reg's (logged with the limit and the fix). */
static int lmr_register(struct rdma_xport *x, struct lmr *m)
{
	char why[512];
	struct te_rdma_mr *mr;
	int rc = m->device ? te_rdma_reg_dmabuf(x->r, m->r->dmabuf, m->r->dmabuf_off, m->len,
						m->r->addr, &mr, why, sizeof(why))
			   : te_rdma_reg(x->r, m->base, m->len, true, &mr, why, sizeof(why));
	if (rc) {
		log_error("cannot register region 0x%llx+%zu for RDMA: %s",
			  (unsigned long long)m->r->addr, m->len,
			  why[0] ? why : mc_strerror(rc));
		return rc;
	}
	struct te_rtable *t = &x->e->regions;
	pthread_rwlock_wrlock(&t->lock);
	m->r->nrkeys = x->nnics;
	for (unsigned i = 0; i < x->nnics; i++)
		m->r->rkeys[i] = te_rdma_mr_rkey(mr, i);
	pthread_rwlock_unlock(&t->lock);
	pthread_rwlock_wrlock(&x->mr_lk);
	m->mr = mr;
	pthread_rwlock_unlock(&x->mr_lk);
	return 0;
}

/* Setup thread: the registration of a region added on the loop thread. */
static void on_reg_job(struct te_job *j)
{
	struct lmr *m = MC_CONTAINER_OF(j, struct lmr, job);
	struct rdma_xport *x = m->x;
	int rc = x->e->stopped ? MC_ESHUTDOWN : lmr_register(x, m);
	if (rc && rc != MC_ESHUTDOWN)
		log_warn("region 0x%llx+%zu stays reachable over tcp only",
			 (unsigned long long)m->r->addr, m->len);
	pthread_mutex_lock(&x->mu);
	m->pending = false;
	pthread_cond_broadcast(&x->cv);
	pthread_mutex_unlock(&x->mu);
	if (rc == 0)
		te__desc_changed(x->e); /* now with its rkeys */
}

static int rdma_region_add(struct te_xport *xp, struct te_region *r)
{
	struct rdma_xport *x = (struct rdma_xport *)xp;
	bool device = r->dmabuf >= 0;
	if (!r->local && !device)
		return 0; /* another process's memory: no MR, peers use tcp */
	struct lmr *m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->x = x;
	m->r = r;
	m->base = device ? (uint8_t *)(uintptr_t)r->addr : r->local;
	m->len = r->len;
	m->device = device;
	m->job.fn = on_reg_job;
	int rc = mr_insert(x, m);
	if (rc) {
		free(m);
		return rc;
	}
	r->xp[TE_PROTO_RDMA] = m;
	/* A dma-buf is registered at once: without its MR nothing can
	 * reach it, so a failure must fail the registration. */
	if (!device && pthread_equal(pthread_self(), x->e->loop_tid)) {
		/* The loop must not wait for the kernel to pin it. */
		m->pending = true;
		if (te__setup_post(x->e, &m->job))
			return 0;
		m->pending = false; /* te_free stopped the setup thread */
	}
	rc = lmr_register(x, m);
	if (rc) {
		mr_remove(x, m);
		r->xp[TE_PROTO_RDMA] = NULL;
		free(m);
	}
	return rc;
}

static void rdma_region_del(struct te_xport *xp, struct te_region *r)
{
	struct rdma_xport *x = (struct rdma_xport *)xp;
	struct lmr *m = r->xp[TE_PROTO_RDMA];
	if (!m)
		return;
	pthread_mutex_lock(&x->mu);
	while (m->pending)
		pthread_cond_wait(&x->cv, &x->mu);
	m->dying = true;
	pthread_mutex_unlock(&x->mu);
	mr_remove(x, m); /* no new slice takes it */
	pthread_mutex_lock(&x->mu);
	while (atomic_load(&m->inflight) > 0)
		pthread_cond_wait(&x->cv, &x->mu);
	pthread_mutex_unlock(&x->mu);
	if (m->mr)
		te_rdma_dereg(m->mr); /* from now on peers' accesses fail */
	r->xp[TE_PROTO_RDMA] = NULL;
	free(m);
}

/* ------------------------------------------------------------ serving side */

static int rdma_on_ctrl(struct te_xport *xp, const char *peer, void **conn, const uint8_t *in,
			size_t inlen, uint8_t *out, size_t *outlen)
{
	struct rdma_xport *x = (struct rdma_xport *)xp;
	struct te_rdma_msg req, rep;
	struct te_rdma_conn *c;
	char why[256] = "";
	int rc = te__rdma_msg_decode(in, inlen, &req);
	if (rc || req.kind != TE_RDMA_CONNECT) {
		log_warn("segment %s: bad rdma connect message (%zu bytes)", peer, inlen);
		return MC_EPROTOCOL;
	}
	if (*outlen < TE_RDMA_MSG_MAX)
		return -EOVERFLOW;
	rc = te_rdma_conn_new(x->r, req.nics, NULL, &c, why, sizeof(why));
	if (rc) {
		log_warn("segment %s: cannot create its RDMA queue pairs: %s", peer,
			 why[0] ? why : mc_strerror(rc));
		return rc;
	}
	unsigned n = te_rdma_conn_qps(c);
	if (n != req.n) {
		log_warn("segment %s: asks for %u queue pairs, %u NICs here and %u there "
			 "make %u",
			 peer, req.n, x->nnics, req.nics, n);
		rc = MC_EPROTOCOL;
		goto fail_conn;
	}
	rc = te_rdma_conn_connect(c, req.eps, n);
	if (rc) {
		log_warn("segment %s: cannot connect its RDMA queue pairs: %s", peer,
			 mc_strerror(rc));
		goto fail_conn;
	}
	memset(&rep, 0, sizeof(rep));
	rep.kind = TE_RDMA_ACCEPT;
	rep.nics = (uint8_t)x->nnics;
	rep.n = (uint8_t)n;
	rep.incarnation = x->e->incarnation;
	if (te_rdma_conn_eps(c, rep.eps, TE_RDMA_MAX_NICS) != (int)n) {
		rc = -EIO;
		goto fail_conn;
	}
	struct rsrv *sv = *conn;
	if (!sv) {
		sv = calloc(1, sizeof(*sv));
		if (!sv) {
			rc = -ENOMEM;
			goto fail_conn;
		}
		sv->x = x;
		snprintf(sv->peer, sizeof(sv->peer), "%s", peer);
		pthread_mutex_lock(&x->mu);
		sv->next = x->srv;
		if (x->srv)
			x->srv->pprev = &sv->next;
		sv->pprev = &x->srv;
		x->srv = sv;
		pthread_mutex_unlock(&x->mu);
		*conn = sv;
	} else if (sv->c) {
		/* The peer reconnects: it retired the old QPs first. */
		te_rdma_conn_free(sv->c);
	}
	sv->c = c;
	*outlen = te__rdma_msg_encode(&rep, out);
	log_debug("segment %s: %u RDMA queue pairs connected", peer, n);
	return 0;
fail_conn:
	te_rdma_conn_free(c);
	return rc;
}

static void srv_free(struct rsrv *sv)
{
	if (sv->c)
		te_rdma_conn_free(sv->c);
	free(sv);
}

static void rdma_ctrl_closed(struct te_xport *xp, void *conn)
{
	struct rdma_xport *x = (struct rdma_xport *)xp;
	struct rsrv *sv = conn;
	pthread_mutex_lock(&x->mu);
	*sv->pprev = sv->next;
	if (sv->next)
		sv->next->pprev = sv->pprev;
	pthread_mutex_unlock(&x->mu);
	log_debug("segment %s: control connection closed; its queue pairs are gone", sv->peer);
	srv_free(sv);
}

/* ------------------------------------------------------------ descriptor snapshots */

static void snap_unref(struct rsnap *sn)
{
	if (sn && atomic_fetch_sub(&sn->refs, 1) == 1)
		free(sn);
}

static bool region_usable(const struct te_desc_region *r, unsigned peer_nics)
{
	return r->rdma_addr && r->nrkeys >= peer_nics;
}

static struct rsnap *snap_build(const struct te_desc *d, unsigned peer_nics)
{
	size_t n = 0;
	for (size_t i = 0; i < d->nregions; i++)
		n += region_usable(&d->regions[i], peer_nics);
	struct rsnap *sn = malloc(sizeof(*sn) + n * sizeof(sn->v[0]));
	if (!sn)
		return NULL;
	atomic_init(&sn->refs, 1);
	sn->incarnation = d->incarnation;
	sn->generation = d->generation;
	sn->n = n;
	n = 0;
	for (size_t i = 0; i < d->nregions; i++) {
		const struct te_desc_region *r = &d->regions[i];
		if (!region_usable(r, peer_nics))
			continue;
		struct rsreg *g = &sn->v[n++];
		memset(g, 0, sizeof(*g));
		g->addr = r->addr;
		g->len = r->len;
		g->base = r->rdma_addr;
		memcpy(g->rkeys, r->rkeys, peer_nics * sizeof(uint32_t));
		g->snap = sn;
	}
	return sn;
}

/* Called with the segment's mu held (route_locked). */
static int rdma_bind(struct te_peer *bp, uint64_t addr, uint64_t len, void **route)
{
	struct rpeer *p = (struct rpeer *)bp;
	const struct te_desc *d = bp->seg->desc;
	*route = NULL;
	if (d && (!p->snap || p->snap->incarnation != d->incarnation ||
		  p->snap->generation != d->generation)) {
		struct rsnap *sn = snap_build(d, p->peer_nics);
		if (sn) {
			snap_unref(p->snap);
			p->snap = sn;
		}
	}
	if (p->snap) {
		long i = te__range_find(p->snap->v, p->snap->n, sizeof(struct rsreg),
					offsetof(struct rsreg, addr),
					offsetof(struct rsreg, len), addr, len);
		if (i >= 0) {
			atomic_fetch_add(&p->snap->refs, 1);
			*route = &p->snap->v[i];
			return 0;
		}
	}
	/* No rkeys for that range in the descriptor (not registered, not yet
	 * known here, or outside every region): the serving side decides,
	 * over tcp. */
	return p->tcp ? 0 : MC_EREMOTE_ACCESS;
}

static void rdma_unbind(struct te_peer *bp, void *route)
{
	(void)bp;
	if (route)
		snap_unref(((struct rsreg *)route)->snap);
}

/* ------------------------------------------------------------ posting */

static void rconn_unref(struct rconn *rc)
{
	if (atomic_fetch_sub(&rc->refs, 1) != 1)
		return;
	for (unsigned k = 0; k < rc->n; k++)
		pthread_mutex_destroy(&rc->q[k].mu);
	free(rc);
}

/* The slice goes over tcp, or fails when there is no tcp path either (or
 * its local memory is device memory, which no CPU copies). */
static void to_tcp(struct rpeer *p, struct te_slice *s)
{
	struct te_peer *t = p->tcp;
	if (s->device) {
		te__slice_done(s, p->x->e->stopped ? MC_ESHUTDOWN : MC_EUNAVAILABLE, false);
		return;
	}
	if (!t || atomic_load(&t->closed)) {
		te__slice_done(s, p->x->e->stopped ? MC_ESHUTDOWN : MC_EUNAVAILABLE, false);
		return;
	}
	metric_inc(p->x->m_fallback);
	t->ops->submit(t, s);
}

/* Slices taken off a dead QP k (or a retired connection: k < 0) go
 * elsewhere. */
static void resubmit_list(struct rpeer *p, struct te_slice *s, int k)
{
	while (s) {
		struct te_slice *next = s->next;
		s->next = NULL;
		lmr_put(p->x, s->xp);
		s->xp = NULL;
		if (k >= 0)
			s->excluded |= 1u << k;
		rdma_submit(&p->base, s);
		s = next;
	}
}

/* Post what waits on QP q while its send queue has room. Any thread (the
 * QP's worker, the completion thread). */
static void rq_drain(struct rq *q)
{
	struct rconn *rc = q->c;
	struct rpeer *p = rc->p;
	struct te_rdma_wr wrs[POST_MAX];
	struct te_slice *failed = NULL;
	pthread_mutex_lock(&q->mu);
	while (!q->dead && q->head) { /* dead: rc->c may be gone */
		unsigned nic = te_rdma_conn_nic(rc->c, q->k);
		unsigned room = MC_MIN(te_rdma_conn_sq_free(rc->c, q->k), (unsigned)POST_MAX);
		unsigned n = 0;
		struct te_slice *s = q->head, *last = NULL;
		for (; s && n < room; last = s, s = s->next) {
			const struct rsreg *g = s->route;
			const struct lmr *m = s->xp;
			wrs[n++] = (struct te_rdma_wr){
				.op = s->op == TE_WRITE ? TE_RDMA_WRITE : TE_RDMA_READ,
				.local = s->local,
				.lkey = te_rdma_mr_lkey(m->mr, nic),
				.remote = g->base + (s->remote - g->addr),
				.rkey = g->rkeys[q->k % p->peer_nics],
				.len = s->len,
				.cookie = (uint64_t)(uintptr_t)s,
			};
		}
		if (n == 0)
			break; /* full: completions make room and drain again */
		/* Off the queue before they can complete. */
		struct te_slice *batch = q->head;
		q->head = s;
		if (!s)
			q->tail = &q->head;
		last->next = NULL;
		int rc2 = te_rdma_post(rc->c, q->k, wrs, n);
		if (rc2 == 0)
			continue;
		if (rc2 == -EAGAIN) { /* not expected: the room was counted */
			last->next = q->head;
			q->head = batch;
			if (!last->next)
				q->tail = &last->next;
			break;
		}
		/* The QP is in error: nothing of this call was posted. */
		q->dead = true;
		last->next = q->head;
		failed = batch;
		q->head = NULL;
		q->tail = &q->head;
	}
	pthread_mutex_unlock(&q->mu);
	if (failed) {
		atomic_fetch_and(&rc->healthy, ~(1u << q->k));
		resubmit_list(p, failed, (int)q->k);
	}
}

static void kick_task(struct te_task *t)
{
	struct rq *q = MC_CONTAINER_OF(t, struct rq, kick);
	struct rconn *rc = q->c;
	atomic_store(&q->kicked, false); /* a later add kicks again */
	rq_drain(q);
	rconn_unref(rc);
}

/* Queue s on QP q and have its worker post it. False when q is dead. */
static bool rq_add(struct rq *q, struct te_slice *s)
{
	pthread_mutex_lock(&q->mu);
	if (q->dead) {
		pthread_mutex_unlock(&q->mu);
		return false;
	}
	s->next = NULL;
	s->path = (uint16_t)q->k;
	*q->tail = s;
	q->tail = &s->next;
	pthread_mutex_unlock(&q->mu);
	if (!atomic_exchange(&q->kicked, true)) {
		atomic_fetch_add(&q->c->refs, 1);
		te__worker_post(q->w, &q->kick);
	}
	return true;
}

/* The batch layer's path is the QP to start from; a QP that failed, or
 * failed this slice, is skipped; without one the slice goes over tcp. */
static void rdma_submit(struct te_peer *bp, struct te_slice *s)
{
	struct rpeer *p = (struct rpeer *)bp;
	struct rdma_xport *x = p->x;
	int doomed = te__slice_doomed(s);
	if (doomed) {
		te__slice_done(s, doomed, false);
		return;
	}
	if (atomic_load(&bp->closed) || s->tries > MAX_TRIES) {
		te__slice_done(s, x->e->stopped ? MC_ESHUTDOWN : MC_EUNAVAILABLE, false);
		return;
	}
	struct lmr *m = s->route ? lmr_get(x, s->local, s->len, s->device) : NULL;
	if (!m && s->device) {
		/* Not inside a dma-buf this engine registered. */
		te__slice_done(s, -EOPNOTSUPP, false);
		return;
	}
	if (m) {
		bool queued = false;
		s->xp = m;
		pthread_rwlock_rdlock(&p->lk);
		struct rconn *rc = p->cur;
		for (unsigned j = 0; rc && j < rc->n && !queued; j++) {
			unsigned k = (s->path + j) % rc->n;
			if ((atomic_load(&rc->healthy) >> k & 1) && !(s->excluded >> k & 1))
				queued = rq_add(&rc->q[k], s);
		}
		pthread_rwlock_unlock(&p->lk);
		if (queued)
			return;
		s->xp = NULL;
		lmr_put(x, m);
	}
	to_tcp(p, s);
}

/* ------------------------------------------------------------ completions */

static void schedule_reconnect(struct rpeer *p);

static void on_complete(void *arg, uint64_t cookie, int status)
{
	struct rconn *rc = arg;
	if (!rc)
		return; /* served QPs post nothing */
	struct te_slice *s = (struct te_slice *)(uintptr_t)cookie;
	struct rpeer *p = rc->p;
	struct rdma_xport *x = p->x;
	unsigned k = s->path;
	lmr_put(x, s->xp);
	s->xp = NULL;
	if (status == 0) {
		metric_add(x->m_nic[te_rdma_conn_nic(rc->c, k)][te__op_idx(s->op)], s->len);
		te__slice_done(s, 0, false);
	} else if (status == -EACCES || status == -EINVAL) {
		/* The peer's NIC refused the range or the rkey (a region
		 * unregistered since this descriptor): final, nothing moved. */
		log_debug("segment %s: %s of %u bytes at 0x%llx refused by the peer's NIC",
			  p->base.name, s->op == TE_WRITE ? "write" : "read", s->len,
			  (unsigned long long)s->remote);
		te__slice_done(s, status == -EACCES ? MC_EREMOTE_ACCESS : -EINVAL, false);
	} else {
		/* Flushed, retry exceeded, local error: another QP or tcp. */
		s->excluded |= 1u << k;
		s->tries++;
		metric_inc(x->e->m_retries);
		log_debug("segment %s: slice of %u bytes at 0x%llx failed on QP %u (%s); "
			  "resubmitting it",
			  p->base.name, s->len, (unsigned long long)s->remote, k,
			  mc_strerror(status));
		rdma_submit(&p->base, s);
	}
	rq_drain(&rc->q[k]);
}

/* Mark QP q dead; returns the slices that waited on it. */
static struct te_slice *rq_take_all(struct rq *q)
{
	pthread_mutex_lock(&q->mu);
	q->dead = true;
	struct te_slice *back = q->head;
	q->head = NULL;
	q->tail = &q->head;
	pthread_mutex_unlock(&q->mu);
	return back;
}

static void on_qp_error(void *arg, unsigned k, int status)
{
	struct rconn *rc = arg;
	if (!rc)
		return;
	struct rpeer *p = rc->p;
	metric_inc(p->x->m_qp_errors);
	atomic_fetch_and(&rc->healthy, ~(1u << k));
	resubmit_list(p, rq_take_all(&rc->q[k]), (int)k);
	pthread_rwlock_rdlock(&p->lk);
	bool current = p->cur == rc;
	pthread_rwlock_unlock(&p->lk);
	if (current && !atomic_load(&p->base.closed)) {
		log_warn("segment %s: RDMA queue pair %u failed (%s); reconnecting",
			 p->base.name, k, mc_strerror(status));
		schedule_reconnect(p);
	}
}

/* ------------------------------------------------------------ connections */

/* Create the QPs, swap endpoints over the control connection, connect
 * them. Setup thread, under p->setup_mu. */
static int rconn_new(struct rpeer *p, struct rconn **out, char *why, size_t why_len)
{
	struct rdma_xport *x = p->x;
	struct te_engine *e = x->e;
	struct te_rdma_msg req, rep;
	uint8_t buf[TE_RDMA_MSG_MAX], ans[TE_RDMA_MSG_MAX];
	struct rconn *rc = calloc(1, sizeof(*rc));
	if (!rc)
		return -ENOMEM;
	rc->p = p;
	atomic_init(&rc->refs, 1);
	int err = te_rdma_conn_new(x->r, p->peer_nics, rc, &rc->c, why, why_len);
	if (err)
		goto fail_free;
	rc->n = te_rdma_conn_qps(rc->c);
	memset(&req, 0, sizeof(req));
	req.kind = TE_RDMA_CONNECT;
	req.nics = (uint8_t)x->nnics;
	req.n = (uint8_t)rc->n;
	req.incarnation = e->incarnation;
	if (te_rdma_conn_eps(rc->c, req.eps, TE_RDMA_MAX_NICS) != (int)rc->n) {
		err = -EIO;
		goto fail_conn;
	}
	size_t len = te__rdma_msg_encode(&req, buf), alen = sizeof(ans);
	err = te__ctrl_xchg(p->ctrl_fd, TE_PROTO_RDMA, buf, len, ans, &alen, CTRL_TIMEOUT_MS);
	if (err) {
		bool theirs = err != MC_EUNAVAILABLE && err != MC_ETIMEDOUT &&
			      err != MC_EPROTOCOL && err != -EOVERFLOW;
		snprintf(why, why_len, "%s: %s",
			 theirs ? "the peer could not set up its queue pairs (its log says "
				  "why)"
				: "queue pair endpoint exchange",
			 mc_strerror(err));
		goto fail_conn;
	}
	err = te__rdma_msg_decode(ans, alen, &rep);
	if (err == 0 &&
	    (rep.kind != TE_RDMA_ACCEPT || rep.n != rc->n || rep.nics != p->peer_nics))
		err = MC_EPROTOCOL;
	if (err) {
		snprintf(why, why_len, "the peer's endpoints do not match (%u queue pairs)",
			 rc->n);
		goto fail_conn;
	}
	err = te_rdma_conn_connect(rc->c, rep.eps, rc->n);
	if (err) {
		snprintf(why, why_len, "queue pairs to RTR/RTS: %s", mc_strerror(err));
		goto fail_conn;
	}
	for (unsigned k = 0; k < rc->n; k++) {
		struct rq *q = &rc->q[k];
		q->c = rc;
		q->k = k;
		q->w = &e->workers[atomic_fetch_add(&x->rr, 1) % e->nworkers];
		pthread_mutex_init(&q->mu, NULL);
		q->tail = &q->head;
		q->kick.run = kick_task;
	}
	atomic_init(&rc->healthy, (1u << rc->n) - 1);
	*out = rc;
	return 0;
fail_conn:
	te_rdma_conn_free(rc->c);
fail_free:
	free(rc);
	return err;
}

/* Stop using rc (it is no longer p->cur): its queued slices go elsewhere,
 * what is posted is flushed (and resubmitted by on_complete), then it is
 * destroyed. Not from a callback. */
static void rconn_retire(struct rconn *rc)
{
	atomic_store(&rc->healthy, 0);
	for (unsigned k = 0; k < rc->n; k++)
		resubmit_list(rc->p, rq_take_all(&rc->q[k]), -1);
	te_rdma_conn_free(rc->c);
	rconn_unref(rc);
}

static void mark_closed(struct rpeer *p, const char *why)
{
	atomic_store(&p->base.alive, 0);
	if (!atomic_exchange(&p->base.closed, true))
		log_warn("segment %s: rdma path closed: %s", p->base.name, why);
}

/* Setup thread: new QPs for a peer whose QP failed. */
static void on_reconnect(struct te_job *j)
{
	struct rpeer *p = MC_CONTAINER_OF(j, struct rpeer, reconnect_job);
	struct rdma_xport *x = p->x;
	struct te_engine *e = x->e;
	char why[256] = "";
	atomic_store(&p->reconnect_queued, false);
	pthread_mutex_lock(&p->setup_mu);
	if (atomic_load(&p->base.closed) || e->stopped)
		goto out;
	pthread_rwlock_wrlock(&p->lk);
	struct rconn *old = p->cur, *rc = NULL;
	p->cur = NULL; /* slices go over tcp meanwhile */
	pthread_rwlock_unlock(&p->lk);
	if (old)
		rconn_retire(old);
	metric_inc(x->m_reconnects);
	int err = p->ctrl_fd >= 0 ? rconn_new(p, &rc, why, sizeof(why)) : MC_EUNAVAILABLE;
	if (err && err != -ENOMEM && !atomic_load(&p->base.closed)) {
		/* The control connection may be what broke: once more on a
		 * new one. */
		if (p->ctrl_fd >= 0)
			close(p->ctrl_fd);
		p->ctrl_fd = te__ctrl_open(e, p->d, CTRL_TIMEOUT_MS);
		why[0] = '\0';
		err = p->ctrl_fd >= 0 ? rconn_new(p, &rc, why, sizeof(why)) : p->ctrl_fd;
	}
	if (err) {
		char msg[320];
		snprintf(msg, sizeof(msg), "cannot reconnect its queue pairs (%s)",
			 why[0] ? why : mc_strerror(err));
		mark_closed(p, msg);
		goto out;
	}
	pthread_rwlock_wrlock(&p->lk);
	p->cur = rc;
	pthread_rwlock_unlock(&p->lk);
	log_info("segment %s: %u RDMA queue pairs reconnected", p->base.name, rc->n);
out:
	pthread_mutex_unlock(&p->setup_mu);
	te__peer_unref(&p->base); /* the job's */
}

static void schedule_reconnect(struct rpeer *p)
{
	if (atomic_exchange(&p->reconnect_queued, true))
		return;
	te__peer_ref(&p->base);
	if (!te__setup_post(p->x->e, &p->reconnect_job)) {
		atomic_store(&p->reconnect_queued, false);
		te__peer_unref(&p->base);
	}
}

static void peer_destroy(struct rpeer *p)
{
	if (p->tcp)
		te__peer_unref(p->tcp);
	snap_unref(p->snap);
	te__desc_free(p->d);
	if (p->ctrl_fd >= 0)
		close(p->ctrl_fd);
	pthread_rwlock_destroy(&p->lk);
	pthread_mutex_destroy(&p->setup_mu);
	free(p);
}

static void rdma_peer_free(struct te_peer *bp)
{
	struct rpeer *p = (struct rpeer *)bp;
	if (p->cur)
		log_error("segment %s: rdma peer freed while connected", bp->name);
	metric_sub(p->x->e->m_peers[TE_PROTO_RDMA], 1);
	peer_destroy(p);
}

static void rdma_disconnect(struct te_peer *bp)
{
	struct rpeer *p = (struct rpeer *)bp;
	atomic_store(&bp->closed, true);
	pthread_mutex_lock(&p->setup_mu);
	pthread_rwlock_wrlock(&p->lk);
	struct rconn *rc = p->cur;
	p->cur = NULL;
	pthread_rwlock_unlock(&p->lk);
	if (rc)
		rconn_retire(rc); /* flushed slices fail: the peer is closed */
	if (p->ctrl_fd >= 0) {
		close(p->ctrl_fd); /* the serving side lets go of its QPs */
		p->ctrl_fd = -1;
	}
	pthread_mutex_unlock(&p->setup_mu);
	if (p->tcp)
		p->tcp->ops->disconnect(p->tcp);
}

static int rdma_connect(struct te_xport *xp, struct te_segment *seg, const struct te_desc *d,
			struct te_peer **out)
{
	struct rdma_xport *x = (struct rdma_xport *)xp;
	struct te_engine *e = x->e;
	char why[256] = "";
	int err;
	if (d->nnics == 0 || d->nnics > TE_RDMA_MAX_NICS) {
		snprintf(why, sizeof(why), "it describes %zu NICs", d->nnics);
		err = MC_EUNAVAILABLE;
		goto fallback;
	}
	struct rpeer *p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	unsigned n = MC_MAX(x->nnics, (unsigned)d->nnics);
	p->base.ops = &te__rdma_ops;
	p->base.x = xp;
	p->base.seg = seg;
	snprintf(p->base.name, sizeof(p->base.name), "%s", seg->name);
	p->base.npaths = n;
	atomic_init(&p->base.refs, 1);
	atomic_init(&p->base.alive, (1u << n) - 1);
	p->x = x;
	p->peer_nics = (unsigned)d->nnics;
	p->ctrl_fd = -1;
	pthread_mutex_init(&p->setup_mu, NULL);
	pthread_rwlock_init(&p->lk, NULL);
	p->reconnect_job.fn = on_reconnect;
	err = te__desc_copy(d, &p->d);
	if (err)
		goto fail_peer;
	p->ctrl_fd = te__ctrl_open(e, d, CTRL_TIMEOUT_MS);
	if (p->ctrl_fd < 0) {
		err = p->ctrl_fd;
		snprintf(why, sizeof(why), "control connection: %s", mc_strerror(err));
		goto fail_peer;
	}
	err = rconn_new(p, &p->cur, why, sizeof(why));
	if (err)
		goto fail_peer;
	if ((d->transports & TE_XP_TCP) && e->xp[TE_PROTO_TCP]) {
		int terr = e->xops[TE_PROTO_TCP]->connect(e->xp[TE_PROTO_TCP], seg, d,
							  &p->tcp);
		if (terr) {
			log_warn("segment %s: no tcp fallback for rdma (%s)", seg->name,
				 mc_strerror(terr));
			p->tcp = NULL;
		}
	}
	log_info("segment %s: %u RDMA queue pairs (%u NICs here, %zu there), tcp "
		 "fallback %s",
		 seg->name, p->cur->n, x->nnics, d->nnics, p->tcp ? "ready" : "none");
	metric_add(e->m_peers[TE_PROTO_RDMA], 1);
	*out = &p->base;
	return 0;
fail_peer:
	peer_destroy(p);
fallback:
	if (err == -EACCES || err == MC_ESEGMENT_NOT_FOUND || e->proto == TE_PROTO_RDMA ||
	    !e->xp[TE_PROTO_TCP] || !(d->transports & TE_XP_TCP)) {
		log_warn("segment %s: rdma: %s", seg->name, why[0] ? why : mc_strerror(err));
		return err;
	}
	log_warn("segment %s: rdma unavailable (%s); using tcp", seg->name,
		 why[0] ? why : mc_strerror(err));
	return e->xops[TE_PROTO_TCP]->connect(e->xp[TE_PROTO_TCP], seg, d, out);
}

/* ------------------------------------------------------------ engine-wide */

static void rdma_describe(struct te_xport *xp, struct te_desc *d)
{
	struct rdma_xport *x = (struct rdma_xport *)xp;
	d->nics = calloc(x->nnics, sizeof(*d->nics));
	if (!d->nics) { /* offer no rkeys rather than a bad descriptor */
		for (size_t i = 0; i < d->nregions; i++) {
			d->regions[i].nrkeys = 0;
			d->regions[i].rdma_addr = 0;
		}
		return;
	}
	d->nnics = x->nnics;
	for (unsigned i = 0; i < x->nnics; i++) {
		const struct te_rdma_nic *n = te_rdma_nic(x->r, i);
		struct te_desc_nic *o = &d->nics[i];
		snprintf(o->name, sizeof(o->name), "%s", n->name);
		memcpy(o->gid, n->gid, sizeof(o->gid));
		o->lid = n->lid;
		o->port = n->port;
		o->mtu = n->mtu_bytes;
	}
}

static void register_metrics(struct rdma_xport *x)
{
	static const char *const ops[2] = {"read", "write"};
	struct metrics_registry *r = x->e->metrics;
	for (unsigned i = 0; i < x->nnics; i++)
		for (int o = 0; o < 2; o++)
			x->m_nic[i][o] = metrics_counter(
				r, "mooncake_te_rdma_nic_bytes_total",
				"Bytes this engine's RDMA requests moved, per local NIC.",
				"nic,op",
				(const char *[]){te_rdma_nic(x->r, i)->name, ops[o]});
	x->m_qp_errors = metrics_counter(r, "mooncake_te_rdma_qp_errors_total",
					 "RDMA queue pairs that went to the error state.",
					 NULL, NULL);
	x->m_reconnects = metrics_counter(r, "mooncake_te_rdma_reconnects_total",
					  "Peers' RDMA queue pairs set up again after an "
					  "error.",
					  NULL, NULL);
	x->m_fallback = metrics_counter(r, "mooncake_te_rdma_tcp_fallback_slices_total",
					"Slices of rdma peers sent over tcp (local buffer "
					"not registered, no rkey, or no healthy queue pair).",
					NULL, NULL);
}

static int rdma_init(struct te_engine *e, struct te_xport **out)
{
	char why[512] = "";
	struct rdma_xport *x = calloc(1, sizeof(*x));
	if (!x)
		return -ENOMEM;
	x->e = e;
	struct te_rdma_opts o = {
		.devices = e->rdma_devices,
		.gid_index = e->rdma_gid_index,
		.mtu_bytes = e->rdma_mtu_bytes,
		.cq_depth = CQ_DEPTH,
		.on_complete = on_complete,
		.on_qp_error = on_qp_error,
	};
	int rc = te_rdma_new(&o, &x->r, why, sizeof(why));
	if (rc) {
		if (e->proto == TE_PROTO_RDMA)
			log_error("--protocol=rdma: %s", why[0] ? why : mc_strerror(rc));
		else
			log_info("no usable RDMA device (%s): remote peers use tcp (shm on "
				 "this host)",
				 why[0] ? why : mc_strerror(rc));
		free(x);
		return rc;
	}
	x->nnics = te_rdma_nic_count(x->r);
	pthread_rwlock_init(&x->mr_lk, NULL);
	pthread_mutex_init(&x->mu, NULL);
	pthread_cond_init(&x->cv, NULL);
	register_metrics(x);
	for (unsigned i = 0; i < x->nnics; i++) {
		const struct te_rdma_nic *n = te_rdma_nic(x->r, i);
		char gid[INET6_ADDRSTRLEN];
		if (!inet_ntop(AF_INET6, n->gid, gid, sizeof(gid)))
			snprintf(gid, sizeof(gid), "?");
		log_info("rdma transport: %s port %u, GID %s (index %u, %s), LID %u, MTU %u",
			 n->name, n->port, gid, n->gid_index,
			 n->gid_type == 2   ? "RoCE v2"
			 : n->gid_type == 1 ? "RoCE v1"
					    : "IB",
			 n->lid, n->mtu_bytes);
	}
	*out = (struct te_xport *)x;
	return 0;
}

/* After the workers stopped and tcp closed its connections (so every
 * served control connection is gone); peers were disconnected. */
static void rdma_fini(struct te_xport *xp)
{
	struct rdma_xport *x = (struct rdma_xport *)xp;
	while (x->srv) {
		struct rsrv *sv = x->srv;
		x->srv = sv->next;
		srv_free(sv);
	}
	for (size_t i = 0; i < x->nmrs; i++) { /* regions never unregistered */
		if (x->mrs[i]->mr)
			te_rdma_dereg(x->mrs[i]->mr);
		x->mrs[i]->r->xp[TE_PROTO_RDMA] = NULL;
		free(x->mrs[i]);
	}
	free(x->mrs);
	te_rdma_free(x->r);
	pthread_rwlock_destroy(&x->mr_lk);
	pthread_mutex_destroy(&x->mu);
	pthread_cond_destroy(&x->cv);
	free(x);
}

const struct te_xport_ops te__rdma_ops = {
	.name = "rdma",
	.proto = TE_PROTO_RDMA,
	.init = rdma_init,
	.fini = rdma_fini,
	.describe = rdma_describe,
	.region_add = rdma_region_add,
	.region_del = rdma_region_del,
	.connect = rdma_connect,
	.bind = rdma_bind,
	.unbind = rdma_unbind,
	.submit = rdma_submit,
	.disconnect = rdma_disconnect,
	.peer_free = rdma_peer_free,
	.on_ctrl = rdma_on_ctrl,
	.ctrl_closed = rdma_ctrl_closed,
};
