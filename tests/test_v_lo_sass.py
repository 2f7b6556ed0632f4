"""The Hopper variant with the V residual's second term (VC_SM90_V_LO, VCConfig.v_lo_channels) in machine code,
compile-only: fidelity's paired-K exp2 kernels read the term's rows in the PV MMA itself (one m64n{136+L}k32 per
k-step, VC_SM90_LO_MERGED, docs/kernel-notes.md section 39; with VC_SM90_LO_MERGED=0 an m64nLk32 beside the m64n136 PV
MMA, section 36), keep every register in place (no spill: the running sum lives in shared memory in the exp2 loop and
in registers in the chord's, section 41), and nothing else changes. Its numbers against the spec are the GPU's
(bench/sm90_variants.sh split_ch8_lo32 / split_lo16 gate it against reference.quantize_v_vsmooth with lo_channels;
bench/lib_identity.py: the merged and the two-wgmma builds give the same bits)."""
import collections
import importlib.util
import re
import subprocess
from pathlib import Path

import pytest

from vc_attention.kernels import backend_sm90, jit

_CB = importlib.util.spec_from_file_location("clamp_bound_sass", Path(__file__).with_name("test_clamp_bound_sass.py"))
clamp_bound_sass = importlib.util.module_from_spec(_CB)
_CB.loader.exec_module(clamp_bound_sass)
sass_loop_mix = clamp_bound_sass.sass_loop_mix

pytestmark = clamp_bound_sass.pytestmark
PAIRED_FIDELITY = re.compile(r"ILi128ELb0ELb1E\w+?Li4ELb0ELb0ELb1ELb[01]E")  # <128, exp2, V-Smooth, .., KPAIR, lanes?>


