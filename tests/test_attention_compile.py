"""CPU: every decode-attention variant ``fa4trace build`` exports compiles for sm_90a; facts
read off its PTX.

Needs nvidia-cutlass-dsl (no GPU). The variants compile once per test run (the fixture
``attention_ptx`` in conftest.py, two worker processes); every test here reads that compile.
With ptxas on the PATH (or /usr/local/cuda/bin), the register / spill report of each is read
and written to artifacts/attention_compile_report.json, and spills fail the test.
"""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("cutlass")

from fa4trace.kernels.decode_spec import SCALAR_ARGS, TENSOR_ARGS, Variant, all_variants  # noqa: E402

from conftest import PDL_VARIANT, PTX_CACHE  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "tools"))
from compile_pool import cached_json  # noqa: E402

# What the fixture compiles: every exported variant but the PDL twins, and one of those.
VARIANTS = [v for v in all_variants() if not v.pdl or v.name == PDL_VARIANT]


def _id(v: Variant) -> str:
    return v.name.removeprefix("decode_attn_sm90_")


@pytest.fixture(scope="module")
def compiled(attention_ptx):
    return {v: attention_ptx[v.name] for v in VARIANTS}


def _ptxas():
    p = shutil.which("ptxas") or ("/usr/local/cuda/bin/ptxas" if os.path.exists("/usr/local/cuda/bin/ptxas") else None)
    return p


def _ptxas_report(ptx: str, tmp: str) -> dict:
    """ptxas -v of the PTX; an older ptxas gets the .version it supports (same instructions)."""
    exe = _ptxas()
    src = os.path.join(tmp, "k.ptx")
    for attempt in range(2):
        with open(src, "w") as f:
            f.write(ptx)
        res = subprocess.run([exe, "-arch=sm_90a", "-v", src, "-o", os.path.join(tmp, "k.cubin")],
                             capture_output=True, text=True)
        m = re.search(r"current version is '([0-9.]+)'", res.stderr)
        if res.returncode and m and attempt == 0:
            ptx = re.sub(r"^\.version [0-9.]+", f".version {m.group(1)}", ptx, count=1, flags=re.M)
            continue
        break
    assert res.returncode == 0, res.stderr[-500:]
    text = res.stderr + res.stdout
    regs = int(re.search(r"Used (\d+) registers", text).group(1))
    spill_st, spill_ld = map(int, re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text).groups())
    stack = int(re.search(r"(\d+) bytes stack frame", text).group(1))
    return {"registers": regs, "spill_stores": spill_st, "spill_loads": spill_ld, "stack_frame": stack,
            "ptxas": subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1],
            "warnings": [ln for ln in text.splitlines() if "warning" in ln.lower()],
            # e.g. C7514: a wgmma result read (or left unread) where ptxas cannot prove the
            # pipeline: it then waits after every wgmma of the kernel (no QK/softmax overlap).
            "wgmma_serialized": [ln for ln in text.splitlines() if "Potential Performance Loss" in ln]}


@pytest.mark.parametrize("variant", VARIANTS, ids=_id)
def test_variant_compiles_with_wgmma_and_tma(compiled, variant):
    ptx = compiled[variant]["ptx"]
    assert ".target sm_90a" in ptx
    d, sched = variant.head_dim, variant.schedule
    n_wgmma = ptx.count("wgmma.mma_async")
    assert n_wgmma >= d // 16 + 2, n_wgmma  # at least one QK (d/16 k-steps) and PV
    assert "wgmma.wait_group" in ptx
    assert "cp.async.bulk.tensor" in ptx  # TMA for K and V
    assert "ld.local" not in ptx and "st.local" not in ptx  # no register array went to the stack
    # the ping-pong and intrawg keep two groups in flight: some wait must leave one pending
    has_wait1 = re.search(r"wgmma\.wait_group\.sync\.aligned\s+1;", ptx) is not None
    assert has_wait1 == (sched != "base")


