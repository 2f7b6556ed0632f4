"""The one committed benchmark-results schema: `bench/results/<gpu>.json`.

    {"schema": 2,
     "sections": {
        "<section>": {"env": {gpu, driver, torch, cuda, cudnn, python, sageattention, command, date, presets},
                      "rows": [ {...}, ... ]}}}

Sections are written by different parts of `vc-attention bench` (attention kernels, grouping,
end-to-end forward, ComfyUI sampling); `--save` replaces only the sections that ran, so a partial
re-run keeps the others, and every section carries the environment and the command that produced
it. BENCHMARKS.md and the README's headline block are rendered from this file
(commands/bench_report.py); nothing in them is typed by hand.
"""
from __future__ import annotations

import datetime
import json
import platform
import re
import subprocess
import sys
from pathlib import Path

SCHEMA = 2
SECTIONS = ("attention", "grouping", "e2e", "e2e-multigpu", "comfyui")
RESULTS_DIR = Path(__file__).resolve().parent.parent / "bench" / "results"


def gpu_slug(gpu_name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-")


def results_path(gpu_name: str) -> Path:
    return RESULTS_DIR / f"{gpu_slug(gpu_name)}.json"


def _driver_version() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.strip().splitlines()[0] if out.strip() else "unknown"


def _package_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def environment(command: str) -> dict:
    """What a reader needs to reproduce a section: GPU, software versions, the command, the date."""
    import torch

    return {
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "driver": _driver_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
        "python": platform.python_version(),
        "sageattention": _package_version("sageattention"),
        "command": command,
        "date": datetime.date.today().isoformat(),
        "presets": preset_tags(),
        "mma_build": portable_build(),
    }


def portable_build() -> dict | None:
    """The `mma` backend's build on this GPU: its arch, PV accumulation and variant (kernels/mma_variants.default_variant),
    so the report can say when the default build has changed since (commands/bench_report.stale_portable_build). None
    without a GPU, or on one the portable kernels do not run on (no FP8 tensor cores: jit.JitError)."""
    import torch

    if not torch.cuda.is_available():
        return None
    from ..kernels import backend_mma, jit, mma_variants

    try:
        arch = jit.target_arch()
    except jit.JitError:
        return None
    pv = backend_mma.pv_accum(arch)
    return {"arch": arch, "pv_accum": pv, "variant": mma_variants.default_variant(arch, pv)}


def preset_tags() -> dict[str, str]:
    """mode -> the configuration tag its preset runs (kernels/config.py): a section records the presets it measured, so
    the report can say when a preset has changed since (commands/bench_report.stale_presets)."""
    from ..kernels.config import FIDELITY, PLAIN_8BIT, SPEED

    return {"fidelity": FIDELITY.tag, "speed": SPEED.tag, "plain-8bit": PLAIN_8BIT.tag}


def command_line(argv: list[str] | None = None) -> str:
    return "vc-attention " + " ".join(sys.argv[1:] if argv is None else argv)


def empty() -> dict:
    return {"schema": SCHEMA, "sections": {}}


def load(path: Path) -> dict:
    """The results document at `path` (an empty one if the file does not exist)."""
    if not path.exists():
        return empty()
    doc = json.loads(path.read_text())
    if doc.get("schema") != SCHEMA:
        raise ValueError(f"{path} has results schema {doc.get('schema')!r}, this version reads {SCHEMA}; "
                         "re-run `vc-attention bench --all --save` to regenerate it.")
    return doc


def merge(doc: dict, section: str, env: dict, rows: list[dict]) -> dict:
    if section not in SECTIONS:
        raise ValueError(f"unknown results section {section!r}; known: {', '.join(SECTIONS)}.")
    doc["sections"][section] = {"env": env, "rows": rows}
    return doc


def save(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    ordered = {"schema": doc["schema"],
               "sections": {name: doc["sections"][name] for name in SECTIONS if name in doc["sections"]}}
    path.write_text(json.dumps(ordered, indent=1) + "\n")
