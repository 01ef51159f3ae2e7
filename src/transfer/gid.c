/*
 * gid: which entry of a port's GID table the rdma transport uses. The
 * transport (rdma_dev.c, from ibv_query_gid_ex) and mooncakectl doctor (from
 * sysfs) both ask this one function, so the doctor names the index the
 * daemon will pick. Pure: no I/O.
 *
 * RoCE v2 GIDs with an IPv4-mapped address come first because they are
 * what a routed RoCE fabric carries (UDP/IPv4); then other RoCE v2 GIDs
 * (IPv6, link-local), then RoCE v1 or InfiniBand ones. Within a kind the
 * lowest index wins, as show_gids lists them.
 */
#include <string.h>

#include "transfer/transfer.h"

bool te_gid_v4mapped(const uint8_t raw[16])
{
	static const uint8_t pfx[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	return memcmp(raw, pfx, sizeof(pfx)) == 0;
}

static bool gid_zero(const uint8_t raw[16])
{
	for (int i = 0; i < 16; i++)
		if (raw[i])
			return false;
	return true;
}

int te_gid_pick(const struct te_gid_entry *t, size_t n, int want)
{
	int best = -1, best_score = 0;
	for (size_t i = 0; i < n && i <= 255; i++) {
		if (want >= 0 && (size_t)want != i)
			continue;
		if (!t[i].valid || gid_zero(t[i].raw))
			continue;
		int score = t[i].type == TE_GID_ROCE_V2 ? (te_gid_v4mapped(t[i].raw) ? 3 : 2)
							: 1;
		if (score > best_score) {
			best = (int)i;
			best_score = score;
		}
	}
	return best;
}
