/*
 * uframe: length-prefixed frames with SCM_RIGHTS descriptors on a Unix
 * stream socket. See uframe.h.
 */
#include "common/uframe.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/endian.h"

int mc_uframe_rx_init(struct mc_uframe_rx *r, size_t max_frame)
{
	memset(r, 0, sizeof(*r));
	r->max_frame = max_frame ? max_frame : MC_UFRAME_MAX_BYTES;
	r->cap = 64 * 1024;
	r->buf = malloc(r->cap);
	if (!r->buf)
		return -ENOMEM;
	return 0;
}

void mc_uframe_rx_free(struct mc_uframe_rx *r)
{
	for (size_t i = 0; i < r->nfds; i++)
		close(r->fds[(r->fd_head + i) % r->fd_cap].fd);
	free(r->fds);
	free(r->buf);
	memset(r, 0, sizeof(*r));
}

/* Make room for at least want more bytes at the end. */
static int rx_room(struct mc_uframe_rx *r, size_t want)
{
	if (r->off > 0 && (r->off == r->len || r->cap - r->len < want)) {
		memmove(r->buf, r->buf + r->off, r->len - r->off);
		r->base += r->off;
		r->len -= r->off;
		r->off = 0;
	}
	if (r->cap - r->len >= want)
		return 0;
	size_t limit = r->max_frame + MC_UFRAME_HDR + 64 * 1024;
	size_t cap = r->cap;
	while (cap - r->len < want && cap < limit)
		cap *= 2;
	if (cap - r->len < want)
		cap = r->len + want;
	uint8_t *p = realloc(r->buf, cap);
	if (!p)
		return -ENOMEM;
	r->buf = p;
	r->cap = cap;
	return 0;
}

int mc_uframe_rx_feed(struct mc_uframe_rx *r, const void *data, size_t len)
{
	int rc = rx_room(r, len);
	if (rc)
		return rc;
	if (len)
		memcpy(r->buf + r->len, data, len);
	r->last_a = r->base + r->len;
	r->len += len;
	r->last_b = r->base + r->len;
	return 0;
}

/* Whether a frame starts in the stream bytes [a, b), all received: walk
 * the frame headers from the last start known (r->scan, only ever moved
 * forward, so the walk is linear in the stream). A length the stream
 * cannot go on with counts as a start: nothing is closed on a guess. */
static bool frame_starts_in(struct mc_uframe_rx *r, uint64_t a, uint64_t b)
{
	if (a == b)
		return true; /* no bytes to judge by (mc_uframe_rx_push_fd alone) */
	if (r->scan < r->base + r->off)
		r->scan = r->base + r->off; /* consumed up to a frame boundary */
	while (r->scan < a) {
		uint64_t rel = r->scan - r->base;
		if (rel + MC_UFRAME_HDR > r->len)
			return false; /* [a, b) is inside a header begun before */
		uint32_t n = mc_uframe_get_len(r->buf + rel);
		if (n == 0 || n > r->max_frame)
			return true;
		r->scan += MC_UFRAME_HDR + n;
	}
	return r->scan < b;
}

/* Queue fd, brought by the stream bytes [a, b). */
static int push_fd(struct mc_uframe_rx *r, int fd, uint64_t a, uint64_t b)
{
	if (!frame_starts_in(r, a, b)) {
		close(fd);
		r->dropped++;
		return 0;
	}
	if (r->nfds == r->fd_cap) {
		size_t cap = r->fd_cap ? r->fd_cap * 2 : 16;
		struct mc_uframe_fd *p = malloc(cap * sizeof(*p));
		if (!p) {
			close(fd);
			return -ENOMEM;
		}
		for (size_t i = 0; i < r->nfds; i++)
			p[i] = r->fds[(r->fd_head + i) % r->fd_cap];
		free(r->fds);
		r->fds = p;
		r->fd_cap = cap;
		r->fd_head = 0;
	}
	r->fds[(r->fd_head + r->nfds) % r->fd_cap] = (struct mc_uframe_fd){fd, a, b};
	r->nfds++;
	return 0;
}

