/*
 * peer: reads of SSD tiers between agents (peer.h; proto/agent.proto).
 *
 * Serving. With an SSD tier and a transfer engine the agent keeps a
 * bounce region: a memfd of --ssd-bounce-size registered with the engine
 * (same-host peers map it, remote ones read it over tcp or rdma), its
 * room handed out in whole blocks of the tier. A Read, its proof
 * checked, takes room for the object — or waits in order for it, a
 * bounded number of reads, for as long as the call lives — has the tier
 * read the object there (its checksum checked as the store checks every
 * read; when the room is on 4 KiB pages the read goes through staging
 * memory and is copied into the room in the pass that checks it) and
 * answers where, with a hold: the room is the reader's
 * until it Releases it or AGENT_PEER_HOLD_MS pass (a timer takes back
 * expired holds; readers check the bytes they read, so a reader too slow
 * for its hold gets a checksum error, never other bytes).
 *
 * Calling. The owner of an SSD replica is named by its agent id, which is
 * also its transfer-engine segment: the engine resolves it (meta, or P2P)
 * and its descriptor says where the owner's RPC server listens. One RPC
 * client per owner, made on first use; reads asked for meanwhile wait for
 * it.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent.pb-c.h"
#include "agent/agent_int.h"
#include "agent/mcall.h"
#include "agent/mem.h"
#include "agent/peer.h"
#include "agent/tier.h"
#include "common/auth.h"
#include "common/endian.h"
#include "common/log.h"
#include "common/util.h"
#include "rpc/rpc.h"
#include "transfer/transfer.h"

#define LOG_SUBSYS LOGS_AGENT

#define SERVICE "mooncake.agent.Tier"
#define READ_LABEL "mooncake-agent-tier-read"
#define RELEASE_LABEL "mooncake-agent-tier-release"
#define MAX_WAITS 1024u
#define TIMER_MS 1000u

struct peer_hold {
	struct peer_hold *next;
	uint64_t id, off, len, until_ms;
};

/* A Read being served: waiting for room, or reading. */
struct peer_wait {
	struct peer_wait *next;
	struct agent *a;
	struct rpc_call *call;
	uint64_t off, len;
	/* Read through the tier's staging memory (the bounce region is on
	 * 4 KiB pages), copied on as it is checked: NULL when read in
	 * place. */
	uint8_t *stage;
	size_t klen;
	uint8_t key[];
};

struct peer_client {
	struct peer_client *next;
	struct agent *a;
	char owner[128];
	struct rpc_client *c; /* NULL while resolving, or after a failure */
	bool resolving;
	int err; /* the last resolution's, while c is NULL */
	uint64_t failed_ms;
	struct peer_call *waiting; /* reads asked for while resolving */
};

/* A call to another agent (Read or Release). */
struct peer_call {
	struct peer_call *next;
	struct peer_client *pc;
	bool release;
	union {
		Mooncake__Agent__TierReadRequest read;
		Mooncake__Agent__TierReleaseRequest rel;
	} req;
	void (*cb)(void *ud, int err, uint64_t address, uint64_t hold);
	void *ud;
	uint64_t hold;
	uint8_t mac[MC_SHA256_BYTES];
	size_t klen;
	uint8_t key[];
};

/* ------------------------------------------------------------ proofs */

static void mac_of(const struct agent *a, const char *label, const char *reader,
		   const void *payload, size_t plen, uint8_t out[MC_SHA256_BYTES])
{
	static const uint8_t zero = 0;
	const void *parts[] = {label, &zero, reader, &zero, payload};
	size_t lens[] = {strlen(label), 1, strlen(reader), 1, plen};
	mc_hmac_sha256(a->secret, a->secret_len, parts, lens, MC_ARRAY_LEN(parts), out);
}

static bool mac_ok(const struct agent *a, const char *label, const char *reader,
		   const void *payload, size_t plen, ProtobufCBinaryData mac)
{
	if (!a->secret_len)
		return true;
	uint8_t want[MC_SHA256_BYTES];
	mac_of(a, label, reader ? reader : "", payload, plen, want);
	return mac.len == sizeof(want) && mc_ct_equal(mac.data, want, sizeof(want));
}

