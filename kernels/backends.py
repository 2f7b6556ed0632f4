"""Backend registry: each backend declares what it supports as data; the first capable one runs.

A backend's `Constraints` (device type, arch range, dtypes, head dims, QK / V / P formats, layouts,
row alignment, JIT target) is the one declaration both questions are answered from, by the shared
code below: can it run in this process at all (`availability`, asked once), and can it take this
call (`why_not`, one readable sentence or None). A backend that cannot run keeps the reason (import
error text, arch, dtype, head dim) so that `vc-attention doctor`, the node's stats and error
messages can say why. No try/except selection: only a backend whose reason is None is called.
"""
from __future__ import annotations

import importlib

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from . import jit, reference
from .config import LAYOUTS, P_ENCODINGS, QK_FORMATS, V_FORMATS, VCConfig
from .constants import K_BLOCK
from .operands import rows_aligned
from .prepared_run import AttendFn, prepared_run

# run(q, k, v, perm, config, layout, sm_scale[, v_basis]) -> out (same dtype as q, in `layout`); v_basis (the
# low-rank V term's basis) is passed only when the caller gave one, to backends that declare max_v_rank
RunFn = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class Constraints:
    """What one backend can run. None in dtypes / head_dims / a capability bound means "any"."""

    device_type: str = "cuda"  # "cuda": a CUDA GPU and a CUDA build of torch; "any": every device
    min_capability: Optional[tuple[int, int]] = None  # compute capability range, inclusive
    max_capability: Optional[tuple[int, int]] = None
    dtypes: Optional[tuple[torch.dtype, ...]] = None
    head_dims: Optional[tuple[int, ...]] = None
    qk_formats: tuple[str, ...] = QK_FORMATS
    v_formats: tuple[str, ...] = V_FORMATS
    p_encodings: tuple[str, ...] = P_ENCODINGS
    layouts: tuple[str, ...] = LAYOUTS
    aligned_rows: bool = False  # q, k, v: contiguous head dim, 16-byte aligned rows (operands.rows_aligned)
    max_v_rank: int = 0  # VCConfig.v_rank it implements (V-Smooth's low-rank V term)
    v_rank_head_dims: Optional[tuple[int, ...]] = None  # the head dims it implements the term for (None: all)
    k_lane_scales: bool = False  # VCConfig.k_lane_scales where the spec takes it (reference.k_lanes)
    v_lo_channels: tuple[int, ...] = (0,)  # VCConfig.v_lo_channels it implements (0: without the term; V_LO_CHANNELS: all)
    # where it runs the refinements it declares (v_lo_channels > 0, p="mixed": VCConfig.has_refinements), when only
    # some of its kernels have them: (head_dim, config) -> None where it can, else why not (one clause). None: anywhere
    refinements_where: Optional[Callable[[int, VCConfig], Optional[str]]] = None
    jit_arch: Optional[str] = None  # arch its JIT build targets ("9.0a"); None: the GPU's own
    needs_jit: bool = False  # built by kernels/jit.py: needs a toolchain (or a cached build)


def _sm(cap: tuple[int, int]) -> str:
    return f"sm_{cap[0]}{cap[1]}"


def _capability_reason(c: Constraints, cap: tuple[int, int]) -> Optional[str]:
    low, high = c.min_capability, c.max_capability
    if (low is None or cap >= low) and (high is None or cap <= high):
        return None
    if low is not None and low == high:
        return f"the GPU is {_sm(cap)}; this kernel runs on {_sm(low)} only"
    if high is None:
        return f"the GPU is {_sm(cap)}; this kernel needs {_sm(low)} or newer"
    if low is None:
        return f"the GPU is {_sm(cap)}; this kernel needs {_sm(high)} or older"
    return f"the GPU is {_sm(cap)}; this kernel needs {_sm(low)} to {_sm(high)}"


def _capability(index: Optional[int]) -> tuple[int, int]:
    """A GPU's compute capability, asked of torch once per device: torch.cuda.get_device_capability took
    ~5 us of every call's host time before its first launch (docs/kernel-notes.md section 28)."""
    if index is None:
        index = torch.cuda.current_device()
    cap = _CAPABILITIES.get(index)
    if cap is None:
        cap = _CAPABILITIES[index] = torch.cuda.get_device_capability(index)
    return cap


_CAPABILITIES: dict[int, tuple[int, int]] = {}


def _names(values) -> str:
    return ", ".join(str(v).replace("torch.", "") for v in values)


def availability_reason(c: Constraints) -> Optional[str]:
    """Why a backend with these constraints cannot run in this process at all (None: it can)."""
    if c.device_type == "any":
        return None
    reason = jit.runtime_reason()
    if reason:
        return reason
    reason = _capability_reason(c, torch.cuda.get_device_capability())
    if reason:
        return reason
    return jit.toolchain_reason(c.jit_arch) if c.needs_jit else None


