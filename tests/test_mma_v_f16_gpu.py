"""GPU tier: VC_MMA_V_F16 (V^T handed to the via-f16 kernel as the codes' f16 values in its key order,
kernels/mma_v_f16.py, docs/kernel-notes.md 47) against the build without it (skips without a GPU).

The f16 build feeds its HMMAs the same f16 values in the same order as the via-f16 build's own unpack, so the
output must be the same bits, in every mode, at both head dims, with tail chunks (n = 4097) and whole tiles, fp16 and
bf16, K scales per lane included. The conversion kernel itself must be the torch map of kernels/mma_v_f16.py
exactly, and a build must refuse the other V form with a sentence: proof that the f16 operand is what ran.
"""
import pytest
import torch

from vc_attention.kernels import backend_mma, mma_v_f16, mma_variants
from vc_attention.kernels.config import FIDELITY, PLAIN_8BIT, SPEED, VCConfig
from vc_attention.kernels.prepare_cuda import prepare_cuda

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
                       reason="needs a CUDA GPU with FP8 tensor cores (sm_89+)"),
]

V_F16 = [name for name in mma_variants.VARIANTS if mma_v_f16.uses_v_f16(mma_variants.flags(name))]
# P unpacked by shifts and masks (VC_MMA_P_ALU_UNPACK): the same products, summed by the tensor core in another slot order
PAIRED = [name for name in V_F16 if mma_v_f16.PAIRED_FLAG in mma_variants.flags(name)]
EXACT = [name for name in V_F16 if name not in PAIRED]
PAIRED_GATE = 1e-4  # fp32 sums in another order, seen through the fp16 output's rounding (2^-11)
CONFIGS = {"fidelity": FIDELITY.without_refinements(), "speed": SPEED, "plain8": PLAIN_8BIT,
           "fp8qk": VCConfig(qk="fp8"), "fp8qk-expcast": VCConfig(qk="fp8", p="expcast")}


def _base(flags):
    """The build a V_F16 variant is compared with: without VC_MMA_V_F16 (EXACT), or without the ALU unpack (PAIRED)."""
    if mma_v_f16.PAIRED_FLAG in flags:
        return tuple(f for f in flags if f != mma_v_f16.PAIRED_FLAG)
    return tuple(f for f in flags if f not in (mma_v_f16.FLAG, mma_v_f16.D128_VSMOOTH_FLAG))


def _without_f16_v(flags):
    return tuple(f for f in flags if f not in (mma_v_f16.FLAG, mma_v_f16.D128_VSMOOTH_FLAG, mma_v_f16.PAIRED_FLAG))


def _config_taking_f16(flags):
    """A head dim and config whose kernel takes V in f16 in this build (every kernel, or head dim 128 INT8 V-Smooth)."""
    return (64, PLAIN_8BIT) if mma_v_f16.FLAG in flags else (128, FIDELITY.without_refinements())


def _call(flags, ops, config, v_t, out):
    """The extension's attention on prepared operands, V as given (no conversion), the mean in the build's form."""
    v_mean = backend_mma.mean_operand(ops) if config.v == "vsmooth" else ops.v_mean
    backend_mma.extension(flags).attention(ops.q_q, ops.q_scale, ops.k_q, ops.k_scale, v_t, ops.v_scale, v_mean, out, None,
                                           ops.n_tokens, config.qk == "fp8", config.p == "expcast", config.v == "vsmooth",
                                           torch.cuda.current_stream().cuda_stream)


