/*
 * demote: the SSD tier's moves (demote.h; proto/master.proto, "The SSD
 * tier").
 *
 * The SSD segment's log. After each mount of the SSD segment the agent
 * follows its log with the mirror's follower (mirror.c):
 *   FETCH  a demotion: the object (key, size, checksum) is read from the
 *          DRAM replica the order names — this agent's own segment, or
 *          another agent's through the transfer engine — on a copy thread
 *          into an aligned buffer, its checksum checked, written into the
 *          tier (which allocates its place), and answered DEMOTED with
 *          that offset; only then does the master let the DRAM replica
 *          go. A read that fails, bytes that do not match or a tier with
 *          no room are answered ABANDONED (the object stays in DRAM). At
 *          most AGENT_FETCHES orders (AGENT_FETCH_BYTES) are copied at
 *          once; the rest wait in order.
 *   DEL    the master evicted or removed the object's SSD replica at
 *          offset: the tier deletes it (reads that began finish).
 *   ADD    nothing: the tier holds it already.
 * A listing (this agent fell behind the log) deletes, at its end, every
 * object the tier stored before it began that was neither listed nor
 * added since: the master no longer has it.
 *
 * TierCommit. What the master must hear — demotions done or given up,
 * puts into the tier (op_put.c), objects whose bytes failed their
 * checksum (the tier's on_lost) — waits in a queue; one call at a time
 * carries up to AGENT_TIER_BATCH items, and the next goes when it is
 * answered. A DEMOTED or PUT item the master refuses is deleted from the
 * tier (the master does not know it); one whose call failed is kept when
 * it was a demotion (the master may have taken it: a later re-sync
 * reports it) and deleted when it was a put (its client is told it
 * failed).
 *
 * The flush at a graceful stop (--ssd-flush-on-stop): every object the
 * mirror says the DRAM segment holds is copied into the tier (checked
 * against its checksum on the way), so that the restart on the same
 * --ssd-path reports it; the master is not told (the segments are
 * unmounted right after).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "agent/agent_int.h"
#include "agent/demote.h"
#include "agent/mcall.h"
#include "agent/tier.h"
#include "agent/xfer.h"
#include "common/crc32c.h"
#include "common/log.h"
#include "common/util.h"

#define LOG_SUBSYS LOGS_AGENT

typedef Mooncake__Master__TierItem__Kind item_kind;
#define K_PUT MOONCAKE__MASTER__TIER_ITEM__KIND__PUT
#define K_DEMOTED MOONCAKE__MASTER__TIER_ITEM__KIND__DEMOTED
#define K_ABANDONED MOONCAKE__MASTER__TIER_ITEM__KIND__ABANDONED
#define K_LOST MOONCAKE__MASTER__TIER_ITEM__KIND__LOST

struct demote_item {
	struct demote_item *next;
	item_kind kind;
	uint64_t offset, size, ttl_ms;
	uint32_t crc;
	bool soft_pin;
	void (*cb)(void *ud, int err);
	void *ud;
	size_t klen;
	uint8_t key[];
};

/* A FETCH order (or an object flushed at a stop). */
struct demote_fetch {
	struct demote_fetch *next;
	struct agent_job job;
	struct agent *a;
	uint64_t size;
	uint32_t crc;
	bool has_crc;
	bool flush;
	char *source; /* NULL: this agent's segment */
	uint64_t src_offset, src_address;
	uint8_t *buf;
	int err;
	size_t klen;
	uint8_t key[];
};

static void send_items(struct agent *a);
static void pump(struct agent *a);
static void flush_pump(struct agent *a);

/* ------------------------------------------------------------ TierCommit */

struct commit_call {
	Mooncake__Master__TierCommitRequest req;
	struct agent *a;
	struct demote_item *items;
	size_t n;
	Mooncake__Master__TierItem **ptrs;
	Mooncake__Master__TierItem *v;
};

/* What one item says, and whom to tell of the master's answer. */
struct item_args {
	item_kind kind;
	const uint8_t *key;
	size_t klen;
	uint64_t offset, size, ttl_ms;
	uint32_t crc;
	bool soft_pin;
	void (*cb)(void *ud, int err);
	void *ud;
};

