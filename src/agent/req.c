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
