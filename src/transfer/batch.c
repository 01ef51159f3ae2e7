/*
 * batch: submitting requests and completing them. A batch is one
 * allocation set made at submit time — the requests' states and every
 * slice — so nothing is allocated per slice afterwards. Each request is
 * bound to one peer of its segment (shm when the peer maps the range, else
 * the remote transport), cut into slices of slice_bytes, and the slices are
 * striped over the peer's paths starting at a rotating path. A slice whose
 * path broke is resubmitted on another live path not yet tried; when none
 * is left its request fails. The batch completes when its last request
 * does; te_wait sleeps on a condition variable until then.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/crc32c.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/util.h"
#include "transfer/te_int.h"

#define LOG_SUBSYS LOGS_TE

/* ------------------------------------------------------------ slicing (pure) */

size_t te__slice_count(uint64_t len, size_t slice_bytes)
{
	return (size_t)(len / slice_bytes + (len % slice_bytes != 0));
}

void te__slice_at(uint64_t len, size_t slice_bytes, size_t i, uint64_t *off, size_t *slen)
{
	uint64_t o = (uint64_t)i * slice_bytes;
	*off = o;
	*slen = (size_t)MC_MIN((uint64_t)slice_bytes, len - o);
}

int te__pick_path(unsigned npaths, unsigned start, size_t k, uint32_t excluded, uint32_t alive)
{
	if (npaths == 0)
		return -1;
	unsigned first = (unsigned)((start + k) % npaths);
	for (unsigned j = 0; j < npaths; j++) {
		unsigned p = (first + j) % npaths;
		if ((alive >> p & 1) && !(excluded >> p & 1))
			return (int)p;
	}
	return -1;
}

/* ------------------------------------------------------------ completion */

static void batch_dec(struct te_batch *b)
{
	if (atomic_fetch_sub(&b->pending, 1) != 1)
		return;
	/* The callback runs before waiters wake, so a waiter that frees the
	 * batch never races with it. */
	if (b->on_done)
		b->on_done(b, b->ud);
	pthread_mutex_lock(&b->mu);
	b->done = true;
	pthread_cond_broadcast(&b->cv);
	pthread_mutex_unlock(&b->mu);
}

static void req_finish(struct te_batch *b, struct te_req_state *rs, int err)
{
	struct te_engine *e = b->e;
	struct te_peer *p = rs->peer;
	if (p) {
		int proto = p->ops->proto;
		if (p->ops->unbind)
			p->ops->unbind(p, rs->route);
		if (err)
			metric_inc(e->m_failed[proto]);
		else
			metric_add(e->m_bytes[proto][te__op_idx((uint8_t)rs->r.op)],
				   rs->r.len);
		rs->peer = NULL;
		te__peer_unref(p);
	}
	atomic_store(&rs->err, err);
	atomic_store(&rs->status, err ? TE_FAILED : TE_DONE);
	batch_dec(b);
}

void te__req_fail(struct te_batch *b, struct te_req_state *rs, int err)
{
	req_finish(b, rs, err);
}

int te__slice_doomed(const struct te_slice *s)
{
	return atomic_load(&s->batch->reqs[s->req].err);
}

void te__slice_done(struct te_slice *s, int err, bool retry)
{
	struct te_batch *b = s->batch;
	struct te_req_state *rs = &b->reqs[s->req];
	struct te_peer *p = rs->peer;

	if (err && retry && p) {
		s->excluded |= 1u << s->path;
		s->tries++;
		int path = atomic_load(&p->closed)
				   ? -1
				   : te__pick_path(p->npaths, s->path, 1, s->excluded,
						   atomic_load(&p->alive));
		if (path >= 0) {
			metric_inc(b->e->m_retries);
			log_debug("slice of %u bytes at 0x%llx: %s on path %u; "
				  "retrying on path %d",
				  s->len, (unsigned long long)s->remote, mc_strerror(err),
				  s->path, path);
			s->path = (uint16_t)path;
			s->done_bytes = 0;
			s->summed = false;
			p->ops->submit(p, s);
			return;
		}
		if (err != MC_ETIMEDOUT && err != MC_ESHUTDOWN)
			err = MC_EUNAVAILABLE;
	}
	if (err) {
		int zero = 0;
		atomic_compare_exchange_strong(&rs->err, &zero, err);
	} else if (rs->r.want_crc) {
		/* Its bytes are in (and in the cache when not summed yet). */
		uint32_t c = s->summed ? s->crc : crc32c(0, s->local, s->len);
		uint64_t after = rs->r.len - (uint64_t)(s->local - (uint8_t *)rs->r.local) -
				 s->len;
		atomic_fetch_xor(&rs->crc, crc32c_combine(c, 0, after));
	}
	if (atomic_fetch_sub(&rs->left, 1) == 1)
		req_finish(b, rs, atomic_load(&rs->err));
}

