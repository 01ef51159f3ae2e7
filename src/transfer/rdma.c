/*
 * rdma: devices, memory regions, RC connections and completions for the
 * transfer engine's rdma transport (see rdma.h for how the engine uses it).
 *
 * Layout, in set-up order (torn down in reverse, rc_pingpong style):
 * device selection (rdma_dev.c: list, filter, open, ACTIVE port, GID,
 * MTU) -> per NIC: PD, completion channel, CQ -> completion thread ->
 * MRs (te_rdma_reg) -> connections (te_rdma_conn_new: QPs in INIT,
 * te_rdma_conn_connect: RTR, RTS) -> posts.
 *
 * Accounting. Every QP numbers its WRs with a 64-bit sequence; wr_id
 * carries (QP table id << 32 | low 32 bits of the sequence). The module
 * keeps the cookie of each outstanding WR in a ring of sq_depth + 1 slots.
 * Completions on an RC QP arrive in order, so a CQE for sequence s retires
 * every WR before s: those without a CQE of their own were unsignaled and
 * succeeded (a failure always makes a CQE). A flushed QP gives a CQE for
 * each WR. When the module itself moves a QP to ERR (teardown, failed
 * post) it posts one signaled "fence" WR, which flushes and so retires
 * the unsignaled WRs that had completed silently; its slot is reserved.
 */
#include "transfer/rdma.h"
#include "transfer/rdma_int.h"

#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "transfer/transfer.h"

#define LOG_SUBSYS LOGS_RDMA

#define TE_RDMA_POST_CHUNK 32   /* WRs per ibv_post_send call */
#define TE_RDMA_POLL_BATCH 64   /* CQEs per ibv_poll_cq call */
#define TE_RDMA_DRAIN_MS 10000u /* teardown waits this long for flushes */
#define TE_RDMA_HOP_LIMIT 64
#define TE_RDMA_MIN_RNR_TIMER 12 /* 0.64 ms */

struct rqp;

struct te_rdma {
	struct te_rdma_opts o;
	unsigned n;
	struct rdev dev[TE_RDMA_MAX_NICS];
	pthread_mutex_t lock; /* QP table, per-device counters */
	struct rqp **qps;
	uint32_t qps_cap;
	int stop_fd;
	pthread_t thread;
	/* completion thread only */
	struct ibv_wc wc[TE_RDMA_POLL_BATCH];
	struct rdone {
		uint64_t cookie;
		int status;
	} * done;
};

struct te_rdma_mr {
	struct te_rdma *r;
	void *addr;
	size_t len;
	struct ibv_mr *mr[TE_RDMA_MAX_NICS];
};

struct rqp {
	struct te_rdma_conn *conn;
	unsigned k;
	struct rdev *dev;
	struct ibv_qp *qp;
	uint32_t id; /* index in te_rdma.qps */
	uint32_t psn;
	pthread_mutex_t lock;
	pthread_cond_t idle;
	/* under lock */
	uint64_t *cookies; /* ring of sq_depth + 1, by sequence */
	uint8_t *kind;     /* by sequence: WR_USER, WR_FENCE, WR_UNPOSTED */
	int *unposted_err; /* status of a WR_UNPOSTED slot */
	uint64_t post_seq, done_seq;
	unsigned since_signal;
	unsigned delivering; /* completions handed to callbacks, not yet returned */
	uint32_t peer_qpn;
	bool connected;
	bool closing;      /* qp_destroy runs: errors are expected */
	bool err_reported; /* on_qp_error called */
	int err;
};

enum { WR_USER = 0, WR_FENCE, WR_UNPOSTED };

struct te_rdma_conn {
	struct te_rdma *r;
	void *arg;
	unsigned n;
	unsigned peer_nics;
	struct rqp q[TE_RDMA_MAX_NICS];
};

int te_rdma_wc_status_code(int st)
{
	switch (st) {
	case IBV_WC_SUCCESS:
		return 0;
	case IBV_WC_REM_ACCESS_ERR:
		return -EACCES;
	case IBV_WC_LOC_PROT_ERR:
	case IBV_WC_LOC_ACCESS_ERR:
	case IBV_WC_LOC_LEN_ERR:
		return -EFAULT;
	case IBV_WC_RETRY_EXC_ERR:
	case IBV_WC_RNR_RETRY_EXC_ERR:
	case IBV_WC_RESP_TIMEOUT_ERR:
		return MC_EUNAVAILABLE;
	case IBV_WC_WR_FLUSH_ERR:
		return MC_ECANCELLED;
	case IBV_WC_REM_INV_REQ_ERR:
	case IBV_WC_REM_INV_RD_REQ_ERR:
		return -EINVAL;
	default:
		return -EIO;
	}
}

