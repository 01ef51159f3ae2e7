/*
 * Mirror test of src/common/sysmem.c: the procfs parsers and the rule of
 * whether a segment fits (the agent refuses what it says does not, and
 * mooncakectl doctor reports the same verdict).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/sysmem.h"

static const char *meminfo_24g = "MemTotal:       24683784 kB\n"
				 "MemFree:         1234567 kB\n"
				 "MemAvailable:   23000000 kB\n"
				 "HugePages_Total:       0\n"
				 "HugePages_Free:        0\n"
				 "Hugepagesize:       2048 kB\n";

Test(sysmem, meminfo)
{
	struct mc_meminfo m;
	cr_assert_eq(mc_meminfo_parse(meminfo_24g, &m), 0);
	cr_assert_eq(m.total_bytes, 24683784ull * 1024);
	cr_assert_eq(m.available_bytes, 23000000ull * 1024);
	cr_assert_eq(m.huge_page_bytes, 2u << 20);
	cr_assert_eq(mc_meminfo_parse("MemTotal: 100 kB\nMemFree: 50 kB\n", &m), 0);
	cr_assert_eq(m.available_bytes, 50 * 1024, "MemFree when MemAvailable is absent");
	cr_assert_eq(mc_meminfo_parse("nothing\n", &m), -EINVAL);
}

Test(sysmem, limits_and_caps)
{
	const char *limits =
		"Limit                     Soft Limit           Hard Limit           Units     \n"
		"Max open files            1024                 1048576              files     \n"
		"Max locked memory         65536                65536                bytes     \n";
	uint64_t soft, hard;
	cr_assert_eq(mc_limits_memlock_parse(limits, &soft, &hard), 0);
	cr_assert_eq(soft, 65536);
	cr_assert_eq(hard, 65536);
	cr_assert_eq(mc_limits_memlock_parse(
			     "Max locked memory  unlimited  unlimited  bytes\n", &soft, &hard),
		     0);
	cr_assert_eq(soft, MC_UNLIMITED);
	cr_assert_eq(mc_limits_memlock_parse("Max open files 1 1 files\n", &soft, &hard),
		     -EINVAL);
	bool has;
	cr_assert_eq(mc_status_ipc_lock_parse("Name:\tx\nCapEff:\t000001ffffffffff\n", &has),
		     0);
	cr_assert(has);
	cr_assert_eq(mc_status_ipc_lock_parse("CapEff:\t0000000000000000\n", &has), 0);
	cr_assert(!has);
	cr_assert_eq(mc_status_ipc_lock_parse("CapEff:\t0000000000004000\n", &has), 0);
	cr_assert(has, "bit 14 is CAP_IPC_LOCK");
}

/* Issue 17, item 7: a 64G segment on a 24 GiB host. */
Test(sysmem, a_64g_segment_on_a_24g_host_does_not_fit)
{
	struct mc_fit_in in = {.segment_bytes = 64ull << 30, .memlock_bytes = MC_UNLIMITED};
	char why[512];
	cr_assert_eq(mc_meminfo_parse(meminfo_24g, &in.mem), 0);
	cr_assert_eq(mc_segment_fit(&in, why, sizeof(why)), MC_FIT_RAM);
	cr_assert(strstr(why, "64 GiB") && strstr(why, "21.9 GiB of 23.5 GiB") &&
			  strstr(why, "--global-segment-size") &&
			  strstr(why, "--force-segment-size"),
		  "%s", why);
	/* The line names all the node has: RAM, huge pages, memory-lock limit. */
	cr_assert(strstr(why, "this node: 21.9 GiB of 23.5 GiB RAM available, 0 of 0 huge "
			      "pages free (0 B), memory-lock limit unlimited"),
		  "%s", why);
	in.segment_bytes = 16ull << 30;
	cr_assert_eq(mc_segment_fit(&in, why, sizeof(why)), MC_FIT_OK, "%s", why);
	in.buffer_bytes = 8ull << 30;
	cr_assert_eq(mc_segment_fit(&in, why, sizeof(why)), MC_FIT_RAM, "buffers count too");
}

Test(sysmem, memlock_counts_only_when_pinned_and_without_cap_ipc_lock)
{
	struct mc_fit_in in = {.segment_bytes = 64u << 20, .memlock_bytes = 64 * 1024};
	char why[512];
	cr_assert_eq(mc_meminfo_parse(meminfo_24g, &in.mem), 0);
	cr_assert_eq(mc_segment_fit(&in, why, sizeof(why)), MC_FIT_OK, "tcp pins nothing");
	in.pins = true;
	cr_assert_eq(mc_segment_fit(&in, why, sizeof(why)), MC_FIT_MEMLOCK);
	cr_assert(strstr(why, "64 KiB") && strstr(why, "64 MiB") &&
			  strstr(why, "LimitMEMLOCK"),
		  "%s", why);
	in.cap_ipc_lock = true;
	cr_assert_eq(mc_segment_fit(&in, why, sizeof(why)), MC_FIT_OK);
	in.cap_ipc_lock = false;
	in.memlock_bytes = MC_UNLIMITED;
	cr_assert_eq(mc_segment_fit(&in, why, sizeof(why)), MC_FIT_OK);
}

