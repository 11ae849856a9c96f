// W4A16 / W8A16 GEMM on weights in the Marlin layout (see marlin_repack.cu):
//   c[M, N] = a[M, K] @ dequant(b)[K, N],  dequant(q) = (q - zero) * scale,
// with zero the type's bias (uint4b8: 8, uint8b128: 128), an int zero point per
// group and column (uint4/uint8 + b_zeros) or a float one (is_zp_float).
//
// Streaming kernel (`marlin_gemm_kernel`), for the small M of decoding: each CTA
// owns 128 output columns (2 warps across, one 64-column Marlin tile each) and a
// slice of K (4 warps down, 2 k16 tiles each per 128-k pipeline stage). Weights,
// activations, scales and zero points of a stage arrive by 16-byte cp.async through
// kStages shared-memory stages, so every weight byte is read once, in full 16-byte
// vectors; weights are dequantized in registers and multiplied with mma.sync
// m16n8k16 (fp32 accumulation). The 4 K-warps reduce through shared memory. When
// the N tiles alone cannot fill the GPU, K is split over `split` CTAs that write fp32
// partials; the last to finish (counted in `workspace`, left zeroed again) sums
// them in a fixed order and writes c. M beyond 16 * MBlocks rows takes grid.z.
//
// `marlin_dequantize_kernel` writes dequant(b) as a [N, K] matrix (the nn.Linear
// layout) for large M, where the product runs on the Hopper GEMM instead.
//
// Act-order: the caller passes `a` with its columns permuted (a[:, perm]) and g_idx
// in Marlin row order; each k row then takes the scales of group g_idx[k].
#include <tvm/ffi/optional.h>

#include "mllm_kernel/cuda/dequant.cuh"
#include "mllm_kernel/cuda/mma_sync.cuh"
#include "mllm_kernel/tensor.hpp"
#include "mllm_kernel/utils.cuh"

namespace mllm_kernel::cuda {
namespace marlin {

inline constexpr int kThreads = 256;
inline constexpr int kWarpsN = 2;
inline constexpr int kTileN = 64 * kWarpsN;  // output columns per CTA
inline constexpr int kStageK = 128;          // k per pipeline stage
inline constexpr int kStageTiles = kStageK / 16;
inline constexpr int kStages = 4;
inline constexpr int kMaxStageGroups = kStageK / 32;  // the smallest group is 32

enum ZeroMode : int { kBias = 0, kIntZero = 1, kFloatZero = 2 };

struct Params {
  const void* a;  // [M, K], row stride lda
  int64_t lda;
  const uint32_t* b;     // Marlin words, [K / 16, N * 16 * bits / 32]
  const void* scales;    // [groups, N], Marlin-permuted
  const void* zeros;     // int32 [groups, N * bits / 32] or T [groups, N], or nullptr
  const int32_t* g_idx;  // [K] group of each Marlin row (act-order), or nullptr
  void* c;               // [M, N], row stride ldc
  int64_t ldc;
  float* partials;    // [split, M, N] when split > 1
  int32_t* counters;  // one per column tile when split > 1, zero between launches
  int m, n, k;
  int groups;
  int group_shift;  // log2 of the rows per group; -1: one group over K (per channel)
  int zero_mode;
  int bias;               // the type's zero when zero_mode == kBias
  int split;              // CTAs along K
  int k_tiles_per_split;  // a multiple of kStageTiles
};

/// Position of column `c` (0..63) of a 64-column block in the permuted scales: groups
/// use [i * 8 + j] = column i + 8 j; per-channel scales permute 32-column blocks as
/// [8 i + j'] = column 2 i + {0, 1, 8, 9, 16, 17, 24, 25}[j'].
__device__ __forceinline__ int grouped_scale_position(int c) {
  return (c % 8) * 8 + c / 8;
}
__device__ __forceinline__ int channel_scale_position(int c) {
  const int within = c % 32, i = (within % 8) / 2, rest = within - 2 * i;
  return (c / 32) * 32 + 8 * i + (rest / 8) * 2 + rest % 2;
}

/// Slot of permuted position j (0..7) in a lane's zero-point word(s): words interleave
/// as the weights do, {0, 2, 4, 6, 1, 3, 5, 7} (4-bit) and {0, 2, 1, 3} (8-bit).
template <int Bits>
__device__ __forceinline__ uint32_t zero_point(const uint32_t* words, int j) {
  if constexpr (Bits == 4) {
    return (words[0] >> (4 * ((j % 2) * 4 + j / 2))) & 0xf;
  } else {
    const int c = j % 4;
    return (words[j / 4] >> (8 * ((c % 2) * 2 + c / 2))) & 0xff;
  }
}

/// Per lane: the dequantization constants of its 8 n8 blocks (columns 8 jb + g of a
/// 64-column tile). Without act-order one scale per block (`scale[0]`); with it, one
/// per row 2t + {0, 1, 8, 9} (`scale[0..3]`), since each row has its own group.
template <typename T, int Bits, bool ActOrder>
struct TileConstants {
  using Deq = IntDequant<T, Bits>;
  typename Deq::Offset offset[8];  // magic + zero of block jb
  Vec<T, 8> scale[ActOrder ? 4 : 1];
  Vec<T, 8> float_zero;

