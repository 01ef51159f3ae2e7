/*
 * verbs-emu: a SOFTWARE VERBS DEVICE FOR TESTS. It is not RDMA and never
 * ships in a production binary: test builds link it instead of libibverbs
 * so that src/transfer/rdma.c runs unchanged against devices that behave
 * like RoCE NICs, across processes, on a machine without RDMA hardware.
 *
 * What it provides: the ibv_* entry points the transfer engine uses
 * (device list, open/close, query device/port/GID, PD, MR — also over a
 * dma-buf fd, ibv_reg_dmabuf_mr, as GPU memory is registered — CQ with a
 * completion channel, RC QP with the RESET/INIT/RTR/RTS/ERR state machine,
 * post_send of RDMA WRITE and READ, poll_cq) and the ops table that the
 * static inline wrappers of <infiniband/verbs.h> call through
 * (ibv_post_send, ibv_poll_cq, ibv_req_notify_cq).
 *
 * How bytes move. Every opened emulated device listens on an abstract Unix
 * socket named after its process and index ("verbs-emu-<pid>-<dev>"); its
 * GIDs encode that identity (RoCE v2 IPv4-mapped ::ffff:127.x.y.z and
 * link-local fe80::/64), so a QP that reaches RTR with a peer's GID knows
 * where the peer lives. Each QP has a worker thread that executes its send
 * queue in order: a WRITE sends a header and the payload over the QP's
 * stream to the target process, whose service thread checks the target QP
 * (exists, RTR/RTS, connected to this QP), the rkey (an MR of the target
 * QP's PD), the bounds and the access flags (MR and QP) before it copies;
 * a READ asks for the bytes under the same checks. Completions are in
 * order per QP. Errors: bad rkey, bounds or access -> IBV_WC_REM_ACCESS_ERR;
 * bad lkey or local bounds -> IBV_WC_LOC_PROT_ERR; peer process gone,
 * unreachable, not listening for this QP or silent past the QP's
 * timeout x retry_cnt (at least 5 s) -> IBV_WC_RETRY_EXC_ERR. An error
 * moves the QP to ERR; every WR behind it, and everything posted in ERR,
 * completes with IBV_WC_WR_FLUSH_ERR, signaled or not. Send-queue slots are
 * freed when a CQE covering them is polled, as on mlx5, so a consumer that
 * loses count of unsignaled WRs gets ENOMEM from post_send.
 *
 * Test knobs (environment, read by ibv_get_device_list):
 *   VERBS_EMU_DEVICES=N          emulated devices (0..4, default 1), "emu_0".. 
 *   VERBS_EMU_PORT_STATE=a,b     per device "active" (default) or "down"
 *                                (the last entry repeats)
 *   VERBS_EMU_GIDS=mode          v2v4 (default: RoCE v1/v2 link-local and
 *                                v1/v2 IPv4-mapped, mlx5 order), v2 (no
 *                                IPv4-mapped), v1 (RoCE v1 only), ib
 *                                (InfiniBand link layer, IB GIDs, a LID),
 *                                none (empty GID table)
 *   VERBS_EMU_MTU=bytes          port active MTU (default 1024)
 *   VERBS_EMU_OPEN_ERRNO=EACCES  ibv_open_device fails with that errno
 *                                (EACCES or EPERM: no permission on the
 *                                uverbs device)
 *   VERBS_EMU_MAX_MR, VERBS_EMU_MAX_QP, VERBS_EMU_MAX_QP_WR,
 *   VERBS_EMU_MAX_CQE            device limits reported and enforced
 *   VERBS_EMU_ENFORCE_MEMLOCK=1  registrations count against
 *                                RLIMIT_MEMLOCK (a process without
 *                                CAP_IPC_LOCK); ENOMEM past it
 */
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#undef ibv_get_device_list
#undef ibv_query_port
#undef ibv_reg_mr
#undef ibv_reg_mr_iova

#define EMU_MAX_DEVS 4
#define EMU_GID_TBL 8
#define EMU_MAGIC 0x56454d55u /* "VEMU" */
#define EMU_MIN_TIMEOUT_MS 5000

enum gid_mode { GIDS_V2V4, GIDS_V2, GIDS_V1, GIDS_IB, GIDS_NONE };

struct emu_qp;
struct emu_srv;

struct emu_dev {
	struct ibv_device ibdev;
	int index;
	/* configuration, from the environment */
	enum ibv_port_state port_state;
	enum ibv_mtu active_mtu;
	enum gid_mode gids;
	int open_errno;
	int max_mr, max_qp, max_qp_wr, max_cqe;
	bool enforce_memlock;
	/* runtime: lock protects everything below except the MR list */
	pthread_mutex_t lock;
	int refs;
	int listen_fd;
	int stop_fd;
	pthread_t listener;
	struct emu_srv *srvs;
	struct emu_qp *qps;
	int n_qp;
	uint32_t next_qpn;
	/* MR list: written under mr_rw exclusive, read (and remote/local
	 * copies done) under mr_rw shared, so deregistration waits for
	 * copies in flight */
	pthread_rwlock_t mr_rw;
	struct emu_mr *mrs;
	int n_mr;
	uint32_t next_key;
};

struct emu_ctx {
	struct ibv_context ctx;
	struct emu_dev *dev;
};

struct emu_mr {
	struct ibv_mr mr;  /* mr.addr: the region's first address for the NIC
			      (its iova) */
	struct emu_dev *dev;
	int access;
	uint8_t *host;     /* where the bytes at mr.addr are in this process */
	void *map;         /* a dma-buf MR's mapping of its fd, else NULL */
	size_t map_len;
	struct emu_mr *next;
};

struct emu_chan {
	struct ibv_comp_channel ch;
	int wfd;
};

struct emu_cqe {
	struct ibv_wc wc;
	struct emu_qp *qp;
	uint64_t seq;
};

struct emu_cq {
	struct ibv_cq cq;
	pthread_mutex_t lock;
	struct emu_cqe *ring;
	int cap, head, count;
	bool armed;
};

struct emu_wr {
	uint64_t wr_id;
	enum ibv_wr_opcode opcode;
	unsigned flags;
	uint64_t laddr;
	uint32_t len, lkey;
	uint64_t raddr;
	uint32_t rkey;
};

struct emu_qp {
	struct ibv_qp qp;
	struct emu_dev *dev;
	struct emu_qp *next;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	/* attributes */
	int sq_sig_all;
	uint32_t max_send_wr;
	int access;
	uint8_t port;
	enum ibv_mtu mtu;
	uint32_t dest_qpn;
	union ibv_gid dgid;
	uint8_t sgid_index;
	uint32_t rq_psn, sq_psn;
	uint8_t timeout, retry_cnt, rnr_retry;
	/* send queue: WR seq s lives in ring[s % max_send_wr]; posted
	 * [0, post_seq), executed [0, exec_seq), slots free below free_seq
	 * (advanced by poll_cq) */
	struct emu_wr *ring;
	uint64_t post_seq, exec_seq;
	_Atomic uint64_t free_seq;
	bool stop;
	pthread_t worker;
	int fd; /* stream to the target's device, -1 if none */
};

/* A connection accepted by a device's service thread. */
struct emu_srv {
	struct emu_srv *next;
	struct emu_dev *dev;
	int fd;
	pthread_t thread;
	bool done;
};

