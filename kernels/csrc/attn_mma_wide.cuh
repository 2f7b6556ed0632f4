// Portable VC-Attention forward kernel in the FlashAttention-2 layout (built with -DVC_MMA_WIDE=1).
//
// Same numerics and operand contract as attn_mma.cuh (read its header first); what changes is the
// work split, because the 16-rows-per-warp kernel is latency-bound (docs/kernel-notes.md sec. 6):
// - One CTA = 128 query rows, 4 warps x 32 rows. Each warp runs two m16 MMA
//   chains (rows 0-15 and 16-31 of its slice) that share every K and V fragment read by ldmatrix:
//   half the shared-memory reads per MMA, and two independent accumulator chains per warp.
// - Keys stream in 64-key chunks through a VC_MMA_STAGES-deep cp.async ring (one barrier per
//   chunk). A chunk is half a 128-key scale tile; the K scale and the V-Smooth mean are the tile's.
// - Online softmax per 64-key chunk: the running max M moves at most once per chunk instead of
//   once per 128-key tile. Where M rises inside a tile, the first half was encoded against a smaller
//   M, not the tile's max (reference.quantize_p with offset_block=64 is the exact emulation).
// - Q fragments stay in registers for D=64; for D=128 they are re-read from shared memory every
//   chunk (8 ldmatrix per warp per chunk): O (128) and S (64) already put D=128 at the 255-register
//   cap (ptxas -v per arch in docs/kernel-notes.md sec. 10).
// P's argument, its encoding into PV fragments and the rescale are attn_mma.cuh's p_row / p_arg /
// encode_p_fragments / rescale
// (one definition for both layouts); the integer form (VC_EXPCAST_INT) takes a0 and M per 64-key chunk.
//
// Build-time options of the PV accumulation (both 0 by default; docs/kernel-notes.md sec. 13):
// - VC_MMA_PV_F16=1: each chunk's PV partial accumulates in fp16 registers
//   (mma...f16.e4m3.e4m3.f16: half the partial's registers; on GeForce Ada / Blackwell twice the
//   fp32-accumulate rate) and is folded into the fp32 O once per chunk. Needs V codes within
//   +-kPvF16CodeMax (the backend shifts them by 2^-8, kernels/mma_pv_f16.py): see the bound below.
//   =2: the same partial, folded by the tensor core instead of the ALU: O rows are multiplied by
//   alpha only when some row of the warp moved its offset (alpha == 1 exactly otherwise), then
//   O += partial is one m16n8k8 f16 MMA per 8 columns with the 8x8 identity as B and O as the fp32
//   accumulator (one MMA instead of 8 conversions + 8 FFMA per thread).
// - VC_MMA_RESTORE_PER_TILE=1: the V-Smooth mean restore (l * mu / v_scale) runs once per 128-key
//   tile (its mean is the tile's) with the row sums of both chunks, instead of once per chunk:
//   one FFMA per O element per tile instead of per chunk, exact up to fp32 summation order.
// - VC_MMA_MEAN_SCALED=1: the kernel takes the mean already divided by v_scale, float32
//   (B,H,n_pad/128,D), from the backend (backend_mma.mean_operand: one elementwise pass over the
//   small mean tensor per call) instead of the fp16 mean, so a restore reads one float2 per column
//   pair instead of converting the fp16 mean and multiplying by 1/v_scale from shared memory (the
//   restore's short-scoreboard stalls, docs/kernel-notes.md section 19). Same shared memory with the
//   default 2 stages (the per-head 1/v_scale table goes; 3 and 4 stages take 2D and 4D bytes more),
//   bit-identical: the backend computes mean * (1 / v_scale) in fp32 as the kernel did.
#pragma once
#include "attn_mma.cuh"