  /// Zeros that do not vary: the type's bias (or 0 under float zero points).
  __device__ __forceinline__ void set_fixed_zero(float zero) {
#pragma unroll
    for (int jb = 0; jb < 8; ++jb) offset[jb] = Deq::offset(zero);
  }

  /// Int zero points of block jb from the lane's word(s).
  __device__ __forceinline__ void set_zero_points(const uint32_t (&words)[2]) {
#pragma unroll
    for (int jb = 0; jb < 8; ++jb) {
      offset[jb] = Deq::offset(static_cast<float>(zero_point<Bits>(words, jb)));
    }
  }
};

/// The lane's zero-point word(s) of a 64-column row of packed zero points.
template <int Bits>
__device__ __forceinline__ void lane_zero_words(uint32_t (&words)[2], const uint32_t* row,
                                                int lane) {
  words[0] = row[(Bits / 4) * (lane / 4)];
  words[1] = Bits == 8 ? row[2 * (lane / 4) + 1] : 0u;
}

/// One group's constants for lane g from a 64-column row of permuted scales (8
/// consecutive values per lane) and the matching zero points.
template <typename T, int Bits, bool ActOrder>
__device__ __forceinline__ void group_constants(TileConstants<T, Bits, ActOrder>& tc,
                                                const T* scale_row, const void* zero_row,
                                                int zero_mode, int lane) {
  tc.scale[0] = *reinterpret_cast<const Vec<T, 8>*>(scale_row + 8 * (lane / 4));
  if (zero_mode == kIntZero) {
    uint32_t words[2];
    lane_zero_words<Bits>(words, static_cast<const uint32_t*>(zero_row), lane);
    tc.set_zero_points(words);
  } else if (zero_mode == kFloatZero) {
    tc.float_zero =
        *reinterpret_cast<const Vec<T, 8>*>(static_cast<const T*>(zero_row) + 8 * (lane / 4));
  }
}

/// Per-channel scales (one group over K) of lane g's columns of the 64 from `col0`:
/// scales and float zeros in the per-channel permutation, int zero points in the
/// grouped one (the format's zero-point helper always permutes that way).
template <typename T, int Bits, bool ActOrder>
__device__ __forceinline__ void channel_constants(TileConstants<T, Bits, ActOrder>& tc,
                                                  const Params& p, int col0, int lane) {
  const T* scales = static_cast<const T*>(p.scales);
#pragma unroll
  for (int jb = 0; jb < 8; ++jb) {
    const int position = col0 + channel_scale_position(8 * jb + lane / 4);
    tc.scale[0].data[jb] = scales[position];
    if (p.zero_mode == kFloatZero) {
      tc.float_zero.data[jb] = static_cast<const T*>(p.zeros)[position];
    }
  }
  if (p.zero_mode == kIntZero) {
    uint32_t words[2];
    lane_zero_words<Bits>(words, static_cast<const uint32_t*>(p.zeros) + col0 * Bits / 32, lane);
    tc.set_zero_points(words);
  }
}

/// Act-order: the scales of each of the lane's 4 rows (from k row `row0`), each from
/// its own group, read from global memory (L1-cached: neighbouring lanes share them).
template <typename T, int Bits>
__device__ __forceinline__ void act_order_constants(TileConstants<T, Bits, true>& tc,
                                                    const Params& p, int64_t row0, int col0,
                                                    int lane) {
  const T* scales = static_cast<const T*>(p.scales);
  constexpr int kRowOffsets[4] = {0, 1, 8, 9};
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    // A group index out of range reads the nearest group rather than past the tensor.
    const int64_t group = min(max(__ldg(p.g_idx + row0 + kRowOffsets[r]), 0), p.groups - 1);
    tc.scale[r] = *reinterpret_cast<const Vec<T, 8>*>(scales + group * p.n + col0 + 8 * (lane / 4));
  }
}

/// The weight words of one lane for a k16 x n64 tile: 4 (4-bit) or 8 (8-bit).
template <int Bits>
using LaneWords = Vec<uint32_t, Bits == 4 ? 4 : 8>;

/// Block jb (columns 8 jb + g) of a lane's tile words, dequantized: rows 2t + {0, 1}
/// in `lo`, 2t + {8, 9} in `hi` (the two B registers of an m16n8k16 mma).
template <typename T, int Bits, bool ActOrder, bool FloatZero>
__device__ __forceinline__ void dequant_block(const LaneWords<Bits>& words, int jb,
                                              const TileConstants<T, Bits, ActOrder>& tc,
                                              Pair<T>& lo, Pair<T>& hi) {
  using Deq = IntDequant<T, Bits>;
  // 4-bit: word jb / 2 holds blocks 2w (pairs 0, 1) and 2w + 1 (pairs 2, 3);
  // 8-bit: word jb holds one block (pairs 0, 1).
  uint32_t word;
  int first;
  if constexpr (Bits == 4) {
    word = words.data[jb / 2], first = 2 * (jb % 2);
  } else {
    word = words.data[jb], first = 0;
  }
  lo = Deq::pair(word, first, tc.offset[jb]);
  hi = Deq::pair(word, first + 1, tc.offset[jb]);
  if constexpr (FloatZero) {
    const Pair<T> zero{tc.float_zero.data[jb], tc.float_zero.data[jb]};
    lo = __hsub2(lo, zero);
    hi = __hsub2(hi, zero);
  }
  if constexpr (ActOrder) {
    lo = __hmul2(lo, Pair<T>{tc.scale[0].data[jb], tc.scale[1].data[jb]});
    hi = __hmul2(hi, Pair<T>{tc.scale[2].data[jb], tc.scale[3].data[jb]});
  } else {
    const Pair<T> scale{tc.scale[0].data[jb], tc.scale[0].data[jb]};
    lo = __hmul2(lo, scale);
    hi = __hmul2(hi, scale);
  }
}

/// Dequantizes a lane's tile words and multiplies them with the A fragments.
template <typename T, int Bits, int MBlocks, bool ActOrder, bool FloatZero>
__device__ __forceinline__ void tile_mma(float (&acc)[MBlocks][8][4],
                                         const uint32_t (&a_frag)[MBlocks][4],
                                         const LaneWords<Bits>& words,
                                         const TileConstants<T, Bits, ActOrder>& tc) {
#pragma unroll
  for (int jb = 0; jb < 8; ++jb) {
    Pair<T> lo, hi;
    dequant_block<T, Bits, ActOrder, FloatZero>(words, jb, tc, lo, hi);
#pragma unroll
    for (int mb = 0; mb < MBlocks; ++mb) {
      mma_m16n8k16<T>(acc[mb][jb], a_frag[mb], bits_of<T>(lo), bits_of<T>(hi));
    }
  }
}

/// The zero every weight shares when there are no int zero points.
__device__ __forceinline__ float fixed_zero(const Params& p) {
  return p.zero_mode == kBias ? static_cast<float>(p.bias) : 0.f;
}

template <typename T, int Bits, int MBlocks>
struct StageLayout {
  static constexpr int kTileWords = 16 * 64 * Bits / 32;
  static constexpr int kRows = 16 * MBlocks;
  static constexpr int kBBytes = kStageTiles * kWarpsN * kTileWords * 4;
  static constexpr int kABytes = kRows * kStageK * 2;
  static constexpr int kSBytes = kMaxStageGroups * kTileN * 2;
  static constexpr int kZBytes = kMaxStageGroups * kTileN * 2;  // float zeros; int ones fit
  static constexpr int kBytes = kBBytes + kABytes + kSBytes + kZBytes;
  static constexpr int kSharedBytes = kStages * kBytes;
  static_assert(kRows * kTileN * 4 <= kSharedBytes, "the reduction reuses the stages");
};

template <typename T, int Bits, int MBlocks, bool ActOrder>
__global__ void __launch_bounds__(kThreads, MBlocks == 1 ? 2 : 1)
    marlin_gemm_kernel(const Params p) {
  using Layout = StageLayout<T, Bits, MBlocks>;
  constexpr int kTileWords = Layout::kTileWords;
  constexpr int kRows = Layout::kRows;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int is_last;

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int warp_n = warp % kWarpsN, warp_k = warp / kWarpsN;
  const int n0 = blockIdx.x * kTileN;
  const int m0 = blockIdx.z * kRows;
  const int rows = min(kRows, p.m - m0);
  const int k_tiles = p.k / 16;
  const int kt_begin = blockIdx.y * p.k_tiles_per_split;
  const int kt_end = min(kt_begin + p.k_tiles_per_split, k_tiles);
  const int iterations = (kt_end - kt_begin + kStageTiles - 1) / kStageTiles;
  const bool strip_valid = n0 + 64 * warp_n < p.n;
  const bool grouped = !ActOrder && p.group_shift >= 0;
  // Groups per stage: 128 k rows hold 128 >> shift groups (at least a part of one).
  const int stage_groups = grouped ? (p.group_shift >= 7 ? 1 : kStageK >> p.group_shift) : 0;
  const int zero_row_bytes = p.zero_mode == kIntZero ? p.n * Bits / 8 : p.n * 2;
  const int zero_tile_bytes = p.zero_mode == kIntZero ? kTileN * Bits / 8 : kTileN * 2;

  auto stage = [&](int slot) { return smem + slot * Layout::kBytes; };
  auto load_stage = [&](int it) {
    unsigned char* base = stage(it % kStages);
    const int kt0 = kt_begin + it * kStageTiles;
    // Weights: per k16 tile, the CTA's two 64-column tiles are contiguous words.
    constexpr int kChunksPerTileRow = kWarpsN * kTileWords / 4;
    const int64_t row_words = static_cast<int64_t>(p.n) * 16 * Bits / 32;
#pragma unroll
    for (int c = tid; c < kStageTiles * kChunksPerTileRow; c += kThreads) {
      const int r = c / kChunksPerTileRow, q = c % kChunksPerTileRow;
      const int kt = kt0 + r;
      const bool valid = kt < kt_end && n0 + 64 * (q / (kTileWords / 4)) < p.n;
      const uint32_t* src = p.b + kt * row_words + (n0 / 64) * kTileWords + 4 * q;
      cp_async_16(base + 16 * c, valid ? src : p.b, valid);
    }
    // Activations: rows of 128 k as 16 chunks, chunk index XOR-swizzled by the row
    // so that ldmatrix's 8 rows hit different banks.
    T* a_stage = reinterpret_cast<T*>(base + Layout::kBBytes);
    const T* a = static_cast<const T*>(p.a);
    for (int c = tid; c < rows * 16; c += kThreads) {
      const int row = c / 16, chunk = c % 16;
      const int k = kt0 * 16 + chunk * 8;
      const bool valid = k < kt_end * 16;
      const T* src = a + (m0 + row) * p.lda + k;
      cp_async_16(a_stage + row * kStageK + ((chunk ^ (row % 8)) * 8), valid ? src : a, valid);
    }
    if (!grouped) return;
    // Scales (and zero points) of the groups this stage's k rows fall into.
    const int first_group = (kt0 * 16) >> p.group_shift;
    unsigned char* s_stage = base + Layout::kBBytes + Layout::kABytes;
    for (int c = tid; c < stage_groups * 16; c += kThreads) {
      const int group = first_group + c / 16, col = n0 + (c % 16) * 8;
      const bool valid = group < p.groups && col < p.n;
      const T* src = static_cast<const T*>(p.scales) + static_cast<int64_t>(group) * p.n + col;
      cp_async_16(s_stage + 16 * c, valid ? src : p.scales, valid);
    }
    if (p.zero_mode == kBias) return;
    unsigned char* z_stage = s_stage + Layout::kSBytes;
    const int chunks_per_group = zero_tile_bytes / 16;
    const int tile_offset = n0 * zero_tile_bytes / kTileN;
    for (int c = tid; c < stage_groups * chunks_per_group; c += kThreads) {
      const int group = first_group + c / chunks_per_group;
      const int byte = (c % chunks_per_group) * 16;
      const bool valid = group < p.groups && tile_offset + byte < zero_row_bytes;
      const unsigned char* src = static_cast<const unsigned char*>(p.zeros) +
                                 static_cast<int64_t>(group) * zero_row_bytes + tile_offset + byte;
      cp_async_16(z_stage + (c / chunks_per_group) * zero_tile_bytes + byte, valid ? src : p.zeros,
                  valid);
    }
  };

  float acc[MBlocks][8][4];
#pragma unroll
  for (int mb = 0; mb < MBlocks; ++mb)
#pragma unroll
    for (int jb = 0; jb < 8; ++jb)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mb][jb][i] = 0.f;

