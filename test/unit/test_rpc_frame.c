/*
 * test_rpc_frame: the pure gRPC framing in src/rpc/frame.c — the
 * deframer across every chunk split, limits, flags, empty messages, the
 * prefix, grpc-timeout in both directions and percent-encoding; and the
 * nesting check that runs before protobuf-c unpacks a message.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "diag.pb-c.h"
#include "etcd_rpc.pb-c.h"
#include "raft.pb-c.h"
#include "rpc/rpc.h"
#include "rpc/rpc_int.h"

struct got {
	size_t n;
	size_t lens[64];
	uint8_t data[64][300];
	int stop_after; /* return -EINTR after this many messages (0: never) */
};

static int on_msg(void *ud, const uint8_t *body, size_t len)
{
	struct got *g = ud;
	cr_assert(g->n < 64);
	cr_assert(len <= sizeof(g->data[0]));
	g->lens[g->n] = len;
	memcpy(g->data[g->n], body, len);
	g->n++;
	if (g->stop_after && (int)g->n == g->stop_after)
		return -EINTR;
	return 0;
}

/* A stream of messages with lengths 0, 1, 2, 17, 255 and 300. */
static size_t build_stream(uint8_t *out, const size_t *lens, size_t nlens)
{
	size_t o = 0;
	for (size_t m = 0; m < nlens; m++) {
		rpc_frame_prefix(out + o, (uint32_t)lens[m]);
		o += 5;
		for (size_t i = 0; i < lens[m]; i++)
			out[o++] = (uint8_t)(m * 31 + i);
	}
	return o;
}

static void check_got(const struct got *g, const size_t *lens, size_t nlens)
{
	cr_assert_eq(g->n, nlens);
	for (size_t m = 0; m < nlens; m++) {
		cr_assert_eq(g->lens[m], lens[m], "message %zu", m);
		for (size_t i = 0; i < lens[m]; i++)
			cr_assert_eq(g->data[m][i], (uint8_t)(m * 31 + i));
	}
}

Test(rpc_frame, prefix_encoding)
{
	uint8_t p[5];
	rpc_frame_prefix(p, 0);
	cr_assert(memcmp(p, "\0\0\0\0\0", 5) == 0);
	rpc_frame_prefix(p, 0x01020304);
	uint8_t want[5] = {0, 1, 2, 3, 4};
	cr_assert(memcmp(p, want, 5) == 0);
	rpc_frame_prefix(p, 0xffffffffu);
	uint8_t want2[5] = {0, 0xff, 0xff, 0xff, 0xff};
	cr_assert(memcmp(p, want2, 5) == 0);
}

Test(rpc_frame, whole_stream_at_once)
{
	static const size_t lens[] = {0, 1, 2, 17, 255, 300, 0};
	uint8_t buf[2048];
	size_t n = build_stream(buf, lens, 7);
	struct rpc_deframer d;
	struct got g = {0};
	rpc_deframer_init(&d, 1000);
	cr_assert_eq(rpc_deframer_feed(&d, buf, n, on_msg, &g), 0);
	check_got(&g, lens, 7);
	cr_assert(rpc_deframer_idle(&d));
	rpc_deframer_free(&d);
}

Test(rpc_frame, every_two_way_split)
{
	static const size_t lens[] = {3, 0, 40, 1, 0};
	uint8_t buf[512];
	size_t n = build_stream(buf, lens, 5);
	for (size_t cut = 0; cut <= n; cut++) {
		struct rpc_deframer d;
		struct got g = {0};
		rpc_deframer_init(&d, 100);
		cr_assert_eq(rpc_deframer_feed(&d, buf, cut, on_msg, &g), 0);
		cr_assert_eq(rpc_deframer_feed(&d, buf + cut, n - cut, on_msg, &g), 0);
		check_got(&g, lens, 5);
		cr_assert(rpc_deframer_idle(&d));
		rpc_deframer_free(&d);
	}
}

Test(rpc_frame, byte_at_a_time_and_random_chunks)
{
	static const size_t lens[] = {0, 1, 2, 17, 255, 300, 5, 0, 9};
	uint8_t buf[4096];
	size_t n = build_stream(buf, lens, 9);
	unsigned seed = 12345;
	for (int round = 0; round < 200; round++) {
		struct rpc_deframer d;
		struct got g = {0};
		rpc_deframer_init(&d, 300);
		size_t off = 0;
		while (off < n) {
			size_t step = round == 0 ? 1 : 1 + (size_t)(rand_r(&seed) % 64);
			if (step > n - off)
				step = n - off;
			cr_assert_eq(rpc_deframer_feed(&d, buf + off, step, on_msg, &g), 0);
			off += step;
			/* Idle exactly at message boundaries. */
		}
		check_got(&g, lens, 9);
		cr_assert(rpc_deframer_idle(&d));
		rpc_deframer_free(&d);
	}
}

