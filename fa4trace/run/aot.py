"""Ahead-of-time kernels: compile with the CuTe DSL here, run anywhere tvm-ffi loads them.

``build`` side (needs nvidia-cutlass-dsl, no GPU): each compiled function is exported to an
object file with ``export_to_c`` and all of them are linked into one shared library beside a
``manifest.json`` that says what each function is (kind, config, arch, signature notes).

``load`` side (needs apache-tvm-ffi and the CuTe DSL runtime library, never cutlass):
``BuildDir(path).function(name)`` returns a callable that takes torch CUDA tensors.
This is how kernels compiled on a CPU-only machine run on the H200 (docs/aot.md).

The library links ``libcute_dsl_runtime.so`` of one CUDA flavour of the DSL (cu13 or cu12,
recorded in the manifest as ``cute_dsl_runtime``). Where the dynamic loader does not find it,
the copy of an installed nvidia-cutlass-dsl is loaded first; where there is none, one line
says what to install.
"""

from __future__ import annotations

import ctypes
import datetime as _dt
import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

from ..format import layout as L
from ..format.entry import Entry
from ..format.errors import DeviceUnavailable, Fa4traceError, WouldOverwrite

MANIFEST = "manifest.json"
LIBRARY = "fa4trace_kernels.so"
# The manifest's layout and the kernels' calling conventions. A folder written in another
# format is refused in one line: rebuild it.
BUILD_FORMAT = 2
RUNTIME_LIB = "libcute_dsl_runtime.so"
DEFAULT_RUNTIME = "cu13"


def _link_flags() -> list[str]:
    import tvm_ffi  # noqa: F401  (build machine only)

    def run(*args):
        return subprocess.run([sys.executable, "-m", *args], check=True, capture_output=True,
                              text=True).stdout.split()

    libdir = os.path.dirname(tvm_ffi.libinfo.find_libtvm_ffi())
    return [*run("cutlass.cute.export.aot_config", "--ldflags"), "-lcute_dsl_runtime",
            f"-L{libdir}", "-ltvm_ffi"]


def runtime_of(link_flags: list[str]) -> str:
    """The DSL runtime flavour the link flags name (``-L.../nvidia_cutlass_dsl/cu13/lib``)."""
    for flag in link_flags:
        m = re.search(r"nvidia_cutlass_dsl[/\\](cu\d+)[/\\]lib", flag)
        if m:
            return m.group(1)
    return DEFAULT_RUNTIME


def build_library(compiled: dict[str, tuple[Any, Entry]], out_dir: str | os.PathLike, *,
                  arch: str, overwrite: bool = False) -> Path:
    """Export every compiled function, link one .so, write the manifest. Returns out_dir."""
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise WouldOverwrite(f"{out} exists and is not empty; refusing to replace it")
        if not (out / MANIFEST).exists():
            raise Fa4traceError(f"{out} is not an fa4trace build folder (no {MANIFEST}); refusing to replace it")
        shutil.rmtree(out)
    obj_dir = out / "obj"
    obj_dir.mkdir(parents=True, exist_ok=True)
    objs = []
    for name, (fn, _entry) in compiled.items():
        obj = obj_dir / f"{name}.o"
        fn.export_to_c(str(obj), function_name=name)
        objs.append(str(obj))
    so = out / LIBRARY
    flags = _link_flags()
    cmd = [os.environ.get("CXX", "g++"), "-shared", "-o", str(so), *objs, *flags]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise Fa4traceError(f"linking {so} failed: {res.stderr.strip().splitlines()[-1:]}")
    shutil.rmtree(obj_dir)
    write_manifest(out, arch, {name: {"kind": e.kind, "config": e.config} for name, (_, e) in compiled.items()},
                   runtime=runtime_of(flags))
    return out


def write_manifest(out_dir: str | os.PathLike, arch: str, functions: dict[str, dict], *,
                   runtime: str = DEFAULT_RUNTIME) -> None:
    """The build folder's manifest.json: what was built, for which GPU, with which recorder."""
    from ..format.version import __version__

    manifest = {
        "build_format": BUILD_FORMAT,
        "fa4trace_version": __version__,
        "recorder_abi": L.RECORDER_ABI,
        "arch": arch,
        "cute_dsl_runtime": runtime,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "library": LIBRARY,
        "functions": functions,
    }
    (Path(out_dir) / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))


