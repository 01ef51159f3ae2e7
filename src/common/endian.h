/*
 * endian: fixed-width integers to and from byte buffers in a stated byte
 * order, whatever the host's and whatever the buffer's alignment (on-disk
 * and wire formats that name one). The one copy of these helpers: the
 * WAL, snapshot and bolt formats, the transfer engine's wire formats and
 * the client frame header are little-endian; the gRPC message prefix,
 * SHA-256 and the revisions in bolt's keys are big-endian. Header-only
 * and pure (no I/O, no clock), so the pure cores may use it.
 */
#ifndef MC_COMMON_ENDIAN_H
#define MC_COMMON_ENDIAN_H

#include <stdint.h>

static inline void mc_put_le16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

static inline void mc_put_le32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static inline void mc_put_le64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static inline void mc_put_be64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (56 - 8 * i));
}

static inline void mc_put_be32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24);
	p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}

static inline uint16_t mc_get_le16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

static inline uint32_t mc_get_le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	       (uint32_t)p[3] << 24;
}

static inline uint64_t mc_get_le64(const uint8_t *p)
{
	return (uint64_t)mc_get_le32(p) | (uint64_t)mc_get_le32(p + 4) << 32;
}

static inline uint32_t mc_get_be32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 |
	       (uint32_t)p[3];
}

#endif
