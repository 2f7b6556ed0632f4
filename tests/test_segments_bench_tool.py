"""bench/segments_bench.py's table on the CPU (its measurements run in the device runs)."""
import importlib.util
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location("segments_bench", Path(__file__).resolve().parents[1] / "bench" / "segments_bench.py")
segments_bench = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(segments_bench)


def _row(sage):
    ms = {"sdpa-cudnn": 200.0, "speed": 120.0, "merged": 100.0}
    if sage:
        ms["sageattn-2.2"] = 150.0
    return {"shape": "wan22-14b-720p", "data": "video", "segment_end_share": 0.25, "ms": ms,
            "rel_l2": {"speed": 0.0099, "merged": 0.0098}}


def test_the_table_gives_the_ratios_against_both_peers_and_dashes_without_sageattention():
    lines = segments_bench.table([_row(True), dict(_row(False), within_bins=8)]).splitlines()
    assert len(lines) == 4 and lines[1].count("|---") == 13
    with_sa = [c.strip() for c in lines[2].split("|")[1:-1]]
    assert with_sa[2:11] == ["0", "0.25", "200.000", "150.000", "120.000", "100.000", "0.833", "2.000", "1.500"]
    without = [c.strip() for c in lines[3].split("|")[1:-1]]
    assert without[2] == "8"  # the within-cluster bins of the row's grouping (older rows: 0)
    assert without[5] == "-" and without[10] == "-"
