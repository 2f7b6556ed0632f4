"""Real-host tier: the pack inside a real ComfyUI checkout (runs only when COMFYUI_PATH is set).

The check (tests/comfyui_host_check.py) runs in a subprocess with the interpreter in COMFYUI_PYTHON
(default: this one; e.g. the virtual environment ComfyUI's requirements are installed in), because
ComfyUI parses its command line and initialises its device at import time. There it:
- loads this checkout through ComfyUI's own `nodes.load_custom_node`, as the server does at start;
- builds a tiny random-weight Wan2.1 T2V or HunyuanVideo model from ComfyUI's own classes
  (supported_models -> model_base -> comfy.ldm.*) in a real ModelPatcher;
- samples it with comfy.sample.sample (euler, simple, CFG) with and without the VC-Attention node
  (backend "reference", the CPU path), counting every call of the attention override and
  recording the stats event through a stand-in for the running server's PromptServer.instance.
"""
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

FROZEN_IDS = ("VCAttention", "VCAttentionFidelityCheck", "VCAttentionCapture")
WAN_BLOCKS, STEPS = 2, 4  # as in comfyui_host_check.py


def _host_check(tmp_path, kind):
    out = tmp_path / "result.json"
    python = os.environ.get("COMFYUI_PYTHON", sys.executable)
    script = Path(__file__).resolve().parent / "comfyui_host_check.py"
    proc = subprocess.run([python, str(script), os.environ["COMFYUI_PATH"], str(out), kind], capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    result = json.loads(out.read_text())
    if result["pyav_placeholder"]:
        warnings.warn("real ComfyUI imported with the PyAV placeholders (VC_PYAV_PLACEHOLDER=1, tests/comfyui_pyav.py)")
    assert result["loaded"] and result["node_ids"] == list(FROZEN_IDS)
    assert result["display_names"] == ["VC-Attention", "VC-Attention Fidelity Check", "VC-Attention Capture"]
    assert result["mode_default"] == "balanced" and "reference" in result["backend_options"]
    assert result["original_untouched"] and result["plain_override_calls"] == 0
    assert result["forwards"] >= STEPS  # cond and uncond in one forward per step, or one each
    assert result["stats"]["steps"] == STEPS
    assert result["rel_l2"] < 0.1, result["rel_l2"]
    return result


@pytest.mark.comfyui
@pytest.mark.skipif(not os.environ.get("COMFYUI_PATH"), reason="set COMFYUI_PATH to a ComfyUI checkout")
def test_a_tiny_wan_model_runs_self_attention_on_vc_in_real_comfyui(tmp_path):
    result = _host_check(tmp_path, "wan")
    forwards, stats = result["forwards"], result["stats"]
    # (B, N, H*D) layout; a self-attention and a cross-attention per block, VC takes the self-attention
    assert result["skip_reshape"] == [False] and result["query_tokens"] == [168]
    assert result["override_calls"] == 2 * WAN_BLOCKS * forwards
    # calls 2 and 3 of the shape ran the model's attention as the stats' timing baseline
    assert stats["backend_calls"] == {"reference": WAN_BLOCKS * forwards - 2} and stats["baseline_calls"] == 2
    assert stats["fallbacks"] == {"cross_attention": WAN_BLOCKS * forwards}
    assert stats["grouping_calls"] >= WAN_BLOCKS
    # split sampling (two patched models, steps 0-1 and 2-3) and heun, with ComfyUI's own schedulers:
    # only step 0 (the first 25%) regroups; the low-noise model groups each layer once on first sight;
    # heun's second evaluation of step 0 sits exactly on the 25% boundary and reuses
    # These runs follow the first one in the same process: the model attention's baseline at this shape
    # is remembered (nodes/stats.py), so none of them spends calls on it
    events = result["schedule_events"]
    per_step = {"reference": WAN_BLOCKS * forwards // STEPS}
    assert events["high"] == {"backend_calls": {"reference": 2 * per_step["reference"]}, "baseline_calls": 0,
                              "grouping_calls": WAN_BLOCKS, "steps": 2}
    assert events["low"] == {"backend_calls": {"reference": 2 * per_step["reference"]}, "baseline_calls": 0,
                             "grouping_calls": WAN_BLOCKS, "steps": 2}
    assert events["heun"] == {"backend_calls": {"reference": (2 * STEPS - 1) * per_step["reference"]},
                              "baseline_calls": 0, "grouping_calls": WAN_BLOCKS, "steps": STEPS}
    # Capture: both branches of block 0 at steps 0 and 3, in the documented format; outputs unchanged
    assert result["capture_unchanged"] and result["capture_files"] == 1
    assert result["capture_metadata"] == {"format": "vc_attention_capture", "version": "1"}
    assert result["capture_keys"] == sorted(f"block0_step{s}_{b}.{p}" for s in (0, 3) for b in ("cond", "uncond") for p in "qkv")
    assert result["capture_q_shape"] == [1, 2, 168, 64]
    # Fidelity Check through the real node API: two FLOATs and the report, the mean line on the node
    assert result["fidelity_outputs"] == ["float", "float", "str"]
    assert result["fidelity_ui"].startswith("mean") and "(3 frames)" in result["fidelity_ui"]


@pytest.mark.comfyui
@pytest.mark.skipif(not os.environ.get("COMFYUI_PATH"), reason="set COMFYUI_PATH to a ComfyUI checkout")
def test_a_tiny_hunyuan_video_model_runs_joint_attention_on_vc_in_real_comfyui(tmp_path):
    result = _host_check(tmp_path, "hunyuan")
    forwards, stats = result["forwards"], result["stats"]
    # (B, H, N, D) layout; per forward: 2 token-refiner calls (16 text tokens, no block index), then
    # joint text + video attention in the double and the single block (16 + 168 tokens)
    assert result["skip_reshape"] == [True] and result["query_tokens"] == [16, 16 + 168]
    assert result["override_calls"] == 4 * forwards
    # two shapes (refiner, joint): calls 2 and 3 of each ran the model's attention (the timing baseline)
    assert stats["backend_calls"] == {"reference": 4 * forwards - 4} and stats["baseline_calls"] == 4
    assert stats["fallbacks"] == {}
