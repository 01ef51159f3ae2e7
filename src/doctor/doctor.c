/*
 * doctor: the node checks (see doctor.h). Each check reads what it needs
 * under the roots it was given and adds one row per thing it judged; a
 * file that cannot be read is a finding, never a crash. Order: RDMA (per
 * device and port: state, GID, MTU; per device: PCIe link, NUMA node),
 * /dev/infiniband, the daemon's process, the memory-lock limit, huge
 * pages, memory, socket buffers, logs.
 */
#include "doctor/doctor.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/sysmem.h"
#include "common/util.h"
#include "transfer/transfer.h"

#define GID_MAX 256
#define WANT_MTU 4096u
/* IB headers a RoCE packet carries inside the netdev's MTU (GRH, UDP,
 * BTH, XRC and AtomicETH extensions, ICRC), as the kernel's
 * iboe_get_mtu() takes them off. */
#define ROCE_HDR_BYTES 96u

/* ------------------------------------------------------------ report */

/* snprintf for the report's texts and paths, which are cut to their
 * buffers on purpose (a row is for people; a path past PATH_MAX fails to
 * open, which is a finding). */
static void sfmt(char *buf, size_t len, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void sfmt(char *buf, size_t len, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, len, fmt, ap);
	va_end(ap);
}

int doctor_add(struct doctor_report *r, enum doctor_verdict v, const char *check,
	       const char *value, const char *expected, const char *fix)
{
	if (r->n == r->cap) {
		size_t cap = r->cap ? r->cap * 2 : 32;
		struct doctor_row *n = realloc(r->rows, cap * sizeof(*n));
		if (!n)
			return -ENOMEM;
		r->rows = n;
		r->cap = cap;
	}
	struct doctor_row *row = &r->rows[r->n++];
	memset(row, 0, sizeof(*row));
	row->verdict = v;
	sfmt(row->check, sizeof(row->check), "%s", check ? check : "");
	sfmt(row->value, sizeof(row->value), "%s", value ? value : "");
	sfmt(row->expected, sizeof(row->expected), "%s", expected ? expected : "");
	sfmt(row->fix, sizeof(row->fix), "%s",
	     fix && v != DOCTOR_OK && v != DOCTOR_SKIP ? fix : "");
	return 0;
}

void doctor_report_free(struct doctor_report *r)
{
	free(r->rows);
	memset(r, 0, sizeof(*r));
}

enum doctor_verdict doctor_worst(const struct doctor_report *r)
{
	enum doctor_verdict w = DOCTOR_OK;
	for (size_t i = 0; i < r->n; i++)
		if (r->rows[i].verdict != DOCTOR_SKIP && r->rows[i].verdict > w)
			w = r->rows[i].verdict;
	return w;
}

const char *doctor_verdict_name(enum doctor_verdict v)
{
	switch (v) {
	case DOCTOR_OK:
		return "ok";
	case DOCTOR_WARN:
		return "warn";
	case DOCTOR_FAIL:
		return "FAIL";
	case DOCTOR_SKIP:
		return "-";
	}
	return "?";
}

/* ------------------------------------------------------------ files */

struct ctx {
	const struct doctor_env *env;
	struct doctor_report *r;
	int rc; /* the first -ENOMEM */
	/* learned on the way */
	unsigned rdma_devices, usable_ports;
	uint64_t segment_bytes;
	struct mc_meminfo mem;
	bool have_mem;
};

static const char *root(const char *r, const char *def)
{
	return r && *r ? r : def;
}

static void add(struct ctx *c, enum doctor_verdict v, const char *check, const char *value,
		const char *expected, const char *fix)
{
	if (c->rc == 0)
		c->rc = doctor_add(c->r, v, check, value, expected, fix);
}

