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

#include "common/metrics.h"
#include "common/pb.h"
#include "rpc/rpc_int.h"

/* ---------------------------------------------------------------- buffers */

/* A cached buffer of at least len bytes (and not a huge one for a small
 * need), or NULL. */
static void *buf_cached(struct rpc__bufcache *bc, size_t len, size_t *cap)
{
	if (!bc || len < RPC__BUF_CACHE_MIN_BYTES)
		return NULL;
	unsigned best = RPC__BUF_CACHE_SLOTS;
	for (unsigned i = 0; i < bc->n; i++) {
		size_t c = bc->slot[i].cap;
		if (c >= len && c / 2 <= len &&
		    (best == RPC__BUF_CACHE_SLOTS || c < bc->slot[best].cap))
			best = i;
	}
	if (best == RPC__BUF_CACHE_SLOTS)
		return NULL;
	void *p = bc->slot[best].p;
	*cap = bc->slot[best].cap;
	bc->bytes -= *cap;
	bc->slot[best] = bc->slot[--bc->n];
	return p;
}

void *rpc__buf_get(struct rpc__bufcache *bc, size_t len, size_t *cap)
{
	void *p = buf_cached(bc, len, cap);
	if (p)
		return p;
	*cap = len;
	return malloc(len ? len : 1);
}

void rpc__buf_put(struct rpc__bufcache *bc, void *p, size_t cap)
{
	if (!p)
		return;
	if (!bc || cap < RPC__BUF_CACHE_MIN_BYTES || bc->n == RPC__BUF_CACHE_SLOTS ||
	    bc->bytes + cap > RPC__BUF_CACHE_MAX_BYTES) {
		free(p);
		return;
	}
	bc->slot[bc->n].p = p;
	bc->slot[bc->n].cap = cap;
	bc->n++;
	bc->bytes += cap;
}

void rpc__bufcache_free(struct rpc__bufcache *bc)
{
	for (unsigned i = 0; i < bc->n; i++)
		free(bc->slot[i].p);
	bc->n = 0;
	bc->bytes = 0;
}

size_t rpc__mem_left(const struct rpc__bufcache *bc)
{
	return !bc->mem_max                 ? SIZE_MAX
	       : bc->mem_held < bc->mem_max ? bc->mem_max - bc->mem_held
					    : 0;
}

void rpc__mem_count(struct rpc__bufcache *bc, size_t n, bool add)
{
	bc->mem_held = add ? bc->mem_held + n : bc->mem_held - n;
	metric_set(bc->mem_gauge, (int64_t)bc->mem_held);
}

/* Deframer bodies carry their buffer's size in a 16-byte header, since
 * the deframer only knows the body length. A cached buffer that holds the
 * whole body is taken at once (its pages are in already: the body neither
 * grows nor faults); else one of the part asked for. */
static void *df_alloc(void *ctx, size_t len, size_t *want)
{
	size_t cap;
	uint8_t *p = buf_cached(ctx, len + 16, &cap);
	if (!p)
		p = rpc__buf_get(ctx, *want + 16, &cap);
	if (!p)
		return NULL;
	memcpy(p, &cap, sizeof(cap));
	*want = cap - 16;
	return p + 16;
}

static void df_release(void *ctx, void *p, size_t len)
{
	size_t cap;
	uint8_t *base = (uint8_t *)p - 16;
	memcpy(&cap, base, sizeof(cap));
	rpc__buf_put(ctx, base, cap);
}

void rpc__deframer_setup(struct rpc_deframer *d, size_t max_bytes, struct rpc__bufcache *bc)
{
	rpc_deframer_init(d, max_bytes);
	if (bc) {
		d->alloc = df_alloc;
		d->release = df_release;
		d->alloc_ctx = bc;
	}
}

/* How a spilled message is freed (rpc__unpacked_free): bytes fields
 * aliased into the received body are not freed either. */