Test(rpc_frame, idle_reflects_partial_state)
{
	uint8_t buf[16];
	size_t lens[] = {4};
	build_stream(buf, lens, 1);
	struct rpc_deframer d;
	struct got g = {0};
	rpc_deframer_init(&d, 100);
	cr_assert(rpc_deframer_idle(&d));
	cr_assert_eq(rpc_deframer_feed(&d, buf, 3, on_msg, &g), 0);
	cr_assert_not(rpc_deframer_idle(&d));
	cr_assert_eq(rpc_deframer_feed(&d, buf + 3, 4, on_msg, &g), 0);
	cr_assert_not(rpc_deframer_idle(&d));
	cr_assert_eq(g.n, 0);
	cr_assert_eq(rpc_deframer_feed(&d, buf + 7, 2, on_msg, &g), 0);
	cr_assert(rpc_deframer_idle(&d));
	cr_assert_eq(g.n, 1);
	rpc_deframer_free(&d);
}

Test(rpc_frame, max_size_enforced_from_the_prefix)
{
	struct rpc_deframer d;
	struct got g = {0};
	uint8_t p[5];
	rpc_deframer_init(&d, 100);
	rpc_frame_prefix(p, 100); /* exactly the maximum: fine */
	cr_assert_eq(rpc_deframer_feed(&d, p, 5, on_msg, &g), 0);
	rpc_deframer_free(&d);

	rpc_deframer_init(&d, 100);
	rpc_frame_prefix(p, 101);
	/* Refused as soon as the length is known, before any body. */
	cr_assert_eq(rpc_deframer_feed(&d, p, 4, on_msg, &g), 0);
	cr_assert_eq(rpc_deframer_feed(&d, p + 4, 1, on_msg, &g), MC_ETOO_LARGE);
	rpc_deframer_free(&d);

	rpc_deframer_init(&d, 1u << 20);
	rpc_frame_prefix(p, 0xffffffffu);
	cr_assert_eq(rpc_deframer_feed(&d, p, 5, on_msg, &g), MC_ETOO_LARGE);
	rpc_deframer_free(&d);
	cr_assert_eq(g.n, 0);
}

Test(rpc_frame, compressed_and_reserved_flags_rejected)
{
	struct rpc_deframer d;
	struct got g = {0};
	uint8_t p[6] = {1, 0, 0, 0, 1, 'x'};
	rpc_deframer_init(&d, 100);
	cr_assert_eq(rpc_deframer_feed(&d, p, 6, on_msg, &g), -EPROTO);
	rpc_deframer_free(&d);
	uint8_t q[6] = {0x80, 0, 0, 0, 1, 'x'};
	rpc_deframer_init(&d, 100);
	cr_assert_eq(rpc_deframer_feed(&d, q, 6, on_msg, &g), -EPROTO);
	rpc_deframer_free(&d);
	cr_assert_eq(g.n, 0);
}

Test(rpc_frame, zero_length_messages)
{
	uint8_t buf[15] = {0};
	struct rpc_deframer d;
	struct got g = {0};
	rpc_deframer_init(&d, 0); /* even with a zero maximum */
	cr_assert_eq(rpc_deframer_feed(&d, buf, 15, on_msg, &g), 0);
	cr_assert_eq(g.n, 3);
	cr_assert_eq(g.lens[0] + g.lens[1] + g.lens[2], 0);
	rpc_deframer_free(&d);
}

Test(rpc_frame, callback_error_stops_and_is_returned)
{
	static const size_t lens[] = {1, 2, 3};
	uint8_t buf[64];
	size_t n = build_stream(buf, lens, 3);
	struct rpc_deframer d;
	struct got g = {.stop_after = 2};
	rpc_deframer_init(&d, 100);
	cr_assert_eq(rpc_deframer_feed(&d, buf, n, on_msg, &g), -EINTR);
	cr_assert_eq(g.n, 2);
	rpc_deframer_free(&d);
	/* Same when the body had to be buffered. */
	struct got g2 = {.stop_after = 1};
	rpc_deframer_init(&d, 100);
	cr_assert_eq(rpc_deframer_feed(&d, buf, 3, on_msg, &g2), 0);
	cr_assert_eq(rpc_deframer_feed(&d, buf + 3, n - 3, on_msg, &g2), -EINTR);
	cr_assert_eq(g2.n, 1);
	rpc_deframer_free(&d);
}

Test(rpc_frame, free_mid_message_releases_buffer)
{
	uint8_t buf[64];
	size_t lens[] = {50};
	build_stream(buf, lens, 1);
	struct rpc_deframer d;
	struct got g = {0};
	rpc_deframer_init(&d, 100);
	cr_assert_eq(rpc_deframer_feed(&d, buf, 20, on_msg, &g), 0);
	cr_assert_not_null(d.msg);
	rpc_deframer_free(&d); /* ASan/valgrind would flag a leak */
	cr_assert_null(d.msg);
}

/* ---------------------------------------------------------------- grpc-timeout */

