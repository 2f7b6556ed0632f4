"""One-call GPU check of the `mma` backend: JIT build, correctness against reference.py, timing.

  python bench/gpu_check.py [--out DIR] [--skip-correctness] [--skip-timing] [--reps N]

Correctness: every configuration against the emulation (relative L2, gate 1e-3) and against fp64
exact attention, random and video-like data, N in {1, 77, 128, 129, 4097, 32760}, both layouts,
head dims 64/128, B=2, fp16/bf16, outputs poisoned with NaN before each run; plus the prepare
kernels against prepare_reference (code agreement). Timing: SDPA (cuDNN, flash) and each
configuration (prepare and attention separately) at the video-DiT shapes. Prints a table last and
writes gpu_check.json to --out (default $OUT or bench/results).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from vc_attention.commands.bench import cuda_time_ms
from vc_attention.kernels import backend_mma, reference
from vc_attention.kernels.layout import from_bhnd, to_bhnd
from vc_attention.kernels.config import FIDELITY, PLAIN_8BIT, SPEED, VCConfig
from vc_attention.kernels.prepare_cuda import prepare_cuda
from vc_attention.kernels.prepare_reference import prepare_reference

CONFIGS = {"fidelity": FIDELITY, "speed": SPEED, "plain8": PLAIN_8BIT, "fp8qk": VCConfig(qk="fp8")}
TIMED_CONFIGS = ("fidelity", "speed", "plain8")
SHAPES = {"wan22-14b-720p": (1, 40, 75600, 128), "wan21-1.3b-480p": (1, 12, 32760, 128), "d64": (1, 32, 32768, 64)}
GATE = 1e-3
# build-time kernel variants timed next to the default build: (shape, config) -> flag sets
VARIANTS = {("wan22-14b-720p", "speed"): [("-DVC_MMA_MIN_BLOCKS=3",)]}


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def random_qkv(b, h, n, d, dtype, layout, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    shape = (b, h, n, d) if layout == "bhnd" else (b, n, h, d)
    q, k, v = (torch.randn(shape, generator=gen, device="cuda") for _ in range(3))
    v = v + 2.0 * torch.randn(d, generator=gen, device="cuda")  # channel offsets (V-Smooth territory)
    return q.to(dtype), k.to(dtype), (v * 0.5).to(dtype)


def exact_attention_chunked(q, k, v, layout, chunk=2048):
    """fp64 softmax attention (B,H,N,D), query rows in chunks so N=32K fits in memory."""
    qb, kb, vb = (to_bhnd(t, layout).double() for t in (q, k, v))
    scale = 1.0 / math.sqrt(qb.shape[-1])
    outs = [torch.softmax(qb[:, :, i:i + chunk] @ kb.transpose(-1, -2) * scale, -1) @ vb for i in range(0, qb.shape[2], chunk)]
    return from_bhnd(torch.cat(outs, dim=2), layout)


def reference_bhnd(q, k, v, perm, config, layout):
    """The emulation on contiguous (B,H,N,D) copies (reference.block_absmax views its input, which
    fails on the strided bnhd->bhnd view when N is a multiple of the block)."""
    qb, kb, vb = (to_bhnd(t, layout).contiguous() for t in (q, k, v))
    return reference.vc_attention_reference(qb, kb, vb, config, perm=perm, parts=True).out


def run_mma(q, k, v, perm, config, layout):
    ops = prepare_cuda(q, k, v, perm, config, layout)
    out = torch.full(q.shape, float("nan"), dtype=q.dtype, device=q.device)  # poisoned
    return backend_mma.attention_from_operands(ops, config, out, layout)


def check_case(q, k, v, perm, name, config, layout, label):
    out = run_mma(q, k, v, perm, config, layout)
    ref = reference_bhnd(q, k, v, perm, config, layout)
    out = to_bhnd(out, layout)
    exact = to_bhnd(exact_attention_chunked(q, k, v, layout), layout)
    # bf16 output rounding (2^-9 relative) is about the size of the gate: measured and allowed for
    rounding = rel_l2(ref.to(q.dtype), ref) if q.dtype == torch.bfloat16 else 0.0
    row = dict(case=label, config=name, layout=layout, dtype=str(q.dtype).replace("torch.", ""), shape=list(q.shape),
               finite=bool(torch.isfinite(out).all()), vs_reference=rel_l2(out, ref), output_rounding=rounding,
               vs_exact=rel_l2(out, exact), reference_vs_exact=rel_l2(ref, exact))
    row["ok"] = row["finite"] and row["vs_reference"] <= GATE + rounding
    return row


def correctness(rows: list, budget_s: float) -> None:
    start = time.time()
    for n in (1, 77, 128, 129, 4097):
        for d in (64, 128):
            for layout in ("bhnd", "bnhd"):
                for dtype in (torch.float16, torch.bfloat16):
                    q, k, v = random_qkv(2, 2, n, d, dtype, layout, seed=n + d)
                    perm = torch.argsort(torch.rand(2, 2, n, device="cuda"), dim=-1)
                    for name, config in CONFIGS.items():
                        rows.append(check_case(q, k, v, perm if name != "plain8" else None, name, config, layout, f"random N={n}"))
    for name, config in CONFIGS.items():
        layout = "bnhd" if name == "speed" else "bhnd"
        q, k, v = random_qkv(2, 2, 32760, 128, torch.bfloat16, layout, seed=7)
        rows.append(check_case(q, k, v, None, name, config, layout, "random N=32760"))
        if time.time() - start > budget_s:
            break
    try:
        from vc_attention.study.fidelity import grouping_permutation
        from vc_attention.study.videodata import video_like_qkv
    except ImportError as err:
        rows.append(dict(case="video-like", skipped=str(err), ok=True))
        return
    q, k, v = video_like_qkv(B=2, H=2, T=4, Hgrid=30, Wgrid=52, D=128, dtype=torch.bfloat16, device="cuda")
    perm = grouping_permutation(v, 64, 8)
    for name, config in CONFIGS.items():
        rows.append(check_case(q, k, v, perm if config.v == "vsmooth" else None, name, config, "bhnd", "video-like N=6240"))


def prepare_agreement(rows: list) -> None:
    """CUDA prepare vs prepare_reference: fraction of identical codes, worst scale difference."""
    for name in ("fidelity", "plain8", "fp8qk"):
        config = CONFIGS[name]
        q, k, v = random_qkv(2, 3, 1000, 128, torch.bfloat16, "bnhd", seed=3)
        perm = torch.argsort(torch.rand(2, 3, 1000, device="cuda"), dim=-1)
        got = prepare_cuda(q, k, v, perm, config, "bnhd")
        want = prepare_reference(q, k, v, perm, config, "bnhd")
        row = dict(case="prepare", config=name)
        for field in ("q_q", "k_q", "v_t"):
            a, b = getattr(got, field), getattr(want, field)
            row[f"{field}_equal"] = float((a.view(torch.uint8) == b.view(torch.uint8)).float().mean())
        for field in ("q_scale", "k_scale", "v_scale"):
            row[f"{field}_maxrel"] = float(((getattr(got, field) - getattr(want, field)).abs() / getattr(want, field).abs().clamp_min(1e-30)).max())
        row["v_mean_maxabs"] = float((got.v_mean.float() - want.v_mean.float()).abs().max())
        row["ok"] = min(row["q_q_equal"], row["k_q_equal"], row["v_t_equal"]) > 0.999
        rows.append(row)


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
        for name in TIMED_CONFIGS:
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


def print_tables(env, checks, times):
    print(json.dumps(env))
    bad = [r for r in checks if not r.get("ok", True)]
    worst = {}
    for r in checks:
        if "vs_reference" in r:
            key = (r["config"], r["case"].split(" N=")[0])
            worst[key] = max(worst.get(key, 0.0), r["vs_reference"])
    print(f"\ncorrectness: {len(checks)} checks, {len(bad)} failing")
    for r in bad[:20]:
        print("  FAIL", r)
    for r in checks:
        if r.get("case") == "prepare":
            print("  prepare", {k: (round(v, 6) if isinstance(v, float) else v) for k, v in r.items()})
    for (config, data), err in sorted(worst.items()):
        print(f"  worst rel-L2 vs reference  {config:9s} {data:12s} {err:.2e}")
    for r in checks:
        if r.get("case", "").startswith(("video", "random N=32760")):
            print(f"  {r['case']:18s} {r['config']:9s} vs ref {r['vs_reference']:.2e}  vs exact {r['vs_exact']:.2e} (reference vs exact {r['reference_vs_exact']:.2e})")
    if times:
        print(f"\n{'shape':17s} {'method':15s} {'ms':>8s} {'TOPS':>6s} {'x cuDNN':>7s} {'prep ms':>8s} {'attn ms':>8s} {'prep GB/s':>9s}")
        cudnn = {r["shape"]: r["ms"] for r in times if r["method"] == "sdpa-cudnn"}
        for r in times:
            print(f"{r['shape']:17s} {r['method']:15.34s} {r['ms']:8.2f} {r['tops']:6.0f} {cudnn[r['shape']] / r['ms']:7.2f} "
                  f"{r.get('prepare_ms', float('nan')):8.2f} {r.get('attention_ms', float('nan')):8.2f} {r.get('prepare_gbs', float('nan')):9.0f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    parser.add_argument("--skip-correctness", action="store_true")
    parser.add_argument("--skip-timing", action="store_true")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    env = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, cuda=torch.version.cuda,
               cudnn=torch.backends.cudnn.version(), driver=None)
    t0 = time.time()
    backend_mma.extension()
    env["build_s"] = round(time.time() - t0, 1)
    for variant in {v for flag_sets in VARIANTS.values() for v in flag_sets}:
        backend_mma.extension(variant)
    checks, times = [], []
    if not args.skip_correctness:
        correctness(checks, budget_s=120)
        prepare_agreement(checks)
    env["correctness_s"] = round(time.time() - t0 - env["build_s"], 1)
    if not args.skip_timing:
        timing(times, args.reps)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "gpu_check.json").write_text(json.dumps(dict(env=env, checks=checks, timing=times), indent=1))
    print_tables(env, checks, times)
    return 0 if all(r.get("ok", True) for r in checks) else 1


if __name__ == "__main__":
    raise SystemExit(main())
