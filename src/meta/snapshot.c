/*
 * snapshot: this member's own snapshots, taken every --snapshot-count
 * applied entries. The state machine is copied on the loop (sm.h); the
 * file is written, fsynced and renamed on a libuv worker (snap.h); then
 * the disk thread records it in the WAL and releases the segments before
 * the oldest snapshot kept, and the core compacts its log behind it.
 * Reading a snapshot file whole is here too (recovery, and sending one to
 * a member that lags).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/metrics.h"
#include "common/util.h"
#include "meta/meta_int.h"

#define LOG_SUBSYS LOGS_META

struct snap_job {
	uv_work_t req;
	struct meta__job wal_job;
	struct meta_node *n;
	uint64_t index, term;
	uint8_t *data;
	size_t len;
	uint8_t *conf;
	size_t conf_len;
	int rc;
};

static void snap_write_work(uv_work_t *w)
{
	struct snap_job *s = MC_CONTAINER_OF(w, struct snap_job, req);
	struct snap_meta m = {s->index, s->term, s->conf, s->conf_len};
	struct snap_writer *wr;

	s->rc = snap_writer_open(s->n->snap_dir, &m, &wr);
	if (s->rc)
		return;
	s->rc = snap_writer_write(wr, s->data, s->len);
	if (s->rc) {
		snap_writer_abort(wr);
		return;
	}
	s->rc = snap_writer_commit(wr, META_SNAPSHOTS_KEPT);
}

static void snap_marker_work(struct meta__job *j)
{
	struct snap_job *s = MC_CONTAINER_OF(j, struct snap_job, wal_job);
	struct meta_node *n = s->n;
	uint64_t oldest = 0;
	int rc;

	j->rc = 0;
	if (wal_snapshot(n->wal).index >= s->index)
		return; /* a newer snapshot (from the leader) is already there */
	rc = wal_save_snapshot(n->wal, (struct wal_snap_ref){s->index, s->term}, true);
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

static void snap_job_free(struct snap_job *s)
{
	free(s->data);
	free(s->conf);
	free(s);
}

static void snap_marker_done(struct meta__job *j)
{
	struct snap_job *s = MC_CONTAINER_OF(j, struct snap_job, wal_job);
	struct meta_node *n = s->n;

	n->disk_jobs--;
	n->snapshotting = false;
	if (j->rc) {
		meta__fatal(n, j->rc, "cannot record a snapshot in the WAL");
	} else {
		if (s->index > n->snap_index)
			n->snap_index = s->index;
		n->pending_compact = s->index;
		metric_inc(n->m_snapshots);
		log_info("snapshot at index %" PRIu64 " (%zu bytes) saved; log compacted",
			 s->index, s->len);
		meta__kick(n);
	}
	snap_job_free(s);
	meta__check_stopped(n);
}

static void snap_write_done(uv_work_t *w, int status)
{
	struct snap_job *s = MC_CONTAINER_OF(w, struct snap_job, req);
	struct meta_node *n = s->n;

	n->uv_works--;
	if (status || s->rc) {
		log_error("cannot write the snapshot at index %" PRIu64 ": %s", s->index,
			  mc_strerror(status ? status : s->rc));
		n->snapshotting = false;
		snap_job_free(s);
		meta__check_stopped(n);
		return;
	}
	if (n->fatal) {
		n->snapshotting = false;
		snap_job_free(s);
		meta__check_stopped(n);
		return;
	}
	/* The data is on disk: only the marker job needs the job now. */
	free(s->data);
	s->data = NULL;
	s->wal_job.work = snap_marker_work;
	s->wal_job.done = snap_marker_done;
	n->disk_jobs++;
	meta__worker_submit(n->disk, &s->wal_job);
}

void meta__maybe_snapshot(struct meta_node *n)
{
	if (n->snapshotting || n->stopping || n->fatal ||
	    n->applied - n->snap_index < n->o.snapshot_count)
		return;
	struct snap_job *s = calloc(1, sizeof(*s));
	int rc = -ENOMEM;
	if (!s)
		goto fail;
	s->n = n;
	s->index = n->applied;
	s->term = n->applied_term;
	rc = meta__sm_snapshot(&n->sm, &s->data, &s->len);
	if (rc == 0)
		rc = meta__conf_bytes(&n->sm, &s->conf, &s->conf_len);
	if (rc)
		goto fail;
	rc = uv_queue_work(n->loop, &s->req, snap_write_work, snap_write_done);
	if (rc)
		goto fail;
	n->uv_works++;
	n->snapshotting = true;
	return;
fail:
	log_error("cannot take a snapshot at index %" PRIu64 ": %s", n->applied,
		  mc_strerror(rc));
	if (s)
		snap_job_free(s);
	/* Try again after as many entries again. */
	n->snap_index = n->applied;
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