Test(rpc_frame, timeout_parse_every_unit)
{
	uint64_t ms;
	cr_assert_eq(rpc_timeout_parse("1H", &ms), 0);
	cr_assert_eq(ms, 3600000);
	cr_assert_eq(rpc_timeout_parse("2M", &ms), 0);
	cr_assert_eq(ms, 120000);
	cr_assert_eq(rpc_timeout_parse("5S", &ms), 0);
	cr_assert_eq(ms, 5000);
	cr_assert_eq(rpc_timeout_parse("100m", &ms), 0);
	cr_assert_eq(ms, 100);
	cr_assert_eq(rpc_timeout_parse("1500u", &ms), 0);
	cr_assert_eq(ms, 2); /* rounded up */
	cr_assert_eq(rpc_timeout_parse("1000u", &ms), 0);
	cr_assert_eq(ms, 1);
	cr_assert_eq(rpc_timeout_parse("1n", &ms), 0);
	cr_assert_eq(ms, 1);
	cr_assert_eq(rpc_timeout_parse("2000000n", &ms), 0);
	cr_assert_eq(ms, 2);
	cr_assert_eq(rpc_timeout_parse("0m", &ms), 0);
	cr_assert_eq(ms, 0);
	cr_assert_eq(rpc_timeout_parse("99999999H", &ms), 0);
	cr_assert_eq(ms, 99999999ull * 3600000ull);
	cr_assert_eq(rpc_timeout_parse("00000001S", &ms), 0);
	cr_assert_eq(ms, 1000);
}

Test(rpc_frame, timeout_parse_bad_values)
{
	static const char *bad[] = {
		"",     "m",   "10",         "10x", "10 m",  " 10m", "10m ",
		"-1m",  "+1m", "123456789m", /* 9 digits */
		"1.5S", "1mm", "1h",         "1s",  "0x10m", "10M0", "1Hm",
	};
	uint64_t ms = 42;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		cr_assert_eq(rpc_timeout_parse(bad[i], &ms), -EINVAL, "\"%s\"", bad[i]);
	cr_assert_eq(rpc_timeout_parse(NULL, &ms), -EINVAL);
}

Test(rpc_frame, timeout_format_and_round_trip)
{
	char b[32];
	rpc_timeout_format(0, b, sizeof(b));
	cr_assert_str_eq(b, "0m");
	rpc_timeout_format(1500, b, sizeof(b));
	cr_assert_str_eq(b, "1500m");
	rpc_timeout_format(99999999, b, sizeof(b));
	cr_assert_str_eq(b, "99999999m");
	rpc_timeout_format(100000000, b, sizeof(b));
	cr_assert_str_eq(b, "100000S");
	rpc_timeout_format(100000001, b, sizeof(b));
	cr_assert_str_eq(b, "100001S"); /* rounded up, never shorter */
	rpc_timeout_format(99999999ull * 1000 + 1, b, sizeof(b));
	cr_assert_str_eq(b, "1666667M");
	rpc_timeout_format(UINT64_MAX / 2, b, sizeof(b));
	cr_assert_str_eq(b, "99999999H");
	rpc_timeout_format(1500, b, 4); /* cut to fit, as snprintf would */
	cr_assert_str_eq(b, "150");
	b[0] = 'x';
	rpc_timeout_format(1500, b, 0);
	cr_assert_eq(b[0], 'x');
	static const uint64_t vals[] = {1, 7, 999, 1000, 60000, 3600000, 12345678, 400000000};
	for (size_t i = 0; i < sizeof(vals) / sizeof(vals[0]); i++) {
		uint64_t ms;
		rpc_timeout_format(vals[i], b, sizeof(b));
		cr_assert(strlen(b) <= 9);
		cr_assert_eq(rpc_timeout_parse(b, &ms), 0, "%s", b);
		cr_assert_geq(ms, vals[i], "%s", b);
	}
}

/* ---------------------------------------------------------------- percent */

Test(rpc_frame, percent_encode)
{
	char out[128];
	rpc_percent_encode("plain text ~!", out, sizeof(out));
	cr_assert_str_eq(out, "plain text ~!");
	rpc_percent_encode("100% \"sure\"", out, sizeof(out));
	cr_assert_str_eq(out, "100%25 \"sure\"");
	rpc_percent_encode("a\nb\tc\x7f", out, sizeof(out));
	cr_assert_str_eq(out, "a%0Ab%09c%7F");
	rpc_percent_encode("caf\xc3\xa9", out, sizeof(out));
	cr_assert_str_eq(out, "caf%C3%A9");
	rpc_percent_encode("", out, sizeof(out));
	cr_assert_str_eq(out, "");
	/* Truncation never splits an escape. */
	rpc_percent_encode("ab\n", out, 5);
	cr_assert_str_eq(out, "ab");
	rpc_percent_encode("ab\n", out, 6);
	cr_assert_str_eq(out, "ab%0A");
}

Test(rpc_frame, percent_decode)
{
	char out[128];
	rpc_percent_decode("100%25 sure%0A", out, sizeof(out));
	cr_assert_str_eq(out, "100% sure\n");
	rpc_percent_decode("caf%c3%A9", out, sizeof(out));
	cr_assert_str_eq(out, "caf\xc3\xa9");
	/* Malformed escapes pass through. */
	rpc_percent_decode("50% off %zz %4", out, sizeof(out));
	cr_assert_str_eq(out, "50% off %zz %4");
	rpc_percent_decode("abcdef", out, 4);
	cr_assert_str_eq(out, "abc");
	const char *samples[] = {"x", "%%%", "tab\there", "\x01\x02\xff", "ok: all good"};
	for (size_t i = 0; i < 5; i++) {
		char enc[64], dec[64];
		rpc_percent_encode(samples[i], enc, sizeof(enc));
		for (const char *p = enc; *p; p++)
			cr_assert(*p >= 0x20 && *p <= 0x7e);
		rpc_percent_decode(enc, dec, sizeof(dec));
		cr_assert_str_eq(dec, samples[i]);
	}
}

