"""The measurements behind `vc-attention demo`: every VC-Attention mode on a built-in video-like sample.

On a CUDA GPU each mode of the node's preset table runs through the public op
(`kernels.api.vc_attention`, the fastest capable backend) next to PyTorch SDPA: time, speed-up and
fidelity. On a CPU the reference emulation runs on a smaller sample (grouped into at most one cluster
per 128-token V block) and only fidelity is reported: emulation time says nothing about kernel speed.
Either way a PNG plot is written and its path printed.
No model weights are needed and nothing is downloaded.
"""
from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from ..kernels import backends, reference
from ..kernels.api import vc_attention
from ..kernels.config import PLAIN_8BIT, VCConfig
from ..study import videodata
from ..study.fidelity import default_clusters, output_metrics
from ..kernels.grouping import group_tokens
from ..nodes import presets
from .errors import require_cuda

# Video-like sample sizes (study/videodata.py). "gpu" is one Wan2.1-1.3B layer at 480p, 81 frames
# (21 latent frames of 30x52 patches = 32,760 tokens, 12 heads); "cpu" is the embedded sample that
# `vc-attention fidelity` also uses (3,120 tokens, 2 heads); "tiny" keeps tests fast.
SAMPLE_SIZES = {
    "gpu": dict(videodata.EMBEDDED_SIZE, T=21, H=12),
    "cpu": dict(videodata.EMBEDDED_SIZE),
    "tiny": dict(videodata.EMBEDDED_SIZE, H=1, T=1, Hgrid=8, Wgrid=16),
}
# Fidelity is measured on at most this many query rows (all keys): float64 exact attention of every
# row of the gpu sample would need about 100 GB.
FIDELITY_ROWS = 4096


@dataclass
class ModeResult:
    name: str
    backend: str
    rel_l2: float
    psnr_db: float
    time_ms: Optional[float] = None  # GPU only
    grouping_ms: Optional[float] = None  # GPU only: one k-means + permutation (inside the window)


def run(args: argparse.Namespace, out: Path) -> int:
    device = _pick_device(args.device)
    size = args.size or ("gpu" if device.type == "cuda" else "cpu")
    on_gpu = device.type == "cuda"
    if not on_gpu:
        print("No CUDA GPU in use: running the reference EMULATION on a small sample. It shows the "
              "fidelity of each mode; its run time is not a speed measurement, so no times are shown.")

    print(f"Generating the built-in video-like sample ({size} size) ...", flush=True)
    q, k, v = _sample(size, device)
    b, h, n, d = q.shape
    print(f"Sample: video-like attention, {size} size: B={b} H={h} N={n} D={d}, {q.dtype}, {device}.")
    rows = torch.arange(n, device=device)
    if n > FIDELITY_ROWS:
        rows = torch.randperm(n, generator=torch.Generator().manual_seed(0))[:FIDELITY_ROWS].sort().values.to(device)
        print(f"Fidelity is measured on {FIDELITY_ROWS} seeded query rows of {n} (all keys).")
    exact = _exact_rows(q, k, v, rows)

    results = []
    sdpa = None
    if on_gpu:
        print("Choosing backends (a first run compiles the CUDA kernels and prints its progress) ...", flush=True)
        sdpa = _measure_sdpa(q, k, v, exact, rows, args.repeats)
    modes = _modes()
    for i, (name, config, preset_clusters, iters) in enumerate(modes, 1):
        # the CPU sample is small: at most one cluster per V block (study/fidelity.py says why)
        clusters = preset_clusters if on_gpu else default_clusters(n)
        grouping = f", {clusters} clusters, {iters} k-means iterations" if config.needs_grouping else ""
        print(f"[{i}/{len(modes)}] {name} ({config.tag}{grouping}) ...", flush=True)
        results.append(_run_mode(name, config, clusters, iters, q, k, v, exact, rows, on_gpu, args.repeats))

    _print_table(results, sdpa)
    _plot(results, sdpa, on_gpu, out, f"N={n}, H={h}, D={d}, {device.type}")
    print(f"Plot written to {out}")
    return 0


def _pick_device(choice: str) -> torch.device:
    if choice == "cuda":
        require_cuda("vc-attention demo --device cuda")
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(choice)


