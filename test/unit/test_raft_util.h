/*
 * test_raft_util: helpers shared by the Raft core's tests — deep copies of
 * messages (a transport serializes them before raft_advance frees the
 * ready), a tiny in-memory "disk" that applies a ready the way a WAL would,
 * and a one-line text form of a message for golden traces.
 */
#ifndef TEST_RAFT_UTIL_H
#define TEST_RAFT_UTIL_H

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "meta/raft/raft.h"

/*
 * LeakSanitizer prints its report when a criterion worker exits, but the
 * test still counts as passed, and criterion ignores failures in .fini. So
 * every test is declared with RTEST, which runs the body and then checks
 * for leaks inside the test itself.
 */
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
static inline void tu_leak_check(void)
{
	cr_assert_eq(__lsan_do_recoverable_leak_check(), 0,
		     "memory leaked: see the LeakSanitizer report above");
}
#else
static inline void tu_leak_check(void)
{
}
#endif

#define RTEST(suite, name, ...) \
	static void suite##__##name(void); \
	Test(suite, name, ##__VA_ARGS__) \
	{ \
		suite##__##name(); \
		tu_leak_check(); \
	} \
	static void suite##__##name(void)

static inline void *tu_xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);

	if (!p) {
		fprintf(stderr, "out of memory\n");
		abort();
	}
	return p;
}

static inline void *tu_dup(const void *src, size_t n)
{
	void *p;

	if (n == 0)
		return NULL;
	p = tu_xmalloc(n);
	memcpy(p, src, n);
	return p;
}

/* Deep copy of an entry array. */
static inline struct raft_entry *tu_entries_dup(const struct raft_entry *e, size_t n)
{
	struct raft_entry *c;

	if (n == 0)
		return NULL;
	c = tu_xmalloc(n * sizeof(*c));
	for (size_t k = 0; k < n; k++) {
		c[k] = e[k];
		c[k].data = tu_dup(e[k].data, e[k].len);
	}
	return c;
}

static inline void tu_entries_free(const struct raft_entry *e, size_t n)
{
	for (size_t k = 0; k < n; k++)
		free((void *)e[k].data);
	free((void *)e);
}

static inline void tu_conf_dup(struct raft_conf_state *dst, const struct raft_conf_state *src)
{
	dst->voters = tu_dup(src->voters, src->n_voters * sizeof(uint64_t));
	dst->n_voters = src->n_voters;
	dst->learners = tu_dup(src->learners, src->n_learners * sizeof(uint64_t));
	dst->n_learners = src->n_learners;
}

static inline void tu_conf_free(struct raft_conf_state *c)
{
	free((void *)c->voters);
	free((void *)c->learners);
	memset(c, 0, sizeof(*c));
}

static inline void tu_msg_dup(struct raft_msg *dst, const struct raft_msg *src)
{
	*dst = *src;
	dst->entries = tu_entries_dup(src->entries, src->n_entries);
	dst->ctx = tu_dup(src->ctx, src->ctx_len);
	tu_conf_dup(&dst->snapshot.conf, &src->snapshot.conf);
}

static inline void tu_msg_free(struct raft_msg *m)
{
	tu_entries_free(m->entries, m->n_entries);
	free((void *)m->ctx);
	tu_conf_free(&m->snapshot.conf);
	memset(m, 0, sizeof(*m));
}

/* ------------------------------------------------------------ the disk */

/* What a node's WAL + snapshot file hold. */
struct tu_disk {
	struct raft_hard_state hs;
	struct raft_snapshot_meta snap; /* conf arrays owned */
	struct raft_entry *ents;        /* owned copies, consecutive after snap */
	size_t n, cap;
};

static inline void tu_disk_free(struct tu_disk *d)
{
	tu_entries_free(d->ents, d->n);
	tu_conf_free(&d->snap.conf);
	memset(d, 0, sizeof(*d));
}

/* Drop entries with index >= from. */
static inline void tu_disk_truncate(struct tu_disk *d, uint64_t from)
{
	while (d->n && d->ents[d->n - 1].index >= from) {
		d->n--;
		free((void *)d->ents[d->n].data);
	}
}

static inline void tu_disk_append(struct tu_disk *d, const struct raft_entry *e, size_t n)
{
	if (n == 0)
		return;
	tu_disk_truncate(d, e[0].index);
	if (d->n + n > d->cap) {
		d->cap = (d->n + n) * 2;
		d->ents = realloc(d->ents, d->cap * sizeof(*d->ents));
		if (!d->ents)
			abort();
	}
	for (size_t k = 0; k < n; k++) {
		d->ents[d->n] = e[k];
		d->ents[d->n].data = tu_dup(e[k].data, e[k].len);
		d->n++;
	}
}

