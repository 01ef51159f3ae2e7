/*
 * io: whole-buffer reads and writes (io.h). Linked into the daemon and
 * into libmooncake, so it uses nothing but libc.
 */
#include "common/io.h"

#include <errno.h>
#include <sys/types.h>
#include <unistd.h>

/* What a read or write call returned, as the bytes it moved (> 0), 0 to
 * call it again (EINTR), or a negative code: its errno, or -EIO when it
 * moved nothing. */
static ssize_t moved(ssize_t n)
{
	if (n > 0)
		return n;
	if (n == 0)
		return -EIO;
	return errno == EINTR ? 0 : -errno;
}

int mc_write_all(int fd, const void *buf, size_t len)
{
	const uint8_t *p = buf;
	while (len > 0) {
		ssize_t n = moved(write(fd, p, len));
		if (n < 0)
			return (int)n;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

int mc_writev_all(int fd, struct iovec *iov, int iovcnt)
{
	for (;;) {
		while (iovcnt > 0 && iov->iov_len == 0) {
			iov++;
			iovcnt--;
		}
		if (iovcnt == 0)
			return 0;
		ssize_t n = moved(writev(fd, iov, iovcnt));
		if (n < 0)
			return (int)n;
		size_t w = (size_t)n;
		while (iovcnt > 0 && w >= iov->iov_len) {
			w -= iov->iov_len;
			iov++;
			iovcnt--;
		}
		if (w > 0) {
			iov->iov_base = (char *)iov->iov_base + w;
			iov->iov_len -= w;
		}
	}
}

int mc_read_full(int fd, void *buf, size_t len)
{
	uint8_t *p = buf;
	while (len > 0) {
		ssize_t n = moved(read(fd, p, len));
		if (n < 0)
			return (int)n;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

int mc_pwrite_all(int fd, const void *buf, size_t len, uint64_t off)
{
	const uint8_t *p = buf;
	while (len > 0) {
		ssize_t n = moved(pwrite(fd, p, len, (off_t)off));
		if (n < 0)
			return (int)n;
		p += n;
		len -= (size_t)n;
		off += (uint64_t)n;
	}
	return 0;
}

int mc_pread_all(int fd, void *buf, size_t len, uint64_t off)
{
	uint8_t *p = buf;
	while (len > 0) {
		ssize_t n = moved(pread(fd, p, len, (off_t)off));
		if (n < 0)
			return (int)n;
		p += n;
		len -= (size_t)n;
		off += (uint64_t)n;
	}
	return 0;
}
