/*
 * agent_int: what the agent's files share.
 *
 *   agent.c    lifecycle, options, metrics, the segment
 *   mem.c      memfds (huge pages, NUMA, seals), mappings, client memfd
 *              checks
 *   pool.c     copy threads: jobs run off the loop, completions back on it
 *   server.c   the Unix socket: sessions, frames, descriptors, replies
 *   req.c      request validation (pure: also the fuzz target's entry)
 *   ops.c      the operations: put, get, exist, remove, buffers, transfer
 *   mlink.c    the master: discovery (fixed or meta leader key), mount,
 *              heartbeats, re-sync with inventory, calls with redirects
 *   mirror.c   the segment mirror: following the master's log of the
 *              segment's changes (SyncSegment), listing it when behind,
 *              and checking bytes against checksums before a re-sync
 *   space.c    the put lease: space of the segment the master delegated,
 *              for puts sealed with one call (BatchCommit)
 *   inv.c      the mirror's table: every COMPLETE object in this agent's
 *              segment, whoever wrote it (pure)
 *
 * Everything runs on the loop thread except job bodies in pool.c, which
 * touch only the memory their job owns (mappings hold references taken
 * on the loop before the job is queued and dropped after it completes).
 */
#ifndef MC_AGENT_AGENT_INT_H
#define MC_AGENT_AGENT_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "agent/agent.h"
#include "agent/batch.h"
#include "agent/mcall.h"
#include "agent/mirror.h"
#include "agent/mlink.h"
#include "agent/server.h"
#include "agent/space.h"
#include "agent/stats.h"
#include "client.pb-c.h"
#include "common/uframe.h"
#include "master.pb-c.h"

struct rpc_client;
struct metric;

#define AGENT_MAX_KEY_BYTES 4096u
#define AGENT_MAX_ITEMS 65536u        /* per request */
#define AGENT_MAX_INFLIGHT 256u       /* requests per session */
#define AGENT_MAX_BUFFERS 4096u       /* per session */
#define AGENT_MAX_VIEWS 65536u        /* per session */
#define AGENT_MAX_REPLICAS 16u
#define AGENT_SPILL_ALIGN 64u
#define AGENT_INVENTORY_BATCH 1000u   /* items per inventory heartbeat */

/* ------------------------------------------------------------ mem.c */

/* A shared mapping of a memfd, reference-counted on the loop thread. */
struct agent_map {
	unsigned refs;
	int fd;            /* the memfd (owned) */
	uint8_t *addr;     /* mapping of [map_off, map_off + len) */
	size_t len;
	bool hugepages;
	struct agent *a;
	struct te_region *region; /* registered with the engine, or NULL */
};

struct agent_memfd_opts {
	const char *name;
	size_t len;
	enum agent_hugepages hugepages;
	int numa_node;     /* -1: none */
	bool populate;
};

/*
 * A new memfd of len bytes, sealed against shrinking and growing, mapped
 * read-write, with one reference. Huge pages: AUTO tries them and falls
 * back (*used_huge tells), ON fails with MC_ECONFIG. Errors: negative
 * errno of memfd_create/ftruncate/mmap, MC_ECONFIG (NUMA or huge pages).
 */
int agent__memfd_new(struct agent *a, const struct agent_memfd_opts *o,
		     struct agent_map **out) MC_MUST_CHECK;

/*
 * Check and map a client's memfd: it must be a memfd (sealable, with
 * F_SEAL_SHRINK), owned by uid (unless uid is 0), open read-write, and
 * at least off + len bytes long. Maps [off rounded down to a page,
 * off + len) shared. On success *out holds one reference and *base the
 * address of byte off. Takes ownership of fd on success only. Errors:
 * -EBADF (not a memfd), -EPERM (another user's), -EACCES (not writable),
 * -EINVAL (not sealed against shrinking, range, size), negative errno of
 * mmap.
 */
int agent__map_client_fd(struct agent *a, int fd, uid_t uid, uint64_t off,
			 uint64_t len, struct agent_map **out,
			 uint8_t **base) MC_MUST_CHECK;

