/*
 * server.h: the client server (server.c) — the Unix socket, the sessions
 * (staging buffer, registered buffers, zero-copy views), their output
 * queues, the limits of what a session may hold, the busy poll, the
 * replies and the drain before a stop. A part below the operations: it
 * hands each checked request to the on_request hook the agent sets and
 * calls only the request check (req.c), the memory maps (mem.c), the copy
 * threads (are they busy?) and the statistics. The operations reach a
 * session only through the functions below: struct agent_conn is
 * server.c's alone.
 */
#ifndef MC_AGENT_SERVER_H
#define MC_AGENT_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "client.pb-c.h"
#include "common/err.h"

#define AGENT_MAX_INFLIGHT 256u /* requests per session */

struct agent;
struct agent_conn;
struct agent_inst;
struct agent_map;
struct agent_req;

/* A buffer of a session: registered client memory, or memory the agent
 * made for the client. */
struct agent_buf {
	uint64_t id;
	struct agent_map *map;
	uint8_t *base;
	uint64_t len;
	uint64_t address; /* published to the engine at this address, or 0 */
	bool alloc;       /* made by the agent (--client-alloc-size) */
};

/* A zero-copy view a session holds: the read lease of key is renewed
 * while it is held. */
struct agent_view {
	uint64_t id;
	uint64_t offset, size;
	uint16_t klen;
	uint8_t *key; /* owned */
};

/*
 * What clients may hold (the --client-* keys). Sessions past a count are
 * refused at connect; a session whose queued replies (with the memory
 * attached to them and reserved for them) or whose descriptors in flight
 * and queued pass their limit is not read from until its client has read
 * enough of its replies (backpressure: a slow reader is never closed);
 * buffers, views and allocated memory past theirs are refused.
 */
struct agent_limits {
	unsigned sessions; /* open sessions, every uid */
	unsigned sessions_per_uid;
	uint64_t reply_bytes; /* per session */
	unsigned fds;         /* per session, beside its buffers' */
	unsigned buffers;     /* per session */
	unsigned views;       /* per session */
	uint64_t alloc_bytes; /* AllocBuffer memory, every session */
};

/* A request waiting for room in its session's reply budget
 * (agent__session_reserve). */
struct agent_wait {
	struct agent_wait *next;
	struct agent_req *r;
	uint64_t bytes;
	void (*resume)(struct agent_wait *w, int err);
};

/* The server's state, embedded in struct agent (touched only by
 * server.c). */
struct agent_server {
	struct agent_limits lim;
	char *socket_path;
	int listen_fd;
	uv_poll_t listen_poll;
	bool listen_open;
	struct agent_conn *conns;
	unsigned nconns;
	unsigned conn_objs; /* sessions not yet freed */
	unsigned reqs;      /* requests in flight, every session */
	/* The session of the last request and when requests began to come
	 * from it alone (a get copies inline when it is the only one). */
	const struct agent_conn *last_conn; /* compared, never followed */
	uint64_t solo_since_ns;
	uint64_t staging_in_use;
	uint64_t nbuffers, nviews; /* of every session */
	uint64_t held_bytes;       /* reply budgets in use, every session */
	uint64_t held_fds;         /* descriptors in flight and queued */
	uint64_t alloc_bytes;      /* buffers made for clients */
	/* Draining (agent__server_drain): no listener, new requests
	 * refused; on_drained once nothing is in flight or queued. */
	bool draining, drained;
	void (*on_drained)(struct agent *a);
	/* busy poll: the loop polls without sleeping until spin_until_ns,
	 * set spin_ns after each request and reply */
	uv_idle_t spin_idle;
	uint64_t spin_ns, spin_until_ns, spin_start_ns;
	/* Sessions read again with whole frames buffered (server.c,
	 * conn_update_poll), served on the loop's next turn. */
	uv_idle_t kick_idle;
	struct agent_conn *kicks;
	/* Listening again after accept() ran out of descriptors. */
	uv_timer_t accept_timer;
	/* The clients' counts of gets they answered from the shared lease
	 * table are added to the statistics this often (AGENT_FOLD_MS),
	 * and at a Stats request and a session's end. */
	uv_timer_t fold_timer;
	void (*on_request)(struct agent_req *r);
	void (*on_gone)(struct agent *a);
};

