/*
 * ctl_bench_resync: `mooncakectl bench resync` — many agents against one
 * master, simulated in this process, through a master failover.
 *
 * A master runs on a thread of this process (ctl_bench_msrv.c). Each
 * simulated agent has its own connection, segment and heartbeat timer,
 * and does what an agent does with the master, message for message:
 *   1. MountSegment (all agents at once), then a Heartbeat every
 *      --heartbeat from then on;
 *   2. puts its share of --objects onto its own segment
 *      (BatchPutStart naming it as the preferred segment, BatchPutEnd),
 *      keeping the offset of each, as an agent's inventory does;
 *   3. failover: the master is stopped and a new one started with an
 *      empty index (what a new leader has). Each agent's next Heartbeat
 *      hears resync; it mounts again with resync = true and reports its
 *      objects in Heartbeats of 1,000 items (the agent's batch), the
 *      last one with inventory_complete. The time from the new master's
 *      start to the last agent's completion is the re-sync time, printed
 *      per million objects.
 * Then it checks what came back: every item accepted, the index holding
 * every object, sampled keys at the segment and offset their agent had,
 * and each segment taking placements again. Any miss is a failure (exit
 * status 1), so the test suite runs it small.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "common/cfg.h"
#include "common/util.h"
#include "ctl/ctl_int.h"
#include "master.pb-c.h"
#include "rpc/rpc.h"

#define VALUE_BYTES 4096
#define SEGMENT_BYTES (1ull << 40)
#define PUT_BATCH 1000u
#define INV_BATCH 1000u /* items per inventory Heartbeat, as the agent sends */
#define SAMPLE_KEYS 1000u
#define TIMEOUT_MS 60000
#define KEY_BYTES 32
#define MAX_AGENTS 4096u

struct sim;

struct sim_agent {
	struct sim *s;
	unsigned idx;
	char name[32];
	struct rpc_client *c;
	uint64_t view;
	uint64_t nobj;    /* its share of the objects */
	uint64_t *off;    /* offset of each of them in its segment */
	uint64_t pos;     /* next object to put, or to report */
	uint64_t batch_n; /* objects in the batch in flight */
	uv_timer_t hb;
	uint64_t hb_t0;
	bool hb_inflight;
	/* one batch's request */
	char (*keys)[KEY_BYTES];
	ProtobufCBinaryData *bin;
	Mooncake__Master__PutStartRequest *items;
	Mooncake__Master__PutStartRequest **iptr;
	Mooncake__Master__InventoryItem *inv;
	Mooncake__Master__InventoryItem **invp;
};

struct sim {
	uv_loop_t *loop;
	struct sim_agent *a;
	unsigned n;
	unsigned pending; /* agents not done with the current phase */
	bool failed;
	char err[256];
	uint64_t hb_ms;
	struct ctl_lat hb_lat;
	uint64_t hb_sent, hb_resync;
	uint64_t accepted, skipped;
};

static void sim_fail(struct sim *s, const char *who, const char *what, const char *msg)
{
	if (!s->failed)
		snprintf(s->err, sizeof(s->err), "%s: %s: %s", who, what, msg ? msg : "");
	s->failed = true;
}

static void agent_done(struct sim_agent *a)
{
	a->s->pending--;
}

static void agent_key(char *buf, unsigned agent, uint64_t i)
{
	snprintf(buf, KEY_BYTES, "sim/%02u/%010" PRIu64, agent, i);
}

static int agent_call(struct sim_agent *a, const char *method, const ProtobufCMessage *req,
		      const ProtobufCMessageDescriptor *d, rpc_unary_cb cb)
{
	char path[96];
	snprintf(path, sizeof(path), "/mooncake.master.Master/%s", method);
	return rpc_client_unary(a->c, path, req, d, TIMEOUT_MS, cb, a, NULL);
}

/* ---------------------------------------------------------------- mount */

static void on_mounted(void *ud, int status, const char *msg, const ProtobufCMessage *resp)
{
	struct sim_agent *a = ud;
	if (status != RPC_OK)
		sim_fail(a->s, a->name, "MountSegment", msg);
	else
		a->view = ((const Mooncake__Master__MountSegmentResponse *)resp)->view;
	agent_done(a);
}

