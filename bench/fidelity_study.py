"""Fidelity-mode knobs, emulated on CPU: which quantizer refinement lowers the error, and by how much.

One knob at a time from each mode's baseline (reference.py today: Q scale per row, K per 128 keys,
V-Smooth residual scale per channel, row max at 256 (fidelity) or 448 (speed), exact running row
max), plus the previous spec (Q per 64 rows, integer running offset M = ceil(max)):
- Q scale per 64 rows, per 16 rows and per thread group (rows g and g+8 of each 16-row MMA tile);
- K scale per 32 keys;
- V residual scale per 128-key block and channel instead of per channel over all tokens;
- V-Smooth block means per 64, 32 or 256 rows instead of per 128 (residual scale per channel as the spec);
- P range: the other row max (448 for exp2 + cast, 256 for the ExpCast chord);
- integer running row offset (ceil of the running max) instead of the exact max.
Data: video-like Q/K/V (study/videodata.py) and random Gaussian Q/K/V (V with channel offsets),
bf16, V-Smooth grouping (k-means, 64 clusters x 2 iterations, as the node). A few hundred query rows
per head against ALL keys (the quantizers see all rows, as in a kernel), compared with fp64 exact
attention. rel-L2 is of the bf16 output (what the kernels return); "bf16 floor" is the exact output
rounded to bf16. TV, QK term and V term as in study/fidelity.py (float64 output).

    python3 bench/fidelity_study.py --data video --sizes 32760 75600 --seeds 0 1 --rows 64 --heads 2

--grouping-sweep instead varies the V-Smooth grouping (k-means clusters and iterations, the node's
chain ordering of the clusters, a secondary ordering inside each cluster: study/within_cluster_order.py)
with each mode's spec quantizers, e.g.

    python3 bench/fidelity_study.py --grouping-sweep --sizes 32760 --seeds 0 1 --rows 256 --heads 2
"""
from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass, field

import torch

from vc_attention.study import expcast_variants as variants
from vc_attention.kernels import grouping as grouping_ops
from vc_attention.kernels import reference as ref
from vc_attention.study import videodata
from vc_attention.study import within_cluster_order

GRIDS = {32760: (21, 30, 52), 75600: (21, 45, 80), 4096: (2, 32, 64)}  # Wan 480p / 720p latents
P_ENCODERS = {
    ("exp2", 256): ref.p_exp2_cast,
    ("exp2", 448): variants.exp2_cast_448,
    ("expcast", 256): variants.bits_cast,
    ("expcast", 448): ref.p_expcast,  # the spec since this study

    ("expcast_paper", 256): ref.p_expcast_paper,
}


SPEC_P_MAX = {"exp2": 256, "expcast": 448, "expcast_paper": 256}  # each encoding's row max in the spec


@dataclass(frozen=True)
class Knobs:
    p: str = "exp2"
    q_groups: str = "1"  # rows per scale ("1": the spec), or "thread" (rows g, g+8 of each 16)
    k_block: int = 128
    v_scale: str = "channel"  # or "block" (per 128-key block and channel), "mean64" / "mean32" / "mean256" (V-Smooth means per 64 / 32 / 256 rows), "cluster" / "cluster64" / "cluster128" / "cluster256" (per cluster run, merged to >= R rows), "lowrank3" / "lowrank6" / "lowrank6s" (v_hat_lowrank)
    p_max: int = 0  # 0: the spec's row max of the encoding (SPEC_P_MAX)
    offset: str = "exact"  # or "integer" (ceil of the running max: the previous spec)
    label: str = field(default="", compare=False)

    @property
    def row_max(self) -> int:
        return self.p_max or SPEC_P_MAX[self.p]


