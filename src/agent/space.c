/*
 * space: the agent's put lease — space in its own segment the master
 * delegated to it (LeaseSpace), so that a put whose only replica is that
 * segment is written at once and sealed with one master call
 * (BatchCommit) instead of PutStart + PutEnd (proto/master.proto, "Put
 * leases").
 *
 * The lease is up to AGENT_LEASE_EXTENTS extents; a take cuts the next
 * bytes off the first extent with room (bump allocation: commits free
 * nothing here — a removed object's space goes back to the master's
 * allocator). The target is --put-lease-size, or an eighth of the
 * segment when that is less (the most the master leases); values above
 * a quarter of it take PutStart (these fractions are named in space.h,
 * AGENT_LEASE_*_DIV). When less than half the target is left
 * (and fewer than AGENT_LEASE_EXTENTS extents are held), one LeaseSpace
 * call asks for the rest; when the master grants nothing (the pool is at
 * its eviction watermark: leases never evict) the agent asks again only
 * after AGENT_LEASE_RETRY_MS. Space the agent will not commit
 * (a put that failed before its commit, a lease idle for
 * AGENT_LEASE_IDLE_MS) goes back with the next call.
 *
 * Epochs and generations. Every mount begins a new lease epoch at the
 * master, which takes back the old epoch's space; the agent drops its
 * lease when it mounts (a new generation) and learns the new epoch from
 * the mount's answer. Calls name their epoch, so one of an earlier epoch
 * (resent after the link moved, say) is refused instead of touching the
 * new epoch's space. And the agent mounts again only once every put
 * that took space from the dropped lease has finished copying into it
 * (the master link holds a mount while agent__lease_draining, and the
 * put whose agent__lease_put_done says it was the last lets it go): the
 * mount gives those bytes back to the segment's free space, where the
 * master may place other objects (or lease them again) as soon as the
 * segment takes placements, so nobody ever writes bytes another object
 * owns.
 *
 * A commit (or a LeaseSpace call carrying releases) whose answer never
 * came (the master went away, a timeout) may or may not have been
 * applied. Its ranges are not given back: if it was applied, the object
 * may have been removed since and the bytes leased to this agent again,
 * and a late release would free bytes a put is using. They stay leased
 * (counted as used) until the segment is mounted again — which a master
 * that went away makes happen anyway.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "agent/agent_int.h"
#include "agent/mcall.h"
#include "agent/space.h"
#include "common/log.h"
#include "common/util.h"

#define LOG_SUBSYS LOGS_AGENT

struct lease_call {
	Mooncake__Master__LeaseSpaceRequest req;
	struct agent *a;
	unsigned gen;
	bool wanted;
	size_t n;
	Mooncake__Master__Extent *ext;
	Mooncake__Master__Extent **ptrs;
};

void agent__space_init(struct agent *a, uint64_t lease_bytes)
{
	a->space.lease_bytes = lease_bytes;
}

void agent__space_free(struct agent *a)
{
	free(a->space.release);
	a->space.release = NULL;
}

uint64_t agent__lease_room(const struct agent *a)
{
	uint64_t r = 0;
	for (unsigned i = 0; i < a->space.nlease; i++)
		r += a->space.lease[i].end - a->space.lease[i].off;
	return r;
}

/* The lease the agent keeps: --put-lease-size, or less when the master
 * would not grant that much (an eighth of the segment, master.proto). */
static uint64_t lease_target(const struct agent *a)
{
	return MC_MIN(a->space.lease_bytes, (uint64_t)a->seg->len / AGENT_LEASE_SEGMENT_DIV);
}

static void gauge(struct agent *a)
{
	agent__gauge(&a->stats, AGENT_G_PUT_LEASE, (int64_t)agent__lease_room(a));
}

static void give_back(struct agent *a, uint64_t off, uint64_t len)
{
	if (len == 0)
		return;
	if (a->space.nrelease == a->space.release_cap) {
		size_t cap = a->space.release_cap ? a->space.release_cap * 2 : 16;
		struct agent_extent *v = realloc(a->space.release, cap * sizeof(*v));
		if (!v) {
			/* The range stays leased until the next mount. */
			return;
		}
		a->space.release = v;
		a->space.release_cap = cap;
	}
	a->space.release[a->space.nrelease].off = off;
	a->space.release[a->space.nrelease].end = off + len;
	a->space.nrelease++;
}

/* The extent with the least room left goes back. */
static void drop_shortest(struct agent *a)
{
	unsigned k = 0;
	for (unsigned j = 1; j < a->space.nlease; j++)
		if (a->space.lease[j].end - a->space.lease[j].off <
		    a->space.lease[k].end - a->space.lease[k].off)
			k = j;
	give_back(a, a->space.lease[k].off, a->space.lease[k].end - a->space.lease[k].off);
	a->space.lease[k] = a->space.lease[--a->space.nlease];
}

