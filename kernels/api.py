"""The public op: `vc_attention(q, k, v, ...)`, a torch custom op dispatching to a backend.

Registered with torch.library.custom_op plus a fake (meta) implementation, so torch.compile can
trace through a model that calls it without graph breaks inside the kernel.
"""
from __future__ import annotations

import re
import warnings
from collections import Counter
from typing import Optional, Union

import torch

from . import backends, inputs
from .config import FIDELITY, VCConfig
from .layout import to_bhnd

# Which backend ran how many calls in this process (tests use it to prove a fast path ran).
BACKEND_CALLS: Counter = Counter()
# (backend, configuration tag) of the calls that ran without some of their configuration's refinements, because their
# backend lacks them (VCConfig.refinements_dropped; e.g. the portable kernel has no second V term): what actually ran
REFINEMENTS_DROPPED: Counter = Counter()


# Devices on which `auto` runs the emulation without a word: the CPU, where it is the documented
# way to see the numerics. Anywhere else a user expects a kernel, so the swap is announced.
SILENT_EMULATION_DEVICES = ("cpu",)
_announced: set[str] = set()


def _announce_emulation(q: torch.Tensor, config: VCConfig, layout: str) -> None:
    """Warn once per distinct set of reasons that `auto` fell back to the slow emulation."""
    reasons = "; ".join(f"{name}: {why}" for name, why in backends.describe(q, config, layout) if why)
    if reasons in _announced:
        return
    _announced.add(reasons)
    warnings.warn(
        f"VC-Attention: no fast backend can run this call on {q.device} ({reasons}), so backend 'auto' runs "
        "the exact emulation, which is far slower than PyTorch's attention. Pass backend='reference' to "
        "choose it knowingly, or see `vc-attention doctor`. Calls are counted in BACKEND_CALLS['reference'].",
        RuntimeWarning,
        stacklevel=3,
    )


# One op per loaded copy of the package: ComfyUI imports the pack by folder name while a pip install
# provides `vc_attention`; one shared op name would let the last copy silently serve both.
OP_NAME = "vc_attention::attention_" + re.sub(r"\W", "_", __package__)


def _run(q, k, v, perm, v_basis, layout: str, config: VCConfig, sm_scale, backend: Union[str, backends.Backend],
         perm_from_grouping: bool) -> torch.Tensor:
    """One call after the public checks: the perm's values, the backend, its run (eager, real tensors)."""
    inputs.check_perm_values(perm, perm_from_grouping)
    # the one selection of this call: here, or by the caller that passed the Backend it selected
    if isinstance(backend, backends.Backend):
        chosen = backend
        # (a configuration without refinements skips the check: a short call's host time counts)
        runnable = backends.runnable_config(chosen, q, config, layout, k, v) if config.has_refinements else config
    else:  # the selection already found what the backend runs
        chosen, runnable = backends.select_runnable(q, config, layout, backend, kv=(k, v))
        if chosen.slow and backend == "auto" and q.device.type not in SILENT_EMULATION_DEVICES:
            _announce_emulation(q, config, layout)
    BACKEND_CALLS[chosen.name] += 1
    if runnable is not None and runnable != config:
        REFINEMENTS_DROPPED[(chosen.name, runnable.tag)] += 1
        config = runnable
    if v_basis is None:  # a backend's run takes v_basis only if it declares the low-rank term (max_v_rank)
        return chosen.run(q, k, v, perm, config, layout, sm_scale)
    return chosen.run(q, k, v, perm, config, layout, sm_scale, v_basis)


@torch.library.custom_op(OP_NAME, mutates_args=())
def _attention_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    perm: Optional[torch.Tensor],
    v_basis: Optional[torch.Tensor],
    layout: str,
    qk: str,
    v_format: str,
    p: str,
    smooth_k: bool,
    v_rank: int,
    v_mean_rows: int,
    v_mean_merge: bool,
    k_scale_rows: int,
    k_lane_scales: bool,
    v_lo_channels: int,
    sm_scale: Optional[float],
    backend: str,
    selected: bool,
    perm_from_grouping: bool,
) -> torch.Tensor:
    # every field of the caller's config (a field left out here silently ran its default: session 14's
    # v_mean_rows did, until tests/test_api.py's round trip checked each field)
    config = VCConfig(qk=qk, v=v_format, p=p, smooth_k=smooth_k, v_rank=v_rank, v_mean_rows=v_mean_rows,
                      v_mean_merge=v_mean_merge, k_scale_rows=k_scale_rows, k_lane_scales=k_lane_scales,
                      v_lo_channels=v_lo_channels)
    return _run(q, k, v, perm, v_basis, layout, config, sm_scale, backends.get(backend) if selected else backend,
                perm_from_grouping)


