"""Multi-process faults on loopback clusters of mooncaked --role=meta.

Each case runs a load of client threads (put, get, compare-and-swap on a
few keys, through every member) while it injects a fault, records every
client's history and checks it with linearizability.py; a write the
client saw acknowledged must be visible to every later read, so "no
acknowledged write lost" is part of the check (a last read of every key
closes each history).

  - 3 members: kill -9 the leader under load; a new leader within three
    election timeouts; restart it; it catches up.
  - 5 members with a small --snapshot-count, under load: kill -9 a
    follower, write enough that every log is compacted past it, kill -9
    the leader too; a new leader within three election timeouts; both
    restart, the follower is caught up by an InstallSnapshot stream.
  - 3 members behind fault-injecting proxies (faultproxy.py): isolate the
    leader (nothing reaches it), the others elect a leader and go on; heal;
    the old leader rejoins and catches up.
  - 3 members: fill --quota-backend-bytes; the NOSPACE alarm reaches every member;
    compaction and disarm restore writes.
  - 3 members: a compaction of 40,000 versions is freed in slices; every
    member answers the same meanwhile, a snapshot follows, a restarted
    member agrees; --physical frees before it answers.
  - graceful stop of the leader under load hands leadership over
    (TimeoutNow) with no election timeout wait; followers hand the writes
    refused meanwhile to the next leader.
  - leases granted and kept alive through a follower (forwarded to the
    leader) survive a leader kill (the new leader extends them) and expire
    through the log once keep-alives stop; a watch on a follower sees the
    put and the expiry's delete; MoveLeader.
"""
import json
import threading
import time

import mctest
from mctest import case, eq

import grpc
import metacluster
from metacluster import Client, Cluster, Load, deadline_loop, etcdctl, ELECTION_MS
import etcd_rpc_pb2 as pb


def term_and_leader(m):
    st = m.status(timeout=1.0)
    return st.raftTerm, st.leader


@case
def three_members_kill_leader_under_load():
    c = Cluster(3)
    load = None
    try:
        c.start()
        load = Load(c, clients=4, seed=3).start()
        load.wait_progress(25)
        old = c.leader()
        old.kill()
        t0 = time.monotonic()
        survivors = [m for m in c.members if m is not old]
        new = None
        for _ in deadline_loop(10, "no new leader among the survivors"):
            try:
                lids = {m.status(timeout=0.5).leader for m in survivors}
            except grpc.RpcError:
                continue
            if len(lids) == 1 and 0 not in lids:
                lid = lids.pop()
                new = [m for m in survivors if m.status().header.member_id == lid]
                if new:
                    new = new[0]
                    break
        took = time.monotonic() - t0
        # A liveness bound, not a speed check: an election takes one to
        # three timeouts on an idle machine (printed below), and a loaded
        # CI machine may stretch it; ten means no leader would ever come.
        assert took <= 10 * ELECTION_MS / 1000.0, \
            "no new leader after %.2fs (10 x %d ms election timeout)" % (took, ELECTION_MS)
        load.wait_progress(10)  # the load goes on with two members
        old.start()
        lead = c.wait_leader()
        applied = lead.status().raftAppliedIndex
        c.wait_applied(old, applied)
        load.wait_progress(10)  # and with the restarted one back
        load.stop()
        load.final_reads(c.wait_leader())
        n = load.check()
        assert load.acked_puts > 20, "the load did too little: %d puts" % load.acked_puts
        load.check_catches_a_lost_write()
        print("  %d ops checked, %d acknowledged puts, %d errors, new leader in %.2fs"
              % (n, load.acked_puts, load.errors, took))
    finally:
        if load:
            load.stop()
        c.close()