static void arena_free(void *data, void *p)
{
	struct rpc__arena *a = data; /* (pb is its first member) */
	if (a->body && (uint8_t *)p >= a->body->p && (uint8_t *)p < a->body->p + a->body->len)
		return;
	if (!mc_pbarena_owns(&a->pb, p))
		free(p);
}

/* ---------------------------------------------------------------- nesting */

#define NEST_TYPES_MAX 64

struct nest_seen {
	const ProtobufCMessageDescriptor *d[NEST_TYPES_MAX];
	bool open[NEST_TYPES_MAX];
	unsigned n;
};

/* Depth-first over the message types reachable from d: true when one
 * reaches a type still open (a cycle), or when there are too many types to
 * tell. Recursion is bounded by NEST_TYPES_MAX. */
static bool nest_cycle(struct nest_seen *s, const ProtobufCMessageDescriptor *d)
{
	for (unsigned i = 0; i < s->n; i++)
		if (s->d[i] == d)
			return s->open[i];
	if (s->n == NEST_TYPES_MAX)
		return true;
	unsigned me = s->n++;
	s->d[me] = d;
	s->open[me] = true;
	for (unsigned f = 0; f < d->n_fields; f++)
		if (d->fields[f].type == PROTOBUF_C_TYPE_MESSAGE &&
		    nest_cycle(s, d->fields[f].descriptor))
			return true;
	s->open[me] = false;
	return false;
}

bool rpc__nesting_ok(const ProtobufCMessageDescriptor *desc, const uint8_t *data, size_t len,
		     unsigned max)
{
	struct nest_seen seen = {.n = 0};
	if (!nest_cycle(&seen, desc))
		return true;
	/* The open submessages: their type and where each ends. */
	struct {
		const ProtobufCMessageDescriptor *d;
		size_t end;
	} stk[RPC__MAX_NESTING + 1];
	unsigned depth = 0;
	size_t pos = 0;
	if (max > RPC__MAX_NESTING)
		max = RPC__MAX_NESTING;
	stk[0].d = desc;
	stk[0].end = len;
	for (;;) {
		while (depth && pos >= stk[depth].end)
			depth--;
		if (pos >= stk[depth].end)
			return true;
		struct mc_pbrec r;
		if (!mc_pb_next(data, stk[depth].end, &pos, &r))
			return true; /* malformed: protobuf-c says so */
		const ProtobufCFieldDescriptor *f =
			r.wt == 2 && r.num <= UINT32_MAX
				? protobuf_c_message_descriptor_get_field(stk[depth].d,
									  (unsigned)r.num)
				: NULL;
		if (f && f->type == PROTOBUF_C_TYPE_MESSAGE) {
			if (depth == max)
				return false;
			depth++;
			stk[depth].d = f->descriptor;
			stk[depth].end = r.end;
			pos = r.data;
		}
	}
}

/* ---------------------------------------------------------------- unpack */

/* The top-level records of data that may be left in place: a proto3
 * singular bytes field (no presence flag, not in a oneof) of at least
 * RPC__ALIAS_MIN_BYTES that occurs once. Returns how many were found, at
 * most RPC__ALIAS_MAX; 0 also when data is malformed. */
static unsigned find_aliases(const ProtobufCMessageDescriptor *desc, const uint8_t *data,
			     size_t len, const ProtobufCFieldDescriptor **fields,
			     struct mc_pbrec *recs)
{
	unsigned n = 0;
	size_t pos = 0;
	struct mc_pbrec r;

	while (pos < len) {
		if (!mc_pb_next(data, len, &pos, &r))
			return 0;
		if (r.wt != 2 || r.end - r.data < RPC__ALIAS_MIN_BYTES || r.num > UINT32_MAX ||
		    n == RPC__ALIAS_MAX)
			continue;
		const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field(
			desc, (unsigned)r.num);
		if (!f || f->type != PROTOBUF_C_TYPE_BYTES ||
		    f->label != PROTOBUF_C_LABEL_NONE ||
		    (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF))
			continue;
		fields[n] = f;
		recs[n++] = r;
	}
	/* A field that occurs more than once is left to protobuf-c, which
	 * keeps the last occurrence. */
	pos = 0;
	while (n && pos < len) {
		if (!mc_pb_next(data, len, &pos, &r))
			return 0;
		for (unsigned i = 0; i < n; i++) {
			if (r.num != recs[i].num || r.start == recs[i].start)
				continue;
			fields[i] = fields[n - 1];
			recs[i] = recs[n - 1];
			n--;
			break;
		}
	}
	return n;
}

