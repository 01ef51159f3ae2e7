/*
 * libmooncake's connection to the agent: open (socket, hello, the
 * staging memfd), close, and requests. One connection per handle.
 * Requests from many threads are pipelined: each caller sends its frame
 * (under send_mu) and waits for the response with its id. Whoever waits
 * first becomes the reader and reads frames off the socket, handing each
 * response to its waiter, until its own has come; then another waiter
 * takes over (leader/follower, so no thread of the library's own).
 */
#include "client/client_int.h"

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/ltab.h"

MC__PUBLIC const char *mc_version(void)
{
	return MC_VERSION;
}

/* ------------------------------------------------------------ calls */

static void waiter_unlink(mc_client *c, struct waiter *w)
{
	for (struct waiter **pp = &c->waiters; *pp; pp = &(*pp)->next)
		if (*pp == w) {
			*pp = w->next;
			return;
		}
}

void mc__waiter_clear(struct waiter *w)
{
	if (w->resp)
		mooncake__client__response__free_unpacked(w->resp, NULL);
	for (unsigned i = 0; i < w->nfds; i++)
		if (w->fds[i] >= 0)
			close(w->fds[i]);
	w->resp = NULL;
	w->nfds = 0;
}

/* Read until one response is dispatched. Called by the reader only,
 * without mu. Returns 0 or the error that breaks the connection. */
static int read_one(mc_client *c)
{
	for (;;) {
		const uint8_t *body;
		size_t len;
		int rc = mc_uframe_rx_next(&c->rx, &body, &len);
		if (rc < 0)
			return MC_EPROTOCOL;
		if (rc == 1) {
			Response *resp = mooncake__client__response__unpack(NULL, len, body);
			if (!resp)
				return MC_EPROTOCOL;
			if (resp->id == 0) {
				/* No request's: why the agent closes the session
				 * (a session limit: -EUSERS). */
				int why = resp->error ? resp->error : MC_EPROTOCOL;
				mooncake__client__response__free_unpacked(resp, NULL);
				pthread_mutex_lock(&c->mu);
				c->closed_why = why;
				pthread_mutex_unlock(&c->mu);
				return why;
			}
			int fds[MAX_REPLY_FDS];
			unsigned nf = resp->nfds;
			if (nf > MAX_REPLY_FDS ||
			    mc_uframe_rx_take_fds(&c->rx, nf, fds) != 0) {
				mooncake__client__response__free_unpacked(resp, NULL);
				return MC_EPROTOCOL;
			}
			pthread_mutex_lock(&c->mu);
			struct waiter *w = c->waiters;
			while (w && w->id != resp->id)
				w = w->next;
			if (w && !w->done) {
				w->resp = resp;
				memcpy(w->fds, fds, nf * sizeof(int));
				w->nfds = nf;
				w->done = true;
				resp = NULL;
				nf = 0;
			}
			pthread_mutex_unlock(&c->mu);
			if (resp)
				mooncake__client__response__free_unpacked(resp, NULL);
			for (unsigned i = 0; i < nf; i++)
				close(fds[i]);
			return 0;
		}
		/* Wait in poll, not in a blocking recvmsg: a thread asleep in
		 * recvmsg on a Unix socket is woken each time the agent
		 * consumes one of our frames (write space on the same wait
		 * queue), poll sleeps only until there is something to read. */
		struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
		if (poll(&pfd, 1, -1) < 0 && errno != EINTR)
			return MC_EUNAVAILABLE;
		ssize_t n = mc_uframe_rx_read(&c->rx, c->fd, MSG_DONTWAIT);
		if (n == -EAGAIN)
			continue;
		if (n == 0)
			return MC_EUNAVAILABLE;
		if (n == MC_EPROTOCOL)
			return MC_EPROTOCOL;
		if (n < 0)
			return n == -ENOMEM ? -ENOMEM : MC_EUNAVAILABLE;
	}
}

/*
 * Send req with fds and wait for its response in *w (req->id and
 * req->nfds are set here). Returns 0 with w->resp set (its error field
 * may be non-zero), or MC_EUNAVAILABLE / -ENOMEM / -EMSGSIZE, or the
 * reason the agent gave for closing the session (-EUSERS).
 */
