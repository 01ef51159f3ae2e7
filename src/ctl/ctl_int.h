/*
 * ctl_int: what mooncakectl's files share — the subcommand entry points
 * and a tiny --flag parser. Every subcommand returns the process exit
 * status: 0 success, 1 failure (or "not serving"), 2 usage error.
 */
#ifndef MC_CTL_CTL_INT_H
#define MC_CTL_CTL_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <pthread.h>
#include <stdint.h>
#include <uv.h>

#define CTL_EXIT_OK 0
#define CTL_EXIT_FAIL 1
#define CTL_EXIT_USAGE 2

/* argv[0] is the subcommand name. */
int ctl_health_main(int argc, char **argv);
int ctl_bench_main(int argc, char **argv);
int ctl_ls_main(int argc, char **argv);
int ctl_stats_main(int argc, char **argv);
/* `stats --agent`: the local agent's figures (ctl_store.c); socket NULL:
 * where libmooncake looks. Returns an exit status. */
int ctl_agent_stats(const char *socket);
/* The DRAM segments the master at addr has ready (mounted, not
 * re-syncing), following a standby's redirect. Errors: -EINVAL (addr),
 * MC_EUNAVAILABLE (no answer). */
int ctl_master_dram_segments(const char *addr, unsigned *ready);
struct rpc_client;
struct rpc_client_opts;
/* A client of the server at addr (a master, a meta member's etcd API)
 * with the options o (NULL: defaults) that proves the cluster secret
 * when one is given (ctl_secret_file, else $MOONCAKE_CLUSTER_SECRET_FILE).
 * Errors: printed; -EINVAL (addr), of reading the secret file, -ENOMEM. */
int ctl_rpc_client(uv_loop_t *loop, const char *addr, const struct rpc_client_opts *o,
		   struct rpc_client **out);
/* The command's --cluster-secret-file (kept, not copied). */
void ctl_secret_file(const char *path);
/* put/get/rm through the local agent (ctl_store.c). */
int ctl_put_main(int argc, char **argv);
int ctl_get_main(int argc, char **argv);
int ctl_rm_main(int argc, char **argv);
/* A master for the benchmarks on a thread of this process
 * (ctl_bench_msrv.c): listening on 127.0.0.1, no meta, an empty index.
 * Errors: -ENOMEM, -EAGAIN (no thread), -EADDRNOTAVAIL (it did not
 * start; it logged why). */
struct ctl_msrv;
int ctl_msrv_start(uint64_t agent_ttl_ms, struct ctl_msrv **out);
int ctl_msrv_port(const struct ctl_msrv *t);
pthread_t ctl_msrv_thread(const struct ctl_msrv *t);
/* Stop it (its master first, then its server) and free it; NULL: no-op. */
void ctl_msrv_stop(struct ctl_msrv *t);
/* `bench master`; argv[0] is "master". */
int ctl_bench_master_main(int argc, char **argv);
/* `bench resync` (ctl_bench_resync.c); argv[0] is "resync". */
int ctl_bench_resync_main(int argc, char **argv);
/* `bench store`; argv[0] is "store" (ctl_bench_store.c). */
int ctl_bench_store_main(int argc, char **argv);
/* `bench sessions`: many client sessions with one agent; argv[0] is
 * "sessions" (ctl_bench_sessions.c). */
int ctl_bench_sessions_main(int argc, char **argv);
/* `bench ssd`: the SSD tier's store beside fio; argv[0] is "ssd"
 * (ctl_bench_ssd.c). */
int ctl_bench_ssd_main(int argc, char **argv);

/* fio's figures (ctl_fio.c), summed over runs. */
struct ctl_fio {
	double bw;                      /* bytes/s */
	double p50_us, p99_us, mean_us; /* sums over the runs */
	unsigned runs;
	/* Set by the caller: writes are synced as often as a store syncing
	 * every sync_ms would (0: after every write), at the rate fill_bw
	 * (bytes/s, from ctl_fio_fill); no syncs while sync is false. */
	bool sync;
	unsigned sync_ms;
	double fill_bw;
	double syncs_owed; /* (carried from run to run) */
	/* fio's buffers on transparent 2 MiB pages (glibc's malloc asked
	 * for them, 2 MiB aligned), as the agents' staging memory is:
	 * otherwise fio's default, 4 KiB pages. */
	bool huge;
	/* A CRC-32C of every block: computed as it is written, checked as
	 * it is read (--verify=crc32c; the file filled by ctl_fio_fill has
	 * them), as the SSD tier does. */
	bool check;
};
/* Run fio for ms on file (file_bytes, written whole before: ctl_fio_fill)
 * with blocks of bs, depth in flight, direct I/O: sequential writes
 * (write; synced as f asks) or random reads; its figures added to f.
 * false when fio is missing or failed (a line printed). */
bool ctl_fio_run(const char *file, uint64_t file_bytes, uint64_t bs, unsigned depth,
		 bool write, uint64_t ms, struct ctl_fio *f);
/* Write fio's file once, whole, each block with a CRC-32C (for runs with
 * check); *bw: the bytes/s it wrote at. false as ctl_fio_run. */
bool ctl_fio_fill(const char *file, uint64_t file_bytes, double *bw);

/* Latency samples in ns (ctl_lat.c); a zeroed struct is empty. */
struct ctl_lat {
	uint64_t *v;
	size_t n, cap;
};
void ctl_lat_add(struct ctl_lat *l, uint64_t ns);
/* The p-th percentile (0..1) in microseconds; sorts the samples. */
double ctl_lat_pct_us(struct ctl_lat *l, double p);
void ctl_lat_free(struct ctl_lat *l);
/* The mean of n operations that took ns in all, in microseconds (0 for
 * none). */
static inline double ctl_mean_us(uint64_t ns, uint64_t n)
{
	return n ? (double)ns / (double)n / 1e3 : 0;
}
/* CPU time a thread of this process has used, in ns (0 when it cannot be
 * read), for the benchmarks' CPU-per-operation figures. */
uint64_t ctl_thread_cpu_ns(pthread_t t);
/* `bench meta`; argv[0] is "meta". */
int ctl_bench_meta_main(int argc, char **argv);
int ctl_transfer_main(int argc, char **argv);
/* `doctor` (ctl_doctor.c) and `plan` (ctl_plan.c). */
int ctl_doctor_main(int argc, char **argv);
int ctl_plan_main(int argc, char **argv);
/* `secret create FILE` (ctl_secret.c). */
int ctl_secret_main(int argc, char **argv);
/* `bench transfer`: argv[0] is "transfer". */
int ctl_bench_transfer_main(int argc, char **argv);

/*
 * Match argv[*i] against --name=VALUE or "--name VALUE" (the latter
 * consumes argv[*i + 1]). Returns true and sets *value on a match;
 * *value is NULL when the flag was given without a value.
 */
bool ctl_flag_value(int argc, char **argv, int *i, const char *name, const char **value);
/* Match a boolean flag: --name, --name=true/false. Sets *out. Returns
 * true on a match; *ok false when the value is not a boolean. */
bool ctl_flag_bool(const char *arg, const char *name, bool *out, bool *ok);
/* A count of things: digits with an optional decimal K, M or G suffix
 * (10K = 10,000, 1M = 1,000,000). Errors: -EINVAL (not one, or 0). */
int ctl_parse_count(const char *s, uint64_t *out);

#endif
