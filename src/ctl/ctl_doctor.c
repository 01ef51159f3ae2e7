/*
 * ctl_doctor: `mooncakectl doctor` — check a node, and the cluster as
 * this node sees it, before and while mooncaked serves:
 *
 *   1. this node (src/doctor: RDMA ports, GIDs, MTU, PCIe link, NUMA,
 *      /dev/infiniband, memory-lock limit, huge pages, memory, socket
 *      buffers, log policy), judged against the configuration the daemon
 *      would run with (the same --config, MOONCAKE_* and --KEY=VALUE),
 *      and the limits of the running daemon found through its pid file;
 *   2. meta: each endpoint's Status (leader, term), then the segment
 *      records under /mooncake/<cluster-id>/segments/, each asked for
 *      its descriptor at the address it names — a record whose address
 *      does not answer, answers for another segment or for another
 *      incarnation is stale, and peers opening it time out. The request
 *      carries the proof of the cluster secret, found as the agent finds
 *      it (mc_secret_find); without read access to it the check can only
 *      say that a transfer engine answers there;
 *   3. the master leader key and the leader's health;
 *   4. with --cluster, each agent found in meta runs the node checks on
 *      its own node (mooncake.doctor.Doctor/Check) and its clock is
 *      compared with this one.
 *
 * Output: a table (check, found, expected, verdict, how to fix) or
 * --json. Exit status 0 when nothing failed (warnings allowed), 1 when a
 * check failed, 2 on a usage error.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "common/auth.h"
#include "common/cfg.h"
#include "common/sysmem.h"
#include "common/util.h"
#include "ctl/ctl_int.h"
#include "doctor.pb-c.h"
#include "doctor/doctor.h"
#include "etcd_rpc.pb-c.h"
#include "health.pb-c.h"
#include "rpc/rpc.h"
#include "transfer.pb-c.h"
#include "transfer/transfer.h"

extern char **environ;

#define MAX_SEGMENTS 512
#define SKEW_WARN_MS 500
#define SKEW_FAIL_MS 2000

/* snprintf for a row's text, cut to its buffer on purpose. */
static void textf(char *buf, size_t len, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void textf(char *buf, size_t len, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, len, fmt, ap);
	va_end(ap);
}

struct nrow {
	char node[96];
	struct doctor_row r;
};

struct table {
	struct nrow *v;
	size_t n, cap;
	bool oom;
};

static void put(struct table *t, const char *node, enum doctor_verdict v, const char *check,
		const char *value, const char *expected, const char *fix)
{
	struct doctor_report one = {0};
	if (t->n == t->cap) {
		size_t cap = t->cap ? t->cap * 2 : 64;
		struct nrow *n = realloc(t->v, cap * sizeof(*n));
		if (!n) {
			t->oom = true;
			return;
		}
		t->v = n;
		t->cap = cap;
	}
	if (doctor_add(&one, v, check, value, expected, fix) != 0) {
		t->oom = true;
		return;
	}
	struct nrow *r = &t->v[t->n++];
	snprintf(r->node, sizeof(r->node), "%s", node);
	r->r = one.rows[0];
	doctor_report_free(&one);
}

static void put_report(struct table *t, const char *node, const struct doctor_report *rep)
{
	for (size_t i = 0; i < rep->n; i++) {
		const struct doctor_row *r = &rep->rows[i];
		put(t, node, r->verdict, r->check, r->value, r->expected, r->fix);
	}
}

/* ------------------------------------------------------------ calls */

/* The cluster secret when this process can read it: every call proves it
 * (a meta member's etcd API or a master may require it; the others take
 * no notice of the token). */
static const struct mc_secret *call_secret;

/* One unary call on a connection of its own. Returns the gRPC status. */
static int call(const char *addr, const char *path, const ProtobufCMessage *req,
		const ProtobufCMessageDescriptor *desc, uint64_t timeout_ms,
		ProtobufCMessage **resp, char *err, size_t errlen)
{
	uv_loop_t loop;
	struct rpc_client *c;
	struct rpc_client_opts o = {.connect_timeout_ms = timeout_ms,
				    .max_message_bytes = 64u << 20,
				    .backoff_initial_ms = timeout_ms};
	if (call_secret && call_secret->len) {
		o.auth_key = call_secret->key;
		o.auth_key_len = call_secret->len;
	}
	*resp = NULL;
	if (uv_loop_init(&loop)) {
		snprintf(err, errlen, "cannot create an event loop");
		return RPC_INTERNAL;
	}
	if (rpc_client_new(&loop, addr, &o, &c) != 0) {
		snprintf(err, errlen, "'%s' is not a numeric host:port", addr);
		(void)uv_loop_close(&loop);
		return RPC_INVALID_ARGUMENT;
	}
	int st = rpc_client_unary_sync(c, path, req, desc, timeout_ms, resp, err, errlen);
	rpc_client_free(c);
	uv_run(&loop, UV_RUN_DEFAULT);
	(void)uv_loop_close(&loop);
	return st;
}

