/*
 * raft_int: internals shared by the Raft core's files (not for other
 * subsystems). Everything here is owned by one struct raft.
 *
 *   data.c      reference-counted entry payloads
 *   log.c       the in-memory log after the last compaction
 *   conf.c      membership sets and the conf change encoding
 *   progress.c  the leader's per-member replication state
 *   raft.c      the state machine itself, ready/advance, queries
 */
#ifndef MC_META_RAFT_RAFT_INT_H
#define MC_META_RAFT_RAFT_INT_H

#include <stdarg.h>

#include "meta/raft/raft.h"

/* ------------------------------------------------------------- payloads */

/*
 * Entry data held by the core lives in a reference-counted block, so the
 * log and queued messages can share it. NULL stands for "no data".
 * raft__data_new copies len bytes (len 0 gives NULL). Errors: -ENOMEM.
 */
int raft__data_new(const void *src, size_t len, const void **out) MC_MUST_CHECK;
void raft__data_ref(const void *data);
void raft__data_unref(const void *data);

/* ------------------------------------------------------------------ log */

/*
 * ents[k] has index prev_index + 1 + k. prev_term is the term at
 * prev_index (the last compacted entry, or the snapshot the log restarted
 * from). Every ents[k].data is one reference owned by the log.
 */
struct raft__log {
	uint64_t prev_index;
	uint64_t prev_term;
	struct raft_entry *ents;
	size_t n;
	size_t cap;
};

void raft__log_init(struct raft__log *l);
void raft__log_free(struct raft__log *l);
uint64_t raft__log_last_index(const struct raft__log *l);
uint64_t raft__log_last_term(const struct raft__log *l);
/* Term at index; 0 for index 0. Errors: -ENOENT (not held). */
int raft__log_term(const struct raft__log *l, uint64_t index, uint64_t *term) MC_MUST_CHECK;
bool raft__log_match(const struct raft__log *l, uint64_t index, uint64_t term);
/* Entry at index, NULL if not held (index <= prev_index or > last). */
const struct raft_entry *raft__log_get(const struct raft__log *l, uint64_t index);
/* Room for extra more entries. Errors: -ENOMEM. */
int raft__log_reserve(struct raft__log *l, size_t extra) MC_MUST_CHECK;
/* Append e (index must be last + 1); takes e->data's reference. Needs
 * room from raft__log_reserve. */
void raft__log_push(struct raft__log *l, const struct raft_entry *e);
/* Drop entries with index >= from (from > prev_index). */
void raft__log_truncate(struct raft__log *l, uint64_t from);
/* Drop entries with index <= upto (prev_index < upto <= last). */
void raft__log_compact(struct raft__log *l, uint64_t upto);
/* Drop everything; the log restarts after (index, term). */
void raft__log_reset(struct raft__log *l, uint64_t index, uint64_t term);

/* ----------------------------------------------------------------- conf */

struct raft__conf {
	uint64_t *voters; /* sorted */
	size_t n_voters;
	uint64_t *learners; /* sorted */
	size_t n_learners;
};

void raft__conf_init(struct raft__conf *c);
void raft__conf_free(struct raft__conf *c);
/* dst = copy of src (dst's old contents freed on success). Errors: -ENOMEM. */
int raft__conf_copy(struct raft__conf *dst, const struct raft__conf *src) MC_MUST_CHECK;
int raft__conf_from_state(struct raft__conf *dst,
			  const struct raft_conf_state *s) MC_MUST_CHECK;
struct raft_conf_state raft__conf_view(const struct raft__conf *c);
bool raft__conf_is_voter(const struct raft__conf *c, uint64_t id);
bool raft__conf_is_learner(const struct raft__conf *c, uint64_t id);
/*
 * Whether cc may be applied to c: 0, -EEXIST, -ENOENT or -EINVAL (see
 * raft_propose_conf_change).
 */
int raft__conf_check(const struct raft__conf *c, const struct raft_conf_change *cc);
/*
 * Apply cc to c. A change that raft__conf_check refuses is a no-op (all
 * nodes treat a logged entry the same way). Errors: -ENOMEM (c unchanged).
 */
int raft__conf_apply(struct raft__conf *c, const struct raft_conf_change *cc) MC_MUST_CHECK;