static void holds_bytes(const uint64_t *holds, size_t n, uint8_t *out)
{
	for (size_t i = 0; i < n; i++)
		mc_put_le64(out + 8 * i, holds[i]);
}

/* ------------------------------------------------------------ serving */

static void finish_code(struct rpc_call *call, int err, const char *detail)
{
	char msg[256];
	snprintf(msg, sizeof(msg), "%d %s%s%s", err, mc_strerror(err), detail ? ": " : "",
		 detail ? detail : "");
	int status = err == MC_EOBJECT_NOT_FOUND ? RPC_NOT_FOUND
		     : err == -EACCES            ? RPC_PERMISSION_DENIED
		     : err == MC_ENO_SPACE       ? RPC_RESOURCE_EXHAUSTED
		     : err == MC_EUNAVAILABLE    ? RPC_UNAVAILABLE
		     : err == -EINVAL            ? RPC_INVALID_ARGUMENT
						 : RPC_INTERNAL;
	rpc_call_finish(call, status, msg);
}

static void give_back(struct agent *a, uint64_t off, uint64_t len);
static void on_timer(uv_timer_t *t);

static void wait_free(struct agent *a, struct peer_wait *w)
{
	agent__tier_buf_free(a, w->stage);
	free(w);
}

static void on_staged(void *ud, int err, const struct agent_tier_obj *o)
{
	struct peer_wait *w = ud;
	struct agent *a = w->a;
	struct agent_peer *p = &a->peer;
	p->reads--;
	if (err) {
		give_back(a, w->off, w->len);
		finish_code(w->call, err, NULL);
		wait_free(a, w);
		return;
	}
	struct peer_hold *h = malloc(sizeof(*h));
	if (!h) {
		give_back(a, w->off, w->len);
		finish_code(w->call, -ENOMEM, NULL);
		wait_free(a, w);
		return;
	}
	*h = (struct peer_hold){.id = ++p->next_hold,
				.off = w->off,
				.len = w->len,
				.until_ms = mc_now_ms() + AGENT_PEER_HOLD_MS};
	Mooncake__Agent__TierReadReply r = MOONCAKE__AGENT__TIER_READ_REPLY__INIT;
	r.address = (uint64_t)(uintptr_t)p->bounce->addr + w->off;
	r.size = o->size;
	r.crc32c = o->crc;
	r.hold = h->id;
	r.hold_ms = AGENT_PEER_HOLD_MS;
	if (rpc_call_send(w->call, &r.base) != 0) {
		free(h); /* (the reader went away) */
		give_back(a, w->off, w->len);
		rpc_call_finish(w->call, RPC_CANCELLED, NULL);
		wait_free(a, w);
		return;
	}
	rpc_call_finish(w->call, RPC_OK, NULL);
	h->next = p->holds;
	p->holds = h;
	if (!p->timer_on && !a->stopping) {
		uv_timer_start(&p->timer, on_timer, TIMER_MS, TIMER_MS);
		p->timer_on = true;
	}
	agent__count(&a->stats, AGENT_C_SSD_PEER_READS, 1);
	wait_free(a, w);
}

/* Read through staging memory and copied into the bounce region. */
static void on_read_staged(void *ud, int err, const struct agent_tier_obj *o)
{
	struct peer_wait *w = ud;
	agent__tier_buf_free(w->a, w->stage);
	w->stage = NULL;
	on_staged(w, err, o);
}

/* Room for w: read into it (through the staging memory when the room is
 * on 4 KiB pages). False when there is none yet. */
