/*
 * engine: the transfer engine object — options, transports, the data
 * threads, the setup thread and the loop hand-off, registered regions, the
 * descriptor this engine publishes (its gRPC service is svc.c).
 *
 * Protocol choice: shm is used for every peer on this host whose regions
 * are memfd-backed (host identity = the kernel's boot id, so processes in
 * containers on one kernel qualify; if the shm socket is unreachable the
 * engine falls back to the remote transport). Remote peers use rdma when a
 * usable device exists (auto: else tcp, with the reason logged once;
 * rdma: no usable device refuses the start with that reason) and the peer
 * offers it; a peer without rdma is reached over tcp. --protocol=tcp
 * forces tcp and --protocol=rdma forces rdma even on one host
 * (benchmarks, tests); --protocol=shm refuses peers on other hosts.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/metrics.h"
#include "common/util.h"
#include "etcd/etcd.h"
#include "rpc/rpc.h"
#include "transfer.pb-c.h"
#include "transfer/te_int.h"

#define LOG_SUBSYS LOGS_TE

static const char *const proto_names[] = {"auto", "tcp", "rdma", "shm"};

/* ------------------------------------------------------------ transports */

/* Defined by tcp.c, rdma_transport.c and shm.c; named only here. */
extern const struct te_xport_ops te__tcp_ops, te__rdma_ops, te__shm_ops;

static const struct te_xport_ops *const xports[] = {
	[TE_PROTO_TCP] = &te__tcp_ops,
	[TE_PROTO_RDMA] = &te__rdma_ops,
	[TE_PROTO_SHM] = &te__shm_ops,
};

const struct te_xport_ops *te__xport_ops(enum te_protocol proto)
{
	return (unsigned)proto < MC_ARRAY_LEN(xports) ? xports[proto] : NULL;
}

/* Start the transport of proto: on success its ops are in e->xops[proto]
 * and its state in e->xp[proto]. The ops go in first, so whoever sees the
 * state (a connection the new listener served) finds them. Errors: the
 * transport's init's. */
static int xport_start(struct te_engine *e, enum te_protocol proto)
{
	e->xops[proto] = te__xport_ops(proto);
	int rc = e->xops[proto]->init(e, &e->xp[proto]);
	if (rc)
		e->xops[proto] = NULL;
	return rc;
}

const char *te_protocol_name(enum te_protocol p)
{
	return (unsigned)p < MC_ARRAY_LEN(proto_names) ? proto_names[p] : "?";
}

int te_protocol_parse(const char *s, enum te_protocol *out)
{
	for (size_t i = 0; s && i < MC_ARRAY_LEN(proto_names); i++) {
		if (strcmp(s, proto_names[i]) == 0) {
			*out = (enum te_protocol)i;
			return 0;
		}
	}
	return -EINVAL;
}

enum te_protocol te_protocol_in_use(const struct te_engine *e)
{
	return e->proto == TE_PROTO_SHM ? TE_PROTO_SHM : e->remote_proto;
}

const char *te_name(const struct te_engine *e)
{
	return e->name;
}

uint64_t te_io_timeout_ms(const struct te_engine *e)
{
	return e->io_timeout_ms;
}

bool te__hs_bound_enter(struct te_engine *e, struct te_hs_bound *b, int transport,
			const char *who)
{
	if (atomic_load(&b->n) < TE_MAX_HANDSHAKES) {
		atomic_fetch_add(&b->n, 1);
		return true;
	}
	metric_inc(e->m_hs_refused[transport]);
	if (mc_once_per(&b->logged_ms, 10000))
		log_warn("%s: %u connections in their handshake, the most it holds: "
			 "closing new ones (%s the latest)",
			 transport == TE_AUTH_TCP ? "data port" : "shm socket",
			 TE_MAX_HANDSHAKES, who);
	return false;
}

void te__hs_bound_leave(struct te_hs_bound *b, bool *counted)
{
	if (*counted)
		atomic_fetch_sub(&b->n, 1);
	*counted = false;
}

int te__seg_key(const struct te_engine *e, const char *name, char *buf, size_t len)
{
	int n = snprintf(buf, len, "/mooncake/%s/segments/%s", e->cluster_id,
			 name ? name : "");
	return n < (int)len ? n : (int)len - 1;
}

