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
 * Threads. Control (publishing, watching, resolving) runs on the libuv
 * loop given at creation; connecting to peers runs on a setup thread of
 * the engine; data moves on a pool of data-plane threads (te-threads).
 * te_submit, te_poll, te_wait, te_open_segment and the region calls are
 * thread-safe. The blocking ones (te_open_segment, te_wait,
 * te_wait_published, te_unregister) must not be called on the loop's
 * thread: they wait for work the loop or the data threads do; loop code
 * uses te_open_segment_async and te_submit_notify instead.
 *
 * Lifetime: te_new and te_stop on the loop thread; te_free once te_stop
 * finished (the daemon's role hooks: stop while the loop runs, free after
 * it ended). Segment handles and batches die with the engine.
 */
#ifndef MC_TRANSFER_TRANSFER_H
#define MC_TRANSFER_TRANSFER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
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
	TE_PROTO_SHM, /* forced shm (peer must be on this host) */
};

struct te_opts {
	uv_loop_t *loop;          /* control loop (runs in caller's thread) */
	const char *segment_name; /* this engine's segment name; P2P
					  * mode: NULL = "host:rpc_port" */
	const char *cluster_id;   /* meta key prefix /mooncake/<id>/ */
	struct etcd_client *meta; /* NULL: P2P handshake mode */
	struct rpc_server *rpc;   /* serves mooncake.transfer.Transfer
					  * (descriptor fetch); NULL: none
					  * (then P2P peers cannot open us) */
	uint16_t rpc_port;        /* the port rpc listens on, advertised */
	const char *data_listen;  /* numeric host:port of the TCP data
					  * listener (port 0: ephemeral); its
					  * host is advertised, so not 0.0.0.0 */
	enum te_protocol protocol;
	unsigned threads;                 /* 0: number of cores */
	unsigned tcp_conns;               /* per peer; 0: 4 */
	size_t slice_bytes;               /* 0: 1 MiB; 64 KiB .. 64 MiB */
	uint64_t io_timeout_ms;           /* a path that makes no progress for
					  * this long is declared dead; 0: 10s */
	uint64_t lease_ttl_s;             /* descriptor lease in meta; 0: 10 */
	const char *rdma_devices;         /* "mlx5_0,mlx5_1" or NULL/"" = auto */
	int rdma_gid_index;               /* -1: auto; 0..255 */
	unsigned rdma_mtu_bytes;          /* path MTU cap: 0 = the port's active
					  * MTU; else 256..4096, a power of 2 */
	const uint8_t *cluster_secret;    /* peers prove it (mc_secret_find) */
	size_t cluster_secret_len;        /* 1 .. MC_SECRET_MAX_BYTES */
	bool insecure;                    /* no cluster_secret: serve and open
					  * segments without authentication;
					  * must be said, never a default */
	struct metrics_registry *metrics; /* NULL: metrics_global() */
};

/*
 * Authentication. With a cluster secret every connection to this engine
 * (tcp data and rdma control connections, the shm channel) first passes
 * the HMAC challenge of wire.h, both ways, and GetDescriptor wants a
 * proof made over a fresh Challenge nonce (proto/transfer.proto); what
 * fails is refused, logged and counted in
 * mooncake_te_auth_refused_total{transport}. Without one (opts.insecure)
 * tcp peers are not authenticated and shm peers must run as our uid.
 */

/*
 * Create the engine: start the data threads and listeners, pick transports
 * (logging why), start publishing the (empty) segment descriptor. Errors:
 * -EINVAL (options; no cluster secret and not insecure), negative errno of bind/listen, -ENOMEM; with protocol
 * rdma and no usable RDMA device (the log says why): -ENODEV (none, or
 * none of rdma_devices), -EACCES (no permission), -ENETDOWN (no ACTIVE
 * port), -EADDRNOTAVAIL (no usable GID, or rdma_gid_index is not one).
 * Must be called on the loop's thread (the engine takes it for the loop's:
 * see te_register); returns once listening (the descriptor is published
 * asynchronously, see te_wait_published).
 */
int te_new(const struct te_opts *opts, struct te_engine **out) MC_MUST_CHECK;

/*
 * Stop the control plane, on the loop thread: delete the descriptor from
 * meta and revoke its lease, stop watching, close the engine's loop
 * handles; then call on_stopped (on the loop). Opened segments keep
 * working and the data plane keeps serving until te_free. Called once.
 * The meta client must stay alive until on_stopped.
 */
void te_stop(struct te_engine *e, void (*on_stopped)(struct te_engine *e, void *ud), void *ud);

