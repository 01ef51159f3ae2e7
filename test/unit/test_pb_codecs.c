/*
 * test_pb_codecs: the hand-written protobuf coding of hot messages, each
 * against protobuf-c. The segment log's events as the master encodes them
 * (master__encode_event: the same bytes as protobuf-c packs) and the
 * agent decodes them (agent__mirror_event_decode), and the commit items
 * the master decodes (master__decode_commit_item), client requests as
 * the agent decodes puts (agent__decode_put_request), and the replies to
 * puts as the agent encodes them (agent__encode_put_response). Decoding
 * (test/fuzz/pb_check.h, which the fuzz target shares): random
 * messages,
 * unknown fields of every wire type, repeated fields (the last wins),
 * fields with another wire type than their own, and every truncation:
 * the same event or the same refusal, and never a read past the bytes.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../fuzz/pb_check.h"
#include "test_rand.h"

static uint64_t rng = TEST_RAND_SEED;

static uint64_t rnd(void)
{
	return test_rand(&rng);
}

/* A random value of a random width (small ones common). */
static uint64_t rvalue(void)
{
	switch (rnd() % 4) {
	case 0:
		return 0;
	case 1:
		return rnd() % 128;
	case 2:
		return rnd() % 100000;
	default:
		return rnd();
	}
}

/* Append a record of field num with wire type wt to out at *n. */
static void put_rec(uint8_t *out, size_t *n, uint64_t num, unsigned wt)
{
	*n += mc_pb_put_varint(out + *n, num << 3 | wt);
	switch (wt) {
	case 0:
		*n += mc_pb_put_varint(out + *n, rvalue());
		break;
	case 1:
		for (int i = 0; i < 8; i++)
			out[(*n)++] = (uint8_t)rnd();
		break;
	case 5:
		for (int i = 0; i < 4; i++)
			out[(*n)++] = (uint8_t)rnd();
		break;
	default: {
		size_t l = rnd() % 40;
		*n += mc_pb_put_varint(out + *n, l);
		for (size_t i = 0; i < l; i++)
			out[(*n)++] = (uint8_t)('a' + rnd() % 26);
	}
	}
}

/* A random key in key (room for 300 bytes); returns its length. */
static size_t random_key(char *key)
{
	size_t kl = rnd() % 5 == 0 ? rnd() % 300 : rnd() % 40;
	for (size_t i = 0; i < kl; i++)
		key[i] = (char)rnd();
	return kl;
}

/* Up to 3 more records after a message of fields 1..nf whose wire types
 * are wt_of[1..nf]: unknown fields of every wire type, and known ones
 * again (the last wins), mostly with their own wire type. */
static void put_extras(uint8_t *wire, size_t *n, const uint8_t *wt_of, unsigned nf)
{
	int extra = (int)(rnd() % 4);
	for (int k = 0; k < extra; k++) {
		static const unsigned wts[] = {0, 1, 2, 5};
		uint64_t num = rnd() % 3 ? nf + 1 + rnd() % 1000 : 1 + rnd() % nf;
		unsigned wt = wts[rnd() % 4];
		if (num <= nf && rnd() % 4)
			wt = wt_of[num];
		put_rec(wire, n, num, wt);
	}
}

/* A random event in *e (its key and source segment in key and seg). */
static void random_fill(Mooncake__Master__MirrorEvent *e_out, char *key, char *seg)
{
	Mooncake__Master__MirrorEvent e = MOONCAKE__MASTER__MIRROR_EVENT__INIT;
	e.op = (Mooncake__Master__MirrorEvent__Op)(rnd() % 3);
	e.seq = rvalue();
	e.key.data = (uint8_t *)key;
	e.key.len = random_key(key);
	e.offset = rvalue();
	e.size = rvalue();
	e.crc32c = (uint32_t)rnd();
	e.checksummed = rnd() % 2;
	e.soft_pin = rnd() % 2;
	size_t sl = rnd() % 3 == 0 ? rnd() % 300 : rnd() % 20;
	for (size_t i = 0; i < sl; i++)
		seg[i] = (char)('a' + rnd() % 26);
	seg[sl] = '\0';
	e.source_segment = seg;
	e.source_offset = rvalue();
	e.source_address = rvalue();
	*e_out = e;
}

