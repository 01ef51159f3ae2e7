/*
 * test_te_engine: whole engines in one process (P2P mode, loopback), their
 * loop on a thread: the open-once cache and the async open from the loop,
 * a TCP connection shut down under a stream (its slices go to the other
 * connections and every byte arrives), te_wait_published in P2P mode, and
 * the control channel a transport such as rdma uses for its handshake
 * (a fake transport's on_ctrl answering through te__ctrl_call), and a
 * same-host peer's region faulted into this process in the background.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/crc32c.h"
#include "test_te_util.h"

static void host_start(enum te_protocol pa)
{
	struct te_opts t[2] = {
		{.protocol = pa,
		 .threads = 2,
		 .tcp_conns = 4,
		 .slice_bytes = 64 << 10,
		 .rdma_gid_index = -1},
		{.protocol = TE_PROTO_AUTO,
		 .threads = 2,
		 .tcp_conns = 4,
		 .slice_bytes = 64 << 10,
		 .rdma_gid_index = -1},
	};
	host_start_with(t);
}

Test(te_engine, open_once_and_published)
{
	host_start(TE_PROTO_TCP);
	cr_assert_eq(te_wait_published(H.e[0], 1000), 0, "P2P: nothing to publish");
	struct te_segment *s1 = open_b(), *s2 = open_b();
	cr_assert_eq(s1, s2, "one handle per name");
	struct te_segment_info info;
	cr_assert_eq(te_segment_info(s1, &info, NULL, 0), 0);
	cr_assert_eq(info.transport, TE_PROTO_TCP);
	struct te_segment *bad;
	cr_assert_neq(te_open_segment(H.e[0], "127.0.0.1:1", &bad), 0);
	cr_assert_eq(te_open_segment(H.e[0], "", &bad), -EINVAL);
	te_close_segment(s1);
	te_close_segment(s2);
	host_stop();
}

static int async_err[2];
static struct te_segment *async_seg;

static void on_open(void *ud, int err, struct te_segment *s)
{
	int i = (int)(intptr_t)ud;
	async_err[i] = err ? err : 1;
	if (!err)
		async_seg = s;
	if (async_err[0] && async_err[1])
		call_done(&H);
}

static void open_async(struct host *h)
{
	char bad[] = "127.0.0.1:1";
	cr_assert_eq(te_open_segment_async(h->e[0], te_name(h->e[1]), on_open, (void *)0), 0);
	cr_assert_eq(te_open_segment_async(h->e[0], bad, on_open, (void *)1), 0);
	cr_assert_eq(async_err[0] + async_err[1], 0, "callbacks never run inside the call");
}

Test(te_engine, async_open_on_the_loop)
{
	host_start(TE_PROTO_AUTO);
	run_on_loop(&H, open_async);
	cr_assert_eq(async_err[0], 1);
	cr_assert(async_err[1] < 0);
	struct te_segment_info info;
	te_segment_info(async_seg, &info, NULL, 0);
	cr_assert_eq(info.transport, TE_PROTO_SHM, "same host: shm");
	te_close_segment(async_seg);
	host_stop();
}

/* The port of the peer of a connected TCP socket, or 0. */
static int peer_port(int fd)
{
	struct sockaddr_in sa;
	socklen_t sl = sizeof(sa);
	if (getpeername(fd, (struct sockaddr *)&sa, &sl) != 0 || sa.sin_family != AF_INET)
		return 0;
	return ntohs(sa.sin_port);
}

