"""The override through ComfyUI's dispatch (stand-in wrap_attn): what goes to VC, what to `func`, layouts."""
import pytest
import torch

pytestmark = pytest.mark.usefixtures("comfy_standin")

B, H, N, D = 2, 2, 200, 64
# 8-bit attention on Gaussian random q/k/v (near-uniform attention): about 4% relative L2 from SDPA
TOLERANCE = 0.06


def make_patch(**changes):
    from toy_dit import toy_model
    from vc_attention.kernels.config import FIDELITY
    from vc_attention.nodes.patch import Settings, VCPatch

    settings = Settings(config=FIDELITY, clusters=16, kmeans_iters=2, grouping_window=0.25,
                        start_percent=0.0, end_percent=1.0, backend="reference")
    patch = VCPatch(Settings(**(settings.__dict__ | changes)), node_id="1")
    patch.start_run(toy_model())
    return patch


def options(patch, previous=None, sigma=0.9, **extra):
    from vc_attention.nodes.override import make_override

    override = make_override(patch.attend, previous)
    return {"optimized_attention_override": override, "sigmas": torch.tensor([sigma]),
            "cond_or_uncond": [0, 1], "block_type": "double", "block_index": 0} | extra


def qkv(shape, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g).to(dtype) for _ in range(3)]


