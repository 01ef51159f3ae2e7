/*
 * tcp: the TCP transport. Each peer gets te-tcp-conns persistent
 * connections (the paths slices are striped over), each owned by one data
 * worker. A slice is a fixed 32-byte header (te_int.h) and, for a WRITE,
 * its bytes, written with writev straight from the caller's buffer; a READ
 * answer is read with readv straight into it. Requests on a connection are
 * pipelined and answered in order, so the client matches each answer with
 * the oldest slice in flight. Sockets: TCP_NODELAY, TCP_USER_TIMEOUT =
 * the io timeout, and buffers of at least 4 MiB: the kernel's autotuning
 * where its maximum reaches that, else fixed when net.core.[rw]mem_max
 * allow it.
 *
 * Serving side: one listener (on worker 0), accepted connections spread
 * over the workers. A connection must complete the handshake (the cluster
 * secret when one is configured) before any slice is looked at; every
 * slice's range is then checked against the registered regions: a refused
 * READ gets an error answer, a refused WRITE's bytes are read and dropped,
 * and nothing in memory is touched. A region is counted busy while a slice
 * reads or writes it, so unregistering waits for it. Answers queue in a
 * fixed ring per connection; a full ring stops reading (back-pressure).
 * A connection that makes no progress for the io timeout is closed, on
 * either side; the client fails its slices over to the other paths.
 *
 * Memory: per connection a 64 KiB staging buffer (headers and the bytes
 * that arrive with them), nothing per slice.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "common/log.h"
#include "common/metrics.h"
#include "common/util.h"
#include "transfer/te_int.h"

#define LOG_SUBSYS LOGS_TCP

/* This transport's ops (at the end of the file), registered in engine.c. */
extern const struct te_xport_ops te__tcp_ops;

#define STAGE_BYTES ((size_t)64 << 10)
#define RING 256                        /* answers queued per connection */
#define MAX_IOV 64
#define READ_BUDGET ((size_t)2 << 20)   /* per wake-up, for fairness */
#define SOCKBUF_BYTES ((int)TE_TCP_SOCKBUF_BYTES)

struct srv_conn;
struct cli_conn;

struct tcp_xport {
	struct te_engine *e;
	int lfd;
	uint16_t port;
	struct te_ioh lioh;
	int sndbuf, rcvbuf;         /* 0: leave autotuning */
	atomic_uint rr;
	pthread_mutex_t mu;         /* the lists below */
	struct srv_conn *srv;
	struct cli_conn *cli;
};

/* ------------------------------------------------------------ sockets */

/* The idx-th number of a sysctl file ("4096 131072 6291456"), or 0. */
static long read_sysctl(const char *path, int idx)
{
	FILE *f = fopen(path, "re");
	long v = 0;
	for (int i = 0; f && i <= idx; i++)
		if (fscanf(f, "%ld", &v) != 1)
			v = 0;
	if (f)
		fclose(f);
	return v;
}

/*
 * Socket buffers: the kernel's autotuning grows them up to
 * net.ipv4.tcp_[rw]mem's maximum, and a fixed SO_[RCV|SND]BUF turns that
 * off. So a buffer is only fixed (at SOCKBUF_BYTES) when autotuning
 * would stay below it and net.core.[rw]mem_max allows it.
 */
static void pick_sockbufs(struct tcp_xport *x)
{
	if (read_sysctl("/proc/sys/net/ipv4/tcp_rmem", 2) < SOCKBUF_BYTES &&
	    read_sysctl("/proc/sys/net/core/rmem_max", 0) >= SOCKBUF_BYTES)
		x->rcvbuf = SOCKBUF_BYTES;
	if (read_sysctl("/proc/sys/net/ipv4/tcp_wmem", 2) < SOCKBUF_BYTES &&
	    read_sysctl("/proc/sys/net/core/wmem_max", 0) >= SOCKBUF_BYTES)
		x->sndbuf = SOCKBUF_BYTES;
}

static void tune_socket(struct tcp_xport *x, int fd)
{
	int one = 1;
	unsigned timeout = (unsigned)MC_MIN(x->e->io_timeout_ms, 0x7fffffffu);
	(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	(void)setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &timeout, sizeof(timeout));
	if (x->sndbuf)
		(void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &x->sndbuf, sizeof(x->sndbuf));
	if (x->rcvbuf)
		(void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &x->rcvbuf, sizeof(x->rcvbuf));
}

/*
 * How much to read into the stage behind a body of `left` bytes read
 * straight into memory: after a large body only the next header (so its
 * bytes are not copied out of the stage again), after a small one as
 * much as fits (fewer system calls for small slices).
 */
static size_t stage_tail(size_t left, size_t room)
{
	return left >= STAGE_BYTES ? MC_MIN(room, (size_t)TE_WIRE_HDR_BYTES) : room;
}

/* writev without SIGPIPE: the engine is a library, the process may not
 * ignore the signal. */
static ssize_t send_iov(int fd, struct iovec *iov, int n)
{
	struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
	return sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
}

/* ------------------------------------------------------------ serving side */

struct resp {
	uint8_t hdr[TE_WIRE_HDR_BYTES];
	uint8_t *data;
	size_t len;
	struct te_region *r;        /* released once sent */
	bool owned;                 /* data is freed once sent (CTRL answers) */
};

enum rx_state { RX_HS, RX_HDR, RX_PAYLOAD, RX_DISCARD, RX_CTRL };

struct srv_conn {
	struct te_ioh ioh;
	struct te_task add_task, free_task;
	struct tcp_xport *x;
	struct te_worker *w;
	struct srv_conn *next, **pprev;
	int fd;
	uint32_t events;
	bool closed;
	char addr[64];
	/* handshake */
	struct te_hs_server hs;
	uint8_t hsbuf[TE_HS_BYTES];
	size_t hsgot;
	/* receiving */
	enum rx_state rx;
	uint8_t *stage;
	size_t slen, soff;          /* staged bytes [soff, slen) */
	struct te_wire_hdr cur;
	struct te_region *cur_r;
	uint8_t *dst;
	size_t left;
	int cur_err;
	uint8_t *ctrl;              /* CTRL payload (rdma QP exchange) */
	void *ctrl_conn;            /* the transport's state for this connection */
	uint64_t ctrl_xid;          /* ... and which transport it is */
	bool big;                   /* the last body was large */
	/* answering */
	struct resp ring[RING];
	unsigned head, count;
	size_t tx_off;
	uint64_t last_ms;           /* last progress */
};

