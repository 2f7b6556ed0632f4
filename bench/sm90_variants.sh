#!/usr/bin/env bash
# One GPU call for the Hopper kernel's compile-time variants (docs/kernel-notes.md section 8):
# builds every variant as a torch-free shared library in parallel (ptxas -v logs kept), checks each
# against the float64 emulation (18 cases: both P modes + plain 8-bit, odd N, both head dims, both
# layouts, video-like data) and times each with CUDA events at the issue-11 shapes next to cuDNN and
# SageAttention 2.2 (when installed). Kernel time only (the fused prepare, ~2 ms at the Wan shape,
# needs the JIT-built prepare extension; SM90_PREPARE=1 times it too). The table is printed last;
# JSON, SASS and build logs go to $OUT.
#
#   bash bench/sm90_variants.sh            # on the H200, from the repository root; ~4-6 minutes
#   SM90_VARIANTS="base mean" SM90_BUILD_ONLY=1 bash bench/sm90_variants.sh   # CPU: builds + ptxas only
#   SM90_NCU=psmem_mean bash bench/sm90_variants.sh   # + one ncu-profiled launch of that variant
#   SM90_NCU=split SM90_NCU_SOURCE=1 ...  # + its per-instruction samples (bench/sass_stalls.py)
#   SM90_BUILD_ONLY=1 ...; then SM90_REUSE_BUILD=1 ...  # build beside other work, then check + time
#   SM90_SHAPES="1,40,75600,128" ...   # time only these (B,H,N,D) shapes (default: the four issue-11 shapes)
#   SM90_RANK=6 ...   # time V-Smooth with the low-rank V term (head dim 128); SM90_SKIP_CORRECTNESS=1: no gate (lr_* diagnostics)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
BUILD=${SM90_BUILD_DIR:-build/sm90_variants}
mkdir -p "$OUT" "$BUILD"

