/*
 * libmooncake: the client library of mooncaked. An inference process uses
 * it to store and fetch KV-cache blocks in the pool through the agent on
 * its node (a Unix socket; object bytes move through shared memory, never
 * through the socket).
 *
 *   mc_client *c;
 *   if (mc_open(NULL, &c) == 0) {                    // the local agent
 *       mc_put(c, "k", 1, data, len, NULL);          // -705 if it exists
 *       void *v; size_t n;
 *       if (mc_get(c, "k", 1, &v, &n) == 0) { ...; free(v); }
 *       mc_close(c);
 *   }
 *
 * Errors are negative: a negative errno (-EINVAL, -ENOMEM, -ENOBUFS, ...)
 * or a store code with the numbers Mooncake users know (MC_E* below;
 * mc_strerror and mc_errname name them). A connection that broke fails
 * every later call with MC_EUNAVAILABLE: close the handle and open again.
 * A request that comes while the agent stops fails with MC_ESHUTDOWN.
 *
 * Thread safety: a handle may be used from many threads at once; their
 * requests are pipelined on the one connection.
 *
 * Memory. Values are copied through the session's staging buffer (shared
 * with the agent) — or, when larger than the free staging room, through a
 * temporary memfd — unless they lie in memory the agent can map: buffers
 * from mc_buffer_alloc (and memfds registered with mc_register_memfd),
 * which are read and written in place (zero copy). mc_get_view maps a
 * local object read-only instead of copying it.
 */
#ifndef MOONCAKE_H
#define MOONCAKE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Store error codes (also returned per item by batch calls). The
 * project's own sources get them from common/err.h. */
#ifndef MC_COMMON_ERR_H
#define MC_EINTERNAL (-700)
#define MC_ESEGMENT_NOT_FOUND (-701)
#define MC_ENO_SPACE (-702)
#define MC_EINVALID_REPLICA (-703)
#define MC_EOBJECT_NOT_FOUND (-704)
#define MC_EOBJECT_ALREADY_EXISTS (-705)
#define MC_EOBJECT_HAS_LEASE (-706)
#define MC_ELEASE_EXPIRED (-707)
#define MC_ETOO_FEW_SEGMENTS (-708)
#define MC_EPROTOCOL (-801)
#define MC_EUNAVAILABLE (-802)
#define MC_ETIMEDOUT (-803)
#define MC_ESHUTDOWN (-808)
#define MC_ECHECKSUM (-810)
#endif

/* Largest key, in bytes (keys are any bytes, at least one). */
#define MC_MAX_KEY_BYTES 4096

typedef struct mc_client mc_client;
typedef struct mc_view mc_view;

struct mc_open_opts {
	const char *socket_path; /* NULL: see mc_open */
	size_t staging_bytes;    /* 0: the agent's --local-buffer-size */
	const char *client_name; /* shown in the agent's logs; NULL: none */
	int verify_gets;         /* every get of the session verifies (see
				     mc_get_opts) */
};

/*
 * Connect to the agent. socket_path NULL: $MOONCAKE_SOCKET, else
 * /run/mooncake/agent.sock, else $XDG_RUNTIME_DIR/mooncake/agent.sock
 * (the first that exists). Errors: -ENOENT (no socket found), negative
 * errno of connect (-ECONNREFUSED: no agent serves it, -EACCES),
 * -EUSERS (the agent serves as many sessions as it may: in all, or of
 * this user; its log says which), MC_ESHUTDOWN (the agent is stopping),
 * MC_EPROTOCOL (not an agent, or another protocol version), -ENOMEM.
 */
int mc_open(const char *socket_path, mc_client **out);
int mc_open_ex(const struct mc_open_opts *opts, mc_client **out);
/* Close the session; buffers from mc_buffer_alloc are unmapped, views
 * must have been released (their memory goes away). NULL is a no-op. */
void mc_close(mc_client *c);

/* Tiers a put can name (mc_put_opts.tier). */
#define MC_TIER_DRAM 0 /* the pool's memory; cold objects move to SSD tiers */
#define MC_TIER_SSD 1  /* straight into the local agent's SSD tier */