static bool stage(struct agent *a, struct peer_wait *w)
{
	struct agent_peer *p = &a->peer;
	if (mc_extalloc_get(&p->alloc, w->len, &w->off) != 0)
		return false;
	if (!p->bounce->hugepages)
		w->stage = agent__tier_buf(a, w->len, true);
	int rc = w->stage ? agent__tier_read_copy(a, w->key, w->klen, w->stage, w->len,
						  p->bounce->addr + w->off, w->len,
						  on_read_staged, w)
			  : agent__tier_read(a, w->key, w->klen, p->bounce->addr + w->off,
					     w->len, on_staged, w);
	if (rc) {
		give_back(a, w->off, w->len);
		finish_code(w->call, rc, NULL);
		wait_free(a, w);
		return true;
	}
	p->reads++;
	return true;
}

/* Room came back: start the reads waiting for it, in order. */
static void pump(struct agent *a)
{
	struct agent_peer *p = &a->peer;
	while (p->waits) {
		struct peer_wait *w = p->waits;
		if (rpc_call_cancelled(w->call) || a->stopping) {
			p->waits = w->next;
			if (a->stopping)
				finish_code(w->call, MC_EUNAVAILABLE, "the agent is stopping");
			else
				rpc_call_finish(w->call, RPC_CANCELLED, NULL);
			wait_free(a, w);
			continue;
		}
		p->waits = w->next; /* (stage ends or keeps it) */
		if (!stage(a, w)) {
			w->next = p->waits;
			p->waits = w;
			break;
		}
	}
	if (!p->waits)
		p->waits_tail = NULL;
}

static void give_back(struct agent *a, uint64_t off, uint64_t len)
{
	if (mc_extalloc_put(&a->peer.alloc, off, len)) {
		/* just taken: cannot fail */
	}
	pump(a);
}

static void on_read(struct rpc_call *call, const ProtobufCMessage *msg)
{
	struct agent *a = rpc_call_service_data(call);
	struct agent_peer *p = &a->peer;
	const Mooncake__Agent__TierReadRequest *q = (const void *)msg;
	if (!mac_ok(a, READ_LABEL, q->reader, q->key.data, q->key.len, q->mac)) {
		finish_code(call, -EACCES, "the cluster secret's proof does not match");
		return;
	}
	if (a->stopping) {
		finish_code(call, MC_EUNAVAILABLE, "the agent is stopping");
		return;
	}
	struct agent_tier_obj o;
	int rc = agent__tier_lookup(a, q->key.data, q->key.len, &o);
	if (rc) {
		finish_code(call, rc == -EINVAL ? MC_EOBJECT_NOT_FOUND : rc, NULL);
		return;
	}
	uint64_t len = agent__tier_io_len(o.size);
	if (len > p->bounce->len) {
		char why[128];
		snprintf(why, sizeof(why),
			 "%" PRIu64 " bytes, more than --ssd-bounce-size %zu", o.size,
			 p->bounce->len);
		finish_code(call, MC_ENO_SPACE, why);
		return;
	}
	unsigned waiting = 0;
	for (struct peer_wait *w = p->waits; w; w = w->next)
		waiting++;
	struct peer_wait *w = waiting < MAX_WAITS ? calloc(1, sizeof(*w) + q->key.len) : NULL;
	if (!w) {
		finish_code(call, MC_ENO_SPACE,
			    "too many reads waiting for the bounce region");
		return;
	}
	w->a = a;
	w->call = call;
	w->len = len;
	w->klen = q->key.len;
	memcpy(w->key, q->key.data, q->key.len);
	if (!p->waits && stage(a, w))
		return;
	if (p->waits_tail)
		p->waits_tail->next = w;
	else
		p->waits = w;
	p->waits_tail = w;
}

static void release_hold(struct agent *a, uint64_t id)
{
	for (struct peer_hold **hp = &a->peer.holds; *hp; hp = &(*hp)->next) {
		struct peer_hold *h = *hp;
		if (h->id != id)
			continue;
		*hp = h->next;
		uint64_t off = h->off, len = h->len;
		free(h);
		give_back(a, off, len);
		return;
	}
}

