"""`vc-attention doctor`: what this machine offers the kernels, and why a backend cannot run."""
from __future__ import annotations

import argparse
import os

HELP = "Print GPU, arch, nvcc, CUDA, torch, JIT cache and each backend's availability (and why not)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print a JSON object instead of lines")


def _facts() -> dict:
    import torch

    from ..kernels import backends, jit

    facts = {"torch": torch.__version__, "torch_cuda": torch.version.cuda, "gpu": None, "arch": None}
    if torch.cuda.is_available():
        facts["gpu"] = torch.cuda.get_device_name()
        try:
            facts["arch"] = "sm_" + jit.arch_code(jit.target_arch())
        except jit.JitError as err:
            facts["arch"] = str(err)
    try:
        nvcc = jit.find_nvcc()
        facts["nvcc"] = f"{nvcc} ({'.'.join(map(str, jit.nvcc_version(nvcc)))})"
    except jit.JitError as err:
        facts["nvcc"] = str(err)
    facts["cache_dir"] = str(jit.cache_root())
    facts["env"] = {k: v for k, v in os.environ.items() if k.startswith(jit.ENV_PREFIX)}
    facts["backends"] = {name: reason or "available" for name, reason in backends.describe()}
    return facts


def run(args: argparse.Namespace) -> int:
    facts = _facts()
    if args.json:
        import json

        print(json.dumps(facts, indent=1))
        return 0
    for key in ("gpu", "arch", "torch", "torch_cuda", "nvcc", "cache_dir", "env"):
        print(f"{key:11s} {facts[key]}")
    print("backends")
    for name, state in facts["backends"].items():
        print(f"  {name:10s} {state}")
    return 0
