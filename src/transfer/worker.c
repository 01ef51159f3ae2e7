/*
 * worker: the data-plane threads. Each owns an epoll set (its connections)
 * and a task queue (copies, connection kicks) woken by an eventfd, in the
 * memcached style: whoever wants a worker to do something queues a task
 * and wakes it; the worker touches its connections only on its own thread.
 * Every second (and when woken) a worker runs its on_tick hook, which the
 * transports use for I/O timeouts.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "transfer/te_int.h"

#define LOG_SUBSYS LOGS_TE
#define MAX_EVENTS 64

static _Thread_local const struct te_worker *current;

bool te__on_worker(const struct te_worker *w)
{
	return current == w;
}

static void on_wake(struct te_ioh *h, uint32_t events)
{
	struct te_worker *w = MC_CONTAINER_OF(h, struct te_worker, wake);
	uint64_t v;
	(void)events;
	while (read(w->evfd, &v, sizeof(v)) < 0 && errno == EINTR)
		;
}

static void run_tasks(struct te_worker *w)
{
	for (;;) {
		pthread_mutex_lock(&w->mu);
		struct te_task *t = w->head;
		w->head = NULL;
		w->tail = &w->head;
		pthread_mutex_unlock(&w->mu);
		if (!t)
			return;
		while (t) {
			struct te_task *next = t->next;
			t->next = NULL;
			t->run(t);
			t = next;
		}
	}
}

static void *worker_main(void *arg)
{
	struct te_worker *w = arg;
	struct epoll_event ev[MAX_EVENTS];
	uint64_t next_tick = mc_now_ms() + 1000;
	char name[16];
	snprintf(name, sizeof(name), "te-worker-%u", w->idx);
	pthread_setname_np(pthread_self(), name);
	current = w;
	for (;;) {
		uint64_t now = mc_now_ms();
		int timeout = now >= next_tick ? 0 : (int)(next_tick - now);
		int n = epoll_wait(w->epfd, ev, MAX_EVENTS, timeout);
		if (n < 0 && errno != EINTR) {
			log_error("worker %u: epoll_wait: %s", w->idx, strerror(errno));
			break;
		}
		for (int i = 0; i < n; i++) {
			struct te_ioh *h = ev[i].data.ptr;
			h->on_io(h, ev[i].events);
		}
		run_tasks(w);
		pthread_mutex_lock(&w->mu);
		bool stop = w->stop && !w->head;
		w->exited = stop;
		pthread_mutex_unlock(&w->mu);
		if (stop)
			break;
		now = mc_now_ms();
		if (now >= next_tick) {
			struct te_engine *e = w->e;
			next_tick = now + 1000;
			for (int p = 0; atomic_load(&e->ready) && p < 4; p++)
				if (e->xp[p] && e->xops[p]->tick)
					e->xops[p]->tick(e->xp[p], w);
		}
	}
	current = NULL;
	return NULL;
}

void te__worker_post(struct te_worker *w, struct te_task *t)
{
	bool wake;
	t->next = NULL;
	pthread_mutex_lock(&w->mu);
	if (w->exited) {
		/* Shutting down: nothing runs on that thread any more. */
		pthread_mutex_unlock(&w->mu);
		t->run(t);
		return;
	}
	wake = w->head == NULL;
	*w->tail = t;
	w->tail = &t->next;
	pthread_mutex_unlock(&w->mu);
	if (wake && !te__on_worker(w)) {
		uint64_t one = 1;
		while (write(w->evfd, &one, sizeof(one)) < 0 && errno == EINTR)
			;
	}
}

int te__worker_add(struct te_worker *w, int fd, struct te_ioh *h, uint32_t events)
{
	struct epoll_event ev = {.events = events, .data.ptr = h};
	return epoll_ctl(w->epfd, EPOLL_CTL_ADD, fd, &ev) ? -errno : 0;
}

int te__worker_mod(struct te_worker *w, int fd, struct te_ioh *h, uint32_t events)
{
	struct epoll_event ev = {.events = events, .data.ptr = h};
	return epoll_ctl(w->epfd, EPOLL_CTL_MOD, fd, &ev) ? -errno : 0;
}

void te__worker_del(struct te_worker *w, int fd)
{
	struct epoll_event ev = {0};
	(void)epoll_ctl(w->epfd, EPOLL_CTL_DEL, fd, &ev);
}

static void stop_join(struct te_engine *e);

static void worker_destroy(struct te_worker *w)
{
	if (w->epfd >= 0)
		close(w->epfd);
	if (w->evfd >= 0)
		close(w->evfd);
	pthread_mutex_destroy(&w->mu);
}

int te__workers_start(struct te_engine *e, unsigned n)
{
	int rc;
	e->workers = calloc(n, sizeof(*e->workers));
	if (!e->workers)
		return -ENOMEM;
	for (unsigned i = 0; i < n; i++) {
		struct te_worker *w = &e->workers[i];
		w->e = e;
		w->idx = i;
		w->tail = &w->head;
		w->wake.on_io = on_wake;
		pthread_mutex_init(&w->mu, NULL);
		w->epfd = epoll_create1(EPOLL_CLOEXEC);
		w->evfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
		if (w->epfd < 0 || w->evfd < 0) {
			rc = -errno;
			goto fail;
		}
		rc = te__worker_add(w, w->evfd, &w->wake, EPOLLIN);
		if (rc)
			goto fail;
	}
	for (unsigned i = 0; i < n; i++) {
		rc = -pthread_create(&e->workers[i].tid, NULL, worker_main, &e->workers[i]);
		if (rc) {
			e->nworkers = i;
			stop_join(e);
			goto fail;
		}
		e->nworkers = i + 1;
	}
	return 0;
fail:
	for (unsigned i = 0; i < n; i++) {
		struct te_worker *w = &e->workers[i];
		if (w->e)
			worker_destroy(w);
	}
	free(e->workers);
	e->workers = NULL;
	e->nworkers = 0;
	return rc;
}

static void stop_join(struct te_engine *e)
{
	for (unsigned i = 0; i < e->nworkers; i++) {
		struct te_worker *w = &e->workers[i];
		pthread_mutex_lock(&w->mu);
		w->stop = true;
		pthread_mutex_unlock(&w->mu);
		uint64_t one = 1;
		while (write(w->evfd, &one, sizeof(one)) < 0 && errno == EINTR)
			;
	}
	for (unsigned i = 0; i < e->nworkers; i++)
		pthread_join(e->workers[i].tid, NULL);
}

void te__workers_stop(struct te_engine *e)
{
	stop_join(e);
	for (unsigned i = 0; i < e->nworkers; i++)
		worker_destroy(&e->workers[i]);
	free(e->workers);
	e->workers = NULL;
	e->nworkers = 0;
}
