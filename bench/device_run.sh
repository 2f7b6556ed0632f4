#!/usr/bin/env bash
# The GPU run that produces every published number and runs every GPU test:
#   bash bench/device_run.sh [STAGE ...]      (default: every stage, in this order)
# stages: build   JIT-build every extension (first use prints progress)
#         tests   the whole `gpu` pytest tier but the portable variant matrix (4 workers, junit XML), then the real-host
#                 tier when a ComfyUI checkout is there
#         variant_tests the portable kernel's variant builds (twelve at once) and their matrix against the emulation
#                 (tests/test_mma_variants_gpu.py; with `tests` they outgrew one 600 s call)
#         bench   `vc-attention bench --save`: attention kernels + grouping at every shape
#         e2e     `vc-attention bench --e2e --save`: the Wan 14B forward (diffusers), SDPA / SageAttention / the node's three presets
#         grouping bench/grouping_bench.py: the torch k-means path vs the fused kernels, share of a speed call
#         comfyui `vc-attention bench --comfyui PATH --comfyui-rounds 2 --save`: sampling in real ComfyUI, default
#                 attention vs `--use-sage-attention` vs our node's presets, every mode twice, interleaved (~5 min)
#         within  (not in the default list) the within-cluster bins (docs/kernel-notes.md 33): their GPU tests, their rel-L2
#                 on the real kernels beside SageAttention 2.2 and their grouping / reuse times
#                 (bench/grouping_fidelity_gpu.py --kernel-bins), the speed kernel on video-like data with and without
#                 them (bench/segments_bench.py --within-bins 0,8)
#         clamp   (not in the default list) the clamp-bound variants beside the product: the Hopper kernel
#                 (bench/sm90_variants.sh, split_nocb vs split) and the portable one (bench/mma_variants.py,
#                 V+-DVC_MMA_CLAMP_BOUND=0 vs V): the bound is the default since kernel-notes section 35
#         lanes   (not in the default list) K scales per MMA lane (VCConfig.k_lane_scales, docs/kernel-notes.md 34): their
#                 GPU tests with the paired-K tiers they touch, then bench/k_lanes_bench.py (time beside the presets and
#                 SageAttention 2.2 at Wan2.2-14B / Wan2.1-1.3B, rel-L2 on the video-like data at 32,760 / 75,600)
#         sums    (not in the default list) the step's row sums beside the second V term (VLO = 30, kernel-notes 40):
#                 split_ch8_lo32 (the product's fidelity kernel until kernel-notes 42) and split_ch8_lo30 (30 channels + 2 sum rows, n = 160)
#                 gated against their specs and timed at the Wan / HunyuanVideo shapes, then both rel-L2 on the
#                 video-like data beside SageAttention 2.2 (bench/mixed_fidelity_gpu.py)
#         lorun   (not in the default list) the second term's running sum in registers (VC_SM90_LO_RUN_REGS, the default
#                 since kernel-notes 41) against shared memory: split_ch8_lo32s (shared) beside split_ch8_lo32 and
#                 split_ch8_lo30, gated, timed at the Wan / HunyuanVideo shapes, and the two lo32 builds' output bits
#                 (bench/lib_identity.py)
#         ratio   (not in the default list) issue 10's speed / fidelity error ratio on the video-like data: speed mode with
#                 other groupings and with lane scales beside the fidelity preset, timed at the Wan shapes beside cuDNN /
#                 SageAttention 2.2 (bench/k_lanes_bench.py --rows; $RATIO_ROWS)
#         restore (not in the default list) the portable kernel's V-Smooth mean restore after the PV loop
#                 (VC_MMA_RESTORE_AFTER, docs/kernel-notes.md 43): its GPU tests, then both H100/H200 builds with and
#                 without it beside SageAttention 2.2's portable kernel (bench/mma_variants.py)
#         adopted (not in the default list) the portable default builds before and after VC_MMA_RESTORE_AFTER
#                 (docs/kernel-notes.md 44): the H100/H200 build, the RTX build and the GeForce build (fp16 partials)
#                 beside SageAttention 2.2's portable kernel (bench/mma_variants.py)
#         direct  (not in the default list) the via-f16 build with PV straight into O (VC_MMA_PV_DIRECT, kernel-notes 45): its
#                 GPU tests (=1 and =2), the backend suite, then the build before it, the default (=2) and the GeForce
#                 build beside SageAttention 2.2's portable kernel
#         spread  (not in the default list) bench/fidelity_spread.py: fidelity's paired-K exp2 loop against the
#                 unpaired one and speed, in rotating rounds, with the SM clock / power after each (kernel-notes 35)
#         mixed   (not in the default list) fidelity's variants of docs/kernel-notes.md 36, one device call each with
#         lo      `lo` right after it on the warm machine: `mixed` builds all eight libraries and times the mixed encoding
#                 (reference p="mixed"; split_ch4 / ch6 / ch8) beside the product at the issue-11 shapes; `lo` times the
#                 V residual's second term (v_lo_channels; split_lo16 / lo32, ch4_lo32, ch8_lo32) at the Wan shapes,
#                 each gated against its spec (bench/sm90_variants.sh), then every variant's rel-L2 on the video-like
#                 data, with and without lane scales, beside SageAttention 2.2 and the product's modes
#                 (bench/mixed_fidelity_gpu.py)
#         adopt   (not in the default list) `mixed` + `lo` cut to one call: the five candidates of kernel-notes 36's
#                 adoption rule, their rel-L2 at 32,760 / 75,600 (no lanes), then their times at the Wan shapes
#         merged  (not in the default list) the V residual's second term inside the PV MMA (VC_SM90_LO_MERGED, kernel-notes
#                 39): split_ch8, ch8_lo32 / lo16 (merged, the default) and their two-wgmma builds (x2) timed at the Wan
#                 shapes, gated against the spec, the merged output bits against the two-wgmma builds' (bench/lib_identity.py),
#                 lo16's rel-L2 beside lo32's
#         variants (not in the default list) the portable kernel's build-time variants side by side with
#                 SageAttention 2.2's portable kernel (bench/mma_variants.py; $MMA_VARIANTS), the prepare
#                 extension's variants (bench/prepare_variants.py), then one ncu
#                 launch per kernel of $PROFILE_TARGETS (bench/kernel_profile.py; ncu on PATH): the JSON
#                 files come back in $OUT, the raw ncu CSV in logs.tgz
# Each --save rewrites its sections of bench/results/<gpu>.json, then BENCHMARKS.md and the README
# headline (`vc-attention bench --all --save` does bench + e2e + comfyui in one process).
# Run from the repo root on the GPU machine. Peers and optional packages travel in .whl/ (ignored by
# git): wheels (SageAttention 2.2 from ../shared/anchors, diffusers + importlib_metadata for the e2e
# model) are installed into /tmp/site, and an unpacked .whl/site/ (ComfyUI's extra requirements) is put
# on PYTHONPATH as it is. A ComfyUI checkout in .comfy/ (ignored; or $COMFYUI_PATH) enables the
# real-host tier and the ComfyUI sampling section. Logs and the results land in $OUT. A device call
# is limited to 10 minutes: run `build tests bench` and `e2e comfyui` as two calls when the whole run does not fit.
set -u -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/vc_out}
mkdir -p "$OUT"
# .whl-peers/ (also ignored): the peers only the bench stages need (SageAttention 2.2's 22 MB wheel), so
# that a tests-only call can leave them behind; .whl-front/ (ignored): ComfyUI's frontend wheel (~20 MB),
# which only the tests stage needs (the real server's workflow-template check), so that a bench call can
# leave it behind; .whl-host/ (ignored, ~8 MB): ComfyUI's requirements the GPU image lacks (SQLAlchemy,
# alembic, pydantic, blake3, simpleeval and what they need) for the real-host tier. PyAV (35 MB) does not
# fit beside them: the tests stage sets VC_PYAV_PLACEHOLDER=1 (tests/comfyui_pyav.py). A call carries at
# most 64 MiB: carry .whl .whl-host .whl-front .comfy for tests and .whl .whl-peers .comfy for the bench
# stages.
# VC_DEVICE_DRY_RUN=1: every step prints its command to $OUT/steps.txt instead of running it, and nothing is installed
# or measured (tests/test_device_run_names.py checks each stage's variant, target and test names that way, on the CPU,
# before a scarce device call finds a typo)
dry=${VC_DEVICE_DRY_RUN:-0}
for dir in .whl .whl-peers .whl-front .whl-host; do
  if [ "$dry" = 0 ] && compgen -G "$dir/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$dir"/*.whl
  fi
done
# the repo root is the package: a link named vc_attention makes it importable without installing
mkdir -p /tmp/pkgs && ln -sfn "$PWD" /tmp/pkgs/vc_attention
export PYTHONPATH=/tmp/pkgs:/tmp/site:$PWD/.whl/site
if [ -z "${COMFYUI_PATH:-}" ] && [ -d .comfy/comfy ]; then export COMFYUI_PATH=$PWD/.comfy; fi

if [ "$dry" = 0 ]; then
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/env.txt"
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version())" | tee -a "$OUT/env.txt"
fi

step() {  # step NAME SECONDS COMMAND...: each step has its own limit so one slow step cannot starve the rest
  local name=$1 secs=$2; shift 2
  if [ "$dry" != 0 ]; then printf '[%s] DRY' "$name" >> "$OUT/steps.txt"; printf ' %q' "$@" >> "$OUT/steps.txt"; echo >> "$OUT/steps.txt"; return 0; fi
  local t0=$SECONDS
  timeout "$secs" "$@" > "$OUT/$name.log" 2>&1
  echo "[$name] rc=$? in $((SECONDS - t0)) s" | tee -a "$OUT/steps.txt"
}
deadline=$((SECONDS + 600))  # a stage that budgets its steps sets its own
room() {  # room SECONDS NAME: whether the stage's $deadline leaves SECONDS for step NAME (else it is logged as skipped)
  [ $((deadline - SECONDS)) -ge "$1" ] || { echo "[$2] skipped: $((deadline - SECONDS)) s left" | tee -a "$OUT/steps.txt"; false; }
}
# variant_rows PREFIX VARIANTS K: portable builds VARIANTS (comma-separated) built, timed beside SageAttention 2.2's
# portable kernel at head dim 64, Wan2.1-1.3B and Wan2.2-14B ($OUT/PREFIX_d64, _wan, _wan14), then their slice of the
# variant tier (pytest -k K); the later steps only while the stage's $deadline leaves room
variant_rows() {
  local prefix=$1 variants=$2 k=$3 workers
  workers=$(python3 -c "import xdist" 2>/dev/null && echo "-n 4" || true)
  step "${prefix}_builds" 150 python3 bench/build_mma_variants.py --jobs 12 --only "$variants"
  room 40 "${prefix}_d64" && step "${prefix}_d64" 80 python3 bench/mma_variants.py --reps 5 --out "$OUT/${prefix}_d64" --shapes d64 --variants "$variants"
  room 40 "${prefix}_wan" && step "${prefix}_wan" 80 python3 bench/mma_variants.py --reps 5 --out "$OUT/${prefix}_wan" --shapes wan21-1.3b-480p --variants "$variants"
  room 80 "${prefix}_wan14" && step "${prefix}_wan14" 150 python3 bench/mma_variants.py --reps 3 --out "$OUT/${prefix}_wan14" --shapes wan22-14b-720p --variants "$variants"
  room 60 "${prefix}_tests" && step "${prefix}_tests" 150 python3 -m pytest -q -rf $workers tests/test_mma_variants_gpu.py -k "$k"
}
stages=${*:-build tests variant_tests bench grouping e2e comfyui}
# the Hopper fidelity variants of the mixed and lo stages (bench/sm90_variants.sh names; docs/kernel-notes.md 36)
FIDELITY_VARIANTS="split split_ch4 split_ch6 split_ch8 split_lo16 split_lo32 split_ch4_lo32 split_ch8_lo32"
# the `merged` stage's builds: the chord alone, the second term on 32 / 16 channels beside the PV MMA and inside it
MERGED_VARIANTS="split_ch8 split_ch8_lo32x2 split_ch8_lo32 split_ch8_lo16x2 split_ch8_lo16"
# the `adopt` stage's candidates: the product, the chord for every key, the second V term on 32 channels, both (chord 4/8 or 8/8)
ADOPT_VARIANTS=${ADOPT_VARIANTS:-"split split_ch8 split_lo32 split_ch4_lo32 split_ch8_lo32"}  # (a short lease: fewer)
for stage in $stages; do
  case $stage in
    build) step build 240 python3 -m vc_attention.cli build ;;
    tests)  # the GPU tier without the portable variant matrix (variant_tests: together they outgrew one 600 s call)
      # four workers on the one GPU (pytest-xdist is in the image): the tier ran in 128 s instead of ~420 s on the
      # H200 (session 20), and a test that ends its process fails alone instead of ending the run
      workers=$(python3 -c "import xdist" 2>/dev/null && echo "-n 4" || true)
      step gpu_tests 420 python3 -m pytest -q -rf -m gpu $workers --ignore=tests/test_mma_variants_gpu.py \
        --junitxml="$OUT/gpu_tests.xml" tests
      if [ -n "${COMFYUI_PATH:-}" ]; then VC_PYAV_PLACEHOLDER=1 step host_tests 240 python3 -m pytest -q -rfE -m comfyui tests; fi ;;
    variant_tests)  # the portable variant matrix: every registered build against the emulation (172 s of builds at 4 jobs)
      step mma_variant_builds 240 python3 bench/build_mma_variants.py --jobs 12
      workers=$(python3 -c "import xdist" 2>/dev/null && echo "-n 4" || true)
      step variant_tests 340 python3 -m pytest -q -rf -m gpu $workers --junitxml="$OUT/variant_tests.xml" \
        tests/test_mma_variants_gpu.py ;;
    bench) step bench 300 python3 -m vc_attention.cli bench --save ;;
    grouping) step grouping 150 python3 bench/grouping_bench.py ;;
    e2e) step e2e 300 python3 -m vc_attention.cli bench --e2e --save ;;
    comfyui)
      if [ -n "${COMFYUI_PATH:-}" ]; then step comfyui 420 python3 -m vc_attention.cli bench --comfyui "$COMFYUI_PATH" --comfyui-rounds 2 --save
      else echo "[comfyui] skipped: no ComfyUI checkout (.comfy/ or COMFYUI_PATH)" | tee -a "$OUT/steps.txt"; fi ;;
    variants)
      step mma_variants 420 python3 bench/mma_variants.py --reps 3 --out "$OUT" \
        --variants "${MMA_VARIANTS:-rows16,wide,wide-coalesced,wide-viaf16,wide-restoretile-coalesced-viaf16,wide-pvf16mma-restoretile-coalesced}"
      step prepare_variants 150 python3 bench/prepare_variants.py --out "$OUT"
      step kernel_profile 240 python3 bench/kernel_profile.py --shape wan21-1.3b-480p --out "$OUT" \
        --targets "${PROFILE_TARGETS:-sa-portable,mma:wide:plain8,mma:wide-viaf16:plain8,mma:wide-viaf16:speed,sa-sm90,sm90:speed,sm90:fidelity}" ;;
    within)
      step within_gpu_tests 240 python3 -m pytest -q tests/test_grouping_within_gpu.py tests/test_grouping_fused_gpu.py
      step within_fidelity 300 python3 bench/grouping_fidelity_gpu.py --sizes 32760 75600 --groupings 128x1 64x2 64x1 \
        --kernel-bins 8 16 --out "$OUT/within-bins.json"
      step within_segments 240 python3 bench/segments_bench.py --shapes wan22-14b-720p,wan21-1.3b-480p --data video \
        --within-bins 0,8 --out "$OUT" ;;
    clamp)
      (export OUT SM90_VARIANTS="split_nocb split" SM90_SHAPES="1,40,75600,128 1,12,32760,128 1,32,32768,64 1,32,6144,64"
       step clamp_sm90 420 bash bench/sm90_variants.sh)
      v=$(python3 -c "from vc_attention.kernels import mma_variants as m; print(m.default_variant('9.0a'))")
      step clamp_mma 420 python3 bench/mma_variants.py --reps 3 --out "$OUT" --shapes d64,wan21-1.3b-480p \
        --variants "$v+-DVC_MMA_CLAMP_BOUND=0,$v" ;;
    lanes)  # K scales per MMA lane (VCConfig.k_lane_scales): the GPU tier, the paired-K tier it touches, time + error
      step lanes_gpu_tests 420 python3 -m pytest -q tests/test_k_lanes_gpu.py tests/test_k_scale_pairs_gpu.py \
        tests/test_vsmooth_segments_gpu.py tests/test_binding_refusals_gpu.py
      step lanes_bench 420 python3 bench/k_lanes_bench.py --shapes wan22-14b-720p,wan21-1.3b-480p --sizes 32760 75600 \
        --out "$OUT"
      step lanes_bench_mma 300 python3 bench/k_lanes_bench.py --backend mma --shapes wan21-1.3b-480p --sizes 32760 \
        --seeds 0 --out "$OUT" ;;
    mixed)  # fidelity's mixed encoding (kernel-notes 36): every variant library built, then the chord's share timed
      # all eight libraries at once (nvcc in parallel), so that the next stage, `lo`, finds them on a warm machine
      (export OUT SM90_REUSE_BUILD=1 SM90_BUILD_ONLY=1 SM90_VARIANTS="$FIDELITY_VARIANTS"
       step fidelity_variants_build 300 bash bench/sm90_variants.sh)
      (export OUT SM90_REUSE_BUILD=1 SM90_VARIANTS="split split_ch4 split_ch6 split_ch8" SM90_SHAPES="1,40,75600,128 1,12,32760,128 1,32,32768,64 1,32,6144,64"
       step mixed_sm90 420 bash bench/sm90_variants.sh; mv "$OUT/sm90_check.json" "$OUT/sm90_check_mixed.json") ;;
    lo)  # the V residual's second term (kernel-notes 36) timed, then every fidelity variant's error with and without lanes
      (export OUT SM90_REUSE_BUILD=1 SM90_BUILD_ONLY=1 SM90_VARIANTS="$FIDELITY_VARIANTS"  # (a cold machine builds them)
       step fidelity_variants_build 300 bash bench/sm90_variants.sh)
      (export OUT SM90_REUSE_BUILD=1 SM90_VARIANTS="split split_lo16 split_lo32 split_ch4_lo32 split_ch8_lo32" SM90_SHAPES="1,40,75600,128 1,12,32760,128"
       step lo_sm90 300 bash bench/sm90_variants.sh; mv "$OUT/sm90_check.json" "$OUT/sm90_check_lo.json")
      b=${SM90_BUILD_DIR:-build/sm90_variants}
      step fidelity_variants_error 300 python3 bench/mixed_fidelity_gpu.py $(for v in $FIDELITY_VARIANTS; do echo --lib "$b/sm90_$v.so"; done) \
        --sizes 32760 75600 --seeds 0 1 --lanes --out "$OUT" ;;
    adopt)  # the adoption question of kernel-notes 36 in ONE device call (for a session whose device time is short):
      # the five candidates built at once while the JIT extensions build, their rel-L2 on the video-like data at
      # 32,760 / 75,600 first (the question a cut-short call must still answer), then their times at the two Wan
      # shapes beside cuDNN / SageAttention 2.2, each gated against its spec
      timeout 300 python3 -m vc_attention.cli build > "$OUT/adopt_jit_build.log" 2>&1 &
      (export OUT SM90_BUILD_ONLY=1 SM90_VARIANTS="$ADOPT_VARIANTS"; step adopt_build 240 bash bench/sm90_variants.sh)
      wait  # (torch's build lock would make the error step wait anyway; this keeps its log apart)
      b=${SM90_BUILD_DIR:-build/sm90_variants}
      step adopt_error 200 python3 bench/mixed_fidelity_gpu.py $(for v in $ADOPT_VARIANTS; do echo --lib "$b/sm90_$v.so"; done) \
        --sizes 32760 75600 --seeds 0 1 --out "$OUT"
      if [ "${ADOPT_TIMES:-1}" = 1 ]; then  # ADOPT_TIMES=0: the error only (a lease too short for both)
        (export OUT SM90_REUSE_BUILD=1 SM90_VARIANTS="$ADOPT_VARIANTS" SM90_SHAPES="1,40,75600,128 1,12,32760,128"
         step adopt_sm90 300 bash bench/sm90_variants.sh; mv "$OUT/sm90_check.json" "$OUT/sm90_check_adopt.json")
      fi ;;
    merged)  # (not in the default list) the V residual's second term inside the PV MMA (kernel-notes 39): the chord
      # alone, the two-wgmma term (lo32x2, lo16x2) and the merged one (lo32, lo16) built, gated against the spec and timed
      # at the Wan shapes; the merged builds' output bits against the two-wgmma ones; lo16's rel-L2 beside lo32's
      (export OUT SM90_VARIANTS="$MERGED_VARIANTS" SM90_SHAPES="1,40,75600,128 1,12,32760,128"
       step merged_sm90 420 bash bench/sm90_variants.sh; mv "$OUT/sm90_check.json" "$OUT/sm90_check_merged.json")
      b=${SM90_BUILD_DIR:-build/sm90_variants}
      step merged_identity 150 python3 bench/lib_identity.py --lib "$b/sm90_split_ch8_lo32x2.so" --lib "$b/sm90_split_ch8_lo32.so" \
        --lib "$b/sm90_split_ch8_lo16x2.so" --lib "$b/sm90_split_ch8_lo16.so" --out "$OUT"
      step merged_error 200 python3 bench/mixed_fidelity_gpu.py --lib "$b/sm90_split_ch8_lo32.so" --lib "$b/sm90_split_ch8_lo16.so" \
        --sizes 32760 75600 --seeds 0 1 --out "$OUT" ;;
    sums)  # (not in the default list) the row sums in the term's box (kernel-notes 40): time and error beside the product's
      (export OUT SM90_VARIANTS="split_ch8_lo32 split_ch8_lo30" SM90_SHAPES="1,40,75600,128 1,12,32760,128 1,16,111600,128"
       step sums_sm90 420 bash bench/sm90_variants.sh; mv "$OUT/sm90_check.json" "$OUT/sm90_check_sums.json")
      b=${SM90_BUILD_DIR:-build/sm90_variants}
      step sums_error 200 python3 bench/mixed_fidelity_gpu.py --lib "$b/sm90_split_ch8_lo32.so" --lib "$b/sm90_split_ch8_lo30.so" \
        --sizes 32760 75600 --seeds 0 1 --out "$OUT" ;;
    lorun)  # (not in the default list) the second term's running sum in registers (kernel-notes 41): the product's fidelity
      # kernel (split_ch8_lo32) beside its shared-memory sum (lo32s) and lo30, gated and timed, then the two lo32 builds' output bits
      (export OUT SM90_VARIANTS="split_ch8_lo32s split_ch8_lo32 split_ch8_lo30" SM90_SHAPES="1,40,75600,128 1,12,32760,128 1,16,111600,128"
       step lorun_sm90 420 bash bench/sm90_variants.sh; mv "$OUT/sm90_check.json" "$OUT/sm90_check_lorun.json")
      b=${SM90_BUILD_DIR:-build/sm90_variants}
      step lorun_identity 150 python3 bench/lib_identity.py --lib "$b/sm90_split_ch8_lo32s.so" --lib "$b/sm90_split_ch8_lo32.so" --out "$OUT" ;;
    ratio)  # (not in the default list) issue 10's speed / fidelity error ratio: speed-mode candidates (grouping, lanes)
      # beside the fidelity preset, public op timed at the Wan shapes and rel-L2 on the video-like data (kernel-notes 41)
      step speed_ratio 420 python3 bench/k_lanes_bench.py --name speed_ratio --out "$OUT" --shapes wan22-14b-720p,wan21-1.3b-480p \
        --rows "${RATIO_ROWS:-fidelity@128x1b8,speed+lanes@64x2b8,speed+lanes@64x1,speed+lanes@128x1b8,speed@64x1}" ;;
    restore)  # (not in the default list) the portable kernel's mean restore after the PV loop (VC_MMA_RESTORE_AFTER,
      # kernel-notes 43): its GPU tests, then the H100/H200 build (via f16) and the native-FP8 build (the RTX code's shape,
      # FP8 mma.sync lowered by ptxas here) each with and without the flag, beside SageAttention 2.2's portable kernel
      step restore_tests 240 python3 -m pytest -q -rf tests/test_mma_restore_after_gpu.py
      v=wide-i2fp-meanscaled-restoretile-coalesced
      step restore_variants 420 python3 bench/mma_variants.py --reps 5 --out "$OUT" --shapes wan21-1.3b-480p,wan22-14b-720p,d64 \
        --variants "$v-viaf16,$v-viaf16+-DVC_MMA_RESTORE_AFTER=1,$v,$v+-DVC_MMA_RESTORE_AFTER=1" ;;
    adopted)  # (not in the default list) docs/kernel-notes.md 44: the portable default builds before and after the mean
      # restore after the PV loop (VC_MMA_RESTORE_AFTER), beside SageAttention 2.2's portable kernel: the H100/H200 build
      # (via f16), the RTX 40 / 50 build (native FP8 mma.sync, lowered by ptxas here) and the GeForce build (native FP8
      # with fp16 partials: SageAttention 2.2's own fp32+fp16 accumulation)
      v=wide-i2fp-meanscaled
      step adopted_variants 420 python3 bench/mma_variants.py --reps 7 --out "$OUT" --shapes wan21-1.3b-480p,wan22-14b-720p,d64 \
        --variants "$v-restoretile-coalesced-viaf16,$v-restoretile-after64-coalesced-viaf16,$v-restoretile-coalesced,$v-restoretile-after-coalesced,$v-pvf16-restoretile-coalesced,$v-pvf16-restoretile-after-coalesced" ;;
    direct)  # (not in the default list) docs/kernel-notes.md 45: the via-f16 build with PV straight into O (VC_MMA_PV_DIRECT)
      # (=1 and =2, the via-f16 default) gated against the emulation, the backend suite on the default build, then the build
      # before it (-after64-), the default and the GeForce build (fp16 partials) beside SageAttention 2.2's portable kernel
      workers=$(python3 -c "import xdist" 2>/dev/null && echo "-n 4" || true)
      step direct_tests 300 python3 -m pytest -q -rf $workers tests/test_mma_variants_gpu.py -k "pvdirect"
      # the backend's own suite on the default build (the via-f16 default is the -pvdirect2- build since section 45)
      step direct_backend_tests 240 python3 -m pytest -q -rf $workers tests/test_backends_gpu.py
      v=wide-i2fp-meanscaled
      step direct_variants 300 python3 bench/mma_variants.py --reps 5 --out "$OUT" --shapes wan21-1.3b-480p,wan22-14b-720p,d64 \
        --variants "$v-restoretile-after64-coalesced-viaf16,$v-restoretile-after64-pvdirect2-coalesced-viaf16,$v-pvf16-restoretile-after-coalesced" ;;
    candidates)  # (not in the default list) docs/kernel-notes.md 46: mma_variants.CANDIDATES beside the builds they would
      # replace and SageAttention 2.2's portable kernel: the head-dim-64 kernels at three CTAs per SM (-d64x3-,
      # VC_MMA_D64_MIN_BLOCKS=3) and the mean restore as TF32 MMAs (-restoremma-, VC_MMA_RESTORE_MMA=1) in the via-f16
      # default, the native-FP8 build and the GeForce build (all built in parallel first); timed at head dim 64 (every
      # build) and Wan2.1-1.3B (the restore's builds: -d64x3- leaves head dim 128 as it is), gated against the emulation,
      # then ncu on the via-f16 plain 8-bit / fidelity kernels at head dim 64 beside SageAttention's
      v=wide-i2fp-meanscaled; d=$v-restoretile-after64-pvdirect2; n=$v-restoretile-after; g=$v-pvf16-restoretile-after
      # (the restore-by-MMA builds of the GeForce and -d64x3- kinds were dropped after section 46's measurement)
      wan="$d-coalesced-viaf16,$d-restoremma-coalesced-viaf16,$n-coalesced,$n-restoremma-coalesced,$g-coalesced"
      d64="$wan,$d-d64x3-coalesced-viaf16,$n-d64x3-coalesced,$g-d64x3-coalesced"
      d64="$d64,$v-restoretile-after64-pvdirect-coalesced-viaf16+-DVC_MMA_D64_MIN_BLOCKS=3"
      step candidate_builds 240 python3 bench/build_mma_variants.py --jobs 12 --only "$d64"
      step candidates_d64 200 python3 bench/mma_variants.py --reps 5 --out "$OUT/d64" --shapes d64 --variants "$d64"
      step candidates_wan 150 python3 bench/mma_variants.py --reps 5 --out "$OUT/wan" --shapes wan21-1.3b-480p --variants "$wan"
      workers=$(python3 -c "import xdist" 2>/dev/null && echo "-n 4" || true)
      step candidate_tests 200 python3 -m pytest -q -rf $workers tests/test_mma_restore_mma_gpu.py tests/test_mma_variants_gpu.py -k "d64x3 or restoremma"
      step candidate_profile 150 python3 bench/kernel_profile.py --shape d64 --out "$OUT" \
        --targets "sa-portable,mma:$d-coalesced-viaf16:plain8,mma:$d-coalesced-viaf16:fidelity,mma:$d-d64x3-coalesced-viaf16:plain8,mma:$d-d64x3-coalesced-viaf16:fidelity" ;;
    adopt46)  # (not in the default list) docs/kernel-notes.md 46: the via-f16 default with its head-dim-64 V-Smooth kernels at
      # three CTAs per SM (-d64vs3-): its variant-tier slice (and the restore-by-MMA builds'), `vc-attention bench --save`,
      # then the GPU tier without the variant file (its other variants are the previous defaults, gated before)
      workers=$(python3 -c "import xdist" 2>/dev/null && echo "-n 4" || true)
      step adopt46_variant_tests 150 python3 -m pytest -q -rf $workers tests/test_mma_variants_gpu.py tests/test_mma_restore_mma_gpu.py \
        -k "d64vs3 or restoremma or the_backend_runs"
      step bench 200 python3 -m vc_attention.cli bench --save
      # (ADOPT46_TIER=0 leaves the tier out: a short lease's call)
      if [ "${ADOPT46_TIER:-1}" != 0 ]; then step adopt46_tier 230 python3 -m pytest -q -rf -m gpu $workers \
        --ignore=tests/test_mma_variants_gpu.py --junitxml="$OUT/gpu_tests.xml" tests; fi ;;
    vf16)  # (not in the default list) docs/kernel-notes.md 47: V^T handed to the via-f16 kernel in f16 (VC_MMA_V_F16, no
      # per-warp V conversion) on the default (-d64vs3-), on the unbounded head-dim-64 build and on -d64x3-, and with P's
      # codes unpacked by shifts and masks (-palu-, VC_MMA_P_ALU_UNPACK), built in parallel, timed beside the builds
      # without them and SageAttention 2.2's portable kernel at head dim 64 and Wan2.1-1.3B, bit-identity / gates
      # against those builds, ncu (with each pipe's share of its peak) at head dim 64, then Wan2.2-14B. A step starts
      # only while $VF16_SECONDS (default 540) leave it room, so a short lease still brings the first ones back
      d=wide-i2fp-meanscaled-restoretile-after64-pvdirect2
      wan="$d-d64vs3-coalesced-viaf16,$d-d64vs3-vf16-coalesced-viaf16,$d-d64vs3-vf16-palu-coalesced-viaf16"
      poly="$d-d64vs3-vf16-coalesced-viaf16+-DVC_MMA_EXP2_POLY"  # + n of each k-step's 4 P registers' exp2 on the FMA pipe (kernel-notes 48)
      # and the scores' int -> float by IADD + FADD instead of I2FP (Hopper's conversions are slow: off that pipe too)
      d64="$wan,$poly=1,$poly=2,$d-d64vs3-vf16-coalesced-viaf16+-DVC_MMA_I2FP=0,$d-d64vs3-vf16-palu-coalesced-viaf16+-DVC_MMA_I2FP=0,$d-vf16-coalesced-viaf16,$d-d64x3-coalesced-viaf16,$d-d64x3-vf16-coalesced-viaf16"
      deadline=$((SECONDS + ${VF16_SECONDS:-540}))
      workers=$(python3 -c "import xdist" 2>/dev/null && echo "-n 4" || true)
      step vf16_builds 200 python3 bench/build_mma_variants.py --jobs 12 --only "$d64"
      room 60 vf16_d64 && step vf16_d64 120 python3 bench/mma_variants.py --reps 5 --out "$OUT/d64" --shapes d64 --variants "$d64"
      room 40 vf16_wan && step vf16_wan 80 python3 bench/mma_variants.py --reps 5 --out "$OUT/wan" --shapes wan21-1.3b-480p --variants "$wan,$poly=1"
      room 60 vf16_profile && step vf16_profile 100 python3 bench/kernel_profile.py --shape d64 --out "$OUT" \
        --targets "sa-portable,mma:$d-d64vs3-coalesced-viaf16:fidelity,mma:$d-d64vs3-vf16-coalesced-viaf16:fidelity,mma:$d-d64vs3-vf16-palu-coalesced-viaf16:fidelity,mma:$d-d64vs3-coalesced-viaf16:plain8,mma:$d-vf16-coalesced-viaf16:plain8"
      room 120 vf16_tests && step vf16_tests 200 python3 -m pytest -q -rf $workers tests/test_mma_v_f16_gpu.py tests/test_mma_variants_gpu.py -k "vf16 or v_f16"
      room 100 vf16_wan14 && step vf16_wan14 150 python3 bench/mma_variants.py --reps 3 --out "$OUT/wan14" --shapes wan22-14b-720p --variants "$wan"
      no_docs=1 ;;  # (nothing saved: the results file and the rendered docs stay behind, within the 8 files)
    v128)  # (not in the default list) docs/kernel-notes.md 48: the adopted via-f16 default (-v128f16-: V in f16 for the
      # head-dim-128 INT8 V-Smooth kernels only) timed as itself beside the build before it and SageAttention 2.2's
      # portable kernel at Wan2.1-1.3B, head dim 64 and Wan2.2-14B, and its f16-V GPU tests
      d=wide-i2fp-meanscaled-restoretile-after64-pvdirect2-d64vs3
      both="$d-coalesced-viaf16,$d-v128f16-coalesced-viaf16"
      step v128_builds 150 python3 bench/build_mma_variants.py --jobs 12 --only "$both"
      step v128_tests 120 python3 -m pytest -q -rf tests/test_mma_v_f16_gpu.py -k v128f16
      step v128_wan 80 python3 bench/mma_variants.py --reps 5 --out "$OUT/wan" --shapes wan21-1.3b-480p --variants "$both"
      step v128_d64 80 python3 bench/mma_variants.py --reps 5 --out "$OUT/d64" --shapes d64 --variants "$both"
      step v128_wan14 150 python3 bench/mma_variants.py --reps 3 --out "$OUT/wan14" --shapes wan22-14b-720p --variants "$both"
      no_docs=1 ;;
    stages)  # (not in the default list) docs/kernel-notes.md 49: the per-kernel ring depths (mma_variants.CANDIDATES: 3
      # stages in the ExpCast kernels, -xs3-, and also 4 in the head-dim-64 fidelity ones, -xs3-d64vss4-) beside the
      # default and SageAttention 2.2's portable kernel at head dim 64, Wan2.1-1.3B and Wan2.2-14B, then their variant
      # tier (against the emulation) and the mma binding's flag refusals. $STAGES_SECONDS (default 480) bounds the steps
      # after the builds
      d=wide-i2fp-meanscaled-restoretile-after64-pvdirect2-d64vs3-v128f16
      three="$d-coalesced-viaf16,$d-xs3-coalesced-viaf16,$d-xs3-d64vss4-coalesced-viaf16"
      deadline=$((SECONDS + ${STAGES_SECONDS:-480}))
      workers=$(python3 -c "import xdist" 2>/dev/null && echo "-n 4" || true)
      step stages_builds 150 python3 bench/build_mma_variants.py --jobs 12 --only "$three"
      room 40 stages_d64 && step stages_d64 80 python3 bench/mma_variants.py --reps 5 --out "$OUT/d64" --shapes d64 --variants "$three"
      room 40 stages_wan && step stages_wan 80 python3 bench/mma_variants.py --reps 5 --out "$OUT/wan" --shapes wan21-1.3b-480p --variants "$three"
      room 80 stages_wan14 && step stages_wan14 150 python3 bench/mma_variants.py --reps 3 --out "$OUT/wan14" --shapes wan22-14b-720p --variants "$three"
      room 100 stages_tests && step stages_tests 200 python3 -m pytest -q -rf $workers tests/test_mma_variants_gpu.py \
        tests/test_vsmooth_segments_gpu.py -k "xs3 or refuses_flags"
      no_docs=1 ;;
    latembar)  # (not in the default list) docs/kernel-notes.md 50-51: the late copy (-latecopy-), the K scale a chunk
      # ahead (-kahead-), both, per-stage mbarriers (-mbar-, -mbar3-) and the f16-add row sums (-rsadd-, -rsadd2-) in
      # one call (one SageAttention row per shape for all; device starts were scarce), then their variant slices
      d=wide-i2fp-meanscaled-restoretile-after64-pvdirect2-d64vs3-v128f16-xs3-d64vss4
      deadline=$((SECONDS + 500))
      # the timings need only the prepare extension: without `build` before it (a short lease) it is built here
      step lm_prepare 120 python3 -c "from vc_attention.kernels import prepare_cuda; prepare_cuda.extension()"
      variant_rows lm "$d-coalesced-viaf16,$d-latecopy-coalesced-viaf16,$d-kahead-coalesced-viaf16,$d-latecopy-kahead-coalesced-viaf16,$d-mbar-coalesced-viaf16,$d-mbar3-coalesced-viaf16,$d-rsadd-coalesced-viaf16,$d-rsadd2-coalesced-viaf16" \
        "latecopy or kahead or mbar or rsadd"
      no_docs=1 ;;
    sites)  # (not in the default list) docs/kernel-notes.md 49: where the head-dim-64 warps wait, per SASS instruction
      # (ncu PC sampling, bench/stall_sites.py): SageAttention 2.2's portable kernel beside our default's plain 8-bit
      # and fidelity kernels, then the same at Wan2.1-1.3B (plain 8-bit and fidelity); session 40's run
      # (bench/results/nvidia-h100-stall-sites-*.json) profiled the two-stage build before -xs3-d64vss4- was adopted
      d=wide-i2fp-meanscaled-restoretile-after64-pvdirect2-d64vs3-v128f16-xs3-d64vss4-coalesced-viaf16
      step sites_d64 200 python3 bench/stall_sites.py --shape d64 --out "$OUT/sites_d64" \
        --targets "sa-portable,mma:$d:plain8,mma:$d:fidelity"
      step sites_wan 200 python3 bench/stall_sites.py --shape wan21-1.3b-480p --out "$OUT/sites_wan" \
        --targets "sa-portable,mma:$d:plain8,mma:$d:fidelity"
      no_docs=1 ;;
    spread)  # fidelity's paired-K loop against the unpaired one in rounds, with the GPU's clocks (kernel-notes 35)
      step fidelity_spread 300 python3 bench/fidelity_spread.py --rounds 6 --out "$OUT" ;;
    *) echo "unknown stage $stage (build, tests, variant_tests, bench, grouping, e2e, comfyui, variants, within, clamp, lanes, spread, mixed, lo, adopt, merged, sums, lorun, ratio, restore, adopted, direct, candidates, adopt46, vf16, v128, stages, latembar, sites)"; exit 2 ;;
  esac
done
if [ "$dry" != 0 ]; then cat "$OUT/steps.txt"; exit 0; fi
tail -n 4 "$OUT"/*.log
# at most 8 files come back from a device call: the results, the two rendered docs, one log archive
GPU_RESULTS=$(python3 -c "from vc_attention.commands.bench_results import results_path; import torch; print(results_path(torch.cuda.get_device_name()))")
[ -n "${no_docs:-}" ] || cp "$GPU_RESULTS" BENCHMARKS.md README.md "$OUT/" 2>/dev/null
(cd "$OUT" && shopt -s nullglob && files=(./*.log ./*.xml ./*.csv env.txt) && tar czf logs.tgz "${files[@]}" && rm -f "${files[@]}")
cat "$OUT/steps.txt"
