/*
 * ltab: the shared lease table (ltab.c) — the read leases an agent holds
 * on objects in its own DRAM segment, published in shared memory so that
 * the node's clients answer gets of those keys themselves: they find the
 * key here and copy the value out of the segment, which they map
 * read-only, with no round trip to the agent.
 *
 * One writer, the agent's loop thread; any number of readers in other
 * processes, which map the table read-only (the memfd is sealed against
 * writable mappings: a client cannot change what another one reads).
 * Each slot is a sequence lock: the writer makes the sequence odd, writes
 * the slot, makes it even again; a reader that saw the same even number
 * before and after its copy of the value read a slot that did not change
 * in between. The value's bytes themselves are kept by the read lease:
 * until the lease ends the master neither evicts the object nor hands its
 * space out again (lcache.c in the agent), and a slot serves only until
 * serve_until_ms, a quarter of the lease from when it was asked for.
 *
 * The format is shared by processes built at different times (an agent
 * and a libmooncake of another version), so it is fixed here and versioned
 * by the header: the slot of a key is the CRC-32C of its bytes (defined
 * for good, unlike mc_hash64), modulo the slot count, or the slot next to
 * it (index xor 1). A reader that does not know the version does not use
 * the table.
 */
#ifndef MC_COMMON_LTAB_H
#define MC_COMMON_LTAB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MC_LTAB_MAGIC 0x6d636c7461623031ull /* "mcltab01" */
#define MC_LTAB_VERSION 1u
#define MC_LTAB_HEADER_BYTES 64u
#define MC_LTAB_SLOT_BYTES 256u
#define MC_LTAB_KEY_MAX 216u /* longer keys are not published */
#define MC_LTAB_MAX_SLOTS (1u << 22)

struct mc_ltab_header {
	uint64_t magic;
	uint32_t version;
	uint32_t nslots;  /* a power of two */
	uint64_t seg_len; /* the DRAM segment's length: offsets are below it */
	uint8_t reserved[40];
};

struct mc_ltab_slot {
	uint32_t seq;  /* odd while the agent writes the slot */
	uint32_t hash; /* crc32c of the key */
	uint16_t klen; /* 0: empty */
	uint8_t has_crc;
	uint8_t reserved;
	uint32_t crc;            /* the value's CRC-32C, with has_crc */
	uint64_t offset, size;   /* the value in the DRAM segment */
	uint64_t serve_until_ms; /* CLOCK_MONOTONIC milliseconds */
	uint8_t key[MC_LTAB_KEY_MAX];
};

/* A table in memory the caller owns (the writer's side). */
struct mc_ltab {
	struct mc_ltab_header *hdr;
	struct mc_ltab_slot *slots;
	uint32_t mask;
	uint32_t used; /* slots holding a key: a clear of none touches no page */
	size_t bytes;
	int fd; /* the sealed memfd, or -1 */
};

/* Bytes of a table of nslots slots. */
size_t mc_ltab_bytes(uint32_t nslots);

/* Create a table of at least nslots slots (rounded up to a power of two,
 * at most MC_LTAB_MAX_SLOTS) in a new memfd sealed so that its size never
 * changes and no mapping made after this call may write it: the memfd can
 * be passed to clients as it is. 0, or a negative errno. */
int mc_ltab_create(struct mc_ltab *t, uint32_t nslots, uint64_t seg_len);
void mc_ltab_destroy(struct mc_ltab *t);

/* Writer. Publish key's value at (offset, size) until serve_until_ms,
 * replacing what the key had; a slot held by another key is taken when
 * it has expired by now_ms, else the one of the two that expires first.
 * Keys longer than MC_LTAB_KEY_MAX are not published (and false is
 * returned). */
bool mc_ltab_publish(struct mc_ltab *t, const void *key, size_t klen, uint64_t offset,
		     uint64_t size, const uint32_t *crc, uint64_t serve_until_ms,
		     uint64_t now_ms);
/* Writer: the key is no longer served from the table. */
void mc_ltab_unpublish(struct mc_ltab *t, const void *key, size_t klen);
/* Writer: nothing is served from the table. */
void mc_ltab_clear(struct mc_ltab *t);

/* Reader: check a mapping of len bytes of a table whose values lie in a
 * segment mapping of seg_len bytes. 0, or -EPROTO for an unknown format
 * or a table larger than the mapping. */
int mc_ltab_check(const void *map, size_t len, uint64_t seg_len);

/* Reader: what a slot said about a key (mc_ltab_find) and how to tell
 * whether it still says so (mc_ltab_still). */
struct mc_ltab_hit {
	const struct mc_ltab_slot *slot;
	uint32_t seq;
	uint64_t offset, size, serve_until_ms;
	uint32_t crc;
	bool has_crc;
};

/* Reader: look key up in a checked table (its mapping's start); true with
 * *h when a slot serves it at now_ms at an offset inside the segment. */
bool mc_ltab_find(const void *map, const void *key, size_t klen, uint64_t now_ms,
		  struct mc_ltab_hit *h);
/* Reader, after copying the value: true when the slot did not change
 * since mc_ltab_find and still serves at now_ms (read after the copy);
 * false: drop the copy and ask the agent. */
bool mc_ltab_still(const struct mc_ltab_hit *h, uint64_t now_ms);

#endif
