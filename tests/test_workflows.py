"""Checks of the example workflows in workflows/ (ComfyUI UI/graph format).

CPU tier (CI): valid JSON, every node type is a core node we list below or one of ours, links
consistent in both directions, sockets connected, widget counts right, our widget values valid
against nodes/presets.py, model files named in the Note node.
Real-host tier (COMFYUI_PATH set): tests/comfyui_workflow_probe.py loads ComfyUI's nodes plus this
pack in a subprocess, checks the core-node table below against the real node definitions, and runs
ComfyUI's own prompt validation (execution.validate_prompt) on every workflow.
"""
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from vc_attention.nodes import presets

REPO = Path(__file__).resolve().parent.parent
WORKFLOWS = sorted((REPO / "workflows").glob("*.json"))
PROBE = Path(__file__).resolve().parent / "comfyui_workflow_probe.py"

# Core node types the workflows use, as defined in ComfyUI (checked against a real checkout by the
# real-host test): socket inputs (name -> type, required ones connected in every workflow),
# optional socket inputs, output types, and widget names in order. A seed widget with
# control_after_generate stores one more value right after it in widgets_values.
CORE_NODES = {
    "UNETLoader": ({}, {}, ["MODEL"], ["unet_name", "weight_dtype"]),
    "CLIPLoader": ({}, {}, ["CLIP"], ["clip_name", "type", "device"]),
    "DualCLIPLoader": ({}, {}, ["CLIP"], ["clip_name1", "clip_name2", "type", "device"]),
    "VAELoader": ({}, {}, ["VAE"], ["vae_name"]),
    "CheckpointLoaderSimple": ({}, {}, ["MODEL", "CLIP", "VAE"], ["ckpt_name"]),
    "ModelSamplingSD3": ({"model": "MODEL"}, {}, ["MODEL"], ["shift"]),
    "CLIPTextEncode": ({"clip": "CLIP"}, {}, ["CONDITIONING"], ["text"]),
    "EmptyHunyuanLatentVideo": ({}, {}, ["LATENT"], ["width", "height", "length", "batch_size"]),
    "EmptyHunyuanVideo15Latent": ({}, {}, ["LATENT"], ["width", "height", "length", "batch_size"]),
    "Wan22ImageToVideoLatent": ({"vae": "VAE"}, {"start_image": "IMAGE"}, ["LATENT"],
                                ["width", "height", "length", "batch_size"]),
    "EmptyLTXVLatentVideo": ({}, {}, ["LATENT"], ["width", "height", "length", "batch_size"]),
    "LTXVConditioning": ({"positive": "CONDITIONING", "negative": "CONDITIONING"}, {},
                         ["CONDITIONING", "CONDITIONING"], ["frame_rate"]),
    "LTXVScheduler": ({}, {"latent": "LATENT"}, ["SIGMAS"],
                      ["steps", "max_shift", "base_shift", "stretch", "terminal"]),
    "KSamplerSelect": ({}, {}, ["SAMPLER"], ["sampler_name"]),
    "SamplerCustom": ({"model": "MODEL", "positive": "CONDITIONING", "negative": "CONDITIONING",
                       "sampler": "SAMPLER", "sigmas": "SIGMAS", "latent_image": "LATENT"}, {},
                      ["LATENT", "LATENT"], ["add_noise", "noise_seed", "cfg"]),
    "KSampler": ({"model": "MODEL", "positive": "CONDITIONING", "negative": "CONDITIONING",
                  "latent_image": "LATENT"}, {}, ["LATENT"],
                 ["seed", "steps", "cfg", "sampler_name", "scheduler", "denoise"]),
    "KSamplerAdvanced": ({"model": "MODEL", "positive": "CONDITIONING", "negative": "CONDITIONING",
                          "latent_image": "LATENT"}, {}, ["LATENT"],
                         ["add_noise", "noise_seed", "steps", "cfg", "sampler_name", "scheduler",
                          "start_at_step", "end_at_step", "return_with_leftover_noise"]),
    "VAEDecode": ({"samples": "LATENT", "vae": "VAE"}, {}, ["IMAGE"], []),
    "SaveAnimatedWEBP": ({"images": "IMAGE"}, {}, ["IMAGE"],
                         ["filename_prefix", "fps", "lossless", "quality", "method"]),
}
SEED_WIDGETS = {"seed", "noise_seed"}
SAMPLERS = {"KSampler", "KSamplerAdvanced", "SamplerCustom"}
# front-end-only node types: never sent to the server
UI_ONLY = {"Note", "MarkdownNote"}

