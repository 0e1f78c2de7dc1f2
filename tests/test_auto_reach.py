"""Kernels a program compiled before ``fa4trace.instrument()`` are traced inside the block and
plain after it (``fa4trace.auto.reach``), checked here on the CPU with real compiles.

The probe (tests/tools/reach_probe.py) fills a user's dict named like a cache, a registry
dict, quack's ``jit_cache`` (in memory and on disk) and FA4's in-memory and persistent caches
before the block; inside, each cache compiles again and serves fa4trace's Instrumented kernel;
after it, each serves the very object it held before, nothing of fa4trace is left in them and
nothing traced was written to disk. Run twice over one cache folder, the second process starts
from quack's and FA4's object files on disk (a cache warm across processes). The two runs'
output is kept in the PTX cache (tests/tools/compile_pool.probe_json): a run over an unchanged
source reads it.
"""

from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl (pip install 'fa4trace[dsl]')")
pytest.importorskip("quack.cache", reason="needs quack-kernels (pip install 'fa4trace[fa4]')")
pytest.importorskip("flash_attn.cute.cache_utils", reason="needs flash-attn-4 (pip install 'fa4trace[fa4]')")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROBE = os.path.join(ROOT, "tests", "tools", "reach_probe.py")


@pytest.fixture(scope="module")
def runs():
    """The probe's two runs over one cache folder (``--pair``), kept in the PTX cache under a key
    of every source and package version the probe can read (a hit is what this source prints)."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "tools"))
    from compile_pool import probe_json
    from conftest import PTX_CACHE

    return probe_json(PROBE, ("sm_90a", "--pair"), PTX_CACHE)["runs"]


@pytest.mark.parametrize("run", [0, 1], ids=["cold-disk", "warm-disk"])
def test_every_cache_compiles_again_inside_the_block(runs, run):
    r = runs[run]
    assert r["hidden"] == 6  # user cache, quack, FA4 in memory, FA4 persistent, two plan caches
    assert r["plans_inside"] == [False, False]  # a plan around a kernel (one inside another) is taken out whole
    assert r["inside"] == {"user": "Instrumented", "quack": "Instrumented", "fa4": "Instrumented",
                           "fa4_disk": "Instrumented"}
    assert r["compiled_inside"] == 4
    assert not any(r["served_again_inside"].values())
    assert r["inside_registry_untouched"]  # a dict not named as a cache is not a cache


@pytest.mark.parametrize("run", [0, 1], ids=["cold-disk", "warm-disk"])
def test_after_the_block_the_caches_hold_the_programs_kernels(runs, run):
    r = runs[run]
    assert r["after_same_objects"] == {"user": True, "quack": True, "fa4": True, "fa4_disk": True}
    assert r["instrumented_left"] == 0 and all(r["closed"])
    assert r["plans_after"] == [True, True, False]  # the plans put back; the one made inside removed
    assert r["quack_cache_enabled_after"] is True and r["fa4_disk_class_after"] == "JITPersistentCache"
    # quack's and FA4's object files: the two the warm-up wrote, nothing traced added or replaced
    assert r["disk_before"] == 2 and r["disk_same"]

@pytest.mark.parametrize("run", [0, 1], ids=["cold-disk", "warm-disk"])
def test_a_kernel_no_cache_holds_is_counted_and_named(runs, run):
    r = runs[run]
    assert list(r["unreached"].values()) == [1]
    assert "ran from a cache fa4trace could not reach" in r["stderr"] and "(1)" in r["stderr"]