/* A random event, packed into out; returns its length. */
static size_t random_event(uint8_t *out, char *key, char *seg)
{
	Mooncake__Master__MirrorEvent e;
	random_fill(&e, key, seg);
	return mooncake__master__mirror_event__pack(&e, out);
}

static void same(const Mooncake__Master__MirrorEvent *a,
		 const Mooncake__Master__MirrorEvent *b)
{
	cr_assert_eq(a->op, b->op);
	cr_assert_eq(a->seq, b->seq);
	cr_assert_eq(a->key.len, b->key.len);
	if (a->key.len)
		cr_assert_eq(memcmp(a->key.data, b->key.data, a->key.len), 0);
	cr_assert_eq(a->offset, b->offset);
	cr_assert_eq(a->size, b->size);
	cr_assert_eq(a->crc32c, b->crc32c);
	cr_assert_eq(a->checksummed, b->checksummed);
	cr_assert_eq(a->soft_pin, b->soft_pin);
	cr_assert_str_eq(a->source_segment, b->source_segment);
	cr_assert_eq(a->source_offset, b->source_offset);
	cr_assert_eq(a->source_address, b->source_address);
}

Test(pb_codecs, decodes_events_as_protobuf_c_does)
{
	uint8_t wire[2048];
	char key[300], seg[301];
	int fast = 0;
	for (int i = 0; i < 3000; i++) {
		static const uint8_t wt_of[] = {8, 0, 0, 2, 0, 0, 5, 0, 0, 2, 0, 0};
		size_t n = random_event(wire, key, seg);
		put_extras(wire, &n, wt_of, 11);
		Mooncake__Master__MirrorEvent e;
		char name[256];
		fast += agent__mirror_event_decode(wire, n, &e, name, sizeof(name)) == 0;
		pb_check_event(wire, n);
	}
	cr_assert_gt(fast, 2000, "most events are decoded here (%d of 3000)", fast);
}

Test(pb_codecs, every_truncation_and_bad_tags_refused_or_left_to_protobuf_c)
{
	uint8_t wire[2048];
	char key[300], seg[301];
	for (int i = 0; i < 200; i++) {
		size_t n = random_event(wire, key, seg);
		for (size_t cut = 0; cut <= n; cut++)
			pb_check_event(wire, cut);
	}
	/* Field 0, a group, a varint of 11 bytes, a length past the end. */
	const uint8_t bad[][12] = {
		{0x08, 0x80},
		{0x0b, 0x0c},
		{0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
		{0x1a, 0x05, 'a', 'b'},
	};
	const size_t lens[] = {2, 2, 12, 4};
	for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++)
		pb_check_event(bad[i], lens[i]);
}

Test(pb_codecs, wrong_wire_type_and_long_names_left_to_protobuf_c)
{
	/* seq (field 2) as fixed32. */
	const uint8_t w1[] = {0x15, 1, 2, 3, 4};
	Mooncake__Master__MirrorEvent e;
	char name[8];
	cr_assert_eq(agent__mirror_event_decode(w1, sizeof(w1), &e, name, sizeof(name)), 1);
	/* A source segment longer than the room for it. */
	const uint8_t w2[] = {0x4a, 8, 'a', 'g', 'e', 'n', 't', '-', '1', '2'};
	cr_assert_eq(agent__mirror_event_decode(w2, sizeof(w2), &e, name, sizeof(name)), 1);
	const uint8_t w3[] = {0x4a, 7, 'a', 'g', 'e', 'n', 't', '-', '1'};
	cr_assert_eq(agent__mirror_event_decode(w3, sizeof(w3), &e, name, sizeof(name)), 0);
	cr_assert_str_eq(e.source_segment, "agent-1");
}

