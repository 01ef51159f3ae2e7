/*
 * op.h: the operations — what the agent does for each client request.
 * A request's state (struct agent_req) and the steps every operation
 * shares (op_common.c), then each operation's entry points, by file:
 *
 *   ops.c        the dispatch, and the small ops: hello, exist, remove,
 *                remove_all, stats, release
 *   op_put.c     put
 *   op_get.c     get, and the read leases of cached replicas and of
 *                zero-copy views
 *   op_buf.c     buffers (register, unregister, alloc), transfers, the
 *                session's own engine, segment probes
 *   op_common.c  the shared steps
 *
 * The operations are the top of the agent's calls: they call the parts
 * below (server, space, mlink, batch, mcall, stats) and the services
 * (pool, xfer, mem, inv, lcache); nothing below calls them (the server
 * reaches the dispatch through the on_request hook agent.c sets). Of the
 * op files, ops.c calls the others and op_*.c call only op_common.c.
 */
#ifndef MC_AGENT_OP_H
#define MC_AGENT_OP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "agent/lcache.h"
#include "agent/pool.h"
#include "agent/server.h"
#include "client.pb-c.h"
#include "common/pb.h"
#include "common/uframe.h"
#include "master.pb-c.h"

/* Values of a get's spill area start at multiples of this. */
#define AGENT_SPILL_ALIGN 64u

struct agent;
struct agent_conn;
struct agent_map;
struct agent_inst;
struct agent_xfer;
struct te_engine;
struct te_region;

/* One item of a request (a key of a put or get, a piece of a transfer). */
struct agent_item {
	const uint8_t *key; /* borrowed from the request message */
	size_t klen;
	int err;
	uint8_t *ptr; /* client memory: source or destination */
	uint64_t len; /* source length, or destination capacity (a
				 get's spill slot's once placed) */
	bool has_dest;
	bool zero_copy;
	uint64_t size; /* object size (gets) */
	uint32_t crc;  /* the value's CRC-32C: computed (puts), known (gets) */
	bool has_crc;
	uint32_t got_crc; /* a remote read's: of the bytes that landed */
	bool leased;      /* put into leased space: sealed by BatchCommit */
	unsigned lease_gen;
	bool rleased; /* ... of another agent's segment (reps[0]) */
	uint64_t rlease_epoch;
	struct agent_rep *reps;
	unsigned nrep;
	/* get of a cached replica on another segment: its bytes, read and
	 * then checked before use (owned) */
	bool probing;
	uint8_t *scratch;
	/* get of a replica in an SSD tier: asked again once when it was gone
	 * (promoted or evicted meanwhile); read by this agent's tier (its
	 * bytes then in scratch, aligned), or by another's into memory of its
	 * own (hold: what to give back once read); ssd_cached: the replica
	 * came from the lease cache (gone, it asks the master without using
	 * up the once). */
	bool ssd_again, ssd_own, ssd_cached;
	uint64_t ssd_hold;
	/* ... copied back to DRAM too (a promotion): put-lease space */
	bool promo;
	unsigned promo_gen;
	uint64_t promo_off;
	bool placed; /* its destination is decided (ptr, where) */
	/* get results */
	int where; /* Mooncake__Client__GetResult__Where */
	uint64_t offset;
	uint64_t view;
	/* transfer */
	bool write;
	const char *target;
	uint64_t remote;
	struct te_region *proc; /* the target is a client's process memory
				   published here (reached through it) */
	bool device;            /* ptr is a client's device memory (its
				   address there): RDMA moves it, nothing else */
};

/* A client request. server.c makes it (the fields up to start_ns) and
 * frees it (agent__req_end); the operation fills the rest and releases
 * it (agent__op_finish). */
