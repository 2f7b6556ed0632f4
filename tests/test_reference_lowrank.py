"""V-Smooth's optional head-global low-rank term in the spec (VCConfig.v_rank; reference.lowrank_basis,
quantize_v_vsmooth with a basis), CPU only.

What the spec promises: v_rank 0 is V-Smooth unchanged; with a basis, V = mean + A_q W + residual up to
the residual's FP8 rounding (A's rounding lands in the residual); the basis is deterministic and
orthonormal up to fp16; only backends that declare it take such a call, the CUDA prepare refuses it
instead of dropping the term (the reference prepare builds its operands); and on V whose residual has a few strong
directions the attention output is closer to exact attention than without it.
"""
import dataclasses

import pytest
import torch

from vc_attention.kernels import api, backends
from vc_attention.kernels import reference as R
from vc_attention.kernels.config import MAX_V_RANK, VCConfig
from vc_attention.kernels.prepare_reference import prepare_reference


def _structured_v(b=1, h=2, n=1536, d=64, seed=0):
    """Channel offsets, slow drift (what the block means take) and a residual that is mostly rank 2."""
    gen = torch.Generator().manual_seed(seed)
    directions = torch.linalg.qr(torch.randn(d, 2, generator=gen)).Q.T
    coeffs = torch.randn(b, h, n, 2, generator=gen) * torch.tensor([2.0, 1.0])
    drift = torch.cumsum(torch.randn(b, h, n, d, generator=gen), dim=2) * 0.02
    offsets = 3.0 * torch.randn(d, generator=gen)
    return (offsets + drift + coeffs @ directions + 0.05 * torch.randn(b, h, n, d, generator=gen)).bfloat16()


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def test_rank_zero_is_v_smooth_unchanged():
    v = _structured_v()
    assert torch.equal(R.dequantized_v(v, VCConfig()), R.quantize_v_vsmooth(v).dequantized())
    assert R.quantize_v_vsmooth(v).basis is None


def test_basis_is_deterministic_orthonormal_and_signed():
    v = _structured_v()
    w = R.lowrank_basis(v, 3)
    assert w.shape == (1, 2, 3, 64) and w.dtype == torch.float16
    assert torch.equal(w, R.lowrank_basis(v, 3))
    gram = w.double() @ w.double().transpose(-1, -2)
    assert torch.allclose(gram, torch.eye(3, dtype=torch.float64).expand_as(gram), atol=2e-3)
    peak = w.gather(-1, w.abs().argmax(dim=-1, keepdim=True))
    assert (peak > 0).all()
    # a sample at least as long as the head takes every token
    assert torch.equal(R.lowrank_basis(v, 2, sample=10**6), R.lowrank_basis(v, 2, sample=v.shape[-2]))


def test_residual_scale_is_the_statistics_pass_bound_and_tight():
    v = _structured_v()
    w = R.lowrank_basis(v, 2)
    vs = R.quantize_v_vsmooth(v, w)
    carried = (v.float() - R.expand_rows(vs.mean.float(), R.V_BLOCK, v.shape[-2]) - vs.low_rank())
    amax = R.channel_absmax(carried)
    assert (vs.scale * 448 >= amax * (1 - 1e-6)).all()  # a bound: nothing saturates
    # and not far above it: here, where the rank-2 term leaves a small residual beside large
    # coefficients, the rounding allowance makes it up to ~1.5x; on the video-like data ~1.02x
    assert (vs.scale * 448 <= amax * 2).all()


def test_coefficient_rounding_lands_in_the_residual():
    v = _structured_v()
    vs = R.quantize_v_vsmooth(v, R.lowrank_basis(v, 2))
    n = v.shape[-2]
    mean = R.expand_rows(vs.mean.float(), R.V_BLOCK, n)
    # what the FP8 residual had to carry: exactly V minus the mean and the rounded low-rank term
    carried = v.float() - mean - vs.low_rank()
    assert torch.allclose(vs.residual_q * vs.scale, carried, rtol=0.07, atol=float(vs.scale.max()) * 2**-6)
    assert vs.coeff_q.abs().max() <= 448 and vs.coeff_scale.shape == (1, 2, 1, 2)
    # the statistics-pass bound on the residual never clips (no code at the E4M3 maximum beyond it)
    assert vs.residual_q.abs().max() <= 448
    assert _rel(vs.dequantized(), v) < 0.5 * _rel(R.quantize_v_vsmooth(v).dequantized(), v)


