"""deploy/: what an operator installs next to the binaries works.

- prometheus/alerts.yml passes `promtool check rules` and its unit tests
  (alerts_test.yml, `promtool test rules`); prometheus.yml passes
  `promtool check config`;
- every metric an alert or a panel of grafana/mooncaked.json names is
  served by the running daemons (a standalone: meta, master and agent
  /metrics), and the dashboard is well formed;
- logrotate/mooncaked, run by logrotate against a running daemon, rotates
  its --log-file and the daemon goes on in the new file (SIGHUP);
- the systemd units pass `systemd-analyze verify`, run as the user the
  sysusers.d file makes, and `systemd-analyze security` rates meta and
  master at most 5 (the target) and the agent's units at most 5 too
  (their sandbox differs only where RDMA needs it).
"""
import json
import os
import re
import shutil
import subprocess
import tempfile
import urllib.request

import mctest
from mctest import Daemon, case, eq, run, wait_for

DEPLOY = os.path.join(mctest.ROOT, "deploy")
PROM = os.path.join(DEPLOY, "prometheus")


@case
def promtool_checks_and_tests_the_alerts():
    r = run(["promtool", "check", "rules", os.path.join(PROM, "alerts.yml")])
    assert "SUCCESS" in r.stdout, r.stdout
    r = run(["promtool", "test", "rules", "alerts_test.yml"], cwd=PROM)
    assert "SUCCESS" in r.stdout, r.stdout + r.stderr
    r = run(["promtool", "check", "config", "prometheus.yml"], cwd=PROM)
    assert "SUCCESS" in r.stdout, r.stdout
    # Every alert of the issue has a test that makes it fire.
    alerts = re.findall(r"- alert: (\w+)", open(os.path.join(PROM, "alerts.yml")).read())
    tests = open(os.path.join(PROM, "alerts_test.yml")).read()
    for a in alerts:
        fired = re.search(r"alertname: %s\n\s+exp_alerts:\n\s+- exp_labels" % a, tests)
        assert fired, "no test makes %s fire" % a
    for want in ["MooncakeHitRateLow", "MooncakeEvictionStorm", "MooncakePoolNearFull",
                 "MooncakeTransferFailures", "MooncakeAgentDown", "MooncakeNoMasterLeader",
                 "MooncakeMetaNoQuorum", "MooncakeWalFsyncSlow"]:
        assert want in alerts, want


# PromQL words that are not metric names.
WORDS = {"sum", "rate", "increase", "max", "min", "count", "avg", "histogram_quantile",
         "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
         "unless", "bool", "offset", "vector", "time", "clamp_min", "humanize",
         "topk", "bottomk", "abs", "absent", "irate", "delta", "deriv"}