static void srv_free_task(struct te_task *t)
{
	struct srv_conn *c = MC_CONTAINER_OF(t, struct srv_conn, free_task);
	free(c->stage);
	free(c->ctrl);
	free(c);
}

/* Close the socket, let go of the regions, unlink. */
static void srv_teardown(struct srv_conn *c)
{
	struct te_engine *e = c->x->e;
	c->closed = true;
	close(c->fd);
	if (c->cur_r)
		te__rtable_release(&e->regions, c->cur_r);
	c->cur_r = NULL;
	for (unsigned i = 0; i < c->count; i++) {
		struct resp *r = &c->ring[(c->head + i) % RING];
		if (r->r)
			te__rtable_release(&e->regions, r->r);
		if (r->owned)
			free(r->data);
	}
	c->count = 0;
	if (c->ctrl_conn) {
		const struct te_xport_ops *ops = e->xops[c->ctrl_xid];
		if (ops && ops->ctrl_closed && e->xp[c->ctrl_xid])
			ops->ctrl_closed(e->xp[c->ctrl_xid], c->ctrl_conn);
		c->ctrl_conn = NULL;
	}
	pthread_mutex_lock(&c->x->mu);
	*c->pprev = c->next;
	if (c->next)
		c->next->pprev = c->pprev;
	pthread_mutex_unlock(&c->x->mu);
}

static void srv_close(struct srv_conn *c, const char *why)
{
	if (c->closed)
		return;
	if (why)
		log_debug("closing connection from %s (%s): %s", c->addr,
			  c->hs.peer[0] ? c->hs.peer : "?", why);
	te__worker_del(c->w, c->fd);
	srv_teardown(c);
	/* Freed after this round of events: one for c may still be queued. */
	c->free_task.run = srv_free_task;
	te__worker_post(c->w, &c->free_task);
}

static void srv_set_events(struct srv_conn *c)
{
	uint32_t ev = 0;
	if (c->count < RING)
		ev |= EPOLLIN;
	if (c->count > 0)
		ev |= EPOLLOUT;
	if (ev != c->events && !c->closed) {
		c->events = ev;
		if (te__worker_mod(c->w, c->fd, &c->ioh, ev) != 0)
			srv_close(c, "epoll_ctl failed");
	}
}

static struct resp *push_resp(struct srv_conn *c, int status, uint32_t len,
			      uint64_t id)
{
	struct resp *r = &c->ring[(c->head + c->count) % RING];
	struct te_wire_hdr h = {.type = TE_WIRE_RESP, .status = status, .len = len,
				.id = id};
	te__wire_encode(&h, r->hdr);
	r->data = NULL;
	r->len = 0;
	r->r = NULL;
	r->owned = false;
	c->count++;
	return r;
}

/* Write queued answers. Returns false when the connection closed. */
static bool srv_write(struct srv_conn *c)
{
	struct te_engine *e = c->x->e;
	while (c->count > 0) {
		struct iovec iov[MAX_IOV];
		int n = 0;
		size_t off = c->tx_off;
		for (unsigned i = 0; i < c->count && n + 2 <= MAX_IOV; i++) {
			struct resp *r = &c->ring[(c->head + i) % RING];
			if (off < TE_WIRE_HDR_BYTES) {
				iov[n].iov_base = r->hdr + off;
				iov[n++].iov_len = TE_WIRE_HDR_BYTES - off;
				off = 0;
			} else {
				off -= TE_WIRE_HDR_BYTES;
			}
			if (r->len > off) {
				iov[n].iov_base = r->data + off;
				iov[n++].iov_len = r->len - off;
			}
			off = 0;
		}
		ssize_t w = send_iov(c->fd, iov, n);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return true;
			srv_close(c, strerror(errno));
			return false;
		}
		c->last_ms = mc_now_ms();
		size_t done = (size_t)w + c->tx_off;
		while (c->count > 0) {
			struct resp *r = &c->ring[c->head];
			size_t total = TE_WIRE_HDR_BYTES + r->len;
			if (done < total)
				break;
			done -= total;
			if (r->r) {
				metric_add(e->m_served[TE_PROTO_TCP][0], r->len);
				te__rtable_release(&e->regions, r->r);
				r->r = NULL;
			}
			if (r->owned) {
				free(r->data);
				r->owned = false;
			}
			c->head = (c->head + 1) % RING;
			c->count--;
		}
		c->tx_off = done;
	}
	return true;
}

/* Handshake bytes arrived. Returns false when the connection closed. */
static bool srv_handshake(struct srv_conn *c)
{
	struct te_hs_msg in, out;
	while (c->hsgot < TE_HS_BYTES) {
		ssize_t n = recv(c->fd, c->hsbuf + c->hsgot, TE_HS_BYTES - c->hsgot, 0);
		if (n > 0) {
			c->hsgot += (size_t)n;
			continue;
		}
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
			return true;
		srv_close(c, n == 0 ? "closed during the handshake" : strerror(errno));
		return false;
	}
	c->hsgot = 0;
	c->last_ms = mc_now_ms();
	int rc = te__hs_decode(c->hsbuf, &in);
	if (rc == 0)
		rc = te__hs_server_step(&c->hs, &in, &out);
	if (rc == MC_EPROTOCOL || rc == -EPROTONOSUPPORT) {
		log_warn("connection from %s: bad handshake (%s)", c->addr,
			 mc_strerror(rc));
		metric_inc(c->x->e->m_auth_refused[TE_AUTH_TCP]);
		srv_close(c, NULL);
		return false;
	}
	uint8_t buf[TE_HS_BYTES];
	te__hs_encode(&out, buf);
	/* A fresh socket's buffer always takes one message. */
	if (send(c->fd, buf, sizeof(buf), MSG_NOSIGNAL | MSG_DONTWAIT) !=
	    (ssize_t)sizeof(buf)) {
		srv_close(c, "cannot answer the handshake");
		return false;
	}
	if (rc < 0) {
		if (rc == -EACCES)
			metric_inc(c->x->e->m_auth_refused[TE_AUTH_TCP]);
		log_warn("refused a connection from %s (segment %s): %s", c->addr,
			 c->hs.peer, rc == -EACCES ? "cluster secret mismatch"
						   : mc_strerror(rc));
		srv_close(c, NULL);
		return false;
	}
	if (rc == 0) {
		log_debug("serving %s (segment %s)", c->addr, c->hs.peer);
		c->rx = RX_HDR;
	}
	return true;
}

/* Top up the staging buffer. Returns >0 bytes read, 0 would block, <0
 * closed. */