/* Stop the data threads, close every connection (in-flight requests fail
 * with MC_ESHUTDOWN), free. Only after te_stop's on_stopped ran (or if
 * te_stop was never called and the loop has not run since te_new), from
 * any thread; the rpc server passed in opts must be shut down first. */
void te_free(struct te_engine *e);

/* Wait until the descriptor is in meta (always true in P2P mode), up to
 * timeout_ms (0: forever). Not on the loop thread. Returns 0,
 * MC_ETIMEDOUT, or the last publishing error (MC_EUNAVAILABLE, or -EEXIST
 * while another live engine holds the segment name). */
int te_wait_published(struct te_engine *e, uint64_t timeout_ms) MC_MUST_CHECK;

/* The proof a GetDescriptor request carries, for a tool that fetches a
 * descriptor itself: out = HMAC-SHA256(secret, "mooncake-te-descriptor" 0
 * challenge name), challenge being a Challenge answer's nonce. */
void te_descriptor_mac(const uint8_t *secret, size_t slen, const uint8_t *challenge,
		       size_t clen, const char *name, uint8_t out[32]);

/* This engine's segment name. */
const char *te_name(const struct te_engine *e);

/* Its io timeout (te_opts.io_timeout_ms, or the default). */
uint64_t te_io_timeout_ms(const struct te_engine *e);

/* The protocol chosen for remote (non-shm) peers. */
enum te_protocol te_protocol_in_use(const struct te_engine *e);
const char *te_protocol_name(enum te_protocol p);
/* Parse "auto", "tcp", "rdma", "shm". Errors: -EINVAL. */
int te_protocol_parse(const char *s, enum te_protocol *out) MC_MUST_CHECK;

/*
 * Register [remote_addr, remote_addr + len) backed by local memory at
 * local (memfd >= 0: the memfd it is mapped from at offset memfd_off, so
 * same-host peers can map it for shm — the engine keeps a dup of it; -1:
 * not shareable, same-host peers reach it over tcp). The descriptor update
 * is published and reaches peers through their watch; connected shm peers
 * map it at once. With rdma the region is pinned and registered on every
 * NIC; on the loop's thread that is left to the engine's setup thread (the
 * call returns at once; peers reach the region over tcp until its rkeys
 * are published, and an MR that cannot be made is logged and leaves it
 * tcp-only), elsewhere it is done before returning. Errors: -EINVAL (len
 * 0, overflow), -EEXIST (overlaps a registered region), -EMFILE (dup of
 * memfd), RDMA MR errors (-ENOMEM with a log line naming ulimit -l /
 * max_mr, -EACCES, -EFAULT), -ENOMEM.
 */
int te_register(struct te_engine *e, uint64_t remote_addr, void *local, size_t len, int memfd,
		uint64_t memfd_off, struct te_region **out) MC_MUST_CHECK;
/*
 * Register [addr, addr + len) of another process's memory (process pid,
 * pidfd a pidfd of it: borrowed, the engine keeps a dup), at the address
 * it has there: peers' requests for it are served by cross-memory attach
 * (process_vm_readv/writev) through a bounce buffer of the serving
 * connection, so the process must let this one attach (Yama:
 * prctl(PR_SET_PTRACER) naming it; else the same uid with ptrace_scope
 * 0, or CAP_SYS_PTRACE) — the caller checks that before. The region has
 * no memfd and no RDMA keys: peers reach it over tcp, same-host ones too
 * (one-sided RDMA and shm mappings need memory this process maps).
 * Errors: -EINVAL (pid, pidfd, len 0, overflow), -EEXIST (overlaps a
 * registered region), -EMFILE, -ENOMEM.
 */
int te_register_process(struct te_engine *e, uint64_t addr, size_t len, pid_t pid, int pidfd,
			struct te_region **out) MC_MUST_CHECK;
/*
 * Register device memory (a GPU's) by a dma-buf of it: fd (borrowed; the
 * engine keeps a dup), [offset, offset + len) of it, known at addr (its
 * address in the process that owns it, which peers use). Each RDMA NIC
 * registers it (ibv_reg_dmabuf_mr, before this returns: not on the loop
 * thread) and peers read and write it by one-sided RDMA with its rkeys;
 * nothing else reaches it (no CPU of this engine maps it: tcp peers'
 * requests for it are refused, and it is never the local side of this
 * engine's own requests). Errors: -EOPNOTSUPP (no rdma transport running;
 * the device or libibverbs registers no dma-bufs), -EINVAL, -EEXIST, the
 * MR errors of te_register, -ENOMEM.
 */
int te_register_dmabuf(struct te_engine *e, uint64_t addr, size_t len, int fd, uint64_t offset,
		       struct te_region **out) MC_MUST_CHECK;
