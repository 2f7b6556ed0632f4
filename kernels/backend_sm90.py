"""The `sm90` backend: the Hopper fast path (sm_90a wgmma + TMA, warp-specialized).

Attention over the prepare step's operands (kernels/operands.py, built by the fused prepare
extension of kernels/prepare_cuda.py): kernels/csrc/sm90_*.cu. JIT-built on first use for sm_90a
only; selecting the backend never builds anything.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

from . import jit, prepare_cuda, reference
from .backends import Backend, Constraints, register
from .config import EXP2_FAMILY, KERNEL_P_ENCODINGS, MAX_V_RANK, VCConfig
from .constants import K_BLOCK, MIXED_CHORD_EIGHTHS, SM90_V_LO_CHANNELS, VSMOOTH_K_LANES, VSMOOTH_PAIRED_K
from .layout import to_bhnd
from .operands import PreparedOperands

EXTENSION_NAME = "vc_attention_sm90"
# sm90_launch.cu (two consumer warpgroups per CTA) and sm90_launch_c3.cu (three) split the kernels
# between them by head dim and mode (split_consumers in sm90_launch.cu; docs/kernel-notes.md section 17)
SOURCES = ("sm90_binding.cpp", "sm90_launch.cu", "sm90_launch_c3.cu")
# VC_SM90_STEP256: the two-consumer build (head dim 128 with V-Smooth: fidelity and speed) steps its
# online softmax by 256 keys; VC_SM90_SPLIT_SPEED_D128=2 puts head dim 128 speed on that build and
# VC_SM90_STEP256_EARLY_QK=2 issues its next step's first QK before the fold (ExpCast only: fidelity's
# exp2 loop lost 8% that way). docs/kernel-notes.md sections 18-19. VC_SM90_KPAIR / VC_SM90_KPAIR_EXP2: the speed
# and fidelity 256-key loops take one K scale per step where the K scales are paired (k_scale_rows 256; sections
# 27, 29-30).
CUDA_FLAGS = ("-DVC_SM90_SPLIT=1", "-DVC_SM90_STEP256=1", "-DVC_SM90_STEP256_EARLY_QK=2", "-DVC_SM90_SPLIT_SPEED_D128=2",
              "-DVC_SM90_KPAIR=1", "-DVC_SM90_KPAIR_EXP2=1")
ARCH = "9.0a"  # wgmma and setmaxnreg exist only in the arch-specific Hopper target
# The refined fidelity kernels (the V residual's second term on SM90_V_LO_CHANNELS channels and the mixed encoding,
# chosen per call: launch_refined in sm90_launch.cu) are declared once the GPU suite's tests of them
# (tests/test_sm90_refined_gpu.py) have passed on a Hopper GPU: they did on an H100 in session 28 (18 passed,
# bench/results/nvidia-h100-refined-tests-session28.log, after the suite's run beside the rest; kernel-notes 38).
# Off, a call that carries them runs without them (VCConfig.refinements_dropped), as on the portable kernel.
REFINEMENTS_DECLARED = True


def mixed_runs_expcast(head_dim: int, config: VCConfig) -> bool:
    """Whether this call's p="mixed" runs on the ExpCast kernel: where fidelity's online softmax steps one 128-key tile
    (head dim 64 with V-Smooth) the library has no refined kernel, but the preset's mixed encoding gives the chord to
    every key (MIXED_CHORD_EIGHTHS = 8), which reference.quantize_p defines as the speed encoding itself (the same
    p_expcast, anchored at the same block maxima): the ExpCast kernel of that step is its exact kernel, with the
    configuration's own means (docs/kernel-notes.md section 39). (Per-channel V with "mixed", a custom configuration,
    keeps dropping it to exp2: the GPU suite runs no per-channel ExpCast case on this backend.)"""
    return (config.p == "mixed" and MIXED_CHORD_EIGHTHS == 8 and config.v == "vsmooth"
            and softmax_step_keys(head_dim, config) == K_BLOCK and not config.v_rank and not reference.k_lanes(config, head_dim))


def kernel_expcast(head_dim: int, config: VCConfig) -> bool:
    """The attention binding's expcast flag for this call: ExpCast P, or the mixed encoding where the ExpCast
    kernel is its kernel (mixed_runs_expcast)."""
    return config.p == "expcast" or mixed_runs_expcast(head_dim, config)


def kernel_mixed(head_dim: int, config: VCConfig) -> bool:
    """The binding's mixed flag: the refined kernels' chord, where the mixed encoding does not run on ExpCast's."""
    return config.p == "mixed" and not mixed_runs_expcast(head_dim, config)


