/*
 * core_int: what the master core's files share and nobody else may use.
 * The core's contract is core.h; like it, everything here is pure
 * (time is an argument) and includes only libc and common/.
 *
 *   core.c     the core object and the life of an object in it: puts
 *              (placement, eviction), gets, removes, TTLs, the mirror log
 *              of every COMPLETE replica's change, the quarantine of space
 *              a reader may still read, the timers, the statistics
 *   index.c    the object index: hash table, LRU and PENDING lists, the
 *              memory they take; lookups, walks and segment listings
 *   segment.c  segments and agents: mount, unmount, heartbeats, an
 *              agent's inventory re-sync and expiry, capacity
 *   lease.c    put leases: space of a segment delegated to its owner or,
 *              for a while, to another agent, and the commits that seal
 *              objects written there
 *   tier.c     the SSD tier: demotions to SSD segments, eviction past an
 *              SSD segment's watermark, what an SSD segment's owner
 *              stored or lost there
 *
 * Each part's state is a struct of its own, embedded in struct
 * master_core and touched only by its file: the others go through the
 * functions below. The counters (c->n) are the exception: each file
 * counts its own events there, and only core.c reads them.
 */
#ifndef MC_MASTER_CORE_INT_H
#define MC_MASTER_CORE_INT_H

#include <string.h>

#include "common/lhash.h"
#include "master/core.h"

static inline bool master__key_ok(size_t klen)
{
	return klen >= 1 && klen <= MASTER_MAX_KEY_BYTES;
}

/* A COMPLETE object under a read lease at now_ms. */
static inline bool master__leased(const struct master_obj *o, uint64_t now_ms)
{
	return !(o->flags & MASTER_OBJ_PENDING) && o->lease_or_start_ms > now_ms;
}

/* ------------------------------------------------------------ index.c */

struct master_lru {
	struct master_obj *head, *tail; /* least recently used first */
	uint64_t n;
};

/* COMPLETE objects with a DRAM replica are on the plain or the pinned
 * list, those without one (MASTER_OBJ_SSD) on the SSD list. */
enum master_list {
	MASTER_LIST_PLAIN,
	MASTER_LIST_PINNED,
	MASTER_LIST_PENDING,
	MASTER_LIST_SSD,
	MASTER_LISTS
};

struct master_index {
	struct mc_lhash tab; /* chains of struct master_obj by hnext */
	uint64_t nobjs, npending, key_bytes, obj_bytes;
	uint64_t nttl; /* objects with a TTL (PENDING ones too): the sweep's work */
	struct master_lru lists[MASTER_LISTS];
	size_t sweep_pos;
	unsigned walks; /* removal walks open: no bucket is added meanwhile */
};

/* Errors: -ENOMEM. */
int master__index_init(struct master_index *ix) MC_MUST_CHECK;
/* Free every object (the index stays usable). */
void master__index_clear(struct master_index *ix);
void master__index_free(struct master_index *ix);
/* Up to `splits` buckets more while the index is behind its load (a
 * walk held its growth, and no put came since to catch up), unless a
 * walk is open. */
void master__index_catch_up(struct master_index *ix, size_t splits);
/* Hand ix's objects over in *out and leave ix empty, for
 * master__index_free_step (out of memory: they are freed at once and
 * *out is empty). */
void master__index_detach(struct master_index *ix, struct mc_lhash *out);
/* Free the objects of a table handed over, from bucket *pos on, until
 * `budget` objects or more went; true once all did (the table freed). */
bool master__index_free_step(struct mc_lhash *t, size_t *pos, size_t budget);

/* A stepped-down leader's index, freed by the reaper in steps (10M
 * objects are 1.2 s of free()s, too long for a loop meta's Raft may
 * share). */
struct master_grave {
	struct master_grave *next;
	struct mc_lhash tab;
	size_t pos;
};
/* A new object with nrep zeroed replicas, not in the index (NULL: out of
 * memory). */
