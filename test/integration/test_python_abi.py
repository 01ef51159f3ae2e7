"""The Python package's ctypes mirrors of libmooncake's structs lay out
as the C compiler lays out the structs of mooncake.h: the same size and
every field at the same offset. A field added to a struct on one side
only would otherwise let the library write past the Python object (or
read the wrong field) without an error anywhere.

A small C program, compiled here against src/client/mooncake.h with the
compiler the build uses, prints sizeof and offsetof of every field that
the Python classes name; a field of the C struct that Python lacks shows
as a size that differs.
"""
import ctypes
import os
import subprocess
import tempfile

import storetest  # noqa: F401 - python/ on the path
import mctest
from mctest import case, eq

from mooncake import _native as n

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Python class -> C struct of mooncake.h.
MIRRORS = {
    n.OpenOpts: "mc_open_opts",
    n.GetOpts: "mc_get_opts",
    n.PutOpts: "mc_put_opts",
    n.Part: "mc_part",
    n.RangeReq: "mc_range_req",
    n.SegmentInfo: "mc_segment_info",
    n.Replica: "mc_replica",
    n.AgentStats: "mc_agent_stats",
    n.TransferReq: "mc_transfer_req",
}


def c_layout():
    """{struct: (size, {field: offset})} as the C compiler has it."""
    lines = ["#include <stddef.h>", "#include <stdio.h>", '#include "mooncake.h"',
             "int main(void) {"]
    for cls, cname in MIRRORS.items():
        lines.append('printf("%s #size %%zu\\n", sizeof(struct %s));' % (cname, cname))
        for f in cls._fields_:
            lines.append('printf("%s %s %%zu\\n", offsetof(struct %s, %s));'
                         % (cname, f[0], cname, f[0]))
    lines.append("return 0; }")
    tmp = tempfile.TemporaryDirectory()
    src = os.path.join(tmp.name, "layout.c")
    exe = os.path.join(tmp.name, "layout")
    with open(src, "w") as fp:
        fp.write("\n".join(lines) + "\n")
    cc = os.environ.get("CC", "cc")
    r = subprocess.run([cc, "-std=c11", "-I", os.path.join(ROOT, "src", "client"), "-o", exe,
                        src], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, "the layout program does not compile: " + r.stderr
    out = subprocess.run([exe], capture_output=True, text=True, timeout=10, check=True).stdout
    tmp.cleanup()
    layout = {}
    for line in out.splitlines():
        cname, field, value = line.split()
        size, fields = layout.setdefault(cname, [0, {}])
        if field == "#size":
            layout[cname][0] = int(value)
        else:
            fields[field] = int(value)
    return layout


@case
def every_mirror_has_its_structs_layout():
    layout = c_layout()
    eq(sorted(layout), sorted(MIRRORS.values()), "every struct measured")
    for cls, cname in MIRRORS.items():
        size, fields = layout[cname]
        for f in cls._fields_:
            eq(getattr(cls, f[0]).offset, fields[f[0]],
               "offset of %s.%s (Python %s)" % (cname, f[0], cls.__name__))
        eq(ctypes.sizeof(cls), size, "size of struct %s (Python %s)" % (cname, cls.__name__))


@case
def every_struct_of_the_header_has_a_mirror_or_a_reason():
    """A struct of mooncake.h passed by pointer that Python does not mirror
    is one Python does not use; name it here when it is added."""
    with open(os.path.join(ROOT, "src", "client", "mooncake.h")) as fp:
        text = fp.read()
    import re
    declared = set(re.findall(r"^struct (mc_[a-z_]+) \{", text, re.M))
    eq(sorted(declared - set(MIRRORS.values())), [], "structs without a Python mirror")


mctest.main()
