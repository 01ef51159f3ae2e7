/*
 * tier: the agent's SSD tier. See tier.h, and src/ssd/ssd.h for the store
 * underneath (its files, durability and checks).
 *
 * The store is opened in agent_new, before the loop serves anything: its
 * recovery reads the index (and with --ssd-verify-on-start every object)
 * and drops torn or corrupt records and objects that fail their checksum,
 * each with a log line; what it recovered is what the master link
 * reports as the SSD segment's inventory once mounted. From then on the
 * loop watches the store's eventfd (a uv_poll) and runs the callbacks of
 * finished operations there: the store's I/O runs on its own threads,
 * never on the loop.
 *
 * Each read or write is a small block of its own (the store's request and
 * the caller's callback), freed when its callback has run. A write that
 * finds the store full waits, in order, for room: the master evicts past
 * the tier's watermark, its deletions arrive, and the store reuses their
 * space once their removals are appended to its index.
 * Waiting writes are tried again after the store's completions and every
 * AGENT_TIER_ROOM_POLL_MS, up to AGENT_TIER_ROOM_WAIT_MS.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "agent/agent_int.h"
#include "agent/tier.h"
#include "common/log.h"
#include "common/sysmem.h"
#include "common/util.h"
#include "ssd/ssd.h"

#define LOG_SUBSYS LOGS_AGENT

struct tier_op {
	struct ssd_req req;
	struct tier_op *next; /* waiting for room */
	struct agent *a;
	agent_tier_cb cb;
	void *ud;
	uint8_t *key; /* reads: for the lost object's news */
	size_t klen;
	uint64_t offset;
	/* a write waiting for room */
	const void *buf;
	uint64_t size, until_ms;
	uint32_t crc;
	bool sum; /* the store computes crc while writing */
};

static void retry_writes(struct agent *a);

/* ------------------------------------------------------------ staging */

#define STAGE_PAGE (2ull << 20)

/*
 * Map bytes of staging memory (tier.h) on transparent huge pages, touched
 * now so that no read waits for a page fault. Where the kernel gives no
 * huge pages (transparent huge pages off, or memory too fragmented to
 * compact) staging would only add copies: the tier goes without, with a
 * warning. Errors: MC_ECONFIG (more than half the memory available),
 * -ENOMEM.
 */
static int stage_open(struct agent_tier_stage *s, uint64_t bytes)
{
	char mode[128], size[32];
	if (!bytes)
		return 0;
	mc_format_bytes(bytes, size, sizeof(size));
	/* Touched whole at start: more than the node has would take the
	 * kernel's OOM killer, not a line that says why. */
	struct mc_meminfo mi;
	if (mc_meminfo_read(NULL, &mi) == 0 && bytes > mi.available_bytes / 2) {
		char avail[32];
		mc_format_bytes(mi.available_bytes, avail, sizeof(avail));
		log_error("--ssd-staging-size=%s is more than half the memory available (%s): "
			  "the SSD tier takes it at start; 64M serves 64 reads or writes "
			  "of 1 MiB at once",
			  size, avail);
		return MC_ECONFIG;
	}
	if (!mc_thp_madvise_ok(NULL, mode, sizeof(mode))) {
		log_warn("SSD tier: no staging memory (--ssd-staging-size=%s): transparent "
			 "huge pages are off (/sys/kernel/mm/transparent_hugepage/enabled: "
			 "%s); values are read and written in their own memory",
			 size, mode);
		return 0;
	}
	bytes = (bytes + STAGE_PAGE - 1) & ~(STAGE_PAGE - 1);
	if (bytes > SIZE_MAX - STAGE_PAGE)
		return -ENOMEM;
	size_t rlen = (size_t)(bytes + STAGE_PAGE);
	uint8_t *m = mmap(NULL, rlen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
			  0);
	if (m == MAP_FAILED) {
		log_error("SSD tier: cannot map %s of staging memory: %s", size,
			  strerror(errno));
		return -ENOMEM;
	}
	uint8_t *base = (uint8_t *)(((uintptr_t)m + STAGE_PAGE - 1) &
				    ~(uintptr_t)(STAGE_PAGE - 1));
	if (base > m)
		munmap(m, (size_t)(base - m));
	if (m + rlen > base + bytes)
		munmap(base + bytes, (size_t)(m + rlen - (base + bytes)));
	(void)madvise(base, (size_t)bytes, MADV_HUGEPAGE);
	memset(base, 0, (size_t)bytes); /* (fault it in now, huge pages first) */
	int64_t huge = mc_mapping_huge_bytes(base);
	if (huge < (int64_t)(bytes / 2)) {
		char got[32];
		mc_format_bytes(huge > 0 ? (uint64_t)huge : 0, got, sizeof(got));
		log_warn("SSD tier: no staging memory: of %s asked for, the kernel put %s "
			 "on huge pages (memory too fragmented?); values are read and "
			 "written in their own memory",
			 size, got);
		munmap(base, (size_t)bytes);
		return 0;
	}
	s->lens = calloc((size_t)(bytes / SSD_ALIGN), sizeof(*s->lens));
	if (!s->lens || mc_extalloc_init(&s->alloc, bytes, SSD_ALIGN, 1) != 0) {
		free(s->lens);
		s->lens = NULL;
		munmap(base, (size_t)bytes);
		return -ENOMEM;
	}
	pthread_mutex_init(&s->mu, NULL);
	s->base = base;
	s->len = bytes;
	log_info("SSD tier: %s of staging memory on huge pages", size);
	return 0;
}

