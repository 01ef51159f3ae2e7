/*
 * server: the agent's Unix socket. Non-blocking sockets watched with
 * uv_poll (libuv's pipes cannot carry arbitrary descriptors both ways),
 * frames and descriptors through common/uframe. One session per
 * connection: its peer credentials (SO_PEERCRED), staging buffer,
 * registered buffers and zero-copy views, which the operations reach
 * only through the agent__session_* functions. Requests are decoded,
 * checked (req.c) and handed to the on_request hook (the operations'
 * dispatch, set by agent.c: the server never calls an operation by
 * name); responses are queued and written as the socket takes them.
 *
 * A session closes when the client hangs up or breaks the framing (a
 * frame of length 0 or above the maximum, bytes that do not decode, or
 * announced descriptors that did not come): it is logged once, and what
 * the session held is released — buffers unmapped, views dropped — while
 * its requests in flight finish without replying (puts are revoked). A
 * frame that brought descriptors it did not announce is refused with
 * -EBADF and those descriptors are closed at once; the session goes on.
 *
 * What a session may hold is bounded (struct agent_limits). Connections
 * past the session counts get one Response with id 0 and -EUSERS, then
 * are closed. A session is read only while its reply budget — the bytes
 * of its queued replies, plus the memory reserved for what they will
 * carry (agent__session_reserve) — and the descriptors of its requests
 * in flight and of its queued replies are under their limits; once over,
 * it is read again when both are back under half (so a slow reader
 * costs a little memory, and is never closed for being slow). A read
 * brings at most one sendmsg's descriptors and the requests already read
 * reply at most two each, so neither figure passes its limit by more
 * than that.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include "agent/agent_int.h"
#include "agent/req.h"
#include "agent/op.h"
#include "agent/server.h"
#include "common/log.h"
#include "common/pb.h"
#include "common/util.h"

#define LOG_SUBSYS LOGS_AGENT

#define READS_PER_EVENT 16
/* After accept() ran out of descriptors or memory. */
#define ACCEPT_RETRY_MS 100

/* A pidfd of the peer as it connected (Linux 6.5); glibc 2.36 does not
 * name it yet. */
#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif

struct agent_out {
	struct agent_out *next;
	uint8_t *data; /* header + body (owned) */
	size_t len, sent;
	int fds[AGENT_REPLY_MAX_FDS];
	unsigned nfds;
	bool own_fd[AGENT_REPLY_MAX_FDS]; /* close after sending */
	unsigned owned;                   /* how many of fds are owned (counted in conn fds) */
	uint64_t held;                    /* reply budget it holds: len + what it carries */
};

struct agent_conn {
	struct agent *a;
	struct agent_conn *prev, *next;
	int fd;
	uv_poll_t poll;
	int poll_events;
	struct mc_uframe_rx rx;
	struct agent_out *out_head, *out_tail;
	pid_t pid;
	int pidfd; /* the client process's, or -1 */
	uid_t uid;
	gid_t gid;
	char name[96];
	bool hello;
	bool closed; /* no more I/O; freed when refs reach 0 */
	bool poll_closed;
	unsigned refs; /* 1 while open + 1 per request in flight */
	unsigned inflight;
	struct agent_map *staging;
	uint8_t *staging_base;
	uint64_t staging_len;
	/* The client's count of gets it answered from the shared lease
	 * table (gets, bytes; in its staging memfd past staging_len, or
	 * NULL), and how much of it is in the statistics already. */
	const uint64_t *table_counts;
	uint64_t table_counted[2];
	struct agent_buf *bufs;
	size_t nbufs, bufs_cap;
	uint64_t next_buf_id;
	struct agent_view *views;
	size_t nviews, views_cap;
	uint64_t next_view_id;
	bool segment_fd_sent;
	struct agent_inst *inst; /* its own engine (a reference), or NULL */
	/* The limits' figures (see the opening comment). */
	uint64_t held;    /* reply budget in use */
	unsigned fds;     /* descriptors of requests in flight, queued replies */
	bool paused;      /* over a limit: not read until back under half */
	uint64_t dropped; /* rx.dropped already counted */
	struct agent_wait *waits, **waits_tail; /* reservations, in order */
	bool resuming;
	struct agent_conn *kick_next; /* on the server's kick list (a ref) */
	bool kicked;
};

static void conn_close(struct agent_conn *c, const char *why);
static void conn_unref(struct agent_conn *c);
static void conn_flush(struct agent_conn *c);
static void conn_update_poll(struct agent_conn *c);
static void on_conn_poll(uv_poll_t *h, int status, int events);

/* ------------------------------------------------------------ lifetime */

static void gauges(struct agent *a)
{
	agent__gauge(&a->stats, AGENT_G_CLIENTS, (int64_t)a->server.nconns);
	agent__gauge(&a->stats, AGENT_G_BUFFERS, (int64_t)a->server.nbuffers);
	agent__gauge(&a->stats, AGENT_G_VIEWS, (int64_t)a->server.nviews);
	agent__gauge(&a->stats, AGENT_G_STAGING, (int64_t)a->server.staging_in_use);
	agent__gauge(&a->stats, AGENT_G_ALLOC, (int64_t)a->server.alloc_bytes);
}

/* ------------------------------------------------------------ limits */

static void held_add(struct agent_conn *c, uint64_t bytes)
{
	c->held += bytes;
	c->a->server.held_bytes += bytes;
	agent__gauge(&c->a->stats, AGENT_G_HELD_BYTES, (int64_t)c->a->server.held_bytes);
}

/* The caller then gives the room to waiting reservations (conn_room). */
static void held_sub(struct agent_conn *c, uint64_t bytes)
{
	c->held -= bytes;
	c->a->server.held_bytes -= bytes;
	agent__gauge(&c->a->stats, AGENT_G_HELD_BYTES, (int64_t)c->a->server.held_bytes);
}

