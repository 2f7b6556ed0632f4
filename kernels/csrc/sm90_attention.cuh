// VC-Attention forward for Hopper (sm_90a): TMA + mbarrier pipeline, one producer warp, two (ping-pong)
// or three (serial loop) consumer warpgroups of 64 query rows, wgmma INT8 QK^T and FP8 PV with P from
// registers.
// Torch-free. Numerics follow kernels/reference.py exactly (see the comments at each step).
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <cstdint>

#include "p_encoding.cuh"
#include <type_traits>
#include "sm90_ptx.cuh"
#include "vc_constants.h"
#include "sm90_wgmma.cuh"

#ifndef VC_SM90_CONSUMERS
// consumer warpgroups per CTA (64 query rows each). 3: three softmax streams per scheduler instead of
// two, at 160 registers per consumer thread, which only the serial loop (VC_SM90_SERIAL) fits: both
// kernels were found latency-bound, not issue- or tensor-bound (docs/kernel-notes.md sections 16-17).
// The product library links both counts (VC_SM90_SPLIT in sm90_launch.cu)
#define VC_SM90_CONSUMERS 2
#endif

namespace vc_sm90 {
// The kernels' symbols carry the consumer count, so that the two- and the three-consumer builds link
// into one library without one template instantiation replacing the other.
#if VC_SM90_CONSUMERS == 3
inline namespace consumers3 {
#else
inline namespace consumers2 {
#endif

constexpr int kConsumers = VC_SM90_CONSUMERS;
static_assert(kConsumers == 2 || kConsumers == 3, "VC_SM90_CONSUMERS must be 2 or 3");
constexpr int kBlockM = 64 * kConsumers;  // query rows per CTA: one consumer warpgroup per 64 rows
constexpr int kBlockN = vc::kKBlock;  // keys per KV tile = K scale block = V-Smooth block
constexpr int kThreads = 128 * (kConsumers + 1);  // warpgroup 0: producer (one active warp); then the consumers
#ifndef VC_SM90_CONSUMER_REGS
#define VC_SM90_CONSUMER_REGS (kConsumers == 2 ? 240 : 160)
#endif
constexpr int kConsumerRegs = VC_SM90_CONSUMER_REGS;
constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;  // 168 (2 consumers) or 128 (3): the per-thread pool at launch
constexpr int kProducerRegs = (kLaunchRegs * kThreads - 128 * kConsumers * kConsumerRegs) / 128 / 8 * 8;  // the rest
static_assert(kProducerRegs >= 24, "setmaxnreg needs at least 24 registers per producer thread");

#ifndef VC_SM90_SERIAL
// The serial consumer loop (SageAttention's shape): QK(j), softmax(j), PV(j), fold(j), one wgmma batch in
// flight per warpgroup, so the PV accumulator can live in the registers of the dead scores. Default: with
// three consumers only.
#define VC_SM90_SERIAL (kConsumers == 3)
#endif
constexpr bool kSerial = VC_SM90_SERIAL;
static_assert(kSerial || kConsumers == 2, "three consumer warpgroups need the serial loop (VC_SM90_SERIAL=1)");

struct Params {
  const float* q_scale;  // (BH, n_pad): one scale per query row, sm_scale*log2(e) folded in
  const float* k_scale;  // (BH, n_pad/128)
  const float* v_scale;  // (BH, D): per-channel scale of the FP8 V residual
  const __half* v_mean;  // (BH, n_pad/128, D): V-Smooth block means (zeros for per-channel V)
  void* out;             // fp16/bf16, channel stride 1
  int64_t out_stride_b, out_stride_h, out_stride_n;  // in elements
  int heads, n, n_pad;
  // V-Smooth's low-rank term (the LOWRANK kernels): W (BH, v_rank, D) fp16 and the coefficient scales (BH, v_rank)
  const __half* v_low_basis;
  const float* v_low_scale;
  int v_rank;
  // V-Smooth segments (STEPMEAN kernels; VCConfig.v_mean_merge): (BH, n_pad/128) uint8, 1 on each segment's
  // last 128-key tile; nullptr: every 256-key step ends one (one mean per step)
  const uint8_t* v_seg_end;
  // the residual's second term (the VLO kernels: vc_attention_sm90_kernel_lo_chord): (BH, VLO) int32, the channel of
  // each v_lo_t row. Last, so that the other members keep their offsets in every kernel's parameters
  const int* v_lo_sel;
};


#ifndef VC_SM90_P_SMEM
#define VC_SM90_P_SMEM 0  // head dim 128: P through shared memory (0 off, 1 ExpCast only, 2 every P mode)
#endif

// Head dim 128 has no registers for a second P fragment set, so to overlap the softmax with its own
// PV the quantized P goes through shared memory (the PV wgmma reads A from there).
template <int D, bool EXPCAST>
constexpr bool p_through_smem() {
  return D == 128 && (VC_SM90_P_SMEM == 2 || (VC_SM90_P_SMEM == 1 && EXPCAST));
}

#ifndef VC_EXPCAST_CLAMP_CHECK
// speed: skip the per-element clamp when every score of the warp's rows is in range (one warp vote per
// tile; -2% at Wan2.2-14B and Wan2.1-1.3B, docs/kernel-notes.md section 14)
#define VC_EXPCAST_CLAMP_CHECK 1
#endif
#ifndef VC_EXPCAST_CLAMP_BOUND
// speed: before the clamp check's row minima, a bound that needs none: |score| <= 128 sum_d |q_d| (the INT8
// codes), from the CTA's Q tile once; where no code of that whole range can wrap (so the clamp changes nothing)
// the step encodes unclamped after one FFMA and compare per row and a vote (p_encoding.cuh); a_lo is then computed
// only where the step clamps. On by default since the H200 measured it (docs/kernel-notes.md section 35: speed
// -5.9% at Wan2.2-14B, -2.3% at Wan2.1-1.3B, -9% at head dim 64, same codes); -DVC_EXPCAST_CLAMP_BOUND=0 builds
// the previous check
#define VC_EXPCAST_CLAMP_BOUND 1
#endif
#ifndef VC_SM90_D64_OVERLAP
#define VC_SM90_D64_OVERLAP 1  // head dim 64 + ExpCast: the own-PV overlap (0: the single-stream loop)
#endif
#ifndef VC_SM90_D64_OVERLAP_ALL
#define VC_SM90_D64_OVERLAP_ALL 0  // head dim 64: own-PV overlap with two P register sets for exp2 P too
#endif

#ifndef VC_SM90_MEAN_MMA
#define VC_SM90_MEAN_MMA 2  // V-Smooth: block means by a TF32 wgmma every 8 tiles (1), per tile (0), auto (2)
#endif

// Whether V-Smooth restores the block means by the batched TF32 wgmma instead of the per-tile FMAs.
// Measured on the H200 (docs/kernel-notes.md sections 12 and 14): it pays at head dim 64 (ExpCast
// 15.6 -> 15.0 ms at (1,32,32768,64) with the float encoding; exp2 20.6 -> 19.3 ms, LTX 0.82 -> 0.76)
// and costs 6-10% at head dim 128 in every mode.
template <int D, bool EXPCAST, bool VSMOOTH>
constexpr bool mean_by_mma() {
  return VSMOOTH && (VC_SM90_MEAN_MMA == 2 ? D == 64 : VC_SM90_MEAN_MMA != 0);
}
constexpr int kMeanChunk = 8;  // tiles per batched mean restore = the K of one TF32 wgmma

#ifndef VC_SM90_PAIR
#define VC_SM90_PAIR 0  // head dim 128: two tiles per fresh PV accumulator, one fold per pair (variant)
#endif
// Pair accumulation (VC_SM90_PAIR=1, head dim 128, the single-stream loop): PV(2m) starts a fresh
// wgmma accumulator and PV(2m+1) adds to it, after the accumulator was rescaled by alpha of tile
// 2m+1 where that row's max moved; one fold per pair, O = alpha_a alpha_b O + PV + l_a mu_a + l_b mu_b:
// 1.5 FFMA per O element and tile instead of 2. The row sums of the two tiles stay apart because the
// extra B rows of a stage hold ones only in the columns of its parity (columns D + 2c + parity), and
// stage parity is tile parity (an even number of stages). The first tile's stage is released with the
// pair's fold (its block means are read then). The wgmma's reduced-precision accumulation runs over
// 256 keys instead of 128 (docs/kernel-notes.md section 14).
template <int D, bool EXPCAST, bool VSMOOTH, int STAGES>
constexpr bool pair_accumulation() {
  return VC_SM90_PAIR && D == 128 && STAGES % 2 == 0 && !p_through_smem<D, EXPCAST>() && !mean_by_mma<D, EXPCAST, VSMOOTH>();
}

#ifndef VC_SM90_STEP256
#define VC_SM90_STEP256 0  // head dim 128, two consumer warpgroups: online-softmax steps of 256 keys (product flag)
#endif
#ifndef VC_SM90_STEP256_EARLY_QK
#define VC_SM90_STEP256_EARLY_QK 0  // the 256-key loop issues the next step's first QK before its fold: 1, 2 ExpCast only (product: 2), 3 ExpCast and fidelity's paired-K exp2 kernels (variant)
#endif
#ifndef VC_SM90_STEP256_MAX_OVERLAP
#define VC_SM90_STEP256_MAX_OVERLAP 0  // early-QK loop: the first tile's max pass under the second tile's QK (variant)
#endif
#ifndef VC_SM90_STEPMEAN_EXP2
// 1 (variant): fidelity's exp2 256-key loop (the one without the early QK) gets the STEPMEAN kernels too: one
// V-Smooth mean per 256-key step restored at segment ends (fold_segment), for 256-row means (VCConfig
// v_mean_rows 256, v_mean_merge) with per-tile K scales; the fold's two means per step cost fidelity mode
// ~5% against plain 8-bit (docs/kernel-notes.md section 27)
#define VC_SM90_STEPMEAN_EXP2 0
#endif
#ifndef VC_SM90_KPAIR
// 1: the STEPMEAN kernels take one K scale per 256-key step (the prepare's K scales equal in 128-key pairs,
// VCConfig.k_scale_rows = 256): one row maximum, one row constant and one clamp bound per row and step
// instead of two (the product build sets it, backend_sm90.CUDA_FLAGS: -3.7% at Wan2.2-14B, docs/kernel-notes.md
// section 27; backend_sm90.vsmooth_mode asks for these kernels only where the K scales are paired)
#define VC_SM90_KPAIR 0
#endif
#ifndef VC_SM90_KPAIR_EXP2
// 1: fidelity's exp2 256-key loop (the two-mean fold, V-Smooth at head dim 128) is also built with one K scale
// per 256-key step (KPAIR kernels), which the forward runs where its caller says the K scales are equal in
// 128-key pairs (vsmooth bit kVsmoothPairedK: VCConfig.k_scale_rows = 256, config.FIDELITY; emulated
// error-neutral in fidelity mode, docs/fidelity-study.md); per-tile K scales keep the kernel without it. One
// score scale and one row max per row and step instead of two, so ptxas keeps the loop in registers (36 B of
// spills -> 0, loop trip 1017 -> 992 instructions; Wan2.2-14B kernel -2.5%: docs/kernel-notes.md sections 29-30)
#define VC_SM90_KPAIR_EXP2 0
#endif
#ifndef VC_SM90_EXP2_CHORD_EIGHTHS
// C in 1..8 (variant; reference p="mixed", reference.mixed_chord_keys): the exp2 loops encode the last C eighths of
// every online-softmax step's keys with the speed chord (p_encoding.cuh, on the integer scores: one IMAD instead of
// I2FP + FFMA + MUFU.EX2) and the rest with exp2 + cast at row max 448: C/8 of fidelity's MUFU work and a third of
// its per-score instructions go (docs/kernel-notes.md section 36). The steps' key positions are static per k-step,
// so the split costs no select. 0 (default): exp2 for every key (p="exp2")
#define VC_SM90_EXP2_CHORD_EIGHTHS 0
#endif
// Even C only: the per-tile loops (head dim 64, and 128 without V-Smooth) step 128 keys, four 32-key k-steps. Built
// with the paired-K exp2 loop only (VC_SM90_KPAIR_EXP2, no VC_SM90_STEPMEAN_EXP2): with K scales per 256 keys the spec
// anchors the chord at the step's maximum, which the per-tile exp2 loops do not take
static_assert(VC_SM90_EXP2_CHORD_EIGHTHS >= 0 && VC_SM90_EXP2_CHORD_EIGHTHS <= 8 && VC_SM90_EXP2_CHORD_EIGHTHS % 2 == 0,
              "the chord takes 0, 2, 4, 6 or 8 eighths of a step");
static_assert(VC_SM90_EXP2_CHORD_EIGHTHS == 0 || (VC_SM90_KPAIR_EXP2 && !VC_SM90_STEPMEAN_EXP2),
              "the mixed encoding's builds take fidelity's paired-K exp2 loop (VC_SM90_KPAIR_EXP2=1, VC_SM90_STEPMEAN_EXP2=0)");
#ifndef VC_SM90_V_LO
// L in {16, 32} (variant; VCConfig.v_lo_channels, reference.quantize_v_vsmooth's lo_channels): fidelity's paired-K exp2
// kernels add the V-Smooth residual's second E4M3 term on L channels (operands v_lo_t, v_lo_sel). Its L rows ride after
// the ones rows of every V^T stage (one more TMA box), the PV MMA reads them too (m64n{136+L}k32, VC_SM90_LO_MERGED)
// into a fresh accumulator beside PV's, the fold keeps its running sum (L/2 FFMA per step), and the epilogue adds it
// to O's columns v_lo_sel. 0 (default): no second term (docs/kernel-notes.md sections 36, 39)
#define VC_SM90_V_LO 0
#endif
static_assert(VC_SM90_V_LO == 0 || VC_SM90_V_LO == 16 || VC_SM90_V_LO == 30 || VC_SM90_V_LO == 32,
              "the residual's second term: 16, 30 or 32 channels");
#ifndef VC_SM90_LO_MERGED
// 1 (default): the kernels with the residual's second term issue it inside the PV MMA, one m64n{136+L}k32 wgmma per
// k-step over the stage's V^T, ones and term rows (adjacent in shared memory) instead of the m64n136 PV MMA and an
// m64nLk32 beside it: the same tensor work, accumulator registers and output bits, one wgmma less per k-step (the
// narrow one paid the A operand's register feed again for a fifth of the columns). Fidelity's kernel at Wan2.2-14B
// 140.4 -> 130.6 ms on an H100 (docs/kernel-notes.md section 39). 0 (variant): the two wgmmas
#define VC_SM90_LO_MERGED 1
#endif
// VLO = 30: the term on 30 channels beside the step's two row sums in one 32-row block after V^T, so the stage needs no
// 8 ones rows (6 of them zero columns in the 256-key loops): the TMA box brings the term's 30 rows right after V^T and
// the kernel writes rows 30 / 31 of the block once (E4M3 ones on even / odd stages = tiles). One m64n160k32 wgmma per
// k-step (n = 128 + 32 instead of 128 + 8 + 32: -4.8% of the PV tensor work) with the same operands as any term (the
// prepare's v_lo_t / v_lo_sel for 30 channels); the row sums come out in columns D + 30, D + 31 on lane t = 3 of each
// quad and reach the quad by 4 shuffles per step (as the low-rank term's); the block's columns 0..7 sit in the
// accumulator's last 4 registers, 8..31 in lo_acc (docs/kernel-notes.md section 40). Merged PV MMA only.
constexpr bool lo_sums_in_block(int vlo) { return vlo == 30; }
constexpr int lo_block_rows(int vlo) { return lo_sums_in_block(vlo) ? 32 : vlo; }  // the term's columns in the PV MMA
static_assert(!lo_sums_in_block(VC_SM90_V_LO) || VC_SM90_LO_MERGED, "30 channels beside the row sums: merged PV MMA only");
#ifndef VC_SM90_LO_RUN_REGS
// 1 (default): the second term's running sum stays in the consumer's registers (4 float4 slots, 16 registers at
// VLO = 32) in the chord's loop (CHORD > 0: fidelity's preset) instead of shared memory, so the step's fold is L/2 FFMA
// without the 4 LDS.128 + 4 STS.128 that waited behind the other warpgroup's PV reads of shared memory (ncu at
// Wan2.2-14B: the term added 0.27 short-scoreboard stall cycles per instruction); the epilogue stores the sum where the
// shared-memory one was. Fidelity's kernel at Wan2.2-14B 129.5 -> 124.9 ms, Wan2.1-1.3B 7.41 -> 7.03 on an H100, same
// gate (docs/kernel-notes.md section 41). The exp2 loop (CHORD = 0) keeps the shared-memory sum: in registers it spills
// (88 B). 0 (variant): shared memory everywhere
#define VC_SM90_LO_RUN_REGS 1
#endif
#ifndef VC_SM90_ALPHA_SKIP
// 1: the speed steps skip the rescale polynomial when no row of the warp moved its running max (warp vote;
// bit-identical: alpha is exactly 1 there either way). Variant, measured slower (docs/kernel-notes.md section 27).
#define VC_SM90_ALPHA_SKIP 0
#endif
#ifndef VC_SM90_STEP256_TURNS
#define VC_SM90_STEP256_TURNS 0  // 1: the 256-key loop's two warpgroups take turns issuing their wgmma batches
#endif
#ifndef VC_SM90_EXP2_KPAIR_PARTS
#define VC_SM90_EXP2_KPAIR_PARTS 2  // independent partial row maxima of fidelity's paired-K step (variant: 4)
#endif
#ifndef VC_SM90_SOFTMAX_TURNS
// 1 (variant): the exp2 256-key loop's two warpgroups take turns through the softmax itself, one at a time (named
// barriers 1 and 2, as VC_SM90_STEP256_TURNS), on the premise that both softmaxes share the MUFU pipe at once
// (2 x 130 MUFU.EX2 per scheduler and step, 8 cycles each) while the MMAs wait. Measured slower (+1.2% at
// Wan2.2-14B, docs/kernel-notes.md section 30): the softmax's time is its own warp's dependency chain, not the pipe.
#define VC_SM90_SOFTMAX_TURNS 0
#endif
// 256-key steps (VC_SM90_STEP256=1, head dim 128, two consumer warpgroups at 240 registers): one loop
// trip = QK of two 128-key tiles (two stages, one commit group), one online-softmax step over their 256
// scores (one running-max update, one alpha, one quad reduction per tile pair), PV of both tiles into
// one fresh accumulator, one fold restoring both tiles' V-Smooth means (fold_pair with alpha_b = 1; the
// two row sums stay apart through the stage-parity ones rows of pair accumulation). Per 128 keys that
// halves the per-step work that does not scale with the keys: the fold (2 -> 1.5 FFMA per O element
// with V-Smooth, 1 -> 0.5 without), the row max / alpha / row constants, the barrier and descriptor
// overhead. The loop is serial (the 128 score registers leave no room for an overlapped PV); the two
// warpgroups run free (VC_SM90_STEP256_TURNS=1: they take turns, measured slower in exp2 mode). The
// wgmma's reduced-precision accumulation runs over 256 keys before the float32 fold (as pair
// accumulation). Its exact emulation: reference offset_block = 256 (Backend.softmax_step_keys).
constexpr bool step256(int head_dim, int consumers, int stages) {
  return VC_SM90_STEP256 && head_dim == 128 && consumers == 2 && stages % 2 == 0;
}

// Whether a 256-key loop of this P mode issues the next step's first QK before its fold (VC_SM90_STEP256_EARLY_QK):
// 1 every mode, 2 ExpCast; 3 ExpCast and fidelity's paired-K exp2 kernels (kpair; its per-tile ones stay off it).
// One rule for the consumer loop (kEarlyQk) and the launcher's kernel choice (sm90_launch.cu).
constexpr bool early_qk_loop(bool expcast, bool kpair = false) {
  return VC_SM90_STEP256_EARLY_QK == 1 || (VC_SM90_STEP256_EARLY_QK >= 2 && expcast) ||
         (VC_SM90_STEP256_EARLY_QK == 3 && kpair);
}

// The low-rank V term (LOWRANK kernels: head dim 128 V-Smooth on the 256-key loops). The 8 extra B rows
// of every V^T stage come from the prepare's v_low_t by TMA instead of the ones written once: row D holds
// ones on even tiles, D + 1 on odd ones, rows D + 2 .. D + 7 the coefficient codes A of the tile's keys.
// So the PV MMA returns, at no extra tensor work, the row sums of the two tiles of a step in columns D
// and D + 1 (lane t = 0 of each quad) and sum_j P_j A_jk in columns D + 2 + k (lanes t = 1..3, two each),
// which each lane keeps in O's running scale; the epilogue adds (sum P A_q) W once.
// The kernels that can take the residual's second term (template VLO > 0): fidelity's paired-K exp2 kernels.
constexpr bool v_lo_kernel(bool expcast, bool vsmooth, bool lowrank, bool kpair) {
  return !expcast && vsmooth && !lowrank && kpair;
}
// What a build instantiates by default (launch's VLO and CHORD): VC_SM90_V_LO rows of the second term in the kernels
// that can take it, VC_SM90_EXP2_CHORD_EIGHTHS eighths of the chord in every exp2 kernel; 0 and 0 in the product.
constexpr int build_v_lo(bool expcast, bool vsmooth, bool lowrank, bool kpair) {
  return v_lo_kernel(expcast, vsmooth, lowrank, kpair) ? VC_SM90_V_LO : 0;
}
constexpr int build_chord(bool expcast) { return expcast ? 0 : VC_SM90_EXP2_CHORD_EIGHTHS; }
constexpr bool low_rank_loop(int head_dim, bool vsmooth, int consumers, int stages) {
  return vsmooth && step256(head_dim, consumers, stages);
}
#ifndef VC_SM90_LOWRANK_DIAG
// Timing diagnostics of the LOWRANK kernels (bench/sm90_variants.sh lr_* builds; the numbers are WRONG,
// never a product build), bits: 1 the row sums are not shuffled (each lane reads its own columns), 2 the
// running sums skip shared memory, 4 the extra rows are not loaded by TMA (the plain kernel's ones rows
// instead), 8 the epilogue adds no low-rank term.
#define VC_SM90_LOWRANK_DIAG 0
#endif

#ifndef VC_SM90_STEP256_MEAN_PV
#define VC_SM90_STEP256_MEAN_PV 0  // the 256-key loops restore a step's V-Smooth means in the next step's PV batch: 1 every P mode, 2 exp2 P only (variants)
#endif
// Deferred mean restore (VC_SM90_STEP256_MEAN_PV=1, the 256-key loops with V-Smooth): step m's fold is
// O = alpha O + PV without the two FFMAs per O element of l_a mu_a + l_b mu_b; instead step m+1's PV
// batch ends with one TF32 wgmma (m64n128k8, into the same fresh accumulator, after the FP8 ones) whose
// A column k holds alpha_{m+1} l of step m's tiles (TF32 hi / lo) and whose B row k holds their
// mu / v_scale (TF32 hi / lo): k = 4 parity + {0: hi x hi, 1: hi x lo, 2: lo x hi, 3: zero}, so the
// product is alpha_{m+1} (l_a mu_a + l_b mu_b) to ~2^-21 relative, in O's scale before the rescale.
// The producer writes that B tile (the means of tiles j - 2, j - 1, in the mean_b_offset layout) for
// the step of tiles j, j + 1 beside its stages; the loop's last pair step (and the odd tail tile)
// restore their own means with the FFMAs. Per 256 keys: -128 FFMA and -32 shared loads on the
// consumers' instruction stream for +1 TF32 wgmma (~1/8 of the step's PV tensor time). Measured slower
// on the H200 (speed +5.8%, fidelity +1.7% at Wan2.2-14B: the wgmma lengthens the PV batch the fold
// waits for; docs/kernel-notes.md section 20): a documented variant, default off.
template <int D, bool EXPCAST, bool VSMOOTH, int STAGES>
constexpr bool mean_in_pv() {
  return (VC_SM90_STEP256_MEAN_PV == 1 || (VC_SM90_STEP256_MEAN_PV == 2 && !EXPCAST)) && VSMOOTH &&
         step256(D, kConsumers, STAGES);
}

// The batched mean restore's B operand, mu/v_scale split into TF32 hi + lo (two K-major 128x8 or 64x8
// TF32 tiles per chunk, no swizzle): element (channel n, tile k) at 8-row group n/8 (256 bytes apart),
// 4-column half k/4 (128 bytes apart), then row n%8 (16 bytes) and column k%4 (4 bytes).
__device__ __forceinline__ int mean_b_offset(int n, int k) {
  return (n >> 3) * 256 + (k >> 2) * 128 + (n & 7) * 16 + (k & 3) * 4;
}

template <int D, int STAGES, bool PSMEM = false, bool MEANMMA = false, bool MEANPV = false, bool LOWRANK = false, int VLO = 0>
struct SmemLayout {
  static constexpr int kVLo = VLO;  // rows of the residual's second term after the ones rows (consumer_loop's VLO)
  static constexpr int kQBytes = kBlockM * D;
  static constexpr int kKBytes = kBlockN * D;
  static constexpr int kVLoadBytes = D * kBlockN;         // V^T rows written by TMA
  // + 8 rows of E4M3 ones (row sums) + VLO by TMA; lo_sums_in_block(VLO): 30 rows by TMA + the 2 row-sum rows
  static constexpr bool kLoSums = lo_sums_in_block(VLO);
  static constexpr int kLoBlockRows = lo_block_rows(VLO);
  static constexpr int kVBytes = kVLoadBytes + ((kLoSums ? 0 : 8) + kLoBlockRows) * kBlockN;
  static constexpr int kQOff = 0;
  static constexpr int kKOff = kQOff + kQBytes;
  static constexpr int kVOff = kKOff + STAGES * kKBytes;
  static constexpr int kMuOff = kVOff + STAGES * kVBytes;  // float [STAGES][D]: mean / v_scale
  // float [STAGES]: K tile scale; [STAGES][4] with K scales per lane (KLANES kernels: one per quad lane t)
  static constexpr int kKscOff = kMuOff + STAGES * D * 4;
  static constexpr int kBarOff = (kKscOff + STAGES * vc::kKLanes * 4 + 7) / 8 * 8;
  // P staging (PSMEM): per consumer warpgroup two 64x128 E4M3 tiles, 128B-swizzled like Q
  static constexpr int kPTileBytes = 64 * kBlockN;
  static constexpr int kPOff = (kBarOff + (1 + 2 * STAGES) * 8 + 1023) / 1024 * 1024;
  // MEANMMA: [2 chunks in flight][hi, lo] TF32 B tiles of D x 8; MEANPV: one D x 8 TF32 B tile per
  // pair of stages (the means the step of those stages restores: mean_in_pv)
  static constexpr int kMeanTileBytes = D * kMeanChunk * 4;
  static constexpr int kMeanTiles = MEANMMA ? 4 : (MEANPV ? STAGES / 2 : 0);
  static constexpr int kMeanOff = kPOff + (PSMEM ? 4 * kPTileBytes : 0);
  // MEANPV: float4 per consumer thread, the previous step's row sums (kept here, not in registers,
  // across the softmax, where every register is taken)
  static constexpr int kLPrevOff = kMeanOff + kMeanTiles * kMeanTileBytes;
  // LOWRANK: float4 per consumer thread, its running sum_j P_j A_jk (low_rank_columns: kept here, not in
  // registers, across the softmax: four more live registers made ptxas serialize the wgmmas, C7511)
  static constexpr int kLowOff = kLPrevOff + (MEANPV ? 128 * kConsumers * 16 : 0);
  static constexpr int kCoreBytes = (PSMEM || MEANMMA || MEANPV || LOWRANK) ? kLowOff + (LOWRANK ? 128 * kConsumers * 16 : 0)
                                                                            : kBarOff + (1 + 2 * STAGES) * 8;
  // VLO: int8 [D], each channel's column of the second term (-1: none), written by the producer before its first stage;
  // then float [consumer thread][VLO / 2], each consumer thread's running sum of the term: the exp2 loop's, across the
  // softmax (in registers it spills); the chord's loop keeps it in registers (VC_SM90_LO_RUN_REGS) and stores it here
  // for the epilogue
  static constexpr int kLoPosOff = kCoreBytes;
  static constexpr int kLoRunOff = (kLoPosOff + D + 15) / 16 * 16;
  static constexpr int kBytes = VLO ? kLoRunOff + 128 * kConsumers * (kLoBlockRows / 2) * 4 : kCoreBytes;
  static constexpr int kAlloc = kBytes + 1024;  // slack: tiles need 1024-byte (swizzle atom) alignment
  static_assert(kKBytes % 1024 == 0 && kVBytes % 1024 == 0 && kQBytes % 1024 == 0, "tile alignment");
};

// The shared-memory layout of one kernel instantiation.
template <int D, bool EXPCAST, bool VSMOOTH, int STAGES, bool LOWRANK = false, int VLO = 0>
using LayoutFor = SmemLayout<D, STAGES, p_through_smem<D, EXPCAST>(), mean_by_mma<D, EXPCAST, VSMOOTH>(),
                             mean_in_pv<D, EXPCAST, VSMOOTH, STAGES>(), LOWRANK, VLO>;

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// Round to the nearest TF32 (low 13 mantissa bits zero), ties away from zero.
__device__ __forceinline__ uint32_t tf32_round(float x) {
  uint32_t y;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Scores arrive as exact int32 dot products (|acc| <= 128*127*127 < 2^22: every conversion is exact).
__device__ __forceinline__ float int_to_float_exact(int32_t acc) { return static_cast<float>(acc); }  // I2FP

#ifndef VC_SM90_EXP2_POLY
#define VC_SM90_EXP2_POLY 0  // fidelity mode: how many of every 4 exp2 run on the FMA pipe (0..4)
#endif

// The online-softmax rescale alpha = 2^(M_old - M_new) of the exact running max: the speed path on
// the FMA pipe (vc_p::exp2_rescale: its loop keeps zero MUFU.EX2), fidelity mode by ex2.approx
// (2^-inf = 0 before the first tile, when O and l are still 0).
template <bool EXPCAST>
__device__ __forceinline__ float rescale_factor(float m_old, float m_new) {
  return EXPCAST ? vc_p::exp2_rescale(m_old - m_new) : ex2_approx(m_old - m_new);
}

__device__ __forceinline__ float exp2_split(float a, int k) { return k < VC_SM90_EXP2_POLY ? vc_p::exp2_poly(a) : ex2_approx(a); }

// Fidelity encoding: P = E4M3(exp2(s - M + 8)); `arg` = s - M + 8, four values packed low byte first.
__device__ __forceinline__ uint32_t encode_exp2(float a0, float a1, float a2, float a3) {
  return vc_p::cast_e4m3x4(exp2_split(a0, 3), exp2_split(a1, 2), exp2_split(a2, 1), exp2_split(a3, 0));
}

// fp16 output saturates at 65504, as reference.to_output_dtype: dequantized V can exceed the input's
// range by an FP8 rounding, and a plain cast gave inf where SDPA gives none. |NaN| > 65504 is false,
// so NaN stays NaN.
__device__ __forceinline__ float saturate_fp16(float x) { return fabsf(x) > 65504.f ? copysignf(65504.f, x) : x; }

template <typename OutT>
__device__ __forceinline__ void store_pair(OutT* dst, float a, float b);
template <>
__device__ __forceinline__ void store_pair<__half>(__half* dst, float a, float b) {
  *reinterpret_cast<__half2*>(dst) = __floats2half2_rn(saturate_fp16(a), saturate_fp16(b));
}
template <>
__device__ __forceinline__ void store_pair<__nv_bfloat16>(__nv_bfloat16* dst, float a, float b) {
  *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(a, b);
}

// Key index (within a 128-key tile) of accumulator column 8*chunk + 2*t + e. The K tile is loaded
// with the keys of every 16-row group reordered (see the 5-D tensor map in sm90_launch.cu) so that
// the S accumulator fragment IS the FP8 A fragment of the PV wgmma, with V^T in plain key order.
__device__ __forceinline__ int key_of_column(int chunk, int t, int e) {
  return 16 * (chunk >> 1) + 4 * t + 2 * (chunk & 1) + e;
}

#ifndef VC_SM90_MU_VEC4
// 1: the producer stores a tile's mean / v_scale in the folds' order (mu_slot), so that a thread reads the four
// channels of two consecutive 8-channel groups with one LDS.128 instead of two LDS.64 (variant, default off)
#define VC_SM90_MU_VEC4 0
#endif
// Where channel n's mean / v_scale sits in a stage's float [D] slot: channel order, or (VC_SM90_MU_VEC4) within
// each 16 channels the four of quad lane t (8i + 2t, + 1 for even i, then the same for i + 1) side by side.
__device__ __forceinline__ int mu_slot(int n) {
  if (!VC_SM90_MU_VEC4) return n;
  return (n & ~15) | (((n >> 1) & 3) << 2) | (((n >> 3) & 1) << 1) | (n & 1);
}
// mean / v_scale of channels 8i + 2t and 8i + 2t + 1 (the two O columns a thread holds per 8-channel group);
// with VC_SM90_MU_VEC4 the even and odd i of a pair come from one 16-byte load (ptxas merges the unrolled pair)
__device__ __forceinline__ float2 mu_pair(const float* mu, int i, int t) {
  if (!VC_SM90_MU_VEC4) return *reinterpret_cast<const float2*>(mu + 8 * i + 2 * t);
  const float4 q = *reinterpret_cast<const float4*>(mu + 16 * (i >> 1) + 4 * t);
  return (i & 1) ? make_float2(q.z, q.w) : make_float2(q.x, q.y);
}

template <int D, bool EXPCAST, bool VSMOOTH, int STAGES, typename L, bool LOWRANK, bool STEPMEAN = false, bool KLANES = false>
__device__ __forceinline__ void producer_loop(const CUtensorMap* tm_q, const CUtensorMap* tm_k,
                                              const CUtensorMap* tm_vt, const CUtensorMap* tm_vlow, const Params& p, uint8_t* smem,
                                              uint64_t* bar_q, uint64_t* bar_full, uint64_t* bar_empty) {
  const int lane = threadIdx.x % 32;
  const int bh = blockIdx.y;
  const int n_kv = p.n_pad / kBlockN;
  // The mean is restored as l_blk * (mu / v_scale) inside the scaled accumulator; the prepare
  // contract makes v_scale non-zero (1.0 for an all-zero residual channel).
  float inv_vs[D / 32];
#pragma unroll
  for (int c = 0; c < D / 32; ++c) inv_vs[c] = VSMOOTH ? 1.f / p.v_scale[static_cast<int64_t>(bh) * D + lane + 32 * c] : 0.f;
  if (lane == 0) {
    mbar_arrive_expect_tx(bar_q, L::kQBytes);
    tma_load_2d(smem + L::kQOff, tm_q, bar_q, 0, bh * p.n_pad + blockIdx.x * kBlockM);
  }
  float* mu_smem = reinterpret_cast<float*>(smem + L::kMuOff);
  float* ksc_smem = reinterpret_cast<float*>(smem + L::kKscOff);
  if constexpr (L::kVLo > 0) {  // each channel's column of the second term (-1: none), seen after the first full barrier
    int8_t* pos = reinterpret_cast<int8_t*>(smem + L::kLoPosOff);
    for (int c = lane; c < D; c += 32) pos[c] = -1;
    __syncwarp();
    // (distinct channels in [0, D): the operand contract; an index outside that range is dropped, never written)
    if (lane < L::kVLo) {
      const int c = p.v_lo_sel[static_cast<int64_t>(bh) * L::kVLo + lane];
      if (static_cast<unsigned>(c) < static_cast<unsigned>(D)) pos[c] = static_cast<int8_t>(lane);
    }
    __syncwarp();
  }
  for (int j = 0; j < n_kv; ++j) {
    const int s = j % STAGES;
    mbar_wait(&bar_empty[s], ((j / STAGES) & 1) ^ 1);
    const __half* mean = p.v_mean + (static_cast<int64_t>(bh) * n_kv + j) * D;
    if constexpr (mean_by_mma<D, EXPCAST, VSMOOTH>()) {
      // tile j is column j % 8 of chunk buffer (j / 8) % 2; the consumers read a chunk only after its last
      // tile's full barrier, and this buffer is rewritten only after tile j + 16 - STAGES was released
      uint8_t* hi = smem + L::kMeanOff + ((j / kMeanChunk) & 1) * 2 * L::kMeanTileBytes;
#pragma unroll
      for (int c = 0; c < D / 32; ++c) {
        const float mu = __half2float(mean[lane + 32 * c]) * inv_vs[c];
        const float mu_hi = __uint_as_float(tf32_round(mu));
        const int off = mean_b_offset(lane + 32 * c, j % kMeanChunk);
        *reinterpret_cast<float*>(hi + off) = mu_hi;
        *reinterpret_cast<float*>(hi + L::kMeanTileBytes + off) = mu - mu_hi;
      }
      fence_proxy_async();  // generic stores -> read by wgmma (async proxy) after the full barrier
    } else if (VSMOOTH) {
      // STEPMEAN: a step's second tile (odd j) carries mu_j - mu_{j+1}, the next pair step's mean subtracted
      // (zero after the last pair: an odd tail tile restores its own mean), for fold_segment's telescoped
      // restore; the first tile of a pair keeps its mean (the odd tail's fold_tile reads it)
      const bool minus_next = STEPMEAN && (j & 1) && j + 1 < n_kv - (n_kv & 1);
#pragma unroll
      for (int c = 0; c < D / 32; ++c) {
        float mu = __half2float(mean[lane + 32 * c]) * inv_vs[c];
        if (minus_next) mu -= __half2float(mean[D + lane + 32 * c]) * inv_vs[c];
        mu_smem[s * D + mu_slot(lane + 32 * c)] = mu;
      }
      if constexpr (mean_in_pv<D, EXPCAST, VSMOOTH, STAGES>()) {
        // rows 4 (j & 1) + 0..3 of the B tile of tile j's pair: the means of tile j - 2 (zeros before
        // tile 2: the first step's A is zero, and 0 x garbage could be NaN). The tile was last read by
        // the step of tiles j - STAGES, j - STAGES + 1, whose stages are released (bar_empty above)
        // only after that step's PV batch completed.
        uint8_t* b = smem + L::kMeanOff + ((j / 2) % (STAGES / 2)) * L::kMeanTileBytes;
        const __half* prev = mean - 2 * D;
#pragma unroll
        for (int c = 0; c < D / 32; ++c) {
          const float mu = j >= 2 ? __half2float(prev[lane + 32 * c]) * inv_vs[c] : 0.f;
          const float mu_hi = __uint_as_float(tf32_round(mu));
          const int n = lane + 32 * c, k = 4 * (j & 1);
          *reinterpret_cast<float*>(b + mean_b_offset(n, k)) = mu_hi;
          *reinterpret_cast<float*>(b + mean_b_offset(n, k + 1)) = mu - mu_hi;
          *reinterpret_cast<float*>(b + mean_b_offset(n, k + 2)) = mu_hi;
          *reinterpret_cast<float*>(b + mean_b_offset(n, k + 3)) = 0.f;
        }
        fence_proxy_async();  // generic stores -> read by wgmma (async proxy) after the full barrier
      }
    }
    // KLANES: lanes 0..3 each take one of the tile's four lane scales (k_scale (B,H,n_pad/128,4)), into [s][lane]
    if (lane < (KLANES ? vc::kKLanes : 1)) {
      float ksc = KLANES ? p.k_scale[(static_cast<int64_t>(bh) * n_kv + j) * vc::kKLanes + lane]
                         : p.k_scale[static_cast<int64_t>(bh) * n_kv + j];
      // STEPMEAN: the sign bit of a step's second tile's K scale (a scale is >= 0) says whether a V-Smooth
      // segment ends with that step (seg_end_of_step); no shared-memory layout change, no extra barrier
      if (STEPMEAN && (j & 1) && (p.v_seg_end == nullptr || p.v_seg_end[static_cast<int64_t>(bh) * n_kv + j]))
        ksc = __uint_as_float(__float_as_uint(ksc) | 0x80000000u);
      ksc_smem[KLANES ? vc::kKLanes * s + lane : s] = ksc;
    }
    __syncwarp();
    if (lane == 0) {
      constexpr bool kLowRows = LOWRANK && !(VC_SM90_LOWRANK_DIAG & 4);
      mbar_arrive_expect_tx(&bar_full[s], L::kKBytes + L::kVLoadBytes + (kLowRows ? vc::kVLowRows * kBlockN : 0) +
                                              L::kVLo * kBlockN);
      tma_load_5d(smem + L::kKOff + s * L::kKBytes, tm_k, &bar_full[s], 0, 0, 0, 0,
                  (bh * p.n_pad + j * kBlockN) / 16);
      tma_load_2d(smem + L::kVOff + s * L::kVBytes, tm_vt, &bar_full[s], j * kBlockN, bh * D);
      if constexpr (kLowRows)  // the extra B rows: parity ones + coefficient codes (one 128B-swizzle atom)
        tma_load_2d(smem + L::kVOff + s * L::kVBytes + L::kVLoadBytes, tm_vlow, &bar_full[s], j * kBlockN, bh * vc::kVLowRows);
      if constexpr (L::kVLo > 0)  // the residual's second term (v_lo_t through the same map slot): after the ones rows
        tma_load_2d(smem + L::kVOff + s * L::kVBytes + L::kVLoadBytes + (L::kLoSums ? 0 : 8 * kBlockN), tm_vlow, &bar_full[s], j * kBlockN,
                    bh * L::kVLo);
    }
  }
}

#ifndef VC_SM90_PINGPONG
#define VC_SM90_PINGPONG 2  // the two consumer warpgroups take turns issuing their wgmma batches: 1 always, 0 never, 2 auto
#endif

// Whether the two consumer warpgroups take turns (named barriers) issuing their wgmma batches. Measured
// on the H200 (docs/kernel-notes.md section 12): taking turns pays only where the per-tile softmax +
// fold stream is longest, head dim 128 with V-Smooth (speed 146.8 vs 155.4 ms at Wan2.2-14B); at head
// dim 64 (every P mode) and for per-channel V the free-running warpgroups were 2-4% faster.
template <int D, bool VSMOOTH>
constexpr bool take_turns() {
  // the turns are a two-party protocol (named barriers 1 and 2) around the overlapped loops' batches
  if (kConsumers != 2 || kSerial) return false;
  return VC_SM90_PINGPONG == 2 ? (D == 128 && VSMOOTH) : VC_SM90_PINGPONG != 0;
}

// Score scales of the thread's two rows g and g+8 (Q has one scale per row): q_scale * k_scale of the
// tile, the float32 product reference.scores_log2 takes.
struct RowScale {
  float r[2];
};
__device__ __forceinline__ RowScale operator*(const RowScale& q_sc, float k_sc) { return {{q_sc.r[0] * k_sc, q_sc.r[1] * k_sc}}; }

// One online-softmax step over H 128-key tiles (H = 1; H = 2: the 256-key steps of VC_SM90_STEP256)
// -> quantized P as FP8 A fragments (k-steps 4h..4h+3 from tile h). Updates the running offset M (the
// exact running max of the scaled scores over the step's keys, reference.running_row_offsets with
// offset_block = 128 H) and returns the rescale factor alpha = 2^(M_old - M_new) of each of the
// thread's two rows. Tile h's scores s[64h..64h+63] carry their own K scale (sc[h]); the speed
// encoding anchors each tile at its own largest integer score a0 (reference.quantize_p: block_row_max
// per K-scale block), so that a0 sc[h] <= M and the row constant T0 stays in range: anchored at the
// other tile's max, a K-scale ratio of 8 between the tiles overflowed T0 and zeroed the tile's codes.
// MASK: only the first `valid` keys of the step's last tile exist (the tail tile).
// between(): called once the first tile's row maxima are taken, before anything reads the second tile
// (the early-QK loop waits there for the second tile's QK: the first tile's max pass runs under it).
struct NoWait {
  __device__ __forceinline__ void operator()() const {}
};
// KPAIR (H = 2, ExpCast): both tiles carry the same K scale (sc[0] = sc[1]), so one integer row maximum over
// the step's 256 keys anchors both (reference.quantize_p with a 256-key K-scale block): one row constant and
// one clamp bound per row instead of two.
// KLANES (VCConfig.k_lane_scales): sc holds this lane's own K scale (one per quad lane t), so the integer row maxima
// stay per lane: each anchors its lane's speed codes (reference.quantize_p with lanes) and the quad reduces the row
// maximum in float, after the scale (float(max acc) * sc per lane, then the largest of the four: the spec's max).
// CHORD (exp2 only; reference p="mixed" with chord_eighths = CHORD): the last CHORD eighths of every online-softmax
// step's keys take the speed chord, the rest exp2 + cast at row max 448; 0: exp2 for every key (p="exp2").
// WKK (CHORD > 0): 32-key k-steps of the online-softmax step these tiles belong to (4 H; 8 for the odd last tile of a
// 256-key loop, the first half of its step): the chord takes its last eighths by position within the step
// (reference.mixed_chord_keys).
template <bool EXPCAST, bool MASK, int H, bool KPAIR = false, bool KLANES = false, int CHORD = 0, typename Between = NoWait,
          int WKK = 4 * H>
__device__ __forceinline__ void softmax_keys(const int32_t (&s)[64 * H], const RowScale (&sc)[H], int valid, int t,
                                             float (&row_off)[2], float (&alpha)[2], uint32_t (&pa)[4 * H][4],
                                             Between between = {}, const float* qbound = nullptr) {
  static_assert(H == 1 || H == 2, "one or two tiles per online-softmax step");
  static_assert(!KPAIR || H == 2, "a shared K scale pairs the two tiles of a 256-key step");
  static_assert(WKK >= 4 * H, "a step holds its tiles' k-steps");
  constexpr int HK = KPAIR ? 1 : H;  // K-scale blocks of the step
  auto hk = [](int h) { return KPAIR ? 0 : h; };
  // the mixed encoding (exp2 with CHORD > 0): k-steps from kFirstChordKk of the step on take the chord; this call's
  // k-step 4h + kk is the step's k-step 4h + kk (a lone tile is the first of its step)
  static_assert(CHORD >= 0 && CHORD <= 8 && (!EXPCAST || CHORD == 0), "the chord takes 0..8 eighths of an exp2 step");
  constexpr int kChordKk = EXPCAST ? 0 : CHORD * WKK / 8;
  static_assert(EXPCAST || CHORD * WKK % 8 == 0,
                "the chord's share of a step must be whole 32-key k-steps (the 128-key steps: even eighths)");
  constexpr int kFirstChordKk = WKK - kChordKk;
  constexpr bool kMixed = kChordKk > 0 && kFirstChordKk < 4 * H;  // some k-step of this call takes the chord
  constexpr bool kMixedBuild = !EXPCAST && CHORD > 0;  // every exp2 key at row max 448
  static_assert(!kMixed || !VC_EXPCAST_BYTE_CODES, "the mixed encoding's chord is the integer-score one");
  // the speed encoding works on the integer scores (p_encoding.cuh) unless a byte-code variant is built
  [[maybe_unused]] constexpr bool kIntCodes = (EXPCAST || kMixed) && !VC_EXPCAST_BYTE_CODES;
  // whether k-step kk of tile h is encoded by the chord (every one in speed mode)
  auto chord_kk = [](int h, int kk) { return EXPCAST || (kMixed && 4 * h + kk >= kFirstChordKk); };
  static_assert(H == 1 || !EXPCAST || !VC_EXPCAST_BYTE_CODES, "the byte-code ExpCast variants take one tile per step");
  // whether key column (c, e) of tile h is past the valid keys (only the step's last tile is partial)
  auto masked = [&](int h, int c, int e) { return MASK && h == H - 1 && key_of_column(c, t, e) >= valid; };
  // row max on the exact integers: float(acc) * sc is monotone in acc (sc >= 0), so the float max is
  // float(max acc) * sc, rounded exactly as the reference rounds it
  // independent partial maxima per row: a shallow tree instead of one 32-deep dependency chain. Four
  // in the speed path; two in fidelity mode, whose head-dim-128 V-Smooth kernel otherwise spills (its
  // two per-row score scales and two row constants are live through the encoding); VC_SM90_EXP2_KPAIR_PARTS
  // (variant): that many in fidelity's paired-K step, which has one score scale per row and no spills
  constexpr int kParts = EXPCAST ? 4 : (KPAIR ? VC_SM90_EXP2_KPAIR_PARTS : 2);
  int mx[HK][2];
  int part[2][kParts];
#pragma unroll
  for (int h = 0; h < H; ++h) {
    if (!KPAIR || h == 0) {
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int q = 0; q < kParts; ++q) part[r][q] = INT_MIN;
    }
#pragma unroll
    for (int c = 0; c < 16; ++c)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        if (!masked(h, c, e)) {
          part[0][(2 * c + e) % kParts] = max(part[0][(2 * c + e) % kParts], s[64 * h + 4 * c + e]);
          part[1][(2 * c + e) % kParts] = max(part[1][(2 * c + e) % kParts], s[64 * h + 4 * c + 2 + e]);
        }
    if (!KPAIR || h == H - 1) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        int& m = mx[hk(h)][r];
        m = max(part[r][0], part[r][1]);
        if constexpr (kParts == 4) m = max(m, max(part[r][2], part[r][3]));
        if constexpr (!KLANES) {
          m = max(m, __shfl_xor_sync(0xffffffff, m, 1));
          m = max(m, __shfl_xor_sync(0xffffffff, m, 2));
        }
      }
    }
    if (H == 2 && h == 0) between();
  }
  float base[2];
#if VC_EXPCAST_BYTE_CODES
  vc_p::ExpCastRow prow[2];
#else
  vc_p::ExpCastIntRow irow[HK][2];
#endif
  float m_step[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    m_step[r] = row_off[r];
#pragma unroll
    for (int h = 0; h < HK; ++h) {
      // KLANES: a lane without a valid key of the step (a tail tile) has no maximum (INT_MIN x a 0 scale would be -0)
      // (only a masked step can have one: the guard stays out of the full steps' code)
      const float lane_max = KLANES && MASK && mx[h][r] == INT_MIN ? neg_inf() : static_cast<float>(mx[h][r]) * sc[h].r[r];
      m_step[r] = fmaxf(m_step[r], lane_max);
    }
    if constexpr (KLANES) {  // the quad's four lanes, each with its own scale (row_off is the same in all four)
      m_step[r] = fmaxf(m_step[r], __shfl_xor_sync(0xffffffff, m_step[r], 1));
      m_step[r] = fmaxf(m_step[r], __shfl_xor_sync(0xffffffff, m_step[r], 2));
    }
  }
  if constexpr (EXPCAST && VC_SM90_ALPHA_SKIP) {
    // the running max of no row of the warp moved (most steps of a long row): alpha = 2^0 = 1 exactly, as
    // exp2_rescale(0) returns it, without the polynomial (one vote instead of ~24 instructions)
    const bool moved = m_step[0] != row_off[0] || m_step[1] != row_off[1];
    if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
      for (int r = 0; r < 2; ++r) alpha[r] = rescale_factor<EXPCAST>(row_off[r], m_step[r]);
    } else {
      alpha[0] = alpha[1] = 1.f;
    }
  } else {
#pragma unroll
    for (int r = 0; r < 2; ++r) alpha[r] = rescale_factor<EXPCAST>(row_off[r], m_step[r]);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float m_new = m_step[r];
    row_off[r] = m_new;
    // fidelity: arg = s + float32(8 - M), reference.p_exp2_cast; mixed builds: row max 448 for every exp2 key,
    // reference.p_exp2_cast_448, also in a call without chord keys (the odd last tile of a 256-key loop at C <= 4)
    base[r] = (kMixedBuild ? vc::kMixedPLog2Max : vc::kPLog2Max) - m_new;
#if VC_EXPCAST_BYTE_CODES
    prow[r] = vc_p::expcast_row(sc[0].r[r], m_new);
#else
#pragma unroll
    for (int h = 0; h < HK; ++h)
      if constexpr (kIntCodes) {  // reference.expcast_bits; the clamp-bound build takes a_lo only where it clamps
        constexpr bool kWithLo = !(VC_EXPCAST_CLAMP_BOUND && !MASK);
        irow[h][r] = KLANES && MASK ? vc_p::expcast_int_row_lane<kWithLo>(sc[h].r[r], mx[h][r], m_new)  // empty lanes: code 0
                                    : vc_p::expcast_int_row<kWithLo>(sc[h].r[r], mx[h][r], m_new);
      }
#endif
  }
  // register r of k-step kk holds row g (r even) or g+8 (r odd) at keys 32kk + 16(r/2) + 4t + 0..3,
  // which are the columns (c0, e=0), (c0, e=1), (c0+1, e=0), (c0+1, e=1) (see key_of_column)
  auto encode = [&](auto clamp_tag) {
    [[maybe_unused]] constexpr bool kClamp = decltype(clamp_tag)::value;
#pragma unroll
    for (int h = 0; h < H; ++h)
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int c0 = 4 * kk + 2 * (r >> 1), row = r & 1;
          float a[4];
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const int chunk = c0 + (q >> 1), e = q & 1;
            const bool off = masked(h, chunk, e);
            const int32_t acc = s[64 * h + 4 * chunk + 2 * row + e];
#if !VC_EXPCAST_BYTE_CODES
            if (kIntCodes && chord_kk(h, kk)) {  // one integer max + one IMAD on the raw accumulator; masked: code 0
              if constexpr (kClamp)
                a[q] = vc_p::expcast_int_float(off ? INT_MIN : acc, irow[hk(h)][row]);
              else
                a[q] = vc_p::expcast_int_float_unclamped(acc, irow[hk(h)][row]);
              continue;
            }
#endif
            const float x = int_to_float_exact(acc);
#if VC_EXPCAST_BYTE_CODES
            if constexpr (EXPCAST) {
              a[q] = off ? vc_p::expcast_masked_arg() : vc_p::expcast_arg(x, prow[row]);
              continue;
            }
#endif
            a[q] = off ? neg_inf() : fmaf(x, sc[hk(h)].r[row], base[row]);
          }
#if VC_EXPCAST_BYTE_CODES
          pa[4 * h + kk][r] = EXPCAST ? vc_p::expcast_pack4(a[0], a[1], a[2], a[3]) : encode_exp2(a[0], a[1], a[2], a[3]);
#else
          pa[4 * h + kk][r] = chord_kk(h, kk) ? vc_p::cast_e4m3x4(a[0], a[1], a[2], a[3]) : encode_exp2(a[0], a[1], a[2], a[3]);
#endif
        }
  };
