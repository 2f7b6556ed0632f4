"""The operand contract: what the prepare step (q, k, v + grouping) hands every attention kernel.

`PreparedOperands` is the fixed contract between preprocessing and the attention kernels (the
portable `mma` kernel and the Hopper `sm90` one read exactly this):
- n_pad = ceil(N/128)*128; every tensor contiguous; padded rows/columns are zero.
- q_q (B,H,n_pad,D) int8 (float8_e4m3fn for qk="fp8"); q_scale (B,H,n_pad) float32, one scale per
  query row (0 for the padded rows), which includes sm_scale*log2(e), so q_q.k_q * q_scale * k_scale
  is the score in log2 units.
- k_q (B,H,n_pad,D) int8/e4m3: K smoothed (if config.smooth_k), then permuted, then quantized;
  k_scale (B,H,n_pad/128) float32.
- v_t (B,H,D,n_pad) float8_e4m3fn: permuted V (per_channel) or V-Smooth residual, TRANSPOSED so the
  PV MMA reads it K-major; v_scale (B,H,D) float32 = amax/448 per channel, except 1.0 where the
  channel's amax is 0 (its codes are all 0, so any scale gives the same V; a nonzero one lets a
  kernel pre-divide the mean by it); v_mean (B,H,n_pad/128,D) float16 block means of the permuted V,
  all zeros for per_channel (kernels may skip the restore at compile time for per_channel).
- with VCConfig.v_rank = k > 0 (V-Smooth's head-global low-rank term; reference.quantize_v_vsmooth
  on a basis W, by default reference.lowrank_basis's), also v_low_t (B,H,V_LOW_ROWS=8,n_pad)
  float8_e4m3fn, the PV MMA's extra B rows after V^T (constants.V_LOW_ROWS): row 0 holds E4M3 ones on
  the keys of even 128-key tiles, row 1 on odd ones (so the MMA returns each tile's row sum of P), rows
  2 .. 2+k-1 the codes of the coefficients A (zeros on padded keys), the rest zeros; v_low_scale
  (B,H,k) float32 (one scale per head and component) and v_low_basis (B,H,k,D) float16 (W). The
  residual in v_t is then R - A_q W and V = mean + A_q W + v_scale R. None for v_rank 0.
- with V-Smooth segments (VCConfig.v_mean_merge at head dim 128, reference.vsmooth_segments), v_mean holds
  each segment's mean in every slot of the segment and v_seg_end (B,H,n_pad/128) uint8 marks each
  segment's last 128-key slot (the Hopper speed loop restores there; other kernels restore per tile, for
  which the slot means suffice); v_scale is the residual's amax bound / 448. None without segments.
Who builds and reads it: prepare_reference.py (reference.py's quantizers: the defining values),
prepare_cuda.py (the fused CUDA kernels, the same values up to the K mean's float32 summation order),
operand_emulation.py (what a kernel computes from them, in float64) and the CUDA backends' kernels.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from . import reference
from .constants import V_LOW_FIRST, V_LOW_ROWS

N_ALIGN = reference.K_BLOCK


@dataclass
class PreparedOperands:
    q_q: torch.Tensor
    q_scale: torch.Tensor
    k_q: torch.Tensor
    k_scale: torch.Tensor
    v_t: torch.Tensor
    v_scale: torch.Tensor
    v_mean: torch.Tensor
    n_tokens: int  # N, the number of valid rows (n_pad = q_q.shape[2])
    v_low_t: Optional[torch.Tensor] = None  # the low-rank term's extra V^T rows (v_rank > 0)
    v_low_scale: Optional[torch.Tensor] = None
    v_low_basis: Optional[torch.Tensor] = None
    # VCConfig.v_mean_merge: (B,H,n_pad/128) uint8, 1 on each V-Smooth segment's last 128-key slot (the
    # Hopper speed loop restores the segment's mean there); None: no segments (a mean per block)
    v_seg_end: Optional[torch.Tensor] = None
    # VCConfig.v_lo_channels: the residual's second E4M3 term, (B,H,L,n_pad) E4M3 codes in v_t's channel-major form
    # (zeros on padded keys; the same per-channel scale v_scale), row i belonging to channel v_lo_sel[b,h,i] of
    # (B,H,L) int32, distinct channels (reference.quantize_v_vsmooth's lo_q and lo_sel); None: no second term
    v_lo_t: Optional[torch.Tensor] = None
    v_lo_sel: Optional[torch.Tensor] = None

    @property
    def n_pad(self) -> int:
        return self.q_q.shape[2]


def low_rows(coeff_q: torch.Tensor, n_pad: int) -> torch.Tensor:
    """v_low_t (B,H,V_LOW_ROWS,n_pad) E4M3 from the coefficient codes' values (B,H,N,k): the two
    tile-parity rows of ones, the codes transposed (zeros on padded keys), zero rows up to V_LOW_ROWS."""
    b, h, n, rank = coeff_q.shape
    rows = torch.zeros(b, h, V_LOW_ROWS, n_pad, dtype=torch.float32, device=coeff_q.device)
    parity = (torch.arange(n_pad, device=coeff_q.device) // N_ALIGN) % 2
    rows[:, :, 0] = (parity == 0).float()
    rows[:, :, 1] = (parity == 1).float()
    rows[:, :, V_LOW_FIRST:V_LOW_FIRST + rank, :n] = coeff_q.float().transpose(-1, -2)
    return rows.to(torch.float8_e4m3fn)


def low_coefficients(ops: "PreparedOperands") -> torch.Tensor:
    """The coefficient codes' values (B,H,n_pad,k) float32 of v_low_t (its rows 2 .. 2+k-1)."""
    rank = ops.v_low_scale.shape[-1]
    return ops.v_low_t[:, :, V_LOW_FIRST:V_LOW_FIRST + rank].float().transpose(-1, -2)


def padded_length(n: int) -> int:
    return -(-n // N_ALIGN) * N_ALIGN


def rows_aligned(t: torch.Tensor) -> bool:
    """The CUDA kernels' load precondition on q, k and v: unit stride along the head dim, every other
    stride a multiple of 8 elements and a 16-byte aligned base, so every 16-bit row starts on a
    16-byte boundary (vectorized loads, TMA)."""
    # one stride() call and no generator: this runs three times in every call's backend selection, before
    # its first launch (a short call's GPU idles through it: docs/kernel-notes.md section 28)
    strides = t.stride()
    if strides[-1] != 1 or t.data_ptr() % 16:
        return False
    combined = 0
    for s in strides[:-1]:
        combined |= s
    return combined % 8 == 0
