/*
 * remove: RemoveAll and RemoveRegex, walks over the whole index.
 *
 * A walk over millions of objects takes seconds (0.3 us an object that
 * does not match, some 2.7 us one removed), and on the loop every other
 * call would wait for it: puts, gets, heartbeats. So a walk runs in
 * slices of about SLICE_NS, one per loop turn, through a uv_idle handle
 * that is active while any walk is (the loop then polls without waiting,
 * so calls that came meanwhile are served between slices). The first
 * slice runs in the call itself: a small index answers at once.
 *
 * The core keeps the index from adding buckets while a walk is open
 * (master__walk_begin): each object there at the start is looked at
 * exactly once, and the counts are exact. Objects put meanwhile may be
 * removed or not. At most MAX_WALKS run at once; a call past them is
 * refused RESOURCE_EXHAUSTED. A walk whose client goes away (its
 * deadline passed) runs on to its end, as it did on the loop before,
 * and says in the log what it removed; a master that stops leading
 * answers every walk NOT_LEADER (the index goes with the leadership).
 *
 * The same slices walk the index for the core's reaper: the replicas of
 * segments gone (an agent's expiry, unmount or restart), which read as
 * gone from the moment the segment goes, are dropped here, and objects
 * left with none removed (core.h). master__reap_kick starts it after a
 * call or tick that made a segment go, with a first slice at once.
 */
#include <errno.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "master.pb-c.h"
#include "master/master_int.h"
#include "rpc/rpc.h"

#define LOG_SUBSYS LOGS_MASTER

#define MAX_WALKS 8
#define SLICE_NS 5000000ull /* of the loop, per turn, for all walks */
#define STEP_OBJECTS 256u   /* between looks at the clock */
#define MAX_PATTERN_SHOWN 200
#define MAX_PATTERN_BYTES 4096 /* (said in pattern_refused's answers) */
#define MAX_PATTERN_REPEATS 65536

struct master_rmwalk {
	struct master_rmwalk *prev, *next;
	struct rpc_call *call; /* NULL once its client went away */
	struct master_walk w;
	regex_t re;
	bool has_re;
	char pattern[MAX_PATTERN_SHOWN + 4]; /* for the log ("..." past it) */
	uint64_t start_ns;
};

static void on_idle(uv_idle_t *h);

/* The idle handle runs while a walk or the reaper has work. */
static void idle_update(struct master *m)
{
	if (m->rmwalks || master__reap_pending(m->core))
		uv_idle_start(&m->rm_idle, on_idle);
	else
		uv_idle_stop(&m->rm_idle);
}

static void unlink_walk(struct master *m, struct master_rmwalk *rw)
{
	if (rw->prev)
		rw->prev->next = rw->next;
	else
		m->rmwalks = rw->next;
	if (rw->next)
		rw->next->prev = rw->prev;
	rw->prev = rw->next = NULL;
	m->nrmwalks--;
	idle_update(m);
}

static void free_walk(struct master_rmwalk *rw)
{
	if (rw->has_re)
		regfree(&rw->re);
	free(rw);
}

static void answer(struct master_rmwalk *rw)
{
	Mooncake__Master__RemoveAllResponse resp = MOONCAKE__MASTER__REMOVE_ALL_RESPONSE__INIT;
	resp.removed = rw->w.removed;
	resp.skipped = rw->w.skipped;
	double s = (double)(uv_hrtime() - rw->start_ns) / 1e9;
	const char *gone = rw->call ? "" : "; its client had gone";
	if (rw->has_re)
		log_info("RemoveRegex '%s'%s: %llu removed, %llu leased left (%.2f s%s)",
			 rw->pattern, rw->w.force ? " (forced)" : "",
			 (unsigned long long)resp.removed, (unsigned long long)resp.skipped, s,
			 gone);
	else
		log_info("RemoveAll%s: %llu removed, %llu left (%.2f s%s)",
			 rw->w.force ? " (forced)" : "", (unsigned long long)resp.removed,
			 (unsigned long long)resp.skipped, s, gone);
	if (!rw->call)
		return;
	rpc_call_set_data(rw->call, NULL);
	master__reply(rw->call, &resp.base);
}

/* Walk rw on until its end or until the clock passes until_ns; true at
 * its end. */
static bool walk_on(struct master *m, struct master_rmwalk *rw, uint64_t until_ns)
{
	uint64_t now = uv_now(m->loop);
	while (!master__walk_step(m->core, &rw->w, STEP_OBJECTS, now))
		if (uv_hrtime() >= until_ns)
			return false;
	return true;
}

/* What a reaper's slice is asked for: segment slot's count (MASTER_NO_SEGMENT: none). */
struct reap_ask {
	uint32_t slot;
	bool done;
	uint64_t removed;
};