/* Start ar in a recycled buffer of at least want bytes, the buffer and
 * its chunks within room bytes (SIZE_MAX: no bound). False when want does
 * not fit (ar->too_big) or memory is out. */
static bool arena_begin(struct rpc__arena *ar, size_t want, size_t room)
{
	if (want > room) {
		ar->too_big = true;
		return false;
	}
	size_t cap;
	uint8_t *base = rpc__buf_get(ar->bc, want, &cap);
	if (!base)
		return false;
	mc_pbarena_init(&ar->pb, base, cap, 64u << 10);
	if (room != SIZE_MAX)
		ar->pb.limit = room > cap ? room - cap : 1; /* (0 would be none) */
	return true;
}

/* Unpack with the records in recs left out, then point their fields at
 * their bytes in body, which the arena takes from df; the structs may
 * take room bytes. NULL with *taken false when df did not hand out data
 * as a body it owns. */
static ProtobufCMessage *unpack_aliased(const ProtobufCMessageDescriptor *desc,
					const uint8_t *data, size_t len,
					struct rpc_deframer *df, struct rpc__arena *ar,
					size_t room, unsigned n,
					const ProtobufCFieldDescriptor **fields,
					const struct mc_pbrec *recs, bool *taken)
{
	struct rpc__rbody *rb = malloc(sizeof(*rb));
	uint8_t *body = rb ? rpc_deframer_take(df, data) : NULL;
	*taken = body != NULL;
	if (!body) {
		free(rb);
		return NULL;
	}
	*rb = (struct rpc__rbody){.refs = 1,
				  .p = body,
				  .len = len,
				  .release = df->release,
				  .ctx = df->alloc_ctx};
	ar->body = rb;

	/* The rest of the message, in record order, at the arena's start. */
	size_t rest_len = len;
	for (unsigned i = 0; i < n; i++)
		rest_len -= recs[i].end - recs[i].start;
	if (!arena_begin(ar, rest_len + (64u << 10), room))
		return NULL;
	uint8_t *base = ar->pb.buf;
	/* (the rest first, then the structs) */
	if (!mc_pbarena_alloc(&ar->pb, rest_len))
		return NULL;
	size_t at = 0, out = 0;
	while (at < len) {
		size_t next = len, skip_to = len;
		for (unsigned i = 0; i < n; i++)
			if (recs[i].start >= at && recs[i].start < next) {
				next = recs[i].start;
				skip_to = recs[i].end;
			}
		memcpy(base + out, data + at, next - at);
		out += next - at;
		at = skip_to;
	}
	ProtobufCMessage *m = protobuf_c_message_unpack(desc, &ar->pb.pa, rest_len, base);
	if (!m)
		return NULL;
	for (unsigned i = 0; i < n; i++) {
		ProtobufCBinaryData *bd = (ProtobufCBinaryData *)((uint8_t *)m +
								  fields[i]->offset);
		bd->data = body + recs[i].data;
		bd->len = recs[i].end - recs[i].data;
	}
	return m;
}

void rpc__rbody_unref(struct rpc__rbody *b)
{
	if (!b || --b->refs)
		return;
	if (b->release)
		b->release(b->ctx, b->p, b->len);
	else
		free(b->p);
	free(b);
}

static void arena_release(struct rpc__arena *ar)
{
	rpc__mem_count(ar->bc, ar->held, false);
	ar->held = 0;
	mc_pbarena_release(&ar->pb);
	rpc__buf_put(ar->bc, ar->pb.buf, ar->pb.cap);
	ar->pb.buf = NULL;
	rpc__rbody_unref(ar->body);
	ar->body = NULL;
}

