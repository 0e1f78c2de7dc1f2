"""`fa4trace sass`: the static footprint per warp role (fa4trace.bench.sasscfg, sassroles, static).

Most cases read SASS text, no compile: a hand-written warp-specialized sm_100a listing
(tests/data/static_ws_sm100.sass: a jump table on the warp index, setmaxnreg per role, an
out-of-line barrier retry) and a Hopper one inline (a warp-index EXIT, a combine loop after the
consumer's main loop). One test compiles our decode kernel plain and traced on the CPU (with a
small user kernel, FILE.py:FUNCTION) and checks that the roles it reports are plausible.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from fa4trace.bench import static
from fa4trace.bench.sass import counts, find_tool, resources
from fa4trace.bench.sasscfg import Cfg, functions
from fa4trace.bench.sassroles import attribute, function_roles, warp_branches
from fa4trace.cli import main
from fa4trace.format.errors import Fa4traceError

ROOT = Path(__file__).resolve().parents[1]
SM100 = (ROOT / "tests" / "data" / "static_ws_sm100.sass").read_text()


def _listing(body: list[str]) -> str:
    """An nvdisasm-like listing of one kernel: labels as given, every other line an instruction."""
    out = ["        .global         k", "        .type           k,@function", "k:"]
    for k, line in enumerate(body):
        out.append(line if line.endswith(":") else f"        /*{16 * k:04x}*/                   {line} ;")
    return "\n".join(out) + "\n"


# Our decode kernel's shape on sm_90a: warp 4 the producer, `warp > 3: EXIT`, then the consumer
# warpgroup: its main loop (HGMMA + MUFU.EX2), and a split-KV combine loop (MUFU.EX2 alone).
SM90 = _listing([
    "S2R R7, SR_TID.X", "SHF.R.U32.HI R10, RZ, 0x5, R7", "ISETP.NE.U32.AND P0, PT, R10, 0x4, PT",
    "@P0 BRA `(.L_x_2)",
    ".L_x_1:", "SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR25+0x30], R0", "UTMALDG.4D [UR16], [UR28], desc[UR30]",
    "IADD3 R5, R5, 0x1, RZ", "ISETP.LT.AND P1, PT, R5, R6, PT", "@P1 BRA `(.L_x_1)",
    ".L_x_2:", "ISETP.GT.AND P0, PT, R10, 0x3, PT", "@P0 EXIT",
    "MOV R4, RZ",
    ".L_x_3:", "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], RZ, !UPT", "FMNMX R3, R24, R25, !PT",
    "MUFU.EX2 R24, R24", "MUFU.EX2 R25, R25", "HGMMA.64x128x16.F32.BF16 R56, R24, gdesc[UR12], R56",
    "IADD3 R4, R4, 0x1, RZ", "ISETP.LT.AND P1, PT, R4, R6, PT", "@P1 BRA `(.L_x_3)",
    "ISETP.GE.AND P2, PT, R9, 0x2, PT", "@!P2 BRA `(.L_x_5)",
    ".L_x_4:", "LDG.E R12, desc[UR4][R2.64]", "MUFU.EX2 R12, R12", "FADD R13, R13, R12", "IADD3 R9, R9, -0x1, RZ",
    "ISETP.NE.AND P2, PT, R9, RZ, PT", "@P2 BRA `(.L_x_4)",
    ".L_x_5:", "STG.E desc[UR4][R14.64], R13", "EXIT",
])


def _roles(listing: str) -> dict:
    fn = next(f for f in functions(listing) if f.kernel)
    return function_roles(fn)


# ---- control flow ------------------------------------------------------------------------------
def test_blocks_follow_branches_jump_tables_and_guarded_exits():
    fn = next(f for f in functions(SM100) if f.kernel)
    assert fn.name == "kernel_ws" and len(fn.instrs) == 57
    cfg = Cfg(fn)
    brx = cfg.blocks[cfg.at[next(i.index for i in fn.instrs if i.op == "BRX")]]
    starts = sorted(cfg.blocks[s].start for s in brx.succs)
    assert starts == [fn.labels[".L_x_5"], fn.labels[".L_x_6"], fn.labels[".L_x_8"]]  # the three targets, no fall-through
    # `BRA.U UP0, target`: a predicate operand makes the branch conditional (two successors)
    first = cfg.blocks[0]
    assert len(first.succs) == 2
    # natural loops: softmax (its retry stub inside it), the retry stub, mma, producer, correction;
    # the self-loop after the exit is unreachable and makes none
    assert len(cfg.loops) == 5
    softmax = next(k for k, lp in enumerate(cfg.loops) if lp.header == cfg.at[fn.labels[".L_x_2"]])
    assert len(cfg.loops[softmax].children) == 1
    assert len(cfg.instrs(cfg.own_blocks(softmax))) == 12  # the loop's own code: the retry loop left out
    guarded = _listing(["S2R R0, SR_TID.X", "ISETP.GE.AND P0, PT, R0, 0x40, PT", "@P0 EXIT", "MOV R1, RZ", "EXIT"])
    g = Cfg(functions(guarded)[0])
    assert [len(b) for b in g.blocks] == [3, 2] and g.blocks[0].succs == [1]


def test_warp_index_branches_are_found_through_registers_and_predicates():
    fn = next(f for f in functions(SM100) if f.kernel)
    cfg = Cfg(fn)
    found = {fn.instrs[i].op for i in warp_branches(cfg).values()}
    assert len(warp_branches(cfg)) == 3 and found == {"BRA", "BRX"}  # the two BRA.U on UR23 and the jump table
    # the same code with the branches computed from the CTA index instead: none is a warp-index branch
    cta = SM100.replace("S2R R2, SR_TID.X", "S2R R2, SR_CTAID.X")
    assert warp_branches(Cfg(next(f for f in functions(cta) if f.kernel))) == {}
    # a thread-index compare against a whole number of warps counts; against a lane does not
    whole = _listing(["S2R R0, SR_TID.X", "ISETP.GE.AND P0, PT, R0, 0x80, PT", "@P0 BRA `(.L_x_1)", "MOV R1, RZ",
                      ".L_x_1:", "EXIT"])
    lane = whole.replace("0x80, PT", "0x7, PT")
    assert len(warp_branches(Cfg(functions(whole)[0]))) == 1
    assert warp_branches(Cfg(functions(lane)[0])) == {}


# ---- roles -------------------------------------------------------------------------------------
def test_roles_of_a_warp_specialized_sm100_kernel():
    r = _roles(SM100)
    assert list(r["roles"]) == ["producer", "mma", "softmax", "correction"]
    one = {k: v[0] for k, v in r["roles"].items()}
    assert all(len(v) == 1 and v[0]["confidence"] == "high" for v in r["roles"].values())
    assert one["softmax"]["entry"] == "0x0060" and one["softmax"]["evidence"]["entered_from"] == ["0x0050"]
    assert one["producer"]["evidence"]["entered_from"] == ["0x0230"]  # through the jump table
    assert {k: v["setmaxnreg"] for k, v in one.items()} == {"producer": [120], "mma": [120], "softmax": [192],
                                                             "correction": [80]}
    assert {k: v["mainloop"]["instructions"] for k, v in one.items()} == {"producer": 6, "mma": 6, "softmax": 12,
                                                                          "correction": 6}
    assert one["softmax"]["mainloop"]["signatures"] == {"ex2": 2, "tmem_load": 1, "tmem_store": 1}
    # the dispatch before the roles and the warps' common exit belong to none
    assert r["unattributed"]["instructions"] == 17


def test_a_consumer_keeps_its_later_phases_and_a_warp_index_exit_opens_it():
    r = _roles(SM90)
    assert list(r["roles"]) == ["producer", "consumer"]
    consumer = r["roles"]["consumer"][0]
    assert consumer["confidence"] == "high"
    assert consumer["mainloop"]["signatures"] == {"ex2": 2, "mma": 2}  # the main loop, not the combine loop
    assert consumer["signatures"]["ex2"] == 3  # the combine's exponential is the consumer's too
    assert consumer["evidence"]["entered_from"] == ["0x00c0"]  # the `@P0 EXIT` of warps above 3


def test_registers_set_above_a_nested_dispatch_are_the_roles():
    """A producer warpgroup that gives up registers before picking its one loading warp (FA4's
    SM90 forward does): the role's registers are that setmaxnreg, the consumer's its own."""
    listing = _listing([
        "S2R R2, SR_TID.X", "SHF.R.U32.HI R0, RZ, 0x5, R2", "ISETP.GT.AND P0, PT, R0, 0x3, PT", "@P0 BRA `(.L_x_1)",
        "USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xf0",
        ".L_x_2:", "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], RZ, !UPT", "MUFU.EX2 R24, R24",
        "ISETP.LT.AND P1, PT, R4, R6, PT", "@P1 BRA `(.L_x_2)", "EXIT",
        ".L_x_1:", "USETMAXREG.DEALLOC.CTAPOOL 0x18", "ISETP.NE.AND P0, PT, R0, 0x4, PT", "@P0 EXIT",
        ".L_x_3:", "UTMALDG.4D [UR16], [UR28], desc[UR30]", "ISETP.LT.AND P1, PT, R5, R6, PT", "@P1 BRA `(.L_x_3)",
        "EXIT"])
    k = static.listing_kernels(listing, {"k": {"registers": 168}}, [])[0]
    assert {r: (v["registers"], v["registers_from"]) for r, v in k["roles"].items()} == {
        "producer": (24, "setmaxnreg before the role's entry"), "consumer": (240, "setmaxnreg")}
    assert k["roles"]["producer"]["confidence"] == "high" and k["registers"] == 168


def test_without_a_warp_index_branch_roles_come_from_signatures_alone():
    cta = SM100.replace("S2R R2, SR_TID.X", "S2R R2, SR_CTAID.X")
    r = _roles(cta)
    assert list(r["roles"]) == ["producer", "mma", "softmax", "correction"]
    assert all(v[0]["confidence"] == "medium" for v in r["roles"].values())
    # a loop with no signature is nobody's: a kernel without any is all unattributed
    plain = _listing(["MOV R0, RZ", ".L_x_1:", "IADD3 R0, R0, 0x1, RZ", "ISETP.LT.AND P0, PT, R0, 0x8, PT",
                      "@P0 BRA `(.L_x_1)", "EXIT"])
    r = _roles(plain)
    assert r["roles"] == {} and r["unattributed"]["instructions"] == 5


def test_resources_come_from_the_cubin_listing():
    full = """
	//----- nvinfo : EIATTR_REGCOUNT
	.align		4
        /*0000*/ 	.byte	0x04, 0x2f
        /*0002*/ 	.short	(.L_2 - .L_1)
