"""Which denoising step an attention call belongs to, and the per-layer grouping cache it uses.

diffusers hands an attention backend the tensors only: no module, no timestep. The step is told by
the pipeline through its `callback_on_step_end` (VCDiffusersBackend.step_callback), which every
diffusers video pipeline calls after each step with the step index, and whose pipeline knows the
step count (`num_timesteps`). A layer is recognized by the order of the eligible calls within one
step (Wan, with CFG as two forwards: call 0..39 conditional, 40..79 unconditional, the same order at
every step). A key that names the wrong layer (a model whose call order changes between steps) can
only cost fidelity, never correctness: any permutation of K and V together leaves attention exact.

Without step information (no callback) every call groups from scratch and nothing is cached: correct,
with the grouping cost on every step. Step 0 of the first run has no callback yet, so it groups
uncached too; the cache starts at step 1. A run that stops sending callbacks is recognized when a
step makes more eligible calls than the previous one did: the cache is freed and calls go back to
uncached grouping until the next callback.
"""
from __future__ import annotations

import logging
from typing import Optional

import torch

from ..kernels.grouping import DEFAULT_WITHIN_BINS, group_tokens
from ..nodes.cache import GroupingCache, LayerKey
from .backend_stats import BackendStats


class DenoisingSteps:
    def __init__(self, window: float, clusters: int, iters: int, stats: BackendStats, within_bins: int = DEFAULT_WITHIN_BINS) -> None:
        self.window, self.clusters, self.iters, self.stats = window, clusters, iters, stats
        self.within_bins = within_bins  # kernels/grouping_within.py; 0: token order inside a cluster
        self.cache = GroupingCache()
        self.reset()

    def reset(self) -> None:
        """Forget the run: no step information until the next step callback."""
        self.cache.clear()
        self.tracking = False
        self.step = 0
        self.num_steps: Optional[int] = None
        self.calls_this_step = 0
        self.calls_last_step: Optional[int] = None

    @property
    def in_window(self) -> bool:
        """Inside the grouping window: the first `window` fraction of the steps (step 0 whenever window > 0)."""
        if self.num_steps is None:
            return self.window > 0
        return self.step < self.window * self.num_steps

    def end_step(self, step: int, num_steps: int) -> None:
        """Step `step` (0-based) of `num_steps` has finished; the next call belongs to the next step."""
        if num_steps < 1 or not 0 <= step < num_steps:
            raise ValueError(f"step must be in 0..num_steps-1, got step {step} of {num_steps}.")
        self.tracking = True
        self.calls_last_step, self.calls_this_step = self.calls_this_step, 0
        if step + 1 == num_steps:  # the run is over: the next call is step 0 of a new one
            self.cache.clear()
            self.step, self.num_steps = 0, None
            return
        self.step, self.num_steps = step + 1, num_steps
        if not self.in_window:
            self.cache.drop_centroids()  # nothing warm-starts from here on

    def permutation(self, v_bhnd: torch.Tensor) -> torch.Tensor:
        """The V-Smooth permutation of this call: regrouped inside the window, reused after it."""
        self.calls_this_step += 1
        if self.tracking and self.calls_last_step and self.calls_this_step > self.calls_last_step:
            logging.warning("VC-Attention (diffusers): no step callback arrived where one was due; the "
                            "grouping cache is freed and every call groups until the next callback.")
            self.reset()
        if not self.tracking:
            self.stats.groupings += 1
            return group_tokens(v_bhnd, self.clusters, self.iters, within_bins=self.within_bins).perm()
        b, h, n, d = v_bhnd.shape
        # one entry per call position: a new token count or batch replaces the old entry (LayerKey)
        key = LayerKey(block=("call", self.calls_this_step), nth=0, branches=(), tokens=n, batch=b)
        cached = self.cache.get(key)
        if cached is not None and cached.labels.shape[1] != h:  # another layer took this position
            cached = None
        warm_ok = cached is not None and cached.centroids is not None and cached.centroids.shape[-1] == d
        if cached is not None and not self.in_window:
            self.stats.reused_groupings += 1
            return cached.perm(v_bhnd)
        warm = cached if warm_ok else None
        grouping = group_tokens(v_bhnd, self.clusters, self.iters, warm_start=warm, within_bins=self.within_bins)
        if not self.in_window:  # a layer first seen after the window: grouped once, reused from now on
            grouping.drop_centroids()
        self.cache.put(key, grouping)
        self.stats.groupings += 1
        return grouping.perm(v_bhnd)
