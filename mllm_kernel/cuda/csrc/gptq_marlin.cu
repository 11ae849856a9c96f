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
  int group_size;  // 0: one group over K (per-channel scales)
  int zero_mode;
  int bias;               // the type's zero when zero_mode == kBias
  int split;              // CTAs along K
  int k_tiles_per_split;  // a multiple of kStageTiles
};

/// Position of column `c` (0..63) of a 64-column block in the permuted scales: groups
/// use [i * 8 + j] = column i + 8 j; per-channel scales permute 32-column blocks as
/// [8 i + j'] = column 2 i + {0, 1, 8, 9, 16, 17, 24, 25}[j'].
__device__ __forceinline__ int grouped_scale_position(int c) { return (c % 8) * 8 + c / 8; }
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

/// Per lane and k16 tile: the dequantization constants of its 8 n8 blocks (columns
/// 8 jb + g of a 64-column tile), for rows 2t + {0, 1} (`lo`) and 2t + {8, 9} (`hi`).
template <typename T, int Bits>
struct TileConstants {
  using Deq = IntDequant<T, Bits>;
  typename Deq::Offset offset[8];
  Pair<T> float_zero[8];
  Pair<T> scale_lo[8], scale_hi[8];
};

/// A lane's constants from its gathered scales (block jb at index jb), zero-point
/// words and float zero points.
template <typename T, int Bits>
__device__ __forceinline__ void lane_constants(TileConstants<T, Bits>& tc, const Vec<T, 8>& s,
                                               const uint32_t (&zero_words)[2],
                                               const Vec<T, 8>& float_zeros, int zero_mode,
                                               int bias) {
#pragma unroll
  for (int jb = 0; jb < 8; ++jb) {
    tc.scale_lo[jb] = tc.scale_hi[jb] = Pair<T>{s.data[jb], s.data[jb]};
    const float zero = zero_mode == kIntZero ? static_cast<float>(zero_point<Bits>(zero_words, jb))
                       : zero_mode == kBias  ? static_cast<float>(bias)
                                             : 0.f;
    tc.offset[jb] = IntDequant<T, Bits>::offset(zero);
    tc.float_zero[jb] = Pair<T>{float_zeros.data[jb], float_zeros.data[jb]};
  }
}

/// One group's constants for lane g: its 8 consecutive permuted scales (and float
/// zeros) of a 64-column row, and its zero-point word(s) of that row.
template <typename T, int Bits>
__device__ __forceinline__ void group_constants(TileConstants<T, Bits>& tc, const T* scale_row,
                                                const unsigned char* zero_row, int zero_mode,
                                                int bias, int lane) {
  const Vec<T, 8> s = *reinterpret_cast<const Vec<T, 8>*>(scale_row + 8 * (lane / 4));
  uint32_t zero_words[2] = {0, 0};
  Vec<T, 8> float_zeros{};
  if (zero_mode == kIntZero) {
    const uint32_t* words = reinterpret_cast<const uint32_t*>(zero_row) + (Bits / 4) * (lane / 4);
    zero_words[0] = words[0];
    if constexpr (Bits == 8) zero_words[1] = words[1];
  } else if (zero_mode == kFloatZero) {
    float_zeros = *reinterpret_cast<const Vec<T, 8>*>(reinterpret_cast<const T*>(zero_row) +
                                                      8 * (lane / 4));
  }
  lane_constants<T, Bits>(tc, s, zero_words, float_zeros, zero_mode, bias);
}

/// Per-channel scales (one group over K) of lane g's columns of the 64 from `col0`:
/// scales and float zeros in the per-channel permutation, int zero points in the
/// grouped one (as the format's zero-point helper always permutes).
template <typename T, int Bits>
__device__ __forceinline__ void channel_constants(TileConstants<T, Bits>& tc, const Params& p,
                                                  int col0, int lane) {
  const T* scales = static_cast<const T*>(p.scales);
  Vec<T, 8> s, float_zeros{};
  uint32_t zero_words[2] = {0, 0};
#pragma unroll
  for (int jb = 0; jb < 8; ++jb) {
    const int position = col0 + channel_scale_position(8 * jb + lane / 4);
    s.data[jb] = scales[position];
    if (p.zero_mode == kFloatZero) float_zeros.data[jb] = static_cast<const T*>(p.zeros)[position];
  }
  if (p.zero_mode == kIntZero) {
    const uint32_t* words =
        static_cast<const uint32_t*>(p.zeros) + (col0 * Bits / 32) + (Bits / 4) * (lane / 4);
    zero_words[0] = words[0];
    if constexpr (Bits == 8) zero_words[1] = words[1];
  }
  lane_constants<T, Bits>(tc, s, zero_words, float_zeros, p.zero_mode, p.bias);
}

