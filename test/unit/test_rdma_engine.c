/*
 * test_rdma_engine: the transfer engine's rdma transport, two engines in
 * one process (P2P mode, loopback) on verbs-emu (this binary links the
 * software verbs device instead of libibverbs): regions get MRs whose
 * rkeys and base reach the descriptor (asynchronously when registered on
 * the loop thread), transfers over one and two NICs with the slices
 * striped, unregistering a region our requests use as local memory (they
 * complete, over RDMA while they hold its lkeys, then tcp), a QP error (a stale rkey) is a remote access error and
 * the queue pairs are set up again, protocol choice without a device,
 * the CONNECT/ACCEPT control message, a region of another process's
 * memory (no MR: peers reach it over tcp), and a dma-buf region (an MR by
 * ibv_reg_dmabuf_mr at the owner's address: RDMA only, as a peer's target
 * and as the local memory of this engine's requests).
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/util.h"
#include "test_te_util.h"

static void host_start(const char *nics0, const char *nics1)
{
	struct te_opts t[2] = {
		{.protocol = TE_PROTO_RDMA,
		 .threads = 2,
		 .tcp_conns = 2,
		 .slice_bytes = 64 << 10,
		 .rdma_devices = nics0,
		 .rdma_gid_index = -1},
		{.protocol = TE_PROTO_RDMA,
		 .threads = 2,
		 .tcp_conns = 2,
		 .slice_bytes = 64 << 10,
		 .rdma_devices = nics1,
		 .rdma_gid_index = -1},
	};
	host_start_with(t);
	cr_assert_eq(te_protocol_in_use(H.e[0]), TE_PROTO_RDMA);
}

static void fill(struct mem *m, unsigned seed)
{
	for (size_t i = 0; i < m->len; i++)
		m->p[i] = (uint8_t)((i + seed) * 2654435761u >> 24);
}

/* n requests of len bytes from local to remote (or back). */
static void transfer(enum te_op op, struct te_segment *s, uint8_t *local, uint64_t remote,
		     size_t len, size_t n, int want_err)
{
	struct te_request q[64];
	cr_assert(n <= 64);
	for (size_t i = 0; i < n; i++)
		q[i] = (struct te_request){op,  local + i * len, s,    remote + i * len,
					   len, false,           false};
	struct te_batch *bt;
	cr_assert_eq(te_submit(H.e[0], q, n, &bt), 0);
	cr_assert_eq(te_wait(bt, 60000), 0);
	struct te_result res[64];
	te_poll(bt, res);
	for (size_t i = 0; i < n; i++) {
		if (want_err)
			cr_assert_eq(res[i].err, want_err, "request %zu: %d", i, res[i].err);
		else
			cr_assert_eq(res[i].status, TE_DONE, "request %zu: %d", i, res[i].err);
	}
	te_batch_free(bt);
}

Test(rdma_engine, descriptor_carries_nics_rkeys_and_base)
{
	setenv("VERBS_EMU_DEVICES", "2", 1);
	host_start("", "emu_1");
	struct mem m;
	mem_new(H.e[0], 1 << 20, &m);
	struct te_desc *d;
	cr_assert_eq(te__desc_build(H.e[0], &d), 0);
	cr_assert(d->transports & TE_XP_RDMA);
	cr_assert_eq(d->nnics, 2);
	cr_assert_str_eq(d->nics[1].name, "emu_1");
	cr_assert_eq(d->nics[0].port, 1);
	cr_assert_eq(d->nics[0].mtu, 1024);
	cr_assert_eq(d->nregions, 1);
	cr_assert_eq(d->regions[0].nrkeys, 2, "an rkey per NIC");
	cr_assert_eq(d->regions[0].rdma_addr, (uint64_t)(uintptr_t)m.p);
	/* it survives encoding */
	uint8_t *buf;
	size_t len;
	struct te_desc *g;
	cr_assert_eq(te__desc_encode(d, &buf, &len), 0);
	cr_assert_eq(te__desc_decode(buf, len, &g), 0);
	cr_assert_eq(g->regions[0].rdma_addr, d->regions[0].rdma_addr);
	cr_assert_eq(g->regions[0].rkeys[1], d->regions[0].rkeys[1]);
	free(buf);
	te__desc_free(g);
	te__desc_free(d);
	/* --rdma-devices=emu_1: one NIC */
	cr_assert_eq(te__desc_build(H.e[1], &d), 0);
	cr_assert_eq(d->nnics, 1);
	cr_assert_str_eq(d->nics[0].name, "emu_1");
	te__desc_free(d);
	mem_free(&m);
	host_stop();
}

