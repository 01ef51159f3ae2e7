/*
 * conn: one HTTP/2 connection on a libuv TCP stream, shared by the
 * server (sconn.c) and the client (client.c, client_h2.c).
 *
 * Reading: the read callback hands every chunk to nghttp2_session_mem_recv
 * (the session never touches the socket), then flushes what the frame
 * callbacks queued. The read buffer belongs to the server or client and
 * is shared by its connections: mem_recv consumes it before the read
 * callback returns.
 *
 * Writing: rpc__conn_flush() calls nghttp2_session_send(). Our send
 * callback copies small frames (HEADERS, SETTINGS, WINDOW_UPDATE, DATA
 * frame headers) into the current batch's arena; the send_data callback
 * adds the DATA payload as a reference into the message buffer, holding a
 * reference on it until the uv_write completes. A batch is closed when it
 * reaches RPC__BATCH_BYTES (the callback answers NGHTTP2_ERR_WOULDBLOCK,
 * nghttp2 keeps the frame for the next call) and submitted as one
 * uv_write. We stop pulling from nghttp2 while the stream's libuv write
 * queue holds RPC__WRITE_HIGH_BYTES; the write callback resumes. So
 * memory per connection is bounded by what callers queued, never by how
 * slowly the peer reads.
 *
 * Re-entrancy: user callbacks run inside nghttp2 callbacks and may queue
 * frames or close the connection. in_ng counts nghttp2 calls on the stack;
 * a flush requested then is done when the outer call returns, and a close
 * only stops reading and closes handles — the session is deleted from
 * the last close callback, never under nghttp2's feet.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/endian.h"
#include "common/log.h"
#include "common/util.h"
#include "rpc/rpc_int.h"

#define LOG_SUBSYS LOGS_RPC

struct rpc__wseg {
	const uint8_t *ptr; /* NULL: at off in the copy arena */
	size_t off;
	size_t len;
};

struct rpc__wreq {
	uv_write_t req;
	struct rpc__conn *conn;
	struct rpc__wreq *next;
	size_t bytes;
	struct mc_buf copy;
	struct rpc__wseg *segs;
	size_t nsegs, segcap;
	uv_buf_t *bufs;
	size_t bufcap;
	struct rpc__omsg **refs;
	size_t nrefs, refcap;
};

#define WFREE_MAX 4

static void wreq_reset(struct rpc__wreq *w)
{
	for (size_t i = 0; i < w->nrefs; i++)
		rpc__omsg_unref(w->refs[i]);
	w->nrefs = 0;
	w->nsegs = 0;
	w->bytes = 0;
	mc_buf_reset(&w->copy);
}

static void wreq_destroy(struct rpc__wreq *w)
{
	wreq_reset(w);
	mc_buf_free(&w->copy);
	free(w->segs);
	free(w->bufs);
	free(w->refs);
	free(w);
}

static struct rpc__wreq *wreq_current(struct rpc__conn *c)
{
	if (c->cur)
		return c->cur;
	struct rpc__wreq *w = c->wfree;
	if (w) {
		c->wfree = w->next;
		c->nwfree--;
	} else {
		w = calloc(1, sizeof(*w));
		if (!w)
			return NULL;
	}
	w->conn = c;
	w->next = NULL;
	c->cur = w;
	return w;
}

static int wreq_seg(struct rpc__wreq *w, const uint8_t *ptr, size_t off, size_t len)
{
	if (w->nsegs) {
		struct rpc__wseg *last = &w->segs[w->nsegs - 1];
		if (!ptr && !last->ptr && last->off + last->len == off) {
			last->len += len;
			return 0;
		}
		if (ptr && last->ptr && last->ptr + last->len == ptr) {
			last->len += len;
			return 0;
		}
	}
	if (w->nsegs == w->segcap) {
		size_t cap = w->segcap ? w->segcap * 2 : 16;
		struct rpc__wseg *s = realloc(w->segs, cap * sizeof(*s));
		if (!s)
			return -ENOMEM;
		w->segs = s;
		w->segcap = cap;
	}
	w->segs[w->nsegs++] = (struct rpc__wseg){ptr, off, len};
	return 0;
}

static int wreq_copy(struct rpc__wreq *w, const uint8_t *data, size_t len)
{
	size_t off = w->copy.len;
	if (mc_buf_append(&w->copy, data, len))
		return -ENOMEM;
	if (wreq_seg(w, NULL, off, len)) {
		w->copy.len = off;
		return -ENOMEM;
	}
	w->bytes += len;
	return 0;
}