struct agent_req {
	struct agent_conn *c;
	struct agent *a;
	uint64_t id;
	Mooncake__Client__Request *msg; /* owned, in arena */
	struct mc_pbarena arena;
	int fds[MC_UFRAME_MAX_FDS]; /* attached, owned until used */
	unsigned nfds;
	int op; /* Request op case */
	uint64_t start_ns;
	uint64_t held; /* reply budget reserved (server.c) */
	/* the operation's */
	struct agent_map **maps; /* references held (distinct) */
	unsigned nmaps, maps_cap;
	struct agent_item *items;
	size_t n;
	uint64_t sent_ms; /* when the master call went out */
	struct agent_job job;
	struct agent_xfer *xfer; /* remote pieces started from the loop */
	bool solo;               /* copying on the loop, alone (solo_get) */
	/* get */
	struct agent_map *spill; /* attached to the reply */
	uint64_t spill_len;      /* its size, reserved (0: none) */
	struct agent_wait wait;  /* for the reservation */
	bool send_segment_fd;
	/* the master request in flight (one malloc'd block, freed with the
	 * request) */
	void *mstate;
	void *mstate2;   /* a second one (BatchCommit) */
	unsigned mcalls; /* master calls the request waits for */
	/* a put streamed into the SSD tier: bytes copied so far */
	struct agent_tier_stream *stream;
	uint64_t streamed;
	unsigned ssd_pending; /* reads of SSD tiers it waits for */
	/* the session's own engine, held for the request (agent__op_te) */
	struct agent_inst *inst;
	/* attached descriptors mapped as regions */
	struct agent_map *att[MC_UFRAME_MAX_FDS];
	uint8_t *att_base[MC_UFRAME_MAX_FDS];
	uint64_t att_len[MC_UFRAME_MAX_FDS];
};

/* ------------------------------------------------------------ op_common.c */

/* The end of a request: count it (err: its result) and release what its
 * operation held, then the request itself (agent__req_end). */
void agent__op_finish(struct agent_req *r, int err);
/* Reply with err (why: the message, NULL for err's text) and finish. */
void agent__op_fail(struct agent_req *r, int err, const char *why);
/* Keep a reference on m for the request's lifetime. Errors: -ENOMEM. */
int agent__op_hold(struct agent_req *r, struct agent_map *m) MC_MUST_CHECK;
/* Whether p lies in memory r holds (agent__op_hold, its spill area) that
 * is on huge pages: the SSD tier moves bytes there without staging. */
bool agent__req_huge(const struct agent_req *r, const uint8_t *p);
/*
 * Client memory of a region: *ptr and its usable length (the region's
 * length, checked against what backs it). Errors: -ENOENT (unknown
 * buffer), -ERANGE (outside), -EBADF/-EPERM/-EACCES/-EINVAL (attached
 * descriptor refused), -EINVAL (a buffer of process memory, which only
 * the transfer engine reaches, for peers), -ENOMEM.
 */
int agent__op_region(struct agent_req *r, const Mooncake__Client__Region *g,
		     uint8_t **ptr) MC_MUST_CHECK;
/* A region naming a buffer of the session's device memory (a dma-buf):
 * *iova, the memory's address in the client, which the engine's RDMA
 * NICs know it by. Errors: -ENOENT (not such a buffer), -ERANGE,
 * -ENOMEM. */
int agent__op_device(struct agent_req *r, const Mooncake__Client__Region *g,
		     uint8_t **iova) MC_MUST_CHECK;
/* The transfer engine the request's session uses: its own (held for the
 * request: the session may close meanwhile), else the agent's (NULL when
 * the agent runs none). */
struct te_engine *agent__op_te(struct agent_req *r);
/* n zeroed items. Errors: -ENOMEM. */
int agent__op_items(struct agent_req *r, size_t n) MC_MUST_CHECK;
/* Copy a master replica list into an item (at most AGENT_MAX_REPLICAS;
 * an SSD replica is named by its owner's agent id). Errors: -ENOMEM (the
 * replicas taken so far stay with the item). */
int agent__op_replicas(struct agent *a, struct agent_item *it,
		       Mooncake__Master__Replica *const *reps, size_t n) MC_MUST_CHECK;
