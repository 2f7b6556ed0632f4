"""The three nodes' V3 schemas (ids, widgets from the preset table) and the patch node's contract."""
import asyncio

import pytest

pytestmark = pytest.mark.usefixtures("comfy_standin")

FROZEN = {
    "VCAttention": "VC-Attention",
    "VCAttentionFidelityCheck": "VC-Attention Fidelity Check",
    "VCAttentionCapture": "VC-Attention Capture",
}


def widgets():
    from vc_attention.nodes import presets

    return {k: v["default"] for k, v in presets.WIDGETS.items() if k != "mode"}


def run_node(node_cls, unique_id="5", **inputs):
    return node_cls.PREPARE_CLASS_CLONE({"hidden_inputs": {"UNIQUE_ID": unique_id}}).execute(**inputs)


def test_capture_tooltips_agree_that_a_patched_copy_is_returned():
    from vc_attention.nodes.node_capture import VCAttentionCapture

    schema = VCAttentionCapture.GET_SCHEMA()
    assert "patched copy" in schema.inputs[0].tooltip and "patched copy" in schema.outputs[0].tooltip


def test_the_extension_lists_the_three_frozen_nodes():
    from vc_attention.nodes.extension import comfy_entrypoint

    nodes = asyncio.run(asyncio.run(comfy_entrypoint()).get_node_list())
    schemas = [n.GET_SCHEMA() for n in nodes]
    assert {s.node_id: s.display_name for s in schemas} == FROZEN
    assert {s.category for s in schemas} == {"VC-Attention"}
    for s in schemas:
        assert all(i.tooltip for i in s.inputs), s.node_id


def test_vc_attention_widgets_come_from_the_preset_table():
    from vc_attention.nodes import presets
    from vc_attention.nodes.node_attention import VCAttention

    schema = VCAttention.GET_SCHEMA()
    assert [i.id for i in schema.inputs] == ["model"] + list(presets.WIDGETS)
    assert schema.inputs[0].io_type == "MODEL" and schema.outputs[0].io_type == "MODEL"
    for widget in schema.inputs[1:]:
        spec = presets.WIDGETS[widget.id]
        # the backend's tooltip goes on to say which backends cannot run on this machine
        assert widget.default == spec["default"] and widget.tooltip.startswith(spec["tooltip"]), widget.id
        assert bool(widget.advanced) == bool(spec.get("advanced")), widget.id
        for bound in ("min", "max", "step"):
            if bound in spec:
                assert getattr(widget, bound) == spec[bound], (widget.id, bound)
    backend = schema.inputs[-1]
    assert backend.options[0] == "auto" and "reference" in backend.options
    assert schema.inputs[1].options == ["fidelity", "balanced", "speed", "custom"]
    assert [h.value for h in schema.hidden] == ["UNIQUE_ID"]


def test_patching_returns_a_clone_and_leaves_the_original_untouched():
    from toy_dit import toy_model
    from vc_attention.nodes.node_attention import VCAttention

    model = toy_model()
    sentinel = object()
    model.model_options["transformer_options"]["something_else"] = sentinel
    before = (dict(model.model_options["transformer_options"]), {k: dict(v) for k, v in model.callbacks.items()})
    patched = run_node(VCAttention, model=model, mode="balanced", **widgets()).result[0]
    assert patched is not model and patched.model is model.model
    assert (dict(model.model_options["transformer_options"]), model.callbacks) == before
    assert "optimized_attention_override" in patched.model_options["transformer_options"]
    assert patched.model_options["transformer_options"]["something_else"] is sentinel


def test_precision_off_returns_the_model_unpatched():
    from toy_dit import toy_model
    from vc_attention.nodes.node_attention import VCAttention

    model = toy_model()
    out = run_node(VCAttention, model=model, mode="custom", **(widgets() | {"precision": "off"})).result[0]
    assert out is model and "optimized_attention_override" not in out.model_options["transformer_options"]


def test_widget_values_become_the_kernel_configuration():
    from toy_dit import toy_model
    from vc_attention.nodes.node_attention import VCAttention

    patched = run_node(VCAttention, model=toy_model(), mode="custom",
                       **(widgets() | {"precision": "fp8-qk/fp8-pv", "v_smooth": False, "expcast": True})).result[0]
    attend = patched.model_options["transformer_options"]["optimized_attention_override"]
    patch = attend.handler.__self__
    assert (patch.settings.config.qk, patch.settings.config.v, patch.settings.config.p) == ("fp8", "per_channel", "expcast")
    assert patch.node_id == "5"


def test_invalid_inputs_raise_readable_errors():
    from toy_dit import toy_model
    from vc_attention.nodes.node_attention import VCAttention

    with pytest.raises(ValueError, match="backend 'sm999' is not available"):
        run_node(VCAttention, model=toy_model(), mode="balanced", **(widgets() | {"backend": "sm999"}))
    with pytest.raises(ValueError, match="start_percent"):
        run_node(VCAttention, model=toy_model(), mode="balanced", **(widgets() | {"start_percent": 0.9, "end_percent": 0.1}))


def test_a_named_backend_this_machine_cannot_run_stops_the_run_with_its_reason():
    """Even a graph whose every call would fall back for another reason must not finish green."""
    from toy_dit import toy_model
    from vc_attention.kernels import backends
    from vc_attention.nodes.node_attention import VCAttention

    reason = backends.get("mma").availability()
    if reason is None:
        pytest.skip("mma can run on this machine")
    with pytest.raises(ValueError, match="backend 'mma' cannot run on this machine") as err:
        run_node(VCAttention, model=toy_model(), mode="balanced", **(widgets() | {"backend": "mma"}))
    assert reason in str(err.value)
    run_node(VCAttention, model=toy_model(), mode="balanced", **(widgets() | {"backend": "reference"}))


def test_the_backend_list_marks_what_this_machine_cannot_run():
    from vc_attention.kernels import backends
    from vc_attention.nodes.node_attention import VCAttention

    (backend,) = [i for i in VCAttention.GET_SCHEMA().inputs if i.id == "backend"]
    unavailable = {name: why for name, why in backends.describe() if why}
    assert backend.extra_dict == {"vc_attention_unavailable": unavailable}
    for name, why in unavailable.items():
        assert f"{name} cannot ({why})" in backend.tooltip
    assert "reference cannot" not in backend.tooltip


def test_root_package_exposes_the_v3_entry_point_inside_comfyui(comfy_standin):
    """Load the checkout the way ComfyUI loads a custom node folder (by path, under its folder name).

    In a subprocess: a second copy of the package in this process would re-register the kernels'
    torch custom op under the same name.
    """
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    script = (
        "import importlib.util, sys\n"
        f"sys.path.insert(0, {str(comfy_standin)!r})\n"
        f"spec = importlib.util.spec_from_file_location('custom_pack', {str(root / '__init__.py')!r}, "
        f"submodule_search_locations=[{str(root)!r}])\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "sys.modules['custom_pack'] = module\n"
        "spec.loader.exec_module(module)\n"
        "print(callable(module.comfy_entrypoint), module.WEB_DIRECTORY, hasattr(module, 'NODE_CLASS_MAPPINGS'))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    # NODE_CLASS_MAPPINGS must be absent: ComfyUI ignores comfy_entrypoint when a module has it
    assert result.stdout.split() == ["True", "./web", "False"]
