"""A named placeholder for PyAV (`av`) so that the ComfyUI sampling benchmark imports ComfyUI where
PyAV is not installed.

ComfyUI imports PyAV at module level (comfy_api's video types, which the node API pulls in) for video
file I/O that sampling never does. On the GPU machine PyAV is not installed, and its wheel (35 MB,
FFmpeg bundled) does not fit into one device call beside the ComfyUI checkout and the peers.
`install_if_missing()` registers an importer for `av` and every `av.*` submodule whose attributes are
named placeholders: importing, naming and hashing work (ComfyUI builds enum tables at import time);
any use (calling, instantiating, iterating) raises, so the benchmark cannot silently run without the
real library. The worker installs it only when `import av` fails and records that it did.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types


class PyAVMissing(RuntimeError):
    """A placeholder of the PyAV stand-in was used: the operation needs the real PyAV."""


class Placeholder:
    """One PyAV name (e.g. 'av.video.reformatter.ColorTrc'); attributes are placeholders too."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return named(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        raise PyAVMissing(f"{self._name}(...) needs PyAV, which is not installed (the benchmark's placeholder)")

    def __iter__(self):
        raise PyAVMissing(f"iterating {self._name} needs PyAV, which is not installed (the benchmark's placeholder)")

    def __mro_entries__(self, bases):
        # `class X(av.Something)` at import time: X derives from object; using X's PyAV side raises
        return (object,)

    def __repr__(self) -> str:
        return f"<PyAV placeholder {self._name}>"


_NAMED: dict[str, Placeholder] = {}


def named(name: str) -> Placeholder:
    """The placeholder of a name: the same object each time, so it works as a dict key."""
    return _NAMED.setdefault(name, Placeholder(name))


class PlaceholderModule(types.ModuleType):
    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return named(f"{self.__name__}.{attr}")


class PlaceholderFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds `av` and `av.*` as placeholder packages (after every real finder: a real PyAV wins)."""

    def find_spec(self, fullname, path, target=None):
        if fullname == "av" or fullname.startswith("av."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return PlaceholderModule(spec.name)

    def exec_module(self, module):
        module.__path__ = []


def install_if_missing() -> bool:
    """Make `import av` work with placeholders when PyAV is not installed; True if the placeholders are
    what `import av` gives (installed now or by an earlier call)."""
    if any(isinstance(f, PlaceholderFinder) for f in sys.meta_path):
        return True
    try:
        import av  # noqa: F401
    except ImportError:
        sys.meta_path.append(PlaceholderFinder())
        return True
    return False