void agent__map_ref(struct agent_map *m);
/* Drop a reference; the last one unregisters, unmaps and closes. */
void agent__map_unref(struct agent_map *m);

/* min(1 GiB, physical RAM / 4), rounded down to 2 MiB. */
uint64_t agent__default_segment_bytes(void);

/* ------------------------------------------------------------ pool.c */

struct agent_job {
	struct agent_job *next;
	void (*run)(struct agent_job *j);  /* on a copy thread */
	void (*done)(struct agent_job *j); /* on the loop thread */
	bool threaded;                     /* given to the copy threads */
};

struct agent_pool {
	pthread_t *threads;
	unsigned nthreads;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct agent_job *head, *tail;      /* queued */
	struct agent_job *done_head, *done_tail;
	bool quit;
	uv_async_t async;
	unsigned pending;                   /* queued or running (loop) */
	unsigned threaded;                  /* of them, the copy threads' */
	/* Optional: threaded (and maybe pending) fell to 0 in a round of
	 * completions. */
	void (*on_idle)(void *ud);
	void *idle_ud;
	bool started, closing;
};

int agent__pool_start(struct agent_pool *p, uv_loop_t *loop,
		      unsigned nthreads) MC_MUST_CHECK;
/* Queue a job; done runs later on the loop thread. */
void agent__pool_submit(struct agent_pool *p, struct agent_job *j);
/* A job whose work runs elsewhere (its run unused): counted as pending
 * from agent__pool_begin (loop thread) until agent__pool_complete (any
 * thread, once) has its done run on the loop thread. */
void agent__pool_begin(struct agent_pool *p, struct agent_job *j);
void agent__pool_complete(struct agent_pool *p, struct agent_job *j);
/* On the loop thread: a begun job's work is over already; run its done
 * now (no wake-up through the pool). */
void agent__pool_done_now(struct agent_pool *p, struct agent_job *j);
/* On the loop thread: memcpy with a copy thread's help — both take
 * 64 KiB chunks until none is left, so a helper that starts late finds
 * less to do (never slower than alone, up to twice as fast); returns when
 * every byte is copied. The helper's job is detached: it is not pending
 * and its end wakes no one (a late helper finds nothing left and frees
 * the copy's state if it is the last out). Small copies, or no memory:
 * plain memcpy. */
void agent__pool_copy(struct agent_pool *p, void *dst, const void *src, size_t len);
/* Jobs queued or running (begun, for agent__pool_begin's), and of them
 * those the copy threads run. */
unsigned agent__pool_pending(const struct agent_pool *p);
unsigned agent__pool_threaded(const struct agent_pool *p);
bool agent__pool_started(const struct agent_pool *p);
/* Join the threads (every job must have completed) and close the async
 * handle (on_closed runs from the loop and gets it with data). */
void agent__pool_stop(struct agent_pool *p, uv_close_cb on_closed, void *data);

/* ------------------------------------------------------------ inv.c */

/* What the mirror knows of one object in the segment. */
struct agent_inv_rec {
	uint64_t offset, size;
	uint32_t crc;
	bool has_crc;   /* crc is the value's CRC-32C */
	bool soft_pin;
};

struct agent_inv_entry {
	struct agent_inv_entry *next; /* hash chain */
	struct agent_inv_rec rec;
	uint64_t seq;                 /* order of the last change here */
	unsigned epoch;               /* the listing that last touched it */
	uint16_t klen;
	uint8_t key[];
};

struct agent_inv {
	struct agent_inv_entry **tab;
	size_t nbuckets, n;
	uint64_t seq;
	unsigned epoch;               /* the listing in progress (or last) */
};

int agent__inv_init(struct agent_inv *v) MC_MUST_CHECK;
void agent__inv_free(struct agent_inv *v);
/* Record (or replace) the object key at rec's place. Errors: -EINVAL
 * (key length), -ENOMEM. */
int agent__inv_add(struct agent_inv *v, const uint8_t *key, size_t klen,
		   const struct agent_inv_rec *rec) MC_MUST_CHECK;
/* Forget the object key (wherever it is). */
void agent__inv_del(struct agent_inv *v, const uint8_t *key, size_t klen);
/* Forget the object key only if it is at offset (a change for another
 * placement of the key is not about this entry). Returns true if it was. */
