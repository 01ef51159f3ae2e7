/*
 * req: the checks every client request passes before the agent acts on
 * it. Pure (no I/O, no allocation): the fuzz target for client frames
 * (test/fuzz/fuzz_client_frame.c) runs decoded frames through it.
 *
 * Whole-request problems (unknown op, item counts, region kinds, a
 * descriptor index that was not attached) reject the request; a bad key
 * only fails its own item, later, with -EINVAL.
 */
#include <errno.h>
#include <string.h>

#include "agent/req.h"
#include "common/uframe.h"
#include "common/util.h"

bool agent__key_ok(const ProtobufCBinaryData *k)
{
	return k->len >= 1 && k->len <= AGENT_MAX_KEY_BYTES;
}

static bool region_ok(const Mooncake__Client__Region *r, uint32_t nfds, const char **why)
{
	switch (r->where) {
	case MOONCAKE__CLIENT__REGION__WHERE__STAGING:
		return true;
	case MOONCAKE__CLIENT__REGION__WHERE__BUFFER:
		if (r->buffer == 0) {
			*why = "buffer id 0";
			return false;
		}
		return true;
	case MOONCAKE__CLIENT__REGION__WHERE__ATTACHED:
		if (r->fd_index >= nfds) {
			*why = "region names a descriptor that was not attached";
			return false;
		}
		return true;
	default:
		*why = "unknown region kind";
		return false;
	}
}

static bool count_ok(size_t n, const char **why)
{
	if (n == 0) {
		*why = "no items";
		return false;
	}
	if (n > AGENT_MAX_ITEMS) {
		*why = "too many items in one request";
		return false;
	}
	return true;
}

