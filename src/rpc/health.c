/*
 * health: the standard grpc.health.v1.Health service
 * (grpc/doc/health-checking.md) on an rpc_server.
 *
 * The health object keeps one entry per service name with its status and
 * the Watch calls that follow it. Check answers the status, or NOT_FOUND
 * for a name never set. Watch sends the current status at once
 * (SERVICE_UNKNOWN for a name never set, and stays open), then one
 * message per change. The overall service "" starts SERVING.
 *
 * When the server's shutdown begins every name turns NOT_SERVING, the
 * watchers hear it, and their streams end (UNAVAILABLE) so that they do
 * not hold the drain open: a watcher learns the server is going away
 * and reconnects elsewhere.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "health.pb-c.h"
#include "rpc/rpc_int.h"

#define LOG_SUBSYS LOGS_RPC

struct watcher {
	struct watcher *next;
	struct rpc_call *call;
	struct hentry *e;
};

struct hentry {
	struct hentry *next;
	char *name;
	enum rpc_health_status status;
	bool known; /* set by rpc_health_set (not only watched) */
	struct watcher *watchers;
};

struct rpc_health {
	struct rpc_server *s;
	struct hentry *entries;
	bool shutdown;
};

static struct hentry *entry_find(struct rpc_health *h, const char *name)
{
	for (struct hentry *e = h->entries; e; e = e->next)
		if (strcmp(e->name, name) == 0)
			return e;
	return NULL;
}

static struct hentry *entry_get(struct rpc_health *h, const char *name)
{
	struct hentry *e = entry_find(h, name);
	if (e)
		return e;
	e = calloc(1, sizeof(*e));
	if (!e)
		return NULL;
	e->name = strdup(name);
	if (!e->name) {
		free(e);
		return NULL;
	}
	e->status = RPC_HEALTH_SERVICE_UNKNOWN;
	e->next = h->entries;
	h->entries = e;
	return e;
}

static int send_status(struct rpc_call *call, enum rpc_health_status st)
{
	Grpc__Health__V1__HealthCheckResponse resp =
		GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
	resp.status = (Grpc__Health__V1__HealthCheckResponse__ServingStatus)st;
	return rpc_call_send(call, &resp.base);
}

static void check_on_message(struct rpc_call *call, const ProtobufCMessage *msg)
{
	struct rpc_health *h = rpc_call_service_data(call);
	const Grpc__Health__V1__HealthCheckRequest *req =
		(const Grpc__Health__V1__HealthCheckRequest *)msg;
	struct hentry *e = entry_find(h, req->service ? req->service : "");

	if (!e || !e->known) {
		rpc_call_finish(call, RPC_NOT_FOUND, "unknown service");
		return;
	}
	int rc = send_status(call, e->status);
	rpc_call_finish(call, rc ? RPC_INTERNAL : RPC_OK, rc ? mc_strerror(rc) : NULL);
}

static void watcher_remove(struct watcher *w)
{
	for (struct watcher **p = &w->e->watchers; *p; p = &(*p)->next) {
		if (*p == w) {
			*p = w->next;
			break;
		}
	}
	free(w);
}

static void watch_on_message(struct rpc_call *call, const ProtobufCMessage *msg)
{
	struct rpc_health *h = rpc_call_service_data(call);
	const Grpc__Health__V1__HealthCheckRequest *req =
		(const Grpc__Health__V1__HealthCheckRequest *)msg;

	if (h->shutdown) {
		(void)send_status(call, RPC_HEALTH_NOT_SERVING);
		rpc_call_finish(call, RPC_UNAVAILABLE, "server shutting down");
		return;
	}
	struct hentry *e = entry_get(h, req->service ? req->service : "");
	struct watcher *w = e ? calloc(1, sizeof(*w)) : NULL;
	if (!w) {
		rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, "out of memory");
		return;
	}
	w->call = call;
	w->e = e;
	w->next = e->watchers;
	e->watchers = w;
	rpc_call_set_data(call, w);
	int rc = send_status(call, e->known ? e->status : RPC_HEALTH_SERVICE_UNKNOWN);
	if (rc) {
		watcher_remove(w);
		rpc_call_finish(call, RPC_INTERNAL, mc_strerror(rc));
	}
}

