/*
 * peer: the meta node's peer transport, service mooncake.raft.Raft on
 * --listen-peer (proto/raft.proto).
 *
 *   Messages         one long-lived client stream per peer carries Batches
 *                    of Raft messages in order; a failed stream is
 *                    reported to the core as "unreachable" and reopened
 *                    with the next message (the RPC client backs off its
 *                    reconnects). A peer that does not drain is dropped
 *                    from rather than buffered without bound.
 *   InstallSnapshot  the leader streams its snapshot file to a lagging
 *                    member in chunks, paced by on_drain; the receiver
 *                    keeps the chunks in memory, then steps the SNAP
 *                    message into its core, which installs it through the
 *                    next ready. The outcome goes back to the sender's
 *                    core (raft_report_snapshot).
 *   Forward          a follower hands a client write (or a leader-only
 *                    call) to the leader and relays the answer.
 *   Members          a member joining with --initial-cluster-state=
 *                    existing learns its ID and the members.
 *
 * Every peer message carries the cluster ID; a mismatch is refused.
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

#define LOG_SUBSYS LOGS_RAFT

#define RAFT_SVC "mooncake.raft.Raft"
#define PEER_QUEUE_LIMIT_BYTES ((size_t)64 << 20)
#define SNAP_CHUNK_BYTES ((size_t)1 << 20)
#define JOIN_TIMEOUT_MS 2000
#define JOIN_RETRY_MS 1000

/* An incoming peer stream, ended at stop. */
struct meta__pcall {
	struct meta__pcall *next, **pprev;
	struct rpc_call *call;
	struct meta_node *n;
	/* InstallSnapshot */
	bool snap;
	struct meta__qmsg *msg;
	uint8_t *buf;
	size_t len, total;
};

/* A snapshot being sent to a peer. */
struct meta__snap_tx {
	struct meta__peer *p;
	uv_work_t work;
	char *path;
	struct meta__qmsg *msg;
	uint8_t *data;
	size_t len, sent;
	int rc;
	struct rpc_stream *st;
	bool ok;
	bool orphan; /* the peer went away while the file was loading */
};

/* ------------------------------------------------------------- peers */

struct meta__peer *meta__peer_find(struct meta_node *n, uint64_t id)
{
	for (size_t i = 0; i < n->n_peers; i++)
		if (n->peers[i]->id == id)
			return n->peers[i];
	return NULL;
}

/* host:port of a peer URL, or -EINVAL. */
static int url_addr(const char *url, char *out, size_t cap)
{
	struct sockaddr_storage ss;
	if (strncmp(url, "http://", 7) == 0)
		url += 7;
	size_t len = strlen(url);
	while (len && url[len - 1] == '/')
		len--;
	if (!len || len >= cap)
		return -EINVAL;
	memcpy(out, url, len);
	out[len] = '\0';
	return mc_parse_hostport(out, &ss) ? -EINVAL : 0;
}

static int peer_client(struct meta_node *n, struct meta__peer *p)
{
	struct rpc_client_opts co = {
		.max_message_bytes = n->o.max_message_bytes,
		.connect_timeout_ms = n->o.election_ms,
		.backoff_initial_ms = n->o.heartbeat_ms,
		.backoff_max_ms = n->o.election_ms,
		.metrics = n->o.metrics,
		.auth_key = n->o.peer_key,
		.auth_key_len = n->o.peer_key_len,
	};
	return rpc_client_new(n->loop, p->addr, &co, &p->cli);
}

static void snap_tx_cancel(struct meta__snap_tx *tx);

/* Drop the connection of p (streams cancelled: no callback runs). */
static void peer_disconnect(struct meta__peer *p)
{
	if (p->msgs) {
		rpc_stream_cancel(p->msgs);
		p->msgs = NULL;
	}
	if (p->snap)
		snap_tx_cancel(p->snap);
	if (p->cli) {
		rpc_client_free(p->cli);
		p->cli = NULL;
	}
}

int meta__peer_set(struct meta_node *n, uint64_t id, const char *url)
{
	char addr[sizeof(((struct meta__peer *)0)->addr)];
	struct meta__peer *p;
	int rc;

	if (id == n->id)
		return 0;
	if ((rc = url_addr(url, addr, sizeof(addr))))
		return rc;
	p = meta__peer_find(n, id);
	if (p && strcmp(p->addr, addr) == 0)
		return 0;
	if (p) {
		log_info("member %016" PRIx64 " moved from %s to %s", id, p->addr, addr);
		peer_disconnect(p);
		snprintf(p->addr, sizeof(p->addr), "%s", addr);
		return n->finishing ? 0 : peer_client(n, p);
	}
	struct meta__peer **v = realloc(n->peers, (n->n_peers + 1) * sizeof(*v));
	if (!v)
		return -ENOMEM;
	n->peers = v;
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->id = id;
	p->node = n;
	snprintf(p->addr, sizeof(p->addr), "%s", addr);
	if (!n->finishing && (rc = peer_client(n, p))) {
		free(p);
		return rc;
	}
	v[n->n_peers++] = p;
	log_debug("peer %016" PRIx64 " at %s", id, addr);
	return 0;
}

