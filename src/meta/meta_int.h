/*
 * meta_int: what the files of the meta node share — the node itself, the
 * requests in flight, the peer transport and the etcd services. The
 * state machine and the etcd vocabulary it speaks are in sm.h. Nothing
 * outside src/meta includes it.
 *
 *   node.c       the node's life: options, start, metrics, health, stop
 *   boot.c       identity and first state: recover, found, join
 *   ready.c      the driver: the turn around the Raft core (feed, ready,
 *                persist, send, apply, advance), the tick, transport inputs
 *   req.c        client requests: lifecycle, dispatch, proposals, forwarding
 *   read.c       linearizable read rounds (ReadIndex)
 *   member.c     membership changes, publishing, peers from the member table
 *   snapshot.c   taking this member's snapshots, compacting the log behind
 *   worker.c     the disk thread (WAL and snapshot files)
 *   sm.c         the state machine (sm.h): entries applied to the MVCC
 *                store, leases, members and alarms; snapshot encoding
 *   conv.c       etcd protobuf messages <-> mvcc structs, errors, arena
 *   peer.c       mooncake.raft.Raft: messages, snapshots, Forward, Members
 *   svc.c        etcdserverpb.KV, Lease, Cluster, Maintenance
 *   svc_maint.c  Maintenance.Hash, HashKV, Snapshot, Defragment
 *   svc_watch.c  etcdserverpb.Watch
 *   bolt.c       the state as an etcd backend (bbolt) database
 */
#ifndef MC_META_META_INT_H
#define MC_META_META_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "meta/meta.h"
#include "meta/raft/raft.h"
#include "meta/sm.h"
#include "meta/snap.h"
#include "meta/wal.h"
#include "meta/watch.h"
#include "rpc/rpc.h"

struct metric;

/* ------------------------------------------------------------- requests */

struct meta__op;

/*
 * The answer to a request: status RPC_OK with resp (borrowed: valid
 * during the call), or an error status and message. Runs exactly once;
 * the node frees op after it returns.
 */
typedef void (*meta__done_fn)(struct meta__op *op, int status, const char *message,
			      const ProtobufCMessage *resp);

struct meta__oplist {
	struct meta__op *head, *tail;
	size_t n;
};

/* How a request is served. */
enum meta__kind {
	META_K_READ_LOCAL, /* from the local state at once (serializable) */
	META_K_READ,       /* linearizable: ReadIndex, then the local state */
	META_K_WRITE,      /* through the log, proposed by the leader */
	META_K_CONF,       /* a membership change through the log */
	META_K_LEADER,     /* answered by the leader's own state */
};

/* A client request in flight (a call, a stream message or a forwarded
 * call). */
struct meta__op {
	/* set by whoever submits it */
	enum meta__method method;
	uint8_t *req; /* serialized request (owned) */
	size_t req_len;
	bool forwarded;       /* from another member: never forwarded again */
	uint64_t deadline_ms; /* loop time */
	meta__done_fn done;
	void *ud;
	/* the node's */
	struct meta_node *node;
	int kind;     /* enum meta__kind, from the request */
	bool puts;    /* adds data: the quota applies */
	uint8_t *ent; /* proposal data (owned) */
	size_t ent_len;
	struct meta__op *prev, *next;
	struct meta__oplist *list;
	uint64_t index, term; /* proposal: the entry that answers it */
	uint64_t read_index;  /* linearizable read: served at this index */
	uint64_t fwd_leader;  /* forwarded to this leader */
	uint64_t read_round;
	/* LeaseGrant: the leader chose the ID (the client sent 0), so a
	 * collision at apply is retried with another one. */
	bool lease_id_chosen;
	unsigned lease_id_tries;
};

/*
 * A new request for method m whose message req (borrowed) is serialized
 * into it. deadline_ms 0: the default request timeout from now. NULL
 * when out of memory.
 */
struct meta__op *meta__op_new(struct meta_node *n, enum meta__method m,
			      const ProtobufCMessage *req, uint64_t deadline_ms,
			      meta__done_fn done, void *ud);
/* The same from a serialized request (copied). */
struct meta__op *meta__op_new_raw(struct meta_node *n, enum meta__method m, const uint8_t *req,
				  size_t len, uint64_t deadline_ms, meta__done_fn done,
				  void *ud);
