/*
 * sysmem: parsers of /proc/meminfo, /proc/PID/limits and /proc/PID/status,
 * and the rule of whether a segment fits. See sysmem.h.
 */
#include "common/sysmem.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define CAP_IPC_LOCK_BIT 14

long mc_read_small_file(const char *path, char *buf, size_t len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	size_t got = 0;
	for (;;) {
		if (got + 1 >= len) {
			close(fd);
			return -EFBIG;
		}
		ssize_t r = read(fd, buf + got, len - 1 - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			int e = errno;
			close(fd);
			return -e;
		}
		if (r == 0)
			break;
		got += (size_t)r;
	}
	close(fd);
	buf[got] = '\0';
	return (long)got;
}

/* The number after "name:" on a line of its own, times unit when the
 * line ends in "kB". */
static bool field(const char *text, const char *name, uint64_t *out)
{
	size_t n = strlen(name);
	for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
		if (strncmp(p, name, n) != 0 || p[n] != ':')
			continue;
		char *end;
		unsigned long long v = strtoull(p + n + 1, &end, 10);
		while (*end == ' ' || *end == '\t')
			end++;
		if (strncmp(end, "kB", 2) == 0)
			v *= 1024;
		*out = v;
		return true;
	}
	return false;
}

int mc_meminfo_parse(const char *text, struct mc_meminfo *out)
{
	memset(out, 0, sizeof(*out));
	if (!field(text, "MemTotal", &out->total_bytes))
		return -EINVAL;
	if (!field(text, "MemAvailable", &out->available_bytes))
		(void)field(text, "MemFree", &out->available_bytes);
	(void)field(text, "HugePages_Total", &out->huge_total);
	(void)field(text, "HugePages_Free", &out->huge_free);
	(void)field(text, "Hugepagesize", &out->huge_page_bytes);
	return 0;
}

int mc_meminfo_read(const char *procfs_root, struct mc_meminfo *out)
{
	char path[4096], buf[16384];
	snprintf(path, sizeof(path), "%s/meminfo", procfs_root ? procfs_root : "/proc");
	long n = mc_read_small_file(path, buf, sizeof(buf));
	if (n < 0)
		return (int)n;
	return mc_meminfo_parse(buf, out);
}

bool mc_thp_madvise_ok(const char *sysfs_root, char *mode, size_t mode_len)
{
	char path[512], buf[256];
	snprintf(path, sizeof(path), "%s/kernel/mm/transparent_hugepage/enabled",
		 sysfs_root ? sysfs_root : "/sys");
	long n = mc_read_small_file(path, buf, sizeof(buf));
	if (n < 0)
		snprintf(buf, sizeof(buf), "absent");
	else if (n > 0 && buf[n - 1] == '\n')
		buf[n - 1] = '\0';
	if (mode && mode_len)
		snprintf(mode, mode_len, "%s", buf);
	return n > 0 && (strstr(buf, "[always]") || strstr(buf, "[madvise]"));
}

int64_t mc_mapping_huge_bytes(const void *addr)
{
	FILE *f = fopen("/proc/self/smaps", "re");
	if (!f)
		return -errno;
	char *line = NULL; /* (whole lines: a mapping's path may be long) */
	size_t cap = 0;
	bool in = false, found = false;
	int64_t bytes = 0;
	while (getline(&line, &cap, f) > 0) {
		unsigned long long lo, hi, kb;
		if (sscanf(line, "%llx-%llx ", &lo, &hi) == 2) {
			if (in)
				break; /* (the next mapping) */
			in = found = lo == (unsigned long long)(uintptr_t)addr;
		} else if (in && sscanf(line, "AnonHugePages: %llu kB", &kb) == 1) {
			bytes = (int64_t)kb * 1024;
		}
	}
	free(line);
	fclose(f);
	return found ? bytes : -ENOENT;
}

static uint64_t limit_value(const char *s)
{
	while (*s == ' ')
		s++;
	if (strncmp(s, "unlimited", 9) == 0)
		return MC_UNLIMITED;
	return strtoull(s, NULL, 10);
}

int mc_limits_memlock_parse(const char *text, uint64_t *soft, uint64_t *hard)
{
	const char *p = strstr(text, "Max locked memory");
	if (!p)
		return -EINVAL;
	p += strlen("Max locked memory");
	while (*p == ' ')
		p++;
	*soft = limit_value(p);
	while (*p && *p != ' ' && *p != '\n')
		p++;
	*hard = limit_value(p);
	return 0;
}

int mc_status_ipc_lock_parse(const char *text, bool *has)
{
	const char *p = strstr(text, "CapEff:");
	if (!p)
		return -EINVAL;
	unsigned long long caps = strtoull(p + 7, NULL, 16);
	*has = (caps >> CAP_IPC_LOCK_BIT) & 1;
	return 0;
}

