"""Read a torch.profiler trace (``prof.export_chrome_trace``, Kineto's Chrome JSON) into columns.

What is kept, as numpy arrays over the trace's events (``KinetoTrace``):

* every complete event (``"ph": "X"``): host ops (``cpu_op``, ``user_annotation``,
  ``python_function``), CUDA runtime / driver calls (``cuda_runtime``, ``cuda_driver``) and
  device activity (``kernel``, ``gpu_memcpy``, ``gpu_memset``, ``gpu_user_annotation``), with
  the args matching needs: ``correlation`` (runtime call <-> kernel), ``device``, ``stream``,
  ``grid`` and ``block``;
* instant events (``"ph": "i"``) as zero-length events;
* flow events (``"ph": "s"`` / ``"f"``, e.g. Kineto's ``fwdbwd``), each bound to the complete
  event it follows in the file on the same thread at the same time (Kineto writes a flow right
  after its activity). Kineto's ``ac2g`` launch arrows are not read: every launch call and its
  kernel share a ``correlation`` id, which says the same (:meth:`KinetoTrace.launch_calls`);
* process and thread names and sort indices (``"ph": "M"``).

Times: Kineto writes ``ts`` / ``dur`` in µs relative to ``baseTimeNanoseconds`` (Unix-epoch
ns), with three decimals; they become int64 epoch ns here. Traces without
``baseTimeNanoseconds`` (torch < 2.1) hold epoch µs, read exactly from their text.

The parser is ``msgspec`` where it is installed: it decodes the events straight into typed
records, the args of an event left as raw JSON text until matching needs them (GPU activity,
launch calls, metadata), which reads a 200 MB trace several times faster and in a fraction of
the memory. Without it (or for a trace whose events it cannot type) the standard library's
``json`` (``orjson`` where installed) parses the document, Arrow types the fields every event
has and Python reads only the args of GPU activity and launch calls (one Python pass over
every event where Arrow cannot type them). Every way gives the same columns. No torch is
needed (host-only).
"""

from __future__ import annotations

import contextlib
import gc
import gzip
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..format.errors import Fa4traceError, TraceFormatError

try:  # optional: a faster JSON parser, used where it is installed
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None

try:  # optional: typed decoding of the events (the module docstring), used where it is installed
    import msgspec as _msgspec
except ImportError:  # pragma: no cover - depends on the environment
    _msgspec = None

__all__ = ["KinetoTrace", "Track", "load_kineto", "parse_kineto", "GPU_CATEGORIES", "LAUNCH_CATEGORIES"]

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_sync")
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")  # host calls that carry a correlation id
_SPECIAL = frozenset(GPU_CATEGORIES) | frozenset(LAUNCH_CATEGORIES)  # the events whose args matching reads
KIND_SLICE, KIND_INSTANT = 0, 1


@dataclass
class Track:
    """One (pid, tid) lane of the Kineto trace: a host thread, a CUDA stream, or a label track."""

    pid: object  # int, or a string for Kineto's label processes ("Spans", "Traces")
    tid: object
    process_name: str = ""
    process_label: str = ""  # Kineto's process_labels ("CPU", "GPU 0")
    thread_name: str = ""
    process_sort: int | None = None
    thread_sort: int | None = None
    device: bool = False  # a CUDA device's stream (kernels, copies), not a host thread

    @property
    def label(self) -> str:
        if self.thread_name:
            return self.thread_name
        return f"stream {self.tid}" if self.device else f"thread {self.tid}"


