"""CPU checks of the fp16-partial variant's V operands (kernels/mma_pv_f16.py): the overflow bound
the kernel's static_assert relies on, the shift's rounding, and that the backend hands the shifted
operands to exactly the builds that need them."""
import torch

from vc_attention.kernels import backend_mma, mma_pv_f16, mma_v_f16, mma_variants, reference
from vc_attention.kernels.config import FIDELITY
from vc_attention.kernels.operands import PreparedOperands

FP16_MAX = 65504.0
ALL_CODES = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
FINITE_CODES = ALL_CODES[torch.isfinite(ALL_CODES)]


def test_operand_shift_equals_the_emulated_shift():
    ops = _ops()
    ops.v_t = ALL_CODES.nan_to_num(0.0).repeat(ops.v_t.numel() // 256 + 1)[: ops.v_t.numel()].view_as(ops.v_t).to(torch.float8_e4m3fn)
    shifted = mma_pv_f16.shifted_v_operands(ops)
    assert shifted.v_t.dtype == torch.float8_e4m3fn
    assert torch.equal(shifted.v_t.float(), mma_pv_f16.shift_codes(ops.v_t))
    assert torch.equal(shifted.v_scale, ops.v_scale * 256)


def test_operand_shift_in_slices_equals_the_shift_in_one_piece():
    """shifted_v_operands converts (B*H) slices at a time (bounded temporaries): the same codes as one piece."""
    ops = _ops()
    gen = torch.Generator().manual_seed(2)
    ops.v_t = reference.fp8_e4m3(torch.randn(2, 3, 64, 128, generator=gen) * 200).to(torch.float8_e4m3fn)
    ops.v_scale = torch.rand(2, 3, 64, generator=gen) + 0.1
    whole = mma_pv_f16.shifted_v_operands(ops, chunk_elements=1 << 30)
    for chunk in (1, 64 * 128, 3 * 64 * 128 + 5):
        sliced = mma_pv_f16.shifted_v_operands(ops, chunk_elements=chunk)
        assert sliced.v_t.shape == ops.v_t.shape
        assert torch.equal(sliced.v_t.view(torch.uint8), whole.v_t.view(torch.uint8)), chunk
    assert torch.equal(whole.v_t.float(), mma_pv_f16.shift_codes(ops.v_t))


def test_shifted_codes_keep_the_partial_below_fp16_max():
    shifted = mma_pv_f16.shift_codes(FINITE_CODES)
    assert float(shifted.abs().max()) == mma_pv_f16.CODE_MAX == 1.75
    # 64 keys of P <= 448 times codes <= 1.75, plus the fp16 rounding of the first MMA's result
    assert mma_pv_f16.partial_bound() + 16 < FP16_MAX
    # the unshifted contract would overflow in ONE product
    assert float(FINITE_CODES.abs().max()) * reference.E4M3_MAX > FP16_MAX


def test_shift_is_exact_where_the_code_stays_normal():
    shifted = mma_pv_f16.shift_codes(FINITE_CODES)
    normal = FINITE_CODES.abs() >= 4.0  # 4 * 2^-8 = 2^-6, the smallest normal E4M3
    assert torch.equal(shifted[normal], FINITE_CODES[normal] * mma_pv_f16.CODE_SHIFT)
    # below, the E4M3 subnormal grid 2^-9 = half a code unit before the shift
    err = (shifted / mma_pv_f16.CODE_SHIFT - FINITE_CODES).abs()
    assert float(err.max()) <= 0.25


def test_shifted_quantizer_reconstructs_v_like_the_spec():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, 2, 300, 64, generator=gen) * torch.rand(64, generator=gen) * 3
    codes, scale = reference.quantize_fp8_per_channel(x)
    s_codes, s_scale = mma_pv_f16.quantize_fp8_per_channel_shifted(x)
    assert torch.equal(s_scale, scale * 256)
    # half the shifted subnormal step in V units, plus the float rounding of two products below 4 * scale
    step = (0.25 + 2**-18) * scale
    assert bool(((s_codes * s_scale - codes * scale).abs() <= step).all())
    assert float(s_codes.abs().max()) <= mma_pv_f16.CODE_MAX


def _ops():
    n, d = 128, 64
    codes = reference.fp8_e4m3(torch.randn(1, 1, d, n) * 100)
    return PreparedOperands(
        q_q=torch.zeros(1, 1, n, d, dtype=torch.int8), q_scale=torch.ones(1, 1, 2), k_q=torch.zeros(1, 1, n, d, dtype=torch.int8),
        k_scale=torch.ones(1, 1, 1), v_t=codes.to(torch.float8_e4m3fn), v_scale=torch.rand(1, 1, d) + 0.1,
        v_mean=torch.zeros(1, 1, 1, d, dtype=torch.float16), n_tokens=n)


def test_backend_shifts_v_only_for_fp16_partial_builds(monkeypatch):
    seen = {}

    converted = torch.zeros(1)  # what the f16-V builds' conversion returns (kernels/mma_v_f16.py)

    class FakeExtension:
        def attention(self, q_q, q_scale, k_q, k_scale, v_t, v_scale, *rest):
            seen["v_t"], seen["v_scale"] = v_t, v_scale

        def v_f16(self, codes, stream):
            seen["codes"] = codes
            return converted

    monkeypatch.setattr(backend_mma, "extension", lambda flags=(): FakeExtension())
    monkeypatch.setattr(backend_mma.torch.cuda, "current_stream", lambda device=None: type("S", (), {"cuda_stream": 0})())
    ops = _ops()
    out = torch.empty(1, 1, 128, 64)
    for variant in mma_variants.VARIANTS:
        flags = mma_variants.flags(variant)
        backend_mma.attention_from_operands(ops, FIDELITY, out, "bhnd", variant_flags=flags)
        if "-DVC_MMA_PV_F16=1" in flags or "-DVC_MMA_PV_F16=2" in flags:
            assert torch.equal(seen["v_t"].float(), mma_pv_f16.shift_codes(ops.v_t)), variant
            assert torch.equal(seen["v_scale"], ops.v_scale * 256), variant
        elif mma_v_f16.takes_v_f16(flags, ops.v_t.shape[2], FIDELITY.qk == "fp8", FIDELITY.v == "vsmooth"):
            # the codes converted to f16 where this kernel takes them so, the scale as it is
            assert seen["codes"] is ops.v_t and seen["v_t"] is converted and seen["v_scale"] is ops.v_scale, variant
        else:
            assert seen["v_t"] is ops.v_t and seen["v_scale"] is ops.v_scale, variant
    assert any(mma_pv_f16.uses_shifted_v(mma_variants.flags(v)) for v in mma_variants.VARIANTS)
    assert not mma_pv_f16.uses_shifted_v(("-DVC_MMA_WIDE=1", "-DVC_MMA_PV_F16=0"))
