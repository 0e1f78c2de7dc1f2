"""Upstream FA4 compiles with fa4trace markers on the CPU: Blackwell (both decode paths) and Hopper.

Markers are attributed to warp roles by difference: the same kernel is compiled with every
role's event hooks on, and again with one role's off; the timer reads (``%clock64``) that
disappear are that role's markers. Each count must be at least the number of events the hooks
placed for that role while tracing (the compiler may duplicate a timer read, never drop one).
Each compile runs in a fresh process: the CuTe DSL fixes its target arch once per process.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl (pip install 'fa4trace[dsl]')")


def _fa4_skip_reason():
    try:
        from fa4trace.fa4 import FA4_VERSIONS, fa4_version
    except ImportError as e:  # pragma: no cover
        return f"fa4trace.fa4 does not import: {e}"
    v = fa4_version()
    if v is None:
        return "flash-attn-4 is not installed (pip install 'fa4trace[fa4]')"
    if v not in FA4_VERSIONS:
        return f"flash-attn-4 {v} is installed; the hooks are pinned to {FA4_VERSIONS}"
    try:
        import quack  # noqa: F401
    except ImportError as e:
        return f"flash-attn-4's dependency quack-kernels does not import ({e})"
    return None


_reason = _fa4_skip_reason()
pytestmark = pytest.mark.skipif(_reason is not None, reason=_reason or "")

CLOCK = re.compile(r"mov\.u64\s+%rd\d+,\s*%clock64;")
ENTRY = re.compile(r"kernel_cutlass_\w+")


def _worker(arch: str, schedule: str, variants: list) -> dict:
    """In a fresh process: compile each variant, return timer-read counts and trace-time counts.
    Kept in the PTX cache (conftest.PTX_CACHE) under a key of everything the compile reads: the
    fa4trace sources it traces, flash-attn-4's, quack's and the DSL's versions, the request."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "tools"))
    from compile_pool import SOURCES, cached_json, source_key
    from conftest import PTX_CACHE

    key = source_key(arch, SOURCES + ("fa4trace/fa4", "fa4trace/auto"),  # the adapter builds on fa4trace.auto
                     ("nvidia-cutlass-dsl", "flash-attn-4", "quack-kernels"), json.dumps([schedule, variants]))
    return cached_json(os.path.join(PTX_CACHE, "fa4", key + ".json"), lambda: _compile_fa4(arch, schedule, variants))


def _compile_fa4(arch: str, schedule: str, variants: list) -> dict:
    code = (
        "import json, sys, re\n"
        "from fa4trace.fa4.build import compile_fa4\n"
        "from fa4trace.fa4 import hooks\n"
        "arch, schedule, variants = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])\n"
        "res = {}\n"
        "for name, traced, events, *more in variants:\n"
        "    kw = dict(families=more[0]) if more else {}\n"
        "    if len(more) > 1: kw['cursor'] = more[1]\n"
        "    c = compile_fa4(arch, schedule=schedule, traced=traced, events=events, keep_ptx=True, **kw)\n"
        f"    ptx = c.ptx\n"
        f"    body = re.sub(r'{ENTRY.pattern}', 'K', ptx)\n"
        f"    res[name] = dict(clock=len(re.findall(r'{CLOCK.pattern}', ptx)), counts=c.counts,\n"
        "                     config=c.config, installed=hooks.installed(), ptx_len=len(ptx),\n"
        "                     body_hash=hash(body) if not traced else None, params=c.params,\n"
        "                     static_smem=len(re.findall(r'\\.shared \\.align \\d+ \\.b8 __static_shmem', ptx)),\n"
        "                     shared_b64_stores=len(re.findall(r'st\\.shared\\.[bu]64', ptx)),\n"
        "                     record_stores=ptx.count('st.global.L2::cache_hint'))\n"
        "print('RESULT' + json.dumps(res))\n"
    )
    env = dict(os.environ)
    env.pop("CUTE_DSL_ARCH", None)
    # -W error::UserWarning: compiling FA4 through fa4trace prints no warning (the DSL's about
    # FA4's aux_data argument is quieted in fa4trace.fa4.build; any other fails here)
    p = subprocess.run([sys.executable, "-W", "error::UserWarning", "-c", code, arch, schedule, json.dumps(variants)],
                       capture_output=True, text=True, env=env, timeout=900)
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT")]
    assert p.returncode == 0 and line, f"compile worker failed:\n{p.stderr[-4000:]}"
    return json.loads(line[-1][len("RESULT"):])


SM100_CHECKED = ["mma", "softmax", "load"]
ALL100 = ["load", "mma", "softmax", "correction", "epilogue"]


