/*
 * Requests about keys (exist, remove, remove all) and the agent's
 * statistics.
 */
#include "client/client_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <regex.h>
#include <string.h>

/* ------------------------------------------------------------ keys */

/* The keys of a request of kind op to send to the agent: *k (borrowed
 * bytes) and their indices *map, *nreq of them (the caller frees both
 * arrays). results[i] is -EINVAL for an invalid key, 1 for one an exist
 * finds in the shared lease table (it exists until the lease ends; a
 * removal through the agent takes it out first), else 0. Errors:
 * -ENOMEM. */
static int request_keys(mc_client *c, int op, size_t n, const void *const *keys,
			const size_t *klens, int *results, ProtobufCBinaryData **k,
			size_t **map, size_t *nreq)
{
	*k = calloc(n ? n : 1, sizeof(**k));
	*map = malloc((n ? n : 1) * sizeof(**map));
	*nreq = 0;
	if (!*k || !*map)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		results[i] = 0;
		if (!mc__key_ok(klens[i]))
			results[i] = -EINVAL;
		else if (op == MOONCAKE__CLIENT__REQUEST__OP_EXIST &&
			 mc__table_has(c, keys[i], klens[i]))
			results[i] = 1;
		if (results[i])
			continue;
		(*k)[*nreq].data = (uint8_t *)keys[i];
		(*k)[*nreq].len = klens[i];
		(*map)[(*nreq)++] = i;
	}
	return 0;
}

/* One request about keys (exist, remove, replica clear on segment), the
 * invalid keys answered here; results[i] per key. */
static int keys_call(mc_client *c, int op, size_t n, const void *const *keys,
		     const size_t *klens, int force, const char *segment, int *results)
{
	ProtobufCBinaryData *k;
	size_t *map, nreq;
	int rc = request_keys(c, op, n, keys, klens, results, &k, &map, &nreq);
	if (rc || nreq == 0)
		goto out;
	Mooncake__Client__KeysRequest q = MOONCAKE__CLIENT__KEYS_REQUEST__INIT;
	q.keys = k;
	q.n_keys = nreq;
	q.force = force != 0;
	Mooncake__Client__ReplicaClearRequest rq =
		MOONCAKE__CLIENT__REPLICA_CLEAR_REQUEST__INIT;
	rq.keys = k;
	rq.n_keys = nreq;
	rq.segment = (char *)(segment ? segment : "");
	Request req = MOONCAKE__CLIENT__REQUEST__INIT;
	req.op_case = op;
	if (op == MOONCAKE__CLIENT__REQUEST__OP_EXIST)
		req.exist = &q;
	else if (op == MOONCAKE__CLIENT__REQUEST__OP_REMOVE)
		req.remove = &q;
	else
		req.replica_clear = &rq;
	struct waiter w;
	rc = mc__call(c, &req, NULL, 0, &w);
	if (rc)
		goto out;
	const Response *r = w.resp;
	if (r->error)
		rc = r->error;
	else if (r->body_case != MOONCAKE__CLIENT__RESPONSE__BODY_KEYS ||
		 r->keys->n_results != nreq)
		rc = MC_EPROTOCOL;
	else
		for (size_t j = 0; j < nreq; j++)
			results[map[j]] = r->keys->results[j];
	mc__waiter_clear(&w);
out:
	free(k);
	free(map);
	return rc;
}

MC__PUBLIC int mc_batch_exist(mc_client *c, size_t n, const void *const *keys,
			      const size_t *klens, int *results)
{
	return keys_call(c, MOONCAKE__CLIENT__REQUEST__OP_EXIST, n, keys, klens, 0, NULL,
			 results);
}

MC__PUBLIC int mc_batch_remove(mc_client *c, size_t n, const void *const *keys,
			       const size_t *klens, int force, int *results)
{
	return keys_call(c, MOONCAKE__CLIENT__REQUEST__OP_REMOVE, n, keys, klens, force, NULL,
			 results);
}

MC__PUBLIC int mc_exist(mc_client *c, const void *key, size_t klen)
{
	int res = 0;
	int rc = mc_batch_exist(c, 1, &key, &klen, &res);
	return rc ? rc : res;
}

