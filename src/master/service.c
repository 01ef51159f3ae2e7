/*
 * service: the mooncake.master.Master RPC handlers — protobuf in, core
 * call, protobuf out. Every handler is synchronous (the core never
 * blocks) and runs on the loop thread. A standby answers every call with
 * UNAVAILABLE naming the leader. Unary failures carry the error code at
 * the start of grpc-message ("-705 object already exists: key 'k'");
 * batch calls answer OK with one code per item. See proto/master.proto.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/pb.h"
#include "common/util.h"
#include "master.pb-c.h"
#include "master/master.h"
#include "master/master_int.h"
#include "rpc/rpc.h"

#define LOG_SUBSYS LOGS_MASTER

#define KEY_SHOWN_BYTES 64

int master__rpc_status(int err)
{
	switch (err) {
	case 0:
		return RPC_OK;
	case MC_EOBJECT_NOT_FOUND:
	case MC_ESEGMENT_NOT_FOUND:
		return RPC_NOT_FOUND;
	case MC_EOBJECT_ALREADY_EXISTS:
	case -EEXIST:
		return RPC_ALREADY_EXISTS;
	case MC_EOBJECT_HAS_LEASE:
	case MC_EINVALID_REPLICA:
		return RPC_FAILED_PRECONDITION;
	case MC_ENO_SPACE:
	case -ENOMEM:
	case MC_ETOO_LARGE:
		return RPC_RESOURCE_EXHAUSTED;
	case MC_ETOO_FEW_SEGMENTS:
		return RPC_FAILED_PRECONDITION;
	case -EINVAL:
		return RPC_INVALID_ARGUMENT;
	case -EACCES:
		return RPC_PERMISSION_DENIED;
	case MC_ENOT_LEADER:
	case MC_EUNAVAILABLE:
	case MC_ESHUTDOWN:
		return RPC_UNAVAILABLE;
	default:
		return RPC_INTERNAL;
	}
}

/* Printable form of a key for messages: bytes outside 0x20-0x7e as \xNN,
 * at most KEY_SHOWN_BYTES of the key. */
static void show_key(char *out, size_t outlen, const uint8_t *key, size_t klen)
{
	size_t o = 0;
	for (size_t i = 0; i < klen && i < KEY_SHOWN_BYTES && o + 5 < outlen; i++) {
		if (key[i] >= 0x20 && key[i] < 0x7f && key[i] != '\'')
			out[o++] = (char)key[i];
		else
			o += (size_t)snprintf(out + o, outlen - o, "\\x%02x", key[i]);
	}
	if (klen > KEY_SHOWN_BYTES && o + 4 < outlen) {
		memcpy(out + o, "...", 3);
		o += 3;
	}
	out[o] = '\0';
}

