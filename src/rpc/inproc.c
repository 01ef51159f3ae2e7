/*
 * inproc: unary calls a client hands to a server on its own loop, with
 * no connection (server_int.h; the client's side is in client.c).
 *
 * A client made with local_calls whose target is one of this server's
 * listeners, on the same loop, hands a unary call over directly
 * (rpc__server_inproc_start): the serialized request is unpacked and
 * dispatched from the server's idle handle on the loop's next turn, the
 * handler sees a call like any other (peer "in-process", no headers), and
 * the final status gives the status and the serialized response to the
 * client (rpc__client_inproc_done). The client's side holds the reference
 * an HTTP/2 stream holds for a network call; it is dropped when the
 * answer is delivered or the client cancels (rpc__server_inproc_cancel).
 * Same deadlines, metrics, size limits and drain as a network call; no
 * socket, no HTTP/2 framing, no wakeup of another thread.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>

#include "common/util.h"
#include "rpc/server_int.h"

/* ---------------------------------------------------------------- the servers of this process */

/* Servers that listen, for clients on the same loop to find (the list is
 * process-wide; each server is only ever used from its loop's thread). */
static pthread_mutex_t local_mu = PTHREAD_MUTEX_INITIALIZER;
static struct rpc_server *local_head;

void rpc__inproc_list(struct rpc_server *s, bool on)
{
	struct rpc__inproc *ip = &s->ip;
	pthread_mutex_lock(&local_mu);
	if (on && !ip->listed) {
		ip->next = local_head;
		local_head = s;
		ip->listed = true;
	} else if (!on && ip->listed) {
		struct rpc_server **pp = &local_head;
		while (*pp != s)
			pp = &(*pp)->ip.next;
		*pp = ip->next;
		ip->listed = false;
	}
	pthread_mutex_unlock(&local_mu);
}

struct rpc_server *rpc__server_local(uv_loop_t *loop, const struct sockaddr *to)
{
	struct rpc_server *found = NULL;
	pthread_mutex_lock(&local_mu);
	for (struct rpc_server *s = local_head; s && !found; s = s->ip.next)
		if (rpc__server_loop(s) == loop && !rpc__server_shutting_down(s) &&
		    rpc__server_listens_at(s, to))
			found = s;
	pthread_mutex_unlock(&local_mu);
	return found;
}

/* ---------------------------------------------------------------- the transport */

static void icall_unlink(struct rpc_call *call)
{
	struct rpc__inproc *ip = &call->s->ip;
	struct rpc__icall *ic = &call->ic;
	if (ic->prev)
		ic->prev->ic.next = ic->next;
	else
		ip->calls = ic->next;
	if (ic->next)
		ic->next->ic.prev = ic->prev;
	ic->prev = ic->next = NULL;
	ic->st = NULL;
}

static bool inproc_can_send(const struct rpc_call *call)
{
	return call->ic.st != NULL;
}

static int inproc_on_send(struct rpc_call *call)
{
	return 0; /* handed over whole at the end */
}

/* The call's final status is decided: hand it and the response to the
 * client, and drop the client's reference. */
static void inproc_on_done(struct rpc_call *call, bool aborted)
{
	struct rpc_stream *st = call->ic.st;
	if (!st)
		return;
	icall_unlink(call);
	const char *emsg;
	int status = rpc__call_status(call, &emsg);
	const uint8_t *body = NULL;
	size_t len = 0;
	if (status == RPC_OK && call->outq.head) {
		body = call->outq.head->data + 5;
		len = call->outq.head->len - 5;
	}
	char msg[512] = "";
	if (emsg)
		rpc_percent_decode(emsg, msg, sizeof(msg));
	rpc__call_ref(call);
	rpc__client_inproc_done(st, status, msg, body, len);
	rpc__call_unref(call); /* the client's */
	rpc__call_unref(call);
}

static const struct rpc__call_tp inproc_tp = {
	.outq_ops = NULL,
	.can_send = inproc_can_send,
	.on_send = inproc_on_send,
	.on_done = inproc_on_done,
	.on_reject = NULL,
};

/* ---------------------------------------------------------------- calls */

/* Run the calls handed over since the last turn. */
static void on_inproc_idle(uv_idle_t *h)
{
	struct rpc__inproc *ip = MC_CONTAINER_OF(h, struct rpc__inproc, idle);
	struct rpc_call *q = ip->q_head;
	ip->q_head = ip->q_tail = NULL;
	uv_idle_stop(h);
	while (q) {
		struct rpc_call *call = q;
		q = call->ic.q_next;
		call->ic.q_next = NULL;
		struct rpc__omsg *req = call->ic.req;
		call->ic.req = NULL;
		if (call->ic.st) /* not cancelled before its turn */
			rpc__call_unary(call, call->ic.timeout_ms, req->data + 5,
					req->len - 5);
		rpc__omsg_unref(req);
		rpc__call_unref(call); /* the queue's */
	}
}

int rpc__server_inproc_start(struct rpc_server *s, const char *path, struct rpc__omsg *req,
			     uint64_t timeout_ms, struct rpc_stream *st, struct rpc_call **out)
{
	struct rpc__inproc *ip = &s->ip;
	if (rpc__server_shutting_down(s) || !ip->ready)
		return -ECANCELED;
	struct rpc_call *call = rpc__call_new(s, &inproc_tp, "in-process");
	if (!call)
		return -ENOMEM;
	int rc = rpc__call_route(call, path);
	if (rc && rc != -ENOENT) { /* -ENOENT: answered UNIMPLEMENTED on its turn */
		rpc__call_unref(call);
		return rc;
	}
	rc = rpc__omsg_flat(req, &call->ic.req);
	if (rc) {
		rpc__call_unref(call);
		return rc;
	}
	call->ic.st = st;
	call->ic.timeout_ms = timeout_ms;
	call->ic.next = ip->calls;
	if (ip->calls)
		ip->calls->ic.prev = call;
	ip->calls = call;
	rpc__call_ref(call); /* the dispatch queue's */
	if (ip->q_tail)
		ip->q_tail->ic.q_next = call;
	else
		ip->q_head = call;
	ip->q_tail = call;
	uv_idle_start(&ip->idle, on_inproc_idle);
	*out = call;
	return 0;
}

void rpc__server_inproc_cancel(struct rpc_call *call)
{
	if (!call->ic.st)
		return;
	icall_unlink(call);
	rpc__omsg_unref(call->ic.req); /* the client's buffer: not past its stream */
	call->ic.req = NULL;
	rpc__call_ref(call);
	rpc__call_gone(call);
	rpc__call_unref(call); /* the client's */
	rpc__call_unref(call);
}

/* ---------------------------------------------------------------- the in-process calls of a server */

void rpc__inproc_init_handle(struct rpc__inproc *ip, uv_loop_t *loop)
{
	uv_idle_init(loop, &ip->idle);
	ip->ready = true;
}

void rpc__inproc_abort_all(struct rpc__inproc *ip)
{
	while (ip->calls) {
		struct rpc_call *call = ip->calls;
		rpc__call_ref(call);
		rpc__call_abort(call, RPC_UNAVAILABLE, "server shutting down");
		rpc__call_unref(call);
	}
}

void rpc__inproc_close(struct rpc__inproc *ip, void *data, uv_close_cb cb)
{
	ip->idle.data = data;
	uv_close((uv_handle_t *)&ip->idle, cb);
}
