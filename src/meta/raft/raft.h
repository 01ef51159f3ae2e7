/*
 * raft: the pure, deterministic Raft consensus core of the meta role.
 *
 * The core is a finite state machine in the style of etcd/raft. It does no
 * I/O, reads no clock, draws no OS randomness and starts no threads: time
 * arrives as logical ticks (raft_tick), randomness comes from a generator
 * seeded in the configuration, and everything the node must do is handed
 * out as a "ready" batch. The same inputs always give the same outputs, so
 * a simulator can replay a seeded schedule exactly.
 *
 * Inputs:   raft_step (a message from a peer), raft_tick, raft_propose,
 *           raft_propose_conf_change, raft_read_index, raft_transfer_leader,
 *           raft_campaign, raft_report_snapshot, raft_report_unreachable,
 *           raft_compact.
 * Outputs:  raft_has_ready / raft_ready / raft_advance.
 *
 * The driver loop (the order is part of the contract):
 *
 *   while (raft_has_ready(r)) {
 *       struct raft_ready rd;
 *       raft_ready(r, &rd);
 *       1. if rd.snapshot: make the snapshot whose data the transport
 *          received (see RAFT_MSG_SNAP) the node's snapshot: persist it,
 *          drop every WAL entry, load it into the state machine.
 *       2. if rd.n_entries: in the WAL, drop every entry with index >=
 *          rd.entries[0].index, then append rd.entries.
 *          if rd.hard_state_changed: write rd.hard_state.
 *          if rd.must_sync: fsync. Steps 1-2 must be durable before 3.
 *       3. send rd.msgs (serialize them now: the buffers die at advance).
 *       4. apply rd.committed to the state machine, in order.
 *       5. serve rd.read_states (a read with index i may be answered once
 *          the state machine has applied i).
 *       6. raft_advance(r, &rd).
 *   }
 *
 * Rule: messages in a ready may be sent only after the snapshot, entries
 * and hard state of the same ready are durable. The core counts a leader's
 * own entries as matched when it appends them; that is safe because of
 * this rule (no follower can acknowledge an entry the leader has not made
 * durable first). One exception keeps that safe: a leader whose ready
 * changes neither its term nor its vote and installs no snapshot may send
 * its messages while it makes the ready durable (Raft thesis 10.2.1)
 * provided the driver steps nothing into the core until then — the
 * acknowledgements that would commit the leader's new entries wait until
 * they are durable on the leader too. A follower's HEARTBEAT_RESP, which
 * says nothing about its log, may also go early while its term stands. Between raft_ready and raft_advance the driver may call
 * only the read-only functions (raft_status, raft_term_at, raft_entry_at,
 * raft_last_snapshot, raft_conf, raft_has_ready); every other call returns
 * -EINPROGRESS. Messages arriving meanwhile must be queued by the driver.
 *
 * Configuration changes are single-server changes carried in the log
 * (RAFT_ENTRY_CONF_CHANGE, data made by raft_conf_change_encode). A change
 * takes effect on every node as soon as the entry is APPENDED to its log
 * (Raft thesis, section 4.1), committed or not; if a new leader truncates
 * the entry away, the node falls back to the configuration before it. The
 * leader accepts a new change only when no change is uncommitted in its log
 * and it has committed an entry of its own term. A leader that removed
 * itself keeps leading (without counting itself) until the change commits,
 * then steps down. raft_conf() returns the configuration in force.
 *
 * Snapshots: the application serializes its state machine at some applied
 * index i, makes it durable, then calls raft_compact(r, i). The core
 * remembers the snapshot metadata (index, term, configuration at i,
 * raft_last_snapshot) and drops log entries up to i minus a configured
 * trailing window. A follower whose next index falls below the leader's
 * first log entry gets a RAFT_MSG_SNAP carrying that metadata; the
 * transport streams the leader's snapshot data alongside (out of band, in
 * chunks) and steps the RAFT_MSG_SNAP into the receiving core only once all
 * data has arrived. The receiving core either ignores it (it already has
 * those entries) or restores from it, and then the next ready carries
 * rd.snapshot. The sender's transport reports the outcome with
 * raft_report_snapshot.
 *
 * Errors: every fallible function returns 0 or a negative errno/MC_E*
 * code. -EINVAL, -EINPROGRESS and the "try later" codes documented per
 * function leave the node unchanged. -ENOMEM and MC_EINTERNAL from a
 * function that changes state are fatal: the core stays in an unknown
 * state, every later call returns the same code, and only raft_free is
 * useful.
 *
 * Threads: a struct raft is not thread-safe; one owner drives it.
 */