/* rpc__unpack into an arena of bc's, which may take room bytes. */
static ProtobufCMessage *unpack_arena(const ProtobufCMessageDescriptor *desc,
				      const uint8_t *data, size_t len, struct rpc_deframer *df,
				      struct rpc__arena *ar, size_t room)
{
	const ProtobufCFieldDescriptor *fields[RPC__ALIAS_MAX];
	struct mc_pbrec recs[RPC__ALIAS_MAX];
	unsigned n = df && len >= RPC__ALIAS_MIN_BYTES
			     ? find_aliases(desc, data, len, fields, recs)
			     : 0;
	if (n) {
		bool taken;
		ProtobufCMessage *m = unpack_aliased(desc, data, len, df, ar, room, n, fields,
						     recs, &taken);
		if (m || taken) {
			if (!m)
				arena_release(ar);
			return m;
		}
	}
	if (len < RPC__BUF_CACHE_MIN_BYTES) {
		/* Chunks of the arena's own (sized as mc_pb_unpack does). */
		size_t limit = room == SIZE_MAX ? 0 : room ? room : 1;
		return mc_pb_unpack(desc, len, data, limit, &ar->pb);
	}
	/* Room for the bytes and strings (at most len) and the structs,
	 * then chunks. */
	if (!arena_begin(ar, len + (64u << 10), room))
		return NULL;
	ProtobufCMessage *m = protobuf_c_message_unpack(desc, &ar->pb.pa, len, data);
	if (!m)
		arena_release(ar);
	return m;
}

ProtobufCMessage *rpc__unpack(const ProtobufCMessageDescriptor *desc, const uint8_t *data,
			      size_t len, struct rpc__bufcache *bc, struct rpc_deframer *df,
			      struct rpc__arena *ar)
{
	memset(ar, 0, sizeof(*ar));
	if (!rpc__nesting_ok(desc, data, len, RPC__MAX_NESTING)) {
		ar->too_deep = true;
		return NULL;
	}
	if (!bc)
		return protobuf_c_message_unpack(desc, NULL, len, data);
	ar->bc = bc;
	/* What it may take decoded: the rest of bc's bound. */
	ProtobufCMessage *m = unpack_arena(desc, data, len, df, ar, rpc__mem_left(bc));
	if (!m) {
		ar->too_big = ar->too_big || ar->pb.full;
		ar->bc = NULL;
		return NULL;
	}
	/* (a body the arena took counts here from now on) */
	ar->held = ar->pb.cap + ar->pb.taken + (ar->body ? ar->body->len : 0);
	rpc__mem_count(bc, ar->held, true);
	return m;
}

void rpc__unpacked_free(ProtobufCMessage *m, struct rpc__arena *ar)
{
	if (!m)
		return;
	if (!ar || !ar->bc) {
		protobuf_c_message_free_unpacked(m, NULL);
		return;
	}
	if (ar->pb.spilled) {
		mc_pbarena_fix(&ar->pb); /* (the arena may have been copied) */
		ar->pb.pa.free = arena_free;
		protobuf_c_message_free_unpacked(m, &ar->pb.pa);
	}
	arena_release(ar);
	ar->bc = NULL;
}

/* ---------------------------------------------------------------- messages */

/* The field of msg that rpc__omsg_pack may send from where it lies in
 * from, or NULL. */
static const ProtobufCFieldDescriptor *ref_field(const ProtobufCMessage *msg,
						 const struct rpc__rbody *from)
{
	const ProtobufCMessageDescriptor *d = msg->descriptor;
	for (unsigned i = 0; i < d->n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &d->fields[i];
		if (f->type != PROTOBUF_C_TYPE_BYTES || f->label != PROTOBUF_C_LABEL_NONE ||
		    (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF))
			continue;
		const ProtobufCBinaryData *bd =
			(const ProtobufCBinaryData *)((const uint8_t *)msg + f->offset);
		/* Compared as integers: the bytes may lie in any object. */
		uintptr_t at = (uintptr_t)bd->data, base = (uintptr_t)from->p;
		if (bd->len >= RPC__ALIAS_MIN_BYTES && at >= base && bd->len <= from->len &&
		    at - base <= from->len - bd->len)
			return f;
	}
	return NULL;
}

