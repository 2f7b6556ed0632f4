"""The "VC-Attention" node: MODEL in, a patched clone out (widgets from nodes/presets.py)."""
from __future__ import annotations

import inspect

from comfy_api.latest import io

from ..kernels import backends
from . import presets
from .patch import Settings, VCPatch, install

NODE_ID = "VCAttention"
CATEGORY = "VC-Attention"


def _advanced(spec: dict) -> dict:
    """`advanced=True` where the host knows it (ComfyUI >= 0.9); older hosts show the widget plainly."""
    if spec.get("advanced") and "advanced" in inspect.signature(io.Int.Input.__init__).parameters:
        return {"advanced": True}
    return {}


def backend_options() -> list[str]:
    return ["auto"] + [b.name for b in backends.backends()]


def unavailable_backends() -> dict[str, str]:
    """{backend: why it cannot run on this machine} for each registered backend that cannot."""
    return {b.name: reason for b in backends.backends() if (reason := b.availability())}


def _backend_marks() -> dict:
    """Tooltip and front-end data that mark the backends this machine cannot run.

    The options stay the plain names (a workflow saved on a GPU machine must load anywhere); the
    tooltip says which cannot run here and why, and the web extension marks them from
    `vc_attention_unavailable` (ComfyUI >= 0.3.4x passes extra_dict to the front end).
    """
    unavailable = unavailable_backends()
    here = "; ".join(f"{name} cannot ({reason})" for name, reason in unavailable.items())
    marks = {"tooltip": presets.WIDGETS["backend"]["tooltip"] + (f" On this machine: {here}." if here else "")}
    params = inspect.signature(io.Combo.Input.__init__).parameters
    if "extra_dict" in params or any(p.kind is p.VAR_KEYWORD for p in params.values()):
        marks["extra_dict"] = {"vc_attention_unavailable": unavailable}
    return marks


def widget_input(name: str, spec: dict):
    """One schema input built from its row of the widget table."""
    common = dict(default=spec["default"], tooltip=spec["tooltip"], **_advanced(spec))
    kind = spec["kind"]
    if kind == "combo":
        if "options" in spec:
            return io.Combo.Input(name, options=spec["options"], **common)
        return io.Combo.Input(name, options=backend_options(), **(common | _backend_marks()))
    if kind == "boolean":
        return io.Boolean.Input(name, **common)
    number = io.Int if kind == "int" else io.Float
    return number.Input(name, min=spec["min"], max=spec["max"], step=spec["step"], **common)


# presets that may not make a run slower: at a shape where VC-Attention measured slower than the
# model's attention they run the model's (fidelity and custom keep the user's choice and say so)
AVOID_SLOWER_MODES = ("balanced", "speed")


def settings_from_widgets(resolved: dict, mode: str = "custom") -> Settings:
    return Settings(
        config=presets.config_from_widgets(resolved),
        clusters=int(resolved["clusters"]),
        kmeans_iters=int(resolved["kmeans_iters"]),
        grouping_window=float(resolved["grouping_window"]),
        start_percent=float(resolved["start_percent"]),
        end_percent=float(resolved["end_percent"]),
        backend=resolved["backend"],
        avoid_slower=mode in AVOID_SLOWER_MODES,
        within_bins=presets.within_bins(mode),
    )


class VCAttention(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id=NODE_ID,
            display_name="VC-Attention",
            category=CATEGORY,
            description="Runs the model's self-attention with VC-Attention: INT8 Q/K, FP8 probabilities and "
            "values, V-Smooth token grouping and optional ExpCast. Cross-attention, masked calls and calls "
            "no kernel can take stay on the model's own attention and are counted in the node's status line.",
            inputs=[io.Model.Input("model", tooltip="The diffusion model to patch (left unchanged; a patched copy is returned).")]
            + [widget_input(name, spec) for name, spec in presets.WIDGETS.items()],
            outputs=[io.Model.Output(display_name="model", tooltip="The model with VC-Attention on its self-attention.")],
            hidden=[io.Hidden.unique_id],
        )

    @classmethod
    def execute(cls, model, mode, **widgets) -> io.NodeOutput:
        resolved = presets.resolve(mode, widgets)
        if resolved["backend"] not in backend_options():
            raise ValueError(
                f"VC-Attention: backend {resolved['backend']!r} is not available here; choose one of "
                f"{', '.join(backend_options())}."
            )
        if presets.PRECISIONS[resolved["precision"]] is None:
            return io.NodeOutput(model)
        # checked here, not per call: a named backend must stop the run even when every call
        # would have fallen back for another reason (masks, cross-attention, the sigma window)
        reason = unavailable_backends().get(resolved["backend"])
        if reason:
            raise ValueError(
                f"VC-Attention: backend {resolved['backend']!r} cannot run on this machine: {reason}. "
                "Choose backend 'auto' to run the fastest kernel that can (or the model's own attention, counted)."
            )
        patch = VCPatch(settings_from_widgets(resolved, mode), node_id=str(cls.hidden.unique_id))
        return io.NodeOutput(install(model, patch))
