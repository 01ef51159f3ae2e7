/*
 * sync: SyncSegment and ListSegment, the calls an agent keeps its segment
 * mirror with (proto/master.proto, "The segment mirror").
 *
 * SyncSegment is a long poll. A call that finds changes after its
 * position (or finds its owner behind) is answered at once; otherwise it
 * is parked until its segment's log grows or its wait ends. Parked calls
 * are woken in batches: a uv_check handle notices, after each loop
 * iteration, that the core handed out new sequence numbers and arms a
 * short timer (SYNC_COALESCE_MS); when it fires, every parked call whose
 * log has something new is answered. So an agent under a high put rate
 * gets one answer per coalescing window carrying all its changes, never
 * one per object. Waits end on the master's tick (100 ms granularity).
 *
 * A parked call remembers its segment by slot and log id (a segment
 * unmounted and another mounted in the slot has another id): a call whose
 * segment went away is answered SEGMENT_NOT_FOUND. A master that stops
 * leading answers every parked call with NOT_LEADER.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/pb.h"
#include "common/util.h"
#include "master.pb-c.h"
#include "master/master.h"
#include "master/master_int.h"
#include "rpc/rpc.h"

#define LOG_SUBSYS LOGS_MASTER

#define SYNC_COALESCE_MS 5
#define SYNC_DEFAULT_EVENTS 4096u
#define SYNC_MAX_EVENTS 65536u
#define SYNC_MAX_KEY_BYTES (1u << 20) /* per answer, beyond its first event */
#define LIST_DEFAULT_ITEMS 4096u
#define LIST_MAX_ITEMS 65536u
#define LIST_MAX_KEY_BYTES (1u << 20)

struct master_syncw {
	struct master_syncw *prev, *next;
	struct rpc_call *call;
	uint32_t seg;
	uint64_t log_id;
	uint64_t after;
	uint32_t max_events;
	uint64_t until_ms;
};

/* ------------------------------------------------------------ helpers */

static void finish_code(struct rpc_call *call, int err, const char *detail)
{
	char msg[256];
	snprintf(msg, sizeof(msg), "%d %s%s%s", err, mc_strerror(err), detail ? ": " : "",
		 detail ? detail : "");
	rpc_call_finish(call, master__rpc_status(err), msg);
}

/* The segment named by an owner's request, or an error. */
static int owned_segment(struct master *m, const char *agent, const char *name, uint32_t *id,
			 const struct master_seg **seg)
{
	*id = master__seg_find(m->core, name ? name : "");
	if (*id == MASTER_NO_SEGMENT)
		return MC_ESEGMENT_NOT_FOUND;
	*seg = master__seg(m->core, *id);
	if (!agent || strcmp((*seg)->agent->id, agent) != 0)
		return -EACCES;
	return 0;
}

/* An event of a log; a FETCH order names the DRAM replica its owner
 * reads the object from (none when the demotion is over). */
static void fill_event(const struct master *m, Mooncake__Master__MirrorEvent *e,
		       const struct master_ev *ev)
{
	mooncake__master__mirror_event__init(e);
	e->op = ev->op == MASTER_EV_DEL     ? MOONCAKE__MASTER__MIRROR_EVENT__OP__DEL
		: ev->op == MASTER_EV_FETCH ? MOONCAKE__MASTER__MIRROR_EVENT__OP__FETCH
					    : MOONCAKE__MASTER__MIRROR_EVENT__OP__ADD;
	e->seq = ev->seq;
	e->key.data = (uint8_t *)ev->key;
	e->key.len = ev->klen;
	e->offset = ev->offset;
	if (ev->op != MASTER_EV_DEL) {
		e->size = ev->size;
		e->crc32c = ev->crc;
		e->checksummed = (ev->flags & MASTER_EV_F_CRC) != 0;
		e->soft_pin = (ev->flags & MASTER_EV_F_SOFT_PIN) != 0;
	}
	uint32_t seg;
	uint64_t off;
	if (ev->op == MASTER_EV_FETCH && m &&
	    master__demote_source(m->core, ev->key, ev->klen, &seg, &off)) {
		const struct master_seg *s = master__seg(m->core, seg);
		e->source_segment = s->name;
		e->source_offset = off;
		e->source_address = s->base + off;
	}
}

