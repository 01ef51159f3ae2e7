/*
 * role_agent: the agent role's glue. It runs the transfer engine — its
 * segment (named --agent-name, or the agent-listen host:port) published
 * to meta (--meta-endpoints, --cluster-id) under a lease, reached by
 * peers over shm (same host) or TCP (--te-data-listen), the agent's gRPC
 * port serving mooncake.transfer.Transfer (descriptor fetch for P2P
 * peers) — and the agent (src/agent) on top of it: the DRAM segment
 * registered with the engine and mounted with the master, and the
 * clients' Unix socket.
 *
 * Defaults decided here, from the configuration as a whole:
 *  - the socket: --socket as given; when left at its default and
 *    /run/mooncake cannot be written, $XDG_RUNTIME_DIR/mooncake/agent.sock,
 *    else <data-dir>/agent.sock;
 *  - meta: role_meta_endpoints() (in standalone, this process's own
 *    meta); empty: no meta (the engine in P2P handshake mode);
 *  - the master: --master-address as given; when empty, the leader key
 *    in meta; without meta, this process's own master if it runs one.
 *
 * Drain: the agent's client requests in flight finish. Stop: the agent
 * (sessions closed, segment unmounted) and the engine's control plane
 * together; free: the engine (its data plane) before the agent's memory.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent/agent.h"
#include "common/auth.h"
#include "common/cfg.h"
#include "common/log.h"
#include "common/util.h"
#include "daemon/daemon_int.h"
#include "etcd/etcd.h"
#include "rpc/rpc.h"
#include "transfer/transfer.h"

#define LOG_SUBSYS LOGS_AGENT

extern const struct role_ops role_agent_ops;

struct role_agent {
	struct etcd_client *meta; /* NULL: no meta (P2P engine, fixed master) */
	struct te_engine *te;
	/* te's options and what they point to, until the agent (which
	 * starts sessions' own engines like it) has copied them */
	struct te_opts te_opts;
	struct mc_secret *sec;
	char data[128];
	struct agent *store;
	struct role_rt *rt;
	int stopping; /* parts not stopped yet */
};

/* ------------------------------------------------------------ defaults */

static bool writable_dir(const char *dir)
{
	return mc_mkdir_p(dir, 0755) == 0 && access(dir, W_OK | X_OK) == 0;
}

static void socket_path(const struct cfg *cfg, char *out, size_t len)
{
	const char *given = cfg_str(cfg, CFG_SOCKET);
	if (cfg->v[CFG_SOCKET].src != CFG_SRC_DEFAULT) {
		snprintf(out, len, "%s", given);
		return;
	}
	char dir[4096];
	snprintf(dir, sizeof(dir), "%s", given);
	char *slash = strrchr(dir, '/');
	if (slash)
		*slash = '\0';
	if (slash && writable_dir(dir)) {
		snprintf(out, len, "%s", given);
		return;
	}
	/* XDG_RUNTIME_DIR is the session's runtime directory, an interface
	 * of the system (like NOTIFY_SOCKET), not a tunable. */
	const char *xdg = getenv("XDG_RUNTIME_DIR");
	if (xdg && xdg[0] == '/') {
		snprintf(dir, sizeof(dir), "%s/mooncake", xdg);
		if (writable_dir(dir) && strlen(dir) + 12 <= len) {
			memcpy(out, dir, strlen(dir));
			memcpy(out + strlen(dir), "/agent.sock", 12);
			return;
		}
	}
	snprintf(out, len, "%s/agent.sock", cfg_str(cfg, CFG_DATA_DIR));
}

/* The master's address when this process runs it (standalone). */
static void own_master(const struct cfg *cfg, char *out, size_t len)
{
	const char *listen = cfg_str(cfg, CFG_MASTER_LISTEN);
	const char *colon = strrchr(listen, ':');
	if (strncmp(listen, "0.0.0.0:", 8) == 0 || (colon && colon == listen))
		snprintf(out, len, "127.0.0.1%s", colon);
	else
		snprintf(out, len, "%s", listen);
}

