"""The V-Smooth mean-block knob of bench/fidelity_study.py is the spec's quantizer at another block size.

At 128 rows it must reproduce reference.quantize_v_vsmooth bit for bit (so the knob's rows differ
from the spec's only by the block size), and a smaller block must remove more of V's slow variation.
"""
import torch

from vc_attention.bench.fidelity_study import v_hat_mean_rows
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
