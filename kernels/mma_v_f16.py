"""V operand of the portable kernel's f16-V builds (`-DVC_MMA_V_F16=1`, kernels/csrc/attn_mma_wide.cuh).

The via-f16 build (sm_90a / sm_100a, no FP8 mma.sync) unpacks every E4M3 V fragment to f16 in every warp and chunk
before its HMMAs. A VC_MMA_V_F16 build instead reads V^T already as the f16 values of the codes (exact: every E4M3
value is an f16), made once per call by one elementwise pass (the extension's `v_f16`), with the keys of each group of
16 permuted so that ldmatrix gives each thread the fragments the unpack would have made: position 2t + j holds key
4t + j and position 8 + 2t + j key 4t + 2 + j (t = 0..3, j = 0, 1). Same values, same HMMAs, same order: the output is
the via-f16 build's bit for bit (tests/test_mma_v_f16_gpu.py).
"""
from __future__ import annotations

import torch

FLAG = "-DVC_MMA_V_F16=1"
GROUP = 16  # keys per permuted group (one m16n8k16 MMA's k)


def key_of_position(position: int) -> int:
    """The key (within its group of 16) stored at `position` of the f16 V^T row."""
    t, j = (position % 8) // 2, position % 2
    return 4 * t + j + (2 if position >= 8 else 0)


KEY_ORDER = tuple(key_of_position(s) for s in range(GROUP))


def uses_v_f16(variant_flags: tuple[str, ...]) -> bool:
    return FLAG in variant_flags


def v_f16_reference(codes: torch.Tensor) -> torch.Tensor:
    """What the extension's v_f16 makes of E4M3 codes (last dim a multiple of 16): their float16 values, keys
    permuted within each group of 16 by KEY_ORDER (torch ops; for tests and the CPU)."""
    if codes.shape[-1] % GROUP:
        raise ValueError(f"the codes' last dim must be a multiple of {GROUP}, got {codes.shape[-1]}")
    values = codes.view(torch.float8_e4m3fn).to(torch.float16)
    groups = values.reshape(*values.shape[:-1], -1, GROUP)
    order = torch.tensor(KEY_ORDER, device=codes.device)
    return groups.index_select(-1, order).reshape(values.shape)