static const char *health_of(const char *addr, const char *service, uint64_t tmo, char *err,
			     size_t errlen)
{
	Grpc__Health__V1__HealthCheckRequest req =
		GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
	ProtobufCMessage *resp;
	req.service = (char *)service;
	int st = call(addr, "/grpc.health.v1.Health/Check", &req.base,
		      &grpc__health__v1__health_check_response__descriptor, tmo, &resp, err,
		      errlen);
	if (st != RPC_OK)
		return NULL;
	int s = ((Grpc__Health__V1__HealthCheckResponse *)resp)->status;
	protobuf_c_message_free_unpacked(resp, NULL);
	return s == 1 ? "SERVING" : s == 2 ? "NOT_SERVING" : "UNKNOWN";
}

/* ------------------------------------------------------------ meta */

struct meta_view {
	char endpoint[256]; /* the first that answered, "" none */
	char cluster_id[128];
};

static void check_meta(struct table *t, const struct cfg *cfg, uint64_t tmo,
		       struct meta_view *mv)
{
	char eps[1024];
	cfg_meta_endpoints(cfg, eps, sizeof(eps));
	char value[256], err[256];
	int answered = 0, total = 0;
	uint64_t leader = 0, term = 0;
	mv->endpoint[0] = '\0';
	snprintf(mv->cluster_id, sizeof(mv->cluster_id), "%s", cfg_str(cfg, CFG_CLUSTER_ID));
	for (const char *p = eps; *p;) {
		size_t len = strcspn(p, ",");
		char ep[256], check[300];
		snprintf(ep, sizeof(ep), "%.*s", (int)len, p);
		p += len + (p[len] == ',');
		if (!*ep)
			continue;
		total++;
		snprintf(check, sizeof(check), "meta %s", ep);
		Etcdserverpb__StatusRequest req = ETCDSERVERPB__STATUS_REQUEST__INIT;
		ProtobufCMessage *resp;
		int st = call(ep, "/etcdserverpb.Maintenance/Status", &req.base,
			      &etcdserverpb__status_response__descriptor, tmo, &resp, err,
			      sizeof(err));
		if (st != RPC_OK) {
			textf(value, sizeof(value), "no answer: %s%s%s", rpc_status_name(st),
			      *err ? ": " : "", err);
			put(t, "cluster", DOCTOR_FAIL, check, value, "answers Status",
			    "start the member (mooncaked --role=meta) or correct --meta-endpoints");
			continue;
		}
		Etcdserverpb__StatusResponse *s = (void *)resp;
		char db[32];
		mc_format_bytes((uint64_t)s->dbsize, db, sizeof(db));
		textf(value, sizeof(value),
		      "member %" PRIx64 ", leader %" PRIx64 ", term %" PRIu64
		      ", db %s, version %s%s",
		      s->header ? s->header->member_id : 0, s->leader, s->raftterm, db,
		      s->version ? s->version : "?", s->islearner ? ", learner" : "");
		put(t, "cluster", s->leader ? DOCTOR_OK : DOCTOR_FAIL, check, value,
		    "a member that knows its leader",
		    "no leader: the cluster has lost its quorum (fewer than half its members up); "
		    "start the missing members");
		if (s->leader) {
			leader = s->leader;
			term = s->raftterm;
			if (!mv->endpoint[0])
				snprintf(mv->endpoint, sizeof(mv->endpoint), "%s", ep);
		}
		answered++;
		protobuf_c_message_free_unpacked(resp, NULL);
	}
	if (total == 0) {
		put(t, "cluster", DOCTOR_SKIP, "meta quorum",
		    "no meta (--meta-endpoints is empty)", "", "");
		return;
	}
	/* How many members there are, from one that answers. */
	int members = 0;
	if (mv->endpoint[0]) {
		Etcdserverpb__MemberListRequest req = ETCDSERVERPB__MEMBER_LIST_REQUEST__INIT;
		ProtobufCMessage *resp;
		if (call(mv->endpoint, "/etcdserverpb.Cluster/MemberList", &req.base,
			 &etcdserverpb__member_list_response__descriptor, tmo, &resp, err,
			 sizeof(err)) == RPC_OK) {
			members = (int)((Etcdserverpb__MemberListResponse *)resp)->n_members;
			protobuf_c_message_free_unpacked(resp, NULL);
		}
	}
	if (leader)
		textf(value, sizeof(value),
		      "leader %" PRIx64 " in term %" PRIu64
		      "; %d of %d endpoints answer; %d members",
		      leader, term, answered, total, members);
	else
		textf(value, sizeof(value), "no leader; %d of %d endpoints answer", answered,
		      total);
	enum doctor_verdict v = !leader            ? DOCTOR_FAIL
				: answered < total ? DOCTOR_WARN
						   : DOCTOR_OK;
	put(t, "cluster", v, "meta quorum", value, "a leader; every endpoint answers",
	    !leader ? "meta has no quorum: start enough members (a majority) to elect a leader"
		    : "some endpoints do not answer: those members are down or unreachable");
}