  TileConstants<T, Bits, ActOrder> constants;
  constants.set_fixed_zero(fixed_zero(p));
  const int col0 = n0 + 64 * warp_n;
  if (!ActOrder && !grouped && strip_valid) {
    channel_constants(constants, p, col0, lane);  // they do not change along K
  }
  const bool float_zero = p.zero_mode == kFloatZero;
  int cached_group = -1;

  for (int it = 0; it < kStages - 1; ++it) {
    if (it < iterations) load_stage(it);
    cp_async_commit();
  }
  for (int it = 0; it < iterations; ++it) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    if (it + kStages - 1 < iterations) load_stage(it + kStages - 1);
    cp_async_commit();

    const unsigned char* base = stage(it % kStages);
    const int kt0 = kt_begin + it * kStageTiles;
#pragma unroll
    for (int sub = 0; sub < kStageTiles / 4; ++sub) {
      const int local = warp_k * (kStageTiles / 4) + sub;
      const int kt = kt0 + local;
      if (!strip_valid || kt >= kt_end) continue;
      const LaneWords<Bits> words = *reinterpret_cast<const LaneWords<Bits>*>(
          base + 4 * ((local * kWarpsN + warp_n) * kTileWords + lane * (Bits == 4 ? 4 : 8)));
      const T* a_stage = reinterpret_cast<const T*>(base + Layout::kBBytes);
      uint32_t a_frag[MBlocks][4];
#pragma unroll
      for (int mb = 0; mb < MBlocks; ++mb) {
        const int row = mb * 16 + lane % 16, chunk = 2 * local + lane / 16;
        ldmatrix_x4(a_frag[mb], a_stage + row * kStageK + ((chunk ^ (row % 8)) * 8));
      }
      if constexpr (ActOrder) {
        act_order_constants(constants, p, int64_t{kt} * 16 + 2 * (lane % 4), col0, lane);
      } else if (grouped) {
        const int group = (kt * 16) >> p.group_shift;
        if (group != cached_group) {  // scales change once per group, not per tile
          cached_group = group;
          const int in_stage = group - ((kt0 * 16) >> p.group_shift);
          const unsigned char* s_stage = base + Layout::kBBytes + Layout::kABytes;
          group_constants(constants,
                          reinterpret_cast<const T*>(s_stage) + in_stage * kTileN + 64 * warp_n,
                          s_stage + Layout::kSBytes + in_stage * zero_tile_bytes +
                              warp_n * zero_tile_bytes / kWarpsN,
                          p.zero_mode, lane);
        }
      }
      if (float_zero) {
        tile_mma<T, Bits, MBlocks, ActOrder, true>(acc, a_frag, words, constants);
      } else {
        tile_mma<T, Bits, MBlocks, ActOrder, false>(acc, a_frag, words, constants);
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();

  // Reduce the K-warps in shared memory (the stages are free now), one after another:
  // a fixed order of additions, so results repeat exactly from run to run.
  float* red = reinterpret_cast<float*>(smem);
  for (int turn = 0; turn < kThreads / 32 / kWarpsN; ++turn) {
    if (warp_k == turn && strip_valid) {
#pragma unroll
      for (int mb = 0; mb < MBlocks; ++mb)
#pragma unroll
        for (int jb = 0; jb < 8; ++jb)
#pragma unroll
          for (int i = 0; i < 4; i += 2) {
            const int row = mb * 16 + lane / 4 + 8 * (i / 2);
            const int col = 64 * warp_n + 8 * jb + 2 * (lane % 4);
            float2* slot = reinterpret_cast<float2*>(red + row * kTileN + col);
            const float2 mine = {acc[mb][jb][i], acc[mb][jb][i + 1]};
            if (row < rows) *slot = turn == 0 ? mine : float2{slot->x + mine.x, slot->y + mine.y};
          }
    }
    __syncthreads();
  }

  const int cols = min(kTileN, p.n - n0);
  T* c = static_cast<T*>(p.c);
  if (p.split == 1) {
    for (int i = tid; i < rows * (kTileN / 2); i += kThreads) {
      const int row = i / (kTileN / 2), col = 2 * (i % (kTileN / 2));
      if (col >= cols) continue;
      const float2 v = *reinterpret_cast<const float2*>(red + row * kTileN + col);
      *reinterpret_cast<Pair<T>*>(c + (m0 + row) * p.ldc + n0 + col) = pair_of<T>(v.x, v.y);
    }
    return;
  }
  // Split K: publish this CTA's partial, then the last CTA of the column tile sums all
  // of them in split order (the same result whichever CTA finishes last).
  for (int i = tid; i < rows * (kTileN / 2); i += kThreads) {
    const int row = i / (kTileN / 2), col = 2 * (i % (kTileN / 2));
    if (col >= cols) continue;
    float* dst = p.partials + (static_cast<int64_t>(blockIdx.y) * p.m + m0 + row) * p.n + n0 + col;
    __stcg(reinterpret_cast<float2*>(dst),
           *reinterpret_cast<const float2*>(red + row * kTileN + col));
  }
  __threadfence();
  __syncthreads();
  if (tid == 0) is_last = atomicAdd(p.counters + blockIdx.x, 1) == p.split - 1;
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  for (int i = tid; i < rows * (kTileN / 2); i += kThreads) {
    const int row = i / (kTileN / 2), col = 2 * (i % (kTileN / 2));
    if (col >= cols) continue;
    float2 sum = {0.f, 0.f};
    for (int s = 0; s < p.split; ++s) {
      const float2 v = __ldcg(reinterpret_cast<const float2*>(
          p.partials + (static_cast<int64_t>(s) * p.m + m0 + row) * p.n + n0 + col));
      sum.x += v.x;
      sum.y += v.y;
    }
    *reinterpret_cast<Pair<T>*>(c + (m0 + row) * p.ldc + n0 + col) = pair_of<T>(sum.x, sum.y);
  }
  if (tid == 0) p.counters[blockIdx.x] = 0;  // ready for the next launch
}

// grid (N / 64, ceil(K / 64)), 4 warps: warp w dequantizes k16 tile 4 y + w of the
// 64 columns x, through a shared [64 n][64 k] tile so that rows of out leave whole.
template <typename T, int Bits, bool ActOrder>
__global__ void __launch_bounds__(128) marlin_dequantize_kernel(const Params p, T* out) {
  constexpr int kTileWords = 16 * 64 * Bits / 32;
  constexpr int kPitch = 64 + 8;  // padded rows: the lanes' pair stores spread over banks
  __shared__ __align__(16) T tile[64][kPitch];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int col0 = blockIdx.x * 64;
  const int kt = blockIdx.y * 4 + warp;
  if (kt < p.k / 16) {
    const int64_t row_words = static_cast<int64_t>(p.n) * 16 * Bits / 32;
    const LaneWords<Bits> words = *reinterpret_cast<const LaneWords<Bits>*>(
        p.b + kt * row_words + blockIdx.x * kTileWords + lane * (Bits == 4 ? 4 : 8));
    TileConstants<T, Bits, ActOrder> tc;
    tc.set_fixed_zero(fixed_zero(p));
    if constexpr (ActOrder) {
      act_order_constants(tc, p, int64_t{kt} * 16 + 2 * (lane % 4), col0, lane);
    } else if (p.group_shift >= 0) {
      const int64_t group = (int64_t{kt} * 16) >> p.group_shift;
      const int zero_col_bits = p.zero_mode == kIntZero ? Bits : 16;
      group_constants(
          tc, static_cast<const T*>(p.scales) + group * p.n + col0,
          static_cast<const unsigned char*>(p.zeros) + (group * p.n + col0) * zero_col_bits / 8,
          p.zero_mode, lane);
    } else {
      channel_constants(tc, p, col0, lane);
    }
    const int k_local = warp * 16 + 2 * (lane % 4);
#pragma unroll
    for (int jb = 0; jb < 8; ++jb) {
      Pair<T> lo, hi;
      if (p.zero_mode == kFloatZero) {
        dequant_block<T, Bits, ActOrder, true>(words, jb, tc, lo, hi);
      } else {
        dequant_block<T, Bits, ActOrder, false>(words, jb, tc, lo, hi);
      }
      *reinterpret_cast<Pair<T>*>(&tile[8 * jb + lane / 4][k_local]) = lo;
      *reinterpret_cast<Pair<T>*>(&tile[8 * jb + lane / 4][k_local + 8]) = hi;
    }
  }
  __syncthreads();
  for (int i = tid; i < 64 * 8; i += 128) {
    const int row = i / 8, chunk = i % 8;
    const int64_t k = int64_t{blockIdx.y} * 64 + chunk * 8;
    if (k >= p.k) continue;
    *reinterpret_cast<int4*>(out + (col0 + row) * int64_t{p.k} + k) =
        *reinterpret_cast<const int4*>(&tile[row][chunk * 8]);
  }
}

/// The kernel's view of the weight operands, checked against each other and `device`.
inline Params check_weights(SymbolicDevice& device, TensorView b_q_weight, TensorView b_scales,
                            tvm::ffi::Optional<TensorView> b_zeros,
                            tvm::ffi::Optional<TensorView> g_idx, DLDataType dtype, int bits,
                            int64_t size_k, int64_t size_n, int64_t group_size, int64_t zero_mode,
                            int64_t bias) {
  Params p{};
  SymbolicSize groups{"num_groups"};
  TensorMatcher({size_k / 16, size_n * 16 * bits / 32})
      .dtype<int32_t>()
      .device(kDLCUDA, device)
      .contiguous()
      .verify(b_q_weight, "b_q_weight");
  TensorMatcher({groups, size_n})
      .dtype(dtype)
      .device(kDLCUDA, device)
      .contiguous()
      .verify(b_scales, "b_scales");
  p.b = data_ptr<uint32_t>(b_q_weight);
  p.scales = data_ptr<void>(b_scales);
  p.k = static_cast<int>(size_k);
  p.n = static_cast<int>(size_n);
  p.groups = static_cast<int>(groups.value());
  p.group_shift = group_size == 0 ? -1 : 31 - __builtin_clz(static_cast<unsigned>(group_size));
  p.zero_mode = static_cast<int>(zero_mode);
  p.bias = static_cast<int>(bias);
  ValueCheck(group_size == 0 || (group_size >= 32 && (group_size & (group_size - 1)) == 0 &&
                                 p.groups * group_size >= size_k),
             "argument 'b_scales': ", p.groups, " groups of ", group_size,
             " rows do not cover size_k = ", size_k);
  if (zero_mode != kBias) {
    RuntimeCheck(b_zeros.has_value(), "b_zeros missing for zero_mode ", zero_mode);
    TensorMatcher({groups, zero_mode == kIntZero ? size_n * bits / 32 : size_n})
        .dtype(zero_mode == kIntZero ? dtype_trait<int32_t>::value : dtype)
        .device(kDLCUDA, device)
        .contiguous()
        .verify(*b_zeros, "b_zeros");
    p.zeros = data_ptr<void>(*b_zeros);
  }
  if (g_idx.has_value()) {
    TensorMatcher({size_k})
        .dtype<int32_t>()
        .device(kDLCUDA, device)
        .contiguous()
        .verify(*g_idx, "g_idx");
    p.g_idx = data_ptr<int32_t>(*g_idx);
  }
  return p;
}

}  // namespace marlin

/// c = a @ dequant(b) with the streaming kernel; see the file comment. `a` [M, K]
/// (act-order: already a[:, perm]), c [M, N]; `partials` fp32 [split, M, N] and
/// `workspace` int32 [>= N / 128] when split > 1. Group size 0: per-channel scales (or
/// act-order, which `ActOrder` builds and which takes `g_idx`).
template <typename T, int Bits, int MBlocks, bool ActOrder>
void gptq_marlin_gemm_stream(TensorView a, TensorView b_q_weight, TensorView b_scales,
                             tvm::ffi::Optional<TensorView> b_zeros,
                             tvm::ffi::Optional<TensorView> g_idx, TensorView c,
                             tvm::ffi::Optional<TensorView> partials, TensorView workspace,
                             int64_t group_size, int64_t zero_mode, int64_t bias, int64_t split,
                             int64_t k_tiles_per_split) {
  using namespace marlin;
  SymbolicSize m{"size_m"}, k{"size_k"}, n{"size_n"};
  SymbolicDevice device;
  TensorMatcher({m, k}).dtype<T>().device(kDLCUDA, device).last_dim_contiguous().verify(a, "a");
  const int64_t lda = m.value() > 1 ? a.stride(0) : k.value();
  ValueCheck(lda % 8 == 0 && reinterpret_cast<uintptr_t>(data_ptr<T>(a)) % 16 == 0,
             "argument 'a': rows must start on 16-byte boundaries (row stride ", lda,
             " elements); call .contiguous() on it first");
  TensorMatcher({m, n}).dtype<T>().device(kDLCUDA, device).contiguous().verify(c, "c");
  Params p = check_weights(device, b_q_weight, b_scales, b_zeros, g_idx, dtype_trait<T>::value,
                           Bits, k.value(), n.value(), group_size, zero_mode, bias);
  verify_output(c, "c", {{a, "a"}, {b_q_weight, "b_q_weight"}, {b_scales, "b_scales"}});
  RuntimeCheck(ActOrder == g_idx.has_value(), "this module is built for act-order ", ActOrder);
  p.a = data_ptr<void>(a);
  p.lda = lda;
  p.c = data_ptr<void>(c);
  p.ldc = n.value();
  p.m = static_cast<int>(m.value());
  p.split = static_cast<int>(split);
  p.k_tiles_per_split = static_cast<int>(k_tiles_per_split);
  const int64_t column_tiles = div_ceil<int64_t>(n.value(), kTileN);
  RuntimeCheck(k_tiles_per_split % kStageTiles == 0 && split >= 1 &&
                   split * k_tiles_per_split >= k.value() / 16,
               "bad split plan: split ", split, " x ", k_tiles_per_split, " k16 tiles");
  TensorMatcher({kAnySize}).dtype<int32_t>().device(kDLCUDA, device).verify(workspace, "workspace");
  if (split > 1) {
    RuntimeCheck(partials.has_value(), "split-K needs partials");
    TensorMatcher({split, m, n})
        .dtype<fp32_t>()
        .device(kDLCUDA, device)
        .contiguous()
        .verify(*partials, "partials");
    ValueCheck(workspace.size(0) >= column_tiles, "argument 'workspace': split-K needs ",
               column_tiles, " entries, got ", workspace.size(0));
    RuntimeCheck(m.value() <= 16 * MBlocks, "split-K runs one block of rows");
    p.partials = data_ptr<float>(*partials);
    p.counters = data_ptr<int32_t>(workspace);
  }
  if (m.value() == 0) return;
  using Layout = StageLayout<T, Bits, MBlocks>;
  const dim3 grid(static_cast<unsigned>(column_tiles), static_cast<unsigned>(split),
                  static_cast<unsigned>(div_ceil<int64_t>(m.value(), Layout::kRows)));
  const auto kernel = marlin_gemm_kernel<T, Bits, MBlocks, ActOrder>;
  {
    // Shared memory before L1: two CTAs of the 16-row kernel then fit on an SM.
    ::tvm::ffi::CUDADeviceGuard guard(device.value().device_id);
    RuntimeCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                      cudaSharedmemCarveoutMaxShared) == cudaSuccess,
                 "cudaFuncSetAttribute(PreferredSharedMemoryCarveout) failed");
  }
  KernelLauncher(grid, dim3(kThreads), device.value(), Layout::kSharedBytes)(kernel, p);
}

