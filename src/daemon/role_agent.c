/*
 * role_agent: the agent role's glue — builds the agent (src/agent) from
 * the configuration on the role's RPC server, stops it (sessions closed,
 * segment unmounted) when shutdown begins, frees it after the loop.
 *
 * Defaults decided here, from the configuration as a whole:
 *  - the socket: --socket as given; when left at its default and
 *    /run/mooncake cannot be written, $XDG_RUNTIME_DIR/mooncake/agent.sock,
 *    else <data-dir>/agent.sock;
 *  - the master: --master-address as given; when empty and this process
 *    runs the master role too with --meta-endpoints left at its default
 *    (standalone), this process's own master; else the leader key in meta.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent/agent.h"
#include "common/cfg.h"
#include "common/log.h"
#include "common/util.h"
#include "daemon/daemon_int.h"

#define LOG_SUBSYS LOGS_AGENT

extern const struct role_ops role_agent_ops;

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
			  "empty for no binding", s);
		return MC_ECONFIG;
	}
	*node = (int)v;
	return 0;
}

static int agent_start(struct role_rt *rt)
{
	const struct cfg *cfg = role_cfg(rt);
	char sock[4096], master[256] = "";
	int node;
	int rc = parse_numa(cfg_str(cfg, CFG_NUMA_NODE), &node);
	if (rc)
		return rc;
	socket_path(cfg, sock, sizeof(sock));
	const char *fixed = cfg_str(cfg, CFG_MASTER_ADDRESS);
	const char *meta = cfg_str(cfg, CFG_META_ENDPOINTS);
	if (*fixed) {
		snprintf(master, sizeof(master), "%s", fixed);
	} else if ((cfg_roles(cfg) & CFG_ROLE_MASTER) &&
		   cfg->v[CFG_META_ENDPOINTS].src == CFG_SRC_DEFAULT) {
		own_master(cfg, master, sizeof(master));
		meta = "";
	}
	const char *hp = cfg_str(cfg, CFG_HUGEPAGES);
	struct agent_opts o = {
		.loop = role_loop(rt),
		.metrics = rt->metrics,
		.rpc = rt->rpc[0],
		.rpc_listen = cfg_str(cfg, CFG_AGENT_LISTEN),
		.segment_bytes = cfg_u64(cfg, CFG_GLOBAL_SEGMENT_SIZE),
		.staging_bytes = cfg_u64(cfg, CFG_LOCAL_BUFFER_SIZE),
		.numa_node = node,
		.hugepages = strcmp(hp, "on") == 0    ? AGENT_HUGEPAGES_ON
			     : strcmp(hp, "off") == 0 ? AGENT_HUGEPAGES_OFF
						      : AGENT_HUGEPAGES_AUTO,
		.socket_path = sock,
		.copy_threads = (unsigned)cfg_u64(cfg, CFG_AGENT_COPY_THREADS),
		.master_address = master,
		.meta_endpoints = meta,
		.cluster_id = cfg_str(cfg, CFG_CLUSTER_ID),
	};
	rc = agent_new(&o, &rt->agent);
	if (rc)
		log_error("cannot start the agent: %s", mc_strerror(rc));
	return rc;
}

static void on_agent_stopped(void *ud)
{
	role_stopped(ud);
}

static void agent_stop_hook(struct role_rt *rt)
{
	agent_stop(rt->agent, on_agent_stopped, rt);
}

static void agent_free_hook(struct role_rt *rt)
{
	agent_free(rt->agent);
	rt->agent = NULL;
}

const struct role_ops role_agent_ops = {
	.start = agent_start,
	.stop = agent_stop_hook,
	.free = agent_free_hook,
};
