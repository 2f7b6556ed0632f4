"""The 3-stage ring in the head-dim-64 kernels only (VC_MMA_D64_STAGES=3, the `-d64s3-` build, docs/kernel-notes.md 48)
is, kernel for kernel, the builds it combines.

Compile-only (nvcc + nvdisasm, no GPU), sm_90a: its head-dim-64 kernels are those of the `-s3-` build (every kernel on
a 3-stage ring), its head-dim-128 kernels those of the default it extends, machine code for machine code; so the times
of `bash bench/device_run.sh build stages` (the default and `-s3-`) are its times at each head dim.
"""
from vc_attention.kernels import mma_variants

from .test_clamp_bound_sass import nvdisasm, pytestmark, sass_loop_mix  # noqa: F401  (pytestmark: nvcc + nvdisasm)
from .test_mma_v128_f16_sass import compiled_kernels

DEFAULT = "wide-i2fp-meanscaled-restoretile-after64-pvdirect2-d64vs3-v128f16-coalesced-viaf16"
EVERY = "wide-i2fp-meanscaled-restoretile-after64-pvdirect2-d64vs3-v128f16-s3-coalesced-viaf16"
D64_ONLY = "wide-i2fp-meanscaled-restoretile-after64-pvdirect2-d64vs3-v128f16-d64s3-coalesced-viaf16"


def test_the_flags():
    assert mma_variants.flags(EVERY) == (*mma_variants.flags(DEFAULT), "-DVC_MMA_STAGES=3")
    assert mma_variants.flags(D64_ONLY) == (*mma_variants.flags(DEFAULT), "-DVC_MMA_D64_STAGES=3")


def test_each_kernel_is_one_of_the_timed_ones(tmp_path):
    jobs = [("attn_mma_d64.cu", D64_ONLY), ("attn_mma_d64.cu", EVERY), ("attn_mma_d64.cu", DEFAULT),
            ("attn_mma_d128.cu", D64_ONLY), ("attn_mma_d128.cu", DEFAULT)]
    code = compiled_kernels(tmp_path, jobs)
    d64 = code[("attn_mma_d64.cu", D64_ONLY)]
    assert len(d64) == 8
    assert d64 == code[("attn_mma_d64.cu", EVERY)]
    assert all(rows != code[("attn_mma_d64.cu", DEFAULT)][key] for key, rows in d64.items())  # the ring depth shows
    assert code[("attn_mma_d128.cu", D64_ONLY)] == code[("attn_mma_d128.cu", DEFAULT)]
