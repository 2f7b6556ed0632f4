"""Runs inside a real ComfyUI (see tests/test_real_comfyui.py).

Usage: `python comfyui_host_check.py COMFYUI_PATH OUT.json wan|hunyuan`. Loads this checkout with
ComfyUI's own custom-node loader, samples a tiny random-weight Wan2.1 T2V or HunyuanVideo model built
from ComfyUI's classes with and without the VC-Attention node, and writes what it saw as JSON.
Kept free of pytest so it runs in ComfyUI's own environment.
"""
import json
import sys
from pathlib import Path

PACK = Path(__file__).resolve().parent.parent
FROZEN_IDS = ("VCAttention", "VCAttentionFidelityCheck", "VCAttentionCapture")
STEPS, LATENT, TEXT_TOKENS = 4, (1, 16, 3, 14, 16), 16  # 3 x 7 x 8 = 168 video tokens after 1x2x2 patches


def _tiny_model(comfy, kind):
    """Random weights, ComfyUI's own model classes: Wan2.1 T2V (2 blocks) or HunyuanVideo (1 double + 1 single)."""
    import torch

    if kind == "wan":
        config = comfy.supported_models.WAN21_T2V({
            "image_model": "wan2.1", "model_type": "t2v", "patch_size": (1, 2, 2), "in_dim": 16, "out_dim": 16,
            "dim": 128, "ffn_dim": 256, "freq_dim": 64, "text_dim": 64, "text_len": TEXT_TOKENS, "num_heads": 2,
            "num_layers": 2,
        })
    else:
        config = comfy.supported_models.HunyuanVideo({
            "image_model": "hunyuan_video", "in_channels": 16, "out_channels": 16, "vec_in_dim": 32,
            "context_in_dim": 64, "hidden_size": 128, "mlp_ratio": 2.0, "num_heads": 2, "depth": 1,
            "depth_single_blocks": 1, "axes_dim": [16, 24, 24], "theta": 256, "patch_size": [1, 2, 2],
            "qkv_bias": True, "guidance_embed": False, "byt5": False, "meanflow": False,
            "use_cond_type_embedding": False, "vision_in_dim": None, "meanflow_sum": False,
        })
    config.set_inference_dtype(torch.bfloat16, None)
    model = config.get_model({}, device="cpu")
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.diffusion_model.parameters():
            p.copy_((torch.randn(p.shape, generator=generator) * 0.05).to(p.dtype))
    return comfy.model_patcher.ModelPatcher(model, load_device=torch.device("cpu"), offload_device=torch.device("cpu"))


def _host_check(comfyui_path: str, out_path: str, kind: str) -> None:
    sys.argv = ["main.py", "--cpu"]
    sys.path.insert(0, comfyui_path)
    import asyncio

    import comfyui_pyav  # beside this script

    pyav_placeholder = comfyui_pyav.install_if_allowed()

    import comfy.options

    comfy.options.enable_args_parsing()
    import comfy.model_patcher
    import comfy.sample
    import comfy.supported_models
    import nodes
    import server
    import torch

    loaded = asyncio.run(nodes.load_custom_node(str(PACK)))
    found = [i for i in FROZEN_IDS if i in nodes.NODE_CLASS_MAPPINGS]
    node_cls = nodes.NODE_CLASS_MAPPINGS["VCAttention"]
    info = node_cls.GET_NODE_INFO_V1()
    inputs = {**info["input"]["required"], **info["input"].get("optional", {})}

    class EventRecorder:  # what the running server's PromptServer.instance receives
        messages = []

        def send_sync(self, event, data, sid=None):
            self.messages.append((event, data))

    server.PromptServer.instance = EventRecorder()

    model = _tiny_model(comfy, kind)
    options_before = repr(model.model_options)
    widgets = {name: spec[1]["default"] for name, spec in inputs.items() if name not in ("model", "mode")}
    widgets["backend"] = "reference"
    patched = node_cls.PREPARE_CLASS_CLONE({"hidden_inputs": {"UNIQUE_ID": "9"}}).execute(model=model, mode="balanced", **widgets).args[0]

    transformer_options = patched.model_options["transformer_options"]
    override = transformer_options["optimized_attention_override"]
    calls = {"override": 0, "forwards": 0, "last_options": None, "skip_reshape": set(), "tokens": set()}

    def counting_override(func, *args, **kwargs):
        calls["override"] += 1
        calls["skip_reshape"].add(bool(kwargs.get("skip_reshape")))
        calls["tokens"].add(args[0].shape[2] if kwargs.get("skip_reshape") else args[0].shape[1])
        if kwargs["transformer_options"] is not calls["last_options"]:  # a new forward pass
            calls["forwards"] += 1
            calls["last_options"] = kwargs["transformer_options"]
        return override(func, *args, **kwargs)

    transformer_options["optimized_attention_override"] = counting_override

    generator = torch.Generator().manual_seed(1)
    noise = torch.randn(LATENT, generator=generator)
    latent = torch.zeros(LATENT)
    extra = (lambda: {"pooled_output": torch.randn(1, 32, generator=generator)}) if kind == "hunyuan" else dict
    positive = [[torch.randn(1, TEXT_TOKENS, 64, generator=generator), extra()]]
    negative = [[torch.randn(1, TEXT_TOKENS, 64, generator=generator), extra()]]

    def run(m):
        return comfy.sample.sample(m, noise, STEPS, 5.0, "euler", "simple", positive, negative, latent, seed=1,
                                   disable_pbar=True)

    plain = run(model)
    plain_calls = calls["override"]
    vc = run(patched)
    events = [data for event, data in EventRecorder.messages if event == "vc_attention.stats"]
    result = {
        "loaded": bool(loaded),
        "node_ids": found,
        "display_names": [nodes.NODE_DISPLAY_NAME_MAPPINGS.get(i) for i in found],
        "mode_default": inputs["mode"][1]["default"],
        "backend_options": inputs["backend"][0] if isinstance(inputs["backend"][0], list) else inputs["backend"][1].get("options"),
        "original_untouched": repr(model.model_options) == options_before,
        "plain_override_calls": plain_calls,
        "override_calls": calls["override"],
        "forwards": calls["forwards"],
        "skip_reshape": sorted(calls["skip_reshape"]),
        "query_tokens": sorted(calls["tokens"]),
        "stats": events[0] if len(events) == 1 else {"events": len(events)},
        "rel_l2": float((vc.double() - plain.double()).norm() / plain.double().norm()),
        "pyav_placeholder": pyav_placeholder,
    }
    if kind == "wan":
        result.update(_schedule_cases(comfy, node_cls, model, widgets, noise, latent, positive, negative, EventRecorder))
        result.update(_other_nodes(nodes, run, model, plain, out_path))
    Path(out_path).write_text(json.dumps(result, default=str))


