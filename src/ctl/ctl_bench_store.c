/*
 * ctl_bench_store: `mooncakectl bench store` — what the store does for
 * clients on this machine, beside the machine's own limit and beside
 * redis, all measured in the same run by the same tool.
 *
 * N client threads (--clients), each with its own session (as N inference
 * processes would have), run one operation for --duration:
 *   put    mc_put_from of a new key (the pool evicts as it fills);
 *   get    mc_get_into of a key put beforehand (a random one of a set);
 *   view   mc_get_view of such a key (a read-only mapping of the agent's
 *          segment when the replica is local: zero copy), the bytes copied
 *          by the client into its buffer, mc_view_release (redis: GET);
 *   mixed  put and get alternating;
 *   batch-put, batch-get  --batch values of new keys in one
 *          mc_batch_put, or --batch keys of the set in one
 *          mc_batch_get_into (redis: as many SETs or GETs pipelined).
 * Values live in buffers from mc_buffer_alloc (the agent maps them: zero
 * copy on the client side). "local": the client's own agent holds the
 * replica; "remote": it is on a second agent, reached through the
 * transfer engine (put: preferred segment of the other agent; get: keys
 * put through the other agent).
 *
 * Without --socket the bench starts its own master and two agents
 * (mooncaked next to mooncakectl) on loopback with a temporary directory,
 * and stops them at the end: the master in the first agent's process
 * (--master=local, as standalone runs it: that agent calls it without a
 * connection) or in a process of its own (--master=separate: every put
 * waits for a loopback round trip to it). redis-server, when installed, is started the
 * same way and driven with the same sizes, clients and operations (SET of
 * a new key, GET of a key set beforehand) by a minimal RESP client, one
 * connection per thread (ctl_bench_local.c, ctl_redis.c). The limit:
 * memcpy bandwidth of the same number of threads over 16 MiB blocks; with
 * one client, the floor of a get (ctl_bench_floor.c) runs in the same
 * rounds. Beside each figure, the CPU time an operation costs the client
 * threads, the agents and the master (or redis-server), and the server
 * side's wakeups per operation, from the processes the bench started
 * (/proc: every thread's schedstat and voluntary context switches):
 * where the time goes. Nothing here is an assertion.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/cfg.h"
#include "common/err.h"
#include "common/util.h"
#include "ctl/ctl_bench_store.h"
#include "ctl/ctl_int.h"

#define MAX_SIZES 8
#define MAX_CLIENTS 256
#define GET_SET_BYTES (64u << 20) /* per client, keys put before a get run */
#define LIMIT_BLOCK (16u << 20)

#define MAX_BATCH CTL_REDIS_MAX_PIPELINE

enum op { OP_PUT, OP_GET, OP_VIEW, OP_MIXED, OP_BPUT, OP_BGET, NOPS };
static const char *const op_names[NOPS] = {"put",   "get",       "view",
					   "mixed", "batch-put", "batch-get"};

static bool op_batch(enum op op)
{
	return op == OP_BPUT || op == OP_BGET;
}

/* The values of a get set of one client (at least two): what the floor
 * and the latency limit read from. */
static size_t get_set_len(size_t size)
{
	return MC_MAX((size_t)2, MC_MIN((size_t)256, GET_SET_BYTES / size));
}

/* ---------------------------------------------------------------- workers */

enum target { T_LOCAL, T_REMOTE, T_REDIS, T_FLOOR, NTARGETS };
static const char *const target_names[NTARGETS] = {"local", "remote", "redis", "floor"};

struct run {
	enum op op;
	enum target target;
	size_t size;
	unsigned nkeys; /* get set per client */
	unsigned batch; /* values per call (1 but for batch ops) */
	uint64_t stop_ns;
	const char *remote_segment;
	const char *run_id; /* this bench's: its keys are bench/<run_id>/... */
	unsigned tag;       /* of this round's put keys */
	unsigned gtag;      /* of the get set: the same in every round */
};

struct worker {
	pthread_t t;
	unsigned id;
	const struct run *r;
	mc_client *c;            /* the session (local agent) */
	struct ctl_redis *redis; /* connection (redis target) */
	struct ctl_floor *floor; /* the floor target's server (one client) */
	void *buf;               /* room for a batch of values */
	struct ctl_lat lat;
	uint64_t ops, errors;
	uint64_t cpu_ns, wakeups; /* of this thread in its run */
	int first_err;
	uint32_t rnd;
};

/* ---------------------------------------------------------------- runs */

static void key_of(char *k, size_t len, const struct run *r, unsigned id, const char *kind,
		   uint64_t i)
{
	snprintf(k, len, "bench/%s/%u/%s/%zu/%u/%llu", r->run_id,
		 *kind == 'g' ? r->gtag : r->tag, kind, r->size, id, (unsigned long long)i);
}

