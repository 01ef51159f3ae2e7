/*
 * snapshot: this member's own snapshots, taken every --snapshot-count
 * applied entries, without stopping the member.
 *
 * The state machine lives in memory, so a snapshot is a copy of it as it
 * stood at the applied index. Encoding it whole on the loop would stop
 * the member from answering heartbeats and requests for as long as that
 * takes — seconds for a few hundred megabytes, long enough to cost it
 * its leadership. (Forking a frozen copy to write it costs as much here:
 * once the member and its copy share pages, each page the member writes
 * is copied first, and on this project's virtual machines that made
 * every write thousands of times slower while the copy lived.) Instead
 * the snapshot is encoded on the loop a slice at a time (SLICE_NS per
 * turn, from an idle handle, so requests and heartbeats are served in
 * between) by the MVCC store's snapshot cursor, which encodes the store
 * as it was at the applied index while later entries go on being applied
 * (they only add versions above that revision). A libuv worker creates
 * the snapshot file (creating a file waits for the journal) and writes
 * each filled buffer to the snapshot file (snap.h, on disk in steps) while
 * the loop fills the next, then commits it (fsync, rename; older
 * snapshots are set aside); then the disk thread records the snapshot in
 * the WAL and sets aside the segments before the oldest snapshot kept, and
 * the core compacts its log behind it. A libuv worker deletes what was
 * set aside a few megabytes at a time (meta__tidy): deleted at once, a
 * few hundred megabytes stall every fdatasync of the disk — the WAL's on
 * the disk thread, which puts wait for — for seconds. A
 * compaction's versions are freed (meta__compact_resume) only while no
 * snapshot is being encoded, and a snapshot starts only once they are
 * all freed; a client's physical compaction (it frees them at once), a
 * snapshot received from the leader (it replaces the state) or a stop
 * abandons the snapshot; the next turn starts another.
 *
 * Reading a snapshot file whole is here too (recovery, and sending one to
 * a member that lags).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/util.h"
#include "meta/meta_int.h"

#define LOG_SUBSYS LOGS_META

/*
 * Encoded per turn of the loop: steps of STEP_BYTES until SLICE_NS have
 * passed. The loop polls for requests and Raft messages only between
 * slices, and a write passes through several turns of the loop on the
 * leader and on a follower, so a slice is added to a request several
 * times over: slices are bounded by time, not bytes, because a busy
 * machine makes the same bytes take many times longer.
 */
#define STEP_BYTES ((size_t)64 << 10)
#define SLICE_NS 1000000ull
/* Handed to the writer at a time; the loop fills one while it writes one.
 * Both buffers get their full size at the start (a step may overrun by
 * about a step): grown by doubling, the step that crossed 8 MiB copied
 * the buffer and touched 8 MiB of new pages at once, 24-38 ms on the
 * loop; reserved, the pages are touched a step at a time. */
#define BUF_BYTES ((size_t)8 << 20)
#define BUF_ROOM (BUF_BYTES + 2 * STEP_BYTES)

struct meta__snap_job {
	struct meta_node *n;
	uint64_t index, term;
	struct mvcc_snap_cursor *cur;
	struct snap_writer *wr;
	uint8_t *conf;
	size_t conf_len;
	struct mc_buf fill; /* being encoded into, on the loop */
	struct mc_buf out;  /* with the writer */
	uv_work_t work;     /* writes out, or commits */
	bool writing;       /* the worker has out (or the commit) */
	bool encoded;       /* the cursor is done */
	bool committing;
	bool marking; /* wal_job is with the disk worker */
	bool abandon; /* give up once the worker returns */
	int rc;       /* the worker's */
	uint64_t bytes;
	uint64_t start_ms, loop_ns; /* wall time, and the loop's share of it */
	struct meta__job wal_job;
};

static void snap_job_free(struct meta__snap_job *s)
{
	mvcc_snap_free(s->cur);
	if (s->wr)
		snap_writer_abort(s->wr);
	mc_buf_free(&s->fill);
	mc_buf_free(&s->out);
	free(s->conf);
	free(s);
}

/* The job is over (done or given up): forget it. */
static void snap_job_end(struct meta_node *n, struct meta__snap_job *s)
{
	if (n->snap_job == s) {
		n->snap_job = NULL;
		uv_idle_stop(&n->snap_idle);
		metric_set(n->m_snap_writing, 0);
	}
	snap_job_free(s);
	meta__compact_resume(n);
	meta__check_stopped(n);
}