enum { OP_WRITE = 1, OP_READ = 2 };
enum { ST_OK = 0, ST_ACCESS = 1, ST_INV_REQ = 2, ST_DROP = 3 };

struct wire_hello {
	uint32_t magic, dst_qpn, src_qpn;
	uint8_t src_gid[16];
};

struct wire_req {
	uint32_t op, len, rkey, pad;
	uint64_t raddr;
};

static int emu__poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc);
static int emu__req_notify_cq(struct ibv_cq *cq, int solicited_only);
static int emu__post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
static int emu__post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
static void *qp_worker(void *arg);

/* Tells a binary it was linked with this device (mooncakectl bench
 * transfer refers to it weakly to label its figures). */
const char verbs_emu_test_device[] =
	"verbs-emu, a software verbs device for tests (bytes move through Unix sockets)";

static struct emu_dev g_devs[EMU_MAX_DEVS];
static int g_ndev;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static size_t g_locked_bytes; /* under g_lock */

/* ------------------------------------------------------------ helpers */

static int env_int(const char *name, int def)
{
	const char *s = getenv(name);
	if (!s || !*s)
		return def;
	return atoi(s);
}

/* Item idx of a comma-separated list; the last item repeats. */
static const char *list_item(const char *list, int idx, char *buf, size_t len)
{
	const char *p = list;
	for (int i = 0; i < idx; i++) {
		const char *c = strchr(p, ',');
		if (!c)
			break;
		p = c + 1;
	}
	size_t n = strcspn(p, ",");
	if (n >= len)
		n = len - 1;
	memcpy(buf, p, n);
	buf[n] = 0;
	return buf;
}

static enum ibv_mtu mtu_enum(int bytes)
{
	switch (bytes) {
	case 256: return IBV_MTU_256;
	case 512: return IBV_MTU_512;
	case 2048: return IBV_MTU_2048;
	case 4096: return IBV_MTU_4096;
	default: return IBV_MTU_1024;
	}
}

/* Identity of a device: pid (22 bits) and index (2 bits). */
static uint32_t dev_ident(const struct emu_dev *d)
{
	return ((uint32_t)getpid() & 0x3fffffu) | ((uint32_t)d->index << 22);
}

static void gid_v4(uint32_t ident, union ibv_gid *g)
{
	memset(g, 0, sizeof(*g));
	g->raw[10] = 0xff;
	g->raw[11] = 0xff;
	g->raw[12] = 127;
	g->raw[13] = (uint8_t)(ident >> 16);
	g->raw[14] = (uint8_t)(ident >> 8);
	g->raw[15] = (uint8_t)ident;
}

static void gid_ll(uint32_t ident, union ibv_gid *g)
{
	memset(g, 0, sizeof(*g));
	g->raw[0] = 0xfe;
	g->raw[1] = 0x80;
	g->raw[8] = 0x02;
	g->raw[9] = 0x56; /* 'V' */
	g->raw[12] = (uint8_t)(ident >> 24);
	g->raw[13] = (uint8_t)(ident >> 16);
	g->raw[14] = (uint8_t)(ident >> 8);
	g->raw[15] = (uint8_t)ident;
}