static ssize_t stage_fill(struct srv_conn *c)
{
	if (c->soff == c->slen) {
		c->soff = c->slen = 0;
	} else if (c->soff > 0 && STAGE_BYTES - c->slen < TE_WIRE_HDR_BYTES) {
		memmove(c->stage, c->stage + c->soff, c->slen - c->soff);
		c->slen -= c->soff;
		c->soff = 0;
	}
	/* After a large body, only the rest of the header: its body is read
	 * straight into the region, not through the stage. */
	size_t want = c->big ? TE_WIRE_HDR_BYTES - (c->slen - c->soff)
			     : STAGE_BYTES - c->slen;
	for (;;) {
		ssize_t n = recv(c->fd, c->stage + c->slen, want, 0);
		if (n > 0) {
			c->slen += (size_t)n;
			c->last_ms = mc_now_ms();
			return n;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return 0;
		srv_close(c, n == 0 ? "peer closed" : strerror(errno));
		return -1;
	}
}

/* A complete header is staged: start serving it. Returns false to stop
 * reading (ring full or closed). */
static bool srv_header(struct srv_conn *c)
{
	struct te_engine *e = c->x->e;
	if (c->count >= RING)
		return false; /* the header stays staged until answers drain */
	int rc = te__wire_decode(c->stage + c->soff, (uint32_t)TE_SLICE_MAX, &c->cur);
	if (rc || c->cur.type == TE_WIRE_RESP) {
		log_warn("connection from %s (segment %s): bad slice header; "
			 "closing it",
			 c->addr, c->hs.peer);
		srv_close(c, NULL);
		return false;
	}
	c->soff += TE_WIRE_HDR_BYTES;
	const struct te_wire_hdr *h = &c->cur;
	if (h->type == TE_WIRE_CTRL) {
		if (h->len > TE_CTRL_MAX_BYTES) {
			srv_close(c, "control message too large");
			return false;
		}
		c->ctrl = realloc(c->ctrl, h->len ? h->len : 1);
		if (!c->ctrl) {
			srv_close(c, "out of memory");
			return false;
		}
		c->dst = c->ctrl;
		c->left = h->len;
		c->rx = RX_CTRL;
		return true;
	}
	struct te_region *r = NULL;
	rc = te__rtable_acquire(&e->regions, h->addr, h->len, &r);
	if (rc) {
		metric_inc(e->m_refused);
		log_debug("refused %s of %u bytes at 0x%llx from %s",
			  h->type == TE_WIRE_READ ? "read" : "write", h->len,
			  (unsigned long long)h->addr, c->hs.peer);
	}
	if (h->type == TE_WIRE_READ) {
		c->big = false; /* a READ header is all there is to read */
		struct resp *p = push_resp(c, rc, rc ? 0 : h->len, h->id);
		if (rc == 0) {
			p->data = r->local + (h->addr - r->addr);
			p->len = h->len;
			p->r = r;
		}
		return true;
	}
	/* WRITE */
	c->left = h->len;
	c->big = h->len >= STAGE_BYTES;
	if (rc) {
		c->cur_err = rc;
		c->rx = RX_DISCARD;
	} else {
		c->cur_r = r;
		c->dst = r->local + (h->addr - r->addr);
		c->rx = RX_PAYLOAD;
	}
	return true;
}

/* A control message for transport addr (rdma QP exchange): its answer,
 * or -EPROTONOSUPPORT when that transport takes none. */
static void srv_ctrl(struct srv_conn *c)
{
	struct te_engine *e = c->x->e;
	uint64_t xid = c->cur.addr;
	const struct te_xport_ops *ops = xid < 4 ? e->xops[xid] : NULL;
	struct te_xport *x = xid < 4 ? e->xp[xid] : NULL;
	if (!ops || !x || !ops->on_ctrl) {
		push_resp(c, -EPROTONOSUPPORT, 0, c->cur.id);
		return;
	}
	if (c->ctrl_conn && c->ctrl_xid != xid) { /* one transport per connection */
		push_resp(c, -EINVAL, 0, c->cur.id);
		return;
	}
	uint8_t *out = malloc(TE_CTRL_MAX_BYTES);
	size_t outlen = TE_CTRL_MAX_BYTES;
	int rc = out ? ops->on_ctrl(x, c->hs.peer, &c->ctrl_conn, c->ctrl, c->cur.len, out,
				    &outlen)
		     : -ENOMEM;
	if (c->ctrl_conn)
		c->ctrl_xid = xid;
	if (rc || outlen > TE_CTRL_MAX_BYTES) {
		free(out);
		push_resp(c, rc ? rc : -EOVERFLOW, 0, c->cur.id);
		return;
	}
	struct resp *r = push_resp(c, 0, (uint32_t)outlen, c->cur.id);
	r->data = out;
	r->len = outlen;
	r->owned = true;
}

static void srv_body_done(struct srv_conn *c)
{
	struct te_engine *e = c->x->e;
	if (c->rx == RX_PAYLOAD) {
		metric_add(e->m_served[TE_PROTO_TCP][1], c->cur.len);
		te__rtable_release(&e->regions, c->cur_r);
		c->cur_r = NULL;
		push_resp(c, 0, 0, c->cur.id);
	} else if (c->rx == RX_DISCARD) {
		push_resp(c, c->cur_err, 0, c->cur.id);
	} else {
		srv_ctrl(c);
	}
	c->rx = RX_HDR;
}

/* Read and serve. Returns false when the connection closed. */
static bool srv_read(struct srv_conn *c)
{
	/* The budget bounds what one wake-up reads from the socket (the
	 * level-triggered epoll calls again); staged bytes are always
	 * processed, so nothing already read waits for another event. */
	size_t budget = READ_BUDGET;
	if (c->rx == RX_HS)
		return srv_handshake(c);
	while (!c->closed) {
		if (c->rx == RX_HDR) {
			if (c->slen - c->soff < TE_WIRE_HDR_BYTES) {
				if (budget == 0)
					return true;
				ssize_t n = stage_fill(c);
				if (n <= 0)
					return n == 0;
				budget -= MC_MIN(budget, (size_t)n);
				continue;
			}
			if (!srv_header(c))
				return !c->closed;
			if (c->rx != RX_HDR && c->left == 0)
				srv_body_done(c);
			continue;
		}
		/* A body: staged bytes first, then straight from the socket
		 * into the region (and whatever follows into the stage). */
		size_t staged = MC_MIN(c->slen - c->soff, c->left);
		if (staged) {
			if (c->rx != RX_DISCARD)
				memcpy(c->dst, c->stage + c->soff, staged);
			c->dst += staged;
			c->soff += staged;
			c->left -= staged;
		} else {
			if (budget == 0)
				return true;
			if (c->soff == c->slen)
				c->soff = c->slen = 0;
			struct iovec iov[2];
			int n = 0;
			if (c->rx != RX_DISCARD) {
				iov[n].iov_base = c->dst;
				iov[n++].iov_len = c->left;
			}
			iov[n].iov_base = c->stage + c->slen;
			iov[n++].iov_len = stage_tail(c->left, STAGE_BYTES - c->slen);
			ssize_t got = readv(c->fd, iov, n);
			if (got < 0 && errno == EINTR)
				continue;
			if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
				return true;
			if (got <= 0) {
				srv_close(c, got == 0 ? "peer closed" : strerror(errno));
				return false;
			}
			c->last_ms = mc_now_ms();
			budget -= MC_MIN(budget, (size_t)got);
			size_t into = c->rx == RX_DISCARD ? 0 : MC_MIN((size_t)got, c->left);
			c->dst += into;
			c->left -= into;
			c->slen += (size_t)got - into;
		}
		if (c->left == 0)
			srv_body_done(c);
	}
	return !c->closed;
}

static void srv_on_io(struct te_ioh *h, uint32_t events)
{
	struct srv_conn *c = MC_CONTAINER_OF(h, struct srv_conn, ioh);
	if (c->closed)
		return;
	if ((events & (EPOLLERR | EPOLLHUP)) && !(events & EPOLLIN)) {
		srv_close(c, "socket error");
		return;
	}
	if ((events & EPOLLOUT) && !srv_write(c))
		return;
	if ((events & EPOLLIN) && !srv_read(c))
		return;
	/* Answers queued by the read go out now when they can. */
	if (c->count > 0 && !srv_write(c))
		return;
	/* A header left staged while the ring was full. */
	if (c->count < RING && c->rx == RX_HDR && c->slen - c->soff >= TE_WIRE_HDR_BYTES &&
	    !srv_read(c))
		return;
	srv_set_events(c);
}

static void srv_add_task(struct te_task *t)
{
	struct srv_conn *c = MC_CONTAINER_OF(t, struct srv_conn, add_task);
	c->events = EPOLLIN;
	if (te__worker_add(c->w, c->fd, &c->ioh, EPOLLIN) != 0)
		srv_close(c, "epoll_ctl failed");
}

static void on_accept(struct te_ioh *h, uint32_t events)
{
	struct tcp_xport *x = MC_CONTAINER_OF(h, struct tcp_xport, lioh);
	struct te_engine *e = x->e;
	(void)events;
	for (int i = 0; i < 64; i++) {
		struct sockaddr_storage ss;
		socklen_t sl = sizeof(ss);
		int fd = accept4(x->lfd, (struct sockaddr *)&ss, &sl,
				 SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR &&
			    errno != ECONNABORTED)
				log_warn("accept on the data port: %s", strerror(errno));
			return;
		}
		struct srv_conn *c = calloc(1, sizeof(*c));
		uint8_t *stage = malloc(STAGE_BYTES);
		if (!c || !stage || mc_random(c->hs.nonce_s, TE_HS_NONCE) != 0) {
			free(c);
			free(stage);
			close(fd);
			continue;
		}
		tune_socket(x, fd);
		c->x = x;
		c->fd = fd;
		c->stage = stage;
		c->ioh.on_io = srv_on_io;
		c->rx = RX_HS;
		c->last_ms = mc_now_ms();
		c->hs.secret = e->secret_len ? e->secret : NULL;
		c->hs.secret_len = e->secret_len;
		c->hs.own_name = e->name;
		mc_format_addr((struct sockaddr *)&ss, c->addr, sizeof(c->addr));
		c->w = &e->workers[atomic_fetch_add(&x->rr, 1) % e->nworkers];
		pthread_mutex_lock(&x->mu);
		c->next = x->srv;
		if (x->srv)
			x->srv->pprev = &c->next;
		c->pprev = &x->srv;
		x->srv = c;
		pthread_mutex_unlock(&x->mu);
		c->add_task.run = srv_add_task;
		te__worker_post(c->w, &c->add_task);
	}
}

