"""VC_MMA_RESTORE_AFTER (docs/kernel-notes.md sections 43-44): the portable kernel's V-Smooth mean restore after the
chunk's PV loop in one warp-uniform branch instead of one branch per column pair inside it. The default builds take it
since section 44: =1 (every head dim) on the native-FP8 archs (sm_89, sm_120a), =2 (head dim 64 only) on the via-f16
ones (sm_90a, sm_100a), where at head dim 128 it spilled 448 / 484 B instead of 80 / 120 B and did not gain. Since
section 45 the via-f16 fp32 build also takes PV straight into O (VC_MMA_PV_DIRECT, which restores after the loop at every
head dim: tests/test_mma_pv_direct_sass.py); the sm_90a check below is on the build without it (VIA_F16_AFTER64).

Compile-only (nvcc + nvdisasm, no GPU), each build against the same flags without VC_MMA_RESTORE_AFTER:
- sm_89 (RTX 40, native FP8 mma.sync), head dim 128: the same kernels, the V-Smooth kernels' chunk loses the per-pair
  branches (22 -> 8 BRA along the fall-through path of INT8 fidelity, 27 -> 13 of speed, counted in section 43), the
  kernels without V-Smooth are untouched, and no INT8 kernel spills past the bound of the variant builds
  (tests/test_cuda_compile.MAX_WIDE_SPILL_BYTES).
- sm_90a (the H100/H200 build, FP8 through f16): head dim 128 is the same machine code, kernel by kernel, with the
  same ptxas report; head dim 64's V-Smooth kernels lose the per-pair branches (16 -> 10 BRA in INT8 fidelity's chunk)
  and its other kernels are untouched.
Timed with `python3 bench/mma_variants.py --variants V,V+-DVC_MMA_RESTORE_AFTER=1` on a GPU (bench/device_run.sh
`restore`, V the build without the flag).
"""
import collections
import re
import subprocess

import pytest

from vc_attention.kernels import jit, mma_variants

from .test_clamp_bound_sass import nvdisasm, pytestmark, sass_loop_mix  # noqa: F401  (pytestmark: nvcc + nvdisasm)
from .test_cuda_compile import MAX_WIDE_SPILL_BYTES, per_kernel

FLAG = "-DVC_MMA_RESTORE_AFTER=1"
PV_DIRECT = "-DVC_MMA_PV_DIRECT="
# the via-f16 build with the restore after the loop at head dim 64 only: the default until section 45 took PV straight into
# O on top of it (which restores after the loop at every head dim; tests/test_mma_pv_direct_sass.py)
VIA_F16_AFTER64 = "wide-i2fp-meanscaled-restoretile-after64-coalesced-viaf16"


def without_restore_after(flags) -> tuple[str, ...]:
    """`flags` without any -DVC_MMA_RESTORE_AFTER=...: the restore inside the PV fold (the header's default)."""
    return tuple(f for f in flags if not f.startswith("-DVC_MMA_RESTORE_AFTER="))


def default_flags(arch: str) -> tuple[str, ...]:
    return mma_variants.flags(mma_variants.default_variant(arch))