/* A segment record: its name and descriptor, and whether its address
 * serves it. */
struct seg {
	char key[512];
	char name[256];
	char addr[300];
	uint64_t incarnation;
	bool live;
};

static int get_prefix(const char *ep, const char *prefix, uint64_t tmo,
		      Etcdserverpb__RangeResponse **out, char *err, size_t errlen)
{
	Etcdserverpb__RangeRequest req = ETCDSERVERPB__RANGE_REQUEST__INIT;
	char end[512];
	size_t n = strlen(prefix);
	memcpy(end, prefix, n);
	end[n - 1]++;
	req.key.data = (uint8_t *)prefix;
	req.key.len = n;
	req.range_end.data = (uint8_t *)end;
	req.range_end.len = n;
	req.limit = MAX_SEGMENTS;
	ProtobufCMessage *resp;
	int st = call(ep, "/etcdserverpb.KV/Range", &req.base,
		      &etcdserverpb__range_response__descriptor, tmo, &resp, err, errlen);
	*out = st == RPC_OK ? (void *)resp : NULL;
	return st;
}

/* GetDescriptor for name at addr, with the proof of sec over a fresh
 * Challenge when sec holds a secret. Returns the gRPC status. */
static int fetch_descriptor(const char *addr, const char *name, const struct mc_secret *sec,
			    uint64_t tmo, ProtobufCMessage **resp, char *err, size_t errlen)
{
	Mooncake__Transfer__GetDescriptorRequest req =
		MOONCAKE__TRANSFER__GET_DESCRIPTOR_REQUEST__INIT;
	req.name = (char *)name;
	ProtobufCMessage *ch = NULL;
	uint8_t mac[32];
	if (sec && sec->len) {
		Mooncake__Transfer__ChallengeRequest creq =
			MOONCAKE__TRANSFER__CHALLENGE_REQUEST__INIT;
		int gs = call(addr, "/mooncake.transfer.Transfer/Challenge", &creq.base,
			      &mooncake__transfer__challenge_reply__descriptor, tmo, &ch, err,
			      errlen);
		if (gs != RPC_OK)
			return gs;
		const Mooncake__Transfer__ChallengeReply *c = (const void *)ch;
		te_descriptor_mac(sec->key, sec->len, c->nonce.data, c->nonce.len, name, mac);
		req.challenge = c->nonce;
		req.mac.data = mac;
		req.mac.len = sizeof(mac);
	}
	int gs = call(addr, "/mooncake.transfer.Transfer/GetDescriptor", &req.base,
		      &mooncake__transfer__segment_desc__descriptor, tmo, resp, err, errlen);
	if (ch)
		protobuf_c_message_free_unpacked(ch, NULL);
	return gs;
}

