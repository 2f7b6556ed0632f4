"""The diffusers backend on the CPU: registration, fallbacks, the step schedule, Ulysses over gloo.

Kernel calls run on the `reference` backend (named explicitly: under "auto" a CPU call goes to
diffusers' native attention). The two-process tests launch commands/cp_worker.py with torchrun
(gloo); diffusers' context parallelism runs unchanged on the CPU except for one line the worker
works around (its device placement divides the rank by the accelerator count, 0 on a CPU torch).
"""
import dataclasses
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("diffusers")

from diffusers.models import attention_dispatch as dispatch  # noqa: E402

from vc_attention.integrations import diffusers_backend as db  # noqa: E402
from vc_attention.integrations.backend_stats import BackendStats  # noqa: E402
from vc_attention.integrations.denoising_steps import DenoisingSteps  # noqa: E402
from vc_attention.integrations.diffusers_config import VCDiffusersConfig  # noqa: E402
from vc_attention.kernels import backends  # noqa: E402
from vc_attention.kernels.api import BACKEND_CALLS  # noqa: E402
from vc_attention.nodes.cache import LayerKey  # noqa: E402
from vc_attention.nodes.presets import PRESETS, within_bins  # noqa: E402

GATE = 1e-3


def _sdpa(q, k, v, **kwargs):
    return torch.nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), **kwargs
                                                            ).transpose(1, 2)


def _qkv(n=256, heads=2, d=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, n, heads, d, generator=g) for _ in range(3))


@pytest.fixture
def reference_backend():
    return db.register_diffusers_backend(VCDiffusersConfig(backend="reference", clusters=8))


def test_registration_is_idempotent():
    first = db.register_diffusers_backend()
    members = len(dispatch.AttentionBackendName.__members__)
    second = db.register_diffusers_backend(VCDiffusersConfig(mode="speed"))
    assert len(dispatch.AttentionBackendName.__members__) == members
    assert dispatch.AttentionBackendName("vc_attention") is dispatch.AttentionBackendName.VC_ATTENTION
    # the latest registration serves the calls
    registered = dispatch._AttentionBackendRegistry._backends[dispatch.AttentionBackendName.VC_ATTENTION]
    assert registered == second.attention and registered != first.attention
    assert second.kernel_config.p == "expcast"


def test_a_self_attention_call_reaches_the_kernel(reference_backend):
    q, k, v = _qkv()
    before = BACKEND_CALLS["reference"]
    out = dispatch.dispatch_attention_fn(q, k, v, backend="vc_attention")
    assert BACKEND_CALLS["reference"] == before + 1
    assert reference_backend.stats.kernel_calls == {"reference": 1} and not reference_backend.stats.fallbacks
    exact = _sdpa(q, k, v)
    err = ((out - exact).norm() / exact.norm()).item()
    assert 0 < err < 0.05  # 8-bit quantization error, not SDPA's result


@pytest.mark.slow
def test_model_set_attention_backend_accepts_the_new_name(reference_backend):
    from vc_attention.commands.cp_worker import TINY_WAN
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    model = WanTransformer3DModel(**TINY_WAN).eval()
    model.set_attention_backend("vc_attention")
    latents, text = torch.randn(1, 4, 2, 16, 16), torch.randn(1, 8, 32)
    with torch.no_grad():
        model(hidden_states=latents, timestep=torch.tensor([500]), encoder_hidden_states=text)
    stats = reference_backend.stats
    assert stats.kernel_calls == {"reference": 2}  # the two self-attention layers
    assert stats.fallbacks == {"cross-attention (q, k, v shapes differ)": 2}


@pytest.mark.parametrize("kwargs, reason", [
    (dict(attn_mask=torch.zeros(1, 1, 256, 256)), "an attention mask"),
    (dict(is_causal=True), "causal attention"),
    (dict(dropout_p=0.1), "dropout"),
])
def test_calls_the_kernels_cannot_take_go_to_native_attention_counted(reference_backend, kwargs, reason):
    q, k, v = _qkv()
    torch.manual_seed(0)
    out = dispatch.dispatch_attention_fn(q, k, v, backend="vc_attention", **kwargs)
    if "dropout_p" not in kwargs:
        assert torch.allclose(out, _sdpa(q, k, v, **kwargs), atol=1e-6)
    assert reference_backend.stats.fallbacks == {reason: 1}
    assert not reference_backend.stats.kernel_calls


