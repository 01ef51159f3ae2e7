/*
 * ctl_bench_store: what the files of `mooncakectl bench store` share and
 * nothing else uses.
 *
 *   ctl_bench_store.c  the benchmark: options, client threads and their
 *                      runs, the memcpy limits, the table
 *   ctl_bench_local.c  the servers it starts for itself: mooncaked's
 *                      master and agents, redis-server
 *   ctl_redis.c        a minimal RESP client, for the redis comparison
 *   ctl_bench_floor.c  the floor of a get: what a daemon on this host
 *                      does at the least for one, without the store
 *   ctl_bench_tier.c   --tier=ssd: the agents' SSD tiers beside fio
 *   ctl_bench_sessions.c  `bench sessions`: many sessions with one agent
 *                      (its servers and /proc readings from here too)
 *
 * Every function returns 0 or a negative errno / MC_E* code unless said.
 */
#ifndef MC_CTL_CTL_BENCH_STORE_H
#define MC_CTL_CTL_BENCH_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "client/mooncake.h"

/* ------------------------------------------------------------ ctl_bench_tier.c */

/* mooncakectl bench store --tier=ssd (its own options; see the file). */
int ctl_bench_tier_main(int argc, char **argv);

/* ------------------------------------------------------------ ctl_bench_local.c */

struct ctl_proc {
	pid_t pid; /* -1: reaped */
	char name[32];
};

/* What ctl_local_start and ctl_local_start_redis start, and where. */
struct ctl_local {
	char dir[64]; /* the temporary directory ("": none yet) */
	struct ctl_proc procs[4];
	int nprocs;
	char sock[2][128]; /* the agents' client sockets */
	char master[32];   /* the master's host:port */
	int redis_port;
	/* Set before ctl_local_start: each agent gets an SSD tier of
	 * ssd_bytes in ssd_dir/agentN (promotion off). */
	const char *ssd_dir;
	uint64_t ssd_bytes;
};

/* A master and two agents with a segment of segment bytes each (and an
 * SSD tier each when ssd_dir is set); the
 * master in the first agent's process (separate false: the layout of
 * standalone and --role=master,agent) or in one of its own. */
int ctl_local_start(struct ctl_local *l, uint64_t segment, bool separate);
/* redis-server from $PATH. Errors: -ENOENT (not installed), -errno. */
int ctl_local_start_redis(struct ctl_local *l);
/* Tell which started process has exited already, with the end of its
 * log. */
void ctl_local_report_dead(struct ctl_local *l);
/* Stop every process (SIGTERM, then wait) and remove the directory. */
void ctl_local_stop(struct ctl_local *l);
/* The process ctl_local started under name ("master", "agent0",
 * "agent1", "redis"): its pid, or -1. */
pid_t ctl_local_pid(const struct ctl_local *l, const char *name);

/* What the threads of a process have used so far. */
struct ctl_usage {
	uint64_t cpu_ns;  /* on a CPU (each thread's schedstat) */
	uint64_t wakeups; /* voluntary context switches: sleeps, each
			   * ended by a wakeup */
};
/* The usage of every thread of pid (threads that have exited are not
 * counted). Errors: -errno (no such process). */
int ctl_proc_usage(pid_t pid, struct ctl_usage *u);

/* The resident memory and open descriptors of pid. */
struct ctl_proc_mem {
	uint64_t rss_bytes; /* resident: heap, stacks and shared pages
			     * touched, but for an agent's DRAM segment */
	uint64_t fds;
};
/* Errors: -errno (no such process, /proc not readable). */
int ctl_proc_mem(pid_t pid, struct ctl_proc_mem *m);

/* A session with the agent at sock once a put succeeds (its segment is
 * mounted), trying until timeout_ms. Errors: those of mc_open_ex and
 * mc_put. */
int ctl_local_open(const char *sock, mc_client **out, uint64_t timeout_ms);
/* 16 random hex digits and a NUL: a run's own key names in a cluster
 * that may hold a user's objects. */
void ctl_run_id(char out[17]);

/* ------------------------------------------------------------ ctl_redis.c */

#define CTL_REDIS_MAX_PIPELINE 64 /* commands sent at once */
#define CTL_REDIS_MAX_KEY 128     /* bytes */

struct ctl_redis;

/* A connection to redis at host:port (a name or an address; the first
 * address that takes it), closed by ctl_redis_close. Errors: -ENOMEM,
 * -EHOSTUNREACH (host does not resolve), -errno of the last connect. */
int ctl_redis_connect(const char *host, int port, struct ctl_redis **out);
void ctl_redis_close(struct ctl_redis *r);
/* UNLINK every key that starts with prefix (SCAN MATCH prefix*, a few
 * dozen keys a round trip); *removed: how many went. Errors: -EINVAL
 * (prefix too long), -ENOMEM, -EIO, -EPROTO. */
int ctl_redis_unlink_prefix(struct ctl_redis *r, const char *prefix, uint64_t *removed);
/* SET keys[i] to vals[i] (len bytes each), i < n: the n commands sent at
 * once, then their n replies read. Errors: -EINVAL (n over the pipeline
 * or a key over CTL_REDIS_MAX_KEY), -EIO, -EPROTO (a reply not +OK),
 * -errno. */
int ctl_redis_set_n(struct ctl_redis *r, size_t n, const char *const *keys,
		    const void *const *vals, size_t len);
/* GET keys[i] into bufs[i] (cap bytes each), pipelined as ctl_redis_set_n:
 * lens[i] is value i's length, MC_EOBJECT_NOT_FOUND or -ENOBUFS (longer
 * than cap). Errors (of the connection): -EINVAL, -EIO, -EPROTO, -errno. */
int ctl_redis_get_n(struct ctl_redis *r, size_t n, const char *const *keys, void *const *bufs,
		    size_t cap, int64_t *lens);

/* ------------------------------------------------------------ ctl_bench_floor.c */

struct ctl_floor;

/* A floor for nvals values of size bytes copied into dst (the caller's
 * buffer, which must outlive it); ctl_floor_stop ends and frees it.
 * Errors: -ENOMEM, -errno (socketpair, pthread_create). */
int ctl_floor_start(size_t size, size_t nvals, uint8_t *dst, struct ctl_floor **out);
/* The client's side: one get of value k (modulo nvals). Errors: -errno,
 * MC_EPROTOCOL. */
int ctl_floor_get(struct ctl_floor *f, uint32_t k);
void ctl_floor_stop(struct ctl_floor *f);

#endif
