/*
 * http: a small HTTP/1.1 server for /metrics and /healthz. See http.h.
 *
 * Each connection owns a read buffer, an idle timer and at most one
 * response in flight: a request is parsed, answered with one uv_write, and
 * parsing resumes when the write completes, so pipelined requests are
 * answered in order without queueing. A connection is freed from the
 * close callback of the last of its two handles (socket and timer).
 */
#include "http/http.h"

#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/log.h"
#include "common/metrics.h"
#include "common/util.h"

#define LOG_SUBSYS LOGS_HTTP

struct http_conn {
	uv_tcp_t tcp;
	uv_timer_t timer;
	uv_write_t wreq;
	struct http_server *srv;
	struct http_conn *prev, *next;
	struct mc_buf in;
	struct mc_buf out;
	int handles_open;
	bool writing;
	bool close_after_write;
	bool closing;
	char peer[64];
};

struct http_server {
	uv_loop_t *loop;
	uv_tcp_t listener;
	bool listening;
	bool closing;
	int port;
	char name[64];
	struct metrics_registry *metrics;
	http_health_fn health;
	void *health_ctx;
	void (*before_metrics)(void *ctx);
	void *before_metrics_ctx;
	uint64_t idle_timeout_ms;
	size_t max_conns;
	uint64_t refused_logged_ms; /* last warning of a refused connection */
	struct http_conn *conns;    /* open, not closing */
	size_t nconns;              /* allocated, including closing ones */
	void (*on_closed)(struct http_server *s, void *ud);
	void *on_closed_ud;
	struct metric *m_metrics, *m_healthz, *m_other, *m_refused;
};

/* ------------------------------------------------------------ parser */

/* Find the end of the line starting at p; returns the index just past
 * "\n" and sets *content_len to the line length without CR LF, or 0 if no
 * line end is in buf[p..len). */
static size_t line_end(const char *buf, size_t p, size_t len, size_t *content_len)
{
	const char *nl = memchr(buf + p, '\n', len - p);
	if (!nl)
		return 0;
	size_t e = (size_t)(nl - buf);
	size_t n = e - p;
	if (n > 0 && buf[e - 1] == '\r')
		n--;
	*content_len = n;
	return e + 1;
}

static bool token_eq(const char *s, size_t n, const char *lit)
{
	return strlen(lit) == n && strncasecmp(s, lit, n) == 0;
}

enum http_parse_result http_parse_request(const char *buf, size_t len,
					  struct http_request *req)
{
	size_t n, p = 0, next;
	memset(req, 0, sizeof(*req));

	/* Tolerate blank lines before the request line (RFC 9112 2.2). */
	while ((next = line_end(buf, p, len, &n)) != 0 && n == 0)
		p = next;
	if (!next)
		return len > HTTP_MAX_HEAD ? HTTP_PARSE_TOO_LARGE : HTTP_PARSE_INCOMPLETE;

	/* Request line: METHOD SP target SP HTTP/1.x */
	const char *line = buf + p;
	const char *sp1 = memchr(line, ' ', n);
	if (!sp1)
		return HTTP_PARSE_BAD;
	const char *sp2 = memchr(sp1 + 1, ' ', n - (size_t)(sp1 + 1 - line));
	if (!sp2)
		return HTTP_PARSE_BAD;
	size_t mlen = (size_t)(sp1 - line), tlen = (size_t)(sp2 - sp1 - 1);
	size_t vlen = n - (size_t)(sp2 + 1 - line);
	if (mlen == 0 || mlen >= sizeof(req->method) || tlen == 0 || tlen >= sizeof(req->path))
		return HTTP_PARSE_BAD;
	for (size_t i = 0; i < mlen; i++)
		if (!isupper((unsigned char)line[i]))
			return HTTP_PARSE_BAD;
	memcpy(req->method, line, mlen);
	memcpy(req->path, sp1 + 1, tlen);
	for (size_t i = 0; i < tlen; i++)
		if ((unsigned char)req->path[i] <= 0x20 || (unsigned char)req->path[i] >= 0x7f)
			return HTTP_PARSE_BAD;
	if (vlen != 8 || memcmp(sp2 + 1, "HTTP/1.", 7) != 0 ||
	    (sp2[8] != '0' && sp2[8] != '1'))
		return HTTP_PARSE_BAD;
	req->minor_version = sp2[8] - '0';
	req->keep_alive = req->minor_version == 1;
	p = next;

