/*
 * ctl_bench_transfer: `mooncakectl bench transfer`, in the spirit of
 * Mooncake's transfer_engine_bench: --threads initiator threads each keep
 * --inflight batches of --batch-size requests of --block-size bytes
 * submitted against a target segment, for --duration (a thread submits
 * its next batch as soon as its oldest completes, as a user that wants
 * bandwidth does with several batch ids, or several threads). It prints
 *
 *   - GB/s and the batch latency (p50/p99) of that load, and the CPU
 *     seconds per GB it cost (both processes: this one and the forked
 *     target, from /proc in clock ticks; this process only with
 *     --target),
 *   - the same with one batch in flight per thread (a closed loop: each
 *     batch starts only once the last completed, so every batch pays the
 *     round trip and the wake-ups of its completion),
 *   - request latency p50/p99 with one request in flight,
 *   - the request rate of 4 KiB requests,
 *
 * and beside the bandwidth the limit of this machine measured in the same
 * run: memcpy with 1 and --threads threads for shm; for tcp, a plain TCP
 * stream between the same two processes over --te-tcp-conns connections
 * (one thread per connection on each side, 1 MiB send/recv calls cycling
 * through as much memory on each side as the engine's requests touch).
 * For rdma the same stream is printed as this machine's loopback limit:
 * on the verbs-emu test device (a test build) the bytes move through Unix
 * sockets, and the output says that the figures are an emulator's, not a
 * NIC's; on a real NIC the line rate is the limit, which is not measured
 * here. The stream's CPU seconds per GB are printed beside the engine's:
 * on a shared host the GB/s of both swing with other load, the CPU per
 * byte much less. Each round's clock starts once every thread of it has its memory
 * allocated and touched (and, for the stream, its connection open). The
 * bandwidth (both loads) and its limit are measured in 3 alternating rounds
 * and the best of each is printed, so other load on the machine weighs on all
 * alike; the engine gets as many data threads (--te-threads, unless
 * given) as the limit uses: --threads for shm, one per connection for tcp.
 *
 * Without --target the target is a child process forked at start (before
 * any thread exists): a transfer engine with a memfd buffer, serving in
 * P2P mode (or published to --meta-endpoints), plus the plain TCP stream
 * server; the two engines prove a secret made for the run. Figures are
 * measurements, never pass/fail.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/cfg.h"
#include "common/log.h"
#include "common/util.h"
#include "ctl/ctl_int.h"
#include "ctl/ctl_te.h"

/* Defined only when linked with test/verbs-emu (a test build). */
extern const char verbs_emu_test_device[] __attribute__((weak));

#define SMALL_BLOCK 4096
#define STREAM_CHUNK ((size_t)1 << 20)
#define ROUNDS 3

struct bench {
	struct ctl_te_opts te;
	struct ctl_te *h; /* the initiator's engine */
	enum te_protocol proto;
	bool write;
	uint64_t block, batch, threads, inflight, duration_ms;
	const char *target;
	unsigned conns;
	size_t region_bytes;
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: mooncakectl bench transfer [--protocol=tcp|shm|rdma] "
		"[--op=write|read]\n"
		"         [--block-size=1M] [--batch-size=32] [--threads=2] "
		"[--inflight=2]\n"
		"         [--duration=3s] [--target=SEGMENT] [engine flags]\n\n"
		"  --protocol=P        tcp (also on this host), shm, or rdma (also on "
		"this\n"
		"                      host; local buffers registered) (default tcp)\n"
		"  --op=OP             write or read (default write)\n"
		"  --block-size=SIZE   bytes per request (default 1M)\n"
		"  --batch-size=N      requests per batch (default 32)\n"
		"  --threads=N         initiator threads (default 2; also the "
		"default\n"
		"                      --te-threads)\n"
		"  --inflight=N        batches each thread keeps submitted: the next "
		"one is\n"
		"                      submitted when the oldest completes (default 2); "
		"the\n"
		"                      closed loop (1) is printed too\n"
		"  --duration=DURATION how long the bandwidth is measured (default "
		"3s)\n"
		"  --target=SEGMENT    an existing segment (a `mooncakectl transfer "
		"--serve`;\n"
		"                      by name with --meta-endpoints, else its "
		"host:port);\n"
		"                      default: a target process forked here, "
		"which also\n"
		"                      runs the plain TCP stream the tcp figure is "
		"compared to\n"
		"  --overwrite-target  with --target and --op=write: yes, overwrite its\n"
		"                      memory (refused without: never an agent's "
		"segment)\n\n"
		"engine flags (without --meta-endpoints the target is reached in "
		"P2P mode;\nwithout --target the two engines share a secret made "
		"for the run, and the\ncluster secret flags matter only with "
		"--target):\n%s",
		ctl_te_flags_help);
}

