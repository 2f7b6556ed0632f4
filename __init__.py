"""ComfyUI entry point of the VC-Attention node pack.

ComfyUI imports this folder as a package; as a library the same files are installed as
`vc_attention`. Nodes are imported only when ComfyUI's `comfy` package is importable, so the
numerical library (`.kernels`) works without ComfyUI.
"""
import importlib.util

WEB_DIRECTORY = "./web"
__all__ = ["WEB_DIRECTORY"]

if importlib.util.find_spec("comfy") is not None and importlib.util.find_spec("comfy_api") is not None:
    from .nodes.extension import comfy_entrypoint  # noqa: F401  (ComfyUI V3 entry point)

    __all__.append("comfy_entrypoint")
