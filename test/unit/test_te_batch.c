/*
 * test_te_batch: the batch layer (transfer/batch.c) over a fake transport
 * whose paths can be told to fail: slicing and striping of requests over
 * the paths, a slice whose path breaks retried on another path and the
 * request succeeding, every path failing -> MC_EUNAVAILABLE after each
 * path was tried once, a remote refusal final (no retry), length 0, per
 * request status, the completion callback, te_wait and argument errors.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "transfer/te_int.h"

#define NPATHS 4
#define SLICE ((size_t)64 << 10)

struct fake {
	struct te_peer base;
	uint32_t fail_retry; /* paths that break */
	uint32_t refuse;     /* paths that answer MC_EREMOTE_ACCESS */
	unsigned per_path[NPATHS];
	unsigned submits;
	bool freed;
	unsigned unbinds;
};

static void fake_submit(struct te_peer *p, struct te_slice *s)
{
	struct fake *f = (struct fake *)p;
	f->submits++;
	f->per_path[s->path]++;
	if (f->fail_retry >> s->path & 1) {
		atomic_fetch_and(&p->alive, ~(1u << s->path));
		te__slice_done(s, MC_EUNAVAILABLE, true);
		return;
	}
	if (f->refuse >> s->path & 1) {
		te__slice_done(s, MC_EREMOTE_ACCESS, false);
		return;
	}
	if (s->op == TE_READ)
		memset(s->local, 0x5a, s->len);
	te__slice_done(s, 0, false);
}

static void fake_unbind(struct te_peer *p, void *route)
{
	(void)route;
	((struct fake *)p)->unbinds++;
}

static void fake_free(struct te_peer *p)
{
	((struct fake *)p)->freed = true;
}

static void fake_disconnect(struct te_peer *p)
{
	(void)p;
}

static const struct te_xport_ops fake_ops = {
	.name = "fake",
	.proto = TE_PROTO_TCP,
	.submit = fake_submit,
	.unbind = fake_unbind,
	.disconnect = fake_disconnect,
	.peer_free = fake_free,
};

struct rig {
	struct te_engine e;
	struct te_segment s;
	struct fake f;
};

static void rig_init(struct rig *r)
{
	memset(r, 0, sizeof(*r));
	r->e.slice_bytes = SLICE;
	r->s.e = &r->e;
	strcpy(r->s.name, "fake");
	pthread_mutex_init(&r->s.mu, NULL);
	pthread_cond_init(&r->s.cv, NULL);
	r->s.state = TE_SEG_OPEN;
	r->s.parked_tail = &r->s.parked;
	r->f.base.ops = &fake_ops;
	r->f.base.seg = &r->s;
	r->f.base.npaths = NPATHS;
	atomic_init(&r->f.base.alive, (1u << NPATHS) - 1);
	atomic_init(&r->f.base.refs, 1);
	r->s.remote = &r->f.base;
}

static void rig_fini(struct rig *r)
{
	cr_assert_eq(atomic_load(&r->f.base.refs), 1, "requests gave their peer back");
	pthread_mutex_destroy(&r->s.mu);
	pthread_cond_destroy(&r->s.cv);
}

static int done_calls;

static void on_done(struct te_batch *b, void *ud)
{
	(void)b;
	cr_assert_eq(ud, &done_calls);
	done_calls++;
}

Test(te_batch, striping_and_status)
{
	struct rig r;
	rig_init(&r);
	static uint8_t buf[4 * SLICE + 3];
	struct te_request q[3] = {
		{TE_READ, buf, &r.s, 0x1000, 4 * SLICE + 3, false, false}, /* 5 slices */
		{TE_WRITE, buf, &r.s, 0x1000, 0, false, false},            /* nothing to do */
		{TE_WRITE, buf, &r.s, 0x9000, 1, false, false},
	};
	struct te_batch *b;
	done_calls = 0;
	cr_assert_eq(te_submit_notify(&r.e, q, 3, on_done, &done_calls, &b), 0);
	cr_assert_eq(te_wait(b, 1000), 0);
	cr_assert_eq(done_calls, 1);
	struct te_result res[3];
	cr_assert_eq(te_poll(b, res), 0);
	for (int i = 0; i < 3; i++)
		cr_assert_eq(res[i].status, TE_DONE, "request %d", i);
	cr_assert_eq(b->nslices, 6);
	cr_assert_eq(r.f.submits, 6);
	/* 5 slices striped over 4 paths from one start: every path used */
	for (int p = 0; p < NPATHS; p++)
		cr_assert(r.f.per_path[p] >= 1, "path %d", p);
	cr_assert_eq(r.f.unbinds, 2, "bound requests were unbound");
	cr_assert_eq(buf[4 * SLICE + 2], 0x5a, "last byte of the read");
	te_batch_free(b);
	rig_fini(&r);
}

