"""Static checks of the web extension (web/vc_attention.js + web/vc_attention_core.js), plus its
pure helpers run under Node.js when a `node` binary is on PATH (the browser test covers the rest)."""
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from vc_attention.nodes import presets

WEB = Path(__file__).resolve().parent.parent / "web"
MAIN_JS = (WEB / "vc_attention.js").read_text(encoding="utf-8")
CORE_JS = (WEB / "vc_attention_core.js").read_text(encoding="utf-8")
STATS_PY = (Path(__file__).resolve().parent.parent / "nodes" / "stats.py").read_text(encoding="utf-8")


def function_body(source: str, signature: str) -> str:
    """The text between the braces that follow `signature` (balanced-brace scan)."""
    start = source.index(signature)
    open_at = source.index("{", start)
    depth = 0
    for i in range(open_at, len(source)):
        depth += {"{": 1, "}": -1}.get(source[i], 0)
        if depth == 0:
            return source[open_at + 1 : i]
    raise AssertionError(f"unbalanced braces after {signature!r}")


def test_extension_name_is_namespaced():
    names = re.findall(r'registerExtension\(\{\s*name:\s*"([^"]+)"', MAIN_JS)
    assert names == ["vc_attention.VCAttention"]


def test_uses_window_comfyapi_not_legacy_script_paths():
    assert "window.comfyAPI.app" in MAIN_JS and "window.comfyAPI.api" in MAIN_JS
    for source in (MAIN_JS, CORE_JS):
        assert "/scripts/app.js" not in source and "../../scripts" not in source
    # the only import is our own sibling module
    assert re.findall(r'from\s+"([^"]+)"', MAIN_JS) == ["./vc_attention_core.js"]
    assert "import " not in CORE_JS.replace("import.meta", "")


def test_stats_listener_is_removed_when_the_node_is_removed():
    event = re.search(r'const STATS_EVENT = "([^"]+)"', MAIN_JS).group(1)
    assert event == re.search(r'EVENT_NAME = "([^"]+)"', STATS_PY).group(1)
    adds = re.findall(r"api\.addEventListener\((\w+),\s*(this\.\w+)\)", MAIN_JS)
    removes = re.findall(r"api\.removeEventListener\((\w+),\s*(this\.\w+)\)", MAIN_JS)
    assert adds and sorted(adds) == sorted(removes), "every listener added must be removed with the same handler"
    on_removed = function_body(MAIN_JS, "nodeType.prototype.onRemoved = function")
    assert "dispose()" in on_removed and "onRemoved?.apply" in on_removed
    assert "removeEventListener" in function_body(MAIN_JS, "dispose()")


def test_reads_the_generated_presets_json():
    assert 'new URL("./presets.json", import.meta.url)' in MAIN_JS
    table = json.loads((WEB / "presets.json").read_text(encoding="utf-8"))
    assert table == presets.web_table()
    # every key the front end reads is in the table
    for key in re.findall(r"this\.table\.(\w+)", MAIN_JS) + re.findall(r"table\.(\w+)", CORE_JS):
        assert key in table, key
    preset_modes = json.loads(re.search(r"PRESET_MODES = (\[[^\]]*\])", CORE_JS).group(1))
    assert preset_modes == [m for m in presets.MODES if m != "custom"]


def test_panel_widget_is_never_serialized():
    # widgets_values are positional: an extra serialized widget would shift every saved value
    assert "serialize: false" in MAIN_JS and "this.widget.serialize = false" in MAIN_JS


def test_status_line_reads_only_fields_the_node_sends():
    payload_body = STATS_PY[STATS_PY.index("def payload(") : STATS_PY.index("def log_line(")]
    sent = set(re.findall(r'"(\w+)":', payload_body))
    read = set(re.findall(r"(?<![/\w])stats\.(\w+)", CORE_JS + MAIN_JS))
    assert read and read <= sent, f"the JS reads fields the node never sends: {read - sent}"