static void fds_add(struct agent_conn *c, int n)
{
	c->fds = (unsigned)((int)c->fds + n);
	c->a->server.held_fds = (uint64_t)((int64_t)c->a->server.held_fds + n);
	agent__gauge(&c->a->stats, AGENT_G_HELD_FDS, (int64_t)c->a->server.held_fds);
}

static bool reserve_fits(const struct agent_conn *c, uint64_t bytes)
{
	return c->held == 0 || c->held + bytes <= c->a->server.lim.reply_bytes;
}

/* May the session be read? Over a limit it pauses, and stays paused
 * until both figures are back under half their limits. */
static bool conn_readable(struct agent_conn *c)
{
	const struct agent_limits *l = &c->a->server.lim;
	if (c->paused) {
		if (c->held > l->reply_bytes / 2 || c->fds > l->fds / 2)
			return false;
		c->paused = false;
		log_debug("client %s: read again (replies %llu bytes, %u descriptors held)",
			  c->name, (unsigned long long)c->held, c->fds);
	} else if (c->held >= l->reply_bytes || c->fds >= l->fds) {
		c->paused = true;
		bool bytes = c->held >= l->reply_bytes;
		agent__count(&c->a->stats, bytes ? AGENT_C_PAUSED_REPLIES : AGENT_C_PAUSED_FDS,
			     1);
		log_debug("client %s: not read until it reads its replies (%llu bytes, %u "
			  "descriptors held)",
			  c->name, (unsigned long long)c->held, c->fds);
		return false;
	}
	return c->inflight < AGENT_MAX_INFLIGHT;
}

/* Room came back: grant the reservations that fit now, in order. */
static void conn_room(struct agent_conn *c)
{
	if (c->resuming)
		return;
	c->resuming = true;
	c->refs++;
	while (!c->closed && c->waits && reserve_fits(c, c->waits->bytes)) {
		struct agent_wait *w = c->waits;
		c->waits = w->next;
		if (!c->waits)
			c->waits_tail = &c->waits;
		held_add(c, w->bytes);
		w->r->held += w->bytes;
		w->resume(w, 0);
	}
	c->resuming = false;
	conn_unref(c);
}

/* The session closed: every reservation waiting is cancelled. */
static void conn_cancel_waits(struct agent_conn *c)
{
	while (c->waits) {
		struct agent_wait *w = c->waits;
		c->waits = w->next;
		if (!c->waits)
			c->waits_tail = &c->waits;
		w->resume(w, MC_ECANCELLED);
	}
}

/* Draining: done once nothing is in flight or queued. */
static void drain_check(struct agent *a)
{
	struct agent_server *s = &a->server;
	if (!s->draining || s->drained || s->reqs > 0)
		return;
	for (const struct agent_conn *c = s->conns; c; c = c->next)
		if (c->out_head)
			return;
	s->drained = true;
	log_info("client requests drained");
	s->on_drained(a);
}

static void conn_free(struct agent_conn *c)
{
	struct agent *a = c->a;
	free(c);
	a->server.conn_objs--;
	a->server.on_gone(a);
}

static void on_poll_closed(uv_handle_t *h)
{
	struct agent_conn *c = MC_CONTAINER_OF((uv_poll_t *)h, struct agent_conn, poll);
	c->poll_closed = true;
	if (c->refs == 0)
		conn_free(c);
}

static void conn_unref(struct agent_conn *c)
{
	if (--c->refs > 0)
		return;
	if (c->poll_closed)
		conn_free(c);
}

/* Add what the client counted since the last look to the statistics.
 * The client writes its counters as it likes: only growth is taken. */
static void fold_table_counts(struct agent_conn *c)
{
	if (!c->table_counts)
		return;
	uint64_t gets = __atomic_load_n(&c->table_counts[0], __ATOMIC_RELAXED);
	uint64_t bytes = __atomic_load_n(&c->table_counts[1], __ATOMIC_RELAXED);
	struct agent_stats *st = &c->a->stats;
	if (gets > c->table_counted[0]) {
		uint64_t n = gets - c->table_counted[0];
		agent__count(st, AGENT_C_GETS, n);
		agent__count(st, AGENT_C_LOCAL_HITS, n);
		agent__count(st, AGENT_C_LEASE_CACHE_HITS, n);
		agent__count(st, AGENT_C_TABLE_GETS, n);
		c->table_counted[0] = gets;
	}
	if (bytes > c->table_counted[1]) {
		agent__count(st, AGENT_C_BYTES_READ, bytes - c->table_counted[1]);
		c->table_counted[1] = bytes;
	}
}

void agent__server_fold(struct agent *a)
{
	for (struct agent_conn *c = a->server.conns; c; c = c->next)
		fold_table_counts(c);
}

static void on_fold_timer(uv_timer_t *t)
{
	agent__server_fold(t->data);
}

static void release_session(struct agent_conn *c)
{
	struct agent *a = c->a;
	fold_table_counts(c);
	c->table_counts = NULL;
	for (size_t i = 0; i < c->nbufs; i++) {
		if (c->bufs[i].alloc)
			a->server.alloc_bytes -= c->bufs[i].len;
		agent__map_unref(c->bufs[i].map);
	}
	a->server.nbuffers -= c->nbufs;
	free(c->bufs);
	c->bufs = NULL;
	c->nbufs = 0;
	for (size_t i = 0; i < c->nviews; i++)
		free(c->views[i].key);
	a->server.nviews -= c->nviews;
	free(c->views);
	c->views = NULL;
	c->nviews = 0;
	if (c->staging) {
		a->server.staging_in_use -= c->staging_len;
		agent__map_unref(c->staging);
		c->staging = NULL;
	}
	agent__inst_unref(c->inst);
	c->inst = NULL;
}

