/* Fuzz target: client frames as the agent reads them — the byte stream is
 * cut into frames (common/uframe.c) whole and in chunks whose size comes
 * from the first byte (both must agree), each frame is decoded as a
 * Request and checked (agent/req.c) with and without a finished hello,
 * and decoded as a Response too (what libmooncake reads). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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
	return 0;
}
