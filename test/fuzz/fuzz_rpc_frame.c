/* Fuzz target: the gRPC message deframer (rpc_deframer_feed) fed the input
 * whole and again in chunks whose sizes come from the first byte — both
 * must yield the same messages and the same verdict — plus grpc-timeout
 * parsing and percent-decoding of the input as text. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rpc/rpc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct sink {
	uint64_t hash;
	size_t n;
};

static int on_msg(void *ud, const uint8_t *body, size_t len)
{
	struct sink *s = ud;
	uint64_t h = s->hash ^ (len * 0x9e3779b97f4a7c15ull);
	for (size_t i = 0; i < len; i++)
		h = (h ^ body[i]) * 0x100000001b3ull;
	s->hash = h;
	s->n++;
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	size_t step = 1 + data[0] % 17;
	data++;
	size--;

	struct rpc_deframer a, b;
	struct sink sa = {0}, sb = {0};
	rpc_deframer_init(&a, 4096);
	rpc_deframer_init(&b, 4096);
	int ra = rpc_deframer_feed(&a, data, size, on_msg, &sa);
	int rb = 0;
	for (size_t off = 0; off < size && rb == 0; off += step) {
		size_t n = size - off < step ? size - off : step;
		rb = rpc_deframer_feed(&b, data + off, n, on_msg, &sb);
	}
	if (ra != rb || sa.n != sb.n || sa.hash != sb.hash)
		abort();
	if (ra == 0 && rpc_deframer_idle(&a) != rpc_deframer_idle(&b))
		abort();
	rpc_deframer_free(&a);
	rpc_deframer_free(&b);

	char text[64], out[64 * 3 + 1], back[64];
	size_t tl = size < sizeof(text) - 1 ? size : sizeof(text) - 1;
	memcpy(text, data, tl);
	text[tl] = '\0';
	uint64_t ms;
	if (rpc_timeout_parse(text, &ms) == 0) {
		char f[16];
		uint64_t ms2;
		rpc_timeout_format(ms, f, sizeof(f));
		if (rpc_timeout_parse(f, &ms2) != 0 || ms2 < ms)
			abort();
	}
	rpc_percent_encode(text, out, sizeof(out));
	rpc_percent_decode(out, back, sizeof(back));
	if (strcmp(back, text) != 0)
		abort();
	return 0;
}
