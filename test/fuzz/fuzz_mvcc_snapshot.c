/*
 * fuzz_mvcc_snapshot: libFuzzer entry point for the MVCC snapshot decoder.
 *
 * The first input byte picks the mode: odd, the rest is a snapshot whose
 * CRC trailer is recomputed first, so that mutations reach the parser
 * behind the checksum; even, the rest is used as it is. A snapshot that
 * restores must re-encode to exactly the same bytes (the encoding is
 * canonical), and the store it yields must survive reads, writes,
 * compaction and a revoke.
 *
 *   clang -fsanitize=fuzzer,address,undefined -Isrc \
 *     test/fuzz/fuzz_mvcc_snapshot.c src/meta/{mvcc,lease}.c src/common/err.c
 *
 * test_mvcc_snapshot.c also runs this entry point on mutated snapshots.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/crc32c.h"
#include "meta/lease.h"
#include "meta/mvcc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct fuzz_sink {
	unsigned char *data;
	size_t len, cap;
};

static int fuzz_sink_write(void *ctx, const void *p, size_t n)
{
	struct fuzz_sink *k = ctx;
	if (k->len + n > k->cap) {
		size_t nc = k->cap ? k->cap * 2 : 4096;
		while (nc < k->len + n)
			nc *= 2;
		unsigned char *d = realloc(k->data, nc);
		if (!d)
			return -12;
		k->data = d;
		k->cap = nc;
	}
	memcpy(k->data + k->len, p, n);
	k->len += n;
	return 0;
}

static void fuzz_exercise(struct mvcc_store *s)
{
	struct mvcc_op o = {.type = MVCC_OP_RANGE};
	o.u.range.key = "\0";
	o.u.range.key_len = 1;
	o.u.range.range_end = "\0";
	o.u.range.range_end_len = 1;
	o.u.range.sort_order = MVCC_SORT_DESCEND;
	o.u.range.sort_target = MVCC_SORT_VALUE;
	struct mvcc_result res;
	if (mvcc_apply(s, &o, &res) == 0)
		mvcc_result_free(&res);
	uint64_t pos;
	struct mvcc_event ev;
	if (mvcc_hist_seek(s, mvcc_compact_rev(s) > 0 ? mvcc_compact_rev(s) : 0, &pos) == 0)
		while (mvcc_hist_event(s, pos, &ev) == 0)
			pos++;
	o.type = MVCC_OP_DELETE_RANGE;
	o.u.del.key = "\0";
	o.u.del.key_len = 1;
	o.u.del.range_end = "\0";
	o.u.del.range_end_len = 1;
	if (mvcc_apply(s, &o, &res) == 0)
		mvcc_result_free(&res);
	int64_t *ids;
	size_t n;
	if (lease_list(mvcc_leases(s), &ids, &n) == 0) {
		if (n && mvcc_lease_revoke(s, ids[0], NULL) != 0)
			abort();
		free(ids);
	}
	if (mvcc_compact(s, mvcc_rev(s)) != 0 && mvcc_compact_rev(s) != mvcc_rev(s))
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	size_t n = size - 1;
	unsigned char *buf = malloc(n ? n : 1);
	if (!buf)
		return 0;
	memcpy(buf, data + 1, n);
	if ((data[0] & 1) && n >= 4) {
		uint32_t crc = crc32c(0, buf, n - 4);
		for (int i = 0; i < 4; i++)
			buf[n - 4 + i] = (unsigned char)(crc >> (8 * i));
	}
	struct mvcc_store *s;
	if (mvcc_restore(NULL, buf, n, &s) == 0) {
		struct fuzz_sink k = {0};
		if (mvcc_snapshot(s, fuzz_sink_write, &k) != 0 || k.len != n ||
		    memcmp(k.data, buf, n) != 0)
			abort(); /* not canonical: the decoder accepted junk */
		free(k.data);
		fuzz_exercise(s);
		mvcc_free(s);
	}
	free(buf);
	return 0;
}
