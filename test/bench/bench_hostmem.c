/*
 * bench_hostmem: how fast an agent process can reach a client process's
 * memory, by each of the ways issue 16 weighs for memory the agent did
 * not allocate, beside plain memcpy (the limit) in the same run:
 *
 *   shared     the client's memory is a memfd both map (managed buffers,
 *              mc_host_alloc): the agent writes it with memcpy
 *   cma-write  ordinary anonymous memory of the client, written by the
 *              agent with process_vm_writev (cross-memory attach; the
 *              client named the agent with prctl(PR_SET_PTRACER))
 *   cma-read   the same, read with process_vm_readv
 *   remap      fd-backed ordinary memory: the client copies a region into
 *              a memfd and maps that over the same addresses (once, at
 *              registration); after it the agent writes as "shared"
 *
 * The "agent" is a child process (not an ancestor of the client, as a
 * real agent is not, so Yama's ptrace_scope 1 needs the PR_SET_PTRACER).
 * Usage: bench_hostmem [MiB per pass (64)] [chunk KiB (1024)] [passes (8)]
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static double gbs(size_t bytes, double s)
{
	return (double)bytes / s / 1e9;
}

static double best(double was, size_t bytes, double s)
{
	double v = gbs(bytes, s);
	return v > was ? v : was;
}

int main(int argc, char **argv)
{
	size_t len = (size_t)(argc > 1 ? atoi(argv[1]) : 64) << 20;
	size_t chunk = (size_t)(argc > 2 ? atoi(argv[2]) : 1024) << 10;
	int passes = argc > 3 ? atoi(argv[3]) : 8;
	if (!len || !chunk || chunk > len || passes < 1) {
		fprintf(stderr, "usage: bench_hostmem [MiB] [chunk KiB] [passes]\n");
		return 2;
	}
	/* The client's memory: ordinary (anonymous) and shared (a memfd). */
	uint8_t *ordinary = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
				 -1, 0);
	int mfd = memfd_create("bench-hostmem", MFD_CLOEXEC);
	if (ordinary == MAP_FAILED || mfd < 0 || ftruncate(mfd, (off_t)len) != 0) {
		perror("setup");
		return 1;
	}
	uint8_t *shared = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
	uint8_t *src = malloc(len);
	if (shared == MAP_FAILED || !src) {
		perror("setup");
		return 1;
	}
	memset(ordinary, 1, len); /* faulted in, as a KV cache in use is */
	memset(shared, 1, len);
	for (size_t i = 0; i < len; i++)
		src[i] = (uint8_t)(i * 131);

	int go[2], res[2];
	if (pipe(go) || pipe(res)) {
		perror("pipe");
		return 1;
	}
	pid_t client = getpid();
	pid_t agent = fork();
	if (agent == 0) {
		/* The agent: it maps the memfd (as it maps a client's buffer) and
		 * has its own source bytes (network data in its buffers). */
		uint8_t *amap = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
		uint8_t *bounce = malloc(len);
		char c;
		if (amap == MAP_FAILED || !bounce || read(go[0], &c, 1) != 1)
			_exit(1);
		memcpy(bounce, src, len);
		memset(amap, 2, len); /* faulted in here too, as the agent does */
		/* Rounds of every method in turn, the best of each: this is a
		 * shared machine, and a method should not pay for another's
		 * neighbour. */
		double r[5] = {0};
		int err = 0;
		for (int round = 0; round < 5; round++) {
			double t0 = now_s();
			for (int p = 0; p < passes; p++)
				for (size_t o = 0; o < len; o += chunk)
					memcpy(bounce + o, src + o, chunk);
			r[0] = best(r[0], (size_t)passes * len, now_s() - t0);
			t0 = now_s();
			for (int p = 0; p < passes; p++)
				for (size_t o = 0; o < len; o += chunk)
					memcpy(amap + o, bounce + o, chunk);
			r[1] = best(r[1], (size_t)passes * len, now_s() - t0);
			t0 = now_s();
			for (int p = 0; p < passes && !err; p++)
				for (size_t o = 0; o < len && !err; o += chunk) {
					struct iovec l = {bounce + o, chunk}, rr = {ordinary + o, chunk};
					if (process_vm_writev(client, &l, 1, &rr, 1, 0) != (ssize_t)chunk)
						err = errno ? errno : EIO;
				}
			r[2] = err ? -err : best(r[2], (size_t)passes * len, now_s() - t0);
			t0 = now_s();
			for (int p = 0; p < passes && !err; p++)
				for (size_t o = 0; o < len && !err; o += chunk) {
					struct iovec l = {bounce + o, chunk}, rr = {ordinary + o, chunk};
					if (process_vm_readv(client, &l, 1, &rr, 1, 0) != (ssize_t)chunk)
						err = errno ? errno : EIO;
				}
			r[3] = err ? -err : best(r[3], (size_t)passes * len, now_s() - t0);
		}
		if (write(res[1], r, sizeof(r)) != (ssize_t)sizeof(r))
			_exit(1);
		_exit(0);
	}
	/* The client names the agent as the process that may attach to it. */
	const char *ptracer = "PR_SET_PTRACER set";
	if (prctl(PR_SET_PTRACER, (unsigned long)agent, 0, 0, 0) != 0)
		ptracer = errno == EINVAL ? "no Yama: PR_SET_PTRACER not needed"
					  : "PR_SET_PTRACER failed";
	/* fd-backed ordinary memory: copy into a memfd, map over in place. */
	int rfd = memfd_create("bench-remap", MFD_CLOEXEC);
	double t0 = now_s();
	int rc = rfd < 0 ? -1 : ftruncate(rfd, (off_t)len);
	uint8_t *tmp = rc ? MAP_FAILED : mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, rfd, 0);
	if (tmp == MAP_FAILED) {
		perror("remap");
		return 1;
	}
	memcpy(tmp, ordinary, len);
	uint8_t *over = mmap(ordinary, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, rfd, 0);
	double remap = gbs(len, now_s() - t0);
	munmap(tmp, len);
	if (over != ordinary) {
		perror("remap");
		return 1;
	}
	/* The remapped region is new memory for the agent's writes below;
	 * restore ordinary anonymous memory for the CMA passes. */
	ordinary = mmap(ordinary, len, PROT_READ | PROT_WRITE,
			MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
	memset(ordinary, 1, len);
	if (write(go[1], "g", 1) != 1)
		return 1;
	double r[5];
	if (read(res[0], r, sizeof(r)) != (ssize_t)sizeof(r)) {
		fprintf(stderr, "the agent process failed\n");
		return 1;
	}
	int st;
	waitpid(agent, &st, 0);
	int ok = memcmp(ordinary, src, len) == 0 && memcmp(shared, src, len) == 0;
	printf("bench hostmem: %zu MiB x %d passes, %zu KiB chunks, best of 5 rounds; %s%s\n",
	       len >> 20, passes, chunk >> 10, ptracer, geteuid() == 0 ? " (as root)" : "");
	printf("%-10s %8.2f GB/s   (limit: memcpy between two buffers)\n", "memcpy", r[0]);
	printf("%-10s %8.2f GB/s   %3.0f%% of the limit\n", "shared", r[1], 100 * r[1] / r[0]);
	if (r[2] < 0)
		printf("%-10s failed: %s\n", "cma-write", strerror((int)-r[2]));
	else
		printf("%-10s %8.2f GB/s   %3.0f%% of the limit\n", "cma-write", r[2],
		       100 * r[2] / r[0]);
	if (r[3] < 0)
		printf("%-10s failed: %s\n", "cma-read", strerror((int)-r[3]));
	else
		printf("%-10s %8.2f GB/s   %3.0f%% of the limit\n", "cma-read", r[3],
		       100 * r[3] / r[0]);
	printf("%-10s %8.2f GB/s   once per registration (copy into a memfd, map over)\n",
	       "remap", remap);
	printf("bytes %s\n", ok ? "verified" : "WRONG");
	return ok ? 0 : 1;
}