#if !VC_EXPCAST_BYTE_CODES
  if constexpr (kIntCodes && !MASK && VC_EXPCAST_CLAMP_BOUND) {
    // *qbound >= |every score of the thread's two rows| (vc_p::int8_row_score_bound): where no code of any row and
    // K-scale block of the warp can wrap (vc_p::expcast_int_no_wrap, on the step's new running max), the clamp
    // changes nothing
    if (qbound != nullptr) {
      int in_range = 1;
#pragma unroll
      for (int hb = 0; hb < HK; ++hb)
#pragma unroll
        for (int r = 0; r < 2; ++r) in_range &= vc_p::expcast_int_no_wrap(*qbound, sc[hb].r[r], m_step[r]);
      if (__all_sync(0xffffffffu, in_range)) {
        encode(std::false_type{});
        return;
      }
    }
#pragma unroll
    for (int hb = 0; hb < HK; ++hb)
#pragma unroll
      for (int r = 0; r < 2; ++r) irow[hb][r].lo = vc_p::expcast_int_lo(sc[hb].r[r], mx[hb][r], m_step[r]);
  }
  if constexpr (kIntCodes && !MASK && VC_EXPCAST_CLAMP_CHECK) {
    // the clamp changes nothing when every score is >= a_lo: the thread's row minima, one vote per warp
    // (KPAIR: one minimum per row over both tiles, against the one bound)
    int lo_ok = 1;
#pragma unroll
    for (int hb = 0; hb < HK; ++hb)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        int mn = s[64 * hb + 2 * r];
#pragma unroll
        for (int h = hb; h < (KPAIR ? H : hb + 1); ++h)
#pragma unroll
          for (int c = 0; c < 16; ++c) mn = min(mn, min(s[64 * h + 4 * c + 2 * r], s[64 * h + 4 * c + 2 * r + 1]));
        lo_ok &= mn >= irow[hb][r].lo;
      }
    if (__all_sync(0xffffffffu, lo_ok)) {
      encode(std::false_type{});
      return;
    }
  }