struct master_obj *master__obj_new(const uint8_t *key, size_t klen, unsigned nrep);
/* Take o in: its flags and ttl_ms say which list and what it counts. */
void master__index_link(struct master_index *ix, struct master_obj *o);
/* Take o out and free it. */
void master__index_del(struct master_index *ix, struct master_obj *o);
struct master_obj *master__index_find(const struct master_index *ix, const uint8_t *key,
				      size_t klen);
/* master__prefetch_ahead's stages: the bucket of the key, then the
 * first object of the bucket's chain. */
enum master_prefetch { MASTER_PREFETCH_BUCKET, MASTER_PREFETCH_OBJECT };
void master__index_prefetch(const struct master_index *ix, const uint8_t *key, size_t klen,
			    enum master_prefetch stage);
/* o was read: marked, so that eviction gives it a second chance. */
void master__index_touch(struct master_obj *o);
/* A walk of an LRU list reached o, *next being the object after it: if o
 * was read since a walk last passed it, it goes to the tail of its list
 * unmarked and this returns true (skip it); when it was the last, *next
 * becomes o, so the walk meets it again last. */
bool master__index_second_chance(struct master_index *ix, struct master_obj *o,
				 struct master_obj **next);
/* A PENDING o becomes COMPLETE: flags updated, onto its LRU list's tail. */
void master__index_seal(struct master_index *ix, struct master_obj *o);
/* o's flags become flags; when that changes its list, onto the new
 * list's tail. */
void master__index_set_flags(struct master_index *ix, struct master_obj *o, uint8_t flags);
/* Objects on list l. */
uint64_t master__index_count(const struct master_index *ix, enum master_list l);
/* o with one more replica, COMPLETE, at (seg, offset); o is reallocated
 * (NULL: out of memory, o unchanged). */
struct master_obj *master__index_add_replica(struct master_index *ix, struct master_obj *o,
					     uint32_t seg, uint64_t offset);
/* The head of a list; the rest follow through o->next. */
struct master_obj *master__index_oldest(const struct master_index *ix, enum master_list l);
/* Hash slots, for walks over every object: the chain of slot b starts at
 * master__index_slot and goes on through o->hnext (read it before
 * deleting o). A slot's objects stay at or after its position while the
 * index grows. */
size_t master__index_slots(const struct master_index *ix);
struct master_obj *master__index_slot(const struct master_index *ix, size_t b);
/* The next `slots` slots of a round over the index (none while no object
 * has a TTL): fn(ud, o) for each object; fn may delete o. */
void master__index_sweep(struct master_index *ix, size_t slots,
			 void (*fn)(void *ud, struct master_obj *o), void *ud);
/* Fills objects, pending, key_bytes and index_bytes. */
void master__index_stats(const struct master_index *ix, struct master_core_stats *st);

/* ------------------------------------------------------------ segment.c */

/*
 * A slot whose segment went (its agent's expiry, unmount or restart)
 * while replicas in the index still name it: the slot is NULL, so every
 * such replica reads as gone (master__obj_prune drops it where an object
 * is looked at), and no mount takes the slot until the reaper's walk
 * that began after it went has passed every object (master__reap_step).
 */
struct master_dead {
	uint32_t id;
	uint64_t pass;    /* the reaper's walk that frees the slot at its end */
	char *name;       /* the segment's, for the log */
	uint64_t dropped; /* replicas it had */
	uint64_t removed; /* objects gone with it, so far */
};

struct master_segs {
	struct master_seg **v; /* by slot; NULL: free, or dead (below) */
	uint32_t cap, n;
	struct master_agent *agents;
	uint64_t nagents;
	uint64_t seed; /* the next allocator's treap seed */
	struct master_dead *dead;
	uint32_t ndead, dead_cap;
};

static inline struct master_seg *master__segs_at(const struct master_segs *sg, uint32_t id)
{
	return id < sg->cap ? sg->v[id] : NULL;
}

/* Segments mounted (master__seg_slots gives the slots). */
static inline uint32_t master__segs_count(const struct master_segs *sg)
{
	return sg->n;
}

