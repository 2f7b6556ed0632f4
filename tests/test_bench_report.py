"""Benchmark figures in the docs are generated: the committed BENCHMARKS.md and README headline equal
what commands/bench_report.py renders from bench/results, and the results schema round-trips."""
import json

import pytest

from vc_attention.commands import bench, bench_report, bench_results

ENV = dict(gpu="NVIDIA H200", driver="580", torch="2.11.0+cu130", cuda="13.0", cudnn=91900, python="3.12.3",
           sageattention="2.2.0", command="vc-attention bench --all --save", date="2026-12-01")


def _attention_row(method, ms, backend=None, portable=False, shape="wan22-14b-720p"):
    return dict(shape=shape, B=1, H=40, N=75600, D=128, method=method, backend=backend, portable=portable, ms=ms,
                tops_eq=1000.0 / ms, fp8_peak_fraction=0.5 / ms, x_cudnn=200.0 / ms, x_sageattn=140.0 / ms,
                x_sageattn_portable=300.0 / ms, rel_l2_video_like=0.001 * ms / 100)


def _doc():
    doc = bench_results.empty()
    rows = [_attention_row("sdpa-cudnn", 200.0), _attention_row("sageattn-2.2", 140.0),
            _attention_row("sageattn-2.2-portable-fp16acc", 300.0, portable=True),
            _attention_row("vc-speed", 120.0, backend="sm90"), _attention_row("vc-speed", 250.0, backend="mma", portable=True),
            dict(_attention_row("vc-fidelity", 130.0, backend="sm90"), rel_l2_grouping="128 x 1")]
    rows[3]["rel_l2_grouping"] = rows[4]["rel_l2_grouping"] = "64 x 2"
    bench_results.merge(doc, "attention", ENV, rows)
    bench_results.merge(doc, "grouping", ENV, [dict(shape="wan22-14b-720p", B=1, H=40, N=75600, D=128, clusters=64,
                                                    iters=2, ms=6.0, speed_call_ms=120.0, share_of_speed_call=0.05)])
    common = dict(layers=40, tokens=75600, frames=81, height=720, width=1280)
    bench_results.merge(doc, "e2e", ENV, [dict(common, method="sdpa", forward_ms=12000.0, x_sdpa=1.0, rel_l2_vs_sdpa=0.0,
                                               grouping_forward_ms=None),
                                          dict(common, method="vc-speed", forward_ms=9000.0, x_sdpa=1.33,
                                               rel_l2_vs_sdpa=0.01, grouping_forward_ms=9500.0,
                                               grouping="128 x 1, 8 bins")])
    bench_results.merge(doc, "e2e-multigpu", ENV, [
        dict(method="native", gpus=1, forward_ms=12000.0, x_1gpu=1.0, x_native_2gpu=0.55, rel_l2=0.0, grouping_forward_ms=None,
             layers=40, tokens=75600, kernels=[]),
        dict(method="vc-balanced", gpus=2, forward_ms=5200.0, x_1gpu=1.85, x_native_2gpu=1.27, rel_l2=0.011,
             grouping_forward_ms=5400.0, layers=40, tokens=75600, kernels=["sm90"])])
    comfy = dict(steps=8, tokens=32760, layers=30, finite=True, fallbacks=None)
    bench_results.merge(doc, "comfyui", ENV, [
        dict(comfy, mode="default", seconds=12.0, x_default=1.0, x_sage=0.6, rel_l2_vs_default=0.0, backend_calls=None),
        dict(comfy, mode="sage", seconds=7.2, x_default=1.67, x_sage=1.0, rel_l2_vs_default=0.028, backend_calls=None),
        dict(comfy, mode="speed", seconds=6.0, x_default=2.0, x_sage=1.2, rel_l2_vs_default=0.013,
             backend_calls={"sm90": 480}),
        dict(comfy, mode="fidelity", seconds=6.5, x_default=1.85, x_sage=1.1, rel_l2_vs_default=0.012,
             backend_calls={"sm90": 480}, preset={"clusters": 128, "kmeans_iters": 1})])
    return doc


def test_committed_docs_are_what_the_report_renders():
    docs = bench_report.load_all()
    assert bench_report.BENCHMARKS.read_text() == bench_report.render_benchmarks(docs)
    readme = bench_report.README.read_text()
    assert bench_report.replace_headline(readme, bench_report.render_headline(docs)) == readme


