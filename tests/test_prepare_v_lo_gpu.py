"""GPU tier of the V residual's second E4M3 term in the CUDA prepare (VCConfig.v_lo_channels; csrc/prepare_v_lo.cuh):
its codes v_lo_t against reference.py's quantizer given the kernel's channels v_lo_sel, the channels against
reference.v_lo_channel_policy's ranking, and every other operand unchanged by the term.

  pytest -q -m gpu tests/test_prepare_v_lo_gpu.py
"""
import pytest
import torch

from vc_attention.kernels import prepare_cuda as prep
from vc_attention.kernels import reference as R
from vc_attention.kernels.config import FIDELITY, SPEED
from vc_attention.kernels.constants import VSMOOTH_PAIRED_K
from vc_attention.kernels.prepare_cuda import prepare_cuda
from vc_attention.kernels.prepare_reference import prepare_reference

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

FIRST_TERM = ("q_q", "q_scale", "k_q", "k_scale", "v_t", "v_scale", "v_mean", "v_seg_end", "v_low_t")
# float32 energies against the spec's float64 ones: a chosen channel's energy may sit this far (relative) below an
# unchosen one's (a near-tie ranked the other way); with segments the energies are moved onto the segment means in
# float32 (prepare_v_lo_select_kernel)
ENERGY_RTOL = 1e-3


def _qkv(b, h, n, d, dtype, seed, constant_channels=0, key_spread=False):
    """Random Q, K; V with per-channel scales spread over 0.1..3 (distinct residual energies, each head its own
    order) and offsets; the first `constant_channels` channels of every head constant (zero residual energy: ties).
    key_spread: key norms spread over a factor of 8 (what K scales per lane sort by)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k = (torch.randn(b, h, n, d, generator=gen, device="cuda") for _ in range(2))
    if key_spread:
        k = k * torch.exp2(3 * torch.rand(b, h, n, 1, generator=gen, device="cuda"))
    scale = torch.linspace(0.1, 3.0, d, device="cuda")[torch.argsort(torch.rand(b, h, 1, d, generator=gen, device="cuda"), -1)]
    v = torch.randn(b, h, n, d, generator=gen, device="cuda") * scale + 2.0 * torch.randn(d, generator=gen, device="cuda")
    v[..., :constant_channels] = 0.75
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _bytes(t):
    """The tensor on the CPU, E4M3 as its bytes (None stays None)."""
    return None if t is None else (t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t).cpu()


def _v_in_operand_order(k, v, perm, config):
    """V as the operands hold it (the grouping's order, then with K scales per lane the spec's lane order), on the
    CPU: the spec's scale amax / 448 is a true division there, as in the kernel (torch on CUDA multiplies by the
    rounded reciprocal)."""
    if perm is not None:
        k, v = R.permute_tokens(k, perm), R.permute_tokens(v, perm)
    return R.lane_sorted(k, v, config)[1].cpu()


def _residual(v_ord, ops):
    """The first term's residual against the kernel's own fp16 means (B,H,N,D) float32, on the CPU."""
    return v_ord.float() - R.expand_rows(ops.v_mean.cpu().float(), R.V_BLOCK, v_ord.shape[-2])


def _spec_given_means(v_ord, ops, lo):
    """reference.quantize_v_vsmooth's first and second term (no segments: its steps, reference._with_lo the second
    term's) on the kernel's own fp16 means and channels: the means are float32 sums in another order (an fp16 mean
    may round the other way), the channels a policy."""
    resid = _residual(v_ord, ops)
    amax = R.channel_absmax(resid)
    r_q, r_scale = R.quantize_fp8_per_channel(resid, amax)
    return R._with_lo(R.VSmoothV(ops.v_mean.cpu(), r_q, r_scale), resid, amax, lo, ops.v_lo_sel.cpu())


def _as_rows(values, n_pad):
    """(B,H,N,C) float32 code values -> (B,H,C,n_pad) E4M3 bytes, as the operands store them."""
    padded = torch.nn.functional.pad(values, (0, 0, 0, n_pad - values.shape[-2]))
    return padded.transpose(-1, -2).contiguous().to(torch.float8_e4m3fn).view(torch.uint8)


def _check_channels(sel, resid, lo, d):
    """sel (B,H,L) int32: distinct, ascending, and the top L by the residual's float64 energy up to ENERGY_RTOL."""
    assert sel.dtype == torch.int32 and sel.shape[-1] == lo and sel.is_contiguous()
    sel = sel.cpu()
    assert bool((sel >= 0).all() and (sel < d).all() and (sel[..., 1:] > sel[..., :-1]).all())
    energy = resid.double().pow(2).sum(-2)
    chosen = torch.zeros_like(energy, dtype=torch.bool).scatter(-1, sel.long(), True)
    least_chosen = energy.masked_fill(~chosen, float("inf")).amin(-1)
    most_other = energy.masked_fill(chosen, float("-inf")).amax(-1)
    assert bool((least_chosen >= most_other * (1 - ENERGY_RTOL)).all()), (least_chosen, most_other)


