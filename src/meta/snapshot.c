/*
 * snapshot: this member's own snapshots, taken every --snapshot-count
 * applied entries, without stopping the member.
 *
 * The state machine lives in memory, so a snapshot is a copy of it as it
 * stands at the applied index. Copying it on the loop would stop the
 * member from answering heartbeats and requests for as long as encoding
 * and writing take — seconds for a few hundred megabytes — and cost it
 * its leadership. Instead the loop forks: the child is a frozen copy of
 * the state (the kernel shares the pages and copies only those the member
 * changes meanwhile), encodes it straight into a snapshot file (snap.h:
 * written, fsynced, renamed) at the lowest CPU priority, reports the
 * outcome through a pipe and exits; the loop pays only for the fork. A libuv worker waits for the
 * child; then the disk thread records the snapshot in the WAL and
 * releases the segments before the oldest snapshot kept, and the core
 * compacts its log behind it. The child touches nothing the member's
 * other threads might hold but the allocator and the log, both safe
 * across fork (glibc's malloc and log.c's atfork handlers). A member that
 * stops kills a child still writing (the temp file is removed at the next
 * start); a child whose member dies is killed by the kernel.
 *
 * Reading a snapshot file whole is here too (recovery, and sending one to
 * a member that lags).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/io.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/util.h"
#include "meta/meta_int.h"

#define LOG_SUBSYS LOGS_META

/* What the child reports through the pipe. */
struct snap_outcome {
	int32_t rc;
	uint32_t pad;
	uint64_t bytes;
};

struct meta__snap_job {
	uv_work_t req; /* waits for the child */
	struct meta__job wal_job;
	struct meta_node *n;
	uint64_t index, term;
	uint8_t *conf;
	size_t conf_len;
	pid_t pid;
	int fd;     /* the pipe's read end */
	int status; /* the child's wait status */
	struct snap_outcome out;
	uint64_t fork_us; /* how long the loop stood still for the fork */
};

struct child_sink {
	struct snap_writer *wr;
	uint64_t bytes;
};

static int child_chunk(void *ctx, const void *data, size_t len)
{
	struct child_sink *k = ctx;
	k->bytes += len;
	return snap_writer_write(k->wr, data, len);
}

/* In the child: the state at s->index into a snapshot file. */
static struct snap_outcome child_write(struct meta_node *n, const struct meta__snap_job *s)
{
	struct snap_meta m = {s->index, s->term, s->conf, s->conf_len};
	struct child_sink k = {0};
	struct snap_outcome out = {0};

	out.rc = snap_writer_open(n->snap_dir, &m, &k.wr);
	if (out.rc)
		return out;
	out.rc = meta__sm_snapshot_write(&n->sm, child_chunk, &k);
	if (out.rc) {
		snap_writer_abort(k.wr);
		return out;
	}
	out.rc = snap_writer_commit(k.wr, META_SNAPSHOTS_KEPT);
	out.bytes = k.bytes;
	return out;
}

static void child_main(struct meta_node *n, const struct meta__snap_job *s, int fd)
{
	/* Signals are the member's business (its handlers would write to the
	 * member's loop); this copy goes with its parent. */
	signal(SIGTERM, SIG_DFL);
	signal(SIGINT, SIG_DFL);
	signal(SIGHUP, SIG_DFL);
	signal(SIGPIPE, SIG_IGN);
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	/* The snapshot can wait; the member's requests cannot: on shared
	 * cores the scheduler runs the member first. */
	(void)setpriority(PRIO_PROCESS, 0, 19); /* if refused, it only runs sooner */
	struct snap_outcome out = child_write(n, s);
	int rc = mc_write_all(fd, &out, sizeof(out));
	_exit(rc || out.rc ? 1 : 0);
}

