/*
 * store: the SSD tier's store (ssd.h): the object table, puts, gets,
 * removals, group commit, syncs and compaction of the index. Formats in
 * rec.c, threads in io.c, open, recovery and close in open.c; everything
 * here runs on the owner's thread and none of it blocks.
 *
 * An object's life:
 *   ssd_put    extent allocated, entry WRITING (in the table: a second put
 *              of the key is refused, lookups do not see it), data write
 *              submitted;
 *   written    the PUT record goes into the index buffer, entry COMMITTING;
 *   commit     (group commit, one at a time, on the helper thread): the
 *              buffer appended to the index; then every entry of the batch
 *              is LIVE and its put's callback runs with 0 (syncs run
 *              apart, on the sync lane);
 *   removal    the entry leaves the table at once (DEAD); a DEL record
 *              goes into the index buffer unless the PUT was never
 *              written; the extent goes back to the allocator once the
 *              commit carrying the DEL has ended and no read uses it.
 * A removal of a WRITING entry only marks it: the write's completion
 * frees the extent and ends the put with MC_ECANCELLED.
 *
 * Compaction (when the index passes compact_min_bytes and twice its live
 * records): a new index of the next generation (its records seeded
 * differently, so no record of the old one passes in it) is written in
 * steps of the helper thread, ssd.index.new: the header, then the live
 * entries in seq order a chunk at a time (a cursor in the entry list,
 * moved on when its entry leaves), while every record appended to the
 * old index meanwhile is also encoded for the new one (its tail). Its
 * last step is a commit: the tail and the pending records written, synced,
 * renamed over ssd.index, the directory synced. A PUT met both by the
 * cursor and in the tail is one object (same seq), which replay allows.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "common/crc32c.h"
#include "common/extalloc.h"
#include "common/io.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/util.h"
#include "ssd/store_int.h"

#define LOG_SUBSYS LOGS_SSD

#define CHUNK_BYTES (1u << 20) /* compaction step */

enum req_kind { REQ_PUT = 1, REQ_GET };
enum { IO_READ = 0, IO_WRITE = 1 }; /* metrics' op label */

/* A data I/O of a request. */
struct xop {
	struct ssd__op op;
	struct ssd_req *r;
	struct ssd_store *s;
	bool sum; /* a put whose checksum the write computes */
};

/* A streamed put (ssd_put_stream): its write goes in parts, one op each,
 * as they are fed; x.op is never submitted, and x's done runs when the
 * last part fed has been written. */
struct stream {
	struct xop x;
	uint64_t fed;   /* bytes of x.op.len handed to writes */
	unsigned parts; /* writes in flight */
	unsigned feeds;
	struct stream_part {
		struct ssd__op op;
		struct stream *st;
	} part[SSD_STREAM_MAX_FEEDS];
};

/* A group commit (also the last step of a compaction). */
struct commit {
	struct ssd__op op;
	struct ssd_store *s;
	struct bbuf buf;
	uint64_t index_off;
	int index_fd;
	uint64_t number;
	struct ssd_req *puts; /* whose records it carries */
	/* compaction's last step */
	bool finish;
	char *new_path, *path, *dir;
};

/* A compaction step (header or chunk of ssd.index.new). */
struct cstep {
	struct ssd__op op;
	struct ssd_store *s;
	struct bbuf buf;
	uint64_t off;
	bool first;
};

int ssd__bbuf_reserve(struct bbuf *b, size_t more)
{
	if (b->len + more <= b->cap)
		return 0;
	size_t cap = b->cap ? b->cap : 4096;
	while (cap < b->len + more)
		cap *= 2;
	uint8_t *p = realloc(b->p, cap);
	if (!p)
		return -ENOMEM;
	b->p = p;
	b->cap = cap;
	return 0;
}

void ssd__bbuf_free(struct bbuf *b)
{
	free(b->p);
	memset(b, 0, sizeof(*b));
}

