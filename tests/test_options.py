"""The options that travel whole through the layers (fa4trace.format.options: ``Sampling``,
``Placement``; fa4trace.format.shape: ``Shape``): each checks every field once, in one line
that names it, keeps one default per setting, and the entry points that also take the fields
as keywords build the same object from them. CPU only, no cutlass."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fa4trace.format.errors import BadOption, Fa4traceError
from fa4trace.format.layout import DEFAULT_RING, BufferSpec
from fa4trace.format.options import (CURSORS, DEFAULT_CAPACITY, FAMILIES, L2_POLICIES, UNKNOWN_GRID_CTAS, Placement,
                                     Sampling, options)
from fa4trace.format.shape import Shape

ints = st.one_of(st.integers(-5, 70), st.none(), st.booleans(), st.floats(allow_nan=False, width=16), st.text(max_size=2))


def _one_line(exc) -> str:
    text = str(exc.value)
    assert text and "\n" not in text, text
    return text


# ---- Sampling --------------------------------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(ctas=ints, cta_first=ints, cta_stride=ints, capacity=ints)
def test_sampling_takes_exactly_the_counts_it_can_use(ctas, cta_first, cta_stride, capacity):
    """Each count is an integer (not a bool) within its range, None where None means "the
    recording's own"; anything else is one BadOption line naming that field."""
    def ok(v, low, none):
        return (v is None and none) or (isinstance(v, int) and not isinstance(v, bool) and v >= low)

    fields = {"ctas": (ctas, 1, True), "cta_first": (cta_first, 0, False), "cta_stride": (cta_stride, 1, False),
              "capacity": (capacity, 1, True)}
    bad = [k for k, (v, low, none) in fields.items() if not ok(v, low, none)]
    kw = {k: v for k, (v, _low, _none) in fields.items()}
    if bad:
        with pytest.raises(BadOption) as exc:
            Sampling(**kw)
        assert _one_line(exc).startswith(bad[0] + " must be"), (kw, str(exc.value))
    else:
        s = Sampling(**kw)
        assert (s.ctas, s.cta_first, s.cta_stride, s.capacity) == (ctas, cta_first, cta_stride, capacity)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-2, 40), max_size=6))
def test_sampling_warps_are_warp_indices_sorted_once(ws):
    if ws and all(0 <= w < 32 for w in ws):
        assert Sampling(warps=ws).warps == tuple(sorted(set(ws)))
    else:  # none named, or one that no CTA has
        with pytest.raises(BadOption) as exc:
            Sampling(warps=ws)
        assert _one_line(exc).startswith("warps must be warp indices 0..31")


def test_sampling_is_frozen_hashable_and_a_value():
    s = Sampling(ctas=4, warps=(4, 0))
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.ctas = 5
    assert s == Sampling(ctas=4, warps=[0, 4, 0]) and len({s, Sampling(ctas=4, warps=(0, 4))}) == 1
    assert dataclasses.replace(s, cta_stride=2).cta_stride == 2
    with pytest.raises(BadOption, match="cta_stride must be >= 1, got 0"):
        dataclasses.replace(s, cta_stride=0)  # a replaced field is checked as a new one


@pytest.mark.parametrize("kw, grid, cap, want", [
    # the grid known (our kernels, FA4): every CTA, the recording's own slot size
    ({}, 132, 416, BufferSpec(5, 132, 416)),
    ({"ctas": 7, "cta_stride": 142, "warps": (0, 4), "capacity": 4000}, 1000, 416,
     BufferSpec(2, 7, 4000, 0, 142, 0b10001)),
    ({"cta_first": 3, "cta_stride": 7, "ctas": 10}, 264, 48, BufferSpec(5, 10, 48, 3, 7)),
    # the grid unknown when the buffer is made (instrument): the first UNKNOWN_GRID_CTAS, DEFAULT_CAPACITY
    ({}, None, None, BufferSpec(5, UNKNOWN_GRID_CTAS, DEFAULT_CAPACITY)),
    ({"ctas": 4, "cta_stride": 8, "capacity": 8192}, None, None, BufferSpec(5, 4, 8192, 0, 8)),
])
def test_sampling_spec_is_the_buffer_it_names(kw, grid, cap, want):
    got = Sampling(**kw).spec(5, grid_ctas=grid, capacity=cap)
    assert dataclasses.replace(got, lifetime_ctas=0) == want