#ifndef MC_META_RAFT_RAFT_H
#define MC_META_RAFT_RAFT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

/* Node id meaning "nobody". Real node ids are > 0. */
#define RAFT_NONE 0

struct raft;

enum raft_role {
	RAFT_FOLLOWER = 0,
	RAFT_PRE_CANDIDATE = 1,
	RAFT_CANDIDATE = 2,
	RAFT_LEADER = 3,
};

enum raft_entry_type {
	RAFT_ENTRY_NORMAL = 0,
	/* data is a conf change made by raft_conf_change_encode(). */
	RAFT_ENTRY_CONF_CHANGE = 1,
};

/*
 * A log entry. In everything the core hands out (ready, messages,
 * raft_entry_at) data points into memory the core owns; it is valid until
 * the next raft_advance (ready, messages) or the next call that changes the
 * node (raft_entry_at). In everything given to the core (raft_step,
 * raft_new) data is borrowed for the call; the core copies what it keeps.
 * data may be NULL when len is 0 (e.g. the empty entry a new leader
 * appends).
 */
struct raft_entry {
	uint64_t term;
	uint64_t index;
	enum raft_entry_type type;
	const void *data;
	size_t len;
};

/* Membership: voters and learners, each sorted ascending, disjoint. */
struct raft_conf_state {
	const uint64_t *voters;
	size_t n_voters;
	const uint64_t *learners;
	size_t n_learners;
};

/* Snapshot metadata: the state machine up to and including index. */
struct raft_snapshot_meta {
	uint64_t index;
	uint64_t term;               /* term of the entry at index */
	struct raft_conf_state conf; /* configuration in force at index */
};

/* What must survive a crash besides the log. */
struct raft_hard_state {
	uint64_t term;
	uint64_t vote; /* RAFT_NONE if no vote in term */
	uint64_t commit;
};

/*
 * Message types. Every message carries type, from, to, term; the other
 * fields are used as listed (unused ones are zero / NULL):
 *
 *  APP           leader -> follower: index, log_term = index and term of
 *                the entry before entries[]; entries; commit.
 *  APP_RESP      reject = false: index = the follower's last index that
 *                matches the leader's log (the leader's match).
 *                reject = true: index = the rejected APP's index;
 *                reject_hint, log_term = a guess of the last index where
 *                the logs may match and the follower's term there (fast
 *                backtracking).
 *  VOTE, PREVOTE index, log_term = the candidate's last index and term;
 *                term = the election's term (for PREVOTE: the candidate's
 *                term + 1, not yet adopted); transfer = the campaign comes
 *                from a leader transfer and overrides the leader lease.
 *  VOTE_RESP, PREVOTE_RESP  reject. A grant carries the term of the
 *                request, a rejection the voter's term.
 *  HEARTBEAT     commit (min of the leader's commit and the follower's
 *                match); ctx (read-index round, may be empty).
 *  HEARTBEAT_RESP ctx echoed.
 *  SNAP          snapshot (the data travels out of band, see above).
 *  TIMEOUT_NOW   leader -> transfer target: campaign now.
 *  READ_INDEX    follower -> leader: ctx. Handled only at equal terms.
 *  READ_INDEX_RESP leader -> follower: index (the read index), ctx.
 */
enum raft_msg_type {
	RAFT_MSG_APP = 1,
	RAFT_MSG_APP_RESP = 2,
	RAFT_MSG_VOTE = 3,
	RAFT_MSG_VOTE_RESP = 4,
	RAFT_MSG_PREVOTE = 5,
	RAFT_MSG_PREVOTE_RESP = 6,
	RAFT_MSG_HEARTBEAT = 7,
	RAFT_MSG_HEARTBEAT_RESP = 8,
	RAFT_MSG_SNAP = 9,
	RAFT_MSG_TIMEOUT_NOW = 10,
	RAFT_MSG_READ_INDEX = 11,
	RAFT_MSG_READ_INDEX_RESP = 12,
};

/*
 * A message between peers: plain data, ready for a protobuf encoding. In a
 * ready, all pointers are owned by the core and valid until raft_advance.
 * Given to raft_step, everything is borrowed for the call.
 */
struct raft_msg {
	enum raft_msg_type type;
	uint64_t from;
	uint64_t to;
	uint64_t term;
	uint64_t log_term;
	uint64_t index;
	uint64_t commit;
	bool reject;
	uint64_t reject_hint;
	bool transfer;
	const struct raft_entry *entries;
	size_t n_entries;
	struct raft_snapshot_meta snapshot;
	const void *ctx;
	size_t ctx_len;
};