static int dev_setup(struct te_rdma *r, struct rdev *d, char *why, size_t why_len)
{
	int rc;
	if ((uint64_t)r->o.sq_depth + 1 > (uint64_t)d->attr.max_qp_wr) {
		te_rdma__why(why, why_len,
			     "%s: send queue depth %u exceeds the device's max_qp_wr %d",
			     d->info.name, r->o.sq_depth, d->attr.max_qp_wr);
		return -EINVAL;
	}
	unsigned cqe = r->o.cq_depth;
	if (d->attr.max_cqe > 0 && cqe > (unsigned)d->attr.max_cqe)
		cqe = (unsigned)d->attr.max_cqe;
	d->info.mtu_bytes = te_rdma__mtu_bytes(d->mtu);
	d->pd = ibv_alloc_pd(d->ctx);
	if (!d->pd) {
		rc = -errno;
		te_rdma__why(why, why_len, "%s: ibv_alloc_pd: %s", d->info.name,
			     strerror(errno));
		goto fail;
	}
	d->ch = ibv_create_comp_channel(d->ctx);
	if (!d->ch) {
		rc = -errno;
		te_rdma__why(why, why_len, "%s: ibv_create_comp_channel: %s", d->info.name,
			     strerror(errno));
		goto fail_pd;
	}
	int fl = fcntl(d->ch->fd, F_GETFL);
	if (fl < 0 || fcntl(d->ch->fd, F_SETFL, fl | O_NONBLOCK) < 0) {
		rc = -errno;
		te_rdma__why(why, why_len, "%s: completion channel: %s", d->info.name,
			     strerror(errno));
		goto fail_ch;
	}
	d->cq = ibv_create_cq(d->ctx, (int)cqe, d, d->ch, 0);
	if (!d->cq) {
		rc = -errno;
		te_rdma__why(why, why_len, "%s: ibv_create_cq(%u): %s", d->info.name, cqe,
			     strerror(errno));
		goto fail_ch;
	}
	rc = ibv_req_notify_cq(d->cq, 0);
	if (rc) {
		rc = -rc;
		te_rdma__why(why, why_len, "%s: ibv_req_notify_cq: %s", d->info.name,
			     strerror(-rc));
		goto fail_cq;
	}
	return 0;
fail_cq:
	ibv_destroy_cq(d->cq);
fail_ch:
	ibv_destroy_comp_channel(d->ch);
fail_pd:
	ibv_dealloc_pd(d->pd);
fail:
	d->pd = NULL;
	d->ch = NULL;
	d->cq = NULL;
	return rc ? rc : -EIO;
}

static void dev_teardown(struct rdev *d)
{
	if (d->cq)
		ibv_destroy_cq(d->cq);
	if (d->ch)
		ibv_destroy_comp_channel(d->ch);
	if (d->pd)
		ibv_dealloc_pd(d->pd);
	if (d->ctx)
		ibv_close_device(d->ctx);
	memset(d, 0, sizeof(*d));
}

/* ------------------------------------------------------------ completions */

static void deliver(struct te_rdma *r, struct rqp *q, uint64_t seq32, int ibst,
		    const struct ibv_wc *wc)
{
	unsigned ring = r->o.sq_depth + 1;
	unsigned nd = 0;
	bool first_err = false;
	int code = te_rdma_wc_status_code(ibst);
	pthread_mutex_lock(&q->lock);
	uint64_t seq = q->done_seq +
		       (uint64_t)(uint32_t)((uint32_t)seq32 - (uint32_t)q->done_seq);
	if (seq >= q->post_seq) {
		pthread_mutex_unlock(&q->lock);
		log_error("%s: completion for QP %u sequence %llu not posted (posted %llu)",
			  q->dev->info.name, q->qp->qp_num, (unsigned long long)seq,
			  (unsigned long long)q->post_seq);
		return;
	}
	for (uint64_t s = q->done_seq; s <= seq; s++) {
		unsigned slot = (unsigned)(s % ring);
		if (q->kind[slot] == WR_FENCE)
			continue;
		r->done[nd].cookie = q->cookies[slot];
		r->done[nd].status = q->kind[slot] == WR_UNPOSTED ? q->unposted_err[slot]
				     : s == seq                   ? code
								  : 0;
		nd++;
	}
	q->done_seq = seq + 1;
	if (code && !q->err) {
		q->err = code;
		q->connected = false;
		log_warn(
			"%s: QP %u (peer QP %u) failed: %s (vendor error 0x%x); it stays in ERR",
			q->dev->info.name, q->qp->qp_num, q->peer_qpn,
			ibv_wc_status_str(wc->status), wc->vendor_err);
	}
	int qp_err = q->err;
	if (q->err && !q->err_reported && !q->closing) {
		q->err_reported = true;
		first_err = true;
	}
	q->delivering++;
	pthread_mutex_unlock(&q->lock);
	for (unsigned i = 0; i < nd; i++)
		r->o.on_complete(q->conn->arg, r->done[i].cookie, r->done[i].status);
	if (first_err && r->o.on_qp_error)
		r->o.on_qp_error(q->conn->arg, q->k, qp_err);
	pthread_mutex_lock(&q->lock);
	q->delivering--;
	if (q->done_seq == q->post_seq && !q->delivering)
		pthread_cond_broadcast(&q->idle);
	pthread_mutex_unlock(&q->lock);
}

