/*
 * sm: the meta node's state machine — what a committed entry does, on
 * every member alike: KV writes, compaction, lease grants and revokes go
 * to the MVCC store and its lease table (mvcc.h, lease.h); membership
 * changes, published member attributes and alarms go to the member and
 * alarm tables kept here. Applying is deterministic: the same entries in
 * the same order give the same state and the same answers everywhere, so
 * a failure that would make one member differ (out of memory, an entry
 * that does not decode) is fatal.
 *
 * Also here: serving reads from the applied state, the leader-local lease
 * calls, and the snapshot of the whole state:
 *
 *   u32 header length (little-endian) | mooncake.meta.SnapshotHeader |
 *   the MVCC store's snapshot (mvcc.h)
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "common/log.h"
#include "common/util.h"
#include "meta/meta_int.h"

#define LOG_SUBSYS LOGS_META

/* Tags of mooncake.meta.Request's oneof fields that compare with etcd
 * messages (the request is the wrapped etcd message as is). */

/* ------------------------------------------------------------- replies */

void meta__reply_free(struct meta__reply *r)
{
	if (!r)
		return;
	if (r->has_mres)
		mvcc_result_free(&r->mres);
	meta__arena_free(&r->arena);
	memset(r, 0, sizeof(*r));
}

Etcdserverpb__ResponseHeader *meta__header(struct meta_node *n, struct meta__arena *a)
{
	Etcdserverpb__ResponseHeader *h = meta__alloc(a, sizeof(*h));
	if (!h)
		return NULL;
	etcdserverpb__response_header__init(h);
	h->cluster_id = n->cluster_id;
	h->member_id = n->id;
	h->revision = n->store ? mvcc_rev(n->store) : 0;
	h->raft_term = n->term;
	return h;
}

/* ------------------------------------------------------------- members */

const struct meta__member *meta__member_find(const struct meta_node *n, uint64_t id)
{
	for (size_t i = 0; i < n->n_members; i++)
		if (n->members[i].id == id)
			return &n->members[i];
	return NULL;
}

bool meta__is_removed(const struct meta_node *n, uint64_t id)
{
	for (size_t i = 0; i < n->n_removed; i++)
		if (n->removed[i] == id)
			return true;
	return false;
}

static void member_clear(struct meta__member *m)
{
	free(m->name);
	free(m->peer_url);
	free(m->client_url);
	memset(m, 0, sizeof(*m));
}

static void members_free(struct meta__member *v, size_t n)
{
	for (size_t i = 0; v && i < n; i++)
		member_clear(&v[i]);
	free(v);
}

static int set_str(char **dst, const char *src)
{
	char *s = strdup(src ? src : "");
	if (!s)
		return -ENOMEM;
	free(*dst);
	*dst = s;
	return 0;
}

/* Insert or update a member (kept sorted by ID). */
static int member_put(struct meta_node *n, uint64_t id, const char *name,
		      const char *peer_url, const char *client_url, bool learner)
{
	struct meta__member *m = (struct meta__member *)meta__member_find(n, id);
	int rc;

	if (!m) {
		struct meta__member *v = realloc(n->members, (n->n_members + 1) * sizeof(*v));
		if (!v)
			return -ENOMEM;
		n->members = v;
		size_t at = 0;
		while (at < n->n_members && v[at].id < id)
			at++;
		memmove(&v[at + 1], &v[at], (n->n_members - at) * sizeof(*v));
		memset(&v[at], 0, sizeof(*v));
		n->n_members++;
		m = &v[at];
		m->id = id;
		if ((rc = set_str(&m->name, "")) || (rc = set_str(&m->peer_url, "")) ||
		    (rc = set_str(&m->client_url, "")))
			return rc;
	}
	if (name && (rc = set_str(&m->name, name)))
		return rc;
	if (peer_url && (rc = set_str(&m->peer_url, peer_url)))
		return rc;
	if (client_url && (rc = set_str(&m->client_url, client_url)))
		return rc;
	m->learner = learner;
	return 0;
}

static void member_del(struct meta_node *n, uint64_t id)
{
	for (size_t i = 0; i < n->n_members; i++) {
		if (n->members[i].id != id)
			continue;
		member_clear(&n->members[i]);
		memmove(&n->members[i], &n->members[i + 1],
			(n->n_members - i - 1) * sizeof(*n->members));
		n->n_members--;
		return;
	}
}

static int removed_add(struct meta_node *n, uint64_t id)
{
	if (meta__is_removed(n, id))
		return 0;
	uint64_t *v = realloc(n->removed, (n->n_removed + 1) * sizeof(*v));
	if (!v)
		return -ENOMEM;
	v[n->n_removed++] = id;
	n->removed = v;
	return 0;
}