#endif
  encode(std::true_type{});
}

// One 64x128 score tile (the loops that step the online softmax by one tile).
// WKK: the k-steps of the online-softmax step the tile belongs to (8: the odd last tile of a 256-key loop); CHORD:
// softmax_keys'
template <bool EXPCAST, bool MASK, bool KLANES = false, int WKK = 4, int CHORD = 0>
__device__ __forceinline__ void softmax_tile(const int32_t (&s)[64], const RowScale& sc, int valid, int t,
                                             float (&row_off)[2], float (&alpha)[2], uint32_t (&pa)[4][4],
                                             const float* qbound = nullptr) {
  const RowScale scs[1] = {sc};
  softmax_keys<EXPCAST, MASK, 1, false, KLANES, CHORD, NoWait, WKK>(s, scs, valid, t, row_off, alpha, pa, NoWait{}, qbound);
}

// O = alpha O + (P R + l_blk mu/v_scale);  l = alpha l + l_blk. The tile's P R comes from a fresh
// wgmma accumulator (FP8 wgmma accumulates at reduced precision), so this is the float32 level of
// the two-level sum. Columns D..D+7 of the tile accumulator are the row sums of the same P.
// l4: the row sums (row g: columns D, D + 1; row g + 8: the same), default the accumulator's own columns.
template <int D, bool VSMOOTH>
__device__ __forceinline__ void fold_tile(float (&o)[D / 2], float (&row_sum)[2], const float (&pv)[D / 2 + 4],
                                          const float (&alpha)[2], const float* mu, int t, const float* l4 = nullptr) {
  const float l_blk[2] = {l4 ? l4[0] : pv[D / 2], l4 ? l4[2] : pv[D / 2 + 2]};
#pragma unroll
  for (int i = 0; i < D / 8; ++i) {
    float2 m2 = make_float2(0.f, 0.f);
    if constexpr (VSMOOTH) m2 = mu_pair(mu, i, t);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if constexpr (VSMOOTH) {
        o[4 * i + 2 * r] = fmaf(o[4 * i + 2 * r], alpha[r], fmaf(l_blk[r], m2.x, pv[4 * i + 2 * r]));
        o[4 * i + 2 * r + 1] = fmaf(o[4 * i + 2 * r + 1], alpha[r], fmaf(l_blk[r], m2.y, pv[4 * i + 2 * r + 1]));
      } else {
        o[4 * i + 2 * r] = fmaf(o[4 * i + 2 * r], alpha[r], pv[4 * i + 2 * r]);
        o[4 * i + 2 * r + 1] = fmaf(o[4 * i + 2 * r + 1], alpha[r], pv[4 * i + 2 * r + 1]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) row_sum[r] = fmaf(row_sum[r], alpha[r], l_blk[r]);
}

#ifndef VC_SM90_STEP_MEAN_DIAG
// 1: the 256-key loops restore no V-Smooth mean at all: a timing bound (WRONG numbers; bench/sm90_variants.sh
// split_m0), never a product build.
#define VC_SM90_STEP_MEAN_DIAG 0
#endif

// The fold of a pair (pair_accumulation): pv holds alpha_b PV_a + PV_b, its columns D + 2t and
// D + 2t + 1 the row sums alpha_b l_a and l_b; O = alpha_a alpha_b O + pv + l_a mu_a + l_b mu_b.
// MEANS = 1 (STEPMEAN kernels: the prepare's V-Smooth means are equal in 128-row pairs, VCConfig.v_mean_rows
// = 256): O = alpha_a alpha_b O + pv + (l_a + l_b) mu_a, 2 FFMA and one LDS.64 per O element pair instead of
// 3 and two (speed kernel -4.4% at Wan2.2-14B, docs/kernel-notes.md section 24). MEANS = 0: the diagnostic.
template <int D, bool VSMOOTH, int MEANS = 2>
__device__ __forceinline__ void fold_pair(float (&o)[D / 2], float (&row_sum)[2], const float (&pv)[D / 2 + 4],
                                          const float (&alpha_a)[2], const float (&alpha_b)[2], const float* mu_a,
                                          const float* mu_b, int t, const float* l4 = nullptr) {
  const float ab[2] = {alpha_a[0] * alpha_b[0], alpha_a[1] * alpha_b[1]};
  const float* l = l4 ? l4 : &pv[D / 2];
  const float l_a[2] = {l[0], l[2]}, l_b[2] = {l[1], l[3]};
#pragma unroll
  for (int i = 0; i < D / 8; ++i) {
    float2 ma = make_float2(0.f, 0.f), mb = make_float2(0.f, 0.f);
    if constexpr (VSMOOTH && MEANS == 2) {
      ma = mu_pair(mu_a, i, t);
      mb = mu_pair(mu_b, i, t);
    } else if constexpr (VSMOOTH && MEANS == 1) {
      ma = mu_pair(mu_a, i, t);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if constexpr (VSMOOTH && MEANS == 1) {
        const float l_ab = l_a[r] + l_b[r];
        o[4 * i + 2 * r] = fmaf(o[4 * i + 2 * r], ab[r], fmaf(l_ab, ma.x, pv[4 * i + 2 * r]));
        o[4 * i + 2 * r + 1] = fmaf(o[4 * i + 2 * r + 1], ab[r], fmaf(l_ab, ma.y, pv[4 * i + 2 * r + 1]));
      } else if constexpr (VSMOOTH && MEANS == 0) {
        o[4 * i + 2 * r] = fmaf(o[4 * i + 2 * r], ab[r], pv[4 * i + 2 * r]);
        o[4 * i + 2 * r + 1] = fmaf(o[4 * i + 2 * r + 1], ab[r], pv[4 * i + 2 * r + 1]);
      } else if constexpr (VSMOOTH) {
        o[4 * i + 2 * r] = fmaf(o[4 * i + 2 * r], ab[r], fmaf(l_a[r], ma.x, fmaf(l_b[r], mb.x, pv[4 * i + 2 * r])));
        o[4 * i + 2 * r + 1] = fmaf(o[4 * i + 2 * r + 1], ab[r], fmaf(l_a[r], ma.y, fmaf(l_b[r], mb.y, pv[4 * i + 2 * r + 1])));
      } else {
        o[4 * i + 2 * r] = fmaf(o[4 * i + 2 * r], ab[r], pv[4 * i + 2 * r]);
        o[4 * i + 2 * r + 1] = fmaf(o[4 * i + 2 * r + 1], ab[r], pv[4 * i + 2 * r + 1]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) row_sum[r] = fmaf(row_sum[r], ab[r], l_a[r] + l_b[r]);
}

// A 256-key step's fold without a mean: O = alpha O + pv, l = alpha l + l_a + l_b (the step's two row-sum
// columns of pv, D + 2t and D + 2t + 1 per row).
template <int D>
__device__ __forceinline__ void rescale_add_step(float (&o)[D / 2], float (&row_sum)[2], const float (&pv)[D / 2 + 4],
                                                 const float (&alpha)[2]) {
#pragma unroll
  for (int i = 0; i < D / 8; ++i)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      o[4 * i + 2 * r] = fmaf(o[4 * i + 2 * r], alpha[r], pv[4 * i + 2 * r]);
      o[4 * i + 2 * r + 1] = fmaf(o[4 * i + 2 * r + 1], alpha[r], pv[4 * i + 2 * r + 1]);
    }
#pragma unroll
  for (int r = 0; r < 2; ++r) row_sum[r] = fmaf(row_sum[r], alpha[r], pv[D / 2 + 2 * r] + pv[D / 2 + 2 * r + 1]);
}

// STEPMEAN with V-Smooth segments: the fold of a step, O = alpha O + pv, l = alpha l + l_a + l_b, and at
// a segment end (warp-uniform: the producer's flag) O += l (mu_seg - mu_next), mu_next the next segment's
// mean (0 after the last pair step; the producer writes the difference into the step's second stage). The
// telescoped sum is the per-segment restore sum_seg L_seg mu_seg (L_seg = the segment's row sums of P in
// O's scale: l at its end minus l at its start) with no register for L: one mean FFMA per O element per
// segment end, not per step. Every 256-key step ends a segment when the prepare gives no segments (speed
// mode's 256-row means: the MEANS = 1 fold's cost). docs/kernel-notes.md section 26.
template <int D>
__device__ __forceinline__ void fold_segment(float (&o)[D / 2], float (&row_sum)[2], const float (&pv)[D / 2 + 4],
                                             const float (&alpha)[2], const float* mu_diff, int t, bool seg_end) {
  rescale_add_step<D>(o, row_sum, pv, alpha);
  if (seg_end) {
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
      const float2 m = mu_pair(mu_diff, i, t);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        o[4 * i + 2 * r] = fmaf(row_sum[r], m.x, o[4 * i + 2 * r]);
        o[4 * i + 2 * r + 1] = fmaf(row_sum[r], m.y, o[4 * i + 2 * r + 1]);
      }
    }
  }
}

// Whether the step whose second tile's K scale is `ksc` ends a V-Smooth segment (the producer's sign bit).
__device__ __forceinline__ bool seg_end_of_step(float ksc) { return (__float_as_uint(ksc) >> 31) != 0; }

// LOWRANK, before the fold of a step: this lane's two extra columns (sum_j P_j A_jk for lanes t = 1..3)
// into its running sums (shared memory, (row g: k, k + 1; row g + 8: k, k + 1); O's scale: rescaled by
// alpha like O), then the step's row sums (columns D and D + 1 of lane t = 0) to every lane of the quad
// (into l4, for fold_pair / fold_tile: shuffled in place into the accumulator, ptxas serialized the wgmmas).
template <int D>
__device__ __forceinline__ void low_rank_columns(const float (&pv)[D / 2 + 4], const float (&alpha)[2], float4* lr_slot,
                                                 float (&l4)[4]) {
  if (!(VC_SM90_LOWRANK_DIAG & 2)) {
    float4 lr = *lr_slot;
    lr.x = fmaf(lr.x, alpha[0], pv[D / 2]);
    lr.y = fmaf(lr.y, alpha[0], pv[D / 2 + 1]);
    lr.z = fmaf(lr.z, alpha[1], pv[D / 2 + 2]);
    lr.w = fmaf(lr.w, alpha[1], pv[D / 2 + 3]);
    *lr_slot = lr;
  }
  const int quad = (threadIdx.x & 31) & ~3;
#pragma unroll
  for (int i = 0; i < 4; ++i) l4[i] = (VC_SM90_LOWRANK_DIAG & 1) ? pv[D / 2 + i] : __shfl_sync(0xffffffffu, pv[D / 2 + i], quad);
}

// mean_in_pv: the fold of a step whose V-Smooth means the next step's PV batch restores: O = alpha O + pv,
// l = alpha l + l_a + l_b, and the step's row sums kept for that batch (l_prev[row][tile]).
template <int D>
__device__ __forceinline__ void fold_step_deferred(float (&o)[D / 2], float (&row_sum)[2], const float (&pv)[D / 2 + 4],
                                                   const float (&alpha)[2], float4* l_prev_slot) {
  rescale_add_step<D>(o, row_sum, pv, alpha);
  *l_prev_slot = make_float4(pv[D / 2], pv[D / 2 + 1], pv[D / 2 + 2], pv[D / 2 + 3]);
}

// mean_in_pv: the A fragment of the deferred restore's TF32 wgmma. Register 2 slot + row holds A(row g
// + 8 row, k = 4 slot + t): slot 0 the previous step's first tile, slot 1 its second; k % 4 = t picks
// hi (t = 0, 1), lo (t = 2) or zero (t = 3) of l_prev, against the B rows mu hi, lo, hi, zero.
__device__ __forceinline__ void deferred_mean_a(uint32_t (&a)[4], const float4* l_prev_slot, const float (&alpha)[2],
                                                int t) {
  const float4 lp = *l_prev_slot;  // (row g: l_a, l_b; row g + 8: l_a, l_b)
  const float l_prev[2][2] = {{lp.x, lp.y}, {lp.z, lp.w}};
#pragma unroll
  for (int slot = 0; slot < 2; ++slot)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float x = alpha[r] * l_prev[r][slot];
      const uint32_t hi = tf32_round(x);
      const uint32_t lo = __float_as_uint(x - __uint_as_float(hi));
      a[2 * slot + r] = t < 2 ? hi : (t == 2 ? lo : 0u);
    }
}

// Before the second PV of a pair adds to the accumulator: its rows rescaled by the second tile's alpha
// where that row's max moved (alpha == 1 exactly where it did not: no work in the common case).
template <int D>
__device__ __forceinline__ void rescale_pair_accumulator(float (&pv)[D / 2 + 4], const float (&alpha)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (alpha[r] != 1.f) {
#pragma unroll
      for (int i = 0; i < D / 8 + 1; ++i) {
        pv[4 * i + 2 * r] *= alpha[r];
        pv[4 * i + 2 * r + 1] *= alpha[r];
      }
    }
  }
}

