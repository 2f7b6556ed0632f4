"""Per-stage mbarriers instead of the per-chunk barrier (VC_MMA_MBAR_RING, the `-mbar-` / `-mbar3-` builds,
docs/kernel-notes.md 50) reach the kernels with a ring of three or more stages, and only those.

Compile-only (nvcc + nvdisasm, no GPU), sm_90a, both head dims. In `-mbar-` (the via-f16 default plus the flag) a
kernel whose ring depth (attn_mma_wide.cuh's wide_stages, restated by tests/test_mma_stages_per_kernel_sass.ring_depth)
is 3 or 4 keeps a single BAR.SYNC (the one after the barriers' init) and waits on mbarriers (SYNCS.PHASECHK) that the
copies arrive on (ARRIVES.LDGSTSBAR); a kernel on the 2-stage ring is the default's, machine code for machine code.
In `-mbar3-` (every other kernel on a 3-stage ring too) every kernel takes the mbarriers.
"""
import re

import pytest

from vc_attention.kernels import mma_variants

from .test_clamp_bound_sass import nvdisasm, pytestmark, sass_loop_mix  # noqa: F401  (pytestmark: nvcc + nvdisasm)
from .test_mma_stages_per_kernel_sass import kernel_depths
from .test_mma_v128_f16_sass import compiled_kernels

BASE = "wide-i2fp-meanscaled-restoretile-after64-pvdirect2-d64vs3-v128f16-xs3-d64vss4"
DEFAULT = f"{BASE}-coalesced-viaf16"
MBAR = f"{BASE}-mbar-coalesced-viaf16"
MBAR3 = f"{BASE}-mbar3-coalesced-viaf16"


def test_the_flags():
    assert mma_variants.default_variant("9.0a") == DEFAULT
    assert mma_variants.flags(MBAR) == (*mma_variants.flags(DEFAULT), "-DVC_MMA_MBAR_RING=1")
    assert mma_variants.flags(MBAR3) == (*mma_variants.flags(MBAR), "-DVC_MMA_STAGES=3")


def count(rows, pattern: str) -> int:
    return sum(bool(re.search(pattern, text)) for _, text in rows)


@pytest.mark.parametrize("source", ["attn_mma_d64.cu", "attn_mma_d128.cu"])
def test_the_mbarriers_reach_the_deep_rings_only(tmp_path, source):
    code = compiled_kernels(tmp_path, [(source, name) for name in (DEFAULT, MBAR, MBAR3)])
    depths = {}
    for name in (MBAR, MBAR3):
        flags = mma_variants.flags(name)
        ours = code[(source, name)]
        assert len(ours) >= 8, name
        for key, rows, depth in kernel_depths(flags, ours):
            depths[(name, key)] = depth
            if depth >= 3:
                assert count(rows, r"\bBAR\.SYNC\b") == 1, (name, key)
                assert count(rows, r"SYNCS\.PHASECHK") >= 2 and count(rows, r"ARRIVES\.LDGSTSBAR") >= 1, (name, key)
                assert count(code[(source, DEFAULT)][key], r"SYNCS\.PHASECHK") == 0, key
            else:
                assert rows == code[(source, DEFAULT)][key], (name, key)
    # -mbar- has kernels of both kinds (the check can fail both ways), -mbar3- only deep rings
    assert {depths[k] >= 3 for k in depths if k[0] == MBAR} == {True, False}, depths
    assert all(depths[k] >= 3 for k in depths if k[0] == MBAR3), depths
