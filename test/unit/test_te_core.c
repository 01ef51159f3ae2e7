/*
 * test_te_core: the transfer engine's pure and local pieces — slicing
 * (counts and bounds for every awkward length), path picking for stripes
 * and retries (dead and already-tried paths skipped), and the region
 * table (overlaps refused, lookups against the edges, busy counts, and an
 * unregister that waits for a request being served to finish), and the
 * table that registers the transports by protocol.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <sched.h>
#include <string.h>

#include "transfer/te_int.h"

#define K64 ((size_t)64 << 10)
#define M1 ((size_t)1 << 20)

Test(te_slice, counts_and_bounds)
{
	cr_assert_eq(te__slice_count(0, M1), 0);
	cr_assert_eq(te__slice_count(1, M1), 1);
	cr_assert_eq(te__slice_count(M1, M1), 1);
	cr_assert_eq(te__slice_count(M1 + 1, M1), 2);
	cr_assert_eq(te__slice_count(64 * M1, M1), 64);
	cr_assert_eq(te__slice_count(64 * M1, K64), 1024);
	static const uint64_t lens[] = {1,       4096,   K64 - 1,    K64,
					K64 + 1, M1 + 1, 3 * M1 - 7, (uint64_t)64 << 20};
	for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
		for (size_t sb = K64; sb <= M1; sb *= 4) {
			uint64_t len = lens[li], covered = 0;
			size_t n = te__slice_count(len, sb);
			for (size_t i = 0; i < n; i++) {
				uint64_t off;
				size_t slen;
				te__slice_at(len, sb, i, &off, &slen);
				cr_assert_eq(off, covered, "contiguous");
				cr_assert(slen > 0 && slen <= sb);
				covered += slen;
			}
			cr_assert_eq(covered, len, "len %llu slice %zu",
				     (unsigned long long)len, sb);
		}
	}
}

Test(te_slice, pick_path)
{
	/* a stripe over 4 live paths */
	for (size_t k = 0; k < 8; k++)
		cr_assert_eq(te__pick_path(4, 1, k, 0, 0xf), (int)((1 + k) % 4));
	/* dead path 2 is skipped; the next live one takes its slices */
	cr_assert_eq(te__pick_path(4, 0, 2, 0, 0xb), 3);
	cr_assert_eq(te__pick_path(4, 0, 3, 0, 0xb), 3);
	/* a retry after path 3 failed goes to the next path, then wraps */
	cr_assert_eq(te__pick_path(4, 3, 1, 1u << 3, 0xf), 0);
	cr_assert_eq(te__pick_path(4, 0, 1, (1u << 3) | 1u, 0xf), 1);
	/* nothing left */
	cr_assert_eq(te__pick_path(4, 0, 0, 0xf, 0xf), -1);
	cr_assert_eq(te__pick_path(4, 0, 0, 0, 0), -1);
	cr_assert_eq(te__pick_path(0, 0, 0, 0, 0), -1);
	cr_assert_eq(te__pick_path(32, 31, 1, 0, 0xffffffffu), 0);
}

static struct te_region *mkreg(uint64_t addr, uint64_t len)
{
	struct te_region *r = calloc(1, sizeof(*r));
	r->addr = addr;
	r->len = len;
	r->memfd = -1;
	return r;
}

