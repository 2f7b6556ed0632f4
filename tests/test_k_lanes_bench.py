"""bench/k_lanes_bench.py without a GPU: its row names (issue 10's speed-mode candidates) and its tables, where a row
read under another's name or a ratio against the wrong row would misstate the speed / fidelity error ratio."""
import pytest

from vc_attention.bench import k_lanes_bench as klb
from vc_attention.kernels.config import FIDELITY, SPEED


def test_rows_name_a_mode_its_lanes_and_its_grouping():
    rows = klb.parse_rows("fidelity@128x1b8, speed+lanes@64x2,speed@128x1")
    assert [r[0] for r in rows] == ["fidelity@128x1b8", "speed+lanes@64x2", "speed@128x1"]
    assert rows[0][1:] == (FIDELITY, (128, 1, 8))
    assert rows[1][1:] == (SPEED.with_(k_lane_scales=True), (64, 2, 0))
    assert rows[2][1] == SPEED.with_(k_lane_scales=False)  # a row without '+lanes' runs without them
    # the default rows: the node presets' groupings (nodes/presets.py), as they are and with lanes
    from vc_attention.nodes.presets import PRESETS, within_bins

    for label, config, (clusters, iters, bins) in klb.parse_rows(klb.DEFAULT_ROWS):
        mode = label.split("+")[0].split("@")[0]
        assert (clusters, iters, bins) == (PRESETS[mode]["clusters"], PRESETS[mode]["kmeans_iters"],
                                           within_bins(mode) if within_bins(mode) >= 2 else 0), label


@pytest.mark.parametrize("bad", ["speed", "speed@64", "fast@64x2", "speed+lane@64x2", "speed@64x2,speed@64x2"])
def test_a_bad_row_is_refused_with_the_form(bad):
    with pytest.raises(ValueError, match="MODE|twice"):
        klb.parse_rows(bad)


def test_a_bad_row_is_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        klb.main(["--rows", "speed@64"])
    assert "MODE[+lanes]" in capsys.readouterr().err


def test_the_error_table_gives_each_speed_row_against_the_first_fidelity_row():
    from vc_attention.commands.bench_peers import CUDNN, SAGE

    labels = ["fidelity@128x1b8", "speed@64x2", "speed+lanes@128x1b8"]
    times = [{"shape": "s", "ms": {CUDNN: 10.0, SAGE: 8.0, labels[0]: 8.0, labels[1]: 5.0, labels[2]: 4.0},
              "prepare_ms": {m: 0.5 for m in labels}}]
    errors = [{"tokens": 32760, "rel_l2": {SAGE: 0.02, labels[0]: 0.010, labels[1]: 0.012, labels[2]: 0.011}}]
    text = klb.tables(times, errors, labels)
    assert "5.000 (1.600x) / 0.500" in text and "4.000 (2.000x)" in text
    assert "0.01200 (0.600x SA2.2, 1.200x fidelity@128x1b8)" in text
    assert "0.01100 (0.550x SA2.2, 1.100x fidelity@128x1b8)" in text
    assert "0.01000 (0.500x SA2.2)" in text  # the fidelity row: no ratio to itself
