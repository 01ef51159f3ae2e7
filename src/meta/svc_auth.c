/*
 * svc_auth: etcdserverpb.Auth's Authenticate, the way etcd's clients
 * (etcdctl --user, clientv3's Username/Password, python-etcd3's
 * user/password) prove the cluster secret to a member whose etcd API
 * requires it (meta.h, client_key). The one user is root; its password is
 * the secret itself (the secret file's contents, as mc_secret_load reads
 * them). The answer is a bearer token (common/auth.h) that the clients
 * send in the "token" header of their later calls, as they send etcd's
 * simple tokens; every member with the secret takes it until it expires,
 * and then they authenticate again (the rpc layer answers an expired one
 * with etcd's "invalid auth token"). Nothing is kept per client.
 *
 * etcd's user and role management (UserAdd, RoleGrantPermission, ...) is
 * not served: UNIMPLEMENTED.
 */
#include <stdio.h>
#include <string.h>

#include "common/auth.h"
#include "common/log.h"
#include "common/util.h"
#include "meta/meta_int.h"

#define LOG_SUBSYS LOGS_META

#define AUTH_USER "root"
#define AUTH_TTL_DEFAULT_MS (5 * 60 * 1000ull)

static bool password_ok(const struct meta_node *n, const char *pw)
{
	size_t len = pw ? strlen(pw) : 0;
	return len == n->o.client_key_len && mc_ct_equal(pw, n->o.client_key, len);
}

static void on_authenticate(struct rpc_call *call, const ProtobufCMessage *msg)
{
	struct meta_node *n = rpc_call_service_data(call);
	const Etcdserverpb__AuthenticateRequest *req = (const void *)msg;

	if (!n->o.client_key) {
		rpc_call_finish(call, RPC_FAILED_PRECONDITION,
				"etcdserver: authentication is not enabled");
		return;
	}
	if (!req->name || strcmp(req->name, AUTH_USER) != 0 ||
	    !password_ok(n, req->password)) {
		if (mc_once_per(&n->auth_told_ms, 10000))
			log_warn(
				"Authenticate from %s as \"%.64s\" failed: the user is "
				"root, the password the cluster secret (--cluster-secret-file)",
				rpc_call_peer(call), req->name ? req->name : "");
		rpc_call_finish(
			call, RPC_INVALID_ARGUMENT,
			"etcdserver: authentication failed, invalid user ID or password");
		return;
	}
	uint64_t ttl = n->o.auth_token_ttl_ms ? n->o.auth_token_ttl_ms : AUTH_TTL_DEFAULT_MS;
	char tok[MC_RPC_TOKEN_MAX];
	int rc = mc_bearer_token(n->o.client_key, n->o.client_key_len, mc_wall_ms() + ttl,
				 tok);
	if (rc) {
		rpc_call_finish(call, RPC_INTERNAL, mc_strerror(rc));
		return;
	}
	Etcdserverpb__AuthenticateResponse r = ETCDSERVERPB__AUTHENTICATE_RESPONSE__INIT;
	struct meta__arena a = {0};
	if (!(r.header = meta__header(n, &a))) {
		rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, "etcdserver: out of memory");
		return;
	}
	r.token = tok;
	rc = rpc_call_send(call, &r.base);
	rpc_call_finish(call, rc ? RPC_INTERNAL : RPC_OK, rc ? mc_strerror(rc) : NULL);
	meta__arena_free(&a);
	memset(tok, 0, sizeof(tok));
}

static const struct rpc_method auth_methods[] = {
	{.name = "Authenticate",
	 .kind = RPC_UNARY,
	 .request = &etcdserverpb__authenticate_request__descriptor,
	 .response = &etcdserverpb__authenticate_response__descriptor,
	 .on_message = on_authenticate,
	 .no_auth = true},
};

int meta__auth_service_add(struct meta_node *n)
{
	struct rpc_server *s = n->o.client_srv;
	if (!s)
		return 0;
	return rpc_server_add_service(s, "etcdserverpb.Auth", auth_methods,
				      MC_ARRAY_LEN(auth_methods), n);
}
