/*
 * boot: how a member gets its identity and first state — recovering from
 * its data directory (the member file, the newest usable snapshot, the
 * WAL after it), founding a new cluster from --initial-cluster (member
 * IDs a hash of each founder's peer URL and the whole list, so every
 * founder computes the same), or joining an existing one once the
 * transport has learned this member's ID from a member that added it.
 */
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/metrics.h"
#include "common/util.h"
#include "meta/meta_int.h"

#define LOG_SUBSYS LOGS_META

/* Entries kept in the log behind a snapshot (etcd's
 * SnapshotCatchUpEntries), at most: a follower a few seconds behind under
 * a heavy write load catches up from the log instead of being sent the
 * whole state. A member told to snapshot more often than that keeps as
 * many as it logs between two snapshots. */
#define META_CATCHUP_ENTRIES 10000

static int write_member_file(struct meta_node *n)
{
	char text[160];
	snprintf(text, sizeof(text),
		 "# mooncaked meta member identity; do not edit\n"
		 "member-id = %016" PRIx64 "\ncluster-id = %016" PRIx64 "\n",
		 n->id, n->sm.cluster_id);
	int rc = mc_write_file_durably(n->dir, n->member_path, text, strlen(text));
	if (rc)
		log_error("cannot write %s: %s", n->member_path, mc_strerror(rc));
	return rc;
}

static int read_member_file(struct meta_node *n)
{
	FILE *f = fopen(n->member_path, "re");
	char line[160];
	bool have_id = false, have_cluster = false;

	if (!f) {
		int rc = -errno;
		log_error("%s: cannot open: %s (the WAL exists, so this member's identity "
			  "must too)",
			  n->member_path, mc_strerror(rc));
		return rc == -ENOENT ? -EBADMSG : rc;
	}
	while (fgets(line, sizeof(line), f)) {
		unsigned long long v;
		if (sscanf(line, "member-id = %llx", &v) == 1) {
			n->id = v;
			have_id = true;
		} else if (sscanf(line, "cluster-id = %llx", &v) == 1) {
			n->sm.cluster_id = v;
			have_cluster = true;
		}
	}
	fclose(f);
	if (!have_id || !have_cluster || !n->id) {
		log_error("%s: no member-id/cluster-id lines", n->member_path);
		return -EBADMSG;
	}
	return 0;
}

struct founder {
	char *name;
	char *url; /* http://host:port */
	uint64_t id;
};

static void founders_free(struct founder *f, size_t k)
{
	for (size_t i = 0; i < k; i++) {
		free(f[i].name);
		free(f[i].url);
	}
	free(f);
}

/* Parse --initial-cluster "name=host:port,..." (URLs may carry http://). */
static int parse_initial_cluster(struct meta_node *n, struct founder **out, size_t *count)
{
	const char *spec = n->initial_cluster;
	char *own = NULL;
	struct founder *v = NULL;
	size_t k = 0;
	int rc = MC_ECONFIG;

	if (!spec || !*spec) {
		own = meta__printf("%s=%s", n->name, n->self_peer_url);
		if (!own)
			return -ENOMEM;
		spec = own;
	}
	const char *p = spec;
	while (*p) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		char *item = strndup(p, len);
		char *eq = item ? strchr(item, '=') : NULL;
		struct founder *nv = realloc(v, (k + 1) * sizeof(*v));
		if (!item || !nv) {
			free(item);
			rc = -ENOMEM;
			goto fail;
		}
		v = nv;
		if (!eq || eq == item) {
			log_error("--initial-cluster: '%s' is not name=host:port", item);
			free(item);
			goto fail;
		}
		*eq = '\0';
		v[k].name = strdup(item);
		v[k].url = meta__normalize_url(eq + 1);
		v[k].id = 0;
		if (!v[k].name || !v[k].url) {
			log_error("--initial-cluster: '%s' is not a numeric host:port",
				  eq + 1);
			free(v[k].name);
			free(v[k].url);
			free(item);
			goto fail;
		}
		free(item);
		for (size_t i = 0; i < k; i++)
			if (strcmp(v[i].name, v[k].name) == 0 ||
			    strcmp(v[i].url, v[k].url) == 0) {
				log_error("--initial-cluster: member %s is listed twice",
					  v[k].name);
				k++;
				goto fail;
			}
		k++;
		if (!end)
			break;
		p = end + 1;
	}
	if (!k) {
		log_error("--initial-cluster: no members");
		goto fail;
	}
	free(own);
	*out = v;
	*count = k;
	return 0;