static struct rpc__omsg *omsg_new(struct rpc__bufcache *bc, size_t inline_len)
{
	size_t cap;
	struct rpc__omsg *m = rpc__buf_get(bc, sizeof(*m) + inline_len, &cap);
	if (!m)
		return NULL;
	memset(m, 0, sizeof(*m));
	m->refs = 1;
	m->len = inline_len;
	m->bc = bc;
	m->cap = cap;
	return m;
}

/* rpc__omsg_pack with field f sent from from: the rest of msg is packed
 * with f left empty, and f's tag and length go where protobuf-c would
 * have put the field (before the first field numbered above it), so the
 * bytes on the wire are those of a plain pack. */
static int omsg_pack_ref(const ProtobufCMessage *msg, const ProtobufCFieldDescriptor *f,
			 size_t max_bytes, size_t room, struct rpc__bufcache *bc,
			 struct rpc__rbody *from, struct rpc__omsg **out)
{
	const ProtobufCMessageDescriptor *d = msg->descriptor;
	uint8_t *copy = malloc(d->sizeof_message);
	if (!copy)
		return -ENOMEM;
	memcpy(copy, msg, d->sizeof_message);
	ProtobufCBinaryData *bd = (ProtobufCBinaryData *)(copy + f->offset);
	const uint8_t *field = bd->data;
	size_t flen = bd->len;
	bd->data = NULL;
	bd->len = 0;
	const ProtobufCMessage *rest_msg = (const ProtobufCMessage *)copy;

	uint8_t hdr[20];
	size_t hl = mc_pb_put_varint(hdr, (uint64_t)f->id << 3 | 2);
	hl += mc_pb_put_varint(hdr + hl, flen);
	size_t rest = protobuf_c_message_get_packed_size(rest_msg);
	size_t body = rest + hl + flen;
	if (body > max_bytes || body > UINT32_MAX) {
		free(copy);
		return MC_ETOO_LARGE;
	}
	if (5 + body > room) {
		free(copy);
		return -ENOBUFS;
	}
	struct rpc__omsg *m = omsg_new(bc, 5 + hl + rest);
	if (!m) {
		free(copy);
		return -ENOMEM;
	}
	/* Pack the rest hl bytes in, then move the fields before f down. */
	uint8_t *r = m->data + 5 + hl;
	if (rest)
		protobuf_c_message_pack(rest_msg, r);
	free(copy);
	size_t split = 0;
	struct mc_pbrec rc;
	while (split < rest) {
		size_t pos = split;
		if (!mc_pb_next(r, rest, &pos, &rc) || rc.num > f->id)
			break;
		split = pos;
	}
	memmove(m->data + 5, r, split);
	memcpy(m->data + 5 + split, hdr, hl);
	rpc_frame_prefix(m->data, (uint32_t)body);
	m->len = 5 + body;
	m->ext_body = from;
	from->refs++;
	m->ext = field;
	m->ext_at = 5 + split + hl;
	m->ext_len = flen;
	*out = m;
	return 0;
}

int rpc__omsg_pack(const ProtobufCMessage *msg, size_t max_bytes, size_t room,
		   struct rpc__bufcache *bc, struct rpc__rbody *from, struct rpc__omsg **out)
{
	const ProtobufCFieldDescriptor *f = from ? ref_field(msg, from) : NULL;
	if (f)
		return omsg_pack_ref(msg, f, max_bytes, room, bc, from, out);
	size_t body = protobuf_c_message_get_packed_size(msg);
	if (body > max_bytes || body > UINT32_MAX)
		return MC_ETOO_LARGE;
	if (5 + body > room)
		return -ENOBUFS;
	struct rpc__omsg *m = omsg_new(bc, 5 + body);
	if (!m)
		return -ENOMEM;
	rpc_frame_prefix(m->data, (uint32_t)body);
	if (body)
		protobuf_c_message_pack(msg, m->data + 5);
	*out = m;
	return 0;
}

