/*
 * rdma: the RDMA layer of the transfer engine (private to src/transfer).
 * It owns the verbs objects: selected devices and ports, one PD and one CQ
 * (with a completion channel) per device, memory regions registered on
 * every selected device, RC queue pairs to peers, and one completion
 * thread that polls every CQ and calls the engine back per work request.
 * It does no networking of its own: the engine exchanges endpoint info
 * (struct te_rdma_ep, 32 bytes on the wire) over its TCP control channel.
 *
 * How the engine uses it
 *  1. te_rdma_new() at engine creation, on any thread. It selects devices
 *     (opts.devices or all), keeps ports that are ACTIVE, chooses a GID
 *     index (RoCE v2 with an IPv4-mapped address, then RoCE v2, then RoCE
 *     v1 / IB; opts.gid_index overrides) and uses the port's active MTU
 *     (or opts.mtu_bytes when that is lower).
 *     When nothing is usable it fails with a distinct code and a reason
 *     (see below) that --protocol=auto logs before choosing tcp.
 *  2. te_rdma_reg() for every region the engine registers: synchronous
 *     and possibly slow for big regions (the kernel pins every page), so
 *     call it from a worker thread, never from the libuv loop thread. Put
 *     te_rdma_mr_rkey(mr, nic) for each NIC into the segment descriptor;
 *     use te_rdma_mr_lkey(mr, nic) for local buffers.
 *  3. Per peer segment: te_rdma_conn_new(r, peer_nics, arg) creates
 *     max(local NICs, peer NICs) RC QPs in INIT; QP k uses local NIC
 *     k % local and pairs with the peer's QP k (on its NIC k % peer_nics),
 *     so both sides compute the same pairing. Send te_rdma_conn_eps() to
 *     the peer over the control channel, receive the peer's, and call
 *     te_rdma_conn_connect() (INIT -> RTR -> RTS). The serving side does
 *     the same with the initiator's NIC count: a connection is symmetric.
 *     The serving side connects before it answers the handshake, so the
 *     initiator's first WRs never meet a QP that is not yet in RTR (they
 *     would be retried by the transport and fail after ~0.5 s).
 *  4. Data threads call te_rdma_post(conn, k, wrs, n) with slices of
 *     64 KiB - 1 MiB; k is the QP (= NIC pairing) to use, chosen by the
 *     engine to stripe slices over te_rdma_conn_qps(conn) QPs. The last WR
 *     of each call and every signal_every-th WR are signaled; unsignaled
 *     WRs are accounted by the next signaled completion. A call that would
 *     overflow the send queue posts nothing and returns -EAGAIN: the engine
 *     keeps the slices queued and resubmits from on_complete (which runs
 *     after the slots were freed) or picks another QP.
 *  5. opts.on_complete(conn_arg, cookie, status) runs on the completion
 *     thread once per WR, in posting order per QP. status: 0; -EACCES
 *     (remote access error: bad rkey, out of the region's bounds, region
 *     not writable/readable); -EFAULT (local protection: bad lkey or local
 *     bounds); MC_EUNAVAILABLE (transport or RNR retry exceeded: the peer
 *     is gone or unreachable); MC_ECANCELLED (flushed: not executed because
 *     the QP went to the error state before it; safe to retry on another
 *     QP); -EINVAL (remote invalid request); -EIO (any other). The callback
 *     may post again (also on the same QP) but must not free the
 *     connection or the context. The first error on a QP also calls
 *     opts.on_qp_error(conn_arg, k, status) after its on_complete: the QP
 *     is in ERR for good; the engine fails over to another QP and later
 *     reconnects by freeing the connection and creating a new one.
 *  6. Teardown in reverse order: te_rdma_conn_free() (moves its QPs to
 *     ERR, waits until every posted WR has been reported, flushed ones with
 *     MC_ECANCELLED, then destroys), te_rdma_dereg() once no request uses
 *     the region, te_rdma_free() last. None of these may be called from
 *     on_complete/on_qp_error.
 *
 * Threads: every function is thread-safe except that a connection, MR or
 * context must not be freed while another thread still uses it.
 * Errors of te_rdma_new (also written as a sentence into why):
 *   -ENODEV         no RDMA device, or none matches opts.devices
 *   -EACCES         no permission to open the device(s) (/dev/infiniband)
 *   -ENETDOWN       no port in state ACTIVE
 *   -EADDRNOTAVAIL  no usable GID (or the override index is not valid)
 *   -EINVAL         bad options;  -ENOMEM;  negative errno of a verb
 */
