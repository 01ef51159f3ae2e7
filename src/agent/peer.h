/*
 * peer.h: reads of SSD tiers between agents (peer.c) — the service
 * mooncake.agent.Tier other agents call to have an object of this agent's
 * SSD tier read into memory registered with the transfer engine (the
 * bounce region), which they then read themselves; and the calls this
 * agent makes to the owners of SSD replicas it gets. A part below the
 * operations; it calls the tier, the memory maps, the copy threads and
 * the statistics.
 */
#ifndef MC_AGENT_PEER_H
#define MC_AGENT_PEER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "common/err.h"
#include "common/extalloc.h"

struct agent;
struct agent_map;
struct te_region;
struct peer_client;
struct peer_hold;
struct peer_wait;

/* A staged object is the reader's this long at most. */
#define AGENT_PEER_HOLD_MS 30000u

/* The peers' state, embedded in struct agent (touched only by peer.c). */
struct agent_peer {
	/* The serving side: the bounce region and what is staged in it. */
	struct agent_map *bounce; /* NULL: no SSD tier, nothing served */
	struct te_region *region;
	struct mc_extalloc alloc;
	bool alloc_ok, registered, service;
	struct peer_hold *holds;              /* staged, until released or expired */
	struct peer_wait *waits, *waits_tail; /* reads waiting for room */
	uint64_t next_hold;
	uv_timer_t timer; /* expires holds */
	bool timer_on;
	/* The calling side: one RPC client per owner agent. */
	struct peer_client *clients;
	unsigned reads; /* reads of this agent's tier in flight */
};

/* Readers prove the agent's secret (a->secret; len 0: none asked for). */
void agent__peer_init(struct agent *a);
/*
 * With an SSD tier: make the bounce region (bytes), register it with the
 * transfer engine (on a copy thread: RDMA pins it) and serve the Tier
 * service on the agent's RPC server. Errors: -ENOMEM, the memfd's,
 * -EEXIST (the service is registered already).
 */
int agent__peer_start(struct agent *a, uint64_t bytes) MC_MUST_CHECK;
/* Stop serving (waits end with UNAVAILABLE) and close the clients and the
 * timer; returns how many handles it closes. */
unsigned agent__peer_close(struct agent *a, uv_close_cb on_closed);
/* Reads served or made still in flight (a stop waits). */
bool agent__peer_busy(const struct agent *a);
void agent__peer_free(struct agent *a);

/*
 * Have owner (an agent id) read the object key of its SSD tier into its
 * bounce region: cb(ud, 0, address, hold) — the bytes are at address of
 * the owner's transfer-engine segment (named owner) for AGENT_PEER_HOLD_MS
 * or until released; or cb(ud, err, 0, 0): MC_EOBJECT_NOT_FOUND (gone:
 * promoted, evicted), MC_ECHECKSUM (its bytes were bad: dropped),
 * MC_ENO_SPACE (larger than the owner's bounce region), MC_EUNAVAILABLE
 * (the owner cannot be reached), -EACCES (the owner refused our proof).
 * cb runs on the loop; when the owner cannot be reached at all, from
 * inside this call.
 */
void agent__peer_read(struct agent *a, const char *owner, const uint8_t *key, size_t klen,
		      uint64_t size,
		      void (*cb)(void *ud, int err, uint64_t address, uint64_t hold),
		      void *ud);
/* The bytes of hold are read: the owner may reuse its room. */
void agent__peer_release(struct agent *a, const char *owner, uint64_t hold);

#endif