static int parse_numa(const char *s, int *node)
{
	if (!*s) {
		*node = -1;
		return 0;
	}
	char *end;
	long v = strtol(s, &end, 10);
	if (*end || end == s || v < 0 || v > 1023) {
		log_error("--numa-node=%s: expected a node number (0, 1, ...) or "
			  "empty for no binding",
			  s);
		return MC_ECONFIG;
	}
	*node = (int)v;
	return 0;
}

/* The engine's secret (mc_secret_find: configured, <data-dir>/cluster.secret
 * created at the first start, or none with --insecure-transfer). Listening
 * on anything but loopback needs a configured one. Logs its errors and,
 * at every start, where the secret came from or that there is none. */
static int find_secret(const struct cfg *c, const struct sockaddr_storage *rpc,
		       const struct sockaddr_storage *data, struct mc_secret *sec)
{
	char err[1024];
	bool public_listen = !mc_addr_is_loopback((const struct sockaddr *)rpc) ||
			     !mc_addr_is_loopback((const struct sockaddr *)data);
	int rc = mc_secret_find(c, true, public_listen, sec, err, sizeof(err));
	if (rc) {
		log_error("%s", err);
		return rc;
	}
	if (!sec->len) {
		log_warn("--insecure-transfer: the transfer engine does NOT authenticate "
			 "peers: anyone who reaches %s or its data port reads and writes "
			 "this agent's memory",
			 cfg_str(c, CFG_AGENT_LISTEN));
		return 0;
	}
	if (sec->loose)
		log_warn("cluster secret %s is readable by group or others; chmod 600 it",
			 sec->path);
	log_info("transfer engine: peers authenticated with the cluster secret %s%s",
		 sec->path, sec->created ? " (created now)" : "");
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

/* ------------------------------------------------------------ engine */

static int start_engine(struct role_rt *rt, struct role_agent *a, const char *meta)
{
	const struct cfg *c = role_cfg(rt);
	struct mc_secret *sec;
	char *data = a->data, listen[80];
	struct sockaddr_storage ss, dss;
	enum te_protocol proto;
	int gid, rc;

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
		snprintf(data, sizeof(a->data), "%s", dl);
	} else {
		snprintf(data, sizeof(a->data), "%s", listen);
		snprintf(strrchr(data, ':'),
			 sizeof(a->data) - (size_t)(strrchr(data, ':') - data), ":0");
	}
	if (mc_parse_hostport(data, &dss) != 0) {
		log_error("--te-data-listen '%s' is not a numeric host:port", data);
		return -EINVAL;
	}
	sec = malloc(sizeof(*sec));
	if (!sec)
		return -ENOMEM;
	rc = find_secret(c, &ss, &dss, sec);
	if (rc) {
		free(sec);
		return rc;
	}
	/* Its RPC port (other agents' reads of the SSD tier) wants the
	 * secret's token on every connection, as the master's and meta's
	 * do: a call read off the wire cannot be made again on another. The
	 * engine's Challenge and GetDescriptor (fresh proofs of their own)
	 * and health checks need none. */
	if (sec->len && (rc = rpc_server_require_auth(rt->rpc[0], sec->key, sec->len)) != 0) {
		log_error("cannot require the cluster secret on %s: %s", listen,
			  mc_strerror(rc));
		goto out;
	}
	const char *name = cfg_str(c, CFG_AGENT_NAME);
	if (*meta) {
		struct etcd_opts eo = {.endpoints = meta,
				       .auth_key = sec->len ? sec->key : NULL,
				       .auth_key_len = sec->len};
		rc = etcd_client_new(role_loop(rt), &eo, &a->meta);
		if (rc) {
			log_error("--meta-endpoints '%s': %s", eo.endpoints,
				  rc == -EINVAL ? "not a comma list of numeric host:port"
						: mc_strerror(rc));
			goto out;
		}
	}
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
		.rdma_mtu_bytes = strcmp(cfg_str(c, CFG_RDMA_MTU), "auto") == 0
					  ? 0
					  : (unsigned)strtoul(cfg_str(c, CFG_RDMA_MTU), NULL,
							      10),
		.cluster_secret = sec->len ? sec->key : NULL,
		.cluster_secret_len = sec->len,
		.insecure = sec->len == 0,
		.metrics = rt->metrics,
	};
	/* Before the engine exists; no client sees it before the frame
	 * listens, which is after a successful start. */
	rc = rpc_health_set(rt->health[0], "mooncake.transfer.Transfer", RPC_HEALTH_SERVING);
	if (rc)
		goto out;
	rc = te_new(&o, &a->te);
	if (rc) {
		log_error("cannot start the transfer engine: %s", mc_strerror(rc));
		a->te = NULL;
		goto out;
	}
	a->te_opts = o;
	a->sec = sec; /* until the agent copied it */
	return 0;
