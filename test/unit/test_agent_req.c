/*
 * test_agent_req: the agent's pure pieces — request checks (src/agent/
 * req.c) on decoded client frames, and the inventory (src/agent/inv.c):
 * add/replace/delete, growth, and the re-sync snapshot that drops entries
 * whose space a newer entry took.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/lcache.h"
#include "agent/req.h"
#include "common/uframe.h"

static const char *why;

static Mooncake__Client__Request *hello_req(void)
{
	static Mooncake__Client__Hello h = MOONCAKE__CLIENT__HELLO__INIT;
	static Mooncake__Client__Request r;
	mooncake__client__request__init(&r);
	r.op_case = MOONCAKE__CLIENT__REQUEST__OP_HELLO;
	r.hello = &h;
	h.version = 1;
	return &r;
}

Test(agent_req, hello_first_and_once)
{
	Mooncake__Client__Request *r = hello_req();
	cr_assert_eq(agent__req_check(r, false, &why), 0);
	cr_assert_eq(agent__req_check(r, true, &why), MC_EPROTOCOL);
	Mooncake__Client__Empty e = MOONCAKE__CLIENT__EMPTY__INIT;
	Mooncake__Client__Request s = MOONCAKE__CLIENT__REQUEST__INIT;
	s.op_case = MOONCAKE__CLIENT__REQUEST__OP_STATS;
	s.stats = &e;
	cr_assert_eq(agent__req_check(&s, false, &why), MC_EPROTOCOL);
	cr_assert_str_eq(why, "the first request must be hello");
	cr_assert_eq(agent__req_check(&s, true, &why), 0);
}

Test(agent_req, unknown_op)
{
	Mooncake__Client__Request s = MOONCAKE__CLIENT__REQUEST__INIT;
	cr_assert_eq(agent__req_check(&s, true, &why), -EOPNOTSUPP);
	/* An op number from a newer protocol decodes as "not set". */
	uint8_t frame[] = {0x08, 0x07, 0xfa, 0x06, 0x00}; /* id=7, field 111 */
	Mooncake__Client__Request *m = mooncake__client__request__unpack(NULL, sizeof(frame),
									 frame);
	cr_assert_not_null(m);
	cr_assert_eq(m->id, 7);
	cr_assert_eq(agent__req_check(m, true, &why), -EOPNOTSUPP);
	mooncake__client__request__free_unpacked(m, NULL);
}

Test(agent_req, descriptors_bound)
{
	Mooncake__Client__Request *r = hello_req();
	r->nfds = MC_UFRAME_MAX_FDS + 1;
	cr_assert_eq(agent__req_check(r, false, &why), MC_EPROTOCOL);
	r->nfds = 1;
	cr_assert_eq(agent__req_check(r, false, &why), -EINVAL, "hello carries none");
	r->nfds = 0;
}

static Mooncake__Client__PutItem item;
static Mooncake__Client__PutItem *items[1] = {&item};
static Mooncake__Client__Region src;

static void put_req(Mooncake__Client__Request *r, Mooncake__Client__PutRequest *p)
{
	mooncake__client__request__init(r);
	mooncake__client__put_request__init(p);
	mooncake__client__put_item__init(&item);
	mooncake__client__region__init(&src);
	item.key.data = (uint8_t *)"k";
	item.key.len = 1;
	item.source = &src;
	p->items = items;
	p->n_items = 1;
	r->op_case = MOONCAKE__CLIENT__REQUEST__OP_PUT;
	r->put = p;
}