def call_reason(c: Constraints, config: VCConfig, layout: str, q: torch.Tensor, *kv: torch.Tensor) -> Optional[str]:
    """Why a backend with these constraints cannot take this call (None: it can), one sentence.

    q decides device, dtype and head dim; the alignment precondition is checked on q and on k, v
    when they are given. The order of the checks (device, then the configuration, then the alignment) decides
    which reason a call that fails several is given."""
    return (_device_reason(c, q) or config_reason(c, config, layout, q.shape[-1])
            or _alignment_reason(c, q, *kv))


def _device_reason(c: Constraints, q: torch.Tensor) -> Optional[str]:
    """The checks on q's device, capability, dtype and head dim (the same for every configuration of a call)."""
    if c.device_type == "cuda":
        if not q.is_cuda:
            return f"the inputs are on {q.device}, not a CUDA GPU"
        reason = _capability_reason(c, _capability(q.device.index))
        if reason:
            return reason
    if c.dtypes is not None and q.dtype not in c.dtypes:
        return f"dtype {_names([q.dtype])} is not supported (supported: {_names(c.dtypes)})"
    if c.head_dims is not None and q.shape[-1] not in c.head_dims:
        return f"head dim {q.shape[-1]} is not supported (supported: {_names(c.head_dims)})"
    return None


def config_reason(c: Constraints, config: VCConfig, layout: str, head_dim: int) -> Optional[str]:
    """Why a backend with these constraints does not run this configuration at this head dim (None: it does): the
    part of call_reason that no tensor decides, asked once per candidate of runnable_config."""
    for what, value, allowed in (("QK format", config.qk, c.qk_formats), ("V format", config.v, c.v_formats),
                                 ("P encoding", config.p, c.p_encodings), ("layout", layout, c.layouts)):
        if value not in allowed:
            return f"{what} {value!r} is not implemented in this kernel (supported: {_names(allowed)})"
    if config.v_rank > c.max_v_rank:
        return (f"a rank-{config.v_rank} low-rank V term is not implemented in this kernel "
                f"(v_rank up to {c.max_v_rank}; the spec's emulation runs any)")
    if config.v_rank and c.v_rank_head_dims is not None and head_dim not in c.v_rank_head_dims:
        return (f"the low-rank V term is not implemented in this kernel at head dim {head_dim} "
                f"(head dims {_names(c.v_rank_head_dims)})")
    if not c.k_lane_scales and reference.k_lanes(config, head_dim):
        return ("K scales per MMA lane (k_lane_scales) are not implemented in this kernel (the sm90 and mma kernels and "
                "the spec's emulation run them)")
    if config.v_lo_channels not in c.v_lo_channels:
        return (f"a second E4M3 residual term on {config.v_lo_channels} V channels (v_lo_channels) is not implemented "
                f"in this kernel (the spec's emulation runs it)")
    if config.has_refinements and c.refinements_where is not None:
        where = c.refinements_where(head_dim, config)
        if where is not None:
            return f"this kernel runs the V residual's second term and the mixed encoding only {where}"
    return None


def _alignment_reason(c: Constraints, q: torch.Tensor, *kv: torch.Tensor) -> Optional[str]:
    if c.aligned_rows:
        for name, t in zip("qkv", (q, *kv)):
            if not rows_aligned(t):
                return f"{name} needs a contiguous last dim and 16-byte aligned rows"
    return None


@dataclass
class Backend:
    """One way to run the op. A CUDA backend gives `attend`, its attention over prepared operands
    (kernels/prepared_run.py runs the shared prepare first); the emulation gives `run` directly."""

    name: str
    priority: int  # higher runs first under "auto"
    constraints: Constraints
    attend: Optional[AttendFn] = None
    run: Optional[RunFn] = None
    # a CUDA backend's own run that prepares and attends in one binding call (sm90: prepare_attend); `attend`
    # stays for whoever needs the operands (tests, emulation checks, the variant tools)
    one_call: Optional[RunFn] = None
    slow: bool = False  # the emulation: never chosen silently in place of a fast path
    # keys per online-softmax step: where the kernel's running max (and so the P quantization) can
    # move; its exact emulation is reference.vc_attention_reference(..., offset_block=softmax_step(...)).
    # An int, or (head_dim, config) -> int where the step differs by case (sm90's 256-key loop)
    softmax_step_keys: int | Callable[[int, VCConfig], int] = K_BLOCK
    # availability (toolkit, GPU arch) cannot change within a process, and checking it can spawn
    # `nvcc --version` (milliseconds): it is asked once, not on every attention call
    _availability: tuple[Optional[str]] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if (self.attend is None) == (self.run is None):
            raise ValueError(f"backend {self.name!r} needs exactly one of attend (over prepared operands) or run.")
        if self.one_call is not None and self.attend is None:
            raise ValueError(f"backend {self.name!r}: one_call is the one-binding form of attend; give both.")
        if self.attend is not None:
            self.run = self.one_call if self.one_call is not None else prepared_run(self.attend)

    def softmax_step(self, head_dim: int, config: VCConfig) -> int:
        """Keys per online-softmax step of the kernel this backend runs for (head_dim, config)."""
        step = self.softmax_step_keys
        return step(head_dim, config) if callable(step) else step

    def availability(self) -> Optional[str]:
        """Why this backend cannot run in this process at all (None: it can), computed once."""
        if self._availability is None:
            self._availability = (availability_reason(self.constraints),)
        return self._availability[0]

    def disable(self, reason: str) -> None:
        """Mark the backend unusable for the rest of the process (e.g. its CUDA build failed)."""
        self._availability = (reason,)

    def why_not(self, q: torch.Tensor, config: VCConfig, layout: str, *kv: torch.Tensor) -> Optional[str]:
        """None if this backend can take the call (q, and k, v when given), else one sentence."""
        return self.availability() or call_reason(self.constraints, config, layout, q, *kv)


