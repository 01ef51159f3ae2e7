/*
 * mirror.h: the segment mirror (mirror.c) — following the master's log
 * of this agent's segment into the inventory (inv.c), listing the
 * segment when behind, and checking bytes against checksums before a
 * re-sync reports them; the log follower it is made of serves the SSD
 * segment's log too. A part below the master link, which starts and
 * stops it; it calls the master calls (mcall.c), the inventory and the
 * statistics.
 */
#ifndef MC_AGENT_MIRROR_H
#define MC_AGENT_MIRROR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "master.pb-c.h"

struct agent;
struct agent_inv_entry;

/*
 * A follower of one segment's log in the master (SyncSegment, and
 * ListSegment pages when behind): the changes and listed items go to its
 * hooks. The DRAM segment's mirror below is one; the SSD tier's moves
 * (demote.c) keep another for the SSD segment. Its state is touched only
 * by mirror.c; its owner embeds it and passes it to the calls below.
 */
struct agent_follow_hooks {
	/* A change of the log (listed false) or an item of a listing (an
	 * ADD, listed true). */
	void (*apply)(struct agent *a, const Mooncake__Master__MirrorEvent *e, bool listed);
	/* A listing begins; it ended (every page applied): returns how many
	 * entries it forgot. */
	void (*list_start)(struct agent *a);
	size_t (*list_end)(struct agent *a);
	/* An answer's n changes are applied (n may be 0). */
	void (*applied)(struct agent *a, uint64_t n);
};

struct agent_follow {
	struct agent *a;
	const char *segment; /* borrowed: the owner's */
	const struct agent_follow_hooks *h;
	bool on, busy;
	unsigned gen; /* bumped per start: older answers dropped */
	uint64_t seq; /* the log is applied up to here */
	bool listing, listing_busy;
	uint64_t list_cursor;
	uv_timer_t timer;
	uint64_t retry_ms;
};

/* The MirrorEvent encoded in p[0, len) into *e, as protobuf-c would
 * unpack it; e->key points into p, e->source_segment into name (of
 * name_cap bytes, NUL-terminated). 1: not decoded here (a field with
 * another wire type than its own, or a longer source segment): unpack it
 * with protobuf-c, which also says whether it is valid. -EBADMSG: not a
 * valid encoding. */
int agent__mirror_event_decode(const uint8_t *p, size_t len, Mooncake__Master__MirrorEvent *e,
			       char *name, size_t name_cap);

void agent__follow_init(struct agent *a, struct agent_follow *f, const char *segment,
			const struct agent_follow_hooks *h);
/* Follow the log after seq (a mount's mirror_seq); an earlier loop is
 * abandoned. */
void agent__follow_start(struct agent_follow *f, uint64_t seq);
void agent__follow_stop(struct agent_follow *f);
/* Stop, and close the timer; on_closed gets it with data pointing at the
 * agent. Returns how many handles (1). */
unsigned agent__follow_close(struct agent_follow *f, uv_close_cb on_closed);
uint64_t agent__follow_seq(const struct agent_follow *f);

/* The mirror's state, embedded in struct agent (touched only by
 * mirror.c). */
struct agent_mirror {
	struct agent_follow f;
	bool oom_told;
};

void agent__mirror_init(struct agent *a);
/* Follow the segment's log after seq (a mount's mirror_seq); an earlier
 * loop is abandoned. */
void agent__mirror_start(struct agent *a, uint64_t seq);
/* Stop following (the master link moved, or stopping). */
void agent__mirror_stop(struct agent *a);
/* Stop, and close the timer; on_closed gets it with data pointing at
 * the agent. Returns how many handles (1). */
unsigned agent__mirror_close(struct agent *a, uv_close_cb on_closed);
/* Where the mirror is in the segment's log. */
uint64_t agent__mirror_seq(const struct agent *a);
enum agent_verify { AGENT_VERIFY_OK = 0, AGENT_VERIFY_BAD, AGENT_VERIFY_UNCHECKED };
/* Check the bytes of n entries against their checksums (a copy thread):
 * verdict[i] is enum agent_verify. */
void agent__mirror_verify(struct agent *a, struct agent_inv_entry *const *items, size_t n,
			  uint8_t *verdict);

#endif
