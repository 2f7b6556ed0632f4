"""nvcc compile-only of every CUDA source of the portable kernels for each target arch (no GPU).

Each (source, arch) pair is compiled once, in parallel, with the JIT's own flags; the sm90_* sources
belong to the Hopper backend and are compiled by its tests. The build-time variants of the attention
kernel (kernels/mma_variants.py) are compiled too: the wide layout for every arch, the other
variants for sm_90a (the H200 they are timed on), with the ptxas register report.
"""
import concurrent.futures
import os
import re
import shutil
import subprocess

import pytest

from vc_attention.kernels import jit, mma_variants, prepare_cuda

# sm_100a: a B200 runs the portable kernel (the sm90 backend is Hopper-only), so it must build there
ARCHS = ("8.9", "9.0a", "10.0a", "12.0a")
SOURCES = sorted(p for p in jit.CSRC_DIR.glob("*.cu") if not p.name.startswith("sm90_"))
ATTN_SOURCES = ("attn_mma_d64.cu", "attn_mma_d128.cu")
# the PV-accumulation variants (issue 12) target the GeForce parts too: sm_89, sm_120a and the H200 proxy
PV_ARCHS = ("8.9", "9.0a", "12.0a")
# the FP8-MMA-through-f16 variants are for the archs without FP8 mma.sync: the H200 proxy and the B200
VIA_F16_ARCHS = mma_variants.VIA_F16_ARCHS
# the builds the backend runs (each arch's default) and the ones being measured for adoption (mma_variants.CANDIDATES)
# compile for every arch of their kind; the variants measured and kept for comparison only for sm_90a, where they were
# timed (the compile tier is the largest share of CI's 90 minutes: 57 -> 40 variant x arch builds)
FULL_ARCH_VARIANTS = {mma_variants.default_variant(a, pv) for a in ARCHS for pv in mma_variants.PV_ACCUMS} | {
    "wide", *mma_variants.CANDIDATES}


def _variant_archs(name: str) -> tuple[str, ...]:
    archs = (ARCHS if name == "wide" else VIA_F16_ARCHS if "viaf16" in name
             else PV_ARCHS if "pv" in name or "restore" in name else ("9.0a",))
    return archs if name in FULL_ARCH_VARIANTS else ("9.0a",)


VARIANT_BUILDS = [(name, arch) for name in mma_variants.VARIANTS if name != "rows16" for arch in _variant_archs(name)]
# ptxas spill stores per int8-QK kernel of a wide build (bytes): D=128 sits at the 255-register cap
# and ptxas spills a few L1-resident words there (docs/kernel-notes.md sec. 10 and 13); a variant
# above this has moved the working set into local memory and would not be worth timing. The exact
# running max with one Q scale per row (two scales and two row constants per chain live through the
# softmax) took the worst one, wide-restoretile's sm_90a speed kernel, from 264 to 292 bytes.
MAX_WIDE_SPILL_BYTES = 300

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None and not os.environ.get("CUDA_HOME"), reason="nvcc not installed")


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("cubin")
    nvcc = jit.find_nvcc()

    def build(source, arch, variant=None):
        flags = mma_variants.flags(variant) + ("-Xptxas=-v",) if variant else ()
        out = out_dir / f"{source.stem}-{variant or 'default'}-{jit.arch_code(arch)}.cubin"
        cmd = jit.nvcc_compile_only_command(source, arch, out, nvcc, extra_flags=flags)
        return subprocess.run(cmd, capture_output=True, text=True, check=False)

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        futures = {(s.name, a, None): pool.submit(build, s, a) for s in SOURCES for a in ARCHS}
        futures.update({(src, a, v): pool.submit(build, jit.CSRC_DIR / src, a, v) for v, a in VARIANT_BUILDS for src in ATTN_SOURCES})
        return {key: fut.result() for key, fut in futures.items()}


