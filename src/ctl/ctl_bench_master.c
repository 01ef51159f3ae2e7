/*
 * ctl_bench_master: `mooncakectl bench master` — metadata operations per
 * second of the master and its memory per object, each beside the
 * machine's own limit measured in the same run.
 *
 *   put      PutStart + PutEnd pairs, unary, 64 pairs in flight
 *   get      GetReplicas, unary, 64 in flight
 *   bput     BatchPutStart + BatchPutEnd of --batch keys, 8 batches in flight
 *   bget     BatchGetReplicas of --batch keys, 8 in flight
 * The limit beside each: mooncake.diag.Diag Echo from the same client with
 * the same concurrency and the same request and reply sizes in bytes (the
 * RPC layer's own ceiling for that traffic), in keys per second.
 *
 * Memory: --objects (default 1M) objects are put in batches of 1000, then
 * the master's Stats gives the index memory, measured with
 * malloc_usable_size, per object and keys excluded; with the in-process
 * master the process's resident-set growth per object is printed too (an
 * upper bound: it includes this client's buffers).
 *
 * Without --target the master runs in this process on its own thread and
 * loop (no meta: leader at once), serving Diag too. With --target a
 * master started with --meta-endpoints= or a leader is measured, and the
 * Echo limit needs it started with --diag-service.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "common/cfg.h"
#include "common/metrics.h"
#include "common/util.h"
#include "ctl/ctl_int.h"
#include "diag.pb-c.h"
#include "master.pb-c.h"
#include "master/master.h"
#include "rpc/rpc.h"

#define UNARY_INFLIGHT 64
#define BATCH_INFLIGHT 8
#define FILL_BATCH 1000
#define VALUE_BYTES 4096
#define KEY_FMT "bench/%012" PRIu64
#define TIMEOUT_MS 60000

/* ---------------------------------------------------------------- driver */

/* A pipelined closed loop: `inflight` slots each issue a step, and on its
 * completion the next, until the deadline. A step is one or two calls. */
struct run;
typedef int (*issue_fn)(struct run *r, unsigned slot);

struct run {
	uv_loop_t *loop;
	struct rpc_client *c;
	issue_fn issue;
	uint64_t end_ns, t0;
	unsigned active;
	uint64_t steps, keys_per_step, next_key, key_limit;
	int err_status;
	char err[256];
	/* per-slot request state */
	unsigned batch;
	uint64_t slot_key[BATCH_INFLIGHT > UNARY_INFLIGHT ? BATCH_INFLIGHT : UNARY_INFLIGHT];
	uint8_t *echo_payload;
	size_t echo_len, echo_reply;
	uint64_t last_ns;
};

struct slot_ud {
	struct run *r;
	unsigned slot;
	int phase;
};

static struct slot_ud slots[UNARY_INFLIGHT];

static void run_fail(struct run *r, int status, const char *msg)
{
	if (!r->err_status) {
		r->err_status = status;
		snprintf(r->err, sizeof(r->err), "%s: %s", rpc_status_name(status),
			 msg ? msg : "");
	}
}

static void step_done(struct run *r, unsigned slot)
{
	uint64_t now = uv_hrtime();
	r->steps++;
	r->last_ns = now;
	if (!r->err_status && now < r->end_ns && r->issue(r, slot) == 0)
		return;
	r->active--;
}

static void fill_key(char *buf, size_t len, uint64_t i)
{
	snprintf(buf, len, KEY_FMT, i);
}

/* The i-th key a reader asks for, of the first limit put: scattered, so
 * that reads do not walk the index in the order its objects were
 * allocated (which a cache would favour). */
static uint64_t pick_key(uint64_t i, uint64_t limit)
{
	return (i * 0x9e3779b97f4a7c15ull >> 16) % limit;
}

/* ---- unary put: PutStart then PutEnd */

static void on_put_end(void *ud, int status, const char *msg, const ProtobufCMessage *resp)
{
	struct slot_ud *s = ud;
	(void)resp;
	if (status != RPC_OK)
		run_fail(s->r, status, msg);
	step_done(s->r, s->slot);
}

