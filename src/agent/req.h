/*
 * req.h: the check of a client request against the protocol's limits
 * (req.c), before anything is done with it. Pure (also the fuzz target's
 * entry).
 */
#ifndef MC_AGENT_REQ_H
#define MC_AGENT_REQ_H

#include <stdbool.h>

#include "client.pb-c.h"
#include "common/err.h"

#define AGENT_MAX_KEY_BYTES 4096u
#define AGENT_MAX_ITEMS 65536u      /* per request */
#define AGENT_MAX_REPLICAS 16u      /* per put, and taken from a placement */
#define AGENT_MAX_SEGMENT_NAME 255u /* bytes (the engine's TE_NAME_MAX) */

/*
 * Check a decoded request against the protocol's limits before anything
 * is done with it: the op is known, nfds is within bounds, item counts,
 * key lengths (per item: -EINVAL marks the item), region kinds and
 * fd_index values. Returns 0, or the error to reply with (-EINVAL,
 * -EOPNOTSUPP for an unknown op, MC_EPROTOCOL for hello out of place);
 * *why names the problem. Pure.
 */
int agent__req_check(const Mooncake__Client__Request *m, bool hello_done,
		     const char **why) MC_MUST_CHECK;
/* Is a key acceptable (1..AGENT_MAX_KEY_BYTES)? */
bool agent__key_ok(const ProtobufCBinaryData *k);

#endif