/* ------------------------------------------------------------ loop hand-off */

static void run_loop_jobs(struct te_engine *e)
{
	for (;;) {
		pthread_mutex_lock(&e->loop_mu);
		struct te_job *j = e->loop_head;
		if (j) {
			e->loop_head = j->next;
			if (!e->loop_head)
				e->loop_tail = &e->loop_head;
			j->queued = false;
		}
		pthread_mutex_unlock(&e->loop_mu);
		if (!j)
			return;
		j->fn(j);
	}
}

static void on_async(uv_async_t *a)
{
	run_loop_jobs(a->data);
}

bool te__loop_post(struct te_engine *e, struct te_job *j)
{
	bool wake = false, queued = false;
	pthread_mutex_lock(&e->loop_mu);
	if (!j->queued) {
		j->queued = true;
		j->next = NULL;
		*e->loop_tail = j;
		e->loop_tail = &j->next;
		wake = e->async_open;
		queued = true;
	}
	pthread_mutex_unlock(&e->loop_mu);
	if (wake)
		uv_async_send(e->async);
	return queued;
}

/* ------------------------------------------------------------ setup thread */

static void *setup_main(void *arg)
{
	struct te_engine *e = arg;
	pthread_setname_np(pthread_self(), "te-setup");
	pthread_mutex_lock(&e->setup_mu);
	for (;;) {
		while (!e->setup_stop && !e->setup_head)
			pthread_cond_wait(&e->setup_cv, &e->setup_mu);
		if (e->setup_stop)
			break;
		struct te_job *j = e->setup_head;
		e->setup_head = j->next;
		if (!e->setup_head)
			e->setup_tail = &e->setup_head;
		j->queued = false;
		pthread_mutex_unlock(&e->setup_mu);
		j->fn(j);
		pthread_mutex_lock(&e->setup_mu);
	}
	pthread_mutex_unlock(&e->setup_mu);
	return NULL;
}

bool te__setup_post(struct te_engine *e, struct te_job *j)
{
	bool queued = false;
	pthread_mutex_lock(&e->setup_mu);
	/* Once te_free stopped the thread and ran what was left, nothing
	 * would run a job queued now (nor drop what it holds). */
	if (!j->queued && !e->setup_stop) {
		j->queued = true;
		j->next = NULL;
		*e->setup_tail = j;
		e->setup_tail = &j->next;
		pthread_cond_signal(&e->setup_cv);
		queued = true;
	}
	pthread_mutex_unlock(&e->setup_mu);
	return queued;
}

/* ------------------------------------------------------------ descriptor */

int te__desc_build(struct te_engine *e, struct te_desc **out)
{
	struct te_desc *d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	snprintf(d->name, sizeof(d->name), "%s", e->name);
	snprintf(d->host, sizeof(d->host), "%s", e->host);
	snprintf(d->host_id, sizeof(d->host_id), "%s", e->host_id);
	d->rpc_port = e->rpc_port;
	d->incarnation = e->incarnation;
	d->generation = atomic_load(&e->generation);
	d->auth = e->secret_len > 0;
	int rc = te__rtable_describe(&e->regions, d);
	if (rc) {
		te__desc_free(d);
		return rc;
	}
	for (int p = 0; p < 4; p++) {
		if (e->xp[p] && e->xops[p]->describe) {
			e->xops[p]->describe(e->xp[p], d);
			d->transports |= 1u << p;
		}
	}
	*out = d;
	return 0;
}

static void on_desc_job(struct te_job *j)
{
	struct te_engine *e = MC_CONTAINER_OF(j, struct te_engine, desc_job);
	if (!e->stopped)
		te__pub_kick(e);
}

void te__desc_changed(struct te_engine *e)
{
	atomic_fetch_add(&e->generation, 1);
	te__loop_post(e, &e->desc_job);
}

/* ------------------------------------------------------------ regions */

/* Close the descriptors a region owns. */
static void region_close_fds(struct te_region *r)
{
	if (r->memfd >= 0)
		close(r->memfd);
	if (r->pidfd >= 0)
		close(r->pidfd);
	if (r->dmabuf >= 0)
		close(r->dmabuf);
}

