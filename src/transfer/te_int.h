/*
 * te_int: what the transfer engine's files share — the engine, segment,
 * batch and slice structures, the data-plane workers, the transport
 * function table, and the pure pieces (descriptors, slicing,
 * range checks; the wire formats are in wire.h) that the unit tests and
 * the fuzz target drive directly.
 *
 * Threads and who owns what
 * -------------------------
 *   loop     the caller's libuv loop: meta (publish, resolve, watch), the
 *            P2P descriptor fetch, the gRPC service. Never blocks.
 *   setup    one thread for blocking control work: connecting to peers
 *            (TCP connect + handshake, shm socket + mmap), reopening a
 *            segment after its descriptor changed. Jobs are queued to it.
 *   workers  te-threads data-plane threads. Each owns an epoll set and a
 *            task queue woken by an eventfd (memcached style): TCP
 *            connections (client and server side) live on one worker each
 *            and are only touched there; shm copies are tasks.
 * Submitters (any thread) hand tcp slices to the peer's locked queue and
 * wake its connections' workers, which take from it while their window
 * has room; shm copies go to a worker's task queue.
 *
 * Transports (struct te_xport_ops) in the Redis ConnectionType style: the
 * core knows nothing of sockets or mappings. A transport has engine-wide
 * state (listener, devices) and per-peer state (struct te_peer embedded
 * first in its own struct). The core binds each request to one peer
 * (bind: resolve and check the remote range, return a route cookie), cuts
 * it into slices, stripes the slices over the peer's paths (connections,
 * NICs, workers) and hands each to submit; the transport completes every
 * slice exactly once with te__slice_done. A slice that fails because its
 * path broke is resubmitted on another live path of the same peer; a
 * refusal by the remote side is final. The chosen path is binding for shm
 * (the worker) and meant to be for rdma (the NIC); tcp treats it as a hint
 * and lets its connections pull from one queue, so the stripe follows
 * each connection's actual speed.
 *
 * The rdma transport (rdma_transport.c, on rdma.h): init opens devices
 * and describe fills the NIC list of the descriptor; region_add registers
 * an MR per NIC and writes the rkeys (and, in the descriptor, the MR base
 * rdma_addr) into the region; connect opens a TCP control connection to
 * the peer's data port (the same authenticated handshake as tcp,
 * te__ctrl_open) and keeps it, exchanges QP endpoints as TE_WIRE_CTRL
 * messages (te__ctrl_xchg; on the serving side on_ctrl, whose state lives
 * until ctrl_closed) and moves the QPs to RTS; bind finds the rkeys in
 * the peer's descriptor; paths are QPs (one per NIC pair); submit queues
 * a one-sided READ/WRITE for the QP's worker to post, and the CQ thread
 * calls te__slice_done. A slice without an rkey or a registered local
 * buffer, or whose QPs failed, goes to a tcp peer the rdma peer holds
 * (slice->xp carries the local MR meanwhile). engine.c picks remote_proto
 * (rdma when a device is usable) and starts it like every transport:
 * looked up by protocol in the one table (te__xport_ops), then reached
 * through xops[TE_PROTO_RDMA].
 */
#ifndef MC_TRANSFER_TE_INT_H
#define MC_TRANSFER_TE_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <uv.h>

#include "common/auth.h"
#include "transfer/rdma.h"
#include "transfer/transfer.h"
#include "transfer/wire.h"

struct metric;
struct etcd_lease;
struct etcd_watch;
struct rpc_client;

/* ------------------------------------------------------------ limits */

/* TE_NAME_MAX (segment name bytes): wire.h. */
#define TE_HOST_MAX 63       /* numeric host */
#define TE_MAX_REGIONS 65536 /* per descriptor */
#define TE_MAX_NICS 16
#define TE_RDMA_DEVICES_BYTES 256 /* --rdma-devices list */
#define TE_MAX_PATHS 32           /* connections/NICs per peer */
#define TE_SLICE_MIN ((size_t)64 << 10)
#define TE_SLICE_MAX ((size_t)64 << 20)
#define TE_SLICE_DEFAULT ((size_t)1 << 20)
#define TE_MAX_BATCH_SLICES ((size_t)1 << 22)
#define TE_DESC_MAX_BYTES ((size_t)16 << 20)
#define TE_CONNECT_TIMEOUT_MS 5000
#define TE_SHM_INLINE_BYTES ((size_t)64 << 10)      /* copied by the submitter, */
#define TE_SHM_INLINE_BATCH_BYTES ((size_t)1 << 20) /* up to this per batch */
#define TE_SHM_POPULATE_BYTES ((size_t)32 << 20)    /* per task of a map's populate */