static void conn_close(struct agent_conn *c, const char *why)
{
	if (c->closed)
		return;
	struct agent *a = c->a;
	c->closed = true;
	if (why)
		log_warn("client %s: %s; session closed", c->name, why);
	else
		log_debug("client %s disconnected", c->name);
	uv_poll_stop(&c->poll);
	uv_close((uv_handle_t *)&c->poll, on_poll_closed);
	close(c->fd);
	c->fd = -1;
	if (c->pidfd >= 0)
		close(c->pidfd);
	c->pidfd = -1;
	mc_uframe_rx_free(&c->rx);
	while (c->out_head) {
		struct agent_out *o = c->out_head;
		c->out_head = o->next;
		for (unsigned i = 0; i < o->nfds; i++)
			if (o->own_fd[i])
				close(o->fds[i]);
		fds_add(c, -(int)o->owned);
		held_sub(c, o->held);
		free(o->data);
		free(o);
	}
	c->out_tail = NULL;
	release_session(c);
	if (c->prev)
		c->prev->next = c->next;
	else
		a->server.conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	a->server.nconns--;
	c->refs++;
	conn_cancel_waits(c);
	conn_unref(c);
	conn_unref(c);
	gauges(a);
	drain_check(a);
}

/* ------------------------------------------------------------ output */

static void conn_flush(struct agent_conn *c)
{
	uint64_t freed = 0;
	while (!c->closed && c->out_head) {
		struct agent_out *o = c->out_head;
		struct iovec v = {o->data + o->sent, o->len - o->sent};
		ssize_t n = mc_uframe_sendmsg(c->fd, &v, 1, o->sent ? NULL : o->fds,
					      o->sent ? 0 : o->nfds, MSG_DONTWAIT);
		if (n == -EAGAIN)
			break;
		if (n < 0) {
			char why[96];
			snprintf(why, sizeof(why), "cannot write a reply: %s",
				 strerror((int)-n));
			conn_close(c, n == -EPIPE || n == -ECONNRESET ? NULL : why);
			return;
		}
		if (o->sent == 0) {
			for (unsigned i = 0; i < o->nfds; i++)
				if (o->own_fd[i]) {
					close(o->fds[i]);
					o->own_fd[i] = false;
				}
			fds_add(c, -(int)o->owned);
			o->owned = 0;
		}
		o->sent += (size_t)n;
		if (o->sent < o->len)
			continue;
		c->out_head = o->next;
		if (!c->out_head)
			c->out_tail = NULL;
		freed += o->held;
		free(o->data);
		free(o);
	}
	if (c->closed)
		return;
	if (freed) {
		held_sub(c, freed);
		conn_room(c);
	}
	conn_update_poll(c);
	if (!c->out_head)
		drain_check(c->a);
}

/* Queue a frame; it holds held bytes of the budget beyond its own. */
static void queue_frame(struct agent_conn *c, uint8_t *data, size_t len, const int *fds,
			const bool *own, unsigned nfds, uint64_t held)
{
	struct agent_out *o = nfds <= AGENT_REPLY_MAX_FDS ? mc_zalloc(1, sizeof(*o)) : NULL;
	if (!o) {
		free(data);
		for (unsigned i = 0; i < nfds; i++)
			if (own && own[i])
				close(fds[i]);
		conn_close(c, nfds > AGENT_REPLY_MAX_FDS ? "a reply with too many descriptors"
							 : "out of memory for a reply");
		return;
	}
	o->data = data;
	o->len = len;
	o->nfds = nfds;
	for (unsigned i = 0; i < nfds; i++) {
		o->fds[i] = fds[i];
		o->own_fd[i] = own && own[i];
		o->owned += o->own_fd[i];
	}
	o->held = len + held;
	held_add(c, o->held);
	fds_add(c, (int)o->owned);
	if (c->out_tail)
		c->out_tail->next = o;
	else
		c->out_head = o;
	c->out_tail = o;
	conn_flush(c);
}

/* ------------------------------------------------------------ busy poll */

/* Whether the loop's next event is likely a request of the session it
 * serves, within microseconds: one session alone has sent requests for
 * AGENT_SOLO_NS and none is in flight. A request in flight waits for
 * something slower (a master call, a copy thread, another agent) whose
 * answer wakes the loop anyway; and while several sessions send, the
 * next request is mostly there already when the loop looks, so polling
 * would only take a core from the clients that make it. */
static bool spin_worth(const struct agent *a, uint64_t now)
{
	return a->server.reqs == 0 && agent__pool_threaded(&a->pool) == 0 &&
	       now - a->server.solo_since_ns >= AGENT_SOLO_NS;
}

static void on_spin(uv_idle_t *h)
{
	struct agent *a = h->data;
	uint64_t now = mc_now_ns();
	if (now < a->server.spin_until_ns && spin_worth(a, now))
		return;
	uv_idle_stop(h);
	agent__stats_spin(&a->stats, now - a->server.spin_start_ns);
}

/*
 * A request came, a reply left or the copy threads ran out of work: when
 * one session alone is being served (spin_worth), its next request is
 * likely within microseconds. An active idle handle makes libuv poll with
 * a zero timeout, so the loop keeps polling (no sleep, no wakeup to pay
 * when it comes) for spin_ns — but never while copy threads have work or
 * a request waits: on a machine with few cores they need the CPU more
 * than the loop needs to be awake.
 */
void agent__spin_touch(struct agent *a)
{
	if (!a->server.spin_ns || a->stopping || agent__pool_threaded(&a->pool) > 0)
		return;
	uint64_t now = mc_now_ns();
	if (now - a->server.solo_since_ns < AGENT_SOLO_NS)
		return;
	a->server.spin_until_ns = now + a->server.spin_ns;
	if (!uv_is_active((uv_handle_t *)&a->server.spin_idle)) {
		a->server.spin_start_ns = now;
		uv_idle_start(&a->server.spin_idle, on_spin);
	}
}

/* Reply on c; the reply takes over *held (the request's reservation)
 * unless the session is closed. */