static int wreq_ref(struct rpc__wreq *w, struct rpc__omsg *m, const uint8_t *ptr, size_t len)
{
	if (w->nrefs == 0 || w->refs[w->nrefs - 1] != m) {
		if (w->nrefs == w->refcap) {
			size_t cap = w->refcap ? w->refcap * 2 : 8;
			struct rpc__omsg **r = realloc(w->refs, cap * sizeof(*r));
			if (!r)
				return -ENOMEM;
			w->refs = r;
			w->refcap = cap;
		}
		w->refs[w->nrefs++] = m;
		m->refs++;
	}
	if (wreq_seg(w, ptr, 0, len))
		return -ENOMEM;
	w->bytes += len;
	return 0;
}

/* May a frame of n more bytes join the current batch? */
static bool batch_room(struct rpc__conn *c, size_t n)
{
	if (!c->cur || c->cur->bytes == 0)
		return true;
	return c->cur->bytes + n <= RPC__BATCH_BYTES;
}

/* ---------------------------------------------------------------- nghttp2 send side */

static ssize_t on_send(nghttp2_session *ng, const uint8_t *data, size_t length, int flags,
		       void *user_data)
{
	struct rpc__conn *c = user_data;
	if (!batch_room(c, length)) {
		c->blocked = true;
		return NGHTTP2_ERR_WOULDBLOCK;
	}
	struct rpc__wreq *w = wreq_current(c);
	if (!w || wreq_copy(w, data, length))
		return NGHTTP2_ERR_CALLBACK_FAILURE;
	return (ssize_t)length;
}

static void drain_check(struct rpc__conn *c, struct rpc__outq *q)
{
	if (q->want_drain && q->bytes < RPC_DRAIN_BYTES && !q->in_drain && q->ops &&
	    q->ops->on_drain) {
		q->want_drain = false;
		q->in_drain = true;
		q->drain_next = c->drain_head;
		c->drain_head = q;
	}
}

static int on_send_data(nghttp2_session *ng, nghttp2_frame *frame, const uint8_t *framehd,
			size_t length, nghttp2_data_source *source, void *user_data)
{
	struct rpc__conn *c = user_data;
	struct rpc__outq *q = source->ptr;

	if (!batch_room(c, 9 + length)) {
		c->blocked = true;
		return NGHTTP2_ERR_WOULDBLOCK;
	}
	struct rpc__wreq *w = wreq_current(c);
	if (!w || frame->data.padlen != 0 || length > q->bytes)
		return NGHTTP2_ERR_CALLBACK_FAILURE;
	if (wreq_copy(w, framehd, 9))
		return NGHTTP2_ERR_CALLBACK_FAILURE;
	size_t left = length;
	while (left > 0) {
		struct rpc__omsg *m = q->head;
		size_t avail;
		const uint8_t *p = rpc__omsg_at(m, q->head_off, &avail);
		size_t k = avail < left ? avail : left;
		if (wreq_ref(w, m, p, k))
			return NGHTTP2_ERR_CALLBACK_FAILURE;
		q->head_off += k;
		left -= k;
		if (q->head_off == m->len) {
			q->head = m->next;
			if (!q->head)
				q->tail = NULL;
			q->head_off = 0;
			rpc__omsg_unref(m);
		}
	}
	rpc__outq_set_bytes(q, q->bytes - length);
	q->reserved = 0;
	q->taken += length;
	drain_check(c, q);
	return 0;
}

static ssize_t on_read_length(nghttp2_session *ng, uint8_t frame_type, int32_t stream_id,
			      int32_t session_window, int32_t stream_window,
			      uint32_t remote_max_frame, void *user_data)
{
	ssize_t n = RPC__MAX_FRAME_BYTES;
	if ((ssize_t)remote_max_frame < n)
		n = (ssize_t)remote_max_frame;
	if (session_window < n)
		n = session_window;
	if (stream_window < n)
		n = stream_window;
	return n > 0 ? n : 1;
}

static int on_error(nghttp2_session *ng, int lib_error_code, const char *msg, size_t len,
		    void *user_data)
{
	struct rpc__conn *c = user_data;
	log_warn("%s: protocol error from %s: %.*s (%s)", c->label, c->peer, (int)len, msg,
		 nghttp2_strerror(lib_error_code));
	if (c->ops->on_proto_error)
		c->ops->on_proto_error(c);
	return 0;
}

