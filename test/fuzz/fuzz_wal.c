/*
 * fuzz_wal: libFuzzer target for the WAL decoder and recovery rules
 * (src/meta/wal_int.h). The first input byte picks a mode:
 *
 *   0  the input is a whole segment file: header checks, then a scan;
 *   1  a valid header is made here and the input is the record area, so
 *      the fuzzer reaches the record framing and tail rules at once;
 *   2  the input is a small program of records (entries, hard states,
 *      markers, with fuzzer-chosen indexes, terms and write groups) that
 *      is encoded with correct CRCs, optionally damaged at one byte, and
 *      scanned: this drives the log rules (overwrite, gaps, markers).
 *
 * Bit 0x80 of the mode byte marks the segment as the last one (a torn
 * tail allowed). After every scan the result is checked against the
 * decoder's promises: a clean end has only zeros after it, recovered
 * entries are contiguous with non-decreasing terms, offsets stay in the
 * buffer. Build with the rest of libmcd and -fsanitize=fuzzer; with
 * -DFUZZ_WAL_MAIN it is a plain program that runs the files named on its
 * command line (a regression corpus without libFuzzer).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meta/wal_int.h"

#define FUZZ_WAL_ID 0x0123456789abcdefull
#define FUZZ_SEQ 7u

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(bool ok, const char *what)
{
	if (!ok) {
		fprintf(stderr, "fuzz_wal: invariant broken: %s\n", what);
		abort();
	}
}

static void scan_and_check(const uint8_t *buf, size_t len, uint32_t seed,
			   bool last, uint64_t first_index)
{
	struct wal__view v;
	wal__view_init(&v, first_index, true);
	struct wal__scan s = {.seed = seed, .last = last};
	int rc = wal__scan_segment(buf, len, &s, &v);
	if (rc == 0) {
		check(s.end <= len && s.end >= WAL__SEG_HDR_BYTES,
		      "end in range");
		check(s.end % 8 == 0, "end aligned");
		if (!s.torn) {
			for (size_t i = s.end; i < len; i++)
				check(buf[i] == 0, "clean end with data after");
		}
		check(!s.torn || last, "torn tail only in the last segment");
	} else {
		check(rc == -EBADMSG || rc == -ENOMEM, "error code");
		if (rc == -EBADMSG) {
			check(s.why != NULL, "corruption has a reason");
			check(s.bad_off < len || len < WAL__SEG_HDR_BYTES,
			      "bad offset in range");
		}
	}
	if (v.last >= v.first) {
		uint64_t n = v.last - v.first + 1;
		check(n <= len, "no more entries than bytes");
		for (uint64_t k = 0; k < n; k++) {
			check(v.ents[k].index == v.first + k, "contiguous");
			check(v.ents[k].term == v.terms[k], "terms agree");
			check(k == 0 || v.ents[k].term >= v.ents[k - 1].term,
			      "terms non-decreasing");
			check(v.ents[k].index > 0, "index positive");
		}
	}
	wal__view_free(&v);
}

static uint8_t *with_header(const uint8_t *body, size_t n, size_t *len)
{
	*len = WAL__SEG_HDR_BYTES + n;
	uint8_t *buf = malloc(*len);
	if (!buf)
		return NULL;
	struct wal__seg_hdr h = {FUZZ_WAL_ID, FUZZ_SEQ, 1, 0};
	wal__seg_hdr_encode(buf, &h);
	if (n)
		memcpy(buf + WAL__SEG_HDR_BYTES, body, n);
	return buf;
}

static uint64_t take(const uint8_t **p, const uint8_t *end, unsigned bytes)
{
	uint64_t v = 0;
	for (unsigned i = 0; i < bytes && *p < end; i++)
		v |= (uint64_t)*(*p)++ << (8 * i);
	return v;
}

/* Mode 2: encode a record program. Each op: kind byte, then fields. */
static void run_program(const uint8_t *p, const uint8_t *end, bool last)
{
	size_t cap = 1 << 16, len = WAL__SEG_HDR_BYTES;
	uint8_t *buf = calloc(1, cap + 4096);
	if (!buf)
		return;
	struct wal__seg_hdr h = {FUZZ_WAL_ID, FUZZ_SEQ, 1, 0};
	wal__seg_hdr_encode(buf, &h);
	uint32_t seed = wal__seed(FUZZ_WAL_ID, FUZZ_SEQ);
	uint64_t group = WAL__SEG_HDR_BYTES, index = 0, term = 1;
	long damage = -1;
	while (p < end && len + 4096 < cap) {
		uint8_t op = *p++;
		uint8_t payload[256];
		size_t n = 0;
		unsigned type;
		if (op & 0x40)
			group = len; /* a new write group starts here */
		switch (op & 3) {
		case 0: /* entry: next, or overwrite back by a small step */
			index = (op & 0x20) ? index - take(&p, end, 1) : index + 1;
			if (op & 0x10)
				term += take(&p, end, 1) % 4;
			memset(payload, 0, 20);
			for (int i = 0; i < 8; i++) {
				payload[i] = (uint8_t)(index >> (8 * i));
				payload[8 + i] = (uint8_t)(term >> (8 * i));
			}
			n = 20 + take(&p, end, 1) % 64;
			memset(payload + 20, 0x5a, n - 20);
			type = WAL__REC_ENTRY;
			break;
		case 1: /* hard state */
			for (int i = 0; i < 24; i++)
				payload[i] = (uint8_t)take(&p, end, 1);
			n = 24;
			type = WAL__REC_HARD_STATE;
			break;
		case 2: { /* marker near the current index */
			uint64_t mi = index - take(&p, end, 1) % 8 +
				      take(&p, end, 1) % 8;
			uint64_t mt = term + take(&p, end, 1) % 3 - 1;
			for (int i = 0; i < 8; i++) {
				payload[i] = (uint8_t)(mi >> (8 * i));
				payload[8 + i] = (uint8_t)(mt >> (8 * i));
			}
			n = 16;
			type = WAL__REC_SNAPSHOT;
			break;
		}
		default: /* damage one byte later, at a chosen offset */
			damage = (long)take(&p, end, 2);
			continue;
		}
		wal__encode_frame(buf + len, seed, type, payload, n, NULL, 0,
				  group);
		len += wal__frame_bytes(n);
	}
	if (damage >= 0 && len > WAL__SEG_HDR_BYTES)
		buf[WAL__SEG_HDR_BYTES +
		    (size_t)damage % (len - WAL__SEG_HDR_BYTES)] ^= 0x21;
	scan_and_check(buf, len + (p < end ? *(end - 1) % 64 : 0), seed, last,
		       1);
	free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	unsigned mode = data[0] & 0x7f;
	bool last = (data[0] & 0x80) != 0;
	data++;
	size--;
	switch (mode % 3) {
	case 0: {
		struct wal__seg_hdr h;
		const char *why;
		if (wal__seg_hdr_decode(data, size, &h, &why) == 0)
			scan_and_check(data, size, wal__seed(h.wal_id, h.seq),
				       last, h.first_index);
		break;
	}
	case 1: {
		size_t len;
		uint8_t *buf = with_header(data, size, &len);
		if (buf)
			scan_and_check(buf, len, wal__seed(FUZZ_WAL_ID, FUZZ_SEQ),
				       last, 1 + (size ? data[0] : 0));
		free(buf);
		break;
	}
	case 2:
		run_program(data, data + size, last);
		break;
	}
	return 0;
}

#ifdef FUZZ_WAL_MAIN
int main(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		FILE *f = fopen(argv[i], "rb");
		if (!f) {
			perror(argv[i]);
			return 1;
		}
		static uint8_t buf[1 << 20];
		size_t n = fread(buf, 1, sizeof(buf), f);
		fclose(f);
		LLVMFuzzerTestOneInput(buf, n);
	}
	return 0;
}
#endif
