/*
 * diag: the mooncake.diag.Diag service (proto/diag.proto), served when
 * --diag-service is on and by mooncakectl bench rpc's in-process server.
 *
 *   Echo        unary: the payload back (optionally after delay_ms, or
 *               response_bytes of the download pattern, or a given status)
 *   EchoStream  bidi: every request message echoed, OK at half-close
 *   Download    server-streaming: total_bytes in chunks of chunk_bytes,
 *               byte i = i % 251, paced by on_drain so a large download
 *               never queues more than about RPC_DRAIN_BYTES
 *   Upload      client-streaming: byte and message counts and an FNV-1a
 *               checksum of everything received
 *
 * The handlers double as the reference use of the rpc_method table: each
 * method is a handful of lines.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "diag.pb-c.h"
#include "rpc/rpc.h"

#define PATTERN_PERIOD 251
#define DEFAULT_CHUNK_BYTES (64u << 10)

/* Bytes [off, off+len) of the download pattern. */
static void pattern_fill(uint8_t *buf, size_t len, uint64_t off)
{
	unsigned v = (unsigned)(off % PATTERN_PERIOD);
	for (size_t i = 0; i < len; i++) {
		buf[i] = (uint8_t)v;
		if (++v == PATTERN_PERIOD)
			v = 0;
	}
}

static void finish_send_error(struct rpc_call *call, int rc)
{
	if (rc == MC_ETOO_LARGE)
		rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED,
				"response larger than the server's max message size");
	else
		rpc_call_finish(call, rc == -ECANCELED ? RPC_CANCELLED : RPC_INTERNAL,
				mc_strerror(rc));
}

/* ---------------------------------------------------------------- Echo */

struct echo_later {
	uv_timer_t timer;
	struct rpc_call *call;
	Mooncake__Diag__EchoRequest req; /* payload and message owned */
};

static void echo_reply(struct rpc_call *call, const Mooncake__Diag__EchoRequest *req)
{
	Mooncake__Diag__EchoResponse resp = MOONCAKE__DIAG__ECHO_RESPONSE__INIT;
	uint8_t *buf = NULL;
	int rc;

	if (req->status) {
		rpc_call_finish(call, (int)req->status, req->message);
		return;
	}
	if (req->response_bytes) {
		buf = malloc(req->response_bytes);
		if (!buf) {
			rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, "out of memory");
			return;
		}
		pattern_fill(buf, req->response_bytes, 0);
		resp.payload.data = buf;
		resp.payload.len = req->response_bytes;
	} else {
		resp.payload = req->payload;
	}
	rc = rpc_call_send(call, &resp.base);
	free(buf);
	if (rc)
		finish_send_error(call, rc);
	else
		rpc_call_finish(call, RPC_OK, NULL);
}

static void on_later_closed(uv_handle_t *h)
{
	struct echo_later *l = MC_CONTAINER_OF((uv_timer_t *)h, struct echo_later, timer);
	free(l->req.payload.data);
	free(l->req.message);
	free(l);
}

static void on_echo_timer(uv_timer_t *t)
{
	struct echo_later *l = MC_CONTAINER_OF(t, struct echo_later, timer);
	rpc_call_set_data(l->call, NULL);
	echo_reply(l->call, &l->req);
	uv_close((uv_handle_t *)&l->timer, on_later_closed);
}

static void echo_on_message(struct rpc_call *call, const ProtobufCMessage *msg)
{
	const Mooncake__Diag__EchoRequest *req = (const Mooncake__Diag__EchoRequest *)msg;
	if (!req->delay_ms) {
		echo_reply(call, req);
		return;
	}
	struct echo_later *l = calloc(1, sizeof(*l));
	if (!l)
		goto err_nomem;
	l->call = call;
	l->req = *req;
	l->req.payload.data = NULL;
	l->req.message = NULL;
	if (req->payload.len) {
		l->req.payload.data = malloc(req->payload.len);
		if (!l->req.payload.data)
			goto err_free;
		memcpy(l->req.payload.data, req->payload.data, req->payload.len);
	}
	if (req->message && !(l->req.message = strdup(req->message)))
		goto err_free;
	uv_timer_init(rpc_call_loop(call), &l->timer);
	uv_timer_start(&l->timer, on_echo_timer, req->delay_ms, 0);
	rpc_call_set_data(call, l);
	return;

err_free:
	free(l->req.payload.data);
	free(l);
err_nomem:
	rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, "out of memory");
}

static void echo_on_cancel(struct rpc_call *call)
{
	struct echo_later *l = rpc_call_data(call);
	if (l) {
		rpc_call_set_data(call, NULL);
		uv_close((uv_handle_t *)&l->timer, on_later_closed);
	}
	rpc_call_finish(call, RPC_CANCELLED, NULL);
}

/* ---------------------------------------------------------------- EchoStream */

static void es_on_start(struct rpc_call *call)
{
}

static void es_on_message(struct rpc_call *call, const ProtobufCMessage *msg)
{
	const Mooncake__Diag__EchoRequest *req = (const Mooncake__Diag__EchoRequest *)msg;
	Mooncake__Diag__EchoResponse resp = MOONCAKE__DIAG__ECHO_RESPONSE__INIT;
	resp.payload = req->payload;
	int rc = rpc_call_send(call, &resp.base);
	if (rc)
		finish_send_error(call, rc);
}

static void es_on_half_close(struct rpc_call *call)
{
	rpc_call_finish(call, RPC_OK, NULL);
}

static void finish_cancelled(struct rpc_call *call)
{
	rpc_call_finish(call, RPC_CANCELLED, NULL);
}

/* ---------------------------------------------------------------- Download */

