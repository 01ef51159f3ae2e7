/*
 * test_uframe: the client protocol's framing (src/common/uframe.c) — frames
 * split anywhere, length limits, descriptors queued in arrival order and
 * handed to the frame that announced them, descriptors over a real
 * socketpair with partial reads, and the close of unclaimed descriptors.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/uframe.h"

static size_t put_frame(uint8_t *out, const void *body, uint32_t len)
{
	mc_uframe_put_len(out, len);
	memcpy(out + 4, body, len);
	return 4 + len;
}

Test(uframe, length_roundtrip)
{
	uint8_t h[4];
	uint32_t vals[] = {1, 255, 256, 65535, 1u << 24, 0xffffffffu};
	for (size_t i = 0; i < sizeof(vals) / sizeof(vals[0]); i++) {
		mc_uframe_put_len(h, vals[i]);
		cr_assert_eq(mc_uframe_get_len(h), vals[i]);
	}
	mc_uframe_put_len(h, 0x04030201);
	cr_assert(memcmp(h, "\x01\x02\x03\x04", 4) == 0, "little-endian");
}

Test(uframe, frames_split_anywhere)
{
	uint8_t stream[4096];
	size_t n = 0;
	const char *bodies[] = {"a", "hello", "", "0123456789abcdef"};
	size_t nb = 0;
	for (size_t i = 0; i < 4; i++) {
		if (!strlen(bodies[i]))
			continue;
		n += put_frame(stream + n, bodies[i], (uint32_t)strlen(bodies[i]));
		nb++;
	}
	for (size_t step = 1; step <= n; step++) {
		struct mc_uframe_rx r;
		cr_assert_eq(mc_uframe_rx_init(&r, 1024), 0);
		size_t got = 0;
		for (size_t off = 0; off < n; off += step) {
			size_t k = n - off < step ? n - off : step;
			cr_assert_eq(mc_uframe_rx_feed(&r, stream + off, k), 0);
			const uint8_t *b;
			size_t len;
			int rc;
			while ((rc = mc_uframe_rx_next(&r, &b, &len)) == 1) {
				const char *want = got == 0   ? "a"
						   : got == 1 ? "hello"
							      : "0123456789abcdef";
				cr_assert_eq(len, strlen(want), "step %zu frame %zu", step,
					     got);
				cr_assert(memcmp(b, want, len) == 0);
				got++;
			}
			cr_assert_eq(rc, 0);
		}
		cr_assert_eq(got, nb, "step %zu", step);
		cr_assert(mc_uframe_rx_idle(&r));
		mc_uframe_rx_free(&r);
	}
}

Test(uframe, zero_length_is_a_protocol_error)
{
	struct mc_uframe_rx r;
	cr_assert_eq(mc_uframe_rx_init(&r, 1024), 0);
	uint8_t z[4] = {0};
	cr_assert_eq(mc_uframe_rx_feed(&r, z, 4), 0);
	const uint8_t *b;
	size_t len;
	cr_assert_eq(mc_uframe_rx_next(&r, &b, &len), MC_EPROTOCOL);
	mc_uframe_rx_free(&r);
}

Test(uframe, oversized_is_refused_before_the_body)
{
	struct mc_uframe_rx r;
	cr_assert_eq(mc_uframe_rx_init(&r, 100), 0);
	uint8_t h[4];
	mc_uframe_put_len(h, 101);
	cr_assert_eq(mc_uframe_rx_feed(&r, h, 4), 0);
	const uint8_t *b;
	size_t len;
	cr_assert_eq(mc_uframe_rx_next(&r, &b, &len), MC_ETOO_LARGE);
	mc_uframe_rx_free(&r);
	/* Exactly the maximum is fine. */
	cr_assert_eq(mc_uframe_rx_init(&r, 100), 0);
	uint8_t buf[104] = {0};
	mc_uframe_put_len(buf, 100);
	cr_assert_eq(mc_uframe_rx_feed(&r, buf, sizeof(buf)), 0);
	cr_assert_eq(mc_uframe_rx_next(&r, &b, &len), 1);
	cr_assert_eq(len, 100);
	mc_uframe_rx_free(&r);
}