static void wait_work(uv_work_t *w)
{
	struct meta__snap_job *s = MC_CONTAINER_OF(w, struct meta__snap_job, req);
	int rc = mc_read_full(s->fd, &s->out, sizeof(s->out));
	if (rc) {
		s->out.rc = rc == -EIO ? -EPIPE : rc; /* the child died before it said */
		s->out.bytes = 0;
	}
	while (waitpid(s->pid, &s->status, 0) < 0 && errno == EINTR)
		;
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

static void snap_job_free(struct meta__snap_job *s)
{
	if (s->fd >= 0)
		close(s->fd);
	free(s->conf);
	free(s);
}

static void snap_marker_done(struct meta__job *j)
{
	struct meta__snap_job *s = MC_CONTAINER_OF(j, struct meta__snap_job, wal_job);
	struct meta_node *n = s->n;

	n->disk_jobs--;
	n->snap_job = NULL;
	if (j->rc) {
		meta__fatal(n, j->rc, "cannot record a snapshot in the WAL");
	} else {
		if (s->index > n->snap_index)
			n->snap_index = s->index;
		n->pending_compact = s->index;
		metric_inc(n->m_snapshots);
		log_info("snapshot at index %" PRIu64 " (%" PRIu64 " bytes) saved by a child "
			 "process, the member paused %" PRIu64 " us to fork it; log compacted",
			 s->index, s->out.bytes, s->fork_us);
		meta__kick(n);
	}
	snap_job_free(s);
	meta__check_stopped(n);
}

static void wait_done(uv_work_t *w, int status)
{
	struct meta__snap_job *s = MC_CONTAINER_OF(w, struct meta__snap_job, req);
	struct meta_node *n = s->n;

	n->uv_works--;
	s->pid = 0;
	metric_set(n->m_snap_writing, 0);
	if (status || s->out.rc || !WIFEXITED(s->status) || WEXITSTATUS(s->status)) {
		if (!n->stopping)
			log_error("cannot write the snapshot at index %" PRIu64
				  ": %s (child %s %d)",
				  s->index, mc_strerror(status ? status : s->out.rc),
				  WIFSIGNALED(s->status) ? "killed by signal" : "exit status",
				  WIFSIGNALED(s->status) ? WTERMSIG(s->status)
							 : WEXITSTATUS(s->status));
		n->snap_job = NULL;
		/* Try again after as many entries again. */
		n->snap_index = n->applied;
		snap_job_free(s);
		meta__check_stopped(n);
		return;
	}
	if (n->fatal) {
		n->snap_job = NULL;
		snap_job_free(s);
		meta__check_stopped(n);
		return;
	}
	s->wal_job.work = snap_marker_work;
	s->wal_job.done = snap_marker_done;
	n->disk_jobs++;
	meta__worker_submit(n->disk, &s->wal_job);
}

/*
 * Members take their snapshots at different points of the log: member r
 * of k (by ID among the members) at the indexes r * count / k past a
 * multiple of --snapshot-count. All at the same index, the members of a
 * cluster on shared cores would fork and write at once, each slowing the
 * others, and a stalled leader with stalled followers is how leadership is
 * lost.
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
	if (n->snap_job || n->stopping || n->fatal || !snapshot_due(n))
		return;
	struct meta__snap_job *s = calloc(1, sizeof(*s));
	int fds[2] = {-1, -1};
	int rc = -ENOMEM;
	if (!s)
		goto fail;
	s->fd = -1;
	s->n = n;
	s->index = n->applied;
	s->term = n->applied_term;
	if ((rc = meta__conf_bytes(&n->sm, &s->conf, &s->conf_len)))
		goto fail;
	if (pipe2(fds, O_CLOEXEC)) {
		rc = -errno;
		goto fail;
	}
	uint64_t t0 = mc_now_ns();
	pid_t pid = fork();
	if (pid == 0) {
		close(fds[0]);
		child_main(n, s, fds[1]);
	}
	s->fork_us = (mc_now_ns() - t0) / 1000;
	close(fds[1]);
	fds[1] = -1;
	if (pid < 0) {
		rc = -errno;
		goto fail;
	}
	s->pid = pid;
	s->fd = fds[0];
	fds[0] = -1;
	rc = uv_queue_work(n->loop, &s->req, wait_work, wait_done);
	if (rc) {
		/* No waiter: stop the child and reap it here. */
		kill(pid, SIGKILL);
		while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
			;
		goto fail;
	}
	n->uv_works++;
	n->snap_job = s;
	metric_set(n->m_snap_writing, 1);
	log_info("writing the snapshot at index %" PRIu64 " in child process %d", s->index,
		 (int)pid);
	return;
fail:
	log_error("cannot take a snapshot at index %" PRIu64 ": %s", n->applied,
		  mc_strerror(rc));
	if (fds[0] >= 0)
		close(fds[0]);
	if (fds[1] >= 0)
		close(fds[1]);
	if (s)
		snap_job_free(s);
	/* Try again after as many entries again. */
	n->snap_index = n->applied;
}

void meta__snapshot_stop(struct meta_node *n)
{
	if (n->snap_job && n->snap_job->pid > 0)
		kill(n->snap_job->pid, SIGKILL);
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
