/*
 * pool: the agent's copy threads. A job's run() executes on one of them;
 * its done() runs afterwards on the loop thread, woken by a uv_async_t.
 * Work done elsewhere (the transfer engine's threads) can end the same
 * way: agent__pool_begin on the loop, agent__pool_complete from any
 * thread once it is over.
 * Jobs are intrusive (struct agent_job embedded in their owner), so
 * queueing never allocates.
 */
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "agent/agent_int.h"
#include "common/log.h"
#include "common/util.h"

#define LOG_SUBSYS LOGS_AGENT

/* p->mu held: j is over, its done() to run on the loop. */
static void push_done_locked(struct agent_pool *p, struct agent_job *j)
{
	j->next = NULL;
	if (p->done_tail)
		p->done_tail->next = j;
	else
		p->done_head = j;
	p->done_tail = j;
	uv_async_send(&p->async);
}

static void *worker(void *arg)
{
	struct agent_pool *p = arg;
	pthread_mutex_lock(&p->mu);
	for (;;) {
		while (!p->head && !p->quit)
			pthread_cond_wait(&p->cv, &p->mu);
		if (!p->head)
			break; /* quit with an empty queue */
		struct agent_job *j = p->head;
		p->head = j->next;
		if (!p->head)
			p->tail = NULL;
		pthread_mutex_unlock(&p->mu);
		bool detached = !j->done; /* then run owns j: it may be gone */
		j->run(j);
		pthread_mutex_lock(&p->mu);
		if (!detached)
			push_done_locked(p, j);
	}
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

/* Stop and join the threads (they run what is queued first). */
static void join_all(struct agent_pool *p)
{
	pthread_mutex_lock(&p->mu);
	p->quit = true;
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
	for (unsigned i = 0; i < p->nthreads; i++)
		pthread_join(p->threads[i], NULL);
}

/* After join_all and the last completions: free the pool's memory. */
static void free_all(struct agent_pool *p)
{
	pthread_cond_destroy(&p->cv);
	pthread_mutex_destroy(&p->mu);
	free(p->threads);
	p->threads = NULL;
	p->nthreads = 0;
}

static void on_async(uv_async_t *h)
{
	struct agent_pool *p = MC_CONTAINER_OF(h, struct agent_pool, async);
	pthread_mutex_lock(&p->mu);
	struct agent_job *j = p->done_head;
	p->done_head = p->done_tail = NULL;
	pthread_mutex_unlock(&p->mu);
	bool any = j != NULL;
	while (j) {
		struct agent_job *next = j->next;
		p->pending--;
		if (j->threaded)
			p->threaded--;
		if (j->background)
			p->background--;
		j->done(j);
		j = next;
	}
	if (any && p->threaded == 0 && p->on_idle)
		p->on_idle(p->idle_ud);
}

int agent__pool_start(struct agent_pool *p, uv_loop_t *loop, unsigned nthreads)
{
	memset(p, 0, sizeof(*p));
	if (nthreads == 0)
		nthreads = 1;
	p->threads = calloc(nthreads, sizeof(*p->threads));
	if (!p->threads)
		return -ENOMEM;
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->cv, NULL);
	int rc = 0;
	for (unsigned i = 0; i < nthreads; i++) {
		rc = -pthread_create(&p->threads[i], NULL, worker, p);
		if (rc) {
			log_error("cannot start copy thread %u: %s", i, strerror(-rc));
			break;
		}
		p->nthreads++;
	}
	/* The async handle last: a failure before it leaves no handle to
	 * close. No job is queued before this returns. */
	if (rc == 0 && uv_async_init(loop, &p->async, on_async) != 0)
		rc = -ENOMEM;
	if (rc) {
		join_all(p);
		free_all(p);
		return rc;
	}
	p->started = true;
	return 0;
}

static void enqueue(struct agent_pool *p, struct agent_job *j)
{
	j->next = NULL;
	pthread_mutex_lock(&p->mu);
	if (p->tail)
		p->tail->next = j;
	else
		p->head = j;
	p->tail = j;
	pthread_cond_signal(&p->cv);
	pthread_mutex_unlock(&p->mu);
}

static void submit(struct agent_pool *p, struct agent_job *j, bool background)
{
	j->background = background;
	j->threaded = !background;
	p->pending++;
	p->threaded += !background;
	p->background += background;
	enqueue(p, j);
}

