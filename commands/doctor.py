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
        else:
            try:
                facts["mma_build"] = _mma_build()
            except ValueError as err:  # a VC_ATTENTION_MMA_PV_ACCUM the backend refuses: say so
                facts["mma_build"] = str(err)
    try:
        nvcc = jit.find_nvcc()
        facts["nvcc"] = f"{nvcc} ({'.'.join(map(str, jit.nvcc_version(nvcc)))})"
    except jit.JitError as err:
        facts["nvcc"] = str(err)
    facts["cache_dir"] = str(jit.cache_root())
    facts["env"] = {k: v for k, v in os.environ.items() if k.startswith(jit.ENV_PREFIX)}
    facts["backends"] = {name: reason or "available" for name, reason in backends.describe()}
    facts["fix"] = _fixes(facts)
    return facts


def _mma_build() -> str:
    """The portable backend's build here and its PV accumulation (fp32+fp16 on GeForce Ada / Blackwell,
    VC_ATTENTION_MMA_PV_ACCUM overrides it)."""
    from ..kernels import backend_mma, jit, mma_variants

    arch = jit.target_arch()
    accum = backend_mma.pv_accum(arch)
    return f"{mma_variants.default_variant(arch, accum)} (PV accumulation {accum})"


def _fixes(facts: dict) -> list[str]:
    """What to do so that the kernels can run here (empty when every backend is available)."""
    import torch

    from ..kernels import jit
    from .errors import cuda_unavailable_remedy

    if all(state == "available" for state in facts["backends"].values()):
        return []
    fixes = []
    remedy = cuda_unavailable_remedy()
    if remedy:
        fixes.append(remedy[0].upper() + remedy[1:] + ".")
    elif torch.cuda.get_device_capability() < jit.MIN_CAPABILITY:
        fixes.append(f"This GPU ({facts['arch']}) has no FP8 tensor cores: the kernels need sm_89 or newer (Ada, "
                     "Hopper, Blackwell). The node runs the model's own attention here; `vc-attention fidelity` "
                     "shows the numerics through the emulation.")
    if not jit.env_flag("DISABLE_JIT"):
        try:
            jit.find_nvcc()
        except jit.JitError as err:
            fixes.append(str(err)[0].upper() + str(err)[1:])
    if not fixes:
        fixes.append("See each backend's reason above; `vc-attention build --verbose` shows a build's full output.")
    return fixes


def run(args: argparse.Namespace) -> int:
    facts = _facts()
    if args.json:
        import json

        print(json.dumps(facts, indent=1))
        return 0
    for key in ("gpu", "arch", "mma_build", "torch", "torch_cuda", "nvcc", "cache_dir", "env"):
        if key in facts:
            print(f"{key:11s} {facts[key]}")
    print("backends")
    for name, state in facts["backends"].items():
        print(f"  {name:10s} {state}")
    print("fix" if facts["fix"] else "fix        nothing: every backend can run here")
    for line in facts["fix"]:
        print(f"  - {line}")
    return 0
