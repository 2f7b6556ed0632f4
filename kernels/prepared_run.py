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
        return attend(ops, config, torch.empty(q.shape, dtype=q.dtype, device=q.device), layout)

    return run