void master__segs_init(struct master_segs *sg, uint64_t seed);
/* Free every segment and agent (their objects must be gone). */
void master__segs_clear(struct master_segs *sg);
void master__segs_free(struct master_segs *sg);
/* DRAM capacity (whole granules) and, in *used (may be NULL), what of it
 * is allocated. */
uint64_t master__dram_capacity(const struct master_core *c, uint64_t *used);
/* Agents silent for --agent-ttl leave with their segments. */
void master__agents_expire(struct master_core *c, uint64_t now_ms);
/* Fills segments, agents and the tiers' capacity and use. */
void master__segs_stats(const struct master_core *c, struct master_core_stats *st);

/* ------------------------------------------------------------ lease.c */

/* Remote leases: space of a segment leased to an agent that does not own
 * it, usable until until_ms (then what is left goes back). */
struct master_rlease {
	char agent[MASTER_AGENT_ID_MAX];
	uint32_t seg;
	uint64_t epoch, off, len, until_ms;
	uint64_t committed; /* bytes of it committed */
};

struct master_leases {
	struct master_rlease *rl;
	size_t nrl, rl_cap;
	uint64_t epoch_seq; /* last lease epoch handed out */
};

/* Forget every remote lease (their segments are gone). */
void master__leases_clear(struct master_leases *ls);
void master__leases_free(struct master_leases *ls);
/* Hand out epochs above floor from now on. */
void master__leases_floor(struct master_leases *ls, uint64_t floor);
/* A new segment's lease allocator: all of [0, size) allocated (nothing
 * leased). Errors: as master__alloc_new, master__alloc_reserve. */
int master__lease_space_new(uint64_t size, uint64_t seed,
			    struct master_alloc **out) MC_MUST_CHECK;
/* A new lease epoch for s: taken back whatever s has leased (a segment
 * mounted again), or a new segment's first. */
void master__lease_reset(struct master_core *c, struct master_seg *s);
/* Remote leases whose time is over (or whose segment was mounted again
 * or is gone) leave; what is left of them goes back to the free space. */
void master__leases_expire(struct master_core *c, uint64_t now_ms);

/* ------------------------------------------------------------ tier.c */

/* A demotion on its way: the owner of SSD segment seg (incarnation
 * log_id), promised len bytes there, copies the object under key, whose
 * DRAM replicas (dram_bytes) leave when it is done; given up at until_ms. */
struct master_demotion {
	uint8_t *key;
	uint16_t klen;
	uint32_t seg;
	uint64_t log_id;
	uint64_t len, dram_bytes;
	uint64_t until_ms;
};

struct master_tiers {
	struct master_demotion *v;
	size_t n, cap;
	uint64_t dram_bytes; /* of every demotion on its way */
};

/* Forget every demotion (their segments are gone). */
void master__tiers_clear(struct master_tiers *t);
void master__tiers_free(struct master_tiers *t);

enum master_demote {
	MASTER_DEMOTE_STARTED, /* o is on its way to an SSD segment */
	MASTER_DEMOTE_DONE,    /* o had an SSD replica: its DRAM ones left */
	MASTER_DEMOTE_BUSY,    /* SSD segments have room, not now: stop the round */
	MASTER_DEMOTE_NONE,    /* no SSD segment can take o: evict it */
};
/* Demote the COMPLETE, unleased o (not being demoted); *dram_bytes gets
 * the DRAM bytes it frees or will free. -ENOMEM is NONE. */
enum master_demote master__demote(struct master_core *c, struct master_obj *o, uint64_t now_ms,
				  uint64_t *dram_bytes);
/* o, being demoted, leaves the index: the demotion is forgotten. Returns
 * until when its DRAM bytes may still be read by the owner copying them. */
uint64_t master__demote_forget(struct master_core *c, const struct master_obj *o);
/* DRAM bytes that demotions on their way will free. */
uint64_t master__demoting_bytes(const struct master_core *c);
/* Demotions past their time, or to a segment gone or mounted again,
 * are given up. */
