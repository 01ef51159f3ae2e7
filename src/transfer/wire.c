/*
 * wire: the transfer engine's binary formats — the 32-byte slice header of
 * the TCP data path, the fixed-size handshake messages that authenticate
 * a connection with the cluster secret and the server's side of that
 * handshake as a step function, and the shm channel's messages. Pure (the
 * Makefile's purity check holds it to that; the fuzz target drives it):
 * every field from the wire is checked before use. Formats: wire.h. The
 * blocking client side of the handshake is handshake.c.
 */
#include "transfer/wire.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/endian.h"
#include "common/util.h"

/* ------------------------------------------------------------ slice header */

void te__wire_encode(const struct te_wire_hdr *h, uint8_t out[TE_WIRE_HDR_BYTES])
{
	mc_put_le32(out, TE_WIRE_MAGIC);
	out[4] = h->type;
	out[5] = 0;
	mc_put_le16(out + 6, 0);
	mc_put_le32(out + 8, (uint32_t)h->status);
	mc_put_le32(out + 12, h->len);
	mc_put_le64(out + 16, h->id);
	mc_put_le64(out + 24, h->addr);
}

int te__wire_decode(const uint8_t in[TE_WIRE_HDR_BYTES], uint32_t max_len,
		    struct te_wire_hdr *h)
{
	if (mc_get_le32(in) != TE_WIRE_MAGIC || in[5] != 0 || mc_get_le16(in + 6) != 0)
		return MC_EPROTOCOL;
	h->type = in[4];
	h->status = (int32_t)mc_get_le32(in + 8);
	h->len = mc_get_le32(in + 12);
	h->id = mc_get_le64(in + 16);
	h->addr = mc_get_le64(in + 24);
	if (h->len > max_len)
		return MC_EPROTOCOL;
	switch (h->type) {
	case TE_WIRE_READ:
	case TE_WIRE_WRITE:
	case TE_WIRE_CTRL:
		return h->status == 0 ? 0 : MC_EPROTOCOL;
	case TE_WIRE_RESP:
		/* An error code is negative and small; it carries no bytes. */
		if (h->status > 0 || h->status < -4095)
			return MC_EPROTOCOL;
		if (h->status < 0 && h->len != 0)
			return MC_EPROTOCOL;
		return 0;
	default:
		return MC_EPROTOCOL;
	}
}

/* ------------------------------------------------------------ handshake */

/*
 *   0 u32 magic "MCTH"   8 i32 status        16 nonce[32]
 *   4 u16 version       12 u32 reserved (0)  48 mac[32]
 *   6 u8 kind            80 name[256] (NUL-padded)
 *   7 u8 flags          336 target[256]     592 reserved[16] (0)
 */
#define HS_NAME_OFF 80
#define HS_TARGET_OFF 336
#define HS_TAIL_OFF 592

void te__hs_encode(const struct te_hs_msg *m, uint8_t out[TE_HS_BYTES])
{
	memset(out, 0, TE_HS_BYTES);
	mc_put_le32(out, TE_HS_MAGIC);
	mc_put_le16(out + 4, TE_HS_VERSION);
	out[6] = m->kind;
	out[7] = m->flags;
	mc_put_le32(out + 8, (uint32_t)m->status);
	memcpy(out + 16, m->nonce, TE_HS_NONCE);
	memcpy(out + 48, m->mac, MC_SHA256_BYTES);
	memcpy(out + HS_NAME_OFF, m->name, strnlen(m->name, TE_NAME_MAX));
	memcpy(out + HS_TARGET_OFF, m->target, strnlen(m->target, TE_NAME_MAX));
}

/* A NUL-padded name field: no NUL inside the name, a NUL before the end. */
static int get_name(const uint8_t *p, char *out)
{
	size_t n = strnlen((const char *)p, TE_NAME_MAX + 1);
	if (n > TE_NAME_MAX)
		return MC_EPROTOCOL;
	for (size_t i = n; i <= TE_NAME_MAX; i++)
		if (p[i] != 0)
			return MC_EPROTOCOL;
	memcpy(out, p, n);
	out[n] = '\0';
	return 0;
}

int te__hs_decode(const uint8_t in[TE_HS_BYTES], struct te_hs_msg *m)
{
	if (mc_get_le32(in) != TE_HS_MAGIC)
		return MC_EPROTOCOL;
	if (mc_get_le16(in + 4) != TE_HS_VERSION)
		return -EPROTONOSUPPORT;
	m->kind = in[6];
	m->flags = in[7];
	m->status = (int32_t)mc_get_le32(in + 8);
	if (m->kind < TE_HS_HELLO || m->kind > TE_HS_RESULT || (m->flags & ~TE_HS_F_SECRET) ||
	    mc_get_le32(in + 12) != 0)
		return MC_EPROTOCOL;
	if (m->status > 0 || m->status < -4095)
		return MC_EPROTOCOL;
	for (size_t i = HS_TAIL_OFF; i < TE_HS_BYTES; i++)
		if (in[i])
			return MC_EPROTOCOL;
	memcpy(m->nonce, in + 16, TE_HS_NONCE);
	memcpy(m->mac, in + 48, MC_SHA256_BYTES);
	if (get_name(in + HS_NAME_OFF, m->name) || get_name(in + HS_TARGET_OFF, m->target))
		return MC_EPROTOCOL;
	return 0;
}

