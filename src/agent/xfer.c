/*
 * xfer: the agent's reads and writes of other agents' segments, through
 * the transfer engine, on a copy thread (or started from the loop thread
 * when every segment is open already: agent__xfer_start_loop). A
 * request's remote pieces are collected (agent__xfer_add), submitted as
 * one batch (agent__xfer_start)
 * so the engine stripes and pipelines them, and waited for
 * (agent__xfer_finish) — the local copies of the same request run in
 * between. Segment handles are opened once per name per batch (the
 * engine caches connections across batches).
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "agent/agent_int.h"
#include "agent/xfer.h"
#include "common/log.h"
#include "transfer/transfer.h"

#define LOG_SUBSYS LOGS_AGENT

/* agent__xfer_start_loop: the batch completed inside te_submit (every
 * piece copied by the loop thread) or after it returned. */
enum { XS_SUBMITTING, XS_DONE_IN_SUBMIT, XS_SUBMITTED };

struct xseg {
	const char *name;
	struct te_segment *s;
	int err;
};

struct agent_xfer {
	struct te_request *reqs;
	int **errs;
	uint32_t **crcs; /* agent__xfer_add_summed's, else NULL */
	size_t n, cap;
	struct xseg *segs;
	size_t nsegs, segs_cap;
	struct te_batch *batch;
	bool loop;            /* on the loop thread: open segments only */
	bool missed;          /* ... and one was not */
	size_t inline_bytes;  /* agent__xfer_inline */
	struct te_engine *te; /* agent__xfer_engine's, or NULL: the agent's */
	struct agent *a;      /* agent__xfer_start_loop: */
	struct agent_job *job;
	atomic_int state; /* XS_*: who finishes the job */
};

static struct te_engine *engine(const struct agent *a, const struct agent_xfer *x)
{
	return x->te ? x->te : a->te;
}

void agent__xfer_engine(struct agent_xfer *x, struct te_engine *te)
{
	x->te = te;
}

static struct xseg *segment(struct agent *a, struct agent_xfer *x, const char *name)
{
	for (size_t i = 0; i < x->nsegs; i++)
		if (strcmp(x->segs[i].name, name) == 0)
			return &x->segs[i];
	if (x->nsegs == x->segs_cap) {
		size_t cap = x->segs_cap ? x->segs_cap * 2 : 4;
		struct xseg *p = realloc(x->segs, cap * sizeof(*p));
		if (!p)
			return NULL;
		x->segs = p;
		x->segs_cap = cap;
	}
	struct xseg *g = &x->segs[x->nsegs++];
	g->name = name;
	g->s = NULL;
	if (x->loop) {
		g->err = te_open_segment_cached(engine(a, x), name, &g->s);
		if (g->err == -EAGAIN)
			x->missed = true;
		return g;
	}
	g->err = te_open_segment(engine(a, x), name, &g->s);
	if (g->err)
		log_warn("cannot open segment %s: %s", name, mc_strerror(g->err));
	return g;
}

struct agent_xfer *agent__xfer_new(void)
{
	return calloc(1, sizeof(struct agent_xfer));
}

static void add(struct agent *a, struct agent_xfer *x, const char *seg, bool write,
		void *local, uint64_t remote, size_t len, bool device, int *err, uint32_t *crc)
{
	if (*err)
		return;
	if (!engine(a, x)) {
		*err = MC_EUNAVAILABLE;
		return;
	}
	if (len == 0) {
		if (crc)
			*crc = 0; /* (the checksum of nothing) */
		return;
	}
	struct xseg *g = segment(a, x, seg);
	if (!g) {
		*err = -ENOMEM;
		return;
	}
	if (g->err) {
		if (!x->missed)
			*err = g->err;
		return;
	}
	if (x->n == x->cap) {
		size_t cap = x->cap ? x->cap * 2 : 8;
		struct te_request *r = realloc(x->reqs, cap * sizeof(*r));
		if (!r) {
			*err = -ENOMEM;
			return;
		}
		x->reqs = r;
		int **e = realloc(x->errs, cap * sizeof(*e));
		if (!e) {
			*err = -ENOMEM;
			return;
		}
		x->errs = e;
		uint32_t **c = realloc(x->crcs, cap * sizeof(*c));
		if (!c) {
			*err = -ENOMEM;
			return;
		}
		x->crcs = c;
		x->cap = cap;
	}
	x->reqs[x->n] = (struct te_request){
		.op = write ? TE_WRITE : TE_READ,
		.local = local,
		.segment = g->s,
		.remote_addr = remote,
		.len = len,
		.local_device = device,
		.want_crc = crc != NULL,
	};
	x->errs[x->n] = err;
	x->crcs[x->n] = crc;
	x->n++;
}

