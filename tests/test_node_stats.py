"""Per-run stats: one event and one log line per run, counts that add up, sampled timing."""
import logging

import pytest
import torch

pytestmark = pytest.mark.usefixtures("comfy_standin")

KEYS = {"node_id", "backend_calls", "fallbacks", "grouping_calls", "baseline_calls", "attention_ms", "sampled_calls",
        "steps", "est_speedup", "grouping_share", "slower_shapes", "kept_slower", "cache_evictions", "checked_calls",
        "nonfinite_calls", "baseline_reused", "cross_attention", "cross_slower_shapes", "refinements_dropped"}


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
    # calls 2 and 3 of the shape run the model's attention instead (the timing baseline: no extra call)
    assert payload["backend_calls"] == {"reference": steps * blocks - 2} and payload["baseline_calls"] == 2
    assert payload["fallbacks"] == {"cross_attention": steps * blocks}
    # on the CPU the cross-attention calls stay on the model's attention, each counted with why
    assert payload["cross_attention"] == {"model: q is on cpu": steps * blocks} and payload["cross_slower_shapes"] == []
    # step 0 of 3 is in the window (the baseline calls group too: the cache is the same)
    assert payload["steps"] == steps and payload["grouping_calls"] == blocks
    # the fourth call of the shape and then every SAMPLE_EVERY-th one are timed (the first is warm-up)
    assert payload["sampled_calls"] == 1 + (steps * blocks - 4) // stats.SAMPLE_EVERY
    assert payload["attention_ms"] > 0 and payload["est_speedup"] > 0
    assert 0 <= payload["grouping_share"] < 1 and payload["kept_slower"] is False  # balanced
    lines = [r.getMessage() for r in caplog.records if "(node 42)" in r.getMessage()]
    assert len(lines) == 1 and "4 on reference" in lines[0] and "6 cross_attention" in lines[0]


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
def run_toy(mode, steps, monkeypatch, grouping_ms=0.5, vc_ms=2.0, model_ms=1.0):
    """A toy sampling run on a simulated clock: the model's attention takes model_ms, a k-means
    grouping grouping_ms, a VC attention call vc_ms; the timers read that clock. VC-Attention runs a
    stand-in backend returning zeros (the reference emulation is never judged on speed): these tests
    are about the decisions, not the numbers."""
    import torch
    from comfy.samplers import sample, simple_scheduler
    from server import PromptServer
    from toy_dit import toy_inputs, toy_model
    from vc_attention.kernels import backends
    from vc_attention.nodes import override, patch, presets, stats
    from vc_attention.nodes.node_attention import VCAttention

    clock = [0.0]  # seconds, as perf_counter

    def costs(ms, fn):
        def timed(*args, **kwargs):
            clock[0] += ms / 1e3
            return fn(*args, **kwargs)
        return timed

    stand_in = backends.Backend(name="stand_in", priority=1000, constraints=backends.Constraints(device_type="any"),
                                run=costs(vc_ms, lambda q, k, v, perm, config, layout, sm_scale: torch.zeros_like(q)))
    backends.backends()  # load the built-in backends before adding ours
    monkeypatch.setitem(backends._REGISTRY, "stand_in", stand_in)
    monkeypatch.setattr(stats.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(patch, "group_tokens", costs(grouping_ms, patch.group_tokens))
    monkeypatch.setattr(override.AttentionCall, "model_attention", costs(model_ms, override.AttentionCall.model_attention))
    server = PromptServer()
    model = toy_model()
    widgets = {k: s["default"] for k, s in presets.WIDGETS.items() if k != "mode"} | {"backend": "auto"}
    patched = VCAttention.PREPARE_CLASS_CLONE({"hidden_inputs": {"UNIQUE_ID": "9"}}).execute(model, mode, **widgets).result[0]
    x, context = toy_inputs()
    sample(patched, x, simple_scheduler(model.model.model_sampling, steps), context)
    (_, payload, _), = server.messages
    return payload


@pytest.mark.parametrize("mode", ["balanced", "speed"])
def test_balanced_and_speed_switch_to_the_model_where_vc_is_slower(mode, monkeypatch, caplog):
    from vc_attention.nodes import override, stats

    steps, blocks = 10, 2
    with caplog.at_level(logging.INFO):
        payload = run_toy(mode, steps, monkeypatch)
    calls = steps * blocks
    # judged after MIN_VC_SAMPLES timed VC calls (calls 4 and 12): from call 13 on the model's attention runs
    judged_at = 4 + (stats.MIN_VC_SAMPLES - 1) * stats.SAMPLE_EVERY
    assert payload["fallbacks"][override.SLOWER] == calls - judged_at
    assert payload["backend_calls"] == {"stand_in": judged_at - 2}
    assert len(payload["slower_shapes"]) == 1 and payload["kept_slower"] is False
    # timed VC calls 4 (step 1, inside the window: groups) and 12 (step 5: reuses)
    assert abs(payload["grouping_share"] - 0.5 / (0.5 + 2 * 2.0)) < 1e-6
    line = stats.RunStats.log_line(payload)
    assert "slower than the model's attention at " + payload["slower_shapes"][0] in line
    assert "the model's attention ran there" in line and "(11.1% of the VC attention time)" in line


@pytest.mark.parametrize("mode", ["fidelity", "custom"])
def test_fidelity_and_custom_keep_vc_and_say_it_is_slower(mode, monkeypatch, caplog):
    from vc_attention.nodes import override

    steps, blocks = 10, 2
    with caplog.at_level(logging.WARNING):
        payload = run_toy(mode, steps, monkeypatch)
    assert override.SLOWER not in payload["fallbacks"]
    assert payload["backend_calls"] == {"stand_in": steps * blocks - 2}
    assert len(payload["slower_shapes"]) == 1 and payload["kept_slower"] is True
    assert sum("slower than the model's attention" in r.getMessage() for r in caplog.records) == 1


def test_a_faster_vc_keeps_running_and_grouping_counts_at_its_rate(monkeypatch):
    from vc_attention.nodes import override

    # VC attention 0.6 ms + grouping 0.9 ms: 1.5 ms on a grouping call, but grouping runs on the first
    # quarter of the steps only (balanced window), so the estimate is 0.6 + 0.25 x 0.9 < 1 ms
    payload = run_toy("balanced", 10, monkeypatch, grouping_ms=0.9, vc_ms=0.6)
    assert override.SLOWER not in payload["fallbacks"] and payload["slower_shapes"] == []
    assert payload["est_speedup"] > 1


def test_the_reference_emulation_is_never_judged_on_speed(monkeypatch):
    """The CPU demo path (the exact spec, slow by design) keeps running under balanced."""
    import time

    import torch
    from comfy.samplers import sample, simple_scheduler
    from server import PromptServer
    from toy_dit import toy_inputs, toy_model
    from vc_attention.nodes import override, patch, presets
    from vc_attention.nodes.node_attention import VCAttention

    def slow_emulation(q, k, v, **kwargs):
        time.sleep(0.002)
        return torch.zeros_like(q)

    monkeypatch.setattr(patch, "vc_attention", slow_emulation)
    monkeypatch.setattr(override.AttentionCall, "model_attention", lambda self: torch.zeros_like(self.q))  # far faster
    server = PromptServer()
    widgets = {k: s["default"] for k, s in presets.WIDGETS.items() if k != "mode"} | {"backend": "reference"}
    model = toy_model()
    patched = VCAttention.PREPARE_CLASS_CLONE({"hidden_inputs": {"UNIQUE_ID": "r"}}).execute(model, "balanced", **widgets).result[0]
    x, context = toy_inputs()
    sample(patched, x, simple_scheduler(model.model.model_sampling, 10), context)
    (_, payload, _), = server.messages
    assert payload["backend_calls"] == {"reference": 20 - 2} and override.SLOWER not in payload["fallbacks"]


def test_a_later_run_reuses_the_model_attention_baseline(monkeypatch, caplog):
    """The model attention's time at a shape is measured once per process: a queued second run runs
    VC-Attention on calls 2 and 3 too, and the remembered baseline still decides the verdict."""
    from vc_attention.nodes import override, stats

    steps, blocks = 10, 2
    first = run_toy("balanced", steps, monkeypatch)
    with caplog.at_level(logging.INFO):
        again = run_toy("balanced", steps, monkeypatch)
    assert (first["baseline_calls"], first["baseline_reused"]) == (2, 0)
    assert (again["baseline_calls"], again["baseline_reused"]) == (0, 1)
    # VC (2 ms) is slower than the model (1 ms): judged after the same timed calls as in the first run
    judged_at = 4 + (stats.MIN_VC_SAMPLES - 1) * stats.SAMPLE_EVERY
    assert again["fallbacks"][override.SLOWER] == first["fallbacks"][override.SLOWER] == steps * blocks - judged_at
    assert again["backend_calls"] == {"stand_in": judged_at} and first["backend_calls"] == {"stand_in": judged_at - 2}
    assert "the model attention's time from an earlier run at 1 shape(s)" in stats.RunStats.log_line(again)


def test_a_baseline_is_reused_only_for_the_same_shape_and_attention():
    import torch
    from vc_attention.nodes import stats

    def one_run(shape, baseline_id):
        run = stats.RunStats()
        for _ in range(4):
            run.run_call(shape, torch.device("cpu"), lambda: None, lambda perm: torch.zeros(1), lambda: torch.ones(1),
                         baseline_id)
        return run.payload("n")

    shape = (1, 2, 64, 64)
    assert one_run(shape, (shape, "a"))["baseline_calls"] == 2  # measured
    assert one_run(shape, (shape, "a"))["baseline_calls"] == 0  # remembered
    assert one_run(shape, (shape, "b"))["baseline_calls"] == 2  # another attention: measured again
    assert one_run((1, 2, 128, 64), ((1, 2, 128, 64), "a"))["baseline_calls"] == 2  # another shape
    assert one_run(shape, None)["baseline_calls"] == 2  # no id: never remembered
    stats.forget_baselines()
    assert one_run(shape, (shape, "a"))["baseline_calls"] == 2


def test_calls_run_without_a_refinement_are_reported_for_this_run_only(monkeypatch):
    # kernels/api.REFINEMENTS_DROPPED is process-wide: a run reports only its own calls, as "backend: what it ran"
    from vc_attention.kernels import api
    from vc_attention.kernels.config import FIDELITY
    from vc_attention.nodes import stats

    base = FIDELITY.without_refinements()
    monkeypatch.setattr(api, "REFINEMENTS_DROPPED", api.Counter({("mma", base.tag): 5}))
    run = stats.RunStats()
    assert run.refinements_dropped() == {}
    api.REFINEMENTS_DROPPED[("mma", base.tag)] += 3
    api.REFINEMENTS_DROPPED[("sm90", base.tag)] += 1
    payload = run.payload("7")
    assert payload["refinements_dropped"] == {f"mma: {base.tag}": 3, f"sm90: {base.tag}": 1}
    line = stats.RunStats.log_line(payload)
    assert f"3 as mma: {base.tag}" in line and "fidelity refinements" in line
    run.reset()
    assert run.payload("7")["refinements_dropped"] == {}
    assert "refinements" not in stats.RunStats.log_line(run.payload("7"))
