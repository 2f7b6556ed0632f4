"""Bit-exact emulation of every VC-Attention quantizer: the spec the CUDA kernels must match.

Pure PyTorch, vectorized, CPU or CUDA. Internally everything is (B, H, N, D); kernels/layout.py
converts the (B, N, H, D) layout as views (no copy).

Arithmetic conventions (every kernel reproduces them):
- All quantizer math is float32. "rint" is round-half-to-even (torch.round, CUDA __float2int_rn,
  cvt.rni); E4M3 casts are round-to-nearest-even with saturation to +-448 (cvt.rn.satfinite).
- Scores are kept in log2 units: s = q.k * sm_scale * log2(e), so probabilities are exp2(s - M).
- Row offsets are the EXACT running max: while the kernel walks key blocks of K_BLOCK in order, it
  holds M = max over seen blocks of the block row max (a float32 score, no rounding), and encodes P
  against it: exp2 from s and the per-row constant float32(8 - M) with one multiply-add (the row max
  lands exactly on 2^8 = 256); speed from the exact integer scores of the block in integer fixed point
  (expcast_bits: per row and block a slope and an offset, one integer multiply-add per element; row
  max 448). With an exact max the
  row's largest probability is always the top code, and in peaky rows that one element carries much
  of the mass (docs/fidelity-study.md: -13% rel-L2 against an integer offset). The rescale
  alpha = 2^(M_old - M_new) is then not a power of two: the kernels compute it in float32 (MUFU exp2
  in fidelity mode, an FMA polynomial in speed mode, both within 3e-7 relative) where quantize_p
  rescales exactly, so "kernel == emulation up to float32 rounding of alpha and summation order"; P
  itself is emulated against the running offsets, subnormal tail included.
- Q has one INT8 / FP8 scale per query row (what the softmax multiplies per row anyway), K one per
  K_BLOCK keys (256 with k_scale_rows; per 256 keys and MMA quad lane with k_lane_scales, kernels/k_lanes.py).
- Output = sum_j P_q[i,j] * Vhat[j] / sum_j P_q[i,j], with the SAME quantized P in both sums.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .config import VCConfig
from .constants import (  # noqa: F401 (re-exported: the spec's parameters, shared with the CUDA build)
    E4M3_MAX,
    EXPCAST_BETA,
    EXPCAST_LOG2_SCALE,
    EXPCAST_MAX_CODE,
    EXPCAST_P_LOG2_SCALE,
    EXPCAST_SLOPE_BITS,
    EXPCAST_SLOPE_CAP,
    EXPCAST_TOP,
    EXPCAST_TOP_CODE,
    INT8_MAX,
    K_BLOCK,
    LOG2E,
    MIXED_CHORD_EIGHTHS,
    MIXED_P_LOG2_MAX,
    P_LOG2_MAX,
    Q_BLOCK,
    V_BLOCK,
)
from . import k_lanes as k_lane_spec
from .layout import from_bhnd, to_bhnd

FP16_MAX = 65504.0  # largest finite fp16


def to_output_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Round the output to q's dtype as every kernel's store does: fp16 saturates at +-65504.

    Dequantized V can exceed the input's range by an FP8 rounding (V-Smooth's residual), so a
    plain cast gave inf where SDPA gives none. NaN stays NaN (|NaN| > max is false); bf16 has
    float32's range, so its cast is left alone.
    """
    if dtype == torch.float16:
        x = torch.where(x.abs() > FP16_MAX, x.sign() * FP16_MAX, x)
    return x.to(dtype)


def _blocks(n: int, block: int) -> int:
    return (n + block - 1) // block


def pad_rows(x: torch.Tensor, block: int) -> torch.Tensor:
    """Zero-pad dim -2 (tokens) to a multiple of `block`, so blocks can be reshaped out of it.

    Zeros never change an absmax or a sum; callers that average divide by the valid row count.
    """
    pad = _blocks(x.shape[-2], block) * block - x.shape[-2]
    return torch.nn.functional.pad(x, (0, 0, 0, pad)) if pad else x


def block_absmax(x: torch.Tensor, block: int) -> torch.Tensor:
    """(B,H,N,D) -> (B,H,ceil(N/block)): max |x| over `block` consecutive rows and all channels."""
    b, h, n, d = x.shape
    xp = pad_rows(x.abs(), block)
    return xp.reshape(b, h, -1, block * d).amax(dim=-1)


def expand_rows(per_block: torch.Tensor, block: int, n: int) -> torch.Tensor:
    """(B,H,nb[,D]) -> (B,H,n,1 or D): repeat each block's value (a scale or a mean) over its `block`
    rows, the tail block cut off at n rows; the inverse of reducing `block` rows to one value."""
    if per_block.dim() == 3:
        per_block = per_block.unsqueeze(-1)
    return per_block.repeat_interleave(block, dim=2)[:, :, :n]