Test(rpc_frame, status_names)
{
	cr_assert_str_eq(rpc_status_name(RPC_OK), "OK");
	cr_assert_str_eq(rpc_status_name(RPC_DEADLINE_EXCEEDED), "DEADLINE_EXCEEDED");
	cr_assert_str_eq(rpc_status_name(RPC_UNAUTHENTICATED), "UNAUTHENTICATED");
	cr_assert_str_eq(rpc_status_name(17), "UNKNOWN");
	cr_assert_str_eq(rpc_status_name(-1), "UNKNOWN");
}

struct pool {
	int allocs, releases;
	size_t last_len, prev_len; /* the last two buffers' sizes */
};

static void *pool_alloc(void *ctx, size_t len, size_t *cap)
{
	struct pool *p = ctx;
	cr_assert_leq(*cap, len);
	p->allocs++;
	p->prev_len = p->last_len;
	p->last_len = *cap;
	return malloc(*cap);
}

static void pool_release(void *ctx, void *ptr, size_t len)
{
	struct pool *p = ctx;
	/* (A growing body releases the buffer before the last.) */
	cr_assert(len == p->last_len || len == p->prev_len, "%zu", len);
	p->releases++;
	free(ptr);
}

Test(rpc_frame, body_buffers_from_the_callers_hooks)
{
	static const size_t lens[] = {40, 2, 100};
	uint8_t buf[512];
	size_t n = build_stream(buf, lens, 3);
	struct rpc_deframer d;
	struct got g = {0};
	struct pool p = {0};
	rpc_deframer_init(&d, 1000);
	d.alloc = pool_alloc;
	d.release = pool_release;
	d.alloc_ctx = &p;
	for (size_t i = 0; i < n; i += 7)
		cr_assert_eq(rpc_deframer_feed(&d, buf + i, n - i < 7 ? n - i : 7, on_msg, &g),
			     0);
	check_got(&g, lens, 3);
	cr_assert_eq(p.allocs, 2); /* the 2-byte body came whole: no buffer */
	cr_assert_eq(p.releases, 2);
	/* A partial body is released through the hook too. */
	cr_assert_eq(rpc_deframer_feed(&d, buf, 20, on_msg, &g), 0);
	rpc_deframer_free(&d);
	cr_assert_eq(p.allocs, 3);
	cr_assert_eq(p.releases, 3);
}

/* A large body: its pattern checked on arrival, its length kept. */
struct big {
	size_t n, len;
	bool ok;
};

static int on_big(void *ud, const uint8_t *body, size_t len)
{
	struct big *b = ud;
	b->n++;
	b->len = len;
	b->ok = true;
	for (size_t i = 0; i < len; i++)
		b->ok &= body[i] == (uint8_t)(i * 7);
	return 0;
}

/* A body's buffer grows with what came, never past the declared length,
 * through the caller's hooks and without them, and bytes read into the
 * room (as conn.c does) are not moved: a peer that declares 3 MB and
 * sends one byte holds 64 KiB, not 3 MB. */
Test(rpc_frame, a_body_grows_with_the_bytes_that_came)
{
	const size_t len = 3 * 1000 * 1000;
	uint8_t *msg = malloc(5 + len);
	cr_assert_not_null(msg);
	rpc_frame_prefix(msg, (uint32_t)len);
	for (size_t i = 0; i < len; i++)
		msg[5 + i] = (uint8_t)(i * 7);
	for (int hooks = 0; hooks < 2; hooks++) {
		struct rpc_deframer d;
		struct pool p = {0};
		struct big b = {0};
		rpc_deframer_init(&d, len);
		if (hooks) {
			d.alloc = pool_alloc;
			d.release = pool_release;
			d.alloc_ctx = &p;
		}
		size_t room;
		cr_assert_eq(rpc_deframer_feed(&d, msg, 5, on_big, &b), 0);
		cr_assert_null(rpc_deframer_room(&d, &room), "no buffer before a byte");
		cr_assert_eq(d.msg_cap, 0);
		cr_assert_eq(rpc_deframer_feed(&d, msg + 5, 1, on_big, &b), 0);
		cr_assert_eq(d.msg_cap, RPC_DEFRAMER_FIRST_CAP);
		size_t at = 6, caps[8], ncaps = 0;
		caps[ncaps++] = d.msg_cap;
		while (at < 5 + len) {
			/* Fill the room in place, then one chunk from outside. */
			uint8_t *r = rpc_deframer_room(&d, &room);
			if (r) {
				memcpy(r, msg + at, room);
				cr_assert_eq(rpc_deframer_feed(&d, r, room, on_big, &b), 0);
				at += room;
				continue;
			}
			size_t k = MC_MIN((size_t)1000, 5 + len - at);
			cr_assert_eq(rpc_deframer_feed(&d, msg + at, k, on_big, &b), 0);
			at += k;
			if (d.msg && d.msg_cap != caps[ncaps - 1]) {
				cr_assert_lt(ncaps, 8);
				caps[ncaps++] = d.msg_cap;
			}
		}
		cr_assert_eq(b.n, 1);
		cr_assert_eq(b.len, len);
		cr_assert(b.ok, "every byte where it belongs");
		/* 64 KiB, 256 KiB, 1 MiB, then the length. */
		cr_assert_eq(ncaps, 4);
		cr_assert_eq(caps[1], RPC_DEFRAMER_FIRST_CAP * RPC_DEFRAMER_GROWTH);
		cr_assert_eq(caps[3], len);
		if (hooks)
			cr_assert_eq(p.releases, p.allocs);
		rpc_deframer_free(&d);
	}
	free(msg);
}