static void on_release(struct rpc_call *call, const ProtobufCMessage *msg)
{
	struct agent *a = rpc_call_service_data(call);
	const Mooncake__Agent__TierReleaseRequest *q = (const void *)msg;
	uint8_t *b = malloc(q->n_holds * 8 + 1);
	if (!b) {
		finish_code(call, -ENOMEM, NULL);
		return;
	}
	holds_bytes(q->holds, q->n_holds, b);
	bool ok = mac_ok(a, RELEASE_LABEL, q->reader, b, q->n_holds * 8, q->mac);
	free(b);
	if (!ok) {
		finish_code(call, -EACCES, "the cluster secret's proof does not match");
		return;
	}
	for (size_t i = 0; i < q->n_holds; i++)
		release_hold(a, q->holds[i]);
	Mooncake__Agent__TierReleaseReply r = MOONCAKE__AGENT__TIER_RELEASE_REPLY__INIT;
	if (rpc_call_send(call, &r.base) == 0)
		rpc_call_finish(call, RPC_OK, NULL);
	else
		rpc_call_finish(call, RPC_CANCELLED, NULL);
}

static void on_timer(uv_timer_t *t)
{
	struct agent *a = t->data;
	struct agent_peer *p = &a->peer;
	uint64_t now = mc_now_ms();
	for (struct peer_hold **hp = &p->holds; *hp;) {
		struct peer_hold *h = *hp;
		if (h->until_ms > now) {
			hp = &h->next;
			continue;
		}
		*hp = h->next;
		if (mc_extalloc_put(&p->alloc, h->off, h->len)) {
			/* held until now: cannot fail */
		}
		free(h);
	}
	pump(a);
	if (!p->holds) {
		uv_timer_stop(t);
		p->timer_on = false;
	}
}

#define UNARY(n, fn, req, resp) \
	{ \
		.name = n, .kind = RPC_UNARY, \
		.request = &mooncake__agent__##req##__descriptor, \
		.response = &mooncake__agent__##resp##__descriptor, .on_message = fn \
	}

static const struct rpc_method methods[] = {
	UNARY("Read", on_read, tier_read_request, tier_read_reply),
	UNARY("Release", on_release, tier_release_request, tier_release_reply),
};

void agent__peer_init(struct agent *a)
{
	struct agent_peer *p = &a->peer;
	uv_timer_init(a->loop, &p->timer);
	p->timer.data = a;
}

int agent__peer_start(struct agent *a, uint64_t bytes)
{
	struct agent_peer *p = &a->peer;
	if (!agent__tier_on(a) || !a->te || !a->rpc)
		return 0;
	bytes = agent__tier_io_len(bytes);
	struct agent_memfd_opts mo = {
		.name = "mooncake-ssd-bounce",
		.len = bytes,
		.hugepages = a->hugepages == AGENT_HUGEPAGES_ON ? AGENT_HUGEPAGES_AUTO
								: a->hugepages,
		.numa_node = a->numa_node,
		.published = true,
	};
	int rc = agent__memfd_new(a, &mo, &p->bounce);
	if (rc) {
		log_error("SSD tier: cannot make its bounce region of %" PRIu64 " bytes: %s",
			  bytes, mc_strerror(rc));
		return rc;
	}
	rc = mc_extalloc_init(&p->alloc, bytes, agent__tier_block(a), 1);
	if (rc)
		return rc;
	p->alloc_ok = true;
	rc = te_register(a->te, (uint64_t)(uintptr_t)p->bounce->addr, p->bounce->addr,
			 p->bounce->len, p->bounce->fd, 0, &p->region);
	if (rc) {
		log_error("SSD tier: cannot register its bounce region with the transfer "
			  "engine: %s",
			  mc_strerror(rc));
		return rc;
	}
	p->registered = true;
	rc = rpc_server_add_service(a->rpc, SERVICE, methods, MC_ARRAY_LEN(methods), a);
	if (rc) {
		log_error("SSD tier: cannot serve %s: %s", SERVICE, mc_strerror(rc));
		return rc;
	}
	p->service = true;
	return 0;
}

bool agent__peer_busy(const struct agent *a)
{
	return a->peer.reads > 0;
}

