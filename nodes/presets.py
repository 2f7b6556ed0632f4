"""The VC-Attention node's widgets: presets, defaults, ranges and tooltips in ONE table.

The node schema (nodes/node_attention.py), the web extension (web/presets.json, written from this
module by `python -m vc_attention.nodes.presets --write-web`) and the README's widget table
(`python -m vc_attention.nodes.presets --markdown`) all come from this file, so a default can never
differ between them.

Why each preset value (figures from the VC-Attention paper, except the elements/clk/SM and the 3.5x,
which are our own H200 measurements):
- precision "int8-qk/fp8-pv" everywhere: INT8 Q/K with FP8 P/V is the paper's 8-bit datacenter
  configuration (H200, B200); "fp8-qk/fp8-pv" is its B300 setting (no INT8 tensor cores there).
- v_smooth on everywhere: the value term is 82% of the 8-bit output error and V-Smooth is what
  removes it; its cost is 3-4% of attention time averaged over a run.
- expcast off in fidelity, on in balanced and speed: ExpCast removes the exp2 + cast bottleneck of the
  softmax (26.9 vs 14.8 elements/clk/SM on the H200 for the paper's encoding) but costs 0.7-2.1 dB
  PSNR in the paper, whose encoding is 3.5x less accurate than exp2 + cast at 32K tokens in our
  measurements. Our corrected encoding (reference.p_expcast) is within 2-3% of exp2 + cast in rel-L2
  (emulated at 32,760 tokens with the node's grouping: 0.01026 vs 0.01003, docs/fidelity-study.md;
  0.0109 vs 0.0107 measured on the H200) and its kernel is 8-9% faster at Wan2.2-14B 720p
  (docs/kernel-notes.md section 14): the balanced trade. Fidelity runs config.FIDELITY: the same chord for every
  key on its own exp2 loop (128-row value means, no merging) plus a second FP8 term for the value residual's 30
  busiest channels (32 until section 42: 0.653x / 0.681x SageAttention 2.2's rel-L2 at 32,760 / 75,600 tokens on an
  H100, docs/kernel-notes.md section 38; 30 channels measured +0.8% rel-L2 for 1.4-3.3% less time, section 42).
- grouping_window 0.25 everywhere: the paper's schedule (grouping in the first 25% of the steps);
  grouping at every step gains only 0.5 dB PSNR, with worse SSIM/LPIPS, at +30% attention time.
- clusters / kmeans_iters: more clusters and iterations make the 128-token blocks of the permuted V
  more homogeneous (less residual energy to quantize) at a higher grouping cost, which is paid only
  inside the grouping window. Balanced uses kernels/grouping.py's defaults (64 x 2, the grouping sweep of
  docs/grouping.md) with 8 within-cluster bins (WITHIN_BINS): with config.SPEED's K scales per lane its rel-L2 is
  1.127x / 1.113x fidelity's at 32,760 / 75,600 tokens, measured on an H100 with the real kernels
  (bench/results/nvidia-h100-speed-ratio-presets.json; the CPU emulation predicted 1.127x / 1.114x). 128 x 1
  with bins is 1-1.5 points lower still, but 64 clusters keep the fused grouping kernels on every GPU (128 at head
  dim 128 need 148 KB of shared memory: more than an RTX 40/50 has, docs/kernel-notes.md section 42). Speed runs one
  iteration without bins (the cheapest grouping: about 2/3 of 64 x 2's time; 1.148x / 1.144x fidelity's rel-L2 with
  lanes, measured in the same run); fidelity runs 128 clusters x 1 iteration, which on the H200 is both more faithful and faster
  than the 64 x 4 it replaced: rel-L2 0.726x / 0.753x SageAttention 2.2's at 32,760 / 75,600 tokens
  against 0.737x / 0.769x, grouping 6.5 ms against 8.1 ms at Wan2.2-14B 720p
  (bench/results/nvidia-h200-preset-groupings.json, `python3 bench/grouping_fidelity_gpu.py`). Every
  preset keeps the per-layer cache of Wan2.2-14B 720p + CFG under 300 MB (nodes/cache.py: 298 MB at
  128 clusters, whose warm-start centroids the cache keeps as E4M3 codes).
"""
from __future__ import annotations

import json
from pathlib import Path