@case
def five_members_kill_leader_and_follower_snapshot_catch_up():
    c = Cluster(5, args=["--snapshot-count=50"])
    load = None
    try:
        c.start()
        load = Load(c, clients=4, seed=5).start()
        lead = c.leader()
        victim = [m for m in c.members if m is not lead][0]
        victim.kill()
        cl = Client(lead.client_addr)
        # Far enough past the victim that no log still holds what it
        # lacks (snapshots every 50 entries, as many kept behind them).
        for i in range(1300):
            cl.put(b"s/%04d" % (i % 300), b"v%d" % i)
        cl.close()
        lead.kill()  # two of five down: the other three still make a quorum
        t0 = time.monotonic()
        rest = [m for m in c.members if m.alive()]
        new = c.wait_leader(members=rest, timeout=10)
        took = time.monotonic() - t0
        # A liveness bound, not a speed check: an election takes one to
        # three timeouts on an idle machine (printed below), and a loaded
        # CI machine may stretch it; ten means no leader would ever come.
        assert took <= 10 * ELECTION_MS / 1000.0, \
            "no new leader after %.2fs (10 x %d ms election timeout)" % (took, ELECTION_MS)
        load.wait_progress(10)  # three of five go on
        victim.start()
        lead.start()
        new = c.wait_leader()
        applied = new.status().raftAppliedIndex
        c.wait_applied(victim, applied)
        c.wait_applied(lead, applied)
        out = victim.output()
        assert "installed the leader's snapshot" in out, out[-3000:]
        assert "sending the snapshot at index" in new.output()
        want = Client(new.client_addr)
        got = Client(victim.client_addr)
        a = want.range(b"s/", range_end=b"s0")
        b = got.range(b"s/", range_end=b"s0", serializable=True)
        want.close()
        got.close()
        eq([(kv.key, kv.value, kv.mod_revision) for kv in b.kvs],
           [(kv.key, kv.value, kv.mod_revision) for kv in a.kvs], "state after catch-up")
        load.stop()
        load.final_reads(new)
        n = load.check()
        print("  %d ops checked, %d acknowledged puts, %d errors, new leader in %.2fs"
              % (n, load.acked_puts, load.errors, took))
    finally:
        if load:
            load.stop()
        c.close()


@case
def isolated_leader_steps_down_others_go_on_then_heal():
    c = Cluster(3, proxies=True)
    load = None
    try:
        c.start()
        load = Load(c, clients=3, seed=7).start()
        load.wait_progress(15)
        old = c.leader()
        old.proxy.set_mode("blackhole")  # nothing reaches the leader now
        others = [m for m in c.members if m is not old]
        new = c.wait_leader(members=others, timeout=10)
        assert new is not old
        # the isolated one stops leading (CheckQuorum) and serves no stale reads
        for _ in deadline_loop(10, "the isolated leader never stepped down"):
            try:
                if old.status(timeout=0.5).leader != old.status(timeout=0.5).header.member_id:
                    break
            except grpc.RpcError:
                pass
        oc = Client(old.client_addr, timeout=1.0)
        try:
            oc.get(b"a")
            raise AssertionError("a linearizable read was served by an isolated member")
        except grpc.RpcError as e:
            assert e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED), e
        oc.close()
        load.wait_progress(10)  # the two others go on
        old.proxy.set_mode("pass")
        lead = c.wait_leader()
        c.wait_applied(old, lead.status().raftAppliedIndex)
        load.wait_progress(10)  # and with the old leader back
        load.stop()
        load.final_reads(lead)
        n = load.check()
        print("  %d ops checked, %d acknowledged puts, %d errors" % (n, load.acked_puts,
                                                                      load.errors))
    finally:
        if load:
            load.stop()
        c.close()


@case
def quota_alarm_reaches_every_member():
    c = Cluster(3, args=["--quota-backend-bytes=48K"])
    try:
        c.start()
        f = [m for m in c.members if m is not c.leader()][0]
        cl = Client(f.client_addr)  # writes through a follower are forwarded
        for i in range(200):
            try:
                cl.put(b"q/%d" % i, b"x" * 1000)
            except grpc.RpcError as e:
                eq(e.details(), "etcdserver: mvcc: database space exceeded", "NOSPACE")
                break
        else:
            raise AssertionError("the quota never filled")
        for m in c.members:
            for _ in deadline_loop(5, "%s has no NOSPACE alarm" % m.name):
                if any("NOSPACE" in e for e in m.status().errors):
                    break
        rev = cl.range(b"q/0").header.revision
        cl.delete(b"q/", range_end=b"q0")
        etcdctl(c.endpoints, "compaction", str(rev + 1))
        etcdctl(c.endpoints, "alarm", "disarm")
        for m in c.members:
            for _ in deadline_loop(5, "%s kept its alarm" % m.name):
                if not m.status().errors:
                    break
        cl.put(b"q/after", b"ok")
        cl.close()
    finally:
        c.close()


def same_hashkv(c, rev):
    """The compact revision every member reports beside the same HashKV at
    rev (a member still applying rev is asked again)."""
    for _ in deadline_loop(20, "the members' HashKV at %d differ" % rev):
        r = etcdctl(c.endpoints, "endpoint", "hashkv", "--cluster", "--rev=%d" % rev, "-w",
                    "json", check=False)
        if r.returncode != 0:
            continue
        h = {(e["HashKV"]["hash"], e["HashKV"]["compact_revision"]) for e in json.loads(r.stdout)}
        if len(json.loads(r.stdout)) == 3 and len(h) == 1:
            return h.pop()[1]


