"""The operand contract (kernels/operands.py) built by prepare_reference, and its float64 emulation,
against reference.py on the CPU."""
import pytest
import torch

from vc_attention.kernels import reference
from vc_attention.kernels.config import FIDELITY, PLAIN_8BIT, SPEED, VCConfig
from vc_attention.kernels.layout import shape_in, to_bhnd
from vc_attention.kernels.operand_emulation import emulate_attention
from vc_attention.kernels.operands import rows_aligned
from vc_attention.kernels.prepare_reference import prepare_reference


def _qkv(b=2, h=3, n=200, d=64, layout="bhnd", seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(shape_in(layout, b, h, n, d), generator=gen) for _ in range(3))
    v = v + 3.0 * torch.randn(d, generator=gen)  # channel offsets: what V-Smooth removes
    return q.half(), k.half(), v.half()


# (the V residual's second term of config.FIDELITY has its own operand tests: tests/test_v_lo_channels.py)
@pytest.mark.parametrize("config", [FIDELITY.with_(v_lo_channels=0), PLAIN_8BIT, VCConfig(qk="fp8")])
def test_operands_match_reference_quantizers(config):
    q, k, v = _qkv()
    perm = torch.stack([torch.stack([torch.randperm(200) for _ in range(3)]) for _ in range(2)])
    ops = prepare_reference(q, k, v, perm, config, sm_scale=0.1)
    kp, vp = reference.permute_tokens(k, perm), reference.permute_tokens(v, perm)
    q_q, q_sc, k_q, k_sc = reference.quantize_qk(q, kp, config, 0.1)

    assert ops.n_pad == 256 and ops.n_tokens == 200
    assert ops.q_q.shape == (2, 3, 256, 64) and ops.v_t.shape == (2, 3, 64, 256)
    assert ops.q_q.dtype == (torch.int8 if config.qk == "int8" else torch.float8_e4m3fn)
    assert torch.equal(ops.q_q[:, :, :200].float(), q_q.float())
    assert torch.equal(ops.k_q[:, :, :200].float(), k_q.float())
    assert ops.q_scale.shape == (2, 3, 256)  # one scale per query row, zero on the padded rows
    assert torch.equal(ops.q_scale[:, :, :200], q_sc) and not ops.q_scale[:, :, 200:].any()
    assert torch.equal(ops.k_scale, k_sc)
    assert not ops.q_q[:, :, 200:].float().any() and not ops.k_q[:, :, 200:].float().any()
    assert not ops.v_t[..., 200:].float().any()
    assert all(t.is_contiguous() for t in (ops.q_q, ops.k_q, ops.v_t, ops.v_mean, ops.v_scale))

    v_hat = ops.v_t.float()[..., :200].transpose(-1, -2) * ops.v_scale.unsqueeze(-2)
    v_hat = v_hat + ops.v_mean.float().repeat_interleave(128, dim=2)[:, :, :200]
    assert torch.allclose(v_hat, reference.dequantized_v(vp, config), rtol=0, atol=1e-6)
    if config.v == "per_channel":
        assert not ops.v_mean.float().any()


def test_zero_channel_gets_unit_scale():
    q, k, v = _qkv(n=1)
    ops = prepare_reference(q, k, v, None, FIDELITY)
    # one fp16 token: the fp16 block mean is the token itself, the residual is exactly zero
    assert not ops.v_t.float().any()
    assert torch.equal(ops.v_scale, torch.ones_like(ops.v_scale))


@pytest.mark.parametrize("config", [FIDELITY, SPEED, PLAIN_8BIT, FIDELITY.with_rank(3), SPEED.with_rank(6)],
                         ids=["fidelity", "speed", "plain8", "fidelity-rank3", "speed-rank6"])
@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
def test_emulated_attention_from_operands_is_the_reference(config, layout):
    q, k, v = _qkv(n=130, layout=layout)
    perm = torch.argsort(torch.rand(2, 3, 130), dim=-1)
    ops = prepare_reference(q, k, v, perm, config, layout=layout)
    ours = emulate_attention(ops, config, torch.float64)
    ref = reference.vc_attention_reference(q.double(), k.double(), v.double(), config, layout=layout, perm=perm)
    ref = to_bhnd(ref, layout)
    err = (ours - ref).norm() / ref.norm()
    assert err < 1e-6


def test_rows_aligned_is_the_cuda_kernels_load_precondition():
    x = torch.zeros(1, 2, 64, 72, dtype=torch.float16)
    assert rows_aligned(x) and rows_aligned(x.transpose(1, 2))  # both layouts, as views
    assert not rows_aligned(x.transpose(-1, -2))  # head dim not contiguous
    assert not rows_aligned(torch.zeros(1, 2, 64, 68, dtype=torch.float16)[..., :64])  # rows 136 B apart
    misaligned = x.flatten()[1:1 + 2 * 64 * 64].view(1, 2, 64, 64)
    assert not rows_aligned(misaligned)  # base pointer off by 2 bytes


def test_low_rank_operands_follow_the_contract():
    q, k, v = _qkv(n=200)
    ops = prepare_reference(q, k, v, None, FIDELITY.with_rank(2))
    assert ops.v_low_t.shape == (2, 3, 8, 256) and ops.v_low_t.dtype == torch.float8_e4m3fn
    rows = ops.v_low_t.float()
    # rows 0 and 1: ones on the even / odd 128-key tiles (padded keys too: P is 0 there)
    assert torch.equal(rows[:, :, 0, :128], torch.ones_like(rows[:, :, 0, :128])) and not rows[:, :, 0, 128:].any()
    assert torch.equal(rows[:, :, 1, 128:], torch.ones_like(rows[:, :, 1, 128:])) and not rows[:, :, 1, :128].any()
    assert rows[:, :, 2:4, :200].any() and not rows[:, :, 2:, 200:].any()  # padded keys carry no coefficient
    assert not rows[:, :, 4:].any()  # rows past the rank are zero
    assert ops.v_low_scale.shape == (2, 3, 2) and ops.v_low_basis.shape == (2, 3, 2, 64)
    assert ops.v_low_basis.dtype == torch.float16 and ops.v_low_t.is_contiguous()
    plain = prepare_reference(q, k, v, None, FIDELITY)
    assert plain.v_low_t is None and plain.v_low_scale is None and plain.v_low_basis is None
    # the residual in v_t is what the low-rank term leaves: it differs from the plain one
    assert not torch.equal(ops.v_t.float(), plain.v_t.float())


def test_a_given_basis_is_used_and_checked():
    q, k, v = _qkv(n=200)
    config = FIDELITY.with_rank(2)
    basis = torch.nn.functional.normalize(torch.randn(2, 3, 2, 64), dim=-1).half()
    ops = prepare_reference(q, k, v, None, config, basis=basis)
    assert torch.equal(ops.v_low_basis, basis)
    default = prepare_reference(q, k, v, None, config)
    assert not torch.equal(ops.v_low_t.float(), default.v_low_t.float())
    for bad in (basis.float(), basis[:, :, :1], basis[..., :32]):
        with pytest.raises(ValueError, match="low-rank basis must be float16 of shape"):
            prepare_reference(q, k, v, None, config, basis=bad)
    with pytest.raises(ValueError, match="v_rank=0"):
        prepare_reference(q, k, v, None, FIDELITY, basis=basis)