static void reaped(void *ud, const struct master_reaped *r)
{
	struct reap_ask *ask = ud;
	log_info("segment %s gone: its %llu replicas dropped, %llu objects removed with it",
		 r->name, (unsigned long long)r->dropped, (unsigned long long)r->removed);
	if (r->slot == ask->slot) {
		ask->done = true;
		ask->removed = r->removed;
	}
}

/* The reaper on until its end or until the clock passes until_ns; true
 * at its end. */
static bool reap_on(struct master *m, uint64_t until_ns, struct reap_ask *ask)
{
	while (!master__reap_step(m->core, STEP_OBJECTS, reaped, ask))
		if (uv_hrtime() >= until_ns)
			return false;
	return true;
}

uint64_t master__reap_kick(struct master *m, uint32_t slot)
{
	struct reap_ask ask = {.slot = slot};
	if (!master__reap_pending(m->core))
		return 0;
	reap_on(m, uv_hrtime() + SLICE_NS, &ask);
	idle_update(m);
	return ask.done ? ask.removed : master__reap_removed(m->core, slot);
}

/* One turn: each walk, and the reaper, gets its share of the slice. */
static void on_idle(uv_idle_t *h)
{
	struct master *m = h->data;
	bool reap = master__reap_pending(m->core);
	unsigned n = m->nrmwalks + reap;
	uint64_t share = SLICE_NS / (n ? n : 1);
	struct reap_ask ask = {.slot = MASTER_NO_SEGMENT};
	if (reap)
		reap_on(m, uv_hrtime() + share, &ask);
	for (struct master_rmwalk *rw = m->rmwalks, *next; rw; rw = next) {
		next = rw->next;
		if (!walk_on(m, rw, uv_hrtime() + share))
			continue;
		unlink_walk(m, rw);
		answer(rw);
		free_walk(rw);
	}
	idle_update(m);
}

/* Start rw (its walk's match set): answered at once when one slice
 * covers the index, else parked. */
static void start(struct master *m, struct rpc_call *call, struct master_rmwalk *rw)
{
	rw->call = call;
	rw->start_ns = uv_hrtime();
	master__walk_begin(m->core, &rw->w);
	if (walk_on(m, rw, rw->start_ns + SLICE_NS)) {
		answer(rw);
		free_walk(rw);
		return;
	}
	rpc_call_set_data(call, rw);
	rw->next = m->rmwalks;
	if (m->rmwalks)
		m->rmwalks->prev = rw;
	m->rmwalks = rw;
	m->nrmwalks++;
	idle_update(m);
}

static bool too_many(struct master *m, struct rpc_call *call)
{
	if (m->nrmwalks < MAX_WALKS)
		return false;
	char msg[160];
	snprintf(msg, sizeof(msg),
		 "%u RemoveAll/RemoveRegex calls are in progress, the most at once; retry "
		 "once one is answered",
		 (unsigned)m->nrmwalks);
	rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, msg);
	return true;
}

/* A walk for call, or NULL after answering it. */
static struct master_rmwalk *walk_new(struct rpc_call *call)
{
	struct master_rmwalk *rw = calloc(1, sizeof(*rw));
	if (!rw)
		rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, "out of memory");
	return rw;
}

void master__on_remove_all(struct rpc_call *call, const ProtobufCMessage *msg)
{
	struct master *m = master__leader_of(call);
	const Mooncake__Master__RemoveAllRequest *req = (const void *)msg;
	struct master_rmwalk *rw;
	if (!m || too_many(m, call) || !(rw = walk_new(call)))
		return;
	rw->w.force = req->force;
	rw->w.pending = true;
	start(m, call, rw);
}

/* A key matches when regexec finds the pattern in it; a key holding a
 * NUL byte never does (POSIX patterns see C strings). */
static bool regex_match(void *ud, const uint8_t *key, size_t klen)
{
	char buf[MASTER_MAX_KEY_BYTES + 1];
	if (klen > MASTER_MAX_KEY_BYTES || memchr(key, 0, klen))
		return false;
	memcpy(buf, key, klen);
	buf[klen] = '\0';
	return regexec(ud, buf, 0, NULL, 0) == 0;
}

/*
 * Why pattern p is refused before regcomp sees it, or NULL. glibc's
 * regexec is a DFA walk, linear in the key, except with back-references,
 * whose matching time grows steeply with the key (a 160-byte key took
 * 0.5 s for "(a|aa)*\1\1b"); and regcomp writes out bounded repetitions,
 * so "(a{1000}){1000}" takes 200 MB and 0.2 s, and each factor more a
 * thousand times that. Keys are at most MASTER_MAX_KEY_BYTES long: no
 * pattern needs either.
 */
