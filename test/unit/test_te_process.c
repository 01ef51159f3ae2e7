/*
 * test_te_process: regions of another process's memory
 * (te_register_process). A child process holds ordinary malloc'd memory;
 * engine 1 registers it by the child's pid, and engine 0 writes into it
 * and reads it back — over tcp, and with protocol auto on one host (the
 * region has no memfd, so the same-host peer takes tcp for it) — every
 * byte checked in the child's memory itself. The descriptor offers it
 * without shm and without rkeys; a range outside it is refused; once the
 * child has exited, requests for it fail with an error instead of
 * touching whatever took its pid.
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_te_util.h"

#define LEN ((size_t)8 << 20)

struct child {
	pid_t pid;
	int pidfd;
	uint64_t addr; /* of its memory, in the child */
	int to_child;  /* a byte here (or EOF) ends it */
};

/* A child with LEN bytes of malloc'd memory, zeroed, waiting. */
static void child_start(struct child *c)
{
	int up[2], down[2];
	cr_assert_eq(pipe(up), 0);
	cr_assert_eq(pipe(down), 0);
	c->pid = fork();
	cr_assert(c->pid >= 0);
	if (c->pid == 0) {
		close(up[0]);
		close(down[1]);
		uint8_t *m = calloc(1, LEN);
		uint64_t a = (uint64_t)(uintptr_t)m;
		if (!m || write(up[1], &a, sizeof(a)) != (ssize_t)sizeof(a))
			_exit(1);
		char b;
		(void)!read(down[0], &b, 1);
		_exit(0);
	}
	close(up[1]);
	close(down[0]);
	cr_assert_eq(read(up[0], &c->addr, sizeof(c->addr)), (ssize_t)sizeof(c->addr));
	close(up[0]);
	c->to_child = down[1];
	c->pidfd = (int)syscall(SYS_pidfd_open, c->pid, 0);
	cr_assert(c->pidfd >= 0);
}

static void child_end(struct child *c)
{
	close(c->to_child);
	int st;
	cr_assert_eq(waitpid(c->pid, &st, 0), c->pid);
	close(c->pidfd);
}

/* The child's bytes at [off, off + len). */
static void child_read(const struct child *c, uint64_t off, void *out, size_t len)
{
	struct iovec l = {out, len}, r = {(void *)(uintptr_t)(c->addr + off), len};
	cr_assert_eq(process_vm_readv(c->pid, &l, 1, &r, 1, 0), (ssize_t)len);
}

static void host_start(enum te_protocol p)
{
	struct te_opts t[2] = {
		{.protocol = p,
		 .threads = 2,
		 .tcp_conns = 2,
		 .slice_bytes = 256 << 10,
		 .rdma_gid_index = -1},
		{.protocol = p,
		 .threads = 2,
		 .tcp_conns = 2,
		 .slice_bytes = 256 << 10,
		 .rdma_gid_index = -1},
	};
	host_start_with(t);
}

/* One request; its error (0: done). */
static int one(struct te_segment *s, enum te_op op, void *local, uint64_t remote, size_t len)
{
	struct te_request q = {op, local, s, remote, len, false, false};
	struct te_batch *bt;
	cr_assert_eq(te_submit(H.e[0], &q, 1, &bt), 0);
	cr_assert_eq(te_wait(bt, 60000), 0, "no hang");
	struct te_result res;
	te_poll(bt, &res);
	te_batch_free(bt);
	return res.status == TE_DONE ? 0 : res.err;
}

static void write_read_and_refuse(enum te_protocol p)
{
	host_start(p);
	struct child c;
	child_start(&c);
	struct te_region *r;
	cr_assert_eq(te_register_process(H.e[1], c.addr, LEN, c.pid, -1, &r), -EINVAL,
		     "a pidfd is needed");
	cr_assert_eq(te_register_process(H.e[1], c.addr, LEN, c.pid, c.pidfd, &r), 0);
	struct te_segment *s = open_b();
	struct te_region_info ri;
	struct te_segment_info si;
	cr_assert_eq(te_segment_info(s, &si, &ri, 1), 1);
	cr_assert_eq(ri.addr, c.addr);
	cr_assert_eq(ri.shm, false, "no memfd: not for shm");

	uint8_t *src = malloc(LEN), *back = malloc(LEN), *seen = malloc(LEN);
	for (size_t i = 0; i < LEN; i++)
		src[i] = (uint8_t)((i * 2654435761u) >> 24);
	/* Many slices, one of them odd-sized, at an odd offset. */
	cr_assert_eq(one(s, TE_WRITE, src, c.addr + 3, LEN - 3), 0);
	child_read(&c, 0, seen, LEN);
	cr_assert_eq(seen[0] | seen[1] | seen[2], 0, "nothing before");
	cr_assert(memcmp(seen + 3, src, LEN - 3) == 0, "every byte in the child's memory");
	cr_assert_eq(one(s, TE_READ, back, c.addr, LEN), 0);
	cr_assert(memcmp(back, seen, LEN) == 0, "read back");
	cr_assert_eq(one(s, TE_WRITE, src, c.addr + LEN - 8, 16), MC_EREMOTE_ACCESS,
		     "past the region");
	cr_assert(
		metric(1, "mooncake_te_served_bytes_total{transport=\"tcp\",op=\"write\"} ") >=
			(double)(LEN - 3),
		"served over tcp");

	/* The child exits: the region's requests fail, nothing hangs. */
	child_end(&c);
	cr_assert_neq(one(s, TE_WRITE, src, c.addr, 4096), 0, "the process is gone");
	cr_assert_neq(one(s, TE_READ, back, c.addr, 4096), 0, "the process is gone");
	te_unregister(r);
	cr_assert_eq(one(s, TE_WRITE, src, c.addr, 4096), MC_EREMOTE_ACCESS, "unregistered");
	te_close_segment(s);
	free(src);
	free(back);
	free(seen);
	host_stop();
}

Test(te_process, over_tcp)
{
	write_read_and_refuse(TE_PROTO_TCP);
}

Test(te_process, same_host_peer_takes_tcp_for_it)
{
	write_read_and_refuse(TE_PROTO_AUTO);
}