/* A ReadIndex result: the request ctx may be served at index or later. */
struct raft_read_state {
	uint64_t index;
	const void *ctx;
	size_t ctx_len;
};

/*
 * One batch of work for the driver (see the loop at the top). Everything
 * pointed to is owned by the core and valid until raft_advance(r, this).
 */
struct raft_ready {
	/* Soft state: not persisted. Set when leader or role changed. */
	bool soft_state_changed;
	uint64_t leader;
	enum raft_role role;

	/* Hard state to persist, set when it changed since the last ready. */
	bool hard_state_changed;
	struct raft_hard_state hard_state;

	/*
	 * must_sync: the snapshot, entries, term or vote changed and must be
	 * fsynced before rd.msgs are sent. A ready with only a new commit
	 * index may skip the fsync (the commit index is recovered anyway).
	 */
	bool must_sync;

	/*
	 * Snapshot to install, or NULL. When set, the WAL's entries are all
	 * obsolete; rd.entries (if any) continue at snapshot->index + 1.
	 */
	const struct raft_snapshot_meta *snapshot;

	/*
	 * Entries to persist. They start at entries[0].index, which REPLACES
	 * every entry the WAL holds at that index or above (a follower's log
	 * may be cut back by a new leader). Consecutive indexes.
	 */
	const struct raft_entry *entries;
	size_t n_entries;

	/* Messages to send once steps 1-2 are durable. */
	const struct raft_msg *msgs;
	size_t n_msgs;

	/* Committed entries to apply, consecutive, after any snapshot. */
	const struct raft_entry *committed;
	size_t n_committed;

	/* ReadIndex results (in request order per leader). */
	const struct raft_read_state *read_states;
	size_t n_read_states;
};

/* Called with one human-readable event; text valid during the call. */
typedef void (*raft_trace_fn)(void *arg, uint64_t id, const char *text);

struct raft_config {
	uint64_t id; /* this node, > 0 */
	/* Election timeout in ticks; the randomized timeout is in [et, 2et). */
	unsigned election_ticks;
	unsigned heartbeat_ticks; /* < election_ticks */
	uint64_t seed;            /* PRNG seed (mixed with id) */
	bool pre_vote;            /* PreVote phase before real elections */
	/* Leader steps down without a quorum for an election timeout;
	 * followers with a live leader ignore vote requests (leader lease). */
	bool check_quorum;
	size_t max_msg_entries;   /* per APP, >= 1 */
	size_t max_msg_bytes;     /* data bytes per APP (one entry always fits) */
	size_t max_inflight_msgs; /* APPs in flight per follower, >= 1 */
	/* raft_compact(i) keeps entries > i - trailing_entries in the log so
	 * that slightly lagging followers need no snapshot. */
	uint64_t trailing_entries;
	raft_trace_fn trace; /* optional */
	void *trace_arg;
};

/*
 * Defaults: election_ticks 10, heartbeat_ticks 1, seed = id, pre_vote and
 * check_quorum on, 64 entries / 1 MiB per APP, 256 inflight APPs, 1024
 * trailing entries, no trace.
 */
void raft_config_init(struct raft_config *c, uint64_t id);

/*
 * State given back by the WAL at restart (all borrowed for raft_new).
 * entries: the log after the snapshot, consecutive; entries at or below
 * snapshot.index are skipped (the one at snapshot.index must have
 * snapshot.term). applied: how far the state machine already is (at least
 * snapshot.index; 0 means snapshot.index): committed entries above it come
 * out in the first ready. A torn WAL tail is tolerated the way a WAL that
 * writes entries before the hard state produces it: if the last entry (or
 * the snapshot) has a newer term than hard_state.term, the node adopts that
 * term with no vote; hard_state.commit must not exceed the last entry.
 * A configuration given at snapshot index 0 is accepted (handy for tests)
 * but nodes added later cannot learn it from the log: real clusters are
 * founded with raft_bootstrap.
 */
struct raft_restore {
	struct raft_hard_state hard_state;
	struct raft_snapshot_meta snapshot;
	const struct raft_entry *entries;
	size_t n_entries;
	uint64_t applied;
};

/*
 * Create a node. restore NULL = a new node with an empty log and no
 * configuration: either bootstrap it (raft_bootstrap) or let a leader add
 * it and feed it the log. Starts as follower.
 * Errors: -EINVAL (bad config, inconsistent restore), -ENOMEM.
 */
int raft_new(const struct raft_config *c, const struct raft_restore *restore,
	     struct raft **out) MC_MUST_CHECK;

/* Free the node and everything it owns (including an unadvanced ready). */
void raft_free(struct raft *r);

