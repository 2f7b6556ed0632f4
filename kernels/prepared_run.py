"""The run of every CUDA backend: the fused prepare, then the backend's attention over the operands.

A CUDA backend is "attention over prepared operands": it supplies only
`attend(ops, config, out, layout) -> out` and registers `run=prepared_run(attend, name)`.
"""
from __future__ import annotations

from typing import Callable

import torch

from .config import VCConfig
from .operands import PreparedOperands, rows_aligned
from .prepare_cuda import prepare_cuda

# attend(ops, config, out, layout) -> out: the backend's kernel, writing q's shape in `layout`
AttendFn = Callable[[PreparedOperands, VCConfig, torch.Tensor, str], torch.Tensor]


def prepared_run(attend: AttendFn, backend: str):
    """The backend `run(q, k, v, perm, config, layout, sm_scale)` that prepares, then calls `attend`."""

    def run(q, k, v, perm, config: VCConfig, layout: str, sm_scale) -> torch.Tensor:
        for name, t in (("k", k), ("v", v)):  # q was checked when the backend was chosen
            if not rows_aligned(t):
                raise ValueError(f"{name} needs a contiguous last dim and 16-byte aligned rows for the {backend} backend.")
        with torch.cuda.device(q.device):
            ops = prepare_cuda(q, k, v, perm, config, layout, sm_scale)
            return attend(ops, config, torch.empty(q.shape, dtype=q.dtype, device=q.device), layout)

    return run
