"""Where a ComfyUI sampling run's GPU time goes (imported by comfyui_sampling_worker.py when the
environment names VC_COMFYUI_PROFILE=OUT.json; driven by bench/comfyui_profile.py).

One extra sampling run, after the timed one, under torch.profiler (CUDA activity only): per kernel
name the total time and the launch count, grouped into attention kinds, and the GPU's busy time (the
union of the kernel intervals) against the wall time, so that a gap between two methods' runs can be
split into kernels that differ and time the GPU spent waiting for the host.
"""
from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path

# kernel name fragments -> kind (first match wins); everything else is the model's own work
KINDS = (
    ("vc::prepare", "ours: prepare"),
    ("vc::group", "ours: grouping"),
    ("vc::", "ours: attention"),
    ("vc_sm90::", "ours: attention"),
    ("vc_mma", "ours: attention"),
    ("qk_int8", "sage: attention"),
    ("sageattn", "sage: attention"),
    ("quant", "sage: quantize"),
    ("mean_scale", "sage: quantize"),
    ("transposepad", "sage: quantize"),
    ("cudnn", "sdpa: cudnn"),  # before "flash": cuDNN's SDPA kernels are named ..._sdpa_sm90_flash_fprop_...
    ("fmha", "sdpa: cudnn"),
    ("flash", "sdpa: flash"),
    ("gemm", "gemm"),
    ("sm90_xmma", "gemm"),
    ("nvjet", "gemm"),
)


def kind_of(name: str) -> str:
    low = name.lower()
    return next((kind for fragment, kind in KINDS if fragment.lower() in low), "other")


def busy_us(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals (kernels on several streams may overlap)."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def profile_run(run, out_path: str, torch) -> dict:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    wall_us = (time.perf_counter() - start) * 1e6
    per_name: dict[str, list] = defaultdict(lambda: [0.0, 0])
    intervals = []
    for event in prof.events():
        if event.device_type != DeviceType.CUDA:
            continue
        a, b = event.time_range.start, event.time_range.end
        intervals.append((a, b))
        per_name[event.name][0] += b - a
        per_name[event.name][1] += 1
    per_kind: dict[str, float] = defaultdict(float)
    for name, (us, _) in per_name.items():
        per_kind[kind_of(name)] += us
    top = sorted(per_name.items(), key=lambda item: -item[1][0])[:30]
    summary = {
        "wall_ms": wall_us / 1e3,
        "gpu_busy_ms": busy_us(intervals) / 1e3,
        "kernels": len(intervals),
        "kinds_ms": {kind: us / 1e3 for kind, us in sorted(per_kind.items(), key=lambda kv: -kv[1])},
        "top": [{"name": name[:160], "ms": us / 1e3, "count": count, "kind": kind_of(name)} for name, (us, count) in top],
    }
    Path(out_path).write_text(json.dumps(summary, indent=1))
    return summary