int agent__req_check(const Mooncake__Client__Request *m, bool hello_done, const char **why)
{
	*why = "";
	if (m->nfds > MC_UFRAME_MAX_FDS) {
		*why = "too many descriptors";
		return MC_EPROTOCOL;
	}
	if (m->op_case == MOONCAKE__CLIENT__REQUEST__OP__NOT_SET) {
		*why = "unknown operation";
		return -EOPNOTSUPP;
	}
	if (!hello_done && m->op_case != MOONCAKE__CLIENT__REQUEST__OP_HELLO) {
		*why = "the first request must be hello";
		return MC_EPROTOCOL;
	}
	if (hello_done && m->op_case == MOONCAKE__CLIENT__REQUEST__OP_HELLO) {
		*why = "hello was already done";
		return MC_EPROTOCOL;
	}
	switch (m->op_case) {
	case MOONCAKE__CLIENT__REQUEST__OP_HELLO:
		if (m->nfds != 0) {
			*why = "hello carries no descriptors";
			return -EINVAL;
		}
		return 0;
	case MOONCAKE__CLIENT__REQUEST__OP_PUT: {
		const Mooncake__Client__PutRequest *p = m->put;
		if (!count_ok(p->n_items, why))
			return -EINVAL;
		if (p->replica_num > AGENT_MAX_REPLICAS) {
			*why = "replica_num above 16";
			return -EINVAL;
		}
		for (size_t i = 0; i < p->n_items; i++) {
			if (!p->items[i]->source) {
				*why = "put item without a source";
				return -EINVAL;
			}
			if (!region_ok(p->items[i]->source, m->nfds, why))
				return -EINVAL;
		}
		return 0;
	}
	case MOONCAKE__CLIENT__REQUEST__OP_GET: {
		const Mooncake__Client__GetRequest *g = m->get;
		if (!count_ok(g->n_items, why))
			return -EINVAL;
		if (g->spill && g->spill->where != MOONCAKE__CLIENT__REGION__WHERE__STAGING &&
		    g->spill->where != MOONCAKE__CLIENT__REGION__WHERE__BUFFER) {
			*why = "the spill region must be in the staging buffer or a registered buffer";
			return -EINVAL;
		}
		for (size_t i = 0; i < g->n_items; i++)
			if (g->items[i]->dest && !region_ok(g->items[i]->dest, m->nfds, why))
				return -EINVAL;
		return 0;
	}
	case MOONCAKE__CLIENT__REQUEST__OP_EXIST:
		return count_ok(m->exist->n_keys, why) ? 0 : -EINVAL;
	case MOONCAKE__CLIENT__REQUEST__OP_REMOVE:
		return count_ok(m->remove->n_keys, why) ? 0 : -EINVAL;
	case MOONCAKE__CLIENT__REQUEST__OP_REPLICAS:
		return count_ok(m->replicas->n_keys, why) ? 0 : -EINVAL;
	case MOONCAKE__CLIENT__REQUEST__OP_REMOVE_ALL:
	case MOONCAKE__CLIENT__REQUEST__OP_STATS:
		return 0;
	case MOONCAKE__CLIENT__REQUEST__OP_REGISTER_BUFFER: {
		const Mooncake__Client__RegisterBufferRequest *q = m->register_buffer;
		if (q->dmabuf && (q->process_memory || m->nfds != 1 || q->address == 0 ||
				  q->address > UINT64_MAX - q->length)) {
			*why = "register_buffer of a dma-buf: one descriptor and an address";
			return -EINVAL;
		}
		if (q->process_memory) {
			if (m->nfds != 0) {
				*why = "register_buffer of process memory carries no descriptor";
				return -EINVAL;
			}
			if (q->address == 0 || q->offset != 0 ||
			    q->address > UINT64_MAX - q->length) {
				*why = "process memory needs an address, no offset, no overflow";
				return -EINVAL;
			}
		} else if (m->nfds != 1) {
			*why = "register_buffer needs exactly one descriptor";
			return -EINVAL;
		}
		if (q->length == 0) {
			*why = "empty buffer";
			return -EINVAL;
		}
		return 0;
	}
	case MOONCAKE__CLIENT__REQUEST__OP_UNREGISTER_BUFFER:
		if (m->unregister_buffer->buffer == 0) {
			*why = "buffer id 0";
			return -EINVAL;
		}
		return 0;
	case MOONCAKE__CLIENT__REQUEST__OP_ALLOC_BUFFER:
		if (m->alloc_buffer->length == 0 ||
		    m->alloc_buffer->length > ((uint64_t)1 << 40)) {
			*why = "buffer length must be 1 byte to 1 TiB";
			return -EINVAL;
		}
		return 0;
	case MOONCAKE__CLIENT__REQUEST__OP_TRANSFER: {
		const Mooncake__Client__TransferRequest *t = m->transfer;
		if (!count_ok(t->n_items, why))
			return -EINVAL;
		for (size_t i = 0; i < t->n_items; i++) {
			const Mooncake__Client__TransferItem *it = t->items[i];
			if (!it->local) {
				*why = "transfer item without local memory";
				return -EINVAL;
			}
			if (!region_ok(it->local, m->nfds, why))
				return -EINVAL;
			if (it->op != MOONCAKE__CLIENT__TRANSFER_ITEM__OP__READ &&
			    it->op != MOONCAKE__CLIENT__TRANSFER_ITEM__OP__WRITE) {
				*why = "unknown transfer op";
				return -EINVAL;
			}
			if (!it->target || !it->target[0]) {
				*why = "transfer item without a target";
				return -EINVAL;
			}
		}
		return 0;
	}
	case MOONCAKE__CLIENT__REQUEST__OP_REMOVE_REGEX:
		if (m->nfds != 0 || !m->remove_regex->pattern ||
		    strlen(m->remove_regex->pattern) > AGENT_MAX_KEY_BYTES) {
			*why = "remove_regex: a pattern of up to 4096 bytes, no descriptors";
			return -EINVAL;
		}
		return 0;
	case MOONCAKE__CLIENT__REQUEST__OP_REPLICA_CLEAR: {
		const Mooncake__Client__ReplicaClearRequest *q = m->replica_clear;
		if (!count_ok(q->n_keys, why))
			return -EINVAL;
		if (m->nfds != 0 || !q->segment || !q->segment[0] ||
		    strlen(q->segment) > AGENT_MAX_SEGMENT_NAME) {
			*why = "replica_clear: a segment name of 1 to 255 bytes, no descriptors";
			return -EINVAL;
		}
		return 0;
	}
	case MOONCAKE__CLIENT__REQUEST__OP_ENGINE:
		if (m->nfds != 0) {
			*why = "engine carries no descriptors";
			return -EINVAL;
		}
		return 0;
	case MOONCAKE__CLIENT__REQUEST__OP_SEGMENT:
		if (m->nfds != 0 || !m->segment->name || !m->segment->name[0] ||
		    strlen(m->segment->name) > AGENT_MAX_SEGMENT_NAME) {
			*why = "segment: a name of 1 to 255 bytes, no descriptors";
			return -EINVAL;
		}
		return 0;
	case MOONCAKE__CLIENT__REQUEST__OP_RELEASE:
		if (m->release->n_views > AGENT_MAX_ITEMS) {
			*why = "too many views";
			return -EINVAL;
		}
		return 0;
	default:
		*why = "unknown operation";
		return -EOPNOTSUPP;
	}
}

