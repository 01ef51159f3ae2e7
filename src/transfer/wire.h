/*
 * wire: the transfer engine's binary formats (wire.c, pure): the TCP data
 * connection's slice header, the connection handshake's messages and its
 * server side as a step function, and the shm channel's messages. This
 * header includes only libc and common headers that do no I/O, so
 * wire.c passes the Makefile's purity check; te_int.h includes it.
 */
#ifndef MC_TRANSFER_WIRE_H
#define MC_TRANSFER_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/auth.h"
#include "common/err.h"

#define TE_NAME_MAX 255 /* segment name bytes */

/*
 * TCP data connection. After the handshake every message is a fixed
 * 32-byte little-endian header, followed by len raw bytes for a WRITE
 * request and for an OK response to a READ:
 *
 *   0  u32 magic "MCTD"      8  i32 status (responses: 0 or -code)
 *   4  u8  type              12 u32 len (<= TE_SLICE_MAX)
 *   5  u8  flags (0)         16 u64 id (echoed in the response)
 *   6  u16 reserved (0)      24 u64 addr (requests: remote address)
 *
 * A server answers requests in order. A refused WRITE's payload is read
 * and discarded. CTRL carries len bytes of a transport's control message
 * (addr = transport id); its response carries the reply bytes.
 */
#define TE_WIRE_MAGIC 0x4454434du /* "MCTD" */
#define TE_WIRE_HDR_BYTES 32

enum te_wire_type {
	TE_WIRE_READ = 1,
	TE_WIRE_WRITE = 2,
	TE_WIRE_RESP = 3,
	TE_WIRE_CTRL = 4,
};

struct te_wire_hdr {
	uint8_t type;
	int32_t status;
	uint32_t len;
	uint64_t id;
	uint64_t addr;
};

void te__wire_encode(const struct te_wire_hdr *h, uint8_t out[TE_WIRE_HDR_BYTES]);
/* Errors: MC_EPROTOCOL (bad magic, type, flags, reserved bits, a length
 * over max_len, a status in a request, an error response with a
 * payload). */
int te__wire_decode(const uint8_t in[TE_WIRE_HDR_BYTES], uint32_t max_len,
		    struct te_wire_hdr *h) MC_MUST_CHECK;

/*
 * Connection handshake (TCP data connections and the shm Unix socket),
 * fixed TE_HS_BYTES messages:
 *   client HELLO {flags: has secret, nonce_c, client name, target name}
 *   server RESULT {status} when neither side has a secret or it refuses
 *          (target name is not its segment: MC_ESEGMENT_NOT_FOUND; one side
 *          has a secret and the other not: -EACCES), else
 *          CHALLENGE {nonce_s, server mac}
 *   client AUTH {client mac} (after checking the server's mac)
 *   server RESULT {0 or -EACCES}
 * server mac = HMAC(secret, "mooncake-te-server" 0 nonce_c nonce_s target)
 * client mac = HMAC(secret, "mooncake-te-client" 0 nonce_s nonce_c client)
 */
#define TE_HS_MAGIC 0x4854434du /* "MCTH" */
#define TE_HS_VERSION 1
#define TE_HS_BYTES 608
#define TE_HS_NONCE 32
#define TE_HS_F_SECRET 0x01

enum te_hs_kind {
	TE_HS_HELLO = 1,
	TE_HS_CHALLENGE = 2,
	TE_HS_AUTH = 3,
	TE_HS_RESULT = 4,
};

struct te_hs_msg {
	uint8_t kind;
	uint8_t flags;
	int32_t status;
	uint8_t nonce[TE_HS_NONCE];
	uint8_t mac[MC_SHA256_BYTES];
	char name[TE_NAME_MAX + 1];   /* HELLO: the client's segment */
	char target[TE_NAME_MAX + 1]; /* HELLO: the segment it wants */
};

void te__hs_encode(const struct te_hs_msg *m, uint8_t out[TE_HS_BYTES]);
/* Errors: MC_EPROTOCOL (magic, version, kind, unterminated names),
 * -EPROTONOSUPPORT (another handshake version). */
int te__hs_decode(const uint8_t in[TE_HS_BYTES], struct te_hs_msg *m) MC_MUST_CHECK;
void te__hs_mac(const uint8_t *secret, size_t slen, bool server, const uint8_t a[TE_HS_NONCE],
		const uint8_t b[TE_HS_NONCE], const char *name, uint8_t out[MC_SHA256_BYTES]);

/*
 * The proof of a GetDescriptor request (proto/transfer.proto):
 * HMAC(secret, "mooncake-te-descriptor" 0 challenge name).
 */
void te__desc_mac(const uint8_t *secret, size_t slen, const uint8_t *challenge, size_t clen,
		  const char *name, uint8_t out[MC_SHA256_BYTES]);

/* Server side of the handshake as a pure step function: feed the
 * client's message, get the reply to send. */
struct te_hs_server {
	const uint8_t *secret; /* NULL: none */
	size_t secret_len;
	const char *own_name;
	uint8_t nonce_c[TE_HS_NONCE], nonce_s[TE_HS_NONCE]; /* nonce_s: caller's random */
	char peer[TE_NAME_MAX + 1];
	int state; /* 0 want HELLO, 1 want AUTH, 2 done, -1 refused */
};
/* Returns 1 to send *reply and wait for the next message, 0 when the
 * handshake succeeded (*reply is the RESULT to send), or a negative code
 * when refused (*reply is the RESULT to send before closing; -EACCES,
 * MC_ESEGMENT_NOT_FOUND) or MC_EPROTOCOL (send nothing, close). */
int te__hs_server_step(struct te_hs_server *s, const struct te_hs_msg *in,
		       struct te_hs_msg *reply) MC_MUST_CHECK;

/*
 * shm channel (SOCK_SEQPACKET, abstract Unix socket named in the
 * descriptor). After the same handshake as TCP, the server sends ADD (with
 * the region's memfd as SCM_RIGHTS) for every shareable region, then SYNC;
 * later ADD for new regions and DEL for removed ones, which the client
 * answers with ACK once nothing of its own touches the mapping any more.
 *
 *   0 u32 magic "MCTS"  4 u8 type  5..7 0  8 u32 id  12 u32 0
 *  16 u64 addr         24 u64 len        32 u64 memfd offset
 */
#define TE_SHM_MAGIC 0x5354434du /* "MCTS" */
#define TE_SHM_MSG_BYTES 40

enum te_shm_type { TE_SHM_ADD = 1, TE_SHM_DEL = 2, TE_SHM_SYNC = 3, TE_SHM_ACK = 4 };

struct te_shm_msg {
	uint8_t type;
	uint32_t id;
	uint64_t addr, len, off;
};

void te__shm_encode(const struct te_shm_msg *m, uint8_t out[TE_SHM_MSG_BYTES]);
/* Errors: MC_EPROTOCOL (magic, type, padding, an ADD that is empty or
 * wraps the address or offset space). */
int te__shm_decode(const uint8_t in[TE_SHM_MSG_BYTES], struct te_shm_msg *m) MC_MUST_CHECK;

#endif
