"""The ComfyUI section of `vc-attention bench`: sampling in a real ComfyUI, side by side.

Each mode runs in its own process (commands/comfyui_sampling_worker.py), because ComfyUI picks its
attention function from its command line at import time: `default` (ComfyUI's own attention),
`sage` (`--use-sage-attention`, SageAttention 2.2 when importable) and our node's presets. Rows give
seconds per sampling run and the final latent's rel-L2 against the default-attention run.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

WORKER = Path(__file__).resolve().with_name("comfyui_sampling_worker.py")
MODES = ("default", "sage", "fidelity", "balanced", "speed")
STEPS = 8
WORKER_TIMEOUT_S = 600


def comfyui_rows(comfy_path: str, steps: int = STEPS, size: str = "wan1.3b", log=print) -> list[dict]:
    import torch

    from .bench_peers import sageattention_module

    if not Path(comfy_path, "comfy").is_dir():
        raise ValueError(f"{comfy_path} is not a ComfyUI checkout (no comfy/ folder in it).")
    modes = [m for m in MODES if m != "sage" or sageattention_module() is not None]
    rows = []
    with tempfile.TemporaryDirectory() as out_dir:
        for mode in modes:
            done = subprocess.run([sys.executable, str(WORKER), comfy_path, mode, out_dir, str(steps), size],
                                  capture_output=True, text=True, timeout=WORKER_TIMEOUT_S)
            if done.returncode != 0:
                raise RuntimeError(f"ComfyUI sampling run '{mode}' failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
            rows.append(json.loads(Path(out_dir, f"{mode}.json").read_text()))
            log(f"[comfyui] {mode}: {rows[-1]['seconds']:.2f} s")
        reference = torch.load(str(Path(out_dir, "default.pt")))
        for row in rows:
            latent = torch.load(str(Path(out_dir, f"{row['mode']}.pt")))
            row["rel_l2_vs_default"] = float((latent - reference).norm() / reference.norm())
            row["x_default"] = rows[0]["seconds"] / row["seconds"]
    sage = next((r for r in rows if r["mode"] == "sage"), None)
    for row in rows:
        row["x_sage"] = sage["seconds"] / row["seconds"] if sage else None
        stats = row.pop("stats") or {}
        row["backend_calls"] = stats.get("backend_calls")
        row["fallbacks"] = stats.get("fallbacks")
        row["cross_attention"] = stats.get("cross_attention")  # the exact cross-attention's routes (cudnn / model)
    return rows
