/*
 * outq: outgoing gRPC messages and deadlines, the per-call state that the
 * server and the client share.
 *
 * A message is serialized once, into one buffer holding the 5-byte
 * prefix and the protobuf body (rpc__omsg). A stream's messages wait in
 * its rpc__outq until nghttp2 asks its data provider for DATA: the read
 * callback only says how many bytes may go (NGHTTP2_DATA_FLAG_NO_COPY),
 * and conn.c's send_data callback then points the socket write at the
 * message buffer itself. Buffers are reference-counted: the queue holds
 * one reference, every uv_write that points into a buffer holds another.
 *
 * The deadline heap orders the calls of one server or client by their
 * deadline so that a single uv_timer serves them all.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rpc/rpc_int.h"

/* ---------------------------------------------------------------- messages */

int rpc__omsg_pack(const ProtobufCMessage *msg, size_t max_bytes,
		   struct rpc__omsg **out)
{
	size_t body = protobuf_c_message_get_packed_size(msg);
	if (body > max_bytes || body > UINT32_MAX)
		return MC_ETOO_LARGE;
	struct rpc__omsg *m = malloc(sizeof(*m) + 5 + body);
	if (!m)
		return -ENOMEM;
	m->next = NULL;
	m->refs = 1;
	m->len = 5 + body;
	rpc_frame_prefix(m->data, (uint32_t)body);
	if (body)
		protobuf_c_message_pack(msg, m->data + 5);
	*out = m;
	return 0;
}

void rpc__omsg_unref(struct rpc__omsg *m)
{
	if (m && --m->refs == 0)
		free(m);
}

/* ---------------------------------------------------------------- queue */

void rpc__outq_init(struct rpc__outq *q, const struct rpc__outq_ops *ops)
{
	memset(q, 0, sizeof(*q));
	q->ops = ops;
}

void rpc__outq_clear(struct rpc__outq *q)
{
	struct rpc__omsg *m = q->head;
	while (m) {
		struct rpc__omsg *next = m->next;
		rpc__omsg_unref(m);
		m = next;
	}
	q->head = q->tail = NULL;
	q->head_off = 0;
	q->bytes = 0;
	q->reserved = 0;
}

void rpc__outq_push(struct rpc__outq *q, struct rpc__omsg *m)
{
	m->next = NULL;
	if (q->tail)
		q->tail->next = m;
	else
		q->head = m;
	q->tail = m;
	q->bytes += m->len;
	if (q->bytes >= RPC_DRAIN_BYTES)
		q->want_drain = true;
}

void rpc__outq_drop_unsent(struct rpc__outq *q)
{
	size_t keep = q->reserved;
	size_t off = q->head_off;
	struct rpc__omsg **link = &q->head, *last = NULL;

	while (*link && keep > 0) {
		struct rpc__omsg *m = *link;
		size_t avail = m->len - off;
		if (avail >= keep) {
			/* The frame in flight ends inside m: shorten m so
			 * nothing after the frame is sent. */
			m->len = off + keep;
			keep = 0;
		} else {
			keep -= avail;
		}
		off = 0;
		last = m;
		link = &m->next;
	}
	struct rpc__omsg *rest = *link;
	*link = NULL;
	q->tail = last;
	if (!last) {
		q->head = NULL;
		q->head_off = 0;
	}
	while (rest) {
		struct rpc__omsg *next = rest->next;
		rpc__omsg_unref(rest);
		rest = next;
	}
	q->bytes = q->reserved;
}

ssize_t rpc__outq_read_cb(nghttp2_session *ng, int32_t stream_id,
			  uint8_t *buf, size_t length, uint32_t *data_flags,
			  nghttp2_data_source *source, void *user_data)
{
	struct rpc__outq *q = source->ptr;

	if (q->bytes == 0) {
		if (!q->eof) {
			q->deferred = true;
			return NGHTTP2_ERR_DEFERRED;
		}
		*data_flags |= NGHTTP2_DATA_FLAG_EOF;
		if (q->ops && q->ops->on_eof)
			q->ops->on_eof(q, ng, stream_id, data_flags);
		return 0;
	}
	size_t n = q->bytes < length ? q->bytes : length;
	*data_flags |= NGHTTP2_DATA_FLAG_NO_COPY;
	if (n == q->bytes && q->eof) {
		*data_flags |= NGHTTP2_DATA_FLAG_EOF;
		if (q->ops && q->ops->on_eof)
			q->ops->on_eof(q, ng, stream_id, data_flags);
	}
	q->reserved = n;
	return (ssize_t)n;
}

/* ---------------------------------------------------------------- deadlines */

