/* Fuzz target: the SSD tier's index as recovery meets it — the input as a
 * header followed by a stream of records, scanned the way recovery does
 * (a record that does not decode is skipped 8 bytes at a time). Every
 * record accepted must lie within the input, satisfy the format's rules
 * (a put: size > 0, aligned extent; a removal: size 0) and re-encode to
 * exactly the bytes it was read from; a header accepted must re-encode to
 * its bytes too. The records' CRC seed is fixed (store id 1, generation
 * 1), so the corpus can hold valid records. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ssd/ssd_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct ssd__hdr h;
	if (ssd__hdr_decode(data, size, SSD__INDEX_MAGIC, &h) == 0) {
		uint8_t again[SSD__HDR_BYTES];
		ssd__hdr_encode(again, &h);
		if (memcmp(again, data, SSD__HDR_BYTES) != 0)
			abort();
	}
	uint32_t seed = ssd__rec_seed(1, 1);
	static uint8_t again[SSD__REC_MAX_BYTES + 8];
	size_t at = size >= SSD__HDR_BYTES ? SSD__HDR_BYTES : 0;
	while (at < size) {
		struct ssd__rec r;
		size_t used = 0;
		enum ssd__dec d = ssd__rec_decode(data + at, size - at, seed, &r, &used);
		if (d != SSD__DEC_OK) {
			at += 8;
			continue;
		}
		if (used > size - at || used != ssd__rec_len(r.klen) || r.klen == 0 ||
		    r.klen > SSD_MAX_KEY_BYTES || r.offset % SSD_ALIGN != 0 ||
		    (r.type == SSD__REC_PUT) != (r.size > 0))
			abort();
		ssd__rec_encode(again, &r, seed);
		if (memcmp(again, data + at, used) != 0)
			abort();
		at += used;
	}
	return 0;
}
