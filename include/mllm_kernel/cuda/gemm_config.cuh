// The Hopper GEMM's compile-time configuration (csrc/gemm.cu): a tile's shape, its
// pipeline and the shared memory it takes, as constexpr values. The Python side
// chooses among configurations (mllm_kernel/cuda/jit/gemm.py, TILES) and
// tests/test_gemm_constants.py checks what it assumes of them against this header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "mllm_kernel/cuda/mbarrier.cuh"
#include "mllm_kernel/cuda/wgmma.cuh"

namespace mllm_kernel::cuda::hopper_gemm {

/// Split-K partners of a tile are the CTAs of one cluster: at most the portable
/// cluster size.
inline constexpr int kMaxSplit = 8;

/// The dynamic shared memory one block may opt in to on sm_90 (H100, H200), in bytes.
/// The launch checks the device's own value; this bounds the configurations at
/// compile time.
inline constexpr std::size_t kSm90SharedBytesPerBlock = 227 * 1024;

/// TMA copies rows whose start and pitch are multiples of 16 bytes.
inline constexpr int kTmaAlignBytes = 16;

/// A kernel's element type, tile shape and pipeline, fixed at compile time (the
/// Python side picks one per problem shape: mllm_kernel/cuda/jit/gemm.py, choose_tile).
template <typename T, int kConsumers_, int kTileQ_, int kStages_, bool kSwapAB_, int kMulticast_>
struct TileConfig {
  using Element = T;
  // int8 operands accumulate exactly in int32 and are scaled in the epilogue.
  static constexpr bool kInt8 = std::is_same_v<T, int8_t>;
  using Acc = std::conditional_t<kInt8, int32_t, float>;
  using Acc4 = std::conditional_t<kInt8, int4, float4>;  // split-K partial sums
  static constexpr int kConsumers = kConsumers_;         // consumer warpgroups
  static constexpr int kTileP = 64 * kConsumers;         // wgmma's M: 64 rows each
  static constexpr int kTileQ = kTileQ_;                 // wgmma's N
  static constexpr int kTileK = kSwizzle128Bytes / static_cast<int>(sizeof(T));  // one row
  static constexpr int kStages = kStages_;
  static constexpr bool kSwapAB = kSwapAB_;  // P = b, Q = a, out = C^T
  // CTAs of a cluster on neighbouring tile-rows that share each Q tile: each loads
  // 1/kMulticast of it and multicasts that to all, so L2 serves each Q byte once.
  static constexpr int kMulticast = kMulticast_;
  static constexpr int kThreads = kWarpgroupThreads * (1 + kConsumers);
  static constexpr int kConsumerThreads = kWarpgroupThreads * kConsumers;
  static constexpr int kAccumulators = kTileQ / 2;  // per consumer thread
  static constexpr int kTileBytesP = kTileP * kSwizzle128Bytes;
  static constexpr int kTileBytesQ = kTileQ * kSwizzle128Bytes;
  static constexpr int kStageBytes = kTileBytesP + kTileBytesQ;
  // Two consumers hold 128 accumulators each: move registers to them from the
  // producer (setmaxnreg). One consumer needs few, and two CTAs share an SM.
  static constexpr bool kReallocRegisters = kConsumers == 2;
  static constexpr int kMinBlocksPerSM = kConsumers == 2 ? 1 : 2;
  static constexpr int kProducerRegisters = 40;
  static constexpr int kConsumerRegisters = 232;
  // One split partner's partial sums: every consumer thread's accumulators.
  static constexpr int kPartialBytes = kConsumerThreads * kAccumulators * 4;
  // Split partners send their partial sums into rank 0's shared memory. One consumer's
  // (at most 32 KB a partner) fit beside the stages. Two consumers' (64 KB a partner)
  // go into rank 0's stage ring itself, idle once its k-loop has ended (a split launch
  // gives each CTA one tile: run_gemm), after one more cluster barrier, so that no
  // partner writes a stage rank 0 may still read.
  static constexpr bool kPartialsInRing = kConsumers == 2;
  // The output leaves through shared memory and TMA stores. Plain tiles: 64 rows x 128
  // bytes at a time, two buffers per consumer (one filling while the other is read).
  // Swapped tiles hold out^T: their one consumer's accumulators go transposed into a
  // box of kTileQ output rows x 64 16-bit columns (epilogue.cuh), one store a tile; an
  // fp32 output goes straight from registers instead.
  static constexpr bool kTmaStore = !kSwapAB;
  static constexpr int kStoreChunkBytes = 64 * 128;
  static constexpr int kStoreBytes =
      kTmaStore ? kConsumers * 2 * kStoreChunkBytes : kTileQ * kSwizzle128Bytes;
  static_assert(!kSwapAB || kConsumers == 1, "a swapped tile's one consumer owns the box");
  // int8 with TMA stores: the tile's column scales, staged in shared memory for the
  // epilogue (one copy for both consumers: two would not fit beside 4 stages).
  static constexpr bool kStageColScales = kInt8 && kTmaStore;
  static constexpr int kColScaleBytes = kStageColScales ? kTileQ * 4 : 0;
  static_assert(!kStageColScales || kTileQ <= kConsumerThreads, "a column scale per thread");

  // The dynamic shared memory, from its first 1024-byte boundary: the stages' P tiles,
  // their Q tiles, the store buffers, the staged column scales, the full and the empty
  // barrier of every stage, then the split partners' partial sums, unless they go into
  // the stages (byte offsets).
  static constexpr int kOffsetQ = kStages * kTileBytesP;
  static constexpr int kOffsetStore = kStages * kStageBytes;
  static constexpr int kOffsetColScales = kOffsetStore + kStoreBytes;
  static constexpr int kOffsetBarriers = kOffsetColScales + kColScaleBytes;
  static constexpr int kBarriersEnd =
      kOffsetBarriers + 2 * kStages * static_cast<int>(sizeof(MBarrier));
  static constexpr int kOffsetPartials = kPartialsInRing ? 0 : kBarriersEnd;

  static_assert(kTileQ % 16 == 0 && kTileQ <= 256, "wgmma N extent");
  static_assert(kTileBytesP % 1024 == 0 && kTileBytesQ % (1024 * kMulticast) == 0,
                "swizzle atoms (per multicast slice)");
  static_assert(kMulticast == 1 || !kSwapAB, "multicast tiles do not split K");
  static_assert(kMulticast <= kMaxSplit, "a multicast group is one cluster");

  /// Dynamic shared memory for a split of `split` CTAs (+1024 to align the tiles).
  static constexpr std::size_t shared_bytes(int split) {
    if constexpr (kPartialsInRing) return 1024 + std::size_t{kBarriersEnd};
    return 1024 + std::size_t{kBarriersEnd} + std::size_t(split - 1) * kPartialBytes;
  }

  /// The largest split whose partial sums fit: the cluster's (kMaxSplit) or, with the
  /// partial sums in the stage ring, the ring's.
  static constexpr int max_split() {
    if constexpr (kPartialsInRing) {
      constexpr int kFit = 1 + kStages * kStageBytes / kPartialBytes;
      return kFit < kMaxSplit ? kFit : kMaxSplit;
    }
    return kMaxSplit;
  }
};

}  // namespace mllm_kernel::cuda::hopper_gemm