#ifndef MC_TRANSFER_RDMA_H
#define MC_TRANSFER_RDMA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define TE_RDMA_MAX_NICS 8
#define TE_RDMA_EP_WIRE_BYTES 32
#define TE_RDMA_DEFAULT_SQ_DEPTH 256
#define TE_RDMA_DEFAULT_SIGNAL_EVERY 16
#define TE_RDMA_DEFAULT_CQ_DEPTH 16384
/* Verbs parameters of every connection: local ACK timeout 4.096 us * 2^14
 * (~67 ms) per try, 7 retries, RNR retries infinite (7), 16 outstanding
 * RDMA READs each way (or the device's maximum). */
#define TE_RDMA_QP_TIMEOUT 14
#define TE_RDMA_QP_RETRY_CNT 7
#define TE_RDMA_QP_RNR_RETRY 7
#define TE_RDMA_QP_RD_ATOMIC 16

struct te_rdma;
struct te_rdma_mr;
struct te_rdma_conn;

struct te_rdma_opts {
	const char *devices;   /* "mlx5_0,mlx5_1"; NULL, "" or "auto": all usable */
	int gid_index;         /* -1: automatic */
	unsigned mtu_bytes;    /* path MTU cap (256..4096); 0: the active MTU */
	unsigned sq_depth;     /* WRs per QP send queue; 0: default */
	unsigned signal_every; /* K: signal every K-th WR; 0: default */
	unsigned cq_depth;     /* CQ entries per device; 0: default; it bounds
				* the QPs per device to cq_depth / sq_depth */
	void (*on_complete)(void *conn_arg, uint64_t cookie, int status);
	void (*on_qp_error)(void *conn_arg, unsigned qp, int status); /* or NULL */
};

/* One NIC (device + port) in use. */
struct te_rdma_nic {
	char name[64]; /* device name, "mlx5_0" */
	uint8_t port;
	uint8_t gid_index;
	uint8_t gid_type; /* 0 IB, 1 RoCE v1, 2 RoCE v2 (enum ibv_gid_type) */
	uint8_t gid[16];
	uint16_t lid;
	unsigned mtu_bytes; /* the port's active MTU */
};

/* What a peer needs to connect to one of our QPs. */
struct te_rdma_ep {
	uint8_t gid[16];
	uint16_t lid;
	uint32_t qpn; /* 24 bits */
	uint32_t psn; /* 24 bits */
	uint8_t mtu;  /* enum ibv_mtu of the local port */
	uint8_t port;
	uint8_t nic; /* index of the local NIC */
};

enum te_rdma_op { TE_RDMA_WRITE = 1, TE_RDMA_READ = 2 };

struct te_rdma_wr {
	enum te_rdma_op op;
	void *local;     /* local address inside a region registered here */
	uint32_t lkey;   /* te_rdma_mr_lkey(mr, nic of the QP) */
	uint64_t remote; /* remote address inside the peer's region */
	uint32_t rkey;   /* the peer's rkey for the QP's peer NIC */
	uint32_t len;    /* 0 .. 2^31 */
	uint64_t cookie; /* returned by on_complete */
};

/* Select devices and start the completion thread. why (may be NULL)
 * receives a sentence on failure. Errors: see the top of the file. */
int te_rdma_new(const struct te_rdma_opts *opts, struct te_rdma **out, char *why,
		size_t why_len) MC_MUST_CHECK;
/* Stop the completion thread and release every device. All connections
 * and MRs must have been freed. */
void te_rdma_free(struct te_rdma *r);

unsigned te_rdma_nic_count(const struct te_rdma *r);
/* NULL for an index >= te_rdma_nic_count(). */
const struct te_rdma_nic *te_rdma_nic(const struct te_rdma *r, unsigned nic);

/* Register [addr, addr+len) on every NIC with local write, remote read and
 * (if remote_write) remote write access. Slow for big regions: call from a
 * worker. why (may be NULL) names the limit and the fix on failure.
 * Errors: -EINVAL (NULL or empty region); -ENOMEM (the locked-memory limit
 * RLIMIT_MEMLOCK / ulimit -l, the device's max_mr, or memory); -EACCES /
 * -EPERM; -EFAULT (not mapped); negative errno of ibv_reg_mr. */
int te_rdma_reg(struct te_rdma *r, void *addr, size_t len, bool remote_write,
		struct te_rdma_mr **out, char *why, size_t why_len) MC_MUST_CHECK;