@pytest.mark.parametrize("variant", V_F16)
def test_the_conversion_is_the_torch_map(variant):
    flags = mma_variants.flags(variant)
    gen = torch.Generator(device="cuda").manual_seed(7)
    codes = torch.randint(0, 256, (2, 3, 128, 4096), generator=gen, device="cuda", dtype=torch.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x11  # no NaN codes (NaN payloads need not match)
    ext = backend_mma.extension(flags)
    stream = torch.cuda.current_stream().cuda_stream
    order = mma_v_f16.key_order(flags)
    got = ext.v_f16(codes, stream)
    want = mma_v_f16.v_f16_reference(codes, order)
    assert got.dtype == torch.float16 and got.shape == (2, 3, 64, 128, 64)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    small = codes[:, :, :64, :256].contiguous()  # head dim 64
    assert torch.equal(ext.v_f16(small, stream), mma_v_f16.v_f16_reference(small, order))


@pytest.mark.parametrize("variant", V_F16)
def test_each_kernel_takes_only_its_v_form(variant):
    flags = mma_variants.flags(variant)
    assert backend_mma.extension(flags).v_f16_build() == (2 if mma_v_f16.D128_VSMOOTH_FLAG in flags else 1)
    assert backend_mma.extension(_without_f16_v(flags)).v_f16_build() == 0
    d, config = _config_taking_f16(flags)
    q = torch.randn(1, 2, 256, d, device="cuda", dtype=torch.float16)
    ops = prepare_cuda(q, q, q, None, config, "bhnd")
    with pytest.raises(ValueError, match="float16 values of the E4M3 codes"):
        _call(flags, ops, config, ops.v_t, torch.empty_like(q))
    if mma_v_f16.D128_VSMOOTH_FLAG in flags:  # a kernel that keeps the codes refuses the f16 operand
        q64 = torch.randn(1, 2, 256, 64, device="cuda", dtype=torch.float16)
        ops64 = prepare_cuda(q64, q64, q64, None, PLAIN_8BIT, "bhnd")
        with pytest.raises(ValueError, match="the E4M3 codes"):
            _call(flags, ops64, PLAIN_8BIT, backend_mma.v_f16_operand(ops64.v_t, flags), torch.empty_like(q64))


@pytest.mark.parametrize("variant", V_F16)
def test_the_backend_and_the_build_agree_on_which_kernels_take_f16(variant):
    flags = mma_variants.flags(variant)
    ext = backend_mma.extension(flags)
    for head_dim in (64, 128):
        for qk_fp8 in (False, True):
            for vsmooth in (False, True):
                assert ext.v_f16_kernel(head_dim, qk_fp8, vsmooth) == mma_v_f16.takes_v_f16(flags, head_dim, qk_fp8, vsmooth)


def _outputs_and_lse(ops, config, q, flag_sets):
    outs, lses = [], []
    for flags in flag_sets:
        out = torch.full(q.shape, float("nan"), dtype=q.dtype, device="cuda")
        lse = torch.full(q.shape[:3], float("nan"), device="cuda")
        backend_mma.attention_from_operands(ops, config, out, "bhnd", lse=lse, variant_flags=flags)
        outs.append(out)
        lses.append(lse)
    return outs, lses


@pytest.mark.parametrize("variant", V_F16)
@pytest.mark.parametrize("mode", list(CONFIGS))
@pytest.mark.parametrize("n,d,dtype", [(4097, 128, torch.float16), (8192, 64, torch.bfloat16), (4097, 64, torch.float16)])
def test_v_f16_against_the_build_without_it(variant, mode, n, d, dtype):
    """EXACT builds: the via-f16 build's output and LSE bit for bit. PAIRED builds (2^-8 P through shifts and masks):
    the V_F16 build's within PAIRED_GATE, the LSE within float32 rounding (the 8 added back)."""
    config = CONFIGS[mode]
    config = config.with_(k_lane_scales=config.k_lane_scales and d == 128)  # (K scales per lane: head dim 128 only)
    flags = mma_variants.flags(variant)
    gen = torch.Generator(device="cuda").manual_seed(n + d)
    q, k, v = (torch.randn(2, 3, n, d, generator=gen, device="cuda") for _ in range(3))
    v = v + 3.0 * torch.randn(d, generator=gen, device="cuda")
    q, k, v = (t.to(dtype) for t in (q, k, v))
    perm = torch.argsort(torch.rand(2, 3, n, device="cuda", generator=gen), dim=-1)
    ops = prepare_cuda(q, k, v, perm, config, "bhnd")
    (out, base), (lse, base_lse) = _outputs_and_lse(ops, config, q, (flags, _base(flags)))
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    if variant in EXACT:
        assert torch.equal(out, base), f"{variant} {mode} n={n} d={d}: not the via-f16 build's bits"
        assert torch.equal(lse, base_lse)
    else:
        err = float((out.double() - base.double()).norm() / base.double().norm())
        assert err <= PAIRED_GATE, f"{variant} {mode} n={n} d={d}: rel-L2 {err:.2e} against {_base(flags)}"
        torch.testing.assert_close(lse, base_lse, rtol=1e-5, atol=1e-5)