static void queue_item(struct agent *a, const struct item_args *x)
{
	struct agent_demote *d = &a->demote;
	struct demote_item *it = calloc(1, sizeof(*it) + x->klen);
	if (!it) {
		log_error("SSD tier: out of memory telling the master about '%.*s'",
			  (int)MC_MIN(x->klen, 64), x->key);
		if (x->cb)
			x->cb(x->ud, -ENOMEM);
		return;
	}
	it->kind = x->kind;
	it->offset = x->offset;
	it->size = x->size;
	it->ttl_ms = x->ttl_ms;
	it->crc = x->crc;
	it->soft_pin = x->soft_pin;
	it->cb = x->cb;
	it->ud = x->ud;
	it->klen = x->klen;
	memcpy(it->key, x->key, x->klen);
	if (d->items_tail)
		d->items_tail->next = it;
	else
		d->items = it;
	d->items_tail = it;
	d->nitems++;
	send_items(a);
}

static void on_committed(void *ud, int err, const char *message, const ProtobufCMessage *m)
{
	struct commit_call *c = ud;
	struct agent *a = c->a;
	const Mooncake__Master__BatchErrorsResponse *r = (const void *)m;
	if (err)
		log_warn("SSD tier: telling the master about %zu objects: %s", c->n,
			 message ? message : mc_strerror(err));
	size_t i = 0;
	for (struct demote_item *it = c->items, *next; it; it = next, i++) {
		next = it->next;
		int e = err ? err : i < r->n_errors ? r->errors[i] : MC_EPROTOCOL;
		bool refused = !err && e != 0;
		if (it->kind == K_DEMOTED) {
			if (!e)
				agent__count(&a->stats, AGENT_C_SSD_DEMOTIONS, 1);
			else
				agent__count(&a->stats, AGENT_C_SSD_DEMOTE_FAILS, 1);
		}
		/* A copy the master does not know goes (a demotion whose
		 * answer was lost may be known: kept for a re-sync). */
		if ((it->kind == K_DEMOTED && refused) || (it->kind == K_PUT && e))
			agent__tier_remove(a, it->key, it->klen, it->offset);
		if (it->cb)
			it->cb(it->ud, e);
		free(it);
	}
	free(c);
	a->demote.busy = false;
	send_items(a);
}

static void send_items(struct agent *a)
{
	struct agent_demote *d = &a->demote;
	if (d->busy || !d->items)
		return;
	size_t n = MC_MIN(d->nitems, (size_t)AGENT_TIER_BATCH);
	struct commit_call *c = calloc(1, sizeof(*c) + n * (sizeof(*c->ptrs) + sizeof(*c->v)));
	if (!c)
		return; /* (tried again with the next item) */
	c->a = a;
	c->ptrs = (Mooncake__Master__TierItem **)(c + 1);
	c->v = (Mooncake__Master__TierItem *)(c->ptrs + n);
	struct demote_item **tail = &c->items;
	for (size_t i = 0; i < n; i++) {
		struct demote_item *it = d->items;
		d->items = it->next;
		it->next = NULL;
		*tail = it;
		tail = &it->next;
		Mooncake__Master__TierItem *t = &c->v[i];
		mooncake__master__tier_item__init(t);
		t->kind = it->kind;
		t->key.data = it->key;
		t->key.len = it->klen;
		t->offset = it->offset;
		t->size = it->size;
		t->crc32c = it->crc;
		t->checksummed = true;
		t->soft_pin = it->soft_pin;
		t->ttl_ms = it->ttl_ms;
		c->ptrs[i] = t;
	}
	if (!d->items)
		d->items_tail = NULL;
	d->nitems -= n;
	c->n = n;
	mooncake__master__tier_commit_request__init(&c->req);
	c->req.agent_id = a->name;
	c->req.segment = (char *)agent__tier_name(a);
	c->req.items = c->ptrs;
	c->req.n_items = n;
	d->busy = true;
	agent__mcall(a, "TierCommit", &c->req.base,
		     &mooncake__master__batch_errors_response__descriptor, on_committed, c);
}

void agent__demote_put(struct agent *a, const uint8_t *key, size_t klen, uint64_t offset,
		       uint64_t size, uint32_t crc, bool soft_pin, uint64_t ttl_ms,
		       void (*cb)(void *ud, int err), void *ud)
{
	queue_item(a, &(struct item_args){.kind = K_PUT,
					  .key = key,
					  .klen = klen,
					  .offset = offset,
					  .size = size,
					  .crc = crc,
					  .soft_pin = soft_pin,
					  .ttl_ms = ttl_ms,
					  .cb = cb,
					  .ud = ud});
}

