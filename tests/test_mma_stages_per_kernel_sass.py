"""The per-kernel ring depths (attn_mma_wide.cuh's wide_stages: VC_MMA_EXPCAST_STAGES, VC_MMA_D64_VSMOOTH_STAGES,
VC_MMA_D64_STAGES, docs/kernel-notes.md 48-49) give each kernel exactly the machine code of the build that runs every
kernel at that depth.

Compile-only (nvcc + nvdisasm, no GPU), sm_90a. For each per-kernel build, each kernel's depth follows `ring_depth`
below (the rule restated, first match wins) and its code is that of the two-stage build (the default until section
50), `-s3-` or the two-stage build with VC_MMA_STAGES=4, kernel for kernel; so the times of `bash bench/device_run.sh build stages` (those three builds at
each shape) are each kernel's times, and the rule provably reaches the kernels it names and no others.
"""
import re

import pytest

from vc_attention.kernels import mma_variants

from .test_clamp_bound_sass import nvdisasm, pytestmark, sass_loop_mix  # noqa: F401  (pytestmark: nvcc + nvdisasm)
from .test_mma_v128_f16_sass import compiled_kernels

TWO = "wide-i2fp-meanscaled-restoretile-after64-pvdirect2-d64vs3-v128f16-coalesced-viaf16"
EVERY3 = "wide-i2fp-meanscaled-restoretile-after64-pvdirect2-d64vs3-v128f16-s3-coalesced-viaf16"
EVERY4 = TWO + "+-DVC_MMA_STAGES=4"
D64 = "wide-i2fp-meanscaled-restoretile-after64-pvdirect2-d64vs3-v128f16-d64s3-coalesced-viaf16"
EXPCAST = "wide-i2fp-meanscaled-restoretile-after64-pvdirect2-d64vs3-v128f16-xs3-coalesced-viaf16"
EXPCAST_D64_VSMOOTH = "wide-i2fp-meanscaled-restoretile-after64-pvdirect2-d64vs3-v128f16-xs3-d64vss4-coalesced-viaf16"
UNIFORM = {2: TWO, 3: EVERY3, 4: EVERY4}


def _flag(flags, name) -> int:
    values = [int(f.split("=")[1]) for f in flags if f.startswith(f"-D{name}=")]
    return values[-1] if values else 0


def ring_depth(flags, d: int, expcast: bool, vsmooth: bool) -> int:
    """wide_stages(d, expcast, vsmooth) of a build with these -D flags."""
    for rule, applies in (("VC_MMA_EXPCAST_STAGES", expcast), ("VC_MMA_D64_VSMOOTH_STAGES", d == 64 and vsmooth),
                          ("VC_MMA_D64_STAGES", d == 64)):
        if applies and _flag(flags, rule):
            return _flag(flags, rule)
    return _flag(flags, "VC_MMA_STAGES") or 2


def kernel_depths(flags, kernels: dict):
    """(key, SASS rows, ring depth) of each kernel of a build with these -D flags (keys as compiled_kernels gives them:
    <D, FP8 QK, ExpCast, V-Smooth[, K lanes]>)."""
    for key, rows in kernels.items():
        d = int(re.search(r"ILi(\d+)", key).group(1))
        bits = re.findall(r"Lb([01])", key)  # FP8 QK, ExpCast, V-Smooth[, K lanes]
        yield key, rows, ring_depth(flags, d, bits[1] == "1", bits[2] == "1")


def test_the_via_f16_fp32_default_is_the_timed_per_kernel_build():
    # adopted in docs/kernel-notes.md 50 (bench/results/nvidia-h100-mma-xs3-*.json)
    for arch in mma_variants.VIA_F16_ARCHS:
        assert mma_variants.default_variant(arch) == EXPCAST_D64_VSMOOTH


def test_the_flags():
    base = mma_variants.flags(TWO)
    assert mma_variants.flags(EVERY3) == (*base, "-DVC_MMA_STAGES=3")
    assert mma_variants.flags(D64) == (*base, "-DVC_MMA_D64_STAGES=3")
    assert mma_variants.flags(EXPCAST) == (*base, "-DVC_MMA_EXPCAST_STAGES=3")
    assert mma_variants.flags(EXPCAST_D64_VSMOOTH) == (*base, "-DVC_MMA_EXPCAST_STAGES=3", "-DVC_MMA_D64_VSMOOTH_STAGES=4")


@pytest.mark.parametrize("source,builds,depths", [
    ("attn_mma_d64.cu", (D64, EXPCAST, EXPCAST_D64_VSMOOTH), (2, 3, 4)),
    ("attn_mma_d128.cu", (D64, EXPCAST, EXPCAST_D64_VSMOOTH), (2, 3)),
])
def test_each_kernel_is_the_uniform_build_of_its_depth(tmp_path, source, builds, depths):
    code = compiled_kernels(tmp_path, [(source, name) for name in (*builds, *(UNIFORM[n] for n in depths))])
    seen = set()
    for name in builds:
        flags = mma_variants.flags(name)
        ours = code[(source, name)]
        assert len(ours) >= 8, name
        for key, rows, depth in kernel_depths(flags, ours):
            assert rows == code[(source, UNIFORM[depth])][key], (name, key, depth)
            seen.add((name, key, depth))
    # the rules reached kernels at more than one depth in each source, and the depths tell apart (the check can fail)
    assert {depth for _, _, depth in seen} == set(depths)
    for a in depths:
        for b in depths:
            if a < b:
                assert code[(source, UNIFORM[a])] != code[(source, UNIFORM[b])]
