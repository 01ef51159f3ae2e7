/*
 * test_rdma: the RDMA layer (src/transfer/rdma.c) against test/verbs-emu,
 * the software verbs device this binary links instead of libibverbs.
 *
 * Single process: device, port, GID and MTU selection (overrides and the
 * "nothing usable" reasons), registration and its limits (max_mr, max_qp,
 * RLIMIT_MEMLOCK), the endpoint wire form. Two processes (fork, endpoint
 * exchange over pipes): RDMA WRITE and READ of 1 B .. 64 MiB checked by
 * CRC32C, striping over two NICs, deep pipelines against send-queue flow
 * control, and every error path: bad rkey, out-of-bounds address,
 * read-only region written, bad lkey, peer killed mid-stream, QP in ERR
 * (flushes), posting before connect, teardown with WRs in flight.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/crc32c.h"
#include "common/err.h"
#include "transfer/rdma.h"

#define MAXC 4096
#define PENDING INT_MIN
#define WAIT_S 60

/* ------------------------------------------------------------ completions */

static struct {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int status[MAXC];
	unsigned done;
	unsigned dup;   /* completions reported twice */
	unsigned bogus; /* cookies never posted */
	int qp_err;
	unsigned qp_errs;
} rec = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static void rec_reset(void)
{
	pthread_mutex_lock(&rec.mu);
	for (int i = 0; i < MAXC; i++)
		rec.status[i] = PENDING;
	rec.done = rec.dup = rec.bogus = rec.qp_errs = 0;
	rec.qp_err = 0;
	pthread_mutex_unlock(&rec.mu);
}

static void on_complete(void *arg, uint64_t cookie, int status)
{
	(void)arg;
	pthread_mutex_lock(&rec.mu);
	if (cookie >= MAXC)
		rec.bogus++;
	else if (rec.status[cookie] != PENDING)
		rec.dup++;
	else
		rec.status[cookie] = status, rec.done++;
	pthread_cond_broadcast(&rec.cv);
	pthread_mutex_unlock(&rec.mu);
}

static void on_qp_error(void *arg, unsigned qp, int status)
{
	(void)arg;
	(void)qp;
	pthread_mutex_lock(&rec.mu);
	rec.qp_err = status;
	rec.qp_errs++;
	pthread_cond_broadcast(&rec.cv);
	pthread_mutex_unlock(&rec.mu);
}

/* Wait until at least n completions were reported (deadline WAIT_S). */
static bool wait_done(unsigned n)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += WAIT_S;
	pthread_mutex_lock(&rec.mu);
	while (rec.done < n)
		if (pthread_cond_timedwait(&rec.cv, &rec.mu, &ts) == ETIMEDOUT)
			break;
	bool ok = rec.done >= n;
	pthread_mutex_unlock(&rec.mu);
	return ok;
}

static int status_of(unsigned cookie)
{
	pthread_mutex_lock(&rec.mu);
	int s = rec.status[cookie];
	pthread_mutex_unlock(&rec.mu);
	return s;
}

static struct te_rdma_opts opts_default(void)
{
	return (struct te_rdma_opts){
		.gid_index = -1, .on_complete = on_complete, .on_qp_error = on_qp_error};
}

static struct te_rdma *rdma_open(const struct te_rdma_opts *o)
{
	struct te_rdma *r = NULL;
	char why[512];
	int rc = te_rdma_new(o, &r, why, sizeof(why));
	cr_assert_eq(rc, 0, "te_rdma_new: %s (%s)", mc_strerror(rc), why);
	return r;
}

static void fill(uint8_t *p, size_t len, uint64_t seed)
{
	uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
	for (size_t i = 0; i < len; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		p[i] = (uint8_t)x;
	}
}

/* ------------------------------------------------------------ selection */

Test(rdma_select, default_prefers_roce_v2_ipv4)
{
	setenv("VERBS_EMU_DEVICES", "2", 1);
	struct te_rdma_opts o = opts_default();
	struct te_rdma *r = rdma_open(&o);
	cr_assert_eq(te_rdma_nic_count(r), 2);
	for (unsigned i = 0; i < 2; i++) {
		const struct te_rdma_nic *n = te_rdma_nic(r, i);
		char name[16];
		snprintf(name, sizeof(name), "emu_%u", i);
		cr_assert_str_eq(n->name, name);
		cr_assert_eq(n->port, 1);
		cr_assert_eq(n->gid_index, 3, "index 3 is RoCE v2 IPv4-mapped");
		cr_assert_eq(n->gid_type, IBV_GID_TYPE_ROCE_V2);
		cr_assert_eq(n->gid[10], 0xff);
		cr_assert_eq(n->gid[11], 0xff);
		cr_assert_eq(n->mtu_bytes, 1024);
	}
	cr_assert_null(te_rdma_nic(r, 2));
	te_rdma_free(r);
}

Test(rdma_select, gid_preference_order)
{
	struct te_rdma_opts o = opts_default();
	setenv("VERBS_EMU_GIDS", "v2", 1); /* v1 and v2 link-local only */
	struct te_rdma *r = rdma_open(&o);
	cr_assert_eq(te_rdma_nic(r, 0)->gid_index, 1);
	cr_assert_eq(te_rdma_nic(r, 0)->gid_type, IBV_GID_TYPE_ROCE_V2);
	te_rdma_free(r);
	setenv("VERBS_EMU_GIDS", "v1", 1); /* RoCE v1 only: the lowest */
	r = rdma_open(&o);
	cr_assert_eq(te_rdma_nic(r, 0)->gid_index, 0);
	cr_assert_eq(te_rdma_nic(r, 0)->gid_type, IBV_GID_TYPE_ROCE_V1);
	te_rdma_free(r);
	setenv("VERBS_EMU_GIDS", "ib", 1);
	r = rdma_open(&o);
	cr_assert_eq(te_rdma_nic(r, 0)->gid_type, IBV_GID_TYPE_IB);
	cr_assert_eq(te_rdma_nic(r, 0)->lid, 1);
	te_rdma_free(r);
}