namespace vc {

#ifndef VC_MMA_STAGES
#define VC_MMA_STAGES 2
#endif
constexpr int kWideStages = VC_MMA_STAGES;
static_assert(kWideStages >= 2 && kWideStages <= 4, "VC_MMA_STAGES must be 2, 3 or 4");
#ifndef VC_MMA_D64_STAGES
#define VC_MMA_D64_STAGES 0  // 2-4: the head-dim-64 kernels' ring depth (every other kernel keeps VC_MMA_STAGES)
#endif
#ifndef VC_MMA_D64_VSMOOTH_STAGES
#define VC_MMA_D64_VSMOOTH_STAGES 0  // 2-4: the head-dim-64 V-Smooth kernels' ring depth (before VC_MMA_D64_STAGES)
#endif
#ifndef VC_MMA_EXPCAST_STAGES
#define VC_MMA_EXPCAST_STAGES 0  // 2-4: the ExpCast kernels' ring depth, every head dim (before the two above)
#endif
static_assert(VC_MMA_D64_STAGES == 0 || (VC_MMA_D64_STAGES >= 2 && VC_MMA_D64_STAGES <= 4), "VC_MMA_D64_STAGES must be 0, 2, 3 or 4");
static_assert(VC_MMA_D64_VSMOOTH_STAGES == 0 || (VC_MMA_D64_VSMOOTH_STAGES >= 2 && VC_MMA_D64_VSMOOTH_STAGES <= 4),
              "VC_MMA_D64_VSMOOTH_STAGES must be 0, 2, 3 or 4");
static_assert(VC_MMA_EXPCAST_STAGES == 0 || (VC_MMA_EXPCAST_STAGES >= 2 && VC_MMA_EXPCAST_STAGES <= 4),
              "VC_MMA_EXPCAST_STAGES must be 0, 2, 3 or 4");
#ifndef VC_MMA_LATE_COPY
// 1: a chunk issues the next chunk's cp.async copies (and commits their group) after its QK MMAs instead of right
// after the barrier. Out of registers, ptxas recomputes the copies' addresses every chunk from the kernel parameters
// (S2R blockIdx, LDC, 64-bit IMADs: ~60 instructions in the head-dim-64 plain 8-bit kernel), and at the loop top
// every warp of the CTA runs that dependent chain at once behind the barrier before its first MMA: PC sampling put
// ~10% of that kernel's stall samples there (docs/kernel-notes.md 50). After the QK MMAs the chain issues in their
// shadow. The copy still lands a chunk ahead; the same data, the same output bit for bit. 0 (default): at the top
#define VC_MMA_LATE_COPY 0
#endif
#ifndef VC_MMA_K_SCALE_AHEAD
// 1: the K scale of the next chunk is loaded one chunk ahead (one register), so the scores' scale does not wait on a
// global load after the barrier (the head-dim-64 kernels' FMUL of q_scale * k_scale stalled the warp in order on it:
// long-scoreboard samples, docs/kernel-notes.md 50). The same values: bit-identical. 0 (default): loaded where used
#define VC_MMA_K_SCALE_AHEAD 0
#endif
#ifndef VC_MMA_MBAR_RING
// 1: the kernels with a ring of 3 or more stages (AttnMmaWide::kMbarRing) replace the per-chunk __syncthreads by
// per-stage mbarriers: a stage's "full" barrier completes when every thread's copies into it have landed
// (cp.async.mbarrier.arrive.noinc), its "empty" barrier when every thread has read it; a warp waits for the chunk it
// processes and, before refilling a stage, for the chunk that stage held two chunks back. The copies run one chunk
// ahead of the one processed as with the 2-stage ring (prefetch distance kWideStages - 2) and a CTA's warps may drift a
// chunk apart instead of meeting every chunk: PC sampling put 6-7% of the samples on the per-chunk barrier in the
// head-dim-64 fidelity and the head-dim-128 plain 8-bit kernels (docs/kernel-notes.md 50). The same data, the same
// output bit for bit. 0 (default): cp.async groups and a barrier per chunk
#define VC_MMA_MBAR_RING 0
#endif
// The ring depth of one kernel (WideSmem and AttnMmaWide shadow kWideStages with it). Per kernel because the
// measured best differs by kernel (docs/kernel-notes.md 49: a third stage took the ExpCast kernels at head dim 128
// 1-5% faster and the others 2-3% slower), the first rule that is set wins.
__host__ __device__ constexpr int wide_stages(int d, bool expcast, bool vsmooth) {
  return (expcast && VC_MMA_EXPCAST_STAGES != 0)                  ? VC_MMA_EXPCAST_STAGES
         : (d == 64 && vsmooth && VC_MMA_D64_VSMOOTH_STAGES != 0) ? VC_MMA_D64_VSMOOTH_STAGES
         : (d == 64 && VC_MMA_D64_STAGES != 0)                    ? VC_MMA_D64_STAGES
                                                                  : VC_MMA_STAGES;
}

#ifndef VC_MMA_PV_F16
#define VC_MMA_PV_F16 0
#endif
#ifndef VC_MMA_RESTORE_PER_TILE
#define VC_MMA_RESTORE_PER_TILE 0
#endif
#ifndef VC_MMA_MEAN_SCALED
#define VC_MMA_MEAN_SCALED 0
#endif
#ifndef VC_MMA_CLAMP_BOUND
// speed: a chunk whose scores cannot wrap their codes (vc_p::expcast_int_no_wrap with the rows' |score|
// bound from the Q tile, vc_p::int8_row_score_bound, once per CTA; one vote per chunk) encodes without the
// per-element clamp (one IMNMX per score) and without the rows' clamp bounds a_lo. On by default since the H200
// measured it (docs/kernel-notes.md section 35: speed -5.5% at head dim 64, -3.2% at Wan2.1-1.3B, same codes);
// -DVC_MMA_CLAMP_BOUND=0 builds the previous check for comparison
#define VC_MMA_CLAMP_BOUND 1
#endif
#ifndef VC_MMA_RESTORE_AFTER
// 1: the V-Smooth mean restore runs after the chunk's PV loop, in one warp-uniform branch over all of O
// (acc += l mu / v_scale), instead of inside each column pair's fold (part + l mu / v_scale, then the fold). The
// restore chunk pays the same FFMAs (two per O element either way); a chunk without a restore (with per-tile restores
// every other chunk, more with segments) then runs the plain fold with no branch inside the PV loop: ptxas kept one
// branch per column pair there (sm_89 fidelity chunk: 22 BRA against plain 8-bit's 4, docs/kernel-notes.md
// section 43). Same result up to the fp32 order of one sum: (alpha O + part) + l mu instead of alpha O + (part + l mu).
// 2: the same for head dim 64 only (AttnMmaWide::kRestoreAfter). The default builds take 1 on the native-FP8 archs and
// 2 on the via-f16 ones (kernels/mma_variants.default_variant; docs/kernel-notes.md section 44, H100): with 1 the
// via-f16 D=128 INT8 V-Smooth kernels spill 448 / 484 B instead of 80 / 120 B (fidelity / speed, sm_90a) and its
// Wan2.2-14B fidelity measured +0.7%, while its D=64 kernels run 6% faster (fidelity and speed) and spill a word
// at most (INT8 QK: 0 -> 4 B).
// 0 (the default here): the restore inside the fold, so the older named variants keep their meaning
#define VC_MMA_RESTORE_AFTER 0
#endif
#ifndef VC_MMA_D64_VSMOOTH_MIN_BLOCKS
#define VC_MMA_D64_VSMOOTH_MIN_BLOCKS 0
#endif
#ifndef VC_MMA_D64_MIN_BLOCKS
#define VC_MMA_D64_MIN_BLOCKS 0
#endif
#ifndef VC_MMA_PV_DIRECT
// 1 (builds with VC_MMA_E4M3_VIA_F16=1 and fp32 PV only): the PV MMAs accumulate straight into O, whose rows are
// multiplied by alpha before them only when some row of the warp moved its offset (alpha == 1 exactly otherwise: one
// vote per chunk), and the V-Smooth restore runs after the PV loop (as VC_MMA_RESTORE_AFTER=1). No per-chunk partial
// and no fold: one FFMA per O element per chunk (128 per thread at head dim 128) and the partial's 16 registers go.
// Through f16 the tensor core's accumulator is fp32 (HMMA.16816.F32), so only the order of the fp32 sums changes:
// alpha O + (p1 + p2) becomes (alpha O + p1) + p2. Never on native FP8 mma.sync, whose fp32 accumulator keeps fewer
// mantissa bits (SageAttention 2's reason for its two-level accumulation): the partial bounds that error per chunk.
// 2: the same except in the head-dim-64 kernels without V-Smooth (AttnMmaWide::kPvDirect), the via-f16 default's choice
// (docs/kernel-notes.md section 45, H100: plain 8-bit at head dim 64 22.95 -> 25.12 ms with it, every other kernel
// timed faster or equal)
#define VC_MMA_PV_DIRECT 0
#endif
#ifndef VC_MMA_V_F16
// 1 (builds with VC_MMA_E4M3_VIA_F16=1 and fp32 PV only): the kernel takes V as float16 values of the E4M3 codes
// (backend_mma.v_f16_operand: one pass over v_t, kernels/mma_v_f16.py) in the image of its shared-memory tile: per
// 64-key chunk a contiguous (D, 64) block of V^T rows whose 16-byte units sit at unit ^ (row & 7) (swizzled<128>), the
// keys permuted within each 16 so that ldmatrix hands every thread the f16 B fragments the via-f16 MMA would have
// unpacked (position 2t + j of a 16-key group holds key 4t + j, position 8 + 2t + j key 4t + 2 + j, j = 0, 1). The
// chunk's copy is then a flat one (one pointer plus immediates per thread: with rows n_pad apart, the eight 64-bit
// addresses per thread at head dim 128 cost registers). The via-f16 build converts each V fragment in every warp and
// chunk (64 of the 129 F2FP of a head-dim-64 warp chunk, 128 at 128; docs/kernel-notes.md 47): here nothing, for
// twice V's shared memory and L2 bytes. The same HMMAs on the same f16 values in the same order: bit-identical output.
// 2: only the head-dim-128 INT8 V-Smooth kernels (fidelity, speed) take V in f16, every other kernel the codes
// (v_f16_kernel below): measured faster there and slower elsewhere (docs/kernel-notes.md 48)
#define VC_MMA_V_F16 0
#endif
#ifndef VC_MMA_P_ALU_UNPACK
// 1 (VC_MMA_V_F16 builds): P's E4M3 codes become the PV MMAs' f16 A operand by two shifts and two masks per register
// (e4m3x4_to_f16x2x2_scaled) instead of two F2FP: the f16 is 2^-8 times the code's value, exactly, and the row sums
// come from the same operand, so O and l carry the same power of two and O / l, the mean restore (l mu / v_scale) and
// the output are unchanged (the LSE adds the 8). The byte pairs are (0, 2) and (1, 3), so V's key order in a 16-key
// group is position 2t + j -> key 4t + 2j, 8 + 2t + j -> 4t + 1 + 2j (kernels/mma_v_f16.py's PAIRED_KEY_ORDER). The
// F2FP of a head-dim-64 warp chunk go from 65 to 32 (docs/kernel-notes.md 47); the tensor core adds the 16 products
// of an MMA in another slot order, so the output is not the via-f16 build's bit for bit
#define VC_MMA_P_ALU_UNPACK 0
#endif
#ifndef VC_MMA_RESTORE_MMA
// 1 (mean-scaled builds; the kernels whose restore runs after the PV loop): the V-Smooth mean restore O += l mu / v_scale
// as a matrix product on the tensor core, once per 8 restores instead of one FFMA per O element per restore. The rows'
// sums of each restore wait in the A operand of an m16n8k8 TF32 MMA (restore j of a group in quad lane j % 4, the
// operand's column j: the slots are rescaled with O), B is the 8 restores' mu / v_scale read from the backend's float32
// mean table (global memory, each thread the two tiles of its columns t and t + 4), and each product runs as
// hi*hi + hi*lo + lo*hi of a tf32 split (split_tf32: ~2^-20 relative, as the Hopper kernel's VC_SM90_MEAN_MMA). The
// mean's shared-memory copy per chunk goes. Only the fp32 order and rounding of the restore's sums changes
// (docs/kernel-notes.md 46)
#define VC_MMA_RESTORE_MMA 0
#endif
#ifndef VC_MMA_ROW_SUM_ADD
// 1 (builds with VC_MMA_E4M3_VIA_F16=1): in the head-dim-64 kernels without V-Smooth the row sums come from f16 adds
// of the P values the PV MMAs' unpack already made, each thread its own keys' share (a tree of 7 HADD2 per row and
// chunk, then fp32), and the quad's four shares are added once, before the output: no ones-column MMA (8 of a
// head-dim-64 warp chunk's 72 HMMA, docs/kernel-notes.md 51; the MMA pipe's throttle was the largest stall there,
// section 50). A chunk's share of a row is at most 16 * 448 = 7168 (finite in f16); each of its five adds rounds to 11
// bits, so a share is within a few 2^-11 of the exact sum of its E4M3 values (the MMA's fp32 sum is exact), uncorrelated
// across chunks (the variant tier's output gate is 1e-3). At head dim 128 the shares' registers made the plain 8-bit
// kernel spill (0 -> 116 B, sm_90a): head dim 64 only. 2: also the head-dim-64 V-Smooth kernels whose mean restore runs
// after the PV loop (not by MMA): the restore's pending sums are shares too, and a restore chunk adds the quad's by two
// shuffles per row first (the restore flag is uniform across the CTA). 0 (default): the ones-column MMA everywhere
#define VC_MMA_ROW_SUM_ADD 0
#endif
static_assert(!VC_MMA_ROW_SUM_ADD || VC_MMA_E4M3_VIA_F16, "VC_MMA_ROW_SUM_ADD adds the via-f16 MMAs' unpacked P");
static_assert(!VC_MMA_RESTORE_MMA || VC_MMA_MEAN_SCALED, "VC_MMA_RESTORE_MMA reads the float32 mean / v_scale table");
static_assert(VC_MMA_PV_F16 >= 0 && VC_MMA_PV_F16 <= 2, "VC_MMA_PV_F16 must be 0, 1 or 2");
static_assert(!VC_MMA_PV_DIRECT || (VC_MMA_E4M3_VIA_F16 && VC_MMA_PV_F16 == 0),
              "VC_MMA_PV_DIRECT needs the f16 MMAs' fp32 accumulator (VC_MMA_E4M3_VIA_F16=1) and fp32 PV");
static_assert(VC_MMA_PV_DIRECT >= 0 && VC_MMA_PV_DIRECT <= 2, "VC_MMA_PV_DIRECT must be 0, 1 or 2");
static_assert(VC_MMA_RESTORE_AFTER >= 0 && VC_MMA_RESTORE_AFTER <= 2, "VC_MMA_RESTORE_AFTER must be 0, 1 or 2");
static_assert(!VC_MMA_V_F16 || (VC_MMA_E4M3_VIA_F16 && VC_MMA_PV_F16 == 0),
              "VC_MMA_V_F16 feeds the via-f16 MMAs' f16 B operand (VC_MMA_E4M3_VIA_F16=1) with fp32 PV");
static_assert(VC_MMA_V_F16 >= 0 && VC_MMA_V_F16 <= 2, "VC_MMA_V_F16 must be 0, 1 or 2");
static_assert(!VC_MMA_P_ALU_UNPACK || VC_MMA_V_F16 == 1, "VC_MMA_P_ALU_UNPACK pairs with VC_MMA_V_F16=1's key order");
// Whether the kernel of head dim d, QK format and V mode takes V^T as f16 (VC_MMA_V_F16); attn_mma_v_f16_kernel gives
// the binding the same answer, kernels/mma_v_f16.takes_v_f16 the backend
__host__ __device__ constexpr bool v_f16_kernel(int d, bool qk_fp8, bool vsmooth) {
  return VC_MMA_V_F16 == 1 || (VC_MMA_V_F16 == 2 && d == 128 && vsmooth && !qk_fp8);
}
constexpr bool kPvF16 = VC_MMA_PV_F16 != 0;
constexpr bool kPvF16MmaFold = VC_MMA_PV_F16 == 2;
constexpr bool kRestorePerTile = VC_MMA_RESTORE_PER_TILE;
constexpr bool kMeanScaled = VC_MMA_MEAN_SCALED;

constexpr int kWideChains = 2;                           // m16 row blocks per warp
constexpr int kWideRowsPerWarp = 16 * kWideChains;       // 32
constexpr int kWideRows = kAttnWarps * kWideRowsPerWarp;  // 128 query rows per CTA
constexpr int kChunkKeys = 64;                           // keys per stage and per softmax step
constexpr int kChunksPerTile = kKBlock / kChunkKeys;

// fp16 partial, overflow bound: |P| <= 448 (every P encoding ends in a satfinite E4M3 cast, row max
// 448 in speed mode, 256 with exp2) and |V code| <= 1.75 (the 2^-8 shift of kernels/mma_pv_f16.py),
// so a 64-key chunk's partial is at most 64 * 448 * 1.75 = 50176, also after the fp16 rounding of
// the first 32-key MMA's result (+16): below 65504, the largest finite fp16.
constexpr float kPvF16CodeMax = 1.75f;
static_assert(kChunkKeys * kE4m3Max * kPvF16CodeMax + 32.0f < 65504.0f, "the fp16 PV partial could overflow");

// 50 KB for D=128 with 2 stages: two CTAs fit the 100 KB of an Ada / consumer-Blackwell SM.
// kVF16: V^T in f16 (v_f16_kernel), two bytes per element; kStages: the kernel's ring depth (wide_stages)
template <int D, bool kVF16, int kStages>
struct WideSmem {
  static constexpr int kWideStages = kStages;
  static constexpr int kQ = kWideRows * D;    // Q tile, bytes
  static constexpr int kK = kChunkKeys * D;   // one K chunk
  static constexpr int kVRow = kChunkKeys * (kVF16 ? 2 : 1);  // bytes of one V^T row (a head-dim column's 64 keys)
  static constexpr int kV = D * kVRow;                  // one transposed V chunk
  static constexpr int kMean = D * (kMeanScaled ? 4 : 2);  // the chunk's tile mean: fp16, or fp32 mean / v_scale
  static constexpr int kOffK = kQ;
  static constexpr int kOffV = kOffK + kWideStages * kK;
  static constexpr int kOffMean = kOffV + kWideStages * kV;
  static constexpr int kOffInvScale = kOffMean + kWideStages * kMean;  // 1 / v_scale per column (fp16 mean only)
  // VC_MMA_MBAR_RING: the stages' full and empty mbarriers, 8 bytes each, after the rest (only in builds with the flag)
  static constexpr int kOffBars = (kOffInvScale + (kMeanScaled ? 0 : D * 4) + 7) / 8 * 8;
  static constexpr int kBytes = VC_MMA_MBAR_RING ? kOffBars + 2 * kWideStages * 8 : kOffInvScale + (kMeanScaled ? 0 : D * 4);
};

// VC_MMA_MBAR_RING's mbarriers (shared-memory addresses), in forms every portable arch has (sm_80+: test_wait, and the
// arrive with a state register rather than the sm_90 sink)
__device__ __forceinline__ void ring_bar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void ring_bar_arrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared.b64 state, [%0];\n}\n" ::"r"(bar) : "memory");
}
// arrives once this thread's cp.async copies issued so far have landed (counted in the barrier's expected arrivals)
__device__ __forceinline__ void ring_bar_arrive_copies(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void ring_bar_wait(uint32_t bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n.reg .pred done;\nRING_WAIT_%=:\nmbarrier.try_wait.parity.shared.b64 done, [%0], %1;\n@!done bra RING_WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
#else
  asm volatile(
      "{\n.reg .pred done;\nRING_WAIT_%=:\nmbarrier.test_wait.parity.shared.b64 done, [%0], %1;\n@!done bra RING_WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
#endif
}

// Copies a [kRows x kRowBytes] tile (global rows `src_stride` bytes apart) into swizzled shared
// memory. Each thread copies a run of consecutive 16-byte chunks of ONE row, so its addresses are
// one global pointer and one shared offset plus immediates: the loop-invariant per-copy 64-bit
// addresses of load_tile_async's strided split cost registers the wide kernel does not have.
//
// VC_MMA_COALESCED_COPY=1 maps the lanes along the rows instead: copy c of thread t is chunk
// t % kChunksPerRow of row c * kRowsPerCopy + t / kChunksPerRow, so one warp instruction reads whole
// rows (4 rows of 128 B, or 8 of 64 B: full 32-byte sectors). The run mapping above makes each
// instruction read half of 32 sectors (the two 16-byte halves of a sector belong to different
// copies), i.e. every sector is requested from L2 twice. The swizzle only uses row bits below
// kRowsPerCopy, so the shared offsets stay one register plus immediates; the global offset of copy
// c is c * kRowsPerCopy * src_stride (an immediate for K and Q, one add per copy for V).
#ifndef VC_MMA_COALESCED_COPY
#define VC_MMA_COALESCED_COPY 0
#endif
template <int kRowBytes, int kRows, bool kKeyRows = false>
__device__ __forceinline__ void load_rows_async(uint32_t dst, const uint8_t* src, int64_t src_stride) {
  constexpr int kChunksPerRow = kRowBytes / 16;
  constexpr int kRun = kRows * kChunksPerRow / kAttnThreads;  // chunks per thread
  static_assert(kRun >= 1 && kChunksPerRow % kRun == 0, "each thread copies whole runs within one row");
  if constexpr (VC_MMA_COALESCED_COPY) {
    constexpr int kRowsPerCopy = kAttnThreads / kChunksPerRow;  // 16 rows of 128 B, 32 of 64 B
    // swizzled() mixes row bits 0-3 at most: rows r and r + kRowsPerCopy share a pattern
    static_assert(kRowsPerCopy % 16 == 0, "the swizzle must repeat every kRowsPerCopy rows");
    const int row = threadIdx.x / kChunksPerRow, chunk = threadIdx.x % kChunksPerRow;
    // swizzled(row, chunk) as one XOR of the unswizzled offset threadIdx.x * 16 (attn_mma.cuh's third identity;
    // AttnMmaWide::addresses_match() checks it for every thread)
    const uint32_t dst0 = dst + ((threadIdx.x * 16u) ^ uint32_t(swizzle_mix<kRowBytes, kKeyRows>(row) << 4));
    const uint8_t* src0 = src + row * src_stride + chunk * 16;
#pragma unroll
    for (int c = 0; c < kRun; ++c)
      cp_async_16(dst0 + c * kRowsPerCopy * kRowBytes, src0 + int64_t(c) * kRowsPerCopy * src_stride);
  } else {
    constexpr int kThreadsPerRow = kChunksPerRow / kRun;
    const int row = threadIdx.x / kThreadsPerRow, first = (threadIdx.x % kThreadsPerRow) * kRun;
    const uint8_t* row_src = src + row * src_stride + first * 16;
#pragma unroll
    for (int c = 0; c < kRun; ++c) cp_async_16(dst + swizzled<kRowBytes, kKeyRows>(row, first + c), row_src + c * 16);
  }
}

// kLanes (VCConfig.k_lane_scales): the K scales are per quad lane (k_scale (B,H,n_pad/128,4)): each thread multiplies by
// its lane's, keeps its integer row maxima as its lane's speed anchors and the quad reduces the row maximum in float,
// after the scale (reference.quantize_p with lanes); INT8 V-Smooth only
template <int D, bool kQkFp8, bool kExpCast, bool kVSmooth, bool kLanes = false>
struct AttnMmaWide {
  static_assert(!kLanes || (!kQkFp8 && kVSmooth), "K scales per lane: INT8 scores with V-Smooth");
  static constexpr int kKSteps = D / 32;             // MMA k-steps over the head dim (QK)
  static constexpr int kKeyTiles = kChunkKeys / 8;   // n-tiles of S per chunk
  static constexpr int kDimTiles = D / 8;            // n-tiles of O
  static constexpr int kPSteps = kChunkKeys / 32;    // MMA k-steps over keys (PV) per chunk
  // Q fragments in registers at head dim 64 (16 per thread), re-read from shared memory every chunk at 128 and in the
  // head-dim-64 kernels bound to more CTAs per SM (VC_MMA_D64_MIN_BLOCKS, VC_MMA_D64_VSMOOTH_MIN_BLOCKS: the 16
  // registers are what keeps their INT8 kernels from spilling at 168)
  static constexpr bool kBoundD64 = D == 64 && (VC_MMA_D64_MIN_BLOCKS || (VC_MMA_D64_VSMOOTH_MIN_BLOCKS && kVSmooth));
  static constexpr bool kQInRegs = D == 64 && !kBoundD64;
  // VC_MMA_RESTORE_AFTER: the mean restore after the PV loop (1: every head dim, 2: head dim 64 only)
  // VC_MMA_PV_DIRECT: PV straight into O (2: not in the head-dim-64 kernels without V-Smooth)
  static constexpr bool kPvDirect = VC_MMA_PV_DIRECT == 1 || (VC_MMA_PV_DIRECT == 2 && (D != 64 || kVSmooth));
  static constexpr bool kRestoreAfter = VC_MMA_RESTORE_AFTER == 1 || (VC_MMA_RESTORE_AFTER == 2 && D == 64) || kPvDirect;
  // VC_MMA_RESTORE_MMA: the restores gathered 8 at a time and added by TF32 MMAs (flush_restores)
  static constexpr bool kRestoreMma = VC_MMA_RESTORE_MMA && kVSmooth && kRestoreAfter;
  static constexpr int kRestoreSlots = 8;  // the TF32 MMA's k
  static constexpr int kWideStages = wide_stages(D, kExpCast, kVSmooth);  // the cp.async ring's depth
  // per-stage mbarriers instead of the per-chunk barrier (VC_MMA_MBAR_RING; a stage of slack needs 3 or more)
  static constexpr bool kMbarRing = VC_MMA_MBAR_RING && kWideStages >= 3;
  // chunks copied ahead of the one processed: the ring less the stage being read (and with mbarriers, less the stage
  // the slowest warp may still read)
  static constexpr int kAhead = kMbarRing ? kWideStages - 2 : kWideStages - 1;
  static constexpr bool kVF16 = v_f16_kernel(D, kQkFp8, kVSmooth);  // V^T in f16 (VC_MMA_V_F16)
  static constexpr bool kPScaled = VC_MMA_P_ALU_UNPACK && kVF16;     // P enters the PV and row-sum MMAs as 2^-8 P
  // per-thread row sums from f16 adds (VC_MMA_ROW_SUM_ADD): head dim 64, P unpacked by cvt; V-Smooth with =2
  static constexpr bool kRowSumAdd = VC_MMA_ROW_SUM_ADD && D == 64 && !kPScaled &&
                                      (!kVSmooth || (VC_MMA_ROW_SUM_ADD == 2 && kRestoreAfter && !kRestoreMma));
  static constexpr int kVBytes = kVF16 ? 2 : 1;                       // bytes per element of the V^T tile
  using Smem = WideSmem<D, kVF16, kWideStages>;
  using SAcc = std::conditional_t<kQkFp8, float, int>;
  using Encoder = AttnMma<D, kQkFp8, kExpCast, kVSmooth>;

  // ---- ldmatrix addresses: one per thread and operand, at k-step 0 of row block 0. k-step ks is that address
  // `^ (ks << 5)`, chain / pair c is `+ 16 c rows` (an immediate of the ldmatrix), the ring stage a uniform add
  // (attn_mma.cuh, swizzled's identities): the chunk pays one LOP3 per k-step and operand instead of a swizzle per
  // fragment. The XOR reaches bits 5-6 of the whole address, so every tile base must have bits 0-6 clear: the dynamic
  // shared memory is __align__(128) and every offset below is a multiple of 128 (static_assert). Kept as macros:
  // as member functions ptxas placed the chunk's registers differently (more spills in the D=64 speed kernel).
  // Q rows warp_row0 + (matrix & 1) * 8 + r, chunk matrix >> 1
#define VC_WIDE_Q_LANE(lane) swizzled<D>((((lane) >> 3) & 1) * 8 + ((lane) & 7), (lane) >> 4)
  // K rows in the permuted key order 4 (r >> 1) + 2 (matrix >> 1) + (r & 1), chunk matrix & 1
#define VC_WIDE_K_LANE(lane) swizzled<D, true>(4 * (((lane) & 7) >> 1) + 2 * ((lane) >> 4) + ((lane) & 1), ((lane) >> 3) & 1)
  // V^T rows (head-dim columns) (matrix >> 1) * 8 + r, chunk matrix & 1
#define VC_WIDE_V_LANE(lane) swizzled<kChunkKeys>(((lane) >> 4) * 8 + ((lane) & 7), ((lane) >> 3) & 1)
  // f16 V^T (kVF16) rows of 128 bytes: n-tile row r, 16-byte chunk 4 ks + matrix (one n-tile per ldmatrix.x4; k-step ks
  // is `^ (ks << 6)`, n-tile i `+ 8 i rows`)
#define VC_WIDE_V16_LANE(lane) swizzled<2 * kChunkKeys>((lane) & 7, (lane) >> 3)
  static_assert(Smem::kOffK % 128 == 0 && Smem::kK % 128 == 0 && Smem::kOffV % 128 == 0 && Smem::kV % 128 == 0,
                "the ldmatrix address XOR needs 128-byte aligned tile bases");

  // every lane's address forms against swizzled() itself, for each warp, chain / pair and k-step, and the coalesced
  // copies' XOR form for each thread: the same bytes are read as with a swizzle per fragment
  static constexpr bool addresses_match() {
    for (int lane = 0; lane < 32; ++lane) {
      const int matrix = lane >> 3, r = lane & 7;
      for (int ks = 0; ks < kKSteps; ++ks) {
        for (int warp = 0; warp < kAttnWarps; ++warp)
          for (int c = 0; c < kWideChains; ++c) {
            const int row0 = warp * kWideRowsPerWarp;
            if (row0 * D + ((VC_WIDE_Q_LANE(lane) ^ uint32_t(ks << 5)) + 16 * c * D) !=
                swizzled<D>(row0 + 16 * c + (matrix & 1) * 8 + r, 2 * ks + (matrix >> 1)))
              return false;
          }
        for (int pair = 0; pair < kKeyTiles / 2; ++pair)
          if ((VC_WIDE_K_LANE(lane) ^ uint32_t(ks << 5)) + 16 * pair * D !=
              swizzled<D, true>(16 * pair + 4 * (r >> 1) + 2 * (matrix >> 1) + (r & 1), 2 * ks + (matrix & 1)))
            return false;
      }
      for (int ks = 0; ks < kPSteps; ++ks)
        for (int pair = 0; pair < kDimTiles / 2; ++pair)
          if ((VC_WIDE_V_LANE(lane) ^ uint32_t(ks << 5)) + 16 * pair * kChunkKeys !=
              swizzled<kChunkKeys>(16 * pair + (matrix >> 1) * 8 + r, 2 * ks + (matrix & 1)))
            return false;
      for (int ks = 0; ks < kPSteps; ++ks)
        for (int i = 0; i < kDimTiles; ++i)
          if ((VC_WIDE_V16_LANE(lane) ^ uint32_t(ks << 6)) + 8 * i * 2 * kChunkKeys !=
              swizzled<2 * kChunkKeys>(8 * i + r, 4 * ks + matrix))
            return false;
    }
    for (int tid = 0; tid < kAttnThreads; ++tid) {  // load_rows_async's coalesced form, Q / K / V^T tiles
      if (((tid * 16) ^ (swizzle_mix<D>(tid / (D / 16)) << 4)) != int(swizzled<D>(tid / (D / 16), tid % (D / 16))) ||
          ((tid * 16) ^ (swizzle_mix<D, true>(tid / (D / 16)) << 4)) != int(swizzled<D, true>(tid / (D / 16), tid % (D / 16))) ||
          ((tid * 16) ^ (swizzle_mix<kChunkKeys>(tid / 4) << 4)) != int(swizzled<kChunkKeys>(tid / 4, tid % 4)))
        return false;
    }
    return true;
  }
  static_assert(addresses_match(), "an ldmatrix / cp.async address form reads other bytes than swizzled()");

  // per-thread online-softmax state: chain c, rows g and g+8 of that chain's 16
  float acc[kWideChains][kDimTiles][4];
  float row_offset[kWideChains][2];  // M, the running max of the scaled scores (-inf before the first chunk)
  float row_sum[kWideChains][2];
  static constexpr bool kDeferRestore = kVSmooth && kRestorePerTile;
  // V-Smooth segments (p.v_seg_end): the restore on a segment's last tile only, in the mean-scaled builds (the
  // backend's); the older variants restore every tile, which is right for segment means too (equal in their
  // slots) and keeps their registers as they were (the flag's load took wide-restoretile's sm_90a speed
  // kernel from 292 to 312 B of spills)
  static constexpr bool kSegments = kDeferRestore && kMeanScaled;
  float l_pending[kWideChains][2];  // kDeferRestore: row sums of the tile's chunks not yet restored
  // kRestoreMma: the pending restores' row sums as the TF32 A operand (rows g, g + 8 at slots t, then t + 4), the tiles
  // whose means are this thread's B (slots t and t + 4) and the restores so far (uniform)
  float l_slot[kWideChains][4];
  int slot_tile[2];
  int n_restored;
  uint32_t q_frag[kQInRegs ? kWideChains : 1][kQInRegs ? kKSteps : 1][4];
  // VC_MMA_CLAMP_BOUND: per chain, |score| <= q_bound for both of this thread's rows (set before the chunk loop)
  static constexpr bool kClampBound = VC_MMA_CLAMP_BOUND && kExpCast && !kQkFp8 && !VC_EXPCAST_BYTE_CODES;
  float q_bound[kWideChains];

  __device__ __forceinline__ void run(const AttnParams& p, uint8_t* smem) {
    const int bh = blockIdx.y;
    const int q_row0 = blockIdx.x * kWideRows;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int warp_row0 = warp * kWideRowsPerWarp;
    const int n_tiles = p.n_pad / kKBlock;
    const int n_chunks = (p.n + kChunkKeys - 1) / kChunkKeys;  // chunks past the last key are skipped
    const uint32_t sbase = smem_addr(smem);
    const uint8_t* q_src = static_cast<const uint8_t*>(p.q_q) + (int64_t(bh) * p.n_pad + q_row0) * D;
    const uint8_t* k_src = static_cast<const uint8_t*>(p.k_q) + int64_t(bh) * p.n_pad * D;
    const uint8_t* v_src = p.v_t + int64_t(bh) * D * p.n_pad * kVBytes;
    const uint8_t* mean_src = reinterpret_cast<const uint8_t*>(p.v_mean) + int64_t(bh) * n_tiles * Smem::kMean;
    float* inv_scale = reinterpret_cast<float*>(smem + Smem::kOffInvScale);

    auto load_chunk = [&](int chunk) {
      const int stage = chunk % kWideStages;
      load_rows_async<D, kChunkKeys, true>(sbase + Smem::kOffK + stage * Smem::kK, k_src + int64_t(chunk) * kChunkKeys * D, D);
      if constexpr (kVF16) {  // the tile's image, contiguous: a flat copy
        constexpr int kCopies = Smem::kV / (16 * kAttnThreads);
        const uint32_t dst = sbase + Smem::kOffV + stage * Smem::kV + threadIdx.x * 16;
        const uint8_t* src = v_src + int64_t(chunk) * Smem::kV + threadIdx.x * 16;
#pragma unroll
        for (int c = 0; c < kCopies; ++c) cp_async_16(dst + c * 16 * kAttnThreads, src + c * 16 * kAttnThreads);
      } else {
        load_rows_async<kChunkKeys, D>(sbase + Smem::kOffV + stage * Smem::kV, v_src + int64_t(chunk) * kChunkKeys, p.n_pad);
      }
      if constexpr (kVSmooth && !kRestoreMma) {  // (kRestoreMma reads the means from global memory at a flush)
        if (threadIdx.x < Smem::kMean / 16)
          cp_async_16(sbase + Smem::kOffMean + stage * Smem::kMean + threadIdx.x * 16,
                      mean_src + int64_t(chunk / kChunksPerTile) * Smem::kMean + threadIdx.x * 16);
      }
      if constexpr (kMbarRing) ring_bar_arrive_copies(full_bar(sbase, stage));  // (with Q's copies before chunk 0's)
    };
    if constexpr (kMbarRing) {  // every thread arrives once per fill and once per read of each stage
      if (threadIdx.x == 0) {
        for (int st = 0; st < kWideStages; ++st) {
          ring_bar_init(full_bar(sbase, st), kAttnThreads);
          ring_bar_init(empty_bar(sbase, st), kAttnThreads);
        }
      }
      __syncthreads();
    }

    // prologue: Q and the first kWideStages-1 chunks, one commit group per chunk (Q rides in the first)
    load_rows_async<D, kWideRows>(sbase, q_src, D);
    if constexpr (kMbarRing) {
#pragma unroll
      for (int c = 0; c < kAhead; ++c)
        if (c < n_chunks) load_chunk(c);
      cp_async_commit();
    } else {
#pragma unroll
      for (int c = 0; c < kWideStages - 1; ++c) {
        if (c < n_chunks) load_chunk(c);
        cp_async_commit();
      }
    }
    if constexpr (kVSmooth && !kMeanScaled) {
      for (int c = threadIdx.x; c < D; c += kAttnThreads) inv_scale[c] = 1.0f / p.v_scale[int64_t(bh) * D + c];
      if constexpr (kMbarRing) __syncthreads();  // (the per-chunk barrier published the table before)
    }
#pragma unroll
    for (int c = 0; c < kWideChains; ++c) {
#pragma unroll
      for (int i = 0; i < kDimTiles; ++i) acc[c][i][0] = acc[c][i][1] = acc[c][i][2] = acc[c][i][3] = 0.0f;
      row_offset[c][0] = row_offset[c][1] = -INFINITY;
      row_sum[c][0] = row_sum[c][1] = 0.0f;
      l_pending[c][0] = l_pending[c][1] = 0.0f;
      l_slot[c][0] = l_slot[c][1] = l_slot[c][2] = l_slot[c][3] = 0.0f;
    }
    slot_tile[0] = slot_tile[1] = 0;  // an empty slot's B: any finite mean (times a zero row sum)
    n_restored = 0;
    const float* mean_bh = reinterpret_cast<const float*>(p.v_mean) + int64_t(bh) * n_tiles * D;
    // the scales of this thread's rows g and g+8 of each chain (rows < n_pad; padded rows have 0)
    const float* q_sc_rows = p.q_scale + int64_t(bh) * p.n_pad + q_row0 + warp_row0 + (lane >> 2);
    float q_scale[kWideChains][2];
#pragma unroll
    for (int c = 0; c < kWideChains; ++c) {
      q_scale[c][0] = q_sc_rows[16 * c];
      q_scale[c][1] = q_sc_rows[16 * c + 8];
    }

    if constexpr (kClampBound) {
      // the Q tile (rows of D bytes, 16-byte chunks swizzled within a row) rides in the first commit group: wait
      // for it once here (the loop's first wait then finds it done) and bound this thread's rows' scores
      if constexpr (kMbarRing) {
        ring_bar_wait(full_bar(sbase, 0), 0);
      } else {
        cp_async_wait<kWideStages - 2>();
        __syncthreads();
      }
      const int g = lane >> 2, t = lane & 3;
#pragma unroll
      for (int c = 0; c < kWideChains; ++c) {
        const uint8_t* row = smem + (warp_row0 + 16 * c + g) * D;
        q_bound[c] = static_cast<float>(max(vc_p::int8_row_score_bound<D>(row, t), vc_p::int8_row_score_bound<D>(row + 8 * D, t)));
      }
    }

    // VC_MMA_K_SCALE_AHEAD: this thread's K scale of chunk c (its tile's; per quad lane with kLanes)
    auto k_scale_of = [&](int c) {
      const int64_t tile_index = int64_t(bh) * n_tiles + c / kChunksPerTile;
      return kLanes ? p.k_scale[tile_index * kKLanes + (lane & 3)] : p.k_scale[tile_index];
    };
    float k_scale_ahead = VC_MMA_K_SCALE_AHEAD ? k_scale_of(0) : 0.0f;
    for (int chunk = 0; chunk < n_chunks; ++chunk) {
      if constexpr (kMbarRing) {  // this chunk's copies by every thread have landed
        ring_bar_wait(full_bar(sbase, chunk % kWideStages), (chunk / kWideStages) & 1);
      } else {
        cp_async_wait<kWideStages - 2>();
        // chunk's data visible to all warps, and every warp is done with the stage refilled below
        __syncthreads();
      }
      const int next = chunk + kAhead;
      auto issue_copy = [&] {
        if constexpr (kMbarRing) {
          if (next < n_chunks) {
            // the stage's previous chunk (next - kWideStages, two before this one) read by every thread
            if (next >= kWideStages) ring_bar_wait(empty_bar(sbase, next % kWideStages), ((next - kWideStages) / kWideStages) & 1);
            load_chunk(next);
            cp_async_commit();  // (no group is waited on; the copies' arrival is the mbarrier's)
          }
        } else {
          if (next < n_chunks) load_chunk(next);
          cp_async_commit();
        }
      };
      if constexpr (!VC_MMA_LATE_COPY) issue_copy();
      auto after_qk = [&] {
        if constexpr (VC_MMA_LATE_COPY) issue_copy();
      };
      if constexpr (kQInRegs) {
        if (chunk == 0) load_q_fragments(sbase, warp_row0, lane);
      }
      const int64_t tile_index = int64_t(bh) * n_tiles + chunk / kChunksPerTile;
      float k_scale;
      if constexpr (VC_MMA_K_SCALE_AHEAD) {
        k_scale = k_scale_ahead;
        if (chunk + 1 < n_chunks) k_scale_ahead = k_scale_of(chunk + 1);
      } else {
        k_scale = k_scale_of(chunk);
      }
      float scale[kWideChains][2];
#pragma unroll
      for (int c = 0; c < kWideChains; ++c) {
        scale[c][0] = q_scale[c][0] * k_scale;
        scale[c][1] = q_scale[c][1] * k_scale;
      }
      const int valid = p.n - chunk * kChunkKeys;  // keys of this chunk that are real (> 0)
      // the mean restore runs on a tile's last chunk (every chunk unless kDeferRestore), and with V-Smooth
      // segments only on a segment's last tile: l_pending carries the row sums since the last restore in O's
      // running scale, and the segment's mean is in every one of its slots, so one FFMA per O element per
      // segment restores them all
      const bool tile_end = chunk % kChunksPerTile == kChunksPerTile - 1;
      const bool restore = !kDeferRestore || chunk + 1 == n_chunks ||
                           (tile_end && (!kSegments || p.v_seg_end == nullptr || p.v_seg_end[tile_index] != 0));
      const int tile = chunk / kChunksPerTile;
      if (valid < kChunkKeys) {
        process_chunk<true>(sbase, chunk % kWideStages, scale, valid, warp_row0, lane, smem, true, tile, mean_bh, after_qk);
      } else {
        process_chunk<false>(sbase, chunk % kWideStages, scale, kChunkKeys, warp_row0, lane, smem, restore, tile, mean_bh,
                             after_qk);
      }
      if constexpr (kMbarRing) ring_bar_arrive(empty_bar(sbase, chunk % kWideStages));  // done reading the stage
    }
    if constexpr (kRestoreMma) {
      if (n_restored % kRestoreSlots != 0) flush_restores(mean_bh, lane);  // the last group (the last chunk restores)
    }
    store_output(p, bh, q_row0 + warp_row0, lane);
  }

  // the sum of x over the four threads of a quad (kRowSumAdd: a row's four shares)
  static __device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
  }

  // VC_MMA_MBAR_RING: the shared-memory addresses of stage st's full and empty mbarriers
  static __device__ __forceinline__ uint32_t full_bar(uint32_t sbase, int st) { return sbase + Smem::kOffBars + 8 * st; }
  static __device__ __forceinline__ uint32_t empty_bar(uint32_t sbase, int st) {
    return sbase + Smem::kOffBars + 8 * (kWideStages + st);
  }

  // q_addr: this thread's Q address at k-step 0 of chain 0 (sbase + warp_row0 * D + VC_WIDE_Q_LANE)
  __device__ __forceinline__ void q_fragment(uint32_t (&a)[4], uint32_t q_addr, int chain, int ks) const {
    ldmatrix_x4(a, (q_addr ^ uint32_t(ks << 5)) + 16 * chain * D);
  }

  __device__ __forceinline__ void load_q_fragments(uint32_t sbase, int warp_row0, int lane) {
    const uint32_t q_addr = sbase + warp_row0 * D + VC_WIDE_Q_LANE(lane);
#pragma unroll
    for (int c = 0; c < kWideChains; ++c)
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) q_fragment(q_frag[c][ks], q_addr, c, ks);
  }

  // one 64-key chunk in ring stage `stage`; its first `valid` keys are real; `restore`: add the
  // V-Smooth mean term of the rows' pending sums (always true unless kDeferRestore). A runtime,
  // warp-uniform flag: a third inlined chunk body (template flag) spilled 328 B on sm_89.
  // after_qk(): runs once the QK MMAs are issued (VC_MMA_LATE_COPY: the next chunk's copy)
  template <bool kMask, typename AfterQk>
  __device__ __forceinline__ void process_chunk(uint32_t sbase, int stage, const float (&scale)[kWideChains][2], int valid,
                                                int warp_row0, int lane, uint8_t* smem, bool restore, int tile,
                                                const float* mean_bh, AfterQk&& after_qk) {
    const int t = lane & 3;
    // ---- S = Q K^T for both chains; k-step outer so consecutive MMAs are independent
    SAcc s[kWideChains][kKeyTiles][4];
#pragma unroll
    for (int c = 0; c < kWideChains; ++c)
#pragma unroll
      for (int i = 0; i < kKeyTiles; ++i) s[c][i][0] = s[c][i][1] = s[c][i][2] = s[c][i][3] = SAcc(0);
    const uint32_t k_addr = sbase + Smem::kOffK + stage * Smem::kK + VC_WIDE_K_LANE(lane);
    const uint32_t q_addr = sbase + warp_row0 * D + VC_WIDE_Q_LANE(lane);
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      uint32_t a[kWideChains][4];
#pragma unroll
      for (int c = 0; c < kWideChains; ++c) {
        if constexpr (kQInRegs) {
#pragma unroll
          for (int j = 0; j < 4; ++j) a[c][j] = q_frag[c][ks][j];
        } else {
          q_fragment(a[c], q_addr, c, ks);
        }
      }
      const uint32_t k_step = k_addr ^ uint32_t(ks << 5);
#pragma unroll
      for (int pair = 0; pair < kKeyTiles / 2; ++pair) {
        uint32_t b[4];
        ldmatrix_x4(b, k_step + 16 * pair * D);
#pragma unroll
        for (int c = 0; c < kWideChains; ++c) {
          if constexpr (kQkFp8) {
            mma_e4m3(s[c][2 * pair], a[c], b[0], b[1]);
            mma_e4m3(s[c][2 * pair + 1], a[c], b[2], b[3]);
          } else {
            mma_s8(s[c][2 * pair], a[c], b[0], b[1]);
            mma_s8(s[c][2 * pair + 1], a[c], b[2], b[3]);
          }
        }
      }
    }
    after_qk();
    // key index (within the chunk) of accumulator element e of n-tile i for this thread
    auto key_of = [&](int i, int e) { return 16 * (i >> 1) + 4 * t + 2 * (i & 1) + (e & 1); };

    // ---- row max -> new running offset per chain and row (max of raw scores; scale >= 0)
    float alpha[kWideChains][2];
    typename Encoder::ArgRow prow[kWideChains][2];
    int chunk_max_int[kWideChains][2];  // int8 scores: the exact integer max, a0 of the integer form
    float chunk_max[kWideChains][2];    // FP8 scores: a0 of the float-score form
#pragma unroll
    for (int c = 0; c < kWideChains; ++c) {
      float tile_max[2];
      if constexpr (kQkFp8) {
        float m[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int i = 0; i < kKeyTiles; ++i)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (!kMask || key_of(i, e) < valid) m[e >> 1] = fmaxf(m[e >> 1], s[c][i][e]);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          m[h] = fmaxf(m[h], __shfl_xor_sync(0xffffffffu, m[h], 1));
          tile_max[h] = fmaxf(m[h], __shfl_xor_sync(0xffffffffu, m[h], 2));
        }
      } else {
        int m[2] = {INT_MIN, INT_MIN};
#pragma unroll
        for (int i = 0; i < kKeyTiles; ++i)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (!kMask || key_of(i, e) < valid) m[e >> 1] = max(m[e >> 1], s[c][i][e]);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if constexpr (!kLanes) {
            m[h] = max(m[h], __shfl_xor_sync(0xffffffffu, m[h], 1));
            m[h] = max(m[h], __shfl_xor_sync(0xffffffffu, m[h], 2));
          }
          chunk_max_int[c][h] = m[h];  // kLanes: this lane's own (the anchor of its codes), INT_MIN if none is valid
          tile_max[h] = small_int_to_float(m[h]);
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        chunk_max[c][h] = tile_max[h];
        float step_max = tile_max[h] * scale[c][h];
        if constexpr (kLanes) {  // the row's maximum over the quad's four lanes, each with its own scale
          if (kMask && chunk_max_int[c][h] == INT_MIN) step_max = -INFINITY;  // a lane without a valid key of the chunk
          step_max = fmaxf(step_max, __shfl_xor_sync(0xffffffffu, step_max, 1));
          step_max = fmaxf(step_max, __shfl_xor_sync(0xffffffffu, step_max, 2));
        }
        const float offset = fmaxf(row_offset[c][h], step_max);
        alpha[c][h] = Encoder::rescale(row_offset[c][h] - offset);
        row_offset[c][h] = offset;
        prow[c][h] = Encoder::p_row(scale[c][h], offset);
      }
    }

    // ---- P in E4M3, directly in the A-operand layout of the PV MMA
    uint32_t p_frag[kWideChains][kPSteps][4];