/* ------------------------------------------------------------- Messages (out) */

static void msgs_on_message(struct rpc_stream *st, void *ud, const ProtobufCMessage *msg)
{
	(void)st;
	(void)ud;
	(void)msg;
}

static void msgs_on_close(struct rpc_stream *st, void *ud, int status, const char *message)
{
	struct meta__peer *p = ud;
	(void)st;
	p->msgs = NULL;
	if (!p->msgs_failed && status == RPC_UNAUTHENTICATED)
		log_warn("member %016" PRIx64 " (%s) refuses this member's messages: %s (do "
			 "both have the same --cluster-secret-file?)",
			 p->id, p->addr, message ? message : "");
	else if (!p->msgs_failed)
		log_debug("stream to %016" PRIx64 " (%s) closed: %s %s", p->id, p->addr,
			  rpc_status_name(status), message ? message : "");
	p->msgs_failed = true;
	if (status == RPC_PERMISSION_DENIED && message && strstr(message, "removed")) {
		/* A member refused us: we were removed while we could not
		 * hear the change. */
		log_error("member %016" PRIx64
			  " says this member was removed from the cluster",
			  p->id);
		meta__fatal(p->node, META_ESTOPPED, "removed from the cluster");
		return;
	}
	meta__report_unreachable(p->node, p->id);
}

static const struct rpc_stream_cbs msgs_cbs = {
	.on_message = msgs_on_message,
	.on_close = msgs_on_close,
};

static void snap_tx_start(struct meta_node *n, struct meta__peer *p, const struct raft_msg *m);

static void send_batch(struct meta_node *n, struct meta__peer *p, const struct raft_msg *msgs,
		       const size_t *idx, size_t k)
{
	Mooncake__Raft__Batch b = MOONCAKE__RAFT__BATCH__INIT;
	struct meta__arena a = {0};
	Mooncake__Raft__Message **v = NULL;
	int rc;

	if (!p->cli)
		return;
	if (!p->msgs) {
		rc = rpc_client_stream(p->cli, "/" RAFT_SVC "/Messages",
				       &mooncake__raft__ack__descriptor, 0, &msgs_cbs, p,
				       &p->msgs);
		if (rc) {
			meta__report_unreachable(n, p->id);
			return;
		}
	}
	if (rpc_stream_pending_bytes(p->msgs) > PEER_QUEUE_LIMIT_BYTES) {
		/* The peer does not drain: drop (Raft resends what matters). */
		meta__report_unreachable(n, p->id);
		return;
	}
	v = meta__alloc(&a, k * sizeof(*v));
	if (!v)
		goto out;
	for (size_t i = 0; i < k; i++)
		if (!(v[i] = meta__msg_to_pb(&msgs[idx[i]], &a)))
			goto out;
	b.cluster_id = n->sm.cluster_id;
	b.msgs = v;
	b.n_msgs = k;
	rc = rpc_stream_send(p->msgs, &b.base);
	if (rc) {
		rpc_stream_cancel(p->msgs);
		p->msgs = NULL;
		meta__report_unreachable(n, p->id);
	} else {
		p->msgs_failed = false;
	}
out:
	meta__arena_free(&a);
}

void meta__peer_send(struct meta_node *n, const struct raft_msg *msgs, size_t k)
{
	size_t stack_idx[64];
	size_t *idx = k <= MC_ARRAY_LEN(stack_idx) ? stack_idx : malloc(k * sizeof(*idx));
	bool stack_done[64];
	bool *done = k <= MC_ARRAY_LEN(stack_done) ? stack_done : calloc(k, sizeof(*done));

	if (!idx || !done)
		goto out; /* dropped: Raft resends */
	memset(done, 0, k * sizeof(*done));
	for (size_t i = 0; i < k; i++) {
		if (done[i])
			continue;
		uint64_t to = msgs[i].to;
		struct meta__peer *p = meta__peer_find(n, to);
		size_t m = 0;
		for (size_t j = i; j < k; j++) {
			if (done[j] || msgs[j].to != to)
				continue;
			done[j] = true;
			if (msgs[j].type == RAFT_MSG_SNAP) {
				if (p)
					snap_tx_start(n, p, &msgs[j]);
				else
					meta__report_snapshot(n, to, false);
				continue;
			}
			idx[m++] = j;
		}
		if (!m)
			continue;
		if (!p) {
			log_debug("no address for member %016" PRIx64 ": message dropped", to);
			meta__report_unreachable(n, to);
			continue;
		}
		send_batch(n, p, msgs, idx, m);
	}
out:
	if (idx != stack_idx)
		free(idx);
	if (done != stack_done)
		free(done);
}

/* ------------------------------------------------------------- incoming calls */