void rpc__callbacks_init(nghttp2_session_callbacks *cbs)
{
	nghttp2_session_callbacks_set_send_callback(cbs, on_send);
	nghttp2_session_callbacks_set_send_data_callback(cbs, on_send_data);
	nghttp2_session_callbacks_set_data_source_read_length_callback(cbs, on_read_length);
	nghttp2_session_callbacks_set_error_callback2(cbs, on_error);
}

/* ---------------------------------------------------------------- writes */

static void conn_check_end(struct rpc__conn *c);

/* A written request back to the free list (or freed past WFREE_MAX). */
static void wreq_recycle(struct rpc__conn *c, struct rpc__wreq *w)
{
	wreq_reset(w);
	if (c->nwfree < WFREE_MAX) {
		w->next = c->wfree;
		c->wfree = w;
		c->nwfree++;
	} else {
		wreq_destroy(w);
	}
}

static void on_write(uv_write_t *req, int status)
{
	struct rpc__wreq *w = MC_CONTAINER_OF(req, struct rpc__wreq, req);
	struct rpc__conn *c = w->conn;

	c->nwrites--;
	wreq_recycle(c, w);
	if (status < 0) {
		if (status != UV_ECANCELED && !c->closing)
			log_info("%s: write to %s failed: %s", c->label, c->peer,
				 uv_strerror(status));
		rpc__conn_close(c);
		return;
	}
	if (c->closing)
		return;
	rpc__conn_flush(c);
}

static int submit_batch(struct rpc__conn *c)
{
	struct rpc__wreq *w = c->cur;
	if (!w || w->bytes == 0)
		return 0;
	if (w->bufcap < w->nsegs) {
		uv_buf_t *b = realloc(w->bufs, w->nsegs * sizeof(*b));
		if (!b)
			return -ENOMEM;
		w->bufs = b;
		w->bufcap = w->nsegs;
	}
	for (size_t i = 0; i < w->nsegs; i++) {
		const struct rpc__wseg *s = &w->segs[i];
		char *base = s->ptr ? (char *)s->ptr : w->copy.data + s->off;
		w->bufs[i] = uv_buf_init(base, (unsigned)s->len);
	}
	c->cur = NULL;
	/* Most batches fit the socket's buffer at once: written here, they
	 * need no write request (nor libuv's re-arming of the socket's poll
	 * interest after it: an epoll_ctl per write). The rest, if any, goes
	 * through uv_write. */
	int n = uv_try_write((uv_stream_t *)&c->tcp, w->bufs, (unsigned)w->nsegs);
	if (n < 0 && n != UV_EAGAIN) {
		wreq_destroy(w);
		return n;
	}
	size_t done = n > 0 ? (size_t)n : 0, i = 0;
	if (done == w->bytes) {
		wreq_recycle(c, w);
		return 0;
	}
	while (done >= w->bufs[i].len) {
		done -= w->bufs[i].len;
		i++;
	}
	w->bufs[i].base += done;
	w->bufs[i].len -= done;
	int rc = uv_write(&w->req, (uv_stream_t *)&c->tcp, w->bufs + i,
			  (unsigned)(w->nsegs - i), on_write);
	if (rc < 0) {
		wreq_destroy(w);
		return rc;
	}
	c->nwrites++;
	return 0;
}

static void run_drains(struct rpc__conn *c)
{
	while (c->drain_head && !c->closing) {
		struct rpc__outq *q = c->drain_head;
		c->drain_head = q->drain_next;
		q->in_drain = false;
		q->drain_next = NULL;
		q->ops->on_drain(q);
	}
}

void rpc__conn_flush(struct rpc__conn *c)
{
	if (c->closing || !c->ng)
		return;
	if (c->in_ng || c->in_flush) {
		c->flush_again = true;
		return;
	}
	c->in_flush = true;
	do {
		c->flush_again = false;
		for (;;) {
			if (uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp) >=
			    RPC__WRITE_HIGH_BYTES)
				break;
			c->blocked = false;
			c->in_ng++;
			int rv = nghttp2_session_send(c->ng);
			c->in_ng--;
			if (c->closing)
				break;
			if (rv != 0) {
				log_warn("%s: connection %s: send failed: %s", c->label,
					 c->peer, nghttp2_strerror(rv));
				c->in_flush = false;
				rpc__conn_close(c);
				return;
			}
			int rc = submit_batch(c);
			if (rc < 0) {
				log_info("%s: write to %s failed: %s", c->label, c->peer,
					 uv_strerror(rc));
				c->in_flush = false;
				rpc__conn_close(c);
				return;
			}
			if (!c->blocked)
				break;
		}
		run_drains(c);
	} while (c->flush_again && !c->closing);
	c->in_flush = false;
	conn_check_end(c);
}