static void drain_cq(struct te_rdma *r, struct rdev *d)
{
	for (;;) {
		int n = ibv_poll_cq(d->cq, TE_RDMA_POLL_BATCH, r->wc);
		if (n < 0) {
			log_error("%s: ibv_poll_cq failed (%d)", d->info.name, n);
			return;
		}
		for (int i = 0; i < n; i++) {
			const struct ibv_wc *wc = &r->wc[i];
			uint32_t id = (uint32_t)(wc->wr_id >> 32);
			pthread_mutex_lock(&r->lock);
			struct rqp *q = id < r->qps_cap ? r->qps[id] : NULL;
			pthread_mutex_unlock(&r->lock);
			if (!q) {
				log_error("%s: completion for unknown QP %u", d->info.name,
					  wc->qp_num);
				continue;
			}
			deliver(r, q, wc->wr_id & 0xffffffffu, wc->status, wc);
		}
		if (n < TE_RDMA_POLL_BATCH)
			return;
	}
}

static void *cq_thread(void *arg)
{
	struct te_rdma *r = arg;
	struct pollfd p[TE_RDMA_MAX_NICS + 1];
	p[0].fd = r->stop_fd;
	p[0].events = POLLIN;
	for (unsigned i = 0; i < r->n; i++) {
		p[i + 1].fd = r->dev[i].ch->fd;
		p[i + 1].events = POLLIN;
	}
	for (;;) {
		if (poll(p, r->n + 1, -1) < 0) {
			if (errno == EINTR)
				continue;
			log_error("completion thread: poll: %s", strerror(errno));
			break;
		}
		if (p[0].revents)
			break;
		for (unsigned i = 0; i < r->n; i++) {
			struct rdev *d = &r->dev[i];
			struct ibv_cq *cq;
			void *ctx;
			unsigned events = 0;
			if (!p[i + 1].revents)
				continue;
			while (ibv_get_cq_event(d->ch, &cq, &ctx) == 0)
				events++;
			if (events)
				ibv_ack_cq_events(d->cq, events);
			/* re-arm, then poll: a CQE that arrived before the arm is
			 * found by the poll, one after it raises an event */
			int rc = ibv_req_notify_cq(d->cq, 0);
			if (rc)
				log_error("%s: ibv_req_notify_cq: %s", d->info.name,
					  strerror(rc));
			drain_cq(r, d);
		}
	}
	return NULL;
}

/* ------------------------------------------------------------ context */

int te_rdma_new(const struct te_rdma_opts *opts, struct te_rdma **out, char *why,
		size_t why_len)
{
	int rc;
	if (why && why_len)
		why[0] = 0;
	if (!opts || !out || !opts->on_complete) {
		te_rdma__why(why, why_len, "on_complete callback missing");
		return -EINVAL;
	}
	struct te_rdma *r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->o = *opts;
	if (!r->o.sq_depth)
		r->o.sq_depth = TE_RDMA_DEFAULT_SQ_DEPTH;
	if (!r->o.signal_every)
		r->o.signal_every = TE_RDMA_DEFAULT_SIGNAL_EVERY;
	if (!r->o.cq_depth)
		r->o.cq_depth = TE_RDMA_DEFAULT_CQ_DEPTH;
	if (r->o.sq_depth < 2 || r->o.sq_depth > 65536 ||
	    r->o.signal_every > r->o.sq_depth / 2 || r->o.gid_index < -1 ||
	    r->o.gid_index > 255 ||
	    (r->o.mtu_bytes && (r->o.mtu_bytes < 256 || r->o.mtu_bytes > 4096 ||
				(r->o.mtu_bytes & (r->o.mtu_bytes - 1))))) {
		te_rdma__why(
			why, why_len,
			"bad options: sq_depth %u (2..65536), signal_every %u "
			"(at most sq_depth/2), gid_index %d (-1..255), mtu %u (256..4096)",
			r->o.sq_depth, r->o.signal_every, r->o.gid_index, r->o.mtu_bytes);
		rc = -EINVAL;
		goto fail_free;
	}
	r->done = calloc(r->o.sq_depth + 1, sizeof(*r->done));
	if (!r->done) {
		rc = -ENOMEM;
		goto fail_free;
	}
	pthread_mutex_init(&r->lock, NULL);
	rc = te_rdma__select_devices(&r->o, r->dev, &r->n, why, why_len);
	if (rc)
		goto fail_devs;
	for (unsigned i = 0; i < r->n; i++) {
		rc = dev_setup(r, &r->dev[i], why, why_len);
		if (rc)
			goto fail_devs;
	}
	r->stop_fd = eventfd(0, EFD_CLOEXEC);
	if (r->stop_fd < 0) {
		rc = -errno;
		goto fail_devs;
	}
	rc = -pthread_create(&r->thread, NULL, cq_thread, r);
	if (rc) {
		te_rdma__why(why, why_len, "cannot start the completion thread: %s",
			     strerror(-rc));
		goto fail_efd;
	}
	for (unsigned i = 0; i < r->n; i++)
		log_info("using %s port %u: GID index %u (%s), MTU %u", r->dev[i].info.name,
			 r->dev[i].info.port, r->dev[i].info.gid_index,
			 r->dev[i].info.gid_type == IBV_GID_TYPE_ROCE_V2   ? "RoCE v2"
			 : r->dev[i].info.gid_type == IBV_GID_TYPE_ROCE_V1 ? "RoCE v1"
									   : "IB",
			 r->dev[i].info.mtu_bytes);
	*out = r;
	return 0;
fail_efd:
	close(r->stop_fd);
fail_devs:
	for (unsigned i = r->n; i-- > 0;)
		dev_teardown(&r->dev[i]);
	pthread_mutex_destroy(&r->lock);
	free(r->done);
fail_free:
	free(r);
	return rc;
}

