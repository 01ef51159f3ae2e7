/*
 * svc_maint: the Maintenance calls that read the whole state — Hash,
 * HashKV and Snapshot — and Defragment. Served by the member asked, from
 * its applied state, as etcd serves them.
 *
 * Hash, HashKV and Snapshot take a snapshot of the state on the loop
 * (meta__sm_snapshot: the same copy a Raft snapshot takes) and do the rest
 * on a libuv worker thread: decode it into a private store and compute the
 * hash or build the bbolt database of the state (bolt.h), so the loop
 * never spends longer than that copy. Snapshot then streams the database
 * in 32 KiB messages paced by on_drain, each with remaining_bytes, and one
 * last message holding its SHA-256, exactly as etcd's maintenance server
 * does; `etcdctl snapshot save` appends every blob to its file, so the
 * file is the database followed by its SHA-256, which `etcdctl snapshot
 * restore` checks.
 *
 * Defragment answers success at once and does nothing: etcd defragments
 * its bbolt file to give back the pages that deletes and compaction freed;
 * here the store lives in memory (compaction frees its memory at once),
 * the WAL is cut behind every snapshot and snapshot files are written
 * whole, so there are no free pages anywhere to give back.
 *
 * A call that goes away while its work runs is answered by no one; the
 * job is freed when the work completes. The node's stop waits for the
 * work (uv_works) and ends the calls still streaming.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/auth.h"
#include "common/log.h"
#include "common/util.h"
#include "meta/meta_int.h"

#define LOG_SUBSYS LOGS_META

/* etcd's snapshotSendBufferSize. */
#define SNAPSHOT_CHUNK_BYTES (32u * 1024u)
/* Hash, HashKV and Snapshot calls a member serves at once: each holds
 * copies of the whole state (the snapshot, the store decoded from it, the
 * database built), so their number bounds that memory; one more is
 * refused UNAVAILABLE, which etcd's clients retry. */
#define MJOBS_MAX 4
/* A Snapshot whose client takes nothing of it this long ends, so that one
 * that stopped reading does not keep its slot and its copy for good. */
#define SNAPSHOT_STALL_MS 30000

enum mjob_kind { MJ_HASH, MJ_HASH_KV, MJ_SNAPSHOT };

struct meta__mjob {
	struct meta__mjob *next, **pprev;
	struct meta_node *n;
	struct rpc_call *call; /* NULL: the call went away */
	enum mjob_kind kind;
	uv_work_t work;
	bool working;
	Etcdserverpb__ResponseHeader header; /* of every answer */
	/* to the worker */
	uint8_t *snap;
	size_t snap_len;
	struct mvcc_options mo;
	uint64_t applied;
	int64_t rev_arg;
	/* from the worker */
	int rc;
	uint32_t hash;
	int64_t current, compact;
	uint8_t *image;
	size_t image_len, sent;
	uint8_t sha[MC_SHA256_BYTES];
	bool sha_sent;
	uint64_t progress_ms; /* streaming: when its client last took bytes */
};

static void mjob_free(struct meta__mjob *j)
{
	*j->pprev = j->next;
	if (j->next)
		j->next->pprev = j->pprev;
	free(j->snap);
	free(j->image);
	free(j);
}

static void mjob_finish(struct meta__mjob *j, int status, const char *message)
{
	if (j->call) {
		rpc_call_set_data(j->call, NULL);
		rpc_call_finish(j->call, status, message);
		j->call = NULL;
	}
	mjob_free(j);
}

static void mjob_fail(struct meta__mjob *j, int code)
{
	int st;
	const char *msg;
	meta__status_of(code, &st, &msg);
	mjob_finish(j, st, msg);
}

/* ------------------------------------------------------------- the worker */

static int export_fn(void *ctx, const struct bolt_state *st)
{
	struct meta__mjob *j = ctx;
	j->current = mvcc_rev(st->store);
	j->compact = mvcc_compact_rev(st->store);
	switch (j->kind) {
	case MJ_HASH:
		return bolt_hash(st, &j->hash);
	case MJ_HASH_KV:
		return bolt_hash_kv(st->store, j->rev_arg, &j->hash, &j->current, &j->compact);
	case MJ_SNAPSHOT: {
		int rc = bolt_image(st, &j->image, &j->image_len);
		if (!rc)
			mc_sha256(j->image, j->image_len, j->sha);
		return rc;
	}
	}
	return -EINVAL;
}

