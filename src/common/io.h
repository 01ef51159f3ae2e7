/*
 * io: whole-buffer reads and writes on a file descriptor. The one copy of
 * the loops that retry after EINTR and after a short count, for files
 * (the WAL, snapshots, memfds) and for blocking pipes and sockets.
 *
 * Every function returns 0 once all len bytes moved, or a negative code:
 * the negative errno of the failing call (-EAGAIN on a non-blocking fd
 * that is not ready), or -EIO when the call moved nothing — a read at end
 * of file before len bytes, a file that shrank under a positioned read,
 * or a write that made no progress. After an error an unknown prefix of
 * the buffer has moved.
 */
#ifndef MC_COMMON_IO_H
#define MC_COMMON_IO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "common/err.h"

/* write(2) all of buf. Errors: as above. */
int mc_write_all(int fd, const void *buf, size_t len) MC_MUST_CHECK;
/* writev(2) all of iov[0..iovcnt); the array is consumed (its entries
 * are advanced past what was written). Errors: as above. */
int mc_writev_all(int fd, struct iovec *iov, int iovcnt) MC_MUST_CHECK;
/* read(2) exactly len bytes. Errors: -EIO at end of file, as above. */
int mc_read_full(int fd, void *buf, size_t len) MC_MUST_CHECK;
/* pwrite(2) all of buf at offset off. Errors: as above. */
int mc_pwrite_all(int fd, const void *buf, size_t len, uint64_t off) MC_MUST_CHECK;
/* pread(2) exactly len bytes at offset off. Errors: -EIO past the end of
 * the file, as above. */
int mc_pread_all(int fd, void *buf, size_t len, uint64_t off) MC_MUST_CHECK;

#endif
