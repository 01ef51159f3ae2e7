/*
 * transfer: the transfer engine. It moves memory blocks between registered
 * regions of processes on the same or different nodes, over shared memory
 * (same host), TCP or RDMA, one-sided where the transport allows.
 *
 * A *segment* is a named set of registered regions owned by one engine.
 * Its descriptor (name, host, ports, transports offered, per-NIC RDMA
 * endpoint info, regions with base/length/rkeys) is published in meta under
 * /mooncake/<cluster-id>/segments/<name> with a lease the engine keeps
 * alive, so it disappears when the process dies; peers that opened the
 * segment follow descriptor updates through a watch. Without meta ("P2P
 * handshake" mode, as vLLM/SGLang connectors use), a segment is named by
 * "host:port" of its engine's control RPC port and the descriptor is
 * fetched from there.
 *
 * Addresses. A region has the address peers use ("remote address": for an
 * agent's own segment, its mapping; for a client buffer registered through
 * the agent, the client process's virtual address) and the local pointer
 * the serving engine reads and writes. Every remote request is checked by
 * the serving side against its registered regions: out of range,
 * overflowing or unregistered addresses get an error reply and nothing is
 * read or written.
 *
 * Threads. Control (publishing, watching, handshakes) runs on the libuv
 * loop given at creation. Data moves on a pool of data-plane threads
 * (te-threads). te_submit, te_poll, te_wait, te_open_segment and the region
 * calls are thread-safe and may be called from any thread except the
 * loop's own thread for the blocking ones (te_open_segment, te_wait,
 * te_unregister, te_free), which wait for work the loop does.
 */
#ifndef MC_TRANSFER_TRANSFER_H
#define MC_TRANSFER_TRANSFER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "common/err.h"

struct etcd_client;
struct metrics_registry;
struct rpc_server;

struct te_engine;
struct te_region;
struct te_segment;
struct te_batch;

enum te_protocol {
	TE_PROTO_AUTO = 0, /* rdma when a usable device exists, else tcp */
	TE_PROTO_TCP,
	TE_PROTO_RDMA,
	TE_PROTO_SHM,      /* forced shm (peer must be on this host) */
};

struct te_opts {
	uv_loop_t *loop;                 /* control loop (runs in caller's thread) */
	const char *segment_name;        /* this engine's segment name */
	const char *cluster_id;          /* meta key prefix /mooncake/<id>/ */
	struct etcd_client *meta;        /* NULL: P2P handshake mode */
	struct rpc_server *rpc;          /* serves mooncake.transfer.Transfer
					  * (descriptor fetch, RDMA handshake) */
	const char *advertise_host;      /* host peers connect to (numeric) */
	uint16_t rpc_port;               /* the port rpc listens on, advertised */
	const char *data_listen;         /* host:port of the TCP data listener */
	enum te_protocol protocol;
	unsigned threads;                /* 0: number of cores */
	unsigned tcp_conns;              /* per peer; 0: 4 */
	size_t slice_bytes;              /* 0: 1 MiB; min 64 KiB */
	const char *rdma_devices;        /* "mlx5_0,mlx5_1" or NULL/"" = auto */
	int rdma_gid_index;              /* -1: auto */
	const char *cluster_secret;      /* NULL: no peer authentication */
	struct metrics_registry *metrics; /* NULL: metrics_global() */
};

/*
 * Create the engine: start the data threads and listeners, pick transports
 * (logging why), publish the (empty) segment descriptor. Errors: -EINVAL
 * (options), negative errno of bind/listen, MC_EUNAVAILABLE (meta), RDMA
 * setup errors with a log line naming the limit, -ENOMEM.
 * Must be called on the loop's thread; returns once listening (the
 * descriptor is published asynchronously, see te_wait_published).
 */
int te_new(const struct te_opts *opts, struct te_engine **out) MC_MUST_CHECK;

/* Unpublish, stop threads, close connections, fail in-flight requests
 * with MC_ESHUTDOWN. Not from the loop thread while the loop runs work for
 * it... (see threads above). */
void te_free(struct te_engine *e);

/* The protocol chosen for remote (non-shm) peers. */
enum te_protocol te_protocol_in_use(const struct te_engine *e);
const char *te_protocol_name(enum te_protocol p);

/*
 * Register [remote_addr, remote_addr + len) backed by local memory at
 * local (memfd >= 0: the memfd it is mapped from at offset memfd_off, so
 * same-host peers can map it for shm; -1: not shareable). The descriptor
 * update is published and reaches peers through their watch. Errors:
 * -EINVAL (len 0, overflow), -EEXIST (overlaps a registered region),
 * RDMA MR errors (-ENOMEM with a log line naming ulimit -l / max_mr),
 * -ENOMEM.
 */
int te_register(struct te_engine *e, uint64_t remote_addr, void *local,
		size_t len, int memfd, uint64_t memfd_off,
		struct te_region **out) MC_MUST_CHECK;
/* Remove a region from the descriptor and wait until no request being
 * served touches it; then the memory may be freed. */
void te_unregister(struct te_region *r);

/*
 * Resolve a segment by name (meta) or "host:port" (P2P mode), set up its
 * connections once, and return a cached handle (the same handle for the
 * same name). Blocking; the hot path never touches meta. Errors:
 * MC_ESEGMENT_NOT_FOUND, MC_EUNAVAILABLE, MC_ETIMEDOUT, -EACCES (cluster
 * secret refused), -ENOMEM.
 */
int te_open_segment(struct te_engine *e, const char *name,
		    struct te_segment **out) MC_MUST_CHECK;
/* Drop a reference from te_open_segment (connections stay cached). */
void te_close_segment(struct te_segment *s);

enum te_op { TE_READ, TE_WRITE };

struct te_request {
	enum te_op op;
	void *local;            /* local buffer (need not be registered) */
	struct te_segment *segment;
	uint64_t remote_addr;   /* an address inside a region of segment */
	size_t len;             /* 0 completes at once with success */
};

enum te_status {
	TE_PENDING = 0,
	TE_DONE = 1,
	TE_FAILED = -1,
};

struct te_result {
	enum te_status status;
	int err;                /* when FAILED: MC_EINVALID_REPLICA (remote
				 * refused the range), MC_EUNAVAILABLE (peer
				 * gone after retries), MC_ETIMEDOUT, ... */
};

/*
 * Submit a batch (requests are copied). Slices are striped across
 * connections/NICs and pipelined; a failed slice is retried on another
 * path before its request fails. Errors: -EINVAL (n == 0, NULL segment),
 * -ENOMEM. On success *out owns the batch: free with te_batch_free after
 * it completes.
 */
int te_submit(struct te_engine *e, const struct te_request *reqs, size_t n,
	      struct te_batch **out) MC_MUST_CHECK;
/* Copy per-request status into results[n]; returns how many are still
 * pending. */
size_t te_poll(struct te_batch *b, struct te_result *results);
/* Wait until every request completed or timeout_ms passed (0: forever).
 * Returns 0 or MC_ETIMEDOUT. */
int te_wait(struct te_batch *b, uint64_t timeout_ms) MC_MUST_CHECK;
/* Free a batch; one still pending is waited for first. */
void te_batch_free(struct te_batch *b);

#endif
