/*
 * auth: servers whose remote calls must prove the cluster secret
 * (rpc_server_require_auth, rpc.h), and the token a client of one sends
 * (rpc_client_opts.auth_key). A connection proves it once, with the
 * token (common/auth.h) in the "mooncake-auth" header of its first call
 * that is not a health check; the server remembers the token's nonce for
 * the token's window, so that a token read off the wire opens no other
 * connection, and at most AUTH_MAX_NONCES of them (past that, proofs
 * wait for old ones to expire: only holders of the secret can fill it).
 * A server may also take a bearer token (mc_bearer_check) in a header of
 * its choosing (the meta role's etcd API: "token", what etcd's clients
 * send after Authenticate); and a method marked no_auth (that
 * Authenticate) is served on a connection that proved nothing, without
 * proving it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/auth.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/util.h"
#include "rpc/server_int.h"

#define LOG_SUBSYS LOGS_RPC

#define AUTH_MAX_NONCES 65536u
#define AUTH_HEADER "mooncake-auth"
#define HEALTH_PREFIX "/grpc.health.v1.Health/"

struct nonce_ent {
	uint8_t nonce[MC_RPC_NONCE_BYTES];
	uint64_t expires_ms; /* wall clock */
};

struct rpc__auth {
	uint8_t key[MC_SECRET_MAX_BYTES];
	size_t klen;
	struct nonce_ent *seen; /* a ring, oldest at head */
	size_t head, n;
	struct metric *m_refused;
	uint64_t told_ms;
	char bearer[32]; /* the bearer token's header, or "" */
};

int rpc_server_require_auth(struct rpc_server *s, const uint8_t *key, size_t len)
{
	if (len == 0 || len > MC_SECRET_MAX_BYTES)
		return -EINVAL;
	struct rpc__auth *a = s->auth;
	if (!a) {
		a = calloc(1, sizeof(*a));
		if (!a)
			return -ENOMEM;
		a->seen = calloc(AUTH_MAX_NONCES, sizeof(*a->seen));
		if (!a->seen) {
			free(a);
			return -ENOMEM;
		}
		const char *vals[] = {s->name};
		a->m_refused = metrics_counter(
			s->reg, "mooncake_rpc_server_unauthenticated_total",
			"Calls refused for want of a valid cluster-secret token", "server",
			vals);
		s->auth = a;
	}
	memcpy(a->key, key, len);
	a->klen = len;
	return 0;
}

int rpc_server_accept_bearer(struct rpc_server *s, const char *header)
{
	if (!s->auth || !header || !*header || strlen(header) >= sizeof(s->auth->bearer))
		return -EINVAL;
	snprintf(s->auth->bearer, sizeof(s->auth->bearer), "%s", header);
	return 0;
}

void rpc__auth_free(struct rpc_server *s)
{
	if (!s->auth)
		return;
	memset(s->auth->key, 0, sizeof(s->auth->key));
	free(s->auth->seen);
	free(s->auth);
	s->auth = NULL;
}

/* Whether nonce was seen within the window; else remembered. -EBUSY: the
 * ring is full of unexpired nonces. */
static int nonce_fresh(struct rpc__auth *a, const uint8_t *nonce, uint64_t now)
{
	while (a->n && a->seen[a->head].expires_ms <= now) {
		a->head = (a->head + 1) % AUTH_MAX_NONCES;
		a->n--;
	}
	for (size_t i = 0; i < a->n; i++)
		if (memcmp(a->seen[(a->head + i) % AUTH_MAX_NONCES].nonce, nonce,
			   MC_RPC_NONCE_BYTES) == 0)
			return -EEXIST;
	if (a->n == AUTH_MAX_NONCES)
		return -EBUSY;
	struct nonce_ent *e = &a->seen[(a->head + a->n++) % AUTH_MAX_NONCES];
	memcpy(e->nonce, nonce, MC_RPC_NONCE_BYTES);
	/* (the token may be this old or young: remember it until no clock
	 * within the window would take it) */
	e->expires_ms = now + 2 * MC_RPC_TOKEN_WINDOW_MS;
	return 0;
}

/* Why a call was refused, for its status message and the log. */
static const char *refusal(int rc)
{
	return rc == -ENOENT   ? "no mooncake-auth token"
	       : rc == -EACCES ? "the token was made with another secret"
	       : rc == -ETIME  ? "the token's clock is more than 5 minutes off ours"
	       : rc == -EEXIST ? "the token was used before"
	       : rc == -EBUSY  ? "too many connections proven recently; retry"
			       : "the mooncake-auth header is not a token";
}

int rpc__auth_admit(struct rpc_call *call, const char *path, char *why, size_t wlen)
{
	struct rpc_server *s = call->s;
	struct rpc__auth *a = s->auth;
	if (!a || !call->tp->proven || (call->m && call->m->no_auth) ||
	    (path && strncmp(path, HEALTH_PREFIX, sizeof(HEALTH_PREFIX) - 1) == 0))
		return 0;
	bool *proven = call->tp->proven(call);
	if (!proven) {
		snprintf(why, wlen, "the connection is gone");
		return RPC_UNAVAILABLE;
	}
	if (*proven)
		return 0;
	const char *tok = rpc_call_header(call, AUTH_HEADER);
	const char *bearer = !tok && a->bearer[0] ? rpc_call_header(call, a->bearer) : NULL;
	uint8_t nonce[MC_RPC_NONCE_BYTES];
	uint64_t now = mc_wall_ms();
	int rc = -ENOENT;
	if (bearer) {
		rc = mc_bearer_check(a->key, a->klen, bearer, now);
	} else if (tok) {
		rc = mc_rpc_token_check(a->key, a->klen, tok, now, nonce);
		if (rc == 0)
			rc = nonce_fresh(a, nonce, now);
	}
	if (rc == 0) {
		*proven = true;
		return 0;
	}
	metric_inc(a->m_refused);
	if (bearer) {
		/* etcd's words, which its clients answer by authenticating
		 * again (an expired token, or one of another cluster). */
		snprintf(why, wlen, "etcdserver: invalid auth token");
		if (mc_once_per(&a->told_ms, 10000))
			log_warn("%s: refused a call from %s: its %s token %s (mooncake_rpc_"
				 "server_unauthenticated_total counts them)",
				 s->name, rpc_call_peer(call), a->bearer,
				 rc == -ETIME ? "expired"
					      : "is not one of the cluster secret");
		return RPC_UNAUTHENTICATED;
	}
	const char *what = refusal(rc);
	if (a->bearer[0] && rc == -ENOENT)
		snprintf(
			why, wlen,
			"this server requires the cluster secret (--cluster-secret-file): no "
			"mooncake-auth token and no etcd auth token (etcd clients: user root, "
			"the secret file's contents as password, e.g. etcdctl --user root:...)");
	else
		snprintf(why, wlen,
			 "this server requires the cluster secret (--cluster-secret-file): %s",
			 what);
	if (mc_once_per(&a->told_ms, 10000))
		log_warn("%s: refused a call from %s: %s (mooncake_rpc_server_"
			 "unauthenticated_total counts them)",
			 s->name, rpc_call_peer(call), what);
	return rc == -EBUSY ? RPC_UNAVAILABLE : RPC_UNAUTHENTICATED;
}