#ifndef VC_SM90_DESC_ADD
#define VC_SM90_DESC_ADD 0  // 1: one shared-memory descriptor per tile and operand, k-steps by an add
#endif

// Descriptor of k-step kk of a K-major tile: by default built from the address each time (5-6
// uniform-datapath instructions per wgmma operand, about 60 issue slots per tile at head dim 128:
// docs/kernel-notes.md section 12); with VC_SM90_DESC_ADD the tile's descriptor plus kk * 32 bytes in
// the start-address field (bits 0-13, address >> 4), which cannot carry out: shared memory < 256 KB.
template <int ROW_BYTES>
struct TileDesc {
  const uint8_t* tile;
  uint64_t base;
  __device__ __forceinline__ explicit TileDesc(const uint8_t* t) : tile(t), base(VC_SM90_DESC_ADD ? smem_desc(t, ROW_BYTES) : 0) {}
  __device__ __forceinline__ uint64_t k_step(int kk) const {
    if (!VC_SM90_DESC_ADD) return smem_desc(tile + kk * 32, ROW_BYTES);
    return (base & 0xFFFFFFFF00000000ull) | static_cast<uint32_t>(static_cast<uint32_t>(base) + 2u * kk);
  }
};

template <int D>
__device__ __forceinline__ void issue_qk(int32_t (&s_acc)[64], const uint8_t* q_tile, const uint8_t* k_tile) {
  const TileDesc<D> q(q_tile), k(k_tile);
#pragma unroll
  for (int kk = 0; kk < D / 32; ++kk) wgmma_s8_m64n128k32(s_acc, q.k_step(kk), k.k_step(kk), kk > 0);
}

