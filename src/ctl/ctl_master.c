/*
 * ctl_master: mooncakectl commands that talk to the master
 * (mooncake.master.Master):
 *
 *   mooncakectl ls [PREFIX] [--master=HOST:PORT] [--limit=N] [--long]
 *   mooncakectl stats [--master=HOST:PORT] | --agent [--socket=PATH]
 *
 * A standby answers UNAVAILABLE naming the leader ("-807 not the leader:
 * leader=HOST:PORT view=N"); these commands follow that redirect.
 * Also the helper ctl_master_call used by `bench master`.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "common/auth.h"
#include "common/util.h"
#include "ctl/ctl_int.h"
#include "master.pb-c.h"
#include "rpc/rpc.h"

#define DEFAULT_MASTER "127.0.0.1:50051"
#define CALL_TIMEOUT_MS 10000
#define MAX_REDIRECTS 3
#define SECRET_HELP \
	"--cluster-secret-file (default $MOONCAKE_CLUSTER_SECRET_FILE): the secret a\n" \
	"  master started with one requires of its callers.\n"

struct mconn {
	uv_loop_t loop;
	struct rpc_client *c;
	char addr[128];
};

/* The cluster secret for a server that requires it: the command's
 * --cluster-secret-file, else $MOONCAKE_CLUSTER_SECRET_FILE; neither: the
 * calls carry no token (a server without a secret takes them). */
static const char *secret_path;

void ctl_secret_file(const char *path)
{
	secret_path = path;
}

int ctl_rpc_client(uv_loop_t *loop, const char *addr, const struct rpc_client_opts *base,
		   struct rpc_client **out)
{
	const char *path = secret_path ? secret_path : getenv("MOONCAKE_CLUSTER_SECRET_FILE");
	struct rpc_client_opts o = {.max_message_bytes = 256u << 20};
	if (base)
		o = *base;
	struct mc_secret sec = {.len = 0};
	if (path && *path) {
		bool loose;
		int rc = mc_secret_load(path, sec.key, &sec.len, &loose);
		if (rc) {
			fprintf(stderr, "mooncakectl: cluster secret %s: %s\n", path,
				mc_strerror(rc));
			return rc;
		}
		o.auth_key = sec.key;
		o.auth_key_len = sec.len;
	}
	int rc = rpc_client_new(loop, addr, &o, out);
	mc_secret_clear(&sec);
	if (rc == -EINVAL)
		fprintf(stderr, "mooncakectl: bad address \"%s\"\n", addr);
	return rc;
}

static int mconn_open(struct mconn *mc, const char *addr)
{
	memset(mc, 0, sizeof(*mc));
	if (uv_loop_init(&mc->loop))
		return -ENOMEM;
	snprintf(mc->addr, sizeof(mc->addr), "%s", addr);
	int rc = ctl_rpc_client(&mc->loop, addr, NULL, &mc->c);
	if (rc)
		(void)uv_loop_close(&mc->loop);
	return rc;
}

static void mconn_close(struct mconn *mc)
{
	rpc_client_free(mc->c);
	uv_run(&mc->loop, UV_RUN_DEFAULT);
	(void)uv_loop_close(&mc->loop);
}

/* Unary call following standby redirects. Returns the gRPC status. */
static int mcall(struct mconn *mc, const char *method, const ProtobufCMessage *req,
		 const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **resp,
		 char *err, size_t errlen)
{
	char path[96];
	snprintf(path, sizeof(path), "/mooncake.master.Master/%s", method);
	for (int i = 0;; i++) {
		int st = rpc_client_unary_sync(mc->c, path, req, resp_desc, CALL_TIMEOUT_MS,
					       resp, err, errlen);
		const char *l = st == RPC_UNAVAILABLE ? strstr(err, "leader=") : NULL;
		if (!l || i == MAX_REDIRECTS)
			return st;
		char addr[128];
		size_t n = strcspn(l + 7, " ");
		if (n == 0 || n >= sizeof(addr) || strncmp(l + 7, "none", 4) == 0)
			return st;
		memcpy(addr, l + 7, n);
		addr[n] = '\0';
		if (strcmp(addr, mc->addr) == 0)
			return st;
		struct rpc_client *c;
		if (ctl_rpc_client(&mc->loop, addr, NULL, &c) != 0)
			return st;
		fprintf(stderr, "mooncakectl: %s is a standby; asking the leader %s\n",
			mc->addr, addr);
		rpc_client_free(mc->c);
		mc->c = c;
		snprintf(mc->addr, sizeof(mc->addr), "%s", addr);
	}
}

static void print_key(FILE *f, const uint8_t *k, size_t len)
{
	for (size_t i = 0; i < len; i++) {
		if (k[i] > 0x20 && k[i] < 0x7f && k[i] != '\\')
			fputc(k[i], f);
		else
			fprintf(f, "\\x%02x", k[i]);
	}
}

/* ------------------------------------------------------------ ls */