#if VC_EXPCAST_INT
    if constexpr (kClampBound && !kMask) {
      // row_offset is this chunk's M already; no clamp where no code of the warp's chunk can wrap
      vc_p::ExpCastIntRow irow[kWideChains][2];
      int in_range = 1;
#pragma unroll
      for (int c = 0; c < kWideChains; ++c)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          irow[c][h] = vc_p::expcast_int_row<false>(scale[c][h], chunk_max_int[c][h], row_offset[c][h]);
          in_range &= vc_p::expcast_int_no_wrap(q_bound[c], scale[c][h], row_offset[c][h]);
        }
      if (__all_sync(0xffffffffu, in_range)) {
#pragma unroll
        for (int c = 0; c < kWideChains; ++c)
          Encoder::template encode_p_fragments_int<false, kKeyTiles, decltype(key_of), false>(s[c], irow[c], valid, key_of, p_frag[c]);
      } else {  // a row may wrap: its clamp bound, then the clamped encode
#pragma unroll
        for (int c = 0; c < kWideChains; ++c) {
          irow[c][0].lo = vc_p::expcast_int_lo(scale[c][0], chunk_max_int[c][0], row_offset[c][0]);
          irow[c][1].lo = vc_p::expcast_int_lo(scale[c][1], chunk_max_int[c][1], row_offset[c][1]);
          Encoder::template encode_p_fragments_int<false>(s[c], irow[c], valid, key_of, p_frag[c]);
        }
      }
    } else