template <int D>
__device__ __forceinline__ void issue_pv(float (&pv)[D / 2 + 4], const uint32_t (&pa)[4][4], const uint8_t* vt_tile,
                                         bool accumulate = false) {
  const TileDesc<128> v(vt_tile);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    if constexpr (D == 128)
      wgmma_e4m3_m64n136k32(pv, pa[kk], v.k_step(kk), kk > 0 || accumulate);
    else
      wgmma_e4m3_m64n72k32(pv, pa[kk], v.k_step(kk), kk > 0 || accumulate);
  }
}

template <int D>
__device__ __forceinline__ void issue_pv_smem(float (&pv)[D / 2 + 4], const uint8_t* p_tile, const uint8_t* vt_tile) {
  const TileDesc<128> pt(p_tile), v(vt_tile);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    if constexpr (D == 128)
      wgmma_e4m3_m64n136k32_ss(pv, pt.k_step(kk), v.k_step(kk), kk > 0);
    else
      wgmma_e4m3_m64n72k32_ss(pv, pt.k_step(kk), v.k_step(kk), kk > 0);
  }
}

// Descriptor of a no-swizzle K-major TF32 B tile in the mean_b_offset layout: core matrices (8 rows x
// 16 bytes) 128 bytes apart along K (leading byte offset), 256 bytes apart along N (stride byte offset).
__device__ __forceinline__ uint64_t mean_b_desc(const void* tile) {
  return ((uint64_t(smem_addr(tile)) & 0x3FFFF) >> 4) | (uint64_t(128 >> 4) << 16) | (uint64_t(256 >> 4) << 32);
}

template <int D>
__device__ __forceinline__ void issue_mean(float (&o)[D / 2], const uint32_t (&a)[4], const uint8_t* b_tile) {
  if constexpr (D == 128)
    wgmma_tf32_m64n128k8(o, a, mean_b_desc(b_tile));
  else
    wgmma_tf32_m64n64k8(o, a, mean_b_desc(b_tile));
}

// mean_in_pv: the deferred restore into the step's fresh PV accumulator (its first D columns; the
// row-sum columns D.. are not touched), issued after the FP8 wgmmas of the batch.
template <int D>
__device__ __forceinline__ void issue_deferred_mean(float (&pv)[D / 2 + 4], const uint32_t (&a)[4], const uint8_t* b_tile) {
  issue_mean<D>(*reinterpret_cast<float(*)[D / 2]>(&pv[0]), a, b_tile);
}



// The A fragments of P into a 64x128-byte tile in the 128B-swizzled K-major layout the wgmma
// descriptor reads (16-byte chunk c of row R at chunk c ^ (R % 8)). Register r of k-step kk holds
// row 16 warp + g + 8 (r & 1), keys 32 kk + 16 (r / 2) + 4t .. +3. Conflict-free: the 8 rows g of a
// store instruction hit 8 different chunks, the 4 t of a quad the 4 banks inside one.
__device__ __forceinline__ void store_p_tile(uint8_t* p_tile, const uint32_t (&pa)[4][4], int warp, int g, int t) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int row = 16 * warp + g + 8 * (r & 1), chunk = 2 * kk + (r >> 1);
      *reinterpret_cast<uint32_t*>(p_tile + row * 128 + ((chunk ^ g) << 4) + 4 * t) = pa[kk][r];
    }
}

// Software pipeline per warpgroup: the wgmma batch of step j is [PV(j-1), QK(j)]; once both are done,
// the fold of PV(j-1) and the softmax of tile j run as one instruction stream (one warp per scheduler
// runs this phase, so interleaving two independent streams is what hides the latencies) while the
// other warpgroup's batch is on the tensor cores.
// (Issuing [QK(j), PV(j-1)] so that the softmax also overlaps the own PV needs a second P fragment
// set live; at head dim 128 that spills under 240 registers and measured slower: kernel-notes.md.
// The VC_SM90_P_SMEM variant gets the same overlap by staging P through shared memory instead.)
// KPAIR: the K scales are equal in the 256-key steps' two tiles (fidelity's exp2 256-key loop takes one per step)
// KLANES: the K scales are per quad lane (VCConfig.k_lane_scales): each thread reads its lane's, the softmax keeps
// per-lane maxima (softmax_keys); the paired-K 256-key loops only (the presets' head-dim-128 V-Smooth kernels)
// VLO: the V residual's second term on VLO channels (16 or 32; v_lo_kernel's kernels), CHORD: the mixed encoding's
// eighths (exp2 kernels; softmax_keys); 0 and 0: neither (the product's kernels)
template <int D, bool EXPCAST, bool VSMOOTH, typename OutT, int STAGES, bool LOWRANK, bool STEPMEAN, bool KPAIR, bool KLANES = false,
          int VLO = 0, int CHORD = 0>