Test(sysmem, hugepages)
{
	struct mc_fit_in in = {.segment_bytes = 1u << 30,
			       .memlock_bytes = MC_UNLIMITED,
			       .hugepages = MC_FIT_HUGE_ON};
	char why[512];
	cr_assert_eq(mc_meminfo_parse(meminfo_24g, &in.mem), 0);
	cr_assert_eq(mc_segment_fit(&in, why, sizeof(why)), MC_FIT_HUGEPAGES);
	cr_assert(strstr(why, "0 of 0 free") && strstr(why, "nr_hugepages"), "%s", why);
	in.mem.huge_total = in.mem.huge_free = 512;
	cr_assert_eq(mc_segment_fit(&in, why, sizeof(why)), MC_FIT_OK, "%s", why);
	/* From the huge page pool, not from MemAvailable. */
	in.mem.available_bytes = 0;
	cr_assert_eq(mc_segment_fit(&in, why, sizeof(why)), MC_FIT_OK, "%s", why);
	in.hugepages = MC_FIT_HUGE_AUTO;
	cr_assert_eq(mc_segment_fit(&in, why, sizeof(why)), MC_FIT_OK);
	in.mem.huge_free = 100;
	cr_assert_eq(mc_segment_fit(&in, why, sizeof(why)), MC_FIT_RAM,
		     "auto without enough huge pages: 4 KiB pages from RAM");
}

Test(sysmem, format_bytes)
{
	char b[32];
	mc_format_bytes(512, b, sizeof(b));
	cr_assert_str_eq(b, "512 B");
	mc_format_bytes(64ull << 30, b, sizeof(b));
	cr_assert_str_eq(b, "64 GiB");
	mc_format_bytes(3ull << 19, b, sizeof(b));
	cr_assert_str_eq(b, "1.5 MiB");
	mc_format_bytes(MC_UNLIMITED, b, sizeof(b));
	cr_assert_str_eq(b, "unlimited");
}

struct writer {
	uint8_t *mem;
	size_t len;
	int stop;
};

/* Writes each page's first byte over and over, as puts into a segment
 * being prefaulted do. */
static void *write_pages(void *arg)
{
	struct writer *w = arg;
	unsigned round = 1;
	do {
		for (size_t off = 0; off < w->len; off += 4096)
			__atomic_store_n(w->mem + off, (uint8_t)(round | 1), __ATOMIC_RELAXED);
		round++;
	} while (!__atomic_load_n(&w->stop, __ATOMIC_RELAXED));
	return NULL;
}

Test(sysmem, prefault_write_faults_in_and_changes_no_byte)
{
	const size_t len = 8u << 20;
	uint8_t *mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1,
			    0);
	cr_assert_neq(mem, MAP_FAILED);
	long page = sysconf(_SC_PAGESIZE);
	unsigned char *vec = malloc(len / (size_t)page);
	cr_assert_not_null(vec);
	cr_assert_eq(mincore(mem, len, vec), 0);
	cr_assert_eq(vec[len / (size_t)page - 1] & 1, 0, "a fresh mapping is not resident");

	/* The second half holds bytes already; the first is written all the
	 * while by another thread, never with 0. */
	for (size_t i = len / 2; i < len; i++)
		mem[i] = (uint8_t)(i * 7 + 1);
	struct writer w = {.mem = mem, .len = len / 2};
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, write_pages, &w), 0);
	int rc = mc_prefault_write(mem, len);
	cr_assert(rc == 0 || rc == -EINVAL, "madvise: %d", rc);
	__atomic_store_n(&w.stop, 1, __ATOMIC_RELAXED);
	pthread_join(t, NULL);

	cr_assert_eq(mincore(mem, len, vec), 0);
	for (size_t i = 0; i < len / (size_t)page; i++)
		cr_assert_eq(vec[i] & 1, 1, "page %zu resident", i);
	for (size_t off = 0; off < len / 2; off += 4096)
		cr_assert_neq(mem[off], 0, "a byte written meanwhile was kept");
	for (size_t i = len / 2; i < len; i++)
		cr_assert_eq(mem[i], (uint8_t)(i * 7 + 1), "byte %zu unchanged", i);
	free(vec);
	munmap(mem, len);
}

/* Write text to root/kernel/mm/transparent_hugepage/enabled. */
static void fake_thp(const char *root, const char *text)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/kernel/mm/transparent_hugepage", root);
	char cmd[600];
	snprintf(cmd, sizeof(cmd), "mkdir -p '%s'", path);
	cr_assert_eq(system(cmd), 0);
	strcat(path, "/enabled");
	FILE *f = fopen(path, "w");
	cr_assert(f);
	fputs(text, f);
	fclose(f);
}

Test(sysmem, thp_madvise_ok_reads_the_mode)
{
	char root[] = "/tmp/mc-sysfs.XXXXXX", mode[64];
	cr_assert(mkdtemp(root));
	/* No such file: no huge pages, and the mode says so. */
	cr_assert_not(mc_thp_madvise_ok(root, mode, sizeof(mode)));
	cr_assert_str_eq(mode, "absent");
	fake_thp(root, "always madvise [never]\n");
	cr_assert_not(mc_thp_madvise_ok(root, mode, sizeof(mode)));
	cr_assert_str_eq(mode, "always madvise [never]");
	fake_thp(root, "always [madvise] never\n");
	cr_assert(mc_thp_madvise_ok(root, NULL, 0));
	fake_thp(root, "[always] madvise never\n");
	cr_assert(mc_thp_madvise_ok(root, mode, sizeof(mode)));
	char cmd[600];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	cr_assert_eq(system(cmd), 0);
}

Test(sysmem, mapping_huge_bytes_finds_the_mapping_that_starts_there)
{
	size_t len = 8u << 20;
	uint8_t *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
			  0);
	cr_assert(p != MAP_FAILED);
	int64_t huge = mc_mapping_huge_bytes(p);
	cr_assert(huge >= 0 && huge <= (int64_t)len, "%lld", (long long)huge);
	/* Not where a mapping starts. */
	cr_assert_eq(mc_mapping_huge_bytes(p + 4096), -ENOENT);
	munmap(p, len);
}
