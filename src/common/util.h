/*
 * util: small pieces every subsystem needs — clocks, container_of, numeric
 * host:port parsing, directory creation, the data-dir lock and pid files.
 *
 * Addresses are always resolved numerically (no DNS): mooncaked is a static
 * binary and glibc's resolver would need shared NSS modules at run time.
 */
#ifndef MC_COMMON_UTIL_H
#define MC_COMMON_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "common/err.h"

#define MC_CONTAINER_OF(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))
#define MC_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define MC_MIN(a, b) ((a) < (b) ? (a) : (b))
#define MC_MAX(a, b) ((a) > (b) ? (a) : (b))

/* madvise advice of Linux 5.14 (older headers lack it): fault pages in
 * writable without changing their bytes. */
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

/* Monotonic clock in milliseconds / nanoseconds. */
uint64_t mc_now_ms(void);
uint64_t mc_now_ns(void);
/* Wall clock, milliseconds since the epoch. */
uint64_t mc_wall_ms(void);
/* True at most once per period_ms (then *last_ms is now): for a warning
 * about a condition that may recur at every event (a bound that is full). */
bool mc_once_per(uint64_t *last_ms, uint64_t period_ms);

/*
 * Parse "host:port" with a numeric IPv4 host, "[v6]:port", or ":port"
 * (meaning 127.0.0.1). Port 0 is allowed (ephemeral). Errors: -EINVAL.
 */
int mc_parse_hostport(const char *s, struct sockaddr_storage *out) MC_MUST_CHECK;

/* calloc(n, size) through malloc and memset, for the allocations of every
 * request: glibc before 2.41 serves calloc without its per-thread cache
 * (callgrind of an agent under 4 KiB puts: 160-450 instructions a calloc
 * of the request's blocks). NULL when n * size overflows or on -ENOMEM;
 * free() frees it. */
void *mc_zalloc(size_t n, size_t size);

/* True for an address only this host reaches: 127.0.0.0/8, ::1 and
 * IPv4-mapped 127.x. */
bool mc_addr_is_loopback(const struct sockaddr *sa);

/* Format a socket address as "host:port" into buf (at least 64 bytes). */
void mc_format_addr(const struct sockaddr *sa, char *buf, size_t len);

/* mkdir -p with the given mode. Errors: negative errno of the failing step. */
int mc_mkdir_p(const char *path, unsigned mode) MC_MUST_CHECK;

/*
 * Take an exclusive lock on <dir>/LOCK (flock, released when the process
 * exits or mc_unlock_dir is called). On success *fd_out holds the lock.
 * Errors: MC_ELOCKED when another process holds it (its pid, if it wrote
 * one, is put in *holder_pid, else 0), negative errno otherwise.
 */
int mc_lock_dir(const char *dir, int *fd_out, int *holder_pid) MC_MUST_CHECK;
void mc_unlock_dir(int fd);

/* Write "pid\n" to path atomically (temp + rename). */
int mc_write_pidfile(const char *path) MC_MUST_CHECK;

/* fsync a directory (after renames inside it). */
int mc_fsync_dir(const char *dir) MC_MUST_CHECK;

/* Replace the file path (in the directory dir) with len bytes of data,
 * mode 0640: written to "path.tmp", synced, renamed over path, then dir
 * synced, so that a crash leaves the old file or the new one whole.
 * Errors: negative errno (the temporary file is removed). */
int mc_write_file_durably(const char *dir, const char *path, const void *data,
			  size_t len) MC_MUST_CHECK;

/*
 * Delete the file at path a little at a time: cut step_bytes off its end
 * (0: all of it), pause pause_ms, and so on; unlink it when empty.
 * Deleting a large file at once frees all its blocks in one journal
 * commit, and on a file system mounted with discard every fsync that
 * waits for that commit (a WAL's) waits for the whole discard too: seconds
 * for a few hundred megabytes on a shared virtual disk. In steps, each
 * commit that other writers' fsyncs make carries about one step; no fsync
 * of its own adds commits (each a cache flush of the disk). Blocks the
 * calling thread for size / step_bytes pauses: call it off any
 * latency-sensitive thread. A crash leaves the file shorter or gone.
 * Errors: negative errno of the failing open, ftruncate or unlink
 * (-ENOENT when there is no such file).
 */
int mc_unlink_in_steps(const char *path, uint64_t step_bytes, unsigned pause_ms) MC_MUST_CHECK;

/*
 * Delete every file of dir whose name ends with suffix by
 * mc_unlink_in_steps, then fsync dir if any went; *removed (if not NULL)
 * counts them. Errors: negative errno of opening dir, of the first
 * deletion that failed (the others are still tried) or of the fsync.
 */
int mc_unlink_suffixed(const char *dir, const char *suffix, uint64_t step_bytes,
		       unsigned pause_ms, unsigned *removed) MC_MUST_CHECK;

/* Byte strings in bytes.Compare's order (etcd's, and the master's keys):
 * -1, 0 or 1; shorter first when one is the other's prefix. */
int mc_bytes_cmp(const void *a, size_t alen, const void *b, size_t blen);

/* A 64-bit hash for in-memory tables: eight bytes a step, each mixed in
 * by a 64x64->128-bit multiply (as wyhash does). Not stable across
 * versions or byte orders: never store it. */
uint64_t mc_hash64(const void *data, size_t len);

/* Resident set size of this process in bytes (/proc/self/statm); 0 when
 * it cannot be read. */
uint64_t mc_rss_bytes(void);

#endif
