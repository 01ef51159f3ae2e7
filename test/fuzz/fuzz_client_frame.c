/* Fuzz target: client frames as the agent reads them — the byte stream is
 * cut into frames (common/uframe.c) whole and in chunks whose size comes
 * from the first byte (both must agree), each frame is decoded as a
 * Request and checked (agent/req.c) with and without a finished hello,
 * and decoded as a Response too (what libmooncake reads). Then the
 * descriptor rules (mc_uframe_rx_frame_fds): chunks bring descriptors
 * (as many as bits 0-2 of a chunk's first byte when bit 3 is set, of the
 * kinds bits 4-7 choose: memfds sealed or not, read-only, write-sealed,
 * of several sizes, pipes, sockets, /dev/null, an eventfd), each frame
 * announces what its Request's nfds says (else its first byte); every
 * descriptor ends taken by the frame that announced it or closed, none
 * waits past the frames that could take it, and each one taken goes
 * through the agent's check of a client memfd (agent__map_client_fd, the
 * range from the frame's bytes), whose verdict must be the one its kind
 * calls for: a mapping only of a sealed, writable memfd of the client's
 * user that holds the range, whose last byte then reads without a
 * fault. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "agent/mem.h"
#include "agent/req.h"
#include "common/uframe.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct sink {
	uint64_t hash;
	size_t n;
	int err;
};

static void frames(const uint8_t *data, size_t size, size_t step, struct sink *s)
{
	struct mc_uframe_rx r;
	if (mc_uframe_rx_init(&r, 1 << 16) != 0)
		abort();
	for (size_t off = 0; off < size && !s->err; off += step) {
		size_t k = size - off < step ? size - off : step;
		if (mc_uframe_rx_feed(&r, data + off, k) != 0)
			abort();
		const uint8_t *b;
		size_t len;
		int rc;
		while ((rc = mc_uframe_rx_next(&r, &b, &len)) == 1) {
			uint64_t h = s->hash ^ (len * 0x9e3779b97f4a7c15ull);
			for (size_t i = 0; i < len; i++)
				h = (h ^ b[i]) * 0x100000001b3ull;
			s->hash = h;
			s->n++;
			Mooncake__Client__Request *m =
				mooncake__client__request__unpack(NULL, len, b);
			if (m) {
				const char *why = NULL;
				int c1 = agent__req_check(m, false, &why);
				if (!why || (c1 > 0))
					abort();
				int c2 = agent__req_check(m, true, &why);
				if (!why || c2 > 0)
					abort();
				mooncake__client__request__free_unpacked(m, NULL);
			}
			Mooncake__Client__Response *p =
				mooncake__client__response__unpack(NULL, len, b);
			if (p)
				mooncake__client__response__free_unpacked(p, NULL);
		}
		if (rc < 0)
			s->err = rc;
	}
	mc_uframe_rx_free(&r);
}

/* Kinds of descriptor a client may send. */
enum kind {
	K_MEMFD,          /* sealed against shrinking, read-write: the good one */
	K_MEMFD_UNSEALED, /* no F_SEAL_SHRINK */
	K_MEMFD_RDONLY,   /* the good one, opened read-only */
	K_MEMFD_WSEALED,  /* F_SEAL_WRITE too: no writable mapping */
	K_PIPE,
	K_SOCKET,
	K_DEVNULL,
	K_EVENTFD,
	K_COUNT
};

#define MAX_FD 4096
static signed char kind_of[MAX_FD]; /* by descriptor number, -1: none */
static uint32_t size_of[MAX_FD];