@_attention_op.register_fake
def _attention_fake(q, k, v, perm, v_basis, layout, qk, v_format, p, smooth_k, v_rank, v_mean_rows, v_mean_merge, k_scale_rows,
                    k_lane_scales, v_lo_channels, sm_scale, backend, selected, perm_from_grouping):
    return torch.empty_like(q)


def _through_the_op(*tensors: torch.Tensor) -> bool:
    """Whether a call goes through the registered custom op: while torch.compile / export traces, and for
    fake, meta or subclassed tensors (the dispatcher's cases). Plain tensors in eager mode call `_run`
    directly: the op's dispatch costs ~10-20 us of host time a call, which a short call (LTX-Video: a
    0.5 ms kernel) pays in full (docs/kernel-notes.md section 25)."""
    return torch.compiler.is_compiling() or any(type(t) is not torch.Tensor or t.is_meta for t in tensors)


def vc_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    layout: str = "bhnd",
    config: VCConfig = FIDELITY,
    perm: Optional[torch.Tensor] = None,
    sm_scale: Optional[float] = None,
    backend: Union[str, backends.Backend] = "auto",
    perm_from_grouping: bool = False,
    v_basis: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Non-causal self-attention with VC-Attention quantization (inference only: no backward).

    q, k, v: fp16/bf16 (fp32 on the reference backend), one shape, layout "bhnd" = (B,H,N,D) or
    "bnhd" = (B,N,H,D); any strides with a contiguous last dim. perm: (B,H,N) int32/int64 permutation
    of the key/value tokens (V-Smooth grouping, from kernels.grouping); None keeps the original order.
    Its range is always checked; that it is a permutation too (one bincount), unless
    perm_from_grouping=True promises it is kernels.grouping's perm() (a permutation by construction:
    the node's path). v_basis: with config.v_rank > 0, the low-rank V term's basis W (B,H,v_rank,D)
    fp16 of the PERMUTED V (kernels.reference.lowrank_basis; the node caches one per layer); None
    computes it on every call (a gather of V and an eigensolve per head: slow). sm_scale: defaults to 1/sqrt(D). backend: "auto", a registered name (see
    `vc-attention doctor`), or the Backend that `backends.select` returned for this very call (a caller
    that must know the backend before it runs, like the node: the call is then not checked a second
    time). "auto" runs the slow exact emulation where no kernel can take the call: quietly on the CPU,
    with a RuntimeWarning (once per reason) anywhere else. Returns a new tensor of q's shape, dtype
    and layout (empty if q is); fp16 saturates at +-65504. A NaN or Inf in q reaches at most its row (one
    scale per row, as SDPA), in k the whole head, in v that channel of the head (as in SDPA).
    """
    inputs.check_call(q, k, v, layout, config)
    b, h, n = to_bhnd(q, layout).shape[:3]
    inputs.check_perm_shape(perm, b, h, n)
    if q.numel() == 0:
        return torch.empty_like(q)
    inputs.check_basis(v_basis, config, b, h, to_bhnd(q, layout).shape[-1], q.device)
    if not _through_the_op(q, k, v):
        return _run(q, k, v, perm, v_basis, layout, config, sm_scale, backend, perm_from_grouping)
    selected = isinstance(backend, backends.Backend)
    return _attention_op(q, k, v, perm, v_basis, layout, config.qk, config.v, config.p, config.smooth_k, config.v_rank,
                         config.v_mean_rows, config.v_mean_merge, config.k_scale_rows, config.k_lane_scales,
                         config.v_lo_channels, sm_scale,
                         backend.name if selected else backend, selected,
                         perm_from_grouping)