/* Transport bits in a descriptor. */
#define TE_XP_TCP (1u << TE_PROTO_TCP)
#define TE_XP_RDMA (1u << TE_PROTO_RDMA)
#define TE_XP_SHM (1u << TE_PROTO_SHM)

/* ------------------------------------------------------------ handshake (handshake.c) */

/*
 * Blocking client side over a connected stream or seqpacket socket (the
 * setup thread). Errors: -EACCES (refused or the server's mac is wrong),
 * MC_ESEGMENT_NOT_FOUND, MC_ETIMEDOUT, MC_EPROTOCOL, negative errno.
 */
int te__hs_client(int fd, const uint8_t *secret, size_t slen, const char *own,
		  const char *target, uint64_t timeout_ms) MC_MUST_CHECK;

/* Blocking exact read/write with a deadline on a non-blocking or blocking
 * fd (poll). Errors: MC_ETIMEDOUT, -ECONNRESET (EOF), negative errno. */
int te__io_full(int fd, void *buf, size_t len, bool write, uint64_t deadline_ms) MC_MUST_CHECK;

/* ------------------------------------------------------------ descriptors (desc.c, pure) */

struct te_desc_region {
	uint64_t addr;
	uint64_t len;
	bool shm;        /* memfd-backed: same-host peers may map it */
	uint32_t nrkeys; /* rdma: one rkey per NIC */
	uint32_t rkeys[TE_MAX_NICS];
	uint64_t rdma_addr; /* rdma: where its MRs start in the serving
				    * process (what one-sided ops target) */
};

struct te_desc_nic {
	char name[64];
	uint8_t gid[16];
	uint32_t lid, port, mtu;
};

struct te_desc {
	char name[TE_NAME_MAX + 1];
	char host[TE_HOST_MAX + 1];
	uint16_t data_port;
	uint16_t rpc_port;
	uint32_t transports;  /* TE_XP_* */
	char host_id[64];     /* boot id: equal => same host */
	char shm_socket[100]; /* abstract Unix socket name (no NUL) */
	uint64_t incarnation; /* random per engine start */
	uint64_t generation;  /* bumped by every change */
	bool auth;            /* the engine requires the cluster secret */
	size_t nnics;
	struct te_desc_nic *nics;
	size_t nregions;
	struct te_desc_region *regions; /* sorted by addr, disjoint */
};

/* Serialize (proto/transfer.proto SegmentDesc). *out is malloc'd.
 * Errors: -ENOMEM. */
int te__desc_encode(const struct te_desc *d, uint8_t **out, size_t *len) MC_MUST_CHECK;
/* Parse and validate (limits, sorted disjoint regions without overflow,
 * ports for offered transports). Errors: MC_EPROTOCOL, -ENOMEM. */
int te__desc_decode(const uint8_t *buf, size_t len, struct te_desc **out) MC_MUST_CHECK;
int te__desc_copy(const struct te_desc *d, struct te_desc **out) MC_MUST_CHECK;
/* The same validation from an unpacked message (GetDescriptor reply). */
struct Mooncake__Transfer__SegmentDesc;
int te__desc_from_pb(const struct Mooncake__Transfer__SegmentDesc *m,
		     struct te_desc **out) MC_MUST_CHECK;
void te__desc_free(struct te_desc *d);

/*
 * The range check every served request goes through: find the region of
 * a sorted, disjoint array (element i at base + i * stride, with uint64_t
 * addr and len at offsets addr_off and len_off) that contains all of
 * [addr, addr + len). len 0 is checked as len 1. Returns the index or
 * MC_EREMOTE_ACCESS (no such region, partly outside one, or overflow).
 */
long te__range_find(const void *base, size_t n, size_t stride, size_t addr_off, size_t len_off,
		    uint64_t addr, uint64_t len);

/* ------------------------------------------------------------ slicing (batch.c, pure) */

