/*
 * ops: which operation serves each client request (agent__dispatch, the
 * server's on_request hook), and the small operations: hello (the
 * session's staging buffer), exist, remove and remove_all (the master's
 * calls, the lease cache and inventory kept in step), stats, and the
 * release of zero-copy views. Put, get, buffers and transfers have files
 * of their own (op_put.c, op_get.c, op_buf.c).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent/agent_int.h"
#include "agent/batch.h"
#include "agent/mcall.h"
#include "agent/mirror.h"
#include "agent/mlink.h"
#include "agent/op.h"
#include "agent/req.h"
#include "agent/server.h"
#include "agent/tier.h"
#include "common/log.h"
#include "common/util.h"
#include "ssd/ssd.h"

#define LOG_SUBSYS LOGS_AGENT

/* ------------------------------------------------------------ hello */

static void op_hello(struct agent_req *r)
{
	struct agent *a = r->a;
	struct agent_conn *c = r->c;
	const Mooncake__Client__Hello *h = r->msg->hello;
	if (h->version != AGENT_PROTOCOL_VERSION) {
		char why[96];
		snprintf(why, sizeof(why),
			 "protocol version %u is not supported (this "
			 "agent speaks %u)",
			 h->version, AGENT_PROTOCOL_VERSION);
		log_warn("client %s: %s", agent__session_name(c), why);
		agent__reply_error(r, MC_EPROTOCOL, why);
		agent__op_finish(r, MC_EPROTOCOL);
		return;
	}
	uint64_t want = h->staging_size ? h->staging_size : a->staging_bytes;
	if (want > a->staging_bytes)
		want = a->staging_bytes;
	if (want < 4096)
		want = 4096;
	/* With the shared lease table, the client counts the gets it
	 * answers from it in 16 bytes after its staging room. */
	bool table = h->lease_table && a->ltab.hdr;
	if (table)
		want = (want + 63) & ~(uint64_t)63;
	struct agent_memfd_opts mo = {
		.name = "mooncake-staging",
		.len = want + (table ? AGENT_TABLE_COUNTS_BYTES : 0),
		.hugepages = AGENT_HUGEPAGES_OFF,
		.numa_node = a->numa_node,
	};
	struct agent_map *m;
	int rc = agent__memfd_new(a, &mo, &m);
	if (rc) {
		agent__op_fail(r, rc, "cannot create the staging buffer");
		return;
	}
	/* The staging memfd; with the table, the table's and the segment's
	 * read-only descriptors. */
	const int src[3] = {m->fd, a->ltab.fd, a->seg_ro_fd};
	int fds[3];
	bool own[3] = {true, true, true};
	unsigned nfds = table ? 3 : 1;
	for (unsigned i = 0; i < nfds; i++)
		if ((fds[i] = dup(src[i])) < 0) {
			int err = -errno;
			while (i-- > 0)
				close(fds[i]);
			agent__map_unref(m);
			agent__op_fail(r, err, "cannot pass the staging buffer");
			return;
		}
	uint64_t usable = table ? want : m->len;
	agent__session_hello(c, h->client_name, m, usable, table);
	if (table)
		agent__session_segment_fd_sent(c);
	Mooncake__Client__HelloReply hr = MOONCAKE__CLIENT__HELLO_REPLY__INIT;
	hr.version = AGENT_PROTOCOL_VERSION;
	hr.staging_size = usable;
	if (table) {
		hr.lease_table_size = a->ltab.bytes;
		hr.counters_offset = want;
	}
	hr.agent_id = a->name;
	hr.segment = a->name;
	hr.segment_size = a->seg->len;
	hr.max_frame = MC_UFRAME_MAX_BYTES;
	hr.lease_ttl_ms = agent__lease_ttl_ms(a);
	hr.rpc_address = a->name;
	Mooncake__Client__Response resp = MOONCAKE__CLIENT__RESPONSE__INIT;
	resp.body_case = MOONCAKE__CLIENT__RESPONSE__BODY_HELLO;
	resp.hello = &hr;
	log_debug("client %s: session started, staging %llu bytes%s", agent__session_name(c),
		  (unsigned long long)usable, table ? ", shared lease table" : "");
	agent__reply(r, &resp, fds, own, nfds);
	agent__op_finish(r, 0);
}

/* ------------------------------------------------------------ exist, remove */