/* (Every buffer has been given back: agent__tier_bufs_free.) */
static void stage_close(struct agent_tier_stage *s)
{
	if (!s->base)
		return;
	mc_extalloc_close(&s->alloc);
	free(s->lens);
	munmap(s->base, (size_t)s->len);
	pthread_mutex_destroy(&s->mu);
	s->base = NULL;
	s->len = 0;
}

void *agent__tier_buf(struct agent *a, uint64_t len, bool huge_only)
{
	struct agent_tier_stage *s = &a->tier.stage;
	uint64_t n = ssd_io_len(len ? len : 1);
	/* One block is one piece of memory wherever it lies: staging would
	 * only add a copy. */
	if (huge_only && n <= SSD_ALIGN)
		return NULL;
	if (s->base && n <= s->len) {
		uint64_t off;
		pthread_mutex_lock(&s->mu);
		int rc = mc_extalloc_get(&s->alloc, n, &off);
		if (rc == 0)
			s->lens[off / SSD_ALIGN] = (uint32_t)(n / SSD_ALIGN);
		pthread_mutex_unlock(&s->mu);
		agent__count(&a->stats, rc ? AGENT_C_SSD_STAGING_FULL : AGENT_C_SSD_STAGED, 1);
		if (rc == 0)
			return s->base + off;
	}
	void *p = NULL;
	if (huge_only || n > SIZE_MAX || posix_memalign(&p, SSD_ALIGN, (size_t)n) != 0)
		return NULL;
	return p;
}

void agent__tier_buf_free(struct agent *a, void *p)
{
	struct agent_tier_stage *s = &a->tier.stage;
	uint8_t *b = p;
	if (!s->base || b < s->base || b >= s->base + s->len) {
		free(p);
		return;
	}
	uint64_t off = (uint64_t)(b - s->base);
	pthread_mutex_lock(&s->mu);
	uint64_t n = (uint64_t)s->lens[off / SSD_ALIGN] * SSD_ALIGN;
	s->lens[off / SSD_ALIGN] = 0;
	int rc = n ? mc_extalloc_put(&s->alloc, off, n) : -EINVAL;
	pthread_mutex_unlock(&s->mu);
	if (rc)
		log_error("SSD tier: staging buffer at offset %" PRIu64 " freed twice or "
			  "never taken: %s",
			  off, mc_strerror(rc));
}

uint64_t agent__tier_staging_bytes(const struct agent *a)
{
	return a->tier.stage.len;
}

/* ------------------------------------------------------------ the store */