Test(te_engine, connection_shut_down_under_a_stream)
{
	host_start(TE_PROTO_TCP);
	struct mem b, src, dst;
	mem_new(H.e[1], 64 << 20, &b);
	mem_new(H.e[0], 64 << 20, &src);
	mem_new(H.e[0], 64 << 20, &dst);
	for (size_t i = 0; i < src.len; i++)
		src.p[i] = (uint8_t)(i * 2654435761u >> 24);
	struct te_segment *s = open_b();
	/* the engine's connections to B's data port */
	pthread_mutex_lock(&s->mu);
	uint16_t dport = s->desc->data_port;
	pthread_mutex_unlock(&s->mu);
	int fds[8], n = 0;
	DIR *d = opendir("/proc/self/fd");
	for (struct dirent *de; (de = readdir(d));) {
		int fd = atoi(de->d_name);
		if (de->d_name[0] != '.' && peer_port(fd) == dport && n < 8)
			fds[n++] = fd;
	}
	closedir(d);
	cr_assert_eq(n, 4, "four connections to the peer");

	struct te_request q[64];
	for (int i = 0; i < 64; i++)
		q[i] = (struct te_request){
			TE_WRITE, src.p + (size_t)i * (1 << 20),
			s,        (uint64_t)(uintptr_t)b.p + (size_t)i * (1 << 20),
			1 << 20,  false,
			false};
	struct te_batch *bt;
	cr_assert_eq(te_submit(H.e[0], q, 64, &bt), 0);
	shutdown(fds[1], SHUT_RDWR); /* one path dies under the stream */
	cr_assert_eq(te_wait(bt, 60000), 0);
	struct te_result res[64];
	te_poll(bt, res);
	for (int i = 0; i < 64; i++)
		cr_assert_eq(res[i].status, TE_DONE, "request %d: %d", i, res[i].err);
	te_batch_free(bt);
	cr_assert(memcmp(b.p, src.p, b.len) == 0, "every byte arrived");
	/* reads use the three connections left */
	for (int i = 0; i < 64; i++) {
		q[i].op = TE_READ;
		q[i].local = dst.p + (size_t)i * (1 << 20);
	}
	cr_assert_eq(te_submit(H.e[0], q, 64, &bt), 0);
	cr_assert_eq(te_wait(bt, 60000), 0);
	cr_assert_eq(te_poll(bt, res), 0);
	for (int i = 0; i < 64; i++)
		cr_assert_eq(res[i].status, TE_DONE);
	te_batch_free(bt);
	cr_assert(memcmp(dst.p, src.p, dst.len) == 0);
	cr_assert_eq(__builtin_popcount(atomic_load(&s->remote->alive)), 3);
	te_close_segment(s);
	mem_free(&b);
	mem_free(&src);
	mem_free(&dst);
	host_stop();
}

/* A transport that takes control messages, as rdma will. */
static int fake_ctrl(struct te_xport *x, const char *peer, void **conn, const uint8_t *in,
		     size_t inlen, uint8_t *out, size_t *outlen)
{
	(void)x;
	(void)conn;
	if (inlen == 4 && memcmp(in, "busy", 4) == 0)
		return -EBUSY;
	int n = snprintf((char *)out, *outlen, "pong %.*s from %s", (int)inlen, in, peer);
	*outlen = (size_t)n;
	return 0;
}

static void fake_fini(struct te_xport *x)
{
	(void)x;
}

static const struct te_xport_ops fake_ops = {
	.name = "fake-rdma", .proto = TE_PROTO_RDMA, .fini = fake_fini, .on_ctrl = fake_ctrl};

Test(te_engine, control_channel)
{
	host_start(TE_PROTO_TCP);
	static int dummy;
	H.e[1]->xops[TE_PROTO_RDMA] = &fake_ops;
	H.e[1]->xp[TE_PROTO_RDMA] = (struct te_xport *)&dummy;
	struct te_segment *s = open_b();
	struct te_desc *d;
	pthread_mutex_lock(&s->mu);
	cr_assert_eq(te__desc_copy(s->desc, &d), 0);
	pthread_mutex_unlock(&s->mu);
	uint8_t out[256];
	size_t outlen = sizeof(out);
	cr_assert_eq(te__ctrl_call(H.e[0], d, TE_PROTO_RDMA, (const uint8_t *)"ping", 4, out,
				   &outlen, 5000),
		     0);
	char want[300];
	snprintf(want, sizeof(want), "pong ping from %s", te_name(H.e[0]));
	cr_assert_eq(outlen, strlen(want));
	cr_assert(memcmp(out, want, outlen) == 0);
	outlen = sizeof(out);
	cr_assert_eq(te__ctrl_call(H.e[0], d, TE_PROTO_RDMA, (const uint8_t *)"busy", 4, out,
				   &outlen, 5000),
		     -EBUSY);
	outlen = sizeof(out);
	cr_assert_eq(te__ctrl_call(H.e[0], d, TE_PROTO_SHM, (const uint8_t *)"x", 1, out,
				   &outlen, 5000),
		     -EPROTONOSUPPORT);
	outlen = 3; /* the answer does not fit */
	cr_assert_eq(te__ctrl_call(H.e[0], d, TE_PROTO_RDMA, (const uint8_t *)"ping", 4, out,
				   &outlen, 5000),
		     -EOVERFLOW);
	te__desc_free(d);
	te_close_segment(s);
	host_stop(); /* te_free calls the fake fini */
}

/* te_submit_inline: a same-host read of 2 MiB + 3 is copied by the
 * submitting thread, so the batch is complete, and on_done has run on that
 * thread, when the call returns; by default the submitter copies 1 MiB of
 * the (64 KiB) slices and the data threads the rest. */
static pthread_t inline_done_thread;
static int inline_done_calls;