static void mjob_work(uv_work_t *w)
{
	struct meta__mjob *j = MC_CONTAINER_OF(w, struct meta__mjob, work);
	j->rc = meta__sm_export(j->snap, j->snap_len, &j->mo, j->applied, export_fn, j);
	free(j->snap);
	j->snap = NULL;
}

/* ------------------------------------------------------------- answers */

static int send_or_end(struct meta__mjob *j, const ProtobufCMessage *m)
{
	int rc = rpc_call_send(j->call, m);
	if (rc == MC_ETOO_LARGE)
		mjob_finish(j, RPC_RESOURCE_EXHAUSTED,
			    "etcdserver: response larger than the maximum message size");
	else if (rc)
		mjob_finish(j, rc == -ECANCELED ? RPC_CANCELLED : RPC_INTERNAL,
			    mc_strerror(rc));
	return rc;
}

/* Send snapshot messages while the call drains; finish after the hash. */
static void snapshot_pump(struct meta__mjob *j)
{
	j->progress_ms = mc_now_ms();
	while (j->call && rpc_call_pending_bytes(j->call) < RPC_DRAIN_BYTES) {
		Etcdserverpb__SnapshotResponse r = ETCDSERVERPB__SNAPSHOT_RESPONSE__INIT;
		r.header = &j->header;
		if (j->sent < j->image_len) {
			size_t chunk = j->image_len - j->sent;
			if (chunk > SNAPSHOT_CHUNK_BYTES)
				chunk = SNAPSHOT_CHUNK_BYTES;
			r.blob.data = j->image + j->sent;
			r.blob.len = chunk;
			r.remaining_bytes = j->image_len - j->sent - chunk;
			if (send_or_end(j, &r.base))
				return;
			j->sent += chunk;
			continue;
		}
		r.blob.data = j->sha;
		r.blob.len = sizeof(j->sha);
		if (send_or_end(j, &r.base))
			return;
		log_info("snapshot sent to %s: %zu bytes at revision %lld",
			 rpc_call_peer(j->call), j->image_len, (long long)j->current);
		mjob_finish(j, RPC_OK, NULL);
		return;
	}
}

static void mjob_done(uv_work_t *w, int status)
{
	struct meta__mjob *j = MC_CONTAINER_OF(w, struct meta__mjob, work);
	struct meta_node *n = j->n;

	n->uv_works--;
	j->working = false;
	if (!j->call) {
		mjob_free(j);
		meta__check_stopped(n);
		return;
	}
	int rc = status ? status : j->rc;
	if (rc) {
		if (rc != MVCC_ECOMPACTED && rc != MVCC_EFUTURE_REV)
			log_warn("maintenance call from %s failed: %s", rpc_call_peer(j->call),
				 meta__strerror(rc));
		mjob_fail(j, rc);
	} else if (j->kind == MJ_SNAPSHOT) {
		j->header.revision = j->current;
		snapshot_pump(j);
	} else {
		j->header.revision = j->current;
		if (j->kind == MJ_HASH) {
			Etcdserverpb__HashResponse r = ETCDSERVERPB__HASH_RESPONSE__INIT;
			r.header = &j->header;
			r.hash = j->hash;
			if (!send_or_end(j, &r.base))
				mjob_finish(j, RPC_OK, NULL);
		} else {
			Etcdserverpb__HashKVResponse r = ETCDSERVERPB__HASH_KVRESPONSE__INIT;
			r.header = &j->header;
			r.hash = j->hash;
			r.compact_revision = j->compact;
			if (!send_or_end(j, &r.base))
				mjob_finish(j, RPC_OK, NULL);
		}
	}
	meta__check_stopped(n);
}

/* ------------------------------------------------------------- calls */