bool meta__snapshot_encoding(const struct meta_node *n)
{
	return n->snap_job && !n->snap_job->encoded;
}

static int sink(void *ctx, const void *data, size_t len)
{
	struct meta__snap_job *s = ctx;
	s->bytes += len;
	return mc_buf_append(&s->fill, data, len);
}

static void snap_marker_work(struct meta__job *j)
{
	struct meta__snap_job *s = MC_CONTAINER_OF(j, struct meta__snap_job, wal_job);
	struct meta_node *n = s->n;
	uint64_t oldest = 0;
	int rc;

	j->rc = 0;
	if (wal_snapshot(n->wal).index >= s->index)
		return; /* a newer snapshot (from the leader) is already there */
	/* Not synced here: the release below syncs it first when it has
	 * segments to drop, else the next save's fdatasync takes it along (a
	 * crash before leaves the committed snapshot file newer than the
	 * newest marker, which recovery handles). */
	rc = wal_save_snapshot(n->wal, (struct wal_snap_ref){s->index, s->term}, false);
	if (rc) {
		j->rc = rc;
		return;
	}
	/* Keep the WAL from the oldest snapshot kept, so recovery can fall
	 * back to it if the newest turns out unreadable. */
	if (snap_oldest_index(n->snap_dir, &oldest) == 0 && oldest &&
	    (rc = wal_release_to(n->wal, oldest)))
		log_warn("cannot release WAL segments up to %" PRIu64 ": %s", oldest,
			 mc_strerror(rc));
}

struct tidy_job {
	uv_work_t work;
	struct meta_node *n;
	unsigned segs, snaps; /* deleted */
	uint64_t ms;
};

static void tidy_work(uv_work_t *w)
{
	struct tidy_job *t = MC_CONTAINER_OF(w, struct tidy_job, work);
	uint64_t t0 = mc_now_ms();
	/* Failures are logged there; the next tidy tries again. */
	(void)!wal_remove_released(t->n->wal_dir, &t->segs);
	(void)!snap_remove_purged(t->n->snap_dir, &t->snaps);
	t->ms = mc_now_ms() - t0;
}

static void tidy_done(uv_work_t *w, int status)
{
	struct tidy_job *t = MC_CONTAINER_OF(w, struct tidy_job, work);
	struct meta_node *n = t->n;
	(void)status; /* cancelled: the files wait for the next tidy */
	if (t->segs || t->snaps)
		log_info("deleted %u released WAL segments and %u old snapshots in %" PRIu64
			 " ms",
			 t->segs, t->snaps, t->ms);
	free(t);
	n->uv_works--;
	n->tidying = false;
	if (n->tidy_again && !n->stopping) {
		n->tidy_again = false;
		meta__tidy(n);
	}
	meta__check_stopped(n);
}

void meta__tidy(struct meta_node *n)
{
	if (n->stopping || !n->handles_open)
		return; /* what is left waits for the next start's first tidy */
	if (n->tidying) {
		n->tidy_again = true;
		return;
	}
	struct tidy_job *t = calloc(1, sizeof(*t));
	if (!t) {
		log_warn("cannot delete released WAL segments and old snapshots now: %s",
			 mc_strerror(-ENOMEM));
		return;
	}
	t->n = n;
	int rc = uv_queue_work(n->loop, &t->work, tidy_work, tidy_done);
	if (rc) {
		log_warn("cannot delete released WAL segments and old snapshots now: %s",
			 uv_strerror(rc));
		free(t);
		return;
	}
	n->uv_works++;
	n->tidying = true;
}

static void snap_marker_done(struct meta__job *j)
{
	struct meta__snap_job *s = MC_CONTAINER_OF(j, struct meta__snap_job, wal_job);
	struct meta_node *n = s->n;

	n->disk_jobs--;
	s->marking = false;
	if (j->rc) {
		meta__fatal(n, j->rc, "cannot record a snapshot in the WAL");
	} else {
		if (s->index > n->snap_index)
			n->snap_index = s->index;
		n->pending_compact = s->index;
		metric_inc(n->m_snapshots);
		log_info("snapshot at index %" PRIu64 " (%" PRIu64 " bytes) saved in %" PRIu64
			 " ms, %" PRIu64 " ms of them encoding on the loop; log compacted",
			 s->index, s->bytes, meta__now(n) - s->start_ms, s->loop_ns / 1000000);
		meta__kick(n);
		meta__tidy(n);
	}
	snap_job_end(n, s);
}

