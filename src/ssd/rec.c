/*
 * rec: the SSD tier's on-disk formats (pure: bytes in, bytes out).
 *
 * Header (64 bytes, little-endian), at the start of ssd.data's first
 * block and of ssd.index:
 *   0 magic "MCSSDDAT" / "MCSSDIDX" | 8 u32 version 1 |
 *   12 u32 block bytes (4096) | 16 u64 store id | 24 u64 capacity (data
 *   area bytes) | 32 u64 generation (index: compactions so far) |
 *   40..59 zero | 60 u32 crc32c of bytes 0..59
 * Both files carry the same store id, drawn at creation: an index never
 * pairs with another store's data. The data area starts at byte 4096 of
 * ssd.data; extent offsets are relative to it.
 *
 * Index record (8-byte aligned, 40-byte header, little-endian):
 *   0 u32 crc32c, seeded with ssd__rec_seed(store id, generation), over
 *     bytes 4.. of the record, key and padding included |
 *   4 u8 type (1 put, 2 removal) | 5 u8 0x5D | 6 u16 key bytes (1..4096) |
 *   8 u64 seq | 16 u64 extent offset | 24 u64 value size |
 *   32 u32 value crc32c | 36 u32 zero | 40 key | zero padding to 8
 * A put's seq is the object's, unique and increasing; a removal names the
 * seq (and extent) of the put it removes, so it can never remove a newer
 * put of the same key, whatever order recovery meets them in.
 */
#include <errno.h>
#include <string.h>

#include "common/crc32c.h"
#include "common/endian.h"
#include "ssd/ssd_int.h"

void ssd__hdr_encode(uint8_t out[SSD__HDR_BYTES], const struct ssd__hdr *h)
{
	memset(out, 0, SSD__HDR_BYTES);
	memcpy(out, h->magic, 8);
	mc_put_le32(out + 8, h->version);
	mc_put_le32(out + 12, h->block_bytes);
	mc_put_le64(out + 16, h->store_id);
	mc_put_le64(out + 24, h->capacity);
	mc_put_le64(out + 32, h->generation);
	mc_put_le32(out + 60, crc32c(0, out, 60));
}

int ssd__hdr_decode(const uint8_t *p, size_t len, const char *magic, struct ssd__hdr *h)
{
	if (len < SSD__HDR_BYTES || memcmp(p, magic, 8) != 0 ||
	    mc_get_le32(p + 60) != crc32c(0, p, 60))
		return -EINVAL;
	memset(h, 0, sizeof(*h));
	memcpy(h->magic, p, 8);
	h->version = mc_get_le32(p + 8);
	h->block_bytes = mc_get_le32(p + 12);
	h->store_id = mc_get_le64(p + 16);
	h->capacity = mc_get_le64(p + 24);
	h->generation = mc_get_le64(p + 32);
	if (h->version != SSD__VERSION || h->block_bytes != SSD_ALIGN ||
	    h->capacity % SSD_ALIGN != 0)
		return -EINVAL;
	/* Bytes 40-59 are reserved, zero in this version: a header with
	 * others (its checksum matching) is not one this version wrote. */
	for (size_t i = 40; i < 60; i++)
		if (p[i])
			return -EINVAL;
	return 0;
}

size_t ssd__rec_len(size_t klen)
{
	return (SSD__REC_HDR_BYTES + klen + 7) & ~(size_t)7;
}

uint32_t ssd__rec_seed(uint64_t store_id, uint64_t generation)
{
	uint8_t b[16];
	mc_put_le64(b, store_id);
	mc_put_le64(b + 8, generation);
	return crc32c(0, b, sizeof(b));
}

void ssd__rec_encode(uint8_t *out, const struct ssd__rec *r, uint32_t seed)
{
	size_t n = ssd__rec_len(r->klen);
	memset(out, 0, n);
	out[4] = r->type;
	out[5] = SSD__REC_MARK;
	mc_put_le16(out + 6, r->klen);
	mc_put_le64(out + 8, r->seq);
	mc_put_le64(out + 16, r->offset);
	mc_put_le64(out + 24, r->size);
	mc_put_le32(out + 32, r->crc);
	memcpy(out + SSD__REC_HDR_BYTES, r->key, r->klen);
	mc_put_le32(out, crc32c(seed, out + 4, n - 4));
}

enum ssd__dec ssd__rec_decode(const uint8_t *p, size_t len, uint32_t seed, struct ssd__rec *r,
			      size_t *used)
{
	if (len < SSD__REC_HDR_BYTES)
		return SSD__DEC_SHORT;
	uint8_t type = p[4];
	uint16_t klen = mc_get_le16(p + 6);
	if (p[5] != SSD__REC_MARK || (type != SSD__REC_PUT && type != SSD__REC_DEL) ||
	    klen == 0 || klen > SSD_MAX_KEY_BYTES || mc_get_le32(p + 36) != 0)
		return SSD__DEC_BAD;
	size_t n = ssd__rec_len(klen);
	if (len < n)
		return SSD__DEC_SHORT;
	for (size_t i = SSD__REC_HDR_BYTES + klen; i < n; i++)
		if (p[i] != 0)
			return SSD__DEC_BAD;
	if (mc_get_le32(p) != crc32c(seed, p + 4, n - 4))
		return SSD__DEC_BAD;
	r->type = type;
	r->klen = klen;
	r->seq = mc_get_le64(p + 8);
	r->offset = mc_get_le64(p + 16);
	r->size = mc_get_le64(p + 24);
	r->crc = mc_get_le32(p + 32);
	r->key = p + SSD__REC_HDR_BYTES;
	bool ok = r->offset % SSD_ALIGN == 0 &&
		  (type == SSD__REC_PUT ? r->size > 0 && r->size <= SSD_MAX_VALUE_BYTES
					: r->size == 0 && r->crc == 0);
	if (!ok)
		return SSD__DEC_BAD;
	*used = n;
	return SSD__DEC_OK;
}