out:
	mc_secret_clear(sec);
	free(sec);
	return rc;
}

static void drop_secret(struct role_agent *a)
{
	if (a->sec) {
		mc_secret_clear(a->sec);
		free(a->sec);
		a->sec = NULL;
	}
	memset(&a->te_opts, 0, sizeof(a->te_opts));
}

/* The SSD tier's keys that only make sense together. */
static int check_ssd(const struct cfg *cfg)
{
	const char *path = cfg_str(cfg, CFG_SSD_PATH);
	if (!*path)
		return 0;
	if (cfg_u64(cfg, CFG_SSD_SIZE) == 0) {
		log_error("--ssd-path=%s needs --ssd-size (the space the SSD tier may take "
			  "there, e.g. --ssd-size=100G)",
			  path);
		return MC_ECONFIG;
	}
	char rp[4096], rd[4096];
	if (realpath(path, rp) && realpath(cfg_str(cfg, CFG_DATA_DIR), rd) &&
	    strcmp(rp, rd) == 0) {
		log_error("--ssd-path=%s is the data dir: give the SSD tier a directory of "
			  "its own (e.g. %s/ssd)",
			  path, cfg_str(cfg, CFG_DATA_DIR));
		return MC_ECONFIG;
	}
	return 0;
}

/*
 * This process's instance token (new, random) and those of the processes
 * before it on the data dir, which <data-dir>/agent.instance keeps (the
 * last AGENT_PREVIOUS_MAX, oldest first: one may have died before it
 * mounted); this one's is added to it. The master takes a mount naming the
 * token it knows for the agent as that agent's restart. Without one (a
 * first start, a file that cannot be read) *prev_len is 0 and the master
 * waits out the old process's --agent-ttl as before; a token that cannot
 * be kept is logged.
 */
#define INSTANCE_BYTES 16
#define INSTANCE_FILE_MAX (INSTANCE_BYTES * AGENT_PREVIOUS_MAX)
static void instance_tokens(const struct cfg *cfg, uint8_t *cur, size_t *cur_len,
			    uint8_t *prev, size_t *prev_len)
{
	const char *dir = cfg_str(cfg, CFG_DATA_DIR);
	char path[PATH_MAX];
	*cur_len = *prev_len = 0;
	if (snprintf(path, sizeof(path), "%s/agent.instance", dir) >= (int)sizeof(path))
		return;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		ssize_t n = read(fd, prev, INSTANCE_FILE_MAX);
		/* (anything else than whole tokens: none, as without a file) */
		if (n > 0 && n % INSTANCE_BYTES == 0)
			*prev_len = (size_t)n;
		close(fd);
	}
	int rc = mc_random(cur, INSTANCE_BYTES);
	if (rc == 0) {
		*cur_len = INSTANCE_BYTES;
		uint8_t keep[INSTANCE_FILE_MAX];
		size_t old = MC_MIN(*prev_len, INSTANCE_FILE_MAX - INSTANCE_BYTES);
		memcpy(keep, prev + *prev_len - old, old);
		memcpy(keep + old, cur, INSTANCE_BYTES);
		rc = mc_write_file_durably(dir, path, keep, old + INSTANCE_BYTES);
	}
	if (rc)
		log_warn("cannot keep the agent's instance token in %s: %s; after a restart "
			 "the master will wait --agent-ttl for this process's segments",
			 path, mc_strerror(rc));
}

/* ------------------------------------------------------------ hooks */

