// VC-Attention node front end: a fidelity <-> speed control that sets the widgets from the preset
// table (web/presets.json, written from nodes/presets.py), marks widgets that differ from the
// preset, and shows a status line from the stats the node sends after each run.
import {
  PRESET_MODES,
  backendWarning,
  basePreset,
  differenceLine,
  presetDifferences,
  statusLines,
} from "./vc_attention_core.js";

const { app } = window.comfyAPI.app;
const { api } = window.comfyAPI.api;

const NODE_ID = "VCAttention";
const STATS_EVENT = "vc_attention.stats";
const MARK = "\u25C6 "; // prefix on the label of a widget that differs from the preset
const UNAVAILABLE_MARK = "\u26A0 "; // prefix on the backend label when that backend cannot run here

// One fetch for every node; a failure is shown on each node instead of breaking the graph.
const presetTable = fetch(new URL("./presets.json", import.meta.url)).then((response) => {
  if (!response.ok) throw new Error(`presets.json: HTTP ${response.status}`);
  return response.json();
});

function injectStyle() {
  if (document.getElementById("vc-attention-style")) return;
  const style = document.createElement("style");
  style.id = "vc-attention-style";
  style.textContent = `
    .vc-attention-panel { font: 11px sans-serif; color: var(--input-text, #ddd); display: flex;
      flex-direction: column; gap: 3px; padding: 2px 4px; overflow: hidden; }
    .vc-attention-row { display: flex; align-items: center; gap: 4px; }
    .vc-attention-row span { opacity: 0.7; }
    .vc-attention-row button { flex: 1; padding: 2px 0; border-radius: 4px; cursor: pointer;
      border: 1px solid var(--border-color, #555); background: var(--comfy-input-bg, #222); color: inherit; }
    .vc-attention-row button.active { background: #3d6fb6; border-color: #6a9be0; color: #fff; }
    .vc-attention-row button.base { border-style: dashed; border-color: #6a9be0; }
    .vc-attention-diff.custom { color: #e0b050; }
    .vc-attention-status { opacity: 0.85; white-space: pre-wrap; }
    .vc-attention-warning { color: #e06050; white-space: pre-wrap; }
  `;
  document.head.appendChild(style);
}

function widgetByName(node, name) {
  return node.widgets?.find((w) => w.name === name);
}

class VCAttentionPanel {
  constructor(node, unavailable) {
    this.node = node;
    this.unavailable = unavailable || {}; // backend -> why it cannot run on this machine
    this.table = null;
    this.originalLabels = new Map();
    this.element = document.createElement("div");
    this.element.className = "vc-attention-panel";
    this.row = document.createElement("div");
    this.row.className = "vc-attention-row";
    this.row.append(Object.assign(document.createElement("span"), { textContent: "fidelity" }));
    this.buttons = PRESET_MODES.map((mode) => {
      const button = document.createElement("button");
      button.textContent = mode;
      button.dataset.mode = mode;
      button.title = `Set every widget from the ${mode} preset`;
      button.addEventListener("click", () => this.applyPreset(mode));
      this.row.append(button);
      return button;
    });
    this.row.append(Object.assign(document.createElement("span"), { textContent: "speed" }));
    this.diff = Object.assign(document.createElement("div"), { className: "vc-attention-diff" });
    this.status = Object.assign(document.createElement("div"), {
      className: "vc-attention-status",
      textContent: "status: appears here after a run",
    });
    this.warning = Object.assign(document.createElement("div"), { className: "vc-attention-warning" });
    this.element.append(this.row, this.diff, this.warning, this.status);
    this.widget = node.addDOMWidget("vc_attention_panel", "vc_attention_panel", this.element, {
      serialize: false,
      hideOnZoom: false,
      getMinHeight: () => 120,
    });
    this.widget.serialize = false; // never part of widgets_values: saved workflows keep their layout
    this.onStats = (event) => this.showStats(event.detail);
    api.addEventListener(STATS_EVENT, this.onStats);
  }

  async init() {
    try {
      this.table = await presetTable;
    } catch (error) {
      this.diff.textContent = `VC-Attention presets unavailable (${error.message}); widgets still work.`;
      return;
    }
    for (const name of ["mode", "backend", ...Object.keys(this.presetOf(this.table.default_mode))]) {
      const widget = widgetByName(this.node, name);
      if (!widget) continue;
      this.originalLabels.set(name, widget.label);
      const callback = widget.callback;
      widget.callback = (...args) => {
        const result = callback?.apply(widget, args);
        this.onWidgetChanged(name);
        return result;
      };
    }
    this.refresh();
  }

