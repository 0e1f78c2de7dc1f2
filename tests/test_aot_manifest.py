"""Build folders say which fa4trace wrote them; the loader refuses another's in one line
(CPU only: no library is loaded)."""

from __future__ import annotations

import json

import pytest

from fa4trace.format import layout as L
from fa4trace.format.errors import Fa4traceError
from fa4trace.run.aot import BUILD_FORMAT, MANIFEST, BuildDir

CURRENT = {"build_format": BUILD_FORMAT, "recorder_abi": L.RECORDER_ABI}


def _build(tmp_path, **fields):
    (tmp_path / MANIFEST).write_text(json.dumps({"functions": {}, **fields}))
    return BuildDir(tmp_path)


@pytest.mark.parametrize("fields", [{}, {"recorder_abi": 1}, {"build_format": BUILD_FORMAT, "recorder_abi": 1},
                                    {"build_format": BUILD_FORMAT - 1, "recorder_abi": L.RECORDER_ABI}])
def test_a_build_by_another_fa4trace_is_refused_with_the_rebuild_command(tmp_path, fields):
    with pytest.raises(Fa4traceError, match=r"built by another fa4trace version.*fa4trace build -o .* --force"):
        _build(tmp_path, **fields)


def test_a_current_build_opens(tmp_path):
    bd = _build(tmp_path, **CURRENT)
    assert bd.functions == {}


def test_a_folder_without_a_manifest_is_one_clear_error(tmp_path):
    with pytest.raises(Fa4traceError, match="fa4trace build"):
        BuildDir(tmp_path)


def test_find_matches_every_given_key(tmp_path):
    fns = {"a": {"kind": "attention", "config": {"head_dim": 64, "pdl": False}},
           "b": {"kind": "attention", "config": {"head_dim": 64, "pdl": True}},
           "c": {"kind": "markers", "config": {"head_dim": 64, "pdl": True}}}
    bd = _build(tmp_path, functions=fns, **CURRENT)
    assert bd.find("attention", head_dim=64, pdl=False) == "a"
    assert bd.find("attention", head_dim=64, pdl=True) == "b"
    with pytest.raises(Fa4traceError, match="no built attention kernel with head_dim=128"):
        bd.find("attention", head_dim=128)
