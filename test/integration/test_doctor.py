"""mooncakectl doctor: the node checks on fake sysfs/procfs trees (a healthy
node, a port that is DOWN, a PCIe 4.0 x16 NIC on a 3.0 x8 link, a 64 KiB
memory-lock limit, no RoCE v2 GID), the MTU asked of libibverbs when sysfs
has none (the software verbs device of the test build), the cluster checks
against a running standalone daemon (meta, segment records, master leader,
each agent's own checks through mooncake.doctor.Doctor), a stale segment
record, --json and the exit status."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import mctest
from mctest import Daemon, case, eq, run, wait_for

sys.path.insert(0, os.path.join(mctest.BUILD, "py"))
EMU_CTL = os.path.join(mctest.BUILD, "test", "mooncakectl-emu")
GiB = 1 << 30

V4_GID = "0000:0000:0000:0000:0000:ffff:c0a8:010a"      # ::ffff:192.168.1.10
LL_GID = "fe80:0000:0000:0000:0e42:a1ff:fe2b:3c4d"


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


class Node:
    """A fake node: root/sys, root/proc, root/dev, root/etc as a kernel
    shows them (the formats of drivers/infiniband/core/sysfs.c, the PCI
    core's link attributes, /proc/meminfo, /proc/PID/limits)."""

    def __init__(self, state="4: ACTIVE", phys="5: LinkUp", speed=("16.0 GT/s PCIe", "16"),
                 max_speed=("16.0 GT/s PCIe", "16"), memlock="unlimited", v2=True,
                 netdev_mtu=9000, dev="mlx5_0", link_layer="Ethernet", numa=True):
        self.tmp = tempfile.TemporaryDirectory(prefix="mooncake-doctor-")
        r = self.root = self.tmp.name
        ib = "%s/sys/class/infiniband/%s" % (r, dev)
        port = ib + "/ports/1"
        write(port + "/state", state + "\n")
        write(port + "/phys_state", phys + "\n")
        write(port + "/link_layer", link_layer + "\n")
        write(port + "/rate", "200 Gb/sec (4X HDR)\n")
        if link_layer == "Ethernet":
            gids = [(LL_GID, "IB/RoCE v1"), (LL_GID, "RoCE v2"), (V4_GID, "IB/RoCE v1"),
                    (V4_GID, "RoCE v2")]
            if not v2:
                gids = [g for g in gids if g[1] != "RoCE v2"]
            for i, (g, t) in enumerate(gids):
                write("%s/gids/%d" % (port, i), g + "\n")
                write("%s/gid_attrs/types/%d" % (port, i), t + "\n")
                write("%s/gid_attrs/ndevs/%d" % (port, i), "eth0\n")
            # An unset entry: all zeros, its type unreadable (no file here).
            write("%s/gids/%d" % (port, len(gids)), "0000:" * 7 + "0000\n")
            write("%s/sys/class/net/eth0/mtu" % r, "%d\n" % netdev_mtu)
        else:
            write(port + "/gids/0", LL_GID + "\n")
            write(port + "/gid_attrs/types/0", "IB/RoCE v1\n")
        pci = "%s/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0" % r
        write(pci + "/current_link_speed", speed[0] + "\n")
        write(pci + "/current_link_width", speed[1] + "\n")
        write(pci + "/max_link_speed", max_speed[0] + "\n")
        write(pci + "/max_link_width", max_speed[1] + "\n")
        write(pci + "/numa_node", "1\n" if numa else "-1\n")
        os.symlink(os.path.relpath(pci, ib), ib + "/device")
        for n in (0, 1):
            os.makedirs("%s/sys/devices/system/node/node%d" % (r, n))
        write(r + "/proc/meminfo",
              "MemTotal:       65856220 kB\nMemFree:        60000000 kB\n"
              "MemAvailable:   62000000 kB\nHugePages_Total:    1024\n"
              "HugePages_Free:     1024\nHugepagesize:       2048 kB\n")
        lim = memlock if memlock == "unlimited" else str(memlock)
        write(r + "/proc/self/limits",
              "Limit                     Soft Limit           Hard Limit           Units     \n"
              "Max open files            1048576              1048576              files     \n"
              "Max locked memory         %-20s %-20s bytes     \n" % (lim, lim))
        write(r + "/proc/self/status", "Name:\tmooncakectl\nCapEff:\t0000000000000000\n")
        write(r + "/proc/sys/net/core/rmem_max", "67108864\n")
        write(r + "/proc/sys/net/core/wmem_max", "67108864\n")
        write(r + "/proc/sys/net/ipv4/tcp_rmem", "4096\t131072\t6291456\n")
        write(r + "/proc/sys/net/ipv4/tcp_wmem", "4096\t16384\t4194304\n")
        write(r + "/dev/infiniband/uverbs0", "")
        os.chmod(r + "/dev/infiniband/uverbs0", 0o666)
        os.makedirs(r + "/etc")

    def args(self):
        r = self.root
        return ["--sysfs-root=" + r + "/sys", "--procfs-root=" + r + "/proc",
                "--dev-root=" + r + "/dev", "--etc-root=" + r + "/etc"]


def doctor(node, *extra, exe=None, env=None):
    cmd = [exe or mctest.MOONCAKECTL, "doctor", "--node", "--json", "--config=",
           "--data-dir=" + node.root + "/data", "--numa-node=1"] + node.args() + list(extra)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, **(env or {})))
    try:
        out = json.loads(r.stdout)
    except ValueError:
        raise AssertionError("not JSON (exit %d):\n%s\n%s" % (r.returncode, r.stdout, r.stderr))
    return r.returncode, {c["check"]: c for c in out["checks"]}, out


