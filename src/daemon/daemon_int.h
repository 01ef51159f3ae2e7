/*
 * daemon_int: what the process frame shares with the role glue files
 * (src/daemon/role_<name>.c). Each glue file turns one role subsystem
 * (meta, master, agent) into a set of hooks the frame calls; the role
 * subsystems themselves know nothing of the frame.
 */
#ifndef MC_DAEMON_DAEMON_INT_H
#define MC_DAEMON_DAEMON_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <uv.h>

#include "common/cfg.h"
#include "common/err.h"

#define MAX_RPC 2

struct daemon;
struct role_def;
struct role_rt;
struct metrics_registry;
struct rpc_server;
struct rpc_health;
struct http_server;
struct master;
struct meta_node;
struct role_agent;

/*
 * A role's own services, plugged into its frame. Each hook is optional
 * (NULL: nothing to do).
 *   start  runs once the role's RPC servers, health services and metrics
 *          registry exist and before the servers listen: register the
 *          role's services (and set their health SERVING), start timers.
 *          A non-zero return fails start-up (the role logged why).
 *   drain  runs first when shutdown begins, for every role at once: take
 *          no new work from local clients and finish what is in flight
 *          (the agent's client requests), while every role still serves.
 *          It must call role_drained(rt) exactly once, now or later; the
 *          frame waits for every role's (bounded by --shutdown-timeout)
 *          before the stop hooks run.
 *   stop   runs after the drain, before RPC calls are drained: end
 *          what must end while peers can still be reached (leader
 *          transfer, giving up a lease, unpublishing). It must call
 *          role_stopped(rt) exactly once, now or later; the frame waits
 *          for it (bounded by --shutdown-timeout) before draining calls.
 *   free   runs after the loop ended: free what start made.
 * A role that hits an error it cannot serve through (a corrupt WAL, say)
 * calls role_fatal(rt): the process shuts down and exits with status 1.
 */
struct role_ops {
	int (*start)(struct role_rt *rt);
	void (*drain)(struct role_rt *rt);
	void (*stop)(struct role_rt *rt);
	void (*free)(struct role_rt *rt);
	/* Before /metrics is served (NULL: nothing to do). */
	void (*before_metrics)(struct role_rt *rt);
};

/* A running role: its frame (RPC servers with health, HTTP endpoint,
 * metrics registry) and the role's own objects. */
struct role_rt {
	/* the frame's */
	const struct role_def *def;
	struct daemon *d;
	struct metrics_registry *metrics;
	struct rpc_server *rpc[MAX_RPC];
	struct rpc_health *health[MAX_RPC];
	struct http_server *http;
	bool started;  /* ops.start returned 0: ops.free is owed */
	bool draining; /* ops.drain ran, role_drained not yet */
	bool stopping; /* ops.stop ran, role_stopped not yet */
	/* The role's own objects, made by ops.start and freed by ops.free. */
	struct master *master;
	struct meta_node *meta;
	struct role_agent *agent;
};

/* The roles' hooks (src/daemon/role_<name>.c). */
extern const struct role_ops role_meta_ops;
extern const struct role_ops role_master_ops;
extern const struct role_ops role_agent_ops;

/* The loop and configuration every role runs with. */
uv_loop_t *role_loop(const struct role_rt *rt);
const struct cfg *role_cfg(const struct role_rt *rt);

/* The meta endpoints the roles above meta use: --meta-endpoints as
 * configured, except that a process running the meta role with
 * --meta-endpoints left at its default uses its own meta (its
 * --listen-client, 0.0.0.0 read as 127.0.0.1). Written into out. */
void role_meta_endpoints(const struct cfg *cfg, char *out, size_t len);

/*
 * Make the callers of srv (the `what` of a role, listening on listen)
 * prove the cluster secret when one is configured (--cluster-secret-file,
 * the agents' own): rpc_server_require_auth, the secret read into *out,
 * which the caller clears (mc_secret_clear). Without one out->len is 0,
 * and a server that listens on an address other than loopback is refused
 * (MC_ECONFIG, logged with `harm`: what anyone who reached it could do)
 * unless --insecure-transfer leaves it open (a warning). Other errors:
 * mc_secret_find's and rpc_server_require_auth's, logged.
 */
struct mc_secret;
int role_require_secret(const struct cfg *cfg, struct rpc_server *srv, const char *what,
			const char *listen, const char *harm,
			struct mc_secret *out) MC_MUST_CHECK;

/* The answers to ops->drain and ops->stop (see struct role_ops). */
void role_drained(struct role_rt *rt);
void role_stopped(struct role_rt *rt);
/* A fatal error: shut the daemon down, exit status 1. */
void role_fatal(struct role_rt *rt);

#endif