/* Number of slices of a request of len bytes (0 for len 0). */
size_t te__slice_count(uint64_t len, size_t slice_bytes);
/* Slice i: offset and length. */
void te__slice_at(uint64_t len, size_t slice_bytes, size_t i, uint64_t *off, size_t *slen);
/* The path for the k-th slice of a stripe starting at path start: path
 * (start + k) % npaths, or the next one after it that is alive (bit set in
 * alive) and not already tried (bit set in excluded). Returns the path or
 * -1 when none is left. */
int te__pick_path(unsigned npaths, unsigned start, size_t k, uint32_t excluded,
		  uint32_t alive);

/* ------------------------------------------------------------ workers (worker.c) */

struct te_task {
	struct te_task *next;
	void (*run)(struct te_task *t);
};

/* An fd in a worker's epoll set. */
struct te_ioh {
	void (*on_io)(struct te_ioh *h, uint32_t events);
};

struct te_worker {
	struct te_engine *e;
	unsigned idx;
	pthread_t tid;
	int epfd, evfd;
	pthread_mutex_t mu;
	struct te_task *head, **tail;
	bool stop;
	bool exited; /* later posts run on the poster's thread */
	struct te_ioh wake;
};

int te__workers_start(struct te_engine *e, unsigned n) MC_MUST_CHECK;
void te__workers_stop(struct te_engine *e);
void te__worker_post(struct te_worker *w, struct te_task *t);
bool te__on_worker(const struct te_worker *w);
/* epoll_ctl on the worker's set (thread-safe). */
int te__worker_add(struct te_worker *w, int fd, struct te_ioh *h,
		   uint32_t events) MC_MUST_CHECK;
int te__worker_mod(struct te_worker *w, int fd, struct te_ioh *h,
		   uint32_t events) MC_MUST_CHECK;
void te__worker_del(struct te_worker *w, int fd);

/* ------------------------------------------------------------ regions (region.c) */

struct te_region {
	struct te_engine *e;
	uint64_t addr;
	uint64_t len;
	uint8_t *local; /* NULL for another process's memory */
	int memfd;      /* dup'd, owned; -1 when not shareable */
	uint64_t memfd_off;
	pid_t pid;  /* te_register_process: whose memory it
				    * is (0: this process's, at local) */
	int pidfd;  /* ... its pidfd (dup'd, owned) or -1 */
	int dmabuf; /* te_register_dmabuf: the dma-buf (dup'd,
				    * owned) or -1; no local memory: RDMA
				    * only, known to the NICs at addr */
	uint64_t dmabuf_off;
	uint32_t id;          /* shm protocol id */
	atomic_uint inflight; /* served requests touching it */
	bool dead;
	uint32_t nrkeys;
	uint32_t rkeys[TE_MAX_NICS];
	void *xp[4]; /* per transport (indexed by te_protocol) */
};

struct te_rtable {
	pthread_rwlock_t lock;
	struct te_region **v; /* sorted by addr */
	size_t n, cap;
	pthread_mutex_t wait_mu;
	pthread_cond_t wait_cv;
	uint32_t next_id;
};

int te__rtable_init(struct te_rtable *t) MC_MUST_CHECK;
void te__rtable_destroy(struct te_rtable *t);
/* Errors: -EEXIST (overlap), -ENOMEM. Assigns r->id. */
int te__rtable_add(struct te_rtable *t, struct te_region *r) MC_MUST_CHECK;
/* Remove, then wait until no served request holds it. */
void te__rtable_del(struct te_rtable *t, struct te_region *r);
/* Find the region holding [addr, addr + len) and count a request on it.
 * Errors: MC_EREMOTE_ACCESS. */
int te__rtable_acquire(struct te_rtable *t, uint64_t addr, uint64_t len,
		       struct te_region **out) MC_MUST_CHECK;
void te__rtable_release(struct te_rtable *t, struct te_region *r);
/* Copy the regions into a descriptor (sorted). Errors: -ENOMEM. */
int te__rtable_describe(struct te_rtable *t, struct te_desc *d) MC_MUST_CHECK;
/*
 * Move len bytes between buf and [addr, addr + len) of region r, which
 * holds that range: memcpy for this process's memory, cross-memory
 * attach (process_vm_readv/writev) for another process's. write: buf ->
 * region. Errors: MC_EREMOTE_ACCESS (a dma-buf, which only RDMA reaches;
 * another process's range no longer mapped writable, or the process
 * refuses access), -ESRCH (that process exited).
 */
