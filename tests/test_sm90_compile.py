"""nvcc compile-only of the Hopper (sm_90a) kernel sources (CPU tier: needs nvcc, no GPU).

Beyond "it compiles": ptxas must not spill beyond a known small amount, serialize the wgmma
pipeline (C7513) or ignore the register reallocation (C7508) - each of these compiles fine and
silently costs speed.
"""
import concurrent.futures
import dataclasses
import os
import re
import shutil
import subprocess

import pytest

from vc_attention.kernels import backend_sm90, constants, jit
from vc_attention.kernels.config import FIDELITY, PLAIN_8BIT

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("nvcc") is None and not os.environ.get("CUDA_HOME"), reason="nvcc not installed"),
]

LAUNCHER = jit.CSRC_DIR / "sm90_launch.cu"
LAUNCHER_C3 = jit.CSRC_DIR / "sm90_launch_c3.cu"
KERNEL_ENTRY = r"Compiling entry function '(\w*vc_attention_sm90_kernel\w*)'"
VARIANTS_SCRIPT = jit.CSRC_DIR.parent.parent / "bench" / "sm90_variants.sh"


def variant_flags() -> dict[str, list[str]]:
    """The compile-time variants the GPU benchmark builds (bench/sm90_variants.sh is the one list)."""
    found = re.findall(r'^\s*\[(\w+)\]="([^"]*)"', VARIANTS_SCRIPT.read_text(), flags=re.M)
    return {name: flags.split() for name, flags in found if flags}


def _ptxas_report(source, out, flags=(), what="") -> str:
    """nvcc -cubin for sm_90a with the JIT's flags plus `flags`; ptxas -v's report (stderr)."""
    cmd = jit.nvcc_compile_only_command(source, "9.0a", out, extra_flags=["-Xptxas=-v", *flags])
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"nvcc failed for {source.name} sm_90a {what}:\n{result.stderr}"
    return result.stderr


@pytest.fixture(scope="module")
def ptxas_report(tmp_path_factory):
    return _ptxas_report(LAUNCHER, tmp_path_factory.mktemp("sm90") / "sm90_launch.cubin")


def test_every_kernel_instantiation_is_compiled(ptxas_report):
    kernels = re.findall(KERNEL_ENTRY, ptxas_report)
    # head dim {64, 128} x {exp2, ExpCast} x {V-Smooth, per-channel} x {fp16, bf16}
    assert len({k for k in kernels if not _step_mean(k)}) == 16 and not any(_k_pair(k) or _k_lanes(k) for k in kernels)


# At 240 registers per consumer thread ptxas keeps a few words of the V-Smooth head-dim-128 kernels in
# local memory (16 B of stack, L1-resident loads per key tile; the 256-key loops' are loop-carried);
# anything larger is a regression.
MAX_STACK_BYTES = 16


def test_spills_stay_within_two_words(ptxas_report):
    frames = re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", ptxas_report)
    assert frames, ptxas_report
    assert max(int(f[0]) for f in frames) <= MAX_STACK_BYTES, ptxas_report


def test_wgmma_pipeline_and_register_reallocation_are_kept(ptxas_report):
    assert "C7513" not in ptxas_report, "ptxas serialized the wgmma pipeline:\n" + ptxas_report
    # C7519 is an info line, not a warning: ptxas injected warpgroup.arrive (and, across a branch inside
    # a commit group, a dummy wgmma) to protect registers of an in-flight wgmma. In the batched-mean
    # experiment (docs/kernel-notes.md section 12) that serialized every wgmma of the loop.
    assert "C7519" not in ptxas_report, "ptxas injected warpgroup.arrive into the wgmma pipeline:\n" + ptxas_report
    assert "C7508" not in ptxas_report, "ptxas ignored setmaxnreg:\n" + ptxas_report
    assert "warning" not in ptxas_report.lower(), ptxas_report


# The variants may spill a little more than the default (P staged through shared memory needs the
# registers of the PV accumulator, O and S at once), but never serialize the wgmma pipeline.
MAX_VARIANT_STACK_BYTES = 64


VARIANTS = variant_flags()


def test_variant_list_is_read():
    assert {"mean", "psmem", "psmem_mean"} <= set(VARIANTS)


