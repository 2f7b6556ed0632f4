"""Which model evaluations run VC-Attention and which regroup, for the sampler cases of issue 5."""
import pytest

pytestmark = pytest.mark.usefixtures("comfy_standin")


def flow(shift=8.0):
    from comfy.model_sampling import ModelSamplingDiscreteFlow

    return ModelSamplingDiscreteFlow(shift=shift)


def discrete():
    from comfy.model_sampling import ModelSamplingDiscrete

    return ModelSamplingDiscrete()


def schedule(ms, start=0.0, end=1.0, window=0.25):
    from vc_attention.nodes.schedule import SigmaSchedule

    return SigmaSchedule.from_model_sampling(ms, start, end, window)


@pytest.mark.parametrize("steps", [20, 50])
@pytest.mark.parametrize("make_sampling", [flow, discrete])
def test_euler_groups_exactly_the_first_quarter_of_the_steps(steps, make_sampling):
    from comfy.samplers import simple_scheduler

    ms = make_sampling()
    sigmas = simple_scheduler(ms, steps)
    phases = [schedule(ms).phase(float(s)) for s in sigmas[:-1]]
    assert [i for i, p in enumerate(phases) if p.grouping] == [i for i in range(steps) if i / steps < 0.25]
    assert all(p.active for p in phases)


@pytest.mark.parametrize("make_sampling", [flow, discrete])
def test_start_and_end_percent_select_a_half_open_range_of_steps(make_sampling):
    from comfy.samplers import simple_scheduler

    ms = make_sampling()
    sigmas = simple_scheduler(ms, 20)
    phases = [schedule(ms, start=0.2, end=0.8, window=0.5).phase(float(s)) for s in sigmas[:-1]]
    assert [i for i, p in enumerate(phases) if p.active] == list(range(4, 16))
    assert [i for i, p in enumerate(phases) if p.grouping] == list(range(4, 10))


@pytest.mark.parametrize("sampler", ["heun", "dpmpp_sde"])
def test_multi_evaluation_samplers_place_every_evaluation_by_its_own_sigma(sampler):
    from comfy.samplers import _evaluation_sigmas, simple_scheduler

    ms = flow()
    sigmas = simple_scheduler(ms, 20)
    boundary = float(sigmas[5])  # step 5 starts at 25% of the schedule
    evaluations = _evaluation_sigmas(sampler, sigmas)
    assert len(evaluations) == 2 * 20 - 1
    grouping = [s for s in evaluations if schedule(ms).phase(s).grouping]
    # every evaluation above the 25% noise level regroups, none at or below it
    assert grouping == [s for s in evaluations if s > boundary * (1 + 1e-6)]
    expected = 2 * 5 if sampler == "dpmpp_sde" else 2 * 5 - 1  # heun's 2nd eval of step 4 sits at sigma_5
    assert len(grouping) == expected


def test_window_zero_never_regroups_and_end_one_keeps_the_last_step():
    from comfy.samplers import simple_scheduler

    ms = flow()
    sigmas = simple_scheduler(ms, 10)
    phases = [schedule(ms, window=0.0).phase(float(s)) for s in sigmas[:-1]]
    assert not any(p.grouping for p in phases) and all(p.active for p in phases)


def _run(patched, sigmas, seed=1, **kwargs):
    from comfy.samplers import sample
    from toy_dit import toy_inputs

    x, context = toy_inputs(seed)
    return sample(patched, x, sigmas, context, **kwargs)


def _patched(model, unique_id, **widgets):
    from vc_attention.nodes import presets
    from vc_attention.nodes.node_attention import VCAttention

    values = {k: s["default"] for k, s in presets.WIDGETS.items() if k != "mode"} | {"backend": "reference"} | widgets
    return VCAttention.PREPARE_CLASS_CLONE({"hidden_inputs": {"UNIQUE_ID": unique_id}}).execute(model, "custom", **values).result[0]


def test_split_sampling_with_two_patched_models_and_queued_runs():
    """Wan2.2-style: a high-noise model for steps 0-1 and a low-noise model for 2-3, each patched."""
    from comfy.samplers import simple_scheduler
    from server import PromptServer
    from toy_dit import toy_model

    server = PromptServer()
    high, low = toy_model(seed=0), toy_model(seed=1)
    sigmas = simple_scheduler(high.model.model_sampling, 4)
    high_vc, low_vc = _patched(high, "high"), _patched(low, "low")
    for _ in range(2):  # the same prompt queued twice: each run starts from a clean state
        _run(high_vc, sigmas[:3])
        _run(low_vc, sigmas[2:])
    stats = [data for event, data, _ in server.messages if event == "vc_attention.stats"]
    assert [s["node_id"] for s in stats] == ["high", "low", "high", "low"]
    blocks = 2
    # high: step 0 is the first 25% and regroups (cond+uncond batched: one grouping per block)
    assert stats[0]["grouping_calls"] == blocks and stats[0]["steps"] == 2
    # low: past the window; each layer is grouped once on first sight, then reused
    assert stats[1]["grouping_calls"] == blocks and stats[1]["steps"] == 2
    counts = ("fallbacks", "grouping_calls", "steps")
    for first, again in zip(stats[:2], stats[2:]):
        assert {k: first[k] for k in counts} == {k: again[k] for k in counts}
    # the first run measures the model attention's time at calls 2 and 3 of the shape; every later run of
    # the process (the other model's included: same shape, same attention function) reuses it
    assert [(s["baseline_calls"], s["baseline_reused"]) for s in stats] == [(2, 0), (0, 1), (0, 1), (0, 1)]
    for s in stats:
        # every eligible call ran VC-Attention or the timing baseline
        assert s["backend_calls"]["reference"] + s["baseline_calls"] == 2 * blocks
        assert s["fallbacks"] == {"cross_attention": 2 * blocks}
    patch = high_vc.model_options["transformer_options"]["optimized_attention_override"].handler.__self__
    assert len(patch.cache) == 0  # freed when the run ended