def test_cross_attention_and_gradients_fall_back(reference_backend):
    q, _, _ = _qkv()
    k, v = _qkv(n=32)[:2]
    dispatch.dispatch_attention_fn(q, k, v, backend="vc_attention")
    q, k, v = (t.requires_grad_() for t in _qkv())
    out = dispatch.dispatch_attention_fn(q, k, v, backend="vc_attention")
    out.sum().backward()  # native attention: gradients flow
    assert q.grad is not None
    assert set(reference_backend.stats.fallbacks) == {"cross-attention (q, k, v shapes differ)",
                                                      "gradients are needed (the kernels are inference-only)"}


def test_auto_on_cpu_falls_back_with_the_kernels_reasons():
    vc = db.register_diffusers_backend()
    q, k, v = _qkv()
    out = dispatch.dispatch_attention_fn(q, k, v, backend="vc_attention")
    assert torch.allclose(out, _sdpa(q, k, v), atol=1e-6)
    (reason,) = vc.stats.fallbacks
    assert reason.startswith("no VC-Attention backend can run this call") and "reference" in reason
    assert "1 to diffusers' native attention" in str(vc.stats)


def test_a_named_kernel_that_cannot_run_stops_with_the_reason():
    db.register_diffusers_backend(VCDiffusersConfig(backend="sm90"))
    with pytest.raises(backends.NoCapableBackend, match="backend 'sm90' cannot run this call"):
        dispatch.dispatch_attention_fn(*_qkv(), backend="vc_attention")


def test_ring_attention_is_refused_with_the_reason(reference_backend):
    config = SimpleNamespace(context_parallel_config=SimpleNamespace(ring_degree=2, ulysses_degree=1))
    with pytest.raises(ValueError, match="ring attention gives each GPU a slice of the tokens"):
        reference_backend.attention(*_qkv(), _parallel_config=config)


def test_an_unsupported_diffusers_fails_in_one_sentence_naming_the_range(monkeypatch):
    # a registry whose register() keeps nothing: the self-test's dispatch never reaches our function
    monkeypatch.setattr(dispatch._AttentionBackendRegistry, "register",
                        classmethod(lambda cls, backend, constraints=None, supports_context_parallel=False:
                                    (lambda f: f)))
    monkeypatch.setitem(dispatch._AttentionBackendRegistry._backends, dispatch.AttentionBackendName.VC_ATTENTION,
                        dispatch._AttentionBackendRegistry._backends[dispatch.AttentionBackendName.NATIVE])
    with pytest.raises(db.UnsupportedDiffusersVersion) as err:
        db.register_diffusers_backend()
    message = str(err.value)
    assert "supported: diffusers>=0.42,<0.43" in message and message.count(". ") == 0


def test_a_missing_private_api_is_reported_as_unsupported(monkeypatch):
    monkeypatch.delattr(dispatch, "_templated_context_parallel_attention")
    with pytest.raises(db.UnsupportedDiffusersVersion, match=r"supported: diffusers>=0\.42,<0\.43; AttributeError"):
        db.register_diffusers_backend()


def test_the_enum_extension_is_idempotent_on_a_fresh_enum():
    from enum import Enum

    class Names(str, Enum):
        A = "a"

    member = db.extend_backend_enum(Names, "B", "b")
    assert db.extend_backend_enum(Names, "B", "b") is member
    assert Names("b") is member and Names.B is member and list(Names) == [Names.A, member]
    assert member.value == "b" and member == "b" and member.name == "B"