static void send_response(struct agent_conn *c, Mooncake__Client__Response *resp,
			  const int *fds, const bool *own, unsigned nfds, uint64_t *held)
{
	if (c->closed) {
		for (unsigned i = 0; i < nfds; i++)
			if (own && own[i])
				close(fds[i]);
		return;
	}
	resp->nfds = nfds;
	bool put = agent__put_response_encodable(resp);
	size_t n = put ? AGENT_PUT_RESPONSE_MAX(resp->put->n_errors)
		       : mooncake__client__response__get_packed_size(resp);
	uint8_t *data = malloc(MC_UFRAME_HDR + n);
	if (!data) {
		for (unsigned i = 0; i < nfds; i++)
			if (own && own[i])
				close(fds[i]);
		conn_close(c, "out of memory for a reply");
		return;
	}
	if (put)
		n = agent__encode_put_response(data + MC_UFRAME_HDR, resp);
	else
		mooncake__client__response__pack(resp, data + MC_UFRAME_HDR);
	mc_uframe_put_len(data, (uint32_t)n);
	/* The reservation moves to the frame: given back once it is
	 * written, not when the request ends. */
	uint64_t carried = *held;
	held_sub(c, carried);
	*held = 0;
	queue_frame(c, data, MC_UFRAME_HDR + n, fds, own, nfds, carried);
	agent__spin_touch(c->a);
}

void agent__reply(struct agent_req *r, Mooncake__Client__Response *resp, const int *fds,
		  const bool *own, unsigned nfds)
{
	resp->id = r->id;
	send_response(r->c, resp, fds, own, nfds, &r->held);
}

void agent__reply_error(struct agent_req *r, int err, const char *message)
{
	Mooncake__Client__Response resp = MOONCAKE__CLIENT__RESPONSE__INIT;
	resp.id = r->id;
	resp.error = err;
	resp.message = (char *)(message ? message : mc_strerror(err));
	send_response(r->c, &resp, NULL, NULL, 0, &r->held);
}

void agent__req_end(struct agent_req *r)
{
	struct agent_conn *c = r->c;
	for (unsigned i = 0; i < r->nfds; i++)
		if (r->fds[i] >= 0)
			close(r->fds[i]);
	fds_add(c, -(int)r->nfds);
	uint64_t held = r->held;
	if (r->msg)
		mc_pb_free(&r->msg->base, &r->arena);
	free(r);
	c->inflight--;
	c->a->server.reqs--;
	if (held)
		held_sub(c, held);
	if (!c->closed) {
		if (held)
			conn_room(c);
		conn_update_poll(c);
	}
	drain_check(c->a);
	conn_unref(c);
}

/* ------------------------------------------------------------ input */

static void on_kick(uv_idle_t *h);

static void conn_update_poll(struct agent_conn *c)
{
	if (c->closed)
		return;
	int ev = 0;
	if (!c->a->stopping && conn_readable(c))
		ev |= UV_READABLE;
	if (c->out_head)
		ev |= UV_WRITABLE;
	if (ev == c->poll_events)
		return;
	/* Read again with whole frames buffered already: the socket may
	 * have nothing more to say, so no poll event would come for them. */
	if ((ev & UV_READABLE) && !(c->poll_events & UV_READABLE) && !c->kicked &&
	    mc_uframe_rx_ready(&c->rx)) {
		struct agent_server *s = &c->a->server;
		c->kicked = true;
		c->refs++;
		c->kick_next = s->kicks;
		s->kicks = c;
		uv_idle_start(&s->kick_idle, on_kick);
	}
	c->poll_events = ev;
	if (ev)
		uv_poll_start(&c->poll, ev, on_conn_poll);
	else
		uv_poll_stop(&c->poll);
}

/* A complete frame: decode, take its descriptors, check, dispatch. Returns
 * false when the session was closed. */
static bool handle_frame(struct agent_conn *c, const uint8_t *body, size_t len)
{
	struct agent_req *r = mc_zalloc(1, sizeof(*r));
	if (!r) {
		conn_close(c, "out of memory for a request");
		return false;
	}
	/* Into the request's arena: freed with it, in one go. Puts are
	 * decoded here, the rest by protobuf-c. */
	Mooncake__Client__Request *m = NULL;
	int drc = agent__decode_put_request(body, len, &r->arena, &m);
	if (drc == 1)
		m = (Mooncake__Client__Request *)mc_pb_unpack(
			&mooncake__client__request__descriptor, len, body,
			AGENT_MAX_DECODED_BYTES, &r->arena);
	if (!m) {
		bool full = r->arena.full;
		free(r);
		conn_close(c, full ? "sent a request that would take more than 64 MiB "
				     "decoded"
			      : drc == -ENOMEM
				      ? "out of memory decoding a request"
				      : "sent a frame that does not decode as a Request");
		return false;
	}
	r->c = c;
	r->a = c->a;
	r->id = m->id;
	r->msg = m;
	r->op = m->op_case;
	r->start_ns = mc_now_ns();
	if (c->a->server.last_conn != c) {
		c->a->server.last_conn = c;
		c->a->server.solo_since_ns = r->start_ns;
	}
	agent__spin_touch(c->a);
	c->refs++;
	c->inflight++;
	c->a->server.reqs++;
	unsigned closed = 0;
	unsigned n = m->nfds <= MC_UFRAME_MAX_FDS ? m->nfds : MC_UFRAME_MAX_FDS + 1;
	int frc = mc_uframe_rx_frame_fds(&c->rx, n, r->fds, &closed);
	if (closed)
		agent__count(&c->a->stats, AGENT_C_FDS_CLOSED, closed);
	if (frc == -EBADF) {
		/* The stream is intact: refuse this frame alone. */
		log_warn("client %s: request %llu refused: it brought descriptors it did not "
			 "announce (%u closed)",
			 c->name, (unsigned long long)m->id, closed);
		agent__count(&c->a->stats, AGENT_C_REFUSED_FDS, 1);
		agent__reply_error(r, -EBADF,
				   "the request brought descriptors it did not "
				   "announce (nfds); they were closed");
		agent__op_done(&c->a->stats, r->op, -EBADF, r->start_ns);
		agent__req_end(r);
		return !c->closed;
	}
	if (frc) {
		const char *why = n > MC_UFRAME_MAX_FDS
					  ? "announced more descriptors than a frame may carry"
					  : "announced descriptors that did not come";
		agent__req_end(r); /* frees m */
		conn_close(c, why);
		return false;
	}
	r->nfds = n;
	fds_add(c, (int)n);
	const char *why = "";
	int rc = agent__req_check(m, c->hello, &why);
	if (rc) {
		log_warn("client %s: request %llu refused: %s", c->name,
			 (unsigned long long)m->id, why);
		agent__reply_error(r, rc, why);
		bool fatal = rc == MC_EPROTOCOL;
		agent__op_done(&c->a->stats, r->op, rc, r->start_ns);
		agent__req_end(r);
		if (fatal) {
			conn_close(c, why);
			return false;
		}
		return !c->closed;
	}
	if (c->a->server.draining) {
		agent__count(&c->a->stats, AGENT_C_REFUSED_SHUTDOWN, 1);
		agent__reply_error(r, MC_ESHUTDOWN, "the agent is shutting down");
		agent__op_done(&c->a->stats, r->op, MC_ESHUTDOWN, r->start_ns);
		agent__req_end(r);
		return !c->closed;
	}
	c->a->server.on_request(r);
	return !c->closed;
}