static int agent_mount(struct sim_agent *a, bool resync, rpc_unary_cb cb)
{
	Mooncake__Master__Segment seg = MOONCAKE__MASTER__SEGMENT__INIT;
	seg.name = a->name;
	seg.agent_id = a->name;
	seg.base_address = (1ull << 44) + (uint64_t)a->idx * SEGMENT_BYTES;
	seg.size = SEGMENT_BYTES;
	Mooncake__Master__MountSegmentRequest req =
		MOONCAKE__MASTER__MOUNT_SEGMENT_REQUEST__INIT;
	req.segment = &seg;
	req.resync = resync;
	return agent_call(a, "MountSegment", &req.base,
			  &mooncake__master__mount_segment_response__descriptor, cb);
}

/* ---------------------------------------------------------------- heartbeats */

static void on_heartbeat(void *ud, int status, const char *msg, const ProtobufCMessage *resp)
{
	struct sim_agent *a = ud;
	a->hb_inflight = false;
	if (status == RPC_CANCELLED)
		return;
	if (status != RPC_OK) {
		sim_fail(a->s, a->name, "Heartbeat", msg);
		return;
	}
	ctl_lat_add(&a->s->hb_lat, uv_hrtime() - a->hb_t0);
	if (((const Mooncake__Master__HeartbeatResponse *)resp)->resync)
		a->s->hb_resync++;
}

static void on_hb_timer(uv_timer_t *t)
{
	struct sim_agent *a = MC_CONTAINER_OF(t, struct sim_agent, hb);
	if (a->hb_inflight)
		return;
	Mooncake__Master__HeartbeatRequest req = MOONCAKE__MASTER__HEARTBEAT_REQUEST__INIT;
	req.agent_id = a->name;
	req.view = a->view;
	a->hb_t0 = uv_hrtime();
	if (agent_call(a, "Heartbeat", &req.base,
		       &mooncake__master__heartbeat_response__descriptor, on_heartbeat) == 0) {
		a->hb_inflight = true;
		a->s->hb_sent++;
	}
}

/* ---------------------------------------------------------------- fill */

static void put_next(struct sim_agent *a);

static void on_put_end(void *ud, int status, const char *msg, const ProtobufCMessage *resp)
{
	struct sim_agent *a = ud;
	const Mooncake__Master__BatchErrorsResponse *r = (const void *)resp;
	if (status != RPC_OK || r->n_errors != a->batch_n) {
		sim_fail(a->s, a->name, "BatchPutEnd",
			 status != RPC_OK ? msg : "short answer");
		agent_done(a);
		return;
	}
	for (size_t i = 0; i < r->n_errors; i++)
		if (r->errors[i]) {
			sim_fail(a->s, a->name, "BatchPutEnd", mc_strerror(r->errors[i]));
			agent_done(a);
			return;
		}
	a->pos += a->batch_n;
	put_next(a);
}

static void on_put_start(void *ud, int status, const char *msg, const ProtobufCMessage *resp)
{
	struct sim_agent *a = ud;
	const Mooncake__Master__BatchPutStartResponse *r = (const void *)resp;
	if (status != RPC_OK || r->n_results != a->batch_n) {
		sim_fail(a->s, a->name, "BatchPutStart",
			 status != RPC_OK ? msg : "short answer");
		agent_done(a);
		return;
	}
	for (size_t i = 0; i < r->n_results; i++) {
		const Mooncake__Master__PutStartResult *p = r->results[i];
		if (p->error || p->n_replicas != 1 ||
		    strcmp(p->replicas[0]->segment, a->name)) {
			sim_fail(a->s, a->name, "BatchPutStart",
				 p->error ? mc_strerror(p->error)
					  : "placed off its own segment");
			agent_done(a);
			return;
		}
		a->off[a->pos + i] = p->replicas[0]->offset;
	}
	Mooncake__Master__BatchKeysRequest req = MOONCAKE__MASTER__BATCH_KEYS_REQUEST__INIT;
	req.keys = a->bin;
	req.n_keys = a->batch_n;
	if (agent_call(a, "BatchPutEnd", &req.base,
		       &mooncake__master__batch_errors_response__descriptor, on_put_end)) {
		sim_fail(a->s, a->name, "BatchPutEnd", "cannot issue");
		agent_done(a);
	}
}