MC__PUBLIC int mc_remove(mc_client *c, const void *key, size_t klen, int force)
{
	int res = 0;
	int rc = mc_batch_remove(c, 1, &key, &klen, force, &res);
	return rc ? rc : res;
}

MC__PUBLIC int64_t mc_remove_all(mc_client *c, int force)
{
	Mooncake__Client__RemoveAllRequest q = MOONCAKE__CLIENT__REMOVE_ALL_REQUEST__INIT;
	q.force = force != 0;
	Request req = MOONCAKE__CLIENT__REQUEST__INIT;
	req.op_case = MOONCAKE__CLIENT__REQUEST__OP_REMOVE_ALL;
	req.remove_all = &q;
	struct waiter w;
	int rc = mc__call(c, &req, NULL, 0, &w);
	if (rc)
		return rc;
	int64_t out;
	if (w.resp->error)
		out = w.resp->error;
	else if (w.resp->body_case != MOONCAKE__CLIENT__RESPONSE__BODY_REMOVE_ALL)
		out = MC_EPROTOCOL;
	else
		out = (int64_t)w.resp->remove_all->removed;
	mc__waiter_clear(&w);
	return out;
}

MC__PUBLIC int mc_agent_stats(mc_client *c, struct mc_agent_stats *out)
{
	memset(out, 0, sizeof(*out));
	Mooncake__Client__Empty q = MOONCAKE__CLIENT__EMPTY__INIT;
	Request req = MOONCAKE__CLIENT__REQUEST__INIT;
	req.op_case = MOONCAKE__CLIENT__REQUEST__OP_STATS;
	req.stats = &q;
	struct waiter w;
	int rc = mc__call(c, &req, NULL, 0, &w);
	if (rc)
		return rc;
	const Mooncake__Client__StatsReply *s = w.resp->stats;
	if (w.resp->error)
		rc = w.resp->error;
	else if (w.resp->body_case != MOONCAKE__CLIENT__RESPONSE__BODY_STATS)
		rc = MC_EPROTOCOL;
	else {
		snprintf(out->agent_id, sizeof(out->agent_id), "%s", s->agent_id);
		snprintf(out->master, sizeof(out->master), "%s", s->master);
		out->master_view = s->view;
		out->segment_size = s->segment_size;
		out->hugepages = s->hugepages;
		out->numa_node = s->numa_node;
		out->staging_size = s->staging_size;
		out->clients = s->clients;
		out->buffers = s->buffers;
		out->views = s->views;
		out->puts = s->puts;
		out->gets = s->gets;
		out->local_hits = s->local_hits;
		out->remote_hits = s->remote_hits;
		out->misses = s->misses;
		out->bytes_written = s->bytes_written;
		out->bytes_read = s->bytes_read;
		out->inventory = s->inventory;
		out->get_bad = s->get_bad;
		out->resync_bad = s->resync_bad;
		snprintf(out->ssd_segment, sizeof(out->ssd_segment), "%s",
			 s->ssd_segment ? s->ssd_segment : "");
		out->ssd_size = s->ssd_size;
		out->ssd_used = s->ssd_used;
		out->ssd_objects = s->ssd_objects;
		out->ssd_hits = s->ssd_hits;
		out->ssd_demotions = s->ssd_demotions;
		out->ssd_promotions = s->ssd_promotions;
		out->table_gets = s->table_gets;
		out->ssd_reads = s->ssd_reads;
		out->ssd_read_ns = s->ssd_read_ns;
		out->ssd_writes = s->ssd_writes;
		out->ssd_write_ns = s->ssd_write_ns;
	}
	mc__waiter_clear(&w);
	return rc;
}

