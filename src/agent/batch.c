/*
 * batch: master calls of concurrent requests, coalesced. Requests of many
 * sessions arrive in the same loop iteration (their sockets were readable
 * together, or their copies finished together); each would make its own
 * BatchPutStart, BatchPutEnd, BatchCommit, BatchGetReplicas or BatchExist
 * call (BatchCommit calls only of one segment and lease epoch together). They
 * are queued instead, and in the loop's check phase — after this
 * iteration's I/O, so no request waits longer — every queue goes out as
 * one call whose items are the requests' items in order; the reply is cut
 * back into one sub-reply per request. A queue with one request is sent
 * as it is. Under load this divides the master calls (and their latency
 * on a busy master) by the number of requests in flight.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "agent/agent_int.h"
#include "agent/batch.h"
#include "agent/mcall.h"
#include "common/log.h"
#include "common/util.h"

#define LOG_SUBSYS LOGS_AGENT

#define MAX_ITEMS_PER_CALL 8192u

struct agent_bwait {
	struct agent_bwait *next;
	const ProtobufCMessage *req;
	size_t n;
	agent_mcall_cb cb;
	void *ud;
};

static const char *const methods[AGENT_B_COUNT] = {
	"BatchPutStart", "BatchPutEnd", "BatchGetReplicas", "BatchExist", "BatchCommit",
};

static const ProtobufCMessageDescriptor *resp_desc(enum agent_bkind k)
{
	switch (k) {
	case AGENT_B_PUT_START:
		return &mooncake__master__batch_put_start_response__descriptor;
	case AGENT_B_PUT_END:
	case AGENT_B_COMMIT:
		return &mooncake__master__batch_errors_response__descriptor;
	case AGENT_B_GET:
		return &mooncake__master__batch_get_replicas_response__descriptor;
	default:
		return &mooncake__master__batch_exist_response__descriptor;
	}
}

static size_t items_of(enum agent_bkind k, const ProtobufCMessage *m)
{
	if (k == AGENT_B_PUT_START)
		return ((const Mooncake__Master__BatchPutStartRequest *)m)->n_items;
	if (k == AGENT_B_COMMIT)
		return ((const Mooncake__Master__BatchCommitRequestRaw *)m)->n_items;
	return ((const Mooncake__Master__BatchKeysRequest *)m)->n_keys;
}

/* Items are arrays of pointers (PutStart) or of bytes (keys, and the
 * commits' items encoded). */
static bool pointer_items(enum agent_bkind k)
{
	return k == AGENT_B_PUT_START;
}

/* Commits share a call only when they name the same segment and lease
 * epoch (a remote lease's commit names another agent's segment). */
static bool commits_alike(const ProtobufCMessage *x, const ProtobufCMessage *y)
{
	const Mooncake__Master__BatchCommitRequestRaw *a = (const void *)x,
						      *b = (const void *)y;
	return a->lease_epoch == b->lease_epoch &&
	       strcmp(a->segment ? a->segment : "", b->segment ? b->segment : "") == 0;
}

/* One combined call: its request (built from the waits) and the waits. */
struct combined {
	struct agent *a;
	enum agent_bkind kind;
	struct agent_bwait *waits;
	size_t n;
	union {
		Mooncake__Master__BatchPutStartRequest ps;
		Mooncake__Master__BatchKeysRequest keys;
		Mooncake__Master__BatchCommitRequestRaw commit;
	} req;
	void *array;    /* the concatenated items or keys */
	uint32_t *crcs; /* BatchPutEnd: the concatenated checksums */
};

static void free_waits(struct agent_bwait *w)
{
	while (w) {
		struct agent_bwait *next = w->next;
		free(w);
		w = next;
	}
}

/* Hand each wait its slice of the reply (sub-replies on the stack point
 * into the combined one, which is valid during this callback). */
