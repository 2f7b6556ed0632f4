"""PyAV for the real-host probes (tests/comfyui_host_check.py, tests/comfyui_workflow_probe.py).

ComfyUI imports PyAV (`av`) at module level for video file I/O that neither probe does. A user's
ComfyUI always has it; the GPU machine does not, and its 35 MB wheel does not fit into one device call
beside the ComfyUI checkout and ComfyUI's other requirements. With VC_PYAV_PLACEHOLDER=1 (set by
bench/device_run.sh's tests stage) and PyAV missing, the probes import ComfyUI with the sampling
benchmark's named placeholders (commands/comfyui_av_placeholder.py: any use raises) and say so in
their report; without the variable a missing PyAV stays the import error it is.
"""
import importlib.util
import os
from pathlib import Path

PLACEHOLDER = Path(__file__).resolve().parent.parent / "commands" / "comfyui_av_placeholder.py"


def install_if_allowed() -> bool:
    """True when `import av` now gives the placeholders (only with VC_PYAV_PLACEHOLDER=1 and no PyAV)."""
    if os.environ.get("VC_PYAV_PLACEHOLDER") != "1":
        return False
    # loaded by path: importing the pack would import ComfyUI's comfy_api (and so `av`) first
    spec = importlib.util.spec_from_file_location("comfyui_av_placeholder", PLACEHOLDER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.install_if_missing()