#endif
#pragma unroll
    for (int c = 0; c < kWideChains; ++c) {
#if VC_EXPCAST_INT
      if constexpr (Encoder::kIntEnc) {
        // row_offset is this chunk's M already
        // kLanes: a lane without a valid key of a tail chunk (kMask only) gets the constants of code 0 (expcast_int_row_lane)
        constexpr bool kEmptyLanes = kLanes && kMask;
        const vc_p::ExpCastIntRow irow[2] = {
            kEmptyLanes ? vc_p::expcast_int_row_lane(scale[c][0], chunk_max_int[c][0], row_offset[c][0])
                        : vc_p::expcast_int_row(scale[c][0], chunk_max_int[c][0], row_offset[c][0]),
            kEmptyLanes ? vc_p::expcast_int_row_lane(scale[c][1], chunk_max_int[c][1], row_offset[c][1])
                        : vc_p::expcast_int_row(scale[c][1], chunk_max_int[c][1], row_offset[c][1])};
        Encoder::template encode_p_fragments_int<kMask>(s[c], irow, valid, key_of, p_frag[c]);
      } else if constexpr (Encoder::kFloatEnc) {
        const vc_p::ExpCastFloatRow frow[2] = {vc_p::expcast_float_row(scale[c][0], chunk_max[c][0], row_offset[c][0]),
                                               vc_p::expcast_float_row(scale[c][1], chunk_max[c][1], row_offset[c][1])};
        Encoder::template encode_p_fragments_float<kMask>(s[c], frow, valid, key_of, p_frag[c]);
      } else
#endif
        Encoder::template encode_p_fragments<kMask>(s[c], prow[c], valid, key_of, p_frag[c]);
    }

    // ---- row sums of the same P (ones column), then O = alpha O + P R (+ l mu / v_scale)
    float l_tile[kWideChains][4];