void rpc__dl_init(struct rpc__dl *d)
{
	d->at_ms = 0;
	d->idx = SIZE_MAX;
}

static void heap_set(struct rpc__dlheap *h, size_t i, struct rpc__dl *d)
{
	h->v[i] = d;
	d->idx = i;
}

static void heap_up(struct rpc__dlheap *h, size_t i)
{
	struct rpc__dl *d = h->v[i];
	while (i > 0) {
		size_t p = (i - 1) / 2;
		if (h->v[p]->at_ms <= d->at_ms)
			break;
		heap_set(h, i, h->v[p]);
		i = p;
	}
	heap_set(h, i, d);
}

static void heap_down(struct rpc__dlheap *h, size_t i)
{
	struct rpc__dl *d = h->v[i];
	for (;;) {
		size_t l = 2 * i + 1, r = l + 1, m = i;
		uint64_t best = d->at_ms;
		if (l < h->n && h->v[l]->at_ms < best) {
			m = l;
			best = h->v[l]->at_ms;
		}
		if (r < h->n && h->v[r]->at_ms < best)
			m = r;
		if (m == i)
			break;
		heap_set(h, i, h->v[m]);
		i = m;
	}
	heap_set(h, i, d);
}

int rpc__dlheap_add(struct rpc__dlheap *h, struct rpc__dl *d)
{
	if (h->n == h->cap) {
		size_t cap = h->cap ? h->cap * 2 : 64;
		struct rpc__dl **v = realloc(h->v, cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		h->v = v;
		h->cap = cap;
	}
	h->v[h->n] = d;
	d->idx = h->n++;
	heap_up(h, d->idx);
	return 0;
}

void rpc__dlheap_del(struct rpc__dlheap *h, struct rpc__dl *d)
{
	size_t i = d->idx;
	if (i == SIZE_MAX || i >= h->n || h->v[i] != d)
		return;
	d->idx = SIZE_MAX;
	struct rpc__dl *last = h->v[--h->n];
	if (last == d)
		return;
	heap_set(h, i, last);
	if (i > 0 && h->v[(i - 1) / 2]->at_ms > last->at_ms)
		heap_up(h, i);
	else
		heap_down(h, i);
}

struct rpc__dl *rpc__dlheap_top(const struct rpc__dlheap *h)
{
	return h->n ? h->v[0] : NULL;
}

void rpc__dlheap_free(struct rpc__dlheap *h)
{
	free(h->v);
	h->v = NULL;
	h->n = h->cap = 0;
}

void rpc__dlheap_arm(const struct rpc__dlheap *h, uv_timer_t *timer,
		     uv_timer_cb cb)
{
	struct rpc__dl *top = rpc__dlheap_top(h);
	if (!top) {
		uv_timer_stop(timer);
		return;
	}
	uint64_t now = uv_now(timer->loop);
	uv_timer_start(timer, cb, top->at_ms > now ? top->at_ms - now : 0, 0);
}

/* ---------------------------------------------------------------- status maps */

int rpc__status_from_http(int http_status)
{
	switch (http_status) {
	case 200:
		return RPC_OK;
	case 400:
		return RPC_INTERNAL;
	case 401:
		return RPC_UNAUTHENTICATED;
	case 403:
		return RPC_PERMISSION_DENIED;
	case 404:
		return RPC_UNIMPLEMENTED;
	case 429:
	case 502:
	case 503:
	case 504:
		return RPC_UNAVAILABLE;
	default:
		return RPC_UNKNOWN;
	}
}

int rpc__status_from_h2(uint32_t error_code)
{
	switch (error_code) {
	case NGHTTP2_NO_ERROR:
	case NGHTTP2_PROTOCOL_ERROR:
	case NGHTTP2_INTERNAL_ERROR:
	case NGHTTP2_FLOW_CONTROL_ERROR:
	case NGHTTP2_SETTINGS_TIMEOUT:
	case NGHTTP2_FRAME_SIZE_ERROR:
	case NGHTTP2_COMPRESSION_ERROR:
	case NGHTTP2_CONNECT_ERROR:
		return RPC_INTERNAL;
	case NGHTTP2_REFUSED_STREAM:
		return RPC_UNAVAILABLE;
	case NGHTTP2_CANCEL:
		return RPC_CANCELLED;
	case NGHTTP2_ENHANCE_YOUR_CALM:
		return RPC_RESOURCE_EXHAUSTED;
	case NGHTTP2_INADEQUATE_SECURITY:
		return RPC_PERMISSION_DENIED;
	default:
		return RPC_INTERNAL;
	}
}
