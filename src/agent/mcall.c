/*
 * mcall: the agent's calls to the master leader. A call goes to the
 * master in use (chosen by the master link, mlink.c); while none is
 * known, or it cannot be reached, the call is parked and waits (up to
 * its deadline) for one. A standby's answer "-807 not the leader:
 * leader=H:P view=N" parks the call and hands the leader it names to the
 * link (the on_leader hook), which moves every call there. Parked calls
 * are sent again, or failed past their deadline, by agent__mcall_poll,
 * which the link ticks. Nothing here calls another part of the agent.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/agent_int.h"
#include "agent/mcall.h"
#include "common/log.h"
#include "common/util.h"
#include "rpc/rpc.h"

#define LOG_SUBSYS LOGS_AGENT

#define SERVICE "/mooncake.master.Master/"
#define RETRY_MS 100
#define MAX_REDIRECTS 4

struct agent_mcall {
	struct agent_mcall *prev, *next;
	struct agent *a;
	char path[64];
	const ProtobufCMessage *req;
	const ProtobufCMessageDescriptor *resp_desc;
	agent_mcall_cb cb;
	void *ud;
	uint64_t deadline_ms;
	uint64_t not_before_ms; /* retry no earlier than this */
	unsigned redirects;
	struct rpc_stream *st; /* in flight, or NULL while waiting */
	int fail_err;          /* could not be sent: end with this */
};

static void mcall_send(struct agent_mcall *c);

/* ------------------------------------------------------------ errors */

int agent__master_err(int status, const char *message)
{
	if (message && message[0] == '-' && message[1] >= '0' && message[1] <= '9') {
		char *end;
		long v = strtol(message, &end, 10);
		if (v < 0 && v > -100000 && (*end == ' ' || *end == '\0'))
			return (int)v;
	}
	switch (status) {
	case RPC_OK:
		return 0;
	case RPC_DEADLINE_EXCEEDED:
		return MC_ETIMEDOUT;
	case RPC_UNAVAILABLE:
		return MC_EUNAVAILABLE;
	case RPC_CANCELLED:
		return MC_ECANCELLED;
	case RPC_NOT_FOUND:
		return MC_EOBJECT_NOT_FOUND;
	case RPC_ALREADY_EXISTS:
		return MC_EOBJECT_ALREADY_EXISTS;
	case RPC_INVALID_ARGUMENT:
		return -EINVAL;
	case RPC_RESOURCE_EXHAUSTED:
		return MC_ENO_SPACE;
	case RPC_UNIMPLEMENTED:
		return -EOPNOTSUPP;
	default:
		return MC_EINTERNAL;
	}
}

/* "... leader=HOST:PORT view=N" -> addr ("" for none), view. */
static bool parse_redirect(const char *msg, char *addr, size_t alen, uint64_t *view)
{
	const char *l = msg ? strstr(msg, "leader=") : NULL;
	if (!l)
		return false;
	l += 7;
	size_t n = strcspn(l, " ");
	if (n >= alen)
		return false;
	memcpy(addr, l, n);
	addr[n] = '\0';
	if (strcmp(addr, "none") == 0)
		addr[0] = '\0';
	const char *v = strstr(l, "view=");
	*view = v ? strtoull(v + 5, NULL, 10) : 0;
	return true;
}

/* ------------------------------------------------------------ calls */

static void mcall_unlink(struct agent_mcall *c)
{
	struct agent_mcalls *m = &c->a->mcalls;
	if (c->prev)
		c->prev->next = c->next;
	else
		m->calls = c->next;
	if (c->next)
		c->next->prev = c->prev;
}

static void mcall_end(struct agent_mcall *c, int err, const char *message,
		      const ProtobufCMessage *resp)
{
	mcall_unlink(c);
	agent_mcall_cb cb = c->cb;
	void *ud = c->ud;
	free(c);
	cb(ud, err, message, resp);
}

/* Park a call until a leader is known (or retry after a pause). */
static void mcall_wait(struct agent_mcall *c, uint64_t pause_ms)
{
	c->st = NULL;
	c->not_before_ms = mc_now_ms() + pause_ms;
}

static void on_unary(void *ud, int status, const char *message, const ProtobufCMessage *resp)
{
	struct agent_mcall *c = ud;
	struct agent *a = c->a;
	struct agent_mcalls *m = &a->mcalls;
	c->st = NULL;
	if (status == RPC_OK) {
		mcall_end(c, 0, NULL, resp);
		return;
	}
	uint64_t now = mc_now_ms();
	if (status == RPC_CANCELLED && !a->stopping) {
		/* The link moved to another master: send it again there. */
		mcall_wait(c, 0);
		return;
	}
	int err = agent__master_err(status, message);
	if (err == MC_ENOT_LEADER && !a->stopping) {
		char addr[128];
		uint64_t view;
		if (parse_redirect(message, addr, sizeof(addr), &view) &&
		    c->redirects++ < MAX_REDIRECTS) {
			/* Park first: a new master sends parked calls. */
			mcall_wait(c, addr[0] ? 0 : RETRY_MS);
			if (addr[0] && strcmp(addr, m->addr) != 0) {
				log_info(
					"master %s is a standby; the leader is %s (view %" PRIu64
					")",
					m->addr, addr, view);
				m->on_leader(a, addr, view);
			} else if (addr[0]) {
				agent__mcall_poll(a);
			}
			return;
		}
	}
	if (err == MC_EUNAVAILABLE && status == RPC_UNAVAILABLE && !a->stopping &&
	    now + RETRY_MS < c->deadline_ms) {
		mcall_wait(c, RETRY_MS);
		return;
	}
	mcall_end(c, err, message, NULL);
}

