/*
 * demote.h: the SSD tier's moves (demote.c) — the master's orders read
 * from the SSD segment's log (FETCH: copy a cold object from a DRAM
 * replica into the tier; DEL: delete a copy the master evicted or
 * removed), the DRAM segment written down at a graceful stop
 * (--ssd-flush-on-stop), and what the tier stored, gave up or lost,
 * told to the master (TierCommit). A part below the master link, which
 * starts and stops its log follower; it calls the mirror's follower, the
 * master calls, the tier, the copy threads, the transfers, the inventory
 * and the statistics.
 */
#ifndef MC_AGENT_DEMOTE_H
#define MC_AGENT_DEMOTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "agent/inv.h"
#include "agent/mirror.h"

struct agent;
struct demote_fetch;
struct demote_item;

/* FETCH orders copied at once, and their bytes. */
#define AGENT_FETCHES 8u
#define AGENT_FETCH_BYTES (256ull << 20)
/* Items of one TierCommit call. */
#define AGENT_TIER_BATCH 1024u

/* The moves' state, embedded in struct agent (touched only by
 * demote.c). */
struct agent_demote {
	struct agent_follow f; /* the SSD segment's log */
	/* FETCH orders waiting, and those being copied */
	struct demote_fetch *head, *tail;
	unsigned running;
	uint64_t running_bytes;
	/* TierCommit items waiting for the call in flight */
	struct demote_item *items, *items_tail;
	size_t nitems;
	bool busy;
	/* A listing of the SSD segment (behind its log): the keys listed or
	 * added since it began, and the newest object stored before. */
	struct agent_inv listed;
	bool listing;
	uint64_t list_seq;
	/* The flush at a graceful stop */
	bool flush_on_stop, flushing;
	struct agent_inv_entry **flush_items;
	size_t flush_n, flush_pos, flush_done_n, flush_stored;
	unsigned flush_running;
	void (*flush_done)(struct agent *a);
};

void agent__demote_init(struct agent *a, bool flush_on_stop);
void agent__demote_free(struct agent *a);
/* Follow the SSD segment's log after seq (its mount's mirror_seq). */
void agent__demote_start(struct agent *a, uint64_t seq);
void agent__demote_stop(struct agent *a);
unsigned agent__demote_close(struct agent *a, uv_close_cb on_closed);
/* FETCH orders and TierCommit calls not finished (a stop waits). */
bool agent__demote_busy(const struct agent *a);

/* Tell the master that the tier stored a new object (a put naming the
 * SSD tier) at offset: cb(ud, 0) once it is in the index, or the item's
 * error (the copy is deleted then), or the call's. */
void agent__demote_put(struct agent *a, const uint8_t *key, size_t klen, uint64_t offset,
		       uint64_t size, uint32_t crc, bool soft_pin, uint64_t ttl_ms,
		       void (*cb)(void *ud, int err), void *ud);

/* With --ssd-flush-on-stop and an SSD tier: write every object of the DRAM
 * segment (the mirror's inventory) into the tier, then done(a); at once
 * (done called, returns false) otherwise. */
bool agent__demote_flush(struct agent *a, void (*done)(struct agent *a));

#endif