__device__ __forceinline__ void consumer_loop(const Params& p, uint8_t* smem, uint64_t* bar_q, uint64_t* bar_full,
                                              uint64_t* bar_empty) {
  constexpr bool kPSmem = p_through_smem<D, EXPCAST>();
  constexpr bool kMeanMma = mean_by_mma<D, EXPCAST, VSMOOTH>();
  static_assert(VLO == 0 || ((VLO == 16 || VLO == 30 || VLO == 32) && v_lo_kernel(EXPCAST, VSMOOTH, LOWRANK, KPAIR)),
                "the residual's second term: 16, 30 or 32 channels, in fidelity's paired-K exp2 kernels");
  constexpr int kVLo = VLO;
  using L = LayoutFor<D, EXPCAST, VSMOOTH, STAGES, LOWRANK, kVLo>;
  static_assert(!kMeanMma || STAGES <= kMeanChunk, "a mean chunk buffer is rewritten STAGES tiles after its flush");
  const int wg = threadIdx.x / 128 - 1;
  const int tid = threadIdx.x % 128;
  const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int bh = blockIdx.y;
  const int n_kv = p.n_pad / kBlockN;
  // the scales of this thread's rows g and g+8 (padded rows have scale 0; a 192-row CTA overhangs
  // n_pad: rows past it get scale 0 too and are never stored)
  const int q_row = blockIdx.x * kBlockM + wg * 64 + warp * 16 + g;
  const float* q_sc_rows = p.q_scale + static_cast<int64_t>(bh) * p.n_pad + q_row;
  const RowScale q_sc = {{q_row < p.n_pad ? q_sc_rows[0] : 0.f, q_row + 8 < p.n_pad ? q_sc_rows[8] : 0.f}};
  const int valid_last = p.n - (n_kv - 1) * kBlockN;  // keys in the last tile, 1..128
  const uint8_t* q_tile = smem + L::kQOff + wg * 64 * D;
  // VC_EXPCAST_CLAMP_BOUND: one |score| bound for this thread's rows g and g + 8 (vc_p::int8_row_score_bound, once
  // Q is in; one register: the larger of the two rows' bounds)
  [[maybe_unused]] float q_bound = 0.f;
  // (and the mixed encoding's chord keys: CHORD > 0)
  constexpr bool kChordCodes = EXPCAST || CHORD > 0;
  [[maybe_unused]] const float* q_bound_or_null = (kChordCodes && VC_EXPCAST_CLAMP_BOUND) ? &q_bound : nullptr;
  const float* mu_smem = reinterpret_cast<const float*>(smem + L::kMuOff);
  const float* ksc_smem_all = reinterpret_cast<const float*>(smem + L::kKscOff);
  // the K scale of stage s this thread multiplies by: its lane's (KLANES) or the tile's
  const float* ksc_smem = KLANES ? ksc_smem_all + t : ksc_smem_all;
  constexpr int kKscStride = KLANES ? vc::kKLanes : 1;
  auto k_tile = [&](int s) { return smem + L::kKOff + s * L::kKBytes; };
  auto vt_tile = [&](int s) { return smem + L::kVOff + s * L::kVBytes; };
  constexpr bool kStep256 = step256(D, kConsumers, STAGES);
  static_assert(!kStep256 || (!kPSmem && !kMeanMma), "the 256-key loop reads P from registers and restores the means per tile");
  constexpr bool kTurns = kStep256 ? VC_SM90_STEP256_TURNS != 0 : take_turns<D, VSMOOTH>();
  constexpr bool kEarlyQk = kStep256 && early_qk_loop(EXPCAST, KPAIR);
  // (not on the early-QK loop: its registers spilled 580 B there, +9.7% at Wan2.2-14B, docs/kernel-notes.md section 40)
  static_assert(kVLo == 0 || (kStep256 && !kEarlyQk && !kPSmem && !kMeanMma && !mean_in_pv<D, EXPCAST, VSMOOTH, STAGES>()),
                "the residual's second term: fidelity's paired-K exp2 256-key loop (its pair steps and odd tail tile)");
  // the per-tile loops below read one K scale per stage: lane scales come only with one scale per 256-key step
  static_assert(!KLANES || (kStep256 && VSMOOTH && !LOWRANK && (KPAIR || (STEPMEAN && EXPCAST && VC_SM90_KPAIR))),
                "K scales per lane: the paired-K 256-key loops only");
  auto turn_begin = [&]() {
    if (kTurns) named_sync(1 + wg, 256);
  };
  auto turn_end = [&]() {
    if (kTurns) named_arrive(2 - wg, 256);
  };
  // VC_SM90_SOFTMAX_TURNS: one warpgroup's softmax at a time in the exp2 256-key loop (the early-QK loop is ExpCast's)
  constexpr bool kSoftmaxTurns = VC_SM90_SOFTMAX_TURNS && kStep256 && !kEarlyQk && !EXPCAST && kConsumers == 2 && !kTurns;
  auto softmax_turn_begin = [&]() {
    if (kSoftmaxTurns) named_sync(1 + wg, 256);
  };
  // after its last softmax warpgroup 1 owes nothing (warpgroup 0 waits for no further turn): no arrival pending at exit
  auto softmax_turn_end = [&](bool last) {
    if (kSoftmaxTurns && !(last && wg == 1)) named_arrive(2 - wg, 256);
  };
  auto release = [&](int s) {
    __syncwarp();
    if (lane == 0) mbar_arrive(&bar_empty[s]);
  };
  auto softmax = [&](const int32_t(&s_acc)[64], const RowScale& sc, bool tail, float(&row_off)[2], float(&alpha)[2],
                     uint32_t(&pa)[4][4]) {
    // the 256-key loops call it for their odd last tile only: the first half of a 256-key step
    constexpr int kWkk = kStep256 ? 8 : 4;
    if (tail)
      softmax_tile<EXPCAST, true, KLANES, kWkk, CHORD>(s_acc, sc, valid_last, t, row_off, alpha, pa);
    else
      softmax_tile<EXPCAST, false, KLANES, kWkk, CHORD>(s_acc, sc, kBlockN, t, row_off, alpha, pa, q_bound_or_null);
  };

  float o[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
  float row_sum[2] = {0.f, 0.f};
  float row_off[2] = {neg_inf(), neg_inf()};  // running offset M = running max of the scaled scores
  float alpha[2];
  int32_t s_acc[64];
  float pv[D / 2 + 4];
  uint32_t pa[4][4];
  const bool has_tail = valid_last < kBlockN;
  // VLO: the residual's second term, P x (its kVLo rows after the ones rows of the stage) per step into a fresh
  // accumulator (rows g, g + 8 x columns 8i + 2t, +1, as any wgmma accumulator), live only through the PV batch; the
  // fold keeps its running sum in O's scale, rescaled by the step's alpha: in registers in the chord's loop
  // (VC_SM90_LO_RUN_REGS), in shared memory (L::kLoRunOff) in the exp2 loop
  // lo_sums_in_block: the block's first 8 columns (the term's channels 0..7) land in pv's last 4 registers, the rest
  // (channels 8..29, the row sums in columns 30, 31 on lane t = 3) in lo_acc
  constexpr bool kLoSums = L::kLoSums;
  static_assert(!kLoSums || (!kEarlyQk && !LOWRANK), "the row sums beside the term: the 256-key loop");
  constexpr int kLoSlots = L::kLoBlockRows / 8;  // float4 running-sum slots per thread: the block's columns 8i + 2t, + 1
  constexpr int kLoRegs = kVLo ? (kLoSums ? L::kLoBlockRows / 2 - 4 : kVLo / 2) : 1;  // (kLoSums: 4 of them in pv)
  [[maybe_unused]] float lo_acc[kLoRegs];
  // slot-major (slot i of thread x at i * threads + x): consecutive threads' float4s are consecutive, no bank conflict
  constexpr int kLoStride = 128 * kConsumers;
  [[maybe_unused]] float4* lo_slot = reinterpret_cast<float4*>(smem + L::kLoRunOff) + (threadIdx.x - 128);
  // the running sum in registers: the chord's loop (CHORD > 0); the exp2 loop has no room for them (88 B of spills)
  constexpr bool kLoRunRegs = kVLo > 0 && CHORD > 0 && VC_SM90_LO_RUN_REGS;
  [[maybe_unused]] float4 lo_run[kLoRunRegs ? kLoSlots : 1];
  if constexpr (kVLo > 0) {
#pragma unroll
    for (int i = 0; i < kLoSlots; ++i) (kLoRunRegs ? lo_run[i] : lo_slot[i * kLoStride]) = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  [[maybe_unused]] auto issue_lo = [&](const uint32_t(&pt)[4][4], int s, bool accumulate) {
    if constexpr (kVLo > 0 && !kLoSums) {  // (kLoSums: merged only)
      const TileDesc<128> lo(vt_tile(s) + L::kVLoadBytes + 8 * kBlockN);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        if constexpr (kVLo == 16)
          wgmma_e4m3_m64n16k32(lo_acc, pt[kk], lo.k_step(kk), kk > 0 || accumulate);
        else
          wgmma_e4m3_m64n32k32(lo_acc, pt[kk], lo.k_step(kk), kk > 0 || accumulate);
      }
    }
  };
  // the PV MMA of stage s with its second term: one wgmma per k-step (VC_SM90_LO_MERGED) or the two of issue_pv + issue_lo
  [[maybe_unused]] auto issue_pv_lo = [&](const uint32_t(&pt)[4][4], int s, bool accumulate) {
    if constexpr (kVLo > 0 && VC_SM90_LO_MERGED && D == 128) {
      const TileDesc<128> v(vt_tile(s));
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        if constexpr (kLoSums)
          wgmma_e4m3_m64n160k32(pv, lo_acc, pt[kk], v.k_step(kk), kk > 0 || accumulate);
        else if constexpr (kVLo == 16)
          wgmma_e4m3_m64n152k32(pv, lo_acc, pt[kk], v.k_step(kk), kk > 0 || accumulate);
        else
          wgmma_e4m3_m64n168k32(pv, lo_acc, pt[kk], v.k_step(kk), kk > 0 || accumulate);
      }
    }
  };
  constexpr bool kLoMerged = kVLo > 0 && VC_SM90_LO_MERGED && D == 128;
  // (slot i: the block's columns 8i + 2t, + 1; kLoSums: slot 0 from pv's last 4 registers, and slot 3 holds the row
  // sums on lane t = 3, which the epilogue never reads: no channel maps to block rows 30, 31)
  [[maybe_unused]] auto fold_lo = [&](const float(&alpha_j)[2]) {  // running sum = alpha running sum + lo_acc, per row
    if constexpr (kVLo > 0) {
#pragma unroll
      for (int i = 0; i < kLoSlots; ++i) {
        const float* acc = kLoSums ? (i == 0 ? &pv[D / 2] : &lo_acc[4 * i - 4]) : &lo_acc[4 * i];
        float4& slot = kLoRunRegs ? lo_run[i] : lo_slot[i * kLoStride];
        float4 run = slot;  // (a copy: one float4 load and one store when the slot is in shared memory)
        run.x = fmaf(run.x, alpha_j[0], acc[0]);  // registers 4i, 4i + 1: row g; 4i + 2, 4i + 3: row g + 8
        run.y = fmaf(run.y, alpha_j[0], acc[1]);
        run.z = fmaf(run.z, alpha_j[1], acc[2]);
        run.w = fmaf(run.w, alpha_j[1], acc[3]);
        slot = run;
      }
    }
  };
  // kLoSums: the step's row sums (row g: tiles a, b; row g + 8: a, b) from lane t = 3 of the quad (columns D + 30, 31)
  [[maybe_unused]] float l_sums[4];
  [[maybe_unused]] auto lo_sums_step = [&]() -> const float* {
    if constexpr (kLoSums) {
      const int sums_lane = (lane & ~3) + 3;
#pragma unroll
      for (int i = 0; i < 4; ++i) l_sums[i] = __shfl_sync(0xffffffffu, lo_acc[kLoRegs - 4 + i], sums_lane);
      return l_sums;
    }
    return nullptr;
  };
  // kMeanMma: sum_j l_j mu_j/v_scale over the 8 tiles of a chunk is one TF32 wgmma into O (three, for
  // the hi/lo splits of both factors: ~2^-21 relative) instead of 64 FMAs + 16 shared loads per tile.
  // Its A column k is tile k of the chunk; this thread holds columns t and t+4 of rows g and g+8, i.e.
  // the row sums of tiles 4s+t (slot s), kept in O's running scale (rescaled by alpha like O).
  float wl[4] = {0.f, 0.f, 0.f, 0.f};
  auto fold = [&](int j, const float(&alpha_j)[2], int stage) {
    fold_tile<D, VSMOOTH && !kMeanMma>(o, row_sum, pv, alpha_j, mu_smem + stage * D, t);
    if constexpr (kMeanMma) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {  // i = 2 slot + row: the A register order (row g, g+8; tile t, t+4)
        const bool mine = (j & 3) == t && ((j >> 2) & 1) == (i >> 1);
        wl[i] = mine ? pv[D / 2 + 2 * (i & 1)] : wl[i] * alpha_j[i & 1];
      }
    }
  };
  // after the fold of tile j: the chunk's last tile (or the sequence's) adds the chunk's means
  auto flush_means = [&](int j) {
    if constexpr (kMeanMma) {
      if ((j % kMeanChunk) == kMeanChunk - 1 || j == n_kv - 1) {
        const uint8_t* b_hi = smem + L::kMeanOff + ((j / kMeanChunk) & 1) * 2 * L::kMeanTileBytes;
        uint32_t a_hi[4], a_lo[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float w = wl[i];
          a_hi[i] = tf32_round(w);
          a_lo[i] = __float_as_uint(w - __uint_as_float(a_hi[i]));
        }
        wgmma_fence();
        issue_mean<D>(o, a_hi, b_hi);
        issue_mean<D>(o, a_hi, b_hi + L::kMeanTileBytes);
        issue_mean<D>(o, a_lo, b_hi);
        wgmma_commit();
        wgmma_wait<0>();  // O in flight across the next batch would serialize it (C7512: no registers)
        reg_fence(o);
#pragma unroll
        for (int i = 0; i < 4; ++i) wl[i] = 0.f;
      }
    }
  };

  mbar_wait(bar_q, 0);
  if ((kTurns || kSoftmaxTurns) && wg == 1) named_arrive(1, 256);  // warpgroup 0 takes the first turn
  if constexpr (kChordCodes && VC_EXPCAST_CLAMP_BOUND) {  // this thread's rows of its warp's 16 in the Q tile
    q_bound = static_cast<float>(max(vc_p::int8_row_score_bound<D>(q_tile + (warp * 16 + g) * D, t),
                                     vc_p::int8_row_score_bound<D>(q_tile + (warp * 16 + g + 8) * D, t)));
  }

  static_assert(!KPAIR || (kStep256 && (!kEarlyQk || VC_SM90_STEP256_EARLY_QK == 3)),
                "paired K scales are read by the 256-key loop (with the early QK: VC_SM90_STEP256_EARLY_QK=3)");
  // the 256-key loops' registers: the two tiles' scores and P fragments as halves of one array each, and
  // the second alpha of fold_pair (one step, one rescale); unused (and dropped) by the 128-key loops
  int32_t s2[128];
  uint32_t p2[8][4];
  auto& s_lo = *reinterpret_cast<int32_t(*)[64]>(&s2[0]);
  auto& s_hi = *reinterpret_cast<int32_t(*)[64]>(&s2[64]);
  auto& p_lo = *reinterpret_cast<uint32_t(*)[4][4]>(&p2[0][0]);
  auto& p_hi = *reinterpret_cast<uint32_t(*)[4][4]>(&p2[4][0]);
  const float one[2] = {1.f, 1.f};
  // mean_in_pv: the previous step's row sums (zero before the first step) and the deferred restore's A
  constexpr bool kMeanPv = mean_in_pv<D, EXPCAST, VSMOOTH, STAGES>();
  static_assert(!LOWRANK || (low_rank_loop(D, VSMOOTH, kConsumers, STAGES) && !kMeanPv),
                "the low-rank V term lives in the 256-key loops with per-step mean restores");
  // LOWRANK: this lane's running sum_j P_j A_jk (rows g, g + 8; two components each), zero to begin with
  float4* lr_slot = reinterpret_cast<float4*>(smem + L::kLowOff) + (threadIdx.x - 128);
  if constexpr (LOWRANK) *lr_slot = make_float4(0.f, 0.f, 0.f, 0.f);
  float l4[4];  // LOWRANK: the step's row sums in every lane of the quad (else unread: the fold reads pv's)
  auto low_rank_step = [&](const float(&alpha_j)[2]) -> const float* {
    if constexpr (LOWRANK) {
      low_rank_columns<D>(pv, alpha_j, lr_slot, l4);
      return l4;
    }
    return nullptr;
  };
  float4* l_prev = reinterpret_cast<float4*>(smem + L::kLPrevOff) + (threadIdx.x - 128);
  if constexpr (kMeanPv) *l_prev = make_float4(0.f, 0.f, 0.f, 0.f);  // the first step's A: zeros (its B rows are zeros too)
  uint32_t a_mean[4];
  auto mean_pv_tile = [&](int m) -> const uint8_t* {
    if constexpr (kMeanPv) return smem + L::kMeanOff + (m % (STAGES / 2)) * L::kMeanTileBytes;
    return nullptr;
  };
  if constexpr (kEarlyQk) {
    // The 256-key loop (the next branch) with VC_SM90_STEP256_EARLY_QK: the next step's first QK goes out
    // before the fold (its scores' 64 registers are free then: S/2 64 + PV 68 + O 64), the second after
    // it, so the tensor core has this warpgroup's next work while it folds (VC_SM90_STEP256_MAX_OVERLAP,
    // a variant: the next step takes the first tile's row maxima while the second tile's QK still
    // runs). Every wgmma is issued unconditionally inside its block (a conditional one in flight across
    // a branch made ptxas serialize the pipeline). The product's head dim 128 speed loop (=2, ExpCast
    // only): fidelity stays on the next branch's loop, 8% faster there (docs/kernel-notes.md 18-19).
    static_assert(!kTurns, "the early QK splits the QK batch: no turns");
    // V-Smooth means restored per step: one (STEPMEAN: equal in the step's two tiles), two, or none (diagnostic)
    constexpr int kStepMeans = VC_SM90_STEP_MEAN_DIAG ? 0 : (STEPMEAN ? 1 : 2);
    static_assert(!STEPMEAN || (VSMOOTH && !LOWRANK && !kMeanPv), "one mean per step: V-Smooth's plain 256-key loop");
    // VC_SM90_KPAIR: the STEPMEAN kernels' K scales are equal in the step's two tiles; KPAIR (the exp2 kernels of
    // VC_SM90_KPAIR_EXP2, here with VC_SM90_STEP256_EARLY_QK=3): the same for fidelity's paired-K step
    constexpr bool kKPair = (STEPMEAN && EXPCAST && VC_SM90_KPAIR) || KPAIR;
    // the next pair's first QK waits for a stage that both warpgroups release only after this fold's
    // predecessor: four stages (two pairs) keep that wait from closing a cycle
    static_assert(STAGES >= 4, "the early-QK loop needs two tile pairs in the ring");
    const int n_pairs = n_kv / 2;
    const bool odd = n_kv & 1;
    // QK of tile j into one half of the scores, as a commit group of its own
    auto issue_qk_tile = [&](int32_t(&s)[64], int j) {
      mbar_wait(&bar_full[j % STAGES], (j / STAGES) & 1);
      reg_fence(s);
      wgmma_fence();
      issue_qk<D>(s, q_tile, k_tile(j % STAGES));
      wgmma_commit();
      reg_fence(s);
    };
    // step m over tiles 2m, 2m+1; NEXT: what comes after it, 2 a pair, 1 the odd last tile, 0 nothing
    auto pair_step = [&](int m, auto next_tag) {
      constexpr int kNext = decltype(next_tag)::value;
      const int j0 = 2 * m, s0 = j0 % STAGES, s1 = (j0 + 1) % STAGES;
      const bool last = !odd && m == n_pairs - 1;  // the tail tile is this step's second
      // VC_SM90_STEP256_MAX_OVERLAP: the first tile's QK (the older of the two commit groups), then its
      // max pass under the second's; else both before the softmax
      if constexpr (VC_SM90_STEP256_MAX_OVERLAP) {
        wgmma_wait<1>();
        reg_fence(s_lo);
      } else {
        wgmma_wait<0>();
        reg_fence(s2);
      }
      auto second_tile = [&]() {
        if constexpr (VC_SM90_STEP256_MAX_OVERLAP) {
          wgmma_wait<0>();
          reg_fence(s_hi);
        }
      };
      const float ksc1 = ksc_smem[kKscStride * s1];  // STEPMEAN: its sign bit is the segment-end flag
      const RowScale sc2[2] = {q_sc * ksc_smem[kKscStride * s0], q_sc * (STEPMEAN ? fabsf(ksc1) : ksc1)};
      if (has_tail && last)
        softmax_keys<EXPCAST, true, 2, kKPair, KLANES, CHORD>(s2, sc2, valid_last, t, row_off, alpha, p2, second_tile);
      else
        softmax_keys<EXPCAST, false, 2, kKPair, KLANES, CHORD>(s2, sc2, kBlockN, t, row_off, alpha, p2, second_tile, q_bound_or_null);
      if constexpr (kMeanPv) deferred_mean_a(a_mean, l_prev, alpha, t);
      reg_fence(p2);
      reg_fence(pv);
      wgmma_fence();
      issue_pv<D>(pv, p_lo, vt_tile(s0));
      issue_pv<D>(pv, p_hi, vt_tile(s1), true);
      if constexpr (kMeanPv) issue_deferred_mean<D>(pv, a_mean, mean_pv_tile(m));
      wgmma_commit();
      wgmma_wait<0>();
      reg_fence(pv);
      reg_fence(p2);
      if constexpr (kNext >= 1) issue_qk_tile(s_lo, j0 + 2);
      [[maybe_unused]] const float* l_step = low_rank_step(alpha);  // unread by the segment fold
      if constexpr (kMeanPv && kNext == 2)  // a next pair step restores this step's means
        fold_step_deferred<D>(o, row_sum, pv, alpha, l_prev);
      else if constexpr (STEPMEAN && kStepMeans == 1)  // the last pair step always restores (an odd tail follows, or the end)
        fold_segment<D>(o, row_sum, pv, alpha, mu_smem + s1 * D, t, kNext != 2 || seg_end_of_step(ksc1));
      else
        fold_pair<D, VSMOOTH, kStepMeans>(o, row_sum, pv, alpha, one, mu_smem + s0 * D, mu_smem + s1 * D, t, l_step);
      release(s0);
      release(s1);
      if constexpr (kNext == 2) issue_qk_tile(s_hi, j0 + 3);
    };
    using Next0 = std::integral_constant<int, 0>;
    using Next1 = std::integral_constant<int, 1>;
    using Next2 = std::integral_constant<int, 2>;
    if (n_pairs > 0) {
      issue_qk_tile(s_lo, 0);  // two commit groups, as every later step's pair
      issue_qk_tile(s_hi, 1);
      int m = 0;
      for (; m + 1 < n_pairs; ++m) pair_step(m, Next2{});
      if (odd)
        pair_step(m, Next1{});
      else
        pair_step(m, Next0{});
    } else {
      issue_qk_tile(s_lo, 0);
    }
    if (odd) {  // tile n_kv - 1 (even index: its stage's ones rows are the even columns fold_tile reads)
      const int j = n_kv - 1, sj = j % STAGES;
      wgmma_wait<0>();
      reg_fence(s_lo);
      softmax(s_lo, q_sc * ksc_smem[kKscStride * sj], has_tail, row_off, alpha, p_lo);
      reg_fence(p_lo);
      reg_fence(pv);
      wgmma_fence();
      issue_pv<D>(pv, p_lo, vt_tile(sj));
      wgmma_commit();
      wgmma_wait<0>();
      reg_fence(pv);
      reg_fence(p_lo);
      const float* l_tail = low_rank_step(alpha);
      fold_tile<D, VSMOOTH>(o, row_sum, pv, alpha, mu_smem + sj * D, t, l_tail);
      release(sj);
    }
  } else if constexpr (kStep256) {
    // 256-key steps (step256()): per trip QK of tiles 2m and 2m+1 (adjacent stages of an even ring),
    // one softmax step over both, PV of both into one accumulator, one fold; an odd last tile on its own
    // the turn after a batch: passed on, except after the last one, when warpgroup 0 gives warpgroup 1
    // its last turn and warpgroup 1 owes nothing (no arrival left pending at exit)
    auto turn_end_of = [&](bool last) {
      if (!last)
        turn_end();
      else if (kTurns && wg == 0)
        named_arrive(2, 256);
    };
    static_assert(!STEPMEAN || (VSMOOTH && !LOWRANK && !kMeanPv && !EXPCAST),
                  "this loop's one mean per step is exp2's (VC_SM90_STEPMEAN_EXP2); ExpCast's is the early-QK loop's");
    const int n_pairs = n_kv / 2;
    const bool odd = n_kv & 1;
    // step m over tiles 2m, 2m+1; DEFERRED (mean_in_pv): a next pair step restores this step's means
    auto pair_step = [&](int m, auto deferred_tag) {
      constexpr bool kDeferred = decltype(deferred_tag)::value;
      const int j0 = 2 * m, s0 = j0 % STAGES, s1 = (j0 + 1) % STAGES;
      const bool last = !odd && m == n_pairs - 1;
      mbar_wait(&bar_full[s0], (j0 / STAGES) & 1);
      mbar_wait(&bar_full[s1], ((j0 + 1) / STAGES) & 1);
      turn_begin();
      reg_fence(s2);
      wgmma_fence();
      issue_qk<D>(s_lo, q_tile, k_tile(s0));
      issue_qk<D>(s_hi, q_tile, k_tile(s1));
      wgmma_commit();
      turn_end();
      wgmma_wait<0>();
      reg_fence(s2);
      const float ksc1 = ksc_smem[kKscStride * s1];  // STEPMEAN: its sign bit is the segment-end flag
      const RowScale sc2[2] = {q_sc * ksc_smem[kKscStride * s0], q_sc * (STEPMEAN ? fabsf(ksc1) : ksc1)};
      // KPAIR (VC_SM90_KPAIR_EXP2 builds): the step's two K scales are equal (k_scale_rows 256): one of each per row
      constexpr bool kKPairExp2 = KPAIR;
      static_assert(!KPAIR || (!EXPCAST && VSMOOTH && !STEPMEAN && !LOWRANK && !kMeanPv),
                    "paired K scales in this loop: fidelity's exp2 two-mean fold without the low-rank term");
      softmax_turn_begin();
      if (has_tail && last)
        softmax_keys<EXPCAST, true, 2, kKPairExp2, KLANES, CHORD>(s2, sc2, valid_last, t, row_off, alpha, p2);
      else
        softmax_keys<EXPCAST, false, 2, kKPairExp2, KLANES, CHORD>(s2, sc2, kBlockN, t, row_off, alpha, p2, NoWait{}, q_bound_or_null);
      softmax_turn_end(last);
      if constexpr (kMeanPv) deferred_mean_a(a_mean, l_prev, alpha, t);
      turn_begin();
      reg_fence(p2);
      reg_fence(pv);
      if constexpr (kVLo > 0) reg_fence(lo_acc);
      wgmma_fence();
      if constexpr (kLoMerged) {
        issue_pv_lo(p_lo, s0, false);
        issue_pv_lo(p_hi, s1, true);
      } else {
        issue_pv<D>(pv, p_lo, vt_tile(s0));
        issue_pv<D>(pv, p_hi, vt_tile(s1), true);
        if constexpr (kMeanPv) issue_deferred_mean<D>(pv, a_mean, mean_pv_tile(m));
        if constexpr (kVLo > 0) {
          issue_lo(p_lo, s0, false);
          issue_lo(p_hi, s1, true);
        }
      }
      wgmma_commit();
      turn_end_of(last);
      wgmma_wait<0>();
      reg_fence(pv);
      reg_fence(p2);
      if constexpr (kVLo > 0) {
        reg_fence(lo_acc);
        fold_lo(alpha);
      }
      // (kLoSums: the row sums of the term's box; LOWRANK: the low-rank rows')
      [[maybe_unused]] const float* l_step = kLoSums ? lo_sums_step() : low_rank_step(alpha);  // unread by the segment fold
      if constexpr (kDeferred)
        fold_step_deferred<D>(o, row_sum, pv, alpha, l_prev);
      else if constexpr (STEPMEAN)  // VC_SM90_STEPMEAN_EXP2: the last pair step always restores (a tail or the end follows)
        fold_segment<D>(o, row_sum, pv, alpha, mu_smem + s1 * D, t, m == n_pairs - 1 || seg_end_of_step(ksc1));
      else
        fold_pair<D, VSMOOTH>(o, row_sum, pv, alpha, one, mu_smem + s0 * D, mu_smem + s1 * D, t, l_step);
      release(s0);
      release(s1);
    };
    int m = 0;
    if constexpr (kMeanPv)
      for (; m + 1 < n_pairs; ++m) pair_step(m, std::true_type{});
    for (; m < n_pairs; ++m) pair_step(m, std::false_type{});
    if (odd) {  // tile n_kv - 1 (even index: its stage's ones rows are the even columns fold_tile reads)
      const int j = n_kv - 1, sj = j % STAGES;
      mbar_wait(&bar_full[sj], (j / STAGES) & 1);
      turn_begin();
      reg_fence(s_lo);
      wgmma_fence();
      issue_qk<D>(s_lo, q_tile, k_tile(sj));
      wgmma_commit();
      turn_end();
      wgmma_wait<0>();
      reg_fence(s_lo);
      softmax_turn_begin();
      softmax(s_lo, q_sc * ksc_smem[kKscStride * sj], has_tail, row_off, alpha, p_lo);
      softmax_turn_end(true);  // the tail tile's softmax is each warpgroup's last
      turn_begin();
      reg_fence(p_lo);
      reg_fence(pv);
      if constexpr (kVLo > 0) reg_fence(lo_acc);
      wgmma_fence();
      if constexpr (kLoMerged) {
        issue_pv_lo(p_lo, sj, false);
      } else {
        issue_pv<D>(pv, p_lo, vt_tile(sj));
        if constexpr (kVLo > 0) issue_lo(p_lo, sj, false);
      }
      wgmma_commit();
      turn_end_of(true);
      wgmma_wait<0>();
      reg_fence(pv);
      reg_fence(p_lo);
      if constexpr (kVLo > 0) {
        reg_fence(lo_acc);
        fold_lo(alpha);
      }
      const float* l_tail = kLoSums ? lo_sums_step() : low_rank_step(alpha);
      fold_tile<D, VSMOOTH>(o, row_sum, pv, alpha, mu_smem + sj * D, t, l_tail);
      release(sj);
    }
  } else {
    mbar_wait(&bar_full[0], 0);
    turn_begin();
    reg_fence(s_acc);
    wgmma_fence();
    issue_qk<D>(s_acc, q_tile, k_tile(0));
    wgmma_commit();
    turn_end();
    wgmma_wait<0>();
    reg_fence(s_acc);
    softmax(s_acc, q_sc * ksc_smem[0], has_tail && n_kv == 1, row_off, alpha, pa);

    // the last tile's PV, then its fold
    // the single-stream loops' batch [PV(j-1), QK(j)] and its wait (accumulate: PV(j-1) adds to the
    // accumulator, pair accumulation's second tile)
    auto pv_qk_batch = [&](int j, bool accumulate) {
      const int sj = j % STAGES, sp = (j - 1) % STAGES;
      mbar_wait(&bar_full[sj], (j / STAGES) & 1);
      turn_begin();
      reg_fence(pa);
      reg_fence(pv);
      reg_fence(s_acc);
      wgmma_fence();
      issue_pv<D>(pv, pa, vt_tile(sp), accumulate);
      wgmma_commit();
      issue_qk<D>(s_acc, q_tile, k_tile(sj));
      wgmma_commit();
      turn_end();
      wgmma_wait<0>();
      reg_fence(pv);
      reg_fence(s_acc);
      reg_fence(pa);
    };
    // the last tile's PV (accumulate: it adds to the accumulator, pair accumulation's second tile)
    auto last_pv = [&](uint32_t(&pa_x)[4][4], bool accumulate) {
      turn_begin();
      reg_fence(pa_x);
      reg_fence(pv);
      wgmma_fence();
      issue_pv<D>(pv, pa_x, vt_tile((n_kv - 1) % STAGES), accumulate);
      wgmma_commit();
      if (kTurns && wg == 0) named_arrive(2, 256);  // the other warpgroup's last turn
      wgmma_wait<0>();
      reg_fence(pv);
    };
    auto finish = [&](uint32_t(&pa_x)[4][4], float(&alpha_x)[2]) {
      const int sl = (n_kv - 1) % STAGES;
      last_pv(pa_x, false);
      fold(n_kv - 1, alpha_x, sl);
      flush_means(n_kv - 1);
      release(sl);
    };

    if constexpr (kSerial) {
      // One batch in flight: PV(j) after the softmax of tile j, then the fold, then QK(j+1). The scores
      // are dead once P is encoded, so the PV accumulator can take their registers: ~150 live instead of
      // ~215 (the price: this warpgroup's softmax never overlaps its own wgmmas; the other consumer
      // warpgroups' do).
      static_assert(!kPSmem, "P through shared memory belongs to the overlapped loop, not the serial one");
      for (int j = 0; j < n_kv; ++j) {
        const int sj = j % STAGES;
        reg_fence(pa);
        reg_fence(pv);
        wgmma_fence();
        issue_pv<D>(pv, pa, vt_tile(sj));
        wgmma_commit();
        wgmma_wait<0>();
        reg_fence(pv);
        reg_fence(pa);
        fold(j, alpha, sj);
        flush_means(j);
        release(sj);
        if (j + 1 < n_kv) {
          const int sn = (j + 1) % STAGES;
          mbar_wait(&bar_full[sn], ((j + 1) / STAGES) & 1);
          reg_fence(s_acc);
          wgmma_fence();
          issue_qk<D>(s_acc, q_tile, k_tile(sn));
          wgmma_commit();
          wgmma_wait<0>();
          reg_fence(s_acc);
          softmax(s_acc, q_sc * ksc_smem[sn], has_tail && j + 1 == n_kv - 1, row_off, alpha, pa);
        }
      }
    } else if constexpr (kPSmem) {
      // Batch [QK(j), PV(j-1)] with P(j-1) read from shared memory: the softmax of tile j overlaps
      // this warpgroup's own PV(j-1) without a second P register set. Two P tiles per warpgroup: the
      // softmax of tile j writes one while PV(j-1) reads the other. Before a PV is issued every thread
      // of the warpgroup has stored its part of P and fenced it for the async proxy (barrier 3 + wg).
      uint8_t* p_base = smem + L::kPOff + wg * 2 * L::kPTileBytes;
      auto p_tile = [&](int j) { return p_base + (j & 1) * L::kPTileBytes; };
      auto publish_p = [&](int j) {
        store_p_tile(p_tile(j), pa, warp, g, t);
        fence_proxy_async();
      };
      float alpha_prev[2];
      publish_p(0);
      for (int j = 1; j < n_kv; ++j) {
        const int sj = j % STAGES, sp = (j - 1) % STAGES;
        mbar_wait(&bar_full[sj], (j / STAGES) & 1);
        named_sync(3 + wg, 128);  // P(j-1) complete in shared memory
        turn_begin();
        reg_fence(pv);
        reg_fence(s_acc);
        wgmma_fence();
        issue_qk<D>(s_acc, q_tile, k_tile(sj));
        wgmma_commit();
        issue_pv_smem<D>(pv, p_tile(j - 1), vt_tile(sp));
        wgmma_commit();
        turn_end();
        wgmma_wait<1>();
        reg_fence(s_acc);
        alpha_prev[0] = alpha[0];
        alpha_prev[1] = alpha[1];
        const RowScale sc = q_sc * ksc_smem[sj];
        if (has_tail && j == n_kv - 1) {  // the store inside each branch: P is stored as it is encoded
          softmax_tile<EXPCAST, true, false, 4, CHORD>(s_acc, sc, valid_last, t, row_off, alpha, pa);
          publish_p(j);
        } else {
          softmax_tile<EXPCAST, false, false, 4, CHORD>(s_acc, sc, kBlockN, t, row_off, alpha, pa, q_bound_or_null);
          publish_p(j);
        }
        wgmma_wait<0>();
        reg_fence(pv);
        fold(j - 1, alpha_prev, sp);
        flush_means(j - 1);
        release(sp);
      }
      const int sl = (n_kv - 1) % STAGES;
      named_sync(3 + wg, 128);
      turn_begin();
      reg_fence(pv);
      wgmma_fence();
      issue_pv_smem<D>(pv, p_tile(n_kv - 1), vt_tile(sl));
      wgmma_commit();
      if (kTurns && wg == 0) named_arrive(2, 256);  // the other warpgroup's last turn
      wgmma_wait<0>();
      reg_fence(pv);
      fold(n_kv - 1, alpha, sl);
      flush_means(n_kv - 1);
      release(sl);
    } else if constexpr (D == 64 && VC_SM90_D64_OVERLAP && (EXPCAST || VC_SM90_D64_OVERLAP_ALL)) {
      // Head dim 64 has the registers for a second P fragment set, so the batch is [QK(j), PV(j-1)]
      // and the softmax of tile j also overlaps this warpgroup's own PV(j-1) (H200: 16.8 -> 14.5 ms at
      // (1,32,32768,64); with MUFU exp2 the single-stream fold+softmax below is faster). Unrolled by
      // two with two fragment sets: a copy between them would let ptxas coalesce the sets and
      // serialize every wgmma (warning C7513).
      uint32_t pb[4][4];
      float alpha_b[2];
      auto step = [&](int j, uint32_t(&pa_prev)[4][4], float(&alpha_prev)[2], uint32_t(&pa_new)[4][4],
                      float(&alpha_new)[2]) {
        const int sj = j % STAGES, sp = (j - 1) % STAGES;
        mbar_wait(&bar_full[sj], (j / STAGES) & 1);
        turn_begin();
        reg_fence(pa_prev);
        reg_fence(pv);
        reg_fence(s_acc);
        wgmma_fence();
        issue_qk<D>(s_acc, q_tile, k_tile(sj));
        wgmma_commit();
        issue_pv<D>(pv, pa_prev, vt_tile(sp));
        wgmma_commit();
        turn_end();
        wgmma_wait<1>();
        reg_fence(s_acc);
        softmax(s_acc, q_sc * ksc_smem[sj], has_tail && j == n_kv - 1, row_off, alpha_new, pa_new);
        wgmma_wait<0>();
        reg_fence(pv);
        reg_fence(pa_prev);
        fold(j - 1, alpha_prev, sp);
        flush_means(j - 1);
        release(sp);
      };
      int j = 1;
      for (; j + 1 < n_kv; j += 2) {
        step(j, pa, alpha, pb, alpha_b);
        step(j + 1, pb, alpha_b, pa, alpha);
      }
      if (j < n_kv) {
        step(j, pa, alpha, pb, alpha_b);
        finish(pb, alpha_b);
      } else {
        finish(pa, alpha);
      }
    } else if constexpr (pair_accumulation<D, EXPCAST, VSMOOTH, STAGES>()) {
      float alpha_a[2];  // alpha of the pair's first tile, for the pair's fold
      // step j: [PV(j-1), QK(j)], then the fold (when PV(j-1) closed a pair) and the softmax of tile j
      auto step = [&](int j, auto second_tag) {
        constexpr bool kSecond = decltype(second_tag)::value;  // PV(j-1) is the second of its pair
        const int sj = j % STAGES, sp = (j - 1) % STAGES;
        pv_qk_batch(j, kSecond);
        const RowScale sc = q_sc * ksc_smem[sj];
        const int sa = (j - 2 + STAGES) % STAGES;  // the pair's first tile's stage (kSecond)
        if constexpr (kSecond) {
          if (has_tail && j == n_kv - 1) {
            fold_pair<D, VSMOOTH>(o, row_sum, pv, alpha_a, alpha, mu_smem + sa * D, mu_smem + sp * D, t);
            softmax_tile<EXPCAST, true, false, 4, CHORD>(s_acc, sc, valid_last, t, row_off, alpha, pa);
          } else {  // the same two calls inside each branch keep them in one basic block
            fold_pair<D, VSMOOTH>(o, row_sum, pv, alpha_a, alpha, mu_smem + sa * D, mu_smem + sp * D, t);
            softmax_tile<EXPCAST, false, false, 4, CHORD>(s_acc, sc, kBlockN, t, row_off, alpha, pa, q_bound_or_null);
          }
          release(sa);
          release(sp);
        } else {
          alpha_a[0] = alpha[0];
          alpha_a[1] = alpha[1];
          if (has_tail && j == n_kv - 1)
            softmax_tile<EXPCAST, true, false, 4, CHORD>(s_acc, sc, valid_last, t, row_off, alpha, pa);
          else
            softmax_tile<EXPCAST, false, false, 4, CHORD>(s_acc, sc, kBlockN, t, row_off, alpha, pa, q_bound_or_null);
          rescale_pair_accumulator<D>(pv, alpha);  // PV(j) adds to it next step
        }
      };
      int j = 1;
      for (; j + 1 < n_kv; j += 2) {
        step(j, std::false_type{});
        step(j + 1, std::true_type{});
      }
      if (j < n_kv) step(j, std::false_type{});
      // the last tile's PV: the second of a pair (n_kv even) or a tile of its own
      const int sl = (n_kv - 1) % STAGES;
      const bool second = (n_kv - 1) % 2 == 1;
      last_pv(pa, second);
      if (second) {
        const int sa = (n_kv - 2) % STAGES;
        fold_pair<D, VSMOOTH>(o, row_sum, pv, alpha_a, alpha, mu_smem + sa * D, mu_smem + sl * D, t);
        release(sa);
      } else {
        fold_tile<D, VSMOOTH>(o, row_sum, pv, alpha, mu_smem + sl * D, t);
      }
      release(sl);
    } else {
      for (int j = 1; j < n_kv; ++j) {
        const int sj = j % STAGES, sp = (j - 1) % STAGES;
        pv_qk_batch(j, false);
        const RowScale sc = q_sc * ksc_smem[sj];
        if (has_tail && j == n_kv - 1) {
          fold(j - 1, alpha, sp);
          softmax_tile<EXPCAST, true, false, 4, CHORD>(s_acc, sc, valid_last, t, row_off, alpha, pa);
        } else {  // the same two calls inside each branch keep them in one basic block
          fold(j - 1, alpha, sp);
          softmax_tile<EXPCAST, false, false, 4, CHORD>(s_acc, sc, kBlockN, t, row_off, alpha, pa, q_bound_or_null);
        }
        flush_means(j - 1);
        release(sp);
      }
      finish(pa, alpha);
    }

  }

  if constexpr (kVLo > 0) {
    // the second term's running sum into O's columns v_lo_sel (O is in code units: v_scale multiplies both). Through
    // this warpgroup's half of the Q tile, dead since its last QK: row (16 warp + g + 8r), column j of the term; a row
    // is written and read by the four lanes of one quad, so the warp's own barrier orders it
    // row stride D bytes: warp w writes and reads only Q rows 16w..16w+15, the A rows of its own QK results
    float* lo_smem = reinterpret_cast<float*>(smem + L::kQOff + wg * 64 * D);
    constexpr int kRowFloats = D / 4;
    if constexpr (kLoRunRegs) {  // (the running sum held in registers: to its shared-memory slots, this thread's own)
#pragma unroll
      for (int i = 0; i < kLoSlots; ++i) lo_slot[i * kLoStride] = lo_run[i];
    }
    static_assert(8 * kLoSlots <= kRowFloats, "a row of the term fits a row of the Q tile");
#pragma unroll
    for (int i = 0; i < kLoSlots; ++i)
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float4 run = lo_slot[i * kLoStride];
          lo_smem[(warp * 16 + g + 8 * r) * kRowFloats + 8 * i + 2 * t + e] = r ? (e ? run.w : run.z) : (e ? run.y : run.x);
        }
    __syncwarp();
    const int8_t* pos = reinterpret_cast<const int8_t*>(smem + L::kLoPosOff);
