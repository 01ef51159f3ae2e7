/*
 * store_int: the SSD store's state, shared by store.c (the table,
 * requests, commits, syncs, compaction) and open.c (open, recovery,
 * close), which calls down into the functions below and nothing else of
 * store.c. Apart from ssd_int.h because it needs threads and the
 * allocator, which the pure rec.c must not see.
 */
#ifndef MC_SSD_STORE_INT_H
#define MC_SSD_STORE_INT_H

#include <pthread.h>
#include <stdatomic.h>

#include "common/extalloc.h"
#include "common/lhash.h"
#include "ssd/ssd_int.h"

struct metric;
struct metrics_registry;

enum ent_state { ENT_WRITING, ENT_COMMITTING, ENT_LIVE, ENT_DEAD };

/* An object of the table (the key follows the struct). */
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
	struct mc_lhash tab;          /* chains of entries by hnext (common/lhash.h) */
	size_t nents;                 /* entries in the table */
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
	struct ssd_req *streams; /* streamed puts not fed whole (through next) */
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

/* Growable byte buffers. Errors: -ENOMEM. */
int ssd__bbuf_reserve(struct bbuf *b, size_t more) MC_MUST_CHECK;
void ssd__bbuf_free(struct bbuf *b);
/* Metrics: registered once at open (r may be NULL), gauges refreshed. */
void ssd__register_metrics(struct ssd_store *s, struct metrics_registry *r);
void ssd__update_gauges(struct ssd_store *s);
/* The object table: lookup (not DEAD), a new entry (NULL: no memory),
 * insertion (errors: -ENOMEM growing the table), removal from the table
 * and the seq list, and an entry's extent back to the allocator. */
struct ssd__ent *ssd__find(const struct ssd_store *s, const void *key, size_t klen);
struct ssd__ent *ssd__ent_new(const void *key, size_t klen);
int ssd__ent_insert(struct ssd_store *s, struct ssd__ent *e) MC_MUST_CHECK;
void ssd__ent_unlink(struct ssd_store *s, struct ssd__ent *e);
void ssd__extent_free(struct ssd_store *s, struct ssd__ent *e);
/* The PUT record of a live entry. */
struct ssd__rec ssd__put_rec(const struct ssd__ent *e);
/* End a request: its callback runs on the owner's thread with status. */
void ssd__complete_req(struct ssd_req *r, int status);
/* Start a group commit when records wait and none runs. */
void ssd__maybe_commit(struct ssd_store *s);
/* Wake the sync lane. */
void ssd__kick_sync(struct ssd_store *s);
/* Give up a running compaction (ssd.index.new removed). */
void ssd__compact_abort(struct ssd_store *s);

#endif
