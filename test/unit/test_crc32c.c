/*
 * test_crc32c: known vectors (RFC 3720 B.4 and the "123456789" check
 * value), chaining, and agreement of the hardware and table paths on
 * random data of every length and alignment.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "common/crc32c.h"

typedef uint32_t (*crc_fn)(uint32_t, const void *, size_t);

static void check_vectors(crc_fn f)
{
	cr_assert_eq(f(0, "123456789", 9), 0xE3069283u);
	cr_assert_eq(f(0, "", 0), 0u);
	cr_assert_eq(f(0, "a", 1), 0xC1D04330u);

	unsigned char buf[32];
	memset(buf, 0, sizeof(buf));
	cr_assert_eq(f(0, buf, 32), 0x8A9136AAu); /* 32 zero bytes */
	memset(buf, 0xff, sizeof(buf));
	cr_assert_eq(f(0, buf, 32), 0x62A8AB43u); /* 32 0xFF bytes */
	for (int i = 0; i < 32; i++)
		buf[i] = (unsigned char)i;
	cr_assert_eq(f(0, buf, 32), 0x46DD794Eu); /* incrementing */
	for (int i = 0; i < 32; i++)
		buf[i] = (unsigned char)(31 - i);
	cr_assert_eq(f(0, buf, 32), 0x113FDB5Cu); /* decrementing */
}

Test(crc32c, vectors_dispatch)
{
	check_vectors(crc32c);
}
Test(crc32c, vectors_table)
{
	check_vectors(crc32c_sw);
}
Test(crc32c, vectors_hw)
{
	check_vectors(crc32c_hw);
}

Test(crc32c, chaining)
{
	const char *s = "The quick brown fox jumps over the lazy dog";
	size_t n = strlen(s);
	uint32_t whole = crc32c(0, s, n);
	for (size_t cut = 0; cut <= n; cut++) {
		uint32_t c = crc32c(0, s, cut);
		c = crc32c(c, s + cut, n - cut);
		cr_assert_eq(c, whole, "cut at %zu", cut);
	}
}

Test(crc32c, hw_and_table_agree_on_random_data)
{
	if (!crc32c_hw_available())
		cr_log_warn("no SSE4.2: the hardware path is the table path");
	enum { MAX = 4096 + 64 };
	unsigned char *buf = malloc(MAX);
	cr_assert_not_null(buf);
	srand(12345);
	for (size_t i = 0; i < MAX; i++)
		buf[i] = (unsigned char)rand();
	for (size_t off = 0; off < 16; off++) {
		for (size_t len = 0; len + off <= MAX; len += (len < 80 ? 1 : 61)) {
			uint32_t seed = (uint32_t)rand();
			uint32_t a = crc32c_sw(seed, buf + off, len);
			uint32_t b = crc32c_hw(seed, buf + off, len);
			cr_assert_eq(a, b, "off %zu len %zu: table %08x hw %08x", off, len, a,
				     b);
			cr_assert_eq(crc32c(seed, buf + off, len), a);
		}
	}
	free(buf);
}

/* Lengths that cross the hardware path's long blocks (3 x 8 KiB) and
 * short ones (3 x 256 bytes) at every boundary, chained from a seed. */
Test(crc32c, hw_and_table_agree_on_long_data)
{
	enum { MAX = 3 * 3 * 8192 + 3 * 256 + 64 };
	unsigned char *buf = malloc(MAX);
	cr_assert_not_null(buf);
	srand(777);
	for (size_t i = 0; i < MAX; i++)
		buf[i] = (unsigned char)rand();
	size_t lens[] = {767,   768,   769,   24575,    24576,   24577, 24576 + 768,
			 49151, 49152, 49160, MAX - 64, MAX - 3, MAX};
	for (size_t off = 0; off < 9; off += 4)
		for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
			size_t len = lens[i] - off;
			uint32_t seed = (uint32_t)rand();
			uint32_t a = crc32c_sw(seed, buf + off, len);
			cr_assert_eq(crc32c_hw(seed, buf + off, len), a, "off %zu len %zu",
				     off, len);
			cr_assert_eq(crc32c(seed, buf + off, len), a);
		}
	free(buf);
}

Test(crc32c, detects_single_bit_flip)
{
	unsigned char buf[256];
	for (int i = 0; i < 256; i++)
		buf[i] = (unsigned char)(i * 7);
	uint32_t ref = crc32c(0, buf, sizeof(buf));
	for (int bit = 0; bit < 256 * 8; bit++) {
		buf[bit / 8] ^= (unsigned char)(1u << (bit % 8));
		cr_assert_neq(crc32c(0, buf, sizeof(buf)), ref);
		buf[bit / 8] ^= (unsigned char)(1u << (bit % 8));
	}
}

