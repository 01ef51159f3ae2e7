/*
 * ctl_bench_floor: the floor of a get, for one client of `bench store`
 * (ctl_bench_store.h): what a get through a daemon on
 * this host does at the least, without the store (no lookup, lease or
 * protocol): a request over a Unix socket; the value copied from memory
 * into the client's buffer by two threads, half each, as the agent shares
 * a copy of 256 KiB or more with a copy thread; the answer. The server
 * thread polls for 50 us after each answer (the agent's --busy-poll-us
 * default) and then sleeps in poll; the client sleeps in poll, as
 * libmooncake does.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/err.h"
#include "common/util.h"
#include "ctl/ctl_bench_store.h"

#define FLOOR_SPLIT (256u << 10)
#define FLOOR_SPIN_NS 50000ull

struct ctl_floor {
	int fd[2]; /* [0] the client's end, [1] the server's */
	pthread_t server, helper;
	bool has_server, has_helper;
	uint8_t *set; /* nvals values of size bytes (owned) */
	uint8_t *dst; /* the client's buffer (its worker's) */
	size_t size, nvals;
	size_t half; /* the helper's part (the end), 0: no helper */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	const uint8_t *job; /* the helper's half, NULL: none (under mu) */
	bool quit;          /* under mu */
	atomic_bool half_done;
};

static void *floor_helper(void *arg)
{
	struct ctl_floor *f = arg;
	pthread_mutex_lock(&f->mu);
	for (;;) {
		while (!f->job && !f->quit)
			pthread_cond_wait(&f->cv, &f->mu);
		if (f->quit)
			break;
		const uint8_t *src = f->job;
		f->job = NULL;
		pthread_mutex_unlock(&f->mu);
		memcpy(f->dst + f->size - f->half, src, f->half);
		atomic_store_explicit(&f->half_done, true, memory_order_release);
		pthread_mutex_lock(&f->mu);
	}
	pthread_mutex_unlock(&f->mu);
	return NULL;
}

static void *floor_server(void *arg)
{
	struct ctl_floor *f = arg;
	size_t half = f->half;
	uint64_t spin_until = 0;
	for (;;) {
		uint32_t k;
		ssize_t n = recv(f->fd[1], &k, sizeof(k), MSG_DONTWAIT);
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
			if (mc_now_ns() < spin_until)
				continue;
			struct pollfd p = {.fd = f->fd[1], .events = POLLIN};
			(void)poll(&p, 1, -1);
			continue;
		}
		if (n != (ssize_t)sizeof(k))
			break; /* the client's end closed: the run is over */
		const uint8_t *src = f->set + (size_t)(k % f->nvals) * f->size;
		if (half) {
			atomic_store_explicit(&f->half_done, false, memory_order_relaxed);
			pthread_mutex_lock(&f->mu);
			f->job = src + f->size - half;
			pthread_cond_signal(&f->cv);
			pthread_mutex_unlock(&f->mu);
		}
		memcpy(f->dst, src, f->size - half);
		while (half && !atomic_load_explicit(&f->half_done, memory_order_acquire))
			;
		if (send(f->fd[1], &k, sizeof(k), MSG_NOSIGNAL) != (ssize_t)sizeof(k))
			break;
		spin_until = mc_now_ns() + FLOOR_SPIN_NS;
	}
	return NULL;
}

int ctl_floor_get(struct ctl_floor *f, uint32_t k)
{
	if (send(f->fd[0], &k, sizeof(k), MSG_NOSIGNAL) != (ssize_t)sizeof(k))
		return -errno;
	struct pollfd p = {.fd = f->fd[0], .events = POLLIN};
	if (poll(&p, 1, -1) < 0)
		return -errno;
	uint32_t got;
	ssize_t n = recv(f->fd[0], &got, sizeof(got), 0);
	return n == (ssize_t)sizeof(got) && got == k ? 0 : n < 0 ? -errno : MC_EPROTOCOL;
}

void ctl_floor_stop(struct ctl_floor *f)
{
	if (!f)
		return;
	if (f->fd[0] >= 0)
		close(f->fd[0]); /* the server sees the end */
	if (f->has_server)
		pthread_join(f->server, NULL);
	if (f->has_helper) {
		pthread_mutex_lock(&f->mu);
		f->quit = true;
		pthread_cond_signal(&f->cv);
		pthread_mutex_unlock(&f->mu);
		pthread_join(f->helper, NULL);
	}
	if (f->fd[1] >= 0)
		close(f->fd[1]);
	pthread_mutex_destroy(&f->mu);
	pthread_cond_destroy(&f->cv);
	free(f->set);
	free(f);
}

int ctl_floor_start(size_t size, size_t nvals, uint8_t *dst, struct ctl_floor **out)
{
	struct ctl_floor *f = calloc(1, sizeof(*f));
	if (!f)
		return -ENOMEM;
	f->fd[0] = f->fd[1] = -1;
	pthread_mutex_init(&f->mu, NULL);
	pthread_cond_init(&f->cv, NULL);
	f->size = size;
	f->half = size >= FLOOR_SPLIT ? size / 2 : 0;
	f->dst = dst;
	f->nvals = nvals;
	f->set = malloc(f->nvals * size);
	int rc = f->set ? 0 : -ENOMEM;
	if (rc == 0 && socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, f->fd) != 0)
		rc = -errno;
	if (rc == 0) {
		memset(f->set, 0x5a, f->nvals * size);
		rc = -pthread_create(&f->helper, NULL, floor_helper, f);
		f->has_helper = rc == 0;
	}
	if (rc == 0) {
		rc = -pthread_create(&f->server, NULL, floor_server, f);
		f->has_server = rc == 0;
	}
	if (rc) {
		ctl_floor_stop(f);
		return rc;
	}
	*out = f;
	return 0;
}