/* ---------------------------------------------------------------- nesting */

/* Wrap body as a length-delimited field (one-byte tag). */
static size_t wrap(uint8_t *buf, size_t len, uint8_t tag)
{
	uint8_t hdr[12];
	size_t h = 0;
	hdr[h++] = tag;
	size_t n = len;
	do {
		hdr[h++] = (uint8_t)((n & 0x7f) | (n > 0x7f ? 0x80 : 0));
		n >>= 7;
	} while (n);
	memmove(buf + h, buf, len);
	memcpy(buf, hdr, h);
	return len + h;
}

/* A TxnRequest nested levels deep: success[0] = RequestOp{request_txn}. */
static size_t nested_txn(uint8_t *buf, unsigned levels)
{
	size_t len = 0;
	for (unsigned i = 0; i < levels; i++) {
		len = wrap(buf, len, 0x22); /* RequestOp.request_txn = 4 */
		len = wrap(buf, len, 0x12); /* TxnRequest.success = 2 */
	}
	return len;
}

Test(rpc_frame, nesting_limit_before_unpack)
{
	static uint8_t buf[1 << 16];
	const ProtobufCMessageDescriptor *d = &etcdserverpb__txn_request__descriptor;
	size_t len = nested_txn(buf, 100);
	cr_assert(rpc__nesting_ok(d, buf, len, RPC__MAX_NESTING));
	cr_assert(!rpc__nesting_ok(d, buf, len, 150), "200 message levels over 150");
	cr_assert(rpc__nesting_ok(d, buf, len, 200));
	cr_assert(!rpc__nesting_ok(d, buf, len, 199));
	ProtobufCMessage *m = protobuf_c_message_unpack(d, NULL, len, buf);
	cr_assert_not_null(m, "100 txn levels are a valid message");
	protobuf_c_message_free_unpacked(m, NULL);

	/* Deeper than the limit: refused, and rpc__unpack never recurses. */
	len = nested_txn(buf, 8000);
	cr_assert(!rpc__nesting_ok(d, buf, len, RPC__MAX_NESTING));
	struct rpc__arena ar;
	cr_assert_null(rpc__unpack(d, buf, len, NULL, NULL, &ar));

	/* A type whose schema cannot nest without bound passes at once,
	 * whatever its bytes; so does a malformed recursive one. */
	cr_assert(rpc__nesting_ok(&mooncake__raft__batch__descriptor, buf, len, 1));
	uint8_t bad[] = {0x12, 0x7f, 0x22};
	cr_assert(rpc__nesting_ok(d, bad, sizeof(bad), 1));
}

/* ---------------------------------------------------------------- taking bodies */

struct taker {
	struct rpc_deframer *d;
	uint8_t *taken;
	size_t taken_len;
	bool in_place; /* the body was not the deframer's to give */
};

static int on_msg_take(void *ud, const uint8_t *body, size_t len)
{
	struct taker *t = ud;
	uint8_t copy = 0;
	cr_assert_null(rpc_deframer_take(t->d, &copy), "only the body handed out");
	t->taken = rpc_deframer_take(t->d, body);
	t->in_place = t->taken == NULL;
	if (t->taken) {
		cr_assert_eq(t->taken, body);
		cr_assert_null(rpc_deframer_take(t->d, body), "taken once");
	}
	t->taken_len = len;
	return 0;
}