/* Descriptors uframe closed on arrival (brought by bytes no frame starts
 * in): counted. */
static void count_dropped(struct agent_conn *c)
{
	if (c->rx.dropped == c->dropped)
		return;
	agent__count(&c->a->stats, AGENT_C_FDS_CLOSED, c->rx.dropped - c->dropped);
	c->dropped = c->rx.dropped;
}

static void conn_read(struct agent_conn *c)
{
	for (int k = 0; k < READS_PER_EVENT && !c->closed; k++) {
		if (!conn_readable(c))
			break;
		ssize_t n = mc_uframe_rx_read(&c->rx, c->fd, MSG_DONTWAIT);
		count_dropped(c);
		if (n == -EAGAIN)
			break;
		/* Room left in the buffer: the socket had nothing more (or
		 * stopped at descriptors; the poll says so again), so no
		 * read that would only say EAGAIN. */
		bool drained = n > 0 && c->rx.len < c->rx.cap;
		if (n == 0) {
			conn_close(c, mc_uframe_rx_idle(&c->rx)
					      ? NULL
					      : "hung up in the middle of a frame "
						"(truncated frame)");
			return;
		}
		if (n < 0) {
			conn_close(c, n == MC_EPROTOCOL
					      ? "sent more descriptors than a frame may carry"
				      : n == -ECONNRESET ? NULL
							 : "read failed");
			return;
		}
		for (;;) {
			if (!conn_readable(c))
				break;
			const uint8_t *body;
			size_t len;
			int rc = mc_uframe_rx_next(&c->rx, &body, &len);
			if (rc == 0)
				break;
			if (rc < 0) {
				conn_close(c, rc == MC_ETOO_LARGE
						      ? "sent a frame above the maximum size"
						      : "sent a frame of length 0");
				return;
			}
			if (!handle_frame(c, body, len))
				return;
		}
		if (drained)
			break;
	}
}

/* Frames already buffered while the session was at a limit. */
static void conn_drain_buffered(struct agent_conn *c)
{
	while (!c->closed && conn_readable(c)) {
		const uint8_t *body;
		size_t len;
		int rc = mc_uframe_rx_next(&c->rx, &body, &len);
		if (rc == 0)
			return;
		if (rc < 0) {
			conn_close(c, "sent a malformed frame");
			return;
		}
		if (!handle_frame(c, body, len))
			return;
	}
}

static void on_conn_poll(uv_poll_t *h, int status, int events)
{
	struct agent_conn *c = MC_CONTAINER_OF(h, struct agent_conn, poll);
	if (c->closed)
		return;
	if (status < 0) {
		conn_close(c, "socket error");
		return;
	}
	c->refs++;
	if (events & UV_WRITABLE)
		conn_flush(c);
	if (!c->closed && (events & UV_READABLE)) {
		conn_drain_buffered(c);
		conn_read(c);
	}
	conn_update_poll(c);
	conn_unref(c);
}

/* Sessions that may be read again with whole frames buffered. */
static void on_kick(uv_idle_t *h)
{
	struct agent *a = h->data;
	struct agent_conn *list = a->server.kicks;
	a->server.kicks = NULL;
	uv_idle_stop(h);
	while (list) {
		struct agent_conn *c = list;
		list = c->kick_next;
		c->kicked = false;
		if (!c->closed) {
			conn_drain_buffered(c);
			conn_update_poll(c);
		}
		conn_unref(c);
	}
}

/* ------------------------------------------------------------ accept */

/* A pidfd of the client that connected on fd: the kernel's (the very
 * process, whatever its pid names later), else one opened now by pid;
 * -1 on kernels without pidfds. */
static int peer_pidfd(int fd, pid_t pid)
{
	int pidfd = -1;
	socklen_t len = sizeof(pidfd);
	if (getsockopt(fd, SOL_SOCKET, SO_PEERPIDFD, &pidfd, &len) == 0 && pidfd >= 0)
		return pidfd;
	return (int)syscall(SYS_pidfd_open, pid, 0);
}

/* A connection past a session limit: one Response (id 0, -EUSERS, why)
 * if the socket takes it at once, then the close. */
static void refuse_session(struct agent *a, int fd, const struct ucred *cred, bool per_uid)
{
	const struct agent_limits *l = &a->server.lim;
	char why[160];
	if (per_uid)
		snprintf(why, sizeof(why),
			 "uid %u has %u client sessions open, the most one user may have "
			 "(--client-max-sessions-per-uid)",
			 (unsigned)cred->uid, l->sessions_per_uid);
	else
		snprintf(why, sizeof(why),
			 "%u client sessions are open, the most the agent serves "
			 "(--client-max-sessions)",
			 l->sessions);
	log_warn("client pid %d uid %u refused: %s", (int)cred->pid, (unsigned)cred->uid, why);
	agent__count(&a->stats,
		     per_uid ? AGENT_C_REFUSED_SESSIONS_UID : AGENT_C_REFUSED_SESSIONS, 1);
	Mooncake__Client__Response resp = MOONCAKE__CLIENT__RESPONSE__INIT;
	resp.error = -EUSERS;
	resp.message = why;
	uint8_t buf[MC_UFRAME_HDR + 256];
	size_t n = mooncake__client__response__get_packed_size(&resp);
	if (n <= sizeof(buf) - MC_UFRAME_HDR) {
		mc_uframe_put_len(buf, (uint32_t)n);
		mooncake__client__response__pack(&resp, buf + MC_UFRAME_HDR);
		struct iovec v = {buf, MC_UFRAME_HDR + n};
		(void)mc_uframe_sendmsg(fd, &v, 1, NULL, 0, MSG_DONTWAIT);
	}
	close(fd);
}

