"""The next chunk's copy after the QK MMAs (VC_MMA_LATE_COPY, `-latecopy-`) and the K scale a chunk ahead
(VC_MMA_K_SCALE_AHEAD, `-kahead-`; docs/kernel-notes.md 50) move what they say in the machine code.

Compile-only (nvcc + nvdisasm, no GPU), sm_90a, head dim 64, the plain 8-bit kernel (the one PC sampling showed waiting
at the loop top). In the via-f16 default, after the loop's barrier the copies (LDGSTS) come before the chunk's first
IMMA, behind their address chain; with `-latecopy-` they come after it. The default reads the K scale's global load
(LDG) before its first IMMA (so the warp waits there, in order, for the load); with `-kahead-` the load in that
stretch is the next chunk's and nothing in it reads the result. (With both flags 0 the source change leaves the
default builds' machine code as it was: docs/kernel-notes.md 50.)
"""
import re

from vc_attention.kernels import mma_variants

from .test_clamp_bound_sass import nvdisasm, pytestmark, sass_loop_mix  # noqa: F401  (pytestmark: nvcc + nvdisasm)
from .test_mma_v128_f16_sass import compiled_kernels

BASE = "wide-i2fp-meanscaled-restoretile-after64-pvdirect2-d64vs3-v128f16-xs3-d64vss4"
DEFAULT = f"{BASE}-coalesced-viaf16"
LATE = f"{BASE}-latecopy-coalesced-viaf16"
AHEAD = f"{BASE}-kahead-coalesced-viaf16"
BOTH = f"{BASE}-latecopy-kahead-coalesced-viaf16"
PLAIN8 = "ILi64ELb0ELb0ELb0ELb0E"  # <D, FP8 QK, ExpCast, V-Smooth, K lanes>


def test_the_flags():
    assert mma_variants.default_variant("9.0a") == DEFAULT
    base = mma_variants.flags(DEFAULT)
    assert mma_variants.flags(LATE) == (*base, "-DVC_MMA_LATE_COPY=1")
    assert mma_variants.flags(AHEAD) == (*base, "-DVC_MMA_K_SCALE_AHEAD=1")
    assert mma_variants.flags(BOTH) == (*base, "-DVC_MMA_LATE_COPY=1", "-DVC_MMA_K_SCALE_AHEAD=1")


def qk_window(rows) -> list[str]:
    """The plain 8-bit chunk's first stretch after the loop's barrier (the kernel's last BAR.SYNC) up to its first
    MUFU: the copies, the K scale and the QK MMAs of the full-chunk body."""
    ins = [" ".join(text.split()) for _, text in rows]
    bar = max(i for i, x in enumerate(ins) if "BAR.SYNC" in x)
    mufu = next(i for i in range(bar, len(ins)) if "MUFU" in ins[i])
    return ins[bar:mufu]


def first(window, opcode) -> int:
    return next(i for i, x in enumerate(window) if re.match(rf"(@!?P\d )?{opcode}\b", x))


def k_scale_loads(window) -> list[tuple[int, int | None]]:
    """(position, position of the first reader in the window or None) of each 32-bit global load (LDG.E)."""
    out = []
    for i, x in enumerate(window):
        m = re.match(r"(@!?P\d )?LDG\.E (R\d+),", x)
        if m:
            reg = m.group(2)
            out.append((i, next((j for j in range(i + 1, len(window)) if re.search(rf"\b{reg}\b", window[j])), None)))
    return out


def test_the_copy_follows_the_qk_mmas_and_the_k_scale_comes_early(tmp_path):
    code = compiled_kernels(tmp_path, [("attn_mma_d64.cu", name) for name in (DEFAULT, LATE, AHEAD)])
    rows = {name: code[("attn_mma_d64.cu", build)][PLAIN8] for name, build in (("default", DEFAULT), ("late", LATE),
                                                                                ("ahead", AHEAD))}
    windows = {name: qk_window(r) for name, r in rows.items()}
    copies = {name: [i for i, x in enumerate(w) if "LDGSTS" in x] for name, w in windows.items()}
    assert len(copies["default"]) == len(copies["late"]) == 4, copies  # K and V, two 16-byte copies per thread each
    # the default copies before its first IMMA, -latecopy- after it
    assert max(copies["default"]) < first(windows["default"], "IMMA"), copies
    assert min(copies["late"]) > first(windows["late"], "IMMA"), copies
    # the K scale: the default reads its load before the first IMMA (the warp waits there in order); -kahead- loads the
    # next chunk's and reads it in the next trip (no reader in this window)
    default_loads, ahead_loads = k_scale_loads(windows["default"]), k_scale_loads(windows["ahead"])
    assert len(default_loads) == len(ahead_loads) == 1, (default_loads, ahead_loads)
    assert default_loads[0][1] is not None and default_loads[0][1] < first(windows["default"], "IMMA"), default_loads
    assert ahead_loads[0][1] is None, ahead_loads
