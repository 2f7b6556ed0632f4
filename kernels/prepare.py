"""The prepare step: q, k, v (+ grouping) -> the quantized operands every attention kernel consumes.

`PreparedOperands` is the fixed contract between preprocessing and the attention kernels (the
portable `mma` kernel and the Hopper `sm90` one read exactly this):
- n_pad = ceil(N/128)*128; every tensor contiguous; padded rows/columns are zero.
- q_q (B,H,n_pad,D) int8 (float8_e4m3fn for qk="fp8"); q_scale (B,H,ceil(N/64)) float32, which
  includes sm_scale*log2(e), so q_q.k_q * q_scale * k_scale is the score in log2 units.
- k_q (B,H,n_pad,D) int8/e4m3: K smoothed (if config.smooth_k), then permuted, then quantized;
  k_scale (B,H,n_pad/128) float32.
- v_t (B,H,D,n_pad) float8_e4m3fn: permuted V (per_channel) or V-Smooth residual, TRANSPOSED so the
  PV MMA reads it K-major; v_scale (B,H,D) float32 = amax/448 per channel, except 1.0 where the
  channel's amax is 0 (its codes are all 0, so any scale gives the same V; a nonzero one lets a
  kernel pre-divide the mean by it); v_mean (B,H,n_pad/128,D) float16 block means of the permuted V,
  all zeros for per_channel (kernels may skip the restore at compile time for per_channel).

`prepare_reference` builds the contract from reference.py's quantizers (CPU-testable; it defines
the values), `prepare_cuda` runs the fused CUDA kernels (same values up to the K mean's float32
summation order), and `attention_from_operands` emulates what a kernel computes from them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from . import reference
from .config import VCConfig

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

    @property
    def n_pad(self) -> int:
        return self.q_q.shape[2]


def padded_length(n: int) -> int:
    return -(-n // N_ALIGN) * N_ALIGN


def _pad_to_length(x: torch.Tensor, n_pad: int) -> torch.Tensor:
    """Zero rows appended along dim -2 up to n_pad rows (the kernels' N_ALIGN-padded length)."""
    return torch.nn.functional.pad(x, (0, 0, 0, n_pad - x.shape[-2]))


def _qk_storage(values: torch.Tensor, config: VCConfig) -> torch.Tensor:
    return values if config.qk == "int8" else values.to(torch.float8_e4m3fn)


def prepare_reference(q, k, v, perm: Optional[torch.Tensor], config: VCConfig, layout: str = "bhnd",
                      sm_scale: Optional[float] = None) -> PreparedOperands:
    """The operand contract computed with reference.py (any device; float32 math)."""
    qb, kb, vb = (reference.to_bhnd(t, layout) for t in (q, k, v))
    if perm is not None:
        kb, vb = reference.permute_tokens(kb, perm.long()), reference.permute_tokens(vb, perm.long())
    n = qb.shape[2]
    n_pad = padded_length(n)
    q_q, q_scale, k_q, k_scale = reference.quantize_qk(qb, kb, config, sm_scale)
    if config.v == "vsmooth":
        vs = reference.quantize_v_vsmooth(vb)
        resid, scale, mean = vs.residual_q, vs.scale, vs.mean
    else:
        resid, scale = reference.quantize_fp8_per_channel(vb)
        b, h, _, d = vb.shape
        mean = torch.zeros(b, h, n_pad // N_ALIGN, d, dtype=torch.float16, device=vb.device)
    v_t = _pad_to_length(resid, n_pad).transpose(-1, -2).contiguous().to(torch.float8_e4m3fn)
    scale = scale.squeeze(-2)
    return PreparedOperands(
        q_q=_qk_storage(_pad_to_length(q_q, n_pad), config).contiguous(),
        q_scale=q_scale.contiguous(),
        k_q=_qk_storage(_pad_to_length(k_q, n_pad), config).contiguous(),
        k_scale=k_scale.contiguous(),
        v_t=v_t,
        v_scale=torch.where(scale > 0, scale, torch.ones_like(scale)).contiguous(),
        v_mean=mean.contiguous(),
        n_tokens=n,
    )


def attention_from_operands(ops: PreparedOperands, config: VCConfig, out_dtype: torch.dtype) -> torch.Tensor:
    """What a kernel computes from the operands, emulated in float64 (B,H,N,D); for tests and docs.

    O = (sum_j P_j (v_scale * R_j) + l_j mu_j) / sum_j l_j with P from the integer-offset softmax of
    reference.quantize_p and l_j the row sums of the same quantized P over key block j.
    """
    n = ops.n_tokens
    s = reference.scores_log2(ops.q_q[:, :, :n].float(), ops.q_scale, ops.k_q[:, :, :n].float(), ops.k_scale, n)
    p = reference.quantize_p(s, config).double()
    v_res = ops.v_t.float()[:, :, :, :n].transpose(-1, -2).double() * ops.v_scale.double().unsqueeze(-2)
    mean = reference.expand_rows(ops.v_mean.double(), N_ALIGN, n)
    return reference.to_output_dtype((p @ (v_res + mean)) / p.sum(-1, keepdim=True), out_dtype)


def rows_aligned(t: torch.Tensor) -> bool:
    """The CUDA kernels' load precondition on q, k and v: unit stride along the head dim, every other
    stride a multiple of 8 elements and a 16-byte aligned base, so every 16-bit row starts on a
    16-byte boundary (vectorized loads, TMA)."""
    return t.stride(-1) == 1 and all(s % 8 == 0 for s in t.stride()[:-1]) and t.data_ptr() % 16 == 0


def prepare_and_run(q, k, v, perm, config: VCConfig, layout: str, sm_scale, attention, backend: str) -> torch.Tensor:
    """The `run` of the CUDA backends: check k and v (q was checked when the backend was chosen), run
    prepare_cuda, then `attention(ops, config, out, layout)`, the backend's kernel, into a new output."""
    for name, t in (("k", k), ("v", v)):
        if not rows_aligned(t):
            raise ValueError(f"{name} needs a contiguous last dim and 16-byte aligned rows for the {backend} backend.")
    with torch.cuda.device(q.device):
        ops = prepare_cuda(q, k, v, perm, config, layout, sm_scale)
        return attention(ops, config, torch.empty(q.shape, dtype=q.dtype, device=q.device), layout)


def prepare_cuda(q, k, v, perm: Optional[torch.Tensor], config: VCConfig, layout: str = "bhnd",
                 sm_scale: Optional[float] = None) -> PreparedOperands:
    """The fused CUDA prepare kernels (2 passes: statistics, then quantize + permute + transpose)."""
    from .backend_cuda import extension

    qb, kb, vb = (reference.to_bhnd(t, layout) for t in (q, k, v))
    b, h, n, d = qb.shape
    n_pad = padded_length(n)
    dev = q.device
    qk_dtype = torch.int8 if config.qk == "int8" else torch.float8_e4m3fn
    ops = PreparedOperands(
        q_q=torch.empty(b, h, n_pad, d, dtype=qk_dtype, device=dev),
        q_scale=torch.empty(b, h, -(-n // reference.Q_BLOCK), dtype=torch.float32, device=dev),
        k_q=torch.empty(b, h, n_pad, d, dtype=qk_dtype, device=dev),
        k_scale=torch.empty(b, h, n_pad // N_ALIGN, dtype=torch.float32, device=dev),
        v_t=torch.empty(b, h, d, n_pad, dtype=torch.float8_e4m3fn, device=dev),
        v_scale=torch.empty(b, h, d, dtype=torch.float32, device=dev),
        v_mean=(torch.empty if config.v == "vsmooth" else torch.zeros)(b, h, n_pad // N_ALIGN, d, dtype=torch.float16, device=dev),
        n_tokens=n,
    )
    perm32 = None if perm is None else perm.to(device=dev, dtype=torch.int32).contiguous()
    extension().prepare(
        qb, kb, vb, perm32, ops.q_q, ops.q_scale, ops.k_q, ops.k_scale, ops.v_t, ops.v_scale, ops.v_mean,
        reference.qk_scale(d, sm_scale), config.qk == "fp8", config.v == "vsmooth", config.smooth_k,
        torch.cuda.current_stream(dev).cuda_stream,
    )
    return ops
