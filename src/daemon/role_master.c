/*
 * role_master: the master role's glue — builds the master (src/master)
 * from the configuration on the role's RPC server, resigns leadership
 * when shutdown begins, frees it after the loop.
 *
 * The master campaigns at role_meta_endpoints(): in standalone, the
 * process's own meta.
 */
#include <stdlib.h>

#include "common/auth.h"
#include "common/cfg.h"
#include "common/log.h"
#include "common/util.h"
#include "daemon/daemon_int.h"
#include "master/master.h"
#include "rpc/rpc.h"

#define LOG_SUBSYS LOGS_MASTER

extern const struct role_ops role_master_ops;

static int master_start(struct role_rt *rt)
{
	const struct cfg *cfg = role_cfg(rt);
	/* Callers of the master's API prove the cluster secret when one is
	 * configured (role_require_secret); the master proves it to meta. */
	struct mc_secret sec;
	int rc = role_require_secret(cfg, rt->rpc[0], "master's API",
				     cfg_str(cfg, CFG_MASTER_LISTEN),
				     "remove every object or mount segments", &sec);
	if (rc) {
		mc_secret_clear(&sec);
		return rc;
	}
	char meta[1024];
	role_meta_endpoints(cfg, meta, sizeof(meta));
	struct master_opts o = {
		.loop = role_loop(rt),
		.rpc = rt->rpc[0],
		.health = rt->health[0],
		.metrics = rt->metrics,
		.advertise = cfg_str(cfg, CFG_MASTER_ADVERTISE),
		.listen = cfg_str(cfg, CFG_MASTER_LISTEN),
		.cluster_id = cfg_str(cfg, CFG_CLUSTER_ID),
		.meta_endpoints = meta,
		.agent_ttl_ms = cfg_u64(cfg, CFG_AGENT_TTL),
		.put_timeout_ms = cfg_u64(cfg, CFG_PUT_TIMEOUT),
		.lease_ttl_ms = cfg_u64(cfg, CFG_DEFAULT_KV_LEASE_TTL),
		.leader_lease_ttl_ms = cfg_u64(cfg, CFG_LEADER_LEASE_TTL),
		.high_watermark = cfg_ratio(cfg, CFG_EVICTION_HIGH_WATERMARK_RATIO),
		.eviction_ratio = cfg_ratio(cfg, CFG_EVICTION_RATIO),
		.mirror_log_bytes = cfg_u64(cfg, CFG_MIRROR_LOG_SIZE),
		.meta_key = sec.len ? sec.key : NULL,
		.meta_key_len = sec.len,
	};
	rc = master_new(&o, &rt->master);
	mc_secret_clear(&sec);
	if (rc)
		log_error("cannot start the master: %s", mc_strerror(rc));
	return rc;
}

static void on_master_stopped(void *ud)
{
	role_stopped(ud);
}

static void master_stop_hook(struct role_rt *rt)
{
	master_stop(rt->master, on_master_stopped, rt);
}

static void master_free_hook(struct role_rt *rt)
{
	master_free(rt->master);
	rt->master = NULL;
}

const struct role_ops role_master_ops = {
	.start = master_start,
	.stop = master_stop_hook,
	.free = master_free_hook,
};
