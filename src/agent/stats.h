/*
 * stats.h: the agent's statistics (stats.c) — the counters a client's
 * Stats request reads, the gauges the parts set, and the metrics of
 * every request. A leaf: it calls only common/metrics. Each part pushes
 * its own figures here when they change; nothing here reads a part.
 */
#ifndef MC_AGENT_STATS_H
#define MC_AGENT_STATS_H

#include <stdbool.h>
#include <stdint.h>

struct metric;
struct metrics_registry;

enum agent_counter {
	AGENT_C_PUTS,
	AGENT_C_PUT_FAILS,
	AGENT_C_GETS,
	AGENT_C_LOCAL_HITS,
	AGENT_C_REMOTE_HITS,
	AGENT_C_MISSES,
	AGENT_C_BYTES_WRITTEN,
	AGENT_C_BYTES_READ,
	AGENT_C_LEASE_CACHE_HITS,
	AGENT_C_LEASE_RENEWALS, /* cached read leases renewed ahead */
	AGENT_C_MIRROR_EVENTS,
	AGENT_C_MIRROR_LISTINGS,
	AGENT_C_RESYNC_BAD,        /* bytes did not match the checksum */
	AGENT_C_RESYNC_UNCHECKED,  /* no checksum to check against */
	AGENT_C_RESYNC_CONFLICTS,  /* skipped by the master */
	AGENT_C_GET_BAD,           /* gets whose bytes failed the check */
	AGENT_C_PUT_COMMITS,       /* puts sealed with one call (BatchCommit) */
	AGENT_C_LEASE_CACHE_STALE, /* cached remote replicas that failed the check */
	AGENT_C_SSD_HITS,          /* gets served from this agent's SSD tier */
	AGENT_C_SSD_REMOTE_HITS,   /* ... from another agent's SSD tier */
	AGENT_C_SSD_PEER_READS,    /* reads of the SSD tier for other agents */
	AGENT_C_SSD_DEMOTIONS,     /* objects demoted into the SSD tier */
	AGENT_C_SSD_DEMOTE_FAILS,  /* demotions given up or refused */
	AGENT_C_SSD_PROMOTIONS,    /* objects copied back to DRAM */
	AGENT_C_SSD_DELETES,       /* copies deleted on the master's order */
	AGENT_C_SSD_LOST,          /* objects whose bytes failed their checksum */
	AGENT_C_SSD_PUTS,          /* puts stored straight into the SSD tier */
	AGENT_C_SSD_STAGED,        /* tier.c: I/O buffers of the staging memory */
	AGENT_C_SSD_STAGING_FULL,  /* ... asked for when it had no room */
	AGENT_C_TABLE_GETS,        /* gets clients answered from the shared lease table */
	/* server.c: what clients were refused, by limit */
	AGENT_C_REFUSED_SESSIONS,     /* --client-max-sessions */
	AGENT_C_REFUSED_SESSIONS_UID, /* --client-max-sessions-per-uid */
	AGENT_C_REFUSED_FDS,          /* frames with descriptors not announced */
	AGENT_C_REFUSED_BUFFERS,      /* --client-max-buffers */
	AGENT_C_REFUSED_VIEWS,        /* --client-max-views */
	AGENT_C_REFUSED_ALLOC,        /* --client-alloc-size */
	AGENT_C_REFUSED_SHUTDOWN,     /* requests that came while draining */
	AGENT_C_FDS_CLOSED,           /* descriptors closed as they came */
	AGENT_C_PAUSED_REPLIES,       /* sessions paused: reply budget */
	AGENT_C_PAUSED_FDS,           /* sessions paused: descriptors */
	AGENT_C_COUNT
};

/* Gauges, each set by the part that owns the figure. */
enum agent_gauge {
	AGENT_G_CLIENTS,      /* server.c: open sessions */
	AGENT_G_BUFFERS,      /* server.c: buffers of every session */
	AGENT_G_VIEWS,        /* server.c: zero-copy views of every session */
	AGENT_G_STAGING,      /* server.c: staging bytes of every session */
	AGENT_G_SSD_STAGING,  /* agent.c: the SSD tier's staging memory */
	AGENT_G_INVENTORY,    /* mirror.c, mlink.c: objects in the inventory */
	AGENT_G_MASTER_VIEW,  /* mlink.c: the view the segment is mounted in */
	AGENT_G_MOUNTED,      /* mlink.c */
	AGENT_G_PUT_LEASE,    /* space.c: room left in the put lease */
	AGENT_G_REMOTE_LEASE, /* space.c: room left in the remote leases */
	AGENT_G_HELD_BYTES,   /* server.c: reply budgets in use, every session */
	AGENT_G_HELD_FDS,     /* server.c: descriptors in flight and queued */
	AGENT_G_ALLOC,        /* server.c: buffers made for clients, bytes */
	AGENT_G_COUNT
};

/* Request ops are Request.op field numbers; this many are named. */
#define AGENT_STATS_OPS 32

struct agent_stats {
	struct metrics_registry *reg;
	uint64_t counters[AGENT_C_COUNT];
	struct metric *m_counters[AGENT_C_COUNT];
	struct metric *m_gauges[AGENT_G_COUNT];
	struct metric *m_spin; /* histogram of busy-poll periods */
	/* Looked up on first use, by op (and result). */
	struct metric *m_op_seconds[AGENT_STATS_OPS];
	struct metric *m_op_requests[AGENT_STATS_OPS][2]; /* ok, error */
};

/* Register the agent's metrics in reg, with the segment's fixed figures
 * (its size, whether huge pages back it, the staging buffer size). */
void agent__stats_init(struct agent_stats *s, struct metrics_registry *reg,
		       uint64_t segment_bytes, bool hugepages, uint64_t staging_bytes);
void agent__count(struct agent_stats *s, enum agent_counter c, uint64_t n);
uint64_t agent__counter(const struct agent_stats *s, enum agent_counter c);
void agent__gauge(struct agent_stats *s, enum agent_gauge g, int64_t v);
/* A client request of op ended with err, start_ns after it came. */
void agent__op_done(struct agent_stats *s, int op, int err, uint64_t start_ns);
/* The loop polled without sleeping for this long (server.c, busy poll). */
void agent__stats_spin(struct agent_stats *s, uint64_t ns);

#endif