void te_rdma_free(struct te_rdma *r)
{
	if (!r)
		return;
	uint64_t one = 1;
	if (write(r->stop_fd, &one, sizeof(one)) != (ssize_t)sizeof(one))
		log_error("cannot stop the completion thread: %s", strerror(errno));
	pthread_join(r->thread, NULL);
	close(r->stop_fd);
	for (unsigned i = r->n; i-- > 0;) {
		if (r->dev[i].n_qp || r->dev[i].n_mr)
			log_error("%s: freed with %u QPs and %u MRs still open",
				  r->dev[i].info.name, r->dev[i].n_qp, r->dev[i].n_mr);
		dev_teardown(&r->dev[i]);
	}
	free(r->qps);
	pthread_mutex_destroy(&r->lock);
	free(r->done);
	free(r);
}

unsigned te_rdma_nic_count(const struct te_rdma *r)
{
	return r->n;
}

const struct te_rdma_nic *te_rdma_nic(const struct te_rdma *r, unsigned nic)
{
	return nic < r->n ? &r->dev[nic].info : NULL;
}

/* ------------------------------------------------------------ memory */

static int reg_error(struct te_rdma *r, struct rdev *d, size_t len, int e, char *why,
		     size_t why_len)
{
	struct rlimit rl;
	unsigned n_mr;
	pthread_mutex_lock(&r->lock);
	n_mr = d->n_mr;
	pthread_mutex_unlock(&r->lock);
	if (e == ENOMEM && d->attr.max_mr > 0 && n_mr >= (unsigned)d->attr.max_mr) {
		te_rdma__why(why, why_len,
			     "%s: the device allows %d memory regions (max_mr) and %u are "
			     "registered: register fewer, larger regions",
			     d->info.name, d->attr.max_mr, n_mr);
	} else if (e == ENOMEM && getrlimit(RLIMIT_MEMLOCK, &rl) == 0 &&
		   rl.rlim_cur != RLIM_INFINITY) {
		te_rdma__why(
			why, why_len,
			"%s: cannot pin %zu bytes: the locked-memory limit "
			"(RLIMIT_MEMLOCK, ulimit -l) is %llu KiB; raise it (ulimit -l unlimited, "
			"LimitMEMLOCK=infinity in the systemd unit, or memlock in "
			"/etc/security/limits.conf)",
			d->info.name, len, (unsigned long long)(rl.rlim_cur / 1024));
	} else if (e == ENOMEM) {
		te_rdma__why(why, why_len, "%s: out of memory registering %zu bytes",
			     d->info.name, len);
	} else if (e == EACCES || e == EPERM) {
		te_rdma__why(why, why_len, "%s: no permission to register memory (%s)",
			     d->info.name, strerror(e));
	} else if (e == EFAULT) {
		te_rdma__why(why, why_len, "%s: the region is not mapped", d->info.name);
	} else {
		te_rdma__why(why, why_len, "%s: ibv_reg_mr of %zu bytes: %s", d->info.name,
			     len, strerror(e));
	}
	return e ? -e : -EIO;
}

/* One MR per NIC of [addr, addr + len), or of a dma-buf (fd >= 0, from
 * offset) known to the NICs at addr. */
static int reg_mrs(struct te_rdma *r, void *addr, size_t len, int fd, uint64_t offset,
		   int access, struct te_rdma_mr **out, char *why, size_t why_len)
{
	int rc;
	unsigned i;
	if (why && why_len)
		why[0] = 0;
	if (!addr || !len) {
		te_rdma__why(why, why_len, "empty region");
		return -EINVAL;
	}
	struct te_rdma_mr *m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->r = r;
	m->addr = addr;
	m->len = len;
	for (i = 0; i < r->n; i++) {
		struct rdev *d = &r->dev[i];
		m->mr[i] = fd < 0 ? ibv_reg_mr(d->pd, addr, len, access)
				  : ibv_reg_dmabuf_mr(d->pd, offset, len,
						      (uint64_t)(uintptr_t)addr, fd, access);
		if (!m->mr[i]) {
			if (fd >= 0 && (errno == EOPNOTSUPP || errno == ENOSYS)) {
				te_rdma__why(why, why_len,
					     "%s: no dma-buf registration (driver "
					     "or kernel)",
					     d->info.name);
				rc = -EOPNOTSUPP;
			} else {
				rc = reg_error(r, d, len, errno, why, why_len);
			}
			goto fail_dereg;
		}
		pthread_mutex_lock(&r->lock);
		d->n_mr++;
		pthread_mutex_unlock(&r->lock);
	}
	*out = m;
	return 0;
fail_dereg:
	while (i-- > 0) {
		ibv_dereg_mr(m->mr[i]);
		pthread_mutex_lock(&r->lock);
		r->dev[i].n_mr--;
		pthread_mutex_unlock(&r->lock);
	}
	free(m);
	return rc;
}

int te_rdma_reg(struct te_rdma *r, void *addr, size_t len, bool remote_write,
		struct te_rdma_mr **out, char *why, size_t why_len)
{
	int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
		     (remote_write ? IBV_ACCESS_REMOTE_WRITE : 0);
	return reg_mrs(r, addr, len, -1, 0, access, out, why, why_len);
}

