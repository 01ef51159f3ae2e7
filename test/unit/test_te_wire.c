/*
 * test_te_wire: the transfer engine's binary formats (transfer/wire.c) —
 * the slice header round trip and every field it refuses, the handshake
 * messages and the server's handshake step function with and without a
 * cluster secret (matching, wrong, one-sided, wrong target, out of
 * order), and the shm channel messages.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

#include "transfer/te_int.h"

Test(te_wire, header_round_trip)
{
	struct te_wire_hdr h = {.type = TE_WIRE_WRITE,
				.len = 1u << 20,
				.id = 0x0102030405060708ull,
				.addr = 0xfffffffffffff000ull},
			   g;
	uint8_t b[TE_WIRE_HDR_BYTES];
	te__wire_encode(&h, b);
	cr_assert_eq(b[0], 'M');
	cr_assert_eq(b[3], 'D');
	cr_assert_eq(te__wire_decode(b, TE_SLICE_MAX, &g), 0);
	cr_assert_eq(g.type, h.type);
	cr_assert_eq(g.len, h.len);
	cr_assert_eq(g.id, h.id);
	cr_assert_eq(g.addr, h.addr);
	cr_assert_eq(b[16], 0x08); /* little-endian */

	h = (struct te_wire_hdr){.type = TE_WIRE_RESP, .status = MC_EREMOTE_ACCESS, .id = 9};
	te__wire_encode(&h, b);
	cr_assert_eq(te__wire_decode(b, TE_SLICE_MAX, &g), 0);
	cr_assert_eq(g.status, MC_EREMOTE_ACCESS);
}

Test(te_wire, header_refusals)
{
	struct te_wire_hdr h = {.type = TE_WIRE_READ, .len = 100, .id = 1, .addr = 5}, g;
	uint8_t b[TE_WIRE_HDR_BYTES], c[TE_WIRE_HDR_BYTES];
	te__wire_encode(&h, b);
	/* every single-bit flip in magic, flags and reserved is refused */
	for (int byte = 0; byte < 8; byte++) {
		if (byte == 4)
			continue; /* the type */
		for (int bit = 0; bit < 8; bit++) {
			memcpy(c, b, sizeof(c));
			c[byte] ^= (uint8_t)(1 << bit);
			cr_assert_eq(te__wire_decode(c, TE_SLICE_MAX, &g), MC_EPROTOCOL,
				     "byte %d bit %d", byte, bit);
		}
	}
	memcpy(c, b, sizeof(c));
	c[4] = 0;
	cr_assert_eq(te__wire_decode(c, TE_SLICE_MAX, &g), MC_EPROTOCOL);
	c[4] = 5;
	cr_assert_eq(te__wire_decode(c, TE_SLICE_MAX, &g), MC_EPROTOCOL);
	/* length over the maximum */
	cr_assert_eq(te__wire_decode(b, 99, &g), MC_EPROTOCOL);
	cr_assert_eq(te__wire_decode(b, 100, &g), 0);
	/* a status in a request */
	h.status = -1;
	te__wire_encode(&h, c);
	cr_assert_eq(te__wire_decode(c, TE_SLICE_MAX, &g), MC_EPROTOCOL);
	/* an error answer with bytes, a positive or huge status */
	h = (struct te_wire_hdr){.type = TE_WIRE_RESP, .status = -5, .len = 1};
	te__wire_encode(&h, c);
	cr_assert_eq(te__wire_decode(c, TE_SLICE_MAX, &g), MC_EPROTOCOL);
	h.len = 0;
	h.status = 3;
	te__wire_encode(&h, c);
	cr_assert_eq(te__wire_decode(c, TE_SLICE_MAX, &g), MC_EPROTOCOL);
	h.status = -5000;
	te__wire_encode(&h, c);
	cr_assert_eq(te__wire_decode(c, TE_SLICE_MAX, &g), MC_EPROTOCOL);
}

