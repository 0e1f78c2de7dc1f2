"""The package as users install it: a built wheel in a fresh virtual environment.

`pip wheel . --no-deps`, a new venv, `pip install 'fa4trace-*.whl[viewer]'` (dependencies from
the package index), then every user-facing step from that venv, outside the source tree:
`fa4trace convert` and `fa4trace summary` on a bundled trace, and `fa4trace view` headless
(the page run over its websocket, the Perfetto UI's entry page and wasm fetched over HTTP).
The venv is made once per test run. And the environment `make test` made is consistent
(`pip check`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

TRACES = REPO / "traces"
BASE = TRACES / "decode_d128_16to1_sk131072_b1_base.parquet"
PINGPONG = TRACES / "decode_d128_16to1_sk131072_b1_pingpong.parquet"


def test_pip_check_is_clean():
    """Every installed distribution's requirements are met (no --no-deps leftovers)."""
    r = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


# The venv is installed without bytecode (pip compiles every file of every dependency one at a
# time, most of which no command here imports); its processes write the bytecode of what they
# import, once, where the environment would otherwise forbid it (PYTHONDONTWRITEBYTECODE).
WRITE_BYTECODE = {"PYTHONDONTWRITEBYTECODE": ""}


def _run(cmd, **kw):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=kw.pop("timeout", 900), **kw)
    assert r.returncode == 0, f"{cmd}: {r.stdout[-2000:]}{r.stderr[-3000:]}"
    return r


def _venv_run(cmd, **kw):
    """``_run`` of a command from the test venv (its bytecode written as it imports)."""
    return _run(cmd, env={**os.environ, **WRITE_BYTECODE}, **kw)


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    # from a copy of the sources: an in-tree build/ left by an earlier build could add stale modules
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    for name in ("fa4trace", "kernels", "app"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "static"))
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "-q", "-w", out], cwd=src)
    (whl,) = out.glob("fa4trace-*.whl")
    return whl


@pytest.fixture(scope="session")
def venv(wheel, tmp_path_factory) -> Path:
    """bin/ of a fresh venv with the wheel and its `viewer` extra installed."""
    d = tmp_path_factory.mktemp("venv") / "v"
    _run([sys.executable, "-m", "venv", d])
    _run([d / "bin" / "python", "-m", "pip", "install", "-q", "--no-compile", f"{wheel}[viewer]"], cwd=d)
    return d / "bin"