static void on_put_start(void *ud, int status, const char *msg, const ProtobufCMessage *resp)
{
	struct slot_ud *s = ud;
	struct run *r = s->r;
	(void)resp;
	if (status != RPC_OK) {
		run_fail(r, status, msg);
		step_done(r, s->slot);
		return;
	}
	char key[40];
	fill_key(key, sizeof(key), r->slot_key[s->slot]);
	Mooncake__Master__PutEndRequest req = MOONCAKE__MASTER__PUT_END_REQUEST__INIT;
	req.key.data = (uint8_t *)key;
	req.key.len = strlen(key);
	if (rpc_client_unary(r->c, "/mooncake.master.Master/PutEnd", &req.base,
			     &mooncake__master__put_end_response__descriptor, TIMEOUT_MS,
			     on_put_end, s, NULL)) {
		run_fail(r, RPC_INTERNAL, "issue");
		r->active--;
	}
}

static int issue_put(struct run *r, unsigned slot)
{
	char key[40];
	r->slot_key[slot] = r->next_key++;
	fill_key(key, sizeof(key), r->slot_key[slot]);
	Mooncake__Master__PutStartRequest req = MOONCAKE__MASTER__PUT_START_REQUEST__INIT;
	req.key.data = (uint8_t *)key;
	req.key.len = strlen(key);
	req.size = VALUE_BYTES;
	return rpc_client_unary(r->c, "/mooncake.master.Master/PutStart", &req.base,
				&mooncake__master__put_start_response__descriptor, TIMEOUT_MS,
				on_put_start, &slots[slot], NULL);
}

/* ---- unary get */

static void on_get(void *ud, int status, const char *msg, const ProtobufCMessage *resp)
{
	struct slot_ud *s = ud;
	(void)resp;
	if (status != RPC_OK)
		run_fail(s->r, status, msg);
	step_done(s->r, s->slot);
}

static int issue_get(struct run *r, unsigned slot)
{
	char key[40];
	fill_key(key, sizeof(key), pick_key(r->next_key++, r->key_limit));
	Mooncake__Master__GetReplicasRequest req =
		MOONCAKE__MASTER__GET_REPLICAS_REQUEST__INIT;
	req.key.data = (uint8_t *)key;
	req.key.len = strlen(key);
	return rpc_client_unary(r->c, "/mooncake.master.Master/GetReplicas", &req.base,
				&mooncake__master__get_replicas_response__descriptor,
				TIMEOUT_MS, on_get, &slots[slot], NULL);
}

/* ---- batches */

struct keyset {
	char (*keys)[40];
	ProtobufCBinaryData *bin;
	Mooncake__Master__PutStartRequest *items;
	Mooncake__Master__PutStartRequest **iptr;
};

static struct keyset ks[BATCH_INFLIGHT];

static int keyset_init(struct keyset *k, unsigned n)
{
	k->keys = calloc(n, sizeof(*k->keys));
	k->bin = calloc(n, sizeof(*k->bin));
	k->items = calloc(n, sizeof(*k->items));
	k->iptr = calloc(n, sizeof(*k->iptr));
	return k->keys && k->bin && k->items && k->iptr ? 0 : -ENOMEM;
}

static void keyset_free(struct keyset *k)
{
	free(k->keys);
	free(k->bin);
	free(k->items);
	free(k->iptr);
	memset(k, 0, sizeof(*k));
}

/* Keys first.. in order, or (modulo) n picked among the first modulo. */
static void keyset_fill(struct keyset *k, unsigned n, uint64_t first, uint64_t modulo)
{
	for (unsigned i = 0; i < n; i++) {
		fill_key(k->keys[i], sizeof(k->keys[i]),
			 modulo ? pick_key(first + i, modulo) : first + i);
		k->bin[i].data = (uint8_t *)k->keys[i];
		k->bin[i].len = strlen(k->keys[i]);
		mooncake__master__put_start_request__init(&k->items[i]);
		k->items[i].key = k->bin[i];
		k->items[i].size = VALUE_BYTES;
		k->iptr[i] = &k->items[i];
	}
}

static void on_bput_end(void *ud, int status, const char *msg, const ProtobufCMessage *resp)
{
	struct slot_ud *s = ud;
	const Mooncake__Master__BatchErrorsResponse *e = (const void *)resp;
	if (status != RPC_OK)
		run_fail(s->r, status, msg);
	else
		for (size_t i = 0; i < e->n_errors; i++)
			if (e->errors[i])
				run_fail(s->r, RPC_INTERNAL, "a BatchPutEnd item failed");
	step_done(s->r, s->slot);
}

