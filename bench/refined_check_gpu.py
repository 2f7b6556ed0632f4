"""The Hopper product library's refined fidelity kernels (the V residual's second term, the mixed encoding; sm90_launch.cu
launch_refined) in one GPU call: each against the float64 emulation of its own operands per output channel class (the
term's channels and the rest) beside the kernel without the refinement, then the public op's time (prepare included,
grouping separate) at the Wan shapes beside cuDNN and SageAttention 2.2, in one run.

  python3 bench/refined_check_gpu.py [--json OUT.json]
"""
import argparse
import datetime
import json
import sys

import torch

from vc_attention.commands.bench import cuda_time_ms
from vc_attention.kernels import backend_sm90
from vc_attention.kernels.api import vc_attention
from vc_attention.kernels.config import FIDELITY, SPEED
from vc_attention.kernels.constants import SM90_V_LO_CHANNELS
from vc_attention.kernels.operand_emulation import emulate_attention
from vc_attention.kernels.prepare_cuda import prepare_cuda

LO = SM90_V_LO_CHANNELS
CONFIGS = {"fidelity": FIDELITY, "lo": FIDELITY.with_(v_lo_channels=LO), "mixed": FIDELITY.with_(p="mixed"),
           "both": FIDELITY.with_(p="mixed", v_lo_channels=LO)}


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def binding(ops, like, config, lo=True):
    o = torch.full_like(like, float("nan"))
    backend_sm90.extension().attention(
        ops.q_q, ops.q_scale, ops.k_q, ops.k_scale, ops.v_t, ops.v_scale, ops.v_mean, None, None, None, o,
        ops.n_tokens, False, backend_sm90.vsmooth_mode(config), torch.cuda.current_stream().cuda_stream, None,
        ops.v_lo_t if lo else None, ops.v_lo_sel if lo else None, config.p == "mixed")
    return o


def accuracy(rows):
    for n, dtype in ((4097, torch.float16), (4097, torch.bfloat16), (1000, torch.float16)):
        gen = torch.Generator(device="cuda").manual_seed(n)
        q, k, v = (torch.randn(1, 2, n, 128, generator=gen, device="cuda") for _ in range(3))
        v = v * torch.linspace(0.25, 3.0, 128, device="cuda") + 0.5
        k[..., 300:420, :] *= 4.0
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
        perm = torch.argsort(torch.rand(1, 2, n, device="cuda"), dim=-1)
        for name, config in CONFIGS.items():
            ops = prepare_cuda(q, k, v, perm, config, "bhnd")
            out = binding(ops, q, config)
            emul = emulate_attention(ops, config, torch.float64, offset_block=256)
            row = dict(n=n, dtype=str(dtype), config=name, rel=rel(out, emul), floor=rel(emul.to(dtype), emul))
            if ops.v_lo_sel is not None:
                sel = torch.zeros(1, 2, 1, 128, dtype=torch.bool, device="cuda")
                sel.scatter_(-1, ops.v_lo_sel.long().unsqueeze(-2), True)
                sel = sel.expand_as(out)
                row["rel_lo_channels"] = rel(out[sel], emul[sel])
                row["rel_other_channels"] = rel(out[~sel], emul[~sel])
                row["rel_without_term"] = rel(binding(ops, q, config, lo=False), emul)
            rows.append(row)
            print({k_: (round(v_, 6) if isinstance(v_, float) else v_) for k_, v_ in row.items()}, flush=True)


def timing(rows):
    # the op runs the refinements on sm90 (backend_sm90.REFINEMENTS_DECLARED); the dropped count printed per shape shows it
    from vc_attention.kernels import api
    api.REFINEMENTS_DROPPED.clear()
    try:
        from sageattention import sageattn
    except ImportError:
        sageattn = None
    from torch.nn.attention import SDPBackend, sdpa_kernel
    for shape in ((1, 40, 75600, 128), (1, 12, 32760, 128)):
        b, h, n, d = shape
        gen = torch.Generator(device="cuda").manual_seed(1234)
        q, k, v = (torch.randn(shape, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        perm = torch.argsort(torch.rand(b, h, n, device="cuda"), dim=-1)
        iters = 10 if n > 50000 else 30
        t = {}
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            t["cudnn"] = cuda_time_ms(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v), iters, warmup=3)
        if sageattn is not None:
            t["sageattention-2.2"] = cuda_time_ms(lambda: sageattn(q, k, v, tensor_layout="HND"), iters, warmup=3)
        for name, config in {**CONFIGS, "speed": SPEED}.items():
            t[name] = cuda_time_ms(lambda: vc_attention(q, k, v, config=config, perm=perm), iters, warmup=3)
        line = "  ".join(f"{k_} {v_:.2f}" + (f" ({t['cudnn'] / v_:.2f}x/{t.get('sageattention-2.2', float('nan')) / v_:.2f}x)"
                                             if k_ not in ("cudnn",) else "") for k_, v_ in t.items())
        print(shape, line, "dropped:", dict(api.REFINEMENTS_DROPPED), flush=True)
        rows.append(dict(shape=list(shape), ms=t))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    print("GPU", torch.cuda.get_device_name(), "torch", torch.__version__, "CUDA", torch.version.cuda,
          "refinements", tuple(backend_sm90.extension().refinements()), flush=True)
    acc, times = [], []
    try:
        accuracy(acc)
    finally:
        timing(times)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, cuda=torch.version.cuda,
                               command="python3 " + " ".join(sys.argv), date=datetime.date.today().isoformat(),
                               accuracy=acc, timing=times), f, indent=1)


if __name__ == "__main__":
    main()