int te_rdma_reg_dmabuf(struct te_rdma *r, int fd, uint64_t offset, size_t len, uint64_t iova,
		       struct te_rdma_mr **out, char *why, size_t why_len)
{
	if (fd < 0) {
		te_rdma__why(why, why_len, "no dma-buf");
		return -EINVAL;
	}
	int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
	return reg_mrs(r, (void *)(uintptr_t)iova, len, fd, offset, access, out, why, why_len);
}

uint32_t te_rdma_mr_lkey(const struct te_rdma_mr *mr, unsigned nic)
{
	return nic < mr->r->n ? mr->mr[nic]->lkey : 0;
}

uint32_t te_rdma_mr_rkey(const struct te_rdma_mr *mr, unsigned nic)
{
	return nic < mr->r->n ? mr->mr[nic]->rkey : 0;
}

void te_rdma_dereg(struct te_rdma_mr *m)
{
	if (!m)
		return;
	struct te_rdma *r = m->r;
	for (unsigned i = r->n; i-- > 0;) {
		int rc = ibv_dereg_mr(m->mr[i]);
		if (rc)
			log_error("%s: ibv_dereg_mr: %s", r->dev[i].info.name, strerror(rc));
		pthread_mutex_lock(&r->lock);
		r->dev[i].n_mr--;
		pthread_mutex_unlock(&r->lock);
	}
	free(m);
}

/* ------------------------------------------------------------ connections */

static uint32_t new_psn(const void *salt)
{
	uint64_t v[2] = {mc_now_ns(), (uint64_t)(uintptr_t)salt};
	return (uint32_t)mc_hash64(v, sizeof(v)) & 0xffffffu;
}

/* Reserve a QP table slot and the CQ budget. Under nothing; takes r->lock. */
static int qp_reserve(struct te_rdma *r, struct rqp *q, char *why, size_t why_len)
{
	struct rdev *d = q->dev;
	unsigned need = r->o.sq_depth + 1;
	int rc = 0;
	pthread_mutex_lock(&r->lock);
	if (d->cq_used + need > (unsigned)d->cq->cqe) {
		te_rdma__why(why, why_len,
			     "%s: the completion queue (%d entries) is full with %u QPs of "
			     "%u: raise the CQ depth or lower the send queue depth",
			     d->info.name, d->cq->cqe, d->n_qp, need);
		rc = -ENOMEM;
		goto out;
	}
	uint32_t id = 0;
	while (id < r->qps_cap && r->qps[id])
		id++;
	if (id == r->qps_cap) {
		uint32_t cap = r->qps_cap ? r->qps_cap * 2 : 16;
		struct rqp **t = realloc(r->qps, cap * sizeof(*t));
		if (!t) {
			rc = -ENOMEM;
			goto out;
		}
		memset(t + r->qps_cap, 0, (cap - r->qps_cap) * sizeof(*t));
		r->qps = t;
		r->qps_cap = cap;
	}
	q->id = id;
	r->qps[id] = q;
	d->cq_used += need;
	d->n_qp++;
out:
	pthread_mutex_unlock(&r->lock);
	return rc;
}

static void qp_release(struct te_rdma *r, struct rqp *q)
{
	pthread_mutex_lock(&r->lock);
	r->qps[q->id] = NULL;
	q->dev->cq_used -= r->o.sq_depth + 1;
	q->dev->n_qp--;
	pthread_mutex_unlock(&r->lock);
}

static int qp_create(struct te_rdma *r, struct rqp *q, char *why, size_t why_len)
{
	struct rdev *d = q->dev;
	int rc;
	q->cookies = calloc(r->o.sq_depth + 1, sizeof(*q->cookies));
	q->kind = calloc(r->o.sq_depth + 1, sizeof(*q->kind));
	q->unposted_err = calloc(r->o.sq_depth + 1, sizeof(*q->unposted_err));
	if (!q->cookies || !q->kind || !q->unposted_err) {
		rc = -ENOMEM;
		goto fail_mem;
	}
	rc = qp_reserve(r, q, why, why_len);
	if (rc)
		goto fail_mem;
	struct ibv_qp_init_attr ia = {
		.qp_context = q,
		.send_cq = d->cq,
		.recv_cq = d->cq,
		.cap = {.max_send_wr = r->o.sq_depth + 1,
			.max_recv_wr = 1,
			.max_send_sge = 1,
			.max_recv_sge = 1},
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = 0,
	};
	q->qp = ibv_create_qp(d->pd, &ia);
	if (!q->qp) {
		int e = errno;
		unsigned n_qp;
		pthread_mutex_lock(&r->lock);
		n_qp = d->n_qp - 1;
		pthread_mutex_unlock(&r->lock);
		if (e == ENOMEM && d->attr.max_qp > 0 && n_qp >= (unsigned)d->attr.max_qp)
			te_rdma__why(
				why, why_len,
				"%s: the device allows %d queue pairs (max_qp) and %u are "
				"open: fewer peers or NICs per engine",
				d->info.name, d->attr.max_qp, n_qp);
		else
			te_rdma__why(why, why_len, "%s: ibv_create_qp: %s", d->info.name,
				     strerror(e));
		rc = e ? -e : -EIO;
		goto fail_reserve;
	}
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT,
		.pkey_index = 0,
		.port_num = d->info.port,
		.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
				   IBV_ACCESS_REMOTE_WRITE,
	};
	rc = ibv_modify_qp(q->qp, &a,
			   IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				   IBV_QP_ACCESS_FLAGS);
	if (rc) {
		te_rdma__why(why, why_len, "%s: QP to INIT: %s", d->info.name, strerror(rc));
		rc = -rc;
		goto fail_qp;
	}
	q->psn = new_psn(q);
	pthread_mutex_init(&q->lock, NULL);
	pthread_cond_init(&q->idle, NULL);
	return 0;
