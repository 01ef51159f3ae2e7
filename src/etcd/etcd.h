/*
 * etcd: the daemons' client of the metadata service, speaking the etcd v3
 * gRPC API — so it works against mooncaked --role=meta and against a real
 * etcd alike. KV (get/put/delete/txn), leases kept alive in the background,
 * and watches that survive reconnects by resuming from the next revision.
 *
 * Endpoints are a comma list ("http://127.0.0.1:2379,http://10.0.0.2:2379");
 * a call that finds its endpoint unavailable moves to the next one. All
 * functions must be called on the loop's thread; callbacks run there.
 * Messages handed to callbacks are borrowed (valid during the callback).
 *
 * Errors are negative: MC_EUNAVAILABLE (no endpoint answered), MC_ETIMEDOUT,
 * -ENOENT (lease not found), MC_ECOMPACTED (watch start revision compacted),
 * -ENOSPC (the store's quota is full), -EINVAL, -ENOMEM, MC_EPROTOCOL (an
 * unexpected reply), MC_ECANCELLED (the client or object was freed).
 */
#ifndef MC_ETCD_ETCD_H
#define MC_ETCD_ETCD_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "common/err.h"
#include "etcd_rpc.pb-c.h"

struct etcd_client;
struct etcd_lease;
struct etcd_watch;

struct etcd_opts {
	const char *endpoints; /* comma list of [http://]host:port */
	uint64_t timeout_ms;   /* per call; 0: 5s */
	/* The cluster secret, for a meta member whose etcd API requires it
	 * (--client-auth): every connection proves it with a token
	 * (rpc_client_opts.auth_key; copied). NULL/0: no token (etcd itself,
	 * or a member without the check). */
	const uint8_t *auth_key;
	size_t auth_key_len;
};

/* Errors: -EINVAL (an endpoint does not parse), -ENOMEM. */
int etcd_client_new(uv_loop_t *loop, const struct etcd_opts *opts,
		    struct etcd_client **out) MC_MUST_CHECK;
/* Cancel everything (callbacks run with MC_ECANCELLED, leases are left to
 * expire on the server) and free the client. */
void etcd_client_free(struct etcd_client *c);
/* The endpoint calls currently go to, "host:port". */
const char *etcd_client_endpoint(const struct etcd_client *c);

/* Map a gRPC status and message from etcd to one of the codes above. */
int etcd_status_to_err(int status, const char *message);

/* ------------------------------------------------------------ KV */

typedef void (*etcd_range_cb)(void *ud, int err, const Etcdserverpb__RangeResponse *resp);
typedef void (*etcd_put_cb)(void *ud, int err, const Etcdserverpb__PutResponse *resp);
typedef void (*etcd_delete_cb)(void *ud, int err,
			       const Etcdserverpb__DeleteRangeResponse *resp);
typedef void (*etcd_txn_cb)(void *ud, int err, const Etcdserverpb__TxnResponse *resp);

/* The range_end that makes [key, end) the keys with this prefix, written
 * into end (at least klen bytes). Returns its length; 1 with end = "\0"
 * (all keys) when no such bound exists. */
size_t etcd_prefix_end(const void *key, size_t klen, uint8_t *end);

/* Unary calls: req is serialized before return (caller keeps it); cb runs
 * exactly once, never from inside the call. Errors as for the callback
 * when the call cannot even start. */
int etcd_range(struct etcd_client *c, const Etcdserverpb__RangeRequest *req, etcd_range_cb cb,
	       void *ud) MC_MUST_CHECK;
int etcd_put(struct etcd_client *c, const Etcdserverpb__PutRequest *req, etcd_put_cb cb,
	     void *ud) MC_MUST_CHECK;
int etcd_delete(struct etcd_client *c, const Etcdserverpb__DeleteRangeRequest *req,
		etcd_delete_cb cb, void *ud) MC_MUST_CHECK;
int etcd_txn(struct etcd_client *c, const Etcdserverpb__TxnRequest *req, etcd_txn_cb cb,
	     void *ud) MC_MUST_CHECK;

/* ------------------------------------------------------------ leases */

struct etcd_lease_cbs {
	/* The lease was granted (id) or could not be (err < 0; the lease
	 * object is then freed after this returns). */
	void (*on_granted)(struct etcd_lease *l, void *ud, int err, int64_t id);
	/* Keep-alives went unanswered until the lease might expire within
	 * a quarter TTL (see etcd_lease_valid_until_ms), or the server says
	 * the lease is gone: keys under it are (or will soon be) deleted.
	 * The lease object is freed after this returns. */
	void (*on_lost)(struct etcd_lease *l, void *ud, int err);
};

/*
 * Grant a lease of ttl_s seconds and keep it alive (a keep-alive every
 * ttl/4 on one LeaseKeepAlive stream, reopened on failure) until
 * etcd_lease_revoke or the loss of the lease. cbs must outlive the lease.
 */
int etcd_lease_grant(struct etcd_client *c, int64_t ttl_s, const struct etcd_lease_cbs *cbs,
		     void *ud, struct etcd_lease **out) MC_MUST_CHECK;
int64_t etcd_lease_id(const struct etcd_lease *l);
/* The time (uv_now clock, ms) until which the lease surely holds on the
 * server: the send time of the latest answered grant or keep-alive plus
 * the TTL the server gave. 0 before the grant. on_lost runs before this
 * time passes (keep-alives go every ttl/4; after about two unanswered ones
 * the lease is given up), so a holder that stops acting as leader in
 * on_lost never overlaps with the next holder. */
uint64_t etcd_lease_valid_until_ms(const struct etcd_lease *l);
/* Stop keeping the lease alive, revoke it on the server (best effort) and
 * free it. No callback of this lease runs afterwards. */
void etcd_lease_revoke(struct etcd_lease *l);

/* ------------------------------------------------------------ watches */

struct etcd_watch_cbs {
	/* Events of one or more revisions, in order. header_rev is the
	 * store revision the response was sent at. */
	void (*on_events)(struct etcd_watch *w, void *ud, Mvccpb__Event *const *events,
			  size_t n, int64_t header_rev);
	/* The watch ended for good (MC_ECOMPACTED: start revision compacted;
	 * MC_ECANCELLED: the server cancelled it). Freed after this returns.
	 * Transient failures are retried silently, resuming from the next
	 * revision, so no event is lost or repeated. */
	void (*on_error)(struct etcd_watch *w, void *ud, int err);
};

/*
 * Watch [key, range_end) (range_end NULL/0 length = the key only) from
 * start_rev (0 = now). cbs must outlive the watch.
 */
int etcd_watch(struct etcd_client *c, const void *key, size_t klen, const void *range_end,
	       size_t elen, int64_t start_rev, int prev_kv, const struct etcd_watch_cbs *cbs,
	       void *ud, struct etcd_watch **out) MC_MUST_CHECK;
void etcd_watch_cancel(struct etcd_watch *w);

#endif
