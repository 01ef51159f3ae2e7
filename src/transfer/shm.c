/*
 * shm: the same-host transport. A peer's memfd-backed regions are mapped
 * into this process once and a transfer is a memcpy by the initiator:
 * requests up to 64 KiB are copied by the submitting thread (at most 1 MiB
 * of them per batch; with te_submit_inline, what its caller allows, in
 * slices of any size), the rest are cut into slices copied in parallel by
 * the data workers (the paths of an shm peer are the workers).
 *
 * The channel is an abstract Unix SOCK_SEQPACKET socket per engine (named
 * in the descriptor, so it is only reachable in the same network
 * namespace). A client authenticates like a TCP one (the cluster secret;
 * without a secret the peer must run as the same user, checked with
 * SO_PEERCRED), then receives every shareable region as ADD with the
 * memfd attached (SCM_RIGHTS) and a SYNC. New regions are pushed as they
 * are registered. Removing a region sends DEL to every client and waits
 * for their ACK, which a client sends when no request of its own uses the
 * mapping any more — so te_unregister returns only when no peer can touch
 * the memory (a client that does not answer within the io timeout is
 * disconnected). A client maps only what it was given, and checks each
 * request against those mappings: that is the range check for shm.
 *
 * A peer that dies is noticed when its socket closes; requests after that
 * go to the remote transport (and fail there), requests already copying
 * complete into the dead peer's pages, which stay mapped until released.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/crc32c.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/util.h"
#include "transfer/te_int.h"

#define LOG_SUBSYS LOGS_SHM

/* This transport's ops (at the end of the file), registered in engine.c. */
extern const struct te_xport_ops te__shm_ops;

#define MAX_MSG TE_HS_BYTES

/* ------------------------------------------------------------ messages */

/* Send one message (and an fd) on a non-blocking seqpacket socket,
 * waiting up to timeout_ms for room. Errors: negative errno, MC_ETIMEDOUT. */
static int send_msg(int fd, const void *buf, size_t len, int pass_fd, uint64_t timeout_ms)
{
	struct iovec iov = {(void *)buf, len};
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(int))];
	} cm;
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
	if (pass_fd >= 0) {
		memset(&cm, 0, sizeof(cm));
		mh.msg_control = cm.b;
		mh.msg_controllen = sizeof(cm.b);
		struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
	}
	uint64_t deadline = mc_now_ms() + timeout_ms;
	for (;;) {
		ssize_t n = sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n == (ssize_t)len)
			return 0;
		if (n >= 0)
			return -EIO;
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN && errno != EWOULDBLOCK)
			return -errno;
		uint64_t now = mc_now_ms();
		if (now >= deadline)
			return MC_ETIMEDOUT;
		struct pollfd pfd = {fd, POLLOUT, 0};
		(void)poll(&pfd, 1, (int)MC_MIN(deadline - now, 1000));
	}
}

/* Receive one message and at most one fd (*fd_out, -1 when none).
 * Returns its length, 0 at EOF, -EAGAIN, or a negative errno. */
static ssize_t recv_msg(int fd, uint8_t *buf, size_t cap, int *fd_out)
{
	struct iovec iov = {buf, cap};
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(int) * 4)];
	} cm;
	struct msghdr mh = {.msg_iov = &iov,
			    .msg_iovlen = 1,
			    .msg_control = cm.b,
			    .msg_controllen = sizeof(cm.b)};
	*fd_out = -1;
	ssize_t n;
	do
		n = recvmsg(fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return errno == EWOULDBLOCK ? -EAGAIN : -errno;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < k; i++) {
			int f;
			memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
			if (*fd_out < 0)
				*fd_out = f;
			else
				close(f); /* more than we asked for */
		}
	}
	if (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
		if (*fd_out >= 0)
			close(*fd_out);
		*fd_out = -1;
		return -EMSGSIZE;
	}
	return n;
}

