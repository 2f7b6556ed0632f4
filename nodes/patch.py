"""One VC-Attention patch on a cloned MODEL: settings plus the state of the current sampling run.

Lifecycle, through ComfyUI's supported hooks only (the original MODEL is never touched):
- `install` clones the model patcher, puts our override on
  model_options["transformer_options"]["optimized_attention_override"] (chaining the one that was
  there) and registers two callbacks on the clone: ON_PRE_RUN (sampling starts: compute the sigma
  thresholds from the model's percent_to_sigma, empty the cache and the counters) and ON_CLEANUP
  (sampling ends: publish the stats once, free the cache).
- each attention call goes to `attend`: eligibility, then the schedule, then the per-shape verdict
  of the stats (balanced and speed run the model's attention where VC-Attention measured slower),
  then grouping from the per-layer cache, then the kernel.
A forward pass is recognized by its transformer_options dict: ComfyUI's BaseModel._apply_model
hands every model call a fresh copy, which each block then passes down unchanged, so the sigma of
the call is read (one host sync) and the per-block call counters reset once per forward.
"""
from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from typing import Optional

import torch

from ..kernels import backends, jit
from ..kernels.api import vc_attention
from ..kernels.config import VCConfig
from ..kernels.grouping import DEFAULT_WITHIN_BINS, group_tokens
from ..kernels.layout import to_bhnd
from . import cross_attention as X
from . import override as O
from .cache import GroupingCache, LayerKey
from .schedule import Phase, SigmaSchedule
from .stats import RunStats, publish

CALLBACK_KEY = "vc_attention"


@dataclass(frozen=True)
class Settings:
    config: VCConfig
    clusters: int
    kmeans_iters: int
    grouping_window: float
    start_percent: float
    end_percent: float
    backend: str = "auto"
    # balanced and speed: run the model's attention at a shape where VC-Attention measured slower
    avoid_slower: bool = False
    # V-Smooth's within-cluster order: each cluster's tokens in this many bins along its chain direction
    # (kernels/grouping_within.py), recomputed from the call's V on reuse steps; 0 keeps token order
    within_bins: int = DEFAULT_WITHIN_BINS

    @property
    def grouping_rate(self) -> float:
        """Expected share of the active steps that regroup (the grouping window's part of them)."""
        if not self.config.needs_grouping:
            return 0.0
        span = self.end_percent - self.start_percent
        return min(1.0, max(0.0, (self.grouping_window - self.start_percent) / span)) if span > 0 else 0.0