int te__region_io(const struct te_region *r, uint64_t addr, void *buf, size_t len,
		  bool write) MC_MUST_CHECK;

/* Call fn for each region under the read lock. */
void te__rtable_foreach(struct te_rtable *t, void (*fn)(void *ud, struct te_region *r),
			void *ud);

/* ------------------------------------------------------------ transports */

struct te_xport;
struct te_peer;
struct te_slice;

struct te_xport_ops {
	const char *name;
	enum te_protocol proto;
	/* Engine-wide set-up (listeners, devices) on te_new's thread, and
	 * teardown after the workers stopped. */
	int (*init)(struct te_engine *e, struct te_xport **out);
	void (*fini)(struct te_xport *x);
	/* Add what peers need to the descriptor (ports, NICs, rkeys). */
	void (*describe)(struct te_xport *x, struct te_desc *d);
	/* A local region appeared / is going away. region_del returns once
	 * no peer can touch the region through this transport. Optional. */
	int (*region_add)(struct te_xport *x, struct te_region *r);
	void (*region_del)(struct te_xport *x, struct te_region *r);
	/* Connect to a peer described by d (setup thread; may block up to
	 * TE_CONNECT_TIMEOUT_MS). Errors: -EACCES, MC_ESEGMENT_NOT_FOUND,
	 * MC_EUNAVAILABLE, MC_ETIMEDOUT, -ENOMEM. */
	int (*connect)(struct te_xport *x, struct te_segment *seg, const struct te_desc *d,
		       struct te_peer **out);
	/* Bind a request's remote range; *route comes back in each slice.
	 * 0, MC_EREMOTE_ACCESS (refused) or -EAGAIN (not this transport's:
	 * try the next). NULL: always 0 (the remote side checks). */
	int (*bind)(struct te_peer *p, uint64_t addr, uint64_t len, void **route);
	void (*unbind)(struct te_peer *p, void *route);
	/* Start one slice on path s->path; complete it with te__slice_done,
	 * possibly before returning. Any thread. */
	void (*submit)(struct te_peer *p, struct te_slice *s);
	/* Stop: close paths, fail what is queued (path errors). Once. */
	void (*disconnect)(struct te_peer *p);
	/* Free after the last reference. */
	void (*peer_free)(struct te_peer *p);
	/* Every second on each worker: time out what that worker owns.
	 * Optional. */
	void (*tick)(struct te_xport *x, struct te_worker *w);
	/* Serving side of a TE_WIRE_CTRL message (rdma QP exchange) from
	 * the authenticated peer segment `peer`: answer into out (capacity
	 * *outlen, set it to the answer's length). *conn is this transport's
	 * state for the TCP connection the message came on (NULL at first);
	 * when on_ctrl leaves it non-NULL, ctrl_closed(x, *conn) runs once
	 * that connection closes, so what a peer set up lives as long as its
	 * control connection. Both run on a data worker (ctrl_closed also at
	 * teardown) and must not block long. Optional. */
	int (*on_ctrl)(struct te_xport *x, const char *peer, void **conn, const uint8_t *in,
		       size_t inlen, uint8_t *out, size_t *outlen);
	void (*ctrl_closed)(struct te_xport *x, void *conn);
};

/*
 * A transport's control exchange with a peer (rdma: QP endpoint info),
 * over a fresh TCP connection to the peer's data port, authenticated like
 * every data connection: send in, get the peer transport's answer (its
 * on_ctrl) into out (capacity *outlen, set to the answer's length).
 * Blocking (setup thread). Errors: -EPROTONOSUPPORT (the peer's transport
 * takes no control messages), the peer's on_ctrl error, -EACCES,
 * MC_EUNAVAILABLE, MC_ETIMEDOUT, -EOVERFLOW, MC_EPROTOCOL, -EINVAL (more
 * than TE_CTRL_MAX_BYTES).
 */
#define TE_CTRL_MAX_BYTES ((size_t)64 << 10)
int te__ctrl_call(struct te_engine *e, const struct te_desc *d, unsigned xid,
		  const uint8_t *in, size_t inlen, uint8_t *out, size_t *outlen,
		  uint64_t timeout_ms) MC_MUST_CHECK;