static void on_lost(struct agent *a, const uint8_t *key, size_t klen, uint64_t offset)
{
	agent__count(&a->stats, AGENT_C_SSD_LOST, 1);
	queue_item(a, &(struct item_args){
			      .kind = K_LOST, .key = key, .klen = klen, .offset = offset});
}

/* ------------------------------------------------------------ FETCH orders */

static void fetch_free(struct demote_fetch *f)
{
	agent__tier_buf_free(f->a, f->buf);
	free(f->source);
	free(f);
}

/* On a copy thread: the object's bytes into f->buf, checked. */
static void fetch_run(struct agent_job *j)
{
	struct demote_fetch *f = MC_CONTAINER_OF(j, struct demote_fetch, job);
	struct agent *a = f->a;
	uint32_t crc = 0;
	if (!f->source) {
		if (f->src_offset > a->seg->len || f->size > a->seg->len - f->src_offset) {
			f->err = MC_EINVALID_REPLICA;
			return;
		}
		crc = crc32c_copy(0, f->buf, a->seg->addr + f->src_offset, f->size);
	} else {
		struct agent_xfer *x = agent__xfer_new();
		if (!x) {
			f->err = -ENOMEM;
			return;
		}
		agent__xfer_add_summed(a, x, f->source, f->buf, f->src_address, f->size,
				       &f->err, &crc);
		agent__xfer_start(a, x);
		agent__xfer_finish(a, x);
		if (f->err)
			return;
	}
	if (f->has_crc && crc != f->crc)
		f->err = MC_ECHECKSUM;
	f->crc = crc;
	f->has_crc = true;
}

static void fetch_stored(void *ud, int err, const struct agent_tier_obj *o)
{
	struct demote_fetch *f = ud;
	struct agent *a = f->a;
	struct agent_demote *d = &a->demote;
	if (f->flush) {
		d->flush_running--;
		d->flush_done_n++;
		d->flush_stored += err == 0;
		fetch_free(f);
		flush_pump(a);
		return;
	}
	d->running--;
	d->running_bytes -= MC_MIN(d->running_bytes, f->size);
	if (err)
		log_warn("SSD tier: demotion of '%.*s' (%" PRIu64 " bytes): storing it: %s",
			 (int)MC_MIN(f->klen, 64), f->key, f->size, mc_strerror(err));
	if (!a->stopped)
		queue_item(a, &(struct item_args){.kind = err ? K_ABANDONED : K_DEMOTED,
						  .key = f->key,
						  .klen = f->klen,
						  .offset = err ? 0 : o->offset,
						  .size = f->size,
						  .crc = f->crc});
	fetch_free(f);
	pump(a);
}

static void fetch_done(struct agent_job *j)
{
	struct demote_fetch *f = MC_CONTAINER_OF(j, struct demote_fetch, job);
	struct agent *a = f->a;
	int rc = f->err;
	if (!rc) {
		/* A copy the tier still holds from an earlier life of the
		 * key (its deletion not heard of yet) makes room. */
		agent__tier_remove(a, f->key, f->klen, UINT64_MAX);
		rc = agent__tier_write(a, f->key, f->klen, f->buf, f->size, f->crc,
				       fetch_stored, f);
		if (!rc)
			return;
	}
	if (!f->flush)
		log_warn("SSD tier: demotion of '%.*s' (%" PRIu64 " bytes from %s): %s",
			 (int)MC_MIN(f->klen, 64), f->key, f->size,
			 f->source ? f->source : "this segment", mc_strerror(rc));
	fetch_stored(f, rc, NULL);
}

static void start_fetch(struct agent *a, struct demote_fetch *f)
{
	f->buf = agent__tier_buf(a, f->size, false);
	if (!f->buf) {
		f->err = -ENOMEM;
		fetch_done(&f->job);
		return;
	}
	f->job.run = fetch_run;
	f->job.done = fetch_done;
	agent__pool_submit(&a->pool, &f->job);
}

/* Start waiting orders while there is room. */
static void pump(struct agent *a)
{
	struct agent_demote *d = &a->demote;
	while (d->head && !a->stopping && d->running < AGENT_FETCHES &&
	       (d->running == 0 || d->running_bytes + d->head->size <= AGENT_FETCH_BYTES)) {
		struct demote_fetch *f = d->head;
		d->head = f->next;
		if (!d->head)
			d->tail = NULL;
		d->running++;
		d->running_bytes += f->size;
		start_fetch(a, f);
	}
}

