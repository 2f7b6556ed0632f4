"""One barrier per 128-key tile at head dim 64 (VC_MMA_TILE_BARRIER, the `-tb64-` / `-tb64all-` builds,
docs/kernel-notes.md 50) reaches the kernels it names, and only those, and there puts a tile's two chunks in one
branch-free stretch of machine code.

Compile-only (nvcc + nvdisasm, no GPU), sm_90a. `-tb64-` changes the head-dim-64 kernels without V-Smooth and leaves
every other kernel of both head dims the default's, machine code for machine code (`-tb64all-`: every head-dim-64
kernel); in the plain 8-bit kernel (INT8 QK, exp2 + cast, no V-Smooth: no warp vote inside a chunk) the longest
stretch without a branch holds 64 IMMAs and 144 HMMAs (two chunks' QK, PV and row sums) where the default's holds one
chunk's 32 and 72: the point of the flag is that ptxas may schedule the second chunk's QK beside the first chunk's
softmax and PV.
"""
import re

import pytest

from vc_attention.kernels import mma_variants

from .test_clamp_bound_sass import nvdisasm, pytestmark, sass_loop_mix  # noqa: F401  (pytestmark: nvcc + nvdisasm)
from .test_mma_v128_f16_sass import compiled_kernels

DEFAULT = "wide-i2fp-meanscaled-restoretile-after64-pvdirect2-d64vs3-v128f16-coalesced-viaf16"
PLAIN64 = "wide-i2fp-meanscaled-restoretile-after64-pvdirect2-d64vs3-v128f16-tb64-coalesced-viaf16"
EVERY64 = "wide-i2fp-meanscaled-restoretile-after64-pvdirect2-d64vs3-v128f16-tb64all-coalesced-viaf16"


def test_the_flags():
    base = mma_variants.flags(DEFAULT)
    assert mma_variants.flags(PLAIN64) == (*base, "-DVC_MMA_TILE_BARRIER=1")
    assert mma_variants.flags(EVERY64) == (*base, "-DVC_MMA_TILE_BARRIER=2")


def tile_barrier_kernel(name: str, key: str) -> bool:
    """attn_mma_wide.cuh's tile_barrier_kernel(d, vsmooth) for this build and <D, FP8 QK, ExpCast, V-Smooth[, K lanes]>."""
    d = int(re.search(r"ILi(\d+)", key).group(1))
    vsmooth = re.findall(r"Lb([01])", key)[2] == "1"
    return d == 64 and (name == EVERY64 or (name == PLAIN64 and not vsmooth))


def longest_straight_stretch(rows) -> tuple[int, int]:
    """(IMMA, HMMA) of the longest run of instructions without a branch, barrier or exit (shuffle labels do not
    end a run: their only jumps come from out-of-line code)."""
    best, imma, hmma, length = (0, 0, -1), 0, 0, 0
    for _, ins in rows:
        length += 1
        imma += ins.startswith("IMMA") or " IMMA" in ins
        hmma += ins.startswith("HMMA") or " HMMA" in ins
        if re.search(r"\b(BRA|BAR\.SYNC|EXIT)\b", ins):
            best = max(best, (length, imma, hmma))
            imma = hmma = length = 0
    best = max(best, (length, imma, hmma))
    return best[1], best[2]


@pytest.mark.parametrize("source", ["attn_mma_d64.cu", "attn_mma_d128.cu"])
def test_the_tile_barrier_reaches_its_kernels_only(tmp_path, source):
    code = compiled_kernels(tmp_path, [(source, name) for name in (DEFAULT, PLAIN64, EVERY64)])
    changed = []
    for name in (PLAIN64, EVERY64):
        ours = code[(source, name)]
        assert len(ours) >= 8, name
        for key, rows in ours.items():
            if tile_barrier_kernel(name, key):
                changed.append((name, key))
                assert rows != code[(source, DEFAULT)][key], (name, key)
                if key.startswith("ILi64ELb0ELb0ELb0E"):  # plain 8-bit
                    assert longest_straight_stretch(code[(source, DEFAULT)][key]) == (32, 72), key
                    assert longest_straight_stretch(rows) == (64, 144), (name, key)
            else:
                assert rows == code[(source, DEFAULT)][key], (name, key)
    if source == "attn_mma_d64.cu":
        # the INT8 and FP8 plain kernels, with and without ExpCast, in both builds; the V-Smooth ones in -tb64all- only
        assert sum(name == PLAIN64 for name, _ in changed) == 4, changed
        assert sum(name == EVERY64 for name, _ in changed) > 4, changed
    else:
        assert changed == []