@pytest.mark.parametrize("pv_accum", mma_variants.PV_ACCUMS)
@pytest.mark.parametrize("arch", ARCHS)
def test_each_archs_default_build_is_compiled(compiled, arch, pv_accum):
    """The build the backend runs on each arch (mma_variants.default_variant) is among the compiled ones, with
    either PV accumulation (fp32+fp16 is the GeForce default and VC_ATTENTION_MMA_PV_ACCUM picks it anywhere)."""
    variant = mma_variants.default_variant(arch, pv_accum)
    for source in ATTN_SOURCES:
        result = compiled[(source, arch, variant)]
        assert result.returncode == 0, f"nvcc failed for {source} {variant} sm_{jit.arch_code(arch)}:\n{result.stderr}"


def test_sources_found():
    names = {p.name for p in SOURCES}
    assert {"prepare.cu", "attn_mma.cu", "attn_mma_d64.cu", "attn_mma_d128.cu", "grouping.cu"} <= names


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("source", [p.name for p in SOURCES])
def test_compiles(compiled, source, arch):
    result = compiled[(source, arch, None)]
    assert result.returncode == 0, f"nvcc failed for {source} sm_{jit.arch_code(arch)}:\n{result.stderr}"
    assert "warning" not in result.stderr.lower(), result.stderr


def per_kernel(ptxas_report: str, figure: str) -> dict[str, int]:
    """One figure per kernel from a `ptxas -v` report: the integer group of regex `figure` on the lines after each
    kernel's "Compiling entry function" line."""
    values, kernel = {}, None
    for line in ptxas_report.splitlines():
        name = re.search(r"Compiling entry function '(\w+)'", line)
        if name:
            kernel = name.group(1)
        found = re.search(figure, line)
        if found and kernel:
            values[kernel] = int(found.group(1))
    return values


def _spills(ptxas_report: str) -> dict[str, int]:
    """Spill-store bytes per kernel from a `ptxas -v` report."""
    return per_kernel(ptxas_report, r"(\d+) bytes spill stores")


