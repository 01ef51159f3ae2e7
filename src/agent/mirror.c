/*
 * mirror: the agent's copy of what the master's index says its segment
 * holds (the inventory, inv.c), kept whole so that a master failover
 * loses nothing complete (proto/master.proto, "The segment mirror").
 *
 * Following. After every mount the agent follows its segment's log from
 * the position the mount answered: SyncSegment acknowledges what was
 * applied and long-polls for what came after (wait: half the master-call
 * deadline). ADD puts an entry, DEL removes the entry at that offset.
 * After an answer with changes the next call waits PACE_MS: under a
 * steady put rate an answered call found the next changes at once, and
 * agent and master traded a call per few puts (4,500 a second under 4K
 * puts onto a same-host agent, each a wakeup of both on a busy host);
 * paced, a call carries PACE_MS of changes.
 * Answers of an earlier mount's loop are recognised by a generation
 * number and dropped.
 *
 * Listing. An answer saying the agent is behind (the master dropped
 * changes it had not acknowledged) starts a listing: ListSegment pages,
 * each item put like an ADD, while the log is followed on from the
 * answer's last_seq. Every change marks what it touches with the
 * listing's epoch; at the end, entries the epoch did not touch are
 * forgotten. This is exact because the master answers both calls in the
 * order it made them, on one connection: a page comes after every change
 * older than it and before every newer one.
 *
 * The follower (agent_follow) is the same for any segment: the SSD tier's
 * moves follow the SSD segment's log with it, through hooks of their own.
 *
 * Checking. Before a re-sync reports an entry, a copy thread checks the
 * bytes at its place against its checksum (agent__mirror_verify); entries
 * that fail (their space was reused for something this mirror never
 * heard of) or have no checksum are left out and forgotten.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "agent/agent_int.h"
#include "agent/mcall.h"
#include "agent/mirror.h"
#include "common/crc32c.h"
#include "common/log.h"
#include "common/pb.h"
#include "common/util.h"

#define LOG_SUBSYS LOGS_AGENT

#define RETRY_MIN_MS 100
#define RETRY_MAX_MS 2000
#define PACE_MS 5
#define SYNC_MAX_EVENTS 4096u
#define LIST_PAGE_ITEMS 4096u

struct mblock {
	struct agent_follow *f;
	unsigned gen;
	union {
		Mooncake__Master__SyncSegmentRequest sync;
		Mooncake__Master__ListSegmentRequest list;
	} req;
};

static void sync_send(struct agent_follow *f);
static void list_send(struct agent_follow *f);

static void on_retry(uv_timer_t *t)
{
	struct agent_follow *f = t->data;
	if (f->a->stopping || !f->on)
		return;
	sync_send(f);
	if (f->listing)
		list_send(f);
}

static void retry_later(struct agent_follow *f)
{
	if (f->a->stopping || uv_is_active((uv_handle_t *)&f->timer))
		return;
	f->retry_ms = f->retry_ms ? MC_MIN(f->retry_ms * 2, RETRY_MAX_MS) : RETRY_MIN_MS;
	uv_timer_start(&f->timer, on_retry, f->retry_ms, 0);
}

static struct mblock *mblock(struct agent_follow *f)
{
	struct mblock *b = calloc(1, sizeof(*b));
	if (b) {
		b->f = f;
		b->gen = f->gen;
	}
	return b;
}

/* ------------------------------------------------------------ listing */

static void list_begin(struct agent_follow *f)
{
	f->listing = true;
	f->list_cursor = 0;
	f->h->list_start(f->a);
	agent__count(&f->a->stats, AGENT_C_MIRROR_LISTINGS, 1);
	log_warn("segment mirror: behind the master's log of segment %s; listing "
		 "the whole segment",
		 f->segment);
	list_send(f);
}

static void on_listed(void *ud, int err, const char *message, const ProtobufCMessage *m)
{
	struct mblock *b = ud;
	struct agent_follow *f = b->f;
	unsigned gen = b->gen;
	uint64_t cursor = b->req.list.cursor;
	free(b);
	if (gen != f->gen || f->a->stopping)
		return;
	f->listing_busy = false;
	if (!f->listing)
		return;
	if (err) {
		log_warn("segment mirror: listing segment %s: %s; retrying", f->segment,
			 message ? message : mc_strerror(err));
		retry_later(f);
		return;
	}
	if (cursor != f->list_cursor) {
		list_send(f); /* restarted meanwhile: from its first page */
		return;
	}
	const Mooncake__Master__ListSegmentResponse *r = (const void *)m;
	for (size_t i = 0; i < r->n_items; i++)
		f->h->apply(f->a, r->items[i], true);
	if (!r->done) {
		f->list_cursor = r->next_cursor;
		list_send(f);
		return;
	}
	f->listing = false;
	size_t gone = f->h->list_end(f->a);
	log_info("segment mirror: segment %s listed: %zu forgotten", f->segment, gone);
}