struct mc_put_opts {
	unsigned replica_num;          /* copies on distinct segments; 0: 1 */
	int soft_pin;                  /* evicted only when nothing else is */
	uint64_t ttl_ms;               /* removed this long after the put; 0: never */
	const char *preferred_segment; /* NULL: the local agent's segment */
	int upsert;                    /* replace an existing object */
	/* MC_TIER_SSD: one replica, in the local agent's SSD tier (no
	 * preferred segment; MC_ESEGMENT_NOT_FOUND when it has none). */
	int tier;
};

/*
 * Store a value. Errors: MC_EOBJECT_ALREADY_EXISTS (-705; see upsert),
 * MC_ENO_SPACE, MC_ETOO_FEW_SEGMENTS (replica_num above the segments
 * mounted), MC_EOBJECT_HAS_LEASE (upsert of a leased object), -EINVAL
 * (key empty or above MC_MAX_KEY_BYTES, replica_num above 16),
 * MC_EUNAVAILABLE (no master, the connection broke, or a master leader
 * that took over is still taking the agents back: try again; never
 * MC_ENO_SPACE for that), transfer errors.
 */
int mc_put(mc_client *c, const void *key, size_t klen, const void *value, size_t len,
	   const struct mc_put_opts *opts);
/* The same, for a value in a buffer from mc_buffer_alloc (written in
 * place; any other memory is copied as by mc_put). */
int mc_put_from(mc_client *c, const void *key, size_t klen, const void *buf, size_t len,
		const struct mc_put_opts *opts);

/*
 * Fetch a value into a new malloc'd buffer (*value, free() it; a 0-byte
 * value gives a non-NULL pointer). Errors: MC_EOBJECT_NOT_FOUND, -EINVAL,
 * MC_EUNAVAILABLE, -ENOMEM, MC_ECHECKSUM (verifying gets).
 */
int mc_get(mc_client *c, const void *key, size_t klen, void **value, size_t *len);
/*
 * Fetch a value into buf (cap bytes); returns its size, or -ENOBUFS when
 * it is larger than cap, or another error of mc_get. Zero copy when buf
 * lies in a buffer from mc_buffer_alloc.
 */
int64_t mc_get_into(mc_client *c, const void *key, size_t klen, void *buf, size_t cap);

struct mc_get_opts {
	/* Check the bytes delivered against the CRC-32C the object's writer
	 * sealed it with (the agent checks them where they land, on its copy
	 * threads); an object whose bytes differ fails with MC_ECHECKSUM.
	 * Objects stored without a checksum are delivered unchecked. */
	int verify;
};

/* mc_get and mc_get_into with options (NULL: as without). */
int mc_get_ex(mc_client *c, const void *key, size_t klen, void **value, size_t *len,
	      const struct mc_get_opts *opts);
int64_t mc_get_into_ex(mc_client *c, const void *key, size_t klen, void *buf, size_t cap,
		       const struct mc_get_opts *opts);

/*
 * A read-only view of a value: when the object has a replica in the local
 * agent's segment, *data points into a read-only mapping of it, kept
 * under the object's read lease until mc_view_release (zero copy: the
 * bytes never change while the view is held); otherwise a private copy
 * (in one of the session's spill buffers until the release: see
 * libmooncake(3), Memory). Errors: those of mc_get.
 */
int mc_get_view(mc_client *c, const void *key, size_t klen, const void **data, size_t *len,
		mc_view **view);
/* Whether a view maps the agent's segment (1) or holds a copy (0). */
int mc_view_is_mapped(const mc_view *v);
/* Release a view (NULL is a no-op). */
void mc_view_release(mc_client *c, mc_view *v);

/* 1 if the object exists (complete), 0 if not, or an error. */
int mc_exist(mc_client *c, const void *key, size_t klen);
/* Errors: MC_EOBJECT_NOT_FOUND, MC_EOBJECT_HAS_LEASE (read lease held and
 * force 0), -EINVAL, MC_EUNAVAILABLE. */
int mc_remove(mc_client *c, const void *key, size_t klen, int force);
/* Remove every object (leased ones too with force). Returns how many
 * were removed, or an error. */
int64_t mc_remove_all(mc_client *c, int force);

/*
 * Batches: n items in one round trip; results[i] gets the item's outcome
 * (as the single call's return value). The call returns 0 when it ran
 * (items may still have failed), or an error for the whole batch.
 */
