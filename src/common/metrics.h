/*
 * metrics: a registry of counters, gauges and histograms that any
 * subsystem can update from any thread, and its Prometheus text
 * exposition (format 0.0.4).
 *
 * A family has a name, help, type and label names; each distinct set of
 * label values is one metric. Look a metric up once (it is never freed
 * before the registry) and update it on the hot path: updates are relaxed
 * atomics, lock-free. Registration and formatting take the registry lock.
 *
 *   struct metric *calls = metrics_counter(reg, "mooncake_rpc_calls_total",
 *                               "RPC calls served.", "method,code",
 *                               (const char *[]){"/a.B/C", "OK"});
 *   metric_inc(calls);
 */
#ifndef MC_COMMON_METRICS_H
#define MC_COMMON_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "common/err.h"

struct metrics_registry;
struct metric;

enum metric_type { METRIC_COUNTER, METRIC_GAUGE, METRIC_HISTOGRAM };

/* Latency buckets in seconds, 100us .. 10s. */
extern const double metrics_latency_buckets[];
extern const size_t metrics_latency_nbuckets;

struct metrics_registry *metrics_registry_new(void);
void metrics_registry_free(struct metrics_registry *r);
/* The process-wide registry the daemons export. */
struct metrics_registry *metrics_global(void);

/*
 * Find or create the metric of family `name` with these label values.
 * labels: comma-separated label names ("" or NULL for none); values: one
 * per label name. Returns NULL only when out of memory or when the name
 * is already registered with another type, labels or buckets (a
 * programming error, logged).
 */
struct metric *metrics_counter(struct metrics_registry *r, const char *name, const char *help,
			       const char *labels, const char *const *values);
struct metric *metrics_gauge(struct metrics_registry *r, const char *name, const char *help,
			     const char *labels, const char *const *values);
/* buckets: strictly increasing upper bounds (+Inf is implicit). */
struct metric *metrics_histogram(struct metrics_registry *r, const char *name,
				 const char *help, const char *labels,
				 const char *const *values, const double *buckets,
				 size_t nbuckets);
/* A gauge read at scrape time: fn(ctx) is called under the registry lock
 * from the scraping thread; it must be thread-safe and must not call
 * into the registry. */
struct metric *metrics_gauge_fn(struct metrics_registry *r, const char *name, const char *help,
				const char *labels, const char *const *values,
				double (*fn)(void *ctx), void *ctx);

/* A counter read at scrape time, under the same rules as metrics_gauge_fn. */
struct metric *metrics_counter_fn(struct metrics_registry *r, const char *name,
				  const char *help, const char *labels,
				  const char *const *values, double (*fn)(void *ctx),
				  void *ctx);

/*
 * The standard process metrics of Prometheus client libraries, read at
 * scrape time: process_cpu_seconds_total, process_resident_memory_bytes,
 * process_virtual_memory_bytes, process_open_fds, process_max_fds and
 * process_start_time_seconds (*start_time_s, seconds since the epoch;
 * borrowed: it must outlive the registry). Returns 0, or -ENOMEM when one
 * could not be registered.
 */
int metrics_register_process(struct metrics_registry *r,
			     const double *start_time_s) MC_MUST_CHECK;

/* Updates: NULL metric is a no-op, so a failed registration never crashes
 * the hot path. */
void metric_inc(struct metric *m);
void metric_add(struct metric *m, uint64_t n);   /* counter or gauge */
void metric_sub(struct metric *m, uint64_t n);   /* gauge */
void metric_set(struct metric *m, int64_t v);    /* gauge */
void metric_observe(struct metric *m, double v); /* histogram */
/* Read back (tests, status output). Counter/gauge value; histogram count. */
double metric_value(const struct metric *m);

/* Append the exposition text of every family to out. Errors: -ENOMEM. */
int metrics_format(struct metrics_registry *r, struct mc_buf *out) MC_MUST_CHECK;

#endif