Test(rdma_select, gid_override_and_mtu)
{
	setenv("VERBS_EMU_MTU", "4096", 1);
	struct te_rdma_opts o = opts_default();
	o.gid_index = 0;
	struct te_rdma *r = rdma_open(&o);
	cr_assert_eq(te_rdma_nic(r, 0)->gid_index, 0);
	cr_assert_eq(te_rdma_nic(r, 0)->gid_type, IBV_GID_TYPE_ROCE_V1);
	cr_assert_eq(te_rdma_nic(r, 0)->mtu_bytes, 4096);
	te_rdma_free(r);

	char why[512];
	o.gid_index = 5; /* empty entry */
	cr_assert_eq(te_rdma_new(&o, &r, why, sizeof(why)), -EADDRNOTAVAIL);
	cr_assert(strstr(why, "GID index 5 is not valid"), "%s", why);
}

Test(rdma_select, device_filter)
{
	setenv("VERBS_EMU_DEVICES", "3", 1);
	struct te_rdma_opts o = opts_default();
	o.devices = "emu_2,emu_0";
	struct te_rdma *r = rdma_open(&o);
	cr_assert_eq(te_rdma_nic_count(r), 2);
	cr_assert_str_eq(te_rdma_nic(r, 0)->name, "emu_0");
	cr_assert_str_eq(te_rdma_nic(r, 1)->name, "emu_2");
	te_rdma_free(r);
	o.devices = "auto";
	r = rdma_open(&o);
	cr_assert_eq(te_rdma_nic_count(r), 3);
	te_rdma_free(r);

	char why[512];
	o.devices = "emu_0,mlx5_9";
	cr_assert_eq(te_rdma_new(&o, &r, why, sizeof(why)), -ENODEV);
	cr_assert(strstr(why, "'mlx5_9' not found") && strstr(why, "emu_0,emu_1,emu_2"), "%s",
		  why);
}

Test(rdma_select, port_down_is_skipped)
{
	setenv("VERBS_EMU_DEVICES", "2", 1);
	setenv("VERBS_EMU_PORT_STATE", "down,active", 1);
	struct te_rdma_opts o = opts_default();
	struct te_rdma *r = rdma_open(&o);
	cr_assert_eq(te_rdma_nic_count(r), 1);
	cr_assert_str_eq(te_rdma_nic(r, 0)->name, "emu_1");
	te_rdma_free(r);
}

static void expect_unusable(int want, const char *text)
{
	struct te_rdma_opts o = opts_default();
	struct te_rdma *r = NULL;
	char why[512] = "";
	int rc = te_rdma_new(&o, &r, why, sizeof(why));
	cr_assert_eq(rc, want, "got %s (%s)", mc_errname(rc), why);
	cr_assert_null(r);
	cr_assert(strstr(why, text), "reason '%s' lacks '%s'", why, text);
}

Test(rdma_select, no_devices)
{
	setenv("VERBS_EMU_DEVICES", "0", 1);
	expect_unusable(-ENODEV, "no RDMA devices found");
}

Test(rdma_select, no_active_port)
{
	setenv("VERBS_EMU_PORT_STATE", "down", 1);
	expect_unusable(-ENETDOWN, "emu_0: port 1 is DOWN, not ACTIVE");
}

Test(rdma_select, no_usable_gid)
{
	setenv("VERBS_EMU_GIDS", "none", 1);
	expect_unusable(-EADDRNOTAVAIL, "emu_0: port 1 has no usable GID");
}

Test(rdma_select, no_permission)
{
	setenv("VERBS_EMU_OPEN_ERRNO", "EACCES", 1);
	expect_unusable(-EACCES, "no permission");
}

Test(rdma_select, bad_options)
{
	struct te_rdma_opts o = opts_default();
	struct te_rdma *r = NULL;
	char why[256];
	o.on_complete = NULL;
	cr_assert_eq(te_rdma_new(&o, &r, why, sizeof(why)), -EINVAL);
	o = opts_default();
	o.sq_depth = 8;
	o.signal_every = 5;
	cr_assert_eq(te_rdma_new(&o, &r, why, sizeof(why)), -EINVAL);
	cr_assert(strstr(why, "signal_every"), "%s", why);
	o = opts_default();
	o.sq_depth = 1 << 16; /* over the device's max_qp_wr */
	setenv("VERBS_EMU_MAX_QP_WR", "1024", 1);
	cr_assert_eq(te_rdma_new(&o, &r, why, sizeof(why)), -EINVAL);
	cr_assert(strstr(why, "max_qp_wr 1024"), "%s", why);
}

/* ------------------------------------------------------------ registration */

Test(rdma_reg, keys_per_nic)
{
	setenv("VERBS_EMU_DEVICES", "2", 1);
	struct te_rdma_opts o = opts_default();
	struct te_rdma *r = rdma_open(&o);
	static uint8_t buf[8192];
	struct te_rdma_mr *mr;
	char why[256];
	cr_assert_eq(te_rdma_reg(r, buf, sizeof(buf), true, &mr, why, sizeof(why)), 0, "%s",
		     why);
	cr_assert_neq(te_rdma_mr_rkey(mr, 0), 0);
	cr_assert_neq(te_rdma_mr_lkey(mr, 1), 0);
	cr_assert_eq(te_rdma_reg(r, NULL, 10, true, &mr, why, sizeof(why)), -EINVAL);
	cr_assert_eq(te_rdma_reg(r, buf, 0, true, &mr, why, sizeof(why)), -EINVAL);
	te_rdma_dereg(mr);
	te_rdma_free(r);
}