/*
 * Move len bytes between client memory and a local replica; with crc,
 * the CRC-32C of the bytes moved is computed in the same pass. Runs on a
 * copy thread (or inline for small ones; with help, a copy without crc
 * is shared with one of its copy threads: agent__pool_copy). Offsets are
 * checked against the segment's bounds: the master's answer is not
 * trusted with the agent's memory. Errors: MC_EINVALID_REPLICA.
 */
int agent__op_local_io(struct agent *a, const struct agent_rep *p, uint8_t *mem, uint64_t len,
		       bool write, uint32_t *crc, struct agent_pool *help);

/* A BatchKeysRequest (and a BatchRemoveRequest of the same keys) of the
 * items a filter selects, in one block; idx maps request positions back
 * to items; crcs holds the items' checksums (attach them for
 * BatchPutEnd). */
struct agent_keys_block {
	Mooncake__Master__BatchKeysRequest req;
	Mooncake__Master__BatchRemoveRequest rm; /* the same keys */
	size_t *idx;
	uint32_t *crcs;
	ProtobufCBinaryData keys[];
};
/* NULL: out of memory. */
struct agent_keys_block *agent__op_keys_block(struct agent_req *r,
					      bool (*want)(const struct agent_item *));
/* The filter of the items without an error. */
bool agent__op_item_ok(const struct agent_item *it);
/* The request's master block (freed with it, or when replaced). */
void agent__op_set_mstate(struct agent_req *r, void *p);
/*
 * Start x's remote pieces from the loop (agent__xfer_start_loop), make
 * the local copies meanwhile (copy_local), and have done(j) run once the
 * pieces are over; done begins with agent__op_end_from_loop. False — x
 * dropped, nothing sent — when a segment was not open yet: the request
 * takes the copy thread's way.
 */
bool agent__op_start_from_loop(struct agent_req *r, struct agent_xfer *x,
			       void (*copy_local)(struct agent_req *r),
			       void (*done)(struct agent_job *j));
/* First thing in a done of agent__op_start_from_loop: the pieces'
 * outcome is in their items' errors. */
struct agent_req *agent__op_end_from_loop(struct agent_job *j);

/* ------------------------------------------------------------ op_put.c */

void agent__op_put(struct agent_req *r);

/* ------------------------------------------------------------ op_get.c */

/* The gets' state, embedded in struct agent (touched only by op_get.c). */
struct agent_gets {
	/* --ssd-promote-on-hit: an object read from this agent's SSD tier is
	 * copied back to its DRAM segment when the put lease has room */
	bool promote_on_hit;
	/* --remote-lease-cache-size: replicas on other agents' segments are
	 * cached for values up to this size, read and checked against their
	 * checksum before a get uses them (get_probe) */
	uint64_t remote_cache_bytes;
	uint64_t lease_ttl_ms; /* the master's read lease TTL */
	uv_timer_t view_timer; /* renews the zero-copy views' leases */
	bool view_renew_busy;
};

void agent__gets_init(struct agent *a, uint64_t remote_cache_bytes, bool promote_on_hit);
/* Start renewing the views' leases (the timer); stop, and close it
 * (returns how many handles: 1; on_closed gets it with data pointing at
 * the agent). */
void agent__gets_start(struct agent *a);
void agent__gets_stop(struct agent *a);
unsigned agent__gets_close(struct agent *a, uv_close_cb on_closed);
/* The master's read lease TTL as last learned (told to clients). */
uint64_t agent__lease_ttl_ms(const struct agent *a);
void agent__op_get(struct agent_req *r);

/* ------------------------------------------------------------ op_buf.c */

void agent__op_register_buffer(struct agent_req *r);
void agent__op_unregister_buffer(struct agent_req *r);
void agent__op_alloc_buffer(struct agent_req *r);
void agent__op_transfer(struct agent_req *r);
/* A session's own engine (EngineRequest), and a segment's description
 * (SegmentRequest). */
void agent__op_engine(struct agent_req *r);
void agent__op_segment(struct agent_req *r);

/* ------------------------------------------------------------ ops.c */

/* Serve a checked request (the server's on_request hook). */
void agent__dispatch(struct agent_req *r);

#endif
