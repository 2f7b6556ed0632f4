"""bench/sass_stalls.py: ncu's per-instruction samples joined with nvdisasm's line table (CPU only).

The listing and the CSV here are small hand-made copies of the two formats (nvdisasm -c -gi: one
`//##` line per inlining level, innermost first; ncu's source page: messages, then a header with
address, source and sample columns), so that the joins and the region names can be checked exactly.
"""
import importlib.util
import sys
from pathlib import Path

import pytest

# bench/ is a folder of scripts, not a package: load the script as a module (registered first, as
# dataclasses need their module in sys.modules)
_SPEC = importlib.util.spec_from_file_location("sass_stalls", Path(__file__).resolve().parents[1] / "bench" / "sass_stalls.py")
sass_stalls = importlib.util.module_from_spec(_SPEC)
sys.modules.setdefault("sass_stalls", sass_stalls)
_SPEC.loader.exec_module(sass_stalls)

SOURCE = """\
template <int D>
__device__ __forceinline__ void fold(float* o,
                                     const float* pv) {
  for (int i = 0; i < D; ++i) {
    o[i] += pv[i];
  }
}
__global__ void kernel(float* o) {
  auto step = [&](int m) {
    if (m > 0) {
      fold<4>(o, o);
    }
  };
  for (int m = 0; m < 8; ++m) step(m);
}
"""


def _listing(src: Path) -> str:
    f = str(src)
    return f"""\
.text._Z5otherv:
        /*0000*/                   NOP ;
.text._Z6kernelPf:
\t//## File "{f}", line 5 inlined at "{f}", line 11
\t//## File "{f}", line 11 inlined at "{f}", line 14
\t//## File "{f}", line 14
        /*0000*/                   FADD R0, R1, R2 ;
        /*0010*/                   FADD R3, R4, R5 ;
\t//## File "{f}", line 10 inlined at "{f}", line 14
\t//## File "{f}", line 14
        /*0020*/                   @P0 ISETP.GT.AND P0, PT, R6, RZ, PT ;
.text._Z5thirdv:
        /*0000*/                   NOP ;
"""


CSV = """\
==PROF== Connected to process 1
"# Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)","stall_wait","stall_long_sb"
"0x00000000","FADD R0, R1, R2","60","50","40","10"
"0x00000010","FADD R3, R4, R5","30","20","20","0"
"0x00000020","@P0 ISETP.GT.AND P0, PT, R6, RZ, PT","10","1,0","0","10"
"""


def test_line_table_keeps_every_inlining_level_of_the_named_kernel(tmp_path):
    src = tmp_path / "k.cuh"
    src.write_text(SOURCE)
    table = sass_stalls.line_table(_listing(src), "kernel")
    assert sorted(table) == [0x0, 0x10, 0x20]  # the other functions' instructions are not mixed in
    assert table[0x10] == [(str(src), 5), (str(src), 11), (str(src), 14)]
    assert table[0x20] == [(str(src), 10), (str(src), 14)]


def test_regions_name_the_enclosing_function_or_lambda_not_a_loop(tmp_path):
    src = tmp_path / "k.cuh"
    src.write_text(SOURCE)
    regions = sass_stalls.Regions()
    assert regions.name(str(src), 5) == "k.cuh:fold"  # header over three lines, inside a for block
    assert regions.name(str(src), 11) == "k.cuh:step"  # inside an if block of the lambda
    assert regions.name(str(src), 14) == "k.cuh:kernel"  # after the lambda closed


def test_summary_joins_samples_with_regions_and_reasons(tmp_path):
    src = tmp_path / "k.cuh"
    src.write_text(SOURCE)
    rows = sass_stalls.read_source_csv(CSV)
    assert [r.address for r in rows] == [0, 16, 32] and rows[2].opcode == "ISETP" and rows[2].not_issued == 10
    summary = sass_stalls.summarize(rows, sass_stalls.line_table(_listing(src), "kernel"), top=5)
    assert summary["samples"] == 100
    assert summary["by_region"] == [("k.cuh:fold", 90, 0.9), ("k.cuh:step", 10, 0.1)]
    assert summary["by_opcode"][0] == ("FADD", 90, 0.9)
    assert dict((k, v) for k, v, _ in summary["by_reason"]) == {"wait": 60, "long_sb": 20}
    assert summary["by_kernel_line"][0][0] == "k.cuh:11 (step)"  # the statement in the loop's step
    assert summary["hottest"][0][:3] == ("0x0", "FADD R0, R1, R2", 60)


def test_a_csv_without_the_columns_says_what_it_found():
    with pytest.raises(ValueError, match="header: Kernel, Duration"):
        sass_stalls.read_source_csv('"Kernel","Duration"\n"a","1"\n')


def test_main_without_the_kernel_in_the_listing_fails_clearly(tmp_path, capsys):
    (tmp_path / "r.csv").write_text(CSV)
    (tmp_path / "k.sass").write_text(_listing(tmp_path / "k.cuh"))
    assert sass_stalls.main([str(tmp_path / "r.csv"), "--sass", str(tmp_path / "k.sass"), "--kernel", "nope"]) == 2
    assert "no function containing 'nope'" in capsys.readouterr().err


def test_a_kernel_name_that_matches_several_functions_is_refused(tmp_path):
    listing = _listing(tmp_path / "k.cuh").replace("_Z5thirdv", "_Z7kernel2v")
    with pytest.raises(ValueError, match="2 functions contain 'kernel'"):
        sass_stalls.line_table(listing, "kernel")
    assert sass_stalls.line_table(listing, "_Z6kernelPf")  # the exact name still works
