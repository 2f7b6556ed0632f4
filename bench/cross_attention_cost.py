"""What the text cross-attention of a video DiT costs per call, by method (the node leaves it to the
model's attention; SageAttention 2.2 under `--use-sage-attention` runs it too).

  python3 bench/cross_attention_cost.py [--reps 30]

Shapes: Wan's cross-attention, 512 text tokens against the video tokens, at the ComfyUI sampling
bench's Wan2.1-1.3B widths with CFG batched (B2 H12, 32,760 queries) and Wan2.2-14B 720p (B2 H40,
75,600 queries); random bf16 in ComfyUI's (B, N, H*D) layout, as its attention functions get them.
Methods: torch SDPA as ComfyUI's attention_pytorch calls it (view, transpose, SDPA, transpose back
and reshape: the copies included), SDPA per backend (flash, cuDNN, efficient) on (B,H,N,D) views,
and SageAttention 2.2's `sageattn` (NHD layout, when installed). CUDA events, median of --reps after
a warm-up. Writes cross_attention_cost.json to $OUT (default bench/results).
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F

from vc_attention.commands.bench import cuda_time_ms

SHAPES = {"wan21-1.3b-comfyui-cfg": (2, 12, 32760, 512, 128), "wan22-14b-720p-cfg": (2, 40, 75600, 512, 128)}


def comfy_pytorch_attention(q, k, v, heads):
    """ComfyUI's attention_pytorch for (B, N, H*D) inputs: view, transpose, SDPA, transpose back."""
    b, _, inner = q.shape
    d = inner // heads
    q, k, v = (t.view(b, -1, heads, d).transpose(1, 2) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v)
    return out.transpose(1, 2).reshape(b, -1, heads * d)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()
    try:
        from sageattention import sageattn
    except ImportError:
        sageattn = None
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rows = []
    for name, (b, h, nq, nk, d) in SHAPES.items():
        gen = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(b, nq, h * d, generator=gen, device="cuda").to(torch.bfloat16)
        k, v = (torch.randn(b, nk, h * d, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(2))
        methods = {"comfyui attention_pytorch (SDPA default)": lambda: comfy_pytorch_attention(q, k, v, h)}
        qh, kh, vh = (t.view(b, -1, h, d).transpose(1, 2) for t in (q, k, v))
        for label, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                               ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
            def run(backend=backend):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(qh, kh, vh)
            methods[f"SDPA {label} (BHND views)"] = run
        if sageattn is not None:
            methods["SageAttention 2.2 sageattn (NHD)"] = lambda: sageattn(
                q.view(b, nq, h, d), k.view(b, nk, h, d), v.view(b, nk, h, d), tensor_layout="NHD")
        for method, fn in methods.items():
            try:
                ms = cuda_time_ms(fn, reps=args.reps)
            except RuntimeError as err:  # a backend that does not take this shape says so
                print(f"{name:28s} {method:42s} not run: {str(err).splitlines()[0][:80]}")
                continue
            print(f"{name:28s} {method:42s} {ms:8.3f} ms")
            rows.append({"shape": name, "bhnqnkd": [b, h, nq, nk, d], "method": method, "ms": ms})
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "command": "python3 bench/cross_attention_cost.py"}
    out = Path(os.environ.get("OUT", "bench/results"), "cross_attention_cost.json")
    out.write_text(json.dumps({"env": env, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