static void put_next(struct sim_agent *a)
{
	if (a->s->failed || a->pos == a->nobj) {
		agent_done(a);
		return;
	}
	a->batch_n = MC_MIN(a->nobj - a->pos, (uint64_t)PUT_BATCH);
	for (uint64_t i = 0; i < a->batch_n; i++) {
		agent_key(a->keys[i], a->idx, a->pos + i);
		a->bin[i].data = (uint8_t *)a->keys[i];
		a->bin[i].len = strlen(a->keys[i]);
		mooncake__master__put_start_request__init(&a->items[i]);
		a->items[i].key = a->bin[i];
		a->items[i].size = VALUE_BYTES;
		a->items[i].preferred_segment = a->name;
		a->iptr[i] = &a->items[i];
	}
	Mooncake__Master__BatchPutStartRequest req =
		MOONCAKE__MASTER__BATCH_PUT_START_REQUEST__INIT;
	req.items = a->iptr;
	req.n_items = a->batch_n;
	if (agent_call(a, "BatchPutStart", &req.base,
		       &mooncake__master__batch_put_start_response__descriptor,
		       on_put_start)) {
		sim_fail(a->s, a->name, "BatchPutStart", "cannot issue");
		agent_done(a);
	}
}

/* ---------------------------------------------------------------- re-sync */

static void inv_next(struct sim_agent *a);

static void on_inventory(void *ud, int status, const char *msg, const ProtobufCMessage *resp)
{
	struct sim_agent *a = ud;
	const Mooncake__Master__HeartbeatResponse *r = (const void *)resp;
	if (status != RPC_OK) {
		sim_fail(a->s, a->name, "inventory Heartbeat", msg);
		agent_done(a);
		return;
	}
	a->s->accepted += r->items_accepted;
	a->s->skipped += r->items_skipped;
	a->pos += a->batch_n;
	if (a->pos == a->nobj) {
		agent_done(a); /* that was the inventory_complete Heartbeat */
		return;
	}
	inv_next(a);
}

/* The next inventory Heartbeat: up to INV_BATCH items, the last one
 * with inventory_complete (an agent with nothing sends just that). */
static void inv_next(struct sim_agent *a)
{
	a->batch_n = MC_MIN(a->nobj - a->pos, (uint64_t)INV_BATCH);
	for (uint64_t i = 0; i < a->batch_n; i++) {
		agent_key(a->keys[i], a->idx, a->pos + i);
		Mooncake__Master__InventoryItem *it = &a->inv[i];
		mooncake__master__inventory_item__init(it);
		it->key.data = (uint8_t *)a->keys[i];
		it->key.len = strlen(a->keys[i]);
		it->segment = a->name;
		it->offset = a->off[a->pos + i];
		it->size = VALUE_BYTES;
		a->invp[i] = it;
	}
	Mooncake__Master__HeartbeatRequest req = MOONCAKE__MASTER__HEARTBEAT_REQUEST__INIT;
	req.agent_id = a->name;
	req.view = a->view;
	req.inventory = a->invp;
	req.n_inventory = a->batch_n;
	req.inventory_complete = a->pos + a->batch_n == a->nobj;
	if (agent_call(a, "Heartbeat", &req.base,
		       &mooncake__master__heartbeat_response__descriptor, on_inventory)) {
		sim_fail(a->s, a->name, "inventory Heartbeat", "cannot issue");
		agent_done(a);
	}
}

static void on_remounted(void *ud, int status, const char *msg, const ProtobufCMessage *resp)
{
	struct sim_agent *a = ud;
	if (status != RPC_OK) {
		sim_fail(a->s, a->name, "MountSegment resync", msg);
		agent_done(a);
		return;
	}
	a->view = ((const Mooncake__Master__MountSegmentResponse *)resp)->view;
	a->pos = 0;
	inv_next(a);
}

static void on_first_heartbeat(void *ud, int status, const char *msg,
			       const ProtobufCMessage *resp)
{
	struct sim_agent *a = ud;
	if (status != RPC_OK || !((const Mooncake__Master__HeartbeatResponse *)resp)->resync) {
		sim_fail(a->s, a->name, "Heartbeat to the new master",
			 status != RPC_OK ? msg : "no resync asked");
		agent_done(a);
		return;
	}
	if (agent_mount(a, true, on_remounted)) {
		sim_fail(a->s, a->name, "MountSegment resync", "cannot issue");
		agent_done(a);
	}
}

static void agent_resync(struct sim_agent *a)
{
	Mooncake__Master__HeartbeatRequest req = MOONCAKE__MASTER__HEARTBEAT_REQUEST__INIT;
	req.agent_id = a->name;
	req.view = a->view;
	if (agent_call(a, "Heartbeat", &req.base,
		       &mooncake__master__heartbeat_response__descriptor,
		       on_first_heartbeat)) {
		sim_fail(a->s, a->name, "Heartbeat to the new master", "cannot issue");
		agent_done(a);
	}
}

