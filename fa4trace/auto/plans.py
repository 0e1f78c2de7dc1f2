"""Which cache entries are kernels' own: the rule that decides what ``instrument()`` takes out
of a cache (and what it drops at the end), and nothing else.

A cache entry moves when its value is

* a compiled kernel (``leaf``), or
* a **plan** around one, which the library builds again from the entry's key: a ``tuple``
  (a NamedTuple included: how quack keeps its GEMM plans, ``_GemmPlan(compiled_fn, ...)``)
  with a compiled kernel or a plan among its items; or a **record**, an instance of a
  dataclass or of a class with ``__slots__`` and no ``__dict__``, whose every field is a
  compiled kernel, a plan or a plain value (None, a bool, number, string or bytes, an enum
  member, a class, or a tuple or frozenset of these), one of them a kernel or a plan. Plans
  inside plans are followed ``depth`` levels down (3: quack's interface plans hold its
  dispatch plans). A tuple's other items go with it whatever they are (the library made them
  with the plan).

Anything else that merely holds a kernel (an object with attributes of its own, a model, a
list, a dict, a function closing over one) is not a plan: its entry stays where it is, and
the calls of the kernel inside it are counted as not traced.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Callable

DEPTH = 3
_PLAIN = (type(None), bool, int, float, complex, str, bytes, enum.Enum, type)


def plain(v, depth: int = 2) -> bool:
    """None, a bool, number, string or bytes, an enum member, a class, or a tuple or
    frozenset of these (nested ``depth`` levels at most)."""
    if isinstance(v, _PLAIN):
        return True
    if type(v) in (tuple, frozenset) and depth > 0:
        return all(plain(x, depth - 1) for x in v)
    return False


def record_fields(v):
    """The field values of a record (a dataclass instance, or an object of a class with
    ``__slots__`` and no ``__dict__``), or None for anything else."""
    if isinstance(v, type):
        return None
    if dataclasses.is_dataclass(v):
        return [getattr(v, f.name, None) for f in dataclasses.fields(v)]
    if hasattr(v, "__dict__") or not hasattr(type(v), "__slots__"):
        return None
    names = []
    for cls in type(v).__mro__:
        slots = vars(cls).get("__slots__", ())
        names += [slots] if isinstance(slots, str) else [s for s in slots if s not in ("__weakref__", "__dict__")]
    missing = object()
    return [x for x in (getattr(v, n, missing) for n in names) if x is not missing]


def plan_of(v, leaf: Callable, depth: int = DEPTH) -> bool:
    """``v`` is a plan around something ``leaf`` says yes to (the module doc's rule)."""
    if depth <= 0 or isinstance(v, (str, bytes)):
        return False
    if isinstance(v, tuple):
        return any(leaf(x) or plan_of(x, leaf, depth - 1) for x in v)
    fields = record_fields(v)
    if not fields:
        return False
    found = False
    for x in fields:
        if leaf(x) or plan_of(x, leaf, depth - 1):
            found = True
        elif not plain(x):
            return False
    return found