/// Act-order: scales of each of the lane's 4 rows from their own groups (global memory).
template <typename T, int Bits>
__device__ __forceinline__ void act_order_constants(TileConstants<T, Bits>& tc, const Params& p,
                                                    int64_t row0, int col0, int lane) {
  const T* scales = static_cast<const T*>(p.scales);
  Vec<T, 8> s[4];
  constexpr int kRows[4] = {0, 1, 8, 9};
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    // A group index out of range reads the nearest group rather than past the tensor.
    const int64_t group = min(max(__ldg(p.g_idx + row0 + kRows[r]), 0), p.groups - 1);
    s[r] = *reinterpret_cast<const Vec<T, 8>*>(scales + group * p.n + col0 + 8 * (lane / 4));
  }
#pragma unroll
  for (int jb = 0; jb < 8; ++jb) {
    tc.scale_lo[jb] = Pair<T>{s[0].data[jb], s[1].data[jb]};
    tc.scale_hi[jb] = Pair<T>{s[2].data[jb], s[3].data[jb]};
    tc.offset[jb] = IntDequant<T, Bits>::offset(static_cast<float>(p.bias));
  }
}

/// The weight words of one lane for a k16 x n64 tile: 4 (4-bit) or 8 (8-bit).
template <int Bits>
using LaneWords = Vec<uint32_t, Bits == 4 ? 4 : 8>;

/// Block jb (columns 8 jb + g) of a lane's tile words, dequantized: rows 2t + {0, 1}
/// in `lo`, 2t + {8, 9} in `hi` (the two B registers of an m16n8k16 mma).
template <typename T, int Bits>
__device__ __forceinline__ void dequant_block(const LaneWords<Bits>& words, int jb,
                                              const TileConstants<T, Bits>& tc, bool float_zero,
                                              Pair<T>& lo, Pair<T>& hi) {
  using Deq = IntDequant<T, Bits>;
  // 4-bit: word jb / 2 holds blocks 2w (pairs 0, 1) and 2w + 1 (pairs 2, 3);
  // 8-bit: word jb holds one block (pairs 0, 1).
  const uint32_t word = Bits == 4 ? words.data[jb / 2] : words.data[jb];
  const int first = Bits == 4 ? 2 * (jb % 2) : 0;
  lo = Deq::pair(word, first, tc.offset[jb]);
  hi = Deq::pair(word, first + 1, tc.offset[jb]);
  if (float_zero) {
    lo = __hsub2(lo, tc.float_zero[jb]);
    hi = __hsub2(hi, tc.float_zero[jb]);
  }
  lo = __hmul2(lo, tc.scale_lo[jb]);
  hi = __hmul2(hi, tc.scale_hi[jb]);
}

/// Dequantizes a lane's tile words and multiplies them with the A fragments.
template <typename T, int Bits, int MBlocks>
__device__ __forceinline__ void tile_mma(float (&acc)[MBlocks][8][4],
                                         const uint32_t (&a_frag)[MBlocks][4],
                                         const LaneWords<Bits>& words,
                                         const TileConstants<T, Bits>& tc, bool float_zero) {
#pragma unroll
  for (int jb = 0; jb < 8; ++jb) {
    Pair<T> lo, hi;
    dequant_block<T, Bits>(words, jb, tc, float_zero, lo, hi);
#pragma unroll
    for (int mb = 0; mb < MBlocks; ++mb) {
      mma_m16n8k16<T>(acc[mb][jb], a_frag[mb], bits_of<T>(lo), bits_of<T>(hi));
    }
  }
}

