"""The web extension in a real browser: headless Debian Chromium, driven by Playwright, against a
real ComfyUI server on the CPU with this pack installed.

Runs only when COMFYUI_PATH points at a ComfyUI checkout (skipped otherwise). COMFYUI_PYTHON is the
Python that has ComfyUI's requirements (default: this one); the `playwright` Python package drives
the browser (never its own browser download: /usr/bin/chromium, Debian's `chromium` package).
VC_ATTENTION_SCREENSHOT=path also writes the node screenshot there (docs/screenshot-node.png).
"""
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from vc_attention.nodes import presets

pytestmark = [
    pytest.mark.comfyui,
    pytest.mark.skipif(not os.environ.get("COMFYUI_PATH"), reason="set COMFYUI_PATH to a ComfyUI checkout"),
]

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]
PACK = "ComfyUI-VC-Attention"  # the folder name a `git clone` gives
MODEL_FOLDERS = ("diffusion_models", "text_encoders", "vae", "checkpoints")
TINY_MODELS = Path(__file__).resolve().parent / "comfyui_tiny_models.py"
SERVER = Path(__file__).resolve().parent / "comfyui_server.py"  # main.py, after the PyAV option


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def placeholder_models(base: Path) -> None:
    """Empty files with the names the workflows use, so the UI shows no missing-model errors."""
    for path in (REPO / "workflows").glob("*.json"):
        for node in json.loads(path.read_text())["nodes"]:
            if node["type"] in ("Note", "MarkdownNote"):
                continue
            for value in node.get("widgets_values") or []:
                if isinstance(value, str) and value.endswith(".safetensors"):
                    for folder in MODEL_FOLDERS:
                        (base / "models" / folder).mkdir(parents=True, exist_ok=True)
                        (base / "models" / folder / value).touch()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    base = tmp_path_factory.mktemp("comfy_base")
    (base / "custom_nodes").mkdir()
    (base / "user").mkdir()
    (base / "custom_nodes" / PACK).symlink_to(REPO, target_is_directory=True)
    placeholder_models(base)
    python = os.environ.get("COMFYUI_PYTHON", sys.executable)
    made = subprocess.run([python, str(TINY_MODELS), os.environ["COMFYUI_PATH"], str(base / "models")],
                          capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, made.stderr[-5000:]
    port = free_port()
    log = open(base / "server.log", "w")
    proc = subprocess.Popen(
        [python, str(SERVER), "--cpu", "--listen", "127.0.0.1",
         "--port", str(port), "--base-directory", str(base), "--disable-auto-launch", "--disable-api-nodes"],
        cwd=os.environ["COMFYUI_PATH"], stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        try:
            urllib.request.urlopen(url + "/system_stats", timeout=5)
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail("ComfyUI did not start:\n" + (base / "server.log").read_text()[-5000:])
            time.sleep(1)
    # a fresh user directory would open the template browser over the canvas on first start
    urllib.request.urlopen(urllib.request.Request(
        url + "/settings/Comfy.TutorialCompleted", data=b"true", method="POST",
        headers={"Content-Type": "application/json"}), timeout=10)
    yield url, base / "server.log"
    proc.terminate()
    proc.wait(timeout=30)
    log.close()


@pytest.fixture(scope="module")
def page(request):
    sync_api = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.skip("needs Debian's chromium package (/usr/bin/chromium)")
    url, _ = request.getfixturevalue("server")  # started only once the browser side is available
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
        tab = browser.new_page(viewport={"width": 1400, "height": 900})
        tab.page_errors = []
        tab.on("pageerror", lambda error: tab.page_errors.append(str(error)))
        tab.goto(url)
        # app.extensions throws until the front end's stores exist: poll until it answers
        tab.wait_for_function(
            """() => { try {
                const app = window.comfyAPI.app.app;
                return app.extensions.some((e) => e.name === "vc_attention.VCAttention") && !!app.canvas;
              } catch (notReadyYet) { return false; } }""", timeout=180_000)
        tab.wait_for_timeout(3000)  # let the start-up workflow finish loading before ours replaces it
        yield tab
        browser.close()


def load_template(page, name):
    """Load one of our workflows through ComfyUI's custom-node template route; returns VC node ids."""
    return page.evaluate(
        """async ([pack, name]) => {
          const app = window.comfyAPI.app.app;
          const response = await fetch(`/api/workflow_templates/${pack}/${name}.json`);
          if (!response.ok) throw new Error(`template ${name}: HTTP ${response.status}`);
          await app.loadGraphData(await response.json());
          await new Promise((resolve) => setTimeout(resolve, 500));
          return app.graph._nodes.filter((n) => n.type === "VCAttention").map((n) => n.id);
        }""",
        [PACK, name],
    )


def node_state(page, node_id):
    return page.evaluate(
        """(id) => {
          const node = window.comfyAPI.app.app.graph.getNodeById(id);
          const panel = node.vcAttentionPanel;
          return {
            values: Object.fromEntries(node.widgets.filter((w) => w.serialize !== false).map((w) => [w.name, w.value])),
            labels: Object.fromEntries(node.widgets.map((w) => [w.name, w.label ?? w.name])),
            saved: node.serialize().widgets_values,
            active: [...panel.element.querySelectorAll("button.active")].map((b) => b.dataset.mode),
            diff: panel.diff.textContent,
            status: panel.status.textContent,
          };
        }""",
        node_id,
    )


def frame_node(page, node_id):
    """Scale 1, node at a fixed place on the canvas; returns the screenshot clip around it."""
    return page.evaluate(
        """(id) => {
          const app = window.comfyAPI.app.app;
          const node = app.graph.getNodeById(id);
          const title = window.LiteGraph?.NODE_TITLE_HEIGHT ?? 30;
          app.canvas.ds.scale = 1;
          app.canvas.ds.offset = [260 - node.pos[0], 160 - node.pos[1]];
          app.canvas.setDirty(true, true);
          const rect = app.canvas.canvas.getBoundingClientRect();
          return {x: rect.left + 248, y: rect.top + 136 - title, width: node.size[0] + 24, height: node.size[1] + title + 36};
        }""",
        node_id,
    )


def test_templates_browser_lists_every_workflow(server):
    url, _ = server
    listed = json.loads(urllib.request.urlopen(url + "/workflow_templates").read())
    assert sorted(listed[PACK]) == sorted(p.stem for p in (REPO / "workflows").glob("*.json"))


@pytest.mark.parametrize("name", sorted(p.stem for p in (REPO / "workflows").glob("*.json")))
def test_every_workflow_loads_with_known_node_types(page, name):
    load_template(page, name)
    unknown = page.evaluate(
        """() => window.comfyAPI.app.app.graph._nodes
              .filter((n) => !window.LiteGraph.registered_node_types[n.type])
              .map((n) => n.type)"""
    )
    assert unknown == []


@pytest.mark.parametrize("name", sorted(p.stem for p in (REPO / "workflows").glob("*.json")))
def test_no_two_nodes_overlap_as_drawn(page, name):
    """Every node's box as the front end lays it out (its size after the widgets and the web
    extension's panel were added, the title bar included) is clear of every other node's."""
    load_template(page, name)
    page.evaluate("() => window.comfyAPI.app.app.canvas.setDirty(true, true)")
    page.wait_for_timeout(300)
    boxes = page.evaluate(
        """() => {
          const title = window.LiteGraph?.NODE_TITLE_HEIGHT ?? 30;
          return window.comfyAPI.app.app.graph._nodes.map((n) => ({
            id: n.id, type: n.type, box: [n.pos[0], n.pos[1] - title, n.pos[0] + n.size[0], n.pos[1] + n.size[1]],
          }));
        }"""
    )
    overlaps = [(a["id"], a["type"], b["id"], b["type"])
                for i, a in enumerate(boxes) for b in boxes[i + 1:]
                if a["box"][0] < b["box"][2] and b["box"][0] < a["box"][2]
                and a["box"][1] < b["box"][3] and b["box"][1] < a["box"][3]]
    assert overlaps == [], boxes
    # the CPU test's table of drawn sizes (tests/test_workflows.py) holds what the page draws
    spec = importlib.util.spec_from_file_location("workflow_checks", Path(__file__).with_name("test_workflows.py"))
    workflow_checks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(workflow_checks)
    for entry in boxes:
        if entry["type"] in workflow_checks.DRAWN_SIZES:
            width, height = workflow_checks.DRAWN_SIZES[entry["type"]]
            drawn = (entry["box"][2] - entry["box"][0], entry["box"][3] - entry["box"][1] - workflow_checks.TITLE_HEIGHT)
            assert drawn[0] <= width and drawn[1] <= height, (entry["type"], drawn)


def test_wan22_workflow_has_a_control_on_both_nodes(page):
    ids = load_template(page, "wan2.2_t2v_a14b")
    assert len(ids) == 2
    for node_id in ids:
        state = node_state(page, node_id)
        assert state["active"] == [state["values"]["mode"]]


def test_preset_control_sets_widgets_marks_differences_and_shows_stats(page):
    (node_id,) = load_template(page, "wan2.1_t2v_1.3b")
    table = presets.web_table()
    state = node_state(page, node_id)
    mode = state["values"]["mode"]
    assert {k: state["values"][k] for k in table["presets"][mode]} == table["presets"][mode]
    assert state["active"] == [mode] and "all widgets as the preset sets them" in state["diff"]

    # bring the node to a fixed place at scale 1 and press "speed" with the mouse
    frame_node(page, node_id)
    page.wait_for_timeout(500)
    page.locator('.vc-attention-panel button[data-mode="speed"]').click()
    state = node_state(page, node_id)
    assert state["values"]["mode"] == "speed" and state["active"] == ["speed"]
    assert {k: state["values"][k] for k in table["presets"]["speed"]} == table["presets"]["speed"]
    # what gets saved is exactly the node's widgets, in schema order (the panel is never saved)
    assert state["saved"] == [state["values"][name] for name in presets.WIDGETS]

    # a user edit of a preset widget (what the canvas does on input: set value, call callback)
    clusters = table["presets"]["speed"]["clusters"] * 2
    page.evaluate(
        """([id, value]) => {
          const widget = window.comfyAPI.app.app.graph.getNodeById(id).widgets.find((w) => w.name === "clusters");
          widget.value = value;
          widget.callback(value);
        }""",
        [node_id, clusters],
    )
    state = node_state(page, node_id)
    assert state["values"]["mode"] == "custom" and state["values"]["clusters"] == clusters
    assert state["labels"]["clusters"] != "clusters" and state["labels"]["expcast"] == "expcast"
    assert state["diff"].startswith("custom - differs from speed: clusters")

    # the stats the node sends after a run become the status line
    page.evaluate(
        """(id) => window.comfyAPI.api.api.dispatchEvent(new CustomEvent("vc_attention.stats", {detail: {
          node_id: String(id), backend_calls: {reference: 240}, fallbacks: {cross_attention: 240},
          grouping_calls: 60, attention_ms: 12.5, sampled_calls: 24, steps: 8, est_speedup: null}}))""",
        node_id,
    )
    state = node_state(page, node_id)
    assert state["status"].splitlines() == [
        "backend: reference x240 | attention 12.500 ms per call (24 timed) | est. speed-up n/a",
        "fallbacks to the model's attention: cross_attention x240",
        "grouping: 60 calls over 8 steps",
    ]

    # removing the node removes its stats listener (same event, same handler)
    removed = page.evaluate(
        """(id) => {
          const app = window.comfyAPI.app.app;
          const api = window.comfyAPI.api.api;
          const node = app.graph.getNodeById(id);
          const handler = node.vcAttentionPanel.onStats;
          const calls = [];
          const original = api.removeEventListener;
          api.removeEventListener = function (type, listener) {
            calls.push(type === "vc_attention.stats" && listener === handler);
            return original.apply(this, arguments);
          };
          app.graph.remove(node);
          api.removeEventListener = original;
          return calls;
        }""",
        node_id,
    )
    assert True in removed
    assert not [e for e in page.page_errors if "vc_attention" in e], page.page_errors


def test_a_real_run_shows_its_stats_on_the_node(page, tmp_path):
    """The shipped Wan2.1 workflow with the tiny random-weight models (comfyui_tiny_models.py),
    queued from the UI: the node's stats travel from the server to the status line. On a CPU the
    model runs in float32, which the kernels do not take, so every call falls back to the model's
    own attention - and the status line says so with the reasons."""
    (node_id,) = load_template(page, "wan2.1_t2v_1.3b")
    page.evaluate(
        """() => {
          const LiteGraph = window.LiteGraph;
          const graph = window.comfyAPI.app.app.graph;
          const byType = (type) => graph._nodes.find((n) => n.type === type);
          const set = (node, name, value) => { node.widgets.find((w) => w.name === name).value = value; };
          set(byType("UNETLoader"), "unet_name", "tiny_wan2.1_t2v.safetensors");
          set(byType("CLIPLoader"), "clip_name", "tiny_clip_l.safetensors");
          set(byType("CLIPLoader"), "type", "stable_diffusion");
          const latent = byType("EmptyHunyuanLatentVideo");
          set(latent, "width", 128); set(latent, "height", 128); set(latent, "length", 5);
          const sampler = byType("KSampler");
          set(sampler, "steps", 3); set(sampler, "cfg", 2.0);
          graph.remove(byType("SaveAnimatedWEBP"));
          graph.remove(byType("VAEDecode"));
          const save = LiteGraph.createNode("SaveLatent");
          graph.add(save);
          sampler.connect(0, save, 0);
        }"""
    )
    clip = frame_node(page, node_id)
    page.wait_for_timeout(500)
    page.locator('.vc-attention-panel button[data-mode="speed"]').click()
    page.evaluate("() => window.comfyAPI.app.app.queuePrompt(0, 1)")
    page.wait_for_function(
        """(id) => window.comfyAPI.app.app.graph.getNodeById(id).vcAttentionPanel.status.textContent.startsWith("backend:")""",
        arg=node_id, timeout=300_000,
    )
    status = node_state(page, node_id)["status"].splitlines()
    assert status[0].startswith("backend: ")
    assert "cross_attention x" in status[1]  # Wan's cross-attention always stays on the model's attention
    assert status[2].startswith("grouping: ")

    # for the screenshot: one widget edited away from the preset (marked), next to the real stats
    page.evaluate(
        """(id) => {
          const widget = window.comfyAPI.app.app.graph.getNodeById(id).widgets.find((w) => w.name === "clusters");
          widget.value = 2 * widget.value;
          widget.callback(widget.value);
        }""",
        node_id,
    )
    page.wait_for_timeout(300)
    shot = tmp_path / "screenshot-node.png"
    page.screenshot(path=str(shot), clip=clip)
    assert shot.stat().st_size > 10_000
    if os.environ.get("VC_ATTENTION_SCREENSHOT"):
        shutil.copyfile(shot, os.environ["VC_ATTENTION_SCREENSHOT"])


def test_templates_browser_shows_the_pack_and_its_workflows(page):
    """What a user sees: Browse Templates -> our pack under Extensions -> the six workflows."""
    page.evaluate("() => window.comfyAPI.app.app.extensionManager.command.execute('Comfy.BrowseTemplates')")
    dialog = page.locator('[role="dialog"]')
    dialog.get_by_text(PACK, exact=True).first.click()
    for path in (REPO / "workflows").glob("*.json"):
        dialog.get_by_text(path.stem, exact=True).wait_for(timeout=30_000)
    page.keyboard.press("Escape")
    dialog.first.wait_for(state="detached", timeout=10_000)
