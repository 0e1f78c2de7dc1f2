"""The perturbation line on kernels whose CTAs wait on each other, on a real GPU.

A ticket kernel (tests/tools/ctadeps_kernels.py: each CTA takes a ticket from a global counter,
the last one does more) traced by ``fa4trace.instrument()``: its bundle says what the PTX holds
(``instrument.cta_dependencies``) and its perturbation line refuses the in-launch comparison; the
same for a plain copy kernel, whose comparison stands. Our split-KV decode kernel (its in-launch
combine takes tickets and polls the counter) from the AOT build of benchmarks/auto_kernels.py
($FA4TRACE_AUTO_BUILD, default build/auto), recording a sample of its CTAs: refused too.
"""

from __future__ import annotations

import math
import os
import sys
import warnings
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
BUILD = os.environ.get("FA4TRACE_AUTO_BUILD", "build/auto")


def _traced(name: str, n_ctas: int = 512):
    torch = pytest.importorskip("torch")
    pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl where the GPU is (pip install 'fa4trace[dsl]')")
    import cutlass.cute as cute
    from cutlass.cute.runtime import from_dlpack

    import fa4trace

    sys.path.insert(0, str(ROOT / "tests" / "tools"))
    import ctadeps_kernels as K

    entry, _kernel, counter = K.KERNELS[name]
    src = torch.randn(n_ctas * 128, device="cuda", dtype=torch.float32)
    dst = torch.empty_like(src)
    cnt = torch.zeros(4, device="cuda", dtype=torch.int32)
    args = [from_dlpack(src), from_dlpack(dst)] + ([from_dlpack(cnt)] if counter else [])
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with fa4trace.instrument(ctas=32, cta_stride=8) as rec:  # a sample spread over the grid: an in-launch comparison
            compiled = cute.compile(entry, *args)
            compiled(*args)
        torch.cuda.synchronize()
    # these kernels take no stream argument: they launch on stream 0, which a graph captured on
    # torch's stream does not hold. The twin is timed in batches on the default stream instead,
    # never from an empty graph (torch's warning about one would say so)
    assert not [w for w in said if "Graph is empty" in str(w.message)]
    assert torch.equal(dst, src * (2.0 if name == "plain" else 1.0))
    return rec.launched[-1].trace()


def test_a_ticket_kernels_bundle_refuses_the_in_launch_comparison():
    from fa4trace.analysis.fidelity import perturbation, perturbation_lines

    t = _traced("ticket")
    deps = t.meta["instrument"]["cta_dependencies"]
    assert deps["verdict"] == "waits_on_ctas" and deps["source"] == "plain build", deps
    assert "atom.global" in deps["found"]
    p = perturbation(t)
    assert p["measured"] and p["valid"] is False and p["headline_source"] != "in_launch"
    assert perturbation_lines(p)[0].startswith("not valid for this kernel: its CTAs wait on each other")


def test_a_copy_kernels_bundle_keeps_it():
    from fa4trace.analysis.fidelity import perturbation

    t = _traced("plain")
    assert t.meta["instrument"]["cta_dependencies"]["verdict"] == "none"
    p = perturbation(t)
    assert p["measured"] and p["valid"] is True and p["timed"]["recorded"] == 32
    from fa4trace.analysis.fidelity import plain_twin
    from fa4trace.trace.meta import BundleMeta

    tw = plain_twin(BundleMeta.from_meta(t.meta))
    assert tw is not None and tw["method"] == "batch", tw
    # 512 CTAs copying 256 KiB: microseconds, not the nothing an empty graph replays
    assert 1000 < tw["plain_ns"] < 200_000 and abs(tw["rel"]) < 1.0, tw


def test_our_split_kv_decode_bundle_refuses_it():
    if not os.path.isfile(os.path.join(BUILD, "manifest.json")):
        pytest.skip(f"no instrumented build at {BUILD} (python benchmarks/auto_kernels.py build -o {BUILD})")
    from fa4trace.auto.build import load
    from fa4trace.auto.run import RecordOptions
    from fa4trace.format.options import Sampling

    kern = load(BUILD, "decode_sm90_generic", options=RecordOptions(Sampling(ctas=16, cta_stride=8, capacity=4096)))
    if "cta_dependencies" not in kern.meta:
        pytest.skip(f"{BUILD} was built before fa4trace read the kernel's PTX: rebuild it")
    torch = pytest.importorskip("torch")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import auto_kernels as ak

    from fa4trace.analysis.fidelity import perturbation, perturbation_lines

    plan, sets, (lse, o_part, lse_part, count) = ak.decode_inputs(
        torch.cuda.get_device_properties(0).multi_processor_count, 1)
    q, k, v, o = sets[0]
    kern(q, k, v, o, lse, o_part, lse_part, count, *plan.kernel_args(1.0 / math.sqrt(ak.DECODE["d"])), None)
    t = kern.trace()
    assert t.meta["instrument"]["cta_dependencies"]["verdict"] == "waits_on_ctas"
    p = perturbation(t)
    print("\n".join(perturbation_lines(p)))
    assert p["valid"] is False and perturbation_lines(p)[0].startswith("not valid for this kernel")
