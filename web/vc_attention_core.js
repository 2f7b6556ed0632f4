// Pure helpers of the VC-Attention front end: preset differences and the status line text.
// No DOM, no ComfyUI objects, so tests can run them under Node. ComfyUI also imports this file as
// an extension module; it only exports functions and has no side effects.

export const PRESET_MODES = ["fidelity", "balanced", "speed"];

// Float widgets round their value to the widget's step: a tiny tolerance keeps 0.25 equal to 0.25.
function sameValue(a, b) {
  if (typeof a === "number" && typeof b === "number") return Math.abs(a - b) < 1e-6;
  return a === b;
}

// The preset a node is measured against: its mode, or for "custom" the preset it started from.
export function basePreset(mode, lastPreset, table) {
  if (PRESET_MODES.includes(mode)) return mode;
  return PRESET_MODES.includes(lastPreset) ? lastPreset : table.default_mode;
}

// [{name, value, preset}] for each preset-governed widget whose value differs from the preset.
export function presetDifferences(values, preset) {
  return Object.keys(preset)
    .filter((name) => name in values && !sameValue(values[name], preset[name]))
    .map((name) => ({ name, value: values[name], preset: preset[name] }));
}

function shown(value) {
  if (typeof value === "boolean") return value ? "on" : "off";
  return String(value);
}

// One line saying which widgets differ from which preset (empty when none do).
export function differenceLine(base, diffs) {
  if (!diffs.length) return `${base} preset: all widgets as the preset sets them`;
  const items = diffs.map((d) => `${d.name} ${shown(d.value)} (preset ${shown(d.preset)})`);
  return `custom - differs from ${base}: ${items.join(", ")}`;
}

function counts(map) {
  return Object.entries(map || {})
    .sort((a, b) => b[1] - a[1])
    .map(([name, n]) => `${name} x${n}`)
    .join(", ");
}

// The status line after a run, from the node's "vc_attention.stats" payload (nodes/stats.py).
export function statusLines(stats) {
  const backends = counts(stats.backend_calls) || "no VC-Attention calls";
  const timing = stats.sampled_calls
    ? `${stats.attention_ms.toFixed(3)} ms per call (${stats.sampled_calls} timed)`
    : "not timed";
  const speedup = stats.est_speedup == null ? "n/a" : `${stats.est_speedup.toFixed(2)}x`;
  const fallbacks = counts(stats.fallbacks) || "none";
  const share = stats.grouping_share == null ? "" : `, ${(100 * stats.grouping_share).toFixed(1)}% of the attention time`;
  const lines = [
    `backend: ${backends} | attention ${timing} | est. speed-up ${speedup}`,
    `fallbacks to the model's attention: ${fallbacks}`,
    `grouping: ${stats.grouping_calls} calls over ${stats.steps} steps${share}`,
  ];
  if (stats.slower_shapes && stats.slower_shapes.length) {
    const action = stats.kept_slower ? "kept as chosen" : "the model's attention ran there";
    lines.push(`slower than the model's attention at ${stats.slower_shapes.join(", ")} (${action})`);
  }
  const cross = counts(stats.cross_attention);
  if (cross) {
    const slower = stats.cross_slower_shapes && stats.cross_slower_shapes.length
      ? ` (cuDNN slower at ${stats.cross_slower_shapes.join(", ")})` : "";
    lines.push(`cross-attention (exact): ${cross}${slower}`);
  }
  // calls whose kernel lacks the fidelity preset's refinements ran without them (nodes/stats.py refinements_dropped)
  const dropped = counts(stats.refinements_dropped);
  if (dropped) lines.push(`ran without the fidelity refinements this kernel lacks: ${dropped}`);
  return lines;
}

// The warning shown when the selected backend cannot run on this machine ("" when it can or is
// auto). `unavailable` maps backend -> reason, as the node's schema sends it.
export function backendWarning(backend, unavailable) {
  const reason = (unavailable || {})[backend];
  return reason ? `backend ${backend} cannot run on this machine (${reason}): the run will stop` : "";
}