Etcdserverpb__Member **meta__members_pb(const struct meta_node *n,
					struct meta__arena *a, size_t *count)
{
	size_t k = n->n_members;
	Etcdserverpb__Member **v = meta__alloc(a, (k ? k : 1) * sizeof(*v));
	Etcdserverpb__Member *blk = meta__alloc(a, (k ? k : 1) * sizeof(*blk));
	if (!v || !blk)
		return NULL;
	for (size_t i = 0; i < k; i++) {
		const struct meta__member *m = &n->members[i];
		Etcdserverpb__Member *p = &blk[i];
		etcdserverpb__member__init(p);
		p->id = m->id;
		p->name = m->name;
		p->islearner = m->learner;
		if (*m->peer_url) {
			p->peerurls = meta__alloc(a, sizeof(char *));
			if (!p->peerurls)
				return NULL;
			p->peerurls[0] = m->peer_url;
			p->n_peerurls = 1;
		}
		if (*m->client_url) {
			p->clienturls = meta__alloc(a, sizeof(char *));
			if (!p->clienturls)
				return NULL;
			p->clienturls[0] = m->client_url;
			p->n_clienturls = 1;
		}
		v[i] = p;
	}
	*count = k;
	return v;
}

/*
 * A reply of the etcd responses made of a header (field 1) and the member
 * list (the repeated Member field named "members"): MemberList, Remove,
 * Promote, Update and Add (whose `member` the caller sets). Returns the
 * message, or NULL with r->code set when out of memory.
 */
static ProtobufCMessage *members_reply(struct meta_node *n, struct meta__reply *r,
				       const ProtobufCMessageDescriptor *d)
{
	const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field_by_name(d, "members");
	ProtobufCMessage *p = meta__alloc(&r->arena, d->sizeof_message);
	Etcdserverpb__ResponseHeader *h = meta__header(n, &r->arena);
	size_t k = 0;
	Etcdserverpb__Member **ms = meta__members_pb(n, &r->arena, &k);

	if (!p || !h || !ms || !f) {
		r->code = -ENOMEM;
		return NULL;
	}
	protobuf_c_message_init(d, p);
	*(Etcdserverpb__ResponseHeader **)((char *)p + d->fields[0].offset) = h;
	*(Etcdserverpb__Member ***)((char *)p + f->offset) = ms;
	*(size_t *)((char *)p + f->quantifier_offset) = k;
	r->resp = p;
	return p;
}

