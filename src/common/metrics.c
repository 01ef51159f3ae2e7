/*
 * metrics: registry and Prometheus text format. See metrics.h.
 *
 * Families and metrics are singly linked lists appended under the registry
 * mutex and never removed until the registry is freed, so a struct metric
 * pointer stays valid and updates need no lock. Histogram sums are doubles
 * kept in an atomic 64-bit word updated by compare-and-swap.
 */
#include "common/metrics.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/log.h"

#define LOG_SUBSYS LOGS_MAIN

const double metrics_latency_buckets[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
					  0.01,   0.025,   0.05,   0.1,   0.25,   0.5,
					  1,      2.5,     5,      10};
const size_t metrics_latency_nbuckets = sizeof(metrics_latency_buckets) /
					sizeof(metrics_latency_buckets[0]);

struct metric {
	struct metric *next;
	struct metrics_family *fam;
	char **values;             /* fam->nlabels strings, owned */
	_Atomic uint64_t u;        /* counter value, or histogram count */
	_Atomic int64_t i;         /* gauge value */
	_Atomic uint64_t sum_bits; /* histogram sum as double bits */
	_Atomic uint64_t *buckets; /* histogram: per-bucket (not cumulative) */
	double (*fn)(void *ctx);
	void *ctx;
};

struct metrics_family {
	struct metrics_family *next;
	enum metric_type type;
	char *name, *help;
	char **labels;
	size_t nlabels;
	double *bounds;
	size_t nbounds;
	bool is_fn;
	struct metric *metrics, **tail;
};

struct metrics_registry {
	pthread_mutex_t lock;
	struct metrics_family *families, **tail;
};

struct metrics_registry *metrics_registry_new(void)
{
	struct metrics_registry *r = calloc(1, sizeof(*r));
	if (!r)
		return NULL;
	pthread_mutex_init(&r->lock, NULL);
	r->tail = &r->families;
	return r;
}

static void free_strv(char **v, size_t n)
{
	if (!v)
		return;
	for (size_t i = 0; i < n; i++)
		free(v[i]);
	free(v);
}

void metrics_registry_free(struct metrics_registry *r)
{
	if (!r)
		return;
	struct metrics_family *f = r->families;
	while (f) {
		struct metrics_family *fn = f->next;
		struct metric *m = f->metrics;
		while (m) {
			struct metric *mn = m->next;
			free_strv(m->values, f->nlabels);
			free((void *)m->buckets);
			free(m);
			m = mn;
		}
		free(f->name);
		free(f->help);
		free_strv(f->labels, f->nlabels);
		free(f->bounds);
		free(f);
		f = fn;
	}
	pthread_mutex_destroy(&r->lock);
	free(r);
}

static struct metrics_registry *global_reg;
static pthread_once_t global_once = PTHREAD_ONCE_INIT;

static void global_init(void)
{
	global_reg = metrics_registry_new();
}

struct metrics_registry *metrics_global(void)
{
	pthread_once(&global_once, global_init);
	return global_reg;
}

/* Split "a,b,c" into a vector. */
static char **split_labels(const char *labels, size_t *n)
{
	*n = 0;
	if (!labels || !*labels)
		return NULL;
	size_t cnt = 1;
	for (const char *p = labels; *p; p++)
		cnt += *p == ',';
	char **v = calloc(cnt, sizeof(*v));
	if (!v)
		return NULL;
	const char *p = labels;
	for (size_t i = 0; i < cnt; i++) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		v[i] = strndup(p, len);
		if (!v[i]) {
			free_strv(v, cnt);
			return NULL;
		}
		p += len + 1;
	}
	*n = cnt;
	return v;
}

static bool family_matches(const struct metrics_family *f, enum metric_type type,
			   const char *labels, const double *bounds, size_t nbounds,
			   bool is_fn)
{
	if (f->type != type || f->is_fn != is_fn || f->nbounds != nbounds)
		return false;
	for (size_t i = 0; i < nbounds; i++)
		if (f->bounds[i] != bounds[i])
			return false;
	size_t n;
	char **v = split_labels(labels, &n);
	bool ok = n == f->nlabels;
	for (size_t i = 0; ok && i < n; i++)
		ok = strcmp(v[i], f->labels[i]) == 0;
	free_strv(v, n);
	return ok;
}

