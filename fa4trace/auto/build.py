"""Instrumented kernels through an AOT build: compile here (no GPU), run where tvm-ffi loads them.

``entries(name, compiled)`` gives the build entries of one traced compile and its plain twin
(kind "auto"; the traced one's config carries the vocabulary and what the compile found), for
``fa4trace.run.aot.build_library``. ``load(build, name)`` returns an ``Instrumented`` over the
loaded functions: on the GPU machine nothing but torch and tvm-ffi is needed.
"""

from __future__ import annotations

import os

from ..format.entry import Entry
from ..format.errors import Fa4traceError
from ..format.vocab import Vocabulary
from ..run.loader import open_build
from .run import Instrumented, RecordOptions

KIND = "auto"


def entries(name: str, compiled, config: dict | None = None) -> dict:
    """{symbol: (compiled function, Entry)} for ``name`` (traced) and ``name``_plain."""
    cfg = dict(config or {})
    out = {name: (compiled.fn, Entry(name, KIND, dict(cfg, traced=True, params=compiled.params,
                                                         vocab=compiled.vocab.to_json(), meta=compiled.meta)))}
    if compiled.plain is not None:
        out[f"{name}_plain"] = (compiled.plain, Entry(f"{name}_plain", KIND, dict(cfg, traced=False,
                                                                                   params=compiled.params[:-1])))
    return out


def load(build: str | os.PathLike, name: str, *, options: RecordOptions | None = None,
         roles: dict | None = None) -> Instrumented:
    """The traced ``name`` of an AOT build (and its plain twin for the output check)."""
    b = open_build(build)
    info = b.functions.get(name)
    if info is None or info.get("kind") != KIND or not info["config"].get("traced"):
        raise Fa4traceError(f"{name!r} is not an instrumented kernel of {b.path} "
                            f"(have: {', '.join(sorted(n for n, i in b.functions.items() if i.get('kind') == KIND))})")
    cfg = info["config"]
    plain = b.function(f"{name}_plain") if f"{name}_plain" in b.functions else None
    meta = dict(cfg["meta"], roles=roles, params=cfg["params"], build=str(b.path), entry=name)
    if cfg.get("kernel"):
        meta["kernel"] = cfg["kernel"]  # the builder's name for it beats the entry's qualified name
    return Instrumented(b.function(name), Vocabulary.from_json(cfg["vocab"]), meta, plain=plain,
                        options=options or RecordOptions())
