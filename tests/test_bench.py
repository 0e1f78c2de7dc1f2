"""The benchmark harness on the CPU: its table, its kernel options, its pass order, the timing
helper's arithmetic and the clock/power log (the timing itself runs on the GPU)."""

from __future__ import annotations

import pytest

from fa4trace import attention as A
from fa4trace.bench import decode as D
from fa4trace.run import timing as T


def test_bench_variant_options_parse():
    assert D._variant_option("pingpong@r64", "r64") == (64, None, False)
    assert D._variant_option("pingpong@s132", "s132") == (None, 132, False)
    assert D._variant_option("pingpong@r32s8", "r32s8") == (32, 8, False)
    assert D._variant_option("pingpong@p", "p") == (None, None, True)
    assert D._variant_option("pingpong@s8p", "s8p") == (None, 8, True)
    assert D._variant_option("pingpong", "") == (None, None, False)
    for bad in ("x2", "n64", "o2", "p8"):
        with pytest.raises(ValueError, match="unknown kernel option"):
            D._variant_option("pingpong@" + bad, bad)


def test_bench_table_ratios_and_overheads():
    s = A.Shape(1, 1, 16, 1, 131072, 128, "bf16")
    rows = [D.BenchRow(s, "base", 25.0, 0.1, 2e-3, {}), D.BenchRow(s, "pingpong", 20.0, 0.1, 3e-3, {}),
            D.BenchRow(s, "cudnn", 30.0, 0.1, 1e-3, {}), D.BenchRow(s, "base+trace", 26.0, 0.1, float("nan"), {}),
            D.BenchRow(s, "pingpong+trace", 21.0, 0.1, float("nan"), {}),
            D.BenchRow(s, "pingpong+tracelead", 20.4, 0.1, float("nan"), {}),
            D.BenchRow(s, "base+tracestalls", 27.5, 0.1, float("nan"), {}),
            D.BenchRow(s, "pingpong+tracestalls", 22.0, 0.1, float("nan"), {}),
            D.BenchRow(s, "flash", float("nan"), float("nan"), float("nan"), {"error": "refused"})]
    md = D.bench_table(rows).splitlines()
    assert md[0].count("|") == md[2].count("|")
    cells = [c.strip() for c in md[2].strip("|").split("|")]
    head = [c.strip() for c in md[0].strip("|").split("|")]
    row = dict(zip(head, cells))
    tbps = s.io_bytes() / 20e-6 / 1e12
    assert row["pingpong µs (TB/s)"] == f"20.0 ({tbps:.2f})"
    assert row["flash µs (TB/s)"] == "-"
    assert row["pp vs base"] == "+25.0%" and row["pp vs cuDNN"] == "1.50x"
    assert row["trace ovh base/pp"] == "+4.0% / +5.0%"
    assert row["lead-warp ovh base/pp"] == "- / +2.0%"  # no base+tracelead row: a '-' cell
    assert row["stalls ovh base/pp"] == "+10.0% / +10.0%"
    # with a "+ref" timing (the untraced kernel timed next to the traced ones) that is the reference
    rows.append(D.BenchRow(s, "pingpong+ref", 20.5, 0.1, 3e-3, {}))
    md = D.bench_table(rows).splitlines()
    row = dict(zip(head, [c.strip() for c in md[2].strip("|").split("|")]))
    assert row["trace ovh base/pp"] == "+4.0% / +2.4%" and row["pingpong µs (TB/s)"] == f"20.0 ({tbps:.2f})"
    assert md[0] == "| " + " | ".join(head) + " |"  # +ref adds no column
    assert row["max rel err"] == "3.0e-03"
    assert row["pp % of 4.8"] == f"{100 * tbps / 4.8:.0f}%"
    # a third schedule with traced timings gets its own share of the overhead cells
    rows += [D.BenchRow(s, "intrawg", 22.0, 0.1, 2e-3, {}), D.BenchRow(s, "intrawg+trace", 23.1, 0.1, float("nan"), {})]
    md = D.bench_table(rows).splitlines()
    row = dict(zip([c.strip() for c in md[0].strip("|").split("|")], [c.strip() for c in md[2].strip("|").split("|")]))
    assert row["trace ovh base/pp/iw"] == "+4.0% / +2.4% / +5.0%"
    assert row["lead-warp ovh base/pp/iw"] == "- / -0.5% / -"  # against pingpong+ref
    assert row["intrawg µs (TB/s)"].startswith("22.0 (")