# the V-quantization knobs other than the spec's ("channel"): label suffix of each
V_SCALE_LABELS = {"block": "V residual scale per block x channel", "mean64": "V-Smooth means per 64 rows",
                  "mean32": "V-Smooth means per 32 rows",
                  "mean256": "V-Smooth means per 256 rows (one per 256-key softmax step)",
                  "cluster": "V-Smooth means per cluster (one per run of a cluster in the permuted order)",
                  "cluster256": "V-Smooth means per cluster, runs merged to >= 256 rows (<= 1 boundary per 256-key step)",
                  "cluster128": "V-Smooth means per cluster, runs merged to >= 128 rows (<= 1 boundary per 128-key tile)",
                  "cluster64": "V-Smooth means per cluster, runs merged to >= 64 rows (<= 1 boundary per 64 keys)",
                  "merge2": "V-Smooth means per run of 256-row blocks merged while their means agree within 1/2 of the block's residual amax",
                  "merge4": "V-Smooth means per run of 256-row blocks merged within 1/4 of the residual amax",
                  "merge8": "V-Smooth means per run of 256-row blocks merged within 1/8 of the residual amax",
                  "rms2": "V-Smooth means per run of 256-row blocks merged while the mean's L2 shift is within 1/2 of the block's residual RMS norm",
                  "rms3": "V-Smooth means per run of 256-row blocks merged within 1/3 of the residual RMS norm",
                  "rms4": "V-Smooth means per run of 256-row blocks merged within 1/4 of the residual RMS norm",
                  "rms3loose": "as rms3, the residual scale from the head amax plus the largest shift",
                  "headmean": "one V-Smooth mean per head",
                  "lowrank3": "+ head-global rank-3 term",
                  "lowrank6": "+ head-global rank-6 term", "lowrank6s": "+ rank-6 term from 4,096 tokens"}


def knob_rows(p: str) -> list[Knobs]:
    """The spec (baseline), the previous spec, and one knob at a time from the spec."""
    rows = [Knobs(p=p, label=f"{p}: spec (Q per row, exact running max, row max {SPEC_P_MAX[p]})"),
            Knobs(p=p, q_groups="64", offset="integer", label=f"{p}: previous spec (Q per 64 rows, integer offset)")]
    for g in ("64", "16", "thread"):
        rows.append(Knobs(p=p, q_groups=g, label=f"{p}: Q scale per " + (f"{g} rows" if g != "thread" else "thread group (2 rows)")))
    rows.append(Knobs(p=p, offset="integer", label=f"{p}: integer running offset (ceil)"))
    rows.append(Knobs(p=p, k_block=32, label=f"{p}: K scale per 32 keys"))
    for v_scale, label in V_SCALE_LABELS.items():
        rows.append(Knobs(p=p, v_scale=v_scale, label=f"{p}: {label}"))
    other = 448 if SPEC_P_MAX[p] == 256 else 256
    rows.append(Knobs(p=p, p_max=other, label=f"{p}: row max at {other}"))
    return rows


# ----------------------------------------------------------------------------------------------
# quantizers with a choice of granularity (same arithmetic as reference.quantize_int8_blocks)
def row_group_amax(x: torch.Tensor, groups: str) -> torch.Tensor:
    """(B,H,N,D) -> (B,H,N,1): max |x| over each row's scale group."""
    b, h, n, d = x.shape
    a = x.abs().amax(-1, keepdim=True)  # per row
    if groups == "1":
        return a
    if groups == "thread":  # rows r and r+8 of every 16-row tile share a scale
        ap = ref.pad_rows(a, 16).reshape(b, h, -1, 2, 8, 1)
        return ap.amax(dim=3, keepdim=True).expand_as(ap).reshape(b, h, -1, 1)[:, :, :n]
    block = int(groups)
    ap = ref.pad_rows(a, block).reshape(b, h, -1, block, 1)
    return ap.amax(dim=3, keepdim=True).expand_as(ap).reshape(b, h, -1, 1)[:, :, :n]