  presetOf(mode) {
    return this.table.presets[mode];
  }

  get mode() {
    return widgetByName(this.node, "mode")?.value;
  }

  set mode(value) {
    const widget = widgetByName(this.node, "mode");
    if (widget) widget.value = value;
  }

  applyPreset(mode) {
    if (!this.table) return;
    this.node.properties.vc_attention_preset = mode;
    this.mode = mode;
    for (const [name, value] of Object.entries(this.presetOf(mode))) {
      const widget = widgetByName(this.node, name);
      if (widget) widget.value = value;
    }
    this.refresh();
  }

  syncAfterLoad() {
    if (PRESET_MODES.includes(this.mode)) this.applyPreset(this.mode);
    else this.refresh();
  }

  onWidgetChanged(name) {
    if (name === "mode") {
      if (PRESET_MODES.includes(this.mode)) this.applyPreset(this.mode);
      else this.refresh();
      return;
    }
    // With a preset selected the preset's values run, so an edited widget means "custom".
    if (PRESET_MODES.includes(this.mode) && this.differences().length) {
      this.node.properties.vc_attention_preset = this.mode;
      this.mode = "custom";
    }
    this.refresh();
  }

  differences() {
    const base = basePreset(this.mode, this.node.properties.vc_attention_preset, this.table);
    const values = {};
    for (const widget of this.node.widgets ?? []) values[widget.name] = widget.value;
    return presetDifferences(values, this.presetOf(base));
  }

  refresh() {
    if (!this.table) return;
    const base = basePreset(this.mode, this.node.properties.vc_attention_preset, this.table);
    const diffs = this.differences();
    const differing = new Set(diffs.map((d) => d.name));
    for (const [name, original] of this.originalLabels) {
      const widget = widgetByName(this.node, name);
      if (widget) widget.label = differing.has(name) ? MARK + name : original;
    }
    for (const button of this.buttons) {
      button.classList.toggle("active", button.dataset.mode === this.mode);
      button.classList.toggle("base", this.mode === "custom" && button.dataset.mode === base);
    }
    const backend = widgetByName(this.node, "backend");
    if (backend) {
      const original = this.originalLabels.get("backend");
      backend.label = this.unavailable[backend.value] ? UNAVAILABLE_MARK + (original ?? "backend") : original;
    }
    this.warning.textContent = backendWarning(backend?.value, this.unavailable);
    this.diff.textContent = differenceLine(base, diffs);
    this.diff.classList.toggle("custom", diffs.length > 0);
    this.node.setDirtyCanvas?.(true, true);
  }

  showStats(stats) {
    if (!stats || String(stats.node_id) !== String(this.node.id)) return;
    this.status.textContent = statusLines(stats).join("\n");
  }

  dispose() {
    api.removeEventListener(STATS_EVENT, this.onStats);
  }
}

app.registerExtension({
  name: "vc_attention.VCAttention",
  setup() {
    injectStyle();
  },
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (nodeData.name !== NODE_ID) return;
    // backend -> reason for each backend this machine cannot run (nodes/node_attention.py)
    const unavailable = nodeData.input?.required?.backend?.[1]?.vc_attention_unavailable ?? {};
    const onNodeCreated = nodeType.prototype.onNodeCreated;
    nodeType.prototype.onNodeCreated = function () {
      const result = onNodeCreated?.apply(this, arguments);
      this.vcAttentionPanel = new VCAttentionPanel(this, unavailable);
      this.vcAttentionPanel.init();
      return result;
    };
    // A loaded workflow sets widget values without callbacks. With a preset selected the node runs
    // the preset's values, so show those (a workflow saved with older preset values is updated).
    const onConfigure = nodeType.prototype.onConfigure;
    nodeType.prototype.onConfigure = function () {
      const result = onConfigure?.apply(this, arguments);
      presetTable.then(() => this.vcAttentionPanel?.syncAfterLoad(), () => {});
      return result;
    };
    const onRemoved = nodeType.prototype.onRemoved;
    nodeType.prototype.onRemoved = function () {
      this.vcAttentionPanel?.dispose();
      this.vcAttentionPanel = null;
      return onRemoved?.apply(this, arguments);
    };
  },
});