OUR_NODES = {
    "VCAttention": ({"model": "MODEL"}, {}, ["MODEL"], list(presets.WIDGETS)),
    "VCAttentionFidelityCheck": ({"reference": "IMAGE", "test": "IMAGE"}, {}, ["FLOAT", "FLOAT", "STRING"], []),
}
KNOWN = {**CORE_NODES, **OUR_NODES}
# loader widget -> ComfyUI models/ sub-folder the Note must name for it
MODEL_WIDGETS = {"unet_name": "diffusion_models", "clip_name": "text_encoders", "clip_name1": "text_encoders",
                 "clip_name2": "text_encoders", "vae_name": "vae", "ckpt_name": "checkpoints"}


# How tall and wide ComfyUI's front end draws our nodes (px at scale 1, title bar excluded): the
# widgets plus the web extension's panel (preset buttons, difference line, status lines) make the
# VC-Attention node taller than its widgets alone. tests/test_browser.py measures the real page.
DRAWN_SIZES = {"VCAttention": (340, 398)}
TITLE_HEIGHT = 30  # LiteGraph draws the title bar above a node's pos


def load(path):
    return json.loads(path.read_text(encoding="utf-8"))


def widget_values_by_name(node) -> dict:
    """widgets_values keyed by widget name (control_after_generate values dropped)."""
    names = KNOWN[node["type"]][3]
    values = list(node["widgets_values"])
    out = {}
    for name in names:
        out[name] = values.pop(0)
        if name in SEED_WIDGETS:
            control = values.pop(0)
            assert control in ("fixed", "increment", "decrement", "randomize"), (node["id"], control)
    assert not values, f"node {node['id']} ({node['type']}) has {len(values)} widget values too many"
    return out


def upstream(doc, node, input_name):
    """The node feeding `node`'s input `input_name` (None if unconnected)."""
    links = {l[0]: l for l in doc["links"]}
    nodes = {n["id"]: n for n in doc["nodes"]}
    for inp in node["inputs"]:
        if inp["name"] == input_name and inp["link"] is not None:
            return nodes[links[inp["link"]][1]]
    return None


def model_chain(doc, node):
    """Types of the nodes on the MODEL path above `node` (nearest first)."""
    chain = []
    current = upstream(doc, node, "model")
    while current is not None:
        chain.append(current["type"])
        current = upstream(doc, current, "model")
    return chain