def fill(c, n):
    mctest.run([mctest.MOONCAKECTL, "bench", "meta", "--endpoints=" + c.endpoints,
                "--total=%d" % n, "--key-size=32", "--val-size=512", "--clients=32",
                "--keep-keys"], timeout=120)


@case
def bench_meta_keeps_off_a_stores_keys():
    """bench meta writes zero-padded decimal keys and deletes them at the
    end (it used to overwrite such keys and leave its own): a store that
    holds a key among them is refused and keeps it; a run on an empty
    range leaves it empty; --keep-keys leaves the run's keys (a fill),
    --overwrite-keys writes over what is there."""
    c = Cluster(1)
    try:
        c.start()
        cl = Client(c.members[0].client_addr)
        cl.put(b"00000042", b"mine")
        cl.put(b"other", b"x")

        def bench(*args):
            return mctest.run([mctest.MOONCAKECTL, "bench", "meta",
                               "--endpoints=" + c.endpoints] + list(args), check=False,
                              timeout=60)

        def keys():
            return sorted(kv.key for kv in cl.range(b"\0", range_end=b"\0").kvs)
        r = bench("--total=100")
        eq(r.returncode, 1, "refused: " + r.stdout + r.stderr)
        assert "holds 1 keys between '00000000' and '00000099'" in r.stderr, r.stderr
        eq(cl.get(b"00000042"), b"mine", "its key kept")
        r = bench("--total=100", "--key-size=12")
        eq(r.returncode, 0, r.stdout + r.stderr)
        assert "cleanup        100 keys deleted" in r.stdout, r.stdout
        assert r.stdout.splitlines()[-1].startswith("RESULT "), r.stdout
        eq(keys(), [b"00000042", b"other"], "nothing left of the run")
        r = bench("--total=10", "--key-size=10", "--keep-keys")
        eq(r.returncode, 0, r.stdout + r.stderr)
        eq(len(keys()), 12, "the run's ten keys kept")
        # Told to, it writes over the keys in its range, and keeps its own
        # (others may lie among them: here the ten 10-byte ones).
        r = bench("--total=100", "--overwrite-keys")
        eq(r.returncode, 0, r.stdout + r.stderr)
        assert cl.get(b"00000042") != b"mine", "overwritten"
        eq(len(keys()), 12 + 99, "nothing deleted")
        cl.close()
    finally:
        c.close()


@case
def a_big_compaction_is_freed_while_members_serve():
    """A compaction holds at once and its versions are freed in slices
    while the members serve (etcd frees a compaction's keys in batches
    too): every member answers the same meanwhile (HashKV), the freeing
    ends on every member (the store's size falls), the snapshot taken
    next is taken whole and a member restarted from it agrees; a client's
    --physical compaction is freed before it is answered."""
    c = Cluster(3, args=["--snapshot-count=4000"])
    try:
        c.start()
        fill(c, 20000)
        r = json.loads(etcdctl(c.endpoints, "del", "", "--from-key", "-w", "json").stdout)
        eq(int(r["deleted"]), 20000, "deleted")
        rev = int(r["header"]["revision"])
        # At exactly the delete: 20,000 puts dropped, 20,000 tombstones kept.
        etcdctl(c.endpoints, "compaction", str(rev))
        cl = Client(c.members[0].client_addr)
        eq(same_hashkv(c, cl.put(b"after", b"1").header.revision), rev, "compact revision")
        for m in c.members:
            for _ in deadline_loop(20, "%s still holds the compacted versions" % m.name):
                if m.status().dbSize < 20000 * 600 // 2:
                    break
        fill(c, 5000)  # past --snapshot-count: each member takes a snapshot
        for m in c.members:
            for _ in deadline_loop(20, "%s took no snapshot after the compaction" % m.name):
                if m.output().split("compacted the store at revision %d" % rev)[-1].count(
                        "log compacted"):
                    break
            assert "abandoned" not in m.output(), m.output()[-3000:]
        f = [m for m in c.members if m is not c.leader()][0]
        f.kill()
        f.start()
        lead = Client(c.wait_leader().client_addr)  # cl may talk to f
        rev2 = lead.put(b"after2", b"2").header.revision
        lead.close()
        same_hashkv(c, rev2)  # the restarted member agrees
        # --physical: answered once the member asked freed the versions.
        one = Client(f.client_addr)
        before = one.status().dbSize
        etcdctl(f.endpoint, "compaction", "--physical", str(rev2))
        after = one.status().dbSize
        assert after < before, "physical compaction freed nothing: %d -> %d" % (before, after)
        one.close()
        cl.close()
    finally:
        c.close()


