/*
 * agent: the node side of the cache pool (mooncaked --role=agent). It owns
 * the node's DRAM segment (one memfd mapping, huge pages when available,
 * bound to a NUMA node on request), mounts it with the master leader (found
 * through meta or given), heartbeats and re-reports what it holds after a
 * master failover, and serves the inference processes of its node on a
 * Unix socket (proto/client.proto): puts (PutStart -> write every replica
 * -> PutEnd, or PutRevoke on failure), gets (GetReplicas -> the nearest
 * replica: a local copy, a zero-copy read-only mapping held under the read
 * lease, or a transfer-engine read), exist, remove, client buffers and
 * transfers between client memory and remote segments.
 *
 * Object bytes are copied on a pool of copy threads, never on the loop
 * thread (except copies below AGENT_INLINE_COPY_BYTES). A client that goes
 * away leaks nothing: its buffers are unmapped and unregistered, its views
 * released and its in-flight puts revoked.
 *
 * All functions run on the loop's thread.
 */
#ifndef MC_AGENT_AGENT_H
#define MC_AGENT_AGENT_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "common/err.h"

struct metrics_registry;
struct rpc_server;
struct te_engine;
struct te_opts;
struct agent;

enum agent_hugepages {
	AGENT_HUGEPAGES_AUTO = 0, /* use them when the kernel has enough */
	AGENT_HUGEPAGES_ON,       /* fail without them */
	AGENT_HUGEPAGES_OFF,
};

struct agent_opts {
	uv_loop_t *loop;
	struct metrics_registry *metrics; /* NULL: metrics_global() */
	/*
	 * The transfer engine replicas on other agents' segments are read and
	 * written with (borrowed); NULL: only this agent's own segment can be
	 * used (single-node setups), remote replicas fail with MC_EUNAVAILABLE.
	 */
	struct te_engine *te;
	/* te's options, for the engines of sessions that want one of their
	 * own (TransferEngine instances; copied, but the meta client and
	 * metrics registry they name must outlive the agent); NULL: such
	 * sessions are refused. */
	const struct te_opts *engine_opts;
	/*
	 * The segment's name and the agent's id: unique in the cluster. NULL
	 * or "": "HOST:PORT" of the first listener of rpc (the agent's
	 * transfer-engine port), known once it listens.
	 */
	const char *segment_name;
	struct rpc_server *rpc; /* the agent's RPC server (borrowed) */
	const char *rpc_listen; /* its listen address */
	uint64_t segment_bytes; /* 0: min(1 GiB, RAM / 4) */
	/* Start even when the segment does not fit (RAM, memory-lock limit
	 * when RDMA pins it, free huge pages with AGENT_HUGEPAGES_ON). */
	bool force_segment_size;
	uint64_t staging_bytes; /* staging buffer of a client session */
	int numa_node;          /* -1: no binding */
	enum agent_hugepages hugepages;
	const char *socket_path; /* clients' Unix socket */
	unsigned copy_threads;   /* 0: cores, at most 8 */
	/* After a client request, a reply or the copy threads' last job, the
	 * loop polls without sleeping for this long (0: never). */
	uint64_t busy_poll_us;
	/* Values up to this size with a replica on another agent's segment
	 * are answered from the lease cache, checked (0: never). */
	uint64_t remote_cache_bytes;
	/* Slots of the shared lease table that lets the node's clients
	 * answer gets of leased local objects themselves (0: none). */
	unsigned lease_table_slots;
	/* Master discovery: a fixed address, else the leader key in meta. */
	const char *master_address; /* "" or NULL: use meta */
	const char *meta_endpoints; /* "" or NULL: no meta */
	const char *cluster_id;
	uint64_t master_timeout_ms; /* per master call; 0: 5s */
	/* Space of its segment the agent asks the master to lease it, for
	 * puts sealed in one master call; 0: every put takes PutStart and
	 * PutEnd. */
	uint64_t put_lease_bytes;
	/* The SSD tier (--ssd-*): its directory (NULL or "": none) and the
	 * bytes it takes there; the watermark and eviction ratio the master
	 * keeps it under; write the DRAM segment down at a stop; copy objects
	 * read from it back to DRAM; check every object at start; least time
	 * between syncs; its I/O engine ("auto", "io_uring" or "threads";
	 * NULL: auto); memory other agents' reads of it go through. */
	const char *ssd_path;
	uint64_t ssd_bytes;
	double ssd_high_watermark, ssd_eviction_ratio;
	bool ssd_flush_on_stop, ssd_promote_on_hit, ssd_verify_on_start;
	unsigned ssd_sync_interval_ms;
	const char *ssd_io;
	uint64_t ssd_bounce_bytes;
	uint64_t ssd_staging_bytes; /* tier.h, struct agent_tier_stage */
	/* The cluster secret other agents prove when they ask for an object
	 * of the SSD tier (copied); len 0: not checked (--insecure-transfer). */
	const uint8_t *cluster_secret;
	size_t cluster_secret_len;
	/* What clients may hold (the --client-* keys; each must be > 0
	 * except alloc_bytes, 0: the machine's RAM). */
	unsigned max_sessions, max_sessions_per_uid;
	uint64_t reply_buffer_bytes;     /* per session */
	unsigned max_fds;                /* per session, beside its buffers' */
	unsigned max_buffers, max_views; /* per session */
	uint64_t alloc_bytes;            /* AllocBuffer memory, every session */
	/* This process's instance token (at most AGENT_INSTANCE_MAX bytes,
	 * copied; len 0: none) and those of the processes before it on the
	 * same data dir (each instance_len long, concatenated, at most
	 * AGENT_PREVIOUS_MAX), sent with every mount: the master drops what
	 * the previous process mounted at once instead of refusing this
	 * one's segment until that process's --agent-ttl has passed. Only a
	 * process that holds the data dir (and so outlived the previous ones,
	 * see mooncaked's lock) can know their tokens. */
	const uint8_t *instance, *previous_instance;
	size_t instance_len, previous_instance_len;
};