/* ------------------------------------------------------------ client side */

struct tcp_peer;

struct cli_conn {
	struct te_ioh ioh;
	struct tcp_peer *p;
	unsigned path;
	struct te_worker *w;
	int fd;
	uint32_t events;
	struct cli_conn *next, **pprev; /* xport list (ticks) */
	atomic_bool kicked;         /* kick_task is queued: only that task
				     * (when it starts) clears it, so the task
				     * is never queued twice */
	atomic_bool dead;
	struct te_task kick_task, close_task, free_task;
	/* worker-owned: every slice taken, in send order; tx is the first
	 * not completely sent, tx_off how much of it went out; out_* what is
	 * taken and not answered yet */
	struct te_slice *fifo, **fifo_tail, *tx;
	size_t tx_off;
	size_t out_bytes, out_n;
	uint64_t next_id;
	uint8_t *stage;
	size_t slen, soff;
	struct te_slice *rx;        /* READ answer being received */
	size_t rx_left;
	uint64_t last_ms;
	bool closed;
};

/*
 * A peer's slices wait in one queue and each connection takes from it
 * while it has less than WINDOW_BYTES (and WINDOW_SLICES) unanswered: the
 * stripe follows each connection's actual speed, and a connection never
 * idles while another has a backlog.
 */
struct tcp_peer {
	struct te_peer base;
	struct tcp_xport *x;
	unsigned n;
	atomic_uint to_free;        /* connections not yet freed */
	pthread_mutex_t qmu;
	struct te_slice *q, **q_tail;
	size_t qn;                  /* slices queued */
	struct cli_conn *conns[TE_MAX_PATHS];
};

#define WINDOW_BYTES ((size_t)32 << 20)
#define WINDOW_SLICES 256

static void cli_free_task(struct te_task *t)
{
	struct cli_conn *c = MC_CONTAINER_OF(t, struct cli_conn, free_task);
	struct tcp_peer *p = c->p;
	free(c->stage);
	free(c);
	if (atomic_fetch_sub(&p->to_free, 1) == 1) {
		metric_sub(p->x->e->m_peers[TE_PROTO_TCP], 1);
		pthread_mutex_destroy(&p->qmu);
		free(p);
	}
}

static void fail_list(struct te_slice *s, int err)
{
	while (s) {
		struct te_slice *next = s->next;
		s->next = NULL;
		te__slice_done(s, err, true);
		s = next;
	}
}

