"""Run FA4's forward kernel (traced or not) on this machine's GPU: `record` and the bench hook.

Two ways to get the compiled kernel:
- JIT (a GPU and nvidia-cutlass-dsl + flash-attn-4 here, e.g. a B200): ``compile_fa4`` in process.
- AOT (an H200/H100 without the DSL): a build folder written on any machine by ``build_aot``
  (``fa4trace.run.aot`` format, kind "fa4"), loaded with tvm-ffi alone.

The compiled function takes FA4's ``__call__`` arguments (plus the trace tensor when traced) in
the order stored with it (``params``): q, k, v, out, softmax_scale and the trace buffer are
runtime values; every other parameter is what FA4 passes for a plain decode call (None, and
``(None, None)`` for its AuxData).
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple, Optional

from ..format.errors import DeviceUnavailable, Fa4traceError
from ..format.options import Sampling, options
from ..format.shape import Shape
from ..format.vocab import Vocabulary

KIND = "fa4"


# ---- building (any machine with the DSL; no GPU needed) ---------------------------------------
def build_aot(out_dir, shapes, *, arch: str = "sm90", overwrite: bool = False):
    """Compile and export FA4 kernels into one fa4trace AOT build folder.

    ``shapes``: iterable of dicts with d, hq, hkv (and optional sq, dtype, schedule) and
    ``traced`` (bool). Batch and KV length stay dynamic.
    """
    from ..format.entry import Entry
    from ..run.aot import build_library
    from .build import compile_fa4

    compiled = {}
    for s in shapes:
        s = dict(s)
        traced = bool(s.pop("traced", False))
        c = compile_fa4(arch, traced=traced, **s)
        cfg = dict(c.config, params=c.params)
        name = _entry_name(cfg)
        compiled[name] = (c.fn, Entry(name, KIND, cfg))
    return build_library(compiled, out_dir, arch=arch, overwrite=overwrite)


def _entry_name(cfg: dict) -> str:
    v = "" if cfg.get("variant", "default") == "default" else f"_{cfg['variant']}"
    return (f"fa4_{cfg['arch']}_{cfg['schedule']}_d{cfg['d']}_h{cfg['hq']}kv{cfg['hkv']}_sq{cfg['sq']}_"
            f"{cfg['dtype']}_{'traced' if cfg['traced'] else 'plain'}{v}")


# ---- loading ---------------------------------------------------------------------------------
def fa4_arch() -> str:
    """FA4's path for this GPU, from ``fa4trace.run.loader.gpu_arch``: "sm90" (H100/H200) or "sm100" (B200)."""
    from ..run import loader

    arch = loader.gpu_arch()  # e.g. "sm_90a", "sm_100a"
    major = int(arch[3:].rstrip("af")) // 10
    if major in (10, 11):
        return "sm100"
    if major == 9:
        return "sm90"
    raise DeviceUnavailable(f"FA4 tracing supports SM100 (B200) and SM90 (H100/H200); this GPU is {arch}")


def _dtype_name(t) -> str:
    import torch

    names = {torch.bfloat16: "bf16", torch.float16: "fp16"}
    if t.dtype not in names:
        raise Fa4traceError(f"FA4 decode takes bf16 or fp16, got {t.dtype}")
    return names[t.dtype]


class LoadedKernel(NamedTuple):
    """A compiled FA4 forward ready to call: ``fn(*call_args(params, ...))``."""

    fn: Callable
    params: list  # runtime argument names, in call order
    config: dict  # what was compiled (tile, warps_per_cta, pack_gqa, fa4_version, ...)
    how: str  # "aot:<build folder>" or "jit": stored in trace metadata