static void mjob_start(struct rpc_call *call, enum mjob_kind kind, int64_t rev)
{
	struct meta_node *n = rpc_call_service_data(call);
	struct meta__mjob *j;
	int rc;

	if (n->stopping || n->fatal) {
		rpc_call_finish(call, RPC_UNAVAILABLE, "etcdserver: server stopped");
		return;
	}
	if (!n->running) {
		rpc_call_finish(call, RPC_UNAVAILABLE, "etcdserver: not capable");
		return;
	}
	size_t busy = 0;
	for (j = n->mjobs; j; j = j->next)
		busy++;
	if (busy >= MJOBS_MAX) {
		if (mc_once_per(&n->mjobs_logged_ms, 10000))
			log_warn("refused a %s from %s: %u Hash, HashKV or Snapshot calls at "
				 "once (logged every 10 s at most)",
				 kind == MJ_SNAPSHOT ? "Snapshot"
				 : kind == MJ_HASH   ? "Hash"
						     : "HashKV",
				 rpc_call_peer(call), MJOBS_MAX);
		rpc_call_finish(call, RPC_UNAVAILABLE,
				"etcdserver: too many Hash, HashKV or Snapshot calls at once; "
				"retry later");
		return;
	}
	if (!(j = calloc(1, sizeof(*j)))) {
		rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, "etcdserver: out of memory");
		return;
	}
	j->n = n;
	j->call = call;
	j->kind = kind;
	j->rev_arg = rev;
	j->next = n->mjobs;
	j->pprev = &n->mjobs;
	if (n->mjobs)
		n->mjobs->pprev = &j->next;
	n->mjobs = j;
	rpc_call_set_data(call, j);
	etcdserverpb__response_header__init(&j->header);
	j->header.cluster_id = n->sm.cluster_id;
	j->header.member_id = n->id;
	j->header.raft_term = n->term;
	j->mo = n->sm.mo;
	j->applied = n->applied;
	if ((rc = meta__sm_snapshot(&n->sm, &j->snap, &j->snap_len))) {
		mjob_fail(j, rc);
		return;
	}
	if ((rc = uv_queue_work(n->loop, &j->work, mjob_work, mjob_done))) {
		mjob_fail(j, -ENOMEM);
		return;
	}
	j->working = true;
	n->uv_works++;
}

void meta__on_hash(struct rpc_call *call, const ProtobufCMessage *msg)
{
	(void)msg;
	mjob_start(call, MJ_HASH, 0);
}

void meta__on_hash_kv(struct rpc_call *call, const ProtobufCMessage *msg)
{
	mjob_start(call, MJ_HASH_KV, ((const Etcdserverpb__HashKVRequest *)msg)->revision);
}

void meta__on_snapshot(struct rpc_call *call, const ProtobufCMessage *msg)
{
	(void)msg;
	mjob_start(call, MJ_SNAPSHOT, 0);
}

void meta__on_defragment(struct rpc_call *call, const ProtobufCMessage *msg)
{
	struct meta_node *n = rpc_call_service_data(call);
	Etcdserverpb__DefragmentResponse r = ETCDSERVERPB__DEFRAGMENT_RESPONSE__INIT;
	struct meta__arena a = {0};
	(void)msg;

	if (!(r.header = meta__header(n, &a))) {
		rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, "etcdserver: out of memory");
		return;
	}
	log_info("defragment asked by %s: nothing to do, the store is in memory",
		 rpc_call_peer(call));
	int rc = rpc_call_send(call, &r.base);
	rpc_call_finish(call, rc ? RPC_INTERNAL : RPC_OK, rc ? mc_strerror(rc) : NULL);
	meta__arena_free(&a);
}

void meta__maint_cancel(struct rpc_call *call)
{
	struct meta__mjob *j = rpc_call_data(call);
	rpc_call_set_data(call, NULL);
	rpc_call_finish(call, RPC_CANCELLED, NULL);
	if (!j)
		return;
	j->call = NULL;
	if (!j->working)
		mjob_free(j);
}

void meta__maint_drain(struct rpc_call *call)
{
	struct meta__mjob *j = rpc_call_data(call);
	if (j && j->kind == MJ_SNAPSHOT && !j->working)
		snapshot_pump(j);
}

void meta__maint_tick(struct meta_node *n)
{
	uint64_t now = mc_now_ms();
	for (struct meta__mjob *j = n->mjobs, *next; j; j = next) {
		next = j->next;
		if (j->call && !j->working && j->kind == MJ_SNAPSHOT &&
		    now - j->progress_ms > SNAPSHOT_STALL_MS) {
			log_warn("snapshot to %s: nothing taken for %u s, %zu of %zu bytes "
				 "sent: ending it",
				 rpc_call_peer(j->call), SNAPSHOT_STALL_MS / 1000, j->sent,
				 j->image_len);
			mjob_finish(j, RPC_DEADLINE_EXCEEDED,
				    "etcdserver: the snapshot was not read for 30 s");
		}
	}
}

void meta__maint_close_calls(struct meta_node *n)
{
	struct meta__mjob *j = n->mjobs;
	while (j) {
		struct meta__mjob *next = j->next;
		if (j->call) {
			rpc_call_set_data(j->call, NULL);
			rpc_call_finish(j->call, RPC_UNAVAILABLE,
					"etcdserver: server stopped");
			j->call = NULL;
		}
		if (!j->working)
			mjob_free(j);
		j = next;
	}
}
