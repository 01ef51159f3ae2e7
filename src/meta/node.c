/*
 * node: the meta node's driver — the io layer around the pure Raft core.
 *
 * Inputs (peer messages, ticks, proposals, transport reports) reach the
 * core when it is free; while a ready batch is out (between raft_ready and
 * raft_advance) they are queued and fed in at the next turn, so everything
 * proposed meanwhile lands in one batch and one fdatasync (group commit).
 * A turn runs from an idle callback (meta__kick):
 *
 *   feed queued inputs -> raft_ready -> persist on the disk thread
 *   (snapshot file, WAL entries and hard state, fdatasync when the ready
 *   says so) -> back on the loop: install a received snapshot, send the
 *   messages, apply committed entries and answer their proposers, serve
 *   ReadIndex reads, raft_advance -> route watch events, snapshot every
 *   --snapshot-count entries, take the next turn.
 *
 * Requests (struct meta__op) are served by kind: local reads at once;
 * linearizable reads in rounds — every read that arrives while a round is
 * in flight joins the next one, and a round is one raft_read_index — and
 * answered once the applied index reaches the round's read index; writes
 * proposed on the leader as one log entry each and answered when that
 * entry (same index, same term) is applied; on a follower they go to the
 * leader over the peer service. Every request has a deadline; a sweep on
 * each tick fails the late ones.
 *
 * Lease expiry belongs to the leader: it promotes the lease table when it
 * wins (every lease gets its full TTL plus an election timeout from now),
 * checks it every tick and proposes the revokes of the expired leases.
 */
#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "common/metrics.h"
#include "common/util.h"
#include "meta/meta_int.h"

#define LOG_SUBSYS LOGS_META

#define SNAPSHOTS_KEPT 2
#define LEASE_REVOKES_PER_TICK 256
#define MEMBER_ID_MASK ((UINT64_C(1) << 53) - 1) /* exact in a float gauge */

/* ------------------------------------------------------------- small things */

uint64_t meta__now(const struct meta_node *n)
{
	return uv_now(n->loop);
}

bool meta__is_leader(const struct meta_node *n)
{
	return n->running && n->role == RAFT_LEADER;
}

struct meta__sm_in meta__sm_in(const struct meta_node *n)
{
	return (struct meta__sm_in){.now_ms = meta__now(n), .term = n->term};
}

Etcdserverpb__ResponseHeader *meta__header(struct meta_node *n, struct meta__arena *a)
{
	return meta__sm_header(&n->sm, n->term, a);
}

static void on_kick(uv_idle_t *h);

void meta__kick(struct meta_node *n)
{
	if (n->handles_open && !uv_is_active((uv_handle_t *)&n->kick))
		uv_idle_start(&n->kick, on_kick);
}

void meta__fatal(struct meta_node *n, int code, const char *what)
{
	if (n->fatal)
		return;
	n->fatal = true;
	log_error("meta: %s: %s; this member stops", what, meta__strerror(code));
	if (n->o.on_fatal)
		n->o.on_fatal(n->o.ud);
}

static char *str_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *str_printf(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int len = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (len < 0)
		return NULL;
	char *s = malloc((size_t)len + 1);
	if (!s)
		return NULL;
	va_start(ap, fmt);
	vsnprintf(s, (size_t)len + 1, fmt, ap);
	va_end(ap);
	return s;
}

/* ------------------------------------------------------------- op lists */

void meta__oplist_push(struct meta__oplist *l, struct meta__op *op)
{
	op->list = l;
	op->next = NULL;
	op->prev = l->tail;
	if (l->tail)
		l->tail->next = op;
	else
		l->head = op;
	l->tail = op;
	l->n++;
}

void meta__oplist_remove(struct meta__op *op)
{
	struct meta__oplist *l = op->list;
	if (!l)
		return;
	if (op->prev)
		op->prev->next = op->next;
	else
		l->head = op->next;
	if (op->next)
		op->next->prev = op->prev;
	else
		l->tail = op->prev;
	l->n--;
	op->list = NULL;
	op->prev = op->next = NULL;
}

/* Insert a proposal waiter keeping the list sorted by index. */
static void waiters_insert(struct meta__oplist *l, struct meta__op *op)
{
	struct meta__op *at = l->tail;
	while (at && at->index > op->index)
		at = at->prev;
	op->list = l;
	op->prev = at;
	op->next = at ? at->next : l->head;
	if (op->next)
		op->next->prev = op;
	else
		l->tail = op;
	if (at)
		at->next = op;
	else
		l->head = op;
	l->n++;
}

/* ------------------------------------------------------------- ops */

static void classify(struct meta__op *op, const ProtobufCMessage *req)
{
	op->kind = META_K_WRITE;
	op->puts = false;
	switch (op->method) {
	case META_M_RANGE:
		op->kind = ((const Etcdserverpb__RangeRequest *)req)->serializable
				   ? META_K_READ_LOCAL
				   : META_K_READ;
		break;
	case META_M_PUT:
	case META_M_LEASE_GRANT:
		op->puts = true;
		break;
	case META_M_TXN: {
		const Etcdserverpb__TxnRequest *t = (const void *)req;
		if (meta__txn_writes(t, false))
			op->puts = meta__txn_writes(t, true);
		else
			op->kind = meta__txn_serializable(t) ? META_K_READ_LOCAL : META_K_READ;
		break;
	}
	case META_M_LEASE_KEEPALIVE:
	case META_M_LEASE_TTL:
	case META_M_MOVE_LEADER:
		op->kind = META_K_LEADER;
		break;
	case META_M_LEASE_LEASES:
		op->kind = META_K_READ;
		break;
	case META_M_MEMBER_ADD:
	case META_M_MEMBER_REMOVE:
	case META_M_MEMBER_PROMOTE:
		op->kind = META_K_CONF;
		break;
	case META_M_MEMBER_LIST:
	case META_M_STATUS:
		op->kind = META_K_READ_LOCAL;
		break;
	case META_M_ALARM:
		if (((const Etcdserverpb__AlarmRequest *)req)->action ==
		    ETCDSERVERPB__ALARM_REQUEST__ALARM_ACTION__GET)
			op->kind = META_K_READ_LOCAL;
		break;
	default:
		break;
	}
}

static struct meta__op *op_alloc(struct meta_node *n, enum meta__method m,
				 uint64_t deadline_ms, meta__done_fn done, void *ud)
{
	struct meta__op *op = calloc(1, sizeof(*op));
	if (!op)
		return NULL;
	uint64_t dflt = meta__now(n) + n->request_timeout_ms;
	op->node = n;
	op->method = m;
	op->deadline_ms = deadline_ms && deadline_ms < dflt ? deadline_ms : dflt;
	op->done = done;
	op->ud = ud;
	return op;
}

struct meta__op *meta__op_new(struct meta_node *n, enum meta__method m,
			      const ProtobufCMessage *req, uint64_t deadline_ms,
			      meta__done_fn done, void *ud)
{
	struct meta__op *op = op_alloc(n, m, deadline_ms, done, ud);
	if (!op)
		return NULL;
	op->req_len = protobuf_c_message_get_packed_size(req);
	op->req = malloc(op->req_len ? op->req_len : 1);
	if (!op->req) {
		free(op);
		return NULL;
	}
	protobuf_c_message_pack(req, op->req);
	classify(op, req);
	return op;
}

struct meta__op *meta__op_new_raw(struct meta_node *n, enum meta__method m,
				  const uint8_t *req, size_t len, uint64_t deadline_ms,
				  meta__done_fn done, void *ud)
{
	ProtobufCMessage *msg = protobuf_c_message_unpack(meta__methods[m].req, NULL, len, req);
	struct meta__op *op;

	if (!msg)
		return NULL;
	op = op_alloc(n, m, deadline_ms, done, ud);
	if (op && !(op->req = malloc(len ? len : 1))) {
		free(op);
		op = NULL;
	}
	if (op) {
		if (len)
			memcpy(op->req, req, len);
		op->req_len = len;
		classify(op, msg);
	}
	protobuf_c_message_free_unpacked(msg, NULL);
	return op;
}

static void op_free(struct meta__op *op)
{
	free(op->req);
	free(op->ent);
	free(op);
}

void meta__op_done(struct meta__op *op, int status, const char *message,
		   const ProtobufCMessage *resp)
{
	meta__oplist_remove(op);
	if (op->done)
		op->done(op, status, message, resp);
	op_free(op);
}

void meta__op_fail(struct meta__op *op, int code)
{
	int st;
	const char *msg;
	meta__status_of(code, &st, &msg);
	meta__op_done(op, st, msg, NULL);
}

static void fail_list(struct meta__oplist *l, int code)
{
	while (l->head)
		meta__op_fail(l->head, code);
}

/* Answer op from a reply of the state machine. */
static void op_reply(struct meta__op *op, struct meta__reply *r)
{
	if (r->code || !r->resp)
		meta__op_fail(op, r->code ? r->code : -ENOMEM);
	else
		meta__op_done(op, RPC_OK, NULL, r->resp);
}

/* ------------------------------------------------------------- proposals */

static void exec(struct meta_node *n, struct meta__op *op);
static void do_propose(struct meta_node *n, struct meta__op *op);

static void noop_done(struct meta__op *op, int status, const char *message,
		      const ProtobufCMessage *resp)
{
	(void)op;
	(void)resp;
	if (status != RPC_OK)
		log_debug("internal request failed: %s", message ? message : "");
}

/* Propose an internal request (alarm, lease revoke, member attributes)
 * with no one waiting for its answer. */
static void propose_internal(struct meta_node *n, enum meta__method m,
			     const ProtobufCMessage *req)
{
	struct meta__op *op = meta__op_new(n, m, req, 0, noop_done, NULL);
	if (!op) {
		log_warn("out of memory for an internal %s request", meta__methods[m].name);
		return;
	}
	exec(n, op);
}

static void raise_nospace(struct meta_node *n)
{
	Etcdserverpb__AlarmRequest a = ETCDSERVERPB__ALARM_REQUEST__INIT;
	if (meta__alarm_active(&n->sm, ETCDSERVERPB__ALARM_TYPE__NOSPACE))
		return;
	a.action = ETCDSERVERPB__ALARM_REQUEST__ALARM_ACTION__ACTIVATE;
	a.memberid = n->id;
	a.alarm = ETCDSERVERPB__ALARM_TYPE__NOSPACE;
	log_warn("database space exceeded (%" PRIu64 " of %" PRIu64
		 " bytes, --quota-bytes): raising the NOSPACE alarm",
		 mvcc_db_size_bytes(n->sm.store), n->o.quota_bytes);
	propose_internal(n, META_M_ALARM, &a.base);
}

