/*
 * tcp_int: what the tcp transport's three files share. tcp.c is the
 * transport itself — the listener, socket settings, the control calls
 * other transports make over the data port, timeouts, the ops table;
 * tcp_srv.c serves peers' connections (handshake, range checks, reading
 * and writing registered memory, answers); tcp_cli.c is this engine's
 * side of its connections to peers (slices queued per peer, pipelined,
 * answers matched in order). Each side's connection struct is its own;
 * the transport keeps both lists for its timeouts.
 */
#ifndef MC_TRANSFER_TCP_INT_H
#define MC_TRANSFER_TCP_INT_H

#include <stdint.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "transfer/te_int.h"

#define TE_TCP_STAGE_BYTES ((size_t)64 << 10) /* per connection, either side */
#define TE_TCP_MAX_IOV 64
#define TE_TCP_READ_BUDGET ((size_t)2 << 20) /* per wake-up, for fairness */

/* This transport's ops (tcp.c), registered in engine.c. */
extern const struct te_xport_ops te__tcp_ops;

struct srv_conn;
struct cli_conn;

struct tcp_xport {
	struct te_engine *e;
	int lfd;
	uint16_t port;
	struct te_ioh lioh;
	int sndbuf, rcvbuf; /* 0: leave autotuning */
	atomic_uint rr;
	pthread_mutex_t mu; /* the lists below */
	struct srv_conn *srv;
	struct cli_conn *cli;
	struct te_hs_bound hs; /* connections still in their handshake */
};

/* tcp.c: socket helpers both sides use. */
void te__tcp_tune_socket(struct tcp_xport *x, int fd);
/* How much to read into the stage behind a body of `left` bytes read
 * straight into memory: after a large body only the next header, after a
 * small one as much as fits. */
size_t te__tcp_stage_tail(size_t left, size_t room);
/* sendmsg without SIGPIPE (the process may not ignore the signal).
 * *full is set when it sent less than the n buffers hold: the socket's
 * buffer is full, and another send before EPOLLOUT would only fail with
 * EAGAIN. */
ssize_t te__tcp_send_iov(int fd, struct iovec *iov, int n, bool *full);
/* Connect with a deadline. Returns the fd or a negative code. */
int te__tcp_dial(const struct sockaddr_storage *ss, uint64_t deadline);

/* tcp_srv.c: the listener's callback; the serving connections of worker w
 * that made no progress since limit ms before now are closed; after the
 * workers stopped, every serving connection is freed. */
void te__tcp_on_accept(struct te_ioh *h, uint32_t events);
void te__tcp_srv_tick(struct tcp_xport *x, struct te_worker *w, uint64_t now, uint64_t limit);
void te__tcp_srv_free_all(struct tcp_xport *x);

/* tcp_cli.c: the ops of a peer (te_xport_ops.connect, submit, disconnect,
 * peer_free), and the timeout of worker w's client connections. */
int te__tcp_connect(struct te_xport *xp, struct te_segment *seg, const struct te_desc *d,
		    struct te_peer **out) MC_MUST_CHECK;
void te__tcp_submit(struct te_peer *bp, struct te_slice *s);
void te__tcp_disconnect(struct te_peer *bp);
void te__tcp_peer_free(struct te_peer *bp);
void te__tcp_cli_tick(struct tcp_xport *x, struct te_worker *w, uint64_t now, uint64_t limit);

#endif
