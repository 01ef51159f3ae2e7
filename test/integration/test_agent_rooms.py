"""The agent's rooms, as src/agent/agent_int.h draws them: the calls
between the agent's files (read from their objects: which file defines
each agent_ symbol another one uses) are exactly the list agent_int.h
documents, and that list has no circle; each part's struct embedded in
struct agent is touched only by the file agent_int.h names beside it
(others pass it to that file's functions, never read or keep its
fields)."""
import os
import re
import subprocess

import mctest
from mctest import case, eq

SRC = os.path.join(mctest.ROOT, "src", "agent")
OBJ = os.path.join(mctest.BUILD, "obj", "agent")
AGENT_INT = os.path.join(SRC, "agent_int.h")


def sources():
    return sorted(f for f in os.listdir(SRC) if f.endswith(".c"))


def documented_calls():
    """{file: set of files it calls} from agent_int.h's opening comment."""
    text = open(AGENT_INT).read()
    block = text[text.index("Calls between the files"):text.index("Everything runs")]
    graph, cur = {}, None
    for line in block.splitlines():
        line = line.lstrip(" *")
        m = re.match(r"([\w.]+(?:, [\w.]+)*) +-> (.*)$", line)
        if m:
            names = [n.strip() for n in m.group(1).split(",")]
            callees = m.group(2).split()
            cur = None
            for n in names:
                graph[n] = set() if callees == ["nothing"] else {c + ".c" for c in callees}
            if len(names) == 1 and callees != ["nothing"]:
                cur = names[0]
        elif cur and re.match(r"^[a-z_ ]+$", line) and line.strip():
            graph[cur] |= {c + ".c" for c in line.split()}
        else:
            cur = None
    return graph


def object_calls():
    """{file: set of files it calls} from the objects' symbols."""
    defined, used = {}, {}
    for src in sources():
        obj = os.path.join(OBJ, src[:-2] + ".o")
        assert os.path.exists(obj), "%s missing: build first" % obj
        out = subprocess.run(["nm", obj], capture_output=True, text=True, check=True).stdout
        used[src] = set()
        for line in out.splitlines():
            f = line.split()
            if len(f) == 3 and f[1] in "TDBRC" and f[2].startswith("agent_"):
                defined[f[2]] = src
            elif len(f) == 2 and f[0] == "U" and f[1].startswith("agent_"):
                used[src].add(f[1])
    return {src: {defined[s] for s in syms if s in defined and defined[s] != src}
            for src, syms in used.items()}


def circles(graph):
    found, state = [], {}

    def visit(n, path):
        state[n] = "open"
        for m in sorted(graph.get(n, ())):
            if state.get(m) == "open":
                found.append(path[path.index(m):] + [m])
            elif m not in state:
                visit(m, path + [m])
        state[n] = "done"

    for n in sorted(graph):
        if n not in state:
            visit(n, [n])
    return found


@case
def the_calls_between_files_are_the_documented_ones():
    doc, got = documented_calls(), object_calls()
    eq(sorted(doc), sources(), "agent_int.h lists every file of src/agent")
    for src in sources():
        eq(sorted(got[src]), sorted(doc[src]), "the files %s calls" % src)


@case
def the_calls_have_no_circle():
    eq(circles(documented_calls()), [], "circles between the agent's files")
    eq(circles({"a.c": {"b.c"}, "b.c": {"a.c"}}), [["a.c", "b.c", "a.c"]],
       "(the check finds one)")


@case
def each_room_is_touched_by_its_own_file_only():
    text = open(AGENT_INT).read()
    body = text[text.index("struct agent {"):]
    rooms = dict((m.group(1), m.group(2)) for m in
                 re.finditer(r"struct agent_\w+ (\w+);\s*/\* (\w+\.c) \*/", body))
    assert len(rooms) >= 10, rooms
    bad = []
    for src in sources():
        code = open(os.path.join(SRC, src)).read()
        for member, owner in rooms.items():
            if src == owner:
                continue
            # A field read or written (a->space.gen), or the struct kept
            # for later use (x = &a->space;); passing &a->pool to a
            # function of pool.c is the way in.
            pat = r"->%s\s*(\.|->)|=\s*&\s*\w+->%s\s*;" % (member, member)
            for m in re.finditer(pat, code):
                line = code.count("\n", 0, m.start()) + 1
                bad.append("%s:%d reaches into %s's %s" % (src, line, owner, member))
    eq(bad, [], "fields of another file's room")


mctest.main()
