/*
 * core: the master's pure cores, shared by their files, the service and
 * the unit tests. Nothing here does I/O, reads a clock or calls rand():
 * time is an argument (now_ms, any monotonic millisecond clock), so tests
 * drive them with a fake clock (STYLE.md rule 6; the Makefile's purity
 * check holds every file of them to it). This header includes only libc
 * and common/err.h.
 *
 *   alloc  per-segment offset allocator: size classes (TLSF-like: exact
 *          classes for small sizes, four per power of two above) for
 *          allocation, free ranges kept in an offset-ordered treap for
 *          coalescing with both neighbours and for reserving a given
 *          range (inventory re-sync). Allocated ranges cost nothing: the
 *          caller passes (offset, len) back to free them.
 *   core   segments, agents, the object index (key -> size, replicas,
 *          lease, soft pin, TTL, LRU position, checksum), placement,
 *          eviction, PENDING put timeouts, agent expiry and put leases;
 *          in core.c, index.c, segment.c and lease.c (core_int.h).
 *   mlog   per segment, the log of changes to its COMPLETE replicas that
 *          the owner agent follows to keep its mirror (SyncSegment).
 *   tiers  the SSD tier: demotion of cold DRAM objects to SSD segments,
 *          eviction past an SSD segment's watermark, objects stored or
 *          lost there by its owner, promotion back to DRAM (tier.c).
 */
#ifndef MC_MASTER_CORE_H
#define MC_MASTER_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

/* ------------------------------------------------------------ alloc */

/* Every allocation is a multiple of this and aligned to it. */
#define MASTER_ALLOC_GRANULE 64u
#define MASTER_ALLOC_NBINS 256

struct master_alloc;

/* An allocator for [0, size). Errors: -EINVAL (size 0 or not a multiple
 * of MASTER_ALLOC_GRANULE after rounding down to it), -ENOMEM. seed
 * drives the treap's priorities. */
int master__alloc_new(uint64_t size, uint64_t seed, struct master_alloc **out) MC_MUST_CHECK;
void master__alloc_free(struct master_alloc *a);

/* The length allocated for an object of size bytes (0 for 0). */
uint64_t master__alloc_len(uint64_t size);

/* Allocate len bytes (a multiple of the granule, > 0). Errors:
 * MC_ENO_SPACE (no free range that large), -EINVAL, -ENOMEM. */
int master__alloc_get(struct master_alloc *a, uint64_t len, uint64_t *off) MC_MUST_CHECK;
/* Mark [off, off+len) allocated. Errors: -EBUSY (not entirely free),
 * -EINVAL (unaligned or out of range), -ENOMEM. */
int master__alloc_reserve(struct master_alloc *a, uint64_t off, uint64_t len) MC_MUST_CHECK;
/* Free [off, off+len), coalescing with free neighbours. Errors: -EINVAL
 * (unaligned, out of range, or overlapping free space: a double free),
 * -ENOMEM (a new free range could not be recorded; the space is lost). */
int master__alloc_put(struct master_alloc *a, uint64_t off, uint64_t len) MC_MUST_CHECK;

/* Free bytes (O(1), unlike master__alloc_stats). */
uint64_t master__alloc_free_bytes(const struct master_alloc *a);

struct master_alloc_stats {
	uint64_t size, used, free;
	uint64_t largest_free;
	uint64_t free_ranges;
	double fragmentation; /* 1 - largest_free / free; 0 when free is 0 */
};
void master__alloc_stats(const struct master_alloc *a, struct master_alloc_stats *st);
/* Walk the free ranges in offset order (tests: compare with a model). */
void master__alloc_foreach_free(const struct master_alloc *a,
				void (*fn)(void *ud, uint64_t off, uint64_t len), void *ud);
/* Size class of a length (tests). */
unsigned master__alloc_class(uint64_t len);

/* ------------------------------------------------------------ mlog */

/* = MirrorEvent.Op. FETCH (SSD segments only): an order to the owner to
 * copy the object (key, size, crc) into the segment; offset is unused. */
enum master_ev_op { MASTER_EV_ADD = 0, MASTER_EV_DEL = 1, MASTER_EV_FETCH = 2 };
#define MASTER_EV_F_CRC 0x1u /* crc is the value's checksum */
#define MASTER_EV_F_SOFT_PIN 0x2u

