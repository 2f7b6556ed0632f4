"""Accuracy of the ExpCast variants (study/expcast_variants.py) on video-like data, CPU only.

For each sequence length: video-like Q/K/V (bf16), V-Smooth grouping (k-means order, as FIDELITY),
INT8 QK quantized as the reference does; then for a few hundred query rows per head against ALL
keys, P is encoded by each variant with the kernel's running integer row offsets and the output is
compared with fp64 exact attention:
- rel-L2 (P only): P_q V with the exact V, so only QK quantization and the P encoding err;
- rel-L2 (FIDELITY V): P_q Vhat with V-Smooth FP8 V, the whole speed/fidelity path;
- rel-L2 (encoding only): exact float64 scores rounded to float32, exact V: the P encoding alone;
- TV of the normalized P rows against the exact softmax (mean and max over the sampled rows).
    python3 bench/expcast_study.py                 # N = 4096 and 32760, 256 rows x 2 heads
    python3 bench/expcast_study.py --sizes 4096 --rows 128
"""
from __future__ import annotations

import argparse
import math
import time

import torch

from vc_attention.kernels import reference as ref
from vc_attention.kernels.config import FIDELITY
from vc_attention.kernels.grouping import DEFAULT_ITERS
from vc_attention.study import expcast_variants as variants
from vc_attention.study import fidelity, videodata

# (T, Hgrid, Wgrid): 4096 = 2 x 32 x 64; 32760 = Wan2.1 480p (21 frames of a 30 x 52 latent); 75600 = 720p (45 x 80)
GRIDS = {4096: (2, 32, 64), 32760: (21, 30, 52), 16384: (8, 32, 64), 75600: (21, 45, 80)}


def sample_rows(n: int, rows: int, seed: int) -> torch.Tensor:
    """Sorted random query rows (the same for every variant)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randperm(n, generator=gen)[: min(rows, n)].sort().values


def prepared_case(n: int, heads: int, rows: int, seed: int) -> dict:
    """Everything the variants share: scores of the sampled rows, exact P and outputs, both V's."""
    if n not in GRIDS:
        raise ValueError(f"size {n} has no grid; choose from {sorted(GRIDS)}.")
    t, hg, wg = GRIDS[n]
    q, k, v = videodata.video_like_qkv(B=1, H=heads, T=t, Hgrid=hg, Wgrid=wg, seed=seed, dtype=torch.bfloat16)
    perm = fidelity.grouping_permutation(v, fidelity.default_clusters(n), DEFAULT_ITERS, seed)
    kp, vp = ref.permute_tokens(k, perm), ref.permute_tokens(v, perm)
    q_q, q_sc, k_q, k_sc = ref.quantize_qk(q, kp, FIDELITY)
    idx = sample_rows(n, rows, seed)
    acc = torch.matmul(q_q[:, :, idx].float(), k_q.float().transpose(-1, -2))
    q_scale = q_sc[:, :, idx].unsqueeze(-1)
    k_scale = ref.expand_rows(k_sc, ref.K_BLOCK, n).transpose(-1, -2)
    scores = acc * (q_scale * k_scale)  # the same float32 operations as reference.scores_log2
    logits = q[:, :, idx].double() @ kp.double().transpose(-1, -2) / math.sqrt(q.shape[-1])
    p_exact = torch.softmax(logits, dim=-1)
    v_exact = vp.double()
    return {
        "scores": scores,
        "scores_exact": (logits * ref.LOG2E).float(),
        "p_exact": p_exact,
        "out_exact": p_exact @ v_exact,
        "v_exact": v_exact,
        "v_hat": ref.dequantized_v(vp, FIDELITY).double(),
    }


def rel_l2(out: torch.Tensor, exact: torch.Tensor) -> float:
    return ((out - exact).norm() / exact.norm()).item()


def normalized_p(scores: torch.Tensor, variant: variants.Variant) -> torch.Tensor:
    p = variants.quantize_p_with(scores, variant.encode)
    return p / p.sum(-1, keepdim=True)


def measure(case: dict, variant: variants.Variant) -> dict:
    p = normalized_p(case["scores"], variant)
    tv = 0.5 * (p - case["p_exact"]).abs().sum(-1)
    p_enc = normalized_p(case["scores_exact"], variant)
    return {
        "rel_l2_enc": rel_l2(p_enc @ case["v_exact"], case["out_exact"]),
        "rel_l2_p": rel_l2(p @ case["v_exact"], case["out_exact"]),
        "rel_l2_full": rel_l2(p @ case["v_hat"], case["out_exact"]),
        "tv_mean": tv.mean().item(),
        "tv_max": tv.max().item(),
    }


def tail_mass(case: dict) -> float:
    """Mean exact probability mass per row below 2^-14 of the row's offset (the subnormal range)."""
    s = case["scores"]
    u = s - ref.row_offset(s)
    return (case["p_exact"] * (u < -14).double()).sum(-1).mean().item()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096, 32760])
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--rows", type=int, default=256, help="query rows sampled per head")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--variants", nargs="+", default=list(variants.VARIANTS))
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    results = {}
    for n in args.sizes:
        start = time.time()
        case = prepared_case(n, args.heads, args.rows, args.seed)
        print(f"N={n}: data + grouping + exact {time.time() - start:.1f} s; "
              f"mean exact mass at u < -14: {tail_mass(case):.4f}", flush=True)
        for name in args.variants:
            results[name, n] = measure(case, variants.VARIANTS[name])
    print(f"\nrel-L2 vs fp64 exact ({args.rows} query rows x {args.heads} heads, all keys); TV of P rows")
    header = "| variant | ALU | MUFU | cvt |"
    for n in args.sizes:
        header += f" encoding N={n} | P-only N={n} | FIDELITY-V N={n} | TV mean/max N={n} |"
    print(header)
    print("|---" * (4 + 4 * len(args.sizes)) + "|")
    for name in args.variants:
        v = variants.VARIANTS[name]
        line = f"| {name} | {v.alu:g} | {v.mufu:g} | {v.cvt:g} |"
        for n in args.sizes:
            r = results[name, n]
            line += f" {r['rel_l2_enc']:.5f} | {r['rel_l2_p']:.5f} | {r['rel_l2_full']:.5f} |"
            line += f" {r['tv_mean']:.4f} / {r['tv_max']:.4f} |"
        print(line)


if __name__ == "__main__":
    main()
