/*
 * ctl_te: the engine host of mooncakectl's transfer commands. See
 * ctl_te.h. The meta client and the gRPC server are made on the calling
 * thread before the loop runs; then the loop runs on its own thread and
 * the engine is created there (te_new belongs on the loop's thread: it is
 * how the engine tells the loop from the threads that may block);
 * stopping asks the loop (uv_async) to unpublish and shut the gRPC server
 * down, joins it, and frees the engine.
 */
#include "ctl/ctl_te.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/auth.h"
#include "common/cfg.h"
#include "common/util.h"
#include "ctl/ctl_int.h"
#include "etcd/etcd.h"
#include "rpc/rpc.h"

const char ctl_te_flags_help[] =
	"  --segment=NAME            this process's segment name (default "
	"ctl-<pid>;\n"
	"                            without meta: the --listen host:port)\n"
	"  --meta-endpoints=LIST     meta (etcd v3) endpoints (default "
	"127.0.0.1:2379);\n"
	"                            empty: P2P mode, where segments are named "
	"by\n"
	"                            their gRPC host:port\n"
	"  --cluster-id=ID           meta key prefix (default mooncake)\n"
	"  --listen=HOST:PORT        gRPC port for P2P descriptor fetch "
	"(default 127.0.0.1:0)\n"
	"  --data-listen=HOST:PORT   TCP data listener (default 127.0.0.1:0)\n"
	"  --protocol=P              auto|tcp|rdma|shm (default auto)\n"
	"  --te-threads=N            data threads (default: one per core)\n"
	"  --te-tcp-conns=N          TCP connections per peer (default 4)\n"
	"  --te-slice-size=SIZE      slice size, 64K..64M (default 1M)\n"
	"  --te-io-timeout=DURATION  dead-path timeout (default 10s)\n"
	"  --te-lease-ttl=DURATION   descriptor lease in meta (default 10s)\n"
	"  --cluster-secret-file=F   the cluster secret peers prove (default: as\n"
	"                            mooncaked finds it: MOONCAKE_CLUSTER_SECRET_FILE,\n"
	"                            the configuration file, else\n"
	"                            <data-dir>/cluster.secret, which needs read\n"
	"                            access to the agent's data directory)\n"
	"  --data-dir=DIR            the agent's data directory (default\n"
	"                            /var/lib/mooncake)\n"
	"  --config=FILE             mooncaked's configuration file to read those\n"
	"                            keys from (default /etc/mooncake/mooncaked.conf)\n"
	"  --insecure-transfer       no authentication at all (only with peers\n"
	"                            that run with it too)\n"
	"  --rdma-devices=LIST       RDMA devices, mlx5_0,mlx5_1 (default: every "
	"usable one)\n"
	"  --rdma-gid-index=N        RoCE GID index 0-255 (default auto)\n";

bool ctl_te_flag(struct ctl_te_opts *o, int argc, char **argv, int *i)
{
	static const struct {
		const char *name;
		size_t off;
	} flags[] = {
		{"segment", offsetof(struct ctl_te_opts, segment)},
		{"meta-endpoints", offsetof(struct ctl_te_opts, meta)},
		{"cluster-id", offsetof(struct ctl_te_opts, cluster_id)},
		{"listen", offsetof(struct ctl_te_opts, listen)},
		{"data-listen", offsetof(struct ctl_te_opts, data_listen)},
		{"protocol", offsetof(struct ctl_te_opts, protocol)},
		{"te-threads", offsetof(struct ctl_te_opts, threads)},
		{"te-tcp-conns", offsetof(struct ctl_te_opts, tcp_conns)},
		{"te-slice-size", offsetof(struct ctl_te_opts, slice)},
		{"te-io-timeout", offsetof(struct ctl_te_opts, io_timeout)},
		{"te-lease-ttl", offsetof(struct ctl_te_opts, lease_ttl)},
		{"cluster-secret-file", offsetof(struct ctl_te_opts, secret_file)},
		{"rdma-devices", offsetof(struct ctl_te_opts, rdma_devices)},
		{"rdma-gid-index", offsetof(struct ctl_te_opts, rdma_gid_index)},
		{"config", offsetof(struct ctl_te_opts, config)},
		{"data-dir", offsetof(struct ctl_te_opts, data_dir)},
		{"insecure-transfer", offsetof(struct ctl_te_opts, insecure)},
	};
	const char *v;
	for (size_t k = 0; k < MC_ARRAY_LEN(flags); k++) {
		if (ctl_flag_value(argc, argv, i, flags[k].name, &v)) {
			*(const char **)((char *)o + flags[k].off) = v ? v : "";
			return true;
		}
	}
	return false;
}

