"""End-to-end benchmark: one forward pass of the Wan 14B transformer (random weights) per mode.

Uses diffusers' WanTransformer3DModel at the Wan2.1/2.2-T2V-14B configuration (40 layers, 40 heads,
head dim 128, FFN 13824) and 720p / 81 frames (latent 21 x 90 x 160 -> 75,600 tokens). The model is
built on the GPU with random weights; nothing is downloaded. Self-attention calls (q, k, v of one
shape, no mask) go to VC-Attention through a scoped replacement of
torch.nn.functional.scaled_dot_product_attention (diffusers calls it by attribute); cross-attention
keeps SDPA. Our rows are the node's three presets (nodes/presets.py: fidelity, balanced, speed), each with its
kernel configuration and its grouping (clusters x iterations, within-cluster bins), as a user who picks it runs them.
The grouping is computed on the first VC forward (a grouping step) and reused by the
timed forwards (steps after the grouping window), so the timed number excludes grouping, exactly as
in a sampling run after the window (a reuse step's permutation included: the label sort, and the bins
where the mode's preset takes within-cluster bins); the grouping forward is reported separately.
"""
from __future__ import annotations

import contextlib
import statistics
import time

import torch

from ..kernels import grouping
from ..kernels.api import vc_attention
from ..kernels.config import VCConfig
from .bench_attention import grouping_label
from .errors import require_cuda

WAN_14B = dict(
    patch_size=(1, 2, 2), num_attention_heads=40, attention_head_dim=128, in_channels=16, out_channels=16,
    text_dim=4096, freq_dim=256, ffn_dim=13824, num_layers=40, cross_attn_norm=True,
    qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024,
)


class LayerGroupings:
    """Per-call-index grouping cache for one forward pass (call order = layer order), used as the node uses
    its cache: a grouping step groups, a reuse step asks the cached grouping for its permutation (the label
    sort, and with within-cluster bins the bins from this call's V)."""

    def __init__(self, clusters: int, iters: int, within_bins: int = 0):
        self.clusters, self.iters, self.within_bins = clusters, iters, within_bins
        self.groupings: dict[int, grouping.CompactGrouping] = {}
        self.recompute = True
        self.calls = 0

    def perm_for(self, v_bhnd: torch.Tensor) -> torch.Tensor:
        idx = self.calls
        self.calls += 1
        if self.recompute or idx not in self.groupings:
            self.groupings[idx] = grouping.group_tokens(v_bhnd, self.clusters, self.iters, within_bins=self.within_bins)
        return self.groupings[idx].perm(v_bhnd)


@contextlib.contextmanager
def self_attention_sdpa(attention):
    """Route self-attention SDPA calls (B,H,N,D) to attention(q, k, v, scale) while the context is open."""
    original = torch.nn.functional.scaled_dot_product_attention

    # diffusers passes query/key/value by keyword: keep torch's parameter names
    def patched(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if attn_mask is None and not is_causal and dropout_p == 0.0 and query.shape == key.shape == value.shape:
            return attention(query, key, value, scale)
        return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                        scale=scale, enable_gqa=enable_gqa)

    torch.nn.functional.scaled_dot_product_attention = patched
    try:
        yield
    finally:
        torch.nn.functional.scaled_dot_product_attention = original


def vc_sdpa(config: VCConfig, groupings: LayerGroupings | None):
    """Self-attention SDPA calls go to vc_attention (grouping per layer from `groupings`)."""
    def attention(q, k, v, scale):
        perm = groupings.perm_for(v) if (groupings is not None and config.needs_grouping) else None
        return vc_attention(q, k, v, layout="bhnd", config=config, perm=perm, sm_scale=scale, perm_from_grouping=True)
    return self_attention_sdpa(attention)


def sageattention_sdpa(sage):
    """Self-attention SDPA calls go to SageAttention 2.2's `sageattn` (what --use-sage-attention runs)."""
    return self_attention_sdpa(lambda q, k, v, scale: sage.sageattn(q, k, v, tensor_layout="HND", sm_scale=scale))


def build_model(layers: int, device: str = "cuda", dtype=torch.bfloat16):
    from diffusers import WanTransformer3DModel  # optional dependency, imported only here

    cfg = dict(WAN_14B, num_layers=layers)
    with torch.device(device):  # built in place: buffers such as the RoPE tables get real values
        model = WanTransformer3DModel(**cfg)
    model = model.to(dtype)
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:  # linear / conv weights: fan-in scaled so activations stay O(1)
                p.normal_(0.0, 1.0 / (p[0].numel() ** 0.5), generator=gen)
            elif "norm" in name and "weight" in name:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=gen)
    return model.eval()


def _inputs(frames: int, height: int, width: int, device: str, dtype):
    t = (frames - 1) // 4 + 1
    g = torch.Generator(device=device).manual_seed(1)
    latents = torch.randn(1, 16, t, height // 8, width // 8, generator=g, device=device, dtype=dtype)
    text = torch.randn(1, 512, 4096, generator=g, device=device, dtype=dtype)
    return latents, torch.tensor([500], device=device), text


def _timed_forward(model, inputs) -> tuple[float, torch.Tensor]:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.no_grad():
        start.record()
        out = model(hidden_states=inputs[0], timestep=inputs[1], encoder_hidden_states=inputs[2], return_dict=False)[0]
        end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end), out


