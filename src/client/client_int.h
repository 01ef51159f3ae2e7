/*
 * Internals of libmooncake shared by its files (see mooncake.h for the
 * API). One handle is one connection to the agent:
 *   conn.c   the connection: open, hello, requests and their responses
 *   mem.c    client memory: the staging allocator, buffers the agent
 *            maps, the ranges a session registered
 *   put.c    puts          get.c   gets and views
 *   keys.c   exist, remove, stats      xfer.c  transfers
 *   device.c device memory (dma-bufs, CUDA)
 * Names here carry mc__; "_locked" ones expect the handle's mu held.
 */
#ifndef MC_CLIENT_INT_H
#define MC_CLIENT_INT_H

#include "common/err.h"
#include "common/io.h"
#include "common/uframe.h"
#include "client.pb-c.h"
#include "client/mooncake.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MC__PUBLIC __attribute__((visibility("default")))

#define PROTOCOL_VERSION 1u
#define ALIGN 64u
#define HUGE_ALIGN ((size_t)2 << 20)
#define MAX_REPLY_FDS MC_UFRAME_MAX_FDS

typedef Mooncake__Client__Request Request;
typedef Mooncake__Client__Response Response;
typedef Mooncake__Client__Region Region;

/* R_ALLOC: from mc_buffer_alloc; R_MEMFD: mc_register_memfd; R_HOST: an
 * mc_host_alloc allocation this session handed to its agent; R_PROC:
 * ordinary memory the agent reaches by cross-memory attach; R_SHADOW:
 * other registered memory, copied through staging; R_DEVICE: device
 * memory registered by a dma-buf, for peers' RDMA only. */
enum range_kind { R_ALLOC, R_MEMFD, R_SHADOW, R_HOST, R_PROC, R_DEVICE };

struct range {
	uint8_t *addr;
	size_t len;
	uint64_t id; /* the agent's buffer id (0 for shadow) */
	enum range_kind kind;
	void *map_base; /* R_ALLOC: the whole reservation */
	size_t map_len;
	uint64_t host_gen; /* R_HOST: which allocation */
	bool published;    /* published to the transfer engine */
};

struct block {
	size_t off, len;
};

/* Spill buffers: at most this many, of at most this many bytes in all. */
#define SPILL_SLOTS 4
#define SPILL_MAX_BYTES ((size_t)256 << 20)
#define SPILL_ALIGN ((size_t)2 << 20)

struct waiter {
	struct waiter *next;
	uint64_t id;
	bool done;
	Response *resp;
	int fds[MAX_REPLY_FDS];
	unsigned nfds;
};

struct mc_client {
	int fd;
	pthread_mutex_t mu;      /* everything below but rx */
	pthread_mutex_t send_mu; /* frame writes */
	pthread_cond_t cv;
	bool reader;    /* a thread is reading frames */
	int broken;     /* sticky error of the connection */
	int closed_why; /* the agent's reason, when it said one */
	uint64_t next_id;
	struct waiter *waiters;
	struct mc_uframe_rx rx; /* the reader's only */
	uint8_t *stg;
	size_t stg_len;       /* the room staging blocks come from */
	size_t stg_map_len;   /* mapped: stg_len and the table counts */
	struct block *blocks; /* allocated staging blocks, by offset */
	size_t nblocks, blocks_cap;
	struct range *ranges;
	size_t nranges, ranges_cap;
	const uint8_t *seg; /* read-only mapping of the agent segment */
	size_t seg_len;
	/* The agent's shared lease table (common/ltab.h), mapped read-only,
	 * or NULL; and this session's counts of the gets it answered (gets,
	 * bytes: in the staging memfd, where the agent reads them). */
	const uint8_t *ltab;
	size_t ltab_len;
	uint64_t *table_counts;
	unsigned ndevice; /* R_DEVICE ranges (under mu; read without it too) */
	char agent_addr[128];
	uint64_t segment_size;
	bool verify_gets; /* every get checks the bytes' checksum */
	/* Buffers (mc_buffer_alloc) kept to receive gets without a
	 * destination that do not fit in the staging memfd: reused, so a
	 * big value is not a fresh memfd whose every page faults on both
	 * sides (spill_take). busy: offered to a get in flight, or holding
	 * the bytes of a view. */
	struct spill_buf {
		uint8_t *buf;
		size_t cap;
		bool busy;
	} spills[SPILL_SLOTS];
};

struct mc_view {
	uint64_t id; /* the agent's view id (mapped), 0 for a copy */
	void *copy;
	int spill;   /* the spill buffer holding its bytes, or -1 */
	int64_t blk; /* or the staging block holding them, or -1 */
};

/* conn.c */
/*
 * Send req with fds and wait for its response in *w (req->id and
 * req->nfds are set here). Returns 0 with w->resp set (its error field
 * may be non-zero), or MC_EUNAVAILABLE / -ENOMEM / -EMSGSIZE.
 */
