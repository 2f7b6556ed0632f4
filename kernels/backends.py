"""Backend registry: each backend declares what it supports; the first capable one runs.

A backend that cannot run keeps the reason (import error text, arch, dtype, head dim) so that
`vc-attention doctor`, the node's stats and error messages can say why. No try/except selection:
`unsupported_reason` is asked first, and only a backend that says None is called.
"""
from __future__ import annotations

import importlib

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from .config import VCConfig

# run(q, k, v, perm, config, layout, sm_scale) -> out (same dtype as q, in `layout`)
RunFn = Callable[..., torch.Tensor]
# unsupported_reason(q, config, layout) -> None if this backend can take the call, else a sentence
ReasonFn = Callable[[torch.Tensor, VCConfig, str], Optional[str]]


@dataclass
class Backend:
    name: str
    priority: int  # higher runs first under "auto"
    run: RunFn
    unsupported_reason: ReasonFn
    slow: bool = False  # the emulation: never chosen silently in place of a fast path
    available_reason: Callable[[], Optional[str]] = field(default=lambda: None)
    # availability (toolkit, GPU arch) cannot change within a process, and checking it can spawn
    # `nvcc --version` (milliseconds): it is asked once, not on every attention call
    _availability: tuple[Optional[str]] | None = field(default=None, init=False, repr=False)

    def availability(self) -> Optional[str]:
        """Why this backend cannot run in this process at all (None: it can), computed once."""
        if self._availability is None:
            self._availability = (self.available_reason(),)
        return self._availability[0]

    def disable(self, reason: str) -> None:
        """Mark the backend unusable for the rest of the process (e.g. its CUDA build failed)."""
        self._availability = (reason,)

    def why_not(self, q: torch.Tensor, config: VCConfig, layout: str) -> Optional[str]:
        return self.availability() or self.unsupported_reason(q, config, layout)


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


def select(q: torch.Tensor, config: VCConfig, layout: str, backend: str = "auto", allow_slow: bool = True) -> Backend:
    """The backend that will run this call.

    backend="auto": the highest-priority capable backend; the slow emulation only if allow_slow.
    A named backend must be capable, else NoCapableBackend says why (never a silent swap).
    """
    if backend != "auto":
        chosen = get(backend)
        reason = chosen.why_not(q, config, layout)
        if reason:
            raise NoCapableBackend(f"backend {backend!r} cannot run this call: {reason}")
        return chosen
    reasons = []
    for cand in backends():
        reason = cand.why_not(q, config, layout)
        if reason is None and (allow_slow or not cand.slow):
            return cand
        reasons.append(f"{cand.name}: {reason or 'slow emulation not allowed here'}")
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
