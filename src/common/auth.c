/*
 * auth: SHA-256 (FIPS 180-4), HMAC-SHA256 (RFC 2104), secret files and
 * where the transfer engine's secret comes from. See auth.h.
 */
#include "common/auth.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/cfg.h"
#include "common/endian.h"
#include "common/io.h"
#include "common/util.h"

static const uint32_t K[64] = {
	0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
	0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
	0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
	0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
	0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
	0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
	0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
	0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
	0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
	0xc67178f2,
};

static uint32_t ror(uint32_t x, unsigned n)
{
	return (x >> n) | (x << (32 - n));
}

static void compress(uint32_t h[8], const uint8_t b[64])
{
	uint32_t w[64];
	for (int i = 0; i < 16; i++)
		w[i] = mc_get_be32(b + 4 * i);
	for (int i = 16; i < 64; i++) {
		uint32_t s0 = ror(w[i - 15], 7) ^ ror(w[i - 15], 18) ^ (w[i - 15] >> 3);
		uint32_t s1 = ror(w[i - 2], 17) ^ ror(w[i - 2], 19) ^ (w[i - 2] >> 10);
		w[i] = w[i - 16] + s0 + w[i - 7] + s1;
	}
	uint32_t a = h[0], bb = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6],
		 hh = h[7];
	for (int i = 0; i < 64; i++) {
		uint32_t t1 = hh + (ror(e, 6) ^ ror(e, 11) ^ ror(e, 25)) +
			      ((e & f) ^ (~e & g)) + K[i] + w[i];
		uint32_t t2 = (ror(a, 2) ^ ror(a, 13) ^ ror(a, 22)) +
			      ((a & bb) ^ (a & c) ^ (bb & c));
		hh = g;
		g = f;
		f = e;
		e = d + t1;
		d = c;
		c = bb;
		bb = a;
		a = t1 + t2;
	}
	h[0] += a;
	h[1] += bb;
	h[2] += c;
	h[3] += d;
	h[4] += e;
	h[5] += f;
	h[6] += g;
	h[7] += hh;
}

void mc_sha256_init(struct mc_sha256 *s)
{
	static const uint32_t iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
				       0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
	memcpy(s->h, iv, sizeof(iv));
	s->total = 0;
	s->used = 0;
}

void mc_sha256_update(struct mc_sha256 *s, const void *data, size_t len)
{
	const uint8_t *p = data;
	s->total += len;
	if (s->used) {
		size_t n = 64 - s->used < len ? 64 - s->used : len;
		memcpy(s->block + s->used, p, n);
		s->used += n;
		p += n;
		len -= n;
		if (s->used < 64)
			return;
		compress(s->h, s->block);
		s->used = 0;
	}
	for (; len >= 64; p += 64, len -= 64)
		compress(s->h, p);
	memcpy(s->block, p, len);
	s->used = len;
}

void mc_sha256_final(struct mc_sha256 *s, uint8_t out[MC_SHA256_BYTES])
{
	uint64_t bits = s->total * 8;
	s->block[s->used++] = 0x80;
	if (s->used > 56) {
		memset(s->block + s->used, 0, 64 - s->used);
		compress(s->h, s->block);
		s->used = 0;
	}
	memset(s->block + s->used, 0, 56 - s->used);
	for (int i = 0; i < 8; i++)
		s->block[56 + i] = (uint8_t)(bits >> (56 - 8 * i));
	compress(s->h, s->block);
	for (int i = 0; i < 8; i++)
		mc_put_be32(out + 4 * i, s->h[i]);
	memset(s, 0, sizeof(*s));
}

void mc_sha256(const void *data, size_t len, uint8_t out[MC_SHA256_BYTES])
{
	struct mc_sha256 s;
	mc_sha256_init(&s);
	mc_sha256_update(&s, data, len);
	mc_sha256_final(&s, out);
}

void mc_hmac_sha256(const void *key, size_t klen, const void *const *parts, const size_t *lens,
		    size_t n, uint8_t out[MC_SHA256_BYTES])
{
	uint8_t k[64] = {0}, pad[64], inner[MC_SHA256_BYTES];
	struct mc_sha256 s;
	if (klen > 64)
		mc_sha256(key, klen, k);
	else if (klen)
		memcpy(k, key, klen);
	for (int i = 0; i < 64; i++)
		pad[i] = k[i] ^ 0x36;
	mc_sha256_init(&s);
	mc_sha256_update(&s, pad, 64);
	for (size_t i = 0; i < n; i++)
		mc_sha256_update(&s, parts[i], lens[i]);
	mc_sha256_final(&s, inner);
	for (int i = 0; i < 64; i++)
		pad[i] = k[i] ^ 0x5c;
	mc_sha256_init(&s);
	mc_sha256_update(&s, pad, 64);
	mc_sha256_update(&s, inner, sizeof(inner));
	mc_sha256_final(&s, out);
	memset(k, 0, sizeof(k));
	memset(pad, 0, sizeof(pad));
}