/* One change; key borrowed. */
struct master_ev {
	uint64_t seq, offset, size;
	uint32_t crc;
	uint16_t klen;
	uint8_t op, flags;
	const uint8_t *key;
};

struct master_mlog;

/*
 * A log complete after start_seq, keeping at most budget_bytes of
 * records (the newest one always: past the budget the oldest go, and an
 * owner asking for them is behind). Errors: -ENOMEM.
 */
int master__mlog_new(size_t budget_bytes, uint64_t start_seq,
		     struct master_mlog **out) MC_MUST_CHECK;
void master__mlog_free(struct master_mlog *l);
/* Empty, complete after start_seq, nothing acknowledged. */
void master__mlog_reset(struct master_mlog *l, uint64_t start_seq);
/* Append e (seq above every earlier one; key copied). Errors: -ENOMEM
 * (the change is lost: the log is emptied and complete only after
 * e->seq, so its owner is behind and lists the segment). */
int master__mlog_append(struct master_mlog *l, const struct master_ev *e) MC_MUST_CHECK;
/* The change with seq was lost without being recorded (as -ENOMEM). */
void master__mlog_lose(struct master_mlog *l, uint64_t seq);
/* The owner applied everything up to seq: free it. */
void master__mlog_ack(struct master_mlog *l, uint64_t seq);
/*
 * Call fn (in order) for the changes after `after`, at most max_events
 * and, beyond the first, max_bytes of keys; *nread tells how many.
 * Errors: MC_ECOMPACTED (the changes right after `after` are gone, or
 * `after` is not from this log: the owner is behind).
 */
int master__mlog_read(const struct master_mlog *l, uint64_t after, size_t max_events,
		      size_t max_bytes, void (*fn)(void *ud, const struct master_ev *e),
		      void *ud, size_t *nread) MC_MUST_CHECK;
/* Would a read after `after` return something (changes, or behind)? */
bool master__mlog_has_after(const struct master_mlog *l, uint64_t after);

struct master_mlog_stats {
	uint64_t base, last, acked, records;
	size_t bytes;
};
void master__mlog_stats(const struct master_mlog *l, struct master_mlog_stats *st);

/* ------------------------------------------------------------ core */

#define MASTER_MAX_KEY_BYTES 4096u
#define MASTER_MAX_REPLICAS 16u
#define MASTER_NO_SEGMENT UINT32_MAX

enum master_tier { MASTER_TIER_DRAM = 0, MASTER_TIER_SSD = 1 };
enum master_rep_state { MASTER_REP_PENDING = 0, MASTER_REP_COMPLETE = 1 };

/* A replica: 12 bytes, 4-aligned, so that an object of one replica and a
 * short key fits a smaller malloc chunk (an index of millions of objects
 * is mostly these). Segment slots stay below MASTER_SEG_SLOTS_MAX. */
struct __attribute__((packed, aligned(4))) master_rep {
	uint64_t offset;
	uint32_t seg : 31;  /* segment slot (master__seg) */
	uint32_t state : 1; /* enum master_rep_state */
};

#define MASTER_SEG_SLOTS_MAX (1u << 31)

#define MASTER_OBJ_PENDING 0x1u
#define MASTER_OBJ_SOFT_PIN 0x2u
#define MASTER_OBJ_LRU_PIN 0x4u   /* on the pinned LRU list */
#define MASTER_OBJ_CRC 0x8u       /* crc is the value's CRC-32C */
#define MASTER_OBJ_READ 0x10u     /* read since eviction last passed it */
#define MASTER_OBJ_SSD 0x20u      /* no replica in DRAM: on the SSD LRU list */
#define MASTER_OBJ_DEMOTING 0x40u /* a copy to an SSD segment is on its way */

/*
 * One object: 56 bytes plus 12 per replica plus the key, in one
 * allocation. Replicas follow the header, then the key bytes. The key's
 * hash is not kept: the index computes it again where it needs it.
 */
struct master_obj {
	struct master_obj *hnext;       /* hash chain */
	struct master_obj *prev, *next; /* LRU list, or the PENDING list */
	uint64_t size;
	/* COMPLETE: read lease end. PENDING: when PutStart ran. */
	uint64_t lease_or_start_ms;
	/* COMPLETE: TTL expiry (0: none). PENDING: the TTL asked for. */
	uint64_t ttl_ms;
	uint32_t crc; /* with MASTER_OBJ_CRC */
	uint16_t klen;
	uint8_t nrep;
	uint8_t flags;
	struct master_rep rep[];
};

