/*
 * pb: protobuf field records and the unpacking arena (see pb.h).
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/endian.h"
#include "common/pb.h"

#define ALIGN 16u
#define MIN_CHUNK 256u
#define MAX_CHUNK (1u << 20)

/* ------------------------------------------------------------ records */

bool mc_pb__varint_long(const uint8_t *p, size_t len, size_t *pos, uint64_t *v)
{
	/* (a local index: no store through pos a byte) */
	size_t i = *pos, end = len - i > 10 ? i + 10 : len;
	uint64_t x = 0;
	for (unsigned shift = 0; i < end; shift += 7) {
		uint8_t b = p[i++];
		x |= (uint64_t)(b & 0x7f) << shift;
		if (!(b & 0x80)) {
			*pos = i;
			*v = x;
			return true;
		}
	}
	*pos = i;
	return false;
}

/* ------------------------------------------------------------ arena */

struct mc_pbchunk {
	struct mc_pbchunk *next;
	size_t cap, used;
	_Alignas(ALIGN) uint8_t data[];
};

/*
 * Chunks of 2 to 16 KiB (with their header) are kept for reuse by the
 * thread that releases them, up to CACHE_PER_CLASS of each power of two:
 * an arena per request or call takes and gives back a chunk of a few KiB
 * each time, which glibc's malloc serves outside its per-thread cache
 * (over 1 KiB) at about 500 instructions a call, and whose frees make
 * the small allocations after them sort its unsorted bin (callgrind of
 * an agent under 4 KiB puts: 1.6 chunks a put). A thread's chunks are
 * freed when it exits.
 */
#define CACHE_MIN_SHIFT 11u
#define CACHE_CLASSES 4u
#define CACHE_PER_CLASS 8u

struct chunk_cache {
	struct mc_pbchunk *head[CACHE_CLASSES];
	unsigned n[CACHE_CLASSES];
};

static _Thread_local struct chunk_cache tcache;
static _Thread_local bool tcache_registered;
static pthread_key_t cache_key;
static pthread_once_t cache_once = PTHREAD_ONCE_INIT;
static bool cache_key_ok;

static void cache_drop(void *p)
{
	struct chunk_cache *cc = p;
	for (unsigned k = 0; k < CACHE_CLASSES; k++)
		while (cc->head[k]) {
			struct mc_pbchunk *c = cc->head[k];
			cc->head[k] = c->next;
			free(c);
		}
	memset(cc, 0, sizeof(*cc));
	tcache_registered = false; /* (the exiting thread's own) */
}

void mc_pb_cache_release(void)
{
	cache_drop(&tcache);
}

static void cache_key_new(void)
{
	cache_key_ok = pthread_key_create(&cache_key, cache_drop) == 0;
}

/* The class of a chunk of total bytes, or -1. */
static int cache_class(size_t total)
{
	for (unsigned k = 0; k < CACHE_CLASSES; k++)
		if (total == (size_t)1 << (CACHE_MIN_SHIFT + k))
			return (int)k;
	return -1;
}

static struct mc_pbchunk *chunk_take(size_t total)
{
	int k = cache_class(total);
	if (k >= 0 && tcache.head[k]) {
		struct mc_pbchunk *c = tcache.head[k];
		tcache.head[k] = c->next;
		tcache.n[k]--;
		return c;
	}
	return malloc(total);
}

static void chunk_give(struct mc_pbchunk *c)
{
	int k = cache_class(sizeof(*c) + c->cap);
	if (k < 0 || tcache.n[k] == CACHE_PER_CLASS) {
		free(c);
		return;
	}
	/* (Registered for the thread's exit once it holds a chunk.) */
	if (!tcache_registered) {
		pthread_once(&cache_once, cache_key_new);
		if (!cache_key_ok || pthread_setspecific(cache_key, &tcache) != 0) {
			free(c);
			return;
		}
		tcache_registered = true;
	}
	c->next = tcache.head[k];
	tcache.head[k] = c;
	tcache.n[k]++;
}

static void *pa_alloc(void *ud, size_t size)
{
	return mc_pbarena_alloc(ud, size);
}

static void pa_free(void *ud, void *p)
{
	if (p && !mc_pbarena_owns(ud, p))
		free(p);
}