/* Kick every live connection of the peer that is not kicked yet. */
static void kick_all(struct tcp_peer *p)
{
	for (unsigned i = 0; i < p->n; i++) {
		struct cli_conn *c = p->conns[i];
		if (atomic_load(&c->dead) || atomic_exchange(&c->kicked, true))
			continue;
		te__peer_ref(&p->base); /* the kick task's */
		te__worker_post(c->w, &c->kick_task);
	}
}

/* The connection is done for (worker thread): fail what it holds over to
 * the other paths; the last one fails what is queued too. */
static void cli_fail(struct cli_conn *c, int err)
{
	if (c->closed)
		return;
	c->closed = true;
	struct tcp_peer *p = c->p;
	struct te_peer *bp = &p->base;
	struct tcp_xport *x = p->x;
	if (!atomic_load(&bp->closed))
		log_warn("segment %s: connection %u failed: %s", bp->seg->name, c->path,
			 mc_strerror(err));
	atomic_store(&c->dead, true);
	te__worker_del(c->w, c->fd);
	close(c->fd);
	pthread_mutex_lock(&x->mu);
	*c->pprev = c->next;
	if (c->next)
		c->next->pprev = c->pprev;
	pthread_mutex_unlock(&x->mu);
	struct te_slice *fifo = c->fifo, *q = NULL;
	c->fifo = c->tx = c->rx = NULL;
	c->fifo_tail = &c->fifo;
	c->out_bytes = c->out_n = 0;
	pthread_mutex_lock(&p->qmu);
	te__peer_path_down(bp, c->path);
	if (atomic_load(&bp->alive) == 0) {
		q = p->q;
		p->q = NULL;
		p->q_tail = &p->q;
		p->qn = 0;
	}
	pthread_mutex_unlock(&p->qmu);
	fail_list(fifo, err); /* back into the queue for the others */
	fail_list(q, err);
}

static void cli_set_events(struct cli_conn *c)
{
	uint32_t ev = EPOLLIN | (c->tx ? EPOLLOUT : 0);
	if (ev != c->events && !c->closed) {
		c->events = ev;
		if (te__worker_mod(c->w, c->fd, &c->ioh, ev) != 0)
			cli_fail(c, -EIO);
	}
}

/* Take queued slices while the window has room; into the send order. */
static void cli_take(struct cli_conn *c)
{
	struct tcp_peer *p = c->p;
	struct te_slice *got = NULL, **tail = &got;
	if (c->closed)
		return;
	pthread_mutex_lock(&p->qmu);
	/* At most a fair share of what waits per take, so the first
	 * connection woken does not take a whole batch; a fast one comes back
	 * for more sooner. */
	unsigned live = (unsigned)__builtin_popcount(atomic_load(&p->base.alive));
	size_t share = live ? (p->qn + live - 1) / live : p->qn;
	while (p->q && share-- > 0 && c->out_bytes < WINDOW_BYTES &&
	       c->out_n < WINDOW_SLICES) {
		struct te_slice *s = p->q;
		p->q = s->next;
		p->qn--;
		if (!p->q)
			p->q_tail = &p->q;
		s->next = NULL;
		*tail = s;
		tail = &s->next;
		c->out_bytes += s->len;
		c->out_n++;
	}
	pthread_mutex_unlock(&p->qmu);
	if (got && !c->fifo)
		c->last_ms = mc_now_ms(); /* the io timeout counts from now */
	for (struct te_slice *next, *s = got; s; s = next) {
		next = s->next;
		s->next = NULL;
		s->path = (uint16_t)c->path;
		int doomed = te__slice_doomed(s);
		if (doomed) { /* its request failed already: do not send it */
			c->out_bytes -= s->len;
			c->out_n--;
			te__slice_done(s, doomed, false);
			continue;
		}
		struct te_wire_hdr h = {
			.type = s->op == TE_WRITE ? TE_WIRE_WRITE : TE_WIRE_READ,
			.len = s->len,
			.id = s->wire_id = ++c->next_id,
			.addr = s->remote,
		};
		te__wire_encode(&h, s->hdr);
		*c->fifo_tail = s;
		c->fifo_tail = &s->next;
		if (!c->tx) {
			c->tx = s;
			c->tx_off = 0;
		}
	}
}

static bool cli_write(struct cli_conn *c)
{
	while (c->tx) {
		struct iovec iov[MAX_IOV];
		int n = 0;
		size_t off = c->tx_off;
		for (struct te_slice *s = c->tx; s && n + 2 <= MAX_IOV; s = s->next) {
			if (off < TE_WIRE_HDR_BYTES) {
				iov[n].iov_base = s->hdr + off;
				iov[n++].iov_len = TE_WIRE_HDR_BYTES - off;
				off = 0;
			} else {
				off -= TE_WIRE_HDR_BYTES;
			}
			if (s->op == TE_WRITE && s->len > off) {
				iov[n].iov_base = s->local + off;
				iov[n++].iov_len = s->len - off;
			}
			off = 0;
		}
		ssize_t w = send_iov(c->fd, iov, n);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return true;
			cli_fail(c, errno == EPIPE || errno == ECONNRESET ? MC_EUNAVAILABLE
									 : -errno);
			return false;
		}
		c->last_ms = mc_now_ms();
		size_t done = (size_t)w + c->tx_off;
		while (c->tx) {
			size_t total = TE_WIRE_HDR_BYTES +
				       (c->tx->op == TE_WRITE ? c->tx->len : 0);
			if (done < total)
				break;
			done -= total;
			c->tx = c->tx->next;
		}
		c->tx_off = done;
	}
	return true;
}

static void cli_complete_head(struct cli_conn *c, int err)
{
	struct te_slice *s = c->fifo;
	c->fifo = s->next;
	if (!c->fifo)
		c->fifo_tail = &c->fifo;
	s->next = NULL;
	c->out_bytes -= s->len;
	c->out_n--;
	te__slice_done(s, err, false);
}

static bool cli_fill(struct cli_conn *c, ssize_t *got)
{
	if (c->soff == c->slen) {
		c->soff = c->slen = 0;
	} else if (c->soff > 0 && STAGE_BYTES - c->slen < TE_WIRE_HDR_BYTES) {
		memmove(c->stage, c->stage + c->soff, c->slen - c->soff);
		c->slen -= c->soff;
		c->soff = 0;
	}
	/* When the answer due is a large READ, only its header (as
	 * stage_fill does on the serving side). */
	struct te_slice *s = c->fifo;
	size_t want = s && s != c->tx && s->op == TE_READ && s->len >= STAGE_BYTES
			      ? TE_WIRE_HDR_BYTES - (c->slen - c->soff)
			      : STAGE_BYTES - c->slen;
	for (;;) {
		ssize_t n = recv(c->fd, c->stage + c->slen, want, 0);
		if (n > 0) {
			c->slen += (size_t)n;
			c->last_ms = mc_now_ms();
			*got = n;
			return true;
		}
		if (n < 0 && errno == EINTR)
			continue;
		*got = 0;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return true;
		cli_fail(c, MC_EUNAVAILABLE);
		return false;
	}
}

