/*
 * The verbs emulator's dma-buf registration (ibv_reg_dmabuf_mr), the way
 * GPU memory is registered: a memfd stands in for a GPU's dma-buf. Two RC
 * QPs of one emulated device, connected to each other, move bytes with
 * one-sided WRITE and READ between an ordinary MR and a dma-buf MR known
 * to the NIC by an iova that is not its address in this process; the
 * bytes are checked through a separate mapping of the memfd. The rkey is
 * checked against the dma-buf MR's iova range, and the MR keeps the
 * memory after the caller closed its fd.
 */
#include <criterion/criterion.h>
#include <infiniband/verbs.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define LEN (1u << 20)
#define IOVA 0x7e0000000000ull /* not where the memfd is mapped here */

struct pair {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *a, *b;
};

static void to_rts(struct ibv_qp *qp, uint32_t dest_qpn, const union ibv_gid *gid)
{
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT,
				.port_num = 1,
				.qp_access_flags = IBV_ACCESS_LOCAL_WRITE |
						   IBV_ACCESS_REMOTE_WRITE |
						   IBV_ACCESS_REMOTE_READ};
	cr_assert_eq(ibv_modify_qp(qp, &a,
				   IBV_QP_STATE | IBV_QP_PORT | IBV_QP_PKEY_INDEX |
					   IBV_QP_ACCESS_FLAGS),
		     0);
	a = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTR,
				 .path_mtu = IBV_MTU_1024,
				 .dest_qp_num = dest_qpn,
				 .max_dest_rd_atomic = 1,
				 .ah_attr = {.is_global = 1,
					     .port_num = 1,
					     .grh = {.hop_limit = 1, .sgid_index = 3}}};
	a.ah_attr.grh.dgid = *gid;
	cr_assert_eq(ibv_modify_qp(qp, &a,
				   IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
					   IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
					   IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
		     0);
	a = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTS,
				 .timeout = 14,
				 .retry_cnt = 7,
				 .rnr_retry = 7,
				 .max_rd_atomic = 1};
	cr_assert_eq(ibv_modify_qp(qp, &a,
				   IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
					   IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
					   IBV_QP_MAX_QP_RD_ATOMIC),
		     0);
}

static void pair_open(struct pair *p)
{
	struct ibv_device **l = ibv_get_device_list(NULL);
	cr_assert_not_null(l);
	p->ctx = ibv_open_device(l[0]);
	ibv_free_device_list(l);
	cr_assert_not_null(p->ctx);
	p->pd = ibv_alloc_pd(p->ctx);
	p->cq = ibv_create_cq(p->ctx, 16, NULL, NULL, 0);
	struct ibv_qp_init_attr ia = {.send_cq = p->cq,
				      .recv_cq = p->cq,
				      .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 8, .max_send_sge = 1}};
	p->a = ibv_create_qp(p->pd, &ia);
	p->b = ibv_create_qp(p->pd, &ia);
	cr_assert(p->a && p->b);
	union ibv_gid gid;
	cr_assert_eq(ibv_query_gid(p->ctx, 1, 3, &gid), 0);
	to_rts(p->a, p->b->qp_num, &gid);
	to_rts(p->b, p->a->qp_num, &gid);
}

static void pair_close(struct pair *p)
{
	ibv_destroy_qp(p->a);
	ibv_destroy_qp(p->b);
	ibv_destroy_cq(p->cq);
	ibv_dealloc_pd(p->pd);
	ibv_close_device(p->ctx);
}

/* One signaled WR on QP a; its completion status. */
static enum ibv_wc_status one_wr(struct pair *p, enum ibv_wr_opcode op, struct ibv_mr *local,
				 void *laddr, uint32_t rkey, uint64_t raddr, uint32_t len)
{
	struct ibv_sge sge = {.addr = (uintptr_t)laddr, .length = len, .lkey = local->lkey};
	struct ibv_send_wr wr = {.sg_list = &sge,
				 .num_sge = 1,
				 .opcode = op,
				 .send_flags = IBV_SEND_SIGNALED,
				 .wr.rdma = {.remote_addr = raddr, .rkey = rkey}};
	struct ibv_send_wr *bad;
	cr_assert_eq(ibv_post_send(p->a, &wr, &bad), 0);
	struct ibv_wc wc;
	int n = 0;
	for (long i = 0; i < 50000000 && n == 0; i++) {
		n = ibv_poll_cq(p->cq, 1, &wc);
		if (!n)
			sched_yield();
	}
	cr_assert_eq(n, 1, "a completion");
	return wc.status;
}