static socklen_t abstract_addr(const char *name, struct sockaddr_un *sa)
{
	size_t n = strlen(name);
	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	if (n > sizeof(sa->sun_path) - 1)
		n = sizeof(sa->sun_path) - 1;
	memcpy(sa->sun_path + 1, name, n); /* sun_path[0] = 0: abstract */
	return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

/* ------------------------------------------------------------ serving side */

struct shm_srv;

struct shm_xport {
	struct te_engine *e;
	int lfd;
	char name[100];
	struct te_ioh lioh;
	pthread_mutex_t mu; /* conns, their sending and pending ACKs */
	pthread_cond_t cv;
	pthread_mutex_t del_mu; /* one region removal at a time */
	struct shm_srv *conns;
	atomic_uint rr;
	struct te_hs_bound hs; /* connections still in their handshake */
};

struct shm_srv {
	struct te_ioh ioh;
	struct te_task add_task, free_task;
	struct shm_xport *x;
	struct te_worker *w;
	struct shm_srv *next, **pprev;
	int fd;
	bool authed, closed;
	bool handshaking;     /* counted in x->hs */
	uint64_t accepted_ms; /* the handshake ends within --te-io-timeout */
	uint32_t pending;     /* region id whose ACK we wait for, 0: none */
	struct te_hs_server hs;
	uid_t uid;
	pid_t pid;
};

static void srv_free_task(struct te_task *t)
{
	free(MC_CONTAINER_OF(t, struct shm_srv, free_task));
}

/* Worker thread. */
static void srv_close(struct shm_srv *c, const char *why)
{
	struct shm_xport *x = c->x;
	if (c->closed)
		return;
	if (why)
		log_debug("shm client pid %d (%s): %s", (int)c->pid,
			  c->hs.peer[0] ? c->hs.peer : "?", why);
	te__worker_del(c->w, c->fd);
	pthread_mutex_lock(&x->mu);
	c->closed = true;
	close(c->fd);
	te__hs_bound_leave(&x->hs, &c->handshaking);
	*c->pprev = c->next;
	if (c->next)
		c->next->pprev = c->pprev;
	c->pending = 0;
	pthread_cond_broadcast(&x->cv);
	pthread_mutex_unlock(&x->mu);
	c->free_task.run = srv_free_task;
	te__worker_post(c->w, &c->free_task);
}

static int send_shm(int fd, const struct te_shm_msg *m, int pass_fd, uint64_t timeout)
{
	uint8_t b[TE_SHM_MSG_BYTES];
	te__shm_encode(m, b);
	return send_msg(fd, b, sizeof(b), pass_fd, timeout);
}

struct dump_ctx {
	struct shm_srv *c;
	int rc;
};

static void dump_region(void *ud, struct te_region *r)
{
	struct dump_ctx *d = ud;
	if (d->rc || r->memfd < 0)
		return;
	struct te_shm_msg m = {.type = TE_SHM_ADD,
			       .id = r->id,
			       .addr = r->addr,
			       .len = r->len,
			       .off = r->memfd_off};
	d->rc = send_shm(d->c->fd, &m, r->memfd, d->c->x->e->io_timeout_ms);
}

/* Authenticated: send every shareable region, then SYNC. Under x->mu, so
 * a region registered meanwhile is either in this dump or pushed after
 * it (te_int.h: a duplicate ADD is ignored by the client). */
static int srv_welcome(struct shm_srv *c)
{
	struct shm_xport *x = c->x;
	struct dump_ctx d = {c, 0};
	pthread_mutex_lock(&x->mu);
	te__rtable_foreach(&x->e->regions, dump_region, &d);
	if (d.rc == 0) {
		struct te_shm_msg m = {.type = TE_SHM_SYNC};
		d.rc = send_shm(c->fd, &m, -1, x->e->io_timeout_ms);
	}
	c->authed = d.rc == 0;
	if (c->authed)
		te__hs_bound_leave(&x->hs, &c->handshaking);
	pthread_mutex_unlock(&x->mu);
	return d.rc;
}

static void srv_on_io(struct te_ioh *h, uint32_t events)
{
	struct shm_srv *c = MC_CONTAINER_OF(h, struct shm_srv, ioh);
	struct shm_xport *x = c->x;
	struct te_engine *e = x->e;
	(void)events;
	for (int i = 0; i < 64 && !c->closed; i++) {
		uint8_t buf[MAX_MSG];
		int pfd;
		ssize_t n = recv_msg(c->fd, buf, sizeof(buf), &pfd);
		if (pfd >= 0)
			close(pfd);
		if (n == -EAGAIN)
			return;
		if (n <= 0) {
			srv_close(c, n == 0 ? "closed" : strerror((int)-n));
			return;
		}
		if (!c->authed) {
			struct te_hs_msg in, out;
			int rc = n == TE_HS_BYTES ? te__hs_decode(buf, &in) : MC_EPROTOCOL;
			if (rc == 0)
				rc = te__hs_server_step(&c->hs, &in, &out);
			if (rc == 0 && !e->secret_len && c->uid != geteuid()) {
				out.status = rc = -EACCES; /* no secret: same user only */
				log_warn("refused shm client pid %d: uid %d is not ours "
					 "and no cluster secret is configured",
					 (int)c->pid, (int)c->uid);
			}
			if (rc == MC_EPROTOCOL || rc == -EPROTONOSUPPORT) {
				metric_inc(e->m_auth_refused[TE_AUTH_SHM]);
				log_warn("shm client pid %d: bad handshake (%s)", (int)c->pid,
					 mc_strerror(rc));
				srv_close(c, "bad handshake");
				return;
			}
			uint8_t ob[TE_HS_BYTES];
			te__hs_encode(&out, ob);
			if (send_msg(c->fd, ob, sizeof(ob), -1, e->io_timeout_ms) != 0 ||
			    rc < 0) {
				if (rc == -EACCES)
					metric_inc(e->m_auth_refused[TE_AUTH_SHM]);
				if (rc == -EACCES && e->secret_len)
					log_warn("refused shm client pid %d (segment %s): "
						 "cluster secret mismatch",
						 (int)c->pid, c->hs.peer);
				srv_close(c, "refused");
				return;
			}
			if (rc == 0 && srv_welcome(c) != 0) {
				srv_close(c, "cannot send the regions");
				return;
			}
			if (rc == 0)
				log_debug("shm client pid %d (segment %s) connected",
					  (int)c->pid, c->hs.peer);
			continue;
		}
		struct te_shm_msg m;
		if (n != TE_SHM_MSG_BYTES || te__shm_decode(buf, &m) != 0 ||
		    m.type != TE_SHM_ACK) {
			srv_close(c, "bad message");
			return;
		}
		pthread_mutex_lock(&x->mu);
		if (c->pending == m.id) {
			c->pending = 0;
			pthread_cond_broadcast(&x->cv);
		}
		pthread_mutex_unlock(&x->mu);
	}
}

static void srv_add_task(struct te_task *t)
{
	struct shm_srv *c = MC_CONTAINER_OF(t, struct shm_srv, add_task);
	if (te__worker_add(c->w, c->fd, &c->ioh, EPOLLIN) != 0)
		srv_close(c, "epoll_ctl failed");
}

static void on_accept(struct te_ioh *h, uint32_t events)
{
	struct shm_xport *x = MC_CONTAINER_OF(h, struct shm_xport, lioh);
	struct te_engine *e = x->e;
	(void)events;
	for (int i = 0; i < 64; i++) {
		int fd = accept4(x->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0)
			return;
		struct ucred cr;
		socklen_t cl = sizeof(cr);
		struct shm_srv *c = calloc(1, sizeof(*c));
		if (!c || getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) != 0 ||
		    mc_random(c->hs.nonce_s, TE_HS_NONCE) != 0) {
			free(c);
			close(fd);
			continue;
		}
		char who[32];
		snprintf(who, sizeof(who), "pid %d", (int)cr.pid);
		if (!te__hs_bound_enter(e, &x->hs, TE_AUTH_SHM, who)) {
			free(c);
			close(fd);
			continue;
		}
		c->handshaking = true;
		c->accepted_ms = mc_now_ms();
		c->x = x;
		c->fd = fd;
		c->uid = cr.uid;
		c->pid = cr.pid;
		c->ioh.on_io = srv_on_io;
		c->hs.secret = e->secret_len ? e->secret : NULL;
		c->hs.secret_len = e->secret_len;
		c->hs.own_name = e->name;
		c->w = &e->workers[atomic_fetch_add(&x->rr, 1) % e->nworkers];
		pthread_mutex_lock(&x->mu);
		c->next = x->conns;
		if (x->conns)
			x->conns->pprev = &c->next;
		c->pprev = &x->conns;
		x->conns = c;
		pthread_mutex_unlock(&x->mu);
		c->add_task.run = srv_add_task;
		te__worker_post(c->w, &c->add_task);
	}
}