int mc__call(mc_client *c, Request *req, const int *fds, unsigned nfds, struct waiter *w)
{
	memset(w, 0, sizeof(*w));
	pthread_mutex_lock(&c->mu);
	if (c->broken) {
		int why = c->closed_why ? c->closed_why : MC_EUNAVAILABLE;
		pthread_mutex_unlock(&c->mu);
		return why;
	}
	w->id = ++c->next_id;
	w->next = c->waiters;
	c->waiters = w;
	pthread_mutex_unlock(&c->mu);

	req->id = w->id;
	req->nfds = nfds;
	size_t n = mooncake__client__request__get_packed_size(req);
	int rc = 0;
	uint8_t small[512];
	uint8_t *buf = n <= sizeof(small) ? small : malloc(n);
	if (n > MC_UFRAME_MAX_BYTES)
		rc = -EMSGSIZE;
	else if (!buf)
		rc = -ENOMEM;
	if (rc == 0) {
		mooncake__client__request__pack(req, buf);
		pthread_mutex_lock(&c->send_mu);
		rc = mc_uframe_send_all(c->fd, buf, n, fds, nfds);
		pthread_mutex_unlock(&c->send_mu);
	}
	if (buf != small)
		free(buf);
	pthread_mutex_lock(&c->mu);
	if (rc == -EMSGSIZE || rc == -ENOMEM) {
		waiter_unlink(c, w);
		pthread_mutex_unlock(&c->mu);
		return rc;
	}
	if (rc) {
		/* The agent closed the session: it may have said why first
		 * (a session limit), in a frame that is still to be read. */
		if ((rc == -EPIPE || rc == -ECONNRESET) && !c->reader) {
			c->reader = true;
			pthread_mutex_unlock(&c->mu);
			while (read_one(c) == 0)
				;
			pthread_mutex_lock(&c->mu);
			c->reader = false;
		}
		c->broken = MC_EUNAVAILABLE;
		pthread_cond_broadcast(&c->cv);
	}
	while (!w->done && !c->broken) {
		if (!c->reader) {
			c->reader = true;
			pthread_mutex_unlock(&c->mu);
			int err = read_one(c);
			pthread_mutex_lock(&c->mu);
			c->reader = false;
			if (err)
				c->broken = err;
			pthread_cond_broadcast(&c->cv);
		} else {
			pthread_cond_wait(&c->cv, &c->mu);
		}
	}
	waiter_unlink(c, w);
	bool done = w->done;
	int why = c->closed_why ? c->closed_why : MC_EUNAVAILABLE;
	pthread_mutex_unlock(&c->mu);
	return done ? 0 : why;
}

/* Send req without waiting for a response (the reader drops one if it
 * comes). For requests whose outcome nobody can act on. */
void mc__send_only(mc_client *c, Request *req)
{
	pthread_mutex_lock(&c->mu);
	bool broken = c->broken != 0;
	req->id = ++c->next_id;
	pthread_mutex_unlock(&c->mu);
	if (broken)
		return;
	req->nfds = 0;
	size_t n = mooncake__client__request__get_packed_size(req);
	uint8_t small[512];
	uint8_t *buf = n <= sizeof(small) ? small : malloc(n);
	if (!buf)
		return;
	mooncake__client__request__pack(req, buf);
	pthread_mutex_lock(&c->send_mu);
	int rc = mc_uframe_send_all(c->fd, buf, n, NULL, 0);
	pthread_mutex_unlock(&c->send_mu);
	if (buf != small)
		free(buf);
	if (rc) {
		pthread_mutex_lock(&c->mu);
		c->broken = MC_EUNAVAILABLE;
		pthread_cond_broadcast(&c->cv);
		pthread_mutex_unlock(&c->mu);
	}
}

/* ------------------------------------------------------------ open */

static int find_socket(char *out, size_t len)
{
	const char *env = getenv("MOONCAKE_SOCKET");
	if (env && *env) {
		snprintf(out, len, "%s", env);
		return 0;
	}
	if (access("/run/mooncake/agent.sock", F_OK) == 0) {
		snprintf(out, len, "/run/mooncake/agent.sock");
		return 0;
	}
	const char *xdg = getenv("XDG_RUNTIME_DIR");
	if (xdg && *xdg) {
		char p[4096];
		snprintf(p, sizeof(p), "%s/mooncake/agent.sock", xdg);
		if (access(p, F_OK) == 0) {
			snprintf(out, len, "%s", p);
			return 0;
		}
	}
	return -ENOENT;
}

/* Map the shared lease table the agent sent (fds: the table's and the
 * segment's). Any failure leaves the session without the table: its
 * gets ask the agent, as they would anyway. */
static void map_table(mc_client *c, const int *fds, uint64_t table_len)
{
	struct stat st;
	if (fstat(fds[0], &st) != 0 || (uint64_t)st.st_size < table_len ||
	    mc__map_segment(c, fds[1]) != 0)
		return;
	void *t = mmap(NULL, table_len, PROT_READ, MAP_SHARED, fds[0], 0);
	if (t == MAP_FAILED)
		return;
	if (mc_ltab_check(t, table_len, c->seg_len) != 0) {
		munmap(t, table_len);
		return;
	}
	c->ltab = t;
	c->ltab_len = table_len;
}

/* MOONCAKE_LEASE_TABLE=0 in the environment: gets always ask the agent. */
static bool table_wanted(void)
{
	const char *v = getenv("MOONCAKE_LEASE_TABLE");
	return !v || strcmp(v, "0") != 0;
}

