"""Build-time variants of the portable `mma` kernel: named -D flag sets for `extension(variant_flags)`.

The backend runs `default_variant(arch)`; "rows16" (no flags) is the original 16-row layout. The variants exist so one GPU call can test and time
the work splits side by side (bench/mma_variants.py, tests/test_mma_variants_gpu.py); what each
flag does is documented where it is read (kernels/csrc/attn_mma_launch.cuh, attn_mma_wide.cuh,
attn_mma.cuh) and measured in docs/kernel-notes.md.
"""
from __future__ import annotations

VARIANTS: dict[str, tuple[str, ...]] = {
    # 16 query rows per warp, 64-row CTAs, 128-key double buffer (the first layout; not the default)
    "rows16": (),
    # FlashAttention-2 layout: 32 rows per warp in two MMA chains sharing K/V fragments, 128-row
    # CTAs, 64-key cp.async ring of 2 stages, softmax per 64 keys
    "wide": ("-DVC_MMA_WIDE=1",),
    # the same with a 3-stage ring (66 KB shared memory at D=128: Hopper only fits 2+ CTAs)
    "wide-3stages": ("-DVC_MMA_WIDE=1", "-DVC_MMA_STAGES=3"),
    # wide + each 64-key PV partial accumulated in fp16 (V codes shifted by 2^-8 first:
    # kernels/mma_pv_f16.py), folded into the fp32 O by the ALU; numerics differ from the spec,
    # tested against its own emulation
    "wide-pvf16": ("-DVC_MMA_WIDE=1", "-DVC_MMA_PV_F16=1"),
    # the same partial folded by an identity MMA into O (O rescaled only when an offset moved)
    "wide-pvf16mma": ("-DVC_MMA_WIDE=1", "-DVC_MMA_PV_F16=2"),
    # wide + the V-Smooth mean restore once per 128-key tile instead of per 64-key chunk
    "wide-restoretile": ("-DVC_MMA_WIDE=1", "-DVC_MMA_RESTORE_PER_TILE=1"),
    "wide-pvf16mma-restoretile": ("-DVC_MMA_WIDE=1", "-DVC_MMA_PV_F16=2", "-DVC_MMA_RESTORE_PER_TILE=1"),
    # the cp.async copies with lanes along the rows (whole 32-byte sectors per warp instruction)
    "wide-coalesced": ("-DVC_MMA_WIDE=1", "-DVC_MMA_COALESCED_COPY=1"),
    "wide-pvf16mma-restoretile-coalesced": ("-DVC_MMA_WIDE=1", "-DVC_MMA_PV_F16=2", "-DVC_MMA_RESTORE_PER_TILE=1",
                                            "-DVC_MMA_COALESCED_COPY=1"),
    # FP8 mma.sync as two chained f16 MMAs (sm_90a / sm_100a have no FP8 mma.sync: ptxas's own
    # lowering adds each MMA's incoming accumulator with separate FADDs); slower where QMMA is native
    "wide-viaf16": ("-DVC_MMA_WIDE=1", "-DVC_MMA_E4M3_VIA_F16=1"),
    "wide-restoretile-coalesced": ("-DVC_MMA_WIDE=1", "-DVC_MMA_RESTORE_PER_TILE=1", "-DVC_MMA_COALESCED_COPY=1"),
    "wide-restoretile-coalesced-viaf16": ("-DVC_MMA_WIDE=1", "-DVC_MMA_RESTORE_PER_TILE=1", "-DVC_MMA_COALESCED_COPY=1",
                                          "-DVC_MMA_E4M3_VIA_F16=1"),
    # the default builds with the scores converted by one I2FP instead of the two-instruction form
    # (kernel-notes section 18: -70 instructions per chunk in plain 8-bit and fidelity; section 19: -1.5
    # to -3% on the H200, bit-identical)
    "wide-i2fp-restoretile-coalesced-viaf16": ("-DVC_MMA_WIDE=1", "-DVC_MMA_RESTORE_PER_TILE=1", "-DVC_MMA_COALESCED_COPY=1",
                                               "-DVC_MMA_E4M3_VIA_F16=1", "-DVC_MMA_I2FP=1"),
    "wide-i2fp-restoretile-coalesced": ("-DVC_MMA_WIDE=1", "-DVC_MMA_RESTORE_PER_TILE=1", "-DVC_MMA_COALESCED_COPY=1",
                                        "-DVC_MMA_I2FP=1"),
    # the same with the mean restored from float32 mean / v_scale computed by the backend
    # (VC_MMA_MEAN_SCALED: one float2 load per column pair instead of a conversion and two products;
    # kernel-notes section 20: speed -2.3 to -3.5%, fidelity -0.1 to -0.8%, bit-identical): the backend's builds
    # until kernel-notes section 44 (these two and the two pvf16 ones below, the restore inside the PV fold), kept
    # for comparison
    "wide-i2fp-meanscaled-restoretile-coalesced-viaf16": ("-DVC_MMA_WIDE=1", "-DVC_MMA_RESTORE_PER_TILE=1",
                                                          "-DVC_MMA_COALESCED_COPY=1", "-DVC_MMA_E4M3_VIA_F16=1",
                                                          "-DVC_MMA_I2FP=1", "-DVC_MMA_MEAN_SCALED=1"),
    "wide-i2fp-meanscaled-restoretile-coalesced": ("-DVC_MMA_WIDE=1", "-DVC_MMA_RESTORE_PER_TILE=1", "-DVC_MMA_COALESCED_COPY=1",
                                                   "-DVC_MMA_I2FP=1", "-DVC_MMA_MEAN_SCALED=1"),
    # the GeForce build (fp32+fp16 two-level accumulation): the backend's build above with each 64-key PV
    # partial accumulated in fp16 and folded into the fp32 O by the ALU (VC_MMA_PV_F16=1). GeForce Ada /
    # Blackwell run FP8 MMAs with an fp16 accumulator at twice the fp32-accumulator rate, and f16 MMAs with an
    # fp32 accumulator (the identity-MMA fold of VC_MMA_PV_F16=2) at a quarter (Ada whitepaper, RTX 4090); this
    # is SageAttention 2.2's pv_accum_dtype "fp32+fp16" there. -viaf16: its build for the H200 proxy (both the
    # fp32+fp16 defaults until section 44)
    "wide-i2fp-meanscaled-pvf16-restoretile-coalesced": ("-DVC_MMA_WIDE=1", "-DVC_MMA_RESTORE_PER_TILE=1",
                                                         "-DVC_MMA_COALESCED_COPY=1", "-DVC_MMA_I2FP=1",
                                                         "-DVC_MMA_MEAN_SCALED=1", "-DVC_MMA_PV_F16=1"),
    "wide-i2fp-meanscaled-pvf16-restoretile-coalesced-viaf16": ("-DVC_MMA_WIDE=1", "-DVC_MMA_RESTORE_PER_TILE=1",
                                                                "-DVC_MMA_COALESCED_COPY=1", "-DVC_MMA_E4M3_VIA_F16=1",
                                                                "-DVC_MMA_I2FP=1", "-DVC_MMA_MEAN_SCALED=1",
                                                                "-DVC_MMA_PV_F16=1"),
}

