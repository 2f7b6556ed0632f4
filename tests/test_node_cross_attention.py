"""Cross-attention calls through the node (nodes/cross_attention.py): exact attention on cuDNN where
torch can run it there and it measures faster than the model's attention, else the model's attention;
every route counted. The decisions run on a simulated clock on the CPU; the cuDNN path itself on a GPU."""
import logging

import pytest
import torch

pytestmark = pytest.mark.usefixtures("comfy_standin")


def run_toy(steps, monkeypatch, cudnn_ms, model_ms=1.0, vc_ms=0.5, cudnn=None):
    """A toy sampling run in which cuDNN 'can run' every cross-attention call, on a simulated clock."""
    from comfy.samplers import sample, simple_scheduler
    from server import PromptServer
    from toy_dit import toy_inputs, toy_model
    from vc_attention.kernels import backends
    from vc_attention.nodes import cross_attention, override, presets, stats
    from vc_attention.nodes.node_attention import VCAttention

    clock = [0.0]
    exact = override.AttentionCall.model_attention
    routed = []

    def costs(ms, fn):
        def timed(*args, **kwargs):
            clock[0] += ms / 1e3
            return fn(*args, **kwargs)
        return timed

    def fake_cudnn(call, *views):
        routed.append(tuple(call.k.shape))
        return exact(call)  # the same output; the clock says what it cost

    stand_in = backends.Backend(name="stand_in", priority=1000, constraints=backends.Constraints(device_type="any"),
                                run=costs(vc_ms, lambda q, k, v, perm, config, layout, sm_scale: torch.zeros_like(q)))
    backends.backends()
    monkeypatch.setitem(backends._REGISTRY, "stand_in", stand_in)
    monkeypatch.setattr(stats.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(cross_attention, "cudnn_reason", lambda q, k, v, mask, kwargs: None)
    monkeypatch.setattr(cross_attention, "cudnn_attention", costs(cudnn_ms, cudnn or fake_cudnn))
    monkeypatch.setattr(override.AttentionCall, "model_attention", costs(model_ms, exact))
    server = PromptServer()
    model = toy_model()
    widgets = {k: s["default"] for k, s in presets.WIDGETS.items() if k != "mode"} | {"backend": "auto"}
    patched = VCAttention.PREPARE_CLASS_CLONE({"hidden_inputs": {"UNIQUE_ID": "5"}}).execute(model, "speed", **widgets).result[0]
    x, context = toy_inputs()
    sample(patched, x, simple_scheduler(model.model.model_sampling, steps), context)
    (_, payload, _), = server.messages
    return payload, routed


def test_cross_attention_runs_on_cudnn_where_it_is_faster(monkeypatch):
    steps, blocks = 10, 2
    payload, routed = run_toy(steps, monkeypatch, cudnn_ms=0.5)
    calls = steps * blocks
    # calls 2 and 3 of the shape time the model's attention (the baseline); every other call ran cuDNN
    assert payload["cross_attention"] == {"cudnn": calls - 2, "model": 2}
    assert len(routed) == calls - 2 and payload["cross_slower_shapes"] == []
    assert payload["fallbacks"]["cross_attention"] == calls  # still not a VC-Attention call
    from vc_attention.nodes.stats import RunStats

    assert f"cross-attention (exact): {calls - 2} cudnn, 2 model" in RunStats.log_line(payload)


def test_cross_attention_goes_back_to_the_model_where_cudnn_is_slower(monkeypatch, caplog):
    from vc_attention.nodes import stats

    steps, blocks = 10, 2
    with caplog.at_level(logging.INFO):
        payload, routed = run_toy(steps, monkeypatch, cudnn_ms=2.0)
    calls = steps * blocks
    judged_at = 4 + (stats.MIN_VC_SAMPLES - 1) * stats.SAMPLE_EVERY  # timed cuDNN calls 4 and 12
    assert payload["cross_attention"] == {"cudnn": judged_at - 2, "model": 2,
                                          "model: cuDNN measured slower": calls - judged_at}
    assert len(routed) == judged_at - 2 and len(payload["cross_slower_shapes"]) == 1
    assert "(cuDNN slower at " + payload["cross_slower_shapes"][0] + ")" in stats.RunStats.log_line(payload)


def test_a_cudnn_failure_sends_the_shape_to_the_model_and_is_counted(monkeypatch, caplog):
    """Call 1 raises: the model's attention answers it and every later call of the shape (one warning)."""

    def refuse(call, *views):
        raise RuntimeError("cuDNN: no engine for this configuration")

    steps, blocks = 4, 2
    with caplog.at_level(logging.WARNING):
        payload, _ = run_toy(steps, monkeypatch, cudnn_ms=0.5, cudnn=refuse)
    assert payload["cross_attention"] == {"model: cuDNN failed at this shape": steps * blocks}
    assert sum("cuDNN attention failed" in r.getMessage() for r in caplog.records) == 1


def test_cudnn_reasons_on_the_cpu_and_for_masks_and_unknown_arguments():
    from vc_attention.nodes.cross_attention import cudnn_reason

    q = torch.zeros(1, 2, 8, 64, dtype=torch.bfloat16)
    assert cudnn_reason(q, q, q, None, {}) == "q is on cpu"
    if torch.cuda.is_available():
        g = q.cuda()
        assert cudnn_reason(g, g, g, torch.zeros(8, 8, device="cuda"), {}) == "an attention mask"
        assert "scale" in cudnn_reason(g, g, g, None, {"scale": 0.1})
        assert "dtype" in cudnn_reason(g.float(), g.float(), g.float(), None, {})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("skip_reshape", [False, True])
def test_the_cudnn_route_is_exact_attention_in_comfyuis_layouts(skip_reshape):
    """cuDNN runs (sdpa restricted to it raises where it cannot) and matches float64 attention to bf16
    rounding, for (B, N, H*D) in / out and for (B, H, N, D) in / out."""
    from vc_attention.nodes import cross_attention as X
    from vc_attention.nodes.override import AttentionCall

    gen = torch.Generator(device="cuda").manual_seed(0)
    b, h, nq, nk, d = 2, 12, 4096, 512, 128
    q, k, v = (torch.randn(b, h, n, d, device="cuda", generator=gen, dtype=torch.bfloat16) for n in (nq, nk, nk))
    args = (q, k, v) if skip_reshape else tuple(t.transpose(1, 2).reshape(b, -1, h * d) for t in (q, k, v))
    kwargs = {"transformer_options": {}, "_inside_attn_wrapper": True}  # as ComfyUI's attention wrapper passes them
    call = AttentionCall(func=None, previous=None, q=args[0], k=args[1], v=args[2], heads=h, mask=None,
                         skip_reshape=skip_reshape, skip_output_reshape=skip_reshape, kwargs=kwargs)
    assert X.cudnn_reason(*X.bhnd_views(call), None, call.kwargs) is None
    out = X.cudnn_attention(call, *X.bhnd_views(call))
    expected = torch.softmax(q.double() @ k.double().transpose(-1, -2) / d**0.5, -1) @ v.double()
    if not skip_reshape:
        expected = expected.transpose(1, 2).reshape(b, nq, h * d)
    assert out.shape == expected.shape and out.dtype == torch.bfloat16
    err = (out.double() - expected).norm() / expected.norm()
    assert err < 4e-3, err
