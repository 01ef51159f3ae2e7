/*
 * ctl_bench_meta: `mooncakectl bench meta` — puts/s, linearizable gets/s
 * and their latency percentiles against any etcd v3 endpoint list: a
 * mooncaked meta cluster or a real etcd 3.4, unchanged (the etcd API over
 * our gRPC client).
 *
 *   mooncakectl bench meta --endpoints=URL,... [--clients=64] [--conns=8]
 *       [--key-size=8] [--val-size=256] [--total=20000] [--fsync-dir=DIR]
 *       [--rate=OPS] [--latency-log=FILE]
 *
 * --conns connections are spread round-robin over the endpoints and
 * --clients requests are kept in flight, spread over the connections, as
 * etcd's own benchmark tool does. Phase one puts --total distinct keys,
 * phase two reads them back with linearizable Range calls and checks that
 * every put that was acknowledged is there (a lost write is counted and
 * fails the run; a put that failed may or may not have been applied). With
 * --fsync-dir the run also measures the disk's fdatasync rate there (the
 * limit of a member that syncs once per write, which group commit beats).
 * --rate caps the requests started per second (an open load whose latency
 * shows stalls, where a closed one would slow down with them), and
 * --latency-log writes one line per put, "END_UNIX_MS LATENCY_US OK", for
 * scripts that set latencies beside what the server did meanwhile
 * (bench_meta_perf.sh: the p99 while a snapshot is written).
 * The last line is "RESULT key=value ..." for scripts (make bench compares
 * mooncaked with etcd from it). Nothing is asserted.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>
#include <uv.h>

#include "common/cfg.h"
#include "common/metrics.h"
#include "common/util.h"
#include "ctl/ctl_int.h"
#include "etcd_rpc.pb-c.h"
#include "rpc/rpc.h"

#define CALL_TIMEOUT_MS 30000
#define MAX_KEY_BYTES 1024
#define MAX_VAL_BYTES (1u << 20)

struct bm;

struct bclient {
	struct bm *b;
	size_t conn;
	uint64_t t0;
	uint64_t i; /* the key in flight */
	uint8_t key[MAX_KEY_BYTES];
};

struct bm {
	uv_loop_t loop;
	struct rpc_client **cli;
	size_t ncli;
	struct bclient *clients;
	size_t nclients;
	size_t key_size, val_size;
	uint8_t *val;
	uint64_t total, issued, done, failed;
	bool get_phase;
	uint8_t *acked; /* per key: the put was acknowledged */
	uint64_t lost, unacked_applied;
	uint64_t rate; /* requests started per second; 0: no cap */
	uint64_t phase_t0;
	uv_timer_t pace;
	struct bclient **idle; /* clients waiting for the pace */
	size_t nidle;
	FILE *latlog;
	uint64_t *lat_ns;
	char first_err[256];
};

/* Key i: zero-padded decimal, key_size bytes (the last digits kept). */
static void key_of(uint8_t *out, size_t size, uint64_t i)
{
	char tmp[32];
	int n = snprintf(tmp, sizeof(tmp), "%020llu", (unsigned long long)i);
	memset(out, '0', size);
	for (size_t k = 0; k < size && k < (size_t)n; k++)
		out[size - 1 - k] = (uint8_t)tmp[n - 1 - k];
}

static void issue(struct bclient *c);

/* The keys of a run lie in [first, end): first is key 0, end just past
 * the last key (all nines when --total needs more digits than the keys
 * have, and the keys wrap). Both key_size bytes; end gets a NUL after. */
static void run_range(size_t key_size, uint64_t total, uint8_t *first, uint8_t *end)
{
	key_of(first, key_size, 0);
	char tmp[32];
	int digits = snprintf(tmp, sizeof(tmp), "%llu", (unsigned long long)(total - 1));
	if ((size_t)digits > key_size)
		memset(end, '9', key_size);
	else
		key_of(end, key_size, total - 1);
	end[key_size] = 0;
}