static struct mem loop_mem;
static int loop_rc;

static void register_on_loop(struct host *h)
{
	loop_rc = te_register(h->e[1], (uint64_t)(uintptr_t)loop_mem.p, loop_mem.p,
			      loop_mem.len, loop_mem.fd, 0, &loop_mem.r);
	call_done(h);
}

Test(rdma_engine, register_on_the_loop_pins_on_the_setup_thread)
{
	setenv("VERBS_EMU_DEVICES", "1", 1);
	host_start("", "");
	mem_map(8 << 20, &loop_mem);
	fill(&loop_mem, 3);
	run_on_loop(&H, register_on_loop);
	cr_assert_eq(loop_rc, 0);
	/* The rkeys arrive once the setup thread registered it. */
	uint64_t deadline = mc_now_ms() + 20000;
	for (;;) {
		struct te_desc *d;
		cr_assert_eq(te__desc_build(H.e[1], &d), 0);
		cr_assert_eq(d->nregions, 1);
		bool ready = d->regions[0].nrkeys == 1;
		te__desc_free(d);
		if (ready)
			break;
		cr_assert(mc_now_ms() < deadline, "no rkeys after 20 s");
		usleep(1000);
	}
	struct te_segment *s = open_b();
	struct mem dst;
	mem_new(H.e[0], loop_mem.len, &dst);
	transfer(TE_READ, s, dst.p, (uint64_t)(uintptr_t)loop_mem.p, 1 << 20, 8, 0);
	cr_assert(memcmp(dst.p, loop_mem.p, dst.len) == 0);
	cr_assert_eq(metric(0, "mooncake_te_rdma_tcp_fallback_slices_total "), 0);
	cr_assert_eq(metric(0, "mooncake_te_rdma_nic_bytes_total{nic=\"emu_0\",op=\"read\"} "),
		     8 << 20);
	te_close_segment(s);
	mem_free(&dst);
	mem_free(&loop_mem);
	host_stop();
}

Test(rdma_engine, two_nics_each_side_stripe)
{
	setenv("VERBS_EMU_DEVICES", "2", 1);
	host_start("", "");
	struct mem b, src, dst;
	mem_new(H.e[1], 16 << 20, &b);
	mem_new(H.e[0], 16 << 20, &src);
	mem_new(H.e[0], 16 << 20, &dst);
	fill(&src, 1);
	struct te_segment *s = open_b();
	struct te_segment_info info;
	te_segment_info(s, &info, NULL, 0);
	cr_assert_eq(info.transport, TE_PROTO_RDMA);
	cr_assert_eq(s->remote->npaths, 2, "a QP per NIC pair");
	transfer(TE_WRITE, s, src.p, (uint64_t)(uintptr_t)b.p, 1 << 20, 16, 0);
	cr_assert(memcmp(b.p, src.p, b.len) == 0, "every byte arrived");
	transfer(TE_READ, s, dst.p, (uint64_t)(uintptr_t)b.p, 1 << 20, 16, 0);
	cr_assert(memcmp(dst.p, src.p, dst.len) == 0);
	for (int n = 0; n < 2; n++) {
		char line[96];
		snprintf(line, sizeof(line),
			 "mooncake_te_rdma_nic_bytes_total{nic=\"emu_%d\",op=\"write\"} ", n);
		cr_assert_geq(metric(0, line), 4 << 20, "NIC %d carried its share", n);
	}
	te_close_segment(s);
	mem_free(&b);
	mem_free(&src);
	mem_free(&dst);
	host_stop();
}

static void *unregister_main(void *arg)
{
	struct mem *m = arg;
	te_unregister(m->r); /* waits for slices holding its lkeys */
	m->r = NULL;
	return NULL;
}