int mc_batch_put(mc_client *c, size_t n, const void *const *keys, const size_t *klens,
		 const void *const *values, const size_t *lens, const struct mc_put_opts *opts,
		 int *results);
/* values[i]: malloc'd (free them), NULL for failed items. */
int mc_batch_get(mc_client *c, size_t n, const void *const *keys, const size_t *klens,
		 void **values, size_t *lens, int *results);
/* results[i]: bytes read into bufs[i], or an error. */
int mc_batch_get_into(mc_client *c, size_t n, const void *const *keys, const size_t *klens,
		      void *const *bufs, const size_t *caps, int64_t *results);
int mc_batch_exist(mc_client *c, size_t n, const void *const *keys, const size_t *klens,
		   int *results);
int mc_batch_remove(mc_client *c, size_t n, const void *const *keys, const size_t *klens,
		    int force, int *results);

/* A piece of caller memory: one of the buffers an object is put from or
 * read into. */
struct mc_part {
	void *buf;
	size_t len;
};

/*
 * Batch puts of values in several pieces each: value i is parts[i][0..
 * nparts[i]) one after another (Mooncake's multi-buffer layouts: K and V,
 * one piece per layer). A one-piece value in memory the agent maps is
 * read in place; pieces are gathered through staging otherwise. results
 * and errors as mc_batch_put (-EINVAL: nparts[i] is 0).
 */
int mc_batch_put_parts(mc_client *c, size_t n, const void *const *keys, const size_t *klens,
		       const struct mc_part *const *parts, const size_t *nparts,
		       const struct mc_put_opts *opts, int *results);
/*
 * Batch gets scattering value i over parts[i][0..nparts[i]) in order.
 * results[i]: the value's size, -ENOBUFS when it is larger than its
 * parts together, or the item's error (as mc_batch_get_into).
 */
int mc_batch_get_into_parts(mc_client *c, size_t n, const void *const *keys,
			    const size_t *klens, const struct mc_part *const *parts,
			    const size_t *nparts, int64_t *results);
/*
 * Views of n values in one round trip (see mc_get_view): datas[i],
 * lens[i] and views[i] for items whose results[i] is 0; release every
 * views[i] that is not NULL. Local objects are mapped, others copied.
 */
int mc_batch_get_view(mc_client *c, size_t n, const void *const *keys, const size_t *klens,
		      const void **datas, size_t *lens, mc_view **views, int *results);

/* One byte range of an object read into caller memory (mc_get_ranges). */
struct mc_range_req {
	const void *key;
	size_t klen;
	void *dst;           /* inside memory registered in this session */
	uint64_t src_offset; /* into the object */
	size_t len;
};

/*
 * Read byte ranges of objects into registered memory, each object fetched
 * once however many ranges name it (one round trip). results[i]: len,
 * or the range's error: MC_EOBJECT_NOT_FOUND, -ERANGE (past the object's
 * end), -EINVAL (key, or a destination not inside memory registered with
 * mc_register_buffer/mc_register_memory/mc_buffer_alloc), -ENOBUFS (the
 * range runs past the end of that registered memory). Returns 0 when the
 * call ran, or an error for all of it.
 */
int mc_get_ranges(mc_client *c, const struct mc_range_req *reqs, size_t n, int64_t *results);

/*
 * Remove every object whose key matches pattern (a POSIX extended
 * regular expression, searched anywhere in the key as by regexec; keys
 * with NUL bytes never match); leased ones only with force. The master
 * walks its whole index for it. Returns how many were removed, or
 * -EINVAL (the pattern does not compile), MC_EUNAVAILABLE.
 */
int64_t mc_remove_regex(mc_client *c, const char *pattern, int force);
/*
 * Clear objects as Mooncake's BatchReplicaClear does: segment NULL or ""
 * removes each object whole, a segment name drops only its replicas
 * there (the object goes when none is left). Leased objects and objects
 * still being written are skipped. cleared[i]: 1 if key i was cleared,
 * 0 if skipped (not found, leased, no replica there), or an error.
 * Errors: those of mc_batch_remove.
 */
int mc_batch_replica_clear(mc_client *c, size_t n, const void *const *keys,
			   const size_t *klens, const char *segment, int *cleared);