# the backend's builds since kernel-notes section 44: the four builds before it with the V-Smooth mean restore after the
# chunk's PV loop (VC_MMA_RESTORE_AFTER, one uniform branch instead of one per column pair in it). Native FP8 (sm_89,
# sm_120a) at every head dim (=1, `-after-`); via f16 (sm_90a, sm_100a) at head dim 64 only (=2, `-after64-`): with =1
# its D=128 INT8 V-Smooth kernels spill 448 / 484 B instead of 80 / 120 B and Wan2.2-14B fidelity measured +0.7%
for _pv in ("", "-pvf16"):
    VARIANTS[f"wide-i2fp-meanscaled{_pv}-restoretile-after-coalesced"] = (
        *VARIANTS[f"wide-i2fp-meanscaled{_pv}-restoretile-coalesced"], "-DVC_MMA_RESTORE_AFTER=1")
    VARIANTS[f"wide-i2fp-meanscaled{_pv}-restoretile-after64-coalesced-viaf16"] = (
        *VARIANTS[f"wide-i2fp-meanscaled{_pv}-restoretile-coalesced-viaf16"], "-DVC_MMA_RESTORE_AFTER=2")
del _pv
# the via-f16 default with the PV MMAs accumulating straight into O (VC_MMA_PV_DIRECT: no per-chunk partial and no fold,
# O rescaled only in a chunk where a row's max moved; the restore after the PV loop at every head dim). Through f16 the
# tensor core's accumulator is fp32, so only the order of the fp32 sums changes; never with native FP8 mma.sync
# (attn_mma_wide.cuh). SASS, one chunk trip without a rescale, sm_90a head dim 128 (docs/kernel-notes.md 45): plain
# 8-bit 980 -> 838 instructions, speed without V-Smooth 988 -> 837
VARIANTS["wide-i2fp-meanscaled-restoretile-after64-pvdirect-coalesced-viaf16"] = (
    *VARIANTS["wide-i2fp-meanscaled-restoretile-after64-coalesced-viaf16"], "-DVC_MMA_PV_DIRECT=1")