@pytest.mark.parametrize("variant,arch", VARIANT_BUILDS)
@pytest.mark.parametrize("source", ATTN_SOURCES)
def test_variant_compiles(compiled, source, variant, arch):
    result = compiled[(source, arch, variant)]
    assert result.returncode == 0, f"nvcc failed for {source} {variant} sm_{jit.arch_code(arch)}:\n{result.stderr}"
    assert "warning" not in result.stderr.lower(), result.stderr
    assert "wide_kernel" in result.stderr, "the variant flags did not select the wide kernel"
    all_spills = _spills(result.stderr)
    # <D, kQkFp8, kExpCast, kVSmooth, kLanes>: the lane kernels (K scales per lane: INT8 V-Smooth at head dim 128, both
    # P encodings) beside the 8 of every build, within the int8 kernels' bound or a few words of their twins (at the
    # 255-register cap ptxas spills them a little differently: the default builds 0-12 B more, wide-restoretile's sm_90a
    # fidelity one 292 -> 312 B; docs/kernel-notes.md section 34)
    lane_flag = {k: re.search(r"wide_kernelILi\d+ELb[01]ELb[01]ELb[01]ELb([01])E", k) for k in all_spills}
    lanes = {k: b for k, b in all_spills.items() if lane_flag[k] and lane_flag[k].group(1) == "1"}
    spills = {k: b for k, b in all_spills.items() if k not in lanes}
    assert len(spills) == 8, result.stderr  # 2 QK formats x 2 P encodings x 2 V formats
    assert len(lanes) == (2 if source == "attn_mma_d128.cu" else 0), sorted(lanes)
    twin = {k: all_spills[re.sub(r"ELb1EEEv", "ELb0EEEv", k)] for k in lanes}
    assert all(b <= max(MAX_WIDE_SPILL_BYTES, twin[k] + 32) for k, b in lanes.items()), (lanes, twin)
    int8_qk = {k: b for k, b in spills.items() if re.search(r"ILi\d+ELb0E", k)}  # <D, kQkFp8 = false, ...>
    assert len(int8_qk) == 4 and max(int8_qk.values()) <= MAX_WIDE_SPILL_BYTES, int8_qk
    if "-DVC_MMA_D64_MIN_BLOCKS=3" in mma_variants.flags(variant):
        # every head-dim-64 kernel is the bounded copy and fits three CTAs of 128 threads per SM; head dim 128 has none
        bounded = {k: r for k, r in per_kernel(result.stderr, r"Used (\d+) registers").items() if "occupied" in k}
        assert len(bounded) == (8 if source == "attn_mma_d64.cu" else 0), sorted(bounded)
        assert all(r <= 65536 // (3 * 128) for r in bounded.values()), bounded


# the register-staged kernels each prepare build runs, and how many (2 dtypes x 2 head dims x ...): the
# default build's quantize pass (csrc/prepare_staged.cuh, x 2 QK formats x with and without the V residual's
# second term), the staged-stats and rows-in-regs variants' two passes (x (stats + 2 QK formats)); legacy-quantize
# stages nothing; stats-prefetch changes prepare.cuh's statistics kernel only (the variants have no second V term)
STAGED_KERNELS = {"default": ("staged_kernel", 16), "rows-in-regs": ("regs_kernel", 12),
                  "legacy-quantize": ("staged_kernel", 0), "staged-stats": ("staged_kernel", 12),
                  "stats-prefetch": ("staged_kernel", 8)}


@pytest.mark.parametrize("variant", list(prepare_cuda.VARIANTS))
@pytest.mark.parametrize("arch", ARCHS)
def test_prepare_build_compiles_without_spilling_much(variant, arch, tmp_path):
    """The prepare extension's builds (kernels/prepare_cuda.VARIANTS, the default included) compile for
    every arch without a warning and instantiate the kernels they are for; the register-staged kernels
    keep their rows in registers (a few spilled words at most: a large spill would put the staged rows in
    local memory, the opposite of the staging's point)."""
    out = tmp_path / f"prepare-{variant}.cubin"
    cmd = jit.nvcc_compile_only_command(jit.CSRC_DIR / "prepare.cu", arch, out, jit.find_nvcc(),
                                        extra_flags=prepare_cuda.VARIANTS[variant] + ("-Xptxas=-v",))
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr.lower(), result.stderr
    marker, count = STAGED_KERNELS[variant]
    staged = {k: b for k, b in _spills(result.stderr).items() if marker in k}
    assert len(staged) == count and max(staged.values(), default=0) <= 32, staged


@pytest.mark.parametrize("variant", ("order-block", "order-direct"))
@pytest.mark.parametrize("arch", ("8.9", "9.0a"))
def test_grouping_variant_builds_compile(arch, variant, tmp_path):
    """The grouping's build-time variants (grouping_fused.VARIANTS: the block-wide chain order for every
    cluster count, the one-warp chain without the Gram matrix) compile without a warning or a spill, so a GPU
    run can check them against the default build and time them."""
    from vc_attention.kernels import grouping_fused

    cmd = jit.nvcc_compile_only_command(jit.CSRC_DIR / "grouping.cu", arch, tmp_path / f"grouping-{variant}.cubin",
                                        jit.find_nvcc(), extra_flags=grouping_fused.VARIANTS[variant] + ("-Xptxas=-v",))
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr.lower(), result.stderr
    spills = _spills(result.stderr)
    # the block-wide order kernel spills 4 bytes on sm_90a (it did as the default until session 13,
    # measured at 142 us: docs/grouping.md); every other kernel none
    order = [b for k, b in spills.items() if "group_order_kernel" in k]
    assert order and order[0] <= (8 if variant == "order-block" else 0), spills
    assert max(b for k, b in spills.items() if "group_order_kernel" not in k) == 0, spills
