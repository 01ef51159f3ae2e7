/*
 * rdma_dev: which RDMA devices and ports the rdma layer uses (rdma.h,
 * step 1): list the devices, keep those of opts.devices (each name asked
 * for must exist), open each, take its first ACTIVE port with a usable
 * GID (te_gid_pick, the rule mooncakectl doctor shares) and its MTU; when
 * none is usable, say why in one sentence and return the code of the
 * furthest any device got. Also te_rdma_query_port for the doctor.
 */
#include <errno.h>
#include <stdarg.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <string.h>

#include "common/util.h"
#include "transfer/rdma.h"
#include "transfer/rdma_int.h"
#include "transfer/transfer.h"

void te_rdma__why(char *why, size_t len, const char *fmt, ...)
{
	if (!why || !len)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, len, fmt, ap);
	va_end(ap);
}

void te_rdma__why_add(char *buf, size_t len, const char *fmt, ...)
{
	size_t used = strlen(buf);
	if (used + 1 >= len)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf + used, len - used, fmt, ap);
	va_end(ap);
}

unsigned te_rdma__mtu_bytes(enum ibv_mtu m)
{
	return (m >= IBV_MTU_256 && m <= IBV_MTU_4096) ? 128u << m : 0;
}

/* How far a candidate device got; te_rdma_new reports the furthest
 * stage any device reached. */
enum stage { ST_OPEN_FAIL = 1, ST_PERM, ST_NO_PORT, ST_NO_GID, ST_USABLE };

static bool in_list(const char *list, const char *name)
{
	size_t n = strlen(name);
	for (const char *p = list; *p;) {
		size_t len = strcspn(p, ",");
		if (len == n && strncmp(p, name, n) == 0)
			return true;
		p += len;
		if (*p == ',')
			p++;
	}
	return false;
}

/* Choose the GID of a port (te_gid_pick, shared with mooncakectl doctor)
 * from its table as the verbs report it. */
static int pick_gid(struct ibv_context *ctx, uint8_t port, const struct ibv_port_attr *pa,
		    int want, struct ibv_gid_entry *out)
{
	struct te_gid_entry t[256];
	size_t n = pa->gid_tbl_len > 0 ? MC_MIN((size_t)pa->gid_tbl_len, MC_ARRAY_LEN(t)) : 0;
	for (size_t i = 0; i < n; i++) {
		struct ibv_gid_entry e;
		memset(&t[i], 0, sizeof(t[i]));
		if ((want >= 0 && (size_t)want != i) ||
		    ibv_query_gid_ex(ctx, port, (uint32_t)i, &e, 0))
			continue;
		memcpy(t[i].raw, e.gid.raw, 16);
		t[i].type = e.gid_type == IBV_GID_TYPE_ROCE_V2   ? TE_GID_ROCE_V2
			    : e.gid_type == IBV_GID_TYPE_ROCE_V1 ? TE_GID_ROCE_V1
								 : TE_GID_IB;
		t[i].valid = true;
	}
	int best = te_gid_pick(t, n, want);
	if (best >= 0 && ibv_query_gid_ex(ctx, port, (uint32_t)best, out, 0))
		return -1;
	return best;
}

/* Open one device and find its first usable port; fills d on success. */
static enum stage probe_dev(struct ibv_device *ibd, const struct te_rdma_opts *o,
			    struct rdev *d, char *why, size_t why_len)
{
	int gid_index = o->gid_index;
	const char *name = ibv_get_device_name(ibd);
	struct ibv_context *ctx = ibv_open_device(ibd);
	if (!ctx) {
		int e = errno;
		te_rdma__why_add(why, why_len, "%s: cannot open (%s%s); ", name, strerror(e),
				 e == EACCES || e == EPERM
					 ? ": no permission on /dev/infiniband/uverbs*"
					 : "");
		return e == EACCES || e == EPERM ? ST_PERM : ST_OPEN_FAIL;
	}
	if (ibv_query_device(ctx, &d->attr)) {
		te_rdma__why_add(why, why_len, "%s: ibv_query_device failed; ", name);
		ibv_close_device(ctx);
		return ST_OPEN_FAIL;
	}
	enum stage reached = ST_NO_PORT;
	for (uint8_t port = 1; port <= d->attr.phys_port_cnt; port++) {
		struct ibv_port_attr pa;
		struct ibv_gid_entry g;
		if (ibv_query_port(ctx, port, &pa))
			continue;
		if (pa.state != IBV_PORT_ACTIVE) {
			te_rdma__why_add(why, why_len, "%s: port %u is %s, not ACTIVE; ", name,
					 port, ibv_port_state_str(pa.state));
			continue;
		}
		reached = ST_NO_GID;
		int gi = pick_gid(ctx, port, &pa, gid_index, &g);
		if (gi < 0) {
			if (gid_index >= 0)
				te_rdma__why_add(why, why_len,
						 "%s: port %u: GID index %d is not valid "
						 "(table of %d); ",
						 name, port, gid_index, pa.gid_tbl_len);
			else
				te_rdma__why_add(why, why_len,
						 "%s: port %u has no usable GID "
						 "(no IP address on the interface?); ",
						 name, port);
			continue;
		}
		d->ctx = ctx;
		d->mtu = pa.active_mtu;
		while (o->mtu_bytes && te_rdma__mtu_bytes(d->mtu) > o->mtu_bytes &&
		       d->mtu > IBV_MTU_256)
			d->mtu = (enum ibv_mtu)(d->mtu - 1);
		snprintf(d->info.name, sizeof(d->info.name), "%s", name);
		d->info.port = port;
		d->info.gid_index = (uint8_t)gi;
		d->info.gid_type = (uint8_t)g.gid_type;
		memcpy(d->info.gid, g.gid.raw, 16);
		d->info.lid = pa.lid;
		d->info.mtu_bytes = te_rdma__mtu_bytes(d->mtu);
		return ST_USABLE;
	}
	ibv_close_device(ctx);
	return reached;
}