def metric_names(expr):
    e = re.sub(r'"[^"]*"', "", expr)
    e = re.sub(r"\{[^}]*\}", "", e)
    e = re.sub(r"\[[^\]]*\]", "", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", e)
    names = set()
    for m in re.finditer(r"(?<![0-9.])[a-zA-Z_:][a-zA-Z0-9_:]*", e):
        word = m.group(0)
        rest = e[m.end():].lstrip()
        if word in WORDS or rest.startswith("("):
            continue
        names.add(word)
    return names


def served_series(text):
    names = set()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            names.add(re.split(r"[ {]", line, 1)[0])
    return names


def dashboard_exprs():
    d = json.load(open(os.path.join(DEPLOY, "grafana", "mooncaked.json")))
    exprs, ids = [], set()
    for p in d["panels"]:
        assert p["id"] not in ids, "panel id %s twice" % p["id"]
        ids.add(p["id"])
        if p["type"] == "row":
            continue
        eq(p["datasource"]["uid"], "${datasource}", "panel %r datasource" % p["title"])
        assert p["targets"], "panel %r has no query" % p["title"]
        for t in p["targets"]:
            assert t["expr"].strip(), p["title"]
            exprs.append((p["title"], t["expr"]))
    eq([v["name"] for v in d["templating"]["list"]], ["datasource"], "template variables")
    return exprs


@case
def every_metric_of_the_dashboard_and_the_alerts_is_served():
    d = Daemon("standalone", args=["--heartbeat-interval=50ms", "--election-timeout=500ms"])
    wait_for(lambda: "mounted with master" in d.output(), what="agent mounted")

    def scrape(key):
        with urllib.request.urlopen("http://%s/metrics" % d.addr(key), timeout=5) as r:
            return r.read().decode()
    # The per-segment series exist once the master has the segment.
    wait_for(lambda: "mooncake_master_segment_used_bytes{" in scrape("master-http"),
             what="the segment's series")
    served = set()
    for key in ("meta-http", "master-http", "agent-http"):
        got = served_series(scrape(key))
        # Every role has the process metrics.
        for m in ("process_cpu_seconds_total", "process_resident_memory_bytes",
                  "process_open_fds", "process_max_fds", "process_start_time_seconds"):
            assert m in got, "%s lacks %s" % (key, m)
        served |= got
    served.add("up")  # Prometheus's own
    exprs = dashboard_exprs()
    assert len(exprs) >= 30, len(exprs)
    alerts = open(os.path.join(PROM, "alerts.yml")).read()
    for block in re.findall(r"expr: \|\n((?:\s{10}.*\n)+)|expr: (.*)\n", alerts):
        exprs.append(("alerts.yml", block[0] or block[1]))
    missing = {}
    for title, e in exprs:
        for name in metric_names(e):
            if name not in served:
                missing.setdefault(name, []).append(title)
    eq(missing, {}, "metrics named but not served")
    d.stop()


@case
def logrotate_rotates_a_running_daemons_log_file():
    with tempfile.TemporaryDirectory() as tmp:
        logdir = os.path.join(tmp, "log")
        lib = os.path.join(tmp, "lib")
        os.makedirs(logdir)
        d = Daemon("meta", data_dir=os.path.join(lib, "meta"),
                   args=["--log-file=" + os.path.join(logdir, "meta.log")])
        log = os.path.join(logdir, "meta.log")
        wait_for(lambda: os.path.exists(log) and "ready" in open(log).read(), what="logging")
        conf = open(os.path.join(DEPLOY, "logrotate", "mooncaked")).read()
        conf = conf.replace("/var/log/mooncake", logdir).replace("/var/lib/mooncake", lib)
        path = os.path.join(tmp, "logrotate.conf")
        with open(path, "w") as f:
            f.write(conf)
        os.chmod(path, 0o644)
        run(["logrotate", "-f", "-s", os.path.join(tmp, "state"), path])
        assert os.path.exists(log + ".1"), os.listdir(logdir)
        wait_for(lambda: os.path.exists(log) and "SIGHUP: log file reopened" in open(log).read(),
                 what="the daemon writes to the new file")
        assert "ready" in open(log + ".1").read()
        eq(d.stop(), 0, "exit status")


UNITS = (("mooncaked.service.in", "mooncaked.service"),
         ("mooncaked@.service.in", "mooncaked@meta.service"),
         ("mooncaked@.service.in", "mooncaked@master.service"),
         ("mooncaked@agent.service.in", "mooncaked@agent.service"))


def write_units(tmp):
    """The units as installed (binaries from this build), by name."""
    paths = {}
    for unit, name in UNITS:
        text = open(os.path.join(DEPLOY, unit)).read().replace("@PREFIX@/bin", mctest.BUILD)
        paths[name] = os.path.join(tmp, name)
        with open(paths[name], "w") as f:
            f.write(text)
    return paths


@case
def the_systemd_units_verify():
    with tempfile.TemporaryDirectory() as tmp:
        man8 = os.path.join(tmp, "man", "man8")
        os.makedirs(man8)
        shutil.copy(os.path.join(mctest.ROOT, "man", "mooncaked.8"), man8)
        env = dict(os.environ, MANPATH=os.path.join(tmp, "man"))
        for name, path in write_units(tmp).items():
            r = subprocess.run(["systemd-analyze", "verify", path], capture_output=True,
                               text=True, env=env)
            eq((r.returncode, r.stderr.strip()), (0, ""), "systemd-analyze verify " + name)
            text = open(path).read()
            assert "User=mooncake\n" in text, name
            if "agent" in name or name == "mooncaked.service":
                assert "LimitMEMLOCK=infinity" in text, name
                assert "DeviceAllow=char-infiniband_verbs rw" in text, name
        # The user they run as: sysusers.d makes it.
        root = os.path.join(tmp, "root")
        os.makedirs(os.path.join(root, "etc"))
        run(["systemd-sysusers", "--root=" + root, os.path.join(DEPLOY, "mooncaked.sysusers")])
        passwd = open(os.path.join(root, "etc", "passwd")).read()
        assert passwd.startswith("mooncake:x:"), passwd


@case
def the_systemd_units_are_sandboxed():
    if not shutil.which("systemd-analyze"):
        print("     skipped: no systemd-analyze on this machine (CI has it)")
        return
    with tempfile.TemporaryDirectory() as tmp:
        scores = {}
        for name, path in write_units(tmp).items():
            r = run(["systemd-analyze", "security", "--offline=yes", "--no-pager", path],
                    check=False)
            m = re.search(r"Overall exposure level for %s: (\d+\.\d)" % re.escape(name),
                          r.stdout + r.stderr)
            assert m, r.stdout + r.stderr
            scores[name] = float(m.group(1))
        print("     systemd-analyze security: %s (the units were 9.6)" % scores)
        for name, score in scores.items():
            assert score <= 5.0, "%s: %.1f, target at most 5" % (name, score)


mctest.main()