def int8_rows(x: torch.Tensor, groups: str) -> tuple[torch.Tensor, torch.Tensor]:
    """INT8 codes (as float32) and the per-row scale (B,H,N,1) of x quantized per row group."""
    x = x.float()
    amax = row_group_amax(x, groups)
    inv = torch.where(amax > 0, ref.INT8_MAX / amax, torch.zeros_like(amax))
    return torch.round(x * inv).clamp_(-ref.INT8_MAX, ref.INT8_MAX), amax / ref.INT8_MAX


def v_hat_block_scale(v_perm: torch.Tensor) -> torch.Tensor:
    """V-Smooth with the residual's FP8 scale per (128-key block, channel)."""
    n = v_perm.shape[-2]
    mean = ref.expand_rows(ref.block_means_fp16(v_perm).float(), ref.V_BLOCK, n)
    resid = v_perm.float() - mean
    b, h, _, d = resid.shape
    amax = ref.pad_rows(resid.abs(), ref.V_BLOCK).reshape(b, h, -1, ref.V_BLOCK, d).amax(3)  # (B,H,nb,D)
    scale = ref.expand_rows(amax / ref.E4M3_MAX, ref.V_BLOCK, n)
    inv = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
    return ref.fp8_e4m3(resid * inv) * scale + mean


def v_hat_mean_rows(v_perm: torch.Tensor, rows: int) -> torch.Tensor:
    """V-Smooth with the block means over `rows` rows instead of V_BLOCK (fp16 means, residual scale
    per channel, as reference.quantize_v_vsmooth otherwise)."""
    mean = ref.expand_rows(ref.block_means_fp16(v_perm, rows).float(), rows, v_perm.shape[-2])
    r_q, r_scale = ref.quantize_fp8_per_channel(v_perm.float() - mean)
    return r_q * r_scale + mean


def cluster_segments(labels_perm: torch.Tensor, min_rows: int = 0) -> torch.Tensor:
    """(B,H,N) segment index of every permuted token: a segment is a run of equal labels (one cluster with
    a cluster-sorted perm); min_rows > 0 merges runs so every segment but a head's only one has >= min_rows
    rows (a boundary only where the label changes and the segment so far is long enough; a short tail
    joins the segment before it), so a min_rows-key softmax step holds at most one segment boundary."""
    starts = torch.ones_like(labels_perm, dtype=torch.bool)
    starts[..., 1:] = labels_perm[..., 1:] != labels_perm[..., :-1]
    if min_rows:
        n = labels_perm.shape[-1]
        flat = starts.reshape(-1, n).clone()
        for row in flat:  # a sequential rule per head (the study's sizes: a few heads)
            begin = 0
            for i in row.nonzero().flatten().tolist()[1:]:
                if i - begin >= min_rows and n - i >= min_rows:
                    begin = i
                else:
                    row[i] = False
        starts = flat.reshape(starts.shape)
    return starts.long().cumsum(-1) - 1


def v_hat_cluster_means(v_perm: torch.Tensor, labels_perm: torch.Tensor, min_rows: int = 0) -> torch.Tensor:
    """V-Smooth with one fp16 mean per cluster segment (cluster_segments) instead of one per 128-row block;
    residual scale per channel. The kernel design it tests: the mean restored once per segment end
    instead of every softmax step."""
    b, h, n, d = v_perm.shape
    seg = cluster_segments(labels_perm, min_rows)
    n_seg = int(seg.max()) + 1
    sums = torch.zeros(b, h, n_seg, d, dtype=torch.float64).scatter_add_(2, seg.unsqueeze(-1).expand(b, h, n, d), v_perm.double())
    counts = torch.zeros(b, h, n_seg, dtype=torch.float64).scatter_add_(2, seg, torch.ones_like(seg, dtype=torch.float64))
    means = (sums / counts.clamp(min=1).unsqueeze(-1)).half().float()  # fp16 as the operand contract stores means
    mean = means.gather(2, seg.unsqueeze(-1).expand(b, h, n, d))
    r_q, r_scale = ref.quantize_fp8_per_channel(v_perm.float() - mean)
    return r_q * r_scale + mean


