/*
 * pool.h: the agent's copy threads (pool.c) — jobs run off the loop,
 * their completions back on it. A shared service that calls no other
 * file of the agent.
 */
#ifndef MC_AGENT_POOL_H
#define MC_AGENT_POOL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <uv.h>

#include "common/err.h"

struct agent_job {
	struct agent_job *next;
	void (*run)(struct agent_job *j);  /* on a copy thread */
	void (*done)(struct agent_job *j); /* on the loop thread */
	bool threaded;                     /* given to the copy threads */
	bool background;                   /* agent__pool_submit_background's */
};

/* The copy threads, embedded in their owner (touched only by pool.c). */
struct agent_pool {
	pthread_t *threads;
	unsigned nthreads;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct agent_job *head, *tail; /* queued */
	struct agent_job *done_head, *done_tail;
	bool quit;
	uv_async_t async;
	unsigned pending;    /* queued or running (loop) */
	unsigned threaded;   /* of them, the copy threads' */
	unsigned background; /* of them, agent__pool_submit_background's */
	/* agent__pool_on_idle's */
	void (*on_idle)(void *ud);
	void *idle_ud;
	bool started, closing;
};

int agent__pool_start(struct agent_pool *p, uv_loop_t *loop, unsigned nthreads) MC_MUST_CHECK;
/* Queue a job; done runs later on the loop thread. */
void agent__pool_submit(struct agent_pool *p, struct agent_job *j);
/* Queue a long job of the agent's own that nobody waits for (the
 * segment's prefault): pending (a stop waits for it) but neither threaded
 * nor busy, so that the loop's choices made for requests (copy on the
 * loop when a session is alone, busy polling) ignore it. */
void agent__pool_submit_background(struct agent_pool *p, struct agent_job *j);
/* A job whose work runs elsewhere (its run unused): counted as pending
 * from agent__pool_begin (loop thread) until agent__pool_complete (any
 * thread, once) has its done run on the loop thread. */
void agent__pool_begin(struct agent_pool *p, struct agent_job *j);
void agent__pool_complete(struct agent_pool *p, struct agent_job *j);
/* On the loop thread: a begun job's work is over already; run its done
 * now (no wake-up through the pool). */
void agent__pool_done_now(struct agent_pool *p, struct agent_job *j);
/* On the loop thread: memcpy with a copy thread's help — both take
 * 64 KiB chunks until none is left, so a helper that starts late finds
 * less to do (never slower than alone, up to twice as fast); returns when
 * every byte is copied. The helper's job is detached: it is not pending
 * and its end wakes no one (a late helper finds nothing left and frees
 * the copy's state if it is the last out). Small copies, or no memory:
 * plain memcpy. */
void agent__pool_copy(struct agent_pool *p, void *dst, const void *src, size_t len);
/* Have on_idle(ud) run on the loop after a round of completions that
 * leaves the copy threads without work. */
void agent__pool_on_idle(struct agent_pool *p, void (*on_idle)(void *ud), void *ud);
/* Jobs queued or running (begun, for agent__pool_begin's), and of them
 * those the copy threads run. */
unsigned agent__pool_pending(const struct agent_pool *p);
/* Pending jobs but the background ones. */
unsigned agent__pool_busy(const struct agent_pool *p);
unsigned agent__pool_threaded(const struct agent_pool *p);
bool agent__pool_started(const struct agent_pool *p);
/* Join the threads (every job must have completed) and close the async
 * handle (on_closed runs from the loop and gets it with data). Returns
 * how many handles it closed (0: the pool never started). */
unsigned agent__pool_stop(struct agent_pool *p, uv_close_cb on_closed, void *data);

#endif