/* ------------------------------------------------------------ the target child */

/*
 * One connection of the plain stream, target side. The client says which
 * way the bytes go ('w': it writes, 'r': it reads) and the size of the
 * working set to cycle through in 1 MiB calls — the same memory the
 * engine touches on this side, so both figures pay the same memory
 * traffic, not one of them from a cache-resident buffer.
 */
static void *stream_conn(void *arg)
{
	int fd = (int)(intptr_t)arg;
	pthread_setname_np(pthread_self(), "stream-server");
	uint8_t hello[9];
	uint8_t *buf = NULL;
	uint64_t ws = 0;
	if (recv(fd, hello, sizeof(hello), MSG_WAITALL) != (ssize_t)sizeof(hello))
		goto out;
	memcpy(&ws, hello + 1, sizeof(ws));
	if (ws < STREAM_CHUNK || ws > (16ull << 30) || !(buf = malloc(ws)))
		goto out;
	memset(buf, 0x5a, ws);
	/* Ready: the client starts its clock after this byte. */
	if (send(fd, "k", 1, MSG_NOSIGNAL) != 1)
		goto out;
	size_t off = 0;
	if (hello[0] == 'w') { /* the client writes: count, then confirm */
		uint64_t total = 0;
		for (;;) {
			ssize_t n = recv(fd, buf + off, STREAM_CHUNK, 0);
			if (n <= 0)
				break;
			total += (uint64_t)n;
			off = (off + STREAM_CHUNK) % (ws - ws % STREAM_CHUNK);
		}
		(void)!send(fd, &total, sizeof(total), MSG_NOSIGNAL);
	} else { /* the client reads until it closes */
		while (send(fd, buf + off, STREAM_CHUNK, MSG_NOSIGNAL) > 0)
			off = (off + STREAM_CHUNK) % (ws - ws % STREAM_CHUNK);
	}
out:
	free(buf);
	close(fd);
	return NULL;
}

static void *stream_accept(void *arg)
{
	int lfd = (int)(intptr_t)arg;
	for (;;) {
		int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			return NULL; /* the listener was shut down */
		}
		int one = 1;
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		pthread_t t;
		if (pthread_create(&t, NULL, stream_conn, (void *)(intptr_t)fd) == 0)
			pthread_detach(t);
		else
			close(fd);
	}
}

static int listen_any(uint16_t *port)
{
	struct sockaddr_in sa = {.sin_family = AF_INET,
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t sl = sizeof(sa);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) || listen(fd, 64) ||
	    getsockname(fd, (struct sockaddr *)&sa, &sl)) {
		close(fd);
		return -1;
	}
	*port = ntohs(sa.sin_port);
	return fd;
}

/* Runs in the forked child: serve until the parent closes ctl. */
static int child_main(const struct bench *b, int ctl, int ready)
{
	struct ctl_te h;
	struct ctl_buf buf;
	char err[1024];
	struct ctl_te_opts o = b->te;
	char name[64];
	if (o.meta && *o.meta) {
		snprintf(name, sizeof(name), "bench-target-%d", (int)getpid());
		o.segment = name;
	}
	o.protocol = "auto";
	if (ctl_te_start(&h, &o, err, sizeof(err)) != 0) {
		fprintf(stderr, "bench target: %s\n", err);
		return 1;
	}
	int rc = ctl_buf_new(&h, b->region_bytes, &buf);
	if (rc == 0)
		rc = te_wait_published(h.te, 30000);
	uint16_t port = 0;
	int lfd = rc ? -1 : listen_any(&port);
	pthread_t acc;
	if (lfd >= 0 && pthread_create(&acc, NULL, stream_accept, (void *)(intptr_t)lfd)) {
		close(lfd);
		lfd = -1;
	}
	if (lfd < 0) {
		fprintf(stderr, "bench target: cannot start: %s\n",
			rc ? mc_strerror(rc) : "no listener");
		ctl_te_stop(&h);
		return 1;
	}
	dprintf(ready, "%s %u\n", h.name, port);
	close(ready);
	char c;
	while (read(ctl, &c, 1) > 0)
		;
	shutdown(lfd, SHUT_RDWR);
	pthread_join(acc, NULL);
	close(lfd);
	ctl_buf_free(&buf);
	ctl_te_stop(&h);
	return 0;
}

/* ------------------------------------------------------------ CPU time */

/* The forked target, whose CPU time counts beside this process's. */
static pid_t cpu_child = -1;

/* User + system CPU seconds of process pid so far (all its threads), or 0
 * when /proc cannot say. */
