/*
 * ctl_redis: the smallest RESP client that drives redis-server for `bench
 * store`'s comparison (ctl_bench_store.h): SET and GET of binary values on
 * a blocking loopback connection, one reply read at a time.
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
#include "ctl/ctl_bench_store.h"

int ctl_redis_connect(int port)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
		int e = -errno;
		close(fd);
		return e;
	}
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return fd;
}

/* A reply's first line into line (without CRLF). */
static int read_line(int fd, char *line, size_t len)
{
	size_t n = 0;
	while (n + 1 < len) {
		ssize_t r = read(fd, line + n, 1);
		if (r <= 0)
			return -EIO;
		if (line[n] == '\n') {
			line[n > 0 && line[n - 1] == '\r' ? n - 1 : n] = '\0';
			return 0;
		}
		n++;
	}
	return -EPROTO;
}

int ctl_redis_set(int fd, const char *key, const void *val, size_t len)
{
	char hdr[128], line[64];
	size_t kl = strlen(key);
	int h = snprintf(hdr, sizeof(hdr), "*3\r\n$3\r\nSET\r\n$%zu\r\n%s\r\n$%zu\r\n", kl, key, len);
	struct iovec iov[3] = {{hdr, (size_t)h}, {(void *)val, len}, {"\r\n", 2}};
	int rc = mc_writev_all(fd, iov, 3);
	if (rc == 0)
		rc = read_line(fd, line, sizeof(line));
	return rc ? rc : line[0] == '+' ? 0 : -EPROTO;
}

int64_t ctl_redis_get(int fd, const char *key, void *buf, size_t cap)
{
	char hdr[128], line[64];
	int h = snprintf(hdr, sizeof(hdr), "*2\r\n$3\r\nGET\r\n$%zu\r\n%s\r\n", strlen(key), key);
	struct iovec iov[1] = {{hdr, (size_t)h}};
	int rc = mc_writev_all(fd, iov, 1);
	if (rc == 0)
		rc = read_line(fd, line, sizeof(line));
	if (rc)
		return rc;
	if (line[0] != '$')
		return -EPROTO;
	long n = strtol(line + 1, NULL, 10);
	if (n < 0)
		return MC_EOBJECT_NOT_FOUND;
	if ((size_t)n > cap)
		return -ENOBUFS;
	char crlf[2];
	rc = mc_read_full(fd, buf, (size_t)n);
	if (rc == 0)
		rc = mc_read_full(fd, crlf, 2);
	return rc ? rc : n;
}
