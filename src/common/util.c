/*
 * util: clocks, addresses, directories, locks. See util.h.
 */
#include "common/util.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/endian.h"
#include "common/io.h"

uint64_t mc_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t mc_now_ms(void)
{
	return mc_now_ns() / 1000000ull;
}

bool mc_once_per(uint64_t *last_ms, uint64_t period_ms)
{
	uint64_t now = mc_now_ms();
	if (*last_ms && now - *last_ms < period_ms)
		return false;
	*last_ms = now;
	return true;
}

uint64_t mc_wall_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000ull + (uint64_t)ts.tv_nsec / 1000000ull;
}

static int parse_port(const char *s, uint16_t *port)
{
	if (*s == '\0')
		return -EINVAL;
	unsigned long v = 0;
	for (const char *p = s; *p; p++) {
		if (*p < '0' || *p > '9')
			return -EINVAL;
		v = v * 10 + (unsigned long)(*p - '0');
		if (v > 65535)
			return -EINVAL;
	}
	*port = (uint16_t)v;
	return 0;
}

int mc_parse_hostport(const char *s, struct sockaddr_storage *out)
{
	char host[INET6_ADDRSTRLEN + 1];
	const char *port_s;
	size_t hlen;

	memset(out, 0, sizeof(*out));
	if (!s)
		return -EINVAL;
	if (s[0] == '[') {
		const char *end = strchr(s, ']');
		if (!end || end[1] != ':')
			return -EINVAL;
		hlen = (size_t)(end - s - 1);
		if (hlen == 0 || hlen >= sizeof(host))
			return -EINVAL;
		memcpy(host, s + 1, hlen);
		host[hlen] = '\0';
		port_s = end + 2;
		struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)out;
		a6->sin6_family = AF_INET6;
		if (inet_pton(AF_INET6, host, &a6->sin6_addr) != 1)
			return -EINVAL;
		uint16_t port;
		if (parse_port(port_s, &port))
			return -EINVAL;
		a6->sin6_port = htons(port);
		return 0;
	}
	const char *colon = strrchr(s, ':');
	if (!colon)
		return -EINVAL;
	hlen = (size_t)(colon - s);
	if (hlen >= sizeof(host))
		return -EINVAL;
	memcpy(host, s, hlen);
	host[hlen] = '\0';
	if (hlen == 0 || strcmp(host, "localhost") == 0)
		strcpy(host, "127.0.0.1");
	struct sockaddr_in *a4 = (struct sockaddr_in *)out;
	a4->sin_family = AF_INET;
	if (inet_pton(AF_INET, host, &a4->sin_addr) != 1)
		return -EINVAL;
	uint16_t port;
	if (parse_port(colon + 1, &port))
		return -EINVAL;
	a4->sin_port = htons(port);
	return 0;
}

bool mc_addr_is_loopback(const struct sockaddr *sa)
{
	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
		return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
	}
	if (sa->sa_family == AF_INET6) {
		const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
		if (IN6_IS_ADDR_LOOPBACK(a))
			return true;
		return IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127;
	}
	return false;
}

void mc_format_addr(const struct sockaddr *sa, char *buf, size_t len)
{
	char host[INET6_ADDRSTRLEN];
	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *a4 = (const struct sockaddr_in *)sa;
		inet_ntop(AF_INET, &a4->sin_addr, host, sizeof(host));
		snprintf(buf, len, "%s:%u", host, ntohs(a4->sin_port));
	} else if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *a6 = (const struct sockaddr_in6 *)sa;
		inet_ntop(AF_INET6, &a6->sin6_addr, host, sizeof(host));
		snprintf(buf, len, "[%s]:%u", host, ntohs(a6->sin6_port));
	} else {
		snprintf(buf, len, "(family %d)", sa->sa_family);
	}
}