int meta__conf_bytes(const struct meta_node *n, uint8_t **out, size_t *len)
{
	uint64_t *voters = calloc(n->n_members + 1, sizeof(uint64_t));
	uint64_t *learners = calloc(n->n_members + 1, sizeof(uint64_t));
	Mooncake__Raft__ConfState cs = MOONCAKE__RAFT__CONF_STATE__INIT;
	int rc = -ENOMEM;

	if (!voters || !learners)
		goto out;
	for (size_t i = 0; i < n->n_members; i++) {
		if (n->members[i].learner)
			learners[cs.n_learners++] = n->members[i].id;
		else
			voters[cs.n_voters++] = n->members[i].id;
	}
	cs.voters = voters;
	cs.learners = learners;
	*len = mooncake__raft__conf_state__get_packed_size(&cs);
	*out = malloc(*len ? *len : 1);
	if (!*out)
		goto out;
	mooncake__raft__conf_state__pack(&cs, *out);
	rc = 0;
out:
	free(voters);
	free(learners);
	return rc;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

int meta__conf_parse(const uint8_t *data, size_t len, struct raft_conf_state *out)
{
	Mooncake__Raft__ConfState *cs = mooncake__raft__conf_state__unpack(NULL, len, data);
	uint64_t *v = NULL, *l = NULL;

	memset(out, 0, sizeof(*out));
	if (!cs)
		return -EBADMSG;
	v = malloc((cs->n_voters + 1) * sizeof(*v));
	l = malloc((cs->n_learners + 1) * sizeof(*l));
	if (!v || !l) {
		free(v);
		free(l);
		mooncake__raft__conf_state__free_unpacked(cs, NULL);
		return -ENOMEM;
	}
	if (cs->n_voters)
		memcpy(v, cs->voters, cs->n_voters * sizeof(*v));
	if (cs->n_learners)
		memcpy(l, cs->learners, cs->n_learners * sizeof(*l));
	qsort(v, cs->n_voters, sizeof(*v), cmp_u64);
	qsort(l, cs->n_learners, sizeof(*l), cmp_u64);
	out->voters = v;
	out->n_voters = cs->n_voters;
	out->learners = l;
	out->n_learners = cs->n_learners;
	mooncake__raft__conf_state__free_unpacked(cs, NULL);
	return 0;
}

void meta__conf_state_free(struct raft_conf_state *cs)
{
	free((void *)cs->voters);
	free((void *)cs->learners);
	memset(cs, 0, sizeof(*cs));
}

/* ------------------------------------------------------------- alarms */

bool meta__alarm_active(const struct meta_node *n, int alarm)
{
	for (size_t i = 0; i < n->n_alarms; i++)
		if ((int)n->alarms[i].alarm == alarm)
			return true;
	return false;
}

bool meta__over_quota(const struct meta_node *n, enum meta__method m, size_t req_len)
{
	(void)m;
	if (meta__alarm_active(n, ETCDSERVERPB__ALARM_TYPE__NOSPACE))
		return true;
	uint64_t size = mvcc_db_size_bytes(n->store);
	return size + req_len + MVCC_VERSION_OVERHEAD_BYTES > n->o.quota_bytes;
}

static Etcdserverpb__AlarmMember **alarms_pb(const Etcdserverpb__AlarmMember *src, size_t k,
					     struct meta__arena *a)
{
	Etcdserverpb__AlarmMember **v = meta__alloc(a, (k ? k : 1) * sizeof(*v));
	Etcdserverpb__AlarmMember *blk = meta__alloc(a, (k ? k : 1) * sizeof(*blk));
	if (!v || !blk)
		return NULL;
	for (size_t i = 0; i < k; i++) {
		etcdserverpb__alarm_member__init(&blk[i]);
		blk[i].memberid = src[i].memberid;
		blk[i].alarm = src[i].alarm;
		v[i] = &blk[i];
	}
	return v;
}

/* Apply an AlarmRequest (ACTIVATE or DEACTIVATE); the response lists the
 * alarms that changed, like etcd's. */
static int apply_alarm(struct meta_node *n, const Etcdserverpb__AlarmRequest *q,
		       struct meta__reply *r)
{
	Etcdserverpb__AlarmMember changed[8];
	size_t n_changed = 0;

	if (q->action == ETCDSERVERPB__ALARM_REQUEST__ALARM_ACTION__ACTIVATE) {
		bool have = false;
		for (size_t i = 0; i < n->n_alarms; i++)
			have |= n->alarms[i].memberid == q->memberid &&
				n->alarms[i].alarm == q->alarm;
		if (!have && q->alarm != ETCDSERVERPB__ALARM_TYPE__NONE) {
			Etcdserverpb__AlarmMember *v =
				realloc(n->alarms, (n->n_alarms + 1) * sizeof(*v));
			if (!v)
				return -ENOMEM;
			n->alarms = v;
			etcdserverpb__alarm_member__init(&v[n->n_alarms]);
			v[n->n_alarms].memberid = q->memberid;
			v[n->n_alarms].alarm = q->alarm;
			n->n_alarms++;
			log_warn("alarm %s raised for member %016llx",
				 q->alarm == ETCDSERVERPB__ALARM_TYPE__NOSPACE ? "NOSPACE"
									   : "CORRUPT",
				 (unsigned long long)q->memberid);
		}
		if (q->alarm != ETCDSERVERPB__ALARM_TYPE__NONE) {
			etcdserverpb__alarm_member__init(&changed[0]);
			changed[0].memberid = q->memberid;
			changed[0].alarm = q->alarm;
			n_changed = 1;
		}
	} else if (q->action == ETCDSERVERPB__ALARM_REQUEST__ALARM_ACTION__DEACTIVATE) {
		for (size_t i = 0; i < n->n_alarms;) {
			Etcdserverpb__AlarmMember *am = &n->alarms[i];
			bool match = (q->memberid == 0 || am->memberid == q->memberid) &&
				     (q->alarm == ETCDSERVERPB__ALARM_TYPE__NONE ||
				      am->alarm == q->alarm);
			if (!match) {
				i++;
				continue;
			}
			if (n_changed < MC_ARRAY_LEN(changed))
				changed[n_changed++] = *am;
			log_info("alarm %s cleared for member %016llx",
				 am->alarm == ETCDSERVERPB__ALARM_TYPE__NOSPACE ? "NOSPACE"
										: "CORRUPT",
				 (unsigned long long)am->memberid);
			memmove(am, am + 1, (n->n_alarms - i - 1) * sizeof(*am));
			n->n_alarms--;
		}
	}
	if (!r)
		return 0;
	Etcdserverpb__AlarmResponse *p = meta__alloc(&r->arena, sizeof(*p));
	if (!p)
		goto nomem;
	etcdserverpb__alarm_response__init(p);
	if (!(p->header = meta__header(n, &r->arena)) ||
	    !(p->alarms = alarms_pb(changed, n_changed, &r->arena)))
		goto nomem;
	p->n_alarms = n_changed;
	r->resp = &p->base;
	return 0;
nomem:
	r->code = -ENOMEM;
	return 0;
}

/* ------------------------------------------------------------- apply */

static int kv_reply(struct meta_node *n, struct mvcc_op *op, struct meta__reply *r)
{
	struct mvcc_result res;
	int rc = mvcc_apply(n->store, op, &res);

	if (rc == -ENOMEM)
		return rc; /* the store is unchanged here and changed elsewhere */
	if (rc) {
		if (r)
			r->code = rc;
		return 0;
	}
	if (!r) {
		mvcc_result_free(&res);
		return 0;
	}
	r->mres = res;
	r->has_mres = true;
	Etcdserverpb__ResponseHeader *h = meta__header(n, &r->arena);
	if (h)
		h->revision = res.revision;
	if (!h || !(r->resp = meta__resp_pb(&r->mres.resp, h, &r->arena)))
		r->code = -ENOMEM;
	return 0;
}

/* A reply holding only a header (CompactionResponse, LeaseRevokeResponse). */
static void header_reply(struct meta_node *n, const ProtobufCMessageDescriptor *d,
			 struct meta__reply *r, int64_t revision)
{
	ProtobufCMessage *p;
	Etcdserverpb__ResponseHeader *h;

	if (!r)
		return;
	p = meta__alloc(&r->arena, d->sizeof_message);
	h = meta__header(n, &r->arena);
	if (!p || !h) {
		r->code = -ENOMEM;
		return;
	}
	protobuf_c_message_init(d, p);
	if (revision)
		h->revision = revision;
	/* Every header-only etcd response has the header as field 1, the
	 * first member after base. */
	*(Etcdserverpb__ResponseHeader **)((char *)p + d->fields[0].offset) = h;
	r->resp = p;
}

static int apply_request(struct meta_node *n, const Mooncake__Meta__Request *q,
			 struct meta__reply *r)
{
	struct meta__arena tmp = {0};
	struct mvcc_op op;
	int rc = 0;
	bool capped = meta__alarm_active(n, ETCDSERVERPB__ALARM_TYPE__NOSPACE);

	switch (q->req_case) {
	case MOONCAKE__META__REQUEST__REQ_PUT:
		if (capped) {
			if (r)
				r->code = META_ENOSPACE;
			return 0;
		}
		meta__op_from_put(q->put, &op);
		return kv_reply(n, &op, r);
	case MOONCAKE__META__REQUEST__REQ_DELETE_RANGE:
		meta__op_from_delete(q->delete_range, &op);
		return kv_reply(n, &op, r);
	case MOONCAKE__META__REQUEST__REQ_TXN:
		if (capped && meta__txn_writes(q->txn, true)) {
			if (r)
				r->code = META_ENOSPACE;
			return 0;
		}
		rc = meta__op_from_txn(q->txn, &op, &tmp);
		if (rc == 0)
			rc = kv_reply(n, &op, r);
		meta__arena_free(&tmp);
		return rc;
	case MOONCAKE__META__REQUEST__REQ_COMPACTION:
		rc = mvcc_compact(n->store, q->compaction->revision);
		if (rc == -ENOMEM)
			return rc;
		if (rc) {
			if (r)
				r->code = rc;
			return 0;
		}
		log_info("compacted the store at revision %lld",
			 (long long)q->compaction->revision);
		header_reply(n, &etcdserverpb__compaction_response__descriptor, r, 0);
		return 0;
	case MOONCAKE__META__REQUEST__REQ_LEASE_GRANT: {
		int64_t id = 0, ttl = 0;
		if (capped) {
			if (r)
				r->code = META_ENOSPACE;
			return 0;
		}
		rc = lease_grant(mvcc_leases(n->store), q->lease_grant->id,
				 q->lease_grant->ttl, meta__now(n), &id, &ttl);
		if (rc == -ENOMEM)
			return rc;
		if (!r)
			return 0;
		if (rc) {
			r->code = rc;
			return 0;
		}
		Etcdserverpb__LeaseGrantResponse *p = meta__alloc(&r->arena, sizeof(*p));
		Etcdserverpb__ResponseHeader *h = meta__header(n, &r->arena);
		if (!p || !h) {
			r->code = -ENOMEM;
			return 0;
		}
		etcdserverpb__lease_grant_response__init(p);
		p->header = h;
		p->id = id;
		p->ttl = ttl;
		r->resp = &p->base;
		return 0;
	}
	case MOONCAKE__META__REQUEST__REQ_LEASE_REVOKE: {
		int64_t rev = 0;
		rc = mvcc_lease_revoke(n->store, q->lease_revoke->id, &rev);
		if (rc == -ENOMEM)
			return rc;
		if (rc) {
			if (r)
				r->code = rc;
			return 0;
		}
		header_reply(n, &etcdserverpb__lease_revoke_response__descriptor, r, rev);
		return 0;
	}
	case MOONCAKE__META__REQUEST__REQ_LEASE_CHECKPOINT:
		lease_checkpoint(mvcc_leases(n->store), q->lease_checkpoint->id,
				 q->lease_checkpoint->remaining_ttl);
		return 0;
	case MOONCAKE__META__REQUEST__REQ_ALARM:
		return apply_alarm(n, q->alarm, r);
	case MOONCAKE__META__REQUEST__REQ_MEMBER_ATTRIBUTES: {
		const Mooncake__Meta__MemberAttributes *at = q->member_attributes;
		const struct meta__member *m = meta__member_find(n, at->id);
		if (!m)
			return 0; /* removed meanwhile */
		rc = member_put(n, at->id, at->name,
				NULL, at->n_client_urls ? at->client_urls[0] : "",
				m->learner);
		if (rc)
			return rc;
		if (at->id == n->id)
			n->published = strcmp(at->name, n->name) == 0 && at->n_client_urls &&
					strcmp(at->client_urls[0], n->self_client_url) == 0;
		log_info("member %016llx published name %s, client URL %s",
			 (unsigned long long)at->id, at->name,
			 at->n_client_urls ? at->client_urls[0] : "(none)");
		if (r)
			members_reply(n, r, &etcdserverpb__member_update_response__descriptor);
		return 0;
	}
	case MOONCAKE__META__REQUEST__REQ_MEMBER_UPDATE: {
		const Etcdserverpb__MemberUpdateRequest *u = q->member_update;
		const struct meta__member *m = meta__member_find(n, u->id);
		if (!m) {
			if (r)
				r->code = META_EMEMBER_NOT_FOUND;
			return 0;
		}
		if (u->n_peerurls) {
			if ((rc = member_put(n, u->id, NULL, u->peerurls[0], NULL, m->learner)))
				return rc;
			if (u->id != n->id && meta__peer_set(n, u->id, u->peerurls[0]))
				log_warn("member %016llx: cannot use peer URL %s",
					 (unsigned long long)u->id, u->peerurls[0]);
		}
		if (r)
			members_reply(n, r, &etcdserverpb__member_update_response__descriptor);
		return 0;
	}
	default:
		return -EBADMSG;
	}
}

static int apply_conf(struct meta_node *n, const struct raft_entry *e,
		      struct meta__reply *r)
{
	struct raft_conf_change cc;
	Mooncake__Meta__ConfContext *ctx = NULL;
	const Mooncake__Meta__Member *pm = NULL;
	int rc;

	if (raft_conf_change_decode(e->data, e->len, &cc))
		return -EBADMSG;
	if (cc.context_len) {
		ctx = mooncake__meta__conf_context__unpack(NULL, cc.context_len, cc.context);
		if (!ctx)
			return -EBADMSG;
		pm = ctx->member;
	}
	switch (cc.type) {
	case RAFT_CC_ADD_VOTER:
	case RAFT_CC_ADD_LEARNER:
		rc = member_put(n, cc.node_id, pm ? pm->name : NULL,
				pm && pm->n_peer_urls ? pm->peer_urls[0] : NULL,
				pm && pm->n_client_urls ? pm->client_urls[0] : NULL,
				cc.type == RAFT_CC_ADD_LEARNER);
		if (rc)
			goto out;
		log_info("member %016llx (%s) added as a %s", (unsigned long long)cc.node_id,
			 pm && pm->n_peer_urls ? pm->peer_urls[0] : "no peer URL",
			 cc.type == RAFT_CC_ADD_LEARNER ? "learner" : "voter");
		if (cc.node_id != n->id && pm && pm->n_peer_urls &&
		    meta__peer_set(n, cc.node_id, pm->peer_urls[0]))
			log_warn("member %016llx: cannot use peer URL %s",
				 (unsigned long long)cc.node_id, pm->peer_urls[0]);
		break;
	case RAFT_CC_PROMOTE: {
		const struct meta__member *m = meta__member_find(n, cc.node_id);
		if (m) {
			((struct meta__member *)m)->learner = false;
			log_info("member %016llx promoted to voter", (unsigned long long)cc.node_id);
		}
		rc = 0;
		break;
	}
	case RAFT_CC_REMOVE:
		member_del(n, cc.node_id);
		rc = removed_add(n, cc.node_id);
		if (rc)
			goto out;
		log_info("member %016llx removed", (unsigned long long)cc.node_id);
		break;
	default:
		rc = -EBADMSG;
		goto out;
	}
	if (r) {
		if (cc.type == RAFT_CC_ADD_VOTER || cc.type == RAFT_CC_ADD_LEARNER) {
			Etcdserverpb__MemberAddResponse *p = (void *)members_reply(
				n, r, &etcdserverpb__member_add_response__descriptor);
			for (size_t i = 0; p && i < p->n_members; i++)
				if (p->members[i]->id == cc.node_id)
					p->member = p->members[i];
		} else if (cc.type == RAFT_CC_PROMOTE) {
			members_reply(n, r, &etcdserverpb__member_promote_response__descriptor);
		} else {
			members_reply(n, r, &etcdserverpb__member_remove_response__descriptor);
		}
	}
	rc = 0;
out:
	if (ctx)
		mooncake__meta__conf_context__free_unpacked(ctx, NULL);
	return rc;
}

int meta__apply_entry(struct meta_node *n, const struct raft_entry *e,
		      struct meta__reply *r)
{
	Mooncake__Meta__Request *q;
	int rc;

	if (e->type == RAFT_ENTRY_CONF_CHANGE)
		return apply_conf(n, e, r);
	if (e->len == 0)
		return 0; /* a new leader's empty entry */
	q = mooncake__meta__request__unpack(NULL, e->len, e->data);
	if (!q)
		return -EBADMSG;
	rc = apply_request(n, q, r);
	mooncake__meta__request__free_unpacked(q, NULL);
	return rc;
}

/* ------------------------------------------------------------- reads */

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
	p->dbsize = (int64_t)mvcc_db_size_bytes(n->store);
	p->dbsizeinuse = p->dbsize;
	p->leader = n->leader;
	p->raftindex = n->commit;
	p->raftterm = n->term;
	p->raftappliedindex = n->applied;
	const struct meta__member *me = meta__member_find(n, n->id);
	p->islearner = me && me->learner;
	if (n->n_alarms) {
		p->errors = meta__alloc(&r->arena, n->n_alarms * sizeof(char *));
		if (!p->errors)
			return -ENOMEM;
		for (size_t i = 0; i < n->n_alarms; i++) {
			char *s = meta__alloc(&r->arena, 64);
			if (!s)
				return -ENOMEM;
			snprintf(s, 64, "memberID:%llu alarm:%s ",
				 (unsigned long long)n->alarms[i].memberid,
				 n->alarms[i].alarm == ETCDSERVERPB__ALARM_TYPE__NOSPACE
					 ? "NOSPACE"
					 : "CORRUPT");
			p->errors[i] = s;
		}
		p->n_errors = n->n_alarms;
	}
	r->resp = &p->base;
	return 0;
}