bool mc_ct_equal(const void *a, const void *b, size_t len)
{
	const volatile uint8_t *x = a, *y = b;
	uint8_t d = 0;
	for (size_t i = 0; i < len; i++)
		d |= x[i] ^ y[i];
	return d == 0;
}

int mc_random(void *buf, size_t len)
{
	uint8_t *p = buf;
	while (len > 0) {
		ssize_t n = getrandom(p, len, 0);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

int mc_secret_load(const char *path, uint8_t *buf, size_t *len_out, bool *world_readable)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	struct stat st;
	int rc = 0;
	size_t len = 0;
	if (fstat(fd, &st) != 0) {
		rc = -errno;
		goto out;
	}
	*world_readable = (st.st_mode & (S_IRWXG | S_IRWXO)) != 0;
	for (;;) {
		uint8_t tmp[512];
		ssize_t n = read(fd, tmp, sizeof(tmp));
		if (n < 0) {
			if (errno == EINTR)
				continue;
			rc = -errno;
			goto out;
		}
		if (n == 0)
			break;
		if (len + (size_t)n > MC_SECRET_MAX_BYTES) {
			rc = -EFBIG;
			goto out;
		}
		memcpy(buf + len, tmp, (size_t)n);
		len += (size_t)n;
	}
	while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r' ||
			   buf[len - 1] == ' ' || buf[len - 1] == '\t'))
		len--;
	if (len == 0)
		rc = -EINVAL;
	*len_out = len;
out:
	close(fd);
	return rc;
}

/* ------------------------------------------------------------ secret files */

/* Move tmp to path unless path exists. renameat2 does it in one step;
 * on a file system without RENAME_NOREPLACE a hard link does the same
 * (link never replaces), and tmp is removed by the caller. */
static int move_noreplace(const char *tmp, const char *path)
{
	if (renameat2(AT_FDCWD, tmp, AT_FDCWD, path, RENAME_NOREPLACE) == 0)
		return 0;
	if (errno != EINVAL && errno != ENOSYS)
		return -errno;
	return link(tmp, path) == 0 ? 0 : -errno;
}

/* raw as 2 * len lowercase hex digits at text (no terminator). */
static void to_hex(const uint8_t *raw, size_t len, char *text)
{
	static const char hex[] = "0123456789abcdef";
	for (size_t i = 0; i < len; i++) {
		text[2 * i] = hex[raw[i] >> 4];
		text[2 * i + 1] = hex[raw[i] & 15];
	}
}

/* 2 * len hex digits at text into raw; false if one is not a digit. */
static bool from_hex(const char *text, size_t len, uint8_t *raw)
{
	for (size_t i = 0; i < 2 * len; i++) {
		char ch = text[i];
		int v = ch >= '0' && ch <= '9'   ? ch - '0'
			: ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
						 : -1;
		if (v < 0)
			return false;
		raw[i / 2] = (uint8_t)(i % 2 ? raw[i / 2] | v : v << 4);
	}
	return true;
}

int mc_secret_create(const char *path)
{
	uint8_t raw[32];
	char text[2 * sizeof(raw) + 1], tmp[4096], dir[4096];
	int rc = mc_random(raw, sizeof(raw));
	if (rc)
		return rc;
	to_hex(raw, sizeof(raw), text);
	text[2 * sizeof(raw)] = '\n';
	memset(raw, 0, sizeof(raw));
	if ((size_t)snprintf(tmp, sizeof(tmp), "%s.tmp.XXXXXX", path) >= sizeof(tmp))
		return -ENAMETOOLONG;
	int fd = mkostemp(tmp, O_CLOEXEC); /* mode 0600 */
	if (fd < 0)
		return -errno;
	rc = fchmod(fd, 0600) == 0 ? 0 : -errno;
	if (rc == 0)
		rc = mc_write_all(fd, text, sizeof(text));
	if (rc == 0 && fsync(fd) != 0)
		rc = -errno;
	memset(text, 0, sizeof(text));
	close(fd);
	if (rc == 0)
		rc = move_noreplace(tmp, path);
	unlink(tmp);
	if (rc)
		return rc;
	snprintf(dir, sizeof(dir), "%s", path);
	char *slash = strrchr(dir, '/');
	if (slash == dir)
		slash[1] = '\0';
	else if (slash)
		*slash = '\0';
	else
		snprintf(dir, sizeof(dir), ".");
	return mc_fsync_dir(dir);
}

