/*
 * ctl_health: `mooncakectl health` — ask a gRPC server (ours or any
 * other) for its grpc.health.v1 status.
 *
 * Without --watch: one Check call within --timeout; prints SERVING,
 * NOT_SERVING, UNKNOWN or SERVICE_UNKNOWN (the server answered NOT_FOUND)
 * and exits 0 only for SERVING. With --watch: a Watch stream; every
 * status the server sends is printed on its own line as it arrives, until
 * SIGINT/SIGTERM or the end of the stream; the exit status follows the
 * last status seen. --timeout then bounds the wait for the first one.
 * With --wait=DURATION: Check again (on a new connection each time, every
 * 100 ms) until the answer is SERVING or the duration has passed — for
 * scripts that start a daemon and go on once it serves.
 */
#include <signal.h>
#include <time.h>
#include <stdio.h>
#include <string.h>
#include <uv.h>

#include "common/cfg.h"
#include "common/util.h"
#include "ctl/ctl_int.h"
#include "health.pb-c.h"
#include "rpc/rpc.h"

static const char *health_name(int s)
{
	switch (s) {
	case RPC_HEALTH_SERVING:
		return "SERVING";
	case RPC_HEALTH_NOT_SERVING:
		return "NOT_SERVING";
	case RPC_HEALTH_SERVICE_UNKNOWN:
		return "SERVICE_UNKNOWN";
	default:
		return "UNKNOWN";
	}
}

static void health_usage(FILE *f)
{
	fprintf(f,
		"usage: mooncakectl health --endpoint=HOST:PORT [--service=NAME] [--watch]\n"
		"                          [--timeout=5s] [--wait=DURATION]\n\n"
		"  --endpoint=HOST:PORT  the server (numeric host; http:// prefix allowed)\n"
		"  --service=NAME        service to ask about (default \"\": the server)\n"
		"  --watch               stream status changes until interrupted\n"
		"  --timeout=DURATION    deadline of the check, or of the first watch update\n"
		"  --wait=DURATION       check again until SERVING, for up to DURATION (a\n"
		"                        daemon that is still starting)\n\n"
		"Prints SERVING, NOT_SERVING, UNKNOWN or SERVICE_UNKNOWN. Exit status 0 when\n"
		"SERVING, 1 otherwise (including an unreachable server), 2 on a usage error.\n");
}

struct watch {
	uv_loop_t *loop;
	struct rpc_stream *st;
	uv_signal_t sigint, sigterm;
	uv_timer_t first;
	const char *endpoint;
	uint64_t timeout_ms;
	int last;
	bool got_any, done, failed;
};

static void watch_stop(struct watch *w)
{
	w->done = true;
	uv_signal_stop(&w->sigint);
	uv_signal_stop(&w->sigterm);
	uv_timer_stop(&w->first);
}

static void on_watch_message(struct rpc_stream *st, void *ud, const ProtobufCMessage *msg)
{
	struct watch *w = ud;
	const Grpc__Health__V1__HealthCheckResponse *r = (const void *)msg;
	w->last = r->status;
	w->got_any = true;
	uv_timer_stop(&w->first);
	printf("%s\n", health_name(r->status));
	fflush(stdout);
}

static void on_watch_close(struct rpc_stream *st, void *ud, int status, const char *message)
{
	struct watch *w = ud;
	w->st = NULL;
	if (status != RPC_OK) {
		fprintf(stderr, "mooncakectl health: %s: watch ended: %s%s%s\n", w->endpoint,
			rpc_status_name(status), message && *message ? ": " : "",
			message ? message : "");
		if (!w->got_any)
			w->failed = true;
	}
	watch_stop(w);
}

static const struct rpc_stream_cbs watch_cbs = {
	.on_message = on_watch_message,
	.on_close = on_watch_close,
};

static void on_signal(uv_signal_t *h, int signum)
{
	struct watch *w = h->data;
	if (w->st)
		rpc_stream_cancel(w->st);
	w->st = NULL;
	watch_stop(w);
}

static void on_first_timeout(uv_timer_t *t)
{
	struct watch *w = t->data;
	fprintf(stderr, "mooncakectl health: %s: no status within the timeout (%llu ms)\n",
		w->endpoint, (unsigned long long)w->timeout_ms);
	if (w->st)
		rpc_stream_cancel(w->st);
	w->st = NULL;
	w->failed = true;
	watch_stop(w);
}