MERGE_KAPPA = {"merge2": 0.5, "merge4": 0.25, "merge8": 0.125, "rms2": 0.5, "rms3": 1 / 3, "rms4": 0.25,
               "rms3loose": 1 / 3, "headmean": math.inf}
SEGMENTS_PER_HEAD: dict = {}  # (knob, N) -> list of (segments, 256-row blocks) per head, for the study's printout


def merged_block_segments(v_perm: torch.Tensor, kappa: float, rows: int = 256, rms: bool = False, loose: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Step-aligned V-Smooth segments found from the data alone (no cluster labels): 256-row blocks
    (one Hopper softmax step each) in order; a block joins the current segment while, in every channel,
    its float32 mean is within kappa x its own residual amax (against its fp16 mean) of the segment's
    first block's mean (rms: instead the L2 norm over channels of that shift within kappa x the block's
    residual RMS norm, sqrt(sum_d mean_rows r_d^2)). Returns the (B,H,nb) segment index per block and the residual amax bound
    (B,H,1,D): max over blocks of (block residual amax + |block fp16 mean - segment fp16 mean|), with loose
    the looser max over blocks of the first plus max over blocks of the second. rms with kappa 1/3 is the
    spec's rule (reference.vsmooth_segments, up to float32 summation order)."""
    b, h, n, d = v_perm.shape
    vf = v_perm.float()
    m = ref.block_means(vf, rows)  # (B,H,nb,D) float32
    mu = m.half().float()
    nb = m.shape[2]
    dev = (vf - ref.expand_rows(mu, rows, n)).abs()
    a = ref.pad_rows(dev, rows).reshape(b, h, nb, rows, d).amax(3)  # (B,H,nb,D)
    valid = torch.full((nb, 1), float(rows))
    valid[-1] = n - rows * (nb - 1)
    rms_norm = (ref.pad_rows(dev, rows).reshape(b, h, nb, rows, d).square().sum(3) / valid).sum(-1).sqrt()  # (B,H,nb)
    seg = torch.zeros(b, h, nb, dtype=torch.long)
    for bi in range(b):
        for hi in range(h):
            anchor, s = m[bi, hi, 0], 0
            for j in range(1, nb):
                shift = m[bi, hi, j] - anchor
                joins = (bool(shift.norm() <= kappa * rms_norm[bi, hi, j]) if rms
                         else bool((shift.abs() <= kappa * a[bi, hi, j]).all()))
                if not joins:
                    s, anchor = s + 1, m[bi, hi, j]
                seg[bi, hi, j] = s
    counts = torch.full((nb,), float(rows))
    counts[-1] = n - rows * (nb - 1)
    n_seg = int(seg.max()) + 1
    sums = torch.zeros(b, h, n_seg, d, dtype=torch.float64).scatter_add_(
        2, seg.unsqueeze(-1).expand(b, h, nb, d), (m * counts[:, None]).double())
    cnt = torch.zeros(b, h, n_seg, dtype=torch.float64).scatter_add_(2, seg, counts.double().expand(b, h, nb))
    seg_mu = (sums / cnt.clamp(min=1).unsqueeze(-1)).half().float().gather(2, seg.unsqueeze(-1).expand(b, h, nb, d))
    if loose:  # the head's amax against the block means plus the largest shift (no per-block amax needed)
        bound = a.amax(2, keepdim=True) + (mu - seg_mu).abs().amax(2, keepdim=True)
    else:
        bound = (a + (mu - seg_mu).abs()).amax(2, keepdim=True)
    return seg, seg_mu, bound


def v_hat_merged_means(v_perm: torch.Tensor, knob: str) -> torch.Tensor:
    """V-Smooth with merged_block_segments' means; residual scale from its amax bound (what a prepare
    could compute from per-block statistics without another pass over V)."""
    n = v_perm.shape[-2]
    seg, seg_mu, bound = merged_block_segments(v_perm, MERGE_KAPPA[knob], rms=knob.startswith("rms"),
                                               loose=knob.endswith("loose"))
    SEGMENTS_PER_HEAD.setdefault((knob, n), []).extend(
        (int(s.max()) + 1, s.numel()) for s in seg.reshape(-1, seg.shape[-1]))
    mean = ref.expand_rows(seg_mu, 256, n)
    r_q, r_scale = ref.quantize_fp8_per_channel(v_perm.float() - mean, bound)
    return r_q * r_scale + mean


