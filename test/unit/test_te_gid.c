/*
 * Mirror test of src/transfer/gid.c: the GID index the rdma transport
 * picks (and mooncakectl doctor reports).
 */
#include <criterion/criterion.h>
#include <string.h>

#include "transfer/transfer.h"

static struct te_gid_entry gid(enum te_gid_type t, const char *kind)
{
	struct te_gid_entry e = {.type = t, .valid = true};
	if (strcmp(kind, "v4") == 0) {
		e.raw[10] = e.raw[11] = 0xff;
		e.raw[12] = 192, e.raw[13] = 168, e.raw[15] = 1;
	} else if (strcmp(kind, "ll") == 0) {
		e.raw[0] = 0xfe, e.raw[1] = 0x80, e.raw[15] = 7;
	}
	return e;
}

Test(te_gid, prefers_roce_v2_ipv4_then_v2_then_v1)
{
	struct te_gid_entry t[] = {
		gid(TE_GID_ROCE_V1, "ll"),
		gid(TE_GID_ROCE_V2, "ll"),
		gid(TE_GID_ROCE_V1, "v4"),
		gid(TE_GID_ROCE_V2, "v4"),
	};
	cr_assert_eq(te_gid_pick(t, 4, -1), 3);
	cr_assert_eq(te_gid_pick(t, 3, -1), 1, "no IPv4 v2: the link-local v2");
	cr_assert_eq(te_gid_pick(t, 1, -1), 0);
	cr_assert_eq(te_gid_pick(t, 4, 2), 2, "an override is taken when valid");
	cr_assert(te_gid_v4mapped(t[3].raw));
	cr_assert(!te_gid_v4mapped(t[1].raw));
}

Test(te_gid, skips_zero_and_unreadable_entries)
{
	struct te_gid_entry t[] = {gid(TE_GID_ROCE_V2, "zero"), gid(TE_GID_ROCE_V2, "v4"),
				   gid(TE_GID_ROCE_V2, "v4")};
	t[1].valid = false;
	cr_assert_eq(te_gid_pick(t, 3, -1), 2);
	cr_assert_eq(te_gid_pick(t, 3, 0), -1, "the override names an all-zero entry");
	cr_assert_eq(te_gid_pick(t, 3, 7), -1, "past the table");
	cr_assert_eq(te_gid_pick(t, 0, -1), -1);
}
