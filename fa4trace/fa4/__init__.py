"""Trace upstream FlashAttention-4 (flash-attn-4, pinned) with fa4trace markers.

    compile_fa4(arch, schedule=..., d=..., hq=..., hkv=...)   # build.py: capture + compile_traced + hooks
    record(schedule=..., d=..., ...)                          # run.py: one traced launch -> Trace
    sm90_runner(q, k, v, build=...)                           # run.py: FA4 SM90 for `fa4trace bench`

Importing this package needs nothing beyond fa4trace; each function imports what it needs.
"""

from .build import FA4_VERSIONS, fa4_version, require_fa4  # noqa: F401


def compile_fa4(*args, **kwargs):
    from .build import compile_fa4 as _c

    return _c(*args, **kwargs)


def record(*args, **kwargs):
    from .run import record as _r

    return _r(*args, **kwargs)


def sm90_runner(*args, **kwargs):
    from .run import sm90_runner as _s

    return _s(*args, **kwargs)


__all__ = ["FA4_VERSIONS", "fa4_version", "require_fa4", "compile_fa4", "record", "sm90_runner"]