static bool fd_open(int fd)
{
	return fcntl(fd, F_GETFD) >= 0;
}

Test(uframe, descriptor_fifo_and_close_on_free)
{
	struct mc_uframe_rx r;
	cr_assert_eq(mc_uframe_rx_init(&r, 1024), 0);
	int fds[40];
	for (int i = 0; i < 40; i++) {
		fds[i] = dup(0);
		cr_assert_geq(fds[i], 0);
		cr_assert_eq(mc_uframe_rx_push_fd(&r, fds[i]), 0);
	}
	int out[16];
	cr_assert_eq(mc_uframe_rx_take_fds(&r, 17, out), MC_EPROTOCOL, "above the maximum");
	cr_assert_eq(mc_uframe_rx_take_fds(&r, 3, out), 0);
	cr_assert_eq(out[0], fds[0]);
	cr_assert_eq(out[2], fds[2]);
	for (int i = 0; i < 3; i++)
		close(out[i]);
	cr_assert_eq(mc_uframe_rx_queued_fds(&r), 37);
	mc_uframe_rx_free(&r);
	for (int i = 3; i < 40; i++)
		cr_assert(!fd_open(fds[i]), "fd %d closed by free", i);
}

Test(uframe, take_more_than_queued)
{
	struct mc_uframe_rx r;
	cr_assert_eq(mc_uframe_rx_init(&r, 1024), 0);
	int fd = dup(0);
	cr_assert_eq(mc_uframe_rx_push_fd(&r, fd), 0);
	int out[2];
	cr_assert_eq(mc_uframe_rx_take_fds(&r, 2, out), MC_EPROTOCOL);
	cr_assert_eq(mc_uframe_rx_queued_fds(&r), 1, "nothing taken");
	mc_uframe_rx_free(&r);
}

/* Over a socketpair: frames with descriptors, read in small pieces. */
Test(uframe, socketpair_frames_with_descriptors)
{
	int sv[2];
	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	int pipes[3][2];
	for (int i = 0; i < 3; i++)
		cr_assert_eq(pipe(pipes[i]), 0);
	/* Three frames: one descriptor, none, two. */
	uint8_t body[3000];
	for (size_t i = 0; i < sizeof(body); i++)
		body[i] = (uint8_t)(i * 7);
	cr_assert_eq(mc_uframe_send_all(sv[0], body, 10, &pipes[0][1], 1), 0);
	cr_assert_eq(mc_uframe_send_all(sv[0], body, sizeof(body), NULL, 0), 0);
	int two[2] = {pipes[1][1], pipes[2][1]};
	cr_assert_eq(mc_uframe_send_all(sv[0], body + 5, 20, two, 2), 0);
	for (int i = 0; i < 3; i++)
		close(pipes[i][1]);

	struct mc_uframe_rx r;
	cr_assert_eq(mc_uframe_rx_init(&r, 1 << 20), 0);
	size_t lens[3] = {10, sizeof(body), 20};
	unsigned nfds[3] = {1, 0, 2};
	int got = 0;
	while (got < 3) {
		const uint8_t *b;
		size_t len;
		int rc = mc_uframe_rx_next(&r, &b, &len);
		cr_assert_geq(rc, 0);
		if (rc == 0) {
			cr_assert_gt(mc_uframe_rx_read(&r, sv[1], 0), 0);
			continue;
		}
		cr_assert_eq(len, lens[got]);
		cr_assert(memcmp(b, got == 2 ? body + 5 : body, len) == 0);
		int fds[2];
		cr_assert_eq(mc_uframe_rx_take_fds(&r, nfds[got], fds), 0, "frame %d", got);
		for (unsigned k = 0; k < nfds[got]; k++) {
			/* The write end of a pipe we made: writing reaches it. */
			cr_assert_eq(write(fds[k], "x", 1), 1);
			close(fds[k]);
		}
		got++;
	}
	cr_assert_eq(mc_uframe_rx_queued_fds(&r), 0);
	char c;
	for (int i = 0; i < 3; i++) {
		cr_assert_eq(read(pipes[i][0], &c, 1), 1, "pipe %d got its byte", i);
		close(pipes[i][0]);
	}
	close(sv[0]);
	cr_assert_eq(mc_uframe_rx_read(&r, sv[1], 0), 0, "end of stream");
	mc_uframe_rx_free(&r);
	close(sv[1]);
}

