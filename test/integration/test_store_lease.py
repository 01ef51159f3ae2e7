"""Put leases (--put-lease-size): a put whose one replica is the writer's
own segment is written into space the master leased to the agent and
sealed with one master call (BatchCommit). Through the Python package and
mooncakectl, with a master and agents as separate processes: such puts
are read on other agents with the right bytes and counted in stats and
metrics; a put of an existing key is refused and its space goes back;
puts with more replicas or larger than a quarter of the lease take
PutStart/PutEnd; single puts onto another agent's segment use a remote
lease there, which goes back when its time is over; an agent killed with SIGKILL, or expired
while stopped, loses its lease without harming what it committed; a
client killed mid-put leaks nothing; an idle lease goes back; and
--put-lease-size=0 turns it all off. After each step the master's books must balance: used bytes are the
leased bytes plus the objects' space, and the leased bytes are the
agents' unused leases.
"""
import os
import signal
import subprocess
import sys
import time

import storetest as st
from storetest import Cluster, MiB, metric
import mctest
from mctest import case, eq, run, wait_for

import grpc
import master_pb2 as M

OK = 0

COMMITS = "mooncake_agent_put_commits_total"
LEASE = "mooncake_agent_put_lease_bytes"
RLEASE = "mooncake_agent_remote_lease_bytes"


def replica_segments(cl, key):
    with mctest.token_channel(cl.master_addr) as ch:
        f = ch.unary_unary("/mooncake.master.Master/GetReplicas",
                           request_serializer=M.GetReplicasRequest.SerializeToString,
                           response_deserializer=M.GetReplicasResponse.FromString)
        return sorted(r.segment for r in f(M.GetReplicasRequest(key=key), timeout=10).replicas)


def objects_bytes(cl):
    """The space the master's objects take (mooncakectl ls --long)."""
    out = run([mctest.MOONCAKECTL, "ls", "--long", "--master=" + cl.master_addr]).stdout
    total = 0
    for line in out.splitlines():
        parts = line.split("\t")
        total += (int(parts[1]) + 63) // 64 * 64 * int(parts[2])
    return total


def balanced(cl, agents):
    s = cl.stats()
    room = sum(metric(a.metrics(), LEASE) + metric(a.metrics(), RLEASE) for a in agents)
    objs = objects_bytes(cl)
    ok = s["used_bytes"] == s["leased_bytes"] + objs and s["leased_bytes"] == room
    balanced.last = (s["used_bytes"], s["leased_bytes"], objs, room)
    return ok


def wait_balanced(cl, agents, what):
    wait_for(lambda: balanced(cl, agents), timeout=15,
             what="%s: used == leased + objects, leased == the agents' lease "
                  "(used, leased, objects, lease) = %s" % (what, getattr(balanced, "last", None)))


def commits(agent):
    return metric(agent.metrics(), COMMITS)


def wait_lease(agent):
    wait_for(lambda: metric(agent.metrics(), LEASE) > 0, what="the agent holds a put lease")