void ssd__register_metrics(struct ssd_store *s, struct metrics_registry *r)
{
	if (!r)
		return;
	s->m_bytes = metrics_gauge(r, "mooncake_agent_ssd_bytes", "Data area of the SSD tier.",
				   NULL, NULL);
	s->m_used = metrics_gauge(r, "mooncake_agent_ssd_used_bytes",
				  "SSD tier extents allocated (also being written, or removed "
				  "and awaiting a sync).",
				  NULL, NULL);
	s->m_objects = metrics_gauge(r, "mooncake_agent_ssd_objects",
				     "Objects stored in the SSD tier.", NULL, NULL);
	s->m_index = metrics_gauge(r, "mooncake_agent_ssd_index_bytes",
				   "Size of the SSD tier's index file.", NULL, NULL);
	for (int op = 0; op < 2; op++) {
		const char *v[] = {op == IO_READ ? "read" : "write"};
		s->m_ios[op] = metrics_counter(r, "mooncake_agent_ssd_ios_total",
					       "SSD tier data reads and writes finished.",
					       "op", v);
		s->m_io_bytes[op] = metrics_counter(r, "mooncake_agent_ssd_io_bytes_total",
						    "SSD tier bytes read and written.", "op",
						    v);
		s->m_io_s[op] = metrics_histogram(
			r, "mooncake_agent_ssd_io_seconds",
			"SSD tier data I/O latency, submitted to finished "
			"(a read: with its checksum checked).",
			"op", v, metrics_latency_buckets, metrics_latency_nbuckets);
	}
	s->m_crc_fail = metrics_counter(r, "mooncake_agent_ssd_checksum_failures_total",
					"SSD tier objects whose bytes failed their checksum "
					"(dropped).",
					NULL, NULL);
	s->m_syncs = metrics_counter(r, "mooncake_agent_ssd_syncs_total",
				     "SSD tier syncs of data and index.", NULL, NULL);
	s->m_compactions = metrics_counter(r, "mooncake_agent_ssd_compactions_total",
					   "SSD tier index compactions.", NULL, NULL);
	s->m_rec_s = metrics_gauge(r, "mooncake_agent_ssd_recovery_milliseconds",
				   "Time the SSD tier's last open took (recovery).", NULL,
				   NULL);
	s->m_rec_objects = metrics_gauge(r, "mooncake_agent_ssd_recovered_objects",
					 "Objects the SSD tier's last open recovered.", NULL,
					 NULL);
	s->m_rec_dropped = metrics_gauge(r, "mooncake_agent_ssd_dropped_objects",
					 "Objects the SSD tier's last open dropped (checksum, "
					 "past the end, overlap).",
					 NULL, NULL);
	s->m_rec_records = metrics_gauge(
		r, "mooncake_agent_ssd_dropped_records",
		"Index records the SSD tier's last open dropped (torn "
		"or corrupt).",
		NULL, NULL);
}

/* A data I/O finished: the store's counts and the metrics. */
static void io_done(struct ssd_store *s, int op, uint64_t bytes, uint64_t t0_ns)
{
	uint64_t ns = mc_now_ns() - t0_ns;
	if (op == IO_READ) {
		s->st.reads++;
		s->st.read_bytes += bytes;
		s->st.read_ns += ns;
	} else {
		s->st.writes++;
		s->st.write_bytes += bytes;
		s->st.write_ns += ns;
	}
	metric_inc(s->m_ios[op]);
	metric_add(s->m_io_bytes[op], bytes);
	metric_observe(s->m_io_s[op], (double)ns / 1e9);
}

/* Gauges of the owner's state, after each change of it. */
void ssd__update_gauges(struct ssd_store *s)
{
	if (!s->m_used)
		return;
	metric_set(s->m_used, (int64_t)(s->capacity - mc_extalloc_free_bytes(&s->alloc)));
	metric_set(s->m_objects, (int64_t)s->live_objects);
	metric_set(s->m_index, (int64_t)s->index_end);
}

/* ------------------------------------------------------------ buffers */

void *ssd_buf_alloc(size_t len)
{
	if (len == 0)
		return NULL;
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	return p == MAP_FAILED ? NULL : p;
}

void ssd_buf_free(void *p, size_t len)
{
	if (p)
		munmap(p, len);
}

/* ------------------------------------------------------------ table */

static uint64_t key_hash(const void *key, size_t klen)
{
	return mc_hash64(key, klen);
}

static struct ssd__ent **slot_of(const struct ssd_store *s, const void *key, size_t klen)
{
	struct ssd__ent **pp = (struct ssd__ent **)mc_lhash_bucket(&s->tab,
								   key_hash(key, klen));
	while (*pp && !((*pp)->klen == klen && memcmp((*pp)->key, key, klen) == 0))
		pp = &(*pp)->hnext;
	return pp;
}

struct ssd__ent *ssd__find(const struct ssd_store *s, const void *key, size_t klen)
{
	return *slot_of(s, key, klen);
}

static void **ent_link(void *e)
{
	return (void **)&((struct ssd__ent *)e)->hnext;
}

static uint64_t ent_hash(const void *e)
{
	const struct ssd__ent *x = e;
	return key_hash(x->key, x->klen);
}

static const struct mc_lhash_ops ent_ops = {ent_link, ent_hash};

struct ssd__ent *ssd__ent_new(const void *key, size_t klen)
{
	struct ssd__ent *e = calloc(1, sizeof(*e) + klen);
	if (!e)
		return NULL;
	e->klen = (uint16_t)klen;
	memcpy(e->key, key, klen);
	return e;
}

/* Into the table and the seq list (at its end). */
int ssd__ent_insert(struct ssd_store *s, struct ssd__ent *e)
{
	/* (Refused only when the table cannot grow and is already full
	 * four times over.) */
	mc_lhash_added(&s->tab, s->nents + 1, &ent_ops);
	if (s->nents >= 4 * mc_lhash_n(&s->tab))
		return -ENOMEM;
	struct ssd__ent **pp = slot_of(s, e->key, e->klen);
	e->hnext = NULL;
	*pp = e;
	s->nents++;
	e->prev = s->tail;
	e->next = NULL;
	if (s->tail)
		s->tail->next = e;
	else
		s->head = e;
	s->tail = e;
	return 0;
}