/* The same in two steps, for a transport that keeps its control
 * connection open (the serving side keeps what it set up for the peer
 * until that connection closes): te__ctrl_open returns the connected,
 * authenticated fd (the caller closes it) or an error of te__ctrl_call;
 * te__ctrl_xchg does one exchange on it (blocking; errors as
 * te__ctrl_call, and after an I/O error the fd is unusable). */
int te__ctrl_open(struct te_engine *e, const struct te_desc *d,
		  uint64_t timeout_ms) MC_MUST_CHECK;
int te__ctrl_xchg(int fd, unsigned xid, const uint8_t *in, size_t inlen, uint8_t *out,
		  size_t *outlen, uint64_t timeout_ms) MC_MUST_CHECK;

/*
 * The transports, one per protocol, registered in one table (engine.c):
 * the ops of TE_PROTO_TCP, TE_PROTO_RDMA or TE_PROTO_SHM; NULL for any
 * other value. Nothing names a transport's ops but that table: the
 * engine starts each through this lookup, and everything after reaches a
 * started transport through e->xops[proto] (NULL while it is not
 * running, beside its state e->xp[proto]).
 */
const struct te_xport_ops *te__xport_ops(enum te_protocol proto);
/* The TCP data listener's port. */
uint16_t te__tcp_port(const struct te_xport *x);

/*
 * rdma control message (the payload of a TE_WIRE_CTRL for the rdma
 * transport), little-endian: the initiator's CONNECT carries its QP
 * endpoints, the server's ACCEPT its own for the same QPs.
 *
 *   0 u32 magic "MCRD"   5 u8 kind (1 CONNECT, 2 ACCEPT)   7 u8 n endpoints
 *   4 u8  version (1)    6 u8 sender's NIC count           8 u64 incarnation
 *  16 n x TE_RDMA_EP_WIRE_BYTES endpoints (rdma.h), QP k at k
 */
#define TE_RDMA_MSG_MAGIC 0x4452434du /* "MCRD" */
#define TE_RDMA_MSG_HDR 16
#define TE_RDMA_MSG_MAX (TE_RDMA_MSG_HDR + TE_RDMA_MAX_NICS * TE_RDMA_EP_WIRE_BYTES)
enum te_rdma_msg_kind { TE_RDMA_CONNECT = 1, TE_RDMA_ACCEPT = 2 };

struct te_rdma_msg {
	uint8_t kind;
	uint8_t nics;         /* the sender's NIC count */
	uint8_t n;            /* endpoints: max(both sides' NIC counts) */
	uint64_t incarnation; /* the sender engine's */
	struct te_rdma_ep eps[TE_RDMA_MAX_NICS];
};

/* Returns the encoded length (<= TE_RDMA_MSG_MAX). */
size_t te__rdma_msg_encode(const struct te_rdma_msg *m, uint8_t out[TE_RDMA_MSG_MAX]);
/* Errors: MC_EPROTOCOL (length, magic, version, kind, counts out of
 * 1..TE_RDMA_MAX_NICS or n below nics, a bad endpoint). */
int te__rdma_msg_decode(const uint8_t *in, size_t len, struct te_rdma_msg *m) MC_MUST_CHECK;

/* Per-peer state common to all transports (first member of theirs). */
struct te_peer {
	const struct te_xport_ops *ops;
	struct te_xport *x;
	struct te_segment *seg;
	/* The segment's name, for the peer's log lines: its tasks may run
	 * after the segment is freed (seg is for the segment's own calls). */
	char name[TE_NAME_MAX + 1];
	atomic_int refs; /* the segment's + one per bound request */
	unsigned npaths;
	atomic_uint alive;  /* bit per live path */
	atomic_uint stripe; /* next stripe start */
	atomic_bool closed;
};

void te__peer_ref(struct te_peer *p);
void te__peer_unref(struct te_peer *p);
/* A path died: count it; when none is left the segment is refreshed. */
void te__peer_path_down(struct te_peer *p, unsigned path);

/* ------------------------------------------------------------ batches (batch.c) */

