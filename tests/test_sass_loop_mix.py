"""bench/sass_loop_mix.py: the hot loop's instruction mix from SASS text (CPU only, a hand-made listing).

The portable kernel's chunk loop tests at its head and jumps back unconditionally; the Hopper kernels' loops
close with a conditional branch and have out-of-line barrier-retry blocks that jump back unconditionally.
"""
import importlib.util
import sys
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location("sass_loop_mix", Path(__file__).resolve().parents[1] / "bench" / "sass_loop_mix.py")
sass_loop_mix = importlib.util.module_from_spec(_SPEC)
sys.modules.setdefault("sass_loop_mix", sass_loop_mix)
_SPEC.loader.exec_module(sass_loop_mix)

LISTING = """\
.text.kernel_a:
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_0:
        /*0010*/                   ISETP.GE.AND P0, PT, R2, R3, PT ;
        /*0020*/               @P0 BRA `(.L_x_1) ;
        /*0030*/                   IMMA.16832.S8.S8 R4, R8, R12, R4 ;
        /*0040*/                   FFMA R5, R6, R7, R5 ;
        /*0050*/                   MUFU.EX2 R9, R9 ;
        /*0060*/                   IADD3 R2, R2, 0x1, RZ ;
        /*0070*/                   BRA `(.L_x_0) ;
.L_x_1:
        /*0080*/                   EXIT ;
"""


def test_an_unconditional_back_branch_closes_the_loop_only_when_asked():
    rows = sass_loop_mix.functions(LISTING)["kernel_a"]
    assert sass_loop_mix.hot_loop(rows) == []  # the Hopper default: retry blocks jump back unconditionally
    trip = sass_loop_mix.hot_loop(rows, any_back_branch=True)
    assert [sass_loop_mix.opcode(i).split(".")[0] for i in trip] == ["ISETP", "BRA", "IMMA", "FFMA", "MUFU", "IADD3", "BRA"]
    ops, pipes = sass_loop_mix.mix(trip)
    assert ops["FFMA"] == 1 and pipes["XU"] == 1 and pipes["FMA"] == 1


VOTED = """\
.text.kernel_b:
.L_x_0:
        /*0000*/                   VIMNMX3 R1, R2, R3, R1, PT ;
        /*0010*/                   VOTE.ALL P0, P0 ;
        /*0020*/               @P0 BRA `(.L_x_2) ;
        /*0030*/                   VIMNMX R4, R4, R5, !PT ;
        /*0040*/                   VIMNMX R6, R6, R5, !PT ;
.L_x_2:
        /*0050*/                   IMAD R4, R4, R7, R8 ;
        /*0060*/                   ISETP.NE.AND P1, PT, R9, RZ, PT ;
        /*0070*/               @P1 BRA `(.L_x_0) ;
        /*0080*/                   EXIT ;
"""


def test_votes_pass_takes_the_branch_of_a_passed_vote_and_nothing_else():
    rows = sass_loop_mix.functions(VOTED)["kernel_b"]
    fall = [sass_loop_mix.opcode(i).split(".")[0] for i in sass_loop_mix.hot_loop(rows)]
    assert fall == ["VIMNMX3", "VOTE", "BRA", "VIMNMX", "VIMNMX", "IMAD", "ISETP", "BRA"]  # the clamped path
    passed = [sass_loop_mix.opcode(i).split(".")[0] for i in sass_loop_mix.hot_loop(rows, votes_pass=True)]
    assert passed == ["VIMNMX3", "VOTE", "BRA", "IMAD", "ISETP", "BRA"]  # the loop's own branch (P1) still closes it


ANY_VOTED = """\
.text.kernel_c:
.L_x_0:
        /*0000*/                   FSETP.NEU.AND P0, PT, R1, 1, PT ;
        /*0010*/                   VOTE.ANY P0, P0 ;
        /*0020*/              @!P0 BRA `(.L_x_2) ;
        /*0030*/                   FMUL R4, R4, R1 ;
        /*0040*/                   FMUL R5, R5, R1 ;
.L_x_2:
        /*0050*/                   HMMA.16816.F32 R4, R8, R12, R4 ;
        /*0060*/                   ISETP.NE.AND P1, PT, R9, RZ, PT ;
        /*0070*/               @P1 BRA `(.L_x_0) ;
        /*0080*/                   EXIT ;
"""


def test_anys_fail_skips_the_block_a_failed_any_vote_guards():
    rows = sass_loop_mix.functions(ANY_VOTED)["kernel_c"]
    fall = [sass_loop_mix.opcode(i).split(".")[0] for i in sass_loop_mix.hot_loop(rows)]
    assert fall == ["FSETP", "VOTE", "BRA", "FMUL", "FMUL", "HMMA", "ISETP", "BRA"]  # the rescale of O counted
    skipped = [sass_loop_mix.opcode(i).split(".")[0] for i in sass_loop_mix.hot_loop(rows, anys_fail=True)]
    assert skipped == ["FSETP", "VOTE", "BRA", "HMMA", "ISETP", "BRA"]
    assert sass_loop_mix.hot_loop(rows, votes_pass=True) == sass_loop_mix.hot_loop(rows)  # an ANY vote is not an ALL
