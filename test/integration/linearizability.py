"""A linearizability checker for key-value histories (Wing & Gong search
with Lowe's memoization, as in Porcupine), used by the meta fault tests.

A history is a list of Op: a client's call with its invocation and
response times (monotonic, from the client's side) and its observed
result. An op whose outcome is unknown (timeout, connection lost) has
ret = None: it may have taken effect at any point after its call, or never.

The model is a map of independent registers, so the history is split per
key (P-compositionality) and each key checked alone:
  put(k, v)      -> None
  get(k)         -> value or None (absent)
  delete(k)      -> None
  cas(k, old, new) -> True/False    (compare value, then put)

check(history) returns (True, None) or (False, explanation).
"""
import collections

INF = float("inf")

Op = collections.namedtuple("Op", "client kind key arg call ret result")
# kind: "put" (arg=value), "get" (result=value or None), "delete",
# "cas" (arg=(old, new), result=True/False). ret None = unknown outcome.


def step(state, op):
    """Apply op to register state; return (ok, new_state)."""
    if op.kind == "put":
        return True, op.arg
    if op.kind == "delete":
        return True, None
    if op.kind == "get":
        return (op.ret is None or op.result == state), state
    if op.kind == "cas":
        old, new = op.arg
        matched = state == old
        if op.ret is not None and op.result != matched:
            return False, state
        return True, (new if matched else state)
    raise ValueError("unknown op kind %r" % op.kind)


def check_key(ops, initial=None, budget=2_000_000):
    """Check one key's ops. Returns (ok, info)."""
    # Unknown-outcome reads constrain nothing: drop them.
    ops = [o for o in ops if not (o.kind == "get" and o.ret is None)]
    n = len(ops)
    if n == 0:
        return True, None
    # Events sorted by time; a call before a return at equal times.
    events = []
    for i, o in enumerate(ops):
        events.append((o.call, 0, i))
        events.append((o.ret if o.ret is not None else INF, 1, i))
    events.sort()
    # Doubly linked list of events, as in Lowe / Porcupine.
    order = [(kind, i) for _, kind, i in events]
    m = len(order)
    nxt = list(range(1, m + 1))
    prv = list(range(-1, m - 1))
    head = 0 if m else m
    ret_pos = {}
    for pos, (kind, i) in enumerate(order):
        if kind == 1:
            ret_pos[i] = pos

    def unlink(p):
        nonlocal head
        if prv[p] >= 0:
            nxt[prv[p]] = nxt[p]
        else:
            head = nxt[p]
        if nxt[p] < m:
            prv[nxt[p]] = prv[p]

    def relink(p):
        nonlocal head
        if prv[p] >= 0:
            nxt[prv[p]] = p
        else:
            head = p
        if nxt[p] < m:
            prv[nxt[p]] = p

    state = initial
    linearized = 0
    cache = set()
    stack = []  # (call position, op index, previous state)
    p = head
    steps = 0
    longest = 0
    while head < m:
        steps += 1
        if steps > budget:
            return True, "search budget exhausted after %d steps (inconclusive)" % steps
        kind, i = order[p]
        if kind == 0:  # a call: try to linearize op i here
            ok, new_state = step(state, ops[i])
            key = (linearized | (1 << i), new_state)
            if ok and key not in cache:
                cache.add(key)
                stack.append((p, i, state))
                state = new_state
                linearized |= 1 << i
                unlink(p)
                unlink(ret_pos[i])
                longest = max(longest, len(stack))
                p = head
            else:
                p = nxt[p]
        else:  # reached a return before its call was linearized: backtrack
            if not stack:
                return False, describe_failure(ops, longest)
            cp, i, state = stack.pop()
            linearized &= ~(1 << i)
            relink(ret_pos[i])
            relink(cp)
            p = nxt[cp]
    return True, None


def describe_failure(ops, longest):
    lines = ["no linearization (longest prefix %d of %d ops):" % (longest, len(ops))]
    for o in sorted(ops, key=lambda o: o.call)[:40]:
        lines.append("  c%s %s(%r%s) [%.6f, %s] -> %r" % (
            o.client, o.kind, o.key, "" if o.arg is None else ", %r" % (o.arg,),
            o.call, "?" if o.ret is None else "%.6f" % o.ret, o.result))
    return "\n".join(lines)


def check(history, initial=None):
    by_key = collections.defaultdict(list)
    for o in history:
        by_key[o.key].append(o)
    for key, ops in sorted(by_key.items(), key=lambda kv: repr(kv[0])):
        ok, info = check_key(ops, initial)
        if not ok:
            return False, "key %r: %s" % (key, info)
    return True, None


class Recorder:
    """Thread-safe history recorder for test clients."""

    def __init__(self, clock):
        import threading
        self.clock = clock
        self.lock = threading.Lock()
        self.ops = []

    def call(self):
        return self.clock()

    def done(self, client, kind, key, arg, call, result, unknown=False):
        ret = None if unknown else self.clock()
        with self.lock:
            self.ops.append(Op(client, kind, key, arg, call, ret, result))
