/*
 * handshake: the blocking client side of the connection handshake
 * (wire.h) for the setup thread, over a connected stream or seqpacket
 * socket, and the deadline-bound exact send and receive it and the
 * transports' control exchange (tcp.c) use.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "common/auth.h"
#include "common/util.h"
#include "transfer/te_int.h"

int te__io_full(int fd, void *buf, size_t len, bool write, uint64_t deadline_ms)
{
	uint8_t *p = buf;
	while (len > 0) {
		ssize_t n = write ? send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT)
				  : recv(fd, p, len, MSG_DONTWAIT);
		if (n > 0) {
			p += n;
			len -= (size_t)n;
			continue;
		}
		if (n == 0)
			return -ECONNRESET;
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN && errno != EWOULDBLOCK)
			return -errno;
		uint64_t now = mc_now_ms();
		if (now >= deadline_ms)
			return MC_ETIMEDOUT;
		struct pollfd pfd = {fd, write ? POLLOUT : POLLIN, 0};
		int ms = (int)MC_MIN(deadline_ms - now, 1000);
		if (poll(&pfd, 1, ms) < 0 && errno != EINTR)
			return -errno;
	}
	return 0;
}

static int hs_send(int fd, const struct te_hs_msg *m, uint64_t deadline)
{
	uint8_t buf[TE_HS_BYTES];
	te__hs_encode(m, buf);
	return te__io_full(fd, buf, sizeof(buf), true, deadline);
}

static int hs_recv(int fd, struct te_hs_msg *m, uint64_t deadline)
{
	uint8_t buf[TE_HS_BYTES];
	int rc = te__io_full(fd, buf, sizeof(buf), false, deadline);
	if (rc)
		return rc;
	return te__hs_decode(buf, m);
}

int te__hs_client(int fd, const uint8_t *secret, size_t slen, const char *own,
		  const char *target, uint64_t timeout_ms)
{
	uint64_t deadline = mc_now_ms() + timeout_ms;
	struct te_hs_msg m, r;
	bool have = secret && slen;
	int rc;

	memset(&m, 0, sizeof(m));
	m.kind = TE_HS_HELLO;
	m.flags = have ? TE_HS_F_SECRET : 0;
	rc = mc_random(m.nonce, sizeof(m.nonce));
	if (rc)
		return rc;
	snprintf(m.name, sizeof(m.name), "%s", own);
	snprintf(m.target, sizeof(m.target), "%s", target);
	uint8_t nonce_c[TE_HS_NONCE];
	memcpy(nonce_c, m.nonce, sizeof(nonce_c));
	if ((rc = hs_send(fd, &m, deadline)) || (rc = hs_recv(fd, &r, deadline)))
		return rc;
	if (r.kind == TE_HS_RESULT)
		return r.status < 0 ? r.status : (have ? -EACCES : 0);
	if (r.kind != TE_HS_CHALLENGE || !have)
		return MC_EPROTOCOL;
	uint8_t want[MC_SHA256_BYTES];
	te__hs_mac(secret, slen, true, nonce_c, r.nonce, target, want);
	if (!mc_ct_equal(want, r.mac, sizeof(want)))
		return -EACCES; /* the server does not know our secret */
	memset(&m, 0, sizeof(m));
	m.kind = TE_HS_AUTH;
	te__hs_mac(secret, slen, false, r.nonce, nonce_c, own, m.mac);
	if ((rc = hs_send(fd, &m, deadline)) || (rc = hs_recv(fd, &r, deadline)))
		return rc;
	if (r.kind != TE_HS_RESULT)
		return MC_EPROTOCOL;
	return r.status;
}