static void hs_round(const struct te_hs_msg *m, struct te_hs_msg *out)
{
	uint8_t b[TE_HS_BYTES];
	te__hs_encode(m, b);
	cr_assert_eq(te__hs_decode(b, out), 0);
}

Test(te_wire, handshake_messages)
{
	struct te_hs_msg m = {.kind = TE_HS_HELLO, .flags = TE_HS_F_SECRET}, g;
	memset(m.nonce, 0x11, sizeof(m.nonce));
	memset(m.mac, 0x22, sizeof(m.mac));
	memset(m.name, 'n', TE_NAME_MAX);
	strcpy(m.target, "10.0.0.1:12345");
	hs_round(&m, &g);
	cr_assert_eq(g.kind, TE_HS_HELLO);
	cr_assert_eq(strlen(g.name), TE_NAME_MAX);
	cr_assert_str_eq(g.target, "10.0.0.1:12345");
	cr_assert(memcmp(g.nonce, m.nonce, TE_HS_NONCE) == 0);

	uint8_t b[TE_HS_BYTES], c[TE_HS_BYTES];
	te__hs_encode(&m, b);
	memcpy(c, b, sizeof(c));
	c[4] = 2; /* version 2 */
	cr_assert_eq(te__hs_decode(c, &g), -EPROTONOSUPPORT);
	memcpy(c, b, sizeof(c));
	c[0] ^= 1;
	cr_assert_eq(te__hs_decode(c, &g), MC_EPROTOCOL);
	memcpy(c, b, sizeof(c));
	c[6] = 9; /* kind */
	cr_assert_eq(te__hs_decode(c, &g), MC_EPROTOCOL);
	memcpy(c, b, sizeof(c));
	c[7] = 0x80; /* unknown flag */
	cr_assert_eq(te__hs_decode(c, &g), MC_EPROTOCOL);
	memcpy(c, b, sizeof(c));
	c[TE_HS_BYTES - 1] = 1; /* reserved tail */
	cr_assert_eq(te__hs_decode(c, &g), MC_EPROTOCOL);
	memcpy(c, b, sizeof(c));
	c[80 + TE_NAME_MAX] = 'x'; /* name without its terminator */
	cr_assert_eq(te__hs_decode(c, &g), MC_EPROTOCOL);
	memcpy(c, b, sizeof(c));
	c[336 + 20] = 'x'; /* a byte after the target's NUL */
	cr_assert_eq(te__hs_decode(c, &g), MC_EPROTOCOL);
}

/* Run a whole handshake between the client logic (as in te__hs_client)
 * and the server step function. Returns the server's verdict. */
static int handshake(const char *cs, const char *ss, const char *target)
{
	struct te_hs_server srv = {.secret = (const uint8_t *)ss,
				   .secret_len = ss ? strlen(ss) : 0,
				   .own_name = "server"};
	memset(srv.nonce_s, 0x5a, TE_HS_NONCE);
	struct te_hs_msg hello = {.kind = TE_HS_HELLO, .flags = cs ? TE_HS_F_SECRET : 0}, r,
			 auth = {.kind = TE_HS_AUTH}, r2;
	memset(hello.nonce, 0xa5, TE_HS_NONCE);
	strcpy(hello.name, "client");
	strcpy(hello.target, target);
	hs_round(&hello, &hello);
	int rc = te__hs_server_step(&srv, &hello, &r);
	if (rc <= 0)
		return rc;
	cr_assert_eq(r.kind, TE_HS_CHALLENGE);
	uint8_t want[32];
	te__hs_mac((const uint8_t *)cs, strlen(cs), true, hello.nonce, r.nonce, target, want);
	bool server_ok = memcmp(want, r.mac, 32) == 0;
	te__hs_mac((const uint8_t *)cs, strlen(cs), false, r.nonce, hello.nonce, "client",
		   auth.mac);
	rc = te__hs_server_step(&srv, &auth, &r2);
	cr_assert_eq(r2.kind, TE_HS_RESULT);
	cr_assert_eq(r2.status, rc);
	cr_assert_eq(server_ok, rc == 0,
		     "the client sees the server's mac iff "
		     "the secrets agree");
	if (rc == 0)
		cr_assert_str_eq(srv.peer, "client");
	return rc;
}