Test(rdma_engine, unregister_under_requests_using_the_region)
{
	setenv("VERBS_EMU_DEVICES", "1", 1);
	host_start("", "");
	struct mem b, src;
	mem_new(H.e[1], 64 << 20, &b);
	mem_new(H.e[0], 64 << 20, &src);
	fill(&src, 5);
	struct te_segment *s = open_b();
	struct te_request q[64];
	for (size_t i = 0; i < 64; i++)
		q[i] = (struct te_request){TE_WRITE, src.p + (i << 20),
					   s,        (uint64_t)(uintptr_t)b.p + (i << 20),
					   1 << 20,  false,
					   false};
	struct te_batch *bt;
	cr_assert_eq(te_submit(H.e[0], q, 64, &bt), 0);
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, unregister_main, &src), 0);
	pthread_join(t, NULL);
	/* Slices that had its lkeys finished over RDMA before the MRs went,
	 * the others went over tcp (the memory itself is still ours). */
	cr_assert_eq(te_wait(bt, 60000), 0);
	struct te_result res[64];
	te_poll(bt, res);
	for (int i = 0; i < 64; i++)
		cr_assert_eq(res[i].status, TE_DONE, "request %d: %d", i, res[i].err);
	cr_assert(memcmp(b.p, src.p, b.len) == 0, "every byte arrived");
	te_batch_free(bt);
	/* and afterwards its memory is a plain local buffer: tcp */
	double fb = metric(0, "mooncake_te_rdma_tcp_fallback_slices_total ");
	transfer(TE_WRITE, s, src.p, (uint64_t)(uintptr_t)b.p, 1 << 20, 4, 0);
	cr_assert_geq(metric(0, "mooncake_te_rdma_tcp_fallback_slices_total "), fb + 64);
	te_close_segment(s);
	mem_free(&b);
	mem_free(&src);
	host_stop();
}

Test(rdma_engine, stale_rkey_is_a_remote_access_error_and_qps_come_back)
{
	setenv("VERBS_EMU_DEVICES", "1", 1);
	host_start("", "");
	struct mem b, gone, dst;
	mem_new(H.e[1], 4 << 20, &b);
	mem_new(H.e[1], 1 << 20, &gone);
	mem_new(H.e[0], 4 << 20, &dst);
	fill(&b, 9);
	struct te_segment *s = open_b(); /* P2P: the descriptor stays as opened */
	uint64_t gone_addr = (uint64_t)(uintptr_t)gone.p;
	te_unregister(gone.r);
	gone.r = NULL;
	memset(gone.p, 0x5a, gone.len);
	transfer(TE_WRITE, s, dst.p, gone_addr, 64 << 10, 4, MC_EREMOTE_ACCESS);
	for (size_t i = 0; i < gone.len; i++)
		cr_assert_eq(gone.p[i], 0x5a, "byte %zu written", i);
	/* the QP error is reported after the failed request completed */
	wait_metric(0, "mooncake_te_rdma_qp_errors_total ", 1);
	/* the other region is served meanwhile (tcp) and afterwards (new QPs) */
	transfer(TE_READ, s, dst.p, (uint64_t)(uintptr_t)b.p, 1 << 20, 4, 0);
	cr_assert(memcmp(dst.p, b.p, b.len) == 0);
	wait_metric(0, "mooncake_te_rdma_reconnects_total ", 1);
	/* wait until the new QPs are in place, then a read goes over them */
	uint64_t deadline = mc_now_ms() + 20000;
	for (;;) {
		double before = metric(0, "mooncake_te_rdma_nic_bytes_total{nic=\"emu_0\","
					  "op=\"read\"} ");
		memset(dst.p, 0, dst.len);
		transfer(TE_READ, s, dst.p, (uint64_t)(uintptr_t)b.p, 1 << 20, 4, 0);
		cr_assert(memcmp(dst.p, b.p, b.len) == 0);
		if (metric(0,
			   "mooncake_te_rdma_nic_bytes_total{nic=\"emu_0\",op=\"read\"} ") >=
		    before + (4 << 20))
			break;
		cr_assert(mc_now_ms() < deadline, "reads never went over RDMA again");
	}
	te_close_segment(s);
	mem_free(&b);
	mem_free(&gone);
	mem_free(&dst);
	host_stop();
}

