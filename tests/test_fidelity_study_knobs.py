"""The V knobs of bench/fidelity_study.py against the spec's quantizer.

The mean-block knob at 128 rows must reproduce reference.quantize_v_vsmooth bit for bit (so the knob's
rows differ from the spec's only by the block size), and a smaller block must remove more of V's slow
variation. The head-global low-rank knob must take the residual's dominant directions out before the
FP8 rounding: on V whose residual is mostly rank 2, rank 3 leaves a much smaller error than the spec.
"""
import torch

from vc_attention.bench.fidelity_study import v_hat_lowrank, v_hat_mean_rows
from vc_attention.kernels import reference as ref


def _smooth_v(n=1000, d=64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    drift = torch.cumsum(torch.randn(1, 2, n, d, generator=gen), dim=2) * 0.1  # slowly varying tokens
    return (drift + 0.05 * torch.randn(1, 2, n, d, generator=gen)).bfloat16()


def test_128_rows_is_the_spec():
    v = _smooth_v()
    assert torch.equal(v_hat_mean_rows(v, ref.V_BLOCK), ref.quantize_v_vsmooth(v).dequantized().float())


def test_smaller_blocks_quantize_a_smaller_residual():
    v = _smooth_v()
    err = {rows: float((v_hat_mean_rows(v, rows) - v.float()).norm()) for rows in (128, 64, 32)}
    assert err[32] < err[64] < err[128]


def test_low_rank_term_takes_the_residuals_main_directions_out():
    gen = torch.Generator().manual_seed(1)
    n, d = 2048, 64
    directions = torch.linalg.qr(torch.randn(d, 2, generator=gen)).Q.T  # two orthonormal directions
    coeffs = torch.randn(1, 2, n, 2, generator=gen) * torch.tensor([3.0, 1.5])
    v = (coeffs @ directions + 0.05 * torch.randn(1, 2, n, d, generator=gen) + 2.0).bfloat16()
    spec = float((ref.quantize_v_vsmooth(v).dequantized().float() - v.float()).norm())
    low = float((v_hat_lowrank(v, 3) - v.float()).norm())
    sampled = float((v_hat_lowrank(v, 3, sample=512) - v.float()).norm())
    assert low < 0.3 * spec and sampled < 0.3 * spec
