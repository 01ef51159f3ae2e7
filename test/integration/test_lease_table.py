"""The shared lease table (--client-lease-table): an agent publishes the
read leases it holds on objects in its own DRAM segment in a memfd its
clients map read-only, and libmooncake answers gets of those keys in the
client's process, and so are existence checks of them. Through the
Python package (libmooncake) and raw
frames on the agent's socket, with the master and two agents as separate
processes: gets, get_into and batch_get_into of leased local keys are
answered by the client with the right bytes and counted in the agent's
stats and metrics; a removal or a new value is seen at once by the next
get from any session; replicas on another agent are not in the table; a
client cannot write the table or the segment; and the table can be
turned off by the agent (--client-lease-table=0) or by a client
(MOONCAKE_LEASE_TABLE=0).
"""
import ctypes
import mmap
import os
import sys
import time

import storetest as st
from storetest import Cluster, metric
import mctest
from mctest import case, eq, run

import client_pb2 as C

OK = 0
NOT_FOUND = -704

TABLE = "mooncake_agent_client_table_gets_total"
GETS = "mooncake_agent_gets_total"


def table_gets(a):
    return metric(a.metrics(), TABLE)


def agent_stats(a):
    out = run([mctest.MOONCAKECTL, "stats", "--agent", "--socket=" + a.socket]).stdout
    return dict(l.split(" ", 1) for l in out.splitlines() if " " in l)


@case
def local_gets_are_answered_by_the_client():
    cl = Cluster(agents=2)
    a, b = cl.agents
    s = a.store()
    value = os.urandom(4096)
    eq(s.put("hot", value), OK, "put")
    eq(s.get("hot"), value, "first get (asks the master, takes the lease)")
    t0, g0 = table_gets(a), metric(a.metrics(), GETS)
    n = 0
    end = time.monotonic() + 0.5
    while time.monotonic() < end:
        eq(s.get("hot"), value, "get")
        n += 1
    buf = ctypes.create_string_buffer(8192)
    ptr = ctypes.addressof(buf)
    eq(s.get_into("hot", ptr, 8192), 4096, "get_into")
    eq(buf.raw[:4096], value, "get_into's bytes")
    eq(s.batch_get_into(["hot", "hot"], [ptr, ptr + 4096], [4096, 4096]), [4096, 4096],
       "batch_get_into")
    eq(buf.raw, value + value, "batch_get_into's bytes")
    n += 3
    # Each get counted once: by the agent or (most of them) by the client.
    t1, g1 = table_gets(a), metric(a.metrics(), GETS)
    eq(g1 - g0, n, "every get counted")
    assert t1 - t0 >= n // 2, "gets answered from the table: %d of %d" % (t1 - t0, n)
    st_a = agent_stats(a)
    eq(int(st_a["client_table_gets"]), int(t1), "stats --agent says the same")
    # Existence of a leased key is answered by the client too: no exist
    # request reaches the agent.
    exist_ok = 'mooncake_agent_requests_total{op="exist",result="ok"}'
    e0 = st.metric_labels(a.metrics(), "mooncake_agent_requests_total",
                          'op="exist",result="ok"')
    eq(s.is_exist("hot"), 1, "is_exist")
    eq(s.batch_is_exist(["hot", "hot"]), [1, 1], "batch_is_exist")
    eq(s.is_exist("cold"), 0, "a key nobody put (asks the agent)")
    e1 = st.metric_labels(a.metrics(), "mooncake_agent_requests_total",
                          'op="exist",result="ok"')
    eq(e1 - e0, 1, "exist requests the agent saw (%s)" % exist_ok)
    # A value larger than the buffer: the agent's answer (-ENOBUFS), not a cut copy.
    eq(s.get_into("hot", ptr, 100), -600, "too small a buffer: INVALID_PARAMS")
    # The same key read through the other agent: a remote replica, not in its table.
    sb = b.store()
    tb = table_gets(b)
    for _ in range(20):
        eq(sb.get("hot"), value, "get through the other agent")
    eq(table_gets(b), tb, "remote replicas are not in the other agent's table")
    s.close()
    sb.close()


@case
def removals_and_new_values_are_seen_at_once():
    cl = Cluster(agents=1)
    a = cl.agents[0]
    s, other = a.store(), a.store(verify_gets=False)
    t0 = table_gets(a)
    for i in range(20):
        key = "k%d" % i
        eq(s.put(key, b"one" * (i + 1)), OK, "put")
        eq(s.get(key), b"one" * (i + 1), "get")
        eq(other.get(key), b"one" * (i + 1), "get, other session")
        eq(other.get(key), b"one" * (i + 1), "get from the table")
        eq(other.is_exist(key), 1, "exists")
        eq(s.remove(key, force=True), OK, "remove")
        eq(other.is_exist(key), 0, "no longer exists for the other session")
        eq(other.get(key), b"", "gone for the other session at once")
        eq(s.get(key), b"", "gone at once")
        eq(s.put(key, b"two"), OK, "put again")
        eq(other.get(key), b"two", "the new value at once")
    assert table_gets(a) > t0, "some gets were answered from the table"
    s.close()
    other.close()


