"""Where a short attention call's time goes: the host's Python work against the GPU's kernels.

  python3 bench/host_overhead.py [--shapes ltx-video,wan21-1.3b-480p] [--paths eager,op,operands]
                                 [--grad-modes inference,grad] [--reps 200] [--out DIR]

The published benchmark times one call between two CUDA events, so a call whose host work (checks,
backend selection, allocations, bindings) outlasts the GPU's idle start counts that host time too: at
LTX-Video (1,32,6144,64) the kernel alone ran 0.52 ms and the call 0.68 ms. Per shape and mode, in one
process on the same tensors: the event time of one call (as `vc-attention bench`), the host time of one
call (perf_counter over `reps` calls without a sync, the GPU running behind), the GPU time of the
kernels (torch.profiler, summed per kernel), and the functions that take the host's time (cProfile,
top entries by own time), under torch.inference_mode() and/or with grad mode on (the bench's way).
cuDNN SDPA is measured the same way beside it. Writes
$OUT/host_overhead.json (bench/results/ without --out).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _host_us(fn, reps: int) -> float:
    """Host microseconds per call (no sync inside; the GPU catches up after)."""
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / reps * 1e6


def _gpu_kernels_us(fn) -> dict[str, float]:
    """Microseconds per kernel name of one call (torch.profiler, CUDA activity)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    out: dict[str, float] = {}
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            out[evt.name[:90]] = out.get(evt.name[:90], 0.0) + evt.device_time
    return out


def _top_functions(fn, reps: int, top: int = 18) -> list[str]:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(reps):
        fn()
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(top)
    lines = [ln for ln in text.getvalue().splitlines() if ln.strip()]
    start = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls"))
    return lines[start:]


def main() -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from vc_attention.commands.bench import cuda_time_ms, parse_shapes
    from vc_attention.kernels import FIDELITY, SPEED, backends, grouping
    from vc_attention.kernels import api
    from vc_attention.kernels.api import vc_attention
    from vc_attention.kernels.prepared_run import prepared_run

    through_the_op = api._through_the_op
    sm90 = backends.get("sm90")
    one_call_run, operand_run = sm90.run, prepared_run(sm90.attend)

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="ltx-video,wan21-1.3b-480p")
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--paths", default="eager,op",
                        help="eager: the public call as shipped; op: the same call forced through the custom op's dispatch; "
                             "operands: the eager call with sm90's run on the operand path (prepare_cuda, then the "
                             "attention binding) instead of its one binding call (backend_sm90.run_one_call)")
    parser.add_argument("--grad-modes", default="inference",
                        help="inference: calls under torch.inference_mode() (how ComfyUI samples); grad: autograd's grad "
                             "mode on, as `vc-attention bench` times them (comma list: both in one process)")
    parser.add_argument("--out", default=os.environ.get("OUT", str(ROOT / "bench" / "results")))
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = []
    for name, (b, h, n, d) in parse_shapes(args.shapes).items():
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        perm = grouping.group_tokens(v, 64, 2).perm()

        def cudnn():
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return F.scaled_dot_product_attention(q, k, v)

        methods = {"sdpa-cudnn": cudnn}
        for mode, cfg in (("speed", SPEED), ("fidelity", FIDELITY)):
            for path in args.paths.split(","):
                methods[f"vc-{mode}-{path}"] = (lambda cfg=cfg: vc_attention(q, k, v, config=cfg, perm=perm, backend="sm90",
                                                                               perm_from_grouping=True))
        for (mname, fn), grad_mode in ((m, g) for m in methods.items() for g in args.grad_modes.split(",")):
            # the op path: what every call paid before eager calls skipped the dispatch (kernels/api.py)
            api._through_the_op = (lambda *t: True) if mname.endswith("-op") else through_the_op
            # the operand path: what every sm90 call ran before the one binding call (docs/kernel-notes.md 28)
            sm90.run = operand_run if mname.endswith("-operands") else one_call_run
            with torch.inference_mode(grad_mode == "inference"):
                event_ms = cuda_time_ms(fn, 50, warmup=3)
                host = _host_us(fn, args.reps)
                kernels = _gpu_kernels_us(fn)
                top = _top_functions(fn, args.reps) if mname.startswith("vc-") else []
            row = {"shape": name, "bhnd": [b, h, n, d], "method": mname, "grad_mode": grad_mode, "event_ms": event_ms,
                   "host_us": host, "gpu_us": sum(kernels.values()), "kernels_us": kernels, "cprofile_top": top}
            rows.append(row)
            print(f"{name:18s} {mname:20s} {grad_mode:9s} event {event_ms * 1e3:8.1f} us | host {host:7.1f} us | "
                  f"GPU kernels {row['gpu_us']:8.1f} us in {len(kernels)} kernels", flush=True)
    api._through_the_op = through_the_op
    sm90.run = one_call_run
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "command": "python3 bench/host_overhead.py " + " ".join(sys.argv[1:])}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.out, "host_overhead.json").write_text(json.dumps({"env": env, "rows": rows}, indent=1))
    for row in rows:
        if row["cprofile_top"]:
            print(f"\n{row['shape']} {row['method']} ({row['grad_mode']}): cProfile over {args.reps} calls")
            print("\n".join(row["cprofile_top"][:16]))


if __name__ == "__main__":
    main()