static int serve_leases(struct meta_node *n, struct meta__reply *r)
{
	int64_t *ids = NULL;
	size_t k = 0;
	int rc = lease_list(mvcc_leases(n->store), &ids, &k);
	if (rc)
		return rc;
	Etcdserverpb__LeaseLeasesResponse *p = meta__alloc(&r->arena, sizeof(*p));
	Etcdserverpb__LeaseStatus **v = meta__alloc(&r->arena, (k ? k : 1) * sizeof(*v));
	Etcdserverpb__LeaseStatus *blk = meta__alloc(&r->arena, (k ? k : 1) * sizeof(*blk));
	rc = -ENOMEM;
	if (!p || !v || !blk)
		goto out;
	etcdserverpb__lease_leases_response__init(p);
	if (!(p->header = meta__header(n, &r->arena)))
		goto out;
	for (size_t i = 0; i < k; i++) {
		etcdserverpb__lease_status__init(&blk[i]);
		blk[i].id = ids[i];
		v[i] = &blk[i];
	}
	p->leases = v;
	p->n_leases = k;
	r->resp = &p->base;
	rc = 0;
out:
	free(ids);
	return rc;
}

int meta__serve_read(struct meta_node *n, struct meta__op *op, struct meta__reply *r)
{
	const ProtobufCMessageDescriptor *d = meta__methods[op->method].req;
	ProtobufCMessage *req = protobuf_c_message_unpack(d, NULL, op->req_len, op->req);
	struct mvcc_op mop;
	int rc = 0;

	if (!req) {
		r->code = -EINVAL;
		return 0;
	}
	switch (op->method) {
	case META_M_RANGE:
		meta__op_from_range((Etcdserverpb__RangeRequest *)req, &mop);
		rc = kv_reply(n, &mop, r);
		break;
	case META_M_TXN: {
		struct meta__arena tmp = {0};
		rc = meta__op_from_txn((Etcdserverpb__TxnRequest *)req, &mop, &tmp);
		if (rc == 0)
			rc = kv_reply(n, &mop, r);
		meta__arena_free(&tmp);
		break;
	}
	case META_M_LEASE_LEASES:
		rc = serve_leases(n, r);
		break;
	case META_M_STATUS:
		rc = serve_status(n, r);
		break;
	case META_M_MEMBER_LIST:
		members_reply(n, r, &etcdserverpb__member_list_response__descriptor);
		break;
	case META_M_ALARM: {
		Etcdserverpb__AlarmResponse *p = meta__alloc(&r->arena, sizeof(*p));
		rc = -ENOMEM;
		if (!p)
			break;
		etcdserverpb__alarm_response__init(p);
		if (!(p->header = meta__header(n, &r->arena)) ||
		    !(p->alarms = alarms_pb(n->alarms, n->n_alarms, &r->arena)))
			break;
		p->n_alarms = n->n_alarms;
		r->resp = &p->base;
		rc = 0;
		break;
	}
	default:
		r->code = -EINVAL;
		break;
	}
	protobuf_c_message_free_unpacked(req, NULL);
	if (rc == -ENOMEM) {
		r->code = -ENOMEM;
		rc = 0;
	}
	return rc;
}