/* One batch call of r->batch values (keys i*batch on for puts). */
static int one_batch(struct worker *w, bool put, uint64_t i)
{
	const struct run *r = w->r;
	char kb[MAX_BATCH][96];
	const char *keys[MAX_BATCH];
	const void *vals[MAX_BATCH];
	void *bufs[MAX_BATCH];
	size_t klens[MAX_BATCH], lens[MAX_BATCH];
	int64_t got[MAX_BATCH];
	int res[MAX_BATCH];
	for (unsigned k = 0; k < r->batch; k++) {
		if (put)
			key_of(kb[k], sizeof(kb[k]), r, w->id, "put", i * r->batch + k);
		else {
			w->rnd = w->rnd * 1103515245u + 12345u;
			key_of(kb[k], sizeof(kb[k]), r, w->id, "get",
			       (w->rnd >> 8) % r->nkeys);
		}
		keys[k] = kb[k];
		klens[k] = strlen(kb[k]);
		bufs[k] = (uint8_t *)w->buf + (size_t)k * r->size;
		vals[k] = bufs[k];
		lens[k] = r->size;
	}
	int rc;
	if (r->target == T_REDIS)
		rc = put ? ctl_redis_set_n(w->redis, r->batch, keys, vals, r->size)
			 : ctl_redis_get_n(w->redis, r->batch, keys, bufs, r->size, got);
	else if (put)
		rc = mc_batch_put(w->c, r->batch, (const void *const *)keys, klens, vals, lens,
				  NULL, res);
	else
		rc = mc_batch_get_into(w->c, r->batch, (const void *const *)keys, klens, bufs,
				       lens, got);
	for (unsigned k = 0; k < r->batch && rc == 0; k++)
		if (put && r->target != T_REDIS)
			rc = res[k];
		else if (!put)
			rc = got[k] < 0                   ? (int)got[k]
			     : got[k] == (int64_t)r->size ? 0
							  : MC_EPROTOCOL;
	return rc;
}

static int one(struct worker *w, bool put, uint64_t i)
{
	const struct run *r = w->r;
	char key[96];
	if (op_batch(r->op))
		return one_batch(w, put, i);
	if (put)
		key_of(key, sizeof(key), r, w->id, "put", i);
	else {
		w->rnd = w->rnd * 1103515245u + 12345u;
		key_of(key, sizeof(key), r, w->id, "get", (w->rnd >> 8) % r->nkeys);
	}
	if (r->target == T_FLOOR)
		return ctl_floor_get(w->floor, w->rnd >> 8);
	if (r->target == T_REDIS) {
		const char *keys[1] = {key};
		const void *vals[1] = {w->buf};
		void *bufs[1] = {w->buf};
		int64_t got;
		if (put)
			return ctl_redis_set_n(w->redis, 1, keys, vals, r->size);
		int rc = ctl_redis_get_n(w->redis, 1, keys, bufs, r->size, &got);
		return rc ? rc : (int)MC_MIN(got, 0);
	}
	if (put) {
		struct mc_put_opts o = {
			.preferred_segment = r->target == T_REMOTE ? r->remote_segment : NULL};
		return mc_put_from(w->c, key, strlen(key), w->buf, r->size, &o);
	}
	if (r->op == OP_VIEW) {
		const void *data;
		size_t len;
		mc_view *v;
		int rc = mc_get_view(w->c, key, strlen(key), &data, &len, &v);
		if (rc)
			return rc;
		memcpy(w->buf, data, MC_MIN(len, r->size));
		mc_view_release(w->c, v);
		return len == r->size ? 0 : MC_EPROTOCOL;
	}
	int64_t n = mc_get_into(w->c, key, strlen(key), w->buf, r->size);
	return n < 0 ? (int)n : 0;
}

/* This thread's CPU time and voluntary context switches so far. */
static void thread_usage(struct ctl_usage *u)
{
	struct rusage ru;
	memset(u, 0, sizeof(*u));
	if (getrusage(RUSAGE_THREAD, &ru) != 0)
		return;
	u->cpu_ns = ((uint64_t)ru.ru_utime.tv_sec + (uint64_t)ru.ru_stime.tv_sec) *
			    1000000000u +
		    ((uint64_t)ru.ru_utime.tv_usec + (uint64_t)ru.ru_stime.tv_usec) * 1000u;
	u->wakeups = (uint64_t)ru.ru_nvcsw;
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	const struct run *r = w->r;
	struct ctl_usage u0, u1;
	thread_usage(&u0);
	for (uint64_t i = 0;; i++) {
		uint64_t t0 = mc_now_ns();
		if (t0 >= r->stop_ns)
			break;
		bool put = r->op == OP_PUT || r->op == OP_BPUT ||
			   (r->op == OP_MIXED && (i & 1));
		int rc = one(w, put, i);
		uint64_t t1 = mc_now_ns();
		if (rc) {
			w->errors++;
			if (!w->first_err)
				w->first_err = rc;
			continue;
		}
		w->ops += r->batch;
		ctl_lat_add(&w->lat, t1 - t0);
	}
	thread_usage(&u1);
	w->cpu_ns = u1.cpu_ns - u0.cpu_ns;
	w->wakeups = u1.wakeups - u0.wakeups;
	return NULL;
}