# the same except in the head-dim-64 kernels without V-Smooth (=2): the via-f16 default since section 45. H100, total ms
# against the build without it (bench/results/nvidia-h100-mma-pv-direct.json): Wan2.1-1.3B / Wan2.2-14B fidelity
# 17.95 / 301.73 -> 16.30 / 276.57, speed 16.68 / 280.47 -> 15.42 / 261.20, plain 8-bit 14.95 / 259.53 -> 14.51 /
# 249.50; head dim 64 fidelity 26.30 -> 26.21, speed 25.51 -> 24.45, but plain 8-bit 22.95 -> 25.12, which =2 leaves out
VARIANTS["wide-i2fp-meanscaled-restoretile-after64-pvdirect2-coalesced-viaf16"] = (
    *VARIANTS["wide-i2fp-meanscaled-restoretile-after64-coalesced-viaf16"], "-DVC_MMA_PV_DIRECT=2")

# the head-dim-64 kernels bounded to three CTAs per SM, Q re-read from shared memory (VC_MMA_D64_MIN_BLOCKS=3): they take
# 209-254 registers unbounded (two CTAs, 8 warps per SM) and 168 with 4-88 B of spills bounded; head dim 128 is the same
# machine code. The via-f16 default, the native-FP8 build and the GeForce build with it. H100, head dim 64, total ms
# (bench/results/nvidia-h100-mma-candidates-d64.json; docs/kernel-notes.md 46): via f16 fidelity 26.07 -> 24.74, speed
# 24.47 -> 23.85, plain 8-bit 22.88 -> 23.50; native FP8 28.94 -> 27.67 / 27.46 -> 27.35 / 27.13 -> 26.14; GeForce 26.45 ->
# 26.73 / 26.66 -> 26.89 / 23.83 -> 25.44
VARIANTS["wide-i2fp-meanscaled-restoretile-after64-pvdirect2-d64x3-coalesced-viaf16"] = (
    *VARIANTS["wide-i2fp-meanscaled-restoretile-after64-pvdirect2-coalesced-viaf16"], "-DVC_MMA_D64_MIN_BLOCKS=3")
for _pv in ("", "-pvf16"):
    VARIANTS[f"wide-i2fp-meanscaled{_pv}-restoretile-after-d64x3-coalesced"] = (
        *VARIANTS[f"wide-i2fp-meanscaled{_pv}-restoretile-after-coalesced"], "-DVC_MMA_D64_MIN_BLOCKS=3")
