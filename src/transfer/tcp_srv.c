/*
 * tcp_srv: the serving side of the tcp transport (tcp_int.h). The
 * listener (on worker 0) spreads accepted connections over the workers.
 * A connection must complete the handshake (the cluster secret, wire.h)
 * before any slice is looked at; every slice's range is then checked
 * against the registered regions: a refused READ gets an error answer, a
 * refused WRITE's bytes are read and dropped, and nothing in memory is
 * touched. A region is counted busy while a slice reads or writes it, so
 * unregistering waits for it. Answers queue in a fixed ring per
 * connection; a full ring stops reading (back-pressure). CTRL messages
 * are handed to the transport they name (rdma's queue-pair exchange).
 * A region of another process's memory (te_register_process) is reached
 * through a bounce buffer: a WRITE's body is read into the connection's
 * bounce buffer and written there once complete, a READ's bytes are
 * read from there into a buffer of the answer.
 * Memory: per connection a 64 KiB staging buffer, and a bounce buffer of
 * the largest slice written to another process's memory; a READ of such
 * memory has a buffer of its length until it is sent.
 */
#include <errno.h>
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
#include "transfer/tcp_int.h"

#define LOG_SUBSYS LOGS_TCP

#define RING 256 /* answers queued per connection */

struct resp {
	uint8_t hdr[TE_WIRE_HDR_BYTES];
	uint8_t *data;
	size_t len;
	struct te_region *r; /* released once sent */
	bool owned;          /* data is freed once sent (CTRL answers,
			      * reads of another process's memory) */
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
	bool handshaking; /* counted in x->hs */
	struct te_hs_server hs;
	uint8_t hsbuf[TE_HS_BYTES];
	size_t hsgot;
	/* receiving */
	enum rx_state rx;
	uint8_t *stage;
	size_t slen, soff; /* staged bytes [soff, slen) */
	struct te_wire_hdr cur;
	struct te_region *cur_r;
	uint8_t *dst;
	size_t left;
	int cur_err;
	uint8_t *bounce; /* WRITE body for another process's memory */
	size_t bounce_cap;
	uint8_t *ctrl;     /* CTRL payload (rdma QP exchange) */
	void *ctrl_conn;   /* the transport's state for this connection */
	uint64_t ctrl_xid; /* ... and which transport it is */
	bool big;          /* the last body was large */
	/* answering */
	struct resp ring[RING];
	unsigned head, count;
	size_t tx_off;
	bool wfull;       /* a write found the socket's buffer full; EPOLLOUT clears */
	uint64_t last_ms; /* last progress */
};

static void srv_free_task(struct te_task *t)
{
	struct srv_conn *c = MC_CONTAINER_OF(t, struct srv_conn, free_task);
	free(c->stage);
	free(c->bounce);
	free(c->ctrl);
	free(c);
}

