/*
 * test_te_peers: the lifetime of transport peer objects. A TCP
 * connection's kick task must never be queued twice: one that was (a
 * connection that took slices while answers arrived, then a submit,
 * with its kick still queued behind the worker's current events) cut the
 * tasks queued after it off the worker's queue, and their peer
 * references were never dropped, so the peer, its connections and their
 * buffers outlived te_free (LeakSanitizer in test_transfer.py, about one
 * run in four). Here the worker is held so that exactly that order
 * happens every time: a kick queued, the connection's answer handled, a
 * submit; then the peer must hold only the segment's reference and
 * mooncake_te_peers must be 0 after te_free (host_stop checks it).
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "test_te_util.h"

#define BLOCK 4096

/* A task that holds its worker until released. */
struct gate {
	struct te_task t;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool entered, released;
};

static void gate_run(struct te_task *t)
{
	struct gate *g = MC_CONTAINER_OF(t, struct gate, t);
	pthread_mutex_lock(&g->mu);
	g->entered = true;
	pthread_cond_broadcast(&g->cv);
	while (!g->released)
		pthread_cond_wait(&g->cv, &g->mu);
	pthread_mutex_unlock(&g->mu);
}

/* Post the gate to w and return once w is held by it. */
static void gate_hold(struct gate *g, struct te_worker *w)
{
	memset(g, 0, sizeof(*g));
	pthread_mutex_init(&g->mu, NULL);
	pthread_cond_init(&g->cv, NULL);
	g->t.run = gate_run;
	te__worker_post(w, &g->t);
	pthread_mutex_lock(&g->mu);
	while (!g->entered)
		pthread_cond_wait(&g->cv, &g->mu);
	pthread_mutex_unlock(&g->mu);
}

static void gate_release(struct gate *g)
{
	pthread_mutex_lock(&g->mu);
	g->released = true;
	pthread_cond_broadcast(&g->cv);
	pthread_mutex_unlock(&g->mu);
}

/* An eventfd on a worker whose event submits one read (on the worker's
 * thread, in the middle of its round of events). */
struct submitter {
	struct te_ioh ioh;
	struct te_worker *w;
	int fd;
	struct te_request req;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct te_batch *b;
	int rc;
	bool done;
};

static void submit_on_io(struct te_ioh *h, uint32_t events)
{
	struct submitter *sb = MC_CONTAINER_OF(h, struct submitter, ioh);
	(void)events;
	te__worker_del(sb->w, sb->fd); /* once */
	struct te_batch *b = NULL;
	int rc = te_submit(H.e[0], &sb->req, 1, &b);
	pthread_mutex_lock(&sb->mu);
	sb->b = b;
	sb->rc = rc;
	sb->done = true;
	pthread_cond_broadcast(&sb->cv);
	pthread_mutex_unlock(&sb->mu);
}

static void submitter_init(struct submitter *sb, struct te_worker *w,
			   const struct te_request *req)
{
	memset(sb, 0, sizeof(*sb));
	sb->ioh.on_io = submit_on_io;
	sb->w = w;
	sb->req = *req;
	pthread_mutex_init(&sb->mu, NULL);
	pthread_cond_init(&sb->cv, NULL);
	sb->fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	cr_assert(sb->fd >= 0);
	cr_assert_eq(te__worker_add(w, sb->fd, &sb->ioh, EPOLLIN), 0);
}

static void submitter_fire(struct submitter *sb)
{
	cr_assert_eq(eventfd_write(sb->fd, 1), 0);
}

/* Wait for its batch and check that the read succeeded. */
static void submitter_finish(struct submitter *sb)
{
	pthread_mutex_lock(&sb->mu);
	while (!sb->done)
		pthread_cond_wait(&sb->cv, &sb->mu);
	pthread_mutex_unlock(&sb->mu);
	cr_assert_eq(sb->rc, 0);
	cr_assert_eq(te_wait(sb->b, 20000), 0);
	struct te_result res;
	cr_assert_eq(te_poll(sb->b, &res), 0);
	cr_assert_eq(res.status, TE_DONE, "read: %d", res.err);
	te_batch_free(sb->b);
	close(sb->fd);
	pthread_mutex_destroy(&sb->mu);
	pthread_cond_destroy(&sb->cv);
}

static void read_once(struct te_segment *s, struct mem *b, struct mem *dst)
{
	struct te_request q = {TE_READ, dst->p, s,    (uint64_t)(uintptr_t)b->p,
			       BLOCK,   false,  false};
	struct te_batch *bt;
	cr_assert_eq(te_submit(H.e[0], &q, 1, &bt), 0);
	cr_assert_eq(te_wait(bt, 20000), 0);
	struct te_result res;
	cr_assert_eq(te_poll(bt, &res), 0);
	cr_assert_eq(res.status, TE_DONE, "read: %d", res.err);
	te_batch_free(bt);
}