def test_sampling_spec_refuses_what_the_launch_lacks():
    with pytest.raises(ValueError, match="warps must be warp indices 0..4"):
        Sampling(warps=(5,)).spec(5, grid_ctas=8)
    with pytest.raises(ValueError, match="no CTA of the 8-CTA grid is selected"):
        Sampling(cta_first=9).spec(5, grid_ctas=8)


# ---- Placement -------------------------------------------------------------------------------
def test_placement_defaults_are_instruments():
    p = Placement()
    assert (p.families, p.spans, p.cursor, p.ring, p.l2, p.split, p.cta_lifetimes) == (
        FAMILIES, (), "smem", DEFAULT_RING, "first", True, True)


@pytest.mark.parametrize("kw, words", [
    ({"cursor": "regs"}, "cursor must be one of 'gmem', 'smem', 'ring', got 'regs'"),
    ({"cursor": "ring", "ring": 100}, "ring must be a power of two from 2 to 4096"),
    ({"ring": 8192}, "ring must be a power of two from 2 to 4096"),
    ({"l2": "middle"}, "l2 must be one of 'first', 'last', got 'middle'"),
    ({"families": ["pipeline", "dma"]}, "unknown event families ['dma']"),
    ({"families": "mma"}, "families must be names from"),
    ({"split": 1}, "split must be True or False"),
    ({"cta_lifetimes": None}, "cta_lifetimes must be True or False"),
    ({"spans": {"": "m:f"}}, "a span's name must be a non-empty string"),
    ({"spans": {"s": "no_colon"}}, "'module:Class.method'"),
    ({"spans": {"s": {"payload": "i"}}}, "takes 'target'"),
    ({"spans": {"s": {"target": "m:f", "payload": 3}}}, "names an argument"),
    ({"spans": ["m:f"]}, "spans must be a dict"),
])
def test_placement_refuses_each_bad_value_in_one_line(kw, words):
    with pytest.raises(BadOption) as exc:
        Placement(**kw)
    assert words in _one_line(exc)


@settings(max_examples=100, deadline=None)
@given(cursor=st.sampled_from(CURSORS), l2=st.sampled_from(L2_POLICIES), ring=st.sampled_from([2, 64, 128, 4096]),
       families=st.lists(st.sampled_from(FAMILIES), max_size=5),
       spans=st.dictionaries(st.text("abc", min_size=1, max_size=3),
                             st.one_of(st.just("m:f"), st.builds(lambda p: {"target": "m:C.f", "payload": p},
                                                                 st.sampled_from([None, "i"]))), max_size=3))
def test_placement_round_trips_through_replace_and_span_map(cursor, l2, ring, families, spans):
    """What a recompile makes of a placement (dataclasses.replace) is the same placement, and
    its spans read back as instrument(spans=) takes them."""
    p = Placement(families=families, spans=spans, cursor=cursor, ring=ring, l2=l2)
    assert p.families == tuple(dict.fromkeys(families))
    assert dataclasses.replace(p) == p and Placement(spans=p.span_map()).spans == p.spans
    assert {k: (v if not isinstance(v, dict) or v.get("payload") else v["target"]) for k, v in spans.items()} \
        == p.span_map()
    assert hash(p) == hash(dataclasses.replace(p))


# ---- Shape -----------------------------------------------------------------------------------
def test_shape_defaults_are_what_record_records():
    assert Shape() == Shape(b=1, sq=1, hq=16, hkv=1, sk=32768, d=128, dtype="bf16")
    assert Shape(1, 1, 16, 1, 100, 128, "bf16").sk == 100  # positional order: b, sq, hq, hkv, sk, d, dtype