static void keys_reply(struct agent_req *r, int first)
{
	int32_t *res = calloc(r->n, sizeof(*res));
	if (!res) {
		agent__op_fail(r, -ENOMEM, NULL);
		return;
	}
	for (size_t i = 0; i < r->n; i++)
		res[i] = r->items[i].err;
	Mooncake__Client__KeysReply kr = MOONCAKE__CLIENT__KEYS_REPLY__INIT;
	kr.results = res;
	kr.n_results = r->n;
	Mooncake__Client__Response resp = MOONCAKE__CLIENT__RESPONSE__INIT;
	resp.body_case = MOONCAKE__CLIENT__RESPONSE__BODY_KEYS;
	resp.keys = &kr;
	agent__reply(r, &resp, NULL, NULL, 0);
	free(res);
	agent__op_finish(r, first);
}

static void on_exist(void *ud, int err, const char *message, const ProtobufCMessage *m)
{
	struct agent_req *r = ud;
	struct agent_keys_block *b = r->mstate;
	const Mooncake__Master__BatchExistResponse *resp =
		(const Mooncake__Master__BatchExistResponse *)m;
	(void)message;
	for (size_t k = 0; k < b->req.n_keys; k++) {
		struct agent_item *it = &r->items[b->idx[k]];
		if (err)
			it->err = err;
		else if (k < resp->n_errors && resp->errors[k])
			it->err = resp->errors[k];
		else
			it->err = k < resp->n_exists && resp->exists[k] ? 1 : 0;
	}
	keys_reply(r, err);
}

static void on_removed(void *ud, int err, const char *message, const ProtobufCMessage *m)
{
	struct agent_req *r = ud;
	struct agent_keys_block *b = r->mstate;
	const Mooncake__Master__BatchErrorsResponse *resp =
		(const Mooncake__Master__BatchErrorsResponse *)m;
	(void)message;
	for (size_t k = 0; k < b->req.n_keys; k++) {
		struct agent_item *it = &r->items[b->idx[k]];
		it->err = err ? err : k < resp->n_errors ? resp->errors[k] : MC_EPROTOCOL;
		if (it->err == 0) {
			agent__inv_del(&r->a->inv, it->key, it->klen);
			agent__lcache_del(&r->a->lc, it->key, it->klen);
		}
	}
	keys_reply(r, err);
}

/* An item per key, the invalid ones failed (-EINVAL). Errors: -ENOMEM. */
static int key_items(struct agent_req *r, const ProtobufCBinaryData *keys, size_t n)
{
	if (agent__op_items(r, n))
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		r->items[i].key = keys[i].data;
		r->items[i].klen = keys[i].len;
		if (!agent__key_ok(&keys[i]))
			r->items[i].err = -EINVAL;
	}
	return 0;
}

/* The items of the keys and the master's request of the valid ones (the
 * op's mstate), or NULL when the op failed for want of memory. */
static struct agent_keys_block *keys_block(struct agent_req *r,
					   const ProtobufCBinaryData *keys, size_t n)
{
	struct agent_keys_block *b = NULL;
	if (key_items(r, keys, n) == 0)
		b = agent__op_keys_block(r, agent__op_item_ok);
	if (!b) {
		agent__op_fail(r, -ENOMEM, NULL);
		return NULL;
	}
	agent__op_set_mstate(r, b);
	return b;
}

static void op_keys(struct agent_req *r, bool remove)
{
	const Mooncake__Client__KeysRequest *q = remove ? r->msg->remove : r->msg->exist;
	struct agent_keys_block *b = keys_block(r, q->keys, q->n_keys);
	if (!b)
		return;
	if (b->req.n_keys == 0) {
		keys_reply(r, 0);
		return;
	}
	if (!remove) {
		agent__bcall(r->a, AGENT_B_EXIST, &b->req.base, on_exist, r);
		return;
	}
	b->rm.force = q->force;
	agent__mcall(r->a, "BatchRemove", &b->rm.base,
		     &mooncake__master__batch_errors_response__descriptor, on_removed, r);
}

/* ------------------------------------------------------------ replicas */

