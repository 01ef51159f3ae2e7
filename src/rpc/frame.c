/*
 * frame: the pure parts of the gRPC wire protocol, with no I/O, clock or
 * allocation policy beyond the deframer's message buffer.
 *
 *  - Length-prefixed messages: every gRPC message on a stream is a 1-byte
 *    compressed flag, a 4-byte big-endian length and the body. The
 *    deframer reassembles bodies from DATA chunks split anywhere; a body
 *    that arrives whole inside one chunk is handed out in place, without
 *    a copy or an allocation, which is the common case for small calls.
 *    Other bodies get a buffer that grows with what came (frame.h), so a
 *    declared length costs nothing until its bytes arrive.
 *    A reassembled body may be taken by on_msg (rpc_deframer_take), so
 *    that the message unpacked from it can keep pointing into it.
 *  - grpc-timeout: "TimeoutValue TimeoutUnit", at most 8 ASCII digits and
 *    one of H M S m u n. We keep deadlines in milliseconds and round
 *    sub-millisecond values up, so a tiny timeout never becomes "none".
 *  - grpc-message: percent-encoded; bytes outside 0x20-0x7e and '%'
 *    itself are sent as %XX.
 *  - status code names.
 *
 * Everything here is exercised by test/unit/test_rpc_frame.c and is the
 * natural fuzz target for the RPC layer.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/endian.h"
#include "rpc/frame.h"

static const char *const status_names[] = {
	"OK",
	"CANCELLED",
	"UNKNOWN",
	"INVALID_ARGUMENT",
	"DEADLINE_EXCEEDED",
	"NOT_FOUND",
	"ALREADY_EXISTS",
	"PERMISSION_DENIED",
	"RESOURCE_EXHAUSTED",
	"FAILED_PRECONDITION",
	"ABORTED",
	"OUT_OF_RANGE",
	"UNIMPLEMENTED",
	"INTERNAL",
	"UNAVAILABLE",
	"DATA_LOSS",
	"UNAUTHENTICATED",
};

const char *rpc_status_name(int status)
{
	if (status < 0 || (size_t)status >= sizeof(status_names) / sizeof(status_names[0]))
		return "UNKNOWN";
	return status_names[status];
}

/* ------------------------------------------------------------ deframer */

void rpc_deframer_init(struct rpc_deframer *d, size_t max_message_bytes)
{
	memset(d, 0, sizeof(*d));
	d->max_message_bytes = max_message_bytes;
}

static void body_release(struct rpc_deframer *d, uint8_t *p, size_t len)
{
	if (!p)
		return;
	if (d->release)
		d->release(d->alloc_ctx, p, len);
	else
		free(p);
}

void rpc_deframer_free(struct rpc_deframer *d)
{
	body_release(d, d->msg, d->msg_cap);
	body_release(d, d->out, d->out_len);
	d->msg = NULL;
	d->out = NULL;
	d->hdr_len = 0;
	d->msg_len = 0;
	d->msg_cap = 0;
	d->msg_got = 0;
	d->compressed = false;
}

uint8_t *rpc_deframer_take(struct rpc_deframer *d, const uint8_t *body)
{
	uint8_t *p = d->out;
	if (!p || p != body)
		return NULL;
	d->out = NULL;
	return p;
}

bool rpc_deframer_idle(const struct rpc_deframer *d)
{
	return d->hdr_len == 0;
}

uint8_t *rpc_deframer_room(const struct rpc_deframer *d, size_t *len)
{
	if (!d->msg || d->msg_got >= d->msg_cap)
		return NULL;
	*len = d->msg_cap - d->msg_got;
	return d->msg + d->msg_got;
}

/* Room in the open body for at least need of its bytes: the buffer grows
 * to RPC_DEFRAMER_GROWTH times what it held (the first one to
 * RPC_DEFRAMER_FIRST_CAP), to need when that is more, never past the
 * body's length. */
static int body_reserve(struct rpc_deframer *d, size_t need)
{
	if (d->msg && need <= d->msg_cap)
		return 0;
	size_t want = d->msg ? d->msg_cap * RPC_DEFRAMER_GROWTH : RPC_DEFRAMER_FIRST_CAP;
	want = want < need ? need : want;
	want = want > d->msg_len ? d->msg_len : want;
	uint8_t *p;
	size_t cap = want;
	if (d->alloc) {
		p = d->alloc(d->alloc_ctx, d->msg_len, &cap);
		if (!p)
			return -ENOMEM;
		if (d->msg_got)
			memcpy(p, d->msg, d->msg_got);
		body_release(d, d->msg, d->msg_cap);
	} else {
		p = realloc(d->msg, want); /* (large blocks: mremap, no copy) */
		if (!p)
			return -ENOMEM;
	}
	d->msg = p;
	d->msg_cap = cap < d->msg_len ? cap : d->msg_len;
	return 0;
}