static void on_bput_start(void *ud, int status, const char *msg, const ProtobufCMessage *resp)
{
	struct slot_ud *s = ud;
	struct run *r = s->r;
	const Mooncake__Master__BatchPutStartResponse *p = (const void *)resp;
	if (status == RPC_OK)
		for (size_t i = 0; i < p->n_results; i++)
			if (p->results[i]->error) {
				status = RPC_INTERNAL;
				msg = "a BatchPutStart item failed";
			}
	if (status != RPC_OK) {
		run_fail(r, status, msg);
		step_done(r, s->slot);
		return;
	}
	Mooncake__Master__BatchKeysRequest req = MOONCAKE__MASTER__BATCH_KEYS_REQUEST__INIT;
	req.keys = ks[s->slot].bin;
	req.n_keys = r->batch;
	if (rpc_client_unary(r->c, "/mooncake.master.Master/BatchPutEnd", &req.base,
			     &mooncake__master__batch_errors_response__descriptor, TIMEOUT_MS,
			     on_bput_end, s, NULL)) {
		run_fail(r, RPC_INTERNAL, "issue");
		r->active--;
	}
}

static int issue_bput(struct run *r, unsigned slot)
{
	if (r->key_limit && r->next_key >= r->key_limit)
		return -ERANGE; /* fill done */
	keyset_fill(&ks[slot], r->batch, r->next_key, 0);
	r->next_key += r->batch;
	Mooncake__Master__BatchPutStartRequest req =
		MOONCAKE__MASTER__BATCH_PUT_START_REQUEST__INIT;
	req.items = ks[slot].iptr;
	req.n_items = r->batch;
	return rpc_client_unary(r->c, "/mooncake.master.Master/BatchPutStart", &req.base,
				&mooncake__master__batch_put_start_response__descriptor,
				TIMEOUT_MS, on_bput_start, &slots[slot], NULL);
}

static void on_bget(void *ud, int status, const char *msg, const ProtobufCMessage *resp)
{
	struct slot_ud *s = ud;
	const Mooncake__Master__BatchGetReplicasResponse *g = (const void *)resp;
	if (status != RPC_OK)
		run_fail(s->r, status, msg);
	else if (g->n_results && g->results[0]->error)
		run_fail(s->r, RPC_INTERNAL, "a BatchGetReplicas item failed");
	step_done(s->r, s->slot);
}

static int issue_bget(struct run *r, unsigned slot)
{
	keyset_fill(&ks[slot], r->batch, r->next_key, r->key_limit);
	r->next_key += r->batch;
	Mooncake__Master__BatchKeysRequest req = MOONCAKE__MASTER__BATCH_KEYS_REQUEST__INIT;
	req.keys = ks[slot].bin;
	req.n_keys = r->batch;
	return rpc_client_unary(r->c, "/mooncake.master.Master/BatchGetReplicas", &req.base,
				&mooncake__master__batch_get_replicas_response__descriptor,
				TIMEOUT_MS, on_bget, &slots[slot], NULL);
}

/* ---- the limit: Diag Echo of the same sizes */

static void on_echo(void *ud, int status, const char *msg, const ProtobufCMessage *resp)
{
	struct slot_ud *s = ud;
	(void)resp;
	if (status != RPC_OK)
		run_fail(s->r, status, msg);
	step_done(s->r, s->slot);
}

static int issue_echo(struct run *r, unsigned slot)
{
	Mooncake__Diag__EchoRequest req = MOONCAKE__DIAG__ECHO_REQUEST__INIT;
	req.payload.data = r->echo_payload;
	req.payload.len = r->echo_len;
	req.response_bytes = r->echo_reply;
	return rpc_client_unary(r->c, "/mooncake.diag.Diag/Echo", &req.base,
				&mooncake__diag__echo_response__descriptor, TIMEOUT_MS,
				on_echo, &slots[slot], NULL);
}

/* Run r with n slots for duration_ms (0: until issue refuses). Returns
 * steps per second, or -1 on failure (r->err says why). */
static double drive(struct run *r, unsigned n, uint64_t duration_ms)
{
	r->t0 = uv_hrtime();
	r->end_ns = duration_ms ? r->t0 + duration_ms * 1000000ull : UINT64_MAX;
	r->active = n;
	r->steps = 0;
	for (unsigned i = 0; i < n; i++) {
		slots[i].r = r;
		slots[i].slot = i;
		if (r->issue(r, i) != 0)
			r->active--;
	}
	while (r->active)
		uv_run(r->loop, UV_RUN_ONCE);
	if (r->err_status)
		return -1;
	double secs = (double)((r->last_ns > r->t0 ? r->last_ns : uv_hrtime()) - r->t0) / 1e9;
	return secs > 0 ? (double)r->steps / secs : 0;
}

/* ---------------------------------------------------------------- helpers */