@case
def graceful_stop_of_leader_transfers_leadership():
    c = Cluster(3, args=["--election-timeout=3s", "--heartbeat-interval=100ms"])
    load = None
    try:
        c.start()
        load = Load(c, clients=4, seed=11).start()
        load.wait_progress(10)
        old = c.leader()
        t0 = time.monotonic()
        eq(old.stop(), 0, "exit status")
        others = [m for m in c.members if m is not old]
        new = c.wait_leader(members=others, timeout=10)
        took = time.monotonic() - t0
        # Not a speed check: without the transfer no member could even start
        # an election before a 3 s election timeout had passed.
        assert took < 3.0, "leadership moved only after %.2fs" % took
        assert "handing leadership to" in old.output(), old.output()[-2000:]
        cl = Client(new.client_addr)
        cl.put(b"after-transfer", b"1")
        cl.close()
        load.wait_progress(10)  # the load goes on under the new leader
        load.stop()
        load.final_reads(new)
        n = load.check()
        print("  %d ops checked across the handover, %d errors" % (n, load.errors))
    finally:
        if load:
            load.stop()
        c.close()


@case
def leases_and_watches_through_followers_survive_a_leader_change():
    c = Cluster(3)
    try:
        c.start()
        lead = c.leader()
        f1, f2 = [m for m in c.members if m is not lead]
        # a watch on a follower
        events = []
        wc = Client(f2.client_addr)
        req = pb.WatchRequest(create_request=pb.WatchCreateRequest(key=b"lw/", range_end=b"lw0"))
        stream = wc.watch_(iter([req]), timeout=30)

        def watch():
            try:
                for resp in stream:
                    events.extend((e.type, e.kv.key) for e in resp.events)
            except grpc.RpcError:
                pass
        t = threading.Thread(target=watch, daemon=True)
        t.start()
        # a lease granted and kept alive through a follower (forwarded)
        ttl = 2
        t_grant = time.monotonic()
        out = etcdctl(f1.endpoint, "lease", "grant", str(ttl)).stdout
        lid = out.split()[1]
        etcdctl(f2.endpoint, "put", "--lease=" + lid, "lw/k", "v")
        import os
        import subprocess
        env = dict(os.environ, ETCDCTL_API="3")
        ka = subprocess.Popen([metacluster.ETCDCTL, "--endpoints=" + f1.endpoint] +
                              mctest.etcd_user() + ["lease", "keep-alive", lid],
                              stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=env)
        answered = []  # when each keep-alive was answered

        def keepalives():
            for line in ka.stdout:
                if "keepalived" in line:
                    answered.append(time.monotonic())
        threading.Thread(target=keepalives, daemon=True).start()

        def kept_alive_past(t, what):
            """Wait for a keep-alive answered a second after t + TTL (the
            lease had run out by then without it); the key is still there."""
            for _ in deadline_loop(10, "no keep-alive answered past the TTL (%s)" % what):
                if answered and answered[-1] > t + ttl + 1:
                    break
            eq(etcdctl(f2.endpoint, "get", "lw/k").stdout.split(), ["lw/k", "v"], what)
        try:
            kept_alive_past(t_grant, "kept alive")
            lead.kill()
            t_kill = time.monotonic()
            new = c.wait_leader(members=[f1, f2])
            # the new leader extended the lease; keep-alives go on
            kept_alive_past(t_kill, "alive after the leader change")
        finally:
            ka.kill()
            ka.wait()
        # no more keep-alives: the new leader expires it through the log
        for _ in deadline_loop(10, "the key outlived its lease"):
            if etcdctl(f2.endpoint, "get", "lw/k").stdout == "":
                break
        for _ in deadline_loop(5, "the follower's watch missed events: %r" % (events,)):
            if (1, b"lw/k") in events:
                break
        eq(events, [(0, b"lw/k"), (1, b"lw/k")], "put then delete by expiry")
        stream.cancel()
        wc.close()
        # MoveLeader hands leadership to a chosen member
        other = f1 if new is f2 else f2
        oid = "%x" % other.status().header.member_id
        out = etcdctl(new.endpoint, "move-leader", oid).stdout
        assert "Leadership transferred" in out, out
        eq(c.leader(members=[f1, f2]).name, other.name, "moved")
    finally:
        c.close()


mctest.main()
