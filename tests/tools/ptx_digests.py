"""Digest the PTX of every kernel variant ``fa4trace build`` exports, to prove a refactor left them alone.

    python tests/tools/ptx_digests.py --arch sm_90a -o before.json      # on the old commit
    python tests/tools/ptx_digests.py --arch sm_90a -o after.json --against before.json

Compiles each variant (no GPU needed), drops what does not reach the GPU (``.loc`` / ``.file``
debug lines, comments, the module's own file names), and keys the sha256 of the rest by the
variant's name. ``--against`` prints every variant whose digest changed, appeared or vanished and
exits 1 if any changed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor


def normalize(ptx: str) -> str:
    keep = []
    for line in ptx.splitlines():
        s = line.strip()
        if not s or s.startswith("//") or s.startswith(".loc") or s.startswith(".file"):
            continue
        keep.append(re.sub(r"\s*//.*$", "", line))
    return "\n".join(keep)


def _worker_init(arch: str, dump_dir: str) -> None:
    """The DSL reads these once, at its first import: set them before it in every worker."""
    os.environ["CUTE_DSL_ARCH"] = arch
    os.environ["CUTE_DSL_KEEP"] = "ptx"
    os.environ["CUTE_DSL_DUMP_DIR"] = dump_dir


def _digest_one(arch: str, name: str) -> tuple[str, str, int]:
    from fa4trace import kernels

    for n, thunk, _entry in kernels.aot_variants(arch):
        if n == name:
            text = normalize(thunk().artifacts.PTX)
            return name, hashlib.sha256(text.encode()).hexdigest(), len(text)
    raise KeyError(name)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--against", help="a digest file to compare with")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--only", help="a substring of the variant names to digest")
    args = ap.parse_args(argv)
    dump = tempfile.mkdtemp(prefix="ptx_digests_")
    _worker_init(args.arch, dump)  # workers fork from here, after the DSL's first import
    from fa4trace import kernels

    names = [n for n, _t, _e in kernels.aot_variants(args.arch) if not args.only or args.only in n]
    out = {}
    with ProcessPoolExecutor(args.jobs) as pool:
        for i, (name, sha, size) in enumerate(pool.map(_digest_one, [args.arch] * len(names), names), 1):
            out[name] = {"sha256": sha, "chars": size}
            print(f"{i}/{len(names)} {name} {sha[:12]}", file=sys.stderr)
    shutil.rmtree(dump, ignore_errors=True)
    with open(args.out, "w") as f:
        json.dump({"arch": args.arch, "variants": out}, f, indent=1, sort_keys=True)
    if not args.against:
        return 0
    with open(args.against) as f:
        before = json.load(f)["variants"]
    changed = sorted(n for n in out if n in before and out[n]["sha256"] != before[n]["sha256"])
    for n in changed:
        print(f"CHANGED {n}")
    for n in sorted(set(before) - set(out)):
        print(f"GONE    {n}")
    for n in sorted(set(out) - set(before)):
        print(f"NEW     {n}")
    same = sum(1 for n in out if n in before and out[n]["sha256"] == before[n]["sha256"])
    print(f"{same} identical, {len(changed)} changed, {len(set(before) - set(out))} gone, "
          f"{len(set(out) - set(before))} new")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