def verdict(rows, check):
    if check not in rows:
        raise AssertionError("no row %r in %s" % (check, sorted(rows)))
    return rows[check]["verdict"]


@case
def a_healthy_node_passes():
    n = Node()
    rc, rows, out = doctor(n)
    bad = {k: v for k, v in rows.items() if v["verdict"] in ("fail", "warn")}
    eq(bad, {}, "no failing or warning rows")
    eq(rc, 0, "exit status")
    eq(out["status"], "ok", "status")
    gid = rows["rdma mlx5_0 port 1: GID"]["found"]
    assert gid.startswith("index 3: RoCE v2 ::ffff:192.168.1.10"), gid
    mtu = rows["rdma mlx5_0 port 1: active MTU"]["found"]
    assert mtu.startswith("4096 (netdev eth0 MTU 9000)"), mtu
    pcie = rows["rdma mlx5_0: PCIe link"]["found"]
    assert pcie == "Gen4 (16.0 GT/s PCIe) x16 = 31.5 GB/s", pcie
    eq(verdict(rows, "rdma mlx5_0: NUMA node"), "ok", "NIC on node 1 and --numa-node=1")
    eq(verdict(rows, "memory-lock limit (RLIMIT_MEMLOCK)"), "ok", "unlimited")
    # The same table for people, with every column.
    r = run([mctest.MOONCAKECTL, "doctor", "--node", "--config=", "--numa-node=1",
             "--data-dir=" + n.root + "/data"] + n.args())
    eq(r.stdout.splitlines()[0].split(), ["CHECK", "FOUND", "EXPECTED", "VERDICT", "HOW", "TO",
                                          "FIX"], "table header")


@case
def a_port_that_is_down_fails():
    rc, rows, out = doctor(Node(state="1: DOWN", phys="3: Disabled"))
    row = rows["rdma mlx5_0 port 1: state"]
    eq(row["verdict"], "fail", "state")
    assert row["found"].startswith("DOWN (Disabled)"), row
    assert "ip link set eth0 up" in row["fix"], row
    eq(rc, 1, "exit status")
    eq(out["status"], "fail", "status")


