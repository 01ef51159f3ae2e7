/*
 * test_endian: the fixed-width put/get helpers (common/endian.h) against byte layouts
 * written out by hand, round trips at every alignment, and agreement
 * with the host's own byte order.
 */
#include <criterion/criterion.h>
#include <endian.h>
#include <string.h>

#include "common/endian.h"

Test(endian, little_endian_layout)
{
	uint8_t b[8];
	mc_put_le16(b, 0x0102);
	cr_assert_eq(memcmp(b, "\x02\x01", 2), 0);
	mc_put_le32(b, 0x01020304u);
	cr_assert_eq(memcmp(b, "\x04\x03\x02\x01", 4), 0);
	mc_put_le64(b, 0x0102030405060708ull);
	cr_assert_eq(memcmp(b, "\x08\x07\x06\x05\x04\x03\x02\x01", 8), 0);

	const uint8_t in[8] = {0xf0, 0xde, 0xbc, 0x9a, 0x78, 0x56, 0x34, 0x12};
	cr_assert_eq(mc_get_le16(in), 0xdef0);
	cr_assert_eq(mc_get_le32(in), 0x9abcdef0u);
	cr_assert_eq(mc_get_le64(in), 0x123456789abcdef0ull);
}

Test(endian, big_endian_layout)
{
	uint8_t b[4];
	mc_put_be32(b, 0x01020304u);
	cr_assert_eq(memcmp(b, "\x01\x02\x03\x04", 4), 0);
	const uint8_t in[4] = {0xff, 0x00, 0x80, 0x7f};
	cr_assert_eq(mc_get_be32(in), 0xff00807fu);
}

Test(endian, high_bits_do_not_sign_extend)
{
	const uint8_t ones[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
	cr_assert_eq(mc_get_le16(ones), 0xffffu);
	cr_assert_eq(mc_get_le32(ones), 0xffffffffu);
	cr_assert_eq(mc_get_le64(ones), UINT64_MAX);
	cr_assert_eq(mc_get_be32(ones), 0xffffffffu);
}

Test(endian, round_trip_at_every_alignment_and_matches_the_host)
{
	uint8_t buf[24];
	uint64_t v = 0x8877665544332211ull;
	for (size_t off = 0; off < 8; off++) {
		for (int shift = 0; shift < 64; shift += 7) {
			uint64_t x = v ^ (v << shift);
			memset(buf, 0xaa, sizeof(buf));
			mc_put_le64(buf + off, x);
			cr_assert_eq(mc_get_le64(buf + off), x);
			uint64_t host;
			memcpy(&host, buf + off, 8);
			cr_assert_eq(le64toh(host), x);
			cr_assert_eq(buf[off + 8], 0xaa, "wrote past 8 bytes");
			if (off > 0)
				cr_assert_eq(buf[off - 1], 0xaa, "wrote before the field");

			mc_put_le32(buf + off, (uint32_t)x);
			cr_assert_eq(mc_get_le32(buf + off), (uint32_t)x);
			mc_put_le16(buf + off, (uint16_t)x);
			cr_assert_eq(mc_get_le16(buf + off), (uint16_t)x);
			mc_put_be32(buf + off, (uint32_t)x);
			cr_assert_eq(mc_get_be32(buf + off), (uint32_t)x);
			uint32_t h32;
			memcpy(&h32, buf + off, 4);
			cr_assert_eq(be32toh(h32), (uint32_t)x);
		}
	}
}