static void give_up(struct meta_node *n, struct meta__snap_job *s, int rc)
{
	if (!n->stopping && !n->fatal && rc)
		log_warn("snapshot at index %" PRIu64 " abandoned: %s", s->index,
			 rc == MVCC_ESNAPSHOT_STALE ? "the store was compacted meanwhile"
						    : meta__strerror(rc));
	snap_job_end(n, s);
}

static void hand_off(struct meta_node *n, struct meta__snap_job *s);

static void write_work(uv_work_t *w)
{
	struct meta__snap_job *s = MC_CONTAINER_OF(w, struct meta__snap_job, work);
	if (!s->wr) {
		/* Created here, not on the loop: creating a file waits for the
		 * file system's journal, which a busy disk can hold for tens
		 * of milliseconds. Errors are logged there. */
		struct snap_meta m = {s->index, s->term, s->conf, s->conf_len};
		if ((s->rc = snap_writer_open(s->n->snap_dir, &m, &s->wr)))
			return;
		snap_writer_pace(s->wr);
	}
	if (s->committing) {
		s->rc = snap_writer_commit(s->wr, META_SNAPSHOTS_KEPT);
		s->wr = NULL; /* commit frees it, whatever happened */
	} else {
		s->rc = snap_writer_write(s->wr, s->out.data, s->out.len);
	}
}

static void write_done(uv_work_t *w, int status)
{
	struct meta__snap_job *s = MC_CONTAINER_OF(w, struct meta__snap_job, work);
	struct meta_node *n = s->n;

	n->uv_works--;
	s->writing = false;
	s->out.len = 0;
	if (status || s->rc || s->abandon) {
		give_up(n, s, s->abandon ? 0 : status ? status : s->rc);
		return;
	}
	if (s->committing) {
		/* On disk: record it in the WAL. */
		s->wal_job.work = snap_marker_work;
		s->wal_job.done = snap_marker_done;
		s->marking = true;
		n->disk_jobs++;
		meta__worker_submit(n->disk, &s->wal_job);
		return;
	}
	if (s->encoded || s->fill.len >= BUF_BYTES)
		hand_off(n, s);
	else
		uv_idle_start(&n->snap_idle, meta__on_snap_idle);
}

/* Give the filled buffer to a worker; after the last one, commit. */
static void hand_off(struct meta_node *n, struct meta__snap_job *s)
{
	if (s->writing)
		return;
	if (s->fill.len) {
		struct mc_buf t = s->out;
		s->out = s->fill;
		s->fill = t;
		s->fill.len = 0;
	} else if (s->encoded) {
		s->committing = true;
	} else {
		return;
	}
	int rc = uv_queue_work(n->loop, &s->work, write_work, write_done);
	if (rc) {
		s->committing = false;
		give_up(n, s, rc);
		return;
	}
	n->uv_works++;
	s->writing = true;
}

void meta__on_snap_idle(uv_idle_t *h)
{
	struct meta_node *n = MC_CONTAINER_OF(h, struct meta_node, snap_idle);
	struct meta__snap_job *s = n->snap_job;

	if (!s || s->encoded || (s->writing && s->fill.len >= BUF_BYTES)) {
		uv_idle_stop(h); /* the writer's completion restarts it */
		return;
	}
	uint64_t t0 = mc_now_ns(), t;
	int rc;
	do {
		rc = mvcc_snap_step(s->cur, STEP_BYTES);
		t = mc_now_ns();
	} while (rc == 0 && t - t0 < SLICE_NS && s->fill.len < BUF_BYTES);
	s->loop_ns += t - t0;
	if (rc < 0) {
		uv_idle_stop(h);
		if (s->writing)
			s->abandon = true; /* when the worker returns */
		else
			give_up(n, s, rc);
		return;
	}
	if (rc == 1) {
		s->encoded = true;
		uv_idle_stop(h);
		meta__compact_resume(n);
	}
	if (s->encoded || s->fill.len >= BUF_BYTES)
		hand_off(n, s);
}

