/*
 * crc32c: table and SSE4.2 implementations of CRC-32C, and the one-time
 * choice between them. See crc32c.h.
 *
 * The table path is slicing-by-8 (eight 256-entry tables, built once under
 * pthread_once). The hardware path feeds 8 bytes per `crc32q` instruction;
 * it is compiled with a per-function target attribute, so the rest of the
 * binary keeps the baseline x86-64 instruction set and still runs on CPUs
 * without SSE4.2.
 */
#include "common/crc32c.h"

#include <pthread.h>
#include <string.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <nmmintrin.h>
#define CRC32C_X86 1
#endif

#define CRC32C_POLY 0x82F63B78u

static uint32_t crc_table[8][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;
static bool crc_hw;

static void crc_init(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;
		for (int k = 0; k < 8; k++)
			c = (c & 1) ? (c >> 1) ^ CRC32C_POLY : c >> 1;
		crc_table[0][i] = c;
	}
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = crc_table[0][i];
		for (int t = 1; t < 8; t++) {
			c = crc_table[0][c & 0xff] ^ (c >> 8);
			crc_table[t][i] = c;
		}
	}
#ifdef CRC32C_X86
	unsigned a, b, c, d;
	if (__get_cpuid(1, &a, &b, &c, &d))
		crc_hw = (c & bit_SSE4_2) != 0;
#endif
}

bool crc32c_hw_available(void)
{
	pthread_once(&crc_once, crc_init);
	return crc_hw;
}

static uint32_t crc_sw_raw(uint32_t c, const unsigned char *p, size_t len)
{
	while (len > 0 && ((uintptr_t)p & 7) != 0) {
		c = crc_table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
		len--;
	}
	while (len >= 8) {
		uint32_t lo, hi;
		memcpy(&lo, p, 4);
		memcpy(&hi, p + 4, 4);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
		lo = __builtin_bswap32(lo);
		hi = __builtin_bswap32(hi);
#endif
		lo ^= c;
		c = crc_table[7][lo & 0xff] ^ crc_table[6][(lo >> 8) & 0xff] ^
		    crc_table[5][(lo >> 16) & 0xff] ^ crc_table[4][lo >> 24] ^
		    crc_table[3][hi & 0xff] ^ crc_table[2][(hi >> 8) & 0xff] ^
		    crc_table[1][(hi >> 16) & 0xff] ^ crc_table[0][hi >> 24];
		p += 8;
		len -= 8;
	}
	while (len > 0) {
		c = crc_table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
		len--;
	}
	return c;
}

uint32_t crc32c_sw(uint32_t crc, const void *data, size_t len)
{
	pthread_once(&crc_once, crc_init);
	return ~crc_sw_raw(~crc, data, len);
}

#ifdef CRC32C_X86
__attribute__((target("sse4.2"))) static uint32_t
crc_hw_raw(uint32_t crc, const unsigned char *p, size_t len)
{
	uint64_t c = crc;
	while (len > 0 && ((uintptr_t)p & 7) != 0) {
		c = _mm_crc32_u8((uint32_t)c, *p++);
		len--;
	}
	while (len >= 8) {
		uint64_t v;
		memcpy(&v, p, 8);
		c = _mm_crc32_u64(c, v);
		p += 8;
		len -= 8;
	}
	while (len > 0) {
		c = _mm_crc32_u8((uint32_t)c, *p++);
		len--;
	}
	return (uint32_t)c;
}
#endif

uint32_t crc32c_hw(uint32_t crc, const void *data, size_t len)
{
#ifdef CRC32C_X86
	if (crc32c_hw_available())
		return ~crc_hw_raw(~crc, data, len);
#endif
	return crc32c_sw(crc, data, len);
}

uint32_t crc32c(uint32_t crc, const void *data, size_t len)
{
	pthread_once(&crc_once, crc_init);
#ifdef CRC32C_X86
	if (crc_hw)
		return ~crc_hw_raw(~crc, data, len);
#endif
	return ~crc_sw_raw(~crc, data, len);
}

/* Pieces small enough to still be in the first-level cache when the
 * checksum reads them back. */
#define COPY_PIECE (16u * 1024)

uint32_t crc32c_copy(uint32_t crc, void *dst, const void *src, size_t len)
{
	uint8_t *d = dst;
	const uint8_t *s = src;
	while (len > 0) {
		size_t n = len < COPY_PIECE ? len : COPY_PIECE;
		memcpy(d, s, n);
		crc = crc32c(crc, d, n);
		d += n;
		s += n;
		len -= n;
	}
	return crc;
}
