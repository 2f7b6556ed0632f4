#!/usr/bin/env bash
# One GPU call that produces every published number: JIT build, the GPU test tiers not yet run on a
# GPU, `vc-attention bench --save`, the grouping benchmark (old vs fused, share of a speed call) and the end-to-end Wan-14B
# forward. Each step has its own time limit so a slow step cannot starve the others; every log lands
# in $OUT. Usage on the device machine, from the repo root, with wheels carried in .whl/:
#   bash bench/device_run.sh
set -u -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/vc_out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
# the repo root is the package: a link named vc_attention makes it importable without installing
mkdir -p /tmp/pkgs && ln -sfn "$PWD" /tmp/pkgs/vc_attention
export PYTHONPATH=/tmp/pkgs:/tmp/site

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/env.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version())" | tee -a "$OUT/env.txt"

step() {  # step NAME SECONDS COMMAND...
  local name=$1 secs=$2; shift 2
  local t0=$SECONDS
  timeout "$secs" "$@" > "$OUT/$name.log" 2>&1
  echo "[$name] rc=$? in $((SECONDS - t0)) s" | tee -a "$OUT/steps.txt"
}
step build 150 python3 -m vc_attention.cli build
step bench 120 python3 -m vc_attention.cli bench --save --json --reps 5 --shapes wan22-14b-720p,wan21-1.3b-480p,hunyuan15-720p,ltx-video,d64
cp bench/results/*.json "$OUT/" 2>/dev/null
step e2e 170 python3 -m vc_attention.cli bench --e2e
step grouping 150 python3 bench/grouping_bench.py
step gpu_tests 60 python3 -m pytest -q -x -m gpu tests/test_grouping_gpu.py tests/test_grouping_fused_gpu.py tests/test_node_gpu.py tests/test_sm90_gpu.py
tail -n 3 "$OUT"/*.log
cat "$OUT/steps.txt"