/* ------------------------------------------------------------ the loop */

static void *loop_main(void *arg)
{
	struct ctl_te *h = arg;
	uv_run(&h->loop, UV_RUN_DEFAULT);
	return NULL;
}

static void on_rpc_done(struct rpc_server *s, void *ud)
{
	(void)s;
	(void)ud;
}

static void on_te_stopped(struct te_engine *e, void *ud)
{
	struct ctl_te *h = ud;
	(void)e;
	if (h->meta)
		etcd_client_free(h->meta);
	h->meta = NULL;
	if (h->rpc)
		rpc_server_shutdown(h->rpc, 0, on_rpc_done, h);
	uv_close((uv_handle_t *)&h->stop, NULL);
}

static void on_stop(uv_async_t *a)
{
	struct ctl_te *h = a->data;
	te_stop(h->te, on_te_stopped, h);
}

/* On the loop thread: create the engine; on failure take the loop's
 * handles down so that uv_run returns. */
static void on_start(uv_async_t *a)
{
	struct ctl_te *h = a->data;
	int rc = te_new(h->start_opts, &h->te);
	uv_close((uv_handle_t *)&h->start, NULL);
	if (rc) {
		if (h->meta)
			etcd_client_free(h->meta);
		h->meta = NULL;
		rpc_server_shutdown(h->rpc, 0, on_rpc_done, h);
		uv_close((uv_handle_t *)&h->stop, NULL);
	}
	pthread_mutex_lock(&h->mu);
	h->start_rc = rc;
	h->started = true;
	pthread_cond_broadcast(&h->cv);
	pthread_mutex_unlock(&h->mu);
}

/* ------------------------------------------------------------ start / stop */

static int bad(char *err, size_t errlen, const char *what, const char *v)
{
	snprintf(err, errlen, "bad %s '%s'", what, v ? v : "");
	return -EINVAL;
}

/* The flags that say where the secret is, as mooncaked reads them. */
static int find_secret(const struct ctl_te_opts *o, struct mc_secret *sec, char *err,
		       size_t errlen)
{
	if (o->secret) {
		*sec = *o->secret;
		return 0;
	}
	char *argv[5], bufs[4][4200];
	int argc = 0, n = 0;
	argv[argc++] = "mooncakectl";
	if (o->config)
		snprintf(argv[argc++] = bufs[n++], sizeof(bufs[0]), "--config=%s", o->config);
	if (o->data_dir)
		snprintf(argv[argc++] = bufs[n++], sizeof(bufs[0]), "--data-dir=%s",
			 o->data_dir);
	if (o->secret_file)
		snprintf(argv[argc++] = bufs[n++], sizeof(bufs[0]), "--cluster-secret-file=%s",
			 o->secret_file);
	if (o->insecure)
		snprintf(argv[argc++] = bufs[n++], sizeof(bufs[0]), "--insecure-transfer%s%s",
			 *o->insecure ? "=" : "", o->insecure);
	struct cfg cfg;
	struct cfg_cmdline cl;
	int rc = cfg_load(&cfg, argc, argv, environ, &cl, err, errlen);
	if (rc)
		return rc;
	struct sockaddr_storage a, b;
	bool public_listen = mc_parse_hostport(o->listen, &a) != 0 ||
			     mc_parse_hostport(o->data_listen, &b) != 0 ||
			     !mc_addr_is_loopback((struct sockaddr *)&a) ||
			     !mc_addr_is_loopback((struct sockaddr *)&b);
	rc = mc_secret_find(&cfg, false, public_listen, sec, err, errlen);
	cfg_free(&cfg);
	if (rc == 0 && !sec->len)
		fprintf(stderr, "mooncakectl: --insecure-transfer: this engine does not "
				"authenticate peers: anyone who reaches its ports reads and "
				"writes its buffers\n");
	return rc;
}