@case
def leased_puts_are_read_everywhere_and_accounted():
    cl = Cluster(agents=2)
    a, b = cl.agents
    sa, sb = a.store(), b.store()
    eq(sa.put("warm", b"w"), OK, "the first put asks for a lease")
    wait_lease(a)
    c0 = commits(a)
    vals = {}
    for n in (0, 1, 63, 64, 65, 4096, 65536, 65537):
        vals["size/%d" % n] = os.urandom(n)
    for i in range(200):
        vals["k/%d" % i] = os.urandom(4096)
    for k, v in vals.items():
        eq(sa.put(k, v), OK, "put %s on A" % k)
    eq(commits(a) - c0, len(vals), "every put sealed with one commit")
    bad = [k for k, v in vals.items() if sb.get(k) != v]
    eq(bad, [], "objects read wrong on B")
    eq(replica_segments(cl, b"k/7"), [a.name], "one replica, in A's segment")
    s = cl.stats()
    assert s["commits"] >= len(vals) and s["leased_bytes"] > 0, s
    m = cl.master_metrics()
    assert metric(m, "mooncake_master_commits_total") >= len(vals), m
    assert metric(m, "mooncake_master_leased_bytes") == s["leased_bytes"], m
    out = run([mctest.MOONCAKECTL, "stats", "--master=" + cl.master_addr]).stdout
    assert "leased" in out.splitlines()[-3], out  # the segment table's header
    wait_balanced(cl, cl.agents, "after the puts")

    # An existing key: refused at the commit, the space goes back.
    refusals = s["commit_refusals"]
    eq(sa.put("k/0", b"other bytes"), OK, "a put of an existing key (0, as in Mooncake)")
    eq(sb.get("k/0"), vals["k/0"], "the object is untouched")
    eq(cl.stats()["commit_refusals"], refusals + 1, "refused by the commit")
    wait_balanced(cl, cl.agents, "after a refused commit")
    eq(sa.upsert("new", b"new"), OK, "upsert of a new key")
    eq(sa.upsert("new", b"replaced"), OK, "upsert replaces it")
    eq(sb.get("new"), b"replaced", "read on B")

    # Not through the lease: two replicas, the first put onto another
    # segment (it asks for a remote lease there), a big value.
    from mooncake.store import ReplicateConfig
    c1 = commits(a)
    eq(sa.put("two", b"2" * 1000, ReplicateConfig(replica_num=2)), OK, "replica_num=2")
    eq(replica_segments(cl, b"two"), sorted([a.name, b.name]), "on both segments")
    eq(sa.put("onb", b"b" * 1000, ReplicateConfig(preferred_segment=b.name)), OK, "onto B")
    eq(replica_segments(cl, b"onb"), [b.name], "written into B's segment")
    # The lease is an eighth of the 64 MiB segment (below --put-lease-size).
    quarter = os.urandom(2 * MiB)
    eq(sa.put("quarter", quarter), OK, "a quarter of the lease")
    eq(commits(a), c1 + 1, "committed")
    c1 += 1
    big = os.urandom(2 * MiB + 1)
    eq(sa.put("big", big), OK, "a value above a quarter of the lease")
    eq(commits(a), c1, "none of them committed")
    eq(sb.get("quarter") == quarter, True, "quarter read on B")
    eq(sb.get("big") == big, True, "big read on B")
    eq(sb.get("two"), b"2" * 1000, "two read on B")
    wait_balanced(cl, cl.agents, "after PutStart puts")

    eq(sb.remove_all(force=True) > 0, True, "remove_all")
    wait_balanced(cl, cl.agents, "after remove_all")
    eq(objects_bytes(cl), 0, "nothing left")
    sa.close()
    sb.close()


