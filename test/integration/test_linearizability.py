"""The linearizability checker itself, on histories whose answer is known."""
import random

import mctest
from mctest import case, eq
from linearizability import Op, check


def op(client, kind, key, arg, call, ret, result=None):
    return Op(client, kind, key, arg, call, ret, result)


@case
def sequential_history_is_linearizable():
    h = [op(1, "put", "k", "a", 0, 1), op(1, "get", "k", None, 2, 3, "a"),
         op(1, "delete", "k", None, 4, 5), op(1, "get", "k", None, 6, 7, None)]
    eq(check(h)[0], True, "sequential")


@case
def stale_read_after_write_is_not():
    h = [op(1, "put", "k", "a", 0, 1), op(1, "put", "k", "b", 2, 3),
         op(2, "get", "k", None, 4, 5, "a")]
    ok, info = check(h)
    eq(ok, False, "stale read")
    assert "no linearization" in info, info


@case
def concurrent_read_may_see_either():
    h = [op(1, "put", "k", "a", 0, 1), op(1, "put", "k", "b", 2, 6),
         op(2, "get", "k", None, 3, 4, "a"), op(3, "get", "k", None, 3, 5, "b")]
    eq(check(h)[0], True, "overlapping reads")
    # ...but once one reader saw b, a later reader may not see a.
    h.append(op(4, "get", "k", None, 5.5, 5.8, "a"))
    eq(check(h)[0], False, "new-old inversion")


@case
def unknown_outcome_may_or_may_not_apply():
    h = [op(1, "put", "k", "a", 0, 1), op(2, "put", "k", "b", 2, None),
         op(3, "get", "k", None, 3, 4, "b"), op(3, "get", "k", None, 5, 6, "b")]
    eq(check(h)[0], True, "timed-out put took effect")
    h2 = [op(1, "put", "k", "a", 0, 1), op(2, "put", "k", "b", 2, None),
          op(3, "get", "k", None, 3, 4, "a")]
    eq(check(h2)[0], True, "timed-out put did not (yet)")
    h3 = h + [op(3, "get", "k", None, 7, 8, "a")]
    eq(check(h3)[0], False, "a value that was overwritten comes back")


@case
def cas_semantics():
    h = [op(1, "put", "k", "a", 0, 1),
         op(2, "cas", "k", ("a", "b"), 2, 3, True),
         op(3, "cas", "k", ("a", "c"), 2.5, 3.5, True)]
    eq(check(h)[0], False, "two CAS from the same value both succeed")
    h[2] = op(3, "cas", "k", ("a", "c"), 2.5, 3.5, False)
    eq(check(h)[0], True, "one succeeds")


@case
def keys_are_independent():
    h = [op(1, "put", "x", 1, 0, 1), op(2, "put", "y", 2, 0, 1),
         op(1, "get", "y", None, 2, 3, 2), op(2, "get", "x", None, 2, 3, 1)]
    eq(check(h)[0], True, "two keys")


@case
def random_linearizable_histories_pass():
    # Build histories from a real sequential execution with random,
    # overlapping intervals around each linearization point.
    rnd = random.Random(7)
    for trial in range(50):
        state = None
        h = []
        t = 0.0
        for i in range(40):
            t += rnd.random()
            kind = rnd.choice(["put", "get", "get", "cas", "delete"])
            if kind == "put":
                state, res, arg = "v%d" % i, None, "v%d" % i
            elif kind == "get":
                res, arg = state, None
            elif kind == "cas":
                arg = (state if rnd.random() < 0.5 else "zz", "c%d" % i)
                res = state == arg[0]
                if res:
                    state = arg[1]
            else:
                state, res, arg = None, None, None
            call = t - rnd.random() * 2
            ret = t + rnd.random() * 2
            if kind != "get" and rnd.random() < 0.1:
                ret, res = None, None  # outcome unknown to the client
            h.append(op(i % 5, kind, "k", arg, call, ret, res))
        ok, info = check(h)
        assert ok, "trial %d: %s" % (trial, info)


mctest.main()