static int gid_to_ident(const union ibv_gid *g, uint32_t *ident)
{
	static const uint8_t v4pfx[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	if (memcmp(g->raw, v4pfx, 12) == 0 && g->raw[12] == 127) {
		*ident = (uint32_t)g->raw[13] << 16 | (uint32_t)g->raw[14] << 8 | g->raw[15];
		return 0;
	}
	if (g->raw[0] == 0xfe && g->raw[1] == 0x80 && g->raw[8] == 0x02 && g->raw[9] == 0x56) {
		*ident = (uint32_t)g->raw[12] << 24 | (uint32_t)g->raw[13] << 16 |
			 (uint32_t)g->raw[14] << 8 | g->raw[15];
		return 0;
	}
	return -1;
}

/* The GID table of a device; returns false for an empty entry. */
static bool gid_entry(const struct emu_dev *d, uint32_t idx, struct ibv_gid_entry *e)
{
	uint32_t id = dev_ident(d);
	memset(e, 0, sizeof(*e));
	e->gid_index = idx;
	e->port_num = 1;
	e->ndev_ifindex = 1;
	switch (d->gids) {
	case GIDS_V2V4:
		if (idx > 3)
			return false;
		(idx < 2 ? gid_ll : gid_v4)(id, &e->gid);
		e->gid_type = (idx & 1) ? IBV_GID_TYPE_ROCE_V2 : IBV_GID_TYPE_ROCE_V1;
		return true;
	case GIDS_V2:
		if (idx > 1)
			return false;
		gid_ll(id, &e->gid);
		e->gid_type = idx ? IBV_GID_TYPE_ROCE_V2 : IBV_GID_TYPE_ROCE_V1;
		return true;
	case GIDS_V1:
		if (idx > 1)
			return false;
		(idx ? gid_v4 : gid_ll)(id, &e->gid);
		e->gid_type = IBV_GID_TYPE_ROCE_V1;
		return true;
	case GIDS_IB:
		if (idx > 0)
			return false;
		gid_ll(id, &e->gid);
		e->gid_type = IBV_GID_TYPE_IB;
		e->ndev_ifindex = 0;
		return true;
	case GIDS_NONE:
		return false;
	}
	return false;
}

static void sock_name(uint32_t ident, struct sockaddr_un *sa, socklen_t *len)
{
	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	int n = snprintf(sa->sun_path + 1, sizeof(sa->sun_path) - 1, "verbs-emu-%u-%u",
			 ident & 0x3fffffu, ident >> 22);
	*len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

static int io_full(int fd, void *buf, size_t len, bool wr)
{
	char *p = buf;
	while (len) {
		ssize_t n = wr ? send(fd, p, len, MSG_NOSIGNAL) : recv(fd, p, len, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

static int drain(int fd, size_t len)
{
	char buf[4096];
	while (len) {
		size_t n = len < sizeof(buf) ? len : sizeof(buf);
		if (io_full(fd, buf, n, false))
			return -1;
		len -= n;
	}
	return 0;
}

/* Under dev->mr_rw (shared or exclusive). */
static struct emu_mr *mr_find(struct emu_dev *d, uint32_t key)
{
	for (struct emu_mr *m = d->mrs; m; m = m->next)
		if (m->mr.lkey == key)
			return m;
	return NULL;
}

static bool mr_covers(const struct emu_mr *m, uint64_t addr, uint64_t len)
{
	uint64_t base = (uint64_t)(uintptr_t)m->mr.addr;
	return addr >= base && len <= m->mr.length && addr - base <= m->mr.length - len;
}

/* The bytes at NIC address addr of m (mr_covers checked). */
static void *mr_host(const struct emu_mr *m, uint64_t addr)
{
	return m->host + (addr - (uint64_t)(uintptr_t)m->mr.addr);
}

/* ------------------------------------------------------------ target side */

/* Under d->lock. */
static struct emu_qp *qp_find(struct emu_dev *d, uint32_t qpn)
{
	for (struct emu_qp *q = d->qps; q; q = q->next)
		if (q->qp.qp_num == qpn)
			return q;
	return NULL;
}

static int srv_check(struct emu_srv *s, const struct wire_hello *h, const struct wire_req *r,
		     struct emu_mr **mr_out)
{
	struct emu_dev *d = s->dev;
	struct ibv_pd *pd;
	int qp_access;
	pthread_mutex_lock(&d->lock);
	struct emu_qp *q = qp_find(d, h->dst_qpn);
	bool ok = q && (q->qp.state == IBV_QPS_RTR || q->qp.state == IBV_QPS_RTS) &&
		  q->dest_qpn == h->src_qpn && memcmp(q->dgid.raw, h->src_gid, 16) == 0;
	pd = q ? q->qp.pd : NULL;
	qp_access = q ? q->access : 0;
	pthread_mutex_unlock(&d->lock);
	if (!ok)
		return ST_DROP; /* no such connected QP: the packet is dropped */
	if (r->op != OP_WRITE && r->op != OP_READ)
		return ST_INV_REQ;
	int need = r->op == OP_WRITE ? IBV_ACCESS_REMOTE_WRITE : IBV_ACCESS_REMOTE_READ;
	if (!(qp_access & need))
		return ST_ACCESS;
	struct emu_mr *m = mr_find(d, r->rkey);
	if (!m || m->mr.pd != pd || !(m->access & need) || !mr_covers(m, r->raddr, r->len))
		return ST_ACCESS;
	*mr_out = m;
	return ST_OK;
}

static void *srv_main(void *arg)
{
	struct emu_srv *s = arg;
	struct emu_dev *d = s->dev;
	struct wire_hello h;
	struct wire_req r;
	if (io_full(s->fd, &h, sizeof(h), false) || h.magic != EMU_MAGIC)
		goto out;
	for (;;) {
		struct emu_mr *m = NULL;
		uint32_t st;
		if (io_full(s->fd, &r, sizeof(r), false))
			break;
		pthread_rwlock_rdlock(&d->mr_rw);
		st = (uint32_t)srv_check(s, &h, &r, &m);
		if (st == ST_DROP) {
			pthread_rwlock_unlock(&d->mr_rw);
			(void)io_full(s->fd, &st, sizeof(st), true);
			break;
		}
		int rc = 0;
		if (r.op == OP_WRITE) {
			rc = st == ST_OK ? io_full(s->fd, mr_host(m, r.raddr), r.len, false)
					 : drain(s->fd, r.len);
			if (!rc)
				rc = io_full(s->fd, &st, sizeof(st), true);
		} else {
			rc = io_full(s->fd, &st, sizeof(st), true);
			if (!rc && st == ST_OK)
				rc = io_full(s->fd, mr_host(m, r.raddr), r.len, true);
		}
		pthread_rwlock_unlock(&d->mr_rw);
		if (rc)
			break;
	}
out:
	pthread_mutex_lock(&d->lock);
	s->done = true;
	pthread_mutex_unlock(&d->lock);
	return NULL;
}

/* Under d->lock: join finished service threads. */
static void srv_reap_locked(struct emu_dev *d, bool all)
{
	struct emu_srv **pp = &d->srvs;
	while (*pp) {
		struct emu_srv *s = *pp;
		if (!all && !s->done) {
			pp = &s->next;
			continue;
		}
		*pp = s->next;
		shutdown(s->fd, SHUT_RDWR);
		pthread_mutex_unlock(&d->lock);
		pthread_join(s->thread, NULL);
		pthread_mutex_lock(&d->lock);
		close(s->fd);
		free(s);
	}
}

static void *listener_main(void *arg)
{
	struct emu_dev *d = arg;
	struct pollfd p[2] = {{.fd = d->listen_fd, .events = POLLIN}, {.fd = d->stop_fd, .events = POLLIN}};
	for (;;) {
		if (poll(p, 2, -1) < 0 && errno != EINTR)
			break;
		if (p[1].revents)
			break;
		if (!(p[0].revents & POLLIN))
			continue;
		int fd = accept4(d->listen_fd, NULL, NULL, SOCK_CLOEXEC);
		if (fd < 0)
			continue;
		struct emu_srv *s = calloc(1, sizeof(*s));
		if (!s) {
			close(fd);
			continue;
		}
		s->dev = d;
		s->fd = fd;
		pthread_mutex_lock(&d->lock);
		srv_reap_locked(d, false);
		if (pthread_create(&s->thread, NULL, srv_main, s) != 0) {
			pthread_mutex_unlock(&d->lock);
			close(fd);
			free(s);
			continue;
		}
		s->next = d->srvs;
		d->srvs = s;
		pthread_mutex_unlock(&d->lock);
	}
	return NULL;
}

static int dev_start(struct emu_dev *d)
{
	struct sockaddr_un sa;
	socklen_t len;
	d->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (d->listen_fd < 0)
		return -1;
	sock_name(dev_ident(d), &sa, &len);
	if (bind(d->listen_fd, (struct sockaddr *)&sa, len) || listen(d->listen_fd, 128))
		goto fail_sock;
	d->stop_fd = eventfd(0, EFD_CLOEXEC);
	if (d->stop_fd < 0)
		goto fail_sock;
	if (pthread_create(&d->listener, NULL, listener_main, d))
		goto fail_efd;
	return 0;
fail_efd:
	close(d->stop_fd);
fail_sock:
	close(d->listen_fd);
	return -1;
}

static void dev_stop(struct emu_dev *d)
{
	uint64_t one = 1;
	if (write(d->stop_fd, &one, sizeof(one)) < 0)
		abort();
	pthread_join(d->listener, NULL);
	close(d->listen_fd);
	close(d->stop_fd);
	pthread_mutex_lock(&d->lock);
	srv_reap_locked(d, true);
	pthread_mutex_unlock(&d->lock);
}

/* ------------------------------------------------------------ devices */

struct ibv_device **ibv_get_device_list(int *num)
{
	pthread_mutex_lock(&g_lock);
	bool busy = false;
	for (int i = 0; i < g_ndev; i++)
		busy |= g_devs[i].refs > 0;
	if (!busy) {
		int n = env_int("VERBS_EMU_DEVICES", 1);
		g_ndev = n < 0 ? 0 : n > EMU_MAX_DEVS ? EMU_MAX_DEVS : n;
		const char *states = getenv("VERBS_EMU_PORT_STATE");
		const char *gids = getenv("VERBS_EMU_GIDS");
		const char *oe = getenv("VERBS_EMU_OPEN_ERRNO");
		for (int i = 0; i < g_ndev; i++) {
			struct emu_dev *d = &g_devs[i];
			char buf[32];
			memset(d, 0, sizeof(*d));
			d->index = i;
			d->ibdev.node_type = IBV_NODE_CA;
			d->ibdev.transport_type = IBV_TRANSPORT_IB;
			snprintf(d->ibdev.name, sizeof(d->ibdev.name), "emu_%d", i);
			snprintf(d->ibdev.dev_name, sizeof(d->ibdev.dev_name), "uverbs-emu%d", i);
			snprintf(d->ibdev.dev_path, sizeof(d->ibdev.dev_path), "/nonexistent/verbs-emu/%d", i);
			snprintf(d->ibdev.ibdev_path, sizeof(d->ibdev.ibdev_path), "/nonexistent/verbs-emu/%d", i);
			d->port_state = states && strcmp(list_item(states, i, buf, sizeof(buf)), "down") == 0
						? IBV_PORT_DOWN : IBV_PORT_ACTIVE;
			d->gids = GIDS_V2V4;
			if (gids && strcmp(gids, "v2") == 0)
				d->gids = GIDS_V2;
			else if (gids && strcmp(gids, "v1") == 0)
				d->gids = GIDS_V1;
			else if (gids && strcmp(gids, "ib") == 0)
				d->gids = GIDS_IB;
			else if (gids && strcmp(gids, "none") == 0)
				d->gids = GIDS_NONE;
			d->active_mtu = mtu_enum(env_int("VERBS_EMU_MTU", 1024));
			d->open_errno = !oe ? 0 : strcmp(oe, "EPERM") == 0 ? EPERM
						: strcmp(oe, "EACCES") == 0 ? EACCES : 0;
			d->max_mr = env_int("VERBS_EMU_MAX_MR", 1 << 20);
			d->max_qp = env_int("VERBS_EMU_MAX_QP", 1 << 16);
			d->max_qp_wr = env_int("VERBS_EMU_MAX_QP_WR", 1 << 15);
			d->max_cqe = env_int("VERBS_EMU_MAX_CQE", 1 << 22);
			d->enforce_memlock = env_int("VERBS_EMU_ENFORCE_MEMLOCK", 0) != 0;
			d->next_qpn = 0x100;
			d->next_key = 0x1000;
			pthread_mutex_init(&d->lock, NULL);
			pthread_rwlock_init(&d->mr_rw, NULL);
		}
	}
	struct ibv_device **list = calloc((size_t)g_ndev + 1, sizeof(*list));
	if (list)
		for (int i = 0; i < g_ndev; i++)
			list[i] = &g_devs[i].ibdev;
	if (num)
		*num = list ? g_ndev : 0;
	pthread_mutex_unlock(&g_lock);
	if (!list)
		errno = ENOMEM;
	return list;
}

void ibv_free_device_list(struct ibv_device **list) { free(list); }

const char *ibv_get_device_name(struct ibv_device *device) { return device->name; }

static struct emu_dev *dev_of(struct ibv_context *c) { return ((struct emu_ctx *)c)->dev; }

struct ibv_context *ibv_open_device(struct ibv_device *device)
{
	struct emu_dev *d = (struct emu_dev *)device;
	if (d->open_errno) {
		errno = d->open_errno;
		return NULL;
	}
	struct emu_ctx *c = calloc(1, sizeof(*c));
	if (!c) {
		errno = ENOMEM;
		return NULL;
	}
	pthread_mutex_lock(&g_lock);
	if (d->refs == 0 && dev_start(d)) {
		int e = errno;
		pthread_mutex_unlock(&g_lock);
		free(c);
		errno = e;
		return NULL;
	}
	d->refs++;
	pthread_mutex_unlock(&g_lock);
	c->dev = d;
	c->ctx.device = device;
	c->ctx.cmd_fd = -1;
	c->ctx.async_fd = -1;
	c->ctx.num_comp_vectors = 1;
	c->ctx.abi_compat = NULL; /* not extended: inline wrappers call the exported verbs */
	pthread_mutex_init(&c->ctx.mutex, NULL);
	c->ctx.ops.poll_cq = emu__poll_cq;
	c->ctx.ops.req_notify_cq = emu__req_notify_cq;
	c->ctx.ops.post_send = emu__post_send;
	c->ctx.ops.post_recv = emu__post_recv;
	return &c->ctx;
}

int ibv_close_device(struct ibv_context *context)
{
	struct emu_dev *d = dev_of(context);
	pthread_mutex_lock(&g_lock);
	if (--d->refs == 0)
		dev_stop(d);
	pthread_mutex_unlock(&g_lock);
	pthread_mutex_destroy(&context->mutex);
	free(context);
	return 0;
}

int ibv_query_device(struct ibv_context *context, struct ibv_device_attr *a)
{
	struct emu_dev *d = dev_of(context);
	memset(a, 0, sizeof(*a));
	snprintf(a->fw_ver, sizeof(a->fw_ver), "verbs-emu (software test device)");
	a->node_guid = dev_ident(d);
	a->max_mr_size = UINT64_MAX;
	a->page_size_cap = 4096;
	a->max_qp = d->max_qp;
	a->max_qp_wr = d->max_qp_wr;
	a->max_sge = 1;
	a->max_sge_rd = 1;
	a->max_cq = 1 << 16;
	a->max_cqe = d->max_cqe;
	a->max_mr = d->max_mr;
	a->max_pd = 1 << 16;
	a->max_qp_rd_atom = 16;
	a->max_qp_init_rd_atom = 16;
	a->max_res_rd_atom = 1 << 20;
	a->phys_port_cnt = 1;
	return 0;
}

int ibv_query_port(struct ibv_context *context, uint8_t port, struct _compat_ibv_port_attr *out)
{
	struct emu_dev *d = dev_of(context);
	struct ibv_port_attr *a = (struct ibv_port_attr *)out;
	if (port != 1)
		return EINVAL;
	a->state = d->port_state;
	a->max_mtu = IBV_MTU_4096;
	a->active_mtu = d->port_state == IBV_PORT_ACTIVE ? d->active_mtu : IBV_MTU_256;
	a->gid_tbl_len = EMU_GID_TBL;
	a->max_msg_sz = 1u << 31;
	a->pkey_tbl_len = 1;
	a->lid = d->gids == GIDS_IB ? (uint16_t)(d->index + 1) : 0;
	a->active_width = 2;
	a->active_speed = 32;
	a->phys_state = d->port_state == IBV_PORT_ACTIVE ? 5 : 3;
	a->link_layer = d->gids == GIDS_IB ? IBV_LINK_LAYER_INFINIBAND : IBV_LINK_LAYER_ETHERNET;
	return 0;
}

int _ibv_query_gid_ex(struct ibv_context *context, uint32_t port, uint32_t idx,
		      struct ibv_gid_entry *entry, uint32_t flags, size_t entry_size)
{
	if (port != 1 || flags || entry_size < sizeof(*entry) || idx >= EMU_GID_TBL)
		return EINVAL;
	return gid_entry(dev_of(context), idx, entry) ? 0 : ENODATA;
}

int ibv_query_gid(struct ibv_context *context, uint8_t port, int index, union ibv_gid *gid)
{
	struct ibv_gid_entry e;
	if (port != 1 || index < 0 || index >= EMU_GID_TBL) {
		errno = EINVAL;
		return -1;
	}
	if (!gid_entry(dev_of(context), (uint32_t)index, &e))
		memset(&e.gid, 0, sizeof(e.gid));
	*gid = e.gid;
	return 0;
}

const char *ibv_wc_status_str(enum ibv_wc_status st)
{
	static const char *const s[] = {
		[IBV_WC_SUCCESS] = "success",
		[IBV_WC_LOC_LEN_ERR] = "local length error",
		[IBV_WC_LOC_QP_OP_ERR] = "local QP operation error",
		[IBV_WC_LOC_PROT_ERR] = "local protection error",
		[IBV_WC_WR_FLUSH_ERR] = "Work Request Flushed Error",
		[IBV_WC_REM_INV_REQ_ERR] = "remote invalid request error",
		[IBV_WC_REM_ACCESS_ERR] = "remote access error",
		[IBV_WC_REM_OP_ERR] = "remote operation error",
		[IBV_WC_RETRY_EXC_ERR] = "transport retry counter exceeded",
		[IBV_WC_RNR_RETRY_EXC_ERR] = "RNR retry counter exceeded",
	};
	if ((unsigned)st < sizeof(s) / sizeof(s[0]) && s[st])
		return s[st];
	return "unknown";
}

const char *ibv_port_state_str(enum ibv_port_state st)
{
	static const char *const s[] = {"NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER"};
	return (unsigned)st < sizeof(s) / sizeof(s[0]) ? s[st] : "invalid state";
}

/* ------------------------------------------------------------ PD, MR */

struct ibv_pd *ibv_alloc_pd(struct ibv_context *context)
{
	struct ibv_pd *pd = calloc(1, sizeof(*pd));
	if (!pd) {
		errno = ENOMEM;
		return NULL;
	}
	pd->context = context;
	return pd;
}

int ibv_dealloc_pd(struct ibv_pd *pd)
{
	free(pd);
	return 0;
}

/* Add an MR of length bytes known to the NIC from iova, whose bytes are at
 * host here; map/map_len: a mapping the MR owns (NULL: none). */
static struct ibv_mr *mr_add(struct ibv_pd *pd, uint64_t iova, uint8_t *host, size_t length,
			     unsigned access, void *map, size_t map_len)
{
	struct emu_dev *d = dev_of(pd->context);
	int err = 0;
	if (length == 0 ||
	    ((access & (IBV_ACCESS_REMOTE_WRITE)) && !(access & IBV_ACCESS_LOCAL_WRITE)))
		err = EINVAL;
	struct emu_mr *m = err ? NULL : calloc(1, sizeof(*m));
	if (!err && !m)
		err = ENOMEM;
	if (err)
		goto fail;
	pthread_rwlock_wrlock(&d->mr_rw);
	if (d->n_mr >= d->max_mr) {
		err = ENOMEM;
	} else if (d->enforce_memlock) {
		struct rlimit rl;
		getrlimit(RLIMIT_MEMLOCK, &rl);
		pthread_mutex_lock(&g_lock);
		if (rl.rlim_cur != RLIM_INFINITY && g_locked_bytes + length > rl.rlim_cur)
			err = ENOMEM;
		else
			g_locked_bytes += length;
		pthread_mutex_unlock(&g_lock);
	}
	if (!err) {
		m->dev = d;
		m->access = (int)access;
		m->host = host;
		m->map = map;
		m->map_len = map_len;
		m->mr.context = pd->context;
		m->mr.pd = pd;
		m->mr.addr = (void *)(uintptr_t)iova;
		m->mr.length = length;
		m->mr.lkey = m->mr.rkey = (d->next_key++ << 8) | 0x5a;
		m->mr.handle = d->next_key;
		m->next = d->mrs;
		d->mrs = m;
		d->n_mr++;
	}
	pthread_rwlock_unlock(&d->mr_rw);
	if (err) {
		free(m);
		goto fail;
	}
	return &m->mr;
fail:
	errno = err;
	return NULL;
}

struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
				unsigned int access)
{
	if (iova != (uint64_t)(uintptr_t)addr || !addr) {
		errno = EINVAL;
		return NULL;
	}
	return mr_add(pd, iova, addr, length, access, NULL, 0);
}

struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
	return ibv_reg_mr_iova2(pd, addr, length, (uint64_t)(uintptr_t)addr, (unsigned)access);
}

/*
 * A dma-buf MR: [offset, offset + length) of the dma-buf fd, known to the
 * NIC from iova. A real NIC reaches the exporter's memory (a GPU's) by DMA;
 * the emulator maps the fd to move the bytes, so any fd that mmap accepts
 * stands in for a dma-buf (the tests use a memfd, as the client library's
 * GPU path would hand a CUDA dma-buf over). The MR keeps its own mapping:
 * the caller may close fd after registering, as with a real dma-buf.
 */
struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length,
				 uint64_t iova, int fd, int access)
{
	long pg = sysconf(_SC_PAGESIZE);
	uint64_t head = offset & (uint64_t)(pg - 1);
	if (fd < 0 || length == 0 || length > SIZE_MAX - head) {
		errno = EINVAL;
		return NULL;
	}
	size_t map_len = (size_t)head + length;
	void *map = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
			 (off_t)(offset - head));
	if (map == MAP_FAILED)
		return NULL; /* errno: EBADF, EACCES, ENODEV (not mappable) */
	struct ibv_mr *mr = mr_add(pd, iova, (uint8_t *)map + head, length, (unsigned)access,
				   map, map_len);
	if (!mr) {
		int e = errno;
		munmap(map, map_len);
		errno = e;
	}
	return mr;
}

int ibv_dereg_mr(struct ibv_mr *mr)
{
	struct emu_mr *m = (struct emu_mr *)mr;
	struct emu_dev *d = m->dev;
	pthread_rwlock_wrlock(&d->mr_rw);
	for (struct emu_mr **pp = &d->mrs; *pp; pp = &(*pp)->next)
		if (*pp == m) {
			*pp = m->next;
			break;
		}
	d->n_mr--;
	if (d->enforce_memlock) {
		pthread_mutex_lock(&g_lock);
		g_locked_bytes -= mr->length;
		pthread_mutex_unlock(&g_lock);
	}
	pthread_rwlock_unlock(&d->mr_rw);
	if (m->map)
		munmap(m->map, m->map_len);
	free(m);
	return 0;
}

/* ------------------------------------------------------------ CQ */

struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *context)
{
	struct emu_chan *c = calloc(1, sizeof(*c));
	int p[2];
	if (!c || pipe2(p, O_CLOEXEC)) {
		free(c);
		errno = ENOMEM;
		return NULL;
	}
	c->ch.context = context;
	c->ch.fd = p[0]; /* events are read here ... */
	c->wfd = p[1];   /* ... and written here, one CQ pointer each */
	c->ch.refcnt = 0;
	return &c->ch;
}

