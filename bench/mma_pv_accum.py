"""The portable kernel's PV accumulation, fp32 against fp32+fp16 (each 64-key partial in fp16, folded into
the fp32 O by an identity MMA), beside SageAttention 2.2's portable kernel in both of its accumulations.

  python3 bench/mma_pv_accum.py [--shapes wan21-1.3b-480p,wan22-14b-720p] [--reps 5] [--out DIR]

Why: GeForce Ada / Blackwell run FP8 MMAs with an fp16 accumulator at twice the fp32-accumulator rate, which
is why SageAttention 2.2 runs "fp32+fp16" there (sageattention/core.py: sm89, sm120). This project has
only an H200 (FP8 mma.sync lowered to f16 MMAs, one rate for both accumulators): the time columns here
are the proxy's, not a GeForce's; the error columns are the builds' own numerics and hold anywhere.
Time: random bf16 (B,H,N,D) with a random permutation, prepare + attention, CUDA events, median of --reps.
Error: rel-L2 against float64 attention on the video-like data (study/videodata.py, 32,760 tokens, 2 heads,
1,024 sampled query rows, each mode's preset grouping), as `vc-attention bench` measures it.
Writes mma_pv_accum.json to --out and prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from vc_attention.commands.bench import cuda_time_ms
from vc_attention.commands.bench_peers import sage_portable
from vc_attention.commands.bench_attention import fidelity_grouping
from vc_attention.kernels import backend_mma, grouping, jit, mma_variants
from vc_attention.kernels.config import FIDELITY, PLAIN_8BIT, SPEED
from vc_attention.kernels.prepare_cuda import prepare_cuda

SHAPES = {"wan21-1.3b-480p": (1, 12, 32760, 128), "wan22-14b-720p": (1, 40, 75600, 128)}
MODES = {"vc-fidelity": FIDELITY, "vc-speed": SPEED, "vc-plain8": PLAIN_8BIT}
ACCUMS = ("fp32", "fp32+fp16")


def builds(arch: str) -> dict[str, tuple[str, ...]]:
    """accumulation -> the -D flags of the backend's build with that accumulation on this arch."""
    default = mma_variants.default_variant(arch, pv_accum="fp32")
    return {"fp32": mma_variants.flags(default),
            "fp32+fp16": mma_variants.flags(mma_variants.default_variant(arch, pv_accum="fp32+fp16"))}


def ours(config, flags):
    def run(q, k, v, perm):
        ops = prepare_cuda(q, k, v, perm if config.v == "vsmooth" else None, config)
        out = torch.empty_like(q)
        return backend_mma.attention_from_operands(ops, config, out, "bhnd", variant_flags=flags)
    return run


def errors(methods: dict) -> dict[str, float]:
    from vc_attention.study.videodata import video_like_qkv

    q, k, v = video_like_qkv(B=1, H=2, T=21, Hgrid=30, Wgrid=52, D=128, dtype=torch.bfloat16, device="cuda")
    rows = torch.randperm(q.shape[2], generator=torch.Generator().manual_seed(0))[:1024].to("cuda")
    qd, kd, vd = q[:, :, rows].double(), k.double(), v.double()
    exact = torch.softmax(qd @ kd.transpose(-1, -2) / 128 ** 0.5, dim=-1) @ vd
    perms: dict = {}
    out = {}
    for name, (mode, fn) in methods.items():
        g = fidelity_grouping(mode)
        if g not in perms:
            perms[g] = grouping.group_tokens(v, *g).perm()
        got = fn(q, k, v, perms[g])[:, :, rows].double()
        out[name] = float((got - exact).norm() / exact.norm())
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    args = parser.parse_args()
    arch = jit.target_arch()
    flags = builds(arch)
    for f in flags.values():
        backend_mma.extension(f)  # build before timing
    methods = {f"{mode} {accum}": (mode, ours(config, flags[accum])) for mode, config in MODES.items() for accum in ACCUMS}
    for accum in ("fp32+fp16", "fp32+fp32"):
        fn = sage_portable(accum)
        if fn is not None:
            methods[f"sageattention-2.2-portable {accum}"] = ("sage", lambda q, k, v, perm, fn=fn: fn(q, k, v))
    errs = errors(methods)
    rows = []
    for shape in args.shapes.split(","):
        b, h, n, d = SHAPES[shape]
        gen = torch.Generator(device="cuda").manual_seed(1)
        q, k, v = (torch.randn(b, h, n, d, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(3))
        perm = torch.argsort(torch.rand(b, h, n, device="cuda", generator=gen), dim=-1).to(torch.int32)
        for name, (_, fn) in methods.items():
            ms = cuda_time_ms(lambda: fn(q, k, v, perm), args.reps)
            rows.append(dict(shape=shape, method=name, ms=ms, rel_l2_video_like=errs[name]))
        base = next((r["ms"] for r in rows if r["shape"] == shape and r["method"] == "sageattention-2.2-portable fp32+fp16"), None)
        for r in rows:
            if r["shape"] == shape and base is not None:
                r["x_sage_portable_fp32_fp16"] = base / r["ms"]
        del q, k, v, perm
        torch.cuda.empty_cache()
    env = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, cuda=torch.version.cuda, arch=arch, reps=args.reps,
               builds={a: list(f) for a, f in flags.items()},
               command=f"python3 bench/mma_pv_accum.py --shapes {args.shapes} --reps {args.reps}")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "mma_pv_accum.json").write_text(json.dumps(dict(env=env, rows=rows), indent=1))
    print(json.dumps({k: v for k, v in env.items() if k != "builds"}))
    print(f"{'shape':16s} {'method':40s} {'ms':>8s} {'x SA port':>9s} {'rel-L2':>8s}")
    for r in rows:
        print(f"{r['shape']:16s} {r['method']:40s} {r['ms']:8.2f} {r.get('x_sage_portable_fp32_fp16', float('nan')):9.3f} "
              f"{r['rel_l2_video_like']:8.5f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