/* Run a request: op->done runs exactly once, possibly before this
 * returns. Takes ownership of op. */
void meta__submit(struct meta_node *n, struct meta__op *op);
/* Answer op and free it. */
void meta__op_done(struct meta__op *op, int status, const char *message,
		   const ProtobufCMessage *resp);
void meta__op_fail(struct meta__op *op, int code);

void meta__oplist_push(struct meta__oplist *l, struct meta__op *op);
void meta__oplist_remove(struct meta__op *op);

/* ------------------------------------------------------------- transport */

struct meta__snap_tx;

struct meta__peer {
	uint64_t id;
	char addr[72]; /* host:port */
	struct meta_node *node;
	struct rpc_client *cli;
	struct rpc_stream *msgs;    /* the open Messages stream, or NULL */
	bool msgs_failed;           /* reported unreachable since it failed */
	struct meta__snap_tx *snap; /* snapshot being sent */
};

/* A raft message copied out of a peer batch, queued while the core is
 * busy (one allocation: the arrays follow). */
struct meta__qmsg {
	struct meta__qmsg *next;
	struct raft_msg m;
};

/* A snapshot received from the leader, waiting to be installed. */
struct meta__recv_snap {
	uint64_t index, term;
	uint8_t *data;
	size_t len;
};

/* ------------------------------------------------------------- compaction */

/* Between two steps of one compaction: the loop serves meanwhile. */
#define META_COMPACT_STEP_GAP_MS 100u

/* etcd's automatic compaction (compact.c): what to keep, and when the
 * leader last compacted. */
struct meta__compactor {
	bool periodic;        /* else revision mode */
	uint64_t period_ms;   /* periodic: the history kept (0: off) */
	int64_t keep_revs;    /* revision: revisions kept (0: off) */
	uint64_t interval_ms; /* between compactions */
	uint64_t sample_ms;   /* periodic: between two notes of the revision */
	int64_t *revs;        /* periodic: revisions noted, oldest first */
	size_t n_revs, cap_revs;
	bool started, in_flight;
	uint64_t next_sample_ms;
	uint64_t last_ms;  /* the start, or the last compaction */
	uint64_t wait_ms;  /* from last_ms to the next compaction */
	uint64_t retry_ms; /* after a failure, not before this */
	int64_t prev_rev;  /* the last compaction's revision */
	/* A compaction taken in steps (meta__compactor_tick): the revision
	 * it goes to, and when the next step may go. */
	int64_t goal;
	uint64_t step_ms;
};

/* From --auto-compaction-mode and --auto-compaction-retention (etcd's
 * syntax). Errors: MC_ECONFIG (logged), -ENOMEM. */
int meta__compactor_init(struct meta__compactor *c, const char *mode,
			 const char *retention) MC_MUST_CHECK;
void meta__compactor_free(struct meta__compactor *c);
bool meta__compactor_on(const struct meta__compactor *c);
/* At now_ms, with the store at rev and compacted at compacted_rev: note
 * the revision when due and, on the leader, say whether to compact and to
 * which revision (*to); then meta__compactor_done tells how it went. The
 * caller may compact to less than *to (a step): until compacted_rev
 * reaches *to, the next call asks for it again, META_COMPACT_STEP_GAP_MS
 * after the step was done. Pure: the clock and revisions are inputs. */
bool meta__compactor_step(struct meta__compactor *c, uint64_t now_ms, int64_t rev,
			  int64_t compacted_rev, bool leader, int64_t *to);
void meta__compactor_done(struct meta__compactor *c, uint64_t now_ms, int64_t rev, bool ok);
/* On each tick: note, and on the leader propose a compaction when due
 * (not while this member still frees what the last one dropped). */
void meta__compactor_tick(struct meta_node *n);
/* Free what compactions dropped (mvcc_compact_lazy) a slice per turn of
 * the loop, from an idle handle, unless a snapshot is being encoded (the
 * snapshot's end calls this again). Does nothing when nothing is pending. */
void meta__compact_resume(struct meta_node *n);

/* ------------------------------------------------------------- the node */

struct meta__worker;
struct meta__job;
struct meta__wstream;
struct meta__kstream;
struct meta__mjob;
struct meta__pcall;
struct meta__snap_job;