/* The next lease ID, as etcd's leader picks one for a grant that names
 * none: reqIDGen.Next() & (2^63 - 1), skipping 0 and the IDs in use. */
static int64_t next_lease_id(struct meta_node *n)
{
	const uint64_t suffix_mask = (UINT64_C(1) << 48) - 1;
	const struct lease_table *lt = mvcc_leases(n->sm.store);

	if (!n->lease_id_suffix) {
		n->lease_id_prefix = (n->id & 0xffff) << 48;
		n->lease_id_suffix = (mc_wall_ms() & ((UINT64_C(1) << 40) - 1)) << 8;
	}
	for (;;) {
		n->lease_id_suffix++;
		int64_t id = (int64_t)((n->lease_id_prefix | (n->lease_id_suffix & suffix_mask)) &
				       (uint64_t)INT64_MAX);
		if (id && !lease_exists(lt, id))
			return id;
	}
}

/*
 * A LeaseGrant with ID 0 gets its ID here, from the member that proposes
 * it, and the ID travels in the log entry: every member applies the same
 * grant. Returns 0 or -ENOMEM / -EINVAL (the request does not decode).
 */
static int stamp_lease_id(struct meta_node *n, struct meta__op *op)
{
	Etcdserverpb__LeaseGrantRequest *q =
		etcdserverpb__lease_grant_request__unpack(NULL, op->req_len, op->req);
	if (!q)
		return -EINVAL;
	if (q->id == 0) {
		q->id = next_lease_id(n);
		size_t len = etcdserverpb__lease_grant_request__get_packed_size(q);
		uint8_t *buf = malloc(len ? len : 1);
		if (!buf) {
			etcdserverpb__lease_grant_request__free_unpacked(q, NULL);
			return -ENOMEM;
		}
		etcdserverpb__lease_grant_request__pack(q, buf);
		free(op->req);
		op->req = buf;
		op->req_len = len;
		op->lease_id_chosen = true;
	}
	etcdserverpb__lease_grant_request__free_unpacked(q, NULL);
	return 0;
}

/* A grant whose chosen ID another grant took meanwhile: choose again. */
static bool retry_lease_grant(struct meta_node *n, struct meta__op *op, int code)
{
	if (op->method != META_M_LEASE_GRANT || !op->lease_id_chosen ||
	    code != MVCC_ELEASE_EXISTS || op->lease_id_tries >= 8)
		return false;
	Etcdserverpb__LeaseGrantRequest *q =
		etcdserverpb__lease_grant_request__unpack(NULL, op->req_len, op->req);
	if (!q)
		return false;
	log_debug("lease %016" PRIx64 " was taken meanwhile: granting with another ID",
		  (uint64_t)q->id);
	q->id = 0;
	size_t len = etcdserverpb__lease_grant_request__get_packed_size(q);
	uint8_t *buf = malloc(len ? len : 1);
	if (buf)
		etcdserverpb__lease_grant_request__pack(q, buf);
	etcdserverpb__lease_grant_request__free_unpacked(q, NULL);
	if (!buf)
		return false;
	free(op->req);
	op->req = buf;
	op->req_len = len;
	op->lease_id_chosen = false;
	op->lease_id_tries++;
	exec(n, op);
	return true;
}

static void propose_write(struct meta_node *n, struct meta__op *op)
{
	if (op->puts && meta__over_quota(&n->sm, n->o.quota_bytes, op->req_len)) {
		raise_nospace(n);
		meta__op_fail(op, META_ENOSPACE);
		return;
	}
	free(op->ent);
	op->ent = NULL;
	int rc = op->method == META_M_LEASE_GRANT ? stamp_lease_id(n, op) : 0;
	if (rc) {
		meta__op_fail(op, rc);
		return;
	}
	rc = meta__wrap_request(op->method, op->req, op->req_len, &op->ent, &op->ent_len);
	if (rc) {
		meta__op_fail(op, rc);
		return;
	}
	/* etcd checks the size of what it proposes, so only requests that
	 * go through the log can be too large (a read of any size the gRPC
	 * limit lets in is served). */
	if (op->ent_len > n->o.max_request_bytes) {
		meta__op_fail(op, META_ETOO_LARGE);
		return;
	}
	do_propose(n, op);
}

/* ---- membership changes (leader) */

/* "http://host:port" with a numeric host, or NULL. */
static char *normalize_url(const char *url)
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
	char *u = str_printf("http://%s", addr);
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
		uint64_t id = mc_hash64(seed, strlen(seed)) & MEMBER_ID_MASK;
		if (id && !meta__member_find(&n->sm, id) && !meta__is_removed(&n->sm, id))
			return id;
	}
}

