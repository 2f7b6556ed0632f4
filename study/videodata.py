"""Video-like Q/K/V for fidelity work, and the loader for Q/K/V captured from a real model.

`video_like_qkv` builds one self-attention call of a video DiT on a (T, H, W) latent grid, with the
structures that decide how low-bit attention errs (docs/videodata.md gives the calibration):
- Q and K: a content part plus a part shared by Q and K, both rotated by a 3-D rotary embedding that
  splits the head dim over t/h/w like Wan's RoPE. The shared part makes scores fall off with distance
  on the grid (local attention); the content part adds attention between tokens of one region.
- K: a few fixed channels carry a large offset common to all tokens (what K smoothing removes).
- V: a segmentation of the grid into blob-shaped regions (smoothed random fields, argmax), one
  centre per region and head; tokens scatter around their centre with a smooth spatial field plus
  independent noise, and a few tokens carry large values in a few random channels (token-specific
  outliers). Blobs are a few tokens wide, so a block of 128 tokens in raster order mixes many of
  them, while k-means over V finds them: that gap is what V-Smooth exploits.
Text tokens (joint attention) come first, without rotary position, from their own centres.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..nodes.capture_format import CAPTURE_FORMAT, CAPTURE_VERSION

ROPE_THETA = 10000.0


@dataclass(frozen=True)
class VideoDataKnobs:
    """The calibrated constants. Energies are fractions of the per-token V energy (before outliers).

    docs/videodata.md says which statistic each knob sets.
    """

    regions: int = 8  # value centres (blob types) per head
    region_width: float = 0.45  # blob radius in tokens (Gaussian sigma of the fields, h and w)
    region_frames: float = 6.0  # same, along t (content changes slowly between frames)
    centre_energy: float = 0.37  # share of V energy in the region centres
    field_energy: float = 0.48  # share in a smooth per-channel field (local coherence)
    field_width: float = 2.0  # sigma of that field in tokens (h, w; t uses region_frames)
    field_rank: int = 32  # smooth fields mixed into every head's V channels (a low-rank field)
    outlier_rate: float = 0.01  # fraction of tokens with outliers
    outlier_channels: int = 2  # channels hit per outlier token
    outlier_gain: float = 12.0  # outlier size in units of V's per-channel rms (1 before outliers)
    pos_strength: float = 16.0  # log2-score advantage of a token on itself over a far one (locality)
    pos_focus: float = 1.0  # rotary pair energy ~ theta^pos_focus: higher = shorter attention range
    content_strength: float = 9.0  # log2-score bonus for a key in the query's region
    qk_noise: float = 0.5  # token noise on Q/K content, relative to its signal
    k_offset: float = 6.0  # size of the fixed-channel K offsets, relative to K's rms
    k_offset_channels: int = 4


DEFAULT_KNOBS = VideoDataKnobs()

# embedded_sample(): 2 frames of a 30 x 52 latent (480p Wan after 2x2 patching) = 3120 tokens.
EMBEDDED_SIZE = dict(B=1, H=2, T=2, Hgrid=30, Wgrid=52, D=128, text_tokens=0, seed=0)


def rope_split(head_dim: int) -> tuple[int, int, int]:
    """Channels given to (t, h, w) by Wan's 3-D RoPE: h and w get 2*(D//6), t the rest."""
    hw = 2 * (head_dim // 6)
    t = head_dim - 2 * hw
    if head_dim % 2 or t % 2 or t <= 0:
        raise ValueError(f"head dim {head_dim} cannot be split into t/h/w rotary pairs.")
    return t, hw, hw


def grid_positions(frames: int, height: int, width: int, device=None) -> torch.Tensor:
    """(T*H*W, 3) integer (t, y, x) of each video token in raster order (t slowest, x fastest)."""
    t, y, x = torch.meshgrid(
        torch.arange(frames, device=device),
        torch.arange(height, device=device),
        torch.arange(width, device=device),
        indexing="ij",
    )
    return torch.stack([t, y, x], dim=-1).reshape(-1, 3)


def rope_frequencies(head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per channel pair i of each axis block of size d: theta^(-2i/d). Returns (freqs, axis) (D/2,)."""
    freqs, axes = [], []
    for axis, dim in enumerate(rope_split(head_dim)):
        freqs.append(ROPE_THETA ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim))
        axes.append(torch.full((dim // 2,), axis))
    return torch.cat(freqs), torch.cat(axes)


def rope_angles(positions: torch.Tensor, head_dim: int) -> torch.Tensor:
    """(N, D/2) rotation angle of each channel pair: position along the pair's axis * its frequency."""
    freqs, axes = rope_frequencies(head_dim)
    return positions[:, axes].double() * freqs


def apply_rope(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Rotate consecutive channel pairs (x[2i], x[2i+1]) by angles[:, i] (Wan's complex-pair layout)."""
    pairs = x.reshape(*x.shape[:-1], -1, 2)
    cos, sin = torch.cos(angles).to(x.dtype), torch.sin(angles).to(x.dtype)
    re = pairs[..., 0] * cos - pairs[..., 1] * sin
    im = pairs[..., 0] * sin + pairs[..., 1] * cos
    return torch.stack([re, im], dim=-1).reshape(x.shape)


def smooth_fields(count: int, grid: tuple[int, int, int], sigma: tuple[float, float, float], gen) -> torch.Tensor:
    """`count` Gaussian random fields on the grid, unit variance, correlation lengths `sigma` (tokens).

    White noise filtered by a Gaussian in Fourier space, float32. The FFT is periodic, so each axis
    longer than one token is padded by 2 sigma first (opposite edges then barely correlate).
    """
    padded = [n + (math.ceil(2 * s) if n > 1 else 0) for n, s in zip(grid, sigma)]
    noise = torch.randn(count, *padded, generator=gen)
    spectrum = torch.fft.rfftn(noise, dim=(1, 2, 3))
    for axis, (n, s) in enumerate(zip(padded, sigma)):
        f = torch.fft.rfftfreq(n) if axis == 2 else torch.fft.fftfreq(n)
        shape = [1, 1, 1]
        shape[axis] = f.numel()
        spectrum = spectrum * torch.exp(-2.0 * (math.pi * f * s) ** 2).view(1, *shape)
    fields = torch.fft.irfftn(spectrum, s=padded, dim=(1, 2, 3))[:, : grid[0], : grid[1], : grid[2]].double()
    fields = fields - fields.mean(dim=(1, 2, 3), keepdim=True)
    return fields / fields.flatten(1).std(dim=1).clamp(min=1e-12).view(-1, 1, 1, 1)


def _unit_rows(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True).clamp(min=1e-12)


def _values(
    labels: torch.Tensor, fields: torch.Tensor, n_text: int, heads: int, dim: int, knobs: VideoDataKnobs, gen
) -> torch.Tensor:
    """(H, N, D) values: region centre + smooth field + noise, then token-specific outliers."""
    n = labels.numel() + n_text
    noise_energy = 1.0 - knobs.centre_energy - knobs.field_energy
    if noise_energy < 0:
        raise ValueError("centre_energy + field_energy must not exceed 1.")
    centres = torch.randn(heads, knobs.regions, dim, generator=gen, dtype=torch.float64)
    text_centres = torch.randn(heads, 4, dim, generator=gen, dtype=torch.float64)
    # each head's channels mix the same few smooth fields: (F, T, Hg, Wg) -> (H, N_video, D), unit rms
    mixing = torch.randn(heads, fields.shape[0], dim, generator=gen, dtype=torch.float64) / math.sqrt(fields.shape[0])
    field = fields.reshape(fields.shape[0], -1).T @ mixing
    v = torch.empty(heads, n, dim, dtype=torch.float64)
    v[:, n_text:] = (
        math.sqrt(knobs.centre_energy) * centres[:, labels]
        + math.sqrt(knobs.field_energy) * field
        + math.sqrt(noise_energy) * torch.randn(heads, labels.numel(), dim, generator=gen, dtype=torch.float64)
    )
    if n_text:
        text_labels = torch.randint(0, 4, (n_text,), generator=gen)
        v[:, :n_text] = math.sqrt(1 - noise_energy) * text_centres[:, text_labels] + math.sqrt(
            noise_energy
        ) * torch.randn(heads, n_text, dim, generator=gen, dtype=torch.float64)
    hit = torch.rand(heads, n, generator=gen) < knobs.outlier_rate
    for _ in range(knobs.outlier_channels):
        channel = torch.randint(0, dim, (heads, n), generator=gen)
        sign = torch.randint(0, 2, (heads, n), generator=gen).double() * 2 - 1
        v.scatter_add_(2, channel.unsqueeze(-1), (sign * knobs.outlier_gain * hit).unsqueeze(-1))
    return v


def _queries_keys(
    labels: torch.Tensor, angles: torch.Tensor, n_text: int, heads: int, dim: int, knobs: VideoDataKnobs, gen
) -> tuple[torch.Tensor, torch.Tensor]:
    """(H, N, D) q and k, scaled so that q.k / sqrt(D) comes out in the intended log2 units.

    q = R(p)(a + c_z + e), k = R(p)(a + c_z + e') + offset, with a shared by all tokens of a head (a
    score that peaks at zero distance, since R(p_i)^T R(p_j) = R(p_j - p_i)), c_z a region code
    shared by Q and K (tokens of one region attend to each other) and e, e' token noise.
    """
    n = labels.numel() + n_text
    # a^T R(d) a = sum_i w_i cos(theta_i d) with w_i = |a_i|^2 the energy of pair i: w ~ theta^focus
    # favours fast-turning pairs, so the score falls within a few tokens. Natural-log score units: a
    # log2 advantage L at d = 0 needs sum w / sqrt(D) = L ln 2.
    freqs, _ = rope_frequencies(dim)
    weights = freqs**knobs.pos_focus
    weights = weights / weights.sum() * knobs.pos_strength * math.log(2) * math.sqrt(dim)
    phase = _unit_rows(torch.randn(heads, 1, dim // 2, 2, generator=gen, dtype=torch.float64))
    shared = (phase * weights.sqrt().view(1, 1, -1, 1)).reshape(heads, 1, dim)
    codes = _unit_rows(torch.randn(heads, knobs.regions + 1, dim, generator=gen, dtype=torch.float64))
    codes = codes * math.sqrt(knobs.content_strength * math.log(2) * math.sqrt(dim))
    all_labels = torch.cat([torch.full((n_text,), knobs.regions), labels])
    content = codes[:, all_labels]

    def token(x):
        noise = torch.randn(heads, n, dim, generator=gen, dtype=torch.float64)
        scale = knobs.qk_noise * x.norm(dim=-1, keepdim=True) / math.sqrt(dim)
        return x + noise * scale

    full_angles = torch.cat([torch.zeros(n_text, angles.shape[1], dtype=angles.dtype), angles])
    q = apply_rope(token(shared + content), full_angles)
    k = apply_rope(token(shared + content), full_angles)
    offset = torch.zeros(heads, 1, dim, dtype=torch.float64)
    rms = k.pow(2).mean().sqrt()
    for h in range(heads):
        channels = torch.randperm(dim, generator=gen)[: knobs.k_offset_channels]
        spread = torch.rand(len(channels), generator=gen, dtype=torch.float64) + 0.5  # 0.5x .. 1.5x
        offset[h, 0, channels] = knobs.k_offset * rms * spread
    return q, k + offset


def video_like_qkv(
    B: int = 1,
    H: int = 2,
    T: int = 2,
    Hgrid: int = 30,
    Wgrid: int = 52,
    D: int = 128,
    text_tokens: int = 0,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    **knobs,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Video-like (q, k, v), each (B, H, N, D) in `dtype` on `device`, N = text_tokens + T*Hgrid*Wgrid.

    Deterministic for a given seed (generated in float64 on the CPU, then cast). `knobs` override
    fields of VideoDataKnobs (unknown names raise ValueError). Each batch element gets its own
    scene (segmentation); each head its own centres, offsets and rotary content.
    """
    unknown = set(knobs) - set(VideoDataKnobs.__dataclass_fields__)
    if unknown:
        raise ValueError(f"unknown video-data knobs {sorted(unknown)}; see VideoDataKnobs.")
    if min(B, H, T, Hgrid, Wgrid) < 1 or text_tokens < 0:
        raise ValueError("B, H, T, Hgrid and Wgrid must be >= 1 and text_tokens >= 0.")
    cfg = VideoDataKnobs(**{**DEFAULT_KNOBS.__dict__, **knobs})
    gen = torch.Generator().manual_seed(seed)
    grid = (T, Hgrid, Wgrid)
    angles = rope_angles(grid_positions(*grid), D)
    region_sigma = (cfg.region_frames, cfg.region_width, cfg.region_width)
    field_sigma = (cfg.region_frames, cfg.field_width, cfg.field_width)
    qs, ks, vs = [], [], []
    for _ in range(B):
        labels = smooth_fields(cfg.regions, grid, region_sigma, gen).reshape(cfg.regions, -1).argmax(dim=0)
        fields = smooth_fields(cfg.field_rank, grid, field_sigma, gen)
        q, k = _queries_keys(labels, angles, text_tokens, H, D, cfg, gen)
        qs.append(q)
        ks.append(k)
        vs.append(_values(labels, fields, text_tokens, H, D, cfg, gen))
    return tuple(torch.stack(t).to(device=device, dtype=dtype) for t in (qs, ks, vs))


def embedded_sample(dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
    """The built-in sample for `vc-attention fidelity` / `demo`: EMBEDDED_SIZE, default knobs."""
    return video_like_qkv(**EMBEDDED_SIZE, dtype=dtype, device=device)


# ----------------------------------------------------------------------------------------------
# captured data
def capture_entries(path: str) -> list[str]:
    """Entry names in a capture file (each has <entry>.q/.k/.v); ValueError if it is not one."""
    from safetensors import SafetensorError, safe_open

    try:
        handle = safe_open(path, framework="pt")
    except (OSError, SafetensorError) as err:
        raise ValueError(f"{path} is not a readable safetensors file ({err}).") from err
    with handle as f:
        meta = f.metadata() or {}
        keys = list(f.keys())
    if meta.get("format") != CAPTURE_FORMAT:
        raise ValueError(
            f"{path} is not a VC-Attention capture (metadata format={meta.get('format')!r}, "
            f"expected {CAPTURE_FORMAT!r}); write it with the capture node."
        )
    if meta.get("version") != CAPTURE_VERSION:
        raise ValueError(f"{path} has capture version {meta.get('version')!r}; this loader reads {CAPTURE_VERSION!r}.")
    entries = sorted({key.rsplit(".", 1)[0] for key in keys if key.rsplit(".", 1)[-1] in ("q", "k", "v")})
    complete = [e for e in entries if all(f"{e}.{part}" in keys for part in "qkv")]
    if not complete:
        raise ValueError(f"{path} holds no complete <entry>.q/.k/.v triple.")
    return complete


def load_captured_qkv(path: str, entry: str | None = None, device: str | torch.device = "cpu"):
    """(q, k, v) of one captured attention call, each (B, H, N, D) as stored (fp16/bf16).

    entry=None takes the first entry in sorted order. Raises ValueError for a file that is not a
    capture, a missing entry, or tensors that are not one 4-D shape.
    """
    from safetensors import safe_open

    entries = capture_entries(path)
    name = entries[0] if entry is None else entry
    if name not in entries:
        shown = ", ".join(entries[:10]) + (" ..." if len(entries) > 10 else "")
        raise ValueError(f"entry {name!r} is not in {path}; it holds: {shown}.")
    with safe_open(path, framework="pt", device=str(device)) as f:
        q, k, v = (f.get_tensor(f"{name}.{part}") for part in "qkv")
    if q.dim() != 4 or q.shape != k.shape or k.shape != v.shape:
        raise ValueError(
            f"entry {name!r} in {path} must hold q, k, v of one (B,H,N,D) shape, got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}."
        )
    return q, k, v
