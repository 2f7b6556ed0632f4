"""bench/stall_sites.py without a GPU: the parsing of ncu's source-page CSV and the per-kernel summary.

What can go wrong off the GPU is one kernel's samples read under another's name (blocks split in the wrong place),
a sample column taken for a reason column, or the top sites' context taken from the wrong rows.
"""
import pytest

from vc_attention.bench import stall_sites

HEADER = ('"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)",'
          '"Instructions Executed","stall_wait","stall_short_scoreboard","stall_math_pipe_throttle"')


def _block(title, rows):
    lines = [f'"{title}"', HEADER]
    lines += [f'"{a}","{s}","{n}","{n}","{e}","{w}","{sb}","{m}"' for a, s, n, e, w, sb, m in rows]
    return "\n".join(lines)


OURS = [("0010", "IMMA.16832.S8.S8 R8, R12, R20, R8", "5", "1,024", "0", "5", "0"),
        ("0020", "I2FP.F32.S32 R30, R8", "40", "1,024", "35", "0", "5"),
        ("0030", "FFMA R31, R30, R2, -R3", "120", "1,024", "100", "0", "20"),
        ("0040", "MUFU.EX2 R32, R31", "60", "1,024", "10", "0", "50"),
        ("0050", "@!P0 BRA 0x10", "0", "16", "0", "0", "0")]
THEIRS = [("0010", "HMMA.16816.F16 R4, R8, R10, R4", "300", "2,048", "0", "100", "200"),
          ("0020", "F2FP.F16.F32.PACK_AB R5, R6, R7", "100", "2,048", "100", "0", "0")]


def test_blocks_rows_and_columns():
    blocks = stall_sites.parse_source_csv(_block("attn_mma_wide_kernel<64>", OURS) + "\n\n" +
                                          _block("qk_int_sv_f8_attn_kernel<64>", THEIRS))
    assert [b["kernel"] for b in blocks] == ["attn_mma_wide_kernel<64>", "qk_int_sv_f8_attn_kernel<64>"]
    assert [len(b["rows"]) for b in blocks] == [5, 2]
    ffma = blocks[0]["rows"][2]
    assert ffma["address"] == "0030" and ffma["sass"].startswith("FFMA") and ffma["samples"] == 120
    assert ffma["executed"] == 1024  # the thousands separator read
    assert ffma["stalls"] == {"wait": 100, "math_pipe_throttle": 20}  # zero reasons dropped, sample columns not reasons


def test_one_table_with_a_kernel_name_column_splits_where_the_name_changes():
    header = '"Kernel Name","Address","Source","Warp Stall Sampling (All Samples)","stall_wait"'
    text = "\n".join([header, '"a","0010","FFMA R1, R2, R3, R4","7","7"', '"a","0020","MUFU.EX2 R1, R1","3","0"',
                      '"b","0010","HMMA.16816.F32 R4, R8, R10, R4","9","9"'])
    blocks = stall_sites.parse_source_csv(text)
    assert [(b["kernel"], len(b["rows"])) for b in blocks] == [("a", 2), ("b", 1)]


def test_summary_orders_sites_and_keeps_their_producers():
    block = stall_sites.parse_source_csv(_block("k", OURS))[0]
    s = stall_sites.summarize(block, top=2)
    assert s["samples"] == 225 and s["instructions"] == 5
    assert list(s["by_reason"]) == ["wait", "math_pipe_throttle", "short_scoreboard"]
    assert s["by_opcode"]["FFMA"] == 120 and s["by_opcode"]["BRA"] == 0  # the predicate is not the opcode
    assert [t["address"] for t in s["top"]] == ["0030", "0040"]
    assert s["top"][0]["share"] == pytest.approx(120 / 225)
    assert s["top"][0]["before"] == [r[1] for r in OURS[:2]]  # the rows just before it, in program order
    assert s["top"][0]["reasons"] == {"wait": 100, "math_pipe_throttle": 20}


def test_opcode_drops_predicates_and_modifiers():
    assert stall_sites.opcode("@!P0 IMAD.WIDE.U32 R2, R3, R4, R5") == "IMAD"
    assert stall_sites.opcode("LDSM.16.M88.4 R8, [R2]") == "LDSM"
    assert stall_sites.opcode("") == ""


def test_bad_arguments_are_usage_errors():
    for argv in (["--targets", "mma:nosuch:plain8"], ["--targets", "sa-portable", "--top", "0"]):
        with pytest.raises(SystemExit):
            stall_sites.main(argv)
