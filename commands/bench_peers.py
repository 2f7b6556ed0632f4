"""The attention methods a benchmark row can name: peers (measured, never bundled) and ours.

Peers: torch SDPA with the cuDNN and flash backends, and SageAttention 2.2 when the `sageattention`
package is importable - `sageattn` (on Hopper its sm90 kernel, what `--use-sage-attention` and
KJNodes' Patch Sage Attention run) and its portable mma.sync kernel `sageattn_qk_int8_pv_fp8_cuda`
(what RTX 40/50 users run) with both PV accumulations. Ours: the three VC-Attention configurations on
the backend `auto` picks and, where the portable comparison is asked for, on the `mma` backend.

Every method is fn(q, k, v, perm) on (B, H, N, D) tensors returning (B, H, N, D).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

CUDNN = "sdpa-cudnn"
SAGE = "sageattn-2.2"
SAGE_PORTABLE = "sageattn-2.2-portable-fp16acc"
VC_CONFIGS = ("vc-plain8", "vc-fidelity", "vc-speed")


@dataclass(frozen=True)
class Method:
    name: str
    fn: Callable
    backend: str | None = None  # ours: the VC backend that ran; peers: None
    portable: bool = False  # part of the portable-kernel comparison (mma rows and SA2.2's portable kernel)


def sageattention_module():
    """SageAttention's package if importable (None otherwise); its import errors other than absence
    propagate, so a broken install is reported instead of silently dropping the peer rows."""
    try:
        import sageattention
    except ModuleNotFoundError as err:
        if err.name != "sageattention":
            raise
        return None
    return sageattention


def sage_portable(accum: str = "fp32+fp16") -> Callable | None:
    """SageAttention 2.2's portable kernel (its sm89 mma.sync kernel) as fn(q, k, v) on (B,H,N,D) tensors,
    with PV accumulation `accum` ("fp32+fp16", what it runs on RTX cards, or "fp32+fp32"); None when
    SageAttention is not installed."""
    if sageattention_module() is None:
        return None
    from sageattention.core import sageattn_qk_int8_pv_fp8_cuda

    return lambda q, k, v: sageattn_qk_int8_pv_fp8_cuda(q, k, v, tensor_layout="HND", pv_accum_dtype=accum)


def peer_methods() -> list[Method]:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def sdpa(kind):
        def call(q, k, v, perm):
            with sdpa_kernel([kind]):
                return F.scaled_dot_product_attention(q, k, v)
        return call

    methods = [Method(CUDNN, sdpa(SDPBackend.CUDNN_ATTENTION)), Method("sdpa-flash", sdpa(SDPBackend.FLASH_ATTENTION))]
    sage = sageattention_module()
    if sage is not None:
        def portable(accum):
            fn = sage_portable(accum)
            return lambda q, k, v, perm: fn(q, k, v)

        methods += [
            Method(SAGE, lambda q, k, v, perm: sage.sageattn(q, k, v, tensor_layout="HND")),
            Method(SAGE_PORTABLE, portable("fp32+fp16"), portable=True),
            Method("sageattn-2.2-portable-fp32acc", portable("fp32+fp32"), portable=True),
        ]
    return methods


def vc_methods(backend: str, portable: bool) -> list[Method]:
    """Our three configurations on `backend` (its resolved name), and on `mma` too if `portable`."""
    from ..kernels.api import vc_attention
    from ..kernels.config import FIDELITY, PLAIN_8BIT, SPEED

    def vc(config, which):
        return lambda q, k, v, perm: vc_attention(q, k, v, config=config, perm=perm if config.needs_grouping else None,
                                                  backend=which, perm_from_grouping=True)

    configs = dict(zip(VC_CONFIGS, (PLAIN_8BIT, FIDELITY, SPEED)))
    methods = [Method(name, vc(cfg, backend), backend=backend) for name, cfg in configs.items()]
    if portable and backend != "mma":
        methods += [Method(name, vc(cfg, "mma"), backend="mma", portable=True) for name, cfg in configs.items()]
    return methods
