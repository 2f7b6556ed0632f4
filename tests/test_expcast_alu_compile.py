"""The ALU-only ExpCast build (VC_EXPCAST_ALU=1, kernels/csrc/p_encoding.cuh) issues no conversion in
the speed path: nvcc -ptx of the portable kernel for sm_89 and sm_120a, per kernel function. The same
check on the default build finds the E4M3 cast in the speed kernels, so it can fail. (sm_90a: the
`alu` / `alu3` entries of bench/sm90_variants.sh, compiled by tests/test_sm90_compile.py.)"""
import os
import re
import shutil
import subprocess

import pytest

from vc_attention.kernels import jit

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("nvcc") is None and not os.environ.get("CUDA_HOME"), reason="nvcc not installed"),
]

SOURCE = jit.CSRC_DIR / "attn_mma_d128.cu"
# attn_mma_kernel<D, kQkFp8, kExpCast, kVSmooth>: the mangled name spells the bools as Lb0 / Lb1
SPEED_KERNEL = re.compile(r"attn_mma_kernelILi\d+ELb[01]ELb1ELb[01]E")
CONVERSIONS = {"E4M3 cast": r"cvt\.[\w.]*e4m3", "float to int": r"cvt\.rni", "MUFU exp2": r"ex2\.approx"}


def _speed_kernel_ptx(tmp_path, arch: str, flags: list[str]) -> dict[str, str]:
    out = tmp_path / f"{arch}.ptx"
    cmd = [jit.find_nvcc(), "-ptx", "-std=c++17", *jit.BASE_CUDA_FLAGS, *flags, *jit.gencode_flags(arch),
           f"-I{jit.CSRC_DIR}", "-o", str(out), str(SOURCE)]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    functions = re.split(r"(?=\.visible \.entry )", out.read_text())[1:]
    named = {re.match(r"\.visible \.entry (\w+)", f).group(1): f for f in functions}
    speed = {name: body for name, body in named.items() if SPEED_KERNEL.search(name)}
    assert len(speed) == len(named) // 2 >= 2, sorted(named)
    return speed


@pytest.mark.parametrize("arch", ["8.9", "12.0a"])
def test_alu_build_has_no_conversion_in_the_speed_kernels(tmp_path, arch):
    for name, body in _speed_kernel_ptx(tmp_path, arch, ["-DVC_EXPCAST_ALU=1"]).items():
        for what, pattern in CONVERSIONS.items():
            assert not re.search(pattern, body), f"{what} in {name}"
        # one saturated argument per element and its chord lines' maxima are there
        assert len(re.findall(r"fma\.rn\.sat\.f32", body)) >= 64 and re.search(r"max\.f32", body), name


def test_default_build_casts_in_the_speed_kernels(tmp_path):
    for name, body in _speed_kernel_ptx(tmp_path, "8.9", []).items():
        assert re.search(CONVERSIONS["E4M3 cast"], body), name