def load_fn(arch: str, *, schedule: str, d: int, hq: int, hkv: int, sq: int, dtype: str, traced: bool,
            build=None, variant: str = "default", families=()) -> LoadedKernel:
    """The kernel for this configuration through ``fa4trace.run.loader``: compiled here where the DSL,
    flash-attn-4 and a GPU are present and no build folder is named, else from the AOT build
    (``build``, ``$FA4TRACE_FA4_BUILD`` or build/fa4_sm90). On SM90 FA4 runs FA3's schedule.
    ``families``: generic event families recorded besides FA4's own events (traced builds; an
    AOT build holds them in its variant "generic", with every family)."""
    from ..auto.events import FAMILIES
    from ..run import loader

    jit = loader.use_jit(build, KIND)
    if variant == "generic":  # the AOT build's name for every family
        families = families or FAMILIES
    if families:
        if not traced:
            raise Fa4traceError("event families are recorded by traced builds only")
        if not jit and set(families) != set(FAMILIES):
            raise Fa4traceError(f"an FA4 AOT build records either no generic family or all of them "
                                f"({','.join(FAMILIES)}; variant 'generic'); a subset needs the CuTe DSL here "
                                "to compile in process")
        variant = "default" if jit else "generic"
    shape = dict(arch=arch, d=d, hq=hq, hkv=hkv, sq=sq, dtype=dtype, traced=traced)
    if traced and (families or variant == "default"):  # other named variants say their families themselves
        shape["families"] = sorted(families)
    if jit:
        if variant != "default":
            raise Fa4traceError(f"variant {variant!r} exists only in AOT builds (build it with build_aot)")
        kern = loader.load(KIND, schedule=schedule if schedule in ("base", "pingpong") else "pingpong", **shape)
    else:
        sched = schedule if arch == "sm100" else "fa3"
        kern = loader.load(KIND, build=build, schedule=sched, variant=variant, **shape)
    return LoadedKernel(kern.fn, kern.config["params"], kern.config, kern.how)


def call_args(params, **kw):
    """Runtime arguments in the compiled function's order (see module doc)."""
    known = {"mQ": kw["q"], "mK": kw["k"], "mV": kw["v"], "mO": kw["out"],
             "softmax_scale": kw["softmax_scale"], "fa4trace_buf": kw.get("trace"), "aux_data": (None, None)}
    if "fa4trace_buf" in params and kw.get("trace") is None:
        raise Fa4traceError("this FA4 build is traced: pass a trace buffer")
    return [known.get(p) for p in params]


# ---- the bench hook --------------------------------------------------------------------------
def sm90_runner(q, k, v, *, build=None, out=None, traced: bool = False, trace=None) -> Callable[[], object]:
    """FA4's SM90 forward as a peer for ``fa4trace bench``: returns ``run()`` that computes
    softmax(q kᵀ/√d) v into ``out`` (allocated if not given) and returns it.

    q ``[b, sq, hq, d]``, k/v ``[b, sk, hkv, d]`` (FA4's layout), bf16/fp16, on the GPU.
    FA4's SM90 kernel has no split-KV: it launches b × hkv × ⌈sq·hq/hkv / 128⌉ CTAs.
    """
    import torch

    if not q.is_cuda:
        raise DeviceUnavailable("sm90_runner needs CUDA tensors")
    if fa4_arch() != "sm90":
        raise DeviceUnavailable("sm90_runner runs FA4's SM90 kernel: it needs an H100/H200")
    b, sq, hq, d = q.shape
    hkv = k.shape[2]
    kern = load_fn("sm90", schedule="fa3", d=d, hq=hq, hkv=hkv, sq=sq, dtype=_dtype_name(q), traced=traced,
                   build=build)
    if out is None:
        out = torch.empty_like(q)
    args = call_args(kern.params, q=q, k=k, v=v, out=out, softmax_scale=1.0 / math.sqrt(d), trace=trace)

    def run():
        kern.fn(*args)
        return out

    return run