def test_the_promised_workflows_are_there():
    names = {p.stem for p in WORKFLOWS}
    assert {"wan2.2_t2v_a14b", "wan2.1_t2v_1.3b", "wan2.2_ti2v_5b", "hunyuanvideo1.5_t2v",
            "ltx_video_t2v", "ab_fidelity_wan2.1_1.3b"} <= names


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.stem)
def test_graph_structure(path):
    doc = load(path)
    assert {"nodes", "links", "last_node_id", "last_link_id", "version"} <= set(doc)
    ids = [n["id"] for n in doc["nodes"]]
    assert len(ids) == len(set(ids)), "node ids must be unique"
    assert doc["last_node_id"] >= max(ids)
    link_ids = [l[0] for l in doc["links"]]
    assert len(link_ids) == len(set(link_ids)), "link ids must be unique"
    assert doc["last_link_id"] >= max(link_ids)
    for node in doc["nodes"]:
        assert node["type"] in KNOWN or node["type"] in UI_ONLY, f"unknown node type {node['type']!r}"


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.stem)
def test_links_are_consistent_both_ways(path):
    doc = load(path)
    nodes = {n["id"]: n for n in doc["nodes"]}
    for link_id, src, src_slot, dst, dst_slot, typ in doc["links"]:
        out = nodes[src]["outputs"][src_slot]
        inp = nodes[dst]["inputs"][dst_slot]
        assert link_id in out["links"], f"link {link_id} missing from node {src} output {src_slot}"
        assert inp["link"] == link_id, f"node {dst} input {inp['name']} does not point back to link {link_id}"
        assert out["type"] == typ == inp["type"], f"link {link_id}: {out['type']} -> {typ} -> {inp['type']}"
        # the types are the ones the node definitions declare
        assert KNOWN[nodes[src]["type"]][2][src_slot] == typ
        sockets = {**KNOWN[nodes[dst]["type"]][0], **KNOWN[nodes[dst]["type"]][1]}
        assert sockets[inp["name"]] == typ
    by_id = {l[0]: l for l in doc["links"]}
    for node in doc["nodes"]:
        for slot, inp in enumerate(node["inputs"]):
            if inp["link"] is not None:
                assert by_id[inp["link"]][3:5] == [node["id"], slot]
        for slot, out in enumerate(node.get("outputs", [])):
            for link_id in out["links"] or []:
                assert by_id[link_id][1:3] == [node["id"], slot]


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.stem)
def test_required_sockets_connected_and_widget_counts(path):
    doc = load(path)
    for node in doc["nodes"]:
        if node["type"] in UI_ONLY:
            continue
        required = KNOWN[node["type"]][0]
        connected = {i["name"] for i in node["inputs"] if i["link"] is not None}
        assert set(required) <= connected, f"node {node['id']} ({node['type']}) misses {set(required) - connected}"
        widget_values_by_name(node)  # raises on a wrong count


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.stem)
def test_our_widget_values_are_valid(path):
    """Every value passes the node's own validation (including the ones a preset overrides)."""
    doc = load(path)
    ours = [n for n in doc["nodes"] if n["type"] == "VCAttention"]
    assert ours, "every example workflow uses the VC-Attention node"
    for node in ours:
        values = widget_values_by_name(node)
        mode = values.pop("mode")
        assert mode in presets.PRESETS, f"node {node['id']}: examples start from a preset, got {mode!r}"
        presets.resolve(mode, values)  # raises ValueError on any invalid value


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.stem)
def test_every_sampler_runs_through_vc_attention_or_is_the_ab_reference(path):
    doc = load(path)
    for node in doc["nodes"]:
        if node["type"] in SAMPLERS:
            through_vc = "VCAttention" in model_chain(doc, node)
            assert through_vc or "reference" in node.get("title", "").lower(), f"sampler {node['id']} bypasses VC-Attention"


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.stem)
def test_note_says_where_every_model_file_goes(path):
    doc = load(path)
    notes = "\n".join(n["widgets_values"][0] for n in doc["nodes"] if n["type"] in UI_ONLY)
    files = 0
    for node in doc["nodes"]:
        if node["type"] in UI_ONLY:
            continue
        for name, value in widget_values_by_name(node).items():
            if name in MODEL_WIDGETS:
                files += 1
                assert value.endswith(".safetensors")
                assert f"models/{MODEL_WIDGETS[name]}/{value}" in notes, f"the Note does not say where {value} goes"
    assert files >= 2


def drawn_box(node) -> tuple[float, float, float, float]:
    """(left, top, right, bottom) of a node as drawn: our nodes at their drawn size (the saved size
    if larger), core nodes at their saved size; the title bar included."""
    width, height = node["size"]
    drawn = DRAWN_SIZES.get(node["type"])
    if drawn is not None:
        width, height = max(width, drawn[0]), max(height, drawn[1])
    x, y = node["pos"]
    return x, y - TITLE_HEIGHT, x + width, y + height


def overlapping_nodes(nodes) -> list[tuple]:
    boxes = [(n["id"], n["type"], drawn_box(n)) for n in nodes]
    pairs = []
    for i, (id_a, type_a, a) in enumerate(boxes):
        for id_b, type_b, b in boxes[i + 1 :]:
            if a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]:
                pairs.append(((id_a, type_a), (id_b, type_b)))
    return pairs


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.stem)
def test_no_two_nodes_overlap_at_their_drawn_size(path):
    assert overlapping_nodes(load(path)["nodes"]) == []


def test_the_overlap_check_sees_a_title_bar_covered():
    below = {"id": 2, "type": "VCAttention", "pos": [0, 420], "size": [340, 330]}
    above = {"id": 1, "type": "VCAttention", "pos": [0, 0], "size": [340, 330]}
    assert overlapping_nodes([above, below]) == [((1, "VCAttention"), (2, "VCAttention"))]  # drawn 398 tall
    below["pos"] = [0, 398 + TITLE_HEIGHT]
    assert overlapping_nodes([above, below]) == []


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.stem)
def test_stored_preset_values_are_the_presets(path):
    """With a preset mode the preset's values run; the file must say the same, not stale ones."""
    for node in load(path)["nodes"]:
        if node["type"] == "VCAttention":
            values = widget_values_by_name(node)
            preset = presets.PRESETS[values["mode"]]
            assert {k: values[k] for k in preset} == preset, node["id"]