/* This process's sockets connected to port. */
static int sockets_to(uint16_t port, int *fds, int max)
{
	int n = 0;
	DIR *d = opendir("/proc/self/fd");
	cr_assert(d);
	for (struct dirent *de; (de = readdir(d));) {
		struct sockaddr_in sa;
		socklen_t sl = sizeof(sa);
		int fd = atoi(de->d_name);
		if (de->d_name[0] != '.' &&
		    getpeername(fd, (struct sockaddr *)&sa, &sl) == 0 &&
		    sa.sin_family == AF_INET && ntohs(sa.sin_port) == port && n < max)
			fds[n++] = fd;
	}
	closedir(d);
	return n;
}

/* Wait until one of fds is readable; returns how many are. */
static int wait_readable(const int *fds, int n)
{
	struct pollfd p[8];
	for (int i = 0; i < n; i++)
		p[i] = (struct pollfd){.fd = fds[i], .events = POLLIN};
	int got = poll(p, (nfds_t)n, 20000);
	cr_assert(got > 0, "an answer arrives");
	return got;
}

Test(te_peers, kick_never_queued_twice)
{
	/* One data thread each: every connection of the peer on one worker,
	 * whose task queue holds the kicks of all four. */
	struct te_opts t[2] = {
		{.protocol = TE_PROTO_TCP,
		 .threads = 1,
		 .tcp_conns = 4,
		 .slice_bytes = 64 << 10,
		 .rdma_gid_index = -1},
		{.protocol = TE_PROTO_TCP,
		 .threads = 1,
		 .tcp_conns = 4,
		 .slice_bytes = 64 << 10,
		 .rdma_gid_index = -1},
	};
	host_start_with(t);
	struct mem b, dst;
	mem_new(H.e[1], 1 << 20, &b);
	mem_new(H.e[0], 1 << 20, &dst);
	for (size_t i = 0; i < b.len; i++)
		b.p[i] = (uint8_t)(i * 2654435761u >> 24);
	struct te_segment *s = open_b();
	read_once(s, &b, &dst); /* the connections are up */
	pthread_mutex_lock(&s->mu);
	uint16_t dport = s->desc->data_port;
	pthread_mutex_unlock(&s->mu);
	int fds[8];
	int nfds = sockets_to(dport, fds, 8);
	cr_assert_eq(nfds, 4, "four connections to the peer");
	struct te_worker *w = &H.e[0]->workers[0];

	/* The peer answers nothing until released; read A goes out on the
	 * first connection (the first kick takes it), before the gate that
	 * then holds our worker. */
	struct gate server, client;
	gate_hold(&server, &H.e[1]->workers[0]);
	struct te_request qa = {TE_READ, dst.p, s,    (uint64_t)(uintptr_t)b.p,
				BLOCK,   false, false};
	struct te_batch *ba;
	cr_assert_eq(te_submit(H.e[0], &qa, 1, &ba), 0);
	gate_hold(&client, w);

	/* Ready, in this order, for the worker's next round of events:
	 * 1. a submit of B (kicks every connection: four kick tasks queued),
	 * 2. A's answer (that connection takes B at once; its kick is still
	 *    queued), 3. a submit of C (must not queue that kick again). */
	struct submitter sb, sc;
	struct te_request qb = {TE_READ, dst.p + BLOCK, s,    (uint64_t)(uintptr_t)b.p + BLOCK,
				BLOCK,   false,         false};
	struct te_request qc = {TE_READ, dst.p + 2 * BLOCK,
				s,       (uint64_t)(uintptr_t)b.p + 2 * BLOCK,
				BLOCK,   false,
				false};
	submitter_init(&sb, w, &qb);
	submitter_init(&sc, w, &qc);
	submitter_fire(&sb);
	gate_release(&server);
	cr_assert_eq(wait_readable(fds, nfds), 1, "only A's connection has an answer");
	submitter_fire(&sc);
	gate_release(&client);

	cr_assert_eq(te_wait(ba, 20000), 0);
	struct te_result res;
	cr_assert_eq(te_poll(ba, &res), 0);
	cr_assert_eq(res.status, TE_DONE, "read A: %d", res.err);
	te_batch_free(ba);
	submitter_finish(&sb);
	submitter_finish(&sc);
	cr_assert(memcmp(dst.p, b.p, 3 * BLOCK) == 0, "every byte read");
	/* Every kick task ran and dropped its reference (they ran before C,
	 * which one of them took, was answered). */
	cr_expect_eq(atomic_load(&s->remote->refs), 1,
		     "only the segment holds the peer (%d references more)",
		     atomic_load(&s->remote->refs) - 1);
	te_close_segment(s);
	mem_free(&b);
	mem_free(&dst);
	host_stop(); /* mooncake_te_peers 0 */
	pthread_mutex_destroy(&server.mu);
	pthread_cond_destroy(&server.cv);
	pthread_mutex_destroy(&client.mu);
	pthread_cond_destroy(&client.cv);
}