/*
 * Listen on path (its directory made, a stale socket file replaced).
 * Each request that passes agent__req_check goes to on_request, which
 * must end it (agent__req_end) once it has replied; on_gone runs when a
 * closed session's memory is freed (a stop may wait for the last).
 * spin_ns: --busy-poll-us in ns (0: off); lim: the clients' limits
 * (copied). Errors: -EINVAL (path too long), -EEXIST (not a socket),
 * -EADDRINUSE (another agent serves it), negative errno of
 * mkdir/socket/bind/listen, -ENOMEM.
 */
int agent__server_start(struct agent *a, const char *path, uint64_t spin_ns,
			const struct agent_limits *lim,
			void (*on_request)(struct agent_req *r),
			void (*on_gone)(struct agent *a)) MC_MUST_CHECK;
/*
 * Drain before a stop: stop listening (the socket file goes: new clients
 * are refused by the kernel), answer every request that comes from now
 * on with MC_ESHUTDOWN, and call on_drained(a) once no request is in
 * flight and every reply has been written or its session has closed
 * (perhaps before this returns). The sessions stay open: a stop closes
 * them.
 */
void agent__server_drain(struct agent *a, void (*on_drained)(struct agent *a));
/* Stop listening and close every session. Returns how many handles it
 * closed with on_closed (which gets them with data pointing at the
 * agent). */
unsigned agent__server_stop(struct agent *a, uv_close_cb on_closed);
/* Close the busy poll's handle (last); returns how many (1). */
unsigned agent__server_close(struct agent *a, uv_close_cb on_closed);
/* No session is left, not even one waiting for its requests to end. */
bool agent__server_idle(const struct agent *a);
const char *agent__server_path(const struct agent *a);
/* Free what agent__server_start kept (after the agent stopped). */
void agent__server_free(struct agent *a);
/* Keep the loop polling for a while (see server.c, busy poll). */
void agent__spin_touch(struct agent *a);
/* Sessions, buffers and views of every session. */
void agent__server_counts(const struct agent *a, uint64_t *clients, uint64_t *buffers,
			  uint64_t *views);
/* Requests in flight, every session; and since when the session of the
 * last request has been the only one sending. */
unsigned agent__server_reqs(const struct agent *a);
uint64_t agent__server_solo_since_ns(const struct agent *a);
/* The buffer some session published at an address range holding
 * [addr, addr + len), or NULL. */
const struct agent_buf *agent__server_published(const struct agent *a, uint64_t addr,
						uint64_t len);
/* Every view held by every session, for lease renewal. */
void agent__views_foreach(struct agent *a, void (*fn)(void *ud, const struct agent_view *v),
			  void *ud);

/* Replies. Queue a response to r on its session (dropped if it closed).
 * The descriptors in fds are sent with it; those with own set are closed
 * afterwards. Frees nothing of resp. */
void agent__reply(struct agent_req *r, Mooncake__Client__Response *resp, const int *fds,
		  const bool *own, unsigned nfds);
/* Reply with only an error code and message. */
void agent__reply_error(struct agent_req *r, int err, const char *message);
/* The end of a request, after its operation released what it held:
 * close the descriptors it did not use, free its message and itself,
 * drop its session reference. */
void agent__req_end(struct agent_req *r);

/* A session. */
const char *agent__session_name(const struct agent_conn *c);
uid_t agent__session_uid(const struct agent_conn *c);
/* The client's process (SO_PEERCRED) and a pidfd of it (*pidfd: -1 on a
 * kernel without pidfds, or once the session closed). */