Test(pb_codecs, master_encodes_as_protobuf_c_packs)
{
	uint8_t a[2048], b[2048];
	char key[300], seg[301];
	for (int i = 0; i < 5000; i++) {
		Mooncake__Master__MirrorEvent e;
		random_fill(&e, key, seg);
		if (rnd() % 4 == 0)
			e.op = (Mooncake__Master__MirrorEvent__Op)-1; /* (10-byte varint) */
		size_t n = master__encode_event(a, &e);
		cr_assert_leq(n,
			      MASTER_EVENT_MAX_BYTES + e.key.len + strlen(e.source_segment));
		size_t m = mooncake__master__mirror_event__pack(&e, b);
		cr_assert_eq(n, m, "event %d: %zu bytes, protobuf-c %zu", i, n, m);
		cr_assert_eq(memcmp(a, b, n), 0, "event %d differs", i);
		/* And back, through the agent's decoder. */
		Mooncake__Master__MirrorEvent d;
		char name[256];
		int rc = agent__mirror_event_decode(a, n, &d, name, sizeof(name));
		if (strlen(e.source_segment) < sizeof(name)) {
			cr_assert_eq(rc, 0);
			same(&e, &d);
		} else {
			cr_assert_eq(rc, 1);
		}
	}
}

Test(pb_codecs, master_decodes_commit_items_as_protobuf_c_does)
{
	uint8_t wire[2048];
	char key[300];
	int fast = 0;
	for (int i = 0; i < 3000; i++) {
		Mooncake__Master__CommitItem it = MOONCAKE__MASTER__COMMIT_ITEM__INIT;
		it.key.data = (uint8_t *)key;
		it.key.len = random_key(key);
		it.offset = rvalue();
		it.size = rvalue();
		it.crc32c = (uint32_t)rnd();
		it.checksummed = rnd() % 2;
		it.soft_pin = rnd() % 2;
		it.ttl_ms = rvalue();
		it.promote = rnd() % 2;
		static const uint8_t wt_of[] = {8, 2, 0, 0, 5, 0, 0, 0, 0};
		size_t n = mooncake__master__commit_item__pack(&it, wire);
		put_extras(wire, &n, wt_of, 8);
		struct master_commit c;
		fast += master__decode_commit_item(wire, n, &c) == 0;
		pb_check_commit_item(wire, n);
		if (i < 200)
			for (size_t cut = 0; cut < n; cut++)
				pb_check_commit_item(wire, cut);
	}
	cr_assert_gt(fast, 2000, "most items are decoded here (%d of 3000)", fast);
}

Test(pb_codecs, agent_decodes_put_requests_as_protobuf_c_does)
{
	static uint8_t wire[1 << 16];
	char keys[8][300], seg[64];
	int fast = 0;
	for (int i = 0; i < 2000; i++) {
		Mooncake__Client__Region g[8];
		Mooncake__Client__PutItem it[8], *items[8];
		size_t n = rnd() % 9;
		for (size_t k = 0; k < n; k++) {
			mooncake__client__region__init(&g[k]);
			g[k].where = (Mooncake__Client__Region__Where)(rnd() % 3);
			g[k].buffer = rvalue();
			g[k].fd_index = (uint32_t)rvalue();
			g[k].offset = rvalue();
			g[k].length = rvalue();
			mooncake__client__put_item__init(&it[k]);
			it[k].key.data = (uint8_t *)keys[k];
			it[k].key.len = random_key(keys[k]);
			it[k].source = rnd() % 8 ? &g[k] : NULL;
			items[k] = &it[k];
		}
		Mooncake__Client__PutRequest q = MOONCAKE__CLIENT__PUT_REQUEST__INIT;
		q.items = items;
		q.n_items = n;
		q.replica_num = (uint32_t)rvalue();
		q.soft_pin = rnd() % 2;
		q.ttl_ms = rvalue();
		size_t sl = rnd() % 3 ? 0 : rnd() % 40;
		for (size_t j = 0; j < sl; j++)
			seg[j] = (char)('a' + rnd() % 26);
		seg[sl] = '\0';
		q.preferred_segment = seg;
		q.upsert = rnd() % 2;
		q.tier = (uint32_t)(rnd() % 3);
		Mooncake__Client__Request m = MOONCAKE__CLIENT__REQUEST__INIT;
		m.id = rvalue();
		m.nfds = (uint32_t)(rnd() % 3);
		m.op_case = MOONCAKE__CLIENT__REQUEST__OP_PUT;
		m.put = &q;
		if (rnd() % 10 == 0) { /* another op: protobuf-c's */
			m.op_case = MOONCAKE__CLIENT__REQUEST__OP_STATS;
			static Mooncake__Client__Empty e = MOONCAKE__CLIENT__EMPTY__INIT;
			m.stats = &e;
		}
		size_t len = mooncake__client__request__pack(&m, wire);
		int extra = (int)(rnd() % 3);
		for (int k = 0; k < extra; k++) {
			static const unsigned wts[] = {0, 1, 2, 5};
			put_rec(wire, &len, rnd() % 2 ? 3 + rnd() % 7 : 26 + rnd() % 1000,
				wts[rnd() % 4]);
		}
		struct mc_pbarena a;
		Mooncake__Client__Request *d = NULL;
		if (agent__decode_put_request(wire, len, &a, &d) == 0) {
			fast++;
			mc_pb_free(&d->base, &a);
		}
		pb_check_put_request(wire, len);
		if (i < 100)
			for (size_t cut = 0; cut < len; cut++)
				pb_check_put_request(wire, cut);
	}
	cr_assert_gt(fast, 1400, "most puts are decoded here (%d of 2000)", fast);
}