/* Add a region like spec (addr, len, local, pid, memfd_off, dmabuf_off
 * taken as they are; its memfd, pidfd and dmabuf, when >= 0, dup'd):
 * this process's memory at local, process pid's memory, or a dma-buf. */
static int region_add(struct te_engine *e, const struct te_region *spec,
		      struct te_region **out)
{
	int rc;
	if (!e || spec->len == 0 || spec->addr + (spec->len - 1) < spec->addr ||
	    (uintptr_t)spec->local + (spec->len - 1) < (uintptr_t)spec->local)
		return -EINVAL;
	struct te_region *r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	*r = *spec;
	r->e = e;
	r->memfd = r->pidfd = r->dmabuf = -1;
	const int *fds[3] = {&spec->memfd, &spec->pidfd, &spec->dmabuf};
	int *dups[3] = {&r->memfd, &r->pidfd, &r->dmabuf};
	for (int i = 0; i < 3; i++) {
		if (*fds[i] >= 0 && (*dups[i] = fcntl(*fds[i], F_DUPFD_CLOEXEC, 3)) < 0) {
			rc = -errno;
			goto fail_fd;
		}
	}
	rc = te__rtable_add(&e->regions, r);
	if (rc)
		goto fail_fd;
	int p;
	for (p = 0; p < 4; p++) {
		if (e->xp[p] && e->xops[p]->region_add) {
			rc = e->xops[p]->region_add(e->xp[p], r);
			if (rc)
				goto fail_xp;
		}
	}
	metric_add(e->m_regions, 1);
	metric_add(e->m_reg_bytes, r->len);
	log_debug("registered region 0x%llx+%llu (%s)", (unsigned long long)r->addr,
		  (unsigned long long)r->len,
		  r->pid           ? "another process's"
		  : r->dmabuf >= 0 ? "dma-buf"
		  : r->memfd >= 0  ? "memfd"
				   : "private");
	te__desc_changed(e);
	*out = r;
	return 0;

fail_xp:
	while (p-- > 0)
		if (e->xp[p] && e->xops[p]->region_del)
			e->xops[p]->region_del(e->xp[p], r);
	te__rtable_del(&e->regions, r);
fail_fd:
	region_close_fds(r);
	free(r);
	return rc;
}

int te_register(struct te_engine *e, uint64_t remote_addr, void *local, size_t len, int memfd,
		uint64_t memfd_off, struct te_region **out)
{
	if (!local)
		return -EINVAL;
	struct te_region spec = {.addr = remote_addr,
				 .len = len,
				 .local = local,
				 .memfd = memfd,
				 .memfd_off = memfd_off,
				 .pidfd = -1,
				 .dmabuf = -1};
	return region_add(e, &spec, out);
}

int te_register_process(struct te_engine *e, uint64_t addr, size_t len, pid_t pid, int pidfd,
			struct te_region **out)
{
	if (pid <= 0 || pidfd < 0)
		return -EINVAL;
	struct te_region spec = {.addr = addr,
				 .len = len,
				 .memfd = -1,
				 .pid = pid,
				 .pidfd = pidfd,
				 .dmabuf = -1};
	return region_add(e, &spec, out);
}

int te_register_dmabuf(struct te_engine *e, uint64_t addr, size_t len, int fd, uint64_t offset,
		       struct te_region **out)
{
	if (fd < 0)
		return -EINVAL;
	if (!e || !e->xp[TE_PROTO_RDMA])
		return -EOPNOTSUPP;
	struct te_region spec = {.addr = addr,
				 .len = len,
				 .memfd = -1,
				 .pidfd = -1,
				 .dmabuf = fd,
				 .dmabuf_off = offset};
	return region_add(e, &spec, out);
}

void te_unregister(struct te_region *r)
{
	if (!r)
		return;
	struct te_engine *e = r->e;
	te__rtable_del(&e->regions, r);
	for (int p = 3; p >= 0; p--)
		if (e->xp[p] && e->xops[p]->region_del)
			e->xops[p]->region_del(e->xp[p], r);
	metric_sub(e->m_regions, 1);
	metric_sub(e->m_reg_bytes, r->len);
	te__desc_changed(e);
	region_close_fds(r);
	free(r);
}