# ----------------------------------------------------------------------------------------------
# K smoothing and the QK quantizers
def smooth_k(k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """K - mean_t K[t] per (b, h, channel), float32.

    Softmax-invariant: q.(k_t - kbar) = q.k_t - q.kbar, a constant per query row. The mean is the
    float32 sum over all N tokens divided by N. Returns (k_smoothed float32, mean float32 (B,H,1,D)).
    """
    k32 = k.float()
    mean = k32.mean(dim=-2, keepdim=True)
    return k32 - mean, mean


def quantize_int8_blocks(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric INT8 with one scale per `block` rows (all channels) of each (b, h).

    amax = max |x| over the block (float32); inv = 127 / amax (0 when amax == 0);
    x_q = clamp(rint(x * inv), -127, 127) as int8; scale = amax / 127 (so x ~ x_q * scale).
    Tail block: only its valid rows count. Returns (x_q int8 (B,H,N,D), scale float32 (B,H,nb)).
    """
    x = x.float()
    amax = block_absmax(x, block)
    inv = torch.where(amax > 0, INT8_MAX / amax, torch.zeros_like(amax))
    xq = torch.round(x * expand_rows(inv, block, x.shape[-2])).clamp_(-INT8_MAX, INT8_MAX)
    return xq.to(torch.int8), amax / INT8_MAX


def fp8_e4m3(x: torch.Tensor) -> torch.Tensor:
    """Round float32 to E4M3 (nearest-even, saturating at +-448), returned as float32 values."""
    return x.float().clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float()


def quantize_fp8_blocks(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """E4M3 with one scale per `block` rows: inv = 448 / amax, x_q = E4M3(x * inv), scale = amax/448.

    The FP8-QK variant (the paper's B300 configuration). Returns (x_q as float32 values, scale).
    """
    x = x.float()
    amax = block_absmax(x, block)
    return fp8_e4m3(x * expand_rows(e4m3_inverse_scale(amax), block, x.shape[-2])), amax / E4M3_MAX


def qk_scale(head_dim: int, sm_scale: float | None) -> float:
    """sm_scale * log2(e): folded into Q before quantization so scores come out in log2 units."""
    return (1.0 / math.sqrt(head_dim) if sm_scale is None else float(sm_scale)) * LOG2E


def quantize_qk(q: torch.Tensor, k: torch.Tensor, config: VCConfig, sm_scale: float | None = None):
    """Q, K -> (q_q, q_scale, k_q, k_scale), all (B,H,...) as in quantize_*_blocks.

    Q is multiplied by qk_scale (a float32 constant) before quantization, one scale per ROW
    (q_scale (B,H,N)); K is smoothed (config.smooth_k) and quantized in blocks of k_scale_rows(config,
    head dim) rows (after any permutation). k_scale has one entry per K_BLOCK keys either way (B,H,ceil(N/K_BLOCK)):
    with 256-row blocks each scale is stored twice, as the operands hold it (a lone last 128-key slot
    has its own block's amax over its valid rows). With lane scales (k_lanes) k_scale is (B,H,ceil(N/K_BLOCK),4), one
    per (tile, lane) (kernels/k_lanes.py; K must already be in lane order: lane_sorted).
    """
    qs = q.float() * torch.tensor(qk_scale(q.shape[-1], sm_scale), dtype=torch.float32)
    ks = smooth_k(k)[0] if config.smooth_k else k.float()
    quant = quantize_int8_blocks if config.qk == "int8" else quantize_fp8_blocks
    q_q, q_sc = quant(qs, 1)
    rows = k_scale_rows(config, k.shape[-1])
    if k_lanes(config, k.shape[-1]):  # one scale per (block, lane): k_scale (B,H,ceil(N/K_BLOCK),4)
        k_q, k_sc = k_lane_spec.quantize_int8_lanes(ks, rows)
        return q_q, q_sc, k_q, k_sc.repeat_interleave(rows // K_BLOCK, dim=2)[:, :, : -(-ks.shape[-2] // K_BLOCK)]
    k_q, k_sc = quant(ks, rows)
    per_tile = rows // K_BLOCK
    k_sc = k_sc.repeat_interleave(per_tile, dim=-1)[..., : -(-ks.shape[-2] // K_BLOCK)]
    return q_q, q_sc, k_q, k_sc


def score_parts(q_q, q_scale, k_q, k_scale, n_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(acc, scale): the exact dot products q_q[i] . k_q[j] and the float32 scale q_scale[i] * k_scale[j blk].

    INT8: acc holds the integers (|sum| < 2^24, so a float32 matmul of int8 values is exact) - what the
    kernels' int32 MMA accumulators hold. FP8 products are not integers: accumulated in float64, rounded
    once to float32. q_scale is per query row (its first Nq entries are used: a padded operand works as is).
    """
    if q_q.dtype == torch.int8:
        acc = torch.matmul(q_q.float(), k_q.float().transpose(-1, -2))
    else:
        acc = torch.matmul(q_q.double(), k_q.double().transpose(-1, -2)).float()
    qs = q_scale[..., : q_q.shape[-2]].unsqueeze(-1)  # (B,H,Nq,1)
    if k_scale.dim() == 4:  # one K scale per (tile, lane): k_lanes
        ks = k_lane_spec.per_key(k_scale, n_k).unsqueeze(-2)  # (B,H,1,Nk)
    else:
        ks = expand_rows(k_scale, K_BLOCK, n_k).transpose(-1, -2)  # (B,H,1,Nk)
    return acc, (qs * ks).expand_as(acc)


def scores_log2(q_q, q_scale, k_q, k_scale, n_k: int) -> torch.Tensor:
    """s[i,j] = float32(acc[i,j]) * float32(q_scale[i] * k_scale[j blk]): scores in log2 units (score_parts)."""
    acc, scale = score_parts(q_q, q_scale, k_q, k_scale, n_k)
    return acc * scale


# ----------------------------------------------------------------------------------------------
# P encodings
def row_offset(s: torch.Tensor) -> torch.Tensor:
    """M_i = max_j s_ij: the offset of a row once every key has been seen (the exact max)."""
    return s.amax(dim=-1, keepdim=True)


def running_row_offsets(s: torch.Tensor, block: int = K_BLOCK) -> torch.Tensor:
    """The offset an online-softmax kernel holds while it processes each key block.

    Key blocks of `block` columns are visited in order 0, 1, ...; after block j the offset is the
    running max of the scores, max over blocks <= j of the block max (exact float32 values, no
    rounding). Returns (..., Nq, nb) float32.
    """
    return torch.cummax(_block_maxima(s, block), dim=-1).values


def _block_maxima(x: torch.Tensor, block: int) -> torch.Tensor:
    """(..., N) -> (..., nb): the maximum of each block of `block` columns (the last one partial)."""
    n = x.shape[-1]
    nb = _blocks(n, block)
    padded = torch.nn.functional.pad(x, (0, nb * block - n), value=-math.inf)
    return padded.reshape(*x.shape[:-1], nb, block).amax(dim=-1)


def row_constant(c: float, m) -> torch.Tensor:
    """float32(c - M): the per-row constant a kernel adds to s with its one multiply-add
    (fmaf(acc, sc, c - M)); c rounded to float32 first, as the kernels' float literal is."""
    return torch.tensor(c, dtype=torch.float32) - torch.as_tensor(m, dtype=torch.float32)


def p_exp2_cast(s: torch.Tensor, m=0.0) -> torch.Tensor:
    """Fidelity encoding: P = E4M3(exp2(s + float32(8 - M))) (float32 exp2, RNE cast), u = s - M <= 0.

    With m = 0 (the default) s is u itself: P = E4M3(exp2(u + 8)). At the row max u = 0: 256."""
    return fp8_e4m3(torch.exp2(s.float() + row_constant(P_LOG2_MAX, m)))


def expcast_paper_code(u: torch.Tensor, beta: float = EXPCAST_BETA) -> torch.Tensor:
    """The paper's ExpCast-FP8: the E4M3 byte straight from the log-domain score, int32 code 0..120.

    c(u) = clip_[0,120](rint(8 u + (8*8 + 56 + beta))), computed as one float32 multiply-add
    (8u is exact, so u*8 + 119.65f rounds once, like an fma) followed by rint. Codes 1..7 are E4M3
    subnormals worth c * 2^-9, not the intended 2^((c-56)/8), and u < -14.9 gives 0: kept as the
    named variant p="expcast_paper" for comparison only.
    """
    t = u.float() * 8.0 + torch.tensor(8 * P_LOG2_MAX + 56 + beta, dtype=torch.float32)
    return torch.round(t).clamp_(0, EXPCAST_MAX_CODE).to(torch.int32)


def decode_e4m3(codes: torch.Tensor) -> torch.Tensor:
    """Exact value of E4M3 byte codes 0..127 (sign bit 0): normals 2^(e-7)(1+m/8), subnormals m 2^-9."""
    c = codes.to(torch.int32)
    e, m = c >> 3, c & 7
    normal = torch.exp2(e.float() - 7.0) * (1.0 + m.float() / 8.0)
    sub = m.float() * 2.0**-9
    return torch.where(e > 0, normal, sub)


def p_expcast_paper(s: torch.Tensor, m=0.0) -> torch.Tensor:
    """The paper's ExpCast of u = s - M as the values the FP8 MMA multiplies (decoded through torch's
    float8 view). Comparison only: no kernel matches it bit for bit."""
    return expcast_paper_code(s.float() - m).to(torch.uint8).view(torch.float8_e4m3fn).float()


def expcast_bits(acc: torch.Tensor, scale, a0, m) -> torch.Tensor:
    """t = T0 + (acc - a0) A, the int64 fixed point 2^23 (w + 127) of w = u + log2(448) + beta/8 (u = s - M).

    acc: the exact scores (integers for INT8 QK), scale: their float32 scale (s = fl(acc * scale)),
    a0: the largest acc of the key block the kernel encodes together (within one K-scale block, so
    that fl(a0 scale) <= M), m: the running max M it holds then
    (all broadcast against acc). Per block and row, in float32 as the kernels compute them:
    A = rint(min(scale 2^23, 2^28)) and T0 = rint(fl(EXPCAST_TOP + fl(fl(a0 scale) - M)) 2^23); then one
    exact integer multiply-add per element. The slope A carries scale to about 1/(2A) relative (A is
    ~10^3 at typical scales: the same rel-L2 as the float fixed point it replaced, docs/kernel-notes.md).
    """
    f32 = torch.float32
    acc = torch.as_tensor(acc)
    scale = torch.as_tensor(scale, dtype=f32)
    a0 = torch.as_tensor(a0, dtype=acc.dtype)
    e = (a0.to(f32) * scale) - torch.as_tensor(m, dtype=f32)
    slope = torch.round(torch.clamp(scale * 2.0**EXPCAST_SLOPE_BITS, max=EXPCAST_SLOPE_CAP)).double()
    top = torch.round((torch.tensor(EXPCAST_TOP, dtype=f32) + e) * 2.0**EXPCAST_SLOPE_BITS).double()
    t = torch.round(top + (acc.double() - a0.double()) * slope)
    # far below the range (a masked key's -inf included) is t <= 0, code 0; keep the int64 cast defined
    return torch.nan_to_num(t, nan=0.0).clamp(-(2.0**62), 2.0**62).to(torch.int64)


def expcast_bits_float(t: torch.Tensor) -> torch.Tensor:
    """The float32 with bits t (t <= 0: 0.0): 2^floor(w) (1 + frac(w)) for t = 2^23 (w + 127), the chord of 2^w."""
    return torch.clamp(t, min=0).to(torch.int32).view(torch.float32)


def p_expcast(s: torch.Tensor, m=0.0, *, acc=None, scale=None, a0=None) -> torch.Tensor:
    """Speed encoding (ExpCast, corrected): P = E4M3(chord of 2^w), w = u + log2(448) + beta/8, u = s - M;
    float32 values of the E4M3 codes (row max 448, code 126).

    The chord 2^floor(w) (1 + frac(w)) is the float32 whose bits are 2^23 (w + 127), formed in integer
    fixed point (expcast_bits) and rounded to E4M3 by the hardware cast (RNE, satfinite: at u = 0 the
    float is 451.3, cast to 448). In the normal E4M3 range the code is rint(8w + 56), the paper's linear
    code; below 2^-6 the cast rounds the chord to multiples of 2^-9, so the E4M3 subnormal codes get
    their true values and probabilities survive down to u = -18.8 (the paper's codes 1..7 mis-decode).
    Kernels (csrc/p_encoding.cuh): one integer max (the clamp that keeps t in range) and one IMAD per
    element on the raw MMA accumulator, half an F2FP.E4M3: no MUFU, no I2F, no F2I per element.
    acc / scale / a0 (quantize_p passes them): the exact scores, their scale and the block maxima. Without
    them s itself is the exact score (scale 1, A = 2^23: u held to 2^-23) and a0 its row max.
    """
    if acc is None:
        acc, scale = s.float(), 1.0
    if a0 is None:
        a0 = acc.amax(dim=-1, keepdim=True)
    return fp8_e4m3(expcast_bits_float(expcast_bits(acc, scale, a0, m)))


def expcast_code(s: torch.Tensor, m=0.0, **parts) -> torch.Tensor:
    """The E4M3 byte of p_expcast(s, m, **parts) as int32 (0..126)."""
    return p_expcast(s, m, **parts).to(torch.float8_e4m3fn).view(torch.uint8).to(torch.int32)


def p_exp2_cast_448(s: torch.Tensor, m=0.0) -> torch.Tensor:
    """The mixed encoding's exp2 keys: P = E4M3(exp2(s + float32(log2(448) - M))), the row max at 448 as the chord's
    (at u = 0 exactly 448, code 126); the same instructions as p_exp2_cast, another row constant."""
    return fp8_e4m3(torch.exp2(s.float() + row_constant(MIXED_P_LOG2_MAX, m)))


def mixed_chord_keys(n: int, offset_block: int, chord_eighths: int = MIXED_CHORD_EIGHTHS, device=None) -> torch.Tensor:
    """(n,) bool: the keys the mixed encoding (p="mixed") gives the ExpCast chord, the last chord_eighths eighths of
    every online-softmax step of offset_block keys (steps start at key 0, so a partial last step keeps the rule by its
    keys' positions). The rest take exp2 + cast at row max 448 (p_exp2_cast_448).

    Why by position: a kernel thread's keys sit in fixed MMA k-steps, so the split is static code, no per-score
    select; which keys are exact does not matter for the error (video-like data, docs/fidelity-study.md "The mixed
    encoding"), only how many."""
    if not 0 <= chord_eighths <= 8 or (offset_block * chord_eighths) % 8:
        raise ValueError(f"chord_eighths must be 0..8 with offset_block * chord_eighths a multiple of 8, got "
                         f"{chord_eighths} for offset_block {offset_block}.")
    first_chord = offset_block - offset_block * chord_eighths // 8
    return torch.arange(n, device=device) % offset_block >= first_chord


# encoder(s, m): P of the scores s against the row offset m (broadcast); m = 0 makes s the argument u
# ("mixed" is quantize_p's: it needs the keys' positions and the chord's anchors)
P_ENCODERS = {"exp2": p_exp2_cast, "expcast": p_expcast, "expcast_paper": p_expcast_paper}


def block_row_max(x: torch.Tensor, block: int) -> torch.Tensor:
    """(..., N) -> (..., N): each key's block maximum over its row (blocks of `block` keys, the last partial)."""
    # in float64: integer tensors take the -inf padding too
    return _block_maxima(x.double(), block).repeat_interleave(block, dim=-1)[..., : x.shape[-1]].to(x.dtype)


def quantize_p(s: torch.Tensor, config: VCConfig, offset_block: int = K_BLOCK, *, acc=None, scale=None,
               lanes: bool | None = None, chord_eighths: int = MIXED_CHORD_EIGHTHS) -> torch.Tensor:
    """Scores (log2 units) -> quantized, UNnormalized probabilities, float64, as the kernel sums them.

    Each key block is encoded against the running offset of the block (running_row_offsets: the
    exact running max), then rescaled by 2^(M_running - M_final) in float64 - what the online
    softmax's alpha factors do to the accumulator and the row sum (the kernels' float32 alpha is
    within 3e-7 of it). The codes are those the kernel writes, subnormal and underflow tail included.
    offset_block: keys per online-softmax step of the kernel being emulated (Backend.softmax_step(head_dim,
    config): K_BLOCK for sm90 and the 16-row mma layout, 2 K_BLOCK for sm90's head-dim-128 V-Smooth loops,
    64 for the wide mma layout the backend runs).
    acc, scale (score_parts): the exact scores behind s; the speed encoding works on them (p_expcast).
    lanes: whether the K scales are per lane (k_lanes(config, head_dim); None: config.k_lane_scales).
    chord_eighths: p="mixed" only, the chord's share of every step (mixed_chord_keys; a kernel variant may build
    another than MIXED_CHORD_EIGHTHS).
    """
    run = running_row_offsets(s, offset_block)
    m_run = run.repeat_interleave(offset_block, dim=-1)[..., : s.shape[-1]]
    if config.p in ("expcast", "mixed"):
        exact = s.float() if acc is None else acc
        # a0: each key's block max over the step's keys within its K-scale block (a step of 256 keys
        # spans two 128-key scale blocks: anchored at the other block's max, a0 * scale could pass M;
        # with k_scale_rows 256 one scale covers the step and one max anchors it)
        # with lane scales (k_lanes) each lane of the quad is anchored at its own keys' max (their own scale)
        block = min(offset_block, config.k_scale_rows)
        per_lane = config.k_lane_scales if lanes is None else lanes
        a0 = k_lane_spec.lane_block_row_max(exact, block) if per_lane else block_row_max(exact, block)
        p = p_expcast(s, m_run, acc=exact, scale=1.0 if acc is None else scale, a0=a0)
        if config.p == "mixed":
            chord = mixed_chord_keys(s.shape[-1], offset_block, chord_eighths, device=s.device)
            p = torch.where(chord, p, p_exp2_cast_448(s, m_run))
    else:
        p = P_ENCODERS[config.p](s, m_run)
    return p.double() * torch.exp2(m_run.double() - run[..., -1:].double())


# ----------------------------------------------------------------------------------------------
# V quantizers
def channel_absmax(x: torch.Tensor) -> torch.Tensor:
    """(B,H,N,D) -> (B,H,1,D): max |x| over tokens, per channel."""
    return x.abs().amax(dim=-2, keepdim=True)


def quantize_fp8_per_channel(x: torch.Tensor, amax: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """E4M3 with one scale per (b, h, channel): inv = 448/amax, x_q = E4M3(x*inv), scale = amax/448.
    amax: the channel amax (default) or a bound on it given by the caller (B,H,1,D)."""
    x = x.float()
    amax = channel_absmax(x) if amax is None else amax
    return fp8_e4m3(x * e4m3_inverse_scale(amax)), amax / E4M3_MAX


def e4m3_inverse_scale(amax: torch.Tensor) -> torch.Tensor:
    """448 / amax in float32 (0 where amax is 0): what a per-channel E4M3 quantizer multiplies by."""
    return torch.where(amax > 0, E4M3_MAX / amax, torch.zeros_like(amax))


def block_means(x: torch.Tensor, block: int = V_BLOCK) -> torch.Tensor:
    """(B,H,N,D) -> (B,H,nb,D): per `block` rows, sum of the valid rows / valid row count, in x's
    dtype (the tail block averages only its own rows)."""
    b, h, n, d = x.shape
    sums = pad_rows(x, block).reshape(b, h, -1, block, d).sum(dim=3)
    counts = torch.full((_blocks(n, block),), float(block), dtype=x.dtype, device=x.device)
    counts[-1] = n - (counts.numel() - 1) * block
    return sums / counts.view(1, 1, -1, 1)


def block_means_fp16(v: torch.Tensor, block: int = V_BLOCK) -> torch.Tensor:
    """The V-Smooth means mu_j: block_means in float32, rounded to fp16 (B,H,nb,D).

    fp16 (not bf16): 11 significant bits keep the mean's rounding far below the FP8 residual error.
    """
    return block_means(v.float(), block).to(torch.float16)


def vsmooth_means(v: torch.Tensor, mean_rows: int = V_BLOCK) -> torch.Tensor:
    """The V-Smooth means as the operands store them: one fp16 mean per V_BLOCK rows (B,H,ceil(N/V_BLOCK),D),
    each the mean over its `mean_rows`-row block (VCConfig.v_mean_rows: 128, or 256, when the two
    128-row blocks of a 256-row block share one mean: the tail block averages only its own rows)."""
    if mean_rows % V_BLOCK:
        raise ValueError(f"mean_rows must be a multiple of {V_BLOCK}, got {mean_rows}.")
    per = mean_rows // V_BLOCK
    return block_means_fp16(v, mean_rows).repeat_interleave(per, dim=2)[:, :, :_blocks(v.shape[-2], V_BLOCK)]


# V-Smooth segments (VCConfig.v_mean_merge): a 256-row block joins the segment before it while the
# squared L2 shift of its float32 mean from the segment's first block's is <= 1/9 of its residual's mean
# squared row norm (kappa = 1/3 in RMS terms: docs/fidelity-study.md, "V-Smooth segments")
V_MERGE_INV_KAPPA2 = 9.0
# the head dims whose V-Smooth means merge (VCConfig.v_mean_merge): the Hopper kernel's 256-key loop, which
# restores a mean only at segment ends, runs at head dim 128; at 64 every kernel restores per 128-key tile,
# so segments would only add the prepare's walk (+2% at LTX-Video, docs/kernel-notes.md section 26)
SEGMENT_HEAD_DIMS = (128,)


def merges(config: VCConfig, head_dim: int) -> bool:
    """Whether a call of this configuration and head dim merges its V-Smooth means into segments."""
    return config.v_mean_merge and head_dim in SEGMENT_HEAD_DIMS


# the head dims whose K scales pair (VCConfig.k_scale_rows 256): the Hopper speed and fidelity loops that take one
# K scale per 256-key step run at head dim 128; at 64 every kernel steps 128 keys with a scale per tile, so a scale
# per 256 keys would only cost error and the statistics pass's K extremes (+9 us of 32 at LTX-Video:
# docs/kernel-notes.md section 28)
PAIRED_K_HEAD_DIMS = (128,)


def k_scale_rows(config: VCConfig, head_dim: int) -> int:
    """Keys per INT8 K scale of a call of this configuration and head dim (config.k_scale_rows where the
    kernel pairs them, else one scale per K_BLOCK)."""
    return config.k_scale_rows if head_dim in PAIRED_K_HEAD_DIMS else K_BLOCK


# the head dims whose K scales are per lane (VCConfig.k_lane_scales): the paired-K Hopper loops at head dim 128
LANE_K_HEAD_DIMS = PAIRED_K_HEAD_DIMS


def k_lanes(config: VCConfig, head_dim: int) -> bool:
    """Whether a call of this configuration and head dim takes K scales per lane (and the lane order)."""
    return config.k_lane_scales and head_dim in LANE_K_HEAD_DIMS


def lane_sorted(k: torch.Tensor, v: torch.Tensor, config: VCConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V (B,H,N,D, the grouping's order) in lane order (k_lanes.lane_order of K as quantize_qk smooths it)
    where the call takes lane scales; unchanged otherwise."""
    if not k_lanes(config, k.shape[-1]):
        return k, v
    order = k_lane_spec.lane_order(smooth_k(k)[0] if config.smooth_k else k.float())
    return permute_tokens(k, order), permute_tokens(v, order)


@dataclass
class VSmoothSegments:
    """What the segment merge decides for one (permuted) V (vsmooth_segments)."""

    mean: torch.Tensor  # (B,H,ceil(N/128),D) fp16: every 128-row slot holds its segment's mean
    seg_end: torch.Tensor  # (B,H,ceil(N/128)) uint8: 1 on each segment's last slot
    amax: torch.Tensor  # (B,H,1,D) float32: the residual's amax bound (the FP8 scale's amax)


def vsmooth_segments(v: torch.Tensor) -> VSmoothSegments:
    """V-Smooth means per segment of 256-row blocks, found from V alone (no cluster labels needed; a
    cluster-sorted V makes its runs the segments). In block order, per (batch, head):
    - m_b: the block's float32 mean (sum / valid rows), mu_b = fp16(m_b), E_b = sum over its rows and
      channels of (v - mu_b)^2 (float32), a_b = its per-channel amax of |v - mu_b|;
    - block 0 opens a segment (its anchor m_0); block b joins the open segment iff
      9 * sum_d (m_b - anchor)^2 * valid_b <= E_b, else it opens the next one (anchor m_b);
    - a segment's mean is fp16(S / C): S the float32 sum of m_b * valid_b in block order, C its rows;
    - the residual's per-channel amax bound: max over blocks of a_b + |mu_b - mu_seg(b)| (float32).
    The Hopper speed loop then restores a mean only at segment ends (seg_end), not every 256-key step;
    every other kernel restores per 128-key tile as always (each slot holds its segment's mean)."""
    b, h, n, d = v.shape
    vf = v.float()
    m = block_means(vf, 2 * V_BLOCK)  # (B,H,nb,D)
    mu = m.to(torch.float16).float()
    nb = m.shape[2]
    dev = pad_rows(vf - expand_rows(mu, 2 * V_BLOCK, n), 2 * V_BLOCK).reshape(b, h, nb, 2 * V_BLOCK, d)
    valid = torch.full((nb,), 2 * V_BLOCK, dtype=torch.int64)
    valid[-1] = n - 2 * V_BLOCK * (nb - 1)
    energy = dev.square().sum(dim=(3, 4))  # (B,H,nb) E_b
    a = dev.abs().amax(3)  # (B,H,nb,D) a_b
    seg = torch.zeros(b, h, nb, dtype=torch.int64, device=v.device)
    seg_sums = torch.zeros(b, h, nb, d, dtype=torch.float32, device=v.device)
    seg_rows = torch.zeros(b, h, nb, dtype=torch.float32, device=v.device)
    anchor, total, rows = m[:, :, 0], m[:, :, 0] * float(valid[0]), torch.full((b, h), float(valid[0]), device=v.device)
    sid = torch.zeros(b, h, 1, dtype=torch.int64, device=v.device)
    for j in range(1, nb):
        shift2 = (m[:, :, j] - anchor).square().sum(-1)
        joins = V_MERGE_INV_KAPPA2 * shift2 * float(valid[j]) <= energy[:, :, j]
        # a head whose block opens a segment stores the closed one's sums first
        seg_sums.scatter_(2, sid.unsqueeze(-1).expand(b, h, 1, d), total.unsqueeze(2))
        seg_rows.scatter_(2, sid, rows.unsqueeze(-1))
        sid = sid + (~joins).long().unsqueeze(-1)
        weighted = m[:, :, j] * float(valid[j])
        total = torch.where(joins.unsqueeze(-1), total + weighted, weighted)
        rows = torch.where(joins, rows + float(valid[j]), torch.full_like(rows, float(valid[j])))
        anchor = torch.where(joins.unsqueeze(-1), anchor, m[:, :, j])
        seg[:, :, j] = sid.squeeze(-1)
    seg_sums.scatter_(2, sid.unsqueeze(-1).expand(b, h, 1, d), total.unsqueeze(2))
    seg_rows.scatter_(2, sid, rows.unsqueeze(-1))
    seg_mu = (seg_sums / seg_rows.clamp(min=1).unsqueeze(-1)).to(torch.float16)  # (B,H,nb,D), first entries used
    block_mu = seg_mu.gather(2, seg.unsqueeze(-1).expand(b, h, nb, d))  # (B,H,nb,D) each block's segment mean
    amax = (a + (mu - block_mu.float()).abs()).amax(2, keepdim=True)
    slots = _blocks(n, V_BLOCK)
    mean = block_mu.repeat_interleave(2, dim=2)[:, :, :slots]
    last_of_block = torch.ones(b, h, nb, dtype=torch.bool, device=v.device)
    last_of_block[:, :, :-1] = seg[:, :, 1:] != seg[:, :, :-1]
    seg_end = torch.zeros(b, h, nb, 2, dtype=torch.uint8, device=v.device)
    seg_end[..., 1] = last_of_block.to(torch.uint8)
    seg_end = seg_end.reshape(b, h, 2 * nb)[:, :, :slots]
    if slots % 2:  # a lone last 128-row slot ends its block (and the head's last segment)
        seg_end[:, :, -1] = 1
    return VSmoothSegments(mean.contiguous(), seg_end.contiguous(), amax)


@dataclass
class VSmoothV:
    """V-Smooth operands of one (permuted) V: what the prepare kernel writes."""

    mean: torch.Tensor  # (B,H,nb,D) fp16 block means mu_j
    residual_q: torch.Tensor  # (B,H,N,D) float32 values of E4M3 residual codes
    scale: torch.Tensor  # (B,H,1,D) float32 per-channel residual scale
    # the optional head-global low-rank term A W (quantize_v_vsmooth with a basis)
    basis: torch.Tensor | None = None  # (B,H,k,D) fp16 directions W
    coeff_q: torch.Tensor | None = None  # (B,H,N,k) float32 values of E4M3 codes of A
    coeff_scale: torch.Tensor | None = None  # (B,H,1,k) float32 scale per head and component
    seg_end: torch.Tensor | None = None  # (B,H,nb) uint8 with V-Smooth segments (vsmooth_segments)
    # the residual's second E4M3 term on the channels lo_sel (quantize_v_vsmooth with lo_channels)
    lo_q: torch.Tensor | None = None  # (B,H,N,L) float32 values of E4M3 codes of the first term's rounding error
    lo_sel: torch.Tensor | None = None  # (B,H,L) int64 channel of each lo column

    def residual(self) -> torch.Tensor:
        """(B,H,N,D) float32: the residual's codes as the PV product sums them (hi, plus lo on lo_sel), unscaled."""
        if self.lo_q is None:
            return self.residual_q
        return self.residual_q.scatter_add(-1, self.lo_sel.unsqueeze(-2).expand_as(self.lo_q), self.lo_q)

    def low_rank(self) -> torch.Tensor:
        """(B,H,N,D) float32: A W as the kernels restore it (zeros without a basis)."""
        if self.basis is None:
            return torch.zeros_like(self.residual_q)
        return (self.coeff_q * self.coeff_scale) @ self.basis.float()

    def dequantized(self) -> torch.Tensor:
        n = self.residual_q.shape[-2]
        v = self.residual() * self.scale + expand_rows(self.mean.float(), V_BLOCK, n)
        return v if self.basis is None else v + self.low_rank()


LOWRANK_SAMPLE = 4096  # tokens (evenly spaced) whose residual covariance gives the low-rank basis


def lowrank_basis(v_perm: torch.Tensor, rank: int, sample: int = LOWRANK_SAMPLE) -> torch.Tensor:
    """The basis of V-Smooth's low-rank term (B,H,rank,D) fp16: the top-`rank` eigenvectors of the
    V-Smooth residual's second-moment matrix over `sample` evenly spaced tokens of the head (all of
    them when there are fewer), float64, each signed so that its largest-magnitude entry is positive.

    A policy, not part of the quantizer's arithmetic: the kernels take the basis as an operand, and
    any basis gives a correct V (what the basis misses stays in the FP8 residual). On the video-like
    data rank 6 from 4,096 tokens takes 6-9% off the output error (docs/fidelity-study.md)."""
    resid = lowrank_residual_sample(v_perm, sample).double()
    _, vectors = torch.linalg.eigh(resid.transpose(-1, -2) @ resid)  # ascending eigenvalues
    return signed_basis_fp16(vectors[..., -rank:].flip(-1).transpose(-1, -2))  # (B,H,rank,D), largest first


def lowrank_residual_sample(v_perm: torch.Tensor, sample: int = LOWRANK_SAMPLE,
                            block_means: torch.Tensor | None = None) -> torch.Tensor:
    """(B,H,S,D) float32: the V-Smooth residual (against the fp16 block means; `block_means` (B,H,nb,D)
    stands in for recomputing them) of `sample` evenly spaced tokens (all of them when there are fewer)."""
    n = v_perm.shape[-2]
    rows = torch.linspace(0, n - 1, min(sample, n), device=v_perm.device).round().long()
    means = block_means_fp16(v_perm) if block_means is None else block_means
    return v_perm.index_select(-2, rows).float() - means.float().index_select(-2, rows // V_BLOCK)


def signed_basis_fp16(basis: torch.Tensor) -> torch.Tensor:
    """(..., rank, D) directions, each signed so that its largest-magnitude entry is positive, as fp16."""
    peak = basis.gather(-1, basis.abs().argmax(dim=-1, keepdim=True))
    return (basis * torch.where(peak < 0, -1.0, 1.0)).to(torch.float16)


def resolve_basis(v_perm: torch.Tensor, rank: int, basis: torch.Tensor | None) -> torch.Tensor | None:
    """The low-rank basis a call uses: None for rank 0, else the caller's (checked: (B,H,rank,D) fp16
    on V's device) or lowrank_basis's."""
    if not rank:
        if basis is not None:
            raise ValueError("a low-rank basis was given, but the configuration has v_rank=0.")
        return None
    if basis is None:
        return lowrank_basis(v_perm, rank)
    want = (*v_perm.shape[:2], rank, v_perm.shape[-1])
    if tuple(basis.shape) != want or basis.dtype != torch.float16 or basis.device != v_perm.device:
        raise ValueError(f"the low-rank basis must be float16 of shape (B, H, v_rank, D) = {want} on {v_perm.device}, "
                         f"got {basis.dtype} {tuple(basis.shape)} on {basis.device}.")
    return basis


def v_lo_channel_policy(resid: torch.Tensor, count: int) -> torch.Tensor:
    """The channels that keep a second E4M3 term (VCConfig.v_lo_channels), (B,H,count) int64 in ascending order: the
    `count` channels of each head with the largest residual energy sum_j r_jc^2 (float64 sums; ties to the lower
    channel). A policy, not the quantizer's arithmetic: kernels take the channels as an operand and any choice gives
    a correct V (a channel without the term keeps its first term's error). On the video-like data the energy ranking
    is as good as ranking by the first term's actual error and better than by the channel amax (docs/fidelity-study.md)."""
    energy = resid.double().pow(2).sum(-2)  # (B,H,D)
    order = torch.sort(-energy, dim=-1, stable=True).indices[..., :count]
    return order.sort(dim=-1).values


def quantize_v_vsmooth(v_perm: torch.Tensor, basis: torch.Tensor | None = None, mean_rows: int = V_BLOCK,
                       merge: bool = False, lo_channels: int = 0, lo_sel: torch.Tensor | None = None) -> VSmoothV:
    """V-Smooth on an already permuted V: R = V - mu (fp16 mean as float32), then per-channel FP8.
    mean_rows: the rows one mean covers (VCConfig.v_mean_rows; vsmooth_means). merge: the means of
    vsmooth_segments instead (VCConfig.v_mean_merge; no basis), the residual scaled by its amax bound.

    The residual is taken against the ROUNDED mean, so mean + residual reconstructs V up to the
    residual's FP8 error only. Residual scale: amax over all tokens per channel / 448.

    With a basis W (B,H,k,D), the low-rank term first: A = R W^T per token (float32), E4M3 with one
    scale per head and component (amax / 448), and the FP8 residual is R - A_q W: A's rounding lands
    in the residual, so V = mean + A_q W + residual up to the residual's FP8 error again. The residual's
    per-channel scale is a bound a two-pass prepare can compute in its statistics pass, before A's
    scale is known: (amax over tokens of |R - A W| + 2^-4 sum_k amax|A_k| |W_kd|) / 448 (an E4M3
    rounding moves A by at most 2^-4 of its magnitude). On the video-like data it is within 2% of the
    exact amax and the output error is the same (docs/fidelity-study.md).

    lo_channels (VCConfig.v_lo_channels; no basis): on that many channels, lo_sel (default v_lo_channel_policy) the
    first term's rounding error is kept as a second E4M3 term of the same scale: with x = r * 448 / amax the scaled
    residual and hi = E4M3(x), lo = E4M3(x - hi) (x - hi is exact in float32), so those channels carry hi + lo,
    within ~2^-8 of x instead of 2^-4.
    """
    if lo_channels and basis is not None:
        raise ValueError("the residual's second E4M3 term (v_lo_channels) takes no low-rank term.")
    if merge:
        if basis is not None:
            raise ValueError("V-Smooth segments (v_mean_merge) take no low-rank term.")
        seg = vsmooth_segments(v_perm)
        resid = v_perm.float() - expand_rows(seg.mean.float(), V_BLOCK, v_perm.shape[-2])
        r_q, r_scale = quantize_fp8_per_channel(resid, seg.amax)
        return _with_lo(VSmoothV(seg.mean, r_q, r_scale, seg_end=seg.seg_end), resid, seg.amax, lo_channels, lo_sel)
    mean = vsmooth_means(v_perm, mean_rows)
    resid = v_perm.float() - expand_rows(mean.float(), V_BLOCK, v_perm.shape[-2])
    if basis is None:
        amax = channel_absmax(resid)
        r_q, r_scale = quantize_fp8_per_channel(resid, amax)
        return _with_lo(VSmoothV(mean, r_q, r_scale), resid, amax, lo_channels, lo_sel)
    w = basis.float()
    coeff = resid @ w.transpose(-1, -2)
    c_q, c_scale = quantize_fp8_per_channel(coeff)  # one scale per head and component
    bound = channel_absmax(resid - coeff @ w) + 2.0**-4 * (channel_absmax(coeff) @ w.abs())
    r_q, r_scale = quantize_fp8_per_channel(resid - (c_q * c_scale) @ w, bound)
    return VSmoothV(mean, r_q, r_scale, basis, c_q, c_scale)


def _with_lo(vs: VSmoothV, resid: torch.Tensor, amax: torch.Tensor, lo_channels: int,
             lo_sel: torch.Tensor | None) -> VSmoothV:
    """vs with the second E4M3 term on lo_channels channels (quantize_v_vsmooth's lo_channels); amax: the one the
    first term was scaled by."""
    if not lo_channels:
        return vs
    if lo_sel is None:
        lo_sel = v_lo_channel_policy(resid, lo_channels)
    if lo_sel.shape != (*resid.shape[:2], lo_channels):
        raise ValueError(f"lo_sel must be (B,H,{lo_channels}) channel indices, got {tuple(lo_sel.shape)}.")
    lo_sel = lo_sel.long()
    # the first term's own scaled residual x (quantize_fp8_per_channel's 448 / amax, float32)
    inv = e4m3_inverse_scale(amax).expand(*resid.shape[:2], 1, resid.shape[-1])
    pick = lo_sel.unsqueeze(-2)
    x = resid.gather(-1, pick.expand(*resid.shape[:-1], lo_channels)) * inv.gather(-1, pick)
    hi = vs.residual_q.gather(-1, pick.expand(*resid.shape[:-1], lo_channels))
    vs.lo_q, vs.lo_sel = fp8_e4m3(x - hi), lo_sel
    return vs


def dequantized_v(v_perm: torch.Tensor, config: VCConfig, basis: torch.Tensor | None = None) -> torch.Tensor:
    """The V the PV product effectively uses, float32 (mean restore included for V-Smooth; with
    config.v_rank the low-rank term on `basis`, by default the one lowrank_basis proposes)."""
    if config.v == "vsmooth":
        basis = resolve_basis(v_perm, config.v_rank, basis)
        return quantize_v_vsmooth(v_perm, basis, config.v_mean_rows, merges(config, v_perm.shape[-1]),
                                  config.v_lo_channels).dequantized()
    v_q, v_scale = quantize_fp8_per_channel(v_perm)
    return v_q * v_scale


# ----------------------------------------------------------------------------------------------
# grouping semantics (the fast GPU k-means must reproduce these labels up to ties)
def kmeans_init_indices(n: int, clusters: int, seed: int) -> torch.Tensor:
    """Seeded choice of initial centroid tokens, shared by every (b, h): the first `clusters` entries
    of torch.randperm(n) under a CPU generator seeded with `seed` (clusters is capped at n)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randperm(n, generator=gen)[: min(clusters, n)]


def kmeans_assign(x: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """Nearest centroid by squared Euclidean distance; ties go to the lowest cluster id.

    ||x||^2 is the same for every centroid, so the label is argmin_c (||c||^2 - 2 x.c)."""
    score = (centroids * centroids).sum(-1).unsqueeze(-2) - 2.0 * x @ centroids.transpose(-1, -2)
    return score.argmin(dim=-1)


def kmeans_update(x: torch.Tensor, labels: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """Mean of each cluster's members; an empty cluster keeps its previous centroid."""
    b, h, n, d = x.shape
    c = centroids.shape[-2]
    sums = torch.zeros(b, h, c, d, dtype=torch.float32, device=x.device)
    sums.scatter_add_(2, labels.unsqueeze(-1).expand(b, h, n, d), x)
    counts = torch.zeros(b, h, c, dtype=torch.float32, device=x.device)
    counts.scatter_add_(2, labels, torch.ones_like(labels, dtype=torch.float32))
    return torch.where(counts.unsqueeze(-1) > 0, sums / counts.clamp(min=1).unsqueeze(-1), centroids)


def kmeans_labels(
    v: torch.Tensor,
    clusters: int,
    iters: int,
    seed: int = 0,
    init_centroids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lloyd k-means over the value tokens of every (b, h) at once, float32.

    Init: the tokens kmeans_init_indices(N, clusters, seed), or `init_centroids` (B,H,C,D) for a warm
    start. Each iteration: assign (kmeans_assign) then update (kmeans_update). The returned labels are
    the assignment to the FINAL centroids, so labels and centroids are consistent.
    Returns (labels int64 (B,H,N), centroids float32 (B,H,C,D)).
    """
    x = v.float()
    if init_centroids is None:
        idx = kmeans_init_indices(x.shape[-2], clusters, seed).to(x.device)
        centroids = x[:, :, idx, :].clone()
    else:
        centroids = init_centroids.float().clone()
    for _ in range(iters):
        centroids = kmeans_update(x, kmeans_assign(x, centroids), centroids)
    return kmeans_assign(x, centroids), centroids


def labels_to_permutation(labels: torch.Tensor) -> torch.Tensor:
    """Stable sort of tokens by label (ties keep token order): perm[i] = source token of slot i.

    Cluster ids carry no meaning: any renumbering of the clusters is an equally valid grouping
    (attention output is permutation-invariant). kernels/grouping.group_tokens renumbers them along
    a nearest-neighbour chain of centroids so that blocks straddling two clusters mix similar ones."""
    return torch.argsort(labels, dim=-1, stable=True)


def permute_tokens(x: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """x'[b,h,i] = x[b,h,perm[b,h,i]] for (B,H,N,D) x and (B,H,N) perm."""
    return torch.gather(x, 2, perm.unsqueeze(-1).expand(-1, -1, -1, x.shape[-1]))


# ----------------------------------------------------------------------------------------------
# the whole attention call
def exact_attention(q, k, v, sm_scale: float | None = None, layout: str = "bhnd") -> torch.Tensor:
    """Softmax attention in float64 (the fidelity reference), returned float64 in `layout`."""
    qd, kd, vd = (to_bhnd(t, layout).double() for t in (q, k, v))
    scale = 1.0 / math.sqrt(qd.shape[-1]) if sm_scale is None else sm_scale
    out = torch.softmax((qd @ kd.transpose(-1, -2)) * scale, dim=-1) @ vd
    return from_bhnd(out, layout)


@dataclass
class ReferenceParts:
    """Output plus the error split of the paper: O - O_q = (P - P_q) V + P_q (V - V_q)."""

    out: torch.Tensor  # the emulated kernel output, float64, (B,H,N,D)
    out_exact_v: torch.Tensor  # P_q V with unquantized V (float64): O - this = QK term
    tv: torch.Tensor  # total variation of each P row vs exact softmax, (B,H,N)


def check_inputs(q, k, v) -> None:
    """Raise ValueError unless q, k and v are 4-D tensors of one shape (self-attention only)."""
    if not (q.dim() == k.dim() == v.dim() == 4):
        raise ValueError("q, k and v must be 4-D tensors.")
    if q.shape != k.shape or k.shape != v.shape:
        raise ValueError(
            f"VC-Attention is self-attention: q, k, v must have one shape, got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}."
        )


def vc_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    config: VCConfig,
    *,
    layout: str = "bhnd",
    perm: torch.Tensor | None = None,
    sm_scale: float | None = None,
    query_chunk: int = 1024,
    parts: bool = False,
    offset_block: int = K_BLOCK,
    v_basis: torch.Tensor | None = None,
    chord_eighths: int = MIXED_CHORD_EIGHTHS,
):
    """Emulate one VC-Attention call exactly (quantizers bit-exact, sums in float64).

    perm (B,H,N) permutes K and V together (V-Smooth grouping); Q and O are never permuted.
    Returns the output in q's dtype and `layout`, or ReferenceParts (float64, bhnd) if parts=True.
    Query rows are processed in chunks so memory is O(query_chunk * N). offset_block: keys per
    online-softmax step of the kernel being emulated (Backend.softmax_step(head_dim, config)).
    v_basis: the low-rank term's W (B,H,config.v_rank,D) fp16; None: lowrank_basis's.
    chord_eighths: p="mixed" only, the chord's eighths of every step (quantize_p).
    """
    check_inputs(q, k, v)
    qb, kb, vb = (to_bhnd(t, layout) for t in (q, k, v))
    if perm is not None:
        kb, vb = permute_tokens(kb, perm), permute_tokens(vb, perm)
    kb, vb = lane_sorted(kb, vb, config)
    n_k = kb.shape[-2]
    q_q, q_sc, k_q, k_sc = quantize_qk(qb, kb, config, sm_scale)
    v_hat = dequantized_v(vb, config, v_basis).double()
    scale = qk_scale(qb.shape[-1], sm_scale)

    outs, outs_v, tvs = [], [], []
    for start in range(0, qb.shape[-2], query_chunk):
        stop = min(start + query_chunk, qb.shape[-2])
        q_blk = q_q[:, :, start:stop]
        acc, sc = score_parts(q_blk, q_sc[:, :, start:stop], k_q, k_sc, n_k)
        s = acc * sc
        p = quantize_p(s, config, offset_block, acc=acc, scale=sc, lanes=k_sc.dim() == 4, chord_eighths=chord_eighths)
        denom = p.sum(-1, keepdim=True)
        outs.append(p @ v_hat / denom)
        if parts:
            outs_v.append(p @ vb.double() / denom)
            exact = torch.softmax(qb[:, :, start:stop].double() @ kb.double().transpose(-1, -2) * (scale / LOG2E), -1)
            tvs.append(0.5 * (exact - p / denom).abs().sum(-1))
    out = torch.cat(outs, dim=2)
    if parts:
        return ReferenceParts(out, torch.cat(outs_v, dim=2), torch.cat(tvs, dim=2))
    return from_bhnd(to_output_dtype(out, q.dtype), layout)