Test(rdma_reg, max_mr_named)
{
	setenv("VERBS_EMU_MAX_MR", "2", 1);
	struct te_rdma_opts o = opts_default();
	struct te_rdma *r = rdma_open(&o);
	static uint8_t buf[3][4096];
	struct te_rdma_mr *mr[3];
	char why[512];
	cr_assert_eq(te_rdma_reg(r, buf[0], 4096, true, &mr[0], why, sizeof(why)), 0);
	cr_assert_eq(te_rdma_reg(r, buf[1], 4096, true, &mr[1], why, sizeof(why)), 0);
	cr_assert_eq(te_rdma_reg(r, buf[2], 4096, true, &mr[2], why, sizeof(why)), -ENOMEM);
	cr_assert(strstr(why, "emu_0: the device allows 2 memory regions (max_mr)"), "%s",
		  why);
	te_rdma_dereg(mr[1]); /* the count goes down again */
	cr_assert_eq(te_rdma_reg(r, buf[2], 4096, true, &mr[2], why, sizeof(why)), 0, "%s",
		     why);
	te_rdma_dereg(mr[2]);
	te_rdma_dereg(mr[0]);
	te_rdma_free(r);
}

Test(rdma_reg, memlock_named)
{
	struct rlimit rl = {.rlim_cur = 1 << 20, .rlim_max = RLIM_INFINITY};
	struct rlimit old;
	cr_assert_eq(getrlimit(RLIMIT_MEMLOCK, &old), 0);
	rl.rlim_max = old.rlim_max;
	if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < rl.rlim_cur)
		rl.rlim_cur = rl.rlim_max;
	cr_assert_eq(setrlimit(RLIMIT_MEMLOCK, &rl), 0);
	setenv("VERBS_EMU_ENFORCE_MEMLOCK", "1", 1);
	struct te_rdma_opts o = opts_default();
	struct te_rdma *r = rdma_open(&o);
	size_t len = 4 << 20;
	uint8_t *buf = malloc(len);
	struct te_rdma_mr *mr;
	char why[512], want[64];
	cr_assert_eq(te_rdma_reg(r, buf, len, true, &mr, why, sizeof(why)), -ENOMEM);
	snprintf(want, sizeof(want), "is %llu KiB", (unsigned long long)rl.rlim_cur / 1024);
	cr_assert(strstr(why, "ulimit -l") && strstr(why, want), "%s", why);
	cr_assert_eq(te_rdma_reg(r, buf, 4096, true, &mr, why, sizeof(why)), 0, "%s", why);
	te_rdma_dereg(mr);
	free(buf);
	te_rdma_free(r);
}

Test(rdma_reg, max_qp_and_cq_budget_named)
{
	setenv("VERBS_EMU_MAX_QP", "1", 1);
	struct te_rdma_opts o = opts_default();
	struct te_rdma *r = rdma_open(&o);
	struct te_rdma_conn *c1, *c2;
	char why[512];
	cr_assert_eq(te_rdma_conn_new(r, 1, NULL, &c1, why, sizeof(why)), 0, "%s", why);
	cr_assert_eq(te_rdma_conn_new(r, 1, NULL, &c2, why, sizeof(why)), -ENOMEM);
	cr_assert(strstr(why, "allows 1 queue pairs (max_qp)"), "%s", why);
	cr_assert_eq(te_rdma_conn_new(r, 0, NULL, &c2, why, sizeof(why)), -EINVAL);
	te_rdma_conn_free(c1);
	te_rdma_free(r);

	unsetenv("VERBS_EMU_MAX_QP");
	o.sq_depth = 63;
	o.cq_depth = 128; /* two QPs of 64 entries */
	r = rdma_open(&o);
	cr_assert_eq(te_rdma_conn_new(r, 2, NULL, &c1, why, sizeof(why)), 0, "%s", why);
	cr_assert_eq(te_rdma_conn_qps(c1), 2);
	cr_assert_eq(te_rdma_conn_new(r, 1, NULL, &c2, why, sizeof(why)), -ENOMEM);
	cr_assert(strstr(why, "completion queue (128 entries)"), "%s", why);
	te_rdma_conn_free(c1);
	te_rdma_free(r);
}

/* ------------------------------------------------------------ wire form */

Test(rdma_ep, roundtrip_and_refusals)
{
	struct te_rdma_ep e = {.lid = 0x1234,
			       .qpn = 0xabcdef,
			       .psn = 0x123456,
			       .mtu = IBV_MTU_4096,
			       .port = 1,
			       .nic = 3};
	for (int i = 0; i < 16; i++)
		e.gid[i] = (uint8_t)(i * 17);
	uint8_t w[TE_RDMA_EP_WIRE_BYTES];
	struct te_rdma_ep d;
	te_rdma_ep_encode(&e, w);
	cr_assert_eq(te_rdma_ep_decode(w, sizeof(w), &d), 0);
	cr_assert_eq(memcmp(d.gid, e.gid, 16), 0);
	cr_assert(d.lid == e.lid && d.qpn == e.qpn && d.psn == e.psn && d.mtu == e.mtu &&
		  d.port == e.port && d.nic == e.nic);
	cr_assert_eq(te_rdma_ep_decode(w, sizeof(w) - 1, &d), -EINVAL);
	uint8_t bad[TE_RDMA_EP_WIRE_BYTES];
	memcpy(bad, w, sizeof(w));
	bad[24] = 9; /* no such MTU */
	cr_assert_eq(te_rdma_ep_decode(bad, sizeof(bad), &d), -EINVAL);
	memcpy(bad, w, sizeof(w));
	bad[31] = 1; /* reserved */
	cr_assert_eq(te_rdma_ep_decode(bad, sizeof(bad), &d), -EINVAL);
	memcpy(bad, w, sizeof(w));
	bad[26] = TE_RDMA_MAX_NICS;
	cr_assert_eq(te_rdma_ep_decode(bad, sizeof(bad), &d), -EINVAL);
}