/* Where one replica of an object is (mc_batch_get_replicas). */
struct mc_replica {
	char segment[256]; /* its segment: the name of the agent holding it */
	uint64_t address;  /* MC_TIER_DRAM: the bytes' address in that segment */
	uint64_t size;     /* the object's bytes */
	int tier;          /* MC_TIER_DRAM or MC_TIER_SSD (that agent's SSD tier) */
	int complete;      /* 1: sealed and readable; 0: still being written */
};

/*
 * Where the objects' replicas are, as the master places them (Mooncake's
 * batch_get_replica_desc). Key i's replicas go to reps[i * cap ..]:
 * counts[i] says how many it has (more than cap when some did not fit),
 * results[i] is 0 or its error (MC_EOBJECT_NOT_FOUND, -EINVAL for a bad
 * key). The master counts the question as a read: it holds the objects
 * for its read lease. Returns 0 when the call ran, or an error for all of
 * it (MC_EUNAVAILABLE: no master).
 */
int mc_batch_get_replicas(mc_client *c, size_t n, const void *const *keys, const size_t *klens,
			  struct mc_replica *reps, size_t cap, size_t *counts, int *results);

/*
 * Buffers the agent maps: mc_buffer_alloc returns len bytes of shared
 * memory (from the agent: huge pages and NUMA placement like its segment
 * when available), registered for zero-copy puts, gets and transfers, and
 * published to the transfer engine at its address so that peers can read
 * and write it (mc_transfer from another node). The address is this
 * library's choice: where another process's buffer is published there
 * already (sessions without an engine of their own share the agent's), it
 * takes another place. Errors: -EINVAL (len 0), -ENOMEM, -ENOSPC (too
 * many buffers in the session, or the agent's --client-alloc-size is used
 * up), -EEXIST (8 places taken), MC_EUNAVAILABLE.
 */
int mc_buffer_alloc(mc_client *c, size_t len, void **buf);
/* Errors: -ENOENT (not from mc_buffer_alloc). */
int mc_buffer_free(mc_client *c, void *buf);
/*
 * Register memory the caller mapped from its own memfd (sealed with
 * F_SEAL_SHRINK, opened read-write): [addr, addr + len) maps fd at
 * offset. Zero copy like mc_buffer_alloc's buffers; published to the
 * transfer engine at addr. The agent keeps its own reference to the
 * memfd. Errors: -EBADF (not a memfd), -EPERM (another user's), -EINVAL
 * (not sealed, range), -EEXIST (overlaps a registered buffer).
 */
int mc_register_memfd(mc_client *c, int fd, uint64_t offset, void *addr, size_t len);
/*
 * Register any memory for mc_transfer/mc_put_from/mc_get_into. Memory
 * that is not a buffer of this session cannot be shared with the agent:
 * it is accepted and moved by copying through the staging buffer (which
 * also means peers cannot reach it with their transfers). CUDA device
 * memory (asked of the CUDA driver when this process has loaded it) is
 * refused: the CPU cannot copy it. Returns 0, or -EINVAL (len 0), -EEXIST
 * (overlaps a registered range), -EOPNOTSUPP (CUDA device memory).
 */
int mc_register_buffer(mc_client *c, void *addr, size_t len);
/* Errors: -ENOENT. */
int mc_unregister_buffer(mc_client *c, void *addr);

/*
 * Register memory for transfers as a TransferEngine does: like
 * mc_register_buffer, and memory peers may then read and write — an
 * mc_host_alloc allocation (whole) or memory inside an mc_buffer_alloc
 * buffer is published to the transfer engine at its address, and peers
 * write it in place. Other memory (malloc, numpy, a CPU tensor, pinned
 * or not) is published for the agent to reach by cross-memory attach:
 * this process names the agent with prctl(PR_SET_PTRACER) (replacing any
 * ptracer it named before), the agent checks that it may attach and that
 * every byte is mapped readable and writable, and serves peers' requests
 * for it with process_vm_readv/writev through its own buffers (over tcp,
 * for same-host and rdma peers too: one copy per byte, see libmooncake(3),
 * Memory). This process's own puts, gets and transfers still copy such
 * memory through staging. CUDA device memory (asked of the CUDA driver
 * when this process has loaded it: Mooncake's location "*" finds it the
 * same way) is registered as mc_register_cuda does. A registration that
 * peers could not use fails. Errors: those of mc_register_buffer (but
 * -EOPNOTSUPP: mc_register_cuda's), -EEXIST (another session of the
 * process published the allocation already, or the range overlaps memory
 * published there), -EPERM (the agent may not attach: the kernel's
 * ptrace rules, or an agent outside this pid namespace), -EFAULT (part of
 * the range is not mapped readable and writable), -ENOSYS (no pidfds:
 * Linux before 5.3), -EOPNOTSUPP (an agent without a transfer engine).
 */
