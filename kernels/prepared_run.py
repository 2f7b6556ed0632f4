"""The run of every CUDA backend: the fused prepare, then the backend's attention over the operands.

A CUDA backend is "attention over prepared operands": it supplies only
`attend(ops, config, out, layout) -> out` (backends.Backend(attend=...) wraps it with prepared_run).
The inputs (q, k and v) were checked against the backend's declared constraints when it was selected.
"""
from __future__ import annotations

from typing import Callable

import torch

from .config import VCConfig
from .operands import PreparedOperands
from .prepare_cuda import prepare_cuda

# attend(ops, config, out, layout) -> out: the backend's kernel, writing q's shape in `layout`
AttendFn = Callable[[PreparedOperands, VCConfig, torch.Tensor, str], torch.Tensor]


def prepared_run(attend: AttendFn):
    """The backend `run(q, k, v, perm, config, layout, sm_scale, v_basis=None)` that prepares, then calls
    `attend`."""

    def run(q, k, v, perm, config: VCConfig, layout: str, sm_scale, v_basis=None) -> torch.Tensor:
        # no torch.cuda.device context (~5 us a call): the bindings put their launches on their tensors' GPU
        ops = prepare_cuda(q, k, v, perm, config, layout, sm_scale, basis=v_basis)
        # the output takes q's strides where q is dense (as SDPA's does): a caller that passed (B,H,N,D)
        # views of (B,N,H,D) memory (diffusers) gets (B,N,H,D) memory back, so its transpose-and-flatten
        # after the call is a view, not a copy of the whole output (~0.3 ms a call at Wan2.2-14B 720p)
        return attend(ops, config, torch.empty_like(q), layout)

    return run
