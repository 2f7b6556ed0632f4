"""BENCHMARKS.md and the README's headline block, rendered from bench/results/*.json.

`vc-attention bench --report` writes both (and `--save` does after a run); tests/test_bench_report.py
fails when the committed files differ from what this renders, so no figure is typed by hand.
"""
from __future__ import annotations

import json
from pathlib import Path

from .bench_results import RESULTS_DIR, SCHEMA, preset_tags

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "BENCHMARKS.md"
README = ROOT / "README.md"
HEADLINE_SHAPE = "wan22-14b-720p"
HEADLINE_BEGIN, HEADLINE_END = "<!-- headline:begin -->", "<!-- headline:end -->"
NAMES = {
    "sdpa-cudnn": "cuDNN SDPA (bf16)",
    "sdpa-flash": "flash SDPA (bf16)",
    "sageattn-2.2": "SageAttention 2.2 `sageattn`",
    "sageattn-2.2-portable-fp16acc": "SageAttention 2.2 portable, fp32+fp16",
    "sageattn-2.2-portable-fp32acc": "SageAttention 2.2 portable, fp32+fp32",
    "vc-plain8": "VC-Attention plain 8-bit (no V-Smooth)",
    "vc-fidelity": "VC-Attention **fidelity** (V-Smooth)",
    "vc-speed": "VC-Attention **speed** (V-Smooth + ExpCast)",
    # the e2e table's rows are the node's presets: balanced runs the speed kernel with a finer grouping
    "vc-balanced": "VC-Attention **balanced** (V-Smooth + ExpCast, the default preset)",
}
METHOD_NOTE = """\
Method: CUDA events, one warm-up call, median of the repetitions named in the command (default 10;
in the attention and grouping tables a short call repeats until its timed calls add up to 100 ms, at
most 200 times), random bf16 inputs (not zeros) in layout (B, H, N, D), every method of a shape in the same process on
the same tensors. VC-Attention times include its preprocessing (K smoothing, INT8/FP8 quantization,
permutation gather, V-Smooth block means, transposed FP8 residual); the V-Smooth grouping (k-means +
permutation) is timed separately (Grouping), because a sampling run computes it only inside the
grouping window. TOPS-equiv. = 4*B*H*N^2*D / time; % of FP8 peak is against the 1979 T/s dense FP8
rate of the H100/H200 SXM datasheet. rel-L2: relative L2 error against float64 exact attention on
the video-like data of study/videodata.py (32,760 tokens = 21 x 30 x 52, 2 heads, 1,024 sampled
query rows, the shape's head dim), synthetic and calibrated, not a real model's activations; the
cuDNN row is the bf16 output's own rounding floor. `x SA2.2` compares with SageAttention 2.2's
`sageattn` (its Hopper kernel here), `x SA2.2 portable` with its portable mma.sync kernel
(`sageattn_qk_int8_pv_fp8_cuda`, fp32+fp16 accumulation: what RTX 40/50 users run). SageAttention is
measured from its own wheel, never bundled."""