/*
 * Move len bytes between buf and [addr, addr + len) of region r of this
 * engine, as a peer's request for it would (cross-memory attach for
 * another process's memory): for a caller that serves such requests
 * itself, on a thread that may block. write: buf -> region. The caller
 * keeps r registered meanwhile. Errors: MC_EREMOTE_ACCESS (not inside r;
 * the range is no longer reachable in its process), -ESRCH (that process
 * exited).
 */
int te_region_io(struct te_region *r, uint64_t addr, void *buf, size_t len,
		 bool write) MC_MUST_CHECK;
/* Remove a region from the descriptor and wait until no request being
 * served touches it, every shm peer unmapped it (a peer that does not
 * answer within the io timeout is disconnected) and no RDMA request of
 * this engine uses it as local memory; its MRs are deregistered (a peer's
 * RDMA access fails from then on). Then the memory may be freed. Not on
 * the loop thread. */
void te_unregister(struct te_region *r);

/*
 * Resolve a segment by name (meta) or "host:port" (P2P mode), set up its
 * connections once, and return a cached handle (the same handle for the
 * same name). Blocking, not on the loop thread; the hot path never touches
 * meta. Errors: MC_ESEGMENT_NOT_FOUND, MC_EUNAVAILABLE, MC_ETIMEDOUT,
 * -EACCES (cluster secret refused), MC_EPROTOCOL (bad descriptor),
 * -EINVAL (name), MC_ESHUTDOWN, -ENOMEM.
 */
int te_open_segment(struct te_engine *e, const char *name,
		    struct te_segment **out) MC_MUST_CHECK;
/* The same for the loop thread: cb runs on the loop with the handle
 * (a reference, as from te_open_segment) or an error. Errors of the call
 * itself: -EINVAL, -ENOMEM, MC_ESHUTDOWN. */
int te_open_segment_async(struct te_engine *e, const char *name,
			  void (*cb)(void *ud, int err, struct te_segment *s),
			  void *ud) MC_MUST_CHECK;
/* The handle of a segment already open (as te_open_segment would return
 * at once), without waiting, for any thread: -EAGAIN when it is not
 * cached or still resolving (open it with one of the calls above),
 * MC_ESHUTDOWN. */
int te_open_segment_cached(struct te_engine *e, const char *name,
			   struct te_segment **out) MC_MUST_CHECK;
/* Drop a reference from te_open_segment (connections stay cached). */
void te_close_segment(struct te_segment *s);

/* What a segment offers, from its current descriptor. */
struct te_segment_info {
	const char *name;           /* valid while the handle is held */
	enum te_protocol transport; /* shm when same-host, else the remote one */
	size_t nregions;
	uint64_t generation;
	/* "host:port" of the engine's gRPC control port (its process's RPC
	 * server), "" when the descriptor names none. */
	char rpc_addr[96];
};
struct te_region_info {
	uint64_t addr;
	uint64_t len;
	bool shm;
};
/* Fill *info and up to max regions (sorted by address); returns the
 * number of regions the descriptor has. */
size_t te_segment_info(struct te_segment *s, struct te_segment_info *info,
		       struct te_region_info *regions, size_t max);

enum te_op { TE_READ, TE_WRITE };

struct te_request {
	enum te_op op;
	void *local; /* local buffer (need not be registered) */
	struct te_segment *segment;
	uint64_t remote_addr; /* an address inside a region of segment */
	size_t len;           /* 0 completes at once with success */
	/* local is device memory registered with te_register_dmabuf (by
	 * its address in its owner's process): only RDMA moves it, the NIC
	 * reaching it through the dma-buf's MR; the request fails with
	 * -EOPNOTSUPP when the segment cannot be reached so (a same-host
	 * peer over shm, a tcp peer, a remote region without rkeys) or
	 * local is not inside such a region. */
	bool local_device;
	/* TE_READ into host memory: the result carries the CRC-32C of the
	 * bytes that landed in local (crc32c(0, local, len)), summed as they
	 * are copied (shm: read from memory once) or as each slice comes in
	 * (tcp, rdma: on the engine's thread, while they are in the cache),
	 * so that a caller checking what it read needs no pass of its own.
	 * te_submit refuses it (-EINVAL) on a write or device memory. */
	bool want_crc;
};

enum te_status {
	TE_PENDING = 0,
	TE_DONE = 1,
	TE_FAILED = -1,
};

