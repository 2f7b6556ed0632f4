"""The diffusers backend on one GPU: our kernels through diffusers' own dispatcher.

- one dispatcher call against the emulation with the same grouping: the kernel gate (rel-L2 <= 1e-3
  plus bf16 output rounding), and BACKEND_CALLS proves a CUDA kernel (sm90 or mma) ran;
- a random-weight Wan transformer at the 14B widths (2 blocks, 480p): our backend against diffusers'
  native one, every self-attention call on a CUDA kernel, cross-attention handed to native attention.
"""
import pytest
import torch

pytest.importorskip("diffusers")

from diffusers.models import attention_dispatch as dispatch  # noqa: E402

from vc_attention.integrations import diffusers_backend as db  # noqa: E402
from vc_attention.integrations.denoising_steps import DenoisingSteps  # noqa: E402
from vc_attention.integrations.diffusers_config import VCDiffusersConfig  # noqa: E402
from vc_attention.kernels import backends, reference  # noqa: E402
from vc_attention.kernels.api import BACKEND_CALLS  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
                       reason="needs a CUDA GPU with FP8 tensor cores (sm_89+)"),
]

GATE = 1e-3
FAST = ("sm90", "mma")
# Model-level bound of our backend against native attention (2 random-weight Wan blocks, bf16):
# 8-bit attention error carried through the blocks; a wrong kernel result is near 1.
MODEL_BOUND = 0.05


def _rel_l2(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def _fast_calls():
    return {name: BACKEND_CALLS[name] for name in FAST}


def test_a_dispatcher_call_runs_a_cuda_kernel_within_the_gate(monkeypatch):
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, 4096, 8, 128, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(3))
    vc = db.register_diffusers_backend(VCDiffusersConfig(mode="balanced"))
    perms = []
    original = DenoisingSteps.permutation
    monkeypatch.setattr(DenoisingSteps, "permutation", lambda self, v: perms.append(original(self, v)) or perms[-1])
    monkeypatch.setattr(reference, "vc_attention_reference",
                        lambda *a, **k: pytest.fail("the emulation ran instead of a CUDA kernel"))
    before = _fast_calls()
    out = dispatch.dispatch_attention_fn(q, k, v, backend="vc_attention")
    monkeypatch.undo()
    ran = [name for name in FAST if BACKEND_CALLS[name] == before[name] + 1]
    assert len(ran) == 1 and vc.stats.kernel_calls == {ran[0]: 1} and not vc.stats.fallbacks
    qb, kb, vb = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    step = backends.get(ran[0]).softmax_step(qb.shape[-1], vc.kernel_config)  # the kernel that ran: its step
    ref64 = reference.vc_attention_reference(qb, kb, vb, vc.kernel_config, perm=perms[0], parts=True,
                                             offset_block=step).out
    rounding = _rel_l2(ref64.to(torch.bfloat16), ref64)
    assert torch.isfinite(out).all()
    assert _rel_l2(out.transpose(1, 2), ref64) <= GATE + rounding


def test_wan_transformer_through_the_dispatcher_matches_native_attention():
    from vc_attention.commands.bench_e2e import build_model

    model = build_model(layers=2)
    g = torch.Generator().manual_seed(1)
    latents = torch.randn(1, 16, 3, 60, 104, generator=g).to("cuda", torch.bfloat16)  # 480p: 4,680 tokens
    text = torch.randn(1, 512, 4096, generator=g).to("cuda", torch.bfloat16)
    inputs = dict(hidden_states=latents, timestep=torch.tensor([500], device="cuda"), encoder_hidden_states=text,
                  return_dict=False)
    with torch.no_grad():
        model.set_attention_backend("native")
        native = model(**inputs)[0].float()
        vc = db.register_diffusers_backend(VCDiffusersConfig(mode="balanced"))
        model.set_attention_backend("vc_attention")
        before = _fast_calls()
        ours = model(**inputs)[0].float()
    assert sum(BACKEND_CALLS[n] - before[n] for n in FAST) == 2  # both self-attention layers
    assert vc.stats.fallbacks == {"cross-attention (q, k, v shapes differ)": 2}
    assert torch.isfinite(ours).all()
    err = _rel_l2(ours, native)
    print(f"Wan 14B widths, 2 blocks, 480p: rel-L2 of vc_attention (balanced) vs native {err:.4f}; {vc.stats}")
    assert 0 < err <= MODEL_BOUND