size_t master__encode_event(uint8_t *out, const Mooncake__Master__MirrorEvent *e)
{
	/* proto3: fields at their default are left out, the rest in field
	 * order; an enum is its int32 (negative: 10 bytes), a bool 1. */
	size_t n = mc_pb_put_uint(out, 1, (uint64_t)(int64_t)(int32_t)e->op);
	n += mc_pb_put_uint(out + n, 2, e->seq);
	if (e->key.len)
		n += mc_pb_put_bytes(out + n, 3, e->key.data, e->key.len);
	n += mc_pb_put_uint(out + n, 4, e->offset);
	n += mc_pb_put_uint(out + n, 5, e->size);
	n += mc_pb_put_fixed32(out + n, 6, e->crc32c);
	n += mc_pb_put_uint(out + n, 7, e->checksummed != 0);
	n += mc_pb_put_uint(out + n, 8, e->soft_pin != 0);
	if (e->source_segment && e->source_segment[0])
		n += mc_pb_put_bytes(out + n, 9, e->source_segment, strlen(e->source_segment));
	n += mc_pb_put_uint(out + n, 10, e->source_offset);
	n += mc_pb_put_uint(out + n, 11, e->source_address);
	return n;
}

struct collect {
	const struct master *m;
	Mooncake__Master__MirrorEvent *ev;
	size_t n;
};

static void collect_ev(void *ud, const struct master_ev *ev)
{
	struct collect *x = ud;
	fill_event(x->m, &x->ev[x->n++], ev);
}

/* Answer a sync call from the log of segment id. */
static void answer(struct master *m, struct rpc_call *call, uint32_t id, uint64_t after,
		   uint32_t max_events)
{
	const struct master_seg *s = master__seg(m->core, id);
	size_t max = max_events ? MC_MIN(max_events, SYNC_MAX_EVENTS) : SYNC_DEFAULT_EVENTS;
	struct master_mlog_stats ls;
	master__mlog_stats(s->log, &ls);
	size_t cap = (size_t)MC_MIN((uint64_t)max, ls.records);
	struct collect x = {
		.m = m,
		.ev = malloc((cap ? cap : 1) * sizeof(*x.ev)),
	};
	ProtobufCBinaryData *bin = NULL;
	uint8_t *enc = NULL;
	if (!x.ev) {
		finish_code(call, -ENOMEM, NULL);
		goto out;
	}
	size_t nread;
	int rc = master__mlog_read(s->log, after, cap, SYNC_MAX_KEY_BYTES, collect_ev, &x,
				   &nread);
	/* Sent as SyncSegmentResponseRaw (the same encoding), each event
	 * encoded here: protobuf-c's sizing and packing of the events took
	 * some 2,000 instructions a put. */
	Mooncake__Master__SyncSegmentResponseRaw resp =
		MOONCAKE__MASTER__SYNC_SEGMENT_RESPONSE_RAW__INIT;
	resp.behind = rc == MC_ECOMPACTED;
	resp.last_seq = ls.last;
	size_t room = 0;
	for (size_t i = 0; i < x.n; i++)
		room += MASTER_EVENT_MAX_BYTES + x.ev[i].key.len +
			(x.ev[i].source_segment ? strlen(x.ev[i].source_segment) : 0);
	bin = malloc((x.n ? x.n : 1) * sizeof(*bin));
	enc = malloc(room ? room : 1);
	if (!bin || !enc) {
		finish_code(call, -ENOMEM, NULL);
		goto out;
	}
	for (size_t i = 0, at = 0; i < x.n; i++) {
		bin[i].data = enc + at;
		bin[i].len = master__encode_event(enc + at, &x.ev[i]);
		at += bin[i].len;
	}
	resp.events = bin;
	resp.n_events = x.n;
	rc = rpc_call_send(call, &resp.base);
	if (rc == 0)
		rpc_call_finish(call, RPC_OK, NULL);
	else if (rc != -ECANCELED)
		finish_code(call, rc, NULL);
	else
		rpc_call_finish(call, RPC_CANCELLED, NULL);
out:
	free(bin);
	free(enc);
	free(x.ev);
}