/* ------------------------------------------------------------ create */

static void read_host_id(struct te_engine *e)
{
	FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
	e->host_id[0] = '\0';
	if (f) {
		if (fgets(e->host_id, sizeof(e->host_id), f))
			e->host_id[strcspn(e->host_id, "\r\n")] = '\0';
		fclose(f);
	}
	if (!e->host_id[0])
		log_warn("cannot read the kernel boot id: shm is off for this "
			 "engine");
}

static void register_metrics(struct te_engine *e, struct metrics_registry *r)
{
	static const char *const ops[2] = {"read", "write"};
	static const int protos[] = {TE_PROTO_TCP, TE_PROTO_RDMA, TE_PROTO_SHM};
	for (size_t i = 0; i < MC_ARRAY_LEN(protos); i++) {
		int p = protos[i];
		const char *pn = proto_names[p];
		for (int o = 0; o < 2; o++) {
			e->m_bytes[p][o] = metrics_counter(
				r, "mooncake_te_bytes_total",
				"Bytes moved by transfer requests this engine initiated.",
				"transport,op", (const char *[]){pn, ops[o]});
			if (p == TE_PROTO_RDMA)
				continue; /* one-sided: the serving side sees nothing */
			e->m_served[p][o] = metrics_counter(
				r, "mooncake_te_served_bytes_total",
				"Bytes read or written in local regions by peers' "
				"requests served here.",
				"transport,op", (const char *[]){pn, ops[o]});
		}
		e->m_failed[p] = metrics_counter(
			r, "mooncake_te_failed_requests_total",
			"Transfer requests this engine initiated that failed.", "transport",
			(const char *[]){pn});
	}
	e->m_retries = metrics_counter(r, "mooncake_te_slice_retries_total",
				       "Slices resubmitted on another path after "
				       "theirs failed.",
				       NULL, NULL);
	e->m_shm_inline = metrics_counter(r, "mooncake_te_shm_inline_bytes_total",
					  "Bytes of requests to same-host peers copied by "
					  "the submitting thread rather than a data "
					  "thread (small slices, te_submit_inline).",
					  NULL, NULL);
	e->m_refused = metrics_counter(r, "mooncake_te_refused_requests_total",
				       "Peers' requests refused because the range "
				       "is not inside one registered region.",
				       NULL, NULL);
	static const char *const auth_where[TE_AUTH_N] = {"tcp", "shm", "grpc"};
	for (int w = 0; w < TE_AUTH_N; w++) {
		const char *label[] = {auth_where[w]};
		e->m_auth_refused[w] = metrics_counter(
			r, "mooncake_te_auth_refused_total",
			"Peers refused for lacking the cluster secret: handshakes "
			"on the data port (tcp, which also carries rdma's control) "
			"and the shm socket, proofs of GetDescriptor (grpc).",
			"transport", label);
		if (w < TE_AUTH_GRPC) /* (listeners with a handshake bound) */
			e->m_hs_refused[w] = metrics_counter(
				r, "mooncake_te_connections_refused_total",
				"Connections to the data port (tcp) or the shm socket "
				"closed as soon as accepted: as many others were still "
				"in their handshake as it holds (256).",
				"transport", label);
	}
	e->m_regions = metrics_gauge(r, "mooncake_te_regions", "Registered memory regions.",
				     NULL, NULL);
	e->m_reg_bytes = metrics_gauge(r, "mooncake_te_registered_bytes",
				       "Bytes of registered memory.", NULL, NULL);
	e->m_segments = metrics_gauge(r, "mooncake_te_segments_open",
				      "Peer segments in the open-segment cache.", NULL, NULL);
	for (size_t i = 0; i < MC_ARRAY_LEN(protos); i++)
		e->m_peers[protos[i]] = metrics_gauge(
			r, "mooncake_te_peers",
			"Transport peer objects (one segment's connections over one "
			"transport) not freed yet: connected ones and replaced ones "
			"still being torn down.",
			"transport", (const char *[]){proto_names[protos[i]]});
}

