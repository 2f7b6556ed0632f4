"""Run by tests/test_browser.py in a Python that has ComfyUI's requirements (not collected by pytest).

usage: comfyui_tiny_models.py COMFYUI_PATH MODELS_DIR

Writes two random-weight models that ComfyUI's own loaders accept, so a real prompt can run on the
CPU without downloading anything:
- diffusion_models/tiny_wan2.1_t2v.safetensors: ComfyUI's WanModel (Wan2.1 T2V layout) with dim 128
  (one 128-wide head), 2 blocks, and text_dim 768 (stored in the file's "config" metadata, which
  ComfyUI's model detection reads) so that it takes CLIP-L text features;
- text_encoders/tiny_clip_l.safetensors: a CLIP-L text encoder (ComfyUI's SD1 CLIP model).
Weights are seeded N(0, 0.02) (norm scales 1): the output is noise, the attention calls are real.
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file


def random_like_model(model: torch.nn.Module) -> dict:
    gen = torch.Generator().manual_seed(0)
    out = {}
    for name, tensor in model.state_dict().items():
        if tensor.dtype.is_floating_point:
            is_norm_scale = tensor.dim() == 1 and name.endswith("weight")
            value = torch.ones(tensor.shape) if is_norm_scale else 0.02 * torch.randn(tensor.shape, generator=gen)
            out[name] = value.to(torch.float16).contiguous()
        else:
            out[name] = tensor.contiguous()
    return out


def main(comfy_path: str, models_dir: str) -> None:
    sys.path.insert(0, comfy_path)
    sys.argv = ["main.py", "--cpu"]
    import comfy.options

    comfy.options.enable_args_parsing()
    import comfy.ldm.wan.model
    import comfy.ops
    import comfy.sd1_clip

    wan = comfy.ldm.wan.model.WanModel(model_type="t2v", dim=128, ffn_dim=256, num_heads=1, num_layers=2,
                                       text_dim=768, in_dim=16, out_dim=16, operations=comfy.ops.disable_weight_init,
                                       device="meta")
    # meta tensors have shapes only: random_like_model builds real ones
    os.makedirs(os.path.join(models_dir, "diffusion_models"), exist_ok=True)
    save_file(random_like_model(wan), os.path.join(models_dir, "diffusion_models", "tiny_wan2.1_t2v.safetensors"),
              metadata={"config": json.dumps({"transformer": {"text_dim": 768}})})

    clip = comfy.sd1_clip.SDClipModel(device="meta")
    os.makedirs(os.path.join(models_dir, "text_encoders"), exist_ok=True)
    save_file(random_like_model(clip.transformer), os.path.join(models_dir, "text_encoders", "tiny_clip_l.safetensors"))


if __name__ == "__main__":
    main(*sys.argv[1:3])
