"""Stand-in for ComfyUI's `comfy` package (tests only; see tests/comfy_standin/README.md)."""