#pragma unroll
    for (int i = 0; i < D / 8; ++i)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int j = pos[8 * i + 2 * t + e];
        if (j >= 0) {
#pragma unroll
          for (int r = 0; r < 2; ++r) o[4 * i + 2 * r + e] += lo_smem[(warp * 16 + g + 8 * r) * kRowFloats + j];
        }
      }
  }

  // out = v_scale * O / l in the caller's layout
  const int b = bh / p.heads, h = bh % p.heads;
  OutT* out = static_cast<OutT*>(p.out) + b * p.out_stride_b + h * p.out_stride_h;
  const float* vscale = p.v_scale + static_cast<int64_t>(bh) * D;
  // LOWRANK: the row's sum_j P_j A_jk for every k (lanes t = 1..3 of the quad hold two each) times the
  // coefficient scale; out = (v_scale O + sum_k c_k W_k) / l
  float c[2][vc::kMaxVRank];
  const __half* basis = p.v_low_basis + static_cast<int64_t>(bh) * p.v_rank * D;
  constexpr bool kLowEpilogue = LOWRANK && !(VC_SM90_LOWRANK_DIAG & 8);
  if constexpr (kLowEpilogue) {
    const int quad = lane & ~3;
    const float4 lr4 = *lr_slot;
    const float lr[2][2] = {{lr4.x, lr4.y}, {lr4.z, lr4.w}};
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int k = 0; k < vc::kMaxVRank; ++k) {
        const float sum = __shfl_sync(0xffffffffu, lr[r][k % 2], quad + 1 + k / 2);
        c[r][k] = k < p.v_rank ? sum * p.v_low_scale[static_cast<int64_t>(bh) * p.v_rank + k] : 0.f;
      }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = blockIdx.x * kBlockM + wg * 64 + warp * 16 + g + 8 * r;
    if (row >= p.n) continue;
    const float inv_l = 1.f / row_sum[r];
    OutT* dst = out + static_cast<int64_t>(row) * p.out_stride_n;
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
      const int col = 8 * i + 2 * t;
      const float2 vs = *reinterpret_cast<const float2*>(vscale + col);
      float x = o[4 * i + 2 * r] * vs.x, y = o[4 * i + 2 * r + 1] * vs.y;
      if constexpr (kLowEpilogue) {
#pragma unroll
        for (int k = 0; k < vc::kMaxVRank; ++k) {
          if (k < p.v_rank) {
            const float2 w = __half22float2(*reinterpret_cast<const __half2*>(basis + k * D + col));
            x = fmaf(c[r][k], w.x, x);
            y = fmaf(c[r][k], w.y, y);
          }
        }
      }
      store_pair<OutT>(dst + col, x * inv_l, y * inv_l);
    }
  }
}