int mc_uframe_rx_push_fd(struct mc_uframe_rx *r, int fd)
{
	return push_fd(r, fd, r->last_a, r->last_b);
}

ssize_t mc_uframe_rx_read(struct mc_uframe_rx *r, int sock, int flags)
{
	/* Read what the next frame still needs, at least 64 KiB. */
	size_t want = 64 * 1024;
	size_t have = r->len - r->off;
	if (have >= MC_UFRAME_HDR) {
		uint32_t n = mc_uframe_get_len(r->buf + r->off);
		if (n <= r->max_frame && (size_t)n + MC_UFRAME_HDR > have &&
		    (size_t)n + MC_UFRAME_HDR - have > want)
			want = (size_t)n + MC_UFRAME_HDR - have;
	}
	int rc = rx_room(r, want);
	if (rc)
		return rc;
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int) * MC_UFRAME_MAX_FDS)];
	} cbuf;
	struct iovec iov = {r->buf + r->len, r->cap - r->len};
	struct msghdr msg = {
		.msg_iov = &iov,
		.msg_iovlen = 1,
		.msg_control = cbuf.buf,
		.msg_controllen = sizeof(cbuf.buf),
	};
	ssize_t n;
	do {
		n = recvmsg(sock, &msg, flags | MSG_CMSG_CLOEXEC);
	} while (n < 0 && errno == EINTR);
	if (n < 0)
		return errno == EWOULDBLOCK ? -EAGAIN : -errno;
	r->last_a = r->base + r->len;
	r->last_b = r->last_a + (uint64_t)n;
	r->len += (size_t)n;
	int err = 0;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < k; i++) {
			int fd;
			memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
			int prc = push_fd(r, fd, r->last_a, r->last_b);
			if (prc && !err)
				err = prc;
		}
	}
	if (msg.msg_flags & MSG_CTRUNC)
		err = MC_EPROTOCOL;
	return err ? err : n;
}

int mc_uframe_rx_next(struct mc_uframe_rx *r, const uint8_t **body, size_t *len)
{
	size_t have = r->len - r->off;
	if (have < MC_UFRAME_HDR)
		return 0;
	uint32_t n = mc_uframe_get_len(r->buf + r->off);
	if (n == 0)
		return MC_EPROTOCOL;
	if (n > r->max_frame)
		return MC_ETOO_LARGE;
	if (have - MC_UFRAME_HDR < n)
		return 0;
	*body = r->buf + r->off + MC_UFRAME_HDR;
	*len = n;
	r->frame_a = r->base + r->off;
	r->off += MC_UFRAME_HDR + n;
	r->frame_b = r->base + r->off;
	return 1;
}

int mc_uframe_rx_take_fds(struct mc_uframe_rx *r, unsigned n, int *out)
{
	if (n > MC_UFRAME_MAX_FDS || n > r->nfds)
		return MC_EPROTOCOL;
	for (unsigned i = 0; i < n; i++) {
		out[i] = r->fds[r->fd_head].fd;
		r->fd_head = (r->fd_head + 1) % r->fd_cap;
		r->nfds--;
	}
	return 0;
}

static const struct mc_uframe_fd *fd_at(const struct mc_uframe_rx *r, size_t i)
{
	return &r->fds[(r->fd_head + i) % r->fd_cap];
}

static int pop_fd(struct mc_uframe_rx *r)
{
	int fd = r->fds[r->fd_head].fd;
	r->fd_head = (r->fd_head + 1) % r->fd_cap;
	r->nfds--;
	return fd;
}