static const char *pattern_refused(const char *p)
{
	if (strlen(p) > MAX_PATTERN_BYTES)
		return "it is longer than 4096 bytes";
	uint64_t product = 1;
	while (*p) {
		if (*p == '\\') {
			if (p[1] >= '1' && p[1] <= '9')
				return "back-references (\\1 to \\9) are not supported: their "
				       "matching time grows without bound";
			p += p[1] ? 2 : 1;
		} else if (*p == '[') {
			/* A bracket expression: to its ']' (one right after '[' or
			 * "[^" is a member), past [:class:], [=x=] and [.x.]. */
			p++;
			if (*p == '^')
				p++;
			if (*p == ']')
				p++;
			while (*p && *p != ']') {
				if (*p == '[' && (p[1] == ':' || p[1] == '=' || p[1] == '.')) {
					const char *end = strchr(p + 2, p[1]);
					p = end && end[1] == ']' ? end + 2 : p + 1;
				} else {
					p++;
				}
			}
			if (*p)
				p++;
		} else if (*p == '{') {
			/* A bound {n}, {n,} or {n,m}: what regcomp writes out
			 * multiplies with every other one (counted as nested, which
			 * is the worst case). */
			char *end;
			unsigned long n = strtoul(p + 1, &end, 10);
			if (*end == ',' && end[1] != '}')
				n = strtoul(end + 1, &end, 10);
			product *= (uint64_t)MC_MIN(n, (unsigned long)UINT32_MAX) + 1;
			if (product > MAX_PATTERN_REPEATS)
				return "its repetition bounds multiply past 65536 (regcomp "
				       "writes each repetition out)";
			p++;
		} else {
			p++;
		}
	}
	return NULL;
}

void master__on_remove_regex(struct rpc_call *call, const ProtobufCMessage *msg)
{
	struct master *m = master__leader_of(call);
	const Mooncake__Master__RemoveRegexRequest *req = (const void *)msg;
	struct master_rmwalk *rw;
	if (!m || too_many(m, call) || !(rw = walk_new(call)))
		return;
	const char *pat = req->pattern ? req->pattern : "";
	snprintf(rw->pattern, sizeof(rw->pattern), "%.*s%s", MAX_PATTERN_SHOWN, pat,
		 strlen(pat) > MAX_PATTERN_SHOWN ? "..." : "");
	const char *why = pattern_refused(pat);
	if (!why && regcomp(&rw->re, pat, REG_EXTENDED | REG_NOSUB) != 0)
		why = "it is not a POSIX extended regular expression";
	if (why) {
		char text[sizeof(rw->pattern) + 256];
		snprintf(text, sizeof(text), "%d %s: pattern '%s' refused: %s", -EINVAL,
			 mc_strerror(-EINVAL), rw->pattern, why);
		rpc_call_finish(call, master__rpc_status(-EINVAL), text);
		free(rw);
		return;
	}
	rw->has_re = true;
	rw->w.match = regex_match;
	rw->w.ud = &rw->re;
	rw->w.force = req->force;
	start(m, call, rw);
}

void master__on_remove_cancel(struct rpc_call *call)
{
	struct master_rmwalk *rw = rpc_call_data(call);
	if (!rw)
		return;
	log_info("%s: its client went away after %llu removed; walking on to the end",
		 rw->has_re ? "RemoveRegex" : "RemoveAll", (unsigned long long)rw->w.removed);
	rw->call = NULL;
	rpc_call_set_data(call, NULL);
	rpc_call_finish(call, RPC_CANCELLED, NULL);
}

void master__remove_init(struct master *m)
{
	uv_idle_init(m->loop, &m->rm_idle);
	m->rm_idle.data = m;
}

void master__remove_drop_all(struct master *m)
{
	while (m->rmwalks) {
		struct master_rmwalk *rw = m->rmwalks;
		master__walk_abort(m->core, &rw->w);
		unlink_walk(m, rw);
		if (rw->call) {
			rpc_call_set_data(rw->call, NULL);
			master__finish_not_leader(m, rw->call);
		}
		free_walk(rw);
	}
}

void master__remove_close(struct master *m, uv_close_cb cb)
{
	master__remove_drop_all(m);
	m->rm_idle.data = m;
	uv_close((uv_handle_t *)&m->rm_idle, cb);
}

void master__remove_free(struct master *m)
{
	while (m->rmwalks) {
		struct master_rmwalk *rw = m->rmwalks;
		m->rmwalks = rw->next;
		free_walk(rw);
	}
	m->nrmwalks = 0;
}
