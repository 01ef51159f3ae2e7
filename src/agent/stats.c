/*
 * stats: the agent's statistics. It registers every metric of the agent
 * (mooncake_agent_*), keeps the counters a client's Stats request reads,
 * and records each request's result and latency by op. The parts push
 * their figures here (agent__count, agent__gauge) when they change; this
 * file reads no part's state, so any part may call it.
 */
#include "agent/stats.h"

#include "client.pb-c.h"
#include "common/metrics.h"
#include "common/util.h"

/* Names of request ops (Request.op field numbers 10..21) for metrics. */
static const char *const op_names[] = {
	"hello",
	"put",
	"get",
	"exist",
	"remove",
	"remove_all",
	"register_buffer",
	"unregister_buffer",
	"alloc_buffer",
	"transfer",
	"stats",
	"release",
};
#define OP_FIRST MOONCAKE__CLIENT__REQUEST__OP_HELLO
#define NOPS (sizeof(op_names) / sizeof(op_names[0]))

_Static_assert(NOPS <= AGENT_STATS_OPS, "room for every named op");

static const char *op_name(int op)
{
	if (op >= OP_FIRST && op < OP_FIRST + (int)NOPS)
		return op_names[op - OP_FIRST];
	return "unknown";
}

void agent__count(struct agent_stats *s, enum agent_counter c, uint64_t n)
{
	s->counters[c] += n;
	metric_add(s->m_counters[c], n);
}

uint64_t agent__counter(const struct agent_stats *s, enum agent_counter c)
{
	return s->counters[c];
}

void agent__gauge(struct agent_stats *s, enum agent_gauge g, int64_t v)
{
	metric_set(s->m_gauges[g], v);
}

void agent__stats_spin(struct agent_stats *s, uint64_t ns)
{
	metric_observe(s->m_spin, (double)ns / 1e9);
}

static struct metric *requests_counter(struct agent_stats *s, const char *name, int err)
{
	return metrics_counter(s->reg, "mooncake_agent_requests_total",
			       "Client requests served, by operation and result "
			       "(error: the request or one of its items failed; a "
			       "get miss is not an error).",
			       "op,result", (const char *[]){name, err ? "error" : "ok"});
}

void agent__op_done(struct agent_stats *s, int op, int err, uint64_t start_ns)
{
	const char *name = op_name(op);
	int i = op - OP_FIRST;
	if (i < 0 || (size_t)i >= NOPS) {
		metric_inc(requests_counter(s, name, err));
		return;
	}
	/* Looked up once per op and result: this runs for every request. */
	struct metric **m = &s->m_op_requests[i][err != 0];
	if (!*m)
		*m = requests_counter(s, name, err);
	metric_inc(*m);
	if (!s->m_op_seconds[i])
		s->m_op_seconds[i] = metrics_histogram(
			s->reg, "mooncake_agent_request_seconds",
			"Time from a client request's arrival to its reply.", "op",
			(const char *[]){name}, metrics_latency_buckets,
			metrics_latency_nbuckets);
	metric_observe(s->m_op_seconds[i], (double)(mc_now_ns() - start_ns) / 1e9);
}