/* The master's placements, one result per key of the request. */
static void on_replicas(void *ud, int err, const char *message, const ProtobufCMessage *m)
{
	struct agent_req *r = ud;
	struct agent_keys_block *b = r->mstate;
	const Mooncake__Master__BatchGetReplicasResponse *resp = (const void *)m;
	(void)message;
	Mooncake__Client__ReplicasResult *res = calloc(r->n, sizeof(*res));
	Mooncake__Client__ReplicasResult **rp = calloc(r->n, sizeof(*rp));
	const Mooncake__Master__GetReplicasResult **by_item = calloc(r->n, sizeof(*by_item));
	size_t total = 0;
	if (!res || !rp || !by_item)
		goto oom;
	for (size_t k = 0; k < b->req.n_keys; k++) {
		struct agent_item *it = &r->items[b->idx[k]];
		if (err || k >= resp->n_results) {
			it->err = err ? err : MC_EPROTOCOL;
			continue;
		}
		by_item[b->idx[k]] = resp->results[k];
		it->err = resp->results[k]->error;
		total += resp->results[k]->n_replicas;
	}
	Mooncake__Client__ReplicaInfo *info = calloc(total ? total : 1, sizeof(*info));
	Mooncake__Client__ReplicaInfo **ip = calloc(total ? total : 1, sizeof(*ip));
	if (!info || !ip) {
		free(info);
		free(ip);
		goto oom;
	}
	size_t at = 0;
	for (size_t i = 0; i < r->n; i++) {
		mooncake__client__replicas_result__init(&res[i]);
		rp[i] = &res[i];
		res[i].error = r->items[i].err;
		const Mooncake__Master__GetReplicasResult *g = by_item[i];
		if (!g || g->error)
			continue;
		res[i].size = g->size;
		res[i].replicas = &ip[at];
		for (size_t j = 0; j < g->n_replicas; j++, at++) {
			const Mooncake__Master__Replica *p = g->replicas[j];
			mooncake__client__replica_info__init(&info[at]);
			info[at].segment = p->segment; /* borrowed from the answer */
			info[at].ssd = p->tier == MOONCAKE__MASTER__TIER__TIER_SSD;
			info[at].address = info[at].ssd ? 0 : p->address;
			info[at].size = p->size;
			info[at].complete = p->state ==
					    MOONCAKE__MASTER__REPLICA_STATE__REPLICA_COMPLETE;
			ip[at] = &info[at];
		}
		res[i].n_replicas = g->n_replicas;
	}
	Mooncake__Client__ReplicasReply rr = MOONCAKE__CLIENT__REPLICAS_REPLY__INIT;
	rr.results = rp;
	rr.n_results = r->n;
	Mooncake__Client__Response out = MOONCAKE__CLIENT__RESPONSE__INIT;
	out.body_case = MOONCAKE__CLIENT__RESPONSE__BODY_REPLICAS;
	out.replicas = &rr;
	agent__reply(r, &out, NULL, NULL, 0);
	free(info);
	free(ip);
	free(res);
	free(rp);
	free(by_item);
	agent__op_finish(r, err);
	return;
oom:
	free(res);
	free(rp);
	free(by_item);
	agent__op_fail(r, -ENOMEM, NULL);
}

static void op_replicas(struct agent_req *r)
{
	const Mooncake__Client__KeysRequest *q = r->msg->replicas;
	struct agent_keys_block *b = keys_block(r, q->keys, q->n_keys);
	if (!b)
		return;
	if (b->req.n_keys == 0) {
		on_replicas(r, 0, NULL, NULL);
		return;
	}
	agent__bcall(r->a, AGENT_B_GET, &b->req.base, on_replicas, r);
}

static void on_removed_all(void *ud, int err, const char *message, const ProtobufCMessage *m)
{
	struct agent_req *r = ud;
	const Mooncake__Master__RemoveAllResponse *resp =
		(const Mooncake__Master__RemoveAllResponse *)m;
	if (err) {
		agent__op_fail(r, err, message);
		return;
	}
	/* The mirror hears of each removal from the master's log (leased
	 * and PENDING objects stay). */
	agent__lcache_clear(&r->a->lc);
	Mooncake__Client__RemoveAllReply rr = MOONCAKE__CLIENT__REMOVE_ALL_REPLY__INIT;
	rr.removed = resp->removed;
	rr.skipped = resp->skipped;
	Mooncake__Client__Response out = MOONCAKE__CLIENT__RESPONSE__INIT;
	out.body_case = MOONCAKE__CLIENT__RESPONSE__BODY_REMOVE_ALL;
	out.remove_all = &rr;
	agent__reply(r, &out, NULL, NULL, 0);
	agent__op_finish(r, 0);
}

/* Objects whose key matches a pattern: the master walks its index. */
static void op_remove_regex(struct agent_req *r)
{
	Mooncake__Master__RemoveRegexRequest *q = malloc(sizeof(*q));
	if (!q) {
		agent__op_fail(r, -ENOMEM, NULL);
		return;
	}
	mooncake__master__remove_regex_request__init(q);
	q->pattern = r->msg->remove_regex->pattern; /* borrowed from the request */
	q->force = r->msg->remove_regex->force;
	agent__op_set_mstate(r, q);
	agent__mcall(r->a, "RemoveRegex", &q->base,
		     &mooncake__master__remove_all_response__descriptor, on_removed_all, r);
}