@case
def a_pcie4_x16_card_on_a_pcie3_x8_link_fails():
    rc, rows, _ = doctor(Node(speed=("8.0 GT/s PCIe", "8")))
    row = rows["rdma mlx5_0: PCIe link"]
    eq(row["verdict"], "fail", "a quarter of the bandwidth")
    eq(row["found"], "Gen3 (8.0 GT/s PCIe) x8 = 7.9 GB/s", "found")
    assert row["expected"].startswith("Gen4 (16.0 GT/s PCIe) x16 = 31.5 GB/s"), row
    assert "25%" in row["fix"] and "Gen4 x16 slot" in row["fix"], row
    eq(rc, 1, "exit status")
    # Half the width only: a warning.
    rc, rows, _ = doctor(Node(speed=("16.0 GT/s PCIe", "8")))
    eq(verdict(rows, "rdma mlx5_0: PCIe link"), "warn", "50% of the bandwidth")
    eq(rc, 0, "warnings do not fail")


@case
def a_64k_memlock_fails_when_rdma_pins_the_segment():
    rc, rows, _ = doctor(Node(memlock=65536), "--global-segment-size=4G")
    row = rows["memory-lock limit (RLIMIT_MEMLOCK)"]
    eq(row["verdict"], "fail", "memlock")
    assert row["found"].startswith("64 KiB (hard 64 KiB)"), row
    assert "4 GiB" in row["fix"] and "LimitMEMLOCK=infinity" in row["fix"], row
    eq(rc, 1, "exit status")
    # No daemon runs: an installed unit's LimitMEMLOCK is what it will get.
    n = Node(memlock=65536)
    write(n.root + "/etc/systemd/system/mooncaked@.service",
          "[Service]\nExecStart=/usr/bin/mooncaked\nLimitMEMLOCK=infinity\nUser=mooncake\n")
    rc, rows, _ = doctor(n, "--global-segment-size=4G")
    row = rows["memory-lock limit (RLIMIT_MEMLOCK)"]
    eq(row["verdict"], "ok", "the unit's limit")
    assert row["found"].startswith("unlimited from %s/etc/systemd/system/mooncaked@.service"
                                   % n.root), row
    # The agent's own unit comes before the template (meta's and master's).
    write(n.root + "/usr/lib/systemd/system/mooncaked@agent.service",
          "[Service]\nLimitMEMLOCK=1G\nUser=mooncake\n")
    rc, rows, _ = doctor(n, "--global-segment-size=4G")
    row = rows["memory-lock limit (RLIMIT_MEMLOCK)"]
    assert "usr/lib/systemd/system/mooncaked@agent.service" in row["found"], row
    os.unlink(n.root + "/usr/lib/systemd/system/mooncaked@agent.service")
    write(n.root + "/usr/lib/systemd/system/mooncaked.service",
          "[Service]\nLimitMEMLOCK=64K\nUser=mooncake\n")
    os.unlink(n.root + "/etc/systemd/system/mooncaked@.service")
    rc, rows, _ = doctor(n, "--global-segment-size=4G")
    row = rows["memory-lock limit (RLIMIT_MEMLOCK)"]
    eq(row["verdict"], "fail", "a unit with 64K")
    assert "usr/lib/systemd/system/mooncaked.service" in row["found"], row
    # With tcp nothing is pinned.
    rc, rows, _ = doctor(Node(memlock=65536), "--global-segment-size=4G", "--protocol=tcp")
    eq(verdict(rows, "memory-lock limit (RLIMIT_MEMLOCK)"), "skip", "tcp pins nothing")


@case
def no_roce_v2_gid_fails():
    rc, rows, _ = doctor(Node(v2=False))
    row = rows["rdma mlx5_0 port 1: GID"]
    eq(row["verdict"], "fail", "only RoCE v1")
    # RoCE v1 and IB rank alike: the lowest index, as the daemon picks.
    assert row["found"].startswith("index 0: RoCE v1 fe80::e42:a1ff:fe2b:3c4d (eth0)"), row
    assert "RoCE v2" in row["fix"], row
    eq(rc, 1, "exit status")
    # The index the daemon would pick follows --rdma-gid-index, as the daemon's.
    rc, rows, _ = doctor(Node(), "--rdma-gid-index=1")
    row = rows["rdma mlx5_0 port 1: GID"]
    assert row["found"].startswith("index 1: RoCE v2 fe80::e42:a1ff:fe2b:3c4d"), row
    eq(row["verdict"], "warn", "RoCE v2 without IPv4")
    rc, rows, _ = doctor(Node(), "--rdma-gid-index=4")
    eq(verdict(rows, "rdma mlx5_0 port 1: GID"), "fail", "an unset entry")


