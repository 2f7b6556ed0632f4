#!/usr/bin/env bash
# One GPU call for this round's kernel variants (run from the repo root on the H200, wheels in .whl/):
# JIT-builds the product extensions while the sm90 variant libraries build beside them, runs the
# whole `gpu` pytest tier, then checks and times the sm90 variants (bench/sm90_variants.sh), the
# portable kernel's variants next to SageAttention 2.2's portable kernel (bench/mma_variants.py) and
# the SASS of the speed kernels (bench/expcast_sass.py). Logs are archived in $OUT/variants_logs.tgz;
# each step's tail is printed.
#   SM90_VARIANTS="base psmem_mean" bash bench/variants_run.sh
set -u -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/vc_out}
LOGS=/tmp/variants_logs
mkdir -p "$OUT" "$LOGS"
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
fi
mkdir -p /tmp/pkgs && ln -sfn "$PWD" /tmp/pkgs/vc_attention
export PYTHONPATH=/tmp/pkgs:/tmp/site:$PWD/.whl/site
export SM90_VARIANTS=${SM90_VARIANTS:-"base mean psmem psmem_mean psmem_mean_nopp psmem2_poly1_mean all_poly1_mean"}
t0=$SECONDS
(OUT=$LOGS/sm90 SM90_BUILD_ONLY=1 bash bench/sm90_variants.sh > "$LOGS/sm90_build.log" 2>&1) &
timeout 300 python3 -m vc_attention.cli build > "$LOGS/build.log" 2>&1; echo "[build] rc=$? at $((SECONDS - t0)) s"
wait; tail -n 12 "$LOGS/sm90_build.log"; echo "[sm90 builds] at $((SECONDS - t0)) s"
timeout 240 python3 -m pytest -q -m gpu tests > "$LOGS/gpu_tests.log" 2>&1; echo "[gpu tests] rc=$? at $((SECONDS - t0)) s"
grep -E "passed|failed|^FAILED|^ERROR" "$LOGS/gpu_tests.log" | tail -25
timeout 200 python3 bench/expcast_sass.py --out "$LOGS/sass" > "$LOGS/sass.log" 2>&1; echo "[sass] rc=$? at $((SECONDS - t0)) s"; tail -n 8 "$LOGS/sass.log"
OUT=$LOGS/sm90 SM90_REUSE_BUILD=1 timeout 300 bash bench/sm90_variants.sh > "$LOGS/sm90.log" 2>&1; echo "[sm90 variants] rc=$? at $((SECONDS - t0)) s"
timeout ${MMA_SECONDS:-150} python3 bench/mma_variants.py --reps 3 > "$LOGS/mma.log" 2>&1; echo "[mma variants] rc=$? at $((SECONDS - t0)) s"
tail -n 30 "$LOGS/mma.log"
tar czf "$OUT/variants_logs.tgz" -C /tmp variants_logs
tail -n 45 "$LOGS/sm90.log"
