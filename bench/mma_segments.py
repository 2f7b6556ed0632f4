"""The portable kernel's V-Smooth restore at segment ends against the per-tile restore, one GPU call, beside
SageAttention 2.2's portable kernel (fp32+fp16) when `sageattention` imports.

  python3 bench/mma_segments.py [--shapes wan21-1.3b-480p,wan22-14b-720p,d64] [--reps 7] [--out DIR]

Speed mode (config.SPEED: 256-row means merged into segments, head dim 128) on random bf16 with a random
permutation, the `mma` backend's default build. The kernel's time depends on where segments end, not on
the values, so besides the operands' own flags (random data: one segment per head) it times the same
operands with flags that end a segment on a given share of the 256-key steps (the shares the video-like
data gives: 0.57 at N = 32,760 and 0.26 at 75,600, docs/fidelity-study.md; those outputs are not checked)
and with no flags (the restore on every tile, the build before segments). Each row: attention ms,
prepare + attention ms, x SageAttention 2.2's portable kernel. The own-flags output is compared with the
per-tile output (rel-L2: the fp32 summation order only). Head dim 64 (shape d64) has no segments: there the
backend's restore once per pair of tiles (paired means, backend_mma.restore_flags) against flags on every tile.
Writes mma_segments.json to --out.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path

import torch

from vc_attention.commands.bench import cuda_time_ms
from vc_attention.commands.bench_peers import sage_portable
from vc_attention.kernels import backend_mma
from vc_attention.kernels.config import FIDELITY, PLAIN_8BIT, SPEED
from vc_attention.kernels.prepare_cuda import prepare_cuda

SHAPES = {"wan21-1.3b-480p": (1, 12, 32760, 128), "wan22-14b-720p": (1, 40, 75600, 128), "d64": (1, 32, 32768, 64)}
STEP_SHARES = (0.57, 0.26)


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def flags_with_share(seg_end: torch.Tensor, share: float, gen: torch.Generator) -> torch.Tensor:
    """Segment ends on about `share` of the 256-key steps (the odd 128-key slots), the last slot always."""
    flags = torch.zeros_like(seg_end)
    steps = flags[..., 1::2]
    steps.copy_((torch.rand(steps.shape, generator=gen, device=seg_end.device) < share).to(flags.dtype))
    flags[..., -1] = 1
    return flags


def time_shape(name, shape, reps, sage, rows):
    b, h, n, d = shape
    gen = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(shape, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(3))
    perm = torch.argsort(torch.rand(b, h, n, device="cuda", generator=gen), dim=-1).to(torch.int32)
    sage_ms = cuda_time_ms(lambda: sage(q, k, v), reps) if sage is not None else None
    if sage_ms is not None:
        rows.append(dict(shape=name, mode="-", variant="sageattention-2.2-portable-fp32+fp16", total_ms=sage_ms))

    def add(mode, variant, ops, config, prep_ms, restore_share=None):
        out = torch.full_like(q, float("nan"))
        backend_mma.attention_from_operands(ops, config, out, "bhnd")
        attn_ms = cuda_time_ms(lambda: backend_mma.attention_from_operands(ops, config, out, "bhnd"), reps)
        row = dict(shape=name, mode=mode, variant=variant, attention_ms=attn_ms, prepare_ms=prep_ms,
                   total_ms=prep_ms + attn_ms, finite=bool(torch.isfinite(out).all()), restore_share=restore_share)
        if sage_ms is not None:
            row["x_sage_portable"] = sage_ms / row["total_ms"]
        rows.append(row)
        return out

    for mode, config in (("fidelity", FIDELITY), ("plain8", PLAIN_8BIT)):
        p = perm if config.v == "vsmooth" else None
        ops = prepare_cuda(q, k, v, p, config)
        add(mode, "per-tile (no segments in this config)", ops, config, cuda_time_ms(lambda: prepare_cuda(q, k, v, p, config), reps))
        del ops
    ops = prepare_cuda(q, k, v, perm, SPEED)
    prep_ms = cuda_time_ms(lambda: prepare_cuda(q, k, v, perm, SPEED), reps)
    if ops.v_seg_end is None:  # head dim 64: no segments, means equal in pairs (backend_mma.restore_flags)
        every = torch.ones_like(backend_mma.restore_flags(ops, SPEED, backend_mma.default_flags()))
        per_tile = add("speed", "restore on every tile (flags on every tile)", dataclasses.replace(ops, v_seg_end=every),
                       SPEED, prep_ms, 1.0)
        paired = add("speed", "restore once per pair of tiles (the backend's)", ops, SPEED, prep_ms, 0.5)
        rows[-1]["vs_per_tile"] = rel_l2(paired, per_tile)
        add("speed", "restore on every tile again (drift check)", dataclasses.replace(ops, v_seg_end=every), SPEED,
            prep_ms, 1.0)
        del ops, q, k, v, perm
        torch.cuda.empty_cache()
        return
    steps = ops.v_seg_end[..., 1::2]
    own_share = float(ops.v_seg_end.float().sum() / steps.numel())
    every = torch.ones_like(ops.v_seg_end)  # a segment end on every tile: the restore on every tile
    per_tile = add("speed", "per-tile restore (flags on every tile)", dataclasses.replace(ops, v_seg_end=every), SPEED, prep_ms, 1.0)
    own = add("speed", "segments, own flags (random data)", ops, SPEED, prep_ms, own_share)
    rows[-1]["vs_per_tile"] = rel_l2(own, per_tile)
    for share in STEP_SHARES:
        flags = flags_with_share(ops.v_seg_end, share, gen)
        add("speed", f"segments, ends on {share:.0%} of steps (time only)", dataclasses.replace(ops, v_seg_end=flags), SPEED,
            prep_ms, float(flags.float().sum() / steps.numel()))
    add("speed", "per-tile restore again (drift check)", dataclasses.replace(ops, v_seg_end=every), SPEED, prep_ms, 1.0)
    del ops, q, k, v, perm
    torch.cuda.empty_cache()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    args = parser.parse_args()
    backend_mma.extension()  # build before timing
    sage = sage_portable()
    if sage is None:
        print("sageattention 2.2 is not installed: its column is left out")
    rows: list[dict] = []
    for shape in args.shapes.split(","):
        if shape not in SHAPES:
            raise SystemExit(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")
        time_shape(shape, SHAPES[shape], args.reps, sage, rows)
    env = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, cuda=torch.version.cuda, reps=args.reps,
               command="python3 bench/mma_segments.py " + " ".join(f"--{k} {v}" for k, v in vars(args).items() if k != "out"))
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "mma_segments.json").write_text(json.dumps(dict(env=env, rows=rows), indent=1))
    print(json.dumps(env))
    print(f"{'shape':16s} {'mode':8s} {'variant':48s} {'attn ms':>8s} {'total ms':>9s} {'x SA port':>9s} {'restores':>8s}")
    for r in rows:
        share = r.get("restore_share")
        print(f"{r['shape']:16s} {r['mode']:8s} {r['variant']:48s} {r.get('attention_ms', float('nan')):8.2f} {r['total_ms']:9.2f} "
              f"{r.get('x_sage_portable', float('nan')):9.3f} {'' if share is None else f'{share:8.2f}'}")
    return 0 if all(r.get("finite", True) for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