int agent__tier_open(struct agent *a, const struct agent_tier_opts *o)
{
	struct agent_tier *t = &a->tier;
	if (!o->path || !*o->path)
		return 0;
	enum ssd_io_kind io;
	if (!o->io || strcmp(o->io, "auto") == 0) {
		io = SSD_IO_AUTO;
	} else if (strcmp(o->io, "io_uring") == 0) {
		io = SSD_IO_URING;
	} else if (strcmp(o->io, "threads") == 0) {
		io = SSD_IO_THREADS;
	} else {
		log_error("SSD tier I/O '%s' is not auto, io_uring or threads", o->io);
		return MC_ECONFIG;
	}
	struct ssd_opts so = {
		.dir = o->path,
		.size_bytes = o->bytes,
		.verify_on_open = o->verify_on_start,
		.io = io,
		.check_free_space = true,
		.sync_interval_ms = o->sync_interval_ms,
		.metrics = a->metrics,
	};
	struct ssd_open_report rep;
	int rc = ssd_open(&so, &t->store, &rep);
	if (rc) {
		t->store = NULL;
		return rc;
	}
	t->capacity = o->bytes & ~(uint64_t)(SSD_ALIGN - 1);
	t->high_watermark = o->high_watermark;
	t->eviction_ratio = o->eviction_ratio;
	rc = stage_open(&t->stage, o->staging_bytes);
	if (rc) {
		ssd_close(t->store);
		t->store = NULL;
	}
	return rc;
}

static void on_poll(uv_poll_t *p, int status, int events)
{
	struct agent *a = p->data;
	(void)status;
	(void)events;
	ssd_poll(a->tier.store);
	retry_writes(a);
}

static void on_wait_timer(uv_timer_t *t)
{
	retry_writes(t->data);
}

void agent__tier_start(struct agent *a)
{
	struct agent_tier *t = &a->tier;
	if (!t->store)
		return;
	snprintf(t->name, sizeof(t->name), "%s/ssd", a->name);
	if (t->polling)
		return;
	uv_timer_init(a->loop, &t->wait_timer);
	t->wait_timer.data = a;
	t->timer_on = true;
	int rc = uv_poll_init(a->loop, &t->poll, ssd_fd(t->store));
	if (rc == 0)
		rc = uv_poll_start(&t->poll, UV_READABLE, on_poll);
	if (rc) {
		log_error("SSD tier: cannot watch its completions: %s", uv_strerror(rc));
		return;
	}
	t->poll.data = a;
	t->polling = true;
}

unsigned agent__tier_close(struct agent *a, uv_close_cb on_closed)
{
	struct agent_tier *t = &a->tier;
	unsigned n = 0;
	if (t->timer_on) {
		t->timer_on = false;
		uv_close((uv_handle_t *)&t->wait_timer, on_closed);
		n++;
	}
	if (!t->polling)
		return n;
	t->polling = false;
	uv_poll_stop(&t->poll);
	t->poll.data = a;
	uv_close((uv_handle_t *)&t->poll, on_closed);
	return n + 1;
}

void agent__tier_free(struct agent *a)
{
	ssd_close(a->tier.store); /* (runs what is left of its callbacks: none) */
	a->tier.store = NULL;
}

void agent__tier_bufs_free(struct agent *a)
{
	stage_close(&a->tier.stage);
}

bool agent__tier_on(const struct agent *a)
{
	return a->tier.store != NULL;
}

const char *agent__tier_name(const struct agent *a)
{
	return a->tier.name;
}

uint64_t agent__tier_capacity(const struct agent *a)
{
	return a->tier.capacity;
}

uint64_t agent__tier_block(const struct agent *a)
{
	(void)a;
	return SSD_ALIGN;
}

void agent__tier_watermarks(const struct agent *a, double *high, double *ratio)
{
	*high = a->tier.high_watermark;
	*ratio = a->tier.eviction_ratio;
}

unsigned agent__tier_inflight(const struct agent *a)
{
	return a->tier.inflight;
}

void agent__tier_on_lost(struct agent *a, void (*fn)(struct agent *a, const uint8_t *key,
						     size_t klen, uint64_t offset))
{
	a->tier.on_lost = fn;
}

uint64_t agent__tier_io_len(uint64_t len)
{
	return ssd_io_len(len);
}

int agent__tier_lookup(const struct agent *a, const uint8_t *key, size_t klen,
		       struct agent_tier_obj *out)
{
	if (!a->tier.store)
		return -EINVAL;
	struct ssd_obj o;
	int rc = ssd_lookup(a->tier.store, key, klen, &o);
	if (rc)
		return rc;
	*out = (struct agent_tier_obj){
		.offset = o.offset, .size = o.size, .seq = o.seq, .crc = o.crc};
	return 0;
}