int mc_register_memory(mc_client *c, void *addr, size_t len);

/*
 * Register device memory (a GPU's) for peers' RDMA: fd is a dma-buf of it
 * (borrowed: sent to the agent, which keeps its own reference), and
 * [offset, offset + len) of the dma-buf is the memory at addr in this
 * process — the address peers use. The agent registers it with each of
 * its RDMA devices (ibv_reg_dmabuf_mr) and publishes it: peers write and
 * read it by one-sided RDMA, the NIC reaching the device directly. It is
 * also the local memory of this process's transfers to RDMA peers (the
 * agent's NIC reads or writes it by its MR). No CPU copies it: tcp and
 * shm peers' requests for it fail, a transfer item with it whose target
 * the agent cannot reach by RDMA (a peer on the same host over shm, a tcp
 * peer, a region without rkeys) fails with -EOPNOTSUPP, and so does an
 * item partly in it; puts and gets cannot use it (do not pass it).
 * Errors: -EINVAL, -EEXIST (overlaps a registered range),
 * -EOPNOTSUPP (the agent's engine has no RDMA device, or its device or
 * libibverbs registers no dma-bufs), the RDMA registration's errors
 * (-ENOMEM, -EACCES, -EFAULT), MC_EUNAVAILABLE.
 */
int mc_register_dmabuf(mc_client *c, int fd, uint64_t offset, void *addr, size_t len);
/*
 * Register CUDA device memory [addr, addr + len) as mc_register_dmabuf
 * does, its dma-buf exported by the CUDA driver: libcuda.so.1 is loaded
 * at the first call (never linked), the pointer must be device memory
 * inside one allocation (cuPointerGetAttribute, cuMemGetAddressRange),
 * and that allocation is exported whole (cuMemGetHandleForAddressRange,
 * CUDA 11.7, a device with dma-buf support). Errors: -EOPNOTSUPP (no
 * CUDA driver, too old, or the device exports no dma-bufs), -EINVAL (not
 * device memory of the current context, or past its allocation), those
 * of mc_register_dmabuf.
 */
int mc_register_cuda(mc_client *c, void *addr, size_t len);

/*
 * Host memory the agent can map, without a handle and from any thread:
 * len bytes of a memfd of this process, mapped shared at a 2 MiB-aligned
 * address (NULL and errno on failure). The first time a session meets an
 * address inside it — a put, get, transfer or registration — it hands the
 * memfd to its agent, which then reads and writes it in place (zero copy);
 * mc_register_memory publishes it to peers too. The signatures are those
 * a PyTorch pluggable allocator or LMCache's allocator hook calls
 * (void *(size_t), void (void *)).
 */
void *mc_host_alloc(size_t len);
/* Free an mc_host_alloc allocation (p its start; any other pointer, and
 * NULL, is ignored): every session that has it gives it back first. */
void mc_host_free(void *p);
/* The length of the mc_host_alloc allocation starting at p, 0 if none. */
size_t mc_host_size(const void *p);

enum mc_transfer_op { MC_TRANSFER_READ = 0, MC_TRANSFER_WRITE = 1 };

struct mc_transfer_req {
	enum mc_transfer_op op; /* READ: remote -> local; WRITE: local -> remote */
	void *local;
	size_t len;
	const char *target;   /* segment name, "host:port" of its agent */
	uint64_t remote_addr; /* an address the target registered */
};

/*
 * Move bytes between local memory and memory registered on a target
 * (another node's segment or client buffer), synchronously. results[i]:
 * 0 or the item's error (MC_EINVALID_REPLICA: the address is not
 * registered there; MC_EUNAVAILABLE: the target cannot be reached).
 * Returns 0 when the batch ran, or an error for all of it.
 */