/* sec: the cluster secret, NULL when it cannot be had (sec_err says why). */
static size_t check_segments(struct table *t, const struct meta_view *mv, uint64_t tmo,
			     struct seg *segs, const struct mc_secret *sec,
			     const char *sec_err)
{
	char prefix[256], value[512], check[300], err[256];
	snprintf(prefix, sizeof(prefix), "/mooncake/%s/segments/", mv->cluster_id);
	Etcdserverpb__RangeResponse *r;
	int st = get_prefix(mv->endpoint, prefix, tmo, &r, err, sizeof(err));
	if (st != RPC_OK) {
		textf(value, sizeof(value), "cannot list %s: %s %s", prefix,
		      rpc_status_name(st), err);
		put(t, "cluster", DOCTOR_FAIL, "segment records", value, "a listing",
		    "check meta");
		return 0;
	}
	size_t n = 0;
	textf(value, sizeof(value), "%zu under %s%s", r->n_kvs, prefix,
	      r->more ? " (more not shown)" : "");
	put(t, "cluster", r->n_kvs ? DOCTOR_OK : DOCTOR_WARN, "segment records", value,
	    "one per agent",
	    "no agent has published its segment: start agents with this --meta-endpoints and "
	    "--cluster-id");
	for (size_t i = 0; i < r->n_kvs && n < MAX_SEGMENTS; i++) {
		const Mvccpb__KeyValue *kv = r->kvs[i];
		struct seg *s = &segs[n];
		memset(s, 0, sizeof(*s));
		snprintf(s->key, sizeof(s->key), "%.*s", (int)kv->key.len,
			 (const char *)kv->key.data);
		snprintf(check, sizeof(check), "segment %s", s->key + strlen(prefix));
		Mooncake__Transfer__SegmentDesc *d = mooncake__transfer__segment_desc__unpack(
			NULL, kv->value.len, kv->value.data);
		if (!d) {
			put(t, "cluster", DOCTOR_FAIL, check, "not a segment descriptor",
			    "a SegmentDesc",
			    "delete the key (etcdctl del KEY; add --user \"root:$(cat "
			    "SECRET_FILE)\" when meta wants the cluster secret): nothing "
			    "can open it");
			continue;
		}
		snprintf(s->name, sizeof(s->name), "%s", d->name ? d->name : "");
		snprintf(s->addr, sizeof(s->addr), "%s:%u", d->host ? d->host : "",
			 d->rpc_port);
		if (d->host && strchr(d->host, ':'))
			snprintf(s->addr, sizeof(s->addr), "[%s]:%u", d->host, d->rpc_port);
		s->incarnation = d->incarnation;
		char xps[64] = "";
		for (size_t k = 0; k < d->n_transports; k++)
			snprintf(xps + strlen(xps), sizeof(xps) - strlen(xps), "%s%s",
				 k ? "," : "", d->transports[k]);
		mooncake__transfer__segment_desc__free_unpacked(d, NULL);
		n++;

		/* Does the address serve this segment, this incarnation? */
		ProtobufCMessage *resp;
		int gs = fetch_descriptor(s->addr, s->name, sec, tmo, &resp, err, sizeof(err));
		const char *fix =
			"the record outlived its agent: it goes --te-lease-ttl after the "
			"agent died; one that stays is held by a live lease of a process "
			"that no longer serves it (a rebuilt node); peers that open it "
			"time out. Delete it: etcdctl del KEY (add --user \"root:$(cat "
			"SECRET_FILE)\" when meta wants the cluster secret)";
		if (gs == RPC_OK) {
			Mooncake__Transfer__SegmentDesc *live = (void *)resp;
			bool same = live->incarnation == s->incarnation;
			protobuf_c_message_free_unpacked(resp, NULL);
			textf(value, sizeof(value), "%s serves it (%s)%s", s->addr, xps,
			      same ? "" : ", but as a newer incarnation than the record's");
			s->live = same;
			put(t, "cluster", same ? DOCTOR_OK : DOCTOR_FAIL, check, value,
			    "its address serves it", fix);
		} else if (gs == RPC_UNAUTHENTICATED) {
			/* A transfer engine answers, but which segment it serves
			 * is only told to a holder of the secret. */
			textf(value, sizeof(value), "%s serves a transfer engine (%s); %s",
			      s->addr, xps, sec ? err : sec_err);
			s->live = true;
			put(t, "cluster", DOCTOR_WARN, check, value, "its address serves it",
			    sec ? "give every host the same --cluster-secret-file"
				: "run the doctor where it can read the cluster secret (as the "
				  "daemon's user, with its --data-dir or --cluster-secret-file)");
		} else {
			textf(value, sizeof(value), "%s %s: %s%s%s", s->addr,
			      gs == RPC_NOT_FOUND ? "serves another segment"
						  : "does not answer",
			      rpc_status_name(gs), *err ? ": " : "", err);
			put(t, "cluster", DOCTOR_FAIL, check, value, "its address serves it",
			    fix);
		}
	}
	protobuf_c_message_free_unpacked(&r->base, NULL);
	return n;
}