/* Worker w: close its connections still in their handshake
 * --te-io-timeout after they were accepted. */
static void shm_tick(struct te_xport *xp, struct te_worker *w)
{
	struct shm_xport *x = (struct shm_xport *)xp;
	uint64_t now = mc_now_ms(), limit = x->e->io_timeout_ms;
	struct shm_srv *late[64];
	size_t n = 0;
	pthread_mutex_lock(&x->mu);
	for (struct shm_srv *c = x->conns; c && n < 64; c = c->next)
		if (c->w == w && c->handshaking && now - c->accepted_ms > limit)
			late[n++] = c;
	pthread_mutex_unlock(&x->mu);
	/* Only this worker closes or frees its connections: still valid. */
	for (size_t i = 0; i < n; i++)
		srv_close(late[i], "no handshake in time");
}

static int shm_region_add(struct te_xport *xp, struct te_region *r)
{
	struct shm_xport *x = (struct shm_xport *)xp;
	if (r->memfd < 0)
		return 0;
	struct te_shm_msg m = {.type = TE_SHM_ADD,
			       .id = r->id,
			       .addr = r->addr,
			       .len = r->len,
			       .off = r->memfd_off};
	pthread_mutex_lock(&x->mu);
	for (struct shm_srv *c = x->conns; c; c = c->next) {
		if (!c->authed || c->closed)
			continue;
		if (send_shm(c->fd, &m, r->memfd, x->e->io_timeout_ms) != 0) {
			log_warn("shm client pid %d: cannot send a new region; "
				 "disconnecting it",
				 (int)c->pid);
			shutdown(c->fd, SHUT_RDWR); /* its worker closes it */
		}
	}
	pthread_mutex_unlock(&x->mu);
	return 0;
}