def test_config_presets_and_validation():
    # Each mode takes its grouping from the node's preset table (one source for both hosts) ...
    for mode in ("fidelity", "balanced", "speed"):
        config = VCDiffusersConfig(mode=mode)
        assert (config.num_clusters, config.iters) == (PRESETS[mode]["clusters"], PRESETS[mode]["kmeans_iters"])
        assert config.window == PRESETS[mode]["grouping_window"]
    # ... fidelity groups finer than speed, and an explicit value overrides the preset.
    assert VCDiffusersConfig(mode="fidelity").num_clusters > VCDiffusersConfig(mode="speed").num_clusters
    assert VCDiffusersConfig(mode="fidelity", clusters=16, kmeans_iters=3).num_clusters == 16
    assert VCDiffusersConfig(mode="fidelity", clusters=16, kmeans_iters=3).iters == 3
    assert VCDiffusersConfig(mode="speed").kernel_config.p == "expcast"
    assert VCDiffusersConfig(grouping_window=0.5).window == 0.5
    with pytest.raises(ValueError, match="mode must be one of"):
        VCDiffusersConfig(mode="custom")
    with pytest.raises(ValueError, match="grouping_window"):
        VCDiffusersConfig(grouping_window=1.5)
    # the within-cluster bins: the preset's (nodes/presets.WITHIN_BINS, as the node), or an explicit value
    for mode in ("fidelity", "balanced", "speed"):
        assert VCDiffusersConfig(mode=mode).bins == within_bins(mode)
    assert VCDiffusersConfig(mode="speed", within_bins=8).bins == 8
    with pytest.raises(ValueError, match="within-cluster bins"):
        VCDiffusersConfig(within_bins=64)


# ---------------------------------------------------------------------- the step schedule

def _steps(window, monkeypatch, within_bins=0):
    calls = []

    def fake_group(v, clusters, iters, warm_start=None, within_bins=0):
        calls.append(warm_start)
        from vc_attention.kernels.grouping import group_tokens

        return group_tokens(v, clusters, iters, warm_start=warm_start, within_bins=within_bins)

    monkeypatch.setattr("vc_attention.integrations.denoising_steps.group_tokens", fake_group)
    stats = BackendStats()
    return DenoisingSteps(window, clusters=4, iters=1, stats=stats, within_bins=within_bins), stats, calls


def test_grouping_is_recomputed_inside_the_window_and_reused_after(monkeypatch):
    steps, stats, calls = _steps(0.5, monkeypatch)
    v = torch.randn(1, 2, 64, 16)
    for step in range(4):  # 2 layers per step; window 0.5 of 4 steps = steps 0 and 1
        steps.permutation(v)
        steps.permutation(v)
        steps.end_step(step, 4)
    # step 0: no callback yet, grouped uncached; step 1: grouped and cached; steps 2, 3: reused
    assert stats.groupings == 4 and stats.reused_groupings == 4
    assert calls == [None] * 4
    assert len(steps.cache) == 0  # the last step's callback ended the run


def test_warm_start_inside_the_window(monkeypatch):
    steps, stats, calls = _steps(1.0, monkeypatch)
    v = torch.randn(1, 2, 64, 16)
    for step in range(3):
        steps.permutation(v)
        steps.end_step(step, 3)
    assert calls[:2] == [None, None] and calls[2] is not None  # step 2 starts from step 1's centroids
    assert stats.groupings == 3 and stats.reused_groupings == 0


def test_centroids_are_dropped_when_the_window_closes(monkeypatch):
    steps, _, _ = _steps(0.5, monkeypatch)
    v = torch.randn(1, 2, 64, 16)
    steps.end_step(0, 4)
    steps.permutation(v)
    key = LayerKey(block=("call", 1), nth=0, branches=(), tokens=64, batch=1)
    assert steps.cache.get(key).centroids is not None
    steps.end_step(1, 4)
    assert steps.cache.get(key).centroids is None


