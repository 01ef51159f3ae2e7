/*
 * space.h: the agent's put leases (space.c) — space of its own segment
 * the master delegated to it, and space of other agents' segments
 * (remote leases), for puts sealed with one call (BatchCommit). A part
 * below the operations: it calls the master calls (mcall.c) and the
 * statistics, nothing else.
 */
#ifndef MC_AGENT_SPACE_H
#define MC_AGENT_SPACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct agent;

#define AGENT_LEASE_EXTENTS 4u     /* put lease extents held at once */
#define AGENT_LEASE_IDLE_MS 10000u /* an unused put lease goes back */
#define AGENT_LEASE_RETRY_MS 100u  /* after a LeaseSpace granting none */
#define AGENT_RLEASES 4u           /* other agents' segments leased at once */

/*
 * The leases' policy, as fractions of what each derives from: the put
 * lease's target from --put-lease-size (struct agent_space.lease_bytes)
 * and the segment's size, the remote leases' from --put-lease-size.
 */
/* The target is --put-lease-size, or an eighth of the segment when that
 * is less: the most the master leases an agent of its own segment
 * (master.proto, LeaseSpaceRequest). */
#define AGENT_LEASE_SEGMENT_DIV 8u
/* Values above a quarter of the target take PutStart. */
#define AGENT_LEASE_VALUE_DIV 4u
/* More is asked for when less than half the target is left. */
#define AGENT_LEASE_REFILL_DIV 2u
/* A remote lease's target is a quarter of --put-lease-size. */
#define AGENT_RLEASE_DIV 4u
/* Values above a 16th of the remote target take PutStart. */
#define AGENT_RLEASE_VALUE_DIV 16u
/* The next remote extent is asked for when less than a quarter of the
 * remote target is left in the one in use. */
#define AGENT_RLEASE_REFILL_DIV 4u
/* A remote extent is taken from during the first half of its grant's
 * time (the rest is for the writes and the commit). */
#define AGENT_RLEASE_USE_DIV 2u
/* Space is taken in multiples of the master's granule (master.proto,
 * CommitItem.size: rounded up to 64). */
#define AGENT_LEASE_GRANULE 64u

/* [off, end) of a segment. */
struct agent_extent {
	uint64_t off, end;
};

/* A remote lease: space of another agent's segment. */
struct agent_rlease {
	char seg[128]; /* "" : free slot */
	struct agent_rextent {
		uint64_t epoch, base; /* the segment's, from the grant */
		uint64_t off, end;    /* room left */
		uint64_t until_ms;    /* taken from until then */
	} cur, next;                  /* next: granted ahead, used when cur is */
	uint64_t used_ms, denied_ms;
	bool busy; /* a LeaseSpace call in flight */
};

/* The leases, embedded in struct agent (touched only by space.c). */
struct agent_space {
	uint64_t lease_bytes; /* --put-lease-size; 0: no lease */
	struct agent_extent lease[AGENT_LEASE_EXTENTS];
	unsigned nlease;
	struct agent_extent *release; /* to give back with the next call */
	size_t nrelease, release_cap;
	bool ready, busy, idle;
	bool denied; /* none granted at denied_ms */
	uint64_t denied_ms;
	uint64_t epoch;     /* the master's, from the mount */
	unsigned gen;       /* bumped at every mount */
	uint64_t takes;     /* puts of this generation copying */
	uint64_t takes_old; /* puts of earlier ones still copying */
	uint64_t used_ms;
	struct agent_rlease rl[AGENT_RLEASES];
};

void agent__space_init(struct agent *a, uint64_t lease_bytes);
void agent__space_free(struct agent *a);

/* Take space for a value of size bytes from the put lease: *off, and the
 * generation to hand back to agent__lease_put_done. false: no lease, or
 * not enough room (more is asked for; use PutStart meanwhile). */
bool agent__lease_take(struct agent *a, uint64_t size, uint64_t *off, unsigned *gen);
/* The put that took [off, size) finished copying; committing: it goes on
 * to BatchCommit, else the space is given back. Returns true when it was
 * the last put still copying into a lease an earlier mount dropped: a
 * mount waiting for that may go now (agent__mlink_lease_drained). */
bool agent__lease_put_done(struct agent *a, uint64_t off, uint64_t size, unsigned gen,
			   bool committing);
/* Bytes of the lease not taken yet. */
uint64_t agent__lease_room(const struct agent *a);
/* The lease's generation (bumped at every mount) and the master's lease
 * epoch it was granted in, to commit with. */
unsigned agent__lease_gen(const struct agent *a);
uint64_t agent__lease_epoch(const struct agent *a);
/* Puts still copy into a lease an earlier mount dropped: the segment
 * must not be mounted again before they are done. */
bool agent__lease_draining(const struct agent *a);
/* Space for a value of size bytes in another agent's segment seg, from a
 * remote lease: its offset there, the segment's lease epoch to commit
 * with and its base address. false: none (a LeaseSpace call may have
 * gone out for the next put). */
struct agent_rtake {
	uint64_t off, epoch, base;
};
bool agent__rlease_take(struct agent *a, const char *seg, uint64_t size,
			struct agent_rtake *t);
/* A commit into seg's remote lease was refused for its space (not for its
 * key): forget the lease. */
void agent__rlease_drop(struct agent *a, const char *seg);
/* A mount begins: the lease is gone. */
void agent__lease_reset(struct agent *a);
/* Mounted (and re-synced) in lease epoch: ask for a lease. */
void agent__lease_start(struct agent *a, uint64_t epoch);
/* Ask for more space and give back what waits (when due). */
void agent__lease_sync(struct agent *a);
/* From the heartbeat timer: an idle lease goes back. */
void agent__lease_tick(struct agent *a);

#endif