int ctl_te_start(struct ctl_te *h, const struct ctl_te_opts *o, char *err, size_t errlen)
{
	uint64_t threads, conns, slice, io_ms, ttl_ms;
	enum te_protocol proto;
	int rc;
	char *end;

	memset(h, 0, sizeof(*h));
	threads = strtoull(o->threads, &end, 10);
	if (!*o->threads || *end || threads > 1024)
		return bad(err, errlen, "--te-threads", o->threads);
	conns = strtoull(o->tcp_conns, &end, 10);
	if (!*o->tcp_conns || *end || conns < 1 || conns > 32)
		return bad(err, errlen, "--te-tcp-conns (1..32)", o->tcp_conns);
	if (cfg_parse_size(o->slice, &slice) || slice < (64 << 10) || slice > (64 << 20))
		return bad(err, errlen, "--te-slice-size (64K..64M)", o->slice);
	if (cfg_parse_duration_ms(o->io_timeout, &io_ms) || io_ms == 0)
		return bad(err, errlen, "--te-io-timeout", o->io_timeout);
	if (cfg_parse_duration_ms(o->lease_ttl, &ttl_ms) || ttl_ms < 1000)
		return bad(err, errlen, "--te-lease-ttl (>= 1s)", o->lease_ttl);
	if (te_protocol_parse(o->protocol, &proto))
		return bad(err, errlen, "--protocol", o->protocol);
	int gid = -1;
	if (o->rdma_gid_index && *o->rdma_gid_index && strcmp(o->rdma_gid_index, "auto")) {
		long v = strtol(o->rdma_gid_index, &end, 10);
		if (*end || v < 0 || v > 255)
			return bad(err, errlen, "--rdma-gid-index (auto or 0-255)",
				   o->rdma_gid_index);
		gid = (int)v;
	}
	const char *devs = o->rdma_devices && strcmp(o->rdma_devices, "auto") ? o->rdma_devices
									      : "";
	struct mc_secret sec;
	rc = find_secret(o, &sec, err, errlen);
	if (rc)
		return rc;
	bool p2p = !o->meta || !*o->meta;
	if (o->segment)
		snprintf(h->name, sizeof(h->name), "%s", o->segment);
	else if (!p2p)
		snprintf(h->name, sizeof(h->name), "ctl-%d", (int)getpid());

	pthread_mutex_init(&h->mu, NULL);
	pthread_cond_init(&h->cv, NULL);
	if (uv_loop_init(&h->loop)) {
		snprintf(err, errlen, "cannot create an event loop");
		mc_secret_clear(&sec);
		return -ENOMEM;
	}
	if (!p2p) {
		struct etcd_opts eo = {.endpoints = o->meta,
				       .auth_key = sec.len ? sec.key : NULL,
				       .auth_key_len = sec.len};
		rc = etcd_client_new(&h->loop, &eo, &h->meta);
		if (rc) {
			snprintf(err, errlen, "--meta-endpoints '%s': %s", o->meta,
				 mc_strerror(rc));
			goto fail_loop;
		}
	}
	struct rpc_server_opts ro = {.name = "transfer"};
	rc = rpc_server_new(&h->loop, &ro, &h->rpc);
	if (rc == 0)
		rc = rpc_server_listen(h->rpc, o->listen);
	if (rc) {
		snprintf(err, errlen, "cannot listen on --listen=%s: %s", o->listen,
			 mc_strerror(rc));
		goto fail_rpc;
	}
	uint16_t port = (uint16_t)rpc_server_port(h->rpc, 0);
	struct te_opts to = {
		.loop = &h->loop,
		.segment_name = h->name[0] ? h->name : NULL,
		.cluster_id = o->cluster_id,
		.meta = h->meta,
		.rpc = h->rpc,
		.rpc_port = port,
		.data_listen = o->data_listen,
		.protocol = proto,
		.threads = (unsigned)threads,
		.tcp_conns = (unsigned)conns,
		.slice_bytes = (size_t)slice,
		.io_timeout_ms = io_ms,
		.lease_ttl_s = (ttl_ms + 999) / 1000,
		.rdma_devices = devs,
		.rdma_gid_index = gid,
		.cluster_secret = sec.len ? sec.key : NULL,
		.cluster_secret_len = sec.len,
		.insecure = sec.len == 0,
	};
	uv_async_init(&h->loop, &h->stop, on_stop);
	h->stop.data = h;
	uv_async_init(&h->loop, &h->start, on_start);
	h->start.data = h;
	h->start_opts = &to;
	if (pthread_create(&h->tid, NULL, loop_main, h) != 0) {
		snprintf(err, errlen, "cannot start the loop thread");
		/* Only reachable when out of threads: leak rather than
		 * tear down a loop with live handles. */
		mc_secret_clear(&sec);
		return -EAGAIN;
	}
	uv_async_send(&h->start);
	pthread_mutex_lock(&h->mu);
	while (!h->started)
		pthread_cond_wait(&h->cv, &h->mu);
	rc = h->start_rc;
	pthread_mutex_unlock(&h->mu);
	mc_secret_clear(&sec);
	h->start_opts = NULL;
	if (rc) {
		/* on_start took the loop's handles down: it ends. */
		pthread_join(h->tid, NULL);
		rpc_server_free(h->rpc);
		(void)uv_loop_close(&h->loop);
		snprintf(err, errlen, "cannot start the transfer engine: %s", mc_strerror(rc));
		return rc;
	}
	snprintf(h->name, sizeof(h->name), "%s", te_name(h->te));
	h->running = true;
	return 0;

fail_rpc:
	if (h->rpc) {
		rpc_server_shutdown(h->rpc, 0, on_rpc_done, h);
		uv_run(&h->loop, UV_RUN_DEFAULT);
		rpc_server_free(h->rpc);
	}
	if (h->meta)
		etcd_client_free(h->meta);
	uv_run(&h->loop, UV_RUN_DEFAULT);
fail_loop:
	(void)uv_loop_close(&h->loop);
	mc_secret_clear(&sec);
	return rc ? rc : -EINVAL;
}

