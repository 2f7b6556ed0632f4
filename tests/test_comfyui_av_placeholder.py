"""The PyAV placeholder of the ComfyUI sampling benchmark (commands/comfyui_av_placeholder.py): the
imports ComfyUI makes at module level work, names are stable, and any use raises."""
import sys

import pytest

from vc_attention.commands import comfyui_av_placeholder as placeholder


@pytest.fixture
def finder(monkeypatch):
    """The placeholder importer first on sys.meta_path (so it answers even where PyAV is installed),
    removed again with every av module it made."""
    monkeypatch.setattr(sys, "meta_path", [placeholder.PlaceholderFinder()] + sys.meta_path)
    saved = {name: mod for name, mod in sys.modules.items() if name == "av" or name.startswith("av.")}
    for name in saved:
        monkeypatch.delitem(sys.modules, name)
    yield
    for name in [n for n in sys.modules if n == "av" or n.startswith("av.")]:
        del sys.modules[name]
    sys.modules.update(saved)


def test_comfyuis_module_level_imports_work(finder):
    from av.container import InputContainer
    from av.video.reformatter import ColorPrimaries, ColorTrc

    import av

    table = {ColorTrc.BT709: "sRGB", ColorTrc.SMPTE2084: "HDR PQ"}  # hashable, one object per name
    assert table[ColorTrc.BT709] == "sRGB" and ColorTrc.BT709 is av.video.reformatter.ColorTrc.BT709
    assert repr(InputContainer) == "<PyAV placeholder av.container.InputContainer>"
    assert ColorPrimaries.BT2020 is not ColorPrimaries.BT709

    class Derived(av.AudioFrame):  # subclassing at import time works
        pass

    assert Derived.__mro__[-1] is object


def test_any_use_raises(finder):
    import av

    with pytest.raises(placeholder.PyAVMissing, match="av.open"):
        av.open("clip.mp4", mode="r")
    with pytest.raises(placeholder.PyAVMissing):
        iter(av.container)
    with pytest.raises(AttributeError):
        av.__wrapped__  # noqa: B018 (dunder lookups are not PyAV names: introspection sees no attribute)


def test_installed_only_when_pyav_is_missing(monkeypatch):
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    try:
        import av  # noqa: F401
        has_pyav = "av" in sys.modules and not isinstance(sys.modules["av"], placeholder.PlaceholderModule)
    except ImportError:
        has_pyav = False
    assert placeholder.install_if_missing() is (not has_pyav)
    assert any(isinstance(f, placeholder.PlaceholderFinder) for f in sys.meta_path) is (not has_pyav)
    if not has_pyav:
        sys.modules.pop("av", None)
