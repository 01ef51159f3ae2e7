/*
 * test_rand.h: the tests' reproducible pseudo-random numbers (Marsaglia's
 * xorshift64, from a fixed seed): the same sequence on every run, so a
 * failure replays.
 */
#ifndef MC_TEST_RAND_H
#define MC_TEST_RAND_H

#include <stdint.h>

#define TEST_RAND_SEED 88172645463325252ull

/* The next number after *state (which it advances; never 0). */
static inline uint64_t test_rand(uint64_t *state)
{
	uint64_t x = *state;
	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return *state = x;
}

#endif
