/*
 * mlog: a segment's mirror log — the changes of its COMPLETE replicas, in
 * order, kept until the segment's owner acknowledges them. See
 * master_int.h and proto/master.proto (SyncSegment).
 *
 * Records are packed one after another into chunks (CHUNK_BYTES, or one
 * record if larger), a fixed header then the key, each padded to 8 bytes.
 * Appending writes at the tail chunk; acknowledging and dropping advance
 * a read position in the head chunk and free chunks left behind. No
 * record is ever allocated on its own, so a log costs about its key bytes
 * plus REC_HDR per change, and nothing when the owner keeps up.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "master/core.h"

#define CHUNK_BYTES (64u * 1024)

struct rec_hdr {
	uint64_t seq, offset, size;
	uint32_t crc;
	uint16_t klen;
	uint8_t op, flags;
};

#define REC_HDR sizeof(struct rec_hdr)

struct chunk {
	struct chunk *next;
	size_t used, cap;
	uint8_t data[];
};

struct master_mlog {
	struct chunk *head, *tail;
	size_t head_pos; /* first live record in head */
	uint64_t base;   /* the log is complete after this seq */
	uint64_t last;   /* newest seq appended (base when none) */
	uint64_t acked;  /* the owner's last acknowledgement */
	uint64_t nrecs;  /* records retained */
	size_t bytes;    /* bytes of retained records */
	size_t budget;
};

static size_t rec_len(size_t klen)
{
	return (REC_HDR + klen + 7) & ~(size_t)7;
}

int master__mlog_new(size_t budget_bytes, uint64_t start_seq, struct master_mlog **out)
{
	struct master_mlog *l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	l->budget = budget_bytes;
	l->base = l->last = l->acked = start_seq;
	*out = l;
	return 0;
}

static void free_chunks(struct master_mlog *l)
{
	while (l->head) {
		struct chunk *c = l->head;
		l->head = c->next;
		free(c);
	}
	l->tail = NULL;
	l->head_pos = 0;
	l->bytes = 0;
	l->nrecs = 0;
}

void master__mlog_free(struct master_mlog *l)
{
	if (!l)
		return;
	free_chunks(l);
	free(l);
}

void master__mlog_reset(struct master_mlog *l, uint64_t start_seq)
{
	free_chunks(l);
	l->base = l->last = l->acked = start_seq;
}

/* Drop the oldest record; returns its seq. The log must not be empty. */
static uint64_t drop_one(struct master_mlog *l)
{
	struct chunk *c = l->head;
	struct rec_hdr h;
	memcpy(&h, c->data + l->head_pos, REC_HDR);
	size_t len = rec_len(h.klen);
	l->head_pos += len;
	l->bytes -= len;
	l->nrecs--;
	if (l->head_pos >= c->used) {
		l->head = c->next;
		if (!l->head)
			l->tail = NULL;
		free(c);
		l->head_pos = 0;
	}
	return h.seq;
}

void master__mlog_lose(struct master_mlog *l, uint64_t seq)
{
	/* What came before is no longer complete: owners asking for it are
	 * behind. */
	free_chunks(l);
	if (seq > l->base)
		l->base = seq;
	if (seq > l->last)
		l->last = seq;
}

int master__mlog_append(struct master_mlog *l, const struct master_ev *e)
{
	size_t len = rec_len(e->klen);
	struct chunk *t = l->tail;
	if (!t || t->cap - t->used < len) {
		size_t cap = len > CHUNK_BYTES ? len : CHUNK_BYTES;
		struct chunk *c = malloc(sizeof(*c) + cap);
		if (!c) {
			master__mlog_lose(l, e->seq);
			return -ENOMEM;
		}
		c->next = NULL;
		c->used = 0;
		c->cap = cap;
		if (t)
			t->next = c;
		else
			l->head = c;
		l->tail = t = c;
	}
	struct rec_hdr h = {.seq = e->seq,
			    .offset = e->offset,
			    .size = e->size,
			    .crc = e->crc,
			    .klen = e->klen,
			    .op = e->op,
			    .flags = e->flags};
	uint8_t *p = t->data + t->used;
	memcpy(p, &h, REC_HDR);
	memcpy(p + REC_HDR, e->key, e->klen);
	memset(p + REC_HDR + e->klen, 0, len - REC_HDR - e->klen);
	t->used += len;
	l->bytes += len;
	l->nrecs++;
	l->last = e->seq;
	/* Over budget: the oldest go, and with them the log's completeness
	 * before them. The newest record always stays. */
	while (l->bytes > l->budget && l->nrecs > 1) {
		uint64_t s = drop_one(l);
		if (s > l->base)
			l->base = s;
	}
	return 0;
}

void master__mlog_ack(struct master_mlog *l, uint64_t seq)
{
	if (seq > l->last)
		return; /* not from this log */
	if (seq > l->acked)
		l->acked = seq;
	while (l->head) {
		struct rec_hdr h;
		memcpy(&h, l->head->data + l->head_pos, REC_HDR);
		if (h.seq > seq)
			break;
		drop_one(l);
	}
	if (seq > l->base)
		l->base = seq;
}

int master__mlog_read(const struct master_mlog *l, uint64_t after, size_t max_events,
		      size_t max_bytes, void (*fn)(void *ud, const struct master_ev *e),
		      void *ud, size_t *nread)
{
	*nread = 0;
	if (after < l->base || after > l->last)
		return MC_ECOMPACTED;
	size_t bytes = 0;
	size_t pos = l->head_pos;
	for (const struct chunk *c = l->head; c; c = c->next, pos = 0) {
		while (pos < c->used) {
			struct rec_hdr h;
			memcpy(&h, c->data + pos, REC_HDR);
			const uint8_t *key = c->data + pos + REC_HDR;
			pos += rec_len(h.klen);
			if (h.seq <= after)
				continue;
			if (*nread == max_events || (*nread > 0 && bytes + h.klen > max_bytes))
				return 0;
			struct master_ev e = {.seq = h.seq,
					      .offset = h.offset,
					      .size = h.size,
					      .crc = h.crc,
					      .klen = h.klen,
					      .op = h.op,
					      .flags = h.flags,
					      .key = key};
			fn(ud, &e);
			bytes += REC_HDR + h.klen;
			(*nread)++;
		}
	}
	return 0;
}

bool master__mlog_has_after(const struct master_mlog *l, uint64_t after)
{
	return l->last > after || after < l->base;
}

void master__mlog_stats(const struct master_mlog *l, struct master_mlog_stats *st)
{
	st->base = l->base;
	st->last = l->last;
	st->acked = l->acked;
	st->records = l->nrecs;
	st->bytes = l->bytes;
}