del _pv
# the bound on the head-dim-64 V-Smooth kernels only (VC_MMA_D64_VSMOOTH_MIN_BLOCKS=3, Q from shared memory there): the
# via-f16 fp32 default since section 46, its fidelity and speed kernels those of -d64x3- and every other kernel the
# -pvdirect2- build's, machine code for machine code (tests/test_mma_d64_bound_sass.py)
VARIANTS["wide-i2fp-meanscaled-restoretile-after64-pvdirect2-d64vs3-coalesced-viaf16"] = (
    *VARIANTS["wide-i2fp-meanscaled-restoretile-after64-pvdirect2-coalesced-viaf16"], "-DVC_MMA_D64_VSMOOTH_MIN_BLOCKS=3")
# the V-Smooth mean restore as TF32 MMAs over 8 restores (VC_MMA_RESTORE_MMA=1; docs/kernel-notes.md 46), the via-f16
# default's and the native-FP8 build's: measured slower (H100, fidelity, Wan2.1-1.3B 16.42 -> 16.68 ms via f16, head dim
# 64 26.07 -> 26.74; native 18.44 -> 18.35 / 28.94 -> 28.44), kept for comparison
VARIANTS["wide-i2fp-meanscaled-restoretile-after64-pvdirect2-restoremma-coalesced-viaf16"] = (
    *VARIANTS["wide-i2fp-meanscaled-restoretile-after64-pvdirect2-coalesced-viaf16"], "-DVC_MMA_RESTORE_MMA=1")
VARIANTS["wide-i2fp-meanscaled-restoretile-after-restoremma-coalesced"] = (
    *VARIANTS["wide-i2fp-meanscaled-restoretile-after-coalesced"], "-DVC_MMA_RESTORE_MMA=1")

# V^T given to the kernel as the codes' f16 values (VC_MMA_V_F16, kernels/mma_v_f16.py): no per-warp conversion of V
# fragments (64 of the 129 F2FP of a head-dim-64 warp chunk via f16, 128 at 128; docs/kernel-notes.md 47), twice V's
# shared memory and L2 bytes; bit-identical to the build it extends. Via f16 only (the f16 MMAs' B operand)
VARIANTS["wide-i2fp-meanscaled-restoretile-after64-pvdirect2-d64vs3-vf16-coalesced-viaf16"] = (
    *VARIANTS["wide-i2fp-meanscaled-restoretile-after64-pvdirect2-d64vs3-coalesced-viaf16"], "-DVC_MMA_V_F16=1")
VARIANTS["wide-i2fp-meanscaled-restoretile-after64-pvdirect2-vf16-coalesced-viaf16"] = (
    *VARIANTS["wide-i2fp-meanscaled-restoretile-after64-pvdirect2-coalesced-viaf16"], "-DVC_MMA_V_F16=1")
VARIANTS["wide-i2fp-meanscaled-restoretile-after64-pvdirect2-d64x3-vf16-coalesced-viaf16"] = (
    *VARIANTS["wide-i2fp-meanscaled-restoretile-after64-pvdirect2-d64x3-coalesced-viaf16"], "-DVC_MMA_V_F16=1")
# the same with P's codes unpacked by shifts and masks instead of F2FP (VC_MMA_P_ALU_UNPACK: the MMAs see 2^-8 P, O and
# the row sums alike; V's keys paired (0, 2), (1, 3)): 65 -> 32 F2FP per head-dim-64 warp chunk, ~43 ALU instructions more
VARIANTS["wide-i2fp-meanscaled-restoretile-after64-pvdirect2-d64vs3-vf16-palu-coalesced-viaf16"] = (
    *VARIANTS["wide-i2fp-meanscaled-restoretile-after64-pvdirect2-d64vs3-vf16-coalesced-viaf16"], "-DVC_MMA_P_ALU_UNPACK=1")