	/* Header fields until the blank line. */
	for (;;) {
		next = line_end(buf, p, len, &n);
		if (!next)
			return len > HTTP_MAX_HEAD ? HTTP_PARSE_TOO_LARGE
						   : HTTP_PARSE_INCOMPLETE;
		if (next > HTTP_MAX_HEAD)
			return HTTP_PARSE_TOO_LARGE;
		if (n == 0)
			break;
		line = buf + p;
		if (line[0] == ' ' || line[0] == '\t')
			return HTTP_PARSE_BAD; /* obsolete line folding */
		const char *colon = memchr(line, ':', n);
		if (!colon || colon == line)
			return HTTP_PARSE_BAD;
		size_t nlen = (size_t)(colon - line);
		for (size_t i = 0; i < nlen; i++)
			if (line[i] == ' ' || line[i] == '\t')
				return HTTP_PARSE_BAD;
		const char *v = colon + 1, *vend = line + n;
		while (v < vend && (*v == ' ' || *v == '\t'))
			v++;
		while (vend > v && (vend[-1] == ' ' || vend[-1] == '\t'))
			vend--;
		size_t vl = (size_t)(vend - v);
		if (token_eq(line, nlen, "Connection")) {
			if (token_eq(v, vl, "close"))
				req->keep_alive = 0;
			else if (token_eq(v, vl, "keep-alive"))
				req->keep_alive = 1;
		} else if (token_eq(line, nlen, "Content-Length")) {
			uint64_t cl = 0;
			if (vl == 0 || vl > 18)
				return HTTP_PARSE_BAD;
			for (size_t i = 0; i < vl; i++) {
				if (!isdigit((unsigned char)v[i]))
					return HTTP_PARSE_BAD;
				cl = cl * 10 + (uint64_t)(v[i] - '0');
			}
			req->content_length = cl;
		} else if (token_eq(line, nlen, "Transfer-Encoding")) {
			return HTTP_PARSE_BAD; /* no request bodies here */
		}
		p = next;
	}
	req->head_len = next;
	return HTTP_PARSE_OK;
}

/* ------------------------------------------------------------ connections */

/* The last step of http_server_close: nothing of the server is left open. */
static void maybe_closed(struct http_server *s)
{
	if (s->closing && !s->listening && s->nconns == 0 && s->on_closed) {
		void (*cb)(struct http_server *, void *) = s->on_closed;
		s->on_closed = NULL;
		cb(s, s->on_closed_ud);
	}
}

static void conn_on_handle_closed(uv_handle_t *h)
{
	struct http_conn *c = h->data;
	if (--c->handles_open > 0)
		return;
	struct http_server *s = c->srv;
	mc_buf_free(&c->in);
	mc_buf_free(&c->out);
	free(c);
	s->nconns--;
	maybe_closed(s);
}

static void conn_close(struct http_conn *c)
{
	if (c->closing)
		return;
	c->closing = true;
	struct http_server *s = c->srv;
	if (c->prev)
		c->prev->next = c->next;
	else
		s->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	uv_close((uv_handle_t *)&c->tcp, conn_on_handle_closed);
	uv_close((uv_handle_t *)&c->timer, conn_on_handle_closed);
}

static void conn_on_idle(uv_timer_t *t)
{
	conn_close(t->data);
}

/* The connection's one deadline: a request head HTTP_HEAD_TIMEOUT_MS
 * after its first byte, else the idle timeout (between requests, or for
 * the client to take an answer). */
static void conn_deadline(struct http_conn *c, bool head)
{
	uint64_t ms = c->srv->idle_timeout_ms;
	if (head && ms > HTTP_HEAD_TIMEOUT_MS)
		ms = HTTP_HEAD_TIMEOUT_MS;
	uv_timer_start(&c->timer, conn_on_idle, ms, 0);
}

