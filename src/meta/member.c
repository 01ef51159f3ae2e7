/*
 * member: membership as the leader proposes it and as the transport
 * follows it — etcd's checks before MemberAdd, MemberRemove and
 * MemberPromote (strict reconfiguration, learner limits, IDs never
 * reused), this member publishing its name and client URL, and keeping
 * the peer transport in step with the member table (from applied
 * entries, snapshots, and conf changes as soon as they are appended).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/metrics.h"
#include "common/util.h"
#include "meta/meta_int.h"

#define LOG_SUBSYS LOGS_META

/* "http://host:port" with a numeric host, or NULL. */
char *meta__normalize_url(const char *url)
{
	const char *hp = url;
	struct sockaddr_storage ss;
	if (strncmp(hp, "http://", 7) == 0)
		hp += 7;
	size_t len = strlen(hp);
	while (len && hp[len - 1] == '/')
		len--;
	char *addr = strndup(hp, len);
	if (!addr)
		return NULL;
	if (!*addr || strchr(addr, '/') || mc_parse_hostport(addr, &ss)) {
		free(addr);
		return NULL;
	}
	char *u = meta__printf("http://%s", addr);
	free(addr);
	return u;
}

static size_t quorum_of(size_t voters)
{
	return voters / 2 + 1;
}

/* etcd's strict reconfiguration check: after the change, enough voters
 * are active to make a quorum. */
static bool enough_started(struct meta_node *n, int delta, uint64_t removing)
{
	struct raft_status st;
	struct raft_peer_status ps[64];
	size_t k = raft_status(n->raft, &st, ps, MC_ARRAY_LEN(ps));
	size_t voters = 0, active = 0;

	for (size_t i = 0; i < k && i < MC_ARRAY_LEN(ps); i++) {
		if (ps[i].learner || ps[i].id == removing)
			continue;
		voters++;
		if (ps[i].recent_active || ps[i].id == n->id)
			active++;
	}
	if (delta > 0) {
		voters++;
		/* etcd's exception: a lone member may add a second (restore). */
		if (voters == 2 && active == 1)
			return true;
	}
	return active >= quorum_of(voters);
}

static uint64_t new_member_id(struct meta_node *n, const char *url)
{
	for (;;) {
		char seed[160];
		snprintf(seed, sizeof(seed), "%s|%" PRIu64 "|%" PRIu64, url, mc_wall_ms(),
			 ++n->next_member_id_seed ^ mc_now_ns());
		uint64_t id = mc_hash64(seed, strlen(seed)) & META_MEMBER_ID_MASK;
		if (id && !meta__member_find(&n->sm, id) && !meta__is_removed(&n->sm, id))
			return id;
	}
}

