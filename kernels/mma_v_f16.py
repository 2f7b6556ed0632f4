"""V operand of the portable kernel's f16-V builds (`-DVC_MMA_V_F16=1`, or `=2` for the head-dim-128 INT8 V-Smooth
kernels only; kernels/csrc/attn_mma_wide.cuh).

The via-f16 build (sm_90a / sm_100a, no FP8 mma.sync) unpacks every E4M3 V fragment to f16 in every warp and chunk
before its HMMAs. A VC_MMA_V_F16 build instead reads V already as the f16 values of the codes (exact: every E4M3 value
is an f16), made once per call by one elementwise pass (the extension's `v_f16`), laid out as the image of its shared-
memory tile so that each 64-key chunk is one flat copy:
- (B, H, n_pad / 64, D, 64): per chunk the V^T rows of its 64 keys, contiguous;
- the keys of each group of 16 permuted so that ldmatrix gives each thread the fragments the unpack would have made:
  position 2t + j holds key 4t + j and position 8 + 2t + j key 4t + 2 + j (t = 0..3, j = 0, 1);
- the eight 16-byte units (8 keys each) of row d at unit ^ (d & 7), the kernel's bank-conflict swizzle (swizzled<128>).
Same values, same HMMAs, same order: the output is the via-f16 build's bit for bit (tests/test_mma_v_f16_gpu.py).
"""
from __future__ import annotations

import torch

FLAG = "-DVC_MMA_V_F16=1"
# only the head-dim-128 INT8 V-Smooth kernels (fidelity, speed) take V in f16; the others keep the codes
# (docs/kernel-notes.md 48: the f16 V was faster there, slower at head dim 64 and in plain 8-bit)
D128_VSMOOTH_FLAG = "-DVC_MMA_V_F16=2"
# VC_MMA_P_ALU_UNPACK (P unpacked by shifts and masks): A's bytes paired (0, 2) and (1, 3), so V's key order follows
PAIRED_FLAG = "-DVC_MMA_P_ALU_UNPACK=1"
GROUP = 16  # keys per permuted group (one m16n8k16 MMA's k)
CHUNK_KEYS = 64  # keys per block (kChunkKeys)
UNIT_KEYS = 8  # keys per 16-byte unit of f16


def key_of_position(position: int, paired: bool = False) -> int:
    """The key (within its group of 16) stored at `position` of the f16 V^T row: thread t's k-slots 2t + j hold the
    keys 4t + j (paired: 4t + 2j), its slots 8 + 2t + j the keys 4t + 2 + j (paired: 4t + 1 + 2j), j = 0, 1."""
    t, j, second = (position % 8) // 2, position % 2, position >= 8
    return 4 * t + (2 * j + int(second) if paired else j + 2 * int(second))


KEY_ORDER = tuple(key_of_position(s) for s in range(GROUP))
PAIRED_KEY_ORDER = tuple(key_of_position(s, paired=True) for s in range(GROUP))


def key_order(variant_flags: tuple[str, ...]) -> tuple[int, ...]:
    """The key order of a VC_MMA_V_F16 build's V operand."""
    return PAIRED_KEY_ORDER if PAIRED_FLAG in variant_flags else KEY_ORDER


def uses_v_f16(variant_flags: tuple[str, ...]) -> bool:
    """Whether some kernel of the build takes V in f16."""
    return FLAG in variant_flags or D128_VSMOOTH_FLAG in variant_flags


def takes_v_f16(variant_flags: tuple[str, ...], head_dim: int, qk_fp8: bool, vsmooth: bool) -> bool:
    """Whether the build's kernel for this head dim, QK format and V mode takes V in f16 (csrc v_f16_kernel; the
    extension's v_f16_kernel answers the same, tests/test_mma_v_f16_gpu.py)."""
    if FLAG in variant_flags:
        return True
    return D128_VSMOOTH_FLAG in variant_flags and head_dim == 128 and vsmooth and not qk_fp8


def v_f16_reference(codes: torch.Tensor, order: tuple[int, ...] = KEY_ORDER) -> torch.Tensor:
    """What the extension's v_f16 makes of V^T codes (B, H, D, n_pad), n_pad a multiple of 64: (B, H, n_pad / 64, D, 64)
    float16 (torch ops; for tests and the CPU). order: the build's key order within 16 (key_order)."""
    if codes.dim() != 4 or codes.shape[-1] % CHUNK_KEYS:
        raise ValueError(f"codes must be (B, H, D, n_pad) with n_pad a multiple of {CHUNK_KEYS}, got {tuple(codes.shape)}")
    b, h, d, n_pad = codes.shape
    values = codes.view(torch.float8_e4m3fn).to(torch.float16)
    groups = values.reshape(b, h, d, -1, GROUP).index_select(-1, torch.tensor(order, device=codes.device))
    blocks = groups.reshape(b, h, d, n_pad // CHUNK_KEYS, CHUNK_KEYS // UNIT_KEYS, UNIT_KEYS).transpose(2, 3)
    # unit u of row r goes to position u ^ (r & 7): position p holds unit p ^ (r & 7)
    units = torch.arange(CHUNK_KEYS // UNIT_KEYS, device=codes.device)
    source = units.view(1, -1) ^ (torch.arange(d, device=codes.device) % 8).view(-1, 1)  # (D, 8)
    index = source.view(1, 1, 1, d, -1, 1).expand(b, h, n_pad // CHUNK_KEYS, d, -1, UNIT_KEYS)
    return blocks.gather(4, index).reshape(b, h, n_pad // CHUNK_KEYS, d, CHUNK_KEYS).contiguous()