static void accept_one(struct agent *a, int fd)
{
	struct ucred cred;
	socklen_t cl = sizeof(cred);
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0) {
		log_warn("client socket: cannot read peer credentials: %s", strerror(errno));
		close(fd);
		return;
	}
	unsigned mine = 0;
	for (const struct agent_conn *o = a->server.conns; o; o = o->next)
		mine += o->uid == cred.uid;
	if (a->server.nconns >= a->server.lim.sessions ||
	    mine >= a->server.lim.sessions_per_uid) {
		refuse_session(a, fd, &cred, a->server.nconns < a->server.lim.sessions);
		return;
	}
	struct agent_conn *c = calloc(1, sizeof(*c));
	if (!c) {
		close(fd);
		return;
	}
	c->a = a;
	c->fd = fd;
	c->pid = cred.pid;
	c->pidfd = peer_pidfd(fd, cred.pid);
	c->uid = cred.uid;
	c->gid = cred.gid;
	c->refs = 1;
	c->next_buf_id = 1;
	c->next_view_id = 1;
	c->waits_tail = &c->waits;
	snprintf(c->name, sizeof(c->name), "pid %d uid %u", (int)cred.pid, (unsigned)cred.uid);
	if (mc_uframe_rx_init(&c->rx, MC_UFRAME_MAX_BYTES) != 0 ||
	    uv_poll_init(a->loop, &c->poll, fd) != 0) {
		mc_uframe_rx_free(&c->rx);
		if (c->pidfd >= 0)
			close(c->pidfd);
		close(fd);
		free(c);
		return;
	}
	c->poll_events = UV_READABLE;
	uv_poll_start(&c->poll, UV_READABLE, on_conn_poll);
	c->next = a->server.conns;
	if (a->server.conns)
		a->server.conns->prev = c;
	a->server.conns = c;
	a->server.nconns++;
	a->server.conn_objs++;
	log_debug("client %s connected", c->name);
	gauges(a);
}

static void on_listen_poll(uv_poll_t *h, int status, int events);

static void on_accept_timer(uv_timer_t *t)
{
	struct agent *a = t->data;
	if (a->server.listen_fd >= 0 && !a->stopping)
		uv_poll_start(&a->server.listen_poll, UV_READABLE, on_listen_poll);
}

static void on_listen_poll(uv_poll_t *h, int status, int events)
{
	struct agent *a = h->data;
	(void)events;
	if (status < 0 || a->stopping || a->server.listen_fd < 0)
		return;
	for (int i = 0; i < 64; i++) {
		int fd = accept4(a->server.listen_fd, NULL, NULL,
				 SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd >= 0) {
			accept_one(a, fd);
			continue;
		}
		if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
		    errno == ENOMEM) {
			/* The connection waits in the backlog: try again in a
			 * while rather than spin on a socket that stays
			 * readable. */
			log_warn("accept on %s: %s; new clients wait %d ms",
				 a->server.socket_path, strerror(errno), ACCEPT_RETRY_MS);
			uv_poll_stop(&a->server.listen_poll);
			uv_timer_start(&a->server.accept_timer, on_accept_timer,
				       ACCEPT_RETRY_MS, 0);
		} else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
			log_warn("accept on %s: %s", a->server.socket_path, strerror(errno));
		}
		return;
	}
}

/* Is something serving path? A socket file nobody accepts on is stale. */
static bool socket_alive(const struct sockaddr_un *sa)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return false;
	bool alive = connect(fd, (const struct sockaddr *)sa, sizeof(*sa)) == 0;
	close(fd);
	return alive;
}

int agent__server_start(struct agent *a, const char *path, uint64_t spin_ns,
			const struct agent_limits *lim,
			void (*on_request)(struct agent_req *r),
			void (*on_gone)(struct agent *a))
{
	struct agent_server *s = &a->server;
	s->listen_fd = -1;
	s->spin_ns = spin_ns;
	s->lim = *lim;
	s->on_request = on_request;
	s->on_gone = on_gone;
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	size_t plen = strlen(path);
	if (plen == 0 || plen >= sizeof(sa.sun_path)) {
		log_error("--socket %s: a Unix socket path must be 1 to %zu bytes", path,
			  sizeof(sa.sun_path) - 1);
		return -EINVAL;
	}
	memcpy(sa.sun_path, path, plen);
	char dir[sizeof(sa.sun_path)];
	memcpy(dir, path, plen + 1);
	char *slash = strrchr(dir, '/');
	if (slash && slash != dir) {
		*slash = '\0';
		int rc = mc_mkdir_p(dir, 0755);
		if (rc) {
			log_error("cannot create %s for --socket: %s", dir, mc_strerror(rc));
			return rc;
		}
	}
	struct stat st;
	if (lstat(path, &st) == 0) {
		if (!S_ISSOCK(st.st_mode)) {
			log_error("--socket %s exists and is not a socket", path);
			return -EEXIST;
		}
		if (socket_alive(&sa)) {
			log_error("--socket %s: another agent is serving it", path);
			return -EADDRINUSE;
		}
		unlink(path); /* stale, from an agent that died */
	}
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	int rc = 0;
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
		rc = -errno;
		log_error("cannot bind %s: %s", path, strerror(-rc));
		goto out_close;
	}
	if (chmod(path, 0660) != 0 || listen(fd, 512) != 0) {
		rc = -errno;
		log_error("cannot listen on %s: %s", path, strerror(-rc));
		goto out_unlink;
	}
	a->server.socket_path = strdup(path);
	if (!a->server.socket_path) {
		rc = -ENOMEM;
		goto out_unlink;
	}
	rc = uv_poll_init(a->loop, &a->server.listen_poll, fd);
	if (rc) {
		rc = -ENOMEM;
		goto out_path;
	}
	s->listen_poll.data = a;
	s->listen_fd = fd;
	s->listen_open = true;
	uv_poll_start(&s->listen_poll, UV_READABLE, on_listen_poll);
	uv_idle_init(a->loop, &s->spin_idle);
	s->spin_idle.data = a;
	uv_idle_init(a->loop, &s->kick_idle);
	s->kick_idle.data = a;
	uv_timer_init(a->loop, &s->accept_timer);
	s->accept_timer.data = a;
	uv_timer_init(a->loop, &s->fold_timer);
	s->fold_timer.data = a;
	log_info("serving clients on %s (mode 0660)", path);
	return 0;