static inline const uint8_t *master__obj_key(const struct master_obj *o)
{
	return (const uint8_t *)&o->rep[o->nrep];
}

struct master_seg {
	char *name;
	uint64_t name_hash; /* mc_hash64 of name: what master__seg_find compares first */
	struct master_agent *agent;
	enum master_tier tier;
	uint64_t base, size;
	/* Replicas take whole blocks: MASTER_ALLOC_GRANULE in DRAM, the
	 * owner's block in an SSD segment (whose owner chooses offsets). */
	uint64_t block;
	/* SSD segments: evict past high_watermark of size, eviction_ratio of
	 * size a round (the owner's, or the core's). */
	double high_watermark, eviction_ratio;
	uint64_t promised;  /* SSD: bytes of demotions on their way here */
	unsigned demotions; /* SSD: demotions on their way here */
	struct master_alloc *alloc;
	uint64_t replicas;
	bool syncing;            /* mounted with resync; no placements until inventory done */
	struct master_mlog *log; /* changes for the owner's mirror */
	uint64_t log_id;         /* unique per segment incarnation */
	/* Space leased to the owner (LeaseSpace) and not committed yet: the
	 * free ranges of this allocator (allocated in alloc). */
	struct master_alloc *lease;
	uint64_t leased;      /* bytes */
	uint64_t rleased;     /* ... of them leased to other agents */
	uint64_t lease_epoch; /* new at every mount */
};

/* An agent process's instance token: random, kept in its data dir, and
 * named by its successor's mounts (master__mount_seg). */
#define MASTER_INSTANCE_MAX 32
#define MASTER_PREVIOUS_MAX 4

struct master_agent {
	struct master_agent *next;
	char *id;
	uint64_t last_heartbeat_ms;
	unsigned nsegs;
	uint8_t instance[MASTER_INSTANCE_MAX]; /* the last mount's */
	uint8_t instance_len;                  /* 0: none given */
};

struct master_core_opts {
	/* Also how long a demotion may take before it is given up. */
	uint64_t put_timeout_ms;
	uint64_t lease_ttl_ms;
	uint64_t agent_ttl_ms;
	double high_watermark;   /* eviction starts above used/capacity this */
	double eviction_ratio;   /* of capacity, freed per eviction round */
	uint64_t seed;           /* allocator treaps */
	size_t mirror_log_bytes; /* per segment (0: 16 MiB) */
};

/* Counters; read them through master__core_counters. */
struct master_counters {
	uint64_t puts, put_starts, put_revokes, put_timeouts;
	uint64_t gets, hits, misses;
	uint64_t evictions, evicted_bytes, eviction_rounds;
	uint64_t lease_waits;
	uint64_t removes, ttl_expired;
	uint64_t quarantined; /* forced removals of leased objects */
	uint64_t agents_expired;
	uint64_t agents_restarted;           /* dropped for their successor's mount */
	uint64_t mirror_events, mirror_lost; /* appended; dropped unacknowledged */
	uint64_t commits, commit_refusals;   /* BatchCommit items sealed / not */
	uint64_t lease_grants, lease_granted_bytes, lease_released_bytes;
	/* The SSD tier (tier.c): demotions started, done, given up (by the
	 * owner, or timed out); objects promoted back to DRAM; replicas
	 * evicted from SSD segments, with their bytes; puts stored straight
	 * on an SSD segment; replicas an owner lost (bad bytes). */
	uint64_t demotion_starts, demotions, demotion_failures;
	uint64_t promotions, ssd_evictions, ssd_evicted_bytes, ssd_puts, ssd_lost;
};

struct master_core;

/* Errors: -EINVAL (a ratio outside (0, 1]), -ENOMEM. */
int master__core_new(const struct master_core_opts *o, struct master_core **out) MC_MUST_CHECK;
/* Free everything (objects, segments, agents). */
void master__core_free(struct master_core *c);
/* Drop every object, segment and agent (a leader stepping down). The
 * objects are out of the index at once and freed in the reaper's steps
 * (master__reap_step), as the caller's loop has time. */