Test(crc32c, copy_checksums_what_it_copies)
{
	const size_t max = (1u << 20) + 77;
	unsigned char *src = malloc(max), *dst = malloc(max + 16);
	cr_assert(src && dst);
	for (size_t i = 0; i < max; i++)
		src[i] = (unsigned char)(i * 131 + (i >> 9));
	size_t lens[] = {0, 1, 7, 8, 4095, 16384, 16385, 65536 + 3, max};
	for (size_t k = 0; k < sizeof(lens) / sizeof(lens[0]); k++)
		for (size_t off = 0; off < 3; off++) {
			size_t len = lens[k] - (lens[k] >= off ? off : 0);
			memset(dst, 0xee, max + 16);
			uint32_t c = crc32c_copy(5, dst + off, src + off, len);
			cr_assert_eq(c, crc32c(5, src + off, len), "len %zu", len);
			cr_assert_eq(memcmp(dst + off, src + off, len), 0, "len %zu copied",
				     len);
			cr_assert_eq(dst[off + len], 0xee, "nothing past the end");
		}
	free(src);
	free(dst);
}

/* len bytes of rand() from seed (the caller frees them). */
static unsigned char *random_bytes(size_t len, unsigned seed)
{
	unsigned char *buf = malloc(len);
	cr_assert_not_null(buf);
	srand(seed);
	for (size_t i = 0; i < len; i++)
		buf[i] = (unsigned char)rand();
	return buf;
}

/* Lengths around the folding path's least length (1 KiB) and its 256-byte
 * rounds, and a few MiB, from every alignment: the path taken with AVX-512
 * and VPCLMULQDQ, the crc32 streams elsewhere; both must give the table's
 * result. */
Test(crc32c, hw_and_table_agree_across_the_folding_path)
{
	const size_t max = (4u << 20) + 300;
	unsigned char *buf = random_bytes(max, 4242);
	size_t lens[] = {1023,       1024,           1025,       1279,
			 1280,       1281,           1535,       2047,
			 2048,       2049,           4096 + 255, 65536,
			 65536 + 17, (1u << 20) - 1, 1u << 20,   (1u << 20) + 129,
			 4u << 20};
	for (size_t off = 0; off < 8; off++)
		for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
			size_t len = lens[i];
			uint32_t seed = (uint32_t)rand();
			uint32_t a = crc32c_sw(seed, buf + off, len);
			cr_assert_eq(crc32c_hw(seed, buf + off, len), a, "off %zu len %zu",
				     off, len);
			cr_assert_eq(crc32c(seed, buf + off, len), a);
		}
	/* A flipped bit anywhere in a long buffer changes the sum. */
	uint32_t ref = crc32c(0, buf, 1u << 20);
	for (size_t bit = 0; bit < (8u << 20); bit += 8191) {
		buf[bit / 8] ^= (unsigned char)(1u << (bit % 8));
		cr_assert_neq(crc32c(0, buf, 1u << 20), ref, "bit %zu", bit);
		buf[bit / 8] ^= (unsigned char)(1u << (bit % 8));
	}
	free(buf);
}

/* Pieces summed apart give the whole's checksum: chained with
 * crc32c_combine, and XORed in any order (as the transfer engine adds up
 * slices that land on different threads). */
Test(crc32c, combine_joins_pieces_summed_apart)
{
	const size_t max = (3u << 20) + 77;
	unsigned char *buf = random_bytes(max, 99);
	uint32_t whole = crc32c(0, buf, max);
	size_t cuts[] = {0, 1, 7, 4096, 65536 + 3, 1u << 20, max - 1, max};
	for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++) {
		size_t a = cuts[i];
		uint32_t c = crc32c_combine(crc32c(0, buf, a), crc32c(0, buf + a, max - a),
					    max - a);
		cr_assert_eq(c, whole, "cut at %zu", a);
	}
	/* Slices of 1 MiB, the last one short, added up last to first. */
	size_t slice = 1u << 20;
	uint32_t acc = 0;
	for (size_t off = (max - 1) / slice * slice;; off -= slice) {
		size_t len = off + slice > max ? max - off : slice;
		acc ^= crc32c_combine(crc32c(0, buf + off, len), 0, max - off - len);
		if (off == 0)
			break;
	}
	cr_assert_eq(acc, whole);
	cr_assert_eq(crc32c_combine(0x12345678u, 0, 0), 0x12345678u);
	free(buf);
}