/* ------------------------------------------------------------ puts */

/* The decoders below return 0, 1 (for protobuf-c), -EBADMSG or -ENOMEM,
 * as agent__decode_put_request does. */

static int decode_region(const uint8_t *p, size_t len, Mooncake__Client__Region *g)
{
	/* The wire type of each field (field numbers from 1). */
	static const uint8_t wt_of[] = {8, 0, 0, 0, 0, 0};
	mooncake__client__region__init(g);
	size_t pos = 0;
	struct mc_pbrec r;
	int rc;
	while (mc_pb_field(p, len, &pos, wt_of, 5, &r, &rc)) {
		switch (r.num) {
		case 1:
			g->where = (Mooncake__Client__Region__Where)(int32_t)(uint32_t)r.v;
			break;
		case 2:
			g->buffer = r.v;
			break;
		case 3:
			g->fd_index = (uint32_t)r.v;
			break;
		case 4:
			g->offset = r.v;
			break;
		default:
			g->length = r.v;
			break;
		}
	}
	return rc;
}

static int decode_item(const uint8_t *p, size_t len, struct mc_pbarena *a,
		       Mooncake__Client__PutItem *it)
{
	static const uint8_t wt_of[] = {8, 2, 2};
	mooncake__client__put_item__init(it);
	size_t pos = 0;
	struct mc_pbrec r;
	int rc;
	while (mc_pb_field(p, len, &pos, wt_of, 2, &r, &rc)) {
		if (r.num == 1) {
			/* (copied: the frame's buffer is reused) */
			uint8_t *k = NULL;
			if (r.v && !(k = mc_pbarena_alloc(a, (size_t)r.v)))
				return -ENOMEM;
			if (r.v)
				memcpy(k, p + r.data, (size_t)r.v);
			it->key.data = k;
			it->key.len = (size_t)r.v;
			continue;
		}
		if (it->source)
			return 1; /* (given twice: protobuf-c merges the two) */
		Mooncake__Client__Region *g = mc_pbarena_alloc(a, sizeof(*g));
		if (!g)
			return -ENOMEM;
		int grc = decode_region(p + r.data, (size_t)r.v, g);
		if (grc)
			return grc;
		it->source = g;
	}
	return rc;
}

static int decode_put(const uint8_t *p, size_t len, struct mc_pbarena *a,
		      Mooncake__Client__PutRequest *q)
{
	static const uint8_t wt_of[] = {8, 2, 0, 0, 0, 2, 0, 0};
	mooncake__client__put_request__init(q);
	/* First the items' count, and every record checked. */
	size_t pos = 0, n = 0;
	struct mc_pbrec r;
	int rc;
	while (mc_pb_field(p, len, &pos, wt_of, 7, &r, &rc))
		n += r.num == 1;
	if (rc)
		return rc;
	if (n) {
		q->items = mc_pbarena_alloc(a, n * sizeof(*q->items));
		Mooncake__Client__PutItem *items = mc_pbarena_alloc(a, n * sizeof(*items));
		if (!q->items || !items)
			return -ENOMEM;
		for (size_t i = 0; i < n; i++)
			q->items[i] = &items[i];
	}
	pos = 0;
	while (mc_pb_field(p, len, &pos, wt_of, 7, &r, &rc)) { /* (checked above) */
		switch (r.num) {
		case 1: {
			int irc = decode_item(p + r.data, (size_t)r.v, a,
					      q->items[q->n_items]);
			if (irc)
				return irc;
			q->n_items++;
			break;
		}
		case 2:
			q->replica_num = (uint32_t)r.v;
			break;
		case 3:
			q->soft_pin = mc_pb_bool(p, &r);
			break;
		case 4:
			q->ttl_ms = r.v;
			break;
		case 5: {
			char *s = mc_pbarena_alloc(a, (size_t)r.v + 1);
			if (!s)
				return -ENOMEM;
			memcpy(s, p + r.data, (size_t)r.v);
			s[r.v] = '\0';
			q->preferred_segment = s;
			break;
		}
		case 6:
			q->upsert = mc_pb_bool(p, &r);
			break;
		case 7:
			q->tier = (uint32_t)r.v;
			break;
		}
	}
	return 0;
}