static void on_inline_done(struct te_batch *b, void *ud)
{
	(void)b;
	(void)ud;
	inline_done_thread = pthread_self();
	__atomic_add_fetch(&inline_done_calls, 1, __ATOMIC_SEQ_CST);
}

Test(te_engine, inline_submit_copies_on_the_caller)
{
	host_start(TE_PROTO_AUTO);
	struct mem b, dst;
	size_t len = (2u << 20) + 3;
	mem_new(H.e[1], len, &b);
	mem_new(H.e[0], len, &dst);
	for (size_t i = 0; i < len; i++)
		b.p[i] = (uint8_t)(i * 7 + 1);
	struct te_segment *s = open_b();
	struct te_request r = {.op = TE_READ,
			       .local = dst.p,
			       .segment = s,
			       .remote_addr = (uint64_t)(uintptr_t)b.p,
			       .len = len};
	const char *sample = "mooncake_te_shm_inline_bytes_total ";
	struct te_batch *batch;
	cr_assert_eq(te_submit_inline(H.e[0], &r, 1, len, on_inline_done, NULL, &batch), 0);
	cr_assert_eq(__atomic_load_n(&inline_done_calls, __ATOMIC_SEQ_CST), 1,
		     "complete when the call returns");
	cr_assert(pthread_equal(inline_done_thread, pthread_self()), "on the caller's thread");
	cr_assert_eq(metric(0, sample), (double)len);
	struct te_result res;
	cr_assert_eq(te_poll(batch, &res), 0);
	cr_assert_eq(res.status, TE_DONE);
	cr_assert_eq(memcmp(dst.p, b.p, len), 0, "the bytes");
	te_batch_free(batch);
	/* The default. */
	memset(dst.p, 0, len);
	cr_assert_eq(te_submit(H.e[0], &r, 1, &batch), 0);
	cr_assert_eq(te_wait(batch, 0), 0);
	cr_assert_eq(memcmp(dst.p, b.p, len), 0, "the bytes");
	cr_assert_eq(metric(0, sample), (double)len + (1u << 20), "1 MiB inline");
	te_batch_free(batch);
	te_close_segment(s);
	mem_free(&dst);
	mem_free(&b);
	host_stop();
}

/* Rss in kB of this process's mapping of a memfd of len bytes other than
 * the one at `not` (-1: none such). */
static long peer_map_rss_kb(size_t len, const void * not )
{
	FILE *f = fopen("/proc/self/smaps", "r");
	cr_assert(f);
	char line[512];
	long rss = -1;
	bool in = false;
	while (fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;
		char path[256] = "";
		if (sscanf(line, "%lx-%lx %*s %*s %*s %*s %255s", &lo, &hi, path) >= 2 &&
		    strchr(line, '-') < strchr(line, ' ')) {
			in = hi - lo == len && (void *)lo != not &&strstr(path, "memfd:t");
			continue;
		}
		long kb;
		if (in && sscanf(line, "Rss: %ld kB", &kb) == 1)
			rss = kb;
	}
	fclose(f);
	return rss;
}

/* The pages of a peer's region are faulted into the initiator's mapping
 * ahead of its writes (a fault per first write of each page was a tenth
 * of an agent's loop under 4 KiB puts to a same-host agent); the bytes
 * stay as they were. */
Test(te_engine, shm_peer_regions_are_faulted_in_ahead)
{
	host_start(TE_PROTO_AUTO);
	struct mem b, dst;
	size_t len = 12u << 20;
	mem_new(H.e[1], len, &b); /* never touched by its owner: no page yet */
	memset(b.p, 0x5a, 4096);
	mem_new(H.e[0], 4096, &dst);
	cr_assert_eq(peer_map_rss_kb(len, b.p), -1, "not mapped before the open");
	struct te_segment *s = open_b();
	uint64_t deadline = mc_now_ms() + 20000;
	while (peer_map_rss_kb(len, b.p) < (long)(len >> 10)) {
		cr_assert(mc_now_ms() < deadline, "the peer's mapping stayed at %ld kB",
			  peer_map_rss_kb(len, b.p));
		usleep(2000);
	}
	struct te_request r = {.op = TE_READ,
			       .local = dst.p,
			       .segment = s,
			       .remote_addr = (uint64_t)(uintptr_t)b.p,
			       .len = 4096};
	struct te_batch *batch;
	cr_assert_eq(te_submit(H.e[0], &r, 1, &batch), 0);
	cr_assert_eq(te_wait(batch, 0), 0);
	cr_assert_eq(memcmp(dst.p, b.p, 4096), 0, "the bytes are the owner's");
	te_batch_free(batch);
	te_close_segment(s);
	mem_free(&dst);
	mem_free(&b);
	host_stop();
}