/* ------------------------------------------------------------ two processes */

#define REGION (64u << 20) /* + 4 KiB: room for 1 MiB + 1 at odd offsets */
#define REGION_ALLOC (REGION + 4096u)
#define RO_LEN 65536u

struct side_info { /* what each process tells the other */
	uint32_t nics;
	uint32_t qps;
	uint64_t addr, ro_addr;
	uint32_t rkey[TE_RDMA_MAX_NICS], ro_rkey[TE_RDMA_MAX_NICS];
	uint8_t eps[TE_RDMA_MAX_NICS][TE_RDMA_EP_WIRE_BYTES];
};

struct cmd {
	char op; /* F fill, C checksum, Q quit */
	uint64_t off, len, seed;
};

struct pair {
	pid_t child;
	int to_child, from_child;
	struct te_rdma *r;
	struct te_rdma_mr *mr;
	uint8_t *buf;
	struct te_rdma_conn *c;
	struct side_info peer;
};

static void full_io(int fd, void *p, size_t len, bool wr)
{
	char *b = p;
	while (len) {
		ssize_t n = wr ? write(fd, b, len) : read(fd, b, len);
		if (n <= 0) {
			if (n < 0 && errno == EINTR)
				continue;
			if (wr)
				cr_assert_fail("pipe write failed");
			_exit(3); /* the other side is gone */
		}
		b += n;
		len -= (size_t)n;
	}
}

static uint8_t *big_alloc(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	return p == MAP_FAILED ? NULL : p;
}

/* Set up one side: context, region, connection; exchange and connect. */
static void side_setup(const struct te_rdma_opts *o, int rfd, int wfd, struct te_rdma **r,
		       struct te_rdma_mr **mr, struct te_rdma_mr **ro, uint8_t **buf,
		       uint8_t **robuf, struct te_rdma_conn **c, struct side_info *peer)
{
	char why[512];
	struct side_info me;
	memset(&me, 0, sizeof(me));
	if (te_rdma_new(o, r, why, sizeof(why)))
		_exit(10);
	*buf = big_alloc(REGION_ALLOC);
	*robuf = big_alloc(RO_LEN);
	if (!*buf || !*robuf)
		_exit(11);
	if (te_rdma_reg(*r, *buf, REGION_ALLOC, true, mr, why, sizeof(why)) ||
	    te_rdma_reg(*r, *robuf, RO_LEN, false, ro, why, sizeof(why)))
		_exit(12);
	me.nics = te_rdma_nic_count(*r);
	full_io(wfd, &me.nics, sizeof(me.nics), true);
	full_io(rfd, &peer->nics, sizeof(peer->nics), false);
	if (te_rdma_conn_new(*r, peer->nics, NULL, c, why, sizeof(why)))
		_exit(13);
	struct te_rdma_ep eps[TE_RDMA_MAX_NICS];
	int n = te_rdma_conn_eps(*c, eps, TE_RDMA_MAX_NICS);
	if (n <= 0)
		_exit(14);
	me.qps = (uint32_t)n;
	me.addr = (uint64_t)(uintptr_t)*buf;
	me.ro_addr = (uint64_t)(uintptr_t)*robuf;
	for (unsigned i = 0; i < me.nics; i++) {
		me.rkey[i] = te_rdma_mr_rkey(*mr, i);
		me.ro_rkey[i] = te_rdma_mr_rkey(*ro, i);
	}
	for (int k = 0; k < n; k++)
		te_rdma_ep_encode(&eps[k], me.eps[k]);
	full_io(wfd, &me, sizeof(me), true);
	full_io(rfd, peer, sizeof(*peer), false);
	if (peer->qps != (uint32_t)n)
		_exit(15);
	for (int k = 0; k < n; k++)
		if (te_rdma_ep_decode(peer->eps[k], TE_RDMA_EP_WIRE_BYTES, &eps[k]))
			_exit(16);
	if (te_rdma_conn_connect(*c, eps, (unsigned)n))
		_exit(17);
	/* both sides in RTS before either posts (as rc_pingpong syncs) */
	char ready = 'R';
	full_io(wfd, &ready, 1, true);
	full_io(rfd, &ready, 1, false);
}

/* The passive side: serves fill/checksum commands until Q. */
static void child_main(const char *devices, int rfd, int wfd)
{
	struct te_rdma *r;
	struct te_rdma_mr *mr, *ro;
	uint8_t *buf, *robuf;
	struct te_rdma_conn *c;
	struct side_info peer;
	setenv("VERBS_EMU_DEVICES", devices, 1);
	struct te_rdma_opts o = opts_default();
	side_setup(&o, rfd, wfd, &r, &mr, &ro, &buf, &robuf, &c, &peer);
	fill(robuf, RO_LEN, 77);
	for (;;) {
		struct cmd cm;
		uint32_t crc = 0;
		full_io(rfd, &cm, sizeof(cm), false);
		if (cm.op == 'Q')
			break;
		if (cm.op == 'F')
			fill(buf + cm.off, cm.len, cm.seed);
		else
			crc = crc32c(0, buf + cm.off, cm.len);
		full_io(wfd, &crc, sizeof(crc), true);
	}
	te_rdma_conn_free(c);
	te_rdma_dereg(ro);
	te_rdma_dereg(mr);
	te_rdma_free(r);
	_exit(0);
}