.L_1:
        /*0004*/ 	.word	index@(kernel_ws)
        /*0008*/ 	.word	0x000000a8
	//----- nvinfo : EIATTR_FRAME_SIZE
.L_2:
        /*000c*/ 	.byte	0x04, 0x11
        /*0010*/ 	.word	index@(kernel_ws)
        /*0014*/ 	.word	0x00000010
//--------------------- .nv.shared.kernel_ws --------------------------
	.section	.nv.shared.kernel_ws,"aw",@nobits
	.align	1024
	.zero		1024
//--------------------- .nv.shared.reserved.0     --------------------------
	.section	.nv.shared.reserved.0,"aw",@nobits
	.zero		64
"""
    assert resources(full) == {"kernel_ws": {"registers": 168, "stack_frame_bytes": 16, "static_smem_bytes": 1024}}


# ---- the report and its diff ---------------------------------------------------------------------
def _traced(listing: str) -> str:
    """The listing as a recorder would grow it: a timer read and a record store in every loop."""
    out = []
    for line in listing.splitlines():
        out.append(line)
        if line.strip().endswith(":") and line.strip().startswith(".L_x_"):
            out += ["        /*0000*/                   CS2R R40, SR_CLOCKLO ;",
                    "        /*0000*/                   STG.E.64 desc[UR6][R42.64], R40 ;"]
    return "\n".join(out)


def _spilled(listing: str) -> str:
    """A DSL upgrade's softmax: a register spilled and reloaded in its main loop."""
    return listing.replace("MUFU.EX2 R9, R9 ;", "MUFU.EX2 R9, R9 ;\n        /*0000*/                   STL [R1+0x10], R8 ;"
                                                "\n        /*0000*/                   LDL R8, [R1+0x10] ;")


