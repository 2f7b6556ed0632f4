"""What an attention call quantizes and how: one frozen dataclass shared by every backend.

The numbers that define each quantizer (block sizes, the ExpCast constants, the P range) live in
reference.py next to the arithmetic they parametrize; this file only names the choices a user makes.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from .constants import MAX_V_RANK  # V-Smooth's low-rank term: at most the PV MMA's spare columns (6)
from .constants import K_BLOCK, V_BLOCK

V_MEAN_ROWS = (V_BLOCK, 2 * V_BLOCK)  # rows per V-Smooth block mean (VCConfig.v_mean_rows)
K_SCALE_ROWS = (K_BLOCK, 2 * K_BLOCK)  # keys per K scale, INT8 or FP8 (VCConfig.k_scale_rows)
# channels whose V-Smooth residual keeps a second E4M3 term (VCConfig.v_lo_channels); 30: the term beside the step's two
# row sums in one 32-row block of the Hopper PV MMA (its variant VLO = 30, docs/kernel-notes.md section 40)
V_LO_CHANNELS = (0, 16, 30, 32)

QK_FORMATS = ("int8", "fp8")
V_FORMATS = ("vsmooth", "per_channel")
P_ENCODINGS = ("exp2", "expcast", "mixed", "expcast_paper")
EXP2_FAMILY = ("exp2", "mixed")  # encodings whose loops are the exp2 ones (no per-step anchor for all keys)
KERNEL_P_ENCODINGS = ("exp2", "expcast")  # what the CUDA kernels implement; the rest is emulation only
LAYOUTS = ("bhnd", "bnhd")


@dataclass(frozen=True)
class VCConfig:
    """One VC-Attention configuration.

    qk: "int8" (INT8 Q and K, per-block scales) or "fp8" (E4M3 Q and K, the paper's B300 setting).
    v:  "vsmooth" (block mean removed, FP8 residual) or "per_channel" (SageAttention2-style FP8 V).
    p:  "exp2" (exp2 then E4M3 cast: the plain 8-bit mode), "expcast" (exp2 from float32 exponent bits
        then E4M3 cast, row max at 448, no MUFU: speed mode) or "expcast_paper" (the paper's direct E4M3 codes, whose
        subnormal codes mis-decode; emulation only, kept for comparison), or "mixed" (exp2 + cast for the first keys of
        every online-softmax step, the ExpCast chord for its last constants.MIXED_CHORD_EIGHTHS eighths, both at row
        max 448; reference.mixed_chord_keys). The product's split is 8/8, the chord for every key on fidelity's paired-K
        exp2 loop: -20% time at Wan2.2-14B for +1-2% rel-L2 on the video-like data (docs/kernel-notes.md section 38);
        config.FIDELITY's encoding. Kernels: sm90's refined fidelity kernels (backend_sm90.refinements_where); where a
        kernel lacks it the call runs "exp2" (a refinement: refinements_dropped).
    smooth_k: subtract the per-channel mean of K over tokens (softmax-invariant, always cheap).
    v_rank: with V-Smooth, a head-global rank-`v_rank` term taken out of the residual before its FP8
        rounding (reference.lowrank_basis, quantize_v_vsmooth); 0 (the default) is V-Smooth as the
        paper has it. Kernels: sm90 at head dim 128 (measured slower: opt-in, docs/kernel-notes.md 21).
    v_mean_rows: with V-Smooth, the permuted V rows one block mean covers: 128 (the paper's block, the
        K-scale block) or 256 (one mean per 256-key online-softmax step of the Hopper kernel, whose fold
        then restores one mean per step instead of two: 4-5% of the speed kernel's time for +1.5% rel-L2
        on the video-like data; the speed mode's choice, docs/kernel-notes.md section 24). The operands
        keep one mean per 128 keys either way (equal in pairs at 256), so every kernel reads them alike.
    v_mean_merge: with v_mean_rows 256, merge consecutive 256-row blocks whose means agree into segments
        with one mean each (reference.vsmooth_segments): a cluster-sorted V's runs become the segments,
        and the Hopper speed loop restores a mean only at segment ends (docs/fidelity-study.md, "V-Smooth
        segments"; docs/kernel-notes.md section 26: -3.8% at Wan2.2-14B, same error). The operands still hold
        one mean per 128 keys. config.SPEED merges; with_rank() turns it off for a low-rank term. Head dim
        128 only (reference.SEGMENT_HEAD_DIMS): at 64 every kernel restores per tile, segments would not pay.
    k_scale_rows: keys per K scale (INT8 or FP8): 128 (one per key tile) or 256 (one per 256-key online-softmax step
        of the Hopper speed loop, which then takes one row maximum, one row constant and one clamp bound per
        row and step instead of two: loop trip 971 -> 916 instructions, kernel -3.7% at Wan2.2-14B,
        docs/kernel-notes.md section 27; the rel-L2 on the video-like data unchanged within its noise,
        docs/fidelity-study.md). With ExpCast 256 goes with
        the speed loop's other pairing, v_mean_rows=256 and v_rank=0 (config.SPEED has all three): the loop
        that pairs the means is the one that pairs the K scales (backend_sm90.vsmooth_mode); exp2 P (no per-step
        anchor) takes it with 128-row means too: config.FIDELITY does, and the Hopper exp2 loop then reads one K scale
        per step (no spills, -2.5% at Wan2.2-14B: docs/kernel-notes.md sections 29-30; emulated error-neutral,
        docs/fidelity-study.md). V-Smooth only (its loops are the ones that pair). The operands keep one K scale per
        128 keys (equal in pairs at 256), so every kernel reads them alike. Head dim 128 only (reference.k_scale_rows,
        as the segments): at 64 every kernel steps 128 keys with a scale per tile.
    k_lane_scales: one INT8 K scale per (K-scale block, MMA quad lane) instead of per block, the keys of every full
        128-key block reordered (K and V together) by their smoothed K's amax so each lane holds one quartile
        (kernels/k_lanes.py: free in the softmax, each lane already holds its own row constant; emulated rel-L2 -2.4% /
        -1.8% in fidelity mode and -3.1% / -1.9% in speed mode at 32,760 / 75,600 tokens, docs/fidelity-study.md "K
        scales per MMA lane"). INT8 QK, V-Smooth, K scales per 256 keys and no low-rank term (the loops that implement
        it: both kernels' paired-K loops); head dim 128 only (reference.k_lanes, as k_scale_rows). The operands'
        k_scale is then (B,H,n_pad/128,4). config.SPEED takes it (measured on an H100 with the real kernels, with 128 x 1
        grouping and 8 bins: speed's rel-L2 1.127x / 1.107x fidelity's at 32,760 / 75,600 tokens instead of 1.181x /
        1.173x, at +1.7% of speed's call at Wan2.2-14B; the balanced preset's 64 x 2 with 8 bins measured 1.127x /
        1.113x, the speed preset's 64 x 1 1.148x / 1.144x: docs/kernel-notes.md sections 42-43); config.FIDELITY does not (its error target is met without the lanes'
        prepare pass and K read).
    v_lo_channels: with V-Smooth, this many channels per head (0, 16, 30 or 32) keep the E4M3 rounding error of their
        residual as a second E4M3 term with the same scale (reference.quantize_v_vsmooth: hi + lo, ~2^-8 relative
        instead of 2^-4), the channels with the largest residual energy (reference.v_lo_channel_policy). The V term is
        most of the output error: emulated rel-L2 -5% (16) / -10% (32) on the video-like data at 32,760 and 75,600
        tokens (docs/fidelity-study.md "A second E4M3 term for the residual's busiest channels"). A kernel pays one
        narrow PV MMA more per step (n = 16 / 32 next to n = D + 8). The CUDA prepare writes it (prepare_cuda,
        csrc/prepare_v_lo.cuh); sm90's refined fidelity kernels take constants.SM90_V_LO_CHANNELS (measured: rel-L2
        -11% at 32,760 and 75,600 tokens, +19% time alone, docs/kernel-notes.md section 38); config.FIDELITY takes 30
        (section 42: the step's row sums in the term's 32-row box).
        Where a kernel lacks it the call runs without it (a refinement: refinements_dropped; the portable kernel).
    """

    qk: str = "int8"
    v: str = "vsmooth"
    p: str = "exp2"
    smooth_k: bool = True
    v_rank: int = 0
    v_mean_rows: int = V_BLOCK
    v_mean_merge: bool = False
    k_scale_rows: int = K_BLOCK
    k_lane_scales: bool = False
    v_lo_channels: int = 0

    def __post_init__(self) -> None:
        if self.qk not in QK_FORMATS:
            raise ValueError(f"VCConfig.qk must be one of {QK_FORMATS}, got {self.qk!r}.")
        if self.v not in V_FORMATS:
            raise ValueError(f"VCConfig.v must be one of {V_FORMATS}, got {self.v!r}.")
        if self.p not in P_ENCODINGS:
            raise ValueError(f"VCConfig.p must be one of {P_ENCODINGS}, got {self.p!r}.")
        if isinstance(self.v_rank, bool) or not isinstance(self.v_rank, int) or not 0 <= self.v_rank <= MAX_V_RANK:
            raise ValueError(f"VCConfig.v_rank must be an integer from 0 to {MAX_V_RANK}, got {self.v_rank!r}.")
        if self.v_rank and self.v != "vsmooth":
            raise ValueError(f"VCConfig.v_rank needs v='vsmooth' (the term is taken out of its residual), got v={self.v!r}.")
        if isinstance(self.v_mean_rows, bool) or self.v_mean_rows not in V_MEAN_ROWS:
            raise ValueError(f"VCConfig.v_mean_rows must be one of {V_MEAN_ROWS}, got {self.v_mean_rows!r}.")
        if self.v_mean_rows != V_BLOCK and self.v != "vsmooth":
            raise ValueError(f"VCConfig.v_mean_rows={self.v_mean_rows} needs v='vsmooth' (per-channel V has no block means), "
                             f"got v={self.v!r}.")


        if not isinstance(self.v_mean_merge, bool):
            raise ValueError(f"VCConfig.v_mean_merge must be True or False, got {self.v_mean_merge!r}.")
        if self.v_mean_merge and (self.v != "vsmooth" or self.v_mean_rows != 2 * V_BLOCK or self.v_rank):
            raise ValueError("VCConfig.v_mean_merge merges 256-row V-Smooth means: it needs v='vsmooth', "
                             f"v_mean_rows={2 * V_BLOCK} and v_rank=0, got v={self.v!r}, v_mean_rows={self.v_mean_rows}, "
                             f"v_rank={self.v_rank}.")

        if isinstance(self.k_scale_rows, bool) or self.k_scale_rows not in K_SCALE_ROWS:
            raise ValueError(f"VCConfig.k_scale_rows must be one of {K_SCALE_ROWS}, got {self.k_scale_rows!r}.")
        # ExpCast anchors each step's codes at the step's K-scale block (reference.quantize_p): the loop that
        # pairs the K scales is the speed loop that pairs the means. exp2 P has no anchor, so fidelity mode may
        # pair the K scales with 128-row means (the exp2 256-key loop of VC_SM90_KPAIR_EXP2 builds)
        if self.k_scale_rows != K_BLOCK and (self.v_rank or (self.p not in EXP2_FAMILY and self.v_mean_rows != 2 * V_BLOCK)):
            raise ValueError(f"VCConfig.k_scale_rows={self.k_scale_rows} pairs the K scales of the Hopper kernel's "
                             f"256-key steps as v_mean_rows={2 * V_BLOCK} pairs the means: it needs v_mean_rows="
                             f"{2 * V_BLOCK} (or p='exp2' / 'mixed') and v_rank=0, got p={self.p!r}, v_mean_rows={self.v_mean_rows}, "
                             f"v_rank={self.v_rank}.")
        # the loops that read paired K scales are V-Smooth's (per-channel V runs the per-tile loops everywhere)
        if self.k_scale_rows != K_BLOCK and self.v != "vsmooth":
            raise ValueError(f"VCConfig.k_scale_rows={self.k_scale_rows} needs v='vsmooth' (the Hopper loops that take one "
                             f"K scale per 256-key step are V-Smooth's), got v={self.v!r}.")

        if not isinstance(self.k_lane_scales, bool):
            raise ValueError(f"VCConfig.k_lane_scales must be True or False, got {self.k_lane_scales!r}.")
        # the loops that read lane scales are the paired-K V-Smooth loops at head dim 128 (INT8 scores)
        if self.k_lane_scales and (self.qk != "int8" or self.v != "vsmooth" or self.k_scale_rows != 2 * K_BLOCK
                                   or self.v_rank):
            raise ValueError("VCConfig.k_lane_scales=True needs qk='int8', v='vsmooth', k_scale_rows="
                             f"{2 * K_BLOCK} and v_rank=0 (the Hopper paired-K loops read lane scales), got qk={self.qk!r}, "
                             f"v={self.v!r}, k_scale_rows={self.k_scale_rows}, v_rank={self.v_rank}.")

        if isinstance(self.v_lo_channels, bool) or self.v_lo_channels not in V_LO_CHANNELS:
            raise ValueError(f"VCConfig.v_lo_channels must be one of {V_LO_CHANNELS}, got {self.v_lo_channels!r}.")
        if self.v_lo_channels and (self.v != "vsmooth" or self.v_rank):
            raise ValueError("VCConfig.v_lo_channels keeps a second E4M3 term of the V-Smooth residual: it needs "
                             f"v='vsmooth' and v_rank=0, got v={self.v!r}, v_rank={self.v_rank}.")

    def with_(self, **changes) -> "VCConfig":
        return replace(self, **changes)

    def with_rank(self, v_rank: int) -> "VCConfig":
        """This configuration with a rank-`v_rank` low-rank V term (0: none). V-Smooth segments take no
        low-rank term, and the low-rank loop anchors each 128-key tile on its own, so a rank > 0 turns
        v_mean_merge off and k_scale_rows back to 128 (the 256-row means stay), and the residual's second term
        (v_lo_channels) off."""
        return replace(self, v_rank=v_rank, v_mean_merge=self.v_mean_merge and not v_rank,
                       k_scale_rows=self.k_scale_rows if not v_rank else K_BLOCK,
                       k_lane_scales=self.k_lane_scales and not v_rank,
                       v_lo_channels=self.v_lo_channels if not v_rank else 0)

    def refinements_dropped(self) -> tuple["VCConfig", ...]:
        """This configuration, then what a backend without its refinements runs instead, most refined first.

        Refinements are fidelity extras that only some kernels have: the V residual's second term (v_lo_channels)
        and the mixed encoding (p="mixed", whose base is "exp2"). A backend that lacks one runs the call without
        it (backends.runnable_config) rather than leaving it to the slow emulation or the model's attention: a
        preset that carries them keeps its kernel on every GPU, each running the most of it that it has."""
        if not self.has_refinements:  # (select calls this per attention call: build nothing when there is nothing to drop)
            return (self,)
        # the chain is built once per configuration: each replace() runs __post_init__'s checks, and rebuilding it on
        # every call was most of a refined call's selection time (docs/kernel-notes.md section 44); the caller's own
        # object comes first
        return (self, *_dropped_after(self))

    def without_refinements(self) -> "VCConfig":
        """What a kernel with neither refinement runs: no second V term, "exp2" for "mixed" (refinements_dropped's
        last); the configuration itself when it has none."""
        if not self.has_refinements:
            return self
        return _dropped_after(self)[-1]

    @property
    def has_refinements(self) -> bool:
        """Whether refinements_dropped has more than this configuration (cheap: no configuration is built)."""
        return self.v_lo_channels != 0 or self.p == "mixed"

    @property
    def needs_grouping(self) -> bool:
        return self.v == "vsmooth"

    @property
    def tag(self) -> str:
        """Short stable name, used in benchmark tables, stats and kernel instantiation keys."""
        return (f"{self.qk}-{self.v}-{self.p}" + ("" if self.smooth_k else "-nosmoothk")
                + (f"-rank{self.v_rank}" if self.v_rank else "")
                + (f"-mean{self.v_mean_rows}" if self.v_mean_rows != V_BLOCK else "")
                + ("-merged" if self.v_mean_merge else "")
                + (f"-k{self.k_scale_rows}" if self.k_scale_rows != K_BLOCK else "")
                + ("-lanes" if self.k_lane_scales else "")
                + (f"-lo{self.v_lo_channels}" if self.v_lo_channels else ""))


# The three configurations the product talks about. Fidelity takes one K scale per 256 keys (emulated error-neutral,
# docs/fidelity-study.md; the Hopper exp2 loop then keeps one score scale per row and step: kernel-notes section 30),
# and since section 38 the chord for every key on that loop with the V residual's second term (32 channels; 30 since
# section 42, the step's row sums in the term's box: constants.SM90_V_LO_CHANNELS): the
# adoption rule of section 36 (the fastest combination at or under 0.70x SageAttention 2.2's rel-L2 at 32,760 and
# 75,600 tokens) picked it on an H100: 0.653x / 0.681x (exp2 alone: 0.715x / 0.751x) at 143.6 against 139.7 ms at
# Wan2.2-14B 720p. Kernels without the refinements (the portable one) run it as p="exp2" without the term.
FIDELITY = VCConfig(qk="int8", v="vsmooth", p="mixed", k_scale_rows=2 * K_BLOCK, v_lo_channels=30)
SPEED = VCConfig(qk="int8", v="vsmooth", p="expcast", v_mean_rows=2 * V_BLOCK, v_mean_merge=True, k_scale_rows=2 * K_BLOCK,
                 k_lane_scales=True)
PLAIN_8BIT = VCConfig(qk="int8", v="per_channel", p="exp2")


@functools.lru_cache(maxsize=64)
def _dropped_after(config: VCConfig) -> tuple[VCConfig, ...]:
    """refinements_dropped(config) after config itself (frozen configurations: safe to share between calls)."""
    no_lo = replace(config, v_lo_channels=0)
    no_mixed = replace(config, p="exp2") if config.p == "mixed" else config
    base = replace(config, p="exp2" if config.p == "mixed" else config.p, v_lo_channels=0)  # (without_refinements)
    chain = (config, no_lo, no_mixed, base)
    return tuple(dict.fromkeys(chain))[1:]  # (in order, each once)
