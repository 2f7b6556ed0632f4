"""VC_MMA_RESTORE_AFTER (a variant of the portable kernel, off by default; docs/kernel-notes.md section 43): the V-Smooth
mean restore after the chunk's PV loop in one warp-uniform branch instead of one branch per column pair inside it.

Compile-only (nvcc + nvdisasm, no GPU): on sm_89 (RTX 40, native FP8 mma.sync) the variant compiles cleanly with the
same kernels, the V-Smooth kernels' chunk loses the per-pair branches (22 -> 8 BRA along the fall-through path of
INT8 fidelity, 27 -> 13 of speed, counted in section 43), the kernels without V-Smooth are untouched, and no INT8 kernel
spills past the bound of the variant builds (tests/test_cuda_compile.MAX_WIDE_SPILL_BYTES). Timed with
`python3 bench/mma_variants.py --variants V,V+-DVC_MMA_RESTORE_AFTER=1` on a GPU (bench/device_run.sh `restore`).
"""
import collections
import re
import subprocess

import pytest

from vc_attention.kernels import jit, mma_variants

from .test_clamp_bound_sass import nvdisasm, pytestmark, sass_loop_mix  # noqa: F401  (pytestmark: nvcc + nvdisasm)
from .test_cuda_compile import MAX_WIDE_SPILL_BYTES, per_kernel

FLAG = "-DVC_MMA_RESTORE_AFTER=1"


def build(tmp_path, arch: str, flags) -> tuple[str, dict[str, int]]:
    """The SASS of attn_mma_d128.cu for `arch` with `flags`, and its kernels' spill-store bytes (ptxas -v)."""
    cubin = tmp_path / f"d128-{jit.arch_code(arch)}-{len(flags)}.cubin"
    cmd = jit.nvcc_compile_only_command(jit.CSRC_DIR / "attn_mma_d128.cu", arch, cubin, extra_flags=(*flags, "-Xptxas=-v"))
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "warning" not in result.stderr.lower(), result.stderr[-3000:]
    sass = subprocess.run([nvdisasm(), "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
    return sass, per_kernel(result.stderr, r"(\d+) bytes spill stores")


def chunk_opcodes(sass: str) -> dict[str, collections.Counter]:
    """kernel name -> opcode counts of one chunk trip along the fall-through path."""
    return {name: collections.Counter(sass_loop_mix.opcode(ins) for ins in
                                      sass_loop_mix.hot_loop(rows, any_back_branch=True, votes_pass=True))
            for name, rows in sass_loop_mix.functions(sass).items() if "wide_kernel" in name}


def test_the_restore_after_the_pv_loop_drops_the_per_pair_branches_on_sm89(tmp_path):
    flags = mma_variants.flags(mma_variants.default_variant("8.9"))
    default_sass, default_spills = build(tmp_path, "8.9", flags)
    after_sass, after_spills = build(tmp_path, "8.9", (*flags, FLAG))
    default, after = chunk_opcodes(default_sass), chunk_opcodes(after_sass)
    assert set(default) == set(after) and len(default) == 10
    # <D, FP8 QK, ExpCast, V-Smooth, K lanes>
    vsmooth = [k for k in default if re.search(r"ILi128ELb0ELb[01]ELb1ELb[01]E", k)]
    plain = [k for k in default if re.search(r"ILi128ELb[01]ELb[01]ELb0E", k)]
    assert len(vsmooth) == 4 and len(plain) == 4
    for k in vsmooth:  # one branch around the restore instead of one per column pair (and the restore falls through)
        assert after[k]["BRA"] <= default[k]["BRA"] - 12, (k, default[k]["BRA"], after[k]["BRA"])
        assert after[k]["FFMA"] >= default[k]["FFMA"] + 128, (k, default[k]["FFMA"], after[k]["FFMA"])
    for k in plain:  # no V-Smooth: no restore, the same machine code
        assert after[k] == default[k], k
    int8 = {k: b for k, b in after_spills.items() if re.search(r"ILi128ELb0E", k)}
    assert len(int8) == 6 and max(int8.values()) <= MAX_WIDE_SPILL_BYTES, int8