class BuildDir:
    """A folder written by ``build_library``; loads functions without importing cutlass."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        mf = self.path / MANIFEST
        if not mf.is_file():
            raise Fa4traceError(f"{self.path} has no {MANIFEST}: build kernels first with `fa4trace build -o {self.path}`")
        try:
            self.manifest = json.loads(mf.read_text())
            self.functions: dict[str, dict] = self.manifest["functions"]
        except (ValueError, KeyError) as exc:
            raise Fa4traceError(f"{mf} is not a valid build manifest: {exc}") from None
        fmt, abi = self.manifest.get("build_format"), self.manifest.get("recorder_abi")
        if fmt != BUILD_FORMAT or abi != L.RECORDER_ABI:
            raise Fa4traceError(f"{self.path} was built by another fa4trace version (build format {fmt}, recorder "
                                f"ABI {abi}; this one writes {BUILD_FORMAT}, {L.RECORDER_ABI}): rebuild it with "
                                f"`fa4trace build -o {self.path} --force`")
        self._module = None

    def find(self, kind: str, **config) -> str:
        """Name of the function of this kind whose config holds every given key=value."""
        for name, info in sorted(self.functions.items()):
            conf = info["config"]
            if info["kind"] == kind and all(conf.get(k) == v for k, v in config.items()):
                return name
        want = ", ".join(f"{k}={v}" for k, v in config.items())
        raise Fa4traceError(f"no built {kind} kernel with {want} in {self.path}; rebuild with `fa4trace build`")

    def function(self, name: str) -> Callable:
        if name not in self.functions:
            raise Fa4traceError(f"{name!r} is not in {self.path / MANIFEST}")
        if self._module is None:
            self._module = self._load_library()
        return getattr(self._module, name)

    def _load_library(self):
        try:
            import tvm_ffi
        except ImportError:
            raise DeviceUnavailable("loading built kernels needs apache-tvm-ffi "
                                    "(pip install 'apache-tvm-ffi==0.1.15.post2'; docs/aot.md)") from None
        so = self.path / self.manifest["library"]
        _check_elf(so)
        try:
            return tvm_ffi.load_module(str(so))
        except RuntimeError as exc:
            if RUNTIME_LIB not in str(exc):
                raise Fa4traceError(f"cannot load {so}: {_last_line(exc)}") from None
        runtime = self.manifest["cute_dsl_runtime"]
        lib = find_runtime(runtime)
        if lib is None:
            raise DeviceUnavailable(
                f"{so} needs {RUNTIME_LIB} ({runtime}), which the loader does not find: install "
                f"nvidia-cutlass-dsl[{runtime}]==4.8.1 or put the folder holding it on LD_LIBRARY_PATH (docs/aot.md)")
        # RTLD_GLOBAL: the kernels library then resolves its runtime symbols against this copy.
        ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
        try:
            return tvm_ffi.load_module(str(so))
        except RuntimeError as exc:
            raise Fa4traceError(f"cannot load {so} with {lib}: {_last_line(exc)}") from None


def find_runtime(runtime: str = DEFAULT_RUNTIME) -> Path | None:
    """The CuTe DSL runtime library of an installed nvidia-cutlass-dsl (found on sys.path,
    without importing cutlass), or None."""
    for entry in sys.path:
        lib = Path(entry or ".") / "nvidia_cutlass_dsl" / runtime / "lib" / RUNTIME_LIB
        if lib.is_file():
            return lib
    return None


def _check_elf(so: Path) -> None:
    """One clear error for a library that is missing, not ELF, or cut short (an interrupted
    copy): dlopen of a truncated ELF maps pages past the end of the file and the process dies
    of SIGBUS, which no except clause sees."""
    if not so.is_file():
        raise Fa4traceError(f"{so} is missing: the build folder is incomplete; rebuild it")
    size = so.stat().st_size
    with open(so, "rb") as f:
        head = f.read(64)
        if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
            raise Fa4traceError(f"{so} is not a shared library (64-bit little-endian ELF)")
        phoff, shoff = struct.unpack_from("<QQ", head, 0x20)
        phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", head, 0x36)
        need = max(shoff + shentsize * shnum, phoff + phentsize * phnum)
        if phoff + phentsize * phnum <= size:
            f.seek(phoff)
            table = f.read(phentsize * phnum)
            for i in range(phnum):  # Elf64_Phdr: p_offset at 8, p_filesz at 32
                p_offset, = struct.unpack_from("<Q", table, i * phentsize + 8)
                p_filesz, = struct.unpack_from("<Q", table, i * phentsize + 32)
                need = max(need, p_offset + p_filesz)
    if size < need:
        raise Fa4traceError(f"{so} is truncated ({size} of {need} bytes): copy or rebuild the build folder")


def _last_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return lines[-1] if lines else type(exc).__name__
