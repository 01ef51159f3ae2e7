/*
 * auth: the cluster secret and what daemons prove with it — SHA-256,
 * HMAC-SHA256 (RFC 2104), a constant-time compare, and loading the secret
 * from --cluster-secret-file.
 *
 * A peer proves it knows the secret by answering a fresh random challenge
 * with HMAC(secret, label || challenge || ...); the secret itself never
 * crosses the wire. Pure and thread-safe except mc_secret_load,
 * mc_secret_create and mc_secret_find (files) and mc_random (the kernel's
 * random source).
 *
 * Where the transfer engine's secret comes from (mc_secret_find, the one
 * rule for the daemon and for every tool that runs an engine):
 *   --insecure-transfer      none: peers are not authenticated;
 *   --cluster-secret-file=F  F, which must exist (every host of a
 *                            multi-host cluster holds the same one);
 *   neither                  <data-dir>/cluster.secret, which the agent
 *                            creates (random, 0600) at its first start;
 *                            only for processes that listen on loopback
 *                            addresses alone (a secret no other host
 *                            holds cannot authenticate a remote peer).
 */
#ifndef MC_COMMON_AUTH_H
#define MC_COMMON_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define MC_SHA256_BYTES 32
#define MC_SECRET_MAX_BYTES 4096

struct mc_sha256 {
	uint32_t h[8];
	uint64_t total; /* bytes hashed so far */
	uint8_t block[64];
	size_t used; /* bytes in block */
};

void mc_sha256_init(struct mc_sha256 *s);
void mc_sha256_update(struct mc_sha256 *s, const void *data, size_t len);
void mc_sha256_final(struct mc_sha256 *s, uint8_t out[MC_SHA256_BYTES]);
void mc_sha256(const void *data, size_t len, uint8_t out[MC_SHA256_BYTES]);

/* HMAC-SHA256 over the concatenation of n parts (parts[i], lens[i]). */
void mc_hmac_sha256(const void *key, size_t klen, const void *const *parts, const size_t *lens,
		    size_t n, uint8_t out[MC_SHA256_BYTES]);

/* Compare without a data-dependent early exit. True when equal. */
bool mc_ct_equal(const void *a, const void *b, size_t len);

/* Fill buf with len bytes from the kernel's random source (getrandom).
 * Errors: negative errno. */
int mc_random(void *buf, size_t len) MC_MUST_CHECK;

/*
 * Read a cluster secret file: its contents without trailing newlines and
 * spaces, 1..MC_SECRET_MAX_BYTES bytes. *len_out gets the length; buf must
 * hold MC_SECRET_MAX_BYTES. A file readable by group or others is accepted
 * but *world_readable is set so the caller can warn. Errors: negative
 * errno of open/read, -EINVAL (empty), -EFBIG (larger than the maximum).
 */
int mc_secret_load(const char *path, uint8_t *buf, size_t *len_out,
		   bool *world_readable) MC_MUST_CHECK;

/* The default secret file of a data directory. */
#define MC_SECRET_DEFAULT_NAME "cluster.secret"

/*
 * Create a secret file at path: 32 random bytes as 64 hex digits and a
 * newline, mode 0600, written to a temporary file in the same directory,
 * synced, and moved into place only if path does not exist — an existing
 * file is never overwritten, and a reader never sees a partial one.
 * Errors: -EEXIST (path exists: nothing changed), negative errno.
 */
int mc_secret_create(const char *path) MC_MUST_CHECK;

struct cfg;

struct mc_secret {
	uint8_t key[MC_SECRET_MAX_BYTES];
	size_t len;      /* 0: --insecure-transfer, no authentication */
	char path[4096]; /* the file it came from */
	bool created;    /* mc_secret_find created it just now */
	bool loose;      /* readable by group or others */
};

/*
 * Find the transfer engine's secret as the comment at the top says, from
 * the keys cluster-secret-file, insecure-transfer and data-dir of c.
 * create: make <data-dir>/cluster.secret when it is missing (the agent;
 * tools never do, so that a file they would create cannot end up owned
 * by another user than the daemon's). public_listen: the caller listens
 * on an address other than loopback. On error err gets one line that
 * says what is needed. Errors: MC_ECONFIG (both keys set; public_listen
 * without a configured secret), -ENOENT (the file is missing), -EACCES
 * (it cannot be read), -EINVAL (empty), -EFBIG (too large), another
 * negative errno.
 */
int mc_secret_find(const struct cfg *c, bool create, bool public_listen, struct mc_secret *out,
		   char *err, size_t errlen) MC_MUST_CHECK;

/* Forget the key (memset). */
void mc_secret_clear(struct mc_secret *s);

/*
 * RPC tokens: what a gRPC client of a server that checks the cluster
 * secret (the master's API) sends in its "mooncake-auth" header, one per
 * connection: "v1.<wall ms>.<16-byte nonce hex>.<mac hex>", the mac
 * HMAC(secret, "mooncake-rpc-v1" 0 <wall ms> 0 <nonce>). The server takes
 * one within MC_RPC_TOKEN_WINDOW_MS of its own clock whose nonce it has
 * not seen in that time, so a token read off the wire opens no second
 * connection (and hosts' clocks must agree within the window).
 */
#define MC_RPC_NONCE_BYTES 16
#define MC_RPC_TOKEN_MAX 128
#define MC_RPC_TOKEN_WINDOW_MS (5 * 60 * 1000ull)

/* A fresh token at wall_ms (mc_wall_ms). Errors: of mc_random. */
int mc_rpc_token(const uint8_t *key, size_t klen, uint64_t wall_ms,
		 char out[MC_RPC_TOKEN_MAX]) MC_MUST_CHECK;
/* 0 and its nonce when tok is a token of key within the window of
 * wall_ms. Errors: -EINVAL (not a token), -EACCES (another key's),
 * -ETIME (outside the window). */
int mc_rpc_token_check(const uint8_t *key, size_t klen, const char *tok, uint64_t wall_ms,
		       uint8_t nonce[MC_RPC_NONCE_BYTES]) MC_MUST_CHECK;

/*
 * Bearer tokens: what the meta role's etcd Authenticate gives a client
 * that knows the secret (in place of etcd's "simple" token; the client
 * sends it in the "token" header of its later calls):
 * "b1.<expiry wall ms>.<16-byte nonce hex>.<mac hex>", the mac
 * HMAC(secret, "mooncake-bearer-v1" 0 <expiry> 0 <nonce>). Any holder of
 * the secret can check one, so it is good on every member until it
 * expires, on any connection, as etcd's are.
 */
int mc_bearer_token(const uint8_t *key, size_t klen, uint64_t expires_ms,
		    char out[MC_RPC_TOKEN_MAX]) MC_MUST_CHECK;
/* 0 when tok is a bearer token of key not expired at wall_ms. Errors:
 * -EINVAL (not a token), -EACCES (another key's), -ETIME (expired). */
int mc_bearer_check(const uint8_t *key, size_t klen, const char *tok,
		    uint64_t wall_ms) MC_MUST_CHECK;

#endif