int te_rdma_query_port(const char *device, unsigned port, struct te_rdma_port_attr *out)
{
	int num = 0, rc = -ENODEV;
	if (te_rdma__static_providers)
		te_rdma__static_providers();
	struct ibv_device **list = ibv_get_device_list(&num);
	if (!list)
		return errno == EACCES || errno == EPERM ? -EACCES : -ENODEV;
	for (int i = 0; i < num; i++) {
		if (strcmp(ibv_get_device_name(list[i]), device) != 0)
			continue;
		struct ibv_context *ctx = ibv_open_device(list[i]);
		if (!ctx) {
			rc = errno == EACCES || errno == EPERM ? -EACCES
							       : -(errno ? errno : EIO);
			break;
		}
		struct ibv_device_attr da;
		struct ibv_port_attr pa;
		if (ibv_query_device(ctx, &da)) {
			rc = -EIO;
		} else if (port < 1 || port > da.phys_port_cnt) {
			rc = -ENOENT;
		} else if ((rc = ibv_query_port(ctx, (uint8_t)port, &pa)) != 0) {
			rc = rc > 0 ? -rc : -EIO;
		} else {
			memset(out, 0, sizeof(*out));
			out->state = (unsigned)pa.state;
			out->active_mtu_bytes = te_rdma__mtu_bytes(pa.active_mtu);
			out->max_mtu_bytes = te_rdma__mtu_bytes(pa.max_mtu);
			out->gid_tbl_len = pa.gid_tbl_len > 0 ? (unsigned)pa.gid_tbl_len : 0;
			out->ethernet = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
			rc = 0;
		}
		ibv_close_device(ctx);
		break;
	}
	ibv_free_device_list(list);
	return rc;
}

int te_rdma__select_devices(const struct te_rdma_opts *o, struct rdev *dev, unsigned *n,
			    char *why, size_t why_len)
{
	int num = 0;
	char reasons[512] = "";
	enum stage furthest = 0;
	if (te_rdma__static_providers)
		te_rdma__static_providers();
	struct ibv_device **list = ibv_get_device_list(&num);
	if (!list || num <= 0) {
		int e = list ? 0 : errno;
		if (list)
			ibv_free_device_list(list);
		if (e == EACCES || e == EPERM) {
			te_rdma__why(why, why_len, "no permission to list RDMA devices (%s)",
				     strerror(e));
			return -EACCES;
		}
		te_rdma__why(why, why_len,
			     "no RDMA devices found (no RDMA NIC or no kernel support)");
		return -ENODEV;
	}
	const char *filter = o->devices;
	bool all = !filter || !*filter || strcmp(filter, "auto") == 0;
	if (!all) {
		/* every name asked for must exist */
		for (const char *p = filter; *p;) {
			size_t len = strcspn(p, ",");
			bool found = false;
			for (int i = 0; i < num && !found; i++)
				found = strlen(ibv_get_device_name(list[i])) == len &&
					strncmp(ibv_get_device_name(list[i]), p, len) == 0;
			if (!found) {
				char avail[256] = "";
				for (int i = 0; i < num; i++)
					te_rdma__why_add(avail, sizeof(avail), "%s%s",
							 i ? "," : "",
							 ibv_get_device_name(list[i]));
				te_rdma__why(why, why_len,
					     "RDMA device '%.*s' not found (devices: %s)",
					     (int)len, p, avail);
				ibv_free_device_list(list);
				return -ENODEV;
			}
			p += len;
			if (*p == ',')
				p++;
		}
	}
	*n = 0;
	for (int i = 0; i < num && *n < TE_RDMA_MAX_NICS; i++) {
		if (!all && !in_list(filter, ibv_get_device_name(list[i])))
			continue;
		enum stage s = probe_dev(list[i], o, &dev[*n], reasons, sizeof(reasons));
		if (s == ST_USABLE)
			(*n)++;
		else if (s > furthest)
			furthest = s;
	}
	ibv_free_device_list(list);
	if (*n > 0)
		return 0;
	size_t rl = strlen(reasons);
	if (rl >= 2 && reasons[rl - 2] == ';')
		reasons[rl - 2] = 0;
	switch (furthest) {
	case ST_PERM:
		te_rdma__why(why, why_len, "no permission to open the RDMA devices: %s",
			     reasons);
		return -EACCES;
	case ST_NO_GID:
		te_rdma__why(why, why_len, "no usable GID: %s", reasons);
		return -EADDRNOTAVAIL;
	case ST_NO_PORT:
		te_rdma__why(why, why_len, "no ACTIVE RDMA port: %s", reasons);
		return -ENETDOWN;
	default:
		te_rdma__why(why, why_len, "no usable RDMA device: %s", reasons);
		return -ENODEV;
	}
}