def refinements_where(head_dim: int, config: VCConfig) -> Optional[str]:
    """Where the refined kernels run (None: this call's), else the clause that says where: fidelity's paired-K exp2
    256-key loop (launch_out's refined branch in sm90_launch.cu); the mixed encoding alone also where the ExpCast
    kernel is its kernel (mixed_runs_expcast: the per-tile loops)."""
    if not config.v_lo_channels and mixed_runs_expcast(head_dim, config):
        return None
    if head_dim != 128 or config.v != "vsmooth" or config.v_rank:
        return ("at head dim 128 with V-Smooth and no low-rank V term (the mixed encoding alone also at head dim 64 "
                "with V-Smooth)")
    if config.p not in EXP2_FAMILY:
        return "with exp2-family P (p='exp2' or 'mixed')"
    if reference.k_scale_rows(config, head_dim) != 2 * K_BLOCK or reference.k_lanes(config, head_dim):
        return "with K scales per 256 keys (k_scale_rows=256) and not per lane"
    return None


CONSTRAINTS = Constraints(
    min_capability=(9, 0),
    max_capability=(9, 0),
    dtypes=(torch.float16, torch.bfloat16),
    head_dims=(64, 128),
    qk_formats=("int8",),  # the wgmma QK path is INT8 only
    p_encodings=KERNEL_P_ENCODINGS + (("mixed",) if REFINEMENTS_DECLARED else ()),
    aligned_rows=True,
    # V-Smooth's low-rank term: the 256-key loops of head dim 128 (vc_sm90_low_rank in sm90_launch.cu)
    max_v_rank=MAX_V_RANK,
    v_rank_head_dims=(128,),
    # K scales per lane (VCConfig.k_lane_scales): the paired-K 256-key loops' KLANES kernels (vc_sm90_k_lanes)
    k_lane_scales=True,
    # the refined kernels: fidelity's paired-K exp2 loop only (refinements_where)
    v_lo_channels=(0, SM90_V_LO_CHANNELS) if REFINEMENTS_DECLARED else (0,),
    refinements_where=refinements_where,
    jit_arch=ARCH,
    needs_jit=True,
)


def softmax_step_keys(head_dim: int, config: VCConfig) -> int:
    """Keys per online-softmax step of the kernel that runs (head_dim, config), its emulation's
    offset_block: 256 for head dim 128 with V-Smooth (fidelity and speed: the two-consumer build's
    256-key loops), else one 128-key tile (kBlockN). The rule of vc_sm90_step_keys (sm90_launch.cu), asked
    without building the extension; tests/test_backends_gpu.py checks that the two agree."""
    return 2 * K_BLOCK if head_dim == 128 and config.v == "vsmooth" else K_BLOCK


@functools.cache
def extension():
    """The compiled module (built once per process, cached on disk across processes)."""
    return jit.load_extension(EXTENSION_NAME, SOURCES, extra_cuda_cflags=CUDA_FLAGS, arch=ARCH)