#define AGENT_INSTANCE_MAX 32
#define AGENT_PREVIOUS_MAX 4

/* Copies up to this size run on the loop thread; a get's up to the
 * second one too when one session alone has sent requests for
 * AGENT_SOLO_NS (op_get.c, solo_get), with a copy thread taking part. */
#define AGENT_INLINE_COPY_BYTES (64u * 1024)
#define AGENT_INLINE_SOLO_COPY_BYTES (2u << 20)
#define AGENT_SOLO_NS (2000000ull)
/* Client protocol version (proto/client.proto). */
#define AGENT_PROTOCOL_VERSION 1u

/*
 * Create the agent: open the SSD tier (recovering what it holds), map the
 * segment, start the copy threads, listen on the socket (mode 0660; a
 * stale socket file is replaced, a live one refused), and begin finding
 * and mounting with the master. Errors (logged): -EINVAL (options),
 * -EADDRINUSE (another agent serves the socket), -ENOMEM or another
 * negative errno of memfd/mmap/socket/bind, MC_ECONFIG (huge pages
 * required but unavailable, NUMA node not present, the segment does not
 * fit the node's memory and force_segment_size is not set; the SSD tier's
 * size, free space or files), MC_ELOCKED (another process has ssd_path),
 * -EACCES (ssd_path cannot be written).
 */
int agent_new(const struct agent_opts *opts, struct agent **out) MC_MUST_CHECK;

/*
 * Drain, the first step of a graceful stop: take no new client sessions
 * (the socket file goes), answer requests that come from now on with
 * MC_ESHUTDOWN, and run on_drained(ud) once every request in flight has
 * been answered and its reply written (or its session closed) — from the
 * loop, never from inside this call. Nothing else stops: the segment
 * stays mounted and the master reachable, so requests in flight finish.
 * agent_stop may follow at any time (before on_drained: the requests
 * left are cut short).
 */
void agent_drain(struct agent *a, void (*on_drained)(void *ud), void *ud);

/*
 * Stop: close the socket and every client session, write the DRAM
 * segment's objects into the SSD tier when ssd_flush_on_stop, unmount the
 * segments from the master (so their objects leave the index at once),
 * stop the heartbeats; on_stopped(ud) runs when done (from the loop,
 * never from inside this call). An unfinished drain's on_drained never
 * runs.
 */
void agent_stop(struct agent *a, void (*on_stopped)(void *ud), void *ud);

/* Free a stopped agent (or one whose loop has ended). */
void agent_free(struct agent *a);

/* The socket path in use (after fallbacks). */
const char *agent_socket_path(const struct agent *a);

/* Add the gets the clients answered from the shared lease table since
 * the last call to the statistics (also done every second, at a Stats
 * request and when a session ends). From the agent's loop. */
void agent_fold_client_counts(struct agent *a);

#endif