Test(rpc_frame, a_reassembled_body_can_be_taken)
{
	static const size_t lens[] = {100};
	uint8_t buf[128];
	size_t n = build_stream(buf, lens, 1);
	struct rpc_deframer d;
	struct pool p = {0};
	struct taker t = {.d = &d};
	rpc_deframer_init(&d, 1000);
	d.alloc = pool_alloc;
	d.release = pool_release;
	d.alloc_ctx = &p;

	/* Whole in one chunk: it lies in the caller's buffer. */
	cr_assert_eq(rpc_deframer_feed(&d, buf, n, on_msg_take, &t), 0);
	cr_assert(t.in_place);
	cr_assert_eq(p.allocs, 0);

	/* Split: the reassembled buffer is taken, and not released. */
	cr_assert_eq(rpc_deframer_feed(&d, buf, 50, on_msg_take, &t), 0);
	cr_assert_eq(rpc_deframer_feed(&d, buf + 50, n - 50, on_msg_take, &t), 0);
	cr_assert_not_null(t.taken);
	cr_assert_eq(t.taken_len, 100);
	cr_assert_eq(p.allocs, 1);
	cr_assert_eq(p.releases, 0);
	for (size_t i = 0; i < 100; i++)
		cr_assert_eq(t.taken[i], (uint8_t)i);
	d.release(d.alloc_ctx, t.taken, t.taken_len);
	cr_assert_eq(p.releases, 1);

	/* Not taken: released as before, and take after on_msg finds nothing. */
	cr_assert_eq(rpc_deframer_feed(&d, buf, 50, on_msg, &(struct got){0}), 0);
	cr_assert_eq(rpc_deframer_feed(&d, buf + 50, n - 50, on_msg, &(struct got){0}), 0);
	cr_assert_eq(p.releases, 2);
	cr_assert_null(rpc_deframer_take(&d, NULL));
	rpc_deframer_free(&d);
	cr_assert_eq(p.allocs, p.releases);
}

/* ---------------------------------------------------------------- unpack in place */

#define BIG_BYTES (100u << 10)

struct unpacker {
	struct rpc_deframer df, *d;
	struct rpc__bufcache bc;
	const ProtobufCMessageDescriptor *desc;
	const uint8_t *body;
	ProtobufCMessage *m;
	struct rpc__arena ar;
	int calls;
};

static int on_msg_unpack(void *ud, const uint8_t *body, size_t len)
{
	struct unpacker *u = ud;
	u->calls++;
	u->body = body;
	u->m = rpc__unpack(u->desc, body, len, &u->bc, u->d, &u->ar);
	return u->m ? 0 : -EBADMSG;
}

/* EchoRequests through a deframer of 1 MiB messages with a cache. */
static void unpacker_init(struct unpacker *u)
{
	memset(u, 0, sizeof(*u));
	u->d = &u->df;
	u->desc = &mooncake__diag__echo_request__descriptor;
	rpc__deframer_setup(u->d, 1u << 20, &u->bc);
}

static void unpacker_close(struct unpacker *u)
{
	rpc_deframer_free(u->d);
	rpc__bufcache_free(&u->bc);
}

/* A gRPC-framed EchoRequest with a BIG_BYTES payload, delay 7 and a
 * message; returns the framed length. */
static size_t framed_echo(uint8_t *buf, size_t cap)
{
	static uint8_t payload[BIG_BYTES];
	for (size_t i = 0; i < sizeof(payload); i++)
		payload[i] = (uint8_t)(i * 7 + 3);
	Mooncake__Diag__EchoRequest req = MOONCAKE__DIAG__ECHO_REQUEST__INIT;
	req.payload.data = payload;
	req.payload.len = sizeof(payload);
	req.delay_ms = 7;
	req.message = "after the payload";
	size_t n = protobuf_c_message_get_packed_size(&req.base);
	cr_assert_leq(n + 5, cap);
	rpc_frame_prefix(buf, (uint32_t)n);
	protobuf_c_message_pack(&req.base, buf + 5);
	return n + 5;
}

static void check_echo(const Mooncake__Diag__EchoRequest *r)
{
	cr_assert_eq(r->payload.len, BIG_BYTES);
	for (size_t i = 0; i < BIG_BYTES; i++)
		cr_assert_eq(r->payload.data[i], (uint8_t)(i * 7 + 3), "byte %zu", i);
	cr_assert_eq(r->delay_ms, 7);
	cr_assert_str_eq(r->message, "after the payload");
}

Test(rpc_frame, large_bytes_field_left_in_the_received_body)
{
	static uint8_t buf[BIG_BYTES + 256];
	size_t n = framed_echo(buf, sizeof(buf));
	struct unpacker u;
	unpacker_init(&u);

	/* Split at every byte of the prefix and of the payload's tag and
	 * length, and at a few places beyond. Cut inside the prefix, the
	 * body arrives whole in the second chunk, borrowed, and is copied. */
	size_t cuts[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 4096, BIG_BYTES, n - 20, n - 1};
	for (size_t c = 0; c < MC_ARRAY_LEN(cuts); c++) {
		u.calls = 0;
		cr_assert_eq(rpc_deframer_feed(u.d, buf, cuts[c], on_msg_unpack, &u), 0);
		cr_assert_eq(
			rpc_deframer_feed(u.d, buf + cuts[c], n - cuts[c], on_msg_unpack, &u),
			0);
		cr_assert_eq(u.calls, 1, "cut at %zu", cuts[c]);
		const Mooncake__Diag__EchoRequest *r = (const void *)u.m;
		check_echo(r);
		if (cuts[c] < 5) {
			/* The body came whole in the second chunk: copied. */
			cr_assert_null(u.ar.body, "cut at %zu", cuts[c]);
			cr_assert(r->payload.data < buf || r->payload.data >= buf + n);
		} else {
			cr_assert(r->payload.data > u.body && r->payload.data < u.body + n,
				  "cut at %zu: the payload points into the body", cuts[c]);
			cr_assert_eq(u.ar.body->p, u.body);
		}
		rpc__unpacked_free(u.m, &u.ar);
		cr_assert_null(u.ar.body);
	}
	unpacker_close(&u);
}