static int hello(mc_client *c, const struct mc_open_opts *o)
{
	Mooncake__Client__Hello h = MOONCAKE__CLIENT__HELLO__INIT;
	h.version = PROTOCOL_VERSION;
	h.staging_size = o->staging_bytes;
	h.client_name = (char *)(o->client_name ? o->client_name : "");
	h.lease_table = table_wanted();
	Request req = MOONCAKE__CLIENT__REQUEST__INIT;
	req.op_case = MOONCAKE__CLIENT__REQUEST__OP_HELLO;
	req.hello = &h;
	struct waiter w;
	int rc = mc__call(c, &req, NULL, 0, &w);
	if (rc)
		return rc;
	const Response *r = w.resp;
	if (r->error) {
		rc = r->error;
	} else if (r->body_case != MOONCAKE__CLIENT__RESPONSE__BODY_HELLO ||
		   (w.nfds != 1 && w.nfds != 3) || r->hello->staging_size == 0) {
		rc = MC_EPROTOCOL;
	} else {
		struct stat st;
		size_t len = r->hello->staging_size;
		/* With the table: its descriptors, and the counts past the
		 * staging room (8-aligned, in the memfd). */
		uint64_t counts = r->hello->counters_offset;
		bool table = w.nfds == 3 && r->hello->lease_table_size && counts >= len &&
			     counts % 8 == 0 && counts <= SIZE_MAX - 16;
		size_t map_len = table ? (size_t)counts + 16 : len;
		if (fstat(w.fds[0], &st) != 0 || (uint64_t)st.st_size < map_len) {
			rc = MC_EPROTOCOL;
		} else {
			void *p = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_SHARED,
				       w.fds[0], 0);
			if (p == MAP_FAILED) {
				rc = -errno;
			} else {
				c->stg = p;
				c->stg_len = len;
				c->stg_map_len = map_len;
				if (table) {
					c->table_counts = (uint64_t *)(c->stg + counts);
					map_table(c, &w.fds[1], r->hello->lease_table_size);
				}
				snprintf(c->agent_addr, sizeof(c->agent_addr), "%s",
					 r->hello->rpc_address ? r->hello->rpc_address : "");
				c->segment_size = r->hello->segment_size;
			}
		}
	}
	mc__waiter_clear(&w);
	return rc;
}

MC__PUBLIC int mc_open_ex(const struct mc_open_opts *opts, mc_client **out)
{
	struct mc_open_opts o = opts ? *opts : (struct mc_open_opts){0};
	char path[4096];
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int rc;
	if (o.socket_path && *o.socket_path)
		snprintf(path, sizeof(path), "%s", o.socket_path);
	else if ((rc = find_socket(path, sizeof(path))) != 0)
		return rc;
	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	memcpy(sa.sun_path, path, strlen(path));
	mc_client *c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (c->fd < 0) {
		rc = -errno;
		goto out_free;
	}
	if (connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
		rc = -errno;
		goto out_close;
	}
	rc = mc_uframe_rx_init(&c->rx, MC_UFRAME_MAX_BYTES);
	if (rc)
		goto out_close;
	pthread_mutex_init(&c->mu, NULL);
	pthread_mutex_init(&c->send_mu, NULL);
	pthread_cond_init(&c->cv, NULL);
	rc = hello(c, &o);
	if (rc == 0)
		rc = mc__host_track(c);
	if (rc) {
		mc_close(c);
		return rc;
	}
	c->verify_gets = o.verify_gets != 0;
	*out = c;
	return 0;

out_close:
	close(c->fd);
out_free:
	free(c);
	return rc;
}

MC__PUBLIC int mc_open(const char *socket_path, mc_client **out)
{
	struct mc_open_opts o = {.socket_path = socket_path};
	return mc_open_ex(&o, out);
}

MC__PUBLIC void mc_close(mc_client *c)
{
	if (!c)
		return;
	mc__host_untrack(c);
	close(c->fd);
	for (size_t i = 0; i < c->nranges; i++)
		if (c->ranges[i].kind == R_ALLOC)
			munmap(c->ranges[i].map_base, c->ranges[i].map_len);
	free(c->ranges);
	free(c->blocks);
	if (c->stg)
		munmap(c->stg, c->stg_map_len);
	if (c->seg)
		munmap((void *)c->seg, c->seg_len);
	if (c->ltab)
		munmap((void *)c->ltab, c->ltab_len);
	mc_uframe_rx_free(&c->rx);
	pthread_cond_destroy(&c->cv);
	pthread_mutex_destroy(&c->send_mu);
	pthread_mutex_destroy(&c->mu);
	free(c);
}

MC__PUBLIC const char *mc_agent_address(const mc_client *c)
{
	return c->agent_addr;
}

MC__PUBLIC uint64_t mc_segment_size(const mc_client *c)
{
	return c->segment_size;
}

MC__PUBLIC uint64_t mc_staging_size(const mc_client *c)
{
	return c->stg_len;
}
