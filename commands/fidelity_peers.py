"""Rows of the fidelity table for SageAttention, run on the user's GPU when it is installed.

`vc-attention fidelity` emulates our methods; for the peer that ComfyUI users actually run, the only
honest figure is its own output on the same Q/K/V. When `sageattention` is importable and the data
sits on a CUDA GPU, each of its entry points below runs once on the 16-bit inputs and its output is
measured against the same fp64 exact attention as every other row. A black box gives no P, so TV,
QK term and V term stay empty (NaN). We never bundle sageattention: the user's install is used.
"""
from __future__ import annotations

import importlib
import math
from importlib import metadata
from typing import Optional

import torch

from ..study.fidelity import FidelityRow, output_metrics

# entry point -> what it is: `sageattn` picks the kernel for the GPU; the second is the portable
# INT8 QK / FP8 PV CUDA kernel (SageAttention 2 on sm_89+)
ENTRY_POINTS = ("sageattn", "sageattn_qk_int8_pv_fp8_cuda")
# what a SageAttention call raises for inputs or GPUs it does not support (it validates with assert)
CALL_ERRORS = (RuntimeError, ValueError, TypeError, AssertionError, NotImplementedError)


def _on_gpu(q: torch.Tensor) -> bool:
    return q.is_cuda


def sageattention_module():
    """The installed sageattention module, or None."""
    try:
        return importlib.import_module("sageattention")
    except ImportError:
        return None


def sageattention_version(module) -> str:
    version = getattr(module, "__version__", None)
    if version:
        return str(version)
    try:
        return metadata.version("sageattention")
    except metadata.PackageNotFoundError:
        return "unknown version"


def unavailable_reason(q: torch.Tensor) -> Optional[str]:
    """Why no SageAttention rows can be added (None: they can)."""
    if not _on_gpu(q):
        return "the data is not on a CUDA GPU"
    if sageattention_module() is None:
        return "sageattention is not installed"
    return None


def sageattention_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, exact: torch.Tensor, notes: list) -> list:
    """One FidelityRow per available entry point; a call that fails adds a line to `notes` instead.

    q, k, v: (B,H,N,D); float32 inputs are rounded to bf16 first (SageAttention takes 16-bit only).
    """
    module = sageattention_module()
    if module is None:
        return []
    version = sageattention_version(module)
    q16, k16, v16 = (t if t.dtype in (torch.float16, torch.bfloat16) else t.to(torch.bfloat16) for t in (q, k, v))
    rows = []
    for name in ENTRY_POINTS:
        fn = getattr(module, name, None)
        if fn is None:
            notes.append(f"sageattention {version} has no {name}")
            continue
        try:
            out = fn(q16.contiguous(), k16.contiguous(), v16.contiguous(), tensor_layout="HND", is_causal=False)
        except CALL_ERRORS as err:
            notes.append(f"sageattention {version} {name} failed: {type(err).__name__}: {err}")
            continue
        rows.append(FidelityRow(
            method=f"SageAttention {version} {name} (GPU run)",
            **output_metrics(out, exact),
            tv_mean=math.nan, tv_max=math.nan, qk_term=math.nan, v_term=math.nan, v_share=math.nan,
        ))
    return rows
