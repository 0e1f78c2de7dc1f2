"""What a merge did, as a JSON-able report: matches, clock alignment, per-launch numbers.

The report is printed by ``fa4trace merge``, returned by :func:`fa4trace.profiler.merge` (and
:func:`fa4trace.profiler.merge_ranks`: then ``ranks`` and ``rank_clock`` say which rank is which
and how their clocks were put on one axis), and
stored in the merged Perfetto file itself: the file's first packet is a slice named
``fa4trace merge`` on a track of its own, whose debug annotation ``report`` holds this JSON
(:func:`read_report` reads it back without parsing the rest of the file; the viewer does).

Per traced launch the numbers are fa4trace's own analysis of that launch's events: for a kernel
traced by ``fa4trace.instrument``, busy / waiting / idle over the warps' lifetimes
(:func:`fa4trace.analysis.kernel.role_fractions`, roles from :mod:`fa4trace.analysis.roles`) and the
share of each named span with the warp's MMAs in flight (:mod:`fa4trace.analysis.mma_flight`); for an
attention bundle, QK∥SOFTMAX and PV∥SOFTMAX (:func:`fa4trace.analysis.overlap.per_cta`, weighted by
softmax time) and the tensor-core busy share.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from ..trace.bundle import Trace
from ..format.errors import Fa4traceError, TraceFormatError

__all__ = ["MergeReport", "launch_numbers", "read_report", "REPORT_SLICE", "REPORT_ARG", "FORMAT"]

REPORT_SLICE = "fa4trace merge"
REPORT_ARG = "report"
FORMAT = "fa4trace-merge"
VERSION = 1
HEAD_PACKETS = 4  # read_report looks this far into a file


@dataclass
class MergeReport:
    """Everything a merge decided. ``launches``: one dict per matched launch (keys in docs/profiler.md)."""

    profiler_trace: str
    output: str
    align: str
    bundles: list = field(default_factory=list)  # {index, name, path, kernel, launches, matched}
    launches: list = field(default_factory=list)
    unmatched: list = field(default_factory=list)  # {bundle, launch, reason}
    clock: dict = field(default_factory=dict)  # median_delta_ns, spread_ns, n
    host: dict = field(default_factory=dict)  # what of the profiler trace was written
    notes: list = field(default_factory=list)
    max_launches: int | None = None
    written: dict = field(default_factory=dict)  # filled after writing: bytes, seconds, slices
    ranks: list = field(default_factory=list)  # several ranks: one dict each (rank, profiler trace, clock ...)
    rank_clock: dict = field(default_factory=dict)  # several ranks: how their clocks were aligned, the error
    format: str = FORMAT
    version: int = VERSION

    def to_dict(self) -> dict:
        """The report as a dict (``ranks`` and ``rank_clock`` only for a merge of several ranks)."""
        d = asdict(self)
        for k in ("ranks", "rank_clock"):
            if not d[k]:
                del d[k]
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), default=_json_default, separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: dict) -> "MergeReport":
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in known})

    def lines(self) -> list[str]:
        """The text ``fa4trace merge`` prints: one line per bundle and launch, then the clocks."""
        out = []
        for r in self.ranks:
            off = r.get("offset_ns")
            out.append(f"rank {r['rank']}: {r['profiler_trace']} ({r.get('host') or 'host ?'}, pid {r.get('pid')}, "
                       f"GPU {', '.join(str(d) for d in r.get('devices') or []) or '?'}): {r.get('events', 0):,} "
                       f"profiler events, {len(r.get('bundles') or [])} bundle(s); clock "
                       + ("the reference" if r.get("reference") else
                          f"{off / 1e3:+,.3f} µs off rank {self.rank_clock.get('reference')} "
                          f"({r.get('pairs', 0)} collectives)" if off is not None
                          else "not measured (no collective in common)")
                       + ("" if r.get("shift_ns") == off or off is None else
                          " (within its collectives' scatter: not taken out)" if self.rank_clock.get("mode") == "nccl"
                          else " (measured, not taken out)"))
        for b in self.bundles:
            rk = f"rank {b['rank']}: " if "rank" in b else ""
            out.append(f"bundle {b['index']}: {rk}{b['name']} ({b['kernel']}): {b['matched']}/{b['launches']} launch(es) matched")
        for m in self.launches:
            out.append(
                ("  " if "rank" not in m else f"  rank {m['rank']}: ")
                + f"launch {m['bundle']}.{m['launch']} -> {_short(m['kernel'])} on stream {m['stream']} at "
                f"+{(m['kernel_start_ns'] - self.host.get('start_ns', m['kernel_start_ns'])) / 1e3:,.1f} µs "
                f"({m['method']}{', ambiguous' if m['ambiguous'] else ''}; {m['candidates']} candidate(s)): "
                f"kernel {m['kernel_dur_ns'] / 1e3:,.2f} µs, warps {m['span_ns'] / 1e3:,.2f} µs, "
                f"end slack {m['end_slack_ns'] / 1e3:+,.2f} µs, {m['outside']} event(s) outside"
                + ("" if m["warps_drawn"] else " [warps not drawn: --max-launches]"))
        for u in self.unmatched:
            out.append(f"  launch {u['bundle']}.{u['launch']} NOT matched: {u['reason']}")
        c = self.clock
        if self.ranks:
            out.extend(self._rank_lines())
        elif c.get("n"):
            out.append(f"clocks: kernel start - first warp start (profiler vs %globaltimer) median "
                       f"{c['median_delta_ns'] / 1e3:+,.3f} µs over {c['n']} launch(es), spread "
                       f"{c['spread_ns'] / 1e3:,.3f} µs (largest |launch - median|: the alignment error); "
                       f"warps placed by {self.align} alignment")
        for n in self.notes:
            out.append(f"note: {n}")
        return out

    def _rank_lines(self) -> list[str]:
        """The clock lines of a merge of several ranks: per rank its warps against its kernels,
        then the ranks against each other."""
        out = []
        for r in self.ranks:
            c = r.get("clock") or {}
            if c.get("n"):
                out.append(f"clocks, rank {r['rank']}: kernel start - first warp start median "
                           f"{c['median_delta_ns'] / 1e3:+,.3f} µs over {c['n']} launch(es), spread "
                           f"{c['spread_ns'] / 1e3:,.3f} µs (its alignment error); warps placed by {self.align} alignment")
        rc = self.rank_clock
        if rc.get("error_ns") is not None:
            out.append(f"clocks across ranks: {rc['method']}; {rc['anchor_kind']} of one collective end within "
                       f"{rc['error_ns'] / 1e3:,.3f} µs of each other (median over {rc['collectives']} collectives, "
                       f"worst {rc['worst_ns'] / 1e3:,.3f} µs): the cross-rank alignment error")
        elif rc:
            out.append(f"clocks across ranks: {rc.get('method')}; alignment error not measured ({rc.get('why')})")
        return out


def _short(name: str, n: int = 72) -> str:
    return name if len(name) <= n else name[: n - 1] + "…"


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    raise TypeError(f"{type(o).__name__} is not JSON serializable")


def _f(x) -> float | None:
    if x is None:
        return None
    x = float(x)
    return None if np.isnan(x) else x


def launch_numbers(trace: Trace) -> dict:
    """Busy / waiting / idle and overlap of one launch's events (module docstring)."""
    from ..analysis.autoevents import is_automatic

    if trace.events.num_rows == 0:
        return {}
    if is_automatic(trace):
        from ..analysis.autoevents import AutoCols
        from ..analysis.kernel import role_fractions
        from ..analysis.mma_flight import mma_in_flight, overlap_share
        from ..analysis.roles import assign_roles

        tr = assign_roles(trace)
        c = AutoCols.of(tr)
        fr = role_fractions(c)
        life = float(np.sum(fr["lifetime_ns"].to_numpy())) or 1.0
        out = {k: float(np.sum(fr[f"{k}_ns"].to_numpy())) / life for k in ("busy", "waiting", "idle")}
        roles = {}
        for r in sorted(set(fr["role"].to_pylist())):
            m = np.asarray(fr["role"].to_pylist()) == r
            lt = float(fr["lifetime_ns"].to_numpy()[m].sum()) or 1.0
            roles[r] = {k: float(fr[f"{k}_ns"].to_numpy()[m].sum()) / lt for k in ("busy", "waiting", "idle")}
            roles[r]["warps"] = int(fr["warps"].to_numpy()[m].sum())
        out["roles"] = roles
        user = [e.name for e in trace.vocab.events if e.family == "user"]
        if user:
            fl = mma_in_flight(c)
            if fl.num_rows:
                out["overlap"] = {f"{u} ∥ MMA": _f(overlap_share(c, u, fl)) for u in user}
        return out
    from ..analysis.overlap import per_cta

    ctas = per_cta(cta_time_order(trace))
    out = {}
    for a, b in (("qk", "softmax"), ("pv", "softmax")):
        col = f"{a}_{b}_overlap"
        if col in ctas.column_names:
            frac = ctas[col].to_numpy(zero_copy_only=False)
            w = ctas[f"{b}_ns"].to_numpy(zero_copy_only=False).astype(np.float64)
            ok = ~np.isnan(frac) & (w > 0)
            if ok.any():
                out.setdefault("overlap", {})[f"{a.upper()} ∥ {b.upper()}"] = float((frac[ok] * w[ok]).sum() / w[ok].sum())
    if "tensor_core_busy" in ctas.column_names:
        tc = ctas["tensor_core_busy"].to_numpy(zero_copy_only=False)
        if tc.size and not np.isnan(tc).all():
            out["tensor_core_busy"] = float(np.nanmean(tc))
    return out