# The Hopper variants are research builds kept for comparison (the product is `split`, compiled by
# test_product_library_splits_the_kernels_between_two_cta_shapes; the Hopper issues are closed). Compiling all of
# them took ~35 of CI's 90 minutes on its two cores and CI ran out of time (docs/kernel-notes.md 52), so CI compiles
# the ones that reach code paths the product build does not: three consumers and the 256-key step unsplit, P through
# shared memory with the mean MMA (the variants' stack bound), and the split builds with each of their own spill
# bounds (the early-QK loop with the chord, the V residual's second term as the build default, four partial row
# maxima). VC_TEST_ALL_HOPPER_VARIANTS=1 compiles every one (bench/sm90_variants.sh's build summary reports the same
# on the GPU).
CI_VARIANTS = ("c3", "s256", "psmem_mean", "split_fe_ch8", "split_ch8_lo32", "split_kp4")
ALL_VARIANTS = os.environ.get("VC_TEST_ALL_HOPPER_VARIANTS") == "1"
COMPILED_VARIANTS = sorted(VARIANTS) if ALL_VARIANTS else sorted(CI_VARIANTS)


UNSPLIT_VARIANTS = [n for n in COMPILED_VARIANTS if "-DVC_SM90_SPLIT=1" not in VARIANTS[n]]


@pytest.fixture(scope="module")
def unsplit_reports(request, tmp_path_factory):
    """name -> future ptxas report of each unsplit variant the session runs, compiled on every core at once (one nvcc
    per core: in series the 31 unsplit variants took ~20 minutes of CI's two cores, docs/kernel-notes.md 51)."""
    selected = [item.callspec.params["name"] for item in request.session.items
                if getattr(item, "originalname", None) == "test_variant_compiles_cleanly"]
    out = tmp_path_factory.mktemp("sm90_variants")
    pool = concurrent.futures.ThreadPoolExecutor(max(2, os.cpu_count() or 2))
    futures = {name: pool.submit(_ptxas_report, LAUNCHER, out / f"{name}.cubin", VARIANTS[name], f"(variant {name})")
               for name in selected}
    yield futures
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.parametrize("name", UNSPLIT_VARIANTS)
def test_variant_compiles_cleanly(name, unsplit_reports):
    report = unsplit_reports[name].result()
    kernels = set(re.findall(KERNEL_ENTRY, report))
    low_rank = {k for k in kernels if _low_rank(k)}  # the 256-key builds: the low-rank V term's kernels too
    step_mean = {k for k in kernels if _step_mean(k)}  # and the early-QK loop's one-mean-per-step kernels
    assert len(kernels - low_rank - step_mean) == 16 and not any(_k_pair(k) or _k_lanes(k) for k in kernels)
    assert all(re.search(r"ILi128ELb\dELb1E", k) for k in low_rank), low_rank
    assert all(re.search(r"ILi128ELb1ELb1E", k) for k in step_mean) and len(step_mean) in (0, 2), step_mean
    assert "warning" not in report.lower(), report  # C7510-C7515 serialization, C7508 setmaxnreg ignored
    frames = re.findall(r"(\d+) bytes stack frame", report)
    assert max(int(f) for f in frames) <= MAX_VARIANT_STACK_BYTES, report
    # the launch-time register pool shows the CTA size the variant builds: 65,536 / 512 threads for three
    # consumer warpgroups + the producer, 65,536 / 384 (168) otherwise
    registers = {int(r) for r in re.findall(r"Used (\d+) registers", report)}
    assert registers == ({128} if "-DVC_SM90_CONSUMERS=3" in VARIANTS[name] else {168}), registers


