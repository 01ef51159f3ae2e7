"""What a client of the agent's socket may hold, tried as a misbehaving
client would (issue 17), through the real binaries and raw frames:

- a reader that never reads its replies: the agent stops reading its
  requests once its unread replies pass --client-reply-buffer-size (the
  agent's memory stays put, other clients are served), and the slow
  client gets every reply, in order, once it reads;
- descriptors: a frame that brings descriptors it does not announce is
  refused (-EBADF) and they are closed at once, more than a frame may
  carry closes the session, and unread replies that carry descriptors
  pause the session at --client-max-fds: the agent's descriptor count
  stays bounded under a flood;
- sessions past --client-max-sessions-per-uid and --client-max-sessions
  (a second uid made with setuid when root) are refused with -EUSERS;
  buffers, views and allocated memory past their keys are refused;
- a request that would take more than 64 MiB decoded (a frame of empty
  items) closes its session, the agent's memory untouched;
- every refusal and pause is counted in /metrics;
- SIGTERM drains the client socket: a 100 MB get in flight completes,
  new requests are refused with MC_ESHUTDOWN, new sessions cannot
  connect; past --shutdown-timeout the agent stops anyway.
"""
import fcntl
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import storetest as st
from storetest import Cluster, MiB, metric, metric_labels
import mctest
from mctest import case, eq, run, wait_for

import client_pb2 as C

OK = 0
EBADF = -9
ENOSPC = -28
EUSERS = -87
ESHUTDOWN = -808