fail_qp:
	ibv_destroy_qp(q->qp);
	q->qp = NULL;
fail_reserve:
	qp_release(r, q);
fail_mem:
	free(q->unposted_err);
	free(q->kind);
	free(q->cookies);
	q->unposted_err = NULL;
	q->kind = NULL;
	q->cookies = NULL;
	return rc;
}

/* Post a fence: one signaled zero-length WR on a QP in ERR, which
 * flushes after every WR before it. Under q->lock. */
static void qp_fence_locked(struct te_rdma *r, struct rqp *q)
{
	unsigned ring = r->o.sq_depth + 1;
	struct ibv_sge sge = {.addr = 0, .length = 0, .lkey = 0};
	struct ibv_send_wr wr = {
		.wr_id = (uint64_t)q->id << 32 | (q->post_seq & 0xffffffffu),
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_SIGNALED,
	};
	struct ibv_send_wr *bad = NULL;
	if (q->post_seq - q->done_seq >= ring) {
		log_error("%s: QP %u: no slot for the fence", q->dev->info.name,
			  q->qp->qp_num);
		return;
	}
	int rc = ibv_post_send(q->qp, &wr, &bad);
	if (rc) {
		log_error("%s: QP %u: fence post failed: %s", q->dev->info.name, q->qp->qp_num,
			  strerror(rc));
		return;
	}
	q->kind[q->post_seq % ring] = WR_FENCE;
	q->cookies[q->post_seq % ring] = 0;
	q->post_seq++;
}

/* Move the QP to ERR; with WRs outstanding, fence them. Under q->lock. */
static void qp_to_err_locked(struct te_rdma *r, struct rqp *q)
{
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
	int rc = ibv_modify_qp(q->qp, &a, IBV_QP_STATE);
	if (rc) {
		log_error("%s: QP %u to ERR: %s", q->dev->info.name, q->qp->qp_num,
			  strerror(rc));
		return;
	}
	if (q->post_seq != q->done_seq)
		qp_fence_locked(r, q);
}

static void qp_destroy(struct te_rdma *r, struct rqp *q)
{
	pthread_mutex_lock(&q->lock);
	q->connected = false;
	q->closing = true;
	if (!q->err)
		q->err = MC_ECANCELLED;
	qp_to_err_locked(r, q);
	uint64_t deadline = mc_now_ms() + TE_RDMA_DRAIN_MS;
	while (q->post_seq != q->done_seq || q->delivering) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += 1;
		pthread_cond_timedwait(&q->idle, &q->lock, &ts);
		if (mc_now_ms() > deadline) {
			log_error(
				"%s: QP %u: %llu work requests never completed; destroying anyway",
				q->dev->info.name, q->qp->qp_num,
				(unsigned long long)(q->post_seq - q->done_seq));
			break;
		}
	}
	pthread_mutex_unlock(&q->lock);
	int rc = ibv_destroy_qp(q->qp);
	if (rc)
		log_error("%s: ibv_destroy_qp: %s", q->dev->info.name, strerror(rc));
	qp_release(r, q);
	pthread_cond_destroy(&q->idle);
	pthread_mutex_destroy(&q->lock);
	free(q->unposted_err);
	free(q->kind);
	free(q->cookies);
}

int te_rdma_conn_new(struct te_rdma *r, unsigned peer_nics, void *arg,
		     struct te_rdma_conn **out, char *why, size_t why_len)
{
	int rc = 0;
	unsigned k;
	if (why && why_len)
		why[0] = 0;
	if (peer_nics == 0 || peer_nics > TE_RDMA_MAX_NICS) {
		te_rdma__why(why, why_len, "peer NIC count %u not in 1..%d", peer_nics,
			     TE_RDMA_MAX_NICS);
		return -EINVAL;
	}
	struct te_rdma_conn *c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->r = r;
	c->arg = arg;
	c->peer_nics = peer_nics;
	c->n = MC_MAX(r->n, peer_nics);
	for (k = 0; k < c->n; k++) {
		struct rqp *q = &c->q[k];
		q->conn = c;
		q->k = k;
		q->dev = &r->dev[k % r->n];
		rc = qp_create(r, q, why, why_len);
		if (rc)
			goto fail_qps;
	}
	*out = c;
	return 0;
fail_qps:
	while (k-- > 0)
		qp_destroy(r, &c->q[k]);
	free(c);
	return rc;
}

unsigned te_rdma_conn_qps(const struct te_rdma_conn *c)
{
	return c->n;
}

unsigned te_rdma_conn_nic(const struct te_rdma_conn *c, unsigned k)
{
	return k < c->n ? k % c->r->n : 0;
}

