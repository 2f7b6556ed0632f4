"""Where in the denoising schedule an attention call is: active range and grouping window.

The thresholds are sigmas, computed once when sampling starts with the model's own
`model_sampling.percent_to_sigma` (the convention of ComfyUI's start/end_percent widgets, so 0.25
means a quarter of the model's time range, which the common schedulers map to a quarter of the
steps), and every model evaluation is placed by comparing its sigma with them. Comparing sigmas
rather than counting steps is what makes the schedule right for samplers that evaluate the model
several times per step (heun, dpmpp_sde: each evaluation is placed by its own noise level), for
split sampling (two KSamplerAdvanced nodes: sigmas are absolute, so the second model knows it is
past the window without having seen the first part) and for queued runs (nothing is counted).

Windows are half-open in percent: active for start <= p < end, grouping for p < window. Sigma
falls as p grows, so in sigmas: active for sigma_end < sigma <= sigma_start, grouping for
sigma > sigma_window. A sigma within a relative 1e-5 of a threshold counts as equal to it: the
scheduler's sigmas and percent_to_sigma compute the same boundary value through different float
paths (e.g. step 5 of a 20-step "simple" schedule and percent_to_sigma(0.25) on a flow model).
"""
from __future__ import annotations

from dataclasses import dataclass

REL_TOL = 1e-5


def _above(sigma: float, threshold: float) -> bool:
    """sigma > threshold, with values within REL_TOL of the threshold counted as equal."""
    return sigma > threshold * (1.0 + REL_TOL) if threshold > 0 else sigma > threshold


@dataclass(frozen=True)
class Phase:
    active: bool  # VC-Attention runs (inside start/end percent)
    grouping: bool  # recompute the token grouping (inside the grouping window)


@dataclass(frozen=True)
class SigmaSchedule:
    sigma_start: float
    sigma_end: float
    sigma_window: float

    @classmethod
    def from_model_sampling(cls, model_sampling, start_percent: float, end_percent: float, window: float):
        to_sigma = model_sampling.percent_to_sigma
        return cls(float(to_sigma(start_percent)), float(to_sigma(end_percent)), float(to_sigma(window)))

    def phase(self, sigma: float) -> Phase:
        active = not _above(sigma, self.sigma_start) and _above(sigma, self.sigma_end)
        return Phase(active=active, grouping=active and _above(sigma, self.sigma_window))