static void on_leased(void *ud, int err, const char *message, const ProtobufCMessage *m)
{
	struct lease_call *c = ud;
	struct agent *a = c->a;
	unsigned gen = c->gen;
	bool wanted = c->wanted;
	free(c);
	if (gen != a->space.gen || a->stopping)
		return; /* an earlier epoch's: refused, or taken back by the mount */
	a->space.busy = false;
	if (err) {
		if (err != MC_ESHUTDOWN && err != MC_EINVALID_REPLICA)
			log_warn("put lease of segment %s: %s", a->name,
				 message ? message : mc_strerror(err));
		return; /* asked again by the next put or heartbeat */
	}
	const Mooncake__Master__LeaseSpaceResponse *r = (const void *)m;
	if (wanted && r->n_extents == 0) {
		a->space.denied = true; /* the pool is full, or re-syncing */
		a->space.denied_ms = mc_now_ms();
	}
	for (size_t i = 0; i < r->n_extents; i++) {
		uint64_t off = r->extents[i]->offset, len = r->extents[i]->length;
		if (len == 0 || off > a->seg->len || len > a->seg->len - off)
			continue; /* not trusted with the segment */
		if (a->space.nlease == AGENT_LEASE_EXTENTS)
			drop_shortest(a); /* full */
		a->space.lease[a->space.nlease].off = off;
		a->space.lease[a->space.nlease].end = off + len;
		a->space.nlease++;
	}
	gauge(a);
	if (a->space.nrelease)
		agent__lease_sync(a);
}

void agent__lease_sync(struct agent *a)
{
	if (!a->space.ready || a->space.busy || a->stopping || !a->space.lease_bytes)
		return;
	/* More when less than half the target is left, and not for a while
	 * after the master had none: a put must not cost a LeaseSpace call
	 * too. */
	uint64_t target = lease_target(a), room = agent__lease_room(a);
	if (a->space.denied && mc_now_ms() - a->space.denied_ms >= AGENT_LEASE_RETRY_MS)
		a->space.denied = false;
	uint64_t want = !a->space.idle && !a->space.denied &&
					a->space.nlease < AGENT_LEASE_EXTENTS &&
					room < target / AGENT_LEASE_REFILL_DIV &&
					a->space.takes_old == 0
				? target - room
				: 0;
	if (want == 0 && a->space.nrelease == 0)
		return;
	size_t n = a->space.nrelease;
	struct lease_call *c = calloc(1,
				      sizeof(*c) + n * (sizeof(*c->ext) + sizeof(*c->ptrs)));
	if (!c)
		return;
	c->a = a;
	c->gen = a->space.gen;
	c->wanted = want > 0;
	c->n = n;
	c->ext = (Mooncake__Master__Extent *)(c + 1);
	c->ptrs = (Mooncake__Master__Extent **)(c->ext + n);
	mooncake__master__lease_space_request__init(&c->req);
	c->req.agent_id = a->name;
	c->req.segment = a->name;
	c->req.lease_epoch = a->space.epoch;
	c->req.want_bytes = want;
	for (size_t i = 0; i < n; i++) {
		mooncake__master__extent__init(&c->ext[i]);
		c->ext[i].offset = a->space.release[i].off;
		c->ext[i].length = a->space.release[i].end - a->space.release[i].off;
		c->ptrs[i] = &c->ext[i];
	}
	c->req.release = c->ptrs;
	c->req.n_release = n;
	a->space.nrelease = 0;
	a->space.busy = true;
	agent__mcall(a, "LeaseSpace", &c->req.base,
		     &mooncake__master__lease_space_response__descriptor, on_leased, c);
}

bool agent__lease_take(struct agent *a, uint64_t size, uint64_t *off, unsigned *gen)
{
	if (!a->space.ready || !a->space.lease_bytes ||
	    size > lease_target(a) / AGENT_LEASE_VALUE_DIV)
		return false;
	a->space.idle = false;
	uint64_t len = (size + AGENT_LEASE_GRANULE - 1) & ~(uint64_t)(AGENT_LEASE_GRANULE - 1);
	for (unsigned i = 0; i < a->space.nlease; i++) {
		struct agent_extent *e = &a->space.lease[i];
		if (e->end - e->off < len)
			continue;
		*off = e->off;
		*gen = a->space.gen;
		e->off += len;
		if (e->off == e->end)
			a->space.lease[i] = a->space.lease[--a->space.nlease];
		if (len)
			a->space.takes++;
		a->space.used_ms = mc_now_ms();
		gauge(a);
		agent__lease_sync(a); /* more, before it runs out */
		return true;
	}
	if (a->space.nlease == AGENT_LEASE_EXTENTS) {
		/* Ends too short for this value: the shortest goes back, to
		 * make way for a new extent. */
		drop_shortest(a);
		gauge(a);
	}
	agent__lease_sync(a);
	return false;
}

