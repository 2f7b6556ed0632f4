"""K scales per MMA lane class and the key order that makes them pay (VCConfig.k_lane_scales): the spec.

Why. Fidelity mode's QK term is mostly K's INT8 rounding (docs/fidelity-study.md, "Where the QK term comes from"):
one scale per key would take it from 0.0053 to 0.0047, but costs a multiply per score. Both kernels' score layouts
give each lane t of an MMA quad a fixed quarter of every tile's keys (key 16 c' + 4 t + 0..3: sm90 key_of_column,
the mma kernels' key_of), and a lane multiplies its scores by a per-row constant it already holds. So a K scale
per (K-scale block, lane) is free in the softmax: the lane's constant is q_scale * its own K scale. Alone that gains
little (a lane's keys are a strided sample of the block, their amax near the block's); with the keys of every full
128-key block reordered by their smoothed K's amax so that each lane holds one quartile (the largest 32 on lane 0,
...), three of the four scales shrink: emulated -7 to -8% QK term, about -2.4% rel-L2 in fidelity mode and -3.6%
in speed mode at 32,760 tokens (docs/fidelity-study.md, "K scales per MMA lane").

The order is a permutation inside each full 128-key block of the grouping's order, applied to K and V together: it
changes no block's set of keys, so V-Smooth's block means, segments and every per-block statistic stay what they
were; the output is unchanged in exact arithmetic (non-causal attention). A partial last block keeps its order.

The speed encoding anchors each lane at its own largest integer score (reference.quantize_p): a lane's scale
differs from its neighbours', so a0 scale <= M holds only for the lane's own a0 (the kernels' thread-local max).
"""
from __future__ import annotations

import torch

from .constants import INT8_MAX, K_BLOCK, K_LANE_KEYS, K_LANE_PERIOD, K_LANES

LANE_KEYS_PER_BLOCK = K_BLOCK // K_LANES  # 32 keys of each lane in a 128-key block


def key_lanes(n: int, device=None) -> torch.Tensor:
    """(n,) int64: the quad lane whose score registers hold key j of a tile, (j % 16) // 4."""
    return (torch.arange(n, device=device) % K_LANE_PERIOD) // K_LANE_KEYS


def lane_position(rank: torch.Tensor) -> torch.Tensor:
    """The position inside a 128-key block of the key ranked `rank` (0 = largest amax): rank r goes to lane r // 32,
    as that lane's (r % 32)-th key (lane t's keys are 16 a + 4 t + b, a = 0..7, b = 0..3)."""
    lane, i = rank // LANE_KEYS_PER_BLOCK, rank % LANE_KEYS_PER_BLOCK
    return K_LANE_PERIOD * (i // K_LANE_KEYS) + K_LANE_KEYS * lane + i % K_LANE_KEYS


def lane_order(ks: torch.Tensor) -> torch.Tensor:
    """(B,H,N,D) smoothed K (float32, the grouping's order) -> (B,H,N) int64 permutation: inside each full 128-key
    block the keys sorted by max_c |ks| descending, ties in their order (a stable sort), rank r placed at
    lane_position(r); a partial last block unchanged. order[p] is the key that lands at position p."""
    b, h, n, _ = ks.shape
    order = torch.arange(n, device=ks.device).expand(b, h, n).clone()
    full = n // K_BLOCK
    if full == 0:
        return order
    amax = ks[:, :, : full * K_BLOCK].float().abs().amax(-1).reshape(b, h, full, K_BLOCK)
    ranked = torch.sort(amax, dim=-1, descending=True, stable=True).indices  # ranked[r]: the key of rank r
    local = torch.empty_like(ranked)
    local[..., lane_position(torch.arange(K_BLOCK, device=ks.device))] = ranked
    base = torch.arange(full, device=ks.device).view(1, 1, full, 1) * K_BLOCK
    order[:, :, : full * K_BLOCK] = (local + base).reshape(b, h, full * K_BLOCK)
    return order


def lane_amax(x: torch.Tensor, block: int) -> torch.Tensor:
    """(B,H,N,D) -> (B,H,nb,4): max |x| over the valid keys of each (block of `block` keys, lane); 0 where a lane
    has no valid key (the tail)."""
    if block % K_LANE_PERIOD:
        raise ValueError(f"a K-scale block must hold whole lane periods ({K_LANE_PERIOD} keys), got {block}.")
    b, h, n, _ = x.shape
    nb = -(-n // block)
    per_key = torch.nn.functional.pad(x.float().abs().amax(-1), (0, nb * block - n))
    return per_key.reshape(b, h, nb, block // K_LANE_PERIOD, K_LANES, K_LANE_KEYS).amax(dim=(3, 5))


def quantize_int8_lanes(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric INT8 with one scale per (`block` keys, lane) of each (b, h): amax = lane_amax, inv = 127 / amax
    (0 when amax == 0), x_q = clamp(rint(x * inv), -127, 127), scale = amax / 127 (reference.quantize_int8_blocks
    with the lane's amax). Returns (x_q int8 (B,H,N,D), scale float32 (B,H,nb,4))."""
    x = x.float()
    amax = lane_amax(x, block)
    inv = torch.where(amax > 0, INT8_MAX / amax, torch.zeros_like(amax))
    xq = torch.round(x * per_key(inv, x.shape[-2], block).unsqueeze(-1)).clamp_(-INT8_MAX, INT8_MAX)
    return xq.to(torch.int8), amax / INT8_MAX


def per_key(lane_values: torch.Tensor, n: int, block: int = K_BLOCK) -> torch.Tensor:
    """(B,H,nb,4) per (block of `block` keys, lane) -> (B,H,n): each key's value."""
    expanded = lane_values.repeat_interleave(block, dim=2)[:, :, :n]  # (B,H,n,4)
    lanes = key_lanes(n, lane_values.device).view(1, 1, n, 1).expand(*expanded.shape[:3], 1)
    return expanded.gather(-1, lanes).squeeze(-1)


def lane_block_row_max(x: torch.Tensor, block: int) -> torch.Tensor:
    """(..., N) -> (..., N): each key's maximum over the keys of its `block`-key block and lane (the speed
    encoding's anchor a0 with lane scales; reference.block_row_max without them). Padding is -inf."""
    n = x.shape[-1]
    nb = -(-n // block)
    xd = torch.nn.functional.pad(x.double(), (0, nb * block - n), value=-float("inf"))
    shaped = xd.reshape(*x.shape[:-1], nb, block // K_LANE_PERIOD, K_LANES, K_LANE_KEYS)
    top = shaped.amax(dim=(-3, -1), keepdim=True).expand_as(shaped)
    return top.reshape(*x.shape[:-1], nb * block)[..., :n].to(x.dtype)