struct meta_node {
	uv_loop_t *loop;
	struct meta_options o; /* strings below are copies */
	char *name, *initial_cluster, *listen_peer, *listen_client;
	char *dir, *wal_dir, *snap_dir, *member_path;
	char *self_peer_url, *self_client_url; /* http://host:port */
	uint8_t *peer_key;                     /* o.peer_key's copy (wiped when freed) */
	uint8_t *client_key;                   /* o.client_key's copy (wiped when freed) */
	uint64_t auth_told_ms;                 /* last failed Authenticate logged */
	uint64_t id; /* this member's; the cluster's is sm.cluster_id */
	uint64_t request_timeout_ms;
	bool running;   /* the Raft core exists and is driven */
	bool stopping;  /* meta_node_stop ran */
	bool finishing; /* stopping, past the leadership transfer */
	bool fatal;
	void (*on_stopped)(void *ud);
	void *stopped_ud;

	struct raft *raft;
	struct wal *wal;
	struct meta__worker *disk;

	/* state machine */
	struct meta__sm sm;
	struct meta__sm *installed_sm; /* received, decoded, to swap in */
	struct watch_registry *watch;
	uint64_t applied, applied_term;
	uint64_t snap_index; /* newest durable snapshot */
	uint64_t commit;
	bool published; /* our name/client URL are in the table */
	uint64_t publish_sent_ms;

	/* the ready being processed */
	bool in_ready;
	struct raft_ready rd;
	struct wal_entry *went;
	size_t went_cap;
	struct meta__job *persist_job;
	uint64_t durable_index; /* last log index made durable here */
	struct raft_msg *late;  /* rd's messages held until it is durable */
	size_t n_late, late_cap;
	bool split_msgs;      /* some of rd's messages went early: send late */
	size_t early_applied; /* committed entries of rd applied early */
	bool early_ran;       /* apply_early handled rd's read states */
	uint64_t leader, term;
	enum raft_role role;

	/* inputs that arrived while the core was busy */
	struct meta__qmsg *qhead, *qtail;
	unsigned pending_ticks;
	struct meta__oplist propq; /* ops to propose */
	uint64_t *unreachable;
	size_t n_unreachable, cap_unreachable;
	struct {
		uint64_t id;
		bool ok;
	} * snap_reports;
	size_t n_snap_reports, cap_snap_reports;
	uint64_t pending_compact; /* raft_compact once possible */
	uint64_t transfer_to;     /* raft_transfer_leader once possible */
	bool campaign;

	/* requests */
	struct meta__oplist waiters;     /* proposals, by index */
	struct meta__oplist wait_leader; /* no leader known yet */
	struct meta__oplist retry;       /* run again after the next apply */
	struct meta__oplist reads;       /* waiting for a read round */
	struct meta__oplist round;       /* in the read round in flight */
	struct meta__oplist read_wait;   /* have a read index, wait to apply */
	struct meta__oplist moving;      /* MoveLeader calls in progress */
	uint64_t read_seq;
	bool round_in_flight;
	bool round_needed;
	uint64_t round_started_ms;
	uint64_t next_member_id_seed;
	/* Lease IDs for grants that name none: etcd's idutil.Generator,
	 * 2 bytes of the member ID, then 5 bytes of the start time in ms and
	 * a 1-byte counter that runs into them. 0 until first used. */
	uint64_t lease_id_prefix, lease_id_suffix;

	/* timers and wake-ups */
	uv_timer_t tick_timer;
	uv_idle_t kick;
	uv_idle_t snap_idle;
	uv_idle_t compact_idle;                    /* frees what a compaction dropped */
	uint64_t compact_free_ms, compact_free_ns; /* since when, on the loop */
	uv_timer_t progress_timer;
	uv_timer_t sync_timer;
	uv_timer_t join_timer;
	uv_timer_t stop_timer;
	bool handles_open;
	unsigned closing_handles;

	/* transport */
	struct meta__peer **peers;
	size_t n_peers;
	struct meta__pcall *pcalls; /* incoming peer streams */
	struct meta__recv_snap *recv_snap;
	size_t join_next;
	struct rpc_client *join_cli;
	bool join_refused;      /* a member said UNAUTHENTICATED (logged once) */
	uint64_t last_heard_ms; /* last Raft traffic from a peer */
	uint64_t last_probe_ms;
	size_t probe_next;
	bool probing;