static int check_opts(const struct te_opts *o, struct sockaddr_storage *ss)
{
	if (!o || !o->loop || !o->data_listen) {
		log_error("transfer engine: loop and data listen address required");
		return -EINVAL;
	}
	if (mc_parse_hostport(o->data_listen, ss) != 0) {
		log_error("transfer engine: data listen address '%s' is not a "
			  "numeric host:port",
			  o->data_listen);
		return -EINVAL;
	}
	if (o->meta && (!o->cluster_id || !*o->cluster_id || strchr(o->cluster_id, '/') ||
			strlen(o->cluster_id) >= 128 || !o->segment_name)) {
		log_error("transfer engine: a segment name and a cluster id "
			  "without '/' are required with meta");
		return -EINVAL;
	}
	if (o->segment_name && (!*o->segment_name || strlen(o->segment_name) > TE_NAME_MAX)) {
		log_error("transfer engine: segment name must be 1..%d bytes", TE_NAME_MAX);
		return -EINVAL;
	}
	if (o->slice_bytes &&
	    (o->slice_bytes < TE_SLICE_MIN || o->slice_bytes > TE_SLICE_MAX)) {
		log_error("transfer engine: slice size %zu outside 64K..64M", o->slice_bytes);
		return -EINVAL;
	}
	if (o->tcp_conns > TE_MAX_PATHS || o->threads > 1024) {
		log_error("transfer engine: at most %d connections per peer and "
			  "1024 threads",
			  TE_MAX_PATHS);
		return -EINVAL;
	}
	if (o->cluster_secret &&
	    (o->cluster_secret_len == 0 || o->cluster_secret_len > MC_SECRET_MAX_BYTES)) {
		log_error("transfer engine: a cluster secret must be 1..%d bytes",
			  MC_SECRET_MAX_BYTES);
		return -EINVAL;
	}
	if (!o->cluster_secret == !o->insecure) {
		log_error("transfer engine: %s",
			  o->insecure ? "a cluster secret and insecure contradict each other"
				      : "no cluster secret: peers must be authenticated "
					"unless insecure is set");
		return -EINVAL;
	}
	return 0;
}

static void engine_destroy(struct te_engine *e);