Test(te_engine, authentication_is_required_unless_insecure)
{
	uv_loop_t loop;
	cr_assert_eq(uv_loop_init(&loop), 0);
	struct te_opts o = {.loop = &loop,
			    .data_listen = "127.0.0.1:0",
			    .protocol = TE_PROTO_TCP,
			    .threads = 1,
			    .rdma_gid_index = -1};
	struct te_engine *e;
	cr_assert_eq(te_new(&o, &e), -EINVAL, "no secret and not insecure");
	o.cluster_secret = (const uint8_t *)"s";
	o.cluster_secret_len = 1;
	o.insecure = true;
	cr_assert_eq(te_new(&o, &e), -EINVAL, "a secret and insecure");
	o.insecure = false;
	cr_assert_eq(te_new(&o, &e), 0);
	te_free(e);
	o.cluster_secret = NULL;
	o.cluster_secret_len = 0;
	o.insecure = true;
	cr_assert_eq(te_new(&o, &e), 0);
	te_free(e);
	uv_run(&loop, UV_RUN_DEFAULT);
	cr_assert_eq(uv_loop_close(&loop), 0);
}

/* A read that asks for its bytes' CRC-32C gets that of what landed in its
 * buffer: summed in the copy over shm, per slice as it comes in over
 * tcp, the slices (64 KiB here, the last one short) joined whatever
 * order they finished in. A write or device memory asking for it is
 * refused. */
static void want_crc_reads(enum te_protocol pa)
{
	host_start(pa);
	struct mem b, dst;
	size_t len = (1u << 20) + 4097;
	mem_new(H.e[1], len, &b);
	mem_new(H.e[0], len, &dst);
	for (size_t i = 0; i < len; i++)
		b.p[i] = (uint8_t)(i * 13 + (i >> 11));
	struct te_segment *s = open_b();
	struct te_request r[3] = {
		{.op = TE_READ,
		 .local = dst.p,
		 .segment = s,
		 .remote_addr = (uint64_t)(uintptr_t)b.p,
		 .len = len,
		 .want_crc = true},
		{.op = TE_READ,
		 .local = dst.p,
		 .segment = s,
		 .remote_addr = (uint64_t)(uintptr_t)b.p + 5,
		 .len = 100,
		 .want_crc = true},
		{.op = TE_READ,
		 .local = dst.p,
		 .segment = s,
		 .remote_addr = (uint64_t)(uintptr_t)b.p,
		 .len = 0,
		 .want_crc = true},
	};
	struct te_result res[3];
	struct te_batch *batch;
	for (int k = 0; k < 3; k++) {
		memset(dst.p, 0, len);
		cr_assert_eq(te_submit(H.e[0], &r[k], 1, &batch), 0);
		cr_assert_eq(te_wait(batch, 0), 0);
		cr_assert_eq(te_poll(batch, &res[k]), 0);
		cr_assert_eq(res[k].status, TE_DONE);
		cr_assert_eq(memcmp(dst.p, (uint8_t *)(uintptr_t)r[k].remote_addr, r[k].len),
			     0);
		cr_assert_eq(res[k].crc, crc32c(0, dst.p, r[k].len), "request %d", k);
		te_batch_free(batch);
	}
	/* Inline, on the caller (shm). */
	cr_assert_eq(te_submit_inline(H.e[0], &r[0], 1, len, NULL, NULL, &batch), 0);
	cr_assert_eq(te_wait(batch, 0), 0);
	cr_assert_eq(te_poll(batch, &res[0]), 0);
	cr_assert_eq(res[0].crc, crc32c(0, b.p, len));
	te_batch_free(batch);
	struct te_request w = r[0];
	w.op = TE_WRITE;
	cr_assert_eq(te_submit(H.e[0], &w, 1, &batch), -EINVAL);
	w = r[0];
	w.local_device = true;
	cr_assert_eq(te_submit(H.e[0], &w, 1, &batch), -EINVAL);
	w = r[2];
	w.op = TE_WRITE;
	cr_assert_eq(te_submit(H.e[0], &w, 1, &batch), -EINVAL, "an empty write too");
	te_close_segment(s);
	mem_free(&dst);
	mem_free(&b);
	host_stop();
}

Test(te_engine, reads_sum_what_lands_over_shm)
{
	want_crc_reads(TE_PROTO_AUTO);
}

Test(te_engine, reads_sum_what_lands_over_tcp)
{
	want_crc_reads(TE_PROTO_TCP);
}