int ibv_destroy_comp_channel(struct ibv_comp_channel *ch)
{
	struct emu_chan *c = (struct emu_chan *)ch;
	close(c->ch.fd);
	close(c->wfd);
	free(c);
	return 0;
}

struct ibv_cq *ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context,
			     struct ibv_comp_channel *channel, int comp_vector)
{
	struct emu_dev *d = dev_of(context);
	if (cqe < 1 || cqe > d->max_cqe || comp_vector != 0) {
		errno = EINVAL;
		return NULL;
	}
	struct emu_cq *c = calloc(1, sizeof(*c));
	if (c)
		c->ring = calloc((size_t)cqe, sizeof(*c->ring));
	if (!c || !c->ring) {
		if (c)
			free(c);
		errno = ENOMEM;
		return NULL;
	}
	c->cap = cqe;
	c->cq.context = context;
	c->cq.channel = channel;
	c->cq.cq_context = cq_context;
	c->cq.cqe = cqe;
	pthread_mutex_init(&c->lock, NULL);
	pthread_mutex_init(&c->cq.mutex, NULL);
	pthread_cond_init(&c->cq.cond, NULL);
	return &c->cq;
}

int ibv_destroy_cq(struct ibv_cq *cq)
{
	struct emu_cq *c = (struct emu_cq *)cq;
	pthread_mutex_destroy(&c->lock);
	pthread_mutex_destroy(&cq->mutex);
	pthread_cond_destroy(&cq->cond);
	free(c->ring);
	free(c);
	return 0;
}