static void check_master(struct table *t, const struct cfg *cfg, const struct meta_view *mv,
			 uint64_t tmo)
{
	char key[256], value[512], addr[256] = "", err[256];
	unsigned long long view = 0;
	char eps[1024];
	cfg_meta_endpoints(cfg, eps, sizeof(eps));
	if (*eps && !mv->endpoint[0]) {
		put(t, "cluster", DOCTOR_FAIL, "master leader",
		    "unknown: no meta endpoint answers, so the leader key cannot be read",
		    "a leader", "bring meta back first (see the meta rows)");
		return;
	}
	if (mv->endpoint[0]) {
		snprintf(key, sizeof(key), "/mooncake/%s/master", mv->cluster_id);
		Etcdserverpb__RangeRequest req = ETCDSERVERPB__RANGE_REQUEST__INIT;
		req.key.data = (uint8_t *)key;
		req.key.len = strlen(key);
		ProtobufCMessage *resp;
		int st = call(mv->endpoint, "/etcdserverpb.KV/Range", &req.base,
			      &etcdserverpb__range_response__descriptor, tmo, &resp, err,
			      sizeof(err));
		Etcdserverpb__RangeResponse *r = st == RPC_OK ? (void *)resp : NULL;
		if (!r || r->n_kvs == 0) {
			if (r)
				protobuf_c_message_free_unpacked(resp, NULL);
			textf(value, sizeof(value), "no %s key", key);
			put(t, "cluster", DOCTOR_FAIL, "master leader", value, "a leader",
			    "no master leads: start mooncaked --role=master with this "
			    "--meta-endpoints and --cluster-id (standbys campaign on their own)");
			return;
		}
		char v[256];
		snprintf(v, sizeof(v), "%.*s", (int)r->kvs[0]->value.len,
			 (const char *)r->kvs[0]->value.data);
		protobuf_c_message_free_unpacked(resp, NULL);
		if (sscanf(v, "%255s %llu", addr, &view) < 1)
			addr[0] = '\0';
	} else {
		const char *fixed = cfg_str(cfg, CFG_MASTER_ADDRESS);
		snprintf(addr, sizeof(addr), "%s",
			 *fixed ? fixed : cfg_str(cfg, CFG_MASTER_LISTEN));
	}
	const char *h = *addr ? health_of(addr, "mooncake.master.Master", tmo, err,
					  sizeof(err))
			      : NULL;
	if (view)
		textf(value, sizeof(value), "%s view %llu: %s", addr, view,
		      h ? h : "no answer");
	else
		textf(value, sizeof(value), "%s: %s", addr, h ? h : "no answer");
	put(t, "cluster", h && strcmp(h, "SERVING") == 0 ? DOCTOR_OK : DOCTOR_FAIL,
	    "master leader", value, "SERVING",
	    mv->endpoint[0]
		    ? "the leader key names a master that does not serve: it is stopping, "
		      "or lost meta (it gives up within --leader-lease-ttl)"
		    : "start the master (mooncaked --role=master) or correct --master-address");
}

/* --cluster: each live agent's own node checks, and its clock. */
static void check_agents(struct table *t, const struct seg *segs, size_t n, uint64_t tmo)
{
	char err[256], value[256], node[300];
	for (size_t i = 0; i < n; i++) {
		const struct seg *s = &segs[i];
		snprintf(node, sizeof(node), "%s", *s->name ? s->name : s->addr);
		if (!s->live) {
			put(t, node, DOCTOR_SKIP, "node checks",
			    "not asked: its record is stale", "", "");
			continue;
		}
		Mooncake__Doctor__CheckRequest req = MOONCAKE__DOCTOR__CHECK_REQUEST__INIT;
		ProtobufCMessage *resp;
		uint64_t t0 = mc_wall_ms();
		int st = call(s->addr, "/mooncake.doctor.Doctor/Check", &req.base,
			      &mooncake__doctor__check_response__descriptor, tmo * 5, &resp,
			      err, sizeof(err));
		uint64_t t1 = mc_wall_ms();
		if (st != RPC_OK) {
			textf(value, sizeof(value), "%s: %s %s", s->addr, rpc_status_name(st),
			      err);
			put(t, node,
			    st == RPC_UNIMPLEMENTED || st == RPC_NOT_FOUND ? DOCTOR_WARN
									   : DOCTOR_FAIL,
			    "node checks", value, "answers mooncake.doctor.Doctor/Check",
			    "an older mooncaked, or the agent stopped meanwhile");
			continue;
		}
		Mooncake__Doctor__CheckResponse *cr = (void *)resp;
		for (size_t k = 0; k < cr->n_rows; k++) {
			const Mooncake__Doctor__Row *r = cr->rows[k];
			put(t, node, (enum doctor_verdict)r->verdict, r->check, r->value,
			    r->expected, r->fix);
		}
		double mid = ((double)t0 + (double)t1) / 2;
		double skew = (double)cr->wall_time_ms - mid;
		double half_rtt = ((double)t1 - (double)t0) / 2;
		textf(value, sizeof(value), "%+.0f ms vs this node (+-%.0f ms), host %s", skew,
		      half_rtt, cr->host ? cr->host : "?");
		double a = skew < 0 ? -skew : skew;
		a = a > half_rtt ? a - half_rtt : 0;
		put(t, node,
		    a > SKEW_FAIL_MS   ? DOCTOR_FAIL
		    : a > SKEW_WARN_MS ? DOCTOR_WARN
				       : DOCTOR_OK,
		    "clock skew", value, "within 500 ms",
		    "synchronize the clocks (chrony or systemd-timesyncd): logs and lease times "
		    "are compared across nodes");
		protobuf_c_message_free_unpacked(resp, NULL);
	}
}

