/*
 * test_pb: field records read (mc_pb_next) and protobuf-c messages
 * unpacked into an arena
 * (common/pbarena.c) — the same message as a plain unpack, with no
 * allocation outside the arena's blocks; the caller's first buffer used
 * and not freed; chunks that grow; bad input refused with nothing held;
 * a spilled message freed piece by piece; and small chunks kept by the
 * thread that released them.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/pb.h"
#include "master.pb-c.h"

/* A SyncSegmentResponse of n events, packed; *len gets its size. */
static uint8_t *sync_response(size_t n, size_t *len)
{
	Mooncake__Master__SyncSegmentResponse r =
		MOONCAKE__MASTER__SYNC_SEGMENT_RESPONSE__INIT;
	Mooncake__Master__MirrorEvent *ev = calloc(n, sizeof(*ev));
	Mooncake__Master__MirrorEvent **p = calloc(n, sizeof(*p));
	char(*keys)[32] = calloc(n, sizeof(*keys));
	cr_assert(ev && p && keys);
	for (size_t i = 0; i < n; i++) {
		mooncake__master__mirror_event__init(&ev[i]);
		ev[i].seq = i + 1;
		int kl = snprintf(keys[i], sizeof(keys[i]), "key-%zu", i);
		ev[i].key.data = (uint8_t *)keys[i];
		ev[i].key.len = (size_t)kl;
		ev[i].offset = i * 4096;
		ev[i].size = 4096;
		ev[i].crc32c = (uint32_t)i * 2654435761u;
		ev[i].checksummed = true;
		p[i] = &ev[i];
	}
	r.events = p;
	r.n_events = n;
	r.last_seq = n;
	*len = mooncake__master__sync_segment_response__get_packed_size(&r);
	uint8_t *buf = malloc(*len ? *len : 1);
	cr_assert(buf);
	mooncake__master__sync_segment_response__pack(&r, buf);
	free(ev);
	free(p);
	free(keys);
	return buf;
}

static void check_events(const Mooncake__Master__SyncSegmentResponse *r, size_t n)
{
	cr_assert_eq(r->n_events, n);
	cr_assert_eq(r->last_seq, n);
	for (size_t i = 0; i < n; i++) {
		char key[32];
		int kl = snprintf(key, sizeof(key), "key-%zu", i);
		const Mooncake__Master__MirrorEvent *e = r->events[i];
		cr_assert_eq(e->seq, i + 1);
		cr_assert_eq(e->key.len, (size_t)kl);
		cr_assert_eq(memcmp(e->key.data, key, (size_t)kl), 0);
		cr_assert_eq(e->offset, i * 4096);
		cr_assert_eq(e->crc32c, (uint32_t)i * 2654435761u);
		cr_assert(e->checksummed);
	}
}

Test(pb, same_message_all_in_the_arena)
{
	size_t sizes[] = {0, 1, 37, 4096};
	for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
		size_t len, n = sizes[k];
		uint8_t *wire = sync_response(n, &len);
		struct mc_pbarena a;
		ProtobufCMessage *m = mc_pb_unpack(
			&mooncake__master__sync_segment_response__descriptor, len, wire, 0,
			&a);
		cr_assert_not_null(m);
		free(wire); /* nothing may point into the wire bytes */
		const Mooncake__Master__SyncSegmentResponse *r = (const void *)m;
		check_events(r, n);
		cr_assert_not(a.spilled);
		cr_assert(mc_pbarena_owns(&a, m));
		for (size_t i = 0; i < n; i++) {
			cr_assert(mc_pbarena_owns(&a, r->events[i]));
			cr_assert(mc_pbarena_owns(&a, r->events[i]->key.data));
		}
		if (n)
			cr_assert(mc_pbarena_owns(&a, r->events));
		mc_pb_free(m, &a); /* (ASan/valgrind: no leak, no double free) */
	}
}

