/*
 * test_ltab: the shared lease table (common/ltab.h) — publish, find,
 * expiry, the two slots of a key, the bounds a reader checks, the seals
 * that keep a client from writing it, and a reader racing the writer
 * never taking one key's slot for another's.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/crc32c.h"
#include "common/ltab.h"

#define SEG (1u << 20)

static struct mc_ltab t;

static void setup(void)
{
	cr_assert_eq(mc_ltab_create(&t, 60, SEG), 0);
}

static void teardown(void)
{
	mc_ltab_destroy(&t);
}

TestSuite(ltab, .init = setup, .fini = teardown);

static bool find(const char *key, uint64_t now, struct mc_ltab_hit *h)
{
	return mc_ltab_find(t.hdr, key, strlen(key), now, h);
}

Test(ltab, created_sealed_and_checked)
{
	cr_assert_eq(t.hdr->nslots, 64u, "60 rounds up to 64");
	cr_assert_eq(t.bytes, mc_ltab_bytes(64));
	cr_assert_eq(mc_ltab_check(t.hdr, t.bytes, SEG), 0);
	cr_assert_eq(mc_ltab_check(t.hdr, t.bytes - 1, SEG), -EPROTO, "mapping too short");
	cr_assert_eq(mc_ltab_check(t.hdr, t.bytes, SEG - 1), -EPROTO, "segment mapping short");
	/* A client's descriptor: no writable mapping, no write, no resize,
	 * even through a read-write reopening of the same memfd. */
	char path[64];
	snprintf(path, sizeof(path), "/proc/self/fd/%d", t.fd);
	int fd = open(path, O_RDWR);
	cr_assert_geq(fd, 0);
	cr_assert_eq(mmap(NULL, t.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0),
		     MAP_FAILED);
	cr_assert_eq(errno, EPERM);
	cr_assert_eq(write(fd, "x", 1), -1);
	cr_assert_eq(ftruncate(fd, 0), -1);
	void *ro = mmap(NULL, t.bytes, PROT_READ, MAP_SHARED, fd, 0);
	cr_assert_neq(ro, MAP_FAILED);
	cr_assert_neq(mprotect(ro, t.bytes, PROT_READ | PROT_WRITE), 0, "made writable");
	cr_assert_eq(mc_ltab_check(ro, t.bytes, SEG), 0);
	munmap(ro, t.bytes);
	close(fd);
	/* The writer's own mapping stays writable. */
	cr_assert(mc_ltab_publish(&t, "k", 1, 0, 10, NULL, 100, 0));
}

Test(ltab, unknown_formats_are_refused)
{
	static uint8_t buf[MC_LTAB_HEADER_BYTES + 4 * MC_LTAB_SLOT_BYTES];
	struct mc_ltab_header *h = (void *)buf;
	h->magic = MC_LTAB_MAGIC;
	h->version = MC_LTAB_VERSION;
	h->nslots = 4;
	h->seg_len = SEG;
	cr_assert_eq(mc_ltab_check(buf, sizeof(buf), SEG), 0);
	h->version = 2;
	cr_assert_eq(mc_ltab_check(buf, sizeof(buf), SEG), -EPROTO);
	h->version = MC_LTAB_VERSION;
	h->nslots = 3;
	cr_assert_eq(mc_ltab_check(buf, sizeof(buf), SEG), -EPROTO, "not a power of two");
	h->nslots = 8;
	cr_assert_eq(mc_ltab_check(buf, sizeof(buf), SEG), -EPROTO, "beyond the mapping");
	h->nslots = 4;
	h->magic++;
	cr_assert_eq(mc_ltab_check(buf, sizeof(buf), SEG), -EPROTO);
	cr_assert_eq(mc_ltab_check(buf, 10, SEG), -EPROTO);
}

Test(ltab, published_keys_are_found_until_their_time)
{
	uint32_t crc = 0xabcd;
	cr_assert(mc_ltab_publish(&t, "alpha", 5, 4096, 100, &crc, 1000, 0));
	cr_assert(mc_ltab_publish(&t, "beta", 4, 8192, 7, NULL, 2000, 0));
	struct mc_ltab_hit h;
	cr_assert(find("alpha", 999, &h));
	cr_assert_eq(h.offset, 4096u);
	cr_assert_eq(h.size, 100u);
	cr_assert(h.has_crc);
	cr_assert_eq(h.crc, 0xabcdu);
	cr_assert(mc_ltab_still(&h, 999));
	cr_assert_not(mc_ltab_still(&h, 1000), "its time ended during the copy");
	cr_assert_not(find("alpha", 1000, &h), "served until 1000 only");
	cr_assert(find("beta", 1500, &h));
	cr_assert_not(h.has_crc);
	cr_assert_not(find("gamma", 0, &h));
	cr_assert_not(find("alph", 0, &h));
	/* A new window, a new place. */
	cr_assert(mc_ltab_publish(&t, "alpha", 5, 0, 50, NULL, 3000, 1500));
	cr_assert(find("alpha", 2000, &h));
	cr_assert_eq(h.offset, 0u);
	cr_assert_eq(h.size, 50u);
	cr_assert_eq(t.used, 2);
	mc_ltab_unpublish(&t, "alpha", 5);
	cr_assert_eq(t.used, 1);
	cr_assert_not(find("alpha", 2000, &h));
	cr_assert(find("beta", 1500, &h));
	mc_ltab_clear(&t);
	cr_assert_eq(t.used, 0);
	cr_assert_not(find("beta", 1500, &h));
}