/* Out of the table and the seq list. */
void ssd__ent_unlink(struct ssd_store *s, struct ssd__ent *e)
{
	struct ssd__ent **pp = slot_of(s, e->key, e->klen);
	if (*pp == e) {
		*pp = e->hnext;
		s->nents--;
	}
	if (s->cursor == e)
		s->cursor = e->next;
	if (e->prev)
		e->prev->next = e->next;
	else
		s->head = e->next;
	if (e->next)
		e->next->prev = e->prev;
	else
		s->tail = e->prev;
	e->prev = e->next = e->hnext = NULL;
	if (e->state == ENT_LIVE) {
		s->live_objects--;
		s->live_rec_bytes -= ssd__rec_len(e->klen);
	}
}

void ssd__extent_free(struct ssd_store *s, struct ssd__ent *e)
{
	int rc = mc_extalloc_put(&s->alloc, e->off, e->len);
	if (rc < 0)
		log_error("freeing extent %" PRIu64 "+%" PRIu64 ": %s (space lost "
			  "until restart)",
			  e->off, e->len, mc_strerror(rc));
}

/* Free DEAD entries whose DEL is appended, with no read and no put in
 * flight; their extents go back. The list is in del_commit order, so the
 * scan ends at the first one not appended yet. Not waiting for the DEL's
 * sync is safe: a kill -9 keeps the appended DEL (page cache); a power
 * loss that loses it leaves its PUT beside the newer object that reused
 * the extent, and recovery drops the older of two overlapping objects
 * (open.c) or, the newer one's record lost too, the read's checksum
 * catches the other object's bytes. */
static void reclaim(struct ssd_store *s)
{
	struct ssd__ent **pp = &s->dead, *prev = NULL;
	while (*pp && (*pp)->del_commit <= s->commits_done) {
		struct ssd__ent *e = *pp;
		if (e->reads == 0 && !e->put_pending) {
			*pp = e->dnext;
			if (s->dead_tail == e)
				s->dead_tail = prev;
			ssd__extent_free(s, e);
			free(e);
		} else {
			prev = e;
			pp = &e->dnext;
		}
	}
}

/* e (DEAD, del_commit set) waits for its extent's reuse. */
static void dead_add(struct ssd_store *s, struct ssd__ent *e)
{
	e->dnext = NULL;
	if (e->del_commit == UINT64_MAX) {
		e->dnext = s->lost;
		s->lost = e;
		return;
	}
	if (s->dead_tail)
		s->dead_tail->dnext = e;
	else
		s->dead = e;
	s->dead_tail = e;
}

/* ------------------------------------------------------------ records */

static int append_rec(struct ssd_store *s, const struct ssd__rec *r)
{
	size_t n = ssd__rec_len(r->klen);
	/* A compaction collects its tail until its last step begins; from
	 * then on records go to ibuf only, in the new index's seed. */
	bool tail = s->compacting && !s->finishing;
	if (ssd__bbuf_reserve(&s->ibuf, n) < 0)
		return -ENOMEM;
	if (tail && ssd__bbuf_reserve(&s->ctail, n) < 0)
		return -ENOMEM;
	ssd__rec_encode(s->ibuf.p + s->ibuf.len, r, s->seed);
	s->ibuf.len += n;
	if (tail) {
		ssd__rec_encode(s->ctail.p + s->ctail.len, r, s->new_seed);
		s->ctail.len += n;
	}
	return 0;
}

struct ssd__rec ssd__put_rec(const struct ssd__ent *e)
{
	return (struct ssd__rec){.type = SSD__REC_PUT,
				 .klen = e->klen,
				 .seq = e->seq,
				 .offset = e->off,
				 .size = e->size,
				 .crc = e->crc,
				 .key = e->key};
}

static struct ssd__rec del_rec(const struct ssd__ent *e)
{
	return (struct ssd__rec){.type = SSD__REC_DEL,
				 .klen = e->klen,
				 .seq = e->seq,
				 .offset = e->off,
				 .key = e->key};
}

/* Take e out of the table for good (ssd_remove, a failed checksum). */
static void kill_ent(struct ssd_store *s, struct ssd__ent *e)
{
	ssd__ent_unlink(s, e);
	uint8_t was = e->state;
	e->state = ENT_DEAD;
	if (was == ENT_WRITING) {
		/* The write's completion frees it. */
		e->cancelled = true;
		return;
	}
	struct ssd__rec r = del_rec(e);
	if (append_rec(s, &r) < 0) {
		/* Without its DEL the object would come back after a restart,
		 * with its own bytes: keep its extent rather than reuse it. */
		log_error("removing '%.*s': out of memory for its index record; "
			  "its space stays used until restart",
			  (int)MC_MIN(e->klen, 64), (const char *)e->key);
		e->del_commit = UINT64_MAX;
	} else {
		e->del_commit = s->commits_started + 1;
	}
	dead_add(s, e);
}

/* ------------------------------------------------------------ commit */

static void commit_job(struct ssd__op *op)
{
	struct commit *c = MC_CONTAINER_OF(op, struct commit, op);
	int rc = 0;
	if (c->buf.len)
		rc = mc_pwrite_all(c->index_fd, c->buf.p, c->buf.len, c->index_off);
	if (!rc && c->finish) {
		if (fdatasync(c->index_fd) != 0)
			rc = -errno;
		else if (rename(c->new_path, c->path) != 0)
			rc = -errno;
		else
			rc = mc_fsync_dir(c->dir);
	}
	op->result = rc;
}