# name -> extra nvcc flags (the macros are documented where sm90_attention.cuh / p_encoding.cuh define them)
declare -A FLAGS=(
  [base]=""
  [alu]="-DVC_EXPCAST_ALU=1"
  [alu1]="-DVC_EXPCAST_ALU=1 -DVC_EXPCAST_ALU_LINES=1"
  [alu3]="-DVC_EXPCAST_ALU=1 -DVC_EXPCAST_ALU_LINES=3"
  [nopp]="-DVC_SM90_PINGPONG=0"
  [pp]="-DVC_SM90_PINGPONG=1"
  [nomean]="-DVC_SM90_MEAN_MMA=0"
  [descadd]="-DVC_SM90_DESC_ADD=1"
  [d64noov]="-DVC_SM90_D64_OVERLAP=0"
  [noclampcheck]="-DVC_EXPCAST_CLAMP_CHECK=0"
  [pair]="-DVC_SM90_PAIR=1"
  [c3]="-DVC_SM90_CONSUMERS=3"
  [c3s5]="-DVC_SM90_CONSUMERS=3 -DVC_SM90_STAGES_D128=5"
  [c3s6]="-DVC_SM90_CONSUMERS=3 -DVC_SM90_STAGES_D128=6"
  [c3desc]="-DVC_SM90_CONSUMERS=3 -DVC_SM90_DESC_ADD=1"
  [s256]="-DVC_SM90_STEP256=1 -DVC_SM90_STEP256_TURNS=1"
  [s256nt]="-DVC_SM90_STEP256=1 -DVC_SM90_STEP256_TURNS=0"
  [s256e]="-DVC_SM90_STEP256=1 -DVC_SM90_STEP256_TURNS=0 -DVC_SM90_STEP256_EARLY_QK=1"
  [split_em]="-DVC_SM90_SPLIT=1 -DVC_SM90_STEP256=1 -DVC_SM90_STEP256_EARLY_QK=2 -DVC_SM90_SPLIT_SPEED_D128=2 -DVC_SM90_STEP256_MAX_OVERLAP=1"
  [s256nt6]="-DVC_SM90_STEP256=1 -DVC_SM90_STEP256_TURNS=0 -DVC_SM90_STAGES_D128=6"
  [s256desc]="-DVC_SM90_STEP256=1 -DVC_SM90_STEP256_TURNS=1 -DVC_SM90_DESC_ADD=1"
  [split]="-DVC_SM90_SPLIT=1 -DVC_SM90_STEP256=1 -DVC_SM90_STEP256_EARLY_QK=2 -DVC_SM90_SPLIT_SPEED_D128=2 -DVC_SM90_KPAIR=1 -DVC_SM90_KPAIR_EXP2=1"  # the product library (backend_sm90.CUDA_FLAGS)
  [split_st]="-DVC_SM90_SPLIT=1 -DVC_SM90_STEP256=1 -DVC_SM90_STEP256_EARLY_QK=2 -DVC_SM90_SPLIT_SPEED_D128=2 -DVC_SM90_KPAIR=1 -DVC_SM90_KPAIR_EXP2=1 -DVC_SM90_SOFTMAX_TURNS=1"  # split + fidelity's two warpgroups take turns through the exp2 softmax (one on the MUFU pipe at a time)
  [split_kp4]="-DVC_SM90_SPLIT=1 -DVC_SM90_STEP256=1 -DVC_SM90_STEP256_EARLY_QK=2 -DVC_SM90_SPLIT_SPEED_D128=2 -DVC_SM90_KPAIR=1 -DVC_SM90_KPAIR_EXP2=1 -DVC_SM90_EXP2_KPAIR_PARTS=4"  # split + fidelity's paired-K row maxima in four independent parts per row (half the dependency depth)
  [split_nocb]="-DVC_SM90_SPLIT=1 -DVC_SM90_STEP256=1 -DVC_SM90_STEP256_EARLY_QK=2 -DVC_SM90_SPLIT_SPEED_D128=2 -DVC_SM90_KPAIR=1 -DVC_SM90_KPAIR_EXP2=1 -DVC_EXPCAST_CLAMP_BOUND=0"  # split with speed's previous clamp check (row minima; the bound is the default since kernel-notes section 35: loop trip 711 -> 788 at head dim 128, 407 -> 452 at 64)
  [split_ch4]="-DVC_SM90_SPLIT=1 -DVC_SM90_STEP256=1 -DVC_SM90_STEP256_EARLY_QK=2 -DVC_SM90_SPLIT_SPEED_D128=2 -DVC_SM90_KPAIR=1 -DVC_SM90_KPAIR_EXP2=1 -DVC_SM90_EXP2_CHORD_EIGHTHS=4"  # split + the mixed encoding in every exp2 kernel (reference p="mixed"): the last half of each step's keys by the speed chord, half the MUFU (loop trip 992 -> 906 at head dim 128, 489 -> 448 at 64; kernel-notes section 36)
  [split_ch2]="-DVC_SM90_SPLIT=1 -DVC_SM90_STEP256=1 -DVC_SM90_STEP256_EARLY_QK=2 -DVC_SM90_SPLIT_SPEED_D128=2 -DVC_SM90_KPAIR=1 -DVC_SM90_KPAIR_EXP2=1 -DVC_SM90_EXP2_CHORD_EIGHTHS=2"  # the same with the chord for the last quarter (loop trip 992 -> 963)
  [split_ch6]="-DVC_SM90_SPLIT=1 -DVC_SM90_STEP256=1 -DVC_SM90_STEP256_EARLY_QK=2 -DVC_SM90_SPLIT_SPEED_D128=2 -DVC_SM90_KPAIR=1 -DVC_SM90_KPAIR_EXP2=1 -DVC_SM90_EXP2_CHORD_EIGHTHS=6"  # the chord for the last three quarters (loop trip 992 -> 837, 34 MUFU)
  [split_ch8]="-DVC_SM90_SPLIT=1 -DVC_SM90_STEP256=1 -DVC_SM90_STEP256_EARLY_QK=2 -DVC_SM90_SPLIT_SPEED_D128=2 -DVC_SM90_KPAIR=1 -DVC_SM90_KPAIR_EXP2=1 -DVC_SM90_EXP2_CHORD_EIGHTHS=8"  # every key by the chord in fidelity's loop (p="mixed" at 8/8 = the speed encoding with fidelity's means and folds: 759)
  [split_lo16]="-DVC_SM90_SPLIT=1 -DVC_SM90_STEP256=1 -DVC_SM90_STEP256_EARLY_QK=2 -DVC_SM90_SPLIT_SPEED_D128=2 -DVC_SM90_KPAIR=1 -DVC_SM90_KPAIR_EXP2=1 -DVC_SM90_V_LO=16"  # split + the V-Smooth residual's second E4M3 term on 16 channels in fidelity's paired-K kernel (VCConfig.v_lo_channels; operands from the reference prepare: loop trip 992 -> 1063, an m64n16k32 wgmma per k-step; kernel-notes section 36)
  [split_lo32]="-DVC_SM90_SPLIT=1 -DVC_SM90_STEP256=1 -DVC_SM90_STEP256_EARLY_QK=2 -DVC_SM90_SPLIT_SPEED_D128=2 -DVC_SM90_KPAIR=1 -DVC_SM90_KPAIR_EXP2=1 -DVC_SM90_V_LO=32"  # the same on 32 channels (loop trip 1081)
  [split_ch4_lo32]="-DVC_SM90_SPLIT=1 -DVC_SM90_STEP256=1 -DVC_SM90_STEP256_EARLY_QK=2 -DVC_SM90_SPLIT_SPEED_D128=2 -DVC_SM90_KPAIR=1 -DVC_SM90_KPAIR_EXP2=1 -DVC_SM90_EXP2_CHORD_EIGHTHS=4 -DVC_SM90_V_LO=32"  # the mixed encoding (chord 4/8) and the second term on 32 channels together
  [split_ch8_lo32]="-DVC_SM90_SPLIT=1 -DVC_SM90_STEP256=1 -DVC_SM90_STEP256_EARLY_QK=2 -DVC_SM90_SPLIT_SPEED_D128=2 -DVC_SM90_KPAIR=1 -DVC_SM90_KPAIR_EXP2=1 -DVC_SM90_EXP2_CHORD_EIGHTHS=8 -DVC_SM90_V_LO=32"  # fidelity's loop with the speed encoding for every key and the second term on 32 channels
  [split_ch8_lo32s]="-DVC_SM90_SPLIT=1 -DVC_SM90_STEP256=1 -DVC_SM90_STEP256_EARLY_QK=2 -DVC_SM90_SPLIT_SPEED_D128=2 -DVC_SM90_KPAIR=1 -DVC_SM90_KPAIR_EXP2=1 -DVC_SM90_EXP2_CHORD_EIGHTHS=8 -DVC_SM90_V_LO=32 -DVC_SM90_LO_RUN_REGS=0"  # split_ch8_lo32 with the term's running sum in shared memory (the product before kernel-notes 41)
  [split_ch8_lo30]="-DVC_SM90_SPLIT=1 -DVC_SM90_STEP256=1 -DVC_SM90_STEP256_EARLY_QK=2 -DVC_SM90_SPLIT_SPEED_D128=2 -DVC_SM90_KPAIR=1 -DVC_SM90_KPAIR_EXP2=1 -DVC_SM90_EXP2_CHORD_EIGHTHS=8 -DVC_SM90_V_LO=30"  # split_ch8_lo32 on 30 channels with the step's row sums in the term's 32-row block instead of the stage's 8 ones rows: m64n160k32 (kernel-notes 40)
  [split_ch8_lo32x2]="-DVC_SM90_SPLIT=1 -DVC_SM90_STEP256=1 -DVC_SM90_STEP256_EARLY_QK=2 -DVC_SM90_SPLIT_SPEED_D128=2 -DVC_SM90_KPAIR=1 -DVC_SM90_KPAIR_EXP2=1 -DVC_SM90_EXP2_CHORD_EIGHTHS=8 -DVC_SM90_V_LO=32 -DVC_SM90_LO_MERGED=0"  # split_ch8_lo32 with the second term in its own wgmma beside the PV MMA (m64n136 + m64n32 per k-step; the default before kernel-notes section 39 merged them into one m64n168k32)
  [split_ch8_lo16]="-DVC_SM90_SPLIT=1 -DVC_SM90_STEP256=1 -DVC_SM90_STEP256_EARLY_QK=2 -DVC_SM90_SPLIT_SPEED_D128=2 -DVC_SM90_KPAIR=1 -DVC_SM90_KPAIR_EXP2=1 -DVC_SM90_EXP2_CHORD_EIGHTHS=8 -DVC_SM90_V_LO=16"  # the chord for every key and the second term on 16 channels (half its tensor work; m64n152k32)
  [split_ch8_lo16x2]="-DVC_SM90_SPLIT=1 -DVC_SM90_STEP256=1 -DVC_SM90_STEP256_EARLY_QK=2 -DVC_SM90_SPLIT_SPEED_D128=2 -DVC_SM90_KPAIR=1 -DVC_SM90_KPAIR_EXP2=1 -DVC_SM90_EXP2_CHORD_EIGHTHS=8 -DVC_SM90_V_LO=16 -DVC_SM90_LO_MERGED=0"  # the same in two wgmmas (m64n136 + m64n16)
  [split_fe_ch8]="-DVC_SM90_SPLIT=1 -DVC_SM90_STEP256=1 -DVC_SM90_STEP256_EARLY_QK=3 -DVC_SM90_SPLIT_SPEED_D128=2 -DVC_SM90_KPAIR=1 -DVC_SM90_KPAIR_EXP2=1 -DVC_SM90_EXP2_CHORD_EIGHTHS=8"  # split_ch8 on the early-QK loop: whether the early QK pays for the chord's loop before the term's registers
  [split_fe]="-DVC_SM90_SPLIT=1 -DVC_SM90_STEP256=1 -DVC_SM90_STEP256_EARLY_QK=3 -DVC_SM90_SPLIT_SPEED_D128=2 -DVC_SM90_KPAIR=1 -DVC_SM90_KPAIR_EXP2=1"  # split + fidelity's paired-K exp2 kernels on the early-QK loop (the next step's first QK under the fold)
  [split_v4]="-DVC_SM90_SPLIT=1 -DVC_SM90_STEP256=1 -DVC_SM90_STEP256_EARLY_QK=2 -DVC_SM90_SPLIT_SPEED_D128=2 -DVC_SM90_KPAIR=1 -DVC_SM90_KPAIR_EXP2=1 -DVC_SM90_MU_VEC4=1"  # split + the means stored in the folds' order (one LDS.128 per two 8-channel groups)
  [split_s19]="-DVC_SM90_SPLIT=1 -DVC_SM90_STEP256=1 -DVC_SM90_STEP256_EARLY_QK=2 -DVC_SM90_SPLIT_SPEED_D128=2 -DVC_SM90_KPAIR=1"  # the product of session 19: fidelity's exp2 loop reads each tile's K scale (the split_* variants below add to it)
  [split_askip]="-DVC_SM90_SPLIT=1 -DVC_SM90_STEP256=1 -DVC_SM90_STEP256_EARLY_QK=2 -DVC_SM90_SPLIT_SPEED_D128=2 -DVC_SM90_KPAIR=1 -DVC_SM90_ALPHA_SKIP=1"  # split + the rescale polynomial skipped when no row of the warp moved its max
  [split_eqk1]="-DVC_SM90_SPLIT=1 -DVC_SM90_STEP256=1 -DVC_SM90_STEP256_EARLY_QK=1 -DVC_SM90_SPLIT_SPEED_D128=2 -DVC_SM90_KPAIR=1"  # split with fidelity's exp2 loop on the early-QK 256-key loop too (session 18's re-measure of section 18's -8%)
  [split_poly1]="-DVC_SM90_SPLIT=1 -DVC_SM90_STEP256=1 -DVC_SM90_STEP256_EARLY_QK=2 -DVC_SM90_SPLIT_SPEED_D128=2 -DVC_SM90_KPAIR=1 -DVC_SM90_EXP2_POLY=1"  # split + fidelity: one exp2 of every 4 on the FMA pipe (section 5's +14% on today's loop)
  [split_f256]="-DVC_SM90_SPLIT=1 -DVC_SM90_STEP256=1 -DVC_SM90_STEP256_EARLY_QK=2 -DVC_SM90_SPLIT_SPEED_D128=2 -DVC_SM90_KPAIR=1 -DVC_SM90_STEPMEAN_EXP2=1"  # split + fidelity's exp2 loop with one mean per step at segment ends (the int8-vsmooth-exp2-mean256-merged rows)
  [split_k128]="-DVC_SM90_SPLIT=1 -DVC_SM90_STEP256=1 -DVC_SM90_STEP256_EARLY_QK=2 -DVC_SM90_SPLIT_SPEED_D128=2"  # the product before VC_SM90_KPAIR (session 16): a row maximum per 128-key tile
  # the low-rank V term's timing diagnostics (numbers WRONG: time them with SM90_RANK=6 and no correctness gate,
  # SM90_SKIP_CORRECTNESS=1), VC_SM90_LOWRANK_DIAG bits: 1 no row-sum shuffles, 2 no running sums in shared
  # memory, 4 no TMA of the rows, 8 no epilogue term
  [lr_noshfl]="-DVC_SM90_SPLIT=1 -DVC_SM90_STEP256=1 -DVC_SM90_STEP256_EARLY_QK=2 -DVC_SM90_SPLIT_SPEED_D128=2 -DVC_SM90_LOWRANK_DIAG=1"
  [lr_nosmem]="-DVC_SM90_SPLIT=1 -DVC_SM90_STEP256=1 -DVC_SM90_STEP256_EARLY_QK=2 -DVC_SM90_SPLIT_SPEED_D128=2 -DVC_SM90_LOWRANK_DIAG=2"
  [lr_notma]="-DVC_SM90_SPLIT=1 -DVC_SM90_STEP256=1 -DVC_SM90_STEP256_EARLY_QK=2 -DVC_SM90_SPLIT_SPEED_D128=2 -DVC_SM90_LOWRANK_DIAG=4"
  [lr_noepi]="-DVC_SM90_SPLIT=1 -DVC_SM90_STEP256=1 -DVC_SM90_STEP256_EARLY_QK=2 -DVC_SM90_SPLIT_SPEED_D128=2 -DVC_SM90_LOWRANK_DIAG=8"
  [lr_none]="-DVC_SM90_SPLIT=1 -DVC_SM90_STEP256=1 -DVC_SM90_STEP256_EARLY_QK=2 -DVC_SM90_SPLIT_SPEED_D128=2 -DVC_SM90_LOWRANK_DIAG=15"
  [split_desc]="-DVC_SM90_SPLIT=1 -DVC_SM90_STEP256=1 -DVC_SM90_STEP256_EARLY_QK=2 -DVC_SM90_SPLIT_SPEED_D128=2 -DVC_SM90_DESC_ADD=1"  # split + one descriptor per tile, k-steps by an add (loop trip 1052 -> 1015)
  [split_m0]="-DVC_SM90_SPLIT=1 -DVC_SM90_STEP256=1 -DVC_SM90_STEP256_EARLY_QK=2 -DVC_SM90_SPLIT_SPEED_D128=2 -DVC_SM90_STEP_MEAN_DIAG=1"  # timing bound: the speed loop restores no V-Smooth mean (WRONG numbers: SM90_SKIP_CORRECTNESS=1)
  [split_s8]="-DVC_SM90_SPLIT=1 -DVC_SM90_STEP256=1"  # the product of session 8: head dim 128 speed on three consumers
  [split_mpv]="-DVC_SM90_SPLIT=1 -DVC_SM90_STEP256=1 -DVC_SM90_STEP256_EARLY_QK=2 -DVC_SM90_SPLIT_SPEED_D128=2 -DVC_SM90_STEP256_MEAN_PV=1"  # split + the deferred mean restore in the next PV batch
  [split_mpvf]="-DVC_SM90_SPLIT=1 -DVC_SM90_STEP256=1 -DVC_SM90_STEP256_EARLY_QK=2 -DVC_SM90_SPLIT_SPEED_D128=2 -DVC_SM90_STEP256_MEAN_PV=2"  # the same for the exp2 P modes only
  [c3poly1]="-DVC_SM90_CONSUMERS=3 -DVC_SM90_EXP2_POLY=1"
  [c3poly2]="-DVC_SM90_CONSUMERS=3 -DVC_SM90_EXP2_POLY=2"
  [serial]="-DVC_SM90_SERIAL=1"
  [d64noov_nomean]="-DVC_SM90_D64_OVERLAP=0 -DVC_SM90_MEAN_MMA=0"
  [mean]="-DVC_SM90_MEAN_MMA=1"
  [psmem]="-DVC_SM90_P_SMEM=1"
  [psmem_mean]="-DVC_SM90_P_SMEM=1 -DVC_SM90_MEAN_MMA=1"
  [psmem2_mean]="-DVC_SM90_P_SMEM=2 -DVC_SM90_MEAN_MMA=1"
  [poly1_mean]="-DVC_SM90_EXP2_POLY=1 -DVC_SM90_MEAN_MMA=1"
  [psmem2_poly1_mean]="-DVC_SM90_P_SMEM=2 -DVC_SM90_EXP2_POLY=1 -DVC_SM90_MEAN_MMA=1"
  [psmem_mean_nopp]="-DVC_SM90_P_SMEM=1 -DVC_SM90_MEAN_MMA=1 -DVC_SM90_PINGPONG=0"
  [all_poly1_mean]="-DVC_SM90_P_SMEM=2 -DVC_SM90_D64_OVERLAP_ALL=1 -DVC_SM90_EXP2_POLY=1 -DVC_SM90_MEAN_MMA=1"
)
NAMES=${SM90_VARIANTS:-"base alu alu1 alu3 mean psmem psmem_mean psmem2_mean poly1_mean psmem2_poly1_mean psmem_mean_nopp all_poly1_mean"}
for name in $NAMES; do  # an unknown name would build the flag-less kernel under its name: refuse it
  if [[ ! -v "FLAGS[$name]" ]]; then echo "unknown variant '$name' (known: ${!FLAGS[*]})" >&2; exit 2; fi
