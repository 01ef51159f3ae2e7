/*
 * http: the HTTP/1.1 endpoint every role serves on its own port:
 *
 *   GET /metrics   Prometheus text exposition format 0.0.4 of a metrics
 *                  registry (text/plain; version=0.0.4)
 *   GET /healthz   200 "ok" plus one line per service while healthy, 503
 *                  with the reason otherwise (from a callback)
 *
 * HEAD is answered like GET without a body; other methods get 405, other
 * paths 404, oversized or malformed requests 400/431 and the connection is
 * closed. Keep-alive is supported (Prometheus reuses connections); idle
 * connections are closed after a timeout, a request head that does not
 * come whole within HTTP_HEAD_TIMEOUT_MS too, and a server holds at most
 * max_conns connections, so a client that opens many or trickles bytes
 * holds a bounded share of the daemon. One libuv loop, no threads; all
 * functions must be called on the loop's thread.
 */
#ifndef MC_HTTP_HTTP_H
#define MC_HTTP_HTTP_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "common/buf.h"
#include "common/err.h"

struct metrics_registry;
struct http_server;

/* Fill body with the health report; return the status code (200 or 503). */
typedef int (*http_health_fn)(void *ctx, struct mc_buf *body);

struct http_server_opts {
	const char *name;                 /* label in logs and metrics */
	struct metrics_registry *metrics; /* served at /metrics; NULL: global */
	http_health_fn health;            /* NULL: always 200 "ok" */
	void *health_ctx;
	/* Called (from the loop) before each /metrics is formatted, to bring
	 * figures kept elsewhere up to date; NULL: none. */
	void (*before_metrics)(void *ctx);
	void *before_metrics_ctx;
	uint64_t idle_timeout_ms; /* 0: 60s */
	unsigned max_conns;       /* 0: HTTP_MAX_CONNS */
};

/* Connections a server holds at once by default: past them a new one is
 * closed as soon as it is accepted (counted in
 * mooncake_http_connections_refused_total, logged every 10 s at most). */
#define HTTP_MAX_CONNS 256
/* A request's head must have come whole this long after its first byte;
 * between requests a connection may stay silent for the idle timeout. */
#define HTTP_HEAD_TIMEOUT_MS 10000

/* Errors: -ENOMEM. */
int http_server_new(uv_loop_t *loop, const struct http_server_opts *opts,
		    struct http_server **out) MC_MUST_CHECK;
/* Listen on a numeric host:port (0 = ephemeral). Errors: -EINVAL,
 * negative errno of bind/listen. */
int http_server_listen(struct http_server *s, const char *hostport) MC_MUST_CHECK;
/* The bound port, 0 before listen. */
int http_server_port(const struct http_server *s);
/* Stop listening, close every connection, then call on_closed (from the
 * loop) after which the server may be freed with http_server_free. */
void http_server_close(struct http_server *s,
		       void (*on_closed)(struct http_server *s, void *ud), void *ud);
void http_server_free(struct http_server *s);

/* ---- the request parser, pure (exposed for tests and fuzzing) */

enum http_parse_result {
	HTTP_PARSE_INCOMPLETE = 0, /* need more bytes */
	HTTP_PARSE_OK = 1,         /* a request head was parsed */
	HTTP_PARSE_BAD = -1,       /* malformed: 400 */
	HTTP_PARSE_TOO_LARGE = -2, /* head over the limit: 431 */
};

struct http_request {
	char method[16];
	char path[256];
	int minor_version; /* HTTP/1.<minor> */
	int keep_alive;    /* after defaults and Connection: header */
	uint64_t content_length;
	size_t head_len; /* bytes of the head, incl. the blank line */
};

#define HTTP_MAX_HEAD 8192

/* Parse one request head from buf[0..len). */
enum http_parse_result http_parse_request(const char *buf, size_t len,
					  struct http_request *req);

#endif