static void cq_push(struct emu_qp *q, struct emu_cq *c, const struct emu_wr *w, uint64_t seq,
		    enum ibv_wc_status st)
{
	pthread_mutex_lock(&c->lock);
	if (c->count == c->cap) {
		/* CQ overrun: real devices raise IBV_EVENT_CQ_ERR and the CQ
		 * is unusable; here it is reported and the entry is lost */
		fprintf(stderr, "verbs-emu: CQ overrun (cqe=%d) on %s\n", c->cap,
			q->dev->ibdev.name);
		pthread_mutex_unlock(&c->lock);
		return;
	}
	struct emu_cqe *e = &c->ring[(c->head + c->count) % c->cap];
	memset(e, 0, sizeof(*e));
	e->wc.wr_id = w->wr_id;
	e->wc.status = st;
	e->wc.opcode = w->opcode == IBV_WR_RDMA_READ ? IBV_WC_RDMA_READ : IBV_WC_RDMA_WRITE;
	e->wc.vendor_err = st ? 0x51 : 0;
	e->wc.byte_len = st ? 0 : w->len;
	e->wc.qp_num = q->qp.qp_num;
	e->qp = q;
	e->seq = seq;
	c->count++;
	bool notify = c->armed && c->cq.channel;
	c->armed = false;
	pthread_mutex_unlock(&c->lock);
	if (notify) {
		struct ibv_cq *p = &c->cq;
		if (write(((struct emu_chan *)c->cq.channel)->wfd, &p, sizeof(p)) != (ssize_t)sizeof(p))
			fprintf(stderr, "verbs-emu: completion event lost\n");
	}
}

