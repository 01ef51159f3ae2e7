"""mooncake: the Python client of mooncaked (ctypes over libmooncake.so).

    from mooncake.store import MooncakeDistributedStore
    from mooncake.engine import TransferEngine

Both talk to the mooncaked agent on this node through its Unix socket
($MOONCAKE_SOCKET, /run/mooncake/agent.sock, or
$XDG_RUNTIME_DIR/mooncake/agent.sock). The names, signatures and return
conventions follow Mooncake's Python API, so code written for it runs
unchanged; parameters that have no meaning here (the agent owns the
segment and the transports) are accepted and documented.

Only the standard library is needed. libmooncake.so is found through
$MOONCAKE_LIB, in the source tree's build/ (PYTHONPATH=python), next to
the installed package (PREFIX/lib), or on the dynamic linker's path.
"""

from mooncake._native import errname, strerror, version  # noqa: F401

__all__ = ["BufferPool", "RegisteredBufferPool", "errname", "strerror", "version"]


def __getattr__(name):
    # mooncake.BufferPool, as Mooncake's package exports it (imported on
    # first use, so "import mooncake" alone loads no store code).
    if name in ("BufferPool", "RegisteredBufferPool"):
        from mooncake import buffer_pool
        return getattr(buffer_pool, name)
    raise AttributeError(name)