/// The dequantization constants of a lane for k16 tile `kt` of the 64 columns from
/// `col0`, read from global memory (the dequantize kernel; the GEMM stages grouped
/// scales through shared memory instead).
template <typename T, int Bits>
__device__ __forceinline__ void global_constants(TileConstants<T, Bits>& tc, const Params& p,
                                                 int kt, int col0, int lane) {
  if (p.g_idx != nullptr) {
    act_order_constants<T, Bits>(tc, p, int64_t{kt} * 16 + 2 * (lane % 4), col0, lane);
  } else if (p.group_size > 0) {
    const int64_t group = int64_t{kt} * 16 / p.group_size;
    const int zero_col_bytes = p.zero_mode == kIntZero ? Bits : 16;  // bits per column
    const unsigned char* zero_row = static_cast<const unsigned char*>(p.zeros) +
                                    (group * p.n + col0) * zero_col_bytes / 8;
    group_constants<T, Bits>(tc, static_cast<const T*>(p.scales) + group * p.n + col0,
                             p.zero_mode == kBias ? nullptr : zero_row, p.zero_mode, p.bias,
                             lane);
  } else {
    channel_constants<T, Bits>(tc, p, col0, lane);
  }
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

template <typename T, int Bits, int MBlocks>
__global__ void __launch_bounds__(kThreads) marlin_gemm_kernel(const Params p) {
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
  const bool grouped = p.group_size > 0 && p.g_idx == nullptr;
  const bool float_zero = p.zero_mode == kFloatZero;
  const int zero_row_bytes = p.zero_mode == kIntZero ? p.n * Bits / 8 : p.n * 2;
  const int zero_tile_bytes = p.zero_mode == kIntZero ? kTileN * Bits / 8 : kTileN * 2;

  auto stage = [&](int slot) { return smem + slot * Layout::kBytes; };
  auto load_stage = [&](int it) {
    unsigned char* base = stage(it % kStages);
    const int kt0 = kt_begin + it * kStageTiles;
    // Weights: per k16 tile, the CTA's two 64-column tiles are contiguous words.
    constexpr int kChunksPerTileRow = kWarpsN * kTileWords / 4;
    const int64_t row_words = static_cast<int64_t>(p.n) * 16 * Bits / 32;
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
    for (int c = tid; c < kRows * 16; c += kThreads) {
      const int row = c / 16, chunk = c % 16;
      const int k = kt0 * 16 + chunk * 8;
      const bool valid = row < rows && k < kt_end * 16;
      const T* src = a + (m0 + row) * p.lda + k;
      cp_async_16(a_stage + row * kStageK + ((chunk ^ (row % 8)) * 8), valid ? src : a, valid);
    }
    if (!grouped) return;
    // Scales (and zero points) of the groups this stage's k rows fall into.
    const int first_group = kt0 * 16 / p.group_size;
    const int stage_groups = max(1, kStageK / p.group_size);
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
    for (int c = tid; c < stage_groups * chunks_per_group; c += kThreads) {
      const int group = first_group + c / chunks_per_group;
      const int byte = (c % chunks_per_group) * 16;
      const bool valid = group < p.groups && n0 * zero_tile_bytes / kTileN + byte < zero_row_bytes;
      const unsigned char* src = static_cast<const unsigned char*>(p.zeros) +
                                 static_cast<int64_t>(group) * zero_row_bytes +
                                 n0 * zero_tile_bytes / kTileN + byte;
      cp_async_16(z_stage + (c / chunks_per_group) * zero_tile_bytes + byte,
                  valid ? src : p.zeros, valid);
    }
  };

  float acc[MBlocks][8][4];
#pragma unroll
  for (int mb = 0; mb < MBlocks; ++mb)
#pragma unroll
    for (int jb = 0; jb < 8; ++jb)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mb][jb][i] = 0.f;

  // Per-channel scales and zeros do not change along K: read them once.
  TileConstants<T, Bits> constants;
  const int col0 = n0 + 64 * warp_n;
  if (!grouped && p.g_idx == nullptr && strip_valid) {
    channel_constants<T, Bits>(constants, p, col0, lane);
  }

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
      if (grouped) {
        const int group_in_stage = kt * 16 / p.group_size - kt0 * 16 / p.group_size;
        const unsigned char* s_stage = base + Layout::kBBytes + Layout::kABytes;
        const T* scale_row =
            reinterpret_cast<const T*>(s_stage) + group_in_stage * kTileN + 64 * warp_n;
        const unsigned char* zero_row = s_stage + Layout::kSBytes +
                                        group_in_stage * zero_tile_bytes +
                                        warp_n * zero_tile_bytes / kWarpsN;
        group_constants<T, Bits>(constants, scale_row, zero_row, p.zero_mode, p.bias, lane);
      } else if (p.g_idx != nullptr) {
        act_order_constants<T, Bits>(constants, p, int64_t{kt} * 16 + 2 * (lane % 4), col0, lane);
      }
      tile_mma<T, Bits, MBlocks>(acc, a_frag, words, constants, float_zero);
    }
  }
  cp_async_wait<0>();
  __syncthreads();

  // Reduce the K-warps in shared memory (the stages are free now).
  float* red = reinterpret_cast<float*>(smem);
  for (int i = tid; i < kRows * kTileN; i += kThreads) red[i] = 0.f;
  __syncthreads();
  if (strip_valid) {
#pragma unroll
    for (int mb = 0; mb < MBlocks; ++mb)
#pragma unroll
      for (int jb = 0; jb < 8; ++jb)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int row = mb * 16 + lane / 4 + 8 * (i / 2);
          const int col = 64 * warp_n + 8 * jb + 2 * (lane % 4) + i % 2;
          atomicAdd(red + row * kTileN + col, acc[mb][jb][i]);
        }
  }
  __syncthreads();

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
  // Split K: publish this CTA's partial, then the last CTA of the column tile sums all.
  for (int i = tid; i < rows * (kTileN / 2); i += kThreads) {
    const int row = i / (kTileN / 2), col = 2 * (i % (kTileN / 2));
    if (col >= cols) continue;
    float* dst = p.partials + (static_cast<int64_t>(blockIdx.y) * p.m + m0 + row) * p.n + n0 + col;
    __stcg(reinterpret_cast<float2*>(dst), *reinterpret_cast<const float2*>(red + row * kTileN + col));
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
template <typename T, int Bits>
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
    TileConstants<T, Bits> tc;
    global_constants<T, Bits>(tc, p, kt, col0, lane);
    const int k_local = warp * 16 + 2 * (lane % 4);
#pragma unroll
    for (int jb = 0; jb < 8; ++jb) {
      Pair<T> lo, hi;
      dequant_block<T, Bits>(words, jb, tc, p.zero_mode == kFloatZero, lo, hi);
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
                             int64_t size_k, int64_t size_n, int64_t group_size,
                             int64_t zero_mode, int64_t bias) {
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
  p.group_size = static_cast<int>(group_size);
  p.zero_mode = static_cast<int>(zero_mode);
  p.bias = static_cast<int>(bias);
  ValueCheck(group_size == 0 || (group_size % 16 == 0 && p.groups * group_size >= size_k),
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
    TensorMatcher({size_k}).dtype<int32_t>().device(kDLCUDA, device).contiguous().verify(
        *g_idx, "g_idx");
    p.g_idx = data_ptr<int32_t>(*g_idx);
  }
  return p;
}

}  // namespace marlin

