"""VC_MMA_RESTORE_MMA (docs/kernel-notes.md section 46): the V-Smooth mean restore as TF32 MMAs over 8 restores.

Compile-only (nvcc + nvdisasm, no GPU), head dim 128, the via-f16 default (sm_90a) and the native-FP8 build (sm_89),
each `-restoremma-` variant against the build it extends:
- every V-Smooth kernel runs the m16n8k8 TF32 MMA, three per n-tile and chain of a flush (hi*hi + hi*lo + lo*hi), and
  no kernel without V-Smooth has one (their machine code is the build's before, instruction for instruction);
- the restore's FFMAs (one per O element, 128 per thread) leave the restore chunk: its fall-through trip, which also
  walks the flush of every eighth restore, has at least 100 FFMAs fewer;
- the means are no longer copied to shared memory per chunk (one cp.async fewer) but read at the flush (LDG).
The numerics (the restore's fp32 sums in another order, the tf32 split) are the GPU tier's: tests/test_mma_variants_gpu.py
gates the variants against the emulation and tests/test_mma_restore_mma_gpu.py against the build without the flag.
"""
import collections
import re

from vc_attention.kernels import mma_variants

from .test_clamp_bound_sass import nvdisasm, pytestmark, sass_loop_mix  # noqa: F401  (pytestmark: nvcc + nvdisasm)
from .test_cuda_compile import MAX_WIDE_SPILL_BYTES
from .test_mma_restore_after_sass import build as compile_sass

FLAG = "-DVC_MMA_RESTORE_MMA=1"
BUILDS = {"9.0a": "wide-i2fp-meanscaled-restoretile-after64-pvdirect2-coalesced-viaf16",
          "8.9": "wide-i2fp-meanscaled-restoretile-after-coalesced"}
TF32 = "HMMA.1688.F32.TF32"  # m16n8k8


def with_flag(base: str) -> str:
    return base.replace("-coalesced", "-restoremma-coalesced", 1)


def trip(rows) -> collections.Counter:
    return collections.Counter(sass_loop_mix.opcode(ins).split(".")[0] for ins in
                               sass_loop_mix.hot_loop(rows, any_back_branch=True, votes_pass=True))


def test_the_variants_are_the_build_before_plus_the_flag():
    for base in BUILDS.values():
        assert mma_variants.flags(with_flag(base)) == (*mma_variants.flags(base), FLAG)


def test_the_restore_runs_on_the_tensor_core(tmp_path):
    for arch, base in BUILDS.items():
        (tmp_path / arch).mkdir()
        before, _, _ = compile_sass(tmp_path / arch, "attn_mma_d128.cu", arch, mma_variants.flags(base))
        after, spills, _ = compile_sass(tmp_path / arch, "attn_mma_d128.cu", arch, mma_variants.flags(with_flag(base)))
        assert set(before) == set(after) and len(after) == 10
        # <D, FP8 QK, ExpCast, V-Smooth, K lanes>
        vsmooth = [k for k in after if re.search(r"ILi128ELb[01]ELb[01]ELb1E", k)]
        assert len(vsmooth) == 6, sorted(after)
        for k in after:
            tf32 = sum(TF32 in ins for _, ins in after[k])
            if k not in vsmooth:
                assert tf32 == 0 and after[k] == before[k], k
                continue
            # 16 n-tiles x 2 chains x 3 per flush, inlined three times: in the full chunk's body, in the tail chunk's and
            # the last group's after the loop
            assert tf32 == 3 * 96, (arch, k, tf32)
            old, new = trip(before[k]), trip(after[k])
            assert new["FFMA"] <= old["FFMA"] - 100, (arch, k, old["FFMA"], new["FFMA"])
            assert new["LDGSTS"] == old["LDGSTS"] - 1 and new["LDG"] >= 32, (arch, k, old, new)
        int8 = {k: b for k, b in spills.items() if re.search(r"ILi128ELb0E", k)}
        assert max(int8.values()) <= MAX_WIDE_SPILL_BYTES, int8