@settings(max_examples=300, deadline=None)
@given(b=st.integers(-1, 4), sq=st.integers(-1, 4), hq=st.integers(-1, 32), hkv=st.integers(-1, 8),
       sk=st.integers(-1, 4), d=st.integers(-1, 256), dtype=st.sampled_from(["bf16", "fp16", "fp32"]))
def test_shape_keeps_the_rules_every_problem_keeps(b, sq, hq, hkv, sk, d, dtype):
    sizes = dict(b=b, sq=sq, hq=hq, hkv=hkv, sk=sk, d=d)
    small = [k for k in ("b", "sq", "hq", "hkv", "sk", "d") if sizes[k] < 1]
    if small:
        words = f"{small[0]} must be >= 1"
    elif hq % hkv:
        words = f"hq ({hq}) must be a multiple of hkv ({hkv})"
    elif dtype == "fp32":
        words = "dtype must be one of bf16, fp16"
    else:
        s = Shape(dtype=dtype, **sizes)
        assert s.ratio * s.hkv == s.hq and s.config() == dict(sizes, dtype=dtype)
        assert s.io_bytes() == s.kv_bytes() + 2 * b * sq * hq * d * 2
        return
    with pytest.raises(BadOption) as exc:
        Shape(dtype=dtype, **sizes)
    assert _one_line(exc).startswith(words)


def test_shape_sizes_are_integers():
    import numpy as np

    assert Shape(sk=np.int64(4096)).sk == 4096 and type(Shape(sk=np.int64(4096)).sk) is int
    for bad in (True, 2.5, "4096"):
        with pytest.raises(BadOption, match="sk must be an integer"):
            Shape(sk=bad)


def test_our_kernels_limits_stay_with_them():
    pytest.importorskip("numpy")
    from fa4trace.attention import shape_problem

    assert Shape(d=256).d == 256  # any attention problem...
    assert shape_problem(**{k: v for k, v in Shape(d=256).config().items() if k != "dtype"}) \
        == "q head dim must be one of 64, 128, got 256"  # ... that our kernels refuse


# ---- one object, or its fields as keywords ---------------------------------------------------
def test_options_builds_one_object_from_the_keywords_passed():
    assert options(Sampling, None, "f") == Sampling()
    assert options(Sampling, None, "f", ctas=4, warps=None, capacity=None) == Sampling(ctas=4)
    given_ = Sampling(ctas=2)
    assert options(Sampling, given_, "f", ctas=None) is given_
    with pytest.raises(BadOption, match=r"^f: give sampling= or ctas=, cta_stride=, not both$"):
        options(Sampling, given_, "f", ctas=4, cta_stride=2)
    with pytest.raises(BadOption, match="f: placement= takes a Placement, got dict"):
        options(Placement, {"cursor": "gmem"}, "f")
    with pytest.raises(BadOption, match="cursor must be one of"):
        options(Placement, None, "f", cursor="regs")


def test_instrument_checks_its_options_before_anything_else():
    """fa4trace.instrument(ctas=..., cursor=...) still works as keywords, and a bad one is the
    objects' one line before the block looks for the CuTe DSL (here: none needed)."""
    import fa4trace

    for kw, words in (({"ctas": 0}, "ctas must be >= 1, got 0"), ({"cursor": "regs"}, "cursor must be one of"),
                      ({"sampling": Sampling(), "warps": (0,)}, "give sampling= or warps=, not both"),
                      ({"placement": Placement(), "l2": "last"}, "give placement= or l2=, not both"),
                      ({"warps": ()}, "warps must be warp indices")):
        with pytest.raises(BadOption) as exc:
            with fa4trace.instrument(**kw):
                pass
        assert words in _one_line(exc)
        assert isinstance(exc.value, Fa4traceError) and isinstance(exc.value, ValueError)


def test_record_options_pass_the_sampling_down_whole():
    pytest.importorskip("numpy")
    from fa4trace.auto.run import RecordOptions

    o = RecordOptions(Sampling(ctas=4, cta_stride=8, capacity=8192), check=False)
    assert o.spec(12) == Sampling(ctas=4, cta_stride=8, capacity=8192).spec(12)
    assert RecordOptions().spec(12).n_cta_slots == UNKNOWN_GRID_CTAS