Test(rdma_dmabuf, write_and_read_through_a_dmabuf_mr)
{
	struct pair p;
	pair_open(&p);
	int fd = memfd_create("emu-dmabuf", MFD_CLOEXEC);
	cr_assert_geq(fd, 0);
	cr_assert_eq(ftruncate(fd, 2 * LEN), 0);
	/* The second MiB of the "GPU memory", known to the NIC at IOVA. */
	struct ibv_mr *gpu = ibv_reg_dmabuf_mr(
		p.pd, LEN, LEN, IOVA, fd,
		IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	cr_assert_not_null(gpu, "ibv_reg_dmabuf_mr: %s", strerror(errno));
	cr_assert_eq((uint64_t)(uintptr_t)gpu->addr, IOVA);
	cr_assert_eq(gpu->length, LEN);
	uint8_t *view = mmap(NULL, 2 * LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	cr_assert_neq(view, MAP_FAILED);
	close(fd); /* the MR keeps what it registered */
	static uint8_t host[LEN];
	struct ibv_mr *hmr = ibv_reg_mr(p.pd, host, LEN, IBV_ACCESS_LOCAL_WRITE);
	cr_assert_not_null(hmr);
	for (unsigned i = 0; i < LEN; i++)
		host[i] = (uint8_t)(i * 31 + 7);

	/* WRITE host -> "GPU" at an offset inside the dma-buf MR. */
	cr_assert_eq(one_wr(&p, IBV_WR_RDMA_WRITE, hmr, host, gpu->rkey, IOVA + 4096, 65537),
		     IBV_WC_SUCCESS);
	cr_assert_eq(memcmp(view + LEN + 4096, host, 65537), 0,
		     "the bytes landed at offset+4096");
	cr_assert_eq(view[LEN + 4095], 0, "nothing before");
	cr_assert_eq(view[LEN + 4096 + 65537], 0, "nothing after");
	cr_assert_eq(view[4096], 0, "the first MiB of the fd is not the MR's");

	/* READ "GPU" -> host. */
	for (unsigned i = 0; i < 8192; i++)
		view[LEN + LEN - 8192 + i] = (uint8_t)(255 - i);
	memset(host, 0, 8192);
	cr_assert_eq(
		one_wr(&p, IBV_WR_RDMA_READ, hmr, host, gpu->rkey, IOVA + LEN - 8192, 8192),
		IBV_WC_SUCCESS);
	for (unsigned i = 0; i < 8192; i++)
		cr_assert_eq(host[i], (uint8_t)(255 - i));

	/* Addresses outside the iova range are the NIC's to refuse. */
	cr_assert_eq(one_wr(&p, IBV_WR_RDMA_WRITE, hmr, host, gpu->rkey, IOVA + LEN - 10, 64),
		     IBV_WC_REM_ACCESS_ERR);
	cr_assert_eq(view[2 * LEN - 10], (uint8_t)(255 - 8182), "untouched");
	ibv_dereg_mr(hmr);
	cr_assert_eq(ibv_dereg_mr(gpu), 0);
	munmap(view, 2 * LEN);
	pair_close(&p);
}

Test(rdma_dmabuf, refusals)
{
	struct pair p;
	pair_open(&p);
	errno = 0;
	cr_assert_null(ibv_reg_dmabuf_mr(p.pd, 0, LEN, IOVA, -1, IBV_ACCESS_LOCAL_WRITE));
	cr_assert_eq(errno, EINVAL, "no fd");
	int fd = memfd_create("emu-dmabuf", MFD_CLOEXEC);
	cr_assert_eq(ftruncate(fd, LEN), 0);
	cr_assert_null(ibv_reg_dmabuf_mr(p.pd, 0, 0, IOVA, fd, IBV_ACCESS_LOCAL_WRITE));
	cr_assert_eq(errno, EINVAL, "empty");
	cr_assert_null(ibv_reg_dmabuf_mr(p.pd, 0, LEN, IOVA, fd, IBV_ACCESS_REMOTE_WRITE));
	cr_assert_eq(errno, EINVAL, "remote write without local write");
	int pipefd[2];
	cr_assert_eq(pipe(pipefd), 0);
	cr_assert_null(
		ibv_reg_dmabuf_mr(p.pd, 0, LEN, IOVA, pipefd[0], IBV_ACCESS_LOCAL_WRITE));
	cr_assert_neq(errno, 0, "an fd that is no buffer");
	close(pipefd[0]);
	close(pipefd[1]);
	close(fd);
	pair_close(&p);
}