# ---- record ----------------------------------------------------------------------------------
def capacity_for(arch: str, sk: int, tile_n: int = 128, tiles_per_cta: int = 1, generic: bool = False) -> int:
    """Records per warp slot: the busiest warp records ≤ 8 per KV block (SM90 consumer: QK, PV,
    SOFTMAX, CORRECTION begin+end), plus a margin for per-tile events. ``generic``: the build
    records generic families too (pipeline waits and releases, MMA waits, barriers: up to 16
    more per block)."""
    n_blocks = -(-sk // tile_n)
    per_block = (8 if arch == "sm90" else 4) + (16 if generic else 0)
    return tiles_per_cta * (per_block * n_blocks + 32)


def record(shape: Optional[Shape] = None, *, schedule: str = "pingpong", sampling: Optional[Sampling] = None,
           build=None, check: bool = True, seed: int = 0, variant: str = "default", families=(),
           d: Optional[int] = None, hq: Optional[int] = None, hkv: Optional[int] = None, sk: Optional[int] = None,
           b: Optional[int] = None, sq: Optional[int] = None, dtype: Optional[str] = None,
           cta_first: Optional[int] = None, max_ctas: Optional[int] = None, cta_stride: Optional[int] = None,
           capacity: Optional[int] = None, warps=None):
    """One traced launch of FA4's forward on this GPU (SM100 on B200, SM90 on H100/H200).

    ``shape`` (``fa4trace.format.shape.Shape``; its defaults unless given, or made of the ``d``,
    ``hq``, ``hkv``, ``sk``, ``b``, ``sq``, ``dtype`` keywords): the problem. ``sampling``
    (``Sampling``, or its fields as the ``cta_first``, ``cta_stride``, ``max_ctas`` (its
    ``ctas``), ``capacity``, ``warps`` keywords): who records; every CTA and warp unless told,
    slots sized for the busiest warp (``capacity_for``).
    Returns a ``Trace`` whose metadata holds the FA4 version, kernel path and configuration.
    ``families``: generic event families (fa4trace.auto) recorded besides FA4's own events.
    With ``check`` the traced output is compared with an untraced launch of the same kernel
    (bitwise: the markers must not change results) and the result stored in the metadata.
    """
    import torch

    from ..run.gpu import require_cuda
    from ..run.record import TracedLaunch
    from ..run.record import record as record_launches

    shape = options(Shape, shape, "fa4trace.fa4.record", d=d, hq=hq, hkv=hkv, sk=sk, b=b, sq=sq, dtype=dtype)
    sampling = options(Sampling, sampling, "fa4trace.fa4.record", ctas=max_ctas, cta_first=cta_first,
                       cta_stride=cta_stride, capacity=capacity, warps=warps)
    require_cuda()
    arch = fa4_arch()
    b, sq, hq, hkv, sk, d, dtype = shape.b, shape.sq, shape.hq, shape.hkv, shape.sk, shape.d, shape.dtype
    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    kern = load_fn(arch, schedule=schedule, d=d, hq=hq, hkv=hkv, sq=sq, dtype=dtype,
                   traced=True, build=build, variant=variant, families=families)
    cfg, how = kern.config, kern.how
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=tdt, generator=g)
    k = torch.randn(b, sk, hkv, d, device="cuda", dtype=tdt, generator=g)
    v = torch.randn(b, sk, hkv, d, device="cuda", dtype=tdt, generator=g)
    out = torch.full_like(q, float("nan"))
    scale = 1.0 / math.sqrt(d)
    tile_m, tile_n = cfg["tile"]
    rows = sq * (hq // hkv) if cfg["pack_gqa"] else sq
    heads = hkv if cfg["pack_gqa"] else hq
    tiles = b * heads * -(-rows // tile_m)
    grid = tiles if arch == "sm90" else min(tiles, torch.cuda.get_device_properties(0).multi_processor_count)
    cap = capacity_for(arch, sk, tile_n, -(-tiles // grid), generic=bool(cfg.get("families")))
    launch = TracedLaunch(
        kernel=f"fa4_{arch}", grid_ctas=grid, warps_per_cta=cfg["warps_per_cta"],
        run=lambda tr: kern.fn(*call_args(kern.params, q=q, k=k, v=v, out=out, softmax_scale=scale, trace=tr)),
        grid=(grid, 1, 1), block=(32 * cfg["warps_per_cta"], 1, 1), capacity=cap, sampling=sampling,
        extra={"how": how})
    config = {k2: cfg[k2] for k2 in cfg if k2 not in ("params", "vocab")}
    config.update({"b": b, "sk": sk, "schedule_requested": schedule})
    notes = ("FlashAttention-4 forward, instrumented at compile time by fa4trace.auto and fa4trace.fa4 hooks "
             "(FA4 source unchanged); no split-KV on SM90")
    vocab = Vocabulary.from_json(cfg["vocab"]) if cfg.get("vocab") else None
    trace = record_launches([launch], kernel=f"fa4_{arch}_{cfg['schedule']}", config=config, notes=notes,
                            vocab=vocab)
    if check:
        plain = load_fn(arch, schedule=schedule, d=d, hq=hq, hkv=hkv, sq=sq, dtype=dtype, traced=False,
                        build=build)
        ref = torch.full_like(q, float("nan"))
        plain.fn(*call_args(plain.params, q=q, k=k, v=v, out=ref, softmax_scale=scale))
        torch.cuda.synchronize()
        trace.meta["check"] = {"bitwise_equal_to_untraced": bool(torch.equal(out, ref)),
                               "nan_free": bool(not torch.isnan(out).any())}
    trace.meta["fa4"] = {"version": cfg["fa4_version"], "arch": arch, "path": cfg["kernel_class"],
                         "schedule": cfg["schedule"], "how": how}
    return trace