void mc_secret_clear(struct mc_secret *s)
{
	memset(s->key, 0, sizeof(s->key));
	s->len = 0;
}

static int load_into(struct mc_secret *out, const char *how, char *err, size_t errlen)
{
	int rc = mc_secret_load(out->path, out->key, &out->len, &out->loose);
	if (rc == 0)
		return 0;
	out->len = 0;
	switch (rc) {
	case -ENOENT:
		snprintf(err, errlen,
			 "%s %s does not exist: create one with `mooncakectl secret create "
			 "%s` and give every host the same file",
			 how, out->path, out->path);
		break;
	case -EACCES:
		snprintf(err, errlen,
			 "%s %s cannot be read by uid %d: run as the daemon's user, or "
			 "give a file this user can read with --cluster-secret-file",
			 how, out->path, (int)geteuid());
		break;
	case -EINVAL:
		snprintf(err, errlen, "%s %s is empty", how, out->path);
		break;
	case -EFBIG:
		snprintf(err, errlen, "%s %s is larger than %d bytes", how, out->path,
			 MC_SECRET_MAX_BYTES);
		break;
	default:
		snprintf(err, errlen, "%s %s: %s", how, out->path, mc_strerror(rc));
	}
	return rc;
}

int mc_secret_find(const struct cfg *c, bool create, bool public_listen, struct mc_secret *out,
		   char *err, size_t errlen)
{
	const char *file = cfg_str(c, CFG_CLUSTER_SECRET_FILE);
	memset(out, 0, sizeof(*out));
	if (cfg_bool(c, CFG_INSECURE_TRANSFER)) {
		if (*file) {
			snprintf(err, errlen,
				 "--insecure-transfer and --cluster-secret-file=%s contradict "
				 "each other: choose one",
				 file);
			return MC_ECONFIG;
		}
		return 0;
	}
	if (*file) {
		snprintf(out->path, sizeof(out->path), "%s", file);
		return load_into(out, "--cluster-secret-file", err, errlen);
	}
	if (public_listen) {
		snprintf(err, errlen,
			 "the transfer engine listens on an address other than loopback, and "
			 "no --cluster-secret-file is configured: give every host the same "
			 "secret file (`mooncakectl secret create FILE`), or set "
			 "--insecure-transfer to serve memory to anyone who reaches the port");
		return MC_ECONFIG;
	}
	if ((size_t)snprintf(out->path, sizeof(out->path), "%s/%s", cfg_str(c, CFG_DATA_DIR),
			     MC_SECRET_DEFAULT_NAME) >= sizeof(out->path)) {
		snprintf(err, errlen, "--data-dir is too long");
		return -ENAMETOOLONG;
	}
	if (create) {
		int rc = mc_secret_create(out->path);
		if (rc && rc != -EEXIST) {
			snprintf(err, errlen, "cannot create the cluster secret %s: %s",
				 out->path, mc_strerror(rc));
			return rc;
		}
		out->created = rc == 0;
	} else if (access(out->path, F_OK) != 0 && errno == ENOENT) {
		snprintf(err, errlen,
			 "no cluster secret: %s does not exist (the agent creates it at its "
			 "first start); give --cluster-secret-file=FILE or --data-dir of the "
			 "agent whose peers this process talks to",
			 out->path);
		return -ENOENT;
	}
	return load_into(out, "the cluster secret", err, errlen);
}

/* ------------------------------------------------------------ RPC tokens */

/* Both kinds of token: "<tag><ms>.<nonce hex>.<mac hex>", the mac
 * HMAC(key, label 0 <ms> 0 <nonce>); the label keeps one kind from
 * passing for the other. */
#define RPC_TAG "v1."
#define RPC_LABEL "mooncake-rpc-v1"
#define BEARER_TAG "b1."
#define BEARER_LABEL "mooncake-bearer-v1"

