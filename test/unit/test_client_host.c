/*
 * mc_host_alloc without an agent: the memory is usable at once, 2 MiB
 * aligned, a sealed memfd's shared mapping (what the agent is handed on a
 * session's first use), sized as asked; mc_host_size names allocations by
 * their start only; mc_host_free ignores what it did not hand out.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "client/mooncake.h"

/* The line of /proc/self/maps that holds p, or "" (into line). */
static void maps_line(const void *p, char *line, size_t cap)
{
	FILE *f = fopen("/proc/self/maps", "r");
	cr_assert_not_null(f);
	line[0] = 0;
	char buf[512];
	while (fgets(buf, sizeof(buf), f)) {
		unsigned long lo, hi;
		if (sscanf(buf, "%lx-%lx", &lo, &hi) == 2 && (uintptr_t)p >= lo &&
		    (uintptr_t)p < hi) {
			snprintf(line, cap, "%s", buf);
			break;
		}
	}
	fclose(f);
}

Test(client_host, alloc_size_free)
{
	size_t len = (3u << 20) + 5;
	uint8_t *p = mc_host_alloc(len);
	cr_assert_not_null(p, "mc_host_alloc: %s", strerror(errno));
	cr_assert_eq((uintptr_t)p % (2u << 20), 0, "2 MiB aligned");
	memset(p, 0xa5, len);
	cr_assert_eq(p[len - 1], 0xa5);
	cr_assert_eq(mc_host_size(p), len);
	cr_assert_eq(mc_host_size(p + 1), 0, "only the start names an allocation");
	char line[512];
	maps_line(p, line, sizeof(line));
	cr_assert(strstr(line, "mooncake-host") && strstr(line, "rw-s"),
		  "a shared mapping of the memfd: %s", line);
	uint8_t *q = mc_host_alloc(4096);
	cr_assert_not_null(q);
	cr_assert(q + 4096 <= p || p + len <= q, "distinct");
	mc_host_free(p + 1); /* not an allocation's start: ignored */
	mc_host_free(NULL);
	cr_assert_eq(mc_host_size(p), len, "still there");
	mc_host_free(p);
	cr_assert_eq(mc_host_size(p), 0);
	maps_line(p, line, sizeof(line));
	cr_assert(!strstr(line, "mooncake-host"), "unmapped: %s", line);
	mc_host_free(p); /* twice: ignored */
	mc_host_free(q);
}

Test(client_host, refusals)
{
	errno = 0;
	cr_assert_null(mc_host_alloc(0));
	cr_assert_eq(errno, EINVAL);
	cr_assert_null(mc_host_alloc(SIZE_MAX));
	cr_assert_eq(errno, EINVAL);
	cr_assert_eq(mc_host_size(NULL), 0);
}
