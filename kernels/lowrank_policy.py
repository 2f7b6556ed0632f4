"""A fast basis policy for V-Smooth's low-rank V term: float32 subspace iteration instead of an eigensolve.

reference.lowrank_basis (the spec's policy) takes the top eigenvectors of the residual's second-moment
matrix with a float64 eigensolve per head: 71 ms per call at Wan2.2-14B 720p on the H200 (40 heads,
docs/kernel-notes.md section 21), far more than a layer's grouping. Any basis gives a correct V (what it
misses stays in the FP8 residual), so the node may use a cheaper one; this one:
- the same sample (4,096 evenly spaced tokens of the permuted V) and the same residual (against the
  fp16 block means; pass the prepare's `v_mean` to skip recomputing them),
- C = R^T R in float32 (one batched GEMM), then `iters` steps of X <- C X on rank + `oversample`
  columns, re-orthonormalized by Cholesky QR (small batched Cholesky + triangular solve), from a fixed
  start (or the layer's previous basis: a warm start),
- Rayleigh-Ritz: the small (rank + oversample)^2 projected problem's eigenvectors, then the spec's sign
  rule, fp16.
Everything is batched over (batch, head) on V's device with no host synchronization.
"""
from __future__ import annotations

from typing import Optional

import torch

from . import reference

DEFAULT_ITERS = 8
DEFAULT_OVERSAMPLE = 2


def _start(d: int, width: int, device, dtype) -> torch.Tensor:
    """A fixed, well-spread (d, width) start: an orthonormal basis of a seeded Gaussian matrix."""
    gen = torch.Generator().manual_seed(0)
    q, _ = torch.linalg.qr(torch.randn(d, width, generator=gen, dtype=torch.float64))
    return q.to(device=device, dtype=dtype)


def _orthonormalize(x: torch.Tensor) -> torch.Tensor:
    """Cholesky QR of (..., d, w) columns (twice: one pass loses orthogonality when x is ill-conditioned)."""
    for _ in range(2):
        gram = x.transpose(-1, -2) @ x
        gram = gram + 1e-6 * gram.diagonal(dim1=-2, dim2=-1).mean(-1)[..., None, None] * torch.eye(
            gram.shape[-1], device=x.device, dtype=x.dtype)
        chol = torch.linalg.cholesky(gram)
        x = torch.linalg.solve_triangular(chol, x.transpose(-1, -2), upper=False).transpose(-1, -2)
    return x


def lowrank_basis_fast(v_perm: torch.Tensor, rank: int, *, block_means: Optional[torch.Tensor] = None,
                       warm: Optional[torch.Tensor] = None, sample: int = reference.LOWRANK_SAMPLE,
                       iters: int = DEFAULT_ITERS, oversample: int = DEFAULT_OVERSAMPLE) -> torch.Tensor:
    """(B,H,rank,D) fp16 basis of the low-rank V term, spanning (nearly) what reference.lowrank_basis
    spans. block_means: (B,H,n_blocks,D) fp16 means of the permuted V (the prepare's v_mean); warm: a
    previous (B,H,rank,D) basis of the same layer to start from."""
    if rank < 1:
        raise ValueError(f"rank must be at least 1, got {rank}.")
    b, h, _, d = v_perm.shape
    resid = reference.lowrank_residual_sample(v_perm, sample, block_means)
    cov = resid.transpose(-1, -2) @ resid  # (B,H,D,D) float32
    width = min(d, rank + oversample)
    x = _start(d, width, v_perm.device, torch.float32).expand(b, h, d, width)
    if warm is not None:  # the previous basis first, the fixed start's columns after it
        x = torch.cat([warm.float().transpose(-1, -2), x[..., : width - rank]], dim=-1)
    x = _orthonormalize(x)
    for _ in range(iters):
        x = _orthonormalize(cov @ x)
    _, vectors = torch.linalg.eigh(x.transpose(-1, -2) @ cov @ x)  # ascending
    return reference.signed_basis_fp16((x @ vectors[..., -rank:].flip(-1)).transpose(-1, -2))  # largest first
