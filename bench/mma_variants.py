"""One GPU call timing the portable kernel's build-time variants side by side with SageAttention 2.2's
portable kernel (its sm89 mma.sync kernel, fp32+fp16 accumulation) when `sageattention` imports.

  python bench/mma_variants.py [--variants rows16,wide,...] [--shapes ...] [--reps 5] [--out DIR]

A name may carry extra -D flags after '+' (a one-off measurement, not a registered variant), e.g.
`--variants wide-i2fp-meanscaled-restoretile-coalesced-viaf16,wide-i2fp-meanscaled-restoretile-coalesced-viaf16+-DVC_MMA_MIN_BLOCKS=3`
(three CTAs per SM: ptxas caps the registers at 168 and spills).

Per shape (random bf16, (B,H,N,D) layout, a random permutation for the V-Smooth modes) and mode
(fidelity, speed, plain8): the fused prepare once, then each variant's attention on the same
operands (CUDA events, median of --reps after a warm-up call). "total" = prepare + attention, the
figure compared with SageAttention (whose call includes its own quantization). Each variant's
output is also compared with the first variant's (rel-L2) so a broken build cannot hide behind a
fast time. Writes mma_variants.json to --out (default $OUT or bench/results) and prints a table.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
from pathlib import Path

import torch

from vc_attention.commands.bench import cuda_time_ms
from vc_attention.commands.bench_peers import sage_portable
from vc_attention.kernels import backend_mma, mma_variants
from vc_attention.kernels.config import FIDELITY, PLAIN_8BIT, SPEED
from vc_attention.kernels.prepare_cuda import prepare_cuda

SHAPES = {"wan21-1.3b-480p": (1, 12, 32760, 128), "wan22-14b-720p": (1, 40, 75600, 128), "d64": (1, 32, 32768, 64)}
MODES = {"fidelity": FIDELITY, "speed": SPEED, "plain8": PLAIN_8BIT}
# targets of the portable-kernel issue: total time vs SageAttention 2.2's portable fp32+fp16 kernel
TARGET_SPEEDUP = {"fidelity": 1.1, "speed": 1.1, "plain8": 1.2}


def variant_flags(name: str) -> tuple[str, ...]:
    """A registered variant's flags (kernels/mma_variants.py), plus any '+'-separated -D flags after its name."""
    base, *extra = name.split("+")
    bad = [f for f in extra if not f.startswith("-D")]
    if bad:
        raise SystemExit(f"variant {name!r}: the parts after '+' must be -D flags, got {bad}")
    return mma_variants.flags(base) + tuple(extra)


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def time_shape(name, shape, variants, reps, sage, rows):
    b, h, n, d = shape
    gen = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(shape, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(3))
    perm = torch.argsort(torch.rand(b, h, n, device="cuda", generator=gen), dim=-1).to(torch.int32)
    sage_ms = cuda_time_ms(lambda: sage(q, k, v), reps) if sage is not None else None
    if sage_ms is not None:
        rows.append(dict(shape=name, mode="-", variant="sageattention-2.2-portable-fp32+fp16", total_ms=sage_ms))
    for mode, config in MODES.items():
        p = perm if config.v == "vsmooth" else None
        ops = prepare_cuda(q, k, v, p, config)
        prep_ms = cuda_time_ms(lambda: prepare_cuda(q, k, v, p, config), reps)
        first = None
        for variant in variants:
            flags = variant_flags(variant)
            out = torch.full_like(q, float("nan"))
            backend_mma.attention_from_operands(ops, config, out, "bhnd", variant_flags=flags)
            first = out if first is None else first
            attn_ms = cuda_time_ms(lambda: backend_mma.attention_from_operands(ops, config, out, "bhnd", variant_flags=flags), reps)
            row = dict(shape=name, mode=mode, variant=variant, flags=list(flags), prepare_ms=prep_ms, attention_ms=attn_ms,
                       total_ms=prep_ms + attn_ms, vs_first_variant=rel_l2(out, first), finite=bool(torch.isfinite(out).all()))
            if sage_ms is not None:
                row["speedup_vs_sage"] = sage_ms / row["total_ms"]
                row["meets_target"] = row["speedup_vs_sage"] >= TARGET_SPEEDUP[mode]
            rows.append(row)
            del out
        del ops, first
    del q, k, v, perm
    torch.cuda.empty_cache()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default=",".join(mma_variants.VARIANTS), help="comma-separated names of kernels/mma_variants.py")
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, from {', '.join(SHAPES)}")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    # build all first, side by side (each JIT build has its own directory and lock): the timing loop never compiles
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(variants)) as pool:
        for build in [pool.submit(backend_mma.extension, variant_flags(v)) for v in variants]:
            build.result()
    sage = sage_portable()
    if sage is None:
        print("sageattention 2.2 is not installed: its column is left out")
    rows: list[dict] = []
    for shape in args.shapes.split(","):
        if shape not in SHAPES:
            raise SystemExit(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")
        time_shape(shape, SHAPES[shape], variants, args.reps, sage, rows)
    env = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, cuda=torch.version.cuda, reps=args.reps)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "mma_variants.json").write_text(json.dumps(dict(env=env, rows=rows), indent=1))
    print(json.dumps(env))
    print(f"{'shape':16s} {'mode':8s} {'variant':38s} {'total ms':>9s} {'attn ms':>8s} {'x SA2.2':>7s} {'vs first':>9s}")
    for r in rows:
        print(f"{r['shape']:16s} {r['mode']:8s} {r['variant']:38s} {r['total_ms']:9.2f} {r.get('attention_ms', float('nan')):8.2f} "
              f"{r.get('speedup_vs_sage', float('nan')):7.2f} {r.get('vs_first_variant', float('nan')):9.2e}")
    return 0 if all(r.get("finite", True) for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
