/*
 * rdma_int: what rdma.c and rdma_dev.c share — a selected device (struct
 * rdev), the selection, and the helpers that word its reasons. Private
 * to the rdma layer (rdma.h is its interface).
 */
#ifndef MC_TRANSFER_RDMA_INT_H
#define MC_TRANSFER_RDMA_INT_H

#include <infiniband/verbs.h>
#include <stddef.h>

#include "transfer/rdma.h"

/* Built into production binaries only (rdma_providers.c, linked
 * explicitly): registers libibverbs' static providers. Absent in test and
 * dynamic builds, where the weak reference stays NULL. */
void te_rdma__static_providers(void) __attribute__((weak));

struct rdev {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_comp_channel *ch;
	struct ibv_cq *cq;
	struct ibv_device_attr attr;
	struct te_rdma_nic info;
	enum ibv_mtu mtu;
	/* under te_rdma.lock */
	unsigned cq_used; /* CQ entries reserved by QPs */
	unsigned n_qp, n_mr;
};

/*
 * Fill dev[0..*n) with the usable devices of o (rdma_dev.c): opened, with
 * attr, mtu and info (name, port, GID, LID, MTU) set; the rest of each is
 * rdma.c's. Errors (why says which devices and why): -ENODEV, -EACCES,
 * -ENETDOWN, -EADDRNOTAVAIL, as te_rdma_new.
 */
int te_rdma__select_devices(const struct te_rdma_opts *o, struct rdev *dev, unsigned *n,
			    char *why, size_t why_len) MC_MUST_CHECK;

/* Write a reason into why (may be NULL), or append one to buf. */
void te_rdma__why(char *why, size_t len, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
void te_rdma__why_add(char *buf, size_t len, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* An ibv_mtu in bytes; 0 for a value that is none. */
unsigned te_rdma__mtu_bytes(enum ibv_mtu m);

#endif
