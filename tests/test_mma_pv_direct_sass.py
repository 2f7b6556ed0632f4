"""VC_MMA_PV_DIRECT (docs/kernel-notes.md section 45): the via-f16 build's PV MMAs accumulate straight into O, rescaled
only in a chunk where some row of the warp moved its max (one VOTE.ANY), with no per-chunk partial and no fold.

Compile-only (nvcc + nvdisasm, no GPU), sm_90a (the H100/H200 build, FP8 through f16), the `-pvdirect-` variant against
the build it extends, one chunk trip along the path where no row's max moved (`bench/sass_loop_mix.py --anys-fail`):
- the kernels without V-Smooth lose the fold, one FFMA per O element (128 per thread at head dim 128, 64 at 64), and
  run the same f16 MMAs;
- the rescale of O sits behind the vote: on the path through it the chunk multiplies every O element by alpha;
- the native-FP8 flag set is refused at compile time (its fp32 accumulator keeps fewer bits; attn_mma_wide.cuh).
The numerics (fp32 sums in another order) are the GPU tier's: tests/test_mma_variants_gpu.py gates the variant
against the emulation.
"""
import collections
import re
import subprocess

from vc_attention.kernels import jit, mma_variants

from .test_clamp_bound_sass import nvdisasm, pytestmark, sass_loop_mix  # noqa: F401  (pytestmark: nvcc + nvdisasm)
from .test_cuda_compile import MAX_WIDE_SPILL_BYTES
from .test_mma_restore_after_sass import build as compile_sass


def build(tmp_path, source: str, flags, tag: str) -> tuple[dict, dict[str, int]]:
    """source's kernels for sm_90a: name -> SASS rows, name -> spill-store bytes (the restore-after test's compile)."""
    (tmp_path / tag).mkdir(exist_ok=True)
    kernels, spills, _ = compile_sass(tmp_path / tag, source, "9.0a", flags)
    return kernels, spills

DIRECT = "wide-i2fp-meanscaled-restoretile-after64-pvdirect-coalesced-viaf16"
FLAG = "-DVC_MMA_PV_DIRECT=1"
# =2, the via-f16 default: the same kernels but the head-dim-64 ones without V-Smooth, which keep the partial
DIRECT2 = "wide-i2fp-meanscaled-restoretile-after64-pvdirect2-coalesced-viaf16"
BASE = "wide-i2fp-meanscaled-restoretile-after64-coalesced-viaf16"


def trip(rows, anys_fail: bool) -> collections.Counter:
    return collections.Counter(sass_loop_mix.opcode(ins).split(".")[0] for ins in
                               sass_loop_mix.hot_loop(rows, any_back_branch=True, votes_pass=True, anys_fail=anys_fail))


def test_the_variants_are_the_build_before_plus_the_flag():
    for name, flag in ((DIRECT, FLAG), (DIRECT2, "-DVC_MMA_PV_DIRECT=2")):
        flags = mma_variants.flags(name)
        assert flag in flags and "-DVC_MMA_E4M3_VIA_F16=1" in flags
        assert tuple(f for f in flags if f != flag) == mma_variants.flags(BASE)


def test_the_via_f16_fp32_builds_take_it_and_no_other():
    for arch in ("9.0a", "10.0a"):  # no FP8 mma.sync: the f16 MMAs' fp32 accumulator
        # (since docs/kernel-notes.md 46 with the head-dim-64 V-Smooth kernels bounded: tests/test_mma_d64_bound_sass.py)
        # (and since 48 with V in f16 for the head-dim-128 INT8 V-Smooth kernels: tests/test_mma_v128_f16_sass.py)
        # (and since 50 with its ring depth per kernel: tests/test_mma_stages_per_kernel_sass.py)
        assert mma_variants.flags(DIRECT2) + ("-DVC_MMA_D64_VSMOOTH_MIN_BLOCKS=3", "-DVC_MMA_V_F16=2", "-DVC_MMA_EXPCAST_STAGES=3",
                                              "-DVC_MMA_D64_VSMOOTH_STAGES=4") == mma_variants.flags(mma_variants.default_variant(arch))
        flags = mma_variants.flags(mma_variants.default_variant(arch, "fp32+fp16"))  # the fp16 partial stays
        assert not any(f.startswith("-DVC_MMA_PV_DIRECT=") for f in flags)
    for arch in ("8.9", "12.0a"):  # native FP8 mma.sync
        for pv_accum in mma_variants.PV_ACCUMS:
            flags = mma_variants.flags(mma_variants.default_variant(arch, pv_accum))
            assert not any(f.startswith("-DVC_MMA_PV_DIRECT=") for f in flags)


def test_pv_straight_into_o_drops_the_fold(tmp_path):
    for source, d in (("attn_mma_d128.cu", 128), ("attn_mma_d64.cu", 64)):
        before_k, _ = build(tmp_path, source, mma_variants.flags(BASE), "base")
        after_k, after_spills = build(tmp_path, source, mma_variants.flags(DIRECT), "direct")
        default_k, _ = build(tmp_path, source, mma_variants.flags(DIRECT2), "direct2")
        for k in after_k:  # =2: =1's kernels, but the head-dim-64 ones without V-Smooth are the build's before
            keeps_partial = re.search(r"ILi64ELb[01]ELb[01]ELb0E", k) is not None
            assert default_k[k] == (before_k[k] if keeps_partial else after_k[k]), k
        assert set(before_k) == set(after_k) and len(after_k) == (10 if d == 128 else 8)
        o_elements = 2 * (d // 8) * 4  # per thread: two chains x d/8 n-tiles x 4
        # <D, FP8 QK, ExpCast, V-Smooth, K lanes>: the kernels without V-Smooth
        plain = [k for k in after_k if re.search(rf"ILi{d}ELb[01]ELb[01]ELb0E", k)]
        assert len(plain) == 4
        for k in plain:
            before, settled, moved = trip(before_k[k], False), trip(after_k[k], True), trip(after_k[k], False)
            assert settled["HMMA"] == before["HMMA"], k  # the same f16 MMAs, into O
            assert settled["FFMA"] + settled["FADD"] <= before["FFMA"] + before["FADD"] - o_elements, (k, before, settled)
            assert settled["VOTE"] >= 1, k
            assert moved["FMUL"] >= settled["FMUL"] + o_elements, (k, moved["FMUL"], settled["FMUL"])  # O *= alpha
        int8 = {k: b for k, b in after_spills.items() if re.search(rf"ILi{d}ELb0E", k)}
        assert int8 and max(int8.values()) <= MAX_WIDE_SPILL_BYTES, int8


def test_native_fp8_mma_refuses_the_flag(tmp_path):
    native = (*mma_variants.flags("wide-i2fp-meanscaled-restoretile-after-coalesced"), FLAG)
    cubin = tmp_path / "native.cubin"
    cmd = jit.nvcc_compile_only_command(jit.CSRC_DIR / "attn_mma_d64.cu", "8.9", cubin, extra_flags=native)
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert result.returncode != 0 and "VC_MMA_PV_DIRECT needs" in result.stderr, result.stderr[-2000:]