@pytest.mark.parametrize("name", [n for n in COMPILED_VARIANTS if "-DVC_SM90_SPLIT=1" in VARIANTS[n] and n != "split"])
def test_split_variant_compiles_cleanly(name, tmp_path):
    """The split variants (both files, as the product library links them): every kernel once between
    the two builds, no ptxas warning, stack within the variants' bound."""
    # the two files at once: nvcc compiles one file on one core, and these 36 tests ran ~45 s each in series on CI's
    # two cores (docs/kernel-notes.md 51)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        reports = list(pool.map(lambda src: _ptxas_report(src, tmp_path / f"{name}-{src.stem}.cubin", VARIANTS[name],
                                                          f"(variant {name})"), (LAUNCHER, LAUNCHER_C3)))
    kernels = [k for r in reports for k in set(re.findall(KERNEL_ENTRY, r)) if not _k_lanes(k)]  # lanes: below
    low_rank = [k for k in kernels if _low_rank(k)]
    step_mean = [k for k in kernels if _step_mean(k)]
    k_pair = [k for k in kernels if _k_pair(k)]
    assert len(kernels) - len(low_rank) - len(step_mean) - len(k_pair) == 16
    # the one-mean-per-step kernels: ExpCast's (the early-QK loop), and exp2's under VC_SM90_STEPMEAN_EXP2
    exp2_step_mean = "-DVC_SM90_STEPMEAN_EXP2=1" in VARIANTS[name]
    assert all(re.search(r"ILi128ELb1ELb1E" if not exp2_step_mean else r"ILi128ELb[01]ELb1E", k) for k in step_mean), step_mean
    assert len(step_mean) in ((0, 2) if not exp2_step_mean else (4,)), step_mean
    # the low-rank V term's kernels (the last template argument): head dim 128 V-Smooth only
    assert all(re.search(r"ILi128ELb\dELb1E", k) for k in low_rank), low_rank
    for report in reports:
        assert "warning" not in report.lower(), report
        assert max(int(f) for f in re.findall(r"(\d+) bytes stack frame", report)) <= MAX_VARIANT_STACK_BYTES, report
    _check_k_pair_kernels(VARIANTS[name], reports[0])
    _check_k_lane_kernels(VARIANTS[name], reports[0])
    assert not any(_k_lanes(k) for k in re.findall(KERNEL_ENTRY, reports[1]))


def _check_k_pair_kernels(flags, two_consumer_report: str) -> None:
    """VC_SM90_KPAIR_EXP2 builds: fidelity's exp2 loop with one K scale per step (KPAIR) beside the per-tile one,
    head dim 128 V-Smooth, both output types, in the two-consumer file; the point of the pairing: its kernels keep
    the loop in registers (the per-tile loop spills 36 B; docs/kernel-notes.md section 29)."""
    kernels = set(re.findall(KERNEL_ENTRY, two_consumer_report))
    k_pair = {k for k in kernels if _k_pair(k) and not _k_lanes(k)}  # the lane twins: _check_k_lane_kernels
    if "-DVC_SM90_KPAIR_EXP2=1" not in flags:
        assert not k_pair, k_pair
        return
    # the refined kernels (sm90_launch.cu launch_refined: the second V term and the mixed encoding chosen per call),
    # beside the build's own (VLO, CHORD): in builds without a VC_SM90_V_LO / VC_SM90_EXP2_CHORD_EIGHTHS default whose
    # paired-K loop is not the early-QK one, (L, 0), (0, C) and (L, C) of the constants, both output types
    default = (_macro(flags, "VC_SM90_V_LO"), _macro(flags, "VC_SM90_EXP2_CHORD_EIGHTHS"))
    refined = {k for k in k_pair if _lo_chord(k) != default}
    L, C = constants.SM90_V_LO_CHANNELS, constants.MIXED_CHORD_EIGHTHS
    if default == (0, 0) and "-DVC_SM90_STEP256_EARLY_QK=3" not in flags:
        assert sorted(_lo_chord(k) for k in refined) == sorted([(L, 0), (0, C), (L, C)] * 2), refined
    else:
        assert not refined, refined
    k_pair -= refined
    assert len(k_pair) == 2 and all(re.search(r"ILi128ELb0ELb1E", k) and not _low_rank(k) and not _step_mean(k)
                                    for k in k_pair | refined), k_pair
    spills = _spill_stores(two_consumer_report)
    # four partial row maxima (VC_SM90_EXP2_KPAIR_PARTS=4, a variant) keep two more words live: 8 B measured; the
    # early-QK loop (VC_SM90_STEP256_EARLY_QK=3, a variant) keeps the next step's first scores live across the fold: 8 B,
    # 12 B with the chord for every key (split_fe_ch8, kernel-notes 40)
    early_qk = 12 if _macro(flags, "VC_SM90_EXP2_CHORD_EIGHTHS") else 8
    bound = 16 if "-DVC_SM90_EXP2_KPAIR_PARTS=4" in flags else (early_qk if "-DVC_SM90_STEP256_EARLY_QK=3" in flags else 0)
    assert all(spills[k] <= bound for k in k_pair), {k: spills[k] for k in k_pair}
    # the refined kernels of the product-like builds keep their loops in registers too (measured: 0 B)
    assert all(spills[k] <= bound for k in refined), {k: spills[k] for k in refined}


def _macro(flags, name: str) -> int:
    """The integer a -D flag gives the macro (0 without it)."""
    found = [f for f in flags if f.startswith(f"-D{name}=")]
    return int(found[-1].split("=", 1)[1]) if found else 0