@dataclass
class KinetoTrace:
    """The events of a torch.profiler trace as columns (one row per complete or instant event)."""

    path: str
    base_ns: int
    kind: np.ndarray  # int8: KIND_SLICE, KIND_INSTANT
    cat: np.ndarray  # int32 codes into cats
    cats: list
    name: np.ndarray  # int32 codes into names
    names: list
    track: np.ndarray  # int32 codes into tracks
    tracks: list
    ts: np.ndarray  # int64 epoch ns
    dur: np.ndarray  # int64 ns
    correlation: np.ndarray  # int64, -1 = none
    device: np.ndarray  # int32, -1 = none
    stream: np.ndarray  # int64, -1 = none
    grid: np.ndarray  # int64 (n, 3), -1 = none
    block: np.ndarray  # int64 (n, 3), -1 = none
    flow_src: np.ndarray  # int64 event rows: one flow arrow from src to dst (launch arrows: see launch_calls)
    flow_dst: np.ndarray
    flow_cat: list  # category of each flow ("fwdbwd", ...)
    device_properties: list = field(default_factory=list)
    metadata: dict = field(default_factory=dict)  # top-level keys other than traceEvents
    skipped: dict = field(default_factory=dict)  # ph -> count of events not kept

    @property
    def n(self) -> int:
        return int(self.ts.size)

    def cat_mask(self, *cats: str) -> np.ndarray:
        codes = [i for i, c in enumerate(self.cats) if c in cats]
        return np.isin(self.cat, codes) if codes else np.zeros(self.n, bool)

    def kernels(self) -> np.ndarray:
        """Rows of CUDA kernel activity, in time order."""
        rows = np.flatnonzero(self.cat_mask("kernel"))
        return rows[np.argsort(self.ts[rows], kind="stable")]

    def launch_calls(self) -> dict:
        """correlation id -> row of the host runtime / driver call that launched it."""
        rows = np.flatnonzero(self.cat_mask(*LAUNCH_CATEGORIES) & (self.correlation >= 0))
        return dict(zip(self.correlation[rows].tolist(), rows.tolist()))

    def gpu_names(self) -> list[str]:
        return [str(d.get("name")) for d in self.device_properties if isinstance(d, dict) and d.get("name")]


def load_kineto(path: str | os.PathLike) -> KinetoTrace:
    """Read a torch.profiler Chrome trace (.json or .json.gz). One-line errors for anything else."""
    path = Path(path)
    if not path.exists():
        raise Fa4traceError(f"{path}: no such file")
    if path.is_dir():
        raise Fa4traceError(f"{path} is a directory, not a torch.profiler trace")
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise TraceFormatError(f"{path}: a damaged gzip file ({exc})") from None
    return parse_kineto(raw, str(path))


def _loads(raw: bytes, exact_floats: bool):
    if exact_floats:
        return json.loads(raw, parse_float=str)
    if _orjson is not None:
        return _orjson.loads(raw)
    return json.loads(raw)


def parse_kineto(raw: bytes, path: str = "<trace>") -> KinetoTrace:
    """Parse the bytes of a Kineto Chrome trace (see the module docstring). Python's garbage
    collector is paused meanwhile: the parse makes hundreds of thousands of objects and no
    reference cycle, and every collection would walk them all (a fifth of the time)."""
    with _collector_paused():
        return _parse_kineto(raw, path)