# the f16 V only in the head-dim-128 INT8 V-Smooth kernels (VC_MMA_V_F16=2): -vf16- timed faster there and slower at head
# dim 64 and in plain 8-bit (H100, docs/kernel-notes.md 48: Wan2.1-1.3B fidelity 16.62 -> 16.17 ms, speed 15.53 -> 15.10,
# plain 8-bit 14.76 -> 16.25; head dim 64 fidelity 24.76 -> 25.16); every other kernel is the -d64vs3- build's
VARIANTS["wide-i2fp-meanscaled-restoretile-after64-pvdirect2-d64vs3-v128f16-coalesced-viaf16"] = (
    *VARIANTS["wide-i2fp-meanscaled-restoretile-after64-pvdirect2-d64vs3-coalesced-viaf16"], "-DVC_MMA_V_F16=2")

# the default with a 3-stage cp.async ring (VC_MMA_STAGES=3): section 10 timed plain 8-bit 9-17% faster with it on the
# H200 in the first wide layout, left out then because two head-dim-128 CTAs of it do not fit an Ada SM's 100 KB; the
# via-f16 build runs only on Hopper / datacenter Blackwell (228 KB). Timed on today's kernels (H100, kernel-notes 49):
# speed mode 1-5% faster, fidelity and plain 8-bit 2-10% slower, hence the per-kernel depths below
VARIANTS["wide-i2fp-meanscaled-restoretile-after64-pvdirect2-d64vs3-v128f16-s3-coalesced-viaf16"] = (
    *VARIANTS["wide-i2fp-meanscaled-restoretile-after64-pvdirect2-d64vs3-v128f16-coalesced-viaf16"], "-DVC_MMA_STAGES=3")

# the 3-stage ring in the head-dim-64 kernels only (VC_MMA_D64_STAGES=3): its head-dim-64 kernels are -s3-'s, the others
# the default's (-s3- lost plain 8-bit at 64 by 10%, kernel-notes 49: no candidate; tests/test_mma_stages_per_kernel_sass.py
# keeps it as the head-dim-64 rule's check)
VARIANTS["wide-i2fp-meanscaled-restoretile-after64-pvdirect2-d64vs3-v128f16-d64s3-coalesced-viaf16"] = (
    *VARIANTS["wide-i2fp-meanscaled-restoretile-after64-pvdirect2-d64vs3-v128f16-coalesced-viaf16"], "-DVC_MMA_D64_STAGES=3")

# the 3-stage ring in the ExpCast (speed-mode) kernels only (VC_MMA_EXPCAST_STAGES=3): -s3- timed speed mode 1-5%
# faster at head dim 128 and fidelity / plain 8-bit 2-3% slower (H100, docs/kernel-notes.md 49); its ExpCast kernels
# are -s3-'s, the others the default's
VARIANTS["wide-i2fp-meanscaled-restoretile-after64-pvdirect2-d64vs3-v128f16-xs3-coalesced-viaf16"] = (
    *VARIANTS["wide-i2fp-meanscaled-restoretile-after64-pvdirect2-d64vs3-v128f16-coalesced-viaf16"], "-DVC_MMA_EXPCAST_STAGES=3")
# and a 4-stage ring in the head-dim-64 fidelity kernels (VC_MMA_D64_VSMOOTH_STAGES=4; the ExpCast rule comes first):
# 4 stages timed head-dim-64 fidelity 2.6% faster, plain 8-bit 10% slower
VARIANTS["wide-i2fp-meanscaled-restoretile-after64-pvdirect2-d64vs3-v128f16-xs3-d64vss4-coalesced-viaf16"] = (
    *VARIANTS["wide-i2fp-meanscaled-restoretile-after64-pvdirect2-d64vs3-v128f16-xs3-coalesced-viaf16"],
    "-DVC_MMA_D64_VSMOOTH_STAGES=4")

