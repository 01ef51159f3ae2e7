/*
 * compact: etcd's automatic compaction (--auto-compaction-mode,
 * --auto-compaction-retention), so that the history a compaction could
 * drop does not pile up in memory, in every snapshot and in every
 * snapshot sent to a member that lags.
 *
 * As etcd 3.4's compactors do:
 *   periodic, retention R: every member notes the store's revision every
 *     R/10 (at most every 6 minutes); once R has passed since the start or
 *     the last compaction (then every R, at most every hour), the leader
 *     compacts to the revision noted R ago — history older than R goes.
 *   revision, retention N: every 5 minutes the leader compacts to the
 *     current revision minus N.
 * A compaction is an ordinary Compaction request through the log, so
 * every member applies it at the same point. A failed one is tried again
 * at the next note (periodic) or after the next interval (revision);
 * "already compacted" counts as done. The decisions are a pure function
 * of the time and revisions passed in (meta__compactor_step), which
 * test_meta_compact drives with a fake clock.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/cfg.h"
#include "common/log.h"
#include "common/util.h"
#include "meta/meta_int.h"

#define LOG_SUBSYS LOGS_META

#define HOUR_MS 3600000u
/* etcd's revision compactor runs every 5 minutes. */
#define REVISION_INTERVAL_MS 300000u
/* etcd notes the revision 10 times per period. */
#define SAMPLES_PER_PERIOD 10u
/* The most revision-log entries one compaction walks (the rest in later
 * steps): 0.3-1 us each, the member serving nothing meanwhile. */
#define COMPACT_STEP_ENTRIES 65536u

static bool all_digits(const char *s)
{
	if (!*s)
		return false;
	for (; *s; s++)
		if (!isdigit((unsigned char)*s))
			return false;
	return true;
}

int meta__compactor_init(struct meta__compactor *c, const char *mode, const char *retention)
{
	memset(c, 0, sizeof(*c));
	mode = mode && *mode ? mode : "periodic";
	retention = retention && *retention ? retention : "0";
	if (strcmp(mode, "periodic") == 0) {
		uint64_t ms = 0;
		c->periodic = true;
		if (all_digits(retention)) {
			/* etcd: a bare number is hours */
			char *end;
			unsigned long long h = strtoull(retention, &end, 10);
			if (h > UINT64_MAX / HOUR_MS)
				goto bad;
			ms = h * HOUR_MS;
		} else if (cfg_parse_duration_ms(retention, &ms)) {
			goto bad;
		}
		c->period_ms = ms;
		c->interval_ms = ms < HOUR_MS ? ms : HOUR_MS;
		c->sample_ms = c->interval_ms / SAMPLES_PER_PERIOD;
		if (ms && !c->sample_ms)
			c->sample_ms = 1;
		c->cap_revs = ms ? (size_t)(ms / c->sample_ms) + 1 : 0;
		if (c->cap_revs && !(c->revs = calloc(c->cap_revs, sizeof(*c->revs))))
			return -ENOMEM;
		return 0;
	}
	if (strcmp(mode, "revision") == 0) {
		char *end;
		if (!all_digits(retention))
			goto bad;
		errno = 0;
		unsigned long long n = strtoull(retention, &end, 10);
		if (errno || n > INT64_MAX)
			goto bad;
		c->keep_revs = (int64_t)n;
		c->interval_ms = REVISION_INTERVAL_MS;
		return 0;
	}
	log_error("--auto-compaction-mode=%s: periodic or revision", mode);
	return MC_ECONFIG;
bad:
	log_error("--auto-compaction-retention=%s: not a %s", retention,
		  strcmp(mode, "periodic") == 0 ? "duration (5m, 1h; a bare number is hours)"
						: "revision count");
	return MC_ECONFIG;
}

void meta__compactor_free(struct meta__compactor *c)
{
	free(c->revs);
	c->revs = NULL;
}

bool meta__compactor_on(const struct meta__compactor *c)
{
	return c->periodic ? c->period_ms > 0 : c->keep_revs > 0;
}

bool meta__compactor_step(struct meta__compactor *c, uint64_t now_ms, int64_t rev,
			  int64_t compacted_rev, bool leader, int64_t *to)
{
	if (!meta__compactor_on(c))
		return false;
	if (!c->started) {
		c->started = true;
		c->last_ms = now_ms;
		c->next_sample_ms = now_ms;
		c->wait_ms = c->periodic ? c->period_ms : c->interval_ms;
	}
	if (c->periodic && now_ms >= c->next_sample_ms) {
		if (c->n_revs == c->cap_revs) {
			memmove(c->revs, c->revs + 1, (c->n_revs - 1) * sizeof(*c->revs));
			c->n_revs--;
		}
		c->revs[c->n_revs++] = rev;
		c->next_sample_ms = now_ms + c->sample_ms;
	}
	if (!leader || c->in_flight)
		return false;
	if (c->goal > 0 && c->goal > compacted_rev) {
		/* A compaction taken in steps goes on. */
		if (now_ms < c->step_ms)
			return false;
		c->in_flight = true;
		*to = c->goal;
		return true;
	}
	c->goal = 0;
	if (now_ms < c->retry_ms || now_ms - c->last_ms < c->wait_ms)
		return false;
	int64_t target = c->periodic ? (c->n_revs ? c->revs[0] : 0) : rev - c->keep_revs;
	if (target <= compacted_rev || target <= 0 ||
	    (!c->periodic && target == c->prev_rev)) {
		/* Nothing new to drop: look again after a whole interval. */
		c->last_ms = now_ms;
		c->wait_ms = c->interval_ms;
		return false;
	}
	c->in_flight = true;
	c->goal = target;
	*to = target;
	return true;
}

