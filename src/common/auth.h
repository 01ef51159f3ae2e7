/*
 * auth: the cluster secret and what daemons prove with it — SHA-256,
 * HMAC-SHA256 (RFC 2104), a constant-time compare, and loading the secret
 * from --cluster-secret-file.
 *
 * A peer proves it knows the secret by answering a fresh random challenge
 * with HMAC(secret, label || challenge || ...); the secret itself never
 * crosses the wire. Pure and thread-safe except mc_secret_load (reads a
 * file) and mc_random (reads the kernel's random source).
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
	uint64_t total;      /* bytes hashed so far */
	uint8_t block[64];
	size_t used;         /* bytes in block */
};

void mc_sha256_init(struct mc_sha256 *s);
void mc_sha256_update(struct mc_sha256 *s, const void *data, size_t len);
void mc_sha256_final(struct mc_sha256 *s, uint8_t out[MC_SHA256_BYTES]);
void mc_sha256(const void *data, size_t len, uint8_t out[MC_SHA256_BYTES]);

/* HMAC-SHA256 over the concatenation of n parts (parts[i], lens[i]). */
void mc_hmac_sha256(const void *key, size_t klen, const void *const *parts,
		    const size_t *lens, size_t n, uint8_t out[MC_SHA256_BYTES]);

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

#endif