static struct tier_op *op_new(struct agent *a, const uint8_t *key, size_t klen,
			      agent_tier_cb cb, void *ud)
{
	struct tier_op *op = calloc(1, sizeof(*op));
	if (!op || !(op->key = malloc(klen ? klen : 1))) {
		free(op);
		return NULL;
	}
	memcpy(op->key, key, klen);
	op->klen = klen;
	op->a = a;
	op->cb = cb;
	op->ud = ud;
	op->req.data = op;
	return op;
}

static void op_free(struct tier_op *op)
{
	free(op->key);
	free(op);
}

static void on_read(struct ssd_req *r)
{
	struct tier_op *op = r->data;
	struct agent *a = op->a;
	a->tier.inflight--;
	if (r->status == MC_ECHECKSUM && a->tier.on_lost)
		a->tier.on_lost(a, op->key, op->klen, op->offset);
	struct agent_tier_obj o = {
		.offset = op->offset, .size = r->size, .seq = r->seq, .crc = r->crc};
	op->cb(op->ud, r->status, r->status ? NULL : &o);
	op_free(op);
}

int agent__tier_read(struct agent *a, const uint8_t *key, size_t klen, void *buf,
		     uint64_t buf_len, agent_tier_cb cb, void *ud)
{
	return agent__tier_read_copy(a, key, klen, buf, buf_len, NULL, 0, cb, ud);
}

int agent__tier_read_copy(struct agent *a, const uint8_t *key, size_t klen, void *buf,
			  uint64_t buf_len, void *dst, uint64_t dst_len, agent_tier_cb cb,
			  void *ud)
{
	struct agent_tier *t = &a->tier;
	if (!t->store)
		return -EINVAL;
	struct ssd_obj so;
	int rc = ssd_lookup(t->store, key, klen, &so);
	if (rc)
		return rc;
	struct tier_op *op = op_new(a, key, klen, cb, ud);
	if (!op)
		return -ENOMEM;
	op->offset = so.offset;
	rc = ssd_get_copy(t->store, &op->req, key, klen, buf, buf_len, dst, dst_len, on_read);
	if (rc) {
		op_free(op);
		return rc;
	}
	t->inflight++;
	return 0;
}

static void on_written(struct ssd_req *r)
{
	struct tier_op *op = r->data;
	struct agent *a = op->a;
	a->tier.inflight--;
	struct agent_tier_obj o = {.size = r->size, .seq = r->seq, .crc = r->crc};
	struct ssd_obj so;
	int err = r->status;
	if (!err && ssd_lookup(a->tier.store, op->key, op->klen, &so) == 0)
		o.offset = so.offset;
	else if (!err)
		err = MC_ECANCELLED; /* (removed as it completed) */
	op->cb(op->ud, err, err ? NULL : &o);
	op_free(op);
}

/* Submit a write; false (op waiting, a try again due) when the store is
 * full. The call's other errors end op through its callback when from
 * a retry, else go back to the caller (op freed). */
static int try_write(struct agent *a, struct tier_op *op)
{
	int rc = op->sum ? ssd_put_sum(a->tier.store, &op->req, op->key, op->klen, op->buf,
				       op->size, on_written)
			 : ssd_put(a->tier.store, &op->req, op->key, op->klen, op->buf,
				   op->size, op->crc, on_written);
	if (rc == 0)
		a->tier.inflight++;
	return rc;
}

static void wait_for_room(struct agent *a, struct tier_op *op)
{
	struct agent_tier *t = &a->tier;
	op->next = NULL;
	if (t->wait_tail)
		t->wait_tail->next = op;
	else
		t->wait_head = op;
	t->wait_tail = op;
	t->inflight++; /* (a stop waits for it too) */
	if (t->timer_on && !uv_is_active((uv_handle_t *)&t->wait_timer))
		uv_timer_start(&t->wait_timer, on_wait_timer, AGENT_TIER_ROOM_POLL_MS,
			       AGENT_TIER_ROOM_POLL_MS);
}