def test_launches_per_graph_keep_l2_cold_and_spread_the_replay_cost():
    mib = 1 << 20
    for set_bytes in (2 * mib, 32 * mib, 64 * mib, 128 * mib, 1024 * mib, 4096 * mib):
        n_sets, per = T.launches_per_graph(set_bytes)
        assert per % n_sets == 0 and 8 <= per <= 128
        assert n_sets * set_bytes >= min(T.L2_ROTATE_BYTES, 64 * set_bytes)  # rotation >= 256 MB
    assert T.launches_per_graph(64 * mib) == (4, 64)  # d128 16:1 sk 131072 b 1
    assert T.launches_per_graph(4096 * mib) == (1, 8)  # the largest shapes: 8 launches
    assert T.launches_per_graph(2 * mib) == (64, 64)


def test_bench_reports_the_last_of_two_passes_else_the_median_after_warm_up():
    assert T.reported_us([130.0]) == 130.0
    assert T.reported_us([130.0, 121.0]) == 121.0  # the first pass is the warm-up one
    # a slow warm-up pass and a drifting last one do not decide the row
    assert T.reported_us([140.0, 120.0, 121.0, 127.0]) == 121.0
    assert T.reported_us([140.0, 120.0, 126.0]) == 123.0
    with pytest.raises(ValueError):
        T.reported_us([])




def test_bench_times_each_traced_variant_next_to_a_reference(monkeypatch):
    seen = []
    monkeypatch.setattr(D, "bench_shape", lambda shape, ks, **kw: seen.append(list(ks)) or [])
    D.bench_run([A.Shape(1, 1, 16, 1, 131072, 128, "bf16"), A.Shape(1, 1, 16, 1, 4096, 128, "bf16")],
                ["base", "pingpong", "cudnn"], log=lambda *a: None)
    traced = ["+ref", "+trace", "+tracelead", "+tracestalls"]
    assert seen[0] == ["base", "pingpong", "cudnn", *("base" + t for t in traced), *("pingpong" + t for t in traced)]
    assert seen[1] == ["base", "pingpong", "cudnn"]  # overheads only at sk 131072, sq 1


def test_power_log_reads_a_polling_nvidia_smi(tmp_path):
    """PowerLog against a stand-in nvidia-smi (one GPU, lines as the real one prints them with
    --format=csv,noheader,nounits): samples parse, the power-cap share and clock range come out,
    and the bench table names the capped shape."""
    import stat
    import time

    from fa4trace.run.power_log import PowerLog, parse_line

    assert parse_line("1830, 701.20, 700.00, 0x0000000000000004") == (1830, 701.2, 700.0, 4)
    assert parse_line("[N/A], [N/A], 700.00, 0x0") is None and parse_line("clocks.sm, power") is None
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\n"
                    'if [ "$1" = "-L" ]; then echo "GPU 0: NVIDIA H200 (UUID: GPU-x)"; exit 0; fi\n'
                    "while true; do echo '1980, 650.00, 700.00, 0x0000000000000000'; "
                    "echo '1800, 702.50, 700.00, 0x0000000000000004'; sleep 0.05; done\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    with PowerLog(period_ms=50, exe=str(fake)) as log:
        assert log.enabled
        t0 = log.now()
        time.sleep(0.5)
        st = log.summary(t0, log.now())
    assert st is not None and st["samples"] >= 4
    assert (st["sm_mhz_min"], st["sm_mhz_max"], st["power_w_max"]) == (1800, 1980, 702.5)
    assert 0.3 <= st["power_cap_share"] <= 0.7 and st["thermal_share"] == 0
    s = A.Shape(1, 1, 16, 1, 131072, 128, "bf16")
    md = D.bench_table([D.BenchRow(s, "pingpong", 20.0, 0.1, 2e-3, {"gpu_state": st})])
    assert "power cap" in md.splitlines()[-1] and "sk 131072 b 1" in md.splitlines()[-1]
    with PowerLog(exe=str(tmp_path / "missing")) as off:
        assert not off.enabled and off.summary(0, 1e12) is None




def test_the_bench_adds_no_traced_variant_for_pdl(monkeypatch):
    seen = []
    monkeypatch.setattr(D, "bench_shape", lambda shape, ks, **kw: seen.append(list(ks)) or [])
    D.bench_run([A.Shape(1, 1, 16, 1, 131072, 128, "bf16")], ["pingpong", "pingpong@p"], log=lambda *a: None)
    assert "pingpong@p" in seen[0] and not any("@p" in k and "+" in k for k in seen[0])