static struct pair *pair_start(const char *my_devices, const char *child_devices,
			       const struct te_rdma_opts *o)
{
	static struct pair p;
	struct te_rdma_mr *ro;
	uint8_t *robuf;
	int a[2], b[2];
	rec_reset();
	cr_assert_eq(pipe(a), 0);
	cr_assert_eq(pipe(b), 0);
	p.child = fork();
	cr_assert_geq(p.child, 0);
	if (p.child == 0) {
		close(a[1]);
		close(b[0]);
		child_main(child_devices, a[0], b[1]);
	}
	close(a[0]);
	close(b[1]);
	p.to_child = a[1];
	p.from_child = b[0];
	setenv("VERBS_EMU_DEVICES", my_devices, 1);
	side_setup(o, p.from_child, p.to_child, &p.r, &p.mr, &ro, &p.buf, &robuf, &p.c,
		   &p.peer);
	/* the parent's read-only region is not used */
	te_rdma_dereg(ro);
	munmap(robuf, RO_LEN);
	return &p;
}

static uint32_t child_cmd(struct pair *p, char op, uint64_t off, uint64_t len, uint64_t seed)
{
	struct cmd cm = {.op = op, .off = off, .len = len, .seed = seed};
	uint32_t crc;
	full_io(p->to_child, &cm, sizeof(cm), true);
	full_io(p->from_child, &crc, sizeof(crc), false);
	return crc;
}

static void pair_stop(struct pair *p, bool child_alive)
{
	if (child_alive) {
		struct cmd cm = {.op = 'Q'};
		full_io(p->to_child, &cm, sizeof(cm), true);
	}
	int st;
	cr_assert_eq(waitpid(p->child, &st, 0), p->child);
	if (child_alive)
		cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status 0x%x", st);
	close(p->to_child);
	close(p->from_child);
	te_rdma_conn_free(p->c);
	te_rdma_dereg(p->mr);
	te_rdma_free(p->r);
	munmap(p->buf, REGION_ALLOC);
	cr_assert_eq(rec.dup, 0, "completions reported twice");
	cr_assert_eq(rec.bogus, 0, "completions for cookies never posted");
}

/* Stop the peer and wait until it is stopped. */
static void peer_stop(struct pair *p)
{
	int st;
	cr_assert_eq(kill(p->child, SIGSTOP), 0);
	cr_assert_eq(waitpid(p->child, &st, WUNTRACED), p->child);
	cr_assert(WIFSTOPPED(st));
}

static struct te_rdma_wr wr_of(struct pair *p, unsigned k, enum te_rdma_op op, uint64_t loff,
			       uint64_t roff, uint32_t len, uint64_t cookie)
{
	unsigned nic = te_rdma_conn_nic(p->c, k);
	unsigned pnic = k % p->peer.nics;
	return (struct te_rdma_wr){.op = op,
				   .local = p->buf + loff,
				   .lkey = te_rdma_mr_lkey(p->mr, nic),
				   .remote = p->peer.addr + roff,
				   .rkey = p->peer.rkey[pnic],
				   .len = len,
				   .cookie = cookie};
}

/* Post, waiting for room when the send queue is full. */
static void post_wait(struct pair *p, unsigned k, const struct te_rdma_wr *w, unsigned n,
		      unsigned *eagain)
{
	for (;;) {
		unsigned before;
		pthread_mutex_lock(&rec.mu);
		before = rec.done;
		pthread_mutex_unlock(&rec.mu);
		int rc = te_rdma_post(p->c, k, w, n);
		if (rc == 0)
			return;
		cr_assert_eq(rc, -EAGAIN, "post: %s", mc_strerror(rc));
		if (eagain)
			(*eagain)++;
		cr_assert(wait_done(before + 1), "no completion freed the send queue");
	}
}

static void check_all_ok(unsigned n)
{
	cr_assert(wait_done(n), "only %u of %u completions", rec.done, n);
	for (unsigned i = 0; i < n; i++)
		cr_assert_eq(status_of(i), 0, "cookie %u: %s", i, mc_strerror(status_of(i)));
}

Test(rdma_data, write_read_sizes)
{
	struct te_rdma_opts o = opts_default();
	struct pair *p = pair_start("1", "1", &o);
	const uint32_t sizes[] = {1, 4096, (1u << 20) + 1, 64u << 20};
	unsigned cookie = 0;
	for (unsigned i = 0; i < 4; i++) {
		uint32_t len = sizes[i];
		uint64_t roff = len == REGION ? 0 : 4093; /* odd offsets where room */
		/* WRITE: local pattern -> peer, peer checksums */
		fill(p->buf, len, 100 + i);
		uint32_t want = crc32c(0, p->buf, len);
		struct te_rdma_wr w = wr_of(p, 0, TE_RDMA_WRITE, 0, roff, len, cookie++);
		post_wait(p, 0, &w, 1, NULL);
		check_all_ok(cookie);
		cr_assert_eq(child_cmd(p, 'C', roff, len, 0), want, "WRITE of %u bytes", len);
		/* READ: peer pattern -> local */
		child_cmd(p, 'F', roff, len, 200 + i);
		memset(p->buf + 1, 0, len);
		w = wr_of(p, 0, TE_RDMA_READ, 1, roff, len, cookie++);
		post_wait(p, 0, &w, 1, NULL);
		check_all_ok(cookie);
		uint8_t *expect = big_alloc(REGION_ALLOC);
		fill(expect, len, 200 + i);
		cr_assert_eq(crc32c(0, p->buf + 1, len), crc32c(0, expect, len),
			     "READ of %u bytes", len);
		munmap(expect, REGION_ALLOC);
	}
	pair_stop(p, true);
}