Test(uframe, too_many_descriptors_is_refused_by_the_sender)
{
	int sv[2];
	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	int fds[MC_UFRAME_MAX_FDS + 1];
	for (unsigned i = 0; i <= MC_UFRAME_MAX_FDS; i++)
		fds[i] = 0;
	cr_assert_eq(mc_uframe_send_all(sv[0], "x", 1, fds, MC_UFRAME_MAX_FDS + 1), -EINVAL);
	close(sv[0]);
	close(sv[1]);
}

/* frame_fds: a chunk of bytes that brings descriptors may start several
 * frames; the descriptors go to the frame that announces them, and those
 * nobody announced are closed with the last frame that starts there. */
Test(uframe, frame_fds_follow_the_bytes_that_brought_them)
{
	struct mc_uframe_rx r;
	cr_assert_eq(mc_uframe_rx_init(&r, 1024), 0);
	uint8_t s[64];
	size_t n = put_frame(s, "a", 1); /* A: no descriptors */
	n += put_frame(s + n, "bb", 2);  /* B: announces one */
	/* One chunk (one recvmsg) brings A, B's first bytes and a descriptor. */
	cr_assert_eq(mc_uframe_rx_feed(&r, s, n - 1), 0);
	int p[2];
	cr_assert_eq(pipe(p), 0);
	cr_assert_eq(mc_uframe_rx_push_fd(&r, p[1]), 0);
	cr_assert_eq(mc_uframe_rx_feed(&r, s + n - 1, 1), 0);
	const uint8_t *b;
	size_t len;
	int out[MC_UFRAME_MAX_FDS];
	unsigned closed;
	cr_assert_eq(mc_uframe_rx_next(&r, &b, &len), 1);
	cr_assert_eq(mc_uframe_rx_frame_fds(&r, 0, out, &closed), 0, "A announces none");
	cr_assert_eq(closed, 0, "kept for B, which starts in the same bytes");
	cr_assert_eq(mc_uframe_rx_next(&r, &b, &len), 1);
	cr_assert_eq(mc_uframe_rx_frame_fds(&r, 1, out, &closed), 0);
	cr_assert_eq(out[0], p[1]);
	close(out[0]);

	/* C announces none and brings two: refused, both closed at once. */
	n = put_frame(s, "c", 1);
	cr_assert_eq(mc_uframe_rx_feed(&r, s, n), 0);
	int q[2][2];
	for (int i = 0; i < 2; i++) {
		cr_assert_eq(pipe(q[i]), 0);
		cr_assert_eq(mc_uframe_rx_push_fd(&r, q[i][1]), 0);
	}
	cr_assert_eq(mc_uframe_rx_next(&r, &b, &len), 1);
	cr_assert_eq(mc_uframe_rx_frame_fds(&r, 0, out, &closed), -EBADF);
	cr_assert_eq(closed, 2);
	cr_assert_eq(mc_uframe_rx_queued_fds(&r), 0);
	char c;
	for (int i = 0; i < 2; i++) {
		cr_assert_eq(read(q[i][0], &c, 1), 0, "the agent's copy is closed: EOF");
		close(q[i][0]);
	}
	/* D announces two and brings one: refused, the one closed. */
	cr_assert_eq(mc_uframe_rx_feed(&r, s, n), 0);
	int d = dup(p[0]);
	cr_assert_eq(mc_uframe_rx_push_fd(&r, d), 0);
	cr_assert_eq(mc_uframe_rx_next(&r, &b, &len), 1);
	cr_assert_eq(mc_uframe_rx_frame_fds(&r, 2, out, &closed), MC_EPROTOCOL);
	cr_assert_eq(closed, 1);
	cr_assert(fcntl(d, F_GETFD) < 0, "closed");
	/* E announces one that never came (a later chunk's is not its). */
	cr_assert_eq(mc_uframe_rx_feed(&r, s, n), 0);
	cr_assert_eq(mc_uframe_rx_next(&r, &b, &len), 1);
	cr_assert_eq(mc_uframe_rx_feed(&r, s, n), 0);
	d = dup(p[0]);
	cr_assert_eq(mc_uframe_rx_push_fd(&r, d), 0);
	cr_assert_eq(mc_uframe_rx_frame_fds(&r, 1, out, &closed), MC_EPROTOCOL);
	cr_assert_eq(closed, 0, "the next frame's descriptor stays for it");
	cr_assert_eq(mc_uframe_rx_next(&r, &b, &len), 1);
	cr_assert_eq(mc_uframe_rx_frame_fds(&r, 1, out, &closed), 0);
	cr_assert_eq(out[0], d);
	close(d);
	close(p[0]);
	mc_uframe_rx_free(&r);
}