int mc__call(mc_client *c, Request *req, const int *fds, unsigned nfds, struct waiter *w);
/* Map the agent's segment read-only once (its descriptor came with a
 * reply: a view's, or the hello's with the shared lease table). 0 or a
 * negative errno. */
int mc__map_segment(mc_client *c, int fd);
/* Whether the agent's shared lease table (get.c) has key now: the object
 * exists at least until its read lease ends. */
bool mc__table_has(mc_client *c, const void *key, size_t klen);
/* Send req without waiting for a response (the reader drops one if it
 * comes). For requests whose outcome nobody can act on. */
void mc__send_only(mc_client *c, Request *req);
/* Free a waiter's response and close the descriptors that came with it. */
void mc__waiter_clear(struct waiter *w);

/* mem.c */
/* A staging block of len bytes (64-byte aligned): its offset, or -1. */
int64_t mc__stg_alloc(mc_client *c, size_t len);
/* The largest free gap, then up to want bytes of it (*got: how many). */
int64_t mc__stg_alloc_upto(mc_client *c, size_t want, size_t *got);
/* Free a block (off < 0 is a no-op). */
void mc__stg_free(mc_client *c, int64_t off);
/* A memfd of len bytes sealed against resizing: the descriptor, or a
 * negative errno. */
int mc__tmp_memfd(size_t len);
/* The agent-mapped range holding [p, p + len), under mu; NULL if none. */
const struct range *mc__find_agent_range_locked(mc_client *c, const void *p, size_t len);
/* Region of agent-mapped memory for [p, p + len): true if there is one. */
bool mc__agent_region(mc_client *c, const void *p, size_t len, Region *g);
/* Whether p lies in memory registered in this session (any kind); *room:
 * the bytes from p to that range's end. mc_host_alloc memory counts
 * (attached on the way). */
bool mc__registered_room(mc_client *c, const void *p, size_t *room);
/* Add a range under mu. Errors: -EEXIST (overlap), -ENOMEM. */
int mc__range_add_locked(mc_client *c, const struct range *r);
/* Remove the range starting at addr under mu; *out gets it. -ENOENT. */
int mc__range_del_locked(mc_client *c, const void *addr, struct range *out);
/* Whether [addr, addr + len) overlaps a range of the session. */
bool mc__overlaps(mc_client *c, const void *addr, size_t len);
/* Send a buffer registration (with fd attached unless fd < 0): 0 with
 * *id, or the agent's error. */
int mc__register_req(mc_client *c, Mooncake__Client__RegisterBufferRequest *q, int fd,
		     uint64_t *id);
/* Add the published range of the agent's buffer id (kind R_MEMFD,
 * R_PROC or R_DEVICE); when that fails, unregister the buffer. Errors:
 * those of mc__range_add_locked. */
int mc__range_add_buffer(mc_client *c, void *addr, size_t len, uint64_t id,
			 enum range_kind kind);
/* Unregister buffer id with the agent: 0 or an error. */
int mc__unregister_id(mc_client *c, uint64_t id);
/*
 * Hand memfd fd (borrowed) to the agent as a buffer of len bytes from
 * offset, living at addr here; published to the transfer engine at addr
 * when publish is set. *id: the agent's buffer id. Errors: those of
 * mc_register_memfd.
 */
int mc__register_fd(mc_client *c, int fd, uint64_t offset, void *addr, size_t len,
		    bool publish, uint64_t *id);

/* host.c */
/*
 * Attach the mc_host_alloc allocation holding [p, p + len) to session c
 * (whole, published when asked: an unpublished attachment is replaced).
 * Returns 0 (also when attached already), -ENOENT (not such memory, or
 * freed meanwhile), or an error of the agent's registration.
 */
int mc__host_attach(mc_client *c, const void *p, size_t len, bool publish);
/* Add / remove an open handle from those mc_host_free tells. -ENOMEM. */
int mc__host_track(mc_client *c);
void mc__host_untrack(mc_client *c);

/* device.c */
/* Device memory registered in this session at [p, p + len): 1 with *g
 * naming it (the agent moves it by RDMA only), 0 when the range touches
 * none, -EOPNOTSUPP when it is partly device memory. */
int mc__device_region(mc_client *c, const void *p, size_t len, Region *g);
/* Whether [p, p + len) touches device memory registered in this session
 * (cheap while there is none). */
bool mc__device_touch(mc_client *c, const void *p, size_t len);
/* Whether p is CUDA device memory (not managed memory), asked of the CUDA
 * driver only when this process has loaded it already. */
bool mc__cuda_device(const void *p);
bool mc__parts_on_device(mc_client *c, const struct mc_part *parts, size_t n);

static inline bool mc__key_ok(size_t klen)
{
	return klen >= 1 && klen <= MC_MAX_KEY_BYTES;
}

#endif
