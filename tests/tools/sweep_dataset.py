"""A synthetic sweep dataset in the layout fa4trace.sweep.figures reads (results/, bundles/,
sweeps/): made-up bandwidths for the figures' tests and benchmark, never measurements."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

KERNEL_TBPS = {"base": 2.0, "pingpong": 2.5, "intrawg": 2.3, "cudnn": 1.8, "flash": 2.1, "fa4": 2.2}


def row(kernel: str, *, d: int, hq: int = 16, hkv: int, sk: int, b: int = 1, sq: int = 1, tbps: float | None = None,
        error: str | None = None, bundle: str | None = None, sweep: str = "s1", finished_at: str = "2026-12-01T10:00:00+00:00",
        overlap: float | None = None) -> dict:
    pid = f"{kernel}-d{d}-hq{hq}-hkv{hkv}-sk{sk}-b{b}-sq{sq}"
    if tbps is None and error is None:
        tbps = KERNEL_TBPS.get(kernel, 1.0) * (1 + sk / 262144)
    ours = kernel in ("pingpong", "intrawg")
    return {"sweep_id": sweep, "point_id": pid, "kernel": kernel, "d": d, "hq": hq, "hkv": hkv, "sk": sk, "b": b,
            "sq": sq, "dtype": "bf16", "us": None if error else 10.0, "us_spread": None if error else 0.1,
            "tbps": None if error else tbps, "rel_err": None if error else 1e-3, "error": error,
            "qk_softmax_overlap": (0.6 if overlap is None else overlap) if kernel == "pingpong" and not error and ours else None,
            "pv_softmax_overlap": (0.4 if overlap is None else overlap) if kernel == "intrawg" and not error else None,
            "bundle": bundle, "gpu": "synthetic", "worker": "w0", "finished_at": finished_at}


SCHEMA = pa.schema([("sweep_id", pa.string()), ("point_id", pa.string()), ("kernel", pa.string()), ("d", pa.int64()),
                    ("hq", pa.int64()), ("hkv", pa.int64()), ("sk", pa.int64()), ("b", pa.int64()), ("sq", pa.int64()),
                    ("dtype", pa.string()), ("us", pa.float64()), ("us_spread", pa.float64()), ("tbps", pa.float64()),
                    ("rel_err", pa.float64()), ("error", pa.string()), ("qk_softmax_overlap", pa.float64()),
                    ("pv_softmax_overlap", pa.float64()), ("bundle", pa.string()), ("gpu", pa.string()),
                    ("worker", pa.string()), ("finished_at", pa.string())])


def write_rows(root: Path, rows: list[dict]) -> Path:
    for r in rows:
        folder = root / "results" / f"kernel={r['kernel']}" / f"d={r['d']}" / f"hkv={r['hkv']}"
        folder.mkdir(parents=True, exist_ok=True)
        name = r["point_id"] + ("" if r["sweep_id"] == "s1" else f"-{r['sweep_id']}")
        pq.write_table(pa.Table.from_pylist([r], schema=SCHEMA), folder / f"{name}.parquet")
    return root


def grid_rows(kernels=("base", "pingpong", "intrawg", "cudnn"), ds=(64, 128), hkvs=(1, 2),
              sks=(1024, 8192, 131072), sqs=(1,), bs=(1,)) -> list[dict]:
    return [row(k, d=d, hkv=h, sk=s, sq=q, b=b) for k in kernels for d in ds for h in hkvs for s in sks
            for q in sqs for b in bs]


def write_sweep_json(root: Path, sweep: str = "s1") -> None:
    p = root / "sweeps" / f"sweep={sweep}" / "sweep.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps({"gpu": "synthetic", "commit": "0000000", "command": "synthetic", "grid": {}}))
