/*
 * bench_master_index: the master core's batched lookups at scale, with
 * and without master__prefetch_ahead, which the master's batch calls run
 * ahead of their lookups, in one process.
 *
 *   bench_master_index [objects] [batch] [rounds]
 *
 * Fills a core with `objects` objects (18-byte keys as bench master's),
 * timing the longest single put (what one call waits for while the index
 * grows: before its buckets were added one at a time, the doubling at
 * 8.4M objects held the master's loop for 2.4 s), then for `rounds` rounds times the same scattered batches of gets both
 * ways, one after the other (the lookups only, not the making of the
 * batch's keys), and prints the best round's CPU ns per key of each: on
 * a shared machine the thread's CPU time, best of several interleaved
 * rounds, is the figure least disturbed by other work. A figure, not a
 * test.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/util.h"
#include "master/core.h"

#define KEY_LEN 18
#define LOOKUPS (1u << 20)

static void key_of(char *k, uint64_t i)
{
	snprintf(k, 32, "bench/%012" PRIu64, i);
}

static uint64_t pick(uint64_t i, uint64_t limit)
{
	return (i * 0x9e3779b97f4a7c15ull >> 16) % limit;
}

/* master_key_at_fn over the batch's keys. */
static const uint8_t *key_at(const void *batch, size_t j, size_t *klen)
{
	*klen = KEY_LEN;
	return (const uint8_t *)((const char(*)[32])batch)[j];
}

/* This thread's CPU time: unlike the wall clock, it leaves out the time
 * other work on a shared machine holds the core. */
static uint64_t cpu_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* CPU ns per key of LOOKUPS gets in batches of `batch`. */
static double run(struct master_core *c, uint64_t objects, size_t batch, bool prefetch,
		  uint64_t first, char (*keys)[32])
{
	uint64_t ns = 0, n = 0;
	while (n < LOOKUPS) {
		for (size_t i = 0; i < batch; i++)
			key_of(keys[i], pick(first + n + i, objects));
		uint64_t t0 = cpu_ns();
		for (size_t i = 0; i < batch; i++) {
			const struct master_obj *o;
			if (prefetch)
				master__prefetch_ahead(c, keys, batch, i, key_at);
			if (master__get(c, (const uint8_t *)keys[i], KEY_LEN, 1000, &o) != 0) {
				fprintf(stderr, "bench_master_index: %s not found\n", keys[i]);
				exit(1);
			}
		}
		ns += cpu_ns() - t0;
		n += batch;
	}
	return (double)ns / (double)n;
}

int main(int argc, char **argv)
{
	uint64_t objects = argc > 1 ? strtoull(argv[1], NULL, 10) : 1000000;
	size_t batch = argc > 2 ? strtoul(argv[2], NULL, 10) : 100;
	unsigned rounds = argc > 3 ? (unsigned)strtoul(argv[3], NULL, 10) : 5;
	if (!objects || !batch || !rounds) {
		fprintf(stderr, "usage: bench_master_index [objects] [batch] [rounds]\n");
		return 2;
	}
	struct master_core_opts o = {.put_timeout_ms = 3600000,
				     .lease_ttl_ms = 1,
				     .agent_ttl_ms = 3600000,
				     .high_watermark = 0.99,
				     .eviction_ratio = 0.01,
				     .seed = 1};
	struct master_core *c;
	if (master__core_new(&o, &c) ||
	    master__mount(c, "seg", "agent", MASTER_TIER_DRAM, 1ull << 44, 1ull << 46, false,
			  0, NULL)) {
		fprintf(stderr, "bench_master_index: cannot set up the core\n");
		return 1;
	}
	char k[32];
	uint64_t longest = 0, fill_ns = 0;
	for (uint64_t i = 0; i < objects; i++) {
		const struct master_obj *obj;
		key_of(k, i);
		struct master_put p = {
			.key = (const uint8_t *)k, .klen = KEY_LEN, .size = 4096};
		uint64_t t0 = cpu_ns();
		if (master__put_start(c, &p, 0, &obj) ||
		    master__put_end(c, (const uint8_t *)k, KEY_LEN, NULL, 0)) {
			fprintf(stderr, "bench_master_index: put %" PRIu64 " failed\n", i);
			return 1;
		}
		uint64_t d = cpu_ns() - t0;
		fill_ns += d;
		longest = d > longest ? d : longest;
	}
	char(*keys)[32] = calloc(batch, sizeof(*keys));
	if (!keys)
		return 1;
	double best[2] = {1e18, 1e18};
	for (unsigned r = 0; r < rounds; r++)
		for (int pf = 0; pf < 2; pf++) {
			double ns = run(c, objects, batch, pf, (uint64_t)r * LOOKUPS, keys);
			if (ns < best[pf])
				best[pf] = ns;
		}
	printf("bench_master_index: %" PRIu64 " objects, batches of %zu, best of %u rounds\n",
	       objects, batch, rounds);
	printf("  gets, plain       %8.1f CPU ns/key\n", best[0]);
	printf("  gets, prefetched  %8.1f CPU ns/key   (%.2fx)\n", best[1], best[0] / best[1]);
	printf("  puts              %8.1f CPU ns/put, the longest %.2f ms (%.0fx the mean)\n",
	       (double)fill_ns / (double)objects, (double)longest / 1e6,
	       (double)longest * (double)objects / (double)fill_ns);
	free(keys);
	master__core_free(c);
	return 0;
}
