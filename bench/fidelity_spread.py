"""Fidelity's paired-K exp2 loop against the unpaired one in rounds, with the GPU's clocks: where its spread comes from.

The same paired loop (fidelity's, config.FIDELITY: one K scale per 256-key step) has measured 132.5-139.5 ms at
Wan2.2-14B 720p in different device calls while the unpaired exp2 loop (k_scale_rows 128) stayed within 137.3-139.5
(docs/kernel-notes.md section 35). This times both, speed mode as a control and both presets with K scales per lane,
round after round in one process (the order rotates each round), and samples the SM clock, power and temperature
after every measurement, so one call shows whether the paired loop's time moves with the clocks (power under the MUFU
load) or on its own (the two consumer warpgroups' phase). The public call on the sm90 backend, prepare included,
random bf16 data, no grouping.

    python3 bench/fidelity_spread.py [--shapes wan22-14b-720p,wan21-1.3b-480p] [--rounds 6] [--reps 10]

Writes DIR/fidelity_spread.json (--out DIR: default $OUT, else bench/results/) and prints a table per shape.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SMI_FIELDS = ("clocks.sm", "power.draw", "temperature.gpu")


def configs() -> dict:
    """label -> VCConfig: fidelity as the presets have it (paired K), the unpaired exp2 loop, speed as a control, and
    both presets with K scales per lane (their KLANES kernels: whether the lanes' +1.4% / +1.0% kernel time of session
    25 holds against the paired loop's own spread)."""
    from vc_attention.kernels.config import FIDELITY, SPEED

    return {"fidelity (paired K)": FIDELITY, "fidelity, K per 128": FIDELITY.with_(k_scale_rows=128), "speed": SPEED,
            "fidelity+lanes": FIDELITY.with_(k_lane_scales=True), "speed+lanes": SPEED.with_(k_lane_scales=True)}


def gpu_sample() -> dict | None:
    """SM clock (MHz), power (W), temperature (C) from nvidia-smi right now; None where it is not there."""
    try:
        line = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, check=True, timeout=10).stdout.splitlines()[0]
        return dict(zip(SMI_FIELDS, (float(x) for x in line.split(","))))
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def rotated(labels: list[str], round_index: int) -> list[str]:
    """The round's order: each label first once every len(labels) rounds."""
    k = round_index % len(labels)
    return labels[k:] + labels[:k]


def summarize(rounds: list[dict], paired: str, unpaired: str) -> dict:
    """Per label min / median / max over the rounds, and the per-round ratio paired / unpaired (same round)."""
    labels = sorted({m for r in rounds for m in r["ms"]})
    out = {m: {"min": min(r["ms"][m] for r in rounds), "median": statistics.median(r["ms"][m] for r in rounds),
               "max": max(r["ms"][m] for r in rounds)} for m in labels}
    ratios = [r["ms"][paired] / r["ms"][unpaired] for r in rounds if paired in r["ms"] and unpaired in r["ms"]]
    return {"per_method": out, "paired_over_unpaired": ratios}


def run_shape(bhnd, rounds: int, reps: int) -> list[dict]:
    import torch

    from vc_attention.commands.bench import cuda_time_ms
    from vc_attention.kernels.api import vc_attention

    b, h, n, d = bhnd
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    v = v + 2.0 * torch.randn(d, device="cuda", dtype=torch.bfloat16)
    cfgs = configs()
    out = []
    with torch.inference_mode():
        for i in range(rounds):
            row = {"round": i, "ms": {}, "gpu": {}}
            for label in rotated(list(cfgs), i):
                config = cfgs[label]
                row["ms"][label] = cuda_time_ms(lambda: vc_attention(q, k, v, config=config, backend="sm90"), reps,
                                                warmup=2, min_total_ms=100)
                row["gpu"][label] = gpu_sample()
            out.append(row)
            clock = {m: (g or {}).get("clocks.sm", "-") for m, g in row["gpu"].items()}
            cells = [f"{m} {t:8.3f} ms ({clock[m]} MHz)" for m, t in row["ms"].items()]
            print(f"round {i}: " + " | ".join(cells), flush=True)
    return out


def main(argv=None) -> None:
    sys.path.insert(0, str(ROOT.parent))
    import torch

    from vc_attention.commands.bench import parse_shapes

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="wan22-14b-720p,wan21-1.3b-480p")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--out", default=os.environ.get("OUT", str(ROOT / "bench" / "results")))
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("fidelity_spread.py needs a CUDA GPU (the sm90 backend).")
    labels = list(configs())
    command = "python3 bench/fidelity_spread.py " + " ".join(argv if argv is not None else sys.argv[1:])
    doc = {"env": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
                   "command": command},
           "shapes": {}}
    for name, bhnd in parse_shapes(args.shapes).items():
        rounds = run_shape(bhnd, args.rounds, args.reps)
        doc["shapes"][name] = {"bhnd": list(bhnd), "rounds": rounds, "summary": summarize(rounds, labels[0], labels[1])}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "fidelity_spread.json").write_text(json.dumps(doc, indent=1))
    for name, shape in doc["shapes"].items():
        s = shape["summary"]
        print(f"\n{name}: | method | min | median | max |\n|---|---|---|---|")
        for m, v in s["per_method"].items():
            print(f"| {m} | {v['min']:.3f} | {v['median']:.3f} | {v['max']:.3f} |")
        print("paired / unpaired per round: " + ", ".join(f"{r:.3f}" for r in s["paired_over_unpaired"]))


if __name__ == "__main__":
    main()
