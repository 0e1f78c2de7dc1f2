"""`fa4trace view`: the Streamlit viewer on this machine only, its inputs checked before the
server starts; the server then replaces this process."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from ..format.errors import Fa4traceError
from ..run import deps

VIEW_ADDRESS = "127.0.0.1"


def _port_free(address: str, port: int) -> bool:
    """Whether a server could listen on address:port now (what Streamlit will try)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server does: TIME_WAIT is no obstacle
        try:
            s.bind((address, port))
        except OSError:
            return False
    return True


@click.command()
@click.argument("bundles", nargs=-1, type=click.Path(dir_okay=False))
@click.option("--port", default=8501, type=click.IntRange(1, 65535), show_default=True)
@click.option("--headless", is_flag=True, help="Do not open a browser.")
@click.option("--sweep", "sweep", default=None, type=click.Path(file_okay=False, exists=True),
              help="A sweep dataset folder: its figures in the Sweep tab, its points' bundles open as A and B.")
@click.option("--merged", "merged", default=None, type=click.Path(dir_okay=False),
              help="A trace written by fa4trace merge: its traced kernels and their warps in the Profiler tab.")
def view(bundles, port, headless, sweep, merged):
    """Open the Streamlit viewer on 127.0.0.1 only: the BUNDLES given, the trace bundles in
    ./traces (a source checkout opens its own traces/), and uploads; --merged adds a merged
    torch.profiler trace's Profiler tab.
    Every bundle (the sweep folder, the merged file) is checked before the server starts."""
    import subprocess

    deps.require("fa4trace view", "streamlit", "plotly", "pandas", "viztracer")
    from .. import viewer
    from ..sweep.dataset import find_dataset
    from ..trace.bundle import load

    server = Path(viewer.__file__).resolve().with_name("server.py")
    for bnd in bundles:
        load(bnd)  # every column read: no bundle, a damaged page, 0 rows fail here, not in a page later
    if sweep and find_dataset(sweep) is None:
        raise Fa4traceError(f"{sweep}: not a sweep dataset (no results/ or sweeps/ folder in it)")
    if merged:
        from ..profiler.report import read_report

        read_report(merged)  # a file that is not a merged trace fails here, in one line
    if not _port_free(VIEW_ADDRESS, port):
        raise Fa4traceError(f"port {port} on {VIEW_ADDRESS} is in use (another viewer?): "
                            f"pick another with --port, e.g. fa4trace view --port {port + 1}")
    # server.py: st.App serving main.py and the Perfetto UI. Local only, and no request leaves the
    # machine: no usage statistics, and with server.address set Streamlit looks up no external IP.
    # -P: the current directory stays off sys.path, so a source checkout there cannot shadow the
    # installed package
    cmd = [sys.executable, "-P", "-m", "streamlit", "run", str(server), "--server.port", str(port),
           "--server.address", VIEW_ADDRESS, "--browser.gatherUsageStats", "false",
           "--client.toolbarMode", "minimal"]
    if headless:
        cmd += ["--server.headless", "true"]
    cmd += ["--", *[str(Path(b).resolve()) for b in bundles]]
    if sweep:
        os.environ["FA4TRACE_SWEEP"] = str(Path(sweep).resolve())  # read by the page (viewer.page.SWEEP_ENV)
    if merged:
        os.environ["FA4TRACE_MERGED"] = str(Path(merged).resolve())  # read by the page (viewer.page.MERGED_ENV)
    if os.name == "posix":
        # become the server: signals (SIGTERM from a supervisor, not only Ctrl-C) reach it directly
        # and no orphaned server survives this command
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, cmd)
    return subprocess.call(cmd)