void mc_pbarena_init(struct mc_pbarena *a, void *buf, size_t cap, size_t chunk_cap)
{
	*a = (struct mc_pbarena){.buf = buf,
				 .cap = buf ? cap : 0,
				 .next_cap = chunk_cap < MIN_CHUNK ? MIN_CHUNK : chunk_cap};
	/* The caller's buffer is used from its first aligned byte on. */
	if (buf) {
		size_t skew = (size_t)(-(uintptr_t)buf & (ALIGN - 1));
		a->used = skew < a->cap ? skew : a->cap;
	}
	mc_pbarena_fix(a);
}

void mc_pbarena_fix(struct mc_pbarena *a)
{
	a->pa.alloc = pa_alloc;
	a->pa.free = pa_free;
	a->pa.allocator_data = a;
}

bool mc_pbarena_owns(const struct mc_pbarena *a, const void *p)
{
	const uint8_t *q = p;
	if (a->buf && q >= a->buf && q < a->buf + a->cap)
		return true;
	for (const struct mc_pbchunk *c = a->chunks; c; c = c->next)
		if (q >= c->data && q < c->data + c->cap)
			return true;
	return false;
}

void *mc_pbarena_alloc(struct mc_pbarena *a, size_t size)
{
	/* (a zero-byte block still takes room: it must lie inside) */
	size_t al = size ? (size + ALIGN - 1) & ~(size_t)(ALIGN - 1) : ALIGN;
	if (al < size)
		return NULL; /* (overflow) */
	if (a->buf && al <= a->cap - a->used) {
		void *p = a->buf + a->used;
		a->used += al;
		return p;
	}
	struct mc_pbchunk *c = a->chunks;
	if (c && al <= c->cap - c->used) {
		void *p = c->data + c->used;
		c->used += al;
		return p;
	}
	size_t cap = a->next_cap > al ? a->next_cap : al;
	/* Up to a cached size when that stays within the limit. */
	for (unsigned k = 0; k < CACHE_CLASSES; k++) {
		size_t room = ((size_t)1 << (CACHE_MIN_SHIFT + k)) - sizeof(*c);
		if (cap <= room) {
			if (!a->limit || (room <= a->limit && a->taken <= a->limit - room))
				cap = room;
			break;
		}
	}
	if (a->limit && (cap > a->limit || a->taken > a->limit - cap)) {
		/* Past the limit: a smaller last chunk, or nothing. */
		cap = a->limit > a->taken ? a->limit - a->taken : 0;
		if (cap < al) {
			a->full = true;
			return NULL;
		}
	}
	c = cap <= SIZE_MAX - sizeof(*c) ? chunk_take(sizeof(*c) + cap) : NULL;
	if (!c) {
		if (a->limit)
			return NULL;
		a->spilled = true;
		return malloc(size ? size : 1);
	}
	a->taken += cap;
	c->cap = cap;
	c->used = al;
	c->next = a->chunks;
	a->chunks = c;
	if (a->next_cap < MAX_CHUNK)
		a->next_cap *= 2;
	return c->data;
}

void mc_pbarena_release(struct mc_pbarena *a)
{
	a->taken = 0;
	struct mc_pbchunk *c = a->chunks;
	while (c) {
		struct mc_pbchunk *next = c->next;
		chunk_give(c);
		c = next;
	}
	a->chunks = NULL;
}

void mc_pbarena_start(struct mc_pbarena *a, size_t len, size_t limit)
{
	/* The structs of a small message take a few times its length (a
	 * 6-byte item of a repeated field is a struct of 40-100 bytes). */
	mc_pbarena_init(a, NULL, 0, len < MAX_CHUNK ? 3 * len + 1024 : MAX_CHUNK);
	a->limit = limit;
}

ProtobufCMessage *mc_pb_unpack(const ProtobufCMessageDescriptor *desc, size_t len,
			       const uint8_t *data, size_t limit, struct mc_pbarena *a)
{
	mc_pbarena_start(a, len, limit);
	ProtobufCMessage *m = protobuf_c_message_unpack(desc, &a->pa, len, data);
	if (!m)
		mc_pbarena_release(a);
	return m;
}

void mc_pb_free(ProtobufCMessage *m, struct mc_pbarena *a)
{
	if (m && a->spilled) {
		mc_pbarena_fix(a);
		protobuf_c_message_free_unpacked(m, &a->pa);
	}
	mc_pbarena_release(a);
}