void agent__stats_init(struct agent_stats *s, struct metrics_registry *r,
		       uint64_t segment_bytes, bool hugepages, uint64_t staging_bytes)
{
	s->reg = r;
	metric_set(metrics_gauge(r, "mooncake_agent_segment_bytes",
				 "DRAM this agent contributes to the pool.", NULL, NULL),
		   (int64_t)segment_bytes);
	metric_set(metrics_gauge(r, "mooncake_agent_segment_hugepages",
				 "1 when the segment is backed by huge pages.", NULL, NULL),
		   hugepages);
	metric_set(metrics_gauge(r, "mooncake_agent_local_buffer_bytes",
				 "Staging buffer size of a client session "
				 "(--local-buffer-size).",
				 NULL, NULL),
		   (int64_t)staging_bytes);
	struct metric **g = s->m_gauges;
	g[AGENT_G_STAGING] = metrics_gauge(r, "mooncake_agent_staging_bytes",
					   "Staging buffer bytes held by open sessions.", NULL,
					   NULL);
	g[AGENT_G_CLIENTS] = metrics_gauge(r, "mooncake_agent_clients",
					   "Open client sessions.", NULL, NULL);
	g[AGENT_G_BUFFERS] = metrics_gauge(r, "mooncake_agent_buffers",
					   "Client buffers registered or allocated.", NULL,
					   NULL);
	g[AGENT_G_VIEWS] = metrics_gauge(r, "mooncake_agent_views",
					 "Zero-copy views held by clients.", NULL, NULL);
	g[AGENT_G_INVENTORY] = metrics_gauge(
		r, "mooncake_agent_inventory_objects",
		"Objects in this agent's segment as its mirror of the "
		"master's index knows them (re-reported after a master "
		"failover).",
		NULL, NULL);
	g[AGENT_G_MASTER_VIEW] = metrics_gauge(
		r, "mooncake_agent_master_view",
		"View number of the master leader the segment is "
		"mounted with.",
		NULL, NULL);
	g[AGENT_G_REMOTE_LEASE] = metrics_gauge(
		r, "mooncake_agent_remote_lease_bytes",
		"Bytes of remote leases (space of other agents' "
		"segments for puts onto them) not taken by puts yet "
		"and still usable.",
		NULL, NULL);
	g[AGENT_G_PUT_LEASE] = metrics_gauge(
		r, "mooncake_agent_put_lease_bytes",
		"Bytes of the put lease (--put-lease-size) not taken by "
		"puts yet.",
		NULL, NULL);
	g[AGENT_G_MOUNTED] = metrics_gauge(r, "mooncake_agent_segment_mounted",
					   "1 while the segment is mounted with the master "
					   "leader.",
					   NULL, NULL);
	struct metric **c = s->m_counters;
	c[AGENT_C_PUTS] = metrics_counter(r, "mooncake_agent_puts_total", "Objects stored.",
					  NULL, NULL);
	c[AGENT_C_PUT_FAILS] = metrics_counter(
		r, "mooncake_agent_put_failures_total",
		"Puts that failed (exists, no space, transfer errors, ...).", NULL, NULL);
	c[AGENT_C_GETS] = metrics_counter(r, "mooncake_agent_gets_total", "Objects asked for.",
					  NULL, NULL);
	c[AGENT_C_LOCAL_HITS] = metrics_counter(r, "mooncake_agent_get_hits_total",
						"Gets served, by where the replica was.",
						"source", (const char *[]){"local"});
	c[AGENT_C_REMOTE_HITS] = metrics_counter(r, "mooncake_agent_get_hits_total",
						 "Gets served, by where the replica was.",
						 "source", (const char *[]){"remote"});
	c[AGENT_C_MISSES] = metrics_counter(r, "mooncake_agent_get_misses_total",
					    "Gets of objects not in the pool.", NULL, NULL);
	c[AGENT_C_BYTES_WRITTEN] = metrics_counter(r, "mooncake_agent_bytes_total",
						   "Object bytes moved for clients.",
						   "direction", (const char *[]){"written"});
	c[AGENT_C_LEASE_CACHE_HITS] = metrics_counter(
		r, "mooncake_agent_lease_cache_hits_total",
		"Gets of local replicas answered within a read lease the agent "
		"already held, without asking the master.",
		NULL, NULL);
	c[AGENT_C_TABLE_GETS] = metrics_counter(
		r, "mooncake_agent_client_table_gets_total",
		"Gets of local replicas the clients answered themselves from the "
		"shared lease table (--client-lease-table), as they count them; "
		"also in the gets, hits, lease cache hits and bytes read.",
		NULL, NULL);
	c[AGENT_C_LEASE_RENEWALS] = metrics_counter(
		r, "mooncake_agent_lease_renewals_total",
		"Cached read leases renewed in the background by a get in the "
		"second half of their window.",
		NULL, NULL);
	c[AGENT_C_BYTES_READ] = metrics_counter(r, "mooncake_agent_bytes_total",
						"Object bytes moved for clients.", "direction",
						(const char *[]){"read"});
	c[AGENT_C_MIRROR_EVENTS] = metrics_counter(
		r, "mooncake_agent_mirror_events_total",
		"Changes of this agent's segment applied to its mirror from the "
		"master's log.",
		NULL, NULL);
	c[AGENT_C_MIRROR_LISTINGS] = metrics_counter(
		r, "mooncake_agent_mirror_listings_total",
		"Listings of the whole segment (the mirror fell behind the master's "
		"log).",
		NULL, NULL);
	const char *rs = "Objects of the mirror left out of a re-sync report, by reason.";
	c[AGENT_C_RESYNC_BAD] = metrics_counter(r, "mooncake_agent_resync_skipped_total", rs,
						"reason", (const char *[]){"checksum"});
	c[AGENT_C_RESYNC_UNCHECKED] = metrics_counter(r, "mooncake_agent_resync_skipped_total",
						      rs, "reason",
						      (const char *[]){"unchecked"});
	c[AGENT_C_RESYNC_CONFLICTS] = metrics_counter(r, "mooncake_agent_resync_skipped_total",
						      rs, "reason",
						      (const char *[]){"conflict"});
	s->m_spin = metrics_histogram(
		r, "mooncake_agent_busy_poll_seconds",
		"Periods the loop polled without sleeping after requests and "
		"replies (--busy-poll-us): CPU spent for latency.",
		NULL, NULL, metrics_latency_buckets, metrics_latency_nbuckets);
	c[AGENT_C_LEASE_CACHE_STALE] = metrics_counter(
		r, "mooncake_agent_lease_cache_stale_total",
		"Cached replicas on other agents' segments whose bytes did not "
		"match their checksum or could not be read: the get asked the "
		"master instead.",
		NULL, NULL);
	c[AGENT_C_PUT_COMMITS] = metrics_counter(
		r, "mooncake_agent_put_commits_total",
		"Puts written into space the master leased to this agent and sealed "
		"with one master call (BatchCommit).",
		NULL, NULL);
	c[AGENT_C_SSD_HITS] = metrics_counter(r, "mooncake_agent_get_hits_total",
					      "Gets served, by where the replica was.",
					      "source", (const char *[]){"ssd"});
	c[AGENT_C_SSD_REMOTE_HITS] = metrics_counter(r, "mooncake_agent_get_hits_total",
						     "Gets served, by where the replica was.",
						     "source", (const char *[]){"remote_ssd"});
	c[AGENT_C_SSD_PEER_READS] = metrics_counter(
		r, "mooncake_agent_ssd_peer_reads_total",
		"Objects of this agent's SSD tier read for other agents' gets.", NULL, NULL);
	c[AGENT_C_SSD_DEMOTIONS] = metrics_counter(
		r, "mooncake_agent_ssd_demotions_total",
		"Objects copied from DRAM into this agent's SSD tier and taken by "
		"the master (their DRAM replicas then left).",
		NULL, NULL);
	c[AGENT_C_SSD_DEMOTE_FAILS] = metrics_counter(
		r, "mooncake_agent_ssd_demotion_failures_total",
		"Demotions into this agent's SSD tier given up (read failed, bytes "
		"not matching, no room) or refused by the master.",
		NULL, NULL);
	c[AGENT_C_SSD_PROMOTIONS] = metrics_counter(
		r, "mooncake_agent_ssd_promotions_total",
		"Objects of the SSD tier copied back to the DRAM segment on a hit "
		"(--ssd-promote-on-hit).",
		NULL, NULL);
	c[AGENT_C_SSD_DELETES] = metrics_counter(
		r, "mooncake_agent_ssd_deletes_total",
		"Objects deleted from the SSD tier because the master evicted, "
		"removed or promoted them.",
		NULL, NULL);
	c[AGENT_C_SSD_LOST] = metrics_counter(
		r, "mooncake_agent_ssd_lost_total",
		"Objects of the SSD tier whose bytes failed their checksum when "
		"read: dropped, never served.",
		NULL, NULL);
	c[AGENT_C_SSD_PUTS] = metrics_counter(r, "mooncake_agent_ssd_puts_total",
					      "Puts that named the SSD tier, stored there.",
					      NULL, NULL);
	c[AGENT_C_SSD_STAGED] = metrics_counter(
		r, "mooncake_agent_ssd_staged_total",
		"Reads and writes of the SSD tier that went through its staging "
		"memory on huge pages (--ssd-staging-size).",
		NULL, NULL);
	c[AGENT_C_SSD_STAGING_FULL] = metrics_counter(
		r, "mooncake_agent_ssd_staging_full_total",
		"Reads and writes of the SSD tier that found its staging memory "
		"full, and went without it.",
		NULL, NULL);
	g[AGENT_G_SSD_STAGING] = metrics_gauge(
		r, "mooncake_agent_ssd_staging_bytes",
		"The SSD tier's staging memory on huge pages (0: none: "
		"--ssd-staging-size=0, no SSD tier, or no transparent huge pages).",
		NULL, NULL);
	const char *rf = "Client sessions, requests, buffers and views refused, by the "
			 "limit that refused them (--client-max-*, --client-alloc-size; "
			 "descriptors: a frame brought descriptors it did not announce; "
			 "shutdown: a request came while the agent drained).";
	static const struct {
		enum agent_counter c;
		const char *reason;
	} refusals[] = {
		{AGENT_C_REFUSED_SESSIONS, "sessions"},
		{AGENT_C_REFUSED_SESSIONS_UID, "sessions_per_uid"},
		{AGENT_C_REFUSED_FDS, "descriptors"},
		{AGENT_C_REFUSED_BUFFERS, "buffers"},
		{AGENT_C_REFUSED_VIEWS, "views"},
		{AGENT_C_REFUSED_ALLOC, "alloc"},
		{AGENT_C_REFUSED_SHUTDOWN, "shutdown"},
	};
	for (size_t i = 0; i < sizeof(refusals) / sizeof(refusals[0]); i++)
		c[refusals[i].c] = metrics_counter(r, "mooncake_agent_client_refused_total",
						   rf, "reason",
						   (const char *[]){refusals[i].reason});
	c[AGENT_C_FDS_CLOSED] = metrics_counter(
		r, "mooncake_agent_client_descriptors_closed_total",
		"Descriptors clients sent that no request announced, closed as they "
		"came.",
		NULL, NULL);
	const char *pz = "Times a client session was no longer read because it held too "
			 "much: replies it had not read (--client-reply-buffer-size) or "
			 "descriptors (--client-max-fds); it is read again once under half.";
	c[AGENT_C_PAUSED_REPLIES] = metrics_counter(r, "mooncake_agent_client_pauses_total",
						    pz, "reason", (const char *[]){"replies"});
	c[AGENT_C_PAUSED_FDS] = metrics_counter(r, "mooncake_agent_client_pauses_total", pz,
						"reason", (const char *[]){"descriptors"});
	g[AGENT_G_HELD_BYTES] = metrics_gauge(
		r, "mooncake_agent_client_reply_bytes",
		"Reply budget in use, every session: bytes of replies queued and not "
		"read yet, and the memory reserved for what they carry.",
		NULL, NULL);
	g[AGENT_G_HELD_FDS] = metrics_gauge(
		r, "mooncake_agent_client_descriptors",
		"Descriptors held for client sessions beside their buffers': those "
		"of requests in flight and of queued replies.",
		NULL, NULL);
	g[AGENT_G_ALLOC] = metrics_gauge(
		r, "mooncake_agent_alloc_bytes",
		"Memory of the buffers the agent made for clients (AllocBuffer; "
		"--client-alloc-size).",
		NULL, NULL);
	c[AGENT_C_GET_BAD] = metrics_counter(
		r, "mooncake_agent_get_checksum_failures_total",
		"Verified gets whose bytes did not match the object's checksum.", NULL, NULL);
}
