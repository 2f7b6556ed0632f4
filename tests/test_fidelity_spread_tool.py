"""bench/fidelity_spread.py's pure parts on the CPU (its timing runs in the device runs: device_run.sh spread)."""
import importlib.util
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location("fidelity_spread",
                                               Path(__file__).resolve().parents[1] / "bench" / "fidelity_spread.py")
fidelity_spread = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(fidelity_spread)


def test_every_label_leads_once_per_cycle_of_rounds():
    labels = ["a", "b", "c"]
    firsts = [fidelity_spread.rotated(labels, i)[0] for i in range(6)]
    assert firsts == ["a", "b", "c", "a", "b", "c"]
    assert all(sorted(fidelity_spread.rotated(labels, i)) == labels for i in range(4))


def test_the_summary_pairs_each_round_with_itself():
    rounds = [{"ms": {"p": 132.0, "u": 138.0, "s": 105.0}}, {"ms": {"p": 139.5, "u": 137.5, "s": 106.0}},
              {"ms": {"p": 135.0, "u": 138.0, "s": 105.5}}]
    s = fidelity_spread.summarize(rounds, "p", "u")
    assert s["per_method"]["p"] == {"min": 132.0, "median": 135.0, "max": 139.5}
    assert s["paired_over_unpaired"] == pytest.approx([132 / 138, 139.5 / 137.5, 135 / 138])


def test_the_configs_are_the_paired_and_unpaired_fidelity_loops():
    from vc_attention.kernels.config import FIDELITY, SPEED

    cfgs = list(fidelity_spread.configs().values())
    assert cfgs[0] == FIDELITY and FIDELITY.k_scale_rows == 256  # the paired loop: one K scale per 256-key step
    assert cfgs[1] == FIDELITY.with_(k_scale_rows=128) and cfgs[2] == SPEED
    assert cfgs[3] == FIDELITY.with_(k_lane_scales=True) and cfgs[4] == SPEED.with_(k_lane_scales=True)


def test_without_nvidia_smi_the_sample_is_none(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert fidelity_spread.gpu_sample() is None