@case
def puts_onto_another_segment_use_a_remote_lease():
    """Single puts from A onto B's segment are written into space of B the
    master leased to A and sealed with one commit each (no PutStart after
    the first); B's mirror learns of them, B and A read them; what A did
    not use goes back when the lease's time (--put-timeout) is over; a
    batch onto B, and --put-lease-size=0, take PutStart."""
    from mooncake.store import ReplicateConfig
    cl = Cluster(agents=2, master_args=["--put-timeout=3s"])
    a, b = cl.agents
    sa, sb = a.store(), b.store()
    onto_b = ReplicateConfig(preferred_segment=b.name)
    eq(sa.put("first", b"f", onto_b), OK, "the first put onto B (PutStart)")
    wait_for(lambda: metric(a.metrics(), RLEASE) > 0, what="A holds a remote lease on B")

    def put_start_puts():  # (stats are current; the metrics lag a little)
        st = cl.stats()
        return st["puts"] - st["commits"], st["commit_refusals"]

    eq(put_start_puts(), (1, 0), "the first put")
    c0 = commits(a)
    vals = {"r/%d" % i: os.urandom(n) for i, n in enumerate([1, 64, 65, 4096] * 25)}
    for k, v in vals.items():
        eq(sa.put(k, v, onto_b), OK, "put %s onto B" % k)
    eq(commits(a) - c0, len(vals), "every put sealed with one commit")
    eq(put_start_puts(), (1, 0), "no PutStart, no refusal")
    eq(replica_segments(cl, b"r/7"), [b.name], "in B's segment")
    eq([k for k, v in vals.items() if sb.get(k) != v], [], "objects read wrong on B")
    eq([k for k, v in vals.items() if sa.get(k) != v], [], "objects read wrong on A")
    inv = lambda: int(dict(l.split(" ", 1) for l in
                           b.ctl("stats", "--agent").stdout.splitlines())["inventory"])
    wait_for(lambda: inv() >= len(vals) + 1, what="B's mirror knows them")
    eq(sa.put("r/0", b"again", onto_b), OK, "an existing key, refused by the commit")
    eq(sb.get("r/0"), vals["r/0"], "the object is untouched")
    eq(sa.put("r/after", b"after", onto_b), OK, "the next put onto B")
    eq(put_start_puts(), (1, 1), "still through the lease (a refused key keeps it)")
    eq(sb.get("r/after"), b"after", "read on B")
    wait_balanced(cl, cl.agents, "after remote-leased puts")
    # A batch onto B takes PutStart (one commit names one segment).
    batch = {"rb/%d" % i: os.urandom(100) for i in range(5)}
    eq(sa.put_batch(list(batch), list(batch.values()), onto_b), OK, "a batch onto B")
    eq(put_start_puts(), (6, 1), "PutStart for the batch (and the refused commit)")
    eq([k for k, v in batch.items() if sb.get(k) != v], [], "batch read on B")
    # The lease's time: A stops taking from it after half, the master
    # takes the rest back at its end; the books balance again.
    wait_for(lambda: metric(a.metrics(), RLEASE) == 0, timeout=10, what="A's lease over")
    wait_balanced(cl, cl.agents, "after the remote lease's end")
    eq([k for k, v in vals.items() if sb.get(k) != v], [], "committed objects stay")
    sa.close()
    sb.close()


@case
def lease_off_puts_take_put_start():
    cl = Cluster(agents=2, agent_args=["--put-lease-size=0"])
    a, b = cl.agents
    sa, sb = a.store(), b.store()
    vals = {("off/%d" % i): os.urandom(100 * i) for i in range(50)}
    for k, v in vals.items():
        eq(sa.put(k, v), OK, "put %s" % k)
    eq({k: sb.get(k) for k in vals} == vals, True, "read on B")
    eq(sa.put("off/1", b"x"), OK, "an existing key (PutStart refuses it; 0 to Python)")
    eq(sb.get("off/1"), vals["off/1"], "the object is untouched")
    from mooncake.store import ReplicateConfig
    for i in range(5):
        eq(sa.put("offb/%d" % i, b"b", ReplicateConfig(preferred_segment=b.name)), OK, "onto B")
    eq(metric(a.metrics(), RLEASE), 0, "no remote lease")
    eq(commits(a), 0, "no commits")
    eq(metric(a.metrics(), LEASE), 0, "no lease")
    s = cl.stats()
    eq((s["leased_bytes"], s["commits"]), (0, 0), "the master leased nothing")
    assert s["puts"] >= 50, s
    wait_balanced(cl, cl.agents, "lease off")
    sa.close()
    sb.close()


@case
def a_killed_agent_gives_its_lease_back():
    cl = Cluster(agents=2, master_args=["--agent-ttl=1s"])
    a, b = cl.agents
    sa, sb = a.store(), b.store()
    eq(sa.put("warm", b"w"), OK, "put on A")
    wait_lease(a)
    eq(sb.put("onb", b"B's own"), OK, "put on B")
    for i in range(20):
        eq(sa.put("a/%d" % i, os.urandom(1000)), OK, "put on A")
    assert cl.stats()["leased_bytes"] > 0
    a.d.kill()
    wait_for(lambda: cl.stats()["agents"] == 1, timeout=15, what="A expired")
    wait_balanced(cl, [b], "A's segment and lease gone")
    eq(sb.batch_is_exist(["a/0", "onb"]), [0, 1], "A's objects gone, B's kept")
    eq(sb.get("onb"), b"B's own", "B still serves")
    sb.close()


