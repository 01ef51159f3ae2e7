/* Fuzz target: the hand-written protobuf decoders of hot messages, each
 * against protobuf-c on the same bytes (pb_check.h) — the segment log's
 * events as the agent reads them (agent__mirror_event_decode), the
 * BatchCommit items as the master reads them (master__decode_commit_item),
 * client requests as the agent decodes puts (agent__decode_put_request),
 * and the field reader under them (mc_pb_next). A decoder that accepts what protobuf-c
 * refuses, refuses what it accepts, or decodes other values aborts; an
 * event it decoded is encoded again by the master's encoder, which must
 * give protobuf-c's bytes. The input lies in a block of its exact size,
 * so a read past it is a sanitizer error. */
#include "pb_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t *p = malloc(size ? size : 1);
	CHECK(p);
	memcpy(p, data, size);
	pb_check_event(p, size);
	pb_check_commit_item(p, size);
	pb_check_put_request(p, size);
	size_t pos = 0;
	struct mc_pbrec r;
	while (pos < size && mc_pb_next(p, size, &pos, &r))
		CHECK(r.start < r.end && r.end == pos && pos <= size);
	free(p);
	return 0;
}