// One CTA of the kernel (the two __global__ entries below): VLO / CHORD as consumer_loop's.
template <int D, bool EXPCAST, bool VSMOOTH, typename OutT, int STAGES, bool LOWRANK, bool STEPMEAN, bool KPAIR, bool KLANES,
          int VLO, int CHORD>
__device__ __forceinline__ void attention_cta(const CUtensorMap& tm_q, const CUtensorMap& tm_k, const CUtensorMap& tm_vt,
                                              const CUtensorMap& tm_vlow, const Params& p) {
  using L = LayoutFor<D, EXPCAST, VSMOOTH, STAGES, LOWRANK, VLO>;
  extern __shared__ uint8_t smem_raw[];
  // offset from the __shared__ array itself (not an integer round trip) so that every pointer below
  // stays provably in shared memory: the compiler then emits LDS/STS, not generic LD/ST
  uint8_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  uint64_t* bar_q = reinterpret_cast<uint64_t*>(smem + L::kBarOff);
  uint64_t* bar_full = bar_q + 1;
  uint64_t* bar_empty = bar_full + STAGES;

  if (threadIdx.x == 0) {
    mbar_init(bar_q, 1);
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(&bar_full[s], 1);
      mbar_init(&bar_empty[s], 4 * kConsumers);  // lane 0 of each consumer warp
    }
  }
  // E4M3 ones in the 8 rows after V^T of every stage: written once, never overwritten by TMA. With pair
  // accumulation only the rows (= output columns D + 2c + parity) of the stage's parity hold ones.
  constexpr bool kPairRows = pair_accumulation<D, EXPCAST, VSMOOTH, STAGES>() || step256(D, kConsumers, STAGES);
  // lo_sums_in_block: only rows kVLo, kVLo + 1 (30, 31) of the term's block, after its TMA rows (which never reach
  // them): ones on even / odd stages, the row sums of the step's tiles a / b
  constexpr bool kOnesRows = !LOWRANK || (VC_SM90_LOWRANK_DIAG & 4) || L::kLoSums;  // else the TMA loads the rows
  constexpr int kOnesRow0 = L::kLoSums ? L::kVLo : 0, kOnesRowCount = L::kLoSums ? 2 : 8;
  constexpr int kOnesWords = kOnesRowCount * kBlockN / 4;  // per stage
  for (int i = threadIdx.x; i < (kOnesRows ? STAGES * kOnesWords : 0); i += kThreads) {
    const int s = i / kOnesWords, w = i % kOnesWords, row = kOnesRow0 + w / (kBlockN / 4);
    const bool ones = !kPairRows || (row & 1) == (s & 1);
    reinterpret_cast<uint32_t*>(smem + L::kVOff + s * L::kVBytes + L::kVLoadBytes + kOnesRow0 * kBlockN)[w] =
        ones ? vc::kE4m3OnesX4 : 0u;
  }
  if constexpr (mean_by_mma<D, EXPCAST, VSMOOTH>()) {  // a partial last chunk multiplies unwritten columns by 0: no NaN
    for (int i = threadIdx.x; i < L::kMeanTileBytes; i += kThreads)  // 4 tiles = kMeanTileBytes words
      reinterpret_cast<uint32_t*>(smem + L::kMeanOff)[i] = 0u;
  }
  fence_proxy_async();
  __syncthreads();

  if (threadIdx.x < 128) {
    regs_dealloc<kProducerRegs>();
    if (threadIdx.x < 32)
      producer_loop<D, EXPCAST, VSMOOTH, STAGES, L, LOWRANK, STEPMEAN, KLANES>(&tm_q, &tm_k, &tm_vt, &tm_vlow, p, smem, bar_q, bar_full, bar_empty);
  } else {
    regs_alloc<kConsumerRegs>();
    consumer_loop<D, EXPCAST, VSMOOTH, OutT, STAGES, LOWRANK, STEPMEAN, KPAIR, KLANES, VLO, CHORD>(p, smem, bar_q, bar_full,
                                                                                                  bar_empty);
  }
}

// The kernels without the V residual's second term and the mixed encoding (the product's): their names, which the
// tests and tools read the template arguments from, stay as they were before VLO / CHORD existed
template <int D, bool EXPCAST, bool VSMOOTH, typename OutT, int STAGES, bool LOWRANK = false, bool STEPMEAN = false,
          bool KPAIR = false, bool KLANES = false>
__global__ void __launch_bounds__(kThreads, 1)
    vc_attention_sm90_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                             const __grid_constant__ CUtensorMap tm_vt, const __grid_constant__ CUtensorMap tm_vlow,
                             const Params p) {
  attention_cta<D, EXPCAST, VSMOOTH, OutT, STAGES, LOWRANK, STEPMEAN, KPAIR, KLANES, 0, 0>(tm_q, tm_k, tm_vt, tm_vlow, p);
}

// The kernels with the V residual's second term on VLO channels and / or the mixed encoding's CHORD eighths
template <int D, bool EXPCAST, bool VSMOOTH, typename OutT, int STAGES, bool LOWRANK, bool STEPMEAN, bool KPAIR, bool KLANES,
          int VLO, int CHORD>
__global__ void __launch_bounds__(kThreads, 1)
    vc_attention_sm90_kernel_lo_chord(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                                      const __grid_constant__ CUtensorMap tm_vt, const __grid_constant__ CUtensorMap tm_vlow,
                                      const Params p) {
  static_assert(VLO > 0 || CHORD > 0, "without either: vc_attention_sm90_kernel");
  attention_cta<D, EXPCAST, VSMOOTH, OutT, STAGES, LOWRANK, STEPMEAN, KPAIR, KLANES, VLO, CHORD>(tm_q, tm_k, tm_vt, tm_vlow, p);
}

}  // inline namespace consumers2 / consumers3
}  // namespace vc_sm90