/* A Range (count_only) or DeleteRange over [first, end + NUL) on c:
 * *n gets the count or the number deleted. 0, or -1 after printing why. */
static int range_call(struct rpc_client *c, bool del, const uint8_t *first, const uint8_t *end,
		      size_t key_size, uint64_t *n)
{
	ProtobufCMessage *resp = NULL;
	char err[256];
	int st;
	if (del) {
		Etcdserverpb__DeleteRangeRequest q = ETCDSERVERPB__DELETE_RANGE_REQUEST__INIT;
		q.key = (ProtobufCBinaryData){key_size, (uint8_t *)first};
		q.range_end = (ProtobufCBinaryData){key_size + 1, (uint8_t *)end};
		st = rpc_client_unary_sync(c, "/etcdserverpb.KV/DeleteRange", &q.base,
					   &etcdserverpb__delete_range_response__descriptor,
					   CALL_TIMEOUT_MS, &resp, err, sizeof(err));
		if (st == RPC_OK)
			*n = (uint64_t)((Etcdserverpb__DeleteRangeResponse *)resp)->deleted;
	} else {
		Etcdserverpb__RangeRequest q = ETCDSERVERPB__RANGE_REQUEST__INIT;
		q.key = (ProtobufCBinaryData){key_size, (uint8_t *)first};
		q.range_end = (ProtobufCBinaryData){key_size + 1, (uint8_t *)end};
		q.count_only = 1;
		st = rpc_client_unary_sync(c, "/etcdserverpb.KV/Range", &q.base,
					   &etcdserverpb__range_response__descriptor,
					   CALL_TIMEOUT_MS, &resp, err, sizeof(err));
		if (st == RPC_OK)
			*n = (uint64_t)((Etcdserverpb__RangeResponse *)resp)->count;
	}
	if (resp)
		protobuf_c_message_free_unpacked(resp, NULL);
	if (st == RPC_OK)
		return 0;
	fprintf(stderr, "mooncakectl bench meta: %s of the run's keys ['%.*s', '%.*s']: %s\n",
		del ? "DeleteRange" : "Range", (int)key_size, (const char *)first,
		(int)key_size, (const char *)end, err);
	return -1;
}

static void on_done(void *ud, int status, const char *message, const ProtobufCMessage *resp)
{
	struct bclient *c = ud;
	struct bm *b = c->b;

	b->lat_ns[b->done] = mc_now_ns() - c->t0;
	if (b->latlog && !b->get_phase) {
		struct timeval tv;
		gettimeofday(&tv, NULL);
		fprintf(b->latlog, "%.3f %llu %d\n",
			(double)tv.tv_sec * 1e3 + tv.tv_usec / 1e3,
			(unsigned long long)(b->lat_ns[b->done] / 1000), status == RPC_OK);
	}
	if (status == RPC_OK && !b->get_phase) {
		b->acked[c->i] = 1;
	} else if (status == RPC_OK) {
		bool found = ((const Etcdserverpb__RangeResponse *)resp)->n_kvs > 0;
		if (b->acked[c->i] && !found)
			b->lost++;
		if (!b->acked[c->i] && found)
			b->unacked_applied++;
	}
	b->done++;
	if (status != RPC_OK) {
		if (!b->failed)
			snprintf(b->first_err, sizeof(b->first_err), "%s: %s",
				 rpc_status_name(status), message ? message : "");
		b->failed++;
	}
	if (b->done == b->total)
		uv_stop(&b->loop);
	else
		issue(c);
}