bool agent__lease_put_done(struct agent *a, uint64_t off, uint64_t size, unsigned gen,
			   bool committing)
{
	uint64_t len = (size + AGENT_LEASE_GRANULE - 1) & ~(uint64_t)(AGENT_LEASE_GRANULE - 1);
	if (len == 0)
		return false;
	if (gen == a->space.gen) {
		a->space.takes--;
		if (!committing)
			give_back(a, off, len);
	} else if (--a->space.takes_old == 0) {
		/* The last copy into the old lease's bytes is done (and no
		 * lease is ready before the next mount: nothing to sync). */
		return true;
	}
	agent__lease_sync(a);
	return false;
}

unsigned agent__lease_gen(const struct agent *a)
{
	return a->space.gen;
}

uint64_t agent__lease_epoch(const struct agent *a)
{
	return a->space.epoch;
}

bool agent__lease_draining(const struct agent *a)
{
	return a->space.takes_old > 0;
}

/* ------------------------------------------------------------ remote leases
 *
 * Space of another agent's segment (proto/master.proto, "Remote leases")
 * for single-replica puts onto it: written through the transfer engine,
 * sealed with one BatchCommit naming that segment. Per segment (for
 * AGENT_RLEASES of them) an extent in use and the next one, asked for
 * when a quarter of the target is left; taken from only during the first
 * half of the grant's time (the rest is for the writes and the commit to
 * finish: after it the master takes the space back). Nothing is given
 * back early: what is left of an extent too short for a value, or
 * dropped after a refused commit, returns at the grant's end. */

struct rlease_call {
	Mooncake__Master__LeaseSpaceRequest req;
	struct agent *a;
	unsigned gen, slot;
	uint64_t sent_ms;
	char seg[sizeof(((struct agent_rlease *)0)->seg)];
};

static uint64_t rlease_target(const struct agent *a)
{
	return a->space.lease_bytes / AGENT_RLEASE_DIV;
}

/* Extents past their time are forgotten; the gauge is what is left. */
static void rlease_gauge(struct agent *a)
{
	uint64_t now = mc_now_ms(), room = 0;
	for (unsigned i = 0; i < AGENT_RLEASES; i++) {
		struct agent_rextent *e[2] = {&a->space.rl[i].cur, &a->space.rl[i].next};
		for (int k = 0; k < 2; k++) {
			if (now >= e[k]->until_ms)
				memset(e[k], 0, sizeof(*e[k]));
			room += e[k]->end - e[k]->off;
		}
	}
	agent__gauge(&a->stats, AGENT_G_REMOTE_LEASE, (int64_t)room);
}

static void on_rleased(void *ud, int err, const char *message, const ProtobufCMessage *m)
{
	struct rlease_call *c = ud;
	struct agent *a = c->a;
	struct agent_rlease *l = &a->space.rl[c->slot];
	if (c->gen != a->space.gen || a->stopping || strcmp(l->seg, c->seg) != 0) {
		free(c); /* the slot was emptied by a mount */
		return;
	}
	l->busy = false;
	const Mooncake__Master__LeaseSpaceResponse *r = (const void *)m;
	if (err || r->n_extents == 0 || r->extents[0]->length == 0) {
		if (err && err != MC_ESHUTDOWN)
			log_debug("remote put lease of segment %s: %s", c->seg,
				  message ? message : mc_strerror(err));
		l->denied_ms = mc_now_ms();
		free(c);
		return;
	}
	struct agent_rextent e = {
		.epoch = r->lease_epoch,
		.base = r->segment_base,
		.off = r->extents[0]->offset,
		.end = r->extents[0]->offset + r->extents[0]->length,
		.until_ms = c->sent_ms + r->ttl_ms / AGENT_RLEASE_USE_DIV,
	};
	if (l->cur.off < l->cur.end && mc_now_ms() < l->cur.until_ms)
		l->next = e; /* cur still has room: this one follows it */
	else
		l->cur = e;
	free(c);
	rlease_gauge(a);
}