static int sync_call(struct rpc_client *c, const char *method, const ProtobufCMessage *req,
		     const ProtobufCMessageDescriptor *d, ProtobufCMessage **out, char *err,
		     size_t errlen)
{
	char path[96];
	snprintf(path, sizeof(path), "/mooncake.master.Master/%s", method);
	return rpc_client_unary_sync(c, path, req, d, TIMEOUT_MS, out, err, errlen);
}

/* sync_call, its failure told on stderr (with target and method): true
 * when *out holds the answer (the caller frees it). */
static bool call_said(struct rpc_client *c, const char *target, const char *method,
		      const ProtobufCMessage *req, const ProtobufCMessageDescriptor *d,
		      ProtobufCMessage **out)
{
	char err[512] = "";
	int st = sync_call(c, method, req, d, out, err, sizeof(err));
	if (st != RPC_OK)
		fprintf(stderr, "mooncakectl bench master: %s: %s: %s %s\n", target, method,
			rpc_status_name(st), err);
	return st == RPC_OK;
}

/* The master's Stats (the caller frees them), or NULL when it cannot say
 * (said on stderr). */
static Mooncake__Master__StatsResponse *target_stats(struct rpc_client *c, const char *target)
{
	Mooncake__Master__StatsRequest q = MOONCAKE__MASTER__STATS_REQUEST__INIT;
	ProtobufCMessage *out = NULL;
	if (!call_said(c, target, "Stats", &q.base,
		       &mooncake__master__stats_response__descriptor, &out))
		return NULL;
	return (Mooncake__Master__StatsResponse *)out;
}

/*
 * A --target master must be one of its own: the bench mounts a segment of
 * 64 TiB that the master would place real puts on (their agents cannot
 * write there, so they fail), and leaves --objects objects in its index
 * until that segment expires. Refused (with why) when it has agents or
 * objects; true when it is empty. A master that cannot say is refused too.
 */
static bool target_is_empty(struct rpc_client *c, const char *target)
{
	Mooncake__Master__StatsResponse *s = target_stats(c, target);
	if (!s)
		return false;
	bool empty = s->agents == 0 && s->objects == 0;
	if (!empty)
		fprintf(stderr,
			"mooncakectl bench master: %s serves a cluster (%" PRIu64
			" agents, %" PRIu64
			" objects): the bench mounts a 64 TiB segment of its own there, which "
			"the master would place real puts on, and leaves its objects in the "
			"index until that segment expires. Measure a master of its own "
			"(mooncaked --role=master --meta-endpoints= --diag-service), or run "
			"without --target\n",
			target, s->agents, s->objects);
	protobuf_c_message_free_unpacked(&s->base, NULL);
	return empty;
}

/* The master's object count, or UINT64_MAX when it cannot say. */
static uint64_t target_objects(struct rpc_client *c, const char *target)
{
	Mooncake__Master__StatsResponse *s = target_stats(c, target);
	uint64_t n = s ? s->objects : UINT64_MAX;
	if (s)
		protobuf_c_message_free_unpacked(&s->base, NULL);
	return n;
}

#define UNMOUNT_WAIT_MS 60000

/* The bench's segment goes, and its objects with it: the master is as it
 * was (a second run need not wait for the segment to expire). The master
 * answers the unmount at once and removes the objects in slices of its
 * loop after (README, The master: Segments): the bench waits for them,
 * all of the master's (target_is_empty), to be gone. */
static void unmount(struct rpc_client *c, const char *target, const char *agent)
{
	Mooncake__Master__UnmountSegmentRequest q =
		MOONCAKE__MASTER__UNMOUNT_SEGMENT_REQUEST__INIT;
	q.name = (char *)agent;
	q.agent_id = (char *)agent;
	ProtobufCMessage *out = NULL;
	if (!call_said(c, target, "UnmountSegment", &q.base,
		       &mooncake__master__unmount_segment_response__descriptor, &out)) {
		fprintf(stderr,
			"mooncakectl bench master: segment %s stays, its objects with it, "
			"until it expires (--agent-ttl)\n",
			agent);
		return;
	}
	protobuf_c_message_free_unpacked(out, NULL);
	uint64_t n, t0 = uv_hrtime();
	while ((n = target_objects(c, target)) != 0 && n != UINT64_MAX &&
	       uv_hrtime() - t0 < UNMOUNT_WAIT_MS * 1000000ull)
		usleep(20000);
	if (n && n != UINT64_MAX)
		fprintf(stderr,
			"mooncakectl bench master: segment %s unmounted, but %s still "
			"counts %" PRIu64 " objects after %d s\n",
			agent, target, n, UNMOUNT_WAIT_MS / 1000);
}