out_path:
	free(a->server.socket_path);
	a->server.socket_path = NULL;
out_unlink:
	unlink(path);
out_close:
	close(fd);
	return rc;
}

/* No more connections: the socket file goes (before the descriptor, so
 * that no new agent's file is removed). The poll handle stays until the
 * stop. */
static void stop_listening(struct agent_server *s)
{
	if (s->listen_fd < 0)
		return;
	uv_poll_stop(&s->listen_poll);
	uv_timer_stop(&s->accept_timer);
	uv_timer_stop(&s->fold_timer);
	unlink(s->socket_path);
	close(s->listen_fd);
	s->listen_fd = -1;
}

void agent__server_drain(struct agent *a, void (*on_drained)(struct agent *a))
{
	struct agent_server *s = &a->server;
	if (s->draining)
		return;
	s->draining = true;
	s->on_drained = on_drained;
	stop_listening(s);
	log_info("draining client requests: %u in flight, %u sessions; new requests "
		 "are refused",
		 s->reqs, s->nconns);
	drain_check(a);
}

unsigned agent__server_stop(struct agent *a, uv_close_cb on_closed)
{
	struct agent_server *s = &a->server;
	unsigned n = 0;
	if (s->listen_open) {
		s->listen_open = false;
		stop_listening(s);
		uv_close((uv_handle_t *)&s->listen_poll, on_closed);
		n++;
	}
	while (s->conns)
		conn_close(s->conns, NULL);
	return n;
}

unsigned agent__server_close(struct agent *a, uv_close_cb on_closed)
{
	uv_close((uv_handle_t *)&a->server.spin_idle, on_closed);
	uv_close((uv_handle_t *)&a->server.kick_idle, on_closed);
	uv_close((uv_handle_t *)&a->server.accept_timer, on_closed);
	uv_close((uv_handle_t *)&a->server.fold_timer, on_closed);
	return 4;
}

bool agent__server_idle(const struct agent *a)
{
	return a->server.conn_objs == 0;
}

const char *agent__server_path(const struct agent *a)
{
	return a->server.socket_path;
}

void agent__server_free(struct agent *a)
{
	free(a->server.socket_path);
	a->server.socket_path = NULL;
}

void agent__server_counts(const struct agent *a, uint64_t *clients, uint64_t *buffers,
			  uint64_t *views)
{
	*clients = a->server.nconns;
	*buffers = a->server.nbuffers;
	*views = a->server.nviews;
}

unsigned agent__server_reqs(const struct agent *a)
{
	return a->server.reqs;
}

uint64_t agent__server_solo_since_ns(const struct agent *a)
{
	return a->server.solo_since_ns;
}

const struct agent_buf *agent__server_published(const struct agent *a, uint64_t addr,
						uint64_t len)
{
	/* (A session with an engine of its own publishes there.) */
	for (const struct agent_conn *c = a->server.conns; c; c = c->next)
		for (size_t i = 0; i < c->nbufs && !c->inst; i++) {
			const struct agent_buf *b = &c->bufs[i];
			if (b->address && addr >= b->address && addr - b->address <= b->len &&
			    len <= b->len - (addr - b->address))
				return b;
		}
	return NULL;
}

void agent__views_foreach(struct agent *a, void (*fn)(void *ud, const struct agent_view *v),
			  void *ud)
{
	for (struct agent_conn *c = a->server.conns; c; c = c->next)
		for (size_t i = 0; i < c->nviews; i++)
			fn(ud, &c->views[i]);
}

/* ------------------------------------------------------------ a session */

const char *agent__session_name(const struct agent_conn *c)
{
	return c->name;
}

uid_t agent__session_uid(const struct agent_conn *c)
{
	return c->uid;
}

pid_t agent__session_pid(const struct agent_conn *c, int *pidfd)
{
	*pidfd = c->pidfd;
	return c->pid;
}

bool agent__session_closed(const struct agent_conn *c)
{
	return c->closed;
}

void agent__session_hello(struct agent_conn *c, const char *client_name,
			  struct agent_map *staging, uint64_t staging_len, bool table_counts)
{
	if (client_name && client_name[0])
		snprintf(c->name, sizeof(c->name), "pid %d uid %u (%.48s)", (int)c->pid,
			 (unsigned)c->uid, client_name);
	c->staging = staging;
	c->staging_base = staging->addr;
	c->staging_len = staging_len;
	if (table_counts) {
		c->table_counts = (const uint64_t *)(staging->addr + staging_len);
		if (!uv_is_active((uv_handle_t *)&c->a->server.fold_timer))
			uv_timer_start(&c->a->server.fold_timer, on_fold_timer, AGENT_FOLD_MS,
				       AGENT_FOLD_MS);
	}
	c->hello = true;
	c->a->server.staging_in_use += staging_len;
	gauges(c->a);
}

struct agent_map *agent__session_staging(const struct agent_conn *c, uint8_t **base,
					 uint64_t *len)
{
	*base = c->staging_base;
	*len = c->staging_len;
	return c->staging;
}