static void list_send(struct agent_follow *f)
{
	if (f->listing_busy || !f->listing || f->a->stopping)
		return;
	struct mblock *b = mblock(f);
	if (!b) {
		retry_later(f);
		return;
	}
	mooncake__master__list_segment_request__init(&b->req.list);
	b->req.list.agent_id = f->a->name;
	b->req.list.segment = (char *)f->segment;
	b->req.list.cursor = f->list_cursor;
	b->req.list.limit = LIST_PAGE_ITEMS;
	f->listing_busy = true;
	agent__mcall(f->a, "ListSegment", &b->req.list.base,
		     &mooncake__master__list_segment_response__descriptor, on_listed, b);
}

/* ------------------------------------------------------------ following */

int agent__mirror_event_decode(const uint8_t *p, size_t len, Mooncake__Master__MirrorEvent *e,
			       char *name, size_t name_cap)
{
	/* The wire type of each field (field numbers from 1). */
	static const uint8_t wt_of[] = {8, 0, 0, 2, 0, 0, 5, 0, 0, 2, 0, 0};
	mooncake__master__mirror_event__init(e);
	size_t pos = 0;
	struct mc_pbrec r;
	int rc;
	while (mc_pb_field(p, len, &pos, wt_of, 11, &r, &rc)) {
		switch (r.num) {
		case 1:
			e->op = (Mooncake__Master__MirrorEvent__Op)(int32_t)(uint32_t)r.v;
			break;
		case 2:
			e->seq = r.v;
			break;
		case 3:
			e->key.data = r.v ? (uint8_t *)p + r.data : NULL;
			e->key.len = (size_t)r.v;
			break;
		case 4:
			e->offset = r.v;
			break;
		case 5:
			e->size = r.v;
			break;
		case 6:
			e->crc32c = (uint32_t)r.v;
			break;
		case 7:
			e->checksummed = mc_pb_bool(p, &r);
			break;
		case 8:
			e->soft_pin = mc_pb_bool(p, &r);
			break;
		case 9:
			if (r.v >= name_cap)
				return 1;
			memcpy(name, p + r.data, (size_t)r.v);
			name[r.v] = '\0';
			e->source_segment = name;
			break;
		case 10:
			e->source_offset = r.v;
			break;
		case 11:
			e->source_address = r.v;
			break;
		}
	}
	return rc;
}

/* Apply the events of a SyncSegment answer after f->seq. Returns how
 * many, or -EBADMSG at one that does not decode (those before it are
 * applied). */
static int64_t apply_events(struct agent_follow *f,
			    const Mooncake__Master__SyncSegmentResponseRaw *r)
{
	unsigned gen = f->gen;
	int64_t n = 0;
	char name[256];
	for (size_t i = 0; i < r->n_events; i++) {
		Mooncake__Master__MirrorEvent ev, *e = &ev, *slow = NULL;
		int rc = agent__mirror_event_decode(r->events[i].data, r->events[i].len, &ev,
						    name, sizeof(name));
		if (rc == 1)
			e = slow = mooncake__master__mirror_event__unpack(
				NULL, r->events[i].len, r->events[i].data);
		if (rc < 0 || !e)
			return -EBADMSG;
		if (e->seq > f->seq) {
			f->h->apply(f->a, e, false);
			f->seq = e->seq;
			n++;
		}
		if (slow)
			mooncake__master__mirror_event__free_unpacked(slow, NULL);
		if (gen != f->gen)
			break; /* (the hook stopped or restarted the follower) */
	}
	return n;
}

static void on_synced(void *ud, int err, const char *message, const ProtobufCMessage *m)
{
	struct mblock *b = ud;
	struct agent_follow *f = b->f;
	unsigned gen = b->gen;
	free(b);
	if (gen != f->gen || f->a->stopping)
		return;
	f->busy = false;
	if (err) {
		if (err != MC_ESHUTDOWN)
			log_warn("segment mirror: following segment %s: %s; retrying",
				 f->segment, message ? message : mc_strerror(err));
		retry_later(f);
		return;
	}
	const Mooncake__Master__SyncSegmentResponseRaw *r = (const void *)m;
	int64_t got = apply_events(f, r);
	if (gen != f->gen)
		return; /* (the hook stopped or restarted the follower) */
	if (got < 0) {
		log_warn("segment mirror: following segment %s: the master sent an event that "
			 "does not decode; retrying after the last one applied",
			 f->segment);
		retry_later(f);
		return;
	}
	f->retry_ms = 0;
	uint64_t n = (uint64_t)got;
	agent__count(&f->a->stats, AGENT_C_MIRROR_EVENTS, n);
	if (r->behind) {
		f->seq = r->last_seq;
		list_begin(f); /* (again, if one was running: it missed changes) */
	}
	f->h->applied(f->a, n);
	if (n && !uv_is_active((uv_handle_t *)&f->timer))
		uv_timer_start(&f->timer, on_retry, PACE_MS, 0);
	else
		sync_send(f);
}

