/*
 * req.h: the check of a client request against the protocol's limits
 * (req.c), before anything is done with it, and the hand codecs of the
 * hottest messages: a put's request and reply, a commit's items. Pure
 * (also the fuzz targets' entry).
 */
#ifndef MC_AGENT_REQ_H
#define MC_AGENT_REQ_H

#include <stdbool.h>

#include "client.pb-c.h"
#include "master.pb-c.h"
#include "common/err.h"
#include "common/pb.h"

#define AGENT_MAX_KEY_BYTES 4096u
#define AGENT_MAX_ITEMS 65536u      /* per request */
#define AGENT_MAX_REPLICAS 16u      /* per put, and taken from a placement */
#define AGENT_MAX_SEGMENT_NAME 255u /* bytes (the engine's TE_NAME_MAX) */
/* The most a request may take decoded: a frame (MC_UFRAME_MAX_BYTES) of
 * empty items would take some 0.5 GB; 65,536 real items with their keys
 * take well under this. */
#define AGENT_MAX_DECODED_BYTES (64u << 20)

/*
 * Check a decoded request against the protocol's limits before anything
 * is done with it: the op is known, nfds is within bounds, item counts,
 * key lengths (per item: -EINVAL marks the item), region kinds and
 * fd_index values. Returns 0, or the error to reply with (-EINVAL,
 * -EOPNOTSUPP for an unknown op, MC_EPROTOCOL for hello out of place);
 * *why names the problem. Pure.
 */
int agent__req_check(const Mooncake__Client__Request *m, bool hello_done,
		     const char **why) MC_MUST_CHECK;
/*
 * Decode a Request whose op is put, as protobuf-c would unpack it, into
 * the arena a (everything it points at lies there: nothing into p, whose
 * frame buffer is reused). Puts are most requests, and protobuf-c's
 * generic decoding of one took more than the rest of its handling in the
 * agent. Returns 0 with *out; 1 when it is not a put or not for this
 * decoder (another op, a field with another wire type than its own, a
 * submessage given twice, which protobuf-c merges): unpack it with
 * protobuf-c, which also says whether it is valid, into a released a;
 * -EBADMSG when it is not a valid encoding; -ENOMEM, also when it would
 * take more than AGENT_MAX_DECODED_BYTES. a is released on any return
 * but 0.
 */
int agent__decode_put_request(const uint8_t *p, size_t len, struct mc_pbarena *a,
			      Mooncake__Client__Request **out) MC_MUST_CHECK;
/* The most bytes agent__encode_put_response writes for n_errors. */
#define AGENT_PUT_RESPONSE_MAX(n_errors) (48 + 5 * (size_t)(n_errors))
/* Is r a reply agent__encode_put_response takes: a PutReply body, no
 * message, no unknown fields? */
bool agent__put_response_encodable(const Mooncake__Client__Response *r);
/*
 * Encode a put's reply (agent__put_response_encodable) as protobuf-c
 * packs it (test_pb_codecs compares): protobuf-c's sizing and packing
 * took some 1,350 instructions a put. Returns its length, at most
 * AGENT_PUT_RESPONSE_MAX(r->put->n_errors); 0 when r is not such a reply.
 */
size_t agent__encode_put_response(uint8_t *out, const Mooncake__Client__Response *r);

/* The most bytes agent__encode_commit_item writes for a key of klen. */
#define AGENT_COMMIT_ITEM_MAX(klen) (56 + (size_t)(klen))
/*
 * Encode a commit's item as protobuf-c packs it (test_pb_codecs
 * compares), for the items of a BatchCommitRequestRaw: protobuf-c's
 * sizing and packing of a BatchCommitRequest took some 1,400
 * instructions an item. Returns its length, at most
 * AGENT_COMMIT_ITEM_MAX(c->key.len).
 */
size_t agent__encode_commit_item(uint8_t *out, const Mooncake__Master__CommitItem *c);
/* Is a key acceptable (1..AGENT_MAX_KEY_BYTES)? */
bool agent__key_ok(const ProtobufCBinaryData *k);

#endif