static struct meta_node *svc_node(struct rpc_call *call)
{
	return rpc_call_service_data(call);
}

static struct meta__pcall *pcall_new(struct rpc_call *call, bool snap)
{
	struct meta_node *n = svc_node(call);
	struct meta__pcall *pc = calloc(1, sizeof(*pc));
	if (!pc)
		return NULL;
	pc->call = call;
	pc->n = n;
	pc->snap = snap;
	pc->next = n->pcalls;
	pc->pprev = &n->pcalls;
	if (n->pcalls)
		n->pcalls->pprev = &pc->next;
	n->pcalls = pc;
	rpc_call_set_data(call, pc);
	return pc;
}

/* Unlink, free and finish the call. */
static void pcall_end(struct meta__pcall *pc, int status, const char *message)
{
	struct rpc_call *call = pc->call;
	*pc->pprev = pc->next;
	if (pc->next)
		pc->next->pprev = pc->pprev;
	rpc_call_set_data(call, NULL);
	free(pc->msg);
	free(pc->buf);
	free(pc);
	rpc_call_finish(call, status, message);
}

static bool cluster_ok(struct meta_node *n, uint64_t cluster_id, struct meta__pcall *pc)
{
	if (!n->running || n->finishing) {
		if (pc)
			pcall_end(pc, RPC_UNAVAILABLE, "member not running");
		return false;
	}
	if (cluster_id == n->sm.cluster_id)
		return true;
	log_warn("refused peer traffic from %s: cluster ID %016" PRIx64
		 ", ours is %016" PRIx64,
		 pc ? rpc_call_peer(pc->call) : "?", cluster_id, n->sm.cluster_id);
	if (pc)
		pcall_end(pc, RPC_FAILED_PRECONDITION, "cluster ID mismatch");
	return false;
}

static void msgs_in_start(struct rpc_call *call)
{
	if (!pcall_new(call, false))
		rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, "out of memory");
}

static void msgs_in_message(struct rpc_call *call, const ProtobufCMessage *msg)
{
	const Mooncake__Raft__Batch *b = (const Mooncake__Raft__Batch *)msg;
	struct meta__pcall *pc = rpc_call_data(call);
	struct meta_node *n = svc_node(call);

	if (!pc || !cluster_ok(n, b->cluster_id, pc))
		return;
	n->last_heard_ms = meta__now(n);
	for (size_t i = 0; i < b->n_msgs; i++) {
		const Mooncake__Raft__Message *pm = b->msgs[i];
		if (pm->type == RAFT_MSG_SNAP)
			continue; /* snapshots come with their data only */
		if (meta__is_removed(&n->sm, pm->from)) {
			pcall_end(pc, RPC_PERMISSION_DENIED,
				  "member removed from the cluster");
			return;
		}
		struct meta__qmsg *q = meta__msg_from_pb(pm);
		if (q)
			meta__step_owned(n, q);
	}
}

static void msgs_in_half_close(struct rpc_call *call)
{
	struct meta__pcall *pc = rpc_call_data(call);
	Mooncake__Raft__Ack ack = MOONCAKE__RAFT__ACK__INIT;
	if (!pc)
		return;
	if (rpc_call_send(call, &ack.base) == 0)
		pcall_end(pc, RPC_OK, NULL);
	else
		pcall_end(pc, RPC_CANCELLED, NULL);
}

static void pcall_on_cancel(struct rpc_call *call)
{
	struct meta__pcall *pc = rpc_call_data(call);
	if (pc)
		pcall_end(pc, RPC_CANCELLED, NULL);
	else
		rpc_call_finish(call, RPC_CANCELLED, NULL);
}

/* ------------------------------------------------------------- InstallSnapshot (in) */

static void snap_in_start(struct rpc_call *call)
{
	if (!pcall_new(call, true))
		rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, "out of memory");
}