void master__core_reset(struct master_core *c);

/* Segments (slots are stable while mounted). NULL for a free slot. */
const struct master_seg *master__seg(const struct master_core *c, uint32_t id);
uint32_t master__seg_slots(const struct master_core *c);
/* Slot of a mounted segment by name, or MASTER_NO_SEGMENT. */
uint32_t master__seg_find(const struct master_core *c, const char *name);

/*
 * Mount a segment for an agent (created on first mount; counts as a
 * heartbeat). Mounting again with the same agent, tier, base and size is
 * allowed: with resync false it drops every replica there first (a
 * restarted agent), with resync true it keeps them; either way space
 * leased before is taken back and a new lease epoch begins. *mirror_seq
 * (may be NULL) gets where the owner's mirror follows the segment's log
 * from (MountSegmentResponse.mirror_seq). Errors: -EINVAL (empty name or
 * agent, size below one granule, base + size overflows), -EEXIST (the
 * name is mounted by another agent or with another geometry),
 * MC_ENO_SPACE (MASTER_SEG_SLOTS_MAX segments mounted), -ENOMEM.
 */
int master__mount(struct master_core *c, const char *name, const char *agent,
		  enum master_tier tier, uint64_t base, uint64_t size, bool resync,
		  uint64_t now_ms, uint64_t *mirror_seq) MC_MUST_CHECK;
/* The same with a segment's tier properties (master__mount: a DRAM
 * segment's, or an SSD segment's defaults). */
struct master_mount {
	const char *name, *agent;
	enum master_tier tier;
	uint64_t base, size;
	/* 0: MASTER_ALLOC_GRANULE; else a power of two multiple of it (an
	 * SSD segment's block: DRAM segments take only the granule). */
	uint64_t block_bytes;
	/* SSD segments: (0, 1], or 0 for the core's high_watermark and
	 * eviction_ratio. */
	double high_watermark, eviction_ratio;
	bool resync;
	/* The agent process's instance token (at most MASTER_INSTANCE_MAX
	 * bytes; len 0: none), and the tokens of the processes before it on
	 * the same data dir, each instance_len long, concatenated (at most
	 * MASTER_PREVIOUS_MAX). A mount one of whose previous tokens is the
	 * instance the master knows for its agent is that agent restarted:
	 * what the old process mounted is dropped at once, as at its expiry,
	 * instead of refusing the new segment until then. */
	const uint8_t *instance, *previous;
	size_t instance_len, previous_len;
};
/* Errors: as master__mount; -EINVAL also for a block or ratio out of
 * range, and -EEXIST for another block size than the mounted one's. */
int master__mount_seg(struct master_core *c, const struct master_mount *mt, uint64_t now_ms,
		      uint64_t *mirror_seq) MC_MUST_CHECK;
/* Bytes a replica of size bytes takes in s (0 for 0). */
static inline uint64_t master__rep_len(const struct master_seg *s, uint64_t size)
{
	return size ? (size + s->block - 1) & ~(s->block - 1) : 0;
}
/* The segment goes, with its replicas (see the reaper below): *slot
 * (may be NULL) gets the slot it leaves, for master__reap_removed, and
 * *replicas_dropped (may be NULL) the replicas it had. Errors:
 * MC_ESEGMENT_NOT_FOUND, -EACCES (owned by another agent). */
int master__unmount(struct master_core *c, const char *name, const char *agent, uint32_t *slot,
		    uint64_t *replicas_dropped) MC_MUST_CHECK;
/*
 * The reaper. A segment that goes (its agent's expiry, its unmount, or
 * its agent's restart) leaves at once: its slot is emptied, its space
 * and log freed, and its replicas read as gone from then on — every
 * lookup drops those of the object it finds, and removes an object left
 * with none (or a put in flight that had one there). The rest of them
 * go in a walk over the whole index, in steps, so that no expiry holds
 * the caller's loop for the length of the index (0.4 s a million
 * objects in one go). The slot is taken by no mount until a walk that
 * began after the segment went has ended. Until then the index's object
 * count includes objects only the walk has still to remove.
 *
 * master__reap_step walks on until it has looked at `budget` objects or
 * more, calls done(ud, r) for each segment whose replicas are all gone,
 * and says true when nothing is left to reap.
 */
