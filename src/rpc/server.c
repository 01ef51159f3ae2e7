/*
 * server: the gRPC server object (rpc.h): its services and their methods,
 * its listeners, its graceful shutdown and its end. The calls, the HTTP/2
 * connections that carry them and the calls handed over in process are
 * the server's other files (server_int.h).
 *
 * Shutdown follows the gRPC graceful pattern: close the listeners, let
 * every connection know (a GOAWAY, sconn.c) and let the calls in flight
 * finish. Connections close when their last call ends; at
 * drain_timeout_ms the rest are closed, which cancels their calls, and
 * in-process calls end UNAVAILABLE. The server is done when its last
 * listener, connection and call are gone and its handles are closed.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/metrics.h"
#include "common/util.h"
#include "rpc/server_int.h"

#define LOG_SUBSYS LOGS_RPC

struct svc {
	struct svc *next;
	char *name;
	size_t name_len;
	const struct rpc_method *methods;
	size_t n;
	void *data;
	struct rpc__mstats *stats;
};

struct listener {
	uv_tcp_t tcp;
	struct rpc_server *s;
	int port;
	struct sockaddr_storage addr; /* bound */
};

/* ---------------------------------------------------------------- for the server's files */

const char *rpc__server_name(const struct rpc_server *s)
{
	return s->name;
}

uv_loop_t *rpc__server_loop(const struct rpc_server *s)
{
	return s->loop;
}

bool rpc__server_shutting_down(const struct rpc_server *s)
{
	return s->shutting_down;
}

bool rpc__server_drain_expired(const struct rpc_server *s)
{
	return s->drain_expired;
}

int rpc__server_find_method(const struct rpc_server *s, const char *path,
			    const struct rpc_method **m, void **svc_data,
			    struct rpc__mstats **stats, char *why, size_t wlen)
{
	const char *slash = path && path[0] == '/' ? strrchr(path, '/') : NULL;
	if (!slash || slash == path) {
		snprintf(why, wlen, "malformed method name \"%s\"", path ? path : "");
		return -ENOENT;
	}
	size_t slen = (size_t)(slash - path - 1);
	const struct svc *svc = s->svcs;
	while (svc && !(svc->name_len == slen && memcmp(svc->name, path + 1, slen) == 0))
		svc = svc->next;
	if (!svc) {
		snprintf(why, wlen, "unknown service %.*s", (int)slen, path + 1);
		return -ENOENT;
	}
	size_t i;
	for (i = 0; i < svc->n && strcmp(svc->methods[i].name, slash + 1) != 0; i++)
		;
	if (i == svc->n) {
		snprintf(why, wlen, "unknown method %s for service %s", slash + 1, svc->name);
		return -ENOENT;
	}
	*m = &svc->methods[i];
	*svc_data = svc->data;
	*stats = &svc->stats[i];
	return 0;
}

/* Does a listener bound to l accept connections made to to? Exact
 * address and port, or a wildcard listener and a loopback target. */
static bool addr_reaches(const struct sockaddr_storage *l, const struct sockaddr *to)
{
	if (l->ss_family != to->sa_family)
		return false;
	if (to->sa_family == AF_INET) {
		const struct sockaddr_in *a = (const struct sockaddr_in *)l;
		const struct sockaddr_in *b = (const struct sockaddr_in *)to;
		if (a->sin_port != b->sin_port)
			return false;
		return a->sin_addr.s_addr == b->sin_addr.s_addr ||
		       (a->sin_addr.s_addr == htonl(INADDR_ANY) &&
			(ntohl(b->sin_addr.s_addr) >> 24) == 127);
	}
	if (to->sa_family == AF_INET6) {
		const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)l;
		const struct sockaddr_in6 *b = (const struct sockaddr_in6 *)to;
		if (a->sin6_port != b->sin6_port)
			return false;
		return IN6_ARE_ADDR_EQUAL(&a->sin6_addr, &b->sin6_addr) ||
		       (IN6_IS_ADDR_UNSPECIFIED(&a->sin6_addr) &&
			IN6_IS_ADDR_LOOPBACK(&b->sin6_addr));
	}
	return false;
}

bool rpc__server_listens_at(const struct rpc_server *s, const struct sockaddr *to)
{
	for (unsigned i = 0; i < s->nlisteners; i++)
		if (addr_reaches(&s->listeners[i]->addr, to))
			return true;
	return false;
}

/* ---------------------------------------------------------------- creation */

