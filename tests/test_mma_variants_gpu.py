"""GPU tier: every build-time variant of the portable kernel (kernels/mma_variants.py) against the
emulation (skips without a GPU).

The backend's build (mma_variants.default_variant) also runs the whole suite of tests/test_backends_gpu.py;
here every variant is built
(`extension(flags)`), checked to be the layout it claims (`cta_rows`), and compared with
reference.py at odd N (tail chunks in either half of a 128-key tile), both head dims, both layouts,
fp16/bf16 and video-like data. The wide layout's online softmax steps by 64 keys, so its exact
emulation is reference.quantize_p with offset_block=64 (patched in); the gate is the same
1e-3 rel-L2 as the default build's, above the bf16 output's own rounding. The fp16-partial
variants (kernels/mma_pv_f16.py) run on V codes shifted by 2^-8: their emulation also has the V
quantizer patched to the shifted one; the fp16 rounding of the partials is left to the gate.
"""
import math

import pytest
import torch

from vc_attention.kernels import backend_mma, jit, mma_pv_f16, mma_variants, reference
from vc_attention.kernels.config import FIDELITY as FIDELITY_PRESET, PLAIN_8BIT, SPEED, VCConfig
from vc_attention.kernels.prepare_cuda import prepare_cuda

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
                       reason="needs a CUDA GPU with FP8 tensor cores (sm_89+)"),
]

# the portable kernel takes neither of fidelity's refinements (the op drops them there: backends.runnable_config): its
# builds are compared on the preset without them
FIDELITY = FIDELITY_PRESET.without_refinements()
CONFIGS = {"fidelity": FIDELITY, "speed": SPEED, "plain8": PLAIN_8BIT, "fp8qk": VCConfig(qk="fp8")}
WIDE = [name for name, flags in mma_variants.VARIANTS.items() if "-DVC_MMA_WIDE=1" in flags]
PV_F16 = [name for name in WIDE if mma_pv_f16.uses_shifted_v(mma_variants.flags(name))]
GATE = 1e-3
# the fp16-partial builds against the emulation, which leaves out the fp16 rounding of each 64-key PV partial
# (the tensor core's own accumulation order and rounding): inside the same gate on the H200 (docs/kernel-notes.md
# sections 13 and 29)
PV_F16_GATE = GATE
WIDE_STEP_KEYS = backend_mma.SOFTMAX_STEP_KEYS  # the wide layout's online-softmax step (kChunkKeys in attn_mma_wide.cuh)


@pytest.fixture
def emulate_steps(monkeypatch):
    """Make the emulation's online softmax step by `keys` keys, like the kernel under test, and
    give it the shifted V of the fp16-partial variants when `variant` is one."""
    original = reference.quantize_p

    def use(keys, variant=None):
        monkeypatch.setattr(reference, "quantize_p", lambda s, config, offset_block=None, **kw: original(s, config, keys, **kw))
        if variant in PV_F16:
            monkeypatch.setattr(reference, "quantize_fp8_per_channel", mma_pv_f16.quantize_fp8_per_channel_shifted)
    return use


