/*
 * master: the cache-pool coordinator behind mooncaked --role=master. It
 * serves mooncake.master.Master (proto/master.proto) on an RPC server:
 * the segment registry with agent heartbeats, the object index with
 * placement on distinct segments, read leases, soft pins, TTLs, LRU
 * eviction above a DRAM watermark, and PENDING-put timeouts. Its state is
 * soft: after a failover agents re-report what they hold.
 *
 * High availability: with meta endpoints the master campaigns for the
 * leader key /mooncake/<cluster-id>/master in meta (etcd v3 API, a lease
 * of leader_lease_ttl_ms) whose value is "HOST:PORT VIEW"; each new
 * leader bumps the view (kept in /mooncake/<cluster-id>/master-view).
 * Standbys watch the key and answer every Master call with UNAVAILABLE and
 * "-807 not the leader: leader=HOST:PORT view=N". A leader whose lease is
 * lost stops serving at once and campaigns again with an empty index.
 * Without meta endpoints the master is the leader of view 1 at once.
 *
 * The health status of "mooncake.master.Master" is SERVING while leader,
 * NOT_SERVING otherwise. Metrics go to the registry given (see README).
 *
 * All functions run on the loop's thread.
 */
#ifndef MC_MASTER_MASTER_H
#define MC_MASTER_MASTER_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "common/err.h"

struct rpc_server;
struct rpc_health;
struct metrics_registry;
struct master;

#define MASTER_SERVICE "mooncake.master.Master"

struct master_opts {
	uv_loop_t *loop;
	struct rpc_server *rpc;           /* the service is added here (borrowed) */
	struct rpc_health *health;        /* status of MASTER_SERVICE (borrowed) */
	struct metrics_registry *metrics; /* NULL: metrics_global() */
	/* Address written to the leader key: advertise if non-empty, else
	 * listen (a port of 0 there is replaced by the server's bound port
	 * when the campaign starts, after the server listens). */
	const char *advertise;
	const char *listen;
	const char *cluster_id;
	const char *meta_endpoints; /* NULL or "": no HA, leader at once */
	/* The cluster secret, proven to meta members whose etcd API wants
	 * it (etcd_opts.auth_key; copied). NULL/0: none. */
	const uint8_t *meta_key;
	size_t meta_key_len;
	uint64_t agent_ttl_ms;
	uint64_t put_timeout_ms;
	uint64_t lease_ttl_ms;        /* read lease of GetReplicas */
	uint64_t leader_lease_ttl_ms; /* meta lease of the leader key */
	double high_watermark;        /* (0, 1] */
	double eviction_ratio;        /* (0, 1] */
	uint64_t mirror_log_bytes;    /* per segment; 0: 16 MiB */
};

/*
 * Create the master: register the service on opts->rpc, start its timers
 * and (on the loop's next turn, once the server listens) the campaign.
 * Errors: -EINVAL (options, a meta endpoint that does not parse), -EEXIST
 * (the service is already registered), -ENOMEM.
 */
int master_new(const struct master_opts *opts, struct master **out) MC_MUST_CHECK;

/*
 * Stop serving: give up leadership (the leader key is deleted and the
 * lease revoked, so a standby takes over at once) and stop the timers;
 * on_stopped(ud) runs when that is done (from the loop, never from inside
 * this call). Calls arriving afterwards get UNAVAILABLE.
 */
void master_stop(struct master *m, void (*on_stopped)(void *ud), void *ud);

/* Free a stopped master (or one whose loop has ended). */
void master_free(struct master *m);

bool master_is_leader(const struct master *m);
/* The view this master leads, or the last one it saw as a standby. */
uint64_t master_view(const struct master *m);

#endif