class VCPatch:
    def __init__(self, settings: Settings, node_id: str = "") -> None:
        self.settings = settings
        self.node_id = node_id
        self.schedule: Optional[SigmaSchedule] = None
        self.cache = GroupingCache()
        self.stats = RunStats(settings.grouping_rate)
        self.cross_stats = RunStats()  # cross-attention: cuDNN against the model's attention (cross_attention.py)
        self._reset_run_state()

    # ------------------------------------------------------------------ run lifecycle
    def start_run(self, model_patcher) -> None:
        s = self.settings
        self.schedule = SigmaSchedule.from_model_sampling(
            model_patcher.get_model_object("model_sampling"), s.start_percent, s.end_percent, s.grouping_window
        )
        self.cache.clear()
        self.stats.reset()
        self.cross_stats.reset()
        self._reset_run_state()

    def end_run(self, model_patcher=None) -> None:
        if self.stats.backend_calls or self.stats.fallbacks:
            publish(self.stats.payload(self.node_id, kept_slower=not self.settings.avoid_slower,
                                       cross=self.cross_summary()))
        self.cache.clear()
        self.stats.reset()
        self.cross_stats.reset()
        self._reset_run_state()

    def cross_summary(self) -> tuple[dict, list]:
        """The run's cross-attention routes (calls per route) and the shapes where cuDNN measured slower."""
        slower = self.cross_stats.payload(self.node_id)["slower_shapes"] if self._cross_routes else []
        return dict(self._cross_routes), slower

    def _reset_run_state(self) -> None:
        self._forward_options: Optional[dict] = None
        self._phase: Optional[Phase] = None
        self._calls_in_forward: Counter = Counter()
        self._window_closed = False
        self._warned_slower: set[tuple] = set()
        self._cross_routes: Counter = Counter()  # "cudnn", "model", "model: <why not cuDNN>"
        self._cross_failed: set[tuple] = set()  # cross-attention shapes where cuDNN raised

    def _enter_forward(self, transformer_options: Optional[dict]) -> None:
        """Place a new forward pass in the schedule (once per forward, not per call)."""
        if transformer_options is self._forward_options:
            return
        self._forward_options = transformer_options
        self._calls_in_forward = Counter()
        sigmas = (transformer_options or {}).get("sigmas")
        if sigmas is None or self.schedule is None:
            self._phase = None
            return
        sigma = float(torch.as_tensor(sigmas).reshape(-1)[0])
        self._phase = self.schedule.phase(sigma)
        self.stats.sigmas.add(sigma)  # every step the model ran, VC-Attention active or not
        if self._phase.active and not self._phase.grouping and not self._window_closed:
            self._window_closed = True  # nothing warm-starts from here on
            self.cache.drop_centroids()

    # ------------------------------------------------------------------ one attention call
    def attend(self, call: O.AttentionCall) -> torch.Tensor:
        transformer_options = call.kwargs.get("transformer_options")
        self._enter_forward(transformer_options)  # first: a step counts even when every call falls back
        reason = O.ineligible(call.q, call.k, call.v, call.heads, call.mask, call.skip_reshape, call.kwargs)
        if reason is not None:
            self.stats.fallback(*reason)
            if reason[0] == O.CROSS_ATTENTION and self._phase is not None and self._phase.active:
                return self._cross_attention(call)
            return call.model_attention()
        if self._phase is None:
            self.stats.fallback(O.NO_SIGMA, "the call carries no sampling sigma, so its step is unknown")
            return call.model_attention()
        if not self._phase.active:
            self.stats.fallback(O.OUTSIDE_RANGE)
            return call.model_attention()

        q, layout = O.to_kernel_layout(call.q, call.heads, call.skip_reshape)
        k, _ = O.to_kernel_layout(call.k, call.heads, call.skip_reshape)
        v, _ = O.to_kernel_layout(call.v, call.heads, call.skip_reshape)
        config, requested = self.settings.config, self.settings.backend
        try:
            # auto never picks the emulation: it is exact but far slower than the model's attention
            chosen = backends.select(q, config, layout, requested, allow_slow=False, kv=(k, v))
        except backends.NoCapableBackend as err:
            if requested != "auto":
                raise
            self.stats.fallback(O.NO_BACKEND if q.is_cuda else O.NO_GPU, str(err))
            return call.model_attention()
        reason = O.unsupported_tensors(call.q, call.k, call.v)
        if reason is not None:
            self.stats.fallback(*reason)
            return call.model_attention()

        v_bhnd = to_bhnd(v, layout)
        shape = tuple(v_bhnd.shape)
        key = self._layer_key(transformer_options or {}, v_bhnd.shape)  # first: keys stay stable if a shape switches
        # the emulation is the exact spec, slow by design (the CPU demo path): never judged on speed
        if chosen.name != "reference" and self.stats.is_slower(shape):
            if self.settings.avoid_slower:
                self.stats.fallback(O.SLOWER, f"VC-Attention with its grouping measured slower than the model's "
                                              f"attention at (B, H, N, D) = {shape}")
                return call.model_attention()
            self._warn_slower_once(shape)
        sm_scale = call.kwargs.get("scale")

        def group():
            return self._permutation(key, v_bhnd) if config.needs_grouping else None

        def attend(perm):
            return vc_attention(q, k, v, layout=layout, config=config, perm=perm, sm_scale=sm_scale,
                                backend=chosen, perm_from_grouping=True)

        self.stats.check_finite(q, k, v)
        # the model attention's time depends on these (an earlier run's baseline stands in for this one's)
        baseline_id = (shape, str(q.dtype), str(q.device), layout, call.skip_output_reshape, call.model_attention_id())
        try:
            out, from_model = self.stats.run_call(shape, q.device, group, attend, call.model_attention, baseline_id)
        except jit.JitError as err:
            # the first call builds the kernels; a broken toolchain must not stop the user's run:
            # under "auto" this backend is dropped for the process and the model's attention runs
            if requested != "auto":
                raise
            chosen.disable(f"its CUDA build failed: {err}")
            logging.warning(f"VC-Attention: the {chosen.name} kernels could not be built; using the model's "
                            f"attention for these calls. {err}")
            self.stats.fallback(O.BUILD_FAILED, str(err))
            return call.model_attention()
        if from_model:  # the timing baseline stood in for this call
            return out
        self.stats.backend_calls[chosen.name] += 1
        return O.to_output_layout(out, layout, call.skip_output_reshape)

    def _cross_attention(self, call: O.AttentionCall) -> torch.Tensor:
        """A cross-attention call inside the active range: exact attention on cuDNN where torch can run it
        there and it has not measured slower than the model's attention at this shape, else the model's."""
        q, k, v = X.bhnd_views(call)
        why = X.cudnn_reason(q, k, v, call.mask, call.kwargs)
        if why is not None:
            self._cross_routes[f"model: {why}"] += 1
            return call.model_attention()
        shape = tuple(q.shape) + (k.shape[2],)  # (B, H, N queries, D, N keys)
        if shape in self._cross_failed:
            self._cross_routes["model: cuDNN failed at this shape"] += 1
            return call.model_attention()
        if self.cross_stats.is_slower(shape):
            self._cross_routes["model: cuDNN measured slower"] += 1
            return call.model_attention()
        baseline_id = ("cross", shape, str(q.dtype), str(q.device), call.skip_reshape, call.skip_output_reshape,
                       call.model_attention_id())
        try:
            out, from_model = self.cross_stats.run_call(shape, q.device, lambda: None,
                                                        lambda _: X.cudnn_attention(call, q, k, v), call.model_attention,
                                                        baseline_id)
        except RuntimeError as err:  # cuDNN refused what torch said it takes: never stop the user's run
            self._cross_failed.add(shape)
            logging.warning(f"VC-Attention: cuDNN attention failed on a cross-attention call at {shape}; the model's "
                            f"attention runs there for the rest of the run. {err}")
            self._cross_routes["model: cuDNN failed at this shape"] += 1
            return call.model_attention()
        self._cross_routes["model" if from_model else "cudnn"] += 1
        return out

    def _warn_slower_once(self, shape: tuple) -> None:
        if shape not in self._warned_slower:
            self._warned_slower.add(shape)
            logging.warning(f"VC-Attention: slower than the model's attention at (B, H, N, D) = {shape}; kept "
                            "because the node is set to fidelity or custom (balanced and speed switch to the "
                            "model's attention there).")

    def _layer_key(self, transformer_options: dict, bhnd: torch.Size) -> LayerKey:
        index = transformer_options.get("block_index")
        if index is None:  # models that report no block index: eligible-call order in this forward
            block = ("call", sum(self._calls_in_forward.values()))
        else:
            block = (transformer_options.get("block_type"), index)
        nth = self._calls_in_forward[block]
        self._calls_in_forward[block] += 1
        branches = tuple(transformer_options.get("cond_or_uncond") or ())
        return LayerKey(block, nth, branches, bhnd[2], bhnd[0])

    def _permutation(self, key: LayerKey, v_bhnd: torch.Tensor) -> torch.Tensor:
        """Regroup inside the grouping window (warm start from the last grouping), else reuse.

        A layer first seen after the window (e.g. the low-noise model of split sampling, or a
        start_percent past the window) is grouped once and reused from then on.
        """
        cached = self.cache.get(key)
        if cached is not None and not self._phase.grouping:
            return cached.perm(v_bhnd)
        warm = cached if cached is not None and cached.has_centroids else None
        grouping = group_tokens(v_bhnd, self.settings.clusters, self.settings.kmeans_iters, warm_start=warm,
                                within_bins=self.settings.within_bins)
        if not self._phase.grouping:
            grouping.drop_centroids()
        self.stats.cache_evictions += self.cache.put(key, grouping)
        self.stats.grouping_calls += 1
        return grouping.perm(v_bhnd)


def install_handler(model_patcher, handler, on_pre_run, on_cleanup, key: str):
    """A clone of `model_patcher` whose attention hook sends every call to `handler`.

    The override already on the hook is chained (it gets the calls `handler` declines); the
    callbacks run when sampling starts and ends. The original model patcher is untouched.
    """
    from comfy.patcher_extension import CallbacksMP  # ComfyUI's own module (only inside ComfyUI)

    patched = model_patcher.clone()
    transformer_options = patched.model_options.setdefault("transformer_options", {})
    previous = transformer_options.get("optimized_attention_override")
    transformer_options["optimized_attention_override"] = O.make_override(handler, previous)
    patched.add_callback_with_key(CallbacksMP.ON_PRE_RUN, key, on_pre_run)
    patched.add_callback_with_key(CallbacksMP.ON_CLEANUP, key, on_cleanup)
    return patched


def install(model_patcher, patch: VCPatch):
    """A clone of `model_patcher` with VC-Attention on its self-attention."""
    return install_handler(model_patcher, patch.attend, patch.start_run, patch.end_run, CALLBACK_KEY)