int te_new(const struct te_opts *o, struct te_engine **out)
{
	struct sockaddr_storage ss;
	int rc = check_opts(o, &ss);
	if (rc)
		return rc;
	char host[80];
	mc_format_addr((struct sockaddr *)&ss, host, sizeof(host));
	*strrchr(host, ':') = '\0';
	if (strcmp(host, "0.0.0.0") == 0 || strcmp(host, "[::]") == 0) {
		log_error("transfer engine: the data listener's host is advertised "
			  "to peers; bind it to a specific address, not %s",
			  host);
		return -EINVAL;
	}
	if (o->rdma_devices && strlen(o->rdma_devices) >= TE_RDMA_DEVICES_BYTES) {
		log_error("transfer engine: --rdma-devices is too long");
		return -EINVAL;
	}
	if (o->rdma_gid_index < -1 || o->rdma_gid_index > 255) {
		log_error("transfer engine: RDMA GID index %d not in 0..255",
			  o->rdma_gid_index);
		return -EINVAL;
	}
	if (o->rdma_mtu_bytes && (o->rdma_mtu_bytes < 256 || o->rdma_mtu_bytes > 4096 ||
				  (o->rdma_mtu_bytes & (o->rdma_mtu_bytes - 1)))) {
		log_error("transfer engine: RDMA MTU %u is not 256, 512, 1024, 2048 or 4096",
			  o->rdma_mtu_bytes);
		return -EINVAL;
	}

	struct te_engine *e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	e->loop = o->loop;
	e->loop_tid = pthread_self();
	e->meta = o->meta;
	e->rpc = o->rpc;
	e->rpc_port = o->rpc_port;
	e->proto = o->protocol;
	e->remote_proto = TE_PROTO_TCP;
	e->tcp_conns = o->tcp_conns ? o->tcp_conns : 4;
	e->slice_bytes = o->slice_bytes ? o->slice_bytes : TE_SLICE_DEFAULT;
	e->io_timeout_ms = o->io_timeout_ms ? o->io_timeout_ms : 10000;
	e->lease_ttl_s = o->lease_ttl_s ? o->lease_ttl_s : 10;
	snprintf(e->cluster_id, sizeof(e->cluster_id), "%s",
		 o->cluster_id ? o->cluster_id : "mooncake");
	const char *h = host[0] == '[' ? host + 1 : host;
	size_t hl = strcspn(h, "]");
	if (hl >= sizeof(e->host))
		hl = sizeof(e->host) - 1;
	memcpy(e->host, h, hl);
	e->host[hl] = '\0';
	snprintf(e->data_listen, sizeof(e->data_listen), "%s", o->data_listen);
	snprintf(e->rdma_devices, sizeof(e->rdma_devices), "%s",
		 o->rdma_devices ? o->rdma_devices : "");
	e->rdma_gid_index = o->rdma_gid_index;
	e->rdma_mtu_bytes = o->rdma_mtu_bytes;
	if (o->segment_name)
		snprintf(e->name, sizeof(e->name), "%s", o->segment_name);
	else
		snprintf(e->name, sizeof(e->name), "%s:%u", e->host, e->rpc_port);
	if (o->cluster_secret) {
		memcpy(e->secret, o->cluster_secret, o->cluster_secret_len);
		e->secret_len = o->cluster_secret_len;
	}
	read_host_id(e);
	if (mc_random(&e->incarnation, sizeof(e->incarnation)) != 0)
		e->incarnation = mc_now_ns() ^ ((uint64_t)getpid() << 32);
	atomic_init(&e->generation, 1);
	pthread_mutex_init(&e->mu, NULL);
	pthread_mutex_init(&e->setup_mu, NULL);
	pthread_cond_init(&e->setup_cv, NULL);
	pthread_mutex_init(&e->loop_mu, NULL);
	pthread_mutex_init(&e->pub_mu, NULL);
	pthread_cond_init(&e->pub_cv, NULL);
	e->setup_tail = &e->setup_head;
	e->loop_tail = &e->loop_head;
	e->desc_job.fn = on_desc_job;
	e->metrics = o->metrics ? o->metrics : metrics_global();
	register_metrics(e, e->metrics);

	rc = te__rtable_init(&e->regions);
	if (rc)
		goto fail;
	long cores = sysconf(_SC_NPROCESSORS_ONLN);
	unsigned n = o->threads ? o->threads : (cores > 0 ? (unsigned)cores : 1);
	rc = te__workers_start(e, n);
	if (rc) {
		log_error("transfer engine: cannot start %u data threads: %s", n,
			  mc_strerror(rc));
		goto fail;
	}
	rc = xport_start(e, TE_PROTO_TCP);
	if (rc)
		goto fail;
	if (e->proto == TE_PROTO_AUTO || e->proto == TE_PROTO_RDMA) {
		/* It logs what it uses, or why nothing is usable. */
		rc = xport_start(e, TE_PROTO_RDMA);
		if (rc == 0)
			e->remote_proto = TE_PROTO_RDMA;
		else if (e->proto == TE_PROTO_RDMA)
			goto fail;
		rc = 0;
	}
	if (e->host_id[0]) {
		int src = xport_start(e, TE_PROTO_SHM);
		if (src)
			log_warn("shm transport unavailable: %s", mc_strerror(src));
	}
	rc = -pthread_create(&e->setup_tid, NULL, setup_main, e);
	if (rc)
		goto fail;
	e->setup_started = true;

	e->async = calloc(1, sizeof(*e->async));
	if (!e->async) {
		rc = -ENOMEM;
		goto fail;
	}
	uv_async_init(e->loop, e->async, on_async);
	e->async->data = e;
	e->async_open = true;
	if (e->rpc) {
		rc = te__svc_start(e);
		if (rc)
			goto fail;
	}
	rc = te__pub_start(e);
	if (rc)
		goto fail; /* only -ENOMEM; the service was never called */

	atomic_store(&e->ready, true);
	log_info("transfer engine: segment %s, data %s:%u, %u threads, %u "
		 "connections per peer, %zu KiB slices, protocol %s (remote peers: "
		 "%s), %s",
		 e->name, e->host, te__tcp_port(e->xp[TE_PROTO_TCP]), e->nworkers,
		 e->tcp_conns, e->slice_bytes >> 10, te_protocol_name(e->proto),
		 te_protocol_name(e->remote_proto),
		 e->secret_len ? "peers authenticated with the cluster secret"
			       : "INSECURE: peers are not authenticated");
	*out = e;
	return 0;
fail:
	engine_destroy(e);
	return rc;
}