/* ------------------------------------------------------------ output */

static void json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;
		if (ch == '"' || ch == '\\')
			fprintf(f, "\\%c", ch);
		else if (ch < 0x20)
			fprintf(f, "\\u%04x", ch);
		else
			fputc(ch, f);
	}
	fputc('"', f);
}

static const char *verdict_word(enum doctor_verdict v)
{
	switch (v) {
	case DOCTOR_OK:
		return "ok";
	case DOCTOR_WARN:
		return "warn";
	case DOCTOR_FAIL:
		return "fail";
	default:
		return "skip";
	}
}

static void print_json(FILE *f, const struct table *t, enum doctor_verdict worst)
{
	fprintf(f, "{\"status\": \"%s\", \"checks\": [", verdict_word(worst));
	for (size_t i = 0; i < t->n; i++) {
		const struct nrow *r = &t->v[i];
		fprintf(f, "%s\n  {\"node\": ", i ? "," : "");
		json_str(f, r->node);
		fprintf(f, ", \"check\": ");
		json_str(f, r->r.check);
		fprintf(f, ", \"found\": ");
		json_str(f, r->r.value);
		fprintf(f, ", \"expected\": ");
		json_str(f, r->r.expected);
		fprintf(f, ", \"verdict\": \"%s\", \"fix\": ", verdict_word(r->r.verdict));
		json_str(f, r->r.fix);
		fputc('}', f);
	}
	fprintf(f, "\n]}\n");
}

/* The next line of s wrapped at width: its length, and *next after it. */
static size_t wrap(const char *s, size_t width, const char **next)
{
	size_t len = strlen(s);
	if (len <= width) {
		*next = s + len;
		return len;
	}
	size_t cut = width;
	while (cut > 0 && s[cut] != ' ')
		cut--;
	if (cut == 0)
		cut = width;
	*next = s + cut;
	while (**next == ' ')
		(*next)++;
	return cut;
}

static void print_table(FILE *f, const struct table *t, bool nodes)
{
	enum { NODE, CHECK, FOUND, EXPECTED, VERDICT, FIX, NCOL };
	static const char *const head[NCOL] = {"NODE",     "CHECK",   "FOUND",
					       "EXPECTED", "VERDICT", "HOW TO FIX"};
	static const size_t cap[NCOL] = {22, 34, 42, 30, 7, 44};
	size_t w[NCOL];
	for (int c = 0; c < NCOL; c++)
		w[c] = strlen(head[c]);
	for (size_t i = 0; i < t->n; i++) {
		const char *cell[NCOL] = {t->v[i].node,
					  t->v[i].r.check,
					  t->v[i].r.value,
					  t->v[i].r.expected,
					  doctor_verdict_name(t->v[i].r.verdict),
					  t->v[i].r.fix};
		for (int c = 0; c < NCOL; c++)
			w[c] = MC_MAX(w[c], MC_MIN(strlen(cell[c]), cap[c]));
	}
	for (int c = nodes ? 0 : 1; c < NCOL; c++)
		fprintf(f, "%-*s%s", c == FIX ? 0 : (int)w[c], head[c],
			c == FIX ? "\n" : "  ");
	for (size_t i = 0; i < t->n; i++) {
		const char *cell[NCOL] = {t->v[i].node,
					  t->v[i].r.check,
					  t->v[i].r.value,
					  t->v[i].r.expected,
					  doctor_verdict_name(t->v[i].r.verdict),
					  t->v[i].r.fix};
		for (bool more = true; more;) {
			more = false;
			for (int c = nodes ? 0 : 1; c < NCOL; c++) {
				const char *next;
				size_t n = wrap(cell[c], w[c], &next);
				if (c == FIX)
					fprintf(f, "%.*s\n", (int)n, cell[c]);
				else
					fprintf(f, "%-*.*s  ", (int)w[c], (int)n, cell[c]);
				cell[c] = next;
				more |= *next != '\0';
			}
		}
	}
}