def test_every_section_renders_and_figures_follow_the_rows():
    text = bench_report.render_benchmarks({"nvidia-h200.json": _doc()})
    for heading in ("## Attention kernels", "## Portable kernels", "## Grouping", "## End to end", "## End to end on several GPUs",
                    "## Sampling in real ComfyUI"):
        assert heading in text
    assert "| VC-Attention **speed** (V-Smooth + ExpCast) | sm90 | 120.00 | 8 | 0.4 | 1.67 | 1.17 | 0.0012 |" in text
    assert "| VC-Attention **speed** (V-Smooth + ExpCast) | mma | 250.00 | 0.80 | 1.20 | 0.0025 |" in text
    assert "| VC-Attention node, speed | 6.00 | 2.00 | 1.20 | 0.0130 | sm90 480 |" in text
    # rows that recorded the grouping of their rel-L2 say it, once per mode
    assert ("rel-L2 grouping (k-means clusters x iterations, each mode's preset): VC-Attention **speed** (V-Smooth + "
            "ExpCast) 64 x 2, VC-Attention **fidelity** (V-Smooth) 128 x 1.") in text
    # a row that recorded its preset's values names its grouping
    assert "| VC-Attention node, fidelity (grouping 128 x 1) | 6.50 | 1.85 | 1.10 | 0.0120 | sm90 480 |" in text
    assert "| vc-balanced | 2 | 5200 | 1.85 | 1.27 | 0.0110 |" in text
    # e2e rows that recorded their grouping say it (rows saved before did not: no line)
    assert "Grouping (k-means clusters x iterations): VC-Attention **speed** (V-Smooth + ExpCast) 128 x 1, 8 bins." in text
    old_e2e = _doc()
    del old_e2e["sections"]["e2e"]["rows"][1]["grouping"]
    assert "Grouping (k-means" not in bench_report.render_benchmarks({"nvidia-h200.json": old_e2e})
    changed = _doc()
    changed["sections"]["attention"]["rows"][3]["ms"] = 121.0
    assert bench_report.render_benchmarks({"nvidia-h200.json": changed}) != text


def test_headline_names_environment_and_sageattention_ratio():
    headline = bench_report.render_headline({"nvidia-h200.json": _doc()})
    assert "NVIDIA H200" in headline and "SageAttention 2.2.0" in headline and ENV["command"] in headline
    assert "| SageAttention 2.2 `sageattn` | 140.0 | 1.43 | 1.00 | 0.0014 |" in headline
    assert "mma" not in headline  # portable rows live in BENCHMARKS.md only
    assert "`--use-sage-attention` 7.20 s" in headline and "speed 6.00 s (1.20x" in headline


def test_headline_takes_the_newest_attention_run_whatever_its_file_name():
    older, newer = _doc(), _doc()
    older["sections"]["attention"]["env"] = dict(ENV, gpu="NVIDIA H100 80GB HBM3", date="2026-12-05")
    newer["sections"]["attention"]["env"] = dict(ENV, gpu="NVIDIA H200", date="2026-12-06")
    docs = {"nvidia-h100-80gb-hbm3.json": older, "nvidia-h200.json": newer}
    assert "**Measured on one NVIDIA H200**" in bench_report.render_headline(docs)
    newer["sections"]["attention"]["env"]["date"] = "2026-12-04"
    assert "**Measured on one NVIDIA H100 80GB HBM3**" in bench_report.render_headline(docs)


def test_headline_prefers_a_run_of_todays_presets_over_a_stale_one_of_the_same_day():
    # two GPUs measured the same day on both sides of a preset change: the run of today's presets is the newer one
    fresh, stale = _doc(), _doc()
    fresh["sections"]["attention"]["env"] = dict(ENV, gpu="NVIDIA H100 80GB HBM3", date="2026-12-06",
                                                 presets=bench_results.preset_tags())
    stale["sections"]["attention"]["env"] = dict(ENV, gpu="NVIDIA H200", date="2026-12-06",
                                                 presets=dict(bench_results.preset_tags(), speed="int8-vsmooth-expcast-older"))
    docs = {"nvidia-h100-80gb-hbm3.json": fresh, "nvidia-h200.json": stale}
    assert bench_report.stale_presets(stale["sections"]["attention"]["env"])
    assert "**Measured on one NVIDIA H100 80GB HBM3**" in bench_report.render_headline(docs)
    # without the preset change the file name breaks the tie, as before
    stale["sections"]["attention"]["env"]["presets"] = bench_results.preset_tags()
    assert "**Measured on one NVIDIA H200**" in bench_report.render_headline(docs)


