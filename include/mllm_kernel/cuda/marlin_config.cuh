// The Marlin GEMM kernels' build-time shapes that the host's plan mirrors
// (mllm_kernel/cuda/jit/gptq_marlin.py picks tokens per CTA, K slices and the fused
// kernel's tiling from them): the streaming kernel's CTA width, its turn of k16 tiles,
// which of its builds defer scales, its split-K limits, and the fused kernel's
// configuration. tests/test_marlin_constants.py compiles this header and checks every
// Python copy against it.
#pragma once

#include <cuda_fp16.h>

#include <cstddef>
#include <type_traits>

#include "mllm_kernel/cuda/mbarrier.cuh"
#include "mllm_kernel/cuda/wgmma.cuh"

namespace mllm_kernel::cuda {
namespace marlin {

// The streaming kernel (csrc/gptq_marlin.cu): 4 warps, one 64-column Marlin tile each.
inline constexpr int kStreamWarps = 4;
inline constexpr int kStreamThreads = 32 * kStreamWarps;
inline constexpr int kStreamCols = 64 * kStreamWarps;  // output columns per CTA

/// k16 tiles the main loop takes per turn: a CTA's K slice starts at a multiple of it.
inline constexpr int kTurnTiles = 4;

/// The most K slices summed through global memory: the last CTA of a column tile stages
/// a row of kStreamCols floats per slice in shared memory (every build's StreamLayout
/// holds this many).
inline constexpr int kMaxGlobalSplit = 16;

/// Whether the streaming kernel of `Rows` tokens per CTA defers scales and zeros to the
/// end of each group (DeferredScales): for 8 and 16 tokens, but not under act-order
/// (each row has its own group) nor for 8-bit weights in bf16 (magic + q is not exact
/// there).
template <typename T, int Bits, int Rows, bool ActOrder>
inline constexpr bool kDefersScales =
    (Rows == 8 || Rows == 16) && !ActOrder && (Bits == 4 || std::is_same_v<T, __half>);

}  // namespace marlin

namespace marlin_wgmma {

/// One build of the fused kernel (csrc/gptq_marlin_wgmma.cu): activation dtype, tokens
/// per CTA (wgmma's N) and zero mode.
template <typename T, int kTokens_, int ZeroMode_>
struct FusedConfig {
  static constexpr int kTokens = kTokens_;
  static constexpr int kZeroMode = ZeroMode_;
  static constexpr int kConsumers = 2;
  static constexpr int kCols = 64 * kConsumers;  // weight columns: one Marlin tile each
  static constexpr int kTileK = 64;              // one 128-byte activation row
  static constexpr int kThreads = kWarpgroupThreads * (1 + kConsumers);
  static constexpr int kAccumulators = kTokens / 2;
  // A stage: activations [kTokens][64] swizzled, then the weight words [4 k16 rows][2
  // tiles][512 bytes], then up to two group rows (groups of 32) of the columns'
  // scales and of their packed zero points.
  static constexpr int kActBytes = kTokens * kSwizzle128Bytes;
  static constexpr int kWeightBytes = (kTileK / 16) * kCols * 16 / 2;
  static constexpr int kScaleRowBytes = kCols * 2;
  static constexpr int kZeroRowBytes = kCols / 2;
  static constexpr int kWeightOffset = kActBytes;
  static constexpr int kScaleOffset = kWeightOffset + kWeightBytes;
  static constexpr int kZeroOffset = kScaleOffset + 2 * kScaleRowBytes;
  static constexpr int kStageBytes = (kZeroOffset + 2 * kZeroRowBytes + 1023) / 1024 * 1024;
  // CTAs an SM holds: two for 32 and 64 tokens (their consumers' 16 or 32 accumulators
  // fit in 104 registers, and 224 tiles of a 28672-column layer run as one wave instead
  // of 1.7), else one, whose consumers take the registers the producer gives up. Two
  // took M = 64 from 21.6 to 16.3 us at 4096^2, 51.2 to 38.6 at 4096 x 14336 and 100.2
  // to 81.1 at 28672 x 8192 (H200, bf16; RESULTS.md, session 22).
  static constexpr int kCtasPerSm = kTokens <= 64 ? 2 : 1;
  // As many stages as fit in the CTA's share of an SM's 227 KB, at most 8.
  static constexpr int kRingBudget = 227 * 1024 / kCtasPerSm - 2048;
  static constexpr int kStages = kRingBudget / kStageBytes < 8 ? kRingBudget / kStageBytes : 8;
  // The launch gives every thread 65536 / (kCtasPerSm * kThreads) registers, rounded
  // down to 8: 168 or 80. What the producer gives up, the consumers claim.
  static constexpr int kProducerRegisters = kCtasPerSm == 2 ? 24 : 40;
  static constexpr int kConsumerRegisters = kCtasPerSm == 2 ? 104 : 232;
  static constexpr std::size_t kRingBytes = std::size_t{kStages} * kStageBytes;
  static constexpr std::size_t kSharedBytes = 1024 + kRingBytes + 2 * kStages * sizeof(MBarrier);
  // Split-K: a CTA's sums (every consumer thread's accumulators). A cluster's partners
  // write them into the first CTA's ring; summed through global memory instead, each
  // CTA stores them there and the last of a tile's to finish stages the others' in its
  // ring, after a 16-byte flag.
  static constexpr int kConsumerThreads = kWarpgroupThreads * kConsumers;
  static constexpr std::size_t kPartialBytes = std::size_t{kConsumerThreads} * kAccumulators * 4;
  /// Where the last CTA stages the other slices' sums in its ring: past the flag that
  /// says it is the last.
  static constexpr int kSplitStagingOffset = 16;
  static constexpr int kRingSplit =
      static_cast<int>((kRingBytes - kSplitStagingOffset) / kPartialBytes) + 1;
  /// The most K slices (CTAs sharing a tile) a launch takes: the summing CTA's own sums
  /// and the others' that its ring holds past the flag, at most 8.
  static constexpr int kMaxSplit = kRingSplit < 8 ? kRingSplit : 8;
  static_assert((kMaxSplit - 1) * kPartialBytes + kSplitStagingOffset <= kRingBytes,
                "the ring holds the flag and the other slices' sums");
  // The epilogue's boxes, one per consumer, in the ring once the main loop is done.
  static constexpr int kOutBoxBytes = kTokens * kSwizzle128Bytes;
  static_assert(kConsumers * kOutBoxBytes <= kRingBytes, "the output boxes fit in the ring");

  static_assert(kActBytes % 1024 == 0 && kWeightOffset % 128 == 0 && kScaleOffset % 128 == 0 &&
                    kZeroOffset % 128 == 0,
                "TMA destinations: 1024-byte (swizzled) and 128-byte aligned");
};

}  // namespace marlin_wgmma
}  // namespace mllm_kernel::cuda
