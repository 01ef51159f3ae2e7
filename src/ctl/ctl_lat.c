/*
 * ctl_lat: latency samples and their percentiles, and thread CPU time,
 * for the benchmarks.
 */
#include <stdlib.h>
#include <time.h>

#include "ctl/ctl_int.h"

void ctl_lat_add(struct ctl_lat *l, uint64_t ns)
{
	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 4096;
		uint64_t *v = realloc(l->v, cap * sizeof(*v));
		if (!v)
			return; /* a sample lost, not the run */
		l->v = v;
		l->cap = cap;
	}
	l->v[l->n++] = ns;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

double ctl_lat_pct_us(struct ctl_lat *l, double p)
{
	if (!l->n)
		return 0;
	qsort(l->v, l->n, sizeof(*l->v), cmp_u64);
	size_t i = (size_t)(p * (double)(l->n - 1));
	return (double)l->v[i] / 1000.0;
}

void ctl_lat_free(struct ctl_lat *l)
{
	free(l->v);
	l->v = NULL;
	l->n = l->cap = 0;
}

uint64_t ctl_thread_cpu_ns(pthread_t t)
{
	clockid_t id;
	struct timespec ts;
	if (pthread_getcpuclockid(t, &id) || clock_gettime(id, &ts))
		return 0;
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