def vsmooth_mode(config: VCConfig, head_dim: int = 128) -> int:
    """The kernel's V mode: 0 per-channel V, 1 V-Smooth, 2 V-Smooth with the means AND the K scales equal
    in 128-row pairs (v_mean_rows = k_scale_rows = 256: where the library has it (`extension().step_mean`),
    the 256-key speed loop restores one mean per step and anchors the step's codes at one row maximum,
    VC_SM90_KPAIR; elsewhere the two-mean fold with a maximum per tile, which is right for such operands
    too). 256-row means with 128-key K scales run mode 1: the paired loop would read the first tile's K
    scale for both; so do head dims whose K scales the spec keeps per 128 keys (reference.k_scale_rows: 64).
    Exp2 with 256-row means runs mode 2 whatever its K scales: the exp2 one-mean loop (VC_SM90_STEPMEAN_EXP2
    builds) reads each tile's K scale; libraries without it run the two-mean fold.

    Plus VSMOOTH_PAIRED_K where the K scales are equal in 128-key pairs (reference.k_scale_rows 256): fidelity's
    exp2 256-key loop then takes one K scale per step (VC_SM90_KPAIR_EXP2); per-tile K scales keep the loop
    that reads each tile's, so a custom configuration with k_scale_rows 128 stays exact.

    Plus VSMOOTH_K_LANES where the K scales are per lane (reference.k_lanes: they are then also paired): the paired-K
    loops' lane kernels (`extension().k_lanes`)."""
    if config.v != "vsmooth":
        return 0
    paired_k = VSMOOTH_PAIRED_K if reference.k_scale_rows(config, head_dim) == 2 * K_BLOCK else 0
    lanes = VSMOOTH_K_LANES if reference.k_lanes(config, head_dim) else 0
    if config.v_mean_rows != 2 * K_BLOCK:
        return 1 | paired_k | lanes
    exp2_loop = config.p in EXP2_FAMILY and not mixed_runs_expcast(head_dim, config)  # (that runs as ExpCast does)
    return (2 if exp2_loop or paired_k else 1) | paired_k | lanes


def attention_from_operands(ops: PreparedOperands, config: VCConfig, out: torch.Tensor, layout: str) -> torch.Tensor:
    """Run the Hopper kernel on prepared operands into `out` (q's shape in `layout`)."""
    d = ops.q_q.shape[-1]
    mode = vsmooth_mode(config, d)
    extension().attention(
        ops.q_q, ops.q_scale, ops.k_q, ops.k_scale, ops.v_t, ops.v_scale, ops.v_mean, ops.v_low_t, ops.v_low_basis,
        ops.v_low_scale, to_bhnd(out, layout),
        ops.n_tokens, kernel_expcast(d, config), mode, torch.cuda.current_stream(out.device).cuda_stream,
        # V-Smooth segments (v_mean_merge): the mode-2 speed loop restores at their ends; the per-tile loops
        # (mode 1: K scales per 128 keys) restore every tile's slot mean, which holds the segment's mean
        ops.v_seg_end if (mode & ~(VSMOOTH_PAIRED_K | VSMOOTH_K_LANES)) == 2 else None,
        # the refinements (refined kernels, refinements_where): the second V term's operands, the mixed encoding
        ops.v_lo_t, ops.v_lo_sel, kernel_mixed(d, config),
    )
    return out


@functools.cache
def _entry() -> tuple[int, int]:
    """The library's C entry and error text as addresses (the prepare extension calls them)."""
    ext = extension()
    return ext.forward_address(), ext.last_error_address()


def run_one_call(q, k, v, perm, config: VCConfig, layout: str, sm_scale, v_basis=None) -> torch.Tensor:
    """The backend's run: the prepare and the attention in one binding call (the prepare extension's
    prepare_attend calls this library's entry): the operands never reach Python, which cut a short call's host
    time (docs/kernel-notes.md section 28). Same kernels and results as prepare_cuda + attention_from_operands
    (tests/test_backends_gpu.py)."""
    args = prepare_cuda.binding_args(q, k, v, perm, config, layout, sm_scale, v_basis)
    out = torch.empty_like(q)  # q's strides where q is dense (kernels/prepared_run.py)
    forward, error = _entry()
    d = args[0].shape[-1]
    prepare_cuda.extension().prepare_attend(*args, to_bhnd(out, layout), kernel_expcast(d, config),
                                            vsmooth_mode(config, d), forward, error, kernel_mixed(d, config))
    return out


register(Backend(name="sm90", priority=60, constraints=CONSTRAINTS, attend=attention_from_operands,
                 one_call=run_one_call, softmax_step_keys=softmax_step_keys))