void master__tiers_tick(struct master_core *c, uint64_t now_ms);
/* Every SSD segment past its watermark evicts its coldest replicas. */
void master__ssd_evict_if_needed(struct master_core *c, uint64_t now_ms);
/* A new mount of SSD segment s: nothing is promised there any more. */
void master__tiers_seg_reset(struct master_seg *s);
/* Fills demoting and demoting_bytes. */
void master__tiers_stats(const struct master_core *c, struct master_core_stats *st);

/* ------------------------------------------------------------ core.c */

/* The object under key, or NULL; a COMPLETE one whose TTL passed (and is
 * not leased) is removed on the way. */
struct master_obj *master__lookup(struct master_core *c, const uint8_t *key, size_t klen,
				  uint64_t now_ms);
/* Remove o from the index and free its space on every segment. */
void master__obj_destroy(struct master_core *c, struct master_obj *o);
/* Take replica i out of o's array: the later ones and the key move down
 * (its segment's count, space and log are the caller's). */
static inline void master__rep_unlink(struct master_obj *o, unsigned i)
{
	uint8_t *p = (uint8_t *)&o->rep[i];
	memmove(p, p + sizeof(struct master_rep),
		(size_t)(o->nrep - i - 1) * sizeof(struct master_rep) + o->klen);
	o->nrep--;
}
/* Drop o's replicas on dead slots (struct master_dead): true when o went
 * with them (its last replica, or a put in flight). Every path that
 * reads or changes an object's replicas, other than destroying it,
 * prunes it first: lookups through master__obj_find, the LRU rounds
 * with this. */
bool master__obj_prune(struct master_core *c, struct master_obj *o);
/* master__index_find, pruned: NULL when absent or gone with its
 * segment. */
struct master_obj *master__obj_find(struct master_core *c, const uint8_t *key, size_t klen);
/* Append a change of o's replica i to its segment's mirror log. */
void master__mirror(struct master_core *c, const struct master_obj *o, unsigned i,
		    enum master_ev_op op);
/* Append op about o at offset to the log of segment seg. */
void master__mirror_seg(struct master_core *c, uint32_t seg, const struct master_obj *o,
			uint64_t offset, enum master_ev_op op);
/* Take replica i out of o: logged (a COMPLETE o), its space freed, or
 * held until until_ms (a reader may still read it; never for an SSD
 * segment, whose owner's store lets reads begun finish); the replicas
 * after it move down. o keeps its list: master__obj_retier after. */
void master__rep_drop(struct master_core *c, struct master_obj *o, unsigned i,
		      uint64_t until_ms);
/* MASTER_OBJ_SSD set when o (COMPLETE) has no DRAM replica, cleared when
 * it has one; a change moves it to the other list's tail. */
void master__obj_retier(struct master_core *c, struct master_obj *o);
/* The tier of o's replica i. */
enum master_tier master__rep_tier(const struct master_core *c, const struct master_obj *o,
				  unsigned i);
/* A new mirror-log sequence number (also a segment incarnation's id). */
uint64_t master__ev_next(struct master_core *c);

struct master_quarantine {
	uint32_t seg;
	uint64_t log_id; /* the segment's incarnation */
	uint64_t off, len, until_ms;
};

struct master_core {
	struct master_core_opts o;
	struct master_index ix;    /* index.c */
	struct master_segs segs;   /* segment.c */
	struct master_leases ls;   /* lease.c */
	struct master_tiers tiers; /* tier.c */
	uint64_t ev_seq;           /* last mirror-log sequence number handed out */
	bool evict_hold;           /* master__core_hold_eviction */
	uint64_t round_left;       /* bytes the watermark round in progress still frees */
	/* Space of objects removed by force while leased: allocated until
	 * their lease ends, so nothing new is written where a reader may
	 * still read (master__obj_destroy's quarantine, master__tick). */
	struct master_quarantine *quar;
	size_t nquar, quar_cap;
	/* The reaper (segment.c): its walk over the index, and how many
	 * walks it began. */
	struct master_walk reap;
	uint64_t reap_passes;
	struct master_grave *graves;
	struct master_counters n;
};

#endif