static void mcall_send(struct agent_mcall *c)
{
	struct agent_mcalls *m = &c->a->mcalls;
	uint64_t now = mc_now_ms();
	uint64_t left = c->deadline_ms > now ? c->deadline_ms - now : 1;
	int rc = rpc_client_unary(m->client, c->path, c->req, c->resp_desc, left, on_unary, c,
				  &c->st);
	if (rc) {
		/* Ended by the next poll, never from inside agent__mcall. */
		c->st = NULL;
		c->fail_err = rc;
	}
}

void agent__mcall_poll(struct agent *a)
{
	struct agent_mcalls *m = &a->mcalls;
	uint64_t now = mc_now_ms();
	struct agent_mcall *c = m->calls;
	while (c) {
		struct agent_mcall *next = c->next;
		if (!c->st && c->fail_err) {
			mcall_end(c, c->fail_err, "cannot send the call to the master", NULL);
		} else if (!c->st) {
			if (now >= c->deadline_ms || a->stopping) {
				mcall_end(c, a->stopping ? MC_ESHUTDOWN : MC_EUNAVAILABLE,
					  m->addr[0] ? "the master did not answer in time"
						     : "no master leader is known",
					  NULL);
			} else if (m->client && now >= c->not_before_ms) {
				mcall_send(c);
			}
		}
		c = next;
	}
}

void agent__mcall(struct agent *a, const char *method, const ProtobufCMessage *req,
		  const ProtobufCMessageDescriptor *resp_desc, agent_mcall_cb cb, void *ud)
{
	struct agent_mcalls *m = &a->mcalls;
	struct agent_mcall *c = mc_zalloc(1, sizeof(*c));
	if (!c) {
		/* The one case where cb runs inside: every caller makes this
		 * call its last statement. */
		log_error("out of memory for a master call");
		cb(ud, -ENOMEM, NULL, NULL);
		return;
	}
	c->a = a;
	snprintf(c->path, sizeof(c->path), SERVICE "%s", method);
	c->req = req;
	c->resp_desc = resp_desc;
	c->cb = cb;
	c->ud = ud;
	c->deadline_ms = mc_now_ms() + m->timeout_ms;
	c->next = m->calls;
	if (m->calls)
		m->calls->prev = c;
	m->calls = c;
	if (m->client && !a->stopped)
		mcall_send(c);
	else
		mcall_wait(c, 0);
}

/* ------------------------------------------------------------ the master */

void agent__mcalls_init(struct agent *a, uint64_t timeout_ms,
			void (*on_leader)(struct agent *a, const char *addr, uint64_t view))
{
	a->mcalls.timeout_ms = timeout_ms;
	a->mcalls.on_leader = on_leader;
}

void agent__mcall_disconnect(struct agent *a)
{
	struct agent_mcalls *m = &a->mcalls;
	if (m->client) {
		/* Outstanding calls come back CANCELLED (and are parked, unless
		 * the agent is stopping). */
		struct rpc_client *old = m->client;
		m->client = NULL;
		rpc_client_free(old);
	}
}

bool agent__mcall_set_master(struct agent *a, const char *addr)
{
	struct agent_mcalls *m = &a->mcalls;
	if (strcmp(addr, m->addr) == 0 && (m->client || !addr[0]))
		return false;
	snprintf(m->addr, sizeof(m->addr), "%s", addr);
	agent__mcall_disconnect(a);
	if (!addr[0])
		return true;
	struct rpc_client_opts o = {
		.max_message_bytes = 64u << 20,
		.metrics = a->metrics,
		.backoff_initial_ms = 50,
		.backoff_max_ms = 1000,
		/* A master in this process (standalone, --role=master,agent)
		 * is called directly. */
		.local_calls = true,
		/* A master with the cluster secret requires the proof. */
		.auth_key = a->secret,
		.auth_key_len = a->secret_len,
	};
	int rc = rpc_client_new(a->loop, addr, &o, &m->client);
	if (rc) {
		log_error("master address %s: %s", addr, mc_strerror(rc));
		m->client = NULL;
		m->addr[0] = '\0';
	}
	return true;
}

const char *agent__mcall_master(const struct agent *a)
{
	return a->mcalls.addr;
}

bool agent__mcall_connected(const struct agent *a)
{
	return a->mcalls.client != NULL;
}

uint64_t agent__mcall_timeout_ms(const struct agent *a)
{
	return a->mcalls.timeout_ms;
}

void agent__mcall_limit_timeout(struct agent *a, uint64_t ms)
{
	a->mcalls.timeout_ms = MC_MIN(a->mcalls.timeout_ms, ms);
}