def _report(listing: str) -> dict:
    res = {"kernel_ws": {"registers": 128, "stack_frame_bytes": 0, "static_smem_bytes": 1024}}
    launch = [{"kernel": "k.kernel_ws", "block": [256, 1, 1], "dynamic_smem_bytes": 232448}]
    builds = [{"build": b, "records": b, "compile_s": 0.0, "kernels": static.listing_kernels(text, res, launch)}
              for b, text in (("plain", listing), ("traced", _traced(listing)))]
    return static.document([static.kernel_entry("ws", "sm_100a", {}, builds)], command="test")


def test_the_report_is_a_result_file_of_traced_minus_plain_per_role():
    doc = _report(SM100)
    assert doc["kind"] == static.KIND and doc["schema"] == static.SCHEMA and doc["area"] == "static-footprint"
    assert doc["gpu"].startswith("none") and [c[0] for c in doc["columns"]][:3] == ["kernel", "arch", "role"]
    rows = {r["role"]: r for r in doc["rows"]}
    assert list(rows) == ["(kernel)", "producer", "mma", "softmax", "correction"]
    # every loop grew by its two recorder instructions (the retry loop is not the softmax's own code)
    assert {k: rows[k]["mainloop_added"] for k in ("producer", "mma", "softmax", "correction")} == \
        {"producer": 2, "mma": 2, "softmax": 4, "correction": 2}
    assert rows["softmax"]["mainloop_timer_reads"] == 2 and rows["softmax"]["registers_traced"] == 192
    assert rows["(kernel)"]["smem_plain"] == 1024 + 232448 and rows["(kernel)"]["spills_traced"] == 0
    delta = doc["kernels"][0]["delta"][0]
    assert delta["roles"]["mma"]["mainloop"] == 2 and delta["smem_bytes"] == 0
    text = static.text(doc)
    assert "softmax" in text and "12 -> 16 (+4)" in text and "nothing ran on a GPU" in text


