/*
 * desc: segment descriptors — the in-memory form (struct te_desc), its
 * protobuf encoding (proto/transfer.proto SegmentDesc, the value stored in
 * meta and returned by GetDescriptor), the validation of one received from
 * the network, and the range check every served request goes through.
 * Pure: no I/O, no clock.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "transfer.pb-c.h"
#include "transfer/te_int.h"

static const char *const xp_names[4] = {
	[TE_PROTO_TCP] = "tcp", [TE_PROTO_RDMA] = "rdma", [TE_PROTO_SHM] = "shm"};

long te__range_find(const void *base, size_t n, size_t stride, size_t addr_off, size_t len_off,
		    uint64_t addr, uint64_t len)
{
	const uint8_t *b = base;
	if (len == 0)
		len = 1;
	if (addr + (len - 1) < addr) /* the range itself wraps */
		return MC_EREMOTE_ACCESS;
	/* The last region whose start is <= addr. */
	size_t lo = 0, hi = n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		uint64_t a;
		memcpy(&a, b + mid * stride + addr_off, sizeof(a));
		if (a <= addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == 0)
		return MC_EREMOTE_ACCESS;
	uint64_t ra, rl;
	memcpy(&ra, b + (lo - 1) * stride + addr_off, sizeof(ra));
	memcpy(&rl, b + (lo - 1) * stride + len_off, sizeof(rl));
	/* addr >= ra; both ends inside without computing ra + rl (which a
	 * region at the top of the space may not fit). */
	if (addr - ra >= rl || len > rl - (addr - ra))
		return MC_EREMOTE_ACCESS;
	return (long)(lo - 1);
}

/* ------------------------------------------------------------ encode */

int te__desc_encode(const struct te_desc *d, uint8_t **out, size_t *len)
{
	Mooncake__Transfer__SegmentDesc m = MOONCAKE__TRANSFER__SEGMENT_DESC__INIT;
	Mooncake__Transfer__Region *regs = NULL, **regp = NULL;
	Mooncake__Transfer__Nic *nics = NULL, **nicp = NULL;
	char *xps[4];
	int rc = -ENOMEM;

	m.name = (char *)d->name;
	m.host = (char *)d->host;
	m.data_port = d->data_port;
	m.rpc_port = d->rpc_port;
	for (int i = 0; i < 4; i++)
		if ((d->transports & (1u << i)) && xp_names[i])
			xps[m.n_transports++] = (char *)xp_names[i];
	m.transports = xps;
	m.host_id = (char *)d->host_id;
	m.shm_socket = (char *)d->shm_socket;
	m.incarnation = d->incarnation;
	m.generation = d->generation;
	m.auth = d->auth;
	if (d->nregions) {
		regs = calloc(d->nregions, sizeof(*regs));
		regp = calloc(d->nregions, sizeof(*regp));
		if (!regs || !regp)
			goto out;
	}
	for (size_t i = 0; i < d->nregions; i++) {
		Mooncake__Transfer__Region init = MOONCAKE__TRANSFER__REGION__INIT;
		regs[i] = init;
		regs[i].addr = d->regions[i].addr;
		regs[i].len = d->regions[i].len;
		regs[i].shm = d->regions[i].shm;
		regs[i].n_rkeys = d->regions[i].nrkeys;
		regs[i].rkeys = (uint32_t *)d->regions[i].rkeys;
		regs[i].rdma_addr = d->regions[i].rdma_addr;
		regp[i] = &regs[i];
	}
	m.n_regions = d->nregions;
	m.regions = regp;
	if (d->nnics) {
		nics = calloc(d->nnics, sizeof(*nics));
		nicp = calloc(d->nnics, sizeof(*nicp));
		if (!nics || !nicp)
			goto out;
	}
	for (size_t i = 0; i < d->nnics; i++) {
		Mooncake__Transfer__Nic init = MOONCAKE__TRANSFER__NIC__INIT;
		nics[i] = init;
		nics[i].name = (char *)d->nics[i].name;
		nics[i].gid.data = (uint8_t *)d->nics[i].gid;
		nics[i].gid.len = sizeof(d->nics[i].gid);
		nics[i].lid = d->nics[i].lid;
		nics[i].port = d->nics[i].port;
		nics[i].mtu = d->nics[i].mtu;
		nicp[i] = &nics[i];
	}
	m.n_nics = d->nnics;
	m.nics = nicp;
	size_t n = protobuf_c_message_get_packed_size(&m.base);
	uint8_t *buf = malloc(n ? n : 1);
	if (!buf)
		goto out;
	protobuf_c_message_pack(&m.base, buf);
	*out = buf;
	*len = n;
	rc = 0;
out:
	free(regs);
	free(regp);
	free(nics);
	free(nicp);
	return rc;
}

/* ------------------------------------------------------------ decode */

static int copy_str(char *dst, size_t cap, const char *src)
{
	size_t n = strlen(src);
	if (n >= cap)
		return MC_EPROTOCOL;
	memcpy(dst, src, n + 1);
	return 0;
}