def build(tmp_path, source: str, arch: str, flags) -> tuple[dict, dict[str, int], str]:
    """source's kernels compiled for `arch` with `flags`: name -> SASS rows (sass_loop_mix.functions), name ->
    spill-store bytes (ptxas -v), and ptxas's report."""
    cubin = tmp_path / f"{source}-{jit.arch_code(arch)}-{len(flags)}.cubin"  # (the builds compared differ in length)
    cmd = jit.nvcc_compile_only_command(jit.CSRC_DIR / source, arch, cubin, extra_flags=(*flags, "-Xptxas=-v"))
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "warning" not in result.stderr.lower(), result.stderr[-3000:]
    sass = subprocess.run([nvdisasm(), "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
    kernels = {name: rows for name, rows in sass_loop_mix.functions(sass).items() if "wide_kernel" in name}
    return kernels, per_kernel(result.stderr, r"(\d+) bytes spill stores"), result.stderr


def chunk_opcodes(kernels: dict) -> dict[str, collections.Counter]:
    """kernel name -> opcode counts of one chunk trip along the fall-through path."""
    return {name: collections.Counter(sass_loop_mix.opcode(ins) for ins in
                                      sass_loop_mix.hot_loop(rows, any_back_branch=True, votes_pass=True))
            for name, rows in kernels.items()}


def ptxas_lines(report: str) -> list[str]:
    """ptxas's report per kernel (registers, stack, spills), without its compile times."""
    return [line for line in report.splitlines()
            if (line.startswith("ptxas info") or "bytes stack frame" in line) and "Compile time" not in line]


def test_the_default_builds_restore_after_the_pv_loop():
    for pv_accum in mma_variants.PV_ACCUMS:
        for arch in ("8.9", "12.0a"):  # native FP8 mma.sync: every head dim
            assert "-DVC_MMA_RESTORE_AFTER=1" in mma_variants.flags(mma_variants.default_variant(arch, pv_accum))
        for arch in mma_variants.VIA_F16_ARCHS:  # FP8 through f16: head dim 64 only
            assert "-DVC_MMA_RESTORE_AFTER=2" in mma_variants.flags(mma_variants.default_variant(arch, pv_accum))
        for arch in ("8.9", "9.0a", "10.0a", "12.0a"):  # the flag is all that sets them apart from the builds before
            flags = mma_variants.flags(mma_variants.default_variant(arch, pv_accum))
            # (the via-f16 fp32 build since section 45 also sends PV straight into O and since section 46 bounds its
            # head-dim-64 V-Smooth kernels)
            # (and since 48 hands its head-dim-128 INT8 V-Smooth kernels V in f16, since 50 sets its ring depth per kernel)
            later = tuple(f for f in flags if f.startswith((PV_DIRECT, "-DVC_MMA_D64_VSMOOTH_MIN_BLOCKS=", "-DVC_MMA_V_F16=",
                                                              "-DVC_MMA_EXPCAST_STAGES=", "-DVC_MMA_D64_VSMOOTH_STAGES=")))
            before = without_restore_after(tuple(f for f in flags if f not in later))
            assert before in mma_variants.VARIANTS.values() and len(flags) == len(before) + 1 + len(later)


def test_the_restore_after_the_pv_loop_drops_the_per_pair_branches_on_sm89(tmp_path):
    after_flags = default_flags("8.9")
    assert FLAG in after_flags
    before_kernels, _, _ = build(tmp_path, "attn_mma_d128.cu", "8.9", without_restore_after(after_flags))
    after_kernels, after_spills, _ = build(tmp_path, "attn_mma_d128.cu", "8.9", after_flags)
    before, after = chunk_opcodes(before_kernels), chunk_opcodes(after_kernels)
    assert set(before) == set(after) and len(before) == 10
    # <D, FP8 QK, ExpCast, V-Smooth, K lanes>
    vsmooth = [k for k in before if re.search(r"ILi128ELb0ELb[01]ELb1ELb[01]E", k)]
    plain = [k for k in before if re.search(r"ILi128ELb[01]ELb[01]ELb0E", k)]
    assert len(vsmooth) == 4 and len(plain) == 4
    for k in vsmooth:  # one branch around the restore instead of one per column pair (and the restore falls through)
        assert after[k]["BRA"] <= before[k]["BRA"] - 12, (k, before[k]["BRA"], after[k]["BRA"])
        assert after[k]["FFMA"] >= before[k]["FFMA"] + 128, (k, before[k]["FFMA"], after[k]["FFMA"])
    for k in plain:  # no V-Smooth: no restore, the same machine code
        assert after[k] == before[k], k
    int8 = {k: b for k, b in after_spills.items() if re.search(r"ILi128ELb0E", k)}
    assert len(int8) == 6 and max(int8.values()) <= MAX_WIDE_SPILL_BYTES, int8


def test_the_via_f16_build_restores_after_the_pv_loop_at_head_dim_64_only(tmp_path):
    after_flags = mma_variants.flags(VIA_F16_AFTER64)
    assert "-DVC_MMA_RESTORE_AFTER=2" in after_flags and "-DVC_MMA_E4M3_VIA_F16=1" in after_flags
    before_flags = without_restore_after(after_flags)
    # head dim 128: the build without the flag, instruction for instruction (its =1 spilled 448 / 484 B, section 44)
    before_128, _, before_report = build(tmp_path, "attn_mma_d128.cu", "9.0a", before_flags)
    after_128, _, after_report = build(tmp_path, "attn_mma_d128.cu", "9.0a", after_flags)
    assert set(before_128) == set(after_128) and len(before_128) == 10
    for k in before_128:
        assert after_128[k] == before_128[k], k
    assert ptxas_lines(after_report) == ptxas_lines(before_report)
    assert sum("Used" in line and "registers" in line for line in ptxas_lines(after_report)) == 10
    # head dim 64: the V-Smooth kernels' chunk drops the per-pair branches (4 column pairs) and takes the restore's
    # 64 FFMA inline; the others are the same machine code
    before_64, _, _ = build(tmp_path, "attn_mma_d64.cu", "9.0a", before_flags)
    after_64, after_spills, _ = build(tmp_path, "attn_mma_d64.cu", "9.0a", after_flags)
    assert set(before_64) == set(after_64) and len(before_64) == 8
    before, after = chunk_opcodes(before_64), chunk_opcodes(after_64)
    vsmooth = [k for k in before if re.search(r"ILi64ELb[01]ELb[01]ELb1E", k)]  # both QK formats
    plain = [k for k in before if re.search(r"ILi64ELb[01]ELb[01]ELb0E", k)]
    assert len(vsmooth) == 4 and len(plain) == 4
    for k in vsmooth:  # 16 -> 10 BRA in INT8 fidelity when counted
        assert after[k]["BRA"] <= before[k]["BRA"] - 4, (k, before[k]["BRA"], after[k]["BRA"])
        assert after[k]["FFMA"] >= before[k]["FFMA"] + 64, (k, before[k]["FFMA"], after[k]["FFMA"])
    for k in plain:
        assert after_64[k] == before_64[k], k
    # head dim 64 keeps its registers: INT8 kernels 0 -> 4 B at most when counted (section 44), 20 B (fidelity) and 16 B
    # (speed without V-Smooth) with section 45's per-thread ldmatrix addresses: a few L1-resident words
    int8 = {k: b for k, b in after_spills.items() if re.search(r"ILi64ELb0E", k)}
    assert len(int8) == 4 and max(int8.values()) <= 24, int8