done
NVCC=${NVCC:-$(command -v nvcc || echo "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc")}
# vc_attention is the repository root: import it through a symlink unless it is installed
if ! python3 -c "import vc_attention" 2>/dev/null; then
  mkdir -p "$BUILD/pkg" && ln -sfn "$PWD" "$BUILD/pkg/vc_attention"
  export PYTHONPATH="$PWD/$BUILD/pkg${PYTHONPATH:+:$PYTHONPATH}"
fi
# the numeric constants shared with the Python spec, as jit.py passes them (kernels/constants.py)
CONSTANTS=$(python3 -c "from vc_attention.kernels.constants import cuda_defines; print(' '.join(cuda_defines()))")

build() {  # name: one nvcc process per variant (16 kernel instantiations each)
  local name=$1
  # SM90_REUSE_BUILD=1: keep a library built by an earlier SM90_BUILD_ONLY call of the same tree
  # (its ptxas log travels beside it in $BUILD, so the summary below has it either way)
  if [[ -n "${SM90_REUSE_BUILD:-}" && -f "$BUILD/sm90_$name.so" ]]; then
    [[ "$OUT" -ef "$BUILD" ]] || cp "$BUILD/build_$name.log" "$OUT/" 2>/dev/null ||
      echo "(no ptxas log kept for $name)" >"$OUT/build_$name.log"
    return 0
  fi
  rm -f "$BUILD/sm90_$name.so"  # a stale library must not pass for a fresh build
  # the product library (split): the three-consumer file links beside the two-consumer one
  local sources=""; [[ "${FLAGS[$name]}" == *VC_SM90_SPLIT=1* ]] && sources=kernels/csrc/sm90_launch_c3.cu
  # shellcheck disable=SC2086
  "$NVCC" -shared -Xcompiler -fPIC -std=c++17 -O3 --expt-relaxed-constexpr -lineinfo -DNDEBUG \
    -gencode=arch=compute_90a,code=sm_90a -Ikernels/csrc $CONSTANTS ${FLAGS[$name]} -Xptxas=-v \
    -o "$BUILD/sm90_$name.so" kernels/csrc/sm90_launch.cu $sources >"$OUT/build_$name.log" 2>&1
  [[ "$OUT" -ef "$BUILD" ]] || cp "$OUT/build_$name.log" "$BUILD/"
}