Test(rpc_frame, large_bytes_field_copied_when_not_ours_or_repeated)
{
	static uint8_t buf[2 * BIG_BYTES + 512];
	size_t n = framed_echo(buf, sizeof(buf));
	struct unpacker u;
	unpacker_init(&u);

	/* Whole in one chunk: the body is the caller's, so it is copied. */
	cr_assert_eq(rpc_deframer_feed(u.d, buf, n, on_msg_unpack, &u), 0);
	const Mooncake__Diag__EchoRequest *r = (const void *)u.m;
	check_echo(r);
	cr_assert(r->payload.data < buf || r->payload.data >= buf + n);
	cr_assert_null(u.ar.body);
	rpc__unpacked_free(u.m, &u.ar);

	/* Without a deframer: copied. */
	u.m = rpc__unpack(u.desc, buf + 5, n - 5, &u.bc, NULL, &u.ar);
	check_echo((const void *)u.m);
	cr_assert_null(u.ar.body);
	rpc__unpacked_free(u.m, &u.ar);

	/* The payload twice, a short one last: protobuf-c's answer, the
	 * last occurrence, and nothing left pointing into the body. */
	uint8_t tail[] = {0x0a, 0x02, 'h', 'i'};
	memcpy(buf + n, tail, sizeof(tail));
	size_t body = n - 5 + sizeof(tail);
	rpc_frame_prefix(buf, (uint32_t)body);
	cr_assert_eq(rpc_deframer_feed(u.d, buf, 100, on_msg_unpack, &u), 0);
	cr_assert_eq(rpc_deframer_feed(u.d, buf + 100, body + 5 - 100, on_msg_unpack, &u), 0);
	r = (const void *)u.m;
	cr_assert_eq(r->payload.len, 2);
	cr_assert_eq(memcmp(r->payload.data, "hi", 2), 0);
	cr_assert_eq(r->delay_ms, 7);
	cr_assert_null(u.ar.body);
	rpc__unpacked_free(u.m, &u.ar);
	unpacker_close(&u);
}

Test(rpc_frame, hostile_records_around_a_large_bytes_field)
{
	static uint8_t buf[BIG_BYTES + 256];
	size_t n = framed_echo(buf, sizeof(buf));
	struct unpacker u;
	unpacker_init(&u);

	/* Each of these bodies fails to unpack, with or without the
	 * in-place path, and leaks nothing (the SAN build checks). */
	static const uint8_t bad_tails[][4] = {
		{0x2a, 0x7f, 'x', 'y'},   /* message: length past the end */
		{0x10, 0x80, 0x80, 0x80}, /* delay_ms: varint cut short */
		{0x0b, 0x00, 0x00, 0x00}, /* a group start */
		{0x00, 0x00, 0x00, 0x00}, /* field number 0 */
		{0x12, 0x02, 'x', 'y'},   /* delay_ms with the wrong wire type:
					   * scans, then protobuf-c refuses it */
	};
	for (size_t t = 0; t < MC_ARRAY_LEN(bad_tails); t++) {
		memcpy(buf + n, bad_tails[t], 4);
		rpc_frame_prefix(buf, (uint32_t)(n - 5 + 4));
		u.calls = 0;
		cr_assert_eq(rpc_deframer_feed(u.d, buf, 64, on_msg_unpack, &u), 0);
		cr_assert_eq(rpc_deframer_feed(u.d, buf + 64, n + 4 - 64, on_msg_unpack, &u),
			     -EBADMSG, "tail %zu", t);
		cr_assert_eq(u.calls, 1);
		cr_assert_null(u.ar.body);
		cr_assert(rpc_deframer_idle(u.d));
	}
	/* A body one byte short: its last record runs past the end. */
	rpc_frame_prefix(buf, (uint32_t)(n - 5 - 1));
	cr_assert_eq(rpc_deframer_feed(u.d, buf, 64, on_msg_unpack, &u), 0);
	cr_assert_eq(rpc_deframer_feed(u.d, buf + 64, n - 1 - 64, on_msg_unpack, &u),
		     -EBADMSG);
	/* And a prefix beyond the maximum is refused before any buffer. */
	rpc_frame_prefix(buf, (1u << 20) + 1);
	cr_assert_eq(rpc_deframer_feed(u.d, buf, 64, on_msg_unpack, &u), MC_ETOO_LARGE);
	unpacker_close(&u);
}

/* ---------------------------------------------------------------- packing by reference */

/* m's bytes, read piece by piece with rpc__omsg_at, into out. */
static size_t omsg_bytes(const struct rpc__omsg *m, uint8_t *out)
{
	size_t off = 0, n;
	while (off < m->len) {
		const uint8_t *p = rpc__omsg_at(m, off, &n);
		cr_assert_gt(n, 0);
		memcpy(out + off, p, n);
		off += n;
	}
	return off;
}