static struct demote_fetch *fetch_new(struct agent *a, const uint8_t *key, size_t klen,
				      uint64_t size)
{
	struct demote_fetch *f = calloc(1, sizeof(*f) + klen);
	if (!f)
		return NULL;
	f->a = a;
	f->size = size;
	f->klen = klen;
	memcpy(f->key, key, klen);
	return f;
}

static void order(struct agent *a, const Mooncake__Master__MirrorEvent *e)
{
	struct agent_demote *d = &a->demote;
	if (!e->source_segment || !*e->source_segment || e->size == 0)
		return; /* no longer on its way */
	struct demote_fetch *f = fetch_new(a, e->key.data, e->key.len, e->size);
	bool local = strcmp(e->source_segment, a->name) == 0;
	if (f && !local && !(f->source = strdup(e->source_segment))) {
		free(f);
		f = NULL;
	}
	if (!f) {
		queue_item(a, &(struct item_args){.kind = K_ABANDONED,
						  .key = e->key.data,
						  .klen = e->key.len,
						  .size = e->size});
		return;
	}
	f->crc = e->crc32c;
	f->has_crc = e->checksummed;
	f->src_offset = e->source_offset;
	f->src_address = e->source_address;
	if (d->tail)
		d->tail->next = f;
	else
		d->head = f;
	d->tail = f;
	pump(a);
}

/* ------------------------------------------------------------ the log */

static void on_event(struct agent *a, const Mooncake__Master__MirrorEvent *e, bool listed)
{
	struct agent_demote *d = &a->demote;
	switch (e->op) {
	case MOONCAKE__MASTER__MIRROR_EVENT__OP__FETCH:
		if (!listed)
			order(a, e);
		return;
	case MOONCAKE__MASTER__MIRROR_EVENT__OP__DEL:
		if (agent__tier_remove(a, e->key.data, e->key.len, e->offset))
			agent__count(&a->stats, AGENT_C_SSD_DELETES, 1);
		if (d->listing)
			agent__inv_del_at(&d->listed, e->key.data, e->key.len, e->offset);
		return;
	default: {
		struct agent_inv_rec rec = {.offset = e->offset, .size = e->size};
		if (d->listing &&
		    agent__inv_add(&d->listed, e->key.data, e->key.len, &rec) != 0)
			d->listing = false; /* (out of memory: nothing is deleted) */
		return;
	}
	}
}

static void newest(void *ud, const uint8_t *key, size_t klen, const struct agent_tier_obj *o)
{
	uint64_t *seq = ud;
	(void)key;
	(void)klen;
	*seq = MC_MAX(*seq, o->seq);
}

static void on_list_start(struct agent *a)
{
	struct agent_demote *d = &a->demote;
	agent__inv_clear(&d->listed);
	d->listing = true;
	d->list_seq = 0;
	agent__tier_foreach(a, newest, &d->list_seq);
}

struct unlisted {
	struct agent_demote *d;
	struct agent_inv_entry **v;
	size_t n, cap;
};

static void collect_unlisted(void *ud, const uint8_t *key, size_t klen,
			     const struct agent_tier_obj *o)
{
	struct unlisted *u = ud;
	if (o->seq > u->d->list_seq || agent__inv_del_at(&u->d->listed, key, klen, o->offset))
		return;
	if (u->n == u->cap) {
		size_t cap = u->cap ? u->cap * 2 : 64;
		struct agent_inv_entry **v = realloc(u->v, cap * sizeof(*v));
		if (!v)
			return;
		u->v = v;
		u->cap = cap;
	}
	struct agent_inv_entry *e = malloc(sizeof(*e) + klen);
	if (!e)
		return;
	e->klen = (uint16_t)klen;
	e->rec.offset = o->offset;
	memcpy(e->key, key, klen);
	u->v[u->n++] = e;
}

static size_t on_list_end(struct agent *a)
{
	struct agent_demote *d = &a->demote;
	if (!d->listing)
		return 0;
	d->listing = false;
	struct unlisted u = {.d = d};
	agent__tier_foreach(a, collect_unlisted, &u);
	size_t gone = 0;
	for (size_t i = 0; i < u.n; i++) {
		gone += agent__tier_remove(a, u.v[i]->key, u.v[i]->klen, u.v[i]->rec.offset);
		free(u.v[i]);
	}
	free(u.v);
	agent__inv_clear(&d->listed);
	agent__count(&a->stats, AGENT_C_SSD_DELETES, gone);
	return gone;
}