# the next chunk's copy issued after the QK MMAs (VC_MMA_LATE_COPY, -latecopy-), the K scale loaded a chunk ahead
# (VC_MMA_K_SCALE_AHEAD, -kahead-), and both, on the via-f16 default: the loop top's stall samples at head dim 64
# (docs/kernel-notes.md 50); every kernel, the same output bit for bit
_XS = "wide-i2fp-meanscaled-restoretile-after64-pvdirect2-d64vs3-v128f16-xs3-d64vss4"
VARIANTS[f"{_XS}-latecopy-coalesced-viaf16"] = (*VARIANTS[f"{_XS}-coalesced-viaf16"], "-DVC_MMA_LATE_COPY=1")
VARIANTS[f"{_XS}-kahead-coalesced-viaf16"] = (*VARIANTS[f"{_XS}-coalesced-viaf16"], "-DVC_MMA_K_SCALE_AHEAD=1")
VARIANTS[f"{_XS}-latecopy-kahead-coalesced-viaf16"] = (*VARIANTS[f"{_XS}-latecopy-coalesced-viaf16"], "-DVC_MMA_K_SCALE_AHEAD=1")
# per-stage mbarriers instead of the per-chunk barrier in the kernels with 3+ stages (VC_MMA_MBAR_RING, -mbar-: the
# ExpCast and head-dim-64 fidelity kernels of the default), and with every other kernel on a 3-stage ring for it (-mbar3-)
VARIANTS[f"{_XS}-mbar-coalesced-viaf16"] = (*VARIANTS[f"{_XS}-coalesced-viaf16"], "-DVC_MMA_MBAR_RING=1")
VARIANTS[f"{_XS}-mbar3-coalesced-viaf16"] = (*VARIANTS[f"{_XS}-mbar-coalesced-viaf16"], "-DVC_MMA_STAGES=3")
# the row sums of the head-dim-64 kernels without V-Smooth from f16 adds of the unpacked P, each thread its keys'
# share, the quad's added at the output (VC_MMA_ROW_SUM_ADD, -rsadd-): no ones-column MMA (docs/kernel-notes.md 51)
VARIANTS[f"{_XS}-rsadd-coalesced-viaf16"] = (*VARIANTS[f"{_XS}-coalesced-viaf16"], "-DVC_MMA_ROW_SUM_ADD=1")
# and also the head-dim-64 V-Smooth kernels (=2, -rsadd2-: the quad's shares added at each mean restore)
VARIANTS[f"{_XS}-rsadd2-coalesced-viaf16"] = (*VARIANTS[f"{_XS}-coalesced-viaf16"], "-DVC_MMA_ROW_SUM_ADD=2")

# variants under measurement for adoption: CI compiles them for every arch of their kind, as the defaults (the others
# only for sm_90a, where they were timed: tests/test_cuda_compile.py)
CANDIDATES: tuple[str, ...] = (f"{_XS}-latecopy-kahead-coalesced-viaf16",)

# the targets without FP8 mma.sync (ptxas lowers it to two f16 HMMAs plus FADDs): the H200 and the B200
VIA_F16_ARCHS = ("9.0a", "10.0a")


PV_ACCUMS = ("fp32", "fp32+fp16")  # how the PV products accumulate (SageAttention 2.2's names for the same choice)