def _schedule_cases(comfy, node_cls, model, widgets, noise, latent, positive, negative, recorder) -> dict:
    """Split sampling over two patched models (as two KSamplerAdvanced nodes) and a heun run."""
    def patched(unique_id):
        node = node_cls.PREPARE_CLASS_CLONE({"hidden_inputs": {"UNIQUE_ID": unique_id}})
        return node.execute(model=model, mode="balanced", **widgets).args[0]

    recorder.messages.clear()
    common = dict(cfg=5.0, sampler_name="euler", scheduler="simple", positive=positive, negative=negative,
                  seed=1, disable_pbar=True)
    half = comfy.sample.sample(patched("high"), noise, STEPS, latent_image=latent, start_step=0,
                               last_step=STEPS // 2, force_full_denoise=False, **common)
    comfy.sample.sample(patched("low"), noise, STEPS, latent_image=half, start_step=STEPS // 2,
                        last_step=STEPS, disable_noise=True, **common)
    comfy.sample.sample(patched("heun"), noise, STEPS, latent_image=latent, **(common | {"sampler_name": "heun"}))
    events = {data["node_id"]: data for event, data in recorder.messages if event == "vc_attention.stats"}
    return {"schedule_events": {k: {key: v[key] for key in ("backend_calls", "baseline_calls", "grouping_calls", "steps")}
                                for k, v in events.items()}}


def _other_nodes(nodes, run, model, plain, out_path) -> dict:
    """Capture (into a scratch output folder) and Fidelity Check through the real node API."""
    import folder_paths
    from safetensors import safe_open

    folder_paths.set_output_directory(str(Path(out_path).parent / "output"))
    capture = nodes.NODE_CLASS_MAPPINGS["VCAttentionCapture"]
    recording = capture.PREPARE_CLASS_CLONE(None).execute(
        model=model, blocks="0", steps="0, 3", branches="both", filename_prefix="vc_attention/host").args[0]
    recorded = run(recording)
    files = sorted((Path(folder_paths.get_output_directory()) / "vc_attention").glob("host_*.safetensors"))
    with safe_open(str(files[0]), framework="pt") as f:
        keys, metadata = sorted(f.keys()), f.metadata()
        q_shape = list(f.get_tensor(keys[0]).shape)

    fidelity = nodes.NODE_CLASS_MAPPINGS["VCAttentionFidelityCheck"].PREPARE_CLASS_CLONE(None)
    frames = plain[0, :3].permute(1, 2, 3, 0).float().sigmoid()  # (frames, H, W, 16 channels) in [0, 1]
    out = fidelity.execute(reference=frames, test=frames.flip(1))
    return {
        "capture_unchanged": bool((recorded == plain).all()),
        "capture_files": len(files),
        "capture_keys": keys,
        "capture_metadata": metadata,
        "capture_q_shape": q_shape,
        "fidelity_outputs": [type(v).__name__ for v in out.args],
        "fidelity_ui": out.ui.as_dict()["text"][0].splitlines()[-1],
    }


if __name__ == "__main__":
    _host_check(sys.argv[1], sys.argv[2], sys.argv[3])