/* Try the waiting writes again, in order, until one finds no room. */
static void retry_writes(struct agent *a)
{
	struct agent_tier *t = &a->tier;
	uint64_t now = mc_now_ms();
	while (t->wait_head) {
		struct tier_op *op = t->wait_head;
		int rc = a->stopping ? MC_ESHUTDOWN : try_write(a, op);
		if (rc == MC_ENO_SPACE && now < op->until_ms)
			break;
		t->wait_head = op->next;
		if (!t->wait_head)
			t->wait_tail = NULL;
		t->inflight--;
		if (rc) {
			op->cb(op->ud, rc, NULL);
			op_free(op);
		}
	}
	if (!t->wait_head && t->timer_on)
		uv_timer_stop(&t->wait_timer);
}

static int write_op(struct agent *a, const uint8_t *key, size_t klen, const void *buf,
		    uint64_t size, uint32_t crc, bool sum, agent_tier_cb cb, void *ud)
{
	struct agent_tier *t = &a->tier;
	if (!t->store)
		return -EINVAL;
	struct tier_op *op = op_new(a, key, klen, cb, ud);
	if (!op)
		return -ENOMEM;
	op->buf = buf;
	op->size = size;
	op->crc = crc;
	op->sum = sum;
	int rc = t->wait_head ? MC_ENO_SPACE : try_write(a, op); /* (in order) */
	if (rc == MC_ENO_SPACE && t->timer_on && !a->stopping) {
		op->until_ms = mc_now_ms() + AGENT_TIER_ROOM_WAIT_MS;
		wait_for_room(a, op);
		return 0;
	}
	if (rc) {
		op_free(op);
		return rc;
	}
	return 0;
}

int agent__tier_write(struct agent *a, const uint8_t *key, size_t klen, const void *buf,
		      uint64_t size, uint32_t crc, agent_tier_cb cb, void *ud)
{
	return write_op(a, key, klen, buf, size, crc, false, cb, ud);
}

int agent__tier_write_sum(struct agent *a, const uint8_t *key, size_t klen, const void *buf,
			  uint64_t size, agent_tier_cb cb, void *ud)
{
	return write_op(a, key, klen, buf, size, 0, true, cb, ud);
}

int agent__tier_write_stream(struct agent *a, const uint8_t *key, size_t klen, void *buf,
			     uint64_t size, agent_tier_cb cb, void *ud,
			     struct agent_tier_stream **out)
{
	struct agent_tier *t = &a->tier;
	if (!t->store)
		return -EINVAL;
	if (t->wait_head)
		return MC_ENO_SPACE; /* (writes go in order) */
	struct tier_op *op = op_new(a, key, klen, cb, ud);
	if (!op)
		return -ENOMEM;
	int rc = ssd_put_stream(t->store, &op->req, key, klen, buf, size, on_written);
	if (rc) {
		op_free(op);
		return rc;
	}
	t->inflight++;
	*out = (struct agent_tier_stream *)op;
	return 0;
}

int agent__tier_stream_feed(struct agent *a, struct agent_tier_stream *st, uint64_t bytes,
			    uint32_t crc)
{
	return ssd_put_feed(a->tier.store, &((struct tier_op *)st)->req, bytes, crc);
}

bool agent__tier_remove(struct agent *a, const uint8_t *key, size_t klen, uint64_t offset)
{
	struct agent_tier *t = &a->tier;
	struct ssd_obj so;
	if (!t->store || ssd_lookup(t->store, key, klen, &so) != 0 ||
	    (offset != UINT64_MAX && so.offset != offset))
		return false;
	return ssd_remove(t->store, key, klen) == 0;
}

struct each {
	void (*fn)(void *ud, const uint8_t *key, size_t klen, const struct agent_tier_obj *o);
	void *ud;
};

static void each_obj(void *ud, const uint8_t *key, size_t klen, const struct ssd_obj *so)
{
	struct each *e = ud;
	struct agent_tier_obj o = {
		.offset = so->offset, .size = so->size, .seq = so->seq, .crc = so->crc};
	e->fn(e->ud, key, klen, &o);
}

void agent__tier_foreach(const struct agent *a,
			 void (*fn)(void *ud, const uint8_t *key, size_t klen,
				    const struct agent_tier_obj *o),
			 void *ud)
{
	if (!a->tier.store)
		return;
	struct each e = {fn, ud};
	ssd_foreach(a->tier.store, each_obj, &e);
}

void agent__tier_stats(const struct agent *a, struct ssd_stats *st)
{
	*st = (struct ssd_stats){0};
	if (a->tier.store)
		ssd_stats(a->tier.store, st);
}
