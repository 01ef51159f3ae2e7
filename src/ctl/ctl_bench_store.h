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
};

/* A master and two agents with a segment of segment bytes each; the
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
/* A session with the agent at sock once a put succeeds (its segment is
 * mounted), trying until timeout_ms. Errors: those of mc_open_ex and
 * mc_put. */
int ctl_local_open(const char *sock, mc_client **out, uint64_t timeout_ms);

/* ------------------------------------------------------------ ctl_redis.c */

/* A connection to redis on the loopback port: the fd, or -errno. */
int ctl_redis_connect(int port);
/* SET key. Errors: -EIO, -EPROTO (not +OK), -errno. */
int ctl_redis_set(int fd, const char *key, const void *val, size_t len);
/* GET key into buf: the value's length. Errors: MC_EOBJECT_NOT_FOUND,
 * -ENOBUFS (longer than cap), -EIO, -EPROTO, -errno. */
int64_t ctl_redis_get(int fd, const char *key, void *buf, size_t cap);

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