struct master_reaped {
	uint32_t slot; /* it left */
	const char *name;
	uint64_t dropped; /* replicas it had */
	uint64_t removed; /* objects that went with it */
};
bool master__reap_pending(const struct master_core *c);
bool master__reap_step(struct master_core *c, size_t budget,
		       void (*done)(void *ud, const struct master_reaped *r), void *ud);
/* Objects removed so far with the segment that left slot, while the
 * reaper is not done with it (0 after). */
uint64_t master__reap_removed(const struct master_core *c, uint32_t slot);
/* A heartbeat: returns true when the agent is known (has segments
 * mounted), false when it must re-sync. */
bool master__heartbeat(struct master_core *c, const char *agent, uint64_t now_ms);
/* An inventory item: a COMPLETE replica the agent holds. */
struct master_inv_item {
	const uint8_t *key;
	size_t klen;
	const char *segment;
	uint64_t offset, size;
	bool soft_pin;
	bool has_crc;
	uint32_t crc;
};

/* One inventory item of an agent's re-sync: a COMPLETE replica at
 * (segment, offset). The same replica reported again is accepted
 * unchanged. Errors: MC_ESEGMENT_NOT_FOUND (or not the agent's), -EINVAL
 * (key), MC_EOBJECT_ALREADY_EXISTS (the key is PENDING, has another size
 * or checksum, or another replica on that segment), -EBUSY (the space is
 * taken), -ENOMEM. */
int master__inventory_add(struct master_core *c, const char *agent,
			  const struct master_inv_item *it, uint64_t now_ms) MC_MUST_CHECK;
/* The agent's re-sync is complete: its segments take placements. */
void master__inventory_done(struct master_core *c, const char *agent);

struct master_put {
	const uint8_t *key;
	size_t klen;
	uint64_t size;
	unsigned replica_num;  /* 0: 1 */
	const char *preferred; /* segment name or NULL/"" */
	bool soft_pin;
	uint64_t ttl_ms;
};

/*
 * Start a put: allocate replica_num placements on distinct DRAM segments
 * (the preferred one first if it has room, then the emptiest), evicting in
 * LRU order when nothing fits. *out (borrowed, valid until the next core
 * call) is the PENDING object. Errors: -EINVAL (key length, replica_num
 * above MASTER_MAX_REPLICAS), MC_EOBJECT_ALREADY_EXISTS, MC_ENO_SPACE
 * (fewer usable segments than replica_num, or eviction cannot make room),
 * -ENOMEM.
 */
int master__put_start(struct master_core *c, const struct master_put *p, uint64_t now_ms,
		      const struct master_obj **out) MC_MUST_CHECK;
/* Seal a put: its replicas become COMPLETE (logged for each segment's
 * mirror), with the value's CRC-32C when crc is not NULL. Errors:
 * -EINVAL, MC_EOBJECT_NOT_FOUND, MC_EINVALID_REPLICA (not PENDING). */
int master__put_end(struct master_core *c, const uint8_t *key, size_t klen,
		    const uint32_t *crc, uint64_t now_ms) MC_MUST_CHECK;
int master__put_revoke(struct master_core *c, const uint8_t *key, size_t klen) MC_MUST_CHECK;
/* A COMPLETE object, leased to the reader until now + lease_ttl and
 * moved to the LRU tail. Errors: -EINVAL, MC_EOBJECT_NOT_FOUND. */
int master__get(struct master_core *c, const uint8_t *key, size_t klen, uint64_t now_ms,
		const struct master_obj **out) MC_MUST_CHECK;
/* The key of item j of a batch (for master__prefetch_ahead). */
typedef const uint8_t *(*master_key_at_fn)(const void *batch, size_t j, size_t *klen);
/* A hint, called before the lookup of item i of a batch of n: it loads
 * into the cache, a few items ahead, what their lookups will read (the
 * key's hash bucket, then the first object of its chain), so that the
 * cache misses of several keys overlap instead of coming one after
 * another. It changes nothing. */
void master__prefetch_ahead(const struct master_core *c, const void *batch, size_t n, size_t i,
			    master_key_at_fn key_at);
/* 1 COMPLETE, 0 not (or PENDING), -EINVAL. */
int master__exist(struct master_core *c, const uint8_t *key, size_t klen,
		  uint64_t now_ms) MC_MUST_CHECK;
