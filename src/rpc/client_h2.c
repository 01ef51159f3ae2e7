/*
 * client_h2: the client's calls over HTTP/2 (client_int.h): a call's
 * request submitted on its channel's connection, and nghttp2's callbacks
 * turned into what the call hears (response headers, messages, trailers,
 * the stream's close).
 *
 * GOAWAY: the connection stops being the channel's current one (client.c);
 * calls on it keep running, new calls open a new connection. A request
 * nghttp2 could not start because of the GOAWAY (its HEADERS never left),
 * or one the server refused (REFUSED_STREAM: above the GOAWAY's last
 * stream id, or over its stream limit) — a unary call at any point, since
 * its request message is kept until the call ends, a streaming call only
 * if none of its body left — is started again transparently
 * (rpc__client_retry): the server never processed it.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "rpc/client_int.h"

#define LOG_SUBSYS LOGS_RPC

/* ---------------------------------------------------------------- requests */

/* The call of stream_id (nghttp2's stream user data), or NULL. */
static struct rpc_stream *stream_of(struct cconn *cc, int32_t stream_id)
{
	if (stream_id != cc->memo_id) {
		cc->memo_id = stream_id;
		cc->memo_st = nghttp2_session_get_stream_user_data(cc->base.ng, stream_id);
	}
	return cc->memo_st;
}

/* nghttp2 forgets st (stream_id's user data becomes NULL). */
static void forget_stream(struct cconn *cc, int32_t stream_id)
{
	nghttp2_session_set_stream_user_data(cc->base.ng, stream_id, NULL);
	cc->memo_id = stream_id;
	cc->memo_st = NULL;
}

static bool can_submit(const struct rpc_stream *st)
{
	const struct rpc__sh2 *h = &st->h2;
	return h->ng && h->cc && !h->cc->base.closing && h->cc->base.ng;
}

void rpc__h2_submit(struct rpc_stream *st, struct cconn *cc)
{
	const char *path = rpc__stream_path(st);
	const char *authority = rpc__client_authority(st->c);
	char timeout[16];
	nghttp2_nv nva[10] = {
		RPC__NV(":method", "POST"),
		RPC__NV(":scheme", "http"),
		RPC__NVS(":path", path, strlen(path)),
		RPC__NVS(":authority", authority, strlen(authority)),
		RPC__NV("content-type", "application/grpc"),
		RPC__NV("te", "trailers"),
		RPC__NV("user-agent", RPC__USER_AGENT),
		RPC__NV("grpc-accept-encoding", "identity"),
	};
	size_t n = 8;
	uint64_t at = rpc__stream_deadline_ms(st);
	if (at) {
		uint64_t now = uv_now(cc->base.tcp.loop);
		rpc_timeout_format(at > now ? at - now : 0, timeout, sizeof(timeout));
		nva[n++] = (nghttp2_nv)RPC__NVS("grpc-timeout", timeout, strlen(timeout));
	}
	if (cc->token[0])
		nva[n++] = (nghttp2_nv)RPC__NVS("mooncake-auth", cc->token, strlen(cc->token));
	nghttp2_data_provider prd = {.source.ptr = &st->outq,
				     .read_callback = rpc__outq_read_cb};
	st->outq.deferred = false;
	int32_t id = nghttp2_submit_request(cc->base.ng, NULL, nva, n, &prd, st);
	if (id < 0) {
		rpc__stream_finish(st, RPC_INTERNAL, nghttp2_strerror(id), false);
		return;
	}
	st->h2.stream_id = id;
	st->h2.cc = cc;
	cc->memo_id = id;
	cc->memo_st = st;
	st->h2.ng = true;
	rpc__stream_ref(st);
	rpc__client_attach(st, cc);
	rpc__conn_want_flush(&cc->base);
}

void rpc__h2_release(struct rpc_stream *st)
{
	if (!st->h2.ng)
		return;
	if (st->h2.cc && st->h2.cc->memo_st == st) {
		st->h2.cc->memo_id = 0;
		st->h2.cc->memo_st = NULL;
	}
	st->h2.ng = false;
	st->h2.cc = NULL;
	rpc__stream_unref(st);
}

void rpc__h2_end(struct rpc_stream *st, bool remote_done)
{
	struct rpc__sh2 *h = &st->h2;
	if (can_submit(st) &&
	    (!remote_done || !h->opened ||
	     nghttp2_session_get_stream_local_close(h->cc->base.ng, h->stream_id) == 0)) {
		nghttp2_submit_rst_stream(h->cc->base.ng, NGHTTP2_FLAG_NONE, h->stream_id,
					  NGHTTP2_CANCEL);
		rpc__conn_want_flush(&h->cc->base);
	}
}

void rpc__h2_resume(struct rpc_stream *st)
{
	if (can_submit(st))
		rpc__conn_resume(&st->h2.cc->base, st->h2.stream_id, &st->outq);
}

/* nghttp2's reference to st is the caller's now: start it again if the
 * server did not process it and may, else end it. */
static void retry_or_finish(struct rpc_stream *st, bool retry, int status, const char *message)
{
	st->h2.cc = NULL;
	st->h2.stream_id = 0;
	st->h2.opened = false;
	if (!retry || !rpc__client_retry(st))
		rpc__stream_finish(st, status, message, false);
}

/* ---------------------------------------------------------------- nghttp2 callbacks */

static struct cconn *to_cconn(void *user_data)
{
	return MC_CONTAINER_OF((struct rpc__conn *)user_data, struct cconn, base);
}

