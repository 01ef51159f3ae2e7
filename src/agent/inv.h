/*
 * inv.h: the inventory (inv.c) — every COMPLETE object in this agent's
 * segment as the mirror of the master's index knows it, whoever wrote
 * it. Pure; a shared service (the mirror, the master link's re-sync and
 * the operations change it).
 */
#ifndef MC_AGENT_INV_H
#define MC_AGENT_INV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "common/lhash.h"

/* What the mirror knows of one object in the segment. */
struct agent_inv_rec {
	uint64_t offset, size;
	uint32_t crc;
	bool has_crc; /* crc is the value's CRC-32C */
	bool soft_pin;
};

struct agent_inv_entry {
	struct agent_inv_entry *next; /* hash chain */
	struct agent_inv_rec rec;
	uint64_t seq;   /* order of the last change here */
	unsigned epoch; /* the listing that last touched it */
	uint16_t klen;
	uint8_t key[];
};

struct agent_inv {
	struct mc_lhash tab; /* chains of entries by next (common/lhash.h) */
	size_t n;
	uint64_t seq;
	unsigned epoch; /* the listing in progress (or last) */
};

int agent__inv_init(struct agent_inv *v) MC_MUST_CHECK;
void agent__inv_free(struct agent_inv *v);
/* Record (or replace) the object key at rec's place. Errors: -EINVAL
 * (key length), -ENOMEM. */
int agent__inv_add(struct agent_inv *v, const uint8_t *key, size_t klen,
		   const struct agent_inv_rec *rec) MC_MUST_CHECK;
/* Forget the object key (wherever it is). */
void agent__inv_del(struct agent_inv *v, const uint8_t *key, size_t klen);
/* Forget the object key only if it is at offset (a change for another
 * placement of the key is not about this entry). Returns true if it was. */
bool agent__inv_del_at(struct agent_inv *v, const uint8_t *key, size_t klen, uint64_t offset);
void agent__inv_clear(struct agent_inv *v);
/* How many objects it holds. */
size_t agent__inv_count(const struct agent_inv *v);
/*
 * Listings. A listing of the segment runs while the mirror keeps
 * following the log; every change (agent__inv_add/_del*) marks what it
 * touches with the current epoch. agent__inv_listing_start begins a new
 * epoch; the listing's items are added like changes; at its end
 * agent__inv_listing_end forgets every entry the epoch did not touch
 * (neither listed nor changed since the listing began: it was gone
 * before its page was read). Returns how many went.
 */
void agent__inv_listing_start(struct agent_inv *v);
size_t agent__inv_listing_end(struct agent_inv *v);
/*
 * A snapshot for a re-sync: copies of the entries sorted by offset,
 * where of two that overlap only the newer is kept (the older one's
 * space was reused; its bytes are gone). The dropped ones are deleted
 * from the inventory. *out is a malloc'd array of malloc'd copies (free
 * each, then the array). Errors: -ENOMEM.
 */
int agent__inv_snapshot(struct agent_inv *v, struct agent_inv_entry ***out,
			size_t *n) MC_MUST_CHECK;

#endif
