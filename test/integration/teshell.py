"""Helpers for the transfer-engine integration tests: a `mooncakectl
transfer` shell driven through stdin/stdout, and small parsers of its
answers. Used by test_transfer.py (shm, tcp) and test_transfer_rdma.py
(rdma on the verbs-emu test device).
"""
import os
import queue
import signal
import subprocess
import tempfile
import threading
import time

import mctest


def seg_key(name, cluster="mooncake"):
    return "/mooncake/%s/segments/%s" % (cluster, name)


class Shell:
    """A `mooncakectl transfer` process driven through stdin/stdout."""

    def __init__(self, args, wait=True, exe=None, env=None, preexec_fn=None):
        self.tmp = tempfile.TemporaryDirectory(prefix="te-shell-")
        self.err_path = os.path.join(self.tmp.name, "stderr")
        self.err = open(self.err_path, "wb")
        full_env = mctest.child_env(env)
        self.proc = subprocess.Popen([exe or mctest.MOONCAKECTL, "transfer"] + list(args),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.err, text=True, bufsize=1, env=full_env,
                                     preexec_fn=preexec_fn)
        self.lines = queue.Queue()
        threading.Thread(target=self._reader, daemon=True).start()
        self.name = None
        if wait:
            line = self.line(timeout=60)
            assert line.startswith("ready "), (line, self.stderr())
            self.name = line.split()[1]

    def _reader(self):
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def line(self, timeout=60):
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError("no answer in %ss; stderr:\n%s" % (timeout, self.stderr()))
        if line is None:
            raise AssertionError("mooncakectl transfer exited (%s); stderr:\n%s"
                                 % (self.proc.wait(), self.stderr()))
        return line

    def cmd(self, text, timeout=120):
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()
        return self.line(timeout)

    def ok(self, text, timeout=120):
        r = self.cmd(text, timeout)
        assert r.startswith("ok "), "%s -> %s\nstderr:\n%s" % (text, r, self.stderr()[-3000:])
        return r

    def error(self, text, code, timeout=120):
        r = self.cmd(text, timeout)
        assert r.startswith("error ") and code in r, "%s -> %s (wanted %s)\nstderr:\n%s" % (
            text, r, code, self.stderr()[-3000:])
        return r

    def retry_ok(self, text, deadline_s=30):
        """Repeat until ok (a state that is reached eventually)."""
        deadline = time.monotonic() + deadline_s
        while True:
            r = self.cmd(text)
            if r.startswith("ok "):
                return r
            if time.monotonic() > deadline:
                raise AssertionError("%s never succeeded, last: %s\nstderr:\n%s"
                                     % (text, r, self.stderr()[-3000:]))
            time.sleep(0.1)

    def stderr(self):
        self.err.flush()
        with open(self.err_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                rc = self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("mooncakectl transfer did not exit at EOF:\n"
                                     + self.stderr())
            return rc
        return self.proc.returncode

    def kill(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()


def first_region(open_reply):
    """(addr, len) of the first region in an "ok open" line."""
    f = open_reply.split()[5].split("(")[0].split("+")
    return int(f[0], 16), int(f[1])


def secret_file(tmp, text):
    p = os.path.join(tmp, "secret-" + text)
    with open(p, "w") as f:
        f.write(text + "\n")
    os.chmod(p, 0o600)
    return p