Test(pb, callers_buffer_first_then_growing_chunks)
{
	_Alignas(16) uint8_t buf[200];
	struct mc_pbarena a;
	mc_pbarena_init(&a, buf + 3, sizeof(buf) - 3, 256);
	uint8_t *p = mc_pbarena_alloc(&a, 10);
	cr_assert(p >= buf + 3 && p < buf + sizeof(buf));
	cr_assert_eq((uintptr_t)p % 16, 0, "blocks are 16-byte aligned");
	uint8_t *q = mc_pbarena_alloc(&a, 0);
	cr_assert(q > p && mc_pbarena_owns(&a, q), "a zero-byte block lies inside");
	/* Past the buffer: a chunk, then one twice as large. */
	uint8_t *c1 = mc_pbarena_alloc(&a, 240);
	cr_assert(!(c1 >= buf && c1 < buf + sizeof(buf)));
	cr_assert(mc_pbarena_owns(&a, c1));
	uint8_t *c2 = mc_pbarena_alloc(&a, 300);
	cr_assert(mc_pbarena_owns(&a, c2));
	memset(c1, 1, 240);
	memset(c2, 2, 300);
	/* A block larger than the next chunk gets a chunk of its size. */
	uint8_t *big = mc_pbarena_alloc(&a, 100000);
	cr_assert(mc_pbarena_owns(&a, big));
	memset(big, 3, 100000);
	int outside;
	cr_assert_not(mc_pbarena_owns(&a, &outside));
	cr_assert_not(a.spilled);
	mc_pbarena_release(&a); /* frees the chunks, not buf */
	cr_assert_null(a.chunks);
	cr_assert_eq(mc_pbarena_alloc(&a, (size_t)-1), NULL, "size overflow refused");
}

Test(pb, bad_input_holds_nothing)
{
	size_t len;
	uint8_t *wire = sync_response(100, &len);
	struct mc_pbarena a;
	/* Cut inside an event: protobuf-c refuses it. */
	ProtobufCMessage *m = mc_pb_unpack(
		&mooncake__master__sync_segment_response__descriptor, len - 3, wire, 0, &a);
	cr_assert_null(m);
	cr_assert_null(a.chunks);
	free(wire);
}

Test(pb, spilled_message_freed_piece_by_piece)
{
	size_t len;
	uint8_t *wire = sync_response(50, &len);
	struct mc_pbarena a;
	ProtobufCMessage *m = mc_pb_unpack(
		&mooncake__master__sync_segment_response__descriptor, len, wire, 0, &a);
	cr_assert_not_null(m);
	/* As when a chunk could not be had: a piece of plain malloc memory
	 * in the message, which mc_pb_free must free and only it. */
	Mooncake__Master__SyncSegmentResponse *r = (void *)m;
	void *mine = malloc(8);
	memcpy(mine, "replaced", 8);
	r->events[7]->key.data = mine;
	r->events[7]->key.len = 8;
	a.spilled = true;
	struct mc_pbarena moved = a; /* (copied: fixed inside mc_pb_free) */
	mc_pb_free(m, &moved);
	free(wire);
}

