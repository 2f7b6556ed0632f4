"""The fused CUDA prepare kernels (quantize, permute, block means, V residual) as their own JIT
extension, `vc_attention_prepare`, which every CUDA backend runs before its attention kernel.

Two passes per 128-token block: statistics (K channel sums, V channel amax), then quantize +
permute + transpose into the operand contract (kernels/operands.py), with VCConfig.v_lo_channels the V
residual's second term too (csrc/prepare_v_lo.cuh). Built on first use.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

from . import jit, reference
from .config import VCConfig
from .layout import to_bhnd
from .operands import N_ALIGN, PreparedOperands

EXTENSION_NAME = "vc_attention_prepare"
SOURCES = ("prepare_binding.cpp", "prepare.cu")
# build-time variants (same outputs bit for bit; bench/prepare_variants.py times them, tests/
# test_prepare_variants_gpu.py compares them): "rows-in-regs" issues every load of a 128-token block
# before using any (csrc/prepare_regs.cuh); "legacy-quantize" is the quantize pass before the staged one
# (csrc/prepare.cuh's instead of csrc/prepare_staged.cuh's); "staged-stats" stages the statistics pass
# too (measured slower: docs/kernel-notes.md section 22); "stats-prefetch" loads a statistics block's
# permutation indices first (measured slower at head dim 128: section 25)
VARIANTS: dict[str, tuple[str, ...]] = {"default": (), "rows-in-regs": ("-DVC_PREP_ROWS_IN_REGS=1",),
                                        "legacy-quantize": ("-DVC_PREP_LEGACY_QUANTIZE=1",),
                                        "staged-stats": ("-DVC_PREP_STAGED_STATS=1",),
                                        "stats-prefetch": ("-DVC_PREP_STATS_PREFETCH=1",)}
# the variants whose statistics pass covers 128 rows per block only: VCConfig.v_mean_rows = 128
MEAN_128_ONLY = frozenset({"rows-in-regs", "staged-stats"})


def _variant_name(variant_flags) -> Optional[str]:
    """The name in VARIANTS of a build's flags (None: not a known variant)."""
    return next((n for n, f in VARIANTS.items() if f == tuple(variant_flags)), None)


@functools.cache
def extension(variant_flags: tuple[str, ...] = ()):
    """The compiled module (built once per process, cached on disk across processes); variant_flags:
    the -D flags of one of VARIANTS (the default build without)."""
    if not variant_flags:
        return jit.load_extension(EXTENSION_NAME, SOURCES)
    name = _variant_name(variant_flags)
    if name is None:
        raise ValueError(f"unknown prepare variant flags {variant_flags}; known: {VARIANTS}")
    return jit.load_extension(f"{EXTENSION_NAME}_{name.replace('-', '_')}", SOURCES, extra_cuda_cflags=tuple(variant_flags))


def binding_args(q, k, v, perm: Optional[torch.Tensor], config: VCConfig, layout: str, sm_scale: Optional[float],
                 basis: Optional[torch.Tensor]) -> tuple:
    """The prepare binding's arguments for a call: (q, k, v as (B,H,N,D) views, perm int32, basis, qk_scale,
    qk_fp8, vsmooth, smooth_k, v_mean_rows, merges, k_scale_rows, k_lanes, v_lo_channels), shared by `prepare` and
    `prepare_attend` (the sm90 backend's one-call path, which hands the term to the Hopper entry). basis: None with
    config.v_rank > 0 computes reference.lowrank_basis's on the permuted V (a gather of V and an eigensolve per head:
    slow)."""
    qb, kb, vb = (to_bhnd(t, layout) for t in (q, k, v))
    d = qb.shape[-1]
    # the V the basis is computed from: permuted only when a basis is to be computed
    v_perm = reference.permute_tokens(vb, perm.long()) if config.v_rank and basis is None and perm is not None else vb
    basis = reference.resolve_basis(v_perm, config.v_rank, basis)
    if basis is not None:
        basis = basis.contiguous()
    perm32 = None if perm is None else perm.to(device=q.device, dtype=torch.int32).contiguous()
    return (qb, kb, vb, perm32, basis, reference.qk_scale(d, sm_scale), config.qk == "fp8", config.v == "vsmooth",
            config.smooth_k, config.v_mean_rows, reference.merges(config, d), reference.k_scale_rows(config, d),
            reference.k_lanes(config, d), config.v_lo_channels)


def prepare_cuda(q, k, v, perm: Optional[torch.Tensor], config: VCConfig, layout: str = "bhnd",
                 sm_scale: Optional[float] = None, variant_flags: tuple[str, ...] = (),
                 basis: Optional[torch.Tensor] = None) -> PreparedOperands:
    """The operand contract computed on the GPU (q, k, v fp16/bf16 CUDA tensors in `layout`);
    variant_flags: a build of VARIANTS (the default build without). basis: the low-rank term's W
    (B,H,config.v_rank,D) fp16 (the node's cached one); None with config.v_rank > 0 computes
    reference.lowrank_basis's on the permuted V (a gather of V and an eigensolve per head: slow)."""
    if variant_flags and config.v_mean_rows != N_ALIGN:
        name = _variant_name(variant_flags)
        if name in MEAN_128_ONLY:
            raise ValueError(f"the prepare variant {name!r} takes {N_ALIGN}-row V means only; this configuration has "
                             f"v_mean_rows={config.v_mean_rows}.")
    if variant_flags and config.v_lo_channels:
        raise ValueError(f"the prepare variant {_variant_name(variant_flags)!r} has no second V term; this configuration has "
                         f"v_lo_channels={config.v_lo_channels} (the default build writes it).")
    if variant_flags and reference.k_scale_rows(config, q.shape[-1]) != N_ALIGN:
        raise ValueError(f"the prepare variant {_variant_name(variant_flags)!r} takes K scales per {N_ALIGN} keys only; "
                         f"this configuration has k_scale_rows={config.k_scale_rows}.")
    args = binding_args(q, k, v, perm, config, layout, sm_scale, basis)
    # the binding allocates the operands (one call, no per-tensor allocation from Python) on q's device
    (q_q, q_scale, k_q, k_scale, v_t, v_scale, v_mean, v_low_t, v_low_scale, v_seg_end, v_lo_t,
     v_lo_sel) = extension(tuple(variant_flags)).prepare(*args)
    return PreparedOperands(q_q=q_q, q_scale=q_scale, k_q=k_q, k_scale=k_scale, v_t=v_t, v_scale=v_scale, v_mean=v_mean,
                            n_tokens=args[0].shape[2], v_low_t=v_low_t, v_low_scale=v_low_scale,
                            v_low_basis=args[4], v_seg_end=v_seg_end, v_lo_t=v_lo_t, v_lo_sel=v_lo_sel)
