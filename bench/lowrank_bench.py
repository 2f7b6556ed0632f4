"""V-Smooth's low-rank V term on the GPU: time and error of rank 0 vs rank k, SageAttention 2.2 beside.

Time: CUDA-event median of the public op (prepare + attention, the basis given as the node gives its
cached one), and of the prepare and the attention kernel on their own, at Wan2.2-14B 720p and Wan2.1-1.3B 480p, fidelity and speed modes, rank 0 and each rank of
--ranks, sageattn in the same run; the basis computation (reference.lowrank_basis on the permuted V)
timed on its own (the node pays it once per layer inside the grouping window).
Error: rel-L2 against float64 exact attention on the video-like data (study/videodata.py) at N = 32,760
and 75,600, 2 heads, 1,024 query rows, each mode with its preset's grouping (commands/bench_attention.py
fidelity_grouping), per seed.

  python3 bench/lowrank_bench.py --out lowrank.json [--ranks 3 6] [--seeds 0 1] [--reps 20]
"""
from __future__ import annotations

import argparse
import json
import statistics
from importlib.metadata import version as _version

import torch

from vc_attention.commands.bench import cuda_time_ms
from vc_attention.commands.bench_attention import fidelity_grouping
from vc_attention.commands.bench_peers import sageattention_module
from vc_attention.kernels import backends, grouping, reference
from vc_attention.kernels.api import vc_attention
from vc_attention.kernels.config import FIDELITY, SPEED
from vc_attention.kernels.prepare_cuda import prepare_cuda
from vc_attention.study.videodata import video_like_qkv

SHAPES = {"wan22-14b-720p": (1, 40, 75600, 128), "wan21-1.3b-480p": (1, 12, 32760, 128)}
GRIDS = {32760: (21, 30, 52), 75600: (21, 45, 80)}
MODES = {"vc-fidelity": FIDELITY, "vc-speed": SPEED}


def _basis(v, perm, rank):
    return reference.lowrank_basis(reference.permute_tokens(v, perm), rank)


def timing_rows(ranks, reps, shapes=tuple(SHAPES)):
    rows = []
    sage = sageattention_module()
    for name in shapes:
        b, h, n, d = SHAPES[name]
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(b, h, n, d, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        perm = grouping.group_tokens(v, *fidelity_grouping("vc-speed")).perm()
        bases = {r: _basis(v, perm, r) for r in ranks}
        basis_ms = cuda_time_ms(lambda: _basis(v, perm, max(ranks)), max(3, reps // 5))
        times = {}
        if sage is not None:
            times["sageattn-2.2"] = cuda_time_ms(lambda: sage.sageattn(q, k, v, tensor_layout="HND"), reps)
        for method, config in MODES.items():
            for r in (0, *ranks):
                cfg = config.with_rank(r)
                basis = bases.get(r)
                times[f"{method}-rank{r}"] = cuda_time_ms(
                    lambda: vc_attention(q, k, v, config=cfg, perm=perm, v_basis=basis, perm_from_grouping=True), reps)
        # the split: the prepare alone, the attention kernel alone on prepared operands
        backend = backends.select(q, SPEED, "bhnd", allow_slow=False)
        for r in (0, *ranks):
            cfg = FIDELITY.with_rank(r)
            times[f"prepare-rank{r}"] = cuda_time_ms(lambda: prepare_cuda(q, k, v, perm, cfg, basis=bases.get(r)), reps)
            ops = prepare_cuda(q, k, v, perm, cfg, basis=bases.get(r))
            out = torch.empty_like(q)
            for method, config in MODES.items():
                mcfg = config.with_rank(r)
                times[f"attend-{method}-rank{r}"] = cuda_time_ms(lambda: backend.attend(ops, mcfg, out, "bhnd"), reps)
            del ops, out
        for key, ms in times.items():
            rows.append(dict(shape=name, B=b, H=h, N=n, D=d, method=key, ms=ms,
                             x_sageattn=(times["sageattn-2.2"] / ms) if "sageattn-2.2" in times else None))
            print(f"[time] {name} {key}: {ms:.2f} ms", flush=True)
        rows.append(dict(shape=name, B=b, H=h, N=n, D=d, method=f"basis-rank{max(ranks)}", ms=basis_ms, x_sageattn=None))
        print(f"[time] {name} basis (rank {max(ranks)}): {basis_ms:.2f} ms", flush=True)
        del q, k, v, perm
        torch.cuda.empty_cache()
    return rows


def error_rows(ranks, seeds, rows_per_head=1024):
    out = []
    sage = sageattention_module()
    for n, (t, hg, wg) in GRIDS.items():
        for seed in seeds:
            q, k, v = video_like_qkv(B=1, H=2, T=t, Hgrid=hg, Wgrid=wg, D=128, dtype=torch.bfloat16, device="cuda", seed=seed)
            rows = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:rows_per_head].to("cuda")
            qd, kd, vd = q[:, :, rows].double(), k.double(), v.double()
            exact = torch.softmax(qd @ kd.transpose(-1, -2) / 128 ** 0.5, dim=-1) @ vd

            def rel(o):
                return float((o[:, :, rows].double() - exact).norm() / exact.norm())

            errs = {"bf16-floor": float((exact.to(torch.bfloat16).double() - exact).norm() / exact.norm())}
            if sage is not None:
                errs["sageattn-2.2"] = rel(sage.sageattn(q, k, v, tensor_layout="HND"))
            for method, config in MODES.items():
                perm = grouping.group_tokens(v, *fidelity_grouping(method)).perm()
                for r in (0, *ranks):
                    basis = _basis(v, perm, r) if r else None
                    errs[f"{method}-rank{r}"] = rel(vc_attention(q, k, v, config=config.with_rank(r), perm=perm,
                                                                 v_basis=basis, perm_from_grouping=True))
            for key, e in errs.items():
                out.append(dict(N=n, seed=seed, method=key, rel_l2=e,
                                x_sageattn=e / errs["sageattn-2.2"] if "sageattn-2.2" in errs else None))
                print(f"[error] N={n} seed={seed} {key}: {e:.5f}", flush=True)
            del q, k, v
            torch.cuda.empty_cache()
    return out


def summary(timing, errors):
    lines = ["method | " + " | ".join(SHAPES) + " | rel-L2 N=32760 | rel-L2 N=75600"]
    methods = list(dict.fromkeys(r["method"] for r in timing))
    for m in methods:
        ms = [next((r["ms"] for r in timing if r["shape"] == s and r["method"] == m), float("nan")) for s in SHAPES]
        es = [statistics.mean([e["rel_l2"] for e in errors if e["N"] == n and e["method"] == m] or [float("nan")]) for n in GRIDS]
        lines.append(f"{m} | " + " | ".join(f"{x:.2f}" for x in ms) + " | " + " | ".join(f"{x:.5f}" for x in es))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--ranks", type=int, nargs="+", default=[6])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--skip-errors", action="store_true", help="time only")
    args = parser.parse_args()
    env = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, cuda=torch.version.cuda,
               sageattention=_version("sageattention") if sageattention_module() else None,
               command="python3 bench/lowrank_bench.py " + " ".join(
                   f"--{k} " + (" ".join(map(str, v)) if isinstance(v, list) else str(v)) for k, v in vars(args).items()))
    timing = timing_rows(args.ranks, args.reps, args.shapes)
    errors = [] if args.skip_errors else error_rows(args.ranks, args.seeds)
    with open(args.out, "w") as f:
        json.dump(dict(env=env, timing=timing, errors=errors), f, indent=1)
    print(summary(timing, errors))


if __name__ == "__main__":
    main()