def cta_time_order(trace: Trace) -> Trace:
    """The rows in (launch, CTA, start) order, stable. The per-CTA figures sort each CTA's span
    boundaries by time: from rows in this order that sort merges runs already in order (a
    bundle holds its rows warp by warp, whose times interleave). The figures are the same."""
    ev = trace.events
    if ev.num_rows < 2:
        return trace
    start = ev["start_ns"].to_numpy()
    lo, hi = int(start.min()), int(start.max())
    la, cta = ev["launch"].to_numpy().astype(np.int64), ev["cta"].to_numpy().astype(np.int64)
    if lo < 0 or hi >= 1 << 40 or int(la.min()) < 0 or int(la.max()) >= 1 << 7 or int(cta.min()) < 0 or int(cta.max()) >= 1 << 16:
        return trace  # does not pack into one sort key: left as it is
    order = np.argsort((la << 56) | (cta << 40) | start, kind="stable")
    return Trace(ev.take(pa.array(order)), trace.meta)


def read_report(path: str | os.PathLike) -> MergeReport:
    """The report stored at the start of a merged Perfetto file (one clear line if there is none)."""
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    path = Path(path)
    if not path.is_file():
        raise Fa4traceError(f"{path}: no such file")
    with open(path, "rb") as f:
        for _ in range(HEAD_PACKETS):  # the report is among the first packets (merge writes it second)
            head = f.read(11)
            if not head:
                break
            if head[0] != 0x0A:
                raise TraceFormatError(f"{path} is not a Perfetto protobuf trace")
            n, pos = _varint(head, 1)
            f.seek(f.tell() - len(head) + pos)
            body = f.read(n)
            try:
                pkt = pb.TracePacket.FromString(body)
            except Exception:  # protobuf's DecodeError: damage reads as "not a merged file"
                raise TraceFormatError(f"{path}: not a readable Perfetto trace") from None
            te = pkt.track_event if pkt.HasField("track_event") else None
            if te is None or te.name != REPORT_SLICE:
                continue
            for da in te.debug_annotations:
                if da.name == REPORT_ARG:
                    try:
                        return MergeReport.from_dict(json.loads(da.string_value))
                    except (ValueError, TypeError) as exc:
                        raise TraceFormatError(f"{path}: the merge report is not valid JSON ({exc})") from None
    raise TraceFormatError(f"{path} is not a Perfetto trace written by fa4trace merge (no merge report in it)")


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    v, shift = 0, 0
    while True:
        if pos >= len(buf):
            raise TraceFormatError("truncated Perfetto packet header")
        b = buf[pos]
        pos += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return v, pos