Test(te_wire, handshake_server_step)
{
	cr_assert_eq(handshake(NULL, NULL, "server"), 0);
	cr_assert_eq(handshake("s3cret", "s3cret", "server"), 0);
	cr_assert_eq(handshake("s3cret", "other", "server"), -EACCES);
	cr_assert_eq(handshake("s3cret", NULL, "server"), -EACCES);
	cr_assert_eq(handshake(NULL, "s3cret", "server"), -EACCES);
	cr_assert_eq(handshake(NULL, NULL, "elsewhere"), MC_ESEGMENT_NOT_FOUND);
	cr_assert_eq(handshake("s", "s", "elsewhere"), MC_ESEGMENT_NOT_FOUND);

	/* messages out of order are protocol errors */
	struct te_hs_server srv = {.own_name = "server"};
	struct te_hs_msg m = {.kind = TE_HS_AUTH}, r;
	cr_assert_eq(te__hs_server_step(&srv, &m, &r), MC_EPROTOCOL);
	srv.state = 0;
	m.kind = TE_HS_RESULT;
	cr_assert_eq(te__hs_server_step(&srv, &m, &r), MC_EPROTOCOL);
	/* and a finished handshake takes nothing more */
	srv = (struct te_hs_server){.own_name = "server"};
	m = (struct te_hs_msg){.kind = TE_HS_HELLO};
	strcpy(m.target, "server");
	cr_assert_eq(te__hs_server_step(&srv, &m, &r), 0);
	cr_assert_eq(te__hs_server_step(&srv, &m, &r), MC_EPROTOCOL);
}

Test(te_wire, shm_messages)
{
	struct te_shm_msg m = {.type = TE_SHM_ADD,
			       .id = 7,
			       .addr = 0x1000,
			       .len = 4096,
			       .off = 8192},
			  g;
	uint8_t b[TE_SHM_MSG_BYTES], c[TE_SHM_MSG_BYTES];
	te__shm_encode(&m, b);
	cr_assert_eq(te__shm_decode(b, &g), 0);
	cr_assert_eq(g.id, 7);
	cr_assert_eq(g.addr, 0x1000);
	cr_assert_eq(g.len, 4096);
	cr_assert_eq(g.off, 8192);
	memcpy(c, b, sizeof(c));
	c[5] = 1;
	cr_assert_eq(te__shm_decode(c, &g), MC_EPROTOCOL);
	memcpy(c, b, sizeof(c));
	c[4] = 9;
	cr_assert_eq(te__shm_decode(c, &g), MC_EPROTOCOL);
	m.len = 0;
	te__shm_encode(&m, c);
	cr_assert_eq(te__shm_decode(c, &g), MC_EPROTOCOL);
	m.len = 2;
	m.addr = UINT64_MAX; /* wraps */
	te__shm_encode(&m, c);
	cr_assert_eq(te__shm_decode(c, &g), MC_EPROTOCOL);
	m.addr = 0;
	m.off = UINT64_MAX - 4; /* offset beyond what mmap takes */
	te__shm_encode(&m, c);
	cr_assert_eq(te__shm_decode(c, &g), MC_EPROTOCOL);
	m = (struct te_shm_msg){.type = TE_SHM_DEL, .id = 3};
	te__shm_encode(&m, c);
	cr_assert_eq(te__shm_decode(c, &g), 0);
	cr_assert_eq(g.type, TE_SHM_DEL);
}

/* GetDescriptor's proof (svc.c): a challenge of this engine, fresh, with
 * the right mac over the right name, used once. */
