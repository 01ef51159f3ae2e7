/*
 * pb_check: the hand-written protobuf decoders of hot messages checked
 * against protobuf-c on the same bytes, aborting on a difference: a
 * decoder that accepts what protobuf-c refuses, refuses what it accepts
 * or decodes other values. Shared by the fuzz target fuzz_pb_codecs and
 * the unit test test_pb_codecs, which feeds it random messages.
 */
#ifndef MC_TEST_PB_CHECK_H
#define MC_TEST_PB_CHECK_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "agent/mirror.h"
#include "agent/req.h"
#include "common/pb.h"
#include "master.pb-c.h"
#include "master/master_int.h"

#define CHECK(c) \
	do { \
		if (!(c)) \
			abort(); \
	} while (0)

/* A hand decoder's verdict rc against protobuf-c's (decoded or not):
 * decoded (0) only what protobuf-c decodes, refused (-EBADMSG) only what
 * it refuses; 1 leaves it to protobuf-c. */
static void pb_check_verdict(int rc, bool decoded)
{
	CHECK(rc == 0 || rc == 1 || rc == -EBADMSG);
	CHECK(rc != 0 || decoded);
	CHECK(rc != -EBADMSG || !decoded);
}

static void pb_check_event(const uint8_t *p, size_t len)
{
	Mooncake__Master__MirrorEvent e;
	char name[256];
	int rc = agent__mirror_event_decode(p, len, &e, name, sizeof(name));
	Mooncake__Master__MirrorEvent *ref = mooncake__master__mirror_event__unpack(NULL, len,
										    p);
	pb_check_verdict(rc, ref != NULL);
	if (rc == 0) {
		CHECK(e.op == ref->op && e.seq == ref->seq && e.offset == ref->offset);
		CHECK(e.size == ref->size && e.crc32c == ref->crc32c);
		CHECK(e.checksummed == ref->checksummed && e.soft_pin == ref->soft_pin);
		CHECK(e.source_offset == ref->source_offset &&
		      e.source_address == ref->source_address);
		CHECK(strcmp(e.source_segment, ref->source_segment) == 0);
		CHECK(e.key.len == ref->key.len &&
		      (!e.key.len || memcmp(e.key.data, ref->key.data, e.key.len) == 0));
		size_t room = MASTER_EVENT_MAX_BYTES + e.key.len + strlen(e.source_segment);
		uint8_t *a = malloc(room), *b = malloc(room);
		CHECK(a && b);
		size_t n = master__encode_event(a, &e);
		CHECK(n <= room);
		/* (protobuf-c packs the unknown fields it kept; the master's
		 * events have none) */
		unsigned unknown = ref->base.n_unknown_fields;
		ref->base.n_unknown_fields = 0;
		CHECK(mooncake__master__mirror_event__get_packed_size(ref) == n);
		mooncake__master__mirror_event__pack(ref, b);
		ref->base.n_unknown_fields = unknown;
		CHECK(memcmp(a, b, n) == 0);
		free(a);
		free(b);
	}
	if (ref)
		mooncake__master__mirror_event__free_unpacked(ref, NULL);
}

static void pb_check_commit_item(const uint8_t *p, size_t len)
{
	struct master_commit c;
	int rc = master__decode_commit_item(p, len, &c);
	Mooncake__Master__CommitItem *ref = mooncake__master__commit_item__unpack(NULL, len,
										  p);
	pb_check_verdict(rc, ref != NULL);
	if (rc == 0) {
		CHECK(c.offset == ref->offset && c.size == ref->size && c.crc == ref->crc32c);
		CHECK(c.has_crc == ref->checksummed && c.soft_pin == ref->soft_pin);
		CHECK(c.ttl_ms == ref->ttl_ms && c.promote == ref->promote);
		CHECK(c.klen == ref->key.len &&
		      (!c.klen || memcmp(c.key, ref->key.data, c.klen) == 0));
	}
	if (ref)
		mooncake__master__commit_item__free_unpacked(ref, NULL);
}

static void pb_check_region(const Mooncake__Client__Region *a,
			    const Mooncake__Client__Region *b)
{
	CHECK(!a == !b);
	if (!a)
		return;
	CHECK(a->where == b->where && a->buffer == b->buffer && a->fd_index == b->fd_index);
	CHECK(a->offset == b->offset && a->length == b->length);
}

/* A Request decoded as a put (agent__decode_put_request). */
static void pb_check_put_request(const uint8_t *p, size_t len)
{
	struct mc_pbarena a;
	Mooncake__Client__Request *m = NULL;
	int rc = agent__decode_put_request(p, len, &a, &m);
	Mooncake__Client__Request *ref = mooncake__client__request__unpack(NULL, len, p);
	pb_check_verdict(rc, ref != NULL);
	CHECK(rc != 0 || a.chunks || a.spilled);
	if (rc == 0) {
		CHECK(m->id == ref->id && m->nfds == ref->nfds && m->op_case == ref->op_case);
		CHECK(m->op_case == MOONCAKE__CLIENT__REQUEST__OP_PUT);
		const Mooncake__Client__PutRequest *x = m->put, *y = ref->put;
		CHECK(x->n_items == y->n_items && x->replica_num == y->replica_num);
		CHECK(x->soft_pin == y->soft_pin && x->ttl_ms == y->ttl_ms);
		CHECK(x->upsert == y->upsert && x->tier == y->tier);
		CHECK(strcmp(x->preferred_segment, y->preferred_segment) == 0);
		for (size_t i = 0; i < x->n_items; i++) {
			const Mooncake__Client__PutItem *u = x->items[i], *v = y->items[i];
			CHECK(u->key.len == v->key.len &&
			      (!u->key.len ||
			       memcmp(u->key.data, v->key.data, u->key.len) == 0));
			/* (nothing points into the frame) */
			CHECK(!u->key.len || mc_pbarena_owns(&a, u->key.data));
			pb_check_region(u->source, v->source);
		}
		mc_pb_free(&m->base, &a);
	}
	if (ref)
		mooncake__client__request__free_unpacked(ref, NULL);
}

#endif