struct te_result {
	enum te_status status;
	int err;      /* when FAILED: MC_EREMOTE_ACCESS (the range
				 * is not inside one registered region of
				 * the segment), MC_EUNAVAILABLE (peer gone
				 * after retries on every path),
				 * MC_ETIMEDOUT (no progress for the io
				 * timeout), MC_ESHUTDOWN, -EINVAL */
	uint32_t crc; /* TE_DONE with want_crc: the bytes' CRC-32C */
};

/*
 * Submit a batch (requests are copied). Slices are striped across
 * connections/NICs and pipelined; a failed slice is retried on another
 * path before its request fails. Overlapping requests run in no defined
 * order relative to each other. Errors: -EINVAL (n == 0, NULL segment or
 * local buffer with len > 0), -E2BIG (more than 4M slices), -ENOMEM. On
 * success *out owns the batch: free with te_batch_free after it completes.
 */
int te_submit(struct te_engine *e, const struct te_request *reqs, size_t n,
	      struct te_batch **out) MC_MUST_CHECK;
/* The same, and on_done(b, ud) runs once when every request completed,
 * on whichever thread completed the last one (a data thread, or the
 * caller's inside te_submit_notify): it must not block — hand off with
 * uv_async_send or a condition variable. */
int te_submit_notify(struct te_engine *e, const struct te_request *reqs, size_t n,
		     void (*on_done)(struct te_batch *b, void *ud), void *ud,
		     struct te_batch **out) MC_MUST_CHECK;
/* te_submit_notify, where the submitting thread itself copies up to
 * inline_bytes of the requests to same-host (shm) peers, in slices of any
 * size, rather than handing them to the data threads (which copy the
 * rest): for a caller that would only wait for them, such as a loop thread
 * serving a single client. inline_bytes 0: the default (slices up to
 * 64 KiB, 1 MiB of them a batch). Other transports are not affected. */
int te_submit_inline(struct te_engine *e, const struct te_request *reqs, size_t n,
		     size_t inline_bytes, void (*on_done)(struct te_batch *b, void *ud),
		     void *ud, struct te_batch **out) MC_MUST_CHECK;
/* Copy per-request status into results[n]; returns how many are still
 * pending. */
size_t te_poll(struct te_batch *b, struct te_result *results);
/* Wait until every request completed or timeout_ms passed (0: forever).
 * Returns 0 or MC_ETIMEDOUT. Not on the loop thread. */
int te_wait(struct te_batch *b, uint64_t timeout_ms) MC_MUST_CHECK;
/* Free a batch; one still pending is waited for first. */
void te_batch_free(struct te_batch *b);

/* The socket buffer the tcp transport wants: it fixes SO_SNDBUF/RCVBUF at
 * this when autotuning (net.ipv4.tcp_[rw]mem) stays below it and
 * net.core.[rw]mem_max allows it. */
#define TE_TCP_SOCKBUF_BYTES (4u << 20)

/* ------------------------------------------------------------ RDMA facts
 * What the rdma transport decides about a port, for tools that check a
 * node before it runs (mooncakectl doctor) and must decide the same way.
 */

/* GID types, as in a port's GID table (enum ibv_gid_type's values). */
enum te_gid_type { TE_GID_IB = 0, TE_GID_ROCE_V1 = 1, TE_GID_ROCE_V2 = 2 };

struct te_gid_entry {
	uint8_t raw[16];
	enum te_gid_type type;
	bool valid; /* the entry could be read (an unset entry cannot) */
};

/*
 * The GID index the rdma transport uses on a port whose table is
 * t[0..n): the lowest index of the best kind — RoCE v2 with an
 * IPv4-mapped address, then RoCE v2, then RoCE v1 or IB; invalid and
 * all-zero entries never. want >= 0 (--rdma-gid-index) considers that
 * index only. Returns the index, or -1 when none is usable. Pure.
 */
int te_gid_pick(const struct te_gid_entry *t, size_t n, int want);
/* True for an IPv4-mapped address (::ffff:a.b.c.d). */
bool te_gid_v4mapped(const uint8_t raw[16]);

/* A port as libibverbs reports it (ibv_query_port). */
struct te_rdma_port_attr {
	unsigned state; /* enum ibv_port_state: 4 = ACTIVE */
	unsigned active_mtu_bytes;
	unsigned max_mtu_bytes;
	unsigned gid_tbl_len;
	bool ethernet; /* link layer Ethernet (RoCE), else IB */
};

/*
 * Query port `port` of the RDMA device `device` through libibverbs.
 * Errors: -ENODEV (no such device), -EACCES (no permission to open it),
 * -ENOENT (no such port), another negative errno of the verbs.
 */
int te_rdma_query_port(const char *device, unsigned port,
		       struct te_rdma_port_attr *out) MC_MUST_CHECK;

#endif