Test(agent_req, put_regions)
{
	Mooncake__Client__Request r;
	Mooncake__Client__PutRequest p;
	put_req(&r, &p);
	cr_assert_eq(agent__req_check(&r, true, &why), 0);
	src.where = MOONCAKE__CLIENT__REGION__WHERE__ATTACHED;
	src.fd_index = 0;
	cr_assert_eq(agent__req_check(&r, true, &why), -EINVAL, "no descriptor attached");
	r.nfds = 1;
	cr_assert_eq(agent__req_check(&r, true, &why), 0);
	src.fd_index = 1;
	cr_assert_eq(agent__req_check(&r, true, &why), -EINVAL);
	src.where = MOONCAKE__CLIENT__REGION__WHERE__BUFFER;
	src.buffer = 0;
	cr_assert_eq(agent__req_check(&r, true, &why), -EINVAL, "buffer id 0");
	src.buffer = 3;
	cr_assert_eq(agent__req_check(&r, true, &why), 0);
	src.where = 9;
	cr_assert_eq(agent__req_check(&r, true, &why), -EINVAL, "unknown kind");
	src.where = 0;
	item.source = NULL;
	cr_assert_eq(agent__req_check(&r, true, &why), -EINVAL, "no source");
	item.source = &src;
	p.replica_num = 17;
	cr_assert_eq(agent__req_check(&r, true, &why), -EINVAL);
	p.replica_num = 16;
	p.n_items = 0;
	cr_assert_eq(agent__req_check(&r, true, &why), -EINVAL, "empty batch");
}

Test(agent_req, keys)
{
	ProtobufCBinaryData k = {0, NULL};
	cr_assert(!agent__key_ok(&k));
	uint8_t big[AGENT_MAX_KEY_BYTES + 1];
	memset(big, 'x', sizeof(big));
	k.data = big;
	k.len = AGENT_MAX_KEY_BYTES;
	cr_assert(agent__key_ok(&k));
	k.len++;
	cr_assert(!agent__key_ok(&k));
	k.len = 1;
	cr_assert(agent__key_ok(&k));
}

Test(agent_req, transfer_and_get)
{
	Mooncake__Client__Region loc = MOONCAKE__CLIENT__REGION__INIT;
	Mooncake__Client__TransferItem ti = MOONCAKE__CLIENT__TRANSFER_ITEM__INIT;
	Mooncake__Client__TransferItem *tis[1] = {&ti};
	Mooncake__Client__TransferRequest t = MOONCAKE__CLIENT__TRANSFER_REQUEST__INIT;
	t.items = tis;
	t.n_items = 1;
	Mooncake__Client__Request r = MOONCAKE__CLIENT__REQUEST__INIT;
	r.op_case = MOONCAKE__CLIENT__REQUEST__OP_TRANSFER;
	r.transfer = &t;
	cr_assert_eq(agent__req_check(&r, true, &why), -EINVAL, "no local region");
	ti.local = &loc;
	cr_assert_eq(agent__req_check(&r, true, &why), -EINVAL, "no target");
	ti.target = "127.0.0.1:1";
	cr_assert_eq(agent__req_check(&r, true, &why), 0);
	ti.op = 5;
	cr_assert_eq(agent__req_check(&r, true, &why), -EINVAL);

	Mooncake__Client__GetItem gi = MOONCAKE__CLIENT__GET_ITEM__INIT;
	Mooncake__Client__GetItem *gis[1] = {&gi};
	Mooncake__Client__GetRequest g = MOONCAKE__CLIENT__GET_REQUEST__INIT;
	g.items = gis;
	g.n_items = 1;
	Mooncake__Client__Request q = MOONCAKE__CLIENT__REQUEST__INIT;
	q.op_case = MOONCAKE__CLIENT__REQUEST__OP_GET;
	q.get = &g;
	cr_assert_eq(agent__req_check(&q, true, &why), 0);
	Mooncake__Client__Region sp = MOONCAKE__CLIENT__REGION__INIT;
	sp.where = MOONCAKE__CLIENT__REGION__WHERE__BUFFER;
	sp.buffer = 1;
	g.spill = &sp;
	cr_assert_eq(agent__req_check(&q, true, &why), 0, "a spill in a buffer");
	sp.where = MOONCAKE__CLIENT__REGION__WHERE__ATTACHED;
	cr_assert_eq(agent__req_check(&q, true, &why), -EINVAL,
		     "a spill in the staging memfd or a buffer only");
}

Test(agent_req, register_needs_one_descriptor)
{
	Mooncake__Client__RegisterBufferRequest rb =
		MOONCAKE__CLIENT__REGISTER_BUFFER_REQUEST__INIT;
	Mooncake__Client__Request r = MOONCAKE__CLIENT__REQUEST__INIT;
	r.op_case = MOONCAKE__CLIENT__REQUEST__OP_REGISTER_BUFFER;
	r.register_buffer = &rb;
	rb.length = 4096;
	cr_assert_eq(agent__req_check(&r, true, &why), -EINVAL);
	r.nfds = 1;
	cr_assert_eq(agent__req_check(&r, true, &why), 0);
	rb.length = 0;
	cr_assert_eq(agent__req_check(&r, true, &why), -EINVAL);
}

