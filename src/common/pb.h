/*
 * pb: protobuf helpers below protobuf-c — reading an encoding's field
 * records, and an arena to unpack messages into.
 *
 * Records: mc_pb_next walks the top-level fields of an encoding (wire
 * types 0, 1, 2 and 5; groups are refused, as protobuf-c refuses them),
 * every length checked against the bytes there are; mc_pb_put_varint
 * writes. For the few hot messages whose generic coding costs more than
 * their handling.
 *
 * Arena: a bump allocator for protobuf-c's unpacking. protobuf-c makes
 * one allocation per message struct, repeated-field array and string or
 * bytes copy, and protobuf_c_message_free_unpacked walks the message to
 * free each; a decoded 32-item request is some hundred mallocs and as
 * many frees. Unpacked with &arena->pa instead, the message lives in a
 * few blocks freed at once by mc_pbarena_release, with no walk.
 *
 * The arena starts in an optional buffer of the caller's (not freed here)
 * and goes on in chunks of its own, each twice the last. Only when a
 * chunk cannot be had does it hand out plain malloc memory (spilled):
 * such a message must still go through protobuf_c_message_free_unpacked
 * with &arena->pa, which frees just those pieces (mc_pb_free does both).
 * The struct holds a pointer to itself (pa.allocator_data): after copying
 * it, call mc_pbarena_fix on the copy.
 */
#ifndef MC_COMMON_PB_H
#define MC_COMMON_PB_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <protobuf-c/protobuf-c.h>

#include "common/endian.h"

/* One field record of an encoding. */
struct mc_pbrec {
	uint64_t num; /* field number */
	unsigned wt;  /* wire type: 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32 */
	uint64_t v;   /* 0: the value; 1, 5: the value (little-endian); 2: the length */
	size_t start; /* where its tag starts */
	size_t data;  /* where its value starts (for 2: after the length) */
	size_t end;   /* where the record ends */
};

bool mc_pb__varint_long(const uint8_t *p, size_t len, size_t *pos, uint64_t *v);

/* The varint at *pos of p[0, len), advancing *pos past it; false when it
 * runs past len or past 10 bytes. (Inline for its one-byte case: most
 * tags and many values.) */