int meta__serve_leader(struct meta_node *n, struct meta__op *op, struct meta__reply *r)
{
	const ProtobufCMessageDescriptor *d = meta__methods[op->method].req;
	ProtobufCMessage *req = protobuf_c_message_unpack(d, NULL, op->req_len, op->req);
	struct lease_table *lt = mvcc_leases(n->store);
	int rc = 0;

	if (!req) {
		r->code = -EINVAL;
		return 0;
	}
	if (op->method == META_M_LEASE_KEEPALIVE) {
		const Etcdserverpb__LeaseKeepAliveRequest *q = (void *)req;
		int64_t ttl = 0;
		bool clear = false;
		rc = lease_renew(lt, q->id, meta__now(n), &ttl, &clear);
		if (rc == MVCC_ELEASE_NOT_FOUND) {
			ttl = 0;
			rc = 0;
		}
		if (rc == 0) {
			Etcdserverpb__LeaseKeepAliveResponse *p = meta__alloc(&r->arena, sizeof(*p));
			Etcdserverpb__ResponseHeader *h = meta__header(n, &r->arena);
			if (p && h) {
				etcdserverpb__lease_keep_alive_response__init(p);
				p->header = h;
				p->id = q->id;
				p->ttl = ttl;
				r->resp = &p->base;
			} else {
				r->code = -ENOMEM;
			}
		}
	} else if (op->method == META_M_LEASE_TTL) {
		const Etcdserverpb__LeaseTimeToLiveRequest *q = (void *)req;
		struct lease_ttl t;
		Etcdserverpb__LeaseTimeToLiveResponse *p = meta__alloc(&r->arena, sizeof(*p));
		Etcdserverpb__ResponseHeader *h = meta__header(n, &r->arena);
		if (!p || !h) {
			r->code = -ENOMEM;
			goto out;
		}
		etcdserverpb__lease_time_to_live_response__init(p);
		p->header = h;
		p->id = q->id;
		rc = lease_time_to_live(lt, q->id, meta__now(n), q->keys, &t);
		if (rc == MVCC_ELEASE_NOT_FOUND) {
			p->ttl = -1; /* etcd answers an unknown lease so */
			r->resp = &p->base;
			rc = 0;
			goto out;
		}
		if (rc) {
			r->code = rc;
			rc = 0;
			goto out;
		}
		p->ttl = t.ttl_s;
		p->grantedttl = t.granted_ttl_s;
		if (t.keys && t.nkeys) {
			p->keys = meta__alloc(&r->arena, t.nkeys * sizeof(*p->keys));
			if (!p->keys) {
				lease_ttl_free(&t);
				r->code = -ENOMEM;
				goto out;
			}
			for (size_t i = 0; i < t.nkeys; i++) {
				char *k = meta__alloc(&r->arena, t.keys[i].len + 1);
				if (!k) {
					lease_ttl_free(&t);
					r->code = -ENOMEM;
					goto out;
				}
				if (t.keys[i].len)
					memcpy(k, t.keys[i].key, t.keys[i].len);
				p->keys[i].data = (uint8_t *)k;
				p->keys[i].len = t.keys[i].len;
			}
			p->n_keys = t.nkeys;
		}
		lease_ttl_free(&t);
		r->resp = &p->base;
	} else {
		r->code = -EINVAL;
	}
out:
	protobuf_c_message_free_unpacked(req, NULL);
	if (rc == MVCC_ELEASE_EXPIRED)
		return -EAGAIN;
	if (rc == MC_ENOT_LEADER)
		return rc;
	if (rc) {
		r->code = rc;
		rc = 0;
	}
	return rc;
}

