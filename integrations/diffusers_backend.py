"""VC-Attention as an attention backend of diffusers' dispatcher, Ulysses context parallel included.

    from vc_attention.integrations.diffusers_backend import register_diffusers_backend, VCDiffusersConfig
    vc = register_diffusers_backend(VCDiffusersConfig(mode="balanced"))
    pipe.transformer.set_attention_backend("vc_attention")
    video = pipe(prompt, callback_on_step_end=vc.step_callback).frames[0]

diffusers lists its backends in a closed enum (AttentionBackendName) and a registry class
(_AttentionBackendRegistry); registration adds one enum member at runtime (once per process) and
registers our function under it with supports_context_parallel=True. Both are private API, so the
registration ends with a self-test through diffusers' own dispatch_attention_fn: a diffusers whose
internals differ fails there with one sentence naming the supported range.

Calls our kernels cannot take (masks, causal, dropout, GQA, log-sum-exp, cross-attention, gradients,
a device/dtype/head dim no kernel supports) go to diffusers' native backend, counted per reason in
`vc.stats`.

Context parallel: under ContextParallelConfig(ulysses_degree=P) diffusers' Ulysses template exchanges
q, k, v so that each GPU holds every token of H/P heads, then calls our kernel: V-Smooth's per-head
grouping over all tokens is exactly valid there. Ring attention gives each GPU a slice of the tokens,
so no GPU could group a head's values over the whole sequence: ring_degree > 1 is refused.
"""
from __future__ import annotations

import functools
import inspect
import logging
from importlib import metadata
from typing import Optional

import torch

from ..kernels import backends, jit
from ..kernels.api import vc_attention
from ..kernels.layout import to_bhnd
from .backend_stats import BackendStats
from .denoising_steps import DenoisingSteps
from .diffusers_config import VCDiffusersConfig

BACKEND_NAME = "vc_attention"
ENUM_MEMBER = "VC_ATTENTION"
# The diffusers versions this module was tested with (tests/test_diffusers_backend.py): the private
# registry it extends changes between minor releases. Keep in step with pyproject's [diffusers] extra.
SUPPORTED_DIFFUSERS = ">=0.42,<0.43"
_SUPPORTED_MINOR = (0, 42)
LAYOUT = "bnhd"  # diffusers hands backends (B, N, H, D)


class UnsupportedDiffusersVersion(RuntimeError):
    """This diffusers' attention dispatcher does not work the way this module relies on."""


def _dispatch_module():
    try:
        from diffusers.models import attention_dispatch
    except ImportError as err:
        raise ImportError(
            f"VC-Attention's diffusers backend needs diffusers{SUPPORTED_DIFFUSERS} "
            f"(pip install 'comfyui-vc-attention[diffusers]'): {err}"
        ) from err
    return attention_dispatch


def _diffusers_version() -> str:
    try:
        return metadata.version("diffusers")
    except metadata.PackageNotFoundError:
        return "(unknown version)"


def _unsupported(detail: str) -> UnsupportedDiffusersVersion:
    return UnsupportedDiffusersVersion(
        f"diffusers {_diffusers_version()} is not supported by VC-Attention's backend (supported: "
        f"diffusers{SUPPORTED_DIFFUSERS}; {detail})."
    )


def extend_backend_enum(enum_cls, name: str = ENUM_MEMBER, value: str = BACKEND_NAME):
    """The enum member for `value`, added to the closed str Enum on first use (idempotent).

    Python offers no API to add a member, so the member is built the way EnumType builds its own
    and entered in the three tables lookups read: by value (AttentionBackendName("vc_attention")),
    by name (__members__, which set_attention_backend lists) and the class attribute.
    """
    existing = enum_cls._value2member_map_.get(value)
    if existing is not None:
        return existing
    member = str.__new__(enum_cls, value)
    member._name_ = name
    member._value_ = value
    member.__objclass__ = enum_cls
    member._sort_order_ = len(enum_cls._member_names_)
    type.__setattr__(enum_cls, name, member)  # EnumType.__setattr__ refuses member names
    enum_cls._member_map_[name] = member
    enum_cls._value2member_map_[value] = member
    enum_cls._member_names_.append(name)
    return member


def _no_backward(ctx, grad_out, *args):
    raise NotImplementedError("VC-Attention's kernels are inference-only; calls that need gradients run "
                              "diffusers' native attention.")