static int from_msg(const Mooncake__Transfer__SegmentDesc *m, struct te_desc *d)
{
	if (copy_str(d->name, sizeof(d->name), m->name) || !d->name[0] ||
	    copy_str(d->host, sizeof(d->host), m->host) ||
	    copy_str(d->host_id, sizeof(d->host_id), m->host_id) ||
	    copy_str(d->shm_socket, sizeof(d->shm_socket), m->shm_socket))
		return MC_EPROTOCOL;
	if (m->data_port > 65535 || m->rpc_port > 65535)
		return MC_EPROTOCOL;
	d->data_port = (uint16_t)m->data_port;
	d->rpc_port = (uint16_t)m->rpc_port;
	for (size_t i = 0; i < m->n_transports; i++)
		for (int j = 0; j < 4; j++)
			if (xp_names[j] && strcmp(m->transports[i], xp_names[j]) == 0)
				d->transports |= 1u << j;
	if ((d->transports & TE_XP_TCP) && (!d->host[0] || !d->data_port))
		return MC_EPROTOCOL;
	if ((d->transports & TE_XP_SHM) && (!d->shm_socket[0] || !d->host_id[0]))
		return MC_EPROTOCOL;
	d->incarnation = m->incarnation;
	d->generation = m->generation;
	d->auth = m->auth;

	if (m->n_nics > TE_MAX_NICS || m->n_regions > TE_MAX_REGIONS)
		return MC_EPROTOCOL;
	if (m->n_nics) {
		d->nics = calloc(m->n_nics, sizeof(*d->nics));
		if (!d->nics)
			return -ENOMEM;
	}
	d->nnics = m->n_nics;
	for (size_t i = 0; i < m->n_nics; i++) {
		const Mooncake__Transfer__Nic *n = m->nics[i];
		if (copy_str(d->nics[i].name, sizeof(d->nics[i].name), n->name) ||
		    (n->gid.len != 0 && n->gid.len != sizeof(d->nics[i].gid)))
			return MC_EPROTOCOL;
		if (n->gid.len)
			memcpy(d->nics[i].gid, n->gid.data, n->gid.len);
		d->nics[i].lid = n->lid;
		d->nics[i].port = n->port;
		d->nics[i].mtu = n->mtu;
	}
	if (m->n_regions) {
		d->regions = calloc(m->n_regions, sizeof(*d->regions));
		if (!d->regions)
			return -ENOMEM;
	}
	d->nregions = m->n_regions;
	for (size_t i = 0; i < m->n_regions; i++) {
		const Mooncake__Transfer__Region *r = m->regions[i];
		struct te_desc_region *o = &d->regions[i];
		if (r->len == 0 || r->addr + (r->len - 1) < r->addr)
			return MC_EPROTOCOL; /* empty or wrapping */
		if (i > 0) {
			const struct te_desc_region *p = &d->regions[i - 1];
			if (r->addr <= p->addr || r->addr - p->addr < p->len)
				return MC_EPROTOCOL; /* unsorted or overlapping */
		}
		if (r->n_rkeys > d->nnics)
			return MC_EPROTOCOL;
		/* rkeys and their base come together; the base range must
		 * not wrap either */
		if ((r->n_rkeys != 0) != (r->rdma_addr != 0) ||
		    r->rdma_addr + (r->len - 1) < r->rdma_addr)
			return MC_EPROTOCOL;
		o->addr = r->addr;
		o->len = r->len;
		o->shm = r->shm;
		o->nrkeys = (uint32_t)r->n_rkeys;
		o->rdma_addr = r->rdma_addr;
		if (r->n_rkeys)
			memcpy(o->rkeys, r->rkeys, r->n_rkeys * sizeof(uint32_t));
	}
	return 0;
}

int te__desc_from_pb(const struct Mooncake__Transfer__SegmentDesc *m, struct te_desc **out)
{
	struct te_desc *d = calloc(1, sizeof(*d));
	int rc = d ? from_msg(m, d) : -ENOMEM;
	if (rc) {
		te__desc_free(d);
		return rc;
	}
	*out = d;
	return 0;
}

int te__desc_decode(const uint8_t *buf, size_t len, struct te_desc **out)
{
	if (len > TE_DESC_MAX_BYTES)
		return MC_EPROTOCOL;
	Mooncake__Transfer__SegmentDesc *m = mooncake__transfer__segment_desc__unpack(
		NULL, len, buf);
	if (!m)
		return MC_EPROTOCOL;
	int rc = te__desc_from_pb(m, out);
	mooncake__transfer__segment_desc__free_unpacked(m, NULL);
	return rc;
}

int te__desc_copy(const struct te_desc *d, struct te_desc **out)
{
	struct te_desc *c = malloc(sizeof(*c));
	if (!c)
		return -ENOMEM;
	*c = *d;
	c->nics = NULL;
	c->regions = NULL;
	if (d->nnics) {
		c->nics = malloc(d->nnics * sizeof(*c->nics));
		if (!c->nics)
			goto fail;
		memcpy(c->nics, d->nics, d->nnics * sizeof(*c->nics));
	}
	if (d->nregions) {
		c->regions = malloc(d->nregions * sizeof(*c->regions));
		if (!c->regions)
			goto fail;
		memcpy(c->regions, d->regions, d->nregions * sizeof(*c->regions));
	}
	*out = c;
	return 0;
fail:
	te__desc_free(c);
	return -ENOMEM;
}

void te__desc_free(struct te_desc *d)
{
	if (!d)
		return;
	free(d->nics);
	free(d->regions);
	free(d);
}