static void maybe_compact(struct ssd_store *s);
static void compact_next(struct ssd_store *s);
static void maybe_sync(struct ssd_store *s);

void ssd__complete_req(struct ssd_req *r, int status)
{
	r->status = status;
	r->cb(r);
}

static void set_failed(struct ssd_store *s, int rc, const char *what)
{
	if (s->failed)
		return;
	log_error("SSD index %s: %s; the store takes no more puts until restart", what,
		  mc_strerror(rc));
	s->failed = rc;
}

static void commit_done(struct ssd__op *op)
{
	struct commit *c = MC_CONTAINER_OF(op, struct commit, op);
	struct ssd_store *s = c->s;
	s->commit_running = false;
	int rc = op->result;
	if (rc < 0)
		set_failed(s, rc, c->finish ? "compaction" : "append");
	if (c->finish) {
		if (rc == 0) {
			/* A sync may still use the old index: it closes it. */
			if (s->sync_running)
				s->stale_fd = s->index_fd;
			else
				close(s->index_fd);
			s->index_fd = s->new_fd;
			s->st.compactions++;
			metric_inc(s->m_compactions);
			/* The new index is synced and holds every record so far. */
			s->synced = c->number;
			log_info("SSD index compacted: %" PRIu64 " bytes, %" PRIu64 " objects",
				 s->index_end, s->live_objects);
		} else {
			close(s->new_fd);
			unlink(s->new_path);
		}
		s->new_fd = -1;
		s->compacting = false;
		s->finishing = false;
	}
	if (rc == 0) {
		s->commits_done = c->number;
		atomic_store(&s->appended, c->number);
		s->st.commits++;
	}
	struct ssd_req *r = c->puts;
	while (r) {
		struct ssd_req *next = r->next;
		struct ssd__ent *e = r->ent;
		e->put_pending = false;
		if (rc < 0) {
			if (e->state != ENT_DEAD) {
				ssd__ent_unlink(s, e);
				e->state = ENT_DEAD;
				/* Its record may be on disk: never reuse. */
				e->del_commit = UINT64_MAX;
				dead_add(s, e);
			}
			ssd__complete_req(r, rc);
		} else if (e->state == ENT_COMMITTING) {
			e->state = ENT_LIVE;
			s->live_objects++;
			s->live_rec_bytes += ssd__rec_len(e->klen);
			ssd__complete_req(r, 0);
		} else {
			ssd__complete_req(r, MC_ECANCELLED);
		}
		r = next;
	}
	ssd__bbuf_free(&c->buf);
	free(c);
	reclaim(s);
	maybe_sync(s);
	maybe_compact(s);
}

static void start_commit(struct ssd_store *s, bool finish)
{
	struct commit *c = calloc(1, sizeof(*c));
	if (!c)
		return; /* tried again at the next poll */
	c->s = s;
	c->op.kind = SSD__OP_JOB;
	c->op.lane = SSD__LANE_APPEND;
	c->op.job = commit_job;
	c->op.done = commit_done;
	c->index_fd = finish ? s->new_fd : s->index_fd;
	c->number = ++s->commits_started;
	c->puts = s->waiting;
	s->waiting = s->waiting_tail = NULL;
	if (finish) {
		/* The tail holds every record of ibuf too, in the new seed. */
		c->finish = true;
		s->finishing = true;
		c->buf = s->ctail;
		memset(&s->ctail, 0, sizeof(s->ctail));
		ssd__bbuf_free(&s->ibuf);
		c->index_off = s->new_end;
		s->index_end = s->new_end + c->buf.len;
		s->generation++;
		s->seed = s->new_seed;
		c->new_path = s->new_path;
		c->path = s->index_path;
		c->dir = s->dir;
	} else {
		c->buf = s->ibuf;
		memset(&s->ibuf, 0, sizeof(s->ibuf));
		c->index_off = s->index_end;
		s->index_end += c->buf.len;
	}
	s->commit_running = true;
	ssd__io_submit(s->io, &c->op);
}

/* Start an append when records wait and none runs. */
void ssd__maybe_commit(struct ssd_store *s)
{
	if (s->commit_running || s->cstep_running)
		return;
	if (s->compacting && s->cursor_done && !s->cfailed) {
		start_commit(s, true);
		return;
	}
	if (s->ibuf.len > 0 || s->waiting)
		start_commit(s, false);
}

/* ------------------------------------------------------------ sync */

struct syncop {
	struct ssd__op op;
	struct ssd_store *s;
	int data_fd, index_fd;
	uint64_t target;
};

/* On the sync lane: wait out the interval since the last sync began
 * (unless kicked: a waiter, close), then sync what was appended by then. */