/* Also the start-up failure path: the loop has not run since te_new and
 * the RPC server never listened, so the engine may be freed unstopped
 * (its service stays registered on a server that is never served). */
static void free_parts(struct role_agent *a)
{
	/* The engine's data plane first: it reads and writes the agent's
	 * memory until it is freed. */
	if (a->te)
		te_free(a->te);
	drop_secret(a);
	agent_free(a->store);
	if (a->meta)
		etcd_client_free(a->meta);
	drop_secret(a);
	free(a);
}

static int role_agent_start(struct role_rt *rt)
{
	const struct cfg *cfg = role_cfg(rt);
	char sock[4096], master[256] = "";
	int node;
	int rc = parse_numa(cfg_str(cfg, CFG_NUMA_NODE), &node);
	if (rc)
		return rc;
	rc = check_ssd(cfg);
	if (rc)
		return rc;
	socket_path(cfg, sock, sizeof(sock));
	const char *fixed = cfg_str(cfg, CFG_MASTER_ADDRESS);
	char meta[1024];
	role_meta_endpoints(cfg, meta, sizeof(meta));
	if (*fixed)
		snprintf(master, sizeof(master), "%s", fixed);
	else if (!*meta && (cfg_roles(cfg) & CFG_ROLE_MASTER))
		own_master(cfg, master, sizeof(master));
	struct role_agent *a = calloc(1, sizeof(*a));
	if (!a)
		return -ENOMEM;
	a->rt = rt;
	rc = start_engine(rt, a, meta);
	if (rc) {
		/* The engine's service stays registered on the RPC server,
		 * which is never served: start-up failed. */
		free_parts(a);
		return rc;
	}
	const char *hp = cfg_str(cfg, CFG_HUGEPAGES);
	uint8_t inst[INSTANCE_BYTES], prev[INSTANCE_FILE_MAX];
	size_t inst_len, prev_len;
	instance_tokens(cfg, inst, &inst_len, prev, &prev_len);
	struct agent_opts o = {
		.loop = role_loop(rt),
		.metrics = rt->metrics,
		.te = a->te,
		.engine_opts = &a->te_opts,
		.rpc = rt->rpc[0],
		.rpc_listen = cfg_str(cfg, CFG_AGENT_LISTEN),
		.segment_bytes = cfg_u64(cfg, CFG_GLOBAL_SEGMENT_SIZE),
		.force_segment_size = cfg_bool(cfg, CFG_FORCE_SEGMENT_SIZE),
		.staging_bytes = cfg_u64(cfg, CFG_LOCAL_BUFFER_SIZE),
		.numa_node = node,
		.hugepages = strcmp(hp, "on") == 0    ? AGENT_HUGEPAGES_ON
			     : strcmp(hp, "off") == 0 ? AGENT_HUGEPAGES_OFF
						      : AGENT_HUGEPAGES_AUTO,
		.socket_path = sock,
		.copy_threads = (unsigned)cfg_u64(cfg, CFG_AGENT_COPY_THREADS),
		.busy_poll_us = cfg_u64(cfg, CFG_BUSY_POLL_US),
		.remote_cache_bytes = cfg_u64(cfg, CFG_REMOTE_LEASE_CACHE_SIZE),
		.lease_table_slots = (unsigned)cfg_u64(cfg, CFG_CLIENT_LEASE_TABLE),
		.put_lease_bytes = cfg_u64(cfg, CFG_PUT_LEASE_SIZE),
		.max_sessions = (unsigned)cfg_u64(cfg, CFG_CLIENT_MAX_SESSIONS),
		.max_sessions_per_uid = (unsigned)cfg_u64(cfg,
							  CFG_CLIENT_MAX_SESSIONS_PER_UID),
		.reply_buffer_bytes = cfg_u64(cfg, CFG_CLIENT_REPLY_BUFFER_SIZE),
		.max_fds = (unsigned)cfg_u64(cfg, CFG_CLIENT_MAX_FDS),
		.max_buffers = (unsigned)cfg_u64(cfg, CFG_CLIENT_MAX_BUFFERS),
		.max_views = (unsigned)cfg_u64(cfg, CFG_CLIENT_MAX_VIEWS),
		.alloc_bytes = cfg_u64(cfg, CFG_CLIENT_ALLOC_SIZE),
		.master_address = master,
		.meta_endpoints = meta,
		.cluster_id = cfg_str(cfg, CFG_CLUSTER_ID),
		.ssd_path = cfg_str(cfg, CFG_SSD_PATH),
		.ssd_bytes = cfg_u64(cfg, CFG_SSD_SIZE),
		.ssd_high_watermark = cfg_ratio(cfg, CFG_SSD_HIGH_WATERMARK_RATIO),
		.ssd_eviction_ratio = cfg_ratio(cfg, CFG_SSD_EVICTION_RATIO),
		.ssd_flush_on_stop = cfg_bool(cfg, CFG_SSD_FLUSH_ON_STOP),
		.ssd_promote_on_hit = cfg_bool(cfg, CFG_SSD_PROMOTE_ON_HIT),
		.ssd_verify_on_start = cfg_bool(cfg, CFG_SSD_VERIFY_ON_START),
		.ssd_io = cfg_str(cfg, CFG_SSD_IO),
		.ssd_sync_interval_ms = (unsigned)cfg_u64(cfg, CFG_SSD_SYNC_INTERVAL),
		.ssd_bounce_bytes = cfg_u64(cfg, CFG_SSD_BOUNCE_SIZE),
		.ssd_staging_bytes = cfg_u64(cfg, CFG_SSD_STAGING_SIZE),
		.cluster_secret = a->sec ? a->sec->key : NULL,
		.cluster_secret_len = a->sec ? a->sec->len : 0,
		.instance = inst,
		.instance_len = inst_len,
		.previous_instance = prev,
		.previous_instance_len = prev_len,
	};
	rc = agent_new(&o, &a->store);
	drop_secret(a);
	if (rc) {
		log_error("cannot start the agent: %s", mc_strerror(rc));
		a->store = NULL;
		free_parts(a);
		return rc;
	}
	rt->agent = a;
	return 0;
}

