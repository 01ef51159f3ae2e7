/*
 * role_meta: the meta role's glue — turns the [meta] configuration into
 * meta_options, opens the node on the role's RPC servers (client: the
 * etcd v3 services; peer: mooncake.raft.Raft), and hands the frame's stop
 * to meta_node_stop, which transfers leadership first when this member
 * leads.
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/auth.h"
#include "common/cfg.h"
#include "common/log.h"
#include "daemon/daemon_int.h"
#include "common/util.h"
#include "meta/meta.h"
#include "rpc/rpc.h"

#define LOG_SUBSYS LOGS_META

static void on_fatal(void *ud)
{
	role_fatal(ud);
}

/* Callers of the etcd API (--listen-client) prove the cluster secret
 * when one is configured, unless --client-auth=none: the daemons with a
 * token per connection, etcd's clients with a bearer token from
 * Authenticate (svc_auth.c) in their "token" header. *open: it is not
 * checked. */
static int client_auth(struct role_rt *rt, const struct cfg *c, struct mc_secret *sec,
		       bool *open)
{
	const char *listen = cfg_str(c, CFG_LISTEN_CLIENT);
	sec->len = 0;
	*open = strcmp(cfg_str(c, CFG_CLIENT_AUTH), "none") == 0;
	if (*open) {
		log_warn("--client-auth=none: the etcd API on %s is open to anyone who "
			 "reaches it (they can rewrite the master's election and the segment "
			 "descriptors)",
			 listen);
		return 0;
	}
	int rc = role_require_secret(c, rt->rpc[0], "meta member's etcd API", listen,
				     "rewrite the replicated store (the master's election, "
				     "the segment descriptors); --client-auth=none opens it "
				     "on purpose",
				     sec);
	if (rc == 0 && sec->len && (rc = rpc_server_accept_bearer(rt->rpc[0], "token")))
		log_error("meta: cannot take etcd auth tokens: %s", mc_strerror(rc));
	*open = sec->len == 0;
	return rc;
}

static int meta_start(struct role_rt *rt)
{
	const struct cfg *c = role_cfg(rt);
	/* The members prove the cluster secret to each other's peer ports
	 * when one is configured: whoever else reached one could append to
	 * the replicated log. */
	struct mc_secret sec, csec;
	bool open;
	int rc = client_auth(rt, c, &csec, &open);
	if (rc == 0)
		rc = role_require_secret(
			c, rt->rpc[1], "meta member's peer port", cfg_str(c, CFG_LISTEN_PEER),
			"rewrite the replicated store (the master's election, the "
			"segment descriptors)",
			&sec);
	if (rc) {
		mc_secret_clear(&csec);
		mc_secret_clear(&sec);
		return rc;
	}
	struct meta_options o = {
		.data_dir = cfg_str(c, CFG_DATA_DIR),
		.name = cfg_str(c, CFG_NAME),
		.initial_cluster = cfg_str(c, CFG_INITIAL_CLUSTER),
		.join_existing = strcmp(cfg_str(c, CFG_INITIAL_CLUSTER_STATE), "existing") ==
				 0,
		.listen_peer = cfg_str(c, CFG_LISTEN_PEER),
		.listen_client = cfg_str(c, CFG_LISTEN_CLIENT),
		.advertise_peer = cfg_str(c, CFG_ADVERTISE_PEER),
		.advertise_client = cfg_str(c, CFG_ADVERTISE_CLIENT),
		.heartbeat_ms = cfg_u64(c, CFG_HEARTBEAT_INTERVAL),
		.election_ms = cfg_u64(c, CFG_ELECTION_TIMEOUT),
		.snapshot_count = cfg_u64(c, CFG_SNAPSHOT_COUNT),
		.max_request_bytes = cfg_u64(c, CFG_MAX_REQUEST_BYTES),
		.quota_backend_bytes = cfg_u64(c, CFG_QUOTA_BACKEND_BYTES),
		.auto_compaction_mode = cfg_str(c, CFG_AUTO_COMPACTION_MODE),
		.auto_compaction_retention = cfg_str(c, CFG_AUTO_COMPACTION_RETENTION),
		.progress_notify_ms = cfg_u64(c, CFG_WATCH_PROGRESS_NOTIFY_INTERVAL),
		.max_message_bytes = cfg_u64(c, CFG_RPC_MAX_MESSAGE_SIZE),
		.peer_key = sec.len ? sec.key : NULL,
		.peer_key_len = sec.len,
		.client_key = open ? NULL : csec.key,
		.client_key_len = open ? 0 : csec.len,
		.auth_token_ttl_ms = cfg_u64(c, CFG_AUTH_TOKEN_TTL),
		.client_srv = rt->rpc[0],
		.peer_srv = rt->rpc[1],
		.client_health = rt->health[0],
		.peer_health = rt->health[1],
		.metrics = rt->metrics,
		.on_fatal = on_fatal,
		.ud = rt,
	};
	struct meta_node *n;
	rc = meta_node_new(role_loop(rt), &o, &n);
	mc_secret_clear(&sec);
	mc_secret_clear(&csec);
	if (rc)
		return rc;
	rt->meta = n;
	return 0;
}

static void on_stopped(void *ud)
{
	role_stopped(ud);
}

static void meta_stop(struct role_rt *rt)
{
	meta_node_stop(rt->meta, on_stopped, rt);
}

static void meta_free(struct role_rt *rt)
{
	meta_node_free(rt->meta);
	rt->meta = NULL;
}

const struct role_ops role_meta_ops = {
	.start = meta_start,
	.stop = meta_stop,
	.free = meta_free,
};