static void issue(struct bclient *c)
{
	struct bm *b = c->b;
	int rc;

	if (b->issued >= b->total)
		return;
	if (b->rate &&
	    b->issued >= (mc_now_ns() - b->phase_t0) * b->rate / 1000000000ull + 1) {
		b->idle[b->nidle++] = c; /* started by on_pace when its turn comes */
		return;
	}
	uint64_t i = b->issued++;
	c->i = i;
	key_of(c->key, b->key_size, i);
	c->t0 = mc_now_ns();
	if (b->get_phase) {
		Etcdserverpb__RangeRequest q = ETCDSERVERPB__RANGE_REQUEST__INIT;
		q.key.data = c->key;
		q.key.len = b->key_size;
		rc = rpc_client_unary(b->cli[c->conn], "/etcdserverpb.KV/Range", &q.base,
				      &etcdserverpb__range_response__descriptor,
				      CALL_TIMEOUT_MS, on_done, c, NULL);
	} else {
		Etcdserverpb__PutRequest q = ETCDSERVERPB__PUT_REQUEST__INIT;
		q.key.data = c->key;
		q.key.len = b->key_size;
		q.value.data = b->val;
		q.value.len = b->val_size;
		rc = rpc_client_unary(b->cli[c->conn], "/etcdserverpb.KV/Put", &q.base,
				      &etcdserverpb__put_response__descriptor, CALL_TIMEOUT_MS,
				      on_done, c, NULL);
	}
	if (rc)
		on_done(c, RPC_INTERNAL, mc_strerror(rc), NULL);
}

static void on_pace(uv_timer_t *t)
{
	struct bm *b = MC_CONTAINER_OF(t, struct bm, pace);
	uint64_t allowed = (mc_now_ns() - b->phase_t0) * b->rate / 1000000000ull + 1;
	while (b->nidle && b->issued < allowed && b->issued < b->total)
		issue(b->idle[--b->nidle]);
}

static int cmp_u64(const void *x, const void *y)
{
	uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
	return a < b ? -1 : a > b;
}

struct phase_result {
	double ops_per_s, p50_ms, p99_ms;
	uint64_t failed;
};

static void run_phase(struct bm *b, bool gets, struct phase_result *r)
{
	b->get_phase = gets;
	b->issued = b->done = b->failed = 0;
	b->first_err[0] = '\0';
	b->nidle = 0;
	uint64_t t0 = mc_now_ns();
	b->phase_t0 = t0;
	if (b->rate)
		uv_timer_start(&b->pace, on_pace, 1, 1);
	for (size_t i = 0; i < b->nclients; i++)
		issue(&b->clients[i]);
	if (b->done < b->total)
		uv_run(&b->loop, UV_RUN_DEFAULT);
	uv_timer_stop(&b->pace);
	double secs = (double)(mc_now_ns() - t0) / 1e9;
	qsort(b->lat_ns, b->total, sizeof(*b->lat_ns), cmp_u64);
	r->ops_per_s = (double)b->total / secs;
	r->p50_ms = (double)b->lat_ns[b->total / 2] / 1e6;
	size_t i99 = (size_t)(b->total * 99 / 100);
	r->p99_ms = (double)b->lat_ns[i99 < b->total ? i99 : b->total - 1] / 1e6;
	r->failed = b->failed;
}

