"""Compile kernels with fa4trace.auto.compiler.compile_traced in this (fresh) process and print,
per kernel, the ``cta_dependencies`` its meta holds (one JSON line, last):

    python tests/tools/ctadeps_probe.py sm_90a plain ticket spin reduce cluster [--no-check] [--options none|bracket]
    python tests/tools/ctadeps_probe.py sm_90a decode quack_static quack_dynamic
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "benchmarks"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("arch")
    ap.add_argument("kernels", nargs="+")
    ap.add_argument("--no-check", action="store_true", help="no plain build: the traced build's PTX is read")
    ap.add_argument("--options", default="string", choices=["string", "none", "bracket"],
                    help="small kernels: options='' (string), no options (none), or cute.compile[EnableTVMFFI] (bracket)")
    a = ap.parse_args()
    os.environ["CUTE_DSL_ARCH"] = a.arch
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_compact_tensor

    from fa4trace.auto.compiler import compile_traced

    out = {}
    for name in a.kernels:
        if name == "decode":  # our decode kernel, split-KV with its in-launch combine (a counter)
            import auto_kernels as ak

            c, _variant = ak.compile_decode(check=not a.no_check)
        elif name in ("quack_static", "quack_dynamic"):
            import auto_kernels as ak

            c = ak.compile_quack_gemm(arch=a.arch, check=not a.no_check, dynamic=name == "quack_dynamic")
        else:
            import ctadeps_kernels as K

            entry, kern, counter = K.KERNELS[name]
            t = make_fake_compact_tensor(cutlass.Float32, (cute.sym_int(),), assumed_align=16)
            args = (t, t) + ((make_fake_compact_tensor(cutlass.Int32, (cute.sym_int(),), assumed_align=16),)
                             if counter else ())
            kw = {"options": ""} if a.options == "string" else {}
            if a.options == "bracket":
                from cutlass.base_dsl.compiler import EnableTVMFFI

                kw["compile_fn"] = cute.compile[EnableTVMFFI]
            c = compile_traced(entry, *args, kernels=[kern], check=not a.no_check, **kw)
        out[name] = {"deps": c.meta["cta_dependencies"], "plain_ptx": bool(getattr(c.plain, "__ptx__", None)),
                     "traced_ptx": bool(c.ptx)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