def nfds(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def refused(a, reason):
    return metric_labels(a.metrics(), "mooncake_agent_client_refused_total",
                         'reason="%s"' % reason)


def get_request(rid, keys, spill=True):
    r = C.Request(id=rid)
    for k in keys:
        r.get.items.add().key = k
    if spill:
        r.get.spill.where = C.Region.STAGING
        r.get.spill.length = 1 << 20
    return r


def exist_request(rid, nfds=0):
    r = C.Request(id=rid, nfds=nfds)
    r.exist.keys.append(b"k")
    return r


class Sender(threading.Thread):
    """Writes data to a socket as fast as the agent reads it, and counts
    what went."""

    def __init__(self, sock, data):
        super().__init__(daemon=True)
        self.sock, self.data, self.sent = sock, memoryview(data), 0

    def run(self):
        while self.sent < len(self.data):
            try:
                self.sent += self.sock.send(self.data[self.sent:self.sent + 65536])
            except socket.timeout:
                continue
            except OSError:
                return  # the session or the test ended

    def stalled(self, quiet=1.0, timeout=60):
        """Wait until nothing has gone for quiet seconds, or all went."""
        deadline = time.monotonic() + timeout
        last, since = -1, time.monotonic()
        while time.monotonic() < deadline and self.sent < len(self.data):
            if self.sent != last:
                last, since = self.sent, time.monotonic()
            elif time.monotonic() - since >= quiet:
                return self.sent
            time.sleep(0.05)
        return self.sent


def closed(sock):
    sock.settimeout(5)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def varint(v):
    out = b""
    while True:
        b, v = v & 0x7F, v >> 7
        if not v:
            return out + bytes([b])
        out += bytes([b | 0x80])


@case
def requests_that_would_take_too_much_memory_decoded_close_the_session():
    """A 16 MiB frame of empty items ("0a 00") would decode into 8M
    structs, some 0.5 GB: the agent bounds a request at 64 MiB decoded and
    closes the session, for a put (its own decoder) and a get (protobuf-c);
    a request of 65,536 real items still decodes (and is served)."""
    cl = Cluster(agents=1)
    a = cl.agents[0]
    other = a.store()
    eq(other.put("k", b"12345678"), OK, "put")
    rss0 = mctest.proc_mib(a.d.pid)
    for name, field in (("put", 11), ("get", 12)):
        s = st.raw_connect(a.socket)
        st.hello(s)
        body = b"\x0a\x00" * ((16 * MiB - 64) // 2)
        req = bytes([1 << 3]) + varint(7) + bytes([field << 3 | 2]) + varint(len(body)) + body
        s.sendall(struct.pack("<I", len(req)) + req)
        assert closed(s), "the %s session is closed" % name
        s.close()
    wait_for(lambda: "would take more than 64 MiB decoded" in a.d.output(),
             what="the log line")
    if not mctest.sanitized():
        grew = mctest.proc_mib(a.d.pid) - rss0
        assert grew < 200, "the agent grew %.0f MiB" % grew
    # The most items a request may have, with keys: decoded, answered.
    keys = ["k"] * 65536
    eq(other.batch_is_exist(keys), [1] * 65536, "65,536 keys in one request")
    eq(other.get("k"), b"12345678", "the agent serves on")


@case
def a_client_that_never_reads_is_paused_not_closed():
    cap = 1 * MiB
    cl = Cluster(agents=1, agent_args=["--client-reply-buffer-size=%d" % cap])
    a = cl.agents[0]
    other = a.store()
    eq(other.put("k", b"12345678"), OK, "put")
    s = st.raw_connect(a.socket)
    st.hello(s)
    n, items = 20000, 64
    frames = [st.frame(get_request(i + 2, [b"k"] * items)) for i in range(n)]
    rss0 = mctest.proc_mib(a.d.pid)
    s.settimeout(0.2)
    snd = Sender(s, b"".join(frames))
    snd.start()
    wait_for(lambda: metric_labels(a.metrics(), "mooncake_agent_client_pauses_total",
                                   'reason="replies"') >= 1,
             timeout=120, what="the session paused")
    sent = snd.stalled()
    total = len(snd.data)
    # Each reply is larger than its request: the agent read at most its
    # budget's worth of replies, then stopped reading.
    assert sent < total // 2, "the agent read %d of %d request bytes unanswered" % (sent, total)
    held = metric(a.metrics(), "mooncake_agent_client_reply_bytes")
    assert cap / 2 <= held <= 2 * cap, "reply bytes held: %d (budget %d)" % (held, cap)
    grew = mctest.proc_mib(a.d.pid) - rss0
    if mctest.sanitized():
        print("     RSS not checked: a sanitizer build (grew %.1f MiB)" % grew)
    else:
        assert grew < 16, "agent RSS grew %.1f MiB" % grew
    # Everyone else is served meanwhile.
    eq(other.get("k"), b"12345678", "another client's get")
    eq(other.put("k2", b"x" * 1000), OK, "another client's put")
    # The slow client reads at last: every reply, complete (in the order
    # the gets ended: one that waited for the master may end later).
    s.settimeout(30)
    ids = set()
    for i in range(n):
        resp, fds = st.recv_response(s)
        assert resp is not None, "session closed after %d replies" % i
        eq((resp.error, len(resp.get.results), fds), (OK, items, []), "reply %d" % resp.id)
        ids.add(resp.id)
        if i % 997 == 0:
            eq({(x.error, x.size) for x in resp.get.results}, {(OK, 8)}, "results %d" % i)
    eq(ids, set(range(2, n + 2)), "a reply to every request")
    snd.join(30)
    eq(snd.sent, total, "every request went")
    st.send(s, exist_request(n + 2))
    resp, _ = st.recv_response(s)
    eq((resp.id, list(resp.keys.results)), (n + 2, [1]), "the session goes on")
    wait_for(lambda: metric(a.metrics(), "mooncake_agent_client_reply_bytes") == 0,
             what="budgets given back")
    assert "session closed" not in a.d.output(), a.d.output()[-2000:]
    s.close()
    other.close()


@case
def descriptors_nobody_announced_are_closed_and_refused():
    cl = Cluster(agents=1)
    a = cl.agents[0]
    other = a.store()
    eq(other.put("k", b"v"), OK, "put")
    s = st.raw_connect(a.socket)
    st.hello(s)
    base = nfds(a.d.pid)
    devnull = os.open("/dev/null", os.O_RDONLY)
    # A flood: 500 frames, each bringing 16 descriptors it does not
    # announce. Each is refused, its descriptors closed at once.
    n = 500
    peak = 0
    for i in range(n):
        st.send(s, exist_request(100 + i), [devnull] * 16)
        if i % 50 == 49:
            peak = max(peak, nfds(a.d.pid))
    for i in range(n):
        resp, fds = st.recv_response(s)
        eq((resp.id, resp.error, fds), (100 + i, EBADF, []), "frame %d refused" % i)
        if i == 0:
            assert "did not announce" in resp.message, resp.message
    peak = max(peak, nfds(a.d.pid))
    assert peak <= base + 64, "the agent held %d descriptors (%d before)" % (peak, base)
    # One announced, three brought: refused too, all three closed.
    st.send(s, exist_request(900, nfds=1), [devnull] * 3)
    resp, _ = st.recv_response(s)
    eq((resp.id, resp.error), (900, EBADF), "more brought than announced")
    # As many as announced: served.
    st.send(s, exist_request(901, nfds=2), [devnull] * 2)
    resp, _ = st.recv_response(s)
    eq((resp.id, resp.error, list(resp.keys.results)), (901, OK, [1]), "announced ones")
    wait_for(lambda: nfds(a.d.pid) <= base, what="descriptors back to %d" % base)
    m = a.metrics()
    eq(metric_labels(m, "mooncake_agent_client_refused_total", 'reason="descriptors"'),
       float(n + 1), "refusals counted")
    eq(metric(m, "mooncake_agent_client_descriptors_closed_total"), float(16 * n + 3),
       "descriptors closed")
    # More than a frame may carry (16) in one message: the kernel cuts
    # them short, the session closes, nothing stays open.
    s2 = st.raw_connect(a.socket)
    st.hello(s2)
    s2.sendmsg([st.frame(exist_request(5))],
               [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("64i", *[devnull] * 64))])
    eq(closed(s2), True, "closed")
    wait_for(lambda: nfds(a.d.pid) <= base, what="descriptors back to %d" % base)
    assert "more descriptors than a frame may carry" in a.d.output()
    os.close(devnull)
    # The first session goes on.
    st.send(s, exist_request(902))
    resp, _ = st.recv_response(s)
    eq((resp.id, list(resp.keys.results)), (902, [1]), "the session goes on")
    s.close()
    other.close()


@case
def unread_replies_with_descriptors_pause_the_session():
    limit = 64
    cl = Cluster(agents=1, agent_args=["--client-max-fds=%d" % limit])
    a = cl.agents[0]
    other = a.store()
    eq(other.put("k", b"12345678"), OK, "put")
    s = st.raw_connect(a.socket)
    st.hello(s)
    base = nfds(a.d.pid)
    # Gets without a spill region: each reply carries a new memfd. The
    # socket takes a few thousand of them; the rest would wait in the
    # agent.
    n = 12000
    s.settimeout(0.2)
    snd = Sender(s, b"".join(st.frame(get_request(i + 2, [b"k"], spill=False))
                             for i in range(n)))
    snd.start()
    wait_for(lambda: metric_labels(a.metrics(), "mooncake_agent_client_pauses_total",
                                   'reason="descriptors"') >= 1,
             timeout=120, what="the session paused")
    snd.stalled()
    held = nfds(a.d.pid) - base
    assert held <= limit + 64, "the agent holds %d descriptors for the session" % held
    assert metric(a.metrics(), "mooncake_agent_client_descriptors") <= limit + 64
    eq(other.get("k"), b"12345678", "another client is served")
    s.settimeout(30)
    ids = set()
    for i in range(n):
        resp, fds = st.recv_response(s)
        assert resp is not None, "session closed after %d replies" % i
        eq((resp.error, len(fds)), (OK, 1), "reply %d" % resp.id)
        res = resp.get.results[0]
        eq((res.where, res.size), (C.GetResult.SPILL, 8), "reply %d" % resp.id)
        if i % 500 == 0:
            eq(os.pread(fds[0], 8, res.offset), b"12345678", "the value, reply %d" % resp.id)
        os.close(fds[0])
        ids.add(resp.id)
    eq(ids, set(range(2, n + 2)), "a reply to every request")
    snd.join(30)
    wait_for(lambda: nfds(a.d.pid) <= base, what="descriptors back to %d" % base)
    s.close()
    other.close()


NOBODY_SESSIONS = r"""
import sys
import storetest as st, client_pb2 as C
out, keep = [], []
for i in range(int(sys.argv[2])):
    s = st.raw_connect(sys.argv[1])
    r = C.Request(id=1)
    r.hello.version = 1
    try:
        st.send(s, r)
    except OSError:
        pass  # refused and closed first: the refusal is still to be read
    resp, fds = st.recv_response(s)
    out.append((resp.id, resp.error, resp.message) if resp else None)
    keep.append(s)
print(repr(out))
sys.stdout.flush()
sys.stdin.read()
"""


@case
def sessions_past_their_limits_are_refused():
    cl = Cluster(agents=1, agent_args=["--client-max-sessions=5",
                                       "--client-max-sessions-per-uid=3"])
    a = cl.agents[0]
    mine = []
    for _ in range(3):
        s = st.raw_connect(a.socket)
        st.hello(s)
        mine.append(s)
    s = st.raw_connect(a.socket)
    r = C.Request(id=1)
    r.hello.version = 1
    try:
        st.send(s, r)
    except OSError:
        pass  # closed first
    resp, _ = st.recv_response(s)
    eq((resp.id, resp.error), (0, EUSERS), "a fourth session of one uid")
    assert "--client-max-sessions-per-uid" in resp.message, resp.message
    eq(closed(s), True, "then closed")
    # Through libmooncake: the refusal is the error the caller sees.
    r = a.ctl("get", "k", check=False)
    eq(r.returncode, 1, "mooncakectl refused")
    assert "Too many users" in r.stderr or "EUSERS" in r.stderr, r.stderr
    eq(refused(a, "sessions_per_uid"), 2.0, "counted")
    assert "has 3 client sessions open" in a.d.output()
    if os.geteuid() == 0:
        # Another uid has a share of its own, up to the total (5).
        os.chmod(a.tmp.name, 0o755)
        os.chmod(a.socket, 0o666)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), LD_PRELOAD="")
        child = subprocess.Popen(
            mctest.as_uid([sys.executable, "-c", NOBODY_SESSIONS, a.socket, "3"], 65534, 65534),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=env)
        line = child.stdout.readline()
        assert line, "the second uid's client: " + child.stderr.read()
        got = eval(line)
        eq([g[:2] for g in got[:2]], [(1, OK), (1, OK)], "two sessions of uid 65534")
        eq(got[2][:2], (0, EUSERS), "a sixth session in all")
        assert "--client-max-sessions)" in got[2][2], got[2]
        eq(refused(a, "sessions"), 1.0, "counted")
        child.stdin.close()
        eq(child.wait(30), 0, child.stderr.read())
    else:
        print("     second uid skipped: setuid needs root")
    # A closed session makes room again.
    mine.pop().close()
    wait_for(lambda: metric(a.metrics(), "mooncake_agent_clients") == 2.0,
             what="the session gone")
    s = st.raw_connect(a.socket)
    st.hello(s)
    for s in mine + [s]:
        s.close()


