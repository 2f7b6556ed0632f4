"""PSNR and SSIM per frame for ComfyUI IMAGE batches ((B, H, W, C) floats in [0, 1]).

PSNR: 10 log10(1 / MSE) over all pixels and channels of a frame (peak 1.0; identical frames give
inf). SSIM: Wang et al. 2004 with the usual constants (11x11 Gaussian window, sigma 1.5,
K1 = 0.01, K2 = 0.03, data range 1.0), computed per channel on the valid region (no padding) and
averaged over channels and pixels, as scikit-image does with gaussian_weights=True.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

SSIM_WINDOW = 11
SSIM_SIGMA = 1.5
SSIM_C1 = 0.01**2
SSIM_C2 = 0.03**2


def check_pair(a: torch.Tensor, b: torch.Tensor) -> None:
    if a.dim() != 4 or b.dim() != 4:
        raise ValueError(f"expected two IMAGE batches (B, H, W, C), got shapes {tuple(a.shape)} and {tuple(b.shape)}.")
    if a.shape != b.shape:
        raise ValueError(
            f"the two image batches differ in shape: {tuple(a.shape)} vs {tuple(b.shape)}; compare runs "
            "with the same resolution and frame count."
        )
    if min(a.shape[1], a.shape[2]) < SSIM_WINDOW:
        raise ValueError(f"frames must be at least {SSIM_WINDOW}x{SSIM_WINDOW} pixels for SSIM, got {a.shape[1]}x{a.shape[2]}.")


def psnr_per_frame(a: torch.Tensor, b: torch.Tensor) -> list[float]:
    check_pair(a, b)
    mse = (a.double() - b.double()).pow(2).flatten(1).mean(dim=1)
    return [math.inf if m == 0 else 10.0 * math.log10(1.0 / m) for m in mse.tolist()]


def _gaussian_window(device) -> torch.Tensor:
    x = torch.arange(SSIM_WINDOW, dtype=torch.float64, device=device) - (SSIM_WINDOW - 1) / 2
    g = torch.exp(-(x**2) / (2 * SSIM_SIGMA**2))
    g = g / g.sum()
    return (g[:, None] * g[None, :]).view(1, 1, SSIM_WINDOW, SSIM_WINDOW)


def ssim_per_frame(a: torch.Tensor, b: torch.Tensor) -> list[float]:
    check_pair(a, b)
    x = a.double().permute(0, 3, 1, 2)  # (B, C, H, W)
    y = b.double().permute(0, 3, 1, 2)
    channels = x.shape[1]
    w = _gaussian_window(x.device).expand(channels, 1, -1, -1)

    def blur(t):
        return F.conv2d(t, w, groups=channels)

    mu_x, mu_y = blur(x), blur(y)
    var_x = blur(x * x) - mu_x**2
    var_y = blur(y * y) - mu_y**2
    cov = blur(x * y) - mu_x * mu_y
    ssim_map = ((2 * mu_x * mu_y + SSIM_C1) * (2 * cov + SSIM_C2)) / (
        (mu_x**2 + mu_y**2 + SSIM_C1) * (var_x + var_y + SSIM_C2)
    )
    return ssim_map.flatten(1).mean(dim=1).tolist()
