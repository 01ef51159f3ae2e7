/*
 * test_te_desc: segment descriptors (transfer/desc.c) — the protobuf
 * round trip, everything decode refuses (unsorted, overlapping, empty or
 * wrapping regions, too many NICs, bad GIDs, rkeys without NICs, missing
 * ports for offered transports, oversized strings, garbage), and the
 * range check: inside, at the edges, past the end, before the first,
 * between regions, overflowing, and a region that ends at the top of the
 * address space.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "transfer.pb-c.h"
#include "transfer/te_int.h"

static struct te_desc *sample(size_t nregions)
{
	struct te_desc *d = calloc(1, sizeof(*d));
	strcpy(d->name, "node-a:12345");
	strcpy(d->host, "10.1.2.3");
	d->data_port = 40000;
	d->rpc_port = 12345;
	d->transports = TE_XP_TCP | TE_XP_SHM;
	strcpy(d->host_id, "boot-id");
	strcpy(d->shm_socket, "mooncake-te-1-abc");
	d->incarnation = 0x1122334455667788ull;
	d->generation = 42;
	d->auth = true;
	d->nnics = 2;
	d->nics = calloc(2, sizeof(*d->nics));
	strcpy(d->nics[0].name, "mlx5_0");
	d->nics[0].gid[15] = 1;
	d->nics[0].mtu = 4096;
	strcpy(d->nics[1].name, "mlx5_1");
	d->nregions = nregions;
	d->regions = calloc(nregions ? nregions : 1, sizeof(*d->regions));
	for (size_t i = 0; i < nregions; i++) {
		d->regions[i].addr = 0x10000 + i * 0x3000;
		d->regions[i].len = 0x2000;
		d->regions[i].shm = i % 2;
		d->regions[i].nrkeys = 2;
		d->regions[i].rkeys[0] = (uint32_t)i;
		d->regions[i].rkeys[1] = (uint32_t)i + 100;
		d->regions[i].rdma_addr = 0x7f0000000000ull + i * 0x10000;
	}
	return d;
}

static int recode(const struct te_desc *d, struct te_desc **out)
{
	uint8_t *buf;
	size_t len;
	cr_assert_eq(te__desc_encode(d, &buf, &len), 0);
	int rc = te__desc_decode(buf, len, out);
	free(buf);
	return rc;
}

Test(te_desc, round_trip)
{
	struct te_desc *d = sample(5), *g;
	cr_assert_eq(recode(d, &g), 0);
	cr_assert_str_eq(g->name, d->name);
	cr_assert_str_eq(g->host, d->host);
	cr_assert_eq(g->data_port, 40000);
	cr_assert_eq(g->rpc_port, 12345);
	cr_assert_eq(g->transports, TE_XP_TCP | TE_XP_SHM);
	cr_assert_str_eq(g->host_id, "boot-id");
	cr_assert_str_eq(g->shm_socket, d->shm_socket);
	cr_assert_eq(g->incarnation, d->incarnation);
	cr_assert_eq(g->generation, 42);
	cr_assert(g->auth);
	cr_assert_eq(g->nnics, 2);
	cr_assert_str_eq(g->nics[0].name, "mlx5_0");
	cr_assert_eq(g->nics[0].gid[15], 1);
	cr_assert_eq(g->nics[0].mtu, 4096);
	cr_assert_eq(g->nregions, 5);
	for (size_t i = 0; i < 5; i++) {
		cr_assert_eq(g->regions[i].addr, d->regions[i].addr);
		cr_assert_eq(g->regions[i].len, d->regions[i].len);
		cr_assert_eq(g->regions[i].shm, d->regions[i].shm);
		cr_assert_eq(g->regions[i].nrkeys, 2);
		cr_assert_eq(g->regions[i].rkeys[1], i + 100);
		cr_assert_eq(g->regions[i].rdma_addr, d->regions[i].rdma_addr);
	}
	struct te_desc *c;
	cr_assert_eq(te__desc_copy(g, &c), 0);
	cr_assert_eq(c->regions[4].addr, g->regions[4].addr);
	cr_assert_neq(c->regions, g->regions);
	te__desc_free(c);
	te__desc_free(g);
	te__desc_free(d);

	d = sample(0);
	cr_assert_eq(recode(d, &g), 0);
	cr_assert_eq(g->nregions, 0);
	te__desc_free(g);
	te__desc_free(d);
}

Test(te_desc, refusals)
{
	struct te_desc *d, *g;

	d = sample(3);
	d->regions[1].addr = d->regions[0].addr; /* unsorted/duplicate */
	cr_assert_eq(recode(d, &g), MC_EPROTOCOL);
	d->regions[1].addr = d->regions[0].addr + d->regions[0].len - 1; /* overlap */
	cr_assert_eq(recode(d, &g), MC_EPROTOCOL);
	d->regions[1].addr = d->regions[0].addr + d->regions[0].len; /* adjacent: ok */
	d->regions[2].addr = d->regions[1].addr + 0x4000;
	cr_assert_eq(recode(d, &g), 0);
	te__desc_free(g);
	d->regions[2].len = 0;
	cr_assert_eq(recode(d, &g), MC_EPROTOCOL);
	d->regions[2].addr = UINT64_MAX - 10;
	d->regions[2].len = 12; /* wraps */
	cr_assert_eq(recode(d, &g), MC_EPROTOCOL);
	d->regions[2].len = 11; /* ends exactly at the top: ok */
	cr_assert_eq(recode(d, &g), 0);
	te__desc_free(g);
	te__desc_free(d);

	d = sample(1);
	d->regions[0].nrkeys = 3; /* more rkeys than NICs */
	cr_assert_eq(recode(d, &g), MC_EPROTOCOL);
	d->regions[0].nrkeys = 2;
	d->regions[0].rdma_addr = 0; /* rkeys without the address they start at */
	cr_assert_eq(recode(d, &g), MC_EPROTOCOL);
	d->regions[0].nrkeys = 0; /* an address without rkeys */
	d->regions[0].rdma_addr = 0x1000;
	cr_assert_eq(recode(d, &g), MC_EPROTOCOL);
	d->regions[0].nrkeys = 2;
	d->regions[0].rdma_addr = UINT64_MAX - 0x1000; /* its range wraps */
	cr_assert_eq(recode(d, &g), MC_EPROTOCOL);
	d->regions[0].rdma_addr = UINT64_MAX - 0x1fff; /* ends at the top */
	cr_assert_eq(recode(d, &g), 0);
	te__desc_free(g);
	te__desc_free(d);

	d = sample(1);
	d->data_port = 0; /* tcp offered without a port */
	cr_assert_eq(recode(d, &g), MC_EPROTOCOL);
	d->transports = TE_XP_SHM;
	cr_assert_eq(recode(d, &g), 0);
	te__desc_free(g);
	d->shm_socket[0] = '\0'; /* shm offered without its socket */
	cr_assert_eq(recode(d, &g), MC_EPROTOCOL);
	te__desc_free(d);

	d = sample(1);
	d->name[0] = '\0';
	cr_assert_eq(recode(d, &g), MC_EPROTOCOL);
	te__desc_free(d);

	/* Hand-made messages for what the struct cannot express. */
	Mooncake__Transfer__SegmentDesc m = MOONCAKE__TRANSFER__SEGMENT_DESC__INIT;
	char longhost[200];
	memset(longhost, 'h', sizeof(longhost) - 1);
	longhost[sizeof(longhost) - 1] = '\0';
	m.name = "x";
	m.host = longhost;
	cr_assert_eq(te__desc_from_pb(&m, &g), MC_EPROTOCOL);
	m.host = "1.2.3.4";
	m.data_port = 70000;
	cr_assert_eq(te__desc_from_pb(&m, &g), MC_EPROTOCOL);
	m.data_port = 1;
	Mooncake__Transfer__Nic nic = MOONCAKE__TRANSFER__NIC__INIT, *nics[17];
	uint8_t gid[15] = {0};
	nic.name = "mlx5_0";
	nic.gid.data = gid;
	nic.gid.len = 15; /* a GID is 16 bytes */
	nics[0] = &nic;
	m.n_nics = 1;
	m.nics = nics;
	cr_assert_eq(te__desc_from_pb(&m, &g), MC_EPROTOCOL);
	nic.gid.len = 0;
	for (int i = 0; i < 17; i++)
		nics[i] = &nic;
	m.n_nics = 17;
	cr_assert_eq(te__desc_from_pb(&m, &g), MC_EPROTOCOL);
	m.n_nics = 16;
	char *xp[2] = {"tcp", "future-transport"};
	m.n_transports = 2;
	m.transports = xp;
	cr_assert_eq(te__desc_from_pb(&m, &g), 0); /* unknown names are ignored */
	cr_assert_eq(g->transports, TE_XP_TCP);
	cr_assert_eq(g->nnics, 16);
	te__desc_free(g);

	uint8_t junk[64];
	memset(junk, 0xff, sizeof(junk));
	cr_assert_eq(te__desc_decode(junk, sizeof(junk), &g), MC_EPROTOCOL);
	cr_assert_eq(te__desc_decode(junk, TE_DESC_MAX_BYTES + 1, &g), MC_EPROTOCOL);
}

