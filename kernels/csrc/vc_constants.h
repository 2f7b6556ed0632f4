// Numeric constants shared with the Python spec. Defined once, in kernels/constants.py; kernels/jit.py
// passes them as -D flags (print them with
//   python -c "from vc_attention.kernels import constants; print(' '.join(constants.cuda_defines()))"
// for a hand-made nvcc build). No default here: a missing flag stops the build instead of letting a
// copy drift from the spec.
#pragma once
#include <cstdint>

#if !defined(VC_LOG2E) || !defined(VC_E4M3_MAX) || !defined(VC_INT8_MAX) || !defined(VC_Q_BLOCK) ||      \
    !defined(VC_K_BLOCK) || !defined(VC_P_LOG2_MAX) || !defined(VC_E4M3_OCTAVE_CODES) ||                \
    !defined(VC_E4M3_ONE_CODE) || !defined(VC_EXPCAST_MAX_CODE) || !defined(VC_EXPCAST_BIAS) ||          \
    !defined(VC_EXPCAST_BETA) || !defined(VC_EXPCAST_P_LOG2_SCALE) || !defined(VC_EXPCAST_TOP) || \
    !defined(VC_EXPCAST_SLOPE_CAP) || !defined(VC_MIXED_P_LOG2_MAX) || !defined(VC_MIXED_CHORD_EIGHTHS) || !defined(VC_SM90_V_LO_CHANNELS) || !defined(VC_V_LOW_ROWS) || !defined(VC_V_LOW_FIRST) ||         \
    !defined(VC_VSMOOTH_PAIRED_K) || !defined(VC_K_LANES) || !defined(VC_K_LANE_KEYS) || !defined(VC_VSMOOTH_K_LANES)
#error "VC-Attention numeric constants are missing: build through kernels/jit.py, or pass kernels.constants.cuda_defines() to nvcc"
#endif

namespace vc {

constexpr float kLog2e = VC_LOG2E;
constexpr float kE4m3Max = VC_E4M3_MAX;
constexpr float kInt8Max = VC_INT8_MAX;
constexpr int kQBlock = VC_Q_BLOCK;  // query rows per mma attention CTA
constexpr int kKBlock = VC_K_BLOCK;  // key rows per scale and per V-Smooth mean
constexpr float kPLog2Max = VC_P_LOG2_MAX;  // the row offset M maps to 2^kPLog2Max
constexpr float kE4m3OctaveCodes = VC_E4M3_OCTAVE_CODES;  // ExpCast: code = rint(8u + bias)
constexpr float kExpCastBias = VC_EXPCAST_BIAS;  // 8 * kPLog2Max + 56 + beta: the paper's encoding
constexpr float kExpCastBeta = VC_EXPCAST_BETA;
// the corrected encoding (csrc/p_encoding.cuh): row max at 448, integer fixed point of 2^23 (w + 127)
constexpr float kExpCastPLog2Scale = VC_EXPCAST_P_LOG2_SCALE;  // log2(448) + beta/8: P ~ 2^(u + this)
constexpr float kExpCastTop = VC_EXPCAST_TOP;  // 127 + log2(448) + beta/8: t / 2^23 at the row max
constexpr float kExpCastSlopeCap = VC_EXPCAST_SLOPE_CAP;  // A <= 2^28
// the mixed encoding's exp2 keys (reference p="mixed"): the row max at 448 = 2^this, as the chord keys beside them
constexpr float kMixedPLog2Max = VC_MIXED_P_LOG2_MAX;
// ... and the eighths of every online-softmax step whose keys take the chord (reference.mixed_chord_keys)
constexpr int kMixedChordEighths = VC_MIXED_CHORD_EIGHTHS;
static_assert(kMixedChordEighths > 0 && kMixedChordEighths <= 8 && kMixedChordEighths % 2 == 0,
              "the Hopper kernel's chord takes 2, 4, 6 or 8 eighths of a 256-key step (32-key k-steps)");
// the V residual's second term's channels that the Hopper product library takes per call (VCConfig.v_lo_channels)
constexpr int kSm90VLoChannels = VC_SM90_V_LO_CHANNELS;
static_assert(kSm90VLoChannels == 0 || kSm90VLoChannels == 16 || kSm90VLoChannels == 30 || kSm90VLoChannels == 32,
              "the second term's wgmma takes 16 or 32 rows (30: 30 channels and the two row-sum rows in one 32-row block)");
constexpr int kExpCastMaxCode = VC_EXPCAST_MAX_CODE;
constexpr int kVLowRows = VC_V_LOW_ROWS;  // extra V^T rows: two parity row-sum rows, then coefficients
constexpr int kVLowFirst = VC_V_LOW_FIRST;  // the first coefficient row
constexpr int kMaxVRank = kVLowRows - kVLowFirst;
constexpr int kE4m3OneCode = VC_E4M3_ONE_CODE;  // the E4M3 byte of 1.0
// the Hopper forward's vsmooth bit for K scales equal in 128-key pairs (added to V-Smooth's 1 or 2)
constexpr int kVsmoothPairedK = VC_VSMOOTH_PAIRED_K;
static_assert(kVsmoothPairedK == 4, "the Hopper forward's and bindings' refusal sentences name the paired-K bit as 4");
// ... and on top of the paired-K bit, K scales per MMA lane (four per 128-key slot; VCConfig.k_lane_scales)
constexpr int kVsmoothKLanes = VC_VSMOOTH_K_LANES;
static_assert(kVsmoothKLanes == 8, "the bindings' refusal sentences name the lane bit as 8");
// The Hopper forward's vsmooth codes: 0 (per-channel V), 1 (V-Smooth), 2 (its means equal in 128-row pairs), and 1
// or 2 plus kVsmoothPairedK, itself optionally plus kVsmoothKLanes. One definition for the forward and for the bindings
// that refuse a bad code first.
constexpr bool valid_vsmooth(long long vsmooth) {
  const long long mode = vsmooth & ~static_cast<long long>(kVsmoothPairedK | kVsmoothKLanes);
  const bool lanes_paired = !(vsmooth & kVsmoothKLanes) || (vsmooth & kVsmoothPairedK);
  return vsmooth >= 0 && mode <= 2 && (mode != 0 || vsmooth == 0) && lanes_paired;
}
// VCConfig.k_lane_scales (kernels/k_lanes.py): K scales per (K-scale block, quad lane); key j of a tile belongs to
// lane (j % (kKLanes * kKLaneKeys)) / kKLaneKeys, the lane whose score registers hold it (sm90 key_of_column)
constexpr int kKLanes = VC_K_LANES;
constexpr int kKLaneKeys = VC_K_LANE_KEYS;
static_assert(kKLanes == 4 && kKLaneKeys == 4, "the lane of a key is the quad lane t of key_of_column: 16 c' + 4 t + ...");
constexpr uint32_t kE4m3OnesX4 = uint32_t(VC_E4M3_ONE_CODE) * 0x01010101u;  // four E4M3 1.0 bytes

}  // namespace vc
