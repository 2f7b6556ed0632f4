"""The numeric constants shared by Python and CUDA are defined once (kernels/constants.py), reach
every CUDA build as -D flags, and no literal copy of them lives in csrc/ (where it could drift)."""
import os
import re
import shutil
import subprocess

import pytest
import torch

from vc_attention.kernels import constants, jit, reference

CSRC = jit.CSRC_DIR
HEADER = CSRC / "vc_constants.h"

# literal copies of a shared constant, or a typed constant defined from a literal, outside vc_constants.h
COPIES = {
    "ExpCast bias": r"\b119\.65",
    "E4M3 max": r"\b448(\.0*)?f?\b",
    "log2(e)": r"\b1\.44269",
    "E4M3 one code": r"\b0x38(38)*u?\b",
    "a shared constant defined from a literal": r"constexpr\s+[\w:]+\s+k(QBlock|KBlock|BlockN|E4m3Max|Int8Max|Log2e|ExpCastBias|"
                                                r"E4m3OnesX4|PLog2Max|E4m3OctaveCodes|ExpCastMaxCode)\s*=\s*[-\d.]",
}


def _code_without_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def _parsed_defines(flags) -> dict:
    out = {}
    for flag in flags:
        m = re.fullmatch(r"-DVC_(\w+)=(.+)", flag)
        if m and m.group(1) in constants.SHARED_WITH_CUDA:
            out[m.group(1)] = float(m.group(2).rstrip("f"))
    return out


@pytest.mark.parametrize("path", sorted(p for p in CSRC.iterdir() if p.suffix in (".cu", ".cuh", ".h", ".cpp") and p != HEADER),
                         ids=lambda p: p.name)
def test_no_literal_copy_of_a_shared_constant_in_csrc(path):
    code = _code_without_comments(path.read_text())
    found = {what: m.group(0) for what, pattern in COPIES.items() if (m := re.search(pattern, code))}
    assert not found, f"{path.name} repeats {found}: use the vc_constants.h names instead"


def test_the_copy_check_can_fail():
    assert re.search(COPIES["ExpCast bias"], _code_without_comments("float b = 119.65f; // 119.65"))
    assert not re.search(COPIES["ExpCast bias"], _code_without_comments("float b = kExpCastBias; // 119.65"))
    assert re.search(COPIES["a shared constant defined from a literal"], "constexpr int kBlockN = 128;")


def test_every_build_gets_the_defines_with_the_python_values():
    spec = jit.make_spec("probe", ["prepare.cu"], arch="9.0a")
    assert _parsed_defines(spec.cuda_flags) == {k: float(v) for k, v in constants.SHARED_WITH_CUDA.items()}
    command = jit.nvcc_compile_only_command(CSRC / "prepare.cu", "9.0a", CSRC / "x.cubin", nvcc="nvcc")
    assert _parsed_defines(command) == _parsed_defines(spec.cuda_flags)
    # a changed constant is a different build (the flags are part of the cache key)
    other = jit.BuildSpec(spec.name, spec.sources, tuple(f.replace("VC_K_BLOCK=128", "VC_K_BLOCK=64") for f in spec.cuda_flags),
                          spec.cxx_flags, spec.arch)
    assert other.key != spec.key


def test_the_header_requires_and_uses_every_shared_constant():
    text = HEADER.read_text()
    guard = text[text.index("#if "):text.index("#error")]
    for name in constants.SHARED_WITH_CUDA:
        assert f"!defined(VC_{name})" in guard
        assert re.search(rf"constexpr [\w:]+ k\w+ = [^;]*\bVC_{name}\b", text), name


def test_the_spec_uses_the_shared_values():
    assert reference.K_BLOCK == constants.K_BLOCK and reference.EXPCAST_BETA == constants.EXPCAST_BETA
    assert constants.EXPCAST_MAX_CODE == 120 and constants.E4M3_ONE_CODE == 0x38
    assert torch.tensor(constants.E4M3_ONE_CODE, dtype=torch.uint8).view(torch.float8_e4m3fn).float() == 1.0
    assert torch.tensor(constants.EXPCAST_MAX_CODE, dtype=torch.uint8).view(torch.float8_e4m3fn).float() == constants.P_MAX
    # u = 0 (the row max) encodes to the top code (256 in the paper's encoding, 448 in the corrected
    # one); one octave down is 8 codes lower
    octave = constants.E4M3_OCTAVE_CODES
    paper = reference.expcast_paper_code(torch.tensor([0.0, -1.0]))
    assert paper.tolist() == [constants.EXPCAST_MAX_CODE, constants.EXPCAST_MAX_CODE - octave]
    codes = reference.expcast_code(torch.tensor([0.0, -1.0]))
    assert codes.tolist() == [constants.EXPCAST_TOP_CODE, constants.EXPCAST_TOP_CODE - octave]
    assert torch.tensor(constants.EXPCAST_TOP_CODE, dtype=torch.uint8).view(torch.float8_e4m3fn).float() == constants.E4M3_MAX
    assert torch.tensor(constants.E4M3_MAX).to(torch.float8_e4m3fn).float() == constants.E4M3_MAX
    assert torch.finfo(torch.float8_e4m3fn).max == constants.E4M3_MAX


@pytest.mark.skipif(shutil.which("nvcc") is None and not os.environ.get("CUDA_HOME"), reason="nvcc not installed")
def test_nvcc_sees_the_python_values_and_stops_without_them(tmp_path):
    literal = {name: f"{v!r}f" if isinstance(v, float) else repr(v) for name, v in constants.SHARED_WITH_CUDA.items()}
    checks = "\n".join(f"static_assert(VC_{name} == {value}, \"VC_{name}\");" for name, value in literal.items())
    source = tmp_path / "probe.cu"
    source.write_text(f'#include "vc_constants.h"\n{checks}\nstatic_assert(vc::kKBlock == {constants.K_BLOCK}, "");\n')
    command = jit.nvcc_compile_only_command(source, "9.0a", tmp_path / "probe.cubin")
    ok = subprocess.run(command, capture_output=True, text=True, check=False)
    assert ok.returncode == 0, ok.stderr
    bare = [f for f in command if not f.startswith("-DVC_")]
    failed = subprocess.run(bare, capture_output=True, text=True, check=False)
    assert failed.returncode != 0 and "numeric constants are missing" in failed.stderr
