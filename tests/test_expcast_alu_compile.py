"""The speed path's encodings (kernels/csrc/p_encoding.cuh) take the form they claim in the PTX of the
portable kernel, per kernel function (nvcc -ptx for sm_89 and sm_120a):
- without the ExpCast build flags, both layouts encode the int8-QK speed kernels straight from the int32 scores (the spec's
  integer form, reference.expcast_bits): one integer multiply-add per element, no int-to-float
  conversion per element, no saturated FMA, no MUFU; the fp8-QK speed kernels (float scores) take the
  float-score form, one float-to-int conversion per element. Both layouts, both head dims.
- VC_EXPCAST_ALU=1 issues no conversion at all.
The paper's byte-code build (VC_EXPCAST_PAPER=1) fails the integer-form check, so the check can fail.
(sm_90a: tests/test_sm90_compile.py compiles the Hopper kernels and a representative few of bench/sm90_variants.sh's variants.)"""
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
# attn_mma[_wide]_kernel<D, kQkFp8, kExpCast, kVSmooth>: the mangled name spells the bools as Lb0 / Lb1
SPEED_KERNEL = re.compile(r"attn_mma(?:_wide)?_kernelILi\d+ELb[01]ELb1ELb[01]E")
INT8_QK = re.compile(r"kernelILi\d+ELb0E")
CONVERSIONS = {"E4M3 cast": r"cvt\.[\w.]*e4m3", "float to int": r"cvt\.rni", "MUFU exp2": r"ex2\.approx"}
LAYOUTS = {"rows16": (), "wide": ("-DVC_MMA_WIDE=1",)}


def _speed_kernel_ptx(tmp_path, arch: str, flags, source=SOURCE) -> dict[str, str]:
    out = tmp_path / f"{source.stem}-{arch}.ptx"
    cmd = [jit.find_nvcc(), "-ptx", "-std=c++17", *jit.BASE_CUDA_FLAGS, *flags, *jit.gencode_flags(arch),
           f"-I{jit.CSRC_DIR}", "-o", str(out), str(source)]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr.lower(), result.stderr
    functions = re.split(r"(?=\.visible \.entry )", out.read_text())[1:]
    named = {re.match(r"\.visible \.entry (\w+)", f).group(1): f for f in functions}
    speed = {name: body for name, body in named.items() if SPEED_KERNEL.search(name)}
    assert len(speed) == len(named) // 2 >= 2, sorted(named)
    return speed


def _count(pattern: str, body: str) -> int:
    return len(re.findall(pattern, body))


def _int_form_problems(body: str) -> list[str]:
    """Why a speed kernel's body is not the integer form (empty: it is). Each E4M3 pair cast packs two
    elements; the integer form spends one mad.lo.s32 (the IMAD) on each and converts only per row."""
    elements = 2 * _count(CONVERSIONS["E4M3 cast"], body)
    problems = []
    if elements < 64:
        problems.append(f"{elements} encoded elements")
    if _count(r"mad\.lo\.s32", body) < elements:
        problems.append(f"{_count(r'mad.lo.s32', body)} integer multiply-adds for {elements} elements")
    if _count(r"cvt\.rn\.f32\.s32", body) > elements // 8:
        problems.append(f"{_count(r'cvt.rn.f32.s32', body)} int-to-float conversions (per element, not per row)")
    if _count(r"fma\.rn\.sat\.f32", body):
        problems.append("the float form's saturated argument (fma.rn.sat.f32)")
    if _count(CONVERSIONS["MUFU exp2"], body):
        problems.append("MUFU exp2")
    return problems


@pytest.mark.parametrize("arch", ["8.9", "12.0a"])
def test_alu_build_has_no_conversion_in_the_speed_kernels(tmp_path, arch):
    for name, body in _speed_kernel_ptx(tmp_path, arch, ["-DVC_EXPCAST_ALU=1"]).items():
        for what, pattern in CONVERSIONS.items():
            assert not re.search(pattern, body), f"{what} in {name}"
        # one saturated argument per element and its chord lines' maxima are there
        assert len(re.findall(r"fma\.rn\.sat\.f32", body)) >= 64 and re.search(r"max\.f32", body), name


@pytest.mark.parametrize("source", ["attn_mma_d64.cu", "attn_mma_d128.cu"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("arch", ["8.9", "12.0a"])
def test_default_build_encodes_the_int8_speed_kernels_from_int32_scores(tmp_path, arch, layout, source):
    speed = _speed_kernel_ptx(tmp_path, arch, [*LAYOUTS[layout]], jit.CSRC_DIR / source)
    assert any(("wide" in name) == (layout == "wide") for name in speed), sorted(speed)
    for name, body in speed.items():
        if INT8_QK.search(name):
            assert not _int_form_problems(body), f"{name}: {_int_form_problems(body)}"
        else:  # fp8 scores are floats: the float-score form, a rounding to integer per element, no float argument
            elements = 2 * _count(CONVERSIONS["E4M3 cast"], body)
            assert _count(r"cvt\.rni\.s32\.f32", body) >= elements >= 64, name
            assert not _count(r"fma\.rn\.sat\.f32", body) and not _count(CONVERSIONS["MUFU exp2"], body), name


def test_the_integer_form_check_rejects_the_papers_encoding(tmp_path):
    for name, body in _speed_kernel_ptx(tmp_path, "8.9", ["-DVC_EXPCAST_PAPER=1"]).items():
        assert "the float form's saturated argument (fma.rn.sat.f32)" in _int_form_problems(body), name
