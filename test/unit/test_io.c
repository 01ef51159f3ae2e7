/*
 * test_io: the whole-buffer read and write loops. Short counts and EINTR
 * are provoked for real: a pipe far smaller than the transfer, a reader
 * that takes a little at a time, and an interval timer whose signal
 * (installed without SA_RESTART) interrupts the blocked calls. End of
 * file, a file shorter than a positioned read, and a bad descriptor give
 * the documented errors.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "common/io.h"

#define BIG ((size_t)4 << 20)

static volatile sig_atomic_t ticks;

static void on_alarm(int sig)
{
	(void)sig;
	ticks++;
}

/* SIGALRM every 100 us until stop_interrupts(); the calls it lands in
 * return EINTR, or a short count once they moved something. */
static void start_interrupts(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_alarm;
	sigemptyset(&sa.sa_mask);
	sa.sa_flags = 0; /* no SA_RESTART */
	cr_assert_eq(sigaction(SIGALRM, &sa, NULL), 0);
	ticks = 0;
	struct itimerval it = {.it_interval = {0, 100}, .it_value = {0, 100}};
	cr_assert_eq(setitimer(ITIMER_REAL, &it, NULL), 0);
}

static void stop_interrupts(void)
{
	struct itimerval it = {0};
	cr_assert_eq(setitimer(ITIMER_REAL, &it, NULL), 0);
	signal(SIGALRM, SIG_IGN);
}

static uint8_t *pattern(size_t len, unsigned seed)
{
	uint8_t *p = malloc(len);
	cr_assert_not_null(p);
	for (size_t i = 0; i < len; i++)
		p[i] = (uint8_t)((i + seed) * 2654435761u >> 24);
	return p;
}

/* The other end of the pipe, on a thread that never takes the signal. */
struct peer {
	int fd;
	uint8_t *buf;
	size_t len;
	size_t chunk; /* bytes per read(2) or write(2) */
	pthread_t tid;
};

