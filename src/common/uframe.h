/*
 * uframe: frames on a Unix stream socket with file descriptors beside them
 * — the transport of the client <-> agent protocol (proto/client.proto).
 *
 * A frame is a 4-byte little-endian length N (1..max) and N bytes. File
 * descriptors travel as SCM_RIGHTS on the sendmsg() that carries a frame's
 * first byte; the receiver queues them in arrival order and the frame's
 * own contents say how many belong to it (mc_uframe_rx_take_fds). The
 * kernel never delivers a descriptor ahead of the bytes it was sent with,
 * so once a frame is complete its descriptors are queued. A receiver that
 * must not trust its peer takes them with mc_uframe_rx_frame_fds, which
 * knows which bytes brought each one: descriptors no frame announced are
 * closed at once and the frame refused, and none is held for long.
 *
 * The receive side is split into a pure part (mc_uframe_rx_feed/next: no
 * I/O, fuzzable) and the recvmsg() that fills it. Used by the agent (non-
 * blocking sockets) and by libmooncake (blocking), so it depends on
 * nothing but libc. Not thread-safe: one reader per rx.
 */
#ifndef MC_COMMON_UFRAME_H
#define MC_COMMON_UFRAME_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "common/err.h"

#define MC_UFRAME_MAX_BYTES (16u << 20) /* largest frame body */
#define MC_UFRAME_MAX_FDS 16u           /* descriptors per frame */
#define MC_UFRAME_HDR 4u

/* A received descriptor and the stream bytes [a, b) of the recvmsg()
 * that brought it (positions count from the stream's first byte). */
struct mc_uframe_fd {
	int fd;
	uint64_t a, b;
};

struct mc_uframe_rx {
	size_t max_frame;
	uint8_t *buf; /* received bytes [off, len) not yet handed out */
	size_t off, len, cap;
	uint64_t base;             /* stream position of buf[0] */
	uint64_t last_a, last_b;   /* bytes of the last read (or feed) */
	uint64_t frame_a, frame_b; /* the frame rx_next returned last */
	uint64_t scan;             /* a frame start at or after the consumed bytes */
	uint64_t dropped;          /* descriptors closed on arrival (no frame
			      starts in the bytes that brought them) */
	struct mc_uframe_fd *fds;  /* received, not yet taken (owned) */
	size_t fd_head, nfds, fd_cap;
};

/* Errors: -ENOMEM. max_frame 0 means MC_UFRAME_MAX_BYTES. */
int mc_uframe_rx_init(struct mc_uframe_rx *r, size_t max_frame) MC_MUST_CHECK;
/* Free the buffer and close every descriptor still queued. */
void mc_uframe_rx_free(struct mc_uframe_rx *r);

/* Append bytes as if received (tests, fuzzing). Errors: -ENOMEM. */
int mc_uframe_rx_feed(struct mc_uframe_rx *r, const void *data, size_t len) MC_MUST_CHECK;
/* Queue a descriptor as if received with the bytes of the last feed
 * (takes ownership). Errors: -ENOMEM (the descriptor is closed). */
int mc_uframe_rx_push_fd(struct mc_uframe_rx *r, int fd) MC_MUST_CHECK;

/*
 * One recvmsg() on sock (flags: 0 to block, MSG_DONTWAIT), appending the
 * bytes and queueing the descriptors that came (close-on-exec). Returns
 * the bytes read, 0 at end of stream, or -EAGAIN, MC_EPROTOCOL (the
 * kernel truncated the descriptors: more than MC_UFRAME_MAX_FDS were
 * sent at once), -ENOMEM, or another negative errno.
 */
ssize_t mc_uframe_rx_read(struct mc_uframe_rx *r, int sock, int flags);

/*
 * The next complete frame: returns 1 with *body and *len pointing into the
 * buffer (valid until the next call of any rx function), 0 when the next
 * frame is not complete yet, MC_EPROTOCOL when its length is 0, or
 * MC_ETOO_LARGE when it is above max_frame (the stream cannot continue).
 */
int mc_uframe_rx_next(struct mc_uframe_rx *r, const uint8_t **body, size_t *len) MC_MUST_CHECK;

/* Move the n oldest queued descriptors to out[] (the caller owns them).
 * Errors: MC_EPROTOCOL (fewer than n queued, or n above the maximum;
 * nothing taken). */
int mc_uframe_rx_take_fds(struct mc_uframe_rx *r, unsigned n, int *out) MC_MUST_CHECK;
/*
 * The descriptors of the frame rx_next returned last, for a receiver that
 * must not trust its peer (the agent). A sender attaches a frame's
 * descriptors to the sendmsg() that carries its first byte, and the
 * kernel delivers them with the recvmsg() that reads that sendmsg's
 * first byte, which ends there: so the descriptors of a recvmsg belong to
 * a frame that starts within its bytes. The frame may take `announced`
 * of those (oldest first) into out[] (the caller owns them). What no
 * frame can take any more — brought by bytes that only this frame or
 * earlier ones start in — is closed at once. Returns 0, or when the
 * frame must be refused (then none is handed out: every descriptor it
 * brought is closed): MC_EPROTOCOL when it announced descriptors that did
 * not come with it, -EBADF when it was the last frame to start in bytes
 * that brought descriptors nobody announced. *closed gets the number
 * closed. Call it for every frame, announced 0 included. Descriptors brought by bytes in which no
 * frame starts (the middle of a frame) are closed as they arrive and
 * counted in r->dropped, so a frame being received holds none of them.
 */
int mc_uframe_rx_frame_fds(struct mc_uframe_rx *r, unsigned announced, int *out,
			   unsigned *closed) MC_MUST_CHECK;
/* Descriptors queued. */
size_t mc_uframe_rx_queued_fds(const struct mc_uframe_rx *r);
/* True when no partial frame is buffered. */
int mc_uframe_rx_idle(const struct mc_uframe_rx *r);
/* True when mc_uframe_rx_next has something to say without another
 * read: a complete frame, or a length it refuses. */
int mc_uframe_rx_ready(const struct mc_uframe_rx *r);

/* Write the 4-byte header of a frame of len bytes. */
void mc_uframe_put_len(uint8_t hdr[MC_UFRAME_HDR], uint32_t len);
uint32_t mc_uframe_get_len(const uint8_t hdr[MC_UFRAME_HDR]);

/*
 * One sendmsg() of iov[] with nfds descriptors (0..MC_UFRAME_MAX_FDS) as
 * SCM_RIGHTS, MSG_NOSIGNAL added to flags. Returns the bytes sent (the
 * descriptors went with them if > 0) or a negative errno (-EAGAIN, -EPIPE,
 * -EINVAL for too many descriptors).
 */
ssize_t mc_uframe_sendmsg(int sock, const struct iovec *iov, int iovcnt, const int *fds,
			  unsigned nfds, int flags);

/*
 * Send a whole frame (header + body) on a blocking socket, retrying
 * partial writes and EINTR; the descriptors go with the first byte.
 * Errors: negative errno of sendmsg (-EPIPE, ...).
 */
int mc_uframe_send_all(int sock, const void *body, size_t len, const int *fds,
		       unsigned nfds) MC_MUST_CHECK;

#endif