/* Keep the bench agent alive between phases (--agent-ttl). */
static void heartbeat(struct rpc_client *c, const Mooncake__Master__HeartbeatRequest *hb)
{
	ProtobufCMessage *out = NULL;
	char err[256];
	if (sync_call(c, "Heartbeat", &hb->base,
		      &mooncake__master__heartbeat_response__descriptor, &out, err,
		      sizeof(err)) == RPC_OK)
		protobuf_c_message_free_unpacked(out, NULL);
}

static void row(const char *name, double v, double limit, const char *unit)
{
	char lim[32], ratio[32];
	if (limit > 0) {
		snprintf(lim, sizeof(lim), "%12.0f", limit);
		snprintf(ratio, sizeof(ratio), "%8.2f", v / limit);
	} else {
		snprintf(lim, sizeof(lim), "%12s", "n/a");
		snprintf(ratio, sizeof(ratio), "%8s", "-");
	}
	printf("%-34s %12.0f %s %s  %s\n", name, v, lim, ratio, unit);
	fflush(stdout);
}

/* ---------------------------------------------------------------- scale */

#define SCALE_SMALL_OBJECTS 10000
#define SCALE_TARGET 0.8

/* Operations measured at two sizes of the index. */
enum { SC_GET, SC_BGET, SC_BPUT, SC_N };

struct scale_fig {
	double ops[SC_N];    /* keys per second */
	double cpu_us[SC_N]; /* the master thread's CPU per key; 0: unknown */
};

/* Fill the index up to `objects` (no-op when it holds that many). */
static int fill_to(struct run *r, uint64_t *written, uint64_t objects)
{
	if (objects <= *written)
		return 0;
	*r = (struct run){.loop = r->loop,
			  .c = r->c,
			  .issue = issue_bput,
			  .batch = FILL_BATCH,
			  .next_key = *written,
			  .key_limit = objects};
	if (drive(r, BATCH_INFLIGHT, 0) < 0)
		return -1;
	*written = MC_MAX(*written, r->next_key);
	return 0;
}

/* GetReplicas (unary, keys scattered over all `*written`), BatchGetReplicas
 * and BatchPutStart+End of new keys (the index grows by what they put),
 * with the master thread's CPU per key when it runs in this process
 * (master_tid NULL: it does not). */
static int scale_measure(struct run *r, uint64_t *written, unsigned batch,
			 uint64_t duration_ms, const pthread_t *master_tid,
			 struct scale_fig *f)
{
	static const issue_fn fns[SC_N] = {issue_get, issue_bget, issue_bput};
	const unsigned inflight[SC_N] = {UNARY_INFLIGHT, BATCH_INFLIGHT, BATCH_INFLIGHT};
	for (int i = 0; i < SC_N; i++) {
		*r = (struct run){.loop = r->loop,
				  .c = r->c,
				  .issue = fns[i],
				  .batch = batch,
				  .key_limit = i == SC_BPUT ? 0 : *written,
				  .next_key = i == SC_BPUT ? *written : 0};
		uint64_t cpu0 = master_tid ? ctl_thread_cpu_ns(*master_tid) : 0;
		double steps = drive(r, inflight[i], duration_ms);
		if (steps < 0)
			return -1;
		uint64_t cpu1 = master_tid ? ctl_thread_cpu_ns(*master_tid) : 0;
		double keys = (double)r->steps * (i == SC_GET ? 1 : batch);
		f->ops[i] = steps * (i == SC_GET ? 1 : batch);
		f->cpu_us[i] = cpu0 && cpu1 > cpu0 && keys > 0
				       ? (double)(cpu1 - cpu0) / 1e3 / keys
				       : 0;
		if (i == SC_BPUT)
			*written = MC_MAX(*written, r->next_key);
	}
	return 0;
}