def v_hat_lowrank(v_perm: torch.Tensor, k: int, sample: int = 0) -> torch.Tensor:
    """V-Smooth plus a head-global rank-k term (reference.quantize_v_vsmooth with the basis of
    reference.lowrank_basis over `sample` evenly spaced tokens, every token if 0): V = mu_block + A W + R,
    W (k x D, fp16) the residual's top-k principal directions, A in E4M3 with one scale per head and
    component, R the FP8 residual as the spec's. A kernel gets sum_j P_j A_j from spare columns of the
    PV MMA (the V tile's extra rows beside the row-sum ones), accumulated like the row sum, and adds
    (sum P A) W once in the epilogue."""
    basis = ref.lowrank_basis(v_perm, k, sample or v_perm.shape[-2])
    return ref.quantize_v_vsmooth(v_perm, basis).dequantized()


def quantized_p(s: torch.Tensor, knobs: Knobs) -> torch.Tensor:
    """Unnormalized P (float64) with the kernel's running offsets: the exact running max (the spec:
    reference.quantize_p itself for the spec's encodings) or its ceil (the previous spec)."""
    if knobs.offset == "exact" and knobs.row_max == SPEC_P_MAX[knobs.p]:
        return ref.quantize_p(s, ref.VCConfig(p=knobs.p))
    n = s.shape[-1]
    run = ref.running_row_offsets(s)
    if knobs.offset == "integer":
        run = torch.ceil(run)  # ceil is monotone: the running max of the ceilings
    m_run = run.repeat_interleave(ref.K_BLOCK, dim=-1)[..., :n]
    p = P_ENCODERS[knobs.p, knobs.row_max](s - m_run)
    return p.double() * torch.exp2(m_run.double() - run[..., -1:].double())


@dataclass(frozen=True)
class Grouping:
    """V-Smooth grouping: k-means clusters x iterations; cluster ids as k-means leaves them ("kmeans":
    the reference permutation, this study's original setting) or renumbered along the centroid chain
    ("chain": kernels/grouping.group_tokens, what the node and `vc-attention bench` run); tokens
    inside a cluster in token order ("none") or by a secondary key (study/within_cluster_order.py)."""
    clusters: int = 64
    iters: int = 2
    ids: str = "kmeans"
    within: str = "none"

    @property
    def label(self) -> str:
        within = "" if self.within == "none" else f", within: {self.within}"
        return f"{self.clusters} x {self.iters}, {self.ids} ids{within}"


def parse_grouping(text: str) -> Grouping:
    """'CLUSTERS x ITERS[:IDS[:WITHIN]]', e.g. '64x2', '128x2:chain:pca'."""
    parts = text.split(":")
    try:
        clusters, iters = (int(x) for x in parts[0].lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"grouping {text!r}: expected CLUSTERSxITERS[:IDS[:WITHIN]], e.g. 64x2:chain:pca") from None
    ids = parts[1] if len(parts) > 1 else "chain"
    within = parts[2] if len(parts) > 2 else "none"
    if ids not in ("kmeans", "chain") or within not in within_cluster_order.ORDERS:
        raise argparse.ArgumentTypeError(f"grouping {text!r}: ids must be kmeans or chain, within one of {within_cluster_order.ORDERS}")
    return Grouping(clusters, iters, ids, within)


# the sweep's default candidates: the node's setting (64 x 2, chain ids), one knob at a time from it
SWEEP = ("64x2:kmeans", "64x2", "64x3", "64x4", "32x2", "128x2", "256x2",
         "64x2:chain:norm", "64x2:chain:chain", "64x2:chain:pca", "128x2:chain:pca", "64x4:chain:pca")