def _lo_chord(kernel: str) -> tuple[int, int]:
    """(VLO, CHORD) of a vc_attention_sm90_kernel_lo_chord kernel; (0, 0) for the others."""
    found = re.search(r"ELi(\d+)ELi(\d+)EEEv", kernel)
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def _spill_stores(report: str) -> dict[str, int]:
    """Spill-store bytes per kernel entry of a ptxas -v report."""
    out, kernel = {}, None
    for line in report.splitlines():
        entry = re.search(KERNEL_ENTRY, line)
        if entry:
            kernel = entry.group(1)
        spill = re.search(r"(\d+) bytes spill stores", line)
        if spill and kernel:
            out[kernel], kernel = int(spill.group(1)), None
    return out


def _flags(kernel: str) -> tuple[bool, bool, bool, bool]:
    """The kernel's four template arguments after the stage count (LOWRANK, STEPMEAN, KPAIR, KLANES; the kernels with the
    V residual's second term or the mixed encoding, vc_attention_sm90_kernel_lo_chord, have VLO and CHORD after them)."""
    found = re.search(r"Li\d+ELb([01])ELb([01])ELb([01])ELb([01])(?:ELi\d+ELi\d+)?EEEv", kernel)
    assert found, kernel
    return tuple(group == "1" for group in found.groups())


def _low_rank(kernel: str) -> bool:
    """Whether the kernel has the low-rank V term (LOWRANK)."""
    return _flags(kernel)[0]


def _step_mean(kernel: str) -> bool:
    """Whether the kernel restores one V-Smooth mean per 256-key step (STEPMEAN: means equal in pairs)."""
    return _flags(kernel)[1]


def _k_pair(kernel: str) -> bool:
    """Whether fidelity's exp2 256-key loop takes one K scale per step (KPAIR: VC_SM90_KPAIR_EXP2 builds)."""
    return _flags(kernel)[2]


def _k_lanes(kernel: str) -> bool:
    """Whether the kernel takes K scales per quad lane (KLANES: VCConfig.k_lane_scales)."""
    return _flags(kernel)[3]


def _check_k_lane_kernels(flags, report: str) -> set[str]:
    """The lane-scale kernels (KLANES) of a build: exactly the paired-K loops' (the speed loop's STEPMEAN kernel where
    VC_SM90_KPAIR pairs it, fidelity's KPAIR kernel of VC_SM90_KPAIR_EXP2 builds), both output types, each beside
    its twin with per-step scales and spilling at most two words more. Returns them."""
    kernels = set(re.findall(KERNEL_ENTRY, report))
    lanes = {k for k in kernels if _k_lanes(k)}
    speed = {k for k in kernels if _step_mean(k) and re.search(r"ILi128ELb1ELb1E", k) and not _k_lanes(k)}
    # (the refined kernels, launch_refined, have no lane twins: their (VLO, CHORD) is not the build's own)
    default = (_macro(flags, "VC_SM90_V_LO"), _macro(flags, "VC_SM90_EXP2_CHORD_EIGHTHS"))
    expected = (len(speed) if "-DVC_SM90_KPAIR=1" in flags else 0) + \
        (len({k for k in kernels if _k_pair(k) and not _k_lanes(k) and _lo_chord(k) == default})
         if "-DVC_SM90_KPAIR_EXP2=1" in flags else 0)
    assert len(lanes) == expected, (lanes, expected)
    spills = _spill_stores(report)
    for k in lanes:
        twin = re.sub(r"ELb1((?:ELi\d+ELi\d+)?EEEv)", r"ELb0\1", k)  # the same kernel with one K scale per step
        assert twin in kernels and _step_mean(k) != _k_pair(k) and not _low_rank(k), k
        # four words at most above the twin (measured with the clamp bound, the default since kernel-notes section 35:
        # split_askip's speed lanes kernel 24 B against 12 B, the product's 12 B against 8 B)
        assert spills[k] <= spills[twin] + 16, (k, spills[k], spills[twin])
    return lanes