static const char *reason(int code)
{
	switch (code) {
	case 200:
		return "OK";
	case 400:
		return "Bad Request";
	case 404:
		return "Not Found";
	case 405:
		return "Method Not Allowed";
	case 431:
		return "Request Header Fields Too Large";
	case 500:
		return "Internal Server Error";
	case 503:
		return "Service Unavailable";
	default:
		return "Unknown";
	}
}

static void conn_on_written(uv_write_t *w, int status);
static void conn_process(struct http_conn *c);

/* Queue one response. Returns 0 or a negative errno (connection closed). */
static int conn_respond(struct http_conn *c, int code, const char *ctype,
			const struct mc_buf *body, bool head_only, bool keep_alive)
{
	size_t blen = body ? body->len : 0;
	mc_buf_reset(&c->out);
	int rc = mc_buf_printf(&c->out,
			       "HTTP/1.1 %d %s\r\nContent-Type: %s\r\n"
			       "Content-Length: %zu\r\nConnection: %s\r\n\r\n",
			       code, reason(code), ctype, blen,
			       keep_alive ? "keep-alive" : "close");
	if (rc == 0 && blen && !head_only)
		rc = mc_buf_append(&c->out, body->data, blen);
	if (rc) {
		log_warn("%s: response to %s: %s", c->srv->name, c->peer, mc_strerror(rc));
		conn_close(c);
		return rc;
	}
	uv_buf_t b = uv_buf_init(c->out.data, (unsigned)c->out.len);
	c->close_after_write = !keep_alive;
	rc = uv_write(&c->wreq, (uv_stream_t *)&c->tcp, &b, 1, conn_on_written);
	if (rc) {
		log_debug("%s: write to %s: %s", c->srv->name, c->peer, uv_strerror(rc));
		conn_close(c);
		return rc;
	}
	c->writing = true;
	conn_deadline(c, false);
	return 0;
}

static void conn_on_written(uv_write_t *w, int status)
{
	struct http_conn *c = MC_CONTAINER_OF(w, struct http_conn, wreq);
	c->writing = false;
	if (c->closing)
		return;
	if (status < 0 || c->close_after_write || c->srv->closing) {
		conn_close(c);
		return;
	}
	conn_process(c);
	if (!c->closing && !c->writing)
		conn_deadline(c, c->in.len > 0);
}

static void handle_request(struct http_conn *c, const struct http_request *req)
{
	struct http_server *s = c->srv;
	struct mc_buf body = MC_BUF_INIT;
	const char *ctype = "text/plain; charset=utf-8";
	bool head = strcmp(req->method, "HEAD") == 0;
	bool keep = req->keep_alive && !s->closing;
	int code;
	char path[256];

	/* The query string does not select anything here. */
	snprintf(path, sizeof(path), "%s", req->path);
	char *q = strchr(path, '?');
	if (q)
		*q = '\0';

	if (req->content_length > 0) {
		code = 400;
		keep = false;
		(void)!mc_buf_printf(&body, "request bodies are not accepted\n");
	} else if (strcmp(path, "/metrics") != 0 && strcmp(path, "/healthz") != 0) {
		code = 404;
		(void)!mc_buf_printf(&body, "not found; try /metrics or /healthz\n");
	} else if (strcmp(req->method, "GET") != 0 && !head) {
		code = 405;
		(void)!mc_buf_printf(&body, "only GET and HEAD\n");
	} else if (strcmp(path, "/metrics") == 0) {
		metric_inc(s->m_metrics);
		if (s->before_metrics)
			s->before_metrics(s->before_metrics_ctx);
		if (metrics_format(s->metrics, &body) != 0) {
			code = 500;
			mc_buf_reset(&body);
		} else {
			code = 200;
			ctype = "text/plain; version=0.0.4; charset=utf-8";
		}
	} else {
		metric_inc(s->m_healthz);
		if (s->health) {
			code = s->health(s->health_ctx, &body);
		} else {
			code = 200;
			(void)!mc_buf_printf(&body, "ok\n");
		}
	}
	if (code == 404 || code == 405 || code == 400)
		metric_inc(s->m_other);
	(void)conn_respond(c, code, ctype, &body, head, keep);
	mc_buf_free(&body);
}

