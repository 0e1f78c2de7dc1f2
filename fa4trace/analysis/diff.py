"""What changed from one bundle of a kernel to another, per role and stage, beyond noise:
the numbers behind `fa4trace diff BASE NEW`.

**Figures.** For each bundle, per role (the warps' recorded roles; for kernels traced by
fa4trace.instrument the roles fa4trace.analysis.roles decides) and stage (an event, a pipeline,
a pair of events):

* ``span`` / ``wait``: the duration of each span of one event name by the role's warps (a wait:
  an automatic event whose op waits, fa4trace.analysis.autoevents, or a hand-placed ``WAIT_*``);
* ``lag``: producer -> consumer: for automatic pipelines, a consumer's wait end minus the fill of
  that count (fa4trace.analysis.kernel.pipeline_lags); for the attention events, the start of a
  consumer's QK (PV) minus the end of the producer's LOAD_K (LOAD_V) of the same block;
* ``overlap``: the share of a CTA's SOFTMAX time with a QK (PV) in flight (attention events,
  fa4trace.analysis.overlap.per_cta), or of a named span's time with the warp's own MMA groups in
  flight (automatic events, fa4trace.analysis.mma_flight); ``tensor_busy``: QK ∪ PV over the CTA;
* ``busy`` / ``waiting`` / ``idle``: shares of the role's warps' lifetimes
  (fa4trace.analysis.kernel.role_fractions, waits as above);
* ``duration``: the CTA's span (first warp start to last warp end), and, where the bundle timed
  the CTAs that did not record (fa4trace.analysis.fidelity), those untraced CTAs' lifetimes.

**Units.** Each figure is a distribution over the bundle's independent units: per CTA (a
span's per-CTA value is the median of its spans in that CTA). Launches are never pooled
blindly: by default the i-th launch of BASE is compared with the i-th of NEW, each pair on its
own (two launches of one kernel may run other shapes, and a persistent kernel's grid does not
say so), as fa4trace.analysis.launches compares them. Where each bundle repeats one launch
(``repeats``: a loop around the same call), its launches are one group, refused where they ran
different grids or CUDA symbols. The unit is the coarsest whose counts can reach the band's
level (``coarsest_unit``): the launch (the median over its CTAs), so that the band holds the
launch-to-launch noise too, where both groups hold enough launches (8 and 8 do for a diff of
20-odd figures); else the CTA, pooled over the group's launches; else, for span, wait and lag
figures, ``BATCHES`` consecutive batches of each warp's spans (FA4's decode at 16:1 runs one
CTA): such a band says how steady those few CTAs were, not how the kernel varies.

**Noise.** The change of a figure is the Hodges–Lehmann estimate over the two sets of units and
its band the Mann–Whitney (Moses) interval (fa4trace.analysis.noise says why a rank method):
on log values for durations (change in %, the ratio NEW/BASE), on the values themselves for
lags (in ns, and in % of BASE's median) and shares (in points). The band's level is
family-wise: ``confidence`` (95%) for all the figures judged together, each at
1 - (1 - confidence) / figures (Bonferroni), so that two bundles that differ only by noise show
nothing beyond it, however many figures a kernel has. A figure moved beyond noise when its
band excludes no change; it then regressed or improved by the direction that is better for it
(``METRICS``), or just changed (busy and idle shares have no better direction), unless the
change is below ``MIN_CHANGE`` (1%, or 1 point of a share): then it is "negligible". Why a
floor: what the bundles cannot show. A bundle's launches run back to back, under one SM clock;
two recordings of the same build, seconds apart, can run at different clocks, and their spans
move with the clock beyond a band made of their launches (docs/diff.md, "Why a floor", shows it
on traces/diff). Launches in the band (``repeats``) catch the noise within a recording, the
floor the drift between recordings; ``min_change`` raises it where a GPU drifts more.

**Same kernel.** Two bundles diff when they ran the same kernel (for automatic bundles the
CUDA kernel functions fa4trace.instrument compiled, the bundle's ``instrument.kernels``; the label a
script gave them may differ, as FA4's causal and non-causal prefill do) and their event
vocabularies agree (every event both name has the same family, op and resource). Anything else
is refused in one line. Different configurations of one kernel are diffed, and the result says
how they differ (``differs``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..format.errors import Fa4traceError
from ..trace.bundle import Trace
from ..trace.meta import InstrumentMeta, LaunchMeta
from .autoevents import AutoCols, is_automatic
from .noise import Shift, critical_count, shift_band
from .overlap import config_diff, diff_text, json_safe, overlap_length

CONFIDENCE = 0.95  # family-wise over every figure of a diff
BATCHES = 4  # batches per warp where too few CTAs recorded (module docstring)
MIN_CHANGE = 1.0  # %, points for shares: smaller changes beyond the band are "negligible" (module docstring)
CLOCK_NOTE = 0.01  # SM clocks further apart than this: a note says so
DIFF_FORMAT = "fa4trace-diff"
DIFF_VERSION = 1

# metric -> (scale, unit, better). scale "ratio": log values, change in %; "shift": the values
# themselves (ns: change also in % of BASE's median; share: in points). better: which way is
# an improvement (None: neither, the figure only "changed").
METRICS = {
    "span": ("ratio", "ns", "lower"),
    "wait": ("ratio", "ns", "lower"),
    "duration": ("ratio", "ns", "lower"),
    "lag": ("shift", "ns", "lower"),
    "overlap": ("shift", "share", "higher"),
    "tensor_busy": ("shift", "share", "higher"),
    "busy": ("shift", "share", None),
    "waiting": ("shift", "share", "lower"),
    "idle": ("shift", "share", None),
}
# Instance figures: each value belongs to a warp (batches apply); the others are one value per CTA.
INSTANCE_METRICS = ("span", "wait", "lag")
# Attention events: producer -> consumer pairs (the consumer's start minus the producer's end, same block).
ATTENTION_LAGS = (("LOAD_K", "QK"), ("LOAD_V", "PV"))
CTA_ROLE = "cta"  # the role of whole-CTA figures
RECORDING_KEYS = ("cursor", "families", "l2", "spans")  # InstrumentMeta fields of how a bundle recorded


# ---- what each bundle holds --------------------------------------------------------------------
@dataclass
class Values:
    """One figure of one bundle: a value per instance (a span, a lag) or per CTA, with where it
    comes from. ``warp``/``t`` (instance figures): the warp and the time, for batches."""

    launch: np.ndarray
    cta: np.ndarray
    value: np.ndarray
    warp: np.ndarray | None = None
    t: np.ndarray | None = None


def is_hand_wait(name: str) -> bool:
    """A hand-placed event that is a wait: ``WAIT_*`` (our decode kernel's WAIT_K / WAIT_V)."""
    return name.upper() == "WAIT" or name.upper().startswith("WAIT_")


def columns(trace: Trace, roles=None) -> AutoCols:
    """The trace's columns with roles (decided for automatic bundles, ``roles`` winning) and
    waits that include hand-placed ``WAIT_*`` spans (``is_hand_wait``)."""
    if is_automatic(trace):
        from .roles import assign_roles

        trace = assign_roles(trace, roles)
    c = AutoCols.of(trace)
    if c.n:
        hand = np.asarray([is_hand_wait(n) for n in c.name_dict] or [False])
        c.is_wait = c.is_wait | (hand[c.name_codes] & _hand_placed(c) & (c.kind == 0))
    return c


def _hand_placed(c: AutoCols) -> np.ndarray:
    """Per row: an event of no automatic family (hand-placed, or WARP)."""
    return c.family == (c.families.index("") if "" in c.families else -1)


def _role_names(c: AutoCols, codes: np.ndarray) -> np.ndarray:
    names = np.asarray(c.role_dict or ["unknown"], dtype=object)
    return names[codes] if codes.size else np.zeros(0, dtype=object)


def span_figures(c: AutoCols) -> dict:
    """{(role, event, "span" | "wait"): Values} of every span event, per role."""
    out = {}
    rows = np.flatnonzero(c.kind == 0)
    if not rows.size:
        return out
    key = c.role_codes[rows] * max(len(c.name_dict), 1) + c.name_codes[rows]
    for k in np.unique(key).tolist():
        r = rows[key == k]
        role = _role_names(c, c.role_codes[r[:1]])[0]
        name = c.name_dict[int(c.name_codes[r[0]])]
        metric = "wait" if c.is_wait[r[0]] else "span"
        out[(role, name, metric)] = Values(c.launch[r], c.cta[r], (c.end[r] - c.start[r]).astype(np.float64),
                                           c.warp[r], c.start[r])
    return out


def _warp_roles(c: AutoCols) -> np.ndarray:
    """The role code of each warp gid."""
    role = np.zeros(c.n_warps, np.int64)
    role[c.warp_gid] = c.role_codes
    return role


def _warp_gid_of(c: AutoCols, launch, cta, warp) -> np.ndarray:
    """The warp gid of (launch, cta, warp) triples (-1 where the trace has no such warp)."""
    k = c.warp_keys.astype(np.int64)
    packed = (k[:, 0] << 48) | (k[:, 1] << 16) | k[:, 2]
    q = (np.asarray(launch, np.int64) << 48) | (np.asarray(cta, np.int64) << 16) | np.asarray(warp, np.int64)
    if not packed.size:
        return np.full(q.size, -1, np.int64)
    pos = np.minimum(np.searchsorted(packed, q), packed.size - 1)
    return np.where(packed[pos] == q, pos, -1)


def lag_figures(c: AutoCols) -> dict:
    """{(consumer role, stage, "lag"): Values}: automatic pipelines' lags, and the attention
    events' producer -> consumer pairs (``ATTENTION_LAGS``)."""
    from .kernel import pipeline_lags

    out = {}
    lags = pipeline_lags(c)
    if lags.num_rows:
        launch, cta = lags["launch"].to_numpy().astype(np.int64), lags["cta"].to_numpy().astype(np.int64)
        warp = lags["warp"].to_numpy().astype(np.int64)
        gid = _warp_gid_of(c, launch, cta, warp)
        role = _role_names(c, _warp_roles(c)[np.maximum(gid, 0)])
        pipe = np.asarray(lags["pipeline"].to_pylist(), dtype=object)
        lag = lags["lag_ns"].to_numpy().astype(np.float64)
        it = lags["iter"].to_numpy().astype(np.int64)
        for r, p in sorted({(a, b) for a, b in zip(role.tolist(), pipe.tolist())}):
            m = (role == r) & (pipe == p)
            out[(r, p, "lag")] = Values(launch[m], cta[m], lag[m], warp[m], it[m])
    no_family = _hand_placed(c)
    for prod, cons in ATTENTION_LAGS:
        mp = c.mask(prod) & (c.iter >= 0) & (c.kind == 0) & no_family
        mc = np.flatnonzero(c.mask(cons) & (c.iter >= 0) & (c.kind == 0) & no_family)
        if not mp.any() or not mc.size:
            continue
        pk = (c.cta_gid[mp].astype(np.int64) << 32) | c.iter[mp]
        o = np.lexsort((c.end[mp], pk))  # the first LOAD of a block: its issue
        pk, pend = pk[o], c.end[mp][o]
        first = np.r_[True, pk[1:] != pk[:-1]]
        pk, pend = pk[first], pend[first]
        ck = (c.cta_gid[mc].astype(np.int64) << 32) | c.iter[mc]
        pos = np.minimum(np.searchsorted(pk, ck), pk.size - 1)
        hit = pk[pos] == ck
        rows = mc[hit]
        lag = (c.start[rows] - pend[pos[hit]]).astype(np.float64)
        role = _role_names(c, c.role_codes[rows])
        for r in sorted(set(role.tolist())):
            m = role == r
            out[(r, f"{prod}→{cons}", "lag")] = Values(c.launch[rows][m], c.cta[rows][m], lag[m], c.warp[rows][m],
                                                       c.start[rows][m])
    return out


def overlap_figures(trace: Trace, c: AutoCols) -> dict:
    """{(role, stage, "overlap" | "tensor_busy"): Values} per CTA (module docstring)."""
    out = {}
    if c.mask("SOFTMAX").any() and (c.mask("QK").any() or c.mask("PV").any()):
        from .overlap import per_cta

        t = per_cta(trace)
        launch, cta = t["launch"].to_numpy().astype(np.int64), t["cta"].to_numpy().astype(np.int64)
        sm_role = _mode_role(c, c.mask("SOFTMAX"))
        for col, stage in (("qk_softmax_overlap", "SOFTMAX∥QK"), ("pv_softmax_overlap", "SOFTMAX∥PV")):
            if col in t.column_names and c.mask(stage.split("∥")[1]).any():
                v = t[col].to_numpy(zero_copy_only=False).astype(np.float64)
                ok = ~np.isnan(v)
                out[(sm_role, stage, "overlap")] = Values(launch[ok], cta[ok], v[ok])
        if "tensor_core_busy" in t.column_names:
            v = t["tensor_core_busy"].to_numpy(zero_copy_only=False).astype(np.float64)
            ok = ~np.isnan(v)
            if ok.any():
                out[(CTA_ROLE, "QK∪PV", "tensor_busy")] = Values(launch[ok], cta[ok], v[ok])
    out.update(_mma_overlap_figures(trace, c))
    return out


def _mode_role(c: AutoCols, mask: np.ndarray) -> str:
    codes = c.role_codes[mask]
    return str(_role_names(c, np.array([np.bincount(codes).argmax()]))[0]) if codes.size else "unknown"


def _mma_overlap_figures(trace: Trace, c: AutoCols) -> dict:
    """Named (user) spans of automatic bundles: per CTA, the share of their time with the warp's
    own MMA groups in flight (fa4trace.analysis.mma_flight)."""
    from .mma_flight import mma_in_flight

    user = [e.name for e in trace.vocab.events if e.family == "user" and c.mask(e.name).any()]
    if not user:
        return {}
    fl = mma_in_flight(c)
    if not fl.num_rows:
        return {}
    fkey = _warp_gid_of(c, fl["launch"].to_numpy(), fl["cta"].to_numpy(), fl["warp"].to_numpy())
    known = fkey >= 0
    fs, fe = fl["start_ns"].to_numpy()[known], fl["end_ns"].to_numpy()[known]
    out = {}
    for name in user:
        rows = np.flatnonzero(c.mask(name) & (c.kind == 0))
        if not rows.size:
            continue
        span, _, both = overlap_length(c.warp_gid[rows], c.start[rows], c.end[rows], fkey[known], fs, fe, c.n_warps)
        tot = np.bincount(c.cta_of_warp, weights=span, minlength=c.n_ctas)
        hid = np.bincount(c.cta_of_warp, weights=both, minlength=c.n_ctas)
        ok = tot > 0
        out[(_mode_role(c, c.mask(name)), f"{name}∥mma", "overlap")] = Values(
            c.cta_keys[ok, 0], c.cta_keys[ok, 1], hid[ok] / tot[ok])
    return out


def fraction_figures(c: AutoCols) -> dict:
    """{(role, "lifetime", busy | waiting | idle): Values} per CTA (warps of role ``idle`` left out:
    idle by definition)."""
    from .kernel import role_fractions

    t = role_fractions(c)
    if t.num_rows == 0 or "busy" not in t.column_names:
        return {}
    launch, cta = t["launch"].to_numpy().astype(np.int64), t["cta"].to_numpy().astype(np.int64)
    role = np.asarray(t["role"].to_pylist(), dtype=object)
    out = {}
    for r in sorted(set(role.tolist()) - {"idle"}):
        m = role == r
        for k in ("busy", "waiting", "idle"):
            out[(r, "lifetime", k)] = Values(launch[m], cta[m], t[k].to_numpy()[m].astype(np.float64))
    return out


def cta_figures(trace: Trace, c: AutoCols) -> dict:
    """{("cta", "recorded" | "untraced", "duration"): Values}: the recorded CTAs' spans, and the
    lifetimes of the CTAs that did not record where the bundle timed them."""
    from .fidelity import cta_lifetimes

    out = {}
    wr = c.is_warp_row
    if wr.any():
        first = np.full(c.n_ctas, np.iinfo(np.int64).max)
        last = np.full(c.n_ctas, np.iinfo(np.int64).min)
        np.minimum.at(first, c.cta_gid[wr], c.start[wr])
        np.maximum.at(last, c.cta_gid[wr], c.end[wr])
        ok = last >= first
        out[(CTA_ROLE, "recorded", "duration")] = Values(c.cta_keys[ok, 0], c.cta_keys[ok, 1],
                                                         (last - first)[ok].astype(np.float64))
    life = cta_lifetimes(trace)
    if life is not None:
        untraced = ~life["recorded"].to_numpy(zero_copy_only=False)
        if untraced.any():
            out[(CTA_ROLE, "untraced", "duration")] = Values(
                life["launch"].to_numpy()[untraced].astype(np.int64), life["cta"].to_numpy()[untraced].astype(np.int64),
                life["dur_ns"].to_numpy()[untraced].astype(np.float64))
    return out


def figures_of(trace: Trace, roles=None) -> dict:
    """Every figure of one bundle: {(role, stage, metric): Values} (module docstring)."""
    c = columns(trace, roles)
    out: dict = {}
    if c.n == 0:
        return out
    out.update(span_figures(c))
    out.update(lag_figures(c))
    out.update(overlap_figures(trace, c))
    out.update(fraction_figures(c))
    out.update(cta_figures(trace, c))
    return out


# ---- launches: which ran the same ---------------------------------------------------------------
@dataclass
class LaunchGroup:
    """Launches of one bundle compared as one: a single launch, or (``repeats``) every launch of
    the bundle taken as a repetition of one. ``signatures``: per launch (grid CTAs, CUDA symbols)."""

    launches: list
    signatures: list

    def text(self) -> str:
        ctas = sorted({s[0] for s in self.signatures if s[0]})
        what = f"{', '.join(map(str, ctas))} CTAs" if ctas else "grid not recorded"
        n = len(self.launches)
        return f"launch{'es' if n > 1 else ''} {', '.join(map(str, self.launches))} ({what})"


def _grid_ctas(grid, *counts):
    """A launch's CTAs: its grid's product, else the first count it has (grid CTAs, CTAs timed)."""
    if isinstance(grid, (list, tuple)) and grid and all(isinstance(g, int) for g in grid):
        return int(np.prod(grid))
    return next((int(n) for n in counts if n), None)


def launch_signatures(trace: Trace) -> dict[int, tuple]:
    """{launch: (grid CTAs or None, CUDA symbols)} for the launches that have events, in order."""
    present = sorted(set(np.unique(trace.events["launch"].to_numpy()).tolist())) if trace.events.num_rows else []
    info = trace.info
    metas = {int(lm.launch if lm.launch is not None else i): lm for i, lm in enumerate(info.launches)}
    out = {}
    for L in present:
        lm = metas.get(L, LaunchMeta())
        ctas = _grid_ctas(lm.grid, lm.grid_ctas, lm.ctas_timed) or _grid_ctas(info.grid)  # else the bundle-wide grid
        out[L] = (ctas, tuple(lm.cuda_symbols or ()))
    return out


def launch_groups(trace: Trace, which: str, repeats: bool = False) -> list[LaunchGroup]:
    """One group per launch; with ``repeats`` one group of every launch, refused (one line)
    where the launches ran different grids or CUDA symbols: they are not repetitions of one."""
    sig = launch_signatures(trace)
    if not sig:
        raise Fa4traceError(f"{which} holds no events: nothing to diff")
    if not repeats:
        return [LaunchGroup([L], [s]) for L, s in sig.items()]
    if len(set(sig.values())) > 1:
        shown = "; ".join(f"launch {L}: {s[0] or '?'} CTAs" for L, s in list(sig.items())[:4])
        raise Fa4traceError(f"{which}'s launches ran different grids or CUDA symbols ({shown}): not repetitions of "
                            "one launch; without --repeats diff compares them launch by launch")
    return [LaunchGroup(list(sig), list(sig.values()))]


def pair_groups(a: list[LaunchGroup], b: list[LaunchGroup]) -> tuple[list, list[str]]:
    """[(BASE group, NEW group)] in order (the i-th launch of BASE with the i-th of NEW), and
    notes where a pair ran different grids or CUDA symbols. Different counts: one line."""
    if len(a) != len(b):
        raise Fa4traceError(f"BASE holds {len(a)} launches, NEW {len(b)}: diff compares them launch by launch, in "
                            "order; record as many in each (or, where each bundle repeats one launch, give --repeats)")
    notes = []
    for ga, gb in zip(a, b):
        (ca, sa), (cb, sb) = ga.signatures[0], gb.signatures[0]
        where = f"launch {ga.launches[0]} vs {gb.launches[0]}: " if len(a) > 1 else ""
        if ca and cb and ca != cb:
            notes.append(f"{where}the launches ran different grids: {ca} CTAs (BASE) vs {cb} (NEW)")
        elif sa and sb and sa != sb:
            notes.append(f"{where}the launches ran different CUDA symbols (another specialization of the kernel)")
    return list(zip(a, b)), notes


# ---- the same kernel? ----------------------------------------------------------------------------
def kernel_identity(trace: Trace) -> tuple[str, str]:
    """(how it was traced: "instrument" | "recorder", which kernel): the CUDA kernel functions
    fa4trace.instrument compiled, else the kernel the bundle names."""
    info = trace.info
    if info.instrument is not None:
        if info.instrument.kernels:
            return "instrument", ", ".join(sorted(str(k) for k in info.instrument.kernels))
        return "instrument", str(info.kernel_name or "unknown")
    return "recorder", str(info.kernel or "unknown")


def label(trace: Trace) -> str:
    """What the bundle calls its kernel (an automatic bundle's label, which its script chose)."""
    return str(trace.info.kernel_name or "unknown")


def recorded_names(trace: Trace) -> set[str]:
    """Event names with rows in the bundle (WARP left out)."""
    if trace.events.num_rows == 0:
        return set()
    names = trace.events["name"].combine_chunks()
    used = np.unique(names.indices.to_numpy(zero_copy_only=False))
    dictionary = names.dictionary.to_pylist()
    return {dictionary[int(i)] for i in used} - {"WARP"}


def require_same_kernel(a: Trace, b: Trace) -> None:
    """One clear line (Fa4traceError) unless BASE and NEW are bundles of one kernel with one
    event vocabulary (module docstring)."""
    (ha, ka), (hb, kb) = kernel_identity(a), kernel_identity(b)
    if ha != hb:
        which = {"instrument": "fa4trace.instrument", "recorder": "a recorder placed in the kernel"}
        raise Fa4traceError(f"BASE ({a.name}) was traced by {which[ha]} and NEW ({b.name}) by {which[hb]}: "
                            "their events differ; diff needs two bundles of one kernel traced the same way")
    if ka != kb:
        raise Fa4traceError(f"BASE is kernel {ka}, NEW is kernel {kb}: diff needs two bundles of the same kernel")
    va, vb = a.vocab, b.vocab
    na, nb = {e.name: e for e in va.events}, {e.name: e for e in vb.events}
    for name in sorted(set(na) & set(nb)):
        ea, eb = na[name], nb[name]
        if (ea.family, ea.op, ea.resource) != (eb.family, eb.op, eb.resource):
            raise Fa4traceError(f"BASE and NEW name event {name!r} differently ({_spec(ea)} vs {_spec(eb)}): "
                                "not the same event vocabulary")
    ra, rb = recorded_names(a), recorded_names(b)
    if ra and rb and not ra & rb:
        raise Fa4traceError(f"BASE and NEW record no event in common (BASE: {', '.join(sorted(ra)[:4])}...; NEW: "
                            f"{', '.join(sorted(rb)[:4])}...): not the same event vocabulary")


def _spec(e) -> str:
    return "/".join(x or "-" for x in (e.family, e.op, e.resource)) if e.family else "hand-placed"


def differences(a: Trace, b: Trace) -> dict:
    """How two bundles of one kernel differ besides their figures: config, label, GPU, how they
    recorded, events only one of them recorded."""
    ma, mb = a.info, b.info
    out: dict = {"config": config_diff(ma.config or {}, mb.config or {})}
    if label(a) != label(b):
        out["label"] = [label(a), label(b)]
    if ma.gpu.name != mb.gpu.name:
        out["gpu"] = [ma.gpu.name, mb.gpu.name]
    ia, ib = (m.instrument or InstrumentMeta() for m in (ma, mb))
    rec = {k: [getattr(ia, k), getattr(ib, k)] for k in RECORDING_KEYS if getattr(ia, k) != getattr(ib, k)}
    if ma.warp_subset != mb.warp_subset:
        rec["warp_subset"] = [ma.warp_subset, mb.warp_subset]
    if rec:
        out["recording"] = rec
    ra, rb = recorded_names(a), recorded_names(b)
    out["events_only_in_base"] = sorted(ra - rb)
    out["events_only_in_new"] = sorted(rb - ra)
    return out


def clock_ghz(trace: Trace) -> float | None:
    """The median SM clock of the bundle's launches (GHz, as the decoder measured it)."""
    v = [float(m.clock_ghz_median) for m in trace.info.launches if m.clock_ghz_median]
    return float(np.median(v)) if v else None


# ---- units and bands -----------------------------------------------------------------------------
def _medians(keys: list[np.ndarray], value: np.ndarray) -> np.ndarray:
    """The median of ``value`` per distinct tuple of ``keys`` (one per group, groups in key order)."""
    if value.size == 0:
        return value
    o = np.lexsort((value, *reversed(keys)))
    ks = [k[o] for k in keys]
    v = value[o]
    new = np.ones(v.size, bool)
    new[1:] = np.any([k[1:] != k[:-1] for k in ks], axis=0)
    first = np.flatnonzero(new)
    counts = np.diff(np.r_[first, v.size])
    return (v[first + (counts - 1) // 2] + v[first + counts // 2]) / 2.0


def _batches(v: Values) -> np.ndarray:
    """Medians of ``BATCHES`` consecutive batches of each warp's instances (in time order)."""
    o = np.lexsort((v.t, v.warp, v.cta, v.launch))
    launch, cta, warp, val = v.launch[o], v.cta[o], v.warp[o], v.value[o]
    new = np.r_[True, (launch[1:] != launch[:-1]) | (cta[1:] != cta[:-1]) | (warp[1:] != warp[:-1])]
    gid = np.cumsum(new) - 1
    start = np.flatnonzero(new)
    pos = np.arange(val.size) - start[gid]
    size = np.diff(np.r_[start, val.size])[gid]
    batch = (pos * BATCHES) // np.maximum(size, 1)
    return _medians([gid, batch], val)


def _n_ctas(v: Values, launches: list) -> int:
    """CTAs with values of the figure in ``launches``."""
    m = np.isin(v.launch, launches)
    return int(np.unique((v.launch[m].astype(np.int64) << 32) | v.cta[m].astype(np.int64)).size)


def unit_values(v: Values, launches: list, unit: str) -> np.ndarray:
    """The figure's values per unit, over the launches of one group: "cta" (median per CTA),
    "launch" (median over CTAs per launch) or "batch" (``_batches``)."""
    m = np.isin(v.launch, launches)
    v = Values(v.launch[m], v.cta[m], v.value[m], None if v.warp is None else v.warp[m], None if v.t is None else v.t[m])
    if not v.value.size:
        return v.value
    if unit == "batch":
        return _batches(v)
    per_cta = _medians([v.launch, v.cta], v.value) if v.warp is not None else v.value
    if unit == "cta":
        return per_cta
    cta_launch = np.unique(np.stack([v.launch, v.cta], 1), axis=0)[:, 0] if v.warp is not None else v.launch
    return _medians([cta_launch], per_cta)


def coarsest_unit(va: Values, vb: Values, ga: LaunchGroup, gb: LaunchGroup, metric: str, level: float) -> str:
    """The unit of one figure of one pair of launch groups: the coarsest whose counts can reach
    ``level`` (module docstring): "launch", else "cta", else (span, wait, lag) "batch"."""
    if critical_count(len(ga.launches), len(gb.launches), level) >= 1:
        return "launch"
    if critical_count(_n_ctas(va, ga.launches), _n_ctas(vb, gb.launches), level) >= 1:
        return "cta"
    instances = metric in INSTANCE_METRICS and va.warp is not None and vb.warp is not None
    return "batch" if instances else "cta"


def judge(a: np.ndarray, b: np.ndarray, metric: str, level: float, min_change: float = 0.0) -> dict:
    """One figure's change from BASE's units ``a`` to NEW's ``b`` with its band at ``level``;
    a change beyond the band but below ``min_change`` (% for times, points for shares) is
    "negligible"."""
    scale, unit, better = METRICS[metric]
    med_a, med_b = float(np.median(a)), float(np.median(b))
    if scale == "ratio":
        s = shift_band(np.log(np.maximum(a, 1.0)), np.log(np.maximum(b, 1.0)), level)
        pct = lambda x: None if x is None else 100.0 * (np.exp(x) - 1.0)  # noqa: E731
        change, low, high = pct(s.estimate), pct(s.low), pct(s.high)
        out = {"change_pct": change, "band_pct": [low, high] if s.judged else None,
               "change_ns": med_a * change / 100.0}  # the change in ns at BASE's median
    else:
        s = shift_band(a, b, level)
        if unit == "share":
            out = {"change_pts": 100.0 * s.estimate,
                   "band_pts": [100.0 * s.low, 100.0 * s.high] if s.judged else None}
        else:
            base = abs(med_a) if med_a else None
            pct = lambda x: None if x is None or base is None else 100.0 * x / base  # noqa: E731
            out = {"change_ns": s.estimate, "band_ns": [s.low, s.high] if s.judged else None,
                   "change_pct": pct(s.estimate), "band_pct": [pct(s.low), pct(s.high)] if s.judged and base else None}
    out.update({"base": med_a, "new": med_b, "n_base": s.n_base, "n_new": s.n_new, "magnitude": _magnitude(out)})
    out["status"] = _status(s, better, out["magnitude"], min_change)
    return out


def _status(s: Shift, better: str | None, magnitude: float | None, min_change: float) -> str:
    if not s.judged:
        return "too few units"
    if not s.beyond:
        return "within noise"
    if magnitude is not None and magnitude < min_change:
        return "negligible"
    if better is None:
        return "changed"
    up = s.low > 0
    return "regressed" if up == (better == "lower") else "improved"


def _magnitude(fig: dict) -> float | None:
    """What the gate and the ranking compare: |change| in % (points for shares)."""
    v = fig.get("change_pct") if "change_pts" not in fig else fig.get("change_pts")
    return None if v is None else abs(float(v))


# ---- the diff ---------------------------------------------------------------------------------
def figure_id(role: str, stage: str, metric: str) -> str:
    """'consumer/SOFTMAX/span': a figure's name in the JSON and the gate (a diff of several
    launch groups puts 'launches 0,1: ' in front)."""
    return f"{role}/{stage}/{metric}"


def diff(base: Trace, new: Trace, *, roles=None, repeats: bool = False, confidence: float = CONFIDENCE,
         min_change: float = MIN_CHANGE) -> dict:
    """Every figure of BASE and NEW (module docstring), its change and band, and what moved.
    ``roles``: as `fa4trace summary --roles` (automatic bundles); ``repeats``: each bundle's
    launches repeat one launch; ``min_change``: the smallest change (% for times, points for
    shares) that counts as moved (module docstring).

    Returns a JSON-safe dict (``fa4trace diff --json``; docs/diff.md lists its keys):
    ``base``/``new`` (what each bundle is), ``kernel``, ``differs``, ``notes``, ``confidence``,
    ``per_figure_confidence``, ``groups`` (the launch groups compared), ``figures`` (one dict
    per figure judged, in display order), ``only_in_base``/``only_in_new`` (figure ids one
    bundle lacks) and ``moved`` (ids of the figures beyond noise, the most moved first)."""
    if not 0 < confidence < 1:
        raise Fa4traceError(f"confidence must be between 0 and 1, got {confidence}")
    if min_change < 0:
        raise Fa4traceError(f"min_change must be >= 0, got {min_change}")
    require_same_kernel(base, new)
    pairs, notes = pair_groups(launch_groups(base, "BASE", repeats), launch_groups(new, "NEW", repeats))
    if not repeats and len(pairs) > 1 and all(len({s for g in side for s in g.signatures}) == 1
                                              for side in zip(*pairs)):
        notes.append(f"each bundle holds {len(pairs)} launches of one grid, diffed launch by launch; if they "
                     "repeat one call, --repeats pools them (and puts the launch-to-launch noise in the band)")
    fa, fb = figures_of(base, roles), figures_of(new, roles)
    several = len(pairs) > 1
    rows, only_a, only_b = [], [], []
    for gi, (ga, gb) in enumerate(pairs):
        la, lb = ga.launches[0], gb.launches[0]
        prefix = (f"launch {la}: " if la == lb else f"launch {la}→{lb}: ") if several else ""
        for key in sorted(set(fa) | set(fb), key=_order):
            role, stage, metric = key
            fid = prefix + figure_id(role, stage, metric)
            va, vb = fa.get(key), fb.get(key)
            xa = None if va is None else va.value[np.isin(va.launch, ga.launches)]
            xb = None if vb is None else vb.value[np.isin(vb.launch, gb.launches)]
            if xa is None or not xa.size:
                if xb is not None and xb.size:
                    only_b.append(fid)
                continue
            if xb is None or not xb.size:
                only_a.append(fid)
                continue
            if METRICS[metric][1] == "share" and not xa.any() and not xb.any():
                continue  # a share that is zero everywhere (a role that never waits): nothing to judge
            rows.append((fid, gi, key, va, vb))
    m = max(len(rows), 1)
    level = 1.0 - (1.0 - confidence) / m
    figures = []
    for fid, gi, (role, stage, metric), va, vb in rows:
        ga, gb = pairs[gi]
        unit = coarsest_unit(va, vb, ga, gb, metric, level)
        ua, ub = unit_values(va, ga.launches, unit), unit_values(vb, gb.launches, unit)
        scale, unit_of, better = METRICS[metric]
        la, lb = ga.launches[0], gb.launches[0]
        fig = {"id": fid, "group": gi, "launch": str(la) if la == lb else f"{la}→{lb}", "role": role,
               "stage": stage, "metric": metric, "scale": scale, "unit": unit_of, "better": better, "units": unit}
        fig.update(judge(ua, ub, metric, level, min_change))
        figures.append(fig)
    moved = [f for f in figures if f["status"] in ("regressed", "improved", "changed")]
    moved.sort(key=lambda f: -(f["magnitude"] or 0.0))
    for i, f in enumerate(moved):
        f["rank"] = i + 1
    notes += _clock_notes(base, new)
    ia, ib = kernel_identity(base), kernel_identity(new)
    return json_safe({
        "format": DIFF_FORMAT, "version": DIFF_VERSION,
        "base": _side(base, [g for g, _ in pairs]), "new": _side(new, [h for _, h in pairs]),
        "kernel": ia[1], "traced_by": ia[0] if ia == ib else None,
        "differs": differences(base, new), "notes": notes,
        "confidence": confidence, "per_figure_confidence": level, "figures_judged": len(rows), "min_change": min_change,
        "repeats": repeats,
        "groups": [{"base_launches": g.launches, "new_launches": h.launches,
                    "base_grid_ctas": g.signatures[0][0], "new_grid_ctas": h.signatures[0][0]} for g, h in pairs],
        "figures": figures, "only_in_base": only_a, "only_in_new": only_b,
        "moved": [f["id"] for f in moved],
    })


def _order(key: tuple) -> tuple:
    """Display order of figures: roles as fa4trace.analysis.roles ranks them (the CTA last), then
    stage and metric."""
    from .roles import role_rank

    role, stage, metric = key
    return (role == CTA_ROLE, role_rank(role), stage == "lifetime", stage, list(METRICS).index(metric))


def _side(t: Trace, groups: list[LaunchGroup]) -> dict:
    ctas = int(np.unique((t.events["launch"].to_numpy().astype(np.int64) << 32)
                         | t.events["cta"].to_numpy().astype(np.int64)).size) if t.events.num_rows else 0
    info = t.info
    return {"name": t.name, "label": label(t), "config": info.config or {}, "gpu": info.gpu.name,
            "synthetic": bool(info.synthetic), "launches": len(info.launches) or len(groups), "ctas": ctas,
            "clock_ghz": clock_ghz(t)}


def _clock_notes(a: Trace, b: Trace) -> list[str]:
    ca, cb = clock_ghz(a), clock_ghz(b)
    if not ca or not cb or abs(cb / ca - 1) <= CLOCK_NOTE:
        return []
    return [f"the SM clock differs: {ca:.3f} GHz (BASE) vs {cb:.3f} GHz (NEW), {100 * (cb / ca - 1):+.1f}%: a time "
            "that tracks the clock moves with it, so a change that small may be the clock (--min-change)"]


# ---- the CI gate ------------------------------------------------------------------------------------
def regressions_above(result: dict, pct: float, *, min_ns: float = 0.0, ignore=()) -> list[dict]:
    """The figures that regressed beyond noise by more than ``pct`` (% for times, points for
    shares), the most first: what `fa4trace diff --fail-above PCT` fails on. ``min_ns``: a time
    figure counts only if it also moved by more than that many ns; ``ignore``: figure ids (shell
    patterns, e.g. ``producer/*``) left out."""
    from fnmatch import fnmatchcase

    out = []
    for f in result["figures"]:
        if f["status"] != "regressed" or (f.get("magnitude") or 0.0) <= pct:
            continue
        if f["unit"] == "ns" and abs(f.get("change_ns") or 0.0) <= min_ns:
            continue
        if any(fnmatchcase(f["id"], pat) for pat in ignore):
            continue
        out.append(f)
    return sorted(out, key=lambda f: -f["magnitude"])


# ---- text -------------------------------------------------------------------------------------------
TOP = 10  # figures named in the text, by default


def _ns(x) -> str:
    from .text import ns

    return ns(x)


def value_text(f: dict, which: str) -> str:
    """BASE's or NEW's median over units, as printed."""
    v = f.get(which)
    if v is None:
        return "n/a"
    return f"{100 * v:.1f}%" if f["unit"] == "share" else _ns(v)


def change_text(f: dict) -> str:
    if f["unit"] == "share":
        return f"{f['change_pts']:+.1f} pts"
    if f.get("change_pct") is None:
        return f"{f['change_ns']:+.0f} ns"
    return f"{f['change_pct']:+.1f}%"


def band_text(f: dict) -> str:
    if f["unit"] == "share":
        b, unit = f.get("band_pts"), " pts"
    else:
        b, unit = f.get("band_pct"), "%"
        if b is None and f.get("band_ns"):
            b, unit = f["band_ns"], " ns"
    if not b:
        return "—"
    fmt = "{:+.0f}" if unit == " ns" else "{:+.1f}"
    return f"{fmt.format(b[0])} … {fmt.format(b[1])}{unit}"


def _units_text(result: dict) -> str:
    b, n = result["base"], result["new"]
    kinds = sorted({f["units"] for f in result["figures"]})
    what = {"cta": "CTAs", "launch": "launches", "batch": "batches of each warp's spans (too few CTAs)"}
    return (f"{_count(b['ctas'], 'CTA')} in {_count(b['launches'], 'launch')} vs {_count(n['ctas'], 'CTA')} in "
            f"{_count(n['launches'], 'launch')}; units: " + ", ".join(what[k] for k in kinds))


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "es" if what.endswith("h") else "s")


def format_diff(result: dict, *, show_all: bool = False, top: int = TOP) -> str:
    """`fa4trace diff`'s text: what the bundles are, how they differ, the figures that moved
    beyond noise (the ``top`` that moved most; every figure with ``show_all``)."""
    b, n = result["base"], result["new"]
    syn = "  (SYNTHETIC)" if b["synthetic"] or n["synthetic"] else ""
    lines = [f"BASE {b['name']}  →  NEW {n['name']}{syn}", f"  kernel       {result['kernel']}",
             *_difference_lines(result["differs"]),
             f"  units        {_units_text(result)}",
             f"  noise band   {100 * result['confidence']:.0f}% for the {result['figures_judged']} figures together "
             f"({100 * result['per_figure_confidence']:.2f}% each; rank-based, docs/diff.md); changes under "
             f"{result['min_change']:g}% (points for shares) are negligible",
             *(f"  note: {note}" for note in result["notes"])]
    figs = result["figures"]
    moved = sorted((f for f in figs if f.get("rank")), key=lambda f: f["rank"])
    counts = {s: sum(f["status"] == s for f in figs) for s in ("regressed", "improved", "changed")}
    few = sum(f["status"] == "too few units" for f in figs)
    small = sum(f["status"] == "negligible" for f in figs)
    small = f"; {small} more by less than {result['min_change']:g}%: negligible" if small else ""
    few = f"; {few} with too few units to judge" if few else ""
    if moved:
        head = (f"moved beyond noise: {len(moved)} of {len(figs)} figures ("
                + ", ".join(f"{v} {k}" for k, v in counts.items() if v) + f"{small}){few}")
        if not show_all and len(moved) > top:
            head += f"; the {top} that moved most:"
    else:
        head = f"nothing moved beyond noise ({len(figs)} figures{small}){few}; --all shows every figure"
    lines += ["", head]
    shown = figs if show_all else moved[:top]
    launches = len(result["groups"]) > 1
    if shown:
        lines.append(_row("launch" if launches else None, "role", "stage", "figure", "base", "new", "change",
                          "noise band", ""))
        for f in shown:
            lines.append(_row(f["launch"] if launches else None, f["role"], f["stage"], f["metric"],
                              value_text(f, "base"), value_text(f, "new"), change_text(f), band_text(f), f["status"]))
    rest = len(figs) - len(moved)
    if not show_all and rest and moved:
        lines.append(f"within noise or not judged: {rest} figures (--all shows every figure)")
    for which, key in (("BASE", "only_in_base"), ("NEW", "only_in_new")):
        ids = result.get(key) or []
        if ids:
            more = f" and {len(ids) - ONLY_SHOWN} more (--json lists them)" if len(ids) > ONLY_SHOWN else ""
            lines.append(f"figures only in {which}: {', '.join(ids[:ONLY_SHOWN])}{more}")
    return "\n".join(lines)


ONLY_SHOWN = 6  # figures one bundle lacks, named in the text


def _difference_lines(d: dict) -> list[str]:
    """The text's lines on how BASE and NEW differ besides their figures."""
    lines = []
    if d.get("label"):
        lines.append(f"  labels       {d['label'][0]} → {d['label'][1]}")
    if d.get("config"):
        lines.append(f"  config       {diff_text(d['config'])}")
    if d.get("recording"):
        lines.append("  recorded     " + ", ".join(f"{k} {v[0]} → {v[1]}" for k, v in d["recording"].items()))
    if d.get("gpu"):
        lines.append(f"  gpu          {d['gpu'][0]} → {d['gpu'][1]}")
    for which, key in (("BASE", "events_only_in_base"), ("NEW", "events_only_in_new")):
        if d.get(key):
            lines.append(f"  events only in {which}: {', '.join(d[key])}")
    return lines


def _row(launch, role, stage, metric, a, b, change, band, status) -> str:
    first = "" if launch is None else f"{launch:8s} "
    return (f"  {first}{role:11s} {stage:22s} {metric:12s} {a:>10s} {b:>10s} {change:>10s}  {band:22s} "
            f"{status}").rstrip()
