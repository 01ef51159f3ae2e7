"""A fault-injecting TCP proxy for partition tests on loopback.

Proxy(target_port) listens on an ephemeral 127.0.0.1 port and forwards to
the target. Its mode can be changed at any time:
  "pass"      forward both ways
  "blackhole" keep connections open but drop every byte both ways (a
              partition: peers see silence, not errors)
  "reset"     close current connections and refuse new ones (a crash-like
              failure: peers see errors at once)
One proxy per directed link (A's view of B) gives asymmetric partitions.
"""
import select
import socket
import threading


class Proxy:
    def __init__(self, target_port, target_host="127.0.0.1"):
        self.target = (target_host, target_port)
        self.mode = "pass"
        self.lock = threading.Lock()
        self.conns = []  # (client socket, upstream socket)
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.closed = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def set_mode(self, mode):
        assert mode in ("pass", "blackhole", "reset"), mode
        with self.lock:
            self.mode = mode
            if mode == "reset":
                for a, b in self.conns:
                    for s in (a, b):
                        try:
                            s.shutdown(socket.SHUT_RDWR)
                        except OSError:
                            pass
                        s.close()
                self.conns = []

    def close(self):
        self.closed = True
        self.set_mode("reset")
        self.listener.close()

    def _accept(self):
        try:
            c, _ = self.listener.accept()
        except OSError:
            return
        with self.lock:
            mode = self.mode
        if mode == "reset":
            c.close()
            return
        try:
            u = socket.create_connection(self.target, timeout=2)
            u.settimeout(None)
        except OSError:
            c.close()
            return
        with self.lock:
            self.conns.append((c, u))

    def _run(self):
        while not self.closed:
            with self.lock:
                socks = [self.listener] + [s for pair in self.conns for s in pair]
            try:
                r, _, _ = select.select(socks, [], [], 0.05)
            except (OSError, ValueError):
                continue
            for s in r:
                if s is self.listener:
                    self._accept()
                    continue
                with self.lock:
                    pair = next((p for p in self.conns if s in p), None)
                    mode = self.mode
                if pair is None:
                    continue
                other = pair[1] if s is pair[0] else pair[0]
                try:
                    data = s.recv(262144)
                except OSError:
                    data = b""
                if not data:
                    with self.lock:
                        if pair in self.conns:
                            self.conns.remove(pair)
                    for x in pair:
                        x.close()
                    continue
                if mode == "pass":
                    try:
                        other.sendall(data)
                    except OSError:
                        pass