Test(te_region, table)
{
	struct te_rtable t;
	cr_assert_eq(te__rtable_init(&t), 0);
	struct te_region *a = mkreg(0x10000, 0x1000), *b = mkreg(0x20000, 0x1000),
			 *c = mkreg(0x8000, 0x8000);
	cr_assert_eq(te__rtable_add(&t, a), 0);
	cr_assert_eq(te__rtable_add(&t, b), 0);
	cr_assert_eq(te__rtable_add(&t, c), 0); /* ends exactly where a starts */
	cr_assert_neq(a->id, b->id);
	struct te_region *o = mkreg(0x10fff, 2), *o2 = mkreg(0x1f000, 0x1001),
			 *o3 = mkreg(0x0, 0x100000);
	cr_assert_eq(te__rtable_add(&t, o), -EEXIST);
	cr_assert_eq(te__rtable_add(&t, o2), -EEXIST);
	cr_assert_eq(te__rtable_add(&t, o3), -EEXIST);

	struct te_region *got;
	cr_assert_eq(te__rtable_acquire(&t, 0x10000, 0x1000, &got), 0);
	cr_assert_eq(got, a);
	cr_assert_eq(atomic_load(&a->inflight), 1);
	te__rtable_release(&t, a);
	cr_assert_eq(te__rtable_acquire(&t, 0xffff, 2, &got), MC_EREMOTE_ACCESS);
	cr_assert_eq(te__rtable_acquire(&t, 0x10000, 0x1001, &got), MC_EREMOTE_ACCESS);
	cr_assert_eq(te__rtable_acquire(&t, 0x30000, 1, &got), MC_EREMOTE_ACCESS);
	cr_assert_eq(te__rtable_acquire(&t, 0x20fff, UINT64_MAX, &got), MC_EREMOTE_ACCESS);
	cr_assert_eq(te__rtable_acquire(&t, 0x8000, 1, &got), 0);
	cr_assert_eq(got, c);
	te__rtable_release(&t, c);

	struct te_desc d = {0};
	cr_assert_eq(te__rtable_describe(&t, &d), 0);
	cr_assert_eq(d.nregions, 3);
	cr_assert_eq(d.regions[0].addr, 0x8000);
	cr_assert_eq(d.regions[2].addr, 0x20000);
	free(d.regions);

	te__rtable_del(&t, b);
	cr_assert_eq(te__rtable_acquire(&t, 0x20000, 1, &got), MC_EREMOTE_ACCESS);
	cr_assert_eq(te__rtable_add(&t, o2), 0); /* the space is free again */
	te__rtable_del(&t, o2);
	te__rtable_del(&t, a);
	te__rtable_del(&t, c);
	te__rtable_destroy(&t);
	free(a);
	free(b);
	free(c);
	free(o);
	free(o2);
	free(o3);
}

struct holder {
	struct te_rtable *t;
	struct te_region *r;
	atomic_bool released;
};

static void *release_later(void *arg)
{
	struct holder *h = arg;
	/* Until the unregister has marked the region dead (it then waits). */
	for (bool dead = false; !dead; sched_yield()) {
		pthread_mutex_lock(&h->t->wait_mu);
		dead = h->r->dead;
		pthread_mutex_unlock(&h->t->wait_mu);
	}
	atomic_store(&h->released, true);
	te__rtable_release(h->t, h->r);
	return NULL;
}

Test(te_region, unregister_waits_for_requests)
{
	struct te_rtable t;
	cr_assert_eq(te__rtable_init(&t), 0);
	struct te_region *r = mkreg(0x1000, 0x1000), *got;
	cr_assert_eq(te__rtable_add(&t, r), 0);
	cr_assert_eq(te__rtable_acquire(&t, 0x1800, 16, &got), 0);
	struct holder h = {&t, r, false};
	pthread_t tid;
	pthread_create(&tid, NULL, release_later, &h);
	te__rtable_del(&t, r);
	/* del returned: the request that held the region is done with it */
	cr_assert(atomic_load(&h.released));
	pthread_join(tid, NULL);
	te__rtable_destroy(&t);
	free(r);
}

Test(te_xport, one_table_by_protocol)
{
	static const enum te_protocol protos[] = {TE_PROTO_TCP, TE_PROTO_RDMA, TE_PROTO_SHM};
	for (size_t i = 0; i < sizeof(protos) / sizeof(protos[0]); i++) {
		const struct te_xport_ops *ops = te__xport_ops(protos[i]);
		cr_assert_not_null(ops, "%s", te_protocol_name(protos[i]));
		cr_assert_eq(ops->proto, protos[i]);
		cr_assert_str_eq(ops->name, te_protocol_name(protos[i]));
		cr_assert(ops->init && ops->fini && ops->connect && ops->submit &&
				  ops->disconnect && ops->peer_free,
			  "%s lacks a required operation", ops->name);
	}
	cr_assert_null(te__xport_ops(TE_PROTO_AUTO), "auto is a choice, not a transport");
	cr_assert_null(te__xport_ops((enum te_protocol)4));
	cr_assert_null(te__xport_ops((enum te_protocol) - 1));
}
