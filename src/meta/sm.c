/*
 * sm: the meta state machine (see sm.h for the model) — what a committed
 * entry does, on every member alike: KV writes, compaction, lease grants
 * and revokes go to the MVCC store and its lease table (mvcc.h, lease.h);
 * membership changes, published member attributes and alarms go to the
 * member and alarm tables kept here. The same entries in the same order
 * give the same state and the same answers everywhere, so a failure that
 * would make one member differ (out of memory, an entry that does not
 * decode) is fatal to the caller.
 *
 * Also here: serving reads from the applied state, the leader-local lease
 * calls, and the snapshot of the whole state (format in sm.h). Nothing
 * here logs: what changed goes back as effects, and the driver reports it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "common/endian.h"
#include "common/util.h"
#include "meta/sm.h"

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

Etcdserverpb__ResponseHeader *meta__sm_header(const struct meta__sm *sm, uint64_t term,
					      struct meta__arena *a)
{
	Etcdserverpb__ResponseHeader *h = meta__alloc(a, sizeof(*h));
	if (!h)
		return NULL;
	etcdserverpb__response_header__init(h);
	h->cluster_id = sm->cluster_id;
	h->member_id = sm->member_id;
	h->revision = sm->store ? mvcc_rev(sm->store) : 0;
	h->raft_term = term;
	return h;
}

/* ------------------------------------------------------------- members */

const struct meta__member *meta__member_find(const struct meta__sm *sm, uint64_t id)
{
	for (size_t i = 0; i < sm->n_members; i++)
		if (sm->members[i].id == id)
			return &sm->members[i];
	return NULL;
}