/* ------------------------------------------------------------ calling */

static void call_free(struct peer_call *c)
{
	free(c);
}

static void call_end(struct peer_call *c, int err, uint64_t address, uint64_t hold)
{
	if (c->cb)
		c->cb(c->ud, err, address, hold);
	call_free(c);
}

static void on_peer_reply(void *ud, int status, const char *message, const ProtobufCMessage *m)
{
	struct peer_call *c = ud;
	int err = status == RPC_OK ? 0 : agent__master_err(status, message);
	if (c->release) {
		call_free(c);
		return;
	}
	if (err) {
		if (err != MC_EOBJECT_NOT_FOUND)
			log_warn("reading '%.*s' from the SSD tier of agent %s: %s",
				 (int)MC_MIN(c->klen, 64), c->key, c->pc->owner,
				 message ? message : mc_strerror(err));
		call_end(c, err, 0, 0);
		return;
	}
	const Mooncake__Agent__TierReadReply *r = (const void *)m;
	call_end(c, 0, r->address, r->hold);
}

static void call_send(struct peer_call *c)
{
	struct peer_client *pc = c->pc;
	struct agent *a = pc->a;
	const char *path = c->release ? "/" SERVICE "/Release" : "/" SERVICE "/Read";
	const ProtobufCMessageDescriptor *d =
		c->release ? &mooncake__agent__tier_release_reply__descriptor
			   : &mooncake__agent__tier_read_reply__descriptor;
	int rc = pc->c     ? rpc_client_unary(pc->c, path,
                                          c->release ? &c->req.rel.base : &c->req.read.base, d,
					      agent__mcall_timeout_ms(a), on_peer_reply, c, NULL)
		 : pc->err ? pc->err
			   : MC_EUNAVAILABLE;
	if (rc) {
		if (!c->release)
			log_warn("reading from the SSD tier of agent %s: %s", pc->owner,
				 mc_strerror(rc));
		call_end(c, rc == MC_ESEGMENT_NOT_FOUND ? MC_EUNAVAILABLE : rc, 0, 0);
	}
}

static void on_resolved(void *ud, int err, struct te_segment *s)
{
	struct peer_client *pc = ud;
	struct agent *a = pc->a;
	pc->resolving = false;
	pc->err = err;
	if (!err) {
		struct te_segment_info info;
		te_segment_info(s, &info, NULL, 0);
		te_close_segment(s);
		struct rpc_client_opts o = {.metrics = a->metrics,
					    .auth_key = a->secret_len ? a->secret : NULL,
					    .auth_key_len = a->secret_len};
		if (!info.rpc_addr[0])
			pc->err = MC_EUNAVAILABLE;
		else if ((err = rpc_client_new(a->loop, info.rpc_addr, &o, &pc->c)) != 0)
			pc->err = err;
		if (pc->err)
			log_warn("agent %s: no way to its SSD tier (%s)", pc->owner,
				 info.rpc_addr[0] ? mc_strerror(pc->err)
						  : "its descriptor names no RPC port");
	}
	if (pc->err)
		pc->failed_ms = mc_now_ms();
	struct peer_call *w = pc->waiting;
	pc->waiting = NULL;
	while (w) {
		struct peer_call *next = w->next;
		call_send(w);
		w = next;
	}
}

/* The client of owner, made (or resolving) on first use. */
static struct peer_client *client(struct agent *a, const char *owner)
{
	struct peer_client *pc;
	for (pc = a->peer.clients; pc; pc = pc->next)
		if (strcmp(pc->owner, owner) == 0)
			break;
	if (!pc) {
		pc = calloc(1, sizeof(*pc));
		if (!pc)
			return NULL;
		pc->a = a;
		snprintf(pc->owner, sizeof(pc->owner), "%s", owner);
		pc->next = a->peer.clients;
		a->peer.clients = pc;
	}
	/* A failed resolution is tried again after a while. */
	if (!pc->c && !pc->resolving && (!pc->err || mc_now_ms() - pc->failed_ms >= 1000)) {
		if (!a->te) {
			pc->err = MC_EUNAVAILABLE;
			return pc;
		}
		pc->resolving = true;
		int rc = te_open_segment_async(a->te, owner, on_resolved, pc);
		if (rc) {
			pc->resolving = false;
			pc->err = rc;
			pc->failed_ms = mc_now_ms();
		}
	}
	return pc;
}

