"""Stand-in of comfy/model_base.py: BaseModel.apply_model copies transformer_options per forward."""
import torch


class BaseModel(torch.nn.Module):
    def __init__(self, diffusion_model, model_sampling):
        super().__init__()
        self.diffusion_model = diffusion_model
        self.model_sampling = model_sampling

    def apply_model(self, x, t, context=None, transformer_options={}):
        transformer_options = transformer_options.copy()  # as _apply_model: a fresh dict per forward
        return self.diffusion_model(x, t, context=context, transformer_options=transformer_options)
