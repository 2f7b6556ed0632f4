"""ComfyUI V3 entry point: the extension that lists this pack's three nodes."""
from __future__ import annotations

from comfy_api.latest import ComfyExtension, io

from .node_attention import VCAttention
from .node_capture import VCAttentionCapture
from .node_fidelity import VCAttentionFidelityCheck


class VCAttentionExtension(ComfyExtension):
    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        return [VCAttention, VCAttentionFidelityCheck, VCAttentionCapture]


async def comfy_entrypoint() -> VCAttentionExtension:
    return VCAttentionExtension()