int agent__decode_put_request(const uint8_t *p, size_t len, struct mc_pbarena *a,
			      Mooncake__Client__Request **out)
{
	/* The op fields (10-26) are submessages; only a put (11) is decoded
	 * here. A field past the table would be skipped as unknown: every
	 * op must be in it (test_pb_codecs checks against the descriptor). */
	static const uint8_t wt_of[] = {8, 0, 0, 8, 8, 8, 8, 8, 8, 8, 2, 2, 2, 2,
					2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2};
	mc_pbarena_start(a, len, AGENT_MAX_DECODED_BYTES);
	Mooncake__Client__Request *m = mc_pbarena_alloc(a, sizeof(*m));
	if (!m) {
		mc_pbarena_release(a);
		return -ENOMEM;
	}
	mooncake__client__request__init(m);
	size_t pos = 0, put_at = 0;
	struct mc_pbrec r, put = {0};
	int rc;
	while (mc_pb_field(p, len, &pos, wt_of, MC_ARRAY_LEN(wt_of) - 1, &r, &rc)) {
		/* Another op, or a put given twice (merged): protobuf-c's. */
		if ((r.num >= 10 && r.num != 11) || (r.num == 11 && put_at)) {
			rc = 1;
			break;
		}
		if (r.num == 1)
			m->id = r.v;
		else if (r.num == 2)
			m->nfds = (uint32_t)r.v;
		else {
			put = r;
			put_at = pos;
		}
	}
	if (rc) {
		mc_pbarena_release(a);
		return rc;
	}
	rc = 1;
	if (put_at) {
		Mooncake__Client__PutRequest *q = mc_pbarena_alloc(a, sizeof(*q));
		rc = q ? decode_put(p + put.data, (size_t)put.v, a, q) : -ENOMEM;
		m->op_case = MOONCAKE__CLIENT__REQUEST__OP_PUT;
		m->put = q;
	}
	if (rc) {
		mc_pbarena_release(a);
		return rc;
	}
	*out = m;
	return 0;
}

/* ------------------------------------------------------------ replies */

bool agent__put_response_encodable(const Mooncake__Client__Response *r)
{
	return r->body_case == MOONCAKE__CLIENT__RESPONSE__BODY_PUT && r->put &&
	       !(r->message && r->message[0]) && !r->base.n_unknown_fields &&
	       !r->put->base.n_unknown_fields;
}

size_t agent__encode_put_response(uint8_t *out, const Mooncake__Client__Response *r)
{
	if (!agent__put_response_encodable(r))
		return 0;
	/* proto3, fields in order and left out at their default; the
	 * repeated sint32 packed (zigzag varints in one record). */
	size_t n = mc_pb_put_uint(out, 1, r->id);
	n += mc_pb_put_uint(out + n, 2, mc_pb_zigzag32(r->error));
	n += mc_pb_put_uint(out + n, 4, r->nfds);
	size_t errs = 0;
	for (size_t i = 0; i < r->put->n_errors; i++)
		errs += mc_pb_varint_len(mc_pb_zigzag32(r->put->errors[i]));
	/* PutReply: its errors field, when it has any. */
	size_t body = errs ? 1 + mc_pb_varint_len(errs) + errs : 0;
	n += mc_pb_put_tag(out + n, 11, 2);
	n += mc_pb_put_varint(out + n, body);
	if (errs) {
		n += mc_pb_put_tag(out + n, 1, 2);
		n += mc_pb_put_varint(out + n, errs);
		for (size_t i = 0; i < r->put->n_errors; i++)
			n += mc_pb_put_varint(out + n, mc_pb_zigzag32(r->put->errors[i]));
	}
	return n;
}

size_t agent__encode_commit_item(uint8_t *out, const Mooncake__Master__CommitItem *c)
{
	/* proto3: fields in order and left out at their default; a bool 1. */
	size_t n = c->key.len ? mc_pb_put_bytes(out, 1, c->key.data, c->key.len) : 0;
	n += mc_pb_put_uint(out + n, 2, c->offset);
	n += mc_pb_put_uint(out + n, 3, c->size);
	n += mc_pb_put_fixed32(out + n, 4, c->crc32c);
	n += mc_pb_put_uint(out + n, 5, c->checksummed != 0);
	n += mc_pb_put_uint(out + n, 6, c->soft_pin != 0);
	n += mc_pb_put_uint(out + n, 7, c->ttl_ms);
	n += mc_pb_put_uint(out + n, 8, c->promote != 0);
	return n;
}
