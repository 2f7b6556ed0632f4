"""The ComfyUI sampling bench's rounds (commands/bench_comfyui.py): every mode once per round, in order;
median seconds per mode; each round's ratio against `--use-sage-attention` kept. The worker is replaced
by a stand-in that writes what a real one writes, with seconds from a script (no ComfyUI needed)."""
import json
import subprocess
from pathlib import Path

import pytest
import torch

from vc_attention.commands import bench_comfyui, bench_report

SECONDS = {  # per round: a machine that drifts 3% slower in round 2
    "default": [12.0, 12.36], "sage": [7.6, 7.83], "fidelity": [7.3, 7.52], "balanced": [6.9, 7.11], "speed": [6.8, 7.0],
}


@pytest.fixture
def fake_worker(monkeypatch, tmp_path):
    comfy = tmp_path / "ComfyUI"
    (comfy / "comfy").mkdir(parents=True)
    calls = []

    def run(cmd, **kwargs):
        mode, out_dir = cmd[3], Path(cmd[4])
        r = sum(1 for c in calls if c == mode)
        calls.append(mode)
        latent = torch.ones(4) * (1.0 if mode == "default" else 1.01)
        torch.save(latent, str(out_dir / f"{mode}.pt"))
        stats = {"backend_calls": {"sm90": 240}, "fallbacks": {"cross_attention": 240}, "cross_attention": {"cudnn": 240}}
        (out_dir / f"{mode}.json").write_text(json.dumps({
            "mode": mode, "seconds": SECONDS[mode][r], "steps": 8, "layers": 30, "tokens": 32760, "finite": True,
            "stats": stats if mode in ("fidelity", "balanced", "speed") else None, "preset": None,
            "pyav_placeholder": False}))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(bench_comfyui.subprocess, "run", run)
    monkeypatch.setattr("vc_attention.commands.bench_peers.sageattention_module", lambda: object())
    return str(comfy), calls


def test_rounds_interleave_the_modes_and_report_medians_and_per_round_ratios(fake_worker):
    comfy, calls = fake_worker
    rows = bench_comfyui.comfyui_rows(comfy, rounds=2, log=lambda *_: None)
    assert calls == list(bench_comfyui.MODES) * 2  # round 1 all modes, then round 2: drift hits every mode alike
    speed = next(r for r in rows if r["mode"] == "speed")
    assert speed["seconds_rounds"] == [6.8, 7.0] and speed["seconds"] == pytest.approx(6.9)
    assert speed["x_sage_rounds"] == pytest.approx([7.6 / 6.8, 7.83 / 7.0])
    assert speed["x_sage"] == pytest.approx((7.6 + 7.83) / 2 / 6.9)
    assert speed["cross_attention"] == {"cudnn": 240} and speed["rel_l2_vs_default"] == pytest.approx(0.01)
    table = "\n".join(bench_report._comfyui_table(rows))
    assert "median of 2 rounds" in table and "VC-Attention node, speed 1.118, 1.119" in table


def test_one_round_keeps_the_single_run_rows(fake_worker):
    comfy, calls = fake_worker
    rows = bench_comfyui.comfyui_rows(comfy, log=lambda *_: None)
    assert calls == list(bench_comfyui.MODES)
    assert all("seconds_rounds" not in r and "x_sage_rounds" not in r for r in rows)
    assert "rounds" not in "\n".join(bench_report._comfyui_table(rows))
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        bench_comfyui.comfyui_rows(comfy, rounds=0)