@case
def an_expired_agent_keeps_what_it_committed():
    """An agent stopped past the agent TTL: the master drops its segment
    and lease; back, it mounts again, re-reports its inventory (committed
    objects included) and takes a new lease."""
    cl = Cluster(agents=2, master_args=["--agent-ttl=1s"])
    a, b = cl.agents
    sa, sb = a.store(), b.store()
    eq(sa.put("warm", b"w"), OK, "put on A")
    wait_lease(a)
    c0 = commits(a)
    vals = {("e/%d" % i): os.urandom(2000 + i) for i in range(100)}
    for k, v in vals.items():
        eq(sa.put(k, v), OK, "put on A")
    eq(commits(a) - c0, len(vals), "all committed")
    wait_for(lambda: metric(a.metrics(), "mooncake_agent_inventory_objects") == len(vals) + 1,
             what="A's mirror holds its commits")
    a.d.signal(signal.SIGSTOP)
    try:
        wait_for(lambda: cl.stats()["agents"] == 1, timeout=15, what="A expired")
        s = cl.stats()
        eq(s["objects"], 0, "A's objects dropped")
        eq(s["leased_bytes"], metric(b.metrics(), LEASE), "only B's lease left")
    finally:
        a.d.signal(signal.SIGCONT)
    wait_for(lambda: "re-sync with master" in a.d.output(), timeout=20, what="A re-synced")
    got = {k: sb.get(k) for k in vals}
    eq([k for k in vals if got[k] != vals[k]], [], "objects read wrong on B after the re-sync")
    c1 = commits(a)
    wait_lease(a)
    for i in range(20):
        eq(sa.put("after/%d" % i, b"x" * 3000), OK, "put after the re-sync")
    assert commits(a) > c1, "a new lease after the re-sync"
    eq(sb.get("after/3"), b"x" * 3000, "read on B")
    wait_balanced(cl, cl.agents, "after the re-sync")
    sa.close()
    sb.close()


@case
def an_idle_lease_goes_back():
    """A lease unused for 10 s returns to the pool; the next put asks
    for one again."""
    cl = Cluster(agents=1)
    a = cl.agents[0]
    s = a.store()
    eq(s.put("one", b"1"), OK, "put")
    wait_lease(a)
    assert cl.stats()["leased_bytes"] > 0
    wait_for(lambda: cl.stats()["leased_bytes"] == 0, timeout=30, what="the idle lease back")
    eq(metric(a.metrics(), LEASE), 0, "the agent holds none")
    eq(s.put("two", b"2"), OK, "put")
    wait_lease(a)
    wait_balanced(cl, cl.agents, "leased again")
    s.close()


PUT_SMALL_FOREVER = r"""
import os, sys
from mooncake.store import MooncakeDistributedStore
s = MooncakeDistributedStore()
assert s.setup("localhost", "P2PHANDSHAKE", 0, 0, "tcp", "", "", socket_path=sys.argv[1]) == 0
v = os.urandom(256 << 10)
i = 0
while True:
    s.put("kill/%d" % i, v)
    if i == 10:
        open(sys.argv[2], "w").close()
    i += 1
"""


@case
def a_client_killed_mid_put_leaks_no_leased_space():
    cl = Cluster(agents=1, segment=256 * MiB)
    a = cl.agents[0]
    marker = os.path.join(a.tmp.name, "started")
    child = subprocess.Popen(
        [sys.executable, "-c", PUT_SMALL_FOREVER, a.socket, marker],
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    wait_for(lambda: os.path.exists(marker), what="client putting")
    time.sleep(0.05)  # let puts be in flight
    child.kill()
    child.wait()
    wait_for(lambda: metric(a.metrics(), "mooncake_agent_clients") == 0.0,
             what="the session is gone")
    assert commits(a) > 0, "the client's puts went through the lease"
    wait_balanced(cl, cl.agents, "after the client died")
    s = a.store()
    eq(s.put("after", b"ok"), OK, "agent still serves")
    s.close()


mctest.main()
