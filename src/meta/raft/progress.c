/*
 * progress: what the leader knows about one member's log and how it feeds
 * it (etcd's flow control). PROBE sends one APP at a time and waits for an
 * answer; REPLICATE streams APPs optimistically, bounded by the inflight
 * window; SNAPSHOT waits for a snapshot transfer to finish.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "meta/raft/raft_int.h"

int raft__progress_init(struct raft__progress *p, uint64_t id, bool learner, uint64_t next,
			size_t max_inflight)
{
	memset(p, 0, sizeof(*p));
	p->inflights.buf = calloc(max_inflight, sizeof(uint64_t));
	if (!p->inflights.buf)
		return -ENOMEM;
	p->inflights.cap = max_inflight;
	p->id = id;
	p->learner = learner;
	p->next = next;
	p->state = RAFT_PROGRESS_PROBE;
	return 0;
}

void raft__progress_free(struct raft__progress *p)
{
	free(p->inflights.buf);
	p->inflights.buf = NULL;
}

void raft__progress_become_probe(struct raft__progress *p)
{
	if (p->state == RAFT_PROGRESS_SNAPSHOT)
		p->next = MC_MAX(p->match + 1, p->pending_snapshot + 1);
	else
		p->next = p->match + 1;
	p->state = RAFT_PROGRESS_PROBE;
	p->pending_snapshot = 0;
	p->probe_sent = false;
	raft__inflights_reset(&p->inflights);
}

void raft__progress_become_replicate(struct raft__progress *p)
{
	p->state = RAFT_PROGRESS_REPLICATE;
	p->next = p->match + 1;
	p->pending_snapshot = 0;
	p->probe_sent = false;
	raft__inflights_reset(&p->inflights);
}

void raft__progress_become_snapshot(struct raft__progress *p, uint64_t index)
{
	p->state = RAFT_PROGRESS_SNAPSHOT;
	p->pending_snapshot = index;
	p->probe_sent = false;
	raft__inflights_reset(&p->inflights);
}

bool raft__progress_maybe_update(struct raft__progress *p, uint64_t n)
{
	bool updated = false;

	if (p->match < n) {
		p->match = n;
		updated = true;
		p->probe_sent = false;
	}
	p->next = MC_MAX(p->next, n + 1);
	return updated;
}

bool raft__progress_maybe_decr_to(struct raft__progress *p, uint64_t rejected,
				  uint64_t match_hint)
{
	if (p->state == RAFT_PROGRESS_REPLICATE) {
		/* Stale rejection: the follower has matched beyond it since. */
		if (rejected <= p->match)
			return false;
		p->next = p->match + 1;
		return true;
	}
	/* Only the answer to the APP we sent last counts in PROBE. */
	if (p->next == 0 || p->next - 1 != rejected)
		return false;
	p->next = MC_MAX(MC_MIN(rejected, match_hint + 1), p->match + 1);
	p->probe_sent = false;
	return true;
}

bool raft__progress_is_paused(const struct raft__progress *p)
{
	switch (p->state) {
	case RAFT_PROGRESS_PROBE:
		return p->probe_sent;
	case RAFT_PROGRESS_REPLICATE:
		return raft__inflights_full(&p->inflights);
	case RAFT_PROGRESS_SNAPSHOT:
		return true;
	}
	return true;
}

void raft__inflights_add(struct raft__inflights *in, uint64_t index)
{
	if (in->count == in->cap)
		return; /* callers check full first */
	in->buf[(in->start + in->count) % in->cap] = index;
	in->count++;
}

void raft__inflights_free_le(struct raft__inflights *in, uint64_t index)
{
	while (in->count > 0 && in->buf[in->start] <= index) {
		in->start = (in->start + 1) % in->cap;
		in->count--;
	}
	if (in->count == 0)
		in->start = 0;
}

void raft__inflights_free_first(struct raft__inflights *in)
{
	if (in->count == 0)
		return;
	in->start = (in->start + 1) % in->cap;
	in->count--;
}

bool raft__inflights_full(const struct raft__inflights *in)
{
	return in->count == in->cap;
}

void raft__inflights_reset(struct raft__inflights *in)
{
	in->start = 0;
	in->count = 0;
}