static double proc_cpu_s(pid_t pid)
{
	char path[64], line[1024];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	FILE *f = fopen(path, "re");
	if (!f)
		return 0;
	size_t n = fread(line, 1, sizeof(line) - 1, f);
	fclose(f);
	line[n] = 0;
	/* After the command's closing parenthesis: state is field 3, utime
	 * and stime are fields 14 and 15. */
	const char *p = strrchr(line, ')');
	unsigned long long ut = 0, st = 0;
	if (!p || sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut,
			 &st) != 2)
		return 0;
	return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* CPU seconds of both processes of the run (this one and the target). */
static double run_cpu_s(void)
{
	return proc_cpu_s(getpid()) + (cpu_child > 0 ? proc_cpu_s(cpu_child) : 0);
}

/* ------------------------------------------------------------ start gate */

/*
 * The threads of a measurement allocate and touch their memory (and the
 * stream's connect) before the clock starts: each arrives at the gate,
 * and the main thread opens it once every started thread has arrived.
 */
struct gate {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	unsigned arrived;
	bool open;
};

static void gate_init(struct gate *g)
{
	pthread_mutex_init(&g->mu, NULL);
	pthread_cond_init(&g->cv, NULL);
	g->arrived = 0;
	g->open = false;
}

static void gate_arrive(struct gate *g)
{
	pthread_mutex_lock(&g->mu);
	g->arrived++;
	pthread_cond_broadcast(&g->cv);
	while (!g->open)
		pthread_cond_wait(&g->cv, &g->mu);
	pthread_mutex_unlock(&g->mu);
}

/* Once n threads arrived: open, and return the start time in ns. */
static uint64_t gate_open(struct gate *g, unsigned n)
{
	pthread_mutex_lock(&g->mu);
	while (g->arrived < n)
		pthread_cond_wait(&g->cv, &g->mu);
	g->open = true;
	pthread_cond_broadcast(&g->cv);
	pthread_mutex_unlock(&g->mu);
	return mc_now_ns();
}

static void gate_destroy(struct gate *g)
{
	pthread_cond_destroy(&g->cv);
	pthread_mutex_destroy(&g->mu);
}

/* ------------------------------------------------------------ engine load */

struct load {
	struct bench *b;
	struct te_engine *e;
	struct te_segment *seg;
	uint64_t remote; /* this thread's part of the region */
	size_t block, batch, inflight;
	uint64_t ms;
	struct gate *start;
	uint64_t bytes, reqs;
	uint64_t t_end_ns;
	int err;
	struct ctl_lat lat;
	pthread_t tid;
};

/* Wait for batch bt and free it; 0 or the first request's error. */
static int load_reap(struct te_batch *bt, struct te_result *res, size_t n)
{
	int rc = te_wait(bt, 60000);
	if (rc == 0) {
		(void)te_poll(bt, res);
		for (size_t i = 0; i < n && rc == 0; i++)
			if (res[i].status != TE_DONE)
				rc = res[i].err;
	}
	if (rc != MC_ETIMEDOUT) /* a batch still in flight is left alone */
		te_batch_free(bt);
	return rc;
}

/*
 * One thread of the load: inflight slots, each a batch of the same
 * requests (the thread's buffer and part of the remote region: the
 * bytes are not checked, and so every depth touches the memory the
 * closed loop and the stream touch — a larger working set slowed the
 * stream several-fold on the machine this was written on), submitted in
 * turn; the oldest is waited for, counted and submitted again while the
 * time lasts.
 */
