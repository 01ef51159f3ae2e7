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
#include "common/util.h"

#define LOG_SUBSYS LOGS_AGENT

#define RETRY_MIN_MS 100
#define RETRY_MAX_MS 2000
#define PACE_MS 5
#define SYNC_MAX_EVENTS 4096u
#define LIST_PAGE_ITEMS 4096u

struct mblock {
	struct agent *a;
	unsigned gen;
	union {
		Mooncake__Master__SyncSegmentRequest sync;
		Mooncake__Master__ListSegmentRequest list;
	} req;
};

static void sync_send(struct agent *a);
static void list_send(struct agent *a);

static void on_retry(uv_timer_t *t)
{
	struct agent *a = t->data;
	if (a->stopping || !a->mirror.on)
		return;
	sync_send(a);
	if (a->mirror.listing)
		list_send(a);
}

static void retry_later(struct agent *a)
{
	if (a->stopping || uv_is_active((uv_handle_t *)&a->mirror.timer))
		return;
	a->mirror.retry_ms = a->mirror.retry_ms ? MC_MIN(a->mirror.retry_ms * 2, RETRY_MAX_MS)
						: RETRY_MIN_MS;
	uv_timer_start(&a->mirror.timer, on_retry, a->mirror.retry_ms, 0);
}

static struct mblock *mblock(struct agent *a)
{
	struct mblock *b = calloc(1, sizeof(*b));
	if (b) {
		b->a = a;
		b->gen = a->mirror.gen;
	}
	return b;
}

/* ------------------------------------------------------------ changes */

