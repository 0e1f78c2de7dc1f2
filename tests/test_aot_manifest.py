"""Build folders say which recorder their kernels carry (CPU only: no library is loaded)."""

from __future__ import annotations

import json

import pytest

from fa4trace import layout as L
from fa4trace.aot import MANIFEST, BuildDir
from fa4trace.errors import Fa4traceError


def _build(tmp_path, **extra):
    (tmp_path / MANIFEST).write_text(json.dumps({"functions": {}, **extra}))
    return BuildDir(tmp_path)


def test_a_build_without_the_field_predates_the_warp_mask(tmp_path):
    bd = _build(tmp_path)
    assert bd.recorder_abi == 1
    with pytest.raises(Fa4traceError, match="built before warp selection.*rebuild"):
        bd.require_warp_mask()


def test_a_current_build_takes_warp_subsets(tmp_path):
    bd = _build(tmp_path, recorder_abi=L.RECORDER_ABI)
    assert bd.recorder_abi >= L.WARP_MASK_ABI
    bd.require_warp_mask()  # no error


def test_a_folder_without_a_manifest_is_one_clear_error(tmp_path):
    with pytest.raises(Fa4traceError, match="fa4trace build"):
        BuildDir(tmp_path)


def test_config_keys_added_later_read_as_their_default_in_older_builds(tmp_path):
    """A manifest written before the ``pdl`` key: its kernels are the non-PDL ones."""
    fn = {"kind": "attention", "config": {"head_dim": 64, "schedule": "pingpong", "traced": False}}
    bd = _build(tmp_path, functions={"old_kernel": fn})
    assert bd.find("attention", head_dim=64, pdl=False) == "old_kernel"
    with pytest.raises(Fa4traceError, match="pdl=True"):
        bd.find("attention", head_dim=64, pdl=True)