void mc_format_bytes(uint64_t b, char *buf, size_t len)
{
	static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
	if (b == MC_UNLIMITED) {
		snprintf(buf, len, "unlimited");
		return;
	}
	int u = 0;
	double v = (double)b;
	while (v >= 1024 && u < 6) {
		v /= 1024;
		u++;
	}
	if (u == 0 || v >= 100 || v == (double)(uint64_t)v)
		snprintf(buf, len, "%.0f %s", v, unit[u]);
	else
		snprintf(buf, len, "%.1f %s", v, unit[u]);
}

/* What the node has, as every refusal names it: the memory available of
 * the RAM, the free huge pages, the memory-lock limit. */
static void node_figures(const struct mc_fit_in *in, char *buf, size_t len)
{
	char avail[32], ram[32], huge[32], lock[32];
	mc_format_bytes(in->mem.available_bytes, avail, sizeof(avail));
	mc_format_bytes(in->mem.total_bytes, ram, sizeof(ram));
	mc_format_bytes(in->mem.huge_free * in->mem.huge_page_bytes, huge, sizeof(huge));
	mc_format_bytes(in->memlock_bytes, lock, sizeof(lock));
	snprintf(buf, len,
		 "this node: %s of %s RAM available, %" PRIu64 " of %" PRIu64
		 " huge pages free (%s), memory-lock limit %s%s",
		 avail, ram, in->mem.huge_free, in->mem.huge_total, huge, lock,
		 in->cap_ipc_lock ? " (CAP_IPC_LOCK: not applied)"
		 : !in->pins      ? " (nothing pinned without RDMA)"
				  : "");
}

enum mc_fit mc_segment_fit(const struct mc_fit_in *in, char *why, size_t len)
{
	char seg[32], have[32], of[32], node[256];
	node_figures(in, node, sizeof(node));
	mc_format_bytes(in->segment_bytes, seg, sizeof(seg));
	uint64_t huge_free_bytes = in->mem.huge_free * in->mem.huge_page_bytes;
	bool huge = in->hugepages == MC_FIT_HUGE_ON ||
		    (in->hugepages == MC_FIT_HUGE_AUTO && in->mem.huge_page_bytes &&
		     huge_free_bytes >= in->segment_bytes);
	if (in->hugepages == MC_FIT_HUGE_ON && huge_free_bytes < in->segment_bytes) {
		mc_format_bytes(huge_free_bytes, have, sizeof(have));
		snprintf(why, len,
			 "the segment (--global-segment-size, %s) does not fit in the free "
			 "huge pages (%" PRIu64 " of %" PRIu64 " free, %s) that "
			 "--hugepages=on requires: reserve more (vm.nr_hugepages), lower "
			 "--global-segment-size or set --hugepages=auto (%s)",
			 seg, in->mem.huge_free, in->mem.huge_total, have, node);
		return MC_FIT_HUGEPAGES;
	}
	uint64_t need = in->segment_bytes + (huge ? 0 : in->buffer_bytes);
	if (!huge && need > in->mem.available_bytes) {
		mc_format_bytes(in->mem.available_bytes, have, sizeof(have));
		mc_format_bytes(in->mem.total_bytes, of, sizeof(of));
		snprintf(why, len,
			 "the segment (--global-segment-size, %s) does not fit in the "
			 "memory available (%s of %s); lower --global-segment-size, or "
			 "set --force-segment-size to start anyway (%s)",
			 seg, have, of, node);
		return MC_FIT_RAM;
	}
	if (in->pins && !in->cap_ipc_lock && in->memlock_bytes != MC_UNLIMITED &&
	    in->memlock_bytes < in->segment_bytes) {
		mc_format_bytes(in->memlock_bytes, have, sizeof(have));
		snprintf(why, len,
			 "RDMA pins the whole segment (--global-segment-size, %s) but the "
			 "memory-lock limit (RLIMIT_MEMLOCK) is %s: raise it "
			 "(LimitMEMLOCK=infinity in the unit, ulimit -l unlimited), lower "
			 "--global-segment-size, or set --force-segment-size to start anyway "
			 "(%s)",
			 seg, have, node);
		return MC_FIT_MEMLOCK;
	}
	if (len)
		why[0] = '\0';
	return MC_FIT_OK;
}

uint64_t mc_default_segment_bytes(uint64_t ram_bytes)
{
	const uint64_t huge = 2u << 20;
	uint64_t n = 1ull << 30;
	if (ram_bytes && ram_bytes / 4 < n)
		n = ram_bytes / 4;
	n &= ~(huge - 1);
	return n ? n : huge;
}

int mc_prefault_write(void *addr, size_t len)
{
	int rc = madvise(addr, len, MADV_POPULATE_WRITE) == 0 ? 0 : -errno;
	long page = sysconf(_SC_PAGESIZE);
	size_t step = page > 0 ? (size_t)page : 4096;
	uint8_t *p = addr;
	for (size_t off = 0; off < len; off += step)
		__atomic_fetch_or(p + off, 0, __ATOMIC_RELAXED);
	return rc;
}
