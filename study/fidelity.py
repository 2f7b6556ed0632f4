"""Fidelity metrics of attention outputs against fp64 exact attention, and the method table.

Definitions (all sums over every batch, head, token and channel; float64):
- rel-L2  = ||O_q - O|| / ||O||
- cosine  = <O_q, O> / (||O_q|| ||O||), the whole tensor as one vector
- max abs = max |O_q - O|
- PSNR    = 20 log10(peak / rms(O_q - O)) dB with peak = max |O|, the largest magnitude of the
            exact output (the "signal range" of this call; it differs from an image PSNR)
- TV      = 0.5 sum_j |p_hat_ij - p_ij| per query row, p_hat the normalized quantized P; mean, max
- QK term = (P - P_q) V, measured as O(P_q, V) - O: the error with V exact (P_q normalized by its sum)
- V term  = P_q (V - V_q), measured as O_q - O(P_q, V); QK term + V term = O_q - O exactly.
  Both are reported relative to ||O||. Their split, V share = ||V term||^2 / (||QK term||^2 +
  ||V term||^2): the two terms come from independent roundings, so they are nearly orthogonal and
  their squared norms add up to ||O_q - O||^2; the share then says which fraction of the error
  energy the value path causes, and the two shares sum to one.
- block-mean energy removal = 1 - ||V - blockmean(V)||^2 / ||V||^2 per (b, h) over blocks of 128
  consecutive tokens (exact means), averaged over heads (the paper's Wan2.2 statistic).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from ..kernels import reference as ref
from ..kernels.config import FIDELITY, PLAIN_8BIT, SPEED
from . import reference_fp4


@dataclass
class FidelityRow:
    """One line of the fidelity table (see the module docstring for each definition)."""

    method: str
    rel_l2: float
    cosine: float
    max_abs: float
    psnr_db: float
    tv_mean: float
    tv_max: float
    qk_term: float
    v_term: float
    v_share: float

    def as_dict(self) -> dict:
        return asdict(self)


def output_metrics(out: torch.Tensor, exact: torch.Tensor) -> dict:
    """rel-L2, cosine, max abs and PSNR (peak = max |exact|) of `out` against `exact`, float64."""
    out, exact = out.double(), exact.double()
    err = out - exact
    ref_norm = exact.norm().item()
    rms = err.pow(2).mean().sqrt().item()
    peak = exact.abs().max().item()
    return {
        "rel_l2": err.norm().item() / ref_norm if ref_norm > 0 else math.inf,
        "cosine": (out * exact).sum().item() / max(out.norm().item() * ref_norm, 1e-300),
        "max_abs": err.abs().max().item(),
        "psnr_db": 20 * math.log10(peak / rms) if rms > 0 else math.inf,
    }


def error_split(parts: ref.ReferenceParts, exact: torch.Tensor) -> dict:
    """QK term and V term relative to ||O||, and the V share of the error energy."""
    exact = exact.double()
    qk_energy = (parts.out_exact_v - exact).pow(2).sum().item()
    v_energy = (parts.out - parts.out_exact_v).pow(2).sum().item()
    ref_norm = exact.norm().item()
    total = qk_energy + v_energy
    return {
        "qk_term": math.sqrt(qk_energy) / ref_norm,
        "v_term": math.sqrt(v_energy) / ref_norm,
        "v_share": v_energy / total if total > 0 else 0.0,
    }


def fidelity_row(method: str, parts: ref.ReferenceParts, exact: torch.Tensor) -> FidelityRow:
    """All metrics of one emulated call (parts from vc_attention_reference(..., parts=True))."""
    return FidelityRow(
        method=method,
        **output_metrics(parts.out, exact),
        tv_mean=parts.tv.mean().item(),
        tv_max=parts.tv.max().item(),
        **error_split(parts, exact),
    )


def block_mean_energy_removal(v: torch.Tensor, perm: torch.Tensor | None = None, block: int = ref.V_BLOCK) -> float:
    """Fraction of ||V||^2 removed by subtracting each `block`-row mean (after `perm`), mean over heads.

    v is (B,H,N,D); exact float64 means, the tail block averages its valid rows only.
    """
    x = v.double() if perm is None else ref.permute_tokens(v.double(), perm)
    resid = x - ref.expand_rows(ref.block_means(x, block), block, x.shape[-2])
    energy = x.pow(2).sum(dim=(2, 3))
    return (1 - resid.pow(2).sum(dim=(2, 3)) / energy.clamp(min=1e-300)).mean().item()


# ----------------------------------------------------------------------------------------------
# the method table of `vc-attention fidelity`
# FP8 Q/K keep one K scale per 128 keys, as the node runs them (its paired scales are for the Hopper INT8 loop)
FP8_QK_VSMOOTH = FIDELITY.with_(qk="fp8", k_scale_rows=128)

# method name -> (emulation, V-Smooth grouping needed?)
METHODS = {
    "BF16 (inputs rounded)": ("bf16", False),
    "SageAttention2-style 8-bit": (PLAIN_8BIT, False),
    "V-Smooth 8-bit": (FIDELITY, True),
    "V-Smooth + ExpCast": (SPEED, True),
    "FP8-QK V-Smooth": (FP8_QK_VSMOOTH, True),
    "SageAttention3-style 4-bit": ("fp4:per_channel", False),
    "V-Smooth 4-bit": ("fp4:vsmooth", True),
}


def bf16_parts(q, k, v, sm_scale: float | None = None, query_chunk: int = 1024) -> ref.ReferenceParts:
    """Exact fp64 attention of bf16-rounded inputs, split like the quantized methods.

    P_q is the softmax of the rounded q, k; "V exact" means the unrounded v.
    """
    qr, kr, vr = (t.to(torch.bfloat16).double() for t in (q, k, v))
    qd, kd, vd = (t.double() for t in (q, k, v))
    scale = qd.shape[-1] ** -0.5 if sm_scale is None else sm_scale
    outs, outs_v, tvs = [], [], []
    for start in range(0, qd.shape[-2], query_chunk):
        stop = min(start + query_chunk, qd.shape[-2])
        p = torch.softmax(qr[:, :, start:stop] @ kr.transpose(-1, -2) * scale, dim=-1)
        exact = torch.softmax(qd[:, :, start:stop] @ kd.transpose(-1, -2) * scale, dim=-1)
        outs.append(p @ vr)
        outs_v.append(p @ vd)
        tvs.append(0.5 * (p - exact).abs().sum(-1))
    return ref.ReferenceParts(torch.cat(outs, 2), torch.cat(outs_v, 2), torch.cat(tvs, 2))


def method_parts(method: str, q, k, v, perm, sm_scale: float | None = None) -> ref.ReferenceParts:
    """Emulate one METHODS entry on (B,H,N,D) q, k, v; perm is used by the V-Smooth methods only."""
    emulation, grouped = METHODS[method]
    perm = perm if grouped else None
    if emulation == "bf16":
        return bf16_parts(q, k, v, sm_scale)
    if isinstance(emulation, str):
        v_format = emulation.split(":", 1)[1]
        return reference_fp4.fp4_attention_reference(q, k, v, v_format, perm=perm, sm_scale=sm_scale, parts=True)
    return ref.vc_attention_reference(q, k, v, emulation, perm=perm, sm_scale=sm_scale, parts=True)


def default_clusters(n_tokens: int) -> int:
    """Grouping default, capped at one cluster per V block of tokens.

    Clusters smaller than a block cannot make blocks homogeneous: after the stable sort a block then
    mixes several unrelated clusters (docs/videodata.md). The cap only binds below
    DEFAULT_CLUSTERS * 128 tokens (8,192 with 64 clusters), i.e. on small samples, never at video sizes.
    """
    from ..kernels.grouping import DEFAULT_CLUSTERS

    return max(1, min(DEFAULT_CLUSTERS, n_tokens // ref.V_BLOCK))


def grouping_permutation(v: torch.Tensor, clusters: int, iters: int, seed: int = 0) -> torch.Tensor:
    """V-Smooth token order of the reference semantics: k-means labels -> stable sort."""
    labels, _ = ref.kmeans_labels(v, clusters, iters, seed)
    return ref.labels_to_permutation(labels)


def fidelity_table(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    clusters: int,
    iters: int,
    seed: int = 0,
    sm_scale: float | None = None,
    methods=tuple(METHODS),
    progress=None,
    extra_rows=None,
) -> list[FidelityRow]:
    """One FidelityRow per method on (B,H,N,D) q, k, v against fp64 exact attention.

    progress(stage) is called before each stage: the exact attention, the grouping, each method
    (the CLI prints it with the elapsed time; the table takes seconds to a minute on a CPU).
    extra_rows(exact) may return more rows measured against the same exact output (e.g. a peer
    kernel run on the GPU), appended last.
    """
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown methods {unknown}; choose from {list(METHODS)}.")
    progress = progress or (lambda stage: None)
    progress("exact fp64 attention")
    exact = ref.exact_attention(q, k, v, sm_scale)
    perm = None
    if any(METHODS[m][1] for m in methods):
        progress(f"V-Smooth grouping (k-means, {clusters} clusters, {iters} iterations)")
        perm = grouping_permutation(v, clusters, iters, seed)
    rows = []
    for method in methods:
        progress(method)
        rows.append(fidelity_row(method, method_parts(method, q, k, v, perm, sm_scale), exact))
    if extra_rows is not None:
        rows.extend(extra_rows(exact))
    return rows


def calibration_stats(
    q, k, v, *, clusters: int, iters: int, seed: int = 0, query_chunk: int = 1024, attention: bool = True
) -> dict:
    """The statistics docs/videodata.md calibrates against the paper's Wan2.2 figures.

    removal_token_order / removal_kmeans_order: block_mean_energy_removal without / with the k-means
    order; v_share: error_split(...)["v_share"] of PLAIN_8BIT (SageAttention2-style, K smoothed);
    effective_keys: exp(entropy) of the exact softmax rows, averaged (how local attention is).
    attention=False skips the last two (they cost O(N^2); the removals are O(N)).
    """
    stats = {
        "removal_token_order": block_mean_energy_removal(v),
        "removal_kmeans_order": block_mean_energy_removal(v, grouping_permutation(v, clusters, iters, seed)),
    }
    if not attention:
        return stats
    parts = ref.vc_attention_reference(q, k, v, PLAIN_8BIT, parts=True)
    qd, kd = q.double(), k.double()
    entropies = []
    for start in range(0, qd.shape[-2], query_chunk):
        logits = qd[:, :, start : start + query_chunk] @ kd.transpose(-1, -2) * qd.shape[-1] ** -0.5
        entropies.append(-(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1))
    stats["v_share"] = error_split(parts, ref.exact_attention(q, k, v))["v_share"]
    stats["effective_keys"] = torch.exp(torch.cat(entropies, 2)).mean().item()
    return stats