def _sample(size: str, device: torch.device):
    """(q, k, v) as (B, H, N, D): bf16 on a GPU (what video models run), float32 on the CPU."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    return videodata.video_like_qkv(**SAMPLE_SIZES[size], dtype=dtype, device=device)


def _modes() -> list[tuple[str, VCConfig, int, int]]:
    """(mode, config, clusters, kmeans_iters) for every preset of the node's own table, after the
    plain 8-bit baseline (SageAttention2-style per-channel FP8 V, no V-Smooth) that shows what
    V-Smooth adds."""
    out = [("plain-8bit", PLAIN_8BIT, 0, 0)]
    for name, widgets in presets.PRESETS.items():
        config = presets.config_from_widgets(widgets)
        out.append((name, config, int(widgets["clusters"]), int(widgets["kmeans_iters"])))
    return out


def _grouping(v: torch.Tensor, config: VCConfig, clusters: int, iters: int) -> Optional[torch.Tensor]:
    return group_tokens(v, clusters, iters).perm() if config.needs_grouping else None


def _exact_rows(q, k, v, rows: torch.Tensor) -> torch.Tensor:
    """float64 exact attention of the query rows `rows` against every key, one head at a time."""
    return torch.cat([reference.exact_attention(q[:, h : h + 1, rows], k[:, h : h + 1], v[:, h : h + 1])
                      for h in range(q.shape[1])], dim=1)


def _run_mode(name, config, clusters, iters, q, k, v, exact, rows, on_gpu, repeats) -> ModeResult:
    chosen = backends.select(q, config, "bhnd", kv=(k, v))
    grouping_ms = _time_ms(lambda: _grouping(v, config, clusters, iters), 1) if on_gpu else None
    perm = _grouping(v, config, clusters, iters)
    out = vc_attention(q, k, v, config=config, perm=perm, backend=chosen, perm_from_grouping=True)
    rel, psnr = _fidelity(out[:, :, rows], exact)
    time_ms = None
    if on_gpu:
        if chosen.slow:
            print(f"  note: no fast backend can run {name} on this GPU; its time is the slow emulation's (timed once).")
        time_ms = _time_ms(lambda: vc_attention(q, k, v, config=config, perm=perm, backend=chosen, perm_from_grouping=True), 1 if chosen.slow else repeats)
    return ModeResult(name, chosen.name, rel, psnr, time_ms, grouping_ms)


def _measure_sdpa(q, k, v, exact, rows, repeats) -> ModeResult:
    print("[0] PyTorch SDPA (the baseline) ...", flush=True)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    rel, psnr = _fidelity(sdpa(q, k, v)[:, :, rows], exact)
    return ModeResult("sdpa", "torch", rel, psnr, _time_ms(lambda: sdpa(q, k, v), repeats))


def _time_ms(fn, repeats: int) -> float:
    """Median wall time of `repeats` calls after one warm-up, synchronized (CUDA)."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[len(times) // 2]


def _fidelity(out: torch.Tensor, exact: torch.Tensor) -> tuple[float, float]:
    """(relative L2 error, PSNR in dB) against float64 exact attention (study/fidelity.py)."""
    metrics = output_metrics(out, exact)
    return metrics["rel_l2"], metrics["psnr_db"]


def _print_table(results: list[ModeResult], sdpa: Optional[ModeResult]) -> None:
    timed = sdpa is not None
    header = f"{'mode':<10} {'backend':<10} {'rel-L2':>9} {'PSNR dB':>8}"
    if timed:
        header += f" {'time ms':>9} {'speed-up':>9} {'k-means ms':>10}"
    print(header)
    print("-" * len(header))
    for r in ([sdpa] if timed else []) + results:
        line = f"{r.name:<10} {r.backend:<10} {r.rel_l2:>9.2e} {r.psnr_db:>8.2f}"
        if timed:
            speedup = sdpa.time_ms / r.time_ms
            group = "" if r.grouping_ms is None else f"{r.grouping_ms:>10.2f}"
            line += f" {r.time_ms:>9.3f} {speedup:>8.2f}x {group}"
        print(line)


def _plot(results, sdpa, on_gpu: bool, path: Path, subtitle: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only: never needs a display
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    if on_gpu:
        for r in [sdpa] + results:
            ax.scatter(sdpa.time_ms / r.time_ms, r.psnr_db, s=60)
            ax.annotate(r.name, (sdpa.time_ms / r.time_ms, r.psnr_db), textcoords="offset points", xytext=(6, 4))
        ax.set_xlabel("speed-up over PyTorch SDPA (x)")
        ax.set_title(f"VC-Attention: fidelity vs speed ({subtitle})")
    else:
        psnrs = [r.psnr_db for r in results]
        bars = ax.bar([r.name for r in results], psnrs, color=["#999999"] + ["#4c72b0"] * (len(results) - 1))
        ax.bar_label(bars, fmt="%.2f dB")
        ax.set_ylim(min(psnrs) - 3.0, max(psnrs) + 1.5)
        ax.set_title(f"VC-Attention fidelity per mode ({subtitle})\n"
                     "CPU reference emulation: fidelity only - emulation time is not kernel speed",
                     fontsize=10)
    ax.set_ylabel("PSNR vs exact float64 attention (dB)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
