"""`vc-attention bench`: VC-Attention side by side with cuDNN SDPA and SageAttention 2.2.

Sections (each one writes its rows into bench/results/<gpu>.json with `--save`; see
commands/bench_results.py for the schema and commands/bench_report.py for the docs rendered from it):
- attention (default): every method at video-DiT shapes, with grouping timed beside it;
- `--e2e`: one forward of the Wan 14B transformer (diffusers, random weights) per method (SDPA, SageAttention 2.2, the
  node's presets fidelity / balanced / speed);
- `--e2e --gpus N` (N > 1): the same model with Ulysses context parallel through diffusers on N GPUs
  against 1 GPU, our backend and diffusers' native attention (commands/bench_multigpu.py);
- `--comfyui PATH`: sampling in a real ComfyUI checkout, default attention vs `--use-sage-attention`
  vs our node's presets (commands/bench_comfyui.py);
- `--all`: attention + e2e (+ comfyui when PATH or $COMFYUI_PATH is given).
`--report` re-renders BENCHMARKS.md and the README headline from the saved file (no GPU needed).

Shapes (tokens = latent frames x latent height x latent width after patching):
- wan22-14b-720p      (1, 40, 75600, 128): Wan2.2-T2V-A14B, 1280x720, 81 frames -> 21 x 45 x 80.
- wan22-14b-720p-cfg  (2, 40, 75600, 128): the same with cond and uncond batched (ComfyUI's CFG).
- wan21-1.3b-480p     (1, 12, 32760, 128): Wan2.1-T2V-1.3B, 832x480, 81 frames -> 21 x 30 x 52.
- hunyuan15-720p      (1, 16, 111600, 128): HunyuanVideo-1.5, 1280x720, 121 frames; VAE 16x spatial
  and 4x temporal compression, patch 1 -> 31 x 45 x 80; 16 heads of 128 (hidden 2048). Heads, head
  dim and patch size are the defaults of diffusers 0.42.1's HunyuanVideo15Transformer3DModel, the
  compression factors those of its VAE.
- ltx-video           (1, 32, 6144, 64): LTX-Video 2B, 768x512, 121 frames; VAE 32x32x8, patch 1 ->
  16 x 16 x 24; 32 heads of 64 (hidden 2048).
- d64                 (1, 32, 32768, 64): the head-dim-64 case of docs/FINDINGS.
"""
from __future__ import annotations

import argparse
import json
import os
import re

HELP = "Time VC-Attention against cuDNN SDPA and SageAttention 2.2 (kernels, end to end, ComfyUI sampling)."

SHAPES = {
    "wan22-14b-720p": (1, 40, 75600, 128),
    "wan22-14b-720p-cfg": (2, 40, 75600, 128),
    "wan21-1.3b-480p": (1, 12, 32760, 128),
    "hunyuan15-720p": (1, 16, 111600, 128),
    "ltx-video": (1, 32, 6144, 64),
    "d64": (1, 32, 32768, 64),
}
DEFAULT_SHAPES = tuple(SHAPES)
# shapes where the portable kernels (ours on `mma`, SageAttention's sm89 kernel) are compared too
PORTABLE_SHAPES = ("wan22-14b-720p", "wan21-1.3b-480p", "d64")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shapes", default=",".join(DEFAULT_SHAPES),
                        help=f"comma list of {', '.join(SHAPES)} or B,H,N,D quadruples joined by ';'")
    parser.add_argument("--portable-shapes", default=",".join(PORTABLE_SHAPES),
                        help="shapes (names as in --shapes) that also time the portable kernels; '' for none")
    parser.add_argument("--backend", default="auto", help="VC backend: auto, sm90 or mma (default: auto = fastest capable)")
    parser.add_argument("--reps", type=int, default=10, help="timed repetitions per method (median reported)")
    parser.add_argument("--no-fidelity", action="store_true", help="skip the fidelity column")
    parser.add_argument("--e2e", action="store_true", help="run the end-to-end Wan-14B forward benchmark instead")
    parser.add_argument("--gpus", type=int, default=1,
                        help="with --e2e: GPUs for the Ulysses context-parallel run (N > 1 adds the multi-GPU section)")
    parser.add_argument("--comfyui", metavar="PATH", help="run the ComfyUI sampling benchmark in this ComfyUI checkout instead")
    parser.add_argument("--comfyui-rounds", type=int, default=1,
                        help="with --comfyui: run every mode this many times, interleaved (median seconds reported)")
    parser.add_argument("--all", action="store_true", help="attention + e2e (+ comfyui with --comfyui or $COMFYUI_PATH)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--save", action="store_true", help="write the sections that ran into bench/results/<gpu>.json")
    parser.add_argument("--report", action="store_true",
                        help="only re-render BENCHMARKS.md and the README headline from the saved results (no GPU)")


