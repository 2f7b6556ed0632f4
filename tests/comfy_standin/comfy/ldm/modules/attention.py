"""Stand-in of comfy/ldm/modules/attention.py: the override dispatch of wrap_attn and SDPA attention."""
import functools

import torch


class AttentionTensorContainer:
    """Single-owner tensor input (ComfyUI >= 0.31): a backend takes the tensor out once."""

    __slots__ = ("tensor",)

    def __init__(self, tensor):
        self.tensor = tensor

    def take(self):
        if self.tensor is None:
            raise RuntimeError("attention tensor container has already been consumed")
        tensor, self.tensor = self.tensor, None
        return tensor


def wrap_attn(func):
    """As ComfyUI: the first (outermost) call with transformer_options carrying
    "optimized_attention_override" goes to override(func, *args, **kwargs); containers are unpacked
    unless the override has a `container_function`; `_inside_attn_wrapper` stops re-dispatch."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        containers = args[:3] if len(args) >= 3 and isinstance(args[0], AttentionTensorContainer) else None
        remove_key = False
        try:
            if "_inside_attn_wrapper" not in kwargs:
                transformer_options = kwargs.get("transformer_options", None)
                remove_key = True
                kwargs["_inside_attn_wrapper"] = True
                if transformer_options is not None and "optimized_attention_override" in transformer_options:
                    override = transformer_options["optimized_attention_override"]
                    if containers is not None:
                        if hasattr(override, "container_function"):
                            return override.container_function(*args, **kwargs)
                        args = tuple(c.take() for c in containers) + args[3:]
                    return override(func, *args, **kwargs)
            if containers is not None:
                args = tuple(c.take() for c in containers) + args[3:]
            return func(*args, **kwargs)
        finally:
            if remove_key:
                del kwargs["_inside_attn_wrapper"]

    return wrapper


@wrap_attn
def attention_pytorch(q, k, v, heads, mask=None, attn_precision=None, skip_reshape=False, skip_output_reshape=False, **kwargs):
    if skip_reshape:
        b, _, _, dim_head = q.shape
    else:
        b, _, dim_head = q.shape
        dim_head //= heads
        q, k, v = (t.view(b, -1, t.shape[-1] // dim_head, dim_head).transpose(1, 2) for t in (q, k, v))
    if mask is not None:
        if mask.ndim == 2:
            mask = mask.unsqueeze(0)
        if mask.ndim == 3:
            mask = mask.unsqueeze(1)
    sdpa_extra = {key: kwargs[key] for key in ("scale", "enable_gqa") if key in kwargs}
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, is_causal=False, **sdpa_extra)
    if not skip_output_reshape:
        out = out.transpose(1, 2).reshape(b, -1, heads * dim_head)
    return out


optimized_attention = attention_pytorch
