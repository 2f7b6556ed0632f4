"""`vc-attention bench`: VC-Attention against SDPA at video-DiT shapes, speed and fidelity side by side.

Per shape: torch SDPA (cuDNN and flash backends), the `sageattention` package if installed, and the
three VC configurations (plain 8-bit, fidelity, speed) through the public op, preprocessing
included; the grouping (k-means + permutation) is timed separately because a sampling run computes
it only in the first steps. TOPS-equivalent = 4*B*H*N^2*D / time. Fidelity: relative L2 against
fp64 exact attention on video-like data (kernels/videodata.py) of the shape's head dim.

Shapes (tokens = latent frames x latent height x latent width after patching):
- wan22-14b-720p  (1, 40, 75600, 128): Wan2.2-T2V-A14B, 1280x720, 81 frames -> 21 x 45 x 80.
- wan21-1.3b-480p (1, 12, 32760, 128): Wan2.1-T2V-1.3B, 832x480, 81 frames -> 21 x 30 x 52.
- hunyuan15-720p  (1, 16, 111600, 128): HunyuanVideo-1.5, 1280x720, 121 frames; VAE 16x spatial and
  4x temporal compression, patch 1 -> 31 x 45 x 80; 16 heads of 128 (hidden 2048). Heads, head dim
  and patch size are the defaults of diffusers 0.42.1's HunyuanVideo15Transformer3DModel, the
  compression factors those of its VAE.
- ltx-video       (1, 32, 6144, 64): LTX-Video 2B, 768x512, 121 frames; VAE 32x32x8, patch 1 ->
  16 x 16 x 24; 32 heads of 64 (hidden 2048).
- d64             (1, 32, 32768, 64): the head-dim-64 case of docs/FINDINGS.
"""
from __future__ import annotations

import argparse
import json
import re

HELP = "Time VC-Attention vs SDPA (cuDNN, flash) and sageattention at video-DiT shapes, with fidelity."

SHAPES = {
    "wan22-14b-720p": (1, 40, 75600, 128),
    "wan21-1.3b-480p": (1, 12, 32760, 128),
    "hunyuan15-720p": (1, 16, 111600, 128),
    "ltx-video": (1, 32, 6144, 64),
    "d64": (1, 32, 32768, 64),
}
FP8_DENSE_PEAK_TOPS = 1979.0  # H100/H200 SXM dense FP8 tensor-core peak (datasheet)
DEFAULT_SHAPES = ("wan22-14b-720p", "wan21-1.3b-480p", "hunyuan15-720p", "ltx-video")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shapes", default=",".join(DEFAULT_SHAPES),
                        help=f"comma list of {', '.join(SHAPES)} or B,H,N,D quadruples joined by ';'")
    parser.add_argument("--backend", default="auto", help="VC backend: auto, sm90 or mma (default: auto = fastest capable)")
    parser.add_argument("--reps", type=int, default=5, help="timed repetitions per method (median reported)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--save", action="store_true", help="also write bench/results/<gpu>.json")
    parser.add_argument("--no-fidelity", action="store_true", help="skip the fidelity column")
    parser.add_argument("--e2e", action="store_true", help="run the end-to-end Wan-14B forward benchmark instead")


def parse_shapes(text: str) -> dict[str, tuple[int, int, int, int]]:
    """Named shapes separated by ',' or explicit 'B,H,N,D' quadruples separated by ';'."""
    if re.fullmatch(r"\s*\d+\s*,\s*\d+\s*,\s*\d+\s*,\s*\d+\s*(;\s*\d+\s*,\s*\d+\s*,\s*\d+\s*,\s*\d+\s*)*", text):
        quads = [tuple(int(x) for x in part.split(",")) for part in text.split(";")]
        return {"x".join(map(str, q)): q for q in quads}
    out = {}
    for name in (n.strip() for n in text.split(",") if n.strip()):
        if name not in SHAPES:
            raise ValueError(f"unknown shape {name!r}; known: {', '.join(SHAPES)} (or B,H,N,D).")
        out[name] = SHAPES[name]
    return out