static void snap_in_message(struct rpc_call *call, const ProtobufCMessage *msg)
{
	const Mooncake__Raft__SnapshotChunk *c = (const Mooncake__Raft__SnapshotChunk *)msg;
	struct meta__pcall *pc = rpc_call_data(call);
	struct meta_node *n = svc_node(call);
	uint64_t limit = 2 * n->o.quota_backend_bytes + ((uint64_t)64 << 20);

	if (!pc || !cluster_ok(n, c->cluster_id, pc))
		return;
	if (!pc->msg) {
		if (!c->msg || c->msg->type != RAFT_MSG_SNAP || !c->msg->snapshot ||
		    c->total_bytes > limit || c->total_bytes > SIZE_MAX) {
			pcall_end(pc, RPC_INVALID_ARGUMENT, "bad first snapshot chunk");
			return;
		}
		/* One at a time: each gathers up to limit bytes of memory, and
		 * a leader sends a member one snapshot at a time. */
		for (const struct meta__pcall *o = n->pcalls; o; o = o->next)
			if (o != pc && o->buf) {
				pcall_end(pc, RPC_UNAVAILABLE,
					  "busy receiving another snapshot");
				return;
			}
		if (!(pc->msg = meta__msg_from_pb(c->msg)) ||
		    !(pc->buf = malloc(c->total_bytes ? c->total_bytes : 1))) {
			pcall_end(pc, RPC_RESOURCE_EXHAUSTED, "out of memory");
			return;
		}
		pc->total = c->total_bytes;
		log_info("receiving a snapshot at index %" PRIu64
			 " (%zu bytes) from %016" PRIx64,
			 pc->msg->m.snapshot.index, pc->total, pc->msg->m.from);
	}
	if (c->offset != pc->len || c->data.len > pc->total - pc->len) {
		pcall_end(pc, RPC_INVALID_ARGUMENT, "snapshot chunk out of place");
		return;
	}
	if (c->data.len)
		memcpy(pc->buf + pc->len, c->data.data, c->data.len);
	pc->len += c->data.len;
	if (!c->last)
		return;
	if (pc->len != pc->total) {
		pcall_end(pc, RPC_INVALID_ARGUMENT, "snapshot shorter than announced");
		return;
	}
	if (n->in_ready && n->rd.snapshot) {
		pcall_end(pc, RPC_UNAVAILABLE, "busy installing another snapshot");
		return;
	}
	struct meta__recv_snap *rs = calloc(1, sizeof(*rs));
	if (!rs) {
		pcall_end(pc, RPC_RESOURCE_EXHAUSTED, "out of memory");
		return;
	}
	rs->index = pc->msg->m.snapshot.index;
	rs->term = pc->msg->m.snapshot.term;
	rs->data = pc->buf;
	rs->len = pc->len;
	pc->buf = NULL;
	if (n->recv_snap) {
		free(n->recv_snap->data);
		free(n->recv_snap);
	}
	n->recv_snap = rs;
	struct meta__qmsg *q = pc->msg;
	pc->msg = NULL;
	meta__step_owned(n, q);
	Mooncake__Raft__SnapshotResult res = MOONCAKE__RAFT__SNAPSHOT_RESULT__INIT;
	res.ok = true;
	if (rpc_call_send(call, &res.base) == 0)
		pcall_end(pc, RPC_OK, NULL);
	else
		pcall_end(pc, RPC_CANCELLED, NULL);
}

static void snap_in_half_close(struct rpc_call *call)
{
	struct meta__pcall *pc = rpc_call_data(call);
	if (pc)
		pcall_end(pc, RPC_INVALID_ARGUMENT, "snapshot stream ended early");
}

/* ------------------------------------------------------------- InstallSnapshot (out) */

static void snap_tx_free(struct meta__snap_tx *tx)
{
	free(tx->path);
	free(tx->msg);
	free(tx->data);
	free(tx);
}

static void snap_tx_finish(struct meta__snap_tx *tx, bool ok)
{
	struct meta__peer *p = tx->p;
	struct meta_node *n = p->node;
	if (ok) {
		metric_inc(n->m_snap_sent);
		log_info("snapshot at index %" PRIu64 " sent to %016" PRIx64 " (%zu bytes)",
			 tx->msg->m.snapshot.index, p->id, tx->len);
	} else {
		log_warn("sending the snapshot at index %" PRIu64 " to %016" PRIx64 " failed",
			 tx->msg->m.snapshot.index, p->id);
	}
	p->snap = NULL;
	meta__report_snapshot(n, p->id, ok);
	snap_tx_free(tx);
}

static void snap_tx_pump(struct meta__snap_tx *tx)
{
	struct meta__arena a = {0};
	Mooncake__Raft__SnapshotChunk c = MOONCAKE__RAFT__SNAPSHOT_CHUNK__INIT;
	struct meta_node *n = tx->p->node;

	while (tx->st && tx->sent <= tx->len &&
	       rpc_stream_pending_bytes(tx->st) < RPC_DRAIN_BYTES) {
		size_t chunk = tx->len - tx->sent;
		if (chunk > SNAP_CHUNK_BYTES)
			chunk = SNAP_CHUNK_BYTES;
		mooncake__raft__snapshot_chunk__init(&c);
		c.cluster_id = n->sm.cluster_id;
		c.offset = tx->sent;
		c.data.data = tx->data + tx->sent;
		c.data.len = chunk;
		c.total_bytes = tx->len;
		c.last = tx->sent + chunk == tx->len;
		if (tx->sent == 0 && !(c.msg = meta__msg_to_pb(&tx->msg->m, &a))) {
			rpc_stream_cancel(tx->st);
			tx->st = NULL;
			break;
		}
		int rc = rpc_stream_send(tx->st, &c.base);
		meta__arena_free(&a);
		if (rc) {
			rpc_stream_cancel(tx->st);
			tx->st = NULL;
			break;
		}
		tx->sent += chunk;
		if (c.last) {
			if (rpc_stream_close_send(tx->st)) {
				rpc_stream_cancel(tx->st);
				tx->st = NULL;
			}
			tx->sent = tx->len + 1; /* everything is out */
			return;
		}
	}
	if (!tx->st)
		snap_tx_finish(tx, false);
}