/* An answer header is staged. */
static bool cli_header(struct cli_conn *c)
{
	struct te_wire_hdr h;
	struct te_slice *s = c->fifo;
	int rc = te__wire_decode(c->stage + c->soff, (uint32_t)TE_SLICE_MAX, &h);
	if (rc || h.type != TE_WIRE_RESP || !s || h.id != s->wire_id ||
	    s == c->tx /* answered before it was sent */ ||
	    (h.status == 0 && h.len != (s->op == TE_READ ? s->len : 0))) {
		log_warn("segment %s: connection %u: unexpected answer from the peer",
			 c->p->base.seg->name, c->path);
		cli_fail(c, MC_EPROTOCOL);
		return false;
	}
	c->soff += TE_WIRE_HDR_BYTES;
	if (h.status < 0) {
		cli_complete_head(c, h.status);
		return true;
	}
	if (s->op == TE_WRITE || h.len == 0) {
		cli_complete_head(c, 0);
		return true;
	}
	c->rx = s;
	c->rx_left = h.len;
	return true;
}

static bool cli_read(struct cli_conn *c)
{
	size_t budget = READ_BUDGET; /* socket bytes per wake-up, as srv_read */
	while (!c->closed) {
		if (!c->rx) {
			if (c->slen - c->soff < TE_WIRE_HDR_BYTES) {
				if (budget == 0)
					return true;
				ssize_t got;
				if (!cli_fill(c, &got))
					return false;
				if (got == 0)
					return true;
				budget -= MC_MIN(budget, (size_t)got);
				continue;
			}
			if (!cli_header(c))
				return false;
			continue;
		}
		struct te_slice *s = c->rx;
		uint8_t *dst = s->local + (s->len - c->rx_left);
		size_t staged = MC_MIN(c->slen - c->soff, c->rx_left);
		if (staged) {
			memcpy(dst, c->stage + c->soff, staged);
			c->soff += staged;
			c->rx_left -= staged;
		} else {
			if (budget == 0)
				return true;
			if (c->soff == c->slen)
				c->soff = c->slen = 0;
			struct iovec iov[2] = {
				{dst, c->rx_left},
				{c->stage + c->slen,
				 stage_tail(c->rx_left, STAGE_BYTES - c->slen)}};
			ssize_t got = readv(c->fd, iov, 2);
			if (got < 0 && errno == EINTR)
				continue;
			if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
				return true;
			if (got <= 0) {
				cli_fail(c, MC_EUNAVAILABLE);
				return false;
			}
			c->last_ms = mc_now_ms();
			budget -= MC_MIN(budget, (size_t)got);
			size_t into = MC_MIN((size_t)got, c->rx_left);
			c->rx_left -= into;
			c->slen += (size_t)got - into;
		}
		if (c->rx_left == 0) {
			c->rx = NULL;
			cli_complete_head(c, 0);
		}
	}
	return !c->closed;
}

static void cli_on_io(struct te_ioh *h, uint32_t events)
{
	struct cli_conn *c = MC_CONTAINER_OF(h, struct cli_conn, ioh);
	if (c->closed)
		return;
	if ((events & (EPOLLERR | EPOLLHUP)) && !(events & EPOLLIN)) {
		cli_fail(c, MC_EUNAVAILABLE);
		return;
	}
	if ((events & EPOLLOUT) && !cli_write(c))
		return;
	if ((events & EPOLLIN) && !cli_read(c))
		return;
	/* Answers made room in the window: take more and send them. */
	if (c->out_bytes < WINDOW_BYTES && c->out_n < WINDOW_SLICES) {
		cli_take(c);
		if (!cli_write(c))
			return;
	}
	cli_set_events(c);
}

static void cli_kick_task(struct te_task *t)
{
	struct cli_conn *c = MC_CONTAINER_OF(t, struct cli_conn, kick_task);
	struct tcp_peer *p = c->p;
	/* Off the queue now: a submit from here on queues it again, and
	 * what was queued before is taken below. */
	atomic_store(&c->kicked, false);
	if (!c->closed) {
		cli_take(c);
		if (cli_write(c))
			cli_set_events(c);
	}
	te__peer_unref(&p->base); /* the kick's */
}

static void cli_close_task(struct te_task *t)
{
	struct cli_conn *c = MC_CONTAINER_OF(t, struct cli_conn, close_task);
	struct tcp_peer *p = c->p;
	cli_fail(c, p->x->e->stopped ? MC_ESHUTDOWN : MC_EUNAVAILABLE);
	te__peer_unref(&p->base);
}

static void cli_add_task(struct te_task *t)
{
	struct cli_conn *c = MC_CONTAINER_OF(t, struct cli_conn, kick_task);
	struct tcp_peer *p = c->p;
	c->kick_task.run = cli_kick_task;
	atomic_store(&c->kicked, false); /* as cli_kick_task */
	c->events = EPOLLIN;
	if (te__worker_add(c->w, c->fd, &c->ioh, EPOLLIN) != 0) {
		cli_fail(c, -EIO);
	} else {
		cli_take(c);
		if (cli_write(c))
			cli_set_events(c);
	}
	te__peer_unref(&p->base);
}

/* ------------------------------------------------------------ transport ops */

/* The path the batch layer chose is a hint: the slice joins the peer's
 * queue and the first connection with room takes it. */
static void tcp_submit(struct te_peer *bp, struct te_slice *s)
{
	struct tcp_peer *p = (struct tcp_peer *)bp;
	pthread_mutex_lock(&p->qmu);
	if (atomic_load(&bp->alive) == 0) {
		pthread_mutex_unlock(&p->qmu);
		te__slice_done(s, MC_EUNAVAILABLE, true);
		return;
	}
	s->next = NULL;
	*p->q_tail = s;
	p->q_tail = &s->next;
	p->qn++;
	pthread_mutex_unlock(&p->qmu);
	kick_all(p);
}

