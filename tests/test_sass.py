"""fa4trace.bench.sass: SASS counts of a PTX kernel on the CPU (ptxas + nvdisasm where found)."""

from __future__ import annotations

import pytest

from fa4trace.bench.sass import find_tool, footprint, sass_of

LISTING = """
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   S2UR UR4, SR_CLOCKLO ;
        /*0020*/                   CS2R.32 R2, SR_CLOCKLO ;
        /*0030*/              @!P0 S2UR UR6, SR_GLOBALTIMERLO ;
        /*0040*/                   STS.64 [R4+UR5], R2 ;
        /*0050*/                   STSM.16.M88.4 [R3], R8 ;
        /*0060*/                   LDS R10, [R4] ;
        /*0070*/              @P1  STG.E.64 desc[UR8][R16.64], R10 ;
        /*0080*/                   BRA `(.L_x_1) ;
        .L_x_1:
"""

# a kernel that reads %clock and stores it into shared memory, then to global memory
PTX = """.version 8.0
.target sm_90a
.address_size 64
.visible .entry k(.param .u64 out)
{
    .reg .b32 %r<3>;
    .reg .b64 %rd<3>;
    .shared .align 4 .b32 buf[32];
    mov.u32 %r1, %clock;
    st.shared.u32 [buf], %r1;
    ld.shared.u32 %r2, [buf];
    ld.param.u64 %rd1, [out];
    cvta.to.global.u64 %rd2, %rd1;
    st.global.u32 [%rd2], %r2;
    ret;
}
"""


def test_footprint_counts_what_tracing_adds():
    fp = footprint(LISTING)
    assert fp["instructions"] == 9  # the label and blank lines are no instructions
    assert (fp["timer_reads"], fp["timer_reads_uniform"], fp["timer_reads_per_lane"]) == (3, 2, 1)
    # STSM (a matrix store) is not one of the recorder's shared stores
    assert (fp["shared_stores"], fp["shared_loads"], fp["global_stores"], fp["branches"]) == (1, 1, 1, 1)


@pytest.mark.skipif(not (find_tool("ptxas") and find_tool("nvdisasm")), reason="needs ptxas and nvdisasm")
def test_a_ptx_kernel_assembles_and_is_counted():
    fp = footprint(sass_of(PTX))
    assert fp["timer_reads"] == 1 and fp["shared_stores"] == 1 and fp["global_stores"] == 1
    assert fp["instructions"] >= 5


def test_missing_tools_say_so_in_one_line(monkeypatch):
    import fa4trace.bench.sass as sass

    monkeypatch.setattr(sass, "find_tool", lambda name: None if name == "nvdisasm" else "/usr/bin/true")
    with pytest.raises(RuntimeError, match="needs ptxas and nvdisasm.*nvdisasm not found") as e:
        sass.sass_of(PTX)
    assert "\n" not in str(e.value)


@pytest.mark.skipif(not (find_tool("ptxas") and find_tool("nvdisasm")), reason="needs ptxas and nvdisasm")
def test_bad_ptx_fails_in_one_line():
    with pytest.raises(RuntimeError, match="ptxas failed") as e:
        sass_of("not ptx")
    assert "\n" not in str(e.value)


def test_a_result_file_of_counts_says_what_each_adds():
    from fa4trace.bench.sass import COUNT_COLUMNS, envelope

    plain, traced = footprint(LISTING), dict(footprint(LISTING), instructions=30)
    doc = envelope("x-sass", "counts", [({"part": "plain"}, plain), ({"part": "traced"}, traced)], plain,
                   [["part", "part"]], "notes")
    assert [r["added"] for r in doc["rows"]] == [0, 21] and doc["gpu"].startswith("none")
    assert doc["columns"] == [["part", "part"], *[list(c) for c in COUNT_COLUMNS]]
    assert all(k in doc["rows"][0] for k, _ in COUNT_COLUMNS)


def _loop(label: str, body: list) -> list:
    return [f"        {label}:"] + [f"        /*0000*/                   {ins} ;" for ins in body] + \
        [f"        /*0000*/               @P0 BRA `({label}) ;"]


# an outer loop (rotated: its label sits inside the range of the loops below), an untraced copy of
# the main loop, the traced copy (longer, the same MMAs) and an epilogue loop with one MMA
MAINLOOPS = "\n".join(
    ["        /*0000*/                   LDC R1, c[0x0][0x28] ;", "        .L_x_9:"]
    + _loop(".L_x_1", ["HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], R24", "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], R24",
                       "MUFU.EX2 R3, R3"])
    + _loop(".L_x_2", ["HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], R24", "S2UR UR4, SR_CLOCKLO", "STS.64 [R4], R2",
                       "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], R24", "MUFU.EX2 R3, R3"])
    + _loop(".L_x_3", ["HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], R24", "FMUL R3, R3, R3"])
    + ["        /*0000*/                   BRA `(.L_x_9) ;"])


def test_the_main_loop_is_the_innermost_loop_issuing_the_most_mmas():
    from fa4trace.bench.sass import mainloop

    loop = mainloop(MAINLOOPS)
    assert len(loop) == 6 and sum("S2UR" in x for x in loop) == 1  # the traced copy, its back branch too
    assert footprint(MAINLOOPS)["mainloop"] == 6
    assert mainloop(LISTING) is None and footprint(LISTING)["mainloop"] is None  # no MMA loop