/* ------------------------------------------------------------- snapshots */

static int buf_chunk(void *ctx, const void *data, size_t len)
{
	return mc_buf_append(ctx, data, len);
}

int meta__sm_snapshot(struct meta_node *n, uint8_t **data, size_t *len)
{
	Mooncake__Meta__SnapshotHeader h = MOONCAKE__META__SNAPSHOT_HEADER__INIT;
	Mooncake__Meta__Member *blk = calloc(n->n_members + 1, sizeof(*blk));
	Mooncake__Meta__Member **mv = calloc(n->n_members + 1, sizeof(*mv));
	Etcdserverpb__AlarmMember **av = calloc(n->n_alarms + 1, sizeof(*av));
	struct mc_buf b = MC_BUF_INIT;
	int rc = -ENOMEM;

	if (!blk || !mv || !av)
		goto out;
	h.cluster_id = n->cluster_id;
	for (size_t i = 0; i < n->n_members; i++) {
		const struct meta__member *m = &n->members[i];
		mooncake__meta__member__init(&blk[i]);
		blk[i].id = m->id;
		blk[i].name = m->name;
		blk[i].learner = m->learner;
		blk[i].peer_urls = (char **)&m->peer_url;
		blk[i].n_peer_urls = *m->peer_url ? 1 : 0;
		blk[i].client_urls = (char **)&m->client_url;
		blk[i].n_client_urls = *m->client_url ? 1 : 0;
		mv[i] = &blk[i];
	}
	h.members = mv;
	h.n_members = n->n_members;
	h.removed = n->removed;
	h.n_removed = n->n_removed;
	for (size_t i = 0; i < n->n_alarms; i++)
		av[i] = &n->alarms[i];
	h.alarms = av;
	h.n_alarms = n->n_alarms;

	size_t hl = mooncake__meta__snapshot_header__get_packed_size(&h);
	if (hl > UINT32_MAX || mc_buf_reserve(&b, 4 + hl))
		goto out;
	b.data[0] = (char)(hl & 0xff);
	b.data[1] = (char)((hl >> 8) & 0xff);
	b.data[2] = (char)((hl >> 16) & 0xff);
	b.data[3] = (char)((hl >> 24) & 0xff);
	mooncake__meta__snapshot_header__pack(&h, (uint8_t *)b.data + 4);
	b.len = 4 + hl;
	rc = mvcc_snapshot(n->store, buf_chunk, &b);
	if (rc)
		goto out;
	*data = (uint8_t *)b.data;
	*len = b.len;
	b.data = NULL;
	rc = 0;
out:
	mc_buf_free(&b);
	free(blk);
	free(mv);
	free(av);
	return rc;
}