def _check_unchanged_by_the_term(got, base):
    for field in FIRST_TERM:
        a, b = _bytes(getattr(got, field)), _bytes(getattr(base, field))
        assert (a is None) == (b is None) and (a is None or torch.equal(a, b)), field
    assert base.v_lo_t is None and base.v_lo_sel is None


@pytest.mark.parametrize("lo", [16, 32])
@pytest.mark.parametrize("d,dtype", [(64, torch.float16), (64, torch.bfloat16), (128, torch.float16), (128, torch.bfloat16)])
@pytest.mark.parametrize("n", [1000, 300])
def test_fidelity_second_term_is_the_spec_given_its_channels(lo, d, dtype, n):
    """FIDELITY (128-row means; K scales per 256 keys at head dim 128) with the term: every first-term operand is the
    lo=0 call's bit for bit, v_lo_t is the spec's quantizer on the kernel's means and channels bit for bit (zeros on
    the padded keys), the channels are the top L by energy, and two calls agree."""
    config = FIDELITY.with_(v_lo_channels=lo)
    q, k, v = _qkv(2, 3, n, d, dtype, seed=n + d + lo)
    perm = torch.argsort(torch.rand(2, 3, n, device="cuda"), dim=-1)
    got = prepare_cuda(q, k, v, perm, config, "bhnd")
    _check_unchanged_by_the_term(got, prepare_cuda(q, k, v, perm, config.with_(v_lo_channels=0), "bhnd"))
    n_pad = got.n_pad
    assert got.v_lo_t.shape == (2, 3, lo, n_pad) and got.v_lo_t.dtype == torch.float8_e4m3fn and got.v_lo_t.is_contiguous()
    v_ord = _v_in_operand_order(k, v, perm, config)
    spec = _spec_given_means(v_ord, got, lo)
    # the premise: on its own means the kernel's first term is the spec's, scale and codes
    assert torch.equal(_bytes(got.v_scale), torch.where(spec.scale > 0, spec.scale, torch.ones_like(spec.scale)).squeeze(-2))
    assert torch.equal(_bytes(got.v_t), _as_rows(spec.residual_q, n_pad))
    assert torch.equal(_bytes(got.v_lo_t), _as_rows(spec.lo_q, n_pad))
    assert spec.lo_q.abs().amax() > 0  # the term carries something (x - hi is not all zero)
    _check_channels(got.v_lo_sel, _residual(v_ord, got), lo, d)
    again = prepare_cuda(q, k, v, perm, config, "bhnd")
    assert torch.equal(again.v_lo_sel, got.v_lo_sel) and torch.equal(_bytes(again.v_lo_t), _bytes(got.v_lo_t))


@pytest.mark.parametrize("d", [64, 128])
def test_energy_ties_go_to_the_lower_channel(d):
    """With more zero-energy (constant) channels than the unchosen places, the kernel's channels are exactly the
    policy's: the rest of the L places go to the constant channels with the lowest indices (the spec's stable sort)."""
    lo = 32
    n = 700
    q, k, v = _qkv(1, 2, n, d, torch.bfloat16, seed=d, constant_channels=d - lo + 8)
    config = FIDELITY.with_(v_lo_channels=lo)
    got = prepare_cuda(q, k, v, None, config, "bhnd")
    want = R.v_lo_channel_policy(_residual(_v_in_operand_order(k, v, None, config), got), lo)
    assert torch.equal(got.v_lo_sel.cpu().long(), want)
    assert got.v_lo_sel[..., :8].tolist() == [[list(range(8))] * 2]


@pytest.mark.parametrize("lo", [16, 32])
@pytest.mark.parametrize("n", [1100, 3000])
def test_speed_segments_second_term(lo, n):
    """SPEED (256-row means merged into segments, head dim 128) with the term: first-term operands unchanged, the
    channels the top L by the energy against the segment means, and v_lo_t the spec's given those channels on every
    channel whose first term (scale, means) is the spec's bit for bit (the segment means' and the amax bound's
    float32 sums run in another order: a channel's may round apart, which the check leaves out)."""
    config = SPEED.with_(v_lo_channels=lo)
    q, k, v = _qkv(1, 4, n, 128, torch.bfloat16, seed=n + lo)
    perm = torch.argsort(torch.rand(1, 4, n, device="cuda"), dim=-1)
    got = prepare_cuda(q, k, v, perm, config, "bhnd")
    _check_unchanged_by_the_term(got, prepare_cuda(q, k, v, perm, config.with_(v_lo_channels=0), "bhnd"))
    v_ord = _v_in_operand_order(k, v, perm, config)
    spec = R.quantize_v_vsmooth(v_ord, mean_rows=256, merge=True, lo_channels=lo, lo_sel=got.v_lo_sel.cpu())
    assert torch.equal(_bytes(got.v_seg_end), spec.seg_end)
    sel = got.v_lo_sel.cpu().long()
    same_scale = (_bytes(got.v_scale) == spec.scale.squeeze(-2)).gather(-1, sel)
    same_means = (_bytes(got.v_mean) == spec.mean).all(-2).gather(-1, sel)
    comparable = same_scale & same_means  # (B,H,L)
    assert comparable.float().mean() > 0.75, comparable.float().mean()
    want = _as_rows(spec.lo_q, got.n_pad)
    rows_equal = (_bytes(got.v_lo_t) == want).all(-1)
    assert bool(rows_equal[comparable].all())
    _check_channels(got.v_lo_sel, _residual(v_ord, got), lo, 128)