static void on_combined(void *ud, int err, const char *message, const ProtobufCMessage *m)
{
	struct combined *cb = ud;
	size_t off = 0;
	for (struct agent_bwait *w = cb->waits; w; w = w->next) {
		if (err) {
			w->cb(w->ud, err, message, NULL);
			continue;
		}
		switch (cb->kind) {
		case AGENT_B_PUT_START: {
			const Mooncake__Master__BatchPutStartResponse *r = (const void *)m;
			Mooncake__Master__BatchPutStartResponse s =
				MOONCAKE__MASTER__BATCH_PUT_START_RESPONSE__INIT;
			s.results = off < r->n_results ? r->results + off : NULL;
			s.n_results = off < r->n_results ? MC_MIN(w->n, r->n_results - off)
							 : 0;
			w->cb(w->ud, 0, NULL, &s.base);
			break;
		}
		case AGENT_B_PUT_END:
		case AGENT_B_COMMIT: {
			const Mooncake__Master__BatchErrorsResponse *r = (const void *)m;
			Mooncake__Master__BatchErrorsResponse s =
				MOONCAKE__MASTER__BATCH_ERRORS_RESPONSE__INIT;
			s.errors = off < r->n_errors ? r->errors + off : NULL;
			s.n_errors = off < r->n_errors ? MC_MIN(w->n, r->n_errors - off) : 0;
			w->cb(w->ud, 0, NULL, &s.base);
			break;
		}
		case AGENT_B_GET: {
			const Mooncake__Master__BatchGetReplicasResponse *r = (const void *)m;
			Mooncake__Master__BatchGetReplicasResponse s =
				MOONCAKE__MASTER__BATCH_GET_REPLICAS_RESPONSE__INIT;
			s.results = off < r->n_results ? r->results + off : NULL;
			s.n_results = off < r->n_results ? MC_MIN(w->n, r->n_results - off)
							 : 0;
			s.lease_ttl_ms = r->lease_ttl_ms;
			w->cb(w->ud, 0, NULL, &s.base);
			break;
		}
		default: {
			const Mooncake__Master__BatchExistResponse *r = (const void *)m;
			Mooncake__Master__BatchExistResponse s =
				MOONCAKE__MASTER__BATCH_EXIST_RESPONSE__INIT;
			s.errors = off < r->n_errors ? r->errors + off : NULL;
			s.n_errors = off < r->n_errors ? MC_MIN(w->n, r->n_errors - off) : 0;
			s.exists = off < r->n_exists ? r->exists + off : NULL;
			s.n_exists = off < r->n_exists ? MC_MIN(w->n, r->n_exists - off) : 0;
			w->cb(w->ud, 0, NULL, &s.base);
			break;
		}
		}
		off += w->n;
	}
	free_waits(cb->waits);
	free(cb->array);
	free(cb->crcs);
	free(cb);
}

/* BatchPutEnd requests carry checksums for all their keys or for none;
 * only requests alike can share a call. */
static bool crcs_alike(const struct agent_bwait *waits)
{
	size_t with = 0, n = 0;
	for (const struct agent_bwait *w = waits; w; w = w->next, n++)
		with += ((const Mooncake__Master__BatchKeysRequest *)w->req)->n_crc32c != 0;
	return with == 0 || with == n;
}

