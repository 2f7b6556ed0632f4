"""Row sums from f16 adds in the head-dim-64 kernels without V-Smooth (VC_MMA_ROW_SUM_ADD, the `-rsadd-` build,
docs/kernel-notes.md 51) take the ones-column MMA out of their chunk and change nothing else.

Compile-only (nvcc + nvdisasm, no GPU), sm_90a. In `-rsadd-` the head-dim-64 plain kernels (INT8 and FP8 QK, with and
without ExpCast) run 8 fewer HMMA per chunk trip (the row sums' 2 per k-step and chain) and add the shares with HADD2;
every V-Smooth kernel and every head-dim-128 kernel is the default's machine code (at head dim 128 the shares'
registers made the plain kernel spill, so the flag stops at 64). `-rsadd2-` (=2) takes the MMA out of the head-dim-64
V-Smooth kernels too (their restore adds the quad's shares first). Its output against the emulation: the variant tier
(tests/test_mma_variants_gpu.py, `-k rsadd`).
"""
from vc_attention.kernels import mma_variants

from .test_clamp_bound_sass import nvdisasm, pytestmark, sass_loop_mix  # noqa: F401  (pytestmark: nvcc + nvdisasm)
from .test_mma_v128_f16_sass import compiled_kernels

BASE = "wide-i2fp-meanscaled-restoretile-after64-pvdirect2-d64vs3-v128f16-xs3-d64vss4"
DEFAULT = f"{BASE}-coalesced-viaf16"
RSADD = f"{BASE}-rsadd-coalesced-viaf16"
RSADD2 = f"{BASE}-rsadd2-coalesced-viaf16"  # also the head-dim-64 V-Smooth kernels


def test_the_flag():
    assert mma_variants.flags(RSADD) == (*mma_variants.flags(DEFAULT), "-DVC_MMA_ROW_SUM_ADD=1")
    assert mma_variants.flags(RSADD2) == (*mma_variants.flags(DEFAULT), "-DVC_MMA_ROW_SUM_ADD=2")


def _trip_ops(rows):
    trip = sass_loop_mix.hot_loop(rows, any_back_branch=True)
    assert trip, "no chunk loop found"
    return sass_loop_mix.mix(trip)[0]


def test_only_the_head_dim_64_kernels_each_build_names_lose_the_row_sum_mmas(tmp_path):
    sources = ("attn_mma_d64.cu", "attn_mma_d128.cu")
    code = compiled_kernels(tmp_path, [(source, name) for source in sources for name in (DEFAULT, RSADD, RSADD2)])
    for build, vsmooth_too in ((RSADD, False), (RSADD2, True)):
        changed = []
        for source in sources:
            ours, theirs = code[(source, build)], code[(source, DEFAULT)]
            assert ours.keys() == theirs.keys() and len(ours) >= 8
            for key, rows in ours.items():
                args = key.split("E")[1:]  # <D, FP8 QK, ExpCast, V-Smooth[, K lanes]> as Lb0 / Lb1
                if source == "attn_mma_d64.cu" and (args[3] == "Lb0" or vsmooth_too):
                    new, old = _trip_ops(rows), _trip_ops(theirs[key])
                    assert old["HMMA"] - new["HMMA"] == 8, (build, key, old["HMMA"], new["HMMA"])
                    assert new["HADD2"] - old["HADD2"] >= 4 * 7, (build, key, new["HADD2"])  # 7 adds per row and chain
                    changed.append(key)
                else:
                    assert rows == theirs[key], (build, source, key)
        # INT8 / FP8 QK x exp2 / ExpCast, and with -rsadd2- the same four with V-Smooth
        assert len(changed) == (8 if vsmooth_too else 4), (build, changed)
