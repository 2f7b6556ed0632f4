"""The portable kernel's VC_MMA_E4M3_VIA_F16 build takes the form it claims in the PTX (nvcc -ptx,
sm_90a: the H200 proxy; sm_100a lowers FP8 mma.sync the same way): every FP8 MMA becomes two f16
m16n8k16 MMAs on cvt-unpacked operands, and no FP8 mma.sync is left, while the same layout without
the flag (`wide`, what sm_89 / sm_120a run) keeps its FP8 mma.sync and has no f16 MMA. A build where the flag did not take effect fails here (the GPU
tests cannot tell: both forms give the same numbers within the gate)."""
import os
import re
import shutil
import subprocess

import pytest

from vc_attention.kernels import jit, mma_variants

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("nvcc") is None and not os.environ.get("CUDA_HOME"), reason="nvcc not installed"),
]

FP8_MMA = r"mma\.sync\.aligned\.m16n8k32\.row\.col\.f32\.e4m3\.e4m3\.f32"
F16_MMA = r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.f16\.f16\.f32"
UNPACK = r"cvt\.rn\.f16x2\.e4m3x2"


def _ptx(tmp_path, variant: str) -> str:
    out = tmp_path / f"{variant}.ptx"
    cmd = [jit.find_nvcc(), "-ptx", "-std=c++17", *jit.BASE_CUDA_FLAGS, *mma_variants.flags(variant),
           *jit.gencode_flags("9.0a"), f"-I{jit.CSRC_DIR}", "-o", str(out), str(jit.CSRC_DIR / "attn_mma_d128.cu")]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    return out.read_text()


def _count(pattern: str, text: str) -> int:
    return len(re.findall(pattern, text))


def test_via_f16_build_has_no_fp8_mma_sync(tmp_path):
    native, via = _ptx(tmp_path, "wide"), _ptx(tmp_path, "wide-viaf16")
    assert _count(FP8_MMA, native) > 0 and _count(F16_MMA, native) == 0
    assert _count(FP8_MMA, via) == 0
    # two f16 MMAs per FP8 MMA of the build without the flag, each on unpacked operands
    assert _count(F16_MMA, via) == 2 * _count(FP8_MMA, native)
    assert _count(UNPACK, via) >= _count(F16_MMA, via)