def parse_shapes(text: str) -> dict[str, tuple[int, int, int, int]]:
    """Named shapes separated by ',' or explicit 'B,H,N,D' quadruples separated by ';'."""
    if not text.strip():
        return {}
    if re.fullmatch(r"\s*\d+\s*,\s*\d+\s*,\s*\d+\s*,\s*\d+\s*(;\s*\d+\s*,\s*\d+\s*,\s*\d+\s*,\s*\d+\s*)*", text):
        quads = [tuple(int(x) for x in part.split(",")) for part in text.split(";")]
        return {"x".join(map(str, q)): q for q in quads}
    out = {}
    for name in (n.strip() for n in text.split(",") if n.strip()):
        if name not in SHAPES:
            raise ValueError(f"unknown shape {name!r}; known: {', '.join(SHAPES)} (or B,H,N,D).")
        out[name] = SHAPES[name]
    return out


def cuda_time_ms(fn, reps: int, warmup: int = 1, min_total_ms: float = 0.0, max_reps: int = 200) -> float:
    """Median GPU time of `reps` calls of fn (CUDA events on the current stream), after `warmup` calls.

    min_total_ms: a short call repeats until the timed calls add up to about that much (at most max_reps
    calls; never fewer than reps): ten 0.7 ms calls moved a peer's median by 28% between two runs.
    The one timer of the benchmarks (bench/*.py import it from here). statistics.median: the middle
    value, or the mean of the two middle values for an even count.
    """
    import math
    import statistics

    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []

    def timed() -> None:
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))

    for _ in range(reps):
        timed()
    if min_total_ms > 0 and times:
        wanted = min(max_reps, math.ceil(min_total_ms / max(statistics.median(times), 1e-3)))
        for _ in range(wanted - len(times)):
            timed()
    return statistics.median(times)


def _sections(args) -> list[str]:
    comfy = args.comfyui or (os.environ.get("COMFYUI_PATH") if args.all else None)
    if args.all:
        return ["attention", "e2e"] + (["comfyui"] if comfy else [])
    if args.e2e:
        return ["e2e-multigpu"] if args.gpus > 1 else ["e2e"]
    if args.comfyui:
        return ["comfyui"]
    return ["attention"]


def format_attention(rows: list[dict]) -> str:
    lines = [f"{'shape':20s} {'method':30s} {'backend':7s} {'ms':>9s} {'TOPS':>6s} {'x cuDNN':>7s} {'x SA2.2':>7s} {'rel-L2':>8s}"]
    for r in rows:
        def num(value, fmt):
            return format(value, fmt) if value is not None else "-".rjust(len(format(0.0, fmt)))
        lines.append(f"{r['shape']:20s} {r['method']:30s} {r['backend'] or '':7s} {r['ms']:9.2f} {r['tops_eq']:6.0f} "
                     f"{num(r['x_cudnn'], '7.2f')} {num(r['x_sageattn'], '7.2f')} {num(r['rel_l2_video_like'], '8.4f')}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from . import bench_report, bench_results

    if args.reps < 1:
        raise ValueError(f"--reps must be >= 1 (got {args.reps}).")
    if args.gpus < 1:
        raise ValueError(f"--gpus must be >= 1 (got {args.gpus}).")
    if args.report:
        for path in bench_report.write_all():
            print(f"wrote {path}")
        return 0
    import torch

    from .errors import require_cuda

    require_cuda("vc-attention bench")
    command = bench_results.command_line()
    produced: dict[str, list[dict]] = {}
    for section in _sections(args):
        if section == "attention":
            from .bench_attention import attention_rows

            attention, grouping = attention_rows(parse_shapes(args.shapes), args.backend, args.reps,
                                                 set(parse_shapes(args.portable_shapes)), not args.no_fidelity)
            produced.update(attention=attention, grouping=grouping)
            if not args.json:
                print(format_attention(attention))
        elif section == "e2e":
            from .bench_e2e import e2e_rows

            produced["e2e"] = e2e_rows()
        elif section == "e2e-multigpu":
            from .bench_multigpu import multigpu_rows

            if torch.cuda.device_count() < args.gpus:
                raise ValueError(f"--gpus {args.gpus} needs {args.gpus} CUDA GPUs; this machine has {torch.cuda.device_count()}.")
            produced["e2e-multigpu"] = multigpu_rows(gpus=args.gpus)
        else:
            from .bench_comfyui import comfyui_rows

            produced["comfyui"] = comfyui_rows(args.comfyui or os.environ["COMFYUI_PATH"], rounds=args.comfyui_rounds)
    if args.json:
        print(json.dumps(produced, indent=1))
    if args.save:
        env = bench_results.environment(command)
        path = bench_results.results_path(env["gpu"])
        doc = bench_results.load(path)
        for section, rows in produced.items():
            bench_results.merge(doc, section, env, rows)
        bench_results.save(path, doc)
        print(f"saved {path}")
        for written in bench_report.write_all():
            print(f"wrote {written}")
    return 0
