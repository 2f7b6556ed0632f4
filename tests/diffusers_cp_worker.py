"""One rank of the Ulysses context-parallel check, launched by torchrun (2 processes).

Each rank builds the same random-weight WanTransformer3DModel (seeded), runs one forward on its own
with the "vc_attention" backend (the single-process output), then enables diffusers' context
parallelism with ContextParallelConfig(ulysses_degree=world size) and runs the same forward again.
It saves both outputs, the backend's stats and the kernel backends that ran to OUT/rank{r}.pt;
the test (tests/test_diffusers_backend.py on CPU with gloo, tests/test_diffusers_multigpu.py on
GPUs with NCCL) compares them. With --ring it instead builds a ring_degree=world size model and
records the error our backend raises.

    torchrun --nproc_per_node 2 tests/diffusers_cp_worker.py --out DIR [--device cuda --model wan14b]
"""
import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

TINY = dict(patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=32, in_channels=4, out_channels=4,
            text_dim=32, freq_dim=32, ffn_dim=64, num_layers=2, cross_attn_norm=True,
            qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=64)


def _build(args, device, dtype):
    if args.model == "tiny":
        from diffusers import WanTransformer3DModel

        torch.manual_seed(0)
        with torch.device(device):
            model = WanTransformer3DModel(**TINY)
        return model.to(dtype).eval()
    from vc_attention.commands.bench_e2e import build_model

    return build_model(args.layers, device=device, dtype=dtype)


def _inputs(args, device, dtype, channels, text_dim):
    g = torch.Generator(device="cpu").manual_seed(1)
    t = (args.frames - 1) // 4 + 1
    latents = torch.randn(1, channels, t, args.height // 8, args.width // 8, generator=g, dtype=dtype)
    text = torch.randn(1, 512 if args.model == "wan14b" else 8, text_dim, generator=g, dtype=dtype)
    return latents.to(device), torch.tensor([500], device=device), text.to(device)


def _forward(model, inputs, sync):
    with torch.no_grad():
        sync()
        t0 = time.perf_counter()
        out = model(hidden_states=inputs[0], timestep=inputs[1], encoder_hidden_states=inputs[2], return_dict=False)[0]
        sync()
    return out, (time.perf_counter() - t0) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--model", default="tiny", choices=("tiny", "wan14b"))
    parser.add_argument("--kernel", default="reference", help="VCDiffusersConfig.backend")
    parser.add_argument("--mode", default="balanced")
    parser.add_argument("--clusters", type=int, default=None)
    parser.add_argument("--layers", type=int, default=40)
    parser.add_argument("--frames", type=int, default=9)
    parser.add_argument("--height", type=int, default=128)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--ring", action="store_true", help="check that ring attention is refused instead")
    args = parser.parse_args()

    from diffusers import ContextParallelConfig

    from vc_attention.integrations.diffusers_backend import VCDiffusersConfig, register_diffusers_backend
    from vc_attention.kernels.api import BACKEND_CALLS

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    if args.device == "cuda":
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
        device, dtype, sync = f"cuda:{rank}", torch.bfloat16, torch.cuda.synchronize
    else:
        dist.init_process_group("gloo")
        # diffusers places each rank on device `rank % torch.accelerator.device_count()`, which divides by
        # zero on a CPU-only torch; one "device" (the CPU) is what a CPU rank has
        torch.accelerator.device_count = lambda: 1
        device, dtype, sync = "cpu", torch.float32, lambda: None

    vc = register_diffusers_backend(VCDiffusersConfig(mode=args.mode, backend=args.kernel, clusters=args.clusters))
    model = _build(args, device, dtype)
    model.set_attention_backend("vc_attention")
    inputs = _inputs(args, device, dtype, model.config.in_channels, model.config.text_dim)
    result = {"rank": rank, "world": world}
    if args.ring:
        model.enable_parallelism(config=ContextParallelConfig(ring_degree=world))
        try:
            _forward(model, inputs, sync)
            result["ring_error"] = None
        except ValueError as err:
            result["ring_error"] = str(err)
    else:
        single, result["single_ms"] = _forward(model, inputs, sync)
        _forward(model, inputs, sync)  # second single forward: warm timings below
        single, result["single_ms"] = _forward(model, inputs, sync)
        vc.reset()
        model.enable_parallelism(config=ContextParallelConfig(ulysses_degree=world))
        _forward(model, inputs, sync)
        parallel, result["parallel_ms"] = _forward(model, inputs, sync)
        result.update(single=single.float().cpu(), parallel=parallel.float().cpu())
    result["kernel_calls"] = dict(vc.stats.kernel_calls)
    result["fallbacks"] = dict(vc.stats.fallbacks)
    result["ulysses_calls"] = vc.stats.ulysses_calls
    result["backend_calls"] = dict(BACKEND_CALLS)
    torch.save(result, Path(args.out) / f"rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
