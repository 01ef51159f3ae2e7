/*
 * read: linearizable reads in rounds. Every read that arrives while a
 * round is in flight waits for the next one; a round is one
 * raft_read_index whose context is the round's sequence number, so a late
 * answer to an old round is told apart. When the core answers, the
 * round's reads wait until the applied index reaches the read index, then
 * are served from the local state. A round lost to a leader change or
 * unanswered for an election timeout goes back to the front of the queue.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/metrics.h"
#include "common/util.h"
#include "meta/meta_int.h"

#define LOG_SUBSYS LOGS_META

void meta__read_round(struct meta_node *n)
{
	uint8_t ctx[8];

	n->round_needed = false;
	if (n->round_in_flight || !n->reads.head || !n->running)
		return;
	if (n->in_ready) {
		n->round_needed = true;
		return;
	}
	uint64_t seq = ++n->read_seq;
	for (int i = 0; i < 8; i++)
		ctx[i] = (uint8_t)(seq >> (8 * i));
	int rc = raft_read_index(n->raft, ctx, sizeof(ctx));
	if (rc == MC_ENOT_LEADER)
		return; /* no leader known: retried on a leader change or tick */
	if (rc) {
		if (rc == -ENOMEM || rc == MC_EINTERNAL)
			meta__fatal(n, rc, "the Raft core failed");
		meta__fail_list(&n->reads, rc);
		return;
	}
	while (n->reads.head) {
		struct meta__op *op = n->reads.head;
		meta__oplist_remove(op);
		op->read_round = seq;
		meta__oplist_push(&n->round, op);
	}
	n->round_in_flight = true;
	n->round_started_ms = meta__now(n);
	meta__kick(n);
}

/* The round in flight is lost (leader change, timeout): its reads go
 * back to the front of the queue for the next round. */
void meta__read_retry(struct meta_node *n)
{
	if (!n->round_in_flight)
		return;
	n->round_in_flight = false;
	while (n->round.tail) {
		struct meta__op *op = n->round.tail;
		meta__oplist_remove(op);
		op->list = &n->reads;
		op->prev = NULL;
		op->next = n->reads.head;
		if (n->reads.head)
			n->reads.head->prev = op;
		else
			n->reads.tail = op;
		n->reads.head = op;
		n->reads.n++;
	}
	n->round_needed = true;
}

void meta__read_serve(struct meta_node *n)
{
	struct meta__op *op = n->read_wait.head;
	while (op) {
		struct meta__op *next = op->next;
		if (op->read_index <= n->applied)
			meta__serve_local(n, op);
		op = next;
	}
}

void meta__read_state(struct meta_node *n, const struct raft_read_state *rs)
{
	uint64_t seq = 0;
	if (rs->ctx_len != 8)
		return;
	for (int i = 0; i < 8; i++)
		seq |= (uint64_t)((const uint8_t *)rs->ctx)[i] << (8 * i);
	if (!n->round_in_flight || seq != n->read_seq)
		return; /* an old round's late answer */
	while (n->round.head) {
		struct meta__op *op = n->round.head;
		meta__oplist_remove(op);
		op->read_index = rs->index;
		meta__oplist_push(&n->read_wait, op);
	}
	n->round_in_flight = false;
	if (n->reads.head)
		n->round_needed = true;
}

void meta__read_tick(struct meta_node *n)
{
	if (n->round_in_flight && meta__now(n) - n->round_started_ms >= n->o.election_ms)
		meta__read_retry(n);
	if (n->reads.head && !n->round_in_flight)
		n->round_needed = true;
}