/* The same rules over a real socket, where the kernel decides which
 * recvmsg() brings the descriptors; nothing is left open. */
Test(uframe, frame_fds_over_a_socketpair)
{
	int sv[2];
	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	enum { N = 6 };
	/* announced, carried */
	const unsigned ann[N] = {0, 2, 0, 1, 0, 3};
	const unsigned car[N] = {0, 2, 3, 1, 1, 3};
	int rd[N][4], total = 0;
	for (int i = 0; i < N; i++) {
		int w[4];
		for (unsigned k = 0; k < car[i]; k++) {
			int p[2];
			cr_assert_eq(pipe(p), 0);
			rd[i][k] = p[0];
			w[k] = p[1];
			total++;
		}
		/* The announced count travels in the body, as nfds does. */
		uint8_t body[1] = {(uint8_t)ann[i]};
		cr_assert_eq(mc_uframe_send_all(sv[0], body, 1, w, car[i]), 0);
		for (unsigned k = 0; k < car[i]; k++)
			close(w[k]);
	}
	close(sv[0]);
	struct mc_uframe_rx r;
	cr_assert_eq(mc_uframe_rx_init(&r, 1024), 0);
	int got = 0, taken = 0, closed_all = 0;
	for (;;) {
		const uint8_t *b;
		size_t len;
		int rc = mc_uframe_rx_next(&r, &b, &len);
		if (rc == 0) {
			ssize_t k = mc_uframe_rx_read(&r, sv[1], 0);
			cr_assert_geq(k, 0);
			if (k == 0)
				break;
			continue;
		}
		int out[MC_UFRAME_MAX_FDS];
		unsigned closed;
		rc = mc_uframe_rx_frame_fds(&r, b[0], out, &closed);
		cr_assert_eq(rc == 0, ann[got] == car[got], "frame %d: %d", got, rc);
		if (rc == 0) {
			for (unsigned k = 0; k < ann[got]; k++) {
				cr_assert_eq(write(out[k], "x", 1), 1);
				close(out[k]);
			}
			taken += (int)ann[got];
		}
		closed_all += (int)closed;
		got++;
	}
	cr_assert_eq(got, N);
	cr_assert_eq(taken + closed_all, total, "every descriptor taken or closed");
	cr_assert_eq(mc_uframe_rx_queued_fds(&r), 0);
	for (int i = 0; i < N; i++)
		for (unsigned k = 0; k < car[i]; k++) {
			char c[2];
			ssize_t m = read(rd[i][k], c, 2);
			cr_assert_eq(m, ann[i] == car[i] ? 1 : 0, "frame %d fd %u", i, k);
			close(rd[i][k]);
		}
	mc_uframe_rx_free(&r);
	close(sv[1]);
}

/* Descriptors brought by the middle of a frame can belong to no frame:
 * closed as they arrive, so a frame sent slowly with descriptors on every
 * piece holds none of them. */