static int emu__poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
	struct emu_cq *c = (struct emu_cq *)cq;
	int got = 0;
	pthread_mutex_lock(&c->lock);
	while (got < n && c->count) {
		struct emu_cqe *e = &c->ring[c->head];
		wc[got++] = e->wc;
		/* this CQE frees its WR's slot and every slot before it */
		atomic_store(&e->qp->free_seq, e->seq + 1);
		c->head = (c->head + 1) % c->cap;
		c->count--;
	}
	pthread_mutex_unlock(&c->lock);
	return got;
}

static int emu__req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
	struct emu_cq *c = (struct emu_cq *)cq;
	(void)solicited_only;
	if (!cq->channel)
		return EINVAL;
	pthread_mutex_lock(&c->lock);
	c->armed = true;
	pthread_mutex_unlock(&c->lock);
	return 0;
}

int ibv_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq, void **cq_context)
{
	struct ibv_cq *p;
	ssize_t n;
	do
		n = read(channel->fd, &p, sizeof(p));
	while (n < 0 && errno == EINTR);
	if (n != (ssize_t)sizeof(p))
		return -1;
	*cq = p;
	*cq_context = p->cq_context;
	return 0;
}

void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents)
{
	pthread_mutex_lock(&cq->mutex);
	cq->comp_events_completed += nevents;
	pthread_mutex_unlock(&cq->mutex);
}

/* ------------------------------------------------------------ QP */


struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *a)
{
	struct emu_dev *d = dev_of(pd->context);
	int err = 0;
	if (a->qp_type != IBV_QPT_RC || !a->send_cq || !a->recv_cq || a->srq ||
	    a->cap.max_send_wr == 0 || a->cap.max_send_wr > (uint32_t)d->max_qp_wr ||
	    a->cap.max_send_sge > 1 || a->cap.max_recv_sge > 1 ||
	    a->cap.max_recv_wr > (uint32_t)d->max_qp_wr)
		err = EINVAL;
	struct emu_qp *q = err ? NULL : calloc(1, sizeof(*q));
	if (!err && q)
		q->ring = calloc(a->cap.max_send_wr, sizeof(*q->ring));
	if (!err && (!q || !q->ring))
		err = ENOMEM;
	if (err)
		goto fail;
	pthread_mutex_lock(&d->lock);
	if (d->n_qp >= d->max_qp) {
		pthread_mutex_unlock(&d->lock);
		err = ENOMEM;
		goto fail;
	}
	q->dev = d;
	q->qp.context = pd->context;
	q->qp.qp_context = a->qp_context;
	q->qp.pd = pd;
	q->qp.send_cq = a->send_cq;
	q->qp.recv_cq = a->recv_cq;
	q->qp.qp_num = d->next_qpn++ & 0xffffff;
	q->qp.state = IBV_QPS_RESET;
	q->qp.qp_type = IBV_QPT_RC;
	q->sq_sig_all = a->sq_sig_all;
	q->max_send_wr = a->cap.max_send_wr;
	q->fd = -1;
	pthread_mutex_init(&q->lock, NULL);
	pthread_cond_init(&q->cond, NULL);
	pthread_mutex_init(&q->qp.mutex, NULL);
	pthread_cond_init(&q->qp.cond, NULL);
	if (pthread_create(&q->worker, NULL, qp_worker, q)) {
		pthread_mutex_unlock(&d->lock);
		err = EAGAIN;
		goto fail;
	}
	q->next = d->qps;
	d->qps = q;
	d->n_qp++;
	pthread_mutex_unlock(&d->lock);
	a->cap.max_inline_data = 0;
	return &q->qp;
fail:
	if (q)
		free(q->ring);
	free(q);
	errno = err;
	return NULL;
}

int ibv_destroy_qp(struct ibv_qp *qp)
{
	struct emu_qp *q = (struct emu_qp *)qp;
	struct emu_dev *d = q->dev;
	pthread_mutex_lock(&d->lock);
	for (struct emu_qp **pp = &d->qps; *pp; pp = &(*pp)->next)
		if (*pp == q) {
			*pp = q->next;
			break;
		}
	d->n_qp--;
	pthread_mutex_unlock(&d->lock);
	pthread_mutex_lock(&q->lock);
	q->stop = true;
	if (q->fd >= 0)
		shutdown(q->fd, SHUT_RDWR);
	pthread_cond_broadcast(&q->cond);
	pthread_mutex_unlock(&q->lock);
	pthread_join(q->worker, NULL);
	/* remove this QP's completions from its CQ, as mlx5 does */
	struct emu_cq *c = (struct emu_cq *)qp->send_cq;
	pthread_mutex_lock(&c->lock);
	int keep = 0;
	for (int i = 0; i < c->count; i++) {
		struct emu_cqe e = c->ring[(c->head + i) % c->cap];
		if (e.qp != q)
			c->ring[(c->head + keep++) % c->cap] = e;
	}
	c->count = keep;
	pthread_mutex_unlock(&c->lock);
	if (q->fd >= 0)
		close(q->fd);
	pthread_mutex_destroy(&q->lock);
	pthread_cond_destroy(&q->cond);
	pthread_mutex_destroy(&qp->mutex);
	pthread_cond_destroy(&qp->cond);
	free(q->ring);
	free(q);
	return 0;
}

