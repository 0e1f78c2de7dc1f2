"""The rule of what moves out of a cache (``fa4trace.auto.plans``), on stand-ins for kernels: a
kernel, or a plan the library builds again from its key (a tuple or NamedTuple holding one, a
record whose fields are kernels, plans and plain values); never a model or any other object
that merely holds a kernel somewhere inside it."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple, Optional

from fa4trace.auto.plans import plain, plan_of, record_fields


class Kern:
    """Stands for a compiled kernel."""


def is_kern(x) -> bool:
    return isinstance(x, Kern)


class GemmPlan(NamedTuple):  # quack's _GemmPlan: the compiled function and plain facts
    compiled_fn: object
    tile_M: int
    epi_static: Optional[object]
    arg_template: dict


class IfacePlan(NamedTuple):  # quack's interface plan: the dispatch plan, a closure, recipes
    config: object
    dispatch_plan: object
    replay: object


class Mode(enum.Enum):
    A = 1


@dataclass(frozen=True)
class Record:
    fn: object
    mode: Mode
    shape: tuple


class Slotted:
    __slots__ = ("fn", "n")

    def __init__(self, fn, n):
        self.fn, self.n = fn, n


class Layer:
    def __init__(self, k):
        self.kern = k


class Model:
    def __init__(self, k):
        self.layer = Layer(k)


@dataclass
class ModelRecord:  # a dataclass, but a field is a model: not a plan
    layer: Layer
    name: str


@dataclass
class Weighted:  # a kernel beside state that is not plain (a list of weights)
    fn: object
    weights: list


def test_tuples_and_named_tuples_around_a_kernel_are_plans():
    k = Kern()
    assert plan_of((k, 1), is_kern)
    assert plan_of(GemmPlan(k, 128, None, {"x": None}), is_kern)  # other items go with it
    inner = GemmPlan(k, 128, None, {})
    assert plan_of(IfacePlan(object(), inner, lambda: inner), is_kern)  # a plan in a plan
    assert plan_of(((((k,),),),), is_kern, depth=4) and not plan_of(((((k,),),),), is_kern)  # 3 levels


def test_records_of_kernels_and_plain_values_are_plans():
    k = Kern()
    assert plan_of(Record(k, Mode.A, (1, 2)), is_kern)
    assert plan_of(Slotted(k, 3), is_kern)
    assert record_fields(Slotted(k, 3)) == [k, 3]


def test_what_merely_holds_a_kernel_is_not_a_plan():
    k = Kern()
    assert not plan_of(Model(k), is_kern)  # an object with attributes of its own
    assert not plan_of(ModelRecord(Layer(k), "m"), is_kern)  # a record with a model in it
    assert not plan_of(Weighted(k, [1.0]), is_kern)  # a record with state that is not plain
    assert not plan_of([k], is_kern) and not plan_of({"k": k}, is_kern)  # lists and dicts
    assert not plan_of((Model(k),), is_kern)  # a tuple whose kernel is inside a model
    assert not plan_of(lambda: k, is_kern)
    assert not plan_of(k, is_kern)  # a kernel itself is a kernel, not a plan
    assert not plan_of(("a", 1, None), is_kern) and not plan_of(Record(None, Mode.A, ()), is_kern)


def test_plain_values():
    assert all(plain(v) for v in (None, True, 3, 2.5, "s", b"b", Mode.A, int, (1, ("a", None)), frozenset({1})))
    assert not any(plain(v) for v in ([1], {"a": 1}, object(), (1, [2])))