/* ---------------------------------------------------------------- driver */

/* Run the loop until every agent is through the phase. */
static void sim_wait(struct sim *s)
{
	while (s->pending)
		uv_run(s->loop, UV_RUN_ONCE);
}

static int sim_connect(struct sim *s, int port)
{
	char target[64];
	snprintf(target, sizeof(target), "127.0.0.1:%d", port);
	struct rpc_client_opts co = {.max_message_bytes = 64u << 20};
	for (unsigned i = 0; i < s->n; i++)
		if (rpc_client_new(s->loop, target, &co, &s->a[i].c))
			return -1;
	return 0;
}

static void sim_disconnect(struct sim *s)
{
	for (unsigned i = 0; i < s->n; i++) {
		rpc_client_free(s->a[i].c);
		s->a[i].c = NULL;
	}
	uv_run(s->loop, UV_RUN_NOWAIT);
}

static void hb_closed(uv_handle_t *h)
{
	(void)h;
}

static int sim_alloc(struct sim *s, uint64_t objects)
{
	for (unsigned i = 0; i < s->n; i++) {
		struct sim_agent *a = &s->a[i];
		a->s = s;
		uv_timer_init(s->loop, &a->hb);
		a->idx = i;
		snprintf(a->name, sizeof(a->name), "sim-%02u", i);
		a->nobj = objects / s->n + (i < objects % s->n);
		a->off = calloc(a->nobj ? a->nobj : 1, sizeof(*a->off));
		a->keys = calloc(INV_BATCH, sizeof(*a->keys));
		a->bin = calloc(INV_BATCH, sizeof(*a->bin));
		a->items = calloc(INV_BATCH, sizeof(*a->items));
		a->iptr = calloc(INV_BATCH, sizeof(*a->iptr));
		a->inv = calloc(INV_BATCH, sizeof(*a->inv));
		a->invp = calloc(INV_BATCH, sizeof(*a->invp));
		if (!a->off || !a->keys || !a->bin || !a->items || !a->iptr || !a->inv ||
		    !a->invp)
			return -1;
	}
	return 0;
}

static void sim_free(struct sim *s)
{
	for (unsigned i = 0; i < s->n; i++) {
		struct sim_agent *a = &s->a[i];
		if (a->s)
			uv_close((uv_handle_t *)&a->hb, hb_closed);
		free(a->off);
		free(a->keys);
		free(a->bin);
		free(a->items);
		free(a->iptr);
		free(a->inv);
		free(a->invp);
	}
	uv_run(s->loop, UV_RUN_DEFAULT);
	ctl_lat_free(&s->hb_lat);
	free(s->a);
}

/* What came back after the re-sync: the index's object count, sampled
 * keys at their agent's segment and offset, and a new put placed on
 * every agent's segment (the re-sync let it take placements again). */