struct te_slice {
	struct te_slice *next; /* queue link (owner: whoever queued it) */
	struct te_batch *batch;
	uint32_t req; /* request index */
	uint8_t op;   /* TE_READ / TE_WRITE */
	uint8_t tries;
	bool device; /* local is device memory: RDMA only */
	uint16_t path;
	bool summed;       /* crc is the CRC-32C of what the transport copied */
	uint32_t crc;      /* ... (want_crc: shm sums as it copies) */
	uint32_t excluded; /* paths that failed it */
	uint32_t len;
	uint64_t remote;
	uint8_t *local;
	void *route;
	uint64_t wire_id;
	size_t done_bytes;   /* transport progress (tx/rx) */
	void *xp;            /* transport's (rdma: the local MR) */
	struct te_task task; /* shm: the copy on a worker */
	uint8_t hdr[TE_WIRE_HDR_BYTES];
};

struct te_req_state {
	struct te_request r;
	struct te_batch *batch;
	_Atomic int status; /* enum te_status */
	_Atomic int err;
	atomic_size_t left;    /* slices not completed */
	_Atomic uint32_t crc;  /* want_crc: the XOR of the slices' sums, each
				* moved over the bytes after it (crc32c_combine) */
	size_t first, nslices; /* into batch->slices */
	struct te_peer *peer;  /* bound peer (ref) */
	void *route;
	struct te_req_state *park_next;
	uint64_t t0_ns;
};

struct te_batch {
	struct te_engine *e;
	size_t n;
	struct te_req_state *reqs;
	struct te_slice *slices;
	size_t nslices;
	atomic_size_t pending;     /* requests not done (+1 while submitting) */
	atomic_size_t inline_left; /* shm bytes the submitter may still copy */
	bool inline_any;           /* ... in slices of any size (te_submit_inline) */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool done;
	void (*on_done)(struct te_batch *b, void *ud);
	void *ud;
};

/* Complete a slice. err 0: done; retry: the path failed (the slice may
 * be resubmitted on another path); otherwise final. */
void te__slice_done(struct te_slice *s, int err, bool retry);
/* The final error of the slice's request when it already failed (a
 * transport may complete such a slice with it instead of moving bytes),
 * else 0. */
int te__slice_doomed(const struct te_slice *s);
/* Route and start a request (used again for parked requests). Takes the
 * segment lock. */
void te__req_dispatch(struct te_batch *b, struct te_req_state *rs);
void te__req_fail(struct te_batch *b, struct te_req_state *rs, int err);

/* ------------------------------------------------------------ segments (segment.c) */

struct te_job {
	struct te_job *next;
	void (*fn)(struct te_job *j);
	bool queued;
};

enum te_seg_state {
	TE_SEG_RESOLVING, /* first descriptor lookup / connect */
	TE_SEG_OPEN,
	TE_SEG_REFRESHING, /* new descriptor or broken paths: reconnecting */
	TE_SEG_FAILED,     /* first open failed; removed from the cache */
};

struct te_open_waiter {
	struct te_open_waiter *next;
	void (*cb)(void *ud, int err, struct te_segment *s);
	void *ud;
};

struct te_segment {
	struct te_engine *e;
	struct te_segment *next; /* engine cache list */
	char name[TE_NAME_MAX + 1];
	atomic_int refs; /* cache's + users' */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	enum te_seg_state state;
	int err;                   /* of the failed first open */
	struct te_desc *desc;      /* current, owned */
	struct te_desc *next_desc; /* to apply (from a watch event), owned */
	bool deleted;              /* the key was deleted from meta */
	struct te_peer *shm;       /* same-host path or NULL */
	struct te_peer *remote;    /* tcp (rdma) or NULL */
	struct te_req_state *parked, **parked_tail;
	bool in_cache;
	uint64_t refresh_after_ms;      /* backoff of broken-path refreshes */
	struct te_open_waiter *waiters; /* async opens (loop thread) */
	struct te_job resolve_job;      /* loop */
	struct te_job connect_job;      /* setup thread */
	struct te_job notify_job;       /* loop: run async waiters */
};

/* ------------------------------------------------------------ gRPC service (svc.c) */