def cuda_time_ms(fn, reps: int, warmup: int = 1) -> float:
    """Median GPU time of `reps` calls of fn (CUDA events on the current stream), after `warmup` calls.

    The one timer of the benchmarks (bench/gpu_check.py, bench/sm90_check.py and
    bench/grouping_bench.py use it too). statistics.median: the middle value, or the mean of the two
    middle values for an even count.
    """
    import statistics

    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def _methods(backend: str):
    """name -> fn(q, k, v, perm) on (B,H,N,D) bf16 tensors."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from ..kernels.api import vc_attention
    from ..kernels.config import FIDELITY, PLAIN_8BIT, SPEED

    def sdpa(kind):
        def call(q, k, v, perm):
            with sdpa_kernel([kind]):
                return F.scaled_dot_product_attention(q, k, v)
        return call

    def vc(config, which=backend):
        return lambda q, k, v, perm: vc_attention(q, k, v, config=config, perm=perm if config.needs_grouping else None,
                                                  backend=which, perm_from_grouping=True)

    methods = {"sdpa-cudnn": sdpa(SDPBackend.CUDNN_ATTENTION), "sdpa-flash": sdpa(SDPBackend.FLASH_ATTENTION)}
    try:
        from sageattention import sageattn
    except ImportError:
        sageattn = None
    if sageattn is not None:
        methods["sageattention"] = lambda q, k, v, perm: sageattn(q, k, v, tensor_layout="HND")
    methods.update({"vc-plain8": vc(PLAIN_8BIT), "vc-fidelity": vc(FIDELITY), "vc-speed": vc(SPEED)})
    if backend == "auto":  # the portable kernel side by side with whatever auto picks
        methods.update({"vc-fidelity[mma]": vc(FIDELITY, "mma"), "vc-speed[mma]": vc(SPEED, "mma")})
    return methods


def _fidelity(methods, head_dim: int) -> dict[str, float]:
    """Relative L2 vs fp64 exact attention on video-like data (4 frames of a 480p latent)."""
    import torch

    from ..kernels import grouping, reference
    from ..kernels.videodata import video_like_qkv

    q, k, v = video_like_qkv(B=1, H=4, T=4, Hgrid=30, Wgrid=52, D=head_dim, dtype=torch.bfloat16, device="cuda")
    perm = grouping.group_tokens(v, grouping.DEFAULT_CLUSTERS, grouping.DEFAULT_ITERS).perm()
    exact = reference.exact_attention(q, k, v)
    return {name: float((fn(q, k, v, perm).double() - exact).norm() / exact.norm()) for name, fn in methods.items()}


def benchmark(shapes: dict, backend: str = "auto", reps: int = 5, fidelity: bool = True) -> dict:
    import torch

    from ..kernels import backends, grouping
    from ..kernels.config import SPEED

    if not torch.cuda.is_available():
        raise ValueError("vc-attention bench needs a CUDA GPU; `vc-attention doctor` says what is missing.")
    methods = _methods(backend)
    rows, errors = [], {}
    for name, (b, h, n, d) in shapes.items():
        flops = 4.0 * b * h * n * n * d
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(b, h, n, d, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        def group():
            return grouping.group_tokens(v, grouping.DEFAULT_CLUSTERS, grouping.DEFAULT_ITERS).perm()

        group_ms = cuda_time_ms(group, max(1, reps // 2))
        perm = group()
        chosen = backends.select(q, SPEED, "bhnd", backend, allow_slow=False).name
        base = None
        for method, fn in methods.items():
            ms = cuda_time_ms(lambda: fn(q, k, v, perm), reps)
            base = base or ms
            ran = "mma" if method.endswith("[mma]") else chosen
            rows.append(dict(shape=name, B=b, H=h, N=n, D=d, method=method, ms=ms, tops=flops / ms / 1e9,
                             fp8_peak_fraction=flops / ms / 1e9 / FP8_DENSE_PEAK_TOPS if method.startswith("vc-") else None,
                             speedup_vs_cudnn=base / ms, backend=ran if method.startswith("vc-") else None))
        rows.append(dict(shape=name, B=b, H=h, N=n, D=d, method="grouping (k-means+perm)", ms=group_ms, tops=None,
                         speedup_vs_cudnn=None, backend=None))
        if fidelity and d not in errors:
            errors[d] = _fidelity(methods, d)
        del q, k, v, perm
        torch.cuda.empty_cache()
    for row in rows:
        row["rel_l2_video_like"] = errors.get(row["D"], {}).get(row["method"])
    return dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, cuda=torch.version.cuda,
                cudnn=torch.backends.cudnn.version(), rows=rows)


def format_table(result: dict) -> str:
    lines = [f"{result['gpu']}, torch {result['torch']}, CUDA {result['cuda']}, cuDNN {result['cudnn']}",
             f"{'shape':16s} {'method':24s} {'ms':>9s} {'TOPS':>6s} {'%FP8pk':>6s} {'x cuDNN':>7s} {'rel-L2':>8s}  backend"]
    for r in result["rows"]:
        tops = f"{r['tops']:6.0f}" if r["tops"] else "     -"
        speed = f"{r['speedup_vs_cudnn']:7.2f}" if r["speedup_vs_cudnn"] else "      -"
        err = f"{r['rel_l2_video_like']:8.4f}" if r.get("rel_l2_video_like") is not None else "       -"
        peak = f"{100 * r['fp8_peak_fraction']:6.1f}" if r.get("fp8_peak_fraction") else "     -"
        lines.append(f"{r['shape']:16s} {r['method']:24s} {r['ms']:9.2f} {tops} {peak} {speed} {err}  {r['backend'] or ''}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.e2e:
        from .bench_e2e import run_e2e

        print(json.dumps(run_e2e(), indent=1))
        return 0
    result = benchmark(parse_shapes(args.shapes), args.backend, args.reps, not args.no_fidelity)
    print(json.dumps(result, indent=1) if args.json else format_table(result))
    if args.save:
        from pathlib import Path

        slug = re.sub(r"[^a-z0-9]+", "-", result["gpu"].lower()).strip("-")
        path = Path(__file__).resolve().parent.parent / "bench" / "results" / f"{slug}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1))
        print(f"saved {path}")
    return 0
