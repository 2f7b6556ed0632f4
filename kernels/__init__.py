"""VC-Attention numerics: the reference emulation, the JIT-built CUDA kernels and the public op.

Imports without ComfyUI and without a GPU; CUDA code is built lazily on first use.
"""
from .config import FIDELITY, PLAIN_8BIT, SPEED, VCConfig

__all__ = ["VCConfig", "FIDELITY", "SPEED", "PLAIN_8BIT"]