/* Close the socket, let go of the regions, unlink. */
static void srv_teardown(struct srv_conn *c)
{
	struct te_engine *e = c->x->e;
	c->closed = true;
	close(c->fd);
	te__hs_bound_leave(&c->x->hs, &c->handshaking);
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

static struct resp *push_resp(struct srv_conn *c, int status, uint32_t len, uint64_t id)
{
	struct resp *r = &c->ring[(c->head + c->count) % RING];
	struct te_wire_hdr h = {.type = TE_WIRE_RESP, .status = status, .len = len, .id = id};
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
	while (c->count > 0 && !c->wfull) {
		struct iovec iov[TE_TCP_MAX_IOV];
		int n = 0;
		size_t off = c->tx_off;
		for (unsigned i = 0; i < c->count && n + 2 <= TE_TCP_MAX_IOV; i++) {
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
		ssize_t w = te__tcp_send_iov(c->fd, iov, n, &c->wfull);
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
		log_warn("connection from %s: bad handshake (%s)", c->addr, mc_strerror(rc));
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
		log_warn("refused a connection from %s (segment %s): %s", c->addr, c->hs.peer,
			 rc == -EACCES ? "cluster secret mismatch" : mc_strerror(rc));
		srv_close(c, NULL);
		return false;
	}
	if (rc == 0) {
		/* The stage is for peers that proved the secret. */
		if (!(c->stage = malloc(TE_TCP_STAGE_BYTES))) {
			srv_close(c, "out of memory");
			return false;
		}
		te__hs_bound_leave(&c->x->hs, &c->handshaking);
		log_debug("serving %s (segment %s)", c->addr, c->hs.peer);
		c->rx = RX_HDR;
	}
	return true;
}

/* Top up the staging buffer. Returns >0 bytes read, 0 would block, <0
 * closed; *drained is set when the socket had less than was asked for. */
static ssize_t stage_fill(struct srv_conn *c, bool *drained)
{
	if (c->soff == c->slen) {
		c->soff = c->slen = 0;
	} else if (c->soff > 0 && TE_TCP_STAGE_BYTES - c->slen < TE_WIRE_HDR_BYTES) {
		memmove(c->stage, c->stage + c->soff, c->slen - c->soff);
		c->slen -= c->soff;
		c->soff = 0;
	}
	/* After a large body, only the rest of the header: its body is read
	 * straight into the region, not through the stage. */
	size_t want = c->big ? TE_WIRE_HDR_BYTES - (c->slen - c->soff)
			     : TE_TCP_STAGE_BYTES - c->slen;
	for (;;) {
		ssize_t n = recv(c->fd, c->stage + c->slen, want, 0);
		if (n > 0) {
			c->slen += (size_t)n;
			c->last_ms = mc_now_ms();
			*drained = (size_t)n < want;
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

/* A READ of another process's memory (region r, counted busy): its
 * bytes copied into a buffer the answer owns. Returns true. */
static bool srv_read_process(struct srv_conn *c, struct te_region *r)
{
	struct te_engine *e = c->x->e;
	const struct te_wire_hdr *h = &c->cur;
	uint8_t *buf = malloc(h->len ? h->len : 1);
	int rc = buf ? te__region_io(r, h->addr, buf, h->len, false) : -ENOMEM;
	te__rtable_release(&e->regions, r);
	if (rc) {
		free(buf);
		log_debug("read of %u bytes at 0x%llx for %s failed: %s", h->len,
			  (unsigned long long)h->addr, c->hs.peer, mc_strerror(rc));
		push_resp(c, rc, 0, h->id);
		return true;
	}
	metric_add(e->m_served[TE_PROTO_TCP][0], h->len);
	struct resp *p = push_resp(c, 0, h->len, h->id);
	p->data = buf;
	p->len = h->len;
	p->owned = true;
	return true;
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
		if (rc == 0 && !r->local)
			return srv_read_process(c, r);
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
	c->big = h->len >= TE_TCP_STAGE_BYTES;
	if (rc == 0 && !r->local && c->bounce_cap < h->len) {
		uint8_t *b = realloc(c->bounce, h->len);
		if (b) {
			c->bounce = b;
			c->bounce_cap = h->len;
		} else {
			te__rtable_release(&e->regions, r);
			rc = -ENOMEM;
		}
	}
	if (rc) {
		c->cur_err = rc;
		c->rx = RX_DISCARD;
	} else {
		c->cur_r = r;
		c->dst = r->local ? r->local + (h->addr - r->addr) : c->bounce;
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
		struct te_region *r = c->cur_r;
		int rc = r->local ? 0
				  : te__region_io(r, c->cur.addr, c->bounce, c->cur.len, true);
		if (rc == 0)
			metric_add(e->m_served[TE_PROTO_TCP][1], c->cur.len);
		else
			log_debug("write of %u bytes at 0x%llx for %s failed: %s", c->cur.len,
				  (unsigned long long)c->cur.addr, c->hs.peer,
				  mc_strerror(rc));
		te__rtable_release(&e->regions, r);
		c->cur_r = NULL;
		push_resp(c, rc, 0, c->cur.id);
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
	 * processed, so nothing already read waits for another event. A read
	 * that got less than it asked for emptied the socket: the next one
	 * would only fail with EAGAIN, so the wake-up ends there too (and
	 * epoll reports what arrives after). */
	size_t budget = TE_TCP_READ_BUDGET;
	bool drained = false;
	if (c->rx == RX_HS)
		return srv_handshake(c);
	while (!c->closed) {
		if (c->rx == RX_HDR) {
			if (c->slen - c->soff < TE_WIRE_HDR_BYTES) {
				if (budget == 0 || drained)
					return true;
				ssize_t n = stage_fill(c, &drained);
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
			if (budget == 0 || drained)
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
			iov[n++].iov_len = te__tcp_stage_tail(c->left,
							      TE_TCP_STAGE_BYTES - c->slen);
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
			drained = (size_t)got < iov[0].iov_len + (n > 1 ? iov[1].iov_len : 0);
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
	if (events & EPOLLOUT)
		c->wfull = false;
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

void te__tcp_on_accept(struct te_ioh *h, uint32_t events)
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
		if (!c || mc_random(c->hs.nonce_s, TE_HS_NONCE) != 0) {
			free(c);
			close(fd);
			continue;
		}
		mc_format_addr((struct sockaddr *)&ss, c->addr, sizeof(c->addr));
		if (!te__hs_bound_enter(e, &x->hs, TE_AUTH_TCP, c->addr)) {
			free(c);
			close(fd);
			continue;
		}
		te__tcp_tune_socket(x, fd);
		c->x = x;
		c->fd = fd;
		c->handshaking = true;
		c->ioh.on_io = srv_on_io;
		c->rx = RX_HS;
		c->last_ms = mc_now_ms();
		c->hs.secret = e->secret_len ? e->secret : NULL;
		c->hs.secret_len = e->secret_len;
		c->hs.own_name = e->name;
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

void te__tcp_srv_tick(struct tcp_xport *x, struct te_worker *w, uint64_t now, uint64_t limit)
{
	struct srv_conn *sv[64];
	size_t ns = 0;
	pthread_mutex_lock(&x->mu);
	for (struct srv_conn *c = x->srv; c && ns < 64; c = c->next) {
		bool busy = c->rx != RX_HDR || c->count > 0 || c->slen > c->soff;
		if (c->w == w && busy && now - c->last_ms > limit)
			sv[ns++] = c;
	}
	pthread_mutex_unlock(&x->mu);
	/* Only this worker closes or frees its connections: still valid. */
	for (size_t i = 0; i < ns; i++) {
		log_warn("connection from %s (segment %s): no progress for %llu ms; "
			 "closing it",
			 sv[i]->addr, sv[i]->hs.peer[0] ? sv[i]->hs.peer : "?",
			 (unsigned long long)limit);
		srv_close(sv[i], NULL);
	}
}

void te__tcp_srv_free_all(struct tcp_xport *x)
{
	while (x->srv) {
		struct srv_conn *c = x->srv;
		srv_teardown(c); /* unlinks it */
		free(c->stage);
		free(c->bounce);
		free(c->ctrl);
		free(c);
	}
}