/// c = a @ dequant(b) with the streaming kernel; see the file comment. `a` [M, K]
/// (act-order: already a[:, perm]), c [M, N]; `partials` fp32 [split, M, N] and
/// `workspace` int32 [>= N / 128] when split > 1. Group size 0: per-channel scales.
template <typename T, int Bits, int MBlocks>
void gptq_marlin_gemm_stream(TensorView a, TensorView b_q_weight, TensorView b_scales,
                             tvm::ffi::Optional<TensorView> b_zeros,
                             tvm::ffi::Optional<TensorView> g_idx, TensorView c,
                             tvm::ffi::Optional<TensorView> partials, TensorView workspace,
                             int64_t group_size, int64_t zero_mode, int64_t bias, int64_t split,
                             int64_t k_tiles_per_split) {
  using namespace marlin;
  SymbolicSize m{"size_m"}, k{"size_k"}, n{"size_n"}, lda{"lda"};
  SymbolicDevice device;
  TensorMatcher({m, k})
      .dtype<T>()
      .device(kDLCUDA, device)
      .strides({lda, 1})
      .verify(a, "a");
  ValueCheck(lda.value() % 8 == 0 && reinterpret_cast<uintptr_t>(data_ptr<T>(a)) % 16 == 0,
             "argument 'a': rows must start on 16-byte boundaries (row stride ", lda.value(),
             " elements); call .contiguous() on it first");
  TensorMatcher({m, n}).dtype<T>().device(kDLCUDA, device).contiguous().verify(c, "c");
  Params p = check_weights(device, b_q_weight, b_scales, b_zeros, g_idx, dtype_trait<T>::value,
                           Bits, k.value(), n.value(), group_size, zero_mode, bias);
  verify_output(c, "c", {{a, "a"}, {b_q_weight, "b_q_weight"}, {b_scales, "b_scales"}});
  p.a = data_ptr<void>(a);
  p.lda = lda.value();
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
    TensorMatcher({split, m, n}).dtype<fp32_t>().device(kDLCUDA, device).contiguous().verify(
        *partials, "partials");
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
  KernelLauncher(grid, dim3(kThreads), device.value(), Layout::kSharedBytes)(
      marlin_gemm_kernel<T, Bits, MBlocks>, p);
}

/// out [N, K] = dequant(b)^T (the nn.Linear layout of the weight).
template <typename T, int Bits>
void marlin_dequantize(TensorView b_q_weight, TensorView b_scales,
                       tvm::ffi::Optional<TensorView> b_zeros, tvm::ffi::Optional<TensorView> g_idx,
                       TensorView out, int64_t group_size, int64_t zero_mode, int64_t bias) {
  using namespace marlin;
  SymbolicSize n{"size_n"}, k{"size_k"};
  SymbolicDevice device;
  TensorMatcher({n, k}).dtype<T>().device(kDLCUDA, device).contiguous().verify(out, "out");
  const Params p = check_weights(device, b_q_weight, b_scales, b_zeros, g_idx,
                                 dtype_trait<T>::value, Bits, k.value(), n.value(), group_size,
                                 zero_mode, bias);
  const dim3 grid(static_cast<unsigned>(n.value() / 64),
                  static_cast<unsigned>(div_ceil<int64_t>(k.value(), 64)));
  KernelLauncher(grid, dim3(128), device.value())(marlin_dequantize_kernel<T, Bits>, p,
                                                 data_ptr<T>(out));
}

}  // namespace mllm_kernel::cuda