static int make_fd(unsigned k, unsigned sz)
{
	int fd = -1;
	uint32_t size = 4096u * (1 + sz % 4);
	switch (k) {
	case K_MEMFD:
	case K_MEMFD_UNSEALED:
	case K_MEMFD_RDONLY:
	case K_MEMFD_WSEALED: {
		int m = memfd_create("fuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING);
		if (m < 0 || ftruncate(m, size) != 0)
			abort();
		int seals = k == K_MEMFD_UNSEALED  ? 0
			    : k == K_MEMFD_WSEALED ? F_SEAL_SHRINK | F_SEAL_WRITE
						   : F_SEAL_SHRINK;
		if (seals && fcntl(m, F_ADD_SEALS, seals) != 0)
			abort();
		if (k != K_MEMFD_RDONLY) {
			fd = m;
			break;
		}
		char path[64];
		snprintf(path, sizeof(path), "/proc/self/fd/%d", m);
		fd = open(path, O_RDONLY | O_CLOEXEC);
		close(m);
		break;
	}
	case K_PIPE: {
		int p[2];
		if (pipe2(p, O_CLOEXEC) != 0)
			abort();
		close(p[1]);
		fd = p[0];
		break;
	}
	case K_SOCKET: {
		int sv[2];
		if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
			abort();
		close(sv[1]);
		fd = sv[0];
		break;
	}
	case K_DEVNULL:
		fd = open("/dev/null", O_RDWR | O_CLOEXEC);
		break;
	default:
		fd = eventfd(0, EFD_CLOEXEC);
		break;
	}
	if (fd < 0 || fd >= MAX_FD)
		abort();
	kind_of[fd] = (signed char)k;
	size_of[fd] = size;
	return fd;
}

/* What agent__map_client_fd must say of fd, by its kind. */
static int expected(int fd, uid_t uid, uint64_t off, uint64_t len)
{
	switch (kind_of[fd]) {
	case K_PIPE:
	case K_SOCKET:
	case K_DEVNULL:
	case K_EVENTFD:
		return -EBADF;
	default:
		break;
	}
	if (uid != 0 && uid != geteuid())
		return -EPERM;
	if (kind_of[fd] == K_MEMFD_RDONLY)
		return -EACCES;
	if (kind_of[fd] == K_MEMFD_UNSEALED || len == 0 || off + len > size_of[fd])
		return -EINVAL;
	if (kind_of[fd] == K_MEMFD_WSEALED)
		return -EPERM; /* mmap refuses a writable shared mapping */
	return 0;
}

/* The agent's check of a client memfd, on a descriptor a frame took
 * (closed or unmapped here). */
static void check_fd(int fd, const uint8_t *b, size_t len)
{
	if (fd < 0 || fd >= MAX_FD || kind_of[fd] < 0)
		abort(); /* not one made here */
	uint64_t off = 512u * (len > 1 ? b[1] % 40u : 0);
	uint64_t n = 512u * (len > 2 ? b[2] % 40u : 1);
	uid_t uid = len > 3 && (b[3] & 1) ? geteuid() + 1 : geteuid();
	int want = expected(fd, uid, off, n);
	struct agent_map *m;
	uint8_t *base;
	int rc = agent__map_client_fd(NULL, fd, uid, off, n, &m, &base);
	if (rc != want)
		abort();
	kind_of[fd] = -1;
	if (rc) {
		close(fd);
		return;
	}
	/* Mapped: the whole range is backed. */
	volatile uint8_t x = base[0];
	x = base[n - 1];
	(void)x;
	agent__map_unref(m); /* closes fd */
}

static void descriptors(const uint8_t *data, size_t size, size_t step)
{
	struct mc_uframe_rx r;
	if (mc_uframe_rx_init(&r, 1 << 16) != 0)
		abort();
	size_t pushed = 0, taken = 0, closed = 0;
	for (size_t off = 0; off < size; off += step) {
		size_t k = size - off < step ? size - off : step;
		if (mc_uframe_rx_feed(&r, data + off, k) != 0)
			abort();
		unsigned bring = (data[off] & 8) ? data[off] & 7 : 0;
		for (unsigned i = 0; i < bring; i++) {
			int fd = make_fd(((data[off] >> 4) + i) % K_COUNT, (unsigned)(off + i));
			if (mc_uframe_rx_push_fd(&r, fd) != 0)
				abort();
			pushed++;
		}
		const uint8_t *b;
		size_t len;
		int rc;
		while ((rc = mc_uframe_rx_next(&r, &b, &len)) == 1) {
			unsigned announced = b[0] % 5;
			Mooncake__Client__Request *m =
				mooncake__client__request__unpack(NULL, len, b);
			if (m) {
				announced = m->nfds;
				mooncake__client__request__free_unpacked(m, NULL);
			}
			int out[MC_UFRAME_MAX_FDS];
			unsigned c;
			rc = mc_uframe_rx_frame_fds(&r, announced, out, &c);
			closed += c;
			if (rc == 0) {
				if (announced > MC_UFRAME_MAX_FDS)
					abort();
				for (unsigned i = 0; i < announced; i++) {
					if (fcntl(out[i], F_GETFD) < 0)
						abort(); /* handed out a closed one */
					check_fd(out[i], b, len);
				}
				taken += announced;
			} else if (rc != MC_EPROTOCOL && rc != -EBADF) {
				abort();
			}
		}
		if (rc < 0)
			break;
		/* What waits can only be for the frame not complete yet,
		 * brought by the chunk it starts in (the others are
		 * closed on arrival): at most 7. */
		if (mc_uframe_rx_queued_fds(&r) > 7)
			abort();
	}
	if (pushed != taken + closed + r.dropped + mc_uframe_rx_queued_fds(&r))
		abort();
	mc_uframe_rx_free(&r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	memset(kind_of, -1, sizeof(kind_of));
	size_t step = 1 + data[0] % 23;
	data++;
	size--;
	struct sink a = {0}, b = {0};
	frames(data, size, size ? size : 1, &a);
	frames(data, size, step, &b);
	if (a.n != b.n || a.hash != b.hash || a.err != b.err)
		abort();
	descriptors(data, size, step);
	return 0;
}