static struct mvcc_options store_opts(const struct meta_node *n)
{
	/* etcd's minimum lease TTL: 1.5 election timeouts, in whole seconds. */
	uint64_t min_ms = n->o.election_ms * 3 / 2;
	return (struct mvcc_options){.min_lease_ttl_s = (int64_t)((min_ms + 999) / 1000)};
}

struct mvcc_options meta__sm_store_opts(const struct meta_node *n)
{
	return store_opts(n);
}

/* Split snapshot data into its header and the store's part. */
static Mooncake__Meta__SnapshotHeader *snap_header(const uint8_t *data, size_t len,
						   size_t *store_at)
{
	if (len < 4)
		return NULL;
	size_t hl = (size_t)data[0] | (size_t)data[1] << 8 | (size_t)data[2] << 16 |
		    (size_t)data[3] << 24;
	if (hl > len - 4)
		return NULL;
	*store_at = 4 + hl;
	return mooncake__meta__snapshot_header__unpack(NULL, hl, data + 4);
}

int meta__sm_export(const uint8_t *data, size_t len, const struct mvcc_options *mo,
		    uint64_t applied, int (*fn)(void *ctx, const struct bolt_state *st),
		    void *ctx)
{
	size_t at = 0;
	Mooncake__Meta__SnapshotHeader *h = snap_header(data, len, &at);
	struct mvcc_store *store = NULL;
	struct bolt_member *mv = NULL;
	struct bolt_alarm *av = NULL;
	int rc;

	if (!h)
		return -EBADMSG;
	rc = mvcc_restore(mo, data + at, len - at, &store);
	if (rc) {
		rc = rc == -ENOMEM ? -ENOMEM : -EBADMSG;
		goto out;
	}
	rc = -ENOMEM;
	mv = calloc(h->n_members + 1, sizeof(*mv));
	av = calloc(h->n_alarms + 1, sizeof(*av));
	if (!mv || !av)
		goto out;
	for (size_t i = 0; i < h->n_members; i++) {
		const Mooncake__Meta__Member *pm = h->members[i];
		mv[i] = (struct bolt_member){
			.id = pm->id,
			.name = pm->name ? pm->name : "",
			.peer_url = pm->n_peer_urls ? pm->peer_urls[0] : "",
			.client_url = pm->n_client_urls ? pm->client_urls[0] : "",
			.learner = pm->learner,
		};
	}
	for (size_t i = 0; i < h->n_alarms; i++)
		av[i] = (struct bolt_alarm){h->alarms[i]->memberid, (int)h->alarms[i]->alarm};
	struct bolt_state st = {
		.store = store,
		.members = mv,
		.n_members = h->n_members,
		.removed = h->removed,
		.n_removed = h->n_removed,
		.alarms = av,
		.n_alarms = h->n_alarms,
		.consistent_index = applied,
	};
	rc = fn(ctx, &st);
out:
	if (store)
		mvcc_free(store);
	free(mv);
	free(av);
	mooncake__meta__snapshot_header__free_unpacked(h, NULL);
	return rc;
}