def test_diff_names_the_softmax_spill_of_an_upgrade():
    before, after = _report(SM100), _report(_spilled(SM100))
    d = static.diff_static(before, after, threshold_pct=10)
    named = {(c["build"], c["role"], c["metric"]) for c in d["beyond"]}
    assert ("traced", "softmax", "mainloop_local_stores") in named and ("plain", "softmax", "local_loads") in named
    assert {c["role"] for c in d["beyond"]} <= {"softmax", "(kernel)"}  # the other roles did not move
    assert not d["unmatched"]
    text = static.diff_text(d)
    assert text.splitlines()[0].startswith(f"{len(d['beyond'])} increase(s) beyond 10%")
    assert "softmax: mainloop_local_stores 0 -> 1 (+1, new)" in text
    # a report against itself: nothing changed; a growth under the threshold is listed, not beyond it
    assert static.diff_static(before, before)["changes"] == []
    grown = json.loads(json.dumps(after))
    grown["kernels"][0]["builds"][1]["kernels"][0]["roles"]["softmax"]["instructions"] += 1
    small = [c for c in static.diff_static(after, grown, threshold_pct=50)["changes"] if c["metric"] == "instructions"]
    assert small and not small[0]["beyond"]


def test_a_role_found_in_one_report_only_is_unmatched():
    a = _report(SM100)
    b = json.loads(json.dumps(a))
    del b["kernels"][0]["builds"][1]["kernels"][0]["roles"]["correction"]
    d = static.diff_static(a, b)
    assert {"kernel": "ws", "arch": "sm_100a", "build": "traced", "role": "correction", "in": "a only"} in d["unmatched"]
    with pytest.raises(Fa4traceError, match="threshold must be >= 0"):
        static.diff_static(a, b, threshold_pct=-1)