static void shm_region_del(struct te_xport *xp, struct te_region *r)
{
	struct shm_xport *x = (struct shm_xport *)xp;
	struct te_engine *e = x->e;
	if (r->memfd < 0)
		return;
	struct te_shm_msg m = {.type = TE_SHM_DEL, .id = r->id};
	pthread_mutex_lock(&x->del_mu);
	pthread_mutex_lock(&x->mu);
	for (struct shm_srv *c = x->conns; c; c = c->next) {
		if (!c->authed || c->closed)
			continue;
		c->pending = r->id;
		if (send_shm(c->fd, &m, -1, e->io_timeout_ms) != 0) {
			c->pending = 0;
			shutdown(c->fd, SHUT_RDWR);
		}
	}
	uint64_t deadline = mc_now_ms() + e->io_timeout_ms;
	for (;;) {
		struct shm_srv *late = NULL;
		for (struct shm_srv *c = x->conns; c && !late; c = c->next)
			if (c->pending == r->id && !c->closed)
				late = c;
		if (!late)
			break;
		uint64_t now = mc_now_ms();
		if (now >= deadline) {
			log_warn("shm client pid %d (segment %s) did not release "
				 "region 0x%llx within %llu ms; disconnecting it",
				 (int)late->pid, late->hs.peer, (unsigned long long)r->addr,
				 (unsigned long long)e->io_timeout_ms);
			late->pending = 0;
			shutdown(late->fd, SHUT_RDWR);
			continue;
		}
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		uint64_t ms = MC_MIN(deadline - now, 1000);
		ts.tv_sec += (time_t)(ms / 1000);
		ts.tv_nsec += (long)(ms % 1000) * 1000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&x->cv, &x->mu, &ts);
	}
	pthread_mutex_unlock(&x->mu);
	pthread_mutex_unlock(&x->del_mu);
}

/* ------------------------------------------------------------ client side */

struct shm_peer;

struct shm_map {
	uint32_t id;
	uint64_t addr, len;
	uint8_t *ptr; /* byte 0 of the region */
	void *base;   /* the mapping */
	size_t map_len;
	atomic_int refs;  /* the table's + one per bound request (+ populate's) */
	atomic_bool ack;  /* the server asked for it back */
	atomic_bool gone; /* out of the table */
	size_t populated; /* bytes of the mapping faulted in (map_populate) */
	struct te_task populate;
	struct shm_peer *p;
};

struct map_ref {
	uint64_t addr, len; /* te__range_find reads these */
	struct shm_map *m;
};

struct shm_peer {
	struct te_peer base;
	struct shm_xport *x;
	struct te_engine *e;
	int fd;
	struct te_worker *w; /* reads the channel */
	struct te_ioh ioh;
	bool fd_closed;
	pthread_rwlock_t lock;
	struct map_ref *maps; /* sorted by addr */
	size_t n, cap;
	pthread_mutex_t send_mu;
	struct te_task add_task, close_task, free_task;
};

static void map_unref(struct shm_map *m)
{
	if (atomic_fetch_sub(&m->refs, 1) != 1)
		return;
	struct shm_peer *p = m->p;
	munmap(m->base, m->map_len);
	if (atomic_load(&m->ack)) {
		struct te_shm_msg a = {.type = TE_SHM_ACK, .id = m->id};
		pthread_mutex_lock(&p->send_mu);
		if (!p->fd_closed)
			(void)send_shm(p->fd, &a, -1, 1000);
		pthread_mutex_unlock(&p->send_mu);
	}
	free(m);
	te__peer_unref(&p->base); /* each map holds the peer */
}

