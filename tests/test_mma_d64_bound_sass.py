"""The via-f16 default's head-dim-64 V-Smooth kernels at three CTAs per SM (VC_MMA_D64_VSMOOTH_MIN_BLOCKS=3,
docs/kernel-notes.md 46): the `-d64vs3-` build is, kernel for kernel, the timed builds it combines.

Compile-only (nvcc + nvdisasm, no GPU), sm_90a: its fidelity and speed kernels (INT8 and FP8 QK) are those of the
`-d64x3-` build (every head-dim-64 kernel bounded, Q read from shared memory), its other head-dim-64 kernels and every
head-dim-128 kernel those of the `-pvdirect2-` build it extends, machine code for machine code; the bounded ones fit
three CTAs of 128 threads per SM. Their times: bench/results/nvidia-h100-mma-candidates-d64.json.
"""
import re

from vc_attention.kernels import mma_variants

from .test_clamp_bound_sass import nvdisasm, pytestmark, sass_loop_mix  # noqa: F401  (pytestmark: nvcc + nvdisasm)
from .test_cuda_compile import per_kernel
from .test_mma_restore_after_sass import build as compile_sass

DEFAULT = "wide-i2fp-meanscaled-restoretile-after64-pvdirect2-d64vs3-coalesced-viaf16"
ALL_BOUND = "wide-i2fp-meanscaled-restoretile-after64-pvdirect2-d64x3-coalesced-viaf16"
BASE = "wide-i2fp-meanscaled-restoretile-after64-pvdirect2-coalesced-viaf16"


def test_it_is_the_via_f16_fp32_default_but_for_the_f16_v_and_the_ring_depths():
    # (since docs/kernel-notes.md 48 the default also hands its head-dim-128 INT8 V-Smooth kernels V in f16, which
    # leaves every head-dim-64 kernel as it is: tests/test_mma_v128_f16_sass.py; since 50 its ExpCast kernels run a
    # 3-stage ring and its head-dim-64 V-Smooth kernels a 4-stage one: tests/test_mma_stages_per_kernel_sass.py)
    for arch in mma_variants.VIA_F16_ARCHS:
        assert mma_variants.flags(mma_variants.default_variant(arch)) == (
            *mma_variants.flags(DEFAULT), "-DVC_MMA_V_F16=2", "-DVC_MMA_EXPCAST_STAGES=3", "-DVC_MMA_D64_VSMOOTH_STAGES=4")
    assert mma_variants.flags(DEFAULT) == (*mma_variants.flags(BASE), "-DVC_MMA_D64_VSMOOTH_MIN_BLOCKS=3")


def _code(kernels: dict) -> dict:
    """<D, FP8 QK, ExpCast, V-Smooth> -> SASS rows (blanks collapsed: nvdisasm pads its comments to the kernel name's
    length), whichever launch-bound copy the kernel is"""
    return {re.search(r"ILi\d+E(?:Lb[01]E){3}", name).group(0): [(a, " ".join(ins.split())) for a, ins in rows]
            for name, rows in kernels.items()
            if not re.search(r"ILi\d+E(?:Lb[01]E){3}Lb1E", name)}  # (not the K-lane kernels: head dim 128's, unbounded)


def test_the_bounded_kernels_are_the_timed_ones(tmp_path):
    for source in ("attn_mma_d64.cu", "attn_mma_d128.cu"):
        builds = {}
        for name in (DEFAULT, ALL_BOUND, BASE):
            (tmp_path / name).mkdir(exist_ok=True)
            kernels, _, report = compile_sass(tmp_path / name, source, "9.0a", mma_variants.flags(name))
            builds[name] = (kernels, _code(kernels), report)
        kernels, code, report = builds[DEFAULT]
        assert len(code) == 8
        for key, rows in code.items():
            vsmooth = source == "attn_mma_d64.cu" and key.endswith("Lb1E")
            assert rows == builds[ALL_BOUND if vsmooth else BASE][1][key], (source, key)
        bounded = [k for k in kernels if "occupied" in k]
        assert len(bounded) == (4 if source == "attn_mma_d64.cu" else 0), sorted(kernels)
        regs = per_kernel(report, r"Used (\d+) registers")
        assert all(regs[k] <= 65536 // (3 * 128) for k in bounded), regs