@case
def mtu_numa_and_memory_findings():
    rc, rows, _ = doctor(Node(netdev_mtu=1500), "--numa-node=0")
    row = rows["rdma mlx5_0 port 1: active MTU"]
    eq(row["verdict"], "warn", "1500-byte netdev")
    assert row["found"].startswith("1024 (netdev eth0 MTU 1500)"), row
    eq(verdict(rows, "rdma mlx5_0: NUMA node"), "warn", "segment on node 0, NIC on node 1")
    rc, rows, _ = doctor(Node(), "--global-segment-size=64G")
    row = rows["memory available"]
    eq(row["verdict"], "fail", "64G on a 62.8 GiB-available node")
    assert "64 GiB" in row["fix"] and "--force-segment-size" in row["fix"], row
    eq(verdict(rows, "huge pages"), "warn", "64G needs 32768 huge pages, 1024 are there")
    rc, rows, _ = doctor(Node(), "--hugepages=on", "--global-segment-size=4G")
    eq(verdict(rows, "huge pages"), "fail", "--hugepages=on without enough")
    rc, rows, _ = doctor(Node(), "--rdma-devices=mlx5_9")
    eq(verdict(rows, "rdma devices (--rdma-devices)"), "fail", "a device that is not there")


@case
def log_policy_and_configuration_warnings():
    n = Node()
    rc, rows, _ = doctor(n, "--log-file=/var/log/x.log")
    eq(verdict(rows, "log level and size policy"), "warn", "a file that grows without bound")
    rc, rows, _ = doctor(n, "--log-file=/var/log/x.log", "--log-max-size=256M")
    eq(verdict(rows, "log level and size policy"), "ok", "rotated")
    write(n.root + "/etc/logrotate.d/mooncaked", "")
    rc, rows, _ = doctor(n, "--log-file=/var/log/x.log", "--log-level=debug")
    eq(verdict(rows, "log level and size policy"), "ok", "logrotate")
    rc, rows, out = doctor(n, env={"MOONCAKE_SEGMENT_SIZE": "1G"})
    eq(verdict(rows, "configuration"), "warn", "an unknown MOONCAKE_ variable")
    r = subprocess.run([mctest.MOONCAKECTL, "doctor", "--node", "--no-such-key=1"],
                       capture_output=True, text=True)
    eq(r.returncode, 2, "a bad flag is a usage error")


@case
def the_mtu_is_asked_of_libibverbs_when_sysfs_has_none():
    if not os.path.exists(EMU_CTL):
        raise AssertionError("%s missing: run through make test" % EMU_CTL)
    n = Node(dev="emu_0", link_layer="InfiniBand")
    rc, rows, _ = doctor(n, exe=EMU_CTL, env={"VERBS_EMU_MTU": "2048"})
    row = rows["rdma emu_0 port 1: active MTU"]
    eq(row["found"], "2048 (libibverbs)", "from ibv_query_port")
    eq(row["verdict"], "warn", "below 4096")
    rc, rows, _ = doctor(n, exe=EMU_CTL, env={"VERBS_EMU_MTU": "4096"})
    eq(rows["rdma emu_0 port 1: active MTU"]["verdict"], "ok", "4096")
    # A device libibverbs does not know: named, not guessed.
    rc, rows, _ = doctor(Node(dev="mlx5_0", link_layer="InfiniBand"))
    row = rows["rdma mlx5_0 port 1: active MTU"]
    assert row["found"].startswith("unknown (not in sysfs, libibverbs:"), row
    eq(row["verdict"], "warn", "unknown")


