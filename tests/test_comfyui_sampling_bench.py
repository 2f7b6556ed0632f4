"""Real-host tier: the ComfyUI sampling benchmark's harness (commands/bench_comfyui.py) in a real
ComfyUI checkout (runs only when COMFYUI_PATH is set) at the tiny size: every mode samples ComfyUI's
own WanModel and reports seconds, rel-L2 against the default attention and the node's counters.
On a CPU every VC call runs the model's own attention (counted), so each preset reproduces the
default latent exactly; on a GPU the node's calls must run a CUDA kernel and stay close to it."""
import os

import pytest

pytestmark = [pytest.mark.comfyui,
              pytest.mark.skipif(not os.environ.get("COMFYUI_PATH"), reason="needs a ComfyUI checkout in COMFYUI_PATH")]


def test_every_mode_samples_and_reports():
    import torch

    from vc_attention.commands import bench_comfyui

    gpu = torch.cuda.is_available()
    rows = bench_comfyui.comfyui_rows(os.environ["COMFYUI_PATH"], steps=2, size="tiny-gpu" if gpu else "tiny",
                                      log=lambda *_: None)
    modes = [r["mode"] for r in rows]
    assert modes[0] == "default" and modes[-3:] == ["fidelity", "balanced", "speed"]
    presets = [r for r in rows if r["mode"] in ("fidelity", "balanced", "speed")]
    for row in rows:
        assert row["finite"] and row["seconds"] > 0 and row["tokens"] == 4 * 8 * 8
    # each preset row records the widget values it ran with (the report names its grouping from them)
    from vc_attention.nodes.presets import PRESETS
    assert all(row["preset"] == PRESETS[row["mode"]] for row in presets)
    assert all(row["preset"] is None for row in rows if row not in presets)
    if gpu:
        for row in presets:
            assert sum((row["backend_calls"] or {}).get(name, 0) for name in ("sm90", "mma")) > 0, row
            assert 0.0 < row["rel_l2_vs_default"] < 0.05, row
    else:
        for row in presets:
            assert row["rel_l2_vs_default"] == 0.0 and row["fallbacks"], row