bool meta__is_removed(const struct meta__sm *sm, uint64_t id)
{
	for (size_t i = 0; i < sm->n_removed; i++)
		if (sm->removed[i] == id)
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
static int member_put(struct meta__sm *sm, uint64_t id, const char *name, const char *peer_url,
		      const char *client_url, bool learner)
{
	struct meta__member *m = (struct meta__member *)meta__member_find(sm, id);
	int rc;

	if (!m) {
		struct meta__member *v = realloc(sm->members,
						 (sm->n_members + 1) * sizeof(*v));
		if (!v)
			return -ENOMEM;
		sm->members = v;
		size_t at = 0;
		while (at < sm->n_members && v[at].id < id)
			at++;
		memmove(&v[at + 1], &v[at], (sm->n_members - at) * sizeof(*v));
		memset(&v[at], 0, sizeof(*v));
		sm->n_members++;
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

static void member_del(struct meta__sm *sm, uint64_t id)
{
	for (size_t i = 0; i < sm->n_members; i++) {
		if (sm->members[i].id != id)
			continue;
		member_clear(&sm->members[i]);
		memmove(&sm->members[i], &sm->members[i + 1],
			(sm->n_members - i - 1) * sizeof(*sm->members));
		sm->n_members--;
		return;
	}
}

static int removed_add(struct meta__sm *sm, uint64_t id)
{
	if (meta__is_removed(sm, id))
		return 0;
	uint64_t *v = realloc(sm->removed, (sm->n_removed + 1) * sizeof(*v));
	if (!v)
		return -ENOMEM;
	v[sm->n_removed++] = id;
	sm->removed = v;
	return 0;
}

Etcdserverpb__Member **meta__members_pb(const struct meta__sm *sm, struct meta__arena *a,
					size_t *count)
{
	size_t k = sm->n_members;
	Etcdserverpb__Member **v = meta__alloc(a, (k ? k : 1) * sizeof(*v));
	Etcdserverpb__Member *blk = meta__alloc(a, (k ? k : 1) * sizeof(*blk));
	if (!v || !blk)
		return NULL;
	for (size_t i = 0; i < k; i++) {
		const struct meta__member *m = &sm->members[i];
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
static ProtobufCMessage *members_reply(struct meta__sm *sm, const struct meta__sm_in *in,
				       struct meta__reply *r,
				       const ProtobufCMessageDescriptor *d)
{
	const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field_by_name(
		d, "members");
	ProtobufCMessage *p = meta__alloc(&r->arena, d->sizeof_message);
	Etcdserverpb__ResponseHeader *h = meta__sm_header(sm, in->term, &r->arena);
	size_t k = 0;
	Etcdserverpb__Member **ms = meta__members_pb(sm, &r->arena, &k);

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

int meta__conf_bytes(const struct meta__sm *sm, uint8_t **out, size_t *len)
{
	uint64_t *voters = calloc(sm->n_members + 1, sizeof(uint64_t));
	uint64_t *learners = calloc(sm->n_members + 1, sizeof(uint64_t));
	Mooncake__Raft__ConfState cs = MOONCAKE__RAFT__CONF_STATE__INIT;
	int rc = -ENOMEM;

	if (!voters || !learners)
		goto out;
	for (size_t i = 0; i < sm->n_members; i++) {
		if (sm->members[i].learner)
			learners[cs.n_learners++] = sm->members[i].id;
		else
			voters[cs.n_voters++] = sm->members[i].id;
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

bool meta__alarm_active(const struct meta__sm *sm, int alarm)
{
	for (size_t i = 0; i < sm->n_alarms; i++)
		if ((int)sm->alarms[i].alarm == alarm)
			return true;
	return false;
}

uint64_t meta__quota_size(const struct meta__sm *sm)
{
	return mvcc_db_size_bytes(sm->store) +
	       (uint64_t)lease_count(mvcc_leases(sm->store)) * META_LEASE_QUOTA_BYTES;
}

bool meta__over_quota(const struct meta__sm *sm, uint64_t quota_bytes, size_t req_len)
{
	if (meta__alarm_active(sm, ETCDSERVERPB__ALARM_TYPE__NOSPACE))
		return true;
	return meta__quota_size(sm) + req_len + MVCC_VERSION_OVERHEAD_BYTES > quota_bytes;
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
static int apply_alarm(struct meta__sm *sm, const struct meta__sm_in *in,
		       const Etcdserverpb__AlarmRequest *q, struct meta__reply *r,
		       struct meta__sm_effects *fx)
{
	Etcdserverpb__AlarmMember changed[8];
	size_t n_changed = 0;

	if (q->action == ETCDSERVERPB__ALARM_REQUEST__ALARM_ACTION__ACTIVATE) {
		bool have = false;
		for (size_t i = 0; i < sm->n_alarms; i++)
			have |= sm->alarms[i].memberid == q->memberid &&
				sm->alarms[i].alarm == q->alarm;
		if (!have && q->alarm != ETCDSERVERPB__ALARM_TYPE__NONE) {
			Etcdserverpb__AlarmMember *v = realloc(sm->alarms, (sm->n_alarms + 1) *
										   sizeof(*v));
			if (!v)
				return -ENOMEM;
			sm->alarms = v;
			etcdserverpb__alarm_member__init(&v[sm->n_alarms]);
			v[sm->n_alarms].memberid = q->memberid;
			v[sm->n_alarms].alarm = q->alarm;
			sm->n_alarms++;
			fx->alarm_raised = q->alarm;
			fx->alarm_member = q->memberid;
		}
		if (q->alarm != ETCDSERVERPB__ALARM_TYPE__NONE) {
			etcdserverpb__alarm_member__init(&changed[0]);
			changed[0].memberid = q->memberid;
			changed[0].alarm = q->alarm;
			n_changed = 1;
		}
	} else if (q->action == ETCDSERVERPB__ALARM_REQUEST__ALARM_ACTION__DEACTIVATE) {
		for (size_t i = 0; i < sm->n_alarms;) {
			Etcdserverpb__AlarmMember *am = &sm->alarms[i];
			bool match = (q->memberid == 0 || am->memberid == q->memberid) &&
				     (q->alarm == ETCDSERVERPB__ALARM_TYPE__NONE ||
				      am->alarm == q->alarm);
			if (!match) {
				i++;
				continue;
			}
			if (n_changed < MC_ARRAY_LEN(changed))
				changed[n_changed++] = *am;
			fx->alarms_cleared++;
			memmove(am, am + 1, (sm->n_alarms - i - 1) * sizeof(*am));
			sm->n_alarms--;
		}
	}
	if (!r)
		return 0;
	Etcdserverpb__AlarmResponse *p = meta__alloc(&r->arena, sizeof(*p));
	if (!p)
		goto nomem;
	etcdserverpb__alarm_response__init(p);
	if (!(p->header = meta__sm_header(sm, in->term, &r->arena)) ||
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

static int kv_reply(struct meta__sm *sm, const struct meta__sm_in *in, struct mvcc_op *op,
		    struct meta__reply *r)
{
	struct mvcc_result res;
	int rc = mvcc_apply(sm->store, op, &res);

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
	Etcdserverpb__ResponseHeader *h = meta__sm_header(sm, in->term, &r->arena);
	if (h)
		h->revision = res.revision;
	if (!h || !(r->resp = meta__resp_pb(&r->mres.resp, h, &r->arena)))
		r->code = -ENOMEM;
	return 0;
}

/* A reply holding only a header (CompactionResponse, LeaseRevokeResponse). */
static void header_reply(struct meta__sm *sm, const struct meta__sm_in *in,
			 const ProtobufCMessageDescriptor *d, struct meta__reply *r,
			 int64_t revision)
{
	ProtobufCMessage *p;
	Etcdserverpb__ResponseHeader *h;

	if (!r)
		return;
	p = meta__alloc(&r->arena, d->sizeof_message);
	h = meta__sm_header(sm, in->term, &r->arena);
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

static int apply_request(struct meta__sm *sm, const struct meta__sm_in *in,
			 const Mooncake__Meta__Request *q, struct meta__reply *r,
			 struct meta__sm_effects *fx)
{
	struct meta__arena tmp = {0};
	struct mvcc_op op;
	int rc = 0;
	bool capped = meta__alarm_active(sm, ETCDSERVERPB__ALARM_TYPE__NOSPACE);

	switch (q->req_case) {
	case MOONCAKE__META__REQUEST__REQ_PUT:
		if (capped) {
			if (r)
				r->code = META_ENOSPACE;
			return 0;
		}
		meta__op_from_put(q->put, &op);
		return kv_reply(sm, in, &op, r);
	case MOONCAKE__META__REQUEST__REQ_DELETE_RANGE:
		meta__op_from_delete(q->delete_range, &op);
		return kv_reply(sm, in, &op, r);
	case MOONCAKE__META__REQUEST__REQ_TXN:
		if (capped && meta__txn_writes(q->txn, true)) {
			if (r)
				r->code = META_ENOSPACE;
			return 0;
		}
		rc = meta__op_from_txn(q->txn, &op, &tmp);
		if (rc == 0)
			rc = kv_reply(sm, in, &op, r);
		meta__arena_free(&tmp);
		return rc;
	case MOONCAKE__META__REQUEST__REQ_COMPACTION:
		/* As etcd: the compaction holds at once, its versions are freed
		 * later (meta__compact_resume), unless the client asked to wait
		 * for that (physical). */
		rc = q->compaction->physical
			     ? mvcc_compact(sm->store, q->compaction->revision)
			     : mvcc_compact_lazy(sm->store, q->compaction->revision);
		if (rc == -ENOMEM)
			return rc;
		if (rc) {
			if (r)
				r->code = rc;
			return 0;
		}
		fx->compacted_rev = q->compaction->revision;
		header_reply(sm, in, &etcdserverpb__compaction_response__descriptor, r, 0);
		return 0;
	case MOONCAKE__META__REQUEST__REQ_LEASE_GRANT: {
		int64_t id = 0, ttl = 0;
		if (capped) {
			if (r)
				r->code = META_ENOSPACE;
			return 0;
		}
		rc = lease_grant(mvcc_leases(sm->store), q->lease_grant->id,
				 q->lease_grant->ttl, in->now_ms, &id, &ttl);
		if (rc == -ENOMEM)
			return rc;
		if (!r)
			return 0;
		if (rc) {
			r->code = rc;
			return 0;
		}
		Etcdserverpb__LeaseGrantResponse *p = meta__alloc(&r->arena, sizeof(*p));
		Etcdserverpb__ResponseHeader *h = meta__sm_header(sm, in->term, &r->arena);
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
		rc = mvcc_lease_revoke(sm->store, q->lease_revoke->id, &rev);
		if (rc == -ENOMEM)
			return rc;
		if (rc) {
			if (r)
				r->code = rc;
			return 0;
		}
		header_reply(sm, in, &etcdserverpb__lease_revoke_response__descriptor, r, rev);
		return 0;
	}
	case MOONCAKE__META__REQUEST__REQ_LEASE_CHECKPOINT:
		lease_checkpoint(mvcc_leases(sm->store), q->lease_checkpoint->id,
				 q->lease_checkpoint->remaining_ttl);
		return 0;
	case MOONCAKE__META__REQUEST__REQ_ALARM:
		return apply_alarm(sm, in, q->alarm, r, fx);
	case MOONCAKE__META__REQUEST__REQ_MEMBER_ATTRIBUTES: {
		const Mooncake__Meta__MemberAttributes *at = q->member_attributes;
		const struct meta__member *m = meta__member_find(sm, at->id);
		if (!m)
			return 0; /* removed meanwhile */
		rc = member_put(sm, at->id, at->name, NULL,
				at->n_client_urls ? at->client_urls[0] : "", m->learner);
		if (rc)
			return rc;
		fx->member_change = META_MEMBER_PUBLISHED;
		fx->member_id = at->id;
		if (r)
			members_reply(sm, in, r,
				      &etcdserverpb__member_update_response__descriptor);
		return 0;
	}
	case MOONCAKE__META__REQUEST__REQ_MEMBER_UPDATE: {
		const Etcdserverpb__MemberUpdateRequest *u = q->member_update;
		const struct meta__member *m = meta__member_find(sm, u->id);
		if (!m) {
			if (r)
				r->code = META_EMEMBER_NOT_FOUND;
			return 0;
		}
		if (u->n_peerurls) {
			if ((rc = member_put(sm, u->id, NULL, u->peerurls[0], NULL,
					     m->learner)))
				return rc;
			fx->member_change = META_MEMBER_MOVED;
			fx->member_id = u->id;
		}
		if (r)
			members_reply(sm, in, r,
				      &etcdserverpb__member_update_response__descriptor);
		return 0;
	}
	default:
		return -EBADMSG;
	}
}

static int apply_conf(struct meta__sm *sm, const struct meta__sm_in *in,
		      const struct raft_entry *e, struct meta__reply *r,
		      struct meta__sm_effects *fx)
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
		rc = member_put(sm, cc.node_id, pm ? pm->name : NULL,
				pm && pm->n_peer_urls ? pm->peer_urls[0] : NULL,
				pm && pm->n_client_urls ? pm->client_urls[0] : NULL,
				cc.type == RAFT_CC_ADD_LEARNER);
		if (rc)
			goto out;
		fx->member_change = META_MEMBER_ADDED;
		break;
	case RAFT_CC_PROMOTE: {
		const struct meta__member *m = meta__member_find(sm, cc.node_id);
		if (m) {
			((struct meta__member *)m)->learner = false;
			fx->member_change = META_MEMBER_PROMOTED;
		}
		rc = 0;
		break;
	}
	case RAFT_CC_REMOVE:
		member_del(sm, cc.node_id);
		rc = removed_add(sm, cc.node_id);
		if (rc)
			goto out;
		fx->member_change = META_MEMBER_REMOVED;
		break;
	default:
		rc = -EBADMSG;
		goto out;
	}
	fx->member_id = cc.node_id;
	if (r) {
		if (cc.type == RAFT_CC_ADD_VOTER || cc.type == RAFT_CC_ADD_LEARNER) {
			Etcdserverpb__MemberAddResponse *p = (void *)members_reply(
				sm, in, r, &etcdserverpb__member_add_response__descriptor);
			for (size_t i = 0; p && i < p->n_members; i++)
				if (p->members[i]->id == cc.node_id)
					p->member = p->members[i];
		} else if (cc.type == RAFT_CC_PROMOTE) {
			members_reply(sm, in, r,
				      &etcdserverpb__member_promote_response__descriptor);
		} else {
			members_reply(sm, in, r,
				      &etcdserverpb__member_remove_response__descriptor);
		}
	}
	rc = 0;
out:
	if (ctx)
		mooncake__meta__conf_context__free_unpacked(ctx, NULL);
	return rc;
}

int meta__sm_apply(struct meta__sm *sm, const struct raft_entry *e,
		   const struct meta__sm_in *in, struct meta__reply *r,
		   struct meta__sm_effects *fx)
{
	Mooncake__Meta__Request *q;
	int rc;

	memset(fx, 0, sizeof(*fx));
	if (e->type == RAFT_ENTRY_CONF_CHANGE)
		return apply_conf(sm, in, e, r, fx);
	if (e->len == 0)
		return 0; /* a new leader's empty entry */
	q = mooncake__meta__request__unpack(NULL, e->len, e->data);
	if (!q)
		return -EBADMSG;
	rc = apply_request(sm, in, q, r, fx);
	mooncake__meta__request__free_unpacked(q, NULL);
	return rc;
}

/* ------------------------------------------------------------- reads */

static int serve_leases(struct meta__sm *sm, const struct meta__sm_in *in,
			struct meta__reply *r)
{
	int64_t *ids = NULL;
	size_t k = 0;
	int rc = lease_list(mvcc_leases(sm->store), &ids, &k);
	if (rc)
		return rc;
	Etcdserverpb__LeaseLeasesResponse *p = meta__alloc(&r->arena, sizeof(*p));
	Etcdserverpb__LeaseStatus **v = meta__alloc(&r->arena, (k ? k : 1) * sizeof(*v));
	Etcdserverpb__LeaseStatus *blk = meta__alloc(&r->arena, (k ? k : 1) * sizeof(*blk));
	rc = -ENOMEM;
	if (!p || !v || !blk)
		goto out;
	etcdserverpb__lease_leases_response__init(p);
	if (!(p->header = meta__sm_header(sm, in->term, &r->arena)))
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

void meta__sm_read(struct meta__sm *sm, const struct meta__sm_in *in, enum meta__method m,
		   const uint8_t *data, size_t len, struct meta__reply *r)
{
	const ProtobufCMessageDescriptor *d = meta__methods[m].req;
	ProtobufCMessage *req = protobuf_c_message_unpack(d, NULL, len, data);
	struct mvcc_op mop;
	int rc = 0;

	if (!req) {
		r->code = -EINVAL;
		return;
	}
	switch (m) {
	case META_M_RANGE:
		meta__op_from_range((Etcdserverpb__RangeRequest *)req, &mop);
		rc = kv_reply(sm, in, &mop, r);
		break;
	case META_M_TXN: {
		struct meta__arena tmp = {0};
		rc = meta__op_from_txn((Etcdserverpb__TxnRequest *)req, &mop, &tmp);
		if (rc == 0)
			rc = kv_reply(sm, in, &mop, r);
		meta__arena_free(&tmp);
		break;
	}
	case META_M_LEASE_LEASES:
		rc = serve_leases(sm, in, r);
		break;
	case META_M_MEMBER_LIST:
		members_reply(sm, in, r, &etcdserverpb__member_list_response__descriptor);
		break;
	case META_M_ALARM: {
		Etcdserverpb__AlarmResponse *p = meta__alloc(&r->arena, sizeof(*p));
		rc = -ENOMEM;
		if (!p)
			break;
		etcdserverpb__alarm_response__init(p);
		if (!(p->header = meta__sm_header(sm, in->term, &r->arena)) ||
		    !(p->alarms = alarms_pb(sm->alarms, sm->n_alarms, &r->arena)))
			break;
		p->n_alarms = sm->n_alarms;
		r->resp = &p->base;
		rc = 0;
		break;
	}
	default:
		r->code = -EINVAL;
		break;
	}
	protobuf_c_message_free_unpacked(req, NULL);
	if (rc)
		r->code = rc;
}

int meta__sm_leader(struct meta__sm *sm, const struct meta__sm_in *in, enum meta__method m,
		    const uint8_t *data, size_t len, struct meta__reply *r)
{
	const ProtobufCMessageDescriptor *d = meta__methods[m].req;
	ProtobufCMessage *req = protobuf_c_message_unpack(d, NULL, len, data);
	struct lease_table *lt = mvcc_leases(sm->store);
	int rc = 0;

	if (!req) {
		r->code = -EINVAL;
		return 0;
	}
	if (m == META_M_LEASE_KEEPALIVE) {
		const Etcdserverpb__LeaseKeepAliveRequest *q = (void *)req;
		int64_t ttl = 0;
		bool clear = false;
		rc = lease_renew(lt, q->id, in->now_ms, &ttl, &clear);
		if (rc == MVCC_ELEASE_NOT_FOUND) {
			ttl = 0;
			rc = 0;
		}
		if (rc == 0) {
			Etcdserverpb__LeaseKeepAliveResponse *p = meta__alloc(&r->arena,
									      sizeof(*p));
			Etcdserverpb__ResponseHeader *h = meta__sm_header(sm, in->term,
									  &r->arena);
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
	} else if (m == META_M_LEASE_TTL) {
		const Etcdserverpb__LeaseTimeToLiveRequest *q = (void *)req;
		struct lease_ttl t;
		Etcdserverpb__LeaseTimeToLiveResponse *p = meta__alloc(&r->arena, sizeof(*p));
		Etcdserverpb__ResponseHeader *h = meta__sm_header(sm, in->term, &r->arena);
		if (!p || !h) {
			r->code = -ENOMEM;
			goto out;
		}
		etcdserverpb__lease_time_to_live_response__init(p);
		p->header = h;
		p->id = q->id;
		rc = lease_time_to_live(lt, q->id, in->now_ms, q->keys, &t);
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

int meta__sm_snap_begin(const struct meta__sm *sm, mvcc_write_fn fn, void *ctx,
			struct mvcc_snap_cursor **cur)
{
	Mooncake__Meta__SnapshotHeader h = MOONCAKE__META__SNAPSHOT_HEADER__INIT;
	Mooncake__Meta__Member *blk = calloc(sm->n_members + 1, sizeof(*blk));
	Mooncake__Meta__Member **mv = calloc(sm->n_members + 1, sizeof(*mv));
	Etcdserverpb__AlarmMember **av = calloc(sm->n_alarms + 1, sizeof(*av));
	uint8_t *hb = NULL;
	int rc = -ENOMEM;

	if (!blk || !mv || !av)
		goto out;
	h.cluster_id = sm->cluster_id;
	for (size_t i = 0; i < sm->n_members; i++) {
		const struct meta__member *m = &sm->members[i];
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
	h.n_members = sm->n_members;
	h.removed = sm->removed;
	h.n_removed = sm->n_removed;
	for (size_t i = 0; i < sm->n_alarms; i++)
		av[i] = &sm->alarms[i];
	h.alarms = av;
	h.n_alarms = sm->n_alarms;

	size_t hl = mooncake__meta__snapshot_header__get_packed_size(&h);
	if (hl > UINT32_MAX || !(hb = malloc(4 + hl)))
		goto out;
	mc_put_le32(hb, (uint32_t)hl);
	mooncake__meta__snapshot_header__pack(&h, hb + 4);
	rc = fn(ctx, hb, 4 + hl);
	if (rc == 0)
		rc = mvcc_snap_begin(sm->store, fn, ctx, cur);
out:
	free(hb);
	free(blk);
	free(mv);
	free(av);
	return rc;
}

int meta__sm_snapshot_write(struct meta__sm *sm, mvcc_write_fn fn, void *ctx)
{
	struct mvcc_snap_cursor *cur;
	(void)mvcc_compact_work(sm->store, SIZE_MAX);
	int rc = meta__sm_snap_begin(sm, fn, ctx, &cur);
	if (rc)
		return rc;
	rc = mvcc_snap_step(cur, SIZE_MAX);
	mvcc_snap_free(cur);
	return rc == 1 ? 0 : rc;
}

static int buf_chunk(void *ctx, const void *data, size_t len)
{
	return mc_buf_append(ctx, data, len);
}

int meta__sm_snapshot(struct meta__sm *sm, uint8_t **data, size_t *len)
{
	struct mc_buf b = MC_BUF_INIT;
	int rc = meta__sm_snapshot_write(sm, buf_chunk, &b);
	if (rc) {
		mc_buf_free(&b);
		return rc;
	}
	*data = (uint8_t *)b.data;
	*len = b.len;
	return 0;
}

/* Split snapshot data into its header and the store's part. */
static Mooncake__Meta__SnapshotHeader *snap_header(const uint8_t *data, size_t len,
						   size_t *store_at)
{
	if (len < 4)
		return NULL;
	size_t hl = mc_get_le32(data);
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

int meta__sm_restore(struct meta__sm *sm, const uint8_t *data, size_t len)
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
	rc = mvcc_restore(&sm->mo, data + at, len - at, &store);
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
	if (sm->store)
		mvcc_free(sm->store);
	sm->store = store;
	store = NULL;
	members_free(sm->members, sm->n_members);
	sm->members = mv;
	sm->n_members = nm;
	mv = NULL;
	nm = 0;
	free(sm->removed);
	sm->removed = removed;
	sm->n_removed = h->n_removed;
	removed = NULL;
	free(sm->alarms);
	sm->alarms = alarms;
	sm->n_alarms = h->n_alarms;
	alarms = NULL;
	if (h->cluster_id)
		sm->cluster_id = h->cluster_id;
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

int meta__sm_init(struct meta__sm *sm, const struct mvcc_options *mo)
{
	memset(sm, 0, sizeof(*sm));
	sm->mo = *mo;
	return mvcc_new(&sm->mo, &sm->store);
}

void meta__sm_free(struct meta__sm *sm)
{
	if (sm->store)
		mvcc_free(sm->store);
	sm->store = NULL;
	members_free(sm->members, sm->n_members);
	sm->members = NULL;
	sm->n_members = 0;
	free(sm->removed);
	sm->removed = NULL;
	sm->n_removed = 0;
	free(sm->alarms);
	sm->alarms = NULL;
	sm->n_alarms = 0;
}