Test(pb_codecs, a_put_of_empty_items_is_bounded_decoded)
{
	/* A 16 MiB frame of empty items ("0a 00") would be 8M structs. */
	size_t plen = (16u << 20) - 16 - 1;
	plen -= plen % 2;
	uint8_t *w = malloc(plen + 16);
	cr_assert(w);
	size_t at = 0;
	w[at++] = 11 << 3 | 2; /* put */
	at += mc_pb_put_varint(w + at, plen);
	for (size_t i = 0; i < plen; i += 2) {
		w[at++] = 0x0a;
		w[at++] = 0x00;
	}
	struct mc_pbarena a;
	Mooncake__Client__Request *m = NULL;
	cr_assert_eq(agent__decode_put_request(w, at, &a, &m), -ENOMEM);
	cr_assert_null(a.chunks, "nothing held");
	/* protobuf-c under the same bound (the agent's other path). */
	cr_assert_null(mc_pb_unpack(&mooncake__client__request__descriptor, at, w,
				    AGENT_MAX_DECODED_BYTES, &a));
	cr_assert_null(a.chunks);
	free(w);
}

Test(pb_codecs, agent_encodes_put_replies_as_protobuf_c_packs)
{
	static uint8_t a[AGENT_PUT_RESPONSE_MAX(600)], b[sizeof(a)];
	int32_t errs[600];
	for (int i = 0; i < 5000; i++) {
		Mooncake__Client__Response r = MOONCAKE__CLIENT__RESPONSE__INIT;
		Mooncake__Client__PutReply p = MOONCAKE__CLIENT__PUT_REPLY__INIT;
		r.id = i % 3 ? rvalue() : 0;
		r.error = i % 5 ? 0 : (int32_t)rnd();
		r.nfds = i % 7 ? 0 : (uint32_t)(rnd() % 8);
		r.body_case = MOONCAKE__CLIENT__RESPONSE__BODY_PUT;
		r.put = &p;
		p.n_errors = i % 4 ? rnd() % 40 : rnd() % 600;
		for (size_t k = 0; k < p.n_errors; k++)
			errs[k] = k % 3       ? 0
				  : rnd() % 2 ? -(int32_t)(rnd() % 2000)
					      : (int32_t)rnd();
		p.errors = errs;
		size_t n = agent__encode_put_response(a, &r);
		cr_assert_gt(n, 0);
		cr_assert_leq(n, AGENT_PUT_RESPONSE_MAX(p.n_errors));
		size_t m = mooncake__client__response__pack(&r, b);
		cr_assert_eq(n, m, "reply %d: %zu bytes, protobuf-c %zu", i, n, m);
		cr_assert_eq(memcmp(a, b, n), 0, "reply %d differs", i);
	}
	/* Not its kind: left to protobuf-c. */
	Mooncake__Client__Response r = MOONCAKE__CLIENT__RESPONSE__INIT;
	cr_assert_eq(agent__encode_put_response(a, &r), 0, "no body");
	Mooncake__Client__PutReply p = MOONCAKE__CLIENT__PUT_REPLY__INIT;
	r.body_case = MOONCAKE__CLIENT__RESPONSE__BODY_PUT;
	r.put = &p;
	r.message = "why";
	cr_assert_eq(agent__encode_put_response(a, &r), 0, "a message");
	r.message = "";
	cr_assert_gt(agent__encode_put_response(a, &r), 0, "an empty message is none");
}

