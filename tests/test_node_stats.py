"""Per-run stats: one event and one log line per run, counts that add up, sampled timing."""
import logging

import pytest
import torch

pytestmark = pytest.mark.usefixtures("comfy_standin")

KEYS = {"node_id", "backend_calls", "fallbacks", "grouping_calls", "attention_ms", "sampled_calls", "steps", "est_speedup",
        "cache_evictions", "checked_calls", "nonfinite_calls"}


def test_one_event_and_one_log_line_per_run(caplog):
    from comfy.samplers import sample, simple_scheduler
    from server import PromptServer
    from toy_dit import toy_inputs, toy_model
    from vc_attention.nodes import presets, stats
    from vc_attention.nodes.node_attention import VCAttention

    server = PromptServer()
    model = toy_model()
    widgets = {k: s["default"] for k, s in presets.WIDGETS.items() if k != "mode"} | {"backend": "reference"}
    patched = VCAttention.PREPARE_CLASS_CLONE({"hidden_inputs": {"UNIQUE_ID": "42"}}).execute(model, "balanced", **widgets).result[0]
    x, context = toy_inputs()
    steps = 3
    with caplog.at_level(logging.INFO):
        sample(patched, x, simple_scheduler(model.model.model_sampling, steps), context)
    (event, payload, _), = server.messages
    assert event == stats.EVENT_NAME and set(payload) == KEYS and payload["node_id"] == "42"
    blocks = 2
    assert payload["backend_calls"] == {"reference": steps * blocks}
    assert payload["fallbacks"] == {"cross_attention": steps * blocks}
    assert payload["steps"] == steps and payload["grouping_calls"] == blocks  # step 0 of 3 is in the window
    # the second call of the shape and then every SAMPLE_EVERY-th one are timed (the first is warm-up)
    assert payload["sampled_calls"] == 1 + (steps * blocks - 2) // stats.SAMPLE_EVERY
    assert payload["attention_ms"] > 0 and payload["est_speedup"] > 0
    lines = [r.getMessage() for r in caplog.records if "(node 42)" in r.getMessage()]
    assert len(lines) == 1 and "6 on reference" in lines[0] and "6 cross_attention" in lines[0]


def test_a_run_without_calls_publishes_nothing():
    from server import PromptServer
    from vc_attention.kernels.config import FIDELITY
    from vc_attention.nodes.patch import Settings, VCPatch

    server = PromptServer()
    VCPatch(Settings(FIDELITY, 16, 2, 0.25, 0.0, 1.0)).end_run()
    assert server.messages == []


def test_steps_are_counted_when_every_call_falls_back():
    """4 steps with no eligible call still report 4 steps (not '0 groupings over 0 steps')."""
    from comfy.samplers import sample, simple_scheduler
    from server import PromptServer
    from toy_dit import toy_inputs, toy_model
    from vc_attention.nodes import presets
    from vc_attention.nodes.node_attention import VCAttention

    server = PromptServer()
    model = toy_model()
    widgets = {k: s["default"] for k, s in presets.WIDGETS.items() if k != "mode"} | {"backend": "auto"}
    patched = VCAttention.PREPARE_CLASS_CLONE({"hidden_inputs": {"UNIQUE_ID": "9"}}).execute(model, "balanced", **widgets).result[0]
    x, context = toy_inputs()
    sample(patched, x, simple_scheduler(model.model.model_sampling, 4), context)
    (_, payload, _), = server.messages
    assert not payload["backend_calls"] and payload["fallbacks"]["no_cuda_gpu"] == 4 * 2
    assert payload["steps"] == 4 and payload["grouping_calls"] == 0


def _call(patch, q, sigma=0.9):
    from comfy.ldm.modules.attention import attention_pytorch
    from vc_attention.nodes.override import make_override

    to = {"optimized_attention_override": make_override(patch.attend, None), "sigmas": torch.tensor([sigma]),
          "cond_or_uncond": [0], "block_index": 0}
    return attention_pytorch(q, q, q, 2, skip_reshape=True, skip_output_reshape=True, transformer_options=to)


def test_nan_or_inf_inputs_are_counted_on_checked_calls_and_reported(caplog):
    """One NaN in q spreads over its 64-row scale block (SDPA: one row); the run says where it came from."""
    from toy_dit import toy_model
    from vc_attention.kernels.config import FIDELITY
    from vc_attention.nodes import stats
    from vc_attention.nodes.patch import Settings, VCPatch

    patch = VCPatch(Settings(FIDELITY, 16, 2, 0.25, 0.0, 1.0, backend="reference"), node_id="7")
    patch.start_run(toy_model())
    clean = torch.randn(1, 2, 128, 64, dtype=torch.bfloat16)
    poisoned = clean.clone()
    poisoned[0, 1, 5, 3] = float("nan")
    calls = [poisoned] + [clean] * (stats.SAMPLE_EVERY - 1) + [poisoned, poisoned]  # checked: the 1st and the 9th
    for q in calls:
        _call(patch, q)
    payload = patch.stats.payload("7")
    assert payload["checked_calls"] == 2 and payload["nonfinite_calls"] == 2
    with caplog.at_level(logging.INFO):
        patch.end_run()
    text = " ".join(r.getMessage() for r in caplog.records)
    assert "2 of 2 checked VC calls had NaN or Inf in q, k or v" in text and "before attention" in text


def test_a_clean_run_reports_no_nonfinite_inputs():
    from toy_dit import toy_model
    from vc_attention.kernels.config import FIDELITY
    from vc_attention.nodes.patch import Settings, VCPatch

    patch = VCPatch(Settings(FIDELITY, 16, 2, 0.25, 0.0, 1.0, backend="reference"), node_id="7")
    patch.start_run(toy_model())
    _call(patch, torch.randn(1, 2, 128, 64, dtype=torch.bfloat16))
    payload = patch.stats.payload("7")
    assert payload["checked_calls"] == 1 and payload["nonfinite_calls"] == 0
    assert "NaN" not in stats_line(payload)


def stats_line(payload):
    from vc_attention.nodes.stats import RunStats

    return RunStats.log_line(payload)