void agent__xfer_add(struct agent *a, struct agent_xfer *x, const char *seg, bool write,
		     void *local, uint64_t remote, size_t len, int *err)
{
	add(a, x, seg, write, local, remote, len, false, err, NULL);
}

void agent__xfer_add_summed(struct agent *a, struct agent_xfer *x, const char *seg,
			    void *local, uint64_t remote, size_t len, int *err, uint32_t *crc)
{
	add(a, x, seg, false, local, remote, len, false, err, crc);
}

void agent__xfer_add_device(struct agent *a, struct agent_xfer *x, const char *seg, bool write,
			    void *local, uint64_t remote, size_t len, int *err)
{
	add(a, x, seg, write, local, remote, len, true, err, NULL);
}

struct agent_xfer *agent__xfer_new_loop(void)
{
	struct agent_xfer *x = agent__xfer_new();
	if (x)
		x->loop = true;
	return x;
}

void agent__xfer_inline(struct agent_xfer *x, size_t bytes)
{
	x->inline_bytes = bytes;
}

bool agent__xfer_missed(const struct agent_xfer *x)
{
	return x->missed;
}

/* On an engine thread, or the loop's inside te_submit_inline: then the
 * loop finishes the job itself, without the pool's wake-up. */
static void on_submitted_done(struct te_batch *b, void *ud)
{
	struct agent_xfer *x = ud;
	(void)b;
	int s = XS_SUBMITTING;
	if (atomic_compare_exchange_strong(&x->state, &s, XS_DONE_IN_SUBMIT))
		return;
	agent__pool_complete(&x->a->pool, x->job);
}

bool agent__xfer_start_loop(struct agent *a, struct agent_xfer *x, struct agent_job *j)
{
	x->a = a;
	x->job = j;
	agent__pool_begin(&a->pool, j);
	if (x->n == 0)
		return true;
	atomic_store(&x->state, XS_SUBMITTING);
	int rc = te_submit_inline(engine(a, x), x->reqs, x->n, x->inline_bytes,
				  on_submitted_done, x, &x->batch);
	if (rc) {
		x->batch = NULL;
		for (size_t i = 0; i < x->n; i++)
			if (!*x->errs[i])
				*x->errs[i] = rc;
		return true;
	}
	int s = XS_SUBMITTING;
	return !atomic_compare_exchange_strong(&x->state, &s, XS_SUBMITTED);
}

void agent__xfer_start(struct agent *a, struct agent_xfer *x)
{
	if (x->n == 0)
		return;
	int rc = te_submit(engine(a, x), x->reqs, x->n, &x->batch);
	if (rc) {
		x->batch = NULL;
		for (size_t i = 0; i < x->n; i++)
			if (!*x->errs[i])
				*x->errs[i] = rc;
	}
}

void agent__xfer_finish(struct agent *a, struct agent_xfer *x)
{
	(void)a;
	if (x->batch) {
		struct te_result *res = calloc(x->n, sizeof(*res));
		if (te_wait(x->batch, 0) != 0 || !res) {
			for (size_t i = 0; i < x->n; i++)
				if (!*x->errs[i])
					*x->errs[i] = res ? MC_ETIMEDOUT : -ENOMEM;
		} else {
			(void)te_poll(x->batch, res);
			for (size_t i = 0; i < x->n; i++) {
				if (res[i].status != TE_DONE && !*x->errs[i])
					*x->errs[i] = res[i].err ? res[i].err : MC_EINTERNAL;
				if (x->crcs[i])
					*x->crcs[i] = res[i].crc;
			}
		}
		free(res);
		te_batch_free(x->batch);
	}
	for (size_t i = 0; i < x->nsegs; i++)
		if (x->segs[i].s)
			te_close_segment(x->segs[i].s);
	free(x->segs);
	free(x->reqs);
	free(x->errs);
	free(x->crcs);
	free(x);
}
