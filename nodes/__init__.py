"""ComfyUI nodes, the attention override, the step schedule and the per-layer grouping cache."""