static int do_watch(uv_loop_t *loop, struct rpc_client *c, const char *endpoint,
		    const char *service, uint64_t timeout_ms)
{
	struct watch w = {.loop = loop,
			  .endpoint = endpoint,
			  .timeout_ms = timeout_ms,
			  .last = RPC_HEALTH_UNKNOWN};
	Grpc__Health__V1__HealthCheckRequest req =
		GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
	req.service = (char *)service;

	uv_signal_init(loop, &w.sigint);
	uv_signal_init(loop, &w.sigterm);
	uv_timer_init(loop, &w.first);
	w.sigint.data = w.sigterm.data = w.first.data = &w;
	uv_signal_start(&w.sigint, on_signal, SIGINT);
	uv_signal_start(&w.sigterm, on_signal, SIGTERM);
	if (timeout_ms)
		uv_timer_start(&w.first, on_first_timeout, timeout_ms, 0);

	int rc = rpc_client_stream(c, "/grpc.health.v1.Health/Watch",
				   &grpc__health__v1__health_check_response__descriptor, 0,
				   &watch_cbs, &w, &w.st);
	if (rc == 0)
		rc = rpc_stream_send(w.st, &req.base);
	if (rc == 0)
		rc = rpc_stream_close_send(w.st);
	if (rc) {
		fprintf(stderr, "mooncakectl health: %s: %s\n", endpoint, mc_strerror(rc));
		if (w.st)
			rpc_stream_cancel(w.st);
		w.failed = true;
		watch_stop(&w);
	}
	while (!w.done)
		uv_run(loop, UV_RUN_ONCE);
	uv_close((uv_handle_t *)&w.sigint, NULL);
	uv_close((uv_handle_t *)&w.sigterm, NULL);
	uv_close((uv_handle_t *)&w.first, NULL);
	if (w.failed)
		return CTL_EXIT_FAIL;
	return w.last == RPC_HEALTH_SERVING ? CTL_EXIT_OK : CTL_EXIT_FAIL;
}

static int do_check(struct rpc_client *c, const char *endpoint, const char *service,
		    uint64_t timeout_ms)
{
	Grpc__Health__V1__HealthCheckRequest req =
		GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
	ProtobufCMessage *resp = NULL;
	char err[256];
	req.service = (char *)service;
	int st = rpc_client_unary_sync(c, "/grpc.health.v1.Health/Check", &req.base,
				       &grpc__health__v1__health_check_response__descriptor,
				       timeout_ms, &resp, err, sizeof(err));
	if (st == RPC_OK) {
		int s = ((Grpc__Health__V1__HealthCheckResponse *)resp)->status;
		protobuf_c_message_free_unpacked(resp, NULL);
		printf("%s\n", health_name(s));
		return s == RPC_HEALTH_SERVING ? CTL_EXIT_OK : CTL_EXIT_FAIL;
	}
	if (st == RPC_NOT_FOUND) {
		printf("SERVICE_UNKNOWN\n");
		fprintf(stderr,
			"mooncakectl health: %s: service \"%s\" is unknown to the server\n",
			endpoint, service);
		return CTL_EXIT_FAIL;
	}
	fprintf(stderr, "mooncakectl health: %s: %s%s%s\n", endpoint, rpc_status_name(st),
		*err ? ": " : "", err);
	return CTL_EXIT_FAIL;
}

/* --wait: Check on a new connection every 100 ms until SERVING or the
 * deadline. Prints the last answer. */
