"""The clamp bound is in the product builds (SASS, compile-only): speed mode's unclamped encode path.

VC_EXPCAST_CLAMP_BOUND (sm90) and VC_MMA_CLAMP_BOUND (portable) became the defaults in session 25 (docs/kernel-notes.md
section 35: sm90 speed -5.9% at Wan2.2-14B, portable speed -5.5% at head dim 64). A build that silently lost them
would still be correct, only slower, so nothing but the machine code shows it: the loop trip along the path where the
bound's vote passed (`bench/sass_loop_mix.py --votes-pass`) is shorter than the previous check's (`=0`) by the row
minima it no longer computes (sm90 711 against 788 instructions, portable sm_89 head dim 64 642 against 720), and the
speed kernels only change. Disassembled with nvdisasm (the nvidia-cuda-nvdisasm wheel, a test dependency).
"""
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vc_attention.kernels import backend_sm90, jit, mma_variants

_SPEC = importlib.util.spec_from_file_location("sass_loop_mix", Path(__file__).resolve().parents[1] / "bench" / "sass_loop_mix.py")
sass_loop_mix = importlib.util.module_from_spec(_SPEC)
sys.modules.setdefault("sass_loop_mix", sass_loop_mix)
_SPEC.loader.exec_module(sass_loop_mix)


def nvdisasm() -> str | None:
    """nvdisasm on PATH, else the one the nvidia-cuda-nvdisasm wheel installs (nvidia/cu*/bin)."""
    found = shutil.which("nvdisasm")
    if found:
        return found
    try:
        import nvidia  # namespace package of NVIDIA's wheels
    except ImportError:
        return None
    for root in getattr(nvidia, "__path__", []):
        for candidate in sorted(Path(root).glob("cu*/bin/nvdisasm")) + sorted(Path(root).glob("cuda_nvdisasm/bin/nvdisasm")):
            return str(candidate)
    return None


pytestmark = [pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed"),
              pytest.mark.skipif(nvdisasm() is None, reason="nvdisasm not installed (pip install nvidia-cuda-nvdisasm)")]


def loop_trips(tmp_path, source: Path, arch: str, flags, any_back_branch: bool) -> dict[str, int]:
    """kernel name -> instructions in one trip of its hot loop, the path where every VOTE.ALL passed."""
    cubin = tmp_path / f"{source.stem}-{arch}-{len(flags)}.cubin"
    build = subprocess.run(jit.nvcc_compile_only_command(source, arch, cubin, extra_flags=tuple(flags)),
                           capture_output=True, text=True, check=False)
    assert build.returncode == 0, build.stderr[-3000:]
    sass = subprocess.run([nvdisasm(), "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
    return {name: len(sass_loop_mix.hot_loop(rows, any_back_branch=any_back_branch, votes_pass=True))
            for name, rows in sass_loop_mix.functions(sass).items() if "kernel" in name}


def test_the_hopper_speed_loop_runs_the_bound_in_the_product_build(tmp_path):
    source = jit.CSRC_DIR / "sm90_launch.cu"
    product = loop_trips(tmp_path, source, "9.0a", backend_sm90.CUDA_FLAGS, False)
    previous = loop_trips(tmp_path, source, "9.0a", (*backend_sm90.CUDA_FLAGS, "-DVC_EXPCAST_CLAMP_BOUND=0"), False)
    assert set(product) == set(previous)
    # the speed loop of head dim 128 (ExpCast + V-Smooth, one mean per step, no lanes): bf16 and fp16 outputs
    speed = [k for k in product if "ILi128ELb1ELb1E" in k and k.endswith("Li4ELb0ELb1ELb0ELb0EEEv14CUtensorMap_stS3_S3_S3_NS0_6ParamsE")]
    assert len(speed) == 2, sorted(product)
    for k in speed:  # 711 against 788 when counted (kernel-notes 33): the row minima and their vote are gone
        assert product[k] <= previous[k] - 50, (k, product[k], previous[k])
    # fidelity's exp2 loops take no clamp: the same trips in both builds; its refined kernels with the mixed encoding
    # (vc_attention_sm90_kernel_lo_chord<..., VLO, CHORD > 0>) encode part of every step with the chord, which does
    chord = [k for k in product if re.search(r"kernel_lo_chordILi128ELb0ELb1E.*ELi\d+ELi[1-9]EEEv", k)]
    fidelity = [k for k in product if "ILi128ELb0ELb1E" in k and k not in chord]
    assert fidelity and all(product[k] == previous[k] for k in fidelity), {k: (product[k], previous[k]) for k in fidelity}
    assert len(chord) == 4 and all(product[k] < previous[k] for k in chord), {k: (product[k], previous[k]) for k in chord}


def test_the_portable_speed_chunk_runs_the_bound_in_the_default_build(tmp_path):
    source = jit.CSRC_DIR / "attn_mma_d64.cu"
    flags = mma_variants.flags(mma_variants.default_variant("8.9"))
    product = loop_trips(tmp_path, source, "8.9", flags, True)
    previous = loop_trips(tmp_path, source, "8.9", (*flags, "-DVC_MMA_CLAMP_BOUND=0"), True)
    assert set(product) == set(previous)
    # <D, FP8 QK, ExpCast, V-Smooth, lanes>: the INT8 ExpCast kernels (speed and its per-channel twin)
    speed = [k for k in product if "ILi64ELb0ELb1E" in k]
    assert len(speed) == 2, sorted(product)
    for k in speed:  # 642 against 720 with V-Smooth (kernel-notes 33)
        assert product[k] <= previous[k] - 40, (k, product[k], previous[k])
    others = [k for k in product if k not in speed]
    assert others and all(product[k] == previous[k] for k in others), {k: (product[k], previous[k]) for k in others}