from ..kernels.config import FIDELITY, PLAIN_8BIT, SPEED, VCConfig
from ..kernels.grouping import DEFAULT_CLUSTERS, DEFAULT_ITERS, DEFAULT_WITHIN_BINS

MODES = ("fidelity", "balanced", "speed", "custom")
DEFAULT_MODE = "balanced"

# precision widget value -> VCConfig.qk; "off" means the model's own attention
PRECISIONS = {"int8-qk/fp8-pv": "int8", "fp8-qk/fp8-pv": "fp8", "off": None}

# The widgets a preset sets (mode "custom" keeps the user's values instead).
PRESETS: dict[str, dict[str, object]] = {
    "fidelity": {
        "precision": "int8-qk/fp8-pv",
        "v_smooth": True,
        "expcast": False,
        "grouping_window": 0.25,
        "clusters": 2 * DEFAULT_CLUSTERS,
        "kmeans_iters": max(1, DEFAULT_ITERS // 2),
    },
    "balanced": {
        "precision": "int8-qk/fp8-pv",
        "v_smooth": True,
        "expcast": True,
        "grouping_window": 0.25,
        "clusters": DEFAULT_CLUSTERS,
        "kmeans_iters": DEFAULT_ITERS,
    },
    "speed": {
        "precision": "int8-qk/fp8-pv",
        "v_smooth": True,
        "expcast": True,
        "grouping_window": 0.25,
        "clusters": DEFAULT_CLUSTERS,
        "kmeans_iters": max(1, DEFAULT_ITERS // 2),
    },
}

# Every widget of the VC-Attention node in schema order (after the MODEL input). "kind" is the
# widget type; "advanced" widgets are folded away in ComfyUI's UI. Defaults of preset-governed
# widgets are the DEFAULT_MODE preset, so a fresh node shows exactly that preset.
WIDGETS: dict[str, dict[str, object]] = {
    "mode": {
        "kind": "combo",
        "options": list(MODES),
        "default": DEFAULT_MODE,
        "tooltip": "fidelity / balanced / speed set the widgets below from one preset table; custom uses "
        "your own values. With a preset selected, the preset's values are the ones that run.",
    },
    "precision": {
        "kind": "combo",
        "options": list(PRECISIONS),
        "tooltip": "int8-qk/fp8-pv: INT8 Q and K, FP8 probabilities and values (Hopper, Ada, RTX 50). "
        "fp8-qk/fp8-pv: FP8 everywhere (for GPUs without fast INT8). off: the model's own attention.",
    },
    "v_smooth": {
        "kind": "boolean",
        "tooltip": "V-Smooth: regroup value tokens with k-means so each 128-token block is similar, subtract "
        "the block mean and quantize only the residual. Most of the 8-bit fidelity gain comes from this. The "
        "fidelity and balanced presets also order each cluster's tokens in 8 bins along the cluster chain (up to "
        "1.5% less error at 32,760 tokens).",
    },
    "expcast": {
        "kind": "boolean",
        "tooltip": "ExpCast-FP8: build the FP8 probabilities from the log-domain score with integer and "
        "multiply-add instructions, skipping the exponential unit. Faster softmax; about 1.5 dB lower "
        "attention PSNR than fidelity mode on the built-in sample (emulated, vc-attention demo: fidelity also "
        "keeps a second FP8 term of the value residual on its busiest channels, which ExpCast modes skip). With "
        "V-Smooth it also takes value means per 256 tokens instead of 128, merged where neighbouring means "
        "agree (the Hopper kernel then restores a mean only where it changes: ~8% faster there at 720p, "
        "about 1.5% more attention error).",
    },
    "grouping_window": {
        "kind": "float",
        "min": 0.0,
        "max": 1.0,
        "step": 0.01,
        "tooltip": "Fraction of the denoising schedule (from the start) in which the token grouping is "
        "recomputed; later steps reuse it. 0.25 is the paper's setting; 0 groups once and reuses it.",
    },
    "clusters": {
        "kind": "int",
        "min": 2,
        "max": 1024,
        "step": 1,
        "advanced": True,
        "tooltip": "k-means clusters per attention head for V-Smooth grouping. More clusters give more "
        "uniform blocks and cost more on grouping steps. Up to 256 the labels take 1 byte per token.",
    },
    "kmeans_iters": {
        "kind": "int",
        "min": 0,
        "max": 32,
        "step": 1,
        "advanced": True,
        "tooltip": "k-means iterations per grouping step (after the first step each grouping starts from "
        "the previous step's centroids, so few iterations suffice).",
    },
    "start_percent": {
        "kind": "float",
        "default": 0.0,
        "min": 0.0,
        "max": 1.0,
        "step": 0.01,
        "tooltip": "Where in the denoising schedule VC-Attention starts; before it the model's own "
        "attention runs.",
    },
    "end_percent": {
        "kind": "float",
        "default": 1.0,
        "min": 0.0,
        "max": 1.0,
        "step": 0.01,
        "tooltip": "Where in the denoising schedule VC-Attention stops; after it the model's own "
        "attention runs.",
    },
    "backend": {
        "kind": "combo",
        "default": "auto",
        "advanced": True,
        "tooltip": "auto: the fastest kernel this GPU supports (calls no kernel can take run the model's "
        "own attention and are counted). A named backend is used for every eligible call or the "
        "run stops with the reason. 'reference' is the exact emulation: slow, for checks only.",
    },
}
for _name, _value in PRESETS[DEFAULT_MODE].items():
    WIDGETS[_name]["default"] = _value

PRESET_WIDGETS = tuple(PRESETS[DEFAULT_MODE])

# V-Smooth's within-cluster bins per preset (kernels/grouping_within.py). Not a widget: like the cluster chain order
# it only reorders tokens the grouping already placed, so there is nothing to tune; custom takes the grouping's
# default. The fidelity preset gains without a speed cost (its loop restores every step's means). Measured on the H200
# with the real kernels (docs/kernel-notes.md section 35): 8 bins lower fidelity's rel-L2 by 1.5% / 0.2% at 32,760 /
# 75,600 tokens for a 0.6 ms reuse permutation at Wan2.2-14B 720p (< 0.5% of its 140 ms call). The ExpCast loop pays
# more V-Smooth segment ends for them (+1.6% at Wan2.2-14B then); balanced takes them with lane scales to bring its
# error within 1.15x of fidelity's with margin (issue 10: 1.127x at 32,760 tokens, 1.148x for speed's 64 x 1 without
# bins; kernel-notes section 42); speed keeps the cheapest grouping.
WITHIN_BINS: dict[str, int] = {"fidelity": 8, "balanced": 8, "speed": DEFAULT_WITHIN_BINS}


def within_bins(mode: str) -> int:
    """The within-cluster bins a mode's groupings take (custom: kernels.grouping.DEFAULT_WITHIN_BINS)."""
    return WITHIN_BINS.get(mode, DEFAULT_WITHIN_BINS)


def validate_widget(name: str, value: object) -> None:
    """Raise ValueError with a readable sentence if `value` is not allowed for widget `name`."""
    spec = WIDGETS.get(name)
    if spec is None:
        raise ValueError(f"VC-Attention has no widget called {name!r}; widgets: {', '.join(WIDGETS)}.")
    kind = spec["kind"]
    if kind == "combo":
        options = spec.get("options")
        if options is not None and value not in options:
            raise ValueError(f"VC-Attention: {name} must be one of {', '.join(map(str, options))}; got {value!r}.")
    elif kind == "boolean":
        if not isinstance(value, bool):
            raise ValueError(f"VC-Attention: {name} must be true or false; got {value!r}.")
    else:
        is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if kind == "int" and not (is_number and float(value).is_integer()):
            raise ValueError(f"VC-Attention: {name} must be a whole number; got {value!r}.")
        if not is_number or not spec["min"] <= value <= spec["max"]:
            raise ValueError(
                f"VC-Attention: {name} must be a number from {spec['min']} to {spec['max']}; got {value!r}."
            )


def resolve(mode: str, widgets: dict[str, object]) -> dict[str, object]:
    """The widget values that run: the preset's for its widgets unless mode is "custom".

    `widgets` holds the node's widget values (mode excluded); every value is validated, including
    the ones a preset overrides, so a broken workflow is reported rather than silently fixed.
    """
    validate_widget("mode", mode)
    for name, value in widgets.items():
        validate_widget(name, value)
    resolved = dict(widgets)
    if mode != "custom":
        resolved.update(PRESETS[mode])
    if resolved["start_percent"] >= resolved["end_percent"]:
        raise ValueError(
            f"VC-Attention: start_percent ({resolved['start_percent']}) must be below end_percent "
            f"({resolved['end_percent']}), otherwise VC-Attention never runs."
        )
    return resolved


def config_from_widgets(widgets: dict[str, object]) -> VCConfig:
    """The kernel configuration of resolved widget values (precision, v_smooth, expcast).

    precision "off" has no configuration: the caller keeps the model's own attention instead.
    """
    qk = PRECISIONS[widgets["precision"]]
    if qk is None:
        raise ValueError(
            "VC-Attention: precision 'off' runs the model's own attention; there is no kernel configuration."
        )
    vsmooth, expcast = bool(widgets["v_smooth"]), bool(widgets["expcast"])
    # INT8 Q/K with V-Smooth and without ExpCast is config.FIDELITY's kernel: its P encoding (the chord on the exp2
    # loop) and the V residual's second term; per-channel V (config.PLAIN_8BIT) and FP8 Q/K keep exp2 without the term
    fidelity = vsmooth and not expcast and qk == "int8"
    return VCConfig(
        qk=qk,
        v="vsmooth" if vsmooth else "per_channel",
        p="expcast" if expcast else (FIDELITY.p if fidelity else "exp2"),
        v_lo_channels=FIDELITY.v_lo_channels if fidelity else 0,
        # ExpCast with V-Smooth is the speed kernel: V means per 256 tokens (merged into segments where
        # config.SPEED merges them), as config.SPEED
        v_mean_rows=SPEED.v_mean_rows if vsmooth and expcast else FIDELITY.v_mean_rows,
        v_mean_merge=SPEED.v_mean_merge if vsmooth and expcast else False,
        # and one K scale per 256-key step with V-Smooth, as config.SPEED and config.FIDELITY (per-channel V: as
        # config.PLAIN_8BIT); fidelity pairs them for the Hopper INT8 loop only, so FP8 Q/K keep one per tile there
        k_scale_rows=(SPEED.k_scale_rows if expcast else (FIDELITY.k_scale_rows if qk == "int8" else PLAIN_8BIT.k_scale_rows))
        if vsmooth else PLAIN_8BIT.k_scale_rows,
        # K scales per lane as config.SPEED (the ExpCast modes; fidelity's error target holds without them) where
        # the loops read paired K scales: INT8 with V-Smooth
        k_lane_scales=SPEED.k_lane_scales and vsmooth and expcast and qk == "int8",
    )


def web_table() -> dict[str, object]:
    """What web/presets.json holds: the presets and every widget's default, range and tooltip."""
    return {"modes": list(MODES), "default_mode": DEFAULT_MODE, "presets": PRESETS, "widgets": WIDGETS}


def widgets_markdown() -> str:
    """The README's widget table, generated from this table (so the docs cannot drift)."""
    rows = ["| widget | default | range / options | " + " | ".join(PRESETS) + " | what it does |",
            "|---|---|---|" + "---|" * len(PRESETS) + "---|"]
    for name, spec in WIDGETS.items():
        if "options" in spec:
            span = ", ".join(map(str, spec["options"]))
        elif spec["kind"] == "combo":
            span = "auto + the registered backends"
        elif spec["kind"] == "boolean":
            span = "on / off"
        else:
            span = f"{spec['min']} - {spec['max']}"
        per_mode = " | ".join(str(PRESETS[m].get(name, "")) for m in PRESETS)
        advanced = " (advanced)" if spec.get("advanced") else ""
        rows.append(f"| `{name}`{advanced} | {spec['default']} | {span} | {per_mode} | {spec['tooltip']} |")
    return "\n".join(rows) + "\n"


WEB_PRESETS_PATH = Path(__file__).resolve().parent.parent / "web" / "presets.json"


def web_json() -> str:
    return json.dumps(web_table(), indent=2) + "\n"


def write_web_presets(path: Path = WEB_PRESETS_PATH) -> Path:
    path.write_text(web_json(), encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    """`python -m vc_attention.nodes.presets --write-web | --markdown`: nothing is written unasked."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m vc_attention.nodes.presets",
                                     description="Generate the files that come from the widget table.")
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write-web", action="store_true", help=f"rewrite {WEB_PRESETS_PATH}")
    action.add_argument("--markdown", action="store_true", help="print the README's widget table")
    args = parser.parse_args(argv)
    if args.markdown:
        print(widgets_markdown(), end="")
    else:
        print(f"wrote {write_web_presets()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