static void *load_main(void *arg)
{
	struct load *l = arg;
	pthread_setname_np(pthread_self(), "bench-load");
	/* rdma moves bytes one-sided only from and to registered memory */
	struct ctl_buf reg = {.fd = -1};
	bool rdma = l->b->proto == TE_PROTO_RDMA;
	uint8_t *buf = NULL;
	size_t nreq = l->batch;
	if (rdma)
		l->err = ctl_buf_new(l->b->h, l->block * nreq, &reg);
	else if (!(buf = malloc(l->block * nreq)))
		l->err = -ENOMEM;
	if (rdma && !l->err)
		buf = reg.p;
	struct te_request *reqs = calloc(nreq, sizeof(*reqs));
	struct te_result *res = calloc(l->batch, sizeof(*res));
	struct te_batch **bt = calloc(l->inflight, sizeof(*bt));
	uint64_t *t0 = calloc(l->inflight, sizeof(*t0));
	if (!l->err && (!reqs || !res || !bt || !t0))
		l->err = -ENOMEM;
	if (!l->err)
		memset(buf, 0xa5, l->block * nreq);
	gate_arrive(l->start);
	if (l->err)
		goto out;
	uint64_t end_ms = mc_now_ms() + l->ms;
	for (size_t i = 0; i < nreq; i++)
		reqs[i] = (struct te_request){
			.op = l->b->write ? TE_WRITE : TE_READ,
			.local = buf + i * l->block,
			.segment = l->seg,
			.remote_addr = l->remote + i * l->block,
			.len = l->block,
		};
	size_t busy = 0; /* slots with a batch submitted; slot k is the oldest */
	for (size_t k = 0;; k = (k + 1) % l->inflight) {
		if (bt[k]) {
			int rc = load_reap(bt[k], res, l->batch);
			bt[k] = NULL;
			busy--;
			if (rc) {
				l->err = rc;
				break;
			}
			uint64_t t1 = mc_now_ns();
			ctl_lat_add(&l->lat, t1 - t0[k]);
			l->bytes += l->block * l->batch;
			l->reqs += l->batch;
			l->t_end_ns = t1;
		}
		if (mc_now_ms() < end_ms) {
			t0[k] = mc_now_ns();
			int rc = te_submit(l->e, reqs, l->batch, &bt[k]);
			if (rc) {
				bt[k] = NULL;
				l->err = rc;
				break;
			}
			busy++;
		} else if (busy == 0) {
			break;
		}
	}
	/* After an error: wait for what is still in flight. */
	for (size_t k = 0; k < l->inflight; k++)
		if (bt[k])
			(void)load_reap(bt[k], res, l->batch);
out:
	free(t0);
	free(bt);
	free(res);
	free(reqs);
	if (rdma)
		ctl_buf_free(&reg);
	else
		free(buf);
	return NULL;
}

struct figures {
	double gbps, reqs_per_s, p50_us, p99_us;
	double cpu_s_gb; /* CPU seconds of both processes per GB moved */
	int err;
};

static struct figures run_load(struct bench *b, struct te_engine *e, struct te_segment *seg,
			       uint64_t base, size_t block, size_t batch, size_t inflight,
			       unsigned threads, uint64_t ms)
{
	struct load *l = calloc(threads, sizeof(*l));
	struct figures f = {0};
	struct gate start;
	unsigned started = 0;
	if (!l) {
		f.err = -ENOMEM;
		return f;
	}
	gate_init(&start);
	for (unsigned t = 0; t < threads; t++) {
		l[t] = (struct load){.b = b,
				     .e = e,
				     .seg = seg,
				     .block = block,
				     .batch = batch,
				     .inflight = inflight,
				     .ms = ms,
				     .start = &start,
				     .remote = base + (uint64_t)t * block * batch};
		if (pthread_create(&l[t].tid, NULL, load_main, &l[t]))
			break;
		started++;
	}
	if (started < threads)
		f.err = -EAGAIN;
	uint64_t t0 = gate_open(&start, started);
	double cpu0 = run_cpu_s();
	uint64_t bytes = 0, reqs = 0, t_end = t0;
	struct ctl_lat all = {0};
	for (unsigned t = 0; t < started; t++) {
		pthread_join(l[t].tid, NULL);
		bytes += l[t].bytes;
		reqs += l[t].reqs;
		t_end = MC_MAX(t_end, l[t].t_end_ns);
		if (l[t].err && !f.err)
			f.err = l[t].err;
		for (size_t i = 0; i < l[t].lat.n; i++)
			ctl_lat_add(&all, l[t].lat.v[i]);
		ctl_lat_free(&l[t].lat);
	}
	double s = (double)(t_end - t0) / 1e9;
	if (bytes)
		f.cpu_s_gb = (run_cpu_s() - cpu0) / ((double)bytes / 1e9);
	if (s > 0) {
		f.gbps = (double)bytes / s / 1e9;
		f.reqs_per_s = (double)reqs / s;
	}
	f.p50_us = ctl_lat_pct_us(&all, 0.50);
	f.p99_us = ctl_lat_pct_us(&all, 0.99);
	ctl_lat_free(&all);
	gate_destroy(&start);
	free(l);
	return f;
}

/* ------------------------------------------------------------ limits */

struct cpy {
	uint8_t *src, *dst;
	size_t block, n;
	uint64_t ms, bytes, t_end_ns;
	struct gate *start;
	pthread_t tid;
};

static void *cpy_main(void *arg)
{
	struct cpy *c = arg;
	gate_arrive(c->start);
	uint64_t end_ms = mc_now_ms() + c->ms;
	while (mc_now_ms() < end_ms) {
		for (size_t i = 0; i < c->n; i++)
			memcpy(c->dst + i * c->block, c->src + i * c->block, c->block);
		c->bytes += c->block * c->n;
		c->t_end_ns = mc_now_ns();
	}
	return NULL;
}