/*
 * Seed a brand-new cluster: on a node with an empty log and term 0, append
 * one ADD_VOTER conf change per id (term 1, indexes 1..n), all committed.
 * Every founding member must be bootstrapped with the same ids in the same
 * order; nodes added later must not be bootstrapped. The entries come out in
 * the next ready to persist and apply like any other.
 * Errors: -EINVAL (n == 0, id 0, duplicates), -EEXIST (the node already has
 * a log or a term), -EINPROGRESS, -ENOMEM (fatal).
 */
int raft_bootstrap(struct raft *r, const uint64_t *voters, size_t n) MC_MUST_CHECK;

struct raft_conf_change;

/*
 * raft_bootstrap with a context per founding member: ccs[k] (all
 * RAFT_CC_ADD_VOTER, borrowed) becomes the conf change entry at index k+1,
 * context included, so that members added later learn the founders'
 * contexts (e.g. names and peer addresses) from the log. At most 64 ids
 * for raft_bootstrap; any number here. Errors: as raft_bootstrap, and
 * -EINVAL for another type or a NULL context with a length.
 */
int raft_bootstrap_members(struct raft *r, const struct raft_conf_change *ccs,
			   size_t n) MC_MUST_CHECK;

/*
 * Advance logical time by one tick (elections, heartbeats, check quorum,
 * leader transfer timeout). Errors: -EINPROGRESS, fatal codes.
 */
int raft_tick(struct raft *r) MC_MUST_CHECK;

/*
 * Process one message from a peer (borrowed; the core copies what it
 * keeps). Stale or unexpected messages are ignored and return 0.
 * Errors: -EINVAL (m->to is not this node, unknown type, from == 0),
 * -EINPROGRESS, fatal codes.
 */
int raft_step(struct raft *r, const struct raft_msg *m) MC_MUST_CHECK;

/*
 * Append a normal entry (data copied) to the leader's log. *index_out (if
 * not NULL) gets the entry's index: the proposal succeeded iff an entry
 * with that index and the returned term is later committed
 * (term = raft_status().term now). Errors: MC_ENOT_LEADER, -EBUSY (a leader
 * transfer is in progress), -EINVAL (data NULL with len > 0),
 * -EINPROGRESS, -ENOMEM.
 */
int raft_propose(struct raft *r, const void *data, size_t len,
		 uint64_t *index_out) MC_MUST_CHECK;

enum raft_conf_change_type {
	RAFT_CC_ADD_VOTER = 1,
	RAFT_CC_ADD_LEARNER = 2,
	RAFT_CC_PROMOTE = 3, /* learner -> voter */
	RAFT_CC_REMOVE = 4,  /* voter or learner */
};

struct raft_conf_change {
	enum raft_conf_change_type type;
	uint64_t node_id;
	const void *context; /* opaque to the core (e.g. peer addresses) */
	size_t context_len;
};

/*
 * Propose one membership change (it takes effect when appended, see the
 * top). Errors: MC_ENOT_LEADER; -EBUSY (leader transfer in progress);
 * -EAGAIN (a change is still uncommitted, or this leader has not committed
 * an entry of its term yet: retry later); -EEXIST (ADD_* of a member);
 * -ENOENT (REMOVE of a non-member, PROMOTE of a non-learner); -EINVAL (bad
 * type or id, removing the last voter); -EINPROGRESS; -ENOMEM.
 */
int raft_propose_conf_change(struct raft *r, const struct raft_conf_change *cc,
			     uint64_t *index_out) MC_MUST_CHECK;

/* Bytes needed by raft_conf_change_encode. */
size_t raft_conf_change_size(const struct raft_conf_change *cc);
/* Encode into buf (at least raft_conf_change_size bytes); returns length. */
size_t raft_conf_change_encode(const struct raft_conf_change *cc, void *buf);
/*
 * Decode a conf change entry's data; out->context points into data.
 * Errors: -EINVAL (malformed).
 */
int raft_conf_change_decode(const void *data, size_t len,
			    struct raft_conf_change *out) MC_MUST_CHECK;

/*
 * Ask for a linearizable read point. ctx (1..4096 bytes, copied) must be
 * unique among outstanding requests. The answer comes later as a read state
 * {index, ctx} in a ready — from this node's own leadership check or, on a
 * follower, from the leader the request is forwarded to. Requests may be
 * lost (leader change, message loss): the caller times out and retries. A
 * new leader answers only after committing an entry of its term.
 * Errors: MC_ENOT_LEADER (no known leader), -EINVAL (ctx length),
 * -EINPROGRESS, -ENOMEM (fatal).
 */
int raft_read_index(struct raft *r, const void *ctx, size_t len) MC_MUST_CHECK;