fail:
	founders_free(v, k);
	free(own);
	return rc;
}

/* The Raft core's events (elections, step-downs, snapshots) at debug
 * level of the raft subsystem: --log-level=info,raft=debug. */
static void on_raft_trace(void *arg, uint64_t id, const char *text)
{
	(void)arg;
	log_at(LOGS_RAFT, LOG_DEBUG, "%016" PRIx64 " %s", id, text);
}

static int open_raft(struct meta_node *n, const struct raft_restore *rs)
{
	struct raft_config c;
	raft_config_init(&c, n->id);
	c.election_ticks = (unsigned)(n->o.election_ms / n->o.heartbeat_ms);
	c.heartbeat_ticks = 1;
	c.trailing_entries = n->o.snapshot_count < META_CATCHUP_ENTRIES ? n->o.snapshot_count
									: META_CATCHUP_ENTRIES;
	c.seed = mc_now_ns() ^ n->id;
	if (log_enabled(LOGS_RAFT, LOG_DEBUG))
		c.trace = on_raft_trace;
	int rc = raft_new(&c, rs, &n->raft);
	if (rc)
		log_error("cannot start the Raft core: %s", mc_strerror(rc));
	return rc;
}

static int open_wal(struct meta_node *n, bool create, struct wal_recovery *rec)
{
	struct wal_options wo = {.create = create, .metrics = n->o.metrics};
	int rc = wal_open(n->wal_dir, &wo, &n->wal, rec);
	if (rc && rc != -EBADMSG)
		log_error("cannot open the WAL in %s: %s", n->wal_dir, mc_strerror(rc));
	return rc;
}