/* Fault a new mapping in, TE_SHM_POPULATE_BYTES per task on the peer's
 * worker (its other work runs in between), so that the first write to
 * each page of a peer's segment does not fault on the writer: the loop
 * of an agent writing small values to a same-host agent took a page
 * fault per 4 KiB put. Only the page tables are filled (the peer's
 * pages exist already or are allocated as by a write); the bytes stay
 * as they are. Holds a reference to the map until it stops. */
static void map_populate(struct te_task *t)
{
	struct shm_map *m = MC_CONTAINER_OF(t, struct shm_map, populate);
	struct shm_peer *p = m->p;
	/* (Not on the worker: it is stopping and runs posts on the poster.) */
	if (te__on_worker(p->w) && !atomic_load(&m->gone) && !atomic_load(&p->base.closed)) {
		size_t n = MC_MIN(TE_SHM_POPULATE_BYTES, m->map_len - m->populated);
		if (madvise((uint8_t *)m->base + m->populated, n, MADV_POPULATE_WRITE) == 0) {
			m->populated += n;
			if (m->populated < m->map_len) {
				te__worker_post(p->w, t);
				return;
			}
			log_debug("segment %s: region 0x%llx+%llu faulted in", p->base.name,
				  (unsigned long long)m->addr, (unsigned long long)m->len);
		} else {
			/* Before Linux 5.14 (EINVAL), or memory short: pages
			 * fault in on first use instead. */
			log_debug("segment %s: region 0x%llx not faulted in ahead: %s",
				  p->base.name, (unsigned long long)m->addr, strerror(errno));
		}
	}
	map_unref(m);
}

static int map_add(struct shm_peer *p, const struct te_shm_msg *m, int fd)
{
	long page = sysconf(_SC_PAGESIZE);
	uint64_t delta = m->off % (uint64_t)page;
	if (m->len > SIZE_MAX - delta)
		return -EINVAL;
	size_t map_len = (size_t)(m->len + delta);
	void *base = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
			  (off_t)(m->off - delta));
	if (base == MAP_FAILED)
		return -errno;
	struct shm_map *mp = calloc(1, sizeof(*mp));
	if (!mp) {
		munmap(base, map_len);
		return -ENOMEM;
	}
	mp->id = m->id;
	mp->addr = m->addr;
	mp->len = m->len;
	mp->base = base;
	mp->map_len = map_len;
	mp->ptr = (uint8_t *)base + delta;
	mp->p = p;
	atomic_init(&mp->refs, 1);
	int rc = 0;
	pthread_rwlock_wrlock(&p->lock);
	size_t i = 0;
	while (i < p->n && p->maps[i].addr < m->addr)
		i++;
	bool dup = false;
	for (size_t k = 0; k < p->n; k++)
		dup |= p->maps[k].m->id == m->id;
	/* A duplicate (pushed while the welcome was being sent) or a range
	 * overlapping one we have is ignored. */
	if (dup || (i < p->n && p->maps[i].addr - m->addr < m->len) ||
	    (i > 0 && m->addr - p->maps[i - 1].addr < p->maps[i - 1].len)) {
		rc = 1;
	} else if (p->n == p->cap) {
		size_t cap = p->cap ? p->cap * 2 : 8;
		struct map_ref *v = realloc(p->maps, cap * sizeof(*v));
		if (!v)
			rc = -ENOMEM;
		else {
			p->maps = v;
			p->cap = cap;
		}
	}
	if (rc == 0) {
		memmove(&p->maps[i + 1], &p->maps[i], (p->n - i) * sizeof(*p->maps));
		p->maps[i] = (struct map_ref){m->addr, m->len, mp};
		p->n++;
		te__peer_ref(&p->base);
		atomic_fetch_add(&mp->refs, 1); /* map_populate's */
	}
	pthread_rwlock_unlock(&p->lock);
	if (rc == 0) {
		mp->populate.run = map_populate;
		te__worker_post(p->w, &mp->populate);
	} else {
		munmap(base, map_len);
		free(mp);
	}
	return rc < 0 ? rc : 0;
}

