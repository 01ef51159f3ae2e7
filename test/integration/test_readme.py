"""Every code block of the README runs as pasted, each in a network, mount
and PID namespace of its own (unshare): its loopback, /tmp and /run are
private, so the blocks use the default ports and paths they show without
meeting other tests or daemons, and every process a block starts in the
background ends with it. The working directory holds build/, python/ and
deploy/ as the repository root does.

- sh blocks run with bash -e. The install line is simulated
  (apt-get install -s: no network, no dpkg lock), as root, to show that it
  needs no sudo and that every package exists; its `make` is the build this
  test runs on.
- python blocks run against the quick start's daemon.
- ini blocks (configuration files) must be read by mooncaked --config.
- a block after a `<!-- readme-test: skip: WHY -->` line is reported, not
  run (systemd on real hosts).
"""
import os
import re
import subprocess
import sys
import tempfile

import mctest
from mctest import case, eq

README = os.path.join(mctest.ROOT, "README.md")
# Blocks run without the tests' shared cluster secret: a reader has none.
NO_SHARED_SECRET = {"MOONCAKE_CLUSTER_SECRET_FILE": None}
SAN = os.environ.get("SAN") == "1"


def blocks():
    """(line, lang, text, skip reason or None) of every fenced block."""
    out, lines = [], open(README).read().split("\n")
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        indent, lang, start = len(m.group(1)), m.group(2), i
        j = i + 1
        while not re.match(r"^\s*```\s*$", lines[j]):
            j += 1
        body = "\n".join(l[indent:] for l in lines[i + 1:j]) + "\n"
        prev = lines[start - 1].strip() if start else ""
        skip = re.match(r"<!-- readme-test: skip: (.*) -->", prev)
        out.append((start + 1, lang, body, skip.group(1) if skip else None))
        i = j + 1
    return out


def namespace_cmd(script):
    """bash running script in fresh net/mount/PID namespaces."""
    # The checkout itself may live under /tmp (a CI clone does): it is bound
    # onto /mnt first, so the fresh /tmp does not hide it.
    root = "/mnt"
    build = os.path.join(mctest.ROOT, os.environ.get("BUILD", "build"))
    rel = os.path.relpath(build, mctest.ROOT)
    if not rel.startswith(".."):
        build = os.path.join(root, rel)
    setup = ["set -e", "mount --bind %s %s" % (sh_quote(mctest.ROOT), root),
             "mount -t tmpfs tmpfs /tmp", "mount -t tmpfs tmpfs /run",
             "ip link set lo up", "mkdir -p /tmp/work/bin", "cd /tmp/work",
             "ln -s %s build" % build] + \
            ["ln -s %s/%s %s" % (root, d, d) for d in ("python", "deploy", "conf", "man")]
    if SAN:
        # libmooncake.so of a sanitizer build needs its runtime loaded first.
        libs = [subprocess.run(["cc", "-print-file-name=%s" % l], capture_output=True,
                               text=True).stdout.strip() for l in ("libasan.so", "libubsan.so")]
        setup += ["printf '#!/bin/sh\\nLD_PRELOAD=\"%s\" ASAN_OPTIONS=detect_leaks=0 exec "
                  "/usr/bin/python3 \"$@\"\\n' > bin/python3" % " ".join(libs),
                  "chmod +x bin/python3", 'export PATH="$PWD/bin:$PATH"']
    setup += ["set +e", "exec bash -e -o pipefail -c " + sh_quote(script)]
    return UNSHARE + ["--net", "--mount", "--pid", "--fork", "--mount-proc",
                      "--propagation", "private", "bash", "-c", "\n".join(setup)]


def sh_quote(s):
    return "'" + s.replace("'", "'\\''") + "'"


def run_block(script, timeout=240):
    r = subprocess.run(namespace_cmd(script), capture_output=True, text=True, errors="replace",
                       timeout=timeout, stdin=subprocess.DEVNULL,
                       env=mctest.child_env(NO_SHARED_SECRET))
    return r.returncode, r.stdout + r.stderr


QUICK_START_DAEMON = """./build/mooncaked --data-dir=/tmp/mooncake > /tmp/mooncaked.log 2>&1 &
./build/mooncakectl health --endpoint=127.0.0.1:12345 --wait=10s > /dev/null
"""


# As root, or (not root) in a user namespace where this user is root.
UNSHARE = ["unshare"]


def check_namespaces():
    for prefix in (["unshare"], ["unshare", "--map-root-user"]):
        r = subprocess.run(prefix + ["--net", "--mount", "--pid", "--fork", "true"],
                           capture_output=True, text=True)
        if r.returncode == 0:
            UNSHARE[:] = prefix
            return
    raise AssertionError("unshare (network, mount and PID namespaces) is needed to run "
                         "the README on its default ports and paths: %s" % r.stderr.strip())


def make_case(line, lang, body, skip):
    def fn():
        if skip:
            print("     (line %d: not run: %s)" % (line, skip))
            if "systemctl" in body:
                for unit in re.findall(r"mooncaked@(\w+)", body):
                    assert os.path.exists(os.path.join(mctest.ROOT, "deploy",
                                                       "mooncaked@.service.in")), unit
            return
        check_namespaces()
        if lang == "ini":
            roles = ",".join(r for r in ("meta", "master", "agent") if "[%s]" % r in body)
            with tempfile.NamedTemporaryFile("w", suffix=".conf") as f:
                f.write(body)
                f.flush()
                r = subprocess.run([mctest.MOONCAKED, "--config=" + f.name, "--role=" + roles,
                                    "--print-config"], capture_output=True, text=True,
                                   env=mctest.child_env(NO_SHARED_SECRET))
                eq((r.returncode, r.stderr.strip()), (0, ""), "mooncaked reads it")
                n = len(re.findall(r"^\s*[a-z-]+ = ", body, re.M))
                eq(r.stdout.count("# file (file %s" % f.name), n, "every key from the file")
            return
        script = body
        if lang == "python":
            with open(os.path.join(tempfile.gettempdir(), "readme-%d.py" % line), "w") as f:
                f.write(body)
            script = QUICK_START_DAEMON + "PYTHONPATH=python python3 %s\n" % f.name
            # /tmp is private in the namespace: pass the file on stdin.
            script = QUICK_START_DAEMON + "PYTHONPATH=python python3 - <<'PY_EOF'\n" + body + \
                "PY_EOF\n"
        elif "apt-get install" in body:
            script = script.replace("apt-get install -y", "apt-get install -s -y")
            script = re.sub(r"&& make\s*$", "&& test -x build/mooncaked", script, flags=re.M)
        rc, out = run_block(script)
        if rc != 0:
            print(out[-6000:])
        eq(rc, 0, "exit status of the block at README.md:%d" % line)

    fn.__name__ = "readme_line_%d_%s" % (line, lang or "text")
    return fn


for line, lang, body, skip in blocks():
    if lang in ("sh", "python", "ini"):
        case(make_case(line, lang, body, skip))


@case
def no_block_is_left_out():
    langs = {lang for _, lang, _, _ in blocks()}
    eq(langs - {"sh", "python", "ini", "text", ""}, set(), "block languages the test knows")
    text = open(README).read()
    assert "[--learner]" not in text, "a literal [--learner] cannot be pasted"
    install = [l for l in text.splitlines() if "apt-get install" in l][0]
    assert install.startswith("$(command -v sudo) apt-get"), install


mctest.main()
