"""GPU tier: VC_MMA_RESTORE_MMA (the V-Smooth mean restore as TF32 MMAs over 8 restores, docs/kernel-notes.md 46)
against the same build without it (skips without a GPU).

The restore adds the same l * mu / v_scale to O, in another fp32 order and through a tf32 hi/lo split (~2^-20
relative), so on V with large channel offsets (the mean term is most of the output) the two builds agree to well
inside the variant gate, and they are not bit-identical (the MMA path ran). Every restore count is exercised: a
partial last group (n = 4097: 33 tiles), whole groups only (n = 8192: 64 tiles), and speed mode's segments (restores
at segment ends only). tests/test_mma_variants_gpu.py gates the variants against the emulation.
"""
import pytest
import torch

from vc_attention.kernels import mma_variants
from vc_attention.kernels.config import FIDELITY, SPEED
from vc_attention.kernels.prepare_cuda import prepare_cuda

from .test_mma_variants_gpu import outputs_of_builds

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
                       reason="needs a CUDA GPU with FP8 tensor cores (sm_89+)"),
]

FLAG = "-DVC_MMA_RESTORE_MMA=1"
RESTORE_MMA = [name for name in mma_variants.VARIANTS if FLAG in mma_variants.flags(name)]
# fp32 sums in another order and the dropped lo*lo term, seen through the fp16 output's rounding (2^-11)
GATE = 1e-4


def _rel_l2(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


@pytest.mark.parametrize("variant", RESTORE_MMA)
@pytest.mark.parametrize("mode", ["fidelity", "speed"])
@pytest.mark.parametrize("n,d", [(4097, 128), (8192, 128), (4097, 64)])
def test_restore_mma_matches_the_build_without_it(variant, mode, n, d):
    config = FIDELITY.without_refinements() if mode == "fidelity" else SPEED
    config = config.with_(k_lane_scales=config.k_lane_scales and d == 128)  # (K scales per lane: head dim 128 only)
    flags = mma_variants.flags(variant)
    base = tuple(f for f in flags if f != FLAG)
    gen = torch.Generator(device="cuda").manual_seed(n + d)
    q, k, v = (torch.randn(2, 3, n, d, generator=gen, device="cuda") for _ in range(3))
    v = v + 4.0 * torch.randn(d, generator=gen, device="cuda")  # channel offsets: the restore carries the output
    q, k, v = (t.half() for t in (q, k, v))
    perm = torch.argsort(torch.rand(2, 3, n, device="cuda", generator=gen), dim=-1)
    ops = prepare_cuda(q, k, v, perm, config, "bhnd")
    outs = outputs_of_builds(ops, config, q, (flags, base))
    assert torch.isfinite(outs[0]).all()
    err = _rel_l2(outs[0], outs[1])
    assert err <= GATE, f"{variant} {mode} n={n} d={d}: rel-L2 {err:.2e} against the build without the flag"
    assert not torch.equal(outs[0], outs[1]), "the same bits: the MMA restore did not run"