static void on_prepare(uv_prepare_t *p)
{
	struct rpc__conn *c = MC_CONTAINER_OF(p, struct rpc__conn, prep);
	uv_prepare_stop(p);
	rpc__conn_flush(c);
}

void rpc__conn_want_flush(struct rpc__conn *c)
{
	if (c->closing || !c->ng)
		return;
	if (c->in_ng || c->in_flush) {
		c->flush_again = true;
		return;
	}
	uv_prepare_start(&c->prep, on_prepare);
}

void rpc__conn_resume(struct rpc__conn *c, int32_t stream_id, struct rpc__outq *q)
{
	if (q->deferred && c->ng && !c->closing) {
		q->deferred = false;
		nghttp2_session_resume_data(c->ng, stream_id);
	}
	rpc__conn_want_flush(c);
}

void rpc__conn_forget_outq(struct rpc__conn *c, struct rpc__outq *q)
{
	if (!q->in_drain)
		return;
	for (struct rpc__outq **p = &c->drain_head; *p; p = &(*p)->drain_next) {
		if (*p == q) {
			*p = q->drain_next;
			break;
		}
	}
	q->in_drain = false;
	q->drain_next = NULL;
}

/* ---------------------------------------------------------------- reads */

/* Follow the frames in n bytes about to be handed to nghttp2. */
static void rtrack_feed(struct rpc__rtrack *t, const uint8_t *p, size_t n)
{
	while (n > 0) {
		size_t k;
		if (t->skip) {
			k = MC_MIN((size_t)t->skip, n);
			t->skip -= (uint32_t)k;
		} else if (t->left) {
			k = MC_MIN((size_t)t->left, n);
			t->left -= (uint32_t)k;
		} else {
			k = MC_MIN(sizeof(t->hd) - t->hd_len, n);
			memcpy(t->hd + t->hd_len, p, k);
			t->hd_len += (unsigned)k;
			if (t->hd_len == sizeof(t->hd)) {
				t->hd_len = 0;
				t->left = (uint32_t)t->hd[0] << 16 | (uint32_t)t->hd[1] << 8 |
					  t->hd[2];
				t->data = t->hd[3] == NGHTTP2_DATA &&
					  !(t->hd[4] & NGHTTP2_FLAG_PADDED);
				t->sid = (int32_t)(mc_get_be32(t->hd + 5) & 0x7fffffffu);
			}
		}
		p += k;
		n -= k;
	}
}

/*
 * In the middle of an unpadded DATA frame for a stream whose deframer has
 * a body open, the read goes straight into that body, at most to the end
 * of the frame and of the body: nghttp2 then hands the deframer the very
 * bytes it already holds, and a large message is not copied out of the
 * read buffer. Right after such a read ends a frame, only the next frame
 * header is read, so that the payload after it can go straight in too.
 * Anything else is read into the shared buffer.
 */
static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
	struct rpc__conn *c = MC_CONTAINER_OF((uv_tcp_t *)h, struct rpc__conn, tcp);
	struct rpc__rtrack *t = &c->rt;
	size_t room;
	if (t->data && t->left && !t->skip && c->ops->deframer && c->ng) {
		struct rpc_deframer *d = c->ops->deframer(c, t->sid);
		uint8_t *p = d ? rpc_deframer_room(d, &room) : NULL;
		if (p) {
			*buf = uv_buf_init((char *)p, (unsigned)MC_MIN(room, (size_t)t->left));
			return;
		}
	}
	size_t n = RPC__READ_BUF_BYTES;
	if (t->was_direct && !t->left && !t->skip)
		n = sizeof(t->hd) - t->hd_len;
	*buf = uv_buf_init((char *)c->rbuf, (unsigned)n);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
	struct rpc__conn *c = MC_CONTAINER_OF((uv_tcp_t *)s, struct rpc__conn, tcp);

	if (nread == 0 || c->closing)
		return;
	if (nread < 0) {
		if (nread != UV_EOF)
			log_debug("%s: read from %s: %s", c->label, c->peer,
				  uv_strerror((int)nread));
		rpc__conn_close(c);
		return;
	}
	c->rt.was_direct = (uint8_t *)buf->base != c->rbuf;
	rtrack_feed(&c->rt, (const uint8_t *)buf->base, (size_t)nread);
	c->in_ng++;
	ssize_t rv = nghttp2_session_mem_recv(c->ng, (const uint8_t *)buf->base,
					      (size_t)nread);
	c->in_ng--;
	if (c->closing)
		return;
	if (rv < 0) {
		log_warn("%s: connection from %s: %s, closing", c->label, c->peer,
			 nghttp2_strerror((int)rv));
		if (c->ops->on_proto_error)
			c->ops->on_proto_error(c);
		/* Send what is queued (a GOAWAY, if nghttp2 made one). */
		rpc__conn_close_after_flush(c);
		return;
	}
	rpc__conn_flush(c);
}

