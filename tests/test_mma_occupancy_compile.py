"""VC_MMA_D64_VSMOOTH_MIN_BLOCKS (a build-time variant of the portable kernel, kernels/csrc/attn_mma_wide.cuh): only the
head-dim-64 V-Smooth kernels take the launch bound of three CTAs per SM; every other kernel of the build keeps the
unbounded registers. Compile-only (nvcc, no GPU): ptxas's report per kernel.

The variant is timed with `python3 bench/mma_variants.py --variants V,V+-DVC_MMA_D64_VSMOOTH_MIN_BLOCKS=3` (docs/kernel-notes.md 31).
"""
import shutil
import subprocess

import pytest

from vc_attention.kernels import jit, mma_variants

from .test_cuda_compile import per_kernel

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")

BUILD = mma_variants.default_variant("8.9")  # the backend's build on Ada / consumer Blackwell, fp32 PV (on both archs)


def ptxas_report(tmp_path, source: str, arch: str, extra=()) -> dict[str, int]:
    """kernel name -> registers, from ptxas -v."""
    out = tmp_path / f"{source}-{jit.arch_code(arch)}.cubin"
    cmd = jit.nvcc_compile_only_command(jit.CSRC_DIR / source, arch, out,
                                        extra_flags=mma_variants.flags(BUILD) + tuple(extra) + ("-Xptxas=-v",))
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return per_kernel(result.stderr, r"Used (\d+) registers")


@pytest.mark.parametrize("arch", ["8.9", "9.0a"])
def test_only_the_head_dim_64_vsmooth_kernels_are_bounded(tmp_path, arch):
    regs = ptxas_report(tmp_path, "attn_mma_d64.cu", arch, ["-DVC_MMA_D64_VSMOOTH_MIN_BLOCKS=3"])
    bounded = {k: r for k, r in regs.items() if "occupied" in k}
    assert len(regs) == 8 and len(bounded) == 4, sorted(regs)
    # <QK format, ExpCast, V-Smooth>: the bounded ones are exactly the V-Smooth instantiations
    assert all(k.endswith("ELb1EEEvNS_10AttnParamsE") for k in bounded), sorted(bounded)
    assert all(r <= 65536 // (3 * 128) for r in bounded.values()), bounded
    assert max(r for k, r in regs.items() if k not in bounded) > 65536 // (3 * 128)


def test_without_the_flag_no_kernel_is_bounded(tmp_path):
    regs = ptxas_report(tmp_path, "attn_mma_d64.cu", "8.9")
    assert len(regs) == 8 and not any("occupied" in k for k in regs)


def test_head_dim_128_is_untouched(tmp_path):
    regs = ptxas_report(tmp_path, "attn_mma_d128.cu", "8.9", ["-DVC_MMA_D64_VSMOOTH_MIN_BLOCKS=3"])
    # 8 + the two K-lane kernels (INT8 V-Smooth, VCConfig.k_lane_scales), none bounded
    assert len(regs) == 10 and not any("occupied" in k for k in regs)
