/*
 * tcp: the TCP transport. Each peer gets te-tcp-conns persistent
 * connections (the paths slices are striped over), each owned by one data
 * worker; the serving side is tcp_srv.c, this engine's side of its
 * connections tcp_cli.c (tcp_int.h says what they share). Here: the
 * listener, the socket settings both use — TCP_NODELAY, TCP_USER_TIMEOUT
 * = the io timeout, and buffers of at least 4 MiB: the kernel's
 * autotuning where its maximum reaches that, else fixed when
 * net.core.[rw]mem_max allow it — the control calls other transports
 * make over the data port (rdma's queue-pair exchange), the timeouts (a
 * connection that makes no progress for the io timeout is closed, on
 * either side; the client fails its slices over to the other paths) and
 * the ops table.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "common/log.h"
#include "common/metrics.h"
#include "common/util.h"
#include "transfer/tcp_int.h"

#define LOG_SUBSYS LOGS_TCP

#define SOCKBUF_BYTES ((int)TE_TCP_SOCKBUF_BYTES)

/* ------------------------------------------------------------ sockets */

/* The idx-th number of a sysctl file ("4096 131072 6291456"), or 0. */
static long read_sysctl(const char *path, int idx)
{
	FILE *f = fopen(path, "re");
	long v = 0;
	for (int i = 0; f && i <= idx; i++)
		if (fscanf(f, "%ld", &v) != 1)
			v = 0;
	if (f)
		fclose(f);
	return v;
}

/*
 * Socket buffers: the kernel's autotuning grows them up to
 * net.ipv4.tcp_[rw]mem's maximum, and a fixed SO_[RCV|SND]BUF turns that
 * off. So a buffer is only fixed (at SOCKBUF_BYTES) when autotuning
 * would stay below it and net.core.[rw]mem_max allows it.
 */
static void pick_sockbufs(struct tcp_xport *x)
{
	if (read_sysctl("/proc/sys/net/ipv4/tcp_rmem", 2) < SOCKBUF_BYTES &&
	    read_sysctl("/proc/sys/net/core/rmem_max", 0) >= SOCKBUF_BYTES)
		x->rcvbuf = SOCKBUF_BYTES;
	if (read_sysctl("/proc/sys/net/ipv4/tcp_wmem", 2) < SOCKBUF_BYTES &&
	    read_sysctl("/proc/sys/net/core/wmem_max", 0) >= SOCKBUF_BYTES)
		x->sndbuf = SOCKBUF_BYTES;
}

void te__tcp_tune_socket(struct tcp_xport *x, int fd)
{
	int one = 1;
	unsigned timeout = (unsigned)MC_MIN(x->e->io_timeout_ms, 0x7fffffffu);
	(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	(void)setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &timeout, sizeof(timeout));
	if (x->sndbuf)
		(void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &x->sndbuf, sizeof(x->sndbuf));
	if (x->rcvbuf)
		(void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &x->rcvbuf, sizeof(x->rcvbuf));
}

/*
 * How much to read into the stage behind a body of `left` bytes read
 * straight into memory: after a large body only the next header (so its
 * bytes are not copied out of the stage again), after a small one as
 * much as fits (fewer system calls for small slices).
 */
size_t te__tcp_stage_tail(size_t left, size_t room)
{
	return left >= TE_TCP_STAGE_BYTES ? MC_MIN(room, (size_t)TE_WIRE_HDR_BYTES) : room;
}

/* writev without SIGPIPE: the engine is a library, the process may not
 * ignore the signal. */
ssize_t te__tcp_send_iov(int fd, struct iovec *iov, int n, bool *full)
{
	struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
	ssize_t w = sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
	size_t asked = 0;
	for (int i = 0; i < n; i++)
		asked += iov[i].iov_len;
	*full = w >= 0 && (size_t)w < asked;
	return w;
}

/* Connect with a deadline. Returns the fd or a negative code. */
int te__tcp_dial(const struct sockaddr_storage *ss, uint64_t deadline)
{
	int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	socklen_t sl = ss->ss_family == AF_INET6 ? sizeof(struct sockaddr_in6)
						 : sizeof(struct sockaddr_in);
	if (connect(fd, (const struct sockaddr *)ss, sl) == 0)
		return fd;
	if (errno != EINPROGRESS) {
		int rc = -errno;
		close(fd);
		return rc;
	}
	for (;;) {
		uint64_t now = mc_now_ms();
		if (now >= deadline) {
			close(fd);
			return MC_ETIMEDOUT;
		}
		struct pollfd pfd = {fd, POLLOUT, 0};
		int n = poll(&pfd, 1, (int)MC_MIN(deadline - now, 1000));
		if (n < 0 && errno != EINTR) {
			int rc = -errno;
			close(fd);
			return rc;
		}
		if (n > 0)
			break;
	}
	int soerr = 0;
	socklen_t len = sizeof(soerr);
	if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) != 0 || soerr) {
		close(fd);
		return soerr ? -soerr : -EIO;
	}
	return fd;
}

/* ------------------------------------------------------------ control calls */

int te__ctrl_open(struct te_engine *e, const struct te_desc *d, uint64_t timeout_ms)
{
	char hp[TE_HOST_MAX + 16];
	struct sockaddr_storage ss;
	snprintf(hp, sizeof(hp), strchr(d->host, ':') ? "[%s]:%u" : "%s:%u", d->host,
		 d->data_port);
	if (!(d->transports & TE_XP_TCP) || mc_parse_hostport(hp, &ss) != 0)
		return MC_EUNAVAILABLE;
	int fd = te__tcp_dial(&ss, mc_now_ms() + timeout_ms);
	if (fd < 0)
		return fd == -ECONNREFUSED ? MC_EUNAVAILABLE : fd;
	int rc = te__hs_client(fd, e->secret_len ? e->secret : NULL, e->secret_len, e->name,
			       d->name, timeout_ms);
	if (rc) {
		close(fd);
		return rc == -ECONNRESET ? MC_EUNAVAILABLE : rc;
	}
	return fd;
}