/* Errors: -EINVAL, MC_EOBJECT_NOT_FOUND (also PENDING),
 * MC_EOBJECT_HAS_LEASE (leased and not forced). */
int master__remove(struct master_core *c, const uint8_t *key, size_t klen, bool force,
		   uint64_t now_ms) MC_MUST_CHECK;
/*
 * A removal walk over the whole index (RemoveAll, RemoveRegex), in steps
 * so that the caller's loop serves other calls between them: it removes
 * every COMPLETE object whose key match accepts (NULL: every one),
 * leased ones only with force; skipped counts the leased ones left, and
 * with pending the PENDING ones too (which are not asked about).
 *
 * master__walk_begin opens it; master__walk_step walks on, whole buckets
 * at a time, until it has looked at `budget` objects or more, and says
 * true once the walk is over (closed). While a walk is open the index
 * adds no bucket (its chains grow longer and catch up after), so a
 * bucket position names the same chain from one step to the next and
 * each object in the index at the start is looked at exactly once.
 * Objects put meanwhile may be removed or not. A walk given up before
 * its end is closed with master__walk_abort; master__core_reset wants
 * none open.
 */
struct master_walk {
	bool (*match)(void *ud, const uint8_t *key, size_t klen);
	void *ud;
	bool force, pending;
	bool open;
	size_t bucket;             /* the next one to walk */
	uint64_t removed, skipped; /* so far */
};
void master__walk_begin(struct master_core *c, struct master_walk *w);
bool master__walk_step(struct master_core *c, struct master_walk *w, size_t budget,
		       uint64_t now_ms);
void master__walk_abort(struct master_core *c, struct master_walk *w);
/* A walk that only looks (List): fn(ud, o) for each object, replicas of
 * segments gone dropped first (fn NULL: only that); fn returns false to
 * end the walk. As master__walk_step, true once the walk is over; the
 * walk's match, force, pending and counts are not used. */
bool master__scan_step(struct master_core *c, struct master_walk *w, size_t budget,
		       bool (*fn)(void *ud, const struct master_obj *o), void *ud);
/* The walks above run in one step. */
void master__remove_all(struct master_core *c, bool force, uint64_t now_ms, uint64_t *removed,
			uint64_t *skipped);
void master__remove_match(struct master_core *c,
			  bool (*match)(void *ud, const uint8_t *key, size_t klen), void *ud,
			  bool force, uint64_t now_ms, uint64_t *removed, uint64_t *skipped);
/* Drop the object's COMPLETE replica on segment slot seg and free its
 * space (the object goes with its last one). Errors: -EINVAL (key),
 * MC_EOBJECT_NOT_FOUND (no such COMPLETE object, or no replica there),
 * MC_EOBJECT_HAS_LEASE (read lease held). */
int master__replica_clear(struct master_core *c, const uint8_t *key, size_t klen, uint32_t seg,
			  uint64_t now_ms) MC_MUST_CHECK;
/* Lookup without TTL expiry (NULL if absent); replicas of segments gone
 * are dropped on the way (the reaper). */
const struct master_obj *master__find(struct master_core *c, const uint8_t *key, size_t klen);

/* Timers: PENDING puts past --put-timeout are revoked, agents silent for
 * --agent-ttl expire, part of the index is swept for TTL expiry,
 * demotions past --put-timeout are given up, and the DRAM tier and every
 * SSD segment are brought under their watermarks. */
void master__tick(struct master_core *c, uint64_t now_ms);
/* The caller's loop was held for held_ms (a long call on it, the process
 * stopped): the heartbeats sent meanwhile wait unread in their sockets,
 * so that time does not count against the agents. Their --agent-ttl
 * moves on by it; call before the tick that would judge them. Returns
 * how many agents it moved. */
unsigned master__loop_held(struct master_core *c, uint64_t held_ms);
/*
 * One eviction round if DRAM usage, less what demotions on their way
 * will free, is above the watermark (also run after each put start). A
 * call evicts a few dozen objects at most (a tick some thousands): a
 * larger round goes on at the next calls, above the watermark or not,
 * until it has freed its share.
 * With SSD segments mounted the round demotes instead of evicting (see
 * tier.c): the coldest objects are given to an SSD segment (the one of
 * their DRAM replica's agent first, then the one with the most room),
 * and leave DRAM once their owner stored them; objects no SSD segment
 * can take are evicted. Returns the DRAM bytes freed or being freed.
 */