@pytest.mark.parametrize("variant", VARIANTS, ids=_id)
def test_tracing_off_reads_no_timer_and_on_reads_both(compiled, variant):
    ptx = compiled[variant]["ptx"]
    reads = {t: len(re.findall(rf"mov\.u64\s+%rd\d+,\s*{t}", ptx)) for t in ("%globaltimer", "%clock64")}
    # events staged in shared memory read the 32-bit %clock (records keep its low 32 bits)
    reads["%clock"] = len(re.findall(r"mov\.u32\s+%r\d+,\s*%clock;", ptx))
    if variant.traced:
        assert reads["%globaltimer"] >= 2 and reads["%clock64"] >= 2 and reads["%clock"] >= 20, reads
    else:
        assert "%globaltimer" not in ptx and "%clock" not in ptx, reads


@pytest.mark.parametrize("variant", VARIANTS, ids=_id)
def test_stage_probe_never_blocks_and_q_goes_first(compiled, variant):
    """With the stall events, the probe that decides whether a WAIT_K / WAIT_V is recorded is
    mbarrier.test_wait: try_wait may suspend until the stage lands and then report it ready,
    which hid every wait. Untraced and with the core events, no probe at all. Either way the
    consumers arrive on the Q barrier (id 2, all 160 threads) that the producer waits on before
    its first KV load."""
    ptx = compiled[variant]["ptx"]
    assert ("mbarrier.test_wait" in ptx) == (variant.events == "stalls")
    assert re.search(r"bar(rier)?(\.cta)?\.arrive(\.aligned)?\s+2,\s*160;", ptx), "no arrive on the Q barrier"
    assert re.search(r"bar(rier)?(\.cta)?\.sync(\.aligned)?\s+2,\s*160;", ptx), "producer does not wait for Q"
    # one release for the combine ticket: an acq_rel atomic, no separate gpu fence before it
    if ptx.count("atom.acq_rel.gpu") or ptx.count("atom.global.acq_rel.gpu"):
        assert "fence.acq_rel.gpu" not in ptx


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v.block_rows == 32 and not v.pdl], ids=_id)
def test_32_row_ctas_emit_the_softmax_for_one_row_per_thread(compiled, variant):
    """r32: one row per thread, so about half the exp2 of the 64-row variant (the padding row
    keeps one multiply per element so that ptxas keeps the wgmma async; checked above)."""
    import dataclasses

    ex2 = {rows: compiled[dataclasses.replace(variant, block_rows=rows)]["ptx"].count("ex2.approx")
           for rows in (64, 32)}
    assert ex2[32] <= 0.65 * ex2[64], ex2  # the combine and the last block add a fixed part


def test_every_variant_fits_the_shared_memory_of_one_cta(compiled):
    """As many K+V stages as fit (``default_stages``): each variant's shared storage stays within
    sm_90's 227 KB per block and holds at least two stages."""
    from fa4trace.kernels.attention_sm90 import SMEM_BUDGET

    for v, r in compiled.items():
        assert r["config"]["smem_bytes"] <= SMEM_BUDGET, (v.name, r["config"])
        assert r["config"]["num_stages"] >= 2, (v.name, r["config"])