def test_within_cluster_bins_are_rebinned_from_each_reused_calls_v(monkeypatch):
    from vc_attention.kernels import grouping_within

    steps, stats, _ = _steps(0.5, monkeypatch, within_bins=4)
    v = torch.randn(1, 2, 64, 16)
    steps.end_step(0, 4)
    steps.permutation(v)  # step 1: grouped, cached
    steps.end_step(1, 4)  # the window closes: the centroids stay, the reuse steps need them
    key = LayerKey(block=("call", 1), nth=0, branches=(), tokens=64, batch=1)
    cached = steps.cache.get(key)
    assert cached.within_bins == 4 and cached.centroids is not None
    later = v + torch.randn_like(v)
    perm = steps.permutation(later)
    assert stats.reused_groupings == 1
    assert torch.equal(perm, grouping_within.within_perm(later, cached.labels, cached.counts, cached.warm_centroids(), 4))


def test_a_new_shape_at_the_same_position_replaces_the_entry(monkeypatch):
    steps, stats, _ = _steps(0.0, monkeypatch)
    steps.end_step(0, 10)
    steps.permutation(torch.randn(1, 2, 64, 16))
    steps.end_step(1, 10)
    steps.permutation(torch.randn(1, 2, 96, 16))  # new resolution: regrouped, the old entry dropped
    steps.end_step(2, 10)
    steps.permutation(torch.randn(1, 4, 96, 16))  # other head count at the same position: regrouped
    assert len(steps.cache) == 1 and stats.groupings == 3 and stats.reused_groupings == 0


def test_a_run_without_callbacks_is_detected_and_not_cached(monkeypatch, caplog):
    steps, stats, _ = _steps(0.0, monkeypatch)
    v = torch.randn(1, 2, 64, 16)
    steps.permutation(v)
    steps.end_step(0, 10)  # one call per step from now on
    steps.permutation(v)  # step 1: cached
    assert len(steps.cache) == 1
    steps.permutation(v)  # a second call in the same step: the callback did not come
    assert "no step callback arrived" in caplog.text
    assert len(steps.cache) == 0 and not steps.tracking
    for _ in range(5):
        steps.permutation(v)
    assert len(steps.cache) == 0 and stats.groupings == 8


def test_step_callback_reads_the_pipelines_step_count(reference_backend):
    pipe = SimpleNamespace(num_timesteps=8)
    kwargs = {"latents": torch.zeros(1)}
    assert reference_backend.step_callback(pipe, 0, 999, kwargs) is kwargs
    assert reference_backend.steps.step == 1 and reference_backend.steps.num_steps == 8
    scheduled = SimpleNamespace(scheduler=SimpleNamespace(timesteps=torch.arange(5)))
    reference_backend.step_callback(scheduled, 1, 900, kwargs)
    assert reference_backend.steps.num_steps == 5
    with pytest.raises(ValueError, match="call vc.end_step"):
        reference_backend.step_callback(SimpleNamespace(), 2, 800, kwargs)
    with pytest.raises(ValueError, match="step must be in"):
        reference_backend.end_step(5, 5)


@pytest.mark.slow
def test_a_denoising_loop_through_the_transformer_reuses_groupings():
    from diffusers import WanTransformer3DModel

    from vc_attention.commands.cp_worker import TINY_WAN

    vc = db.register_diffusers_backend(VCDiffusersConfig(backend="reference", clusters=8, grouping_window=0.5))
    torch.manual_seed(0)
    model = WanTransformer3DModel(**TINY_WAN).eval()
    model.set_attention_backend("vc_attention")
    latents, text = torch.randn(1, 4, 2, 16, 16), torch.randn(1, 8, 32)
    pipe = SimpleNamespace(num_timesteps=4)
    with torch.no_grad():
        for step in range(4):
            for _ in ("cond", "uncond"):
                model(hidden_states=latents, timestep=torch.tensor([999 - 250 * step]), encoder_hidden_states=text)
            vc.step_callback(pipe, step, None, {})
    # 4 self-attention calls per step; steps 0-1 group (step 0 uncached), steps 2-3 reuse step 1's
    assert vc.stats.groupings == 8 and vc.stats.reused_groupings == 8
    assert vc.stats.kernel_calls == {"reference": 16}


# ---------------------------------------------------------------------- Ulysses over gloo, 2 processes

