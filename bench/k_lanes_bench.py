"""K scales per MMA lane (VCConfig.k_lane_scales) on the GPU: time and error beside the presets and SageAttention 2.2.

Per shape, in one process: cuDNN SDPA, SageAttention 2.2 (when importable), fidelity and speed mode as the presets
have them and with lane scales, each the public call on one backend (--backend: sm90, or mma, the portable kernel
the RTX 40/50 cards run, on the H200 as issue 12's proxy; prepare included) with the presets'
groupings (kernels.grouping: 128 x 1 with 8 bins fidelity, 64 x 1 speed), CUDA events, median (commands/bench.cuda_time_ms);
the prepare alone too (prepare_cuda: the K lanes kernel replaces the quantize pass's K part). On the video-like data
(study/videodata.py) the rel-L2 of every method against float64 attention on 1,024 sampled query rows of 2 heads
(`vc-attention bench`'s fidelity rows), seeds 0 and 1, at 32,760 and 75,600 tokens. The decision it makes
(docs/kernel-notes.md section 34): a preset takes lane scales if its rel-L2 drops and its time holds (+-1%).
--rows names other rows (MODE[+lanes]@CLUSTERSxITERS[bBINS]): issue 10's speed-mode candidates beside fidelity, whose
error table also gives each speed row's ratio to the first fidelity row (kernel-notes 41).

    python3 bench/k_lanes_bench.py [--backend sm90|mma] [--shapes wan22-14b-720p,wan21-1.3b-480p] [--sizes 32760 75600]
    python3 bench/k_lanes_bench.py --rows fidelity@128x1b8,speed@64x2,speed@128x1b8,speed+lanes@128x1b8 --name speed_ratio

Writes DIR/k_lanes_bench-BACKEND.json (--out DIR: default $OUT, else bench/results/; --name another) and prints two tables.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GRIDS = {32760: (21, 30, 52), 75600: (21, 45, 80)}


# the default rows: each preset's kernel configuration with the node preset's grouping (nodes/presets.py: fidelity 128 x 1
# with 8 within-cluster bins, speed 64 x 1), as it is and with lane scales
DEFAULT_ROWS = "fidelity@128x1b8,fidelity+lanes@128x1b8,speed@64x1,speed+lanes@64x1"
_ROW = re.compile(r"(fidelity|speed)(\+lanes)?@(\d+)x(\d+)(?:b(\d+))?")


def parse_rows(text: str) -> list[tuple[str, object, tuple[int, int, int]]]:
    """'speed+lanes@128x1b8,...' -> [(label, config, (clusters, iterations, within-cluster bins))]: the mode's
    configuration (config.FIDELITY / SPEED), '+lanes' with K scales per lane, its grouping (bins 0: none)."""
    from vc_attention.kernels.config import FIDELITY, SPEED

    rows = []
    for label in text.split(","):
        match = _ROW.fullmatch(label.strip())
        if match is None:
            raise ValueError(f"row {label!r}: MODE[+lanes]@CLUSTERSxITERS[bBINS], MODE fidelity or speed "
                             f"(e.g. speed+lanes@128x1b8)")
        mode, lanes, clusters, iters, bins = match.groups()
        config = (FIDELITY if mode == "fidelity" else SPEED).with_(k_lane_scales=bool(lanes))
        rows.append((label.strip(), config, (int(clusters), int(iters), int(bins or 0))))
    if len({r[0] for r in rows}) != len(rows):
        raise ValueError(f"rows {text!r} name one row twice")
    return rows


def group(v, grouping_spec, seed: int = 0):
    from vc_attention.kernels import grouping

    clusters, iters, bins = grouping_spec
    return grouping.group_tokens(v, clusters, iters, seed, within_bins=bins).perm()


def ours(config, backend: str):
    from vc_attention.kernels.api import vc_attention

    return lambda q, k, v, perm: vc_attention(q, k, v, config=config, perm=perm, backend=backend, perm_from_grouping=True)


def time_rows(shapes: dict, reps: int, backend: str, rows_spec: list) -> list[dict]:
    """Milliseconds per shape: peers, each row of parse_rows(), and each row's prepare alone."""
    import torch

    from vc_attention.commands.bench import cuda_time_ms
    from vc_attention.commands.bench_peers import CUDNN, SAGE, peer_methods
    from vc_attention.kernels.prepare_cuda import prepare_cuda

    peers = {m.name: m.fn for m in peer_methods() if m.name in (CUDNN, SAGE)}
    rows = []
    for name, (b, h, n, d) in shapes.items():
        torch.manual_seed(0)
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        v = v + 2.0 * torch.randn(d, device="cuda", dtype=torch.bfloat16)
        row = {"shape": name, "bhnd": [b, h, n, d], "ms": {}, "prepare_ms": {}}
        with torch.inference_mode():
            for label, fn in peers.items():
                row["ms"][label] = cuda_time_ms(lambda: fn(q, k, v, None), reps, warmup=2, min_total_ms=100)
            for label, config, grouping_spec in rows_spec:
                perm = group(v, grouping_spec)
                fn = ours(config, backend)
                row["ms"][label] = cuda_time_ms(lambda: fn(q, k, v, perm), reps, warmup=2, min_total_ms=100)
                row["prepare_ms"][label] = cuda_time_ms(lambda: prepare_cuda(q, k, v, perm, config, "bhnd"), reps,
                                                        warmup=2, min_total_ms=50)
        print(f"{name:18s} " + " | ".join(f"{m} {t:8.3f} ms" for m, t in row["ms"].items()), flush=True)
        rows.append(row)
    return rows