static void *slow_reader(void *arg)
{
	struct peer *p = arg;
	size_t got = 0;
	while (got < p->len) {
		ssize_t n = read(p->fd, p->buf + got,
				 p->len - got < p->chunk ? p->len - got : p->chunk);
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	p->len = got;
	return NULL;
}

static void *slow_writer(void *arg)
{
	struct peer *p = arg;
	size_t off = 0;
	while (off < p->len) {
		size_t k = p->len - off < p->chunk ? p->len - off : p->chunk;
		ssize_t n = write(p->fd, p->buf + off, k);
		if (n <= 0)
			break;
		off += (size_t)n;
	}
	close(p->fd);
	return NULL;
}

static void start_peer(struct peer *p, void *(*fn)(void *))
{
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	cr_assert_eq(pthread_create(&p->tid, NULL, fn, p), 0);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
}

static void small_pipe(int fds[2])
{
	cr_assert_eq(pipe2(fds, O_CLOEXEC), 0);
	fcntl(fds[1], F_SETPIPE_SZ, 4096); /* the smallest a pipe gets */
}

Test(io, write_all_through_short_writes_and_eintr)
{
	int fds[2];
	small_pipe(fds);
	uint8_t *src = pattern(BIG, 1);
	struct peer r = {.fd = fds[0], .buf = calloc(1, BIG), .len = BIG, .chunk = 1000};
	cr_assert_not_null(r.buf);
	start_peer(&r, slow_reader);
	start_interrupts();
	int rc = mc_write_all(fds[1], src, BIG);
	stop_interrupts();
	cr_assert_eq(rc, 0, "%s", strerror(-rc));
	close(fds[1]);
	pthread_join(r.tid, NULL);
	cr_assert_eq(r.len, BIG);
	cr_assert_eq(memcmp(r.buf, src, BIG), 0);
	cr_assert_gt(ticks, 0, "no interrupt landed");
	close(fds[0]);
	free(r.buf);
	free(src);
}

Test(io, writev_all_through_short_writes_and_eintr)
{
	int fds[2];
	small_pipe(fds);
	uint8_t *src = pattern(BIG, 2);
	/* Uneven pieces, empty ones among them (first and last too). */
	struct iovec iov[8];
	size_t cuts[] = {0, 0, 1, 4097, 4097, 700000, BIG - 3, BIG, BIG};
	for (int i = 0; i < 8; i++)
		iov[i] = (struct iovec){src + cuts[i], cuts[i + 1] - cuts[i]};
	struct peer r = {.fd = fds[0], .buf = calloc(1, BIG), .len = BIG, .chunk = 777};
	cr_assert_not_null(r.buf);
	start_peer(&r, slow_reader);
	start_interrupts();
	int rc = mc_writev_all(fds[1], iov, 8);
	stop_interrupts();
	cr_assert_eq(rc, 0, "%s", strerror(-rc));
	close(fds[1]);
	pthread_join(r.tid, NULL);
	cr_assert_eq(r.len, BIG);
	cr_assert_eq(memcmp(r.buf, src, BIG), 0);
	close(fds[0]);
	free(r.buf);
	free(src);
}

Test(io, writev_all_of_nothing)
{
	struct iovec iov[2] = {{NULL, 0}, {NULL, 0}};
	cr_assert_eq(mc_writev_all(-1, iov, 2), 0);
	cr_assert_eq(mc_writev_all(-1, iov, 0), 0);
}

Test(io, read_full_through_short_reads_and_eintr_then_eof)
{
	int fds[2];
	small_pipe(fds);
	uint8_t *src = pattern(BIG, 3);
	struct peer w = {.fd = fds[1], .buf = src, .len = BIG, .chunk = 999};
	start_peer(&w, slow_writer);
	uint8_t *dst = malloc(BIG);
	cr_assert_not_null(dst);
	start_interrupts();
	int rc = mc_read_full(fds[0], dst, BIG);
	stop_interrupts();
	cr_assert_eq(rc, 0, "%s", strerror(-rc));
	cr_assert_eq(memcmp(dst, src, BIG), 0);
	pthread_join(w.tid, NULL);
	/* The writer closed its end: end of file before the first byte. */
	cr_assert_eq(mc_read_full(fds[0], dst, 1), -EIO);
	close(fds[0]);
	free(dst);
	free(src);
}

Test(io, read_full_eof_in_the_middle)
{
	int fds[2];
	cr_assert_eq(pipe2(fds, O_CLOEXEC), 0);
	cr_assert_eq(write(fds[1], "abc", 3), 3);
	close(fds[1]);
	char b[8];
	cr_assert_eq(mc_read_full(fds[0], b, sizeof(b)), -EIO);
	cr_assert_eq(memcmp(b, "abc", 3), 0, "what arrived is in the buffer");
	close(fds[0]);
}

static int temp_file(void)
{
	char path[] = "/tmp/mooncake-test-io-XXXXXX";
	int fd = mkostemp(path, O_CLOEXEC);
	cr_assert_geq(fd, 0);
	unlink(path);
	return fd;
}

Test(io, pwrite_pread_at_offsets)
{
	int fd = temp_file();
	uint8_t *src = pattern(BIG, 4);
	cr_assert_eq(mc_pwrite_all(fd, src, BIG, 12345), 0);
	cr_assert_eq(mc_pwrite_all(fd, "head", 4, 0), 0);
	struct stat st;
	cr_assert_eq(fstat(fd, &st), 0);
	cr_assert_eq((size_t)st.st_size, 12345 + BIG);
	uint8_t *dst = malloc(BIG);
	cr_assert_not_null(dst);
	cr_assert_eq(mc_pread_all(fd, dst, BIG, 12345), 0);
	cr_assert_eq(memcmp(dst, src, BIG), 0);
	cr_assert_eq(mc_pread_all(fd, dst, 4, 0), 0);
	cr_assert_eq(memcmp(dst, "head", 4), 0);
	/* Positioned calls leave the file offset alone. */
	cr_assert_eq(lseek(fd, 0, SEEK_CUR), 0);
	/* A read that runs past the end: the file is shorter than asked. */
	cr_assert_eq(mc_pread_all(fd, dst, 10, 12345 + BIG - 5), -EIO);
	cr_assert_eq(mc_pread_all(fd, dst, 1, 12345 + BIG), -EIO);
	close(fd);
	free(dst);
	free(src);
}

Test(io, errors_are_negative_errno)
{
	char b[4] = {0};
	cr_assert_eq(mc_write_all(-1, b, 4), -EBADF);
	cr_assert_eq(mc_read_full(-1, b, 4), -EBADF);
	cr_assert_eq(mc_pwrite_all(-1, b, 4, 0), -EBADF);
	cr_assert_eq(mc_pread_all(-1, b, 4, 0), -EBADF);
	struct iovec iov = {b, 4};
	cr_assert_eq(mc_writev_all(-1, &iov, 1), -EBADF);
	/* Nothing to move: no call is made, so no error either. */
	cr_assert_eq(mc_write_all(-1, b, 0), 0);
	cr_assert_eq(mc_read_full(-1, b, 0), 0);

	int fds[2];
	cr_assert_eq(pipe2(fds, O_CLOEXEC | O_NONBLOCK), 0);
	cr_assert_eq(mc_read_full(fds[0], b, 4), -EAGAIN, "non-blocking and empty");
	cr_assert_eq(mc_pwrite_all(fds[1], b, 4, 0), -ESPIPE, "a pipe has no offsets");
	close(fds[0]);
	close(fds[1]);
}
