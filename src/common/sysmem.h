/*
 * sysmem: the memory facts of a node that decide whether an agent's
 * segment fits — /proc/meminfo, a process's memory-lock limit and its
 * CAP_IPC_LOCK — and the one rule that decides it, used by the agent when
 * it starts (it refuses a segment that does not fit) and by mooncakectl
 * doctor (which reports the same verdict before the start). The parsers
 * and the rule are pure; the readers take the procfs root as an argument
 * so that tests can give them a fake tree.
 */
#ifndef MC_COMMON_SYSMEM_H
#define MC_COMMON_SYSMEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define MC_UNLIMITED UINT64_MAX

struct mc_meminfo {
	uint64_t total_bytes;     /* MemTotal */
	uint64_t available_bytes; /* MemAvailable (MemFree on old kernels) */
	uint64_t huge_total;      /* HugePages_Total (pages) */
	uint64_t huge_free;       /* HugePages_Free (pages) */
	uint64_t huge_page_bytes; /* Hugepagesize */
};

/* Parse the text of /proc/meminfo. Errors: -EINVAL (no MemTotal). */
int mc_meminfo_parse(const char *text, struct mc_meminfo *out) MC_MUST_CHECK;
/* Read <procfs_root>/meminfo (procfs_root NULL: /proc). Errors: negative
 * errno of open/read, -EINVAL. */
int mc_meminfo_read(const char *procfs_root, struct mc_meminfo *out) MC_MUST_CHECK;

/* The "Max locked memory" line of /proc/PID/limits: soft and hard limit
 * in bytes (MC_UNLIMITED for unlimited). Errors: -EINVAL (no such line). */
int mc_limits_memlock_parse(const char *text, uint64_t *soft, uint64_t *hard) MC_MUST_CHECK;
/* Whether the CapEff line of /proc/PID/status has CAP_IPC_LOCK (which
 * lets a process pin memory beyond its memory-lock limit). Errors:
 * -EINVAL (no CapEff line). */
int mc_status_ipc_lock_parse(const char *text, bool *has) MC_MUST_CHECK;

/* Read a small procfs/sysfs file whole into buf (NUL-terminated).
 * Returns the length or a negative errno (-EFBIG when it does not fit). */
long mc_read_small_file(const char *path, char *buf, size_t len);

/* What the segment needs and what the node has. */
struct mc_fit_in {
	uint64_t segment_bytes;
	uint64_t buffer_bytes;  /* other memory taken with it (staging) */
	bool pins;              /* RDMA registers (pins) the segment */
	uint64_t memlock_bytes; /* RLIMIT_MEMLOCK soft limit */
	bool cap_ipc_lock;      /* the limit does not apply */
	enum { MC_FIT_HUGE_AUTO, MC_FIT_HUGE_ON, MC_FIT_HUGE_OFF } hugepages;
	struct mc_meminfo mem;
};

enum mc_fit {
	MC_FIT_OK = 0,
	MC_FIT_RAM,       /* more than the memory available */
	MC_FIT_MEMLOCK,   /* pinned, more than the memory-lock limit */
	MC_FIT_HUGEPAGES, /* --hugepages=on, more than the free huge pages */
};

/*
 * Whether the segment fits, and when it does not, one line (into why)
 * naming the figures and the key to change: --global-segment-size, the
 * memory-lock limit (LimitMEMLOCK, ulimit -l), the reserved huge pages,
 * or --force-segment-size to start anyway; every refusal ends with what
 * the node has (RAM available, free huge pages, the memory-lock limit). With huge pages on, or auto
 * and enough of them free, the segment comes from the huge page pool,
 * else from the memory available. Pure.
 */
enum mc_fit mc_segment_fit(const struct mc_fit_in *in, char *why, size_t len);

/* The segment an agent makes with --global-segment-size=0: 1 GiB or a
 * quarter of ram_bytes, whichever is smaller, in whole 2 MiB. Pure. */
uint64_t mc_default_segment_bytes(uint64_t ram_bytes);

/*
 * Fault [addr, addr + len) in for writing ahead of use, without changing a
 * byte (other threads may already be writing there): MADV_POPULATE_WRITE,
 * then one atomic read-modify-write of nothing per page from this process.
 * The second step is for hypervisors that shadow the guest's page tables
 * (the development VM's): there the first user-space write to each page
 * leaves the guest, even after the kernel has faulted the page in, and
 * costs 5-13 us a 4 KiB page (a 4 KiB put into a fresh page of the
 * segment took 7 us instead of 0.3). Touching also faults the pages in
 * where madvise cannot (before Linux 5.14). Returns 0, or the negative
 * errno of madvise when only the touching did the work. Blocks for as
 * long as that takes (about 1.5 s per GiB on that VM): call it off any
 * event loop.
 */
int mc_prefault_write(void *addr, size_t len);

/* Whether madvise(MADV_HUGEPAGE) gets anonymous memory transparent huge
 * pages: <sysfs_root>/kernel/mm/transparent_hugepage/enabled (sysfs_root
 * NULL: /sys) says "always" or "madvise". *mode (when not NULL) gets the
 * file's text, or "absent". */
bool mc_thp_madvise_ok(const char *sysfs_root, char *mode, size_t mode_len);
/* Bytes of the calling process's mapping that starts at addr on
 * transparent huge pages (AnonHugePages in /proc/self/smaps); negative
 * errno when it cannot be read, -ENOENT when no mapping starts there. */
int64_t mc_mapping_huge_bytes(const void *addr);

/* "64 GiB", "1.5 MiB", "512 B": a byte count for people. */
void mc_format_bytes(uint64_t bytes, char *buf, size_t len);

#endif
