/*
 * store: the SSD tier's store (ssd.h): open and recovery, the object
 * table, puts, gets, removals, group commit and compaction of the index.
 * Formats in rec.c, threads in io.c; everything here runs on the owner's
 * thread (ssd_open and ssd_close block, the rest does not).
 *
 * An object's life:
 *   ssd_put    extent allocated, entry WRITING (in the table: a second put
 *              of the key is refused, lookups do not see it), data write
 *              submitted;
 *   written    the PUT record goes into the index buffer, entry COMMITTING;
 *   commit     (group commit, one at a time, on the helper thread):
 *              fdatasync(data), the buffer appended to the index,
 *              fdatasync(index); then every entry of the batch is LIVE and
 *              its put's callback runs with 0;
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
#include "ssd/ssd_int.h"

#define LOG_SUBSYS LOGS_SSD

#define MIN_CAPACITY (1ull << 20)
#define DEFAULT_DEPTH 32u
#define MAX_DEPTH 1024u
#define DEFAULT_COMPACT_MIN (4ull << 20)
#define CHUNK_BYTES (1u << 20)         /* compaction step */
#define READ_WINDOW (4u << 20)         /* recovery reads the index so */
#define VERIFY_BUF_BYTES (64ull << 20) /* recovery's checks in flight */

enum ent_state { ENT_WRITING, ENT_COMMITTING, ENT_LIVE, ENT_DEAD };
enum req_kind { REQ_PUT = 1, REQ_GET };
enum { IO_READ = 0, IO_WRITE = 1 }; /* metrics' op label */

struct ssd__ent {
	struct ssd__ent *hnext;       /* hash chain (not DEAD) */
	struct ssd__ent *prev, *next; /* seq order (not DEAD) */
	struct ssd__ent *dnext;       /* dead list */
	uint64_t off, len, size, seq;
	uint64_t del_commit; /* DEAD: the commit carrying its DEL */
	uint32_t crc;
	uint32_t reads; /* gets in flight */
	uint8_t state;
	bool put_pending; /* its put's callback has not run */
	bool cancelled;   /* removed while WRITING */
	uint16_t klen;
	uint8_t key[];
};

/* A growable byte buffer. */
struct bbuf {
	uint8_t *p;
	size_t len, cap;
};

static int bbuf_reserve(struct bbuf *b, size_t more)
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

static void bbuf_free(struct bbuf *b)
{
	free(b->p);
	memset(b, 0, sizeof(*b));
}

/* A data I/O of a request. */
struct xop {
	struct ssd__op op;
	struct ssd_req *r;
	struct ssd_store *s;
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

struct ssd_store {
	char *dir, *data_path, *index_path, *new_path;
	int lock_fd, data_fd, index_fd;
	bool direct;
	uint64_t store_id, generation, capacity;
	uint32_t seed;
	struct mc_extalloc alloc;
	bool alloc_ok;
	struct ssd__io *io;
	uint64_t compact_min;

	/* the table */
	struct ssd__ent **tab;
	size_t nbuckets, nents;       /* entries in the table */
	struct ssd__ent *head, *tail; /* seq order */
	/* DEAD entries awaiting their extent's reuse, in del_commit order
	 * (it never decreases), and those whose extent is never reused. */
	struct ssd__ent *dead, *dead_tail, *lost;
	uint64_t next_seq;
	uint64_t live_objects, live_rec_bytes;

	/* the index */
	uint64_t index_end;
	struct bbuf ibuf;                       /* records not yet committed */
	struct ssd_req *waiting, *waiting_tail; /* puts whose records are in ibuf */
	bool commit_running;
	uint64_t commits_started, commits_done;
	/* syncs (fdatasync of data and index) */
	bool sync_running;
	uint64_t synced;              /* appends up to this one are synced */
	struct ssd_req *sync_waiters; /* seq: the append they wait for */
	int stale_fd;                 /* an index replaced while a sync ran */
	_Atomic uint64_t appended;    /* commits_done, for the sync lane */
	uint64_t sync_interval_ns;
	pthread_mutex_t kick_mu; /* the sync lane's wait */
	pthread_cond_t kick_cv;
	bool kick;             /* under kick_mu */
	uint64_t last_sync_ns; /* under kick_mu */
	int failed;            /* an index write or sync failed */

	/* compaction */
	bool compacting, cstep_running;
	bool finishing; /* its last step is running */
	int new_fd;     /* written by the helper thread only */
	uint32_t new_seed;
	uint64_t new_end; /* bytes of ssd.index.new planned */
	struct ssd__ent *cursor;
	bool cursor_done;
	struct bbuf ctail; /* records since it began, new seed */
	int cfailed;

	bool closing;
	struct ssd_stats st;

	/* metrics (NULL without a registry: updates are no-ops) */
	struct metric *m_bytes, *m_used, *m_objects, *m_index, *m_ios[2], *m_io_bytes[2],
		*m_io_s[2], *m_crc_fail, *m_syncs, *m_compactions, *m_rec_s, *m_rec_objects,
		*m_rec_dropped, *m_rec_records;
};

static void register_metrics(struct ssd_store *s, struct metrics_registry *r)
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

static void io_metrics(struct ssd_store *s, int op, uint64_t bytes, uint64_t t0_ns)
{
	metric_inc(s->m_ios[op]);
	metric_add(s->m_io_bytes[op], bytes);
	metric_observe(s->m_io_s[op], (double)(mc_now_ns() - t0_ns) / 1e9);
}

/* Gauges of the owner's state, after each change of it. */
static void update_gauges(struct ssd_store *s)
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
	struct ssd__ent **pp = &s->tab[key_hash(key, klen) & (s->nbuckets - 1)];
	while (*pp && !((*pp)->klen == klen && memcmp((*pp)->key, key, klen) == 0))
		pp = &(*pp)->hnext;
	return pp;
}

