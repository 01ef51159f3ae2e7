/*
 * The fixture shared by the master core's unit tests: a core under a
 * fake clock (c), made and freed around each test, and short-hands.
 * Header-only (static), each test binary has its own copy.
 */
#ifndef TEST_MASTER_UTIL_H
#define TEST_MASTER_UTIL_H

#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "master/core.h"

#define MiB (1ull << 20)
#define K(s) (const uint8_t *)(s), strlen(s)

static struct master_core *c;

static const struct master_core_opts opts = {
	.put_timeout_ms = 30000,
	.lease_ttl_ms = 5000,
	.agent_ttl_ms = 10000,
	.high_watermark = 0.9,
	.eviction_ratio = 0.1,
	.seed = 7,
};

static void setup(void)
{
	cr_assert_eq(master__core_new(&opts, &c), 0);
}

static void teardown(void)
{
	master__core_free(c);
}

static void must(int rc)
{
	cr_assert_eq(rc, 0, "rc %d (%s)", rc, mc_strerror(rc));
}

/* What segments gone left to the reaper, dropped at once (the master's
 * loop does it in slices); returns the objects removed with them. */
static void reaped_count(void *ud, const struct master_reaped *r)
{
	*(uint64_t *)ud += r->removed;
}

static __attribute__((unused)) uint64_t reap_all(void)
{
	uint64_t removed = 0;
	while (!master__reap_step(c, SIZE_MAX, reaped_count, &removed))
		;
	return removed;
}

#endif