Test(rdma_data, striped_over_two_nics_to_one)
{
	struct te_rdma_opts o = opts_default();
	struct pair *p = pair_start("2", "1", &o);
	cr_assert_eq(te_rdma_conn_qps(p->c), 2);
	cr_assert_eq(te_rdma_conn_nic(p->c, 1), 1);
	const uint32_t slice = 1u << 20;
	const unsigned slices = 16;
	fill(p->buf, slices * slice, 5);
	uint32_t want = crc32c(0, p->buf, slices * slice);
	for (unsigned s = 0; s < slices; s++) {
		struct te_rdma_wr w = wr_of(p, s % 2, TE_RDMA_WRITE, (uint64_t)s * slice,
					    (uint64_t)s * slice, slice, s);
		post_wait(p, s % 2, &w, 1, NULL);
	}
	check_all_ok(slices);
	cr_assert_eq(child_cmd(p, 'C', 0, slices * slice, 0), want);
	/* and back, striped reads into another area */
	for (unsigned s = 0; s < slices; s++) {
		struct te_rdma_wr w = wr_of(p, s % 2, TE_RDMA_READ,
					    (uint64_t)(slices + s) * slice,
					    (uint64_t)s * slice, slice, slices + s);
		post_wait(p, s % 2, &w, 1, NULL);
	}
	check_all_ok(2 * slices);
	cr_assert_eq(crc32c(0, p->buf + (size_t)slices * slice, slices * slice), want);
	pair_stop(p, true);
}

Test(rdma_data, pipeline_hits_flow_control)
{
	struct te_rdma_opts o = opts_default();
	o.sq_depth = 16;
	o.signal_every = 4;
	struct pair *p = pair_start("1", "1", &o);
	/* deterministic: with the peer stopped nothing completes, so a full
	 * send queue refuses more */
	struct te_rdma_wr w[17];
	for (unsigned i = 0; i < 17; i++)
		w[i] = wr_of(p, 0, TE_RDMA_WRITE, i * 4096u, i * 4096u, 4096, i);
	fill(p->buf, 1000 * 4096u, 9);
	peer_stop(p);
	cr_assert_eq(te_rdma_post(p->c, 0, w, 10), 0);
	int rc = te_rdma_post(p->c, 0, w + 10, 7);
	cr_assert_eq(rc, -EAGAIN, "%s (done %u)", mc_errname(rc), rec.done);
	cr_assert_eq(te_rdma_conn_sq_free(p->c, 0), 6);
	cr_assert_eq(te_rdma_post(p->c, 0, w + 10, 6), 0);
	cr_assert_eq(te_rdma_post(p->c, 0, w, 1), -EAGAIN);
	cr_assert_eq(te_rdma_post(p->c, 0, w, 17), -EINVAL);
	cr_assert_eq(kill(p->child, SIGCONT), 0);
	check_all_ok(16);
	/* 1,000 writes in batches of 1..13, unsignaled in between */
	unsigned eagain = 0, next = 16;
	while (next < 1000) {
		unsigned n = 1 + next % 13;
		if (next + n > 1000)
			n = 1000 - next;
		struct te_rdma_wr b[13];
		for (unsigned j = 0; j < n; j++)
			b[j] = wr_of(p, 0, TE_RDMA_WRITE, (next + j) * 4096ull,
				     (next + j) * 4096ull, 4096, next + j);
		post_wait(p, 0, b, n, &eagain);
		next += n;
	}
	check_all_ok(1000);
	cr_assert_eq(child_cmd(p, 'C', 0, 1000 * 4096u, 0), crc32c(0, p->buf, 1000 * 4096u));
	cr_log_info("send queue full %u times in the pipeline", eagain);
	pair_stop(p, true);
}

/* One WR expected to fail with code; the QP then refuses posts. */
static void expect_wr_error(struct pair *p, struct te_rdma_wr *w, int code)
{
	cr_assert_eq(te_rdma_post(p->c, 0, w, 1), 0);
	cr_assert(wait_done(1));
	cr_assert_eq(status_of((unsigned)w->cookie), code, "got %s",
		     mc_errname(status_of((unsigned)w->cookie)));
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += WAIT_S;
	pthread_mutex_lock(&rec.mu);
	while (rec.qp_errs == 0 && pthread_cond_timedwait(&rec.cv, &rec.mu, &ts) != ETIMEDOUT)
		;
	cr_assert_eq(rec.qp_errs, 1);
	cr_assert_eq(rec.qp_err, code);
	pthread_mutex_unlock(&rec.mu);
	cr_assert_eq(te_rdma_conn_status(p->c, 0), code);
	cr_assert_eq(te_rdma_post(p->c, 0, w, 1), code, "a QP in ERR refuses posts");
}

/* A fresh pair, one bad WR (rkey/lkey altered by the xor masks). */
static void one_bad_wr(enum te_rdma_op op, uint64_t roff, uint32_t len, uint32_t rkey_xor,
		       uint32_t lkey_xor, int code)
{
	struct te_rdma_opts o = opts_default();
	struct pair *p = pair_start("1", "1", &o);
	struct te_rdma_wr w = wr_of(p, 0, op, 0, roff, len, 0);
	w.rkey ^= rkey_xor;
	w.lkey ^= lkey_xor;
	expect_wr_error(p, &w, code);
	pair_stop(p, true);
}

