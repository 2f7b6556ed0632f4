"""Stand-in for ComfyUI's `comfy_api` package (tests only; see tests/comfy_standin/README.md)."""