int rpc_deframer_feed(struct rpc_deframer *d, const uint8_t *data, size_t len,
		      int (*on_msg)(void *ud, const uint8_t *body, size_t len), void *ud)
{
	int rc;

	while (len > 0) {
		if (d->hdr_len < 5) {
			size_t take = 5 - d->hdr_len;
			if (take > len)
				take = len;
			memcpy(d->hdr + d->hdr_len, data, take);
			d->hdr_len += take;
			data += take;
			len -= take;
			if (d->hdr_len < 5)
				return 0;
			if (d->hdr[0] & 0xfe)
				return -EPROTO; /* reserved flag bits */
			d->compressed = d->hdr[0] & 1;
			if (d->compressed)
				return -EPROTO;
			d->msg_len = mc_get_be32(d->hdr + 1);
			d->msg_got = 0;
			if (d->msg_len > d->max_message_bytes)
				return MC_ETOO_LARGE;
			if (d->msg_len > 0 && len >= d->msg_len) {
				/* Whole body in this chunk: no copy. */
				const uint8_t *body = data;
				size_t blen = d->msg_len;
				data += blen;
				len -= blen;
				d->hdr_len = 0;
				d->msg_len = 0;
				rc = on_msg(ud, body, blen);
				if (rc)
					return rc;
				continue;
			}
		}
		size_t need = d->msg_len - d->msg_got;
		size_t take = need < len ? need : len;
		/* A body gets its buffer when its first bytes come. (Bytes
		 * read into the room fit it: no growth moves them.) */
		if (take && body_reserve(d, d->msg_got + take) != 0)
			return -ENOMEM;
		/* Bytes read straight into the body (rpc_deframer_room) are
		 * already where they belong. */
		if (take && data != d->msg + d->msg_got)
			memcpy(d->msg + d->msg_got, data, take);
		d->msg_got += take;
		data += take;
		len -= take;
		if (d->msg_got < d->msg_len)
			return 0;
		/* Complete: hand it out, then release it unless on_msg took
		 * it (or freed the deframer, which releases it). */
		uint8_t *body = d->msg;
		size_t blen = d->msg_len;
		d->msg = NULL;
		d->hdr_len = 0;
		d->msg_len = 0;
		d->msg_cap = 0;
		d->msg_got = 0;
		d->out = body;
		d->out_len = blen;
		rc = on_msg(ud, body ? body : (const uint8_t *)"", blen);
		body_release(d, d->out, d->out_len);
		d->out = NULL;
		if (rc)
			return rc;
	}
	return 0;
}

void rpc_frame_prefix(uint8_t out[5], uint32_t len)
{
	out[0] = 0;
	mc_put_be32(out + 1, len);
}

/* ------------------------------------------------------------ grpc-timeout */

int rpc_timeout_parse(const char *value, uint64_t *ms)
{
	uint64_t v = 0;
	size_t n = 0;

	if (!value)
		return -EINVAL;
	while (value[n] >= '0' && value[n] <= '9') {
		if (n == 8)
			return -EINVAL;
		v = v * 10 + (uint64_t)(value[n] - '0');
		n++;
	}
	if (n == 0 || value[n] == '\0' || value[n + 1] != '\0')
		return -EINVAL;
	switch (value[n]) {
	case 'H':
		*ms = v * 3600000u;
		break;
	case 'M':
		*ms = v * 60000u;
		break;
	case 'S':
		*ms = v * 1000u;
		break;
	case 'm':
		*ms = v;
		break;
	case 'u':
		*ms = (v + 999u) / 1000u;
		break;
	case 'n':
		*ms = (v + 999999u) / 1000000u;
		break;
	default:
		return -EINVAL;
	}
	return 0;
}

void rpc_timeout_format(uint64_t ms, char *buf, size_t len)
{
	/* The finest unit whose value fits in 8 digits; round up so the
	 * peer never sees a shorter deadline than ours. Written by hand, not
	 * with snprintf: a client formats one per call. */
	static const struct {
		uint64_t div;
		char unit;
	} units[] = {{1, 'm'}, {1000, 'S'}, {60000, 'M'}, {3600000, 'H'}};
	uint64_t v = 99999999u;
	char unit = 'H';
	for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
		uint64_t u = (ms + units[i].div - 1) / units[i].div;
		if (u <= 99999999u) {
			v = u;
			unit = units[i].unit;
			break;
		}
	}
	char tmp[10];
	size_t n = sizeof(tmp);
	tmp[--n] = unit;
	do {
		tmp[--n] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	if (!len)
		return;
	size_t k = sizeof(tmp) - n < len - 1 ? sizeof(tmp) - n : len - 1;
	memcpy(buf, tmp + n, k);
	buf[k] = '\0';
}

/* ------------------------------------------------------------ percent */

static bool pct_plain(unsigned char c)
{
	return c >= 0x20 && c <= 0x7e && c != '%';
}

void rpc_percent_encode(const char *in, char *out, size_t outlen)
{
	static const char hex[] = "0123456789ABCDEF";
	size_t o = 0;

	if (outlen == 0)
		return;
	for (const unsigned char *p = (const unsigned char *)in; p && *p; p++) {
		if (pct_plain(*p)) {
			if (o + 1 >= outlen)
				break;
			out[o++] = (char)*p;
		} else {
			if (o + 3 >= outlen)
				break;
			out[o++] = '%';
			out[o++] = hex[*p >> 4];
			out[o++] = hex[*p & 15];
		}
	}
	out[o] = '\0';
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

void rpc_percent_decode(const char *in, char *out, size_t outlen)
{
	size_t o = 0;

	if (outlen == 0)
		return;
	for (const char *p = in; p && *p && o + 1 < outlen; p++) {
		int hi, lo;
		if (p[0] == '%' && (hi = hexval(p[1])) >= 0 && (lo = hexval(p[2])) >= 0) {
			out[o++] = (char)(hi << 4 | lo);
			p += 2;
		} else {
			/* Not a valid escape: passed through as is, as the
			 * spec asks of a lenient decoder. */
			out[o++] = *p;
		}
	}
	out[o] = '\0';
}