def error_rows(sizes: list[int], seeds: list[int], backend: str, rows_spec: list) -> list[dict]:
    """rel-L2 per size (mean over seeds) of SageAttention 2.2 and every row of parse_rows() on the video-like data."""
    import torch

    from vc_attention.commands.bench_attention import FIDELITY_HEADS, FIDELITY_ROWS
    from vc_attention.commands.bench_peers import SAGE, peer_methods
    from vc_attention.study.videodata import video_like_qkv

    sage = {m.name: m.fn for m in peer_methods() if m.name == SAGE}
    rows = []
    for tokens in sizes:
        t, hg, wg = GRIDS[tokens]
        err: dict = {}
        for seed in seeds:
            q, k, v = video_like_qkv(B=1, H=FIDELITY_HEADS, T=t, Hgrid=hg, Wgrid=wg, D=128, seed=seed,
                                     dtype=torch.bfloat16, device="cuda")
            sample = torch.randperm(q.shape[2], generator=torch.Generator().manual_seed(seed))[:FIDELITY_ROWS].to("cuda")
            exact = torch.softmax(q[:, :, sample].double() @ k.double().transpose(-1, -2) / 128 ** 0.5, -1) @ v.double()
            methods = {label: (fn, None) for label, fn in sage.items()}
            for label, config, grouping_spec in rows_spec:
                methods[label] = (ours(config, backend), group(v, grouping_spec, seed))
            for label, (fn, perm) in methods.items():
                out = fn(q, k, v, perm)[:, :, sample].double()
                err[label] = err.get(label, 0.0) + float((out - exact).norm() / exact.norm()) / len(seeds)
        rows.append({"tokens": tokens, "seeds": seeds, "rel_l2": err})
        print(f"N={tokens}: " + " | ".join(f"{m} {e:.5f}" for m, e in err.items()), flush=True)
    return rows


def tables(times: list[dict], errors: list[dict], labels: list[str]) -> str:
    """The time table (ms, x SageAttention 2.2) and the error table (rel-L2, x SageAttention 2.2, and each speed row's
    x the first fidelity row's: issue 10's speed / fidelity ratio)."""
    from vc_attention.commands.bench_peers import CUDNN, SAGE

    lines = ["| shape | cuDNN ms | SA2.2 ms | " + " | ".join(f"{m} ms (x SA2.2) / prepare" for m in labels) + " |",
             "|---" * (3 + len(labels)) + "|"]
    for r in times:
        ms, pm, sa = r["ms"], r["prepare_ms"], r["ms"].get(SAGE)
        cells = [f"{ms[m]:.3f}" + ("" if sa is None else f" ({sa / ms[m]:.3f}x)") + f" / {pm[m]:.3f}" for m in labels]
        lines.append(f"| {r['shape']} | {ms[CUDNN]:.3f} | {'-' if sa is None else f'{sa:.3f}'} | " + " | ".join(cells) + " |")
    base = next((m for m in labels if m.startswith("fidelity")), None)
    lines += ["", "| N | SA2.2 rel-L2 | " + " | ".join(labels) + " |", "|---" * (2 + len(labels)) + "|"]
    for r in errors:
        e, sa = r["rel_l2"], r["rel_l2"].get(SAGE)

        def cell(m):
            ratio = [] if sa is None else [f"{e[m] / sa:.3f}x SA2.2"]
            if base and m.startswith("speed"):
                ratio.append(f"{e[m] / e[base]:.3f}x {base}")
            return f"{e[m]:.5f}" + (f" ({', '.join(ratio)})" if ratio else "")
        lines.append(f"| {r['tokens']} | {'-' if sa is None else f'{sa:.5f}'} | " + " | ".join(cell(m) for m in labels) + " |")
    return "\n".join(lines)


def main(argv=None) -> None:
    sys.path.insert(0, str(ROOT.parent))
    import torch

    from vc_attention.commands.bench import parse_shapes

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="sm90", choices=["sm90", "mma"])
    parser.add_argument("--shapes", default="wan22-14b-720p,wan21-1.3b-480p")
    parser.add_argument("--sizes", type=int, nargs="*", default=[32760, 75600], choices=sorted(GRIDS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--rows", default=DEFAULT_ROWS,
                        help="comma-separated MODE[+lanes]@CLUSTERSxITERS[bBINS] (default: %(default)s)")
    parser.add_argument("--out", default=os.environ.get("OUT", str(ROOT / "bench" / "results")))
    parser.add_argument("--name", default="", help="the JSON file's name without .json (default: k_lanes_bench-BACKEND)")
    args = parser.parse_args(argv)
    try:
        rows_spec = parse_rows(args.rows)
    except ValueError as err:
        parser.error(str(err))
    if not torch.cuda.is_available():
        raise SystemExit("k_lanes_bench.py needs a CUDA GPU.")
    times = time_rows(parse_shapes(args.shapes), args.reps, args.backend, rows_spec) if args.shapes else []
    errors = error_rows(args.sizes, args.seeds, args.backend, rows_spec)
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda, "backend": args.backend,
           "command": "python3 bench/k_lanes_bench.py " + " ".join(sys.argv[1:] if argv is None else argv)}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    name = args.name or f"k_lanes_bench-{args.backend}"
    Path(args.out, f"{name}.json").write_text(json.dumps({"env": env, "rows": args.rows, "times": times, "errors": errors}, indent=1) + "\n")
    print("\n" + tables(times, errors, [label for label, _, _ in rows_spec]))


if __name__ == "__main__":
    main()