#pragma unroll
    for (int c = 0; c < kWideChains; ++c) {
      l_tile[c][0] = l_tile[c][1] = l_tile[c][2] = l_tile[c][3] = 0.0f;
      if constexpr (kRowSumAdd) {
        // this thread's 16 keys of rows g and g + 8 (a[0], a[2] / a[1], a[3] of each k-step): row_sum stays this
        // thread's share until store_output adds the quad's
        __half2 part[2][8];
#pragma unroll
        for (int ks = 0; ks < kPSteps; ++ks)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            uint32_t lo, hi;
            e4m3x4_to_f16x2x2(p_frag[c][ks][i], lo, hi);
            const int h = i & 1, slot = 4 * ks + 2 * (i >> 1);
            part[h][slot] = *reinterpret_cast<const __half2*>(&lo);
            part[h][slot + 1] = *reinterpret_cast<const __half2*>(&hi);
          }
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int width = 4; width >= 1; width /= 2)
#pragma unroll
            for (int j = 0; j < width; ++j) part[h][j] = __hadd2(part[h][j], part[h][j + width]);
        // {row g, row g + 8}: each row's two halves added in one more f16 add
        const __half2 both = __hadd2(__lows2half2(part[0][0], part[1][0]), __highs2half2(part[0][0], part[1][0]));
        l_tile[c][0] = __low2float(both);  // (the mean restore's sums: shares too, added by the quad at the restore)
        l_tile[c][2] = __high2float(both);
        row_sum[c][0] = fmaf(row_sum[c][0], alpha[c][0], l_tile[c][0]);
        row_sum[c][1] = fmaf(row_sum[c][1], alpha[c][1], l_tile[c][2]);
        continue;
      }
      if constexpr (kVF16) {  // the same unpacked P as the PV MMAs (f16 ones: the same values as the E4M3 ones)
        constexpr uint32_t kF16Ones = 0x3C003C00u;
        const uint32_t ones[4] = {kF16Ones, kF16Ones, kF16Ones, kF16Ones};
#pragma unroll
        for (int ks = 0; ks < kPSteps; ++ks) mma_e4m3_f16b<kPScaled>(l_tile[c], p_frag[c][ks], ones);
      } else {
#pragma unroll
        for (int ks = 0; ks < kPSteps; ++ks) mma_e4m3(l_tile[c], p_frag[c][ks], kE4m3OnesX4, kE4m3OnesX4);
      }
      row_sum[c][0] = row_sum[c][0] * alpha[c][0] + l_tile[c][0];
      row_sum[c][1] = row_sum[c][1] * alpha[c][1] + l_tile[c][2];
    }

    // the row sums the mean restore of this chunk multiplies (kDeferRestore: since the tile began)
    float l_restore[kWideChains][2];
