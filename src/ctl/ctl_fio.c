/*
 * ctl_fio: fio (Debian package fio) as the benchmarks' measure of a file
 * system: the same block size, direct I/O, io_uring and depth on a file
 * of the file system measured, its bandwidth and latency read from its
 * JSON output (mooncakectl bench ssd, bench store --tier=ssd).
 *
 * Like with like: a put into the SSD tier is answered once its direct
 * write has completed (a kill -9 loses nothing, as with fio's direct
 * writes), and the tier syncs every --ssd-sync-interval, which bounds
 * what a power loss loses. fio's writes are synced as often: a run of ms
 * owes ms / interval syncs (carried over from run to run, since runs are
 * often shorter than the interval), spread as an fdatasync after every
 * so many blocks at the rate fio's fill measured (the tier reuses the
 * space of removed objects without a sync of its own: src/ssd/ssd.h).
 * Latencies on both sides run from submission to completion.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ctl/ctl_int.h"

/* The number at the end of a path of keys (NULL-terminated, each found
 * after the one before) in the object "section" of fio's JSON output.
 * Latencies are read from lat_ns (with --lat_percentiles=1: from
 * submission to completion, as the store's and the agents' latencies are
 * timed): fio's default clat_ns leaves out the submission, which on a fast
 * device is a third of a 1 MiB read (io_uring, 2026-12-06: lat p50 136 us,
 * clat 94 us). */
static bool json_num(const char *js, const char *section, const char *const *path, double *v)
{
	char pat[64];
	snprintf(pat, sizeof(pat), "\"%s\" : {", section);
	const char *q = strstr(js, pat);
	for (; q && *path; path++) {
		snprintf(pat, sizeof(pat), "\"%s\"", *path);
		if ((q = strstr(q, pat)))
			q += strlen(pat);
	}
	if (!q || !(q = strchr(q, ':')))
		return false;
	*v = strtod(q + 1, NULL);
	return true;
}

#define PATH(...) ((const char *const[]){__VA_ARGS__, NULL})

/* A CRC-32C header in every 4 KiB of fio's file, so that runs of any block
 * size (a multiple of 4 KiB) check what they read; no state file left in
 * the working directory. */
#define FIO_CHECK "--verify=crc32c --verify_interval=4096 --verify_state_save=0"

/* Run the fio command cmd, which writes its JSON report to out, and read
 * the report into js (NUL-terminated). false when fio failed (a line
 * printed). */
static bool fio_json(const char *cmd, const char *out, char *js, size_t cap)
{
	int st = system(cmd);
	if (st != 0) {
		fprintf(stderr, "mooncakectl bench: fio failed (%s; Debian package fio)\n",
			WIFEXITED(st) && WEXITSTATUS(st) == 127 ? "not installed"
								: "exit status");
		return false;
	}
	FILE *fp = fopen(out, "r");
	if (!fp)
		return false;
	size_t n = fread(js, 1, cap - 1, fp);
	fclose(fp);
	unlink(out);
	js[n] = 0;
	return true;
}

static char js[1 << 20];

/* The blocks between two fdatasyncs of a write run of ms (0: none). */
static uint64_t sync_blocks(struct ctl_fio *f, uint64_t bs, uint64_t ms)
{
	if (!f->sync)
		return 0;
	if (f->sync_ms == 0)
		return 1;
	f->syncs_owed += (double)ms / f->sync_ms;
	uint64_t k = (uint64_t)f->syncs_owed;
	if (k == 0)
		return 0;
	f->syncs_owed -= (double)k;
	uint64_t blocks = (uint64_t)(f->fill_bw * (double)ms / 1000 / (double)bs);
	return blocks > k ? blocks / k : 1;
}

bool ctl_fio_run(const char *file, uint64_t file_bytes, uint64_t bs, unsigned depth,
		 bool write, uint64_t ms, struct ctl_fio *f)
{
	char cmd[2048], out[700], sync[64] = "", check[160] = "";
	snprintf(out, sizeof(out), "%s.json", file);
	uint64_t every = write ? sync_blocks(f, bs, ms) : 0;
	if (every)
		snprintf(sync, sizeof(sync), " --fdatasync=%" PRIu64, every);
	if (f->check)
		snprintf(check, sizeof(check),
			 " " FIO_CHECK " --do_verify=%d --verify_fatal=1", write ? 0 : 1);
	snprintf(cmd, sizeof(cmd),
		 "%sfio --name=ssd --filename=%s --size=%" PRIu64 " --bs=%" PRIu64
		 " --direct=1 --ioengine=io_uring --iodepth=%u --rw=%s%s%s%s --time_based"
		 " --runtime=%" PRIu64 "ms --ramp_time=0"
		 " --lat_percentiles=1 --percentile_list=50:99"
		 " --output-format=json --output=%s >/dev/null 2>&1",
		 f->huge ? "GLIBC_TUNABLES=glibc.malloc.hugetlb=1 " : "", file, file_bytes, bs,
		 depth, write ? "write" : "randread", sync, check,
		 f->huge ? " --iomem_align=2m" : "", ms, out);
	if (!fio_json(cmd, out, js, sizeof(js)))
		return false;
	const char *sec = write ? "write" : "read";
	double bw, p50, p99, mean;
	if (!json_num(js, sec, PATH("bw_bytes"), &bw) ||
	    !json_num(js, sec, PATH("lat_ns", "percentile", "50.000000"), &p50) ||
	    !json_num(js, sec, PATH("lat_ns", "percentile", "99.000000"), &p99) ||
	    !json_num(js, sec, PATH("lat_ns", "mean"), &mean)) {
		fprintf(stderr, "mooncakectl bench: cannot read fio's output\n");
		return false;
	}
	f->bw += bw;
	f->p50_us += p50 / 1000;
	f->p99_us += p99 / 1000;
	f->mean_us += mean / 1000;
	f->runs++;
	return true;
}

bool ctl_fio_fill(const char *file, uint64_t file_bytes, double *bw)
{
	char cmd[2048], out[700];
	snprintf(out, sizeof(out), "%s.json", file);
	snprintf(cmd, sizeof(cmd),
		 "fio --name=fill --filename=%s --size=%" PRIu64 " --bs=4M --direct=1"
		 " --ioengine=io_uring --iodepth=8 --rw=write " FIO_CHECK " --do_verify=0"
		 " --output-format=json"
		 " --output=%s >/dev/null 2>&1",
		 file, file_bytes, out);
	if (!fio_json(cmd, out, js, sizeof(js)))
		return false;
	if (!json_num(js, "write", PATH("bw_bytes"), bw) || *bw <= 0) {
		fprintf(stderr, "mooncakectl bench: cannot read fio's output\n");
		return false;
	}
	return true;
}