/* ---------------------------------------------------------------- lifecycle */

int rpc__conn_init(struct rpc__conn *c, uv_loop_t *loop, const struct rpc__conn_ops *ops,
		   const char *label, uint8_t *rbuf)
{
	int rc;

	memset(c, 0, sizeof(*c));
	c->ops = ops;
	c->label = label;
	c->rbuf = rbuf;
	snprintf(c->peer, sizeof(c->peer), "?");
	rc = uv_tcp_init(loop, &c->tcp);
	if (rc < 0)
		return rc;
	/* Neither can fail on Linux once the loop exists. */
	uv_timer_init(loop, &c->timer);
	uv_prepare_init(loop, &c->prep);
	c->handles = 3;
	return 0;
}

int rpc__conn_start(struct rpc__conn *c, bool server, const nghttp2_session_callbacks *cbs,
		    const nghttp2_option *opt, const nghttp2_settings_entry *iv, size_t niv)
{
	int rv;

	rv = server ? nghttp2_session_server_new2(&c->ng, cbs, c, opt)
		    : nghttp2_session_client_new2(&c->ng, cbs, c, opt);
	if (rv != 0)
		return -ENOMEM;
	rv = nghttp2_submit_settings(c->ng, NGHTTP2_FLAG_NONE, iv, niv);
	if (rv == 0)
		rv = nghttp2_session_set_local_window_size(c->ng, NGHTTP2_FLAG_NONE, 0,
							   RPC__CONN_WINDOW_BYTES);
	if (rv != 0)
		return -ENOMEM;
	if (server)
		c->rt.skip = NGHTTP2_CLIENT_MAGIC_LEN;
	uv_tcp_nodelay(&c->tcp, 1);
	struct sockaddr_storage ss;
	int len = sizeof(ss);
	if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &len) == 0)
		mc_format_addr((struct sockaddr *)&ss, c->peer, sizeof(c->peer));
	int rc = uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
	if (rc < 0)
		return rc;
	c->reading = true;
	rpc__conn_want_flush(c);
	return 0;
}

static void on_handle_closed(uv_handle_t *h)
{
	struct rpc__conn *c = h->data;
	if (--c->handles == 0)
		c->ops->on_closed(c);
}

void rpc__conn_close(struct rpc__conn *c)
{
	if (c->closing)
		return;
	c->closing = true;
	c->tcp.data = c;
	c->timer.data = c;
	c->prep.data = c;
	/* Write callbacks run (UV_ECANCELED) before the close callback. */
	uv_close((uv_handle_t *)&c->tcp, on_handle_closed);
	uv_close((uv_handle_t *)&c->timer, on_handle_closed);
	uv_close((uv_handle_t *)&c->prep, on_handle_closed);
}

void rpc__conn_close_after_flush(struct rpc__conn *c)
{
	if (c->closing)
		return;
	c->close_after_flush = true;
	if (!c->ng) {
		rpc__conn_close(c);
		return;
	}
	/* The flush ends in conn_check_end (now or when the nghttp2 call on
	 * the stack returns). */
	rpc__conn_flush(c);
}

static void conn_check_end(struct rpc__conn *c)
{
	if (c->closing || !c->ng || c->in_ng || c->in_flush || c->nwrites)
		return;
	/* A flush just ran: with no write in flight nothing is left that
	 * could go out now. */
	if (c->close_after_flush ||
	    (!nghttp2_session_want_write(c->ng) && !nghttp2_session_want_read(c->ng)))
		rpc__conn_close(c);
}

void rpc__conn_release(struct rpc__conn *c)
{
	nghttp2_session_del(c->ng);
	c->ng = NULL;
	if (c->cur)
		wreq_destroy(c->cur);
	c->cur = NULL;
	while (c->wfree) {
		struct rpc__wreq *w = c->wfree;
		c->wfree = w->next;
		wreq_destroy(w);
	}
	c->nwfree = 0;
}