/* BatchReplicaClear: the master's 0 is a clear (1 to the client), its
 * "not found" and "leased" are skips (0). */
static void on_cleared(void *ud, int err, const char *message, const ProtobufCMessage *m)
{
	struct agent_req *r = ud;
	struct agent_keys_block *b = r->mstate;
	const Mooncake__Master__BatchErrorsResponse *resp =
		(const Mooncake__Master__BatchErrorsResponse *)m;
	bool own = strcmp(r->msg->replica_clear->segment, r->a->name) == 0;
	(void)message;
	for (size_t k = 0; k < b->req.n_keys; k++) {
		struct agent_item *it = &r->items[b->idx[k]];
		int e = err ? err : k < resp->n_errors ? resp->errors[k] : MC_EPROTOCOL;
		it->err = e == 0                                                   ? 1
			  : e == MC_EOBJECT_NOT_FOUND || e == MC_EOBJECT_HAS_LEASE ? 0
										   : e;
		if (e == 0) {
			if (own)
				agent__inv_del(&r->a->inv, it->key, it->klen);
			agent__lcache_del(&r->a->lc, it->key, it->klen);
		}
	}
	keys_reply(r, err);
}

static void op_replica_clear(struct agent_req *r)
{
	const Mooncake__Client__ReplicaClearRequest *q = r->msg->replica_clear;
	struct agent_keys_block *b = keys_block(r, q->keys, q->n_keys);
	if (!b)
		return;
	Mooncake__Master__BatchReplicaClearRequest *mq = malloc(sizeof(*mq));
	if (!mq) {
		agent__op_fail(r, -ENOMEM, NULL);
		return;
	}
	r->mstate2 = mq;
	if (b->req.n_keys == 0) {
		keys_reply(r, 0);
		return;
	}
	mooncake__master__batch_replica_clear_request__init(mq);
	mq->keys = b->req.keys;
	mq->n_keys = b->req.n_keys;
	mq->segment = q->segment; /* borrowed from the request */
	agent__mcall(r->a, "BatchReplicaClear", &mq->base,
		     &mooncake__master__batch_errors_response__descriptor, on_cleared, r);
}

static void op_remove_all(struct agent_req *r)
{
	Mooncake__Master__RemoveAllRequest *q = malloc(sizeof(*q));
	if (!q) {
		agent__op_fail(r, -ENOMEM, NULL);
		return;
	}
	mooncake__master__remove_all_request__init(q);
	q->force = r->msg->remove_all->force;
	agent__op_set_mstate(r, q);
	agent__mcall(r->a, "RemoveAll", &q->base,
		     &mooncake__master__remove_all_response__descriptor, on_removed_all, r);
}

/* ------------------------------------------------------------ stats, release */

static void op_stats(struct agent_req *r)
{
	struct agent *a = r->a;
	Mooncake__Client__StatsReply s = MOONCAKE__CLIENT__STATS_REPLY__INIT;
	s.agent_id = a->name;
	s.segment = a->name;
	s.segment_size = a->seg->len;
	s.hugepages = a->seg->hugepages;
	s.numa_node = a->numa_node;
	s.staging_size = a->staging_bytes;
	agent__server_counts(a, &s.clients, &s.buffers, &s.views);
	agent__server_fold(a);
	s.table_gets = agent__counter(&a->stats, AGENT_C_TABLE_GETS);
	s.puts = agent__counter(&a->stats, AGENT_C_PUTS);
	s.gets = agent__counter(&a->stats, AGENT_C_GETS);
	s.local_hits = agent__counter(&a->stats, AGENT_C_LOCAL_HITS);
	s.remote_hits = agent__counter(&a->stats, AGENT_C_REMOTE_HITS);
	s.misses = agent__counter(&a->stats, AGENT_C_MISSES);
	s.bytes_written = agent__counter(&a->stats, AGENT_C_BYTES_WRITTEN);
	s.bytes_read = agent__counter(&a->stats, AGENT_C_BYTES_READ);
	s.master = (char *)agent__mcall_master(a);
	s.view = agent__mlink_view(a);
	s.inventory = agent__inv_count(&a->inv);
	s.mirror_seq = agent__mirror_seq(a);
	s.resync_bad = agent__counter(&a->stats, AGENT_C_RESYNC_BAD) +
		       agent__counter(&a->stats, AGENT_C_RESYNC_UNCHECKED);
	s.get_bad = agent__counter(&a->stats, AGENT_C_GET_BAD);
	if (agent__tier_on(a)) {
		s.ssd_segment = (char *)agent__tier_name(a);
		s.ssd_size = agent__tier_capacity(a);
		struct ssd_stats st;
		agent__tier_stats(a, &st);
		s.ssd_used = st.used_bytes;
		s.ssd_objects = st.objects;
		s.ssd_reads = st.reads;
		s.ssd_read_ns = st.read_ns;
		s.ssd_writes = st.writes;
		s.ssd_write_ns = st.write_ns;
		s.ssd_hits = agent__counter(&a->stats, AGENT_C_SSD_HITS);
		s.ssd_demotions = agent__counter(&a->stats, AGENT_C_SSD_DEMOTIONS);
		s.ssd_promotions = agent__counter(&a->stats, AGENT_C_SSD_PROMOTIONS);
	}
	Mooncake__Client__Response resp = MOONCAKE__CLIENT__RESPONSE__INIT;
	resp.body_case = MOONCAKE__CLIENT__RESPONSE__BODY_STATS;
	resp.stats = &s;
	agent__reply(r, &resp, NULL, NULL, 0);
	agent__op_finish(r, 0);
}