static void rlease_ask(struct agent *a, unsigned slot)
{
	struct agent_rlease *l = &a->space.rl[slot];
	uint64_t now = mc_now_ms();
	if (l->busy || (l->denied_ms && now - l->denied_ms < AGENT_LEASE_RETRY_MS))
		return;
	struct rlease_call *c = calloc(1, sizeof(*c));
	if (!c)
		return;
	c->a = a;
	c->gen = a->space.gen;
	c->slot = slot;
	c->sent_ms = now;
	memcpy(c->seg, l->seg, sizeof(c->seg));
	mooncake__master__lease_space_request__init(&c->req);
	c->req.agent_id = a->name;
	c->req.segment = c->seg;
	c->req.want_bytes = rlease_target(a);
	l->busy = true;
	agent__mcall(a, "LeaseSpace", &c->req.base,
		     &mooncake__master__lease_space_response__descriptor, on_rleased, c);
}

bool agent__rlease_take(struct agent *a, const char *seg, uint64_t size, struct agent_rtake *t)
{
	uint64_t len = (size + AGENT_LEASE_GRANULE - 1) & ~(uint64_t)(AGENT_LEASE_GRANULE - 1);
	if (!a->space.ready || !a->space.lease_bytes || len == 0 ||
	    len > rlease_target(a) / AGENT_RLEASE_VALUE_DIV ||
	    strlen(seg) >= sizeof(a->space.rl[0].seg))
		return false;
	/* Its slot, else the least recently used one without a call out. */
	unsigned k = AGENT_RLEASES;
	for (unsigned i = 0; i < AGENT_RLEASES && k == AGENT_RLEASES; i++)
		if (strcmp(a->space.rl[i].seg, seg) == 0)
			k = i;
	if (k == AGENT_RLEASES) {
		for (unsigned i = 0; i < AGENT_RLEASES; i++)
			if (!a->space.rl[i].busy &&
			    (k == AGENT_RLEASES ||
			     a->space.rl[i].used_ms < a->space.rl[k].used_ms))
				k = i;
		if (k == AGENT_RLEASES)
			return false;
		memset(&a->space.rl[k], 0, sizeof(a->space.rl[k]));
		snprintf(a->space.rl[k].seg, sizeof(a->space.rl[k].seg), "%s", seg);
	}
	struct agent_rlease *l = &a->space.rl[k];
	uint64_t now = mc_now_ms();
	l->used_ms = now;
	if ((now >= l->cur.until_ms || l->cur.end - l->cur.off < len) && l->next.end) {
		l->cur = l->next; /* what cur had left is too short: it returns later */
		memset(&l->next, 0, sizeof(l->next));
	}
	struct agent_rextent *e = &l->cur;
	bool ok = now < e->until_ms && e->end - e->off >= len;
	if (ok) {
		t->off = e->off;
		t->epoch = e->epoch;
		t->base = e->base;
		e->off += len;
	}
	if (!l->next.end && (now >= e->until_ms ||
			     e->end - e->off < rlease_target(a) / AGENT_RLEASE_REFILL_DIV))
		rlease_ask(a, k); /* for the next puts */
	rlease_gauge(a);
	return ok;
}

void agent__rlease_drop(struct agent *a, const char *seg)
{
	for (unsigned i = 0; i < AGENT_RLEASES; i++)
		if (strcmp(a->space.rl[i].seg, seg) == 0) {
			memset(&a->space.rl[i].cur, 0, sizeof(a->space.rl[i].cur));
			memset(&a->space.rl[i].next, 0, sizeof(a->space.rl[i].next));
		}
	rlease_gauge(a);
}

void agent__lease_reset(struct agent *a)
{
	/* A new master knows nothing of remote leases either. */
	memset(a->space.rl, 0, sizeof(a->space.rl));
	rlease_gauge(a);
	a->space.gen++;
	a->space.ready = false;
	a->space.busy = false;
	a->space.denied = false;
	a->space.epoch = 0;
	a->space.nlease = 0;
	a->space.nrelease = 0; /* the master took everything back */
	a->space.takes_old += a->space.takes;
	a->space.takes = 0;
	gauge(a);
}

void agent__lease_start(struct agent *a, uint64_t epoch)
{
	a->space.epoch = epoch;
	a->space.ready = true;
	a->space.used_ms = mc_now_ms();
	agent__lease_sync(a);
}

void agent__lease_tick(struct agent *a)
{
	rlease_gauge(a);
	if (a->space.ready && a->space.nlease &&
	    mc_now_ms() - a->space.used_ms > AGENT_LEASE_IDLE_MS) {
		/* Idle: the space is more use to the pool. */
		for (unsigned i = 0; i < a->space.nlease; i++)
			give_back(a, a->space.lease[i].off,
				  a->space.lease[i].end - a->space.lease[i].off);
		a->space.nlease = 0;
		a->space.idle = true;
		gauge(a);
	}
	if (a->space.nrelease)
		agent__lease_sync(a);
}