start=$(date +%s)
for name in $NAMES; do  # at most MAX_JOBS builds at once (default: all; each is one nvcc process)
  while [[ -n "${MAX_JOBS:-}" && $(jobs -rp | wc -l) -ge $MAX_JOBS ]]; do wait -n || true; done
  build "$name" &
done
wait || true
echo "built $(echo $NAMES | wc -w) variants in $(( $(date +%s) - start )) s"
failed=0
for name in $NAMES; do
  log="$OUT/build_$name.log"
  if [[ ! -f "$BUILD/sm90_$name.so" ]]; then
    echo "[$name] BUILD FAILED:"; tail -20 "$log"; failed=1; continue
  fi
  warn=$(grep -c -E "C751[0-9]|C7508|warning" "$log" || true)
  # (no match is not an error: a reused library's log may be the placeholder)
  stack=$({ grep -oE "[0-9]+ bytes stack frame" "$log" || true; } | sort -n | tail -1)
  spill=$({ grep -oE "[0-9]+ bytes spill stores" "$log" || true; } | sort -n | tail -1)
  echo "[$name] ${FLAGS[$name]:-(default)}: worst ${stack:-0 bytes stack frame}, ${spill:-0 bytes spill stores}, $warn ptxas warnings"
done
[[ $failed == 0 ]] || echo "some variants failed to build; continuing with the rest"
[[ -n "${SM90_BUILD_ONLY:-}" ]] && exit 0