static void snap_out_message(struct rpc_stream *st, void *ud, const ProtobufCMessage *msg)
{
	struct meta__snap_tx *tx = ud;
	(void)st;
	tx->ok = ((const Mooncake__Raft__SnapshotResult *)msg)->ok;
}

static void snap_out_close(struct rpc_stream *st, void *ud, int status, const char *message)
{
	struct meta__snap_tx *tx = ud;
	(void)st;
	tx->st = NULL;
	if (status != RPC_OK)
		log_warn("snapshot stream to %016" PRIx64 ": %s %s", tx->p->id,
			 rpc_status_name(status), message ? message : "");
	snap_tx_finish(tx, status == RPC_OK && tx->ok);
}

static void snap_out_drain(struct rpc_stream *st, void *ud)
{
	(void)st;
	struct meta__snap_tx *tx = ud;
	if (tx->sent <= tx->len)
		snap_tx_pump(tx);
}

static const struct rpc_stream_cbs snap_cbs = {
	.on_message = snap_out_message,
	.on_close = snap_out_close,
	.on_drain = snap_out_drain,
};

static void snap_load_work(uv_work_t *w)
{
	struct meta__snap_tx *tx = MC_CONTAINER_OF(w, struct meta__snap_tx, work);
	tx->rc = meta__snap_load(tx->path, &tx->data, &tx->len);
}

static void snap_load_done(uv_work_t *w, int status)
{
	struct meta__snap_tx *tx = MC_CONTAINER_OF(w, struct meta__snap_tx, work);
	struct meta__peer *p = tx->p;
	struct meta_node *n = p->node;
	int rc;

	n->uv_works--;
	if (tx->orphan) {
		snap_tx_free(tx);
		meta__check_stopped(n);
		return;
	}
	meta__check_stopped(n);
	if (status || tx->rc || !p->cli) {
		log_warn("cannot read %s to send it: %s", tx->path,
			 mc_strerror(status   ? status
				     : tx->rc ? tx->rc
					      : -ESHUTDOWN));
		snap_tx_finish(tx, false);
		return;
	}
	rc = rpc_client_stream(p->cli, "/" RAFT_SVC "/InstallSnapshot",
			       &mooncake__raft__snapshot_result__descriptor, 0, &snap_cbs, tx,
			       &tx->st);
	if (rc) {
		snap_tx_finish(tx, false);
		return;
	}
	log_info("sending the snapshot at index %" PRIu64 " (%zu bytes) to %016" PRIx64,
		 tx->msg->m.snapshot.index, tx->len, p->id);
	snap_tx_pump(tx);
}

static void snap_tx_start(struct meta_node *n, struct meta__peer *p, const struct raft_msg *m)
{
	struct meta__snap_tx *tx;

	if (p->snap || !p->cli)
		return; /* one at a time; the core waits for the report */
	tx = calloc(1, sizeof(*tx));
	if (!tx)
		goto fail;
	tx->p = p;
	tx->msg = meta__msg_copy(m);
	size_t plen = strlen(n->snap_dir) + 48;
	tx->path = malloc(plen);
	if (!tx->msg || !tx->path)
		goto fail;
	snprintf(tx->path, plen, "%s/%016" PRIx64 "-%016" PRIx64 ".snap", n->snap_dir,
		 m->snapshot.index, m->snapshot.term);
	if (uv_queue_work(n->loop, &tx->work, snap_load_work, snap_load_done))
		goto fail;
	n->uv_works++;
	p->snap = tx;
	return;
fail:
	if (tx)
		snap_tx_free(tx);
	meta__report_snapshot(n, p->id, false);
}

/* Stop sending: no callback of the stream runs afterwards. A file still
 * loading is freed when the load completes. */
static void snap_tx_cancel(struct meta__snap_tx *tx)
{
	struct meta__peer *p = tx->p;
	p->snap = NULL;
	if (!p->node->finishing)
		meta__report_snapshot(p->node, p->id, false);
	if (tx->st) {
		rpc_stream_cancel(tx->st);
		tx->st = NULL;
		snap_tx_free(tx);
	} else {
		tx->orphan = true;
	}
}

/* ------------------------------------------------------------- Forward */