Test(pb_codecs, agent_encodes_commit_items_as_protobuf_c_packs)
{
	static uint8_t a[AGENT_COMMIT_ITEM_MAX(300) * 8], b[sizeof(a)];
	char keys[8][300];
	Mooncake__Master__CommitItem items[8], *ptrs[8];
	ProtobufCBinaryData raw[8];
	for (int i = 0; i < 3000; i++) {
		size_t n = 1 + rnd() % 8, used = 0;
		for (size_t k = 0; k < n; k++) {
			Mooncake__Master__CommitItem *it = &items[k];
			mooncake__master__commit_item__init(it);
			it->key.data = (uint8_t *)keys[k];
			it->key.len = random_key(keys[k]);
			it->offset = rvalue();
			it->size = rvalue();
			it->crc32c = rnd() % 3 ? (uint32_t)rnd() : 0;
			it->checksummed = rnd() % 2;
			it->soft_pin = rnd() % 2;
			it->ttl_ms = rvalue();
			it->promote = rnd() % 2;
			ptrs[k] = it;
			size_t l = agent__encode_commit_item(a + used, it);
			cr_assert_leq(l, AGENT_COMMIT_ITEM_MAX(it->key.len));
			size_t m = mooncake__master__commit_item__pack(it, b);
			cr_assert_eq(l, m, "item %d: %zu bytes, protobuf-c %zu", i, l, m);
			cr_assert_eq(memcmp(a + used, b, l), 0, "item %d differs", i);
			/* And back, through the master's decoder. */
			struct master_commit c;
			cr_assert_eq(master__decode_commit_item(a + used, l, &c), 0);
			cr_assert_eq(c.klen, it->key.len);
			cr_assert(c.klen == 0 || memcmp(c.key, it->key.data, c.klen) == 0);
			cr_assert(c.offset == it->offset && c.size == it->size &&
				  c.ttl_ms == it->ttl_ms && c.crc == it->crc32c);
			cr_assert(c.has_crc == it->checksummed && c.soft_pin == it->soft_pin &&
				  c.promote == it->promote);
			raw[k].data = a + used;
			raw[k].len = l;
			used += l;
		}
		/* The raw request the agent sends is the request's encoding. */
		Mooncake__Master__BatchCommitRequest req =
			MOONCAKE__MASTER__BATCH_COMMIT_REQUEST__INIT;
		Mooncake__Master__BatchCommitRequestRaw rr =
			MOONCAKE__MASTER__BATCH_COMMIT_REQUEST_RAW__INIT;
		req.agent_id = rr.agent_id = "agent-7";
		req.segment = rr.segment = i % 2 ? "agent-7" : "agent-8";
		req.lease_epoch = rr.lease_epoch = rvalue();
		req.items = ptrs;
		req.n_items = n;
		rr.items = raw;
		rr.n_items = n;
		static uint8_t wa[sizeof(a) + 64], wb[sizeof(wa)];
		size_t la = mooncake__master__batch_commit_request_raw__pack(&rr, wa);
		size_t lb = mooncake__master__batch_commit_request__pack(&req, wb);
		cr_assert_eq(la, lb);
		cr_assert_eq(memcmp(wa, wb, la), 0, "request %d differs", i);
	}
}

