"""Timing of the `mma` backend and its build-time variants (JIT build, then SDPA and each configuration).

  python bench/gpu_check.py [--out DIR] [--reps N]

Times SDPA (cuDNN, flash) and each configuration (prepare and attention separately) at the
video-DiT shapes, plus the build-time kernel variants in VARIANTS next to the default build. Prints
a table last and writes gpu_check.json to --out (default $OUT or bench/results). Correctness of
every backend is the GPU test suite's job: `pytest -q -m gpu` (tests/test_backends_gpu.py).
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from vc_attention.commands.bench import cuda_time_ms
from vc_attention.kernels import backend_mma, mma_variants
from vc_attention.kernels.config import FIDELITY, PLAIN_8BIT, SPEED
from vc_attention.kernels.layout import shape_in
from vc_attention.kernels.prepare_cuda import prepare_cuda

CONFIGS = {"fidelity": FIDELITY, "speed": SPEED, "plain8": PLAIN_8BIT}
SHAPES = {"wan22-14b-720p": (1, 40, 75600, 128), "wan21-1.3b-480p": (1, 12, 32760, 128), "d64": (1, 32, 32768, 64)}
# build-time kernel variants timed next to the default build: (shape, config) -> flag sets
VARIANTS = {("wan22-14b-720p", "speed"): [mma_variants.flags("rows16")]}  # the first, 16-row layout


def random_qkv(b, h, n, d, dtype, layout, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(shape_in(layout, b, h, n, d), generator=gen, device="cuda") for _ in range(3))
    v = v + 2.0 * torch.randn(d, generator=gen, device="cuda")  # channel offsets (V-Smooth territory)
    return q.to(dtype), k.to(dtype), (v * 0.5).to(dtype)


def timing(rows: list, reps: int) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for shape_name, (b, h, n, d) in SHAPES.items():
        flops = 4.0 * b * h * n * n * d
        q, k, v = random_qkv(b, h, n, d, torch.bfloat16, "bhnd", seed=1)
        perm = torch.argsort(torch.rand(b, h, n, device="cuda"), dim=-1).to(torch.int32)
        for backend_name, backend in (("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa-flash", SDPBackend.FLASH_ATTENTION)):
            with sdpa_kernel([backend]):
                ms = cuda_time_ms(lambda: F.scaled_dot_product_attention(q, k, v), reps)
            rows.append(dict(shape=shape_name, method=backend_name, ms=ms, tops=flops / ms / 1e9))
        for name in CONFIGS:
            config = CONFIGS[name]
            p = perm if config.v == "vsmooth" else None
            out = torch.empty_like(q)
            ops = prepare_cuda(q, k, v, p, config)
            prep_ms = cuda_time_ms(lambda: prepare_cuda(q, k, v, p, config), reps)
            attn_ms = cuda_time_ms(lambda: backend_mma.attention_from_operands(ops, config, out, "bhnd"), reps)
            moved = 3 * q.numel() * 2 + 3 * q.numel()  # read q, k, v once; write q_q, k_q, v_t once
            rows.append(dict(shape=shape_name, method=f"mma-{name}", ms=prep_ms + attn_ms, prepare_ms=prep_ms, attention_ms=attn_ms,
                             tops=flops / (prep_ms + attn_ms) / 1e9, attention_tops=flops / attn_ms / 1e9,
                             prepare_gbs=moved / prep_ms / 1e6))
            for variant in VARIANTS.get((shape_name, name), ()):
                ms = cuda_time_ms(lambda: backend_mma.attention_from_operands(ops, config, out, "bhnd", variant_flags=variant), reps)
                rows.append(dict(shape=shape_name, method=f"mma-{name}[{' '.join(variant)}]", ms=prep_ms + ms, prepare_ms=prep_ms,
                                 attention_ms=ms, tops=flops / (prep_ms + ms) / 1e9, attention_tops=flops / ms / 1e9))
            del ops, out
        del q, k, v
        torch.cuda.empty_cache()


def print_table(env, times):
    print(json.dumps(env))
    print(f"\n{'shape':17s} {'method':15s} {'ms':>8s} {'TOPS':>6s} {'x cuDNN':>7s} {'prep ms':>8s} {'attn ms':>8s} {'prep GB/s':>9s}")
    cudnn = {r["shape"]: r["ms"] for r in times if r["method"] == "sdpa-cudnn"}
    for r in times:
        print(f"{r['shape']:17s} {r['method']:15.34s} {r['ms']:8.2f} {r['tops']:6.0f} {cudnn[r['shape']] / r['ms']:7.2f} "
              f"{r.get('prepare_ms', float('nan')):8.2f} {r.get('attention_ms', float('nan')):8.2f} {r.get('prepare_gbs', float('nan')):9.0f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    parser.add_argument("--skip-correctness", action="store_true",
                        help="accepted for existing command lines; correctness is `pytest -q -m gpu` now")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    env = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, cuda=torch.version.cuda,
               cudnn=torch.backends.cudnn.version(), driver=None)
    t0 = time.time()
    backend_mma.extension()
    env["build_s"] = round(time.time() - t0, 1)
    for variant in {v for flag_sets in VARIANTS.values() for v in flag_sets}:
        backend_mma.extension(variant)
    times = []
    timing(times, args.reps)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "gpu_check.json").write_text(json.dumps(dict(env=env, timing=times), indent=1))
    print_table(env, times)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
