/*
 * tcp_cli: this engine's side of its tcp connections to peers (tcp_int.h).
 * Opening a peer dials te-tcp-conns connections to its data port and
 * runs the handshake on each (the setup thread); each connection then
 * lives on one data worker. A slice is a fixed 32-byte header (wire.h)
 * and, for a WRITE, its bytes, written with writev straight from the
 * caller's buffer; a READ answer is read with readv straight into it.
 * Requests on a connection are pipelined and answered in order, so the
 * oldest slice in flight is the one an answer is for. A connection that
 * breaks or makes no progress for the io timeout fails its slices over
 * to the peer's other connections.
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

struct tcp_peer;

struct cli_conn {
	struct te_ioh ioh;
	struct tcp_peer *p;
	unsigned path;
	struct te_worker *w;
	int fd;
	uint32_t events;
	struct cli_conn *next, **pprev; /* xport list (ticks) */
	atomic_bool kicked;             /* kick_task is queued: only that task
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
	struct te_slice *rx; /* READ answer being received */
	size_t rx_left;
	uint64_t last_ms;
	bool closed;
	bool wfull; /* a write found the socket's buffer full; EPOLLOUT clears */
};

/*
 * A peer's slices wait in one queue and each connection takes from it
 * while it has less than WINDOW_BYTES (and WINDOW_SLICES) unanswered: the
 * stripe follows each connection's actual speed, and a connection never
 * idles while another has a backlog.
 *
 * Only idle connections are woken for new work. A connection with a slice
 * unanswered is sure to run again (its answer, or room in its socket, is
 * an event on its worker), and each run ends by taking from the queue; so
 * a submit kicks no busy connection, and a steady stream of batches moves
 * without any thread hand-off. A connection says it is idle in the idle
 * mask, under qmu, when a take leaves it with nothing unanswered; a submit
 * reads the mask under the same lock after queueing, so a slice is either
 * taken by that take or sees the bit and kicks.
 */
