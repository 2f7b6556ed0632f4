"""The real-host probes' PyAV option (tests/comfyui_pyav.py): placeholders only when asked for and only
where PyAV is missing; otherwise `import av` is left as it is."""
import importlib.util
import sys
from pathlib import Path

import pytest

# the probes import it as a sibling script; pytest's importlib mode does not put tests/ on sys.path
_spec = importlib.util.spec_from_file_location("comfyui_pyav", Path(__file__).resolve().parent / "comfyui_pyav.py")
comfyui_pyav = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(comfyui_pyav)

HAS_PYAV = importlib.util.find_spec("av") is not None


@pytest.fixture
def clean_import_state(monkeypatch):
    """The placeholder finder goes on sys.meta_path and `av` into sys.modules: both restored afterwards."""
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    saved = {name: mod for name, mod in sys.modules.items() if name == "av" or name.startswith("av.")}
    yield
    for name in [n for n in sys.modules if n == "av" or n.startswith("av.")]:
        del sys.modules[name]
    sys.modules.update(saved)


def test_without_the_variable_nothing_is_installed(clean_import_state, monkeypatch):
    monkeypatch.delenv("VC_PYAV_PLACEHOLDER", raising=False)
    before = list(sys.meta_path)
    assert comfyui_pyav.install_if_allowed() is False
    assert sys.meta_path == before


def test_with_the_variable_the_placeholders_stand_in_only_for_a_missing_pyav(clean_import_state, monkeypatch):
    monkeypatch.setenv("VC_PYAV_PLACEHOLDER", "1")
    installed = comfyui_pyav.install_if_allowed()
    assert installed is (not HAS_PYAV)
    if installed:
        import av

        # a name ComfyUI's video types look up at import time exists; using it raises
        with pytest.raises(RuntimeError, match="needs PyAV"):
            av.open("clip.mp4")
