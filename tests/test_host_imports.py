"""Host modules import (and work) where cutlass, torch and GPUs are absent."""

from __future__ import annotations

import subprocess
import sys
import textwrap

CODE = textwrap.dedent('''
    import sys, importlib.abc

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("cutlass", "torch", "tvm_ffi", "cuda"):
                raise ImportError(f"{name} is blocked in this test")
            return None

    sys.meta_path.insert(0, Block())
    import fa4trace
    from fa4trace import cli, kinds  # noqa
    from fa4trace.analysis import overlap  # noqa
    from fa4trace.export import chrome, perfetto  # noqa
    from fa4trace.format import layout, vocab  # noqa
    from fa4trace.trace import bundle, decode  # noqa
    from fa4trace.testing import bundles, replay, samples  # noqa: test generators need no GPU either
    from fa4trace.check import probes, report, rows, run as check_run  # noqa
    from fa4trace.run import deps, loader, registry  # noqa
    from fa4trace.run import record  # noqa: the recorder imports torch only when it runs
    from fa4trace.kernels import marker_spec  # noqa
    assert {"attention", "calibration", "markers", "fa4"} <= set(registry.names())
    from fa4trace import attention, bench  # noqa: the API's validation, planner and spec need no torch
    from fa4trace.bench import decode as bench_decode  # noqa
    from fa4trace.run import timing  # noqa
    from fa4trace.kernels import decode_spec  # noqa
    plan = attention.plan_splits(attention.Shape(1, 1, 16, 1, 131072, 128, "bf16"), 64, 132)
    assert plan.n_ctas <= 132 and decode_spec.Variant(128, "pingpong").name
    import fa4trace.viewer.data, fa4trace.viewer.timeline, fa4trace.viewer.metrics  # noqa
    import fa4trace.viewer.grid, fa4trace.viewer.iterations, fa4trace.viewer.perfetto_ui, fa4trace.viewer.page  # noqa
    import fa4trace.viewer.kernel_view, fa4trace.viewer.merged  # noqa
    import fa4trace.profiler, fa4trace.profiler.render, fa4trace.testing.profiler  # noqa: merging needs no torch
    from fa4trace.analysis import autoevents, fidelity, kernel, mma_flight, roles, text, wait_chain  # noqa
    from fa4trace.auto import api, build, compiler, entry, events, families, patches, run, state  # noqa: no cutlass until a compile
    from fa4trace.testing.bundles import pipelined_like
    kb, km, kv = pipelined_like(n_ctas=2, k_tiles=4)
    kt = fa4trace.Trace.from_launches([decode.decode_buffer(kb, vocab=kv)], km, vocab=kv)
    assert kernel.summarize_kernel(kt)["wait_chain"]["steps"] > 0
    perfetto.to_perfetto(kt, __import__("io").BytesIO())
    from fa4trace.testing.bundles import attention_like
    buf, meta = attention_like("pingpong", n_ctas=2, n_blocks=4)
    t = fa4trace.Trace.from_launches([decode.decode_buffer(buf)], meta)
    s = overlap.summarize(t)
    import io
    perfetto.to_perfetto(t, io.BytesIO()); chrome.to_chrome(t, io.BytesIO())
    # sweeps: the driver, the pool, the Ray executor (ray itself imported only when used), compaction,
    # and a replay sweep in this process
    import tempfile
    from fa4trace.sweep import compact, cuda, dataset, grid, job, pool, query, ray_executor, replay, run  # noqa
    d = tempfile.mkdtemp(dir=sys.argv[1])  # the test's tmp_path: nothing left behind in /tmp
    from fa4trace.testing.replay import make_synthetic
    make_synthetic(d + "/src", 2)
    doc = run.run_sweep(replay.ReplayGrid(d + "/src"), d + "/ds", replay.ReplayRunner(), log=lambda m: None, compact=True)
    assert doc["points_run"] == 2 and dataset.Dataset(d + "/ds").read_results().num_rows == 2
    assert pool.visible_gpus() == 0 and "ray" not in sys.modules
    print("ok", s["qk_softmax_overlap"] is not None and s["rows"] == t.events.num_rows)
''')


def test_host_modules_need_no_cutlass_torch_or_gpu(tmp_path):
    r = subprocess.run([sys.executable, "-c", CODE, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "ok True"