static void forward_answer(void *ud, int status, const char *message,
			   const ProtobufCMessage *resp)
{
	struct meta__op *op = ud;
	struct meta_node *n = op->node;
	const Mooncake__Meta__ForwardResponse *fr = (const void *)resp;

	if (status == RPC_OK && fr->status == RPC_OK) {
		ProtobufCMessage *m = protobuf_c_message_unpack(meta__methods[op->method].resp,
								NULL, fr->response.len,
								fr->response.data);
		if (!m) {
			meta__op_done(op, RPC_INTERNAL, "bad response from the leader", NULL);
			return;
		}
		if (n)
			meta__stamp_headers(n, m);
		meta__op_done(op, RPC_OK, NULL, m);
		protobuf_c_message_free_unpacked(m, NULL);
		return;
	}
	if (status == RPC_OK) {
		/* The leader refused before doing anything: safe to retry. */
		if (n && fr->message &&
		    ((fr->status == RPC_FAILED_PRECONDITION &&
		      strcmp(fr->message, "etcdserver: not leader") == 0) ||
		     (fr->status == RPC_UNAVAILABLE &&
		      strcmp(fr->message, "etcdserver: server stopped") == 0))) {
			/* not the leader any more, or handing leadership over
			 * before it stops: the next leader gets it */
			meta__wait_leader(n, op);
			return;
		}
		meta__op_done(op, (int)fr->status, fr->message, NULL);
		return;
	}
	if (status == RPC_CANCELLED && n && (n->stopping || n->fatal)) {
		meta__op_fail(op, META_ESTOPPED);
		return;
	}
	if (status == RPC_DEADLINE_EXCEEDED) {
		meta__op_fail(op, META_ETIMEOUT);
		return;
	}
	/* The connection failed: a read or leader-only call may be retried
	 * with whoever leads next; a write may or may not have happened. */
	if (n && op->kind != META_K_WRITE && op->kind != META_K_CONF) {
		meta__wait_leader(n, op);
		return;
	}
	meta__op_fail(op, META_ETIMEOUT_CONN_LOST);
}

void meta__peer_forward(struct meta_node *n, struct meta__op *op)
{
	struct meta__peer *p = meta__peer_find(n, op->fwd_leader);
	Mooncake__Meta__ForwardRequest q = MOONCAKE__META__FORWARD_REQUEST__INIT;
	uint64_t now = meta__now(n);
	int rc;

	if (!p || !p->cli) {
		meta__wait_leader(n, op);
		return;
	}
	q.cluster_id = n->sm.cluster_id;
	q.from = n->id;
	q.method = (char *)meta__methods[op->method].name;
	q.request.data = op->req;
	q.request.len = op->req_len;
	rc = rpc_client_unary(p->cli, "/" RAFT_SVC "/Forward", &q.base,
			      &mooncake__meta__forward_response__descriptor,
			      op->deadline_ms > now ? op->deadline_ms - now : 1,
			      forward_answer, op, NULL);
	if (rc)
		meta__op_fail(op, rc == -ENOMEM ? -ENOMEM : META_ETIMEOUT_CONN_LOST);
}

static void fwd_done(struct meta__op *op, int status, const char *message,
		     const ProtobufCMessage *resp)
{
	struct rpc_call *call = op->ud;
	Mooncake__Meta__ForwardResponse fr = MOONCAKE__META__FORWARD_RESPONSE__INIT;
	uint8_t *buf = NULL;

	if (!call)
		return; /* the follower gave up */
	rpc_call_set_data(call, NULL);
	fr.status = (uint32_t)status;
	fr.message = (char *)(message ? message : "");
	if (status == RPC_OK && resp) {
		fr.response.len = protobuf_c_message_get_packed_size(resp);
		buf = malloc(fr.response.len ? fr.response.len : 1);
		if (!buf) {
			rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, "out of memory");
			return;
		}
		protobuf_c_message_pack(resp, buf);
		fr.response.data = buf;
	}
	int rc = rpc_call_send(call, &fr.base);
	free(buf);
	rpc_call_finish(call, rc ? RPC_INTERNAL : RPC_OK, rc ? mc_strerror(rc) : NULL);
}

static void fwd_on_message(struct rpc_call *call, const ProtobufCMessage *msg)
{
	const Mooncake__Meta__ForwardRequest *q = (const void *)msg;
	struct meta_node *n = svc_node(call);
	int m = meta__method_by_name(q->method);

	if (q->cluster_id != n->sm.cluster_id) {
		rpc_call_finish(call, RPC_FAILED_PRECONDITION, "cluster ID mismatch");
		return;
	}
	if (!n->running || n->finishing || n->stopping) {
		/* A definite answer (nothing was done), so the follower can
		 * hand the request to the next leader. */
		Mooncake__Meta__ForwardResponse fr = MOONCAKE__META__FORWARD_RESPONSE__INIT;
		fr.status = RPC_UNAVAILABLE;
		fr.message = "etcdserver: server stopped";
		int rc = rpc_call_send(call, &fr.base);
		rpc_call_finish(call, rc ? RPC_UNAVAILABLE : RPC_OK, rc ? fr.message : NULL);
		return;
	}
	if (m < 0) {
		rpc_call_finish(call, RPC_UNIMPLEMENTED, "unknown method");
		return;
	}
	uint64_t deadline = rpc_call_deadline_ms(call);
	struct meta__op *op = meta__op_new_raw(n, (enum meta__method)m, q->request.data,
					       q->request.len, deadline, fwd_done, call);
	if (!op) {
		rpc_call_finish(call, RPC_INVALID_ARGUMENT, "bad forwarded request");
		return;
	}
	op->forwarded = true;
	rpc_call_set_data(call, op);
	meta__submit(n, op);
}