def default_variant(arch: str, pv_accum: str = "fp32") -> str:
    """The build the `mma` backend runs for a target arch: the FlashAttention-2 layout with whole-sector
    copies, the V-Smooth mean restored once per 128-key tile (with V-Smooth segments, once per segment) from
    float32 mean / v_scale (section 20: speed -2.3 to -3.5%, fidelity -0.1 to -0.8%, bit-identical) and the
    scores converted by one I2FP, plus the FP8 MMA through f16 where FP8 mma.sync is not native. Measured on
    the H200 against the 16-row layout (docs/kernel-notes.md section 17): Wan2.2-14B speed 413 -> 321 ms; on
    sm_89 / sm_120a (RTX) it is the same layout with native FP8 MMAs, not measured there.

    The mean restore runs after the chunk's PV loop (VC_MMA_RESTORE_AFTER, docs/kernel-notes.md sections 43-44;
    H100, total ms, Wan2.1-1.3B / Wan2.2-14B / head dim 64): with native FP8 MMAs (the RTX code's shape, timed as
    the native-FP8 build on the H100) at every head dim, fidelity 19.74 / 331.48 / 31.37 -> 19.27 / 323.69 / 29.26,
    speed 18.60 / 309.74 / 29.06 -> 18.36 / 309.91 / 28.10 (the `-after-` names); through f16 at head dim 64 only
    (the `-after64-` names), where it took fidelity 29.20 -> 27.33 and speed 27.04 -> 25.42 while at head dim 128
    fidelity went 306.35 -> 308.56 at Wan2.2-14B and the INT8 V-Smooth kernels spilled 448 / 484 B instead of
    80 / 120 B. On sm_90a (fp32 PV) the `-after64-` build's head-dim-64 / 128 cubins are, byte for byte, those of the
    timed build with =1 / without the flag. Plain 8-bit has no restore: unchanged.

    The via-f16 build with fp32 PV (the H100 / H200 / B200 one) accumulates the PV MMAs straight into O
    (VC_MMA_PV_DIRECT=2, the `-pvdirect2-` name: no per-chunk partial and fold, O rescaled only in a chunk where a row's
    max moved, the restore after the PV loop; every kernel but the head-dim-64 ones without V-Smooth, where it measured
    slower; docs/kernel-notes.md section 45): H100, against SageAttention 2.2's portable kernel in the same run,
    Wan2.1-1.3B / Wan2.2-14B fidelity 1.00x / 0.99x -> 1.10x / 1.08x, speed 1.08x / 1.06x -> 1.16x / 1.14x.

    Its head-dim-64 V-Smooth kernels run three CTAs per SM (VC_MMA_D64_VSMOOTH_MIN_BLOCKS=3, Q from shared memory there;
    the `-d64vs3-` name, docs/kernel-notes.md section 46): H100, head dim 64, fidelity 26.07 -> 24.74 ms, speed 24.47 ->
    23.85 (0.98x / 1.04x -> 1.03x / 1.07x SageAttention 2.2's portable kernel); plain 8-bit measured slower bounded
    and the GeForce build slower in every mode, so neither takes it.

    Its head-dim-128 INT8 V-Smooth kernels (fidelity, speed) read V as the codes' f16 values, made once per call
    (VC_MMA_V_F16=2, the `-v128f16-` name, kernels/mma_v_f16.py; docs/kernel-notes.md 48): no per-warp V unpack for
    twice V's shared memory; the same output bit for bit. H100, against SageAttention 2.2's portable kernel in the same
    run (bench/results/nvidia-h100-mma-v128f16-*.json): Wan2.1-1.3B fidelity 1.10x -> 1.15x, speed 1.17x -> 1.21x;
    Wan2.2-14B fidelity 1.08x -> 1.10x, speed 1.14x -> 1.15x; plain 8-bit and head dim 64 the same kernels. Every other
    kernel keeps the codes: the f16 V timed slower there (the `-vf16-` build: head dim 64 +0.4 to +3%, plain 8-bit at
    head dim 128 +10%).

    Its ring depth is per kernel (attn_mma_wide.cuh's wide_stages; the `-xs3-d64vss4-` name, docs/kernel-notes.md 49-50):
    three chunk stages in the ExpCast (speed) kernels (VC_MMA_EXPCAST_STAGES=3), four in the head-dim-64 V-Smooth
    (fidelity) kernels (VC_MMA_D64_VSMOOTH_STAGES=4), two elsewhere. H100, against SageAttention 2.2's portable kernel in
    the same run (bench/results/nvidia-h100-mma-xs3-*.json): speed Wan2.2-14B 1.149x -> 1.170x, Wan2.1-1.3B 1.203x ->
    1.218x, head dim 64 1.080x -> 1.090x; head-dim-64 fidelity 1.031x -> 1.047x; plain 8-bit and fidelity at head dim
    128 the same machine code (tests/test_mma_stages_per_kernel_sass.py). Session 39's run of the same builds agreed
    (bench/results/nvidia-h100-mma-stages-*.json: a third stage slower for fidelity and plain 8-bit, a fourth faster
    for head-dim-64 fidelity only).

    pv_accum "fp32+fp16" (default_pv_accum: GeForce parts): each 64-key PV partial accumulates in fp16 and the
    ALU folds it into the fp32 O (VC_MMA_PV_F16=1, on V codes shifted by 2^-8: kernels/mma_pv_f16.py)."""
    if pv_accum not in PV_ACCUMS:
        raise ValueError(f"pv_accum must be one of {', '.join(PV_ACCUMS)}, got {pv_accum!r}.")
    pv = "-pvf16" if pv_accum == "fp32+fp16" else ""
    if arch in VIA_F16_ARCHS:
        # fp32 PV: straight into O (VC_MMA_PV_DIRECT, docs/kernel-notes.md section 45), the head-dim-64 V-Smooth
        # kernels at three CTAs per SM (section 46), V in f16 for the head-dim-128 INT8 V-Smooth kernels (section 48),
        # a 3-stage ring in the ExpCast kernels and a 4-stage one in the head-dim-64 fidelity kernels (sections 49-50)
        return f"wide-i2fp-meanscaled{pv}-restoretile-after64{'' if pv else '-pvdirect2-d64vs3-v128f16-xs3-d64vss4'}-coalesced-viaf16"
    return f"wide-i2fp-meanscaled{pv}-restoretile-after-coalesced"


