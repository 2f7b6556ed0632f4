"""Times the prepare extension's build-time variants (kernels/prepare_cuda.VARIANTS) side by side.

  python3 bench/prepare_variants.py [--shapes wan21-1.3b-480p,wan22-14b-720p,d64] [--variants default,stats-prefetch]
                                    [--modes fidelity,plain8,speed] [--reps 20] [--out DIR]

Per shape (random bf16 with channel offsets, (B,H,N,D) layout, a random permutation) and mode
(V-Smooth fidelity, plain 8-bit): each variant's fused prepare (both kernels and the workspace
zeroing, as a call runs it) timed with CUDA events, median of --reps after a warm-up, all variants
on the same tensors in the same process; each variant's operands are compared with the default
build's bit for bit, so a fast wrong build cannot pass. The floor column is the bytes the prepare
must move (Q, K and V read once, the operands written) at the GPU's --peak-tbs. Writes
prepare_variants.json to --out (default $OUT or bench/results) and prints a table.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path

import torch

from vc_attention.commands.bench import SHAPES, cuda_time_ms
from vc_attention.kernels import prepare_cuda as prep
from vc_attention.kernels.config import FIDELITY, PLAIN_8BIT, SPEED

# speed: 256-row V-Smooth means (VCConfig.v_mean_rows); the 128-row-only variants are skipped there
MODES = {"fidelity": FIDELITY, "plain8": PLAIN_8BIT, "speed": SPEED}


def same_operands(a, b) -> bool:
    bits = lambda t: t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t
    return all(torch.equal(bits(getattr(a, f.name)), bits(getattr(b, f.name))) if isinstance(getattr(a, f.name), torch.Tensor)
               else getattr(a, f.name) == getattr(b, f.name) for f in dataclasses.fields(a))


def floor_ms(b, h, n, d, peak_tbs) -> float:
    """Bytes read (q, k, v in 16 bits) and written (codes, 1 byte each) over the peak bandwidth."""
    return (b * h * n * d * (3 * 2 + 3)) / (peak_tbs * 1e12) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="wan21-1.3b-480p,wan22-14b-720p,d64")
    parser.add_argument("--variants", default=",".join(prep.VARIANTS), help="comma list of kernels/prepare_cuda.VARIANTS")
    parser.add_argument("--modes", default="fidelity,plain8", help=f"comma list of {', '.join(MODES)}")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--peak-tbs", type=float, default=4.8, help="DRAM bandwidth for the floor column (H200: 4.8)")
    parser.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    args = parser.parse_args()
    variants = {name: prep.VARIANTS[name] for name in args.variants.split(",")}
    # every variant takes K scales per 128 keys only (prepare_binding.cpp refuses 256): all builds run that here
    modes = {name: MODES[name].with_(k_scale_rows=128) for name in args.modes.split(",")}
    rows = []
    for shape in args.shapes.split(","):
        b, h, n, d = SHAPES[shape]
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(b, h, n, d, generator=gen, device="cuda") for _ in range(3))
        v = v + 2.0 * torch.randn(d, generator=gen, device="cuda")
        q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))
        perm = torch.argsort(torch.rand(b, h, n, device="cuda"), dim=-1).to(torch.int32)
        for mode, config in modes.items():
            reference = prep.prepare_cuda(q, k, v, perm, config)
            for variant, flags in variants.items():
                if config.v_mean_rows != prep.N_ALIGN and variant in prep.MEAN_128_ONLY:
                    continue
                ops = prep.prepare_cuda(q, k, v, perm, config, variant_flags=flags)
                ms = cuda_time_ms(lambda: prep.prepare_cuda(q, k, v, perm, config, variant_flags=flags), reps=args.reps)
                rows.append({"shape": shape, "mode": mode, "variant": variant, "ms": ms,
                             "floor_ms": floor_ms(b, h, n, d, args.peak_tbs), "bit_identical": same_operands(reference, ops)})
                del ops
            del reference
        del q, k, v, perm
        torch.cuda.empty_cache()
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda, "reps": args.reps,
           "command": f"python3 bench/prepare_variants.py --shapes {args.shapes} --variants {args.variants} --modes {args.modes}"}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "prepare_variants.json").write_text(json.dumps({"env": env, "rows": rows}, indent=1))
    print(json.dumps(env))
    print(f"{'shape':<17}{'mode':<10}{'variant':<14}{'ms':>8}{'floor ms':>10}  bit-identical")
    for r in rows:
        print(f"{r['shape']:<17}{r['mode']:<10}{r['variant']:<14}{r['ms']:>8.3f}{r['floor_ms']:>10.3f}  {r['bit_identical']}")


if __name__ == "__main__":
    main()