static void scale_report(const struct scale_fig *small, const struct scale_fig *big,
			 uint64_t small_n, uint64_t big_n)
{
	static const char *const names[SC_N] = {"GetReplicas, unary x64",
						"BatchGetReplicas x8",
						"BatchPutStart+BatchPutEnd x8"};
	printf("\nops/s and master CPU per key at %" PRIu64 " and %" PRIu64
	       " objects (ratio = large / small;\n"
	       "target: ops/s ratio >= %.1f; CPU ratio above 1 is more CPU per key at scale)\n",
	       small_n, big_n, SCALE_TARGET);
	printf("%-30s %11s %11s %6s %9s %9s %6s\n", "operation", "ops/s small", "ops/s large",
	       "ratio", "CPU us", "CPU us", "ratio");
	for (int i = 0; i < SC_N; i++) {
		char c0[16] = "n/a", c1[16] = "n/a", cr[16] = "-";
		if (small->cpu_us[i] > 0 && big->cpu_us[i] > 0) {
			snprintf(c0, sizeof(c0), "%.2f", small->cpu_us[i]);
			snprintf(c1, sizeof(c1), "%.2f", big->cpu_us[i]);
			snprintf(cr, sizeof(cr), "%.2f", big->cpu_us[i] / small->cpu_us[i]);
		}
		printf("%-30s %11.0f %11.0f %6.2f %9s %9s %6s\n", names[i], small->ops[i],
		       big->ops[i], small->ops[i] > 0 ? big->ops[i] / small->ops[i] : 0, c0,
		       c1, cr);
	}
	fflush(stdout);
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: mooncakectl bench master [--target=HOST:PORT] [--duration=2s]\n"
		"                                [--batch=100] [--objects=1M]\n\n"
		"  --target=HOST:PORT  a leading master (default: one in this process, own\n"
		"                      thread and loop); the Echo limit needs --diag-service;\n"
		"                      one with a cluster secret: $MOONCAKE_CLUSTER_SECRET_FILE;\n"
		"                      refused when it has agents or objects (the bench's\n"
		"                      segment would take real puts)\n"
		"  --duration=D        how long each ops/s figure is measured\n"
		"  --batch=N           keys per batch call (at most 65536, the master's limit)\n"
		"  --objects=N         objects put for the memory and scale figures (10M takes\n"
		"                      a while)\n\n"
		"Metadata ops/s (PutStart+PutEnd, GetReplicas; unary with %d in flight and\n"
		"batched with %d batches in flight), each beside Diag Echo of the same bytes and\n"
		"concurrency from the same client (the RPC layer's ceiling), the master's\n"
		"index memory per object, and GetReplicas, BatchGetReplicas and batched puts\n"
		"at %d objects and at --objects side by side, with the master thread's CPU\n"
		"per key when it runs in this process. Figures are measurements, never\n"
		"pass/fail.\n",
		UNARY_INFLIGHT, BATCH_INFLIGHT, SCALE_SMALL_OBJECTS);
}