	struct meta__compactor compactor;

	/* snapshots and disk work in flight */
	struct meta__snap_job *snap_job; /* this member's snapshot being taken */
	unsigned disk_jobs;              /* jobs submitted and not yet completed */
	unsigned uv_works;
	bool tidying;    /* meta__tidy's worker is deleting files */
	bool tidy_again; /* and more were set aside meanwhile */

	/* services */
	struct meta__wstream *wstreams;
	struct meta__kstream *kstreams;
	struct meta__mjob *mjobs; /* Maintenance calls in progress */
	uint64_t mjobs_logged_ms; /* last warning of one refused */
	uint64_t wstream_seq;

	/* metrics */
	struct metric *m_term, *m_leader, *m_has_leader, *m_is_leader;
	struct metric *m_commit, *m_applied, *m_committed, *m_failed;
	struct metric *m_pending, *m_leader_changes, *m_snapshots;
	struct metric *m_db_size, *m_watchers, *m_leases, *m_keys;
	struct metric *m_snap_sent, *m_snap_recv, *m_forwarded;
	struct metric *m_snap_writing;
};

/* A member ID fits 53 bits: exact in a float gauge (the leader_id metric). */
#define META_MEMBER_ID_MASK ((UINT64_C(1) << 53) - 1)
/* Snapshot files kept (the WAL is kept from the oldest). */
#define META_SNAPSHOTS_KEPT 2

/* ---- node.c: the node's life */

/* Loop time in ms. */
uint64_t meta__now(const struct meta_node *n);
bool meta__is_leader(const struct meta_node *n);
/* The state machine's inputs now: loop time and term. */
struct meta__sm_in meta__sm_in(const struct meta_node *n);
/* A ResponseHeader for now (revision: the store's), in arena a. */
Etcdserverpb__ResponseHeader *meta__header(struct meta_node *n, struct meta__arena *a);
/* An unrecoverable error: log it and tell the role. */
void meta__fatal(struct meta_node *n, int code, const char *what);
/* A malloc'd formatted string, NULL when out of memory. */
char *meta__printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Start driving the Raft core (after bootstrap, or once joined). */
void meta__start_running(struct meta_node *n);
/* The etcd services' and the peer service's health. Errors: rpc_health_set's. */
int meta__set_health(struct meta_node *n, enum rpc_health_status st) MC_MUST_CHECK;
void meta__update_metrics(struct meta_node *n);
/* Stopping, past the leadership transfer: fail what waits, end streams. */
void meta__finish_stop(struct meta_node *n);
/* After disk work completed: finish a stop waiting for it. */
void meta__check_stopped(struct meta_node *n);

/* ---- boot.c: this member's identity and first state */

/* Recover from the data directory, found a new cluster from
 * --initial-cluster, or (*join set) check --initial-cluster for a join
 * that meta__peer_join then performs. Errors: MC_ECONFIG, -EBADMSG (bad
 * files), -ENOMEM, the WAL's and the Raft core's. */
int meta__boot(struct meta_node *n, bool *join) MC_MUST_CHECK;

/* ---- ready.c: the turn */

/* Wake the driver (it runs from an idle callback). */
void meta__kick(struct meta_node *n);
/* The heartbeat tick: Raft ticks, request deadlines, lease expiry. */
void meta__on_tick(uv_timer_t *t);
/* Inputs from the transport. m is borrowed (copied if queued); q is
 * taken (freed or queued). */
void meta__step(struct meta_node *n, const struct raft_msg *m);
void meta__step_owned(struct meta_node *n, struct meta__qmsg *q);
void meta__report_unreachable(struct meta_node *n, uint64_t id);
void meta__report_snapshot(struct meta_node *n, uint64_t id, bool ok);
/* After an entry was applied: act on what it changed (reach new or moved
 * peers, stop when this member was removed) and log it. */
void meta__sm_effects_done(struct meta_node *n, const struct meta__sm_effects *fx);

/* ---- req.c: requests */