# GeForce Ada (8.9) and consumer Blackwell (12.x) run FP8 MMAs with an fp16 accumulator at twice the rate of
# an fp32 accumulator (Ada whitepaper: RTX 4090 FP8 660.6 vs 330.3 dense TFLOPS; SageAttention 2.2 runs
# pv_accum_dtype "fp32+fp16" on sm89 / sm120 for it); the data-centre and professional parts (L40S, RTX 6000
# Ada, H100 / H200, B200) have one rate for both, where the fp16 partial only adds its shift and fold
GEFORCE_FP16_ACCUM_MAJORS = (8, 12)
PV_ACCUM_ENV = "VC_ATTENTION_MMA_PV_ACCUM"


def default_pv_accum(arch: str, device_name: str | None, override: str | None = None) -> str:
    """The PV accumulation the backend runs: `override` (the VC_ATTENTION_MMA_PV_ACCUM setting) if given,
    else "fp32+fp16" on a GeForce GPU of an arch whose fp32-accumulator FP8 rate is halved, else "fp32".
    device_name None (a cross-build through VC_ATTENTION_ARCH): "fp32"."""
    if override:
        if override not in PV_ACCUMS:
            raise ValueError(f"{PV_ACCUM_ENV}={override!r}: use one of {', '.join(PV_ACCUMS)}, or unset it.")
        return override
    major = int(arch.split(".")[0])
    geforce = device_name is not None and "geforce" in device_name.lower()
    return "fp32+fp16" if geforce and major in GEFORCE_FP16_ACCUM_MAJORS else "fp32"


def flags(name: str) -> tuple[str, ...]:
    """The -D flags of a named variant; ValueError names the known ones."""
    if name not in VARIANTS:
        raise ValueError(f"unknown mma kernel variant {name!r}; known: {', '.join(VARIANTS)}.")
    return VARIANTS[name]