def _torchrun(*args):
    from vc_attention.commands.bench_multigpu import run_cp_worker

    return run_cp_worker(2, ["--kernel", "reference", "--clusters", "8", *args], timeout=900)


@pytest.mark.slow
def test_ulysses_on_two_processes_equals_one_process_and_ring_is_refused():
    from vc_attention.commands.bench_multigpu import rows_from_result

    results = _torchrun("--ring-check")
    for rank in results:
        runs = {(r["method"], r["gpus"]): r for r in rank["runs"]}
        assert runs[("vc", 2)]["rel_l2_vs_own_1gpu"] <= GATE
        assert runs[("native", 2)]["rel_l2_vs_own_1gpu"] <= GATE
        # our kernel really ran, inside diffusers' Ulysses exchange (2 layers x 4 forwards on 2 ranks)
        assert 0 < runs[("vc", 1)]["rel_l2_vs_native_1gpu"] < 0.05
        assert rank["ulysses_calls"] == 8 and rank["kernel_calls"] == {"reference": 16}
        assert "cannot run under ring attention (ring_degree=2)" in rank["ring_error"]
    rows = rows_from_result(results[0], "balanced", layers=2)
    assert [(r["method"], r["gpus"]) for r in rows] == [("native", 1), ("vc-balanced", 1), ("native", 2),
                                                        ("vc-balanced", 2)]
    one, two = rows[1], rows[3]
    assert two["x_1gpu"] == pytest.approx(one["forward_ms"] / two["forward_ms"])
    assert two["x_native_2gpu"] == pytest.approx(rows[2]["forward_ms"] / two["forward_ms"])
    assert rows[2]["x_native_2gpu"] == 1.0 and two["kernels"] == ["reference"]


# ---------------------------------------------------------------------- the README's three lines

class _StandInPipeline:
    """What the README's lines need from a diffusers video pipeline: a transformer, a denoising loop
    with CFG that calls `callback_on_step_end(pipe, i, t, kwargs)` after each step, num_timesteps."""

    def __init__(self, steps: int = 4):
        from diffusers import WanTransformer3DModel

        from vc_attention.commands.cp_worker import TINY_WAN

        torch.manual_seed(0)
        self.transformer = WanTransformer3DModel(**TINY_WAN).eval()
        self.num_timesteps = steps

    def __call__(self, prompt, callback_on_step_end=None):
        latents, text = torch.randn(1, 4, 2, 16, 16), torch.randn(1, 8, 32)
        with torch.no_grad():
            for i, t in enumerate(torch.linspace(999, 0, self.num_timesteps)):
                for _ in ("cond", "uncond"):
                    noise = self.transformer(hidden_states=latents, timestep=t[None], encoder_hidden_states=text,
                                             return_dict=False)[0]
                latents = latents - noise / self.num_timesteps
                callback_on_step_end(self, i, t, {"latents": latents})
        return SimpleNamespace(frames=[latents])


@pytest.mark.slow
def test_the_readme_lines_run_a_pipeline_with_grouping_reuse(monkeypatch, capsys):
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    blocks = [b.split("```")[0] for b in readme.split("```python\n")[1:]
              if b.startswith("# run by tests/test_diffusers_backend.py")]
    assert len(blocks) == 1
    # the README names no kernel backend; on a CPU "auto" hands every call to native attention, so the
    # exact emulation stands in for the kernels here
    register = db.register_diffusers_backend
    monkeypatch.setattr(db, "register_diffusers_backend",
                        lambda config: register(dataclasses.replace(config, backend="reference", clusters=8)))
    namespace = {"pipe": _StandInPipeline(steps=8), "prompt": "a red fox in the snow"}
    exec(compile(blocks[0], "README.md", "exec"), namespace)
    stats = namespace["vc"].stats
    # 4 self-attention calls per step; window 0.25 of 8 steps = steps 0-1 group (0 uncached), 2-7 reuse
    assert stats.kernel_calls == {"reference": 32}
    assert stats.groupings == 8 and stats.reused_groupings == 24
    assert namespace["video"].shape == (1, 4, 2, 16, 16)
    assert "32 on reference" in capsys.readouterr().out