/* Answer op from a reply of the state machine. */
void meta__op_reply(struct meta__op *op, struct meta__reply *r);
/* Fail every op of l with code. */
void meta__fail_list(struct meta__oplist *l, int code);
/* Insert a proposal waiter keeping the list sorted by index. */
void meta__waiters_insert(struct meta__oplist *l, struct meta__op *op);
/* Propose op's entry (op->ent) now, or queue it while a ready is out. */
void meta__propose(struct meta_node *n, struct meta__op *op);
/* Propose an internal request (alarm, lease revoke, member attributes)
 * with no one waiting for its answer. */
void meta__propose_internal(struct meta_node *n, enum meta__method m,
			    const ProtobufCMessage *req);
/* A grant whose chosen ID another grant took meanwhile: choose again and
 * resubmit (true), or let code be the answer (false). */
bool meta__retry_lease_grant(struct meta_node *n, struct meta__op *op, int code);
/* Serve a local read (serializable, or at its read index) at once. */
void meta__serve_local(struct meta_node *n, struct meta__op *op);
/* Run every op of list l again (leader known, an entry applied). */
void meta__rerun(struct meta_node *n, struct meta__oplist *l);
/* Fail the requests past their deadline. */
void meta__req_sweep(struct meta_node *n);
/* Park a request until a leader is known. */
void meta__wait_leader(struct meta_node *n, struct meta__op *op);

/* ---- read.c: linearizable read rounds */

/* Start a round for the reads queued, unless one is in flight. */
void meta__read_round(struct meta_node *n);
/* The round in flight is lost: its reads go back to the queue. */
void meta__read_retry(struct meta_node *n);
/* Answer the reads whose read index is applied. */
void meta__read_serve(struct meta_node *n);
/* A ReadIndex answer from the core. */
void meta__read_state(struct meta_node *n, const struct raft_read_state *rs);
/* On each tick: retry a round that took an election timeout. */
void meta__read_tick(struct meta_node *n);

/* ---- member.c: membership */

/* "http://host:port" with a numeric host (malloc'd), or NULL. */
char *meta__normalize_url(const char *url);
/* Propose a MemberAdd, MemberRemove or MemberPromote (leader). */
void meta__propose_conf(struct meta_node *n, struct meta__op *op);
/* Publish this member's name and client URL until it is in the table. */
void meta__maybe_publish(struct meta_node *n);
/* The member table changed (an entry, a snapshot): reach every other
 * member at its peer URL and note whether ours is published. */
void meta__sync_members(struct meta_node *n);
/* Peers named in conf change entries about to be persisted become known
 * to the transport at once (the change is in force when appended). */
void meta__learn_peers(struct meta_node *n, const struct raft_entry *e, size_t k);

/* ---- snapshot.c */

/* Take a snapshot when --snapshot-count entries were applied since the last. */
void meta__maybe_snapshot(struct meta_node *n);
/* Give up the snapshot being taken (stopping, or the state is replaced). */
void meta__snapshot_abandon(struct meta_node *n);
/* Encodes the snapshot being taken a slice at a time. */
void meta__on_snap_idle(uv_idle_t *h);
/* Whether a snapshot of this member is being encoded (versions must not
 * be freed meanwhile). */
bool meta__snapshot_encoding(const struct meta_node *n);
/* Delete, on a libuv worker and a few megabytes at a time, the WAL
 * segments and snapshot files set aside (released, purged). */
void meta__tidy(struct meta_node *n);

/* ---- conv.c */

/* Set this member's cluster_id, member_id and raft_term in every
 * ResponseHeader of m, nested ones included, keeping their revisions: an
 * answer relayed from the leader then names the member the client asked,
 * as etcd's does. Headers m lacks stay absent. */
void meta__stamp_headers(const struct meta_node *n, ProtobufCMessage *m);

/* ------------------------------------------------------------- worker */

struct meta__job {
	void (*work)(struct meta__job *j); /* on the disk thread */
	void (*done)(struct meta__job *j); /* on the loop, afterwards */
	struct meta__job *next;
	int rc;
};

/* The disk thread: jobs run in submission order, one at a time. */
int meta__worker_new(uv_loop_t *loop, struct meta__worker **out) MC_MUST_CHECK;
void meta__worker_submit(struct meta__worker *w, struct meta__job *j);
/* Close the wake-up handle (the loop must run on); the thread ends once
 * the jobs submitted are done. Then free. */