/* ------------------------------------------------------------ waiters */

static void unlink_waiter(struct master *m, struct master_syncw *w)
{
	if (w->prev)
		w->prev->next = w->next;
	else
		m->syncw = w->next;
	if (w->next)
		w->next->prev = w->prev;
	m->nsyncw--;
}

/* Answer (or end) a parked call and forget it. */
static void wake(struct master *m, struct master_syncw *w)
{
	unlink_waiter(m, w);
	rpc_call_set_data(w->call, NULL);
	const struct master_seg *s = master__seg(m->core, w->seg);
	if (!s || s->log_id != w->log_id)
		finish_code(w->call, MC_ESEGMENT_NOT_FOUND, "the segment was unmounted");
	else
		answer(m, w->call, w->seg, w->after, w->max_events);
	free(w);
}

static void on_coalesced(uv_timer_t *t)
{
	struct master *m = t->data;
	m->sync_seen = master__ev_seq(m->core);
	for (struct master_syncw *w = m->syncw, *next; w; w = next) {
		next = w->next;
		const struct master_seg *s = master__seg(m->core, w->seg);
		if (!s || s->log_id != w->log_id || master__mlog_has_after(s->log, w->after))
			wake(m, w);
	}
}

static void on_check(uv_check_t *h)
{
	struct master *m = h->data;
	if (!m->syncw || master__ev_seq(m->core) == m->sync_seen ||
	    uv_is_active((uv_handle_t *)&m->sync_timer))
		return;
	uv_timer_start(&m->sync_timer, on_coalesced, SYNC_COALESCE_MS, 0);
}

void master__sync_tick(struct master *m, uint64_t now_ms)
{
	for (struct master_syncw *w = m->syncw, *next; w; w = next) {
		next = w->next;
		if (w->until_ms <= now_ms)
			wake(m, w);
	}
}

void master__sync_drop_all(struct master *m)
{
	while (m->syncw) {
		struct master_syncw *w = m->syncw;
		unlink_waiter(m, w);
		rpc_call_set_data(w->call, NULL);
		master__finish_not_leader(m, w->call);
		free(w);
	}
}

void master__sync_free(struct master *m)
{
	while (m->syncw) {
		struct master_syncw *w = m->syncw;
		m->syncw = w->next;
		free(w);
	}
	m->nsyncw = 0;
}

void master__sync_init(struct master *m)
{
	uv_check_init(m->loop, &m->sync_check);
	uv_timer_init(m->loop, &m->sync_timer);
	m->sync_check.data = m->sync_timer.data = m;
	uv_check_start(&m->sync_check, on_check);
}

void master__sync_close(struct master *m, uv_close_cb cb)
{
	master__sync_drop_all(m);
	uv_close((uv_handle_t *)&m->sync_check, cb);
	uv_close((uv_handle_t *)&m->sync_timer, cb);
}

/* ------------------------------------------------------------ handlers */

void master__on_sync_cancel(struct rpc_call *call)
{
	struct master_syncw *w = rpc_call_data(call);
	struct master *m = rpc_call_service_data(call);
	if (!w)
		return;
	unlink_waiter(m, w);
	rpc_call_set_data(call, NULL);
	rpc_call_finish(call, RPC_CANCELLED, NULL);
	free(w);
}