void meta__compactor_done(struct meta__compactor *c, uint64_t now_ms, int64_t rev, bool ok)
{
	c->in_flight = false;
	if (!ok) {
		/* Again at the next note (periodic), or after an interval. */
		c->goal = 0;
		c->retry_ms = now_ms + (c->periodic ? c->sample_ms : c->interval_ms);
		return;
	}
	if (rev < c->goal) {
		c->step_ms = now_ms + META_COMPACT_STEP_GAP_MS;
		return; /* a step: the rest follows */
	}
	c->goal = 0;
	c->last_ms = now_ms;
	c->wait_ms = c->interval_ms;
	c->prev_rev = rev;
}

/* ---- the node's side */

struct compact_call {
	struct meta_node *n;
	int64_t rev;
};

static void on_compacted(struct meta__op *op, int status, const char *message,
			 const ProtobufCMessage *resp)
{
	struct compact_call *cc = op->ud;
	struct meta_node *n = cc->n;
	(void)resp;
	/* "required revision has been compacted": someone got there first. */
	bool ok = status == RPC_OK || status == RPC_OUT_OF_RANGE;
	if (ok)
		log_info("auto-compaction at revision %" PRId64 " done", cc->rev);
	else if (!n->stopping)
		log_warn("auto-compaction at revision %" PRId64
			 " failed: %s; trying again later",
			 cc->rev, message ? message : "");
	meta__compactor_done(&n->compactor, meta__now(n), cc->rev, ok);
	free(cc);
}

void meta__compactor_tick(struct meta_node *n)
{
	int64_t goal = 0;
	struct mvcc_store *st = n->sm.store;
	if (!meta__compactor_step(
		    &n->compactor, meta__now(n), mvcc_rev(st), mvcc_compact_rev(st),
		    meta__is_leader(n) && !n->stopping && !mvcc_compact_pending(st), &goal))
		return;
	/* A compaction is applied at once and its versions are freed in
	 * slices (meta__compact_resume), but the members free them at the
	 * same time, on shared cores: one that would walk more of the
	 * history than COMPACT_STEP_ENTRIES goes in steps (each its own
	 * entry in the log), the next once this member freed the last. */
	int64_t to = mvcc_compact_step(st, goal, COMPACT_STEP_ENTRIES);
	struct compact_call *cc = malloc(sizeof(*cc));
	Etcdserverpb__CompactionRequest q = ETCDSERVERPB__COMPACTION_REQUEST__INIT;
	q.revision = to;
	struct meta__op *op =
		cc ? meta__op_new(n, META_M_COMPACT, &q.base, 0, on_compacted, cc) : NULL;
	if (!op) {
		free(cc);
		meta__compactor_done(&n->compactor, meta__now(n), to, false);
		log_warn("out of memory for an auto-compaction request");
		return;
	}
	cc->n = n;
	cc->rev = to;
	if (to < goal)
		log_info("auto-compaction to revision %" PRId64 ": a step to %" PRId64, goal,
			 to);
	else if (n->compactor.periodic)
		log_info("auto-compaction to revision %" PRId64 " (keeping %" PRIu64
			 " s of history)",
			 to, n->compactor.period_ms / 1000);
	else
		log_info("auto-compaction to revision %" PRId64 " (keeping %" PRId64
			 " revisions)",
			 to, n->compactor.keep_revs);
	meta__submit(n, op);
}

/* Freed per turn of the loop, in batches of FREE_BATCH log entries, until
 * FREE_SLICE_NS passed: requests and heartbeats are served in between. */
#define FREE_BATCH 256u
#define FREE_SLICE_NS 1000000ull
/* A compaction whose freeing took longer than this is logged. */
#define FREE_LOG_MS 1000u

static void on_compact_idle(uv_idle_t *h)
{
	struct meta_node *n = MC_CONTAINER_OF(h, struct meta_node, compact_idle);
	struct mvcc_store *st = n->sm.store;

	if (meta__snapshot_encoding(n) || !mvcc_compact_pending(st)) {
		uv_idle_stop(h); /* the snapshot's end resumes */
		return;
	}
	uint64_t t0 = mc_now_ns(), t;
	int done;
	do {
		done = mvcc_compact_work(st, FREE_BATCH);
		t = mc_now_ns();
	} while (!done && t - t0 < FREE_SLICE_NS);
	n->compact_free_ns += t - t0;
	if (!done)
		return;
	uv_idle_stop(h);
	uint64_t took = meta__now(n) - n->compact_free_ms;
	if (took >= FREE_LOG_MS)
		log_info("freed the versions compacted at revision %" PRId64 " in %" PRIu64
			 " ms, %" PRIu64 " ms of them on the loop",
			 mvcc_compact_rev(st), took, n->compact_free_ns / 1000000);
	n->compact_free_ns = 0;
	meta__maybe_snapshot(n); /* one may have waited */
}

void meta__compact_resume(struct meta_node *n)
{
	if (!n->handles_open || uv_is_active((uv_handle_t *)&n->compact_idle) ||
	    !mvcc_compact_pending(n->sm.store) || meta__snapshot_encoding(n))
		return;
	if (!n->compact_free_ns) /* a new compaction, not one resumed */
		n->compact_free_ms = meta__now(n);
	uv_idle_start(&n->compact_idle, on_compact_idle);
}