static void sync_send(struct agent_follow *f)
{
	if (f->busy || !f->on || f->a->stopping)
		return;
	struct mblock *b = mblock(f);
	if (!b) {
		retry_later(f);
		return;
	}
	mooncake__master__sync_segment_request__init(&b->req.sync);
	b->req.sync.agent_id = f->a->name;
	b->req.sync.segment = (char *)f->segment;
	b->req.sync.after_seq = f->seq;
	b->req.sync.max_events = SYNC_MAX_EVENTS;
	/* Well inside the call's deadline. */
	b->req.sync.wait_ms = agent__mcall_timeout_ms(f->a) / 2;
	f->busy = true;
	agent__mcall(f->a, "SyncSegment", &b->req.sync.base,
		     &mooncake__master__sync_segment_response_raw__descriptor, on_synced, b);
}

void agent__follow_init(struct agent *a, struct agent_follow *f, const char *segment,
			const struct agent_follow_hooks *h)
{
	f->a = a;
	f->segment = segment;
	f->h = h;
	uv_timer_init(a->loop, &f->timer);
	f->timer.data = f;
}

void agent__follow_start(struct agent_follow *f, uint64_t seq)
{
	agent__follow_stop(f);
	f->on = true;
	f->seq = seq;
	sync_send(f);
}

void agent__follow_stop(struct agent_follow *f)
{
	/* Calls in flight end later; their generation is then stale. */
	f->gen++;
	f->on = false;
	f->busy = false;
	f->listing = false;
	f->listing_busy = false;
	f->retry_ms = 0;
	if (!uv_is_closing((uv_handle_t *)&f->timer))
		uv_timer_stop(&f->timer);
}

unsigned agent__follow_close(struct agent_follow *f, uv_close_cb on_closed)
{
	agent__follow_stop(f);
	f->timer.data = f->a;
	uv_close((uv_handle_t *)&f->timer, on_closed);
	return 1;
}

uint64_t agent__follow_seq(const struct agent_follow *f)
{
	return f->seq;
}

/* ------------------------------------------------------------ the mirror */

static void mirror_apply(struct agent *a, const Mooncake__Master__MirrorEvent *e, bool listed)
{
	(void)listed;
	if (e->op == MOONCAKE__MASTER__MIRROR_EVENT__OP__DEL) {
		agent__inv_del_at(&a->inv, e->key.data, e->key.len, e->offset);
		return;
	}
	if (e->op != MOONCAKE__MASTER__MIRROR_EVENT__OP__ADD)
		return; /* (orders are for SSD segments) */
	struct agent_inv_rec rec = {
		.offset = e->offset,
		.size = e->size,
		.crc = e->crc32c,
		.has_crc = e->checksummed,
		.soft_pin = e->soft_pin,
	};
	if (agent__inv_add(&a->inv, e->key.data, e->key.len, &rec) != 0 &&
	    !a->mirror.oom_told) {
		a->mirror.oom_told = true;
		log_error("segment mirror: out of memory; some objects will not be "
			  "re-reported after a master failover");
	}
}

static void mirror_list_start(struct agent *a)
{
	agent__inv_listing_start(&a->inv);
}

static size_t mirror_list_end(struct agent *a)
{
	size_t gone = agent__inv_listing_end(&a->inv);
	agent__gauge(&a->stats, AGENT_G_INVENTORY, (int64_t)agent__inv_count(&a->inv));
	return gone;
}

static void mirror_applied(struct agent *a, uint64_t n)
{
	if (n)
		agent__gauge(&a->stats, AGENT_G_INVENTORY, (int64_t)agent__inv_count(&a->inv));
}

static const struct agent_follow_hooks mirror_hooks = {
	.apply = mirror_apply,
	.list_start = mirror_list_start,
	.list_end = mirror_list_end,
	.applied = mirror_applied,
};

void agent__mirror_start(struct agent *a, uint64_t seq)
{
	agent__follow_start(&a->mirror.f, seq);
}

void agent__mirror_stop(struct agent *a)
{
	agent__follow_stop(&a->mirror.f);
}

void agent__mirror_init(struct agent *a)
{
	agent__follow_init(a, &a->mirror.f, a->name, &mirror_hooks);
}

unsigned agent__mirror_close(struct agent *a, uv_close_cb on_closed)
{
	return agent__follow_close(&a->mirror.f, on_closed);
}

uint64_t agent__mirror_seq(const struct agent *a)
{
	return agent__follow_seq(&a->mirror.f);
}

/* ------------------------------------------------------------ checking */

void agent__mirror_verify(struct agent *a, struct agent_inv_entry *const *items, size_t n,
			  uint8_t *verdict)
{
	const uint8_t *base = a->seg->addr;
	size_t len = a->seg->len;
	for (size_t i = 0; i < n; i++) {
		const struct agent_inv_rec *r = &items[i]->rec;
		if (!r->has_crc) {
			verdict[i] = AGENT_VERIFY_UNCHECKED;
			continue;
		}
		if (r->offset > len || r->size > len - r->offset) {
			verdict[i] = AGENT_VERIFY_BAD;
			continue;
		}
		verdict[i] = crc32c(0, base + r->offset, r->size) == r->crc ? AGENT_VERIFY_OK
									    : AGENT_VERIFY_BAD;
	}
}