Test(rdma_err, bad_rkey)
{
	one_bad_wr(TE_RDMA_WRITE, 0, 64, 0x100, 0, -EACCES);
}

Test(rdma_err, out_of_bounds)
{
	one_bad_wr(TE_RDMA_READ, REGION_ALLOC - 10, 100, 0, 0, -EACCES);
}

Test(rdma_err, bad_lkey)
{
	one_bad_wr(TE_RDMA_WRITE, 0, 64, 0, 0x100, -EFAULT);
}

Test(rdma_err, read_only_region_written)
{
	struct te_rdma_opts o = opts_default();
	struct pair *p = pair_start("1", "1", &o);
	/* the child fills it after the connection is set up: one command
	 * round trip makes sure that happened */
	(void)child_cmd(p, 'C', 0, 1, 0);
	/* reading it is fine */
	struct te_rdma_wr w = {.op = TE_RDMA_READ,
			       .local = p->buf,
			       .lkey = te_rdma_mr_lkey(p->mr, 0),
			       .remote = p->peer.ro_addr,
			       .rkey = p->peer.ro_rkey[0],
			       .len = RO_LEN,
			       .cookie = 0};
	cr_assert_eq(te_rdma_post(p->c, 0, &w, 1), 0);
	check_all_ok(1);
	uint8_t want[RO_LEN];
	fill(want, RO_LEN, 77);
	cr_assert_eq(memcmp(p->buf, want, RO_LEN), 0);
	rec_reset();
	w.op = TE_RDMA_WRITE;
	w.cookie = 1;
	expect_wr_error(p, &w, -EACCES);
	pair_stop(p, true);
}

Test(rdma_err, error_flushes_the_rest)
{
	struct te_rdma_opts o = opts_default();
	o.signal_every = 4;
	struct pair *p = pair_start("1", "1", &o);
	struct te_rdma_wr w[8];
	for (unsigned i = 0; i < 8; i++)
		w[i] = wr_of(p, 0, TE_RDMA_WRITE, i * 4096u, i * 4096u, 4096, i);
	w[2].rkey ^= 0x100;
	cr_assert_eq(te_rdma_post(p->c, 0, w, 8), 0);
	cr_assert(wait_done(8));
	cr_assert_eq(status_of(0), 0);
	cr_assert_eq(status_of(1), 0);
	cr_assert_eq(status_of(2), -EACCES);
	for (unsigned i = 3; i < 8; i++)
		cr_assert_eq(status_of(i), MC_ECANCELLED, "cookie %u: %s", i,
			     mc_errname(status_of(i)));
	cr_assert_eq(rec.qp_errs, 1);
	pair_stop(p, true);
}

Test(rdma_err, peer_killed_mid_stream)
{
	struct te_rdma_opts o = opts_default();
	o.sq_depth = 32;
	struct pair *p = pair_start("1", "1", &o);
	const uint32_t len = 1u << 20;
	unsigned posted = 0;
	/* a stream of 1 MiB writes; the peer is killed after the first 8
	 * completed, then the stream goes on */
	for (; posted < 8; posted++) {
		struct te_rdma_wr w = wr_of(p, 0, TE_RDMA_WRITE, 0, 0, len, posted);
		post_wait(p, 0, &w, 1, NULL);
	}
	cr_assert(wait_done(8));
	for (; posted < 24; posted++) {
		struct te_rdma_wr w = wr_of(p, 0, TE_RDMA_WRITE, 0, 0, len, posted);
		post_wait(p, 0, &w, 1, NULL);
	}
	cr_assert_eq(kill(p->child, SIGKILL), 0);
	int st;
	cr_assert_eq(waitpid(p->child, &st, 0), p->child);
	for (; posted < 40; posted++) {
		struct te_rdma_wr w = wr_of(p, 0, TE_RDMA_WRITE, 0, 0, len, posted);
		int rc = te_rdma_post(p->c, 0, &w, 1);
		if (rc == -EAGAIN) {
			cr_assert(wait_done(rec.done + 1));
			posted--;
			continue;
		}
		if (rc == MC_EUNAVAILABLE)
			break; /* the QP already failed: it refuses posts */
		cr_assert_eq(rc, 0, "%s", mc_errname(rc));
	}
	cr_assert(wait_done(posted), "every posted WR is reported, no hang");
	unsigned ok = 0, unavail = 0, flushed = 0;
	for (unsigned i = 0; i < posted; i++) {
		int s = status_of(i);
		ok += s == 0;
		unavail += s == MC_EUNAVAILABLE;
		flushed += s == MC_ECANCELLED;
	}
	cr_assert_eq(ok + unavail + flushed, posted);
	cr_assert_geq(ok, 8);
	cr_assert_eq(unavail, 1, "one WR meets the dead peer, the rest are flushed");
	cr_assert_eq(rec.qp_err, MC_EUNAVAILABLE);
	cr_assert_eq(te_rdma_conn_status(p->c, 0), MC_EUNAVAILABLE);
	/* pair_stop would wait for the child again: tear down by hand */
	close(p->to_child);
	close(p->from_child);
	te_rdma_conn_free(p->c);
	te_rdma_dereg(p->mr);
	te_rdma_free(p->r);
	munmap(p->buf, REGION_ALLOC);
	cr_assert_eq(rec.dup, 0);
}