int meta__sm_restore(struct meta_node *n, const uint8_t *data, size_t len)
{
	Mooncake__Meta__SnapshotHeader *h;
	struct mvcc_store *store = NULL;
	struct meta__member *mv = NULL;
	uint64_t *removed = NULL;
	Etcdserverpb__AlarmMember *alarms = NULL;
	size_t nm = 0;
	int rc;

	size_t at = 0;
	h = snap_header(data, len, &at);
	if (!h)
		return -EBADMSG;
	struct mvcc_options mo = store_opts(n);
	rc = mvcc_restore(&mo, data + at, len - at, &store);
	if (rc) {
		rc = rc == -ENOMEM ? -ENOMEM : -EBADMSG;
		goto out;
	}
	rc = -ENOMEM;
	mv = calloc(h->n_members + 1, sizeof(*mv));
	removed = malloc((h->n_removed + 1) * sizeof(*removed));
	alarms = malloc((h->n_alarms + 1) * sizeof(*alarms));
	if (!mv || !removed || !alarms)
		goto out;
	for (size_t i = 0; i < h->n_members; i++, nm++) {
		const Mooncake__Meta__Member *pm = h->members[i];
		mv[i].id = pm->id;
		mv[i].learner = pm->learner;
		mv[i].name = strdup(pm->name ? pm->name : "");
		mv[i].peer_url = strdup(pm->n_peer_urls ? pm->peer_urls[0] : "");
		mv[i].client_url = strdup(pm->n_client_urls ? pm->client_urls[0] : "");
		if (!mv[i].name || !mv[i].peer_url || !mv[i].client_url) {
			nm++;
			goto out;
		}
	}
	if (h->n_removed)
		memcpy(removed, h->removed, h->n_removed * sizeof(*removed));
	for (size_t i = 0; i < h->n_alarms; i++) {
		etcdserverpb__alarm_member__init(&alarms[i]);
		alarms[i].memberid = h->alarms[i]->memberid;
		alarms[i].alarm = h->alarms[i]->alarm;
	}
	/* Commit: nothing below fails. */
	if (n->store)
		mvcc_free(n->store);
	n->store = store;
	store = NULL;
	members_free(n->members, n->n_members);
	n->members = mv;
	n->n_members = nm;
	mv = NULL;
	nm = 0;
	free(n->removed);
	n->removed = removed;
	n->n_removed = h->n_removed;
	removed = NULL;
	free(n->alarms);
	n->alarms = alarms;
	n->n_alarms = h->n_alarms;
	alarms = NULL;
	if (h->cluster_id)
		n->cluster_id = h->cluster_id;
	n->published = false;
	for (size_t i = 0; i < n->n_members; i++)
		if (n->members[i].id == n->id)
			n->published = strcmp(n->members[i].name, n->name) == 0 &&
				       strcmp(n->members[i].client_url, n->self_client_url) == 0;
	for (size_t i = 0; i < n->n_members; i++)
		if (n->members[i].id != n->id && *n->members[i].peer_url &&
		    meta__peer_set(n, n->members[i].id, n->members[i].peer_url))
			log_warn("member %016llx: cannot use peer URL %s",
				 (unsigned long long)n->members[i].id,
				 n->members[i].peer_url);
	rc = 0;
out:
	if (store)
		mvcc_free(store);
	members_free(mv, nm);
	free(removed);
	free(alarms);
	mooncake__meta__snapshot_header__free_unpacked(h, NULL);
	return rc;
}

int meta__sm_new_store(struct meta_node *n)
{
	struct mvcc_options mo = store_opts(n);
	return mvcc_new(&mo, &n->store);
}

void meta__sm_free(struct meta_node *n)
{
	if (n->store)
		mvcc_free(n->store);
	n->store = NULL;
	members_free(n->members, n->n_members);
	n->members = NULL;
	n->n_members = 0;
	free(n->removed);
	n->removed = NULL;
	n->n_removed = 0;
	free(n->alarms);
	n->alarms = NULL;
	n->n_alarms = 0;
}