bool agent__inv_del_at(struct agent_inv *v, const uint8_t *key, size_t klen,
		       uint64_t offset);
void agent__inv_clear(struct agent_inv *v);
/* How many objects it holds. */
size_t agent__inv_count(const struct agent_inv *v);
/*
 * Listings. A listing of the segment runs while the mirror keeps
 * following the log; every change (agent__inv_add/_del*) marks what it
 * touches with the current epoch. agent__inv_listing_start begins a new
 * epoch; the listing's items are added like changes; at its end
 * agent__inv_listing_end forgets every entry the epoch did not touch
 * (neither listed nor changed since the listing began: it was gone
 * before its page was read). Returns how many went.
 */
void agent__inv_listing_start(struct agent_inv *v);
size_t agent__inv_listing_end(struct agent_inv *v);
/*
 * A snapshot for a re-sync: copies of the entries sorted by offset,
 * where of two that overlap only the newer is kept (the older one's
 * space was reused; its bytes are gone). The dropped ones are deleted
 * from the inventory. *out is a malloc'd array of malloc'd copies (free
 * each, then the array). Errors: -ENOMEM.
 */
int agent__inv_snapshot(struct agent_inv *v, struct agent_inv_entry ***out,
			size_t *n) MC_MUST_CHECK;

/* ------------------------------------------------------------ replicas */

/* Where an object's bytes are (the master's placement, or the lease
 * cache's memory of it). */
struct agent_rep {
	bool local;
	uint64_t offset;   /* in its segment */
	uint64_t address;  /* remote address */
	char *segment;     /* name (owned) */
};

/* ------------------------------------------------------------ lcache.c */

struct agent_lentry {
	struct agent_lentry *next;
	uint64_t size, until_ms;
	uint64_t refresh_ms;    /* a hit from here on renews the lease */
	bool refreshing;        /* a renewal is on its way */
	uint32_t crc;           /* with has_crc: the value's CRC-32C */
	bool has_crc;
	struct agent_rep rep;   /* segment owned */
	uint16_t klen;
	uint8_t key[];
};

struct agent_lcache {
	struct agent_lentry **tab;
	size_t nbuckets, n, capacity;
	uint64_t hits;
};

#define AGENT_LCACHE_ENTRIES 65536u
/* A get's cached replicas on other segments are read and checked on the
 * loop up to this many bytes in all; beyond, the master is asked. */
#define AGENT_PROBE_MAX_BYTES (1u << 20)

int agent__lcache_init(struct agent_lcache *lc, size_t capacity) MC_MUST_CHECK;
void agent__lcache_free(struct agent_lcache *lc);
void agent__lcache_clear(struct agent_lcache *lc);
/* The entry for key while now is inside its window (borrowed until the
 * next change), else NULL. *renew: set when this hit falls in the second
 * half of the window and no renewal is on its way (the caller renews the
 * lease with agent__lcache_extend, or lets the entry expire). */
const struct agent_lentry *agent__lcache_get(struct agent_lcache *lc, const uint8_t *key,
					     size_t klen, uint64_t now_ms, bool *renew);
/* The entry for key, expired or not (borrowed until the next change). */
const struct agent_lentry *agent__lcache_peek(struct agent_lcache *lc, const uint8_t *key,
					      size_t klen);
/* A renewal of key's lease came back: the entry's window now ends at
 * until_ms when its replica is still (offset, size) in its segment; any
 * other answer drops the entry. */
void agent__lcache_extend(struct agent_lcache *lc, const uint8_t *key, size_t klen,
			  uint64_t offset, uint64_t size, uint64_t until_ms, uint64_t now_ms);
/* Remember rep (copied) for key until until_ms, with the value's
 * checksum (crc NULL: none); best effort. */
void agent__lcache_put(struct agent_lcache *lc, const uint8_t *key, size_t klen,
		       uint64_t size, const uint32_t *crc, const struct agent_rep *rep,
		       uint64_t until_ms, uint64_t now_ms);
void agent__lcache_del(struct agent_lcache *lc, const uint8_t *key, size_t klen);

