/*
 * ctl_fio: fio (Debian package fio) as the benchmarks' measure of a file
 * system: the same block size, direct I/O, io_uring and depth on a file
 * of the file system measured, its bandwidth and latency read from its
 * JSON output (mooncakectl bench ssd, bench store --tier=ssd).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ctl/ctl_int.h"

/* The number after "key": in the object "section" of fio's JSON output. */
static bool json_num(const char *js, const char *section, const char *key, double *v)
{
	char pat[64];
	snprintf(pat, sizeof(pat), "\"%s\" : {", section);
	const char *p = strstr(js, pat);
	if (!p)
		return false;
	snprintf(pat, sizeof(pat), "\"%s\"", key);
	p = strstr(p, pat);
	if (!p || !(p = strchr(p + strlen(pat), ':')))
		return false;
	*v = strtod(p + 1, NULL);
	return true;
}

/* The clat percentile p ("50.000000") in ns, in section. */
static bool json_pct(const char *js, const char *section, const char *p, double *v)
{
	char pat[64];
	snprintf(pat, sizeof(pat), "\"%s\" : {", section);
	const char *q = strstr(js, pat);
	if (!q || !(q = strstr(q, "\"clat_ns\"")) || !(q = strstr(q, "\"percentile\"")))
		return false;
	snprintf(pat, sizeof(pat), "\"%s\"", p);
	q = strstr(q, pat);
	if (!q || !(q = strchr(q + strlen(pat), ':')))
		return false;
	*v = strtod(q + 1, NULL);
	return true;
}

bool ctl_fio_run(const char *file, uint64_t file_bytes, uint64_t bs, unsigned depth,
		 bool write, uint64_t ms, struct ctl_fio *f)
{
	char cmd[2048], out[700];
	snprintf(out, sizeof(out), "%s.json", file);
	snprintf(cmd, sizeof(cmd),
		 "fio --name=ssd --filename=%s --size=%" PRIu64 " --bs=%" PRIu64
		 " --direct=1 --ioengine=io_uring --iodepth=%u --rw=%s --time_based"
		 " --runtime=%" PRIu64 "ms --ramp_time=0 --percentile_list=50:99"
		 " --output-format=json --output=%s >/dev/null 2>&1",
		 file, file_bytes, bs, depth, write ? "write" : "randread", ms, out);
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
	static char js[1 << 20];
	size_t n = fread(js, 1, sizeof(js) - 1, fp);
	fclose(fp);
	unlink(out);
	js[n] = 0;
	const char *sec = write ? "write" : "read";
	double bw, p50, p99;
	if (!json_num(js, sec, "bw_bytes", &bw) || !json_pct(js, sec, "50.000000", &p50) ||
	    !json_pct(js, sec, "99.000000", &p99)) {
		fprintf(stderr, "mooncakectl bench: cannot read fio's output\n");
		return false;
	}
	f->bw += bw;
	f->p50_us += p50 / 1000;
	f->p99_us += p99 / 1000;
	f->runs++;
	return true;
}

bool ctl_fio_fill(const char *file, uint64_t file_bytes)
{
	char cmd[1024];
	snprintf(cmd, sizeof(cmd),
		 "fio --name=fill --filename=%s --size=%" PRIu64 " --bs=4M --direct=1"
		 " --ioengine=io_uring --iodepth=8 --rw=write >/dev/null 2>&1",
		 file, file_bytes);
	if (system(cmd) != 0) {
		fprintf(stderr, "mooncakectl bench: fio failed (Debian package fio; "
				"--fio=off runs without it)\n");
		return false;
	}
	return true;
}
