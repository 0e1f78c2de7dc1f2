"""Every verb of the CLI, given bad input, says so in one line and exits non-zero, never with a
traceback: missing files, bad values, and optional packages that are not installed.

A missing package is simulated in a fresh process: a ``sitecustomize`` on its path puts an
import hook first that answers "no module named ..." for each package in
``FA4TRACE_TEST_MISSING``, to ``import`` and ``importlib.util.find_spec`` alike, as on a machine
without it (``sys.modules[name] = None`` would do for fa4trace, but pyarrow's lazy pandas
check trips over a None module). The verbs that need no optional package run with all of them
missing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fa4trace.cli import main
from fa4trace.run.deps import PACKAGES
from fa4trace.trace.bundle import Trace
from fa4trace.trace.decode import decode_buffer
from fa4trace.testing.bundles import attention_like

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "tools"))
from bad_bundles import damage_page, no_event_bundle  # noqa: E402

SWEEP = ROOT / "traces" / "sweep-h200"  # a real sweep dataset, read only
AUTO = ROOT / "traces" / "step" / "step_RMSNorm.parquet"  # a bundle of instrument(): warps 0-3
SITE = """\
import importlib.abc, os, sys

MISSING = set(filter(None, os.environ.get("FA4TRACE_TEST_MISSING", "").split(",")))


class Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in MISSING:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, Missing())
"""
VERBS = sorted(main.commands)
HOST_ONLY = {"summary", "compare", "diff", "convert", "merge", "compact", "query"}  # need no optional package


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """What the cases refer to as {name}: a bundle, files that are not what they claim, folders."""
    from fa4trace.testing.profiler import profiled_run
    from fa4trace.testing.replay import make_synthetic

    d = tmp_path_factory.mktemp("inputs")
    buf, meta = attention_like("pingpong", n_ctas=2, n_blocks=4)
    bundle = Trace.from_launches([decode_buffer(buf)], meta).save(d / "t.parquet")
    run = profiled_run([Trace.from_launches([decode_buffer(buf)], meta)], steps=1, layers=1)
    prof, profiled = run.write(d / "prof.json"), run.traces[0].save(d / "profiled.parquet")
    (d / "bad.parquet").write_bytes(b"not a parquet file at all")
    (d / "script.py").write_text("print('a script that compiles no kernel')\n")
    (d / "raises.py").write_text("raise ValueError('bad shape 7')\n")
    (d / "imports.py").write_text("import quack\n")
    (d / "nonempty").mkdir()
    (d / "nonempty" / "f").write_text("x")
    (d / "site").mkdir()
    (d / "site" / "sitecustomize.py").write_text(SITE)
    make_synthetic(d / "replay", 1, n_ctas=2, n_blocks=4)
    empty = no_event_bundle(d / "empty.parquet")
    damaged = damage_page(bundle, d / "damaged.parquet")  # a data page's byte flipped, the footer whole
    return {"bundle": str(bundle), "bad": str(d / "bad.parquet"), "script": str(d / "script.py"),
            "empty": str(empty), "damaged": str(damaged), "auto": str(AUTO),
            "raises": str(d / "raises.py"), "imports": str(d / "imports.py"),
            "nonempty": str(d / "nonempty"), "dir": str(d), "replay": str(d / "replay"), "sweep": str(SWEEP),
            "site": str(d / "site"), "prof": str(prof), "profiled": str(profiled)}


def fa4trace(args, files, cwd, missing=()):
    """``python -m fa4trace ARGS`` in a fresh process (this checkout's fa4trace), ``missing`` absent."""
    env = dict(os.environ, FA4TRACE_TEST_MISSING=",".join(missing))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (files["site"], str(ROOT), env.get("PYTHONPATH")) if p)
    args = [a.format(**files) for a in args]
    return subprocess.run([sys.executable, "-m", "fa4trace", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)


def assert_one_line(r, message, code=None):
    lines = r.stderr.strip().splitlines()
    assert r.returncode != 0 if code is None else r.returncode == code, (r.returncode, r.stderr)
    assert len(lines) == 1 and lines[0].startswith("fa4trace: error: "), r.stderr
    assert message in lines[0], r.stderr
    assert "Traceback" not in r.stderr


# (verb, arguments, what the one line says); {name}: files[name]; -o paths are relative (tmp cwd)
BAD_INPUT = [
    ("summary", ["missing.parquet"], "missing.parquet: no such file"),
    ("summary", ["{bad}"], "is not a Parquet trace bundle"),
    ("summary", ["{bundle}", "--roles", "mma=0"], "--roles applies to bundles of automatically traced kernels"),
    ("summary", ["{auto}", "--roles", "producer=999"], "role 'producer': warp 999 is not in this trace"),
    ("summary", ["{auto}", "--roles", "producer=3-1"], "--roles 'producer=3-1': the range 3-1 runs backwards"),
    ("summary", ["{empty}"], "empty.parquet: the bundle holds no events (0 rows)"),
    ("summary", ["{damaged}"], "damaged.parquet: bundle data is unreadable"),
    ("compare", ["{bundle}", "missing.parquet"], "missing.parquet: no such file"),
    ("compare", ["{bundle}"], "Missing argument 'B'"),
    ("compare", ["{bundle}", "{empty}"], "the bundle holds no events"),
    ("diff", ["{bundle}", "missing.parquet"], "missing.parquet: no such file"),
    ("diff", ["{bundle}", "{bad}"], "is not a Parquet trace bundle"),
    ("diff", ["{bundle}", "{damaged}"], "damaged.parquet: bundle data is unreadable"),
    ("diff", ["{bundle}", "{empty}"], "holds no events"),
    ("diff", ["{bundle}", "{auto}"], "diff needs two bundles of one kernel traced the same way"),
    ("diff", ["{bundle}", "{bundle}", "--ignore", "cta/*"], "give --fail-above PCT with them"),
    ("diff", ["{bundle}", "{bundle}", "--fail-above", "x"], "'--fail-above': 'x' is not a valid float"),
    ("convert", ["missing.parquet", "--to", "chrome", "-o", "x.json"], "no such file"),
    ("convert", ["{bundle}", "--to", "chrome", "--compress", "-o", "x.json"], "--compress applies to --to perfetto"),
    ("convert", ["{bundle}", "--to", "chrome", "-o", "{bad}"], "refusing to overwrite it (add --force)"),
    ("convert", ["{bundle}", "--to", "chrome", "-o", ""], "the output path is empty"),
    ("convert", ["{empty}", "--to", "chrome", "-o", "x.json"], "the bundle holds no events"),
    ("merge", ["missing.json", "{profiled}", "-o", "m.pftrace"], "missing.json: no such file"),
    ("merge", ["{bad}", "{profiled}", "-o", "m.pftrace"], "is not JSON"),
    ("merge", ["{prof}", "{bad}", "-o", "m.pftrace"], "is not a Parquet trace bundle"),
    ("merge", ["{prof}", "{bundle}", "-o", "m.pftrace"], "none of its launches is in prof.json"),
    ("merge", ["{prof}", "{profiled}", "-o", "{bad}"], "refusing to overwrite it (add --force)"),
    ("merge", ["{prof}", "-o", "m.pftrace"], "Missing argument 'BUNDLES...'"),
    ("merge", ["{prof}", "{empty}", "-o", "m.pftrace"], "the bundle holds no events"),
    ("view", ["missing.parquet"], "missing.parquet: no such file"),
    ("view", ["{bad}"], "is not a Parquet trace bundle"),
    ("view", ["{damaged}"], "damaged.parquet: bundle data is unreadable"),
    ("view", ["{empty}"], "the bundle holds no events"),
    ("view", ["--sweep", "{dir}"], "not a sweep dataset"),
    ("view", ["--merged", "{bad}"], "is not a Perfetto protobuf trace"),
    ("view", ["--merged", "{bundle}"], "is not a Perfetto protobuf trace"),
    ("view", ["--merged", "missing.pftrace"], "missing.pftrace: no such file"),
    ("view", ["--port", "0"], "'--port': 0 is not in the range"),
    ("plot", ["{dir}", "-o", "f.html"], "no sweep results"),
    ("plot", ["missing", "-o", "f.html"], "missing: no such directory"),
    ("plot", ["{sweep}", "-o", "f.html", "--b", "8"], "no points at batch 8; the dataset has batch 1"),
    ("plot", ["{sweep}", "-o", "f.html", "--kernels", "base,nosuch"], "nosuch not in the dataset"),
    ("plot", ["{sweep}", "-o", "f.txt"], "unknown figure format .txt"),
    ("plot", ["{sweep}", "-o", "f.html", "--figure", "overlap", "--kernels", "base"], "--kernels is for figures 9"),
    ("build", ["--only", "nosuch"], "unknown kernel kind nosuch"),
    ("build", ["--only", "calibration", "-o", "{nonempty}"], "not empty; refusing to replace it (add --force)"),
    ("record", ["--kernel", "markers", "--timebase", "globaltimer", "-o", "z.parquet"],
     "--timebase does not apply to --kernel markers"),
    ("record", ["--kernel", "markers", "--variant", "plain", "-o", "z.parquet"], "Invalid value for '--variant'"),
    ("record", ["--script", "missing.py", "-o", "z.parquet"], "'missing.py' does not exist"),
    ("record", ["--script", "{script}", "--kernel", "markers", "-o", "z.parquet"], "--kernel does not apply to --script"),
    ("record", ["--sk", "0", "-o", "z.parquet"], "--sk must be >= 1"),
    ("record", ["--script", "{script}", "-o", "z.parquet"], "compiled no CuTe DSL kernel"),
    ("record", ["--script", "{raises}", "-o", "z.parquet"], "raises.py raised ValueError: bad shape 7"),
    ("record", ["-o", "{bad}"], "refusing to overwrite it (add --force)"),
    ("bench", ["--only", "x=1"], "unknown shape key 'x'"),
    ("bench", ["--only", "d=7"], "leaves no shape of the matrix"),
    ("bench", ["--rounds", "0"], "'--rounds': 0 is not in the range"),
    ("bench", ["--traced", "trace,everything"], "unknown traced variant 'everything'"),
    ("bench", ["--trace-at", "some"], "'--trace-at': 'some' is not one of 'long', 'all'"),
    ("check", ["--out", "{bad}"], "is a file"),
    ("sweep", ["--d", "128", "--gpus", "x", "-o", "ds"], "--gpus: want all or comma GPU indices"),
    ("sweep", ["--replay", "missing", "-o", "ds"], "missing: no such replay folder"),
    ("sweep", ["--d", "x", "-o", "ds"], "d: want integers, got 'x'"),
    ("sweep", ["--grid", "missing.toml", "-o", "ds"], "'--grid': File 'missing.toml' does not exist"),
    ("sweep", ["--d", "128", "-o", ""], "the dataset path (-o) is empty"),
    ("sass", ["nosuch"], "unknown kernel 'nosuch': one of decode"),
    ("sass", ["--arch", "sm_80", "{script}:make"], "unknown arch 'sm_80'"),
    ("sass", ["-o", "{bad}"], "refusing to overwrite it (add --force)"),
    ("compact", ["{dir}"], "not a sweep dataset"),
    ("compact", ["missing"], "missing: no such directory"),
    ("query", ["{dir}", "SELECT 1"], "not a sweep dataset"),
    ("query", ["missing", "SELECT 1"], "missing: no such directory"),
    ("query", ["{sweep}", "COPY (SELECT 1) TO 'x.csv'"], "query is read-only: a COPY statement may write"),
    ("query", ["{sweep}", "SELECT 1; SELECT 2"], "query runs one SQL statement, got 2"),
    ("query", ["{sweep}", ""], "the SQL is empty"),
    ("query", ["{sweep}", "SELEC 1"], "query failed: Parser Error"),
]

# (verb, arguments, packages made missing, what the one line names, the extras of its pip command)
MISSING = [
    ("record", ["-o", "z.parquet"], ["torch"], "fa4trace record needs PyTorch", "torch"),
    ("record", ["-o", "z.parquet"], ["cutlass", "tvm_ffi"], "nvidia-cutlass-dsl (the CuTe DSL) to compile", "dsl"),
    ("record", ["--impl", "fa4", "-o", "z.parquet"], ["torch"], "record --impl fa4 needs PyTorch", "torch"),
    ("record", ["--impl", "fa4", "-o", "z.parquet"], ["flash_attn", "tvm_ffi"], "flash-attn-4 to compile FA4",
     "dsl,fa4"),
    ("record", ["--kernel", "calibration", "-o", "z.parquet"], ["torch"], "needs PyTorch", "torch"),
    ("record", ["--kernel", "markers", "-o", "z.parquet"], ["cutlass", "tvm_ffi"], "apache-tvm-ffi", "dsl"),
    ("record", ["--script", "{script}", "-o", "z.parquet"], ["torch"], "record --script needs PyTorch", "torch"),
    ("record", ["--script", "{script}", "-o", "z.parquet"], ["cutlass"], "record --script needs nvidia-cutlass-dsl",
     "dsl"),
    ("record", ["--script", "{imports}", "-o", "z.parquet"], ["quack"], "imports.py: quack-kernels is not installed",
     "fa4"),
    ("build", ["-o", "out"], ["cutlass"], "fa4trace build needs nvidia-cutlass-dsl", "dsl"),
    ("build", ["-o", "out"], ["tvm_ffi"], "fa4trace build needs apache-tvm-ffi", "dsl"),
    ("bench", [], ["torch"], "fa4trace bench needs PyTorch", "torch"),
    ("check", ["--out", "chk"], ["torch"], "fa4trace check needs PyTorch", "torch"),
    ("sweep", ["--d", "128", "-o", "ds"], ["torch"], "fa4trace sweep needs PyTorch", "torch"),
    ("sweep", ["--replay", "{replay}", "-o", "ds", "--executor", "ray"], ["ray"], "--executor ray needs ray", "ray"),
    ("sass", [], ["cutlass"], "fa4trace sass needs nvidia-cutlass-dsl", "dsl"),
    ("sass", ["fa4-sm100-pingpong"], ["flash_attn"], "fa4trace sass (FlashAttention-4) needs flash-attn-4", "fa4"),
    ("view", [], ["streamlit"], "fa4trace view needs streamlit", "viewer"),
    ("view", ["{bundle}"], ["viztracer", "pandas"], "needs pandas and viztracer", "viewer"),
    ("plot", ["{sweep}", "-o", "f.html"], ["plotly"], "fa4trace plot needs plotly", "viewer"),
    ("plot", ["{sweep}", "-o", "f.png"], ["kaleido"], "fa4trace plot needs kaleido", "viewer"),
]

# What the host-only verbs do with every optional package missing.
HOST_RUNS = [
    ("summary", ["{bundle}", "--json"]),
    ("compare", ["{bundle}", "{bundle}"]),
    ("diff", ["{bundle}", "{bundle}", "--fail-above", "5"]),
    ("convert", ["{bundle}", "--to", "perfetto", "-o", "t.pftrace"]),
    ("merge", ["{prof}", "{profiled}", "-o", "m.pftrace"]),
    ("compact", ["ds"]),
    ("query", ["ds", "SELECT count(*) AS n FROM results"]),
]


@pytest.mark.parametrize("verb, args, message", BAD_INPUT, ids=[f"{c[0]}-{i}" for i, c in enumerate(BAD_INPUT)])
def test_bad_input_is_one_line(verb, args, message, files, tmp_path):
    r = fa4trace([verb, *args], files, tmp_path)
    assert_one_line(r, message)
    assert not any((tmp_path / f).exists() for f in ("z.parquet", "ds", "m.pftrace"))


@pytest.mark.parametrize("verb, args, missing, message, extras", MISSING,
                         ids=[f"{c[0]}-{'+'.join(c[2])}" for c in MISSING])
def test_a_missing_package_is_one_line_with_the_install_command(verb, args, missing, message, extras, files,
                                                                tmp_path):
    r = fa4trace([verb, *args], files, tmp_path, missing=missing)
    assert_one_line(r, message, code=2 if verb == "check" else 1)
    assert r.stderr.rstrip().endswith(f"not installed here: pip install 'fa4trace[{extras}]'"), r.stderr
    assert r.stdout == "" and not any(tmp_path.iterdir())


@pytest.mark.parametrize("verb, args", HOST_RUNS, ids=[c[0] for c in HOST_RUNS])
def test_host_verbs_need_no_optional_package(verb, args, files, tmp_path):
    import shutil

    shutil.copytree(files["replay"], tmp_path / "src")
    from fa4trace.sweep.replay import ReplayGrid, ReplayRunner
    from fa4trace.sweep.run import run_sweep

    run_sweep(ReplayGrid(tmp_path / "src"), tmp_path / "ds", ReplayRunner(), log=lambda m: None, compact=False)
    r = fa4trace([verb, *args], files, tmp_path, missing=sorted(PACKAGES))
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout.strip()


def test_every_verb_is_covered():
    """The lists above reach every command: bad input for each; a missing package for each
    that needs one; and the others run with none of them."""
    assert {c[0] for c in BAD_INPUT} == set(VERBS)
    assert {c[0] for c in MISSING} == set(VERBS) - HOST_ONLY
    assert {c[0] for c in HOST_RUNS} == HOST_ONLY


def test_the_simulated_absence_is_what_python_sees(files, tmp_path):
    """The sitecustomize makes a package missing for import and for fa4trace's check alike."""
    code = ("from fa4trace.run.deps import installed\n"
            "try:\n    import torch\nexcept ImportError as e:\n    print('import fails:', e.name)\n"
            "print('installed:', installed('torch'), installed('numpy'))\n")
    env = dict(os.environ, FA4TRACE_TEST_MISSING="torch",
               PYTHONPATH=os.pathsep.join(p for p in (files["site"], str(ROOT), os.environ.get("PYTHONPATH")) if p))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.stdout.splitlines() == ["import fails: torch", "installed: False True"], r.stderr