static int do_wait(const char *endpoint, const char *service, uint64_t timeout_ms,
		   uint64_t wait_ms)
{
	uint64_t deadline = mc_now_ms() + wait_ms;
	int s = -1, st = RPC_UNAVAILABLE;
	char err[256] = "";
	for (;;) {
		uv_loop_t loop;
		struct rpc_client *c;
		uint64_t left = deadline > mc_now_ms() ? deadline - mc_now_ms() : 1;
		uint64_t t = MC_MIN(timeout_ms ? timeout_ms : 1000, MC_MAX(left, 100));
		struct rpc_client_opts o = {.connect_timeout_ms = t, .backoff_initial_ms = t};
		if (uv_loop_init(&loop))
			return CTL_EXIT_FAIL;
		if (rpc_client_new(&loop, endpoint, &o, &c)) {
			(void)uv_loop_close(&loop);
			fprintf(stderr,
				"mooncakectl health: bad --endpoint \"%s\" (want a numeric "
				"HOST:PORT)\n",
				endpoint);
			return CTL_EXIT_USAGE;
		}
		Grpc__Health__V1__HealthCheckRequest req =
			GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
		ProtobufCMessage *resp = NULL;
		req.service = (char *)service;
		st = rpc_client_unary_sync(
			c, "/grpc.health.v1.Health/Check", &req.base,
			&grpc__health__v1__health_check_response__descriptor, t, &resp, err,
			sizeof(err));
		if (st == RPC_OK) {
			s = ((Grpc__Health__V1__HealthCheckResponse *)resp)->status;
			protobuf_c_message_free_unpacked(resp, NULL);
		}
		rpc_client_free(c);
		uv_run(&loop, UV_RUN_DEFAULT);
		(void)uv_loop_close(&loop);
		if (s == RPC_HEALTH_SERVING || mc_now_ms() >= deadline)
			break;
		struct timespec ts = {0, 100 * 1000000L};
		nanosleep(&ts, NULL);
	}
	if (st == RPC_OK) {
		printf("%s\n", health_name(s));
		return s == RPC_HEALTH_SERVING ? CTL_EXIT_OK : CTL_EXIT_FAIL;
	}
	fprintf(stderr, "mooncakectl health: %s: %s%s%s (waited %llu ms)\n", endpoint,
		rpc_status_name(st), *err ? ": " : "", err, (unsigned long long)wait_ms);
	return CTL_EXIT_FAIL;
}

int ctl_health_main(int argc, char **argv)
{
	const char *endpoint = NULL, *service = "", *timeout_s = "5s", *wait_s = NULL, *v;
	bool watch = false, ok;
	uint64_t timeout_ms;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			health_usage(stdout);
			return CTL_EXIT_OK;
		} else if (ctl_flag_value(argc, argv, &i, "endpoint", &v)) {
			endpoint = v;
		} else if (ctl_flag_value(argc, argv, &i, "service", &v)) {
			service = v ? v : "";
		} else if (ctl_flag_value(argc, argv, &i, "timeout", &v)) {
			timeout_s = v;
		} else if (ctl_flag_value(argc, argv, &i, "wait", &v)) {
			if (!v)
				goto usage_err;
			wait_s = v;
		} else if (ctl_flag_bool(argv[i], "watch", &watch, &ok)) {
			if (!ok) {
				fprintf(stderr, "mooncakectl health: bad value in %s\n",
					argv[i]);
				return CTL_EXIT_USAGE;
			}
		} else {
			fprintf(stderr, "mooncakectl health: unknown argument \"%s\"\n",
				argv[i]);
			health_usage(stderr);
			return CTL_EXIT_USAGE;
		}
	}
	uint64_t wait_ms = 0;
	if (wait_s && (cfg_parse_duration_ms(wait_s, &wait_ms) != 0 || watch)) {
	usage_err:
		fprintf(stderr, "mooncakectl health: --wait wants a duration such as 10s, and "
				"not --watch\n");
		return CTL_EXIT_USAGE;
	}
	if (!endpoint || !*endpoint) {
		fprintf(stderr, "mooncakectl health: --endpoint=HOST:PORT is required\n");
		health_usage(stderr);
		return CTL_EXIT_USAGE;
	}
	if (!timeout_s || cfg_parse_duration_ms(timeout_s, &timeout_ms)) {
		fprintf(stderr,
			"mooncakectl health: bad --timeout \"%s\" (want e.g. 500ms, 5s)\n",
			timeout_s ? timeout_s : "");
		return CTL_EXIT_USAGE;
	}

	if (wait_s)
		return do_wait(endpoint, service, timeout_ms, wait_ms);

	uv_loop_t loop;
	struct rpc_client *c;
	struct rpc_client_opts copts = {.connect_timeout_ms = timeout_ms ? timeout_ms : 0};
	if (uv_loop_init(&loop)) {
		fprintf(stderr, "mooncakectl health: cannot create an event loop\n");
		return CTL_EXIT_FAIL;
	}
	if (rpc_client_new(&loop, endpoint, &copts, &c)) {
		fprintf(stderr,
			"mooncakectl health: bad --endpoint \"%s\" (want a numeric "
			"HOST:PORT)\n",
			endpoint);
		uv_loop_close(&loop);
		return CTL_EXIT_USAGE;
	}
	int rc = watch ? do_watch(&loop, c, endpoint, service, timeout_ms)
		       : do_check(c, endpoint, service, timeout_ms);
	rpc_client_free(c);
	uv_run(&loop, UV_RUN_DEFAULT);
	uv_loop_close(&loop);
	return rc;
}