#pragma unroll
    for (int c = 0; c < kWideChains; ++c)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        l_restore[c][h] = l_tile[c][2 * h];
        if constexpr (kDeferRestore) {
          l_restore[c][h] = fmaf(l_pending[c][h], alpha[c][h], l_restore[c][h]);
          l_pending[c][h] = restore ? 0.0f : l_restore[c][h];
        }
      }

    // MMA fold and PV straight into O: rescale O first, and only if an offset of the warp's rows moved (warp-uniform)
    uint32_t identity = 0;  // B of the fold MMA: this thread's half2 {2t == g, 2t + 1 == g} of I_8
    if constexpr (kPvF16MmaFold || kPvDirect) {
      if constexpr (kPvF16MmaFold) {
        const int g = lane >> 2;
        identity = (2 * t == g ? 0x3C00u : 0u) | (2 * t + 1 == g ? 0x3C000000u : 0u);  // fp16 1.0 = 0x3C00
      }
      bool moved = false;
#pragma unroll
      for (int c = 0; c < kWideChains; ++c) moved |= alpha[c][0] != 1.0f || alpha[c][1] != 1.0f;
      if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
        for (int c = 0; c < kWideChains; ++c)
#pragma unroll
          for (int i = 0; i < kDimTiles; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[c][i][e] *= alpha[c][e >> 1];
        if constexpr (kRestoreMma) rescale_slots(alpha);
      }
    }
    if constexpr (kRestoreMma && !(kPvF16MmaFold || kPvDirect)) rescale_slots(alpha);  // O rescaled by the ALU fold in every chunk

    const uint32_t v_addr = sbase + Smem::kOffV + stage * Smem::kV + (kVF16 ? VC_WIDE_V16_LANE(lane) : VC_WIDE_V_LANE(lane));
    const uint8_t* mean = smem + Smem::kOffMean + stage * Smem::kMean;
    const float* inv_scale = reinterpret_cast<const float*>(smem + Smem::kOffInvScale);
    // mu / v_scale of columns col and col + 1, read where the restore needs them (no registers to hold them)
    auto mean_over_scale = [&](int col) {
      if constexpr (kMeanScaled) {
        return *reinterpret_cast<const float2*>(reinterpret_cast<const float*>(mean) + col);
      } else {
        const float2 m = __half22float2(*reinterpret_cast<const __half2*>(reinterpret_cast<const __half*>(mean) + col));
        const float2 inv = *reinterpret_cast<const float2*>(inv_scale + col);
        return make_float2(m.x * inv.x, m.y * inv.y);
      }
    };
    // the chunk's PV MMAs of column pair `pair` (n-tiles 2 pair, 2 pair + 1): mma(dst(c, half), P, V) for both chains
    auto pv_mmas = [&](int pair, auto&& mma, auto&& dst) {
      if constexpr (kVF16) {  // B in f16 already: one ldmatrix.x4 per n-tile and k-step, no conversion (fp32 PV only)
#pragma unroll
        for (int ks = 0; ks < kPSteps; ++ks)
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            uint32_t b[4];
            ldmatrix_x4(b, (v_addr ^ uint32_t(ks << 6)) + (2 * pair + half) * 8 * Smem::kVRow);
#pragma unroll
            for (int c = 0; c < kWideChains; ++c) mma_e4m3_f16b<kPScaled>(dst(c, half), p_frag[c][ks], b);
          }
      } else {
#pragma unroll
        for (int ks = 0; ks < kPSteps; ++ks) {
          uint32_t b[4];
          ldmatrix_x4(b, (v_addr ^ uint32_t(ks << 5)) + 16 * pair * kChunkKeys);
#pragma unroll
          for (int c = 0; c < kWideChains; ++c) {
            mma(dst(c, 0), p_frag[c][ks], b[0], b[1]);
            mma(dst(c, 1), p_frag[c][ks], b[2], b[3]);
          }
        }
      }
    };
    auto mma_f32 = [](float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) { mma_e4m3(d, a, b0, b1); };