void master__on_sync(struct rpc_call *call, const ProtobufCMessage *msg)
{
	struct master *m = master__leader_of(call);
	const Mooncake__Master__SyncSegmentRequest *req = (const void *)msg;
	if (!m)
		return;
	uint32_t id;
	const struct master_seg *s;
	int rc = owned_segment(m, req->agent_id, req->segment, &id, &s);
	if (rc) {
		finish_code(call, rc, req->segment);
		return;
	}
	master__mlog_ack(s->log, req->after_seq);
	uint64_t now = uv_now(m->loop);
	if (req->wait_ms == 0 || master__mlog_has_after(s->log, req->after_seq)) {
		answer(m, call, id, req->after_seq, req->max_events);
		return;
	}
	/* Park it. An older call of the same segment is obsolete: answer it. */
	for (struct master_syncw *o = m->syncw, *next; o; o = next) {
		next = o->next;
		if (o->seg == id && o->log_id == s->log_id)
			wake(m, o);
	}
	struct master_syncw *w = calloc(1, sizeof(*w));
	if (!w) {
		answer(m, call, id, req->after_seq, req->max_events);
		return;
	}
	uint64_t until = now + req->wait_ms;
	uint64_t deadline = rpc_call_deadline_ms(call);
	if (deadline && deadline < until)
		until = deadline;
	*w = (struct master_syncw){.call = call,
				   .seg = id,
				   .log_id = s->log_id,
				   .after = req->after_seq,
				   .max_events = req->max_events,
				   .until_ms = until};
	w->next = m->syncw;
	if (m->syncw)
		m->syncw->prev = w;
	m->syncw = w;
	m->nsyncw++;
	rpc_call_set_data(call, w);
}

struct list_page {
	Mooncake__Master__MirrorEvent *items;
	Mooncake__Master__MirrorEvent **ptrs;
	size_t n, cap;
	size_t key_bytes;
	bool nomem;
};

static bool list_item(void *ud, const struct master_obj *o, unsigned i)
{
	struct list_page *p = ud;
	if (p->n == p->cap) {
		size_t cap = p->cap ? p->cap * 2 : 256;
		Mooncake__Master__MirrorEvent *v = realloc(p->items, cap * sizeof(*v));
		if (!v) {
			p->nomem = true;
			return false;
		}
		p->items = v;
		p->cap = cap;
	}
	struct master_ev ev = {
		.op = MASTER_EV_ADD,
		.offset = o->rep[i].offset,
		.size = o->size,
		.crc = o->crc,
		.klen = o->klen,
		.flags = (uint8_t)(((o->flags & MASTER_OBJ_CRC) ? MASTER_EV_F_CRC : 0) |
				   ((o->flags & MASTER_OBJ_SOFT_PIN) ? MASTER_EV_F_SOFT_PIN
								     : 0)),
		.key = master__obj_key(o),
	};
	fill_event(NULL, &p->items[p->n++], &ev);
	p->key_bytes += o->klen;
	return p->key_bytes < LIST_MAX_KEY_BYTES;
}

void master__on_list_segment(struct rpc_call *call, const ProtobufCMessage *msg)
{
	struct master *m = master__leader_of(call);
	const Mooncake__Master__ListSegmentRequest *req = (const void *)msg;
	if (!m)
		return;
	uint32_t id;
	const struct master_seg *s;
	int rc = owned_segment(m, req->agent_id, req->segment, &id, &s);
	if (rc) {
		finish_code(call, rc, req->segment);
		return;
	}
	size_t limit = req->limit ? MC_MIN(req->limit, LIST_MAX_ITEMS) : LIST_DEFAULT_ITEMS;
	struct list_page p = {0};
	uint64_t cursor = req->cursor;
	bool done = master__list_segment(m->core, id, &cursor, limit, list_item, &p);
	if (p.nomem || !(p.ptrs = malloc((p.n ? p.n : 1) * sizeof(*p.ptrs)))) {
		finish_code(call, -ENOMEM, NULL);
		goto out;
	}
	for (size_t i = 0; i < p.n; i++)
		p.ptrs[i] = &p.items[i];
	Mooncake__Master__ListSegmentResponse resp =
		MOONCAKE__MASTER__LIST_SEGMENT_RESPONSE__INIT;
	resp.items = p.ptrs;
	resp.n_items = p.n;
	resp.next_cursor = cursor;
	resp.done = done;
	master__reply(call, &resp.base);
out:
	free(p.items);
	free(p.ptrs);
}