static void op_release(struct agent_req *r)
{
	struct agent_conn *c = r->c;
	const Mooncake__Client__ReleaseRequest *q = r->msg->release;
	int err = 0;
	for (size_t k = 0; k < q->n_views; k++)
		if (!agent__session_view_drop(c, q->views[k]))
			err = -ENOENT;
	if (q->quiet) {
		if (err)
			log_warn("client %s released a view that is not its own",
				 agent__session_name(c));
		agent__op_finish(r, err);
		return;
	}
	if (err) {
		agent__op_fail(r, err, "no such view in this session");
		return;
	}
	Mooncake__Client__Response resp = MOONCAKE__CLIENT__RESPONSE__INIT;
	agent__reply(r, &resp, NULL, NULL, 0);
	agent__op_finish(r, 0);
}

/* ------------------------------------------------------------ dispatch */

void agent__dispatch(struct agent_req *r)
{
	switch (r->op) {
	case MOONCAKE__CLIENT__REQUEST__OP_HELLO:
		op_hello(r);
		break;
	case MOONCAKE__CLIENT__REQUEST__OP_PUT:
		agent__op_put(r);
		break;
	case MOONCAKE__CLIENT__REQUEST__OP_GET:
		agent__op_get(r);
		break;
	case MOONCAKE__CLIENT__REQUEST__OP_EXIST:
		op_keys(r, false);
		break;
	case MOONCAKE__CLIENT__REQUEST__OP_REMOVE:
		op_keys(r, true);
		break;
	case MOONCAKE__CLIENT__REQUEST__OP_REMOVE_ALL:
		op_remove_all(r);
		break;
	case MOONCAKE__CLIENT__REQUEST__OP_REGISTER_BUFFER:
		agent__op_register_buffer(r);
		break;
	case MOONCAKE__CLIENT__REQUEST__OP_UNREGISTER_BUFFER:
		agent__op_unregister_buffer(r);
		break;
	case MOONCAKE__CLIENT__REQUEST__OP_ALLOC_BUFFER:
		agent__op_alloc_buffer(r);
		break;
	case MOONCAKE__CLIENT__REQUEST__OP_TRANSFER:
		agent__op_transfer(r);
		break;
	case MOONCAKE__CLIENT__REQUEST__OP_STATS:
		op_stats(r);
		break;
	case MOONCAKE__CLIENT__REQUEST__OP_RELEASE:
		op_release(r);
		break;
	case MOONCAKE__CLIENT__REQUEST__OP_ENGINE:
		agent__op_engine(r);
		break;
	case MOONCAKE__CLIENT__REQUEST__OP_REMOVE_REGEX:
		op_remove_regex(r);
		break;
	case MOONCAKE__CLIENT__REQUEST__OP_REPLICA_CLEAR:
		op_replica_clear(r);
		break;
	case MOONCAKE__CLIENT__REQUEST__OP_SEGMENT:
		agent__op_segment(r);
		break;
	case MOONCAKE__CLIENT__REQUEST__OP_REPLICAS:
		op_replicas(r);
		break;
	default:
		agent__op_fail(r, -EOPNOTSUPP, "unknown operation");
		break;
	}
}