/* fdatasync/s of 256-byte appends in dir for about a second. */
static double fsync_rate(const char *dir)
{
	char path[4096];
	char buf[256];
	snprintf(path, sizeof(path), "%s/.mooncakectl-fsync-probe.%d", dir, (int)getpid());
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return -1;
	memset(buf, 'x', sizeof(buf));
	uint64_t t0 = mc_now_ns(), n = 0;
	while (mc_now_ns() - t0 < 1000000000ull) {
		if (write(fd, buf, sizeof(buf)) != (ssize_t)sizeof(buf) || fdatasync(fd)) {
			n = 0;
			break;
		}
		n++;
	}
	double secs = (double)(mc_now_ns() - t0) / 1e9;
	close(fd);
	unlink(path);
	return n ? (double)n / secs : -1;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: mooncakectl bench meta --endpoints=URL[,URL...] [--clients=64] [--conns=8]\n"
		"         [--key-size=8] [--val-size=256] [--total=20000] [--fsync-dir=DIR]\n"
		"         [--rate=OPS] [--latency-log=FILE] [--cluster-secret-file=F]\n"
		"         [--keep-keys] [--overwrite-keys]\n\n"
		"Puts --total distinct keys, then reads them back with linearizable Range\n"
		"calls, keeping --clients requests in flight over --conns connections spread\n"
		"over the endpoints (etcd v3 API: a mooncaked meta cluster or a real etcd),\n"
		"and counts acknowledged puts it does not find (lost writes: exit status 1).\n"
		"The keys are --key-size zero-padded decimals (0 to --total - 1); a store that\n"
		"holds any key between the first and the last is refused (exit status 1),\n"
		"so none of its keys is overwritten, and the run deletes its keys at the end\n"
		"(DeleteRange) unless --keep-keys (to fill a store). --overwrite-keys runs\n"
		"over keys already there (a run that rewrites a fill's) and keeps its keys\n"
		"(the range may hold others).\n"
		"--rate caps the requests started per second; --latency-log writes a line\n"
		"per put: END_UNIX_MS LATENCY_US OK.\n"
		"Prints ops/s and p50/p99 latency of each phase; with --fsync-dir also the\n"
		"disk's fdatasync/s there, the limit of one sync per write. The last line\n"
		"is RESULT key=value ... for scripts. Figures, never pass/fail.\n"
		"Members whose etcd API requires the cluster secret (--client-auth) get a\n"
		"token of --cluster-secret-file (default $MOONCAKE_CLUSTER_SECRET_FILE).\n");
}

static bool parse_u64(const char *v, uint64_t lo, uint64_t hi, uint64_t *out)
{
	char *end;
	if (!v || !*v)
		return false;
	errno = 0;
	unsigned long long x = strtoull(v, &end, 10);
	if (errno || *end || x < lo || x > hi)
		return false;
	*out = x;
	return true;
}