Test(agent_req, process_memory_needs_no_descriptor_and_an_address)
{
	Mooncake__Client__RegisterBufferRequest rb =
		MOONCAKE__CLIENT__REGISTER_BUFFER_REQUEST__INIT;
	Mooncake__Client__Request r = MOONCAKE__CLIENT__REQUEST__INIT;
	r.op_case = MOONCAKE__CLIENT__REQUEST__OP_REGISTER_BUFFER;
	r.register_buffer = &rb;
	rb.process_memory = true;
	rb.length = 4096;
	cr_assert_eq(agent__req_check(&r, true, &why), -EINVAL, "no address");
	rb.address = 0x7f0000000000;
	cr_assert_eq(agent__req_check(&r, true, &why), 0);
	r.nfds = 1;
	cr_assert_eq(agent__req_check(&r, true, &why), -EINVAL, "a descriptor");
	r.nfds = 0;
	rb.offset = 8;
	cr_assert_eq(agent__req_check(&r, true, &why), -EINVAL, "an offset");
	rb.offset = 0;
	rb.address = UINT64_MAX - 100;
	cr_assert_eq(agent__req_check(&r, true, &why), -EINVAL, "overflow");
}

Test(agent_req, engine_and_segment)
{
	Mooncake__Client__EngineRequest eq = MOONCAKE__CLIENT__ENGINE_REQUEST__INIT;
	Mooncake__Client__Request r = MOONCAKE__CLIENT__REQUEST__INIT;
	r.op_case = MOONCAKE__CLIENT__REQUEST__OP_ENGINE;
	r.engine = &eq;
	cr_assert_eq(agent__req_check(&r, true, &why), 0);
	r.nfds = 1;
	cr_assert_eq(agent__req_check(&r, true, &why), -EINVAL, "no descriptors");
	Mooncake__Client__SegmentRequest sq = MOONCAKE__CLIENT__SEGMENT_REQUEST__INIT;
	r = (Mooncake__Client__Request)MOONCAKE__CLIENT__REQUEST__INIT;
	r.op_case = MOONCAKE__CLIENT__REQUEST__OP_SEGMENT;
	r.segment = &sq;
	sq.name = "";
	cr_assert_eq(agent__req_check(&r, true, &why), -EINVAL, "an empty name");
	sq.name = "10.0.0.1:12345";
	cr_assert_eq(agent__req_check(&r, true, &why), 0);
	char long_name[300];
	memset(long_name, 'a', sizeof(long_name) - 1);
	long_name[sizeof(long_name) - 1] = '\0';
	sq.name = long_name;
	cr_assert_eq(agent__req_check(&r, true, &why), -EINVAL, "too long");
}

/* ------------------------------------------------------------ lease cache */