MC__PUBLIC int64_t mc_remove_regex(mc_client *c, const char *pattern, int force)
{
	if (!pattern)
		return -EINVAL;
	regex_t re;
	if (regcomp(&re, pattern, REG_EXTENDED | REG_NOSUB) != 0)
		return -EINVAL;
	regfree(&re);
	Mooncake__Client__RemoveRegexRequest q = MOONCAKE__CLIENT__REMOVE_REGEX_REQUEST__INIT;
	q.pattern = (char *)pattern;
	q.force = force != 0;
	Request req = MOONCAKE__CLIENT__REQUEST__INIT;
	req.op_case = MOONCAKE__CLIENT__REQUEST__OP_REMOVE_REGEX;
	req.remove_regex = &q;
	struct waiter w;
	int rc = mc__call(c, &req, NULL, 0, &w);
	if (rc)
		return rc;
	int64_t out;
	if (w.resp->error)
		out = w.resp->error;
	else if (w.resp->body_case != MOONCAKE__CLIENT__RESPONSE__BODY_REMOVE_ALL)
		out = MC_EPROTOCOL;
	else
		out = (int64_t)w.resp->remove_all->removed;
	mc__waiter_clear(&w);
	return out;
}

/* One answer into the caller's arrays (see mc_batch_get_replicas). */
static void put_replicas(const Mooncake__Client__ReplicasResult *g, struct mc_replica *reps,
			 size_t cap, size_t *count)
{
	*count = g->n_replicas;
	for (size_t j = 0; j < g->n_replicas && j < cap; j++) {
		const Mooncake__Client__ReplicaInfo *p = g->replicas[j];
		struct mc_replica *o = &reps[j];
		memset(o, 0, sizeof(*o));
		snprintf(o->segment, sizeof(o->segment), "%s", p->segment ? p->segment : "");
		o->address = p->address;
		o->size = p->size;
		o->tier = p->ssd ? MC_TIER_SSD : MC_TIER_DRAM;
		o->complete = p->complete;
	}
}

MC__PUBLIC int mc_batch_get_replicas(mc_client *c, size_t n, const void *const *keys,
				     const size_t *klens, struct mc_replica *reps, size_t cap,
				     size_t *counts, int *results)
{
	for (size_t i = 0; i < n; i++)
		counts[i] = 0;
	ProtobufCBinaryData *k;
	size_t *map, nreq;
	int rc = request_keys(c, MOONCAKE__CLIENT__REQUEST__OP_REPLICAS, n, keys, klens,
			      results, &k, &map, &nreq);
	if (rc || nreq == 0)
		goto out;
	Mooncake__Client__KeysRequest q = MOONCAKE__CLIENT__KEYS_REQUEST__INIT;
	q.keys = k;
	q.n_keys = nreq;
	Request req = MOONCAKE__CLIENT__REQUEST__INIT;
	req.op_case = MOONCAKE__CLIENT__REQUEST__OP_REPLICAS;
	req.replicas = &q;
	struct waiter w;
	rc = mc__call(c, &req, NULL, 0, &w);
	if (rc)
		goto out;
	const Response *r = w.resp;
	if (r->error)
		rc = r->error;
	else if (r->body_case != MOONCAKE__CLIENT__RESPONSE__BODY_REPLICAS ||
		 r->replicas->n_results != nreq)
		rc = MC_EPROTOCOL;
	else
		for (size_t j = 0; j < nreq; j++) {
			const Mooncake__Client__ReplicasResult *g = r->replicas->results[j];
			size_t i = map[j];
			results[i] = g->error;
			if (g->error == 0)
				put_replicas(g, reps + i * cap, cap, &counts[i]);
		}
	mc__waiter_clear(&w);
out:
	free(k);
	free(map);
	return rc;
}

MC__PUBLIC int mc_batch_replica_clear(mc_client *c, size_t n, const void *const *keys,
				      const size_t *klens, const char *segment, int *cleared)
{
	if (n == 0)
		return 0;
	if (!segment || !*segment) {
		/* Whole objects: a remove that leaves leased ones alone. */
		int rc = mc_batch_remove(c, n, keys, klens, 0, cleared);
		for (size_t i = 0; rc == 0 && i < n; i++)
			if (cleared[i] == 0)
				cleared[i] = 1;
			else if (cleared[i] == MC_EOBJECT_NOT_FOUND ||
				 cleared[i] == MC_EOBJECT_HAS_LEASE)
				cleared[i] = 0;
		return rc;
	}
	return keys_call(c, MOONCAKE__CLIENT__REQUEST__OP_REPLICA_CLEAR, n, keys, klens, 0,
			 segment, cleared);
}