static struct ssd__ent *find(const struct ssd_store *s, const void *key, size_t klen)
{
	return *slot_of(s, key, klen);
}

static int grow_table(struct ssd_store *s)
{
	size_t nb = s->nbuckets * 2;
	struct ssd__ent **tab = calloc(nb, sizeof(*tab));
	if (!tab)
		return -ENOMEM;
	for (size_t i = 0; i < s->nbuckets; i++) {
		struct ssd__ent *e = s->tab[i];
		while (e) {
			struct ssd__ent *n = e->hnext;
			size_t b = key_hash(e->key, e->klen) & (nb - 1);
			e->hnext = tab[b];
			tab[b] = e;
			e = n;
		}
	}
	free(s->tab);
	s->tab = tab;
	s->nbuckets = nb;
	return 0;
}

static struct ssd__ent *ent_new(const void *key, size_t klen)
{
	struct ssd__ent *e = calloc(1, sizeof(*e) + klen);
	if (!e)
		return NULL;
	e->klen = (uint16_t)klen;
	memcpy(e->key, key, klen);
	return e;
}

/* Into the table and the seq list (at its end). */
static int ent_insert(struct ssd_store *s, struct ssd__ent *e)
{
	if (s->nents >= s->nbuckets && grow_table(s) < 0 && s->nents >= 4 * s->nbuckets)
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
static void ent_unlink(struct ssd_store *s, struct ssd__ent *e)
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

static void extent_free(struct ssd_store *s, struct ssd__ent *e)
{
	int rc = mc_extalloc_put(&s->alloc, e->off, e->len);
	if (rc < 0)
		log_error("freeing extent %" PRIu64 "+%" PRIu64 ": %s (space lost "
			  "until restart)",
			  e->off, e->len, mc_strerror(rc));
}

/* Free DEAD entries whose DEL is synced, with no read and no put in
 * flight; their extents go back. The list is in del_commit order, so the
 * scan ends at the first one not synced yet. */
static void reclaim(struct ssd_store *s)
{
	struct ssd__ent **pp = &s->dead, *prev = NULL;
	while (*pp && (*pp)->del_commit <= s->synced) {
		struct ssd__ent *e = *pp;
		if (e->reads == 0 && !e->put_pending) {
			*pp = e->dnext;
			if (s->dead_tail == e)
				s->dead_tail = prev;
			extent_free(s, e);
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
	} else if (s->dead_tail) {
		s->dead_tail->dnext = e;
		s->dead_tail = e;
	} else {
		s->dead = s->dead_tail = e;
	}
}

/* ------------------------------------------------------------ records */

static int append_rec(struct ssd_store *s, const struct ssd__rec *r)
{
	size_t n = ssd__rec_len(r->klen);
	/* A compaction collects its tail until its last step begins; from
	 * then on records go to ibuf only, in the new index's seed. */
	bool tail = s->compacting && !s->finishing;
	if (bbuf_reserve(&s->ibuf, n) < 0)
		return -ENOMEM;
	if (tail && bbuf_reserve(&s->ctail, n) < 0)
		return -ENOMEM;
	ssd__rec_encode(s->ibuf.p + s->ibuf.len, r, s->seed);
	s->ibuf.len += n;
	if (tail) {
		ssd__rec_encode(s->ctail.p + s->ctail.len, r, s->new_seed);
		s->ctail.len += n;
	}
	return 0;
}

static struct ssd__rec put_rec(const struct ssd__ent *e)
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
	ent_unlink(s, e);
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

static void complete_req(struct ssd_req *r, int status)
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
				ent_unlink(s, e);
				e->state = ENT_DEAD;
				/* Its record may be on disk: never reuse. */
				e->del_commit = UINT64_MAX;
				dead_add(s, e);
			}
			complete_req(r, rc);
		} else if (e->state == ENT_COMMITTING) {
			e->state = ENT_LIVE;
			s->live_objects++;
			s->live_rec_bytes += ssd__rec_len(e->klen);
			complete_req(r, 0);
		} else {
			complete_req(r, MC_ECANCELLED);
		}
		r = next;
	}
	bbuf_free(&c->buf);
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
		bbuf_free(&s->ibuf);
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
static void maybe_commit(struct ssd_store *s)
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
static void kick_sync(struct ssd_store *s)
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
	struct ssd_req **pp = &s->sync_waiters;
	while (*pp) {
		struct ssd_req *r = *pp;
		if (s->failed || r->seq <= s->synced) {
			*pp = r->next;
			complete_req(r, s->failed);
		} else {
			pp = &r->next;
		}
	}
	reclaim(s);
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
		kick_sync(s);
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
	maybe_commit(s);
	maybe_sync(s);
	if (s->sync_running)
		kick_sync(s);
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
	bbuf_free(&c->buf);
	free(c);
	compact_next(s);
}