/* What the runs of one size, op and target (its rounds) add up to. */
struct tally {
	uint64_t ops, errors;
	double secs;
	int first_err;
	bool ran;
	struct ctl_lat lat;
	/* CPU and wakeups: the client threads, the agents (redis-server for
	 * redis), the master; usage false when the servers are not the
	 * bench's own (--socket). */
	uint64_t cli_ns, agent_ns, master_ns, srv_wakeups;
	bool usage;
};

/* The servers a target's operations run through: the bench's own
 * processes, -1 for none. */
struct servers {
	pid_t agent[2], master, redis;
};

/* The servers' usage summed: agents, master (or redis). */
static int servers_usage(const struct servers *sv, enum target tg, struct ctl_usage *agent,
			 struct ctl_usage *master)
{
	pid_t ag[2] = {tg == T_REDIS ? sv->redis : sv->agent[0],
		       tg == T_REMOTE ? sv->agent[1] : -1};
	pid_t ms = tg == T_REDIS ? -1 : sv->master;
	memset(agent, 0, sizeof(*agent));
	memset(master, 0, sizeof(*master));
	if (ag[0] < 0)
		return -ESRCH;
	for (int i = 0; i < 2; i++) {
		struct ctl_usage u;
		if (ag[i] < 0)
			continue;
		int rc = ctl_proc_usage(ag[i], &u);
		if (rc)
			return rc;
		agent->cpu_ns += u.cpu_ns;
		agent->wakeups += u.wakeups;
	}
	return ms < 0 ? 0 : ctl_proc_usage(ms, master);
}

/* After a size and op: the bench's keys go. Its own cluster is emptied
 * at once; an agent of --socket belongs to a cluster that holds other
 * objects too, so only this run's keys (bench/<run_id>/) are removed,
 * and a failure says what was left behind. */
static void remove_keys(mc_client *c, bool own_cluster, const char *run_id)
{
	if (own_cluster) {
		(void)mc_remove_all(c, 1);
		return;
	}
	char pattern[64];
	snprintf(pattern, sizeof(pattern), "^bench/%s/", run_id);
	int64_t n = mc_remove_regex(c, pattern, 1);
	if (n < 0)
		fprintf(stderr,
			"bench store: cannot remove its keys (bench/%s/...): %s; remove them "
			"with mooncakectl rm --regex '%s'\n",
			run_id, mc_strerror((int)n), pattern);
}

/* Put the get set of each client where it is missing (its first round,
 * or evicted since an earlier one, its lease over): through `through`
 * (the agent that will hold them) or into redis; then read each key
 * once, as the run will: a key in use is leased and never evicted, while
 * one put and never read is the first the pool evicts when puts fill it.
 * (A new get set per round, the last one removed by force, held the
 * removed sets' space until their leases ended: with short rounds that
 * filled the pool with leased and held space, and the pool evicted the
 * newest get-set key right after its put.) */
static int populate(struct worker *ws, unsigned n, const struct run *r, mc_client *through)
{
	for (unsigned id = 0; id < n; id++)
		for (unsigned k = 0; k < r->nkeys; k++) {
			char key[96];
			key_of(key, sizeof(key), r, id, "get", k);
			const char *keys[1] = {key};
			const void *vals[1] = {ws[id].buf};
			void *bufs[1] = {ws[id].buf};
			int64_t got;
			int there = r->target == T_REDIS
					    ? 0
					    : mc_exist(ws[id].c, key, strlen(key));
			if (there < 0)
				return there;
			int rc = there ? 0
				 : r->target == T_REDIS
					 ? ctl_redis_set_n(ws[id].redis, 1, keys, vals,
							   r->size)
					 : mc_put_from(through, key, strlen(key), ws[id].buf,
						       r->size, NULL);
			if (rc)
				return rc;
			if (r->target == T_REDIS)
				rc = ctl_redis_get_n(ws[id].redis, 1, keys, bufs, r->size,
						     &got);
			else
				got = mc_get_into(ws[id].c, key, strlen(key), ws[id].buf,
						  r->size);
			if (rc || got < 0)
				return rc ? rc : (int)got;
		}
	return 0;
}

