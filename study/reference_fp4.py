"""4-bit (NVFP4-style) emulation of attention, for fidelity comparisons only (no kernel implements it).

NVFP4 as used here (every formula is float32 unless stated; E4M3 casts are reference.fp8_e4m3):
- Element values E2M1: {0, 0.5, 1, 1.5, 2, 3, 4, 6} with sign, round-to-nearest-even, saturating at
  +-6 (e2m1_rne).
- Two scales: a per-tensor float32 scale s_t and one E4M3 scale per 16 consecutive elements along the
  REDUCTION dimension of the matmul that consumes the operand:
      s_t   = amax(|x| over the tensor) / (6 * 448)
      s_b   = E4M3(amax(|x| over the block) / 6 / s_t)          (in [0, 448])
      x_q   = E2M1(x / (s_b * s_t))                             (0 where s_b == 0)
      x_hat = x_q * s_b * s_t
  Blocks: Q and K along the head dim (16 channels of one token), P along keys (16 keys of one
  query row), V along tokens (16 consecutive tokens of one channel). A tail shorter than 16 is its own
  block (padding zeros never change an amax).
- Q is multiplied by reference.qk_scale before quantization (scores come out in log2 units), K is
  smoothed (reference.smooth_k) before quantization, as in the 8-bit path.
- Scores s = q_hat . k_hat (float64 sum rounded once to float32); P~ = exp2(s - M) with the integer
  row offset M = ceil(max_j s), so P~ <= 1 and the row max is in (0.5, 1]. P~ is not known
  before the row is done, so its tensor scale is the constant bound: s_t(P) = 1 / (6 * 448).
- SageAttention3-style baseline: V quantized directly. V-Smooth 4-bit: V permuted, per 128-row block
  means mu_j (reference.block_means_fp16) removed first, the residual quantized, and the mean restored
  with the row sums of the same quantized P: out = (P_q R_hat + rowsum(P_q) mu) / rowsum(P_q).
- Output: sum_j P_q[i,j] V_hat[j] / sum_j P_q[i,j] (float64), the same quantized P in both sums.
"""
from __future__ import annotations

import torch

from ..kernels import reference as ref
from ..kernels.layout import from_bhnd, to_bhnd

E2M1_MAX = 6.0
FP4_BLOCK = 16
FP4_V_FORMATS = ("per_channel", "vsmooth")
P_TENSOR_SCALE = 1.0 / (E2M1_MAX * ref.E4M3_MAX)  # P~ <= 1 by construction


def e2m1_rne(x: torch.Tensor) -> torch.Tensor:
    """Round float32 to the nearest E2M1 value, ties to even mantissa, saturating at +-6.

    The E2M1 grid has step 0.5 on [0, 2), 1 on [2, 4) and 2 on [4, 6]; on each piece torch.round
    (half to even) of |x| / step picks the value with the even mantissa bit at a tie, e.g. 0.25 -> 0,
    0.75 -> 1, 2.5 -> 2, 3.5 -> 4, 5 -> 4. Steps are powers of two, so the scaling is exact.
    """
    a = x.float().abs().clamp(max=E2M1_MAX)
    inv_step = torch.where(a < 2, 2.0, torch.where(a < 4, 1.0, 0.5))
    return torch.copysign(torch.round(a * inv_step) / inv_step, x.float())


def quantize_nvfp4(x: torch.Tensor, tensor_scale: torch.Tensor | float | None = None) -> torch.Tensor:
    """NVFP4 round trip along the LAST dim in blocks of 16 (module docstring); returns x_hat float32.

    tensor_scale: s_t; None computes amax(|x|) / (6 * 448) over the whole tensor.
    """
    x = x.float()
    n = x.shape[-1]
    if tensor_scale is None:
        tensor_scale = x.abs().amax() / (E2M1_MAX * ref.E4M3_MAX)
    tensor_scale = torch.as_tensor(tensor_scale, dtype=torch.float32, device=x.device)
    pad = -n % FP4_BLOCK
    blocks = torch.nn.functional.pad(x, (0, pad)).unflatten(-1, (-1, FP4_BLOCK))
    block_amax = blocks.abs().amax(dim=-1, keepdim=True)
    safe_ts = torch.where(tensor_scale > 0, tensor_scale, torch.ones_like(tensor_scale))
    block_scale = ref.fp8_e4m3(block_amax / E2M1_MAX / safe_ts)
    step = block_scale * tensor_scale
    safe_step = torch.where(step > 0, step, torch.ones_like(step))
    x_hat = torch.where(step > 0, e2m1_rne(blocks / safe_step) * step, torch.zeros_like(blocks))
    return x_hat.flatten(-2)[..., :n]


def quantize_v_fp4(v_perm: torch.Tensor, v_format: str) -> torch.Tensor:
    """V_hat (B,H,N,D) float32: NVFP4 along tokens per channel, directly or on the V-Smooth residual."""
    v32 = v_perm.float()
    if v_format == "per_channel":
        return quantize_nvfp4(v32.transpose(-1, -2)).transpose(-1, -2)
    mean = ref.expand_rows(ref.block_means_fp16(v32).float(), ref.V_BLOCK, v32.shape[-2])
    return quantize_nvfp4((v32 - mean).transpose(-1, -2)).transpose(-1, -2) + mean


def fp4_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    v_format: str = "per_channel",
    *,
    layout: str = "bhnd",
    perm: torch.Tensor | None = None,
    sm_scale: float | None = None,
    query_chunk: int = 1024,
    parts: bool = False,
):
    """Emulate one 4-bit attention call: "per_channel" = SageAttention3-style, "vsmooth" = V-Smooth.

    Same interface and outputs as reference.vc_attention_reference (perm permutes K and V together;
    parts=True returns reference.ReferenceParts in float64, bhnd).
    """
    if v_format not in FP4_V_FORMATS:
        raise ValueError(f"v_format must be one of {FP4_V_FORMATS}, got {v_format!r}.")
    ref.check_inputs(q, k, v)
    qb, kb, vb = (to_bhnd(t, layout) for t in (q, k, v))
    if perm is not None:
        kb, vb = ref.permute_tokens(kb, perm), ref.permute_tokens(vb, perm)
    scale = ref.qk_scale(qb.shape[-1], sm_scale)
    q_hat = quantize_nvfp4(qb.float() * torch.tensor(scale, dtype=torch.float32)).double()
    k_hat = quantize_nvfp4(ref.smooth_k(kb)[0]).double()
    v_hat = quantize_v_fp4(vb, v_format).double()

    outs, outs_v, tvs = [], [], []
    for start in range(0, qb.shape[-2], query_chunk):
        stop = min(start + query_chunk, qb.shape[-2])
        s = (q_hat[:, :, start:stop] @ k_hat.transpose(-1, -2)).float()
        p = quantize_nvfp4(torch.exp2(s - torch.ceil(s.amax(-1, keepdim=True))), P_TENSOR_SCALE).double()
        denom = p.sum(-1, keepdim=True)
        outs.append(p @ v_hat / denom)
        if parts:
            outs_v.append(p @ vb.double() / denom)
            logits = qb[:, :, start:stop].double() @ kb.double().transpose(-1, -2) * (scale / ref.LOG2E)
            tvs.append(0.5 * (torch.softmax(logits, -1) - p / denom).abs().sum(-1))
    out = torch.cat(outs, dim=2)
    if parts:
        return ref.ReferenceParts(out, torch.cat(outs_v, dim=2), torch.cat(tvs, dim=2))
    return from_bhnd(out.to(q.dtype), layout)
