/*
 * ltab: the shared lease table (see ltab.h for the format and why a
 * reader may trust what it copies).
 */
#include "common/ltab.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/crc32c.h"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

size_t mc_ltab_bytes(uint32_t nslots)
{
	return MC_LTAB_HEADER_BYTES + (size_t)nslots * MC_LTAB_SLOT_BYTES;
}

int mc_ltab_create(struct mc_ltab *t, uint32_t nslots, uint64_t seg_len)
{
	_Static_assert(sizeof(struct mc_ltab_header) == MC_LTAB_HEADER_BYTES, "header size");
	_Static_assert(sizeof(struct mc_ltab_slot) == MC_LTAB_SLOT_BYTES, "slot size");
	memset(t, 0, sizeof(*t));
	t->fd = -1;
	if (nslots == 0 || nslots > MC_LTAB_MAX_SLOTS)
		return -EINVAL;
	uint32_t n = 2;
	while (n < nslots)
		n <<= 1;
	t->bytes = mc_ltab_bytes(n);
	int fd = memfd_create("mooncake-lease-table", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	void *p = MAP_FAILED;
	if (ftruncate(fd, (off_t)t->bytes) != 0)
		goto fail;
	p = mmap(NULL, t->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		goto fail;
	/* This mapping stays writable; every later one (the clients') is
	 * read-only, and mprotect cannot make it writable. */
	if (fcntl(fd, F_ADD_SEALS,
		  F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) != 0)
		goto fail;
	t->fd = fd;
	t->hdr = p;
	t->slots = (struct mc_ltab_slot *)((uint8_t *)p + MC_LTAB_HEADER_BYTES);
	t->mask = n - 1;
	t->hdr->nslots = n;
	t->hdr->seg_len = seg_len;
	t->hdr->version = MC_LTAB_VERSION;
	__atomic_store_n(&t->hdr->magic, MC_LTAB_MAGIC, __ATOMIC_RELEASE);
	return 0;
fail:;
	int err = -errno;
	if (p != MAP_FAILED)
		munmap(p, t->bytes);
	close(fd);
	t->bytes = 0;
	return err;
}

void mc_ltab_destroy(struct mc_ltab *t)
{
	if (t->hdr)
		munmap(t->hdr, t->bytes);
	if (t->fd >= 0)
		close(t->fd);
	memset(t, 0, sizeof(*t));
	t->fd = -1;
}

static uint32_t key_hash(const void *key, size_t klen)
{
	return crc32c(0, key, klen);
}

static bool holds(const struct mc_ltab_slot *s, uint32_t hash, const void *key, size_t klen)
{
	return s->klen == klen && s->hash == hash && memcmp(s->key, key, klen) == 0;
}

/* Writer: open a slot for writing (its sequence odd) and close it. */
static void write_begin(struct mc_ltab_slot *s)
{
	__atomic_store_n(&s->seq, s->seq + 1, __ATOMIC_RELAXED);
	__atomic_thread_fence(__ATOMIC_RELEASE);
}

static void write_end(struct mc_ltab_slot *s)
{
	__atomic_store_n(&s->seq, s->seq + 1, __ATOMIC_RELEASE);
}

static void empty(struct mc_ltab *t, struct mc_ltab_slot *s)
{
	t->used--;
	write_begin(s);
	s->klen = 0;
	s->serve_until_ms = 0;
	write_end(s);
}

bool mc_ltab_publish(struct mc_ltab *t, const void *key, size_t klen, uint64_t offset,
		     uint64_t size, const uint32_t *crc, uint64_t serve_until_ms,
		     uint64_t now_ms)
{
	if (!t->hdr)
		return false;
	if (klen == 0 || klen > MC_LTAB_KEY_MAX) {
		mc_ltab_unpublish(t, key, klen);
		return false;
	}
	uint32_t hash = key_hash(key, klen);
	struct mc_ltab_slot *a = &t->slots[hash & t->mask];
	struct mc_ltab_slot *b = &t->slots[(hash & t->mask) ^ 1];
	struct mc_ltab_slot *s;
	if (holds(a, hash, key, klen))
		s = a;
	else if (holds(b, hash, key, klen))
		s = b;
	else if (a->klen == 0 || a->serve_until_ms <= now_ms)
		s = a;
	else if (b->klen == 0 || b->serve_until_ms <= now_ms)
		s = b;
	else
		s = a->serve_until_ms <= b->serve_until_ms ? a : b;
	t->used += s->klen == 0;
	write_begin(s);
	s->hash = hash;
	s->klen = (uint16_t)klen;
	memcpy(s->key, key, klen);
	s->offset = offset;
	s->size = size;
	s->has_crc = crc != NULL;
	s->crc = crc ? *crc : 0;
	s->serve_until_ms = serve_until_ms;
	write_end(s);
	return true;
}

void mc_ltab_unpublish(struct mc_ltab *t, const void *key, size_t klen)
{
	if (!t->hdr || klen == 0 || klen > MC_LTAB_KEY_MAX)
		return;
	uint32_t hash = key_hash(key, klen);
	for (uint32_t k = 0; k < 2; k++) {
		struct mc_ltab_slot *s = &t->slots[(hash & t->mask) ^ k];
		if (holds(s, hash, key, klen))
			empty(t, s);
	}
}

void mc_ltab_clear(struct mc_ltab *t)
{
	for (uint32_t i = 0; t->hdr && t->used && i <= t->mask; i++)
		if (t->slots[i].klen)
			empty(t, &t->slots[i]);
}

/* ------------------------------------------------------------ readers */

int mc_ltab_check(const void *map, size_t len, uint64_t seg_len)
{
	const struct mc_ltab_header *h = map;
	if (len < MC_LTAB_HEADER_BYTES ||
	    __atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != MC_LTAB_MAGIC ||
	    h->version != MC_LTAB_VERSION || h->nslots < 2 || h->nslots > MC_LTAB_MAX_SLOTS ||
	    (h->nslots & (h->nslots - 1)) != 0 || mc_ltab_bytes(h->nslots) > len ||
	    h->seg_len > seg_len)
		return -EPROTO;
	return 0;
}

/* The fields a reader takes from a slot are read with relaxed atomic
 * loads: the writer may change them meanwhile (the sequence tells). */
#define LOAD(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)

bool mc_ltab_find(const void *map, const void *key, size_t klen, uint64_t now_ms,
		  struct mc_ltab_hit *h)
{
	if (klen == 0 || klen > MC_LTAB_KEY_MAX)
		return false;
	const struct mc_ltab_header *hdr = map;
	const struct mc_ltab_slot *slots = (const struct mc_ltab_slot *)((const uint8_t *)map +
									 MC_LTAB_HEADER_BYTES);
	uint32_t mask = hdr->nslots - 1;
	uint64_t seg_len = hdr->seg_len;
	uint32_t hash = key_hash(key, klen);
	for (uint32_t k = 0; k < 2; k++) {
		const struct mc_ltab_slot *s = &slots[(hash & mask) ^ k];
		uint32_t seq = __atomic_load_n(&s->seq, __ATOMIC_ACQUIRE);
		if ((seq & 1) || LOAD(s->hash) != hash || LOAD(s->klen) != klen)
			continue;
		h->slot = s;
		h->seq = seq;
		h->offset = LOAD(s->offset);
		h->size = LOAD(s->size);
		h->serve_until_ms = LOAD(s->serve_until_ms);
		h->crc = LOAD(s->crc);
		h->has_crc = LOAD(s->has_crc) != 0;
		/* The key is compared in place: a change meanwhile changes
		 * the sequence, which mc_ltab_still checks. */
		if (memcmp(s->key, key, klen) != 0 || now_ms >= h->serve_until_ms ||
		    h->offset > seg_len || h->size > seg_len - h->offset)
			continue;
		return true;
	}
	return false;
}

bool mc_ltab_still(const struct mc_ltab_hit *h, uint64_t now_ms)
{
	__atomic_thread_fence(__ATOMIC_ACQUIRE);
	return __atomic_load_n(&h->slot->seq, __ATOMIC_RELAXED) == h->seq &&
	       now_ms < h->serve_until_ms;
}