/* memcpy of block-sized chunks over a batch-sized working set per thread. */
static double memcpy_gbps(size_t block, size_t batch, unsigned threads, uint64_t ms)
{
	struct cpy *c = calloc(threads, sizeof(*c));
	double gbps = 0;
	unsigned started = 0;
	struct gate start;
	if (!c)
		return 0;
	gate_init(&start);
	for (unsigned t = 0; t < threads; t++) {
		c[t].src = malloc(block * batch);
		c[t].dst = malloc(block * batch);
		if (!c[t].src || !c[t].dst)
			break;
		memset(c[t].src, 1, block * batch);
		memset(c[t].dst, 2, block * batch);
		c[t].block = block;
		c[t].n = batch;
		c[t].ms = ms;
		c[t].start = &start;
		if (pthread_create(&c[t].tid, NULL, cpy_main, &c[t]))
			break;
		started++;
	}
	uint64_t t0 = gate_open(&start, started), bytes = 0, t_end = t0;
	for (unsigned t = 0; t < started; t++) {
		pthread_join(c[t].tid, NULL);
		bytes += c[t].bytes;
		t_end = MC_MAX(t_end, c[t].t_end_ns);
	}
	for (unsigned t = 0; t < threads; t++) {
		free(c[t].src);
		free(c[t].dst);
	}
	if (started == threads && t_end > t0)
		gbps = (double)bytes / ((double)(t_end - t0) / 1e9) / 1e9;
	gate_destroy(&start);
	free(c);
	return gbps;
}

struct stream {
	uint16_t port;
	bool write;
	uint64_t ws; /* working set per connection and side */
	uint64_t ms, bytes, t_end_ns;
	struct gate *start;
	int err;
	pthread_t tid;
};