void ctl_te_stop(struct ctl_te *h)
{
	if (!h->running)
		return;
	uv_async_send(&h->stop);
	pthread_join(h->tid, NULL);
	h->running = false;
	te_free(h->te);
	rpc_server_free(h->rpc);
	(void)uv_loop_close(&h->loop);
	pthread_mutex_destroy(&h->mu);
	pthread_cond_destroy(&h->cv);
}

/* ------------------------------------------------------------ buffers */

int ctl_buf_new(struct ctl_te *h, size_t len, struct ctl_buf *b)
{
	memset(b, 0, sizeof(*b));
	b->fd = memfd_create("mooncakectl", MFD_CLOEXEC);
	if (b->fd < 0)
		return -errno;
	int rc;
	if (ftruncate(b->fd, (off_t)len) != 0) {
		rc = -errno;
		goto fail_fd;
	}
	b->p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, b->fd, 0);
	if (b->p == MAP_FAILED) {
		rc = -errno;
		goto fail_fd;
	}
	b->len = len;
	rc = te_register(h->te, (uint64_t)(uintptr_t)b->p, b->p, len, b->fd, 0, &b->r);
	if (rc)
		goto fail_map;
	return 0;
fail_map:
	munmap(b->p, len);
fail_fd:
	close(b->fd);
	b->fd = -1;
	return rc;
}

void ctl_buf_free(struct ctl_buf *b)
{
	if (b->r)
		te_unregister(b->r);
	if (b->p)
		munmap(b->p, b->len);
	if (b->fd >= 0)
		close(b->fd);
	memset(b, 0, sizeof(*b));
	b->fd = -1;
}

/* ------------------------------------------------------------ pattern */

static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* Byte a of the pattern: byte a % 8 of mix(seed ^ a / 8). */
void ctl_pattern_fill(uint8_t *dst, size_t len, uint64_t seed, uint64_t addr)
{
	size_t i = 0;
	while (i < len) {
		uint64_t a = addr + i, w = mix(seed ^ (a >> 3));
		unsigned k = (unsigned)(a & 7);
		if (k == 0 && len - i >= 8) {
			memcpy(dst + i, &w, 8); /* little-endian hosts */
			i += 8;
			continue;
		}
		dst[i++] = (uint8_t)(w >> (8 * k));
	}
}

size_t ctl_pattern_check(const uint8_t *p, size_t len, uint64_t seed, uint64_t addr)
{
	size_t i = 0;
	while (i < len) {
		uint64_t a = addr + i, w = mix(seed ^ (a >> 3));
		unsigned k = (unsigned)(a & 7);
		if (k == 0 && len - i >= 8) {
			if (memcmp(p + i, &w, 8) != 0)
				break;
			i += 8;
			continue;
		}
		if (p[i] != (uint8_t)(w >> (8 * k)))
			return i;
		i++;
	}
	for (; i < len; i++) {
		uint64_t a = addr + i, w = mix(seed ^ (a >> 3));
		if (p[i] != (uint8_t)(w >> (8 * (a & 7))))
			return i;
	}
	return len;
}