void meta__worker_close(struct meta__worker *w);
void meta__worker_free(struct meta__worker *w);

/* ------------------------------------------------------------- snapshots */

/* Read a whole snapshot file's data (blocking: a worker's job). */
int meta__snap_load(const char *path, uint8_t **data, size_t *len) MC_MUST_CHECK;

/* ------------------------------------------------------------- conv.c */

/* Raft message <-> protobuf. to_pb: pointers borrowed from m; arrays in
 * arena a. from_pb: a queued deep copy (malloc, free()). */
Mooncake__Raft__Message *meta__msg_to_pb(const struct raft_msg *m, struct meta__arena *a);
struct meta__qmsg *meta__msg_from_pb(const Mooncake__Raft__Message *pm);
struct meta__qmsg *meta__msg_copy(const struct raft_msg *m);

/* ------------------------------------------------------------- peer.c */

/* Register mooncake.raft.Raft on the peer server. */
int meta__peer_service_add(struct meta_node *n) MC_MUST_CHECK;
/* Make sure a peer with this id is known at addr (host:port or URL);
 * updates the address when it changed. Errors: -EINVAL, -ENOMEM. */
int meta__peer_set(struct meta_node *n, uint64_t id, const char *url) MC_MUST_CHECK;
struct meta__peer *meta__peer_find(struct meta_node *n, uint64_t id);
/* Send the messages of a ready (serialized before return). */
void meta__peer_send(struct meta_node *n, const struct raft_msg *msgs, size_t n_msgs);
/* Forward op to the leader over the peer service. */
void meta__peer_forward(struct meta_node *n, struct meta__op *op);
/* Find this member's ID from the members named in --initial-cluster
 * (joining an existing cluster); calls meta__join_done. */
void meta__peer_join(struct meta_node *n);
/* Ask again after a while (no member answered, or none knows us yet). */
void meta__peer_join_later(struct meta_node *n);
void meta__join_done(struct meta_node *n, int rc, const Mooncake__Meta__MembersResponse *resp);
/* Heard nothing from any peer for long: ask one whether this member is
 * still in the cluster (a removed member is told nothing else). */
void meta__peer_probe(struct meta_node *n);
/* Close every peer connection and end incoming peer calls (stop). */
void meta__peer_close_all(struct meta_node *n);
void meta__peer_free_all(struct meta_node *n);

/* ------------------------------------------------------------- svc_maint.c */

/* Maintenance.Hash, HashKV, Snapshot and Defragment (handlers for the
 * Maintenance table in svc.c). */
void meta__on_hash(struct rpc_call *call, const ProtobufCMessage *msg);
void meta__on_hash_kv(struct rpc_call *call, const ProtobufCMessage *msg);
void meta__on_snapshot(struct rpc_call *call, const ProtobufCMessage *msg);
void meta__on_defragment(struct rpc_call *call, const ProtobufCMessage *msg);
void meta__maint_cancel(struct rpc_call *call);
void meta__maint_drain(struct rpc_call *call);
/* From the node's tick: end Snapshots whose client stopped reading. */
void meta__maint_tick(struct meta_node *n);
/* End the calls in progress (stop). */
void meta__maint_close_calls(struct meta_node *n);

/* ------------------------------------------------------------- svc.c */

int meta__svc_add(struct meta_node *n) MC_MUST_CHECK;
/* End the LeaseKeepAlive streams (stop). */
void meta__svc_close_streams(struct meta_node *n);

/* ------------------------------------------------------------- svc_watch.c */

int meta__watch_service_add(struct meta_node *n) MC_MUST_CHECK;

/* ------------------------------------------------------------- svc_auth.c */

/* Register etcdserverpb.Auth (Authenticate) on the client server. */
int meta__auth_service_add(struct meta_node *n) MC_MUST_CHECK;
/* After entries were applied: route events and hand them out. */
void meta__watch_pump(struct meta_node *n);
/* The store was replaced by a snapshot: rebuild the registry. */
int meta__watch_rebind(struct meta_node *n) MC_MUST_CHECK;
/* Start the progress-notify timer. */
void meta__watch_start_timers(struct meta_node *n);
void meta__watch_close_streams(struct meta_node *n);

#endif