static bool valid_transition(enum ibv_qp_state cur, enum ibv_qp_state next, int mask)
{
	const int init_req = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
	const int rtr_req = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			    IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	const int rts_req = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			    IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;
	if (next == IBV_QPS_RESET || next == IBV_QPS_ERR)
		return true;
	switch (cur) {
	case IBV_QPS_RESET:
		return next == IBV_QPS_INIT && (mask & init_req) == init_req;
	case IBV_QPS_INIT:
		if (next == IBV_QPS_INIT)
			return true;
		return next == IBV_QPS_RTR && (mask & rtr_req) == rtr_req;
	case IBV_QPS_RTR:
		return next == IBV_QPS_RTS && (mask & rts_req) == rts_req;
	case IBV_QPS_RTS:
		return next == IBV_QPS_RTS;
	default:
		return false;
	}
}

int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask)
{
	struct emu_qp *q = (struct emu_qp *)qp;
	struct emu_dev *d = q->dev;
	pthread_mutex_lock(&q->lock);
	enum ibv_qp_state cur = qp->state;
	enum ibv_qp_state next = (mask & IBV_QP_STATE) ? a->qp_state : cur;
	int err = 0;
	if ((mask & IBV_QP_CUR_STATE) && a->cur_qp_state != cur)
		err = EINVAL;
	else if (!valid_transition(cur, next, mask))
		err = EINVAL;
	else if ((mask & IBV_QP_PORT) && a->port_num != 1)
		err = EINVAL;
	else if ((mask & IBV_QP_PKEY_INDEX) && a->pkey_index != 0)
		err = EINVAL;
	else if ((mask & IBV_QP_PATH_MTU) &&
		 (a->path_mtu < IBV_MTU_256 || a->path_mtu > d->active_mtu))
		err = EINVAL;
	else if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && a->max_rd_atomic > 16)
		err = EINVAL;
	else if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && a->max_dest_rd_atomic > 16)
		err = EINVAL;
	else if ((mask & IBV_QP_TIMEOUT) && a->timeout > 31)
		err = EINVAL;
	else if ((mask & IBV_QP_RETRY_CNT) && a->retry_cnt > 7)
		err = EINVAL;
	else if ((mask & IBV_QP_RNR_RETRY) && a->rnr_retry > 7)
		err = EINVAL;
	else if (mask & IBV_QP_AV) {
		struct ibv_gid_entry e;
		const struct ibv_ah_attr *ah = &a->ah_attr;
		if (ah->port_num != 1 || !ah->is_global || ah->grh.hop_limit == 0 ||
		    !gid_entry(d, ah->grh.sgid_index, &e))
			err = EINVAL; /* RoCE needs a GRH with a valid source GID */
	}
	if (err) {
		pthread_mutex_unlock(&q->lock);
		return err;
	}
	if (mask & IBV_QP_ACCESS_FLAGS)
		q->access = (int)a->qp_access_flags;
	if (mask & IBV_QP_PORT)
		q->port = a->port_num;
	if (mask & IBV_QP_PATH_MTU)
		q->mtu = a->path_mtu;
	if (mask & IBV_QP_DEST_QPN)
		q->dest_qpn = a->dest_qp_num;
	if (mask & IBV_QP_AV) {
		q->dgid = a->ah_attr.grh.dgid;
		q->sgid_index = a->ah_attr.grh.sgid_index;
	}
	if (mask & IBV_QP_RQ_PSN)
		q->rq_psn = a->rq_psn;
	if (mask & IBV_QP_SQ_PSN)
		q->sq_psn = a->sq_psn;
	if (mask & IBV_QP_TIMEOUT)
		q->timeout = a->timeout;
	if (mask & IBV_QP_RETRY_CNT)
		q->retry_cnt = a->retry_cnt;
	if (mask & IBV_QP_RNR_RETRY)
		q->rnr_retry = a->rnr_retry;
	pthread_mutex_lock(&d->lock); /* the service threads read state */
	qp->state = next;
	pthread_mutex_unlock(&d->lock);
	if (next == IBV_QPS_ERR && q->fd >= 0)
		shutdown(q->fd, SHUT_RDWR); /* the WR in flight is flushed too */
	if (next == IBV_QPS_RESET) {
		q->post_seq = q->exec_seq = 0;
		atomic_store(&q->free_seq, 0);
		if (q->fd >= 0) {
			close(q->fd);
			q->fd = -1;
		}
	}
	pthread_cond_broadcast(&q->cond);
	pthread_mutex_unlock(&q->lock);
	return 0;
}

int ibv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask, struct ibv_qp_init_attr *init)
{
	struct emu_qp *q = (struct emu_qp *)qp;
	(void)mask;
	pthread_mutex_lock(&q->lock);
	memset(a, 0, sizeof(*a));
	a->qp_state = a->cur_qp_state = qp->state;
	a->path_mtu = q->mtu;
	a->dest_qp_num = q->dest_qpn;
	a->rq_psn = q->rq_psn;
	a->sq_psn = q->sq_psn;
	a->qp_access_flags = (unsigned)q->access;
	a->port_num = q->port;
	a->timeout = q->timeout;
	a->retry_cnt = q->retry_cnt;
	a->rnr_retry = q->rnr_retry;
	a->cap.max_send_wr = q->max_send_wr;
	a->cap.max_send_sge = 1;
	if (init) {
		memset(init, 0, sizeof(*init));
		init->send_cq = qp->send_cq;
		init->recv_cq = qp->recv_cq;
		init->cap = a->cap;
		init->qp_type = IBV_QPT_RC;
		init->sq_sig_all = q->sq_sig_all;
	}
	pthread_mutex_unlock(&q->lock);
	return 0;
}

static int emu__post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	struct emu_qp *q = (struct emu_qp *)qp;
	int err = 0;
	pthread_mutex_lock(&q->lock);
	if (qp->state != IBV_QPS_RTS && qp->state != IBV_QPS_ERR)
		err = EINVAL; /* nothing can be sent before RTS */
	for (; wr && !err; wr = wr->next) {
		if ((wr->opcode != IBV_WR_RDMA_WRITE && wr->opcode != IBV_WR_RDMA_READ) ||
		    wr->num_sge != 1 || (wr->send_flags & IBV_SEND_INLINE) ||
		    wr->sg_list[0].length > (1u << 31)) {
			err = EINVAL;
			break;
		}
		if (q->post_seq - atomic_load(&q->free_seq) >= q->max_send_wr) {
			err = ENOMEM; /* send queue full */
			break;
		}
		struct emu_wr *w = &q->ring[q->post_seq % q->max_send_wr];
		w->wr_id = wr->wr_id;
		w->opcode = wr->opcode;
		w->flags = wr->send_flags | (q->sq_sig_all ? IBV_SEND_SIGNALED : 0);
		w->laddr = wr->sg_list[0].addr;
		w->len = wr->sg_list[0].length;
		w->lkey = wr->sg_list[0].lkey;
		w->raddr = wr->wr.rdma.remote_addr;
		w->rkey = wr->wr.rdma.rkey;
		q->post_seq++;
	}
	if (err && bad)
		*bad = wr;
	pthread_cond_broadcast(&q->cond);
	pthread_mutex_unlock(&q->lock);
	return err;
}

