/*
 * mcall.h: calls to the master leader (mcall.c). A shared service: the
 * master link, the mirror, the put lease, the batcher and the
 * operations call the master through it. Which master it calls is the
 * master link's decision (mlink.c, agent__mcall_set_master); a standby's
 * redirect is handed to the link through the on_leader hook it sets.
 */
#ifndef MC_AGENT_MCALL_H
#define MC_AGENT_MCALL_H

#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>
#include <stdint.h>

struct agent;
struct agent_mcall;
struct rpc_client;

typedef void (*agent_mcall_cb)(void *ud, int err, const char *message,
			       const ProtobufCMessage *resp);

/* The calls' state, embedded in struct agent (touched only by mcall.c). */
struct agent_mcalls {
	struct rpc_client *client; /* to the master in use, or NULL */
	char addr[128];            /* its address ("" none) */
	struct agent_mcall *calls; /* in flight or parked */
	uint64_t timeout_ms;       /* per call */
	/* A standby named another leader: the owner of the choice (mlink.c)
	 * decides whether to use it. */
	void (*on_leader)(struct agent *a, const char *addr, uint64_t view);
};

void agent__mcalls_init(struct agent *a, uint64_t timeout_ms,
			void (*on_leader)(struct agent *a, const char *addr, uint64_t view));

/*
 * Call method ("PutStart") of mooncake.master.Master on the leader. req
 * must stay valid until cb runs (it is sent again after a redirect). cb
 * runs exactly once, never from inside this call, with err 0 and resp
 * (borrowed), or the error: the code of the master's grpc-message,
 * MC_EUNAVAILABLE (no master known, or unreachable), MC_ETIMEDOUT.
 */
void agent__mcall(struct agent *a, const char *method, const ProtobufCMessage *req,
		  const ProtobufCMessageDescriptor *resp_desc, agent_mcall_cb cb, void *ud);

/*
 * Send calls to addr from now on ("": no master is known; calls wait).
 * Calls in flight to the one before come back and are sent again. Returns
 * false when addr is the master in use already (nothing changed). A
 * client that cannot be made is logged and leaves no master in use.
 */
bool agent__mcall_set_master(struct agent *a, const char *addr);
/* The master in use ("" none), and whether calls can go out to it. */
const char *agent__mcall_master(const struct agent *a);
bool agent__mcall_connected(const struct agent *a);
/* Send parked calls whose pause ended, fail those past their deadline
 * (all of them with MC_ESHUTDOWN once the agent stops). The owner of the
 * link ticks this. */
void agent__mcall_poll(struct agent *a);
uint64_t agent__mcall_timeout_ms(const struct agent *a);
/* Calls made from now on get at most ms (stopping: a bounded unmount). */
void agent__mcall_limit_timeout(struct agent *a, uint64_t ms);
/* Drop the client (stopping): calls in flight end with MC_ECANCELLED. */
void agent__mcall_disconnect(struct agent *a);

/* The error code a master call failed with, from status and message. */
int agent__master_err(int status, const char *message);

#endif