Test(rdma_engine, no_device)
{
	setenv("VERBS_EMU_DEVICES", "0", 1);
	uv_loop_t loop;
	cr_assert_eq(uv_loop_init(&loop), 0);
	struct te_opts o = {.loop = &loop,
			    .data_listen = "127.0.0.1:0",
			    .protocol = TE_PROTO_RDMA,
			    .threads = 1,
			    .rdma_gid_index = -1,
			    .insecure = true};
	struct te_engine *e;
	cr_assert_eq(te_new(&o, &e), -ENODEV, "rdma without a device refuses to start");
	o.protocol = TE_PROTO_AUTO;
	cr_assert_eq(te_new(&o, &e), 0);
	cr_assert_eq(te_protocol_in_use(e), TE_PROTO_TCP, "auto: tcp");
	te_free(e);
	o.rdma_gid_index = 256;
	cr_assert_eq(te_new(&o, &e), -EINVAL);
	uv_run(&loop, UV_RUN_DEFAULT);
	cr_assert_eq(uv_loop_close(&loop), 0);
}

Test(rdma_engine, control_message)
{
	struct te_rdma_msg m = {.kind = TE_RDMA_CONNECT,
				.nics = 2,
				.n = 3,
				.incarnation = 0x0102030405060708ull},
			   g;
	for (unsigned k = 0; k < 3; k++)
		m.eps[k] = (struct te_rdma_ep){.lid = (uint16_t)k,
					       .qpn = 0x100 + k,
					       .psn = 0xabcde,
					       .mtu = 3,
					       .port = 1,
					       .nic = (uint8_t)(k % 2)};
	uint8_t buf[TE_RDMA_MSG_MAX];
	size_t len = te__rdma_msg_encode(&m, buf);
	cr_assert_eq(len, TE_RDMA_MSG_HDR + 3 * TE_RDMA_EP_WIRE_BYTES);
	cr_assert_eq(te__rdma_msg_decode(buf, len, &g), 0);
	cr_assert_eq(g.kind, TE_RDMA_CONNECT);
	cr_assert_eq(g.nics, 2);
	cr_assert_eq(g.n, 3);
	cr_assert_eq(g.incarnation, m.incarnation);
	cr_assert_eq(g.eps[2].qpn, 0x102);
	cr_assert_eq(g.eps[1].nic, 1);
	/* refusals */
	cr_assert_eq(te__rdma_msg_decode(buf, len - 1, &g), MC_EPROTOCOL, "short");
	uint8_t bad[TE_RDMA_MSG_MAX];
	memcpy(bad, buf, len);
	bad[0] ^= 1;
	cr_assert_eq(te__rdma_msg_decode(bad, len, &g), MC_EPROTOCOL, "magic");
	memcpy(bad, buf, len);
	bad[4] = 2;
	cr_assert_eq(te__rdma_msg_decode(bad, len, &g), MC_EPROTOCOL, "version");
	memcpy(bad, buf, len);
	bad[5] = 3;
	cr_assert_eq(te__rdma_msg_decode(bad, len, &g), MC_EPROTOCOL, "kind");
	memcpy(bad, buf, len);
	bad[6] = 4; /* more NICs than endpoints */
	cr_assert_eq(te__rdma_msg_decode(bad, len, &g), MC_EPROTOCOL, "n < nics");
	memcpy(bad, buf, len);
	bad[6] = 0;
	cr_assert_eq(te__rdma_msg_decode(bad, len, &g), MC_EPROTOCOL, "no NIC");
	memcpy(bad, buf, len);
	bad[TE_RDMA_MSG_HDR + TE_RDMA_EP_WIRE_BYTES + 26] = 0; /* ep 1 on NIC 0 */
	cr_assert_eq(te__rdma_msg_decode(bad, len, &g), MC_EPROTOCOL, "pairing");
	memcpy(bad, buf, len);
	bad[TE_RDMA_MSG_HDR + 24] = 9; /* no such MTU */
	cr_assert_eq(te__rdma_msg_decode(bad, len, &g), MC_EPROTOCOL, "endpoint");
	m.n = 9; /* clamped to TE_RDMA_MAX_NICS on encode */
	m.nics = 8;
	for (unsigned k = 0; k < 8; k++)
		m.eps[k] = (struct te_rdma_ep){
			.qpn = k + 1, .mtu = 3, .port = 1, .nic = (uint8_t)k};
	len = te__rdma_msg_encode(&m, buf);
	cr_assert_eq(len, TE_RDMA_MSG_MAX);
	cr_assert_eq(te__rdma_msg_decode(buf, len, &g), 0);
	cr_assert_eq(g.n, 8);
}