static int emu__post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	(void)qp;
	if (bad)
		*bad = wr;
	return EOPNOTSUPP; /* the engine uses one-sided operations only */
}

/* Worker: connect the QP's stream to the target device. Called unlocked. */
static int qp_connect(struct emu_qp *q, const union ibv_gid *dgid, uint32_t dqpn,
		      uint32_t timeout_ms)
{
	uint32_t ident;
	struct sockaddr_un sa;
	socklen_t len;
	struct ibv_gid_entry sgid;
	if (gid_to_ident(dgid, &ident))
		return -1;
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	sock_name(ident, &sa, &len);
	struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	if (connect(fd, (struct sockaddr *)&sa, len)) {
		close(fd);
		return -1;
	}
	gid_entry(q->dev, q->sgid_index, &sgid);
	struct wire_hello h = {.magic = EMU_MAGIC, .dst_qpn = dqpn, .src_qpn = q->qp.qp_num};
	memcpy(h.src_gid, sgid.gid.raw, 16);
	if (io_full(fd, &h, sizeof(h), true)) {
		close(fd);
		return -1;
	}
	return fd;
}

/* qp_exec results besides an enum ibv_wc_status */
#define EX_LOST (-1)    /* connection refused/closed or packet dropped: retry */
#define EX_TIMEOUT (-2) /* the peer did not answer within the timeout */

static int io_fail(void)
{
	return errno == EAGAIN || errno == EWOULDBLOCK ? EX_TIMEOUT : EX_LOST;
}

/* Worker: execute one WR over fd; returns the completion status or EX_*. */
static int qp_exec(struct emu_qp *q, int fd, const struct emu_wr *w)
{
	struct emu_dev *d = q->dev;
	int st = IBV_WC_SUCCESS;
	pthread_rwlock_rdlock(&d->mr_rw);
	struct emu_mr *m = w->len ? mr_find(d, w->lkey) : NULL;
	if (w->len && (!m || m->mr.pd != q->qp.pd || !mr_covers(m, w->laddr, w->len) ||
		       (w->opcode == IBV_WR_RDMA_READ && !(m->access & IBV_ACCESS_LOCAL_WRITE)))) {
		st = IBV_WC_LOC_PROT_ERR;
		goto out;
	}
	struct wire_req r = {.op = w->opcode == IBV_WR_RDMA_WRITE ? OP_WRITE : OP_READ,
			     .len = w->len, .rkey = w->rkey, .raddr = w->raddr};
	uint32_t reply;
	if (fd < 0) {
		st = EX_LOST;
		goto out;
	}
	if (io_full(fd, &r, sizeof(r), true) ||
	    (r.op == OP_WRITE && w->len && io_full(fd, mr_host(m, w->laddr), w->len, true)) ||
	    io_full(fd, &reply, sizeof(reply), false)) {
		st = io_fail();
		goto out;
	}
	if (reply == ST_OK && r.op == OP_READ && w->len &&
	    io_full(fd, mr_host(m, w->laddr), w->len, false))
		st = io_fail();
	else if (reply == ST_ACCESS)
		st = IBV_WC_REM_ACCESS_ERR;
	else if (reply == ST_INV_REQ)
		st = IBV_WC_REM_INV_REQ_ERR;
	else if (reply != ST_OK)
		st = EX_LOST; /* dropped by the target */
out:
	pthread_rwlock_unlock(&d->mr_rw);
	return st;
}

/* Worker, under q->lock: run WR w through up to retry_cnt + 1 attempts,
 * each waiting 4.096 us * 2^timeout before the next, like the transport's
 * retry timer (a target QP not yet in RTR, a peer gone). */
static enum ibv_wc_status qp_run(struct emu_qp *q, const struct emu_wr *w, uint64_t seq)
{
	uint64_t try_ns = 4096ull << q->timeout;
	uint64_t ms = try_ns / 1000000ull * (q->retry_cnt + 1u);
	uint32_t tmo = ms < EMU_MIN_TIMEOUT_MS ? EMU_MIN_TIMEOUT_MS
		       : ms > 600000 ? 600000 : (uint32_t)ms;
	for (unsigned attempt = 0;; attempt++) {
		if (q->fd < 0) {
			union ibv_gid dgid = q->dgid;
			uint32_t dqpn = q->dest_qpn;
			pthread_mutex_unlock(&q->lock);
			int fd = qp_connect(q, &dgid, dqpn, tmo);
			pthread_mutex_lock(&q->lock);
			if (q->fd < 0)
				q->fd = fd;
			else if (fd >= 0)
				close(fd);
		}
		int fd = q->fd;
		pthread_mutex_unlock(&q->lock);
		int st = qp_exec(q, fd, w);
		pthread_mutex_lock(&q->lock);
		if (st >= 0)
			return (enum ibv_wc_status)st;
		if (q->fd >= 0) {
			close(q->fd);
			q->fd = -1;
		}
		if (st == EX_TIMEOUT || attempt >= q->retry_cnt || q->stop || q->exec_seq != seq ||
		    q->qp.state != IBV_QPS_RTS)
			return IBV_WC_RETRY_EXC_ERR;
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		uint64_t ns = (uint64_t)ts.tv_nsec + try_ns;
		ts.tv_sec += (time_t)(ns / 1000000000ull);
		ts.tv_nsec = (long)(ns % 1000000000ull);
		/* woken early by a state change or destroy */
		pthread_cond_timedwait(&q->cond, &q->lock, &ts);
	}
}

static void *qp_worker(void *arg)
{
	struct emu_qp *q = arg;
	struct emu_cq *cq = (struct emu_cq *)q->qp.send_cq;
	pthread_mutex_lock(&q->lock);
	for (;;) {
		while (!q->stop && (q->exec_seq == q->post_seq ||
				    (q->qp.state != IBV_QPS_RTS && q->qp.state != IBV_QPS_ERR)))
			pthread_cond_wait(&q->cond, &q->lock);
		if (q->stop)
			break;
		uint64_t seq = q->exec_seq;
		struct emu_wr w = q->ring[seq % q->max_send_wr];
		enum ibv_wc_status st;
		if (q->qp.state == IBV_QPS_ERR) {
			st = IBV_WC_WR_FLUSH_ERR;
		} else {
			st = qp_run(q, &w, seq);
			if (q->stop)
				break;
			if (q->exec_seq != seq)
				continue; /* reset while executing */
			if (st != IBV_WC_SUCCESS && q->qp.state == IBV_QPS_ERR)
				st = IBV_WC_WR_FLUSH_ERR; /* moved to ERR while in flight */
			if (st != IBV_WC_SUCCESS) {
				pthread_mutex_lock(&q->dev->lock);
				q->qp.state = IBV_QPS_ERR;
				pthread_mutex_unlock(&q->dev->lock);
			}
		}
		q->exec_seq = seq + 1;
		bool cqe = st != IBV_WC_SUCCESS || (w.flags & IBV_SEND_SIGNALED);
		pthread_mutex_unlock(&q->lock);
		if (cqe)
			cq_push(q, cq, &w, seq, st);
		pthread_mutex_lock(&q->lock);
	}
	pthread_mutex_unlock(&q->lock);
	return NULL;
}