int te_rdma_conn_eps(const struct te_rdma_conn *c, struct te_rdma_ep *eps, unsigned max)
{
	if (max < c->n)
		return -ENOSPC;
	for (unsigned k = 0; k < c->n; k++) {
		const struct rqp *q = &c->q[k];
		struct te_rdma_ep *e = &eps[k];
		memset(e, 0, sizeof(*e));
		memcpy(e->gid, q->dev->info.gid, 16);
		e->lid = q->dev->info.lid;
		e->qpn = q->qp->qp_num;
		e->psn = q->psn;
		e->mtu = (uint8_t)q->dev->mtu;
		e->port = q->dev->info.port;
		e->nic = (uint8_t)(k % c->r->n);
	}
	return (int)c->n;
}

static int qp_connect(struct rqp *q, const struct te_rdma_ep *p)
{
	struct rdev *d = q->dev;
	enum ibv_mtu mtu = MC_MIN(d->mtu, (enum ibv_mtu)p->mtu);
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTR,
		.path_mtu = mtu,
		.dest_qp_num = p->qpn,
		.rq_psn = p->psn,
		.max_dest_rd_atomic = (uint8_t)MC_MIN(TE_RDMA_QP_RD_ATOMIC,
						      d->attr.max_qp_rd_atom),
		.min_rnr_timer = TE_RDMA_MIN_RNR_TIMER,
		.ah_attr =
			{
				.is_global = 1,
				.grh = {.sgid_index = d->info.gid_index,
					.hop_limit = TE_RDMA_HOP_LIMIT},
				.dlid = p->lid,
				.sl = 0,
				.port_num = d->info.port,
			},
	};
	memcpy(a.ah_attr.grh.dgid.raw, p->gid, 16);
	int rc = ibv_modify_qp(q->qp, &a,
			       IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				       IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				       IBV_QP_MIN_RNR_TIMER);
	if (rc) {
		log_error("%s: QP %u to RTR (peer QP %u, MTU %u): %s", d->info.name,
			  q->qp->qp_num, p->qpn, te_rdma__mtu_bytes(mtu), strerror(rc));
		return -rc;
	}
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = TE_RDMA_QP_TIMEOUT;
	a.retry_cnt = TE_RDMA_QP_RETRY_CNT;
	a.rnr_retry = TE_RDMA_QP_RNR_RETRY;
	a.sq_psn = q->psn;
	a.max_rd_atomic = (uint8_t)MC_MIN(TE_RDMA_QP_RD_ATOMIC, d->attr.max_qp_init_rd_atom);
	rc = ibv_modify_qp(q->qp, &a,
			   IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				   IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
	if (rc) {
		log_error("%s: QP %u to RTS: %s", d->info.name, q->qp->qp_num, strerror(rc));
		return -rc;
	}
	return 0;
}

int te_rdma_conn_connect(struct te_rdma_conn *c, const struct te_rdma_ep *peer, unsigned n)
{
	if (n != c->n)
		return -EINVAL;
	for (unsigned k = 0; k < n; k++)
		if (peer[k].qpn > 0xffffff || peer[k].psn > 0xffffff ||
		    te_rdma__mtu_bytes((enum ibv_mtu)peer[k].mtu) == 0)
			return -EINVAL;
	for (unsigned k = 0; k < n; k++) {
		struct rqp *q = &c->q[k];
		pthread_mutex_lock(&q->lock);
		int rc = q->connected || q->err ? -EALREADY : qp_connect(q, &peer[k]);
		if (!rc) {
			q->connected = true;
			q->peer_qpn = peer[k].qpn;
		}
		pthread_mutex_unlock(&q->lock);
		if (rc)
			return rc;
	}
	return 0;
}

int te_rdma_conn_status(const struct te_rdma_conn *c, unsigned k)
{
	if (k >= c->n)
		return -EINVAL;
	struct rqp *q = (struct rqp *)&c->q[k];
	pthread_mutex_lock(&q->lock);
	int rc = q->err ? q->err : q->connected ? 0 : -ENOTCONN;
	pthread_mutex_unlock(&q->lock);
	return rc;
}

unsigned te_rdma_conn_sq_free(const struct te_rdma_conn *c, unsigned k)
{
	if (k >= c->n)
		return 0;
	struct rqp *q = (struct rqp *)&c->q[k];
	pthread_mutex_lock(&q->lock);
	unsigned used = (unsigned)(q->post_seq - q->done_seq);
	unsigned free_slots = used >= c->r->o.sq_depth ? 0 : c->r->o.sq_depth - used;
	pthread_mutex_unlock(&q->lock);
	return free_slots;
}