/* Remove a mapping from the table (ack: the server asked for it). */
static void map_del(struct shm_peer *p, uint32_t id, bool ack)
{
	struct shm_map *m = NULL;
	pthread_rwlock_wrlock(&p->lock);
	for (size_t i = 0; i < p->n; i++) {
		if (p->maps[i].m->id == id) {
			m = p->maps[i].m;
			memmove(&p->maps[i], &p->maps[i + 1],
				(p->n - i - 1) * sizeof(*p->maps));
			p->n--;
			break;
		}
	}
	pthread_rwlock_unlock(&p->lock);
	if (m) {
		atomic_store(&m->gone, true);
		atomic_store(&m->ack, ack);
		map_unref(m);
	} else if (ack) {
		struct te_shm_msg a = {.type = TE_SHM_ACK, .id = id};
		pthread_mutex_lock(&p->send_mu);
		(void)send_shm(p->fd, &a, -1, 1000);
		pthread_mutex_unlock(&p->send_mu);
	}
}

static void drop_all_maps(struct shm_peer *p)
{
	for (;;) {
		pthread_rwlock_rdlock(&p->lock);
		uint32_t id = p->n ? p->maps[0].m->id : 0;
		size_t n = p->n;
		pthread_rwlock_unlock(&p->lock);
		if (!n)
			return;
		map_del(p, id, false);
	}
}

/* One message from the server. Returns 0, 1 for SYNC, or an error. */
static int peer_msg(struct shm_peer *p, const uint8_t *buf, ssize_t n, int fd)
{
	struct te_shm_msg m;
	int rc = n == TE_SHM_MSG_BYTES ? te__shm_decode(buf, &m) : MC_EPROTOCOL;
	if (rc == 0 && (m.type == TE_SHM_ACK || (m.type == TE_SHM_ADD) != (fd >= 0)))
		rc = MC_EPROTOCOL;
	if (rc == 0) {
		switch (m.type) {
		case TE_SHM_ADD:
			rc = map_add(p, &m, fd);
			if (rc)
				log_warn("segment %s: cannot map region 0x%llx+%llu: %s",
					 p->base.name, (unsigned long long)m.addr,
					 (unsigned long long)m.len, mc_strerror(rc));
			rc = 0; /* requests for it go to the remote transport */
			break;
		case TE_SHM_DEL:
			map_del(p, m.id, true);
			break;
		case TE_SHM_SYNC:
			rc = 1;
			break;
		}
	}
	if (fd >= 0)
		close(fd);
	return rc;
}

/* The channel is gone (worker thread): no more shm for this peer. */
static void peer_down(struct shm_peer *p, const char *why)
{
	if (p->fd_closed)
		return;
	if (!atomic_load(&p->base.closed))
		log_warn("segment %s: shm channel closed (%s)", p->base.name, why);
	atomic_store(&p->base.closed, true);
	atomic_store(&p->base.alive, 0);
	te__worker_del(p->w, p->fd);
	pthread_mutex_lock(&p->send_mu);
	p->fd_closed = true;
	close(p->fd);
	pthread_mutex_unlock(&p->send_mu);
	drop_all_maps(p);
}

static void peer_on_io(struct te_ioh *h, uint32_t events)
{
	struct shm_peer *p = MC_CONTAINER_OF(h, struct shm_peer, ioh);
	(void)events;
	for (int i = 0; i < 64 && !p->fd_closed; i++) {
		uint8_t buf[MAX_MSG];
		int fd;
		ssize_t n = recv_msg(p->fd, buf, sizeof(buf), &fd);
		if (n == -EAGAIN)
			return;
		if (n <= 0) {
			if (fd >= 0)
				close(fd);
			peer_down(p, n == 0 ? "peer closed it" : strerror((int)-n));
			return;
		}
		if (peer_msg(p, buf, n, fd) < 0) {
			peer_down(p, "bad message");
			return;
		}
	}
}

static void peer_add_task(struct te_task *t)
{
	struct shm_peer *p = MC_CONTAINER_OF(t, struct shm_peer, add_task);
	if (te__worker_add(p->w, p->fd, &p->ioh, EPOLLIN) != 0)
		peer_down(p, "epoll_ctl failed");
	te__peer_unref(&p->base);
}

static void peer_close_task(struct te_task *t)
{
	struct shm_peer *p = MC_CONTAINER_OF(t, struct shm_peer, close_task);
	if (!p->fd_closed) {
		atomic_store(&p->base.closed, true);
		peer_down(p, "disconnected");
	}
	te__peer_unref(&p->base);
}