/* Register len bytes of a dma-buf (fd, from offset: device memory its
 * driver exported, such as a GPU's) on every NIC, which know it at iova
 * (the address peers use); local write, remote read and write access.
 * The MRs hold the memory: the caller may close fd after. Errors:
 * -EINVAL; -EOPNOTSUPP (this libibverbs or device registers no dma-bufs);
 * those of te_rdma_reg. */
int te_rdma_reg_dmabuf(struct te_rdma *r, int fd, uint64_t offset, size_t len, uint64_t iova,
		       struct te_rdma_mr **out, char *why, size_t why_len) MC_MUST_CHECK;
uint32_t te_rdma_mr_lkey(const struct te_rdma_mr *mr, unsigned nic);
uint32_t te_rdma_mr_rkey(const struct te_rdma_mr *mr, unsigned nic);
/* Deregister on every NIC; no WR may still use the region. */
void te_rdma_dereg(struct te_rdma_mr *mr);

/* Create the QPs to a peer that has peer_nics NICs (1..TE_RDMA_MAX_NICS),
 * in INIT. arg is passed to the callbacks. Errors: -EINVAL; -ENOMEM (the
 * device's max_qp or the CQ budget exhausted, or memory; why says which);
 * negative errno of ibv_create_qp / ibv_modify_qp. */
int te_rdma_conn_new(struct te_rdma *r, unsigned peer_nics, void *arg,
		     struct te_rdma_conn **out, char *why, size_t why_len) MC_MUST_CHECK;
/* Number of QPs of the connection: max(local NICs, peer NICs). */
unsigned te_rdma_conn_qps(const struct te_rdma_conn *c);
/* Local NIC index QP k uses (for the lkey). */
unsigned te_rdma_conn_nic(const struct te_rdma_conn *c, unsigned k);
/* Fill eps[0 .. te_rdma_conn_qps()-1] with the local endpoints; returns
 * the count, or -ENOSPC when max is too small. */
int te_rdma_conn_eps(const struct te_rdma_conn *c, struct te_rdma_ep *eps,
		     unsigned max) MC_MUST_CHECK;
/* Connect QP k to peer[k] for every k (INIT -> RTR -> RTS). Errors:
 * -EINVAL (n differs from te_rdma_conn_qps(), or an endpoint is invalid);
 * -EALREADY (connected before); negative errno of ibv_modify_qp (the
 * connection is then unusable: free it). */
int te_rdma_conn_connect(struct te_rdma_conn *c, const struct te_rdma_ep *peer,
			 unsigned n) MC_MUST_CHECK;
/* 0 when QP k is connected and healthy; -ENOTCONN before connect; the
 * QP's error status after an error (it stays in ERR). */
int te_rdma_conn_status(const struct te_rdma_conn *c, unsigned k) MC_MUST_CHECK;
/* Free send-queue slots of QP k. */
unsigned te_rdma_conn_sq_free(const struct te_rdma_conn *c, unsigned k);
/* Post n work requests on QP k, all or nothing: on 0 every WR of the call
 * is reported exactly once by on_complete; on an error none is. Errors:
 * -EINVAL (k out of range, n == 0 or n > sq_depth, a length over 2^31,
 * bad op); -ENOTCONN (not connected); -EAGAIN (not enough free slots
 * now); the QP's error status when it is in ERR. If the device refuses
 * a WR (ibv_post_send fails), the call still returns 0: the refused WRs
 * are reported with that negative errno, the accepted ones as executed
 * or flushed, and the QP goes to ERR (on_qp_error). */
int te_rdma_post(struct te_rdma_conn *c, unsigned k, const struct te_rdma_wr *wrs,
		 unsigned n) MC_MUST_CHECK;
/* Move every QP to ERR, wait until every posted WR was reported, destroy.
 * Not from a callback. */
void te_rdma_conn_free(struct te_rdma_conn *c);

/* Fixed 32-byte big-endian wire form of an endpoint. decode errors:
 * -EINVAL (len != TE_RDMA_EP_WIRE_BYTES, qpn/psn over 24 bits, mtu not a
 * valid enum ibv_mtu, nic >= TE_RDMA_MAX_NICS). */
void te_rdma_ep_encode(const struct te_rdma_ep *ep, uint8_t out[TE_RDMA_EP_WIRE_BYTES]);
int te_rdma_ep_decode(const uint8_t *in, size_t len, struct te_rdma_ep *ep) MC_MUST_CHECK;

/* The code on_complete reports for an enum ibv_wc_status. */
int te_rdma_wc_status_code(int ibv_wc_status);

#endif