def build(tmp_path, flags) -> tuple[dict[str, tuple[int, int]], dict[str, int]]:
    """(kernel -> (loop trip, its QGMMA shapes counted) along the passed votes, kernel -> spill-store bytes) of
    sm90_launch.cu."""
    cubin = tmp_path / f"sm90-{len(flags)}.cubin"
    run = subprocess.run(jit.nvcc_compile_only_command(jit.CSRC_DIR / "sm90_launch.cu", "9.0a", cubin,
                                                       extra_flags=(*flags, "-Xptxas=-v")),
                         capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "warning" not in run.stderr.lower(), run.stderr[-3000:]
    spills = {}
    for block in run.stderr.split("Compiling entry function '")[1:]:
        name = block.split("'")[0]
        if not _refined(name, flags):
            spills[name] = int(re.search(r"(\d+) bytes spill stores", block).group(1))
    sass = subprocess.run([clamp_bound_sass.nvdisasm(), "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
    loops = {}
    for name, rows in sass_loop_mix.functions(sass).items():
        if "kernel" in name and not _refined(name, flags):
            trip = sass_loop_mix.hot_loop(rows, votes_pass=True)
            loops[name] = (len(trip), collections.Counter(m.group(1) for ins in trip
                                                          if (m := re.search(r"\bQGMMA\.(\d+x\d+x\d+)", ins))))
    # (the variant's kernels with the term are vc_attention_sm90_kernel_lo_chord: keyed by the product kernel they vary)
    plain = sass_loop_mix.plain_kernel_name
    return {plain(k): v for k, v in loops.items()}, {plain(k): v for k, v in spills.items()}


def _refined(name: str, flags) -> bool:
    """A product build's refined kernel (launch_refined: the term / the mixed encoding per call), which the variant
    build (VLO / CHORD for every paired-K fidelity kernel) instantiates under the same plain name: kept apart."""
    variant = any(f.startswith(("-DVC_SM90_V_LO=", "-DVC_SM90_EXP2_CHORD_EIGHTHS=")) for f in flags)
    return "kernel_lo_chord" in name and not variant


def sass_functions(tmp_path, flags) -> dict:
    """kernel -> its (offset, instruction) rows (sass_loop_mix.functions) in a compile-only build of sm90_launch.cu."""
    cubin = tmp_path / f"sass-{abs(hash(tuple(flags)))}.cubin"
    run = subprocess.run(jit.nvcc_compile_only_command(jit.CSRC_DIR / "sm90_launch.cu", "9.0a", cubin, extra_flags=tuple(flags)),
                         capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    text = subprocess.run([clamp_bound_sass.nvdisasm(), "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
    return sass_loop_mix.functions(text)


def masked_sass(tmp_path, flags) -> dict[str, list[str]]:
    """kernel -> its SASS with the build-specific names masked (its own symbol, labels, internal helpers)."""
    # sass_loop_mix.functions gives each kernel's instructions with its branch labels as offsets in the kernel; what
    # still differs between builds is the kernel's own symbol and the numbering of nvcc's internal helpers
    mask = lambda ins: re.sub(r"__internal_\d+_", "__internal_", re.sub(r"`\(_Z[^)]*\)", "SYM", ins))
    return {name: [mask(ins) for _, ins in rows] for name, rows in sass_functions(tmp_path, flags).items()}


def test_the_product_refined_kernels_are_the_variants_that_were_measured(tmp_path):
    """The product library's refined kernels (VLO = SM90_V_LO_CHANNELS, CHORD = MIXED_CHORD_EIGHTHS, each and both) are
    instruction for instruction the kernels of the variant builds bench/sm90_variants.sh times and gates (the term
    alone, split_ch8 and split_ch8_lo30 at the adopted constants), so the variants' measurements are the product's."""
    from vc_attention.kernels.constants import MIXED_CHORD_EIGHTHS, SM90_V_LO_CHANNELS

    L, C = SM90_V_LO_CHANNELS, MIXED_CHORD_EIGHTHS
    product = masked_sass(tmp_path, backend_sm90.CUDA_FLAGS)
    refined = {k for k in product if "kernel_lo_chord" in k}
    assert len(refined) == 6, sorted(refined)
    for vlo, chord in ((L, 0), (0, C), (L, C)):
        flags = (*backend_sm90.CUDA_FLAGS, *([f"-DVC_SM90_V_LO={vlo}"] if vlo else []),
                 *([f"-DVC_SM90_EXP2_CHORD_EIGHTHS={chord}"] if chord else []))
        variant = masked_sass(tmp_path, flags)
        mine = {k for k in refined if k.endswith(f"ELi{vlo}ELi{chord}EEEv14CUtensorMap_stS3_S3_S3_NS0_6ParamsE")}
        assert len(mine) == 2, (vlo, chord, sorted(refined))
        for k in mine:
            assert k in variant and variant[k] == product[k], (vlo, chord, k)


@pytest.fixture(scope="module")
def product_build(tmp_path_factory):
    """build() of the product library, once for the module (each compile is ~1-2 minutes of CI's cores)."""
    return build(tmp_path_factory.mktemp("product"), backend_sm90.CUDA_FLAGS)


@pytest.mark.parametrize("channels", [16, 32])
@pytest.mark.parametrize("merged", [True, False], ids=["in-the-pv-mma", "beside-it"])
def test_the_fidelity_kernel_reads_the_term_in_its_fp8_mmas_without_spilling(tmp_path, product_build, channels, merged):
    product, product_spills = product_build
    variant, variant_spills = build(tmp_path, (*backend_sm90.CUDA_FLAGS, f"-DVC_SM90_V_LO={channels}",
                                               *([] if merged else ["-DVC_SM90_LO_MERGED=0"])))
    assert set(product) == set(variant)
    fidelity = [k for k in product if PAIRED_FIDELITY.search(k)]
    assert len(fidelity) == 4, sorted(product)  # fp16 / bf16 output, with and without lane scales
    for k in fidelity:
        (trip, mma), (trip_v, mma_v) = product[k], variant[k]
        assert mma == {"64x136x32": 8}, (k, mma)  # two tiles x four k-steps of PV
        # merged: the same eight, each 136 + L columns wide; beside it: the eight PV MMAs and eight of the term
        expected = {f"64x{136 + channels}x32": 8} if merged else {"64x136x32": 8, f"64x{channels}x32": 8}
        assert mma_v == expected, (k, mma_v)
        assert trip < trip_v <= trip + 120, (k, trip, trip_v)
        assert variant_spills[k] <= product_spills[k], (k, product_spills[k], variant_spills[k])
    others = [k for k in product if k not in fidelity]
    assert others and all(variant[k] == product[k] for k in others), {k: (product[k], variant[k]) for k in others}


def test_the_row_sums_beside_30_channels_narrow_the_pv_mma_to_160_columns(tmp_path):
    """VLO = 30 (variant split_ch8_lo30, kernel-notes 40): the term's 30 rows and the step's two row-sum rows fill one
    32-row block after V^T, the stage's 8 ones rows go, so the merged PV MMA is 128 + 32 = 160 columns wide instead of
    168, and the four shuffles that bring the row sums to the quad cost no spill."""
    merged, merged_spills = build(tmp_path, (*backend_sm90.CUDA_FLAGS, "-DVC_SM90_V_LO=32"))
    sums, sums_spills = build(tmp_path, (*backend_sm90.CUDA_FLAGS, "-DVC_SM90_V_LO=30"))
    fidelity = [k for k in merged if PAIRED_FIDELITY.search(k)]
    assert len(fidelity) == 4, sorted(merged)
    for k in fidelity:
        (trip, mma), (trip_s, mma_s) = merged[k], sums[k]
        assert mma == {"64x168x32": 8} and mma_s == {"64x160x32": 8}, (k, mma, mma_s)
        assert abs(trip_s - trip) <= 16, (k, trip, trip_s)  # + 4 SHFL, the same fold otherwise
        assert sums_spills[k] <= merged_spills[k], (k, merged_spills[k], sums_spills[k])
    others = [k for k in merged if k not in fidelity]
    assert others and all(sums[k] == merged[k] for k in others)


def test_the_chord_loop_keeps_the_terms_running_sum_in_registers(tmp_path):
    """VC_SM90_LO_RUN_REGS (default 1, kernel-notes 41): the product's fidelity kernel (the term with the chord for
    every key) folds the term's running sum in registers: no shared-memory load or store of it in its loop (the 4
    LDS.128 + 4 STS.128 per step that waited behind the other warpgroup's PV reads) and no spill; the exp2 loop with the
    term (CHORD = 0) keeps it in shared memory, where the registers would spill. The variant with the macro at 0 has the
    shared-memory sum in the chord's loop too, so the check can see the difference."""
    from vc_attention.kernels.constants import MIXED_CHORD_EIGHTHS, SM90_V_LO_CHANNELS

    L, C = SM90_V_LO_CHANNELS, MIXED_CHORD_EIGHTHS

    def loops(flags):
        return {name: sass_loop_mix.hot_loop(rows) for name, rows in sass_functions(tmp_path, flags).items()
                if "kernel_lo_chord" in name and "bfloat16" in name and re.search(r"ILi128ELb0ELb1E\w+Lb0EL", name)}

    def shared_sum_ops(loop):  # the running sum's float4 traffic: LDS.128 / STS.128 (the loop has no other)
        return sum(1 for ins in loop if re.search(r"\b(LDS|STS)\.128\b", ins))

    for macro, chord_sum in ((1, 0), (0, 8)):
        found = loops((*backend_sm90.CUDA_FLAGS, f"-DVC_SM90_LO_RUN_REGS={macro}"))
        chord = [k for k in found if k.endswith(f"ELi{L}ELi{C}EEEv14CUtensorMap_stS3_S3_S3_NS0_6ParamsE")]
        exp2 = [k for k in found if k.endswith(f"ELi{L}ELi0EEEv14CUtensorMap_stS3_S3_S3_NS0_6ParamsE")]
        assert len(chord) == 1 and len(exp2) == 1, sorted(found)
        assert shared_sum_ops(found[chord[0]]) == chord_sum, (macro, shared_sum_ops(found[chord[0]]))
        assert shared_sum_ops(found[exp2[0]]) == 8, shared_sum_ops(found[exp2[0]])  # 4 slots: 4 loads + 4 stores
        assert not any(re.search(r"\b(STL|LDL)\b", ins) for k in chord + exp2 for ins in found[k]), macro
