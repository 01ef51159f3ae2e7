/*
 * watch: the watcher registry of the meta state machine — the matching
 * core of etcd's watchableStore, without goroutines or channels.
 *
 * A watcher watches a key or a range (etcd rules: empty range_end is the
 * key alone, "\0" every key >= key) from a start revision, with prev_kv,
 * NOPUT/NODELETE filters and progress_notify. Watch IDs are registry-wide
 * (the service maps them to per-stream IDs) and each watcher carries the
 * caller's tag (e.g. its stream).
 *
 * Flow, all driven by the service's apply loop:
 *  - watch_notify(reg, store) after applying writes: every revision the
 *    store applied since the last call is read from the store's revision
 *    log and routed, in revision order, to the synced watchers that match
 *    (single-key watchers through a tree of keys, range watchers through an
 *    interval tree: O(log W + matches) per event, not O(W)). The service
 *    does not pass events in, so it cannot drop or reorder one.
 *  - A watcher whose start revision is in the past is "unsynced";
 *    watch_sync(reg, store, budget) catches unsynced watchers up from the
 *    store's history, a bounded amount of work per call, and moves them to
 *    synced when they reach the routed revision. A start revision below the
 *    store's compaction yields a delivery with compact_revision set and
 *    canceled (etcd's behaviour); the watcher is then gone.
 *  - Each watcher has a pending-event buffer of max_pending_events. Slow
 *    consumers never block and never lose events: when a revision's events
 *    do not fit, they are dropped from the buffer and the watcher becomes
 *    unsynced from that revision — etcd's policy — and is caught up from
 *    history once the service has taken what is buffered. Buffers hold
 *    whole revisions: a revision larger than the bound is accepted into an
 *    empty buffer. If the history it needs is compacted meanwhile, the
 *    watcher gets the compacted/canceled delivery instead of a gap.
 *  - watch_next_ready()/watch_take() hand out what a watcher has to say
 *    (events, or the compaction notice), in a deterministic FIFO order.
 *  - watch_progress() yields the idle watchers due for a progress
 *    notification and the revision to report.
 *
 * Events are shared, reference-counted copies: one copy per event however
 * many watchers receive it. Not thread-safe; the apply loop owns it.
 */
#ifndef MC_META_WATCH_H
#define MC_META_WATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "meta/mvcc.h"

struct watch_registry;

struct watch_options {
	const char *key; /* borrowed; copied */
	size_t key_len;
	const char *range_end;
	size_t range_end_len;
	int64_t start_revision; /* <= 0: from the next revision */
	int64_t id;             /* > 0: use this ID; 0: pick one */
	uint64_t tag;           /* returned in deliveries */
	bool prev_kv;
	bool progress_notify;
	bool filter_noput;
	bool filter_nodelete;
};

/* What one watcher has to say; caller storage, owned until
 * watch_delivery_free(). */
struct watch_delivery {
	/* public */
	int64_t watch_id;
	uint64_t tag;
	int64_t revision;                 /* header revision: every event of the watch up to
	                     it has now been handed out */
	const struct mvcc_event **events; /* in revision order; prev_kv only
	                                     when the watcher asked for it */
	size_t nevents;
	int64_t compact_revision; /* non-zero: the start revision (or the
	                             history needed) is compacted */
	bool canceled;            /* the watcher is gone (compaction) */
	/* private */
	struct watch__ev **refs;
};

/*
 * A registry for watches on store s, which has been notified up to its
 * current revision. max_pending_events bounds each watcher's buffer
 * (0: 1024). The store is not kept: every call that reads it takes it.
 * Errors: -ENOMEM.
 */
int watch_registry_new(const struct mvcc_store *s, size_t max_pending_events,
		       struct watch_registry **out) MC_MUST_CHECK;
void watch_registry_free(struct watch_registry *r);

/* The most memory a watcher of r on a key of klen and a range end of elen
 * bytes can take: its struct, its copies of the keys and a full buffer of
 * pending events (the events themselves are shared). */
size_t watch_cost(const struct watch_registry *r, size_t klen, size_t elen);

/*
 * Register a watcher; *id_out gets its ID. Errors: MVCC_EEMPTY_WATCH_RANGE
 * (range_end <= key), MVCC_EWATCH_EXISTS, -EINVAL (negative id), -ENOMEM.
 * A start revision below the compaction is not an error: the watcher is
 * created and its first delivery is the compaction notice.
 */
int watch_create(struct watch_registry *r, const struct mvcc_store *s,
		 const struct watch_options *opts, int64_t *id_out) MC_MUST_CHECK;
/* Remove a watcher and what it had pending. Errors: MVCC_EWATCH_NOT_FOUND. */
int watch_cancel(struct watch_registry *r, int64_t id) MC_MUST_CHECK;

/* Route every revision of s after the last one routed. Never fails: a
 * watcher that cannot take an event (full buffer, no memory) goes
 * unsynced and is caught up later. */
void watch_notify(struct watch_registry *r, const struct mvcc_store *s);

/*
 * Catch unsynced watchers up from s's history, round-robin, looking at
 * about max_entries revision-log entries in all (whole revisions). Returns
 * how many watchers are still unsynced.
 */
size_t watch_sync(struct watch_registry *r, const struct mvcc_store *s, size_t max_entries);

/*
 * Keep a watcher off (paused) or back on the ready FIFO: the service
 * pauses the watchers of a stream whose client does not read, so that
 * watch_next_ready() only names watchers it can deliver to. A paused
 * watcher keeps collecting events up to its bound and then goes unsynced
 * like any slow watcher. Errors: MVCC_EWATCH_NOT_FOUND.
 */
int watch_pause(struct watch_registry *r, int64_t id, bool paused) MC_MUST_CHECK;

/* The watcher that has waited longest with something to deliver. */
bool watch_next_ready(const struct watch_registry *r, int64_t *id_out);
/*
 * Take everything a watcher has pending: its buffered events, or, once
 * those are taken, its compaction notice (after which the watcher no
 * longer exists). An empty delivery when there is nothing.
 * Errors: MVCC_EWATCH_NOT_FOUND, -ENOMEM (nothing taken).
 */
int watch_take(struct watch_registry *r, int64_t id, struct watch_delivery *out) MC_MUST_CHECK;
void watch_delivery_free(struct watch_delivery *d);

/*
 * The progress tick (etcd's progress-notify interval, timed by the
 * service): the IDs of the watchers created with progress_notify that are
 * synced, have nothing pending and received no event since the previous
 * tick, in ID order, into a new array (free()); *rev gets the revision to
 * report. Errors: -ENOMEM.
 */
int watch_progress(struct watch_registry *r, int64_t **ids_out, size_t *n_out,
		   int64_t *rev) MC_MUST_CHECK;
/* A client's RequestProgress for one watcher: the revision it may report.
 * Errors: MVCC_EWATCH_NOT_FOUND, -EAGAIN (unsynced or events pending:
 * deliver those first). */
int watch_progress_request(const struct watch_registry *r, int64_t id,
			   int64_t *rev) MC_MUST_CHECK;

struct watch_stats {
	size_t watchers;
	size_t synced;
	size_t unsynced;
	size_t pending_events;
	int64_t revision; /* last revision routed */
};
void watch_stats(const struct watch_registry *r, struct watch_stats *out);

#endif