/*
 * Members take their snapshots at different points of the log: member r
 * of k (by ID among the members) at the indexes r * count / k past a
 * multiple of --snapshot-count. All at the same index, the members of a
 * cluster on shared cores would encode and write at once, each slowing
 * the others, and a stalled leader with stalled followers is how
 * leadership is lost.
 */
static uint64_t snap_offset(const struct meta_node *n)
{
	const struct meta__sm *sm = &n->sm;
	size_t rank = 0;
	for (size_t i = 0; i < sm->n_members; i++)
		if (sm->members[i].id < n->id)
			rank++;
	return sm->n_members ? n->o.snapshot_count * rank / sm->n_members : 0;
}

static bool snapshot_due(const struct meta_node *n)
{
	uint64_t count = n->o.snapshot_count, off = snap_offset(n);
	if (n->applied - n->snap_index < count / 2)
		return false; /* never two close together, whatever the offsets did */
	if (n->applied - n->snap_index >= 2 * count)
		return true;
	uint64_t a = n->applied > off ? (n->applied - off) / count : 0;
	uint64_t s = n->snap_index > off ? (n->snap_index - off) / count : 0;
	return a > s;
}

void meta__maybe_snapshot(struct meta_node *n)
{
	/* Not while a compaction's versions are being freed: the snapshot
	 * would hold them (meta__compact_resume asks again when done). */
	if (n->snap_job || n->stopping || n->fatal || !n->handles_open || !snapshot_due(n) ||
	    mvcc_compact_pending(n->sm.store))
		return;
	struct meta__snap_job *s = calloc(1, sizeof(*s));
	int rc = -ENOMEM;
	if (!s)
		goto fail;
	s->n = n;
	s->index = n->applied;
	s->term = n->applied_term;
	s->start_ms = meta__now(n);
	s->fill = (struct mc_buf)MC_BUF_INIT;
	s->out = (struct mc_buf)MC_BUF_INIT;
	if ((rc = mc_buf_reserve(&s->fill, BUF_ROOM)) ||
	    (rc = mc_buf_reserve(&s->out, BUF_ROOM)) ||
	    (rc = meta__conf_bytes(&n->sm, &s->conf, &s->conf_len)))
		goto fail;
	uint64_t t0 = mc_now_ns();
	rc = meta__sm_snap_begin(&n->sm, sink, s, &s->cur);
	s->loop_ns += mc_now_ns() - t0;
	if (rc)
		goto fail;
	n->snap_job = s;
	metric_set(n->m_snap_writing, 1);
	uv_idle_start(&n->snap_idle, meta__on_snap_idle);
	log_info("writing the snapshot at index %" PRIu64, s->index);
	return;
fail:
	log_error("cannot take a snapshot at index %" PRIu64 ": %s", n->applied,
		  meta__strerror(rc));
	if (s)
		snap_job_free(s);
	/* Try again after as many entries again. */
	n->snap_index = n->applied;
}

void meta__snapshot_abandon(struct meta_node *n)
{
	struct meta__snap_job *s = n->snap_job;
	if (!s)
		return;
	uv_idle_stop(&n->snap_idle);
	metric_set(n->m_snap_writing, 0);
	n->snap_job = NULL; /* a new one may start while the worker finishes */
	meta__compact_resume(n);
	/* A job with a worker ends when the worker returns: freeing it now
	 * would leave the worker's completion pointing at freed memory. */
	if (s->writing || s->marking)
		s->abandon = true;
	else
		give_up(n, s, 0);
}

int meta__snap_load(const char *path, uint8_t **data, size_t *len)
{
	struct snap_reader *r;
	struct snap_info info = {0};
	uint8_t *buf = NULL;
	size_t got = 0, nread;
	int rc = snap_reader_open(path, &r, &info);

	if (rc)
		return rc;
	buf = malloc(info.data_bytes ? info.data_bytes : 1);
	if (!buf) {
		rc = -ENOMEM;
		goto out;
	}
	for (;;) {
		size_t cap = info.data_bytes - got;
		rc = snap_reader_read(r, buf + got, cap ? cap : 1, &nread);
		if (rc)
			goto out;
		if (!nread)
			break;
		got += nread;
		if (got > info.data_bytes) {
			rc = -EBADMSG;
			goto out;
		}
	}
	*data = buf;
	*len = got;
	buf = NULL;
out:
	free(buf);
	snap_reader_close(r);
	snap_info_close(&info);
	return rc;
}
