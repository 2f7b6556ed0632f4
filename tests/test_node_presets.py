"""The widget table (nodes/presets.py) and its web copy (web/presets.json) agree and are valid."""
import json

import pytest

from vc_attention.nodes import presets as P


def test_web_presets_json_equals_the_table():
    on_disk = json.loads(P.WEB_PRESETS_PATH.read_text(encoding="utf-8"))
    assert on_disk == json.loads(P.web_json()), "run `python -m vc_attention.nodes.presets --write-web` to regenerate"


def test_every_preset_value_passes_its_own_widget_validation():
    for mode, values in P.PRESETS.items():
        assert set(values) == set(P.PRESET_WIDGETS), mode
        for name, value in values.items():
            P.validate_widget(name, value)


def test_defaults_are_the_default_preset_and_every_widget_has_a_tooltip():
    for name, spec in P.WIDGETS.items():
        assert len(spec["tooltip"]) > 30, name
        assert "default" in spec, name
    for name, value in P.PRESETS[P.DEFAULT_MODE].items():
        assert P.WIDGETS[name]["default"] == value


def _defaults():
    return {k: v["default"] for k, v in P.WIDGETS.items() if k != "mode"}


def test_a_preset_wins_over_widget_values_and_custom_keeps_them():
    widgets = _defaults() | {"expcast": False, "clusters": 7}
    assert P.resolve("speed", widgets)["expcast"] is True
    assert P.resolve("speed", widgets)["clusters"] == P.PRESETS["speed"]["clusters"]
    assert P.resolve("custom", widgets)["clusters"] == 7


@pytest.mark.parametrize(
    "name, value, words",
    [
        ("clusters", 1, "from 2 to 1024"),
        ("clusters", 2.5, "whole number"),
        ("grouping_window", 1.5, "from 0.0 to 1.0"),
        ("precision", "int4", "must be one of"),
        ("v_smooth", "yes", "true or false"),
    ],
)
def test_invalid_values_raise_a_sentence(name, value, words):
    with pytest.raises(ValueError, match=words):
        P.resolve("custom", _defaults() | {name: value})


def test_start_must_be_below_end():
    with pytest.raises(ValueError, match="start_percent"):
        P.resolve("balanced", _defaults() | {"start_percent": 0.6, "end_percent": 0.5})


def test_the_readme_widget_table_has_one_row_per_widget_with_its_default():
    table = P.widgets_markdown().splitlines()
    assert len(table) == 2 + len(P.WIDGETS)
    for row, (name, spec) in zip(table[2:], P.WIDGETS.items()):
        assert row.startswith(f"| `{name}`") and f"| {spec['default']} |" in row


def test_config_from_widgets_maps_each_kernel_widget():
    from vc_attention.kernels.config import FIDELITY, SPEED, VCConfig

    assert P.config_from_widgets(P.PRESETS["fidelity"]) == FIDELITY
    assert P.config_from_widgets(P.PRESETS["speed"]) == SPEED
    custom = {"precision": "fp8-qk/fp8-pv", "v_smooth": False, "expcast": True}
    assert P.config_from_widgets(custom) == VCConfig(qk="fp8", v="per_channel", p="expcast")
    # fidelity's K scales pair for the Hopper INT8 loop only: FP8 Q/K keep one per 128 keys, per-channel V too
    fp8_fidelity = P.PRESETS["fidelity"] | {"precision": "fp8-qk/fp8-pv"}
    # ... and keep exp2 without the second V term (fidelity's refinements are its INT8 Hopper kernel's)
    assert P.config_from_widgets(fp8_fidelity) == FIDELITY.with_(qk="fp8", k_scale_rows=128, p="exp2", v_lo_channels=0)
    plain = P.config_from_widgets(P.PRESETS["fidelity"] | {"v_smooth": False})
    assert plain.k_scale_rows == 128 and plain.p == "exp2" and plain.v_lo_channels == 0
    with pytest.raises(ValueError, match="model's own attention"):
        P.config_from_widgets(custom | {"precision": "off"})


@pytest.mark.parametrize("argv", [[], ["--help"], ["--bogus"]])
def test_the_module_rewrites_presets_json_only_when_asked(argv, monkeypatch, tmp_path):
    written = []
    monkeypatch.setattr(P, "write_web_presets", lambda *a: written.append(1) or tmp_path)
    with pytest.raises(SystemExit):
        P.main(argv)
    assert written == []
    assert P.main(["--write-web"]) == 0 and written == [1]
