"""Facts about the GPU a trace was recorded on (stored in each bundle's metadata)."""

from __future__ import annotations

import shutil
import subprocess

from ..format.errors import DeviceUnavailable


def require_cuda():
    """torch with a visible CUDA device, or a one-line DeviceUnavailable."""
    try:
        import torch
    except ImportError:
        raise DeviceUnavailable("this needs PyTorch with CUDA (pip install 'fa4trace[torch]') and a GPU") from None
    if not torch.cuda.is_available():
        raise DeviceUnavailable("no CUDA GPU is visible on this machine; run it where one is (see README: H200 / B200)")
    return torch


def gpu_facts(device: int = 0) -> dict:
    torch = require_cuda()
    p = torch.cuda.get_device_properties(device)
    facts = {
        "name": p.name,
        "sm_count": int(p.multi_processor_count),
        "compute_capability": f"{p.major}.{p.minor}",
        "arch": f"sm_{p.major}{p.minor}{'a' if p.major >= 9 else ''}",
        "memory_gib": round(p.total_memory / 2**30, 1),
        "l2_mib": round(getattr(p, "L2_cache_size", 0) / 2**20, 1),
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "driver": _driver_version(),
    }
    return facts


def _driver_version() -> str | None:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None