/* ------------------------------------------------------------ dispatch */

/* Bind a request to a peer of an open segment. Called with s->mu held. */
static int route_locked(struct te_segment *s, struct te_req_state *rs)
{
	uint64_t addr = rs->r.remote_addr;
	uint64_t len = rs->r.len;
	struct te_peer *p = s->shm;
	if (rs->r.local_device) {
		/* Device memory: no CPU copies it, only an RDMA NIC. */
		p = s->remote;
		if (!p || p->ops->proto != TE_PROTO_RDMA)
			return -EOPNOTSUPP;
		if (atomic_load(&p->closed))
			return MC_EUNAVAILABLE;
		int rc = p->ops->bind(p, addr, len, &rs->route);
		if (rc)
			return rc == -EAGAIN ? MC_EREMOTE_ACCESS : rc;
		if (!rs->route) {
			p->ops->unbind(p, rs->route);
			return -EOPNOTSUPP; /* a region without rkeys */
		}
		rs->peer = p;
		te__peer_ref(p);
		return 0;
	}
	if (p && !atomic_load(&p->closed)) {
		int rc = p->ops->bind(p, addr, len, &rs->route);
		if (rc == 0) {
			rs->peer = p;
			te__peer_ref(p);
			return 0;
		}
		if (rc != -EAGAIN)
			return rc;
	}
	p = s->remote;
	if (!p || atomic_load(&p->closed))
		return s->shm ? MC_EREMOTE_ACCESS : MC_EUNAVAILABLE;
	rs->route = NULL;
	if (p->ops->bind) {
		int rc = p->ops->bind(p, addr, len, &rs->route);
		if (rc)
			return rc == -EAGAIN ? MC_EREMOTE_ACCESS : rc;
	}
	rs->peer = p;
	te__peer_ref(p);
	return 0;
}

void te__req_dispatch(struct te_batch *b, struct te_req_state *rs)
{
	struct te_segment *s = rs->r.segment;
	int rc;

	pthread_mutex_lock(&s->mu);
	switch (s->state) {
	case TE_SEG_OPEN:
		if ((!s->shm || atomic_load(&s->shm->closed)) &&
		    (!s->remote || atomic_load(&s->remote->closed))) {
			if (te__seg_broken_locked(s))
				goto park;
			rc = MC_EUNAVAILABLE;
			break;
		}
		rc = route_locked(s, rs);
		break;
	case TE_SEG_RESOLVING:
	case TE_SEG_REFRESHING:
	park:
		/* Parked until the segment is connected again. */
		rs->park_next = NULL;
		*s->parked_tail = rs;
		s->parked_tail = &rs->park_next;
		pthread_mutex_unlock(&s->mu);
		return;
	default:
		rc = s->err ? s->err : MC_EUNAVAILABLE;
		break;
	}
	pthread_mutex_unlock(&s->mu);
	if (rc) {
		req_finish(b, rs, rc);
		return;
	}

	/* Once the request's last slice is submitted (or failed) the request,
	 * the batch and even the peer may be gone — a parked request's batch
	 * has no reference held by its submitter — so the loop reads only
	 * what it copied before the first submit. */
	struct te_peer *p = rs->peer;
	const struct te_xport_ops *ops = p->ops;
	const unsigned npaths = p->npaths;
	const uint32_t alive = atomic_load(&p->alive);
	const unsigned start = atomic_fetch_add(&p->stripe, 1);
	const size_t nslices = rs->nslices, slice_bytes = b->e->slice_bytes;
	const struct te_request r = rs->r;
	const uint32_t req = (uint32_t)(rs - b->reqs);
	void *route = rs->route;
	struct te_slice *slices = &b->slices[rs->first];
	atomic_store(&rs->left, nslices);
	for (size_t k = 0; k < nslices; k++) {
		struct te_slice *sl = &slices[k];
		uint64_t off;
		size_t slen;
		te__slice_at(r.len, slice_bytes, k, &off, &slen);
		memset(sl, 0, offsetof(struct te_slice, hdr));
		sl->batch = b;
		sl->req = req;
		sl->op = (uint8_t)r.op;
		sl->len = (uint32_t)slen;
		sl->remote = r.remote_addr + off;
		sl->local = (uint8_t *)r.local + off;
		sl->route = route;
		sl->device = r.local_device;
		int path = te__pick_path(npaths, start, k, 0, alive);
		if (path < 0) {
			te__slice_done(sl, MC_EUNAVAILABLE, false);
			continue;
		}
		sl->path = (uint16_t)path;
		ops->submit(p, sl);
	}
}

