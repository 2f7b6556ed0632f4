"""A tiny random-weight DiT for the CPU tests (test code, not ComfyUI's).

Each block runs self-attention and cross-attention through comfy's `optimized_attention`, the way
ComfyUI's video models call it: layout "flat" = Wan ((B, N, H*D), heads by keyword), layout
"heads" = HunyuanVideo (skip_reshape, (B, H, N, D), heads positional). With report_block_index
the forward sets transformer_options["block_index"] / ["block_type"] like Wan; without, it does
not (like LTX-Video). `text_tokens` > 0 prepends text tokens to the self-attention (joint
attention, as HunyuanVideo's double blocks).
"""
import torch

from comfy.ldm.modules.attention import optimized_attention
from comfy.model_base import BaseModel
from comfy.model_patcher import ModelPatcher
from comfy.model_sampling import ModelSamplingDiscreteFlow

TOKENS, TEXT, DIM = 100, 16, 128  # 100 tokens: not a multiple of the kernels' 64/128-row blocks


class ToyBlock(torch.nn.Module):
    def __init__(self, dim, heads, layout, text_tokens):
        super().__init__()
        self.heads, self.layout, self.text_tokens = heads, layout, text_tokens
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.q2, self.kv2 = torch.nn.Linear(dim, dim), torch.nn.Linear(dim, 2 * dim)
        self.out = torch.nn.Linear(dim, dim)

    def forward(self, x, context, transformer_options):
        tokens = torch.cat([context[:, : self.text_tokens], x], dim=1) if self.text_tokens else x
        q, k, v = self.qkv(tokens).chunk(3, dim=-1)
        if self.layout == "heads":
            b, n, _ = q.shape
            q, k, v = (t.view(b, n, self.heads, -1).transpose(1, 2) for t in (q, k, v))
            attn = optimized_attention(q, k, v, self.heads, skip_reshape=True, transformer_options=transformer_options)
            attn = attn[:, self.text_tokens :]
        else:
            attn = optimized_attention(q, k, v, heads=self.heads, transformer_options=transformer_options)
            attn = attn[:, self.text_tokens :]
        x = x + self.out(attn)
        k2, v2 = self.kv2(context).chunk(2, dim=-1)
        return x + optimized_attention(self.q2(x), k2, v2, heads=self.heads, transformer_options=transformer_options)


class ToyDiT(torch.nn.Module):
    def __init__(self, dim=DIM, heads=2, blocks=2, layout="flat", report_block_index=True, text_tokens=0):
        super().__init__()
        self.report_block_index = report_block_index
        self.blocks = torch.nn.ModuleList(ToyBlock(dim, heads, layout, text_tokens) for _ in range(blocks))

    def forward(self, x, t, context=None, transformer_options={}):
        for i, block in enumerate(self.blocks):
            if self.report_block_index:
                transformer_options["block_type"] = "double"
                transformer_options["block_index"] = i
            x = block(x, context, transformer_options)
        return x


def toy_model(dtype=torch.bfloat16, shift=5.0, seed=0, **kwargs) -> ModelPatcher:
    torch.manual_seed(seed)
    dit = ToyDiT(**kwargs).to(dtype)
    return ModelPatcher(BaseModel(dit, ModelSamplingDiscreteFlow(shift=shift)))


def toy_inputs(seed=1, tokens=TOKENS, dtype=torch.bfloat16):
    """Noise and the cond/uncond text contexts ({COND: ..., UNCOND: ...}) of one toy run."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, tokens, DIM, generator=g).to(dtype)
    context = {i: torch.randn(1, TEXT, DIM, generator=g).to(dtype) for i in (0, 1)}
    return x, context