@pytest.mark.parametrize("schedule", ["pingpong", "base"])
def test_sm100_both_decode_paths_have_markers_in_mma_softmax_and_load_warps(schedule):
    variants = [["all", True, ALL100], ["plain", False, None]]
    variants += [[f"no_{r}", True, [x for x in ALL100 if x != r]] for r in SM100_CHECKED]
    res = _worker("sm100", schedule, variants)
    full = res["all"]
    assert full["config"]["s_ping_pong"] is (schedule == "pingpong")
    assert full["config"]["kernel_class"] == "FlashAttentionForwardSm100"
    assert res["plain"]["clock"] == 0, "FA4's own kernel reads no timer"
    assert full["params"][-1] == "fa4trace_buf" and "fa4trace_buf" not in res["plain"]["params"]
    for role in SM100_CHECKED:
        placed = full["counts"].get(role, 0)
        assert placed > 0, f"no {role} events placed on the {schedule} path: {full['counts']}"
        in_ptx = full["clock"] - res[f"no_{role}"]["clock"]
        assert in_ptx >= placed, f"{role} warp: {in_ptx} timer reads in PTX for {placed} events placed ({schedule})"
        # every event of these warps carries its KV block / Q stage (iter), on both paths
        assert full["counts"].get(f"{role}:iter") == placed, (role, full["counts"])
    assert not any(v["installed"] for v in res.values()), "hooks left installed after a compile"
    # SM100 keeps the cursor in the trace buffer: FA4's shared memory (near full there) is untouched
    assert full["config"]["cursor"] == "gmem" and full["static_smem"] == 0


def test_sm90_decode_has_markers_in_producer_and_consumer_warps():
    variants = [["all", True, ["producer", "consumer"]], ["plain", False, None],
                ["no_producer", True, ["consumer"]], ["no_consumer", True, ["producer"]],
                ["plain_again", False, None], ["generic", True, None, ["pipeline", "tma", "mma", "barrier"]],
                ["ring", True, None, ["pipeline", "tma", "mma", "barrier"], "ring"]]
    res = _worker("sm90", "pingpong", variants)
    full = res["all"]
    assert full["config"]["kernel_class"] == "FlashAttentionForwardSm90"
    assert full["config"]["intra_wg_overlap"], "FA4's default SM90 decode overlaps QK(i+1) with PV(i)"
    assert res["plain"]["clock"] == 0
    for role in ("producer", "consumer"):
        placed = full["counts"].get(role, 0)
        assert placed > 0, full["counts"]
        assert full["clock"] - res[f"no_{role}"]["clock"] >= placed
    # SM90 keeps each warp's cursor in 128 B of static shared memory (fa4trace.auto starts every
    # warp's recorder at kernel entry: one allocation)
    assert full["config"]["cursor"] == "smem" and full["static_smem"] == 1
    assert res["plain"]["static_smem"] == 0
    assert full["params"][-1] == "fa4trace_buf" and full["config"]["families"] == []
    # after a traced compile the hooks are gone: FA4 compiles to the same PTX as before it
    assert res["plain_again"]["body_hash"] == res["plain"]["body_hash"]
    # the generic families on top of FA4's hooks: FA4's events are placed as before, and the
    # generic layer finds every family (the consumers' barriers and pipeline waits record into
    # the segment FA4's hook opened around each KV block)
    gen = res["generic"]
    assert gen["counts"] == full["counts"] and gen["params"] == full["params"]
    assert gen["config"]["missing"] == [] and gen["clock"] > full["clock"]
    assert {"barrier", "pipeline", "tma", "mma"} <= set(gen["config"]["found"])
    names = {e["name"] for e in gen["config"]["vocab"]["events"]}
    assert {"QK", "PV", "SOFTMAX", "barrier.sync", "k.wait", "v.wait"} <= names, sorted(names)
    # the same with cursor="ring": FA4's hooks (their set_role, the segments the generic hooks
    # join) record into the warps' rings, every record a shared-memory store, one global record
    # store left (the copy at the warp's exit); the rings are a second static allocation
    ring = res["ring"]
    assert ring["config"]["cursor"] == "ring" and ring["counts"] == gen["counts"] and ring["clock"] == gen["clock"]
    assert ring["record_stores"] == 1 and ring["shared_b64_stores"] == gen["record_stores"] > 0
    assert ring["static_smem"] == 2 and gen["shared_b64_stores"] == 0


def test_unsupported_fa4_version_fails_with_one_line(monkeypatch):
    from fa4trace.fa4 import build
    from fa4trace.format.errors import Fa4traceError

    monkeypatch.setattr(build, "fa4_version", lambda: "4.0.0b99")
    with pytest.raises(Fa4traceError) as e:
        build.require_fa4()
    msg = str(e.value)
    assert "4.0.0b99" in msg and "4.0.0b36" in msg and "\n" not in msg


@pytest.mark.parametrize("name, module", [("compile_fa4", "build"), ("record", "run"), ("sm90_runner", "run")])
def test_the_packages_lazy_functions_pass_every_argument_through(monkeypatch, name, module):
    """``fa4trace.fa4``'s functions import their module on first use and call it: positional
    arguments included (`fa4trace record --impl fa4` passes the shape positionally; a wrapper
    that took keywords only crashed it)."""
    import importlib

    from fa4trace import fa4

    got = []
    monkeypatch.setattr(importlib.import_module(f"fa4trace.fa4.{module}"), name,
                        lambda *a, **kw: got.append((a, kw)) or "done")
    assert getattr(fa4, name)("shape", schedule="fa3") == "done"
    assert got == [(("shape",), {"schedule": "fa3"})]