/* Send c now, or once its client is resolved; never calls back from
 * inside (a failure goes through a zero-delay wait on the client). */
static void submit(struct agent *a, struct peer_call *c, const char *owner)
{
	struct peer_client *pc = client(a, owner);
	if (!pc) {
		call_end(c, -ENOMEM, 0, 0);
		return;
	}
	c->pc = pc;
	if (pc->resolving || !pc->c) {
		/* (a failed client answers from the next resolution's end,
		 * or at once below) */
		if (pc->resolving) {
			c->next = pc->waiting;
			pc->waiting = c;
			return;
		}
	}
	call_send(c);
}

void agent__peer_read(struct agent *a, const char *owner, const uint8_t *key, size_t klen,
		      uint64_t size,
		      void (*cb)(void *ud, int err, uint64_t address, uint64_t hold), void *ud)
{
	(void)size;
	struct peer_call *c = calloc(1, sizeof(*c) + klen);
	if (!c) {
		cb(ud, -ENOMEM, 0, 0);
		return;
	}
	c->cb = cb;
	c->ud = ud;
	c->klen = klen;
	memcpy(c->key, key, klen);
	mooncake__agent__tier_read_request__init(&c->req.read);
	c->req.read.key.data = c->key;
	c->req.read.key.len = klen;
	c->req.read.reader = a->name;
	if (a->secret_len) {
		mac_of(a, READ_LABEL, a->name, key, klen, c->mac);
		c->req.read.mac.data = c->mac;
		c->req.read.mac.len = sizeof(c->mac);
	}
	submit(a, c, owner);
}

void agent__peer_release(struct agent *a, const char *owner, uint64_t hold)
{
	struct peer_call *c = calloc(1, sizeof(*c) + 8);
	if (!c)
		return; /* (the hold expires) */
	c->release = true;
	c->hold = hold;
	mooncake__agent__tier_release_request__init(&c->req.rel);
	c->req.rel.holds = &c->hold;
	c->req.rel.n_holds = 1;
	c->req.rel.reader = a->name;
	if (a->secret_len) {
		holds_bytes(&c->hold, 1, c->key);
		mac_of(a, RELEASE_LABEL, a->name, c->key, 8, c->mac);
		c->req.rel.mac.data = c->mac;
		c->req.rel.mac.len = sizeof(c->mac);
	}
	submit(a, c, owner);
}

/* ------------------------------------------------------------ the end */

unsigned agent__peer_close(struct agent *a, uv_close_cb on_closed)
{
	struct agent_peer *p = &a->peer;
	pump(a); /* (stopping: waiting reads end) */
	while (p->clients) {
		struct peer_client *pc = p->clients;
		p->clients = pc->next;
		if (pc->c)
			rpc_client_free(pc->c); /* (its calls end, cancelled) */
		struct peer_call *w = pc->waiting;
		while (w) {
			struct peer_call *next = w->next;
			call_end(w, MC_ESHUTDOWN, 0, 0);
			w = next;
		}
		free(pc);
	}
	uv_timer_stop(&p->timer);
	p->timer.data = a;
	uv_close((uv_handle_t *)&p->timer, on_closed);
	return 1;
}

void agent__peer_free(struct agent *a)
{
	struct agent_peer *p = &a->peer;
	while (p->holds) {
		struct peer_hold *h = p->holds;
		p->holds = h->next;
		free(h);
	}
	if (p->alloc_ok)
		mc_extalloc_close(&p->alloc);
	p->alloc_ok = false;
	/* (the engine, freed before the agent, let the region go) */
	agent__map_unref(p->bounce);
	p->bounce = NULL;
}