int ctl_bench_meta_main(int argc, char **argv)
{
	const char *endpoints = NULL, *fsync_dir = NULL, *latlog = NULL, *v;
	uint64_t clients = 64, conns = 8, key_size = 8, val_size = 256, total = 20000,
		 rate = 0;
	bool keep = false, overwrite = false;
	struct bm b;
	struct metrics_registry *reg = NULL;
	char *eps = NULL;
	int rc = CTL_EXIT_FAIL;

	for (int i = 1; i < argc; i++) {
		bool ok = true;
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			usage(stdout);
			return CTL_EXIT_OK;
		} else if (ctl_flag_value(argc, argv, &i, "endpoints", &v)) {
			endpoints = v;
			ok = v && *v;
		} else if (ctl_flag_value(argc, argv, &i, "clients", &v)) {
			ok = parse_u64(v, 1, 100000, &clients);
		} else if (ctl_flag_value(argc, argv, &i, "conns", &v)) {
			ok = parse_u64(v, 1, 10000, &conns);
		} else if (ctl_flag_value(argc, argv, &i, "key-size", &v)) {
			ok = parse_u64(v, 1, MAX_KEY_BYTES, &key_size);
		} else if (ctl_flag_value(argc, argv, &i, "val-size", &v)) {
			ok = parse_u64(v, 0, MAX_VAL_BYTES, &val_size);
		} else if (ctl_flag_value(argc, argv, &i, "total", &v)) {
			ok = parse_u64(v, 1, 100000000, &total);
		} else if (ctl_flag_value(argc, argv, &i, "rate", &v)) {
			ok = parse_u64(v, 1, 10000000, &rate);
		} else if (ctl_flag_value(argc, argv, &i, "latency-log", &v)) {
			latlog = v;
			ok = v && *v;
		} else if (ctl_flag_value(argc, argv, &i, "cluster-secret-file", &v)) {
			ctl_secret_file(v);
			ok = v && *v;
		} else if (strcmp(argv[i], "--keep-keys") == 0) {
			keep = true;
		} else if (strcmp(argv[i], "--overwrite-keys") == 0) {
			overwrite = true;
		} else if (ctl_flag_value(argc, argv, &i, "fsync-dir", &v)) {
			fsync_dir = v;
			ok = v && *v;
		} else {
			fprintf(stderr, "mooncakectl bench meta: unknown argument \"%s\"\n",
				argv[i]);
			usage(stderr);
			return CTL_EXIT_USAGE;
		}
		if (!ok) {
			fprintf(stderr, "mooncakectl bench meta: bad value in \"%s\"\n",
				argv[i]);
			return CTL_EXIT_USAGE;
		}
	}
	if (!endpoints) {
		fprintf(stderr, "mooncakectl bench meta: --endpoints is required\n");
		usage(stderr);
		return CTL_EXIT_USAGE;
	}
	if (clients > total)
		clients = total;

	memset(&b, 0, sizeof(b));
	b.key_size = key_size;
	b.val_size = val_size;
	b.total = total;
	b.nclients = clients;
	b.val = malloc(val_size ? val_size : 1);
	b.lat_ns = malloc(total * sizeof(*b.lat_ns));
	b.acked = calloc(total, 1);
	b.rate = rate;
	b.idle = calloc(clients, sizeof(*b.idle));
	b.clients = calloc(clients, sizeof(*b.clients));
	b.cli = calloc(conns, sizeof(*b.cli));
	if (!b.val || !b.lat_ns || !b.acked || !b.idle || !b.clients || !b.cli ||
	    uv_loop_init(&b.loop)) {
		fprintf(stderr, "mooncakectl bench meta: out of memory\n");
		goto out_free;
	}
	uv_timer_init(&b.loop, &b.pace);
	if (latlog && !(b.latlog = fopen(latlog, "we"))) {
		fprintf(stderr, "mooncakectl bench meta: %s: %s\n", latlog, strerror(errno));
		rc = CTL_EXIT_USAGE;
		goto out_loop;
	}
	for (size_t i = 0; i < val_size; i++)
		b.val[i] = (uint8_t)('a' + i % 26);

	/* The endpoints, then one connection after another round-robin. */
	eps = strdup(endpoints);
	char *names[64];
	if (!eps) {
		fprintf(stderr, "mooncakectl bench meta: out of memory\n");
		goto out_loop;
	}
	size_t neps = 0;
	for (char *save = NULL, *t = strtok_r(eps, ",", &save); t && neps < 64;
	     t = strtok_r(NULL, ",", &save))
		names[neps++] = t;
	reg = metrics_registry_new();
	struct rpc_client_opts co = {.max_message_bytes = 64u << 20, .metrics = reg};
	for (size_t i = 0; i < conns; i++) {
		if (ctl_rpc_client(&b.loop, names[i % neps], &co, &b.cli[i])) {
			rc = CTL_EXIT_USAGE;
			goto out_clients;
		}
		b.ncli++;
	}
	for (size_t i = 0; i < clients; i++) {
		b.clients[i].b = &b;
		b.clients[i].conn = i % conns;
	}

	printf("meta bench: %zu endpoint%s, %llu clients on %llu connections, key %llu B, "
	       "value %llu B, %llu ops per phase\n",
	       neps, neps == 1 ? "" : "s", (unsigned long long)clients,
	       (unsigned long long)conns, (unsigned long long)key_size,
	       (unsigned long long)val_size, (unsigned long long)total);
	/* The run writes its keys and deletes them at the end: a store that
	 * holds keys among them is refused, so none of its own is
	 * overwritten or deleted. */
	uint8_t first[MAX_KEY_BYTES], end[MAX_KEY_BYTES + 1];
	uint64_t n = 0;
	run_range(key_size, total, first, end);
	if (!overwrite && range_call(b.cli[0], false, first, end, key_size, &n))
		goto out_clients;
	if (!overwrite && n) {
		fprintf(stderr,
			"mooncakectl bench meta: the store holds %llu keys between '%.*s' and "
			"'%.*s', where this run writes its keys and then deletes them; run it "
			"against a store without keys there, with another --key-size, or with "
			"--overwrite-keys\n",
			(unsigned long long)n, (int)key_size, (const char *)first,
			(int)key_size, (const char *)end);
		goto out_clients;
	}
	double fs = fsync_dir ? fsync_rate(fsync_dir) : 0;
	if (fsync_dir)
		printf("  disk     %9.0f fdatasync/s in %s (one sync per write would cap "
		       "puts there)\n",
		       fs, fsync_dir);
	fflush(stdout);
	struct phase_result put, get;
	run_phase(&b, false, &put);
	printf("  put      %9.0f ops/s  p50 %7.3f ms  p99 %7.3f ms  (%llu failed%s%s)\n",
	       put.ops_per_s, put.p50_ms, put.p99_ms, (unsigned long long)put.failed,
	       put.failed ? ", first: " : "", put.failed ? b.first_err : "");
	if (fsync_dir && fs > 0)
		printf("           put/fdatasync ratio %.2f\n", put.ops_per_s / fs);
	fflush(stdout);
	run_phase(&b, true, &get);
	printf("  get      %9.0f ops/s  p50 %7.3f ms  p99 %7.3f ms  (%llu failed%s%s; "
	       "linearizable)\n",
	       get.ops_per_s, get.p50_ms, get.p99_ms, (unsigned long long)get.failed,
	       get.failed ? ", first: " : "", get.failed ? b.first_err : "");
	printf("  lost     %9llu of %llu acknowledged puts not read back%s (%llu failed puts "
	       "applied anyway)\n",
	       (unsigned long long)b.lost, (unsigned long long)(total - put.failed),
	       get.failed ? ", among the keys read" : "",
	       (unsigned long long)b.unacked_applied);
	/* (With --overwrite-keys the range may hold keys not the run's.) */
	keep = keep || overwrite;
	bool cleaned = keep || range_call(b.cli[0], true, first, end, key_size, &n) == 0;
	if (keep)
		printf("  cleanup  kept the run's keys (%s)\n",
		       overwrite ? "--overwrite-keys" : "--keep-keys");
	else if (cleaned)
		printf("  cleanup  %9llu keys deleted (this run's)\n", (unsigned long long)n);
	printf("RESULT put_ops=%.0f put_p50_ms=%.3f put_p99_ms=%.3f put_failed=%llu "
	       "get_ops=%.0f get_p50_ms=%.3f get_p99_ms=%.3f get_failed=%llu fsync_per_s=%.0f "
	       "lost=%llu\n",
	       put.ops_per_s, put.p50_ms, put.p99_ms, (unsigned long long)put.failed,
	       get.ops_per_s, get.p50_ms, get.p99_ms, (unsigned long long)get.failed, fs,
	       (unsigned long long)b.lost);
	rc = put.failed || get.failed || b.lost || !cleaned ? CTL_EXIT_FAIL : CTL_EXIT_OK;

out_clients:
	for (size_t i = 0; i < b.ncli; i++)
		rpc_client_free(b.cli[i]);
out_loop:
	if (b.latlog)
		fclose(b.latlog);
	uv_close((uv_handle_t *)&b.pace, NULL);
	uv_run(&b.loop, UV_RUN_DEFAULT); /* let the connections close */
	(void)uv_loop_close(&b.loop);
	if (reg)
		metrics_registry_free(reg);
	free(eps);
out_free:
	free(b.val);
	free(b.lat_ns);
	free(b.acked);
	free(b.idle);
	free(b.clients);
	free(b.cli);
	return rc;
}
