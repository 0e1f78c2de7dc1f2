"""Digest the PTX of every kernel variant ``fa4trace build`` exports, to prove a refactor left them alone.

    python tests/tools/ptx_digests.py --arch sm_90a -o before.json      # on the old commit
    python tests/tools/ptx_digests.py --arch sm_90a -o after.json --against before.json

Compiles each variant (no GPU needed; ``compile_pool``), drops what does not reach the GPU
(``.loc`` / ``.file`` debug lines and comments), and keys the sha256 of the rest by the
variant's name. ``--against`` prints every variant whose digest changed, appeared or vanished
and exits 1 if any changed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compile_pool import compile_all, variant_names  # noqa: E402


def normalize(ptx: str) -> str:
    keep = []
    for line in ptx.splitlines():
        s = line.strip()
        if not s or s.startswith("//") or s.startswith(".loc") or s.startswith(".file"):
            continue
        keep.append(re.sub(r"\s*//.*$", "", line))
    return "\n".join(keep)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--against", help="a digest file to compare with")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--only", help="a substring of the variant names to digest")
    args = ap.parse_args(argv)
    names = [n for n in variant_names(args.arch) if not args.only or args.only in n]

    def progress(i, n, r):
        print(f"{i}/{n} {r['name']} {r['compile_s']:.1f} s", file=sys.stderr)

    out = {}
    for name, r in compile_all(args.arch, names, args.jobs, progress).items():
        text = normalize(r["ptx"])
        out[name] = {"sha256": hashlib.sha256(text.encode()).hexdigest(), "chars": len(text)}
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