static int server_init_timers(struct rpc_server *s)
{
	if (s->timers_ready)
		return 0;
	rpc__calls_init_timer(&s->calls, s->loop);
	uv_timer_init(s->loop, &s->drain_timer);
	rpc__inproc_init_handle(&s->ip, s->loop);
	s->timers_ready = true;
	s->timers_open = 3;
	return 0;
}

int rpc_server_new(uv_loop_t *loop, const struct rpc_server_opts *opts,
		   struct rpc_server **out)
{
	struct rpc_server *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->loop = loop;
	s->name = strdup(opts && opts->name ? opts->name : "rpc");
	s->reg = opts && opts->metrics ? opts->metrics : metrics_global();
	if (!s->name)
		goto err_free;
	if (rpc__calls_init(&s->calls, s->reg, s->name,
			    opts && opts->max_message_bytes ? opts->max_message_bytes
							    : RPC__DEFAULT_MAX_MESSAGE_BYTES,
			    opts ? opts->max_call_memory : 0))
		goto err_free;
	if (rpc__sconns_init(&s->conns, s, opts, s->reg, s->name))
		goto err_free;
	*out = s;
	return 0;

err_free:
	rpc__calls_free(&s->calls);
	free(s->name);
	free(s);
	return -ENOMEM;
}

int rpc_server_add_service(struct rpc_server *s, const char *service,
			   const struct rpc_method *methods, size_t nmethods, void *data)
{
	for (struct svc *v = s->svcs; v; v = v->next)
		if (strcmp(v->name, service) == 0)
			return -EEXIST;
	for (size_t i = 0; i < nmethods; i++) {
		const struct rpc_method *m = &methods[i];
		if (!m->name || !m->request || !m->response || !m->on_message)
			return -EINVAL;
		if ((m->kind == RPC_CLIENT_STREAMING || m->kind == RPC_BIDI_STREAMING) &&
		    !m->on_start)
			return -EINVAL;
	}
	struct svc *v = calloc(1, sizeof(*v));
	if (!v)
		return -ENOMEM;
	v->name = strdup(service);
	v->name_len = strlen(service);
	v->methods = methods;
	v->n = nmethods;
	v->data = data;
	v->stats = calloc(nmethods ? nmethods : 1, sizeof(*v->stats));
	if (!v->name || !v->stats)
		goto err;
	for (size_t i = 0; i < nmethods; i++)
		if (rpc__mstats_init(&v->stats[i], s->reg, s->name, service, methods[i].name,
				     methods[i].long_poll, methods[i].kind != RPC_UNARY))
			goto err;
	v->next = s->svcs;
	s->svcs = v;
	return 0;
err:
	if (v->stats)
		for (size_t i = 0; i < nmethods; i++)
			free(v->stats[i].path);
	free(v->stats);
	free(v->name);
	free(v);
	return -ENOMEM;
}

/* ---------------------------------------------------------------- listeners */

static void on_connection(uv_stream_t *ls, int status)
{
	struct listener *l = MC_CONTAINER_OF((uv_tcp_t *)ls, struct listener, tcp);
	struct rpc_server *s = l->s;

	if (status < 0) {
		log_warn("%s: accept failed: %s", s->name, uv_strerror(status));
		return;
	}
	rpc__sconns_accept(&s->conns, ls);
}

static void on_listener_closed(uv_handle_t *h)
{
	struct listener *l = MC_CONTAINER_OF((uv_tcp_t *)h, struct listener, tcp);
	struct rpc_server *s = l->s;
	s->listeners_open--;
	rpc__server_check_done(s);
}

static void on_failed_listener_closed(uv_handle_t *h)
{
	free(MC_CONTAINER_OF((uv_tcp_t *)h, struct listener, tcp));
}

int rpc_server_listen(struct rpc_server *s, const char *hostport)
{
	struct sockaddr_storage ss;
	int rc;

	if (s->shutting_down)
		return -EINVAL;
	if (mc_parse_hostport(hostport, &ss))
		return -EINVAL;
	struct listener **ls = realloc(s->listeners, (s->nlisteners + 1) * sizeof(*ls));
	if (!ls)
		return -ENOMEM;
	s->listeners = ls;
	struct listener *l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	l->s = s;
	server_init_timers(s);
	rc = uv_tcp_init(s->loop, &l->tcp);
	if (rc < 0) {
		free(l);
		return rc;
	}
	rc = uv_tcp_bind(&l->tcp, (const struct sockaddr *)&ss, 0);
	if (rc == 0)
		rc = uv_listen((uv_stream_t *)&l->tcp, 511, on_connection);
	if (rc < 0) {
		log_error("%s: cannot listen on %s: %s", s->name, hostport, uv_strerror(rc));
		uv_close((uv_handle_t *)&l->tcp, on_failed_listener_closed);
		return rc;
	}
	int len = sizeof(ss);
	if (uv_tcp_getsockname(&l->tcp, (struct sockaddr *)&ss, &len) == 0)
		l->port = ntohs(ss.ss_family == AF_INET6
					? ((struct sockaddr_in6 *)&ss)->sin6_port
					: ((struct sockaddr_in *)&ss)->sin_port);
	l->addr = ss;
	s->listeners[s->nlisteners++] = l;
	s->listeners_open++;
	rpc__inproc_list(s, true);
	char addr[80];
	mc_format_addr((struct sockaddr *)&ss, addr, sizeof(addr));
	log_info("%s: listening on %s", s->name, addr);
	return 0;
}