Test(ltab, a_change_during_the_copy_is_seen)
{
	struct mc_ltab_hit h;
	cr_assert(mc_ltab_publish(&t, "k", 1, 64, 8, NULL, 1000, 0));
	cr_assert(find("k", 10, &h));
	cr_assert(mc_ltab_publish(&t, "k", 1, 64, 8, NULL, 2000, 10), "renewed");
	cr_assert_not(mc_ltab_still(&h, 11), "the slot was written meanwhile");
	cr_assert(find("k", 10, &h));
	mc_ltab_unpublish(&t, "k", 1);
	cr_assert_not(mc_ltab_still(&h, 11));
}

Test(ltab, long_keys_and_bad_places_are_not_served)
{
	char key[MC_LTAB_KEY_MAX + 1];
	memset(key, 'x', sizeof(key));
	struct mc_ltab_hit h;
	cr_assert(mc_ltab_publish(&t, key, MC_LTAB_KEY_MAX, 0, 1, NULL, 100, 0));
	cr_assert(mc_ltab_find(t.hdr, key, MC_LTAB_KEY_MAX, 0, &h));
	cr_assert_not(mc_ltab_publish(&t, key, sizeof(key), 0, 1, NULL, 100, 0));
	cr_assert_not(mc_ltab_find(t.hdr, key, sizeof(key), 0, &h));
	/* Values the segment mapping does not hold are not served. */
	cr_assert(mc_ltab_publish(&t, "edge", 4, SEG - 8, 8, NULL, 100, 0));
	cr_assert(find("edge", 0, &h));
	cr_assert(mc_ltab_publish(&t, "edge", 4, SEG - 8, 9, NULL, 100, 0));
	cr_assert_not(find("edge", 0, &h));
	cr_assert(mc_ltab_publish(&t, "edge", 4, UINT64_MAX, 1, NULL, 100, 0));
	cr_assert_not(find("edge", 0, &h));
}

/* Keys whose CRC-32C falls on the same slot (so on the same pair). */
static int colliding(char keys[][16], int n)
{
	int got = 0;
	uint32_t want = 0;
	for (int i = 0; got < n && i < 1000000; i++) {
		char k[16];
		snprintf(k, sizeof(k), "key%d", i);
		uint32_t pair = crc32c(0, k, strlen(k)) & t.mask;
		if (got == 0)
			want = pair;
		if (pair == want)
			snprintf(keys[got++], 16, "%s", k);
	}
	return got;
}

Test(ltab, two_keys_share_a_pair_the_third_takes_the_older)
{
	char k[3][16];
	cr_assert_eq(colliding(k, 3), 3);
	cr_assert(mc_ltab_publish(&t, k[0], strlen(k[0]), 0, 1, NULL, 100, 0));
	cr_assert(mc_ltab_publish(&t, k[1], strlen(k[1]), 1, 1, NULL, 200, 0));
	struct mc_ltab_hit h;
	cr_assert(find(k[0], 50, &h) && h.offset == 0);
	cr_assert(find(k[1], 50, &h) && h.offset == 1);
	cr_assert(mc_ltab_publish(&t, k[2], strlen(k[2]), 2, 1, NULL, 300, 50));
	cr_assert_not(find(k[0], 50, &h), "the one that ends first made room");
	cr_assert(find(k[1], 50, &h) && h.offset == 1);
	cr_assert(find(k[2], 50, &h) && h.offset == 2);
	/* An expired slot is taken before a live one. */
	cr_assert(mc_ltab_publish(&t, k[0], strlen(k[0]), 3, 1, NULL, 400, 250));
	cr_assert_not(find(k[1], 250, &h));
	cr_assert(find(k[2], 250, &h) && h.offset == 2);
	cr_assert(find(k[0], 250, &h) && h.offset == 3);
}

/* The writer moves two colliding keys between the same two slots, each
 * always at its own offset; readers that find a key and see the slot
 * unchanged after copying must have copied that key's bytes. */
static char race_keys[2][16];
static uint8_t race_seg[SEG];
static volatile int race_stop;

static void *race_reader(void *arg)
{
	long bad = 0, hits = 0;
	(void)arg;
	for (unsigned i = 0; !race_stop; i++) {
		const char *k = race_keys[i & 1];
		struct mc_ltab_hit h;
		if (!mc_ltab_find(t.hdr, k, strlen(k), 1, &h))
			continue;
		uint8_t copy[64];
		memcpy(copy, race_seg + h.offset, sizeof(copy));
		if (!mc_ltab_still(&h, 1))
			continue;
		hits++;
		bad += copy[0] != (uint8_t)(i & 1) || h.size != 64 + (i & 1);
	}
	cr_assert_eq(bad, 0, "a reader took one key's slot for the other's");
	return (void *)hits;
}

Test(ltab, readers_racing_the_writer_never_mix_keys)
{
	char k[2][16];
	cr_assert_eq(colliding(k, 2), 2);
	memcpy(race_keys, k, sizeof(k));
	memset(race_seg, 0, 4096);
	memset(race_seg + 4096, 1, 4096);
	race_stop = 0;
	pthread_t th[2];
	for (int i = 0; i < 2; i++)
		pthread_create(&th[i], NULL, race_reader, NULL);
	for (unsigned n = 0; n < 400000; n++) {
		unsigned w = n & 1, other = w ^ 1;
		/* Both keys land in one slot after another: the slot of one
		 * is rewritten for the other again and again. */
		mc_ltab_unpublish(&t, k[other], strlen(k[other]));
		mc_ltab_publish(&t, k[w], strlen(k[w]), w * 4096, 64 + w, NULL, 1000 + n, 0);
	}
	race_stop = 1;
	long hits = 0;
	for (int i = 0; i < 2; i++) {
		void *r;
		pthread_join(th[i], &r);
		hits += (long)r;
	}
	cr_assert_gt(hits, 0, "the readers found the keys");
}
