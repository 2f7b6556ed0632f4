"""The mixed encoding's Hopper variant (VC_SM90_EXP2_CHORD_EIGHTHS=4, reference p="mixed") in machine code, compile-only.

What the variant is for is visible only in SASS: the exp2 loops' MUFU.EX2 halve (the chord keys take one IMAD each
instead of I2FP + FFMA + MUFU.EX2) and their trips shorten (head dim 128 paired-K fidelity 992 -> 906 instructions,
head dim 64 489 -> 448 along the passed votes; docs/kernel-notes.md section 36), while the speed kernels do not change.
Its numbers against the spec are the GPU's (bench/sm90_variants.sh split_ch4 gates it against p="mixed").
"""
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from vc_attention.kernels import backend_sm90, jit

_BENCH = Path(__file__).resolve().parents[1] / "bench"
_SPEC = importlib.util.spec_from_file_location("sass_loop_mix", _BENCH / "sass_loop_mix.py")
sass_loop_mix = importlib.util.module_from_spec(_SPEC)
sys.modules.setdefault("sass_loop_mix", sass_loop_mix)
_SPEC.loader.exec_module(sass_loop_mix)
_CB = importlib.util.spec_from_file_location("clamp_bound_sass", Path(__file__).with_name("test_clamp_bound_sass.py"))
clamp_bound_sass = importlib.util.module_from_spec(_CB)
_CB.loader.exec_module(clamp_bound_sass)

pytestmark = clamp_bound_sass.pytestmark
MIXED = "-DVC_SM90_EXP2_CHORD_EIGHTHS=4"


ROW_CONSTANT_256 = re.compile(r"FADD\S*\s+R\d+, -R\d+, 8$")  # base = 8 - M: exp2 at row max 256 (p="exp2")


def disassemble(tmp_path, source: Path, flags) -> str:
    cubin = tmp_path / f"{source.stem}-{len(flags)}.cubin"
    build = subprocess.run(jit.nvcc_compile_only_command(source, "9.0a", cubin, extra_flags=tuple(flags)),
                           capture_output=True, text=True, check=False)
    assert build.returncode == 0, build.stderr[-3000:]
    return subprocess.run([clamp_bound_sass.nvdisasm(), "-c", str(cubin)], capture_output=True, text=True, check=True).stdout


def loops(tmp_path, source: Path, flags) -> dict[str, tuple[int, int]]:
    """kernel -> (instructions, MUFU.EX2) of one trip of its hot loop, along the path where every VOTE.ALL passed."""
    sass = disassemble(tmp_path, source, flags)
    out = {}
    for name, rows in sass_loop_mix.functions(sass).items():
        if "kernel" in name and not (MIXED not in flags and "kernel_lo_chord" in name):  # (the product's refined kernels)
            trip = sass_loop_mix.hot_loop(rows, votes_pass=True)
            # (a mixed build's exp2 kernels are vc_attention_sm90_kernel_lo_chord: keyed by the product kernel they vary)
            out[sass_loop_mix.plain_kernel_name(name)] = (len(trip), sum("MUFU.EX2" in ins for ins in trip))
    return out


@pytest.mark.parametrize("source,fidelity_tag,mufu_before", [
    ("sm90_launch.cu", "ILi128ELb0ELb1E", 128),  # head dim 128 fidelity (two consumers; paired-K and per-tile K)
    ("sm90_launch_c3.cu", "ILi64ELb0ELb1E", 64),  # head dim 64 fidelity (three consumers)
])
def test_the_mixed_variant_halves_the_exp2_loops_mufu_and_leaves_speed_alone(tmp_path, source, fidelity_tag, mufu_before):
    src = jit.CSRC_DIR / source
    product = loops(tmp_path, src, backend_sm90.CUDA_FLAGS)
    mixed = loops(tmp_path, src, (*backend_sm90.CUDA_FLAGS, MIXED))
    assert set(product) == set(mixed)
    fidelity = [k for k in product if fidelity_tag in k]
    assert fidelity, sorted(product)
    for k in fidelity:
        (trip, mufu), (trip_m, mufu_m) = product[k], mixed[k]
        # exp2 per score (plus two for the rescale alpha of the step's rows): half the scores leave the MUFU
        assert mufu >= mufu_before and mufu_m <= mufu // 2 + 4, (k, mufu, mufu_m)
        assert trip_m <= trip - 30, (k, trip, trip_m)  # the chord keys cost one IMAD instead of three instructions
    speed = [k for k in product if re.search(r"ILi\d+ELb1E", k)]  # <D, EXPCAST = true, ...>: no exp2 P to split
    assert speed and all(mixed[k] == product[k] for k in speed), {k: (product[k], mixed[k]) for k in speed}


def test_every_exp2_key_of_a_mixed_build_takes_the_448_row_constant(tmp_path):
    # reference p="mixed": exp2 + cast at row max 448 wherever a key is not the chord's, also in a call that has no chord
    # key (the odd last tile of the 256-key loops at C <= 4 once used 8 - M there: a review found it in this SASS)
    src = jit.CSRC_DIR / "sm90_launch.cu"
    product = {k: rows for k, rows in sass_loop_mix.functions(disassemble(tmp_path, src, backend_sm90.CUDA_FLAGS)).items()
               if "kernel_lo_chord" not in k}  # the product's refined kernels: test_v_lo_sass
    mixed = {sass_loop_mix.plain_kernel_name(k): rows
             for k, rows in sass_loop_mix.functions(disassemble(tmp_path, src, (*backend_sm90.CUDA_FLAGS, MIXED))).items()}
    fidelity = [k for k in product if "ILi128ELb0ELb1E" in k]
    assert fidelity
    for k in fidelity:
        assert any(ROW_CONSTANT_256.search(ins) for _, ins in product[k]), k  # the product's exp2 loops do use 8 - M
        assert not any(ROW_CONSTANT_256.search(ins) for _, ins in mixed[k]), k