static void propose_conf(struct meta_node *n, struct meta__op *op)
{
	ProtobufCMessage *req =
		protobuf_c_message_unpack(meta__methods[op->method].req, NULL, op->req_len, op->req);
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
		if (q->n_peerurls < 1 || !(url = normalize_url(q->peerurls[0]))) {
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
		waiters_insert(&n->waiters, op);
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

static void do_propose(struct meta_node *n, struct meta__op *op)
{
	uint64_t index = 0;
	int rc;

	if (n->in_ready) {
		meta__oplist_push(&n->propq, op);
		return;
	}
	if (op->kind == META_K_CONF) {
		struct raft_conf_change cc;
		rc = raft_conf_change_decode(op->ent, op->ent_len, &cc);
		if (rc == 0)
			rc = raft_propose_conf_change(n->raft, &cc, &index);
		if (rc == -EAGAIN) {
			meta__oplist_push(&n->retry, op);
			return;
		}
	} else {
		rc = raft_propose(n->raft, op->ent, op->ent_len, &index);
	}
	if (rc == MC_ENOT_LEADER) {
		exec(n, op); /* forward, or wait for a leader */
		return;
	}
	if (rc == -EBUSY) {
		meta__oplist_push(&n->wait_leader, op); /* leader transfer */
		return;
	}
	if (rc == -ENOMEM || rc == MC_EINTERNAL) {
		meta__fatal(n, rc, "the Raft core failed");
		meta__op_fail(op, rc);
		return;
	}
	if (rc) {
		meta__op_fail(op, rc);
		metric_inc(n->m_failed);
		return;
	}
	struct raft_status st;
	raft_status(n->raft, &st, NULL, 0);
	op->index = index;
	op->term = st.term;
	waiters_insert(&n->waiters, op);
	meta__kick(n);
}

/* ------------------------------------------------------------- reads */

/* Status: this member's view of the cluster and its state. */
static int serve_status(struct meta_node *n, struct meta__reply *r)
{
	static const char version[] = "3.4.0+mooncaked." MC_VERSION;
	Etcdserverpb__StatusResponse *p = meta__alloc(&r->arena, sizeof(*p));
	if (!p)
		return -ENOMEM;
	etcdserverpb__status_response__init(p);
	if (!(p->header = meta__header(n, &r->arena)))
		return -ENOMEM;
	p->version = (char *)version;
	p->dbsize = (int64_t)mvcc_db_size_bytes(n->sm.store);
	p->dbsizeinuse = p->dbsize;
	p->leader = n->leader;
	p->raftindex = n->commit;
	p->raftterm = n->term;
	p->raftappliedindex = n->applied;
	const struct meta__member *me = meta__member_find(&n->sm, n->id);
	p->islearner = me && me->learner;
	if (n->sm.n_alarms) {
		p->errors = meta__alloc(&r->arena, n->sm.n_alarms * sizeof(char *));
		if (!p->errors)
			return -ENOMEM;
		for (size_t i = 0; i < n->sm.n_alarms; i++) {
			char *s = meta__alloc(&r->arena, 64);
			if (!s)
				return -ENOMEM;
			snprintf(s, 64, "memberID:%llu alarm:%s ",
				 (unsigned long long)n->sm.alarms[i].memberid,
				 n->sm.alarms[i].alarm == ETCDSERVERPB__ALARM_TYPE__NOSPACE
					 ? "NOSPACE"
					 : "CORRUPT");
			p->errors[i] = s;
		}
		p->n_errors = n->sm.n_alarms;
	}
	r->resp = &p->base;
	return 0;
}

static void serve_local(struct meta_node *n, struct meta__op *op)
{
	struct meta__reply r = {0};
	if (op->method == META_M_STATUS) {
		int rc = serve_status(n, &r);
		if (rc)
			r.code = rc;
	} else {
		struct meta__sm_in in = meta__sm_in(n);
		meta__sm_read(&n->sm, &in, op->method, op->req, op->req_len, &r);
	}
	op_reply(op, &r);
	meta__reply_free(&r);
}

static void start_round(struct meta_node *n)
{
	uint8_t ctx[8];

	n->round_needed = false;
	if (n->round_in_flight || !n->reads.head || !n->running)
		return;
	if (n->in_ready) {
		n->round_needed = true;
		return;
	}
	uint64_t seq = ++n->read_seq;
	for (int i = 0; i < 8; i++)
		ctx[i] = (uint8_t)(seq >> (8 * i));
	int rc = raft_read_index(n->raft, ctx, sizeof(ctx));
	if (rc == MC_ENOT_LEADER)
		return; /* no leader known: retried on a leader change or tick */
	if (rc) {
		if (rc == -ENOMEM || rc == MC_EINTERNAL)
			meta__fatal(n, rc, "the Raft core failed");
		fail_list(&n->reads, rc);
		return;
	}
	while (n->reads.head) {
		struct meta__op *op = n->reads.head;
		meta__oplist_remove(op);
		op->read_round = seq;
		meta__oplist_push(&n->round, op);
	}
	n->round_in_flight = true;
	n->round_started_ms = meta__now(n);
	meta__kick(n);
}

/* The round in flight is lost (leader change, timeout): its reads go
 * back to the front of the queue for the next round. */
static void retry_round(struct meta_node *n)
{
	if (!n->round_in_flight)
		return;
	n->round_in_flight = false;
	while (n->round.tail) {
		struct meta__op *op = n->round.tail;
		meta__oplist_remove(op);
		op->list = &n->reads;
		op->prev = NULL;
		op->next = n->reads.head;
		if (n->reads.head)
			n->reads.head->prev = op;
		else
			n->reads.tail = op;
		n->reads.head = op;
		n->reads.n++;
	}
	n->round_needed = true;
}

static void serve_reads(struct meta_node *n)
{
	struct meta__op *op = n->read_wait.head;
	while (op) {
		struct meta__op *next = op->next;
		if (op->read_index <= n->applied)
			serve_local(n, op);
		op = next;
	}
}

static void on_read_state(struct meta_node *n, const struct raft_read_state *rs)
{
	uint64_t seq = 0;
	if (rs->ctx_len != 8)
		return;
	for (int i = 0; i < 8; i++)
		seq |= (uint64_t)((const uint8_t *)rs->ctx)[i] << (8 * i);
	if (!n->round_in_flight || seq != n->read_seq)
		return; /* an old round's late answer */
	while (n->round.head) {
		struct meta__op *op = n->round.head;
		meta__oplist_remove(op);
		op->read_index = rs->index;
		meta__oplist_push(&n->read_wait, op);
	}
	n->round_in_flight = false;
	if (n->reads.head)
		n->round_needed = true;
}

/* ------------------------------------------------------------- exec */

static void wait_or_forward(struct meta_node *n, struct meta__op *op)
{
	if (op->forwarded) {
		/* The member that forwarded it retries with the right leader. */
		meta__op_fail(op, META_ENOT_LEADER);
		return;
	}
	if (n->leader == RAFT_NONE || n->leader == n->id) {
		meta__oplist_push(&n->wait_leader, op);
		return;
	}
	op->fwd_leader = n->leader;
	metric_inc(n->m_forwarded);
	meta__peer_forward(n, op);
}

static void move_leader(struct meta_node *n, struct meta__op *op)
{
	Etcdserverpb__MoveLeaderRequest *q =
		etcdserverpb__move_leader_request__unpack(NULL, op->req_len, op->req);
	int rc;

	if (!q) {
		meta__op_fail(op, -EINVAL);
		return;
	}
	const struct meta__member *m = meta__member_find(&n->sm, q->targetid);
	if (!m || m->learner) {
		etcdserverpb__move_leader_request__free_unpacked(q, NULL);
		meta__op_fail(op, META_EBAD_LEADER_TRANSFEREE);
		return;
	}
	if (q->targetid == n->id) {
		/* etcd: the transfer to itself is done at once. */
		etcdserverpb__move_leader_request__free_unpacked(q, NULL);
		Etcdserverpb__MoveLeaderResponse resp = ETCDSERVERPB__MOVE_LEADER_RESPONSE__INIT;
		struct meta__arena a = {0};
		if ((resp.header = meta__header(n, &a)))
			meta__op_done(op, RPC_OK, NULL, &resp.base);
		else
			meta__op_fail(op, -ENOMEM);
		meta__arena_free(&a);
		return;
	}
	if (n->in_ready) {
		n->transfer_to = q->targetid;
		rc = 0;
	} else {
		rc = raft_transfer_leader(n->raft, q->targetid);
	}
	etcdserverpb__move_leader_request__free_unpacked(q, NULL);
	if (rc) {
		meta__op_fail(op, rc == MC_ENOT_LEADER ? META_ENOT_LEADER : META_EBAD_LEADER_TRANSFEREE);
		return;
	}
	op->index = 0;
	meta__oplist_push(&n->moving, op);
	meta__kick(n);
}

static void serve_leader(struct meta_node *n, struct meta__op *op)
{
	struct meta__reply r = {0};

	if (op->method == META_M_MOVE_LEADER) {
		move_leader(n, op);
		return;
	}
	struct meta__sm_in in = meta__sm_in(n);
	int rc = meta__sm_leader(&n->sm, &in, op->method, op->req, op->req_len, &r);
	if (rc == -EAGAIN) {
		meta__oplist_push(&n->retry, op);
	} else if (rc == MC_ENOT_LEADER) {
		wait_or_forward(n, op);
	} else {
		if (rc)
			r.code = rc;
		op_reply(op, &r);
	}
	meta__reply_free(&r);
}

static void exec(struct meta_node *n, struct meta__op *op)
{
	if (n->stopping || n->fatal) {
		meta__op_fail(op, META_ESTOPPED);
		return;
	}
	if (!n->running) {
		meta__op_fail(op, META_ENOT_CAPABLE);
		return;
	}
	if (meta__now(n) >= op->deadline_ms) {
		meta__op_fail(op, META_ETIMEOUT);
		return;
	}
	if (op->kind == META_K_READ_LOCAL) {
		serve_local(n, op);
		return;
	}
	if (op->kind == META_K_READ) {
		meta__oplist_push(&n->reads, op);
		start_round(n);
		return;
	}
	/* The rest is the leader's business. */
	if (!meta__is_leader(n)) {
		/* etcd answers MoveLeader only on the leader. */
		if (op->method == META_M_MOVE_LEADER)
			meta__op_fail(op, META_ENOT_LEADER);
		else
			wait_or_forward(n, op);
		return;
	}
	if (op->kind == META_K_WRITE)
		propose_write(n, op);
	else if (op->kind == META_K_CONF)
		propose_conf(n, op);
	else
		serve_leader(n, op);
}

void meta__submit(struct meta_node *n, struct meta__op *op)
{
	exec(n, op);
}

/* Run every op of list l again (leader known, an entry applied). */
static void rerun(struct meta_node *n, struct meta__oplist *l)
{
	struct meta__oplist tmp = *l;
	if (!tmp.head)
		return;
	for (struct meta__op *op = tmp.head; op; op = op->next)
		op->list = &tmp;
	memset(l, 0, sizeof(*l));
	while (tmp.head) {
		struct meta__op *op = tmp.head;
		meta__oplist_remove(op);
		exec(n, op);
	}
}

/* ------------------------------------------------------------- the turn */

static void process_ready(struct meta_node *n);

static void feed(struct meta_node *n)
{
	int rc = 0;

	while (n->qhead && !n->fatal) {
		struct meta__qmsg *q = n->qhead;
		n->qhead = q->next;
		if (!n->qhead)
			n->qtail = NULL;
		rc = raft_step(n->raft, &q->m);
		free(q);
		if (rc == -ENOMEM || rc == MC_EINTERNAL)
			goto fatal;
	}
	while (n->pending_ticks && !n->fatal) {
		n->pending_ticks--;
		if ((rc = raft_tick(n->raft)))
			goto fatal;
	}
	for (size_t i = 0; i < n->n_unreachable; i++)
		if ((rc = raft_report_unreachable(n->raft, n->unreachable[i])))
			goto fatal;
	n->n_unreachable = 0;
	for (size_t i = 0; i < n->n_snap_reports; i++)
		if ((rc = raft_report_snapshot(n->raft, n->snap_reports[i].id,
					       n->snap_reports[i].ok)))
			goto fatal;
	n->n_snap_reports = 0;
	if (n->pending_compact) {
		uint64_t i = n->pending_compact;
		n->pending_compact = 0;
		rc = raft_compact(n->raft, i);
		if (rc == -ENOMEM || rc == MC_EINTERNAL)
			goto fatal;
	}
	if (n->transfer_to) {
		uint64_t to = n->transfer_to;
		n->transfer_to = 0;
		rc = raft_transfer_leader(n->raft, to);
		if (rc == -ENOMEM || rc == MC_EINTERNAL)
			goto fatal;
	}
	if (n->campaign) {
		n->campaign = false;
		rc = raft_campaign(n->raft);
		if (rc == -ENOMEM || rc == MC_EINTERNAL)
			goto fatal;
	}
	if (n->propq.head) {
		struct meta__oplist tmp = n->propq;
		for (struct meta__op *op = tmp.head; op; op = op->next)
			op->list = &tmp;
		memset(&n->propq, 0, sizeof(n->propq));
		while (tmp.head) {
			struct meta__op *op = tmp.head;
			meta__oplist_remove(op);
			do_propose(n, op);
		}
	}
	if (n->round_needed)
		start_round(n);
	return;
fatal:
	meta__fatal(n, rc, "the Raft core failed");
}

static void run(struct meta_node *n)
{
	if (!n->running || n->in_ready || n->fatal)
		return;
	feed(n);
	if (n->fatal || !raft_has_ready(n->raft))
		return;
	int rc = raft_ready(n->raft, &n->rd);
	if (rc) {
		meta__fatal(n, rc, "the Raft core failed");
		return;
	}
	n->in_ready = true;
	process_ready(n);
}

static void on_kick(uv_idle_t *h)
{
	struct meta_node *n = MC_CONTAINER_OF(h, struct meta_node, kick);
	uv_idle_stop(h);
	run(n);
}

/* ---- soft state */

static void finish_stop(struct meta_node *n);

static void on_soft_state(struct meta_node *n, uint64_t leader, enum raft_role role)
{
	uint64_t old_leader = n->leader;
	enum raft_role old_role = n->role;

	n->leader = leader;
	n->role = role;
	if (leader != old_leader) {
		metric_inc(n->m_leader_changes);
		if (leader == RAFT_NONE)
			log_info("lost the leader %016" PRIx64, old_leader);
		else
			log_info("leader is %016" PRIx64 "%s", leader,
				 leader == n->id ? " (this member)" : "");
	}
	if (role == RAFT_LEADER && old_role != RAFT_LEADER) {
		lease_promote(mvcc_leases(n->sm.store), meta__now(n), n->o.election_ms);
		log_info("became the leader at term %" PRIu64 "; leases extended by %" PRIu64
			 " ms",
			 n->term, n->o.election_ms);
	} else if (old_role == RAFT_LEADER && role != RAFT_LEADER) {
		lease_demote(mvcc_leases(n->sm.store));
		log_info("no longer the leader");
	}
	if (leader != old_leader) {
		retry_round(n);
		/* MoveLeader calls: done once someone else leads. */
		if (role != RAFT_LEADER && leader != RAFT_NONE) {
			while (n->moving.head) {
				struct meta__op *op = n->moving.head;
				Etcdserverpb__MoveLeaderResponse resp =
					ETCDSERVERPB__MOVE_LEADER_RESPONSE__INIT;
				struct meta__arena a = {0};
				resp.header = meta__header(n, &a);
				if (resp.header)
					meta__op_done(op, RPC_OK, NULL, &resp.base);
				else
					meta__op_fail(op, -ENOMEM);
				meta__arena_free(&a);
			}
		}
		if (leader != RAFT_NONE)
			rerun(n, &n->wait_leader);
	}
	if (n->stopping && old_role == RAFT_LEADER && role != RAFT_LEADER)
		finish_stop(n);
}

/* ---- persistence */

struct persist_job {
	struct meta__job job;
	struct meta_node *n;
	struct wal_hard_state hs;
	bool has_hs;
	const struct wal_entry *ents;
	size_t n_ents;
	bool sync;
	/* a received snapshot to make the node's */
	struct snap_meta smeta;
	uint8_t *conf;
	const uint8_t *snap_data;
	size_t snap_len;
	bool install;
};

static void persist_work(struct meta__job *j)
{
	struct persist_job *p = MC_CONTAINER_OF(j, struct persist_job, job);
	struct meta_node *n = p->n;
	int rc = 0;

	if (p->install) {
		struct snap_writer *wr;
		rc = snap_writer_open(n->snap_dir, &p->smeta, &wr);
		if (rc == 0) {
			rc = snap_writer_write(wr, p->snap_data, p->snap_len);
			if (rc == 0)
				rc = snap_writer_commit(wr, SNAPSHOTS_KEPT);
			else
				snap_writer_abort(wr);
		}
		if (rc == 0)
			rc = wal_save_snapshot(n->wal,
					       (struct wal_snap_ref){p->smeta.index, p->smeta.term},
					       false);
	}
	if (rc == 0)
		rc = wal_save(n->wal, p->has_hs ? &p->hs : NULL, p->ents, p->n_ents, p->sync);
	j->rc = rc;
}

static void persist_done(struct meta_node *n);

static void persist_job_done(struct meta__job *j)
{
	struct persist_job *p = MC_CONTAINER_OF(j, struct persist_job, job);
	struct meta_node *n = p->n;
	int rc = j->rc;

	n->disk_jobs--;
	n->persist_job = NULL;
	if (!rc && p->install)
		n->durable_index = p->smeta.index;
	if (!rc && p->n_ents)
		n->durable_index = p->ents[p->n_ents - 1].index;
	free(p->conf);
	free(p);
	if (rc) {
		meta__fatal(n, rc, "cannot write the WAL");
		meta__check_stopped(n);
		return;
	}
	persist_done(n);
	meta__check_stopped(n);
}

/* Peers named in conf change entries about to be persisted become known
 * to the transport at once (the change is in force when appended). */
static void learn_peers(struct meta_node *n, const struct raft_entry *e, size_t k)
{
	for (size_t i = 0; i < k; i++) {
		struct raft_conf_change cc;
		if (e[i].type != RAFT_ENTRY_CONF_CHANGE ||
		    raft_conf_change_decode(e[i].data, e[i].len, &cc) || !cc.context_len ||
		    cc.node_id == n->id)
			continue;
		Mooncake__Meta__ConfContext *ctx =
			mooncake__meta__conf_context__unpack(NULL, cc.context_len, cc.context);
		if (!ctx)
			continue;
		if (ctx->member && ctx->member->n_peer_urls &&
		    meta__peer_set(n, cc.node_id, ctx->member->peer_urls[0]))
			log_warn("member %016" PRIx64 ": cannot use peer URL %s", cc.node_id,
				 ctx->member->peer_urls[0]);
		mooncake__meta__conf_context__free_unpacked(ctx, NULL);
	}
}

static void apply_committed(struct meta_node *n, const struct raft_entry *e, size_t k);
static void after_apply(struct meta_node *n);

/*
 * Committed entries already durable here before this ready (every one of
 * them on a member that is not alone, since the leader commits what a
 * quorum has made durable) are applied and answered at once, before the
 * ready's own fdatasync: a commit then costs no extra local sync. ReadIndex
 * answers need no durability either. The rest waits for the persist.
 */
static void apply_early(struct meta_node *n)
{
	struct raft_ready *rd = &n->rd;
	size_t k = 0;

	n->early_applied = 0;
	n->early_ran = false;
	if (rd->snapshot)
		return;
	n->early_ran = true;
	while (k < rd->n_committed && rd->committed[k].index <= n->durable_index)
		k++;
	if (k) {
		apply_committed(n, rd->committed, k);
		n->early_applied = k;
	}
	for (size_t i = 0; i < rd->n_read_states && !n->fatal; i++)
		on_read_state(n, &rd->read_states[i]);
	if (!n->fatal && (k || rd->n_read_states))
		after_apply(n);
}

static void process_ready(struct meta_node *n)
{
	struct raft_ready *rd = &n->rd;

	if (rd->hard_state_changed) {
		n->term = rd->hard_state.term;
		n->commit = rd->hard_state.commit;
	}
	if (rd->soft_state_changed)
		on_soft_state(n, rd->leader, rd->role);
	learn_peers(n, rd->entries, rd->n_entries);
	/* Entries this ready replaces are not durable any more. */
	if (rd->n_entries && rd->entries[0].index <= n->durable_index)
		n->durable_index = rd->entries[0].index - 1;
	if (!rd->snapshot && !rd->n_entries && !rd->hard_state_changed) {
		n->early_applied = 0;
		n->early_ran = false;
		persist_done(n);
		return;
	}
	apply_early(n);
	if (n->fatal)
		return;
	struct persist_job *p = calloc(1, sizeof(*p));
	if (!p || (rd->n_entries > n->went_cap &&
		   !(n->went = realloc(n->went, rd->n_entries * sizeof(*n->went))))) {
		free(p);
		meta__fatal(n, -ENOMEM, "cannot persist a ready batch");
		return;
	}
	if (rd->n_entries > n->went_cap)
		n->went_cap = rd->n_entries;
	for (size_t i = 0; i < rd->n_entries; i++) {
		n->went[i].index = rd->entries[i].index;
		n->went[i].term = rd->entries[i].term;
		n->went[i].type = (uint32_t)rd->entries[i].type;
		n->went[i].data = rd->entries[i].data;
		n->went[i].len = rd->entries[i].len;
	}
	p->job.work = persist_work;
	p->job.done = persist_job_done;
	p->n = n;
	p->ents = n->went;
	p->n_ents = rd->n_entries;
	p->sync = rd->must_sync;
	if (rd->hard_state_changed) {
		p->has_hs = true;
		p->hs.term = rd->hard_state.term;
		p->hs.vote = rd->hard_state.vote;
		p->hs.commit = rd->hard_state.commit;
	}
	if (rd->snapshot) {
		struct meta__recv_snap *rs = n->recv_snap;
		if (!rs || rs->index != rd->snapshot->index || rs->term != rd->snapshot->term) {
			free(p);
			meta__fatal(n, MC_EINTERNAL,
				    "the Raft core installs a snapshot the transport did not receive");
			return;
		}
		Mooncake__Raft__ConfState cs = MOONCAKE__RAFT__CONF_STATE__INIT;
		cs.voters = (uint64_t *)rd->snapshot->conf.voters;
		cs.n_voters = rd->snapshot->conf.n_voters;
		cs.learners = (uint64_t *)rd->snapshot->conf.learners;
		cs.n_learners = rd->snapshot->conf.n_learners;
		size_t cl = mooncake__raft__conf_state__get_packed_size(&cs);
		if (!(p->conf = malloc(cl ? cl : 1))) {
			free(p);
			meta__fatal(n, -ENOMEM, "cannot persist a snapshot");
			return;
		}
		mooncake__raft__conf_state__pack(&cs, p->conf);
		p->smeta = (struct snap_meta){rs->index, rs->term, p->conf, cl};
		p->snap_data = rs->data;
		p->snap_len = rs->len;
		p->install = true;
		p->sync = true;
	}
	n->persist_job = &p->job;
	n->disk_jobs++;
	meta__worker_submit(n->disk, &p->job);
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

static const char *alarm_name(int alarm)
{
	return alarm == ETCDSERVERPB__ALARM_TYPE__NOSPACE ? "NOSPACE" : "CORRUPT";
}

void meta__sm_effects_done(struct meta_node *n, const struct meta__sm_effects *fx)
{
	const struct meta__member *m = meta__member_find(&n->sm, fx->member_id);

	switch (fx->member_change) {
	case META_MEMBER_NONE:
		break;
	case META_MEMBER_ADDED:
		log_info("member %016" PRIx64 " (%s) added as a %s", fx->member_id,
			 m && *m->peer_url ? m->peer_url : "no peer URL",
			 m && m->learner ? "learner" : "voter");
		break;
	case META_MEMBER_PROMOTED:
		log_info("member %016" PRIx64 " promoted to voter", fx->member_id);
		break;
	case META_MEMBER_REMOVED:
		log_info("member %016" PRIx64 " removed", fx->member_id);
		if (fx->member_id == n->id) {
			log_error("this member (%016" PRIx64 ") was removed from the cluster",
				  n->id);
			meta__fatal(n, META_ESTOPPED, "removed from the cluster");
			return;
		}
		break;
	case META_MEMBER_PUBLISHED:
		log_info("member %016" PRIx64 " published name %s, client URL %s", fx->member_id,
			 m ? m->name : "?", m && *m->client_url ? m->client_url : "(none)");
		break;
	case META_MEMBER_MOVED:
		log_info("member %016" PRIx64 " moved to peer URL %s", fx->member_id,
			 m ? m->peer_url : "?");
		break;
	}
	if (fx->member_change != META_MEMBER_NONE)
		meta__sync_members(n);
	if (fx->alarm_raised)
		log_warn("alarm %s raised for member %016" PRIx64, alarm_name(fx->alarm_raised),
			 fx->alarm_member);
	if (fx->alarms_cleared)
		log_info("%zu alarm%s cleared", fx->alarms_cleared,
			 fx->alarms_cleared == 1 ? "" : "s");
	if (fx->compacted_rev)
		log_info("compacted the store at revision %" PRId64, fx->compacted_rev);
}

static void apply_committed(struct meta_node *n, const struct raft_entry *e, size_t k)
{
	for (size_t i = 0; i < k && !n->fatal; i++) {
		struct meta__op *op = NULL;
		/* Proposals for this index: the one of the entry's term is
		 * answered by it; others (their entry was replaced) failed. */
		while (n->waiters.head && n->waiters.head->index <= e[i].index) {
			struct meta__op *w = n->waiters.head;
			if (w->index == e[i].index && w->term == e[i].term && !op) {
				meta__oplist_remove(w);
				op = w;
				continue;
			}
			metric_inc(n->m_failed);
			meta__op_fail(w, META_ELEADER_CHANGED);
		}
		struct meta__reply r = {0};
		struct meta__sm_effects fx;
		struct meta__sm_in in = meta__sm_in(n);
		int rc = meta__sm_apply(&n->sm, &e[i], &in, op ? &r : NULL, &fx);
		if (rc) {
			meta__reply_free(&r);
			if (op)
				meta__op_fail(op, rc);
			meta__fatal(n, rc, "cannot apply a committed entry");
			return;
		}
		n->applied = e[i].index;
		n->applied_term = e[i].term;
		if (op && !retry_lease_grant(n, op, r.code))
			op_reply(op, &r);
		meta__reply_free(&r);
		meta__sm_effects_done(n, &fx);
	}
	metric_add(n->m_committed, k);
}

static void maybe_snapshot(struct meta_node *n);
static void maybe_publish(struct meta_node *n);
static void update_metrics(struct meta_node *n);

/* After entries were applied: watchers, parked requests, reads. */
static void after_apply(struct meta_node *n)
{
	meta__watch_pump(n);
	rerun(n, &n->retry);
	serve_reads(n);
}

static void persist_done(struct meta_node *n)
{
	struct raft_ready *rd = &n->rd;
	int rc;

	if (n->fatal)
		return; /* the ready stays out: the node is frozen for good */
	if (rd->snapshot) {
		struct meta__recv_snap *rs = n->recv_snap;
		rc = meta__sm_restore(&n->sm, rs->data, rs->len);
		if (rc) {
			meta__fatal(n, rc, "cannot load the snapshot received from the leader");
			return;
		}
		meta__sync_members(n);
		n->applied = rs->index;
		n->applied_term = rs->term;
		n->snap_index = rs->index;
		log_info("installed the leader's snapshot at index %" PRIu64 " (%zu bytes)",
			 rs->index, rs->len);
		free(rs->data);
		free(rs);
		n->recv_snap = NULL;
		metric_inc(n->m_snap_recv);
		if ((rc = meta__watch_rebind(n))) {
			meta__fatal(n, rc, "cannot move the watchers to the new store");
			return;
		}
	}
	meta__peer_send(n, rd->msgs, rd->n_msgs);
	size_t early = n->early_applied;
	apply_committed(n, rd->committed + early, rd->n_committed - early);
	if (n->fatal)
		return;
	if (!n->early_ran)
		for (size_t i = 0; i < rd->n_read_states; i++)
			on_read_state(n, &rd->read_states[i]);
	rc = raft_advance(n->raft, rd);
	n->in_ready = false;
	n->early_applied = 0;
	n->early_ran = false;
	if (rc) {
		meta__fatal(n, rc, "the Raft core failed");
		return;
	}
	if (rd->n_committed > early || rd->snapshot)
		after_apply(n);
	else
		serve_reads(n);
	maybe_snapshot(n);
	maybe_publish(n);
	update_metrics(n);
	meta__kick(n);
	meta__check_stopped(n);
}

/* ------------------------------------------------------------- snapshots */

struct snap_job {
	uv_work_t req;
	struct meta__job wal_job;
	struct meta_node *n;
	uint64_t index, term;
	uint8_t *data;
	size_t len;
	uint8_t *conf;
	size_t conf_len;
	int rc;
};

static void snap_write_work(uv_work_t *w)
{
	struct snap_job *s = MC_CONTAINER_OF(w, struct snap_job, req);
	struct snap_meta m = {s->index, s->term, s->conf, s->conf_len};
	struct snap_writer *wr;

	s->rc = snap_writer_open(s->n->snap_dir, &m, &wr);
	if (s->rc)
		return;
	s->rc = snap_writer_write(wr, s->data, s->len);
	if (s->rc) {
		snap_writer_abort(wr);
		return;
	}
	s->rc = snap_writer_commit(wr, SNAPSHOTS_KEPT);
}

static void snap_marker_work(struct meta__job *j)
{
	struct snap_job *s = MC_CONTAINER_OF(j, struct snap_job, wal_job);
	struct meta_node *n = s->n;
	uint64_t oldest = 0;
	int rc;

	j->rc = 0;
	if (wal_snapshot(n->wal).index >= s->index)
		return; /* a newer snapshot (from the leader) is already there */
	rc = wal_save_snapshot(n->wal, (struct wal_snap_ref){s->index, s->term}, true);
	if (rc) {
		j->rc = rc;
		return;
	}
	/* Keep the WAL from the oldest snapshot kept, so recovery can fall
	 * back to it if the newest turns out unreadable. */
	if (snap_oldest_index(n->snap_dir, &oldest) == 0 && oldest &&
	    (rc = wal_release_to(n->wal, oldest)))
		log_warn("cannot release WAL segments up to %" PRIu64 ": %s", oldest,
			 mc_strerror(rc));
}

static void snap_job_free(struct snap_job *s)
{
	free(s->data);
	free(s->conf);
	free(s);
}

static void snap_marker_done(struct meta__job *j)
{
	struct snap_job *s = MC_CONTAINER_OF(j, struct snap_job, wal_job);
	struct meta_node *n = s->n;

	n->disk_jobs--;
	n->snapshotting = false;
	if (j->rc) {
		meta__fatal(n, j->rc, "cannot record a snapshot in the WAL");
	} else {
		if (s->index > n->snap_index)
			n->snap_index = s->index;
		n->pending_compact = s->index;
		metric_inc(n->m_snapshots);
		log_info("snapshot at index %" PRIu64 " (%zu bytes) saved; log compacted", s->index,
			 s->len);
		meta__kick(n);
	}
	snap_job_free(s);
	meta__check_stopped(n);
}

static void snap_write_done(uv_work_t *w, int status)
{
	struct snap_job *s = MC_CONTAINER_OF(w, struct snap_job, req);
	struct meta_node *n = s->n;

	n->uv_works--;
	if (status || s->rc) {
		log_error("cannot write the snapshot at index %" PRIu64 ": %s", s->index,
			  mc_strerror(status ? status : s->rc));
		n->snapshotting = false;
		snap_job_free(s);
		meta__check_stopped(n);
		return;
	}
	if (n->fatal) {
		n->snapshotting = false;
		snap_job_free(s);
		meta__check_stopped(n);
		return;
	}
	/* The data is on disk: only the marker job needs the job now. */
	free(s->data);
	s->data = NULL;
	s->wal_job.work = snap_marker_work;
	s->wal_job.done = snap_marker_done;
	n->disk_jobs++;
	meta__worker_submit(n->disk, &s->wal_job);
}

static void maybe_snapshot(struct meta_node *n)
{
	if (n->snapshotting || n->stopping || n->fatal ||
	    n->applied - n->snap_index < n->o.snapshot_count)
		return;
	struct snap_job *s = calloc(1, sizeof(*s));
	int rc = -ENOMEM;
	if (!s)
		goto fail;
	s->n = n;
	s->index = n->applied;
	s->term = n->applied_term;
	rc = meta__sm_snapshot(&n->sm, &s->data, &s->len);
	if (rc == 0)
		rc = meta__conf_bytes(&n->sm, &s->conf, &s->conf_len);
	if (rc)
		goto fail;
	rc = uv_queue_work(n->loop, &s->req, snap_write_work, snap_write_done);
	if (rc)
		goto fail;
	n->uv_works++;
	n->snapshotting = true;
	return;
fail:
	log_error("cannot take a snapshot at index %" PRIu64 ": %s", n->applied,
		  mc_strerror(rc));
	if (s)
		snap_job_free(s);
	/* Try again after as many entries again. */
	n->snap_index = n->applied;
}

/* ------------------------------------------------------------- publishing */

static void maybe_publish(struct meta_node *n)
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
	propose_internal(n, META_M_PUBLISH, &at.base);
}

/* ------------------------------------------------------------- timers */

static void sweep(struct meta_node *n, struct meta__oplist *l, int code)
{
	uint64_t now = meta__now(n);
	struct meta__op *op = l->head;
	while (op) {
		struct meta__op *next = op->next;
		if (op->deadline_ms <= now) {
			metric_inc(n->m_failed);
			meta__op_fail(op, code);
		}
		op = next;
	}
}

static void expire_leases(struct meta_node *n)
{
	int64_t ids[LEASE_REVOKES_PER_TICK];
	size_t k = lease_expired(mvcc_leases(n->sm.store), meta__now(n), 2 * n->o.election_ms,
				 ids, MC_ARRAY_LEN(ids));
	for (size_t i = 0; i < k; i++) {
		Etcdserverpb__LeaseRevokeRequest q = ETCDSERVERPB__LEASE_REVOKE_REQUEST__INIT;
		q.id = ids[i];
		log_debug("lease %016" PRIx64 " expired: revoking", (uint64_t)ids[i]);
		propose_internal(n, META_M_LEASE_REVOKE, &q.base);
	}
}

static void on_tick(uv_timer_t *t)
{
	struct meta_node *n = MC_CONTAINER_OF(t, struct meta_node, tick_timer);
	uint64_t now = meta__now(n);

	if (!n->running || n->fatal)
		return;
	n->pending_ticks++;
	sweep(n, &n->wait_leader, META_ENO_LEADER);
	sweep(n, &n->retry, META_ETIMEOUT);
	sweep(n, &n->reads, META_ETIMEOUT);
	sweep(n, &n->round, META_ETIMEOUT);
	sweep(n, &n->read_wait, META_ETIMEOUT);
	sweep(n, &n->waiters, META_ETIMEOUT);
	sweep(n, &n->moving, META_ETIMEOUT_LEADER_TRANSFER);
	if (n->round_in_flight && now - n->round_started_ms >= n->o.election_ms)
		retry_round(n);
	if (n->reads.head && !n->round_in_flight)
		n->round_needed = true;
	if (meta__is_leader(n) && !n->stopping)
		expire_leases(n);
	/* Silence from every peer: are we still a member? */
	if (!meta__is_leader(n) && n->n_peers && now - n->last_heard_ms > 4 * n->o.election_ms &&
	    now - n->last_probe_ms > 4 * n->o.election_ms) {
		n->last_probe_ms = now;
		meta__peer_probe(n);
	}
	if (n->leader != RAFT_NONE && n->wait_leader.head && !n->stopping)
		rerun(n, &n->wait_leader);
	maybe_publish(n);
	meta__kick(n);
}

/* ------------------------------------------------------------- transport inputs */

void meta__step(struct meta_node *n, const struct raft_msg *m)
{
	if (!n->running || n->fatal || n->finishing)
		return;
	if (!n->in_ready) {
		int rc = raft_step(n->raft, m);
		if (rc == -ENOMEM || rc == MC_EINTERNAL)
			meta__fatal(n, rc, "the Raft core failed");
		else if (rc)
			log_debug("dropped a %s from %016" PRIx64 ": %s", raft_msg_type_name(m->type),
				  m->from, mc_strerror(rc));
		meta__kick(n);
		return;
	}
	struct meta__qmsg *q = meta__msg_copy(m);
	if (!q)
		return; /* dropped: Raft tolerates lost messages */
	if (n->qtail)
		n->qtail->next = q;
	else
		n->qhead = q;
	n->qtail = q;
}

void meta__step_owned(struct meta_node *n, struct meta__qmsg *q)
{
	if (!n->running || n->fatal || n->finishing || !n->in_ready) {
		meta__step(n, &q->m);
		free(q);
		return;
	}
	q->next = NULL;
	if (n->qtail)
		n->qtail->next = q;
	else
		n->qhead = q;
	n->qtail = q;
}

void meta__resubmit(struct meta_node *n, struct meta__op *op)
{
	exec(n, op);
}

void meta__wait_leader(struct meta_node *n, struct meta__op *op)
{
	if (n->stopping || n->fatal) {
		meta__op_fail(op, META_ESTOPPED);
		return;
	}
	meta__oplist_push(&n->wait_leader, op);
}

static int grow(void **v, size_t *cap, size_t need, size_t size)
{
	if (need <= *cap)
		return 0;
	size_t c = *cap ? *cap * 2 : 8;
	void *p = realloc(*v, c * size);
	if (!p)
		return -ENOMEM;
	*v = p;
	*cap = c;
	return 0;
}

void meta__report_unreachable(struct meta_node *n, uint64_t id)
{
	if (!n->running || n->fatal)
		return;
	for (size_t i = 0; i < n->n_unreachable; i++)
		if (n->unreachable[i] == id)
			return;
	if (grow((void **)&n->unreachable, &n->cap_unreachable, n->n_unreachable + 1,
		 sizeof(uint64_t)))
		return;
	n->unreachable[n->n_unreachable++] = id;
	meta__kick(n);
}

void meta__report_snapshot(struct meta_node *n, uint64_t id, bool ok)
{
	if (!n->running || n->fatal)
		return;
	if (grow((void **)&n->snap_reports, &n->cap_snap_reports, n->n_snap_reports + 1,
		 sizeof(*n->snap_reports)))
		return;
	n->snap_reports[n->n_snap_reports].id = id;
	n->snap_reports[n->n_snap_reports].ok = ok;
	n->n_snap_reports++;
	meta__kick(n);
}

/* ------------------------------------------------------------- metrics */

#define M_(field) offsetof(struct meta_node, field)
static const struct {
	size_t off; /* of the struct metric * in the node */
	bool counter;
	const char *name, *help;
} metric_defs[] = {
	{M_(m_term), false, "mooncake_meta_raft_term", "Current Raft term."},
	{M_(m_leader), false, "mooncake_meta_leader_id", "Member ID of the leader (0: none known)."},
	{M_(m_has_leader), false, "mooncake_meta_has_leader", "1 when a leader is known."},
	{M_(m_is_leader), false, "mooncake_meta_is_leader", "1 when this member is the leader."},
	{M_(m_commit), false, "mooncake_meta_commit_index", "Raft commit index known here."},
	{M_(m_applied), false, "mooncake_meta_applied_index",
	 "Last Raft index applied to the state machine."},
	{M_(m_committed), true, "mooncake_meta_proposals_committed_total",
	 "Log entries committed and applied."},
	{M_(m_failed), true, "mooncake_meta_proposals_failed_total",
	 "Proposals that failed (lost to a leader change, refused or timed out)."},
	{M_(m_pending), false, "mooncake_meta_proposals_pending",
	 "Proposals waiting to be applied."},
	{M_(m_leader_changes), true, "mooncake_meta_leader_changes_total", "Leader changes seen."},
	{M_(m_snapshots), true, "mooncake_meta_snapshots_total", "Snapshots taken by this member."},
	{M_(m_snap_sent), true, "mooncake_meta_snapshots_sent_total",
	 "Snapshots streamed to lagging members."},
	{M_(m_snap_recv), true, "mooncake_meta_snapshots_received_total",
	 "Snapshots installed from the leader."},
	{M_(m_db_size), false, "mooncake_meta_db_size_bytes",
	 "Size of the key-value store (keys, values, history), as compared with --quota-bytes."},
	{M_(m_watchers), false, "mooncake_meta_watchers", "Active watchers."},
	{M_(m_leases), false, "mooncake_meta_leases", "Leases held."},
	{M_(m_keys), false, "mooncake_meta_keys", "Live keys."},
	{M_(m_forwarded), true, "mooncake_meta_forwarded_total",
	 "Requests forwarded to the leader."},
};
#undef M_

static void register_metrics(struct meta_node *n)
{
	struct metrics_registry *r = n->o.metrics ? n->o.metrics : metrics_global();
	for (size_t i = 0; i < MC_ARRAY_LEN(metric_defs); i++) {
		struct metric **slot = (struct metric **)((char *)n + metric_defs[i].off);
		*slot = metric_defs[i].counter
				? metrics_counter(r, metric_defs[i].name, metric_defs[i].help, NULL, NULL)
				: metrics_gauge(r, metric_defs[i].name, metric_defs[i].help, NULL, NULL);
	}
}

static void update_metrics(struct meta_node *n)
{
	struct mvcc_stats ms;
	struct watch_stats ws;

	metric_set(n->m_term, (int64_t)n->term);
	metric_set(n->m_leader, (int64_t)n->leader);
	metric_set(n->m_has_leader, n->leader != RAFT_NONE);
	metric_set(n->m_is_leader, n->role == RAFT_LEADER);
	metric_set(n->m_commit, (int64_t)n->commit);
	metric_set(n->m_applied, (int64_t)n->applied);
	metric_set(n->m_pending, (int64_t)n->waiters.n);
	mvcc_stats(n->sm.store, &ms);
	metric_set(n->m_db_size, (int64_t)ms.db_size_bytes);
	metric_set(n->m_keys, (int64_t)ms.keys);
	metric_set(n->m_leases, (int64_t)lease_count(mvcc_leases(n->sm.store)));
	if (n->watch) {
		watch_stats(n->watch, &ws);
		metric_set(n->m_watchers, (int64_t)ws.watchers);
	}
}

/* ------------------------------------------------------------- files */

static int write_file_durably(const char *dir, const char *path, const char *text)
{
	char *tmp = str_printf("%s.tmp", path);
	int fd, rc = 0;
	size_t len = strlen(text);

	if (!tmp)
		return -ENOMEM;
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
	if (fd < 0) {
		rc = -errno;
		goto out;
	}
	if (write(fd, text, len) != (ssize_t)len)
		rc = errno ? -errno : -EIO;
	if (rc == 0 && fsync(fd))
		rc = -errno;
	if (close(fd) && rc == 0)
		rc = -errno;
	if (rc == 0 && rename(tmp, path))
		rc = -errno;
	if (rc == 0)
		rc = mc_fsync_dir(dir);
out:
	if (rc)
		unlink(tmp);
	free(tmp);
	return rc;
}

static int write_member_file(struct meta_node *n)
{
	char text[160];
	snprintf(text, sizeof(text),
		 "# mooncaked meta member identity; do not edit\n"
		 "member-id = %016" PRIx64 "\ncluster-id = %016" PRIx64 "\n",
		 n->id, n->sm.cluster_id);
	int rc = write_file_durably(n->dir, n->member_path, text);
	if (rc)
		log_error("cannot write %s: %s", n->member_path, mc_strerror(rc));
	return rc;
}

static int read_member_file(struct meta_node *n)
{
	FILE *f = fopen(n->member_path, "re");
	char line[160];
	bool have_id = false, have_cluster = false;

	if (!f) {
		int rc = -errno;
		log_error("%s: cannot open: %s (the WAL exists, so this member's identity "
			  "must too)",
			  n->member_path, mc_strerror(rc));
		return rc == -ENOENT ? -EBADMSG : rc;
	}
	while (fgets(line, sizeof(line), f)) {
		unsigned long long v;
		if (sscanf(line, "member-id = %llx", &v) == 1) {
			n->id = v;
			have_id = true;
		} else if (sscanf(line, "cluster-id = %llx", &v) == 1) {
			n->sm.cluster_id = v;
			have_cluster = true;
		}
	}
	fclose(f);
	if (!have_id || !have_cluster || !n->id) {
		log_error("%s: no member-id/cluster-id lines", n->member_path);
		return -EBADMSG;
	}
	return 0;
}

/* ------------------------------------------------------------- start-up */

struct founder {
	char *name;
	char *url; /* http://host:port */
	uint64_t id;
};

static void founders_free(struct founder *f, size_t k)
{
	for (size_t i = 0; i < k; i++) {
		free(f[i].name);
		free(f[i].url);
	}
	free(f);
}

/* Parse --initial-cluster "name=host:port,..." (URLs may carry http://). */
static int parse_initial_cluster(struct meta_node *n, struct founder **out, size_t *count)
{
	const char *spec = n->initial_cluster;
	char *own = NULL;
	struct founder *v = NULL;
	size_t k = 0;
	int rc = MC_ECONFIG;

	if (!spec || !*spec) {
		own = str_printf("%s=%s", n->name, n->self_peer_url);
		if (!own)
			return -ENOMEM;
		spec = own;
	}
	const char *p = spec;
	while (*p) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		char *item = strndup(p, len);
		char *eq = item ? strchr(item, '=') : NULL;
		struct founder *nv = realloc(v, (k + 1) * sizeof(*v));
		if (!item || !nv) {
			free(item);
			rc = -ENOMEM;
			goto fail;
		}
		v = nv;
		if (!eq || eq == item) {
			log_error("--initial-cluster: '%s' is not name=host:port", item);
			free(item);
			goto fail;
		}
		*eq = '\0';
		v[k].name = strdup(item);
		v[k].url = normalize_url(eq + 1);
		v[k].id = 0;
		if (!v[k].name || !v[k].url) {
			log_error("--initial-cluster: '%s' is not a numeric host:port", eq + 1);
			free(v[k].name);
			free(v[k].url);
			free(item);
			goto fail;
		}
		free(item);
		for (size_t i = 0; i < k; i++)
			if (strcmp(v[i].name, v[k].name) == 0 || strcmp(v[i].url, v[k].url) == 0) {
				log_error("--initial-cluster: member %s is listed twice",
					  v[k].name);
				k++;
				goto fail;
			}
		k++;
		if (!end)
			break;
		p = end + 1;
	}
	if (!k) {
		log_error("--initial-cluster: no members");
		goto fail;
	}
	free(own);
	*out = v;
	*count = k;
	return 0;
fail:
	founders_free(v, k);
	free(own);
	return rc;
}

static int open_raft(struct meta_node *n, const struct raft_restore *rs)
{
	struct raft_config c;
	raft_config_init(&c, n->id);
	c.election_ticks = (unsigned)(n->o.election_ms / n->o.heartbeat_ms);
	c.heartbeat_ticks = 1;
	c.seed = mc_now_ns() ^ n->id;
	int rc = raft_new(&c, rs, &n->raft);
	if (rc)
		log_error("cannot start the Raft core: %s", mc_strerror(rc));
	return rc;
}

static int open_wal(struct meta_node *n, bool create, struct wal_recovery *rec)
{
	struct wal_options wo = {.create = create, .metrics = n->o.metrics};
	int rc = wal_open(n->wal_dir, &wo, &n->wal, rec);
	if (rc && rc != -EBADMSG)
		log_error("cannot open the WAL in %s: %s", n->wal_dir, mc_strerror(rc));
	return rc;
}

/* Found a new cluster from --initial-cluster. */
static int found(struct meta_node *n)
{
	struct founder *f = NULL;
	size_t k = 0, self = SIZE_MAX;
	struct raft_conf_change *ccs = NULL;
	uint8_t **ctxs = NULL;
	struct wal_recovery rec = {0};
	const char *my_url = n->self_peer_url;
	int rc = parse_initial_cluster(n, &f, &k);

	if (rc)
		goto out;
	rc = MC_ECONFIG;
	for (size_t i = 0; i < k; i++)
		if (strcmp(f[i].name, n->name) == 0)
			self = i;
	if (self == SIZE_MAX) {
		log_error("--name %s is not in --initial-cluster", n->name);
		goto out;
	}
	if (strcmp(my_url, f[self].url) != 0) {
		log_error("--initial-cluster has %s at %s, but this member's peer address "
			  "(--advertise-peer, else --listen-peer) is %s",
			  n->name, f[self].url, my_url);
		goto out;
	}
	/* IDs: a hash of each member's peer URL and the whole founding list,
	 * so the same list gives the same IDs on every founder. */
	uint64_t cluster = 0;
	for (size_t i = 0; i < k; i++) {
		char *seed = str_printf("%s|%s", f[i].url, n->initial_cluster);
		if (!seed) {
			rc = -ENOMEM;
			goto out;
		}
		f[i].id = mc_hash64(seed, strlen(seed)) & MEMBER_ID_MASK;
		if (!f[i].id)
			f[i].id = 1;
		free(seed);
		cluster ^= mc_hash64(&f[i].id, sizeof(f[i].id));
	}
	n->id = f[self].id;
	n->sm.member_id = n->id;
	n->sm.cluster_id = cluster & MEMBER_ID_MASK ? cluster & MEMBER_ID_MASK : 1;

	rc = -ENOMEM;
	ccs = calloc(k, sizeof(*ccs));
	ctxs = calloc(k, sizeof(*ctxs));
	if (!ccs || !ctxs)
		goto out;
	for (size_t i = 0; i < k; i++) {
		Mooncake__Meta__ConfContext ctx = MOONCAKE__META__CONF_CONTEXT__INIT;
		Mooncake__Meta__Member pm = MOONCAKE__META__MEMBER__INIT;
		pm.id = f[i].id;
		pm.name = "";
		pm.peer_urls = &f[i].url;
		pm.n_peer_urls = 1;
		ctx.member = &pm;
		size_t len = mooncake__meta__conf_context__get_packed_size(&ctx);
		if (!(ctxs[i] = malloc(len)))
			goto out;
		mooncake__meta__conf_context__pack(&ctx, ctxs[i]);
		ccs[i] = (struct raft_conf_change){RAFT_CC_ADD_VOTER, f[i].id, ctxs[i], len};
		if (i != self && (rc = meta__peer_set(n, f[i].id, f[i].url)))
			goto out;
		rc = -ENOMEM;
	}
	if ((rc = write_member_file(n)))
		goto out;
	if ((rc = open_wal(n, true, &rec)))
		goto out;
	wal_recovery_close(&rec);
	if ((rc = open_raft(n, NULL)))
		goto out;
	rc = raft_bootstrap_members(n->raft, ccs, k);
	if (rc) {
		log_error("cannot bootstrap the cluster: %s", mc_strerror(rc));
		goto out;
	}
	log_info("founded cluster %016" PRIx64 " with %zu member%s; this member is %s (%016" PRIx64
		 ")",
		 n->sm.cluster_id, k, k == 1 ? "" : "s", n->name, n->id);
	rc = 0;
out:
	if (ctxs)
		for (size_t i = 0; i < k; i++)
			free(ctxs[i]);
	free(ctxs);
	free(ccs);
	founders_free(f, k);
	return rc;
}

static int accept_snapshot(void *ctx, uint64_t index, uint64_t term)
{
	return wal_recovery_check_start(ctx, index, term);
}

int meta__snap_load(const char *path, uint8_t **data, size_t *len)
{
	struct snap_reader *r;
	struct snap_info info = {0};
	uint8_t *buf = NULL;
	size_t got = 0, nread;
	int rc = snap_reader_open(path, &r, &info);

	if (rc)
		return rc;
	buf = malloc(info.data_bytes ? info.data_bytes : 1);
	if (!buf) {
		rc = -ENOMEM;
		goto out;
	}
	for (;;) {
		size_t cap = info.data_bytes - got;
		rc = snap_reader_read(r, buf + got, cap ? cap : 1, &nread);
		if (rc)
			goto out;
		if (!nread)
			break;
		got += nread;
		if (got > info.data_bytes) {
			rc = -EBADMSG;
			goto out;
		}
	}
	*data = buf;
	*len = got;
	buf = NULL;
out:
	free(buf);
	snap_reader_close(r);
	snap_info_close(&info);
	return rc;
}

/* Restart from the WAL and the newest usable snapshot. */
static int recover(struct meta_node *n)
{
	struct wal_recovery rec = {0};
	struct snap_info info = {0};
	struct raft_conf_state cs = {0};
	struct raft_entry *ents = NULL;
	uint8_t *data = NULL;
	size_t len = 0;
	int rc;

	if ((rc = read_member_file(n)))
		return rc;
	n->sm.member_id = n->id;
	if ((rc = open_wal(n, false, &rec)))
		return rc;
	rc = snap_load_newest(n->snap_dir, accept_snapshot, &rec, &info);
	if (rc) {
		log_error("no usable snapshot in %s for the WAL in %s: %s", n->snap_dir,
			  n->wal_dir, mc_strerror(rc));
		goto out;
	}
	if ((rc = wal_start_at(n->wal, &rec, info.index, info.term))) {
		log_error("cannot start the WAL at snapshot %" PRIu64 ": %s", info.index,
			  mc_strerror(rc));
		goto out;
	}
	if (info.index) {
		if ((rc = meta__snap_load(info.path, &data, &len)))
			goto out;
		if ((rc = meta__sm_restore(&n->sm, data, len))) {
			log_error("%s: cannot load the state machine: %s", info.path,
				  mc_strerror(rc));
			goto out;
		}
		meta__sync_members(n);
		if ((rc = meta__conf_parse(info.conf, info.conf_len, &cs))) {
			log_error("%s: bad membership in the header", info.path);
			goto out;
		}
	}
	rc = -ENOMEM;
	ents = calloc(rec.n_ents + 1, sizeof(*ents));
	if (!ents)
		goto out;
	for (size_t i = 0; i < rec.n_ents; i++) {
		ents[i].term = rec.ents[i].term;
		ents[i].index = rec.ents[i].index;
		ents[i].type = rec.ents[i].type == RAFT_ENTRY_CONF_CHANGE ? RAFT_ENTRY_CONF_CHANGE
									  : RAFT_ENTRY_NORMAL;
		ents[i].data = rec.ents[i].data;
		ents[i].len = rec.ents[i].len;
	}
	learn_peers(n, ents, rec.n_ents);
	struct raft_restore rs = {
		.hard_state = {rec.hs.term, rec.hs.vote, rec.hs.commit},
		.snapshot = {info.index, info.term, cs},
		.entries = ents,
		.n_entries = rec.n_ents,
		.applied = info.index,
	};
	if ((rc = open_raft(n, &rs)))
		goto out;
	n->applied = info.index;
	n->applied_term = info.term;
	n->snap_index = info.index;
	n->durable_index = rec.n_ents ? rec.ents[rec.n_ents - 1].index : info.index;
	n->term = rec.hs.term;
	n->commit = rec.hs.commit;
	log_info("recovered member %016" PRIx64 " of cluster %016" PRIx64
		 ": snapshot at %" PRIu64 ", %zu WAL entries, term %" PRIu64 ", commit %" PRIu64,
		 n->id, n->sm.cluster_id, info.index, rec.n_ents, rec.hs.term, rec.hs.commit);
	rc = 0;
out:
	free(ents);
	free(data);
	meta__conf_state_free(&cs);
	snap_info_close(&info);
	wal_recovery_close(&rec);
	return rc;
}

static int set_health(struct meta_node *n, enum rpc_health_status st)
{
	static const char *const client_svcs[] = {"etcdserverpb.KV", "etcdserverpb.Lease",
						  "etcdserverpb.Watch", "etcdserverpb.Cluster",
						  "etcdserverpb.Maintenance"};
	int rc = 0;
	for (size_t i = 0; n->o.client_health && i < MC_ARRAY_LEN(client_svcs) && !rc; i++)
		rc = rpc_health_set(n->o.client_health, client_svcs[i], st);
	if (!rc && n->o.peer_health)
		rc = rpc_health_set(n->o.peer_health, "mooncake.raft.Raft", st);
	return rc;
}

static void start_running(struct meta_node *n)
{
	struct raft_conf_state cs = raft_conf(n->raft);
	n->running = true;
	n->last_heard_ms = meta__now(n);
	/* Alone in the cluster: no one to wait for, lead at once. */
	if (cs.n_voters == 1 && cs.voters[0] == n->id)
		n->campaign = true;
	if (set_health(n, RPC_HEALTH_SERVING))
		log_warn("cannot set the services' health");
	update_metrics(n);
	meta__kick(n);
}

void meta__join_done(struct meta_node *n, int rc, const Mooncake__Meta__MembersResponse *resp)
{
	struct wal_recovery rec = {0};
	const char *my_url = n->self_peer_url;

	if (n->stopping || n->running)
		return;
	if (rc == 0) {
		rc = -ENOENT;
		for (size_t i = 0; i < resp->n_members; i++) {
			const Mooncake__Meta__Member *m = resp->members[i];
			if (m->n_peer_urls && strcmp(m->peer_urls[0], my_url) == 0) {
				n->id = m->id;
				n->sm.member_id = m->id;
				rc = 0;
			} else if (m->n_peer_urls && meta__peer_set(n, m->id, m->peer_urls[0])) {
				rc = -ENOMEM;
			}
		}
		n->sm.cluster_id = resp->cluster_id;
		if (rc == -ENOENT)
			log_warn("the cluster has no member with peer URL %s yet: add it with "
				 "`etcdctl member add %s --peer-urls=%s`; asking again",
				 my_url, n->name, my_url);
	}
	if (rc) {
		meta__peer_join_later(n);
		return;
	}
	if ((rc = write_member_file(n)) || (rc = open_wal(n, true, &rec))) {
		meta__fatal(n, rc, "cannot create this member's state");
		return;
	}
	wal_recovery_close(&rec);
	if ((rc = open_raft(n, NULL))) {
		meta__fatal(n, rc, "cannot start the Raft core");
		return;
	}
	log_info("joined cluster %016" PRIx64 " as member %016" PRIx64 " (%s)", n->sm.cluster_id,
		 n->id, n->name);
	start_running(n);
}

static int copy_opts(struct meta_node *n, const struct meta_options *o)
{
	n->o = *o;
	n->name = strdup(o->name ? o->name : "default");
	n->initial_cluster = strdup(o->initial_cluster ? o->initial_cluster : "");
	n->listen_peer = strdup(o->listen_peer ? o->listen_peer : "127.0.0.1:2380");
	n->listen_client = strdup(o->listen_client ? o->listen_client : "127.0.0.1:2379");
	n->dir = str_printf("%s/meta", o->data_dir ? o->data_dir : ".");
	if (!n->name || !n->initial_cluster || !n->listen_peer || !n->listen_client || !n->dir)
		return -ENOMEM;
	n->wal_dir = str_printf("%s/wal", n->dir);
	n->snap_dir = str_printf("%s/snap", n->dir);
	n->member_path = str_printf("%s/member", n->dir);
	if (!n->wal_dir || !n->snap_dir || !n->member_path)
		return -ENOMEM;
	const char *ap = o->advertise_peer && *o->advertise_peer ? o->advertise_peer
								 : n->listen_peer;
	const char *ac = o->advertise_client && *o->advertise_client ? o->advertise_client
								     : n->listen_client;
	n->self_peer_url = normalize_url(ap);
	n->self_client_url = normalize_url(ac);
	if (!n->self_peer_url || !n->self_client_url) {
		log_error("--advertise-peer/--listen-peer %s or --advertise-client/"
			  "--listen-client %s is not a numeric host:port",
			  ap, ac);
		return MC_ECONFIG;
	}
	n->o.name = n->name;
	n->o.initial_cluster = n->initial_cluster;
	n->o.listen_peer = n->listen_peer;
	n->o.listen_client = n->listen_client;
	n->o.advertise_peer = NULL;
	n->o.advertise_client = NULL;
	n->o.data_dir = NULL;
	if (!*n->name) {
		log_error("--name must not be empty");
		return MC_ECONFIG;
	}
	if (o->heartbeat_ms == 0 || o->election_ms < 2 * o->heartbeat_ms) {
		log_error("--election-timeout (%" PRIu64 " ms) must be at least twice "
			  "--heartbeat-interval (%" PRIu64 " ms)",
			  o->election_ms, o->heartbeat_ms);
		return MC_ECONFIG;
	}
	if (!o->snapshot_count || !o->max_request_bytes || !o->quota_bytes) {
		log_error("--snapshot-count, --max-request-bytes and --quota-bytes must be "
			  "positive");
		return MC_ECONFIG;
	}
	if (!n->o.progress_notify_ms)
		n->o.progress_notify_ms = 600000;
	/* etcd's request timeout: 5 s plus two election timeouts. */
	n->request_timeout_ms = 5000 + 2 * o->election_ms;
	return 0;
}

static void node_free_state(struct meta_node *n)
{
	while (n->qhead) {
		struct meta__qmsg *q = n->qhead;
		n->qhead = q->next;
		free(q);
	}
	if (n->recv_snap) {
		free(n->recv_snap->data);
		free(n->recv_snap);
	}
	meta__peer_free_all(n);
	if (n->watch)
		watch_registry_free(n->watch);
	meta__sm_free(&n->sm);
	raft_free(n->raft);
	wal_close(n->wal);
	free(n->went);
	free(n->unreachable);
	free(n->snap_reports);
	free(n->name);
	free(n->initial_cluster);
	free(n->listen_peer);
	free(n->listen_client);
	free(n->dir);
	free(n->wal_dir);
	free(n->snap_dir);
	free(n->member_path);
	free(n->self_peer_url);
	free(n->self_client_url);
	free(n);
}

int meta_node_new(uv_loop_t *loop, const struct meta_options *o, struct meta_node **out)
{
	struct meta_node *n = calloc(1, sizeof(*n));
	int rc;

	if (!n)
		return -ENOMEM;
	n->loop = loop;
	if ((rc = copy_opts(n, o)))
		goto fail;
	if ((rc = mc_mkdir_p(n->dir, 0750))) {
		log_error("cannot create %s: %s", n->dir, mc_strerror(rc));
		goto fail;
	}
	register_metrics(n);
	/* etcd's minimum lease TTL: 1.5 election timeouts, in whole seconds. */
	struct mvcc_options mo = {.min_lease_ttl_s =
					  (int64_t)((n->o.election_ms * 3 / 2 + 999) / 1000)};
	if ((rc = meta__sm_init(&n->sm, &mo)))
		goto fail;
	bool join = false;
	if (wal_exists(n->wal_dir)) {
		rc = recover(n);
	} else if (!o->join_existing) {
		rc = found(n);
	} else {
		struct founder *f = NULL;
		size_t k = 0;
		rc = parse_initial_cluster(n, &f, &k);
		founders_free(f, k);
		join = true;
		log_info("joining an existing cluster through the members in "
			 "--initial-cluster");
	}
	if (rc)
		goto fail;
	if ((rc = watch_registry_new(n->sm.store, 0, &n->watch)))
		goto fail;
	if ((rc = meta__svc_add(n)) || (rc = meta__watch_service_add(n)) ||
	    (rc = meta__peer_service_add(n))) {
		log_error("cannot register the meta services: %s", mc_strerror(rc));
		goto fail;
	}
	/* Nothing below fails but the worker; handles come last. */
	if ((rc = meta__worker_new(loop, &n->disk))) {
		log_error("cannot start the disk thread: %s", mc_strerror(rc));
		goto fail;
	}
	uv_timer_init(loop, &n->tick_timer);
	uv_idle_init(loop, &n->kick);
	uv_timer_init(loop, &n->progress_timer);
	uv_timer_init(loop, &n->sync_timer);
	uv_timer_init(loop, &n->join_timer);
	uv_timer_init(loop, &n->stop_timer);
	n->handles_open = true;
	uv_timer_start(&n->tick_timer, on_tick, n->o.heartbeat_ms, n->o.heartbeat_ms);
	meta__watch_start_timers(n);
	if (join) {
		meta__peer_join(n);
	} else {
		start_running(n);
	}
	*out = n;
	return 0;
fail:
	node_free_state(n);
	return rc;
}

/* ------------------------------------------------------------- stop */

static void on_handle_closed(uv_handle_t *h)
{
	struct meta_node *n = h->data;
	if (--n->closing_handles == 0 && n->on_stopped) {
		void (*cb)(void *) = n->on_stopped;
		n->on_stopped = NULL;
		cb(n->stopped_ud);
	}
}

static void close_handle(struct meta_node *n, uv_handle_t *h)
{
	h->data = n;
	n->closing_handles++;
	uv_close(h, on_handle_closed);
}

/* Everything ended but the disk work in flight: once that completes,
 * close the handles; on_stopped runs when they are closed. */
void meta__check_stopped(struct meta_node *n)
{
	if (!n->finishing || !n->handles_open)
		return;
	if (n->disk_jobs || n->uv_works || (n->in_ready && !n->fatal))
		return;
	n->handles_open = false;
	meta__worker_close(n->disk);
	close_handle(n, (uv_handle_t *)&n->tick_timer);
	close_handle(n, (uv_handle_t *)&n->kick);
	close_handle(n, (uv_handle_t *)&n->progress_timer);
	close_handle(n, (uv_handle_t *)&n->sync_timer);
	close_handle(n, (uv_handle_t *)&n->join_timer);
	close_handle(n, (uv_handle_t *)&n->stop_timer);
}

static void finish_stop(struct meta_node *n)
{
	if (n->finishing)
		return;
	uv_timer_stop(&n->stop_timer);
	n->finishing = true;
	fail_list(&n->propq, META_ESTOPPED);
	fail_list(&n->waiters, META_ESTOPPED);
	fail_list(&n->wait_leader, META_ESTOPPED);
	fail_list(&n->retry, META_ESTOPPED);
	fail_list(&n->reads, META_ESTOPPED);
	fail_list(&n->round, META_ESTOPPED);
	fail_list(&n->read_wait, META_ESTOPPED);
	fail_list(&n->moving, META_ESTOPPED);
	meta__watch_close_streams(n);
	meta__svc_close_streams(n);
	meta__peer_close_all(n);
	if (set_health(n, RPC_HEALTH_NOT_SERVING))
		log_warn("cannot set the services' health");
	meta__check_stopped(n);
}

static void on_stop_timeout(uv_timer_t *t)
{
	struct meta_node *n = MC_CONTAINER_OF(t, struct meta_node, stop_timer);
	log_warn("leadership transfer did not finish within the election timeout; "
		 "stopping anyway");
	finish_stop(n);
}

void meta_node_stop(struct meta_node *n, void (*on_done)(void *ud), void *ud)
{
	if (n->stopping)
		return;
	n->on_stopped = on_done;
	n->stopped_ud = ud;
	if (meta__is_leader(n) && !n->fatal) {
		struct raft_status st;
		struct raft_peer_status ps[64];
		size_t k = raft_status(n->raft, &st, ps, MC_ARRAY_LEN(ps));
		uint64_t best = 0, best_match = 0;
		for (size_t i = 0; i < k && i < MC_ARRAY_LEN(ps); i++)
			if (ps[i].id != n->id && !ps[i].learner && ps[i].recent_active &&
			    (!best || ps[i].match > best_match)) {
				best = ps[i].id;
				best_match = ps[i].match;
			}
		if (best) {
			log_info("stopping: handing leadership to %016" PRIx64, best);
			n->transfer_to = best;
			n->stopping = true;
			uv_timer_start(&n->stop_timer, on_stop_timeout, n->o.election_ms, 0);
			meta__kick(n);
			return;
		}
	}
	n->stopping = true;
	finish_stop(n);
}

void meta_node_free(struct meta_node *n)
{
	if (!n)
		return;
	meta__worker_free(n->disk);
	node_free_state(n);
}