@pytest.mark.parametrize("bad", [-1, MAX_V_RANK + 1, 2.0, True])
def test_config_rejects_ranks_out_of_range(bad):
    with pytest.raises(ValueError, match="v_rank must be an integer"):
        VCConfig(v_rank=bad)


def test_the_rank_is_in_the_tag_only_when_set():
    assert VCConfig().tag == "int8-vsmooth-exp2" and VCConfig(v_rank=4).tag == "int8-vsmooth-exp2-rank4"


def test_config_needs_v_smooth_for_a_rank():
    with pytest.raises(ValueError, match="needs v='vsmooth'"):
        VCConfig(v="per_channel", v_rank=2)


def test_backends_declare_the_term_where_their_kernels_carry_it():
    v = _structured_v(n=256)
    assert prepare_reference(v, v, v, None, VCConfig(v_rank=2)).v_low_t is not None  # the contract has it
    kernel_like = backends.Constraints(device_type="any")  # a backend that declares no rank
    reason = backends.call_reason(kernel_like, VCConfig(v_rank=2), "bhnd", v)
    assert reason is not None and "rank-2 low-rank V term is not implemented" in reason
    assert backends.call_reason(backends.get("reference").constraints, VCConfig(v_rank=2), "bhnd", v) is None
    # sm90: the 256-key loops of head dim 128 only (v is head dim 64 here); the portable kernel: none yet
    sm90 = dataclasses.replace(backends.get("sm90").constraints, device_type="any")
    assert "not implemented in this kernel at head dim 64" in backends.call_reason(sm90, VCConfig(v_rank=2), "bhnd", v)
    v128 = _structured_v(n=256, d=128)
    assert backends.call_reason(sm90, VCConfig(v_rank=6), "bhnd", v128) is None
    assert backends.get("mma").constraints.max_v_rank == 0


def test_a_basis_with_rank_zero_or_the_wrong_shape_is_refused():
    v = _structured_v(n=256)
    basis = R.lowrank_basis(v, 2)
    with pytest.raises(ValueError, match="v_rank=0"):
        api.vc_attention(v, v, v, config=VCConfig(), v_basis=basis)
    with pytest.raises(ValueError, match="v_basis must be a float16 tensor"):
        api.vc_attention(v, v, v, config=VCConfig(v_rank=3), v_basis=basis)
    out = api.vc_attention(v, v, v, config=VCConfig(v_rank=2), v_basis=basis)
    assert torch.equal(out, api.vc_attention(v, v, v, config=VCConfig(v_rank=2)))  # the default basis is this one


def test_reference_backend_runs_it_closer_to_exact_attention():
    """Through the public op (the rank travels through the custom op's arguments): fp16 so that the
    output's own rounding (~2e-4) stays below the quantization error, Q scaled so that attention is
    peaked enough for V's error to show (at flat attention it averages out)."""
    gen = torch.Generator().manual_seed(5)
    q, k = (torch.randn(1, 2, 1536, 64, generator=gen) for _ in range(2))
    q, k = (4.0 * q).half(), k.half()
    v = _structured_v(n=1536, seed=5).half()
    exact = R.exact_attention(q, k, v)
    before = api.BACKEND_CALLS.copy()
    plain = api.vc_attention(q, k, v, config=VCConfig())
    low = api.vc_attention(q, k, v, config=VCConfig(v_rank=3))
    assert api.BACKEND_CALLS - before == {"reference": 2}
    assert _rel(low, exact) < 0.92 * _rel(plain, exact)  # measured 0.84x