@contextlib.contextmanager
def _collector_paused():
    """Python's cyclic garbage collector off, then back as it was."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _parse_kineto(raw: bytes, path: str) -> KinetoTrace:
    if raw[:4] == b"PAR1":
        raise TraceFormatError(f"{path} is a Parquet file (a fa4trace bundle?), not a torch.profiler JSON trace")
    head = raw[:65536]
    exact = b"baseTimeNanoseconds" not in head and b'"traceEvents"' in head
    typed = None if exact else _decode_typed(raw)
    if typed is not None:
        top, sc = typed
        try:
            base = int(top.get("baseTimeNanoseconds", 0) or 0)
        except (TypeError, ValueError):
            raise TraceFormatError(f"{path}: baseTimeNanoseconds is not an integer") from None
        try:
            return _from_scan(sc, top, base, path, exact)
        except (TypeError, ValueError, AttributeError) as exc:
            raise TraceFormatError(f"{path}: malformed trace event ({type(exc).__name__}: {exc})") from None
    try:
        doc = _loads(raw, exact)
    except (ValueError, UnicodeDecodeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TraceFormatError(f"{path} is not JSON ({first}): expected prof.export_chrome_trace's output") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise TraceFormatError(f"{path}: not a torch.profiler Chrome trace (no traceEvents list)")
    try:
        base = int(doc.get("baseTimeNanoseconds", 0) or 0)
    except (TypeError, ValueError):
        raise TraceFormatError(f"{path}: baseTimeNanoseconds is not an integer") from None
    try:
        return _columns(doc, base, path, exact)
    except (TypeError, ValueError, AttributeError) as exc:
        raise TraceFormatError(f"{path}: malformed trace event ({type(exc).__name__}: {exc})") from None


def _ns_exact(v, base: int) -> int:
    """A time field read as its decimal text (µs, three decimals) -> epoch ns, exactly."""
    if not isinstance(v, str):
        return base + int(round(float(v) * 1000.0))
    neg = v.startswith("-")
    whole, _, frac = v.lstrip("-").partition(".")
    ns = int(whole or 0) * 1000 + int((frac + "000")[:3])
    return base + (-ns if neg else ns)


NO_XYZ = (-1, -1, -1)


def _xyz(v) -> tuple:
    if isinstance(v, (list, tuple)) and len(v) == 3:
        return int(v[0]), int(v[1]), int(v[2])
    return NO_XYZ


def _int(v, default=-1) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


@dataclass
class _Scan:
    """The kept events (complete and instant) of a trace, before conversion to ns."""

    kind: object  # per kept event: KIND_*
    cat: object  # codes into cats
    cats: list
    name: object  # codes into names
    names: list
    track: object  # codes into track_code's keys
    track_code: dict  # (pid, tid) -> code
    ts: object  # Kineto's µs values (floats, or the exact decimal text)
    dur: object
    with_args: list  # (row, category, args) of GPU activity and launch calls
    flow_ev: list  # (ph, category, id, ts, row of the complete event before it on its thread or None)
    meta_ev: list  # the "M" events
    skipped: dict
    arg_cols: tuple | None = None  # what the args loop of _from_scan gives, already read (msgspec's scan)


_EVENT_TYPE = pa.struct([("ph", pa.string()), ("cat", pa.string()), ("name", pa.string()),
                         ("ts", pa.float64()), ("dur", pa.float64())])


def _scan_arrow(events: list) -> _Scan:
    """The fast way: Arrow converts the fields every event has (C++), Python touches only the
    thread keys, the args of GPU activity and launch calls, and the flow and metadata events.
    Raises (Arrow or TypeError) on events it cannot type: the caller then uses _scan_python."""
    st = pa.array(events, type=_EVENT_TYPE)
    ph = st.field("ph").fill_null("")
    keep_m = pc.is_in(ph, pa.array(["X", "i", "I"])).to_numpy(zero_copy_only=False)
    flow_m = pc.is_in(ph, pa.array(["s", "f", "t"])).to_numpy(zero_copy_only=False)
    ac2g = flow_m & pc.equal(st.field("cat").fill_null(""), "ac2g").to_numpy(zero_copy_only=False)
    flow_m = flow_m & ~ac2g  # launch arrows: the correlation ids say the same (KinetoTrace.launch_calls)
    meta_m = pc.equal(ph, "M").to_numpy(zero_copy_only=False)
    K = np.flatnonzero(keep_m)
    is_x = pc.equal(ph, "X").to_numpy(zero_copy_only=False)
    kind = np.where(is_x[K], KIND_SLICE, KIND_INSTANT).astype(np.int8)

    def codes(field):
        d = pc.dictionary_encode(st.field(field).fill_null("").take(pa.array(K)))
        return d.indices.to_numpy(zero_copy_only=False).astype(np.int32), [str(x) for x in d.dictionary.to_pylist()]

    cat, cats = codes("cat")
    name, names = codes("name")
    ts = st.field("ts").fill_null(0).to_numpy(zero_copy_only=False)[K]
    dur = np.where(is_x, st.field("dur").fill_null(0).to_numpy(zero_copy_only=False), 0.0)[K]
    get = events.__getitem__
    kept = [get(i) for i in K.tolist()]
    keys = [(e.get("pid", ""), e.get("tid", "")) for e in kept]
    track_code = {k: i for i, k in enumerate(dict.fromkeys(keys))}
    track = np.array([track_code[k] for k in keys], np.int32)
    special = [i for i, c in enumerate(cats) if c in _SPECIAL]
    rows = np.flatnonzero(np.isin(cat, special)).tolist() if special else []
    cat_l = cat.tolist()
    with_args = [(r, cats[cat_l[r]], kept[r].get("args")) for r in rows]
    # each flow binds to the last complete event before it on its thread (Kineto writes it right after)
    F = np.flatnonzero(flow_m)
    flow_ev = []
    if F.size:
        n = len(events) + 1
        xr = np.flatnonzero(is_x[K])  # kept rows that are complete events
        xkey = track[xr].astype(np.int64) * n + K[xr]
        o = np.argsort(xkey, kind="stable")
        xkey, xr = xkey[o], xr[o]
        fe = [get(i) for i in F.tolist()]
        ftrack = np.array([track_code.get((e.get("pid", ""), e.get("tid", "")), -1) for e in fe], np.int64)
        pos = np.searchsorted(xkey, ftrack * n + F) - 1
        ok = (ftrack >= 0) & (pos >= 0)
        ok[ok] = (xkey[pos[ok]] // n) == ftrack[ok]
        prev = np.where(ok, xr[np.maximum(pos, 0)], -1)
        f_ph = ph.take(pa.array(F)).to_pylist()
        f_cat = st.field("cat").fill_null("").take(pa.array(F)).to_pylist()
        f_ts = st.field("ts").fill_null(0).take(pa.array(F)).to_pylist()
        flow_ev = [(p_, c_, e.get("id"), t_, int(r_) if r_ >= 0 else None)
                   for p_, c_, e, t_, r_ in zip(f_ph, f_cat, fe, f_ts, prev.tolist())]
    meta_ev = [get(i) for i in np.flatnonzero(meta_m).tolist()]
    other = ~(keep_m | flow_m | meta_m | ac2g)
    skipped = {}
    if other.any():
        for v, c in zip(*np.unique(ph.take(pa.array(np.flatnonzero(other))).to_numpy(zero_copy_only=False),
                                   return_counts=True)):
            skipped[str(v) or "None"] = int(c)
    return _Scan(kind, cat, cats, name, names, track, track_code, ts, dur, with_args, flow_ev, meta_ev, skipped)


def _scan_python(events: list) -> _Scan:
    """The general way: one Python pass over the events (any JSON values: exact decimal times,
    odd types); the hot loop does only dict lookups and appends."""
    cat_code: dict = {}
    name_code: dict = {}
    track_code: dict = {}
    kind, cat, name, track, ts, dur = [], [], [], [], [], []
    with_args: list = []
    prev_x: dict = {}  # track -> row of the last complete event on it
    flow_ev: list = []
    meta_ev: list = []
    skipped: dict = {}
    instant_ph = {"i": KIND_INSTANT, "I": KIND_INSTANT, "X": KIND_SLICE}
    for ev in events:
        if type(ev) is not dict:
            skipped["not an object"] = skipped.get("not an object", 0) + 1
            continue
        ph = ev.get("ph")
        k = instant_ph.get(ph)
        if k is not None:
            key = (ev.get("pid", ""), ev.get("tid", ""))
            tr = track_code.get(key)
            if tr is None:
                tr = track_code[key] = len(track_code)
            c = ev.get("cat", "")
            cc = cat_code.get(c)
            if cc is None:
                cc = cat_code[c] = len(cat_code)
            nm = ev.get("name", "")
            nc = name_code.get(nm)
            if nc is None:
                nc = name_code[nm] = len(name_code)
            row = len(ts)
            kind.append(k)
            cat.append(cc)
            name.append(nc)
            track.append(tr)
            ts.append(ev.get("ts", 0))
            dur.append(ev.get("dur", 0) if k == KIND_SLICE else 0)
            if c in _SPECIAL:
                with_args.append((row, c, ev.get("args")))
            if k == KIND_SLICE:
                prev_x[tr] = row
        elif ph == "s" or ph == "f" or ph == "t":
            c = ev.get("cat", "")
            if c == "ac2g":  # launch arrows: the correlation ids say the same (KinetoTrace.launch_calls)
                continue
            tr = track_code.get((ev.get("pid", ""), ev.get("tid", "")))
            flow_ev.append((ph, c, ev.get("id"), ev.get("ts", 0), prev_x.get(tr) if tr is not None else None))
        elif ph == "M":
            meta_ev.append(ev)
        else:
            skipped[str(ph)] = skipped.get(str(ph), 0) + 1
    return _Scan(np.array(kind, np.int8), np.array(cat, np.int32), [str(c) for c in cat_code],
                 np.array(name, np.int32), [str(n) for n in name_code], np.array(track, np.int32), track_code,
                 ts, dur, with_args, flow_ev, meta_ev, skipped)



# ---- msgspec: typed decoding (the module docstring) ------------------------------------------

if _msgspec is not None:
    from typing import Any

    class _Args(_msgspec.Struct, gc=False):
        """The args matching reads of GPU activity and launch calls; any others are skipped. Grid and block are lists of
        ints (a trace with others is read the general way); the rest is checked where it is
        read, as the general way does. Not tracked by Python's garbage collector (``gc=False``:
        they hold no reference cycles): hundreds of thousands of tracked records make every
        collection while they are alive walk them all (decoding the args slowed several-fold)."""

        correlation: Any = None
        device: Any = None
        stream: Any = None
        grid: list[int] | None = None
        block: list[int] | None = None

    class _Event(_msgspec.Struct, gc=False):
        """One trace event as msgspec decodes it: the fields every reader needs (untracked by
        the garbage collector, as :class:`_Args`)."""

        ph: str = ""
        cat: str = ""
        name: str = ""
        pid: int | str = ""
        tid: int | str = ""
        ts: float = 0.0
        dur: float = 0.0
        id: int | str | None = None
        args: _msgspec.Raw = _msgspec.Raw()  # left undecoded (empty: no args); see _scan_typed

    _EVENTS = _msgspec.json.Decoder(list[_Event])
    _ARGS = _msgspec.json.Decoder(list[_Args])
    _TOP = _msgspec.json.Decoder(dict[str, _msgspec.Raw])
    _ANY = _msgspec.json.Decoder()


def _decode_typed(raw: bytes):
    """(top-level keys but traceEvents, scan) by msgspec, or None where it is not installed or
    cannot type the trace (the caller then parses it the general way, which also words the
    error of a trace that is not one)."""
    if _msgspec is None:
        return None
    try:
        top = _TOP.decode(raw)
        ev_raw = top.pop("traceEvents", None)
        if ev_raw is None:
            return None
        events = _EVENTS.decode(ev_raw)
        doc = {k: _ANY.decode(v) for k, v in top.items()}
        return doc, _scan_typed(events)
    except (_msgspec.DecodeError, _msgspec.ValidationError, TypeError, ValueError):
        return None


def _ints(values: list) -> list:
    """:func:`_int` of each value (ints pass as they are)."""
    return [v if type(v) is int else _int(v) for v in values]


def _xyzs(values: list) -> np.ndarray:
    """:func:`_xyz` of each value (None or a list of ints), as an (n, 3) int64 array."""
    return np.array([v if v is not None and len(v) == 3 else NO_XYZ for v in values], np.int64).reshape(-1, 3)


def _scan_typed(events: list) -> _Scan:
    """:func:`_scan_arrow`'s result from msgspec's typed events (the same columns)."""
    ph = pa.array([e.ph for e in events], pa.string())
    keep_m = pc.is_in(ph, pa.array(["X", "i", "I"])).to_numpy(zero_copy_only=False)
    flow_m = pc.is_in(ph, pa.array(["s", "f", "t"])).to_numpy(zero_copy_only=False)
    meta_m = pc.equal(ph, "M").to_numpy(zero_copy_only=False)
    is_x = pc.equal(ph, "X").to_numpy(zero_copy_only=False)
    K = np.flatnonzero(keep_m)
    kept = [events[i] for i in K.tolist()]
    kind = np.where(is_x[K], KIND_SLICE, KIND_INSTANT).astype(np.int8)

    def codes(values):
        d = pc.dictionary_encode(pa.array(values, pa.string()))
        return d.indices.to_numpy(zero_copy_only=False).astype(np.int32), [str(x) for x in d.dictionary.to_pylist()]

    cat, cats = codes([e.cat for e in kept])
    name, names = codes([e.name for e in kept])
    ts = np.array([e.ts for e in kept], np.float64)
    dur = np.where(is_x[K], np.array([e.dur for e in kept], np.float64), 0.0) if kept else np.zeros(0)
    keys = [(e.pid, e.tid) for e in kept]
    track_code = {k: i for i, k in enumerate(dict.fromkeys(keys))}
    track = np.array([track_code[k] for k in keys], np.int32)
    special = [i for i, c in enumerate(cats) if c in _SPECIAL]
    rows = np.flatnonzero(np.isin(cat, special)).tolist() if special else []
    cat_l = cat.tolist()
    # the args of GPU activity and launch calls: decoded in one call, as one JSON list
    raws = [kept[r].args for r in rows]
    r_c = [r for r, a in zip(rows, raws) if len(a)]
    a_c = _ARGS.decode(b"[" + b",".join(a for a in raws if len(a)) + b"]") if r_c else []
    gpu_cats = set(GPU_CATEGORIES)
    g = [i for i, r in enumerate(r_c) if cats[cat_l[r]] in gpu_cats]
    a_g = [a_c[i] for i in g]
    arg_cols = (r_c, _ints([a.correlation for a in a_c]), [r_c[i] for i in g], _ints([a.device for a in a_g]),
                _ints([a.stream for a in a_g]), _xyzs([a.grid for a in a_g]), _xyzs([a.block for a in a_g]))
    F = np.flatnonzero(flow_m)
    fe = [events[i] for i in F.tolist()]
    ac2g = np.array([e.cat == "ac2g" for e in fe], bool)
    flow_ev = []
    if F.size and not ac2g.all():
        F, fe = F[~ac2g], [e for e, a in zip(fe, ac2g.tolist()) if not a]
        n = len(events) + 1
        xr = np.flatnonzero(is_x[K])
        xkey = track[xr].astype(np.int64) * n + K[xr]
        o = np.argsort(xkey, kind="stable")
        xkey, xr = xkey[o], xr[o]
        ftrack = np.array([track_code.get((e.pid, e.tid), -1) for e in fe], np.int64)
        pos = np.searchsorted(xkey, ftrack * n + F) - 1
        ok = (ftrack >= 0) & (pos >= 0)
        ok[ok] = (xkey[pos[ok]] // n) == ftrack[ok]
        prev = np.where(ok, xr[np.maximum(pos, 0)], -1)
        flow_ev = [(e.ph, e.cat, e.id, e.ts, int(r_) if r_ >= 0 else None) for e, r_ in zip(fe, prev.tolist())]
    meta_ev = [{"name": e.name, "ph": e.ph, "pid": e.pid, "tid": e.tid, "args": _ANY.decode(e.args) if len(e.args) else {}}
               for e in (events[i] for i in np.flatnonzero(meta_m).tolist())]
    other = ~(keep_m | flow_m | meta_m)
    skipped = {}
    if other.any():
        for v, c in zip(*np.unique(ph.take(pa.array(np.flatnonzero(other))).to_numpy(zero_copy_only=False),
                                   return_counts=True)):
            skipped[str(v) or "None"] = int(c)
    return _Scan(kind, cat, cats, name, names, track, track_code, ts, dur, [], flow_ev, meta_ev, skipped, arg_cols)


def _columns(doc: dict, base: int, path: str, exact: bool) -> KinetoTrace:
    """The events as columns (module docstring): scanned by Arrow where it can type them, else by
    one Python pass; then times to ns, and args read only for the events that carry what
    matching needs."""
    events = doc["traceEvents"]
    sc = None
    if not exact:
        try:
            sc = _scan_arrow(events)
        except (pa.ArrowException, TypeError, ValueError, AttributeError):
            sc = None  # events Arrow cannot type (a string time, a non-object): the general way
    if sc is None:
        sc = _scan_python(events)
    return _from_scan(sc, doc, base, path, exact)


def _from_scan(sc: _Scan, doc: dict, base: int, path: str, exact: bool) -> KinetoTrace:
    """A scan's events as a KinetoTrace: times to ns, the args matching needs, flows paired,
    process and thread metadata applied. ``doc``: the trace's top-level keys (its traceEvents
    are not read here)."""
    tracks = [Track(pid, tid) for pid, tid in sc.track_code]
    track_code, skipped, with_args, flow_ev, meta_ev = sc.track_code, sc.skipped, sc.with_args, sc.flow_ev, sc.meta_ev
    kind, cat, name, ts, dur = sc.kind, sc.cat, sc.name, sc.ts, sc.dur
    cat_code = dict.fromkeys(sc.cats)
    name_code = dict.fromkeys(sc.names)
    track = sc.track
    n = int(kind.size)
    i64 = np.int64
    if exact:
        ts_ns = np.array([_ns_exact(v, base) for v in ts], i64)
        dur_ns = np.array([_ns_exact(v, 0) for v in dur], i64)
    else:
        ts_ns = np.rint(np.asarray(ts, np.float64) * 1000.0).astype(i64) + base
        dur_ns = np.rint(np.asarray(dur, np.float64) * 1000.0).astype(i64)
    dur_ns = np.maximum(dur_ns, 0)
    corr = np.full(n, -1, i64)
    dev = np.full(n, -1, np.int32)
    stream = np.full(n, -1, i64)
    grid = np.full((n, 3), -1, i64)
    block = np.full((n, 3), -1, i64)
    gpu_cats = set(GPU_CATEGORIES)
    track_arr = np.asarray(track, np.int32)
    r_c, v_c, r_g, v_dev, v_str, v_grid, v_block = sc.arg_cols or ([], [], [], [], [], [], [])
    for row, c, args in with_args:
        if type(args) is not dict:
            continue
        r_c.append(row)
        v_c.append(_int(args.get("correlation")))
        if c in gpu_cats:
            r_g.append(row)
            v_dev.append(_int(args.get("device")))
            v_str.append(_int(args.get("stream")))
            v_grid.append(_xyz(args.get("grid")))
            v_block.append(_xyz(args.get("block")))
    if r_c:
        corr[r_c] = v_c
    if r_g:
        dev[r_g], stream[r_g] = v_dev, v_str
        grid[r_g] = np.asarray(v_grid, i64).reshape(-1, 3)
        block[r_g] = np.asarray(v_block, i64).reshape(-1, 3)
        for t in np.unique(track_arr[r_g]).tolist():
            tracks[t].device = True

    flows: dict = {}
    for ph, c, fid, t, row in flow_ev:
        t_ns = _ns_exact(t, base) if exact else int(round(float(t) * 1000.0)) + base
        if row is None or abs(t_ns - int(ts_ns[row])) > 1:
            skipped["flow without its event"] = skipped.get("flow without its event", 0) + 1
            continue
        ends = flows.setdefault((c, fid), [-1, -1])
        ends[0 if ph == "s" else 1] = row

    for ev in meta_ev:
        pid, tid = ev.get("pid", ""), ev.get("tid", "")
        args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
        nm = ev.get("name")
        if nm in ("process_name", "process_labels", "process_sort_index"):
            for t in tracks:
                if t.pid == pid:
                    _apply_process_meta(t, nm, args)
        elif nm in ("thread_name", "thread_sort_index"):
            code = track_code.get((pid, tid))
            if code is not None:
                if nm == "thread_name":
                    tracks[code].thread_name = str(args.get("name", ""))
                else:
                    tracks[code].thread_sort = _int(args.get("sort_index"), None)
    for t in tracks:  # a process labelled "GPU n" holds device tracks
        if t.process_label.startswith("GPU"):
            t.device = True

    pairs = [(s, d, c) for (c, _i), (s, d) in flows.items() if s >= 0 and d >= 0 and s != d]
    n_unpaired = sum(1 for s, d in flows.values() if s < 0 or d < 0)
    if n_unpaired:
        skipped["flow without its other end"] = n_unpaired
    return KinetoTrace(
        path=path, base_ns=base,
        kind=kind, cat=cat, cats=list(cat_code), name=name, names=list(name_code), track=track_arr, tracks=tracks,
        ts=ts_ns, dur=dur_ns, correlation=corr, device=dev, stream=stream, grid=grid, block=block,
        flow_src=np.array([p[0] for p in pairs], i64), flow_dst=np.array([p[1] for p in pairs], i64),
        flow_cat=[p[2] for p in pairs],
        device_properties=list(doc.get("deviceProperties") or []),
        metadata={k: v for k, v in doc.items() if k not in ("traceEvents", "deviceProperties")},
        skipped=skipped)


def _apply_process_meta(t: Track, what: str, args: dict) -> None:
    if what == "process_name":
        t.process_name = str(args.get("name", ""))
    elif what == "process_labels":
        t.process_label = str(args.get("labels", ""))
    else:
        t.process_sort = _int(args.get("sort_index"), None)