/* Memory registered as another process's (this one's, by cross-memory
 * attach) has no rkeys: an rdma peer writes and reads it over its tcp
 * connection, every byte arriving. */
Test(rdma_engine, process_memory_goes_over_tcp)
{
	host_start("", "");
	size_t len = 4 << 20;
	uint8_t *target = calloc(1, len);
	int pidfd = (int)syscall(SYS_pidfd_open, getpid(), 0);
	cr_assert(pidfd >= 0);
	struct te_region *r;
	cr_assert_eq(te_register_process(H.e[1], (uint64_t)(uintptr_t)target, len, getpid(),
					 pidfd, &r),
		     0);
	close(pidfd);
	struct te_desc *d;
	cr_assert_eq(te__desc_build(H.e[1], &d), 0);
	cr_assert_eq(d->nregions, 1);
	cr_assert_eq(d->regions[0].nrkeys, 0, "no MR for it");
	cr_assert_eq(d->regions[0].shm, false);
	te__desc_free(d);
	struct mem src, back;
	mem_new(H.e[0], len, &src);
	mem_new(H.e[0], len, &back);
	fill(&src, 5);
	struct te_segment *s = open_b();
	transfer(TE_WRITE, s, src.p, (uint64_t)(uintptr_t)target, len / 4, 4, 0);
	cr_assert(memcmp(target, src.p, len) == 0, "every byte");
	transfer(TE_READ, s, back.p, (uint64_t)(uintptr_t)target, len / 4, 4, 0);
	cr_assert(memcmp(back.p, src.p, len) == 0, "read back");
	cr_assert(
		metric(1, "mooncake_te_served_bytes_total{transport=\"tcp\",op=\"write\"} ") >=
			(double)len,
		"over tcp");
	te_close_segment(s);
	te_unregister(r);
	mem_free(&src);
	mem_free(&back);
	free(target);
	host_stop();
}

/* A dma-buf (a memfd stands in for a GPU's, as in test_rdma_dmabuf)
 * registered at an address nothing maps here, as GPU memory is known by
 * its virtual address in its own process: the NIC writes and reads it by
 * one-sided RDMA, the descriptor names that address, and no CPU path
 * reaches it. */
Test(rdma_engine, dmabuf_region_is_reached_by_rdma_only)
{
	host_start("", "");
	size_t len = 1 << 20;
	struct mem gpu;
	mem_map(2 * len, &gpu); /* its second MiB is registered */
	uint64_t iova = 0x7e0000000000ull;
	struct te_region *r;
	cr_assert_eq(te_register_dmabuf(H.e[1], iova, len, -1, len, &r), -EINVAL);
	cr_assert_eq(te_register_dmabuf(H.e[1], iova, len, gpu.fd, len, &r), 0);
	struct te_desc *d;
	cr_assert_eq(te__desc_build(H.e[1], &d), 0);
	cr_assert_eq(d->nregions, 1);
	cr_assert_eq(d->regions[0].addr, iova);
	cr_assert_eq(d->regions[0].rdma_addr, iova, "the NICs know it at its address");
	cr_assert_eq(d->regions[0].nrkeys, 1);
	cr_assert_eq(d->regions[0].shm, false);
	te__desc_free(d);
	uint8_t buf[64];
	cr_assert_eq(te_region_io(r, iova, buf, sizeof(buf), true), MC_EREMOTE_ACCESS,
		     "no CPU copy into device memory");
	struct mem src, back;
	mem_new(H.e[0], len, &src);
	mem_new(H.e[0], len, &back);
	fill(&src, 9);
	struct te_segment *s = open_b();
	double before = metric(
		1, "mooncake_te_served_bytes_total{transport=\"tcp\",op=\"write\"} ");
	transfer(TE_WRITE, s, src.p, iova, len / 4, 4, 0);
	cr_assert(memcmp(gpu.p + len, src.p, len) == 0, "every byte, in the dma-buf");
	for (size_t i = 0; i < len; i++)
		cr_assert_eq(gpu.p[i], 0, "nothing before its offset");
	transfer(TE_READ, s, back.p, iova, len / 4, 4, 0);
	cr_assert(memcmp(back.p, src.p, len) == 0, "read back");
	cr_assert_eq(
		metric(1, "mooncake_te_served_bytes_total{transport=\"tcp\",op=\"write\"} "),
		before, "none of it over tcp");
	te_close_segment(s);
	te_unregister(r);
	mem_free(&src);
	mem_free(&back);
	munmap(gpu.p, gpu.len);
	close(gpu.fd);
	host_stop();
}

