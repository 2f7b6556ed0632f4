"""GPU tier of the node path: the override picks a fast backend on CUDA and times it with CUDA events."""
import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("comfy_standin"),
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_auto_never_runs_the_reference_on_a_gpu_and_times_with_events():
    from comfy.ldm.modules.attention import attention_pytorch
    from server import PromptServer
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
    assert "reference" not in patch.stats.backend_calls
    if patch.stats.fallbacks:  # no fast kernel for this GPU: counted, and the model's attention ran
        assert set(patch.stats.fallbacks) == {"no_capable_backend"}
        assert torch.equal(outs[0], sdpa)
    else:
        rel = ((outs[0].double() - sdpa.double()).norm() / sdpa.double().norm()).item()
        assert rel < 0.06
    patch.end_run()
    (event, payload, _), = server.messages
    if payload["backend_calls"]:
        assert payload["sampled_calls"] >= 1 and payload["attention_ms"] > 0 and payload["est_speedup"] > 0