Test(te_svc, descriptor_proof)
{
	static struct te_svc v;
	const uint8_t secret[] = "s3cret", other[] = "other!";
	uint8_t rnd[TE_CHAL_RAND] = {1, 2, 3}, ch[TE_CHAL_BYTES], mac[32], c2[TE_CHAL_BYTES];
	const char *why;
	memset(&v, 0, sizeof(v));
	memset(v.key, 7, sizeof(v.key));
	uint64_t t = 1000;
	te__svc_challenge(&v, t, rnd, ch);
	te__desc_mac(secret, 6, ch, sizeof(ch), "seg", mac);

	cr_assert_eq(te__svc_check(&v, secret, 6, NULL, 0, "seg", NULL, 0, t, &why), -EACCES);
	cr_assert(strstr(why, "no proof"), "%s", why);
	cr_assert_eq(te__svc_check(&v, secret, 6, ch, 10, "seg", mac, 32, t, &why), -EACCES);
	cr_assert(strstr(why, "malformed"), "%s", why);
	memcpy(c2, ch, sizeof(c2));
	c2[9] ^= 1; /* not a challenge this key tagged */
	cr_assert_eq(te__svc_check(&v, secret, 6, c2, sizeof(c2), "seg", mac, 32, t, &why),
		     -EACCES);
	cr_assert(strstr(why, "did not issue"), "%s", why);
	cr_assert_eq(te__svc_check(&v, secret, 6, ch, sizeof(ch), "seg", mac, 32,
				   t + TE_CHALLENGE_TTL_MS + 1, &why),
		     -EACCES);
	cr_assert(strstr(why, "expired"), "%s", why);
	cr_assert_eq(te__svc_check(&v, secret, 6, ch, sizeof(ch), "seg", mac, 32, t - 1, &why),
		     -EACCES, "issued in the future");
	cr_assert_eq(te__svc_check(&v, secret, 6, ch, sizeof(ch), "other", mac, 32, t, &why),
		     -EACCES, "made for another name");
	cr_assert_eq(te__svc_check(&v, other, 6, ch, sizeof(ch), "seg", mac, 32, t, &why),
		     -EACCES);
	cr_assert(strstr(why, "mismatch"), "%s", why);
	/* None of the refusals used the challenge up. */
	cr_assert_eq(te__svc_check(&v, secret, 6, ch, sizeof(ch), "seg", mac, 32, t + 5, &why),
		     0);
	cr_assert_eq(te__svc_check(&v, secret, 6, ch, sizeof(ch), "seg", mac, 32, t + 6, &why),
		     -EACCES);
	cr_assert(strstr(why, "replayed"), "%s", why);

	/* The list of used challenges: full of live ones it refuses (try
	 * again), and once they expired it takes new ones. */
	memset(&v.used, 0, sizeof(v.used));
	v.next = 0;
	for (unsigned i = 0; i < TE_CHALLENGE_USED_MAX; i++) {
		memcpy(rnd, &i, sizeof(i));
		te__svc_challenge(&v, t, rnd, ch);
		te__desc_mac(secret, 6, ch, sizeof(ch), "", mac);
		cr_assert_eq(
			te__svc_check(&v, secret, 6, ch, sizeof(ch), "", mac, 32, t, &why), 0);
	}
	rnd[15] = 1;
	te__svc_challenge(&v, t + 1, rnd, ch);
	te__desc_mac(secret, 6, ch, sizeof(ch), "", mac);
	cr_assert_eq(te__svc_check(&v, secret, 6, ch, sizeof(ch), "", mac, 32, t + 1, &why),
		     -EBUSY);
	uint64_t later = t + TE_CHALLENGE_TTL_MS + 1;
	te__svc_challenge(&v, later, rnd, ch);
	te__desc_mac(secret, 6, ch, sizeof(ch), "", mac);
	cr_assert_eq(te__svc_check(&v, secret, 6, ch, sizeof(ch), "", mac, 32, later, &why),
		     0);
}
