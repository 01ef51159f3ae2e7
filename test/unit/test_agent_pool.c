/*
 * test_agent_pool: the agent's copy threads (pool.c) — jobs run on a
 * thread and end on the loop; work done elsewhere ends the same way
 * (agent__pool_begin/complete, from another thread); a copy shared with a
 * copy thread (agent__pool_copy) delivers every byte, whatever its size
 * and however late the helper starts, and leaves nothing pending.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "agent/pool.h"
#include "common/util.h"

static uv_loop_t loop;
static struct agent_pool pool;
static bool closed;

static void on_closed(uv_handle_t *h)
{
	(void)h;
	closed = true;
}

static void setup(void)
{
	cr_assert_eq(uv_loop_init(&loop), 0);
	cr_assert_eq(agent__pool_start(&pool, &loop, 1), 0);
}

static void teardown(void)
{
	/* Every job's done has run: nothing is pending. */
	while (pool.pending)
		uv_run(&loop, UV_RUN_ONCE);
	closed = false;
	agent__pool_stop(&pool, on_closed, NULL);
	uv_run(&loop, UV_RUN_DEFAULT);
	cr_assert(closed);
	cr_assert_eq(uv_loop_close(&loop), 0);
}

TestSuite(agent_pool, .init = setup, .fini = teardown);

struct counted {
	struct agent_job job;
	pthread_t ran_on;
	int done;
};

static void counted_run(struct agent_job *j)
{
	MC_CONTAINER_OF(j, struct counted, job)->ran_on = pthread_self();
}

static void counted_done(struct agent_job *j)
{
	MC_CONTAINER_OF(j, struct counted, job)->done++;
}

Test(agent_pool, jobs_run_on_a_thread_and_end_on_the_loop)
{
	struct counted c[8];
	memset(c, 0, sizeof(c));
	for (int i = 0; i < 8; i++) {
		c[i].job.run = counted_run;
		c[i].job.done = counted_done;
		agent__pool_submit(&pool, &c[i].job);
	}
	cr_assert_eq(pool.pending, 8);
	cr_assert_eq(pool.threaded, 8);
	while (pool.pending)
		uv_run(&loop, UV_RUN_ONCE);
	for (int i = 0; i < 8; i++) {
		cr_assert_eq(c[i].done, 1);
		cr_assert_not(pthread_equal(c[i].ran_on, pthread_self()));
	}
}

Test(agent_pool, a_background_job_is_pending_but_not_busy)
{
	struct counted bg, fg;
	memset(&bg, 0, sizeof(bg));
	memset(&fg, 0, sizeof(fg));
	bg.job.run = fg.job.run = counted_run;
	bg.job.done = fg.job.done = counted_done;
	agent__pool_submit_background(&pool, &bg.job);
	cr_assert_eq(agent__pool_pending(&pool), 1, "a stop waits for it");
	cr_assert_eq(agent__pool_busy(&pool), 0);
	cr_assert_eq(agent__pool_threaded(&pool), 0);
	agent__pool_submit(&pool, &fg.job);
	cr_assert_eq(agent__pool_pending(&pool), 2);
	cr_assert_eq(agent__pool_busy(&pool), 1);
	cr_assert_eq(agent__pool_threaded(&pool), 1);
	while (pool.pending)
		uv_run(&loop, UV_RUN_ONCE);
	cr_assert_eq(bg.done + fg.done, 2);
	cr_assert_eq(agent__pool_busy(&pool), 0);
	cr_assert_eq(pool.background, 0);
	cr_assert_not(pthread_equal(bg.ran_on, pthread_self()));
}

static void *complete_later(void *arg)
{
	struct counted *c = arg;
	agent__pool_complete(&pool, &c->job);
	return NULL;
}

Test(agent_pool, work_done_elsewhere_ends_on_the_loop)
{
	struct counted c;
	memset(&c, 0, sizeof(c));
	c.job.done = counted_done;
	agent__pool_begin(&pool, &c.job);
	cr_assert_eq(pool.pending, 1);
	cr_assert_eq(pool.threaded, 0, "not the copy threads' work");
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, complete_later, &c), 0);
	pthread_join(t, NULL);
	cr_assert_eq(c.done, 0, "done runs on the loop, not on the completing thread");
	while (pool.pending)
		uv_run(&loop, UV_RUN_ONCE);
	cr_assert_eq(c.done, 1);
}

Test(agent_pool, shared_copies_deliver_every_byte)
{
	static const size_t sizes[] = {1,       4096,         256 << 10, (1 << 20) + 3,
				       2 << 20, (3 << 20) - 7};
	size_t max = 3 << 20;
	uint8_t *src = malloc(max), *dst = malloc(max);
	cr_assert(src && dst);
	for (size_t i = 0; i < max; i++)
		src[i] = (uint8_t)(i * 131 + (i >> 11));
	for (unsigned round = 0; round < 20; round++) {
		for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
			size_t off = round % 7;
			size_t len = sizes[k] - (sizes[k] > off ? off : 0);
			memset(dst, 0, max);
			agent__pool_copy(&pool, dst, src + off, len);
			cr_assert(memcmp(dst, src + off, len) == 0, "%zu bytes, round %u", len,
				  round);
			cr_assert_eq(dst[len], 0, "nothing past the end");
		}
		/* The helpers of earlier copies may still be queued when
		 * the next one starts: it must not matter. Sometimes let
		 * them drain (the loop has nothing to do for them). */
		if (round % 2)
			usleep(1000);
	}
	free(src);
	free(dst);
}

static int idles;

static void count_idle(void *ud)
{
	(void)ud;
	idles++;
}

static void quiet_run(struct agent_job *j)
{
	(void)j;
}

static void quiet_done(struct agent_job *j)
{
	free(j);
}

Test(agent_pool, the_owner_hears_when_the_last_job_ends)
{
	static uint8_t src[1 << 20], dst[1 << 20];
	memset(src, 7, sizeof(src));
	idles = 0;
	agent__pool_on_idle(&pool, count_idle, NULL);
	/* A shared copy leaves nothing pending and wakes no one: a get's
	 * next request finds the copy threads idle (the loop may keep
	 * polling) and a late helper has no news for the owner. */
	agent__pool_copy(&pool, dst, src, sizeof(src));
	cr_assert(memcmp(dst, src, sizeof(src)) == 0);
	cr_assert_eq(pool.pending, 0);
	cr_assert_eq(pool.threaded, 0);
	/* A job whose done ends no request of the owner's: this is how a
	 * stop waiting for the pool to drain learns it did. */
	struct agent_job *j = calloc(1, sizeof(*j));
	cr_assert(j);
	j->run = quiet_run;
	j->done = quiet_done;
	agent__pool_submit(&pool, j);
	cr_assert_eq(pool.pending, 1);
	while (pool.pending)
		uv_run(&loop, UV_RUN_ONCE);
	cr_assert_eq(idles, 1);
	/* A helper still queued at the stop (teardown) runs and frees
	 * itself: the sanitizer build sees no leak. */
	agent__pool_copy(&pool, dst, src, sizeof(src));
}
