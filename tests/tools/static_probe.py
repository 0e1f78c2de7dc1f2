"""`fa4trace sass`'s static footprint of our decode kernel and a small user kernel (sm_90a),
compiled in this fresh process (no GPU), disassembled with the nvdisasm named; prints one JSON
line: the report, whether it reads back from its file unchanged, and how many SASS files it kept.

    python tests/tools/static_probe.py NVDISASM NVDISASM_VERSION

The version is only part of the arguments (the PTX cache's key): a report is a function of the
sources, the packages and the disassembler that read the cubins.
"""

import json
import os
import sys
import tempfile
from pathlib import Path

USER_KERNEL = '''
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.cute.runtime import make_fake_compact_tensor


@cute.kernel
def kernel(dst: cute.Tensor, n: Int32):
    for i in cutlass.range(n, unroll=1):
        dst[i] = dst[i] * 2.0 + 1.0


@cute.jit
def entry(dst: cute.Tensor, n: Int32):
    kernel(dst, n).launch(grid=(1, 1, 1), block=(64, 1, 1))


def make():
    return entry, (make_fake_compact_tensor(Float32, (cute.sym_int(),), assumed_align=16), Int32(8))
'''


def main() -> None:
    nvdisasm = sys.argv[1]
    os.environ["PATH"] = os.path.dirname(nvdisasm) + os.pathsep + os.environ.get("PATH", "")
    from fa4trace.bench import static
    from fa4trace.bench.staticbuild import parse_target

    with tempfile.TemporaryDirectory(prefix="fa4trace_static_") as d:
        user = Path(d) / "user_kernel.py"
        user.write_text(USER_KERNEL)
        targets = parse_target("decode") + parse_target(f"{user}:make", ("sm_90a",), families=())
        doc = static.run(targets, out=str(Path(d) / "r.json"), keep=str(Path(d) / "sass"))
        print(json.dumps({"doc": doc, "reloaded_rows_equal": static.load(Path(d) / "r.json")["rows"] == doc["rows"],
                          "sass_files": len(list((Path(d) / "sass").glob("*.sass")))}))


if __name__ == "__main__":
    main()
