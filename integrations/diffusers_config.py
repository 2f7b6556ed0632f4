"""What the diffusers backend runs: a preset (the node's table) and the grouping schedule.

The presets are the node's own (nodes/presets.py), so "balanced" means the same quantization,
clusters, k-means iterations and grouping window in a ComfyUI graph and in a diffusers pipeline.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..kernels.config import VCConfig
from ..kernels.grouping_within import check_bins
from ..nodes.presets import PRESETS, config_from_widgets
from ..nodes.presets import within_bins as preset_within_bins

DIFFUSERS_MODES = tuple(PRESETS)  # fidelity, balanced, speed


@dataclass(frozen=True)
class VCDiffusersConfig:
    """mode: a preset name. grouping_window / clusters / kmeans_iters: None takes the preset's value.

    grouping_window: fraction of the denoising steps (from the start) in which the V-Smooth grouping is
    recomputed; later steps reuse it (needs the step callback, see docs/diffusers.md).
    backend: "auto" (the fastest capable kernel; calls no kernel can take run diffusers' native
    attention, counted) or a kernel backend name: every eligible call must run on it, else an error.
    within_bins: V-Smooth's within-cluster order (kernels/grouping_within.py): each cluster's tokens in
    that many bins (2-32) along its chain direction, recomputed from each call's V on reuse steps; 0 keeps
    token order; None takes the preset's (nodes/presets.WITHIN_BINS, like the node). Emulated -2.2% / -2.6%
    rel-L2 in fidelity mode at 32,760 / 75,600 tokens (docs/fidelity-study.md); fidelity and balanced take 8
    (docs/kernel-notes.md sections 35 and 42).
    """

    mode: str = "balanced"
    grouping_window: Optional[float] = None
    clusters: Optional[int] = None
    kmeans_iters: Optional[int] = None
    backend: str = "auto"
    within_bins: Optional[int] = None

    def __post_init__(self) -> None:
        if self.within_bins is not None:
            check_bins(self.within_bins)
        if self.mode not in DIFFUSERS_MODES:
            raise ValueError(f"VCDiffusersConfig.mode must be one of {DIFFUSERS_MODES}, got {self.mode!r}.")
        if self.grouping_window is not None and not 0.0 <= self.grouping_window <= 1.0:
            raise ValueError(f"grouping_window must be between 0 and 1, got {self.grouping_window}.")
        if self.clusters is not None and self.clusters < 2:
            raise ValueError(f"clusters must be at least 2, got {self.clusters}.")
        if self.kmeans_iters is not None and self.kmeans_iters < 0:
            raise ValueError(f"kmeans_iters must be >= 0, got {self.kmeans_iters}.")

    def _preset(self, name: str):
        value = getattr(self, name)
        return PRESETS[self.mode][name] if value is None else value

    @property
    def kernel_config(self) -> VCConfig:
        return config_from_widgets(PRESETS[self.mode])

    @property
    def window(self) -> float:
        return float(self._preset("grouping_window"))

    @property
    def num_clusters(self) -> int:
        return int(self._preset("clusters"))

    @property
    def iters(self) -> int:
        return int(self._preset("kmeans_iters"))

    @property
    def bins(self) -> int:
        """The within-cluster bins the groupings take: within_bins, else the preset's."""
        return preset_within_bins(self.mode) if self.within_bins is None else int(self.within_bins)