static int sim_check(struct sim *s, uint64_t objects, char *err, size_t errlen)
{
	ProtobufCMessage *out = NULL;
	struct rpc_client *c = s->a[0].c;
	Mooncake__Master__StatsRequest sreq = MOONCAKE__MASTER__STATS_REQUEST__INIT;
	int st = rpc_client_unary_sync(c, "/mooncake.master.Master/Stats", &sreq.base,
				       &mooncake__master__stats_response__descriptor,
				       TIMEOUT_MS, &out, err, errlen);
	if (st != RPC_OK)
		return -1;
	uint64_t have = ((const Mooncake__Master__StatsResponse *)out)->objects;
	protobuf_c_message_free_unpacked(out, NULL);
	if (have != objects) {
		snprintf(err, errlen, "the index holds %" PRIu64 " objects, not %" PRIu64,
			 have, objects);
		return -1;
	}
	for (uint64_t k = 0; k < SAMPLE_KEYS && objects; k++) {
		uint64_t g = (k * 0x9e3779b97f4a7c15ull >> 16) % objects;
		unsigned ai = (unsigned)(g % s->n);
		struct sim_agent *a = &s->a[ai];
		uint64_t li = (g / s->n) % a->nobj;
		char key[KEY_BYTES];
		agent_key(key, ai, li);
		Mooncake__Master__GetReplicasRequest g_req =
			MOONCAKE__MASTER__GET_REPLICAS_REQUEST__INIT;
		g_req.key.data = (uint8_t *)key;
		g_req.key.len = strlen(key);
		st = rpc_client_unary_sync(
			c, "/mooncake.master.Master/GetReplicas", &g_req.base,
			&mooncake__master__get_replicas_response__descriptor, TIMEOUT_MS, &out,
			err, errlen);
		if (st != RPC_OK)
			return -1;
		const Mooncake__Master__GetReplicasResponse *r = (const void *)out;
		bool ok = r->n_replicas == 1 &&
			  strcmp(r->replicas[0]->segment, a->name) == 0 &&
			  r->replicas[0]->offset == a->off[li] && r->size == VALUE_BYTES;
		protobuf_c_message_free_unpacked(out, NULL);
		if (!ok) {
			snprintf(err, errlen, "%s is not where %s put it", key, a->name);
			return -1;
		}
	}
	for (unsigned i = 0; i < s->n; i++) {
		struct sim_agent *a = &s->a[i];
		char key[KEY_BYTES];
		snprintf(key, sizeof(key), "sim/%02u/after", i);
		Mooncake__Master__PutStartRequest p =
			MOONCAKE__MASTER__PUT_START_REQUEST__INIT;
		p.key.data = (uint8_t *)key;
		p.key.len = strlen(key);
		p.size = VALUE_BYTES;
		p.preferred_segment = a->name;
		st = rpc_client_unary_sync(a->c, "/mooncake.master.Master/PutStart", &p.base,
					   &mooncake__master__put_start_response__descriptor,
					   TIMEOUT_MS, &out, err, errlen);
		if (st != RPC_OK)
			return -1;
		const Mooncake__Master__PutStartResponse *r = (const void *)out;
		bool ok = r->n_replicas == 1 && strcmp(r->replicas[0]->segment, a->name) == 0;
		protobuf_c_message_free_unpacked(out, NULL);
		if (!ok) {
			snprintf(err, errlen, "a put after the re-sync was not placed on %s",
				 a->name);
			return -1;
		}
	}
	return 0;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: mooncakectl bench resync [--agents=64] [--objects=1M] [--heartbeat=1s]\n\n"
		"  --agents=N      simulated agents, each with its own connection and segment\n"
		"  --objects=N     objects put (4 KiB each, spread evenly over the agents)\n"
		"  --heartbeat=D   how often each agent heartbeats\n\n"
		"A master in this process; the agents mount (all at once), heartbeat, put\n"
		"their objects onto their own segments, then the master is replaced by a new\n"
		"one with an empty index (a failover) and every agent re-syncs as an agent\n"
		"does: Heartbeat, MountSegment with resync, inventory Heartbeats of %u\n"
		"items. Prints the mount and heartbeat figures and the re-sync time per\n"
		"million objects, then checks the index (exit status 1 if anything is\n"
		"missing or misplaced).\n",
		INV_BATCH);
}