const uint8_t *rpc__omsg_at(const struct rpc__omsg *m, size_t off, size_t *len)
{
	if (!m->ext || off < m->ext_at) {
		size_t end = m->ext && m->ext_at < m->len ? m->ext_at : m->len;
		*len = end - off;
		return m->data + off;
	}
	size_t ext_end = m->ext_at + m->ext_len;
	if (off < ext_end) {
		*len = (ext_end < m->len ? ext_end : m->len) - off;
		return m->ext + (off - m->ext_at);
	}
	*len = m->len - off;
	return m->data + off - m->ext_len;
}

int rpc__omsg_flat(struct rpc__omsg *m, struct rpc__omsg **out)
{
	if (!m->ext) {
		m->refs++;
		*out = m;
		return 0;
	}
	struct rpc__omsg *f = omsg_new(NULL, m->len);
	if (!f)
		return -ENOMEM;
	size_t n;
	for (size_t off = 0; off < m->len; off += n) {
		const uint8_t *p = rpc__omsg_at(m, off, &n);
		memcpy(f->data + off, p, n);
	}
	*out = f;
	return 0;
}

void rpc__omsg_unref(struct rpc__omsg *m)
{
	if (m && --m->refs == 0) {
		rpc__rbody_unref(m->ext_body);
		rpc__buf_put(m->bc, m, m->cap);
	}
}

/* ---------------------------------------------------------------- queue */

void rpc__outq_init(struct rpc__outq *q, const struct rpc__outq_ops *ops)
{
	memset(q, 0, sizeof(*q));
	q->ops = ops;
}

void rpc__outq_set_bytes(struct rpc__outq *q, size_t n)
{
	if (q->acct && n != q->bytes)
		rpc__mem_count(q->acct, n > q->bytes ? n - q->bytes : q->bytes - n,
			       n > q->bytes);
	if (q->conn_acct)
		*q->conn_acct = *q->conn_acct - q->bytes + n;
	q->bytes = n;
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
	rpc__outq_set_bytes(q, 0);
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
	rpc__outq_set_bytes(q, q->bytes + m->len);
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
	rpc__outq_set_bytes(q, q->reserved);
}

ssize_t rpc__outq_read_cb(nghttp2_session *ng, int32_t stream_id, uint8_t *buf, size_t length,
			  uint32_t *data_flags, nghttp2_data_source *source, void *user_data)
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

void rpc__dlheap_arm(struct rpc__dlheap *h, uv_timer_t *timer, uv_timer_cb cb)
{
	struct rpc__dl *top = rpc__dlheap_top(h);
	if (!top) {
		uv_timer_stop(timer);
		return;
	}
	if (uv_is_active((const uv_handle_t *)timer) && h->armed_ms <= top->at_ms)
		return;
	uint64_t now = uv_now(timer->loop);
	h->armed_ms = top->at_ms > now ? top->at_ms : now;
	uv_timer_start(timer, cb, h->armed_ms - now, 0);
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

bool rpc__content_type_ok(const uint8_t *value, size_t vlen)
{
	return vlen >= 16 && memcmp(value, "application/grpc", 16) == 0 &&
	       (vlen == 16 || value[16] == '+' || value[16] == ';');
}

void rpc__count_status(struct metric *calls[RPC__NCODES], struct metrics_registry *reg,
		       const char *name, const char *help, const char *server,
		       const char *method, int code)
{
	if (code < 0 || code >= RPC__NCODES)
		code = RPC_UNKNOWN;
	if (!calls[code])
		calls[code] = server ? metrics_counter(reg, name, help, "server,method,code",
						       (const char *[]){server, method,
									rpc_status_name(code)})
				     : metrics_counter(reg, name, help, "method,code",
						       (const char *[]){
							       method, rpc_status_name(code)});
	metric_inc(calls[code]);
}