/* ------------------------------------------------------------ main */

static void usage(FILE *f)
{
	fprintf(f,
		"usage: mooncakectl doctor [--node | --cluster] [--json] [--timeout=2s]\n"
		"                          [--config=FILE] [--KEY=VALUE ...]\n"
		"                          [--sysfs-root=DIR] [--procfs-root=DIR] [--dev-root=DIR]\n"
		"                          [--etc-root=DIR]\n\n"
		"  Checks this node for mooncaked and the cluster as this node sees it: RDMA\n"
		"  devices and ports (state, link layer, the GID index the daemon picks, active\n"
		"  MTU vs 4096), /dev/infiniband, each NIC's PCIe link (current vs maximum speed\n"
		"  and width) and NUMA node vs --numa-node, the memory-lock limit of the running\n"
		"  daemon (found through <data-dir>/mooncaked.pid; else its unit's LimitMEMLOCK)\n"
		"  vs the segment RDMA pins, huge pages and memory available vs\n"
		"  --global-segment-size, net.core.rmem_max/wmem_max, the log level and size\n"
		"  policy; then meta (each endpoint's leader and\n"
		"  term, the segment records and whether their addresses serve them) and the\n"
		"  master leader. Everything is read from sysfs, procfs and the daemons\n"
		"  themselves; no other tool is run.\n\n"
		"  The node is judged against the configuration mooncaked would run with: the\n"
		"  same --config file, MOONCAKE_* variables and --KEY=VALUE flags.\n\n"
		"  --node         this node only (before any daemon runs): no meta, no master\n"
		"  --cluster      also ask every agent with a segment record in meta to check\n"
		"                 its own node (mooncake.doctor.Doctor on its RPC port), and\n"
		"                 compare its clock with this one\n"
		"  --json         one JSON object: {\"status\", \"checks\": [{node, check, found,\n"
		"                 expected, verdict, fix}]}\n"
		"  --timeout=D    per call to a daemon (default 2s)\n"
		"  --sysfs-root, --procfs-root, --dev-root, --etc-root\n"
		"                 read /sys, /proc, /dev, /etc from there (tests, other roots)\n\n"
		"Verdicts: ok, warn (works, not as well as it could), FAIL, - (does not apply).\n"
		"Exit status: 0 nothing failed, 1 a check failed, 2 usage error.\n");
}

/* The running daemon's pid: its pid file, when the process is there. */
static int daemon_pid(const struct cfg *cfg, const char *procfs, char *pidfile, size_t len)
{
	const char *pf = cfg_str(cfg, CFG_PID_FILE);
	if (*pf)
		snprintf(pidfile, len, "%s", pf);
	else
		snprintf(pidfile, len, "%s/mooncaked.pid", cfg_str(cfg, CFG_DATA_DIR));
	char buf[64], path[4200];
	if (mc_read_small_file(pidfile, buf, sizeof(buf)) < 0)
		return 0;
	int pid = atoi(buf);
	if (pid <= 0)
		return 0;
	snprintf(path, sizeof(path), "%s/%d/comm", procfs, pid);
	if (mc_read_small_file(path, buf, sizeof(buf)) < 0 ||
	    strncmp(buf, "mooncaked", 9) != 0)
		return 0;
	return pid;
}

