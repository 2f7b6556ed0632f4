"""NVFP4-style 4-bit emulation (study/reference_fp4.py): E2M1 rounding, two-level scales, attention."""
import pytest
import torch

from vc_attention.kernels import reference as ref
from vc_attention.study import reference_fp4 as fp4
from vc_attention.study import videodata as vd

E2M1_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def _nearest_even_brute_force(x: torch.Tensor) -> torch.Tensor:
    """Nearest grid magnitude; at a tie the even code (code = index in E2M1_GRID, mantissa = code & 1)."""
    a = x.abs().clamp(max=6.0).unsqueeze(-1)
    dist = (a - E2M1_GRID).abs()
    best = dist.min(dim=-1, keepdim=True).values
    tied = dist == best
    codes = torch.arange(8).expand_as(tied)
    even_first = torch.where(tied, codes % 2 * 8 + codes, torch.full_like(codes, 99))
    return torch.copysign(E2M1_GRID[even_first.argmin(dim=-1)], x)


def test_e2m1_matches_brute_force_including_every_tie():
    midpoints = (E2M1_GRID[1:] + E2M1_GRID[:-1]) / 2
    dense = torch.linspace(-8, 8, 4001)
    x = torch.cat([E2M1_GRID, -E2M1_GRID, midpoints, -midpoints, dense, torch.tensor([100.0, -1e9])])
    assert torch.equal(fp4.e2m1_rne(x), _nearest_even_brute_force(x))
    assert fp4.e2m1_rne(torch.tensor([0.25, 0.75, 2.5, 3.5, 5.0])).tolist() == [0.0, 1.0, 2.0, 4.0, 4.0]


def test_two_level_scale_by_hand():
    # tensor amax 3 -> s_t = 3 / 2688. Block 0: amax 3, s_b = E4M3(448) = 448, step 0.5, exact.
    # Block 1: amax 1, s_b = E4M3(1/6 / s_t) = E4M3(149.33) = 144, step 144 * 3/2688 = 0.1607...;
    # 1 / step = 6.22 saturates to 6 -> 0.964..., 0.5 / step = 3.11 -> 3 -> 0.482...
    x = torch.zeros(32)
    x[0], x[1] = 3.0, 1.0
    x[16], x[17] = 1.0, 0.5
    out = fp4.quantize_nvfp4(x)
    step1 = 144 * 3 / 2688
    assert out[0].item() == 3.0 and out[1].item() == 1.0
    assert out[16].item() == pytest.approx(6 * step1) and out[17].item() == pytest.approx(3 * step1)
    assert torch.count_nonzero(out) == 4


def test_blocks_are_independent_and_tails_exact():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 77, generator=gen)
    x[0, 0] = 10.0  # fixes the tensor amax for both calls below
    out = fp4.quantize_nvfp4(x)
    padded = fp4.quantize_nvfp4(torch.nn.functional.pad(x, (0, 3)))
    assert torch.equal(out, padded[:, :77])  # a tail block is quantized as if zero-padded
    changed = x.clone()
    changed[1, 40] = 5.0  # block 2 of row 1
    out2 = fp4.quantize_nvfp4(changed)
    diff_blocks = (out2 != out).nonzero()[:, 1].div(16, rounding_mode="floor").unique()
    assert diff_blocks.tolist() == [2] and (out2 != out).nonzero()[:, 0].unique().tolist() == [1]
    # each block holds at most 8 magnitudes, the largest within E4M3 scale rounding of the block amax
    blocks = torch.nn.functional.pad(out, (0, 3)).view(3, -1, 16)
    ref_blocks = torch.nn.functional.pad(x, (0, 3)).view(3, -1, 16)
    for b_out, b_ref in zip(blocks.reshape(-1, 16), ref_blocks.reshape(-1, 16)):
        assert b_out.abs().unique().numel() <= 8
        assert b_out.abs().max() == pytest.approx(b_ref.abs().max().item(), rel=0.07)


def test_zero_tensor_stays_zero():
    assert torch.equal(fp4.quantize_nvfp4(torch.zeros(2, 32)), torch.zeros(2, 32))


def test_vsmooth_fp4_is_exact_when_v_is_block_constant():
    # the residual is zero, so V_hat is the fp16 block mean: exact for fp16-representable values
    means = torch.tensor([0.5, -1.25, 3.0])
    v = means.repeat_interleave(128)[:300].view(1, 1, 300, 1).expand(1, 1, 300, 16).contiguous()
    assert torch.equal(fp4.quantize_v_fp4(v, "vsmooth"), v)
    assert not torch.equal(fp4.quantize_v_fp4(v + 0.01 * torch.randn_like(v), "vsmooth"), v)


def test_layouts_perm_and_odd_sizes():
    q, k, v = vd.video_like_qkv(B=2, H=2, T=1, Hgrid=7, Wgrid=11, D=96, seed=3)  # N = 77
    out = fp4.fp4_attention_reference(q, k, v)
    out_bnhd = fp4.fp4_attention_reference(*(t.transpose(1, 2) for t in (q, k, v)), layout="bnhd")
    torch.testing.assert_close(out_bnhd, out.transpose(1, 2), rtol=0, atol=0)
    ident = torch.arange(77).expand(2, 2, 77)
    torch.testing.assert_close(
        fp4.fp4_attention_reference(q, k, v, "vsmooth", perm=ident),
        fp4.fp4_attention_reference(q, k, v, "vsmooth"),
        rtol=0,
        atol=0,
    )
    exact = ref.exact_attention(q, k, v)
    rel = ((out.double() - exact).norm() / exact.norm()).item()
    assert 0.005 < rel < 0.2  # 4-bit: clearly lossy, still attention


def test_parts_split_and_query_chunks():
    q, k, v = vd.video_like_qkv(T=1, Hgrid=8, Wgrid=20, seed=1)  # N = 160: chunks of 64 leave a tail
    whole = fp4.fp4_attention_reference(q, k, v, "vsmooth", parts=True)
    chunked = fp4.fp4_attention_reference(q, k, v, "vsmooth", parts=True, query_chunk=64)
    torch.testing.assert_close(whole.out, chunked.out)
    assert whole.tv.shape == (1, 2, 160) and (whole.tv > 0).all() and (whole.tv < 1).all()
    torch.testing.assert_close(fp4.fp4_attention_reference(q, k, v, "vsmooth").double(), whole.out.float().double())


def test_bad_arguments_raise():
    x = torch.zeros(1, 1, 4, 64)
    with pytest.raises(ValueError, match="v_format"):
        fp4.fp4_attention_reference(x, x, x, "int4")


@pytest.mark.parametrize("n,head_dim", [(1, 64), (129, 128)])
def test_odd_lengths_match_exact_attention_roughly(n, head_dim):
    gen = torch.Generator().manual_seed(n)
    q, k, v = (torch.randn(2, 2, n, head_dim, generator=gen) for _ in range(3))
    out = fp4.fp4_attention_reference(q, k, v, "vsmooth", perm=torch.randperm(n).expand(2, 2, n))
    exact = ref.exact_attention(q, k, v)
    assert out.shape == q.shape and torch.isfinite(out).all()
    assert ((out.double() - exact).norm() / exact.norm()).item() < 0.3
    if n == 1:  # one key: P normalizes to 1 and V_hat = fp16 mean + 4-bit residual of the fp16 rounding
        torch.testing.assert_close(out, v, rtol=2.0**-11, atol=0)
