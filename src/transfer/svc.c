/*
 * svc: the engine's gRPC service mooncake.transfer.Transfer, on the loop
 * thread: Challenge and GetDescriptor (the descriptor fetch of P2P
 * peers, proto/transfer.proto).
 *
 * A descriptor tells where the engine's memory is (region addresses, the
 * data port, the shm socket, the boot id), so with a cluster secret it is
 * only given for a proof: the caller asks Challenge for a nonce and sends
 * HMAC(secret, label || nonce || name) with GetDescriptor. The nonce is
 * made here without keeping anything — the time it was issued (this
 * process's monotonic clock, so no clocks need to agree), 16 random bytes
 * and a tag over both keyed by a random key of this engine — and is good
 * for TE_CHALLENGE_TTL_MS. What keeps a proof from being used twice is
 * the list of nonces already accepted, kept until they expire; only a
 * caller that knows the secret can add to it, and when it is full of live
 * nonces the call is refused with RESOURCE_EXHAUSTED (try again) rather
 * than forgetting one.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/endian.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/util.h"
#include "rpc/rpc.h"
#include "transfer.pb-c.h"
#include "transfer/te_int.h"

#define LOG_SUBSYS LOGS_TE

/* ------------------------------------------------------------ nonces (pure) */

static void chal_tag(const struct te_svc *v, const uint8_t *body, uint8_t tag[TE_CHAL_TAG])
{
	static const char label[] = "mooncake-te-challenge";
	const void *parts[2] = {label, body};
	size_t lens[2] = {sizeof(label), 8 + TE_CHAL_RAND};
	uint8_t mac[MC_SHA256_BYTES];
	mc_hmac_sha256(v->key, sizeof(v->key), parts, lens, 2, mac);
	memcpy(tag, mac, TE_CHAL_TAG);
}

void te__svc_challenge(const struct te_svc *v, uint64_t now_ms,
		       const uint8_t rnd[TE_CHAL_RAND], uint8_t out[TE_CHAL_BYTES])
{
	mc_put_le64(out, now_ms);
	memcpy(out + 8, rnd, TE_CHAL_RAND);
	chal_tag(v, out, out + 8 + TE_CHAL_RAND);
}

int te__svc_check(struct te_svc *v, const uint8_t *secret, size_t slen, const uint8_t *chal,
		  size_t clen, const char *name, const uint8_t *mac, size_t maclen,
		  uint64_t now_ms, const char **why)
{
	uint8_t tag[TE_CHAL_TAG], want[MC_SHA256_BYTES];
	if (clen == 0 && maclen == 0) {
		*why = "no proof of the cluster secret (call Challenge first)";
		return -EACCES;
	}
	if (clen != TE_CHAL_BYTES || maclen != MC_SHA256_BYTES) {
		*why = "a malformed proof";
		return -EACCES;
	}
	chal_tag(v, chal, tag);
	if (!mc_ct_equal(tag, chal + 8 + TE_CHAL_RAND, TE_CHAL_TAG)) {
		*why = "a challenge this engine did not issue";
		return -EACCES;
	}
	uint64_t issued = mc_get_le64(chal);
	if (issued > now_ms || now_ms - issued > TE_CHALLENGE_TTL_MS) {
		*why = "an expired challenge";
		return -EACCES;
	}
	te__desc_mac(secret, slen, chal, clen, name, want);
	if (!mc_ct_equal(want, mac, sizeof(want))) {
		*why = "a wrong proof (cluster secret mismatch)";
		return -EACCES;
	}
	for (size_t i = 0; i < TE_CHALLENGE_USED_MAX; i++) {
		const struct te_chal_used *u = &v->used[i];
		if (u->issued_ms == issued && memcmp(u->rnd, chal + 8, TE_CHAL_RAND) == 0 &&
		    now_ms - u->issued_ms <= TE_CHALLENGE_TTL_MS) {
			*why = "a replayed proof (its challenge was used already)";
			return -EACCES;
		}
	}
	struct te_chal_used *slot = &v->used[v->next];
	if (slot->issued_ms && now_ms - slot->issued_ms <= TE_CHALLENGE_TTL_MS) {
		*why = "too many descriptor fetches at once";
		return -EBUSY;
	}
	slot->issued_ms = issued;
	memcpy(slot->rnd, chal + 8, TE_CHAL_RAND);
	v->next = (v->next + 1) % TE_CHALLENGE_USED_MAX;
	return 0;
}

/* ------------------------------------------------------------ the service */