@case
def buffers_views_and_allocated_memory_are_bounded():
    cl = Cluster(agents=1, agent_args=["--client-max-views=2", "--client-max-buffers=2",
                                       "--client-alloc-size=1M"])
    a = cl.agents[0]
    other = a.store()
    for k in ("v1", "v2", "v3"):
        eq(other.put(k, b"x" * 100), OK, "put " + k)
    s = st.raw_connect(a.socket)
    st.hello(s)
    r = C.Request(id=2)
    for k in (b"v1", b"v2", b"v3"):
        it = r.get.items.add()
        it.key = k
        it.zero_copy = True
    st.send(s, r)
    resp, fds = st.recv_response(s)
    for fd in fds:
        os.close(fd)
    res = resp.get.results
    eq([x.where for x in res[:2]], [C.GetResult.MAPPED] * 2, "two views")
    eq(res[2].error, ENOSPC, "a third view of the session")
    rel = C.Request(id=3)
    rel.release.views.append(res[0].view)
    st.send(s, rel)
    resp, _ = st.recv_response(s)
    eq(resp.error, OK, "released")
    r.id = 4
    del r.get.items[:2]
    st.send(s, r)
    resp, fds = st.recv_response(s)
    eq(resp.get.results[0].where, C.GetResult.MAPPED, "room for a view again")

    def alloc(rid, length):
        q = C.Request(id=rid)
        q.alloc_buffer.length = length
        st.send(s, q)
        resp, fds = st.recv_response(s)
        for fd in fds:
            os.close(fd)
        return resp

    first = alloc(5, 512 * 1024)
    eq(first.error, OK, "512K allocated")
    eq(metric(a.metrics(), "mooncake_agent_alloc_bytes"), 512.0 * 1024, "counted")
    eq(alloc(6, 600 * 1024).error, ENOSPC, "600K more would pass 1M")
    mfd = os.memfd_create("b", os.MFD_ALLOW_SEALING)
    os.ftruncate(mfd, 4096)
    fcntl.fcntl(mfd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
    reg = C.Request(id=7, nfds=1)
    reg.register_buffer.length = 4096
    st.send(s, reg, [mfd])
    resp, _ = st.recv_response(s)
    eq(resp.error, OK, "a second buffer")
    reg.id = 8
    st.send(s, reg, [mfd])
    resp, _ = st.recv_response(s)
    eq(resp.error, ENOSPC, "a third buffer")
    assert "--client-max-buffers" in resp.message, resp.message
    un = C.Request(id=9)
    un.unregister_buffer.buffer = first.buffer.buffer
    st.send(s, un)
    resp, _ = st.recv_response(s)
    eq(resp.error, OK, "freed")
    eq(metric(a.metrics(), "mooncake_agent_alloc_bytes"), 0.0, "given back")
    eq(alloc(10, 600 * 1024).error, OK, "600K fits now")
    for reason, n in (("views", 1), ("buffers", 1), ("alloc", 1)):
        eq(refused(a, reason), float(n), reason + " refusals counted")
    os.close(mfd)
    s.close()
    wait_for(lambda: metric(a.metrics(), "mooncake_agent_alloc_bytes") == 0.0,
             what="the closed session's buffers given back")
    other.close()


def big_get_in_flight(cl, a, size, sessions):
    """Store size bytes under "big", then with the master stopped start a
    mooncakectl get of it: it waits in the agent for the master's answer.
    Returns (the get's process, the value's file, the output file)."""
    src = os.path.join(a.tmp.name, "big")
    with open(src, "wb") as f:
        f.write(os.urandom(size))
    a.ctl("put", "big", src)
    out = os.path.join(a.tmp.name, "out")
    cl.master.signal(signal.SIGSTOP)
    get = subprocess.Popen([mctest.MOONCAKECTL, "get", "big", out, "--verify",
                            "--socket=" + a.socket], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    wait_for(lambda: metric(a.metrics(), "mooncake_agent_clients") >= sessions,
             what="the get's session")
    time.sleep(0.3)  # its request sent: the agent asks the stopped master
    return get, src, out


@case
def sigterm_drains_the_client_socket():
    cl = Cluster(agents=1, segment=256 * MiB, agent_args=["--shutdown-timeout=20s"])
    a = cl.agents[0]
    idle = st.raw_connect(a.socket)  # a session that asks during the drain
    st.hello(idle)
    get, src, out = big_get_in_flight(cl, a, 100 * MiB, 2)
    try:
        a.d.signal(signal.SIGTERM)
        wait_for(lambda: "draining client requests" in a.d.output(), what="drain begun")
        wait_for(lambda: not os.path.exists(a.socket), what="the socket file gone")
        eq(a.d.proc.poll(), None, "the agent waits for the get")
        st.send(idle, exist_request(7))
        resp, _ = st.recv_response(idle)
        eq((resp.id, resp.error), (7, ESHUTDOWN), "a new request while draining")
        assert "shutting down" in resp.message, resp.message
        eq(refused(a, "shutdown"), 1.0, "counted")
        time.sleep(0.5)
        eq(get.poll(), None, "the get still waits")
    finally:
        cl.master.signal(signal.SIGCONT)
    eq(get.wait(60), 0, "the get in flight completed: " + get.stderr.read())
    with open(src, "rb") as f1, open(out, "rb") as f2:
        eq(f1.read() == f2.read(), True, "its bytes")
    idle.close()
    eq(a.d.proc.wait(30), 0, "the agent's exit status")
    assert "client requests drained" in a.d.output(), a.d.output()[-3000:]


@case
def a_drain_ends_at_the_shutdown_timeout():
    cl = Cluster(agents=1, segment=256 * MiB, agent_args=["--shutdown-timeout=1s"])
    a = cl.agents[0]
    get, _, _ = big_get_in_flight(cl, a, 8 * MiB, 1)
    try:
        t0 = time.monotonic()
        a.d.signal(signal.SIGTERM)
        eq(get.wait(30) != 0, True, "the get was cut short")
        took = time.monotonic() - t0
        assert took >= 0.9, "cut short after %.1fs, before the timeout" % took
        eq(a.d.proc.wait(30), 0, "the agent's exit status")
    finally:
        cl.master.signal(signal.SIGCONT)
    assert "did not drain within the shutdown timeout" in a.d.output(), a.d.output()[-3000:]


mctest.main()