static void peer_free_task(struct te_task *t)
{
	struct shm_peer *p = MC_CONTAINER_OF(t, struct shm_peer, free_task);
	metric_sub(p->e->m_peers[TE_PROTO_SHM], 1);
	if (!p->fd_closed)
		close(p->fd);
	pthread_rwlock_destroy(&p->lock);
	pthread_mutex_destroy(&p->send_mu);
	free(p->maps);
	free(p);
}

static void shm_peer_free(struct te_peer *bp)
{
	struct shm_peer *p = (struct shm_peer *)bp;
	te__worker_post(p->w, &p->free_task);
}

static void shm_disconnect(struct te_peer *bp)
{
	struct shm_peer *p = (struct shm_peer *)bp;
	atomic_store(&bp->closed, true);
	te__peer_ref(bp);
	te__worker_post(p->w, &p->close_task);
}

static int shm_bind(struct te_peer *bp, uint64_t addr, uint64_t len, void **route)
{
	struct shm_peer *p = (struct shm_peer *)bp;
	int rc = -EAGAIN;
	pthread_rwlock_rdlock(&p->lock);
	long i = te__range_find(p->maps, p->n, sizeof(*p->maps),
				offsetof(struct map_ref, addr), offsetof(struct map_ref, len),
				addr, len);
	if (i >= 0) {
		struct shm_map *m = p->maps[i].m;
		atomic_fetch_add(&m->refs, 1);
		*route = m;
		rc = 0;
	}
	pthread_rwlock_unlock(&p->lock);
	return rc;
}

static void shm_unbind(struct te_peer *bp, void *route)
{
	(void)bp;
	map_unref(route);
}

static void copy_slice(struct te_slice *s)
{
	struct shm_map *m = s->route;
	uint8_t *remote = m->ptr + (s->remote - m->addr);
	if (s->op == TE_WRITE) {
		memcpy(remote, s->local, s->len);
	} else if (s->batch->reqs[s->req].r.want_crc) {
		s->crc = crc32c_copy(0, s->local, remote, s->len);
		s->summed = true;
	} else {
		memcpy(s->local, remote, s->len);
	}
	te__slice_done(s, 0, false);
}

static void copy_task(struct te_task *t)
{
	copy_slice(MC_CONTAINER_OF(t, struct te_slice, task));
}

/* Small copies are done by the submitting thread (cheaper than a hand-off),
 * up to a budget per batch so that no caller — a loop thread included —
 * copies much. */
static bool take_inline(struct te_batch *b, size_t len)
{
	size_t left = atomic_load(&b->inline_left);
	while (left >= len)
		if (atomic_compare_exchange_weak(&b->inline_left, &left, left - len))
			return true;
	return false;
}

static void shm_submit(struct te_peer *bp, struct te_slice *s)
{
	struct shm_peer *p = (struct shm_peer *)bp;
	if ((s->len <= TE_SHM_INLINE_BYTES || s->batch->inline_any) &&
	    take_inline(s->batch, s->len)) {
		metric_add(p->e->m_shm_inline, s->len);
		copy_slice(s);
		return;
	}
	s->task.run = copy_task;
	te__worker_post(&p->e->workers[s->path % p->e->nworkers], &s->task);
}