/* Read a one-line file, trailing white space dropped. */
static int read_line(char *buf, size_t len, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static int read_line(char *buf, size_t len, const char *fmt, ...)
{
	char path[4096];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(path, sizeof(path), fmt, ap);
	va_end(ap);
	long n = mc_read_small_file(path, buf, len);
	if (n < 0) {
		buf[0] = '\0';
		return (int)n;
	}
	while (n > 0 && isspace((unsigned char)buf[n - 1]))
		buf[--n] = '\0';
	return 0;
}

/* Sort names numerically when both are numbers ("2" before "10"). */
static int names_cmp(const void *a, const void *b)
{
	const char *x = a, *y = b;
	if (isdigit((unsigned char)x[0]) && isdigit((unsigned char)y[0])) {
		long dx = strtol(x, NULL, 10), dy = strtol(y, NULL, 10);
		return dx < dy ? -1 : dx > dy;
	}
	return strcmp(x, y);
}

/* The names in a directory that start with prefix, sorted. Returns the
 * count (at most max), or a negative errno. */
static int list_dir(const char *path, const char *prefix, char names[][64], int max)
{
	DIR *d = opendir(path);
	if (!d)
		return -errno;
	int n = 0;
	for (struct dirent *e; (e = readdir(d)) && n < max;) {
		if (e->d_name[0] == '.' || strncmp(e->d_name, prefix, strlen(prefix)) != 0 ||
		    strlen(e->d_name) >= 64)
			continue;
		memcpy(names[n++], e->d_name, strlen(e->d_name) + 1);
	}
	closedir(d);
	qsort(names, (size_t)n, 64, names_cmp);
	return n;
}

/* "4: ACTIVE" -> "ACTIVE". */
static const char *after_colon(const char *s)
{
	const char *p = strchr(s, ':');
	if (!p)
		return s;
	p++;
	while (*p == ' ')
		p++;
	return p;
}

/* "fe80:0000:...:0001" (8 groups of 4 hex digits) -> 16 bytes. */
static bool parse_gid(const char *s, uint8_t raw[16])
{
	for (int g = 0; g < 8; g++) {
		char *end;
		unsigned long v = strtoul(s, &end, 16);
		if (end == s || v > 0xffff || (g < 7 && *end != ':'))
			return false;
		raw[2 * g] = (uint8_t)(v >> 8);
		raw[2 * g + 1] = (uint8_t)v;
		s = end + 1;
	}
	return true;
}

static void format_gid(const uint8_t raw[16], char *buf, size_t len)
{
	if (te_gid_v4mapped(raw)) {
		sfmt(buf, len, "::ffff:%u.%u.%u.%u", raw[12], raw[13], raw[14], raw[15]);
		return;
	}
	struct in6_addr a;
	memcpy(&a, raw, 16);
	if (!inet_ntop(AF_INET6, &a, buf, (socklen_t)len))
		sfmt(buf, len, "?");
}

static const char *gid_type_name(enum te_gid_type t)
{
	return t == TE_GID_ROCE_V2 ? "RoCE v2" : t == TE_GID_ROCE_V1 ? "RoCE v1" : "IB";
}

/* The largest IB MTU a RoCE port gets from its netdev's MTU. */
static unsigned roce_mtu(unsigned netdev_mtu)
{
	unsigned m = netdev_mtu > ROCE_HDR_BYTES ? netdev_mtu - ROCE_HDR_BYTES : 0;
	for (unsigned ib = 4096; ib >= 256; ib /= 2)
		if (m >= ib)
			return ib;
	return 0;
}

/* ------------------------------------------------------------ configuration */

static int cfg_gid_index(const struct cfg *cfg)
{
	const char *s = cfg_str(cfg, CFG_RDMA_GID_INDEX);
	char *end;
	long v = strtol(s, &end, 10);
	return strcmp(s, "auto") == 0 || *end || v < 0 || v > 255 ? -1 : (int)v;
}

static unsigned cfg_mtu_cap(const struct cfg *cfg)
{
	const char *s = cfg_str(cfg, CFG_RDMA_MTU);
	return strcmp(s, "auto") == 0 ? 0 : (unsigned)strtoul(s, NULL, 10);
}

static bool in_list(const char *list, const char *name)
{
	size_t n = strlen(name);
	for (const char *p = list; *p;) {
		size_t len = strcspn(p, ",");
		if (len == n && strncmp(p, name, n) == 0)
			return true;
		p += len + (p[len] == ',');
	}
	return false;
}

/* ------------------------------------------------------------ RDMA */

struct port_gids {
	struct te_gid_entry t[GID_MAX];
	char ndev[GID_MAX][32];
	size_t n;
};

static void read_gids(const char *base, struct port_gids *g)
{
	char names[GID_MAX][64], path[4096], buf[128];
	memset(g, 0, sizeof(*g));
	sfmt(path, sizeof(path), "%s/gids", base);
	int n = list_dir(path, "", names, GID_MAX);
	for (int i = 0; i < n; i++) {
		long idx = strtol(names[i], NULL, 10);
		if (idx < 0 || idx >= GID_MAX)
			continue;
		struct te_gid_entry *e = &g->t[idx];
		if ((size_t)idx + 1 > g->n)
			g->n = (size_t)idx + 1;
		if (read_line(buf, sizeof(buf), "%s/gids/%ld", base, idx) != 0 ||
		    !parse_gid(buf, e->raw))
			continue;
		/* An unset entry's type cannot be read (EINVAL). */
		if (read_line(buf, sizeof(buf), "%s/gid_attrs/types/%ld", base, idx) != 0)
			continue;
		e->type = strstr(buf, "v2")   ? TE_GID_ROCE_V2
			  : strstr(buf, "v1") ? TE_GID_ROCE_V1
					      : TE_GID_IB;
		e->valid = true;
		(void)read_line(g->ndev[idx], sizeof(g->ndev[idx]), "%s/gid_attrs/ndevs/%ld",
				base, idx);
	}
}

static void check_port(struct ctx *c, const char *sys, const char *dev, const char *port)
{
	const struct cfg *cfg = c->env->cfg;
	char base[4096], check[96], value[256], fix[400] = "", state[64], phys[64], ll[64],
						buf[64];
	sfmt(base, sizeof(base), "%s/class/infiniband/%s/ports/%s", sys, dev, port);
	if (read_line(state, sizeof(state), "%s/state", base) != 0)
		sfmt(state, sizeof(state), "unknown");
	if (read_line(phys, sizeof(phys), "%s/phys_state", base) != 0)
		sfmt(phys, sizeof(phys), "unknown");
	if (read_line(ll, sizeof(ll), "%s/link_layer", base) != 0)
		sfmt(ll, sizeof(ll), "InfiniBand");
	bool eth = strcmp(ll, "Ethernet") == 0;
	bool active = strcmp(after_colon(state), "ACTIVE") == 0;

	struct port_gids *g = malloc(sizeof(*g));
	if (!g) {
		c->rc = -ENOMEM;
		return;
	}
	read_gids(base, g);
	int want = cfg_gid_index(cfg);
	int pick = te_gid_pick(g->t, g->n, want);
	const char *ndev = pick >= 0 && g->ndev[pick][0] ? g->ndev[pick] : NULL;
	for (size_t i = 0; !ndev && i < g->n; i++)
		if (g->ndev[i][0])
			ndev = g->ndev[i];

	sfmt(check, sizeof(check), "rdma %s port %s: state", dev, port);
	sfmt(value, sizeof(value), "%s (%s), %s%s%s", after_colon(state), after_colon(phys),
	     eth ? "Ethernet (RoCE)" : ll, ndev ? ", netdev " : "", ndev ? ndev : "");
	sfmt(fix, sizeof(fix),
	     "the link is not up: check the cable and the switch port (phys_state "
	     "Polling: no peer, Disabled: shut down)%s%s%s",
	     eth && ndev ? "; ip link set " : "", eth && ndev ? ndev : "",
	     eth && ndev ? " up" : "");
	add(c, active ? DOCTOR_OK : DOCTOR_FAIL, check, value, "ACTIVE (LinkUp)", fix);

	/* The GID the daemon would pick. */
	sfmt(check, sizeof(check), "rdma %s port %s: GID", dev, port);
	enum doctor_verdict v;
	if (pick < 0) {
		v = DOCTOR_FAIL;
		if (want >= 0)
			sfmt(value, sizeof(value),
			     "--rdma-gid-index=%d is not a usable entry (table of %zu)", want,
			     g->n);
		else
			sfmt(value, sizeof(value), "no usable GID (table of %zu)", g->n);
		sfmt(fix, sizeof(fix), "%s",
		     want >= 0 ? "set --rdma-gid-index=auto, or to a RoCE v2 entry the "
				 "table has (gid_attrs/types)"
		     : eth     ? "give the interface an IPv4 address (RoCE GIDs follow the "
				 "netdev's addresses)"
			       : "the port has no GID: is the subnet manager running?");
	} else {
		char gs[64];
		format_gid(g->t[pick].raw, gs, sizeof(gs));
		sfmt(value, sizeof(value), "index %d: %s %s%s%s%s", pick,
		     gid_type_name(g->t[pick].type), gs, ndev ? " (" : "", ndev ? ndev : "",
		     ndev ? ")" : "");
		if (!eth) {
			v = DOCTOR_OK;
		} else if (g->t[pick].type == TE_GID_ROCE_V2 &&
			   te_gid_v4mapped(g->t[pick].raw)) {
			v = DOCTOR_OK;
		} else if (g->t[pick].type == TE_GID_ROCE_V2) {
			v = DOCTOR_WARN;
			sfmt(fix, sizeof(fix),
			     "no RoCE v2 GID with an IPv4 address: give %s an IPv4 address "
			     "(routed RoCE fabrics carry UDP/IPv4)",
			     ndev ? ndev : "the interface");
		} else {
			v = DOCTOR_FAIL;
			sfmt(fix, sizeof(fix),
			     "no RoCE v2 GID: RoCE v1 does not route beyond one L2 network; "
			     "enable RoCE v2 on the NIC and give %s an IPv4 address",
			     ndev ? ndev : "the interface");
		}
	}
	add(c, v, check, value,
	    eth ? "a RoCE v2 GID with an IPv4 address (what the daemon picks first)"
		: "a GID (InfiniBand)",
	    fix);

	/* Active MTU: sysfs when it has it, the RoCE netdev's, else verbs. */
	unsigned mtu = 0;
	char from[128] = "";
	if (read_line(buf, sizeof(buf), "%s/active_mtu", base) == 0 && atoi(buf) > 0) {
		mtu = (unsigned)atoi(buf);
		sfmt(from, sizeof(from), "sysfs");
	} else if (eth && ndev &&
		   read_line(buf, sizeof(buf), "%s/class/net/%s/mtu", sys, ndev) == 0 &&
		   atoi(buf) > 0) {
		mtu = roce_mtu((unsigned)atoi(buf));
		sfmt(from, sizeof(from), "netdev %s MTU %s", ndev, buf);
	} else {
		struct te_rdma_port_attr pa;
		int rc = te_rdma_query_port(dev, (unsigned)atoi(port), &pa);
		if (rc == 0) {
			mtu = pa.active_mtu_bytes;
			sfmt(from, sizeof(from), "libibverbs");
		} else {
			sfmt(from, sizeof(from), "not in sysfs, libibverbs: %s",
			     mc_strerror(rc));
		}
	}
	unsigned cap = cfg_mtu_cap(cfg);
	sfmt(check, sizeof(check), "rdma %s port %s: active MTU", dev, port);
	if (mtu == 0) {
		sfmt(value, sizeof(value), "unknown (%s)", from);
		v = active ? DOCTOR_WARN : DOCTOR_SKIP;
		sfmt(fix, sizeof(fix), "read it with ibv_devinfo -d %s (active_mtu)", dev);
	} else {
		if (cap && cap < mtu)
			sfmt(value, sizeof(value), "%u (%s), capped at %u by --rdma-mtu", mtu,
			     from, cap);
		else
			sfmt(value, sizeof(value), "%u (%s)", mtu, from);
		unsigned eff = cap && cap < mtu ? cap : mtu;
		v = eff >= WANT_MTU ? DOCTOR_OK : DOCTOR_WARN;
		if (cap && cap < mtu)
			sfmt(fix, sizeof(fix),
			     "--rdma-mtu=%u caps the path MTU: set it to auto", cap);
		else if (eth)
			sfmt(fix, sizeof(fix),
			     "raise %s's MTU to 9000 (ip link set %s mtu 9000, and on the "
			     "switch ports): RoCE's MTU is the netdev's less %u bytes of headers",
			     ndev ? ndev : "the interface", ndev ? ndev : "DEV",
			     ROCE_HDR_BYTES);
		else
			sfmt(fix, sizeof(fix),
			     "the subnet manager sets it: mtu=5 (4096) for "
			     "the partition (opensm partitions.conf)");
	}
	add(c, v, check, value, "4096", fix);
	if (active && pick >= 0)
		c->usable_ports++;
	free(g);
}

/* GT/s of a sysfs link speed ("16.0 GT/s PCIe", "8 GT/s"), 0 unknown. */
static double link_gts(const char *s)
{
	char *end;
	double v = strtod(s, &end);
	return end != s && strstr(end, "GT/s") ? v : 0;
}

static int pcie_gen(double gts)
{
	static const double g[] = {2.5, 5, 8, 16, 32, 64};
	for (int i = 0; i < 6; i++)
		if (gts <= g[i] + 0.01)
			return i + 1;
	return 0;
}

/* Data rate of a link in GB/s: 8b/10b up to Gen2, 128b/130b after. */
static double link_gbps(double gts, unsigned width)
{
	double eff = gts <= 5.01 ? 0.8 : 128.0 / 130.0;
	return gts * eff * width / 8;
}

static void check_pci(struct ctx *c, const char *sys, const char *dev)
{
	const struct cfg *cfg = c->env->cfg;
	char d[4096], cs[64], ms[64], cw[32], mw[32], check[96], value[256], exp[160],
		fix[400] = "", buf[32];
	sfmt(d, sizeof(d), "%s/class/infiniband/%s/device", sys, dev);
	sfmt(check, sizeof(check), "rdma %s: PCIe link", dev);
	if (read_line(cs, sizeof(cs), "%s/current_link_speed", d) != 0 ||
	    read_line(ms, sizeof(ms), "%s/max_link_speed", d) != 0 ||
	    read_line(cw, sizeof(cw), "%s/current_link_width", d) != 0 ||
	    read_line(mw, sizeof(mw), "%s/max_link_width", d) != 0) {
		add(c, DOCTOR_SKIP, check,
		    "no PCIe link in sysfs (a software device: rxe, siw?)", "", "");
	} else {
		double cg = link_gts(cs), mg = link_gts(ms);
		unsigned cwn = (unsigned)atoi(cw), mwn = (unsigned)atoi(mw);
		double cur = link_gbps(cg, cwn), max = link_gbps(mg, mwn);
		sfmt(value, sizeof(value), "Gen%d (%s) x%u = %.1f GB/s", pcie_gen(cg), cs, cwn,
		     cur);
		sfmt(exp, sizeof(exp), "Gen%d (%s) x%u = %.1f GB/s, the card's maximum",
		     pcie_gen(mg), ms, mwn, max);
		enum doctor_verdict v = DOCTOR_OK;
		if (cg <= 0 || mg <= 0 || !cwn || !mwn) {
			v = DOCTOR_WARN;
			sfmt(fix, sizeof(fix),
			     "the link speed reads '%s' x%s: check lspci -vv "
			     "LnkSta",
			     cs, cw);
		} else if (cur < max * 0.99) {
			double ratio = cur / max;
			v = ratio < 0.5 ? DOCTOR_FAIL : DOCTOR_WARN;
			sfmt(fix, sizeof(fix),
			     "the NIC runs at %.0f%% of its PCIe bandwidth: put it in a Gen%d x%u "
			     "slot (the slot's wiring, a riser or BIOS bifurcation can limit "
			     "it); a link that trains down when idle reads lower, so check "
			     "again under load",
			     ratio * 100, pcie_gen(mg), mwn);
		}
		add(c, v, check, value, exp, fix);
	}

	/* NUMA node of the NIC vs the segment's. */
	sfmt(check, sizeof(check), "rdma %s: NUMA node", dev);
	char names[64][64], path[4096];
	sfmt(path, sizeof(path), "%s/devices/system/node", sys);
	int nodes = list_dir(path, "node", names, 64);
	int nic = read_line(buf, sizeof(buf), "%s/numa_node", d) == 0 ? atoi(buf) : -1;
	const char *want = cfg_str(cfg, CFG_NUMA_NODE);
	if (nodes <= 1 || nic < 0) {
		sfmt(value, sizeof(value), "%s",
		     nic < 0 ? "none (one node, or not reported)" : "the only node");
		add(c, DOCTOR_SKIP, check, value, "", "");
		return;
	}
	sfmt(value, sizeof(value), "NIC on node %d of %d; segment %s%s", nic, nodes,
	     *want ? "bound to node " : "not bound (--numa-node empty)", want);
	sfmt(exp, sizeof(exp), "--numa-node=%d (the NIC's)", nic);
	bool ok = *want && atoi(want) == nic;
	sfmt(fix, sizeof(fix),
	     "set --numa-node=%d so the segment sits next to the NIC (traffic across "
	     "sockets costs bandwidth and latency)",
	     nic);
	add(c, ok ? DOCTOR_OK : DOCTOR_WARN, check, value, exp, fix);
}

static void check_rdma(struct ctx *c)
{
	const struct cfg *cfg = c->env->cfg;
	const char *sys = root(c->env->sysfs_root, "/sys");
	const char *proto = cfg_str(cfg, CFG_PROTOCOL);
	const char *filter = cfg_str(cfg, CFG_RDMA_DEVICES);
	char path[4096], names[32][64], value[256], fix[400] = "";
	sfmt(path, sizeof(path), "%s/class/infiniband", sys);
	int n = list_dir(path, "", names, 32);
	if (n < 0)
		n = 0;
	/* Every name --rdma-devices asks for must exist. */
	for (const char *p = filter; *p;) {
		size_t len = strcspn(p, ",");
		bool found = false;
		for (int i = 0; i < n && !found; i++)
			found = strlen(names[i]) == len && strncmp(names[i], p, len) == 0;
		if (!found) {
			sfmt(value, sizeof(value),
			     "--rdma-devices names %.*s, which is not in "
			     "%s",
			     (int)len, p, path);
			add(c, DOCTOR_FAIL, "rdma devices (--rdma-devices)", value,
			    "every device named exists",
			    "correct --rdma-devices (the names under /sys/class/infiniband)");
		}
		p += len + (p[len] == ',');
	}
	int kept = 0;
	char list[256] = "";
	for (int i = 0; i < n; i++) {
		if (*filter && !in_list(filter, names[i]))
			continue;
		sfmt(list + strlen(list), sizeof(list) - strlen(list), "%s%s",
		     kept ? ", " : "", names[i]);
		kept++;
	}
	c->rdma_devices = (unsigned)kept;
	bool want_rdma = strcmp(proto, "rdma") == 0;
	bool auto_p = strcmp(proto, "auto") == 0;
	if (kept == 0) {
		sfmt(value, sizeof(value), "none%s",
		     n ? " of those --rdma-devices names" : "");
		sfmt(fix, sizeof(fix), "%s",
		     want_rdma ? "--protocol=rdma needs an RDMA NIC with its driver loaded "
				 "(mlx5_ib, irdma, bnxt_re; rdma_rxe for software RoCE)"
			       : "transfers between hosts use tcp; for RDMA load the NIC's "
				 "driver (mlx5_ib, irdma, bnxt_re)");
		char exp[160] = "";
		if (want_rdma || auto_p)
			sfmt(exp, sizeof(exp), "at least one (--protocol=%s)", proto);
		add(c,
		    want_rdma ? DOCTOR_FAIL
		    : auto_p  ? DOCTOR_WARN
			      : DOCTOR_SKIP,
		    "rdma devices", value, exp, fix);
		return;
	}
	add(c, DOCTOR_OK, "rdma devices", list, "at least one", "");
	for (int i = 0; i < n; i++) {
		if (*filter && !in_list(filter, names[i]))
			continue;
		char ports[16][64];
		sfmt(path, sizeof(path), "%s/class/infiniband/%s/ports", sys, names[i]);
		int np = list_dir(path, "", ports, 16);
		for (int j = 0; j < np; j++)
			check_port(c, sys, names[i], ports[j]);
		check_pci(c, sys, names[i]);
	}

	/* The verbs devices the daemon opens. */
	const char *dev = root(c->env->dev_root, "/dev");
	char uv[16][64];
	sfmt(path, sizeof(path), "%s/infiniband", dev);
	int nu = list_dir(path, "uverbs", uv, 16);
	if (nu <= 0) {
		sfmt(value, sizeof(value), "no %s/uverbs*", path);
		add(c, DOCTOR_FAIL, "/dev/infiniband", value,
		    "uverbs devices readable and writable by the daemon's user",
		    "load ib_uverbs (modprobe ib_uverbs); containers need --device=/dev/infiniband");
		return;
	}
	char bad[128] = "";
	for (int i = 0; i < nu; i++) {
		char f[4096];
		sfmt(f, sizeof(f), "%s/%s", path, uv[i]);
		if (access(f, R_OK | W_OK) != 0)
			sfmt(bad + strlen(bad), sizeof(bad) - strlen(bad), "%s%s",
			     *bad ? " " : "", uv[i]);
	}
	char f0[4096];
	struct stat st;
	sfmt(f0, sizeof(f0), "%s/%s", path, uv[0]);
	unsigned mode = stat(f0, &st) == 0 ? (unsigned)st.st_mode & 0777 : 0;
	sfmt(value, sizeof(value), "%d uverbs device%s, mode %03o%s%s", nu, nu == 1 ? "" : "s",
	     mode, *bad ? "; no read-write access to " : "", bad);
	add(c, *bad ? DOCTOR_FAIL : DOCTOR_OK, "/dev/infiniband", value,
	    "uverbs devices readable and writable by the daemon's user",
	    "give the daemon's user access (udev: MODE=\"0666\" for uverbs*, or the rdma group)");
}

/* ------------------------------------------------------------ process, memory */

/*
 * With no daemon running, the memory-lock limit it will start with is
 * its unit's: LimitMEMLOCK= of the first mooncaked unit installed that
 * sets it — the agent's own unit, then the template (the shipped one
 * leaves it to meta and master), then the all-in-one, since systemd
 * prefers an instance's own file to the template wherever each is; each
 * in <etc>/systemd/system first, then the unit directories of the root
 * <etc> is in — and whether it runs as root (no User=), which has
 * CAP_IPC_LOCK. Returns false when no unit sets it.
 */
static bool unit_memlock(const struct doctor_env *env, uint64_t *soft, bool *root_user,
			 char *unit, size_t len)
{
	const char *etc = root(env->etc_root, "/etc");
	size_t el = strlen(etc);
	char base[2048];
	/* "/x/etc" -> "/x": where the other unit directories are. */
	sfmt(base, sizeof(base), "%.*s",
	     el >= 4 && strcmp(etc + el - 4, "/etc") == 0 ? (int)(el - 4) : 0, etc);
	static const char *const dirs[] = {"/systemd/system", "/usr/local/lib/systemd/system",
					   "/lib/systemd/system", "/usr/lib/systemd/system"};
	static const char *const names[] = {"mooncaked@agent.service", "mooncaked@.service",
					    "mooncaked.service"};
	for (size_t i = 0; i < MC_ARRAY_LEN(names); i++) {
		char dir[4096], path[4200], text[16384];
		for (size_t d = 0; d < MC_ARRAY_LEN(dirs); d++) {
			sfmt(dir, sizeof(dir), "%s%s", d == 0 ? etc : base, dirs[d]);
			sfmt(path, sizeof(path), "%s/%s", dir, names[i]);
			if (mc_read_small_file(path, text, sizeof(text)) < 0)
				continue;
			const char *l = strstr(text, "\nLimitMEMLOCK=");
			if (!l)
				continue;
			char v[64];
			sfmt(v, sizeof(v), "%.*s", (int)strcspn(l + 14, ":\n"), l + 14);
			if (strcmp(v, "infinity") == 0)
				*soft = MC_UNLIMITED;
			else if (cfg_parse_size(v, soft) != 0)
				continue;
			const char *u = strstr(text, "\nUser=");
			*root_user = !u || strncmp(u + 6, "root\n", 5) == 0;
			sfmt(unit, len, "%s", path);
			return true;
		}
	}
	return false;
}

static void check_memory(struct ctx *c)
{
	const struct doctor_env *env = c->env;
	const struct cfg *cfg = env->cfg;
	const char *proc = root(env->procfs_root, "/proc");
	char value[256], exp[160], fix[400] = "", why[512] = "", seg[32], a[32], b[32],
				   buf[8192];

	/* Whose limits: the daemon's when one runs, else this process's. */
	char who[32];
	if (env->pid > 0)
		sfmt(who, sizeof(who), "%d", env->pid);
	else
		sfmt(who, sizeof(who), "self");
	if (env->pid > 0)
		sfmt(value, sizeof(value), "pid %d", env->pid);
	else if (env->daemon_running)
		sfmt(value, sizeof(value), "this daemon (pid %d)", (int)getpid());
	else
		sfmt(value, sizeof(value),
		     "none found: the limits below are its unit's, or "
		     "else this shell's");
	add(c, DOCTOR_SKIP, "daemon process", value, "", "");

	c->have_mem = mc_meminfo_read(proc, &c->mem) == 0;
	uint64_t seg_cfg = cfg_u64(cfg, CFG_GLOBAL_SEGMENT_SIZE);
	c->segment_bytes = seg_cfg ? seg_cfg : mc_default_segment_bytes(c->mem.total_bytes);
	mc_format_bytes(c->segment_bytes, seg, sizeof(seg));
	const char *hp = cfg_str(cfg, CFG_HUGEPAGES);
	struct mc_fit_in in = {
		.segment_bytes = c->segment_bytes,
		.buffer_bytes = cfg_u64(cfg, CFG_LOCAL_BUFFER_SIZE),
		.memlock_bytes = MC_UNLIMITED,
		.hugepages = strcmp(hp, "on") == 0    ? MC_FIT_HUGE_ON
			     : strcmp(hp, "off") == 0 ? MC_FIT_HUGE_OFF
						      : MC_FIT_HUGE_AUTO,
		.mem = c->mem,
	};

	/* Memory-lock limit, when RDMA pins the segment. */
	const char *proto = cfg_str(cfg, CFG_PROTOCOL);
	in.pins = strcmp(proto, "rdma") == 0 ||
		  (strcmp(proto, "auto") == 0 && c->usable_ports);
	uint64_t soft = 0, hard = 0;
	char path[4096], unit[4096];
	bool cap = false, root_user = false, have_lim = true;
	if (env->pid <= 0 && !env->daemon_running &&
	    unit_memlock(env, &soft, &root_user, unit, sizeof(unit))) {
		/* No daemon: what its unit will give it, not this shell. */
		mc_format_bytes(soft, a, sizeof(a));
		cap = root_user;
		sfmt(value, sizeof(value), "%s from %s%s", a, unit,
		     cap ? " (as root: CAP_IPC_LOCK, the limit does not apply)" : "");
	} else {
		sfmt(path, sizeof(path), "%s/%s/limits", proc, who);
		have_lim = mc_read_small_file(path, buf, sizeof(buf)) >= 0 &&
			   mc_limits_memlock_parse(buf, &soft, &hard) == 0;
		sfmt(path, sizeof(path), "%s/%s/status", proc, who);
		if (mc_read_small_file(path, buf, sizeof(buf)) < 0 ||
		    mc_status_ipc_lock_parse(buf, &cap) != 0)
			cap = false;
		mc_format_bytes(soft, a, sizeof(a));
		mc_format_bytes(hard, b, sizeof(b));
		if (!have_lim)
			sfmt(value, sizeof(value), "unknown (%s/%s/limits)", proc, who);
		else
			sfmt(value, sizeof(value), "%s (hard %s)%s", a, b,
			     cap ? ", CAP_IPC_LOCK: the limit does not apply" : "");
	}
	sfmt(exp, sizeof(exp), "at least the segment (%s) when RDMA pins it", seg);
	in.memlock_bytes = have_lim ? soft : MC_UNLIMITED;
	in.cap_ipc_lock = cap;
	struct mc_fit_in ml = in;
	ml.mem.available_bytes = UINT64_MAX; /* judge the limit alone */
	ml.hugepages = MC_FIT_HUGE_OFF;
	ml.buffer_bytes = 0;
	enum doctor_verdict v;
	if (!in.pins) {
		v = DOCTOR_SKIP;
		sfmt(exp, sizeof(exp), "nothing is pinned (no RDMA)");
	} else if (mc_segment_fit(&ml, why, sizeof(why)) == MC_FIT_MEMLOCK) {
		v = DOCTOR_FAIL;
	} else {
		v = have_lim ? DOCTOR_OK : DOCTOR_WARN;
		sfmt(why, sizeof(why), "cannot read the limit: run where the daemon runs");
	}
	add(c, v, "memory-lock limit (RLIMIT_MEMLOCK)", value, exp, why);

	if (!c->have_mem) {
		sfmt(value, sizeof(value), "cannot read %s/meminfo", proc);
		add(c, DOCTOR_WARN, "memory available", value, "", "run on the node itself");
		return;
	}

	/* Huge pages. */
	uint64_t hps = c->mem.huge_page_bytes ? c->mem.huge_page_bytes : (2u << 20);
	uint64_t need = (c->segment_bytes + hps - 1) / hps;
	mc_format_bytes(hps, a, sizeof(a));
	sfmt(value, sizeof(value), "%" PRIu64 " of %" PRIu64 " free (%s pages)",
	     c->mem.huge_free, c->mem.huge_total, a);
	sfmt(exp, sizeof(exp), "%" PRIu64 " free for the %s segment (--hugepages=%s)", need,
	     seg, hp);
	if (in.hugepages == MC_FIT_HUGE_OFF) {
		v = DOCTOR_SKIP;
	} else if (c->mem.huge_free >= need) {
		v = DOCTOR_OK;
	} else {
		v = in.hugepages == MC_FIT_HUGE_ON ? DOCTOR_FAIL : DOCTOR_WARN;
		sfmt(fix, sizeof(fix),
		     "reserve them: sysctl -w vm.nr_hugepages=%" PRIu64
		     " (persist it in /etc/sysctl.d; at boot they are easier to get)%s",
		     c->mem.huge_total + (need - c->mem.huge_free),
		     v == DOCTOR_WARN ? "; without them the segment uses 4 KiB pages" : "");
	}
	add(c, v, "huge pages", value, exp, fix);

	/* Memory available. */
	mc_format_bytes(c->mem.available_bytes, a, sizeof(a));
	mc_format_bytes(c->mem.total_bytes, b, sizeof(b));
	sfmt(value, sizeof(value), "%s of %s", a, b);
	mc_format_bytes(in.buffer_bytes, a, sizeof(a));
	sfmt(exp, sizeof(exp), "the segment (%s%s) and a client buffer (%s)", seg,
	     seg_cfg ? "" : ", --global-segment-size=0's", a);
	struct mc_fit_in ram = in;
	ram.pins = false;
	if (ram.hugepages == MC_FIT_HUGE_ON)
		ram.hugepages = MC_FIT_HUGE_AUTO; /* judged above */
	enum mc_fit f = mc_segment_fit(&ram, why, sizeof(why));
	add(c, f == MC_FIT_RAM ? DOCTOR_FAIL : DOCTOR_OK, "memory available", value, exp, why);
}

static uint64_t sysctl_u64(const char *proc, const char *name, int field)
{
	char buf[256];
	if (read_line(buf, sizeof(buf), "%s/sys/%s", proc, name) != 0)
		return 0;
	const char *p = buf;
	for (int i = 0; i < field && p; i++) {
		p = strpbrk(p, " \t");
		while (p && (*p == ' ' || *p == '\t'))
			p++;
	}
	return p ? strtoull(p, NULL, 10) : 0;
}

static void check_net(struct ctx *c)
{
	const char *proc = root(c->env->procfs_root, "/proc");
	uint64_t rmax = sysctl_u64(proc, "net/core/rmem_max", 0);
	uint64_t wmax = sysctl_u64(proc, "net/core/wmem_max", 0);
	uint64_t tr = sysctl_u64(proc, "net/ipv4/tcp_rmem", 2);
	uint64_t tw = sysctl_u64(proc, "net/ipv4/tcp_wmem", 2);
	char a[32], b[32], d[32], e[32], value[256], want[32];
	mc_format_bytes(rmax, a, sizeof(a));
	mc_format_bytes(wmax, b, sizeof(b));
	mc_format_bytes(tr, d, sizeof(d));
	mc_format_bytes(tw, e, sizeof(e));
	mc_format_bytes(TE_TCP_SOCKBUF_BYTES, want, sizeof(want));
	sfmt(value, sizeof(value),
	     "rmem_max %s, wmem_max %s, tcp_rmem max %s, tcp_wmem max %s", a, b, d, e);
	bool ok = (rmax >= TE_TCP_SOCKBUF_BYTES || tr >= TE_TCP_SOCKBUF_BYTES) &&
		  (wmax >= TE_TCP_SOCKBUF_BYTES || tw >= TE_TCP_SOCKBUF_BYTES);
	char exp[160];
	sfmt(exp, sizeof(exp), "%s or more, by autotuning (tcp_[rw]mem) or [rw]mem_max", want);
	add(c, ok ? DOCTOR_OK : DOCTOR_WARN, "socket buffers (net.core.rmem_max/wmem_max)",
	    value, exp,
	    "tcp transfers are held back by small socket buffers: sysctl -w "
	    "net.core.rmem_max=67108864 net.core.wmem_max=67108864 (persist in /etc/sysctl.d)");
}

static void check_logs(struct ctx *c)
{
	const struct cfg *cfg = c->env->cfg;
	const char *lvl = cfg_str(cfg, CFG_LOG_LEVEL);
	const char *file = cfg_str(cfg, CFG_LOG_FILE);
	uint64_t max = cfg_u64(cfg, CFG_LOG_MAX_SIZE);
	char lr[4096], value[256], sz[32];
	sfmt(lr, sizeof(lr), "%s/logrotate.d/mooncaked", root(c->env->etc_root, "/etc"));
	bool logrotate = access(lr, F_OK) == 0;
	bool verbose = strcasestr(lvl, "debug") || strcasestr(lvl, "trace");
	mc_format_bytes(max, sz, sizeof(sz));
	if (!*file)
		sfmt(value, sizeof(value), "%s, to stderr (journald)", lvl);
	else if (max)
		sfmt(value, sizeof(value), "%s, %s rotated at %s, %" PRIu64 " kept", lvl, file,
		     sz, cfg_u64(cfg, CFG_LOG_MAX_FILES));
	else
		sfmt(value, sizeof(value), "%s, %s, %s", lvl, file,
		     logrotate ? "rotated by logrotate" : "never rotated");
	enum doctor_verdict v = DOCTOR_OK;
	const char *fix = "";
	if (*file && !max && !logrotate) {
		v = DOCTOR_WARN;
		fix = "the log file grows without bound: set --log-max-size (e.g. 256M) or "
		      "install deploy/logrotate/mooncaked in /etc/logrotate.d";
	} else if (verbose && !*file) {
		v = DOCTOR_WARN;
		fix = "DEBUG to journald is rate-limited and fills the journal: log to "
		      "--log-file with --log-max-size, or lower --log-level";
	}
	add(c, v, "log level and size policy", value,
	    "a bounded log: --log-max-size, logrotate, or journald", fix);
}

int doctor_node_checks(const struct doctor_env *env, struct doctor_report *r)
{
	struct ctx c = {.env = env, .r = r};
	/* RDMA and the segment concern the agent; every role has logs. */
	if (cfg_roles(env->cfg) & CFG_ROLE_AGENT) {
		check_rdma(&c);
		check_memory(&c);
	}
	check_net(&c);
	check_logs(&c);
	return c.rc;
}