static inline bool mc_pb_varint(const uint8_t *p, size_t len, size_t *pos, uint64_t *v)
{
	if (*pos < len && p[*pos] < 0x80) {
		*v = p[(*pos)++];
		return true;
	}
	return mc_pb__varint_long(p, len, pos, v);
}
/* Write v as a varint at out (room for 10 bytes); returns its length. */
static inline size_t mc_pb_put_varint(uint8_t *out, uint64_t v)
{
	size_t n = 0;
	do {
		out[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
		v >>= 7;
	} while (v);
	return n;
}

/* The length of v as a varint. */
static inline size_t mc_pb_varint_len(uint64_t v)
{
	size_t n = 1;
	while (v > 0x7f) {
		v >>= 7;
		n++;
	}
	return n;
}

/* A field's tag (its number and wire type) at out; returns its length. */
static inline size_t mc_pb_put_tag(uint8_t *out, unsigned num, unsigned wt)
{
	return mc_pb_put_varint(out, (uint64_t)num << 3 | wt);
}

/* A length-delimited field (bytes, string, submessage) of len bytes. */
static inline size_t mc_pb_put_bytes(uint8_t *out, unsigned num, const void *p, size_t len)
{
	size_t n = mc_pb_put_tag(out, num, 2);
	n += mc_pb_put_varint(out + n, len);
	if (len)
		memcpy(out + n, p, len);
	return n + len;
}

/* A varint field, left out at 0 (proto3's default). */
static inline size_t mc_pb_put_uint(uint8_t *out, unsigned num, uint64_t v)
{
	if (!v)
		return 0;
	size_t n = mc_pb_put_tag(out, num, 0);
	return n + mc_pb_put_varint(out + n, v);
}

/* A fixed32 field, left out at 0 (proto3's default). */
static inline size_t mc_pb_put_fixed32(uint8_t *out, unsigned num, uint32_t v)
{
	if (!v)
		return 0;
	size_t n = mc_pb_put_tag(out, num, 5);
	mc_put_le32(out + n, v);
	return n + 4;
}

/* A sint32's varint (zigzag). */
static inline uint64_t mc_pb_zigzag32(int32_t v)
{
	return (uint32_t)(((uint32_t)v << 1) ^ (uint32_t)(v >> 31));
}

/* A varint record's value as a bool the way protobuf-c reads one: true
 * when any of its bytes has a payload bit (even past the 64 bits of v). */
static inline bool mc_pb_bool(const uint8_t *p, const struct mc_pbrec *r)
{
	for (size_t i = r->data; i < r->end; i++)
		if (p[i] & 0x7f)
			return true;
	return false;
}

/* The record at *pos of p[0, len), advancing *pos past it; false at a
 * record that is malformed (a tag or a length of more than 5 bytes, a
 * group, a varint of more than 10) or runs past len. */
static inline bool mc_pb_next(const uint8_t *p, size_t len, size_t *pos, struct mc_pbrec *r)
{
	uint64_t tag;
	r->start = *pos;
	/* A tag is a uint32: protobuf-c refuses one of more than 5 bytes. */
	if (!mc_pb_varint(p, len, pos, &tag) || *pos - r->start > 5)
		return false;
	r->num = tag >> 3;
	r->wt = (unsigned)(tag & 7);
	r->data = *pos;
	switch (r->wt) {
	case 0:
		if (!mc_pb_varint(p, len, pos, &r->v))
			return false;
		break;
	case 1:
	case 5: {
		size_t n = r->wt == 1 ? 8 : 4;
		if (len - *pos < n)
			return false;
		r->v = n == 8 ? mc_get_le64(p + *pos) : mc_get_le32(p + *pos);
		*pos += n;
		break;
	}
	case 2:
		/* (a length of more than 5 bytes: protobuf-c refuses it too) */
		if (!mc_pb_varint(p, len, pos, &r->v) || *pos - r->data > 5 ||
		    r->v > len - *pos)
			return false;
		r->data = *pos;
		*pos += (size_t)r->v;
		break;
	default:
		return false; /* groups: protobuf-c refuses them */
	}
	r->end = *pos;
	return true;
}

/* The next field of a message whose fields 1..n have the wire types
 * wt_of[1..n] (0 varint, 1 fixed64, 2 length-delimited, 5 fixed32; an
 * entry of 8: no such field), for a decoder that reads what protobuf-c
 * reads and leaves the rest to it. True with *r such a field; else false
 * with *rc 0 at the end, 1 for what protobuf-c must decide (a field with
 * another wire type than its own, a field number none can have), or
 * -EBADMSG (malformed). Unknown fields are skipped, as protobuf-c does. */
static inline bool mc_pb_field(const uint8_t *p, size_t len, size_t *pos, const uint8_t *wt_of,
			       unsigned n, struct mc_pbrec *r, int *rc)
{
	*rc = 0;
	while (*pos < len) {
		if (!mc_pb_next(p, len, pos, r)) {
			*rc = -EBADMSG;
			return false;
		}
		if (r->num == 0 || r->num > 0x1fffffff) {
			*rc = 1;
			return false;
		}
		if (r->num > n || wt_of[r->num] == 8)
			continue;
		if (r->wt == wt_of[r->num])
			return true;
		*rc = 1;
		return false;
	}
	return false;
}

struct mc_pbchunk;

struct mc_pbarena {
	ProtobufCAllocator pa;
	uint8_t *buf; /* the caller's first buffer, or NULL */
	size_t cap, used;
	struct mc_pbchunk *chunks; /* newest first */
	size_t next_cap;           /* the size of the next chunk */
	size_t limit;              /* 0, or the most the chunks may take */
	size_t taken;              /* bytes of the chunks */
	bool spilled;              /* something lies outside buf and chunks */
	bool full;                 /* an allocation was refused for the limit */
};

/* Start an arena in buf[0, cap) (may be NULL, 0); its first own chunk
 * takes chunk_cap bytes (at least 256). Set a->limit after it to bound
 * what the chunks take: past it allocations fail (NULL, and protobuf-c's
 * unpacking with them), rather than spill, and a->full says so until the
 * arena is started again. */
void mc_pbarena_init(struct mc_pbarena *a, void *buf, size_t cap, size_t chunk_cap);
/* Point pa back at a, after the struct was copied. */
void mc_pbarena_fix(struct mc_pbarena *a);
/* Does p lie in the caller's buffer or in one of the arena's chunks? */
bool mc_pbarena_owns(const struct mc_pbarena *a, const void *p);
/* Allocate from a (what pa.alloc does). */
void *mc_pbarena_alloc(struct mc_pbarena *a, size_t size);
/* Free the arena's chunks (not the caller's buffer): chunks of 2 to 16
 * KiB are kept by the calling thread for its next arenas, a few of each
 * size, and freed when it exits (pb.c). */
void mc_pbarena_release(struct mc_pbarena *a);
/* Free the chunks the calling thread keeps now (a thread that goes on
 * living, such as main, at its end). */
void mc_pb_cache_release(void);

/* Start an empty arena a sized for a message of len bytes, whose chunks
 * may take up to limit bytes (0: no bound). */
void mc_pbarena_start(struct mc_pbarena *a, size_t len, size_t limit);
/* Unpack data[0, len) into a fresh arena a, sized for a message of len
 * bytes, whose chunks may take up to limit bytes (0: no bound). NULL when
 * it does not decode or needs more (a holds nothing then). */
ProtobufCMessage *mc_pb_unpack(const ProtobufCMessageDescriptor *desc, size_t len,
			       const uint8_t *data, size_t limit, struct mc_pbarena *a);
/* Free a message unpacked into a, and a's chunks. m may be NULL. */
void mc_pb_free(ProtobufCMessage *m, struct mc_pbarena *a);

#endif