void te__hs_mac(const uint8_t *secret, size_t slen, bool server, const uint8_t a[TE_HS_NONCE],
		const uint8_t b[TE_HS_NONCE], const char *name, uint8_t out[MC_SHA256_BYTES])
{
	static const char ls[] = "mooncake-te-server", lc[] = "mooncake-te-client";
	const void *parts[4] = {server ? ls : lc, a, b, name};
	size_t lens[4] = {sizeof(ls), TE_HS_NONCE, TE_HS_NONCE, strlen(name)};
	mc_hmac_sha256(secret, slen, parts, lens, 4, out);
}

void te__desc_mac(const uint8_t *secret, size_t slen, const uint8_t *challenge, size_t clen,
		  const char *name, uint8_t out[MC_SHA256_BYTES])
{
	static const char label[] = "mooncake-te-descriptor";
	const void *parts[3] = {label, challenge, name};
	size_t lens[3] = {sizeof(label), clen, strlen(name)};
	mc_hmac_sha256(secret, slen, parts, lens, 3, out);
}

static void result(struct te_hs_msg *r, int status)
{
	memset(r, 0, sizeof(*r));
	r->kind = TE_HS_RESULT;
	r->status = status;
}

int te__hs_server_step(struct te_hs_server *s, const struct te_hs_msg *in,
		       struct te_hs_msg *reply)
{
	bool have = s->secret && s->secret_len;
	if (s->state == 0 && in->kind == TE_HS_HELLO) {
		snprintf(s->peer, sizeof(s->peer), "%s", in->name);
		memcpy(s->nonce_c, in->nonce, TE_HS_NONCE);
		if (strcmp(in->target, s->own_name) != 0) {
			s->state = -1;
			result(reply, MC_ESEGMENT_NOT_FOUND);
			return MC_ESEGMENT_NOT_FOUND;
		}
		if (have != ((in->flags & TE_HS_F_SECRET) != 0)) {
			s->state = -1;
			result(reply, -EACCES);
			return -EACCES;
		}
		if (!have) {
			s->state = 2;
			result(reply, 0);
			return 0;
		}
		memset(reply, 0, sizeof(*reply));
		reply->kind = TE_HS_CHALLENGE;
		reply->flags = TE_HS_F_SECRET;
		memcpy(reply->nonce, s->nonce_s, TE_HS_NONCE);
		te__hs_mac(s->secret, s->secret_len, true, s->nonce_c, s->nonce_s, s->own_name,
			   reply->mac);
		s->state = 1;
		return 1;
	}
	if (s->state == 1 && in->kind == TE_HS_AUTH) {
		uint8_t want[MC_SHA256_BYTES];
		te__hs_mac(s->secret, s->secret_len, false, s->nonce_s, s->nonce_c, s->peer,
			   want);
		if (!mc_ct_equal(want, in->mac, sizeof(want))) {
			s->state = -1;
			result(reply, -EACCES);
			return -EACCES;
		}
		s->state = 2;
		result(reply, 0);
		return 0;
	}
	s->state = -1;
	return MC_EPROTOCOL;
}

/* ------------------------------------------------------------ shm channel */

void te__shm_encode(const struct te_shm_msg *m, uint8_t out[TE_SHM_MSG_BYTES])
{
	memset(out, 0, TE_SHM_MSG_BYTES);
	mc_put_le32(out, TE_SHM_MAGIC);
	out[4] = m->type;
	mc_put_le32(out + 8, m->id);
	mc_put_le64(out + 16, m->addr);
	mc_put_le64(out + 24, m->len);
	mc_put_le64(out + 32, m->off);
}

int te__shm_decode(const uint8_t in[TE_SHM_MSG_BYTES], struct te_shm_msg *m)
{
	if (mc_get_le32(in) != TE_SHM_MAGIC || in[5] || in[6] || in[7] || mc_get_le32(in + 12))
		return MC_EPROTOCOL;
	m->type = in[4];
	m->id = mc_get_le32(in + 8);
	m->addr = mc_get_le64(in + 16);
	m->len = mc_get_le64(in + 24);
	m->off = mc_get_le64(in + 32);
	switch (m->type) {
	case TE_SHM_ADD:
		if (m->len == 0 || m->addr + (m->len - 1) < m->addr ||
		    m->off + (m->len - 1) < m->off || m->off > (uint64_t)INT64_MAX)
			return MC_EPROTOCOL;
		return 0;
	case TE_SHM_DEL:
	case TE_SHM_ACK:
	case TE_SHM_SYNC:
		return 0;
	default:
		return MC_EPROTOCOL;
	}
}