Test(uframe, descriptors_inside_a_frame_are_closed_on_arrival)
{
	int sv[2];
	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	uint8_t frame[4 + 64];
	mc_uframe_put_len(frame, 64);
	memset(frame + 4, 7, 64);
	int p[2];
	cr_assert_eq(pipe(p), 0);
	struct mc_uframe_rx r;
	cr_assert_eq(mc_uframe_rx_init(&r, 1024), 0);
	/* The header alone, then 16 pieces of the body with 4 each. */
	struct iovec v = {frame, 4};
	cr_assert_eq(mc_uframe_sendmsg(sv[0], &v, 1, NULL, 0, 0), 4);
	cr_assert_eq(mc_uframe_rx_read(&r, sv[1], 0), 4);
	int four[4] = {p[1], p[1], p[1], p[1]};
	for (int i = 0; i < 16; i++) {
		v = (struct iovec){frame + 4 + 4 * i, 4};
		cr_assert_eq(mc_uframe_sendmsg(sv[0], &v, 1, four, 4, 0), 4);
		cr_assert_eq(mc_uframe_rx_read(&r, sv[1], 0), 4);
		cr_assert_eq(mc_uframe_rx_queued_fds(&r), 0, "none held mid-frame");
	}
	cr_assert_eq(r.dropped, 64);
	const uint8_t *b;
	size_t len;
	int out[MC_UFRAME_MAX_FDS];
	unsigned closed;
	cr_assert_eq(mc_uframe_rx_next(&r, &b, &len), 1);
	cr_assert_eq(mc_uframe_rx_frame_fds(&r, 0, out, &closed), 0);
	close(p[1]);
	char c;
	cr_assert_eq(read(p[0], &c, 1), 0, "every copy closed: EOF");
	close(p[0]);
	mc_uframe_rx_free(&r);
	close(sv[0]);
	close(sv[1]);
}

/* rx_ready: whether rx_next has something to say without another read
 * (the agent serves buffered frames of a session it may read again). */
Test(uframe, ready_says_when_a_frame_is_buffered)
{
	struct mc_uframe_rx r;
	cr_assert_eq(mc_uframe_rx_init(&r, 64), 0);
	uint8_t s[16];
	size_t n = put_frame(s, "abc", 3);
	cr_assert_not(mc_uframe_rx_ready(&r), "empty");
	cr_assert_eq(mc_uframe_rx_feed(&r, s, 3), 0);
	cr_assert_not(mc_uframe_rx_ready(&r), "part of the header");
	cr_assert_eq(mc_uframe_rx_feed(&r, s + 3, n - 4), 0);
	cr_assert_not(mc_uframe_rx_ready(&r), "part of the body");
	cr_assert_eq(mc_uframe_rx_feed(&r, s + n - 1, 1), 0);
	cr_assert(mc_uframe_rx_ready(&r), "whole");
	const uint8_t *b;
	size_t len;
	cr_assert_eq(mc_uframe_rx_next(&r, &b, &len), 1);
	cr_assert_not(mc_uframe_rx_ready(&r), "taken");
	uint8_t bad[4];
	mc_uframe_put_len(bad, 65);
	cr_assert_eq(mc_uframe_rx_feed(&r, bad, 4), 0);
	cr_assert(mc_uframe_rx_ready(&r), "a length rx_next refuses");
	mc_uframe_rx_free(&r);
}

/* A frame that announced more than came and also brought some nobody
 * announced: missing wins (MC_EPROTOCOL: the stream cannot be trusted),
 * and every descriptor it brought is closed. */
Test(uframe, missing_descriptors_outrank_stray_ones)
{
	struct mc_uframe_rx r;
	cr_assert_eq(mc_uframe_rx_init(&r, 1024), 0);
	uint8_t s[16];
	size_t n = put_frame(s, "x", 1);
	cr_assert_eq(mc_uframe_rx_feed(&r, s, n), 0);
	int p[2];
	cr_assert_eq(pipe(p), 0);
	cr_assert_eq(mc_uframe_rx_push_fd(&r, p[1]), 0);
	const uint8_t *b;
	size_t len;
	int out[MC_UFRAME_MAX_FDS];
	unsigned closed;
	cr_assert_eq(mc_uframe_rx_next(&r, &b, &len), 1);
	cr_assert_eq(mc_uframe_rx_frame_fds(&r, 2, out, &closed), MC_EPROTOCOL);
	cr_assert_eq(closed, 1);
	char c;
	cr_assert_eq(read(p[0], &c, 1), 0, "closed: EOF");
	close(p[0]);
	mc_uframe_rx_free(&r);
}