void agent__pool_submit(struct agent_pool *p, struct agent_job *j)
{
	submit(p, j, false);
}

void agent__pool_submit_background(struct agent_pool *p, struct agent_job *j)
{
	submit(p, j, true);
}

void agent__pool_begin(struct agent_pool *p, struct agent_job *j)
{
	j->background = false;
	j->threaded = false;
	p->pending++;
}

void agent__pool_done_now(struct agent_pool *p, struct agent_job *j)
{
	p->pending--;
	j->done(j);
	if (p->threaded == 0 && p->on_idle)
		p->on_idle(p->idle_ud);
}

void agent__pool_complete(struct agent_pool *p, struct agent_job *j)
{
	pthread_mutex_lock(&p->mu);
	push_done_locked(p, j);
	pthread_mutex_unlock(&p->mu);
}

/*
 * agent__pool_copy: the caller and one copy thread take chunks in turn.
 * The copy thread's part is a detached job (no done on the loop, not
 * pending): the loop learns nothing from its end, so a helper that ends
 * late neither delays the loop's busy poll nor makes the next get wait
 * for the copy threads. The caller and the helper each hold a reference;
 * the last one out frees it.
 */
#define COPY_CHUNK ((size_t)64 << 10)

struct shared_copy {
	struct agent_job job;
	uint8_t *dst;
	const uint8_t *src;
	size_t len;
	atomic_size_t next;   /* offset of the next chunk to take */
	atomic_size_t copied; /* bytes copied */
	atomic_uint refs;     /* the caller's and the helper's */
};

static void shared_copy_put(struct shared_copy *c)
{
	if (atomic_fetch_sub_explicit(&c->refs, 1, memory_order_acq_rel) == 1)
		free(c);
}

static void copy_chunks(struct shared_copy *c)
{
	for (;;) {
		size_t off = atomic_fetch_add(&c->next, COPY_CHUNK);
		if (off >= c->len)
			return;
		size_t n = MC_MIN(COPY_CHUNK, c->len - off);
		memcpy(c->dst + off, c->src + off, n);
		atomic_fetch_add_explicit(&c->copied, n, memory_order_release);
	}
}

static void shared_copy_run(struct agent_job *j)
{
	struct shared_copy *c = MC_CONTAINER_OF(j, struct shared_copy, job);
	copy_chunks(c);
	shared_copy_put(c);
}

void agent__pool_copy(struct agent_pool *p, void *dst, const void *src, size_t len)
{
	struct shared_copy *c = len >= 4 * COPY_CHUNK && p->started ? malloc(sizeof(*c))
								    : NULL;
	if (!c) {
		memcpy(dst, src, len);
		return;
	}
	c->dst = dst;
	c->src = src;
	c->len = len;
	atomic_init(&c->next, 0);
	atomic_init(&c->copied, 0);
	atomic_init(&c->refs, 2);
	c->job.run = shared_copy_run;
	c->job.done = NULL; /* detached */
	enqueue(p, &c->job);
	copy_chunks(c);
	/* What is left is a chunk the helper is copying. */
	for (unsigned spins = 0; atomic_load_explicit(&c->copied, memory_order_acquire) < len;
	     spins++)
		if (spins >= 1000)
			sched_yield();
	shared_copy_put(c);
}

void agent__pool_on_idle(struct agent_pool *p, void (*on_idle)(void *ud), void *ud)
{
	p->on_idle = on_idle;
	p->idle_ud = ud;
}

unsigned agent__pool_pending(const struct agent_pool *p)
{
	return p->pending;
}

unsigned agent__pool_busy(const struct agent_pool *p)
{
	return p->pending - p->background;
}

unsigned agent__pool_threaded(const struct agent_pool *p)
{
	return p->threaded;
}

bool agent__pool_started(const struct agent_pool *p)
{
	return p->started;
}

unsigned agent__pool_stop(struct agent_pool *p, uv_close_cb on_closed, void *data)
{
	if (!p->started)
		return 0;
	p->on_idle = NULL; /* (the owner is stopping: no more news) */
	join_all(p);
	/* Completions not yet delivered: run them now (under the mutex,
	 * which lives until then). */
	on_async(&p->async);
	free_all(p);
	p->async.data = data;
	uv_close((uv_handle_t *)&p->async, on_closed);
	p->started = false;
	return 1;
}