static void apply(struct agent *a, const Mooncake__Master__MirrorEvent *e)
{
	if (e->op == MOONCAKE__MASTER__MIRROR_EVENT__OP__DEL) {
		agent__inv_del_at(&a->inv, e->key.data, e->key.len, e->offset);
		return;
	}
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

/* ------------------------------------------------------------ listing */

static void list_begin(struct agent *a)
{
	a->mirror.listing = true;
	a->mirror.list_cursor = 0;
	agent__inv_listing_start(&a->inv);
	agent__count(&a->stats, AGENT_C_MIRROR_LISTINGS, 1);
	log_warn("segment mirror: behind the master's log of segment %s; listing "
		 "the whole segment",
		 a->name);
	list_send(a);
}

static void on_listed(void *ud, int err, const char *message, const ProtobufCMessage *m)
{
	struct mblock *b = ud;
	struct agent *a = b->a;
	unsigned gen = b->gen;
	uint64_t cursor = b->req.list.cursor;
	free(b);
	if (gen != a->mirror.gen || a->stopping)
		return;
	a->mirror.listing_busy = false;
	if (!a->mirror.listing)
		return;
	if (err) {
		log_warn("segment mirror: listing segment %s: %s; retrying", a->name,
			 message ? message : mc_strerror(err));
		retry_later(a);
		return;
	}
	if (cursor != a->mirror.list_cursor) {
		list_send(a); /* restarted meanwhile: from its first page */
		return;
	}
	const Mooncake__Master__ListSegmentResponse *r = (const void *)m;
	for (size_t i = 0; i < r->n_items; i++)
		apply(a, r->items[i]);
	if (!r->done) {
		a->mirror.list_cursor = r->next_cursor;
		list_send(a);
		return;
	}
	a->mirror.listing = false;
	size_t gone = agent__inv_listing_end(&a->inv);
	agent__gauge(&a->stats, AGENT_G_INVENTORY, (int64_t)agent__inv_count(&a->inv));
	log_info("segment mirror: segment %s listed: %zu objects, %zu forgotten", a->name,
		 agent__inv_count(&a->inv), gone);
}

static void list_send(struct agent *a)
{
	if (a->mirror.listing_busy || !a->mirror.listing || a->stopping)
		return;
	struct mblock *b = mblock(a);
	if (!b) {
		retry_later(a);
		return;
	}
	mooncake__master__list_segment_request__init(&b->req.list);
	b->req.list.agent_id = a->name;
	b->req.list.segment = a->name;
	b->req.list.cursor = a->mirror.list_cursor;
	b->req.list.limit = LIST_PAGE_ITEMS;
	a->mirror.listing_busy = true;
	agent__mcall(a, "ListSegment", &b->req.list.base,
		     &mooncake__master__list_segment_response__descriptor, on_listed, b);
}

/* ------------------------------------------------------------ following */

static void on_synced(void *ud, int err, const char *message, const ProtobufCMessage *m)
{
	struct mblock *b = ud;
	struct agent *a = b->a;
	unsigned gen = b->gen;
	free(b);
	if (gen != a->mirror.gen || a->stopping)
		return;
	a->mirror.busy = false;
	if (err) {
		if (err != MC_ESHUTDOWN)
			log_warn("segment mirror: following segment %s: %s; retrying", a->name,
				 message ? message : mc_strerror(err));
		retry_later(a);
		return;
	}
	a->mirror.retry_ms = 0;
	const Mooncake__Master__SyncSegmentResponse *r = (const void *)m;
	uint64_t n = 0;
	for (size_t i = 0; i < r->n_events; i++) {
		const Mooncake__Master__MirrorEvent *e = r->events[i];
		if (e->seq <= a->mirror.seq)
			continue;
		apply(a, e);
		a->mirror.seq = e->seq;
		n++;
	}
	agent__count(&a->stats, AGENT_C_MIRROR_EVENTS, n);
	if (r->behind) {
		a->mirror.seq = r->last_seq;
		list_begin(a); /* (again, if one was running: it missed changes) */
	}
	if (n)
		agent__gauge(&a->stats, AGENT_G_INVENTORY, (int64_t)agent__inv_count(&a->inv));
	if (n && !uv_is_active((uv_handle_t *)&a->mirror.timer))
		uv_timer_start(&a->mirror.timer, on_retry, PACE_MS, 0);
	else
		sync_send(a);
}

static void sync_send(struct agent *a)
{
	if (a->mirror.busy || !a->mirror.on || a->stopping)
		return;
	struct mblock *b = mblock(a);
	if (!b) {
		retry_later(a);
		return;
	}
	mooncake__master__sync_segment_request__init(&b->req.sync);
	b->req.sync.agent_id = a->name;
	b->req.sync.segment = a->name;
	b->req.sync.after_seq = a->mirror.seq;
	b->req.sync.max_events = SYNC_MAX_EVENTS;
	/* Well inside the call's deadline. */
	b->req.sync.wait_ms = agent__mcall_timeout_ms(a) / 2;
	a->mirror.busy = true;
	agent__mcall(a, "SyncSegment", &b->req.sync.base,
		     &mooncake__master__sync_segment_response__descriptor, on_synced, b);
}

void agent__mirror_start(struct agent *a, uint64_t seq)
{
	agent__mirror_stop(a);
	a->mirror.on = true;
	a->mirror.seq = seq;
	sync_send(a);
}

void agent__mirror_stop(struct agent *a)
{
	/* Calls in flight end later; their generation is then stale. */
	a->mirror.gen++;
	a->mirror.on = false;
	a->mirror.busy = false;
	a->mirror.listing = false;
	a->mirror.listing_busy = false;
	a->mirror.retry_ms = 0;
	if (!uv_is_closing((uv_handle_t *)&a->mirror.timer))
		uv_timer_stop(&a->mirror.timer);
}

void agent__mirror_init(struct agent *a)
{
	uv_timer_init(a->loop, &a->mirror.timer);
	a->mirror.timer.data = a;
}

unsigned agent__mirror_close(struct agent *a, uv_close_cb on_closed)
{
	agent__mirror_stop(a);
	uv_close((uv_handle_t *)&a->mirror.timer, on_closed);
	return 1;
}

uint64_t agent__mirror_seq(const struct agent *a)
{
	return a->mirror.seq;
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