Test(rdma_err, post_before_connect)
{
	struct te_rdma_opts o = opts_default();
	struct te_rdma *r = rdma_open(&o);
	struct te_rdma_conn *c;
	static uint8_t buf[4096];
	struct te_rdma_mr *mr;
	char why[256];
	cr_assert_eq(te_rdma_reg(r, buf, sizeof(buf), true, &mr, why, sizeof(why)), 0);
	cr_assert_eq(te_rdma_conn_new(r, 1, NULL, &c, why, sizeof(why)), 0, "%s", why);
	cr_assert_eq(te_rdma_conn_status(c, 0), -ENOTCONN);
	struct te_rdma_wr w = {.op = TE_RDMA_WRITE,
			       .local = buf,
			       .lkey = te_rdma_mr_lkey(mr, 0),
			       .remote = 4096,
			       .rkey = 1,
			       .len = 1};
	cr_assert_eq(te_rdma_post(c, 0, &w, 1), -ENOTCONN);
	cr_assert_eq(te_rdma_post(c, 1, &w, 1), -EINVAL);
	w.op = 0;
	cr_assert_eq(te_rdma_post(c, 0, &w, 1), -EINVAL);
	struct te_rdma_ep ep[2];
	cr_assert_eq(te_rdma_conn_eps(c, ep, 0), -ENOSPC);
	cr_assert_eq(te_rdma_conn_eps(c, ep, 2), 1);
	cr_assert_eq(te_rdma_conn_connect(c, ep, 2), -EINVAL);
	te_rdma_conn_free(c);
	te_rdma_dereg(mr);
	te_rdma_free(r);
}

Test(rdma_err, teardown_with_requests_in_flight)
{
	struct te_rdma_opts o = opts_default();
	struct pair *p = pair_start("1", "1", &o);
	struct te_rdma_wr w[8];
	for (unsigned i = 0; i < 8; i++)
		w[i] = wr_of(p, 0, TE_RDMA_WRITE, i * 4096u, i * 4096u, 4096, i);
	peer_stop(p);
	cr_assert_eq(te_rdma_post(p->c, 0, w, 8), 0);
	te_rdma_conn_free(p->c); /* waits: every WR is reported, flushed */
	p->c = NULL;
	cr_assert_eq(rec.done, 8);
	for (unsigned i = 0; i < 8; i++)
		cr_assert_eq(status_of(i), MC_ECANCELLED, "cookie %u: %s", i,
			     mc_errname(status_of(i)));
	cr_assert_eq(rec.qp_errs, 0, "a teardown is not a QP error");
	cr_assert_eq(kill(p->child, SIGCONT), 0);
	pair_stop(p, true);
}

/* ------------------------------------------------------------ the device itself */

Test(verbs_emu, qp_state_machine_checks)
{
	struct ibv_device **l = ibv_get_device_list(NULL);
	cr_assert_not_null(l);
	struct ibv_context *ctx = ibv_open_device(l[0]);
	ibv_free_device_list(l);
	cr_assert_not_null(ctx);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	struct ibv_qp_init_attr ia = {.send_cq = cq,
				      .recv_cq = cq,
				      .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 4, .max_send_sge = 1}};
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	cr_assert_not_null(qp);
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTR};
	cr_assert_eq(ibv_modify_qp(qp, &a, IBV_QP_STATE), EINVAL, "RESET -> RTR");
	a = (struct ibv_qp_attr){.qp_state = IBV_QPS_INIT, .port_num = 1};
	cr_assert_eq(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PORT), EINVAL,
		     "INIT without access");
	cr_assert_eq(ibv_modify_qp(qp, &a,
				   IBV_QP_STATE | IBV_QP_PORT | IBV_QP_PKEY_INDEX |
					   IBV_QP_ACCESS_FLAGS),
		     0);
	cr_assert_eq(qp->state, IBV_QPS_INIT);
	struct ibv_sge sge = {0};
	struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE},
			   *bad;
	cr_assert_eq(ibv_post_send(qp, &wr, &bad), EINVAL, "post in INIT");
	a = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTR,
				 .path_mtu = IBV_MTU_4096,
				 .ah_attr = {.is_global = 1,
					     .port_num = 1,
					     .grh = {.hop_limit = 1, .sgid_index = 3}}};
	int rtr = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
		  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	cr_assert_eq(ibv_modify_qp(qp, &a, rtr), EINVAL,
		     "path MTU over the port's active MTU");
	a.path_mtu = IBV_MTU_1024;
	a.ah_attr.grh.sgid_index = 6;
	cr_assert_eq(ibv_modify_qp(qp, &a, rtr), EINVAL, "empty source GID entry");
	a.ah_attr.grh.sgid_index = 3;
	cr_assert_eq(ibv_modify_qp(qp, &a, rtr), 0);
	a = (struct ibv_qp_attr){.qp_state = IBV_QPS_ERR};
	cr_assert_eq(ibv_modify_qp(qp, &a, IBV_QP_STATE), 0);
	/* posting in ERR flushes, signaled or not */
	cr_assert_eq(ibv_post_send(qp, &wr, &bad), 0);
	struct ibv_wc wc;
	int n = 0;
	for (int i = 0; i < 100000 && n == 0; i++) {
		n = ibv_poll_cq(cq, 1, &wc);
		if (!n)
			sched_yield();
	}
	cr_assert_eq(n, 1);
	cr_assert_eq(wc.status, IBV_WC_WR_FLUSH_ERR);
	cr_assert_eq(ibv_destroy_qp(qp), 0);
	cr_assert_eq(ibv_destroy_cq(cq), 0);
	cr_assert_eq(ibv_dealloc_pd(pd), 0);
	cr_assert_eq(ibv_close_device(ctx), 0);
}