def test_the_portable_rows_say_when_the_default_build_changed():
    from vc_attention.kernels import mma_variants

    doc = _doc()
    env = doc["sections"]["attention"]["env"]
    today = mma_variants.default_variant("9.0a", "fp32")
    env["mma_build"] = {"arch": "9.0a", "pv_accum": "fp32", "variant": today}
    assert bench_report.stale_portable_build(env) == []
    assert "The `mma` rows measured" not in bench_report.render_benchmarks({"nvidia-h200.json": doc})
    env["mma_build"] = dict(env["mma_build"], variant="wide-i2fp-meanscaled-restoretile-after64-coalesced-viaf16")
    note = bench_report.render_benchmarks({"nvidia-h200.json": doc})
    assert f"today's default for sm_90a is `{today}`" in note
    # after the portable tables, not the main ones
    assert note.index("The `mma` rows measured") > note.index("## Portable kernels")
    del env["mma_build"]  # sections before session 40 recorded no build: nothing to say
    assert bench_report.stale_portable_build(env) == []


def test_a_saved_section_records_the_portable_build(monkeypatch):
    import torch

    from vc_attention.kernels import backend_mma, jit, mma_variants

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench_results.portable_build() is None  # no GPU: nothing was built
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(jit, "target_arch", lambda: "9.0a")
    monkeypatch.setattr(backend_mma, "pv_accum", lambda arch=None: "fp32")
    assert bench_results.portable_build() == {"arch": "9.0a", "pv_accum": "fp32",
                                              "variant": mma_variants.default_variant("9.0a", "fp32")}

    def no_fp8(*_):
        raise jit.JitError("this GPU is sm_80, which has no FP8 tensor cores")
    monkeypatch.setattr(jit, "target_arch", no_fp8)
    assert bench_results.portable_build() is None  # the portable kernels do not run there


def test_results_round_trip_and_sections_merge(tmp_path):
    path = tmp_path / "gpu.json"
    doc = bench_results.load(path)
    bench_results.merge(doc, "e2e", ENV, [{"method": "sdpa"}])
    bench_results.save(path, doc)
    again = bench_results.load(path)
    bench_results.merge(again, "attention", ENV, [{"method": "x"}])
    assert list(again["sections"]) == ["e2e", "attention"]
    bench_results.save(path, again)
    assert list(json.loads(path.read_text())["sections"]) == ["attention", "e2e"]


def test_wrong_schema_and_unknown_section_are_refused(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"attention": []}))
    with pytest.raises(ValueError, match="schema"):
        bench_results.load(path)
    with pytest.raises(ValueError, match="unknown results section"):
        bench_results.merge(bench_results.empty(), "speed", ENV, [])


def test_report_flag_rewrites_docs_from_results(tmp_path, monkeypatch):
    results = tmp_path / "results"
    results.mkdir()
    (results / "nvidia-h200.json").write_text(json.dumps(_doc()))
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{bench_report.HEADLINE_BEGIN}\nold\n{bench_report.HEADLINE_END}\nrest\n")
    monkeypatch.setattr(bench_report, "RESULTS_DIR", results)
    monkeypatch.setattr(bench_report, "BENCHMARKS", tmp_path / "BENCHMARKS.md")
    monkeypatch.setattr(bench_report, "README", readme)
    from vc_attention import cli

    assert cli.main(["bench", "--report"]) == 0
    assert "## Sampling in real ComfyUI" in (tmp_path / "BENCHMARKS.md").read_text()
    assert readme.read_text().startswith("intro\n") and "old" not in readme.read_text()


def test_shapes_parse_and_portable_subset_is_known():
    assert bench.parse_shapes("wan21-1.3b-480p")["wan21-1.3b-480p"] == (1, 12, 32760, 128)
    assert bench.parse_shapes("1,2,3,4;5,6,7,8") == {"1x2x3x4": (1, 2, 3, 4), "5x6x7x8": (5, 6, 7, 8)}
    assert bench.parse_shapes("") == {}
    assert set(bench.PORTABLE_SHAPES) <= set(bench.SHAPES)
    with pytest.raises(ValueError, match="unknown shape"):
        bench.parse_shapes("wan9")


def test_multi_gpu_needs_that_many_gpus(monkeypatch):
    import torch

    from vc_attention import cli

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert cli.main(["bench", "--e2e", "--gpus", "2"]) == 2
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["bench", "--gpus", "x"])


