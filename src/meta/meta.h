/*
 * meta: the meta role — a Raft-replicated key-value store that speaks the
 * etcd v3 gRPC API, so etcdctl, etcd client libraries and the daemons' own
 * client (src/etcd) use it as they would use etcd.
 *
 * A meta node is the io layer around the pure pieces of this folder: it
 * drives the Raft core (raft/raft.h) from libuv timers and peer messages,
 * persists each ready batch to the WAL (wal.h) on a worker thread with one
 * fdatasync per batch (group commit; the loop never waits for the disk),
 * sends Raft messages only once what they depend on is durable, applies
 * committed entries to the MVCC store, leases and watches (mvcc.h,
 * lease.h, watch.h), snapshots the state every snapshot_count applied
 * entries (snap.h) and compacts the WAL behind it, streams snapshots to
 * lagging members, and serves linearizable reads through ReadIndex.
 *
 * Services: on the client server etcdserverpb.KV, Lease, Watch, Cluster
 * and Maintenance (Status, Alarm, MoveLeader, Hash, HashKV, Snapshot as an
 * etcd backend file, Defragment as a no-op); on the peer server
 * mooncake.raft.Raft (proto/raft.proto).
 * A follower forwards writes and leader-only calls to the leader over the
 * peer service; reads and watches are served by every member.
 *
 * State lives in <data_dir>/meta: wal/ (segments), snap/ (snapshot
 * files) and the file `member` (this member's ID and the cluster ID).
 *
 * Threads: all functions must be called on the loop's thread.
 */
#ifndef MC_META_META_H
#define MC_META_META_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "common/err.h"

struct meta_node;
struct rpc_server;
struct rpc_health;
struct metrics_registry;

struct meta_options {
	const char *data_dir; /* state goes to <data_dir>/meta */
	const char *name;     /* this member's name */
	/* Founding members "name=host:port,..." (peer addresses, an
	 * optional http:// prefix); NULL or "" = this member alone at
	 * listen_peer. */
	const char *initial_cluster;
	bool join_existing;        /* --initial-cluster-state=existing */
	const char *listen_peer;   /* peer address (host:port) */
	const char *listen_client; /* client address (host:port) */
	/* The addresses published to the other members and in the member
	 * list when they differ from the listen addresses; NULL or "":
	 * the listen address. */
	const char *advertise_peer;
	const char *advertise_client;
	uint64_t heartbeat_ms;
	uint64_t election_ms;    /* >= 2 * heartbeat_ms */
	uint64_t snapshot_count; /* applied entries between snapshots */
	uint64_t max_request_bytes;
	uint64_t quota_backend_bytes;
	/* etcd's auto-compaction: "periodic" or "revision", and the history
	 * kept ("5m", "1" = 1 hour, a revision count; "0" = off). */
	const char *auto_compaction_mode;
	const char *auto_compaction_retention;
	uint64_t progress_notify_ms; /* watch progress notifications */
	uint64_t max_message_bytes;  /* the RPC servers' limit */
	/* The cluster secret this member proves to the other members' peer
	 * ports (a token per connection, rpc_client_opts.auth_key), whose
	 * peer_srv the caller made require it (rpc_server_require_auth);
	 * copied by meta_node_new. NULL/0: none (the members' peer ports
	 * are open). */
	const uint8_t *peer_key;
	size_t peer_key_len;
	/* The etcd API's one user (etcd's Authenticate): with client_key,
	 * user "root" with this key as its password gets a bearer token
	 * (mc_bearer_token) good for auth_token_ttl_ms (0: 5 minutes), which
	 * client_srv, made by the caller to require the key and take the
	 * token in the "token" header (rpc_server_accept_bearer), accepts on
	 * every member with the key. Copied by meta_node_new. NULL/0:
	 * Authenticate answers "authentication is not enabled", as etcd's
	 * does without auth. */
	const uint8_t *client_key;
	size_t client_key_len;
	uint64_t auth_token_ttl_ms;
	/* The role's servers (borrowed): services are registered on them
	 * and their health set SERVING once they work. */
	struct rpc_server *client_srv, *peer_srv;
	struct rpc_health *client_health, *peer_health;
	struct metrics_registry *metrics; /* NULL: metrics_global() */
	/* An error the node cannot serve through (a failed fsync, a corrupt
	 * snapshot, this member removed from the cluster): logged, then
	 * on_fatal(ud). The node answers nothing afterwards. */
	void (*on_fatal)(void *ud);
	void *ud;
};

/*
 * Open the node: recover from <data_dir>/meta (WAL + newest usable
 * snapshot) or found a new cluster, register the services, start the
 * timers. A member joining an existing cluster asks the members named in
 * initial_cluster for its ID first and starts once one answers.
 * Errors: MC_ECONFIG (bad options; logged with the flag to fix),
 * -EBADMSG (a corrupt WAL or snapshot: logged with file and offset),
 * MC_ELOCKED, -ENOMEM, negative errno from the file system.
 */
int meta_node_new(uv_loop_t *loop, const struct meta_options *o,
		  struct meta_node **out) MC_MUST_CHECK;

/*
 * Begin a graceful stop: a leader first hands leadership to the most
 * up-to-date voter (bounded by the election timeout); then every pending
 * request fails with "etcdserver: server stopped", streams end, the disk
 * work in flight completes, timers and peer connections close, and
 * on_done(ud) runs (from the loop). Calling it twice is a no-op.
 */
void meta_node_stop(struct meta_node *n, void (*on_done)(void *ud), void *ud);

/* Free a stopped node (or one whose stop never ran because the loop
 * ended). NULL is a no-op. */
void meta_node_free(struct meta_node *n);

#endif