struct download {
	uint64_t total, sent;
	size_t chunk;
	uint8_t *pattern; /* chunk + PATTERN_PERIOD bytes of the pattern */
};

static void download_end(struct rpc_call *call, struct download *d, int status,
			 const char *msg)
{
	rpc_call_set_data(call, NULL);
	free(d->pattern);
	free(d);
	rpc_call_finish(call, status, msg);
}

static void download_pump(struct rpc_call *call)
{
	struct download *d = rpc_call_data(call);
	Mooncake__Diag__Chunk c = MOONCAKE__DIAG__CHUNK__INIT;

	while (d->sent < d->total && rpc_call_pending_bytes(call) < RPC_DRAIN_BYTES) {
		uint64_t left = d->total - d->sent;
		c.data.len = left < d->chunk ? (size_t)left : d->chunk;
		c.data.data = d->pattern + d->sent % PATTERN_PERIOD;
		int rc = rpc_call_send(call, &c.base);
		if (rc) {
			rpc_call_set_data(call, NULL);
			free(d->pattern);
			free(d);
			finish_send_error(call, rc);
			return;
		}
		d->sent += c.data.len;
	}
	if (d->sent == d->total)
		download_end(call, d, RPC_OK, NULL);
}

static void download_on_message(struct rpc_call *call, const ProtobufCMessage *msg)
{
	const Mooncake__Diag__DownloadRequest *req =
		(const Mooncake__Diag__DownloadRequest *)msg;
	struct download *d = calloc(1, sizeof(*d));
	if (!d) {
		rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, "out of memory");
		return;
	}
	d->total = req->total_bytes;
	d->chunk = req->chunk_bytes ? req->chunk_bytes : DEFAULT_CHUNK_BYTES;
	d->pattern = malloc(d->chunk + PATTERN_PERIOD);
	if (!d->pattern) {
		free(d);
		rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, "out of memory");
		return;
	}
	pattern_fill(d->pattern, d->chunk + PATTERN_PERIOD, 0);
	rpc_call_set_data(call, d);
	download_pump(call);
}

static void download_on_cancel(struct rpc_call *call)
{
	struct download *d = rpc_call_data(call);
	if (d)
		download_end(call, d, RPC_CANCELLED, NULL);
	else
		rpc_call_finish(call, RPC_CANCELLED, NULL);
}

/* ---------------------------------------------------------------- Upload */

struct upload {
	uint64_t bytes, msgs, fnv;
};

static void upload_on_start(struct rpc_call *call)
{
	struct upload *u = calloc(1, sizeof(*u));
	if (!u) {
		rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, "out of memory");
		return;
	}
	u->fnv = 0xcbf29ce484222325ull;
	rpc_call_set_data(call, u);
}

static void upload_on_message(struct rpc_call *call, const ProtobufCMessage *msg)
{
	const Mooncake__Diag__Chunk *c = (const Mooncake__Diag__Chunk *)msg;
	struct upload *u = rpc_call_data(call);
	uint64_t h = u->fnv;
	for (size_t i = 0; i < c->data.len; i++) {
		h ^= c->data.data[i];
		h *= 0x100000001b3ull;
	}
	u->fnv = h;
	u->bytes += c->data.len;
	u->msgs++;
}

static void upload_on_half_close(struct rpc_call *call)
{
	struct upload *u = rpc_call_data(call);
	Mooncake__Diag__UploadSummary sum = MOONCAKE__DIAG__UPLOAD_SUMMARY__INIT;
	sum.total_bytes = u->bytes;
	sum.messages = u->msgs;
	sum.checksum = u->fnv;
	rpc_call_set_data(call, NULL);
	free(u);
	int rc = rpc_call_send(call, &sum.base);
	if (rc)
		finish_send_error(call, rc);
	else
		rpc_call_finish(call, RPC_OK, NULL);
}

static void upload_on_cancel(struct rpc_call *call)
{
	free(rpc_call_data(call));
	rpc_call_set_data(call, NULL);
	rpc_call_finish(call, RPC_CANCELLED, NULL);
}

/* ---------------------------------------------------------------- table */

static const struct rpc_method diag_methods[] = {
	{
		.name = "Echo",
		.kind = RPC_UNARY,
		.request = &mooncake__diag__echo_request__descriptor,
		.response = &mooncake__diag__echo_response__descriptor,
		.on_message = echo_on_message,
		.on_cancel = echo_on_cancel,
	},
	{
		.name = "EchoStream",
		.kind = RPC_BIDI_STREAMING,
		.request = &mooncake__diag__echo_request__descriptor,
		.response = &mooncake__diag__echo_response__descriptor,
		.on_start = es_on_start,
		.on_message = es_on_message,
		.on_half_close = es_on_half_close,
		.on_cancel = finish_cancelled,
	},
	{
		.name = "Download",
		.kind = RPC_SERVER_STREAMING,
		.request = &mooncake__diag__download_request__descriptor,
		.response = &mooncake__diag__chunk__descriptor,
		.on_message = download_on_message,
		.on_cancel = download_on_cancel,
		.on_drain = download_pump,
	},
	{
		.name = "Upload",
		.kind = RPC_CLIENT_STREAMING,
		.request = &mooncake__diag__chunk__descriptor,
		.response = &mooncake__diag__upload_summary__descriptor,
		.on_start = upload_on_start,
		.on_message = upload_on_message,
		.on_half_close = upload_on_half_close,
		.on_cancel = upload_on_cancel,
	},
};

int rpc_diag_add(struct rpc_server *s)
{
	return rpc_server_add_service(s, "mooncake.diag.Diag", diag_methods,
				      MC_ARRAY_LEN(diag_methods), NULL);
}