static void fwd_on_cancel(struct rpc_call *call)
{
	struct meta__op *op = rpc_call_data(call);
	if (op)
		op->ud = NULL;
	rpc_call_set_data(call, NULL);
	rpc_call_finish(call, RPC_CANCELLED, NULL);
}

/* ------------------------------------------------------------- Members */

static void members_on_message(struct rpc_call *call, const ProtobufCMessage *msg)
{
	struct meta_node *n = svc_node(call);
	Mooncake__Meta__MembersResponse resp = MOONCAKE__META__MEMBERS_RESPONSE__INIT;
	Mooncake__Meta__Member *blk = NULL;
	Mooncake__Meta__Member **v = NULL;
	(void)msg;

	if (!n->running || n->finishing) {
		rpc_call_finish(call, RPC_UNAVAILABLE, "member not running");
		return;
	}
	blk = calloc(n->sm.n_members + 1, sizeof(*blk));
	v = calloc(n->sm.n_members + 1, sizeof(*v));
	if (!blk || !v) {
		free(blk);
		free(v);
		rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, "out of memory");
		return;
	}
	for (size_t i = 0; i < n->sm.n_members; i++) {
		struct meta__member *m = &n->sm.members[i];
		mooncake__meta__member__init(&blk[i]);
		blk[i].id = m->id;
		blk[i].name = m->name;
		blk[i].learner = m->learner;
		blk[i].peer_urls = &m->peer_url;
		blk[i].n_peer_urls = *m->peer_url ? 1 : 0;
		blk[i].client_urls = &m->client_url;
		blk[i].n_client_urls = *m->client_url ? 1 : 0;
		v[i] = &blk[i];
	}
	resp.cluster_id = n->sm.cluster_id;
	resp.members = v;
	resp.n_members = n->sm.n_members;
	resp.leader = n->leader;
	int rc = rpc_call_send(call, &resp.base);
	free(blk);
	free(v);
	rpc_call_finish(call, rc ? RPC_INTERNAL : RPC_OK, NULL);
}

static void join_ask(struct meta_node *n);

static void on_join_timer(uv_timer_t *t)
{
	struct meta_node *n = MC_CONTAINER_OF(t, struct meta_node, join_timer);
	join_ask(n);
}

void meta__peer_join_later(struct meta_node *n)
{
	if (n->handles_open && !n->stopping)
		uv_timer_start(&n->join_timer, on_join_timer, JOIN_RETRY_MS, 0);
}

static void join_answer(void *ud, int status, const char *message,
			const ProtobufCMessage *resp)
{
	struct meta_node *n = ud;
	if (status != RPC_OK) {
		/* (Said once: the members are asked again every second.) */
		if (status == RPC_UNAUTHENTICATED && !n->join_refused)
			log_warn("join: a member refuses this one: %s (do both have the same "
				 "--cluster-secret-file?)",
				 message ? message : "");
		else
			log_debug("join: %s did not answer: %s %s",
				  n->join_cli ? "member" : "?", rpc_status_name(status),
				  message ? message : "");
		n->join_refused |= status == RPC_UNAUTHENTICATED;
		if (status == RPC_CANCELLED)
			return; /* closing */
		join_ask(n);
		return;
	}
	meta__join_done(n, 0, (const Mooncake__Meta__MembersResponse *)resp);
	if (n->running && n->join_cli) {
		rpc_client_free(n->join_cli);
		n->join_cli = NULL;
	}
}

/* Ask the next member of --initial-cluster (other than us). */
static void join_ask(struct meta_node *n)
{
	const char *spec = n->initial_cluster;
	size_t k = 0, want = n->join_next;
	char addr[72];

	if (n->running || n->stopping)
		return;
	if (n->join_cli) {
		rpc_client_free(n->join_cli);
		n->join_cli = NULL;
	}
	/* Walk the list to entry number join_next, skipping ourselves. */
	for (const char *p = spec; p && *p;) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		const char *eq = memchr(p, '=', len);
		if (eq) {
			char url[96];
			size_t ul = len - (size_t)(eq + 1 - p);
			if (ul < sizeof(url)) {
				memcpy(url, eq + 1, ul);
				url[ul] = '\0';
				if (url_addr(url, addr, sizeof(addr)) == 0 &&
				    strcmp(addr, n->self_peer_url + 7) != 0) {
					if (k++ == want)
						break;
				}
			}
		}
		addr[0] = '\0';
		p = end ? end + 1 : NULL;
	}
	if (!addr[0] || k == 0) {
		n->join_next = 0;
		if (k == 0 && !want) {
			log_error("join: --initial-cluster names no other member to ask");
			meta__fatal(n, MC_ECONFIG, "cannot join an existing cluster");
			return;
		}
		meta__peer_join_later(n);
		return;
	}
	n->join_next++;
	struct rpc_client_opts co = {.connect_timeout_ms = JOIN_TIMEOUT_MS,
				     .metrics = n->o.metrics,
				     .auth_key = n->o.peer_key,
				     .auth_key_len = n->o.peer_key_len};
	Mooncake__Meta__MembersRequest q = MOONCAKE__META__MEMBERS_REQUEST__INIT;
	q.peer_url = n->self_peer_url;
	if (rpc_client_new(n->loop, addr, &co, &n->join_cli) ||
	    rpc_client_unary(n->join_cli, "/" RAFT_SVC "/Members", &q.base,
			     &mooncake__meta__members_response__descriptor, JOIN_TIMEOUT_MS,
			     join_answer, n, NULL)) {
		meta__peer_join_later(n);
		return;
	}
	log_info("join: asking %s for this member's ID", addr);
}