static int on_header(nghttp2_session *ng, const nghttp2_frame *frame, const uint8_t *name,
		     size_t nlen, const uint8_t *value, size_t vlen, uint8_t flags,
		     void *user_data)
{
	struct cconn *cc = to_cconn(user_data);
	if (cc->base.closing || frame->hd.type != NGHTTP2_HEADERS)
		return 0;
	struct rpc_stream *st = stream_of(cc, frame->hd.stream_id);
	if (st && rpc__stream_live(st))
		rpc__stream_header(st, name, nlen, value, vlen);
	return 0;
}

static int on_frame_recv(nghttp2_session *ng, const nghttp2_frame *frame, void *user_data)
{
	struct cconn *cc = to_cconn(user_data);
	struct rpc_stream *st;

	if (cc->base.closing)
		return 0;
	switch (frame->hd.type) {
	case NGHTTP2_HEADERS:
		st = stream_of(cc, frame->hd.stream_id);
		if (!st || !rpc__stream_live(st))
			return 0;
		if (frame->headers.cat == NGHTTP2_HCAT_RESPONSE)
			rpc__stream_response_headers(st, frame->hd.flags &
								 NGHTTP2_FLAG_END_STREAM);
		if (frame->hd.flags & NGHTTP2_FLAG_END_STREAM)
			rpc__stream_trailers(st);
		break;
	case NGHTTP2_DATA:
		if (!(frame->hd.flags & NGHTTP2_FLAG_END_STREAM))
			break;
		st = stream_of(cc, frame->hd.stream_id);
		if (st && rpc__stream_live(st))
			rpc__stream_finish(st, RPC_INTERNAL,
					   "server ended the stream without trailers", true);
		break;
	case NGHTTP2_SETTINGS:
		if (!(frame->hd.flags & NGHTTP2_FLAG_ACK))
			rpc__client_on_settings(cc);
		break;
	case NGHTTP2_GOAWAY:
		rpc__client_on_goaway(cc, &frame->goaway);
		break;
	default:
		break;
	}
	return 0;
}

static int on_data_chunk(nghttp2_session *ng, uint8_t flags, int32_t stream_id,
			 const uint8_t *data, size_t len, void *user_data)
{
	struct cconn *cc = to_cconn(user_data);
	if (cc->base.closing)
		return 0;
	struct rpc_stream *st = stream_of(cc, stream_id);
	if (st && rpc__stream_live(st))
		rpc__stream_data(st, data, len);
	return 0;
}

static int on_stream_close(nghttp2_session *ng, int32_t stream_id, uint32_t error_code,
			   void *user_data)
{
	struct cconn *cc = to_cconn(user_data);
	if (cc->base.closing)
		return 0;
	struct rpc_stream *st = stream_of(cc, stream_id);
	if (!st)
		return 0;
	forget_stream(cc, stream_id);
	/* nghttp2's reference becomes ours for the rest of this function. */
	st->h2.ng = false;
	rpc__client_unlink(st);
	if (rpc__stream_live(st)) {
		/* REFUSED_STREAM (a GOAWAY's last stream id, or the stream
		 * limit) means the server did not process it. */
		char msg[256];
		int status = rpc__stream_status_on_close(st, error_code, msg, sizeof(msg));
		retry_or_finish(
			st, error_code == NGHTTP2_REFUSED_STREAM && rpc__stream_may_retry(st),
			status, msg);
	}
	rpc__stream_unref(st);
	return 0;
}

static int on_frame_not_send(nghttp2_session *ng, const nghttp2_frame *frame,
			     int lib_error_code, void *user_data)
{
	struct cconn *cc = to_cconn(user_data);
	if (cc->base.closing || frame->hd.type != NGHTTP2_HEADERS ||
	    frame->headers.cat != NGHTTP2_HCAT_REQUEST)
		return 0;
	struct rpc_stream *st = rpc__client_conn_first(cc);
	while (st && st->h2.stream_id != frame->hd.stream_id)
		st = rpc__client_conn_next(st);
	if (!st)
		return 0;
	forget_stream(cc, frame->hd.stream_id);
	st->h2.ng = false; /* its reference is ours now */
	rpc__client_unlink(st);
	if (rpc__stream_live(st))
		retry_or_finish(st, lib_error_code == NGHTTP2_ERR_START_STREAM_NOT_ALLOWED,
				RPC_UNAVAILABLE, nghttp2_strerror(lib_error_code));
	rpc__stream_unref(st);
	return 0;
}

static int on_frame_send(nghttp2_session *ng, const nghttp2_frame *frame, void *user_data)
{
	if (frame->hd.type == NGHTTP2_HEADERS && frame->headers.cat == NGHTTP2_HCAT_REQUEST) {
		struct rpc_stream *st = stream_of(to_cconn(user_data), frame->hd.stream_id);
		if (st)
			st->h2.opened = true;
	}
	return 0;
}

struct rpc_deframer *rpc__h2_deframer(struct rpc__conn *c, int32_t stream_id)
{
	/* on_data_chunk's condition for feeding the stream. */
	struct rpc_stream *st = stream_of(MC_CONTAINER_OF(c, struct cconn, base), stream_id);
	return st && rpc__stream_live(st) ? &st->df : NULL;
}

void rpc__h2_callbacks(nghttp2_session_callbacks *cbs)
{
	rpc__callbacks_init(cbs);
	nghttp2_session_callbacks_set_on_header_callback(cbs, on_header);
	nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, on_frame_recv);
	nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, on_data_chunk);
	nghttp2_session_callbacks_set_on_stream_close_callback(cbs, on_stream_close);
	nghttp2_session_callbacks_set_on_frame_not_send_callback(cbs, on_frame_not_send);
	nghttp2_session_callbacks_set_on_frame_send_callback(cbs, on_frame_send);
}
