"""One timed sampling run inside a real ComfyUI checkout (run as a script by commands/bench_comfyui.py).

usage: python comfyui_sampling_worker.py COMFYUI_PATH MODE OUT_DIR STEPS [SIZE]
MODE: default (ComfyUI's own attention), sage (ComfyUI started with --use-sage-attention), or a
VC-Attention preset (fidelity, balanced, speed) applied through our node as ComfyUI loads it.

The model is ComfyUI's own WanModel at Wan2.1-T2V-1.3B widths and full depth (dim 1536, 12 heads of
128, 30 blocks, FFN 8960, text dim 4096) with random bf16 weights: fan-in scaled matrices and norm
gains of 1, so q and k keep unit scale after their RMSNorm and attention is far from uniform (with
near-zero gains every attention row is flat and all methods agree trivially). Latent: 480p, 81
frames -> (1, 16, 21, 60, 104) -> 21 x 30 x 52 = 32,760 tokens; euler, CFG 5, seed 1. One short
warm-up run (kernel builds, cuDNN plans) precedes the timed run; the timed run uses a freshly patched
model, so our per-run costs (grouping steps) are inside the time; the stats baseline (the model's
attention timed at calls 2 and 3 of a shape) is measured by the warm-up run and reused by the timed one,
as by any later run of a ComfyUI process (nodes/stats.py; "baseline_reused" in the recorded stats). The node is the
pack's V3 node class executed as ComfyUI's executor does (PREPARE_CLASS_CLONE + execute); ComfyUI's
HTTP server is not started: a stand-in `server` module records the node's stats events. Loading the
pack through ComfyUI's own custom-node loader is the real-host test tier's job
(tests/test_real_comfyui.py). Where PyAV is not installed (the GPU machine), ComfyUI's module-level
`import av` gets named placeholders that raise on any use (commands/comfyui_av_placeholder.py;
"pyav_placeholder" in the result). With VC_COMFYUI_PROFILE=FILE set, one more run follows the timed
one under torch.profiler and FILE gets its per-kernel summary (comfyui_kernel_profile.py).
SIZE `tiny` (2 blocks, 2 heads of 64, 4 x 8 x 8 latent, on the CPU) and `tiny-gpu` (the same on the
GPU) are the real-host test tier's checks of the harness and of the node on the GPU. Writes OUT_DIR/MODE.json (seconds, event counts) and OUT_DIR/MODE.pt (the final latent).
"""
import json
import os
import sys
import time
from pathlib import Path

WAN21_1_3B = {
    "image_model": "wan2.1", "model_type": "t2v", "patch_size": (1, 2, 2), "in_dim": 16, "out_dim": 16,
    "dim": 1536, "ffn_dim": 8960, "freq_dim": 256, "text_dim": 4096, "text_len": 512, "num_heads": 12,
    "num_layers": 30, "eps": 1e-6,
}
TINY = dict(WAN21_1_3B, dim=128, ffn_dim=256, text_dim=64, text_len=16, num_heads=2, num_layers=2, freq_dim=64)
SIZES = {  # name: (model config, latent shape, device)
    "wan1.3b": (WAN21_1_3B, (1, 16, 21, 60, 104), "cuda"),
    "tiny": (TINY, (1, 16, 4, 16, 16), "cpu"),
    "tiny-gpu": (TINY, (1, 16, 4, 16, 16), "cuda"),
}
CFG, WARMUP_STEPS = 5.0, 2
PRESETS = ("fidelity", "balanced", "speed")


def _randomize(diffusion_model, torch, device: str) -> None:
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for name, p in diffusion_model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 1.0 / p[0].numel() ** 0.5, generator=gen)
            elif "norm" in name and name.endswith("weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=gen)


def main(comfy_path: str, mode: str, out_dir: str, steps: int, size: str = "wan1.3b") -> None:
    widths, latent_shape, device = SIZES[size]
    sys.argv = ["main.py"] + (["--use-sage-attention"] if mode == "sage" else []) + (["--cpu"] if device == "cpu" else [])
    sys.path.insert(0, comfy_path)
    import types

    # imported beside this script, not through the pack: the pack's __init__ already imports comfy_api
    from comfyui_av_placeholder import install_if_missing

    av_placeholder = install_if_missing()  # video I/O only; recorded in the result

    import comfy.options

    comfy.options.enable_args_parsing()
    import comfy.model_patcher
    import comfy.sample
    import comfy.supported_models
    import torch

    class EventRecorder:  # stands in for the running server's PromptServer.instance
        messages = []

        def send_sync(self, event, data, sid=None):
            self.messages.append((event, data))

    server = types.ModuleType("server")
    server.PromptServer = type("PromptServer", (), {"instance": EventRecorder()})
    sys.modules["server"] = server
    config = comfy.supported_models.WAN21_T2V(dict(widths))
    config.set_inference_dtype(torch.bfloat16, None)
    model = config.get_model({}, device=device)
    _randomize(model.diffusion_model, torch, device)
    patcher = comfy.model_patcher.ModelPatcher(model, load_device=torch.device(device),
                                               offload_device=torch.device(device))

    def patched(unique_id):
        if mode not in PRESETS:
            return patcher
        from vc_attention.nodes.node_attention import VCAttention
        from vc_attention.nodes.presets import WIDGETS

        widgets = {name: spec["default"] for name, spec in WIDGETS.items() if name != "mode"}
        return VCAttention.PREPARE_CLASS_CLONE({"hidden_inputs": {"UNIQUE_ID": unique_id}}).execute(
            model=patcher, mode=mode, **widgets).args[0]

    gen = torch.Generator().manual_seed(1)
    noise = torch.randn(latent_shape, generator=gen)
    latent = torch.zeros(latent_shape)
    text = (1, widths["text_len"], widths["text_dim"])
    positive = [[torch.randn(text, generator=gen), {}]]
    negative = [[torch.randn(text, generator=gen), {}]]

    def sample(m, n_steps):
        return comfy.sample.sample(m, noise, n_steps, CFG, "euler", "simple", positive, negative, latent, seed=1,
                                   disable_pbar=True)

    sample(patched("warmup"), WARMUP_STEPS)
    EventRecorder.messages.clear()
    timed = patched("timed")
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    out = sample(timed, steps)
    sync()
    seconds = time.perf_counter() - start
    stats = [data for event, data in EventRecorder.messages if event == "vc_attention.stats"]
    profile_out = os.environ.get("VC_COMFYUI_PROFILE")
    if profile_out:  # one more run under torch.profiler: where the GPU time goes (bench/comfyui_profile.py)
        from comfyui_kernel_profile import profile_run

        profile_run(lambda: sample(patched("profiled"), steps), profile_out, torch)
    torch.save(out.float().cpu(), str(Path(out_dir, f"{mode}.pt")))
    Path(out_dir, f"{mode}.json").write_text(json.dumps({
        "mode": mode, "seconds": seconds, "steps": steps, "layers": widths["num_layers"],
        "tokens": latent_shape[2] * (latent_shape[3] // 2) * (latent_shape[4] // 2),
        "finite": bool(torch.isfinite(out).all()), "stats": stats[-1] if stats else None,
        # the preset's widget values as they ran (a later preset change must not relabel this row)
        "preset": _preset_values(mode),
        "pyav_placeholder": av_placeholder,
    }, default=str))


def _preset_values(mode: str):
    """The node's widget values for a preset mode (None for ComfyUI's own attention modes)."""
    if mode not in PRESETS:
        return None
    from vc_attention.nodes.presets import PRESETS as VALUES

    return dict(VALUES[mode])


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), *sys.argv[5:6])