void meta__peer_join(struct meta_node *n)
{
	n->join_next = 0;
	join_ask(n);
}

static void probe_answer(void *ud, int status, const char *message,
			 const ProtobufCMessage *resp)
{
	struct meta_node *n = ud;
	const Mooncake__Meta__MembersResponse *r = (const void *)resp;
	(void)message;

	n->probing = false;
	if (status != RPC_OK || n->fatal || n->finishing)
		return;
	if (r->cluster_id != n->sm.cluster_id)
		return;
	for (size_t i = 0; i < r->n_members; i++)
		if (r->members[i]->id == n->id)
			return;
	log_error("the cluster's member list no longer has this member (%016" PRIx64 ")",
		  n->id);
	meta__fatal(n, META_ESTOPPED, "removed from the cluster");
}

void meta__peer_probe(struct meta_node *n)
{
	Mooncake__Meta__MembersRequest q = MOONCAKE__META__MEMBERS_REQUEST__INIT;

	if (n->probing || !n->n_peers || n->finishing)
		return;
	struct meta__peer *p = n->peers[n->probe_next++ % n->n_peers];
	if (!p->cli)
		return;
	q.peer_url = n->self_peer_url;
	if (rpc_client_unary(p->cli, "/" RAFT_SVC "/Members", &q.base,
			     &mooncake__meta__members_response__descriptor, n->o.election_ms,
			     probe_answer, n, NULL) == 0)
		n->probing = true;
}

/* ------------------------------------------------------------- service */

static const struct rpc_method raft_methods[] = {
	{.name = "Messages",
	 .kind = RPC_CLIENT_STREAMING,
	 .request = &mooncake__raft__batch__descriptor,
	 .response = &mooncake__raft__ack__descriptor,
	 .on_start = msgs_in_start,
	 .on_message = msgs_in_message,
	 .on_half_close = msgs_in_half_close,
	 .on_cancel = pcall_on_cancel},
	{.name = "InstallSnapshot",
	 .kind = RPC_CLIENT_STREAMING,
	 .request = &mooncake__raft__snapshot_chunk__descriptor,
	 .response = &mooncake__raft__snapshot_result__descriptor,
	 .on_start = snap_in_start,
	 .on_message = snap_in_message,
	 .on_half_close = snap_in_half_close,
	 .on_cancel = pcall_on_cancel},
	{.name = "Forward",
	 .kind = RPC_UNARY,
	 .request = &mooncake__meta__forward_request__descriptor,
	 .response = &mooncake__meta__forward_response__descriptor,
	 .on_message = fwd_on_message,
	 .on_cancel = fwd_on_cancel},
	{.name = "Members",
	 .kind = RPC_UNARY,
	 .request = &mooncake__meta__members_request__descriptor,
	 .response = &mooncake__meta__members_response__descriptor,
	 .on_message = members_on_message},
};

int meta__peer_service_add(struct meta_node *n)
{
	if (!n->o.peer_srv)
		return 0;
	return rpc_server_add_service(n->o.peer_srv, RAFT_SVC, raft_methods,
				      MC_ARRAY_LEN(raft_methods), n);
}

void meta__peer_close_all(struct meta_node *n)
{
	while (n->pcalls)
		pcall_end(n->pcalls, RPC_UNAVAILABLE, "member stopping");
	for (size_t i = 0; i < n->n_peers; i++)
		peer_disconnect(n->peers[i]);
	if (n->join_cli) {
		rpc_client_free(n->join_cli);
		n->join_cli = NULL;
	}
}

void meta__peer_free_all(struct meta_node *n)
{
	for (size_t i = 0; i < n->n_peers; i++) {
		peer_disconnect(n->peers[i]);
		free(n->peers[i]);
	}
	free(n->peers);
	n->peers = NULL;
	n->n_peers = 0;
	if (n->join_cli) {
		rpc_client_free(n->join_cli);
		n->join_cli = NULL;
	}
}