static void token_mac(const uint8_t *key, size_t klen, const char *label, const char *ts,
		      size_t tslen, const uint8_t nonce[MC_RPC_NONCE_BYTES],
		      uint8_t out[MC_SHA256_BYTES])
{
	static const uint8_t zero = 0;
	const void *parts[] = {label, &zero, ts, &zero, nonce};
	size_t lens[] = {strlen(label), 1, tslen, 1, MC_RPC_NONCE_BYTES};
	mc_hmac_sha256(key, klen, parts, lens, MC_ARRAY_LEN(parts), out);
}

static int token_make(const uint8_t *key, size_t klen, const char *tag, const char *label,
		      uint64_t ms, char out[MC_RPC_TOKEN_MAX])
{
	uint8_t nonce[MC_RPC_NONCE_BYTES], mac[MC_SHA256_BYTES];
	int rc = mc_random(nonce, sizeof(nonce));
	if (rc)
		return rc;
	char ts[24];
	int tslen = snprintf(ts, sizeof(ts), "%" PRIu64, ms);
	token_mac(key, klen, label, ts, (size_t)tslen, nonce, mac);
	int n = snprintf(out, MC_RPC_TOKEN_MAX, "%s%s.", tag, ts);
	to_hex(nonce, sizeof(nonce), out + n);
	n += 2 * (int)sizeof(nonce);
	out[n++] = '.';
	to_hex(mac, sizeof(mac), out + n);
	out[n + 2 * sizeof(mac)] = '\0';
	return 0;
}

/* 0 with its time and nonce when tok is a token of key of this kind.
 * Errors: -EINVAL (not one), -EACCES (another key's). */
static int token_parse(const uint8_t *key, size_t klen, const char *tag, const char *label,
		       const char *tok, uint64_t *ms, uint8_t nonce[MC_RPC_NONCE_BYTES])
{
	size_t taglen = strlen(tag);
	if (!tok || strncmp(tok, tag, taglen) != 0)
		return -EINVAL;
	const char *ts = tok + taglen, *dot = strchr(ts, '.');
	size_t tslen = dot ? (size_t)(dot - ts) : 0;
	if (tslen == 0 || tslen > 20 || strspn(ts, "0123456789") != tslen ||
	    strlen(dot + 1) != 2 * MC_RPC_NONCE_BYTES + 1 + 2 * MC_SHA256_BYTES ||
	    dot[1 + 2 * MC_RPC_NONCE_BYTES] != '.')
		return -EINVAL;
	uint8_t mac[MC_SHA256_BYTES], want[MC_SHA256_BYTES];
	if (!from_hex(dot + 1, MC_RPC_NONCE_BYTES, nonce) ||
	    !from_hex(dot + 2 + 2 * MC_RPC_NONCE_BYTES, sizeof(mac), mac))
		return -EINVAL;
	token_mac(key, klen, label, ts, tslen, nonce, want);
	if (!mc_ct_equal(mac, want, sizeof(mac)))
		return -EACCES;
	*ms = strtoull(ts, NULL, 10);
	return 0;
}

int mc_rpc_token(const uint8_t *key, size_t klen, uint64_t wall_ms, char out[MC_RPC_TOKEN_MAX])
{
	return token_make(key, klen, RPC_TAG, RPC_LABEL, wall_ms, out);
}

int mc_rpc_token_check(const uint8_t *key, size_t klen, const char *tok, uint64_t wall_ms,
		       uint8_t nonce[MC_RPC_NONCE_BYTES])
{
	uint64_t at;
	int rc = token_parse(key, klen, RPC_TAG, RPC_LABEL, tok, &at, nonce);
	if (rc)
		return rc;
	uint64_t skew = at > wall_ms ? at - wall_ms : wall_ms - at;
	return skew <= MC_RPC_TOKEN_WINDOW_MS ? 0 : -ETIME;
}

int mc_bearer_token(const uint8_t *key, size_t klen, uint64_t expires_ms,
		    char out[MC_RPC_TOKEN_MAX])
{
	return token_make(key, klen, BEARER_TAG, BEARER_LABEL, expires_ms, out);
}

int mc_bearer_check(const uint8_t *key, size_t klen, const char *tok, uint64_t wall_ms)
{
	uint64_t until;
	uint8_t nonce[MC_RPC_NONCE_BYTES];
	int rc = token_parse(key, klen, BEARER_TAG, BEARER_LABEL, tok, &until, nonce);
	if (rc)
		return rc;
	return wall_ms < until ? 0 : -ETIME;
}
