"""The f16 V of the head-dim-128 INT8 V-Smooth kernels only (VC_MMA_V_F16=2, the `-v128f16-` build, docs/kernel-notes.md
48) is, kernel for kernel, the timed builds it combines.

Compile-only (nvcc + nvdisasm, no GPU), sm_90a: its head-dim-128 INT8 V-Smooth kernels (fidelity and speed, with and
without K scales per lane) are those of the `-vf16-` build (every kernel on f16 V), every other kernel at both head dims
that of the `-d64vs3-` build it extends, machine code for machine code. Their times (H100): the two builds it combines
in one run, bench/results/nvidia-h100-mma-vf16-*.json, and itself beside `-d64vs3-`, -mma-v128f16-*.json.
"""
import re
from concurrent.futures import ThreadPoolExecutor

from vc_attention.bench.mma_variants import variant_flags
from vc_attention.kernels import mma_v_f16, mma_variants

from .test_clamp_bound_sass import nvdisasm, pytestmark, sass_loop_mix  # noqa: F401  (pytestmark: nvcc + nvdisasm)
from .test_mma_restore_after_sass import build as compile_sass

BASE = "wide-i2fp-meanscaled-restoretile-after64-pvdirect2-d64vs3-coalesced-viaf16"
EVERY = "wide-i2fp-meanscaled-restoretile-after64-pvdirect2-d64vs3-vf16-coalesced-viaf16"
D128_ONLY = "wide-i2fp-meanscaled-restoretile-after64-pvdirect2-d64vs3-v128f16-coalesced-viaf16"


def test_the_flags():
    assert mma_variants.flags(D128_ONLY) == (*mma_variants.flags(BASE), mma_v_f16.D128_VSMOOTH_FLAG)
    assert mma_variants.flags(EVERY) == (*mma_variants.flags(BASE), mma_v_f16.FLAG)


def _code(kernels: dict) -> dict:
    """<D, FP8 QK, ExpCast, V-Smooth[, K lanes]> -> SASS rows, blanks collapsed and local labels unnumbered (the
    numbering runs across the file's kernels, so it shifts where an earlier kernel changed)"""
    def key(name):
        return re.search(r"ILi\d+E(?:Lb[01]E)+", name).group(0)
    return {key(name): [(a, re.sub(r"\.L_x_\d+", ".L", " ".join(ins.split()))) for a, ins in rows]
            for name, rows in kernels.items()}


def compiled_kernels(tmp_path, jobs) -> dict:
    """(source, variant) -> _code of its sm_90a kernels, two compiles at a time (a variant may add flags:
    `NAME+-DFLAG=V`, bench/mma_variants.variant_flags)."""
    def one(job):
        source, name = job
        folder = tmp_path / f"{name}-{source}"
        folder.mkdir()
        return job, _code(compile_sass(folder, source, "9.0a", variant_flags(name))[0])

    with ThreadPoolExecutor(2) as pool:
        return dict(pool.map(one, jobs))


def test_each_kernel_is_one_of_the_timed_ones(tmp_path):
    jobs = [(source, name) for source in ("attn_mma_d64.cu", "attn_mma_d128.cu") for name in (D128_ONLY, BASE)]
    jobs.append(("attn_mma_d128.cu", EVERY))
    code = compiled_kernels(tmp_path, jobs)
    f16_kernels = []
    for source in ("attn_mma_d64.cu", "attn_mma_d128.cu"):
        ours = code[(source, D128_ONLY)]
        assert len(ours) >= 8
        for key, rows in ours.items():
            d, fp8, vsmooth = int(re.search(r"ILi(\d+)", key).group(1)), key.split("E")[1] == "Lb1", key.split("E")[3] == "Lb1"
            takes = mma_v_f16.takes_v_f16(mma_variants.flags(D128_ONLY), d, fp8, vsmooth)
            want = code[(source, EVERY if takes else BASE)][key]
            assert rows == want, (source, key, takes)
            if takes:
                f16_kernels.append(key)
                assert rows != code[(source, BASE)][key], key  # the comparison can tell the two V forms apart
    # fidelity and speed, each with and without K scales per lane
    assert sorted(f16_kernels) == sorted(["ILi128ELb0ELb0ELb1ELb0E", "ILi128ELb0ELb0ELb1ELb1E",
                                          "ILi128ELb0ELb1ELb1ELb0E", "ILi128ELb0ELb1ELb1ELb1E"]), f16_kernels