/* Pack msg by reference to from and plainly: the same bytes either way. */
static void check_pack_ref(const ProtobufCMessage *msg, struct rpc__rbody *from, bool by_ref)
{
	static uint8_t a[BIG_BYTES + 1024], b[BIG_BYTES + 1024];
	struct rpc__omsg *mr, *mp;
	unsigned refs = from->refs;
	cr_assert_eq(rpc__omsg_pack(msg, 1u << 20, SIZE_MAX, NULL, from, &mr), 0);
	cr_assert_eq(rpc__omsg_pack(msg, 1u << 20, SIZE_MAX, NULL, NULL, &mp), 0);
	cr_assert_eq(mr->ext != NULL, by_ref);
	cr_assert_eq(from->refs, refs + (by_ref ? 1 : 0));
	cr_assert_eq(mr->len, mp->len);
	cr_assert_leq(mp->len, sizeof(a));
	cr_assert_eq(omsg_bytes(mr, a), mr->len);
	cr_assert_eq(omsg_bytes(mp, b), mp->len);
	cr_assert_eq(memcmp(a, b, mp->len), 0, "the wire does not change");
	rpc__omsg_unref(mr);
	rpc__omsg_unref(mp);
	cr_assert_eq(from->refs, refs);
}

Test(rpc_frame, a_large_field_in_a_received_body_is_packed_by_reference)
{
	struct rpc__rbody *from = malloc(sizeof(*from));
	cr_assert_not_null(from);
	/* The body is the first BIG_BYTES + 100 bytes of its buffer. */
	*from = (struct rpc__rbody){.refs = 1, .len = BIG_BYTES + 100};
	from->p = malloc(BIG_BYTES + 200);
	cr_assert_not_null(from->p);
	for (size_t i = 0; i < BIG_BYTES + 200; i++)
		from->p[i] = (uint8_t)(i * 13);

	/* The field numbered first, with fields after it. */
	Mooncake__Diag__EchoRequest e = MOONCAKE__DIAG__ECHO_REQUEST__INIT;
	e.payload.data = from->p + 50;
	e.payload.len = BIG_BYTES;
	e.delay_ms = 9;
	e.message = "tail";
	check_pack_ref(&e.base, from, true);

	/* In the middle, after a submessage, with a field after it; then
	 * last; then alone. */
	Mooncake__Raft__Message rm = MOONCAKE__RAFT__MESSAGE__INIT;
	rm.term = 3;
	Mooncake__Raft__SnapshotChunk c = MOONCAKE__RAFT__SNAPSHOT_CHUNK__INIT;
	c.cluster_id = 77;
	c.msg = &rm;
	c.offset = 1u << 30;
	c.data.data = from->p + 100;
	c.data.len = BIG_BYTES;
	c.last = 1;
	c.total_bytes = 5;
	check_pack_ref(&c.base, from, true);
	c.last = 0;
	c.total_bytes = 0;
	check_pack_ref(&c.base, from, true);
	Mooncake__Raft__SnapshotChunk alone = MOONCAKE__RAFT__SNAPSHOT_CHUNK__INIT;
	alone.data = c.data;
	check_pack_ref(&alone.base, from, true);

	/* Bytes not (wholly) in the body, or too few: copied. */
	static uint8_t elsewhere[BIG_BYTES];
	e.payload.data = elsewhere;
	check_pack_ref(&e.base, from, false);
	e.payload.data = from->p + 101;
	check_pack_ref(&e.base, from, false);
	e.payload.data = from->p;
	e.payload.len = RPC__ALIAS_MIN_BYTES - 1;
	check_pack_ref(&e.base, from, false);

	/* Over the maximum: refused, no reference taken. */
	struct rpc__omsg *m;
	e.payload.len = BIG_BYTES;
	cr_assert_eq(rpc__omsg_pack(&e.base, BIG_BYTES, SIZE_MAX, NULL, from, &m),
		     MC_ETOO_LARGE);
	cr_assert_eq(from->refs, 1);

	/* Longer than the room given, by reference or not: refused before
	 * anything is allocated; exactly the room fits. */
	size_t len = 5 + protobuf_c_message_get_packed_size(&e.base);
	cr_assert_eq(rpc__omsg_pack(&e.base, 1u << 20, len - 1, NULL, from, &m), -ENOBUFS);
	cr_assert_eq(rpc__omsg_pack(&e.base, 1u << 20, len - 1, NULL, NULL, &m), -ENOBUFS);
	cr_assert_eq(from->refs, 1);
	cr_assert_eq(rpc__omsg_pack(&e.base, 1u << 20, len, NULL, NULL, &m), 0);
	cr_assert_eq(m->len, len);
	rpc__omsg_unref(m);

	/* A message sent by reference keeps the body past its other owner. */
	cr_assert_eq(rpc__omsg_pack(&e.base, 1u << 20, len, NULL, from, &m), 0);
	rpc__rbody_unref(from);
	cr_assert_eq(from->refs, 1);
	size_t n;
	const uint8_t *p = rpc__omsg_at(m, m->ext_at, &n);
	cr_assert_eq(n, BIG_BYTES);
	cr_assert_eq(p[1], 13);
	rpc__omsg_unref(m);
}