int ctl_bench_resync_main(int argc, char **argv)
{
	uint64_t agents = 64, objects = 1000000, hb_ms = 1000;
	const char *v;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			usage(stdout);
			return CTL_EXIT_OK;
		} else if (ctl_flag_value(argc, argv, &i, "agents", &v) && v &&
			   cfg_parse_size(v, &agents) == 0 && agents && agents <= MAX_AGENTS) {
		} else if (ctl_flag_value(argc, argv, &i, "heartbeat", &v) && v &&
			   cfg_parse_duration_ms(v, &hb_ms) == 0 && hb_ms) {
		} else if (ctl_flag_value(argc, argv, &i, "objects", &v) && v &&
			   ctl_parse_count(v, &objects) == 0) {
		} else {
			usage(stderr);
			return CTL_EXIT_USAGE;
		}
	}

	int rc = CTL_EXIT_FAIL;
	uv_loop_t loop;
	struct ctl_msrv *srv = NULL;
	struct sim s = {.loop = &loop, .n = (unsigned)agents, .hb_ms = hb_ms};
	char err[512] = "";
	if (uv_loop_init(&loop))
		return CTL_EXIT_FAIL;
	s.a = calloc(s.n, sizeof(*s.a));
	if (!s.a || sim_alloc(&s, objects)) {
		fprintf(stderr, "mooncakectl bench resync: out of memory\n");
		goto out;
	}
	/* The agent TTL well above the heartbeat, as a deployment sets it. */
	if (ctl_msrv_start(MC_MAX(10 * hb_ms, 10000), &srv) ||
	    sim_connect(&s, ctl_msrv_port(srv))) {
		fprintf(stderr, "mooncakectl bench resync: cannot start a master\n");
		goto out;
	}
	printf("mooncakectl bench resync: %u agents, %" PRIu64
	       " objects of %d B, heartbeat every "
	       "%" PRIu64 " ms, master in this process (own thread and loop)\n\n",
	       s.n, objects, VALUE_BYTES, hb_ms);

	uint64_t t0 = uv_hrtime();
	s.pending = s.n;
	for (unsigned i = 0; i < s.n; i++)
		if (agent_mount(&s.a[i], false, on_mounted)) {
			sim_fail(&s, s.a[i].name, "MountSegment", "cannot issue");
			s.pending--;
		}
	sim_wait(&s);
	if (s.failed)
		goto failed;
	printf("%-34s %10.1f ms\n", "mount, all agents at once",
	       (double)(uv_hrtime() - t0) / 1e6);
	for (unsigned i = 0; i < s.n; i++)
		uv_timer_start(&s.a[i].hb, on_hb_timer, (hb_ms * i) / s.n, hb_ms);

	t0 = uv_hrtime();
	s.pending = s.n;
	for (unsigned i = 0; i < s.n; i++) {
		s.a[i].pos = 0;
		put_next(&s.a[i]);
	}
	sim_wait(&s);
	if (s.failed)
		goto failed;
	double fill_s = (double)(uv_hrtime() - t0) / 1e9;
	printf("%-34s %10.1f s  (%.0f puts/s)\n", "put, all agents at once", fill_s,
	       fill_s > 0 ? (double)objects / fill_s : 0);
	printf("%-34s %10" PRIu64 "    p50 %.0f us, p99 %.0f us, %" PRIu64
	       " asked to re-sync\n",
	       "heartbeats during the puts", s.hb_sent, ctl_lat_pct_us(&s.hb_lat, 0.5),
	       ctl_lat_pct_us(&s.hb_lat, 0.99), s.hb_resync);

	/* Failover: heartbeats stop with the old master; a new one starts
	 * with nothing, and every agent re-syncs with it. */
	for (unsigned i = 0; i < s.n; i++)
		uv_timer_stop(&s.a[i].hb);
	sim_disconnect(&s);
	ctl_msrv_stop(srv);
	srv = NULL;
	t0 = uv_hrtime();
	if (ctl_msrv_start(MC_MAX(10 * hb_ms, 10000), &srv) ||
	    sim_connect(&s, ctl_msrv_port(srv))) {
		fprintf(stderr, "mooncakectl bench resync: cannot start the new master\n");
		goto out;
	}
	s.pending = s.n;
	for (unsigned i = 0; i < s.n; i++)
		agent_resync(&s.a[i]);
	sim_wait(&s);
	if (s.failed)
		goto failed;
	double rs = (double)(uv_hrtime() - t0) / 1e9;
	printf("%-34s %10.2f s  (%.2f s per million objects)\n", "re-sync after a failover",
	       rs, objects ? rs * 1e6 / (double)objects : 0);
	printf("%-34s %10" PRIu64 "    of %" PRIu64 ", %" PRIu64 " skipped\n",
	       "inventory items accepted", s.accepted, objects, s.skipped);
	if (s.accepted != objects || s.skipped) {
		snprintf(err, sizeof(err),
			 "%" PRIu64 " of %" PRIu64 " items accepted, %" PRIu64 " skipped",
			 s.accepted, objects, s.skipped);
		goto check_failed;
	}
	if (sim_check(&s, objects, err, sizeof(err)))
		goto check_failed;
	printf("checked: the index holds every object, %u sampled keys are where their agent put "
	       "them,\n  and every segment takes new placements\n",
	       (unsigned)MC_MIN((uint64_t)SAMPLE_KEYS, objects));
	rc = CTL_EXIT_OK;
	goto out;
check_failed:
	fprintf(stderr, "mooncakectl bench resync: after the re-sync: %s\n", err);
	goto out;
failed:
	fprintf(stderr, "mooncakectl bench resync: %s\n", s.err);
out:
	if (s.a) {
		for (unsigned i = 0; i < s.n; i++)
			if (s.a[i].c) {
				rpc_client_free(s.a[i].c);
				s.a[i].c = NULL;
			}
		sim_free(&s);
	}
	ctl_msrv_stop(srv);
	(void)uv_loop_close(&loop);
	return rc;
}
