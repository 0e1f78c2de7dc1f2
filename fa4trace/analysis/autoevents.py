"""The events table as numpy columns plus, per row, what its automatic event is.

fa4trace.instrument registers each hooked call as an event with ``family`` (pipeline, tma,
mma, barrier), ``op`` and ``resource`` (vocab.EventSpec). The any-kernel analysis
(roles, kernel_analysis, wait_chain) asks questions like "every pipeline commit of pipeline
ab" or "every wait span"; :class:`AutoCols` answers them with one boolean mask per question,
built from the bundle's own vocabulary once per table.

A *wait* is a span whose op is one of vocab.WAIT_OPS (acquire, wait, sync) or ends in
``wait`` (``tma.store_wait``: the warp waits for its TMA stores to finish reading shared memory).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..format.vocab import Vocabulary
from ..trace.bundle import Trace
from .overlap import Columns, group_ids

KINDS = ("span", "instant", "warp")


def is_wait_op(op: str) -> bool:
    """Whether an automatic event's op is a wait (see the module docstring)."""
    from ..format.vocab import WAIT_OPS

    return op in WAIT_OPS or op.endswith("wait")


def is_automatic(trace: Trace) -> bool:
    """A bundle of a kernel traced by fa4trace.instrument (its ``instrument`` names it)."""
    return trace.info.instrument is not None


class AutoCols(Columns):
    """Columns of one events table (analysis.Columns) with per-row automatic-event fields.

    ``family``/``op``/``resource``: per row, as codes into ``families``/``ops``/``resources``
    ("" = a hand-placed event, or WARP); ``stages`` per row (0 = unknown); ``kind`` per row as
    0 span, 1 instant, 2 warp; ``warp_gid``: dense id per (launch, cta, warp) in that order;
    ``cta_gid``: dense id per (launch, cta).
    """

    def __init__(self, t: pa.Table, vocab: Vocabulary, pipeline_stages: dict | None = None):
        super().__init__(t)
        specs = []
        for n in self.name_dict:
            try:
                specs.append(vocab.event(n))
            except KeyError:
                specs.append(None)
        fam = [s.family if s else "" for s in specs]
        op = [s.op if s else "" for s in specs]
        res = [s.resource if s else "" for s in specs]
        stages = [int(s.stages) if s else 0 for s in specs]
        for i, s in enumerate(specs):  # a pipeline's stage count may come from the bundle's instrument only
            if s and s.family == "pipeline" and not stages[i] and pipeline_stages:
                stages[i] = int((pipeline_stages.get(s.resource) or {}).get("stages", 0) or 0)
        self.families, fam_code = _codes(fam)
        self.ops, op_code = _codes(op)
        self.resources, res_code = _codes(res)
        code = self.name_codes
        empty = np.zeros(0, np.int64)
        self.family = fam_code[code] if code.size else empty
        self.op = op_code[code] if code.size else empty
        self.resource = res_code[code] if code.size else empty
        self.stages = np.asarray(stages or [0], np.int64)[code] if code.size else empty
        kind = t["kind"].combine_chunks() if t.num_rows else None
        if kind is not None:
            kd = [KINDS.index(k) if k in KINDS else 0 for k in kind.dictionary.to_pylist()]
            self.kind = np.asarray(kd or [0], np.int64)[kind.indices.to_numpy(zero_copy_only=False).astype(np.int64)]
        else:
            self.kind = empty
        wait_code = np.array([bool(f) and is_wait_op(o) for f, o in zip(fam, op)] or [False])
        self.is_wait = (wait_code[code] & (self.kind == 0)) if code.size else np.zeros(0, bool)
        self.warp_gid, self.n_warps, self.warp_keys = group_ids(self.launch, self.cta, self.warp)
        self.cta_gid, self.n_ctas, self.cta_keys = group_ids(self.launch, self.cta)
        self.is_warp_row = self.kind == 2
        # the CTA of each warp gid
        self.cta_of_warp = np.zeros(self.n_warps, np.int64)
        self.cta_of_warp[self.warp_gid] = self.cta_gid

    @classmethod
    def of(cls, trace: Trace) -> AutoCols:
        inst = trace.info.instrument
        return cls(trace.events, trace.vocab, (inst.pipelines if inst is not None else None) or {})

    def where(self, family: str | None = None, op=None, resource: str | None = None) -> np.ndarray:
        """Rows of automatic events with this family, op (a name or a tuple) and resource."""
        m = np.ones(self.n, bool)
        for arr, names, want in ((self.family, self.families, family), (self.resource, self.resources, resource)):
            if want is not None:
                m &= arr == (names.index(want) if want in names else -1)
        if op is not None:
            ops = (op,) if isinstance(op, str) else tuple(op)
            m &= np.isin(self.op, [self.ops.index(o) for o in ops if o in self.ops])
        return m

    def pipelines(self) -> list[str]:
        """Names of the pipelines that have events, in name order."""
        m = self.where("pipeline")
        return sorted({self.resources[r] for r in np.unique(self.resource[m])})

    def stages_of(self, pipeline: str) -> int:
        m = self.where("pipeline", resource=pipeline)
        return int(self.stages[m].max()) if m.any() else 0


def _codes(values: list[str]) -> tuple[list[str], np.ndarray]:
    """Distinct values (with "") and the code of each input position."""
    names = sorted(set(values) | {""})
    return names, np.asarray([names.index(v) for v in values] or [0], np.int64)