/* ------------------------------------------------------------- progress */

/* Ring of the last index of each APP in flight to one follower. */
struct raft__inflights {
	uint64_t *buf;
	size_t start;
	size_t count;
	size_t cap;
};

struct raft__progress {
	uint64_t id;
	bool learner;
	uint64_t match;
	uint64_t next;
	enum raft_progress_state state;
	uint64_t pending_snapshot;
	bool recent_active;
	bool probe_sent; /* PROBE: an APP is out, wait for an answer */
	struct raft__inflights inflights;
};

/* Errors: -ENOMEM. */
int raft__progress_init(struct raft__progress *p, uint64_t id, bool learner, uint64_t next,
			size_t max_inflight) MC_MUST_CHECK;
void raft__progress_free(struct raft__progress *p);
void raft__progress_become_probe(struct raft__progress *p);
void raft__progress_become_replicate(struct raft__progress *p);
void raft__progress_become_snapshot(struct raft__progress *p, uint64_t index);
/* An accepted APP_RESP for index n: true if match moved. */
bool raft__progress_maybe_update(struct raft__progress *p, uint64_t n);
/* A rejected APP for index `rejected` with a hint: true unless stale. */
bool raft__progress_maybe_decr_to(struct raft__progress *p, uint64_t rejected,
				  uint64_t match_hint);
bool raft__progress_is_paused(const struct raft__progress *p);
void raft__inflights_add(struct raft__inflights *in, uint64_t index);
void raft__inflights_free_le(struct raft__inflights *in, uint64_t index);
void raft__inflights_free_first(struct raft__inflights *in);
bool raft__inflights_full(const struct raft__inflights *in);
void raft__inflights_reset(struct raft__inflights *in);

/* ----------------------------------------------------------------- core */

struct raft__vote {
	uint64_t id;
	bool granted;
};

/* A ReadIndex request waiting at the leader. ctx is owned. */
struct raft__read_req {
	uint64_t index;
	uint64_t from;
	void *ctx;
	size_t ctx_len;
	uint64_t *acks;
	size_t n_acks;
	size_t cap_acks;
};

struct raft {
	struct raft_config cfg;
	int fatal; /* sticky fatal error, 0 if healthy */
	uint64_t id;

	/* hard state */
	uint64_t term;
	uint64_t vote;

	/* soft state */
	uint64_t leader;
	enum raft_role role;

	struct raft__log log;
	uint64_t commit;
	uint64_t applied;
	uint64_t stable; /* last index handed out to persist (durable after advance) */

	/* latest snapshot */
	uint64_t snap_index;
	uint64_t snap_term;
	struct raft__conf snap_conf;
	struct raft_snapshot_meta snap_view;
	bool snap_pending; /* restored from a leader, not yet in a ready */

	/* configuration in force and the index of the entry that made it */
	struct raft__conf conf;
	uint64_t conf_index; /* 0: it comes from the snapshot */

	/* leader: one progress per member */
	struct raft__progress *prs;
	size_t n_prs;

	/* (pre-)candidate: responses so far */
	struct raft__vote *votes;
	size_t n_votes;
	size_t cap_votes;

	unsigned election_elapsed;
	unsigned heartbeat_elapsed;
	unsigned rand_timeout;
	uint64_t lead_transferee;

	/* leader: read requests waiting for a heartbeat quorum, FIFO */
	struct raft__read_req *reads;
	size_t n_reads;
	size_t cap_reads;
	/* leader: read requests waiting for the first commit of the term */
	struct raft__read_req *early_reads;
	size_t n_early_reads;
	size_t cap_early_reads;

	/* output */
	struct raft_msg *msgs;
	size_t n_msgs;
	size_t cap_msgs;
	struct raft_read_state *rss;
	size_t n_rss;
	size_t cap_rss;

	/* what the last ready reported */
	struct raft_hard_state prev_hs;
	uint64_t prev_leader;
	enum raft_role prev_role;

	/* the ready that is out, if any */
	bool ready_out;
	struct raft_hard_state rd_hs;
	uint64_t rd_leader;
	enum raft_role rd_role;
	uint64_t rd_stable;
	uint64_t rd_applied;
	bool rd_snap;

	uint64_t rng;
};

#endif