# the node's presets, in the order the table lists them (the most faithful first, as the ComfyUI section)
PRESET_MODES = ("fidelity", "balanced", "speed")


def mode_config(mode: str) -> VCConfig:
    """The kernel configuration the node runs for preset `mode` (nodes/presets.config_from_widgets)."""
    from ..nodes.presets import PRESETS, config_from_widgets

    return config_from_widgets(PRESETS[mode])


def mode_grouping(mode: str, clusters: int | None = None, iters: int | None = None) -> tuple[int, int, int]:
    """(clusters, iterations, within-cluster bins) preset `mode`'s forwards group with (nodes/presets.py), or
    `clusters` x `iters` without bins when given (then every mode groups alike)."""
    from ..nodes.presets import PRESETS, within_bins

    if clusters is None:
        return int(PRESETS[mode]["clusters"]), int(PRESETS[mode]["kmeans_iters"]), within_bins(mode)
    return clusters, grouping.DEFAULT_ITERS if iters is None else iters, grouping.DEFAULT_WITHIN_BINS


def run_e2e(layers: int = 40, frames: int = 81, height: int = 720, width: int = 1280, repeats: int = 2,
            clusters: int | None = None, iters: int | None = None, log=print) -> dict:
    """Time SDPA, SageAttention 2.2 (when importable) and the node's presets (PRESET_MODES) forwards; returns a dict of
    results (ms, speed-ups, error).

    Each preset runs its kernel configuration (mode_config) and groups as the node does (mode_grouping: its clusters x
    iterations and within-cluster bins); `clusters` and `iters` given override every mode's grouping (without bins)."""
    require_cuda("vc-attention bench --e2e")
    t0 = time.time()
    model = build_model(layers)
    inputs = _inputs(frames, height, width, "cuda", torch.bfloat16)
    tokens = inputs[0].shape[2] * (inputs[0].shape[3] // 2) * (inputs[0].shape[4] // 2)
    log(f"[e2e] Wan-14B config, {layers} layers, {tokens} tokens, model built in {time.time() - t0:.1f}s")
    results = {"layers": layers, "tokens": tokens, "frames": frames, "height": height, "width": width}

    _timed_forward(model, inputs)  # warm-up (cuDNN plans, allocator)
    sdpa_runs = [_timed_forward(model, inputs) for _ in range(repeats)]
    ref_out = sdpa_runs[-1][1].float()
    results["sdpa_ms"] = statistics.median(ms for ms, _ in sdpa_runs)
    del sdpa_runs
    log(f"[e2e] SDPA forward {results['sdpa_ms']:.0f} ms")
    from .bench_peers import sageattention_module

    sage = sageattention_module()
    if sage is not None:
        with sageattention_sdpa(sage):
            _timed_forward(model, inputs)
            runs = [_timed_forward(model, inputs) for _ in range(repeats)]
        med = statistics.median(ms for ms, _ in runs)
        err = ((runs[-1][1].float() - ref_out).norm() / ref_out.norm()).item()
        results["sageattn-2.2"] = {"forward_ms": med, "speedup": results["sdpa_ms"] / med, "rel_l2_vs_sdpa": err}
        log(f"[e2e] sageattn-2.2: forward {med:.0f} ms ({results['sdpa_ms'] / med:.2f}x SDPA), rel-L2 vs SDPA {err:.4f}")
        del runs
    for name in PRESET_MODES:
        config = mode_config(name)
        c, i, bins = mode_grouping(name, clusters, iters)
        groups = LayerGroupings(c, i, bins)
        with vc_sdpa(config, groups):
            group_ms, _ = _timed_forward(model, inputs)  # grouping step: k-means for every layer
            groups.recompute = False
            times = []
            for _ in range(repeats):
                groups.calls = 0
                ms, out = _timed_forward(model, inputs)
                times.append(ms)
        err = ((out.float() - ref_out).norm() / ref_out.norm()).item()
        med = statistics.median(times)
        results[name] = {"forward_ms": med, "grouping_forward_ms": group_ms, "speedup": results["sdpa_ms"] / med,
                         "rel_l2_vs_sdpa": err, "grouping": grouping_label(c, i, bins)}
        log(f"[e2e] {name}: forward {med:.0f} ms ({results['sdpa_ms'] / med:.2f}x SDPA), grouping forward "
            f"{group_ms:.0f} ms, output rel-L2 vs SDPA {err:.4f}")
    return results


def e2e_rows(**kwargs) -> list[dict]:
    """run_e2e as rows of the results schema (commands/bench_results.py): one per method."""
    res = run_e2e(**kwargs)
    common = {k: res[k] for k in ("layers", "tokens", "frames", "height", "width")}
    rows = [dict(common, method="sdpa", forward_ms=res["sdpa_ms"], x_sdpa=1.0, rel_l2_vs_sdpa=0.0,
                 grouping_forward_ms=None)]
    for name in ("sageattn-2.2", *PRESET_MODES):
        if name in res:
            r = res[name]
            rows.append(dict(common, method=name if name.startswith("sage") else f"vc-{name}",
                             forward_ms=r["forward_ms"], x_sdpa=r["speedup"], rel_l2_vs_sdpa=r["rel_l2_vs_sdpa"],
                             grouping_forward_ms=r.get("grouping_forward_ms"), grouping=r.get("grouping")))
    return rows