@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js")
def test_core_helpers_under_node():
    script = f"""
    import * as core from {json.dumps((WEB / "vc_attention_core.js").as_uri())};
    const table = {json.dumps(presets.web_table())};
    const speed = table.presets.speed;
    const values = {{...speed, clusters: speed.clusters + 32, expcast: !speed.expcast, start_percent: 0.5}};
    const diffs = core.presetDifferences(values, speed);
    const stats = {{node_id: "7", backend_calls: {{sm90: 1200, reference: 3}}, fallbacks: {{cross_attention: 600}},
                   grouping_calls: 5, attention_ms: 0.8124, sampled_calls: 40, steps: 20, est_speedup: 2.1}};
    console.log(JSON.stringify({{
      diffs,
      line: core.differenceLine("speed", diffs),
      same: core.differenceLine("speed", core.presetDifferences({{...speed}}, speed)),
      baseCustom: core.basePreset("custom", "fidelity", table),
      baseUnknown: core.basePreset("custom", undefined, table),
      status: core.statusLines(stats),
      untimed: core.statusLines({{...stats, sampled_calls: 0, est_speedup: null, backend_calls: {{}}}}),
      unavailable: core.backendWarning("mma", {{mma: "no CUDA GPU is visible"}}),
      available: [core.backendWarning("auto", {{mma: "x"}}), core.backendWarning("sm90", undefined)],
      slower: core.statusLines({{...stats, grouping_share: 0.0712, slower_shapes: ["1x12x32760x128"], kept_slower: false}}),
      kept: core.statusLines({{...stats, slower_shapes: ["1x12x32760x128"], kept_slower: true}}),
      cross: core.statusLines({{...stats, cross_attention: {{cudnn: 598, model: 2}}, cross_slower_shapes: []}}),
      crossSlower: core.statusLines({{...stats, cross_attention: {{"model: cuDNN measured slower": 590, cudnn: 10}},
                                     cross_slower_shapes: ["2x12x32760x128x512"]}}),
      dropped: core.statusLines({{...stats, refinements_dropped: {{"mma: int8-vsmooth-exp2-k256": 40}}}}),
    }}));
    """
    proc = subprocess.run(["node", "--input-type=module", "-e", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    speed = presets.PRESETS["speed"]
    assert out["diffs"] == [
        {"name": "expcast", "value": not speed["expcast"], "preset": speed["expcast"]},
        {"name": "clusters", "value": speed["clusters"] + 32, "preset": speed["clusters"]},
    ]  # start_percent is not preset-governed: never a difference
    assert out["line"].startswith("custom - differs from speed: expcast")
    assert "all widgets as the preset sets them" in out["same"]
    assert out["baseCustom"] == "fidelity" and out["baseUnknown"] == presets.DEFAULT_MODE
    assert out["status"] == [
        "backend: sm90 x1200, reference x3 | attention 0.812 ms per call (40 timed) | est. speed-up 2.10x",
        "fallbacks to the model's attention: cross_attention x600",
        "grouping: 5 calls over 20 steps",
    ]
    assert out["untimed"][0] == "backend: no VC-Attention calls | attention not timed | est. speed-up n/a"
    assert out["unavailable"] == "backend mma cannot run on this machine (no CUDA GPU is visible): the run will stop"
    assert out["available"] == ["", ""]
    assert out["slower"][2:] == [
        "grouping: 5 calls over 20 steps, 7.1% of the attention time",
        "slower than the model's attention at 1x12x32760x128 (the model's attention ran there)",
    ]
    assert out["kept"][3] == "slower than the model's attention at 1x12x32760x128 (kept as chosen)"
    assert len(out["status"]) == 3  # no cross-attention line without cross-attention calls
    assert out["cross"][3] == "cross-attention (exact): cudnn x598, model x2"
    assert out["crossSlower"][3] == ("cross-attention (exact): model: cuDNN measured slower x590, cudnn x10 "
                                     "(cuDNN slower at 2x12x32760x128x512)")
    assert out["dropped"][3] == "ran without the fidelity refinements this kernel lacks: mma: int8-vsmooth-exp2-k256 x40"


def test_the_backend_marks_come_from_the_schema_key_the_node_sends():
    node_py = (Path(__file__).resolve().parent.parent / "nodes" / "node_attention.py").read_text(encoding="utf-8")
    key = re.search(r'"(vc_attention_unavailable)"', node_py).group(1)
    assert f"backend?.[1]?.{key}" in MAIN_JS and "backendWarning(" in MAIN_JS


@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js")
@pytest.mark.parametrize("name", ["vc_attention.js", "vc_attention_core.js"])
def test_modules_parse(name):
    proc = subprocess.run(["node", "--experimental-default-type=module", "--check", str(WEB / name)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