/* ------------------------------------------------------------ API */

int te_submit_inline(struct te_engine *e, const struct te_request *reqs, size_t n,
		     size_t inline_bytes, void (*on_done)(struct te_batch *b, void *ud),
		     void *ud, struct te_batch **out)
{
	size_t total = 0;
	if (!e || !reqs || n == 0 || !out)
		return -EINVAL;
	for (size_t i = 0; i < n; i++) {
		const struct te_request *r = &reqs[i];
		if (r->want_crc && (r->op != TE_READ || r->local_device))
			return -EINVAL;
		if (r->len == 0)
			continue;
		if (!r->segment || !r->local || (r->op != TE_READ && r->op != TE_WRITE))
			return -EINVAL;
		total += te__slice_count(r->len, e->slice_bytes);
		if (total > TE_MAX_BATCH_SLICES)
			return -E2BIG;
	}
	struct te_batch *b = calloc(1, sizeof(*b));
	if (!b)
		return -ENOMEM;
	b->reqs = calloc(n, sizeof(*b->reqs));
	b->slices = total ? malloc(total * sizeof(*b->slices)) : NULL;
	if (!b->reqs || (total && !b->slices)) {
		free(b->reqs);
		free(b->slices);
		free(b);
		return -ENOMEM;
	}
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&b->cv, &ca);
	pthread_condattr_destroy(&ca);
	pthread_mutex_init(&b->mu, NULL);
	b->e = e;
	b->n = n;
	b->nslices = total;
	b->on_done = on_done;
	b->ud = ud;
	atomic_store(&b->pending, n + 1); /* +1 until every request started */
	atomic_store(&b->inline_left, inline_bytes ? inline_bytes : TE_SHM_INLINE_BATCH_BYTES);
	b->inline_any = inline_bytes > 0;

	size_t first = 0;
	uint64_t now = mc_now_ns();
	for (size_t i = 0; i < n; i++) {
		struct te_req_state *rs = &b->reqs[i];
		rs->r = reqs[i];
		rs->batch = b;
		rs->t0_ns = now;
		rs->first = first;
		rs->nslices = te__slice_count(rs->r.len, e->slice_bytes);
		first += rs->nslices;
	}
	*out = b;
	for (size_t i = 0; i < n; i++) {
		struct te_req_state *rs = &b->reqs[i];
		if (rs->r.len == 0)
			req_finish(b, rs, 0);
		else
			te__req_dispatch(b, rs);
	}
	batch_dec(b);
	return 0;
}

int te_submit_notify(struct te_engine *e, const struct te_request *reqs, size_t n,
		     void (*on_done)(struct te_batch *b, void *ud), void *ud,
		     struct te_batch **out)
{
	return te_submit_inline(e, reqs, n, 0, on_done, ud, out);
}

int te_submit(struct te_engine *e, const struct te_request *reqs, size_t n,
	      struct te_batch **out)
{
	return te_submit_notify(e, reqs, n, NULL, NULL, out);
}

size_t te_poll(struct te_batch *b, struct te_result *results)
{
	size_t pending = 0;
	for (size_t i = 0; i < b->n; i++) {
		int st = atomic_load(&b->reqs[i].status);
		pending += st == TE_PENDING;
		if (results) {
			results[i].status = (enum te_status)st;
			results[i].err = st == TE_FAILED ? atomic_load(&b->reqs[i].err) : 0;
			results[i].crc = st == TE_DONE ? atomic_load(&b->reqs[i].crc) : 0;
		}
	}
	return pending;
}

int te_wait(struct te_batch *b, uint64_t timeout_ms)
{
	struct timespec dl;
	int rc = 0;
	clock_gettime(CLOCK_MONOTONIC, &dl);
	dl.tv_sec += (time_t)(timeout_ms / 1000);
	dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (dl.tv_nsec >= 1000000000L) {
		dl.tv_sec++;
		dl.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&b->mu);
	while (!b->done && rc == 0) {
		if (timeout_ms == 0)
			pthread_cond_wait(&b->cv, &b->mu);
		else if (pthread_cond_timedwait(&b->cv, &b->mu, &dl) == ETIMEDOUT)
			rc = b->done ? 0 : MC_ETIMEDOUT;
	}
	pthread_mutex_unlock(&b->mu);
	return rc;
}

void te_batch_free(struct te_batch *b)
{
	if (!b)
		return;
	pthread_mutex_lock(&b->mu);
	while (!b->done)
		pthread_cond_wait(&b->cv, &b->mu);
	pthread_mutex_unlock(&b->mu);
	pthread_mutex_destroy(&b->mu);
	pthread_cond_destroy(&b->cv);
	free(b->slices);
	free(b->reqs);
	free(b);
}