void meta__propose_conf(struct meta_node *n, struct meta__op *op)
{
	ProtobufCMessage *req = protobuf_c_message_unpack(meta__methods[op->method].req, NULL,
							  op->req_len, op->req);
	struct raft_conf_change cc = {0};
	Mooncake__Meta__ConfContext ctx = MOONCAKE__META__CONF_CONTEXT__INIT;
	Mooncake__Meta__Member pm = MOONCAKE__META__MEMBER__INIT;
	uint8_t *ctxbuf = NULL;
	char *url = NULL;
	int code = 0;

	if (!req) {
		meta__op_fail(op, -EINVAL);
		return;
	}
	if (op->method == META_M_MEMBER_ADD) {
		const Etcdserverpb__MemberAddRequest *q = (const void *)req;
		if (q->n_peerurls < 1 || !(url = meta__normalize_url(q->peerurls[0]))) {
			code = META_EBAD_URLS;
			goto out;
		}
		for (size_t i = 0; i < n->sm.n_members; i++)
			if (strcmp(n->sm.members[i].peer_url, url) == 0) {
				code = META_EPEER_URL_EXISTS;
				goto out;
			}
		if (!q->islearner && !enough_started(n, 1, 0)) {
			code = META_ENOT_ENOUGH_STARTED;
			goto out;
		}
		if (q->islearner) {
			size_t learners = 0;
			for (size_t i = 0; i < n->sm.n_members; i++)
				learners += n->sm.members[i].learner;
			if (learners + 1 > META_MAX_LEARNERS) {
				code = META_ETOO_MANY_LEARNERS;
				goto out;
			}
		}
		cc.type = q->islearner ? RAFT_CC_ADD_LEARNER : RAFT_CC_ADD_VOTER;
		cc.node_id = new_member_id(n, url);
		pm.id = cc.node_id;
		pm.name = "";
		pm.peer_urls = &url;
		pm.n_peer_urls = 1;
		pm.learner = q->islearner;
		ctx.member = &pm;
		cc.context_len = mooncake__meta__conf_context__get_packed_size(&ctx);
		if (!(ctxbuf = malloc(cc.context_len))) {
			code = -ENOMEM;
			goto out;
		}
		mooncake__meta__conf_context__pack(&ctx, ctxbuf);
		cc.context = ctxbuf;
	} else if (op->method == META_M_MEMBER_REMOVE) {
		const Etcdserverpb__MemberRemoveRequest *q = (const void *)req;
		const struct meta__member *m = meta__member_find(&n->sm, q->id);
		if (!m) {
			code = META_EMEMBER_NOT_FOUND;
			goto out;
		}
		if (!m->learner && !enough_started(n, -1, q->id)) {
			code = META_ENOT_ENOUGH_STARTED;
			goto out;
		}
		cc.type = RAFT_CC_REMOVE;
		cc.node_id = q->id;
	} else {
		const Etcdserverpb__MemberPromoteRequest *q = (const void *)req;
		const struct meta__member *m = meta__member_find(&n->sm, q->id);
		struct raft_status st;
		struct raft_peer_status ps[64];
		if (!m) {
			code = META_EMEMBER_NOT_FOUND;
			goto out;
		}
		if (!m->learner) {
			code = META_ENOT_LEARNER;
			goto out;
		}
		size_t k = raft_status(n->raft, &st, ps, MC_ARRAY_LEN(ps));
		uint64_t match = 0;
		for (size_t i = 0; i < k && i < MC_ARRAY_LEN(ps); i++)
			if (ps[i].id == q->id)
				match = ps[i].match;
		/* etcd: the learner's match is at least 90% of the leader's. */
		if ((double)match < 0.9 * (double)st.last_index) {
			code = META_ELEARNER_NOT_READY;
			goto out;
		}
		cc.type = RAFT_CC_PROMOTE;
		cc.node_id = q->id;
	}
	if (n->in_ready) {
		/* Keep the change as the op's proposal data for later. */
		size_t len = raft_conf_change_size(&cc);
		free(op->ent);
		if (!(op->ent = malloc(len))) {
			code = -ENOMEM;
			goto out;
		}
		op->ent_len = raft_conf_change_encode(&cc, op->ent);
		meta__oplist_push(&n->propq, op);
		op = NULL;
		goto out;
	}
	uint64_t index = 0;
	int rc = raft_propose_conf_change(n->raft, &cc, &index);
	if (rc == MC_ENOT_LEADER || rc == -EBUSY) {
		meta__oplist_push(&n->wait_leader, op);
		op = NULL;
	} else if (rc == -EAGAIN) {
		meta__oplist_push(&n->retry, op);
		op = NULL;
	} else if (rc == -EEXIST) {
		code = META_EMEMBER_EXISTS;
	} else if (rc == -ENOENT) {
		code = META_EMEMBER_NOT_FOUND;
	} else if (rc == -ENOMEM || rc == MC_EINTERNAL) {
		meta__fatal(n, rc, "the Raft core failed");
		code = rc;
	} else if (rc) {
		code = rc;
	} else {
		struct raft_status st;
		raft_status(n->raft, &st, NULL, 0);
		op->index = index;
		op->term = st.term;
		meta__waiters_insert(&n->waiters, op);
		op = NULL;
		meta__kick(n);
	}
out:
	if (op && code)
		meta__op_fail(op, code);
	free(ctxbuf);
	free(url);
	protobuf_c_message_free_unpacked(req, NULL);
}

void meta__maybe_publish(struct meta_node *n)
{
	char url[96];
	char *urls[1] = {url};
	Mooncake__Meta__MemberAttributes at = MOONCAKE__META__MEMBER_ATTRIBUTES__INIT;

	if (n->published || n->leader == RAFT_NONE || n->stopping || n->fatal ||
	    !meta__member_find(&n->sm, n->id))
		return;
	uint64_t now = meta__now(n);
	if (n->publish_sent_ms && now - n->publish_sent_ms < 2 * n->o.election_ms)
		return;
	n->publish_sent_ms = now;
	snprintf(url, sizeof(url), "%s", n->self_client_url);
	at.id = n->id;
	at.name = n->name;
	at.client_urls = urls;
	at.n_client_urls = 1;
	meta__propose_internal(n, META_M_PUBLISH, &at.base);
}

void meta__sync_members(struct meta_node *n)
{
	const struct meta__sm *sm = &n->sm;
	const struct meta__member *me = meta__member_find(sm, n->id);

	n->published = me && strcmp(me->name, n->name) == 0 &&
		       strcmp(me->client_url, n->self_client_url) == 0;
	for (size_t i = 0; i < sm->n_members; i++) {
		const struct meta__member *m = &sm->members[i];
		if (m->id != n->id && *m->peer_url && meta__peer_set(n, m->id, m->peer_url))
			log_warn("member %016" PRIx64 ": cannot use peer URL %s", m->id,
				 m->peer_url);
	}
}

/* Peers named in conf change entries about to be persisted become known
 * to the transport at once (the change is in force when appended). */
void meta__learn_peers(struct meta_node *n, const struct raft_entry *e, size_t k)
{
	for (size_t i = 0; i < k; i++) {
		struct raft_conf_change cc;
		if (e[i].type != RAFT_ENTRY_CONF_CHANGE ||
		    raft_conf_change_decode(e[i].data, e[i].len, &cc) || !cc.context_len ||
		    cc.node_id == n->id)
			continue;
		Mooncake__Meta__ConfContext *ctx = mooncake__meta__conf_context__unpack(
			NULL, cc.context_len, cc.context);
		if (!ctx)
			continue;
		if (ctx->member && ctx->member->n_peer_urls &&
		    meta__peer_set(n, cc.node_id, ctx->member->peer_urls[0]))
			log_warn("member %016" PRIx64 ": cannot use peer URL %s", cc.node_id,
				 ctx->member->peer_urls[0]);
		mooncake__meta__conf_context__free_unpacked(ctx, NULL);
	}
}