/* Answer every complete request in the buffer, one at a time. */
static void conn_process(struct http_conn *c)
{
	while (!c->writing && !c->closing && c->in.len > 0) {
		struct http_request req;
		enum http_parse_result r = http_parse_request(c->in.data, c->in.len, &req);
		if (r == HTTP_PARSE_INCOMPLETE)
			return;
		if (r != HTTP_PARSE_OK) {
			int code = r == HTTP_PARSE_TOO_LARGE ? 431 : 400;
			log_debug("%s: %d for a request from %s", c->srv->name, code, c->peer);
			struct mc_buf body = MC_BUF_INIT;
			(void)!mc_buf_printf(&body, "%s\n", reason(code));
			metric_inc(c->srv->m_other);
			(void)conn_respond(c, code, "text/plain; charset=utf-8", &body, false,
					   false);
			mc_buf_free(&body);
			mc_buf_reset(&c->in);
			return;
		}
		mc_buf_consume(&c->in, req.head_len);
		handle_request(c, &req);
	}
}

static void conn_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
	struct http_conn *c = h->data;
	if (mc_buf_reserve(&c->in, 4096) != 0) {
		*buf = uv_buf_init(NULL, 0);
		return;
	}
	*buf = uv_buf_init(c->in.data + c->in.len,
			   (unsigned)MC_MIN(c->in.cap - c->in.len - 1, 65536));
}

static void conn_on_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf)
{
	struct http_conn *c = st->data;
	if (n < 0) {
		if (n != UV_EOF)
			log_debug("%s: read from %s: %s", c->srv->name, c->peer,
				  uv_strerror((int)n));
		conn_close(c);
		return;
	}
	if (n == 0)
		return;
	if (c->in.len == 0 && !c->writing)
		conn_deadline(c, true); /* a request begins */
	c->in.len += (size_t)n;
	c->in.data[c->in.len] = '\0';
	if (c->in.len > HTTP_MAX_HEAD + 65536) {
		conn_close(c); /* a client ignoring our answers */
		return;
	}
	conn_process(c);
}

static void srv_on_connection(uv_stream_t *l, int status)
{
	struct http_server *s = l->data;
	if (status < 0) {
		log_warn("%s: accept: %s", s->name, uv_strerror(status));
		return;
	}
	struct http_conn *c = calloc(1, sizeof(*c));
	if (!c) {
		log_warn("%s: accept: out of memory", s->name);
		return;
	}
	c->srv = s;
	uv_tcp_init(s->loop, &c->tcp);
	uv_timer_init(s->loop, &c->timer);
	c->tcp.data = c;
	c->timer.data = c;
	c->handles_open = 2;
	bool full = s->nconns >= s->max_conns;
	s->nconns++;
	c->next = s->conns;
	if (s->conns)
		s->conns->prev = c;
	s->conns = c;
	int rc = uv_accept(l, (uv_stream_t *)&c->tcp);
	if (rc) {
		log_warn("%s: accept: %s", s->name, uv_strerror(rc));
		conn_close(c);
		return;
	}
	struct sockaddr_storage ss;
	int sl = sizeof(ss);
	if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &sl) == 0)
		mc_format_addr((struct sockaddr *)&ss, c->peer, sizeof(c->peer));
	if (full) {
		metric_inc(s->m_refused);
		if (mc_once_per(&s->refused_logged_ms, 10000))
			log_warn("%s: %zu connections open, the most it holds: closing new "
				 "ones (%s the latest)",
				 s->name, s->max_conns, c->peer);
		conn_close(c);
		return;
	}
	uv_tcp_nodelay(&c->tcp, 1);
	conn_deadline(c, false);
	rc = uv_read_start((uv_stream_t *)&c->tcp, conn_alloc, conn_on_read);
	if (rc) {
		log_warn("%s: read from %s: %s", s->name, c->peer, uv_strerror(rc));
		conn_close(c);
	}
}

