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
#include <netdb.h>
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

int ctl_redis_connect(const char *host, int port, struct ctl_redis **out)
{
	char ps[16];
	snprintf(ps, sizeof(ps), "%d", port);
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV}, *ai;
	if (getaddrinfo(host, ps, &hints, &ai) != 0)
		return -EHOSTUNREACH;
	struct ctl_redis *r = malloc(sizeof(*r));
	if (!r) {
		freeaddrinfo(ai);
		return -ENOMEM;
	}
	r->head = r->tail = 0;
	r->fd = -1;
	int e = -ECONNREFUSED;
	for (struct addrinfo *a = ai; a && r->fd < 0; a = a->ai_next) {
		r->fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (r->fd >= 0 && connect(r->fd, a->ai_addr, a->ai_addrlen) != 0) {
			e = -errno;
			close(r->fd);
			r->fd = -1;
		}
	}
	freeaddrinfo(ai);
	if (r->fd < 0) {
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

/* A bulk string reply ($N, N bytes, CRLF) into dst when N <= cap, read
 * past when not; *len: N, or -1 for a nil reply. */
static int read_bulk(struct ctl_redis *r, void *dst, size_t cap, long *len)
{
	char line[64];
	int rc = read_line(r, line, sizeof(line));
	if (rc)
		return rc;
	if (line[0] != '$')
		return -EPROTO;
	*len = strtol(line + 1, NULL, 10);
	if (*len < 0) {
		*len = -1;
		return 0;
	}
	rc = read_bytes(r, (size_t)*len <= cap ? dst : NULL, (size_t)*len);
	return rc ? rc : read_bytes(r, NULL, 2);
}

/* A bulk string reply as a C string in dst (cap bytes with its NUL): its
 * length, -EPROTO (nil, or too long: read past), or the read's error. */
static long read_string(struct ctl_redis *r, char *dst, size_t cap)
{
	long n;
	int rc = read_bulk(r, dst, cap - 1, &n);
	if (rc)
		return rc;
	if (n < 0 || (size_t)n > cap - 1)
		return -EPROTO;
	dst[n] = '\0';
	return n;
}

int ctl_redis_get_n(struct ctl_redis *r, size_t n, const char *const *keys, void *const *bufs,
		    size_t cap, int64_t *lens)
{
	if (n > CTL_REDIS_MAX_PIPELINE)
		return -EINVAL;
	char hdr[CTL_REDIS_MAX_PIPELINE][HDR_BYTES];
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
		long v;
		rc = read_bulk(r, bufs[i], cap, &v);
		/* (A value larger than cap was read past, not kept.) */
		if (rc == 0)
			lens[i] = v < 0              ? MC_EOBJECT_NOT_FOUND
				  : (size_t)v <= cap ? v
						     : -ENOBUFS;
	}
	return rc;
}

/* UNLINK keys[0..n) in one command; *removed grows by what went. */
static int unlink_keys(struct ctl_redis *r, char (*keys)[CTL_REDIS_MAX_KEY + 1], size_t n,
		       uint64_t *removed)
{
	char head[32], line[64], arg[CTL_REDIS_MAX_KEY + 24];
	int hl = snprintf(head, sizeof(head), "*%zu\r\n$6\r\nUNLINK\r\n", n + 1);
	int rc = mc_write_all(r->fd, head, (size_t)hl);
	for (size_t j = 0; j < n && rc == 0; j++) {
		int h = snprintf(arg, sizeof(arg), "$%zu\r\n%s\r\n", strlen(keys[j]), keys[j]);
		rc = mc_write_all(r->fd, arg, (size_t)h);
	}
	if (rc == 0)
		rc = read_line(r, line, sizeof(line));
	if (rc == 0 && line[0] != ':')
		rc = -EPROTO;
	if (rc == 0)
		*removed += (uint64_t)strtoull(line + 1, NULL, 10);
	return rc;
}

int ctl_redis_unlink_prefix(struct ctl_redis *r, const char *prefix, uint64_t *removed)
{
	char cursor[32] = "0", line[64], cmd[CTL_REDIS_MAX_KEY + 160];
	size_t pl = strlen(prefix), cap = 0;
	char(*keys)[CTL_REDIS_MAX_KEY + 1] = NULL;
	int rc = pl + 1 > CTL_REDIS_MAX_KEY ? -EINVAL : 0;
	*removed = 0;
	while (rc == 0) {
		int h = snprintf(
			cmd, sizeof(cmd),
			"*6\r\n$4\r\nSCAN\r\n$%zu\r\n%s\r\n$5\r\nMATCH\r\n$%zu\r\n%s*\r\n"
			"$5\r\nCOUNT\r\n$2\r\n%d\r\n",
			strlen(cursor), cursor, pl + 1, prefix, CTL_REDIS_MAX_PIPELINE);
		rc = mc_write_all(r->fd, cmd, (size_t)h);
		/* *2, the next cursor, then *K keys, all read before anything
		 * else is sent. A key too long to be the bench's is left. */
		if (rc == 0)
			rc = read_line(r, line, sizeof(line));
		if (rc == 0 && strcmp(line, "*2") != 0)
			rc = -EPROTO;
		if (rc == 0 && read_string(r, cursor, sizeof(cursor)) < 0)
			rc = -EPROTO;
		if (rc == 0)
			rc = read_line(r, line, sizeof(line));
		long k = rc == 0 && line[0] == '*' ? strtol(line + 1, NULL, 10) : -1;
		if (rc == 0 && (k < 0 || k > 1000000))
			rc = -EPROTO;
		if (rc == 0 && (size_t)k > cap) {
			void *p = realloc(keys, (size_t)k * sizeof(*keys));
			if (!p)
				rc = -ENOMEM;
			else
				keys = p, cap = (size_t)k;
		}
		size_t nk = 0;
		for (long i = 0; rc == 0 && i < k; i++) {
			long n = read_string(r, keys[nk], sizeof(keys[nk]));
			if (n >= 0)
				nk++;
			else if (n != -EPROTO)
				rc = (int)n;
		}
		for (size_t at = 0; rc == 0 && at < nk; at += CTL_REDIS_MAX_PIPELINE)
			rc = unlink_keys(r, keys + at,
					 MC_MIN(nk - at, (size_t)CTL_REDIS_MAX_PIPELINE),
					 removed);
		if (rc == 0 && strcmp(cursor, "0") == 0)
			break;
	}
	free(keys);
	return rc;
}