/// out [N, K] = dequant(b)^T (the nn.Linear layout of the weight).
template <typename T, int Bits, bool ActOrder>
void marlin_dequantize(TensorView b_q_weight, TensorView b_scales,
                       tvm::ffi::Optional<TensorView> b_zeros, tvm::ffi::Optional<TensorView> g_idx,
                       TensorView out, int64_t group_size, int64_t zero_mode, int64_t bias) {
  using namespace marlin;
  SymbolicSize n{"size_n"}, k{"size_k"};
  SymbolicDevice device;
  TensorMatcher({n, k}).dtype<T>().device(kDLCUDA, device).contiguous().verify(out, "out");
  const Params p =
      check_weights(device, b_q_weight, b_scales, b_zeros, g_idx, dtype_trait<T>::value, Bits,
                    k.value(), n.value(), group_size, zero_mode, bias);
  RuntimeCheck(ActOrder == g_idx.has_value(), "this module is built for act-order ", ActOrder);
  const dim3 grid(static_cast<unsigned>(n.value() / 64),
                  static_cast<unsigned>(div_ceil<int64_t>(k.value(), 64)));
  KernelLauncher(grid, dim3(128), device.value())(marlin_dequantize_kernel<T, Bits, ActOrder>, p,
                                                  data_ptr<T>(out));
}

}  // namespace mllm_kernel::cuda