def grouping_labels(v: torch.Tensor, g: Grouping, seed: int) -> torch.Tensor:
    """(B,H,N) cluster label of every token for grouping g (k-means seeded with `seed`, as the study)."""
    if g.ids == "kmeans":
        labels, _ = ref.kmeans_labels(v, g.clusters, g.iters, seed)
        return labels
    return grouping_ops.group_tokens(v, g.clusters, g.iters, seed).labels


def grouping_permutation(v: torch.Tensor, g: Grouping, seed: int, labels=None) -> torch.Tensor:
    """(B,H,N) permutation of the tokens for grouping g (labels: grouping_labels's, computed if None)."""
    if g.within in within_cluster_order.NODE_BINS:  # the node's kernel spec: the grouping's own bins
        if g.ids != "chain":
            raise ValueError(f"grouping {g.label}: the node's within-cluster bins follow the chain ids.")
        return grouping_ops.group_tokens(v, g.clusters, g.iters, seed,
                                         within_bins=within_cluster_order.NODE_BINS[g.within]).perm()
    labels = grouping_labels(v, g, seed) if labels is None else labels
    return within_cluster_order.permutation(v, labels, g.clusters, g.within)


# ----------------------------------------------------------------------------------------------
def make_data(kind: str, n: int, heads: int, seed: int):
    if kind == "video":
        t, hg, wg = GRIDS[n]
        return videodata.video_like_qkv(B=1, H=heads, T=t, Hgrid=hg, Wgrid=wg, seed=seed, dtype=torch.bfloat16)
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, heads, n, 128, generator=gen) for _ in range(3))
    v = v + 2.0 * torch.randn(128, generator=gen)
    return q.bfloat16(), k.bfloat16(), v.bfloat16()


@dataclass
class Case:
    q: torch.Tensor
    k_perm: torch.Tensor
    v_perm: torch.Tensor
    rows: torch.Tensor
    exact: torch.Tensor  # (B,H,rows,D) float64
    p_exact: torch.Tensor
    v_hat: dict  # V-Smooth V as the PV product uses it, per residual-scale choice (float32)


def make_case(kind: str, n: int, heads: int, rows: int, seed: int, grouping: Grouping = Grouping(), data=None) -> Case:
    q, k, v = make_data(kind, n, heads, seed) if data is None else data
    labels = grouping_labels(v, grouping, seed)
    perm = grouping_permutation(v, grouping, seed, labels)
    kp, vp = ref.permute_tokens(k, perm), ref.permute_tokens(v, perm)
    labels_perm = labels.long().gather(-1, perm.long())  # the permuted order's labels (the cluster knobs)
    idx = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:rows].sort().values
    logits = q[:, :, idx].double() @ kp.double().transpose(-1, -2) / math.sqrt(q.shape[-1])
    p_exact = torch.softmax(logits, dim=-1)
    v_hat = {"channel": ref.dequantized_v(vp, ref.VCConfig()).float(), "block": v_hat_block_scale(vp).float(),
             "mean64": v_hat_mean_rows(vp, 64).float(), "mean32": v_hat_mean_rows(vp, 32).float(),
             "mean256": v_hat_mean_rows(vp, 256).float(),
             **{f"cluster{r or ''}": v_hat_cluster_means(vp, labels_perm, r).float() for r in (0, 64, 128, 256)},
             **{knob: v_hat_merged_means(vp, knob).float() for knob in MERGE_KAPPA},
             "lowrank3": v_hat_lowrank(vp, 3), "lowrank6": v_hat_lowrank(vp, 6),
             "lowrank6s": v_hat_lowrank(vp, 6, sample=4096)}
    return Case(q, kp, vp, idx, p_exact @ vp.double(), p_exact, v_hat)