int ctl_doctor_main(int argc, char **argv)
{
	const char *v;
	const char *sysfs = NULL, *procfs = NULL, *dev = NULL, *etc = NULL, *timeout_s = "2s";
	bool cluster = false, json = false, node_only = false, ok;
	char **cargv = calloc((size_t)argc + 2, sizeof(char *));
	int cargc = 1;
	if (!cargv)
		return CTL_EXIT_FAIL;
	cargv[0] = "mooncaked";
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			usage(stdout);
			free(cargv);
			return CTL_EXIT_OK;
		} else if (ctl_flag_bool(argv[i], "cluster", &cluster, &ok) ||
			   ctl_flag_bool(argv[i], "json", &json, &ok) ||
			   ctl_flag_bool(argv[i], "node", &node_only, &ok)) {
			if (!ok)
				goto usage;
		} else if (ctl_flag_value(argc, argv, &i, "sysfs-root", &v)) {
			sysfs = v;
		} else if (ctl_flag_value(argc, argv, &i, "procfs-root", &v)) {
			procfs = v;
		} else if (ctl_flag_value(argc, argv, &i, "dev-root", &v)) {
			dev = v;
		} else if (ctl_flag_value(argc, argv, &i, "etc-root", &v)) {
			etc = v;
		} else if (ctl_flag_value(argc, argv, &i, "timeout", &v)) {
			timeout_s = v;
		} else {
			cargv[cargc++] = argv[i]; /* mooncaked's own keys */
		}
		if ((sysfs && !*sysfs) || (procfs && !*procfs) || (dev && !*dev) ||
		    (etc && !*etc) || !timeout_s)
			goto usage;
	}
	uint64_t tmo;
	if (cfg_parse_duration_ms(timeout_s, &tmo) != 0 || tmo == 0) {
		fprintf(stderr, "mooncakectl doctor: bad --timeout '%s' (e.g. 500ms, 2s)\n",
			timeout_s);
		free(cargv);
		return CTL_EXIT_USAGE;
	}
	struct cfg cfg;
	struct cfg_cmdline cl;
	char err[1024];
	if (cfg_load(&cfg, cargc, cargv, environ, &cl, err, sizeof(err)) != 0) {
		fprintf(stderr, "mooncakectl doctor: %s\n", err);
		free(cargv);
		return CTL_EXIT_USAGE;
	}
	free(cargv);

	struct table t = {0};
	char host[256] = "local", pidfile[4096];
	(void)gethostname(host, sizeof(host) - 1);
	for (const char *w = cfg_warnings(&cfg); *w;) {
		size_t n = strcspn(w, "\n");
		char line[512];
		snprintf(line, sizeof(line), "%.*s", (int)n, w);
		put(&t, host, DOCTOR_WARN, "configuration", line, "no warnings",
		    "see mooncaked(8), MOONCAKE SPELLINGS");
		w += n + (w[n] == '\n');
	}
	struct doctor_env env = {
		.sysfs_root = sysfs,
		.procfs_root = procfs,
		.dev_root = dev,
		.etc_root = etc,
		.cfg = &cfg,
	};
	env.pid = daemon_pid(&cfg, procfs ? procfs : "/proc", pidfile, sizeof(pidfile));
	struct doctor_report rep = {0};
	int rc = doctor_node_checks(&env, &rep);
	put_report(&t, host, &rep);
	doctor_report_free(&rep);

	if (!node_only) {
		struct mc_secret *sec = malloc(sizeof(*sec));
		char sec_err[1024];
		bool have = sec && mc_secret_find(&cfg, false, false, sec, sec_err,
						  sizeof(sec_err)) == 0;
		if (!sec)
			snprintf(sec_err, sizeof(sec_err), "out of memory");
		call_secret = have ? sec : NULL;
		struct meta_view mv;
		check_meta(&t, &cfg, tmo, &mv);
		struct seg *segs = calloc(MAX_SEGMENTS, sizeof(*segs));
		size_t nsegs = 0;
		if (!segs)
			rc = -ENOMEM;
		else if (mv.endpoint[0])
			nsegs = check_segments(&t, &mv, tmo, segs, call_secret, sec_err);
		check_master(&t, &cfg, &mv, tmo);
		if (cluster && segs)
			check_agents(&t, segs, nsegs, tmo);
		free(segs);
		call_secret = NULL;
		if (sec)
			mc_secret_clear(sec);
		free(sec);
	}

	enum doctor_verdict worst = DOCTOR_OK;
	for (size_t i = 0; i < t.n; i++)
		if (t.v[i].r.verdict != DOCTOR_SKIP && t.v[i].r.verdict > worst)
			worst = t.v[i].r.verdict;
	if (json)
		print_json(stdout, &t, worst);
	else
		print_table(stdout, &t, cluster);
	bool failed = rc != 0 || t.oom;
	if (failed)
		fprintf(stderr,
			"mooncakectl doctor: out of memory; the report is incomplete\n");
	free(t.v);
	cfg_free(&cfg);
	return failed || worst == DOCTOR_FAIL ? CTL_EXIT_FAIL : CTL_EXIT_OK;
usage:
	free(cargv);
	usage(stderr);
	return CTL_EXIT_USAGE;
}
