/*
 * crc32c: CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the
 * checksum of the WAL records, snapshot files and anything else written to
 * disk. crc32c(0, "123456789", 9) == 0xE3069283.
 *
 * crc32c() uses the SSE4.2 `crc32` instruction when the CPU has it (checked
 * once, with cpuid), and for data of 1 KiB and more carry-less
 * multiplication in 512-bit registers when it also has AVX-512 and
 * VPCLMULQDQ (about twice as fast: crc32c.c); a slicing-by-8 table
 * otherwise. All give the same result. Checksums chain:
 * crc32c(crc32c(0, a, n), b, m) is the checksum of a followed by b, so
 * large data can be checksummed piece by piece.
 *
 * Pure and thread-safe.
 */
#ifndef MC_COMMON_CRC32C_H
#define MC_COMMON_CRC32C_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Extend crc (0 to start) with len bytes of data. */
uint32_t crc32c(uint32_t crc, const void *data, size_t len);

/* Copy len bytes from src to dst (not overlapping) and extend crc with
 * them in the same pass: the copy goes in cache-sized pieces and each is
 * checksummed as it lands, so the data is read from memory once. */
uint32_t crc32c_copy(uint32_t crc, void *dst, const void *src, size_t len);

/* The checksum of a followed by b, from crc1 = crc32c(0, a, ...) and
 * crc2 = crc32c(0, b, len2), without their bytes (a few thousand
 * instructions at most, whatever len2). It is linear: the checksum of pieces summed apart
 * (in any order, on any thread) is the XOR of crc32c_combine(crc_i, 0,
 * bytes after piece i) over the pieces. */
uint32_t crc32c_combine(uint32_t crc1, uint32_t crc2, uint64_t len2);

/* The table implementation, always available (tests compare the two). */
uint32_t crc32c_sw(uint32_t crc, const void *data, size_t len);

/* The hardware implementation. Only call it when crc32c_hw_available();
 * elsewhere it falls back to crc32c_sw. */
uint32_t crc32c_hw(uint32_t crc, const void *data, size_t len);

/* True when this CPU has the crc32 instruction (x86-64 SSE4.2). */
bool crc32c_hw_available(void);

#endif
