/*
 * test_util: deleting files a step at a time (mc_unlink_in_steps and
 * mc_unlink_suffixed): the file goes whatever its size and the step, only
 * the names with the suffix go, and a missing file or directory gives the
 * documented errors; mc_hash64 the same as before it read its last bytes
 * in whole loads.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/util.h"

static char *tmpdir(void)
{
	const char *base = getenv("TMPDIR");
	char *p;
	cr_assert(asprintf(&p, "%s/mcutil.XXXXXX", base ? base : "/tmp") > 0);
	cr_assert_not_null(mkdtemp(p));
	return p;
}

static void make_file(const char *dir, const char *name, size_t len)
{
	char path[PATH_MAX];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	cr_assert_geq(fd, 0);
	char buf[4096];
	memset(buf, 'x', sizeof(buf));
	for (size_t off = 0; off < len; off += sizeof(buf)) {
		size_t n = len - off < sizeof(buf) ? len - off : sizeof(buf);
		cr_assert_eq(write(fd, buf, n), (ssize_t)n);
	}
	close(fd);
}

static bool exists(const char *dir, const char *name)
{
	char path[PATH_MAX];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	return access(path, F_OK) == 0;
}

Test(util, unlink_in_steps_any_size_and_step)
{
	char *dir = tmpdir();
	static const size_t sizes[] = {0, 1, 4096, 100000, 1 << 20};
	static const uint64_t steps[] = {0, 1000, 4096, 1 << 20, 8 << 20};
	for (size_t i = 0; i < sizeof(sizes) / sizeof(*sizes); i++) {
		for (size_t j = 0; j < sizeof(steps) / sizeof(*steps); j++) {
			if (sizes[i] / (steps[j] ? steps[j] : 1) > 200)
				continue; /* enough fsyncs */
			make_file(dir, "f", sizes[i]);
			char path[PATH_MAX];
			snprintf(path, sizeof(path), "%s/f", dir);
			cr_assert_eq(mc_unlink_in_steps(path, steps[j], 1), 0,
				     "size %zu step %zu", sizes[i], (size_t)steps[j]);
			cr_assert_not(exists(dir, "f"));
		}
	}
	char path[PATH_MAX];
	snprintf(path, sizeof(path), "%s/none", dir);
	cr_assert_eq(mc_unlink_in_steps(path, 4096, 1), -ENOENT);
	cr_assert_eq(rmdir(dir), 0);
	free(dir);
}

Test(util, unlink_suffixed_only_those)
{
	char *dir = tmpdir();
	make_file(dir, "a.wal.del", 300000);
	make_file(dir, "b.snap.del", 10);
	make_file(dir, "c.wal", 1000);
	make_file(dir, ".del", 10); /* the suffix alone is not a name with it */
	make_file(dir, "d.delx", 10);
	unsigned n = 99;
	cr_assert_eq(mc_unlink_suffixed(dir, ".del", 65536, 1, &n), 0);
	cr_assert_eq(n, 2);
	cr_assert_not(exists(dir, "a.wal.del"));
	cr_assert_not(exists(dir, "b.snap.del"));
	cr_assert(exists(dir, "c.wal"));
	cr_assert(exists(dir, ".del"));
	cr_assert(exists(dir, "d.delx"));
	cr_assert_eq(mc_unlink_suffixed(dir, ".del", 65536, 1, &n), 0);
	cr_assert_eq(n, 0);
	char sub[PATH_MAX];
	snprintf(sub, sizeof(sub), "%s/missing", dir);
	cr_assert_eq(mc_unlink_suffixed(sub, ".del", 65536, 1, NULL), -ENOENT);
	char cmd[PATH_MAX + 16];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	cr_assert_eq(system(cmd), 0);
	free(dir);
}

/* mc_hash64 reads its last bytes in whole loads: on a little-endian host
 * it gives what a copy of them into a zeroed word gave, every length. */
static uint64_t hash_mix(uint64_t a, uint64_t b)
{
	unsigned __int128 r = (unsigned __int128)a * b;
	return (uint64_t)r ^ (uint64_t)(r >> 64);
}

Test(util, hash64_as_before_and_every_byte_counts)
{
	unsigned char buf[64];
	for (size_t i = 0; i < sizeof(buf); i++)
		buf[i] = (unsigned char)(i * 37 + 11);
	for (size_t off = 0; off < 8; off++)
		for (size_t len = 0; len + off <= 48; len++) {
			const unsigned char *p = buf + off;
			size_t n = len;
			uint64_t h = 0x9e3779b97f4a7c15ull ^ len, w;
			for (; n >= 8; p += 8, n -= 8) {
				memcpy(&w, p, 8);
				h = hash_mix(w ^ 0xa0761d6478bd642full,
					     h ^ 0xe7037ed1a0b428dbull);
			}
			w = 0;
			memcpy(&w, p, n);
			h = hash_mix(w ^ 0x8ebc6af09c88c6e3ull, h ^ 0x589965cc75374cc3ull);
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
			cr_assert_eq(mc_hash64(buf + off, len), h, "len %zu", len);
#endif
			/* A byte changed anywhere changes the hash. */
			for (size_t i = 0; i < len; i++) {
				uint64_t before = mc_hash64(buf + off, len);
				buf[off + i] ^= 0x40;
				cr_assert_neq(mc_hash64(buf + off, len), before,
					      "len %zu byte %zu", len, i);
				buf[off + i] ^= 0x40;
			}
		}
}