struct tcp_peer {
	struct te_peer base;
	struct tcp_xport *x;
	unsigned n;
	atomic_uint to_free; /* connections not yet freed */
	pthread_mutex_t qmu;
	struct te_slice *q, **q_tail;
	size_t qn;     /* slices queued */
	uint32_t idle; /* under qmu: paths with nothing unanswered, not kicked */
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

/*
 * Under qmu: which idle connections to wake for what is queued — at most
 * one per queued slice, starting at path `from` (the batch layer's
 * stripe) — and they are idle no more until their kick task takes.
 */
static uint32_t pick_idle_locked(struct tcp_peer *p, unsigned from)
{
	uint32_t idle = p->idle & atomic_load(&p->base.alive), wake = 0;
	size_t want = p->qn;
	for (unsigned j = 0; j < p->n && idle && want; j++) {
		unsigned i = (from + j) % p->n;
		if (idle >> i & 1) {
			wake |= 1u << i;
			idle &= ~(1u << i);
			want--;
		}
	}
	p->idle &= ~wake;
	return wake;
}

/* Kick the connections in mask that are live and not kicked yet. */
static void kick_mask(struct tcp_peer *p, uint32_t mask)
{
	for (unsigned i = 0; mask && i < p->n; i++) {
		struct cli_conn *c = p->conns[i];
		if (!(mask >> i & 1) || atomic_load(&c->dead) ||
		    atomic_exchange(&c->kicked, true))
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
		log_warn("segment %s: connection %u failed: %s", bp->name, c->path,
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
	p->idle &= ~(1u << c->path);
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

/* Take queued slices while the window has room; into the send order.
 * With nothing left unanswered the connection is marked idle. */
static void cli_take(struct cli_conn *c)
{
	struct tcp_peer *p = c->p;
	struct te_slice *got;
again:
	got = NULL;
	struct te_slice **tail = &got;
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
	if (c->out_n == 0)
		p->idle |= 1u << c->path;
	else
		p->idle &= ~(1u << c->path);
	pthread_mutex_unlock(&p->qmu);
	bool took = got != NULL;
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
	/* Took only doomed slices: not idle in the mask yet, take again. */
	if (took && c->out_n == 0)
		goto again;
}

static bool cli_write(struct cli_conn *c)
{
	while (c->tx && !c->wfull) {
		struct iovec iov[TE_TCP_MAX_IOV];
		int n = 0;
		size_t off = c->tx_off;
		for (struct te_slice *s = c->tx; s && n + 2 <= TE_TCP_MAX_IOV; s = s->next) {
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
		ssize_t w = te__tcp_send_iov(c->fd, iov, n, &c->wfull);
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

/* Top up the stage: *got is what was read (0: would block), *drained set
 * when the socket had less than was asked for. False when the connection
 * failed. */
static bool cli_fill(struct cli_conn *c, ssize_t *got, bool *drained)
{
	if (c->soff == c->slen) {
		c->soff = c->slen = 0;
	} else if (c->soff > 0 && TE_TCP_STAGE_BYTES - c->slen < TE_WIRE_HDR_BYTES) {
		memmove(c->stage, c->stage + c->soff, c->slen - c->soff);
		c->slen -= c->soff;
		c->soff = 0;
	}
	/* When the answer due is a large READ, only its header (as
	 * stage_fill does on the serving side). */
	struct te_slice *s = c->fifo;
	size_t want = s && s != c->tx && s->op == TE_READ && s->len >= TE_TCP_STAGE_BYTES
			      ? TE_WIRE_HDR_BYTES - (c->slen - c->soff)
			      : TE_TCP_STAGE_BYTES - c->slen;
	for (;;) {
		ssize_t n = recv(c->fd, c->stage + c->slen, want, 0);
		if (n > 0) {
			c->slen += (size_t)n;
			c->last_ms = mc_now_ms();
			*got = n;
			*drained = (size_t)n < want;
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
			 c->p->base.name, c->path);
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
	/* Socket bytes per wake-up, and the end of it when a read found the
	 * socket empty, as srv_read. */
	size_t budget = TE_TCP_READ_BUDGET;
	bool drained = false;
	while (!c->closed) {
		if (!c->rx) {
			if (c->slen - c->soff < TE_WIRE_HDR_BYTES) {
				if (budget == 0 || drained)
					return true;
				ssize_t got;
				if (!cli_fill(c, &got, &drained))
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
			if (budget == 0 || drained)
				return true;
			if (c->soff == c->slen)
				c->soff = c->slen = 0;
			struct iovec iov[2] = {
				{dst, c->rx_left},
				{c->stage + c->slen,
				 te__tcp_stage_tail(c->rx_left,
						    TE_TCP_STAGE_BYTES - c->slen)}};
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
			drained = (size_t)got < iov[0].iov_len + iov[1].iov_len;
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
	if (events & EPOLLOUT)
		c->wfull = false;
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

/* ------------------------------------------------------------ peer ops */

/* The path the batch layer chose is a hint: the slice joins the peer's
 * queue and the first connection with room takes it; an idle connection
 * is woken for it, from that path on. */
void te__tcp_submit(struct te_peer *bp, struct te_slice *s)
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
	uint32_t wake = pick_idle_locked(p, s->path);
	pthread_mutex_unlock(&p->qmu);
	kick_mask(p, wake);
}

void te__tcp_disconnect(struct te_peer *bp)
{
	struct tcp_peer *p = (struct tcp_peer *)bp;
	atomic_store(&bp->closed, true);
	for (unsigned i = 0; i < p->n; i++) {
		te__peer_ref(bp);
		te__worker_post(p->conns[i]->w, &p->conns[i]->close_task);
	}
}

void te__tcp_peer_free(struct te_peer *bp)
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

int te__tcp_connect(struct te_xport *xp, struct te_segment *seg, const struct te_desc *d,
		    struct te_peer **out)
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
		fds[i] = te__tcp_dial(&ss, deadline);
		if (fds[i] < 0) {
			rc = fds[i] == -ECONNREFUSED ? MC_EUNAVAILABLE : fds[i];
			break;
		}
		te__tcp_tune_socket(x, fds[i]);
		rc = te__hs_client(fds[i], e->secret_len ? e->secret : NULL, e->secret_len,
				   e->name, d->name,
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
		uint8_t *stage = malloc(TE_TCP_STAGE_BYTES);
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
	snprintf(p->base.name, sizeof(p->base.name), "%s", seg->name);
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

void te__tcp_cli_tick(struct tcp_xport *x, struct te_worker *w, uint64_t now, uint64_t limit)
{
	struct cli_conn *cv[64];
	size_t nc = 0;
	pthread_mutex_lock(&x->mu);
	for (struct cli_conn *c = x->cli; c && nc < 64; c = c->next)
		if (c->w == w && c->fifo && now - c->last_ms > limit)
			cv[nc++] = c;
	pthread_mutex_unlock(&x->mu);
	/* Only this worker closes or frees its connections: still valid. */
	for (size_t i = 0; i < nc; i++)
		cli_fail(cv[i], MC_ETIMEDOUT);
}