uint64_t master__evict_if_needed(struct master_core *c, uint64_t now_ms);
/*
 * Hold (or let go) the watermark rounds of master__evict_if_needed: while
 * a new leader's agents are still re-syncing, the DRAM capacity it knows
 * is only that of the segments mounted so far, and a round would evict
 * the objects of the first full segment to come back (a put that needs
 * room still evicts). The master holds them while it settles.
 */
void master__core_hold_eviction(struct master_core *c, bool hold);

struct master_core_stats {
	uint64_t objects, pending, key_bytes, index_bytes;
	uint64_t dram_capacity, dram_used, ssd_capacity, ssd_used;
	uint64_t segments, agents;
	uint64_t ssd_objects;              /* objects with no DRAM replica */
	uint64_t demoting, demoting_bytes; /* demotions on their way (DRAM bytes) */
};
void master__core_stats(const struct master_core *c, struct master_core_stats *st);
const struct master_counters *master__core_counters(const struct master_core *c);
const struct master_agent *master__agents(const struct master_core *c);

/* ------------------------------------------------------------ leases
 * Space delegated to a segment's owner for puts it seals with one call
 * (proto/master.proto, "Put leases"). Leased space is allocated in the
 * segment (it counts as used) and is the free space of the segment's
 * lease allocator until committed or released. */

/* Lease up to want bytes of the agent's segment in the current epoch
 * (one extent of at least MASTER_LEASE_MIN_BYTES; at most an eighth of
 * the segment leased and uncommitted at once, and no more than keeps
 * DRAM usage under the eviction watermark: a lease never evicts);
 * *len 0: none (no room, or the segment is re-syncing). Errors:
 * MC_ESEGMENT_NOT_FOUND, -EACCES (another agent's), MC_EINVALID_REPLICA
 * (not the segment's lease epoch), -ENOMEM. */
#define MASTER_LEASE_MIN_BYTES (64u * 1024)
int master__lease_grant(struct master_core *c, const char *agent, const char *segment,
			uint64_t epoch, uint64_t want, uint64_t *off,
			uint64_t *len) MC_MUST_CHECK;
/* Take back [off, off+len) of the agent's leased space; returns the bytes
 * taken back (0: not leased in that epoch, nothing done). */
uint64_t master__lease_release(struct master_core *c, const char *agent, const char *segment,
			       uint64_t epoch, uint64_t off, uint64_t len);

/* A remote lease: space of another agent's segment for puts the caller
 * writes there and seals with one BatchCommit (proto/master.proto, "Put
 * leases"). Usable for ttl_ms (the --put-timeout) from the grant; then
 * what was not committed goes back (master__tick). One holder at most a
 * 32nd of the segment, all holders an eighth. (The owner's commits are
 * checked to be in leased space, not in its own extents: agents commit
 * only what they were granted.) epoch 0: the current one,
 * returned in g with the segment's base address. *g's length 0: none.
 * Errors: MC_ESEGMENT_NOT_FOUND, -EINVAL (no agent, or the owner: use
 * master__lease_grant), MC_EINVALID_REPLICA (not the current epoch),
 * -ENOMEM. */
struct master_rlease_grant {
	uint64_t offset, length, epoch, base, ttl_ms;
};
#define MASTER_AGENT_ID_MAX 256
int master__rlease_grant(struct master_core *c, const char *agent, const char *segment,
			 uint64_t epoch, uint64_t want, uint64_t now_ms,
			 struct master_rlease_grant *g) MC_MUST_CHECK;

struct master_commit {
	const uint8_t *key;
	size_t klen;
	uint64_t offset, size;
	bool has_crc;
	uint32_t crc;
	bool soft_pin;
	uint64_t ttl_ms;
	/* A promotion: the key exists in SSD segments only (with this size
	 * and checksum), and this DRAM copy replaces its SSD replicas. */
	bool promote;
};