@pytest.mark.slow
def test_wheel_holds_the_whole_tool(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for f in ("fa4trace/cli/__init__.py", "fa4trace/device/recorder.py", "fa4trace/fa4/hooks.py",
              "fa4trace/kernels/attention_sm90.py", "fa4trace/viewer/main.py", "fa4trace/viewer/server.py",
              "fa4trace/viewer/perfetto_ui.py", "fa4trace/viewer/page.py",
              "fa4trace/examples/fa4_sm90_d128_h16kv1_sk32768_b1.parquet"):  # the example bundle
        assert f in names, f
    assert [n for n in names if n.endswith(".parquet")] == ["fa4trace/examples/fa4_sm90_d128_h16kv1_sk32768_b1.parquet"]
    # every folder of fa4trace/ (pyproject.toml lists each one) is in the wheel
    for sub in sorted(p.name for p in (REPO / "fa4trace").iterdir() if (p / "__init__.py").is_file()):
        assert f"fa4trace/{sub}/__init__.py" in names, sub
    assert not any(n.startswith(("app/", "tests/", "kernels/", "fa4trace/viewer/static")) for n in names)
    assert not any("headless" in n for n in names)  # test tooling stays out of the package
    meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(meta).decode()
    for extra in ("dsl", "torch", "fa4", "viewer", "test", "ray"):
        assert f"Provides-Extra: {extra}" in text


@pytest.mark.slow
def test_installed_convert_and_summary(venv, tmp_path):
    if not BASE.is_file():
        pytest.skip("traces/ lacks the d128 16:1 bundle")
    fa4 = venv / "fa4trace"
    out = tmp_path / "pp.pftrace"
    _venv_run([fa4, "convert", PINGPONG, "--to", "perfetto", "-o", out], cwd=tmp_path)
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    parsed = pb.Trace()
    parsed.ParseFromString(out.read_bytes())
    assert len(parsed.packet) > 1000
    got = json.loads(_venv_run([fa4, "summary", PINGPONG, "--json"], cwd=tmp_path).stdout)
    want = json.loads(_run([sys.executable, "-m", "fa4trace", "summary", PINGPONG, "--json"], cwd=REPO).stdout)
    assert got == want and got["qk_softmax_overlap"] > 0.5
    # it is the installed package that ran, and it never needed cutlass or torch
    where = _venv_run([venv / "python", "-c", "import fa4trace.viewer, importlib.util as u; print(fa4trace.viewer.__file__);"
                  "print(u.find_spec('cutlass'), u.find_spec('torch'))"], cwd=tmp_path).stdout.splitlines()
    assert where[0].startswith(str(venv.parent)) and where[0].endswith("fa4trace/viewer/__init__.py")
    assert where[1] == "None None"


@pytest.mark.slow
def test_installed_example_bundle(venv, tmp_path):
    """The wheel's own bundle (fa4trace.example_bundle()): summary and convert run on it."""
    example = Path(_venv_run([venv / "python", "-c", "import fa4trace; print(fa4trace.example_bundle())"],
                        cwd=tmp_path).stdout.strip())
    assert example.is_file() and example.is_relative_to(venv.parent)
    assert example.read_bytes() == (TRACES / example.name).read_bytes()
    assert "QK ∥ SOFTMAX" in _venv_run([venv / "fa4trace", "summary", example], cwd=tmp_path).stdout
    _venv_run([venv / "fa4trace", "convert", example, "--to", "chrome", "-o", tmp_path / "e.json"], cwd=tmp_path)
    assert json.loads((tmp_path / "e.json").read_text())


@pytest.mark.slow
def test_installed_view_serves_the_viewer(venv, tmp_path):
    pytest.importorskip("websockets")
    if not BASE.is_file():
        pytest.skip("traces/ lacks the d128 16:1 bundle")
    from tests.tools import headless

    log = tmp_path / "net.log"
    env = {"PYTHONPATH": str(REPO / "tests" / "tools" / "netguard"), "FA4TRACE_NET_LOG": str(log),
           "FA4TRACE_BUNDLES": "", "FA4TRACE_TRACES_DIR": "", **WRITE_BYTECODE}
    with headless.StreamlitServer([BASE, PINGPONG], env=env, timeout=180,
                                  command=[venv / "fa4trace", "view", "--headless"]) as srv:
        with urllib.request.urlopen(srv.url + "/", timeout=60) as r:
            assert r.status == 200 and b'<div id="root">' in r.read()
        page = "\n".join(str(m) for m in headless.page_messages(srv.url))
        assert "base vs ping-pong" in page and "hides" in page and "Traceback" not in page
        with urllib.request.urlopen(srv.url + "/fa4trace/perfetto/fa4trace.html", timeout=60) as r:
            entry = r.read()
        assert b"Content-Security-Policy" in entry and b"frontend_bundle.js" in entry
        wasm = _venv_run([venv / "python", "-c", "from fa4trace.viewer import perfetto_ui as p; d = p.web_dist();"
                     "print(next(d.rglob('trace_processor.wasm')).relative_to(d))"], cwd=tmp_path).stdout.strip()
        with urllib.request.urlopen(f"{srv.url}/fa4trace/perfetto/{wasm}", timeout=60) as r:
            assert r.headers["Content-Type"] == "application/wasm" and len(r.read()) > 1_000_000
    assert not log.exists() or not log.read_text().strip(), log.read_text()
    site = Path(_venv_run([venv / "python", "-c", "import fa4trace; print(fa4trace.__file__)"], cwd=tmp_path).stdout.strip()).parent
    assert not (site / "viewer" / "static").exists() and not list(site.rglob("*.wasm"))


def test_every_subpackage_is_in_the_wheel_list():
    """pyproject lists packages explicitly: a new fa4trace/<pkg>/ must be added there too."""
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    listed = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {"fa4trace." + p.parent.relative_to(root / "fa4trace").as_posix().replace("/", ".")
             for p in (root / "fa4trace").glob("*/__init__.py")}
    found.discard("fa4trace.kernels")  # a link to kernels/ in some checkouts; mapped by package-dir
    assert found <= listed, f"add to pyproject [tool.setuptools] packages: {sorted(found - listed)}"