static void watch_on_cancel(struct rpc_call *call)
{
	struct watcher *w = rpc_call_data(call);
	if (w)
		watcher_remove(w);
	rpc_call_finish(call, RPC_CANCELLED, NULL);
}

static const struct rpc_method health_methods[] = {
	{
		.name = "Check",
		.kind = RPC_UNARY,
		.request = &grpc__health__v1__health_check_request__descriptor,
		.response = &grpc__health__v1__health_check_response__descriptor,
		.on_message = check_on_message,
	},
	{
		.name = "Watch",
		.kind = RPC_SERVER_STREAMING,
		.request = &grpc__health__v1__health_check_request__descriptor,
		.response = &grpc__health__v1__health_check_response__descriptor,
		.on_message = watch_on_message,
		.on_cancel = watch_on_cancel,
	},
};

int rpc_health_add(struct rpc_server *s, struct rpc_health **out)
{
	struct rpc_health *h = calloc(1, sizeof(*h));
	int rc;

	if (!h)
		return -ENOMEM;
	h->s = s;
	struct hentry *e = entry_get(h, "");
	if (!e) {
		rc = -ENOMEM;
		goto err_free;
	}
	e->known = true;
	e->status = RPC_HEALTH_SERVING;
	rc = rpc__server_set_health(s, h);
	if (rc)
		goto err_free;
	rc = rpc_server_add_service(s, "grpc.health.v1.Health", health_methods,
				    MC_ARRAY_LEN(health_methods), h);
	if (rc) {
		/* The server owns h now and frees it. */
		return rc;
	}
	*out = h;
	return 0;

err_free:
	rpc__health_free(h);
	return rc;
}

static void entry_set(struct hentry *e, enum rpc_health_status status)
{
	bool changed = !e->known || e->status != status;
	e->known = true;
	e->status = status;
	if (!changed)
		return;
	for (struct watcher *w = e->watchers; w;) {
		struct watcher *next = w->next;
		int rc = send_status(w->call, status);
		if (rc && rc != -ECANCELED)
			log_warn("health: update for \"%s\" to %s not sent: %s", e->name,
				 rpc_call_peer(w->call), mc_strerror(rc));
		w = next;
	}
}

int rpc_health_set(struct rpc_health *h, const char *service, enum rpc_health_status status)
{
	if (!service || status < RPC_HEALTH_UNKNOWN || status > RPC_HEALTH_SERVICE_UNKNOWN)
		return -EINVAL;
	struct hentry *e = entry_get(h, service);
	if (!e)
		return -ENOMEM;
	entry_set(e, h->shutdown && status == RPC_HEALTH_SERVING ? RPC_HEALTH_NOT_SERVING
								 : status);
	return 0;
}

void rpc__health_shutdown(struct rpc_health *h)
{
	h->shutdown = true;
	for (struct hentry *e = h->entries; e; e = e->next) {
		if (e->known)
			entry_set(e, RPC_HEALTH_NOT_SERVING);
		while (e->watchers) {
			struct watcher *w = e->watchers;
			struct rpc_call *call = w->call;
			e->watchers = w->next;
			free(w);
			rpc_call_set_data(call, NULL);
			rpc_call_finish(call, RPC_UNAVAILABLE, "server shutting down");
		}
	}
}

void rpc__health_free(struct rpc_health *h)
{
	while (h->entries) {
		struct hentry *e = h->entries;
		h->entries = e->next;
		while (e->watchers) {
			struct watcher *w = e->watchers;
			e->watchers = w->next;
			free(w);
		}
		free(e->name);
		free(e);
	}
	free(h);
}

void rpc_health_foreach(const struct rpc_health *h,
			void (*fn)(void *ud, const char *service,
				   enum rpc_health_status status),
			void *ud)
{
	for (const struct hentry *e = h->entries; e; e = e->next)
		if (e->known)
			fn(ud, e->name, e->status);
}
