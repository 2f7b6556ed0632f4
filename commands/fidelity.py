"""`vc-attention fidelity`: error of every quantization method against fp64 exact attention.

Runs the bit-exact emulations (kernels/reference.py, study/reference_fp4.py) on the embedded
video-like sample, a synthetic one of the size asked for, or Q/K/V captured from a real model
(`--qkv FILE`), and prints method | rel-L2 | PSNR | TV | QK-term | V-term (study/fidelity.py
defines each column). On a CUDA GPU with `sageattention` installed, SageAttention's own output on
the same data is measured too (commands/fidelity_peers.py).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time

HELP = "Fidelity table of every quantization method against fp64 attention (synthetic or captured Q/K/V)."

# The keys of `--json` (shown by --help; README.md's "Command line" section holds the same text).
JSON_LEGEND = """\
--json keys (errors against fp64 exact attention; definitions in study/fidelity.py):
  data      where Q/K/V came from (embedded sample, synthetic size, or the captured file)
  shape     [B, H, N, D] of q, k and v
  dtype     dtype of the loaded Q/K/V (the methods quantize from it)
  grouping  clusters, iters: the V-Smooth k-means used by the grouped methods
  device    cpu or the CUDA GPU's name
  torch     the PyTorch version
  rows      one object per method:
    method    method name (the table's first column)
    rel_l2    ||O_q - O|| / ||O||
    cosine    cosine similarity of O_q and O (whole tensor)
    max_abs   max |O_q - O|
    psnr_db   20 log10(max|O| / rms(O_q - O)), null when the error is 0
    tv_mean   total-variation distance of the quantized softmax rows, mean over rows
    tv_max    the same, largest row
    qk_term   ||(P - P_q) V|| / ||O||: the error with V exact
    v_term    ||P_q (V - V_q)|| / ||O||: the error the value path adds
    v_share   ||v_term||^2 / (||qk_term||^2 + ||v_term||^2)
  notes     why peer rows are missing or failed (e.g. no sageattention installed; CUDA GPU runs only)
  calibration  (with --calibration, instead of rows): removal_token_order, removal_kmeans_order
            (block-mean energy removal without / with the k-means order), v_share (of plain 8-bit),
            effective_keys (exp of the softmax entropy, mean over rows); see docs/videodata.md
"""


def positive_int(text: str) -> int:
    """argparse type for counts: 0 or a negative number would be replaced or misused silently."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # no package imports here: `vc-attention --help` builds every parser and must not load torch
    parser.epilog = JSON_LEGEND
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    data = parser.add_argument_group("data (default: the embedded video-like sample; unset sizes take its values)")
    data.add_argument("--qkv", metavar="FILE", help="captured Q/K/V (safetensors from the Capture node)")
    data.add_argument("--entry", help="entry in FILE (default: the first one)")
    data.add_argument("--frames", type=int, help="latent frames of the synthetic grid")
    data.add_argument("--height", type=int, help="grid height in tokens")
    data.add_argument("--width", type=int, help="grid width in tokens")
    data.add_argument("--heads", type=int, help="heads (captured data: keep the first N)")
    data.add_argument("--head-dim", type=int, choices=(64, 96, 128))
    data.add_argument("--text-tokens", type=int, help="text tokens before the video tokens")
    data.add_argument("--seed", type=int, help="synthetic data seed")
    data.add_argument(
        "--knob", action="append", default=[], metavar="NAME=VALUE", help="override a VideoDataKnobs field (repeatable)"
    )
    parser.add_argument(
        "--clusters", type=positive_int, help="V-Smooth k-means clusters (default: grouping default, at most N/128)"
    )
    parser.add_argument("--iters", type=positive_int, help="V-Smooth k-means iterations (default: grouping default)")
    parser.add_argument("--device", choices=("cpu", "cuda"), help="cpu or cuda (default: cuda if available)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON instead of a table")
    parser.add_argument(
        "--calibration",
        action="store_true",
        help="print the calibration statistics of the data (docs/videodata.md) instead of the table",
    )
    parser.add_argument(
        "--removal-only",
        action="store_true",
        help="with --calibration: only the block-mean removals (no O(N^2) attention; for video-size grids)",
    )


def parse_knobs(pairs: list[str]) -> dict:
    """['regions=8', 'centre_energy=0.7'] -> {'regions': 8, 'centre_energy': 0.7}, typed by the field."""
    from ..study.videodata import DEFAULT_KNOBS

    knobs = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not hasattr(DEFAULT_KNOBS, name):
            raise ValueError(f"--knob takes NAME=VALUE with NAME a VideoDataKnobs field, got {pair!r}.")
        knobs[name] = type(getattr(DEFAULT_KNOBS, name))(value)
    return knobs


def _load(args):
    """(q, k, v, description) from the arguments."""
    import torch

    from ..study import videodata

    if args.qkv:
        q, k, v = videodata.load_captured_qkv(args.qkv, args.entry)
        if args.knob:
            raise ValueError("--knob applies to synthetic data only, not to --qkv.")
        if args.heads is not None:
            q, k, v = (t[:, : args.heads] for t in (q, k, v))
        source = f"captured: {args.qkv}" + (f" [{args.entry}]" if args.entry else "")
        return q, k, v, source
    chosen = {
        "H": args.heads,
        "T": args.frames,
        "Hgrid": args.height,
        "Wgrid": args.width,
        "D": args.head_dim,
        "text_tokens": args.text_tokens,
        "seed": args.seed,
    }
    size = {**videodata.EMBEDDED_SIZE, **{key: val for key, val in chosen.items() if val is not None}}
    knobs = parse_knobs(args.knob)
    q, k, v = videodata.video_like_qkv(**size, **knobs, dtype=torch.float32)
    kind = "embedded sample" if size == videodata.EMBEDDED_SIZE and not knobs else "video-like"
    return q, k, v, f"{kind} (synthetic, calibrated data; study/videodata.py)"


def _fmt_pct(x: float) -> str:
    return f"{100 * x:.2f}%" if math.isfinite(x) else "-"


def _fmt(x: float) -> str:
    """Five decimals; '-' for a figure a row cannot have (a peer kernel run as a black box)."""
    return f"{x:.5f}" if math.isfinite(x) else "-"


def format_table(rows) -> str:
    """Markdown table: method | rel-L2 | PSNR | TV | QK-term | V-term."""
    lines = [
        "| method | rel-L2 | PSNR (dB) | TV mean / max | QK-term | V-term |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.method} | {r.rel_l2:.5f} | {r.psnr_db:.2f} | {_fmt_pct(r.tv_mean)} / {_fmt_pct(r.tv_max)} "
            f"| {_fmt(r.qk_term)} | {_fmt(r.v_term)} |"
        )
    return "\n".join(lines)


def _finite_or_none(value):
    return value if not isinstance(value, float) or math.isfinite(value) else None


def run(args) -> int:
    import torch

    from ..kernels import grouping
    from ..study import fidelity
    from . import fidelity_peers
    from .errors import require_cuda

    if args.device == "cuda":
        require_cuda("vc-attention fidelity --device cuda")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    started = time.perf_counter()
    try:
        q, k, v, source = _load(args)
    except ValueError as err:
        print(f"vc-attention fidelity: {err}", file=sys.stderr)
        return 2
    q, k, v = (t.to(device) for t in (q, k, v))
    clusters = fidelity.default_clusters(q.shape[-2]) if args.clusters is None else args.clusters
    iters = grouping.DEFAULT_ITERS if args.iters is None else args.iters
    b, h, n, d = q.shape
    info = {
        "data": source,
        "shape": [b, h, n, d],
        "dtype": str(q.dtype).replace("torch.", ""),
        "grouping": {"clusters": clusters, "iters": iters},
        "device": torch.cuda.get_device_name(q.device) if q.is_cuda else "cpu",
        "torch": torch.__version__,
    }
    print(f"fidelity: {source}, (B,H,N,D)={tuple(q.shape)}, {info['dtype']}, on {info['device']}", file=sys.stderr)

    def progress(stage):
        print(f"  [{time.perf_counter() - started:6.1f} s] {stage} ...", file=sys.stderr, flush=True)

    if args.calibration:
        progress("calibration statistics")
        stats = fidelity.calibration_stats(q, k, v, clusters=clusters, iters=iters, attention=not args.removal_only)
        if args.json:
            print(json.dumps(dict(info, calibration=stats), indent=2))
        else:
            print(f"data: {source}, (B,H,N,D) = {tuple(q.shape)}; k-means {clusters} clusters, {iters} iterations")
            for name, value in stats.items():
                print(f"{name:22s} {value:.4f}")
        return 0
    notes: list[str] = []

    def peer_rows(exact):
        reason = fidelity_peers.unavailable_reason(q)
        if reason:
            notes.append(f"no SageAttention rows: {reason}")
            return []
        return fidelity_peers.sageattention_rows(q, k, v, exact, notes)

    rows = fidelity.fidelity_table(q, k, v, clusters=clusters, iters=iters, progress=progress, extra_rows=peer_rows)
    progress(f"done, {len(rows)} methods")
    for note in notes:
        print(f"  {note}", file=sys.stderr)
    if args.json:
        out = dict(info, rows=[{key: _finite_or_none(val) for key, val in r.as_dict().items()} for r in rows], notes=notes)
        print(json.dumps(out, indent=2))
        return 0
    print(
        f"data: {source}\n(B,H,N,D) = {tuple(q.shape)} {info['dtype']}; V-Smooth grouping: k-means "
        f"{clusters} clusters, {iters} iterations; device {info['device']}, torch {info['torch']}\n"
        "errors against fp64 exact attention; QK-term, V-term relative to ||O||; PSNR peak = max|O|\n"
    )
    print(format_table(rows))
    return 0