int te_rdma_post(struct te_rdma_conn *c, unsigned k, const struct te_rdma_wr *wrs, unsigned n)
{
	struct te_rdma *r = c->r;
	unsigned ring = r->o.sq_depth + 1;
	struct ibv_send_wr wr[TE_RDMA_POST_CHUNK];
	struct ibv_sge sge[TE_RDMA_POST_CHUNK];
	int rc = 0;
	if (k >= c->n || n == 0 || n > r->o.sq_depth)
		return -EINVAL;
	for (unsigned i = 0; i < n; i++)
		if ((wrs[i].op != TE_RDMA_WRITE && wrs[i].op != TE_RDMA_READ) ||
		    wrs[i].len > (1u << 31))
			return -EINVAL;
	struct rqp *q = &c->q[k];
	pthread_mutex_lock(&q->lock);
	if (q->err) {
		rc = q->err;
		goto out;
	}
	if (!q->connected) {
		rc = -ENOTCONN;
		goto out;
	}
	if (q->post_seq - q->done_seq + n > r->o.sq_depth) {
		rc = -EAGAIN;
		goto out;
	}
	for (unsigned i = 0; i < n; i += TE_RDMA_POST_CHUNK) {
		unsigned m = MC_MIN(n - i, (unsigned)TE_RDMA_POST_CHUNK);
		for (unsigned j = 0; j < m; j++) {
			const struct te_rdma_wr *w = &wrs[i + j];
			uint64_t seq = q->post_seq + j;
			bool sig = i + j == n - 1 || ++q->since_signal >= r->o.signal_every;
			if (sig)
				q->since_signal = 0;
			sge[j] = (struct ibv_sge){.addr = (uint64_t)(uintptr_t)w->local,
						  .length = w->len,
						  .lkey = w->lkey};
			wr[j] = (struct ibv_send_wr){
				.wr_id = (uint64_t)q->id << 32 | (seq & 0xffffffffu),
				.next = j + 1 < m ? &wr[j + 1] : NULL,
				.sg_list = &sge[j],
				.num_sge = 1,
				.opcode = w->op == TE_RDMA_WRITE ? IBV_WR_RDMA_WRITE
								 : IBV_WR_RDMA_READ,
				.send_flags = sig ? IBV_SEND_SIGNALED : 0,
			};
			wr[j].wr.rdma.remote_addr = w->remote;
			wr[j].wr.rdma.rkey = w->rkey;
			q->cookies[seq % ring] = w->cookie;
			q->kind[seq % ring] = WR_USER;
		}
		struct ibv_send_wr *bad = NULL;
		int e = ibv_post_send(q->qp, wr, &bad);
		unsigned accepted = m;
		if (e && bad) {
			for (accepted = 0; accepted < m && &wr[accepted] != bad; accepted++)
				;
		} else if (e) {
			accepted = 0;
		}
		q->post_seq += accepted;
		if (e) {
			/* The WRs this call did not get accepted are reported
			 * with the error; the accepted ones have no signaled
			 * tail, so the QP goes to ERR and the fence behind the
			 * unposted slots retires them all. */
			log_error("%s: QP %u: ibv_post_send: %s; the QP is put in ERR",
				  q->dev->info.name, q->qp->qp_num, strerror(e));
			for (unsigned j = i + accepted; j < n; j++) {
				unsigned slot = (unsigned)(q->post_seq % ring);
				q->cookies[slot] = wrs[j].cookie;
				q->kind[slot] = WR_UNPOSTED;
				q->unposted_err[slot] = -e;
				q->post_seq++;
			}
			q->err = -e;
			q->connected = false;
			qp_to_err_locked(r, q);
			goto out;
		}
	}
out:
	pthread_mutex_unlock(&q->lock);
	return rc;
}

void te_rdma_conn_free(struct te_rdma_conn *c)
{
	if (!c)
		return;
	for (unsigned k = c->n; k-- > 0;)
		qp_destroy(c->r, &c->q[k]);
	free(c);
}

/* ------------------------------------------------------------ wire form */

void te_rdma_ep_encode(const struct te_rdma_ep *ep, uint8_t out[TE_RDMA_EP_WIRE_BYTES])
{
	memset(out, 0, TE_RDMA_EP_WIRE_BYTES);
	memcpy(out, ep->gid, 16);
	out[16] = (uint8_t)(ep->lid >> 8);
	out[17] = (uint8_t)ep->lid;
	out[18] = (uint8_t)(ep->qpn >> 16);
	out[19] = (uint8_t)(ep->qpn >> 8);
	out[20] = (uint8_t)ep->qpn;
	out[21] = (uint8_t)(ep->psn >> 16);
	out[22] = (uint8_t)(ep->psn >> 8);
	out[23] = (uint8_t)ep->psn;
	out[24] = ep->mtu;
	out[25] = ep->port;
	out[26] = ep->nic;
	/* 27..31 reserved, zero */
}

int te_rdma_ep_decode(const uint8_t *in, size_t len, struct te_rdma_ep *ep)
{
	if (len != TE_RDMA_EP_WIRE_BYTES)
		return -EINVAL;
	for (int i = 27; i < TE_RDMA_EP_WIRE_BYTES; i++)
		if (in[i])
			return -EINVAL;
	memset(ep, 0, sizeof(*ep));
	memcpy(ep->gid, in, 16);
	ep->lid = (uint16_t)(in[16] << 8 | in[17]);
	ep->qpn = (uint32_t)in[18] << 16 | (uint32_t)in[19] << 8 | in[20];
	ep->psn = (uint32_t)in[21] << 16 | (uint32_t)in[22] << 8 | in[23];
	ep->mtu = in[24];
	ep->port = in[25];
	ep->nic = in[26];
	if (te_rdma__mtu_bytes((enum ibv_mtu)ep->mtu) == 0 || ep->port == 0 ||
	    ep->nic >= TE_RDMA_MAX_NICS)
		return -EINVAL;
	return 0;
}