/* A Challenge nonce: u64 issued_ms, TE_CHAL_RAND random bytes, a tag. */
#define TE_CHAL_RAND 16
#define TE_CHAL_TAG 16
#define TE_CHAL_BYTES (8 + TE_CHAL_RAND + TE_CHAL_TAG)
#define TE_CHALLENGE_TTL_MS 30000
#define TE_CHALLENGE_USED_MAX 1024 /* accepted proofs remembered */

struct te_chal_used {
	uint64_t issued_ms; /* 0: free */
	uint8_t rnd[TE_CHAL_RAND];
};

/* The service's state, owned by svc.c, touched on the loop thread only. */
struct te_svc {
	uint8_t key[32]; /* tags this engine's challenges */
	struct te_chal_used used[TE_CHALLENGE_USED_MAX];
	size_t next; /* the slot the next accepted proof takes */
};

/* Serve mooncake.transfer.Transfer on e->rpc (logs its errors). Errors:
 * those of mc_random and rpc_server_add_service. */
int te__svc_start(struct te_engine *e) MC_MUST_CHECK;
/* The nonce Challenge answers, issued at now_ms (> 0). Pure. */
void te__svc_challenge(const struct te_svc *v, uint64_t now_ms,
		       const uint8_t rnd[TE_CHAL_RAND], uint8_t out[TE_CHAL_BYTES]);
/* Check a GetDescriptor proof at now_ms and remember its challenge as
 * used. Pure. Errors: -EACCES (refused; *why says why), -EBUSY (too many
 * proofs accepted within TE_CHALLENGE_TTL_MS: try again). */
int te__svc_check(struct te_svc *v, const uint8_t *secret, size_t slen, const uint8_t *chal,
		  size_t clen, const char *name, const uint8_t *mac, size_t maclen,
		  uint64_t now_ms, const char **why) MC_MUST_CHECK;

/* ------------------------------------------------------------ engine */

/* What refused an unauthenticated peer (mooncake_te_auth_refused_total). */
enum te_auth_where { TE_AUTH_TCP, TE_AUTH_SHM, TE_AUTH_GRPC, TE_AUTH_N };

/* Connections of a listener (the data port, the shm socket) that may be
 * in their handshake at once, each for at most --te-io-timeout: past it
 * a new one is closed as soon as it is accepted, so peers without the
 * secret hold a bounded number of descriptors and structs. */
#define TE_MAX_HANDSHAKES 256u

struct te_hs_bound {
	atomic_uint n;      /* accepted, handshake not over */
	uint64_t logged_ms; /* last warning (the listener's thread) */
};

/*
 * On the listener's thread, for a connection just accepted on transport
 * (TE_AUTH_TCP or TE_AUTH_SHM) from who: false when the bound is full
 * (counted, logged every 10 s at most; the caller closes it), else true
 * and the connection counts until te__hs_bound_leave.
 */
bool te__hs_bound_enter(struct te_engine *e, struct te_hs_bound *b, int transport,
			const char *who);
void te__hs_bound_leave(struct te_hs_bound *b, bool *counted);

struct te_pub {
	struct etcd_lease *lease;
	int64_t lease_id;
	bool granted;  /* lease_id is valid */
	bool owns_key; /* the key was written under our lease */
	bool put_inflight, dirty, published, stopping;
	int last_err;
	uv_timer_t *retry; /* own allocation: freed by its close callback */
	bool name_held_logged;
	void (*stop_done)(struct te_engine *e, void *ud); /* te__pub_stop's */
	void *stop_done_ud;
	void (*on_stopped)(struct te_engine *e, void *ud); /* te_stop's */
	void *stop_ud;
};

struct te_engine {
	/* configuration (immutable after te_new) */
	uv_loop_t *loop;
	char name[TE_NAME_MAX + 1];
	char cluster_id[128];
	struct etcd_client *meta;
	struct rpc_server *rpc;
	char host[TE_HOST_MAX + 1];
	uint16_t rpc_port;
	enum te_protocol proto;        /* as configured */
	enum te_protocol remote_proto; /* tcp (rdma when it exists) */
	unsigned tcp_conns;
	size_t slice_bytes;
	uint64_t io_timeout_ms;
	uint64_t lease_ttl_s;
	uint8_t secret[MC_SECRET_MAX_BYTES];
	size_t secret_len;
	char host_id[64];
	uint64_t incarnation;
	char data_listen[80];
	char rdma_devices[TE_RDMA_DEVICES_BYTES]; /* "" = every usable one */
	int rdma_gid_index;                       /* -1: automatic */
	unsigned rdma_mtu_bytes;                  /* 0: the port's active MTU */
	pthread_t loop_tid;                       /* te_new's (the loop's) thread */
	struct metrics_registry *metrics;