/* One round of a target: its run added to t. */
static void run_one(struct worker *ws, unsigned n, struct run *r, uint64_t duration_ms,
		    mc_client *holder, const struct servers *sv, struct tally *t)
{
	if (r->op != OP_PUT && r->op != OP_BPUT && r->target != T_FLOOR) {
		int rc = populate(ws, n, r, holder);
		if (rc) {
			if (!t->first_err)
				t->first_err = rc;
			t->errors++;
			return;
		}
	}
	for (unsigned i = 0; i < n; i++) {
		ws[i].r = r;
		ws[i].ops = ws[i].errors = 0;
		ws[i].first_err = 0;
		ws[i].lat.n = 0;
		ws[i].rnd = 2654435761u * (i + 1);
	}
	struct ctl_usage a0, m0, a1, m1;
	bool usage = r->target != T_FLOOR && servers_usage(sv, r->target, &a0, &m0) == 0;
	uint64_t start = mc_now_ns();
	r->stop_ns = start + duration_ms * 1000000ull;
	for (unsigned i = 0; i < n; i++)
		pthread_create(&ws[i].t, NULL, worker_main, &ws[i]);
	for (unsigned i = 0; i < n; i++)
		pthread_join(ws[i].t, NULL);
	t->secs += (double)(mc_now_ns() - start) / 1e9;
	usage = usage && servers_usage(sv, r->target, &a1, &m1) == 0;
	t->usage = usage && (!t->ran || t->usage);
	if (usage) {
		t->agent_ns += a1.cpu_ns - a0.cpu_ns;
		t->master_ns += m1.cpu_ns - m0.cpu_ns;
		t->srv_wakeups += a1.wakeups - a0.wakeups + m1.wakeups - m0.wakeups;
	}
	for (unsigned i = 0; i < n; i++) {
		t->cli_ns += ws[i].cpu_ns;
		t->ops += ws[i].ops;
		t->errors += ws[i].errors;
		if (!t->first_err)
			t->first_err = ws[i].first_err;
		for (size_t k = 0; k < ws[i].lat.n; k++)
			ctl_lat_add(&t->lat, ws[i].lat.v[k]);
	}
	t->ran = true;
}

static double ops_s(const struct tally *t)
{
	return t->secs > 0 ? (double)t->ops / t->secs : 0;
}

static const char *fmt_err(int e)
{
	return e ? mc_strerror(e) : "";
}

/* One line of the table: a tally beside redis's (NULL: redis's own line). */
static void print_line(const char *vs, enum op op, enum target tg, size_t size,
		       struct tally *t, const struct tally *redis, double limit)
{
	char rs[32] = "", xs[32] = "";
	if (redis) {
		snprintf(rs, sizeof(rs), "-");
		snprintf(xs, sizeof(xs), "-");
	}
	if (redis && redis->ran) {
		snprintf(rs, sizeof(rs), "%.0f", ops_s(redis));
		snprintf(xs, sizeof(xs), "%.2f", ops_s(t) / MC_MAX(ops_s(redis), 1e-9));
	}
	double gbps = ops_s(t) * (double)size / 1e9;
	/* CPU per operation: the client's, the agents' (redis-server's), the
	 * master's; the servers' wakeups. */
	char cpu[4][16] = {"-", "-", "-", "-"};
	double per = t->ops ? 1e3 * (double)t->ops : 1;
	if (t->ops && tg != T_FLOOR)
		snprintf(cpu[0], sizeof(cpu[0]), "%.1f", (double)t->cli_ns / per);
	if (t->ops && t->usage) {
		snprintf(cpu[1], sizeof(cpu[1]), "%.1f", (double)t->agent_ns / per);
		if (tg != T_REDIS && t->master_ns)
			snprintf(cpu[2], sizeof(cpu[2]), "%.1f", (double)t->master_ns / per);
		snprintf(cpu[3], sizeof(cpu[3]), "%.2f",
			 (double)t->srv_wakeups / (double)t->ops);
	}
	printf("%-6s %-9s %-6s %9.0f %6.2f %8.1f %8.1f %9s %7s %6.2f %6s %6s %6s %6s %6llu %s\n",
	       vs, op_names[op], target_names[tg], ops_s(t), gbps,
	       ctl_lat_pct_us(&t->lat, 0.50), ctl_lat_pct_us(&t->lat, 0.99), rs, xs,
	       limit > 0 ? gbps / limit : 0, cpu[0], cpu[1], cpu[2], cpu[3],
	       (unsigned long long)t->errors, fmt_err(t->first_err));
}

/* ---------------------------------------------------------------- the limit */

struct mc_thread {
	pthread_t t;
	uint8_t *a, *b;
	uint64_t stop_ns, bytes;
};

static void *memcpy_main(void *arg)
{
	struct mc_thread *m = arg;
	while (mc_now_ns() < m->stop_ns) {
		memcpy(m->b, m->a, LIMIT_BLOCK);
		m->bytes += LIMIT_BLOCK;
		uint8_t *t = m->a;
		m->a = m->b;
		m->b = t;
	}
	return NULL;
}

static double memcpy_gbps_once(unsigned n)
{
	struct mc_thread *m = calloc(n, sizeof(*m));
	if (!m)
		return 0;
	uint64_t start = mc_now_ns(), stop = start + 300000000ull;
	unsigned made = 0;
	for (unsigned i = 0; i < n; i++) {
		m[i].a = malloc(LIMIT_BLOCK);
		m[i].b = malloc(LIMIT_BLOCK);
		if (!m[i].a || !m[i].b)
			break;
		memset(m[i].a, 1, LIMIT_BLOCK);
		memset(m[i].b, 2, LIMIT_BLOCK);
		m[i].stop_ns = stop;
		made++;
	}
	start = mc_now_ns();
	for (unsigned i = 0; i < made; i++) {
		m[i].stop_ns = start + 300000000ull;
		pthread_create(&m[i].t, NULL, memcpy_main, &m[i]);
	}
	uint64_t bytes = 0;
	for (unsigned i = 0; i < made; i++) {
		pthread_join(m[i].t, NULL);
		bytes += m[i].bytes;
	}
	double secs = (double)(mc_now_ns() - start) / 1e9;
	for (unsigned i = 0; i < n; i++) {
		free(m[i].a);
		free(m[i].b);
	}
	free(m);
	return secs > 0 ? (double)bytes / secs / 1e9 : 0;
}

