/*
 * lcache.h: the lease cache (lcache.c) — replicas the agent holds a read
 * lease on, so that a get within the lease needs no master call. Pure; a
 * shared service of the get. struct agent_rep, a replica, is here: the
 * cache keeps them and the operations' items carry them.
 */
#ifndef MC_AGENT_LCACHE_H
#define MC_AGENT_LCACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

/* Where an object's bytes are (the master's placement, or the lease
 * cache's memory of it). */
struct agent_rep {
	bool local; /* in this agent's DRAM segment */
	/* In an SSD tier: segment is then its owner's agent id (this agent's
	 * own, or another's), local false. */
	bool ssd;
	uint64_t offset;  /* in its segment */
	uint64_t address; /* remote address */
	char *segment;    /* name (owned) */
};

struct agent_lentry {
	struct agent_lentry *next;
	uint64_t size, until_ms;
	uint64_t refresh_ms; /* a hit from here on renews the lease */
	bool refreshing;     /* a renewal is on its way */
	uint32_t crc;        /* with has_crc: the value's CRC-32C */
	bool has_crc;
	struct agent_rep rep; /* segment owned */
	uint16_t klen;
	uint8_t key[];
};

struct mc_ltab;

struct agent_lcache {
	struct agent_lentry **tab;
	size_t nbuckets, n, capacity;
	uint64_t hits;
	/* The shared lease table (common/ltab.h) the entries of local
	 * replicas are published in for the first half of their window, or
	 * NULL; not owned. */
	struct mc_ltab *shared;
};

#define AGENT_LCACHE_ENTRIES 65536u
/* A get's cached replicas on other segments are read and checked on the
 * loop up to this many bytes in all; beyond, the master is asked. */
#define AGENT_PROBE_MAX_BYTES (1u << 20)

int agent__lcache_init(struct agent_lcache *lc, size_t capacity) MC_MUST_CHECK;
void agent__lcache_free(struct agent_lcache *lc);
/* Publish the entries of local replicas in t from now on (not owned; the
 * cache lets go of it when freed). */
void agent__lcache_share(struct agent_lcache *lc, struct mc_ltab *t);
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
void agent__lcache_put(struct agent_lcache *lc, const uint8_t *key, size_t klen, uint64_t size,
		       const uint32_t *crc, const struct agent_rep *rep, uint64_t until_ms,
		       uint64_t now_ms);
void agent__lcache_del(struct agent_lcache *lc, const uint8_t *key, size_t klen);

#endif
