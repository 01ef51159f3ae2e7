/*
 * xfer.h: the agent's reads and writes of other agents' segments
 * through the transfer engine (xfer.c). A shared service: it calls the
 * copy threads (a piece ending from the loop's side) and the engine.
 */
#ifndef MC_AGENT_XFER_H
#define MC_AGENT_XFER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct agent;
struct agent_job;
struct te_engine;

/* xfer.c: remote reads and writes through the transfer engine, on a
 * copy thread. add() records a piece (its error goes to *err, which must
 * stay valid until finish; an item already failed is skipped); start()
 * submits them all; finish() waits and frees. Without an engine every
 * piece fails with MC_EUNAVAILABLE. */
struct agent_xfer;
struct agent_xfer *agent__xfer_new(void);
/* Make x's pieces with te (a session's own engine; borrowed until
 * finish) instead of the agent's; before the first add. */
void agent__xfer_engine(struct agent_xfer *x, struct te_engine *te);
void agent__xfer_add(struct agent *a, struct agent_xfer *x, const char *segment, bool write,
		     void *local, uint64_t remote, size_t len, int *err);
/* A read whose bytes' CRC-32C the engine sums as they land
 * (te_request.want_crc): *crc holds it once finish has run and *err is
 * still 0. */
void agent__xfer_add_summed(struct agent *a, struct agent_xfer *x, const char *segment,
			    void *local, uint64_t remote, size_t len, int *err, uint32_t *crc);
/* The same for local device memory (a client's dma-buf, by its address
 * in the client): moved by RDMA only (te_request.local_device). */
void agent__xfer_add_device(struct agent *a, struct agent_xfer *x, const char *segment,
			    bool write, void *local, uint64_t remote, size_t len, int *err);
void agent__xfer_start(struct agent *a, struct agent_xfer *x);
void agent__xfer_finish(struct agent *a, struct agent_xfer *x);
/* The same from the loop thread, without a copy thread: an xfer from
 * agent__xfer_new_loop takes only segments the engine has open already
 * (agent__xfer_missed says one was not: drop it with finish, nothing was
 * sent, and go the copy-thread way); agent__xfer_start_loop submits and
 * has j's done run on the loop when every piece is over (counted as a
 * pending job of the pool), where finish returns at once — or returns
 * true when every piece is over already (copied by the loop itself): the
 * caller then finishes j with agent__pool_done_now when it is ready. */
struct agent_xfer *agent__xfer_new_loop(void);
bool agent__xfer_missed(const struct agent_xfer *x);
/* Let agent__xfer_start_loop copy up to bytes of same-host pieces on the
 * loop itself (te_submit_inline): for a request alone, see solo_get. */
void agent__xfer_inline(struct agent_xfer *x, size_t bytes);
bool agent__xfer_start_loop(struct agent *a, struct agent_xfer *x, struct agent_job *j);

#endif
