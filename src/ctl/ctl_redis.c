/*
 * ctl_redis: the smallest RESP client that drives redis-server for `bench
 * store`'s comparison (ctl_bench_store.h): SET and GET of binary values on
 * a blocking loopback connection, n commands sent in one write and their
 * n replies read after (a pipeline of depth n; n = 1 is one round trip a
 * command). Replies are read through a buffer, a read() per buffer-full,
 * as a real client library (hiredis) reads them, so that the client's
 * side costs redis no more than it must.
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "common/err.h"
#include "common/io.h"
#include "common/util.h"
#include "ctl/ctl_bench_store.h"

#define RX_BYTES (64u << 10)
#define HDR_BYTES 160 /* a command's header with a key of CTL_REDIS_MAX_KEY */

struct ctl_redis {
	int fd;
	size_t head, tail; /* unread bytes: rx[head..tail) */
	char rx[RX_BYTES];
};

int ctl_redis_connect(int port, struct ctl_redis **out)
{
	struct ctl_redis *r = malloc(sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->head = r->tail = 0;
	r->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET,
				 .sin_port = htons((uint16_t)port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	if (r->fd < 0 || connect(r->fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
		int e = -errno;
		ctl_redis_close(r);
		return e;
	}
	int one = 1;
	setsockopt(r->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	*out = r;
	return 0;
}

void ctl_redis_close(struct ctl_redis *r)
{
	if (!r)
		return;
	if (r->fd >= 0)
		close(r->fd);
	free(r);
}

/* At least one more byte in the buffer. */
static int fill(struct ctl_redis *r)
{
	if (r->head == r->tail)
		r->head = r->tail = 0;
	else if (r->tail == RX_BYTES) {
		memmove(r->rx, r->rx + r->head, r->tail - r->head);
		r->tail -= r->head;
		r->head = 0;
	}
	ssize_t n;
	do
		n = read(r->fd, r->rx + r->tail, RX_BYTES - r->tail);
	while (n < 0 && errno == EINTR);
	if (n <= 0)
		return -EIO;
	r->tail += (size_t)n;
	return 0;
}

/* A reply's first line into line (without CRLF). */
static int read_line(struct ctl_redis *r, char *line, size_t len)
{
	for (;;) {
		char *nl = memchr(r->rx + r->head, '\n', r->tail - r->head);
		if (nl) {
			size_t n = (size_t)(nl - (r->rx + r->head));
			if (n > 0 && nl[-1] == '\r')
				n--;
			if (n + 1 > len)
				return -EPROTO;
			memcpy(line, r->rx + r->head, n);
			line[n] = '\0';
			r->head = (size_t)(nl - r->rx) + 1;
			return 0;
		}
		if (r->tail - r->head >= len)
			return -EPROTO;
		int rc = fill(r);
		if (rc)
			return rc;
	}
}

/* len bytes of the stream into dst (NULL: skipped). */
static int read_bytes(struct ctl_redis *r, void *dst, size_t len)
{
	while (len) {
		if (r->head == r->tail) {
			/* Large values straight into dst, not through the buffer. */
			if (dst && len >= RX_BYTES)
				return mc_read_full(r->fd, dst, len);
			int rc = fill(r);
			if (rc)
				return rc;
		}
		size_t k = MC_MIN(len, r->tail - r->head);
		if (dst) {
			memcpy(dst, r->rx + r->head, k);
			dst = (char *)dst + k;
		}
		r->head += k;
		len -= k;
	}
	return 0;
}

int ctl_redis_set_n(struct ctl_redis *r, size_t n, const char *const *keys,
		    const void *const *vals, size_t len)
{
	if (n > CTL_REDIS_MAX_PIPELINE)
		return -EINVAL;
	char hdr[CTL_REDIS_MAX_PIPELINE][HDR_BYTES], line[64];
	struct iovec iov[3 * CTL_REDIS_MAX_PIPELINE];
	for (size_t i = 0; i < n; i++) {
		size_t kl = strlen(keys[i]);
		if (kl > CTL_REDIS_MAX_KEY)
			return -EINVAL;
		int h = snprintf(hdr[i], HDR_BYTES,
				 "*3\r\n$3\r\nSET\r\n$%zu\r\n%s\r\n$%zu\r\n", kl, keys[i],
				 len);
		iov[3 * i] = (struct iovec){hdr[i], (size_t)h};
		iov[3 * i + 1] = (struct iovec){(void *)vals[i], len};
		iov[3 * i + 2] = (struct iovec){"\r\n", 2};
	}
	int rc = mc_writev_all(r->fd, iov, (int)(3 * n));
	for (size_t i = 0; i < n && rc == 0; i++) {
		rc = read_line(r, line, sizeof(line));
		if (rc == 0 && line[0] != '+')
			rc = -EPROTO;
	}
	return rc;
}

int ctl_redis_get_n(struct ctl_redis *r, size_t n, const char *const *keys, void *const *bufs,
		    size_t cap, int64_t *lens)
{
	if (n > CTL_REDIS_MAX_PIPELINE)
		return -EINVAL;
	char hdr[CTL_REDIS_MAX_PIPELINE][HDR_BYTES], line[64];
	struct iovec iov[CTL_REDIS_MAX_PIPELINE];
	for (size_t i = 0; i < n; i++) {
		size_t kl = strlen(keys[i]);
		if (kl > CTL_REDIS_MAX_KEY)
			return -EINVAL;
		int h = snprintf(hdr[i], HDR_BYTES, "*2\r\n$3\r\nGET\r\n$%zu\r\n%s\r\n", kl,
				 keys[i]);
		iov[i] = (struct iovec){hdr[i], (size_t)h};
	}
	int rc = mc_writev_all(r->fd, iov, (int)n);
	for (size_t i = 0; i < n && rc == 0; i++) {
		rc = read_line(r, line, sizeof(line));
		if (rc)
			break;
		if (line[0] != '$')
			return -EPROTO;
		long v = strtol(line + 1, NULL, 10);
		if (v < 0) {
			lens[i] = MC_EOBJECT_NOT_FOUND;
			continue;
		}
		/* A value larger than cap is read past, not kept. */
		bool fits = (size_t)v <= cap;
		rc = read_bytes(r, fits ? bufs[i] : NULL, (size_t)v);
		if (rc == 0)
			rc = read_bytes(r, NULL, 2);
		lens[i] = fits ? v : -ENOBUFS;
	}
	return rc;
}