/* The best of three rounds: the machine may be busy with other work. */
static double memcpy_gbps(unsigned n)
{
	double best = 0;
	for (int i = 0; i < 3; i++)
		best = MC_MAX(best, memcpy_gbps_once(n));
	return best;
}

/* The latency limit of a get of one value: one thread's memcpy of one
 * value from a set the size of a client's get set (so from memory, not
 * cache, as the agent's copies are), for 200 ms. -ENOMEM: not measured. */
static int memcpy_lat(size_t size, double *p50, double *p99)
{
	size_t nvals = get_set_len(size);
	uint8_t *set = malloc(nvals * size), *dst = malloc(size);
	struct ctl_lat lat = {0};
	int rc = set && dst ? 0 : -ENOMEM;
	if (rc == 0) {
		memset(set, 1, nvals * size);
		memset(dst, 2, size);
		uint64_t stop = mc_now_ns() + 200000000ull;
		for (size_t i = 0; mc_now_ns() < stop; i++) {
			uint64_t t0 = mc_now_ns();
			memcpy(dst, set + (i * 7 % nvals) * size, size);
			ctl_lat_add(&lat, mc_now_ns() - t0);
		}
		*p50 = ctl_lat_pct_us(&lat, 0.50);
		*p99 = ctl_lat_pct_us(&lat, 0.99);
	}
	ctl_lat_free(&lat);
	free(set);
	free(dst);
	return rc;
}

/* ---------------------------------------------------------------- main */

static void usage(FILE *f)
{
	fprintf(f,
		"usage: mooncakectl bench store [--value-size=4K,1M,16M] [--clients=N]\n"
		"           [--op=put,get,view,mixed,batch-put,batch-get] [--batch=32]\n"
		"           [--duration=3s] [--socket=PATH]\n"
		"           [--remote-socket=PATH] [--redis=auto|off|HOST:PORT]\n"
		"           [--master=local|separate] [--rounds=N]\n"
		"       mooncakectl bench store --tier=ssd [--value-size=1M,16M] [--clients=N]\n"
		"           [--op=put,get] [--duration=3s] [--rounds=N] [--dir=/var/tmp]\n"
		"           [--ssd-size=2G]\n\n"
		"Clients (threads, one session each) put, get (mc_get_into), view\n"
		"(mc_get_view, zero copy when local, then a copy into the client's\n"
		"buffer) or put and get alternating (mixed) with values in\n"
		"buffers from mc_buffer_alloc, or --batch values in one mc_batch_put\n"
		"or mc_batch_get_into (batch-put, batch-get; redis: as many commands\n"
		"pipelined), for each value size: through the local\n"
		"agent with local replicas, then with replicas on a second agent\n"
		"(remote), then the same against redis-server (SET/GET). Prints ops/s,\n"
		"GB/s, p50/p99 latency, the ratio to redis and to memcpy bandwidth of\n"
		"as many threads (the limit); per size, the p50/p99 of one thread's\n"
		"memcpy of one value (the latency limit of a get) and, with one client,\n"
		"the floor of a get in the same rounds: a request over a Unix socket,\n"
		"the value copied by two threads half each, the answer (what a get\n"
		"through a daemon does at the least, without the store). Without\n"
		"--socket it starts a master and two agents itself (mooncaked next to\n"
		"mooncakectl) and redis-server when installed, and empties that\n"
		"cluster after each size and op; with --socket only its own keys\n"
		"(bench/RUN/..., RUN random a run) are removed then, the cluster's\n"
		"other objects left as they were. The master runs in the process of\n"
		"the first agent (as in standalone) or, with --master=separate, in a\n"
		"process of its own. Beside each figure: the CPU time an operation\n"
		"costs the client threads, the agents (redis: redis-server) and the\n"
		"master, in us, and the servers' wakeups per operation (voluntary\n"
		"context switches of their threads), when the bench started them.\n"
		"Each size and op runs in --rounds rounds (default 3) of local,\n"
		"remote and redis in turn, --duration/rounds each, summed: a slower\n"
		"minute of the machine falls on all three alike.\n"
		"--redis=HOST:PORT ([ADDR]:PORT for IPv6) measures a redis-server of\n"
		"yours instead of starting one; the run's keys (bench/<RUN>/...) are\n"
		"removed from it at the end, its other keys left as they were.\n"
		"--tier=ssd measures the agents' SSD tiers instead (ctl_bench_tier.c):\n"
		"its two agents get SSD tiers of --ssd-size under --dir, puts name\n"
		"the SSD tier and gets read values only there (the local agent's tier,\n"
		"and the other agent's through its bounce region), beside fio with the\n"
		"same block size, direct I/O, io_uring and clients in flight on a file\n"
		"in the same directory, in the same rounds.\n");
}