_REGISTRY: dict[str, Backend] = {}


def register(backend: Backend) -> Backend:
    _REGISTRY[backend.name] = backend
    return backend


def backends() -> list[Backend]:
    """All registered backends, fastest first."""
    _load_builtin()
    return sorted(_REGISTRY.values(), key=lambda b: -b.priority)


def get(name: str) -> Backend:
    _load_builtin()
    if name not in _REGISTRY:
        raise ValueError(f"unknown VC-Attention backend {name!r}; known: {sorted(_REGISTRY)}.")
    return _REGISTRY[name]


class NoCapableBackend(RuntimeError):
    """Raised when no backend can take a call; the message lists each backend's reason."""


def runnable_config(chosen: Backend, q: torch.Tensor, config: VCConfig, layout: str, *kv: torch.Tensor) -> Optional[VCConfig]:
    """The configuration `chosen` runs for this call: config itself, else the most refined of
    config.refinements_dropped() that it can take (a kernel without the V residual's second term runs the call
    without it); None: not even the base one."""
    if not config.has_refinements:
        return config if chosen.why_not(q, config, layout, *kv) is None else None
    # the checks no configuration changes run once, then only the configuration's per candidate: a refined call
    # whose first candidate fails (the fidelity preset at head dim 64) paid two whole call_reasons of host time
    c = chosen.constraints
    if chosen.availability() or _device_reason(c, q) or _alignment_reason(c, q, *kv):
        return None
    for candidate in config.refinements_dropped():
        if config_reason(c, candidate, layout, q.shape[-1]) is None:
            return candidate
    return None


def select(q: torch.Tensor, config: VCConfig, layout: str, backend: str = "auto", allow_slow: bool = True,
           kv: tuple[torch.Tensor, ...] = ()) -> Backend:
    """The backend that will run this call (kv: k and v, checked too when given); it runs
    runnable_config(...) of it, config less the refinements it lacks (VCConfig.refinements_dropped).

    backend="auto": the highest-priority capable backend; the slow emulation only if allow_slow.
    A named backend must be capable, else NoCapableBackend says why (never a silent swap).
    """
    return select_runnable(q, config, layout, backend, allow_slow, kv)[0]


def select_runnable(q: torch.Tensor, config: VCConfig, layout: str, backend: str = "auto", allow_slow: bool = True,
                    kv: tuple[torch.Tensor, ...] = ()) -> tuple[Backend, VCConfig]:
    """select's backend and the configuration it runs (runnable_config), found in the same pass."""
    # a backend that runs none of config's configurations is refused for its least refined one: what stops it is
    # there (a refinement it lacks would have been dropped, so naming it would hide the real reason)
    base = config.without_refinements()
    if backend != "auto":
        chosen = get(backend)
        runnable = runnable_config(chosen, q, config, layout, *kv)
        if runnable is None:
            raise NoCapableBackend(f"backend {backend!r} cannot run this call: {chosen.why_not(q, base, layout, *kv)}")
        return chosen, runnable
    reasons = []
    for cand in backends():
        runnable = runnable_config(cand, q, config, layout, *kv)
        if runnable is not None and (allow_slow or not cand.slow):
            return cand, runnable
        reasons.append(f"{cand.name}: {cand.why_not(q, base, layout, *kv) or 'slow emulation not allowed here'}")
    raise NoCapableBackend("no VC-Attention backend can run this call (" + "; ".join(reasons) + ").")


def describe(q: torch.Tensor | None = None, config: VCConfig | None = None, layout: str = "bhnd") -> list[tuple[str, Optional[str]]]:
    """(name, reason-or-None) for every backend; with no sample call only availability is checked."""
    out = []
    for b in backends():
        out.append((b.name, b.availability() if q is None else b.why_not(q, config or VCConfig(), layout)))
    return out


# Modules that register the built-in backends when imported (lazily: no CUDA work at import).
_BUILTIN_MODULES = ("backend_reference", "backend_mma", "backend_sm90")
_loaded = False


def _load_builtin() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for mod in _BUILTIN_MODULES:
        importlib.import_module(f"{__package__}.{mod}")