def rel_l2(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("skip_reshape, skip_output_reshape", [(False, False), (True, True), (False, True), (True, False)])
def test_self_attention_runs_vc_in_both_layouts_and_matches_the_kernel_api(skip_reshape, skip_output_reshape):
    from comfy.ldm.modules.attention import attention_pytorch
    from vc_attention.kernels.api import vc_attention
    from vc_attention.kernels.config import FIDELITY

    patch = make_patch()
    q, k, v = qkv((B, H, N, D))
    args = (q, k, v) if skip_reshape else tuple(t.transpose(1, 2).reshape(B, N, H * D) for t in (q, k, v))
    out = attention_pytorch(*args, heads=H, skip_reshape=skip_reshape, skip_output_reshape=skip_output_reshape,
                            transformer_options=options(patch))
    sdpa = attention_pytorch(*args, heads=H, skip_reshape=skip_reshape, skip_output_reshape=skip_output_reshape)
    assert out.shape == sdpa.shape and out.dtype == sdpa.dtype
    assert patch.stats.backend_calls == {"reference": 1} and not patch.stats.fallbacks
    # same grouping -> bit-identical to the public op in (B,H,N,D); close to exact attention
    (grouping,) = patch.cache._entries.values()
    expected = vc_attention(q, k, v, layout="bhnd", config=FIDELITY, perm=grouping.perm(), backend="reference")
    out_bhnd = out if skip_output_reshape else out.view(B, N, H, D).transpose(1, 2)
    assert torch.equal(out_bhnd, expected)
    assert rel_l2(out, sdpa) < TOLERANCE


def test_the_scale_kwarg_is_honoured():
    from comfy.ldm.modules.attention import attention_pytorch

    patch = make_patch()
    q, k, v = qkv((B, H, N, D))
    out = attention_pytorch(q, k, v, H, skip_reshape=True, skip_output_reshape=True, scale=0.05,
                            transformer_options=options(patch))
    sdpa = attention_pytorch(q, k, v, H, skip_reshape=True, skip_output_reshape=True, scale=0.05)
    default = attention_pytorch(q, k, v, H, skip_reshape=True, skip_output_reshape=True)
    assert rel_l2(out, sdpa) < TOLERANCE < rel_l2(default, sdpa)


def _fallback_cases():
    q, k, v = qkv((B, N, H * D))
    _, short_k, short_v = qkv((B, 16, H * D), seed=1)
    gq, gk, gv = qkv((B, 4, N, D)), qkv((B, 2, N, D), seed=2), qkv((B, 2, N, D), seed=3)
    mask = torch.zeros(B, 1, N, N, dtype=torch.bfloat16)
    return {
        "mask": (dict(q=q, k=k, v=v, mask=mask), {}),
        "cross_attention": (dict(q=q, k=short_k, v=short_v), {}),
        "low_precision_attention_off": (dict(q=q, k=k, v=v, low_precision_attention=False), {}),
        "gqa_or_mqa": (dict(q=gq[0], k=gk[0], v=gv[0], skip_reshape=True, enable_gqa=True), {}),
        "dtype": (dict(q=q.float(), k=k.float(), v=v.float()), {}),
        "shape": (dict(q=torch.stack([gq[0], gq[0]], dim=-1)[..., 0], k=gq[1], v=gq[2], skip_reshape=True), {}),
        "outside_start_end": (dict(q=q, k=k, v=v), {"sigmas": torch.tensor([0.9])}),
        "no_sigma": (dict(q=q, k=k, v=v), {"sigmas": None}),
    }


@pytest.mark.parametrize("reason", list(_fallback_cases()))
def test_every_other_call_goes_to_func_unchanged_with_its_reason(reason):
    from comfy.ldm.modules.attention import attention_pytorch

    patch = make_patch(start_percent=0.5) if reason == "outside_start_end" else make_patch()
    call, extra = _fallback_cases()[reason]
    q, k, v = call.pop("q"), call.pop("k"), call.pop("v")
    to = {key: val for key, val in (options(patch) | extra).items() if val is not None}
    heads = 4 if reason in ("gqa_or_mqa", "shape") else H
    out = attention_pytorch(q, k, v, heads=heads, transformer_options=to, **call)
    expected = attention_pytorch(q, k, v, heads=heads, **call)
    assert torch.equal(out, expected)
    assert patch.stats.fallbacks == {reason: 1} and not patch.stats.backend_calls


def test_no_capable_backend_falls_back_under_auto_and_stops_a_named_backend(monkeypatch):
    from comfy.ldm.modules.attention import attention_pytorch
    from vc_attention.kernels import backends

    def refuse(*args, **kwargs):
        raise backends.NoCapableBackend("no VC-Attention backend can run this call (test).")

    monkeypatch.setattr(backends, "select", refuse)
    q, k, v = qkv((B, N, H * D))
    patch = make_patch(backend="auto")
    out = attention_pytorch(q, k, v, heads=H, transformer_options=options(patch))
    assert torch.equal(out, attention_pytorch(q, k, v, heads=H))
    assert patch.stats.fallbacks == {"no_cuda_gpu": 1}  # CPU tensors: no_capable_backend on a GPU
    with pytest.raises(backends.NoCapableBackend):
        attention_pytorch(q, k, v, heads=H, transformer_options=options(make_patch(backend="reference")))


def test_previous_override_is_chained_for_fallbacks_only():
    from comfy.ldm.modules.attention import attention_pytorch

    seen = []

    def previous(func, *args, **kwargs):
        seen.append(args[1].shape[1])
        return func(*args, **kwargs)

    patch = make_patch()
    q, k, v = qkv((B, N, H * D))
    _, ck, cv = qkv((B, 16, H * D), seed=4)
    attention_pytorch(q, k, v, heads=H, transformer_options=options(patch, previous))
    attention_pytorch(q, ck, cv, heads=H, transformer_options=options(patch, previous))
    assert seen == [16]  # only the cross-attention call reached the previous override (not the timing baseline)
    assert patch.stats.backend_calls == {"reference": 1}


def test_tensor_containers_and_unknown_kwargs_are_handled():
    from comfy.ldm.modules.attention import AttentionTensorContainer, attention_pytorch

    patch = make_patch()
    q, k, v = qkv((B, N, H * D))
    boxed = [AttentionTensorContainer(t) for t in (q, k, v)]
    out = attention_pytorch(*boxed, heads=H, transformer_options=options(patch), some_future_option=3)
    assert out.shape == q.shape and patch.stats.backend_calls == {"reference": 1}


def test_joint_attention_groups_text_and_video_tokens_together():
    """HunyuanVideo-style joint attention: text tokens then video tokens, one permutation over all."""
    from comfy.samplers import cfg_denoise
    from toy_dit import TEXT, toy_inputs, toy_model

    model = toy_model(layout="heads", text_tokens=TEXT)
    patch = make_patch()
    model.model_options["transformer_options"] = options(patch)
    x, context = toy_inputs()
    cfg_denoise(model, x, torch.tensor(0.9), context, 5.0, None)
    labels = [g.labels for g in patch.cache._entries.values()]
    assert len(labels) == 2 and all(tuple(l.shape) == (2, 2, TEXT + x.shape[1]) for l in labels)
    # the second call of the shape is the stats' timing baseline (the model's attention), grouped all the same
    assert patch.stats.backend_calls == {"reference": 1} and patch.stats.baseline_calls == 1


def test_the_override_runs_eagerly_inside_a_torch_compiled_model():
    from comfy.ldm.modules.attention import attention_pytorch

    patch = make_patch()
    q, k, v = qkv((B, N, H * D))
    to = options(patch)

    @torch.compile(backend="eager", fullgraph=False)
    def block(q, k, v):
        return attention_pytorch(q * 1.0, k, v, heads=H, transformer_options=to) + 0.0

    out = block(q, k, v)
    assert out.shape == q.shape and patch.stats.backend_calls == {"reference": 1}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_auto_on_cpu_runs_the_models_attention_and_says_there_is_no_cuda_gpu(dtype, caplog):
    """Never the emulation under auto (0.05x on a CPU); the reason is the machine's, not the dtype."""
    import logging

    from comfy.ldm.modules.attention import attention_pytorch
    from vc_attention.nodes import patch as patch_module

    def emulation_must_not_run(*args, **kwargs):
        raise AssertionError("auto ran the reference emulation")

    patch = make_patch(backend="auto")
    q, k, v = qkv((B, N, H * D), dtype=dtype)
    with caplog.at_level(logging.INFO), pytest.MonkeyPatch.context() as mp:
        mp.setattr(patch_module, "vc_attention", emulation_must_not_run)
        out = attention_pytorch(q, k, v, heads=H, transformer_options=options(patch))
    assert torch.equal(out, attention_pytorch(q, k, v, heads=H))
    assert patch.stats.fallbacks == {"no_cuda_gpu": 1} and not patch.stats.backend_calls
    (detail,) = [r.getMessage() for r in caplog.records if "no_cuda_gpu" in r.getMessage()]
    assert "CUDA" in detail and "dtype" not in detail


def test_a_failed_kernel_build_falls_back_counted_and_drops_that_backend(monkeypatch):
    """A broken toolchain on the first call must not stop the user's run under backend auto."""
    from comfy.ldm.modules.attention import attention_pytorch
    from vc_attention.kernels import backends, jit

    builds = []

    def broken_run(*args):
        builds.append(1)
        raise jit.JitError("nvcc failed: (compiler output here)")

    broken = backends.Backend(name="broken", priority=1000, run=broken_run, constraints=backends.Constraints(device_type="any"))
    backends.backends()  # load the built-in backends before adding ours
    monkeypatch.setitem(backends._REGISTRY, "broken", broken)
    patch = make_patch(backend="auto")
    q, k, v = qkv((B, H, N, D))
    sdpa = attention_pytorch(q, k, v, H, skip_reshape=True, skip_output_reshape=True)
    first = attention_pytorch(q, k, v, H, skip_reshape=True, skip_output_reshape=True, transformer_options=options(patch))
    assert torch.equal(first, sdpa) and patch.stats.fallbacks == {"kernel_build_failed": 1}
    second = attention_pytorch(q, k, v, H, skip_reshape=True, skip_output_reshape=True, transformer_options=options(patch))
    # the broken backend is dropped; no other kernel runs on a CPU, and auto never picks the emulation
    assert len(builds) == 1 and not patch.stats.backend_calls
    assert patch.stats.fallbacks == {"kernel_build_failed": 1, "no_cuda_gpu": 1}
    assert torch.equal(second, sdpa)


def test_a_failed_build_of_a_backend_chosen_by_name_stops_the_run_with_the_compiler_message(monkeypatch):
    from comfy.ldm.modules.attention import attention_pytorch
    from vc_attention.kernels import backends, jit

    def broken_run(*args):
        raise jit.JitError("nvcc failed: (compiler output here)")

    backends.backends()
    monkeypatch.setitem(backends._REGISTRY, "broken", backends.Backend(
        name="broken", priority=1000, run=broken_run, constraints=backends.Constraints(device_type="any")))
    patch = make_patch(backend="broken")
    q, k, v = qkv((B, H, N, D))
    with pytest.raises(jit.JitError, match="compiler output"):
        attention_pytorch(q, k, v, H, skip_reshape=True, skip_output_reshape=True, transformer_options=options(patch))


def test_an_unusable_jit_cache_is_the_counted_build_fallback_not_a_crash(monkeypatch, tmp_path):
    """A cache path that is a file once raised NotADirectoryError/FileExistsError out of the run."""
    from comfy.ldm.modules.attention import attention_pytorch
    from vc_attention.kernels import backends, jit

    source = tmp_path / "kernel.cu"
    source.write_text("__global__ void k() {}\n")
    (tmp_path / "cache").write_text("not a directory")
    monkeypatch.setenv("VC_ATTENTION_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(jit, "check_torch_cuda", lambda: None)

    def run_needing_the_extension(*args):
        return jit.load_extension("demo", [source], arch="9.0a")

    backends.backends()
    monkeypatch.setitem(backends._REGISTRY, "cached", backends.Backend(
        name="cached", priority=1000, run=run_needing_the_extension, constraints=backends.Constraints(device_type="any")))
    patch = make_patch(backend="auto")
    q, k, v = qkv((B, H, N, D))
    out = attention_pytorch(q, k, v, H, skip_reshape=True, skip_output_reshape=True, transformer_options=options(patch))
    assert torch.equal(out, attention_pytorch(q, k, v, H, skip_reshape=True, skip_output_reshape=True))
    assert patch.stats.fallbacks == {"kernel_build_failed": 1}


@pytest.mark.parametrize("empty_dim", [0, 1, 2])
def test_empty_calls_fall_back_counted_instead_of_stopping_the_run(empty_dim):
    from comfy.ldm.modules.attention import attention_pytorch

    shape = [B, H, N, D]
    shape[empty_dim] = 0
    q, k, v = qkv(tuple(shape))
    patch = make_patch()
    out = attention_pytorch(q, k, v, H, skip_reshape=True, skip_output_reshape=True, transformer_options=options(patch))
    assert out.shape == q.shape
    assert patch.stats.fallbacks == {"shape": 1} and not patch.stats.backend_calls


def test_autograd_calls_fall_back_counted_and_the_backward_runs():
    """With requires_grad the forward ran VC-Attention and the backward then failed (no autograd formula)."""
    from comfy.ldm.modules.attention import attention_pytorch

    q, k, v = (t.requires_grad_() for t in qkv((B, N, H * D)))
    patch = make_patch()
    out = attention_pytorch(q, k, v, heads=H, transformer_options=options(patch))
    assert torch.equal(out, attention_pytorch(q, k, v, heads=H))
    out.float().sum().backward()
    assert q.grad is not None and patch.stats.fallbacks == {"autograd": 1}
    with torch.no_grad():
        attention_pytorch(q, k, v, heads=H, transformer_options=options(patch))
    assert patch.stats.backend_calls == {"reference": 1}


def test_the_node_hands_its_own_grouping_as_trusted(monkeypatch):
    """The node's perm comes from kernels.grouping (a permutation by construction): only its range is checked."""
    from comfy.ldm.modules.attention import attention_pytorch
    from vc_attention.kernels import inputs

    seen = []
    real = inputs.check_perm_values
    monkeypatch.setattr(inputs, "check_perm_values", lambda perm, trusted: seen.append(trusted) or real(perm, trusted))
    q, k, v = qkv((B, H, N, D))
    patch = make_patch()
    attention_pytorch(q, k, v, H, skip_reshape=True, skip_output_reshape=True, transformer_options=options(patch))
    assert seen == [True]