static int parse_list(const char *s, const char *const *names, unsigned n, unsigned *mask)
{
	char buf[128];
	snprintf(buf, sizeof(buf), "%s", s);
	*mask = 0;
	for (char *save, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		unsigned i;
		for (i = 0; i < n && strcmp(t, names[i]) != 0; i++)
			;
		if (i == n)
			return -EINVAL;
		*mask |= 1u << i;
	}
	return *mask ? 0 : -EINVAL;
}

/* HOST:PORT (or [ADDR]:PORT) of --redis into host and *port; false when
 * it is not one. */
static bool redis_addr(const char *v, char *host, size_t hlen, int *port)
{
	const char *colon = strrchr(v, ':');
	if (!colon || colon == v)
		return false;
	char *end;
	long p = strtol(colon + 1, &end, 10);
	if (!colon[1] || *end || p < 1 || p > 65535)
		return false;
	const char *h = v;
	size_t n = (size_t)(colon - v);
	if (h[0] == '[' && n >= 2 && h[n - 1] == ']') {
		h++;
		n -= 2;
	}
	if (n == 0 || n >= hlen)
		return false;
	memcpy(host, h, n);
	host[n] = '\0';
	*port = (int)p;
	return true;
}

int ctl_bench_store_main(int argc, char **argv)
{
	for (int i = 1; i < argc; i++)
		if (strcmp(argv[i], "--tier=ssd") == 0 ||
		    (strcmp(argv[i], "--tier") == 0 && i + 1 < argc &&
		     strcmp(argv[i + 1], "ssd") == 0))
			return ctl_bench_tier_main(argc, argv);
	const char *sizes_s = "4K,1M,16M", *ops_s = "put,get,view,mixed", *dur_s = "3s";
	const char *sock = NULL, *rsock = NULL, *redis_s = "auto", *master_s = "local", *v;
	char redis_host[256] = "127.0.0.1";
	int redis_port = 0;
	unsigned clients = 4, rounds = 3, batch = 32, opmask;
	size_t sizes[MAX_SIZES];
	unsigned nsizes = 0;
	uint64_t duration_ms;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			usage(stdout);
			return CTL_EXIT_OK;
		} else if (ctl_flag_value(argc, argv, &i, "value-size", &v) && v) {
			sizes_s = v;
		} else if (ctl_flag_value(argc, argv, &i, "clients", &v) && v) {
			char *end;
			clients = (unsigned)strtoul(v, &end, 10);
			if (*end)
				clients = 0; /* refused below */
		} else if (ctl_flag_value(argc, argv, &i, "batch", &v) && v) {
			char *end;
			batch = (unsigned)strtoul(v, &end, 10);
			if (*end)
				batch = 0; /* refused below */
		} else if (ctl_flag_value(argc, argv, &i, "rounds", &v) && v) {
			char *end;
			rounds = (unsigned)strtoul(v, &end, 10);
			if (*end)
				rounds = 0; /* refused below */
		} else if (ctl_flag_value(argc, argv, &i, "master", &v) && v) {
			master_s = v;
		} else if (ctl_flag_value(argc, argv, &i, "op", &v) && v) {
			ops_s = v;
		} else if (ctl_flag_value(argc, argv, &i, "duration", &v) && v) {
			dur_s = v;
		} else if (ctl_flag_value(argc, argv, &i, "socket", &v) && v) {
			sock = v;
		} else if (ctl_flag_value(argc, argv, &i, "remote-socket", &v) && v) {
			rsock = v;
		} else if (ctl_flag_value(argc, argv, &i, "redis", &v) && v) {
			redis_s = v;
			if (strcmp(v, "auto") != 0 && strcmp(v, "off") != 0 &&
			    !redis_addr(v, redis_host, sizeof(redis_host), &redis_port)) {
				fprintf(stderr,
					"bench store: --redis=%s: want auto, off or HOST:PORT "
					"(a port of 1 to 65535; [ADDR]:PORT for IPv6)\n",
					v);
				return CTL_EXIT_USAGE;
			}
		} else {
			fprintf(stderr, "mooncakectl bench store: unknown argument \"%s\"\n",
				argv[i]);
			usage(stderr);
			return CTL_EXIT_USAGE;
		}
	}
	char buf[128];
	snprintf(buf, sizeof(buf), "%s", sizes_s);
	for (char *save, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		uint64_t s;
		if (nsizes == MAX_SIZES || cfg_parse_size(t, &s) || s == 0 ||
		    s > (256ull << 20)) {
			fprintf(stderr,
				"mooncakectl bench store: bad --value-size (1 to 256M each)\n");
			return CTL_EXIT_USAGE;
		}
		sizes[nsizes++] = s;
	}
	if (clients < 1 || clients > MAX_CLIENTS ||
	    parse_list(ops_s, op_names, NOPS, &opmask) ||
	    cfg_parse_duration_ms(dur_s, &duration_ms) || rounds < 1 || rounds > 100 ||
	    duration_ms < rounds || batch < 1 || batch > MAX_BATCH) {
		fprintf(stderr,
			"mooncakectl bench store: bad --clients (1 to %d), --op, "
			"--rounds (1 to 100), --batch (1 to %d) or --duration (at least "
			"1ms a round)\n",
			MAX_CLIENTS, MAX_BATCH);
		return CTL_EXIT_USAGE;
	}
	uint64_t round_ms = duration_ms / rounds;
	bool separate = strcmp(master_s, "separate") == 0;
	if (!separate && strcmp(master_s, "local") != 0) {
		fprintf(stderr, "mooncakectl bench store: --master is local or separate\n");
		return CTL_EXIT_USAGE;
	}
	size_t maxsize = 0;
	for (unsigned i = 0; i < nsizes; i++)
		maxsize = MC_MAX(maxsize, sizes[i]);
	/* Each client's buffer holds a batch of the largest values. */
	size_t bufsize = opmask & ((1u << OP_BPUT) | (1u << OP_BGET)) ? maxsize * batch
								      : maxsize;
	if (bufsize > (1ull << 30)) {
		fprintf(stderr,
			"mooncakectl bench store: --batch values of --value-size need "
			"%zu MiB a client; at most 1 GiB\n",
			bufsize >> 20);
		return CTL_EXIT_USAGE;
	}

	signal(SIGPIPE, SIG_IGN);
	struct ctl_local cl = {0};
	int rc = 0;
	bool own_cluster = !sock;
	mc_client *holder_local = NULL, *holder_remote = NULL;
	/* Its ports are picked free but taken only when the daemons bind
	 * them: another process may take one first; then start again. */
	for (int attempt = 1; !sock; attempt++) {
		uint64_t seg = MC_MAX((uint64_t)1 << 30, (uint64_t)clients * bufsize * 16);
		rc = ctl_local_start(&cl, seg, separate);
		if (rc == 0)
			rc = ctl_local_open(cl.sock[0], &holder_local, 15000);
		if (rc == 0) {
			sock = cl.sock[0];
			rsock = cl.sock[1];
			break;
		}
		fprintf(stderr, "bench store: mooncaked not ready (attempt %d of 3): %s\n",
			attempt, mc_strerror(rc));
		ctl_local_report_dead(&cl);
		ctl_local_stop(&cl);
		if (attempt == 3)
			return CTL_EXIT_FAIL;
	}
	if (strcmp(redis_s, "auto") == 0) {
		if (ctl_local_start_redis(&cl) == 0)
			redis_port = cl.redis_port;
		else
			printf("redis-server is not installed: the redis comparison is "
			       "skipped (apt-get install redis-server)\n");
	}

	rc = holder_local ? 0 : ctl_local_open(sock, &holder_local, 15000);
	if (rc) {
		fprintf(stderr, "bench store: agent at %s not ready: %s\n", sock,
			mc_strerror(rc));
		ctl_local_stop(&cl);
		return CTL_EXIT_FAIL;
	}
	if (rsock && ctl_local_open(rsock, &holder_remote, 15000) != 0) {
		fprintf(stderr,
			"bench store: second agent at %s not ready: remote runs skipped\n",
			rsock);
		holder_remote = NULL;
	}
	struct worker *ws = calloc(clients, sizeof(*ws));
	if (!ws) {
		ctl_local_stop(&cl);
		return CTL_EXIT_FAIL;
	}
	for (unsigned i = 0; i < clients && rc == 0; i++) {
		ws[i].id = i;
		struct mc_open_opts o = {.socket_path = sock, .client_name = "bench store"};
		rc = mc_open_ex(&o, &ws[i].c);
		if (rc == 0)
			rc = mc_buffer_alloc(ws[i].c, bufsize, &ws[i].buf);
		if (rc == 0)
			memset(ws[i].buf, (int)(0x41 + i), bufsize);
		if (rc == 0 && redis_port) {
			uint64_t deadline = mc_now_ms() + 5000;
			while (ctl_redis_connect(redis_host, redis_port, &ws[i].redis) != 0 &&
			       mc_now_ms() < deadline)
				usleep(20000);
			if (!ws[i].redis) {
				printf("redis at %s port %d does not answer: skipped\n",
				       redis_host, redis_port);
				redis_port = 0;
			}
		}
	}
	if (rc) {
		fprintf(stderr, "bench store: cannot open client sessions: %s\n",
			mc_strerror(rc));
		goto out;
	}

	double limit = memcpy_gbps(clients);
	printf("bench store: %u clients, %s per run in %u rounds, values in buffers from "
	       "mc_buffer_alloc\n"
	       "limit: memcpy of %u threads over 16 MiB blocks = %.2f GB/s\n",
	       clients, dur_s, rounds, clients, limit);
	if (own_cluster)
		printf("cluster: two agents, the master %s\n",
		       separate ? "in a process of its own" : "in the local agent's process");
	printf("%-6s %-9s %-6s %9s %6s %8s %8s %9s %7s %6s %6s %6s %6s %6s %6s\n", "size",
	       "op", "where", "ops/s", "GB/s", "p50(us)", "p99(us)", "redis/s", "x redis",
	       "memcpy", "cli-us", "agt-us", "mst-us", "wake", "errors");
	struct servers sv = {
		.agent = {ctl_local_pid(&cl, "agent0"), ctl_local_pid(&cl, "agent1")},
		.master = ctl_local_pid(&cl, "master"),
		.redis = ctl_local_pid(&cl, "redis")};
	const char *remote_seg = holder_remote ? mc_agent_address(holder_remote) : NULL;
	unsigned tag = (unsigned)getpid();
	char run_id[17];
	ctl_run_id(run_id);
	for (unsigned si = 0; si < nsizes; si++) {
		char vs[32];
		snprintf(vs, sizeof(vs), "%zuK", sizes[si] >> 10);
		if (sizes[si] >= (1u << 20))
			snprintf(vs, sizeof(vs), "%zuM", sizes[si] >> 20);
		double l50, l99;
		if (memcpy_lat(sizes[si], &l50, &l99) == 0)
			printf("limit %s: memcpy of one value (1 thread, from a get set's worth of "
			       "values) p50 %.1f us, p99 %.1f us\n",
			       vs, l50, l99);
		for (unsigned op = 0; op < NOPS; op++) {
			if (!(opmask & (1u << op)))
				continue;
			/* Rounds of local, remote, redis in turn: a slower minute
			 * of the machine falls on all of them alike. */
			struct tally tal[NTARGETS] = {0};
			unsigned gtag = tag;
			tag += NTARGETS;
			/* The floor of a get, in the same rounds (one client). */
			struct ctl_floor *fl = NULL;
			if (op == OP_GET && clients == 1) {
				int frc = ctl_floor_start(sizes[si], get_set_len(sizes[si]),
							  ws[0].buf, &fl);
				if (frc)
					printf("%s get floor: not measured: %s\n", vs,
					       mc_strerror(frc));
			}
			ws[0].floor = fl;
			for (unsigned round = 0; round < rounds; round++)
				for (unsigned t = 0; t < NTARGETS; t++) {
					if ((t == T_REMOTE && !holder_remote) ||
					    (t == T_REDIS && !redis_port) ||
					    (t == T_FLOOR && !fl))
						continue;
					struct run r = {
						.op = op,
						.target = t,
						.size = sizes[si],
						.nkeys = (unsigned)MC_MAX(
							(size_t)1,
							MC_MIN((size_t)256,
							       GET_SET_BYTES / sizes[si])),
						.batch = op_batch(op) ? batch : 1,
						.remote_segment = remote_seg,
						.run_id = run_id,
						.tag = tag++,
						.gtag = gtag + t,
					};
					run_one(ws, clients, &r, round_ms,
						t == T_REMOTE ? holder_remote : holder_local,
						&sv, &tal[t]);
				}
			ctl_floor_stop(fl);
			ws[0].floor = NULL;
			remove_keys(holder_local, own_cluster, run_id);
			for (unsigned t = 0; t < NTARGETS; t++) {
				if (tal[t].ran || tal[t].errors)
					print_line(t == T_REDIS ? "" : vs, op, t, sizes[si],
						   &tal[t],
						   t >= T_REDIS ? NULL : &tal[T_REDIS], limit);
			}
			for (unsigned t = 0; t < NTARGETS; t++)
				ctl_lat_free(&tal[t].lat);
		}
	}
	/* A redis of the user's (--redis=HOST:PORT) keeps other keys: only
	 * this run's go. */
	if (redis_port && strcmp(redis_s, "auto") != 0 && ws[0].redis) {
		char prefix[32];
		uint64_t n = 0;
		snprintf(prefix, sizeof(prefix), "bench/%s/", run_id);
		int urc = ctl_redis_unlink_prefix(ws[0].redis, prefix, &n);
		if (urc)
			fprintf(stderr,
				"bench store: cannot remove its keys from redis at %s port %d "
				"(%s*): %s\n",
				redis_host, redis_port, prefix, mc_strerror(urc));
		else
			printf("redis: this run's %llu keys (%s*) removed\n",
			       (unsigned long long)n, prefix);
	}
	printf("x redis = ops/s over redis-server's ops/s for the same size, op and clients;\n"
	       "memcpy = GB/s over the memcpy limit above. remote = replicas on a second\n"
	       "agent, through the transfer engine. CPU us per operation (per value in\n"
	       "a batch): cli the client threads, agt the agents (redis: redis-server),\n"
	       "mst the master when in a process of its own; wake = the servers'\n"
	       "wakeups per operation.\n");
out:
	for (unsigned i = 0; i < clients; i++) {
		if (ws[i].buf)
			(void)mc_buffer_free(ws[i].c, ws[i].buf);
		mc_close(ws[i].c);
		ctl_redis_close(ws[i].redis);
		ctl_lat_free(&ws[i].lat);
	}
	free(ws);
	mc_close(holder_local);
	mc_close(holder_remote);
	ctl_local_stop(&cl);
	return rc ? CTL_EXIT_FAIL : CTL_EXIT_OK;
}