static void on_applied(struct agent *a, uint64_t n)
{
	(void)a;
	(void)n;
}

static const struct agent_follow_hooks hooks = {
	.apply = on_event,
	.list_start = on_list_start,
	.list_end = on_list_end,
	.applied = on_applied,
};

void agent__demote_init(struct agent *a, bool flush_on_stop)
{
	struct agent_demote *d = &a->demote;
	d->flush_on_stop = flush_on_stop;
	if (agent__inv_init(&d->listed) != 0)
		d->listed.tab.b = NULL; /* (listings then delete nothing) */
	agent__follow_init(a, &d->f, agent__tier_name(a), &hooks);
	agent__tier_on_lost(a, on_lost);
}

void agent__demote_free(struct agent *a)
{
	struct agent_demote *d = &a->demote;
	while (d->head) {
		struct demote_fetch *f = d->head;
		d->head = f->next;
		fetch_free(f);
	}
	d->tail = NULL;
	while (d->items) {
		struct demote_item *it = d->items;
		d->items = it->next;
		free(it);
	}
	d->items_tail = NULL;
	if (d->listed.tab.b)
		agent__inv_free(&d->listed);
	for (size_t i = d->flush_pos; i < d->flush_n; i++)
		free(d->flush_items[i]);
	free(d->flush_items);
	d->flush_items = NULL;
}

void agent__demote_start(struct agent *a, uint64_t seq)
{
	if (a->demote.listed.tab.b)
		agent__follow_start(&a->demote.f, seq);
}

void agent__demote_stop(struct agent *a)
{
	struct agent_demote *d = &a->demote;
	agent__follow_stop(&d->f);
	d->listing = false;
	/* Orders not begun are dropped: the master gives them up. */
	while (d->head) {
		struct demote_fetch *f = d->head;
		d->head = f->next;
		fetch_free(f);
	}
	d->tail = NULL;
}

unsigned agent__demote_close(struct agent *a, uv_close_cb on_closed)
{
	agent__demote_stop(a);
	return agent__follow_close(&a->demote.f, on_closed);
}

bool agent__demote_busy(const struct agent *a)
{
	const struct agent_demote *d = &a->demote;
	return d->running || d->busy || d->flushing;
}

/* ------------------------------------------------------------ the flush */

static void flush_end(struct agent *a)
{
	struct agent_demote *d = &a->demote;
	log_info("SSD tier: %zu of the %zu objects of segment %s written down before "
		 "stopping",
		 d->flush_stored, d->flush_n, a->name);
	free(d->flush_items);
	d->flush_items = NULL;
	d->flush_n = d->flush_pos = 0;
	d->flushing = false;
	void (*done)(struct agent *) = d->flush_done;
	d->flush_done = NULL;
	if (done)
		done(a);
}

static void flush_pump(struct agent *a)
{
	struct agent_demote *d = &a->demote;
	while (d->flush_pos < d->flush_n && d->flush_running < AGENT_FETCHES) {
		struct agent_inv_entry *e = d->flush_items[d->flush_pos++];
		struct demote_fetch *f = fetch_new(a, e->key, e->klen, e->rec.size);
		if (f) {
			f->flush = true;
			f->src_offset = e->rec.offset;
			f->crc = e->rec.crc;
			f->has_crc = e->rec.has_crc;
		}
		free(e);
		d->flush_running++;
		if (!f || f->size == 0) {
			/* (nothing to store: an empty value) */
			d->flush_running--;
			d->flush_done_n++;
			free(f);
			continue;
		}
		start_fetch(a, f);
	}
	if (d->flush_done_n == d->flush_n && d->flushing)
		flush_end(a);
}

bool agent__demote_flush(struct agent *a, void (*done)(struct agent *a))
{
	struct agent_demote *d = &a->demote;
	if (!d->flush_on_stop || !agent__tier_on(a))
		return false;
	int rc = agent__inv_snapshot(&a->inv, &d->flush_items, &d->flush_n);
	if (rc) {
		log_error("SSD tier: cannot write the DRAM segment down before stopping: %s",
			  mc_strerror(rc));
		return false;
	}
	log_info("SSD tier: writing the %zu objects of segment %s down before stopping",
		 d->flush_n, a->name);
	d->flushing = true;
	d->flush_done = done;
	d->flush_pos = d->flush_done_n = d->flush_stored = 0;
	flush_pump(a);
	return true;
}