def _rel_l2(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def _qkv(b, h, n, d, dtype, layout, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    shape = (b, h, n, d) if layout == "bhnd" else (b, n, h, d)
    q, k, v = (torch.randn(shape, generator=gen, device="cuda") for _ in range(3))
    v = v + 2.0 * torch.randn(d, generator=gen, device="cuda")  # channel offsets (V-Smooth territory)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def outputs_of_builds(ops, config, q, flag_sets) -> list:
    """The output of each build (-D flag set) on the same prepared operands, (B,H,N,D) like q, each into a NaN-poisoned
    tensor."""
    outs = []
    for flags in flag_sets:
        out = torch.full(q.shape, float("nan"), dtype=q.dtype, device="cuda")
        backend_mma.attention_from_operands(ops, config, out, "bhnd", variant_flags=flags)
        outs.append(out)
    return outs


def _check(variant, q, k, v, perm, config, layout):
    flags = mma_variants.flags(variant)
    ops = prepare_cuda(q, k, v, perm, config, layout)
    out = torch.full(q.shape, float("nan"), dtype=q.dtype, device="cuda")  # poisoned
    backend_mma.attention_from_operands(ops, config, out, layout, variant_flags=flags)
    assert torch.isfinite(out).all()
    qb, kb, vb = (reference.to_bhnd(t, layout).contiguous() for t in (q, k, v))
    ref64 = reference.vc_attention_reference(qb, kb, vb, config, perm=perm, parts=True).out
    rounding = _rel_l2(ref64.to(q.dtype), ref64) if q.dtype == torch.bfloat16 else 0.0
    err = _rel_l2(reference.to_bhnd(out, layout), ref64)
    gate = (PV_F16_GATE if variant in PV_F16 else GATE) + rounding
    assert err <= gate, f"{variant}: rel-L2 {err:.2e} vs the emulation (gate {gate:.2e})"
    return err


@pytest.mark.parametrize("variant", list(mma_variants.VARIANTS))
def test_variant_builds_the_layout_it_names(variant):
    ext = backend_mma.extension(mma_variants.flags(variant))
    assert ext.cta_rows() == (128 if variant in WIDE else 64)


def test_the_backend_runs_its_arch_default_build():
    """The backend's build is the arch's default variant (the wide layout, with this GPU's PV accumulation),
    not the flag-less 16-row one."""
    default = mma_variants.default_variant(jit.target_arch(), backend_mma.pv_accum())
    assert default in WIDE and backend_mma.default_flags() == mma_variants.flags(default)
    assert backend_mma.extension() is backend_mma.extension(mma_variants.flags(default))
    assert backend_mma.extension().cta_rows() == 128
    assert ("-DVC_MMA_E4M3_VIA_F16=1" in backend_mma.default_flags()) == (jit.target_arch() in mma_variants.VIA_F16_ARCHS)


# (the builds that restore the mean by TF32 MMAs read only the float32 table: no fp16-mean twin to compare with)
MEAN_SCALED = [name for name in WIDE if backend_mma.MEAN_SCALED_FLAG in mma_variants.flags(name)
               and "-DVC_MMA_RESTORE_MMA=1" not in mma_variants.flags(name)]


@pytest.mark.parametrize("variant", MEAN_SCALED)
def test_mean_scaled_build_matches_the_fp16_mean_build_bit_for_bit(variant):
    """VC_MMA_MEAN_SCALED moves mean * (1 / v_scale) from the kernel to the backend (float32, the same
    IEEE operations): the build says so, refuses the fp16 mean with a clear error, and its output is
    the output of the same build without the flag, bit for bit (fidelity: the restore runs)."""
    flags = mma_variants.flags(variant)
    plain_flags = tuple(f for f in flags if f != backend_mma.MEAN_SCALED_FLAG)
    assert backend_mma.extension(flags).mean_scaled() == 1 and backend_mma.extension(plain_flags).mean_scaled() == 0
    q, k, v = _qkv(2, 3, 1000, 128, torch.bfloat16, "bhnd", seed=5)
    perm = torch.argsort(torch.rand(2, 3, 1000, device="cuda"), dim=-1)
    ops = prepare_cuda(q, k, v, perm, FIDELITY, "bhnd")
    outs = outputs_of_builds(ops, FIDELITY, q, (flags, plain_flags))
    assert torch.isfinite(outs[0]).all() and torch.equal(outs[0], outs[1])
    with pytest.raises(ValueError, match="float32 mean / v_scale"):
        backend_mma.extension(flags).attention(
            ops.q_q, ops.q_scale, ops.k_q, ops.k_scale, ops.v_t, ops.v_scale, ops.v_mean, outs[0], None,
            ops.n_tokens, False, False, True, torch.cuda.current_stream().cuda_stream)


@pytest.mark.parametrize("variant", ["rows16"] + WIDE)
@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("n", [1, 63, 77, 129, 200, 4097])
@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
@pytest.mark.parametrize("d,dtype", [(64, torch.float16), (128, torch.bfloat16)])
def test_wide_matches_reference(variant, name, n, layout, d, dtype, emulate_steps):
    # the 16-row layout (the baseline of the LSE test below) steps by 128 keys, the wide ones by 64
    emulate_steps(WIDE_STEP_KEYS if variant in WIDE else reference.K_BLOCK, variant)
    config = CONFIGS[name]
    if variant not in WIDE:  # K scales per lane are the wide layout's (the 16-row build refuses them: config.SPEED's)
        config = config.with_(k_lane_scales=False)
    q, k, v = _qkv(2, 3, n, d, dtype, layout, seed=n + d)
    perm = torch.argsort(torch.rand(2, 3, n, device="cuda"), dim=-1) if config.v == "vsmooth" else None
    _check(variant, q, k, v, perm, config, layout)


@pytest.mark.parametrize("variant", WIDE)
@pytest.mark.parametrize("name", ["fidelity", "speed", "plain8"])
def test_wide_video_like(variant, name, emulate_steps):
    from vc_attention.study.fidelity import grouping_permutation
    from vc_attention.study.videodata import video_like_qkv

    emulate_steps(WIDE_STEP_KEYS, variant)
    config = CONFIGS[name]
    q, k, v = video_like_qkv(B=1, H=2, T=4, Hgrid=30, Wgrid=52, D=128, dtype=torch.bfloat16, device="cuda")
    perm = grouping_permutation(v, 64, 8) if config.v == "vsmooth" else None
    _check(variant, q, k, v, perm, config, "bhnd")


@pytest.mark.parametrize("variant", WIDE)
def test_wide_lse_matches_the_16_row_build(variant):
    """The LSE output of the wide layout equals the 16-row build's (same scores, same offsets'
    meaning), and its output is within the gate of the 16-row build's at N = 32760."""
    config = SPEED.with_(k_lane_scales=False)  # the 16-row build takes no K scales per lane
    q, k, v = _qkv(1, 2, 32760, 128, torch.bfloat16, "bhnd", seed=5)
    perm = torch.argsort(torch.rand(1, 2, 32760, device="cuda"), dim=-1)
    ops = prepare_cuda(q, k, v, perm, config)
    outs, lses = [], []
    for flags in (mma_variants.flags("rows16"), mma_variants.flags(variant)):
        out = torch.empty_like(q)
        lse = torch.empty(1, 2, 32760, device="cuda")
        backend_mma.attention_from_operands(ops, config, out, "bhnd", lse=lse, variant_flags=flags)
        outs.append(out)
        lses.append(lse)
    assert torch.allclose(lses[0], lses[1], atol=1e-3, rtol=0)
    assert _rel_l2(outs[1], outs[0]) <= 2 * GATE
    assert math.isfinite(float(lses[1].sum()))


# Measured on the H200 (2026-12-01, the first GPU run of this test): with ExpCast's row max at 448 every
# fp16 build comes out 2.3% low on this worst case (a 64-key partial of 64 x 448 x 1.75 = 50176 sits where
# fp16's spacing is 32), so the fp16 partial is not accurate enough for the speed mode; exp2 (row max 256,
# partial 28672) passes. The variants are not the default (docs/kernel-notes.md section 14).
PV_F16_EXPCAST_LOW = pytest.mark.xfail(strict=True, reason="fp16 partial at the 448 row max: 2.3% low (kernel-notes 14)")


@pytest.mark.parametrize("variant", PV_F16)
@pytest.mark.parametrize("config", [PLAIN_8BIT, pytest.param(VCConfig(v="per_channel", p="expcast"), marks=PV_F16_EXPCAST_LOW)],
                         ids=["exp2", "expcast"])
def test_pv_f16_worst_case_partial(variant, config):
    """Every P at the row max (q = 0: all scores equal) and every V code at the channel amax: the
    fp16 partial reaches its bound (64 x 256 or 448 x 1.75) and stays finite and exact; the same
    kernel on the UNshifted codes overflows, which proves it accumulates in fp16 (the fp32 build
    would not) and that the backend's shift is what keeps it finite."""
    b, h, n, d = 1, 2, 1000, 128
    q = torch.zeros(b, h, n, d, dtype=torch.bfloat16, device="cuda")  # bf16 out: an overflow stays inf
    k = torch.randn(b, h, n, d, device="cuda").bfloat16()
    v = (torch.rand(d, device="cuda") + 0.5).bfloat16().expand(b, h, n, d).contiguous()  # codes all 448
    flags = mma_variants.flags(variant)
    ops = prepare_cuda(q, k, v, None, config)
    out = torch.full_like(q, float("nan"))
    backend_mma.attention_from_operands(ops, config, out, "bhnd", variant_flags=flags)
    assert torch.isfinite(out).all()
    assert _rel_l2(out, v) <= GATE
    raw = torch.full_like(q, float("nan"))
    backend_mma.extension(flags).attention(
        ops.q_q, ops.q_scale, ops.k_q, ops.k_scale, ops.v_t, ops.v_scale, ops.v_mean, raw, None, ops.n_tokens,
        False, config.p == "expcast", False, torch.cuda.current_stream().cuda_stream)
    assert not torch.isfinite(raw).all(), "unshifted V codes did not overflow: the build does not accumulate in fp16"


@pytest.mark.parametrize("variant", WIDE)
@pytest.mark.parametrize("name", ["fidelity", "speed", "plain8"])
def test_wide_late_offset_jump(variant, name, emulate_steps):
    """One key near the end scores far above all others for every query: every row's offset jumps
    by ~10 in the last chunks after many chunks without a move, so a rescale of O that was skipped
    (VC_MMA_PV_F16=2 rescales only when an offset moved) or applied to the wrong rows shows."""
    emulate_steps(WIDE_STEP_KEYS, variant)
    config = CONFIGS[name]
    n, d = 4097, 128
    q, k, v = (t.float() for t in _qkv(1, 2, n, d, torch.bfloat16, "bhnd", seed=11))
    u = torch.nn.functional.normalize(torch.randn(d, generator=torch.Generator().manual_seed(3)), dim=0).cuda()
    q = (q + 2.0 * u).bfloat16()
    k[:, :, n - 70] = 60.0 * u
    k, v = k.bfloat16(), v.bfloat16()
    perm = torch.arange(n, device="cuda").expand(1, 2, n).contiguous() if config.v == "vsmooth" else None
    _check(variant, q, k, v, perm, config, "bhnd")


# the builds the backend runs with pv_accum "fp32+fp16" (GeForce), beside the fp32 build of the same arch
PV_ACCUM_PAIRS = [(mma_variants.default_variant(arch, "fp32"), mma_variants.default_variant(arch, "fp32+fp16"))
                  for arch in ("8.9", "9.0a")]


@pytest.mark.parametrize("fp32_build,fp16_build", PV_ACCUM_PAIRS, ids=[p[1] for p in PV_ACCUM_PAIRS])
@pytest.mark.parametrize("name", ["fidelity", "speed", "plain8"])
def test_fp16_partials_keep_the_error_against_exact_attention(fp32_build, fp16_build, name):
    """The fp32+fp16 build (GeForce's default) on the video-like data: its error against float64 exact
    attention is within 3% of the fp32 build's on the same operands, whatever the emulation gate above
    allows; the fp16 build really ran (its output differs from the fp32 build's)."""
    from vc_attention.study.fidelity import grouping_permutation
    from vc_attention.study.videodata import video_like_qkv

    config = CONFIGS[name]
    q, k, v = video_like_qkv(B=1, H=2, T=8, Hgrid=30, Wgrid=52, D=128, dtype=torch.bfloat16, device="cuda")
    perm = grouping_permutation(v, 64, 2) if config.v == "vsmooth" else None
    ops = prepare_cuda(q, k, v, perm, config)
    rows = torch.randperm(q.shape[2], generator=torch.Generator().manual_seed(0))[:512].to("cuda")
    exact = torch.softmax(q[:, :, rows].double() @ k.double().transpose(-1, -2) / 128 ** 0.5, dim=-1) @ v.double()
    errs = {}
    outs = {}
    for build in (fp32_build, fp16_build):
        out = torch.full_like(q, float("nan"))
        backend_mma.attention_from_operands(ops, config, out, "bhnd", variant_flags=mma_variants.flags(build))
        outs[build] = out
        errs[build] = _rel_l2(out[:, :, rows], exact)
    assert not torch.equal(outs[fp32_build], outs[fp16_build])
    assert errs[fp16_build] <= 1.03 * errs[fp32_build], errs