static void svc_challenge(struct rpc_call *call, const ProtobufCMessage *msg)
{
	struct te_engine *e = rpc_call_service_data(call);
	uint8_t rnd[TE_CHAL_RAND], nonce[TE_CHAL_BYTES];
	(void)msg;
	int rc = mc_random(rnd, sizeof(rnd));
	if (rc) {
		rpc_call_finish(call, RPC_INTERNAL, mc_strerror(rc));
		return;
	}
	/* Issued at 1 ms at the earliest: 0 marks a free slot of used[]. */
	te__svc_challenge(&e->svc, mc_now_ms() + 1, rnd, nonce);
	Mooncake__Transfer__ChallengeReply m = MOONCAKE__TRANSFER__CHALLENGE_REPLY__INIT;
	m.nonce.data = nonce;
	m.nonce.len = sizeof(nonce);
	rc = rpc_call_send(call, &m.base);
	rpc_call_finish(call, rc ? RPC_INTERNAL : RPC_OK, rc ? mc_strerror(rc) : NULL);
}

static void svc_get_descriptor(struct rpc_call *call, const ProtobufCMessage *msg)
{
	struct te_engine *e = rpc_call_service_data(call);
	const Mooncake__Transfer__GetDescriptorRequest *req =
		(const Mooncake__Transfer__GetDescriptorRequest *)msg;
	const char *name = req->name ? req->name : "";
	struct te_desc *d = NULL;
	uint8_t *buf = NULL;
	size_t len = 0;

	if (e->stopped) {
		rpc_call_finish(call, RPC_UNAVAILABLE, "transfer engine stopping");
		return;
	}
	if (e->secret_len) {
		const char *why = NULL;
		int rc = te__svc_check(&e->svc, e->secret, e->secret_len, req->challenge.data,
				       req->challenge.len, name, req->mac.data, req->mac.len,
				       mc_now_ms() + 1, &why);
		if (rc == -EBUSY) {
			rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, why);
			return;
		}
		if (rc) {
			metric_inc(e->m_auth_refused[TE_AUTH_GRPC]);
			log_warn("refused GetDescriptor from %s: %s", rpc_call_peer(call),
				 why);
			char msgbuf[160];
			snprintf(msgbuf, sizeof(msgbuf), "the cluster secret is required: %s",
				 why);
			rpc_call_finish(call, RPC_UNAUTHENTICATED, msgbuf);
			return;
		}
	}
	if (name[0] && strcmp(name, e->name) != 0) {
		rpc_call_finish(call, RPC_NOT_FOUND, "no such segment here");
		return;
	}
	int rc = te__desc_build(e, &d);
	if (rc == 0)
		rc = te__desc_encode(d, &buf, &len);
	te__desc_free(d);
	Mooncake__Transfer__SegmentDesc *m =
		rc ? NULL : mooncake__transfer__segment_desc__unpack(NULL, len, buf);
	free(buf);
	if (!m) {
		rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, "out of memory");
		return;
	}
	rc = rpc_call_send(call, &m->base);
	mooncake__transfer__segment_desc__free_unpacked(m, NULL);
	rpc_call_finish(call, rc ? RPC_INTERNAL : RPC_OK, rc ? mc_strerror(rc) : NULL);
}

/* Served on a server that requires the secret's connection token
 * (an agent's) to callers without one too: these calls carry their own
 * fresh proof (Challenge's nonce), which is all a peer needs. */
static const struct rpc_method svc_methods[] = {
	{.name = "Challenge",
	 .kind = RPC_UNARY,
	 .request = &mooncake__transfer__challenge_request__descriptor,
	 .response = &mooncake__transfer__challenge_reply__descriptor,
	 .on_message = svc_challenge,
	 .no_auth = true},
	{.name = "GetDescriptor",
	 .kind = RPC_UNARY,
	 .request = &mooncake__transfer__get_descriptor_request__descriptor,
	 .response = &mooncake__transfer__segment_desc__descriptor,
	 .on_message = svc_get_descriptor,
	 .no_auth = true},
};

int te__svc_start(struct te_engine *e)
{
	int rc = mc_random(e->svc.key, sizeof(e->svc.key));
	if (rc)
		return rc;
	rc = rpc_server_add_service(e->rpc, "mooncake.transfer.Transfer", svc_methods,
				    MC_ARRAY_LEN(svc_methods), e);
	if (rc)
		log_error("transfer engine: cannot serve mooncake.transfer.Transfer: %s",
			  mc_strerror(rc));
	return rc;
}

void te_descriptor_mac(const uint8_t *secret, size_t slen, const uint8_t *challenge,
		       size_t clen, const char *name, uint8_t out[32])
{
	te__desc_mac(secret, slen, challenge, clen, name, out);
}
