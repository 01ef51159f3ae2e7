/*
 * Mirror test of src/common/metrics.c: registration and the Prometheus
 * text format (checked byte for byte; promtool checks the daemon's output
 * in the integration tests).
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <pthread.h>
#include <string.h>

#include "common/metrics.h"

Test(metrics, counter_gauge_histogram_format)
{
	struct metrics_registry *r = metrics_registry_new();
	struct metric *c = metrics_counter(r, "t_calls_total", "Calls.", "method,code",
					   (const char *[]){"/a.B/C", "OK"});
	struct metric *c2 = metrics_counter(r, "t_calls_total", "Calls.", "method,code",
					    (const char *[]){"/a.B/C", "OK"});
	cr_assert_eq(c, c2, "same labels, same metric");
	metric_add(c, 41);
	metric_inc(c);
	struct metric *g = metrics_gauge(r, "t_conns", "Open \"conns\"\\now.", NULL, NULL);
	metric_set(g, 3);
	metric_sub(g, 5);
	double b[] = {0.1, 1};
	struct metric *h = metrics_histogram(r, "t_lat_seconds", "Latency.", "m",
					     (const char *[]){"x\"y\n"}, b, 2);
	metric_observe(h, 0.05);
	metric_observe(h, 0.1);
	metric_observe(h, 0.5);
	metric_observe(h, 7);
	struct mc_buf out = MC_BUF_INIT;
	cr_assert_eq(metrics_format(r, &out), 0);
	const char *want = "# HELP t_calls_total Calls.\n"
			   "# TYPE t_calls_total counter\n"
			   "t_calls_total{method=\"/a.B/C\",code=\"OK\"} 42\n"
			   "# HELP t_conns Open \"conns\"\\\\now.\n"
			   "# TYPE t_conns gauge\n"
			   "t_conns -2\n"
			   "# HELP t_lat_seconds Latency.\n"
			   "# TYPE t_lat_seconds histogram\n"
			   "t_lat_seconds_bucket{m=\"x\\\"y\\n\",le=\"0.1\"} 2\n"
			   "t_lat_seconds_bucket{m=\"x\\\"y\\n\",le=\"1\"} 3\n"
			   "t_lat_seconds_bucket{m=\"x\\\"y\\n\",le=\"+Inf\"} 4\n"
			   "t_lat_seconds_sum{m=\"x\\\"y\\n\"} 7.65\n"
			   "t_lat_seconds_count{m=\"x\\\"y\\n\"} 4\n";
	cr_assert_str_eq(out.data, want);
	cr_assert_eq(metric_value(h), 4);
	mc_buf_free(&out);
	metrics_registry_free(r);
}

Test(metrics, conflicting_registration_is_refused)
{
	struct metrics_registry *r = metrics_registry_new();
	cr_assert_not_null(metrics_counter(r, "t_x", "X.", NULL, NULL));
	cr_assert_null(metrics_gauge(r, "t_x", "X.", NULL, NULL));
	cr_assert_null(metrics_counter(r, "t_x", "X.", "a", (const char *[]){"1"}));
	metric_inc(NULL); /* a failed registration never crashes updates */
	metric_observe(NULL, 1);
	metrics_registry_free(r);
}

static double seven(void *ctx)
{
	return *(double *)ctx;
}

Test(metrics, gauge_fn_and_empty_family)
{
	struct metrics_registry *r = metrics_registry_new();
	double v = 7.25;
	metrics_gauge_fn(r, "t_fn", "Fn.", NULL, NULL, seven, &v);
	struct mc_buf out = MC_BUF_INIT;
	cr_assert_eq(metrics_format(r, &out), 0);
	cr_assert(strstr(out.data, "t_fn 7.25\n") != NULL, "%s", out.data);
	mc_buf_free(&out);
	metrics_registry_free(r);
}

static struct metric *shared;

static void *bump(void *arg)
{
	(void)arg;
	for (int i = 0; i < 100000; i++) {
		metric_inc(shared);
	}
	return NULL;
}

Test(metrics, concurrent_updates_are_not_lost)
{
	struct metrics_registry *r = metrics_registry_new();
	shared = metrics_counter(r, "t_n", "N.", NULL, NULL);
	pthread_t t[4];
	for (int i = 0; i < 4; i++)
		pthread_create(&t[i], NULL, bump, NULL);
	for (int i = 0; i < 4; i++)
		pthread_join(t[i], NULL);
	cr_assert_eq(metric_value(shared), 400000);
	metrics_registry_free(r);
}

Test(metrics, process_metrics_of_every_role)
{
	struct metrics_registry *r = metrics_registry_new();
	static const double start = 1796420100.5;
	cr_assert_eq(metrics_register_process(r, &start), 0);
	struct mc_buf out = MC_BUF_INIT;
	cr_assert_eq(metrics_format(r, &out), 0);
	const char *want[] = {
		"# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total ",
		"# TYPE process_resident_memory_bytes gauge\n",
		"# TYPE process_virtual_memory_bytes gauge\n",
		"# TYPE process_open_fds gauge\n",
		"# TYPE process_max_fds gauge\n",
		"process_start_time_seconds 1796420100.5\n"};
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
		cr_assert(strstr(out.data, want[i]), "%s missing in:\n%s", want[i], out.data);
	const char *fds = strstr(out.data, "\nprocess_open_fds ");
	cr_assert(fds && atof(fds + 18) >= 3, "stdin, stdout and stderr at least");
	const char *max = strstr(out.data, "\nprocess_max_fds ");
	cr_assert(max && atof(max + 17) >= atof(fds + 18));
	mc_buf_free(&out);
	metrics_registry_free(r);
}