Test(pb, records_of_every_wire_type_and_truncations)
{
	/* 1: varint 300; 2: bytes "abc"; 3: fixed64; 4: fixed32. */
	const uint8_t w[] = {0x08, 0xac, 0x02, 0x12, 3, 'a', 'b',  'c', 0x19, 1,  2,
			     3,    4,    5,    6,    7, 8,   0x25, 9,   10,   11, 12};
	size_t pos = 0;
	struct mc_pbrec r;
	cr_assert(mc_pb_next(w, sizeof(w), &pos, &r));
	cr_assert(r.num == 1 && r.wt == 0 && r.v == 300 && r.end == 3);
	cr_assert(mc_pb_next(w, sizeof(w), &pos, &r));
	cr_assert(r.num == 2 && r.wt == 2 && r.v == 3 && r.data == 5 && r.end == 8);
	cr_assert(mc_pb_next(w, sizeof(w), &pos, &r));
	cr_assert(r.num == 3 && r.wt == 1 && r.v == 0x0807060504030201ull);
	cr_assert(mc_pb_next(w, sizeof(w), &pos, &r));
	cr_assert(r.num == 4 && r.wt == 5 && r.v == 0x0c0b0a09u && r.end == sizeof(w));
	/* Every cut inside a record is refused, and nothing past it read. */
	const size_t ends[] = {0, 3, 8, 17, 22};
	for (size_t cut = 0; cut < sizeof(w); cut++) {
		uint8_t *p = malloc(cut ? cut : 1);
		memcpy(p, w, cut);
		pos = 0;
		size_t k = 0;
		while (mc_pb_next(p, cut, &pos, &r)) {
			k++;
			cr_assert_eq(pos, ends[k]);
		}
		size_t whole = 0; /* the records that end within the cut */
		while (whole + 1 < sizeof(ends) / sizeof(ends[0]) && ends[whole + 1] <= cut)
			whole++;
		cr_assert_eq(k, whole);
		free(p);
	}
	/* A group, and a varint of more than 10 bytes. */
	const uint8_t g[] = {0x0b, 0x0c};
	pos = 0;
	cr_assert_not(mc_pb_next(g, sizeof(g), &pos, &r));
	const uint8_t v[] = {0x08, 0xff, 0xff, 0xff, 0xff, 0xff,
			     0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
	pos = 0;
	cr_assert_not(mc_pb_next(v, sizeof(v), &pos, &r));
}

Test(pb, a_limit_fails_the_unpacking_instead_of_growing)
{
	size_t len;
	uint8_t *wire = sync_response(4096, &len);
	struct mc_pbarena a;
	/* 4,096 events take some 700 KB decoded. */
	ProtobufCMessage *m = mc_pb_unpack(
		&mooncake__master__sync_segment_response__descriptor, len, wire, 256u << 10,
		&a);
	cr_assert_null(m, "refused past the limit");
	cr_assert_null(a.chunks);
	cr_assert_eq(a.taken, 0);
	m = mc_pb_unpack(&mooncake__master__sync_segment_response__descriptor, len, wire,
			 8u << 20, &a);
	cr_assert_not_null(m, "within the limit");
	cr_assert_leq(a.taken, 8u << 20);
	cr_assert_not(a.spilled);
	mc_pb_free(m, &a);
	free(wire);
}

/* Chunks of 2 to 16 KiB come back to the thread that released them, a
 * few of each size; larger ones and those past the count are freed; a
 * limit below a cached size keeps the chunk's exact size; a thread's
 * chunks are freed when it exits or asks (mc_pb_cache_release). */
static void *cache_thread(void *arg)
{
	struct mc_pbarena a;
	mc_pbarena_init(&a, NULL, 0, 3000);
	*(void **)arg = mc_pbarena_alloc(&a, 100);
	mc_pbarena_release(&a); /* kept by this thread, freed at its exit */
	return NULL;
}

Test(pb, small_chunks_are_kept_by_their_thread)
{
	mc_pb_cache_release();
	struct mc_pbarena a;
	mc_pbarena_init(&a, NULL, 0, 3000);
	uint8_t *p = mc_pbarena_alloc(&a, 100);
	cr_assert_geq(a.taken, 3000, "rounded up to a cached size");
	cr_assert_lt(a.taken, 4096);
	memset(p, 7, 100);
	mc_pbarena_release(&a);
	mc_pbarena_init(&a, NULL, 0, 3000);
	cr_assert_eq(mc_pbarena_alloc(&a, 100), p, "the same chunk again");
	mc_pbarena_release(&a);

	/* More at once than are kept: every one usable, none lost (ASan,
	 * valgrind). */
	struct mc_pbarena many[20];
	for (int i = 0; i < 20; i++) {
		mc_pbarena_init(&many[i], NULL, 0, 1500);
		memset(mc_pbarena_alloc(&many[i], 1000), i, 1000);
	}
	for (int i = 0; i < 20; i++)
		mc_pbarena_release(&many[i]);

	/* A large chunk is malloc's. */
	mc_pbarena_init(&a, NULL, 0, 100000);
	memset(mc_pbarena_alloc(&a, 50000), 1, 50000);
	cr_assert_eq(a.taken, 100000);
	mc_pbarena_release(&a);

	/* A limit below the cached size: the exact size. */
	mc_pbarena_init(&a, NULL, 0, 2500);
	a.limit = 2600;
	cr_assert_not_null(mc_pbarena_alloc(&a, 100));
	cr_assert_eq(a.taken, 2500);
	cr_assert_leq(a.taken, a.limit);
	mc_pbarena_release(&a);

	pthread_t t;
	void *q = NULL;
	cr_assert_eq(pthread_create(&t, NULL, cache_thread, &q), 0);
	cr_assert_eq(pthread_join(t, NULL), 0);
	cr_assert_not_null(q);
	mc_pb_cache_release();
}