/* Seal an object written into leased space: COMPLETE at once, one
 * replica (logged for the mirror). Errors: MC_ESEGMENT_NOT_FOUND,
 * MC_EINVALID_REPLICA (the space is not leased to the agent in epoch —
 * its own, or a live remote lease on another's segment) — nothing
 * changes; -EINVAL (key),
 * MC_EOBJECT_ALREADY_EXISTS, -ENOMEM — the space is freed. A promotion
 * (it->promote) adds the replica to the object instead and drops its SSD
 * replicas; refused (the space freed) with MC_EOBJECT_NOT_FOUND (gone)
 * or MC_EINVALID_REPLICA (it has a DRAM replica, is being demoted, or has
 * another size or checksum). */
int master__commit(struct master_core *c, const char *agent, const char *segment,
		   uint64_t epoch, const struct master_commit *it,
		   uint64_t now_ms) MC_MUST_CHECK;

/* ------------------------------------------------------------ tiers
 * What an SSD segment's owner tells the master (TierCommit): the owner
 * chooses the offsets there (its store allocates them), in whole blocks
 * of the segment. */
enum master_tier_op {
	/* A new object the owner stored (a put naming the SSD tier). */
	MASTER_TIER_PUT = 0,
	/* A FETCH order carried out: the object is stored at offset. */
	MASTER_TIER_DEMOTED = 1,
	/* A FETCH order the owner could not carry out. */
	MASTER_TIER_ABANDONED = 2,
	/* The owner lost the object's replica at offset (its bytes failed
	 * their checksum): the replica leaves the index. */
	MASTER_TIER_LOST = 3,
};

struct master_tier_item {
	const uint8_t *key;
	size_t klen;
	uint64_t offset, size;
	bool has_crc;
	uint32_t crc;
	bool soft_pin;   /* PUT */
	uint64_t ttl_ms; /* PUT; 0: none */
};

/*
 * Apply one item of an SSD segment's owner. Errors: MC_ESEGMENT_NOT_FOUND,
 * -EACCES (another agent's segment), -EINVAL (not an SSD segment; key;
 * PUT or DEMOTED: size 0, offset not a multiple of the block or out of
 * range), MC_EOBJECT_ALREADY_EXISTS (PUT: the key exists), -EBUSY (the
 * space is taken), MC_EINVALID_REPLICA (DEMOTED, ABANDONED: no demotion
 * of the key to this segment is on its way — it was removed, evicted or
 * given up meanwhile; DEMOTED: another size or checksum), MC_EOBJECT_NOT_FOUND
 * (LOST: no replica of the key at offset), -ENOMEM. A refused PUT or
 * DEMOTED leaves the index as it was: the owner deletes its copy.
 */
int master__tier_update(struct master_core *c, const char *agent, const char *segment,
			enum master_tier_op op, const struct master_tier_item *it,
			uint64_t now_ms) MC_MUST_CHECK;
/* Where a demotion of the object under key reads it from: a DRAM replica
 * (its segment slot and offset), for the FETCH order the owner of the
 * SSD segment receives. false: the key is not being demoted. */
bool master__demote_source(struct master_core *c, const uint8_t *key, size_t klen,
			   uint32_t *seg, uint64_t *offset);

/* The newest mirror-log sequence number handed out (any segment). */
uint64_t master__ev_seq(const struct master_core *c);
/* Hand out numbers above floor from now on (a new leader starts above
 * every number an earlier leader can have handed out, so an owner's
 * acknowledgement meant for an earlier log never frees a newer one's
 * changes, and a commit or lease call naming an earlier leader's lease
 * epoch never matches one of this leader's). Mirror-log numbers and
 * lease epochs alike. */
void master__ev_seq_floor(struct master_core *c, uint64_t floor);
/*
 * A page of segment id's COMPLETE replicas (ListSegment): fn(ud, o, i)
 * for object o's replica i there, from *cursor (0 to start) until at
 * least limit items, fn returned false, or a bounded slice of the index
 * was visited (whole hash buckets only); *cursor is where to go on.
 * Returns true when the whole index was visited. Objects present during
 * the whole listing are visited at least once (the index only grows, by
 * doubling, which keeps a bucket's objects at or after its position).
 */
bool master__list_segment(const struct master_core *c, uint32_t id, uint64_t *cursor,
			  size_t limit,
			  bool (*fn)(void *ud, const struct master_obj *o, unsigned i),
			  void *ud);

#endif