/* End the call with err's gRPC status and "CODE TEXT[: DETAIL]". */
static void finish_err(struct rpc_call *call, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void finish_err(struct rpc_call *call, int err, const char *fmt, ...)
{
	char msg[512];
	int n = snprintf(msg, sizeof(msg), "%d %s", err, mc_strerror(err));
	if (fmt && n > 0 && (size_t)n + 2 < sizeof(msg)) {
		va_list ap;
		va_start(ap, fmt);
		msg[n++] = ':';
		msg[n++] = ' ';
		vsnprintf(msg + n, sizeof(msg) - (size_t)n, fmt, ap);
		va_end(ap);
	}
	rpc_call_finish(call, master__rpc_status(err), msg);
}

/* A batch call's items are handled in one turn of the loop: past
 * MASTER_MAX_BATCH_ITEMS (65536, some tens of ms) a call is refused
 * rather than hold every other call for seconds (a 64 MiB batch of short
 * keys is millions) and then, likely, fail to fit its answer. Our agents
 * send at most 8192 (batches) and 1000 (inventories). True after
 * answering. */
static bool batch_too_large(struct rpc_call *call, size_t n)
{
	if (n <= MASTER_MAX_BATCH_ITEMS)
		return false;
	finish_err(call, -EINVAL, "%zu items in one call, at most %u: split the batch", n,
		   MASTER_MAX_BATCH_ITEMS);
	return true;
}

static void finish_key_err(struct rpc_call *call, int err, ProtobufCBinaryData key)
{
	char k[KEY_SHOWN_BYTES * 4 + 8];
	show_key(k, sizeof(k), key.data, key.len);
	finish_err(call, err, "key '%s'", k);
}

void master__reply(struct rpc_call *call, const ProtobufCMessage *msg)
{
	int rc = rpc_call_send(call, msg);
	if (rc == 0)
		rpc_call_finish(call, RPC_OK, NULL);
	else if (rc == MC_ETOO_LARGE)
		finish_err(call, MC_ETOO_LARGE,
			   "reply larger than --rpc-max-message-size; use smaller batches");
	else
		finish_err(call, rc, NULL);
}

struct master *master__leader_of(struct rpc_call *call)
{
	struct master *m = rpc_call_service_data(call);
	if (m->leader && !m->stopping)
		return m;
	master__finish_not_leader(m, call);
	return NULL;
}

void master__finish_not_leader(struct master *m, struct rpc_call *call)
{
	char msg[320];
	snprintf(msg, sizeof(msg), "%d %s: leader=%s view=%llu", MC_ENOT_LEADER,
		 mc_strerror(MC_ENOT_LEADER), *m->leader_addr ? m->leader_addr : "none",
		 (unsigned long long)m->view);
	rpc_call_finish(call, RPC_UNAVAILABLE, msg);
}

static uint64_t now_ms(const struct master *m)
{
	return uv_now(m->loop);
}

/* Fill r from replica i of o. */
static void fill_replica(const struct master *m, const struct master_obj *o, unsigned i,
			 Mooncake__Master__Replica *r)
{
	const struct master_seg *s = master__seg(m->core, o->rep[i].seg);
	mooncake__master__replica__init(r);
	r->segment = s->name;
	r->offset = o->rep[i].offset;
	r->address = s->base + o->rep[i].offset;
	r->size = o->size;
	r->state = o->rep[i].state == MASTER_REP_COMPLETE
			   ? MOONCAKE__MASTER__REPLICA_STATE__REPLICA_COMPLETE
			   : MOONCAKE__MASTER__REPLICA_STATE__REPLICA_PENDING;
	r->tier = s->tier == MASTER_TIER_SSD ? MOONCAKE__MASTER__TIER__TIER_SSD
					     : MOONCAKE__MASTER__TIER__TIER_DRAM;
	r->agent_id = s->agent->id;
}

/* ------------------------------------------------------------ segments */

static void on_mount(struct rpc_call *call, const ProtobufCMessage *msg)
{
	struct master *m = master__leader_of(call);
	const Mooncake__Master__MountSegmentRequest *req = (const void *)msg;
	if (!m)
		return;
	const Mooncake__Master__Segment *s = req->segment;
	if (!s) {
		finish_err(call, -EINVAL, "no segment");
		return;
	}
	Mooncake__Master__MountSegmentResponse resp =
		MOONCAKE__MASTER__MOUNT_SEGMENT_RESPONSE__INIT;
	bool ssd = s->tier == MOONCAKE__MASTER__TIER__TIER_SSD;
	struct master_mount mt = {
		.name = s->name,
		.agent = s->agent_id,
		.tier = ssd ? MASTER_TIER_SSD : MASTER_TIER_DRAM,
		.base = s->base_address,
		.size = s->size,
		.block_bytes = s->block_bytes,
		.high_watermark = s->high_watermark,
		.eviction_ratio = s->eviction_ratio,
		.resync = req->resync,
		.instance = req->instance.data,
		.instance_len = req->instance.len,
		.previous = req->previous_instance.data,
		.previous_len = req->previous_instance.len,
	};
	uint64_t restarted = master__core_counters(m->core)->agents_restarted;
	int rc = master__mount_seg(m->core, &mt, now_ms(m), &resp.mirror_seq);
	uint32_t held = rc == -EEXIST ? master__seg_find(m->core, s->name) : MASTER_NO_SEGMENT;
	if (held != MASTER_NO_SEGMENT) {
		const struct master_seg *h = master__seg(m->core, held);
		finish_err(call, rc,
			   "segment '%s' is mounted by agent %s (%llu bytes at 0x%llx): "
			   "refused until that agent misses --agent-ttl of heartbeats, or "
			   "at once for its restart on the same --data-dir (another "
			   "process, or two agents with one --agent-name?)",
			   s->name, h->agent->id, (unsigned long long)h->size,
			   (unsigned long long)h->base);
		return;
	}
	master__reap_kick(m, MASTER_NO_SEGMENT); /* (a restarted agent's segments went) */
	if (rc) {
		finish_err(call, rc, "segment '%s'", s->name);
		return;
	}
	if (master__core_counters(m->core)->agents_restarted != restarted)
		log_info("agent %s restarted (its mount names the process before it on its "
			 "data dir): the old process's segments and their replicas dropped",
			 s->agent_id);
	if (ssd)
		log_info(
			"segment %s mounted by agent %s: %llu bytes of SSD in blocks of %llu%s",
			s->name, s->agent_id, (unsigned long long)s->size,
			(unsigned long long)(s->block_bytes ? s->block_bytes
							    : MASTER_ALLOC_GRANULE),
			req->resync ? " (re-sync)" : "");
	else
		log_info("segment %s mounted by agent %s: %llu bytes at 0x%llx%s", s->name,
			 s->agent_id, (unsigned long long)s->size,
			 (unsigned long long)s->base_address, req->resync ? " (re-sync)" : "");
	resp.view = m->view;
	resp.lease_epoch =
		master__seg(m->core, master__seg_find(m->core, s->name))->lease_epoch;
	master__reply(call, &resp.base);
}

static void on_unmount(struct rpc_call *call, const ProtobufCMessage *msg)
{
	struct master *m = master__leader_of(call);
	const Mooncake__Master__UnmountSegmentRequest *req = (const void *)msg;
	if (!m)
		return;
	Mooncake__Master__UnmountSegmentResponse resp =
		MOONCAKE__MASTER__UNMOUNT_SEGMENT_RESPONSE__INIT;
	uint32_t slot;
	int rc = master__unmount(m->core, req->name, req->agent_id, &slot,
				 &resp.replicas_dropped);
	if (rc) {
		finish_err(call, rc, "segment '%s'", req->name);
		return;
	}
	/* (a segment the first slice covers is counted whole here: the
	 * reaper's log line says what a larger one removed in the end) */
	resp.objects_removed = master__reap_kick(m, slot);
	log_info("segment %s unmounted by agent %s: %llu replicas dropped", req->name,
		 req->agent_id, (unsigned long long)resp.replicas_dropped);
	master__reply(call, &resp.base);
}

static void on_heartbeat(struct rpc_call *call, const ProtobufCMessage *msg)
{
	struct master *m = master__leader_of(call);
	const Mooncake__Master__HeartbeatRequest *req = (const void *)msg;
	if (!m)
		return;
	if (batch_too_large(call, req->n_inventory))
		return;
	uint64_t now = now_ms(m);
	Mooncake__Master__HeartbeatResponse resp = MOONCAKE__MASTER__HEARTBEAT_RESPONSE__INIT;
	bool known = master__heartbeat(m->core, req->agent_id, now);
	uint32_t *skipped = NULL;
	if (req->n_inventory && !(skipped = malloc(req->n_inventory * sizeof(*skipped)))) {
		finish_err(call, -ENOMEM, NULL);
		return;
	}
	for (size_t i = 0; i < req->n_inventory; i++) {
		const Mooncake__Master__InventoryItem *it = req->inventory[i];
		struct master_inv_item item = {
			.key = it->key.data,
			.klen = it->key.len,
			.segment = it->segment,
			.offset = it->offset,
			.size = it->size,
			.soft_pin = it->soft_pin,
			.has_crc = it->checksummed,
			.crc = it->crc32c,
		};
		int rc = master__inventory_add(m->core, req->agent_id, &item, now);
		if (rc == 0)
			resp.items_accepted++;
		else
			skipped[resp.n_skipped_items++] = (uint32_t)i;
	}
	resp.items_skipped = resp.n_skipped_items;
	resp.skipped_items = skipped;
	if (req->n_inventory || req->inventory_complete)
		log_info("agent %s re-sync: %llu objects accepted, %llu skipped%s",
			 req->agent_id, (unsigned long long)resp.items_accepted,
			 (unsigned long long)resp.items_skipped,
			 req->inventory_complete ? " (complete)" : "");
	if (req->inventory_complete)
		master__inventory_done(m->core, req->agent_id);
	resp.view = m->view;
	resp.resync = !known;
	resp.agent_ttl_ms = m->core_opts.agent_ttl_ms;
	master__reply(call, &resp.base);
	free(skipped);
}

/* ------------------------------------------------------------ puts */

/*
 * A leader that took over from another (view > 1) starts with an empty
 * index and spends its first agent_ttl taking the agents' segments back:
 * each agent sees the leader key change and mounts again, reporting what
 * its segment holds (a segment is "syncing" until the report is done),
 * and an agent that has not come back within agent_ttl is dead anyway.
 * Until then, and while a segment is still reporting, a put that finds
 * no room or too few segments may only be early, so it is answered with
 * MC_EUNAVAILABLE — "try again" (an agent retries a single call until
 * its deadline) — and never with MC_ENO_SPACE, which a client takes as
 * final. *mounted and *syncing count the DRAM segments.
 *
 * A first leader (view 1) is early in the same way while no segment at
 * all is mounted and it has led for less than agent_ttl: the agents
 * started beside it are still mounting (a put right after `mooncaked &`
 * got MC_ETOO_FEW_SEGMENTS before its own agent's mount landed). With
 * one segment or more the figures are taken as they are.
 */
bool master__settling(const struct master *m, unsigned *mounted, unsigned *syncing)
{
	*mounted = *syncing = 0;
	for (uint32_t i = 0; i < master__seg_slots(m->core); i++) {
		const struct master_seg *s = master__seg(m->core, i);
		if (s && s->tier == MASTER_TIER_DRAM) {
			*mounted += !s->syncing;
			*syncing += s->syncing;
		}
	}
	return *syncing > 0 ||
	       (m->view > 1 && now_ms(m) - m->leader_since_ms < m->core_opts.agent_ttl_ms);
}

/* The error a put start answers for the core's rc: MC_ENO_SPACE becomes
 * MC_EUNAVAILABLE while settling or before the first segment is mounted
 * (both above), and MC_ETOO_FEW_SEGMENTS when fewer
 * segments are mounted than replicas asked for. why (may be NULL) gets
 * the figures. */
static int put_start_err(const struct master *m, int rc, unsigned replicas, char *why,
			 size_t len)
{
	unsigned mounted, syncing;
	if (rc != MC_ENO_SPACE)
		return rc;
	replicas = replicas ? replicas : 1;
	if (master__settling(m, &mounted, &syncing)) {
		if (why)
			snprintf(
				why, len,
				"the leader of view %llu took over %llu ms ago and is taking the "
				"agents' segments back (%u mounted, %u reporting); retry",
				(unsigned long long)m->view,
				(unsigned long long)(now_ms(m) - m->leader_since_ms), mounted,
				syncing);
		return MC_EUNAVAILABLE;
	}
	if (mounted == 0 && now_ms(m) - m->leader_since_ms < m->core_opts.agent_ttl_ms) {
		if (why)
			snprintf(
				why, len,
				"the master started leading %llu ms ago and no segment is mounted "
				"yet; agents may still be mounting; retry",
				(unsigned long long)(now_ms(m) - m->leader_since_ms));
		return MC_EUNAVAILABLE;
	}
	if (mounted < replicas) {
		if (why)
			snprintf(why, len,
				 "%u replicas need %u segments and only %u %s mounted",
				 replicas, replicas, mounted, mounted == 1 ? "is" : "are");
		return MC_ETOO_FEW_SEGMENTS;
	}
	return rc;
}

/* A commit refused because the space lease it names belongs to an
 * earlier mount of the segment (or the segment is not mounted now: the
 * master changed, or forgot the agent) is not the caller's fault: the
 * space is gone and the put must be made again. */
static int commit_err(const struct master *m, int rc, const char *segment, uint64_t epoch)
{
	if (rc != MC_ESEGMENT_NOT_FOUND && rc != MC_EINVALID_REPLICA)
		return rc;
	const struct master_seg *s = master__seg(m->core, master__seg_find(m->core, segment));
	return !s || s->lease_epoch != epoch ? MC_EUNAVAILABLE : rc;
}

/* A put ended (or revoked) that this leader never heard of began under
 * an earlier leader: while settling, the caller is told to put again. */
static int put_end_err(const struct master *m, int rc)
{
	unsigned mounted, syncing;
	return rc == MC_EOBJECT_NOT_FOUND && master__settling(m, &mounted, &syncing)
		       ? MC_EUNAVAILABLE
		       : rc;
}

static int put_start_one(struct master *m, const Mooncake__Master__PutStartRequest *req,
			 const struct master_obj **o)
{
	struct master_put p = {
		.key = req->key.data,
		.klen = req->key.len,
		.size = req->size,
		.replica_num = req->replica_num,
		.preferred = req->preferred_segment,
		.soft_pin = req->soft_pin,
		.ttl_ms = req->ttl_ms,
	};
	return master__put_start(m->core, &p, now_ms(m), o);
}

static void on_put_start(struct rpc_call *call, const ProtobufCMessage *msg)
{
	struct master *m = master__leader_of(call);
	const Mooncake__Master__PutStartRequest *req = (const void *)msg;
	if (!m)
		return;
	const struct master_obj *o;
	int rc = put_start_one(m, req, &o);
	if (rc) {
		char why[256] = "", k[KEY_SHOWN_BYTES * 4 + 8];
		rc = put_start_err(m, rc, req->replica_num, why, sizeof(why));
		show_key(k, sizeof(k), req->key.data, req->key.len);
		finish_err(call, rc, "key '%s'%s%s", k, *why ? ": " : "", why);
		return;
	}
	Mooncake__Master__Replica reps[MASTER_MAX_REPLICAS], *ptrs[MASTER_MAX_REPLICAS];
	for (unsigned i = 0; i < o->nrep; i++) {
		fill_replica(m, o, i, &reps[i]);
		ptrs[i] = &reps[i];
	}
	Mooncake__Master__PutStartResponse resp = MOONCAKE__MASTER__PUT_START_RESPONSE__INIT;
	resp.n_replicas = o->nrep;
	resp.replicas = ptrs;
	master__reply(call, &resp.base);
}

static void on_put_end(struct rpc_call *call, const ProtobufCMessage *msg)
{
	struct master *m = master__leader_of(call);
	const Mooncake__Master__PutEndRequest *req = (const void *)msg;
	if (!m)
		return;
	int rc = master__put_end(m->core, req->key.data, req->key.len,
				 req->checksummed ? &req->crc32c : NULL, now_ms(m));
	if (rc) {
		finish_key_err(call, put_end_err(m, rc), req->key);
		return;
	}
	Mooncake__Master__PutEndResponse resp = MOONCAKE__MASTER__PUT_END_RESPONSE__INIT;
	master__reply(call, &resp.base);
}

static void on_put_revoke(struct rpc_call *call, const ProtobufCMessage *msg)
{
	struct master *m = master__leader_of(call);
	const Mooncake__Master__PutRevokeRequest *req = (const void *)msg;
	if (!m)
		return;
	int rc = master__put_revoke(m->core, req->key.data, req->key.len);
	if (rc) {
		finish_key_err(call, put_end_err(m, rc), req->key);
		return;
	}
	Mooncake__Master__PutRevokeResponse resp = MOONCAKE__MASTER__PUT_REVOKE_RESPONSE__INIT;
	master__reply(call, &resp.base);
}

/* ------------------------------------------------------------ gets */

static void on_get(struct rpc_call *call, const ProtobufCMessage *msg)
{
	struct master *m = master__leader_of(call);
	const Mooncake__Master__GetReplicasRequest *req = (const void *)msg;
	if (!m)
		return;
	const struct master_obj *o;
	int rc = master__get(m->core, req->key.data, req->key.len, now_ms(m), &o);
	if (rc) {
		finish_key_err(call, rc, req->key);
		return;
	}
	Mooncake__Master__Replica reps[MASTER_MAX_REPLICAS], *ptrs[MASTER_MAX_REPLICAS];
	Mooncake__Master__GetReplicasResponse resp =
		MOONCAKE__MASTER__GET_REPLICAS_RESPONSE__INIT;
	for (unsigned i = 0; i < o->nrep; i++) {
		fill_replica(m, o, i, &reps[i]);
		ptrs[resp.n_replicas++] = &reps[i];
	}
	resp.replicas = ptrs;
	resp.size = o->size;
	resp.crc32c = o->crc;
	resp.checksummed = (o->flags & MASTER_OBJ_CRC) != 0;
	resp.lease_ttl_ms = m->core_opts.lease_ttl_ms;
	master__reply(call, &resp.base);
}

static void on_exist(struct rpc_call *call, const ProtobufCMessage *msg)
{
	struct master *m = master__leader_of(call);
	const Mooncake__Master__ExistRequest *req = (const void *)msg;
	if (!m)
		return;
	int rc = master__exist(m->core, req->key.data, req->key.len, now_ms(m));
	if (rc < 0) {
		finish_key_err(call, rc, req->key);
		return;
	}
	Mooncake__Master__ExistResponse resp = MOONCAKE__MASTER__EXIST_RESPONSE__INIT;
	resp.exists = rc == 1;
	master__reply(call, &resp.base);
}

static void on_remove(struct rpc_call *call, const ProtobufCMessage *msg)
{
	struct master *m = master__leader_of(call);
	const Mooncake__Master__RemoveRequest *req = (const void *)msg;
	if (!m)
		return;
	int rc = master__remove(m->core, req->key.data, req->key.len, req->force, now_ms(m));
	if (rc) {
		finish_key_err(call, rc, req->key);
		return;
	}
	Mooncake__Master__RemoveResponse resp = MOONCAKE__MASTER__REMOVE_RESPONSE__INIT;
	master__reply(call, &resp.base);
}

static void on_batch_replica_clear(struct rpc_call *call, const ProtobufCMessage *msg)
{
	struct master *m = master__leader_of(call);
	const Mooncake__Master__BatchReplicaClearRequest *req = (const void *)msg;
	if (!m)
		return;
	if (batch_too_large(call, req->n_keys))
		return;
	size_t n = req->n_keys;
	int32_t *errs = calloc(n ? n : 1, sizeof(*errs));
	if (!errs) {
		finish_err(call, -ENOMEM, NULL);
		return;
	}
	uint32_t seg = req->segment ? master__seg_find(m->core, req->segment)
				    : MASTER_NO_SEGMENT;
	uint64_t now = now_ms(m);
	/* (A segment not mounted has no replica of any key.) */
	for (size_t i = 0; i < n; i++)
		errs[i] = master__replica_clear(m->core, req->keys[i].data, req->keys[i].len,
						seg, now);
	Mooncake__Master__BatchErrorsResponse resp =
		MOONCAKE__MASTER__BATCH_ERRORS_RESPONSE__INIT;
	resp.errors = errs;
	resp.n_errors = n;
	master__reply(call, &resp.base);
	free(errs);
}

/* ------------------------------------------------------------ leases */

static void on_lease_space(struct rpc_call *call, const ProtobufCMessage *msg)
{
	struct master *m = master__leader_of(call);
	const Mooncake__Master__LeaseSpaceRequest *req = (const void *)msg;
	if (!m)
		return;
	Mooncake__Master__LeaseSpaceResponse resp =
		MOONCAKE__MASTER__LEASE_SPACE_RESPONSE__INIT;
	for (size_t i = 0; i < req->n_release; i++)
		resp.released += master__lease_release(
			m->core, req->agent_id, req->segment, req->lease_epoch,
			req->release[i]->offset, req->release[i]->length);
	Mooncake__Master__Extent ext = MOONCAKE__MASTER__EXTENT__INIT, *ptr = &ext;
	int rc = master__lease_grant(m->core, req->agent_id, req->segment, req->lease_epoch,
				     req->want_bytes, &ext.offset, &ext.length);
	if (rc == -EACCES) {
		/* Another agent's segment: a remote lease. */
		struct master_rlease_grant g;
		rc = master__rlease_grant(m->core, req->agent_id, req->segment,
					  req->lease_epoch, req->want_bytes, now_ms(m), &g);
		ext.offset = g.offset;
		ext.length = g.length;
		resp.lease_epoch = g.epoch;
		resp.segment_base = g.base;
		resp.ttl_ms = g.ttl_ms;
	}
	if (rc) {
		finish_err(call, rc, "segment '%s'", req->segment);
		return;
	}
	if (ext.length) {
		resp.extents = &ptr;
		resp.n_extents = 1;
	}
	const struct master_seg *seg = master__seg(m->core,
						   master__seg_find(m->core, req->segment));
	resp.leased_bytes = seg ? seg->leased : 0;
	master__reply(call, &resp.base);
}

int master__decode_commit_item(const uint8_t *p, size_t len, struct master_commit *c)
{
	/* The wire type of each field (field numbers from 1). */
	static const uint8_t wt_of[] = {8, 2, 0, 0, 5, 0, 0, 0, 0};
	*c = (struct master_commit){0};
	size_t pos = 0;
	struct mc_pbrec r;
	int rc;
	while (mc_pb_field(p, len, &pos, wt_of, 8, &r, &rc)) {
		switch (r.num) {
		case 1:
			c->key = r.v ? p + r.data : NULL;
			c->klen = (size_t)r.v;
			break;
		case 2:
			c->offset = r.v;
			break;
		case 3:
			c->size = r.v;
			break;
		case 4:
			c->crc = (uint32_t)r.v;
			break;
		case 5:
			c->has_crc = mc_pb_bool(p, &r);
			break;
		case 6:
			c->soft_pin = mc_pb_bool(p, &r);
			break;
		case 7:
			c->ttl_ms = r.v;
			break;
		case 8:
			c->promote = mc_pb_bool(p, &r);
			break;
		}
	}
	return rc;
}

/* The request arrives as BatchCommitRequestRaw (the same encoding): its
 * items are decoded here, all of them before any is committed, so that
 * one that does not decode fails the call as a bad request did. */
static void on_batch_commit(struct rpc_call *call, const ProtobufCMessage *msg)
{
	struct master *m = master__leader_of(call);
	const Mooncake__Master__BatchCommitRequestRaw *req = (const void *)msg;
	if (!m)
		return;
	if (batch_too_large(call, req->n_items))
		return;
	size_t n = req->n_items;
	int32_t *errs = calloc(n ? n : 1, sizeof(*errs));
	struct master_commit *cs = malloc((n ? n : 1) * sizeof(*cs));
	/* Items protobuf-c had to decode (their keys point into them). */
	Mooncake__Master__CommitItem **slow = NULL;
	if (!errs || !cs) {
		finish_err(call, -ENOMEM, NULL);
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		int rc = master__decode_commit_item(req->items[i].data, req->items[i].len,
						    &cs[i]);
		if (rc == 1) {
			if (!slow && !(slow = calloc(n, sizeof(*slow)))) {
				finish_err(call, -ENOMEM, NULL);
				goto out;
			}
			const Mooncake__Master__CommitItem *it = slow[i] =
				mooncake__master__commit_item__unpack(NULL, req->items[i].len,
								      req->items[i].data);
			rc = it ? 0 : -EBADMSG;
			if (it)
				cs[i] = (struct master_commit){
					.key = it->key.data,
					.klen = it->key.len,
					.offset = it->offset,
					.size = it->size,
					.has_crc = it->checksummed,
					.crc = it->crc32c,
					.soft_pin = it->soft_pin,
					.ttl_ms = it->ttl_ms,
					.promote = it->promote,
				};
		}
		if (rc) {
			rpc_call_finish(call, RPC_INTERNAL, "failed to parse request message");
			goto out;
		}
	}
	uint64_t now = now_ms(m);
	for (size_t i = 0; i < n; i++)
		errs[i] = commit_err(m,
				     master__commit(m->core, req->agent_id, req->segment,
						    req->lease_epoch, &cs[i], now),
				     req->segment, req->lease_epoch);
	Mooncake__Master__BatchErrorsResponse resp =
		MOONCAKE__MASTER__BATCH_ERRORS_RESPONSE__INIT;
	resp.n_errors = n;
	resp.errors = errs;
	master__reply(call, &resp.base);
out:
	for (size_t i = 0; slow && i < n; i++)
		if (slow[i])
			mooncake__master__commit_item__free_unpacked(slow[i], NULL);
	free(slow);
	free(cs);
	free(errs);
}

static void on_tier_commit(struct rpc_call *call, const ProtobufCMessage *msg)
{
	struct master *m = master__leader_of(call);
	const Mooncake__Master__TierCommitRequest *req = (const void *)msg;
	if (!m)
		return;
	if (batch_too_large(call, req->n_items))
		return;
	size_t n = req->n_items;
	int32_t *errs = calloc(n ? n : 1, sizeof(*errs));
	if (!errs) {
		finish_err(call, -ENOMEM, NULL);
		return;
	}
	uint64_t now = now_ms(m);
	for (size_t i = 0; i < n; i++) {
		const Mooncake__Master__TierItem *it = req->items[i];
		struct master_tier_item t = {
			.key = it->key.data,
			.klen = it->key.len,
			.offset = it->offset,
			.size = it->size,
			.has_crc = it->checksummed,
			.crc = it->crc32c,
			.soft_pin = it->soft_pin,
			.ttl_ms = it->ttl_ms,
		};
		enum master_tier_op op;
		switch (it->kind) {
		case MOONCAKE__MASTER__TIER_ITEM__KIND__PUT:
			op = MASTER_TIER_PUT;
			break;
		case MOONCAKE__MASTER__TIER_ITEM__KIND__DEMOTED:
			op = MASTER_TIER_DEMOTED;
			break;
		case MOONCAKE__MASTER__TIER_ITEM__KIND__ABANDONED:
			op = MASTER_TIER_ABANDONED;
			break;
		case MOONCAKE__MASTER__TIER_ITEM__KIND__LOST:
			op = MASTER_TIER_LOST;
			break;
		default:
			errs[i] = -EINVAL;
			continue;
		}
		errs[i] = master__tier_update(m->core, req->agent_id, req->segment, op, &t,
					      now);
	}
	Mooncake__Master__BatchErrorsResponse resp =
		MOONCAKE__MASTER__BATCH_ERRORS_RESPONSE__INIT;
	resp.n_errors = n;
	resp.errors = errs;
	master__reply(call, &resp.base);
	free(errs);
}

/* ------------------------------------------------------------ batches */

static void on_batch_put_start(struct rpc_call *call, const ProtobufCMessage *msg)
{
	struct master *m = master__leader_of(call);
	const Mooncake__Master__BatchPutStartRequest *req = (const void *)msg;
	if (!m)
		return;
	if (batch_too_large(call, req->n_items))
		return;
	size_t n = req->n_items;
	Mooncake__Master__PutStartResult *res = calloc(n ? n : 1, sizeof(*res));
	Mooncake__Master__PutStartResult **rptr = calloc(n ? n : 1, sizeof(*rptr));
	Mooncake__Master__Replica *reps = NULL;
	Mooncake__Master__Replica **pptr = NULL;
	const struct master_obj **objs = calloc(n ? n : 1, sizeof(*objs));
	size_t total = 0, unavailable = 0;
	char why[256] = "";
	if (!res || !rptr || !objs)
		goto err_nomem;
	for (size_t i = 0; i < n; i++) {
		mooncake__master__put_start_result__init(&res[i]);
		rptr[i] = &res[i];
		res[i].error = put_start_one(m, req->items[i], &objs[i]);
		if (res[i].error) {
			res[i].error = put_start_err(
				m, res[i].error, req->items[i]->replica_num, why, sizeof(why));
			unavailable += res[i].error == MC_EUNAVAILABLE;
			objs[i] = NULL;
		} else
			total += objs[i]->nrep;
	}
	if (n > 0 && unavailable == n) {
		/* Nothing was started: the whole call says "retry", which an
		 * agent does by itself until the call's deadline (one item's
		 * error in a batch would go to the client as it is). */
		finish_err(call, MC_EUNAVAILABLE, "%s", why);
		goto out;
	}
	/* A later put of the batch cannot free an earlier one's object
	 * (they are PENDING, never evicted), so objs[] are all valid. */
	reps = calloc(total ? total : 1, sizeof(*reps));
	pptr = calloc(total ? total : 1, sizeof(*pptr));
	if (!reps || !pptr)
		goto err_nomem;
	for (size_t i = 0, k = 0; i < n; i++) {
		if (!objs[i])
			continue;
		res[i].replicas = &pptr[k];
		res[i].n_replicas = objs[i]->nrep;
		for (unsigned r = 0; r < objs[i]->nrep; r++, k++) {
			fill_replica(m, objs[i], r, &reps[k]);
			pptr[k] = &reps[k];
		}
	}
	Mooncake__Master__BatchPutStartResponse resp =
		MOONCAKE__MASTER__BATCH_PUT_START_RESPONSE__INIT;
	resp.n_results = n;
	resp.results = rptr;
	master__reply(call, &resp.base);
	goto out;
err_nomem:
	finish_err(call, -ENOMEM, NULL);
out:
	free(pptr);
	free(reps);
	free(objs);
	free(rptr);
	free(res);
}

/* master_key_at_fn over an array of ProtobufCBinaryData keys. */
static const uint8_t *key_at(const void *batch, size_t j, size_t *klen)
{
	const ProtobufCBinaryData *k = (const ProtobufCBinaryData *)batch + j;
	*klen = k->len;
	return k->data;
}

enum batch_op { OP_PUT_END, OP_PUT_REVOKE, OP_REMOVE };

static void batch_errors(struct rpc_call *call, ProtobufCBinaryData *keys, size_t n,
			 const uint32_t *crcs, enum batch_op op, bool force)
{
	struct master *m = master__leader_of(call);
	if (!m)
		return;
	if (batch_too_large(call, n))
		return;
	int32_t *errs = calloc(n ? n : 1, sizeof(*errs));
	if (!errs) {
		finish_err(call, -ENOMEM, NULL);
		return;
	}
	uint64_t now = now_ms(m);
	for (size_t i = 0; i < n; i++) {
		master__prefetch_ahead(m->core, keys, n, i, key_at);
		switch (op) {
		case OP_PUT_END:
			errs[i] = put_end_err(m, master__put_end(m->core, keys[i].data,
								 keys[i].len,
								 crcs ? &crcs[i] : NULL, now));
			break;
		case OP_PUT_REVOKE:
			errs[i] = put_end_err(
				m, master__put_revoke(m->core, keys[i].data, keys[i].len));
			break;
		case OP_REMOVE:
			errs[i] = master__remove(m->core, keys[i].data, keys[i].len, force,
						 now);
			break;
		}
	}
	Mooncake__Master__BatchErrorsResponse resp =
		MOONCAKE__MASTER__BATCH_ERRORS_RESPONSE__INIT;
	resp.n_errors = n;
	resp.errors = errs;
	master__reply(call, &resp.base);
	free(errs);
}

static void on_batch_put_end(struct rpc_call *call, const ProtobufCMessage *msg)
{
	const Mooncake__Master__BatchKeysRequest *req = (const void *)msg;
	if (req->n_crc32c && req->n_crc32c != req->n_keys) {
		finish_err(call, -EINVAL, "%zu checksums for %zu keys", req->n_crc32c,
			   req->n_keys);
		return;
	}
	batch_errors(call, req->keys, req->n_keys, req->n_crc32c ? req->crc32c : NULL,
		     OP_PUT_END, false);
}

static void on_batch_put_revoke(struct rpc_call *call, const ProtobufCMessage *msg)
{
	const Mooncake__Master__BatchKeysRequest *req = (const void *)msg;
	batch_errors(call, req->keys, req->n_keys, NULL, OP_PUT_REVOKE, false);
}

static void on_batch_remove(struct rpc_call *call, const ProtobufCMessage *msg)
{
	const Mooncake__Master__BatchRemoveRequest *req = (const void *)msg;
	batch_errors(call, req->keys, req->n_keys, NULL, OP_REMOVE, req->force);
}

static void on_batch_exist(struct rpc_call *call, const ProtobufCMessage *msg)
{
	struct master *m = master__leader_of(call);
	const Mooncake__Master__BatchKeysRequest *req = (const void *)msg;
	if (!m || batch_too_large(call, req->n_keys))
		return;
	size_t n = req->n_keys;
	int32_t *errs = calloc(n ? n : 1, sizeof(*errs));
	protobuf_c_boolean *ex = calloc(n ? n : 1, sizeof(*ex));
	if (!errs || !ex) {
		finish_err(call, -ENOMEM, NULL);
		goto out;
	}
	uint64_t now = now_ms(m);
	for (size_t i = 0; i < n; i++) {
		master__prefetch_ahead(m->core, req->keys, n, i, key_at);
		int rc = master__exist(m->core, req->keys[i].data, req->keys[i].len, now);
		errs[i] = rc < 0 ? rc : 0;
		ex[i] = rc == 1;
	}
	Mooncake__Master__BatchExistResponse resp =
		MOONCAKE__MASTER__BATCH_EXIST_RESPONSE__INIT;
	resp.n_errors = resp.n_exists = n;
	resp.errors = errs;
	resp.exists = ex;
	master__reply(call, &resp.base);
out:
	free(errs);
	free(ex);
}

static void on_batch_get(struct rpc_call *call, const ProtobufCMessage *msg)
{
	struct master *m = master__leader_of(call);
	const Mooncake__Master__BatchKeysRequest *req = (const void *)msg;
	if (!m || batch_too_large(call, req->n_keys))
		return;
	size_t n = req->n_keys, total = 0;
	const struct master_obj **objs = calloc(n ? n : 1, sizeof(*objs));
	Mooncake__Master__GetReplicasResult *res = calloc(n ? n : 1, sizeof(*res));
	Mooncake__Master__GetReplicasResult **rptr = calloc(n ? n : 1, sizeof(*rptr));
	Mooncake__Master__Replica *reps = NULL;
	Mooncake__Master__Replica **pptr = NULL;
	if (!objs || !res || !rptr)
		goto err_nomem;
	uint64_t now = now_ms(m);
	for (size_t i = 0; i < n; i++) {
		master__prefetch_ahead(m->core, req->keys, n, i, key_at);
		mooncake__master__get_replicas_result__init(&res[i]);
		rptr[i] = &res[i];
		res[i].error = master__get(m->core, req->keys[i].data, req->keys[i].len, now,
					   &objs[i]);
		if (res[i].error)
			objs[i] = NULL;
		else
			total += objs[i]->nrep;
	}
	/* Objects found stay valid: they are leased, so a later lookup of
	 * the batch cannot expire them. */
	reps = malloc((total ? total : 1) * sizeof(*reps));
	pptr = malloc((total ? total : 1) * sizeof(*pptr));
	if (!reps || !pptr)
		goto err_nomem;
	for (size_t i = 0, k = 0; i < n; i++) {
		if (!objs[i])
			continue;
		res[i].size = objs[i]->size;
		res[i].crc32c = objs[i]->crc;
		res[i].checksummed = (objs[i]->flags & MASTER_OBJ_CRC) != 0;
		res[i].replicas = &pptr[k];
		res[i].n_replicas = objs[i]->nrep;
		for (unsigned r = 0; r < objs[i]->nrep; r++, k++) {
			fill_replica(m, objs[i], r, &reps[k]);
			pptr[k] = &reps[k];
		}
	}
	Mooncake__Master__BatchGetReplicasResponse resp =
		MOONCAKE__MASTER__BATCH_GET_REPLICAS_RESPONSE__INIT;
	resp.n_results = n;
	resp.results = rptr;
	resp.lease_ttl_ms = m->core_opts.lease_ttl_ms;
	master__reply(call, &resp.base);
	goto out;
err_nomem:
	finish_err(call, -ENOMEM, NULL);
out:
	free(pptr);
	free(reps);
	free(rptr);
	free(res);
	free(objs);
}

/* ------------------------------------------------------------ operator */

static void on_stats(struct rpc_call *call, const ProtobufCMessage *msg)
{
	struct master *m = master__leader_of(call);
	(void)msg;
	if (!m)
		return;
	uint64_t now = now_ms(m);
	master__update_metrics(m);
	struct master_core_stats st;
	master__core_stats(m->core, &st);
	const struct master_counters *n = master__core_counters(m->core);
	Mooncake__Master__StatsResponse resp = MOONCAKE__MASTER__STATS_RESPONSE__INIT;
	resp.view = m->view;
	resp.leader = m->self_addr;
	resp.objects = st.objects;
	resp.pending = st.pending;
	resp.capacity = st.dram_capacity;
	resp.used = st.dram_used;
	resp.index_bytes = st.index_bytes;
	resp.key_bytes = st.key_bytes;
	resp.bytes_per_object =
		st.objects ? (double)(st.index_bytes - st.key_bytes) / (double)st.objects : 0;
	resp.puts = n->puts;
	resp.gets = n->gets;
	resp.hits = n->hits;
	resp.misses = n->misses;
	resp.evictions = n->evictions;
	resp.lease_waits = n->lease_waits;
	resp.put_timeouts = n->put_timeouts;
	resp.commits = n->commits;
	resp.commit_refusals = n->commit_refusals;
	resp.agents = st.agents;
	resp.ssd_capacity = st.ssd_capacity;
	resp.ssd_used = st.ssd_used;
	resp.ssd_objects = st.ssd_objects;
	resp.demotions = n->demotions;
	resp.promotions = n->promotions;
	resp.ssd_evictions = n->ssd_evictions;
	resp.demoting = st.demoting;
	resp.demotion_failures = n->demotion_failures;
	uint32_t slots = master__seg_slots(m->core), k = 0;
	Mooncake__Master__SegmentStats *ss = calloc(slots ? slots : 1, sizeof(*ss));
	Mooncake__Master__SegmentStats **sp = calloc(slots ? slots : 1, sizeof(*sp));
	Mooncake__Master__Segment *sg = calloc(slots ? slots : 1, sizeof(*sg));
	if (!ss || !sp || !sg) {
		finish_err(call, -ENOMEM, NULL);
		goto out;
	}
	for (uint32_t i = 0; i < slots; i++) {
		const struct master_seg *s = master__seg(m->core, i);
		if (!s)
			continue;
		struct master_alloc_stats as;
		master__alloc_stats(s->alloc, &as);
		mooncake__master__segment__init(&sg[k]);
		mooncake__master__segment_stats__init(&ss[k]);
		sg[k].name = s->name;
		sg[k].agent_id = s->agent->id;
		sg[k].tier = s->tier == MASTER_TIER_SSD ? MOONCAKE__MASTER__TIER__TIER_SSD
							: MOONCAKE__MASTER__TIER__TIER_DRAM;
		sg[k].base_address = s->base;
		sg[k].size = s->size;
		sg[k].block_bytes = s->block;
		if (s->tier == MASTER_TIER_SSD) {
			sg[k].high_watermark = s->high_watermark;
			sg[k].eviction_ratio = s->eviction_ratio;
		}
		ss[k].segment = &sg[k];
		ss[k].used = as.used;
		ss[k].replicas = s->replicas;
		ss[k].fragmentation = as.fragmentation;
		ss[k].syncing = s->syncing;
		ss[k].leased = s->leased;
		resp.leased += s->leased;
		ss[k].heartbeat_age_ms = now - MC_MIN(now, s->agent->last_heartbeat_ms);
		sp[k] = &ss[k];
		k++;
	}
	resp.n_segments = k;
	resp.segments = sp;
	master__reply(call, &resp.base);
out:
	free(ss);
	free(sp);
	free(sg);
}

/* ------------------------------------------------------------ table */

#define UNARY(nm, fn, req, resp) \
	{ \
		.name = nm, .kind = RPC_UNARY, \
		.request = &mooncake__master__##req##__descriptor, \
		.response = &mooncake__master__##resp##__descriptor, .on_message = fn \
	}

static const struct rpc_method methods[] = {
	UNARY("MountSegment", on_mount, mount_segment_request, mount_segment_response),
	UNARY("UnmountSegment", on_unmount, unmount_segment_request, unmount_segment_response),
	UNARY("Heartbeat", on_heartbeat, heartbeat_request, heartbeat_response),
	UNARY("PutStart", on_put_start, put_start_request, put_start_response),
	UNARY("PutEnd", on_put_end, put_end_request, put_end_response),
	UNARY("PutRevoke", on_put_revoke, put_revoke_request, put_revoke_response),
	UNARY("GetReplicas", on_get, get_replicas_request, get_replicas_response),
	UNARY("Exist", on_exist, exist_request, exist_response),
	UNARY("Remove", on_remove, remove_request, remove_response),
	/* Walks in slices over loop turns (walk.c). */
	{.name = "RemoveAll",
	 .kind = RPC_UNARY,
	 .request = &mooncake__master__remove_all_request__descriptor,
	 .response = &mooncake__master__remove_all_response__descriptor,
	 .on_message = master__on_remove_all,
	 .on_cancel = master__on_walk_cancel},
	UNARY("BatchPutStart", on_batch_put_start, batch_put_start_request,
	      batch_put_start_response),
	UNARY("BatchPutEnd", on_batch_put_end, batch_keys_request, batch_errors_response),
	UNARY("BatchPutRevoke", on_batch_put_revoke, batch_keys_request,
	      batch_errors_response),
	UNARY("BatchGetReplicas", on_batch_get, batch_keys_request,
	      batch_get_replicas_response),
	UNARY("BatchExist", on_batch_exist, batch_keys_request, batch_exist_response),
	UNARY("BatchRemove", on_batch_remove, batch_remove_request, batch_errors_response),
	{.name = "RemoveRegex",
	 .kind = RPC_UNARY,
	 .request = &mooncake__master__remove_regex_request__descriptor,
	 .response = &mooncake__master__remove_all_response__descriptor,
	 .on_message = master__on_remove_regex,
	 .on_cancel = master__on_walk_cancel},
	UNARY("BatchReplicaClear", on_batch_replica_clear, batch_replica_clear_request,
	      batch_errors_response),
	UNARY("Stats", on_stats, stats_request, stats_response),
	{.name = "List",
	 .kind = RPC_UNARY,
	 .request = &mooncake__master__list_request__descriptor,
	 .response = &mooncake__master__list_response__descriptor,
	 .on_message = master__on_list,
	 .on_cancel = master__on_walk_cancel},
	/* A long poll: kept out of the call latency histogram. */
	{.name = "SyncSegment",
	 .kind = RPC_UNARY,
	 .request = &mooncake__master__sync_segment_request__descriptor,
	 .response = &mooncake__master__sync_segment_response__descriptor,
	 .on_message = master__on_sync,
	 .on_cancel = master__on_sync_cancel,
	 .long_poll = true},
	UNARY("ListSegment", master__on_list_segment, list_segment_request,
	      list_segment_response),
	UNARY("LeaseSpace", on_lease_space, lease_space_request, lease_space_response),
	UNARY("BatchCommit", on_batch_commit, batch_commit_request_raw, batch_errors_response),
	UNARY("TierCommit", on_tier_commit, tier_commit_request, batch_errors_response),
};

int master__service_add(struct master *m)
{
	return rpc_server_add_service(m->rpc, MASTER_SERVICE, methods, MC_ARRAY_LEN(methods),
				      m);
}