static void sync_job(struct ssd__op *op)
{
	struct syncop *y = MC_CONTAINER_OF(op, struct syncop, op);
	struct ssd_store *s = y->s;
	pthread_mutex_lock(&s->kick_mu);
	uint64_t due = s->last_sync_ns + s->sync_interval_ns;
	while (!s->kick && mc_now_ns() < due) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		uint64_t left = due - mc_now_ns(),
			 ns = (uint64_t)ts.tv_nsec + MC_MIN(left, 1000000000ull);
		ts.tv_sec += (time_t)(ns / 1000000000ull);
		ts.tv_nsec = (long)(ns % 1000000000ull);
		pthread_cond_timedwait(&s->kick_cv, &s->kick_mu, &ts);
	}
	s->kick = false;
	s->last_sync_ns = mc_now_ns();
	pthread_mutex_unlock(&s->kick_mu);
	y->target = atomic_load(&s->appended);
	int rc = 0;
	if (fdatasync(y->data_fd) != 0 || fdatasync(y->index_fd) != 0)
		rc = -errno;
	op->result = rc;
}

/* Make a waiting sync start now. */
void ssd__kick_sync(struct ssd_store *s)
{
	pthread_mutex_lock(&s->kick_mu);
	s->kick = true;
	pthread_cond_signal(&s->kick_cv);
	pthread_mutex_unlock(&s->kick_mu);
}

static void sync_done(struct ssd__op *op)
{
	struct syncop *y = MC_CONTAINER_OF(op, struct syncop, op);
	struct ssd_store *s = y->s;
	s->sync_running = false;
	/* An index replaced by a compaction meanwhile: this sync covered the
	 * old file only (the new one was synced when it was made). */
	bool replaced = y->index_fd != s->index_fd;
	if (s->stale_fd >= 0) {
		close(s->stale_fd);
		s->stale_fd = -1;
	}
	if (op->result < 0) {
		set_failed(s, op->result, "sync");
	} else {
		if (!replaced && y->target > s->synced)
			s->synced = y->target;
		s->st.syncs++;
		metric_inc(s->m_syncs);
	}
	free(y);
	/* Kicks that came while this sync ran asked for what it may have
	 * covered: the next one starts at once only for what still asks (a
	 * waiter, a close: maybe_sync), else at the interval's end. */
	pthread_mutex_lock(&s->kick_mu);
	s->kick = false;
	pthread_mutex_unlock(&s->kick_mu);
	struct ssd_req **pp = &s->sync_waiters;
	while (*pp) {
		struct ssd_req *r = *pp;
		if (s->failed || r->seq <= s->synced) {
			*pp = r->next;
			ssd__complete_req(r, s->failed);
		} else {
			pp = &r->next;
		}
	}
	maybe_sync(s);
}

/* Sync when appended records are not yet synced or someone waits. */
static void maybe_sync(struct ssd_store *s)
{
	if (s->sync_running || s->failed)
		return;
	bool waiter = false;
	for (struct ssd_req *r = s->sync_waiters; r; r = r->next)
		waiter |= r->seq <= s->commits_done;
	if (s->commits_done <= s->synced && !waiter)
		return;
	struct syncop *y = calloc(1, sizeof(*y));
	if (!y)
		return; /* tried again at the next poll */
	y->s = s;
	y->op.kind = SSD__OP_JOB;
	y->op.lane = SSD__LANE_SYNC;
	y->op.job = sync_job;
	y->op.done = sync_done;
	y->data_fd = s->data_fd;
	y->index_fd = s->index_fd;
	s->sync_running = true;
	ssd__io_submit(s->io, &y->op);
	if (waiter || s->closing)
		ssd__kick_sync(s);
}

int ssd_sync(struct ssd_store *s, struct ssd_req *r, ssd_cb cb)
{
	if (!cb)
		return -EINVAL;
	if (s->failed)
		return -EIO;
	r->s = s;
	r->cb = cb;
	r->status = 0;
	/* Every record appended so far: those of the next append too. */
	r->seq = s->commits_started + (s->ibuf.len || s->waiting ? 1 : 0);
	r->next = s->sync_waiters;
	s->sync_waiters = r;
	ssd__maybe_commit(s);
	maybe_sync(s);
	if (s->sync_running)
		ssd__kick_sync(s);
	return 0;
}

/* ------------------------------------------------------------ compaction */

