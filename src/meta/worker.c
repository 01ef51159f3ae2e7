/*
 * worker: the meta node's disk thread. The WAL is thread-compatible and
 * blocks on fdatasync, so every WAL call (and the snapshot files written
 * with it) runs here, one job at a time in submission order, and the
 * event loop never waits for the disk. A finished job goes back to the
 * loop through a uv_async_t; its done() runs there.
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

#include "common/util.h"
#include "meta/meta_int.h"

struct meta__worker {
	pthread_t tid;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct meta__job *todo_head, *todo_tail; /* guarded by mu */
	struct meta__job *done_head, *done_tail; /* guarded by mu */
	bool quit;                               /* guarded by mu */
	bool thread_started;
	uv_async_t async;
	bool async_open;
};

static void push(struct meta__job **head, struct meta__job **tail, struct meta__job *j)
{
	j->next = NULL;
	if (*tail)
		(*tail)->next = j;
	else
		*head = j;
	*tail = j;
}

static void *worker_main(void *arg)
{
	struct meta__worker *w = arg;

	pthread_mutex_lock(&w->mu);
	for (;;) {
		while (!w->todo_head && !w->quit)
			pthread_cond_wait(&w->cv, &w->mu);
		struct meta__job *j = w->todo_head;
		if (!j)
			break; /* quit with nothing left */
		w->todo_head = j->next;
		if (!w->todo_head)
			w->todo_tail = NULL;
		pthread_mutex_unlock(&w->mu);
		j->work(j);
		pthread_mutex_lock(&w->mu);
		push(&w->done_head, &w->done_tail, j);
		if (w->async_open)
			uv_async_send(&w->async);
	}
	pthread_mutex_unlock(&w->mu);
	return NULL;
}

static void on_async(uv_async_t *a)
{
	struct meta__worker *w = MC_CONTAINER_OF(a, struct meta__worker, async);
	struct meta__job *j;

	pthread_mutex_lock(&w->mu);
	j = w->done_head;
	w->done_head = w->done_tail = NULL;
	pthread_mutex_unlock(&w->mu);
	while (j) {
		struct meta__job *next = j->next;
		j->done(j);
		j = next;
	}
}

static void on_closed_free(uv_handle_t *h)
{
	struct meta__worker *w = MC_CONTAINER_OF((uv_async_t *)h, struct meta__worker, async);

	pthread_cond_destroy(&w->cv);
	pthread_mutex_destroy(&w->mu);
	free(w);
}

int meta__worker_new(uv_loop_t *loop, struct meta__worker **out)
{
	struct meta__worker *w = calloc(1, sizeof(*w));
	int rc;

	if (!w)
		return -ENOMEM;
	pthread_mutex_init(&w->mu, NULL);
	pthread_cond_init(&w->cv, NULL);
	rc = uv_async_init(loop, &w->async, on_async);
	if (rc)
		goto err_free;
	w->async_open = true;
	rc = -pthread_create(&w->tid, NULL, worker_main, w);
	if (rc)
		goto err_async;
	w->thread_started = true;
	*out = w;
	return 0;

err_async:
	/* The handle is freed with w once the loop has closed it. */
	w->async_open = false;
	uv_close((uv_handle_t *)&w->async, on_closed_free);
	return rc;
err_free:
	pthread_cond_destroy(&w->cv);
	pthread_mutex_destroy(&w->mu);
	free(w);
	return rc;
}

void meta__worker_submit(struct meta__worker *w, struct meta__job *j)
{
	pthread_mutex_lock(&w->mu);
	push(&w->todo_head, &w->todo_tail, j);
	pthread_cond_signal(&w->cv);
	pthread_mutex_unlock(&w->mu);
}

void meta__worker_close(struct meta__worker *w)
{
	if (!w)
		return;
	pthread_mutex_lock(&w->mu);
	bool open = w->async_open;
	w->async_open = false;
	w->quit = true;
	pthread_cond_signal(&w->cv);
	pthread_mutex_unlock(&w->mu);
	if (open)
		uv_close((uv_handle_t *)&w->async, NULL);
}

void meta__worker_free(struct meta__worker *w)
{
	if (!w)
		return;
	pthread_mutex_lock(&w->mu);
	w->quit = true;
	pthread_cond_signal(&w->cv);
	pthread_mutex_unlock(&w->mu);
	if (w->thread_started)
		pthread_join(w->tid, NULL);
	pthread_cond_destroy(&w->cv);
	pthread_mutex_destroy(&w->mu);
	free(w);
}