/* Abandon a compaction (a failed step, or close): the old index stays. */
static void compact_abort(struct ssd_store *s)
{
	if (s->new_fd >= 0) {
		close(s->new_fd);
		s->new_fd = -1;
	}
	unlink(s->new_path);
	bbuf_free(&s->ctail);
	s->compacting = false;
	s->cfailed = 0;
}

/* The next step: a chunk of live entries, or (cursor at the end) the
 * last step, started as a commit by maybe_commit. */
static void compact_next(struct ssd_store *s)
{
	if (s->cfailed || s->closing) {
		compact_abort(s);
		return;
	}
	if (s->cursor_done) {
		maybe_commit(s);
		return;
	}
	struct cstep *c = calloc(1, sizeof(*c));
	if (!c || bbuf_reserve(&c->buf, CHUNK_BYTES + SSD__REC_MAX_BYTES) < 0) {
		free(c);
		s->cfailed = -ENOMEM;
		compact_abort(s);
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
		struct ssd__rec r = put_rec(e);
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
	if (!c || bbuf_reserve(&c->buf, SSD__HDR_BYTES) < 0) {
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
	free(x);
	if (rc == 0) {
		s->st.writes++;
		s->st.write_bytes += e->len;
		io_metrics(s, IO_WRITE, e->len, r->t0_ns);
	}
	if (rc == 0 && !e->cancelled && s->failed)
		rc = s->failed;
	if (rc == 0 && !e->cancelled) {
		struct ssd__rec rec = put_rec(e);
		rc = append_rec(s, &rec);
	}
	if (rc < 0 || e->cancelled) {
		if (!e->cancelled) {
			log_warn("SSD write of '%.*s' (%" PRIu64 " bytes at %" PRIu64 "): %s",
				 (int)MC_MIN(e->klen, 64), (const char *)e->key, e->size,
				 e->off, mc_strerror(rc));
			ent_unlink(s, e);
		}
		extent_free(s, e);
		free(e);
		complete_req(r, rc < 0 ? rc : MC_ECANCELLED);
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

int ssd_put(struct ssd_store *s, struct ssd_req *r, const void *key, size_t klen,
	    const void *buf, uint64_t size, uint32_t crc, ssd_cb cb)
{
	if (klen == 0 || klen > SSD_MAX_KEY_BYTES || size == 0 || size > SSD_MAX_VALUE_BYTES ||
	    !aligned_ptr(buf) || !cb)
		return -EINVAL;
	if (s->failed)
		return -EIO;
	if (s->closing)
		return MC_ESHUTDOWN;
	if (find(s, key, klen))
		return MC_EOBJECT_ALREADY_EXISTS;
	uint64_t len = ssd_io_len(size), off;
	int rc = mc_extalloc_get(&s->alloc, len, &off);
	if (rc == MC_ENO_SPACE && s->dead) {
		/* Removed space waits for a sync: have it now, not at the
		 * interval's end. */
		maybe_sync(s);
		if (s->sync_running)
			kick_sync(s);
	}
	if (rc < 0)
		return rc;
	struct ssd__ent *e = ent_new(key, klen);
	struct xop *x = calloc(1, sizeof(*x));
	if (!e || !x || ent_insert(s, e) < 0) {
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
	x->r = r;
	x->s = s;
	x->op.kind = SSD__OP_WRITE;
	x->op.fd = s->data_fd;
	x->op.buf = (void *)buf;
	x->op.len = len;
	x->op.off = SSD__DATA_START + off;
	x->op.done = put_written;
	ssd__io_submit(s->io, &x->op);
	update_gauges(s);
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
	if (rc == 0 || rc == MC_ECHECKSUM) {
		s->st.reads++;
		s->st.read_bytes += e->len;
		io_metrics(s, IO_READ, e->len, r->t0_ns);
	}
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
	complete_req(r, rc);
}

int ssd_get(struct ssd_store *s, struct ssd_req *r, const void *key, size_t klen, void *buf,
	    uint64_t buf_len, ssd_cb cb)
{
	if (klen == 0 || klen > SSD_MAX_KEY_BYTES || !aligned_ptr(buf) || !cb)
		return -EINVAL;
	struct ssd__ent *e = find(s, key, klen);
	if (!e || e->state != ENT_LIVE)
		return MC_EOBJECT_NOT_FOUND;
	if (buf_len < e->len)
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
	x->op.done = get_read;
	ssd__io_submit(s->io, &x->op);
	return 0;
}

int ssd_remove(struct ssd_store *s, const void *key, size_t klen)
{
	if (klen == 0 || klen > SSD_MAX_KEY_BYTES)
		return -EINVAL;
	struct ssd__ent *e = find(s, key, klen);
	if (!e)
		return MC_EOBJECT_NOT_FOUND;
	kill_ent(s, e);
	maybe_commit(s);
	reclaim(s);
	update_gauges(s);
	return 0;
}

int ssd_lookup(const struct ssd_store *s, const void *key, size_t klen, struct ssd_obj *out)
{
	if (klen == 0 || klen > SSD_MAX_KEY_BYTES)
		return MC_EOBJECT_NOT_FOUND;
	const struct ssd__ent *e = find(s, key, klen);
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
	maybe_commit(s);
	maybe_sync(s);
	update_gauges(s);
	return n;
}

void ssd_wait(struct ssd_store *s, int timeout_ms)
{
	ssd__io_wait(s->io, timeout_ms);
}

/* ------------------------------------------------------------ open */

static int path_join(char **out, const char *dir, const char *name)
{
	size_t n = strlen(dir) + strlen(name) + 2;
	if (n > PATH_MAX)
		return -ENAMETOOLONG;
	*out = malloc(n);
	if (!*out)
		return -ENOMEM;
	snprintf(*out, n, "%s/%s", dir, name);
	return 0;
}

/* Read and decode the data file's header block. */
static int read_data_hdr(struct ssd_store *s, struct ssd__hdr *h)
{
	uint8_t *blk = ssd_buf_alloc(SSD_ALIGN);
	if (!blk)
		return -ENOMEM;
	int rc = mc_pread_all(s->data_fd, blk, SSD_ALIGN, 0);
	if (rc == 0)
		rc = ssd__hdr_decode(blk, SSD_ALIGN, SSD__DATA_MAGIC, h);
	ssd_buf_free(blk, SSD_ALIGN);
	return rc;
}

static int write_data_hdr(struct ssd_store *s)
{
	uint8_t *blk = ssd_buf_alloc(SSD_ALIGN);
	if (!blk)
		return -ENOMEM;
	struct ssd__hdr h = {.magic = SSD__DATA_MAGIC,
			     .version = SSD__VERSION,
			     .block_bytes = SSD_ALIGN,
			     .store_id = s->store_id,
			     .capacity = s->capacity};
	ssd__hdr_encode(blk, &h);
	int rc = mc_pwrite_all(s->data_fd, blk, SSD_ALIGN, 0);
	if (rc == 0 && fdatasync(s->data_fd) != 0)
		rc = -errno;
	ssd_buf_free(blk, SSD_ALIGN);
	return rc;
}

/* Make the data file total bytes long, its blocks allocated. */
static int size_data_file(struct ssd_store *s, uint64_t total, bool check_free)
{
	struct stat st;
	if (fstat(s->data_fd, &st) != 0)
		return -errno;
	uint64_t have = (uint64_t)st.st_blocks * 512;
	if (total > have && check_free) {
		struct statvfs vfs;
		if (fstatvfs(s->data_fd, &vfs) != 0)
			return -errno;
		uint64_t avail = (uint64_t)vfs.f_bavail * vfs.f_frsize;
		if (total - have > avail) {
			log_error("ssd-path %s: the SSD tier needs %" PRIu64 " MiB more and "
				  "the file system has %" PRIu64 " MiB free; lower ssd-size "
				  "or free space",
				  s->dir, (total - have) >> 20, avail >> 20);
			return MC_ECONFIG;
		}
	}
	if ((uint64_t)st.st_size > total && ftruncate(s->data_fd, (off_t)total) != 0)
		return -errno;
	if (total > have) {
		int rc = fallocate(s->data_fd, 0, 0, (off_t)total);
		if (rc != 0 && (errno == EOPNOTSUPP || errno == ENOSYS)) {
			log_warn("ssd-path %s: the file system cannot preallocate; the "
				 "data file is sparse and a full file system fails writes",
				 s->dir);
			rc = ftruncate(s->data_fd, (off_t)total);
		}
		if (rc != 0) {
			rc = -errno;
			log_error("ssd-path %s: allocating %" PRIu64 " MiB: %s", s->dir,
				  total >> 20, mc_strerror(rc));
			return rc;
		}
	}
	return 0;
}

/* Write a whole index (header + records) to ssd.index.new, sync, rename
 * over ssd.index, sync the directory. Blocks (open only). */
static int write_index_file(struct ssd_store *s, uint64_t generation, const uint8_t *recs,
			    size_t len)
{
	uint8_t hb[SSD__HDR_BYTES];
	struct ssd__hdr h = {.magic = SSD__INDEX_MAGIC,
			     .version = SSD__VERSION,
			     .block_bytes = SSD_ALIGN,
			     .store_id = s->store_id,
			     .capacity = s->capacity,
			     .generation = generation};
	ssd__hdr_encode(hb, &h);
	int fd = open(s->new_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
	if (fd < 0)
		return -errno;
	int rc = mc_pwrite_all(fd, hb, sizeof(hb), 0);
	if (!rc && len)
		rc = mc_pwrite_all(fd, recs, len, sizeof(hb));
	if (!rc && fdatasync(fd) != 0)
		rc = -errno;
	if (!rc && rename(s->new_path, s->index_path) != 0)
		rc = -errno;
	if (!rc)
		rc = mc_fsync_dir(s->dir);
	if (rc) {
		close(fd);
		unlink(s->new_path);
		return rc;
	}
	if (s->index_fd >= 0)
		close(s->index_fd);
	s->index_fd = fd;
	s->generation = generation;
	s->seed = ssd__rec_seed(s->store_id, generation);
	s->index_end = SSD__HDR_BYTES + len;
	return 0;
}

/* Rewrite the index from the table (recovery dropped something, or it is
 * mostly dead records). */
static int rewrite_index(struct ssd_store *s)
{
	struct bbuf b = {0};
	uint32_t seed = ssd__rec_seed(s->store_id, s->generation + 1);
	for (struct ssd__ent *e = s->head; e; e = e->next) {
		size_t n = ssd__rec_len(e->klen);
		if (bbuf_reserve(&b, n) < 0) {
			bbuf_free(&b);
			return -ENOMEM;
		}
		struct ssd__rec r = put_rec(e);
		ssd__rec_encode(b.p + b.len, &r, seed);
		b.len += n;
	}
	int rc = write_index_file(s, s->generation + 1, b.p, b.len);
	bbuf_free(&b);
	return rc;
}

struct recov {
	uint64_t dropped_records, torn_bytes, dropped_objects;
	uint64_t max_seq;
	bool rewrite;
};

static void apply_rec(struct ssd_store *s, struct recov *rv, const struct ssd__rec *r)
{
	if (r->seq > rv->max_seq)
		rv->max_seq = r->seq;
	struct ssd__ent *e = find(s, r->key, r->klen);
	if (r->type == SSD__REC_DEL) {
		if (e && e->seq == r->seq)
			ent_unlink(s, e), free(e);
		return;
	}
	if (e && e->seq == r->seq)
		return; /* written by a compaction's snapshot and its tail */
	if (e && e->seq > r->seq)
		return; /* an older put met after a newer one */
	if (e) {
		ent_unlink(s, e);
		free(e);
	}
	e = ent_new(r->key, r->klen);
	if (!e || ent_insert(s, e) < 0) {
		free(e);
		rv->dropped_objects++;
		rv->rewrite = true;
		return;
	}
	e->off = r->offset;
	e->size = r->size;
	e->len = ssd_io_len(r->size);
	e->crc = r->crc;
	e->seq = r->seq;
	e->state = ENT_LIVE;
	s->live_objects++;
	s->live_rec_bytes += ssd__rec_len(e->klen);
}

/* Read ssd.index: records applied to the table, a torn tail cut, a
 * corrupt stretch skipped. */
static int read_index(struct ssd_store *s, struct recov *rv)
{
	struct stat st;
	if (fstat(s->index_fd, &st) != 0)
		return -errno;
	uint64_t fsize = (uint64_t)st.st_size;
	uint8_t hb[SSD__HDR_BYTES];
	struct ssd__hdr h;
	int rc = fsize >= SSD__HDR_BYTES ? mc_pread_all(s->index_fd, hb, sizeof(hb), 0) : -EIO;
	if (rc == 0)
		rc = ssd__hdr_decode(hb, sizeof(hb), SSD__INDEX_MAGIC, &h);
	if (rc < 0 || h.store_id != s->store_id) {
		log_error("ssd-path %s: %s is %s; move the directory away or choose "
			  "another ssd-path",
			  s->dir, s->index_path,
			  rc < 0 ? "not an SSD tier index" : "another store's index");
		return MC_ECONFIG;
	}
	s->generation = h.generation;
	s->seed = ssd__rec_seed(s->store_id, h.generation);
	size_t cap = READ_WINDOW + SSD__REC_MAX_BYTES;
	uint8_t *w = malloc(cap);
	if (!w)
		return -ENOMEM;
	uint64_t pos = SSD__HDR_BYTES; /* file offset of w[0] */
	size_t have = 0, at = 0;       /* bytes in w, parse position */
	uint64_t bad_from = 0;         /* start of a stretch being skipped */
	bool skipping = false;
	for (;;) {
		if (have - at < SSD__REC_MAX_BYTES && pos + have < fsize) {
			memmove(w, w + at, have - at);
			pos += at;
			have -= at;
			at = 0;
			size_t n = (size_t)MC_MIN((uint64_t)(cap - have), fsize - pos - have);
			rc = mc_pread_all(s->index_fd, w + have, n, pos + have);
			if (rc < 0)
				break;
			have += n;
		}
		if (at >= have)
			break;
		struct ssd__rec r;
		size_t used;
		enum ssd__dec d = ssd__rec_decode(w + at, have - at, s->seed, &r, &used);
		if (d == SSD__DEC_OK) {
			if (skipping) {
				log_warn("SSD index %s: corrupt bytes %" PRIu64 "..%" PRIu64
					 " skipped (records there are lost)",
					 s->index_path, bad_from, pos + at);
				rv->dropped_records++;
				rv->rewrite = true;
				skipping = false;
			}
			apply_rec(s, rv, &r);
			at += used;
			continue;
		}
		if (!skipping) {
			skipping = true;
			bad_from = pos + at;
		}
		at += 8;
	}
	free(w);
	if (rc < 0)
		return rc;
	if (skipping) {
		/* Nothing valid after bad_from: the tail a crash cut. */
		rv->torn_bytes = fsize - bad_from;
		rv->dropped_records++;
		log_warn("SSD index %s: torn record at %" PRIu64 " (%" PRIu64
			 " bytes) cut off",
			 s->index_path, bad_from, rv->torn_bytes);
		if (ftruncate(s->index_fd, (off_t)bad_from) != 0 ||
		    fdatasync(s->index_fd) != 0)
			return -errno;
		fsize = bad_from;
	}
	s->index_end = fsize;
	return 0;
}

static int cmp_seq(const void *a, const void *b)
{
	const struct ssd__ent *x = *(struct ssd__ent *const *)a;
	const struct ssd__ent *y = *(struct ssd__ent *const *)b;
	return x->seq < y->seq ? -1 : x->seq > y->seq;
}

static void drop_ent(struct ssd_store *s, struct recov *rv, struct ssd__ent *e,
		     const char *why)
{
	log_warn("SSD object '%.*s' (seq %" PRIu64 ", %" PRIu64 " bytes at %" PRIu64
		 ") dropped: %s",
		 (int)MC_MIN(e->klen, 64), (const char *)e->key, e->seq, e->size, e->off, why);
	ent_unlink(s, e);
	free(e);
	rv->dropped_objects++;
	rv->rewrite = true;
}

/* Order the list by seq, then give every object its extent, newest
 * first: an object outside the data area, or overlapping a newer one,
 * is dropped. */
static int place_extents(struct ssd_store *s, struct recov *rv)
{
	size_t n = 0;
	for (struct ssd__ent *e = s->head; e; e = e->next)
		n++;
	struct ssd__ent **v = malloc((n ? n : 1) * sizeof(*v));
	if (!v)
		return -ENOMEM;
	n = 0;
	for (struct ssd__ent *e = s->head; e; e = e->next)
		v[n++] = e;
	qsort(v, n, sizeof(*v), cmp_seq);
	s->head = s->tail = NULL;
	for (size_t i = 0; i < n; i++) {
		v[i]->prev = s->tail;
		v[i]->next = NULL;
		if (s->tail)
			s->tail->next = v[i];
		else
			s->head = v[i];
		s->tail = v[i];
	}
	int rc = 0;
	for (size_t i = n; i-- > 0;) {
		struct ssd__ent *e = v[i];
		if (e->off > s->capacity || e->len > s->capacity - e->off) {
			drop_ent(s, rv, e, "past the end of the data area");
			continue;
		}
		rc = mc_extalloc_reserve(&s->alloc, e->off, e->len);
		if (rc == -EBUSY) {
			drop_ent(s, rv, e, "its extent overlaps a newer object's");
			rc = 0;
		} else if (rc < 0) {
			break;
		}
	}
	free(v);
	return rc;
}

struct vjob {
	struct ssd__op op;
	struct ssd__ent *e;
	struct recov *rv;
	struct ssd_store *s;
	uint8_t *buf;
	size_t cap;
	bool busy;
};

static void verify_done(struct ssd__op *op)
{
	struct vjob *j = MC_CONTAINER_OF(op, struct vjob, op);
	j->busy = false;
	if (op->result == 0)
		return;
	j->s->st.checksum_failures += op->result == MC_ECHECKSUM;
	extent_free(j->s, j->e);
	drop_ent(j->s, j->rv, j->e,
		 op->result == MC_ECHECKSUM ? "its bytes fail their checksum"
					    : mc_strerror(op->result));
}

/* Read every object and check its checksum, up to the queue depth at a
 * time (within VERIFY_BUF_BYTES of buffers). */
static int verify_all(struct ssd_store *s, struct recov *rv, unsigned depth)
{
	struct vjob *jobs = calloc(depth, sizeof(*jobs));
	if (!jobs)
		return -ENOMEM;
	int rc = 0;
	size_t per = (size_t)MC_MAX(VERIFY_BUF_BYTES / depth, SSD_ALIGN);
	per &= ~(size_t)(SSD_ALIGN - 1);
	struct ssd__ent *e = s->head;
	for (;;) {
		bool any_busy = false;
		for (unsigned i = 0; i < depth; i++) {
			struct vjob *j = &jobs[i];
			if (j->busy) {
				any_busy = true;
				continue;
			}
			if (!e)
				continue;
			/* e->next is read now: a drop in verify_done may unlink e. */
			struct ssd__ent *cur = e;
			e = e->next;
			size_t need = (size_t)MC_MAX(cur->len, per);
			if (j->cap < need) {
				ssd_buf_free(j->buf, j->cap);
				j->buf = ssd_buf_alloc(need);
				j->cap = j->buf ? need : 0;
				if (!j->buf) {
					rc = -ENOMEM;
					goto out;
				}
			}
			*j = (struct vjob){.buf = j->buf,
					   .cap = j->cap,
					   .e = cur,
					   .rv = rv,
					   .s = s,
					   .busy = true};
			j->op.kind = SSD__OP_READ;
			j->op.fd = s->data_fd;
			j->op.buf = j->buf;
			j->op.len = cur->len;
			j->op.off = SSD__DATA_START + cur->off;
			j->op.verify = true;
			j->op.want_crc = cur->crc;
			j->op.crc_len = cur->size;
			j->op.done = verify_done;
			ssd__io_submit(s->io, &j->op);
			any_busy = true;
		}
		if (!any_busy)
			break;
		ssd__io_wait(s->io, -1);
		ssd__io_reap(s->io);
	}
out:
	while (ssd__io_pending(s->io)) {
		ssd__io_wait(s->io, -1);
		ssd__io_reap(s->io);
	}
	for (unsigned i = 0; i < depth; i++)
		ssd_buf_free(jobs[i].buf, jobs[i].cap);
	free(jobs);
	return rc;
}

static int open_data(struct ssd_store *s)
{
	s->data_fd = open(s->data_path, O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0640);
	s->direct = true;
	if (s->data_fd < 0 && errno == EINVAL) {
		log_warn("ssd-path %s: the file system refuses direct I/O; the SSD "
			 "tier goes through the page cache",
			 s->dir);
		s->direct = false;
		s->data_fd = open(s->data_path, O_RDWR | O_CREAT | O_CLOEXEC, 0640);
	}
	return s->data_fd < 0 ? -errno : 0;
}

/* Create a new store, or take up an existing one: header checks, size. */
static int setup_files(struct ssd_store *s, const struct ssd_opts *o, bool *created)
{
	struct stat st;
	bool have_data = stat(s->data_path, &st) == 0 && st.st_size > 0;
	bool have_index = access(s->index_path, F_OK) == 0;
	int rc = open_data(s);
	if (rc < 0) {
		log_error("ssd-path %s: opening %s: %s", s->dir, s->data_path,
			  mc_strerror(rc));
		return rc;
	}
	struct ssd__hdr h;
	bool data_ok = have_data && read_data_hdr(s, &h) == 0;
	if (have_data && !data_ok && have_index) {
		log_error("ssd-path %s: %s is not an SSD tier data file (or its header "
			  "is damaged); move the directory away or choose another ssd-path",
			  s->dir, s->data_path);
		return MC_ECONFIG;
	}
	if (!have_data && have_index) {
		log_error("ssd-path %s: %s exists without its data file %s; move the "
			  "directory away or choose another ssd-path",
			  s->dir, s->index_path, s->data_path);
		return MC_ECONFIG;
	}
	if (have_data && data_ok && have_index) {
		s->store_id = h.store_id;
		if (h.capacity != s->capacity) {
			log_info("ssd-path %s: data area %" PRIu64 " MiB -> %" PRIu64 " MiB "
				 "(ssd-size)",
				 s->dir, h.capacity >> 20, s->capacity >> 20);
			rc = size_data_file(s, SSD__DATA_START + s->capacity,
					    o->check_free_space);
			if (rc == 0)
				rc = write_data_hdr(s);
			if (rc < 0)
				return rc;
		}
		*created = false;
		return 0;
	}
	/* A new store (also one whose creation a crash interrupted: a data
	 * file without an index holds no object). */
	*created = true;
	if (getrandom(&s->store_id, sizeof(s->store_id), 0) != sizeof(s->store_id))
		return -errno;
	rc = size_data_file(s, SSD__DATA_START + s->capacity, o->check_free_space);
	if (rc == 0)
		rc = write_data_hdr(s);
	if (rc == 0)
		rc = write_index_file(s, 1, NULL, 0);
	if (rc < 0 && !have_data)
		unlink(s->data_path); /* made by this open: leave nothing behind */
	return rc;
}

int ssd_open(const struct ssd_opts *o, struct ssd_store **out, struct ssd_open_report *rep)
{
	uint64_t t0 = mc_now_ms();
	memset(rep, 0, sizeof(*rep));
	uint64_t cap = o->size_bytes & ~(uint64_t)(SSD_ALIGN - 1);
	unsigned depth = o->queue_depth ? o->queue_depth : DEFAULT_DEPTH;
	if (!o->dir || !*o->dir || cap < MIN_CAPACITY || depth > MAX_DEPTH) {
		log_error("SSD tier: %s", !o->dir || !*o->dir ? "no directory"
					  : depth > MAX_DEPTH ? "queue depth above 1024"
							      : "size below 1 MiB");
		return MC_ECONFIG;
	}
	struct ssd_store *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->lock_fd = s->data_fd = s->index_fd = s->new_fd = s->stale_fd = -1;
	s->capacity = cap;
	s->next_seq = 1;
	s->compact_min = o->compact_min_bytes ? o->compact_min_bytes : DEFAULT_COMPACT_MIN;
	s->sync_interval_ns = (uint64_t)o->sync_interval_ms * 1000000ull;
	pthread_mutex_init(&s->kick_mu, NULL);
	pthread_cond_init(&s->kick_cv, NULL);
	s->nbuckets = 1024;
	struct recov rv = {0};
	int rc = -ENOMEM;
	s->tab = calloc(s->nbuckets, sizeof(*s->tab));
	s->dir = strdup(o->dir);
	if (!s->tab || !s->dir || path_join(&s->data_path, o->dir, "ssd.data") < 0 ||
	    path_join(&s->index_path, o->dir, "ssd.index") < 0 ||
	    path_join(&s->new_path, o->dir, "ssd.index.new") < 0)
		goto fail;
	rc = mc_mkdir_p(o->dir, 0750);
	if (rc < 0) {
		log_error("ssd-path %s: cannot create it: %s", o->dir, mc_strerror(rc));
		goto fail;
	}
	int holder = 0;
	rc = mc_lock_dir(o->dir, &s->lock_fd, &holder);
	if (rc == MC_ELOCKED) {
		log_error("ssd-path %s is in use by another process (pid %d); every "
			  "agent needs an ssd-path of its own",
			  o->dir, holder);
		goto fail;
	}
	if (rc < 0) {
		log_error("ssd-path %s: %s", o->dir, mc_strerror(rc));
		goto fail;
	}
	unlink(s->new_path); /* a compaction a crash interrupted */
	bool created = false;
	rc = setup_files(s, o, &created);
	if (rc < 0)
		goto fail;
	rc = mc_extalloc_init(&s->alloc, s->capacity, SSD_ALIGN, s->store_id);
	if (rc < 0)
		goto fail;
	s->alloc_ok = true;
	rc = ssd__io_new(o->io, depth, &s->io);
	if (rc < 0)
		goto fail;
	if (!created) {
		if (s->index_fd < 0) {
			s->index_fd = open(s->index_path, O_RDWR | O_CLOEXEC);
			if (s->index_fd < 0) {
				rc = -errno;
				log_error("ssd-path %s: opening %s: %s", o->dir, s->index_path,
					  mc_strerror(rc));
				goto fail;
			}
		}
		rc = read_index(s, &rv);
		if (rc == 0)
			rc = place_extents(s, &rv);
		if (rc == 0 && o->verify_on_open)
			rc = verify_all(s, &rv, depth);
		if (rc < 0)
			goto fail;
		s->next_seq = rv.max_seq + 1;
		if (rv.rewrite || (s->index_end >= s->compact_min &&
				   s->index_end >= 2 * (SSD__HDR_BYTES + s->live_rec_bytes))) {
			rc = rewrite_index(s);
			if (rc < 0) {
				log_error("ssd-path %s: rewriting the index: %s", o->dir,
					  mc_strerror(rc));
				goto fail;
			}
		}
	}
	rep->created = created;
	rep->direct_io = s->direct;
	rep->io = ssd__io_name(s->io);
	rep->objects = s->live_objects;
	for (struct ssd__ent *e = s->head; e; e = e->next)
		rep->bytes += e->size;
	rep->dropped_records = rv.dropped_records;
	rep->torn_bytes = rv.torn_bytes;
	rep->dropped_objects = rv.dropped_objects;
	rep->elapsed_ms = mc_now_ms() - t0;
	register_metrics(s, o->metrics);
	metric_set(s->m_bytes, (int64_t)s->capacity);
	metric_set(s->m_rec_s, (int64_t)rep->elapsed_ms);
	metric_set(s->m_rec_objects, (int64_t)rep->objects);
	metric_set(s->m_rec_dropped, (int64_t)rep->dropped_objects);
	metric_set(s->m_rec_records, (int64_t)rep->dropped_records);
	update_gauges(s);
	log_info("SSD tier %s: %s, %" PRIu64 " MiB, %" PRIu64 " objects (%" PRIu64
		 " MiB) recovered, %" PRIu64 " index records and %" PRIu64
		 " objects dropped, %s%s, %" PRIu64 " ms",
		 o->dir, created ? "created" : "opened", s->capacity >> 20, rep->objects,
		 rep->bytes >> 20, rep->dropped_records, rep->dropped_objects, rep->io,
		 s->direct ? ", direct I/O" : ", buffered I/O", rep->elapsed_ms);
	*out = s;
	return 0;
fail:
	ssd_close(s);
	return rc;
}

/* ------------------------------------------------------------ close */

void ssd_close(struct ssd_store *s)
{
	if (!s)
		return;
	s->closing = true;
	if (s->io) {
		kick_sync(s);
		for (;;) {
			maybe_commit(s);
			if (ssd__io_pending(s->io) == 0 && !s->commit_running &&
			    !s->cstep_running && !s->sync_running && s->ibuf.len == 0 &&
			    !s->waiting)
				break;
			if (s->failed && ssd__io_pending(s->io) == 0)
				break;
			ssd__io_wait(s->io, -1);
			ssd__io_reap(s->io);
		}
		ssd__io_free(s->io);
		if (!s->failed && (fdatasync(s->data_fd) != 0 || fdatasync(s->index_fd) != 0))
			log_error("SSD tier %s: final sync: %s", s->dir, strerror(errno));
	}
	if (s->stale_fd >= 0)
		close(s->stale_fd);
	if (s->compacting)
		compact_abort(s);
	for (struct ssd_req *r = s->sync_waiters; r;) {
		struct ssd_req *next = r->next;
		complete_req(r, s->failed ? s->failed : 0);
		r = next;
	}
	/* Puts whose records a failed store could not commit. */
	for (struct ssd_req *r = s->waiting; r;) {
		struct ssd_req *next = r->next;
		r->ent->put_pending = false;
		complete_req(r, s->failed ? s->failed : MC_ESHUTDOWN);
		r = next;
	}
	while (s->head) {
		struct ssd__ent *e = s->head;
		s->head = e->next;
		free(e);
	}
	for (int i = 0; i < 2; i++) {
		struct ssd__ent **l = i ? &s->lost : &s->dead;
		while (*l) {
			struct ssd__ent *e = *l;
			*l = e->dnext;
			free(e);
		}
	}
	bbuf_free(&s->ibuf);
	bbuf_free(&s->ctail);
	if (s->alloc_ok)
		mc_extalloc_close(&s->alloc);
	if (s->data_fd >= 0)
		close(s->data_fd);
	if (s->index_fd >= 0)
		close(s->index_fd);
	if (s->lock_fd >= 0)
		mc_unlock_dir(s->lock_fd);
	free(s->tab);
	free(s->dir);
	free(s->data_path);
	free(s->index_path);
	free(s->new_path);
	pthread_mutex_destroy(&s->kick_mu);
	pthread_cond_destroy(&s->kick_cv);
	free(s);
}