	/* data plane */
	atomic_bool ready; /* te_new finished: workers may tick */
	struct te_worker *workers;
	unsigned nworkers;
	atomic_uint rr;
	const struct te_xport_ops *xops[4];
	struct te_xport *xp[4];
	struct te_rtable regions;
	atomic_uint_fast64_t generation;

	/* segments */
	pthread_mutex_t mu;
	struct te_segment *segs;

	/* setup thread */
	pthread_t setup_tid;
	bool setup_started;
	pthread_mutex_t setup_mu;
	pthread_cond_t setup_cv;
	struct te_job *setup_head, **setup_tail;
	bool setup_stop;

	/* loop jobs */
	uv_async_t *async; /* own allocation: freed by its close callback */
	bool async_open;
	pthread_mutex_t loop_mu;
	struct te_job *loop_head, **loop_tail;
	bool stopped; /* te_stop ran: no more loop jobs */

	struct te_svc svc;

	/* meta */
	struct te_pub pub;
	pthread_mutex_t pub_mu;
	pthread_cond_t pub_cv;
	bool pub_ok; /* descriptor in meta (or P2P) */
	int pub_err;
	struct etcd_watch *watch;
	struct te_job desc_job; /* loop: republish */

	/* metrics */
	struct metric *m_bytes[4][2];  /* [proto][op] initiated */
	struct metric *m_served[4][2]; /* [proto][op] served */
	struct metric *m_failed[4];
	struct metric *m_retries;
	struct metric *m_refused;
	struct metric *m_auth_refused[TE_AUTH_N];
	/* connections closed at accept: TE_MAX_HANDSHAKES others in theirs
	 * (tcp, shm) */
	struct metric *m_hs_refused[TE_AUTH_GRPC];
	struct metric *m_shm_inline; /* shm bytes the submitter copied */
	struct metric *m_regions, *m_reg_bytes, *m_segments;
	struct metric *m_peers[4]; /* [proto] peer objects not freed */
};

/* Run j->fn on the loop thread (thread-safe; after te_stop, te_free runs
 * what is left). False when j was already queued (it runs once). */
bool te__loop_post(struct te_engine *e, struct te_job *j);
/* Run j->fn on the setup thread. False when already queued (it runs
 * once) or when te_free stopped the thread (it does not run). */
bool te__setup_post(struct te_engine *e, struct te_job *j);
/* The descriptor changed: publish it (any thread). */
void te__desc_changed(struct te_engine *e);
/* Build this engine's descriptor. Errors: -ENOMEM. */
int te__desc_build(struct te_engine *e, struct te_desc **out) MC_MUST_CHECK;
/* Meta key of a segment: /mooncake/<cluster>/segments/<name>. */
int te__seg_key(const struct te_engine *e, const char *name, char *buf, size_t len);

/* publish.c (loop thread) */
int te__pub_start(struct te_engine *e) MC_MUST_CHECK;
void te__pub_stop(struct te_engine *e, void (*done)(struct te_engine *e, void *ud), void *ud);
void te__pub_kick(struct te_engine *e);
/* Drop what the publisher holds without talking to meta: its watch, its
 * lease (no callback of either runs afterwards) and its retry timer. For
 * an engine freed without te__pub_stop (a start-up that failed after
 * te_new); after te__pub_stop it finds nothing left. */
void te__pub_drop(struct te_engine *e);

/* segment.c */
void te__segments_watch_event(struct te_engine *e, const char *name, const uint8_t *val,
			      size_t len, bool deleted);
void te__segments_free_all(struct te_engine *e);
void te__segments_stop_loop(struct te_engine *e);
/* Every path of an open segment is down: start resolving it again unless
 * that was tried less than a second ago. Called with s->mu held; true when
 * the caller should park its request. */
bool te__seg_broken_locked(struct te_segment *s);

/* The transport a request would use for a peer, for metrics labels. */
static inline int te__op_idx(uint8_t op)
{
	return op == TE_WRITE;
}

#endif
