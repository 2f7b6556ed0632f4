"""VC_MMA_CLAMP_BOUND (the portable kernel's default since section 35 of docs/kernel-notes.md; =0 builds the previous check): the speed
kernels skip the per-score clamp of a chunk whose codes cannot wrap (vc_p::expcast_int_no_wrap with the Q tile's
|score| bound). Compile-only (nvcc, no GPU): every kernel of the build compiles for the RTX target and the H200
proxy without a ptxas warning, with the same kernels, and the speed kernels' spills stay small.

SASS (docs/kernel-notes.md section 33, `bench/sass_loop_mix.py --any-back-branch --votes-pass`): sm_89 chunk trip of
the speed kernels 720 -> 642 instructions (head dim 64, V-Smooth), 949 -> 876 (128). Timed with
`python3 bench/mma_variants.py --variants V+-DVC_MMA_CLAMP_BOUND=0,V` on a GPU.
"""
import re
import shutil
import subprocess

import pytest

from vc_attention.kernels import jit, mma_v_f16, mma_variants

from .test_cuda_compile import per_kernel

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")

WITHOUT = "-DVC_MMA_CLAMP_BOUND=0"  # the previous check (row minima), what the default build is compared with


def report(tmp_path, source: str, arch: str, extra=()) -> str:
    build = mma_variants.default_variant(arch)
    out = tmp_path / f"{source}-{jit.arch_code(arch)}-{len(extra)}.cubin"
    cmd = jit.nvcc_compile_only_command(jit.CSRC_DIR / source, arch, out,
                                        extra_flags=mma_variants.flags(build) + tuple(extra) + ("-Xptxas=-v",))
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stderr


def spill_bound(kernel: str, arch: str) -> int:
    """Spill bytes a speed kernel of the default build may store: 160, or 256 for a kernel that reads V in f16 (the
    via-f16 default's head-dim-128 V-Smooth ones since docs/kernel-notes.md 48: 224-228 B, timed faster than the
    build before it with its 60 B, Wan2.1-1.3B speed 15.72 -> 15.29 ms on an H100)."""
    d, vsmooth = int(re.search(r"ILi(\d+)E", kernel).group(1)), re.search(r"ILi\d+ELb0ELb1ELb1E", kernel) is not None
    f16_v = mma_v_f16.takes_v_f16(mma_variants.flags(mma_variants.default_variant(arch)), d, False, vsmooth)
    return 256 if f16_v else 160


@pytest.mark.parametrize("source,arch", [("attn_mma_d64.cu", "8.9"), ("attn_mma_d128.cu", "8.9"),
                                         ("attn_mma_d128.cu", "9.0a")])
def test_the_bound_build_compiles_the_same_kernels_cleanly(tmp_path, source, arch):
    bound = report(tmp_path, source, arch)
    assert "warning" not in bound.lower(), bound[-3000:]
    spills = per_kernel(bound, r"(\d+) bytes spill stores")
    plain = per_kernel(report(tmp_path, source, arch, [WITHOUT]), r"(\d+) bytes spill stores")
    lanes = source == "attn_mma_d128.cu"  # + the two K-lane kernels (INT8 V-Smooth at head dim 128)
    assert set(spills) == set(plain) and len(spills) == (10 if lanes else 8)
    # <D, FP8 QK, ExpCast, V-Smooth, K lanes>: only the INT8 speed kernels change; theirs stay within a few words
    speed = [k for k in spills if re.search(r"ILi\d+ELb0ELb1ELb[01]ELb[01]E", k)]
    assert len(speed) == (3 if lanes else 2) and all(spills[k] <= spill_bound(k, arch) for k in speed), {k: spills[k] for k in speed}
    assert all(spills[k] == plain[k] for k in spills if k not in speed)