#pragma unroll
    for (int pair = 0; pair < kDimTiles / 2; ++pair) {
      if constexpr (kPvDirect) {  // O already rescaled; the restore, if any, runs after the loop
        pv_mmas(pair, mma_f32, [&](int c, int half) -> float (&)[4] { return acc[c][2 * pair + half]; });
        continue;
      }
      float part[kWideChains][2][4];
      if constexpr (kPvF16) {
        uint32_t part16[kWideChains][2][2] = {};  // half2 {row g, row g+8} x columns 2t, 2t+1
        pv_mmas(pair, [](uint32_t (&d)[2], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) { mma_e4m3_f16(d, a, b0, b1); },
                [&](int c, int half) -> uint32_t (&)[2] { return part16[c][half]; });
        if constexpr (kPvF16MmaFold) {
          // O += partial on the tensor core (exact products by 0 and 1, one fp32 accumulation)
#pragma unroll
          for (int c = 0; c < kWideChains; ++c) {
            mma_f16_k8_f32(acc[c][2 * pair], part16[c][0], identity);
            mma_f16_k8_f32(acc[c][2 * pair + 1], part16[c][1], identity);
          }
        } else {
#pragma unroll
          for (int c = 0; c < kWideChains; ++c)
#pragma unroll
            for (int half = 0; half < 2; ++half)
#pragma unroll
              for (int h = 0; h < 2; ++h) {
                const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&part16[c][half][h]));
                part[c][half][2 * h] = f.x;
                part[c][half][2 * h + 1] = f.y;
              }
        }
      } else {
#pragma unroll
        for (int c = 0; c < kWideChains; ++c)
#pragma unroll
          for (int half = 0; half < 2; ++half) part[c][half][0] = part[c][half][1] = part[c][half][2] = part[c][half][3] = 0.0f;
        pv_mmas(pair, mma_f32, [&](int c, int half) -> float (&)[4] { return part[c][half]; });
      }
      // O = alpha O + part (+ l mu / v_scale); without a restore the part is added as it is (a
      // `part + 0.0f` would cost one FADD per element: x + 0 is no identity for x = -0). The MMA
      // fold has added the part and rescaled already: only the restore is left.
      if (kPvF16MmaFold) {
        if (kVSmooth && !kRestoreAfter && restore) {
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int i = 2 * pair + half;
            const float2 mu = mean_over_scale(8 * i + 2 * t);
#pragma unroll
            for (int c = 0; c < kWideChains; ++c)
#pragma unroll
              for (int e = 0; e < 4; ++e) acc[c][i][e] = fmaf(l_restore[c][e >> 1], e & 1 ? mu.y : mu.x, acc[c][i][e]);
          }
        }
      } else if (kVSmooth && !kRestoreAfter && restore) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int i = 2 * pair + half;
          const float2 mu = mean_over_scale(8 * i + 2 * t);
#pragma unroll
          for (int c = 0; c < kWideChains; ++c)
