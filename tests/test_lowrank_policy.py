"""The fast basis policy of the low-rank V term (kernels/lowrank_policy.py) against the spec's eigensolve."""
import pytest
import torch

from vc_attention.kernels import grouping
from vc_attention.kernels import reference as R
from vc_attention.kernels.lowrank_policy import lowrank_basis_fast
from vc_attention.study.videodata import video_like_qkv


def _structured_v(n=2048, d=64, seed=0):
    """A residual that is rank 3 (well separated) plus noise, over channel offsets."""
    gen = torch.Generator().manual_seed(seed)
    directions = torch.linalg.qr(torch.randn(d, 3, generator=gen)).Q.T
    coeffs = torch.randn(1, 2, n, 3, generator=gen) * torch.tensor([4.0, 2.0, 1.0])
    return (3.0 * torch.randn(d, generator=gen) + coeffs @ directions + 0.05 * torch.randn(1, 2, n, d, generator=gen)).half()


def _v_error(v, basis):
    return float((R.quantize_v_vsmooth(v, basis).dequantized() - v.float()).norm() / v.float().norm())


def test_it_spans_the_spec_basis_when_the_directions_are_clear():
    v = _structured_v()
    spec, fast = R.lowrank_basis(v, 3), lowrank_basis_fast(v, 3)
    assert fast.shape == spec.shape == (1, 2, 3, 64) and fast.dtype == torch.float16
    cos = torch.linalg.svdvals(spec.double() @ fast.double().transpose(-1, -2))
    assert cos.min() > 0.999
    # each vector is the spec's up to fp16 rounding: same order (largest first) and the same sign rule
    assert torch.allclose(fast.float(), spec.float(), atol=2e-3)


def test_it_takes_the_same_share_of_v_as_the_spec_on_video_like_data():
    _, _, v = video_like_qkv(B=1, H=2, T=4, Hgrid=30, Wgrid=52, D=128, dtype=torch.bfloat16, seed=1)
    v = R.permute_tokens(v, grouping.group_tokens(v, 64, 2).perm())
    plain, spec, fast = _v_error(v, None), _v_error(v, R.lowrank_basis(v, 6)), _v_error(v, lowrank_basis_fast(v, 6))
    assert spec < 0.97 * plain  # the term matters on this data
    assert fast <= 1.01 * spec


def test_given_block_means_and_a_warm_start_are_used():
    v = _structured_v(seed=2)
    means = R.block_means_fp16(v)
    assert torch.equal(lowrank_basis_fast(v, 2, block_means=means), lowrank_basis_fast(v, 2))
    wrong = torch.zeros_like(means)  # other means: another residual, another basis
    assert not torch.equal(lowrank_basis_fast(v, 2, block_means=wrong), lowrank_basis_fast(v, 2))
    spec = R.lowrank_basis(v, 2)
    warm = lowrank_basis_fast(v, 2, warm=spec, iters=1)  # one step from the answer stays at the answer
    assert torch.linalg.svdvals(spec.double() @ warm.double().transpose(-1, -2)).min() > 0.999


def test_a_rank_below_one_is_refused():
    with pytest.raises(ValueError, match="rank must be at least 1"):
        lowrank_basis_fast(_structured_v(), 0)