# correctness first, one process per variant (in parallel, time-limited): a variant that hangs or
# corrupts its CUDA context cannot take the others down; only passing variants are timed
for name in $([[ -n "${SM90_SKIP_CORRECTNESS:-}" ]] || echo $NAMES); do
  [[ -f "$BUILD/sm90_$name.so" ]] || continue
  timeout -k 10 300 python3 bench/sm90_check.py --lib "$BUILD/sm90_$name.so" --skip-timing --out "$OUT/check_$name" \
    >"$OUT/check_$name.log" 2>&1 &
done
wait || true
timed=()
for name in $NAMES; do
  [[ -f "$BUILD/sm90_$name.so" ]] || continue
  line=$(grep -E "^\[sm90_$name\] correctness" "$OUT/check_$name.log" 2>/dev/null || true)
  if [[ -n "${SM90_SKIP_CORRECTNESS:-}" ]]; then
    echo "[$name] timed without a correctness gate (SM90_SKIP_CORRECTNESS)"; timed+=(--lib "$BUILD/sm90_$name.so")
  elif [[ "$line" =~ correctness:\ ([0-9]+)/([0-9]+)\ ok && "${BASH_REMATCH[1]}" == "${BASH_REMATCH[2]}" ]]; then
    echo "$line"; timed+=(--lib "$BUILD/sm90_$name.so")
  else
    echo "[$name] correctness FAILED or hung (not timed):"; grep -E "FAIL|Error|error" "$OUT/check_$name.log" | head -5
  fi