#pragma unroll
            for (int e = 0; e < 4; ++e)
              acc[c][i][e] = fmaf(acc[c][i][e], alpha[c][e >> 1], part[c][half][e] + l_restore[c][e >> 1] * (e & 1 ? mu.y : mu.x));
        }
      } else {
#pragma unroll
        for (int half = 0; half < 2; ++half)
#pragma unroll
          for (int c = 0; c < kWideChains; ++c)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[c][2 * pair + half][e] = fmaf(acc[c][2 * pair + half][e], alpha[c][e >> 1], part[c][half][e]);
      }
    }
    if constexpr (kRestoreMma) {
      if (restore) {  // this restore's row sums into slot n_restored % 8; a full group is added to O
        const int slot = n_restored % kRestoreSlots;
        const bool mine = (lane & 3) == (slot & 3);
#pragma unroll
        for (int c = 0; c < kWideChains; ++c) {
          if (slot < 4) {
            l_slot[c][0] = mine ? l_restore[c][0] : l_slot[c][0];
            l_slot[c][1] = mine ? l_restore[c][1] : l_slot[c][1];
          } else {
            l_slot[c][2] = mine ? l_restore[c][0] : l_slot[c][2];
            l_slot[c][3] = mine ? l_restore[c][1] : l_slot[c][3];
          }
        }
        if (slot < 4) {
          slot_tile[0] = mine ? tile : slot_tile[0];
        } else {
          slot_tile[1] = mine ? tile : slot_tile[1];
        }
        ++n_restored;
        if (__builtin_expect(slot == kRestoreSlots - 1, 0)) flush_restores(mean_bh, lane);  // one restore in 8
      }
    } else if constexpr (kVSmooth && kRestoreAfter) {
      if (restore) {  // (uniform across the CTA: the chunk's and the tile's indices, the segment flag)
        if constexpr (kRowSumAdd) {  // the quad's shares of the pending sums
#pragma unroll
          for (int c = 0; c < kWideChains; ++c)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              l_restore[c][h] = quad_sum(l_restore[c][h]);
            }
        }
#pragma unroll
        for (int i = 0; i < kDimTiles; ++i) {
          const float2 mu = mean_over_scale(8 * i + 2 * t);
#pragma unroll
          for (int c = 0; c < kWideChains; ++c)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[c][i][e] = fmaf(l_restore[c][e >> 1], e & 1 ? mu.y : mu.x, acc[c][i][e]);
        }
      }
    }
  }

  // kRestoreMma: the pending slots follow O's running scale
  __device__ __forceinline__ void rescale_slots(const float (&alpha)[kWideChains][2]) {
#pragma unroll
    for (int c = 0; c < kWideChains; ++c)
#pragma unroll
      for (int j = 0; j < 4; ++j) l_slot[c][j] *= alpha[c][j & 1];
  }

  // kRestoreMma: O += L M for the gathered restores, L (16 rows x 8 slots per chain) the slots' row sums, M (8 slots x D)
  // their tiles' mu / v_scale; three TF32 MMAs per n-tile and chain (split_tf32), then the slots are empty
  __device__ __forceinline__ void flush_restores(const float* mean_bh, int lane) {
    uint32_t a_hi[kWideChains][4], a_lo[kWideChains][4];
#pragma unroll
    for (int c = 0; c < kWideChains; ++c)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        split_tf32(l_slot[c][j], a_hi[c][j], a_lo[c][j]);
        l_slot[c][j] = 0.0f;
      }
    const float* m0 = mean_bh + int64_t(slot_tile[0]) * D + (lane >> 2);  // slot t's tile, column 8 i + g
    const float* m1 = mean_bh + int64_t(slot_tile[1]) * D + (lane >> 2);  // slot t + 4's
#pragma unroll
    for (int i = 0; i < kDimTiles; ++i) {
      uint32_t b_hi[2], b_lo[2];
      split_tf32(__ldg(m0 + 8 * i), b_hi[0], b_lo[0]);
      split_tf32(__ldg(m1 + 8 * i), b_hi[1], b_lo[1]);
#pragma unroll
      for (int c = 0; c < kWideChains; ++c) {
        mma_tf32_k8(acc[c][i], a_lo[c], b_hi[0], b_hi[1]);
        mma_tf32_k8(acc[c][i], a_hi[c], b_lo[0], b_lo[1]);
        mma_tf32_k8(acc[c][i], a_hi[c], b_hi[0], b_hi[1]);
      }
    }
  }

  __device__ __forceinline__ void store_output(const AttnParams& p, int bh, int warp_row0, int lane) const {
    const int g = lane >> 2, t = lane & 3;
    const int b = bh / p.heads, h = bh % p.heads;
    const float* v_scale = p.v_scale + int64_t(bh) * D;
    float l[kWideChains][2];  // the rows' sums (kRowSumAdd: the quad's four shares added)
#pragma unroll
    for (int c = 0; c < kWideChains; ++c)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        l[c][half] = kRowSumAdd ? quad_sum(row_sum[c][half]) : row_sum[c][half];
      }
#pragma unroll
    for (int c = 0; c < kWideChains; ++c)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = warp_row0 + 16 * c + g + 8 * half;
        if (row >= p.n) continue;
        const float inv_l = 1.0f / l[c][half];
        uint16_t* dst = static_cast<uint16_t*>(p.out) + b * p.o_stride[0] + h * p.o_stride[1] + int64_t(row) * p.o_stride[2];
#pragma unroll
        for (int i = 0; i < kDimTiles; ++i) {
          const int col = 8 * i + 2 * t;
          const float2 sc = *reinterpret_cast<const float2*>(v_scale + col);
          const float lo = acc[c][i][2 * half] * sc.x * inv_l, hi = acc[c][i][2 * half + 1] * sc.y * inv_l;
          *reinterpret_cast<uint32_t*>(dst + col) = p.out_bf16 ? pack2<__nv_bfloat16>(lo, hi)
                                                                : pack2<__half>(saturate_fp16(lo), saturate_fp16(hi));
        }
        if (p.lse != nullptr && t == 0) {
          // sum_j 2^s_ij = l * 2^(M - 8) (ExpCast: its own scale, approximately); natural-log units
          const float log2_scale = kExpCast ? vc_p::kExpCastLog2Scale : kPLog2Max;
          float log2_sum = log2f(l[c][half]);
          if constexpr (kPScaled) log2_sum += 8.0f;  // the row sums are 2^-8 of P's (a `+ 0.0f` would cost an FADD)
          p.lse[int64_t(bh) * p.n + row] = (row_offset[c][half] - log2_scale + log2_sum) * kLn2;
        }
      }
  }
};

// (the lane-address macros name AttnMmaWide's members: not for use outside it)
#undef VC_WIDE_Q_LANE
#undef VC_WIDE_K_LANE
#undef VC_WIDE_V_LANE
#undef VC_WIDE_V16_LANE

template <int D, bool kQkFp8, bool kExpCast, bool kVSmooth, bool kLanes = false>
__global__ VC_MMA_LAUNCH_BOUNDS void attn_mma_wide_kernel(const AttnParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  AttnMmaWide<D, kQkFp8, kExpCast, kVSmooth, kLanes> kernel;
  kernel.run(p, smem);
}

// VC_MMA_D64_VSMOOTH_MIN_BLOCKS=N (variant, 0 = off): the head-dim-64 V-Smooth kernels (fidelity and speed) are
// launched as this copy, whose launch bound asks ptxas for N CTAs per SM (N = 3: 168 registers), the others keep the
// unbounded one. A whole build with three CTAs per SM (VC_MMA_MIN_BLOCKS=3) took exactly those kernels 5% (fidelity)
// and 2% (speed) faster on the H200 and every other one slower (docs/kernel-notes.md 31). Since section 46 the bounded
// kernels read Q from shared memory (kQInRegs; 28 / 48 B of spills instead of more), and the via-f16 default takes
// N = 3: H100, head dim 64, fidelity 26.07 -> 24.74 ms, speed 24.47 -> 23.85, while its plain 8-bit kernel measured
// 22.88 -> 23.50 ms bounded and stays unbounded.
// VC_MMA_D64_MIN_BLOCKS=N (0 = off): every head-dim-64 kernel is launched as that copy with N CTAs per SM and keeps Q
// in shared memory instead of 16 registers (AttnMmaWide::kQInRegs). Those kernels take 209-254 registers unbounded, so
// two CTAs (8 warps) per SM; at N = 3 (168 registers) the INT8 ones spill 16-76 B on sm_90a (docs/kernel-notes.md 46:
// on the H100 the V-Smooth kernels ran 2.5-5% faster, plain 8-bit 3% slower via f16, the GeForce build 1-7% slower).
// Head dim 128 is untouched (O alone is 128 registers).
#if VC_MMA_D64_VSMOOTH_MIN_BLOCKS && VC_MMA_D64_MIN_BLOCKS
#error "VC_MMA_D64_VSMOOTH_MIN_BLOCKS and VC_MMA_D64_MIN_BLOCKS bound the same kernels: set one"
#endif
#define VC_MMA_D64_BOUND (VC_MMA_D64_MIN_BLOCKS + VC_MMA_D64_VSMOOTH_MIN_BLOCKS)
#if VC_MMA_D64_BOUND
template <int D, bool kQkFp8, bool kExpCast, bool kVSmooth>
__global__ __launch_bounds__(kAttnThreads, VC_MMA_D64_BOUND) void attn_mma_wide_kernel_occupied(
    const AttnParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  AttnMmaWide<D, kQkFp8, kExpCast, kVSmooth> kernel;
  kernel.run(p, smem);
}
#endif

}  // namespace vc
