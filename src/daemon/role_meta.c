/*
 * role_meta: the meta role's glue — turns the [meta] configuration into
 * meta_options, opens the node on the role's RPC servers (client: the
 * etcd v3 services; peer: mooncake.raft.Raft), and hands the frame's stop
 * to meta_node_stop, which transfers leadership first when this member
 * leads.
 */
#include <stdlib.h>
#include <string.h>

#include "common/auth.h"
#include "common/cfg.h"
#include "daemon/daemon_int.h"
#include "meta/meta.h"

static void on_fatal(void *ud)
{
	role_fatal(ud);
}

static int meta_start(struct role_rt *rt)
{
	const struct cfg *c = role_cfg(rt);
	/* The members prove the cluster secret to each other's peer ports
	 * when one is configured: whoever else reached one could append to
	 * the replicated log. (Not the etcd API: its clients know no token.) */
	struct mc_secret sec;
	int rc = role_require_secret(
		c, rt->rpc[1], "meta member's peer port", cfg_str(c, CFG_LISTEN_PEER),
		"rewrite the replicated store (the master's election, the "
		"segment descriptors)",
		&sec);
	if (rc) {
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