int ctl_bench_master_main(int argc, char **argv)
{
	const char *target = NULL, *v;
	uint64_t duration_ms = 2000, batch = 100, objects = 1000000;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			usage(stdout);
			return CTL_EXIT_OK;
		} else if (ctl_flag_value(argc, argv, &i, "target", &v) && v && *v) {
			target = v;
		} else if (ctl_flag_value(argc, argv, &i, "duration", &v) && v &&
			   cfg_parse_duration_ms(v, &duration_ms) == 0 && duration_ms) {
		} else if (ctl_flag_value(argc, argv, &i, "batch", &v) && v &&
			   cfg_parse_size(v, &batch) == 0 && batch && batch <= 65536) {
		} else if (ctl_flag_value(argc, argv, &i, "objects", &v) &&
			   ctl_parse_count(v, &objects) == 0) {
		} else {
			usage(stderr);
			return CTL_EXIT_USAGE;
		}
	}

	struct ctl_msrv *srv = NULL;
	bool local = !target;
	char addr[64], agent[64] = "";
	bool mounted = false;
	int rc = CTL_EXIT_FAIL;
	uv_loop_t loop;
	struct rpc_client *c = NULL;
	struct metrics_registry *reg = metrics_registry_new();
	double rss0 = (double)mc_rss_bytes();
	if (!reg || uv_loop_init(&loop)) {
		fprintf(stderr, "mooncakectl bench master: out of memory\n");
		metrics_registry_free(reg);
		return CTL_EXIT_FAIL;
	}
	if (local) {
		if (ctl_msrv_start(3600000, &srv)) {
			fprintf(stderr, "mooncakectl bench master: cannot start a master\n");
			goto out_loop;
		}
		snprintf(addr, sizeof(addr), "127.0.0.1:%d", ctl_msrv_port(srv));
		target = addr;
	}
	struct rpc_client_opts co = {.max_message_bytes = 256u << 20, .metrics = reg};
	if (ctl_rpc_client(&loop, target, &co, &c)) {
		rc = CTL_EXIT_USAGE;
		goto out_srv;
	}
	if (!local && !target_is_empty(c, target))
		goto out_client;
	for (unsigned i = 0; i < BATCH_INFLIGHT; i++)
		if (keyset_init(&ks[i], (unsigned)MC_MAX(batch, FILL_BATCH))) {
			fprintf(stderr, "mooncakectl bench master: out of memory\n");
			goto out_client;
		}

	/* A segment large enough for every object (the master only does
	 * arithmetic on it), owned by a bench agent. */
	char err[512] = "";
	snprintf(agent, sizeof(agent), "bench-%d", (int)getpid());
	Mooncake__Master__Segment seg = MOONCAKE__MASTER__SEGMENT__INIT;
	seg.name = agent;
	seg.agent_id = agent;
	seg.base_address = 1ull << 44;
	seg.size = 1ull << 46;
	Mooncake__Master__MountSegmentRequest mreq =
		MOONCAKE__MASTER__MOUNT_SEGMENT_REQUEST__INIT;
	mreq.segment = &seg;
	ProtobufCMessage *out = NULL;
	if (!call_said(c, target, "MountSegment", &mreq.base,
		       &mooncake__master__mount_segment_response__descriptor, &out))
		goto out_client;
	protobuf_c_message_free_unpacked(out, NULL);
	mounted = true;
	Mooncake__Master__HeartbeatRequest hb = MOONCAKE__MASTER__HEARTBEAT_REQUEST__INIT;
	hb.agent_id = agent;

	printf("mooncakectl bench master: %s (%s), %.1f s per figure, batch %" PRIu64
	       ", value %d B, keys like \"" KEY_FMT "\"\n",
	       target, local ? "in process, own thread and loop" : "remote",
	       (double)duration_ms / 1000, batch, VALUE_BYTES, (uint64_t)0);
	printf("limit = mooncake.diag.Diag Echo, same client, concurrency and bytes each way;\n"
	       "ratio = master / limit\n\n");
	printf("%-34s %12s %12s %8s  %s\n", "operation", "master", "limit", "ratio", "unit");

	/* The scale figures' first half: at SCALE_SMALL_OBJECTS objects. */
	struct run r = {.loop = &loop, .c = c};
	uint64_t written = 0;
	struct scale_fig sc_small, sc_big;
	memset(&sc_small, 0, sizeof(sc_small));
	memset(&sc_big, 0, sizeof(sc_big));
	pthread_t tid = local ? ctl_msrv_thread(srv) : pthread_self();
	const pthread_t *mtid = local ? &tid : NULL;
	if (fill_to(&r, &written, SCALE_SMALL_OBJECTS) ||
	    scale_measure(&r, &written, (unsigned)batch, duration_ms, mtid, &sc_small))
		goto failed;
	heartbeat(c, &hb);

	/* put, unary */
	r = (struct run){.loop = &loop, .c = c, .issue = issue_put, .next_key = written};
	double put = drive(&r, UNARY_INFLIGHT, duration_ms);
	if (put < 0)
		goto failed;
	written = r.next_key;
	/* Echo of a PutStart-sized exchange (two calls per put). */
	Mooncake__Master__PutStartRequest psr = MOONCAKE__MASTER__PUT_START_REQUEST__INIT;
	char k0[40];
	fill_key(k0, sizeof(k0), 0);
	psr.key.data = (uint8_t *)k0;
	psr.key.len = strlen(k0);
	psr.size = VALUE_BYTES;
	uint8_t pay[1 << 16];
	memset(pay, 'k', sizeof(pay));
	struct run e = {.loop = &loop, .c = c, .issue = issue_echo, .echo_payload = pay};
	e.echo_len = protobuf_c_message_get_packed_size(&psr.base);
	e.echo_reply = 40;
	double echo1 = drive(&e, UNARY_INFLIGHT, duration_ms);
	row("PutStart+PutEnd, unary x64", put, echo1 > 0 ? echo1 / 2 : 0, "puts/s");

	r = (struct run){.loop = &loop, .c = c, .issue = issue_get, .key_limit = written};
	double get = drive(&r, UNARY_INFLIGHT, duration_ms);
	if (get < 0)
		goto failed;
	e.err_status = 0;
	e.echo_reply = 70;
	echo1 = drive(&e, UNARY_INFLIGHT, duration_ms);
	row("GetReplicas, unary x64", get, echo1 > 0 ? echo1 : 0, "gets/s");
	heartbeat(c, &hb);

	r = (struct run){.loop = &loop,
			 .c = c,
			 .issue = issue_bput,
			 .batch = (unsigned)batch,
			 .next_key = written};
	double bput = drive(&r, BATCH_INFLIGHT, duration_ms);
	if (bput < 0)
		goto failed;
	written = r.next_key;
	/* Echo limit of a batch: request and reply sized like the real ones. */
	keyset_fill(&ks[0], (unsigned)batch, 0, 0);
	Mooncake__Master__BatchKeysRequest bk = MOONCAKE__MASTER__BATCH_KEYS_REQUEST__INIT;
	bk.keys = ks[0].bin;
	bk.n_keys = batch;
	size_t breq = protobuf_c_message_get_packed_size(&bk.base);
	uint8_t *bpay = malloc(breq * 2 + 1);
	if (!bpay)
		goto failed;
	memset(bpay, 'k', breq * 2 + 1);
	e = (struct run){.loop = &loop,
			 .c = c,
			 .issue = issue_echo,
			 .echo_payload = bpay,
			 .echo_len = breq,
			 .echo_reply = batch * 48};
	double echob = drive(&e, BATCH_INFLIGHT, duration_ms);
	row("BatchPutStart+BatchPutEnd x8", bput * (double)batch,
	    echob > 0 ? echob * (double)batch / 2 : 0, "puts/s");

	r = (struct run){.loop = &loop,
			 .c = c,
			 .issue = issue_bget,
			 .batch = (unsigned)batch,
			 .key_limit = written};
	double bget = drive(&r, BATCH_INFLIGHT, duration_ms);
	if (bget < 0) {
		free(bpay);
		goto failed;
	}
	/* The real reply size, for the Echo limit. */
	keyset_fill(&ks[0], (unsigned)batch, 0, 0);
	bk.keys = ks[0].bin;
	if (sync_call(c, "BatchGetReplicas", &bk.base,
		      &mooncake__master__batch_get_replicas_response__descriptor, &out, err,
		      sizeof(err)) == RPC_OK) {
		e.echo_reply = protobuf_c_message_get_packed_size(out);
		protobuf_c_message_free_unpacked(out, NULL);
	}
	e.err_status = 0;
	echob = drive(&e, BATCH_INFLIGHT, duration_ms);
	free(bpay);
	row("BatchGetReplicas x8", bget * (double)batch, echob > 0 ? echob * (double)batch : 0,
	    "gets/s");
	if (e.err_status)
		printf("  (no Echo limit: %s — start the target with --diag-service)\n",
		       e.err);

	/* Memory: fill up to --objects in batches of FILL_BATCH. */
	heartbeat(c, &hb);
	double rss1 = (double)mc_rss_bytes();
	uint64_t before = written;
	if (objects > written) {
		uint64_t t0 = uv_hrtime();
		if (fill_to(&r, &written, objects))
			goto failed;
		printf("\nfilled to %" PRIu64 " objects in %.1f s\n", written,
		       (double)(uv_hrtime() - t0) / 1e9);
	}
	Mooncake__Master__StatsResponse *s = target_stats(c, target);
	if (!s)
		goto out_client;
	double rss2 = (double)mc_rss_bytes();
	printf("\nmemory at %" PRIu64 " objects (keys %.1f B on average)\n", s->objects,
	       s->objects ? (double)s->key_bytes / (double)s->objects : 0.0);
	printf("  index, measured (malloc_usable_size)  %8.1f B/object + key   target <= 100\n",
	       s->bytes_per_object);
	if (local && written > before)
		printf("  process RSS growth (upper bound)      %8.1f B/object incl. key\n",
		       (rss2 - rss1) / (double)(written - before));
	(void)rss0;
	uint64_t big_n = s->objects;
	protobuf_c_message_free_unpacked(&s->base, NULL);
	fflush(stdout);

	/* The scale figures' second half, at --objects. */
	heartbeat(c, &hb);
	if (scale_measure(&r, &written, (unsigned)batch, duration_ms, mtid, &sc_big))
		goto failed;
	scale_report(&sc_small, &sc_big, SCALE_SMALL_OBJECTS, big_n);
	rc = CTL_EXIT_OK;
	goto out_client;
failed:
	fprintf(stderr, "mooncakectl bench master: %s: %s\n", target, r.err);
out_client:
	if (mounted)
		unmount(c, target, agent);
	for (unsigned i = 0; i < BATCH_INFLIGHT; i++)
		keyset_free(&ks[i]);
	rpc_client_free(c);
	uv_run(&loop, UV_RUN_DEFAULT);
out_srv:
	if (local)
		ctl_msrv_stop(srv);
out_loop:
	(void)uv_loop_close(&loop);
	metrics_registry_free(reg);
	return rc;
}
