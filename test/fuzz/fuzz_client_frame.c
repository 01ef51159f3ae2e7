/* Fuzz target: client frames as the agent reads them — the byte stream is
 * cut into frames (common/uframe.c) whole and in chunks whose size comes
 * from the first byte (both must agree), each frame is decoded as a
 * Request and checked (agent/req.c) with and without a finished hello,
 * and decoded as a Response too (what libmooncake reads). Then the
 * descriptor rules (mc_uframe_rx_frame_fds): chunks bring descriptors
 * (as many as bits 0-2 of a chunk's first byte when bit 3 is set), each
 * frame announces what its Request's nfds says (else its first byte);
 * every descriptor ends taken by the frame that announced it or closed,
 * and none waits past the frames that could take it. */
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
			int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
			if (fd < 0 || mc_uframe_rx_push_fd(&r, fd) != 0)
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
					close(out[i]);
				}
				taken += announced;
			} else if (rc != MC_EPROTOCOL) {
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