def refuse_ring(context_parallel_config) -> None:
    """Raise when the context-parallel layout shards tokens (ring attention): see the module docstring."""
    ring = getattr(context_parallel_config, "ring_degree", 1) or 1
    if ring > 1:
        raise ValueError(
            f"VC-Attention cannot run under ring attention (ring_degree={ring}): ring attention gives each "
            "GPU a slice of the tokens, while V-Smooth groups each head's value tokens over the whole "
            "sequence; use ContextParallelConfig(ulysses_degree=P), which gives each GPU every token of "
            "H/P heads."
        )


def _ineligible(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa, return_lse) -> Optional[str]:
    """Why our kernels cannot take this call from the call's own arguments (None: they can)."""
    if attn_mask is not None:
        return "an attention mask"
    if is_causal:
        return "causal attention"
    if dropout_p:
        return "dropout"
    if enable_gqa:
        return "grouped-query attention"
    if return_lse:
        return "the log-sum-exp was requested"
    if query.shape != key.shape or query.shape != value.shape:
        return "cross-attention (q, k, v shapes differ)"
    if query.numel() == 0:
        return "empty inputs"
    if torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value)):
        return "gradients are needed (the kernels are inference-only)"
    return None


class VCDiffusersBackend:
    """The registered backend: run state (grouping schedule) and stats of one registration."""

    def __init__(self, config: VCDiffusersConfig, dispatch) -> None:
        self.config = config
        self.kernel_config = config.kernel_config
        self.stats = BackendStats()
        self.steps = DenoisingSteps(config.window, config.num_clusters, config.iters, self.stats, config.bins)
        self._native = dispatch._AttentionBackendRegistry._backends[dispatch.AttentionBackendName.NATIVE]
        self._templated = dispatch._templated_context_parallel_attention

    # ------------------------------------------------------------------ the step schedule
    def step_callback(self, pipe, step: int, timestep, callback_kwargs: dict) -> dict:
        """Pass as `callback_on_step_end=` to a diffusers pipeline: tells the backend each step's end."""
        self.end_step(step, _step_count(pipe))
        return callback_kwargs

    def end_step(self, step: int, num_steps: int) -> None:
        """For a hand-written denoising loop: call after step `step` (0-based) of `num_steps`."""
        self.steps.end_step(step, num_steps)

    def reset(self) -> None:
        """Forget the current run (frees the grouping cache); the stats are kept."""
        self.steps.reset()

    # ------------------------------------------------------------------ one attention call
    def attention(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: Optional[torch.Tensor] = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: Optional[float] = None,
        enable_gqa: bool = False,
        return_lse: bool = False,
        _parallel_config=None,
    ):
        """diffusers calls this with (B, N, H, D) tensors; the parameter names are diffusers' (it passes
        only the arguments this signature names)."""
        cp = getattr(_parallel_config, "context_parallel_config", None)
        if cp is not None:
            refuse_ring(cp)
        reason = _ineligible(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa, return_lse)
        chosen = None
        if reason is None:
            chosen, reason = self._select(query, key, value)
        if reason is not None:
            self.stats.fallbacks[reason] += 1
            return self._native(query=query, key=key, value=value, attn_mask=attn_mask, dropout_p=dropout_p,
                                is_causal=is_causal, scale=scale, enable_gqa=enable_gqa, return_lse=return_lse,
                                _parallel_config=_parallel_config)
        if cp is None:
            return self._run(chosen, query, key, value, scale)
        # Ulysses: diffusers' template exchanges q, k, v (all tokens, H/P heads here) and calls forward_op
        return self._templated(query, key, value, None, 0.0, False, scale, False, False,
                               forward_op=functools.partial(self._forward_op, chosen), backward_op=_no_backward,
                               _parallel_config=_parallel_config)

    def _select(self, query, key, value) -> tuple[Optional[backends.Backend], Optional[str]]:
        requested = self.config.backend
        try:
            # under "auto" the slow emulation never stands in for a kernel: native attention is faster
            return backends.select(query, self.kernel_config, LAYOUT, requested, allow_slow=False,
                                   kv=(key, value)), None
        except backends.NoCapableBackend as err:
            if requested != "auto":
                raise
            return None, str(err)

    def _forward_op(self, chosen, ctx, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                    scale=None, enable_gqa=False, return_lse=False, _save_ctx=True, _parallel_config=None):
        self.stats.ulysses_calls += 1
        return self._run(chosen, query, key, value, scale)

    def _run(self, chosen: backends.Backend, query, key, value, scale) -> torch.Tensor:
        perm = self.steps.permutation(to_bhnd(value, LAYOUT)) if self.kernel_config.needs_grouping else None
        try:
            out = vc_attention(query, key, value, layout=LAYOUT, config=self.kernel_config, perm=perm,
                               sm_scale=scale, backend=chosen, perm_from_grouping=True)
        except jit.JitError as err:
            # a broken toolchain must not stop the user's run: under "auto" the backend is dropped
            if self.config.backend != "auto":
                raise
            chosen.disable(f"its CUDA build failed: {err}")
            logging.warning(f"VC-Attention: the {chosen.name} kernels could not be built; diffusers' native "
                            f"attention runs instead. {err}")
            self.stats.fallbacks[f"the {chosen.name} kernels could not be built"] += 1
            return self._native(query=query, key=key, value=value, scale=scale)
        self.stats.kernel_calls[chosen.name] += 1
        return out