static int shm_connect(struct te_xport *xp, struct te_segment *seg, const struct te_desc *d,
		       struct te_peer **out)
{
	struct shm_xport *x = (struct shm_xport *)xp;
	struct te_engine *e = x->e;
	struct sockaddr_un sa;
	socklen_t sl = abstract_addr(d->shm_socket, &sa);
	int rc;
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&sa, sl) != 0) {
		rc = errno == ECONNREFUSED || errno == ENOENT ? MC_EUNAVAILABLE : -errno;
		close(fd);
		return rc;
	}
	struct shm_peer *p = calloc(1, sizeof(*p));
	if (!p) {
		close(fd);
		return -ENOMEM;
	}
	p->x = x;
	p->e = e;
	p->fd = fd;
	p->ioh.on_io = peer_on_io;
	pthread_rwlock_init(&p->lock, NULL);
	pthread_mutex_init(&p->send_mu, NULL);
	p->add_task.run = peer_add_task;
	p->close_task.run = peer_close_task;
	p->free_task.run = peer_free_task;
	p->w = &e->workers[atomic_fetch_add(&e->rr, 1) % e->nworkers];
	p->base.ops = &te__shm_ops;
	p->base.x = xp;
	p->base.seg = seg;
	snprintf(p->base.name, sizeof(p->base.name), "%s", seg->name);
	p->base.npaths = MC_MIN(e->nworkers, (unsigned)TE_MAX_PATHS);
	atomic_init(&p->base.alive,
		    p->base.npaths >= 32 ? 0xffffffffu : (1u << p->base.npaths) - 1);
	atomic_init(&p->base.refs, 1);

	uint64_t deadline = mc_now_ms() + TE_CONNECT_TIMEOUT_MS;
	rc = te__hs_client(fd, e->secret_len ? e->secret : NULL, e->secret_len, e->name,
			   d->name, TE_CONNECT_TIMEOUT_MS);
	if (rc == -ECONNRESET)
		rc = -EACCES; /* refused by the peer-credential check */
	/* The regions, until SYNC. */
	while (rc == 0) {
		uint8_t buf[MAX_MSG];
		int pfd;
		ssize_t n = recv_msg(fd, buf, sizeof(buf), &pfd);
		if (n == -EAGAIN) {
			uint64_t now = mc_now_ms();
			if (now >= deadline) {
				rc = MC_ETIMEDOUT;
				break;
			}
			struct pollfd pl = {fd, POLLIN, 0};
			(void)poll(&pl, 1, (int)MC_MIN(deadline - now, 1000));
			continue;
		}
		if (n <= 0) {
			if (pfd >= 0)
				close(pfd);
			rc = n == 0 ? MC_EUNAVAILABLE : (int)n;
			break;
		}
		rc = peer_msg(p, buf, n, pfd);
		if (rc == 1) {
			rc = 0;
			break;
		}
	}
	if (rc) {
		drop_all_maps(p);
		p->fd_closed = true;
		close(fd);
		pthread_rwlock_destroy(&p->lock);
		pthread_mutex_destroy(&p->send_mu);
		free(p->maps);
		free(p);
		return rc;
	}
	metric_add(e->m_peers[TE_PROTO_SHM], 1);
	te__peer_ref(&p->base); /* the add task's */
	te__worker_post(p->w, &p->add_task);
	*out = &p->base;
	return 0;
}

/* ------------------------------------------------------------ engine-wide */

static int shm_init(struct te_engine *e, struct te_xport **out)
{
	struct shm_xport *x = calloc(1, sizeof(*x));
	int rc;
	if (!x)
		return -ENOMEM;
	x->e = e;
	pthread_mutex_init(&x->mu, NULL);
	pthread_cond_init(&x->cv, NULL);
	pthread_mutex_init(&x->del_mu, NULL);
	x->lioh.on_io = on_accept;
	snprintf(x->name, sizeof(x->name), "mooncake-te-%d-%016llx", (int)getpid(),
		 (unsigned long long)e->incarnation);
	x->lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (x->lfd < 0) {
		rc = -errno;
		goto fail;
	}
	struct sockaddr_un sa;
	socklen_t sl = abstract_addr(x->name, &sa);
	if (bind(x->lfd, (struct sockaddr *)&sa, sl) != 0 || listen(x->lfd, 128) != 0) {
		rc = -errno;
		goto fail_fd;
	}
	rc = te__worker_add(&e->workers[0], x->lfd, &x->lioh, EPOLLIN);
	if (rc)
		goto fail_fd;
	*out = (struct te_xport *)x;
	return 0;
fail_fd:
	close(x->lfd);
fail:
	pthread_mutex_destroy(&x->mu);
	pthread_cond_destroy(&x->cv);
	pthread_mutex_destroy(&x->del_mu);
	free(x);
	return rc;
}

static void shm_fini(struct te_xport *xp)
{
	struct shm_xport *x = (struct shm_xport *)xp;
	close(x->lfd);
	while (x->conns) {
		struct shm_srv *c = x->conns;
		x->conns = c->next;
		close(c->fd);
		free(c);
	}
	pthread_mutex_destroy(&x->mu);
	pthread_cond_destroy(&x->cv);
	pthread_mutex_destroy(&x->del_mu);
	free(x);
}

static void shm_describe(struct te_xport *xp, struct te_desc *d)
{
	snprintf(d->shm_socket, sizeof(d->shm_socket), "%s", ((struct shm_xport *)xp)->name);
}

const struct te_xport_ops te__shm_ops = {
	.name = "shm",
	.proto = TE_PROTO_SHM,
	.init = shm_init,
	.fini = shm_fini,
	.describe = shm_describe,
	.region_add = shm_region_add,
	.region_del = shm_region_del,
	.connect = shm_connect,
	.bind = shm_bind,
	.unbind = shm_unbind,
	.submit = shm_submit,
	.disconnect = shm_disconnect,
	.peer_free = shm_peer_free,
	.tick = shm_tick,
};
