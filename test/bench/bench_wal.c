/*
 * bench_wal: group commit on this disk, beside the disk's own limit.
 *
 *   bench_wal [dir] [entry_bytes] [batch]
 *
 * Runs with records of the same size:
 *   raw    a plain loop: append one record + fdatasync (file growing);
 *   raw/p  the same into a preallocated file (the disk's fsync-per-append
 *          limit without metadata updates);
 *   wal/1  wal_save(sync=true) for every entry (the WAL's own cost);
 *   wal/B  B wal_save(sync=false) then one wal_sync (group commit: what a
 *          Raft driver gets when B proposals share a Ready).
 * Prints appends/s and fsyncs/s of each and the ratios. A figure, not a
 * test: nothing is asserted.
 */
#include <fcntl.h>
#include <stdbool.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"
#include "meta/wal.h"
#include "meta/wal_int.h"

static double secs(uint64_t t0) { return (double)(mc_now_ns() - t0) / 1e9; }

static void rm_dir(const char *dir)
{
	char cmd[4200];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "cannot remove %s\n", dir);
}

static double run_raw(const char *dir, size_t frame, size_t n, bool prealloc)
{
	char path[4200];
	snprintf(path, sizeof(path), "%s/raw.dat", dir);
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	if (fd < 0 ||
	    (prealloc && fallocate(fd, 0, 0, (off_t)(frame * n + 4096)) != 0)) {
		perror(path);
		exit(1);
	}
	uint8_t *buf = calloc(1, frame);
	memset(buf, 0x5a, frame);
	fdatasync(fd);
	uint64_t t0 = mc_now_ns();
	for (size_t i = 0; i < n; i++) {
		if (pwrite(fd, buf, frame, (off_t)(i * frame)) != (ssize_t)frame ||
		    fdatasync(fd) != 0) {
			perror("raw");
			exit(1);
		}
	}
	double t = secs(t0);
	close(fd);
	unlink(path);
	free(buf);
	return t;
}

static double run_wal(const char *base, size_t data_len, size_t n,
		      size_t batch, uint64_t *fsyncs)
{
	char dir[4200];
	snprintf(dir, sizeof(dir), "%s/wal-%zu", base, batch);
	rm_dir(dir);
	struct wal_options o = {.create = true};
	struct wal *w;
	struct wal_recovery rec;
	if (wal_open(dir, &o, &w, &rec) != 0) {
		fprintf(stderr, "wal_open %s failed\n", dir);
		exit(1);
	}
	wal_recovery_close(&rec);
	uint8_t *data = malloc(data_len ? data_len : 1);
	memset(data, 0xa5, data_len);
	struct wal_stats s0, s1;
	wal_get_stats(w, &s0);
	struct wal_hard_state hs = {.term = 1};
	uint64_t t0 = mc_now_ns();
	for (size_t i = 1; i <= n; i++) {
		struct wal_entry e = {i, 1, 0, data, data_len};
		hs.commit = i - 1;
		bool sync = i % batch == 0 || i == n;
		if (wal_save(w, batch == 1 ? &hs : NULL, &e, 1, sync) != 0) {
			fprintf(stderr, "wal_save failed\n");
			exit(1);
		}
	}
	double t = secs(t0);
	wal_get_stats(w, &s1);
	*fsyncs = s1.fsyncs - s0.fsyncs;
	wal_close(w);
	rm_dir(dir);
	free(data);
	return t;
}

int main(int argc, char **argv)
{
	const char *dir = argc > 1 ? argv[1] : "/tmp";
	size_t data_len = argc > 2 ? strtoul(argv[2], NULL, 10) : 256;
	size_t batch = argc > 3 ? strtoul(argv[3], NULL, 10) : 64;
	char base[4096];
	snprintf(base, sizeof(base), "%s/bench_wal.%d", dir, (int)getpid());
	if (mc_mkdir_p(base, 0700) != 0) {
		perror(base);
		return 1;
	}
	size_t frame = wal__frame_bytes(WAL__ENTRY_HDR_BYTES + data_len);
	size_t n_sync = 2000, n_group = 2000 * batch;

	double t_app = run_raw(base, frame, n_sync, false);
	double t_raw = run_raw(base, frame, n_sync, true);
	uint64_t f1, fb;
	double t_w1 = run_wal(base, data_len, n_sync, 1, &f1);
	double t_wb = run_wal(base, data_len, n_group, batch, &fb);
	rm_dir(base);

	double app_aps = n_sync / t_app, raw_aps = n_sync / t_raw;
	double w1_aps = n_sync / t_w1, wb_aps = n_group / t_wb;
	printf("bench_wal: %s, entry %zu B (record %zu B), batch %zu\n", dir,
	       data_len, frame, batch);
	printf("  raw append+fdatasync: %9.0f appends/s %7.0f fsyncs/s "
	       "(%.3f ms/fsync)\n",
	       app_aps, app_aps, 1e3 * t_app / n_sync);
	printf("  raw prealloc+fdsync : %9.0f appends/s %7.0f fsyncs/s "
	       "(%.3f ms/fsync)\n",
	       raw_aps, raw_aps, 1e3 * t_raw / n_sync);
	printf("  wal sync every save : %9.0f appends/s %7.0f fsyncs/s "
	       "(%.2fx raw)\n",
	       w1_aps, f1 / t_w1, w1_aps / raw_aps);
	printf("  wal group commit /%-3zu: %9.0f appends/s %7.0f fsyncs/s "
	       "(%.1fx raw prealloc, %.1fx raw append)\n",
	       batch, wb_aps, fb / t_wb, wb_aps / raw_aps, wb_aps / app_aps);
	return 0;
}
