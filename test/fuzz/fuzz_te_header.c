/* Fuzz target: the transfer engine's wire formats as the serving side
 * meets them — the input as a stream of slice headers (with WRITE
 * payloads) checked against a fixed region table, where every accepted
 * range is compared with a 128-bit oracle; each header, handshake and
 * shm message must re-encode to the same bytes, as must an accepted rdma
 * control message; and the input as a segment descriptor, which when
 * accepted must be sorted and disjoint (rkeys only with a base whose
 * range does not wrap) and survive an encode/decode round trip. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "transfer/te_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct reg {
	uint64_t addr, len;
};

static const struct reg regions[] = {
	{0x1000, 0x1000}, {0x3000, 1}, {0x10000, 0x10000}, {UINT64_MAX - 0xfff, 0x1000}};

static bool oracle(uint64_t addr, uint64_t len, long *idx)
{
	unsigned __int128 a = addr, end = (unsigned __int128)addr + (len ? len : 1);
	for (size_t i = 0; i < sizeof(regions) / sizeof(regions[0]); i++) {
		unsigned __int128 ra = regions[i].addr, re = ra + regions[i].len;
		if (a >= ra && end <= re) {
			*idx = (long)i;
			return true;
		}
	}
	return false;
}

static void stream(const uint8_t *p, size_t n)
{
	while (n >= TE_WIRE_HDR_BYTES) {
		struct te_wire_hdr h;
		uint8_t again[TE_WIRE_HDR_BYTES];
		if (te__wire_decode(p, (uint32_t)TE_SLICE_MAX, &h) != 0)
			return; /* the server closes the connection */
		te__wire_encode(&h, again);
		if (memcmp(again, p, TE_WIRE_HDR_BYTES) != 0)
			abort();
		p += TE_WIRE_HDR_BYTES;
		n -= TE_WIRE_HDR_BYTES;
		if (h.type == TE_WIRE_READ || h.type == TE_WIRE_WRITE) {
			long want, got = te__range_find(regions, 4, sizeof(struct reg),
							offsetof(struct reg, addr),
							offsetof(struct reg, len), h.addr,
							h.len);
			bool ok = oracle(h.addr, h.len, &want);
			if (ok != (got >= 0) || (ok && got != want) ||
			    (!ok && got != MC_EREMOTE_ACCESS))
				abort();
		}
		if (h.type == TE_WIRE_WRITE || h.type == TE_WIRE_CTRL) {
			size_t skip = h.len < n ? h.len : n; /* the payload */
			p += skip;
			n -= skip;
		}
	}
}

static void messages(const uint8_t *p, size_t n)
{
	if (n >= TE_HS_BYTES) {
		struct te_hs_msg m;
		uint8_t again[TE_HS_BYTES];
		if (te__hs_decode(p, &m) == 0) {
			te__hs_encode(&m, again);
			if (memcmp(again, p, TE_HS_BYTES) != 0)
				abort();
			struct te_hs_server s = {.own_name = "target", .secret = (const uint8_t *)"k",
						 .secret_len = 1};
			struct te_hs_msg r;
			int rc = te__hs_server_step(&s, &m, &r);
			if (rc == 0) /* a secret is configured: never accepted at once */
				abort();
		}
	}
	if (n >= TE_SHM_MSG_BYTES) {
		struct te_shm_msg m;
		uint8_t again[TE_SHM_MSG_BYTES];
		if (te__shm_decode(p, &m) == 0) {
			te__shm_encode(&m, again);
			if (memcmp(again, p, TE_SHM_MSG_BYTES) != 0)
				abort();
			if (m.type == TE_SHM_ADD && (m.len == 0 || m.addr + (m.len - 1) < m.addr))
				abort();
		}
	}
}

static void rdma_message(const uint8_t *p, size_t n)
{
	struct te_rdma_msg m;
	uint8_t again[TE_RDMA_MSG_MAX];
	if (te__rdma_msg_decode(p, n, &m) != 0)
		return;
	if (m.nics == 0 || m.n < m.nics || m.n > TE_RDMA_MAX_NICS ||
	    te__rdma_msg_encode(&m, again) != n || memcmp(again, p, n) != 0)
		abort();
}

static void descriptor(const uint8_t *p, size_t n)
{
	struct te_desc *d, *d2;
	if (te__desc_decode(p, n, &d) != 0)
		return;
	for (size_t i = 0; i < d->nregions; i++) {
		const struct te_desc_region *r = &d->regions[i];
		if (r->len == 0 || r->addr + (r->len - 1) < r->addr ||
		    r->nrkeys > d->nnics || (r->nrkeys != 0) != (r->rdma_addr != 0) ||
		    r->rdma_addr + (r->len - 1) < r->rdma_addr)
			abort();
		if (i && r->addr - d->regions[i - 1].addr < d->regions[i - 1].len)
			abort();
	}
	uint8_t *buf;
	size_t len;
	if (te__desc_encode(d, &buf, &len) == 0) {
		if (te__desc_decode(buf, len, &d2) != 0 || d2->nregions != d->nregions ||
		    d2->incarnation != d->incarnation || strcmp(d2->name, d->name))
			abort();
		te__desc_free(d2);
		free(buf);
	}
	te__desc_free(d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	stream(data, size);
	messages(data, size);
	rdma_message(data, size);
	descriptor(data, size);
	return 0;
}
