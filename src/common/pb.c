/*
 * pb: protobuf field records and the unpacking arena (see pb.h).
 */
#include <errno.h>
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
	if (a->limit && (cap > a->limit || a->taken > a->limit - cap)) {
		/* Past the limit: a smaller last chunk, or nothing. */
		cap = a->limit > a->taken ? a->limit - a->taken : 0;
		if (cap < al) {
			a->full = true;
			return NULL;
		}
	}
	c = cap <= SIZE_MAX - sizeof(*c) ? malloc(sizeof(*c) + cap) : NULL;
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
		free(c);
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
