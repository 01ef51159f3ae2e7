/*
 * inst: transfer engines of their own for the sessions that ask
 * (mc_engine_open; Python's TransferEngine.initialize), as each of
 * Mooncake's TransferEngine instances has its own. An instance is an RPC
 * server listening on the agent's host at a free port — serving the
 * instance's descriptor to P2P peers, and naming its segment
 * "host:port", the session id a vLLM or SGLang peer builds from
 * get_rpc_port() — and an engine like the agent's (same protocol,
 * devices, secret, meta), with its own data port and threads. The
 * session publishes its buffers there and makes its transfers with it.
 *
 * Lifetime: the session holds a reference, and so does each buffer
 * published in it (its region must be unregistered before the engine
 * goes). The last reference stops the engine (its descriptor leaves
 * meta), then the RPC server, then frees the engine on a copy thread
 * (te_free joins threads) and the server back on the loop.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/agent_int.h"
#include "agent/inst.h"
#include "common/log.h"
#include "common/util.h"
#include "rpc/rpc.h"

#define LOG_SUBSYS LOGS_AGENT

struct agent_inst {
	struct agent *a;
	unsigned refs;
	struct rpc_server *rpc;
	struct te_engine *te;
	char name[AGENT_INST_NAME_BYTES];
	struct agent_job free_job;
};

static void on_rpc_down(struct rpc_server *s, void *ud);

int agent__insts_init(struct agent *a, const struct te_opts *t)
{
	struct agent_insts *s = &a->insts;
	memset(s, 0, sizeof(*s));
	if (!t)
		return 0;
	s->opts = *t;
	s->cluster_id = t->cluster_id ? strdup(t->cluster_id) : NULL;
	s->rdma_devices = t->rdma_devices ? strdup(t->rdma_devices) : NULL;
	if ((t->cluster_id && !s->cluster_id) || (t->rdma_devices && !s->rdma_devices) ||
	    t->cluster_secret_len > sizeof(s->secret)) {
		agent__insts_free(a);
		return -ENOMEM;
	}
	s->opts.cluster_id = s->cluster_id;
	s->opts.rdma_devices = s->rdma_devices;
	if (t->cluster_secret) {
		memcpy(s->secret, t->cluster_secret, t->cluster_secret_len);
		s->opts.cluster_secret = s->secret;
	}
	/* The host of the data listener (numeric; an IPv6 one in brackets). */
	const char *dl = t->data_listen ? t->data_listen : "127.0.0.1:0";
	const char *colon = strrchr(dl, ':');
	size_t hl = colon ? (size_t)(colon - dl) : 0;
	if (hl == 0 || hl >= sizeof(s->host))
		snprintf(s->host, sizeof(s->host), "127.0.0.1");
	else
		snprintf(s->host, sizeof(s->host), "%.*s", (int)hl, dl);
	s->opts.rpc = NULL;
	s->opts.data_listen = NULL;
	s->enabled = true;
	return 0;
}

void agent__insts_free(struct agent *a)
{
	struct agent_insts *s = &a->insts;
	free(s->cluster_id);
	free(s->rdma_devices);
	s->cluster_id = s->rdma_devices = NULL;
	memset(s->secret, 0, sizeof(s->secret));
	s->enabled = false;
}

unsigned agent__insts_live(const struct agent *a)
{
	return a->insts.live;
}

int agent__inst_new(struct agent *a, struct agent_inst **out)
{
	struct agent_insts *s = &a->insts;
	if (!s->enabled)
		return -EOPNOTSUPP;
	struct agent_inst *i = calloc(1, sizeof(*i));
	if (!i)
		return -ENOMEM;
	i->a = a;
	char listen[96];
	snprintf(listen, sizeof(listen), "%s:0", s->host);
	struct rpc_server_opts ro = {.name = "te-instance", .metrics = s->opts.metrics};
	int rc = rpc_server_new(a->loop, &ro, &i->rpc);
	if (rc) {
		free(i);
		return rc;
	}
	s->live++; /* until free_done */
	rc = rpc_server_listen(i->rpc, listen);
	if (rc) {
		log_error("transfer engine instance: cannot listen on %s: %s", listen,
			  mc_strerror(rc));
		goto fail;
	}
	struct te_opts o = s->opts;
	o.loop = a->loop;
	o.rpc = i->rpc;
	o.rpc_port = (uint16_t)rpc_server_port(i->rpc, 0);
	o.data_listen = listen;
	snprintf(i->name, sizeof(i->name), "%s:%u", s->host, (unsigned)o.rpc_port);
	o.segment_name = i->name; /* with meta too: its key */
	rc = te_new(&o, &i->te);
	if (rc) {
		log_error("transfer engine instance: cannot start: %s", mc_strerror(rc));
		i->te = NULL;
		goto fail;
	}
	i->refs = 1;
	*out = i;
	return 0;
fail:
	/* The server's handles close on the loop: it goes as a stopped
	 * instance does, without an engine. */
	rpc_server_shutdown(i->rpc, 0, on_rpc_down, i);
	return rc;
}

void agent__inst_ref(struct agent_inst *i)
{
	i->refs++;
}

static void free_run(struct agent_job *j)
{
	struct agent_inst *i = MC_CONTAINER_OF(j, struct agent_inst, free_job);
	te_free(i->te);
}

static void free_done(struct agent_job *j)
{
	struct agent_inst *i = MC_CONTAINER_OF(j, struct agent_inst, free_job);
	rpc_server_free(i->rpc);
	i->a->insts.live--;
	free(i);
}

static void on_rpc_down(struct rpc_server *s, void *ud)
{
	struct agent_inst *i = ud;
	(void)s;
	i->free_job.run = free_run;
	i->free_job.done = free_done;
	agent__pool_submit(&i->a->pool, &i->free_job);
}

static void on_te_stopped(struct te_engine *e, void *ud)
{
	struct agent_inst *i = ud;
	(void)e;
	rpc_server_shutdown(i->rpc, 0, on_rpc_down, i);
}

void agent__inst_unref(struct agent_inst *i)
{
	if (!i || --i->refs > 0)
		return;
	log_info("transfer engine instance %s: stopping (its session and buffers are gone)",
		 i->name);
	te_stop(i->te, on_te_stopped, i);
}

struct te_engine *agent__inst_te(const struct agent_inst *i)
{
	return i->te;
}

const char *agent__inst_name(const struct agent_inst *i)
{
	return i->name;
}