def put_segment(meta, cluster_id, name, host, port, incarnation=1):
    import transfer_pb2
    d = transfer_pb2.SegmentDesc(name=name, host=host, rpc_port=port, data_port=port,
                                 transports=["tcp"], incarnation=incarnation)
    key = "/mooncake/%s/segments/%s" % (cluster_id, name)
    with tempfile.NamedTemporaryFile() as f:
        f.write(d.SerializeToString())
        f.flush()
        env = dict(os.environ, ETCDCTL_API="3")
        # etcdctl reads the value from stdin when it is not given.
        with open(f.name, "rb") as value:
            r = subprocess.run(["etcdctl", "--endpoints=http://" + meta] + mctest.etcd_user()
                               + ["put", key],
                               stdin=value, capture_output=True, env=env, timeout=20)
        assert r.returncode == 0, r.stderr
    return key


@case
def the_cluster_through_meta_and_every_agents_grpc_port():
    d = Daemon("standalone", args=["--heartbeat-interval=50ms", "--election-timeout=500ms"])
    meta = d.addr("listen-client")
    base = [mctest.MOONCAKECTL, "doctor", "--json", "--config=", "--data-dir=" + d.data_dir,
            "--listen-client=" + meta, "--master-listen=" + d.addr("master-listen"),
            "--global-segment-size=64M"]
    wait_for(lambda: "mounted with master" in d.output(), what="agent mounted")

    def checks(*extra):
        r = subprocess.run(base + list(extra), capture_output=True, text=True, timeout=60)
        out = json.loads(r.stdout)
        return r.returncode, out["checks"]

    rc, rows = checks("--cluster")
    by = {(c["node"], c["check"]): c for c in rows}
    eq(by[("cluster", "meta quorum")]["verdict"], "ok", "meta quorum")
    agent = d.addr("agent-listen")
    eq(by[("cluster", "segment " + agent)]["verdict"], "ok", "the agent's record")
    m = by[("cluster", "master leader")]
    eq(m["verdict"], "ok", "leader")
    assert m["found"] == "%s view 1: SERVING" % d.addr("master-listen"), m
    # The agent's own node checks, through its gRPC port, and its clock.
    eq(by[(agent, "clock skew")]["verdict"], "ok", "same machine")
    assert (agent, "memory available") in by, sorted(by)
    assert by[(agent, "daemon process")]["found"].startswith("this daemon (pid %d)" % d.pid)
    # The local rows found the daemon through its pid file.
    local = [c for c in rows if c["check"] == "daemon process" and c["node"] != agent]
    eq(local[0]["found"], "pid %d" % d.pid, "the daemon's pid")
    eq(rc, 0, "exit status (warnings only: %s)" % [c["check"] for c in rows
                                                   if c["verdict"] == "fail"])

    # A record left by a rebuilt node: its address does not answer.
    dead = mctest.free_port()
    key = put_segment(meta, "mooncake", "old-node", "127.0.0.1", dead)
    rc, rows = checks()
    by = {(c["node"], c["check"]): c for c in rows}
    row = by[("cluster", "segment old-node")]
    eq(row["verdict"], "fail", "a stale record")
    assert "does not answer" in row["found"] and "etcdctl del" in row["fix"], row
    eq(rc, 1, "exit status")
    # A record whose address serves another segment (a rebuilt node's new agent).
    subprocess.run(["etcdctl", "--endpoints=http://" + meta] + mctest.etcd_user() + ["del", key],
                   env=dict(os.environ, ETCDCTL_API="3"), capture_output=True, check=True)
    host, port = agent.rsplit(":", 1)
    put_segment(meta, "mooncake", "gone-agent", host, int(port))
    rc, rows = checks()
    by = {(c["node"], c["check"]): c for c in rows}
    row = by[("cluster", "segment gone-agent")]
    eq(row["verdict"], "fail", "the address serves another segment")
    assert "serves another segment" in row["found"], row
    d.stop()
    # Nothing answers: meta and master fail, exit 1.
    rc, rows = checks()
    eq(rc, 1, "exit status with the daemon gone")
    by = {(c["node"], c["check"]): c for c in rows}
    eq(by[("cluster", "meta quorum")]["verdict"], "fail", "no meta")


mctest.main()
