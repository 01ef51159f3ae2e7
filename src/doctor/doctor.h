/*
 * doctor: the checks of a node an operator runs before (and while) a
 * daemon serves on it — what deployment guides ask for with ibv_devinfo,
 * show_gids, lspci -vv, ulimit -l and /proc/meminfo — read from sysfs and
 * procfs directly (never by running those tools, which may be missing),
 * each as a row: what was checked, what was found, what is expected, a
 * verdict and how to fix it.
 *
 * The rules are the daemon's own: the GID index is te_gid_pick's, whether
 * the segment fits is mc_segment_fit's, so a row names what the daemon
 * will do. `mooncakectl doctor` runs them here; every role serves them as
 * mooncake.doctor.Doctor/Check (proto/doctor.proto), with its own
 * configuration and process limits, for `mooncakectl doctor --cluster`.
 *
 * The roots (sysfs, procfs, /dev, /etc) are arguments so that tests give
 * fake trees. Where sysfs has no active MTU (it never has on mainline
 * kernels) the RoCE netdev's MTU gives it, else libibverbs is asked.
 */
#ifndef MC_DOCTOR_DOCTOR_H
#define MC_DOCTOR_DOCTOR_H

#include <stdbool.h>
#include <stddef.h>

#include "common/cfg.h"
#include "common/err.h"

struct rpc_server;

enum doctor_verdict { DOCTOR_OK = 0, DOCTOR_WARN = 1, DOCTOR_FAIL = 2, DOCTOR_SKIP = 3 };

struct doctor_row {
	char check[96];
	char value[256];
	char expected[160];
	enum doctor_verdict verdict;
	char fix[400];
};

/* Rows in the order they were added; a zeroed struct is empty. */
struct doctor_report {
	struct doctor_row *rows;
	size_t n, cap;
};

struct doctor_env {
	const char *sysfs_root;  /* NULL: /sys */
	const char *procfs_root; /* NULL: /proc */
	const char *dev_root;    /* NULL: /dev */
	const char *etc_root;    /* NULL: /etc */
	const struct cfg *cfg;   /* the daemon's configuration (borrowed) */
	/* The daemon's process in procfs (its limits and capabilities), 0:
	 * this process — and daemon_running says whether that is the daemon
	 * (the frame asks for its own node) or a shell standing in for it. */
	int pid;
	bool daemon_running;
};

/*
 * Add a row (texts are cut to their fields' sizes; fix is kept for WARN
 * and FAIL only). Errors: -ENOMEM.
 */
int doctor_add(struct doctor_report *r, enum doctor_verdict v, const char *check,
	       const char *value, const char *expected, const char *fix) MC_MUST_CHECK;
void doctor_report_free(struct doctor_report *r);
/* The worst verdict of the report (SKIP counts as OK). */
enum doctor_verdict doctor_worst(const struct doctor_report *r);
const char *doctor_verdict_name(enum doctor_verdict v);

/*
 * The node's checks: RDMA devices and ports (state, link layer, the GID
 * the daemon would pick, active MTU vs 4096), /dev/infiniband access, each
 * NIC's PCIe link (current vs maximum speed and width) and NUMA node vs
 * --numa-node, the memory-lock limit vs the segment RDMA pins, huge pages
 * vs the segment, memory available vs the segment and buffers, the socket
 * buffer limits, the log level and log file size policy. Errors: -ENOMEM
 * (rows added so far stay in r).
 */
int doctor_node_checks(const struct doctor_env *env, struct doctor_report *r) MC_MUST_CHECK;

/*
 * Serve mooncake.doctor.Doctor on s: Check runs doctor_node_checks for
 * this process with cfg (borrowed; it must outlive the server) on a
 * thread of libuv's pool, never on the loop. Errors: -EEXIST, -ENOMEM.
 */
int doctor_service_add(struct rpc_server *s, const struct cfg *cfg) MC_MUST_CHECK;

#endif