static void ls_usage(FILE *f)
{
	fprintf(f,
		"usage: mooncakectl ls [PREFIX] [--master=HOST:PORT] [--limit=N] [--long]\n"
		"           [--cluster-secret-file=FILE]\n\n"
		"  Keys in the master's index that start with PREFIX, in byte order, one per\n"
		"  line (bytes outside printable ASCII as \\xNN). --limit is the page size of\n"
		"  each List call (all keys are printed). --long adds size, replicas, state,\n"
		"  soft pin and the read lease left. Default master: " DEFAULT_MASTER "\n"
		"  " SECRET_HELP);
}

int ctl_ls_main(int argc, char **argv)
{
	const char *addr = DEFAULT_MASTER, *prefix = "", *v;
	unsigned long limit = 1000;
	bool longfmt = false, ok;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			ls_usage(stdout);
			return CTL_EXIT_OK;
		} else if (ctl_flag_value(argc, argv, &i, "master", &v)) {
			if (!v || !*v)
				goto usage;
			addr = v;
		} else if (ctl_flag_value(argc, argv, &i, "cluster-secret-file", &v) && v &&
			   *v) {
			secret_path = v;
		} else if (ctl_flag_value(argc, argv, &i, "limit", &v)) {
			char *end;
			limit = v ? strtoul(v, &end, 10) : 0;
			if (!v || *end || limit == 0 || limit > 100000)
				goto usage;
		} else if (ctl_flag_bool(argv[i], "long", &longfmt, &ok)) {
			if (!ok)
				goto usage;
		} else if (strncmp(argv[i], "--", 2) != 0 && !*prefix) {
			prefix = argv[i];
		} else {
			goto usage;
		}
	}
	struct mconn mc;
	if (mconn_open(&mc, addr)) {
		fprintf(stderr, "mooncakectl ls: bad --master \"%s\"\n", addr);
		return CTL_EXIT_USAGE;
	}
	int rc = CTL_EXIT_OK;
	uint8_t *after = NULL;
	size_t alen = 0;
	for (;;) {
		Mooncake__Master__ListRequest req = MOONCAKE__MASTER__LIST_REQUEST__INIT;
		req.prefix.data = (uint8_t *)prefix;
		req.prefix.len = strlen(prefix);
		req.start_after.data = after;
		req.start_after.len = alen;
		req.limit = (uint32_t)limit;
		ProtobufCMessage *out = NULL;
		char err[512] = "";
		int st = mcall(&mc, "List", &req.base,
			       &mooncake__master__list_response__descriptor, &out, err,
			       sizeof(err));
		if (st != RPC_OK) {
			fprintf(stderr, "mooncakectl ls: %s: %s %s\n", mc.addr,
				rpc_status_name(st), err);
			rc = CTL_EXIT_FAIL;
			break;
		}
		Mooncake__Master__ListResponse *r = (void *)out;
		for (size_t i = 0; i < r->n_items; i++) {
			const Mooncake__Master__ListItem *it = r->items[i];
			print_key(stdout, it->key.data, it->key.len);
			if (longfmt)
				printf("\t%" PRIu64 "\t%u\t%s%s\t%" PRIu64 "ms", it->size,
				       it->replicas, it->complete ? "complete" : "pending",
				       it->soft_pin ? ",pinned" : "", it->lease_ms);
			putchar('\n');
		}
		bool more = r->more && r->n_items;
		if (more) {
			const ProtobufCBinaryData *last = &r->items[r->n_items - 1]->key;
			free(after);
			after = malloc(last->len);
			if (!after) {
				protobuf_c_message_free_unpacked(out, NULL);
				rc = CTL_EXIT_FAIL;
				break;
			}
			memcpy(after, last->data, last->len);
			alen = last->len;
		}
		protobuf_c_message_free_unpacked(out, NULL);
		if (!more)
			break;
	}
	free(after);
	mconn_close(&mc);
	return rc;
usage:
	ls_usage(stderr);
	return CTL_EXIT_USAGE;
}

/* ------------------------------------------------------------ stats */

static void stats_usage(FILE *f)
{
	fprintf(f,
		"usage: mooncakectl stats [--master=HOST:PORT] [--cluster-secret-file=FILE]\n"
		"       mooncakectl stats --agent [--socket=PATH]\n\n"
		"  The master's view, object count, DRAM capacity and usage, index memory per\n"
		"  object, counters, and one line per mounted segment.\n"
		"  Default master: " DEFAULT_MASTER "\n"
		"  " SECRET_HELP
		"  --agent (or --socket=PATH): the local agent's own figures instead: its\n"
		"  segment, the master it uses, open sessions, buffers and views, puts, gets,\n"
		"  hits and bytes since it started. Without --socket: $MOONCAKE_SOCKET,\n"
		"  /run/mooncake/agent.sock, $XDG_RUNTIME_DIR/mooncake/agent.sock.\n");
}