def test_speed_per_step_means_at_head_dim_64():
    """256-row means without segments (SPEED at head dim 64): the statistics blocks are 256 rows; codes as fidelity's."""
    lo, n, d = 32, 1100, 64
    config = SPEED.with_(v_lo_channels=lo)
    q, k, v = _qkv(2, 2, n, d, torch.float16, seed=5)
    perm = torch.argsort(torch.rand(2, 2, n, device="cuda"), dim=-1)
    got = prepare_cuda(q, k, v, perm, config, "bhnd")
    assert got.v_seg_end is None
    _check_unchanged_by_the_term(got, prepare_cuda(q, k, v, perm, config.with_(v_lo_channels=0), "bhnd"))
    v_ord = _v_in_operand_order(k, v, perm, config)
    spec = _spec_given_means(v_ord, got, lo)
    assert torch.equal(_bytes(got.v_t), _as_rows(spec.residual_q, got.n_pad))
    assert torch.equal(_bytes(got.v_lo_t), _as_rows(spec.lo_q, got.n_pad))
    _check_channels(got.v_lo_sel, _residual(v_ord, got), lo, d)


def test_k_lane_order_carries_the_second_term_with_v():
    """K scales per lane reorder K and V in each 128-key block: v_lo_t follows the same order (tokens where the
    kernel's lane order and the spec's differ, near-ties of two keys' amaxes, are rare and left out)."""
    lo, n = 32, 1000
    config = FIDELITY.with_(k_lane_scales=True, v_lo_channels=lo)
    q, k, v = _qkv(1, 2, n, 128, torch.bfloat16, seed=11, key_spread=True)
    perm = torch.argsort(torch.rand(1, 2, n, device="cuda"), dim=-1)
    got = prepare_cuda(q, k, v, perm, config, "bhnd")
    _check_unchanged_by_the_term(got, prepare_cuda(q, k, v, perm, config.with_(v_lo_channels=0), "bhnd"))
    spec = _spec_given_means(_v_in_operand_order(k, v, perm, config), got, lo)
    same_token = (_bytes(got.v_t) == _as_rows(spec.residual_q, got.n_pad)).all(-2)  # (B,H,n_pad)
    assert same_token.float().mean() > 0.99
    lo_token = (_bytes(got.v_lo_t) == _as_rows(spec.lo_q, got.n_pad)).all(-2)
    assert bool(lo_token[same_token].all())


def test_a_prepare_variant_build_refuses_the_term_and_prepare_attend_a_mixed_expcast_call():
    q, k, v = _qkv(1, 2, 300, 128, torch.bfloat16, seed=1)
    config = FIDELITY.with_(v_lo_channels=16)
    with pytest.raises(ValueError, match="v_lo_channels=16"):
        prepare_cuda(q, k, v, None, config, "bhnd", variant_flags=prep.VARIANTS["legacy-quantize"])
    # the refusal comes before the entry addresses are used: placeholders do not reach a launch
    args = prep.binding_args(q, k, v, None, config, "bhnd", None, None)
    with pytest.raises(ValueError, match="mixed encoding is an exp2-family encoding"):
        prep.extension().prepare_attend(*args, torch.empty_like(q), True, 1 | VSMOOTH_PAIRED_K, 1, 1, True)
    with pytest.raises(ValueError, match="v_lo_channels must be 0 to 32"):
        prep.extension().prepare(*args[:-1], 48)
    with pytest.raises(ValueError, match="needs V-Smooth and no low-rank"):
        no_smooth = list(args)
        no_smooth[7] = False  # vsmooth
        prep.extension().prepare(*no_smooth)


def test_the_reference_prepare_and_the_cuda_one_agree_on_the_operands():
    """prepare_reference (the spec's own means and channels) against the CUDA prepare: the same channels on this
    data (energies far from ties) and the same codes but for rare one-code differences from the means' rounding."""
    lo, n = 32, 1000
    config = FIDELITY.with_(v_lo_channels=lo)
    q, k, v = _qkv(2, 2, n, 128, torch.bfloat16, seed=3)
    perm = torch.argsort(torch.rand(2, 2, n, device="cuda"), dim=-1)
    got = prepare_cuda(q, k, v, perm, config, "bhnd")
    want = prepare_reference(q, k, v, perm, config, "bhnd")
    assert torch.equal(got.v_lo_sel, want.v_lo_sel)
    same = (_bytes(got.v_lo_t) == _bytes(want.v_lo_t)).float().mean()
    assert same > 0.999, same