/*
 * Hand leadership to voter `to`: proposals are refused while the transfer
 * runs; once `to` has the whole log it gets TIMEOUT_NOW and campaigns. The
 * transfer is abandoned after an election timeout. A second call with
 * another target replaces the first; the same target is a no-op.
 * Errors: MC_ENOT_LEADER, -EINVAL (to is this node or not a voter),
 * -EINPROGRESS, fatal codes.
 */
int raft_transfer_leader(struct raft *r, uint64_t to) MC_MUST_CHECK;

/*
 * Start an election now (a PreVote round first if configured), as if the
 * election timer had fired. A leader ignores it. Errors: -EPERM (not a
 * voter), -EINPROGRESS, fatal codes.
 */
int raft_campaign(struct raft *r) MC_MUST_CHECK;

/*
 * Transport feedback (leader only; ignored otherwise): the snapshot sent to
 * `to` was fully delivered (ok) or failed; `to` is unreachable right now.
 * Errors: -EINPROGRESS, fatal codes.
 */
int raft_report_snapshot(struct raft *r, uint64_t to, bool ok) MC_MUST_CHECK;
int raft_report_unreachable(struct raft *r, uint64_t to) MC_MUST_CHECK;

/*
 * The application made a durable snapshot of its state machine at applied
 * index `index`: remember it as the node's snapshot (to send to lagging
 * followers) and drop log entries <= index - trailing_entries;
 * raft_last_snapshot() then gives the metadata to store beside the data
 * (the transport streams that data when a RAFT_MSG_SNAP leaves). An index at
 * or below the current snapshot is a no-op. Errors: -EINVAL (index above
 * the applied index), -EINPROGRESS, -ENOMEM (fatal).
 */
int raft_compact(struct raft *r, uint64_t index) MC_MUST_CHECK;

/* True when raft_ready would return a non-empty batch. */
bool raft_has_ready(const struct raft *r);

/*
 * Fill rd with the pending work (possibly empty). The batch stays valid and
 * the node frozen until raft_advance. Errors: -EINPROGRESS (a batch is
 * already out), fatal codes.
 */
int raft_ready(struct raft *r, struct raft_ready *rd) MC_MUST_CHECK;

/*
 * The driver finished rd (persisted, sent, applied): release its buffers.
 * Errors: -EINVAL (no batch out), fatal codes.
 */
int raft_advance(struct raft *r, const struct raft_ready *rd) MC_MUST_CHECK;

enum raft_progress_state {
	RAFT_PROGRESS_PROBE = 0,
	RAFT_PROGRESS_REPLICATE = 1,
	RAFT_PROGRESS_SNAPSHOT = 2,
};

/* What the leader knows of one member (itself included). */
struct raft_peer_status {
	uint64_t id;
	bool learner;
	uint64_t match;
	uint64_t next;
	enum raft_progress_state state;
	uint64_t pending_snapshot;
	bool recent_active;
	bool paused;
	size_t inflight;
};

struct raft_status {
	uint64_t id;
	uint64_t term;
	uint64_t vote;
	uint64_t leader;
	enum raft_role role;
	uint64_t commit;
	uint64_t applied;
	uint64_t first_index; /* first entry held; last_index + 1 if none */
	uint64_t last_index;
	uint64_t snapshot_index;
	uint64_t lead_transferee;
	size_t n_voters;
	size_t n_learners;
};

/*
 * Fill st. On a leader, also write up to cap members' progress into peers
 * (may be NULL when cap is 0) and return the number of members; on other
 * roles return 0. Read-only.
 */
size_t raft_status(const struct raft *r, struct raft_status *st,
		   struct raft_peer_status *peers, size_t cap);

/* Term of the entry at index (0 for index 0). Errors: -ENOENT (compacted
 * beyond the snapshot or above the last index). Read-only. */
int raft_term_at(const struct raft *r, uint64_t index, uint64_t *term) MC_MUST_CHECK;

/* The entry at index held in memory, or NULL. Valid until the next call
 * that changes the node. Read-only. */
const struct raft_entry *raft_entry_at(const struct raft *r, uint64_t index);

/* The node's latest snapshot metadata (index 0 when none). Valid until the
 * next call that changes the node. Read-only. */
const struct raft_snapshot_meta *raft_last_snapshot(const struct raft *r);

/* The configuration in force (the latest in the log). Arrays valid until
 * the next call that changes the node. Read-only. */
struct raft_conf_state raft_conf(const struct raft *r);

const char *raft_role_name(enum raft_role role);
const char *raft_msg_type_name(enum raft_msg_type type);

#endif
