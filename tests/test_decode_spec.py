"""The decode kernel's spec (``fa4trace.kernels.decode_spec``): the variants a build holds, their
names and manifest configs, the event sets, and how the loader finds a variant in a build
folder (CPU only: no library is loaded)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from fa4trace import attention as A
from fa4trace.format.errors import Fa4traceError
from fa4trace.format.vocab import VOCAB
from fa4trace.kernels import decode_spec as S
from fa4trace.run import aot, loader

ROOT = Path(__file__).resolve().parents[1]


def test_every_variant_has_its_own_name_and_the_build_holds_what_the_api_reaches():
    vs = S.all_variants()
    assert len({v.name for v in vs}) == len(vs) == 2 * 3 * 2 * 4 * 2  # d, schedule, dtype, mode, rows
    assert {(v.events, v.pdl) for v in vs} == {(None, False), (None, True), ("core", False), ("stalls", False)}
    assert S.Variant(128, "pingpong").name == "decode_attn_sm90_d128_pingpong_bf16"
    assert S.Variant(64, "base", "fp16", 32, "core").name == "decode_attn_sm90_d64_base_fp16_r32_traced"
    assert S.Variant(128, "intrawg", block_rows=32, events="stalls").name == \
        "decode_attn_sm90_d128_intrawg_bf16_r32_traced_stalls"
    assert S.Variant(64, "pingpong", pdl=True).name == "decode_attn_sm90_d64_pingpong_bf16_pdl"


def test_a_variant_config_says_what_was_compiled():
    cfg = S.Variant(128, "pingpong", "bf16", 32, "core").config()
    assert cfg["head_dim"] == 128 and cfg["schedule"] == "pingpong" and cfg["block_rows"] == 32
    assert cfg["traced"] is True and cfg["events"] == "core" and cfg["tile_n"] == 64
    assert cfg["args"].endswith(",trace") and cfg["warps_per_cta"] == S.WARPS_PER_CTA == 5
    assert not S.Variant(128, "base").config()["args"].endswith(",trace")


@pytest.mark.parametrize("kw, needle", [
    ({"head_dim": 96}, "head_dim must be one of 64, 128"),
    ({"schedule": "fa3"}, "schedule must be one of"),
    ({"dtype": "fp8"}, "dtype must be one of"),
    ({"block_rows": 16}, "block_rows must be one of"),
    ({"events": "all"}, "trace_events must be one of core, stalls"),
    ({"events": "core", "pdl": True}, "pdl=True runs the uninstrumented kernel only"),
])
def test_a_variant_outside_the_build_is_one_line(kw, needle):
    args = {"head_dim": 128, "schedule": "pingpong", **kw}
    with pytest.raises(ValueError, match=needle):
        S.Variant(**args)


def test_event_sets():
    """"core" is the schedule's vocabulary; "stalls" adds the consumer's K/V waits, nothing else."""
    core = {VOCAB.event(i).name for i in S.event_ids("core")}
    stalls = {VOCAB.event(i).name for i in S.event_ids("stalls")}
    assert {"LOAD_Q", "LOAD_K", "LOAD_V", "QK", "PV", "SOFTMAX", "CORRECTION", "EPILOGUE", "COMBINE"} <= core
    assert not core & {"WAIT_K", "WAIT_V"}
    assert stalls - core == {"WAIT_K", "WAIT_V"}
    assert S.Variant(64, "base", events="core").event_ids == S.event_ids("core")
    assert S.Variant(64, "base").event_ids is None


def test_the_kernel_imports_the_spec_and_nothing_of_the_host_api():
    """kernels/attention_sm90.py reads its constants from decode_spec; of fa4trace it imports
    only the device recorder and the format (the host imports the kernel, not the reverse)."""
    tree = ast.parse((ROOT / "kernels" / "attention_sm90.py").read_text())
    mods = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 0}
    mods |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert {m for m in mods if m.startswith("fa4trace")} <= {"fa4trace.device", "fa4trace.format.vocab",
                                                            "fa4trace.format.entry"}
    rel = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 1}
    assert rel == {"decode_spec"}
    spec = ast.parse((ROOT / "kernels" / "decode_spec.py").read_text())
    spec_mods = {n.module for n in ast.walk(spec) if isinstance(n, ast.ImportFrom)}
    assert spec_mods <= {"__future__", "dataclasses", "typing", "fa4trace.format.vocab"}


@pytest.fixture
def build(tmp_path, monkeypatch):
    """A build folder holding every variant's manifest entry (no library: functions return their names)."""
    monkeypatch.setattr(aot.BuildDir, "function", lambda self, name: name)
    monkeypatch.setenv("FA4TRACE_BUILD", str(tmp_path))
    aot.write_manifest(tmp_path, "sm_90a", {v.name: {"kind": "attention", "config": v.config()}
                                            for v in S.all_variants()})
    return tmp_path


def test_the_loader_finds_each_variant_by_name(build):
    for v in S.all_variants():
        got = loader.load("attention", name=v.name, build=build)
        assert got.fn == v.name and got.config == v.config() and got.how == f"aot:{build}"


def test_the_api_picks_the_variant_of_a_shape():
    s = A.Shape(1, 1, 16, 1, 4096, 128, "bf16")
    assert A.variant_for(s, "pingpong").name == "decode_attn_sm90_d128_pingpong_bf16_r32"
    assert A.variant_for(s, "pingpong", block_rows=64).name == "decode_attn_sm90_d128_pingpong_bf16"
    assert A.variant_for(A.Shape(1, 4, 16, 1, 4096, 64, "fp16"), "base", events="stalls").name == \
        "decode_attn_sm90_d64_base_fp16_traced_stalls"
    assert A.variant_for(s, "intrawg", pdl=True).name == "decode_attn_sm90_d128_intrawg_bf16_r32_pdl"
    with pytest.raises(ValueError, match="block_rows must be 32 or 64"):
        A.variant_for(s, "pingpong", block_rows=48)


def test_a_build_without_the_variant_says_to_rebuild(tmp_path, monkeypatch):
    monkeypatch.setattr(aot.BuildDir, "function", lambda self, name: name)
    aot.write_manifest(tmp_path, "sm_90a", {})
    with pytest.raises(Fa4traceError, match="no kernel decode_attn_sm90_d128_pingpong_bf16 in .*rebuild"):
        loader.load("attention", name="decode_attn_sm90_d128_pingpong_bf16", build=tmp_path)


def test_no_build_and_no_dsl_is_one_line_naming_the_build_command(tmp_path):
    from fa4trace.format.errors import DeviceUnavailable

    with pytest.raises(DeviceUnavailable, match=r"no attention kernel build at .*fa4trace build -o"):
        loader.load("attention", name="x", build=tmp_path / "missing")
    with pytest.raises(DeviceUnavailable, match=r"no fa4 kernel build at .*fa4trace.fa4.buildtool"):
        loader.load("fa4", build=tmp_path / "missing", arch="sm90")
