/*
 * batch.h: master calls of concurrent requests, coalesced (batch.c). A
 * shared service below the operations and above the master calls
 * (mcall.c), which it alone calls.
 */
#ifndef MC_AGENT_BATCH_H
#define MC_AGENT_BATCH_H

#include <stddef.h>
#include <uv.h>

#include "agent/mcall.h"

struct agent;

enum agent_bkind {
	AGENT_B_PUT_START, /* BatchPutStartRequest */
	AGENT_B_PUT_END,   /* BatchKeysRequest */
	AGENT_B_GET,       /* BatchKeysRequest -> BatchGetReplicas */
	AGENT_B_EXIST,     /* BatchKeysRequest */
	AGENT_B_COMMIT,    /* BatchCommitRequestRaw (one segment and epoch per call) */
	AGENT_B_COUNT
};

struct agent_bwait;

struct agent_bqueue {
	struct agent_bwait *head, *tail;
	size_t nitems;
	unsigned nwaits;
};

/* The queues, embedded in struct agent (touched only by batch.c). */
struct agent_batch {
	uv_check_t check; /* sends the queues after the loop's I/O */
	struct agent_bqueue q[AGENT_B_COUNT];
};

void agent__batch_init(struct agent *a);
/* Like agent__mcall of the kind's batch method, coalesced with the other
 * requests of this loop iteration (see batch.c). */
void agent__bcall(struct agent *a, enum agent_bkind k, const ProtobufCMessage *req,
		  agent_mcall_cb cb, void *ud);
/* Send every queue now. */
void agent__batch_flush(struct agent *a);
/* Send every queue, then close the check handle; on_closed gets it with
 * data pointing at the agent. Returns how many handles (1). */
unsigned agent__batch_close(struct agent *a, uv_close_cb on_closed);

#endif
