/*
 * inst.h: the transfer engines the agent runs for sessions that want one
 * of their own (inst.c) — Mooncake's TransferEngine instances. Each has
 * its own segment named "host:port" by an RPC port of its own (its
 * session id: two processes on a node are told apart), its own data
 * port, and is published in P2P mode and to meta like the agent's
 * engine. A shared service below the sessions and the memory maps: it
 * calls only the copy threads (te_free off the loop).
 */
#ifndef MC_AGENT_INST_H
#define MC_AGENT_INST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/auth.h"
#include "common/err.h"
#include "transfer/transfer.h"

/* A segment name, NUL included (the engine's longest is 255 bytes). */
#define AGENT_INST_NAME_BYTES 256

struct agent;
struct agent_inst;
struct rpc_server;

/* The instances' state, embedded in struct agent (touched only by
 * inst.c). */
struct agent_insts {
	bool enabled;        /* agent_opts gave engine options */
	struct te_opts opts; /* their template (strings below) */
	char *cluster_id, *rdma_devices;
	char host[80]; /* what the engines listen on */
	uint8_t secret[MC_SECRET_MAX_BYTES];
	unsigned live; /* not freed yet */
};

/*
 * Keep what the instances need of the agent's engine options t (copied:
 * t may go away; its meta client and metrics registry are borrowed and
 * must outlive every instance). t NULL: sessions cannot have engines.
 * Errors: -ENOMEM.
 */
int agent__insts_init(struct agent *a, const struct te_opts *t) MC_MUST_CHECK;
void agent__insts_free(struct agent *a);
/* Instances not freed yet (a stop waits for none). */
unsigned agent__insts_live(const struct agent *a);

/*
 * Start an instance (on the loop thread): an RPC server on the agent's
 * host and a free port, and an engine serving it; *out holds one
 * reference. Errors: -EOPNOTSUPP (the agent has no engine options),
 * those of rpc_server_listen and te_new (logged), -ENOMEM.
 */
int agent__inst_new(struct agent *a, struct agent_inst **out) MC_MUST_CHECK;
void agent__inst_ref(struct agent_inst *i);
/* Drop a reference (NULL: nothing). The last one stops the engine and
 * its RPC server and frees them; the copy threads are used for that, so
 * a stop of the agent waits for it (agent__insts_live). */
void agent__inst_unref(struct agent_inst *i);
struct te_engine *agent__inst_te(const struct agent_inst *i);
/* Its segment name, the session id "host:port". */
const char *agent__inst_name(const struct agent_inst *i);

#endif