/* ------------------------------------------------------------ agent */

struct agent {
	uv_loop_t *loop;
	struct metrics_registry *metrics;
	struct te_engine *te;
	struct rpc_server *rpc;
	char *rpc_listen;
	char name[128];               /* segment name = agent id */
	bool named;
	uint64_t staging_bytes;
	int numa_node;
	enum agent_hugepages hugepages;
	struct agent_map *seg;        /* the DRAM segment */
	struct te_region *seg_region; /* it, registered with the engine */
	int seg_ro_fd;                /* read-only descriptor of it */
	struct agent_pool pool;
	struct agent_inv inv;
	struct agent_lcache lc;
	/* --remote-lease-cache-size: replicas on other agents' segments are
	 * cached for values up to this size, read and checked against their
	 * checksum before a get uses them (ops.c, get_probe) */
	uint64_t remote_cache_bytes;
	struct agent_batch batch;
	bool stopping, stopped;
	atomic_bool stop_flag;        /* stopping, for the copy threads */
	bool mlink_stopped, handles_closed;
	void (*on_stopped)(void *ud);
	void *stop_ud;
	unsigned closing;             /* handles whose close callback is owed */
	uv_timer_t start_timer;
	/* zero-copy views: lease renewal */
	uv_timer_t view_timer;
	bool view_renew_busy;
	uint64_t lease_ttl_ms;
	struct agent_stats stats;
	struct agent_mcalls mcalls;
	struct agent_space space;
	struct agent_mirror mirror;
	struct agent_mlink mlink;
	struct agent_server server;
};

/* agent.c */
/* The master's read lease TTL, learned from its replies. */
void agent__set_lease_ttl(struct agent *a, uint64_t ms);

/* req.c */
/*
 * Check a decoded request against the protocol's limits before anything
 * is done with it: the op is known, nfds is within bounds, item counts,
 * key lengths (per item: -EINVAL marks the item), region kinds and
 * fd_index values. Returns 0, or the error to reply with (-EINVAL,
 * -EOPNOTSUPP for an unknown op, MC_EPROTOCOL for hello out of place);
 * *why names the problem. Pure.
 */
int agent__req_check(const Mooncake__Client__Request *m, bool hello_done,
		     const char **why) MC_MUST_CHECK;
/* Is a key acceptable (1..AGENT_MAX_KEY_BYTES)? */
bool agent__key_ok(const ProtobufCBinaryData *k);

/* xfer.c: remote reads and writes through the transfer engine, on a
 * copy thread. add() records a piece (its error goes to *err, which must
 * stay valid until finish; an item already failed is skipped); start()
 * submits them all; finish() waits and frees. Without an engine every
 * piece fails with MC_EUNAVAILABLE. */
struct agent_xfer;
struct agent_xfer *agent__xfer_new(void);
void agent__xfer_add(struct agent *a, struct agent_xfer *x, const char *segment,
		     bool write, void *local, uint64_t remote, size_t len, int *err);
void agent__xfer_start(struct agent *a, struct agent_xfer *x);
void agent__xfer_finish(struct agent *a, struct agent_xfer *x);
/* The same from the loop thread, without a copy thread: an xfer from
 * agent__xfer_new_loop takes only segments the engine has open already
 * (agent__xfer_missed says one was not: drop it with finish, nothing was
 * sent, and go the copy-thread way); agent__xfer_start_loop submits and
 * has j's done run on the loop when every piece is over (counted as a
 * pending job of the pool), where finish returns at once — or returns
 * true when every piece is over already (copied by the loop itself): the
 * caller then finishes j with agent__pool_done_now when it is ready. */
struct agent_xfer *agent__xfer_new_loop(void);
bool agent__xfer_missed(const struct agent_xfer *x);
/* Let agent__xfer_start_loop copy up to bytes of same-host pieces on the
 * loop itself (te_submit_inline): for a request alone, see solo_get. */
void agent__xfer_inline(struct agent_xfer *x, size_t bytes);
bool agent__xfer_start_loop(struct agent *a, struct agent_xfer *x, struct agent_job *j);

/* ops.c */
void agent__renew_views(struct agent *a);

#endif