def _step_count(pipe) -> int:
    count = getattr(pipe, "num_timesteps", None)
    if count is None and getattr(getattr(pipe, "scheduler", None), "timesteps", None) is not None:
        count = len(pipe.scheduler.timesteps)
    if count is None:
        raise ValueError("VC-Attention's step callback cannot tell this pipeline's step count (no "
                         "num_timesteps, no scheduler.timesteps): call vc.end_step(step, num_steps) instead.")
    return int(count)


def _self_test(dispatch, member, backend: VCDiffusersBackend) -> None:
    """Prove that diffusers' dispatcher reaches our function and that the private API we use exists."""
    if dispatch.AttentionBackendName(BACKEND_NAME) is not member:
        raise _unsupported("its backend enum did not accept the new member")
    if BACKEND_NAME not in {m.value for m in dispatch.AttentionBackendName.__members__.values()}:
        raise _unsupported("its backend enum does not list the new member")
    if not dispatch._AttentionBackendRegistry._is_context_parallel_available(member):
        raise _unsupported("its registry did not record context-parallel support")
    template = inspect.signature(dispatch._templated_context_parallel_attention).parameters
    if not {"forward_op", "backward_op", "_parallel_config"} <= set(template):
        raise _unsupported("its context-parallel template takes different arguments")
    # A masked call: it must reach our function and come back from the native handoff (no kernel involved,
    # so the test passes on any machine), with SDPA's result.
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 2, 8, generator=gen) for _ in range(3))
    mask = torch.zeros(1, 1, 4, 4)
    before = backend.stats.calls
    out = dispatch.dispatch_attention_fn(q, k, v, attn_mask=mask, backend=member)
    if backend.stats.calls != before + 1:
        raise _unsupported("its dispatch_attention_fn did not call the registered function")
    expected = torch.nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)))
    if not torch.allclose(out, expected.transpose(1, 2), atol=1e-5):
        raise _unsupported("its native attention handoff returned a different result")


def register_diffusers_backend(config: VCDiffusersConfig = VCDiffusersConfig()) -> VCDiffusersBackend:
    """Register (or re-register with a new config) the "vc_attention" backend; returns its handle.

    Then: model.set_attention_backend("vc_attention"), and pass handle.step_callback to the pipeline.
    """
    if not isinstance(config, VCDiffusersConfig):
        raise TypeError(f"config must be a VCDiffusersConfig, got {type(config).__name__}.")
    dispatch = _dispatch_module()
    try:
        member = extend_backend_enum(dispatch.AttentionBackendName)
        backend = VCDiffusersBackend(config, dispatch)
        dispatch._AttentionBackendRegistry.register(member, constraints=[], supports_context_parallel=True)(
            backend.attention
        )
        _self_test(dispatch, member, backend)
    except (AttributeError, KeyError, TypeError) as err:
        raise _unsupported(f"{type(err).__name__}: {err}") from err
    backend.stats.reset()
    _warn_if_untested()
    return backend


def _warn_if_untested() -> None:
    parts = _diffusers_version().split(".")
    if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
        if (int(parts[0]), int(parts[1])) == _SUPPORTED_MINOR:
            return
    logging.warning(f"VC-Attention: diffusers {_diffusers_version()} passed the backend's self-test but is "
                    f"outside the tested range diffusers{SUPPORTED_DIFFUSERS}.")