int te__ctrl_xchg(int fd, unsigned xid, const uint8_t *in, size_t inlen, uint8_t *out,
		  size_t *outlen, uint64_t timeout_ms)
{
	if (inlen > TE_CTRL_MAX_BYTES)
		return -EINVAL;
	uint64_t deadline = mc_now_ms() + timeout_ms;
	struct te_wire_hdr h = {
		.type = TE_WIRE_CTRL, .len = (uint32_t)inlen, .id = 1, .addr = xid};
	uint8_t hb[TE_WIRE_HDR_BYTES];
	te__wire_encode(&h, hb);
	int rc = te__io_full(fd, hb, sizeof(hb), true, deadline);
	if (rc == 0 && inlen)
		rc = te__io_full(fd, (void *)in, inlen, true, deadline);
	if (rc == 0)
		rc = te__io_full(fd, hb, sizeof(hb), false, deadline);
	if (rc == 0)
		rc = te__wire_decode(hb, TE_CTRL_MAX_BYTES, &h);
	if (rc == 0 && (h.type != TE_WIRE_RESP || h.id != 1))
		rc = MC_EPROTOCOL;
	if (rc == 0 && h.status)
		rc = h.status;
	if (rc == 0 && h.len > *outlen)
		rc = -EOVERFLOW;
	if (rc == 0 && h.len)
		rc = te__io_full(fd, out, h.len, false, deadline);
	if (rc == 0)
		*outlen = h.len;
	return rc == -ECONNRESET ? MC_EUNAVAILABLE : rc;
}

int te__ctrl_call(struct te_engine *e, const struct te_desc *d, unsigned xid,
		  const uint8_t *in, size_t inlen, uint8_t *out, size_t *outlen,
		  uint64_t timeout_ms)
{
	if (inlen > TE_CTRL_MAX_BYTES)
		return -EINVAL;
	int fd = te__ctrl_open(e, d, timeout_ms);
	if (fd < 0)
		return fd;
	int rc = te__ctrl_xchg(fd, xid, in, inlen, out, outlen, timeout_ms);
	close(fd);
	return rc;
}

/* ------------------------------------------------------------ timeouts */

static void tcp_tick(struct te_xport *xp, struct te_worker *w)
{
	struct tcp_xport *x = (struct tcp_xport *)xp;
	uint64_t now = mc_now_ms();
	te__tcp_cli_tick(x, w, now, x->e->io_timeout_ms);
	te__tcp_srv_tick(x, w, now, x->e->io_timeout_ms);
}

/* ------------------------------------------------------------ engine-wide */

static int tcp_init(struct te_engine *e, struct te_xport **out)
{
	struct sockaddr_storage ss;
	int rc;
	if (mc_parse_hostport(e->data_listen, &ss) != 0)
		return -EINVAL;
	struct tcp_xport *x = calloc(1, sizeof(*x));
	if (!x)
		return -ENOMEM;
	x->e = e;
	pthread_mutex_init(&x->mu, NULL);
	x->lioh.on_io = te__tcp_on_accept;
	pick_sockbufs(x);
	x->lfd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (x->lfd < 0) {
		rc = -errno;
		goto fail;
	}
	int one = 1;
	(void)setsockopt(x->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	socklen_t sl = ss.ss_family == AF_INET6 ? sizeof(struct sockaddr_in6)
						: sizeof(struct sockaddr_in);
	if (bind(x->lfd, (struct sockaddr *)&ss, sl) != 0 || listen(x->lfd, 512) != 0) {
		rc = -errno;
		log_error("transfer engine: cannot listen on %s: %s", e->data_listen,
			  strerror(errno));
		goto fail_fd;
	}
	sl = sizeof(ss);
	getsockname(x->lfd, (struct sockaddr *)&ss, &sl);
	x->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
						 : ((struct sockaddr_in *)&ss)->sin_port);
	rc = te__worker_add(&e->workers[0], x->lfd, &x->lioh, EPOLLIN);
	if (rc)
		goto fail_fd;
	*out = (struct te_xport *)x;
	return 0;
fail_fd:
	close(x->lfd);
fail:
	pthread_mutex_destroy(&x->mu);
	free(x);
	return rc;
}

/* After the workers stopped: nothing else touches the connections. */
static void tcp_fini(struct te_xport *xp)
{
	struct tcp_xport *x = (struct tcp_xport *)xp;
	close(x->lfd);
	te__tcp_srv_free_all(x);
	/* Client connections belong to peers freed with their segments. */
	pthread_mutex_destroy(&x->mu);
	free(x);
}

uint16_t te__tcp_port(const struct te_xport *xp)
{
	return ((const struct tcp_xport *)xp)->port;
}

static void tcp_describe(struct te_xport *xp, struct te_desc *d)
{
	d->data_port = ((struct tcp_xport *)xp)->port;
}

const struct te_xport_ops te__tcp_ops = {
	.name = "tcp",
	.proto = TE_PROTO_TCP,
	.init = tcp_init,
	.fini = tcp_fini,
	.describe = tcp_describe,
	.connect = te__tcp_connect,
	.submit = te__tcp_submit,
	.disconnect = te__tcp_disconnect,
	.peer_free = te__tcp_peer_free,
	.tick = tcp_tick,
};
