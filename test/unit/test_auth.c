/*
 * test_auth: SHA-256 (FIPS 180-4 examples), HMAC-SHA256 (RFC 4231 test
 * cases), the constant-time compare, random bytes, cluster secret files
 * (trailing newline, empty, too large, loose permissions; created once and
 * never replaced), where the transfer engine's secret is found and the
 * tokens callers of the master prove it with.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/auth.h"
#include "common/cfg.h"

static void hex(const uint8_t *d, size_t n, char *out)
{
	for (size_t i = 0; i < n; i++)
		sprintf(out + 2 * i, "%02x", d[i]);
}

static void check_sha(const void *data, size_t len, const char *want)
{
	uint8_t d[32];
	char h[65];
	mc_sha256(data, len, d);
	hex(d, 32, h);
	cr_assert_str_eq(h, want);
}

Test(sha256, fips_vectors)
{
	check_sha("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
	check_sha("abc", 3,
		  "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
	const char *m = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
	check_sha(m, strlen(m),
		  "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
	char *a = malloc(1000000);
	memset(a, 'a', 1000000);
	check_sha(a, 1000000,
		  "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
	free(a);
}

Test(sha256, incremental_equals_whole)
{
	uint8_t buf[1000], whole[32], inc[32];
	for (size_t i = 0; i < sizeof(buf); i++)
		buf[i] = (uint8_t)(i * 7 + 1);
	mc_sha256(buf, sizeof(buf), whole);
	for (size_t step = 1; step < 130; step += 13) {
		struct mc_sha256 s;
		mc_sha256_init(&s);
		for (size_t o = 0; o < sizeof(buf); o += step)
			mc_sha256_update(&s, buf + o,
					 o + step > sizeof(buf) ? sizeof(buf) - o : step);
		mc_sha256_final(&s, inc);
		cr_assert(memcmp(whole, inc, 32) == 0, "step %zu", step);
	}
}

static void check_hmac(const void *key, size_t klen, const void *msg, size_t mlen,
		       const char *want)
{
	uint8_t d[32];
	char h[65];
	const void *parts[1] = {msg};
	size_t lens[1] = {mlen};
	mc_hmac_sha256(key, klen, parts, lens, 1, d);
	hex(d, 32, h);
	cr_assert_str_eq(h, want);
}

Test(hmac, rfc4231)
{
	uint8_t k1[20], k3[20], d3[50], k6[131];
	memset(k1, 0x0b, sizeof(k1));
	check_hmac(k1, 20, "Hi There", 8,
		   "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
	check_hmac("Jefe", 4, "what do ya want for nothing?", 28,
		   "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
	memset(k3, 0xaa, sizeof(k3));
	memset(d3, 0xdd, sizeof(d3));
	check_hmac(k3, 20, d3, 50,
		   "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
	memset(k6, 0xaa, sizeof(k6)); /* a key longer than the block */
	const char *m6 = "Test Using Larger Than Block-Size Key - Hash Key First";
	check_hmac(k6, 131, m6, strlen(m6),
		   "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

Test(hmac, parts_concatenate)
{
	uint8_t a[32], b[32];
	const void *p1[1] = {"hello world"};
	size_t l1[1] = {11};
	const void *p3[3] = {"hel", "lo w", "orld"};
	size_t l3[3] = {3, 4, 4};
	mc_hmac_sha256("k", 1, p1, l1, 1, a);
	mc_hmac_sha256("k", 1, p3, l3, 3, b);
	cr_assert(memcmp(a, b, 32) == 0);
	mc_hmac_sha256("K", 1, p3, l3, 3, b);
	cr_assert(memcmp(a, b, 32) != 0);
}

Test(auth, ct_equal_and_random)
{
	uint8_t a[32] = {0}, b[32] = {0};
	cr_assert(mc_ct_equal(a, b, 32));
	b[31] = 1;
	cr_assert_not(mc_ct_equal(a, b, 32));
	cr_assert(mc_ct_equal(a, b, 0));
	cr_assert_eq(mc_random(a, sizeof(a)), 0);
	cr_assert_eq(mc_random(b, sizeof(b)), 0);
	cr_assert_not(mc_ct_equal(a, b, 32)); /* 2^-256 */
}

static char *write_tmp(const void *data, size_t len, mode_t mode)
{
	static char path[64];
	snprintf(path, sizeof(path), "/tmp/test_auth_XXXXXX");
	int fd = mkstemp(path);
	cr_assert(fd >= 0);
	cr_assert_eq(write(fd, data, len), (ssize_t)len);
	fchmod(fd, mode);
	close(fd);
	return path;
}

Test(secret, load)
{
	uint8_t buf[MC_SECRET_MAX_BYTES];
	size_t len;
	bool loose;
	char *p = write_tmp("s3cret \n\n", 9, 0600);
	cr_assert_eq(mc_secret_load(p, buf, &len, &loose), 0);
	cr_assert_eq(len, 6);
	cr_assert(memcmp(buf, "s3cret", 6) == 0);
	cr_assert_not(loose);
	unlink(p);

	p = write_tmp("x", 1, 0644);
	cr_assert_eq(mc_secret_load(p, buf, &len, &loose), 0);
	cr_assert(loose);
	unlink(p);

	p = write_tmp("\n", 1, 0600);
	cr_assert_eq(mc_secret_load(p, buf, &len, &loose), -EINVAL);
	unlink(p);

	char *big = malloc(MC_SECRET_MAX_BYTES + 1);
	memset(big, 'z', MC_SECRET_MAX_BYTES + 1);
	p = write_tmp(big, MC_SECRET_MAX_BYTES + 1, 0600);
	cr_assert_eq(mc_secret_load(p, buf, &len, &loose), -EFBIG);
	unlink(p);
	p = write_tmp(big, MC_SECRET_MAX_BYTES, 0600);
	cr_assert_eq(mc_secret_load(p, buf, &len, &loose), 0);
	cr_assert_eq(len, MC_SECRET_MAX_BYTES);
	unlink(p);
	free(big);

	cr_assert_eq(mc_secret_load("/nonexistent/secret", buf, &len, &loose), -ENOENT);
}

Test(secret, create_never_replaces)
{
	char dir[] = "/tmp/test-auth-XXXXXX", path[300], again[300];
	cr_assert_not_null(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/cluster.secret", dir);
	cr_assert_eq(mc_secret_create(path), 0);
	struct stat st;
	cr_assert_eq(stat(path, &st), 0);
	cr_assert_eq(st.st_mode & 0777, 0600);
	cr_assert_eq(st.st_size, 65, "64 hex digits and a newline");
	uint8_t a[MC_SECRET_MAX_BYTES], b[MC_SECRET_MAX_BYTES];
	size_t alen, blen;
	bool loose;
	cr_assert_eq(mc_secret_load(path, a, &alen, &loose), 0);
	cr_assert_eq(alen, 64);
	for (size_t i = 0; i < alen; i++)
		cr_assert(strchr("0123456789abcdef", a[i]));
	cr_assert_eq(mc_secret_create(path), -EEXIST);
	cr_assert_eq(mc_secret_load(path, b, &blen, &loose), 0);
	cr_assert(blen == alen && memcmp(a, b, alen) == 0, "left as it was");
	snprintf(again, sizeof(again), "%s/other", dir);
	cr_assert_eq(mc_secret_create(again), 0);
	cr_assert_eq(mc_secret_load(again, b, &blen, &loose), 0);
	cr_assert(memcmp(a, b, alen) != 0, "random each time");
	/* Nothing but the two files is left behind. */
	char cmd[400];
	snprintf(cmd, sizeof(cmd), "test $(ls -A %s | wc -l) -eq 2", dir);
	cr_assert_eq(system(cmd), 0);
	unlink(path);
	unlink(again);
	cr_assert_eq(mc_secret_create("/nonexistent/dir/s"), -ENOENT);
	rmdir(dir);
}

static int find(const char *argv1, const char *argv2, const char *argv3, bool create,
		bool public_listen, struct mc_secret *s, char *err)
{
	char *argv[5] = {"mooncaked", "--config=", (char *)argv1, (char *)argv2,
			 (char *)argv3};
	int argc = 2 + (argv1 != NULL) + (argv2 != NULL) + (argv3 != NULL);
	char *envp[] = {NULL};
	struct cfg c;
	struct cfg_cmdline cl;
	cr_assert_eq(cfg_load(&c, argc, argv, envp, &cl, err, 1024), 0, "%s", err);
	int rc = mc_secret_find(&c, create, public_listen, s, err, 1024);
	cfg_free(&c);
	return rc;
}

Test(secret, find)
{
	char dir[] = "/tmp/test-auth-XXXXXX", dd[300], file[300], err[1024];
	static struct mc_secret s;
	cr_assert_not_null(mkdtemp(dir));
	snprintf(dd, sizeof(dd), "--data-dir=%s", dir);
	/* A tool finds nothing and says what it needs. */
	cr_assert_eq(find(dd, NULL, NULL, false, false, &s, err), -ENOENT);
	cr_assert(strstr(err, "--cluster-secret-file"), "%s", err);
	/* The agent makes it once; then everyone finds the same. */
	cr_assert_eq(find(dd, NULL, NULL, true, false, &s, err), 0, "%s", err);
	cr_assert(s.created && s.len == 64);
	uint8_t first[64];
	memcpy(first, s.key, 64);
	cr_assert_eq(find(dd, NULL, NULL, true, false, &s, err), 0);
	cr_assert(!s.created && memcmp(first, s.key, 64) == 0);
	cr_assert_eq(find(dd, NULL, NULL, false, false, &s, err), 0);
	cr_assert(memcmp(first, s.key, 64) == 0);
	/* Listening beyond loopback wants a configured one. */
	cr_assert_eq(find(dd, NULL, NULL, true, true, &s, err), MC_ECONFIG);
	cr_assert(strstr(err, "--insecure-transfer"), "%s", err);
	snprintf(file, sizeof(file), "--cluster-secret-file=%s/cluster.secret", dir);
	cr_assert_eq(find(dd, file, NULL, false, true, &s, err), 0, "%s", err);
	cr_assert(!s.created && memcmp(first, s.key, 64) == 0);
	/* --insecure-transfer: none, and not with a file. */
	cr_assert_eq(find(dd, "--insecure-transfer", NULL, true, true, &s, err), 0);
	cr_assert_eq(s.len, 0);
	cr_assert_eq(find(dd, "--insecure-transfer", file, false, false, &s, err), MC_ECONFIG);
	cr_assert(strstr(err, "contradict"), "%s", err);
	/* A configured file that is missing is never made. */
	snprintf(file, sizeof(file), "--cluster-secret-file=%s/missing", dir);
	cr_assert_eq(find(dd, file, NULL, true, false, &s, err), -ENOENT);
	cr_assert(strstr(err, "mooncakectl secret create"), "%s", err);
	mc_secret_clear(&s);
	char p[400];
	snprintf(p, sizeof(p), "%s/cluster.secret", dir);
	unlink(p);
	rmdir(dir);
}

Test(rpc_token, made_and_checked)
{
	const uint8_t key[] = "the cluster secret", other[] = "another secret";
	char tok[MC_RPC_TOKEN_MAX], tok2[MC_RPC_TOKEN_MAX];
	uint8_t nonce[MC_RPC_NONCE_BYTES], nonce2[MC_RPC_NONCE_BYTES];
	uint64_t now = 1796600000000ull;
	cr_assert_eq(mc_rpc_token(key, sizeof(key), now, tok), 0);
	cr_assert_eq(strncmp(tok, "v1.1796600000000.", 17), 0, "%s", tok);
	cr_assert_eq(strlen(tok), 17 + 32 + 1 + 64);
	cr_assert_eq(mc_rpc_token_check(key, sizeof(key), tok, now, nonce), 0);
	cr_assert_eq(
		mc_rpc_token_check(key, sizeof(key), tok, now + MC_RPC_TOKEN_WINDOW_MS, nonce),
		0, "at the window's end");
	cr_assert_eq(
		mc_rpc_token_check(key, sizeof(key), tok, now - MC_RPC_TOKEN_WINDOW_MS, nonce),
		0, "a clock behind by the window");
	cr_assert_eq(mc_rpc_token_check(key, sizeof(key), tok,
					now + MC_RPC_TOKEN_WINDOW_MS + 1, nonce),
		     -ETIME);
	cr_assert_eq(mc_rpc_token_check(other, sizeof(other), tok, now, nonce), -EACCES);
	/* Each token has a nonce of its own. */
	cr_assert_eq(mc_rpc_token(key, sizeof(key), now, tok2), 0);
	cr_assert_eq(mc_rpc_token_check(key, sizeof(key), tok2, now, nonce2), 0);
	cr_assert_neq(memcmp(nonce, nonce2, sizeof(nonce)), 0);
	/* Any changed character fails: the time, the nonce, the mac. */
	for (size_t i = 3; i < strlen(tok); i++) {
		if (tok[i] == '.')
			continue;
		char bad[MC_RPC_TOKEN_MAX];
		strcpy(bad, tok);
		bad[i] = bad[i] == '1' ? '2' : '1';
		int rc = mc_rpc_token_check(key, sizeof(key), bad, now, nonce);
		cr_assert(rc == -EACCES || rc == -EINVAL, "position %zu: %d", i, rc);
	}
	/* Not tokens. */
	const char *junk[] = {"",
			      "v1.",
			      "v2.1.aa.bb",
			      "v1.12x.00.00",
			      "v1..a.b",
			      tok + 1,
			      "v1.1.0123456789abcdef0123456789abcdef.00"};
	for (size_t i = 0; i < sizeof(junk) / sizeof(junk[0]); i++)
		cr_assert_eq(mc_rpc_token_check(key, sizeof(key), junk[i], now, nonce),
			     -EINVAL, "%s", junk[i]);
	char upper[MC_RPC_TOKEN_MAX];
	strcpy(upper, tok);
	for (char *p = upper + 17; *p; p++)
		if (*p >= 'a' && *p <= 'f')
			*p = (char)(*p - 'a' + 'A');
	cr_assert_eq(mc_rpc_token_check(key, sizeof(key), upper, now, nonce), -EINVAL,
		     "lowercase hex only");
}

Test(bearer_token, made_checked_and_kept_apart)
{
	const uint8_t key[] = "the cluster secret", other[] = "another secret";
	char tok[MC_RPC_TOKEN_MAX], rpc[MC_RPC_TOKEN_MAX];
	uint8_t nonce[MC_RPC_NONCE_BYTES];
	uint64_t until = 1796600300000ull;
	cr_assert_eq(mc_bearer_token(key, sizeof(key), until, tok), 0);
	cr_assert_eq(strncmp(tok, "b1.1796600300000.", 17), 0, "%s", tok);
	cr_assert_eq(mc_bearer_check(key, sizeof(key), tok, until - 300000), 0);
	cr_assert_eq(mc_bearer_check(key, sizeof(key), tok, until - 1), 0);
	cr_assert_eq(mc_bearer_check(key, sizeof(key), tok, until), -ETIME, "expired");
	cr_assert_eq(mc_bearer_check(other, sizeof(other), tok, until - 1), -EACCES);
	/* A changed expiry, nonce or mac fails. */
	for (size_t i = 3; i < strlen(tok); i++) {
		if (tok[i] == '.')
			continue;
		char bad[MC_RPC_TOKEN_MAX];
		strcpy(bad, tok);
		bad[i] = bad[i] == '9' ? '8' : '9';
		int rc = mc_bearer_check(key, sizeof(key), bad, 0);
		cr_assert(rc == -EACCES || rc == -EINVAL, "position %zu: %d", i, rc);
	}
	/* Neither kind passes for the other, even with the tag changed. */
	cr_assert_eq(mc_rpc_token_check(key, sizeof(key), tok, until, nonce), -EINVAL);
	cr_assert_eq(mc_rpc_token(key, sizeof(key), until, rpc), 0);
	cr_assert_eq(mc_bearer_check(key, sizeof(key), rpc, until - 1), -EINVAL);
	rpc[0] = 'b';
	cr_assert_eq(mc_bearer_check(key, sizeof(key), rpc, until - 1), -EACCES);
	tok[0] = 'v';
	cr_assert_eq(mc_rpc_token_check(key, sizeof(key), tok, until, nonce), -EACCES);
	cr_assert_eq(mc_bearer_check(key, sizeof(key), "", 0), -EINVAL);
	cr_assert_eq(mc_bearer_check(key, sizeof(key), NULL, 0), -EINVAL);
}