/* Found a new cluster from --initial-cluster. */
static int found(struct meta_node *n)
{
	struct founder *f = NULL;
	size_t k = 0, self = SIZE_MAX;
	struct raft_conf_change *ccs = NULL;
	uint8_t **ctxs = NULL;
	struct wal_recovery rec = {0};
	const char *my_url = n->self_peer_url;
	int rc = parse_initial_cluster(n, &f, &k);

	if (rc)
		goto out;
	rc = MC_ECONFIG;
	for (size_t i = 0; i < k; i++)
		if (strcmp(f[i].name, n->name) == 0)
			self = i;
	if (self == SIZE_MAX) {
		log_error("--name %s is not in --initial-cluster", n->name);
		goto out;
	}
	if (strcmp(my_url, f[self].url) != 0) {
		log_error("--initial-cluster has %s at %s, but this member's peer address "
			  "(--advertise-peer, else --listen-peer) is %s",
			  n->name, f[self].url, my_url);
		goto out;
	}
	/* IDs: a hash of each member's peer URL and the whole founding list,
	 * so the same list gives the same IDs on every founder. */
	uint64_t cluster = 0;
	for (size_t i = 0; i < k; i++) {
		char *seed = meta__printf("%s|%s", f[i].url, n->initial_cluster);
		if (!seed) {
			rc = -ENOMEM;
			goto out;
		}
		f[i].id = mc_hash64(seed, strlen(seed)) & META_MEMBER_ID_MASK;
		if (!f[i].id)
			f[i].id = 1;
		free(seed);
		cluster ^= mc_hash64(&f[i].id, sizeof(f[i].id));
	}
	n->id = f[self].id;
	n->sm.member_id = n->id;
	n->sm.cluster_id = cluster & META_MEMBER_ID_MASK ? cluster & META_MEMBER_ID_MASK : 1;

	rc = -ENOMEM;
	ccs = calloc(k, sizeof(*ccs));
	ctxs = calloc(k, sizeof(*ctxs));
	if (!ccs || !ctxs)
		goto out;
	for (size_t i = 0; i < k; i++) {
		Mooncake__Meta__ConfContext ctx = MOONCAKE__META__CONF_CONTEXT__INIT;
		Mooncake__Meta__Member pm = MOONCAKE__META__MEMBER__INIT;
		pm.id = f[i].id;
		pm.name = "";
		pm.peer_urls = &f[i].url;
		pm.n_peer_urls = 1;
		ctx.member = &pm;
		size_t len = mooncake__meta__conf_context__get_packed_size(&ctx);
		if (!(ctxs[i] = malloc(len)))
			goto out;
		mooncake__meta__conf_context__pack(&ctx, ctxs[i]);
		ccs[i] = (struct raft_conf_change){RAFT_CC_ADD_VOTER, f[i].id, ctxs[i], len};
		if (i != self && (rc = meta__peer_set(n, f[i].id, f[i].url)))
			goto out;
		rc = -ENOMEM;
	}
	if ((rc = write_member_file(n)))
		goto out;
	if ((rc = open_wal(n, true, &rec)))
		goto out;
	wal_recovery_close(&rec);
	if ((rc = open_raft(n, NULL)))
		goto out;
	rc = raft_bootstrap_members(n->raft, ccs, k);
	if (rc) {
		log_error("cannot bootstrap the cluster: %s", mc_strerror(rc));
		goto out;
	}
	log_info("founded cluster %016" PRIx64
		 " with %zu member%s; this member is %s (%016" PRIx64 ")",
		 n->sm.cluster_id, k, k == 1 ? "" : "s", n->name, n->id);
	rc = 0;
out:
	if (ctxs)
		for (size_t i = 0; i < k; i++)
			free(ctxs[i]);
	free(ctxs);
	free(ccs);
	founders_free(f, k);
	return rc;
}

static int accept_snapshot(void *ctx, uint64_t index, uint64_t term)
{
	return wal_recovery_check_start(ctx, index, term);
}