int mc_transfer(mc_client *c, const struct mc_transfer_req *reqs, size_t n, int *results);

/* What a transfer target's segment offers (mc_segment_info). */
struct mc_segment_info {
	uint64_t first_address; /* its first registered region (0: none) */
	uint64_t first_length;
	uint64_t regions; /* how many it has */
};

/*
 * Open segment name ("host:port") through the agent, as a transfer to it
 * would, and describe it: a probe of whether a peer can be reached.
 * Errors: MC_ESEGMENT_NOT_FOUND / MC_EUNAVAILABLE (not reachable),
 * -EINVAL, -EOPNOTSUPP (an agent that does not serve the request).
 */
int mc_segment_info(mc_client *c, const char *name, struct mc_segment_info *out);

/* The agent's transfer-engine address "host:port" (its segment name). */
const char *mc_agent_address(const mc_client *c);

/*
 * Give this session a transfer engine of its own, run by the agent, as
 * each of Mooncake's TransferEngine instances has: its own segment,
 * named "host:port" by a port of its own — the session id peers use, so
 * that two processes on one node are told apart — published like the
 * agent's (served to P2P peers at that port, and put in meta when the
 * agent uses meta). Memory this session publishes from then on
 * (mc_buffer_alloc, mc_register_memfd, mc_register_memory) is in that
 * segment, and its transfers are made by that engine. The engine lives
 * as long as the session or any of that memory. The name (NUL
 * included) is copied into name[0..cap); a second call gives it again.
 * Errors: -EBUSY (the session published memory with the agent's segment
 * already: call this first), -EOPNOTSUPP (an agent without a transfer
 * engine), -ENOSPC (cap too small), the agent's errors of starting one
 * (listening, devices), MC_EUNAVAILABLE.
 */
int mc_engine_open(mc_client *c, char *name, size_t cap);
/* Sizes the agent offers: its segment and this session's staging. */
uint64_t mc_segment_size(const mc_client *c);
uint64_t mc_staging_size(const mc_client *c);

/* The agent's own figures (its Stats request): what it offers, who uses
 * it, and counters since it started. Strings are cut to fit. */
struct mc_agent_stats {
	char agent_id[128];               /* also its segment's name, "host:port" */
	char master[128];                 /* the master leader in use ("" if none) */
	uint64_t master_view;             /* that leader's view number */
	uint64_t segment_size;            /* bytes of DRAM given to the pool */
	int hugepages;                    /* 1: the segment is backed by huge pages */
	int numa_node;                    /* -1: not bound */
	uint64_t staging_size;            /* staging buffer of a session */
	uint64_t clients, buffers, views; /* open now */
	uint64_t puts, gets, local_hits, remote_hits, misses;
	uint64_t bytes_written, bytes_read;
	uint64_t inventory;  /* objects known in its segment */
	uint64_t get_bad;    /* verified gets whose bytes did not match */
	uint64_t resync_bad; /* inventory items left out at a re-sync */
	/* Its SSD tier (all 0 and "" without one). */
	char ssd_segment[160]; /* the tier's segment name */
	uint64_t ssd_size, ssd_used, ssd_objects;
	uint64_t ssd_hits;       /* gets served from it */
	uint64_t ssd_demotions;  /* objects moved into it from DRAM */
	uint64_t ssd_promotions; /* objects copied back to DRAM on a hit */
	/* Gets clients answered themselves from the agent's shared lease
	 * table (also counted in gets, local_hits and bytes_read). */
	uint64_t table_gets;
	/* The SSD tier's data I/Os finished, and their time in ns, submitted
	 * to finished (a read's with its checksum checked): the mean
	 * latency is ssd_read_ns / ssd_reads. */
	uint64_t ssd_reads, ssd_read_ns, ssd_writes, ssd_write_ns;
};
int mc_agent_stats(mc_client *c, struct mc_agent_stats *out);

/* Text for a negative error code returned by any mc_ function. */
const char *mc_strerror(int code);
/* Name of an error code ("MC_EOBJECT_NOT_FOUND", "ENOENT"). */
const char *mc_errname(int code);
/* Library version, "MAJOR.MINOR.PATCH". */
const char *mc_version(void);

#ifdef __cplusplus
}
#endif

#endif
