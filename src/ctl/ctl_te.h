/*
 * ctl_te: a transfer engine hosted inside mooncakectl, for `mooncakectl
 * transfer` and `mooncakectl bench transfer` — its own libuv loop on a
 * thread, a meta client (or P2P mode), a gRPC server for the descriptor
 * fetch, and the engine's flags shared by both commands; plus the test
 * pattern both use to check every byte.
 */
#ifndef MC_CTL_CTL_TE_H
#define MC_CTL_CTL_TE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "common/auth.h"
#include "transfer/transfer.h"

struct etcd_client;
struct rpc_server;

struct ctl_te_opts {
	const char *segment; /* NULL: ctl-<pid> (P2P: host:port) */
	const char *meta;    /* endpoints; "": P2P mode */
	const char *cluster_id;
	const char *listen;      /* gRPC host:port */
	const char *data_listen; /* TCP data host:port */
	const char *protocol;
	const char *threads; /* numbers and sizes as given */
	const char *tcp_conns;
	const char *slice;
	const char *io_timeout;
	const char *lease_ttl;
	const char *secret_file;
	const char *rdma_devices;   /* "" or "auto": every usable one */
	const char *rdma_gid_index; /* "auto" or 0..255 */
	/* Where the cluster secret comes from, as for mooncaked
	 * (mc_secret_find): these flags, else MOONCAKE_* variables and
	 * mooncaked's configuration file. NULL: not given. */
	const char *config;
	const char *data_dir;
	const char *insecure; /* "" (the bare flag) or a boolean */
	/* Set: use this secret instead (a command whose engines are all its
	 * own); borrowed until ctl_te_start returns. */
	const struct mc_secret *secret;
};

#define CTL_TE_OPTS_INIT \
	{ \
		NULL, "http://127.0.0.1:2379", "mooncake", "127.0.0.1:0", "127.0.0.1:0", \
			"auto", "0", "4", "1M", "10s", "10s", NULL, "", "auto", NULL, NULL, \
			NULL, NULL \
	}

struct ctl_te {
	uv_loop_t loop;
	pthread_t tid;
	bool running;
	uv_async_t start, stop;
	const struct te_opts *start_opts; /* te_new runs on the loop thread */
	int start_rc;
	bool started;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool stopped;
	struct etcd_client *meta;
	struct rpc_server *rpc;
	struct te_engine *te;
	char name[300];
};

/*
 * Match one of the engine flags (--segment, --meta-endpoints,
 * --cluster-id, --listen, --data-listen, --protocol, --te-threads,
 * --te-tcp-conns, --te-slice-size, --te-io-timeout, --te-lease-ttl,
 * --cluster-secret-file, --insecure-transfer, --config, --data-dir,
 * --rdma-devices, --rdma-gid-index) at argv[*i].
 * Returns true when it was one.
 */
bool ctl_te_flag(struct ctl_te_opts *o, int argc, char **argv, int *i);
/* The flags' help lines. */
extern const char ctl_te_flags_help[];

/* Start the engine. On error writes one line to err (for a missing
 * cluster secret: what to give) and returns non-zero. */
int ctl_te_start(struct ctl_te *h, const struct ctl_te_opts *o, char *err, size_t errlen);
/* Unpublish, stop and free everything. */
void ctl_te_stop(struct ctl_te *h);

/*
 * A memfd-backed buffer registered with the engine at its own address
 * (so the address peers use equals ours). Errors: negative errno.
 */
struct ctl_buf {
	uint8_t *p;
	size_t len;
	int fd;
	struct te_region *r;
};
int ctl_buf_new(struct ctl_te *h, size_t len, struct ctl_buf *b);
void ctl_buf_free(struct ctl_buf *b);

/* The test pattern: byte at remote address a for seed s (s != 0). */
void ctl_pattern_fill(uint8_t *dst, size_t len, uint64_t seed, uint64_t addr);
/* Offset of the first byte that differs from the pattern, or len. */
size_t ctl_pattern_check(const uint8_t *p, size_t len, uint64_t seed, uint64_t addr);

#endif