def test_fa4trace_diff_takes_two_static_reports(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_report(SM100)))
    b.write_text(json.dumps(_report(_spilled(SM100))))
    r = CliRunner().invoke(main, ["diff", str(a), str(b)])
    assert r.exit_code == 0 and "softmax: local_stores 0 -> 1" in r.output, r.output
    r = CliRunner().invoke(main, ["diff", str(a), str(b), "--fail-above", "5"])
    assert r.exit_code == 1
    r = CliRunner().invoke(main, ["diff", str(a), str(a), "--fail-above", "5", "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["kind"] == static.DIFF_KIND
    other = tmp_path / "other.json"
    other.write_text('{"area": "x", "rows": []}')
    r = CliRunner().invoke(main, ["diff", str(a), str(other)])
    assert r.exit_code == 2 and "not a static footprint report" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_load_refuses_what_is_not_a_report(tmp_path):
    p = tmp_path / "r.json"
    with pytest.raises(Fa4traceError, match="no such file"):
        static.load(p)
    p.write_text("not json")
    with pytest.raises(Fa4traceError, match="not a JSON file"):
        static.load(p)
    p.write_text(json.dumps(dict(_report(SM100), schema=99)))
    with pytest.raises(Fa4traceError, match="schema 99"):
        static.load(p)


def test_reading_and_diffing_reports_needs_no_dsl_or_torch(tmp_path):
    p = tmp_path / "r.json"
    p.write_text(json.dumps(_report(SM100)))
    code = f"""
import sys, importlib.abc
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("cutlass", "torch", "tvm_ffi", "cuda"):
            raise ImportError(name)
sys.meta_path.insert(0, Block())
from fa4trace.bench import static, staticbuild
d = static.load({str(p)!r})
print(static.diff_static(d, d)["changes"], len(staticbuild.parse_target("decode")))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "[] 1", r.stderr


# ---- the command line ----------------------------------------------------------------------------
@pytest.mark.parametrize("args, message", [
    (["nosuch"], "unknown kernel 'nosuch'"),
    (["missing.py:make"], "missing.py: no such file"),
    (["--arch", "sm_80", "k.py:make"], "unknown arch 'sm_80'"),
    (["decode", "--families", "nosuch"], "--families: unknown nosuch"),
    (["decode", "--families", "tma"], "our decode kernel records its own events"),
])
def test_bad_input_is_one_line_before_anything_compiles(args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(static, "run", lambda *a, **k: pytest.fail("compiled"))
    r = CliRunner().invoke(main, ["sass", *args])
    lines = r.stderr.strip().splitlines()
    assert r.exit_code != 0 and len(lines) == 1 and message in lines[0], r.stderr


def test_an_existing_report_is_not_overwritten(tmp_path, monkeypatch):
    out = tmp_path / "r.json"
    out.write_text("{}")
    monkeypatch.setattr(static, "run", lambda *a, **k: pytest.fail("compiled"))
    r = CliRunner().invoke(main, ["sass", "decode", "-o", str(out)])
    assert r.exit_code == 1 and "refusing to overwrite it (add --force)" in r.stderr and out.read_text() == "{}"


# ---- compiled on the CPU -------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(not find_tool("nvdisasm"), reason="needs nvdisasm")
def test_our_decode_kernel_compiled_plain_and_traced():
    """Our decode kernel (sm_90a) and a small user kernel, compiled on this CPU: the producer
    issues the TMA loads, the consumer the MMAs and the softmax, both with high confidence; the
    traced build adds instructions and timer reads to both main loops; shared memory is the
    launch's and the cubin's. (The compile and the disassembly run in tests/tools/static_probe.py,
    kept in the PTX cache under a key of every source, package and the nvdisasm it used.)"""
    pytest.importorskip("cutlass")
    pytest.importorskip("tvm_ffi")
    sys.path.insert(0, str(Path(__file__).parent / "tools"))
    from compile_pool import probe_json
    from conftest import PTX_CACHE

    nvdisasm = find_tool("nvdisasm")
    version = subprocess.run([nvdisasm, "--version"], capture_output=True, text=True).stdout.strip()
    got = probe_json(Path(__file__).parent / "tools" / "static_probe.py", (nvdisasm, version), PTX_CACHE)
    doc = got["doc"]
    assert got["reloaded_rows_equal"]
    decode = next(k for k in doc["kernels"] if k["kernel"] == "decode")
    plain, traced = (b["kernels"][0] for b in decode["builds"])
    assert list(plain["roles"]) == list(traced["roles"]) == ["producer", "consumer"]
    for k in (plain, traced):
        assert k["roles"]["producer"]["mainloop_signatures"].get("tma_load")
        assert {"mma", "ex2"} <= set(k["roles"]["consumer"]["mainloop_signatures"])
        assert all(r["confidence"] == "high" for r in k["roles"].values())
        assert k["registers"] and k["dynamic_smem_bytes"] > 100_000 and k["threads"] == 160
    for role in ("producer", "consumer"):
        assert traced["roles"][role]["mainloop"] > plain["roles"][role]["mainloop"]
        assert traced["roles"][role]["mainloop_timer_reads"] > 0 == plain["roles"][role]["mainloop_timer_reads"]
    assert traced["instructions"] > plain["instructions"] and plain["timer_reads"] == 0
    # the user kernel: no warp roles, its loop unattributed; tracing adds the warps' lifetimes
    mine = next(k for k in doc["kernels"] if k["kernel"] != "decode")
    up, ut = (b["kernels"][0] for b in mine["builds"])
    assert up["roles"] == {} and ut["timer_reads"] > up["timer_reads"] == 0
    assert got["sass_files"] == 4
    assert "decode" in static.text(doc)