/* Caller holds r->lock. */
static struct metrics_family *do_family(struct metrics_registry *r, enum metric_type type,
					const char *name, const char *help, const char *labels,
					const double *bounds, size_t nbounds, bool is_fn)
{
	for (struct metrics_family *f = r->families; f; f = f->next) {
		if (strcmp(f->name, name) != 0)
			continue;
		if (!family_matches(f, type, labels, bounds, nbounds, is_fn)) {
			log_error("metric %s registered twice with different "
				  "type, labels or buckets",
				  name);
			return NULL;
		}
		return f;
	}
	struct metrics_family *f = calloc(1, sizeof(*f));
	if (!f)
		return NULL;
	f->type = type;
	f->is_fn = is_fn;
	f->name = strdup(name);
	f->help = strdup(help ? help : "");
	f->labels = split_labels(labels, &f->nlabels);
	if (nbounds) {
		f->bounds = malloc(nbounds * sizeof(double));
		if (f->bounds)
			memcpy(f->bounds, bounds, nbounds * sizeof(double));
	}
	f->nbounds = nbounds;
	f->tail = &f->metrics;
	if (!f->name || !f->help || (labels && *labels && !f->labels) ||
	    (nbounds && !f->bounds)) {
		free(f->name);
		free(f->help);
		free_strv(f->labels, f->nlabels);
		free(f->bounds);
		free(f);
		return NULL;
	}
	*r->tail = f;
	r->tail = &f->next;
	return f;
}

static struct metric *get_metric(struct metrics_registry *r, enum metric_type type,
				 const char *name, const char *help, const char *labels,
				 const char *const *values, const double *bounds,
				 size_t nbounds, double (*fn)(void *), void *ctx)
{
	if (!r)
		return NULL;
	pthread_mutex_lock(&r->lock);
	struct metric *m = NULL;
	struct metrics_family *f = do_family(r, type, name, help, labels, bounds, nbounds,
					     fn != NULL);
	if (!f)
		goto out;
	for (m = f->metrics; m; m = m->next) {
		size_t i;
		for (i = 0; i < f->nlabels; i++)
			if (strcmp(m->values[i], values[i]) != 0)
				break;
		if (i == f->nlabels)
			goto out;
	}
	m = calloc(1, sizeof(*m));
	if (!m)
		goto out;
	m->fam = f;
	m->fn = fn;
	m->ctx = ctx;
	if (f->nlabels) {
		m->values = calloc(f->nlabels, sizeof(char *));
		bool ok = m->values != NULL;
		for (size_t i = 0; ok && i < f->nlabels; i++)
			ok = (m->values[i] = strdup(values[i])) != NULL;
		if (!ok)
			goto fail;
	}
	if (nbounds) {
		m->buckets = calloc(nbounds + 1, sizeof(uint64_t));
		if (!m->buckets)
			goto fail;
	}
	*f->tail = m;
	f->tail = &m->next;
	goto out;
fail:
	free_strv(m->values, f->nlabels);
	free(m);
	m = NULL;
out:
	pthread_mutex_unlock(&r->lock);
	return m;
}

struct metric *metrics_counter(struct metrics_registry *r, const char *name, const char *help,
			       const char *labels, const char *const *values)
{
	return get_metric(r, METRIC_COUNTER, name, help, labels, values, NULL, 0, NULL, NULL);
}

struct metric *metrics_gauge(struct metrics_registry *r, const char *name, const char *help,
			     const char *labels, const char *const *values)
{
	return get_metric(r, METRIC_GAUGE, name, help, labels, values, NULL, 0, NULL, NULL);
}

struct metric *metrics_histogram(struct metrics_registry *r, const char *name,
				 const char *help, const char *labels,
				 const char *const *values, const double *buckets,
				 size_t nbuckets)
{
	return get_metric(r, METRIC_HISTOGRAM, name, help, labels, values, buckets, nbuckets,
			  NULL, NULL);
}

struct metric *metrics_gauge_fn(struct metrics_registry *r, const char *name, const char *help,
				const char *labels, const char *const *values,
				double (*fn)(void *ctx), void *ctx)
{
	return get_metric(r, METRIC_GAUGE, name, help, labels, values, NULL, 0, fn, ctx);
}

struct metric *metrics_counter_fn(struct metrics_registry *r, const char *name,
				  const char *help, const char *labels,
				  const char *const *values, double (*fn)(void *ctx),
				  void *ctx)
{
	return get_metric(r, METRIC_COUNTER, name, help, labels, values, NULL, 0, fn, ctx);
}

/* ------------------------------------------------------------ process */