Test(agent_lcache, window_and_invalidation)
{
	struct agent_lcache lc;
	bool renew;
	cr_assert_eq(agent__lcache_init(&lc, 4), 0);
	struct agent_rep rep = {.local = true, .offset = 640, .address = 0x1000 + 640};
	agent__lcache_put(&lc, (const uint8_t *)"k", 1, 100, NULL, &rep, 2000, 1000);
	const struct agent_lentry *e = agent__lcache_get(&lc, (const uint8_t *)"k", 1, 1999,
							 &renew);
	cr_assert_not_null(e);
	cr_assert_eq(e->size, 100);
	cr_assert_eq(e->rep.offset, 640);
	cr_assert_null(agent__lcache_get(&lc, (const uint8_t *)"k", 1, 2000, &renew),
		       "window ended");
	cr_assert_eq(lc.n, 0, "expired entry dropped");
	agent__lcache_put(&lc, (const uint8_t *)"k", 1, 100, NULL, &rep, 900, 1000);
	cr_assert_eq(lc.n, 0, "a window already over is not cached");
	agent__lcache_put(&lc, (const uint8_t *)"k", 1, 100, NULL, &rep, 5000, 1000);
	agent__lcache_del(&lc, (const uint8_t *)"k", 1);
	cr_assert_null(agent__lcache_get(&lc, (const uint8_t *)"k", 1, 1001, &renew),
		       "deleted");
	/* Full: expired entries are swept first, then everything goes. */
	char k[16];
	for (int i = 0; i < 4; i++) {
		snprintf(k, sizeof(k), "a%d", i);
		agent__lcache_put(&lc, (const uint8_t *)k, 2, 1, NULL, &rep,
				  i < 2 ? 1500 : 9000, 1000);
	}
	cr_assert_eq(lc.n, 4);
	agent__lcache_put(&lc, (const uint8_t *)"new", 3, 1, NULL, &rep, 9000, 1600);
	cr_assert_eq(lc.n, 3, "two expired swept, one added");
	cr_assert_not_null(agent__lcache_get(&lc, (const uint8_t *)"a3", 2, 1600, &renew));
	agent__lcache_put(&lc, (const uint8_t *)"x1", 2, 1, NULL, &rep, 9000, 1600);
	agent__lcache_put(&lc, (const uint8_t *)"x2", 2, 1, NULL, &rep, 9000, 1600);
	cr_assert_eq(lc.n, 1, "full of live entries: emptied, then the new one");
	struct agent_rep remote = {.local = false, .segment = "10.0.0.2:12345"};
	agent__lcache_put(&lc, (const uint8_t *)"r", 1, 1, NULL, &remote, 9000, 1600);
	e = agent__lcache_get(&lc, (const uint8_t *)"r", 1, 1601, &renew);
	cr_assert_str_eq(e->rep.segment, "10.0.0.2:12345", "segment copied");
	cr_assert_neq(e->rep.segment, remote.segment);
	agent__lcache_free(&lc);
}

Test(agent_lcache, hits_in_the_second_half_renew_once)
{
	struct agent_lcache lc;
	bool renew;
	cr_assert_eq(agent__lcache_init(&lc, 16), 0);
	struct agent_rep rep = {.local = true, .offset = 640};
	/* window [1000, 3000): renewals from 2000 on */
	agent__lcache_put(&lc, (const uint8_t *)"k", 1, 100, NULL, &rep, 3000, 1000);
	cr_assert_not_null(agent__lcache_get(&lc, (const uint8_t *)"k", 1, 1999, &renew));
	cr_assert(!renew, "first half: no renewal");
	cr_assert_not_null(agent__lcache_get(&lc, (const uint8_t *)"k", 1, 2000, &renew));
	cr_assert(renew, "second half: renew");
	cr_assert_not_null(agent__lcache_get(&lc, (const uint8_t *)"k", 1, 2001, &renew));
	cr_assert(!renew, "one renewal at a time");
	/* the answer (sent at 2000, lease 2000 ms: half is 3000 + ... ) extends */
	agent__lcache_extend(&lc, (const uint8_t *)"k", 1, 640, 100, 4000, 2100);
	const struct agent_lentry *e = agent__lcache_get(&lc, (const uint8_t *)"k", 1, 3500,
							 &renew);
	cr_assert_not_null(e, "still cached past the first window");
	cr_assert_eq(e->until_ms, 4000);
	cr_assert(renew, "3500 is in the second half of [2100, 4000): renew again");
	/* an answer naming another replica drops the entry */
	agent__lcache_extend(&lc, (const uint8_t *)"k", 1, 1280, 100, 6000, 3600);
	cr_assert_null(agent__lcache_get(&lc, (const uint8_t *)"k", 1, 3601, &renew),
		       "dropped");
	cr_assert(!renew);
	/* an answer for a key no longer cached adds nothing */
	agent__lcache_extend(&lc, (const uint8_t *)"gone", 4, 640, 100, 6000, 3600);
	cr_assert_eq(lc.n, 0);
	/* a failed renewal leaves the entry to expire at its window's end */
	agent__lcache_put(&lc, (const uint8_t *)"f", 1, 1, NULL, &rep, 5000, 4000);
	cr_assert_not_null(agent__lcache_get(&lc, (const uint8_t *)"f", 1, 4600, &renew));
	cr_assert(renew);
	cr_assert_null(agent__lcache_get(&lc, (const uint8_t *)"f", 1, 5000, &renew),
		       "expired");
	agent__lcache_free(&lc);
}