static void tcp_disconnect(struct te_peer *bp)
{
	struct tcp_peer *p = (struct tcp_peer *)bp;
	atomic_store(&bp->closed, true);
	for (unsigned i = 0; i < p->n; i++) {
		te__peer_ref(bp);
		te__worker_post(p->conns[i]->w, &p->conns[i]->close_task);
	}
}

static void tcp_peer_free(struct te_peer *bp)
{
	struct tcp_peer *p = (struct tcp_peer *)bp;
	/* Each connection is freed on its worker, after any event for it
	 * already collected there; the last one frees p, so nothing of p is
	 * read once the first task is posted. */
	struct cli_conn *conns[TE_MAX_PATHS];
	unsigned n = p->n;
	memcpy(conns, p->conns, n * sizeof(*conns));
	for (unsigned i = 0; i < n; i++)
		te__worker_post(conns[i]->w, &conns[i]->free_task);
}

/* Connect with a deadline. Returns the fd or a negative code. */
static int dial(const struct sockaddr_storage *ss, uint64_t deadline)
{
	int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	socklen_t sl = ss->ss_family == AF_INET6 ? sizeof(struct sockaddr_in6)
						 : sizeof(struct sockaddr_in);
	if (connect(fd, (const struct sockaddr *)ss, sl) == 0)
		return fd;
	if (errno != EINPROGRESS) {
		int rc = -errno;
		close(fd);
		return rc;
	}
	for (;;) {
		uint64_t now = mc_now_ms();
		if (now >= deadline) {
			close(fd);
			return MC_ETIMEDOUT;
		}
		struct pollfd pfd = {fd, POLLOUT, 0};
		int n = poll(&pfd, 1, (int)MC_MIN(deadline - now, 1000));
		if (n < 0 && errno != EINTR) {
			int rc = -errno;
			close(fd);
			return rc;
		}
		if (n > 0)
			break;
	}
	int soerr = 0;
	socklen_t len = sizeof(soerr);
	if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) != 0 || soerr) {
		close(fd);
		return soerr ? -soerr : -EIO;
	}
	return fd;
}

static int tcp_connect(struct te_xport *xp, struct te_segment *seg,
		       const struct te_desc *d, struct te_peer **out)
{
	struct tcp_xport *x = (struct tcp_xport *)xp;
	struct te_engine *e = x->e;
	char hp[TE_HOST_MAX + 16];
	struct sockaddr_storage ss;
	int fds[TE_MAX_PATHS];
	unsigned n = e->tcp_conns, i;
	int rc = 0;

	snprintf(hp, sizeof(hp), strchr(d->host, ':') ? "[%s]:%u" : "%s:%u", d->host,
		 d->data_port);
	if (mc_parse_hostport(hp, &ss) != 0)
		return MC_EPROTOCOL;
	uint64_t deadline = mc_now_ms() + TE_CONNECT_TIMEOUT_MS;
	for (i = 0; i < n; i++) {
		fds[i] = dial(&ss, deadline);
		if (fds[i] < 0) {
			rc = fds[i] == -ECONNREFUSED ? MC_EUNAVAILABLE : fds[i];
			break;
		}
		tune_socket(x, fds[i]);
		rc = te__hs_client(fds[i], e->secret_len ? e->secret : NULL,
				   e->secret_len, e->name, d->name,
				   deadline > mc_now_ms() ? deadline - mc_now_ms() : 1);
		if (rc) {
			if (rc == -ECONNRESET)
				rc = MC_EUNAVAILABLE;
			close(fds[i]);
			break;
		}
	}
	struct tcp_peer *p = rc ? NULL : calloc(1, sizeof(*p));
	for (unsigned k = 0; p && k < n; k++) {
		struct cli_conn *c = calloc(1, sizeof(*c));
		uint8_t *stage = malloc(STAGE_BYTES);
		if (!c || !stage) {
			free(c);
			free(stage);
			for (unsigned j = 0; j < k; j++) {
				free(p->conns[j]->stage);
				free(p->conns[j]);
			}
			free(p);
			p = NULL;
			break;
		}
		c->p = p;
		c->path = k;
		c->fd = fds[k];
		c->stage = stage;
		c->ioh.on_io = cli_on_io;
		c->fifo_tail = &c->fifo;
		atomic_init(&c->kicked, true); /* until the add task took over */
		c->close_task.run = cli_close_task;
		c->free_task.run = cli_free_task;
		c->w = &e->workers[atomic_fetch_add(&e->rr, 1) % e->nworkers];
		p->conns[k] = c;
	}
	if (!p) {
		for (unsigned k = 0; k < i; k++)
			close(fds[k]);
		return rc ? rc : -ENOMEM;
	}
	p->base.ops = &te__tcp_ops;
	p->base.x = xp;
	p->base.seg = seg;
	p->base.npaths = n;
	atomic_init(&p->base.refs, 1 + (int)n); /* the segment's + add tasks */
	atomic_init(&p->base.alive, n >= 32 ? 0xffffffffu : (1u << n) - 1);
	p->x = x;
	p->n = n;
	atomic_init(&p->to_free, n);
	pthread_mutex_init(&p->qmu, NULL);
	p->q_tail = &p->q;
	for (unsigned k = 0; k < n; k++) {
		struct cli_conn *c = p->conns[k];
		pthread_mutex_lock(&x->mu);
		c->next = x->cli;
		if (x->cli)
			x->cli->pprev = &c->next;
		c->pprev = &x->cli;
		x->cli = c;
		pthread_mutex_unlock(&x->mu);
		c->kick_task.run = cli_add_task;
		te__worker_post(c->w, &c->kick_task);
	}
	metric_add(e->m_peers[TE_PROTO_TCP], 1);
	*out = &p->base;
	return 0;
}

/* ------------------------------------------------------------ control calls */

int te__ctrl_open(struct te_engine *e, const struct te_desc *d, uint64_t timeout_ms)
{
	char hp[TE_HOST_MAX + 16];
	struct sockaddr_storage ss;
	snprintf(hp, sizeof(hp), strchr(d->host, ':') ? "[%s]:%u" : "%s:%u", d->host,
		 d->data_port);
	if (!(d->transports & TE_XP_TCP) || mc_parse_hostport(hp, &ss) != 0)
		return MC_EUNAVAILABLE;
	int fd = dial(&ss, mc_now_ms() + timeout_ms);
	if (fd < 0)
		return fd == -ECONNREFUSED ? MC_EUNAVAILABLE : fd;
	int rc = te__hs_client(fd, e->secret_len ? e->secret : NULL, e->secret_len,
			       e->name, d->name, timeout_ms);
	if (rc) {
		close(fd);
		return rc == -ECONNRESET ? MC_EUNAVAILABLE : rc;
	}
	return fd;
}