done
echo "checks done at $(( $(date +%s) - start )) s"
[[ ${#timed[@]} -gt 0 ]] && python3 bench/sm90_check.py "${timed[@]}" --skip-correctness --out "$OUT" --iters "${SM90_ITERS:-10}" \
  --rank "${SM90_RANK:-0}" \
  $([[ -n "${SM90_PREPARE:-}" ]] || echo --no-prepare) \
  $(for shape in ${SM90_SHAPES:-1,40,75600,128 1,32,32768,64 1,32,6144,64 1,12,32760,128}; do echo --shape "$shape"; done)
echo "total $(( $(date +%s) - start )) s"

# optional: SM90_NCU="<variant> ..." profiles one launch of each in $SM90_NCU_MODE (speed by default) at
# (1,8,32768,128) (~1 minute each): the sections' summary plus the stall reasons (cycles a warp spends
# stalled per issued instruction, by reason), largest first
if [[ -n "${SM90_NCU:-}" ]]; then
  for name in $SM90_NCU; do
    ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
      --section ComputeWorkloadAnalysis --section LaunchStats --section InstructionStats \
      --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" -k regex:vc_attention_sm90 -c 1 \
      python3 bench/sm90_check.py --lib "$BUILD/sm90_$name.so" --profile-once "${SM90_NCU_MODE:-speed}" --rank "${SM90_RANK:-0}" >"$OUT/ncu_$name.txt" 2>&1 || true
    echo "[ncu $name ${SM90_NCU_MODE:-speed}]"
    grep -E "SM Frequency|Duration|Issue Slots Busy|Eligible Warps|Issued Warp|No Eligible|Registers Per|Compute \(SM\)" \
      "$OUT/ncu_$name.txt" | head -12
    grep -E "issue_stalled" "$OUT/ncu_$name.txt" | awk '{print $NF, $1}' | sort -rn | head -8
    # SM90_NCU_SOURCE=1: the per-instruction warp-state samples of the same launch (ncu's source page),
    # kept as CSV; bench/sass_stalls.py sums them by opcode and stall reason here and, given the cubin's
    # `nvdisasm -gi` listing (built on any machine with the same flags), by source region
    if [[ -n "${SM90_NCU_SOURCE:-}" ]]; then
      ncu --clock-control none --set full --import-source no -k regex:vc_attention_sm90 -c 1 -f -o "$OUT/ncu_src_$name" \
        python3 bench/sm90_check.py --lib "$BUILD/sm90_$name.so" --profile-once "${SM90_NCU_MODE:-speed}" --rank "${SM90_RANK:-0}" >"$OUT/ncu_src_$name.txt" 2>&1 || true
      ncu -i "$OUT/ncu_src_$name.ncu-rep" --page source --csv --print-source sass >"$OUT/ncu_src_$name.csv" 2>>"$OUT/ncu_src_$name.txt" || true
      python3 bench/sass_stalls.py "$OUT/ncu_src_$name.csv" --top 25 --json "$OUT/stalls_$name.json" | head -60 || true
      gzip -f "$OUT/ncu_src_$name.csv"; rm -f "$OUT/ncu_src_$name.ncu-rep"
    fi
  done
fi

# at most 8 files come back from a device call: keep the timing JSON (sm90_check.json), pack the rest
(cd "$OUT" && shopt -s nullglob && rest=(build_*.log check_* ./*.sass ncu_*.txt ncu_src_*.csv.gz stalls_*.json) && ((${#rest[@]})) &&
  tar czf sm90_variants_logs.tgz "${rest[@]}" && rm -rf "${rest[@]}") || true