/* Both stop at once: the engine's control plane (its descriptor leaves
 * meta while meta is still up — the meta role stops right after) and the
 * agent (sessions and their own engines, unmount). The data plane serves
 * the agent's last copies until te_free. */
static void part_stopped(struct role_rt *rt)
{
	if (--rt->agent->stopping > 0)
		return;
	/* The meta client's handles close while the loop still runs; the
	 * sessions' engines used it too until the agent stopped. */
	if (rt->agent->meta) {
		etcd_client_free(rt->agent->meta);
		rt->agent->meta = NULL;
	}
	role_stopped(rt);
}

static void on_te_stopped(struct te_engine *e, void *ud)
{
	(void)e;
	part_stopped(ud);
}

static void on_agent_stopped(void *ud)
{
	part_stopped(ud);
}

static void on_agent_drained(void *ud)
{
	role_drained(ud);
}

/* Client requests in flight finish first (like gRPC calls): the engine
 * and the master link still serve them. */
static void role_agent_drain(struct role_rt *rt)
{
	agent_drain(rt->agent->store, on_agent_drained, rt);
}

static void role_agent_stop(struct role_rt *rt)
{
	rt->agent->stopping = 2;
	te_stop(rt->agent->te, on_te_stopped, rt);
	agent_stop(rt->agent->store, on_agent_stopped, rt);
}

static void role_agent_free(struct role_rt *rt)
{
	if (!rt->agent)
		return;
	free_parts(rt->agent);
	rt->agent = NULL;
}

/* The clients' counts of gets they answered from the shared lease table
 * go into the agent's metrics before they are read. */
static void role_agent_before_metrics(struct role_rt *rt)
{
	if (rt->agent && rt->agent->store)
		agent_fold_client_counts(rt->agent->store);
}

const struct role_ops role_agent_ops = {
	.start = role_agent_start,
	.drain = role_agent_drain,
	.stop = role_agent_stop,
	.free = role_agent_free,
	.before_metrics = role_agent_before_metrics,
};