int te__ctrl_xchg(int fd, unsigned xid, const uint8_t *in, size_t inlen, uint8_t *out,
		  size_t *outlen, uint64_t timeout_ms)
{
	if (inlen > TE_CTRL_MAX_BYTES)
		return -EINVAL;
	uint64_t deadline = mc_now_ms() + timeout_ms;
	struct te_wire_hdr h = {.type = TE_WIRE_CTRL, .len = (uint32_t)inlen, .id = 1,
				.addr = xid};
	uint8_t hb[TE_WIRE_HDR_BYTES];
	te__wire_encode(&h, hb);
	int rc = te__io_full(fd, hb, sizeof(hb), true, deadline);
	if (rc == 0 && inlen)
		rc = te__io_full(fd, (void *)in, inlen, true, deadline);
	if (rc == 0)
		rc = te__io_full(fd, hb, sizeof(hb), false, deadline);
	if (rc == 0)
		rc = te__wire_decode(hb, TE_CTRL_MAX_BYTES, &h);
	if (rc == 0 && (h.type != TE_WIRE_RESP || h.id != 1))
		rc = MC_EPROTOCOL;
	if (rc == 0 && h.status)
		rc = h.status;
	if (rc == 0 && h.len > *outlen)
		rc = -EOVERFLOW;
	if (rc == 0 && h.len)
		rc = te__io_full(fd, out, h.len, false, deadline);
	if (rc == 0)
		*outlen = h.len;
	return rc == -ECONNRESET ? MC_EUNAVAILABLE : rc;
}

int te__ctrl_call(struct te_engine *e, const struct te_desc *d, unsigned xid,
		  const uint8_t *in, size_t inlen, uint8_t *out, size_t *outlen,
		  uint64_t timeout_ms)
{
	if (inlen > TE_CTRL_MAX_BYTES)
		return -EINVAL;
	int fd = te__ctrl_open(e, d, timeout_ms);
	if (fd < 0)
		return fd;
	int rc = te__ctrl_xchg(fd, xid, in, inlen, out, outlen, timeout_ms);
	close(fd);
	return rc;
}

/* ------------------------------------------------------------ timeouts */

static void tcp_tick(struct te_xport *xp, struct te_worker *w)
{
	struct tcp_xport *x = (struct tcp_xport *)xp;
	uint64_t now = mc_now_ms(), limit = x->e->io_timeout_ms;
	struct cli_conn *cv[64];
	struct srv_conn *sv[64];
	size_t nc = 0, ns = 0;
	pthread_mutex_lock(&x->mu);
	for (struct cli_conn *c = x->cli; c && nc < 64; c = c->next)
		if (c->w == w && c->fifo && now - c->last_ms > limit)
			cv[nc++] = c;
	for (struct srv_conn *c = x->srv; c && ns < 64; c = c->next) {
		bool busy = c->rx != RX_HDR || c->count > 0 || c->slen > c->soff;
		if (c->w == w && busy && now - c->last_ms > limit)
			sv[ns++] = c;
	}
	pthread_mutex_unlock(&x->mu);
	/* Only this worker closes or frees its connections: still valid. */
	for (size_t i = 0; i < nc; i++)
		cli_fail(cv[i], MC_ETIMEDOUT);
	for (size_t i = 0; i < ns; i++) {
		log_warn("connection from %s (segment %s): no progress for %llu ms; "
			 "closing it",
			 sv[i]->addr, sv[i]->hs.peer[0] ? sv[i]->hs.peer : "?",
			 (unsigned long long)limit);
		srv_close(sv[i], NULL);
	}
}

/* ------------------------------------------------------------ engine-wide */

static int tcp_init(struct te_engine *e, struct te_xport **out)
{
	struct sockaddr_storage ss;
	int rc;
	if (mc_parse_hostport(e->data_listen, &ss) != 0)
		return -EINVAL;
	struct tcp_xport *x = calloc(1, sizeof(*x));
	if (!x)
		return -ENOMEM;
	x->e = e;
	pthread_mutex_init(&x->mu, NULL);
	x->lioh.on_io = on_accept;
	pick_sockbufs(x);
	x->lfd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (x->lfd < 0) {
		rc = -errno;
		goto fail;
	}
	int one = 1;
	(void)setsockopt(x->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	socklen_t sl = ss.ss_family == AF_INET6 ? sizeof(struct sockaddr_in6)
						: sizeof(struct sockaddr_in);
	if (bind(x->lfd, (struct sockaddr *)&ss, sl) != 0 || listen(x->lfd, 512) != 0) {
		rc = -errno;
		log_error("transfer engine: cannot listen on %s: %s", e->data_listen,
			  strerror(errno));
		goto fail_fd;
	}
	sl = sizeof(ss);
	getsockname(x->lfd, (struct sockaddr *)&ss, &sl);
	x->port = ntohs(ss.ss_family == AF_INET6
				? ((struct sockaddr_in6 *)&ss)->sin6_port
				: ((struct sockaddr_in *)&ss)->sin_port);
	rc = te__worker_add(&e->workers[0], x->lfd, &x->lioh, EPOLLIN);
	if (rc)
		goto fail_fd;
	*out = (struct te_xport *)x;
	return 0;
fail_fd:
	close(x->lfd);
fail:
	pthread_mutex_destroy(&x->mu);
	free(x);
	return rc;
}

/* After the workers stopped: nothing else touches the connections. */
static void tcp_fini(struct te_xport *xp)
{
	struct tcp_xport *x = (struct tcp_xport *)xp;
	close(x->lfd);
	while (x->srv) {
		struct srv_conn *c = x->srv;
		srv_teardown(c); /* unlinks it */
		free(c->stage);
		free(c->ctrl);
		free(c);
	}
	/* Client connections belong to peers freed with their segments. */
	pthread_mutex_destroy(&x->mu);
	free(x);
}

uint16_t te__tcp_port(const struct te_xport *xp)
{
	return ((const struct tcp_xport *)xp)->port;
}

static void tcp_describe(struct te_xport *xp, struct te_desc *d)
{
	d->data_port = ((struct tcp_xport *)xp)->port;
}

const struct te_xport_ops te__tcp_ops = {
	.name = "tcp",
	.proto = TE_PROTO_TCP,
	.init = tcp_init,
	.fini = tcp_fini,
	.describe = tcp_describe,
	.connect = tcp_connect,
	.submit = tcp_submit,
	.disconnect = tcp_disconnect,
	.peer_free = tcp_peer_free,
	.tick = tcp_tick,
};