void rpc_server_set_max_recv_bytes(struct rpc_server *s, size_t bytes)
{
	rpc__calls_set_max_recv(&s->calls, bytes);
}

int rpc_server_port(const struct rpc_server *s, unsigned i)
{
	return i < s->nlisteners ? s->listeners[i]->port : 0;
}

/* ---------------------------------------------------------------- shutdown */

static void on_timer_closed(uv_handle_t *h)
{
	struct rpc_server *s = h->data;
	if (--s->timers_open == 0) {
		s->done = true;
		log_info("%s: shutdown complete", s->name);
		if (s->on_done)
			s->on_done(s, s->done_ud);
	}
}

void rpc__server_check_done(struct rpc_server *s)
{
	if (!s->shutting_down || s->finalizing)
		return;
	if (rpc__sconns_count(&s->conns) || s->listeners_open || rpc__calls_live(&s->calls))
		return;
	s->finalizing = true;
	s->drain_timer.data = s;
	rpc__calls_close(&s->calls, s, on_timer_closed);
	uv_close((uv_handle_t *)&s->drain_timer, on_timer_closed);
	rpc__inproc_close(&s->ip, s, on_timer_closed);
}

static void on_drain_timeout(uv_timer_t *t)
{
	struct rpc_server *s = MC_CONTAINER_OF(t, struct rpc_server, drain_timer);
	s->drain_expired = true;
	rpc__inproc_abort_all(&s->ip);
	if (rpc__sconns_count(&s->conns))
		log_info("%s: drain timeout: cancelling %u calls on %u connections", s->name,
			 rpc__calls_live(&s->calls), rpc__sconns_count(&s->conns));
	rpc__sconns_close_all(&s->conns);
}

void rpc_server_shutdown(struct rpc_server *s, uint64_t drain_timeout_ms,
			 void (*on_done)(struct rpc_server *s, void *ud), void *ud)
{
	if (s->shutting_down)
		return;
	s->shutting_down = true;
	rpc__inproc_list(s, false);
	s->on_done = on_done;
	s->done_ud = ud;
	server_init_timers(s);
	log_info("%s: shutting down: %u calls on %u connections, drain up to %llu ms", s->name,
		 rpc__calls_live(&s->calls), rpc__sconns_count(&s->conns),
		 (unsigned long long)drain_timeout_ms);
	if (s->health)
		rpc__health_shutdown(s->health);
	for (unsigned i = 0; i < s->nlisteners; i++)
		uv_close((uv_handle_t *)&s->listeners[i]->tcp, on_listener_closed);
	rpc__sconns_drain(&s->conns);
	uv_timer_start(&s->drain_timer, on_drain_timeout, drain_timeout_ms, 0);
	rpc__server_check_done(s);
}

void rpc_server_free(struct rpc_server *s)
{
	if (!s)
		return;
	if ((s->timers_ready && !s->done) || rpc__sconns_count(&s->conns) ||
	    rpc__calls_live(&s->calls)) {
		log_error("%s: rpc_server_free before shutdown completed; leaking it",
			  s->name);
		return;
	}
	rpc__inproc_list(s, false);
	if (s->health)
		rpc__health_free(s->health);
	while (s->svcs) {
		struct svc *v = s->svcs;
		s->svcs = v->next;
		for (size_t i = 0; i < v->n; i++)
			free(v->stats[i].path);
		free(v->stats);
		free(v->name);
		free(v);
	}
	for (unsigned i = 0; i < s->nlisteners; i++)
		free(s->listeners[i]);
	free(s->listeners);
	rpc__calls_free(&s->calls);
	rpc__sconns_free(&s->conns);
	rpc__auth_free(s);
	free(s->name);
	free(s);
}

int rpc__server_set_health(struct rpc_server *s, struct rpc_health *h)
{
	if (s->health)
		return -EEXIST;
	s->health = h;
	return 0;
}