def test_wan22_a14b_patches_both_experts_with_split_sampling():
    doc = load(REPO / "workflows" / "wan2.2_t2v_a14b.json")
    samplers = sorted((n for n in doc["nodes"] if n["type"] == "KSamplerAdvanced"),
                      key=lambda n: widget_values_by_name(n)["start_at_step"])
    assert len(samplers) == 2
    high, low = (widget_values_by_name(n) for n in samplers)
    assert high["end_at_step"] == low["start_at_step"] and high["steps"] == low["steps"]
    assert high["return_with_leftover_noise"] == "enable" and low["add_noise"] == "disable"
    assert upstream(doc, samplers[1], "latent_image")["id"] == samplers[0]["id"]
    loaders = []
    for sampler in samplers:
        assert model_chain(doc, sampler)[0] == "VCAttention"
        vc = upstream(doc, sampler, "model")
        while vc["type"] != "UNETLoader":
            vc = upstream(doc, vc, "model")
        loaders.append(widget_values_by_name(vc)["unet_name"])
    assert "high_noise" in loaders[0] and "low_noise" in loaders[1]


def test_ab_workflow_compares_same_seed_with_and_without_vc_attention():
    doc = load(REPO / "workflows" / "ab_fidelity_wan2.1_1.3b.json")
    check = next(n for n in doc["nodes"] if n["type"] == "VCAttentionFidelityCheck")
    samplers = []
    for side in ("reference", "test"):
        decode = upstream(doc, check, side)
        assert decode["type"] == "VAEDecode"
        samplers.append(upstream(doc, decode, "samples"))
    ref, test = samplers
    assert "VCAttention" not in model_chain(doc, ref)
    assert "VCAttention" in model_chain(doc, test)
    ref_w, test_w = widget_values_by_name(ref), widget_values_by_name(test)
    assert ref_w == test_w, "both runs must use the same seed and sampler settings"
    assert ref["widgets_values"][1] == test["widgets_values"][1] == "fixed"
    for name in ("positive", "negative", "latent_image"):
        assert upstream(doc, ref, name)["id"] == upstream(doc, test, name)["id"]
    # the reference model is the same patched chain minus our node
    assert model_chain(doc, ref) == model_chain(doc, test)[1:]


# ---------------------------------------------------------------------------------------------
# real host: ComfyUI's own node definitions and prompt validation
@pytest.mark.comfyui
@pytest.mark.skipif(not os.environ.get("COMFYUI_PATH"), reason="set COMFYUI_PATH to a ComfyUI checkout")
def test_real_comfyui_validates_every_workflow(tmp_path):
    """Runs tests/comfyui_workflow_probe.py with COMFYUI_PYTHON (a Python with ComfyUI's requirements;
    default: this one). It reports each core node's definition and ComfyUI's validation result."""
    python = os.environ.get("COMFYUI_PYTHON", sys.executable)
    report_path = tmp_path / "probe.json"
    types = sorted(KNOWN)
    proc = subprocess.run(
        [python, str(PROBE), os.environ["COMFYUI_PATH"], str(REPO), str(report_path), str(tmp_path / "models"),
         ",".join(types)] + [str(p) for p in WORKFLOWS],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    report = json.loads(report_path.read_text())
    if report["pyav_placeholder"]:
        warnings.warn("real ComfyUI imported with the PyAV placeholders (VC_PYAV_PLACEHOLDER=1, tests/comfyui_pyav.py)")
    for type_name, (sockets, optional, outputs, widgets) in CORE_NODES.items():
        real = report["nodes"][type_name]
        assert real["sockets"] == sockets, type_name
        assert real["optional_sockets"] == optional, type_name
        assert real["outputs"] == outputs, type_name
        assert real["widgets"] == widgets, type_name
    for type_name, (sockets, _, outputs, widgets) in OUR_NODES.items():
        real = report["nodes"][type_name]
        assert (real["sockets"], real["outputs"], real["widgets"]) == (sockets, outputs, widgets), type_name
    for path in WORKFLOWS:
        result = report["validation"][path.name]
        assert result["valid"], f"{path.name}: {json.dumps(result, indent=1)[:3000]}"