struct reg {
	uint64_t addr, len;
};

static long find(const struct reg *r, size_t n, uint64_t addr, uint64_t len)
{
	return te__range_find(r, n, sizeof(*r), offsetof(struct reg, addr),
			      offsetof(struct reg, len), addr, len);
}

Test(te_desc, range_find)
{
	const struct reg r[] = {{0x1000, 0x1000}, {0x4000, 0x100}, {UINT64_MAX - 0xff, 0x100}};
	cr_assert_eq(find(r, 3, 0x1000, 0x1000), 0);            /* whole region */
	cr_assert_eq(find(r, 3, 0x1fff, 1), 0);                 /* last byte */
	cr_assert_eq(find(r, 3, 0x1fff, 2), MC_EREMOTE_ACCESS); /* one past */
	cr_assert_eq(find(r, 3, 0x1000, 0x1001), MC_EREMOTE_ACCESS);
	cr_assert_eq(find(r, 3, 0xfff, 1), MC_EREMOTE_ACCESS);       /* before the first */
	cr_assert_eq(find(r, 3, 0x2000, 1), MC_EREMOTE_ACCESS);      /* in a gap */
	cr_assert_eq(find(r, 3, 0x3fff, 2), MC_EREMOTE_ACCESS);      /* gap into region */
	cr_assert_eq(find(r, 3, 0x1800, 0x2000), MC_EREMOTE_ACCESS); /* spans two */
	cr_assert_eq(find(r, 3, 0x4050, 0x10), 1);
	cr_assert_eq(find(r, 3, 0x4050, UINT64_MAX), MC_EREMOTE_ACCESS); /* overflow */
	cr_assert_eq(find(r, 3, 0x1000, 0), 0); /* length 0 = 1 byte */
	cr_assert_eq(find(r, 3, 0x2000, 0), MC_EREMOTE_ACCESS);
	cr_assert_eq(find(r, 3, UINT64_MAX - 0xff, 0x100), 2); /* top of the space */
	cr_assert_eq(find(r, 3, UINT64_MAX, 1), 2);
	cr_assert_eq(find(r, 3, UINT64_MAX, 2), MC_EREMOTE_ACCESS);
	cr_assert_eq(find(r, 0, 0x1000, 1), MC_EREMOTE_ACCESS); /* no regions */
}
