"""GPU tier: fp16 outputs saturate at 65504 in every CUDA kernel's store, as the reference does.

Sharp attention over V just below fp16's largest value: V-Smooth's FP8 residual rounds some
dequantized values past 65504 (the reference emulation gave 106 inf of 32,768 before saturating;
SDPA none). Each backend that can run here must return no inf, no value past 65504, and agree with
the emulation, which saturates the same way (reference.to_output_dtype).
"""
import pytest
import torch

from vc_attention.kernels import api, backends, reference
from vc_attention.kernels.config import FIDELITY, SPEED

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _near_fp16_max(seed=0):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(1, 2, 256, 64, generator=g) * 30).half()
    k = (torch.randn(1, 2, 256, 64, generator=g) * 30).half()
    v = (65504 - 6000 * torch.rand(1, 2, 256, 64, generator=g)).half()
    return q, k, v


@pytest.mark.parametrize("backend", ["mma", "sm90"])
@pytest.mark.parametrize("config", [FIDELITY, SPEED], ids=lambda c: c.tag)
def test_fp16_store_saturates_like_the_reference(backend, config):
    q, k, v = (t.cuda() for t in _near_fp16_max())
    # what the op runs on this backend: the preset less the refinements it lacks here (head dim 64: no second V term)
    runs = backends.runnable_config(backends.get(backend), q, config, "bhnd")
    if runs is None:
        pytest.skip(f"{backend} cannot run here: {backends.get(backend).why_not(q, config, 'bhnd')}")
    step = backends.get(backend).softmax_step(q.shape[-1], runs)
    expected = reference.vc_attention_reference(q, k, v, runs, offset_block=step)
    assert torch.isfinite(expected).all() and (expected == 65504).any()  # the data reaches the limit
    before = api.BACKEND_CALLS[backend]
    out = api.vc_attention(q, k, v, config=config, backend=backend)
    assert api.BACKEND_CALLS[backend] == before + 1
    assert torch.isfinite(out).all(), f"{int(torch.isinf(out).sum())} inf outputs"
    assert out.abs().max().item() <= 65504
    rel = float((out.double() - expected.double()).norm() / expected.double().norm())
    assert rel <= 1e-3