static void send_queue(struct agent *a, enum agent_bkind k)
{
	struct agent_bqueue *q = &a->batch.q[k];
	struct agent_bwait *waits = q->head;
	size_t n = q->nitems;
	q->head = q->tail = NULL;
	q->nitems = 0;
	q->nwaits = 0;
	if (!waits)
		return;
	if (!waits->next) {
		/* Alone: as it is. */
		agent__mcall(a, methods[k], waits->req, resp_desc(k), waits->cb, waits->ud);
		free(waits);
		return;
	}
	struct combined *cb = mc_zalloc(1, sizeof(*cb));
	size_t esz = pointer_items(k) ? sizeof(void *) : sizeof(ProtobufCBinaryData);
	void *arr = cb ? malloc(n * esz) : NULL;
	bool with_crcs = k == AGENT_B_PUT_END &&
			 ((const Mooncake__Master__BatchKeysRequest *)waits->req)->n_crc32c;
	uint32_t *crcs = with_crcs && arr ? malloc(n * sizeof(*crcs)) : NULL;
	if (!cb || !arr || (with_crcs && !crcs) ||
	    (k == AGENT_B_PUT_END && !crcs_alike(waits))) {
		/* Out of memory, or requests unlike: each on its own. */
		free(crcs);
		free(arr);
		free(cb);
		while (waits) {
			struct agent_bwait *next = waits->next;
			agent__mcall(a, methods[k], waits->req, resp_desc(k), waits->cb,
				     waits->ud);
			free(waits);
			waits = next;
		}
		return;
	}
	cb->a = a;
	cb->kind = k;
	cb->waits = waits;
	cb->n = n;
	cb->array = arr;
	cb->crcs = crcs;
	size_t off = 0;
	for (struct agent_bwait *w = waits; w; w = w->next) {
		if (k == AGENT_B_PUT_START) {
			const Mooncake__Master__BatchPutStartRequest *r = (const void *)w->req;
			memcpy((void **)arr + off, r->items, w->n * esz);
		} else if (k == AGENT_B_COMMIT) {
			const Mooncake__Master__BatchCommitRequestRaw *r =
				(const void *)w->req;
			memcpy((ProtobufCBinaryData *)arr + off, r->items, w->n * esz);
		} else {
			const Mooncake__Master__BatchKeysRequest *r = (const void *)w->req;
			memcpy((ProtobufCBinaryData *)arr + off, r->keys, w->n * esz);
			if (crcs)
				memcpy(crcs + off, r->crc32c, w->n * sizeof(*crcs));
		}
		off += w->n;
	}
	if (k == AGENT_B_PUT_START) {
		mooncake__master__batch_put_start_request__init(&cb->req.ps);
		cb->req.ps.items = arr;
		cb->req.ps.n_items = n;
		agent__mcall(a, methods[k], &cb->req.ps.base, resp_desc(k), on_combined, cb);
	} else if (k == AGENT_B_COMMIT) {
		const Mooncake__Master__BatchCommitRequestRaw *first =
			(const void *)waits->req;
		mooncake__master__batch_commit_request_raw__init(&cb->req.commit);
		cb->req.commit.agent_id = first->agent_id;
		cb->req.commit.segment = first->segment;
		cb->req.commit.lease_epoch = first->lease_epoch;
		cb->req.commit.items = arr;
		cb->req.commit.n_items = n;
		agent__mcall(a, methods[k], &cb->req.commit.base, resp_desc(k), on_combined,
			     cb);
	} else {
		mooncake__master__batch_keys_request__init(&cb->req.keys);
		cb->req.keys.keys = arr;
		cb->req.keys.n_keys = n;
		if (crcs) {
			cb->req.keys.crc32c = crcs;
			cb->req.keys.n_crc32c = n;
		}
		agent__mcall(a, methods[k], &cb->req.keys.base, resp_desc(k), on_combined, cb);
	}
}

void agent__batch_flush(struct agent *a)
{
	for (int k = 0; k < AGENT_B_COUNT; k++)
		send_queue(a, (enum agent_bkind)k);
	uv_check_stop(&a->batch.check);
}

static void on_check(uv_check_t *h)
{
	agent__batch_flush(h->data);
}

void agent__batch_init(struct agent *a)
{
	uv_check_init(a->loop, &a->batch.check);
	a->batch.check.data = a;
}

unsigned agent__batch_close(struct agent *a, uv_close_cb on_closed)
{
	agent__batch_flush(a);
	uv_close((uv_handle_t *)&a->batch.check, on_closed);
	return 1;
}

void agent__bcall(struct agent *a, enum agent_bkind k, const ProtobufCMessage *req,
		  agent_mcall_cb cb, void *ud)
{
	size_t n = items_of(k, req);
	struct agent_bqueue *q = &a->batch.q[k];
	struct agent_bwait *w = mc_zalloc(1, sizeof(*w));
	if (!w || a->stopping || n == 0) {
		free(w);
		agent__mcall(a, methods[k], req, resp_desc(k), cb, ud);
		return;
	}
	if (q->nitems + n > MAX_ITEMS_PER_CALL ||
	    (k == AGENT_B_COMMIT && q->head && !commits_alike(q->head->req, req)))
		send_queue(a, k);
	w->req = req;
	w->n = n;
	w->cb = cb;
	w->ud = ud;
	if (q->tail)
		q->tail->next = w;
	else
		q->head = w;
	q->tail = w;
	q->nitems += n;
	q->nwaits++;
	if (!uv_is_active((uv_handle_t *)&a->batch.check))
		uv_check_start(&a->batch.check, on_check);
}
