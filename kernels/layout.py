"""The two token layouts of q, k, v and the output: "bhnd" = (B, H, N, D) and "bnhd" = (B, N, H, D).

Everything inside the kernels works on (B, H, N, D); these helpers convert a tensor given in a
layout as a view (never a copy) and check the layout name, for every module that needs it.
"""
from __future__ import annotations

import torch

from .config import LAYOUTS


def check_layout(layout: str) -> None:
    """Raise ValueError unless `layout` is one of LAYOUTS."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}.")


def to_bhnd(x: torch.Tensor, layout: str) -> torch.Tensor:
    """View (B,H,N,D) of a 4-D tensor given in `layout`; never copies."""
    check_layout(layout)
    if x.dim() != 4:
        raise ValueError(f"expected a 4-D tensor in layout {layout!r}, got shape {tuple(x.shape)}.")
    return x if layout == "bhnd" else x.transpose(1, 2)


def from_bhnd(x: torch.Tensor, layout: str) -> torch.Tensor:
    """Inverse of to_bhnd (a view)."""
    return to_bhnd(x, layout)


def shape_in(layout: str, b: int, h: int, n: int, d: int) -> tuple[int, int, int, int]:
    """The 4-D shape of (B, H, N, D) data stored in `layout`."""
    check_layout(layout)
    return (b, h, n, d) if layout == "bhnd" else (b, n, h, d)
