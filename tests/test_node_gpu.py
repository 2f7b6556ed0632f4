"""GPU tier of the node path: the override runs a fast backend on CUDA and times it with CUDA events.

A GPU no CUDA backend can run skips (with each backend's reason) instead of passing on the model's
attention; the reference emulation raises, so a silent fallback to it fails."""
import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("comfy_standin"),
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_auto_runs_a_fast_backend_on_a_gpu_and_times_with_events(monkeypatch):
    from comfy.ldm.modules.attention import attention_pytorch
    from server import PromptServer
    from vc_attention.kernels import backends, reference
    from vc_attention.kernels.config import FIDELITY
    from vc_attention.nodes.override import make_override
    from vc_attention.nodes.patch import Settings, VCPatch

    class Sampling:
        @staticmethod
        def percent_to_sigma(p):
            return 1.0 - p

    class Patcher:
        @staticmethod
        def get_model_object(name):
            return Sampling()

    fast = [b.name for b in backends.backends() if not b.slow and not b.availability()]
    if not fast:
        pytest.skip("no CUDA backend runs here: " + "; ".join(f"{n}: {r}" for n, r in backends.describe()))
    monkeypatch.setattr(reference, "vc_attention_reference", lambda *a, **kw: pytest.fail("the emulation ran"))
    server = PromptServer()
    patch = VCPatch(Settings(FIDELITY, 64, 4, 0.25, 0.0, 1.0, backend="auto"), node_id="g")
    patch.start_run(Patcher())
    g = torch.Generator(device="cuda").manual_seed(0)
    b, h, n, d = 1, 8, 4096 + 77, 128
    q, k, v = (torch.randn(b, n, h * d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    to = {"optimized_attention_override": make_override(patch.attend, None), "sigmas": torch.tensor([0.9], device="cuda"),
          "cond_or_uncond": [0], "block_index": 0}
    # 4 calls: calls 2-3 of a shape are the stats' timing baseline, call 4 the first timed VC call
    outs = [attention_pytorch(q, k, v, heads=h, transformer_options=to) for _ in range(4)]
    sdpa = attention_pytorch(q, k, v, heads=h)
    assert not patch.stats.fallbacks
    assert dict(patch.stats.backend_calls) == {fast[0]: 2}
    rel = ((outs[0].double() - sdpa.double()).norm() / sdpa.double().norm()).item()
    assert rel < 0.06
    patch.end_run()
    (event, payload, _), = server.messages
    assert payload["backend_calls"] == {fast[0]: 2}
    assert payload["sampled_calls"] >= 1 and payload["attention_ms"] > 0 and payload["est_speedup"] > 0