static void cstep_job(struct ssd__op *op)
{
	struct cstep *c = MC_CONTAINER_OF(op, struct cstep, op);
	struct ssd_store *s = c->s;
	int rc = 0;
	if (c->first) {
		/* Only this thread touches new_fd until the last step ends. */
		s->new_fd = open(s->new_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
		if (s->new_fd < 0)
			rc = -errno;
	}
	if (!rc)
		rc = mc_pwrite_all(s->new_fd, c->buf.p, c->buf.len, c->off);
	op->result = rc;
}

static void cstep_done(struct ssd__op *op)
{
	struct cstep *c = MC_CONTAINER_OF(op, struct cstep, op);
	struct ssd_store *s = c->s;
	s->cstep_running = false;
	if (op->result < 0 && !s->cfailed) {
		log_error("SSD index compaction: writing %s: %s", s->new_path,
			  mc_strerror(op->result));
		s->cfailed = op->result;
	}
	ssd__bbuf_free(&c->buf);
	free(c);
	compact_next(s);
}

/* Abandon a compaction (a failed step, or close): the old index stays. */
void ssd__compact_abort(struct ssd_store *s)
{
	if (s->new_fd >= 0) {
		close(s->new_fd);
		s->new_fd = -1;
	}
	unlink(s->new_path);
	ssd__bbuf_free(&s->ctail);
	s->compacting = false;
	s->cfailed = 0;
}

/* The next step: a chunk of live entries, or (cursor at the end) the
 * last step, started as a commit by maybe_commit. */
static void compact_next(struct ssd_store *s)
{
	if (s->cfailed || s->closing) {
		ssd__compact_abort(s);
		return;
	}
	if (s->cursor_done) {
		ssd__maybe_commit(s);
		return;
	}
	struct cstep *c = calloc(1, sizeof(*c));
	if (!c || ssd__bbuf_reserve(&c->buf, CHUNK_BYTES + SSD__REC_MAX_BYTES) < 0) {
		free(c);
		s->cfailed = -ENOMEM;
		ssd__compact_abort(s);
		return;
	}
	c->s = s;
	c->op.kind = SSD__OP_JOB;
	c->op.lane = SSD__LANE_APPEND;
	c->op.job = cstep_job;
	c->op.done = cstep_done;
	c->off = s->new_end;
	while (s->cursor && c->buf.len < CHUNK_BYTES) {
		struct ssd__ent *e = s->cursor;
		s->cursor = e->next;
		if (e->state != ENT_LIVE && e->state != ENT_COMMITTING)
			continue; /* WRITING: its record comes in the tail */
		struct ssd__rec r = ssd__put_rec(e);
		ssd__rec_encode(c->buf.p + c->buf.len, &r, s->new_seed);
		c->buf.len += ssd__rec_len(e->klen);
	}
	if (!s->cursor)
		s->cursor_done = true;
	s->new_end += c->buf.len;
	s->cstep_running = true;
	ssd__io_submit(s->io, &c->op);
}

static void maybe_compact(struct ssd_store *s)
{
	if (s->compacting || s->failed || s->closing)
		return;
	uint64_t live = SSD__HDR_BYTES + s->live_rec_bytes;
	if (s->index_end < s->compact_min || s->index_end < 2 * live)
		return;
	struct cstep *c = calloc(1, sizeof(*c));
	if (!c || ssd__bbuf_reserve(&c->buf, SSD__HDR_BYTES) < 0) {
		free(c);
		return;
	}
	s->compacting = true;
	s->ctail.len = 0;
	s->cursor = s->head;
	s->cursor_done = s->cursor == NULL;
	s->new_seed = ssd__rec_seed(s->store_id, s->generation + 1);
	struct ssd__hdr h = {.magic = SSD__INDEX_MAGIC,
			     .version = SSD__VERSION,
			     .block_bytes = SSD_ALIGN,
			     .store_id = s->store_id,
			     .capacity = s->capacity,
			     .generation = s->generation + 1};
	ssd__hdr_encode(c->buf.p, &h);
	c->buf.len = SSD__HDR_BYTES;
	c->s = s;
	c->first = true;
	c->op.kind = SSD__OP_JOB;
	c->op.lane = SSD__LANE_APPEND;
	c->op.job = cstep_job;
	c->op.done = cstep_done;
	c->off = 0;
	s->new_end = SSD__HDR_BYTES;
	s->cstep_running = true;
	ssd__io_submit(s->io, &c->op);
}

/* ------------------------------------------------------------ requests */

static void put_written(struct ssd__op *op)
{
	struct xop *x = MC_CONTAINER_OF(op, struct xop, op);
	struct ssd_store *s = x->s;
	struct ssd_req *r = x->r;
	struct ssd__ent *e = r->ent;
	int rc = op->result;
	if (x->sum && rc == 0)
		e->crc = r->crc = op->sum_crc;
	free(x);
	if (rc == 0)
		io_done(s, IO_WRITE, e->len, r->t0_ns);
	if (rc == 0 && !e->cancelled && s->failed)
		rc = s->failed;
	if (rc == 0 && !e->cancelled) {
		struct ssd__rec rec = ssd__put_rec(e);
		rc = append_rec(s, &rec);
	}
	if (rc < 0 || e->cancelled) {
		if (!e->cancelled) {
			log_warn("SSD write of '%.*s' (%" PRIu64 " bytes at %" PRIu64 "): %s",
				 (int)MC_MIN(e->klen, 64), (const char *)e->key, e->size,
				 e->off, mc_strerror(rc));
			ssd__ent_unlink(s, e);
		}
		ssd__extent_free(s, e);
		free(e);
		ssd__complete_req(r, rc < 0 ? rc : MC_ECANCELLED);
		return;
	}
	e->state = ENT_COMMITTING;
	r->next = NULL;
	if (s->waiting_tail)
		s->waiting_tail->next = r;
	else
		s->waiting = r;
	s->waiting_tail = r;
}

static bool aligned_ptr(const void *p)
{
	return ((uintptr_t)p & (SSD_ALIGN - 1)) == 0;
}

static int put(struct ssd_store *s, struct ssd_req *r, const void *key, size_t klen,
	       const void *buf, uint64_t size, uint32_t crc, bool sum, bool stream, ssd_cb cb)
{
	if (klen == 0 || klen > SSD_MAX_KEY_BYTES || size == 0 || size > SSD_MAX_VALUE_BYTES ||
	    !aligned_ptr(buf) || !cb)
		return -EINVAL;
	if (s->failed)
		return -EIO;
	if (s->closing)
		return MC_ESHUTDOWN;
	if (ssd__find(s, key, klen))
		return MC_EOBJECT_ALREADY_EXISTS;
	uint64_t len = ssd_io_len(size), off;
	int rc = mc_extalloc_get(&s->alloc, len, &off);
	if (rc < 0)
		return rc;
	struct ssd__ent *e = ssd__ent_new(key, klen);
	struct stream *st = stream ? calloc(1, sizeof(*st)) : NULL;
	struct xop *x = stream ? (st ? &st->x : NULL) : calloc(1, sizeof(*x));
	if (!e || !x || ssd__ent_insert(s, e) < 0) {
		free(e);
		free(x);
		if (mc_extalloc_put(&s->alloc, off, len) < 0)
			log_error("extent %" PRIu64 " lost", off);
		return -ENOMEM;
	}
	e->off = off;
	e->len = len;
	e->size = size;
	e->crc = crc;
	e->seq = s->next_seq++;
	e->state = ENT_WRITING;
	e->put_pending = true;
	r->s = s;
	r->ent = e;
	r->cb = cb;
	r->buf = (void *)buf;
	r->size = size;
	r->seq = e->seq;
	r->crc = crc;
	r->kind = REQ_PUT;
	r->status = 0;
	r->t0_ns = mc_now_ns();
	r->stream = st;
	if (st) {
		r->next = s->streams;
		s->streams = r;
	}
	x->r = r;
	x->s = s;
	x->op.kind = SSD__OP_WRITE;
	x->op.fd = s->data_fd;
	x->op.buf = (void *)buf;
	x->op.len = len;
	x->op.off = SSD__DATA_START + off;
	x->op.done = put_written;
	x->op.sum = x->sum = sum;
	x->op.crc_len = size;
	if (stream)
		x->op.sum = false; /* (the feeder's sum) */
	else
		ssd__io_submit(s->io, &x->op);
	ssd__update_gauges(s);
	return 0;
}

int ssd_put(struct ssd_store *s, struct ssd_req *r, const void *key, size_t klen,
	    const void *buf, uint64_t size, uint32_t crc, ssd_cb cb)
{
	return put(s, r, key, klen, buf, size, crc, false, false, cb);
}

int ssd_put_sum(struct ssd_store *s, struct ssd_req *r, const void *key, size_t klen,
		const void *buf, uint64_t size, ssd_cb cb)
{
	return put(s, r, key, klen, buf, size, 0, true, false, cb);
}

int ssd_put_stream(struct ssd_store *s, struct ssd_req *r, const void *key, size_t klen,
		   void *buf, uint64_t size, ssd_cb cb)
{
	return put(s, r, key, klen, buf, size, 0, true, true, cb);
}

/* A part of a streamed put is written: the put is, once every part fed
 * is and the last one was fed. The first error is the put's. */
static void part_written(struct ssd__op *op)
{
	struct stream *st = MC_CONTAINER_OF(op, struct stream_part, op)->st;
	if (op->result && !st->x.op.result)
		st->x.op.result = op->result;
	st->parts--;
	if (st->parts == 0 && st->fed == st->x.op.len)
		put_written(&st->x.op); /* (frees st) */
}

int ssd_put_feed(struct ssd_store *s, struct ssd_req *r, uint64_t bytes, uint32_t crc)
{
	struct stream *st = r->stream;
	if (!st || st->x.s != s || st->fed == st->x.op.len)
		return -EINVAL;
	uint64_t end = bytes >= r->size ? st->x.op.len : bytes;
	if (end <= st->fed || end % SSD_ALIGN || st->feeds == SSD_STREAM_MAX_FEEDS)
		return -EINVAL;
	if (st->feeds == 0)
		r->t0_ns = mc_now_ns(); /* (the write's time, not the feeder's) */
	if (end == st->x.op.len) {
		st->x.op.sum_crc = crc;
		for (struct ssd_req **q = &s->streams; *q; q = &(*q)->next)
			if (*q == r) {
				*q = r->next;
				break;
			}
	}
	struct stream_part *p = &st->part[st->feeds++];
	p->st = st;
	p->op.kind = SSD__OP_WRITE;
	p->op.fd = st->x.op.fd;
	p->op.buf = (uint8_t *)st->x.op.buf + st->fed;
	p->op.len = end - st->fed;
	p->op.off = st->x.op.off + st->fed;
	p->op.done = part_written;
	st->fed = end;
	st->parts++;
	ssd__io_submit(s->io, &p->op);
	return 0;
}

static void get_read(struct ssd__op *op)
{
	struct xop *x = MC_CONTAINER_OF(op, struct xop, op);
	struct ssd_store *s = x->s;
	struct ssd_req *r = x->r;
	struct ssd__ent *e = r->ent;
	int rc = op->result;
	free(x);
	e->reads--;
	if (rc == 0 || rc == MC_ECHECKSUM)
		io_done(s, IO_READ, e->len, r->t0_ns);
	if (rc == MC_ECHECKSUM) {
		s->st.checksum_failures++;
		metric_inc(s->m_crc_fail);
		log_error("SSD object '%.*s' (seq %" PRIu64 ", %" PRIu64 " bytes at %" PRIu64
			  ") fails its checksum: dropped",
			  (int)MC_MIN(e->klen, 64), (const char *)e->key, e->seq, e->size,
			  e->off);
		if (e->state == ENT_LIVE)
			kill_ent(s, e);
	} else if (rc < 0) {
		log_warn("SSD read of '%.*s' (%" PRIu64 " bytes at %" PRIu64 "): %s",
			 (int)MC_MIN(e->klen, 64), (const char *)e->key, e->size, e->off,
			 mc_strerror(rc));
	}
	if (e->state == ENT_DEAD)
		reclaim(s);
	ssd__complete_req(r, rc);
}

int ssd_get(struct ssd_store *s, struct ssd_req *r, const void *key, size_t klen, void *buf,
	    uint64_t buf_len, ssd_cb cb)
{
	return ssd_get_copy(s, r, key, klen, buf, buf_len, NULL, 0, cb);
}

int ssd_get_copy(struct ssd_store *s, struct ssd_req *r, const void *key, size_t klen,
		 void *buf, uint64_t buf_len, void *dst, uint64_t dst_len, ssd_cb cb)
{
	if (klen == 0 || klen > SSD_MAX_KEY_BYTES || !aligned_ptr(buf) || !cb)
		return -EINVAL;
	struct ssd__ent *e = ssd__find(s, key, klen);
	if (!e || e->state != ENT_LIVE)
		return MC_EOBJECT_NOT_FOUND;
	if (buf_len < e->len || (dst && dst_len < e->size))
		return -ERANGE;
	struct xop *x = calloc(1, sizeof(*x));
	if (!x)
		return -ENOMEM;
	e->reads++;
	r->s = s;
	r->ent = e;
	r->cb = cb;
	r->buf = buf;
	r->size = e->size;
	r->seq = e->seq;
	r->crc = e->crc;
	r->kind = REQ_GET;
	r->status = 0;
	r->t0_ns = mc_now_ns();
	x->r = r;
	x->s = s;
	x->op.kind = SSD__OP_READ;
	x->op.fd = s->data_fd;
	x->op.buf = buf;
	x->op.len = e->len;
	x->op.off = SSD__DATA_START + e->off;
	x->op.verify = true;
	x->op.want_crc = e->crc;
	x->op.crc_len = e->size;
	x->op.copy_to = dst;
	x->op.done = get_read;
	ssd__io_submit(s->io, &x->op);
	return 0;
}

int ssd_remove(struct ssd_store *s, const void *key, size_t klen)
{
	if (klen == 0 || klen > SSD_MAX_KEY_BYTES)
		return -EINVAL;
	struct ssd__ent *e = ssd__find(s, key, klen);
	if (!e)
		return MC_EOBJECT_NOT_FOUND;
	kill_ent(s, e);
	ssd__maybe_commit(s);
	reclaim(s);
	ssd__update_gauges(s);
	return 0;
}

int ssd_lookup(const struct ssd_store *s, const void *key, size_t klen, struct ssd_obj *out)
{
	if (klen == 0 || klen > SSD_MAX_KEY_BYTES)
		return MC_EOBJECT_NOT_FOUND;
	const struct ssd__ent *e = ssd__find(s, key, klen);
	if (!e || e->state != ENT_LIVE)
		return MC_EOBJECT_NOT_FOUND;
	*out = (struct ssd_obj){
		.offset = e->off, .size = e->size, .seq = e->seq, .crc = e->crc};
	return 0;
}

void ssd_foreach(const struct ssd_store *s,
		 void (*fn)(void *ud, const uint8_t *key, size_t klen,
			    const struct ssd_obj *o),
		 void *ud)
{
	for (const struct ssd__ent *e = s->head; e; e = e->next) {
		if (e->state != ENT_LIVE)
			continue;
		struct ssd_obj o = {
			.offset = e->off, .size = e->size, .seq = e->seq, .crc = e->crc};
		fn(ud, e->key, e->klen, &o);
	}
}

void ssd_stats(const struct ssd_store *s, struct ssd_stats *st)
{
	*st = s->st;
	st->capacity_bytes = s->capacity;
	st->used_bytes = s->capacity - mc_extalloc_free_bytes(&s->alloc);
	st->objects = s->live_objects;
	st->index_bytes = s->index_end;
	struct mc_extalloc_stats as;
	mc_extalloc_stats(&s->alloc, &as);
	st->largest_free = as.largest_free;
	st->inflight = ssd__io_pending(s->io);
}

int ssd_fd(const struct ssd_store *s)
{
	return ssd__io_fd(s->io);
}

unsigned ssd_poll(struct ssd_store *s)
{
	unsigned n = ssd__io_reap(s->io);
	ssd__maybe_commit(s);
	maybe_sync(s);
	ssd__update_gauges(s);
	return n;
}

void ssd_wait(struct ssd_store *s, int timeout_ms)
{
	ssd__io_wait(s->io, timeout_ms);
}
