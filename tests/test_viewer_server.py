"""`fa4trace view` as a user starts it: the server, the page, the Perfetto UI, and no network.

The server runs under a ``sitecustomize`` that records, and refuses, every socket connection,
datagram and name lookup that is not for this machine (tests/tools/netguard/); the page is run
over Streamlit's websocket as a browser would (tests/tools/headless.page_messages), so these
tests need no browser.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
pytest.importorskip("websockets")

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from fa4trace.viewer import data, perfetto_ui  # noqa: E402
from tests.tools import headless  # noqa: E402

NETGUARD = REPO / "tests" / "tools" / "netguard"
VIEW = [sys.executable, "-m", "fa4trace", "view", "--headless"]


def guarded_env(log: Path) -> dict:
    return {"PYTHONPATH": os.pathsep.join([str(NETGUARD), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            "FA4TRACE_NET_LOG": str(log)}


def default_pair() -> list[str]:
    s = data.startup([], data.TRACES_DIR)
    if s.default_a is None or s.default_b is None:
        pytest.skip("traces/ holds no base / ping-pong pair")
    by_key = {x.key: x for x in s.sources}
    return [str(by_key[s.default_a].path), str(by_key[s.default_b].path)]


def get(url: str) -> tuple[int, dict, bytes]:
    with urllib.request.urlopen(url, timeout=60) as r:
        return r.status, dict(r.headers), r.read()


def texts(msgs) -> str:
    return "\n".join(str(m) for m in msgs)


def test_guard_records_what_leaves_the_machine(tmp_path):
    """The guard itself: a lookup of a public name is recorded and refused, loopback is not."""
    log = tmp_path / "net.log"
    code = ("import socket, urllib.request\n"
            "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
            "socket.create_connection(s.getsockname(), timeout=5).close()\n"
            "try:\n    urllib.request.urlopen('http://checkip.amazonaws.com', timeout=2)\n"
            "except OSError as e:\n    print('refused', type(e).__name__)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, **guarded_env(log)})
    assert r.returncode == 0 and "refused" in r.stdout, r.stderr
    lines = log.read_text().splitlines()
    assert lines and all("checkip.amazonaws.com" in ln for ln in lines), lines


def test_view_serves_the_page_and_the_perfetto_ui_and_nothing_leaves(tmp_path):
    bundles = default_pair()
    log = tmp_path / "net.log"
    env = {**guarded_env(log), "FA4TRACE_BUNDLES": "", "FA4TRACE_TRACES_DIR": str(tmp_path / "none")}
    with headless.StreamlitServer(bundles, env=env, timeout=120, command=VIEW) as srv:
        status, _, body = get(srv.url + "/")
        assert status == 200 and b'<div id="root">' in body
        # the page, run as a browser runs it: the comparison of the two bundles named
        run = texts(headless.page_messages(srv.url))
        assert "base vs ping-pong" in run and "hides" in run and "Traceback" not in run
        assert Path(bundles[0]).name.split(".")[0] in run
        # the Perfetto UI tab embeds the UI from this server's own origin
        perf = texts(headless.page_messages(srv.url, query_string="view=Perfetto%20UI"))
        assert f"/{perfetto_ui.MOUNT}/{perfetto_ui.ENTRY_FILE}#!/viewer" in perf
        status, headers, entry = get(f"{srv.url}/{perfetto_ui.MOUNT}/{perfetto_ui.ENTRY_FILE}")
        assert status == 200 and b"Content-Security-Policy" in entry and b"frontend_bundle.js" in entry
        dist = perfetto_ui.web_dist()
        wasm = next(dist.rglob("trace_processor.wasm"))
        status, headers, body = get(f"{srv.url}/{perfetto_ui.MOUNT}/{wasm.relative_to(dist).as_posix()}")
        assert headers["content-type"] == "application/wasm" and body == wasm.read_bytes()
        out = srv.output()
    assert "URL: http://127.0.0.1:" in out and "External URL" not in out and "Network URL" not in out
    assert "No runtime found" not in out and "Traceback" not in out, out  # nothing but the address
    # no usage statistics, no external-IP lookup, no other request: nothing left the machine
    assert not log.exists() or not log.read_text().strip(), log.read_text()
    assert not (Path(perfetto_ui.__file__).parent / "static").exists()


def test_view_on_a_busy_port_fails_in_one_line():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        t = time.monotonic()
        r = subprocess.run([*VIEW, "--port", str(port)], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fa4trace: error:") and f"port {port}" in lines[0]
    assert "--port" in lines[0], lines
    assert time.monotonic() - t < 60  # checked before the server starts, not after a timeout