int mc_uframe_rx_frame_fds(struct mc_uframe_rx *r, unsigned announced, int *out,
			   unsigned *closed)
{
	uint64_t f = r->frame_a, e = r->frame_b;
	*closed = 0;
	/* Brought by bytes wholly before this frame: no frame is left to
	 * take them. */
	while (r->nfds && fd_at(r, 0)->b <= f) {
		close(pop_fd(r));
		(*closed)++;
	}
	/* Brought with this frame's first byte (the queue is in arrival
	 * order, so they are at its head). */
	size_t mine = 0;
	while (mine < r->nfds && fd_at(r, mine)->a <= f)
		mine++;
	int rc = 0;
	unsigned took = 0;
	bool missing = announced > mine || announced > MC_UFRAME_MAX_FDS;
	if (missing)
		rc = MC_EPROTOCOL;
	else
		for (; took < announced; took++)
			out[took] = pop_fd(r);
	/* The rest of them: if no later frame starts in the bytes that
	 * brought them, nobody announced them. */
	size_t left = mine - took, stray = 0;
	while (stray < left && fd_at(r, stray)->b <= e)
		stray++;
	if (stray) {
		if (!missing)
			rc = -EBADF;
		for (size_t i = 0; i < stray; i++)
			close(pop_fd(r));
		*closed += (unsigned)stray;
	}
	if (rc) {
		for (unsigned i = 0; i < took; i++)
			close(out[i]);
		*closed += took;
	}
	return rc;
}

size_t mc_uframe_rx_queued_fds(const struct mc_uframe_rx *r)
{
	return r->nfds;
}

int mc_uframe_rx_idle(const struct mc_uframe_rx *r)
{
	return r->len == r->off;
}

int mc_uframe_rx_ready(const struct mc_uframe_rx *r)
{
	size_t have = r->len - r->off;
	if (have < MC_UFRAME_HDR)
		return 0;
	uint32_t n = mc_uframe_get_len(r->buf + r->off);
	return n == 0 || n > r->max_frame || have - MC_UFRAME_HDR >= n;
}

void mc_uframe_put_len(uint8_t hdr[MC_UFRAME_HDR], uint32_t len)
{
	mc_put_le32(hdr, len);
}

uint32_t mc_uframe_get_len(const uint8_t hdr[MC_UFRAME_HDR])
{
	return mc_get_le32(hdr);
}

ssize_t mc_uframe_sendmsg(int sock, const struct iovec *iov, int iovcnt, const int *fds,
			  unsigned nfds, int flags)
{
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int) * MC_UFRAME_MAX_FDS)];
	} cbuf;
	if (nfds > MC_UFRAME_MAX_FDS)
		return -EINVAL;
	struct msghdr msg = {
		.msg_iov = (struct iovec *)iov,
		.msg_iovlen = (size_t)iovcnt,
	};
	if (nfds) {
		memset(cbuf.buf, 0, sizeof(cbuf.buf));
		msg.msg_control = cbuf.buf;
		msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
		struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
	}
	ssize_t n;
	do {
		n = sendmsg(sock, &msg, flags | MSG_NOSIGNAL);
	} while (n < 0 && errno == EINTR);
	if (n < 0)
		return errno == EWOULDBLOCK ? -EAGAIN : -errno;
	return n;
}

int mc_uframe_send_all(int sock, const void *body, size_t len, const int *fds, unsigned nfds)
{
	uint8_t hdr[MC_UFRAME_HDR];
	if (len > UINT32_MAX)
		return -EINVAL;
	mc_uframe_put_len(hdr, (uint32_t)len);
	struct iovec iov[2] = {{hdr, sizeof(hdr)}, {(void *)body, len}};
	size_t total = sizeof(hdr) + len, sent = 0;
	while (sent < total) {
		struct iovec v[2];
		int cnt = 0;
		size_t skip = sent;
		for (int i = 0; i < 2; i++) {
			if (skip >= iov[i].iov_len) {
				skip -= iov[i].iov_len;
				continue;
			}
			v[cnt].iov_base = (char *)iov[i].iov_base + skip;
			v[cnt].iov_len = iov[i].iov_len - skip;
			skip = 0;
			cnt++;
		}
		ssize_t n = mc_uframe_sendmsg(sock, v, cnt, sent ? NULL : fds, sent ? 0 : nfds,
					      0);
		if (n < 0)
			return (int)n;
		sent += (size_t)n;
	}
	return 0;
}
