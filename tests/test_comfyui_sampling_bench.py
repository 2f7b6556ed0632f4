"""Real-host tier: the ComfyUI sampling benchmark's harness (commands/bench_comfyui.py) in a real
ComfyUI checkout (runs only when COMFYUI_PATH is set), at the tiny CPU size: every mode samples
ComfyUI's own WanModel and reports seconds and rel-L2; without a GPU the node's calls all run the
model's own attention, so every preset must reproduce the default latent exactly and say why."""
import os

import pytest

pytestmark = [pytest.mark.comfyui,
              pytest.mark.skipif(not os.environ.get("COMFYUI_PATH"), reason="needs a ComfyUI checkout in COMFYUI_PATH")]


def test_every_mode_samples_and_reports(monkeypatch):
    import torch

    from vc_attention.commands import bench_comfyui

    if torch.cuda.is_available():
        pytest.skip("the tiny size runs on the CPU; on a GPU the benchmark itself is the check")
    rows = bench_comfyui.comfyui_rows(os.environ["COMFYUI_PATH"], steps=2, size="tiny", log=lambda *_: None)
    modes = [r["mode"] for r in rows]
    assert modes[0] == "default" and modes[-3:] == ["fidelity", "balanced", "speed"]
    for row in rows:
        assert row["finite"] and row["seconds"] > 0 and row["tokens"] == 4 * 8 * 8
        assert row["rel_l2_vs_default"] == 0.0  # CPU: every VC call falls back, counted below
    assert all(r["fallbacks"] for r in rows if r["mode"] in bench_comfyui.MODES[2:])
