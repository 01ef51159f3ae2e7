/*
 * role_agent: the agent role's glue. It runs the transfer engine: its
 * segment (named --agent-name, or the agent-listen host:port) is published
 * to meta (--meta-endpoints, --cluster-id) under a lease, peers reach it
 * over shm (same host) or TCP (--te-data-listen), and the agent's gRPC
 * port serves mooncake.transfer.Transfer (descriptor fetch for P2P peers).
 * The agent's own cache segments, master client and client socket plug in
 * here later; the engine API (transfer.h) is what they will use.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/auth.h"
#include "common/cfg.h"
#include "common/log.h"
#include "common/util.h"
#include "daemon/daemon_int.h"
#include "etcd/etcd.h"
#include "rpc/rpc.h"
#include "transfer/transfer.h"

#define LOG_SUBSYS LOGS_AGENT

struct role_agent {
	struct etcd_client *meta;
	struct te_engine *te;
};

/* --cluster-secret-file into buf (len 0: none). Logs its errors. */
static int load_secret(const struct cfg *c, uint8_t *buf, size_t *len)
{
	const char *path = cfg_str(c, CFG_CLUSTER_SECRET_FILE);
	bool loose = false;
	*len = 0;
	if (!*path)
		return 0;
	int rc = mc_secret_load(path, buf, len, &loose);
	if (rc) {
		log_error("cannot use --cluster-secret-file %s: %s", path,
			  rc == -EINVAL  ? "the file is empty"
			  : rc == -EFBIG ? "larger than 4096 bytes"
					 : mc_strerror(rc));
		return rc;
	}
	if (loose)
		log_warn("--cluster-secret-file %s is readable by group or others; "
			 "chmod 600 it",
			 path);
	return 0;
}

static int parse_gid_index(const char *s, int *out)
{
	if (strcmp(s, "auto") == 0) {
		*out = -1;
		return 0;
	}
	char *end;
	long v = strtol(s, &end, 10);
	if (!*s || *end || v < 0 || v > 255)
		return -EINVAL;
	*out = (int)v;
	return 0;
}

static int agent_start(struct role_rt *rt)
{
	const struct cfg *c = role_cfg(rt);
	uint8_t secret[MC_SECRET_MAX_BYTES];
	size_t slen;
	char data[128], listen[80];
	struct sockaddr_storage ss;
	enum te_protocol proto;
	int gid, rc;

	rc = load_secret(c, secret, &slen);
	if (rc)
		return rc;
	if (parse_gid_index(cfg_str(c, CFG_RDMA_GID_INDEX), &gid) != 0) {
		log_error("--rdma-gid-index '%s' is not auto or 0-255",
			  cfg_str(c, CFG_RDMA_GID_INDEX));
		return -EINVAL;
	}
	if (te_protocol_parse(cfg_str(c, CFG_PROTOCOL), &proto) != 0)
		return -EINVAL; /* the key table already checked it */
	if (mc_parse_hostport(cfg_str(c, CFG_AGENT_LISTEN), &ss) != 0)
		return -EINVAL;
	mc_format_addr((struct sockaddr *)&ss, listen, sizeof(listen));
	uint16_t rpc_port = (uint16_t)strtoul(strrchr(listen, ':') + 1, NULL, 10);
	const char *dl = cfg_str(c, CFG_TE_DATA_LISTEN);
	if (*dl) {
		snprintf(data, sizeof(data), "%s", dl);
	} else {
		snprintf(data, sizeof(data), "%s", listen);
		snprintf(strrchr(data, ':'), sizeof(data) - (size_t)(strrchr(data, ':') - data),
			 ":0");
	}
	const char *name = cfg_str(c, CFG_AGENT_NAME);

	struct role_agent *a = calloc(1, sizeof(*a));
	if (!a)
		return -ENOMEM;
	struct etcd_opts eo = {.endpoints = cfg_str(c, CFG_META_ENDPOINTS)};
	rc = etcd_client_new(role_loop(rt), &eo, &a->meta);
	if (rc) {
		log_error("--meta-endpoints '%s': %s", eo.endpoints,
			  rc == -EINVAL ? "not a comma list of numeric host:port"
					: mc_strerror(rc));
		goto fail;
	}
	/* Before the engine exists: once it does, only te_stop on the
	 * running loop can take it down again. No client sees this before
	 * the frame listens, which is after a successful start. */
	rc = rpc_health_set(rt->health[0], "mooncake.transfer.Transfer",
			    RPC_HEALTH_SERVING);
	if (rc)
		goto fail_meta;
	uint64_t ttl_ms = cfg_u64(c, CFG_TE_LEASE_TTL);
	struct te_opts o = {
		.loop = role_loop(rt),
		.segment_name = *name ? name : listen,
		.cluster_id = cfg_str(c, CFG_CLUSTER_ID),
		.meta = a->meta,
		.rpc = rt->rpc[0],
		.rpc_port = rpc_port,
		.data_listen = data,
		.protocol = proto,
		.threads = (unsigned)cfg_u64(c, CFG_TE_THREADS),
		.tcp_conns = (unsigned)cfg_u64(c, CFG_TE_TCP_CONNS),
		.slice_bytes = (size_t)cfg_u64(c, CFG_TE_SLICE_SIZE),
		.io_timeout_ms = cfg_u64(c, CFG_TE_IO_TIMEOUT),
		.lease_ttl_s = (ttl_ms + 999) / 1000,
		.rdma_devices = cfg_str(c, CFG_RDMA_DEVICES),
		.rdma_gid_index = gid,
		.cluster_secret = slen ? secret : NULL,
		.cluster_secret_len = slen,
		.metrics = rt->metrics,
	};
	rc = te_new(&o, &a->te);
	memset(secret, 0, sizeof(secret));
	if (rc) {
		log_error("cannot start the transfer engine: %s", mc_strerror(rc));
		goto fail_meta;
	}
	rt->agent = a;
	return 0;

fail_meta:
	etcd_client_free(a->meta);
fail:
	free(a);
	return rc;
}

static void on_te_stopped(struct te_engine *e, void *ud)
{
	struct role_rt *rt = ud;
	(void)e;
	etcd_client_free(rt->agent->meta);
	rt->agent->meta = NULL;
	role_stopped(rt);
}

static void agent_stop(struct role_rt *rt)
{
	te_stop(rt->agent->te, on_te_stopped, rt);
}

static void agent_free(struct role_rt *rt)
{
	struct role_agent *a = rt->agent;
	if (!a)
		return;
	te_free(a->te);
	if (a->meta)
		etcd_client_free(a->meta);
	free(a);
	rt->agent = NULL;
}

const struct role_ops role_agent_ops = {
	.start = agent_start,
	.stop = agent_stop,
	.free = agent_free,
};
