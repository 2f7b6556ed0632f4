"""V-Smooth segments (VCConfig.v_mean_merge) side by side with speed mode's 256-row means, on the GPU.

Per shape and data (random Gaussian with channel offsets, and the video-like data of study/videodata.py),
with the node's grouping (k-means 64 x 2, kernels.grouping) and every method in one process: cuDNN SDPA,
SageAttention 2.2 (when importable), speed mode with one V-Smooth mean per 256-key step (`speed`,
v_mean_merge off: the mode before segments) and with segments (`merged`, config.SPEED), each the public
call (prepare included), CUDA events, median (commands/bench.cuda_time_ms).
Also the share of 256-key steps that end a segment (the restores the speed loop still does) and rel-L2
against exact attention (float32 scores, 64 query rows of the first 4 heads) of every method.

    python3 bench/segments_bench.py [--shapes wan22-14b-720p,...] [--data random,video] [--within-bins 0,8]

--within-bins: one row per grouping with that many within-cluster bins (kernels/grouping_within.py; 0: token
order): the bins slice each cluster along its chain, so more 256-key steps end a segment on real data
(emulated at 75,600 tokens: 25% -> 42% of the steps) and the speed loop restores more means.

Writes $OUT/segments_bench.json (default bench/results/) and prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GRIDS = {75600: (21, 45, 80), 32760: (21, 30, 52), 111600: (31, 45, 80), 6144: (6, 32, 32), 32768: (8, 64, 64)}


def _exact_rows(q, k, v, rows):
    """Exact attention of the sampled query rows of the first 4 heads (float32 scores, float64 output)."""
    import torch

    qs, ks, vs = (t[:, :4].float() for t in (q, k, v))
    s = qs[:, :, rows] @ ks.transpose(-1, -2) / qs.shape[-1] ** 0.5
    return (torch.softmax(s, -1).double() @ vs.double())


def main() -> None:
    sys.path.insert(0, str(ROOT.parent))
    import torch

    from vc_attention.commands.bench import parse_shapes
    from vc_attention.commands.bench_peers import CUDNN, SAGE, peer_methods
    from vc_attention.kernels import SPEED
    from vc_attention.study.videodata import video_like_qkv

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="wan22-14b-720p,wan21-1.3b-480p,hunyuan15-720p,ltx-video")
    parser.add_argument("--data", default="random,video")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--within-bins", default="0", help="comma-separated within-cluster bins, one row each")
    parser.add_argument("--out", default=os.environ.get("OUT", str(ROOT / "bench" / "results")))
    args = parser.parse_args()
    merged = SPEED.with_(v_mean_merge=True)
    per_step = SPEED.with_(v_mean_merge=False)
    peers = {m.name: m.fn for m in peer_methods() if m.name in (CUDNN, SAGE)}
    rows = []
    for name, (b, h, n, d) in parse_shapes(args.shapes).items():
        for data in args.data.split(","):
            torch.manual_seed(0)
            if data == "video":
                t, hg, wg = GRIDS[n]
                q, k, v = video_like_qkv(B=b, H=h, T=t, Hgrid=hg, Wgrid=wg, D=d, dtype=torch.bfloat16, device="cuda")
                q, k, v = (x[:, :, :n].contiguous() for x in (q, k, v))
            else:
                q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                v = v + 2.0 * torch.randn(d, device="cuda", dtype=torch.bfloat16)
            sample = torch.randperm(n, device="cuda")[:64].sort().values
            exact = _exact_rows(q, k, v, sample)
            for bins in (int(x) for x in args.within_bins.split(",")):
                rows.append(measure(name, (b, h, n, d), data, bins, q, k, v, sample, exact, peers, per_step, merged,
                                    args.reps))
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda, "command": "python3 bench/segments_bench.py " + " ".join(sys.argv[1:])}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.out, "segments_bench.json").write_text(json.dumps({"env": env, "rows": rows}, indent=1) + "\n")
    print("\n" + table(rows))


def measure(name, bhnd, data, bins, q, k, v, sample, exact, peers, per_step, merged, reps) -> dict:
    """One row: every method on (q, k, v) grouped 64 x 2 with `bins` within-cluster bins."""
    import torch

    from vc_attention.commands.bench import cuda_time_ms
    from vc_attention.kernels import grouping
    from vc_attention.kernels.api import vc_attention
    from vc_attention.kernels.prepare_cuda import prepare_cuda

    perm = grouping.group_tokens(v, 64, 2, within_bins=bins).perm()
    methods = dict(peers)
    for label, cfg in (("speed", per_step), ("merged", merged)):
        methods[label] = (lambda q, k, v, perm, cfg=cfg: vc_attention(q, k, v, config=cfg, perm=perm, backend="sm90",
                                                                       perm_from_grouping=True))
    ends = prepare_cuda(q, k, v, perm, merged, "bhnd").v_seg_end
    restores = float(ends[..., 1::2].float().mean()) if ends.shape[-1] > 1 else 1.0
    row = {"shape": name, "bhnd": list(bhnd), "data": data, "within_bins": bins, "segment_end_share": restores,
           "ms": {}, "rel_l2": {}}
    for label, fn in methods.items():
        with torch.inference_mode():
            out = fn(q, k, v, perm)
            row["ms"][label] = cuda_time_ms(lambda: fn(q, k, v, perm), reps, warmup=2, min_total_ms=100)
        got = out[:, :4, sample].double()
        row["rel_l2"][label] = float((got - exact).norm() / exact.norm())
        del out
    ms = row["ms"]
    print(f"{name:18s} {data:6s} bins {bins:2d} ends {restores:5.2f} | " + " | ".join(
        f"{m} {ms[m]:8.3f} ms e {row['rel_l2'][m]:.5f}" for m in ms), flush=True)
    return row


def table(rows: list[dict]) -> str:
    """The markdown table of the rows main() measured (SageAttention's cells '-' where it was absent)."""
    from vc_attention.commands.bench_peers import CUDNN, SAGE

    lines = ["| shape | data | within bins | steps ending a segment | cuDNN ms | SA2.2 ms | speed ms | merged ms | merged / speed | "
             "cuDNN / merged | SA / merged | rel-L2 speed | rel-L2 merged |", "|---" * 13 + "|"]
    for r in rows:
        ms, e = r["ms"], r["rel_l2"]
        sa = ms.get(SAGE)
        sa_cells = ("-", "-") if sa is None else (f"{sa:.3f}", f"{sa / ms['merged']:.3f}")
        lines.append(f"| {r['shape']} | {r['data']} | {r.get('within_bins', 0)} | {r['segment_end_share']:.2f} | {ms[CUDNN]:.3f} | {sa_cells[0]} | "
                     f"{ms['speed']:.3f} | {ms['merged']:.3f} | {ms['merged'] / ms['speed']:.3f} | "
                     f"{ms[CUDNN] / ms['merged']:.3f} | {sa_cells[1]} | {e['speed']:.5f} | {e['merged']:.5f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
