"""The ComfyUI section of `vc-attention bench`: sampling in a real ComfyUI, side by side.

Each mode runs in its own process (commands/comfyui_sampling_worker.py), because ComfyUI picks its
attention function from its command line at import time (`--comfyui-rounds R`: every mode once per
round, medians reported, each round's ratio kept): `default` (ComfyUI's own attention),
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


def comfyui_rows(comfy_path: str, steps: int = STEPS, size: str = "wan1.3b", log=print, rounds: int = 1) -> list[dict]:
    """One row per mode. rounds > 1: every mode runs once per round, in order, and a row's seconds is
    the median over the rounds (seconds_rounds keeps each); x_sage_rounds is each round's own ratio,
    so drift of the machine between rounds (a few % over minutes on the H200) shows instead of
    biasing one mode. The latents (rel-L2) are the first round's."""
    import statistics

    import torch

    from .bench_peers import sageattention_module

    if not Path(comfy_path, "comfy").is_dir():
        raise ValueError(f"{comfy_path} is not a ComfyUI checkout (no comfy/ folder in it).")
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}.")
    modes = [m for m in MODES if m != "sage" or sageattention_module() is not None]
    runs: dict[str, list[dict]] = {mode: [] for mode in modes}
    with tempfile.TemporaryDirectory() as out_dir:
        for r in range(rounds):
            round_dir = Path(out_dir, f"round{r}")
            round_dir.mkdir()
            for mode in modes:
                done = subprocess.run([sys.executable, str(WORKER), comfy_path, mode, str(round_dir), str(steps), size],
                                      capture_output=True, text=True, timeout=WORKER_TIMEOUT_S)
                if done.returncode != 0:
                    raise RuntimeError(f"ComfyUI sampling run '{mode}' failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
                runs[mode].append(json.loads(Path(round_dir, f"{mode}.json").read_text()))
                log(f"[comfyui] {mode}: {runs[mode][-1]['seconds']:.2f} s" + (f" (round {r + 1})" if rounds > 1 else ""))
        first = Path(out_dir, "round0")
        reference = torch.load(str(first / "default.pt"))
        rows = []
        for mode in modes:
            row = dict(runs[mode][0])
            latent = torch.load(str(first / f"{mode}.pt"))
            row["rel_l2_vs_default"] = float((latent - reference).norm() / reference.norm())
            if rounds > 1:
                row["seconds_rounds"] = [run["seconds"] for run in runs[mode]]
                row["seconds"] = statistics.median(row["seconds_rounds"])
            rows.append(row)
    for row in rows:
        row["x_default"] = rows[0]["seconds"] / row["seconds"]
    sage = next((r for r in rows if r["mode"] == "sage"), None)
    for row in rows:
        row["x_sage"] = sage["seconds"] / row["seconds"] if sage else None
        if sage and rounds > 1:
            row["x_sage_rounds"] = [a / b for a, b in zip(sage["seconds_rounds"], row["seconds_rounds"])]
        stats = row.pop("stats") or {}
        row["backend_calls"] = stats.get("backend_calls")
        row["fallbacks"] = stats.get("fallbacks")
        row["cross_attention"] = stats.get("cross_attention")  # the exact cross-attention's routes (cudnn / model)
    return rows