def measure(case: Case, knobs: Knobs) -> dict:
    qs = case.q.float() * torch.tensor(ref.qk_scale(case.q.shape[-1], None), dtype=torch.float32)
    q_q, q_sc = int8_rows(qs, knobs.q_groups)
    k_q, k_sc = int8_rows(ref.smooth_k(case.k_perm)[0], str(knobs.k_block))
    acc = torch.matmul(q_q[:, :, case.rows], k_q.transpose(-1, -2))
    s = acc * (q_sc[:, :, case.rows] * k_sc.transpose(-1, -2))  # reference.scores_log2's order
    p = quantized_p(s, knobs)
    p = p / p.sum(-1, keepdim=True)
    # float32 products (relative error ~1e-7, far below every figure here) keep the CPU time down
    p32 = p.float()
    out = (p32 @ case.v_hat[knobs.v_scale]).double()
    out_exact_v = (p32 @ case.v_perm.float()).double()
    norm = case.exact.norm()
    return {
        "rel_l2": ((out.bfloat16().double() - case.exact).norm() / norm).item(),
        "tv": (0.5 * (p - case.p_exact).abs().sum(-1)).mean().item(),
        "qk_term": ((out_exact_v - case.exact).norm() / norm).item(),
        "v_term": ((out - out_exact_v).norm() / norm).item(),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[32760, 75600], choices=sorted(GRIDS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--data", nargs="+", default=["video", "random"], choices=["video", "random"])
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--rows", type=int, default=256, help="query rows sampled per head")
    parser.add_argument("--modes", nargs="+", default=["exp2", "expcast", "expcast_paper"])
    parser.add_argument("--grouping-sweep", action="store_true",
                        help="vary the V-Smooth grouping (--groupings) at each mode's spec instead of the quantizer knobs")
    parser.add_argument("--groupings", type=parse_grouping, nargs="+", default=[parse_grouping(g) for g in SWEEP],
                        help="CLUSTERSxITERS[:IDS[:WITHIN]] per candidate (IDS kmeans|chain, default chain; "
                        f"WITHIN one of {', '.join(within_cluster_order.ORDERS)})")
    parser.add_argument("--v-block-scale", type=parse_grouping, nargs="*", default=[],
                        help="groupings that also get a row with the V residual scale per block x channel")
    parser.add_argument("--v-mean-rows", type=parse_grouping, nargs="*", default=[],
                        help="groupings that also get rows with the V-Smooth means per 64, 32 and 256 rows and per cluster")
    parser.add_argument("--v-lowrank", type=parse_grouping, nargs="*", default=[],
                        help="groupings that also get rows with a head-global rank-3 / rank-6 term in V (v_hat_lowrank)")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    if args.grouping_sweep:
        return grouping_sweep(args)
    knob_list = [k for m in args.modes for k in (knob_rows(m) if m != "expcast_paper" else [Knobs(p=m, label="expcast_paper: the paper's ExpCast")])]
    results: dict = {}
    floors: dict = {}
    for kind in args.data:
        for n in args.sizes:
            for seed in args.seeds:
                start = time.time()
                case = make_case(kind, n, args.heads, args.rows, seed)
                floors[kind, n, seed] = ((case.exact.bfloat16().double() - case.exact).norm() / case.exact.norm()).item()
                for knobs in knob_list:
                    results[kind, n, seed, knobs] = measure(case, knobs)
                print(f"{kind} N={n} seed={seed}: {time.time() - start:.0f} s", flush=True)
    cols = [(kind, n) for kind in args.data for n in args.sizes]
    terms_col = (args.data[0], args.sizes[-1])
    print(f"\nrel-L2 of the bf16 output vs fp64 exact (mean over seeds {args.seeds}; {args.rows} rows x "
          f"{args.heads} heads, all keys); TV / QK term / V term at {terms_col[0]} N={terms_col[1]}")
    print("| knob | " + " | ".join(f"{kind} {n}" for kind, n in cols) + " | TV | QK term | V term |")
    print("|---" * (len(cols) + 4) + "|")
    print("| bf16 output floor | " + " | ".join(
        f"{sum(floors[kind, n, s] for s in args.seeds) / len(args.seeds):.5f}" for kind, n in cols) + " | | | |")
    for knobs in knob_list:
        means = {c: {m: sum(results[c[0], c[1], s, knobs][m] for s in args.seeds) / len(args.seeds)
                     for m in ("rel_l2", "tv", "qk_term", "v_term")} for c in cols}
        last = means[terms_col]
        print(f"| {knobs.label} | " + " | ".join(f"{means[c]['rel_l2']:.5f}" for c in cols)
              + f" | {last['tv']:.4f} | {last['qk_term']:.5f} | {last['v_term']:.5f} |")


def grouping_sweep(args) -> None:
    """rel-L2, QK term and V term per grouping candidate and mode (each mode's spec quantizers)."""
    modes = [m for m in args.modes if m != "expcast_paper"] or ["exp2"]
    variants_of = {g: [Knobs(p=m) for m in modes] for g in args.groupings}
    for groupings, v_scales in ((args.v_block_scale, ["block"]), (args.v_mean_rows, ["mean64", "mean32", "mean256", "cluster", "cluster256", "cluster128", "cluster64",
                                                            *MERGE_KAPPA]),
                                (args.v_lowrank, ["lowrank3", "lowrank6", "lowrank6s"])):
        for g in groupings:
            variants_of.setdefault(g, [Knobs(p=m) for m in modes])
            variants_of[g] = variants_of[g] + [Knobs(p=m, v_scale=s) for m in modes for s in v_scales]
    results: dict = {}
    floors: dict = {}
    for kind in args.data:
        for n in args.sizes:
            for seed in args.seeds:
                data = make_data(kind, n, args.heads, seed)
                for g, knob_list in variants_of.items():
                    start = time.time()
                    case = make_case(kind, n, args.heads, args.rows, seed, g, data)
                    floors[kind, n, seed] = ((case.exact.bfloat16().double() - case.exact).norm() / case.exact.norm()).item()
                    for knobs in knob_list:
                        results[kind, n, seed, g, knobs] = measure(case, knobs)
                    print(f"{kind} N={n} seed={seed} {g.label}: {time.time() - start:.0f} s", flush=True)
    cols = [(kind, n) for kind in args.data for n in args.sizes]
    print(f"\nrel-L2 of the bf16 output vs fp64 exact, QK term, V term (mean over seeds {args.seeds}; "
          f"{args.rows} rows x {args.heads} heads, all keys)")
    print("| mode | grouping | " + " | ".join(f"{kind} {n}: rel-L2 | QK | V" for kind, n in cols) + " |")
    print("|---|---" + "|---|---|---" * len(cols) + "|")
    print("| | bf16 output floor | " + " | ".join(
        f"{sum(floors[kind, n, s] for s in args.seeds) / len(args.seeds):.5f} | |" for kind, n in cols) + " |")
    for mode in modes:
        for g, knob_list in variants_of.items():
            for knobs in (k for k in knob_list if k.p == mode):
                cells = []
                for kind, n in cols:
                    mean = {m: sum(results[kind, n, s, g, knobs][m] for s in args.seeds) / len(args.seeds)
                            for m in ("rel_l2", "qk_term", "v_term")}
                    cells.append(f"{mean['rel_l2']:.5f} | {mean['qk_term']:.5f} | {mean['v_term']:.5f}")
                extra = f", {V_SCALE_LABELS[knobs.v_scale]}" if knobs.v_scale in V_SCALE_LABELS else ""
                print(f"| {mode} | {g.label}{extra} | " + " | ".join(cells) + " |")
    for (knob, n), per_head in SEGMENTS_PER_HEAD.items():
        segs, blocks = sum(s for s, _ in per_head), sum(nb for _, nb in per_head)
        print(f"{knob}, N = {n}: {segs / len(per_head):.1f} segments per head, {segs / blocks:.2f} of the 256-row steps end one")


if __name__ == "__main__":
    main()
