"""Optional dependencies: which extra of ``pip install 'fa4trace[EXTRA]'`` brings each, and the
one-line error when something needs one that is not installed here.

Only ``find_spec`` is consulted (nothing is imported), so asking costs nothing even for torch.
A module set to None in ``sys.modules`` counts as missing, as Python's import does.
"""

from __future__ import annotations

import importlib.util

from ..format.errors import MissingDependency

# import name -> (what a person installs, the extra that brings it); the extras are pyproject.toml's
PACKAGES = {
    "torch": ("PyTorch", "torch"),
    "cutlass": ("nvidia-cutlass-dsl (the CuTe DSL)", "dsl"),
    "tvm_ffi": ("apache-tvm-ffi", "dsl"),
    "flash_attn": ("flash-attn-4", "fa4"),
    "quack": ("quack-kernels", "fa4"),
    "streamlit": ("streamlit", "viewer"),
    "plotly": ("plotly", "viewer"),
    "pandas": ("pandas", "viewer"),
    "viztracer": ("viztracer", "viewer"),
    "kaleido": ("kaleido", "viewer"),
    "ray": ("ray", "ray"),
}


def installed(module: str) -> bool:
    """Whether ``module`` (an import name) can be found here."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a module without a spec
        return False


def install_command(modules) -> str:
    """``pip install 'fa4trace[a,b]'`` for the extras that bring ``modules``."""
    extras = sorted({PACKAGES[m][1] for m in modules if m in PACKAGES})
    return f"pip install 'fa4trace[{','.join(extras)}]'" if extras else "pip install fa4trace"


def names(modules) -> str:
    """'PyTorch and flash-attn-4' for ('torch', 'flash_attn')."""
    parts = [PACKAGES.get(m, (m, None))[0] for m in modules]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def require(purpose: str, *modules: str) -> None:
    """Raise MissingDependency (one line: what is missing, the pip command) unless every one
    of ``modules`` is installed; ``purpose`` names what needs them."""
    missing = [m for m in modules if not installed(m)]
    if missing:
        raise MissingDependency(f"{purpose} needs {names(missing)}, not installed here: {install_command(missing)}")


def require_route(purpose: str, *, jit: tuple, aot: tuple, what: str = "its kernels") -> None:
    """Kernels come compiled here (``jit``: the modules a compile needs) or from a build folder
    (``aot``: the modules loading one needs): raise MissingDependency unless one route's modules
    are all installed."""
    if all(installed(m) for m in jit) or all(installed(m) for m in aot):
        return
    jit_missing = [m for m in jit if not installed(m)]
    aot_missing = [m for m in aot if not installed(m)]
    raise MissingDependency(f"{purpose} needs {names(jit_missing)} to compile {what} here, or {names(aot_missing)} "
                            f"to load a build; not installed here: {install_command(jit_missing + aot_missing)}")


def explain(exc: ImportError) -> str | None:
    """The one-line MissingDependency text for an ImportError of an optional dependency (None
    for any other module)."""
    top = (exc.name or "").split(".")[0]
    if top not in PACKAGES:
        return None
    return f"{names([top])} is not installed here: {install_command([top])}"
