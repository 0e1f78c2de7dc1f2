"""The GPU's clock and power state while a benchmark runs, from ``nvidia-smi`` polling.

Why: on the H200 the long decode shapes run at the board's 700 W limit; the driver then lowers
the SM clock and single timing passes can come out several percent slow. A benchmark row is
only readable next to what the GPU was doing meanwhile.

    with PowerLog() as log:            # no nvidia-smi, or more than one GPU: log.enabled is False
                                       # (PowerLog(gpu="3") logs that GPU of several)
        t0 = log.now(); ...; t1 = log.now()
        log.summary(t0, t1)            # {"samples", "sm_mhz_min", "power_w_max", "power_cap_share", ...}

One ``nvidia-smi -lms`` process samples every ``period_ms``; a thread reads its lines.
Nothing here needs torch or a GPU to import.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import threading
import time
from typing import Optional

QUERY = "clocks.sm,power.draw,power.limit,clocks_throttle_reasons.active"
SW_POWER_CAP = 0x4  # nvidia-smi clocks_throttle_reasons bits
HW_SLOWDOWN = 0x8
THERMAL = 0x20 | 0x40  # SW and HW thermal slowdown


def parse_line(line: str) -> Optional[tuple]:
    """(sm MHz, power W, power limit W, reason bits) from one ``--format=csv,noheader,nounits``
    line, or None for anything else (a header, "[N/A]", a message)."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != 4:
        return None
    try:
        return int(float(parts[0])), float(parts[1]), float(parts[2]), int(parts[3], 16)
    except ValueError:
        return None


class PowerLog:
    def __init__(self, period_ms: int = 250, exe: Optional[str] = None, gpu: Optional[str] = None):
        self.period_ms = period_ms
        self.gpu = gpu  # nvidia-smi's index (or UUID) of the GPU to log; None: the only one
        self.exe = exe or shutil.which("nvidia-smi")
        self.samples: list = []  # (monotonic time, sm MHz, W, limit W, reasons)
        self.why_off: Optional[str] = None
        self._proc = None
        self._thread = None

    @property
    def enabled(self) -> bool:
        return self._proc is not None

    def __enter__(self) -> "PowerLog":
        if self.exe is None:
            self.why_off = "no nvidia-smi"
            return self
        pick = [] if self.gpu is None else ["-i", str(self.gpu)]
        try:
            gpus = subprocess.run([self.exe, "-L", *pick], capture_output=True, text=True, timeout=20).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            self.why_off = f"nvidia-smi -L failed: {exc}"
            return self
        n = sum(line.startswith("GPU ") for line in gpus.splitlines())
        if n != 1:
            # which of several GPUs torch uses is not knowable from here without guessing
            self.why_off = f"nvidia-smi lists {n} GPUs (logging needs exactly one)"
            return self
        self._proc = subprocess.Popen(
            [self.exe, *pick, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits", "-lms", str(self.period_ms)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        return self

    def _read(self):
        for line in self._proc.stdout:
            rec = parse_line(line)
            if rec is not None:
                self.samples.append((time.monotonic(), *rec))

    def __exit__(self, *exc):
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
            self._thread.join(timeout=5)
        return False

    @staticmethod
    def now() -> float:
        return time.monotonic()

    def summary(self, t0: float, t1: float) -> Optional[dict]:
        """Clock and power between t0 and t1 (``now()`` values), or None without samples."""
        got = [s for s in list(self.samples) if t0 <= s[0] <= t1]
        if not got:
            return None
        sm = [s[1] for s in got]
        watts = [s[2] for s in got]
        return {"samples": len(got), "sm_mhz_min": min(sm), "sm_mhz_median": statistics.median(sm),
                "sm_mhz_max": max(sm), "power_w_median": round(statistics.median(watts), 1),
                "power_w_max": round(max(watts), 1), "power_limit_w": got[-1][3],
                "power_cap_share": round(sum(bool(s[4] & SW_POWER_CAP) for s in got) / len(got), 3),
                "thermal_share": round(sum(bool(s[4] & (THERMAL | HW_SLOWDOWN)) for s in got) / len(got), 3)}