/* ------------------------------------------------------------ server */

int http_server_new(uv_loop_t *loop, const struct http_server_opts *opts,
		    struct http_server **out)
{
	struct http_server *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->loop = loop;
	snprintf(s->name, sizeof(s->name), "%s", opts && opts->name ? opts->name : "http");
	s->metrics = opts && opts->metrics ? opts->metrics : metrics_global();
	s->health = opts ? opts->health : NULL;
	s->health_ctx = opts ? opts->health_ctx : NULL;
	s->before_metrics = opts ? opts->before_metrics : NULL;
	s->before_metrics_ctx = opts ? opts->before_metrics_ctx : NULL;
	s->idle_timeout_ms = opts && opts->idle_timeout_ms ? opts->idle_timeout_ms : 60000;
	s->max_conns = opts && opts->max_conns ? opts->max_conns : HTTP_MAX_CONNS;
	static const char *const help = "HTTP requests served, by path.";
	s->m_metrics = metrics_counter(s->metrics, "mooncake_http_requests_total", help,
				       "server,path", (const char *[]){s->name, "/metrics"});
	s->m_healthz = metrics_counter(s->metrics, "mooncake_http_requests_total", help,
				       "server,path", (const char *[]){s->name, "/healthz"});
	s->m_other = metrics_counter(s->metrics, "mooncake_http_requests_total", help,
				     "server,path", (const char *[]){s->name, "other"});
	s->m_refused = metrics_counter(s->metrics, "mooncake_http_connections_refused_total",
				       "HTTP connections closed at once: the server held "
				       "the most it holds.",
				       "server", (const char *[]){s->name});
	*out = s;
	return 0;
}

int http_server_listen(struct http_server *s, const char *hostport)
{
	struct sockaddr_storage ss;
	int rc = mc_parse_hostport(hostport, &ss);
	if (rc)
		return rc;
	if (s->listening || s->closing)
		return -EALREADY;
	uv_tcp_init(s->loop, &s->listener);
	s->listener.data = s;
	s->listening = true;
	rc = uv_tcp_bind(&s->listener, (struct sockaddr *)&ss, 0);
	if (rc == 0)
		rc = uv_listen((uv_stream_t *)&s->listener, 128, srv_on_connection);
	if (rc)
		return rc; /* the caller closes the server */
	struct sockaddr_storage bound;
	int bl = sizeof(bound);
	if (uv_tcp_getsockname(&s->listener, (struct sockaddr *)&bound, &bl) == 0) {
		char addr[64];
		mc_format_addr((struct sockaddr *)&bound, addr, sizeof(addr));
		const char *colon = strrchr(addr, ':');
		s->port = colon ? atoi(colon + 1) : 0;
		log_info("%s: HTTP /metrics and /healthz on %s", s->name, addr);
	}
	return 0;
}

int http_server_port(const struct http_server *s)
{
	return s->port;
}

static void srv_on_listener_closed(uv_handle_t *h)
{
	struct http_server *s = h->data;
	s->listening = false;
	maybe_closed(s);
}

void http_server_close(struct http_server *s,
		       void (*on_closed)(struct http_server *s, void *ud), void *ud)
{
	if (s->closing)
		return;
	s->closing = true;
	s->on_closed = on_closed;
	s->on_closed_ud = ud;
	while (s->conns)
		conn_close(s->conns);
	if (s->listening) {
		uv_close((uv_handle_t *)&s->listener, srv_on_listener_closed);
	} else if (on_closed) {
		/* Nothing to wait for: still report from the loop, not here. */
		s->listening = true;
		uv_tcp_init(s->loop, &s->listener);
		s->listener.data = s;
		uv_close((uv_handle_t *)&s->listener, srv_on_listener_closed);
	}
}

void http_server_free(struct http_server *s)
{
	free(s);
}