static void *stream_main(void *arg)
{
	struct stream *s = arg;
	pthread_setname_np(pthread_self(), "stream-client");
	struct sockaddr_in sa = {.sin_family = AF_INET,
				 .sin_port = htons(s->port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	uint8_t *buf = malloc(s->ws);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
	uint8_t hello[9] = {s->write ? 'w' : 'r'}, ready;
	memcpy(hello + 1, &s->ws, sizeof(s->ws));
	if (!buf || fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) ||
	    send(fd, hello, sizeof(hello), MSG_NOSIGNAL) != (ssize_t)sizeof(hello))
		s->err = errno ? -errno : -ENOMEM;
	if (!s->err) {
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		memset(buf, 0x3c, s->ws);
		if (recv(fd, &ready, 1, MSG_WAITALL) != 1)
			s->err = -EIO;
	}
	gate_arrive(s->start);
	if (s->err)
		goto out;
	uint64_t end_ms = mc_now_ms() + s->ms;
	size_t off = 0, wrap = s->ws - s->ws % STREAM_CHUNK;
	while (mc_now_ms() < end_ms) {
		ssize_t n = s->write ? send(fd, buf + off, STREAM_CHUNK, MSG_NOSIGNAL)
				     : recv(fd, buf + off, STREAM_CHUNK, 0);
		if (n <= 0) {
			s->err = -EIO;
			goto out;
		}
		off = (off + STREAM_CHUNK) % wrap;
		if (!s->write)
			s->bytes += (uint64_t)n;
	}
	if (s->write) { /* count what the other side confirms it received */
		uint64_t got = 0;
		shutdown(fd, SHUT_WR);
		if (recv(fd, &got, sizeof(got), MSG_WAITALL) != (ssize_t)sizeof(got))
			s->err = -EIO;
		s->bytes = got;
	}
	s->t_end_ns = mc_now_ns();
out:
	if (fd >= 0)
		close(fd);
	free(buf);
	return NULL;
}

/* GB/s of the plain stream; *cpu_s_gb is set to its CPU seconds per GB. */
static double stream_gbps(uint16_t port, bool write, unsigned conns, uint64_t ws, uint64_t ms,
			  double *cpu_s_gb)
{
	struct stream *s = calloc(conns, sizeof(*s));
	double gbps = 0;
	struct gate start;
	unsigned started = 0;
	*cpu_s_gb = 0;
	if (!s)
		return 0;
	gate_init(&start);
	for (unsigned i = 0; i < conns; i++) {
		s[i] = (struct stream){.port = port,
				       .write = write,
				       .ws = MC_MAX(ws, (uint64_t)STREAM_CHUNK),
				       .ms = ms,
				       .start = &start};
		if (pthread_create(&s[i].tid, NULL, stream_main, &s[i]))
			break;
		started++;
	}
	int err = started < conns ? -EAGAIN : 0;
	uint64_t t0 = gate_open(&start, started), bytes = 0, t_end = t0;
	double cpu0 = run_cpu_s();
	for (unsigned i = 0; i < started; i++) {
		pthread_join(s[i].tid, NULL);
		bytes += s[i].bytes;
		t_end = MC_MAX(t_end, s[i].t_end_ns);
		err = err ? err : s[i].err;
	}
	if (!err && t_end > t0)
		gbps = (double)bytes / ((double)(t_end - t0) / 1e9) / 1e9;
	*cpu_s_gb = bytes ? (run_cpu_s() - cpu0) / ((double)bytes / 1e9) : 0;
	gate_destroy(&start);
	free(s);
	return gbps;
}

/* ------------------------------------------------------------ main */

/* A limit and the engine's ratio to it; with closed > 0 (more than one
 * batch in flight) the closed loop's ratio too. */
static void print_ratio(const char *what, double limit, double got, double closed)
{
	if (limit > 0 && closed > 0)
		printf("  %-34s %8.2f GB/s   engine/limit %.2f (closed loop %.2f)\n", what,
		       limit, got / limit, closed / limit);
	else if (limit > 0)
		printf("  %-34s %8.2f GB/s   engine/limit %.2f\n", what, limit, got / limit);
	else
		printf("  %-34s      n/a\n", what);
}

static int parse_flags(struct bench *b, int argc, char **argv)
{
	const char *v, *proto, *op = "write", *block = "1M", *batch = "32", *threads = "2",
			       *inflight = "2", *dur = "3s";
	bool te_threads_set = false, overwrite = false, ok;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			usage(stdout);
			return -1;
		}
		const char *before = b->te.threads;
		if (ctl_te_flag(&b->te, argc, argv, &i)) {
			te_threads_set |= b->te.threads != before;
		} else if (ctl_flag_value(argc, argv, &i, "op", &v)) {
			op = v;
		} else if (ctl_flag_value(argc, argv, &i, "block-size", &v)) {
			block = v;
		} else if (ctl_flag_value(argc, argv, &i, "batch-size", &v)) {
			batch = v;
		} else if (ctl_flag_value(argc, argv, &i, "threads", &v)) {
			threads = v;
		} else if (ctl_flag_value(argc, argv, &i, "inflight", &v)) {
			inflight = v;
		} else if (ctl_flag_value(argc, argv, &i, "duration", &v)) {
			dur = v;
		} else if (ctl_flag_value(argc, argv, &i, "target", &v)) {
			b->target = v;
		} else if (ctl_flag_bool(argv[i], "overwrite-target", &overwrite, &ok)) {
			if (!ok) {
				fprintf(stderr, "mooncakectl bench transfer: "
						"--overwrite-target takes true or false\n");
				return 2;
			}
		} else {
			fprintf(stderr,
				"mooncakectl bench transfer: unknown argument "
				"\"%s\"\n",
				argv[i]);
			return 2;
		}
	}
	char *end;
	proto = b->te.protocol;
	if (!proto ||
	    (strcmp(proto, "tcp") && strcmp(proto, "shm") && strcmp(proto, "rdma")) ||
	    te_protocol_parse(proto, &b->proto) || !op ||
	    (strcmp(op, "write") && strcmp(op, "read")) || !block ||
	    cfg_parse_size(block, &b->block) || b->block == 0 || b->block > (256u << 20) ||
	    !batch || !*batch || (b->batch = strtoull(batch, &end, 10), *end) ||
	    b->batch == 0 || b->batch > 4096 || !threads || !*threads ||
	    (b->threads = strtoull(threads, &end, 10), *end) || b->threads == 0 ||
	    b->threads > 64 || !inflight || !*inflight ||
	    (b->inflight = strtoull(inflight, &end, 10), *end) || b->inflight == 0 ||
	    b->inflight > 64 || !dur || cfg_parse_duration_ms(dur, &b->duration_ms) ||
	    b->duration_ms == 0 || (b->target && !*b->target)) {
		fprintf(stderr, "mooncakectl bench transfer: bad flag value (see "
				"--help)\n");
		return 2;
	}
	b->write = strcmp(op, "write") == 0;
	/* Writes land on the target's first region from its start: an
	 * agent's segment there would lose its objects' bytes. */
	if (b->write && b->target && !overwrite) {
		fprintf(stderr,
			"mooncakectl bench transfer: --op=write overwrites the first %" PRIu64
			" bytes of %s's memory (an agent's segment would lose the bytes of the "
			"objects there): aim it at a `mooncakectl transfer --serve` segment and "
			"say --overwrite-target, or measure reads (--op=read)\n",
			b->threads * b->batch * MC_MAX(b->block, (uint64_t)SMALL_BLOCK),
			b->target);
		return 2;
	}
	b->conns = (unsigned)strtoul(b->te.tcp_conns, NULL, 10);
	if (!te_threads_set) {
		/* As many data threads as the limit it is compared with uses:
		 * the memcpy threads, or one per connection for the stream. */
		static char tbuf[16];
		uint64_t n = b->proto != TE_PROTO_SHM ? MC_MAX(b->threads, b->conns)
						      : b->threads;
		snprintf(tbuf, sizeof(tbuf), "%" PRIu64, n);
		b->te.threads = tbuf;
	}
	uint64_t need = b->threads * b->batch * MC_MAX(b->block, (uint64_t)SMALL_BLOCK);
	if (need > (16ull << 30)) {
		fprintf(stderr, "mooncakectl bench transfer: threads x batch x block "
				"is over 16G\n");
		return 2;
	}
	b->region_bytes = (size_t)need;
	return 0;
}

