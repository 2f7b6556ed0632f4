"""One rank of a Ulysses context-parallel run of diffusers' Wan transformer; launched by torchrun.

    torchrun --nproc_per_node 2 -m vc_attention.commands.cp_worker --out DIR [--device cuda --model wan14b]

Every rank builds the same random-weight WanTransformer3DModel (seeded) and the same inputs, then
times one denoising step per method ("native": diffusers' SDPA backend, "vc": our registered
backend) on its own GPU (the 1-GPU numbers), enables diffusers' context parallelism with
ContextParallelConfig(ulysses_degree=world size) and times the same steps again on all GPUs. It writes
OUT/rank{r}.json: forward times, relative L2 of every output against native on one GPU and of each
method's parallel output against its own 1-GPU output, the backend's stats and the kernels that ran.
With --ring-check it then builds a tiny model with ring_degree=world size and records the error
our backend raises. commands/bench_multigpu.py turns rank 0's file into benchmark rows; the CPU test
(gloo, tiny model) and the 2-GPU test (NCCL) read the files of every rank.

VC forwards are the steps of one run (VCDiffusersBackend.end_step after each) with grouping window 0:
step 0 groups (before any step callback nothing is cached), step 1 groups once more, now cached, and
the timed steps reuse that grouping, as in a sampling run after the window; the grouping step's time
is reported beside them.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

from ..integrations.diffusers_backend import VCDiffusersConfig, register_diffusers_backend
from ..kernels.api import BACKEND_CALLS

# A Wan-architecture transformer small enough for CPU tests (heads and tokens divisible by 2 ranks).
TINY_WAN = dict(patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=32, in_channels=4, out_channels=4,
                text_dim=32, freq_dim=32, ffn_dim=64, num_layers=2, cross_attn_norm=True,
                qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=64)


def _give_cp_logger_warning_once() -> None:
    """diffusers 0.42's context-parallel hook warns through `logger.warning_once` when an input has
    other dims than its plan expects (Wan's plan expects a 2-D per-token timestep; Wan 2.1 passes a 1-D
    one). Only transformers defines that method (on logging.Logger, when imported); without it the
    warning raises AttributeError inside the forward. This worker is its own process, so it gives that
    one logger the method instead of importing transformers."""
    import functools

    from diffusers.hooks import context_parallel

    log = context_parallel.logger
    if not hasattr(log, "warning_once"):
        log.warning_once = functools.lru_cache(maxsize=None)(log.warning)


def _build(model: str, layers: int, device: str, dtype: torch.dtype):
    if model == "wan14b":
        from .bench_e2e import build_model

        return build_model(layers, device=device, dtype=dtype)
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    with torch.device(device):
        return WanTransformer3DModel(**TINY_WAN).to(dtype).eval()


def _inputs(model, frames: int, height: int, width: int, text_tokens: int, device: str, dtype: torch.dtype):
    g = torch.Generator().manual_seed(1)  # on the CPU: every rank and device draws the same numbers
    t = (frames - 1) // 4 + 1
    latents = torch.randn(1, model.config.in_channels, t, height // 8, width // 8, generator=g, dtype=dtype)
    text = torch.randn(1, text_tokens, model.config.text_dim, generator=g, dtype=dtype)
    return latents.to(device), torch.tensor([500], device=device), text.to(device)


def _forward(model, inputs, sync) -> tuple[torch.Tensor, float]:
    with torch.no_grad():
        sync()
        t0 = time.perf_counter()
        out = model(hidden_states=inputs[0], timestep=inputs[1], encoder_hidden_states=inputs[2], return_dict=False)[0]
        sync()
    return out.float(), (time.perf_counter() - t0) * 1e3


def _timed(model, inputs, sync, method: str, vc, repeats: int) -> dict:
    """Median forward time of `method` and its last output (VC: after the grouping, see the docstring)."""
    model.set_attention_backend(method if method == "native" else "vc_attention")
    extra = {}
    if method == "native":
        _forward(model, inputs, sync)  # warm-up (allocator, cuDNN plans)
        runs = [_forward(model, inputs, sync) for _ in range(repeats)]
    else:
        vc.reset()
        steps = 2 + repeats
        _, extra["grouping_forward_ms"] = _forward(model, inputs, sync)  # step 0: grouping, nothing cached
        vc.end_step(0, steps)
        _forward(model, inputs, sync)  # step 1: past the window, grouped once and cached
        vc.end_step(1, steps)
        runs = []
        for step in range(2, steps):
            runs.append(_forward(model, inputs, sync))
            vc.end_step(step, steps)
    return dict(extra, forward_ms=statistics.median(ms for _, ms in runs), out=runs[-1][0])


def _ring_error(world: int, device: str, dtype: torch.dtype, sync) -> str | None:
    """The error our backend raises under ring attention (None if it ran), on a tiny model."""
    from diffusers import ContextParallelConfig

    model = _build("tiny", 0, device, dtype)
    model.set_attention_backend("vc_attention")
    model.enable_parallelism(config=ContextParallelConfig(ring_degree=world))
    try:
        _forward(model, _inputs(model, 9, 128, 128, 8, device, dtype), sync)
    except ValueError as err:
        return str(err)
    return None


def _rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for rank{r}.json")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--model", default="tiny", choices=("tiny", "wan14b"))
    parser.add_argument("--layers", type=int, default=40, help="wan14b: transformer blocks")
    parser.add_argument("--frames", type=int, default=9)
    parser.add_argument("--height", type=int, default=128)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--text-tokens", type=int, default=8)
    parser.add_argument("--kernel", default="auto", help="VCDiffusersConfig.backend (reference on CPU)")
    parser.add_argument("--mode", default="balanced")
    parser.add_argument("--clusters", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--ring-check", action="store_true",
                        help="also check, on a tiny model, that ring attention is refused")
    args = parser.parse_args(argv)

    from diffusers import ContextParallelConfig

    _give_cp_logger_warning_once()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.device == "cuda":
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
        device, dtype, sync = f"cuda:{rank}", torch.bfloat16, torch.cuda.synchronize
    else:
        dist.init_process_group("gloo")
        # diffusers places each rank on device `rank % torch.accelerator.device_count()`, which divides
        # by zero on a CPU-only torch; the one device a CPU rank has is the CPU
        torch.accelerator.device_count = lambda: 1
        device, dtype, sync = "cpu", torch.float32, lambda: None

    vc = register_diffusers_backend(VCDiffusersConfig(mode=args.mode, backend=args.kernel, clusters=args.clusters,
                                                     grouping_window=0.0))
    model = _build(args.model, args.layers, device, dtype)
    inputs = _inputs(model, args.frames, args.height, args.width, args.text_tokens, device, dtype)
    result: dict = {"rank": rank, "world": world, "tokens": inputs[0][0, 0].numel() // 4,
                    "device": torch.cuda.get_device_name(rank) if args.device == "cuda" else "cpu"}
    single = {m: _timed(model, inputs, sync, m, vc, args.repeats) for m in ("native", "vc")}
    model.set_attention_backend("vc_attention")  # enable_parallelism checks the backend in place
    model.enable_parallelism(config=ContextParallelConfig(ulysses_degree=world))
    parallel = {m: _timed(model, inputs, sync, m, vc, args.repeats) for m in ("native", "vc")}
    base = single["native"]["out"]
    rows = []
    for gpus, runs in ((1, single), (world, parallel)):
        for method, run in runs.items():
            rows.append({"method": method, "gpus": gpus, "forward_ms": run["forward_ms"],
                         "grouping_forward_ms": run.get("grouping_forward_ms"),
                         "rel_l2_vs_native_1gpu": _rel_l2(run["out"], base),
                         "rel_l2_vs_own_1gpu": _rel_l2(run["out"], single[method]["out"])})
    result["runs"] = rows
    if args.ring_check:
        result["ring_error"] = _ring_error(world, device, dtype, sync)
    result.update(kernel_calls=dict(vc.stats.kernel_calls), fallbacks=dict(vc.stats.fallbacks),
                  ulysses_calls=vc.stats.ulysses_calls, backend_calls=dict(BACKEND_CALLS))
    Path(args.out, f"rank{rank}.json").write_text(json.dumps(result, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