Test(te_batch, broken_path_is_retried_elsewhere)
{
	struct rig r;
	rig_init(&r);
	static uint8_t buf[16 * SLICE];
	struct te_request q = {TE_WRITE, buf, &r.s, 0x1000, sizeof(buf), false, false};
	r.f.fail_retry = 1u << 1;
	struct te_batch *b;
	cr_assert_eq(te_submit(&r.e, &q, 1, &b), 0);
	cr_assert_eq(te_wait(b, 1000), 0);
	struct te_result res;
	te_poll(b, &res);
	cr_assert_eq(res.status, TE_DONE, "err %d", res.err);
	/* path 1 failed its slice(s) once; each was done elsewhere */
	cr_assert(r.f.per_path[1] >= 1);
	cr_assert_eq(r.f.submits, 16 + r.f.per_path[1]);
	te_batch_free(b);
	rig_fini(&r);
}

Test(te_batch, every_path_broken_fails_the_request)
{
	struct rig r;
	rig_init(&r);
	static uint8_t buf[SLICE];
	struct te_request q = {TE_READ, buf, &r.s, 0x1000, 100, false, false};
	r.f.fail_retry = (1u << NPATHS) - 1;
	struct te_batch *b;
	cr_assert_eq(te_submit(&r.e, &q, 1, &b), 0);
	cr_assert_eq(te_wait(b, 1000), 0);
	struct te_result res;
	te_poll(b, &res);
	cr_assert_eq(res.status, TE_FAILED);
	cr_assert_eq(res.err, MC_EUNAVAILABLE);
	for (int p = 0; p < NPATHS; p++)
		cr_assert_eq(r.f.per_path[p], 1, "each path tried once (path %d)", p);
	te_batch_free(b);
	/* with no path left, a new request fails without reaching one */
	unsigned before = r.f.submits;
	cr_assert_eq(te_submit(&r.e, &q, 1, &b), 0);
	cr_assert_eq(te_wait(b, 1000), 0);
	te_poll(b, &res);
	cr_assert_eq(res.err, MC_EUNAVAILABLE);
	cr_assert_eq(r.f.submits, before);
	te_batch_free(b);
	rig_fini(&r);
}

Test(te_batch, refusal_is_final)
{
	struct rig r;
	rig_init(&r);
	static uint8_t buf[SLICE];
	struct te_request q[2] = {{TE_READ, buf, &r.s, 0x1000, 10, false, false},
				  {TE_READ, buf, &r.s, 0x2000, 10, false, false}};
	r.f.refuse = (1u << NPATHS) - 1;
	struct te_batch *b;
	cr_assert_eq(te_submit(&r.e, q, 2, &b), 0);
	cr_assert_eq(te_wait(b, 1000), 0);
	struct te_result res[2];
	te_poll(b, res);
	cr_assert_eq(res[0].err, MC_EREMOTE_ACCESS);
	cr_assert_eq(res[1].err, MC_EREMOTE_ACCESS);
	cr_assert_eq(r.f.submits, 2, "no retry of a refusal");
	te_batch_free(b);
	rig_fini(&r);
}

Test(te_batch, argument_errors)
{
	struct rig r;
	rig_init(&r);
	static uint8_t buf[16];
	struct te_batch *b;
	struct te_request q = {TE_READ, buf, NULL, 0, 16, false, false};
	cr_assert_eq(te_submit(&r.e, &q, 1, &b), -EINVAL); /* no segment */
	q.segment = &r.s;
	q.local = NULL;
	cr_assert_eq(te_submit(&r.e, &q, 1, &b), -EINVAL); /* no buffer */
	cr_assert_eq(te_submit(&r.e, &q, 0, &b), -EINVAL);
	q.local = buf;
	q.op = 7;
	cr_assert_eq(te_submit(&r.e, &q, 1, &b), -EINVAL);
	q.op = TE_READ;
	q.len = (size_t)SLICE * TE_MAX_BATCH_SLICES + 1;
	cr_assert_eq(te_submit(&r.e, &q, 1, &b), -E2BIG);
	/* a segment that failed to open fails its requests */
	r.s.state = TE_SEG_FAILED;
	r.s.err = MC_ESEGMENT_NOT_FOUND;
	q.len = 16;
	cr_assert_eq(te_submit(&r.e, &q, 1, &b), 0);
	struct te_result res;
	te_poll(b, &res);
	cr_assert_eq(res.err, MC_ESEGMENT_NOT_FOUND);
	te_batch_free(b);
	rig_fini(&r);
}
