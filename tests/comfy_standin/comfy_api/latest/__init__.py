"""Stand-in of comfy_api.latest: ComfyExtension, io and ui (the V3 node API subset we use)."""
from abc import ABC, abstractmethod

from . import _io as io
from . import _ui as ui

__all__ = ["ComfyExtension", "io", "ui"]


class ComfyExtension(ABC):
    async def on_load(self) -> None:
        """Called when the extension is loaded."""

    @abstractmethod
    async def get_node_list(self):
        """The node classes this extension provides."""
