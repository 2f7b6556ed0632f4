"""Where fidelity mode's QK term comes from, and whether a preprocessing-only change lowers it (emulated, CPU).

The QK term ||(P - P_q) V|| / ||O|| (study/fidelity.py) splits into the INT8 scores' error and the E4M3 rounding of
P. Each row here quantizes one thing (or one thing differently) with the spec's arithmetic otherwise (Q scale per
row, K smoothed, exp2 + E4M3 P with the running max; bench/fidelity_study.py), on the video-like data with the
fidelity preset's grouping (128 clusters x 1 iteration), 256 query rows x 2 heads against all keys:
- exact or INT8 scores (K per 128 keys, per 32, 16, per key; Q or K alone), exact or E4M3 P;
- a per-channel migration between Q and K (Q_c * a_c, K_c / a_c, a_c = sqrt(amax K_c / amax Q_c) over the head's
  tokens: the scores are unchanged in exact arithmetic, only the INT8 grids move; a prepare-only change);
- K's INT8 codes rounded so that each key's error is ~orthogonal to the mean query or to Q's top two directions
  (int8_rows_orthogonal: the fewest near-tie flips per key; a prepare-only change);
- K smoothed per block: each 128- or 256-key block's own mean subtracted before the INT8 quantization and
  q . mean_b added back per (query row, block) (exactly, or with Q's INT8 codes and the mean in fp16 as a kernel
  would form it): a per-(row, tile) constant in the kernels, not per score.

    python3 bench/qk_term_study.py --size 32760 --seeds 0
"""
from __future__ import annotations

import argparse

import torch

from vc_attention.bench import fidelity_study as fs
from vc_attention.bench.v_rounding_study import fewest_flips
from vc_attention.kernels import reference as ref


def int8_rows_orthogonal(kx: torch.Tensor, dirs: list[torch.Tensor], rows: str = "128") -> tuple[torch.Tensor, torch.Tensor]:
    """INT8 codes of K with fs.int8_rows' scales, each key's rounding flipped on its fewest near-tie channels so that its
    error is ~orthogonal to each direction of `dirs` in turn ((B,H,1,D) each): a prepare-only change."""
    amax = fs.row_group_amax(kx, rows)
    x = kx * torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    q = torch.round(x).clamp(-127, 127)
    for d in dirs:
        alt = torch.where(q >= x, q - 1, q + 1).clamp(-127, 127)
        q = fewest_flips(x, q, alt, d.expand_as(x), dim=-1)
    return q, amax / 127.0


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=32760, choices=sorted(fs.GRIDS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    cfg = ref.VCConfig(p="exp2")
    print("| seed | scores | P | QK term |\n|---|---|---|---|")
    for seed in args.seeds:
        case = fs.make_case("video", args.size, 2, 256, seed, fs.Grouping(128, 1, "chain"))
        qs = case.q.float() * torch.tensor(ref.qk_scale(case.q.shape[-1], None), dtype=torch.float32)
        ks = ref.smooth_k(case.k_perm)[0].float()
        vp, norm = case.v_perm.float(), case.exact.norm().item()

        def qk_term(p: torch.Tensor) -> float:
            p = p / p.sum(-1, keepdim=True)
            return ((p.float() @ vp).double() - case.exact).norm().item() / norm

        def scores(qx, kx, k_rows="128", q_int8=True, k_int8=True, k_codes=None) -> torch.Tensor:
            q_q, q_sc = fs.int8_rows(qx, "1") if q_int8 else (qx, torch.ones_like(qx[..., :1]))
            k_q, k_sc = fs.int8_rows(kx, k_rows) if k_int8 else (kx, torch.ones_like(kx[..., :1]))
            if k_codes is not None:
                k_q, k_sc = k_codes
            acc = q_q[:, :, case.rows].double() @ k_q.double().transpose(-1, -2)
            return (acc * (q_sc[:, :, case.rows] * k_sc.transpose(-1, -2)).double()).float()

        def show(label, s, both=True):
            exact_p = torch.exp2(s.double() - s.double().amax(-1, keepdim=True))
            print(f"| {seed} | {label} | exact | {qk_term(exact_p):.5f} |")
            if both:
                print(f"| {seed} | {label} | E4M3 (spec) | {qk_term(ref.quantize_p(s, cfg)):.5f} |", flush=True)

        show("exact", scores(qs, ks, q_int8=False, k_int8=False))
        show("INT8 Q and K (spec: K per 128 keys)", scores(qs, ks))
        show("INT8 Q only", scores(qs, ks, k_int8=False))
        show("INT8 K only", scores(qs, ks, q_int8=False))
        for rows in ("32", "16", "1"):
            show(f"INT8, K per {rows} keys", scores(qs, ks, rows))
        a = (ks.abs().amax(-2, keepdim=True) / qs.abs().amax(-2, keepdim=True)).sqrt()
        show("INT8, channel migration a = sqrt(amax K / amax Q)", scores(qs * a, ks / a))
        for rows in (128, 256):
            kmean = ref.expand_rows(ref.block_means(ks, rows), rows, ks.shape[-2])  # (B,H,N,D)
            base = scores(qs, ks - kmean)
            restore = (qs[:, :, case.rows] @ kmean.transpose(-1, -2))
            show(f"INT8, K smoothed per {rows} keys (q . mean_b exact)", base + restore)
            q_q, q_sc = fs.int8_rows(qs, "1")
            restore_q = (q_q[:, :, case.rows] @ kmean.half().float().transpose(-1, -2)) * q_sc[:, :, case.rows]
            show(f"INT8, K smoothed per {rows} keys (INT8 Q . fp16 mean_b)", base + restore_q)
        q_mean = qs.mean(-2, keepdim=True)
        show("INT8, K rounded orthogonal to the mean query", scores(qs, ks, k_codes=int8_rows_orthogonal(ks, [q_mean])))
        evals, vecs = torch.linalg.eigh((qs.transpose(-1, -2) @ qs).double())
        top = [(vecs[..., -i] * evals[..., -i, None].sqrt()).float().unsqueeze(-2) for i in (1, 2)]
        show("INT8, K rounded orthogonal to Q's top 2 directions", scores(qs, ks, k_codes=int8_rows_orthogonal(ks, top)))
        share = (evals[..., -1] / evals.sum(-1)).flatten().tolist()
        print(f"(seed {seed}: mean query norm {q_mean.norm(dim=-1).mean():.3f}, rms query norm "
              f"{qs.norm(dim=-1).pow(2).mean().sqrt():.3f}, top direction's energy share {share})")


if __name__ == "__main__":
    main()