static double p_cpu_seconds(void *ctx)
{
	(void)ctx;
	struct rusage ru;
	if (getrusage(RUSAGE_SELF, &ru) != 0)
		return 0;
	return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
	       (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

/* Field i (0: size, 1: resident) of /proc/self/statm, in bytes. */
static double statm_bytes(int i)
{
	FILE *f = fopen("/proc/self/statm", "re");
	unsigned long v[2] = {0, 0};
	if (!f)
		return 0;
	if (fscanf(f, "%lu %lu", &v[0], &v[1]) != 2)
		v[0] = v[1] = 0;
	fclose(f);
	long ps = sysconf(_SC_PAGESIZE);
	return (double)v[i] * (double)(ps > 0 ? ps : 4096);
}

static double p_rss(void *ctx)
{
	(void)ctx;
	return statm_bytes(1);
}

static double p_vsize(void *ctx)
{
	(void)ctx;
	return statm_bytes(0);
}

static double p_open_fds(void *ctx)
{
	(void)ctx;
	DIR *dir = opendir("/proc/self/fd");
	double n = 0;
	if (!dir)
		return 0;
	for (struct dirent *e; (e = readdir(dir));)
		n += e->d_name[0] != '.';
	closedir(dir);
	return n - 1; /* the directory's own descriptor */
}

static double p_max_fds(void *ctx)
{
	(void)ctx;
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
		return 0;
	return rl.rlim_cur == RLIM_INFINITY ? INFINITY : (double)rl.rlim_cur;
}

static double p_start_time(void *ctx)
{
	return *(const double *)ctx;
}

int metrics_register_process(struct metrics_registry *r, const double *start_time_s)
{
	bool ok = metrics_counter_fn(r, "process_cpu_seconds_total",
				     "Total user and system CPU time spent in seconds.", NULL,
				     NULL, p_cpu_seconds, NULL) != NULL;
	ok &= metrics_gauge_fn(r, "process_resident_memory_bytes",
			       "Resident memory size in bytes.", NULL, NULL, p_rss,
			       NULL) != NULL;
	ok &= metrics_gauge_fn(r, "process_virtual_memory_bytes",
			       "Virtual memory size in bytes.", NULL, NULL, p_vsize,
			       NULL) != NULL;
	ok &= metrics_gauge_fn(r, "process_open_fds", "Number of open file descriptors.", NULL,
			       NULL, p_open_fds, NULL) != NULL;
	ok &= metrics_gauge_fn(r, "process_max_fds",
			       "Maximum number of open file descriptors.", NULL, NULL,
			       p_max_fds, NULL) != NULL;
	ok &= metrics_gauge_fn(r, "process_start_time_seconds",
			       "Start time of the process since unix epoch in seconds.", NULL,
			       NULL, p_start_time, (void *)start_time_s) != NULL;
	return ok ? 0 : -ENOMEM;
}

void metric_inc(struct metric *m)
{
	metric_add(m, 1);
}

void metric_add(struct metric *m, uint64_t n)
{
	if (!m)
		return;
	if (m->fam->type == METRIC_GAUGE)
		atomic_fetch_add_explicit(&m->i, (int64_t)n, memory_order_relaxed);
	else
		atomic_fetch_add_explicit(&m->u, n, memory_order_relaxed);
}

void metric_sub(struct metric *m, uint64_t n)
{
	if (m)
		atomic_fetch_sub_explicit(&m->i, (int64_t)n, memory_order_relaxed);
}

void metric_set(struct metric *m, int64_t v)
{
	if (m)
		atomic_store_explicit(&m->i, v, memory_order_relaxed);
}

static double bits_to_double(uint64_t b)
{
	double d;
	memcpy(&d, &b, sizeof(d));
	return d;
}

static uint64_t double_to_bits(double d)
{
	uint64_t b;
	memcpy(&b, &d, sizeof(b));
	return b;
}

void metric_observe(struct metric *m, double v)
{
	if (!m || !m->buckets)
		return;
	const struct metrics_family *f = m->fam;
	size_t i = 0;
	while (i < f->nbounds && v > f->bounds[i])
		i++;
	atomic_fetch_add_explicit(&m->buckets[i], 1, memory_order_relaxed);
	uint64_t old = atomic_load_explicit(&m->sum_bits, memory_order_relaxed);
	while (!atomic_compare_exchange_weak_explicit(
		&m->sum_bits, &old, double_to_bits(bits_to_double(old) + v),
		memory_order_relaxed, memory_order_relaxed))
		;
	atomic_fetch_add_explicit(&m->u, 1, memory_order_relaxed);
}

double metric_value(const struct metric *m)
{
	if (!m)
		return 0;
	if (m->fn)
		return m->fn(m->ctx);
	if (m->fam->type == METRIC_GAUGE)
		return (double)atomic_load_explicit(&m->i, memory_order_relaxed);
	return (double)atomic_load_explicit(&m->u, memory_order_relaxed);
}

/* ------------------------------------------------------------ format */

static int put_escaped(struct mc_buf *out, const char *s, bool is_help)
{
	int rc = 0;
	for (; *s && rc == 0; s++) {
		if (*s == '\\')
			rc = mc_buf_append(out, "\\\\", 2);
		else if (*s == '\n')
			rc = mc_buf_append(out, "\\n", 2);
		else if (*s == '"' && !is_help)
			rc = mc_buf_append(out, "\\\"", 2);
		else
			rc = mc_buf_append(out, s, 1);
	}
	return rc;
}

static int put_double(struct mc_buf *out, double v)
{
	if (isnan(v))
		return mc_buf_printf(out, "NaN");
	if (isinf(v))
		return mc_buf_printf(out, v > 0 ? "+Inf" : "-Inf");
	if (v == (double)(int64_t)v && fabs(v) < 9e15)
		return mc_buf_printf(out, "%lld", (long long)(int64_t)v);
	/* The shortest of %.15g and %.17g that reads back as v: 0.1, not
	 * 0.10000000000000001. */
	char tmp[40];
	snprintf(tmp, sizeof(tmp), "%.15g", v);
	if (strtod(tmp, NULL) == v)
		return mc_buf_printf(out, "%s", tmp);
	return mc_buf_printf(out, "%.17g", v);
}

/* name{l1="v1",l2="v2"[,le="x"]} */
static int put_series(struct mc_buf *out, const struct metric *m, const char *suffix,
		      const char *le)
{
	const struct metrics_family *f = m->fam;
	int rc = mc_buf_printf(out, "%s%s", f->name, suffix);
	if (rc || (f->nlabels == 0 && !le))
		return rc ? rc : mc_buf_append(out, " ", 1);
	rc = mc_buf_append(out, "{", 1);
	for (size_t i = 0; rc == 0 && i < f->nlabels; i++) {
		rc = mc_buf_printf(out, "%s%s=\"", i ? "," : "", f->labels[i]);
		if (!rc)
			rc = put_escaped(out, m->values[i], false);
		if (!rc)
			rc = mc_buf_append(out, "\"", 1);
	}
	if (rc == 0 && le)
		rc = mc_buf_printf(out, "%sle=\"%s\"", f->nlabels ? "," : "", le);
	if (rc == 0)
		rc = mc_buf_append(out, "} ", 2);
	return rc;
}

static int format_metric(struct mc_buf *out, const struct metric *m)
{
	const struct metrics_family *f = m->fam;
	int rc;
	if (f->type != METRIC_HISTOGRAM) {
		rc = put_series(out, m, "", NULL);
		if (!rc)
			rc = put_double(out, metric_value(m));
		return rc ? rc : mc_buf_append(out, "\n", 1);
	}
	uint64_t cum = 0;
	for (size_t i = 0; i <= f->nbounds; i++) {
		char le[40];
		cum += atomic_load_explicit(&m->buckets[i], memory_order_relaxed);
		if (i < f->nbounds) {
			struct mc_buf tmp = MC_BUF_INIT;
			rc = put_double(&tmp, f->bounds[i]);
			snprintf(le, sizeof(le), "%s", rc ? "?" : tmp.data);
			mc_buf_free(&tmp);
		} else {
			snprintf(le, sizeof(le), "+Inf");
		}
		rc = put_series(out, m, "_bucket", le);
		if (!rc)
			rc = mc_buf_printf(out, "%llu\n", (unsigned long long)cum);
		if (rc)
			return rc;
	}
	rc = put_series(out, m, "_sum", NULL);
	if (!rc)
		rc = put_double(out, bits_to_double(atomic_load_explicit(
					     &m->sum_bits, memory_order_relaxed)));
	if (!rc)
		rc = mc_buf_append(out, "\n", 1);
	if (!rc)
		rc = put_series(out, m, "_count", NULL);
	/* _count equals the +Inf bucket by construction of this scrape. */
	if (!rc)
		rc = mc_buf_printf(out, "%llu\n", (unsigned long long)cum);
	return rc;
}

int metrics_format(struct metrics_registry *r, struct mc_buf *out)
{
	static const char *const tnames[] = {"counter", "gauge", "histogram"};
	int rc = 0;
	pthread_mutex_lock(&r->lock);
	for (struct metrics_family *f = r->families; f && rc == 0; f = f->next) {
		if (!f->metrics)
			continue;
		rc = mc_buf_printf(out, "# HELP %s ", f->name);
		if (!rc)
			rc = put_escaped(out, f->help, true);
		if (!rc)
			rc = mc_buf_printf(out, "\n# TYPE %s %s\n", f->name, tnames[f->type]);
		for (struct metric *m = f->metrics; m && rc == 0; m = m->next)
			rc = format_metric(out, m);
	}
	pthread_mutex_unlock(&r->lock);
	return rc;
}