int ctl_master_dram_segments(const char *addr, unsigned *ready)
{
	struct mconn mc;
	if (mconn_open(&mc, addr))
		return -EINVAL;
	Mooncake__Master__StatsRequest req = MOONCAKE__MASTER__STATS_REQUEST__INIT;
	ProtobufCMessage *out = NULL;
	char err[512];
	int st = mcall(&mc, "Stats", &req.base, &mooncake__master__stats_response__descriptor,
		       &out, err, sizeof(err));
	mconn_close(&mc);
	if (st != RPC_OK)
		return MC_EUNAVAILABLE;
	const Mooncake__Master__StatsResponse *r = (void *)out;
	*ready = 0;
	for (size_t i = 0; i < r->n_segments; i++)
		*ready += r->segments[i]->segment->tier != MOONCAKE__MASTER__TIER__TIER_SSD &&
			  !r->segments[i]->syncing;
	protobuf_c_message_free_unpacked(out, NULL);
	return 0;
}

int ctl_stats_main(int argc, char **argv)
{
	const char *addr = NULL, *socket = NULL, *v;
	bool agent = false, b, ok;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			stats_usage(stdout);
			return CTL_EXIT_OK;
		} else if (ctl_flag_value(argc, argv, &i, "master", &v) && v && *v) {
			addr = v;
		} else if (ctl_flag_value(argc, argv, &i, "cluster-secret-file", &v) && v &&
			   *v) {
			secret_path = v;
		} else if (ctl_flag_value(argc, argv, &i, "socket", &v) && v && *v) {
			socket = v;
			agent = true;
		} else if (ctl_flag_bool(argv[i], "agent", &b, &ok) && ok) {
			agent = b;
		} else {
			stats_usage(stderr);
			return CTL_EXIT_USAGE;
		}
	}
	if (agent && addr) {
		fprintf(stderr, "mooncakectl stats: --master or --agent, not both\n");
		return CTL_EXIT_USAGE;
	}
	if (agent)
		return ctl_agent_stats(socket);
	if (!addr)
		addr = DEFAULT_MASTER;
	struct mconn mc;
	if (mconn_open(&mc, addr)) {
		fprintf(stderr, "mooncakectl stats: bad --master \"%s\"\n", addr);
		return CTL_EXIT_USAGE;
	}
	Mooncake__Master__StatsRequest req = MOONCAKE__MASTER__STATS_REQUEST__INIT;
	ProtobufCMessage *out = NULL;
	char err[512] = "";
	int st = mcall(&mc, "Stats", &req.base, &mooncake__master__stats_response__descriptor,
		       &out, err, sizeof(err));
	if (st != RPC_OK) {
		fprintf(stderr, "mooncakectl stats: %s: %s %s\n", mc.addr, rpc_status_name(st),
			err);
		mconn_close(&mc);
		return CTL_EXIT_FAIL;
	}
	const Mooncake__Master__StatsResponse *r = (void *)out;
	printf("leader %s\nview %" PRIu64 "\nagents %" PRIu64 "\nobjects %" PRIu64
	       "\npending %" PRIu64 "\ncapacity_bytes %" PRIu64 "\nused_bytes %" PRIu64
	       "\nused_ratio %.4f\nindex_bytes %" PRIu64 "\nkey_bytes %" PRIu64
	       "\nbytes_per_object %.1f\nputs %" PRIu64 "\ngets %" PRIu64 "\nhits %" PRIu64
	       "\nmisses %" PRIu64 "\nevictions %" PRIu64 "\nlease_waits %" PRIu64
	       "\nput_timeouts %" PRIu64 "\nleased_bytes %" PRIu64 "\ncommits %" PRIu64
	       "\ncommit_refusals %" PRIu64 "\n",
	       r->leader, r->view, r->agents, r->objects, r->pending, r->capacity, r->used,
	       r->capacity ? (double)r->used / (double)r->capacity : 0.0, r->index_bytes,
	       r->key_bytes, r->bytes_per_object, r->puts, r->gets, r->hits, r->misses,
	       r->evictions, r->lease_waits, r->put_timeouts, r->leased, r->commits,
	       r->commit_refusals);
	printf("ssd_capacity_bytes %" PRIu64 "\nssd_used_bytes %" PRIu64
	       "\nssd_objects %" PRIu64 "\ndemotions %" PRIu64 "\ndemoting %" PRIu64
	       "\ndemotion_failures %" PRIu64 "\npromotions %" PRIu64
	       "\nssd_evictions %" PRIu64 "\n",
	       r->ssd_capacity, r->ssd_used, r->ssd_objects, r->demotions, r->demoting,
	       r->demotion_failures, r->promotions, r->ssd_evictions);
	printf("%-24s %-16s %-5s %14s %14s %12s %10s %8s %s\n", "segment", "agent", "tier",
	       "size", "used", "leased", "replicas", "frag", "state");
	for (size_t i = 0; i < r->n_segments; i++) {
		const Mooncake__Master__SegmentStats *s = r->segments[i];
		printf("%-24s %-16s %-5s %14" PRIu64 " %14" PRIu64 " %12" PRIu64 " %10" PRIu64
		       " %8.4f %s\n",
		       s->segment->name, s->segment->agent_id,
		       s->segment->tier == MOONCAKE__MASTER__TIER__TIER_SSD ? "ssd" : "dram",
		       s->segment->size, s->used, s->leased, s->replicas, s->fragmentation,
		       s->syncing ? "re-syncing" : "ready");
	}
	protobuf_c_message_free_unpacked(out, NULL);
	mconn_close(&mc);
	return CTL_EXIT_OK;
}