int ctl_bench_transfer_main(int argc, char **argv)
{
	struct bench b = {.te = CTL_TE_OPTS_INIT};
	b.te.protocol = "tcp";
	b.te.meta = ""; /* P2P unless --meta-endpoints is given */
	int rc = parse_flags(&b, argc, argv);
	if (rc)
		return rc < 0 ? CTL_EXIT_OK : CTL_EXIT_USAGE;

	/* Without --target both engines are this command's own: they share a
	 * secret made for the run (unless --insecure-transfer), and need
	 * none of the cluster's. */
	struct mc_secret own;
	memset(&own, 0, sizeof(own));
	if (!b.target && !b.te.insecure) {
		own.len = 32;
		if (mc_random(own.key, own.len) != 0) {
			fprintf(stderr, "mooncakectl bench transfer: no random bytes\n");
			return CTL_EXIT_FAIL;
		}
		snprintf(own.path, sizeof(own.path), "(made for this run)");
		b.te.secret = &own;
	}

	/* The target process, forked before this one starts any thread. */
	pid_t child = -1;
	int ctl_pipe[2] = {-1, -1}, ready_pipe[2] = {-1, -1};
	char target[300] = "";
	unsigned stream_port = 0;
	if (!b.target) {
		if (pipe2(ctl_pipe, O_CLOEXEC) || pipe2(ready_pipe, O_CLOEXEC)) {
			perror("mooncakectl bench transfer: pipe");
			return CTL_EXIT_FAIL;
		}
		fflush(NULL);
		child = fork();
		if (child < 0) {
			perror("mooncakectl bench transfer: fork");
			return CTL_EXIT_FAIL;
		}
		if (child == 0) {
			close(ctl_pipe[1]);
			close(ready_pipe[0]);
			_exit(child_main(&b, ctl_pipe[0], ready_pipe[1]));
		}
		close(ctl_pipe[0]);
		close(ready_pipe[1]);
		FILE *f = fdopen(ready_pipe[0], "r");
		char line[400];
		if (!f || !fgets(line, sizeof(line), f) ||
		    sscanf(line, "%299s %u", target, &stream_port) != 2) {
			fprintf(stderr, "mooncakectl bench transfer: the target process "
					"did not start\n");
			if (f)
				fclose(f);
			close(ctl_pipe[1]);
			waitpid(child, NULL, 0);
			return CTL_EXIT_FAIL;
		}
		fclose(f);
		cpu_child = child;
	} else {
		snprintf(target, sizeof(target), "%s", b.target);
	}

	struct ctl_te h;
	char err[1024];
	rc = CTL_EXIT_FAIL;
	if (ctl_te_start(&h, &b.te, err, sizeof(err)) != 0) {
		fprintf(stderr, "mooncakectl bench transfer: %s\n", err);
		goto out_child;
	}
	b.h = &h;
	struct te_segment *seg = NULL;
	int orc = te_open_segment(h.te, target, &seg);
	struct te_region_info reg = {0};
	if (orc == 0 && te_segment_info(seg, NULL, &reg, 1) == 0)
		orc = -ENOENT;
	if (orc == 0 && reg.len < b.region_bytes)
		orc = -ENOSPC;
	if (orc) {
		fprintf(stderr, "mooncakectl bench transfer: target %s: %s%s\n", target,
			orc == -ENOENT ? "it has no regions" : mc_strerror(orc),
			orc == -ENOSPC ? " (its first region is smaller than threads x "
					 "batch x block)"
				       : "");
		if (seg)
			te_close_segment(seg);
		goto out_engine;
	}
	struct te_segment_info info;
	te_segment_info(seg, &info, NULL, 0);

	printf("bench transfer: %s %s, %" PRIu64 " KiB blocks, batch %" PRIu64 ", %" PRIu64
	       " in flight, %" PRIu64
	       " threads, te-threads %s, %u tcp connections, target %s%s\n",
	       te_protocol_name(info.transport), b.write ? "write" : "read", b.block >> 10,
	       b.batch, b.inflight, b.threads, b.te.threads, b.conns, target,
	       child > 0 ? " (forked)" : "");
	/* Bandwidth and its limit in alternating rounds, so that a burst of
	 * other load on the machine hits both alike; the best round of each
	 * is reported (the batch latency is of the engine's best round). */
	bool shm = info.transport == TE_PROTO_SHM;
	uint64_t round_ms = MC_MAX(b.duration_ms / ROUNDS, (uint64_t)200);
	struct figures bw = {0}, closed = {0};
	double m1 = 0, mn = 0, st = 0, st_cpu = 0;
	int ferr = 0;
	for (int r = 0; r < ROUNDS && !ferr; r++) {
		struct figures f = run_load(&b, h.te, seg, reg.addr, (size_t)b.block,
					    (size_t)b.batch, (size_t)b.inflight,
					    (unsigned)b.threads, round_ms);
		ferr = f.err;
		if (f.gbps > bw.gbps)
			bw = f;
		if (b.inflight > 1 && !ferr) {
			f = run_load(&b, h.te, seg, reg.addr, (size_t)b.block, (size_t)b.batch,
				     1, (unsigned)b.threads, round_ms);
			ferr = f.err;
			if (f.gbps > closed.gbps)
				closed = f;
		}
		if (shm) {
			m1 = MC_MAX(m1, memcpy_gbps((size_t)b.block, (size_t)b.batch, 1,
						    round_ms));
			mn = MC_MAX(mn, memcpy_gbps((size_t)b.block, (size_t)b.batch,
						    (unsigned)b.threads, round_ms));
		} else if (child > 0) {
			double cpu, g = stream_gbps((uint16_t)stream_port, b.write, b.conns,
						    b.region_bytes / b.conns, round_ms, &cpu);
			if (g > st) {
				st = g;
				st_cpu = cpu;
			}
		}
	}
	uint64_t short_ms = MC_MAX(b.duration_ms / 3, (uint64_t)300);
	struct figures lat = {0}, small = {0};
	if (!ferr) {
		lat = run_load(&b, h.te, seg, reg.addr, (size_t)b.block, 1, 1, 1, short_ms);
		small = run_load(&b, h.te, seg, reg.addr, SMALL_BLOCK, (size_t)b.batch,
				 (size_t)b.inflight, (unsigned)b.threads, short_ms);
		ferr = lat.err ? lat.err : small.err;
	}
	if (ferr) {
		fprintf(stderr, "mooncakectl bench transfer: a request failed: %s\n",
			mc_strerror(ferr));
		te_close_segment(seg);
		goto out_engine;
	}
	char what[64];
	snprintf(what, sizeof(what), "engine, %" PRIu64 " batch%s in flight", b.inflight,
		 b.inflight > 1 ? "es" : "");
	printf("  %-34s %8.2f GB/s   batch p50 %.0f us, p99 %.0f us, CPU %.3f s/GB\n", what,
	       bw.gbps, bw.p50_us, bw.p99_us, bw.cpu_s_gb);
	if (b.inflight > 1)
		printf("  %-34s %8.2f GB/s   batch p50 %.0f us, p99 %.0f us, CPU %.3f s/GB\n",
		       "engine, closed loop (1 in flight)", closed.gbps, closed.p50_us,
		       closed.p99_us, closed.cpu_s_gb);
	if (shm) {
		print_ratio("limit: memcpy, 1 thread", m1, bw.gbps, closed.gbps);
		snprintf(what, sizeof(what), "limit: memcpy, %" PRIu64 " threads", b.threads);
		print_ratio(what, mn, bw.gbps, closed.gbps);
	} else {
		snprintf(what, sizeof(what), "limit: plain TCP stream, %u conns", b.conns);
		print_ratio(what, st, bw.gbps, closed.gbps);
		if (st > 0 && st_cpu > 0)
			printf("  %-34s %8.3f s/GB   engine/stream %.2f\n",
			       "stream CPU (both processes)", st_cpu, bw.cpu_s_gb / st_cpu);
	}
	if (info.transport == TE_PROTO_RDMA) {
		if (verbs_emu_test_device)
			printf("  note: RDMA on %s:\n  these are an emulator's figures, not a "
			       "NIC's\n",
			       verbs_emu_test_device);
		else
			printf("  note: on a NIC the line rate is the limit (not measured "
			       "here)\n");
	}
	printf("  %-34s p50 %.0f us, p99 %.0f us\n", "request latency, 1 in flight",
	       lat.p50_us, lat.p99_us);
	printf("  %-34s %8.0f req/s   (%.2f GB/s)\n", "4 KiB requests", small.reqs_per_s,
	       small.gbps);
	fflush(stdout);
	te_close_segment(seg);
	rc = CTL_EXIT_OK;
out_engine:
	ctl_te_stop(&h);
out_child:
	if (child > 0) {
		close(ctl_pipe[1]);
		waitpid(child, NULL, 0);
	}
	return rc;
}