/* Restart from the WAL and the newest usable snapshot. */
static int recover(struct meta_node *n)
{
	struct wal_recovery rec = {0};
	struct snap_info info = {0};
	struct raft_conf_state cs = {0};
	struct raft_entry *ents = NULL;
	uint8_t *data = NULL;
	size_t len = 0;
	int rc;

	if ((rc = read_member_file(n)))
		return rc;
	n->sm.member_id = n->id;
	if ((rc = open_wal(n, false, &rec)))
		return rc;
	rc = snap_load_newest(n->snap_dir, accept_snapshot, &rec, &info);
	if (rc) {
		log_error("no usable snapshot in %s for the WAL in %s: %s", n->snap_dir,
			  n->wal_dir, mc_strerror(rc));
		goto out;
	}
	if ((rc = wal_start_at(n->wal, &rec, info.index, info.term))) {
		log_error("cannot start the WAL at snapshot %" PRIu64 ": %s", info.index,
			  mc_strerror(rc));
		goto out;
	}
	if (info.index) {
		if ((rc = meta__snap_load(info.path, &data, &len)))
			goto out;
		if ((rc = meta__sm_restore(&n->sm, data, len))) {
			log_error("%s: cannot load the state machine: %s", info.path,
				  mc_strerror(rc));
			goto out;
		}
		meta__sync_members(n);
		if ((rc = meta__conf_parse(info.conf, info.conf_len, &cs))) {
			log_error("%s: bad membership in the header", info.path);
			goto out;
		}
	}
	rc = -ENOMEM;
	ents = calloc(rec.n_ents + 1, sizeof(*ents));
	if (!ents)
		goto out;
	for (size_t i = 0; i < rec.n_ents; i++) {
		ents[i].term = rec.ents[i].term;
		ents[i].index = rec.ents[i].index;
		ents[i].type = rec.ents[i].type == RAFT_ENTRY_CONF_CHANGE
				       ? RAFT_ENTRY_CONF_CHANGE
				       : RAFT_ENTRY_NORMAL;
		ents[i].data = rec.ents[i].data;
		ents[i].len = rec.ents[i].len;
	}
	meta__learn_peers(n, ents, rec.n_ents);
	struct raft_restore rs = {
		.hard_state = {rec.hs.term, rec.hs.vote, rec.hs.commit},
		.snapshot = {info.index, info.term, cs},
		.entries = ents,
		.n_entries = rec.n_ents,
		.applied = info.index,
	};
	if ((rc = open_raft(n, &rs)))
		goto out;
	n->applied = info.index;
	n->applied_term = info.term;
	n->snap_index = info.index;
	n->durable_index = rec.n_ents ? rec.ents[rec.n_ents - 1].index : info.index;
	n->term = rec.hs.term;
	n->commit = rec.hs.commit;
	log_info("recovered member %016" PRIx64 " of cluster %016" PRIx64
		 ": snapshot at %" PRIu64 ", %zu WAL entries, term %" PRIu64
		 ", commit %" PRIu64,
		 n->id, n->sm.cluster_id, info.index, rec.n_ents, rec.hs.term, rec.hs.commit);
	rc = 0;
out:
	free(ents);
	free(data);
	meta__conf_state_free(&cs);
	snap_info_close(&info);
	wal_recovery_close(&rec);
	return rc;
}

void meta__join_done(struct meta_node *n, int rc, const Mooncake__Meta__MembersResponse *resp)
{
	struct wal_recovery rec = {0};
	const char *my_url = n->self_peer_url;

	if (n->stopping || n->running)
		return;
	if (rc == 0) {
		rc = -ENOENT;
		for (size_t i = 0; i < resp->n_members; i++) {
			const Mooncake__Meta__Member *m = resp->members[i];
			if (m->n_peer_urls && strcmp(m->peer_urls[0], my_url) == 0) {
				n->id = m->id;
				n->sm.member_id = m->id;
				rc = 0;
			} else if (m->n_peer_urls &&
				   meta__peer_set(n, m->id, m->peer_urls[0])) {
				rc = -ENOMEM;
			}
		}
		n->sm.cluster_id = resp->cluster_id;
		if (rc == -ENOENT)
			log_warn("the cluster has no member with peer URL %s yet: add it with "
				 "`etcdctl member add %s --peer-urls=%s`; asking again",
				 my_url, n->name, my_url);
	}
	if (rc) {
		meta__peer_join_later(n);
		return;
	}
	if ((rc = write_member_file(n)) || (rc = open_wal(n, true, &rec))) {
		meta__fatal(n, rc, "cannot create this member's state");
		return;
	}
	wal_recovery_close(&rec);
	if ((rc = open_raft(n, NULL))) {
		meta__fatal(n, rc, "cannot start the Raft core");
		return;
	}
	log_info("joined cluster %016" PRIx64 " as member %016" PRIx64 " (%s)",
		 n->sm.cluster_id, n->id, n->name);
	meta__start_running(n);
}

int meta__boot(struct meta_node *n, bool *join)
{
	*join = false;
	if (wal_exists(n->wal_dir))
		return recover(n);
	if (!n->o.join_existing)
		return found(n);
	struct founder *f = NULL;
	size_t k = 0;
	int rc = parse_initial_cluster(n, &f, &k);
	founders_free(f, k);
	if (rc)
		return rc;
	*join = true;
	log_info("joining an existing cluster through the members in --initial-cluster");
	return 0;
}