int mc_mkdir_p(const char *path, unsigned mode)
{
	char buf[PATH_MAX];
	size_t n = strlen(path);
	if (n == 0 || n >= sizeof(buf))
		return -ENAMETOOLONG;
	memcpy(buf, path, n + 1);
	for (char *p = buf + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(buf, mode) != 0 && errno != EEXIST)
			return -errno;
		*p = '/';
	}
	if (mkdir(buf, mode) != 0 && errno != EEXIST)
		return -errno;
	struct stat st;
	if (stat(buf, &st) != 0)
		return -errno;
	if (!S_ISDIR(st.st_mode))
		return -ENOTDIR;
	return 0;
}

int mc_lock_dir(const char *dir, int *fd_out, int *holder_pid)
{
	char path[PATH_MAX];
	*holder_pid = 0;
	if (snprintf(path, sizeof(path), "%s/LOCK", dir) >= (int)sizeof(path))
		return -ENAMETOOLONG;
	int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	if (fd < 0)
		return -errno;
	if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
		int err = errno;
		if (err == EWOULDBLOCK) {
			char pidbuf[32] = {0};
			ssize_t r = pread(fd, pidbuf, sizeof(pidbuf) - 1, 0);
			if (r > 0)
				*holder_pid = atoi(pidbuf);
			close(fd);
			return MC_ELOCKED;
		}
		close(fd);
		return -err;
	}
	char pidbuf[32];
	int n = snprintf(pidbuf, sizeof(pidbuf), "%d\n", (int)getpid());
	int rc = ftruncate(fd, 0) != 0 ? -errno : mc_pwrite_all(fd, pidbuf, (size_t)n, 0);
	if (rc) {
		close(fd);
		return rc;
	}
	*fd_out = fd;
	return 0;
}

void mc_unlock_dir(int fd)
{
	if (fd >= 0)
		close(fd);
}

int mc_write_pidfile(const char *path)
{
	char tmp[PATH_MAX];
	if (snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= (int)sizeof(tmp))
		return -ENAMETOOLONG;
	FILE *f = fopen(tmp, "we");
	if (!f)
		return -errno;
	fprintf(f, "%d\n", (int)getpid());
	if (fclose(f) != 0)
		return -errno;
	if (rename(tmp, path) != 0) {
		int err = errno;
		unlink(tmp);
		return -err;
	}
	return 0;
}

int mc_fsync_dir(const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	int rc = fsync(fd) == 0 ? 0 : -errno;
	close(fd);
	return rc;
}

int mc_write_file_durably(const char *dir, const char *path, const void *data, size_t len)
{
	char tmp[PATH_MAX];
	if (snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= (int)sizeof(tmp))
		return -ENAMETOOLONG;
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
	if (fd < 0)
		return -errno;
	int rc = mc_write_all(fd, data, len);
	if (rc == 0 && fsync(fd))
		rc = -errno;
	if (close(fd) && rc == 0)
		rc = -errno;
	if (rc == 0 && rename(tmp, path))
		rc = -errno;
	if (rc)
		unlink(tmp);
	return rc ? rc : mc_fsync_dir(dir);
}

int mc_unlink_in_steps(const char *path, uint64_t step_bytes, unsigned pause_ms)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return -errno;
	struct stat st;
	int rc = fstat(fd, &st) == 0 ? 0 : -errno;
	uint64_t size = rc == 0 && S_ISREG(st.st_mode) ? (uint64_t)st.st_size : 0;
	if (step_bytes == 0)
		step_bytes = size;
	while (rc == 0 && size > 0) {
		size = size > step_bytes ? size - step_bytes : 0;
		if (ftruncate(fd, (off_t)size) != 0) {
			rc = -errno;
			break;
		}
		if (size == 0)
			break;
		struct timespec ts = {(time_t)(pause_ms / 1000),
				      (long)(pause_ms % 1000) * 1000000};
		while (nanosleep(&ts, &ts) && errno == EINTR)
			;
	}
	close(fd);
	if (rc == 0 && unlink(path) != 0)
		rc = -errno;
	return rc;
}