pid_t agent__session_pid(const struct agent_conn *c, int *pidfd);
/* The client hung up (or broke the framing): replies go nowhere. */
bool agent__session_closed(const struct agent_conn *c);
/* Hello: the session is named after client_name (NULL or "": kept) and
 * takes staging (its reference) as its staging buffer, of which the
 * client may use staging_len bytes; with table_counts, the 16 bytes after
 * them are its counts of gets answered from the shared lease table. */
void agent__session_hello(struct agent_conn *c, const char *client_name,
			  struct agent_map *staging, uint64_t staging_len, bool table_counts);
/* Add the sessions' counts of gets answered from the shared lease table
 * to the statistics (also every AGENT_FOLD_MS). */
void agent__server_fold(struct agent *a);
#define AGENT_FOLD_MS 1000
#define AGENT_TABLE_COUNTS_BYTES 64u
/* Descriptors a reply carries at most (a hello with the shared lease
 * table: staging, table, segment). */
#define AGENT_REPLY_MAX_FDS 3u
/* The staging buffer, or NULL before hello. */
struct agent_map *agent__session_staging(const struct agent_conn *c, uint8_t **base,
					 uint64_t *len);
/* The session's own transfer engine (inst.c), or NULL: the agent's. */
struct agent_inst *agent__session_inst(const struct agent_conn *c);
/* Give the session its engine (takes the reference on success; the
 * session drops it when it closes). Errors: -EEXIST (it has one),
 * -EBUSY (it published buffers with the agent's engine already). */
int agent__session_set_inst(struct agent_conn *c, struct agent_inst *i) MC_MUST_CHECK;
/* The session has as many buffers as --client-max-buffers allows
 * (counted as a refusal). */
bool agent__session_bufs_full(struct agent_conn *c);
/* Add a buffer; takes the map reference on success. *id names it.
 * alloc: the agent made its memory, taken with agent__server_alloc_take
 * (given back when the buffer goes). Errors: -ENOSPC
 * (--client-max-buffers), -ENOMEM. */
int agent__session_buf_add(struct agent_conn *c, struct agent_map *m, uint8_t *base,
			   uint64_t len, uint64_t address, bool alloc,
			   uint64_t *id) MC_MUST_CHECK;
/* Take len bytes of --client-alloc-size for a buffer the agent makes,
 * or give them back (the buffer was never added). Errors: -ENOSPC (they
 * do not fit: counted and logged). */
int agent__server_alloc_take(struct agent_conn *c, uint64_t len) MC_MUST_CHECK;
void agent__server_alloc_give(struct agent *a, uint64_t len);
const struct agent_buf *agent__session_buf(const struct agent_conn *c, uint64_t id);
/* Forget buffer id; its map reference goes to the caller (NULL: none). */
struct agent_map *agent__session_buf_remove(struct agent_conn *c, uint64_t id);
/* Hold a view of key at [offset, offset + size) of the segment; *id
 * names it. Errors: -ENOSPC (--client-max-views: counted), -ENOMEM. */
int agent__session_view_add(struct agent_conn *c, const uint8_t *key, size_t klen,
			    uint64_t offset, uint64_t size, uint64_t *id) MC_MUST_CHECK;
/* Forget view id; false if the session holds none by that id. */
bool agent__session_view_drop(struct agent_conn *c, uint64_t id);
/* The client holds a descriptor of the segment already. */
bool agent__session_has_segment_fd(const struct agent_conn *c);
void agent__session_segment_fd_sent(struct agent_conn *c);
/*
 * Reserve bytes of r's session reply budget (--client-reply-buffer-size)
 * for memory its reply will carry (a get's spill memfd); they go with
 * the reply and come back once it is written (or at agent__req_end when
 * no reply took them). Granted at once when the session holds nothing
 * else or they fit beside what it holds: returns 0. Otherwise w waits
 * and 1 is returned: w->resume(w, 0) runs once they fit (granted), or
 * w->resume(w, MC_ECANCELLED) when the session closes first; w must stay
 * valid until then (it is r's).
 */
int agent__session_reserve(struct agent_req *r, uint64_t bytes, struct agent_wait *w,
			   void (*resume)(struct agent_wait *w, int err));

#endif