struct agent_inst *agent__session_inst(const struct agent_conn *c)
{
	return c->inst;
}

int agent__session_set_inst(struct agent_conn *c, struct agent_inst *i)
{
	if (c->inst)
		return -EEXIST;
	for (size_t k = 0; k < c->nbufs; k++)
		if (c->bufs[k].address)
			return -EBUSY;
	c->inst = i;
	return 0;
}

static bool bufs_full(struct agent_conn *c)
{
	if (c->nbufs < c->a->server.lim.buffers)
		return false;
	agent__count(&c->a->stats, AGENT_C_REFUSED_BUFFERS, 1);
	log_warn("client %s: refused a buffer: it has %zu, the most a session may have "
		 "(--client-max-buffers)",
		 c->name, c->nbufs);
	return true;
}

bool agent__session_bufs_full(struct agent_conn *c)
{
	return bufs_full(c);
}

int agent__server_alloc_take(struct agent_conn *c, uint64_t len)
{
	struct agent_server *s = &c->a->server;
	if (len > s->lim.alloc_bytes || s->alloc_bytes > s->lim.alloc_bytes - len) {
		agent__count(&c->a->stats, AGENT_C_REFUSED_ALLOC, 1);
		log_warn("client %s: refused a buffer of %llu bytes: buffers made for clients "
			 "hold %llu of %llu bytes (--client-alloc-size)",
			 c->name, (unsigned long long)len, (unsigned long long)s->alloc_bytes,
			 (unsigned long long)s->lim.alloc_bytes);
		return -ENOSPC;
	}
	s->alloc_bytes += len;
	gauges(c->a);
	return 0;
}

void agent__server_alloc_give(struct agent *a, uint64_t len)
{
	a->server.alloc_bytes -= len;
	gauges(a);
}

int agent__session_buf_add(struct agent_conn *c, struct agent_map *m, uint8_t *base,
			   uint64_t len, uint64_t address, bool alloc, uint64_t *id)
{
	if (bufs_full(c))
		return -ENOSPC;
	if (c->nbufs == c->bufs_cap) {
		size_t cap = c->bufs_cap ? c->bufs_cap * 2 : 8;
		struct agent_buf *p = realloc(c->bufs, cap * sizeof(*p));
		if (!p)
			return -ENOMEM;
		c->bufs = p;
		c->bufs_cap = cap;
	}
	struct agent_buf *b = &c->bufs[c->nbufs++];
	b->id = c->next_buf_id++;
	b->map = m;
	b->base = base;
	b->len = len;
	b->address = address;
	b->alloc = alloc;
	*id = b->id;
	c->a->server.nbuffers++;
	gauges(c->a);
	return 0;
}

const struct agent_buf *agent__session_buf(const struct agent_conn *c, uint64_t id)
{
	for (size_t i = 0; i < c->nbufs; i++)
		if (c->bufs[i].id == id)
			return &c->bufs[i];
	return NULL;
}

struct agent_map *agent__session_buf_remove(struct agent_conn *c, uint64_t id)
{
	for (size_t i = 0; i < c->nbufs; i++) {
		if (c->bufs[i].id != id)
			continue;
		struct agent_map *m = c->bufs[i].map;
		if (c->bufs[i].alloc)
			c->a->server.alloc_bytes -= c->bufs[i].len;
		c->bufs[i] = c->bufs[--c->nbufs];
		c->a->server.nbuffers--;
		gauges(c->a);
		return m;
	}
	return NULL;
}

int agent__session_view_add(struct agent_conn *c, const uint8_t *key, size_t klen,
			    uint64_t offset, uint64_t size, uint64_t *id)
{
	if (c->nviews >= c->a->server.lim.views) {
		agent__count(&c->a->stats, AGENT_C_REFUSED_VIEWS, 1);
		log_warn("client %s: refused a view: it holds %zu, the most a session may "
			 "(--client-max-views)",
			 c->name, c->nviews);
		return -ENOSPC;
	}
	if (c->nviews == c->views_cap) {
		size_t cap = c->views_cap ? c->views_cap * 2 : 16;
		struct agent_view *p = realloc(c->views, cap * sizeof(*p));
		if (!p)
			return -ENOMEM;
		c->views = p;
		c->views_cap = cap;
	}
	uint8_t *copy = malloc(klen);
	if (!copy)
		return -ENOMEM;
	memcpy(copy, key, klen);
	struct agent_view *v = &c->views[c->nviews++];
	v->id = c->next_view_id++;
	v->offset = offset;
	v->size = size;
	v->klen = (uint16_t)klen;
	v->key = copy;
	*id = v->id;
	c->a->server.nviews++;
	gauges(c->a);
	return 0;
}

bool agent__session_view_drop(struct agent_conn *c, uint64_t id)
{
	for (size_t i = 0; i < c->nviews; i++)
		if (c->views[i].id == id) {
			free(c->views[i].key);
			c->views[i] = c->views[--c->nviews];
			c->a->server.nviews--;
			gauges(c->a);
			return true;
		}
	return false;
}

bool agent__session_has_segment_fd(const struct agent_conn *c)
{
	return c->segment_fd_sent;
}

void agent__session_segment_fd_sent(struct agent_conn *c)
{
	c->segment_fd_sent = true;
}

int agent__session_reserve(struct agent_req *r, uint64_t bytes, struct agent_wait *w,
			   void (*resume)(struct agent_wait *w, int err))
{
	struct agent_conn *c = r->c;
	if (c->closed || (!c->waits && reserve_fits(c, bytes))) {
		held_add(c, bytes);
		r->held += bytes;
		return 0;
	}
	w->next = NULL;
	w->r = r;
	w->bytes = bytes;
	w->resume = resume;
	*c->waits_tail = w;
	c->waits_tail = &w->next;
	log_debug("client %s: request %llu waits for %llu bytes of its reply budget "
		  "(%llu held)",
		  c->name, (unsigned long long)r->id, (unsigned long long)bytes,
		  (unsigned long long)c->held);
	return 1;
}