Test(rdma_engine, dmabuf_needs_rdma)
{
	struct te_opts t[2] = {
		{.protocol = TE_PROTO_TCP, .threads = 1, .rdma_gid_index = -1},
		{.protocol = TE_PROTO_TCP, .threads = 1, .rdma_gid_index = -1},
	};
	host_start_with(t);
	struct mem gpu;
	mem_map(1 << 20, &gpu);
	struct te_region *r;
	cr_assert_eq(te_register_dmabuf(H.e[0], 0x7e0000000000ull, 1 << 20, gpu.fd, 0, &r),
		     -EOPNOTSUPP);
	/* Device memory as local memory to a peer tcp reaches: refused. */
	struct mem b;
	mem_new(H.e[1], 1 << 20, &b);
	struct te_segment *s = open_b();
	struct te_request q = {TE_WRITE, gpu.p, s,    (uint64_t)(uintptr_t)b.p,
			       4096,     true,  false};
	struct te_batch *bt;
	struct te_result res;
	cr_assert_eq(te_submit(H.e[0], &q, 1, &bt), 0);
	cr_assert_eq(te_wait(bt, 60000), 0);
	te_poll(bt, &res);
	te_batch_free(bt);
	cr_assert_eq(res.err, -EOPNOTSUPP, "no CPU copy of device memory");
	te_close_segment(s);
	mem_free(&b);
	munmap(gpu.p, gpu.len);
	close(gpu.fd);
	host_stop();
}

/* Device memory as the local side: the NIC reads and writes the dma-buf
 * by its MR, at the owner's address; a request whose local memory is no
 * registered dma-buf, or whose peer only tcp reaches, fails rather than
 * have a CPU copy it. */
Test(rdma_engine, dmabuf_as_local_memory)
{
	host_start("", "");
	size_t len = 1 << 20;
	struct mem gpu;
	mem_map(len, &gpu);
	uint64_t iova = 0x7e0000000000ull;
	struct te_region *r;
	cr_assert_eq(te_register_dmabuf(H.e[0], iova, len, gpu.fd, 0, &r), 0);
	fill(&gpu, 3);
	struct mem b;
	mem_new(H.e[1], len, &b);
	struct te_segment *s = open_b();
	struct te_request q = {
		TE_WRITE, (void *)(uintptr_t)iova, s, (uint64_t)(uintptr_t)b.p, len, true,
		false};
	struct te_batch *bt;
	struct te_result res;
	cr_assert_eq(te_submit(H.e[0], &q, 1, &bt), 0);
	cr_assert_eq(te_wait(bt, 60000), 0);
	te_poll(bt, &res);
	te_batch_free(bt);
	cr_assert_eq(res.status, TE_DONE, "%d", res.err);
	cr_assert(memcmp(b.p, gpu.p, len) == 0, "the dma-buf's bytes, read by the NIC");
	memset(gpu.p, 0, len);
	q.op = TE_READ;
	cr_assert_eq(te_submit(H.e[0], &q, 1, &bt), 0);
	cr_assert_eq(te_wait(bt, 60000), 0);
	te_poll(bt, &res);
	te_batch_free(bt);
	cr_assert_eq(res.status, TE_DONE, "%d", res.err);
	cr_assert(memcmp(b.p, gpu.p, len) == 0, "written into the dma-buf by the NIC");
	/* Local memory that is no registered dma-buf. */
	q.local = (void *)(uintptr_t)(iova + len);
	q.len = 4096;
	cr_assert_eq(te_submit(H.e[0], &q, 1, &bt), 0);
	cr_assert_eq(te_wait(bt, 60000), 0);
	te_poll(bt, &res);
	te_batch_free(bt);
	cr_assert_eq(res.err, -EOPNOTSUPP);
	te_close_segment(s);
	te_unregister(r);
	mem_free(&b);
	munmap(gpu.p, gpu.len);
	close(gpu.fd);
	host_stop();
}