/* ------------------------------------------------------------ stop and free */

static void on_async_closed(uv_handle_t *h)
{
	free(h);
}

static void on_pub_stopped(struct te_engine *e, void *ud)
{
	(void)ud;
	run_loop_jobs(e);
	pthread_mutex_lock(&e->loop_mu);
	e->async_open = false;
	pthread_mutex_unlock(&e->loop_mu);
	uv_close((uv_handle_t *)e->async, on_async_closed);
	e->async = NULL;
	void (*cb)(struct te_engine *, void *) = e->pub.on_stopped;
	void *cb_ud = e->pub.stop_ud;
	if (cb)
		cb(e, cb_ud);
}

void te_stop(struct te_engine *e, void (*on_stopped)(struct te_engine *e, void *ud), void *ud)
{
	pthread_mutex_lock(&e->mu);
	e->stopped = true;
	pthread_mutex_unlock(&e->mu);
	e->pub.on_stopped = on_stopped;
	e->pub.stop_ud = ud;
	te__pub_stop(e, on_pub_stopped, NULL);
}

static void engine_destroy(struct te_engine *e)
{
	e->stopped = true;
	atomic_store(&e->ready, false);
	if (e->setup_started) {
		pthread_mutex_lock(&e->setup_mu);
		e->setup_stop = true;
		pthread_cond_signal(&e->setup_cv);
		pthread_mutex_unlock(&e->setup_mu);
		pthread_join(e->setup_tid, NULL);
		/* Jobs left behind see e->stopped and only finish up. */
		for (struct te_job *j; (j = e->setup_head);) {
			e->setup_head = j->next;
			j->queued = false;
			j->fn(j);
		}
	}
	if (e->async) {
		/* te_new failed after creating it: the loop frees it. */
		uv_close((uv_handle_t *)e->async, on_async_closed);
		e->async = NULL;
	}
	e->async_open = false;
	run_loop_jobs(e);
	/* The etcd client outlives the engine: nothing of its may call back. */
	if (e->meta)
		te__pub_drop(e);
	/* Peers are disconnected by tasks on the workers, which run what is
	 * queued before they exit; then nothing runs and the transports close
	 * their listeners and served connections. */
	te__segments_free_all(e);
	if (e->workers)
		te__workers_stop(e);
	for (int p = 0; p < 4; p++) {
		if (e->xp[p])
			e->xops[p]->fini(e->xp[p]);
		e->xp[p] = NULL;
	}
	/* Regions left registered. */
	for (size_t i = 0; i < e->regions.n; i++) {
		struct te_region *r = e->regions.v[i];
		region_close_fds(r);
		free(r);
	}
	te__rtable_destroy(&e->regions);
	pthread_mutex_destroy(&e->mu);
	pthread_mutex_destroy(&e->setup_mu);
	pthread_cond_destroy(&e->setup_cv);
	pthread_mutex_destroy(&e->loop_mu);
	pthread_mutex_destroy(&e->pub_mu);
	pthread_cond_destroy(&e->pub_cv);
	memset(e->secret, 0, sizeof(e->secret));
	free(e);
}

void te_free(struct te_engine *e)
{
	if (e)
		engine_destroy(e);
}

int te_wait_published(struct te_engine *e, uint64_t timeout_ms)
{
	struct timespec dl;
	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += (time_t)(timeout_ms / 1000);
	dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (dl.tv_nsec >= 1000000000L) {
		dl.tv_sec++;
		dl.tv_nsec -= 1000000000L;
	}
	int rc = 0;
	pthread_mutex_lock(&e->pub_mu);
	while (!e->pub_ok && rc == 0) {
		if (timeout_ms == 0)
			pthread_cond_wait(&e->pub_cv, &e->pub_mu);
		else if (pthread_cond_timedwait(&e->pub_cv, &e->pub_mu, &dl) == ETIMEDOUT)
			rc = e->pub_ok ? 0 : (e->pub_err ? e->pub_err : MC_ETIMEDOUT);
	}
	pthread_mutex_unlock(&e->pub_mu);
	return rc;
}