@pytest.mark.skipif(_ptxas() is None, reason="no ptxas to read the resource report")
def test_resource_report_has_no_spills(compiled, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    def one(r):
        # a report is a function of the PTX and the ptxas that reads it: kept beside the compiles
        ver = subprocess.run([_ptxas(), "--version"], capture_output=True, text=True).stdout
        key = hashlib.sha256((ver + r["ptx"]).encode()).hexdigest()
        work = os.path.join(str(tmp_path), r["name"])
        os.makedirs(work, exist_ok=True)
        return cached_json(os.path.join(PTX_CACHE, "ptxas", key + ".json"), lambda: _ptxas_report(r["ptx"], work))

    with ThreadPoolExecutor(2) as pool:  # ptxas runs as a subprocess: two at a time on two cores
        reps = list(pool.map(one, compiled.values()))
    report = {r["name"]: {**r["config"], **rep, "compile_s": round(r["compile_s"], 1)}
              for r, rep in zip(compiled.values(), reps)}
    os.makedirs("artifacts", exist_ok=True)
    with open("artifacts/attention_compile_report.json", "w") as f:
        json.dump(report, f, indent=1, sort_keys=True)
    for name, rep in sorted(report.items()):
        print(f"{name:44s} regs={rep['registers']:3d} spill={rep['spill_stores']}/{rep['spill_loads']} "
              f"stack={rep['stack_frame']} tile_n={rep['tile_n']} stages={rep['num_stages']}")
    bad = {n: r for n, r in report.items() if r["spill_stores"] or r["spill_loads"] or r["stack_frame"]}
    assert not bad, bad
    serialized = {n: r["wgmma_serialized"] for n, r in report.items() if r["wgmma_serialized"]}
    assert not serialized, serialized
    assert all(r["registers"] <= 255 for r in report.values())


def test_scalar_arguments_match_the_plan():
    from fa4trace import attention as A
    from fa4trace.kernels.attention_sm90 import fake_arguments

    plan = A.plan_splits(A.Shape(1, 1, 16, 1, 131072, 128, "bf16"), 64, 132)
    assert len(plan.kernel_args(1.0)) == len(SCALAR_ARGS)
    assert len(fake_arguments(128, "bf16", False)) == len(TENSOR_ARGS) + len(SCALAR_ARGS) + 2  # + trace, stream


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v.pdl], ids=_id)
def test_pdl_variant_waits_for_the_previous_grid_before_any_memory_access(compiled, variant):
    """pdl: griddepcontrol.wait before the first global access (the prefetch of the TMA
    descriptors reads only the kernel's parameters) and launch_dependents after the mainloop;
    its non-PDL twin has neither."""
    import dataclasses

    plain = compiled[dataclasses.replace(variant, pdl=False)]["ptx"]
    ptx = compiled[variant]["ptx"]
    body = ptx[ptx.index(".entry"):]
    assert "griddepcontrol" not in plain
    assert compiled[variant]["config"]["pdl"] is True
    wait, launch = body.index("griddepcontrol.wait"), body.index("griddepcontrol.launch_dependents")
    first_global = min(i for i in (body.find("ld.global"), body.find("ld.relaxed"), body.find("st.global"),
                                   body.find("atom.global"), body.find("cp.async.bulk.tensor"),
                                   body.find("cp.async.bulk.prefetch")) if i >= 0)
    assert wait < first_global < launch
    assert ptx.count("griddepcontrol.wait") == 1


def test_every_untraced_variant_has_a_pdl_twin_and_no_traced_one_has():
    names = [v.name for v in all_variants()]
    untraced = [n for n in names if "_traced" not in n and not n.endswith("_pdl")]
    assert sorted(n for n in names if n.endswith("_pdl")) == sorted(n + "_pdl" for n in untraced)
    assert not any("_traced" in n and "pdl" in n for n in names)


@pytest.mark.parametrize("variant", VARIANTS, ids=_id)
def test_consumers_prefetch_the_first_kv_tiles_after_releasing_the_producer(compiled, variant):
    """The launch-time L2 prefetch (``prefetch_kv``): PREFETCH_TILES request sites of
    cp.async.bulk.prefetch.L2 with a cache policy, issued after the consumers' arrive on the
    Q barrier (issuing them stalls a warp; before the arrive the producer waited for that,
    +2..+12% on the H200) and before the Q tile is stored and the consumers sync on it."""
    from fa4trace.kernels.attention_sm90 import PREFETCH_TILES

    body = compiled[variant]["ptx"]
    body = body[body.index(".entry"):]
    sites = [m.start() for m in re.finditer(r"cp\.async\.bulk\.prefetch\.L2\.global\.L2::cache_hint", body)]
    assert len(sites) == PREFETCH_TILES
    arrive = re.search(r"bar(rier)?(\.cta)?\.arrive(\.aligned)?\s+2,\s*160;", body).start()
    q_sync = re.search(r"bar(rier)?(\.cta)?\.sync(\.aligned)?\s+1,\s*128;", body).start()
    assert arrive < min(sites) and max(sites) < q_sync