static bool has_suffix(const char *s, const char *suffix)
{
	size_t n = strlen(s), k = strlen(suffix);
	return n > k && memcmp(s + n - k, suffix, k) == 0;
}

int mc_unlink_suffixed(const char *dir, const char *suffix, uint64_t step_bytes,
		       unsigned pause_ms, unsigned *removed)
{
	unsigned n = 0;
	int rc = 0;
	if (removed)
		*removed = 0;
	DIR *d = opendir(dir);
	if (!d)
		return -errno;
	struct dirent *de;
	while ((de = readdir(d))) {
		char path[PATH_MAX];
		if (!has_suffix(de->d_name, suffix))
			continue;
		int r = snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
		if (r < 0 || (size_t)r >= sizeof(path))
			r = -ENAMETOOLONG;
		else
			r = mc_unlink_in_steps(path, step_bytes, pause_ms);
		if (r == 0)
			n++;
		else if (!rc && r != -ENOENT)
			rc = r;
	}
	closedir(d);
	if (n > 0) {
		int frc = mc_fsync_dir(dir);
		if (!rc)
			rc = frc;
	}
	if (removed)
		*removed = n;
	return rc;
}

/* The 128-bit product of a and b folded to 64 bits: wyhash's mixing step. */
static uint64_t mix64(uint64_t a, uint64_t b)
{
	unsigned __int128 r = (unsigned __int128)a * b;
	return (uint64_t)r ^ (uint64_t)(r >> 64);
}

/* The last len (< 8) bytes at p as a little-endian word, read in whole
 * loads (two overlapping ones from 4 bytes on). Not memcpy into a zeroed
 * word: gcc makes that byte stores and a word load, which cannot be
 * forwarded and waits for every older instruction to retire, cache
 * misses included, so that a batch's lookups, each hashing its key, no
 * longer overlap their misses (at 10M objects a lookup cost 4x more). */
static uint64_t tail_word(const unsigned char *p, size_t len)
{
	if (len >= 4)
		return (uint64_t)mc_get_le32(p) | (uint64_t)mc_get_le32(p + len - 4)
							  << (8 * (len - 4));
	if (len == 0)
		return 0;
	return (uint64_t)p[0] | (uint64_t)p[len / 2] << (8 * (len / 2)) |
	       (uint64_t)p[len - 1] << (8 * (len - 1));
}

int mc_bytes_cmp(const void *a, size_t alen, const void *b, size_t blen)
{
	size_t n = alen < blen ? alen : blen;
	int c = n ? memcmp(a, b, n) : 0;
	if (c)
		return c < 0 ? -1 : 1;
	return alen < blen ? -1 : alen > blen;
}

uint64_t mc_hash64(const void *data, size_t len)
{
	const unsigned char *p = data;
	uint64_t h = 0x9e3779b97f4a7c15ull ^ len;
	for (; len >= 8; p += 8, len -= 8)
		h = mix64(mc_get_le64(p) ^ 0xa0761d6478bd642full, h ^ 0xe7037ed1a0b428dbull);
	return mix64(tail_word(p, len) ^ 0x8ebc6af09c88c6e3ull, h ^ 0x589965cc75374cc3ull);
}

uint64_t mc_rss_bytes(void)
{
	FILE *f = fopen("/proc/self/statm", "re");
	unsigned long size = 0, rss = 0;
	if (!f)
		return 0;
	if (fscanf(f, "%lu %lu", &size, &rss) != 2)
		rss = 0;
	fclose(f);
	return (uint64_t)rss * (uint64_t)sysconf(_SC_PAGESIZE);
}

void *mc_zalloc(size_t n, size_t size)
{
	if (size && n > SIZE_MAX / size)
		return NULL;
	size_t bytes = n * size;
	void *p = malloc(bytes ? bytes : 1);
	if (p)
		memset(p, 0, bytes);
	return p;
}
