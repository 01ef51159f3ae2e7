/*
 * frame: the pure parts of the gRPC wire protocol (rpc/frame.c): status
 * codes, the 5-byte message prefix and its incremental decoder,
 * grpc-timeout and grpc-message encoding. Included by rpc.h; on its own
 * it needs only libc and common/err.h, so frame.c passes the Makefile's
 * purity check and tests and fuzz targets drive it directly.
 */
#ifndef MC_RPC_FRAME_H
#define MC_RPC_FRAME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

/* gRPC status codes (grpc/status.h values). */
enum rpc_status {
	RPC_OK = 0,
	RPC_CANCELLED = 1,
	RPC_UNKNOWN = 2,
	RPC_INVALID_ARGUMENT = 3,
	RPC_DEADLINE_EXCEEDED = 4,
	RPC_NOT_FOUND = 5,
	RPC_ALREADY_EXISTS = 6,
	RPC_PERMISSION_DENIED = 7,
	RPC_RESOURCE_EXHAUSTED = 8,
	RPC_FAILED_PRECONDITION = 9,
	RPC_ABORTED = 10,
	RPC_OUT_OF_RANGE = 11,
	RPC_UNIMPLEMENTED = 12,
	RPC_INTERNAL = 13,
	RPC_UNAVAILABLE = 14,
	RPC_DATA_LOSS = 15,
	RPC_UNAUTHENTICATED = 16,
};

/* "OK", "CANCELLED", ... ; "UNKNOWN" for out-of-range codes. */
const char *rpc_status_name(int status);

/* Incremental decoder of 5-byte-prefixed messages from DATA chunks.
 *
 * A body's buffer grows as its bytes come (RPC_DEFRAMER_FIRST_CAP, then
 * RPC_DEFRAMER_GROWTH times as much, never past the declared length):
 * a peer that declares large messages and sends a byte of each holds
 * little, and what it holds is msg_cap, which a caller may count. */
#define RPC_DEFRAMER_FIRST_CAP (64u << 10)
#define RPC_DEFRAMER_GROWTH 4u

struct rpc_deframer {
	size_t max_message_bytes;
	uint8_t hdr[5];
	size_t hdr_len;
	uint8_t *msg;   /* current message body (owned) */
	size_t msg_len; /* expected body length */
	size_t msg_cap; /* what msg holds now (at most msg_len) */
	size_t msg_got;
	bool compressed;
	/* The reassembled body on_msg is being handed, while it may still be
	 * taken (rpc_deframer_take); NULL otherwise. */
	uint8_t *out;
	size_t out_len;
	/* Optional source of body buffers (NULL: malloc/realloc/free), so a
	 * caller can recycle large buffers instead of faulting in fresh pages
	 * for every message. alloc gives a buffer for part of a body of len
	 * bytes: at least *cap bytes, and sets *cap to what it holds (a
	 * recycled buffer may hold the whole body at once); NULL when out of
	 * memory. A growing body is copied into a new buffer and the old one
	 * released. rpc_deframer_init sets them NULL. */
	void *(*alloc)(void *ctx, size_t len, size_t *cap);
	void (*release)(void *ctx, void *p, size_t len);
	void *alloc_ctx;
};

void rpc_deframer_init(struct rpc_deframer *d, size_t max_message_bytes);
void rpc_deframer_free(struct rpc_deframer *d);
/*
 * Feed bytes; each complete message is passed to on_msg (body borrowed).
 * on_msg returns 0 to continue or a negative code to stop (returned).
 * Errors: MC_ETOO_LARGE (declared length over the maximum), -EPROTO
 * (compressed flag set: no compression is negotiated), -ENOMEM.
 */
int rpc_deframer_feed(struct rpc_deframer *d, const uint8_t *data, size_t len,
		      int (*on_msg)(void *ud, const uint8_t *body, size_t len),
		      void *ud) MC_MUST_CHECK;
/*
 * From on_msg only: take ownership of the body it was handed, so that it
 * may outlive the call. NULL when body is not the reassembled buffer the
 * deframer owns (a body that arrived whole in one chunk lies in the
 * caller's chunk and cannot be taken). The caller frees what it took with
 * d->release(d->alloc_ctx, p, len), or free() when d->release is NULL.
 */
uint8_t *rpc_deframer_take(struct rpc_deframer *d, const uint8_t *body);
/* True when no partial message is buffered. */
bool rpc_deframer_idle(const struct rpc_deframer *d);
/* Where the next bytes of a partly received body go and how many fit
 * there now (*len), or NULL when no body is open or it is full. A reader may receive
 * straight into it: rpc_deframer_feed then finds the bytes in place and
 * does not copy them. */
uint8_t *rpc_deframer_room(const struct rpc_deframer *d, size_t *len);

/* Write the 5-byte prefix for an uncompressed message of len bytes. */
void rpc_frame_prefix(uint8_t out[5], uint32_t len);

/* grpc-timeout header value <-> milliseconds ("100m", "5S", "1H").
 * Parse errors: -EINVAL. */
int rpc_timeout_parse(const char *value, uint64_t *ms) MC_MUST_CHECK;
void rpc_timeout_format(uint64_t ms, char *buf, size_t len);

/* grpc-message percent-encoding (RFC: bytes outside 0x20-0x7e and '%'). */
void rpc_percent_encode(const char *in, char *out, size_t outlen);
void rpc_percent_decode(const char *in, char *out, size_t outlen);

#endif
