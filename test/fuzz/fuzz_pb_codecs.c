/* Fuzz target: the hand-written protobuf decoders of hot messages, each
 * against protobuf-c on the same bytes — the segment log's events as the
 * agent reads them (agent__mirror_event_decode), the BatchCommit items as
 * the master reads them (master__decode_commit_item), and the field
 * reader under both (mc_pb_next). A decoder that accepts what protobuf-c
 * refuses, refuses what it accepts, or decodes other values aborts; an
 * event it decoded is encoded again by the master's encoder, which must
 * give protobuf-c's bytes. The input lies in a block of its exact size,
 * so a read past it is a sanitizer error. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "agent/mirror.h"
#include "common/pb.h"
#include "master.pb-c.h"
#include "master/master_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(c) \
	do { \
		if (!(c)) \
			abort(); \
	} while (0)

static void event(const uint8_t *p, size_t len)
{
	Mooncake__Master__MirrorEvent e;
	char name[256];
	int rc = agent__mirror_event_decode(p, len, &e, name, sizeof(name));
	Mooncake__Master__MirrorEvent *ref = mooncake__master__mirror_event__unpack(NULL, len,
										    p);
	CHECK(rc == 0 || rc == 1 || rc == -EBADMSG);
	CHECK(rc != 0 || ref);
	CHECK(rc != -EBADMSG || !ref);
	if (rc == 0) {
		CHECK(e.op == ref->op && e.seq == ref->seq && e.offset == ref->offset);
		CHECK(e.size == ref->size && e.crc32c == ref->crc32c);
		CHECK(e.checksummed == ref->checksummed && e.soft_pin == ref->soft_pin);
		CHECK(e.source_offset == ref->source_offset &&
		      e.source_address == ref->source_address);
		CHECK(strcmp(e.source_segment, ref->source_segment) == 0);
		CHECK(e.key.len == ref->key.len &&
		      (!e.key.len || memcmp(e.key.data, ref->key.data, e.key.len) == 0));
		size_t room = MASTER_EVENT_MAX_BYTES + e.key.len + strlen(e.source_segment);
		uint8_t *a = malloc(room), *b = malloc(room);
		CHECK(a && b);
		size_t n = master__encode_event(a, &e);
		CHECK(n <= room);
		/* (protobuf-c packs the unknown fields it kept; the master's
		 * events have none) */
		unsigned unknown = ref->base.n_unknown_fields;
		ref->base.n_unknown_fields = 0;
		CHECK(mooncake__master__mirror_event__get_packed_size(ref) == n);
		mooncake__master__mirror_event__pack(ref, b);
		ref->base.n_unknown_fields = unknown;
		CHECK(memcmp(a, b, n) == 0);
		free(a);
		free(b);
	}
	if (ref)
		mooncake__master__mirror_event__free_unpacked(ref, NULL);
}

static void commit_item(const uint8_t *p, size_t len)
{
	struct master_commit c;
	int rc = master__decode_commit_item(p, len, &c);
	Mooncake__Master__CommitItem *ref = mooncake__master__commit_item__unpack(NULL, len,
										  p);
	CHECK(rc == 0 || rc == 1 || rc == -EBADMSG);
	CHECK(rc != 0 || ref);
	CHECK(rc != -EBADMSG || !ref);
	if (rc == 0) {
		CHECK(c.offset == ref->offset && c.size == ref->size && c.crc == ref->crc32c);
		CHECK(c.has_crc == ref->checksummed && c.soft_pin == ref->soft_pin);
		CHECK(c.ttl_ms == ref->ttl_ms && c.promote == ref->promote);
		CHECK(c.klen == ref->key.len &&
		      (!c.klen || memcmp(c.key, ref->key.data, c.klen) == 0));
	}
	if (ref)
		mooncake__master__commit_item__free_unpacked(ref, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t *p = malloc(size ? size : 1);
	CHECK(p);
	memcpy(p, data, size);
	event(p, size);
	commit_item(p, size);
	size_t pos = 0;
	struct mc_pbrec r;
	while (pos < size && mc_pb_next(p, size, &pos, &r))
		CHECK(r.start < r.end && r.end == pos && pos <= size);
	free(p);
	return 0;
}