def test_each_mode_is_measured_with_its_presets_grouping():
    from vc_attention.commands.bench_attention import fidelity_grouping
    from vc_attention.kernels import grouping
    from vc_attention.nodes.presets import PRESETS

    assert fidelity_grouping("vc-fidelity") == (PRESETS["fidelity"]["clusters"], PRESETS["fidelity"]["kmeans_iters"])
    assert fidelity_grouping("vc-speed") == (PRESETS["balanced"]["clusters"], PRESETS["balanced"]["kmeans_iters"])
    assert fidelity_grouping("vc-plain8") == fidelity_grouping("sageattn-2.2") == (grouping.DEFAULT_CLUSTERS,
                                                                                    grouping.DEFAULT_ITERS)
    assert fidelity_grouping("vc-fidelity") != fidelity_grouping("vc-speed")  # the presets do differ today


def test_each_mode_is_measured_with_its_presets_within_cluster_bins(monkeypatch):
    from vc_attention.commands import bench_attention
    from vc_attention.kernels import grouping
    from vc_attention.nodes import presets

    monkeypatch.setitem(presets.WITHIN_BINS, "fidelity", 8)
    assert bench_attention.fidelity_within_bins("vc-fidelity") == 8
    assert bench_attention.fidelity_within_bins("vc-speed") == presets.WITHIN_BINS["balanced"]
    assert bench_attention.fidelity_within_bins("vc-plain8") == grouping.DEFAULT_WITHIN_BINS
    label = "{} x {}, 8 bins".format(presets.PRESETS["fidelity"]["clusters"], presets.PRESETS["fidelity"]["kmeans_iters"])
    assert bench_attention._grouping_label("vc-fidelity") == label


def test_a_section_says_when_a_preset_changed_since_it_was_measured():
    from vc_attention.commands import bench_report, bench_results

    today = bench_results.preset_tags()
    assert set(today) == {"fidelity", "speed", "plain-8bit"}
    assert bench_report.stale_presets({"presets": today}) == []
    assert bench_report.stale_presets({}) == []  # sections saved before the presets were recorded say nothing
    old = dict(today, fidelity="int8-vsmooth-exp2-k256")
    notes = bench_report.stale_presets({"presets": old})
    assert today["fidelity"] != old["fidelity"] and len(notes) == 1
    assert "`int8-vsmooth-exp2-k256`" in notes[0] and f"`{today['fidelity']}`" in notes[0]
    assert notes[0] in bench_report.render_headline({"x": {"sections": {"attention": {
        "env": {"gpu": "G", "driver": "d", "torch": "t", "cuda": "c", "cudnn": 1, "sageattention": None,
                "command": "vc-attention bench --save", "presets": old},
        "rows": [{"shape": bench_report.HEADLINE_SHAPE, "B": 1, "H": 40, "N": 75600, "D": 128, "method": "vc-fidelity",
                  "portable": False, "ms": 1.0, "x_cudnn": 1.0, "x_sageattn": 1.0, "rel_l2_video_like": 0.01}]}}}})


def test_the_e2e_forwards_run_the_nodes_presets():
    """commands/bench_e2e: one row per preset of the node (fidelity, balanced, speed), each with the kernel
    configuration and the grouping (clusters x iterations, within-cluster bins) the node runs for it; clusters / iters
    given: every mode groups alike, without bins."""
    from vc_attention.commands.bench_e2e import PRESET_MODES, mode_config, mode_grouping
    from vc_attention.kernels import grouping
    from vc_attention.kernels.config import FIDELITY, SPEED
    from vc_attention.nodes.presets import PRESETS, WITHIN_BINS

    assert PRESET_MODES == ("fidelity", "balanced", "speed")
    for mode in PRESET_MODES:
        assert mode_grouping(mode) == (PRESETS[mode]["clusters"], PRESETS[mode]["kmeans_iters"], WITHIN_BINS[mode])
    assert mode_config("fidelity") == FIDELITY and mode_config("balanced") == mode_config("speed") == SPEED
    assert mode_grouping("speed") != mode_grouping("balanced")  # the presets differ in their grouping alone
    assert mode_grouping("speed", 32, 3) == (32, 3, grouping.DEFAULT_WITHIN_BINS)
    assert mode_grouping("fidelity", 32) == (32, grouping.DEFAULT_ITERS, grouping.DEFAULT_WITHIN_BINS)