/* Install snapshot metadata: every entry goes. */
static inline void tu_disk_set_snapshot(struct tu_disk *d, const struct raft_snapshot_meta *s)
{
	tu_disk_truncate(d, 0);
	tu_conf_free(&d->snap.conf);
	d->snap = *s;
	tu_conf_dup(&d->snap.conf, &s->conf);
}

/* Record a snapshot made locally at index (entries <= index dropped). */
static inline void tu_disk_compact(struct tu_disk *d, const struct raft_snapshot_meta *s)
{
	size_t k = 0;

	while (k < d->n && d->ents[k].index <= s->index)
		free((void *)d->ents[k++].data);
	memmove(d->ents, d->ents + k, (d->n - k) * sizeof(*d->ents));
	d->n -= k;
	tu_conf_free(&d->snap.conf);
	d->snap = *s;
	tu_conf_dup(&d->snap.conf, &s->conf);
}

/* Persist steps 1-2 of a ready. */
static inline void tu_disk_write(struct tu_disk *d, const struct raft_ready *rd)
{
	if (rd->snapshot)
		tu_disk_set_snapshot(d, rd->snapshot);
	tu_disk_append(d, rd->entries, rd->n_entries);
	if (rd->hard_state_changed)
		d->hs = rd->hard_state;
}

/* A restore view of the disk (borrows d). */
static inline struct raft_restore tu_disk_restore(const struct tu_disk *d)
{
	struct raft_restore rs;

	memset(&rs, 0, sizeof(rs));
	rs.hard_state = d->hs;
	rs.snapshot = d->snap;
	rs.entries = d->ents;
	rs.n_entries = d->n;
	return rs;
}

/* ------------------------------------------------------------ text form */

/* "1->2 APP t=2 i=3 lt=1 c=3 [4@2,5@2]" — only the fields the type uses. */
static inline const char *tu_fmt_msg(char *buf, size_t len, const struct raft_msg *m)
{
	size_t n = 0;

#define TU_P(...) \
	do { \
		int w_ = snprintf(buf + n, n < len ? len - n : 0, __VA_ARGS__); \
		if (w_ > 0) \
			n += (size_t)w_; \
	} while (0)
	TU_P("%" PRIu64 "->%" PRIu64 " %s t=%" PRIu64, m->from, m->to,
	     raft_msg_type_name(m->type), m->term);
	switch (m->type) {
	case RAFT_MSG_APP:
		TU_P(" i=%" PRIu64 " lt=%" PRIu64 " c=%" PRIu64 " [", m->index, m->log_term,
		     m->commit);
		for (size_t k = 0; k < m->n_entries; k++)
			TU_P("%s%" PRIu64 "@%" PRIu64 "%s", k ? "," : "", m->entries[k].index,
			     m->entries[k].term,
			     m->entries[k].type == RAFT_ENTRY_CONF_CHANGE ? "cc" : "");
		TU_P("]");
		break;
	case RAFT_MSG_APP_RESP:
		TU_P(" i=%" PRIu64, m->index);
		if (m->reject)
			TU_P(" reject hint=%" PRIu64 " lt=%" PRIu64, m->reject_hint,
			     m->log_term);
		break;
	case RAFT_MSG_VOTE:
	case RAFT_MSG_PREVOTE:
		TU_P(" i=%" PRIu64 " lt=%" PRIu64 "%s", m->index, m->log_term,
		     m->transfer ? " transfer" : "");
		break;
	case RAFT_MSG_VOTE_RESP:
	case RAFT_MSG_PREVOTE_RESP:
		TU_P("%s", m->reject ? " reject" : " grant");
		break;
	case RAFT_MSG_HEARTBEAT:
		TU_P(" c=%" PRIu64, m->commit);
		/* fall through */
	case RAFT_MSG_HEARTBEAT_RESP:
	case RAFT_MSG_READ_INDEX:
		if (m->ctx_len)
			TU_P(" ctx=%.*s", (int)m->ctx_len, (const char *)m->ctx);
		break;
	case RAFT_MSG_READ_INDEX_RESP:
		TU_P(" i=%" PRIu64 " ctx=%.*s", m->index, (int)m->ctx_len,
		     (const char *)m->ctx);
		break;
	case RAFT_MSG_SNAP:
		TU_P(" snap=%" PRIu64 "@%" PRIu64 " voters=%zu", m->snapshot.index,
		     m->snapshot.term, m->snapshot.conf.n_voters);
		break;
	case RAFT_MSG_TIMEOUT_NOW:
		break;
	}
#undef TU_P
	return buf;
}

#endif