def reopened_for_writing(fd, uid):
    """Whether /proc/self/fd/<fd> opens for writing and maps writable, in
    a child running as uid (None: as this process)."""
    pid = os.fork()
    if pid == 0:
        try:
            if uid is not None:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
            fd2 = os.open("/proc/self/fd/%d" % fd, os.O_RDWR)
            mmap.mmap(fd2, os.fstat(fd2).st_size, flags=mmap.MAP_SHARED,
                      prot=mmap.PROT_READ | mmap.PROT_WRITE)
            os._exit(1)
        except BaseException:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 1


@case
def the_table_of_a_dead_agent_is_not_read():
    """Once its session broke (the agent killed), a client asks no table
    nobody keeps up to date any more: its gets fail like any request."""
    cl = Cluster(agents=1, master_args=["--default-kv-lease-ttl=60s"])
    a = cl.agents[0]
    s = a.store()
    eq(s.put("hot", b"v" * 64), OK, "put")
    eq(s.get("hot"), b"v" * 64, "get (takes the lease)")
    t0 = table_gets(a)
    eq(s.get("hot"), b"v" * 64, "get from the table")
    eq(table_gets(a) - t0, 1, "answered from the table")
    a.d.kill()
    assert s.put("other", b"x") < 0, "a request to a dead agent fails"
    eq(s.get("hot"), b"", "no value from the dead agent's table")
    assert s.is_exist("hot") < 0, "nor its existence"


@case
def clients_cannot_write_the_table_or_the_segment():
    cl = Cluster(agents=1)
    a = cl.agents[0]
    s = a.store()
    eq(s.put("secret", b"x" * 100), OK, "put")
    eq(s.get("secret"), b"x" * 100, "get")
    sock = st.raw_connect(a.socket)
    r = C.Request(id=1)
    r.hello.version = 1
    r.hello.lease_table = True
    st.send(sock, r)
    resp, fds = st.recv_response(sock)
    eq(resp.error, 0, "hello")
    eq(len(fds), 3, "staging, table, segment")
    assert resp.hello.lease_table_size > 0 and resp.hello.counters_offset >= \
        resp.hello.staging_size, resp.hello
    _, table, seg = fds
    for fd, what in ((table, "table"), (seg, "segment")):
        size = os.fstat(fd).st_size
        try:
            mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
            raise AssertionError("the %s mapped writable" % what)
        except (PermissionError, OSError):
            pass
        try:
            os.write(fd, b"x")
            raise AssertionError("the %s written" % what)
        except OSError:
            pass
        try:
            os.ftruncate(fd, 0)
            raise AssertionError("the %s truncated" % what)
        except OSError:
            pass
        # Nor through a reopening of the same file, by another user (root
        # passes over file modes; the table's seal holds even then).
        eq(reopened_for_writing(fd, 65534 if os.geteuid() == 0 else None), False,
           "the %s reopened for writing" % what)
    m = mmap.mmap(table, resp.hello.lease_table_size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    eq(m[:8], b"10batlcm", "the table's magic")
    m.close()
    for fd in fds:
        os.close(fd)
    sock.close()
    # A client that does not ask gets the staging memfd alone.
    sock = st.raw_connect(a.socket)
    r = C.Request(id=1)
    r.hello.version = 1
    st.send(sock, r)
    resp, fds = st.recv_response(sock)
    eq((resp.error, len(fds), resp.hello.lease_table_size), (0, 1, 0), "no table asked for")
    for fd in fds:
        os.close(fd)
    sock.close()
    eq(s.get("secret"), b"x" * 100, "the agent still serves")
    s.close()


PYDIR = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                     "../../python"))


def hot_gets(a, key, env=None):
    """Put key and read it 50 times from a child process (libmooncake):
    how many of those gets the client answered from the table."""
    sess = a.store()
    eq(sess.put(key, b"v" * 64), OK, "put")
    sess.close()
    t0 = table_gets(a)
    script = (
        "import sys\n"
        "sys.path.insert(0, %r)\n"
        "from mooncake.store import MooncakeDistributedStore\n"
        "s = MooncakeDistributedStore()\n"
        "assert s.setup('localhost', 'P2PHANDSHAKE', 1 << 24, 1 << 24, 'tcp', '', 'x',"
        " socket_path=%r) == 0\n"
        "for _ in range(50):\n"
        "    assert s.get(%r) == b'v' * 64\n"
        "s.close()\n" % (PYDIR, a.socket, key))
    run([sys.executable, "-c", script], env=dict(os.environ, **(env or {})))
    return table_gets(a) - t0


@case
def the_table_can_be_turned_off():
    cl = Cluster(agents=1, agent_args=["--client-lease-table=0"])
    eq(hot_gets(cl.agents[0], "a"), 0, "no table: every get asks the agent")
    cl = Cluster(agents=1)
    eq(hot_gets(cl.agents[0], "b", {"MOONCAKE_LEASE_TABLE": "0"}), 0, "a client that wants none")
    assert hot_gets(cl.agents[0], "c") > 0, "by default the client uses it"


if __name__ == "__main__":
    mctest.main()