def test_product_library_splits_the_kernels_between_two_cta_shapes(tmp_path):
    """The product build (backend_sm90.SOURCES with its CUDA_FLAGS): the two-consumer file instantiates only
    head dim 128 with V-Smooth (both P modes), the three-consumer file the other 12 kernels, each kernel
    exactly once between them, with the register pool of its CTA size (168 for 384 threads, 128 for 512)."""
    assert backend_sm90.SOURCES[1:] == (LAUNCHER.name, LAUNCHER_C3.name)
    assert VARIANTS["split"] == list(backend_sm90.CUDA_FLAGS)  # the benchmark's `split` is the product build
    two, three = (_ptxas_report(src, tmp_path / f"{src.stem}.cubin", backend_sm90.CUDA_FLAGS, "(product flags)")
                  for src in (LAUNCHER, LAUNCHER_C3))
    # template arguments: <head dim, ExpCast, V-Smooth, output type, stages>, under the consumer namespace
    args = lambda report, ns: {re.search(r"ILi(\d+)ELb(\d)ELb(\d)E(\w+?)Li", k).groups()
                               for k in re.findall(KERNEL_ENTRY, report) if f"consumers{ns}" in k}
    two_args, three_args = args(two, 2), args(three, 3)
    assert {(d, e, v) for d, e, v, _ in two_args} == {("128", "0", "1"), ("128", "1", "1")}
    assert len(two_args) == 4 and len(three_args) == 12 and not two_args & three_args
    assert {int(r) for r in re.findall(r"Used (\d+) registers", two)} == {168}
    assert {int(r) for r in re.findall(r"Used (\d+) registers", three)} == {128}
    for report in (two, three):
        assert "warning" not in report.lower() and "C7519" not in report, report
    # the Python rule the GPU suites emulate with (backend_sm90.softmax_step_keys) names 256-key steps for
    # exactly the two-consumer kernels of this build: the library's vc_sm90_step_keys, without a GPU
    step256 = "-DVC_SM90_STEP256=1" in backend_sm90.CUDA_FLAGS
    for kernels_args, steps in ((two_args, 256 if step256 else 128), (three_args, 128)):
        for d, e, v, _ in kernels_args:
            config = dataclasses.replace(FIDELITY.without_refinements(), p="expcast" if e == "1" else "exp2",
                                         v="vsmooth" if v == "1" else PLAIN_8BIT.v,
                                         k_scale_rows=128)
            assert backend_sm90.softmax_step_keys(int(d), config) == steps, (d, e, v)
    # the low-rank V term: both P modes x both output types, where backend_sm90 declares it (head dim 128)
    low_rank = {k for k in re.findall(KERNEL_ENTRY, two) if _low_rank(k)}
    assert len(low_rank) == 4 and not any(_low_rank(k) for k in re.findall(KERNEL_ENTRY, three))
    # one mean per 256-key step (speed: ExpCast + V-Smooth at head dim 128, means equal in pairs): bf16, fp16
    step_mean = {k for k in re.findall(KERNEL_ENTRY, two) if _step_mean(k) and not _k_lanes(k)}
    assert len(step_mean) == 2 and all(re.search(r"ILi128ELb1ELb1E", k) for k in step_mean), step_mean
    assert not any(_step_mean(k) for k in re.findall(KERNEL_ENTRY, three))
    # fidelity's exp2 loop with one K scale per step (paired K scales, config.FIDELITY): bf16, fp16, no spills
    assert "-DVC_SM90_KPAIR_EXP2=1" in backend_sm90.CUDA_FLAGS
    _check_k_pair_kernels(backend_sm90.CUDA_FLAGS, two)
    assert not any(_k_pair(k) for k in re.findall(KERNEL_ENTRY, three))
    # K scales per lane (VCConfig.k_lane_scales): the speed and fidelity paired-K kernels' twins, both output types
    lanes = _check_k_lane_kernels(backend_sm90.CUDA_FLAGS, two)
    assert len(lanes) == 4 and backend_sm90.CONSTRAINTS.k_lane_scales
    # the fidelity lanes kernels spill nothing; the speed ones 12 B outside the loop (the clamp bound's Q-row bounds,
    # kernel-notes section 35: no LDL in the trip, bench/sass_loop_mix.py --votes-pass)
    assert all(_spill_stores(two)[k] <= (16 if _step_mean(k) else 0) for k in lanes), {k: _spill_stores(two)[k] for k in lanes}
    assert not any(_k_lanes(k) for k in re.findall(KERNEL_ENTRY, three))
    assert backend_sm90.CONSTRAINTS.v_rank_head_dims == (128,) and backend_sm90.CONSTRAINTS.max_v_rank == 6
    assert max(int(f) for f in re.findall(r"(\d+) bytes stack frame", two)) <= MAX_STACK_BYTES, two
    assert max(int(f) for f in re.findall(r"(\d+) bytes stack frame", three)) <= MAX_VARIANT_STACK_BYTES, three