def _num(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _name(method: str) -> str:
    return NAMES.get(method, method)


def load_all() -> dict[str, dict]:
    """{file name: document} for every results file of the current schema, sorted by name."""
    out = {}
    for path in sorted(RESULTS_DIR.glob("*.json")):
        doc = json.loads(path.read_text())
        # other tools' results files share the folder, in shapes of their own (a list, for one)
        if isinstance(doc, dict) and doc.get("schema") == SCHEMA:
            out[path.name] = doc
    return out


def _env_line(section: str, env: dict, source: str) -> str:
    return (f"| {section} | {env['gpu']} | {env['driver']} | {env['torch']} | {env['cuda']} | {env['cudnn']} | "
            f"{env['sageattention'] or 'not installed'} | {env['date']} | `{env['command']}` | {source} |")


def stale_presets(env: dict) -> list[str]:
    """A sentence for each mode whose preset differs from the one this section measured (env["presets"], recorded
    since session 28; sections without it say nothing): its rows are that run's preset, not today's."""
    measured, today = env.get("presets") or {}, preset_tags()
    changed = [m for m in today if m in measured and measured[m] != today[m]]
    return [f"The {m} rows measured the {m} preset of that run (`{measured[m]}`); today's is `{today[m]}` "
            "(docs/kernel-notes.md), measured in this table by the next `vc-attention bench --save`." for m in changed]


def stale_portable_build(env: dict) -> list[str]:
    """A sentence when the `mma` build this section measured (env["mma_build"], recorded since session 40; sections
    without it say nothing) is no longer the default for its arch and PV accumulation: its portable rows are that build's."""
    from ..kernels import mma_variants

    measured = env.get("mma_build")
    if not measured:
        return []
    today = mma_variants.default_variant(measured["arch"], measured["pv_accum"])
    if today == measured["variant"]:
        return []
    return ["", f"The `mma` rows measured the portable build of that run (`{measured['variant']}`); today's default for "
            f"sm_{measured['arch'].replace('.', '')} is `{today}` (kernels/mma_variants.py, docs/kernel-notes.md), "
            "measured in this table by the next `vc-attention bench --save`."]


def _stale_lines(env: dict) -> list[str]:
    """stale_presets' sentences as report lines, each after a blank line (none when no preset changed)."""
    return [line for note in stale_presets(env) for line in ("", note)]


def _in_table(row: dict, portable: bool) -> bool:
    """The portable tables hold the portable kernels plus cuDNN as the common yardstick."""
    return (row["portable"] or row["method"] == "sdpa-cudnn") if portable else not row["portable"]


def _attention_tables(rows: list[dict], portable: bool) -> list[str]:
    out = []
    for shape in dict.fromkeys(r["shape"] for r in rows):
        picked = [r for r in rows if r["shape"] == shape and _in_table(r, portable)]
        if portable and not any(r["portable"] for r in picked):
            continue
        r0 = picked[0]
        out += ["", f"**{shape}** (B{r0['B']} H{r0['H']} N{r0['N']:,} D{r0['D']})", ""]
        if portable:
            out += ["| method | backend | ms | x cuDNN | x SA2.2 portable | rel-L2 (video-like) |", "|---|---|---|---|---|---|"]
            out += [f"| {_name(r['method'])} | {r['backend'] or '-'} | {r['ms']:.2f} | {_num(r['x_cudnn'], '.2f')} | "
                    f"{_num(r['x_sageattn_portable'], '.2f')} | {_num(r['rel_l2_video_like'], '.4f')} |" for r in picked]
        else:
            out += ["| method | backend | ms | TOPS-equiv. | % of FP8 peak | x cuDNN | x SA2.2 | rel-L2 (video-like) |",
                    "|---|---|---|---|---|---|---|---|"]
            out += [f"| {_name(r['method'])} | {r['backend'] or '-'} | {r['ms']:.2f} | {r['tops_eq']:.0f} | "
                    f"{100 * r['fp8_peak_fraction']:.1f} | {_num(r['x_cudnn'], '.2f')} | {_num(r['x_sageattn'], '.2f')} | "
                    f"{_num(r['rel_l2_video_like'], '.4f')} |" for r in picked]
    return out


def _fidelity_grouping_note(rows: list[dict]) -> list[str]:
    """Which V-Smooth grouping each of our modes' rel-L2 was measured with (rows saved since it is recorded)."""
    seen = dict.fromkeys((r["method"], r["rel_l2_grouping"]) for r in rows if r.get("rel_l2_grouping"))
    if not seen:
        return []
    return ["", "rel-L2 grouping (k-means clusters x iterations, each mode's preset): " +
            ", ".join(f"{_name(method)} {g}" for method, g in seen) + "."]


def _grouping_table(rows: list[dict]) -> list[str]:
    out = ["| shape | clusters x iterations | grouping ms | speed-mode call ms | share of the call |", "|---|---|---|---|---|"]
    return out + [f"| {r['shape']} (B{r['B']} H{r['H']} N{r['N']:,} D{r['D']}) | {r['clusters']} x {r['iters']} | "
                  f"{r['ms']:.2f} | {r['speed_call_ms']:.2f} | {100 * r['share_of_speed_call']:.0f}% |" for r in rows]


def _e2e_table(rows: list[dict]) -> list[str]:
    r0 = rows[0]
    out = [f"Wan 14B transformer (diffusers, random weights), {r0['layers']} layers, {r0['width']}x{r0['height']}, "
           f"{r0['frames']} frames = {r0['tokens']:,} tokens; one forward:", "",
           "| attention | forward ms | x SDPA | grouping forward ms | output rel-L2 vs SDPA |", "|---|---|---|---|---|"]
    out += [f"| {_name(r['method'])} | {r['forward_ms']:.0f} | {r['x_sdpa']:.2f} | {_num(r['grouping_forward_ms'], '.0f')} | "
            f"{r['rel_l2_vs_sdpa']:.4f} |" for r in rows]
    groupings = [f"{_name(r['method'])} {r['grouping']}" for r in rows if r.get("grouping")]
    # (rows saved before the grouping was recorded: 64 x 2 for both modes, fidelity with 8 bins)
    return out + (["", "Grouping (k-means clusters x iterations): " + "; ".join(groupings) + "."] if groupings else [])


def _multigpu_table(rows: list[dict]) -> list[str]:
    r0 = rows[0]
    out = [f"Wan 14B transformer (diffusers, random weights), {r0['layers']} layers, {r0['tokens']:,} tokens; one forward, "
           "Ulysses context parallel through diffusers (ContextParallelConfig(ulysses_degree=GPUs)):", "",
           "| attention | GPUs | forward ms | x same method on 1 GPU | x native on the same GPUs | rel-L2 vs native 1 GPU |",
           "|---|---|---|---|---|---|"]
    return out + [f"| {r['method']} | {r['gpus']} | {r['forward_ms']:.0f} | {r['x_1gpu']:.2f} | {r['x_native_2gpu']:.2f} | "
                  f"{r['rel_l2']:.4f} |" for r in rows]


COMFY_NAMES = {"default": "ComfyUI default attention", "sage": "`--use-sage-attention` (SageAttention 2.2)",
               "fidelity": "VC-Attention node, fidelity", "balanced": "VC-Attention node, balanced",
               "speed": "VC-Attention node, speed"}


def _comfyui_table(rows: list[dict]) -> list[str]:
    r0 = rows[0]
    out = [f"ComfyUI's own WanModel at Wan2.1-1.3B widths ({r0['layers']} blocks, random bf16 weights), "
           f"{r0['tokens']:,} tokens (480p, 81 frames), {r0['steps']} euler steps, CFG 5; seconds per sampling run. "
           "With random weights the attention rows are broad, so the latent's error hardly separates the presets: "
           "this section measures time; the kernel tables measure fidelity.", "",
           "| attention | s | x default | x `--use-sage-attention` | final latent rel-L2 vs default | VC calls by backend |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        calls = ", ".join(f"{k} {v}" for k, v in sorted((r.get("backend_calls") or {}).items())) or "-"
        name = COMFY_NAMES.get(r['mode'], r['mode'])
        if r.get("preset"):  # rows saved since the worker records the preset's values as they ran
            name += f" (grouping {r['preset']['clusters']} x {r['preset']['kmeans_iters']})"
        out.append(f"| {name} | {r['seconds']:.2f} | {r['x_default']:.2f} | "
                   f"{_num(r['x_sage'], '.2f')} | {r['rel_l2_vs_default']:.4f} | {calls} |")
    if any(r.get("x_sage_rounds") for r in rows):
        rounds = len(rows[0]["seconds_rounds"])
        per_round = "; ".join(f"{COMFY_NAMES.get(r['mode'], r['mode'])} "
                              + ", ".join(f"{x:.3f}" for x in r["x_sage_rounds"])
                              for r in rows if r.get("x_sage_rounds") and r["mode"] not in ("sage",))
        out += ["", f"Seconds are the median of {rounds} rounds (each round runs every mode once, in the order above). "
                f"x `--use-sage-attention` per round: {per_round}."]
    if any(r.get("pyav_placeholder") for r in rows):
        out += ["", "PyAV was not installed on this machine: ComfyUI's module-level `import av` (video file I/O, "
                "unused by sampling) got named placeholders that raise on any use (commands/comfyui_av_placeholder.py)."]
    return out


def render_benchmarks(docs: dict[str, dict]) -> str:
    lines = ["# Benchmarks", "",
             "Generated by `vc-attention bench --report` from the results files in [bench/results](bench/results);",
             "`vc-attention bench --all --save` on a GPU re-measures and regenerates them. Do not edit by hand:",
             "tests/test_bench_report.py fails when this file differs from what the command renders.", ""]
    if not docs:
        return "\n".join(lines + ["No results of the current schema yet.", ""])
    lines += ["## Environment and command of each section", "",
              "| section | GPU | driver | torch | CUDA | cuDNN | SageAttention | date | command | results |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for name, doc in docs.items():
        lines += [_env_line(section, part["env"], f"[{name}](bench/results/{name})") for section, part in doc["sections"].items()]
    lines += ["", METHOD_NOTE]
    for doc in docs.values():
        sections, gpu = doc["sections"], next(iter(doc["sections"].values()))["env"]["gpu"]
        if "attention" in sections:
            rows = sections["attention"]["rows"]
            lines += ["", f"## Attention kernels on {gpu}"] + _fidelity_grouping_note(rows) + _attention_tables(rows, portable=False)
            lines += _stale_lines(sections["attention"]["env"])
            if any(r["portable"] for r in rows):
                lines += ["", f"## Portable kernels (the RTX 40/50 path), measured on {gpu} as a proxy",
                          "", "Our `mma` backend and SageAttention 2.2's sm89 kernel, both built for this GPU."]
                lines += _attention_tables(rows, portable=True)
                lines += stale_portable_build(sections["attention"]["env"])
        if "grouping" in sections:
            lines += ["", f"## Grouping (V-Smooth k-means + ordering + permutation) on {gpu}", ""] + _grouping_table(sections["grouping"]["rows"])
        if "e2e" in sections:
            lines += ["", f"## End to end on {gpu}", ""] + _e2e_table(sections["e2e"]["rows"])
            lines += _stale_lines(sections["e2e"]["env"])
        if "e2e-multigpu" in sections:
            lines += ["", f"## End to end on several GPUs ({gpu})", ""] + _multigpu_table(sections["e2e-multigpu"]["rows"])
        if "comfyui" in sections:
            lines += ["", f"## Sampling in real ComfyUI on {gpu}", ""] + _comfyui_table(sections["comfyui"]["rows"])
            lines += _stale_lines(sections["comfyui"]["env"])
    return "\n".join(lines) + "\n"


def render_headline(docs: dict[str, dict]) -> str:
    # the newest attention run, whichever GPU it ran on: the lender hands out H100s and H200s, and the headline should
    # be the figures the project stands behind today. A run that measured today's presets (no stale_presets note) is
    # newer than any run that measured an earlier preset, whatever their dates say: the dates are days, and two GPUs
    # can run the same day on both sides of a preset change. Then the ISO date, then the file name breaks a tie
    with_attention = [(not stale_presets(d["sections"]["attention"]["env"]), d["sections"]["attention"]["env"].get("date", ""),
                       name, d) for name, d in docs.items() if "attention" in d["sections"]]
    doc = max(with_attention, key=lambda x: x[:3])[3] if with_attention else None
    if doc is None:
        return "No benchmark results yet: see [BENCHMARKS.md](BENCHMARKS.md)."
    env = doc["sections"]["attention"]["env"]
    rows = [r for r in doc["sections"]["attention"]["rows"] if r["shape"] == HEADLINE_SHAPE and not r["portable"]
            and r["method"] != "sdpa-flash"]
    r0 = rows[0]
    lines = [f"**Measured on one {env['gpu']}** (driver {env['driver']}, torch {env['torch']}, CUDA {env['cuda']}, "
             f"cuDNN {env['cudnn']}, SageAttention {env['sageattention'] or 'not installed'}; `{env['command']}`; "
             "all tables in [BENCHMARKS.md](BENCHMARKS.md)), Wan2.2-14B 720p attention shape "
             f"(B{r0['B']} H{r0['H']} N{r0['N']:,} D{r0['D']}), preprocessing included:", "",
             "| attention | ms | x cuDNN SDPA | x SageAttention 2.2 | rel-L2 on video-like data |", "|---|---|---|---|---|"]
    lines += [f"| {_name(r['method'])} | {r['ms']:.1f} | {_num(r['x_cudnn'], '.2f')} | {_num(r['x_sageattn'], '.2f')} | "
              f"{_num(r['rel_l2_video_like'], '.4f')} |" for r in rows]
    lines += _stale_lines(env)
    if "comfyui" in doc["sections"]:
        comfy = {r["mode"]: r for r in doc["sections"]["comfyui"]["rows"]}
        parts = [f"{mode} {comfy[mode]['seconds']:.2f} s ({_num(comfy[mode]['x_sage'], '.2f')}x, rel-L2 "
                 f"{comfy[mode]['rel_l2_vs_default']:.3f})" for mode in ("speed", "balanced", "fidelity") if mode in comfy]
        sage = comfy.get("sage")
        lines += ["", "Sampling in real ComfyUI (Wan2.1-1.3B widths, 32,760 tokens, "
                  f"{comfy['default']['steps']} euler steps, CFG): default attention {comfy['default']['seconds']:.2f} s, "
                  + (f"`--use-sage-attention` {sage['seconds']:.2f} s (rel-L2 {sage['rel_l2_vs_default']:.3f}), " if sage else "")
                  + "our node " + ", ".join(parts) + " (x = speed-up over `--use-sage-attention`; rel-L2 of the final latent "
                  "against the default attention)."]
    return "\n".join(lines)


def replace_headline(readme: str, headline: str) -> str:
    head, rest = readme.split(HEADLINE_BEGIN, 1)
    _, tail = rest.split(HEADLINE_END, 1)
    return f"{head}{HEADLINE_BEGIN}\n{headline}\n{HEADLINE_END}{tail}"


def write_all() -> list[Path]:
    docs = load_all()
    BENCHMARKS.write_text(render_benchmarks(docs))
    README.write_text(replace_headline(README.read_text(), render_headline(docs)))
    return [BENCHMARKS, README]