/* A put followed by any other field of the Request: another op (the last
 * of a oneof wins), or a field of the wrong wire type (refused), is
 * protobuf-c's to decide, whatever fields the Request has gained since
 * the decoder was written: it must never decode such a request as a put. */
Test(pb_codecs, every_other_field_after_a_put_is_left_to_protobuf_c)
{
	const ProtobufCMessageDescriptor *d = &mooncake__client__request__descriptor;
	unsigned ops = 0;
	for (unsigned i = 0; i < d->n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &d->fields[i];
		if (f->id == 11)
			continue;
		for (int wt = 0; wt <= 2; wt += 2) {
			/* put { items { key: "k" } }, then field f. */
			uint8_t wire[32];
			size_t n = 0;
			wire[n++] = 0x5a;
			wire[n++] = 5;
			wire[n++] = 0x0a;
			wire[n++] = 3;
			wire[n++] = 0x0a;
			wire[n++] = 1;
			wire[n++] = 'k';
			n += mc_pb_put_tag(wire + n, f->id, (unsigned)wt);
			wire[n++] = 0;
			Mooncake__Client__Request *ref = mooncake__client__request__unpack(
				NULL, n, wire);
			struct mc_pbarena a;
			Mooncake__Client__Request *m = NULL;
			int rc = agent__decode_put_request(wire, n, &a, &m);
			if (rc == 0) {
				cr_assert_not_null(
					ref,
					"field %u (wire type %d): decoded, protobuf-c refuses",
					f->id, wt);
				cr_assert_eq(
					ref->op_case, MOONCAKE__CLIENT__REQUEST__OP_PUT,
					"field %u: decoded as a put, protobuf-c says op %d",
					f->id, ref->op_case);
				cr_assert_eq(m->id, ref->id);
				mc_pbarena_release(&a);
			}
			ops += f->type == PROTOBUF_C_TYPE_MESSAGE && wt == 2 && ref &&
			       ref->op_case != MOONCAKE__CLIENT__REQUEST__OP_PUT;
			if (ref)
				mooncake__client__request__free_unpacked(ref, NULL);
		}
	}
	cr_assert_geq(ops, 16, "the other ops were tried (%u)", ops);
	/* And the input fuzz_pb_codecs found (field 26 of the wrong type). */
	static const uint8_t found[] = {0x5a, 2, 0x20, 0x12, 0xd0, 0x01, 0x00};
	pb_check_put_request(found, sizeof(found));
}

/* The hand codecs know every field of the messages they code: a field
 * added to one of these messages must be taught to its codec (a decoder
 * would skip it as unknown, an encoder leave it out), then this list. */
Test(pb_codecs, hand_codecs_know_every_field_of_their_messages)
{
	static const struct {
		const ProtobufCMessageDescriptor *d;
		unsigned last;
		const char *codec;
	} known[] = {
		{&mooncake__client__request__descriptor, 26, "agent__decode_put_request"},
		{&mooncake__client__put_request__descriptor, 7, "decode_put (agent/req.c)"},
		{&mooncake__client__put_item__descriptor, 2, "decode_item (agent/req.c)"},
		{&mooncake__client__region__descriptor, 5, "decode_region (agent/req.c)"},
		{&mooncake__client__response__descriptor, 20, "agent__encode_put_response"},
		{&mooncake__client__put_reply__descriptor, 1, "agent__encode_put_response"},
		{&mooncake__master__mirror_event__descriptor, 11,
		 "agent__mirror_event_decode and master__encode_event"},
		{&mooncake__master__commit_item__descriptor, 8,
		 "master__decode_commit_item and agent__encode_commit_item"},
	};
	for (size_t k = 0; k < sizeof(known) / sizeof(known[0]); k++) {
		unsigned last = 0;
		for (unsigned i = 0; i < known[k].d->n_fields; i++)
			if (known[k].d->fields[i].id > last)
				last = known[k].d->fields[i].id;
		cr_assert_eq(last, known[k].last, "%s has a field %u: teach it to %s",
			     known[k].d->name, last, known[k].codec);
	}
}
