"""Where the GPU time of a ComfyUI sampling run goes, per method, side by side.

  python3 bench/comfyui_profile.py [COMFYUI_PATH] [--modes sage,speed] [--steps 8]

Runs commands/comfyui_sampling_worker.py (the `vc-attention bench --comfyui` harness: Wan2.1-1.3B
widths, 32,760 tokens, CFG) once per mode with VC_COMFYUI_PROFILE set: after its timed run the worker
samples once more under torch.profiler (commands/comfyui_kernel_profile.py). Prints per mode the timed
run, the profiled run's wall and GPU-busy time, and the milliseconds per kernel kind; writes
$OUT/comfyui_profile.json (bench/results/ without $OUT).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "commands" / "comfyui_sampling_worker.py"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("comfy", nargs="?", default=os.environ.get("COMFYUI_PATH", str(ROOT / ".comfy")))
    parser.add_argument("--modes", default="sage,speed")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    import torch

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in args.modes.split(","):
            profile = Path(tmp, f"{mode}-profile.json")
            env = dict(os.environ, VC_COMFYUI_PROFILE=str(profile))
            done = subprocess.run([sys.executable, str(WORKER), args.comfy, mode, tmp, str(args.steps)], env=env,
                                  capture_output=True, text=True, timeout=900)
            if done.returncode != 0:
                raise SystemExit(f"{mode} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
            timed = json.loads(Path(tmp, f"{mode}.json").read_text())
            rows.append(dict(mode=mode, timed_s=timed["seconds"], **json.loads(profile.read_text())))
    for row in rows:
        print(f"{row['mode']:>9}: timed {row['timed_s']:.3f} s | profiled wall {row['wall_ms']:.0f} ms, "
              f"GPU busy {row['gpu_busy_ms']:.0f} ms, idle {row['wall_ms'] - row['gpu_busy_ms']:.0f} ms, "
              f"{row['kernels']} kernels")
        for kind, ms in row["kinds_ms"].items():
            print(f"{'':>11}{kind:<18} {ms:9.1f} ms")
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "command": f"python3 bench/comfyui_profile.py --modes {args.modes} --steps {args.steps}"}
    out = Path(os.environ.get("OUT", ROOT / "bench" / "results"), "comfyui_profile.json")
    out.write_text(json.dumps({"env": env, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
